//! The `CNI_*` environment a runtime hands to the plugin, validated before any of it is
//! used in a path.

use crate::error::{GuardError, Kind, Result};
use crate::names::{self, MAX_CONTAINER_ID, MAX_POD_FIELD};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Add => "ADD",
            Verb::Del => "DEL",
            Verb::Check => "CHECK",
            Verb::Gc => "GC",
            Verb::Status => "STATUS",
            Verb::Version => "VERSION",
        }
    }
}

/// The Kubernetes identity containerd puts in `CNI_ARGS`
/// (`IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodArgs {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    pub infra_container_id: Option<String>,
}

impl PodArgs {
    /// `namespace/name` for log lines, when the runtime gave both.
    pub fn label(&self) -> Option<String> {
        Some(crate::names::pod_text(
            Some(self.namespace.as_deref()?),
            Some(self.name.as_deref()?),
        ))
    }
}

/// The attachment an ADD, DEL or CHECK is about.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
    /// Empty on containerd's second DEL (RemovePodSandbox), which is legal.
    pub netns: String,
    pub pod: PodArgs,
    /// `CNI_ARGS` as the runtime sent them: a deferred DEL replays them unchanged.
    pub args: String,
}

#[derive(Debug)]
pub struct CniEnv {
    pub verb: Verb,
    /// Present for ADD, DEL and CHECK.
    pub attachment: Option<Attachment>,
}

impl CniEnv {
    pub fn from_process() -> Result<CniEnv> {
        CniEnv::from_lookup(|key| std::env::var(key).ok())
    }

    /// Reads through `lookup` so that tests can feed an environment without touching the
    /// process's own.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CniEnv> {
        let command = lookup("CNI_COMMAND").unwrap_or_default();
        let verb = match command.as_str() {
            "ADD" => Verb::Add,
            "DEL" => Verb::Del,
            "CHECK" => Verb::Check,
            "GC" => Verb::Gc,
            "STATUS" => Verb::Status,
            "VERSION" => Verb::Version,
            "" => {
                return Err(env_error(
                    "CNI_COMMAND is not set: this is a CNI plugin; \
                 run it from a container runtime, or see `sandbox-guard --help` for the operator commands",
                ));
            }
            other => {
                return Err(env_error(format!(
                    "CNI_COMMAND {:?} is unknown: expected ADD, DEL, CHECK, GC, STATUS or VERSION",
                    names::shorten(other)
                )));
            }
        };
        if verb == Verb::Version {
            return Ok(CniEnv {
                verb,
                attachment: None,
            });
        }
        // The spec makes CNI_PATH mandatory for every verb but VERSION; a runtime that
        // omits it is misconfigured in a way the operator should hear about.
        require(&lookup, "CNI_PATH")?;
        let attachment = match verb {
            Verb::Add | Verb::Del | Verb::Check => Some(read_attachment(&lookup, verb)?),
            _ => None,
        };
        Ok(CniEnv { verb, attachment })
    }
}

fn read_attachment(lookup: &impl Fn(&str) -> Option<String>, verb: Verb) -> Result<Attachment> {
    let container_id = require(lookup, "CNI_CONTAINERID")?;
    names::check_plain(
        "CNI_CONTAINERID",
        &container_id,
        MAX_CONTAINER_ID,
        Kind::InvalidEnvironment,
    )?;
    let ifname = require(lookup, "CNI_IFNAME")?;
    names::check_ifname(&ifname)?;
    let netns = match verb {
        Verb::Del => lookup("CNI_NETNS").unwrap_or_default(),
        _ => require(lookup, "CNI_NETNS")?,
    };
    if !netns.is_empty() && !netns.starts_with('/') {
        return Err(env_error(format!(
            "CNI_NETNS {:?} is not an absolute path to a network namespace",
            names::shorten(&netns)
        )));
    }
    let args = lookup("CNI_ARGS").unwrap_or_default();
    let pod = parse_cni_args(&args)?;
    Ok(Attachment {
        container_id,
        ifname,
        netns,
        pod,
        args,
    })
}

fn require(lookup: &impl Fn(&str) -> Option<String>, key: &str) -> Result<String> {
    match lookup(key) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(env_error(format!(
            "required environment variable {key} is missing or empty"
        ))),
    }
}

fn env_error(msg: impl Into<String>) -> GuardError {
    GuardError::new(Kind::InvalidEnvironment, msg)
}

/// Parses `K=V;K=V`. Keys other than the `K8S_POD_*` ones are ignored: runtimes add their
/// own (IgnoreUnknown, MAC, IP, ...) and the guard has no use for them.
pub fn parse_cni_args(raw: &str) -> Result<PodArgs> {
    let mut pod = PodArgs::default();
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(env_error(format!(
                "CNI_ARGS entry {:?} is not KEY=VALUE",
                names::shorten(pair)
            )));
        };
        let slot = match key {
            "K8S_POD_NAMESPACE" => &mut pod.namespace,
            "K8S_POD_NAME" => &mut pod.name,
            "K8S_POD_UID" => &mut pod.uid,
            "K8S_POD_INFRA_CONTAINER_ID" => &mut pod.infra_container_id,
            _ => continue,
        };
        if value.is_empty() {
            continue;
        }
        names::check_plain(
            &format!("CNI_ARGS {key}"),
            value,
            MAX_POD_FIELD,
            Kind::InvalidEnvironment,
        )?;
        *slot = Some(value.to_string());
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::from_lookup(|k| map.get(k).cloned())
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=lijiaob;K8S_POD_NAME=etcd1-0;K8S_POD_UID=u-1",
        ),
    ];

    #[test]
    fn reads_containerd_args() {
        let env = env(ADD).unwrap();
        let pod = env.attachment.unwrap().pod;
        assert_eq!(pod.namespace.as_deref(), Some("lijiaob"));
        assert_eq!(pod.name.as_deref(), Some("etcd1-0"));
        assert_eq!(pod.uid.as_deref(), Some("u-1"));
        assert_eq!(pod.infra_container_id, None);
    }

    #[test]
    fn del_may_lack_netns() {
        let pairs: Vec<_> = ADD
            .iter()
            .map(|&(k, v)| {
                if k == "CNI_COMMAND" {
                    (k, "DEL")
                } else {
                    (k, v)
                }
            })
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect();
        assert_eq!(env(&pairs).unwrap().attachment.unwrap().netns, "");
    }

    #[test]
    fn missing_and_hostile_values_are_env_errors() {
        for (key, value) in [
            ("CNI_CONTAINERID", "../../etc"),
            ("CNI_IFNAME", "a/b"),
            ("CNI_NETNS", "relative"),
            ("CNI_ARGS", "K8S_POD_NAME=../x"),
            ("CNI_ARGS", "garbage"),
            ("CNI_COMMAND", "FROB"),
            ("CNI_PATH", ""),
        ] {
            let pairs: Vec<_> = ADD
                .iter()
                .map(|&(k, v)| if k == key { (k, value) } else { (k, v) })
                .collect();
            let err = env(&pairs).unwrap_err();
            assert_eq!(err.kind, Kind::InvalidEnvironment, "{key}={value}");
        }
    }
}
