//! Stale DELs happen silently from the runtime's side: the guard refuses them (or lets them
//! through in audit mode) and the runtime just retries. The plugin's log file already has one
//! line per refusal, written under the store lock, so the doctor counts them there instead of
//! the DEL writing yet another file on a path kubelet retries every few seconds. It reads the
//! line's fields (`cause=stale-del owner=..`), never its text.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use super::finding::{Finding, Report, Severity};
use super::sandboxes::Owners;
use crate::cni::log::{CAUSE_STALE_DEL, LogEntry};
use crate::state::ownership::PodKey;

#[derive(Debug, Default)]
struct PodStaleDels {
    refused: usize,
    audited: usize,
    deferred: usize,
    first: String,
    last: String,
    stale_sandboxes: BTreeSet<String>,
    /// The owner the latest refusal protected.
    protected: Option<String>,
}

/// One stale DEL, from the fields of its log line (`cni::log::LogEntry`).
#[derive(Debug, PartialEq)]
struct StaleDelLine {
    time: String,
    key: PodKey,
    container: String,
    handled: Handled,
    owner: Option<String>,
}

/// What the guard did with a stale DEL.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Handled {
    Refused,
    Audited,
    /// Delegate mode: answered with success, kept from the primary until the pod is free.
    Deferred,
}

fn parse_line(line: &str) -> Option<StaleDelLine> {
    let entry = LogEntry::parse(line)?;
    if entry.verb != "DEL" {
        return None;
    }
    let owner = match entry.field("cause") {
        Some(CAUSE_STALE_DEL) => entry.field("owner").map(String::from),
        Some(_) => return None,
        None => legacy_stale_del(line)?,
    };
    let handled = match entry.field("outcome")? {
        "audited" => Handled::Audited,
        "refused" => Handled::Refused,
        "deferred" => Handled::Deferred,
        _ => return None,
    };
    let (namespace, name) = entry.field("pod")?.split_once('/')?;
    Some(StaleDelLine {
        time: entry.time.to_string(),
        key: PodKey {
            network: entry.field("network")?.to_string(),
            pod_namespace: namespace.to_string(),
            pod_name: name.to_string(),
            if_name: entry.field("ifname")?.to_string(),
        },
        container: entry.field("container")?.to_string(),
        handled,
        owner,
    })
}

/// Lines written before `cause=` existed, still in a node's log after an upgrade: a refusal
/// whose text starts with "stale DEL", its owner in `owner=` or after "; sandbox ". Frozen:
/// today's lines never come here, so their wording is free to change.
fn legacy_stale_del(line: &str) -> Option<Option<String>> {
    let (_, after) = line.split_once(" outcome=")?;
    let (outcome, text) = after.split_once(' ')?;
    let (owner, text) = match text.split_once(' ') {
        Some((word, rest)) if word.starts_with("owner=") => (Some(word["owner=".len()..].to_string()), rest),
        _ => (text.split_once("; sandbox ").and_then(|(_, rest)| rest.split(' ').next()).map(String::from), text),
    };
    (outcome == "audited" || text.starts_with("stale DEL")).then_some(owner)
}

pub fn check(log_files: &[(String, Option<std::path::PathBuf>)], owners: &Owners, report: &mut Report) {
    for (network, log_file) in log_files {
        match log_file {
            None => report.add(
                Finding::new(Severity::Info, "stale-dels", format!("network {network}: stale DELs cannot be counted: its sandbox-guard entry has no logFile"))
                    .fix("add \"logFile\": \"/var/log/sandbox-guard.log\" to the sandbox-guard entry"),
            ),
            Some(path) => check_log(path, owners, report),
        }
    }
}

fn check_log(path: &Path, owners: &Owners, report: &mut Report) {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            report.add(Finding::new(Severity::Ok, "stale-dels", format!("{}: no log yet, so no stale DEL", path.display())));
            return;
        }
        Err(e) => {
            report.add(Finding::new(Severity::Info, "stale-dels", format!("cannot read the log {}: {e}", path.display())));
            return;
        }
    };
    // Keyed by the pod key's fields, so the report lists pods in a stable order.
    let mut by_pod: BTreeMap<(String, String, String, String), PodStaleDels> = BTreeMap::new();
    for line in BufReader::new(file).lines().map_while(Result::ok) {
        let Some(stale) = parse_line(&line) else { continue };
        let PodKey { network, pod_namespace, pod_name, if_name } = stale.key;
        let entry = by_pod.entry((network, pod_namespace, pod_name, if_name)).or_default();
        if entry.first.is_empty() {
            entry.first = stale.time.clone();
        }
        entry.last = stale.time;
        entry.stale_sandboxes.insert(stale.container);
        match stale.handled {
            Handled::Audited => entry.audited += 1,
            Handled::Refused => entry.refused += 1,
            Handled::Deferred => entry.deferred += 1,
        }
        entry.protected = stale.owner.or(entry.protected.take());
    }
    if by_pod.is_empty() {
        report.add(Finding::new(Severity::Ok, "stale-dels", format!("{}: no stale DEL logged", path.display())));
    }
    for ((network, pod_namespace, pod_name, if_name), stats) in by_pod {
        let key = PodKey { network, pod_namespace, pod_name, if_name };
        let protected = stats.protected.clone().unwrap_or_else(|| "?".to_string());
        // Old history is a note; a refusal protecting the pod key's owner of today is current.
        let current = owners.get(&key).is_some_and(|o| Some(&o.container_id) == stats.protected.as_ref());
        let stale: Vec<&str> = stats.stale_sandboxes.iter().map(String::as_str).collect();
        let window = format!("{} .. {}", stats.first, stats.last);
        let evidence = format!("from {}: stale sandbox {}, owner {protected}, {window}", path.display(), stale.join(", "));
        if stats.refused > 0 {
            let severity = if current { Severity::Warning } else { Severity::Info };
            report.add(
                Finding::new(
                    severity,
                    "stale-dels",
                    format!(
                        "pod {} ({}, network {}): {} stale DELs refused, protecting sandbox {protected}{}",
                        key.pod(),
                        key.if_name,
                        key.network,
                        stats.refused,
                        if current { ", which still owns the pod" } else { "" }
                    ),
                )
                .evidence(evidence.clone())
                .fix(if current {
                    "nothing is broken: the runtime keeps retrying the old sandbox's teardown, which passes once the owner is stopped and removed; if retries go on for long, remove the old sandbox"
                } else {
                    "history: the owner has gone since, so later retries passed"
                }),
            );
        }
        if stats.deferred > 0 {
            report.add(
                Finding::new(
                    Severity::Info,
                    "stale-dels",
                    format!(
                        "pod {} ({}, network {}): {} stale DELs deferred while sandbox {protected} owned the pod",
                        key.pod(),
                        key.if_name,
                        key.network,
                        stats.deferred
                    ),
                )
                .evidence(evidence.clone())
                .fix("nothing to do: the old sandboxes went on their first try, and their DELs reach the primary once the pod's name is free (see the store-deferred finding)"),
            );
        }
        if stats.audited > 0 {
            let severity = if current { Severity::Error } else { Severity::Info };
            report.add(
                Finding::new(
                    severity,
                    "stale-dels",
                    format!(
                        "pod {} ({}, network {}): {} stale DELs let through in audit mode while sandbox {protected} owned the pod",
                        key.pod(),
                        key.if_name,
                        key.network,
                        stats.audited
                    ),
                )
                .evidence(evidence)
                .fix(if current {
                    "the primary plugin saw those DELs and may have released the owner's address or endpoint: check the pod's network and re-create it if broken; set \"staleDel\": \"refuse\""
                } else {
                    "history: the owner has gone since; set \"staleDel\": \"refuse\" to stop such DELs"
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: &str = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=lijiaob/etcd1-0 outcome=refused stale DEL refused: sandbox aaa is no longer pod lijiaob/etcd1-0's sandbox on network net (eth0); sandbox bbb (pod UID u-2, generation 2) owns it now, and ...";

    const REFUSED_NOW: &str = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=lijiaob/etcd1-0 outcome=refused cause=stale-del owner=bbb stale DEL refused: pod lijiaob/etcd1-0 (eth0) belongs to sandbox bbb, not aaa, which owned it before";

    const REFUSED_WITHOUT_CAUSE: &str = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=lijiaob/etcd1-0 outcome=refused owner=bbb stale DEL refused: pod lijiaob/etcd1-0 (eth0) belongs to sandbox bbb, not aaa, which owned it before";

    #[test]
    fn reads_the_owner_field_whatever_the_prose_says() {
        let line = parse_line(REFUSED_NOW).unwrap();
        assert_eq!((line.container.as_str(), line.owner.as_deref(), line.handled == Handled::Audited), ("aaa", Some("bbb"), false));
        let reworded = REFUSED_NOW.replace("belongs to sandbox bbb, not aaa", "is now in other hands");
        assert_eq!(parse_line(&reworded).unwrap().owner.as_deref(), Some("bbb"));
        let rewritten = REFUSED_NOW.replace("stale DEL refused: pod", "Teardown of an old sandbox held back: pod");
        assert_eq!(parse_line(&rewritten).unwrap().owner.as_deref(), Some("bbb"));
        let audited = REFUSED_NOW.replace("outcome=refused", "outcome=audited").replace("stale DEL refused", "audit mode let");
        assert!(parse_line(&audited).unwrap().handled == Handled::Audited);
        let deferred = REFUSED_NOW.replace("outcome=refused", "outcome=deferred");
        assert_eq!(parse_line(&deferred).unwrap().handled, Handled::Deferred);
    }

    #[test]
    fn reads_lines_from_before_the_cause_field() {
        let line = parse_line(REFUSED_WITHOUT_CAUSE).unwrap();
        assert_eq!((line.container.as_str(), line.owner.as_deref(), line.handled == Handled::Audited), ("aaa", Some("bbb"), false));
    }

    #[test]
    fn reads_a_refusal_and_its_owner() {
        let line = parse_line(REFUSED).unwrap();
        assert_eq!(line.key.pod(), "lijiaob/etcd1-0");
        assert_eq!(line.container, "aaa");
        assert_eq!(line.owner.as_deref(), Some("bbb"));
        assert!(line.handled != Handled::Audited);
    }

    #[test]
    fn ignores_other_lines() {
        for line in [
            "2026-01-02T03:04:05Z sandbox-guard[42] INFO DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=deleted released",
            "2026-01-02T03:04:05Z sandbox-guard[42] ERROR DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=refused DEL refused: the checkpoint",
            "2026-01-02T03:04:05Z sandbox-guard[42] ERROR DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=refused cause=set-aside stale DEL wording",
            "2026-01-02T03:04:05Z sandbox-guard[42] INFO ADD network=net container=aaa ifname=eth0 pod=ns/p outcome=added",
            "garbage",
            "",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }
}
