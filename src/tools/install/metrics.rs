//! The installer's own textfile for node_exporter (`--metrics-file`): whether the guard is
//! installed where the runtime runs it, how often the watch put it back, and every failure
//! by reason. Its own file, beside the plugin's `metricsFile` in the collector's directory:
//! the plugin renders its file whole from the store, which the installer's pod does not
//! mount. Written through a temp file renamed into place, so the collector never reads half.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::Reason;
use super::files::{Keep, write_atomic};

#[derive(Debug, Default)]
pub struct InstallMetrics {
    pub installed: bool,
    pub fight: bool,
    pub reinserts: u64,
    /// Times the guard was taken out of a network it could not run in.
    pub stood_aside: u64,
    pub failures: BTreeMap<Reason, u64>,
    /// Whether the network's primary needs the guard, per README's table, at the last look.
    pub need: Option<crate::tools::primaries::Need>,
    /// With `--api-credentials`: whether the plugin's kubeconfig was written at the last look.
    pub api_credentials: Option<bool>,
}

impl InstallMetrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        family(
            "sandbox_guard_install_installed",
            "gauge",
            "1 when sandbox-guard is in the network the runtime loads, can run there, and its binary is where the runtime looks.",
            &[(String::new(), u64::from(self.installed))],
        );
        family(
            "sandbox_guard_install_fight",
            "gauge",
            "1 while another writer reverts each insert of the entry.",
            &[(String::new(), u64::from(self.fight))],
        );
        family(
            "sandbox_guard_install_reinserts_total",
            "counter",
            "Times the watch put the entry back after the primary rewrote its file.",
            &[(String::new(), self.reinserts)],
        );
        family(
            "sandbox_guard_install_stood_aside_total",
            "counter",
            "Times the watch took sandbox-guard out of a network it could not run in (pods there start unguarded).",
            &[(String::new(), self.stood_aside)],
        );
        use crate::tools::primaries::Need;
        let needs: Vec<(String, u64)> = [Need::Needed, Need::NotNeeded, Need::Unknown]
            .into_iter()
            .map(|need| {
                (
                    format!("{{need=\"{}\"}}", need.name().replace(' ', "-")),
                    u64::from(self.need == Some(need)),
                )
            })
            .collect();
        family(
            "sandbox_guard_install_primary_need",
            "gauge",
            "1 on whether the network's primary needs sandbox-guard at the last install, per the table in README; all 0 before one.",
            &needs,
        );
        if let Some(written) = self.api_credentials {
            family(
                "sandbox_guard_install_api_credentials",
                "gauge",
                "With --api-credentials: 1 when the plugin's kubeconfig holds the ServiceAccount's current token, 0 when it cannot be written (the plugin then decides by its local rule alone).",
                &[(String::new(), u64::from(written))],
            );
        }
        let failures: Vec<(String, u64)> = self
            .failures
            .iter()
            .map(|(reason, n)| (format!("{{reason=\"{}\"}}", reason.name()), *n))
            .collect();
        family(
            "sandbox_guard_install_failures_total",
            "counter",
            "Installs that did not happen, by reason.",
            &failures,
        );
        out
    }

    pub fn write(&self, file: &Path) {
        if let Err(e) = write_atomic(file, self.render().as_bytes(), Keep::mode(0o644)) {
            eprintln!(
                "sandbox-guard: cannot write --metrics-file {}: {e}",
                file.display()
            );
        }
    }
}
