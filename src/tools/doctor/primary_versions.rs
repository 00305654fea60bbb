//! Delegate mode: does the primary speak the network's cniVersion? The guard hands the
//! primary the network's version, so a primary that does not speak it fails every ADD of
//! the network. Asked as libcni asks it (`invoke.GetVersionInfo`, what CRI-O's
//! `ValidateNetworkList` runs): VERSION with fake attachment values and libcni's own version
//! on stdin. VERSION changes nothing, so running it keeps the doctor read-only.

use std::path::PathBuf;

use super::conflists::GuardEntry;
use super::finding::{Finding, Report, Severity};
use crate::tools::plugin_exec;

/// The version libcni 1.1+ sends on stdin with VERSION.
const LIBCNI_CURRENT: &str = "1.1.0";

/// `bin_dirs`: where the runtime looks for plugins (`super::bin_dirs`).
pub fn check(guards: &[GuardEntry], bin_dirs: &[PathBuf], report: &mut Report) {
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
        match supported_versions(primary, bin_dirs) {
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
                    .fix("run the doctor with --bin-dir set to the runtime's plugin dir (containerd: cni.bin_dir), or install the primary there"),
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

/// The primary's `supportedVersions`, as libcni reads its VERSION answer (with fake
/// attachment values and libcni's own version on stdin).
fn supported_versions(plugin_type: &str, dirs: &[PathBuf]) -> Result<Vec<String>, Unanswered> {
    let path = plugin_exec::find(plugin_type, dirs, &|p| p.to_path_buf()).ok_or_else(|| {
        let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        Unanswered::NotFound(format!("it is not in {}", shown.join(":")))
    })?;
    let (exited_ok, reply) = plugin_exec::run(
        &path,
        &[],
        &[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_PATH", "dummy"),
        ],
        format!(r#"{{"cniVersion":"{LIBCNI_CURRENT}"}}"#).as_bytes(),
    )
    .map_err(|e| Unanswered::Failed(e.replace("did not answer", "did not answer VERSION")))?;
    crate::cni::version::read_plugin_versions(exited_ok, &reply)
        .map_err(|why| Unanswered::Failed(format!("{} VERSION {why}", path.display())))
}
