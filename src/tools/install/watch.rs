//! `--install --watch`: install, then keep the entry in while the primary's installer
//! rewrites or replaces its file (calico's install-cni, multus and cilium do on every start
//! and upgrade). inotify on the conf dir wakes it; after a short settling pause (a primary
//! may write in several steps) it runs the same install, which writes only when the entry is
//! missing or wrong, so its own writes wake it once and change nothing. Another watcher that
//! removes the entry each time would make a loop: past a few re-inserts a minute it backs
//! off, doubling the wait up to five minutes, and says so. SIGTERM or SIGINT ends it with
//! status 0, leaving the guard installed (uninstalling is a step of its own).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::{Options, install};

/// How long the directory must stay quiet before the files are read.
const SETTLE: Duration = Duration::from_millis(300);
/// Even without an event (a watch lost to an overflow, a dir re-created), look again.
const RESYNC: Duration = Duration::from_secs(60);
/// Re-inserts allowed in `WINDOW` before backing off.
const BURST: usize = 5;
const WINDOW: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

fn log(msg: &str) {
    eprintln!("{} sandbox-guard[{}] install: {msg}", crate::clock::now_rfc3339(), std::process::id());
}

fn events() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB
}

pub fn run(options: &Options) -> i32 {
    match watch(options) {
        Ok(()) => 0,
        Err(err) => {
            log(&format!("stopped: {err}"));
            1
        }
    }
}

fn watch(options: &Options) -> Result<(), String> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().map_err(|e| format!("cannot block SIGTERM: {e}"))?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map_err(|e| format!("signalfd: {e}"))?;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(|e| format!("inotify: {e}"))?;
    inotify
        .add_watch(&options.conf_dir, events())
        .map_err(|e| format!("cannot watch {}: {e}", options.conf_dir.display()))?;
    log(&format!("watching {} ({} mode)", options.conf_dir.display(), options.mode.name()));

    let mut writes: VecDeque<Instant> = VecDeque::new();
    let mut backoff = Duration::ZERO;
    let mut last_error = String::new();
    let mut first = true;
    loop {
        reconcile(options, &mut writes, &mut backoff, &mut last_error, first);
        first = false;
        // A drop-in lives in the network's subdirectory: watch it too once it exists.
        if let Ok(net) = super::network::find(&options.conf_dir, options.network.as_deref()) {
            let _ = inotify.add_watch(&options.conf_dir.join(&net.name), events());
        }
        // Wait for a change, a signal or the resync; then let the directory settle.
        let deadline = Instant::now() + RESYNC.max(backoff);
        let mut woke = false;
        loop {
            let now = Instant::now();
            let wait = if woke { SETTLE } else { deadline.saturating_duration_since(now) };
            if !woke && wait.is_zero() {
                break;
            }
            let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN), PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
            let ready = match poll(&mut fds, PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            };
            if fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
                if let Ok(Some(sig)) = signal_fd.read_signal() {
                    log(&format!("signal {}: stopping, sandbox-guard stays installed", sig.ssi_signo));
                }
                return Ok(());
            }
            if ready == 0 {
                if woke {
                    break; // settled
                }
                continue;
            }
            while let Ok(batch) = inotify.read_events() {
                if batch.is_empty() {
                    break;
                }
            }
            woke = true;
        }
        if !backoff.is_zero() {
            sleep_unless_signalled(&signal_fd, backoff)?;
        }
    }
}

fn sleep_unless_signalled(signal_fd: &SignalFd, duration: Duration) -> Result<(), String> {
    let mut fds = [PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::try_from(duration).unwrap_or(PollTimeout::MAX)) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Ok(_) => {
            log("signal: stopping, sandbox-guard stays installed");
            std::process::exit(0)
        }
        Err(e) => Err(format!("poll: {e}")),
    }
}

fn reconcile(options: &Options, writes: &mut VecDeque<Instant>, backoff: &mut Duration, last_error: &mut String, first: bool) {
    match install(options) {
        Ok(done) if done.is_empty() => {
            if first {
                log("already installed: nothing changed");
            }
            last_error.clear();
        }
        Ok(done) => {
            last_error.clear();
            let verb = if first { "installed" } else { "re-inserted" };
            for line in &done {
                log(&format!("{verb}: {line}"));
            }
            if first {
                return;
            }
            let now = Instant::now();
            writes.push_back(now);
            while writes.front().is_some_and(|t| now.duration_since(*t) > WINDOW) {
                writes.pop_front();
            }
            if writes.len() > BURST {
                *backoff = (*backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                log(&format!(
                    "the entry was removed {} times in {}s: another writer keeps rewriting the file; waiting {}s before the next look",
                    writes.len(),
                    WINDOW.as_secs(),
                    backoff.as_secs()
                ));
            } else {
                *backoff = Duration::ZERO;
            }
        }
        // A primary midway through its own install: say it once, look again at its next write.
        Err(err) => {
            if *last_error != err {
                log(&format!("cannot install yet: {err}; waiting for the next change"));
                *last_error = err;
            }
        }
    }
}
