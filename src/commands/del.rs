//! DEL: remove the attachment's checkpoint, unless a newer sandbox owns the pod key.
//!
//! This plugin is last in the chain, so it runs first on DEL: refusing here keeps the DEL
//! from ever reaching the primary plugin, which would release the newer sandbox's IP. Every
//! other DEL must pass, even when the store cannot be written: a teardown is never held up
//! for the guard's own bookkeeping.

use std::path::Path;

use crate::commands::Invocation;
use crate::config::StaleDelPolicy;
use crate::env::Attachment;
use crate::error::{GuardError, Kind, Result};
use crate::log::Level;
use crate::ownership::{self, DelVerdict, Deleter, Owner, Ownership, PodKey};
use crate::store::checkpoint::{self, AttachmentId};
use crate::store::{Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let id = inv.attachment_id(attachment);
    let args = &attachment.pod;
    let key_from_args = checkpoint::pod_key(&id.network, args.namespace.as_deref(), args.name.as_deref(), &id.if_name);
    let store = open(inv)?;

    // The record says which key this container took at ADD, whatever CNI_ARGS say now.
    let (record_key, deleter) = match store.load_record(&id)? {
        Loaded::Valid(record) => (record.pod_key(), Deleter::Recorded),
        Loaded::Missing => {
            if key_from_args.is_none() {
                refuse_if_set_aside(inv, attachment, &store.set_aside_path_for_record(&id), None)?;
            }
            (None, if store.failed_add(&id) { Deleter::AddFailed } else { Deleter::Unknown })
        }
        Loaded::Corrupt { path, reason } => {
            // It blocks later DELs only when it was needed: CNI_ARGS lacked the pod key.
            let needed = key_from_args.is_none();
            let kept = set_aside(&store, &path, &store.set_aside_path_for_record(&id), needed)?;
            if needed {
                return Err(set_aside_error(inv, attachment, &kept, &reason, None));
            }
            (None, Deleter::Recorded)
        }
    };
    let mut keys: Vec<PodKey> = key_from_args.into_iter().collect();
    keys.extend(record_key.filter(|key| !keys.contains(key)));
    let subject_pod = keys.first().map(PodKey::pod);

    // Judge every key before changing anything: one stale key refuses the whole DEL.
    let mut owners_to_remove: Vec<PodKey> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut audited = None;
    for key in &keys {
        let owner = load_owner(inv, &store, attachment, key)?;
        let found = owner.as_ref().map(|o| Owner {
            ownership: o,
            backed: o.container_id == id.container_id || store.owner_is_backed(o),
        });
        match ownership::judge_del(&id.container_id, deleter, found) {
            DelVerdict::Stale { owner, ever_owned } => {
                let err = stale_error(&id, key, owner, ever_owned);
                match inv.conf.stale_del {
                    StaleDelPolicy::Refuse => {
                        let text = format!("owner={} {}", owner.container_id, err.msg);
                        inv.log.event(Level::Warn, inv.verb, &inv.subject(Some(attachment), Some(key.pod())), "refused", &text);
                        return Err(err);
                    }
                    StaleDelPolicy::Audit => {
                        audited = Some(format!("owner={} audit mode let a stale DEL through: {}", owner.container_id, err.msg));
                    }
                }
            }
            DelVerdict::Release => {
                owners_to_remove.push(key.clone());
                notes.push(format!("released pod key {}", key.pod()));
            }
            DelVerdict::Repair(owner) => {
                owners_to_remove.push(key.clone());
                notes.push(format!("dropped the ownership of {} by sandbox {}, whose record is gone", key.pod(), owner.container_id));
            }
            DelVerdict::Proceed if deleter == Deleter::AddFailed => notes.push("cleanup of an ADD that failed in the guard".into()),
            DelVerdict::Proceed => notes.push(format!("pod key {} not owned", key.pod())),
        }
    }
    if keys.is_empty() {
        notes.push("no pod identity: nothing to guard".into());
    }

    let subject = inv.subject(Some(attachment), subject_pod);
    let (outcome, level, why) = match audited {
        Some(text) => ("audited", Level::Warn, text),
        None => ("deleted", Level::Info, notes.join("; ")),
    };
    match forget(&store, &id, &owners_to_remove) {
        Ok(()) => {
            inv.log.event(level, inv.verb, &subject, outcome, &why);
            Ok(())
        }
        Err(err) if err.kind == Kind::ReadOnly => {
            inv.log.event(Level::Warn, inv.verb, &subject, outcome, &format!(
                "{why}; the store is read-only, so its record stays until the store is writable again \
                 (the next DEL of this sandbox or GC removes it) ({})",
                err.msg
            ));
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// The store for writing; on a read-only filesystem, the store read as it is: a stale DEL is
/// still refused, and every other DEL passes without writing.
fn open(inv: &Invocation) -> Result<Store> {
    match Store::open(&inv.conf.state_dir, inv.conf.lock_timeout) {
        Err(err) if err.kind == Kind::ReadOnly => {
            let store = Store::open_read_only(&inv.conf.state_dir)?;
            // Nobody can write a read-only store; the lock only orders this DEL after a
            // writer that opened it before the remount.
            drop(store.read_lock(inv.conf.lock_timeout, &|_| {})?);
            Ok(store)
        }
        other => other,
    }
}

/// Releases the keys, durably, before the record goes: a crash can leave an unowned record
/// (harmless, the retried DEL removes it) but never an owner whose record is gone.
fn forget(store: &Store, id: &AttachmentId, owners: &[PodKey]) -> Result<()> {
    if !store.is_writable() {
        return Err(GuardError::new(Kind::ReadOnly, format!("{} is on a read-only filesystem", store.root().display())));
    }
    for key in owners {
        store.remove_owner(key)?;
    }
    store.sync()?;
    store.remove_record(id)?;
    store.remove_failed_add(id)?;
    store.sync()
}

fn load_owner(inv: &Invocation, store: &Store, attachment: &Attachment, key: &PodKey) -> Result<Option<Ownership>> {
    match store.load_owner(key)? {
        Loaded::Valid(owner) => Ok(Some(owner)),
        Loaded::Missing => {
            refuse_if_set_aside(inv, attachment, &store.set_aside_path_for_owner(key), Some(key))?;
            Ok(None)
        }
        Loaded::Corrupt { path, reason } => {
            let kept = set_aside(store, &path, &store.set_aside_path_for_owner(key), true)?;
            Err(set_aside_error(inv, attachment, &kept, &reason, Some(key)))
        }
    }
}

/// Moves a corrupt file aside where the store can be written; on a read-only store it stays
/// where it is, and that is where the operator is sent.
fn set_aside(store: &Store, from: &Path, to: &Path, blocking: bool) -> Result<std::path::PathBuf> {
    if !store.is_writable() {
        return Ok(from.to_path_buf());
    }
    let kept = store.set_aside(from, to, blocking)?;
    store.sync()?;
    Ok(kept)
}

fn short(container_id: &str) -> &str {
    container_id.get(..12).unwrap_or(container_id)
}

/// A short `msg` (what happened, who owns the pod) and `details` (the facts as JSON, and the
/// way out).
fn stale_error(id: &AttachmentId, key: &PodKey, owner: &Ownership, ever_owned: bool) -> GuardError {
    let history = if ever_owned { "which owned it before" } else { "which never owned it here" };
    let msg = format!(
        "stale DEL refused: pod {} ({}) belongs to sandbox {}, not {}, {history}",
        key.pod(),
        key.if_name,
        owner.container_id,
        short(&id.container_id)
    );
    let way_out = if ever_owned {
        "Passing this DEL on would let the primary plugin tear down the newer sandbox's network. It passes once \
         the newer sandbox is stopped and removed. \"staleDel\": \"audit\" lets such DELs through."
    } else {
        "This sandbox has no checkpoint: it was added before sandbox-guard was installed, or its ADD failed before \
         it could be recorded. Passing this DEL on would let a pod-name-keyed primary tear down the newer \
         sandbox's network. It passes once the newer sandbox is stopped and removed."
    };
    let details = serde_json::json!({
        "ownerContainerId": owner.container_id,
        "ownerPodUid": owner.pod_uid,
        "ownerGeneration": owner.generation,
        "pod": key.pod(),
        "ifName": key.if_name,
        "network": key.network,
        "refusedContainerId": id.container_id,
        "refusedEverOwned": ever_owned,
        "wayOut": way_out,
    });
    GuardError::new(Kind::StaleDel, msg).with_details(details.to_string())
}

/// A DEL whose decision needs a file that failed verification must not guess.
fn refuse_if_set_aside(inv: &Invocation, attachment: &Attachment, kept: &Path, key: Option<&PodKey>) -> Result<()> {
    if std::fs::symlink_metadata(kept).is_ok() {
        return Err(set_aside_error(inv, attachment, kept, "set aside by an earlier operation", key));
    }
    Ok(())
}

fn set_aside_error(inv: &Invocation, attachment: &Attachment, kept: &Path, reason: &str, key: Option<&PodKey>) -> GuardError {
    let what = match key {
        Some(key) => format!("which sandbox owns pod {} ({})", key.pod(), key.if_name),
        None => format!("which pod sandbox {} belonged to", short(&attachment.container_id)),
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
    inv.log.event(Level::Error, inv.verb, &inv.subject(Some(attachment), key.map(PodKey::pod)), "refused", &format!("{} ({reason})", err.msg));
    err
}
