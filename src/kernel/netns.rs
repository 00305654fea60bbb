//! Network namespaces: the one way into one, and whether a recorded one still lives.
//!
//! setns() moves only the calling thread, so a namespace is entered by a thread started here
//! for the purpose, which ends with the job; the process's other threads never leave the
//! host's namespace. Netlink, the doctor and `--restore` all come in through `in_own_thread`
//! or `start_in_own_thread`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

use crate::error::{GuardError, Kind, Result};

/// An open network namespace file (a bind mount or /proc/<pid>/ns/net).
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// `NetnsGone` when the path does not exist: how a dead sandbox looks.
    pub fn open(path: &Path) -> Result<Netns> {
        let file = File::open(path).map_err(|e| {
            let kind = if e.kind() == io::ErrorKind::NotFound { Kind::NetnsGone } else { Kind::Netlink };
            GuardError::new(kind, format!("cannot open netns {}: {e}", path.display()))
        })?;
        Ok(Netns { file, path: path.to_path_buf() })
    }

    /// Moves the calling thread into the namespace. Private to the jobs of `in_own_thread`
    /// and `start_in_own_thread`, whose threads end with them.
    pub fn enter(&self) -> Result<()> {
        setns(&self.file, CloneFlags::CLONE_NEWNET)
            .map_err(|e| GuardError::new(Kind::Netlink, format!("cannot enter netns {}: {e}", self.path.display())))
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Runs `job` on a thread of its own, handed the namespace at `path` to enter when it is
/// ready (netlink opens its host socket first). The caller's thread stays where it is.
pub fn in_own_thread<T: Send>(path: &Path, job: impl FnOnce(Netns) -> Result<T> + Send) -> Result<T> {
    // Opened on the caller's thread so that "no such netns" needs no thread.
    let netns = Netns::open(path)?;
    std::thread::scope(|scope| {
        let worker = worker_thread().spawn_scoped(scope, move || job(netns)).map_err(thread_error)?;
        worker.join().unwrap_or_else(|_| Err(died()))
    })
}

/// An `in_own_thread` whose caller goes on with other work (ADD: the store) meanwhile.
pub struct Pending<T>(std::result::Result<mpsc::Receiver<Result<T>>, GuardError>);

pub fn start_in_own_thread<T: Send + 'static>(path: PathBuf, job: impl FnOnce(Netns) -> Result<T> + Send + 'static) -> Pending<T> {
    let (sender, receiver) = mpsc::channel();
    let spawned = Netns::open(&path).and_then(|netns| {
        worker_thread()
            .spawn(move || {
                // The receiver is gone only when the caller stopped waiting; nothing is left to tell.
                let _ = sender.send(job(netns));
            })
            .map_err(thread_error)
    });
    Pending(spawned.map(|_| receiver))
}

impl<T> Pending<T> {
    /// ADD holds the store lock while it waits: a namespace that does not answer must not
    /// stall every ADD and DEL on the node behind it, hence the bound.
    pub fn wait(self, timeout: Duration) -> Result<T> {
        match self.0?.recv_timeout(timeout) {
            Ok(result) => result,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(GuardError::new(
                Kind::Netlink,
                format!("the pod's netns did not answer within {} s", timeout.as_secs()),
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(died()),
        }
    }
}

fn worker_thread() -> std::thread::Builder {
    // A few netlink messages and their parsing: far below the 2 MiB default stack.
    std::thread::Builder::new().name("sg-netns".into()).stack_size(256 * 1024)
}

fn thread_error(err: io::Error) -> GuardError {
    GuardError::new(Kind::Netlink, format!("cannot start the netns thread: {err}"))
}

fn died() -> GuardError {
    GuardError::new(Kind::Netlink, "the netns thread died")
}

// ---------------------------------------------------------------------------------------
// Is a recorded namespace still alive?

/// Where a recorded network namespace stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsState {
    /// The recorded path is still a namespace file, of the recorded namespace when its
    /// inode is known: whatever is configured in it still exists.
    Mounted,
    /// The path is gone or names another namespace, but these processes are still in the
    /// recorded one (found by inode), so its interfaces and addresses still exist.
    HeldBy(Vec<u32>),
    Gone,
}

impl NetnsState {
    pub fn is_alive(&self) -> bool {
        !matches!(self, NetnsState::Gone)
    }
}

/// The inode of the network namespace at `path`, when `path` is a namespace file: a bind
/// mount of one (what `ip netns add` and the runtimes make) or /proc/<pid>/ns/net. A file
/// left behind after its namespace was unmounted is on tmpfs, not nsfs, and gives `None`.
pub fn netns_inode(path: &str) -> Option<u64> {
    if path.is_empty() {
        return None;
    }
    let fs = nix::sys::statfs::statfs(path).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return None;
    }
    fs::metadata(path).ok().map(|meta| meta.ino())
}

/// Two cheap system calls answer for a mounted namespace; `users` (a /proc scan, which
/// ADD never pays for) is needed only to find one whose path is gone.
pub fn netns_state(path: &str, recorded_inode: Option<u64>, users: Option<&NetnsUsers>) -> NetnsState {
    match (netns_inode(path), recorded_inode) {
        (Some(now), Some(then)) if now == then => return NetnsState::Mounted,
        (Some(_), None) => return NetnsState::Mounted,
        _ => {}
    }
    match (recorded_inode, users) {
        (Some(inode), Some(users)) => match users.pids(inode) {
            [] => NetnsState::Gone,
            pids => NetnsState::HeldBy(pids.to_vec()),
        },
        _ => NetnsState::Gone,
    }
}

/// Which processes are in which network namespace, read once from /proc.
#[derive(Debug, Default)]
pub struct NetnsUsers {
    by_inode: HashMap<u64, Vec<u32>>,
}

impl NetnsUsers {
    pub fn scan() -> NetnsUsers {
        let mut by_inode: HashMap<u64, Vec<u32>> = HashMap::new();
        let Ok(entries) = fs::read_dir("/proc") else { return NetnsUsers { by_inode } };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            // The link reads `net:[4026532281]`; a process that exits meanwhile just drops out.
            let Ok(target) = fs::read_link(entry.path().join("ns/net")) else { continue };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("net:[")?.strip_suffix(']')?.parse::<u64>().ok());
            if let Some(inode) = inode {
                by_inode.entry(inode).or_default().push(pid);
            }
        }
        NetnsUsers { by_inode }
    }

    pub fn pids(&self, inode: u64) -> &[u32] {
        self.by_inode.get(&inode).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_file_is_no_namespace() {
        let path = std::env::temp_dir().join(format!("sg-netns-{}", std::process::id()));
        fs::write(&path, b"").unwrap();
        assert_eq!(netns_inode(path.to_str().unwrap()), None);
        assert_eq!(netns_state(path.to_str().unwrap(), Some(1), Some(&NetnsUsers::default())), NetnsState::Gone);
        fs::remove_file(&path).unwrap();
        assert_eq!(netns_inode(""), None);
    }

    #[test]
    fn our_own_namespace_is_found_by_inode() {
        let inode = netns_inode("/proc/self/ns/net").expect("/proc/self/ns/net is a namespace file");
        let users = NetnsUsers::scan();
        assert!(users.pids(inode).contains(&std::process::id()));
        assert_eq!(netns_state("/nonexistent", Some(inode), Some(&users)), NetnsState::HeldBy(users.pids(inode).to_vec()));
        assert_eq!(netns_state("/proc/self/ns/net", Some(inode), None), NetnsState::Mounted);
    }

    #[test]
    fn a_missing_namespace_is_gone_before_any_thread() {
        let err = in_own_thread(Path::new("/nonexistent/netns"), |_| Ok(())).unwrap_err();
        assert_eq!(err.kind, Kind::NetnsGone);
    }
}
