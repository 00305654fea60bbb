//! Delegate mode: does the primary speak the network's cniVersion? The guard hands the
//! primary the network's version, so a primary that does not speak it fails every ADD of
//! the network. Asked as libcni asks it (`invoke.GetVersionInfo`, what CRI-O's
//! `ValidateNetworkList` runs): VERSION with fake attachment values and libcni's own version
//! on stdin. VERSION changes nothing, so running it keeps the doctor read-only.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::conflists::GuardEntry;
use super::finding::{Finding, Report, Severity};

/// A primary answers VERSION in milliseconds; one that hangs must not hang the doctor.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// After the primary exited, how long its stdout may stay silent before the doctor takes what
/// it has: the primary's own bytes are in the pipe by then.
const DRAIN_WAIT: Duration = Duration::from_millis(200);
/// A VERSION answer is a hundred bytes.
const MAX_ANSWER: usize = 1 << 20;
/// Where containerd looks for plugins when CNI_PATH is not set.
const DEFAULT_CNI_PATH: &str = "/opt/cni/bin";
/// The version libcni 1.1+ sends on stdin with VERSION.
const LIBCNI_CURRENT: &str = "1.1.0";

pub fn check(guards: &[GuardEntry], report: &mut Report) {
    let search = std::env::var("CNI_PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_CNI_PATH.to_string());
    for guard in guards {
        let Some(primary) = &guard.delegate_type else {
            continue;
        };
        if !crate::cni::version::SUPPORTED.contains(&guard.cni_version.as_str()) {
            // Named already: the guard itself refuses the network.
            continue;
        }
        let where_ = format!("{}: network {}", guard.file.display(), guard.network);
        if let Err(err) = crate::names::check_plain(
            "delegate type",
            primary,
            255,
            crate::error::Kind::InvalidConfig,
        ) {
            // The guard refuses it (so does libcni's FindInPath): nothing to ask, and a path
            // here is no plugin the doctor may run.
            report.add(
                Finding::new(
                    Severity::Error,
                    "primary-version",
                    format!("{where_}: {}: the guard refuses every verb of it", err.msg),
                )
                .fix(err.details),
            );
            continue;
        }
        match supported_versions(primary, &search) {
            Ok(versions) if versions.contains(&guard.cni_version) => report.add(Finding::new(
                Severity::Ok,
                "primary-version",
                format!("{where_}: the primary {primary} speaks the network's cniVersion {}", guard.cni_version),
            )),
            Ok(versions) => report.add(
                Finding::new(
                    Severity::Error,
                    "primary-version",
                    format!(
                        "{where_}: the primary {primary} does not speak the network's cniVersion {}: every ADD of it fails",
                        guard.cni_version
                    ),
                )
                .evidence(format!("{primary} VERSION lists {}", versions.join(", ")))
                .fix(format!(
                    "set the network's \"cniVersion\" to one the primary lists (sandbox-guard speaks {}), or upgrade the primary",
                    crate::cni::version::SUPPORTED.join(", ")
                )),
            ),
            Err(Unanswered::NotFound(why)) => report.add(
                Finding::new(Severity::Warning, "primary-version", format!("{where_}: cannot ask the primary {primary} which versions it speaks: {why}"))
                    .fix("run the doctor with CNI_PATH set to the runtime's plugin dirs (containerd: cni.bin_dir), or install the primary there"),
            ),
            Err(Unanswered::Failed(why)) => report.add(
                Finding::new(Severity::Warning, "primary-version", format!("{where_}: the primary {primary} gives no usable VERSION answer: {why}"))
                    .fix("a runtime that validates networks with VERSION (CRI-O) fails this one the same way: run the primary's VERSION by hand and fix or upgrade it"),
            ),
        }
    }
}

/// Why the primary's versions are not known.
enum Unanswered {
    /// No such plugin in the search path.
    NotFound(String),
    /// Found, but its VERSION failed, hung or wrote no answer libcni reads.
    Failed(String),
}

/// The primary's `supportedVersions`, as libcni reads its VERSION answer.
fn supported_versions(plugin_type: &str, search: &str) -> Result<Vec<String>, Unanswered> {
    let path = search
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|dir| PathBuf::from(dir).join(plugin_type))
        .find(|path| path.is_file())
        .ok_or_else(|| Unanswered::NotFound(format!("it is not in {search}")))?;
    answer(&path).map_err(Unanswered::Failed)
}

fn answer(path: &std::path::Path) -> Result<Vec<String>, String> {
    let mut child = Command::new(path)
        .env_clear()
        .envs([
            ("CNI_COMMAND", "VERSION"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_PATH", "dummy"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!(r#"{{"cniVersion":"{LIBCNI_CURRENT}"}}"#).as_bytes());
    }
    // Read while it runs, on a thread of its own: a process the primary leaves behind may
    // keep the pipe open long after the primary exited, and waiting for its end would hang
    // the doctor past the bound.
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
    let deadline = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer VERSION within {} s",
                    path.display(),
                    VERSION_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", path.display())),
        }
    };
    // Exited, it has written all it will: what is still to come is in the pipe already.
    let mut reply = Vec::new();
    while let Ok(chunk) = chunks.recv_timeout(DRAIN_WAIT) {
        reply.extend(chunk);
        if reply.len() > MAX_ANSWER {
            break;
        }
    }
    crate::cni::version::read_plugin_versions(status.success(), &reply)
        .map_err(|why| format!("{} VERSION {why}", path.display()))
}
