//! Metrics for node_exporter's textfile collector (`metricsFile`).
//!
//! The source is `<stateDir>/counters`, a sealed file: operations by verb and outcome (one per
//! logged event: added, deleted, refused, audited, deferred, replayed, replay-failed, error,
//! ...; `rejected` by reason, for an operation refused for its config: `cni::rejected`) and
//! the time of each verb's last success. After each operation, under the store's
//! exclusive lock, the counters are read, moved on and written back, and the textfile is
//! rendered from them with the store's gauges of now (checkpoints, set-aside files, deferred
//! DELs and the oldest one) and renamed into place, so the collector never reads half a file.
//!
//! Cost: ADD commits while it still holds the lock it took anyway; the counters and the
//! textfile are written without fsync (a power cut may lose the last few increments, which
//! Prometheus reads as a counter reset; it never leaves a torn file). The checkpoint count
//! comes from the count the store keeps (`Store::record_count`), not from listing records.
//! Nothing of this runs without `metricsFile`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::env::Verb;
use super::invocation::Invocation;
use super::log::Outcome;
use crate::state::Store;
use crate::state::sealed::{self, Durability, Loaded};

pub const COUNTERS: &str = "counters";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// verb -> outcome -> count.
    pub operations: BTreeMap<String, BTreeMap<String, u64>>,
    /// verb -> Unix time of its last success.
    pub last_success: BTreeMap<String, i64>,
    /// verb -> reason -> count of operations refused for their config.
    #[serde(default)]
    pub rejected: BTreeMap<String, BTreeMap<String, u64>>,
}

/// What one commit adds to the counters.
#[derive(Default)]
struct Tally {
    outcomes: Vec<(Verb, Outcome)>,
    /// An operation refused for its config, and the reason.
    rejected: Option<(Verb, &'static str)>,
    /// The verb that succeeded.
    succeeded: Option<Verb>,
}

/// Counts what `inv` logged since the last commit, and `succeeded` (the verb's success),
/// then renders the textfile. The caller holds the store's exclusive lock. Never fails the
/// verb: a metrics file that cannot be written is said on stderr.
pub fn commit(inv: &Invocation, store: &Store, succeeded: bool) {
    commit_with(inv, store, succeeded, None);
}

/// `commit`, counting `outcome` too: the outcome of an operation whose log line comes later.
pub fn commit_with(inv: &Invocation, store: &Store, succeeded: bool, outcome: Option<Outcome>) {
    let Some(metrics_file) = inv.conf.metrics_file.as_deref() else {
        return;
    };
    let mut outcomes = inv.log.take_outcomes();
    outcomes.extend(outcome.map(|outcome| (inv.verb, outcome)));
    if !store.is_writable() {
        return;
    }
    inv.metrics_committed.set(true);
    let succeeded = succeeded.then_some(inv.verb);
    commit_tally(
        store,
        metrics_file,
        Tally {
            outcomes,
            succeeded,
            ..Tally::default()
        },
    );
}

/// Counts one operation refused for its config, whose `stateDir` and `metricsFile` could
/// still be read (`cni::rejected`). Best effort, like `flush`: the lock is waited for at
/// most FLUSH_WAIT, and nothing that fails here reaches the runtime.
pub fn count_rejected(state_dir: &Path, metrics_file: &Path, verb: Verb, reason: &'static str) {
    match Store::open(state_dir, FLUSH_WAIT) {
        Ok(store) if store.is_writable() => commit_tally(
            &store,
            metrics_file,
            Tally {
                rejected: Some((verb, reason)),
                ..Tally::default()
            },
        ),
        Ok(_) => {}
        Err(err) => stderr_line!(
            "sandbox-guard: this rejected {} is not counted: {err}",
            verb.name()
        ),
    }
}

fn commit_tally(store: &Store, metrics_file: &Path, tally: Tally) {
    let mut counters = match sealed::read::<Counters>(&store.root().join(COUNTERS)) {
        Ok(Loaded::Valid(counters)) => counters,
        // Lost or damaged: counting starts again, which Prometheus reads as a reset.
        _ => Counters::default(),
    };
    for (verb, outcome) in tally.outcomes {
        *counters
            .operations
            .entry(verb.name().to_string())
            .or_default()
            .entry(outcome.as_str().to_string())
            .or_default() += 1;
    }
    if let Some((verb, reason)) = tally.rejected {
        *counters
            .rejected
            .entry(verb.name().to_string())
            .or_default()
            .entry(reason.to_string())
            .or_default() += 1;
    }
    let now = crate::clock::unix_seconds();
    if let Some(verb) = tally.succeeded {
        counters.last_success.insert(verb.name().to_string(), now);
    }
    let written = sealed::replace(
        store.root(),
        COUNTERS,
        &sealed::seal(&counters),
        Durability::Hint,
    )
    .map_err(|e| format!("cannot write {}/{COUNTERS}: {e}", store.root().display()))
    .and_then(|()| {
        let text = render(&counters, &Gauges::read(store), store.root(), now);
        write_textfile(metrics_file, text.as_bytes())
            .map_err(|e| format!("cannot write metricsFile {}: {e}", metrics_file.display()))
    });
    if let Err(why) = written {
        stderr_line!("sandbox-guard: {why}");
    }
}

/// How long `flush` waits for the lock.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// For the verbs that did not commit while they held the lock (or logged after): takes the
/// lock again and commits. ADD commits in place and pays nothing here.
pub fn flush(inv: &Invocation, succeeded: bool) {
    if inv.conf.metrics_file.is_none() || (inv.metrics_committed.get() && !inv.log.has_outcomes()) {
        return;
    }
    // Counting is best effort: a verb that already waited for the lock (and maybe gave up on
    // it) must not wait as long again only to be counted.
    match Store::open(&inv.conf.state_dir, inv.conf.lock_timeout.min(FLUSH_WAIT)) {
        Ok(store) => commit(inv, &store, succeeded && !inv.metrics_committed.get()),
        Err(err) => stderr_line!(
            "sandbox-guard: the metrics of this {} are not counted: {err}",
            inv.verb.name()
        ),
    }
}

/// The store as it is now.
struct Gauges {
    checkpoints: Option<u64>,
    set_aside: usize,
    deferred: usize,
    /// Deferred DELs whose pod's name is free and whose replay failed: only a retry stands
    /// between them and the primary.
    deferred_free_failed: usize,
    oldest_deferred: Option<i64>,
}

impl Gauges {
    fn read(store: &Store) -> Gauges {
        let checkpoints = store
            .record_count()
            .or_else(|| store.recount_records().ok());
        let set_aside = store.list_set_aside().map_or(0, |files| files.len());
        let deferred = store.list_deferred().unwrap_or_default();
        let oldest_deferred = deferred
            .iter()
            .filter_map(|(_, loaded)| match loaded {
                Loaded::Valid(entry) => crate::clock::parse_rfc3339(&entry.deferred_at),
                _ => None,
            })
            .min();
        let deferred_free_failed = deferred
            .iter()
            .filter(|(_, loaded)| matches!(loaded, Loaded::Valid(entry) if entry.attempts > 0 && store.name_is_free(&entry.key)))
            .count();
        Gauges {
            checkpoints,
            set_aside,
            deferred: deferred.len(),
            deferred_free_failed,
            oldest_deferred,
        }
    }
}

/// `now`: when the file is written. The store changes only through the plugin, so an idle
/// node's file is old but exact; `sandbox_guard_textfile_timestamp_seconds` says as of when.
fn render(counters: &Counters, gauges: &Gauges, state_dir: &Path, now: i64) -> String {
    let dir = escape(&state_dir.display().to_string());
    let mut out = String::with_capacity(2048);
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(
            out,
            "# HELP sandbox_guard_{name} {help}\n# TYPE sandbox_guard_{name} {kind}"
        );
    };
    family(
        &mut out,
        "operations_total",
        "counter",
        "CNI operations by verb and outcome (added, deleted, refused, audited, deferred, replayed, replay-failed, error, ..., and rejected: refused for the config, by reason).",
    );
    for (verb, outcomes) in &counters.operations {
        for (outcome, count) in outcomes {
            let _ = writeln!(
                out,
                "sandbox_guard_operations_total{{state_dir=\"{dir}\",verb=\"{}\",outcome=\"{}\"}} {count}",
                escape(verb),
                escape(outcome)
            );
        }
    }
    for (verb, reasons) in &counters.rejected {
        for (reason, count) in reasons {
            let _ = writeln!(
                out,
                "sandbox_guard_operations_total{{state_dir=\"{dir}\",verb=\"{}\",outcome=\"{}\",reason=\"{}\"}} {count}",
                escape(verb),
                Outcome::Rejected.as_str(),
                escape(reason)
            );
        }
    }
    family(
        &mut out,
        "last_success_timestamp_seconds",
        "gauge",
        "Unix time of the last successful operation, by verb.",
    );
    for (verb, at) in &counters.last_success {
        let _ = writeln!(
            out,
            "sandbox_guard_last_success_timestamp_seconds{{state_dir=\"{dir}\",verb=\"{}\"}} {at}",
            escape(verb)
        );
    }
    if let Some(checkpoints) = gauges.checkpoints {
        family(
            &mut out,
            "checkpoints",
            "gauge",
            "Checkpoints (pod attachments) in the state dir now.",
        );
        let _ = writeln!(
            out,
            "sandbox_guard_checkpoints{{state_dir=\"{dir}\"}} {checkpoints}"
        );
    }
    family(
        &mut out,
        "set_aside_files",
        "gauge",
        "Files set aside after failing verification, in the state dir now.",
    );
    let _ = writeln!(
        out,
        "sandbox_guard_set_aside_files{{state_dir=\"{dir}\"}} {}",
        gauges.set_aside
    );
    family(
        &mut out,
        "deferred_dels",
        "gauge",
        "Delegate mode: stale DELs kept from the primary now.",
    );
    let _ = writeln!(
        out,
        "sandbox_guard_deferred_dels{{state_dir=\"{dir}\"}} {}",
        gauges.deferred
    );
    family(
        &mut out,
        "deferred_dels_failing_free",
        "gauge",
        "Delegate mode: deferred DELs whose pod's name is free but whose replay the primary refused.",
    );
    let _ = writeln!(
        out,
        "sandbox_guard_deferred_dels_failing_free{{state_dir=\"{dir}\"}} {}",
        gauges.deferred_free_failed
    );
    if let Some(oldest) = gauges.oldest_deferred {
        family(
            &mut out,
            "oldest_deferred_del_timestamp_seconds",
            "gauge",
            "Delegate mode: Unix time the oldest deferred DEL was deferred.",
        );
        let _ = writeln!(
            out,
            "sandbox_guard_oldest_deferred_del_timestamp_seconds{{state_dir=\"{dir}\"}} {oldest}"
        );
    }
    family(
        &mut out,
        "textfile_timestamp_seconds",
        "gauge",
        "Unix time this file was written: the values are as of then (the state changes only when the plugin runs).",
    );
    let _ = writeln!(
        out,
        "sandbox_guard_textfile_timestamp_seconds{{state_dir=\"{dir}\"}} {now}"
    );
    out
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Temp file in the same directory (a name node_exporter skips: it reads `*.prom`), then
/// rename. 0644: the collector may run as another user; the file holds counts only. Neither
/// the temp file nor the target is followed if it is a symlink (rename replaces the link).
fn write_textfile(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&temp)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let mut counters = Counters::default();
        counters
            .operations
            .entry("DEL".into())
            .or_default()
            .insert("refused".into(), 3);
        counters.last_success.insert("ADD".into(), 1_700_000_000);
        let gauges = Gauges {
            checkpoints: Some(2),
            set_aside: 0,
            deferred: 1,
            deferred_free_failed: 1,
            oldest_deferred: Some(1_600_000_000),
        };
        counters
            .rejected
            .entry("ADD".into())
            .or_default()
            .insert("decode".into(), 2);
        let text = render(
            &counters,
            &gauges,
            Path::new("/var/lib/a\"b"),
            1_800_000_000,
        );
        assert!(text.contains("sandbox_guard_operations_total{state_dir=\"/var/lib/a\\\"b\",verb=\"ADD\",outcome=\"rejected\",reason=\"decode\"} 2\n"), "{text}");
        assert!(text.contains("sandbox_guard_textfile_timestamp_seconds{state_dir=\"/var/lib/a\\\"b\"} 1800000000\n"), "{text}");
        assert!(text.contains("sandbox_guard_operations_total{state_dir=\"/var/lib/a\\\"b\",verb=\"DEL\",outcome=\"refused\"} 3\n"), "{text}");
        assert!(text.contains("# TYPE sandbox_guard_checkpoints gauge\nsandbox_guard_checkpoints{state_dir=\"/var/lib/a\\\"b\"} 2\n"), "{text}");
        assert!(
            text.contains(
                "sandbox_guard_deferred_dels_failing_free{state_dir=\"/var/lib/a\\\"b\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("sandbox_guard_oldest_deferred_del_timestamp_seconds{state_dir=\"/var/lib/a\\\"b\"} 1600000000\n"), "{text}");
    }
}
