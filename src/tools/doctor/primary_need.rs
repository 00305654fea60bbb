//! Does each network need the guard? Its primary identified and judged against README's
//! table (`tools::primaries`): needed (with the mode), not needed (why, and the source), or
//! unknown (audit first). Multus's network is judged by the cluster network it delegates to.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::finding::{Finding, Report, Severity};
use crate::tools::primaries::{self, Need};

pub fn check(conf_dir: &Path, bin_dirs: &[PathBuf], report: &mut Report) {
    let runtime_runs = crate::tools::install::runtime_network(conf_dir);
    for file in crate::tools::install::network_files(conf_dir) {
        let Some(mut network) = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        else {
            continue;
        };
        let name = network["name"].as_str().unwrap_or("-").to_string();
        let mut through = String::new();
        if let Some((cluster_file, cluster, true)) = &runtime_runs
            && is_multus(&network)
        {
            through = format!(
                " through multus, its cluster network in {}",
                cluster_file.display()
            );
            network = cluster.clone();
        }
        let verdict = primaries::judge(&network, bin_dirs);
        let guarded = guard_mode(&network);
        let (severity, fix) = match (verdict.need, guarded) {
            (Need::Needed, Some(mode)) if Some(mode) == verdict.mode => (Severity::Ok, String::new()),
            (Need::Needed, Some(mode)) => (
                Severity::Info,
                format!(
                    "guarded in {mode} mode; the table says {}: run sandbox-guard --install --mode {}",
                    verdict.mode.unwrap_or("delegate"),
                    verdict.mode.unwrap_or("delegate")
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
            .listing(verdict.read.clone())
            .fix(fix)
            .verdict(verdict),
        );
    }
}

fn is_multus(network: &Value) -> bool {
    let first = network
        .get("plugins")
        .and_then(|p| p.get(0))
        .unwrap_or(network);
    matches!(first["type"].as_str(), Some("multus" | "multus-shim"))
}

/// The guard's mode in the network: `delegate` when it wraps the primary, `chained` when it
/// is a plugin of its own.
fn guard_mode(network: &Value) -> Option<&'static str> {
    let plugins: Vec<&Value> = match network.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![network],
    };
    plugins
        .iter()
        .find(|p| p["type"] == "sandbox-guard")
        .map(|p| match p.get("delegate") {
            Some(_) => "delegate",
            None => "chained",
        })
}
