//! Delegate mode's replay worker: the process that hands deferred DELs to the primary, off
//! every pod's critical path.
//!
//! A verb never runs another sandbox's primary DEL itself. When it freed a pod key that has
//! deferred DELs (the owner's DEL), or when any wait in the store, it starts the worker: the
//! guard's own binary again (`/proc/self/exe`), with the verb's environment and network
//! configuration (on a memfd as stdin), in a session of its own, its stdout and stderr on
//! /dev/null so the runtime's pipes close when the verb exits. So the replay runs exactly as
//! the runtime's exec of the primary would (host mounts, host network, `CNI_PATH`, the
//! primary's files), which a replay from the DaemonSet's pod could not without the node's
//! privileges.
//!
//! The DEL that freed a key hands its pod lock over (an inherited file descriptor): no ADD of
//! the pod slips in between the owner's DEL and the replay. It waits for the worker at most
//! `OWN_REPLAY_WAIT`, then answers; the worker goes on with its own replay budget
//! (`replayTimeoutSeconds` per primary run). Every other verb starts the worker only when no
//! sweep runs (a try-lock, `sweep.lock`), never waits for it, and so never pays for another
//! pod's primary: one sweeping worker per node at a time, so N hung entries are never N waits.
//!
//! Every worker holds `replay.lock` shared for its whole life (taken by the verb before the
//! start, so there is no gap): whoever needs all replays finished takes it exclusively
//! (`state::hold_off_replays`). The verb only tries it: while a command holds it, no worker
//! starts and the deferred DELs wait for a later verb.

use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cni::delegate::Delegate;
use crate::cni::invocation::Invocation;
use crate::state::pod_lock::PodLock;
use crate::state::{REPLAY_LOCK, open_lock_file};

/// Set in the worker's environment: the digests of the pod keys whose locks it was handed
/// (comma separated, possibly none), or `GC_SWEEP`. Its presence makes the binary a worker.
pub const WORKER_ENV: &str = "SANDBOX_GUARD_REPLAY_WORKER";
/// A GC's worker: its sweep replays every free key's entries whatever their back-off, as
/// the runtime asked for a collection now.
const GC_SWEEP: &str = "gc";
/// Held exclusively by the one worker that sweeps the node.
const SWEEP_LOCK: &str = "sweep.lock";
/// The worker's first inherited descriptor: `replay.lock`; the handed pod locks follow.
const FIRST_FD: i32 = 3;
/// The most pod locks one worker is handed (a DEL locks one key per interface, at most).
const MAX_HANDED: usize = 15;
/// How long the DEL that freed a pod key waits for the replays of its pod before answering:
/// a healthy primary's DEL fits, and then the pod's deferred DELs have reached the primary
/// before its runtime goes on; a slow one is left to finish in the worker.
const OWN_REPLAY_WAIT: Duration = Duration::from_secs(1);
/// No replay starts after a worker has run this long; the next verb starts a new one.
const WORKER_LIFETIME: Duration = Duration::from_secs(600);
/// The least time between two sweeps a STATUS starts: the runtime asks for STATUS every few
/// seconds whether or not pods change, and a sweep asks the API server about every held pod
/// name (and logs each one it gets no answer for).
const STATUS_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Starts the workers there is work for: one for the `handed` pod locks' replays (waited for
/// at most `OWN_REPLAY_WAIT`), and a sweeping one when deferred DELs wait and no sweep runs
/// (never waited for). `gc`: GC's sweep (`GC_SWEEP`). Never fails the verb: a
/// worker that cannot start leaves the entries to the next one, and the handed keys' are
/// replayed here.
pub fn start(inv: &Invocation, delegate: &Delegate, handed: Vec<PodLock>, gc: bool) {
    let root = &inv.conf.state_dir;
    // This DEL's own ask got no answer: the handed keys' replays would wait for one, after
    // asking again while the runtime waits for this DEL. The sweep asks later, unwaited.
    let handed = if !handed.is_empty() && super::super::api_check::replays_wait_unanswered(inv) {
        for lock in handed {
            lock.release_unused(root);
        }
        Vec::new()
    } else {
        handed
    };
    // GC's sweep also rolls back ADDs cut off at the primary; the others do so on their way.
    let waiting = |root: &Path| anything_deferred(root) || (gc && anything_pending(root));
    if handed.is_empty() && !waiting(root) {
        return;
    }
    // Held by every worker it starts, and by this verb for a replay of its own: a command that
    // holds it exclusively (`--downgrade`, leaving delegate mode) sees no replay beside it.
    // Never waited for: held off, the entries wait for a later verb's worker.
    let replaying = match replay_lock(root) {
        Ok(replaying) => replaying,
        Err(err) => {
            stderr_line!("sandbox-guard: no replay now, the deferred DELs wait: {err}");
            return;
        }
    };
    if !handed.is_empty() {
        let mut handed = handed;
        // More than a worker takes: those keys' locks go, and a sweep replays them.
        handed.truncate(MAX_HANDED);
        match spawn(inv, &replaying, &handed, false) {
            Ok(child) => {
                // The worker holds the handed locks now (its own descriptors of the same
                // open files): ours go first, or its letting go between entries would not
                // let the lock go.
                drop(handed);
                wait_a_moment(child);
            }
            Err(err) => {
                stderr_line!(
                    "sandbox-guard: the replay worker could not start ({err}); replaying here"
                );
                let until = Instant::now() + inv.conf.replay_timeout;
                for lock in handed {
                    super::replay_key(inv, delegate, lock, false, until);
                }
            }
        }
    }
    if !waiting(root) || sweep_running(root) {
        return;
    }
    // Not waited for, GC's sweep neither: its replays run other pods' primaries.
    if let Err(err) = spawn(inv, &replaying, &[], gc) {
        stderr_line!("sandbox-guard: the replay worker could not start: {err}");
    }
}

/// STATUS's part: a sweep, when deferred DELs wait and no sweep has started within
/// `STATUS_SWEEP_EVERY` (the sweeping worker stamps `sweep.lock` as it starts).
pub fn start_for_status(inv: &Invocation, delegate: &Delegate) {
    let swept = std::fs::symlink_metadata(inv.conf.state_dir.join(SWEEP_LOCK))
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|at| at.elapsed().ok());
    if swept.is_some_and(|ago| ago < STATUS_SWEEP_EVERY) {
        return;
    }
    start(inv, delegate, Vec::new(), false);
}

/// `replay.lock`, shared, if no command holds it exclusively now.
fn replay_lock(root: &Path) -> std::io::Result<File> {
    if crate::state::replays_awaited(root) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "an operator command (--downgrade, or leaving delegate mode) waits for replay.lock",
        ));
    }
    let replaying = open_lock_file(&root.join(REPLAY_LOCK))?;
    match replaying.try_lock_shared() {
        Ok(()) => Ok(replaying),
        Err(std::fs::TryLockError::WouldBlock) => Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "an operator command (--downgrade, or leaving delegate mode) holds replay.lock",
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Waits for the worker at most `OWN_REPLAY_WAIT`. One still running is not reaped: it
/// outlives the verb, and init (or the runtime, as a subreaper) reaps it.
fn wait_a_moment(mut child: Child) {
    let until = Instant::now() + OWN_REPLAY_WAIT;
    while Instant::now() < until {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The worker's entry: replays the handed keys, or else sweeps if no other worker does (a
/// worker handed keys never sweeps: the DEL that waits for it must not wait for other pods'
/// primaries). `handed`: the digests of `WORKER_ENV`.
pub fn run(inv: &Invocation, delegate: &Delegate, handed: &str) {
    let root = &inv.conf.state_dir;
    // Started by hand with the variable set, but not by a verb: nothing was handed over.
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if unsafe { nix::libc::fcntl(FIRST_FD, nix::libc::F_GETFD) } < 0 {
        return;
    }
    // SAFETY: the verb that started this process put these descriptors there for it
    // (`spawn`), and nothing else in this process has taken them.
    let _replaying = unsafe { File::from_raw_fd(inherited(FIRST_FD)) };
    let gc = handed == GC_SWEEP;
    let locks: Vec<PodLock> = handed
        .split(',')
        .filter(|_| !gc)
        .filter(|d| !d.is_empty())
        .enumerate()
        .filter_map(|(n, digest)| {
            // SAFETY: as above, one descriptor per digest after `FIRST_FD`.
            let file = unsafe { File::from_raw_fd(inherited(FIRST_FD + 1 + n as i32)) };
            PodLock::handed(root, digest, file)
        })
        .collect();
    let until = Instant::now() + WORKER_LIFETIME;
    if !locks.is_empty() || !(gc || handed.is_empty()) {
        for lock in locks {
            super::replay_key(inv, delegate, lock, false, until);
        }
        return;
    }
    let Some(sweeping) = try_lock(root, SWEEP_LOCK) else {
        return;
    };
    // When this sweep started, for `start_for_status`; a file it cannot stamp costs only a
    // STATUS sweep more.
    let _ = sweeping.set_modified(std::time::SystemTime::now());
    super::sweep(inv, delegate, until, !gc);
    collect_temp_files(root, inv.conf.lock_timeout);
}

/// An inherited descriptor made close-on-exec again (`spawn`'s dup2 cleared it): the primaries
/// this worker runs, and a daemon one of them leaves behind out of its process group, must not
/// hold `replay.lock` or a pod's lock after the worker is done.
fn inherited(fd: i32) -> i32 {
    // SAFETY: F_SETFD only sets the descriptor's flags.
    unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
    fd
}

fn anything_deferred(root: &Path) -> bool {
    std::fs::read_dir(root.join(crate::state::deferred::DEFERRED))
        .is_ok_and(|mut dirs| dirs.next().is_some())
}

fn anything_pending(root: &Path) -> bool {
    !crate::state::pending_add::digests(root).is_empty()
}

/// Whether a worker sweeps now: one at a time per node, so the verb starts none.
fn sweep_running(root: &Path) -> bool {
    let path = root.join(SWEEP_LOCK);
    match open_lock_file(&path) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

fn try_lock(root: &Path, name: &str) -> Option<File> {
    let file = open_lock_file(&root.join(name)).ok()?;
    file.try_lock().ok()?;
    Some(file)
}

/// Starts the worker: the verb's own config on a memfd as stdin, `replaying` (`replay.lock`,
/// held shared) and the handed pod locks as descriptors 3, 4, ...
fn spawn(
    inv: &Invocation,
    replaying: &File,
    handed: &[PodLock],
    gc: bool,
) -> std::io::Result<Child> {
    let conf = nix::sys::memfd::memfd_create(
        c"sandbox-guard-conf",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )?;
    let mut conf = File::from(conf);
    conf.write_all(&inv.conf_bytes)?;
    conf.rewind()?;
    let digests: Vec<&str> = if gc {
        vec![GC_SWEEP]
    } else {
        handed.iter().map(PodLock::digest).collect()
    };
    let mut fds = vec![replaying.as_raw_fd()];
    fds.extend(handed.iter().map(|lock| lock.file().as_raw_fd()));
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("sandbox-guard")
        .env(WORKER_ENV, digests.join(","))
        // Its own session, whose id may once have been a cut-off ADD's process group: the
        // rollback's kill knows it by this variable's other value.
        .env(crate::state::pending_add::MARKER_VAR, "")
        .stdin(Stdio::from(conf))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid, fcntl and dup2 are async-signal-safe and touch only descriptors.
    unsafe {
        command.pre_exec(move || {
            nix::libc::setsid();
            // Out of the way first, so no target number overwrites a source (no allocation
            // between fork and exec).
            let mut moved = [0; MAX_HANDED + 1];
            for (slot, &fd) in moved.iter_mut().zip(&fds) {
                *slot = nix::libc::fcntl(fd, nix::libc::F_DUPFD_CLOEXEC, 64);
                if *slot < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (n, &fd) in moved[..fds.len()].iter().enumerate() {
                // dup2 clears close-on-exec on the copy: the worker inherits it.
                if nix::libc::dup2(fd, FIRST_FD + n as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Temp files in `deferred/*/` of writers that were killed, the folders they leave empty, and
/// the pod-waits files of verbs killed while they waited (containerd before 2.0 sends no GC).
fn collect_temp_files(root: &Path, wait: Duration) {
    crate::state::pod_lock::remove_gone_waiters(root);
    let Ok(store) = crate::state::Store::open(root, wait) else {
        return;
    };
    let _ = store.remove_dead_temp_files();
    for dir in std::fs::read_dir(root.join(crate::state::deferred::DEFERRED))
        .into_iter()
        .flatten()
        .flatten()
    {
        // Only an empty one goes; a writer holds the store's lock to add to it.
        let _ = std::fs::remove_dir(dir.path());
    }
}
