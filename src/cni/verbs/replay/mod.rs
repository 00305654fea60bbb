//! Delegate mode's replay engine: hands the deferred DELs of a free pod key to the primary
//! (`replay_key`), and finds the keys that are free (`sweep`). The worker process
//! (`worker`) runs it, off every pod's critical path; the verbs only start the worker.

pub mod worker;

use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::pending;
use crate::cni::delegate::{Delegate, EnvOverride};
use crate::cni::invocation::Invocation;
use crate::cni::log::{CAUSE_SLOW_PRIMARY, Level, Outcome, Subject};
use crate::error::{Kind, Result};
use crate::state::boot::LiveFolders;
use crate::state::deferred::{self, DeferredDel};
use crate::state::ownership::{self, Owner, PodKey};
use crate::state::pod_lock::PodLock;
use crate::state::{Loaded, Store, surely_absent};

/// A replay the primary refused is tried again by a sweep only after 2^attempts seconds, at
/// most this long, so a failing primary is not run again and again. One that ran out of its
/// time (slow or hung) holds its pod's lock for all of it: it waits this long at once.
const SWEEP_RETRY_MAX: Duration = Duration::from_secs(60);

fn sweep_retry_after(entry: &DeferredDel) -> Duration {
    if entry.hung {
        return SWEEP_RETRY_MAX;
    }
    Duration::from_secs(1u64 << entry.attempts.min(6)).min(SWEEP_RETRY_MAX)
}

/// Replays the deferred DELs of the key whose `lock` is held, oldest first, while nobody owns
/// it and `until` has not come; each primary run gets `replayTimeoutSeconds`. Between two,
/// the lock is let go and taken again if free, so a waiting ADD of the pod goes first (and
/// the rest wait for its sandbox to go). Never fails: a replay the primary refuses, or that
/// runs out of time, stays deferred for the next chance. `sweeping`: skip entries whose
/// back-off is not over (`sweep_retry_after`, on the boot clock).
pub fn replay_key(
    inv: &Invocation,
    delegate: &Delegate,
    lock: PodLock,
    sweeping: bool,
    until: Instant,
) {
    let root = &inv.conf.state_dir;
    let Some(first) = entry_of(root, lock.digest(), &inv.conf.network) else {
        lock.release_unused(root);
        return;
    };
    let key = first.key;
    let boot_id = crate::clock::boot_id();
    let mut tried = std::collections::HashSet::new();
    // Asked once per call: whether the API still shows the name on the pod a held entry waits
    // for (rule 7). While it does, none of the key's entries is replayed: any DEL of the name
    // would free what that pod holds in a primary keyed across the cluster.
    let mut api_asked = false;
    // With no held entry: asked once, before the first due replay (`replay_waits`).
    let mut asks_for_all = false;
    let mut held = Some(lock);
    while let Some(lock) = held.take() {
        // An ADD of the pod cut off while the lock was let go is rolled back first.
        if let Err(err) = pending::resolve(inv, delegate, &key, pending::NextVerb::Other) {
            stderr_line!(
                "sandbox-guard: the deferred DELs of pod {} wait: {err}",
                key.pod()
            );
            return;
        }
        let pending = match due_entries(inv, &key) {
            Ok(pending) => pending,
            Err(err) => {
                stderr_line!(
                    "sandbox-guard: the deferred DELs of pod {} wait: {err}",
                    key.pod()
                );
                return;
            }
        };
        if !api_asked {
            api_asked = true;
            // Each kubeconfig the key's DELs were held with is asked: one that says the view
            // is off must not release a DEL another still holds.
            let mut by_kubeconfig = std::collections::BTreeMap::new();
            for entry in &pending {
                if let Some(moved) = &entry.moved_to {
                    by_kubeconfig
                        .entry(moved.kubeconfig.as_path())
                        .or_insert(entry);
                }
            }
            if by_kubeconfig
                .values()
                .any(|entry| super::api_check::still_moved(inv, entry))
            {
                lock.release_unused(root);
                return;
            }
            asks_for_all = by_kubeconfig.is_empty();
        }
        let pending_uids: Vec<String> = pending.iter().filter_map(|e| e.pod_uid.clone()).collect();
        let now = crate::clock::boot_nanos();
        let next = pending.into_iter().find(|entry| {
            !tried.contains(&entry.id().file_name())
                && (!sweeping || entry.retry_due(sweep_retry_after(entry), now, boot_id.as_deref()))
        });
        let Some(entry) = next else {
            lock.release_unused(root);
            return;
        };
        // An operator command waiting for `replay.lock` goes before the next replay.
        if Instant::now() >= until || crate::state::replays_awaited(root) {
            return;
        }
        if asks_for_all {
            asks_for_all = false;
            let uids: Vec<&str> = pending_uids.iter().map(String::as_str).collect();
            if super::api_check::replay_waits(inv, &key, &uids) {
                lock.release_unused(root);
                return;
            }
        }
        tried.insert(entry.id().file_name());
        if !replay_one(inv, delegate, entry) {
            return;
        }
        drop(lock);
        held = PodLock::try_acquire(root, &key).ok().flatten();
    }
}

/// The deferred DELs of `key`, oldest first, when nobody owns it (`ownership::may_replay`).
fn due_entries(inv: &Invocation, key: &PodKey) -> Result<Vec<DeferredDel>> {
    if surely_absent(&deferred::key_dir(&inv.conf.state_dir, &key.digest())) {
        return Ok(Vec::new());
    }
    let store = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout)?;
    let owner = match store.load_owner(key)? {
        Loaded::Valid(owner) => Some(owner),
        Loaded::Missing => None,
        Loaded::Corrupt { .. } => return Ok(Vec::new()),
    };
    let found = owner.as_ref().map(|o| Owner {
        ownership: o,
        backed: store.owner_is_backed(o),
    });
    if !ownership::may_replay(found) {
        return Ok(Vec::new());
    }
    Ok(store
        .deferred_of(key)?
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(entry) => Some(entry),
            _ => None,
        })
        .collect())
}

/// One deferred DEL to the primary, as the stale sandbox's own call: its recorded primary
/// object (its own `runtimeConfig`, no GC list) and network version, its `CNI_ARGS`, an
/// empty `CNI_NETNS` and its result as `prevResult` where the version has one on DEL
/// (0.4.0 on; libcni sends none below). Returns whether the store could note the outcome.
fn replay_one(inv: &Invocation, current: &Delegate, mut entry: DeferredDel) -> bool {
    if pending::answered_by_rollback(inv, &entry) {
        return true;
    }
    let recorded = entry.delegate.clone().map(Delegate::from_recorded);
    let delegate = match recorded {
        Some(Ok(recorded)) => recorded,
        // An entry of an earlier release: the primary as configured now, with nothing of
        // this call's own (its runtimeConfig, a GC list) that was never the stale sandbox's.
        _ => current.without_call_settings(),
    };
    let version = entry
        .conf_version
        .clone()
        .unwrap_or_else(|| inv.conf.cni_version.clone());
    let prev_result = entry
        .prev_result
        .as_deref()
        .filter(|_| crate::cni::version::at_least(&version, "0.4.0"))
        .and_then(|raw| crate::cni::result::as_version(raw, &version).ok())
        .and_then(|text| RawValue::from_string(text.into_owned()).ok());
    let env = EnvOverride {
        command: Some("DEL"),
        container_id: Some(&entry.container_id),
        netns: Some(""),
        if_name: Some(entry.if_name()),
        args: Some(&entry.cni_args),
        pid_file: None,
        marker: None,
    };
    let started = Instant::now();
    let deadline = started + inv.conf.replay_timeout;
    let outcome = delegate.call_within(
        &entry.key.network,
        &version,
        prev_result.as_deref(),
        &env,
        Some(deadline),
    );
    let took = started.elapsed();
    let if_name = entry.if_name().to_string();
    let subject = Subject {
        network: &entry.key.network,
        container_id: &entry.container_id,
        if_name: &if_name,
        pod: Some(entry.key.pod()),
    };
    let store = match Store::open(&inv.conf.state_dir, inv.conf.lock_timeout) {
        Ok(store) => store,
        Err(err) => {
            stderr_line!(
                "sandbox-guard: the replayed DEL of {} could not be recorded: {err}",
                entry.container_id
            );
            return false;
        }
    };
    let id = entry.id();
    match outcome {
        Ok(_) => {
            let removed = store.remove_deferred(&entry.key, &id);
            let note = removed.err().map(|e| {
                format!(
                    "; its entry could not be removed ({}), so it is replayed again later",
                    e.msg
                )
            });
            // Slow but working: the doctor's "slow", not "broken", reads this in the log.
            let slow = took * 2 >= inv.conf.replay_timeout;
            let fields: &[(&str, &str)] = if slow {
                &[("cause", CAUSE_SLOW_PRIMARY)]
            } else {
                &[]
            };
            inv.log.event_with(
                if slow { Level::Warn } else { Level::Info },
                inv.verb,
                &subject,
                Outcome::Replayed,
                fields,
                &format!(
                    "the deferred DEL (since {}) reached the primary in {:.1}s{}{}",
                    entry.deferred_at,
                    took.as_secs_f64(),
                    if slow {
                        format!(
                            ", more than half of replayTimeoutSeconds ({}s): the primary is slow",
                            inv.conf.replay_timeout.as_secs_f64()
                        )
                    } else {
                        String::new()
                    },
                    note.unwrap_or_default()
                ),
            );
        }
        Err(err) => {
            entry.attempts += 1;
            entry.last_error = Some(crate::names::shorten(&err.msg));
            entry.last_attempt_at = Some(crate::clock::now_rfc3339());
            entry.last_attempt_ns = Some(crate::clock::unix_nanos());
            entry.last_attempt_boot_ns = Some(crate::clock::boot_nanos());
            entry.boot_id = crate::clock::boot_id();
            entry.last_replay_seconds = Some((took.as_secs_f64() * 10.0).round() / 10.0);
            // Killed at its deadline while the primary still ran: slow or hung, not refused.
            entry.hung = err.kind == Kind::DelegateBroken && Instant::now() >= deadline;
            let saved = store.save_deferred(&entry);
            let how = if entry.hung {
                format!(
                    "the primary did not finish the deferred DEL within replayTimeoutSeconds ({}s) and was killed (attempt {})",
                    inv.conf.replay_timeout.as_secs_f64(),
                    entry.attempts
                )
            } else {
                format!(
                    "the primary refused the deferred DEL (attempt {}): {}",
                    entry.attempts, err.msg
                )
            };
            inv.log.event(Level::Warn, inv.verb, &subject, Outcome::ReplayFailed, &format!(
                "{how}; it stays deferred and is tried again after {}s by the node's replay worker{}",
                sweep_retry_after(&entry).as_secs(),
                saved.err().map(|e| format!(" (its back-off could not be saved: {})", e.msg)).unwrap_or_default()
            ));
        }
    }
    true
}

/// Replays, until `until`, the deferred DELs whose pod's name is free, so that none waits
/// for its pod to come back to the node (containerd sends no GC). Run by the replay worker,
/// one per node at a time. A key whose owner file exists is skipped without a lock, one
/// whose pod lock is held is skipped too (never waited for). Entries of other networks are
/// replayed with the primary object they recorded (a renamed network's too), when the pod is
/// free under this network's name as well (`free_here`); those of an earlier release only by
/// a worker of their own network. `backing_off`: skip entries whose back-off is not over
/// (all but GC's sweep).
pub fn sweep(inv: &Invocation, delegate: &Delegate, until: Instant, backing_off: bool) {
    let root = &inv.conf.state_dir;
    roll_back_cut_off_adds(inv, delegate, until);
    let Ok(dirs) = std::fs::read_dir(root.join(deferred::DEFERRED)) else {
        return;
    };
    // The verbs' view for the quick skip below, opened again only while no writer has entered
    // this boot (then it sees no owner at all); `replay_key` judges each key again under its
    // pod lock, in a store of its own.
    let mut view: Option<Store> = None;
    let mut digests: Vec<String> = dirs
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    // A different start each time: a key that keeps failing does not starve the others.
    if !digests.is_empty() {
        let start = (crate::clock::unix_nanos() % digests.len() as u128) as usize;
        digests.rotate_left(start);
    }
    for digest in digests {
        if Instant::now() >= until || crate::state::replays_awaited(root) {
            return;
        }
        if view
            .as_ref()
            .is_none_or(|store| matches!(store.live_folders(), LiveFolders::Previous(_)))
        {
            view = Store::open_read_only(root).ok();
        }
        if view.as_ref().is_none_or(|store| store.owns(&digest)) {
            continue;
        }
        let Some(entry) = entry_of(root, &digest, &inv.conf.network) else {
            continue;
        };
        let Ok(Some(lock)) = PodLock::try_acquire(root, &entry.key) else {
            continue;
        };
        let here = if entry.key.network == inv.conf.network {
            None
        } else {
            match free_here(inv, delegate, &entry) {
                Some(lock) => Some(lock),
                None => continue,
            }
        };
        // A key whose last entry was replayed is gone: so is its lock file (containerd
        // sends no GC to remove it later). The same for the lock taken to keep this
        // network's ADD of the pod out meanwhile.
        replay_key(inv, delegate, lock, backing_off, until);
        if let Some(lock) = here {
            lock.release_unused(root);
        }
    }
}

/// Rolls back the ADDs of this network cut off at the primary whose pod lock is free now
/// (`pending`): an ADD in flight holds its lock, so its note is skipped.
fn roll_back_cut_off_adds(inv: &Invocation, delegate: &Delegate, until: Instant) {
    let root = &inv.conf.state_dir;
    for digest in crate::state::pending_add::digests(root) {
        if Instant::now() >= until {
            return;
        }
        let Ok(Loaded::Valid(note)) = crate::state::pending_add::load(root, &digest) else {
            continue;
        };
        if note.key.network != inv.conf.network || note.key.digest() != digest {
            continue;
        }
        let Ok(Some(lock)) = PodLock::try_acquire(root, &note.key) else {
            continue;
        };
        if let Err(err) = pending::resolve(inv, delegate, &note.key, pending::NextVerb::Other) {
            stderr_line!("sandbox-guard: {err}");
        }
        lock.release_unused(root);
    }
}

/// For an entry of another network (a renamed one): the lock of the same pod under this
/// network's name, when that name is free and the entry recorded this network's primary.
/// The primaries this mode exists for key their state by the pod's name, not the network's:
/// a replay while a sandbox of the pod lives under the new name would tear that one down,
/// and holding the lock keeps its ADD from starting meanwhile. A primary of another type
/// leaves the entry to a verb of a network that has its type.
fn free_here(inv: &Invocation, delegate: &Delegate, entry: &DeferredDel) -> Option<PodLock> {
    let recorded_type = entry
        .delegate
        .as_ref()?
        .get("type")
        .and_then(serde_json::Value::as_str);
    if recorded_type != Some(delegate.plugin_type.as_str()) {
        return None;
    }
    let here = inv.conf.pod_key.key(
        &inv.conf.network,
        &entry.key.pod_namespace,
        &entry.key.pod_name,
        entry.if_name(),
    );
    let lock = PodLock::try_acquire(&inv.conf.state_dir, &here).ok()??;
    if deferred::owned(&inv.conf.state_dir, &here.digest()) {
        lock.release_unused(&inv.conf.state_dir);
        return None;
    }
    Some(lock)
}

/// The first entry of a deferred folder, if the sweep may replay its key: one that recorded
/// its primary, or one of `network`.
fn entry_of(root: &std::path::Path, digest: &str, network: &str) -> Option<DeferredDel> {
    let entries = std::fs::read_dir(deferred::key_dir(root, digest)).ok()?;
    for path in entries.flatten().map(|e| e.path()) {
        if let Loaded::Valid(entry) = crate::state::read_for_listing::<DeferredDel>(&path)
            && entry.key.digest() == digest
            && (entry.delegate.is_some() || entry.key.network == network)
        {
            return Some(entry);
        }
    }
    None
}
