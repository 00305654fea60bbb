//! What the node's CNI configuration asks for: the lower links of macvlan and ipvlan
//! attachments, and where each sandbox-guard entry keeps its state and log.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::finding::{Finding, Report, Severity};
use crate::cni::config::DEFAULT_STATE_DIR;

/// A macvlan or ipvlan attachment and the host link it is created on.
#[derive(Debug, Clone)]
pub struct LowerLink {
    pub plugin: String,
    pub network: String,
    /// `None`: the plugin falls back to the interface of the default route.
    pub master: Option<String>,
    pub file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct GuardEntry {
    pub network: String,
    pub state_dir: PathBuf,
    pub log_file: Option<PathBuf>,
    /// The network's `cniVersion`, a missing one read as libcni reads it (0.1.0).
    pub cni_version: String,
    /// Delegate mode: the `type` of the primary the guard wraps.
    pub delegate_type: Option<String>,
    /// The kubeconfig the entry asks the API server with (`kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    pub file: PathBuf,
}

#[derive(Debug, Default)]
pub struct NodeConfig {
    pub lower_links: Vec<LowerLink>,
    pub guards: Vec<GuardEntry>,
}

/// The extensions libcni loads from a conf dir.
const EXTENSIONS: [&str; 3] = ["conflist", "conf", "json"];

pub fn read(conf_dir: &Path, report: &mut Report) -> NodeConfig {
    let mut node = NodeConfig::default();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(conf_dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| EXTENSIONS.contains(&e))
            })
            .collect(),
        Err(e) => {
            report.add(
                Finding::new(
                    Severity::Warning,
                    "cni-config",
                    format!("cannot read the CNI config dir {}: {e}", conf_dir.display()),
                )
                .fix(
                    "pass --conf-dir with the runtime's CNI config dir (containerd: cni.conf_dir)",
                ),
            );
            return node;
        }
    };
    files.sort();
    // Each problem with the fix that is true for it.
    let mut problems: Vec<(String, &'static str)> = Vec::new();
    for file in &files {
        let parsed = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string()));
        match parsed {
            Ok(conf) => read_conf(file, &conf, &mut node, &mut problems),
            Err(e) => problems.push((
                format!("{} is not valid JSON ({e}): the runtime skips it or fails on it", file.display()),
                "fix the JSON (`jq . FILE` shows where it breaks), or move the file out of the conf dir",
            )),
        }
    }
    // A guard only counts where the runtime runs it, at a version it speaks.
    if !node.guards.is_empty() {
        problems.extend(crate::tools::install::runtime_problem(conf_dir));
    }
    if node.guards.is_empty() {
        report.add(
            Finding::new(
                Severity::Warning,
                "cni-config",
                format!(
                    "no conflist in {} lists sandbox-guard: no pod is guarded",
                    conf_dir.display()
                ),
            )
            .fix(NOT_INSTALLED_FIX),
        );
    }
    if problems.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "cni-config",
            format!(
                "{} CNI config files read from {}, {} networks guarded",
                files.len(),
                conf_dir.display(),
                node.guards.len()
            ),
        ));
    }
    for (problem, fix) in problems {
        report.add(Finding::new(Severity::Error, "cni-config", problem).fix(fix));
    }
    node
}

/// The installer puts the entry where each mode needs it; the mode follows the primary.
const NOT_INSTALLED_FIX: &str = "where the primary-need finding says needed, run `sandbox-guard --install` with \
     the mode it names; on a cluster, apply the DaemonSet";
const NOT_LAST_FIX: &str = "run `sandbox-guard --install --mode chained`, which moves the entry to the end of \
     \"plugins\" so that it runs first on DEL, or `--install --mode delegate` to wrap the primary in its place";

fn read_conf(
    file: &Path,
    conf: &Value,
    node: &mut NodeConfig,
    problems: &mut Vec<(String, &'static str)>,
) {
    let network = conf["name"].as_str().unwrap_or("-").to_string();
    let cni_version = match conf.get("cniVersion") {
        None | Some(Value::Null) => crate::cni::version::UNVERSIONED.to_string(),
        Some(Value::String(version)) if version.is_empty() => {
            crate::cni::version::UNVERSIONED.to_string()
        }
        Some(Value::String(version)) => version.clone(),
        Some(other) => other.to_string(),
    };
    // A .conflist has "plugins"; a .conf is one plugin.
    let plugins: Vec<&Value> = match conf["plugins"].as_array() {
        Some(plugins) => plugins.iter().collect(),
        None => vec![conf],
    };
    for (position, plugin) in plugins.iter().enumerate() {
        if plugin["type"] == "sandbox-guard" {
            // Wrapping its primary ("delegate"), the guard decides before the primary sees a
            // verb wherever it stands; chained, only the last plugin runs first on DEL.
            let wraps = plugin.get("delegate").is_some();
            if !wraps && position + 1 != plugins.len() {
                problems.push((
                    format!(
                        "{}: sandbox-guard is plugin {} of {} in network {network}; it must be LAST, because \
                         only the last plugin runs first on DEL, where refusing a stale DEL keeps it from the \
                         primary plugin",
                        file.display(),
                        position + 1,
                        plugins.len()
                    ),
                    NOT_LAST_FIX,
                ));
            }
            if !crate::cni::version::SUPPORTED.contains(&cni_version.as_str()) {
                problems.push((
                    format!(
                        "{}: network {network} has cniVersion {:?}, which sandbox-guard does not speak (it speaks {}): \
                         it answers every ADD and DEL of this network with an error",
                        file.display(),
                        crate::names::shorten(&cni_version),
                        crate::cni::version::SUPPORTED.join(", ")
                    ),
                    "set the network's \"cniVersion\" to one both sandbox-guard and the primary speak",
                ));
            }
            node.guards.push(GuardEntry {
                network: network.clone(),
                state_dir: plugin["stateDir"]
                    .as_str()
                    .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), PathBuf::from),
                log_file: plugin["logFile"].as_str().map(PathBuf::from),
                cni_version: cni_version.clone(),
                delegate_type: plugin["delegate"]["type"].as_str().map(String::from),
                kubeconfig: plugin["kubeconfig"].as_str().map(PathBuf::from),
                file: file.to_path_buf(),
            });
        }
    }
    // Anywhere in the file: multus and other meta plugins nest their delegates.
    collect_lower_links(conf, &network, file, node);
}

fn collect_lower_links(value: &Value, network: &str, file: &Path, node: &mut NodeConfig) {
    match value {
        Value::Object(map) => {
            if let Some(plugin @ ("macvlan" | "ipvlan")) = map.get("type").and_then(Value::as_str) {
                node.lower_links.push(LowerLink {
                    plugin: plugin.to_string(),
                    network: map
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or(network)
                        .to_string(),
                    master: map
                        .get("master")
                        .and_then(Value::as_str)
                        .filter(|m| !m.is_empty())
                        .map(String::from),
                    file: file.to_path_buf(),
                });
            }
            map.values()
                .for_each(|v| collect_lower_links(v, network, file, node));
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| collect_lower_links(v, network, file, node)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_masters_in_nested_delegates_and_the_guard_position() {
        let conf: Value = serde_json::from_str(
            r#"{"name":"multus","plugins":[
                 {"type":"multus","delegates":[{"type":"macvlan","master":"bond1"},{"type":"ipvlan"}]},
                 {"type":"sandbox-guard","stateDir":"/x","logFile":"/x.log"},
                 {"type":"tuning"}]}"#,
        )
        .unwrap();
        let mut node = NodeConfig::default();
        // Each problem with the fix that is true for it.
        let mut problems: Vec<(String, &'static str)> = Vec::new();
        read_conf(
            Path::new("/etc/cni/net.d/10-multus.conflist"),
            &conf,
            &mut node,
            &mut problems,
        );
        let masters: Vec<_> = node
            .lower_links
            .iter()
            .map(|l| (l.plugin.as_str(), l.master.as_deref()))
            .collect();
        assert_eq!(masters, [("macvlan", Some("bond1")), ("ipvlan", None)]);
        assert_eq!(node.guards[0].state_dir, PathBuf::from("/x"));
        assert!(problems[0].0.contains("must be LAST"), "{problems:?}");
        assert!(
            problems[0].1.contains("--install --mode chained"),
            "the installer is the way: {problems:?}"
        );

        let wrapping: Value = serde_json::from_str(
            r#"{"name":"k8s","plugins":[{"type":"sandbox-guard","delegate":{"type":"calico"}},{"type":"portmap"}]}"#,
        )
        .unwrap();
        let mut problems = Vec::new();
        read_conf(
            Path::new("/etc/cni/net.d/10-calico.conflist"),
            &wrapping,
            &mut NodeConfig::default(),
            &mut problems,
        );
        assert!(
            problems.is_empty(),
            "a guard that wraps its primary may stand first: {problems:?}"
        );
    }

    #[test]
    fn names_a_network_whose_version_the_guard_does_not_speak() {
        for (text, bad) in [
            (
                r#"{"name":"n","cniVersion":"0.1.0","plugins":[{"type":"calico"},{"type":"sandbox-guard"}]}"#,
                false,
            ),
            (
                r#"{"name":"n","plugins":[{"type":"calico"},{"type":"sandbox-guard"}]}"#,
                false,
            ),
            (
                r#"{"name":"n","cniVersion":"1.1.0","plugins":[{"type":"sandbox-guard","delegate":{"type":"calico"}}]}"#,
                false,
            ),
            (
                r#"{"name":"n","cniVersion":"1.2.0","plugins":[{"type":"calico"},{"type":"sandbox-guard"}]}"#,
                true,
            ),
            (
                r#"{"name":"n","cniVersion":"0.2.1","plugins":[{"type":"sandbox-guard","delegate":{"type":"calico"}}]}"#,
                true,
            ),
            (
                r#"{"name":"n","cniVersion":1,"plugins":[{"type":"calico"},{"type":"sandbox-guard"}]}"#,
                true,
            ),
        ] {
            let conf: Value = serde_json::from_str(text).unwrap();
            let mut node = NodeConfig::default();
            let mut problems = Vec::new();
            read_conf(
                Path::new("/etc/cni/net.d/10-n.conflist"),
                &conf,
                &mut node,
                &mut problems,
            );
            assert_eq!(!problems.is_empty(), bad, "{text}: {problems:?}");
            if bad {
                assert!(
                    problems[0].0.contains("which sandbox-guard does not speak"),
                    "{problems:?}"
                );
            }
        }
        let conf: Value = serde_json::from_str(
            r#"{"name":"n","plugins":[{"type":"sandbox-guard","delegate":{"type":"calico"}}]}"#,
        )
        .unwrap();
        let mut node = NodeConfig::default();
        read_conf(Path::new("/x.conflist"), &conf, &mut node, &mut Vec::new());
        assert_eq!(node.guards[0].cni_version, "0.1.0");
        assert_eq!(node.guards[0].delegate_type.as_deref(), Some("calico"));
    }
}
