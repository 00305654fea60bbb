//! The state dir's lock, taken with a bounded wait.
//!
//! A plugin that blocks on the lock blocks the pod behind it, and every pod behind that one:
//! an operator's command left open, or any process that took the lock by hand, must not
//! freeze a node's teardowns. So every caller waits at most its timeout and then says who
//! holds the lock (its pid, from /proc/locks) and how out.

use std::fs::{File, TryLockError};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{GuardError, Kind, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Readers (CHECK, STATUS, the operator tools) may run side by side.
    Shared,
    /// Writers (ADD, DEL, GC) run one at a time.
    Exclusive,
}

/// Takes the lock on `file` within `wait`. flock has no timeout, and a blocked flock cannot be
/// interrupted without signal handlers, so it polls: first at once, then with a backoff capped
/// at a few milliseconds, which keeps a contended ADD's extra latency small.
/// `on_wait` is called once, when the first try fails (the CLI says that it is waiting).
pub fn acquire(
    file: &File,
    path: &Path,
    access: Access,
    wait: Duration,
    on_wait: &dyn Fn(&str),
) -> Result<()> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_micros(200);
    let mut announced = false;
    loop {
        let attempt = match access {
            Access::Shared => file.try_lock_shared(),
            Access::Exclusive => file.try_lock(),
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(TryLockError::Error(e)) => return Err(GuardError::io("lock", path, e)),
            Err(TryLockError::WouldBlock) => {}
        }
        if !announced {
            announced = true;
            on_wait(&holders(file).unwrap_or_else(|| "another process".to_string()));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(busy(file, path, wait));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// The operator commands' word that they wait for the lock, said once however many
/// batches wait: `notice.hear` is the `on_wait` of `acquire` and `Store::read_lock`.
pub struct WaitNotice {
    said: std::cell::Cell<bool>,
    dir: String,
    wait: Duration,
}

impl WaitNotice {
    pub fn new(dir: &Path, wait: Duration) -> WaitNotice {
        WaitNotice {
            said: std::cell::Cell::new(false),
            dir: dir.display().to_string(),
            wait,
        }
    }

    pub fn hear(&self, holder: &str) {
        if !self.said.replace(true) {
            stderr_line!(
                "sandbox-guard: {} is locked by {holder}; waiting up to {:.1}s",
                self.dir,
                self.wait.as_secs_f64()
            );
        }
    }
}

fn busy(file: &File, path: &Path, wait: Duration) -> GuardError {
    let holder = holders(file).unwrap_or_else(|| "another process".to_string());
    let dir = path.parent().unwrap_or(path);
    GuardError::new(
        Kind::Busy,
        format!("the state dir {} is locked by {holder}; gave up after {:.1}s", dir.display(), wait.as_secs_f64()),
    )
    .with_details(format!(
        "The runtime retries this operation. If the lock stays held, find the holder (`grep -w $(stat -c %i {}) \
         /proc/locks`) and end it; sandbox-guard itself never holds it while it waits on anything else. \
         lockTimeoutSeconds in the plugin's config (--lock-timeout for the commands) sets the wait.",
        path.display()
    ))
}

/// "pid 4242 (less)" for each process holding a lock on `file`, from /proc/locks: its lines read
/// `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`, with `->` marking waiters, not holders.
pub fn holders(file: &File) -> Option<String> {
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    let id = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev),
        meta.ino()
    );
    let table = std::fs::read_to_string("/proc/locks").ok()?;
    let mut found: Vec<String> = table
        .lines()
        .filter(|line| !line.contains("->"))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = fields.iter().position(|f| *f == id)?;
            let pid: u32 = fields.get(at.checked_sub(1)?)?.parse().ok()?;
            Some(describe(pid))
        })
        .collect();
    found.sort();
    found.dedup();
    (!found.is_empty()).then(|| found.join(", "))
}

fn describe(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    match comm.trim() {
        "" => format!("pid {pid}"),
        comm => format!("pid {pid} ({comm})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn lock_file() -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "sg-lock-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        (path, file)
    }

    #[test]
    fn a_held_lock_times_out_naming_its_holder() {
        let (path, held) = lock_file();
        held.lock().unwrap();
        // A second open file description conflicts with the first, even in one process.
        let other = File::open(&path).unwrap();
        let started = Instant::now();
        let err = acquire(
            &other,
            &path,
            Access::Shared,
            Duration::from_millis(150),
            &|_| {},
        )
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(err.code(), 11);
        assert!(
            err.msg.contains(&format!("pid {}", std::process::id())),
            "{}",
            err.msg
        );
        held.unlock().unwrap();
        acquire(&other, &path, Access::Exclusive, Duration::ZERO, &|_| {}).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
