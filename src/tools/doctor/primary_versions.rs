//! Delegate mode: does the primary speak the network's cniVersion? The guard hands the
//! primary the network's version, so a primary that does not speak it fails every ADD of
//! the network. Asked as libcni asks it (`invoke.GetVersionInfo`, what CRI-O's
//! `ValidateNetworkList` runs): VERSION with fake attachment values and libcni's own version
//! on stdin. VERSION changes nothing, so running it keeps the doctor read-only.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::conflists::GuardEntry;
use super::finding::{Finding, Report, Severity};

/// A primary answers VERSION in milliseconds; one that hangs must not hang the doctor.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// Where containerd looks for plugins when CNI_PATH is not set.
const DEFAULT_CNI_PATH: &str = "/opt/cni/bin";
/// The version libcni 1.1+ sends on stdin with VERSION.
const LIBCNI_CURRENT: &str = "1.1.0";

pub fn check(guards: &[GuardEntry], report: &mut Report) {
    let search = std::env::var("CNI_PATH").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| DEFAULT_CNI_PATH.to_string());
    for guard in guards {
        let Some(primary) = &guard.delegate_type else { continue };
        if !crate::cni::version::SUPPORTED.contains(&guard.cni_version.as_str()) {
            // Named already: the guard itself refuses the network.
            continue;
        }
        let where_ = format!("{}: network {}", guard.file.display(), guard.network);
        match supported_versions(primary, &search) {
            Ok(versions) if versions.iter().any(|v| *v == guard.cni_version) => report.add(Finding::new(
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
            Err(why) => report.add(
                Finding::new(Severity::Warning, "primary-version", format!("{where_}: cannot ask the primary {primary} which versions it speaks: {why}"))
                    .fix("run the doctor with CNI_PATH set to the runtime's plugin dirs (containerd: cni.bin_dir), or install the primary there"),
            ),
        }
    }
}

/// The primary's `supportedVersions`, as libcni reads its VERSION answer.
fn supported_versions(plugin_type: &str, search: &str) -> Result<Vec<String>, String> {
    let path = search
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|dir| PathBuf::from(dir).join(plugin_type))
        .find(|path| path.is_file())
        .ok_or_else(|| format!("it is not in {search}"))?;
    let mut child = Command::new(&path)
        .env_clear()
        .envs([("CNI_COMMAND", "VERSION"), ("CNI_NETNS", "dummy"), ("CNI_IFNAME", "dummy"), ("CNI_PATH", "dummy")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!(r#"{{"cniVersion":"{LIBCNI_CURRENT}"}}"#).as_bytes());
    }
    let deadline = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} did not answer VERSION within {} s", path.display(), VERSION_TIMEOUT.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", path.display())),
        }
    };
    let mut reply = Vec::new();
    if let Some(out) = child.stdout.take() {
        let _ = out.take(1 << 20).read_to_end(&mut reply);
    }
    let answer: Option<Value> = serde_json::from_slice(&reply).ok();
    if !status.success() {
        // Plugins older than VERSION answer it as an unknown command: libcni takes them for 0.1.0 ones.
        if answer.as_ref().and_then(|a| a["msg"].as_str()) == Some("unknown CNI_COMMAND: VERSION") {
            return Ok(vec!["0.1.0".to_string()]);
        }
        return Err(format!("{} VERSION failed: {}", path.display(), crate::names::shorten(String::from_utf8_lossy(&reply).trim())));
    }
    let answer = answer.ok_or_else(|| format!("{} VERSION wrote no JSON", path.display()))?;
    let listed: Vec<String> =
        answer["supportedVersions"].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect();
    match (listed.is_empty(), answer["cniVersion"].as_str()) {
        (false, _) => Ok(listed),
        // libcni's PluginDecoder: a 0.2.0 answer without the list speaks 0.1.0 and 0.2.0.
        (true, Some("0.2.0")) => Ok(vec!["0.1.0".to_string(), "0.2.0".to_string()]),
        _ => Err(format!("{} VERSION has no supportedVersions", path.display())),
    }
}
