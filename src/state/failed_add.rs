//! ADDs that failed in the guard. The runtime answers a failed ADD with a DEL of the same
//! sandbox; that sandbox never took its pod key, so its DEL must not be refused as stale (the
//! sandbox would stay NOTREADY and be retried for ever). A sandbox with no record is otherwise
//! one added before the guard was installed, whose DEL is exactly the stale one to refuse:
//! this note tells the two apart.
//!
//! The note is an empty file named like the attachment's record: creating it needs no data
//! block, so it can still be written when the ADD failed because the disk is full (root may
//! use ext4's reserved blocks; tmpfs counts inodes apart). It is written only on the failure
//! path, without the lock (the failure may be a lock timeout), and durably; DEL reads it
//! under the lock and removes it with the record; GC removes those it no longer needs. Its
//! length is the store's generation counter when the ADD failed (a sparse file: still no
//! data block), which DEL compares with the generation at which the pod's owner took it: a
//! number that stays when the owner's file is rewritten (it adds an interface), where a file
//! time would not. A note of an earlier release (empty) is compared by its time.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use std::time::SystemTime;

use super::checkpoint::AttachmentId;
use super::{FAILED_ADDS, Store, ensure_dir, remove, surely_absent};
use crate::error::{GuardError, Result};

/// Notes that the ADD of `id` failed with `error`. Best effort: where even an empty file
/// cannot be created (a read-only store), it says so on stderr. A container that has (or
/// had, set aside) a record took its key once: no note may make it look as if it never had.
pub fn mark(state_dir: &Path, id: &AttachmentId, error: &GuardError) {
    match std::fs::symlink_metadata(state_dir) {
        // A state dir that does not exist holds no record the DEL could be judged by.
        Err(_) => return,
        // Never written through: the store refuses a linked or odd state dir, and so does its note.
        Ok(meta) if !meta.is_dir() => {
            stderr_line!(
                "sandbox-guard: the ADD failed and {} is not a plain directory, so no note of it is written",
                state_dir.display()
            );
            return;
        }
        Ok(_) => {}
    }
    // Written without the store's lock: before this boot's first writer moved the previous
    // boot's folders aside, the note would go aside with them.
    let now = crate::clock::boot_id();
    if let super::boot::LiveFolders::Previous(_) =
        super::boot::live_folders(state_dir, now.as_deref())
    {
        stderr_line!(
            "sandbox-guard: the ADD failed before any verb of this boot could mark {}, so no note of it is written",
            state_dir.display()
        );
        return;
    }
    let name = id.file_name();
    if [super::RECORDS, super::SET_ASIDE]
        .iter()
        .any(|dir| !super::surely_absent(&state_dir.join(dir).join(&name)))
    {
        return;
    }
    let dir = state_dir.join(FAILED_ADDS);
    let path = dir.join(id.file_name());
    let written = ensure_dir(&dir).and_then(|()| {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .and_then(|note| note.set_len(generation_counter(state_dir)))
            // Boot-scoped (`boot`): synced only where no boot id scopes the store.
            .and_then(|()| match crate::clock::boot_id() {
                Some(_) => Ok(()),
                None => File::open(&dir)?.sync_all(),
            })
            .map_err(|e| GuardError::io("note the failed ADD in", &path, e))
    });
    if let Err(e) = written {
        stderr_line!(
            "sandbox-guard: the ADD failed (code {}) and that could not be noted ({}); the runtime's cleanup DEL of \
             sandbox {} may be refused as stale while a newer sandbox owns the pod",
            error.code(),
            e.msg,
            id.container_id
        );
    }
}

/// The store's generation counter, read from the lock file without the lock (the failure may
/// be a lock timeout); 0 when there is none.
fn generation_counter(state_dir: &Path) -> u64 {
    let mut digits = [0u8; 20];
    let read = File::open(state_dir.join("lock"))
        .and_then(|lock| std::os::unix::fs::FileExt::read_at(&lock, &mut digits, 0))
        .unwrap_or(0);
    std::str::from_utf8(&digits[..read])
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// An ADD that failed in the guard, as its note says.
#[derive(Debug, Clone, Copy)]
pub struct FailedAdd {
    pub at: SystemTime,
    /// The store's generation counter then; 0 in a note of an earlier release.
    pub generation: u64,
}

impl FailedAdd {
    /// Whether `owner` took its pod key after this ADD failed (`owner_taken_at`: the
    /// generation at which it did; `owner_file_time`: its file's time, for an older note).
    pub fn precedes(&self, owner_taken_at: u64, owner_file_time: Option<SystemTime>) -> bool {
        if self.generation > 0 {
            owner_taken_at > self.generation
        } else {
            owner_file_time.is_some_and(|time| time > self.at)
        }
    }
}

impl Store {
    /// The ADD of `id` that failed in the guard, if it did and never succeeded since. The
    /// note only speaks for a sandbox that has no record and no set-aside one.
    pub fn failed_add(&self, id: &AttachmentId) -> Option<FailedAdd> {
        if !surely_absent(&self.set_aside_path_for_record(id)) {
            return None;
        }
        let meta = std::fs::symlink_metadata(self.failed_adds.join(id.file_name())).ok()?;
        Some(FailedAdd {
            at: meta.is_file().then(|| meta.modified().ok()).flatten()?,
            generation: meta.len(),
        })
    }

    pub fn remove_failed_add(&self, id: &AttachmentId) -> Result<()> {
        let path = self.failed_adds.join(id.file_name());
        if std::fs::symlink_metadata(&path).is_ok() {
            remove(&path)?;
            self.mark_dirty(super::Dir::FailedAdds);
        }
        Ok(())
    }

    /// Every note, by the attachment its name stands for (`None`: a name that is no
    /// attachment's), for GC.
    pub fn list_failed_adds(&self) -> Result<Vec<(PathBuf, Option<AttachmentId>)>> {
        super::list(&self.failed_adds, |path| {
            Ok(AttachmentId::from_file_name(path))
        })
    }

    pub fn remove_failed_add_at(&self, path: &Path) -> Result<()> {
        remove(path)?;
        self.mark_dirty(super::Dir::FailedAdds);
        Ok(())
    }
}
