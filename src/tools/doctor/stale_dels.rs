//! Stale DELs happen silently from the runtime's side: the guard refuses them (or lets them
//! through in audit mode, or defers them) and the runtime just retries. The verb that handles
//! one counts it in the store's refusal ledger (`state::ledger`), and the doctor reads that.
//!
//! The log is read only for what the ledger cannot know: the stale DELs of a node upgraded from
//! a guard without a ledger (and those a store that took no write could not count). A log line
//! counts only when the ledger has no entry for its pod key, or when it is older than that
//! entry's first stale DEL. It reads the line's fields (`cause=stale-del owner=..`), never its
//! text, in either log format, and the rotated backups (`<file>.1`, ...) too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::finding::{Finding, Report, Severity};
use super::sandboxes::Owners;
use crate::cni::log::{CAUSE_SLOW_PRIMARY, CAUSE_STALE_DEL, LOG_BACKUPS, LogEntry, Outcome};
use crate::state::Store;
use crate::state::ledger::{Handled, LedgerEntry};
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
    /// Where the counts come from: ledger folders, log files.
    sources: BTreeSet<String>,
}

impl PodStaleDels {
    fn add_ledger(&mut self, entry: LedgerEntry, source: &str) {
        self.refused += entry.refused as usize;
        self.audited += entry.audited as usize;
        self.deferred += entry.deferred as usize;
        if self.first.is_empty() || entry.first_at < self.first {
            self.first = entry.first_at;
        }
        if entry.last_at >= self.last {
            self.last = entry.last_at;
            self.protected = Some(entry.owner);
        }
        self.stale_sandboxes.extend(entry.stale_sandboxes);
        self.sources.insert(source.to_string());
    }

    fn add_line(&mut self, stale: StaleDelLine, source: &str) {
        if self.first.is_empty() || stale.time < self.first {
            self.first = stale.time.clone();
        }
        if stale.time >= self.last {
            self.last = stale.time;
            if stale.owner.is_some() {
                self.protected = stale.owner;
            }
        }
        self.stale_sandboxes.insert(stale.container);
        match stale.handled {
            Handled::Audited => self.audited += 1,
            Handled::Refused => self.refused += 1,
            Handled::Deferred => self.deferred += 1,
        }
        self.sources.insert(source.to_string());
    }
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
    let handled = match entry.outcome()? {
        Outcome::Audited => Handled::Audited,
        Outcome::Refused => Handled::Refused,
        Outcome::Deferred => Handled::Deferred,
        _ => return None,
    };
    let (namespace, name) = entry.field("pod")?.split_once('/')?;
    Some(StaleDelLine {
        time: entry.time.to_string(),
        key: PodKey {
            network: entry.field("network")?.to_string(),
            pod_namespace: namespace.to_string(),
            pod_name: name.to_string(),
            if_name: Some(entry.field("ifname")?.to_string()),
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
        Some((word, rest)) if word.starts_with("owner=") => {
            (Some(word["owner=".len()..].to_string()), rest)
        }
        _ => (
            text.split_once("; sandbox ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .map(String::from),
            text,
        ),
    };
    (outcome == Outcome::Audited.as_str() || text.starts_with("stale DEL")).then_some(owner)
}

type PodFields = (String, String, String, Option<String>);

pub fn check(
    state_dirs: &[PathBuf],
    log_files: &[(String, Option<PathBuf>)],
    owners: &Owners,
    lock_timeout: Duration,
    report: &mut Report,
) {
    // Keyed by the pod key's fields, so the report lists pods in a stable order.
    let mut by_pod: BTreeMap<PodFields, PodStaleDels> = BTreeMap::new();
    // Where the ledger starts for each key: the log is read only before.
    // By pod alone: the ledger's key may hold no ifname (`podKey: "name"`), a log line's does.
    let mut ledger_since: HashMap<(String, String, String), String> = HashMap::new();
    // Pods the ledger keys by name alone: their log lines, each with its ifname, count there.
    let mut keyed_by_name: std::collections::HashSet<(String, String, String)> =
        std::collections::HashSet::new();
    let mut sources = Vec::new();
    for dir in state_dirs {
        let source = format!("{}/{}", dir.display(), crate::state::ledger::LEDGER);
        match read_ledger(dir, lock_timeout) {
            Ok(entries) => {
                for entry in entries {
                    let pod = (
                        entry.key.network.clone(),
                        entry.key.pod_namespace.clone(),
                        entry.key.pod_name.clone(),
                    );
                    if entry.key.if_name.is_none() {
                        keyed_by_name.insert(pod.clone());
                    }
                    let since = ledger_since
                        .entry(pod)
                        .or_insert_with(|| entry.first_at.clone());
                    if entry.first_at < *since {
                        since.clone_from(&entry.first_at);
                    }
                    let k = entry.key.clone();
                    by_pod
                        .entry((k.network, k.pod_namespace, k.pod_name, k.if_name))
                        .or_default()
                        .add_ledger(entry, &source);
                }
                sources.push(source);
            }
            Err(why) => report.add(Finding::new(
                Severity::Info,
                "stale-dels",
                format!("cannot read the refusal ledger {source}: {why}"),
            )),
        }
    }
    for (_, log_file) in log_files {
        let Some(path) = log_file else { continue };
        for file in log_and_backups(path) {
            let Ok(opened) = File::open(&file) else {
                continue;
            };
            let source = format!("{} (written before the ledger)", file.display());
            let mut counted = false;
            for line in BufReader::new(opened).lines().map_while(Result::ok) {
                let Some(stale) = parse_line(&line) else {
                    continue;
                };
                // Counted by the ledger already.
                let pod = (
                    stale.key.network.clone(),
                    stale.key.pod_namespace.clone(),
                    stale.key.pod_name.clone(),
                );
                if ledger_since
                    .get(&pod)
                    .is_some_and(|since| stale.time >= *since)
                {
                    continue;
                }
                let k = stale.key.clone();
                let if_name = k.if_name.filter(|_| !keyed_by_name.contains(&pod));
                by_pod
                    .entry((k.network, k.pod_namespace, k.pod_name, if_name))
                    .or_default()
                    .add_line(stale, &source);
                counted = true;
            }
            if counted {
                sources.push(source);
            }
        }
    }
    if by_pod.is_empty() {
        let read = if sources.is_empty() {
            "no ledger or log".to_string()
        } else {
            sources.join(", ")
        };
        report.add(Finding::new(
            Severity::Ok,
            "stale-dels",
            format!("no stale DEL recorded ({read})"),
        ));
    }
    for ((network, pod_namespace, pod_name, if_name), stats) in by_pod {
        let key = PodKey {
            network,
            pod_namespace,
            pod_name,
            if_name,
        };
        // People read container IDs as crictl prints them.
        let protected = stats
            .protected
            .as_deref()
            .map_or("?", crate::names::short_id)
            .to_string();
        // Old history is a note; a refusal protecting the pod key's owner of today is current.
        let current = owners
            .get(&key)
            .is_some_and(|o| Some(&o.container_id) == stats.protected.as_ref());
        let stale: Vec<&str> = stats
            .stale_sandboxes
            .iter()
            .map(|id| crate::names::short_id(id))
            .collect();
        let window = format!("{} .. {}", stats.first, stats.last);
        let from: Vec<&str> = stats.sources.iter().map(String::as_str).collect();
        let evidence = format!(
            "from {}: stale sandbox {}, owner {protected}, {window}",
            from.join(", "),
            stale.join(", ")
        );
        if stats.refused > 0 {
            let severity = if current {
                Severity::Warning
            } else {
                Severity::Info
            };
            report.add(
                Finding::new(
                    severity,
                    "stale-dels",
                    format!(
                        "pod {} (network {}): {} refused, protecting sandbox {protected}{}",
                        key.label(),
                        key.network,
                        stale_dels(stats.refused),
                        if current { ", which still owns the pod" } else { "" }
                    ),
                )
                .evidence(evidence.clone())
                .fix(if current {
                    "nothing is broken: the runtime keeps retrying the old sandbox's teardown, which passes once the owner is stopped and removed; to let old sandboxes go at once, wrap the primary instead (`sandbox-guard --install --mode delegate`): their DELs are then deferred and answered with success"
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
                        "pod {} (network {}): {} deferred while sandbox {protected} owned the pod",
                        key.label(),
                        key.network,
                        stale_dels(stats.deferred)
                    ),
                )
                .evidence(evidence.clone())
                .fix("nothing to do: the old sandboxes went on their first try, and their DELs reach the primary once the pod's name is free (see the store-deferred finding)"),
            );
        }
        if stats.audited > 0 {
            let severity = if current {
                Severity::Error
            } else {
                Severity::Info
            };
            report.add(
                Finding::new(
                    severity,
                    "stale-dels",
                    format!(
                        "pod {} (network {}): {} let through in audit mode while sandbox {protected} owned the pod",
                        key.label(),
                        key.network,
                        stale_dels(stats.audited)
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

/// Replays that passed but took more than half of `replayTimeoutSeconds` (their log lines'
/// `cause=slow-primary`): the primary is slow, not broken, and a slower day kills them.
pub fn check_slow_replays(log_files: &[(String, Option<PathBuf>)], report: &mut Report) {
    let mut slow: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for (_, log_file) in log_files {
        let Some(path) = log_file else { continue };
        for file in log_and_backups(path) {
            let Ok(opened) = File::open(&file) else {
                continue;
            };
            for line in BufReader::new(opened).lines().map_while(Result::ok) {
                if let Some(network) = slow_replay(&line) {
                    let seen = slow.entry(network).or_default();
                    seen.0 += 1;
                    seen.1 = line;
                }
            }
        }
    }
    for (network, (count, last)) in slow {
        report.add(
            Finding::new(
                Severity::Warning,
                "slow-replays",
                format!("network {network}: the primary is slow: {count} replayed DELs passed but took more than half of replayTimeoutSeconds"),
            )
            .evidence(crate::names::shorten(&last))
            .fix("nothing failed yet, but a slower day kills such replays at replayTimeoutSeconds: raise it (and podLockTimeoutSeconds to at least that), or see why the primary's DELs are slow (its datastore, its IPAM)"),
        );
    }
}

/// The network of a replayed DEL's log line marked slow.
fn slow_replay(line: &str) -> Option<String> {
    let entry = LogEntry::parse(line)?;
    (entry.outcome()? == Outcome::Replayed && entry.field("cause")? == CAUSE_SLOW_PRIMARY)
        .then(|| entry.field("network").map(String::from))?
}

/// The ledger of one state dir, read under its shared lock; none if it was never written.
fn read_ledger(state_dir: &Path, lock_timeout: Duration) -> Result<Vec<LedgerEntry>, String> {
    if crate::state::surely_absent(&state_dir.join(crate::state::ledger::LEDGER)) {
        return Ok(Vec::new());
    }
    let store = Store::open_as_it_is(state_dir).map_err(|e| e.msg)?;
    let _lock = store.read_lock(lock_timeout, &|_| {}).map_err(|e| e.msg)?;
    store.list_ledger().map_err(|e| e.msg)
}

/// The oldest backup first, so that lines come in the order they were written.
fn log_and_backups(path: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=LOG_BACKUPS)
        .rev()
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .collect();
    files.push(path.to_path_buf());
    files
}

/// "1 stale DEL", "2 stale DELs".
fn stale_dels(count: usize) -> String {
    match count {
        1 => "1 stale DEL".to_string(),
        n => format!("{n} stale DELs"),
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
        assert_eq!(
            (
                line.container.as_str(),
                line.owner.as_deref(),
                line.handled == Handled::Audited
            ),
            ("aaa", Some("bbb"), false)
        );
        let reworded =
            REFUSED_NOW.replace("belongs to sandbox bbb, not aaa", "is now in other hands");
        assert_eq!(parse_line(&reworded).unwrap().owner.as_deref(), Some("bbb"));
        let rewritten = REFUSED_NOW.replace(
            "stale DEL refused: pod",
            "Teardown of an old sandbox held back: pod",
        );
        assert_eq!(
            parse_line(&rewritten).unwrap().owner.as_deref(),
            Some("bbb")
        );
        let audited = REFUSED_NOW
            .replace("outcome=refused", "outcome=audited")
            .replace("stale DEL refused", "audit mode let");
        assert!(parse_line(&audited).unwrap().handled == Handled::Audited);
        let deferred = REFUSED_NOW.replace("outcome=refused", "outcome=deferred");
        assert_eq!(parse_line(&deferred).unwrap().handled, Handled::Deferred);
    }

    #[test]
    fn reads_lines_from_before_the_cause_field() {
        let line = parse_line(REFUSED_WITHOUT_CAUSE).unwrap();
        assert_eq!(
            (
                line.container.as_str(),
                line.owner.as_deref(),
                line.handled == Handled::Audited
            ),
            ("aaa", Some("bbb"), false)
        );
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
    fn a_slow_replay_is_read_from_its_fields() {
        let slow = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=replayed cause=slow-primary the deferred DEL reached the primary in 20.0s";
        assert_eq!(slow_replay(slow).as_deref(), Some("net"));
        let quick = "2026-01-02T03:04:05Z sandbox-guard[42] INFO DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=replayed the deferred DEL reached the primary in 0.1s";
        assert_eq!(slow_replay(quick), None);
        let hung = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=replay-failed the primary did not finish";
        assert_eq!(slow_replay(hung), None);
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
