//! Network namespaces: the one way into one, and whether a recorded one still lives.
//!
//! A socket belongs to the namespace it was made in, whichever thread uses it later. So the
//! plugin enters a pod's namespace only to make its sockets (`inside`): the calling thread
//! setns()es in, opens them and goes back, and everything else (netlink requests, ARP
//! announcements, the store) runs in the host's namespace. No thread is started for it: a
//! thread and its wake-up were the largest part of reading link facts (docs/benchmarks.md).
//! Netlink, the doctor and `--restore` all come in through here.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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
            let kind = if e.kind() == io::ErrorKind::NotFound {
                Kind::NetnsGone
            } else {
                Kind::Netlink
            };
            GuardError::new(kind, format!("cannot open netns {}: {e}", path.display()))
        })?;
        Ok(Netns {
            file,
            path: path.to_path_buf(),
        })
    }

    fn enter(&self) -> Result<()> {
        setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|e| {
            GuardError::new(
                Kind::Netlink,
                format!("cannot enter netns {}: {e}", self.path.display()),
            )
        })
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// The device and inode of the namespace, when the file opened is a namespace file (see
    /// `netns_inode`): asked of the open file, so the path is looked up once.
    pub fn identity(&self) -> Option<(u64, u64)> {
        let fs = nix::sys::statfs::fstatfs(&self.file).ok()?;
        if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
            return None;
        }
        self.file
            .metadata()
            .ok()
            .map(|meta| (meta.dev(), meta.ino()))
    }
}

/// Set when a thread could not go back to the host's namespace: whatever it opened next
/// would belong to the pod's, so nothing more is opened.
static STRANDED: AtomicBool = AtomicBool::new(false);

/// Runs `open` (which makes sockets) with the calling thread in `netns`, then brings the
/// thread back where it was. What `open` makes stays in `netns`.
pub fn inside<T>(netns: &Netns, open: impl FnOnce() -> Result<T>) -> Result<T> {
    let home = File::open("/proc/thread-self/ns/net").map_err(|e| {
        GuardError::new(
            Kind::Netlink,
            format!("cannot open this thread's own netns: {e}"),
        )
    })?;
    refuse_if_stranded()?;
    netns.enter()?;
    let opened = open();
    if let Err(e) = setns(&home, CloneFlags::CLONE_NEWNET) {
        STRANDED.store(true, Ordering::SeqCst);
        return Err(GuardError::new(
            Kind::Netlink,
            format!(
                "cannot return from netns {} to the host's: {e}",
                netns.path.display()
            ),
        ));
    }
    opened
}

/// Fails once a thread was left in a pod's namespace (see `inside`): a socket opened now
/// would not be the host's.
pub fn refuse_if_stranded() -> Result<()> {
    if STRANDED.load(Ordering::SeqCst) {
        return Err(GuardError::new(
            Kind::Netlink,
            "an earlier netns entry could not return to the host's netns",
        ));
    }
    Ok(())
}

/// `SO_NETNS_COOKIE` (Linux 5.14), as asm-generic numbers it for x86_64 and arm64.
const SO_NETNS_COOKIE: i32 = 71;

/// The netns cookie of the namespace at `path`: a number the kernel gives each network
/// namespace once and never to another, unlike its inode, which a namespace made after this
/// one is freed can get again. `None` when `path` is no namespace or the kernel has no
/// cookie (before 5.14).
pub fn netns_cookie(path: &str) -> Option<u64> {
    netns_inode(path)?;
    cookie_of(&Netns::open(Path::new(path)).ok()?)
}

/// The cookie of an open namespace, through a socket made in it for the purpose (a socket
/// already made there answers with `socket_netns_cookie`).
pub fn cookie_of(netns: &Netns) -> Option<u64> {
    let socket = inside(netns, || {
        std::os::unix::net::UnixDatagram::unbound().map_err(|e| {
            GuardError::new(
                Kind::Netlink,
                format!("cannot open a socket in the netns: {e}"),
            )
        })
    })
    .ok()?;
    socket_netns_cookie(socket.as_raw_fd())
}

/// The cookie of the namespace a socket was made in.
pub fn socket_netns_cookie(fd: i32) -> Option<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as nix::libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `cookie`, which is that large.
    let done = unsafe {
        nix::libc::getsockopt(
            fd,
            nix::libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    (done == 0 && len as usize == std::mem::size_of::<u64>()).then_some(cookie)
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

/// The device and inode of the network namespace at `path`, when it is a namespace file.
pub fn netns_identity(path: &str) -> Option<(u64, u64)> {
    netns_inode(path)?;
    fs::metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

/// Two cheap system calls answer for a mounted namespace; `users` (a /proc scan, which
/// ADD never pays for) is needed only to find one whose path is gone.
pub fn netns_state(
    path: &str,
    recorded_inode: Option<u64>,
    users: Option<&NetnsUsers>,
) -> NetnsState {
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
        let Ok(entries) = fs::read_dir("/proc") else {
            return NetnsUsers { by_inode };
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            // The link reads `net:[4026532281]`; a process that exits meanwhile just drops out.
            let Ok(target) = fs::read_link(entry.path().join("ns/net")) else {
                continue;
            };
            let inode = target.to_str().and_then(|t| {
                t.strip_prefix("net:[")?
                    .strip_suffix(']')?
                    .parse::<u64>()
                    .ok()
            });
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
        assert_eq!(
            netns_state(
                path.to_str().unwrap(),
                Some(1),
                Some(&NetnsUsers::default())
            ),
            NetnsState::Gone
        );
        fs::remove_file(&path).unwrap();
        assert_eq!(netns_inode(""), None);
    }

    #[test]
    fn our_own_namespace_is_found_by_inode() {
        let inode =
            netns_inode("/proc/self/ns/net").expect("/proc/self/ns/net is a namespace file");
        let users = NetnsUsers::scan();
        assert!(users.pids(inode).contains(&std::process::id()));
        assert_eq!(
            netns_state("/nonexistent", Some(inode), Some(&users)),
            NetnsState::HeldBy(users.pids(inode).to_vec())
        );
        assert_eq!(
            netns_state("/proc/self/ns/net", Some(inode), None),
            NetnsState::Mounted
        );
    }

    #[test]
    fn our_own_namespace_has_one_cookie() {
        let Some(cookie) = netns_cookie("/proc/self/ns/net") else {
            stderr_line!(
                "SKIPPED our_own_namespace_has_one_cookie: no SO_NETNS_COOKIE or setns here"
            );
            return;
        };
        assert_eq!(netns_cookie("/proc/thread-self/ns/net"), Some(cookie));
        assert_eq!(netns_cookie("/nonexistent"), None);
    }

    #[test]
    fn a_missing_namespace_is_gone() {
        let err = Netns::open(Path::new("/nonexistent/netns")).err().unwrap();
        assert_eq!(err.kind, Kind::NetnsGone);
    }

    #[test]
    fn the_thread_comes_back_from_inside() {
        let before = fs::read_link("/proc/thread-self/ns/net").unwrap();
        // Entering our own namespace needs no privilege beyond what setns() checks, and
        // shows the way in and out without a second namespace.
        let own = Netns::open(Path::new("/proc/self/ns/net")).unwrap();
        match inside(&own, || {
            Ok(fs::read_link("/proc/thread-self/ns/net").unwrap())
        }) {
            Ok(seen) => assert_eq!(seen, before),
            Err(err) => stderr_line!(
                "SKIPPED the_thread_comes_back_from_inside: setns needs CAP_SYS_ADMIN ({err})"
            ),
        }
        assert_eq!(fs::read_link("/proc/thread-self/ns/net").unwrap(), before);
    }
}
