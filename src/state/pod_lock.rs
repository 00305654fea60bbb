//! Delegate mode's lock per pod key: the operations of one pod reach the primary one at a
//! time, so a late ADD cannot interleave with a newer sandbox's and a deferred DEL is
//! replayed only while no ADD can take the key. It is held while the primary runs, which can
//! take seconds; the store's lock never is, so a slow primary stalls only its own pod.
//!
//! `<stateDir>/pod-locks/<sha256 of the pod key>`: empty files, flocked. The DEL that frees a
//! key removes its file while it still holds the lock, and GC those of keys nobody owns, so
//! the folder holds about one file per pod on the node, not one per pod ever seen. A process
//! that opened the file before it went sees, after locking, that its inode is no longer the
//! one at the path and opens it again.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use super::lock::{self, Access};
use super::ownership::PodKey;
use crate::error::{GuardError, Kind, Result};

pub const POD_LOCKS: &str = "pod-locks";

/// Held until dropped (or the process dies: the kernel drops flocks with it). Its file
/// descriptor is close-on-exec, so a primary left running by a killed guard holds nothing.
pub struct PodLock {
    _file: File,
    path: std::path::PathBuf,
    digest: String,
}

impl PodLock {
    /// Waits at most `wait` for the lock of `key`.
    pub fn acquire(state_dir: &Path, key: &PodKey, wait: Duration) -> Result<PodLock> {
        let dir = state_dir.join(POD_LOCKS);
        if super::surely_absent(&dir) {
            super::ensure_dir(state_dir)?;
            super::ensure_dir(&dir)?;
        }
        let digest = key.digest();
        let path = dir.join(&digest);
        // Bounded: each round means GC removed the file between our open and our lock.
        for _ in 0..8 {
            let file = open(&path)?;
            lock::acquire(&file, &path, Access::Exclusive, wait, &|_| {})
                .map_err(|err| busy(err, &file, key, wait))?;
            if same_file(&file, &path) {
                return Ok(PodLock {
                    _file: file,
                    path,
                    digest,
                });
            }
        }
        Err(GuardError::new(
            Kind::Busy,
            format!("the lock file of pod {} keeps being replaced", key.pod()),
        ))
    }

    /// The lock of `key` if it is free now, else `None`: GC does not wait behind a pod.
    pub fn try_acquire(state_dir: &Path, key: &PodKey) -> Result<Option<PodLock>> {
        match PodLock::acquire(state_dir, key, Duration::ZERO) {
            Ok(lock) => Ok(Some(lock)),
            Err(err) if err.kind == Kind::Busy => Ok(None),
            Err(err) => Err(err),
        }
    }
}

impl PodLock {
    /// A lock another process took and handed over as an open file (the replay worker's, from
    /// the DEL that freed the key): `None` unless the file is still the one at the path.
    pub fn handed(state_dir: &Path, digest: &str, file: File) -> Option<PodLock> {
        let digest_like = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        if !digest_like {
            return None;
        }
        let path = state_dir.join(POD_LOCKS).join(digest);
        same_file(&file, &path).then(|| PodLock {
            _file: file,
            path,
            digest: digest.to_string(),
        })
    }

    /// The open lock file, to hand over to the replay worker.
    pub fn file(&self) -> &File {
        &self._file
    }

    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Releases the lock, and first removes its file if nobody owns the key and no deferred
    /// DEL waits on it. Removed while held: a process waiting on the old file gets it next,
    /// sees it is no longer the one at the path (`same_file`) and opens the path anew.
    pub fn release_unused(self, state_dir: &Path) {
        let in_use = super::deferred::owned(state_dir, &self.digest)
            || !super::surely_absent(&super::deferred::key_dir(state_dir, &self.digest));
        if !in_use {
            let _ = super::remove(&self.path);
        }
    }
}

impl super::Store {
    /// Removes the lock files of keys nobody owns and no deferred DEL waits on, unless held
    /// (GC, under the store's lock). Returns how many went.
    pub fn remove_unused_pod_locks(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.root.join(POD_LOCKS)) else {
            return 0;
        };
        let mut removed = 0;
        for path in entries.flatten().map(|entry| entry.path()) {
            let Some(digest) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let in_use = !super::surely_absent(&self.owners.join(digest))
                || !super::surely_absent(&super::deferred::key_dir(&self.root, digest));
            if !in_use && remove_if_free(&path) {
                removed += 1;
            }
        }
        removed
    }
}

/// A process that opened the file before it went notices (`same_file`) and opens it anew.
fn remove_if_free(path: &Path) -> bool {
    let Ok(file) = open(path) else { return false };
    file.try_lock().is_ok() && super::remove(path).is_ok()
}

/// Read-only when it exists (flock needs no write access, so a lock taken at ADD still
/// works on a store remounted read-only), created when it does not.
fn open(path: &Path) -> Result<File> {
    let flags = nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC;
    match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(flags)
            .open(path),
        opened => opened,
    }
    .map_err(|e| GuardError::io("open the pod lock", path, e))
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    }
}

fn busy(err: GuardError, file: &File, key: &PodKey, wait: Duration) -> GuardError {
    if err.kind != Kind::Busy {
        return err;
    }
    let holder = lock::holders(file).unwrap_or_else(|| "another process".to_string());
    GuardError::new(
        Kind::Busy,
        format!("pod {} is busy: {holder} still runs an operation of it; gave up after {:.1}s", key.label(), wait.as_secs_f64()),
    )
    .with_details(
        "The runtime retries. Another operation of this pod is still in its primary plugin; if it hangs there, \
         the primary is stuck (see its own logs). podLockTimeoutSeconds sets the wait.",
    )
}
