//! Delegate mode: the guard runs the primary itself (`cni::delegate`) and decides before
//! the primary sees a verb. Every verb of a pod key holds that key's lock (`PodLock`) while
//! the primary runs, never the store's.
//!
//! - ADD: refused if a newer live sandbox superseded this one; else the primary's ADD, then
//!   the checkpoint and the ownership as in chained mode, from the primary's result.
//! - DEL: stale, the primary is not called; the stale sandbox's interface is removed from its
//!   netns, the DEL kept as deferred and answered with success. Otherwise the primary's DEL,
//!   the guard's own, and then every deferred DEL of the keys it freed is replayed.
//! - CHECK, GC, STATUS: the primary's first, then the guard's own; GC also replays the
//!   deferred DELs of attachments the runtime no longer lists, whose key is free.

use serde_json::value::RawValue;

use super::Invocation;
use super::del::{Judgement, Stale};
use crate::cni::delegate::{Delegate, EnvOverride};
use crate::cni::env::Attachment;
use crate::cni::log::{CAUSE_STALE_DEL, CAUSE_SUPERSEDED, Level, Subject};
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::LinkFacts;
use crate::kernel::teardown::{self, Teardown};
use crate::state::checkpoint::{self, AttachmentId};
use crate::state::deferred::{self, DeferredDel};
use crate::state::ownership::{self, AddVerdict, Owner, PodKey};
use crate::state::pod_lock::PodLock;
use crate::state::{Loaded, Store, surely_absent};

pub fn add(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<String> {
    let id = inv.attachment_id(attachment);
    let key = inv.pod_key(attachment);
    let _lock = lock(inv, key.as_slice())?;
    if let Some(key) = &key {
        refuse_if_superseded(inv, attachment, &id, key)?;
    }
    let reply = pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
    let text = String::from_utf8(reply).map_err(|_| not_a_result(delegate, "it is not UTF-8"))?;
    let result = RawValue::from_string(text.trim().to_string()).map_err(|e| not_a_result(delegate, &e.to_string()))?;
    let result = crate::cni::result::versioned_as_libcni_reads_it(result, &inv.conf.cni_version);
    let output = super::add::checkpoint(inv, attachment, &result)?;
    if let Some(key) = &key {
        // Added again: a DEL of its earlier self kept for later would tear down this one.
        drop_own_deferred(inv, key, &id);
    }
    Ok(output)
}

pub fn del(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<()> {
    // The keys are read before the store's lock, so the pod locks come first (never the
    // other way round) and the store's lock is not held while the primary runs.
    let peek = Store::open_read_only(&inv.conf.state_dir).ok();
    let locked_keys = super::del::keys_of(inv, attachment, peek.as_ref());
    drop(peek);
    let _locks = match lock(inv, &locked_keys) {
        Ok(locks) => locks,
        // A store that takes no write (read-only, full) cannot make a lock file either; the
        // DEL goes on without one, as it does without writing (see `del::open`).
        Err(err) if err.kind != Kind::Busy => {
            eprintln!("sandbox-guard: DEL goes on without its pod lock: {err}");
            Vec::new()
        }
        Err(err) => return Err(err),
    };
    let Some((store, unwritable)) = super::del::open(inv)? else {
        super::del::nothing_recorded(inv, attachment);
        pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
        return Ok(());
    };
    let plan = match super::del::judge(inv, attachment, &store)? {
        Judgement::Stale(stale) => {
            if let Some(why) = unwritable {
                // Kept from the primary for good, it would leak; told nothing, the primary
                // would tear down the owner. Refused, as chained mode does, until the store
                // takes writes again.
                let err = super::del::refuse(inv, attachment, stale);
                return Err(err.with_details(format!("The DEL cannot be deferred: {} {}", why.msg, why.details)));
            }
            let deferred = defer(inv, attachment, &store, &stale)?;
            drop(store);
            return remove_stale_interface(inv, attachment, &deferred);
        }
        Judgement::Go(plan) => plan,
    };
    if plan.keys.iter().any(|key| !locked_keys.contains(key)) {
        return Err(GuardError::new(Kind::Busy, "the sandbox's record changed while its DEL waited for its pod lock")
            .with_details("The runtime retries the DEL."));
    }
    drop(store);
    pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
    let keys = plan.keys.clone();
    let id = plan.id.clone();
    if let Some((store, unwritable)) = super::del::open(inv)? {
        super::del::finish(inv, attachment, &store, unwritable, plan);
    }
    for key in &keys {
        // The primary has just had this sandbox's own DEL.
        drop_own_deferred(inv, key, &id);
        replay(inv, delegate, key);
    }
    Ok(())
}

pub fn check(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<()> {
    let _lock = lock(inv, inv.pod_key(attachment).as_slice())?;
    pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
    super::check::run(inv, attachment)
}

pub fn gc(inv: &Invocation, delegate: &Delegate) -> Result<()> {
    pass_on(inv, delegate, None)?;
    super::gc::run(inv)?;
    replay_collected(inv, delegate);
    Ok(())
}

pub fn status(inv: &Invocation, delegate: &Delegate) -> Result<()> {
    pass_on(inv, delegate, None).map_err(|err| match err.kind {
        // The primary's own STATUS error goes as it wrote it; not being able to run it at all
        // means the network cannot serve ADDs either.
        Kind::Delegate(_) => err,
        _ => GuardError::new(Kind::NotAvailable, format!("the primary plugin cannot be run: {}", err.msg)).with_details(err.details),
    })?;
    super::status::run(inv)
}

/// Runs the primary for this very invocation: the runtime's own `CNI_*` environment.
fn pass_on(inv: &Invocation, delegate: &Delegate, prev_result: Option<&RawValue>) -> Result<Vec<u8>> {
    delegate.call(&inv.conf.network, &inv.conf.cni_version, prev_result, &EnvOverride::default())
}

/// The pod locks of `keys`, in one order for every process, so two never wait on each other.
fn lock(inv: &Invocation, keys: &[PodKey]) -> Result<Vec<PodLock>> {
    let mut sorted: Vec<&PodKey> = keys.iter().collect();
    sorted.sort_by_key(|key| key.digest());
    sorted.into_iter().map(|key| PodLock::acquire(&inv.conf.state_dir, key, inv.conf.pod_lock_timeout)).collect()
}

fn not_a_result(delegate: &Delegate, why: &str) -> GuardError {
    GuardError::new(Kind::Decode, format!("the delegate {} answered ADD with something that is not a CNI result: {why}", delegate.plugin_type))
        .with_details("The primary set the pod up but its result cannot be read; the runtime's cleanup DEL reaches it.")
}

fn refuse_if_superseded(inv: &Invocation, attachment: &Attachment, id: &AttachmentId, key: &PodKey) -> Result<()> {
    if surely_absent(&inv.conf.state_dir) {
        return Ok(());
    }
    let store = Store::open_read_only(&inv.conf.state_dir)?;
    let _read = store.read_lock(inv.conf.lock_timeout, &|_| {})?;
    let Loaded::Valid(owner) = store.load_owner(key)? else { return Ok(()) };
    let own_generation = match store.load_record(id)? {
        Loaded::Valid(record) => Some(record.generation),
        _ => None,
    };
    let deferred = !surely_absent(&store.deferred_path(key, id));
    let found = Owner { ownership: &owner, backed: owner.container_id == id.container_id || store.owner_is_backed(&owner) };
    let owner_alive = netns_alive(&store, &owner);
    let AddVerdict::Superseded { owner } = ownership::judge_add(&id.container_id, own_generation, deferred, Some(found), owner_alive) else {
        return Ok(());
    };
    let why = if deferred { "this sandbox's DEL was deferred" } else { "it took the pod's name after this sandbox did" };
    let err = GuardError::new(
        Kind::Superseded,
        format!("ADD refused: sandbox {} of pod {} ({}) was superseded by sandbox {}", crate::names::short_id(&id.container_id), key.pod(), key.if_name, owner.container_id),
    )
    .with_details(format!(
        "Sandbox {} (generation {}) owns the pod, its netns is alive, and {why}; adding this one would hand the pod's name back to an old \
         sandbox. The runtime creates a new sandbox. If {} is in fact dead, stop and remove it first.",
        owner.container_id, owner.generation, owner.container_id
    ));
    let subject = inv.subject(Some(attachment), Some(key.pod()));
    inv.log.event_with(Level::Warn, inv.verb, &subject, "refused", &[("cause", CAUSE_SUPERSEDED), ("owner", &owner.container_id)], &err.msg);
    Err(err)
}

/// Whether the owner's netns still exists; when its record cannot say, it is taken as alive.
fn netns_alive(store: &Store, owner: &crate::state::ownership::Ownership) -> bool {
    match store.load_record(&AttachmentId::of(&owner.key, &owner.container_id)) {
        Ok(Loaded::Valid(record)) => crate::kernel::netns::netns_state(&record.netns, None, None).is_alive(),
        _ => true,
    }
}

/// Keeps the stale DEL for the primary (durably, before it is answered) and forgets the
/// stale sandbox's record: the runtime has torn it down. Answered again (the runtime's
/// second DEL), the first entry stays as it was.
fn defer(inv: &Invocation, attachment: &Attachment, store: &Store, stale: &Stale) -> Result<DeferredDel> {
    let id = inv.attachment_id(attachment);
    let record = store.load_record(&id)?;
    let deferred = match store.load_deferred(&stale.key, &id)? {
        Loaded::Valid(entry) => entry,
        _ => {
            let entry = new_entry(inv, attachment, stale, &record);
            store.save_deferred(&entry)?;
            entry
        }
    };
    match record {
        Loaded::Valid(_) => store.remove_record(&id)?,
        Loaded::Corrupt { path, .. } => {
            store.keep_copy(&path, &store.set_aside_path_for_record(&id))?;
            store.remove_record(&id)?;
        }
        Loaded::Missing => {}
    }
    store.remove_failed_add(&id)?;
    super::del::note_in_ledger(store, &stale.key, crate::state::ledger::Handled::Deferred, &attachment.container_id, &stale.owner);
    store.sync()?;
    Ok(deferred)
}

fn new_entry(inv: &Invocation, attachment: &Attachment, stale: &Stale, record: &Loaded<checkpoint::Checkpoint>) -> DeferredDel {
    let record = match record {
        Loaded::Valid(record) => Some(record),
        _ => None,
    };
    let prev_result = record.map(|r| r.prev_result.clone()).or_else(|| inv.conf.prev_result.clone());
    let netns = match (attachment.netns.as_str(), record) {
        ("", Some(record)) => record.netns.clone(),
        (netns, _) => netns.to_string(),
    };
    let observed = record.and_then(|r| match &r.links {
        Some(LinkFacts::Observed(facts)) => facts.mac.clone(),
        _ => None,
    });
    // Else the MAC the result gives the interface inside a sandbox.
    let mac = observed.or_else(|| {
        let view = crate::cni::result::ResultView::parse(prev_result.as_deref()?).ok()?;
        view.interfaces.into_iter().find(|i| i.name == attachment.ifname && i.sandbox.is_some()).and_then(|i| i.mac)
    });
    DeferredDel {
        key: stale.key.clone(),
        container_id: attachment.container_id.clone(),
        pod_uid: attachment.pod.uid.clone().or_else(|| record.and_then(|r| r.pod_uid.clone())),
        cni_args: attachment.args.clone(),
        cni_version: record.map_or_else(|| inv.conf.cni_version.clone(), |r| r.cni_version.clone()),
        prev_result,
        netns,
        mac,
        owner: stale.owner.container_id.clone(),
        deferred_at: crate::clock::now_rfc3339(),
        deferred_at_ns: crate::clock::unix_nanos(),
        attempts: 0,
        last_error: None,
        last_attempt_at: None,
    }
}

/// Takes the stale sandbox's interface out of its netns, if it is the one checkpointed, and
/// logs the deferral. A failure fails the DEL (the entry is kept): the runtime's retry tries
/// again, so the old netns does not go on answering for the pod's address.
fn remove_stale_interface(inv: &Invocation, attachment: &Attachment, deferred: &DeferredDel) -> Result<()> {
    let netns = if attachment.netns.is_empty() { deferred.netns.as_str() } else { attachment.netns.as_str() };
    let done = match deferred.mac.as_deref() {
        None => Ok("no MAC of its interface is known, so nothing was removed from its netns".to_string()),
        Some(mac) => teardown::remove_interface(netns, &attachment.ifname, mac).map(|outcome| match outcome {
            Teardown::Removed => format!("removed {} ({mac}) from its netns {netns}", attachment.ifname),
            Teardown::Absent => "its interface is gone already".to_string(),
            Teardown::OtherMac(other) => format!("{} in {netns} has MAC {other}, not {mac}: left alone", attachment.ifname),
        }),
    };
    let subject = inv.subject(Some(attachment), Some(deferred.key.pod()));
    let fields = [("cause", CAUSE_STALE_DEL), ("owner", deferred.owner.as_str())];
    match done {
        Ok(text) => {
            inv.log.event_with(Level::Warn, inv.verb, &subject, "deferred", &fields, &format!(
                "stale DEL deferred: pod {} belongs to sandbox {}; the primary gets this DEL once it is free; {text}",
                deferred.key.pod(), deferred.owner
            ));
            Ok(())
        }
        Err(err) => {
            inv.log.event_with(Level::Error, inv.verb, &subject, "deferred", &fields, &format!("stale DEL deferred, but its interface could not be removed: {}", err.msg));
            Err(GuardError::new(err.kind, format!("stale DEL deferred, but {} could not be removed from {netns}: {}", attachment.ifname, err.msg))
                .with_details("The old netns may still answer for the pod's address. The runtime's retry tries again."))
        }
    }
}

fn drop_own_deferred(inv: &Invocation, key: &PodKey, id: &AttachmentId) {
    let path = deferred::key_dir(&inv.conf.state_dir, &key.digest()).join(id.file_name());
    if surely_absent(&path) {
        return;
    }
    let removed = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout).and_then(|store| store.remove_deferred(key, id));
    if let Err(err) = removed {
        eprintln!("sandbox-guard: the deferred DEL of {} could not be removed: {err}", id.container_id);
    }
}

/// Replays the deferred DELs of `key`, oldest first, if nobody owns it. The caller holds the
/// key's pod lock, so no ADD can take it meanwhile. Never fails the verb that frees the key:
/// a replay the primary refuses stays deferred for the next release of the key or GC.
fn replay(inv: &Invocation, delegate: &Delegate, key: &PodKey) {
    // Most DELs free a key nobody deferred anything for: one stat, no lock.
    if surely_absent(&deferred::key_dir(&inv.conf.state_dir, &key.digest())) {
        return;
    }
    let pending = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout).and_then(|store| {
        let owner = match store.load_owner(key)? {
            Loaded::Valid(owner) => Some(owner),
            Loaded::Missing => None,
            Loaded::Corrupt { .. } => return Ok(Vec::new()),
        };
        let found = owner.as_ref().map(|o| Owner { ownership: o, backed: store.owner_is_backed(o) });
        if !ownership::may_replay(found) {
            return Ok(Vec::new());
        }
        Ok(store.deferred_of(key)?.into_iter().filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(entry) => Some(entry),
            _ => None,
        }).collect())
    });
    let pending = match pending {
        Ok(pending) => pending,
        Err(err) => {
            eprintln!("sandbox-guard: the deferred DELs of pod {} wait: {err}", key.pod());
            return;
        }
    };
    for mut entry in pending {
        let prev_result = entry.prev_result.as_deref().and_then(|raw| crate::cni::result::as_version(raw, &inv.conf.cni_version).ok());
        let prev_result = prev_result.and_then(|text| RawValue::from_string(text.into_owned()).ok());
        let env = EnvOverride {
            command: Some("DEL"),
            container_id: Some(&entry.container_id),
            netns: Some(""),
            if_name: Some(&entry.key.if_name),
            args: Some(&entry.cni_args),
        };
        let outcome = delegate.call(&inv.conf.network, &inv.conf.cni_version, prev_result.as_deref(), &env);
        let subject = Subject { network: &inv.conf.network, container_id: &entry.container_id, if_name: &entry.key.if_name, pod: Some(key.pod()) };
        let store = match Store::open(&inv.conf.state_dir, inv.conf.lock_timeout) {
            Ok(store) => store,
            Err(err) => {
                eprintln!("sandbox-guard: the replayed DEL of {} could not be recorded: {err}", entry.container_id);
                return;
            }
        };
        let id = entry.id();
        match outcome {
            Ok(_) => {
                let removed = store.remove_deferred(key, &id);
                let note = removed.err().map(|e| format!("; its entry could not be removed ({}), so it is replayed again later", e.msg));
                inv.log.event(Level::Info, inv.verb, &subject, "replayed", &format!(
                    "the deferred DEL (since {}) reached the primary{}", entry.deferred_at, note.unwrap_or_default()
                ));
            }
            Err(err) => {
                entry.attempts += 1;
                entry.last_error = Some(crate::names::shorten(&err.msg));
                entry.last_attempt_at = Some(crate::clock::now_rfc3339());
                let _ = store.save_deferred(&entry);
                inv.log.event(Level::Warn, inv.verb, &subject, "replay-failed", &format!(
                    "the primary refused the deferred DEL (attempt {}): {}; it stays deferred until the next release of the pod or GC",
                    entry.attempts, err.msg
                ));
            }
        }
    }
}

/// GC's replays: the deferred DELs of attachments the runtime no longer lists, per key, when
/// the key's pod lock is free now (GC never waits behind a pod); then the lock files of keys
/// nobody owns or waits on.
fn replay_collected(inv: &Invocation, delegate: &Delegate) {
    let listed = |entry: &DeferredDel| {
        inv.conf.valid_attachments.iter().flatten().any(|v| v.container_id == entry.container_id && v.ifname == entry.key.if_name)
    };
    let mut keys: Vec<PodKey> = match Store::open_read_only(&inv.conf.state_dir).and_then(|store| store.list_deferred()) {
        Ok(all) => all
            .into_iter()
            .filter_map(|(_, loaded)| match loaded {
                Loaded::Valid(entry) if entry.key.network == inv.conf.network && !listed(&entry) => Some(entry.key),
                _ => None,
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    keys.sort_by_key(PodKey::digest);
    keys.dedup();
    for key in &keys {
        if let Ok(Some(_lock)) = PodLock::try_acquire(&inv.conf.state_dir, key) {
            replay(inv, delegate, key);
        }
    }
    if let Ok(store) = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout) {
        store.remove_unused_pod_locks();
    }
}
