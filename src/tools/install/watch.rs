//! `--install --watch`: install, then keep the entry in while the primary's installer
//! rewrites or replaces its file (calico's install-cni, multus and cilium do on every start
//! and upgrade; kindnet and multus thin rewrite often). inotify on the conf dir wakes it;
//! after a short settling pause (a primary may write in several steps) it runs the same
//! install, which writes only when the entry is missing or wrong, so its own writes wake it
//! once and change nothing. The entry's keys it last saw come back with it. Its readiness
//! (the `installed` metric) is the probe's verdict, the runtime's word first; while the
//! runtime has not loaded what was written it looks again every `RECHECK`.
//!
//! A rewrite is an upgrade, however frequent, unless it is a revert: the file's owner put
//! back exactly the list the guard was inserted into, soon after the insert (cilium's
//! exclusive mode does on every change of the dir). A few reverts in a row are a fight the
//! guard cannot win in that file: it says so once with the way out (the drop-in, or the
//! owner's setting), reports not ready, and backs off, doubling the wait up to five
//! minutes. SIGTERM or SIGINT ends it with status 0, leaving the guard installed
//! (uninstalling is a step of its own).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::json::Json;
use super::metrics::InstallMetrics;
use super::{Installed, Options, Reason, install_retrying};

/// How long the directory must stay quiet before the files are read.
const SETTLE: Duration = Duration::from_millis(300);
/// Even without an event (a watch lost to an overflow, a dir re-created, a runtime that
/// reloads its CNI config later than the write), look again.
const RESYNC: Duration = Duration::from_secs(60);
/// While not ready, look sooner: the runtime that has not yet loaded the entry (a reload on
/// its own schedule, a binary put where it searches) turns ready without a conf-dir event;
/// so while a runtime's socket is there but did not answer (the runtime restarting).
const RECHECK: Duration = Duration::from_secs(10);
/// A removal of the entry this soon after its insert, with nothing else changed, is a
/// revert: measured insert to re-insert, so it holds the settling pause. A file owner
/// that watches the dir (cilium) reverts within milliseconds; an upgrade or a person
/// writing the same bytes again comes later.
const REVERT_WITHIN: Duration = Duration::from_secs(1);
/// Reverts in a row that make a fight.
const FIGHT_AFTER: u32 = 3;
const MAX_BACKOFF: Duration = Duration::from_secs(300);

fn log(msg: &str) {
    eprintln!(
        "{} sandbox-guard[{}] install: {msg}",
        crate::clock::now_rfc3339(),
        std::process::id()
    );
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
    signals
        .thread_block()
        .map_err(|e| format!("cannot block SIGTERM: {e}"))?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))?;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|e| format!("inotify: {e}"))?;
    inotify
        .add_watch(&options.conf_dir, events())
        .map_err(|e| format!("cannot watch {}: {e}", options.conf_dir.display()))?;
    // kubelet renews a projected token by swapping the volume's `..data` link: the new token
    // is copied into the plugin's kubeconfig at once, not at the next resync.
    if let Some(access) = &options.api_access
        && let Err(e) = inotify.add_watch(&access.service_account_dir, events())
    {
        log(&format!(
            "cannot watch {} ({e}): a renewed token reaches the plugin's kubeconfig at the next look",
            access.service_account_dir.display()
        ));
    }
    log(&format!(
        "watching {} ({} mode)",
        options.conf_dir.display(),
        options.mode.name()
    ));

    let mut state = State::default();
    let mut watching = Some(super::handover::Watching::start(&super::handover_dir(
        options,
    ))?);
    loop {
        if watching.is_some() && super::handover::uninstalling(&options.conf_dir) {
            // For good: the uninstall waits for this lock, and this process must not put
            // back what it takes out.
            watching = None;
            log("an uninstall is under way: standing down, writing nothing until stopped");
            state.metrics.installed = false;
            if let Some(file) = &options.metrics_file {
                state.metrics.write(file);
            }
        }
        if watching.is_none() {
            sleep_unless_signalled(&signal_fd, RESYNC)?;
            continue;
        }
        reconcile(options, &mut state);
        // A drop-in lives in the network's subdirectory: watch it too once it exists.
        if let Some(dir) = state.dropin_dir.as_ref() {
            let _ = inotify.add_watch(dir, events());
        }
        let backoff = state.backoff;
        // Wait for a change, a signal or the resync; then let the directory settle.
        // Sooner only when installed and waiting on the runtime: a failed install waits for
        // the next write, a fight for its backoff.
        let waiting_on_runtime = (!state.metrics.installed || state.provisional)
            && backoff.is_zero()
            && state.last_error.is_empty();
        let look_again = match waiting_on_runtime {
            true => RECHECK,
            false => RESYNC.max(backoff),
        };
        let deadline = Instant::now() + look_again;
        let mut woke = false;
        loop {
            let now = Instant::now();
            let wait = if woke {
                SETTLE
            } else {
                deadline.saturating_duration_since(now)
            };
            if !woke && wait.is_zero() {
                break;
            }
            let mut fds = [
                PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
                PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
            ];
            let ready = match poll(
                &mut fds,
                PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            };
            if fds[1]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN))
            {
                if let Ok(Some(sig)) = signal_fd.read_signal() {
                    log(&format!(
                        "signal {}: stopping, sandbox-guard stays installed",
                        sig.ssi_signo
                    ));
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
            state.slept += backoff;
        }
    }
}

fn sleep_unless_signalled(signal_fd: &SignalFd, duration: Duration) -> Result<(), String> {
    let mut fds = [PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
    match poll(
        &mut fds,
        PollTimeout::try_from(duration).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Ok(_) => {
            log("signal: stopping, sandbox-guard stays installed");
            std::process::exit(0)
        }
        Err(e) => Err(format!("poll: {e}")),
    }
}

/// What the watch knows between two looks.
#[derive(Default)]
struct State {
    started: bool,
    backoff: Duration,
    last_error: String,
    /// The last insert: when, and the primary's list it went into.
    last_insert: Option<(Instant, Json)>,
    reverts: u32,
    /// Backing off since the last insert: not the other writer's time.
    slept: Duration,
    /// The entry as last seen: its keys survive a rewrite that drops it.
    entry: Option<Json>,
    dropin_dir: Option<std::path::PathBuf>,
    metrics: InstallMetrics,
    said_ready: Option<bool>,
    warnings: Vec<String>,
    /// The last verdict came from the files while a runtime's socket is there: a runtime
    /// restarting (k3s's upgrade or rollback) may come back searching another dir.
    provisional: bool,
    /// What the last write of the plugin's kubeconfig said: a failure is said once.
    api_access_said: String,
}

fn reconcile(options: &Options, state: &mut State) {
    let first = !state.started;
    state.started = true;
    let mut said = Vec::new();
    state.metrics.api_credentials = super::refresh_api_access(options, &mut |line| said.push(line));
    let said_now = said.join("\n");
    if said_now != state.api_access_said {
        said.iter().for_each(|line| log(line));
        state.api_access_said = said_now;
    }
    match install_retrying(options, state.entry.as_ref()) {
        Ok(installed) => {
            state.last_error.clear();
            if first {
                installed.notes.iter().for_each(|line| log(line));
            }
            // Said again when they change: a bad entry key comes and goes with the ConfigMap.
            if first || installed.warnings != state.warnings {
                installed
                    .warnings
                    .iter()
                    .for_each(|line| log(&format!("warning: {line}")));
                state.warnings = installed.warnings.clone();
            }
            if installed
                .file
                .file_name()
                .is_some_and(|n| n == super::edit::DROPIN_FILE)
            {
                state.dropin_dir = installed.file.parent().map(|d| d.to_path_buf());
            }
            state.entry = installed.entry.clone();
            super::forget_api_access(options, &installed, &mut |line| log(&line));
            state.metrics.need = installed.verdict.as_ref().map(|v| v.need);
            if installed.done.is_empty() {
                if first {
                    log("already installed: nothing changed");
                }
            } else {
                reinserted(state, &installed, first);
            }
        }
        // A primary midway through its own install: say it once, look again at its next write.
        Err(failure) => {
            *state.metrics.failures.entry(failure.reason).or_default() += 1;
            if !failure.done.is_empty() {
                state.metrics.stood_aside += 1;
                for line in &failure.done {
                    log(&format!("stood aside: {line}"));
                }
                // Said again with what it wrote, though the reason may be the same.
                state.last_error.clear();
            }
            if state.last_error != failure.msg {
                log(&format!(
                    "cannot install yet: {}; waiting for the next change",
                    failure.msg
                ));
                state.last_error = failure.msg;
            }
        }
    }
    // The probe's verdict, the runtime's word first: the metric and the probe never differ.
    let (source, ready) = super::readiness::check(options);
    state.metrics.installed = ready.is_ok() && !state.metrics.fight;
    state.provisional = source.starts_with("source: files")
        && super::readiness::sockets(options.runtime_socket.as_deref(), &options.host_root)
            .iter()
            .any(|socket| socket.exists());
    // Said when it changes; a failed install has said why already.
    if state.last_error.is_empty() && state.said_ready != Some(state.metrics.installed) {
        log(&source);
        match &ready {
            Ok(lines) if !state.metrics.fight => log(lines.last().map_or("ready", String::as_str)),
            Ok(_) => log("not ready: another writer reverts each insert"),
            Err(failure) => log(&format!("not ready: {}", failure.msg)),
        }
        state.said_ready = Some(state.metrics.installed);
    }
    if let Some(file) = &options.metrics_file {
        state.metrics.write(file);
    }
}

fn reinserted(state: &mut State, installed: &Installed, first: bool) {
    let verb = if first { "installed" } else { "re-inserted" };
    for line in &installed.done {
        log(&format!("{verb}: {line}"));
    }
    let now = Instant::now();
    let primary = installed.primary_list.clone().unwrap_or(Json::Null);
    if !first {
        state.metrics.reinserts += 1;
        let revert = state.last_insert.as_ref().is_some_and(|(at, list)| {
            now.duration_since(*at).saturating_sub(state.slept) <= REVERT_WITHIN
                && list.same_as(&primary)
        });
        state.reverts = if revert { state.reverts + 1 } else { 0 };
    }
    state.last_insert = Some((now, primary));
    state.slept = Duration::ZERO;
    if state.reverts >= FIGHT_AFTER {
        state.backoff = (state.backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
        if !state.metrics.fight {
            *state.metrics.failures.entry(Reason::Fight).or_default() += 1;
            log(&format!(
                "another writer keeps rewriting {} and reverts each insert ({} times within {:?} of it): a fight the guard \
                 cannot win in that file, not an upgrade. Use --mode dropin (libcni 1.3: containerd 2.1+, CRI-O 1.33+), \
                 or let the file's owner keep other plugins (cilium: cni.exclusive=false); not ready, next look in {}s",
                installed.file.display(),
                state.reverts,
                REVERT_WITHIN,
                state.backoff.as_secs()
            ));
        } else {
            log(&format!(
                "another writer keeps rewriting {}: still reverted; next look in {}s",
                installed.file.display(),
                state.backoff.as_secs()
            ));
        }
        state.metrics.fight = true;
    } else if state.reverts == 0 {
        state.backoff = Duration::ZERO;
        state.metrics.fight = false;
    }
}
