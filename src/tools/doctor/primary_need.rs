//! Does the network the runtime runs need the guard? Its primary identified and judged
//! against README's table (`tools::primaries`): needed (with the mode), not needed (why, and
//! the source), or unknown (audit first). Under multus, the cluster network it delegates to.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::finding::{Finding, Report, Severity};
use crate::tools::primaries::{self, Need};

pub fn check(conf_dir: &Path, bin_dirs: &[PathBuf], report: &mut Report) {
    // The network the runtime runs: the first file libcni loads, or multus's cluster
    // network. Other files there run for no pod.
    let Some((file, network, via_multus)) = crate::tools::install::runtime_network(conf_dir) else {
        return;
    };
    let name = network["name"].as_str().unwrap_or("-").to_string();
    let through = if via_multus { " (through multus)" } else { "" };
    let verdict = primaries::judge(&network, bin_dirs, &|p: &Path| p.to_path_buf());
    let guarded = guard_mode(&network);
    let misplaced = primaries::misplaced_wrapper(&network);
    let named = verdict.mode.unwrap_or("delegate");
    let (severity, fix) = match (verdict.need, guarded) {
        (Need::Needed, Some("delegate")) if let Some((wrapped, target)) = &misplaced => (
            Severity::Warning,
            format!(
                "delegate mode wraps {wrapped} here, but {target}'s DEL is the one that acts on the pod's name, and it \
                 runs unheld: run sandbox-guard --install --mode {named}"
            ),
        ),
        (Need::Needed, Some(mode)) if Some(mode) == verdict.mode => (Severity::Ok, String::new()),
        // Chained, last, holds every plugin's DEL: it protects, at its cost.
        (Need::Needed, Some("chained")) => (
            Severity::Info,
            format!(
                "chained mode holds the DEL too, but {}; delegate mode, which this row names, does not: \
                 sandbox-guard --install --mode delegate",
                crate::tools::install::mode_cost("chained")
            ),
        ),
        (Need::Needed, Some(mode)) => (
            Severity::Warning,
            format!(
                "guarded in {mode} mode, where {named} mode is the one that holds it: {}; run sandbox-guard --install \
                 --mode {named}",
                verdict.why
            ),
        ),
        (Need::Needed, None) => (
            Severity::Warning,
            format!(
                "unguarded: run sandbox-guard --install --mode {} (audit first: --entry '{{\"staleDel\":\"audit\"}}')",
                verdict.mode.unwrap_or("delegate")
            ),
        ),
        (Need::NotNeeded, Some(mode)) => (
            Severity::Info,
            format!(
                "the guard only costs here ({mode} mode: {}); sandbox-guard --uninstall takes it out",
                crate::tools::install::mode_cost(mode)
            ),
        ),
        (Need::NotNeeded, None) => (Severity::Ok, String::new()),
        (Need::Unknown, _) => (
            Severity::Info,
            "audit first: install with --entry '{\"staleDel\":\"audit\"}' and read the log's outcome=audited lines, \
             or read what the primary's DEL keys by"
                .to_string(),
        ),
    };
    report.add(
        Finding::new(
            severity,
            "primary-need",
            format!(
                "{}: network {name}{through}: {}",
                file.display(),
                verdict.line()
            ),
        )
        .listing(verdict.evidence())
        .fix(fix)
        .verdict(verdict),
    );
}

/// The guard's mode in the network: `delegate` when it wraps the primary, `chained` when it
/// is a plugin of its own.
fn guard_mode(network: &Value) -> Option<&'static str> {
    primaries::listed(network)
        .iter()
        .find(|p| p["type"] == "sandbox-guard")
        .map(|p| match p.get("delegate") {
            Some(_) => "delegate",
            None => "chained",
        })
}
