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
//!   deferred DELs of attachments the runtime no longer lists, whose key is free. GC goes on
//!   after the primary's GC error and returns it after its own work, as libcni does.
//! - Replays run in the replay worker (`replay::worker`), off every pod's critical path: the
//!   DEL that frees a pod key hands it that key's lock and waits a moment at most; every ADD,
//!   DEL and GC starts a sweep of the deferred DELs whose pod's name is free when none runs
//!   (one directory read when any wait), so none waits for its pod to come back to the node;
//!   so does a STATUS, at most once a minute (the runtime asks for it every few seconds).
//!   Each primary run gets `replayTimeoutSeconds`, then is killed with its process group.

use serde_json::value::RawValue;

use super::Invocation;
use super::api_check::{self, Rule7};
use super::judgement::{self, Judgement, Stale};
use super::old_interface;
use super::pending;
use super::replay::worker;
use crate::cni::config::StaleDelPolicy;
use crate::cni::delegate::{Delegate, EnvOverride};
use crate::cni::env::Attachment;
use crate::cni::log::{CAUSE_STALE_DEL, CAUSE_SUPERSEDED, Level, Outcome};
use crate::error::{GuardError, Kind, Result};
use crate::state::checkpoint::{self, AttachmentId};
use crate::state::deferred::{self, DeferredDel};
use crate::state::ownership::{self, AddVerdict, Owner, PodKey};
use crate::state::pod_lock::PodLock;
use crate::state::{Loaded, Store, surely_absent};

pub fn add(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<String> {
    let key = inv.pod_key(attachment);
    let locks = lock(inv, key.as_slice())?;
    let added = resolve_pending(inv, delegate, key.as_slice(), pending::NextVerb::Other)
        .and_then(|()| add_locked(inv, delegate, attachment, key.as_ref()));
    // A failed ADD took no key: its lock file goes unless someone owns the pod.
    for lock in locks {
        if added.is_err() {
            lock.release_unused(&inv.conf.state_dir);
        }
    }
    if added.is_ok() {
        worker::start(inv, delegate, Vec::new(), false);
    }
    added
}

fn add_locked(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    key: Option<&PodKey>,
) -> Result<String> {
    let id = inv.attachment_id(attachment);
    if let Some(key) = key {
        refuse_if_superseded(inv, attachment, &id, key)?;
        api_check::refuse_late_add(inv, attachment, key)?;
    }
    refuse_if_unwritable(inv, attachment)?;
    let Some(key) = key else {
        return run_and_checkpoint(inv, delegate, attachment, None, None);
    };
    let noted = pending::note(inv, delegate, attachment, key);
    let added = run_and_checkpoint(inv, delegate, attachment, Some(key), noted.as_ref());
    // A primary killed because the runtime is gone left what it had made: the note stays,
    // as when the runtime's kill ends us, and the pod's next verb rolls that back.
    let cut_off = matches!(&added, Err(err) if err.kind == Kind::Unheard);
    if noted.is_some() && !cut_off {
        pending::clear(inv, key);
    }
    let output = added?;
    // Added again: a DEL of its earlier self kept for later would tear down this one.
    drop_own_deferred(inv, key, &id);
    Ok(output)
}

/// The primary's ADD and, from its result, the checkpoint and the ownership.
fn run_and_checkpoint(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    key: Option<&PodKey>,
    noted: Option<&pending::Noted>,
) -> Result<String> {
    let id = inv.attachment_id(attachment);
    let env = EnvOverride {
        pid_file: noted.map(|n| n.pid_file.as_path()),
        marker: noted.map(|n| n.nonce.as_str()),
        ..EnvOverride::default()
    };
    let reply = delegate.call(
        &inv.conf.network,
        &inv.conf.cni_version,
        inv.conf.prev_result.as_deref(),
        &env,
    )?;
    let not_a_result = |why: &str| {
        let owner = key.and_then(|key| owner_other_than(inv, key, &id.container_id));
        not_a_result(delegate, why, owner.as_deref())
    };
    let text = String::from_utf8(reply).map_err(|_| not_a_result("it is not UTF-8"))?;
    let result =
        RawValue::from_string(text.trim().to_string()).map_err(|e| not_a_result(&e.to_string()))?;
    let result = crate::cni::result::versioned_as_libcni_reads_it(result, &inv.conf.cni_version);
    super::add::checkpoint(inv, attachment, &result)
}

/// Rolls back a cut-off ADD of each of `keys`, whose locks the caller holds (`pending`).
/// `verb`: the verb that takes them.
fn resolve_pending(
    inv: &Invocation,
    delegate: &Delegate,
    keys: &[PodKey],
    verb: pending::NextVerb,
) -> Result<()> {
    keys.iter()
        .try_for_each(|key| pending::resolve(inv, delegate, key, verb))
}

/// The primary must not set up a pod the guard then cannot record: without its checkpoint
/// the pod would run unprotected, and the runtime's cleanup DEL of it would reach a primary
/// that never had its ADD's pod name to itself. Refused (code 5) before the primary runs.
fn refuse_if_unwritable(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    // No lock needed: a probe file of our own, written and removed (no fsync: a full or
    // read-only filesystem refuses the write itself).
    let probed = crate::state::ensure_dir(&inv.conf.state_dir)
        .and_then(|()| crate::state::probe_write(&inv.conf.state_dir, false));
    match probed {
        Err(err) if matches!(err.kind, Kind::Io | Kind::ReadOnly) => {
            let err = GuardError::new(err.kind, format!(
                "ADD refused before the primary ran: the state dir {} takes no write ({})", inv.conf.state_dir.display(), err.msg
            ))
            .with_details(format!(
                "Without its checkpoint the guard could not tell this pod's DELs from stale ones. {} The runtime retries the ADD.",
                err.details
            ));
            crate::state::failed_add::mark(
                &inv.conf.state_dir,
                &inv.attachment_id(attachment),
                &err,
            );
            Err(err)
        }
        _ => Ok(()),
    }
}

/// The sandbox other than `container_id` that owns `key`, if any.
fn owner_other_than(inv: &Invocation, key: &PodKey, container_id: &str) -> Option<String> {
    let store = Store::open_read_only(&inv.conf.state_dir).ok()?;
    match store.load_owner(key).ok()? {
        Loaded::Valid(owner) if owner.container_id != container_id => Some(owner.container_id),
        _ => None,
    }
}

pub fn del(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<()> {
    // The keys are read before the store's lock, so the pod locks come first (never the
    // other way round) and the store's lock is not held while the primary runs.
    let peek = Store::open_read_only(&inv.conf.state_dir).ok();
    let locked_keys = judgement::keys_of(inv, attachment, peek.as_ref());
    drop(peek);
    let locks = match lock(inv, &locked_keys) {
        Ok(locks) => locks,
        // A store that takes no write (read-only, full) cannot make a lock file either; the
        // DEL goes on without one, as it does without writing (see `judgement::open`).
        Err(err) if err.kind != Kind::Busy => {
            stderr_line!("sandbox-guard: DEL goes on without its pod lock: {err}");
            Vec::new()
        }
        Err(err) => return Err(err),
    };
    let outcome = if locks.is_empty() {
        del_locked(inv, delegate, attachment, &locked_keys)
    } else {
        resolve_pending(
            inv,
            delegate,
            &locked_keys,
            pending::NextVerb::Del(&attachment.container_id),
        )
        .and_then(|()| del_locked(inv, delegate, attachment, &locked_keys))
    };
    // The freed keys' locks go to the replay worker with their deferred DELs; the others'
    // files go unless someone owns the pod or a deferred DEL waits on it, whatever the
    // outcome (a DEL the primary refused included).
    let root = &inv.conf.state_dir;
    let mut handed = Vec::new();
    for lock in locks {
        let waiting = !surely_absent(&deferred::key_dir(root, lock.digest()));
        if matches!(outcome, Ok(true)) && waiting {
            handed.push(lock);
        } else {
            lock.release_unused(root);
        }
    }
    if outcome.is_ok() {
        worker::start(inv, delegate, handed, false);
    }
    outcome.map(|_| ())
}

/// The DEL under its pod locks; `true` when it freed the pod's keys (the primary had the
/// owner's DEL), so their deferred DELs may be replayed now.
fn del_locked(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    locked_keys: &[PodKey],
) -> Result<bool> {
    if pending::answered_as_rolled_back(inv, attachment) {
        // The rollback gave the primary this DEL: a deferred one of it would be another.
        let id = inv.attachment_id(attachment);
        for key in locked_keys {
            drop_own_deferred(inv, key, &id);
        }
        return Ok(false);
    }
    let Some((store, unwritable)) = judgement::open(inv, attachment)? else {
        judgement::nothing_recorded(inv, attachment);
        pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
        return Ok(false);
    };
    let mut plan = match judgement::judge(inv, attachment, &store)? {
        Judgement::Stale(stale) => {
            if let Some(why) = unwritable {
                // Kept from the primary for good, it would leak; told nothing, the primary
                // would tear down the owner. Refused, as chained mode does, until the store
                // takes writes again.
                let err = judgement::refuse(inv, attachment, stale);
                return Err(err.with_details(format!(
                    "The DEL cannot be deferred: {} {}",
                    why.msg, why.details
                )));
            }
            let deferred = match defer(inv, attachment, &store, &stale, delegate) {
                Ok(deferred) => deferred,
                // The store took no write after all (a full disk takes a probe, not an
                // entry): refused as stale, as above, never an I/O error the runtime reads
                // as the sandbox's own failure.
                Err(err) if matches!(err.kind, Kind::Io | Kind::ReadOnly) => {
                    let refused = judgement::refuse(inv, attachment, stale);
                    return Err(refused.with_details(format!(
                        "The DEL cannot be deferred: {} {}",
                        err.msg, err.details
                    )));
                }
                Err(err) => return Err(err),
            };
            let recorded = recorded_of(&store, attachment, &deferred);
            let live = old_interface::live_netns(&store, &deferred.container_id, recorded.netns);
            drop(store);
            return remove_stale_interface(inv, attachment, &deferred, &recorded, &live)
                .map(|()| false);
        }
        Judgement::Go(plan) => plan,
    };
    if plan.keys.iter().any(|key| !locked_keys.contains(key)) {
        return Err(GuardError::new(
            Kind::Busy,
            "the sandbox's record changed while its DEL waited for its pod lock",
        )
        .with_details("The runtime retries the DEL."));
    }
    drop(store);
    // Rule 7 under the pod's locks, so no ADD of the pod comes in between. A DEL held before
    // (its retry, once the sandbox was forgotten) stays held without asking.
    if let Some(moved) = own_held_entry(inv, &plan)
        .as_ref()
        .and_then(api_check::held_before)
    {
        return hold_moved(inv, delegate, attachment, plan, moved).map(|()| false);
    }
    if plan.asks_api(inv) {
        match api_check::name_moved(inv, attachment, &plan.keys, plan.pod_uid.as_deref()) {
            Rule7::Moved(moved) if inv.conf.stale_del == StaleDelPolicy::Audit => {
                plan.audit_moved(*moved);
            }
            Rule7::Moved(moved) => {
                return hold_moved(inv, delegate, attachment, plan, *moved).map(|()| false);
            }
            Rule7::Unanswered
                if of_the_boot_before(inv, &plan)
                    && kept_unanswered(inv, delegate, attachment, &plan)? =>
            {
                return Ok(false);
            }
            Rule7::Unanswered | Rule7::NotMoved => {}
        }
    }
    pass_on(inv, delegate, inv.conf.prev_result.as_deref())?;
    let keys = plan.keys.clone();
    let id = plan.id.clone();
    if let Some((store, unwritable)) = judgement::open(inv, attachment)? {
        judgement::finish(inv, attachment, &store, unwritable, plan);
    }
    for key in &keys {
        // The primary has just had this sandbox's own DEL.
        drop_own_deferred(inv, key, &id);
    }
    Ok(true)
}

pub fn check(inv: &Invocation, delegate: &Delegate, attachment: &Attachment) -> Result<()> {
    let key = inv.pod_key(attachment);
    let locks = lock(inv, key.as_slice())?;
    let checked = resolve_pending(inv, delegate, key.as_slice(), pending::NextVerb::Other)
        .and_then(|()| pass_on(inv, delegate, inv.conf.prev_result.as_deref()))
        .and_then(|_| super::check::run(inv, attachment));
    // A CHECK of a sandbox the store does not know leaves no lock file behind.
    for lock in locks {
        lock.release_unused(&inv.conf.state_dir);
    }
    checked
}

/// libcni GCs every plugin of the list and collects their errors: the primary's error does
/// not stop the guard's own collection or the replays, and is answered after them.
pub fn gc(inv: &Invocation, delegate: &Delegate) -> Result<()> {
    let primary = pass_on(inv, delegate, None);
    let own = super::gc::run(inv);
    // The owners GC dropped freed their keys: the node's sweep replays those keys' deferred
    // DELs with the others', in a worker GC does not wait for.
    worker::start(inv, delegate, Vec::new(), true);
    if let Ok(store) = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout) {
        store.remove_unused_pod_locks();
    }
    primary?;
    own
}

pub fn status(inv: &Invocation, delegate: &Delegate) -> Result<()> {
    pass_on(inv, delegate, None).map_err(|err| match err.kind {
        // The primary's own STATUS error goes as it wrote it; not being able to run it at all
        // means the network cannot serve ADDs either.
        Kind::Delegate(_) => err,
        _ => GuardError::new(
            Kind::NotAvailable,
            format!("the primary plugin cannot be run: {}", err.msg),
        )
        .with_details(err.details),
    })?;
    super::status::run(inv)?;
    // The runtime asks for STATUS whether or not pods come and go: on a node where no other
    // verb comes, this is where the deferred DELs of names freed since get their sweep.
    worker::start_for_status(inv, delegate);
    Ok(())
}

/// VERSION in delegate mode, when the runtime sends the network's configuration with it:
/// the versions both the guard and its primary speak, the primary asked as libcni asks it.
/// `None`: no `delegate` on stdin (libcni's own VERSION sends only `cniVersion`), so the
/// guard answers for itself. A primary that cannot be run is a CNI error, not a guess.
pub fn version(stdin: &[u8], requested: Option<&str>) -> Result<Option<String>> {
    let Ok(serde_json::Value::Object(mut conf)) =
        serde_json::from_slice::<serde_json::Value>(stdin)
    else {
        return Ok(None);
    };
    let Some(serde_json::Value::Object(object)) = conf.remove("delegate") else {
        return Ok(None);
    };
    let network = conf
        .get("name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    let delegate = Delegate::from_conf(object, None, &[])?;
    let asked = crate::cni::version::for_reply(requested);
    let theirs = delegate
        .supported_versions(&network, asked)
        .map_err(|err| {
            GuardError::new(
                err.kind,
                format!(
                    "VERSION: cannot ask the primary {} which versions it speaks: {}",
                    delegate.plugin_type, err.msg
                ),
            )
            .with_details(err.details)
        })?;
    let both: Vec<&str> = crate::cni::version::SUPPORTED
        .iter()
        .copied()
        .filter(|v| theirs.iter().any(|t| t == v))
        .collect();
    Ok(Some(crate::cni::version::version_reply_among(
        requested, &both,
    )))
}

/// Runs the primary for this very invocation: the runtime's own `CNI_*` environment.
fn pass_on(
    inv: &Invocation,
    delegate: &Delegate,
    prev_result: Option<&RawValue>,
) -> Result<Vec<u8>> {
    delegate.call(
        &inv.conf.network,
        &inv.conf.cni_version,
        prev_result,
        &EnvOverride::default(),
    )
}

/// The pod locks of `keys`, in one order for every process, so two never wait on each other.
fn lock(inv: &Invocation, keys: &[PodKey]) -> Result<Vec<PodLock>> {
    let mut sorted: Vec<&PodKey> = keys.iter().collect();
    sorted.sort_by_key(|key| key.digest());
    sorted
        .into_iter()
        .map(|key| PodLock::acquire(&inv.conf.state_dir, key, inv.conf.pod_lock_timeout))
        .collect()
}

fn not_a_result(delegate: &Delegate, why: &str, owner: Option<&str>) -> GuardError {
    let cleanup = match owner {
        // The cleanup DEL of a sandbox that never took the pod's name is stale while another owns it.
        Some(owner) => format!(
            "the runtime's cleanup DEL is deferred while sandbox {owner} owns the pod, and reaches the primary once the pod's name is free"
        ),
        None => "the runtime's cleanup DEL reaches it".to_string(),
    };
    GuardError::new(
        Kind::Decode,
        format!(
            "the delegate {} answered ADD with something that is not a CNI result: {why}",
            delegate.plugin_type
        ),
    )
    .with_details(format!(
        "The primary set the pod up but its result cannot be read; {cleanup}."
    ))
}

fn refuse_if_superseded(
    inv: &Invocation,
    attachment: &Attachment,
    id: &AttachmentId,
    key: &PodKey,
) -> Result<()> {
    if surely_absent(&inv.conf.state_dir) {
        return Ok(());
    }
    // Judged from files keyed by this network's podKey rule: moved there first if need be.
    crate::state::rekey::ensure(
        &inv.conf.state_dir,
        &inv.conf.network,
        inv.conf.pod_key,
        inv.conf.lock_timeout,
        Some((key, &attachment.ifname)),
    )?;
    let store = Store::open_read_only(&inv.conf.state_dir)?;
    let _read = store.read_lock(inv.conf.lock_timeout, &|_| {})?;
    let Loaded::Valid(owner) = store.load_owner(key)? else {
        return Ok(());
    };
    // The sandbox's other interfaces speak for it too: a late ADD of a second interface must
    // not take the pod back from the sandbox that superseded its first. Those are the ones the
    // owner holds the key by (the sandbox's records under them), and its deferred DELs.
    let mut own_generation = None;
    for if_name in std::iter::once(id.if_name.as_str()).chain(owner.interfaces()) {
        let here = AttachmentId::of(key, &id.container_id, if_name);
        if let Loaded::Valid(record) = store.load_record(&here)?
            && (here == *id || record.pod_key(inv.conf.pod_key).as_ref() == Some(key))
        {
            own_generation = own_generation.max(Some(record.generation));
        }
    }
    let deferred = !surely_absent(&store.deferred_path(key, id))
        || store.deferred_of(key)?.iter().any(
            |(_, entry)| matches!(entry, Loaded::Valid(e) if e.container_id == id.container_id),
        );
    let found = Owner {
        ownership: &owner,
        backed: owner.container_id == id.container_id || store.owner_is_backed(&owner),
    };
    let owner_alive = store.owner_netns_alive(&owner);
    let AddVerdict::Superseded { owner } = ownership::judge_add(
        &id.container_id,
        own_generation,
        deferred,
        Some(found),
        owner_alive,
    ) else {
        return Ok(());
    };
    let why = if deferred {
        "this sandbox's DEL was deferred"
    } else {
        "it took the pod's name after this sandbox did"
    };
    let err = GuardError::new(
        Kind::Superseded,
        format!("ADD refused: sandbox {} of pod {} was superseded by sandbox {}", crate::names::short_id(&id.container_id), key.label(), owner.container_id),
    )
    .with_details(format!(
        "Sandbox {} (generation {}) owns the pod, its netns is alive, and {why}; adding this one would hand the pod's name back to an old \
         sandbox. The runtime creates a new sandbox. If {} is in fact dead, stop and remove it first.",
        owner.container_id, owner.generation, owner.container_id
    ));
    let subject = inv.subject(Some(attachment), Some(key.pod()));
    inv.log.event_with(
        Level::Warn,
        inv.verb,
        &subject,
        Outcome::Refused,
        &[("cause", CAUSE_SUPERSEDED), ("owner", &owner.container_id)],
        &err.msg,
    );
    Err(err)
}

/// Keeps the stale DEL for the primary (durably, before it is answered) and forgets the
/// stale sandbox's record: the runtime has torn it down. Answered again (the runtime's
/// second DEL), the first entry stays as it was.
fn defer(
    inv: &Invocation,
    attachment: &Attachment,
    store: &Store,
    stale: &Stale,
    delegate: &Delegate,
) -> Result<DeferredDel> {
    let id = inv.attachment_id(attachment);
    let record = store.load_record(&id)?;
    let deferred = match store.load_deferred(&stale.key, &id)? {
        // One kept while nobody here owned the pod (`kept_unanswered`) names this owner now,
        // and keeps its hold.
        Loaded::Valid(entry) if entry.owner.is_empty() => {
            let entry = DeferredDel {
                owner: stale.owner.container_id.clone(),
                ..entry
            };
            store.save_deferred(&entry)?;
            entry
        }
        Loaded::Valid(entry) => entry,
        _ => {
            let entry = new_entry(
                inv,
                attachment,
                &stale.key,
                &stale.owner.container_id,
                &record,
                delegate,
            );
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
    judgement::note_in_ledger(
        store,
        &stale.key,
        crate::state::ledger::Handled::Deferred,
        attachment,
        &stale.owner,
    );
    store.sync()?;
    Ok(deferred)
}

/// The deferred DEL of `attachment` under `key`, kept from the primary for `owner` (the
/// sandbox that owns the key, or the API's pod of the name).
fn new_entry(
    inv: &Invocation,
    attachment: &Attachment,
    key: &PodKey,
    owner: &str,
    record: &Loaded<checkpoint::Checkpoint>,
    delegate: &Delegate,
) -> DeferredDel {
    let record = match record {
        Loaded::Valid(record) => Some(record),
        _ => None,
    };
    let prev_result = record
        .map(|r| r.prev_result.clone())
        .or_else(|| inv.conf.prev_result.clone());
    let netns = match (attachment.netns.as_str(), record) {
        ("", Some(record)) => record.netns.clone(),
        (netns, _) => netns.to_string(),
    };
    let mac = old_interface::recorded_mac(record, prev_result.as_deref(), &attachment.ifname);
    DeferredDel {
        key: key.clone(),
        container_id: attachment.container_id.clone(),
        pod_uid: attachment
            .pod
            .uid
            .clone()
            .or_else(|| record.and_then(|r| r.pod_uid.clone())),
        cni_args: attachment.args.clone(),
        cni_version: record.map_or_else(|| inv.conf.cni_version.clone(), |r| r.cni_version.clone()),
        prev_result,
        netns,
        mac,
        owner: owner.to_string(),
        deferred_at: crate::clock::now_rfc3339(),
        deferred_at_ns: crate::clock::unix_nanos(),
        attempts: 0,
        last_error: None,
        last_attempt_at: None,
        interface: key.if_name.is_none().then(|| attachment.ifname.clone()),
        last_attempt_ns: None,
        last_attempt_boot_ns: None,
        boot_id: None,
        deferred_in_boot: crate::clock::boot_id(),
        last_replay_seconds: None,
        hung: false,
        delegate: Some(delegate.recorded_conf()),
        conf_version: Some(inv.conf.cni_version.clone()),
        identity: record.and_then(|r| r.identity.clone()),
        moved_to: None,
    }
}

/// The old sandbox's interface as its deferred DEL recorded it.
fn recorded_of<'a>(
    store: &Store,
    attachment: &'a Attachment,
    entry: &'a DeferredDel,
) -> old_interface::Recorded<'a> {
    let netns = if attachment.netns.is_empty() {
        entry.netns_in_this_boot(store.boot_id())
    } else {
        &attachment.netns
    };
    let this_boot = store.of_this_boot(entry.deferred_in_boot.as_deref());
    old_interface::Recorded {
        netns,
        mac: entry.mac.as_deref(),
        identity: entry.identity.as_ref(),
        this_boot,
    }
}

/// The error of a deferred DEL whose interface could not be removed: the runtime retries.
fn not_removed(
    inv: &Invocation,
    attachment: &Attachment,
    subject_pod: String,
    fields: &[(&str, &str)],
    netns: &str,
    err: GuardError,
) -> GuardError {
    let subject = inv.subject(Some(attachment), Some(subject_pod));
    inv.log.event_with(
        Level::Error,
        inv.verb,
        &subject,
        Outcome::Deferred,
        fields,
        &format!(
            "DEL deferred, but its interface could not be removed: {}",
            err.msg
        ),
    );
    GuardError::new(
        err.kind,
        format!(
            "DEL deferred, but {} could not be removed from {netns}: {}",
            attachment.ifname, err.msg
        ),
    )
    .with_details(
        "The old netns may still answer for the pod's address. The runtime's retry tries again.",
    )
}

/// `remove_interface_of`, and the stale DEL's deferral logged. A failure fails the DEL (the
/// entry is kept): the runtime's retry tries again, so the old netns does not go on
/// answering for the pod's address. What is left alone is logged with why.
fn remove_stale_interface(
    inv: &Invocation,
    attachment: &Attachment,
    deferred: &DeferredDel,
    recorded: &old_interface::Recorded,
    live: &[(u64, u64)],
) -> Result<()> {
    let fields = [
        ("cause", CAUSE_STALE_DEL),
        ("owner", deferred.owner.as_str()),
    ];
    match old_interface::remove(attachment, recorded, live) {
        Ok(text) => {
            let subject = inv.subject(Some(attachment), Some(deferred.key.pod()));
            inv.log.event_with(Level::Warn, inv.verb, &subject, Outcome::Deferred, &fields, &format!(
                "stale DEL deferred: pod {} belongs to sandbox {}; the primary gets this DEL once it is free; {text}",
                deferred.key.pod(), deferred.owner
            ));
            Ok(())
        }
        Err(err) => Err(not_removed(
            inv,
            attachment,
            deferred.key.pod(),
            &fields,
            recorded.netns,
            err,
        )),
    }
}

/// This DEL's own entry held for the API's pod of the name (rule 7), if one was kept.
/// One stat per key where none was kept: every DEL that goes on in delegate mode looks.
fn own_held_entry(inv: &Invocation, plan: &judgement::Plan) -> Option<DeferredDel> {
    if plan
        .keys
        .iter()
        .all(|key| surely_absent(&own_deferred_path(inv, key, &plan.id)))
    {
        return None;
    }
    let store = Store::open_read_only(&inv.conf.state_dir).ok()?;
    plan.keys
        .iter()
        .find_map(|key| match store.load_deferred(key, &plan.id) {
            Ok(Loaded::Valid(entry)) if entry.moved_to.is_some() => Some(entry),
            _ => None,
        })
}

/// Where `id`'s own deferred DEL under `key` is kept, read without opening the store.
fn own_deferred_path(inv: &Invocation, key: &PodKey, id: &AttachmentId) -> std::path::PathBuf {
    deferred::key_dir(&inv.conf.state_dir, &key.digest()).join(id.file_name())
}

/// Rule 7 in delegate mode: the DEL is kept for the primary until the API server has no other
/// pod of the name (`api_check::still_moved`, asked by the replay), durably before it is
/// answered with success; the store forgets the sandbox as for any DEL that goes on, and its
/// interface is removed here. Where it cannot be kept, refused as chained mode refuses.
fn hold_moved(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    plan: judgement::Plan,
    moved: api_check::Moved,
) -> Result<()> {
    let Some((store, unwritable)) = judgement::open(inv, attachment)? else {
        return Err(moved.refuse(inv, attachment));
    };
    let cannot_defer = |moved: api_check::Moved, why: GuardError| {
        let err = moved.refuse(inv, attachment);
        err.with_details(format!(
            "The DEL cannot be deferred: {} {}",
            why.msg, why.details
        ))
    };
    if let Some(why) = unwritable {
        return Err(cannot_defer(moved, why));
    }
    let id = plan.id.clone();
    let record = store.load_record(&id)?;
    // An entry of this DEL kept before (stale then, or held) is held for the API's pod now.
    let entry = match store.load_deferred(&moved.key, &id)? {
        Loaded::Valid(entry) if entry.moved_to.is_some() => entry,
        kept => {
            let entry = match kept {
                Loaded::Valid(entry) => entry,
                _ => new_entry(inv, attachment, &moved.key, &moved.uid, &record, delegate),
            };
            let entry = DeferredDel {
                moved_to: api_check::moved_to(inv, &moved),
                ..entry
            };
            match store.save_deferred(&entry).and_then(|()| store.sync()) {
                Ok(()) => entry,
                Err(err) if matches!(err.kind, Kind::Io | Kind::ReadOnly) => {
                    return Err(cannot_defer(moved, err));
                }
                Err(err) => return Err(err),
            }
        }
    };
    // Kept first: a crash here leaves the owner and its entry, and the runtime's retry finds
    // the entry (`held_before`) and forgets the owner.
    judgement::forget_planned(&store, &plan)?;
    let recorded = recorded_of(&store, attachment, &entry);
    let live = old_interface::live_netns(&store, &entry.container_id, recorded.netns);
    drop(store);
    match old_interface::remove(attachment, &recorded, &live) {
        Ok(done) => {
            moved.log_deferred(inv, attachment, &done);
            Ok(())
        }
        Err(err) => {
            let fields = [
                ("cause", crate::cni::log::CAUSE_NAME_MOVED),
                ("owner", moved.uid.as_str()),
            ];
            Err(not_removed(
                inv,
                attachment,
                moved.key.pod(),
                &fields,
                recorded.netns,
                err,
            ))
        }
    }
}

/// For a DEL rules 1-6 let go and rule 7's ask left unanswered: whether it is of a sandbox
/// of the boot before this one, under `podKeyScope: "cluster"` (not in audit mode). Its owner
/// here ended with that boot unasked, so the local rule knows nothing of the name: the pod may
/// have been made again on another node meanwhile, and the primary keeps its state of the
/// name for the whole cluster. A DEL of this boot's sandbox still goes by the local rule: kept
/// from the primary on every DEL of a node whose kubeconfig never answers, its pods'
/// addresses would never come back.
fn of_the_boot_before(inv: &Invocation, plan: &judgement::Plan) -> bool {
    inv.conf.stale_del != StaleDelPolicy::Audit
        && api_check::replays_ask(inv)
        && crate::state::boot::recorded_in_previous_boot(&inv.conf.state_dir, &plan.id.file_name())
}

/// Delegate mode's answer to `of_the_boot_before`: the DEL kept for the primary as a
/// hold whose API pod is not known (`api_check::unanswered_hold`), durably, and the runtime
/// answered with success; like any hold it is asked about again at each sweep
/// (`api_check::still_moved`, with the kubeconfig it was kept with) and its retries stay held
/// without asking; the off sign in that kubeconfig lets it go by the local rule. Nothing of
/// the ended boot's sandbox is left on the node to remove. Whether it was kept: where the
/// store cannot be written, the local rule decides after all, as a teardown is never refused
/// for an API that does not answer; a store busy past `lockTimeoutSeconds` fails the DEL, as
/// any DEL's, and the runtime's retry asks again.
fn kept_unanswered(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    plan: &judgement::Plan,
) -> Result<bool> {
    let (Some(key), Some(hold)) = (plan.keys.first(), api_check::unanswered_hold(inv)) else {
        return Ok(false);
    };
    let subject = inv.subject(Some(attachment), Some(key.pod()));
    let kept = match judgement::open(inv, attachment) {
        Ok(Some((store, None))) => store.load_record(&plan.id).and_then(|record| {
            let entry = DeferredDel {
                moved_to: Some(hold),
                ..new_entry(inv, attachment, key, "", &record, delegate)
            };
            store.save_deferred(&entry)?;
            store.sync()?;
            judgement::forget_planned(&store, plan)
        }),
        Ok(Some((_, Some(why)))) => Err(why),
        Err(why) if why.kind == Kind::Busy => return Err(why),
        Err(why) => Err(why),
        Ok(None) => Err(GuardError::new(Kind::Io, "the state dir is gone")),
    };
    if let Err(why) = kept {
        inv.log.event(
            Level::Warn,
            inv.verb,
            &subject,
            Outcome::ApiUnanswered,
            &format!(
                "the DEL of sandbox {} of the boot before could not be kept for an answer ({}): the local rule decides it",
                attachment.container_id, why.msg
            ),
        );
        return Ok(false);
    }
    inv.log.event(
        Level::Warn,
        inv.verb,
        &subject,
        Outcome::Deferred,
        &format!(
            "DEL deferred: sandbox {} is of the boot before this one, and the API server did not answer whether pod {} lives \
             on another node now; the primary gets this DEL once it answers that no other pod has that name",
            attachment.container_id,
            key.pod()
        ),
    );
    Ok(true)
}

fn drop_own_deferred(inv: &Invocation, key: &PodKey, id: &AttachmentId) {
    let path = own_deferred_path(inv, key, id);
    if surely_absent(&path) {
        return;
    }
    let removed = Store::open(&inv.conf.state_dir, inv.conf.lock_timeout)
        .and_then(|store| store.remove_deferred(key, id));
    if let Err(err) = removed {
        stderr_line!(
            "sandbox-guard: the deferred DEL of {} could not be removed: {err}",
            id.container_id
        );
    }
}
