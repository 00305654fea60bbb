//! Delegate mode: the primary plugin the guard wraps, run as libcni would have run it.
//!
//! Chained last, the guard can stop a stale DEL only by failing it. Wrapping the primary
//! instead, it decides before the primary sees a verb: a stale DEL can then succeed for the
//! runtime while the primary's DEL waits (`state::deferred`). The primary gets the same
//! `CNI_*` environment and, on stdin, its own object from the `delegate` key plus the
//! network's `name` and `cniVersion`, the `prevResult` when the guard got one, the
//! `runtimeConfig` its `capabilities` ask for, and GC's attachment list: what libcni would
//! have handed it had it been in the chain itself.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{GuardError, Kind, Result};
use crate::names;

/// The most the guard sends a primary: what it accepts on its own stdin (a conflist entry),
/// checked after the prevResult is put in.
const MAX_STDIN: u64 = 1 << 20;
/// More than any result; a primary that writes more is broken.
const MAX_REPLY: u64 = 1 << 20;
/// A pipe holds at least this much: smaller stdin is written before the primary runs.
const PIPE_CAPACITY: usize = 60 * 1024;
/// VERSION does no work; a primary that takes longer is broken.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// The GC lists as a runtime sends them: libcni >= 1.2 sets both keys, the spec's and the
/// legacy one (libcni#1101); the primary gets each one the guard got.
pub const GC_LIST_KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

#[derive(Debug)]
pub struct Delegate {
    /// The primary's `type`: a file name looked up in `CNI_PATH`.
    pub plugin_type: String,
    /// Its stdin without `name`, `cniVersion` and `prevResult`.
    conf: Map<String, Value>,
}

/// What replaces the guard's own `CNI_*` environment for one call (a replayed DEL is
/// another sandbox's), and where the primary notes its pid.
#[derive(Debug, Default)]
pub struct EnvOverride<'a> {
    pub command: Option<&'a str>,
    pub container_id: Option<&'a str>,
    pub netns: Option<&'a str>,
    pub if_name: Option<&'a str>,
    pub args: Option<&'a str>,
    /// Written by the primary's process before it execs (`state::pending_add`): its pid is
    /// its process group's, and without the file it never ran.
    pub pid_file: Option<&'a std::path::Path>,
    /// The pending ADD's nonce, as `pending_add::MARKER_VAR` in the primary's environment.
    pub marker: Option<&'a str>,
}

impl Delegate {
    pub fn from_conf(
        mut object: Map<String, Value>,
        runtime_config: Option<&Map<String, Value>>,
        gc_lists: &[(&str, Value)],
    ) -> Result<Delegate> {
        let plugin_type = Delegate::type_of(&object)?;
        // libcni hands a plugin the runtime's settings for the capabilities it declares.
        let wanted = |key: &str| {
            object.get("capabilities").and_then(|caps| caps.get(key)) == Some(&Value::Bool(true))
        };
        let settings: Map<String, Value> = runtime_config
            .into_iter()
            .flatten()
            .filter(|(key, _)| wanted(key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        object.remove("runtimeConfig");
        if !settings.is_empty() {
            object.insert("runtimeConfig".into(), Value::Object(settings));
        }
        for key in GC_LIST_KEYS {
            object.remove(key);
        }
        for (key, list) in gc_lists {
            object.insert((*key).into(), list.clone());
        }
        for key in ["name", "cniVersion", "prevResult"] {
            object.remove(key);
        }
        Ok(Delegate {
            plugin_type,
            conf: object,
        })
    }

    /// The primary's object as this call hands it over, for a deferred DEL to replay with
    /// later: its own `runtimeConfig`, and never a GC list (a DEL has none).
    pub fn recorded_conf(&self) -> Map<String, Value> {
        let mut conf = self.conf.clone();
        for key in GC_LIST_KEYS {
            conf.remove(key);
        }
        conf
    }

    /// The primary as a deferred DEL recorded it (`recorded_conf`), whatever the conflist
    /// says now.
    pub fn from_recorded(conf: Map<String, Value>) -> Result<Delegate> {
        Ok(Delegate {
            plugin_type: Delegate::type_of(&conf)?,
            conf,
        })
    }

    /// The primary of this config without the runtime's `runtimeConfig` and GC lists: what a
    /// deferred DEL recorded before deferrals kept their own is replayed with.
    pub fn without_call_settings(&self) -> Delegate {
        let mut conf = self.recorded_conf();
        conf.remove("runtimeConfig");
        Delegate {
            plugin_type: self.plugin_type.clone(),
            conf,
        }
    }

    fn type_of(object: &Map<String, Value>) -> Result<String> {
        let plugin_type = match object.get("type") {
            Some(Value::String(name)) => name.clone(),
            _ => {
                return Err(GuardError::new(
                    Kind::InvalidConfig,
                    "\"delegate\" has no \"type\": name the primary plugin it wraps",
                ));
            }
        };
        names::check_plain("delegate type", &plugin_type, 255, Kind::InvalidConfig)?;
        if plugin_type == "sandbox-guard" {
            return Err(GuardError::new(
                Kind::InvalidConfig,
                "\"delegate\" names sandbox-guard itself: name the primary plugin it wraps",
            ));
        }
        Ok(plugin_type)
    }

    fn stdin(
        &self,
        network: &str,
        cni_version: &str,
        prev_result: Option<&RawValue>,
    ) -> Result<Vec<u8>> {
        let mut conf = self.conf.clone();
        conf.insert("cniVersion".into(), Value::String(cni_version.into()));
        conf.insert("name".into(), Value::String(network.into()));
        if let Some(prev) = prev_result {
            let value = serde_json::from_str(prev.get()).map_err(|e| {
                GuardError::new(
                    Kind::Decode,
                    format!("cannot decode the prevResult for the delegate: {e}"),
                )
            })?;
            conf.insert("prevResult".into(), value);
        }
        serde_json::to_vec(&Value::Object(conf)).map_err(|e| {
            GuardError::new(
                Kind::Decode,
                format!("cannot encode the delegate's configuration: {e}"),
            )
        })
    }

    /// Runs the primary and returns what it wrote to stdout when it succeeded. Its error goes
    /// back as it wrote it (`Kind::Delegate`, `GuardError::verbatim`). Its stderr is ours.
    /// No timeout of our own for the runtime's own call: the runtime bounds it, and when it
    /// kills the guard the primary dies with it, as it would had the runtime run it directly.
    /// A runtime gone before it could kill us ends the call too (`Kind::Unheard`).
    pub fn call(
        &self,
        network: &str,
        cni_version: &str,
        prev_result: Option<&RawValue>,
        env: &EnvOverride,
    ) -> Result<Vec<u8>> {
        self.call_within(network, cni_version, prev_result, env, None)
    }

    /// `call`, stopped at `deadline`: the primary and everything it started (its process
    /// group) are killed then, and the call fails with code 103. The guard's own work for
    /// another sandbox (a replay) must not hold up the runtime's call it rides on.
    pub fn call_within(
        &self,
        network: &str,
        cni_version: &str,
        prev_result: Option<&RawValue>,
        env: &EnvOverride,
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>> {
        let stdin = self.stdin(network, cni_version, prev_result)?;
        if stdin.len() as u64 > MAX_STDIN {
            return Err(GuardError::new(
                Kind::Decode,
                format!(
                    "the configuration for the delegate {} is larger than {MAX_STDIN} bytes",
                    self.plugin_type
                ),
            ));
        }
        let path = self.find()?;
        self.run(&path, stdin, env, deadline)
    }

    /// The primary's VERSION: the versions it says it speaks. Asked as libcni asks, with
    /// the network's configuration on stdin.
    pub fn supported_versions(&self, network: &str, cni_version: &str) -> Result<Vec<String>> {
        let env = EnvOverride {
            command: Some("VERSION"),
            ..EnvOverride::default()
        };
        // Read as libcni reads it (`version::read_plugin_versions`), the doctor's reading too.
        let answered = self.call_within(
            network,
            cni_version,
            None,
            &env,
            Some(Instant::now() + VERSION_TIMEOUT),
        );
        let (exited_ok, reply) = match &answered {
            Ok(reply) => (true, reply.as_slice()),
            Err(err) => match (&err.kind, &err.verbatim) {
                (Kind::Delegate(_), Some(text)) => (false, text.as_bytes()),
                _ => return answered.map(|_| Vec::new()),
            },
        };
        crate::cni::version::read_plugin_versions(exited_ok, reply).map_err(|why| match answered {
            Err(err) => err,
            Ok(_) => self.broken(format!(
                "the delegate {} answered VERSION with no answer libcni reads: it {why}",
                self.plugin_type
            )),
        })
    }

    fn run(
        &self,
        path: &std::path::Path,
        stdin: Vec<u8>,
        env: &EnvOverride,
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>> {
        // A runtime gone while the guard waited for the pod's lock: no primary for nobody.
        if deadline.is_none() && answer_unread() {
            return Err(self.unheard(false));
        }
        let mut command = Command::new(path);
        // A config that fits a pipe is in it before the primary runs: an exec'd primary has
        // all of it whatever happens to the guard, and a cut-off ADD's note can take the
        // primary's pid (`pid_file`) for a primary that acts.
        let pipe = (stdin.len() <= PIPE_CAPACITY)
            .then(std::io::pipe)
            .transpose()
            .map_err(|e| self.broken(format!("cannot make a pipe for {}: {e}", path.display())))?
            // A pipe smaller than asked (a user over its pipe pages) goes the writer's way.
            .filter(|(_, writer)| {
                use std::os::fd::AsRawFd;
                // SAFETY: F_GETPIPE_SZ only reads the pipe's size.
                let size = unsafe { nix::libc::fcntl(writer.as_raw_fd(), nix::libc::F_GETPIPE_SZ) };
                usize::try_from(size).is_ok_and(|size| size >= stdin.len())
            });
        let prefilled = if let Some((reader, mut writer)) = pipe {
            writer.write_all(&stdin).map_err(|e| {
                self.broken(format!("cannot fill the pipe for {}: {e}", path.display()))
            })?;
            Some(reader)
        } else {
            None
        };
        let fits = prefilled.is_some();
        command
            .stdin(prefilled.map_or_else(Stdio::piped, Stdio::from))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in [
            ("CNI_COMMAND", env.command),
            ("CNI_CONTAINERID", env.container_id),
            ("CNI_NETNS", env.netns),
            ("CNI_IFNAME", env.if_name),
            ("CNI_ARGS", env.args),
            // Every primary carries the variable, empty where its ADD has no note: the
            // rollback's kill tells a noted ADD's processes from any other call's by it.
            (
                crate::state::pending_add::MARKER_VAR,
                Some(env.marker.unwrap_or_default()),
            ),
        ] {
            if let Some(value) = value {
                command.env(key, value);
            }
        }
        // Its own process group: a deadline kills the primary with whatever it started (its
        // IPAM), which would otherwise hold its stdout open and outlive it.
        command.process_group(0);
        let guard_pid = std::process::id() as nix::libc::pid_t;
        let pid_file = env
            .pid_file
            .map(|path| std::ffi::CString::new(path.as_os_str().as_bytes()))
            .transpose()
            .map_err(|_| self.broken("the pid file's path holds a NUL byte".into()))?;
        // SAFETY: prctl, getppid, getpid, open, write and close are async-signal-safe; the
        // closure reads only its own captures and writes only its stack.
        unsafe {
            command.pre_exec(move || {
                if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The guard died before the prctl: no signal will come, so never start.
                if nix::libc::getppid() != guard_pid {
                    return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
                }
                // Without its pid the note reads as of a primary that never ran: the ADD
                // goes on as without a note rather than fail the pod's start.
                if let Some(path) = &pid_file {
                    let _ = write_own_pid(path);
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| self.broken(format!("cannot run {}: {e}", path.display())))?;
        let mut pipe = child.stdin.take();
        let writer = if fits {
            None
        } else {
            Some(std::thread::spawn(move || {
                let _ = pipe.as_mut().map(|p| p.write_all(&stdin));
            }))
        };
        let outcome = self.read_reply(&mut child, deadline).and_then(|reply| {
            let status = self.wait_for_exit(&mut child, deadline)?;
            Ok((reply, status))
        });
        // A primary that failed as the runtime left (on the stderr pipe they share, say) was
        // cut off with it: its ADD keeps its note.
        let outcome = match outcome {
            Ok((_, status)) if status.success() => outcome,
            _ if deadline.is_none() && answer_unread() => Err(self.unheard(true)),
            _ => outcome,
        };
        if outcome.is_err() {
            kill_group(&mut child);
        } else if deadline.is_some() {
            // What the primary left running in its process group (a daemon holding its
            // stdout) goes with it, so retries do not pile them up. One that left the group
            // (setsid) is out of reach.
            let group = nix::unistd::Pid::from_raw(child.id() as nix::libc::pid_t);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        let (reply, status) = outcome?;
        if status.success() {
            return Ok(reply);
        }
        Err(self.error_from(&reply, status))
    }

    /// Everything the primary writes to stdout until it closes it, or the deadline. With a
    /// deadline (a replay), reading also ends once the primary itself has exited: a daemon it
    /// forked may hold its stdout open for good, and the primary's answer is complete then.
    /// Without one (the runtime's own call), it ends when nobody reads the guard's own
    /// stdout any more (`Kind::Unheard`).
    fn read_reply(&self, child: &mut Child, deadline: Option<Instant>) -> Result<Vec<u8>> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut reply = Vec::new();
        let Some(mut out) = child.stdout.take() else {
            return Ok(reply);
        };
        // The runtime that ran us can exit before it kills the plugins it runs (a containerd
        // restart); the primary's answer then reaches nobody, yet waiting for it would hold
        // the pod's lock for as long as the primary hangs. A pipe's writer polls POLLERR once
        // its reader is gone, a socket's POLLHUP; a file never does.
        let answer_to = std::io::stdout();
        let mut watch_answer = deadline.is_none();
        let mut chunk = [0u8; 8192];
        let mut exited = false;
        loop {
            let wait = match deadline {
                None => PollTimeout::NONE,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() && !exited {
                        return Err(self.expired());
                    }
                    // Short rounds: between them, whether the primary has exited.
                    if exited {
                        PollTimeout::ZERO
                    } else {
                        PollTimeout::from(left.as_millis().clamp(1, 50) as u16)
                    }
                }
            };
            let mut fds = [
                PollFd::new(out.as_fd(), PollFlags::POLLIN),
                PollFd::new(answer_to.as_fd(), PollFlags::empty()),
            ];
            let watched = if watch_answer { 2 } else { 1 };
            match poll(&mut fds[..watched], wait) {
                Ok(0) if exited => return Ok(reply),
                Ok(0) | Err(nix::errno::Errno::EINTR) => {
                    exited = deadline.is_some() && matches!(child.try_wait(), Ok(Some(_)));
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(self.broken(format!(
                        "cannot wait for the answer of {}: {e}",
                        self.plugin_type
                    )));
                }
            }
            if watch_answer {
                let ours = fds[1].revents().unwrap_or(PollFlags::empty());
                if ours.contains(PollFlags::POLLNVAL) {
                    watch_answer = false;
                } else if reader_gone(ours) {
                    return Err(self.unheard(true));
                }
                if fds[0].revents().is_none_or(|theirs| theirs.is_empty()) {
                    continue;
                }
            }
            match out.read(&mut chunk) {
                Ok(0) => return Ok(reply),
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(self.broken(format!(
                        "cannot read the answer of {}: {e}",
                        self.plugin_type
                    )));
                }
            }
            if reply.len() as u64 > MAX_REPLY {
                return Err(self.broken(format!(
                    "{} wrote more than {MAX_REPLY} bytes",
                    self.plugin_type
                )));
            }
        }
    }

    /// The primary's exit once it has closed its stdout: by `deadline`, else (the runtime's
    /// own call) for as long as the answer has a reader, which is looked at each second.
    fn wait_for_exit(
        &self,
        child: &mut Child,
        deadline: Option<Instant>,
    ) -> Result<std::process::ExitStatus> {
        loop {
            let until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            let waited = wait_until(child, Some(until))
                .map_err(|e| self.broken(format!("cannot wait for {}: {e}", self.plugin_type)))?;
            match waited {
                Some(status) => return Ok(status),
                None if deadline.is_some() => return Err(self.expired()),
                None if answer_unread() => return Err(self.unheard(true)),
                None => {}
            }
        }
    }

    /// `ran`: whether the primary was started (and then killed).
    fn unheard(&self, ran: bool) -> GuardError {
        let primary = match ran {
            true => "was killed with its process group",
            false => "was not run",
        };
        GuardError::new(
            Kind::Unheard,
            format!(
                "the runtime that ran this call is gone (nobody reads its answer), so the primary {} {primary}",
                self.plugin_type
            ),
        )
        .with_details(
            "As the runtime's own kill would have ended it. The runtime runs the pod's verbs again once it is back; \
             the pod's next verb rolls back what a cut-off ADD left at the primary.",
        )
    }

    fn expired(&self) -> GuardError {
        self.broken(format!(
            "the delegate {} did not finish in time and was killed with its process group",
            self.plugin_type
        ))
        .with_details(
            "The primary hangs (see its own logs); the call is tried again at the next chance.",
        )
    }

    fn error_from(&self, reply: &[u8], status: std::process::ExitStatus) -> GuardError {
        let text = String::from_utf8_lossy(reply);
        let parsed: Option<Map<String, Value>> = serde_json::from_slice(reply).ok();
        let code = parsed
            .as_ref()
            .and_then(|e| e.get("code"))
            .and_then(Value::as_u64)
            .filter(|&c| c > 0 && c <= u64::from(u32::MAX));
        match (parsed.as_ref(), code) {
            (Some(error), Some(code)) => {
                let field = |key: &str| {
                    error
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let mut err = GuardError::new(Kind::Delegate(code as u32), field("msg"))
                    .with_details(field("details"));
                err.verbatim = Some(text.trim_end().to_string());
                err
            }
            _ => {
                let how = match status.signal() {
                    Some(signal) => format!("was killed by signal {signal}"),
                    None => format!("exited with status {}", status.code().unwrap_or(-1)),
                };
                self.broken(format!(
                    "the delegate {} {how} without a CNI error",
                    self.plugin_type
                ))
                .with_details(format!(
                    "It wrote: {:?}. Run it by hand with the same configuration to see why.",
                    names::shorten(text.trim())
                ))
            }
        }
    }

    fn broken(&self, msg: String) -> GuardError {
        GuardError::new(Kind::DelegateBroken, msg)
    }

    /// The primary's binary in `CNI_PATH`, as libcni finds it; never the guard itself.
    fn find(&self) -> Result<PathBuf> {
        let search = std::env::var("CNI_PATH").unwrap_or_default();
        let me = std::fs::metadata("/proc/self/exe")
            .ok()
            .map(|m| (m.dev(), m.ino()));
        for dir in search.split(':').filter(|d| !d.is_empty()) {
            let path = PathBuf::from(dir).join(&self.plugin_type);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            if me == Some((meta.dev(), meta.ino())) {
                return Err(GuardError::new(
                    Kind::InvalidConfig,
                    format!(
                        "\"delegate\" type {} is sandbox-guard itself",
                        self.plugin_type
                    ),
                )
                .with_details("Name the primary plugin the guard wraps, not the guard."));
            }
            return Ok(path);
        }
        Err(GuardError::new(
            Kind::InvalidConfig,
            format!(
                "the delegate plugin {:?} is not in CNI_PATH",
                self.plugin_type
            ),
        )
        .with_details(format!(
            "Searched {:?}. Install the primary plugin there, or fix \"delegate\".\"type\".",
            names::shorten(&search)
        )))
    }
}

/// Whether nobody can read the guard's answer any more: its stdout a pipe without a reader
/// (`POLLERR`) or a stream socket whose peer closed (`POLLHUP`). A file, `/dev/null`, a TCP
/// or datagram socket never says so.
fn answer_unread() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0].revents().is_some_and(reader_gone)
}

/// What poll says of the guard's stdout once nobody reads it.
fn reader_gone(revents: nix::poll::PollFlags) -> bool {
    use nix::poll::PollFlags;
    revents.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)
}

/// In the primary's process before its exec: its pid into `path`.
fn write_own_pid(path: &std::ffi::CStr) -> std::io::Result<()> {
    let mut digits = [0u8; 12];
    let mut at = digits.len();
    // SAFETY: getpid cannot fail.
    let mut pid = unsafe { nix::libc::getpid() } as u32;
    loop {
        at -= 1;
        digits[at] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let text = &digits[at..];
    let flags = nix::libc::O_WRONLY
        | nix::libc::O_CREAT
        | nix::libc::O_TRUNC
        | nix::libc::O_NOFOLLOW
        | nix::libc::O_CLOEXEC;
    // SAFETY: a valid C string and a buffer of ours; the descriptor is closed here.
    unsafe {
        let fd = nix::libc::open(path.as_ptr(), flags, 0o600);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = nix::libc::write(fd, text.as_ptr().cast(), text.len());
        nix::libc::close(fd);
        if written != text.len() as isize {
            return Err(std::io::Error::from_raw_os_error(nix::libc::EIO));
        }
    }
    Ok(())
}

/// The child's exit status, or `None` when `deadline` came first. Woken by the child's exit
/// through a pidfd, not a polling sleep that every delegated call and API ask would pay;
/// without pidfds (kernels before 5.3) it polls every 5 ms.
pub(crate) fn wait_until(
    child: &mut Child,
    deadline: Option<Instant>,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let Some(deadline) = deadline else {
        return child.wait().map(Some);
    };
    // Reaped already (a caller's try_wait): its pid may name another process by now.
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    let exited = pidfd(child);
    wait_on(child, deadline, exited)
}

/// `wait_until`'s loop, woken by `exited` (the child's pidfd) or, without one, every 5 ms.
fn wait_on(
    child: &mut Child,
    deadline: Instant,
    exited: Option<std::os::fd::OwnedFd>,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut woken = false;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Ok(None);
        };
        match &exited {
            // Readable yet not reapable (a tracer holds the exit): poll would not wait again.
            Some(_) if woken => std::thread::sleep(left.min(Duration::from_millis(5))),
            Some(fd) => {
                // Whole milliseconds, rounded up: a zero timeout would spin.
                let millis = left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
                let timeout = PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX);
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, timeout) {
                    Ok(ready) => woken = ready > 0,
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            None => std::thread::sleep(left.min(Duration::from_millis(5))),
        }
    }
}

/// A pidfd of the child, readable once it has exited; `None` where the kernel has none. The
/// caller has seen it unreaped, and only `wait_until` reaps it after, so its pid names it.
fn pidfd(child: &Child) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pid = child.id() as nix::libc::pid_t;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative return is a new fd that nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// Kills the primary's process group and reaps the primary.
fn kill_group(child: &mut Child) {
    let group = nix::unistd::Pid::from_raw(child.id() as nix::libc::pid_t);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of waiting: the child's exit seen well before the deadline, and a child that
    /// outlives it left running (`None`), without a pidfd (kernels before 5.3) as with one.
    #[test]
    fn waits_for_the_exit_or_the_deadline_with_and_without_a_pidfd() {
        for with_pidfd in [true, false] {
            let mut quick = std::process::Command::new("sleep")
                .arg("0.05")
                .spawn()
                .unwrap();
            // A kernel without pidfds waits the fallback's way both times.
            let exited = with_pidfd.then(|| pidfd(&quick)).flatten();
            let started = Instant::now();
            let status = wait_on(&mut quick, started + Duration::from_secs(10), exited).unwrap();
            assert!(status.is_some_and(|s| s.success()), "pidfd {with_pidfd}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "pidfd {with_pidfd}"
            );

            let mut slow = std::process::Command::new("sleep")
                .arg("10")
                .spawn()
                .unwrap();
            let exited = with_pidfd.then(|| pidfd(&slow)).flatten();
            let started = Instant::now();
            let status = wait_on(&mut slow, started + Duration::from_millis(100), exited).unwrap();
            assert!(status.is_none(), "pidfd {with_pidfd}: {status:?}");
            assert!(started.elapsed() >= Duration::from_millis(100));
            assert!(slow.try_wait().unwrap().is_none(), "left running");
            let _ = slow.kill();
            let _ = slow.wait();
        }
    }

    fn delegate(object: Value, runtime: Option<Value>) -> Result<Delegate> {
        let runtime = runtime.and_then(|r| r.as_object().cloned());
        Delegate::from_conf(object.as_object().unwrap().clone(), runtime.as_ref(), &[])
    }

    #[test]
    fn stdin_is_the_delegate_object_with_the_networks_name_and_version() {
        let d = delegate(serde_json::json!({"type": "calico", "ipam": {"type": "calico-ipam"}, "name": "ignored"}), None).unwrap();
        let prev = RawValue::from_string(r#"{"cniVersion":"1.0.0","x":1}"#.into()).unwrap();
        let stdin: Value =
            serde_json::from_slice(&d.stdin("k8s-pod-network", "1.0.0", Some(&prev)).unwrap())
                .unwrap();
        assert_eq!(stdin["name"], "k8s-pod-network");
        assert_eq!(stdin["cniVersion"], "1.0.0");
        assert_eq!(stdin["ipam"]["type"], "calico-ipam");
        assert_eq!(stdin["prevResult"]["x"], 1);
    }

    #[test]
    fn runtime_config_only_for_declared_capabilities() {
        let runtime = serde_json::json!({"portMappings": [1], "bandwidth": {}});
        let d = delegate(serde_json::json!({"type": "p", "capabilities": {"portMappings": true, "bandwidth": false}}), Some(runtime)).unwrap();
        let stdin: Value = serde_json::from_slice(&d.stdin("n", "1.0.0", None).unwrap()).unwrap();
        assert_eq!(
            stdin["runtimeConfig"],
            serde_json::json!({"portMappings": [1]})
        );
    }

    #[test]
    fn a_delegate_without_a_plain_type_is_refused() {
        for object in [
            serde_json::json!({}),
            serde_json::json!({"type": "../x"}),
            serde_json::json!({"type": "sandbox-guard"}),
        ] {
            assert_eq!(delegate(object, None).unwrap_err().code(), 7);
        }
    }
}
