//! The store's own health: files that failed verification, owners without their record,
//! temp files of killed writers, loose permissions.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::finding::{Finding, Report, Severity, capped};
use crate::state::checkpoint::Checkpoint;
use crate::state::held::{HeldWith, VIEW_OFF};
use crate::state::ownership::Ownership;
use crate::state::pending_add::{self, Standing};
use crate::state::{Loaded, Store, surely_absent};
use crate::tools::counted;

/// Without a journal a power cut can lose what the guard acknowledged (docs/store.md): said
/// for the state dir, or for where it will be made.
pub(super) fn check_journal(state_dir: &Path, report: &mut Report) {
    use crate::state::journal::{
        NO_BARRIER_COST, NO_BARRIER_FIX, NO_JOURNAL_COST, PowerCut, no_journal_fix, power_cut_of,
    };
    let root = state_dir.display();
    match power_cut_of(state_dir) {
        PowerCut::Journaled => report.add(Finding::new(
            Severity::Ok,
            "store-journal",
            format!("{root}: on a journaled file system"),
        )),
        PowerCut::NoJournal { device, evidence } => report.add(
            Finding::new(
                Severity::Warning,
                "store-journal",
                format!(
                    "{root}: on {device}, an ext file system without a journal: {NO_JOURNAL_COST}"
                ),
            )
            .evidence(evidence)
            .fix(no_journal_fix(&device)),
        ),
        PowerCut::NoBarrier { device, evidence } => report.add(
            Finding::new(
                Severity::Warning,
                "store-journal",
                format!("{root}: on {device}, journaled but mounted nobarrier: {NO_BARRIER_COST}"),
            )
            .evidence(evidence)
            .fix(NO_BARRIER_FIX),
        ),
        PowerCut::Unknown => {}
    }
}

/// Which boot the live folders are of, and what the boot before left in `previous-boot/`.
pub(super) fn check_boot(state_dir: &Path, store: &Store, report: &mut Report) {
    use crate::state::boot::{LiveFolders, PREVIOUS_BOOT};
    let root = state_dir.display();
    let kept: Vec<String> = std::fs::read_dir(state_dir.join(PREVIOUS_BOOT))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    let kept = match kept.as_slice() {
        [] => String::new(),
        boots => format!(
            "; {root}/{PREVIOUS_BOOT}/ keeps the state of the boot before ({}), which no owner is taken from (a delegate-mode DEL the API server leaves unanswered looks there to tell a sandbox of that boot: keep it for this boot)",
            boots.join(", ")
        ),
    };
    let finding = match store.live_folders() {
        LiveFolders::ThisBoot => Finding::new(
            Severity::Ok,
            "store-boot",
            format!("{root}: its records and owners are this boot's{kept}"),
        ),
        LiveFolders::Previous(boot) => Finding::new(
            Severity::Ok,
            "store-boot",
            format!(
                "{root}: its records and owners are of the boot {boot}, whose sandboxes have all ended: no verb ran since this boot began, and the first one moves them to {PREVIOUS_BOOT}/{kept}"
            ),
        ),
        LiveFolders::Unscoped => Finding::new(
            Severity::Ok,
            "store-boot",
            format!(
                "{root}: no boot marker yet (a store of a release before it, or no boot id to read): its files were written durably, and the next verb that reads a boot id marks them as this boot's{kept}"
            ),
        ),
    };
    report.add(finding);
}

/// An owner whose record is gone refused every other sandbox's DEL of its pod in earlier
/// versions of the plugin, which could leave one behind; so can a hand edit.
pub(super) fn check_orphans(root: &str, orphaned: &[Ownership], report: &mut Report) {
    if orphaned.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "store-owners",
            format!("{root}: every pod key's owner has its record"),
        ));
        return;
    }
    let mut finding = Finding::new(
        Severity::Warning,
        "store-owners",
        format!("{root}: {} pod keys are owned by a sandbox whose record is gone", orphaned.len()),
    )
    .fix("nothing to do by hand: the next DEL or GC of each pod drops that ownership instead of refusing the DEL");
    finding.evidence = capped(
        orphaned
            .iter()
            .map(|o| {
                format!(
                    "pod {} (network {}): owner {} (generation {}) has no record",
                    o.key.label(),
                    o.key.network,
                    o.container_id,
                    o.generation
                )
            })
            .collect(),
    );
    report.add(finding);
}

/// A deferred DEL waits for its pod's owner to go; one waiting for more than a day, or whose
/// replays the primary keeps refusing, leaks what the primary holds for the old sandbox.
pub(super) fn check_deferred(
    root: &str,
    store: &Store,
    kubeconfigs: &[std::path::PathBuf],
    report: &mut Report,
) {
    let deferred = match store.list_deferred() {
        Ok(deferred) => deferred,
        Err(e) => {
            report.add(Finding::new(
                Severity::Warning,
                "store-deferred",
                format!("{root}: cannot list the deferred DELs: {e}"),
            ));
            return;
        }
    };
    if deferred.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "store-deferred",
            format!("{root}: no deferred DEL waits"),
        ));
        return;
    }
    let now = crate::clock::unix_seconds();
    let mut old = Vec::new();
    let mut failing = Vec::new();
    let mut free = Vec::new();
    let mut slow = Vec::new();
    let mut unasked = Vec::new();
    let waiting = deferred.len();
    let mut answers = Answers::default();
    for (path, loaded) in &deferred {
        let Loaded::Valid(entry) = loaded else {
            failing.push(format!("{}: failed verification, it is never replayed: delete it once its sandbox is gone from the primary", path.display()));
            continue;
        };
        let since = crate::clock::parse_rfc3339(&entry.deferred_at).unwrap_or(now);
        let holder = match &entry.moved_to {
            Some(moved) if moved.pod_uid.is_empty() => {
                "its sandbox was of the boot before and the API server did not answer".to_string()
            }
            Some(moved) => format!(
                "the API server showed the name on pod UID {}",
                moved.pod_uid
            ),
            None => format!("{} owned the pod", entry.owner),
        };
        let what = format!(
            "pod {} ({}): sandbox {}, deferred {} ago while {holder}",
            entry.key.pod(),
            entry.if_name(),
            entry.container_id,
            crate::clock::age(since, now),
        );
        let failed = format!(
            "{} replays failed, the last: {}",
            entry.attempts,
            entry.last_error.as_deref().unwrap_or("-")
        );
        if let Some(moved) = &entry.moved_to
            && let Some(why) = answers.none_answers(moved, &entry.key, kubeconfigs)
        {
            unasked.push(format!("{what}; {why}"));
        }
        if entry.hung {
            // Killed at replayTimeoutSeconds while it still ran: no answer, so not refused.
            slow.push(format!(
                "{what}; its last replay ran {}s and was killed while the primary still worked ({} attempts)",
                entry.last_replay_seconds.map_or("?".to_string(), |s| s.to_string()),
                entry.attempts
            ));
        } else if entry.attempts > 0 && store.name_is_free(&entry.key) {
            free.push(format!("{what}; the pod's name is free, but {failed}"));
        } else if entry.attempts >= REPLAYS_BEFORE_WARNING {
            failing.push(format!("{what}; {failed}"));
        } else if now - since > DEFERRED_FOR_LONG {
            old.push(what);
        }
    }
    let quiet = failing.is_empty()
        && old.is_empty()
        && free.is_empty()
        && slow.is_empty()
        && unasked.is_empty();
    if !unasked.is_empty() {
        let summary = format!(
            "{root}: {} deferred DELs held for the API server's pod cannot ask it with the kubeconfig they were held with",
            unasked.len()
        );
        let fix = format!(
            "each stays held, and each delegate-mode verb on this state dir asks again with the kubeconfig it was held \
             with, or the one the verb's own network names. Make one of them answer (a token that may get pods in the \
             pod's namespace). Only if the API server's view is off for good, write {} into the file each was held \
             with, owned by root and writable by it alone (the installer does when it turns the view off), and take \
             any other kubeconfig out of the networks here: the next verb replays them by the local rule, which frees \
             what the primary holds under the name even where a pod of that name lives on another node",
            VIEW_OFF.trim_end()
        );
        report.add(
            Finding::new(Severity::Warning, "store-deferred", summary)
                .listing(unasked)
                .fix(fix),
        );
    }
    if !slow.is_empty() {
        let summary = format!(
            "{root}: the primary is slow: {} deferred DELs ran out of replayTimeoutSeconds without an answer",
            slow.len()
        );
        report.add(Finding::new(Severity::Warning, "store-deferred", summary).listing(slow).fix(
            "the primary did not answer, it did not refuse: if its DELs are just slow (its datastore, its IPAM), raise \
             replayTimeoutSeconds in the conflist entry (and podLockTimeoutSeconds to at least that); if it hangs, see its \
             own logs. The replay worker retries each a minute after the last try",
        ));
    }
    if !free.is_empty() {
        let summary = format!(
            "{root}: the primary is broken: it refused {} deferred DELs whose pod's name is free",
            free.len()
        );
        report.add(Finding::new(Severity::Warning, "store-deferred", summary).listing(free).fix(
            "the primary answered with an error: read the last one and fix the primary; it holds what it gave each old sandbox \
             until a replay passes; the replay worker, started by the node's next delegate-mode ADD, DEL or GC, retries them \
             (after 2^attempts seconds, at most a minute)",
        ));
    }
    if !failing.is_empty() {
        let summary = format!(
            "{root}: the primary keeps refusing {} deferred DELs",
            failing.len()
        );
        report.add(Finding::new(Severity::Warning, "store-deferred", summary).listing(failing).fix(
            "read the last error: the primary holds what it gave the old sandbox until one replay passes; the next release of the pod, \
             the node's next delegate-mode verb once the name is free, or GC retries",
        ));
    }
    if !old.is_empty() {
        let summary = format!(
            "{root}: {} deferred DELs have waited for more than a day",
            old.len()
        );
        report.add(Finding::new(Severity::Info, "store-deferred", summary).listing(old).fix(
            "nothing is broken: each waits for its pod's owner to be removed (a long-lived StatefulSet pod keeps it waiting); the primary holds what it gave the old sandbox until then",
        ));
    }
    if quiet {
        report.add(Finding::new(
            Severity::Ok,
            "store-deferred",
            format!("{root}: {waiting} deferred DELs wait for their pod's name to be free"),
        ));
    }
}

/// Delegate mode's pending ADDs: one the primary refuses to roll back holds its pod's verbs at
/// code 11, and one cut off (its primary, which dies with its guard, is gone) waits for a verb
/// of its pod.
pub(super) fn check_pending_adds(root: &Path, report: &mut Report) {
    let shown = root.display();
    let now = crate::clock::unix_seconds();
    let mut refused = Vec::new();
    let mut waiting = Vec::new();
    let mut earlier_boot = Vec::new();
    let mut at_primary = 0;
    for digest in pending_add::digests(root) {
        let Ok(Loaded::Valid(note)) = pending_add::load(root, &digest) else {
            continue;
        };
        let since = crate::clock::parse_rfc3339(&note.written_at).unwrap_or(now);
        let (standing, _) = pending_add::standing(root, &digest, &note);
        let running = standing.processes();
        let what = format!(
            "pod {} ({}): sandbox {}, noted {} ago, {running} processes of its primary running ({})",
            note.key.pod(),
            note.if_name,
            note.container_id,
            crate::clock::age(since, now),
            pending_add::note_path(root, &digest).display()
        );
        match standing {
            Standing::EarlierBoot => earlier_boot.push(what),
            // Harmless: the pod's next verb drops it.
            Standing::Committed => {}
            _ if note.attempts > 0 => refused.push(format!(
                "{what}; {} rollbacks failed, the last: {}",
                note.attempts,
                note.last_error.as_deref().unwrap_or("-")
            )),
            Standing::CutOff { .. } => waiting.push(what),
            Standing::AtThePrimary { .. } => at_primary += 1,
        }
    }
    let marks = pending_add::rolled_back_ids(root).len();
    if surely_absent(&root.join(pending_add::PENDING_ADDS)) && marks == 0 {
        // No delegate-mode ADD here yet: nothing to say.
        return;
    }
    let quiet = refused.is_empty() && waiting.is_empty() && earlier_boot.is_empty();
    if !refused.is_empty() {
        let summary = format!(
            "{shown}: the primary refused to roll back {} cut off at it",
            counted(refused.len(), "ADD", "ADDs")
        );
        report.add(Finding::new(Severity::Warning, "store-pending-adds", summary).listing(refused).fix(
            "each pod's verbs fail with code 11 until the primary takes the cut-off sandbox's DEL: read the last error and fix the \
             primary. After five refusals the note goes and what the primary made of that sandbox stays; removing the note (and its \
             .pid file) gives the rollback up at once",
        ));
    }
    if !waiting.is_empty() {
        let summary = format!(
            "{shown}: {} cut off at the primary, waiting to be rolled back",
            counted(waiting.len(), "ADD", "ADDs")
        );
        report.add(Finding::new(Severity::Info, "store-pending-adds", summary).listing(waiting).fix(
            "nothing is broken: the pod's next verb kills what runs of each and gives the primary the cut-off sandbox's DEL (while \
             another sandbox holds the pod with a live netns, that sandbox's DEL does, and the pod's next ADD drops the note); GC's \
             sweep does the same; until then the primary holds what it made of the cut-off sandbox",
        ));
    }
    if !earlier_boot.is_empty() {
        let summary = format!(
            "{shown}: the notes of {} of an earlier boot wait to be dropped",
            counted(earlier_boot.len(), "ADD", "ADDs")
        );
        report.add(Finding::new(Severity::Info, "store-pending-adds", summary).listing(earlier_boot).fix(
            "nothing of them runs since the reboot: the pod's next verb or the sweep drops each without calling the primary",
        ));
    }
    if quiet {
        report.add(Finding::new(
            Severity::Ok,
            "store-pending-adds",
            format!("{shown}: no ADD cut off at the primary waits ({at_primary} at the primary now, {marks} rolled back)"),
        ));
    }
}

const REPLAYS_BEFORE_WARNING: u32 = 3;
const DEFERRED_FOR_LONG: i64 = 24 * 3600;

/// Temp files of writers killed mid-write (a runtime's timeout kills plugins): harmless,
/// never read, removed by GC; many of them say plugins are being killed.
pub(super) fn check_temp_files(root: &str, store: &Store, report: &mut Report) {
    let temps = store.temp_files();
    let dead: Vec<_> = temps.iter().filter(|t| !t.writer_alive()).collect();
    if dead.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "store-temp-files",
            format!("{root}: no temp file left by a killed writer"),
        ));
        return;
    }
    let now = std::time::SystemTime::now();
    let oldest = dead.iter().map(|t| t.modified).min().unwrap_or(now);
    let age = now.duration_since(oldest).unwrap_or_default().as_secs();
    let mut finding = Finding::new(
        Severity::Warning,
        "store-temp-files",
        format!("{root}: {} temp files left by killed plugin runs, the oldest {} old", dead.len(), crate::clock::age(0, age as i64)),
    )
    .fix(
        "they are never read and a CNI 1.1 runtime's GC removes them (or delete them: `find <stateDir> -name '.*.tmp' \
         -delete` while no plugin runs); many of them mean the runtime kills the plugin: look for its CNI timeouts",
    );
    finding.evidence = capped(
        dead.iter()
            .map(|t| format!("{} (pid {}, gone)", t.path.display(), t.pid))
            .collect(),
    );
    report.add(finding);
}

pub(super) fn check_permissions(state_dir: &Path, report: &mut Report) {
    let mut problems = Vec::new();
    let mut worst = Severity::Ok;
    let mut inspect = |path: &Path, meta: &std::fs::Metadata| {
        let mode = meta.permissions().mode() & 0o7777;
        let (severity, what) = if meta.file_type().is_symlink() {
            (
                Severity::Error,
                "a symbolic link: the plugin refuses to follow it".to_string(),
            )
        } else if mode & 0o022 != 0 {
            (
                Severity::Error,
                format!("mode {mode:04o}: others can write it, and so forge ownership"),
            )
        } else if mode & 0o044 != 0 {
            (
                Severity::Warning,
                format!("mode {mode:04o}: others can read pod names and addresses"),
            )
        } else if meta.uid() != 0 {
            (
                Severity::Warning,
                format!("owned by uid {}, not root, who runs the plugin", meta.uid()),
            )
        } else {
            return;
        };
        worst = worst.max(severity);
        problems.push(format!("{} is {what}", path.display()));
    };
    if let Ok(meta) = std::fs::symlink_metadata(state_dir) {
        inspect(state_dir, &meta);
    }
    if let Ok(meta) = std::fs::symlink_metadata(state_dir.join(crate::cni::metrics::COUNTERS)) {
        inspect(&state_dir.join(crate::cni::metrics::COUNTERS), &meta);
    }
    for dir in [
        "records",
        "owners",
        "set-aside",
        crate::state::FAILED_ADDS,
        crate::state::IPS,
        crate::state::ledger::LEDGER,
    ] {
        let dir = state_dir.join(dir);
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        inspect(&dir, &meta);
        if !meta.is_dir() {
            continue;
        }
        // Ownerships, address index entries and, on a journal, records are symlinks whose
        // target is their sealed text (never followed); one set aside stays one. A link has no
        // mode of its own.
        let links_are_entries = ["records", "owners", "set-aside", crate::state::IPS]
            .iter()
            .any(|d| dir.ends_with(d));
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if let Ok(meta) = entry.metadata()
                && !(links_are_entries && meta.file_type().is_symlink())
            {
                inspect(&entry.path(), &meta);
            }
        }
    }
    let summary = match worst {
        Severity::Ok => {
            report.add(Finding::new(
                Severity::Ok,
                "store-permissions",
                format!(
                    "{}: private to root (0700 dirs, 0600 files)",
                    state_dir.display()
                ),
            ));
            return;
        }
        _ => format!(
            "{}: {} not private to root",
            state_dir.display(),
            match problems.len() {
                1 => "1 entry is".to_string(),
                n => format!("{n} entries are"),
            }
        ),
    };
    let mut finding = Finding::new(worst, "store-permissions", summary).fix(format!(
        "`chown -R root:root {0} && chmod -R go-rwx {0}`, and replace links by real directories; the plugin \
         creates what it writes 0700/0600, so look for who changed them",
        state_dir.display()
    ));
    finding.evidence = capped(problems);
    report.add(finding);
}

pub(super) fn check_untrusted(
    root: &str,
    records: &[(std::path::PathBuf, Loaded<Checkpoint>)],
    set_aside: &[std::path::PathBuf],
    report: &mut Report,
) {
    let corrupt: Vec<String> = records
        .iter()
        .filter_map(|(path, loaded)| match loaded {
            Loaded::Corrupt { reason, .. } => Some(format!("{}: {reason}", path.display())),
            _ => None,
        })
        .collect();
    // A set-aside file under its plain name stops the DELs that need it; one with a `~time`
    // suffix is only kept for inspection.
    let (blocking, kept): (Vec<_>, Vec<_>) = set_aside
        .iter()
        .partition(|path| crate::state::set_aside_blocks(path));
    let all_trusted = corrupt.is_empty() && blocking.is_empty() && kept.is_empty();
    if !corrupt.is_empty() {
        let mut finding = Finding::new(Severity::Error, "store-checksums", format!("{root}: {} records fail their checksum", corrupt.len()))
            .fix("the next ADD, DEL or GC of each sets it aside; a DEL that needs one is refused until an operator decides");
        finding.evidence = capped(corrupt);
        report.add(finding);
    }
    if !blocking.is_empty() {
        let mut finding = Finding::new(
            Severity::Error,
            "store-checksums",
            format!("{root}: {} checkpoints were set aside after a checksum failure and block the DELs that need them", blocking.len()),
        )
        .fix("check with `crictl pods` whether a newer sandbox of each pod runs here: if none does, delete the file and the runtime's retry passes; if one does, stop and remove it first");
        finding.evidence = capped(blocking.iter().map(|p| p.display().to_string()).collect());
        report.add(finding);
    }
    if !kept.is_empty() {
        let mut finding = Finding::new(
            Severity::Warning,
            "store-checksums",
            format!(
                "{root}: {} damaged checkpoints are kept for inspection",
                kept.len()
            ),
        )
        .fix("they block nothing; delete them once you know what damaged them (disk, a hand edit)");
        finding.evidence = capped(kept.iter().map(|p| p.display().to_string()).collect());
        report.add(finding);
    }
    if all_trusted {
        report.add(Finding::new(
            Severity::Ok,
            "store-checksums",
            format!("{root}: {} records, every one verified", records.len()),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::deferred::DeferredDel;
    use crate::state::ownership::PodKey;

    fn entry(pod: &str, deferred_at: String, attempts: u32) -> DeferredDel {
        DeferredDel {
            key: PodKey {
                network: "net".into(),
                pod_namespace: "lijiaob".into(),
                pod_name: pod.into(),
                if_name: None,
            },
            container_id: format!("old-{pod}"),
            pod_uid: None,
            cni_args: String::new(),
            cni_version: "1.0.0".into(),
            prev_result: None,
            netns: String::new(),
            mac: None,
            owner: format!("new-{pod}"),
            deferred_at,
            deferred_at_ns: 0,
            attempts,
            last_error: (attempts > 0).then(|| "datastore is locked".to_string()),
            last_attempt_at: None,
            interface: Some("eth0".into()),
            last_attempt_ns: None,
            last_attempt_boot_ns: None,
            boot_id: None,
            deferred_in_boot: None,
            last_replay_seconds: None,
            hung: false,
            delegate: None,
            conf_version: None,
            identity: None,
            moved_to: None,
        }
    }

    #[test]
    fn one_entry_not_private_to_root_is_counted_in_the_singular() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sg-doctor-perms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut report = Report::default();
        check_permissions(&dir, &mut report);
        let _ = std::fs::remove_dir_all(&dir);
        let summary = &report.findings[0].summary;
        assert!(
            summary.ends_with(": 1 entry is not private to root"),
            "{summary}"
        );
    }

    #[test]
    fn deferred_dels_that_wait_for_long_or_keep_failing_are_reported() {
        let dir = std::env::temp_dir().join(format!("sg-doctor-deferred-{}", std::process::id()));
        let store = Store::open(&dir, std::time::Duration::from_secs(1)).unwrap();
        let now = crate::clock::unix_seconds();
        store
            .save_deferred(&entry("etcd1-0", crate::clock::rfc3339(now - 60), 0))
            .unwrap();
        let mut report = Report::default();
        check_deferred("s", &store, &[], &mut report);
        assert_eq!(
            report
                .findings
                .iter()
                .map(|f| f.severity)
                .collect::<Vec<_>>(),
            [Severity::Ok],
            "a fresh deferral is no finding"
        );

        store
            .save_deferred(&entry("etcd2-0", crate::clock::rfc3339(now - 2 * 86400), 0))
            .unwrap();
        store
            .save_deferred(&entry("etcd3-0", crate::clock::rfc3339(now - 600), 3))
            .unwrap();
        let mut report = Report::default();
        check_deferred("s", &store, &[], &mut report);
        let found: Vec<(Severity, String)> = report
            .findings
            .iter()
            .map(|f| (f.severity, f.evidence.join("\n")))
            .collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].0 == Severity::Warning
                && found[0].1.contains("etcd3-0")
                && found[0].1.contains("datastore is locked"),
            "{found:?}"
        );
        assert!(
            found[1].0 == Severity::Info
                && found[1].1.contains("etcd2-0")
                && !found[1].1.contains("etcd1-0"),
            "{found:?}"
        );

        // One failed replay is enough to warn once nobody owns the name: nothing else retries it soon.
        store
            .save_deferred(&entry("etcd4-0", crate::clock::rfc3339(now - 60), 1))
            .unwrap();
        let mut report = Report::default();
        check_deferred("s", &store, &[], &mut report);
        let warned: Vec<String> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .map(|f| f.evidence.join("\n"))
            .collect();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("etcd4-0") && w.contains("name is free")),
            "{warned:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_slow_primary_is_told_from_a_broken_one() {
        let dir = std::env::temp_dir().join(format!("sg-doctor-slow-{}", std::process::id()));
        let store = Store::open(&dir, std::time::Duration::from_secs(1)).unwrap();
        let now = crate::clock::rfc3339(crate::clock::unix_seconds() - 60);
        let mut slow = entry("etcd1-0", now.clone(), 1);
        slow.hung = true;
        slow.last_replay_seconds = Some(30.0);
        store.save_deferred(&slow).unwrap();
        store.save_deferred(&entry("etcd2-0", now, 1)).unwrap();
        let mut report = Report::default();
        check_deferred("s", &store, &[], &mut report);
        let found: Vec<String> = report
            .findings
            .iter()
            .map(|f| format!("{} | {}", f.summary, f.evidence.join("\n")))
            .collect();
        assert!(
            found.iter().any(|f| f.contains("slow")
                && f.contains("replayTimeoutSeconds")
                && f.contains("etcd1-0")
                && !f.contains("etcd2-0")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.contains("broken") && f.contains("etcd2-0") && !f.contains("etcd1-0")),
            "{found:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_held_del_whose_kubeconfig_is_gone_or_does_not_answer_is_said() {
        let dir = std::env::temp_dir().join(format!("sg-doctor-unasked-{}", std::process::id()));
        let store = Store::open(&dir, std::time::Duration::from_secs(1)).unwrap();
        let now = crate::clock::rfc3339(crate::clock::unix_seconds() - 60);
        let (broken, off) = (dir.join("broken"), dir.join("off"));
        std::fs::write(&broken, "{}").unwrap();
        std::fs::write(&off, crate::state::held::VIEW_OFF).unwrap();
        for (pod, kubeconfig) in [("db-0", dir.join("gone")), ("db-1", broken), ("db-2", off)] {
            let mut held = entry(pod, now.clone(), 0);
            held.moved_to = Some(crate::state::held::MovedTo {
                pod_uid: "u2".into(),
                node: Some("node-b".into()),
                kubeconfig,
                scope: "cluster".into(),
                this_node: "node-a".into(),
            });
            store.save_deferred(&held).unwrap();
        }
        let mut report = Report::default();
        check_deferred("s", &store, &[], &mut report);
        let found: Vec<String> = report
            .findings
            .iter()
            .map(|f| format!("{:?} {} | {}", f.severity, f.summary, f.evidence.join("\n")))
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            found.iter().any(|f| f.starts_with("Warning")
                && f.contains("cannot ask it with the kubeconfig")
                && f.contains("db-0")
                && f.contains("which is gone")
                && f.contains("db-1")
                && f.contains("with which the API server cannot be asked")
                && !f.contains("db-2")),
            "{found:?}"
        );
    }
}

#[cfg(test)]
mod pending_add_tests {
    use super::*;
    use crate::state::ownership::PodKey;
    use crate::state::pending_add::PendingAdd;

    fn note(pod: &str, noted_at: i64, attempts: u32, boot: Option<String>) -> PendingAdd {
        let key = PodKey {
            network: "net".into(),
            pod_namespace: "lijiaob".into(),
            pod_name: pod.into(),
            if_name: None,
        };
        let mut note = PendingAdd::new(
            &key,
            &format!("cut-{pod}"),
            "eth0",
            "",
            "",
            "1.0.0",
            Default::default(),
        );
        note.written_at = crate::clock::rfc3339(noted_at);
        note.attempts = attempts;
        note.last_error = (attempts > 0).then(|| "datastore is locked".to_string());
        if boot.is_some() {
            note.boot_id = boot;
        }
        note
    }

    #[test]
    fn a_refused_rollback_and_a_cut_off_add_waiting_long_are_reported() {
        let dir = std::env::temp_dir().join(format!("sg-doctor-pending-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = crate::clock::unix_seconds();
        pending_add::save(&dir, &note("etcd1-0", now - 5, 0, None)).unwrap();
        let mut report = Report::default();
        check_pending_adds(&dir, &mut report);
        let found: Vec<(Severity, &str)> = report
            .findings
            .iter()
            .map(|f| (f.severity, f.summary.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].0,
            Severity::Ok,
            "an ADD at the primary now is no finding"
        );
        assert!(found[0].1.contains("1 at the primary now"), "{found:?}");

        pending_add::save(&dir, &note("etcd2-0", now - 3600, 0, None)).unwrap();
        pending_add::save(&dir, &note("etcd3-0", now - 60, 2, None)).unwrap();
        pending_add::save(
            &dir,
            &note("etcd4-0", now - 60, 0, Some("another-boot".into())),
        )
        .unwrap();
        let mut report = Report::default();
        check_pending_adds(&dir, &mut report);
        let _ = std::fs::remove_dir_all(&dir);
        let found: Vec<(Severity, String)> = report
            .findings
            .iter()
            .map(|f| {
                (
                    f.severity,
                    format!("{} {}", f.summary, f.evidence.join("\n")),
                )
            })
            .collect();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found[0].0 == Severity::Warning
                && found[0].1.contains("cut-etcd3-0")
                && found[0].1.contains("datastore is locked"),
            "{found:?}"
        );
        assert!(
            found[1].0 == Severity::Info && found[1].1.contains("cut-etcd2-0"),
            "{found:?}"
        );
        assert!(
            found[2].0 == Severity::Info && found[2].1.contains("cut-etcd4-0"),
            "{found:?}"
        );
    }
}

/// The held DELs' kubeconfigs, each asked once per namespace (for a pod of the entry's, as
/// the plugin asks) however many entries name it; a failure that is not the API's refusal
/// (a timeout, no connection, a kubeconfig that cannot be used) is kept for the kubeconfig,
/// so an API that does not answer costs one bound per kubeconfig, not per namespace.
#[derive(Default)]
struct Answers {
    by_namespace: std::collections::BTreeMap<(std::path::PathBuf, String), Result<(), String>>,
    failed: std::collections::BTreeMap<std::path::PathBuf, String>,
}

impl Answers {
    fn probe(
        &mut self,
        kubeconfig: &Path,
        key: &crate::state::ownership::PodKey,
    ) -> Result<(), String> {
        if let Some(why) = self.failed.get(kubeconfig) {
            return Err(why.clone());
        }
        let slot = (kubeconfig.to_path_buf(), key.pod_namespace.clone());
        if let Some(answer) = self.by_namespace.get(&slot) {
            return answer.clone();
        }
        let answer = crate::tools::api::get_pod(&key.pod(), kubeconfig).map(|_| ());
        match &answer {
            Err(why) if !why.contains("HTTP 403") => {
                self.failed.insert(kubeconfig.to_path_buf(), why.clone());
            }
            _ => {
                self.by_namespace.insert(slot, answer.clone());
            }
        }
        answer
    }

    /// Why a held DEL's sweep can get no answer, or `None` when one of the kubeconfigs it
    /// would ask with answers, or the off sign lets it go: the one it was held with, or one a
    /// network here names.
    fn none_answers(
        &mut self,
        moved: &crate::state::held::MovedTo,
        key: &crate::state::ownership::PodKey,
        networks: &[std::path::PathBuf],
    ) -> Option<String> {
        let held_with = moved.held_with();
        let mut why = vec![match held_with {
            HeldWith::Gone => format!(
                "it was held with {}, which is gone",
                moved.kubeconfig.display()
            ),
            HeldWith::TurnedOff => format!(
                "it was held with {}, which holds the off sign, but a network here names another kubeconfig, which it asks instead",
                moved.kubeconfig.display()
            ),
            HeldWith::Present => match self.probe(&moved.kubeconfig, key) {
                Ok(()) => return None,
                Err(e) => format!(
                    "it was held with {}, with which the API server cannot be asked: {e}",
                    moved.kubeconfig.display()
                ),
            },
        }];
        let others: Vec<&std::path::PathBuf> = networks
            .iter()
            .filter(|k| **k != moved.kubeconfig)
            .filter(|k| crate::state::held::held_with_at(k) == HeldWith::Present)
            .collect();
        if held_with == HeldWith::TurnedOff && others.is_empty() {
            return None;
        }
        for other in others {
            match self.probe(other, key) {
                Ok(()) => return None,
                Err(e) => why.push(format!(
                    "nor with {}, a network's here: {e}",
                    other.display()
                )),
            }
        }
        if why.len() == 1 {
            why.push("and no network here names another kubeconfig".to_string());
        }
        Some(why.join("; "))
    }
}
