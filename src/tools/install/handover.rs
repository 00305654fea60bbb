//! An uninstall that a running `--install --watch` cannot undo. Every watch holds a shared
//! lock on `<bin-dir>/.sandbox-guard-watch.lock` while it may write (the bin dir: no
//! runtime reads a dotfile there, and the conf dir stays as the primary left it). An
//! uninstall first leaves a marker in the conf dir, which wakes the watches; each one
//! that sees it stands down for good, dropping its lock. The uninstall takes the lock
//! exclusively, so it starts only once no watch can write any more, and if one does not
//! stand down in time it says so and takes nothing out. The marker counts only while its
//! uninstall holds a lock on it: one left by an uninstall that was killed stands no later
//! watch down.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LOCK: &str = ".sandbox-guard-watch.lock";
const MARKER: &str = ".sandbox-guard-uninstalling";
/// How long an uninstall waits for the watches: a watch looks within its settling pause of
/// the marker's creation, after any install it is in the middle of.
const STAND_DOWN_WITHIN: Duration = Duration::from_secs(15);

fn lock_path(bin_dir: &Path) -> PathBuf {
    bin_dir.join(LOCK)
}

fn open_lock(bin_dir: &Path) -> std::io::Result<File> {
    std::fs::create_dir_all(bin_dir)?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock_path(bin_dir))
}

/// A watch's hold: while it lives, no uninstall starts.
pub struct Watching {
    _lock: File,
}

impl Watching {
    /// Waits out an uninstall under way, then holds the lock (on the file that is at the
    /// path, not one an uninstall just removed).
    pub fn start(bin_dir: &Path) -> Result<Watching, String> {
        loop {
            let file = open_lock(bin_dir)
                .map_err(|e| format!("cannot open {}: {e}", lock_path(bin_dir).display()))?;
            file.lock_shared()
                .map_err(|e| format!("cannot lock {}: {e}", lock_path(bin_dir).display()))?;
            let current = std::fs::metadata(lock_path(bin_dir)).map(|m| m.ino()).ok();
            if current == file.metadata().map(|m| m.ino()).ok() {
                return Ok(Watching { _lock: file });
            }
        }
    }
}

/// Whether a watch holds its lock in `bin_dir`: a run by hand then leaves the keys the
/// watch owns alone. Only reads (a missing lock file is no watch); a lock that cannot be
/// tried may be a watch's.
pub fn watch_runs(bin_dir: &Path) -> bool {
    let Ok(file) = File::open(lock_path(bin_dir)) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(TryLockError::WouldBlock | TryLockError::Error(_)) => true,
    }
}

/// Whether an uninstall is under way: a watch that sees it stands down. Only reads.
pub fn uninstalling(conf_dir: &Path) -> bool {
    File::open(conf_dir.join(MARKER))
        .is_ok_and(|marker| matches!(marker.try_lock_shared(), Err(TryLockError::WouldBlock)))
}

/// The marker, locked by this process before it appears under its name (a watch never
/// sees it unlocked while the uninstall lives), held until dropped.
fn leave_marker(marker: &Path) -> std::io::Result<File> {
    let mut name = marker.as_os_str().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    let temp = PathBuf::from(name);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)?;
        file.lock()?;
        writeln!(file, "{}", std::process::id())?;
        std::fs::rename(&temp, marker)?;
        Ok(file)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// The uninstall's side: the marker, then the lock, held while `work` runs. Both go when it
/// is done, so that a later install (a new DaemonSet) runs as usual.
pub fn while_no_watch_runs<T>(
    conf_dir: &Path,
    bin_dir: &Path,
    work: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    // No watch has held the lock with this bin dir: nothing to wait for, and a node with
    // nothing to uninstall is left without a write.
    if !lock_path(bin_dir).exists() {
        return work();
    }
    let marker = conf_dir.join(MARKER);
    let _marked =
        leave_marker(&marker).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    let lock = match open_lock(bin_dir) {
        Ok(lock) => lock,
        Err(e) => {
            let _ = std::fs::remove_file(&marker);
            return Err(format!("cannot open {}: {e}", lock_path(bin_dir).display()));
        }
    };
    let deadline = Instant::now() + STAND_DOWN_WITHIN;
    while lock.try_lock().is_err() {
        if Instant::now() >= deadline {
            let _ = std::fs::remove_file(&marker);
            return Err(format!(
                "a sandbox-guard --install --watch on this node has not stood down within {}s (its DaemonSet still \
                 runs and is busy, or stopped): it would put the guard back, so nothing was taken out; delete the \
                 installing DaemonSet first, then run the uninstall again",
                STAND_DOWN_WITHIN.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let outcome = work();
    // The lock file goes while held: a watch starting now finds the path's file changed
    // and opens the new one.
    let _ = std::fs::remove_file(lock_path(bin_dir));
    let _ = std::fs::remove_file(&marker);
    outcome
}
