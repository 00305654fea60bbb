//! Runs a CNI plugin binary for the operator's tools, bounded: VERSION for the doctor, a
//! primary's own `-v`. Neither changes anything on the node. A plugin that hangs, or leaves a
//! process holding its stdout, cannot hang the tool.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A plugin answers VERSION or `-v` in milliseconds.
const TIMEOUT: Duration = Duration::from_secs(5);
/// After the plugin exited, how long its stdout may stay silent before what it wrote is
/// taken: its own bytes are in the pipe by then.
const DRAIN_WAIT: Duration = Duration::from_millis(200);
/// An answer is a hundred bytes.
const MAX_ANSWER: usize = 1 << 20;

/// The first of `dirs` holding `plugin` (libcni's `FindInPath`), each path's links followed
/// by `resolve` (the host's, where the host is seen under a root).
pub fn find(plugin: &str, dirs: &[PathBuf], resolve: &dyn Fn(&Path) -> PathBuf) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| resolve(&dir.join(plugin)))
        .find(|path| path.is_file())
}

/// Runs `path` with `args`, only `env` in its environment and `stdin` on its stdin; whether
/// it exited 0, and what it wrote to stdout.
pub fn run(
    path: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<(bool, Vec<u8>), String> {
    // A group of its own: what it leaves running is killed with it on a timeout.
    let mut child = Command::new(path)
        .process_group(0)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin);
    }
    // Read while it runs, on a thread of its own: a process the plugin leaves behind may
    // keep the pipe open long after the plugin exited.
    let (sender, chunks) = std::sync::mpsc::channel::<Vec<u8>>();
    if let Some(mut out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            let mut total = 0;
            while let Ok(n @ 1..) = out.read(&mut buffer) {
                total += n;
                if sender.send(buffer[..n].to_vec()).is_err() || total > MAX_ANSWER {
                    break;
                }
            }
        });
    }
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {} s",
                    path.display(),
                    TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", path.display())),
        }
    };
    let mut reply = Vec::new();
    while let Ok(chunk) = chunks.recv_timeout(DRAIN_WAIT) {
        reply.extend(chunk);
        if reply.len() > MAX_ANSWER {
            break;
        }
    }
    Ok((status.success(), reply))
}
