//! The judgement of a DEL both modes share: which pod keys it is about, whether a newer
//! sandbox owns one (stale), and else what it releases; then the store's part of a DEL that
//! may go on. Chained mode refuses a stale DEL (`del`), delegate mode defers it
//! (`delegated`); the rule itself is `state::ownership::judge_del`.

use std::path::Path;

use crate::cni::config::StaleDelPolicy;
use crate::cni::env::Attachment;
use crate::cni::log::{CAUSE_NAME_MOVED, CAUSE_SET_ASIDE, CAUSE_STALE_DEL, Level, Outcome};
use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::state::checkpoint::AttachmentId;
use crate::state::ledger::Handled;
use crate::state::ownership::{self, DelVerdict, Deleter, Owner, Ownership, PodKey};
use crate::state::{Loaded, Store};

/// A stale DEL, as judged: the key, its owner, and the refusal chained mode answers with.
pub struct Stale {
    pub key: PodKey,
    pub owner: Ownership,
    pub error: GuardError,
}

/// A DEL that may go on: what it releases and what the log says of it.
pub struct Plan {
    pub id: AttachmentId,
    pub keys: Vec<PodKey>,
    /// Each key's ownership as the DEL leaves it: what its owner still holds, or `None`.
    owner_changes: Vec<(PodKey, Option<Ownership>)>,
    notes: Vec<String>,
    corrupt_record: Option<std::path::PathBuf>,
    audited: Option<(String, String)>,
    /// The key and owner of a stale DEL let through in audit mode, for the ledger.
    audited_key: Option<(PodKey, Ownership)>,
    /// The deleting sandbox's pod UID: CNI_ARGS', else its record's.
    pub pod_uid: Option<String>,
    /// Chained mode: its record's rule-7 hold, kept from an earlier refusal.
    pub held: Option<Box<crate::state::held::MovedTo>>,
    /// What `audited` is for: `cause=` of its log line.
    audited_cause: &'static str,
}

impl Plan {
    /// Whether rule 7 asks the API server about this DEL: a kubeconfig, a pod identity and
    /// UID to compare, and not a stale DEL audit mode lets through.
    pub fn asks_api(&self, inv: &Invocation) -> bool {
        inv.conf.kubeconfig.is_some()
            && self.pod_uid.is_some()
            && !self.keys.is_empty()
            && self.audited.is_none()
    }

    /// Audit mode's answer to a DEL rule 7 holds: let through, logged once, as audited.
    pub fn audit_moved(&mut self, moved: super::api_check::Moved) {
        if self.audited.is_some() {
            return;
        }
        self.audited = Some((
            moved.uid,
            format!("audit mode let a stale DEL through: {}", moved.error.msg),
        ));
        self.audited_cause = CAUSE_NAME_MOVED;
    }
}

pub enum Judgement {
    Stale(Stale),
    Go(Plan),
}

/// No store, and none can be made: no owner either, so nothing this DEL could tear down in
/// another sandbox's name.
pub fn nothing_recorded(inv: &Invocation, attachment: &Attachment) {
    let subject = inv.subject(
        Some(attachment),
        inv.pod_key(attachment).as_ref().map(PodKey::pod),
    );
    inv.log.event(
        Level::Warn,
        inv.verb,
        &subject,
        Outcome::Deleted,
        "no state dir, and it cannot be created: nothing recorded",
    );
}

/// The pod keys a DEL of `attachment` is about: the one CNI_ARGS name and the one its record
/// holds (read without the store's lock: delegate mode takes the pod locks before it).
pub fn keys_of(inv: &Invocation, attachment: &Attachment, store: Option<&Store>) -> Vec<PodKey> {
    let mut keys: Vec<PodKey> = inv.pod_key(attachment).into_iter().collect();
    if let Some(Ok(Loaded::Valid(record))) =
        store.map(|s| s.load_record(&inv.attachment_id(attachment)))
    {
        keys.extend(
            record
                .pod_key(inv.conf.pod_key)
                .filter(|key| !keys.contains(key)),
        );
    }
    keys
}

/// Decides the DEL from the store: stale, or what it releases. Changes nothing but what
/// a DEL must not get past (a corrupt file it needs is set aside, and the DEL refused).
pub fn judge(inv: &Invocation, attachment: &Attachment, store: &Store) -> Result<Judgement> {
    let id = inv.attachment_id(attachment);
    let key_from_args = inv.pod_key(attachment);

    // The record says which key this container took at ADD, whatever CNI_ARGS say now.
    let mut corrupt_record = None;
    let mut pod_uid = attachment.pod.uid.clone();
    let mut held = None;
    let (record_key, deleter) = match store.load_record(&id)? {
        Loaded::Valid(record) => {
            pod_uid = pod_uid.or(record.pod_uid.clone());
            held = record.held.clone().map(Box::new);
            (record.pod_key(inv.conf.pod_key), Deleter::Recorded)
        }
        Loaded::Missing => {
            if key_from_args.is_none() {
                refuse_if_set_aside(inv, attachment, &store.set_aside_path_for_record(&id), None)?;
            }
            (
                None,
                if store.failed_add(&id).is_some() {
                    Deleter::AddFailed
                } else {
                    Deleter::Unknown
                },
            )
        }
        Loaded::Corrupt { path, reason } => {
            // Needed (CNI_ARGS lack the pod key): set aside where it blocks, and refused. Not
            // needed: left in place until this DEL is judged, kept as a copy once it passes.
            if key_from_args.is_none() {
                let kept = set_aside(store, &path, &store.set_aside_path_for_record(&id))?;
                return Err(set_aside_error(inv, attachment, &kept, &reason, None));
            }
            corrupt_record = Some(path);
            (None, Deleter::Recorded)
        }
    };
    let mut keys: Vec<PodKey> = key_from_args.into_iter().collect();
    keys.extend(record_key.filter(|key| !keys.contains(key)));

    // Judge every key before changing anything: one stale key refuses the whole DEL.
    let mut owner_changes: Vec<(PodKey, Option<Ownership>)> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut audited = None;
    let mut audited_key = None;
    // Files of the other rule after the marker that the re-key could not merge (a store that
    // takes no write) count as a pending move too.
    let rekey_pending =
        crate::state::rekey::pending(store.root(), &inv.conf.network, inv.conf.pod_key)
            || keys.iter().any(|key| {
                crate::state::rekey::stray(store.root(), key, &attachment.ifname).is_some()
            });
    for key in &keys {
        let owner = load_owner(inv, store, attachment, key, rekey_pending)?;
        let found = owner.as_ref().map(|o| Owner {
            ownership: o,
            backed: o.container_id == id.container_id || store.owner_is_backed(o),
        });
        // A failed ADD speaks only against the owner it failed next to: a sandbox that took
        // the pod later must not have its network torn down by this one's DEL.
        let deleter = match (deleter, store.failed_add(&id), owner.as_ref()) {
            (Deleter::AddFailed, Some(failed), Some(owner))
                if failed.precedes(store.owner_taken_at(owner), store.owner_file_time(key)) =>
            {
                Deleter::Unknown
            }
            (deleter, _, _) => deleter,
        };
        match ownership::judge_del(&id.container_id, deleter, found) {
            DelVerdict::Stale { owner, ever_owned } => {
                let mut error = stale_error(&id, key, owner, ever_owned);
                if rekey_pending {
                    error.details = rekey_pending_details(&error.details, inv);
                }
                match inv.conf.stale_del {
                    StaleDelPolicy::Refuse => {
                        return Ok(Judgement::Stale(Stale {
                            key: key.clone(),
                            owner: owner.clone(),
                            error,
                        }));
                    }
                    StaleDelPolicy::Audit => {
                        audited = Some((
                            owner.container_id.clone(),
                            format!("audit mode let a stale DEL through: {}", error.msg),
                        ));
                        audited_key = Some((key.clone(), owner.clone()));
                    }
                }
            }
            DelVerdict::Release => {
                let left = owner
                    .as_ref()
                    .and_then(|owner| ownership::released(owner, &id.if_name));
                notes.push(match &left {
                    None => format!("released pod key {}", key.label()),
                    Some(left) => format!(
                        "pod {} stays this sandbox's by {}",
                        key.label(),
                        left.interfaces().join(", ")
                    ),
                });
                owner_changes.push((key.clone(), left));
            }
            DelVerdict::Repair(owner) => {
                notes.push(format!(
                    "dropped the ownership of {} by sandbox {}, whose record is gone",
                    key.label(),
                    owner.container_id
                ));
                owner_changes.push((key.clone(), None));
            }
            DelVerdict::Proceed if deleter == Deleter::AddFailed => {
                notes.push("cleanup of an ADD that failed in the guard".into())
            }
            DelVerdict::Proceed => notes.push(format!("pod key {} not owned", key.label())),
        }
    }
    if keys.is_empty() {
        notes.push("no pod identity: nothing to guard".into());
    }
    Ok(Judgement::Go(Plan {
        id,
        keys,
        owner_changes,
        notes,
        corrupt_record,
        audited,
        audited_key,
        pod_uid,
        held,
        audited_cause: CAUSE_STALE_DEL,
    }))
}

/// Chained mode's answer to a stale DEL: refused, so the primary never sees it.
pub fn refuse(inv: &Invocation, attachment: &Attachment, stale: Stale) -> GuardError {
    let fields = [
        ("cause", CAUSE_STALE_DEL),
        ("owner", stale.owner.container_id.as_str()),
    ];
    let subject = inv.subject(Some(attachment), Some(stale.key.pod()));
    inv.log.event_with(
        Level::Warn,
        inv.verb,
        &subject,
        Outcome::Refused,
        &fields,
        &stale.error.msg,
    );
    stale.error
}

/// Forgets what the DEL released and logs it. The DEL is not stale: from here on nothing of
/// the guard's own may fail it.
pub fn finish(
    inv: &Invocation,
    attachment: &Attachment,
    store: &Store,
    unwritable: Option<GuardError>,
    plan: Plan,
) {
    let subject = inv.subject(Some(attachment), plan.keys.first().map(PodKey::pod));
    let (outcome, level, why) = match &plan.audited {
        Some((_, text)) => (Outcome::Audited, Level::Warn, text.clone()),
        None => (Outcome::Deleted, Level::Info, plan.notes.join("; ")),
    };
    let fields: Vec<(&str, &str)> = match &plan.audited {
        Some((owner, _)) => vec![("cause", plan.audited_cause), ("owner", owner)],
        None => Vec::new(),
    };
    if let (Some((key, owner)), None) = (&plan.audited_key, &unwritable) {
        // Rides in the sync that `forget` makes.
        note_in_ledger(store, key, Handled::Audited, attachment, owner);
    }
    let forgotten = match unwritable {
        Some(why) => Err(why),
        None => forget(
            store,
            &plan.id,
            &plan.owner_changes,
            plan.corrupt_record.as_deref(),
        ),
    };
    let committed = forgotten.is_ok();
    match forgotten {
        Ok(()) => inv.log.event_with(level, inv.verb, &subject, outcome, &fields, &why),
        Err(err) => inv.log.event_with(Level::Warn, inv.verb, &subject, outcome, &fields, &format!(
            "{why}; the store could not be updated, so its record stays until the store is writable again \
             (the next DEL of this sandbox or GC removes it): {} {}",
            err.msg, err.details
        )),
    }
    if committed {
        crate::cni::metrics::commit(inv, store, true);
    }
}

/// The store's part of a DEL that goes on, without its log line: what delegate mode's rule 7
/// keeps from the primary is logged as deferred (`delegated::hold_moved`).
pub fn forget_planned(store: &Store, plan: &Plan) -> Result<()> {
    forget(
        store,
        &plan.id,
        &plan.owner_changes,
        plan.corrupt_record.as_deref(),
    )
}

/// The store for writing; where it cannot be opened for writing (a read-only filesystem, a
/// full one, a permission), the store read as it is, with the reason it cannot be written: a
/// stale DEL is still refused, and every other DEL passes without writing. `None`: there is
/// no state dir and none can be made.
pub fn open(
    inv: &Invocation,
    attachment: &Attachment,
) -> Result<Option<(Store, Option<GuardError>)>> {
    match inv.open_store(Some(attachment)) {
        Ok(store) => Ok(Some((store, None))),
        Err(_) if crate::state::surely_absent(&inv.conf.state_dir) => Ok(None),
        Err(err) if err.kind != Kind::Busy => {
            let Ok(store) = Store::open_read_only(&inv.conf.state_dir) else {
                return Err(err);
            };
            // Only orders this DEL after a writer that was already in; one stuck on the failing
            // disk must not hold the teardown up, so a busy lock is read past.
            let _ = store.read_lock(inv.conf.lock_timeout, &|_| {});
            Ok(Some((store, Some(err))))
        }
        Err(err) => Err(err),
    }
}

/// Releases the keys (or this interface of them) before the record goes, in one sync
/// (`Store::sync_released`): a crash can leave an unowned record (harmless, the retried DEL
/// removes it) but never an owner whose record is gone. A corrupt record is kept as a copy
/// first.
fn forget(
    store: &Store,
    id: &AttachmentId,
    owners: &[(PodKey, Option<Ownership>)],
    corrupt_record: Option<&Path>,
) -> Result<()> {
    for (key, left) in owners {
        store.update_owner(key, left.as_ref())?;
    }
    if let Some(path) = corrupt_record {
        store.keep_copy(path, &store.set_aside_path_for_record(id))?;
    }
    store.remove_record(id)?;
    store.remove_failed_add(id)?;
    store.sync_released()
}

/// Counts a stale DEL in the ledger; the caller syncs. Never fails the DEL: the ledger is
/// what the operator reads, the DEL's answer is what protects the pod.
pub fn note_in_ledger(
    store: &Store,
    key: &PodKey,
    handled: Handled,
    attachment: &Attachment,
    owner: &Ownership,
) {
    if let Err(err) = store.note_stale_del(
        key,
        handled,
        &attachment.ifname,
        &attachment.container_id,
        &owner.container_id,
        owner.generation,
    ) {
        stderr_line!(
            "sandbox-guard: the stale DEL could not be counted in the refusal ledger: {err}"
        );
    }
}

/// The owner of `key`. While the network's files may still sit under the other rule's keys
/// (`rekey_pending`: the re-key could not run, the store takes no write), the owners filed
/// there count too, merged as the re-key would merge them, and a damaged or set-aside file
/// under this attachment's key of the other rule refuses the DEL as one under `key` does.
fn load_owner(
    inv: &Invocation,
    store: &Store,
    attachment: &Attachment,
    key: &PodKey,
    rekey_pending: bool,
) -> Result<Option<Ownership>> {
    let owner = load_one_owner(inv, store, attachment, key, key)?;
    if !rekey_pending {
        return Ok(owner);
    }
    let other = crate::state::rekey::other(key.rule());
    let old_key = other.key(
        &key.network,
        &key.pod_namespace,
        &key.pod_name,
        &attachment.ifname,
    );
    load_one_owner(inv, store, attachment, &old_key, key)?;
    let mut owners = store.owners_under_other_rule(key)?;
    // A damaged file of the pod's, found through its records, may name the sandbox that took
    // the pod last: an owner older than it counts for nothing, and without a newer one the
    // DEL is refused as on a damaged owner of its own key.
    let pod = Some((key.pod_namespace.as_str(), key.pod_name.as_str()));
    let damaged = store
        .damaged_owners(&key.network, key.rule(), pod, false)?
        .remove(&key.digest());
    if let Some(damaged) = &damaged {
        owners.retain(|owner| owner.generation > damaged.generation);
    }
    owners.extend(owner);
    match (ownership::merged(key, &owners), damaged) {
        (None, Some(damaged)) => Err(set_aside_error(
            inv,
            attachment,
            &damaged.file,
            "an ownership filed under the other podKey rule's key fails verification or is set aside",
            Some(key),
        )),
        (owner, _) => Ok(owner),
    }
}

/// The owner filed under `file_key`; a damaged or set-aside file there refuses the DEL of `key`.
fn load_one_owner(
    inv: &Invocation,
    store: &Store,
    attachment: &Attachment,
    file_key: &PodKey,
    key: &PodKey,
) -> Result<Option<Ownership>> {
    match store.load_owner(file_key)? {
        Loaded::Valid(owner) => Ok(Some(owner)),
        Loaded::Missing => {
            refuse_if_set_aside(
                inv,
                attachment,
                &store.set_aside_path_for_owner(file_key),
                Some(key),
            )?;
            Ok(None)
        }
        Loaded::Corrupt { path, reason } => {
            let kept = set_aside(store, &path, &store.set_aside_path_for_owner(file_key))?;
            Err(set_aside_error(inv, attachment, &kept, &reason, Some(key)))
        }
    }
}

/// Adds to a stale DEL's details why its owner may have been found under the other rule's
/// keys, and how out: failing closed here hurts no live pod, the old sandbox's DEL passes once
/// the owner is gone.
fn rekey_pending_details(details: &str, inv: &Invocation) -> String {
    let why = format!(
        "The state dir's files are not yet keyed by podKey \"{}\" (the store could not be re-keyed, see stderr): \
         owners filed under either rule are honoured until a verb that can write the state dir moves them. Make \
         the state dir writable again (remount it read-write after fsck, or free space).",
        inv.conf.pod_key.name()
    );
    match serde_json::from_str::<serde_json::Value>(details) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.insert("podKeyMovePending".into(), serde_json::Value::String(why));
            serde_json::Value::Object(fields).to_string()
        }
        _ => format!("{details} {why}"),
    }
}

/// Moves a corrupt file aside, where it blocks the DELs that need it; on a store that cannot
/// be written it stays where it is, and that is where the operator is sent.
fn set_aside(store: &Store, from: &Path, to: &Path) -> Result<std::path::PathBuf> {
    if !store.is_writable() {
        return Ok(from.to_path_buf());
    }
    let kept = store.set_aside(from, to, true)?;
    store.sync()?;
    Ok(kept)
}

/// A short `msg` (what happened, who owns the pod) and `details` (the facts as JSON, and the
/// way out).
fn stale_error(id: &AttachmentId, key: &PodKey, owner: &Ownership, ever_owned: bool) -> GuardError {
    // Without a checkpoint the store cannot tell an old sandbox whose earlier DEL already
    // passed (kubelet's container GC repeats it) from one added before the guard: say both.
    let history = if ever_owned {
        "which owned it before"
    } else {
        "which has no checkpoint here"
    };
    let msg = format!(
        "stale DEL refused: pod {} belongs to sandbox {}, not {}, {history}",
        key.label(),
        crate::names::short_id(&owner.container_id),
        crate::names::short_id(&id.container_id)
    );
    let way_out = if ever_owned {
        "Passing this DEL on would let the primary plugin tear down the newer sandbox's network. It passes once \
         the newer sandbox is stopped and removed. \"staleDel\": \"audit\" lets such DELs through."
    } else {
        "This sandbox has no checkpoint: an earlier DEL of it already passed (kubelet's container GC repeats the \
         DEL of an old sandbox after a new one took the pod's name), it was added before sandbox-guard was \
         installed, or its ADD failed before it could be recorded. Passing this DEL on would let a pod-name-keyed primary tear down the newer \
         sandbox's network. It passes once the newer sandbox is stopped and removed."
    };
    let details = serde_json::json!({
        "ownerContainerId": owner.container_id,
        "ownerPodUid": owner.pod_uid,
        "ownerGeneration": owner.generation,
        "pod": key.pod(),
        "ifName": id.if_name,
        "ownerInterfaces": owner.interfaces(),
        "network": key.network,
        "refusedContainerId": id.container_id,
        "refusedEverOwned": ever_owned,
        "wayOut": way_out,
    });
    GuardError::new(Kind::StaleDel, msg).with_details(details.to_string())
}

/// A DEL whose decision needs a file that failed verification must not guess.
fn refuse_if_set_aside(
    inv: &Invocation,
    attachment: &Attachment,
    kept: &Path,
    key: Option<&PodKey>,
) -> Result<()> {
    if !crate::state::surely_absent(kept) {
        return Err(set_aside_error(
            inv,
            attachment,
            kept,
            "set aside by an earlier operation",
            key,
        ));
    }
    Ok(())
}

fn set_aside_error(
    inv: &Invocation,
    attachment: &Attachment,
    kept: &Path,
    reason: &str,
    key: Option<&PodKey>,
) -> GuardError {
    let what = match key {
        Some(key) => format!("which sandbox owns pod {}", key.label()),
        None => format!(
            "which pod sandbox {} belonged to",
            crate::names::short_id(&attachment.container_id)
        ),
    };
    let err = GuardError::new(
        Kind::SetAside,
        format!("DEL refused: the checkpoint that says {what} failed verification and is kept at {}", kept.display()),
    )
    .with_details(format!(
        "Reason: {reason}. Check with `crictl pods` whether a newer sandbox of the pod runs on this node: if none \
         does, delete {} and the runtime's retry will pass; if one does, stop and remove it first.",
        kept.display()
    ));
    let subject = inv.subject(Some(attachment), key.map(PodKey::pod));
    inv.log.event_with(
        Level::Error,
        inv.verb,
        &subject,
        Outcome::Refused,
        &[("cause", CAUSE_SET_ASIDE)],
        &format!("{} ({reason})", err.msg),
    );
    err
}
