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
//!
//! `<stateDir>/pod-waits/<sha256 of the pod key>`: a verb that finds the pod lock taken holds
//! this file's flock shared while it waits. The replay worker lets the pod lock go between two
//! deferred DELs and takes it back only if nobody holds that file (`try_acquire`): flock is not
//! fair, and a worker that took the lock back at once would make a waiting ADD wait for every
//! replay of the pod, not for the one running when it came.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use super::lock::{self, Access};
use super::ownership::PodKey;
use crate::error::{GuardError, Kind, Result};

pub const POD_LOCKS: &str = "pod-locks";
pub const POD_WAITS: &str = "pod-waits";

/// Held until dropped (or the process dies: the kernel drops flocks with it). Its file
/// descriptor is close-on-exec, so a primary left running by a killed guard holds nothing.
pub struct PodLock {
    _file: File,
    path: std::path::PathBuf,
    digest: String,
}

impl PodLock {
    /// Waits at most `wait` for the lock of `key`, seen as waiting (`POD_WAITS`) meanwhile.
    pub fn acquire(state_dir: &Path, key: &PodKey, wait: Duration) -> Result<PodLock> {
        let dir = state_dir.join(POD_LOCKS);
        if super::surely_absent(&dir) {
            super::ensure_dir(state_dir)?;
            super::ensure_dir(&dir)?;
        }
        let digest = key.digest();
        let path = dir.join(&digest);
        let mut waiting = None;
        // Bounded: each round means GC removed the file between our open and our lock.
        for _ in 0..8 {
            let file = open(&path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(GuardError::io("lock", &path, e));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    wait_signed(state_dir, &digest, &file, &path, wait, &mut waiting)
                        .map_err(|err| busy(err, &file, key, wait))?;
                }
            }
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

    /// The lock of `key` if it is free now and no verb waits for it, else `None`: GC and the
    /// replay worker never wait behind a pod, nor go before a verb of the pod that waits.
    pub fn try_acquire(state_dir: &Path, key: &PodKey) -> Result<Option<PodLock>> {
        let lock = match PodLock::acquire(state_dir, key, Duration::ZERO) {
            Ok(lock) => lock,
            Err(err) if err.kind == Kind::Busy => return Ok(None),
            Err(err) => return Err(err),
        };
        // Looked at once the lock is held: a verb that starts waiting after this waits for
        // one operation of the pod, the one the lock is taken for.
        Ok((!waited_for(state_dir, &lock.digest)).then_some(lock))
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
    /// (GC, under the store's lock), and the signs of waiters that are gone (killed before
    /// they could remove theirs). Returns how many lock files went.
    pub fn remove_unused_pod_locks(&self) -> usize {
        remove_gone_waiters(&self.root);
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

/// Removes the signs of waiters that are gone (killed before they could remove theirs): a
/// file nobody holds. Needs no lock of the store: a waiter that opened one before it went
/// sees it is gone (`same_file`) and opens the path anew.
pub fn remove_gone_waiters(state_dir: &Path) {
    for path in std::fs::read_dir(state_dir.join(POD_WAITS))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
    {
        remove_if_free(&path);
    }
}

/// A verb's sign that it waits for a pod lock: a shared flock on `pod-waits/<digest>`, held
/// until dropped. The last waiter to go removes the file (while it holds the flock
/// exclusively); one that opened it before it went opens it again.
struct Waiting {
    _file: File,
    path: std::path::PathBuf,
}

impl Waiting {
    /// `None` when the sign cannot be made (a store that takes no write): the verb still waits,
    /// only without precedence over the replay worker.
    fn start(state_dir: &Path, digest: &str) -> Option<Waiting> {
        let dir = state_dir.join(POD_WAITS);
        if super::surely_absent(&dir) {
            super::ensure_dir(&dir).ok()?;
        }
        let path = dir.join(digest);
        for _ in 0..8 {
            let file = open(&path).ok()?;
            file.try_lock_shared().ok()?;
            if same_file(&file, &path) {
                return Some(Waiting { _file: file, path });
            }
        }
        None
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self._file.try_lock().is_ok() {
            let _ = super::remove(&self.path);
        }
    }
}

/// Waits at most `wait` for the pod lock's `file`, seen as waiting meanwhile: a sign that
/// cannot be made at once (its file is held exclusively for a moment by a look at it, or by a
/// waiter that leaves) is tried again between two polls, not given up for the whole wait.
fn wait_signed(
    state_dir: &Path,
    digest: &str,
    file: &File,
    path: &Path,
    wait: Duration,
    waiting: &mut Option<Waiting>,
) -> Result<()> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if waiting.is_none() && !wait.is_zero() {
            *waiting = Waiting::start(state_dir, digest);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let slice = match waiting {
            Some(_) => left,
            None => left.min(SIGN_RETRY),
        };
        match lock::acquire(file, path, Access::Exclusive, slice, &|_| {}) {
            Err(err) if err.kind == Kind::Busy && slice < left => continue,
            done => return done,
        }
    }
}

/// How often a verb that could not make its waiting sign tries again.
const SIGN_RETRY: Duration = Duration::from_millis(5);

/// Whether a verb waits for the pod lock of `digest` (holds its `pod-waits` file's flock).
fn waited_for(state_dir: &Path, digest: &str) -> bool {
    let path = state_dir.join(POD_WAITS).join(digest);
    let flags = nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC;
    match OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(&path)
    {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
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
