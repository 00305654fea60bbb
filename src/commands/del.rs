//! DEL: remove the attachment's checkpoint, unless a newer sandbox owns the pod key.
//!
//! This plugin is last in the chain, so it runs first on DEL: refusing here keeps the DEL
//! from ever reaching the primary plugin, which would release the newer sandbox's IP.

use std::path::Path;

use crate::commands::Invocation;
use crate::config::StaleDelPolicy;
use crate::env::Attachment;
use crate::error::{GuardError, Kind, Result};
use crate::log::Level;
use crate::ownership::{self, DelVerdict, Ownership, PodKey};
use crate::store::checkpoint::{self, AttachmentId};
use crate::store::{Access, Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let id = inv.attachment_id(attachment);
    let args = &attachment.pod;
    let key_from_args = checkpoint::pod_key(&id.network, args.namespace.as_deref(), args.name.as_deref(), &id.if_name);
    let store = Store::open(&inv.conf.state_dir, Access::Exclusive)?;

    // The record matters only when CNI_ARGS lack the pod identity (podman, a hand-run DEL).
    let record_key = match store.load_record(&id)? {
        Loaded::Valid(record) => record.pod_key(),
        Loaded::Missing => {
            if key_from_args.is_none() {
                refuse_if_set_aside(inv, attachment, &store.set_aside_path_for_record(&id), None)?;
            }
            None
        }
        Loaded::Corrupt { path, reason } => {
            // It blocks later DELs only when it was needed: CNI_ARGS lacked the pod key.
            let kept = store.set_aside(&path, &store.set_aside_path_for_record(&id), key_from_args.is_none())?;
            store.sync()?;
            if key_from_args.is_none() {
                return Err(set_aside_error(inv, attachment, &kept, &reason, None));
            }
            None
        }
    };
    let Some(key) = key_from_args.or(record_key) else {
        return remove_record(inv, &store, attachment, &id, None, ("deleted", "no pod identity: nothing to guard"));
    };

    let owner = load_owner(inv, &store, attachment, &key)?;
    match ownership::judge_del(&id.container_id, owner.as_ref()) {
        DelVerdict::Stale(owner) => match inv.conf.stale_del {
            StaleDelPolicy::Refuse => {
                let err = stale_error(&id, &key, owner);
                inv.log.event(Level::Warn, inv.verb, &inv.subject(Some(attachment), Some(key.pod())), "refused", &err.msg);
                Err(err)
            }
            StaleDelPolicy::Audit => {
                let text = format!("audit mode let a stale DEL through: {}", stale_error(&id, &key, owner).msg);
                remove_record(inv, &store, attachment, &id, Some(&key), ("audited", &text))
            }
        },
        DelVerdict::Release => {
            // The release is durable before the record goes: a crash can leave an unowned
            // record (harmless, the retried DEL removes it) but never an owner whose record
            // is gone, which would refuse the DELs of every other sandbox of the pod forever.
            store.remove_owner(&key)?;
            store.sync()?;
            remove_record(inv, &store, attachment, &id, Some(&key), ("deleted", "released the pod key"))
        }
        DelVerdict::Proceed => remove_record(inv, &store, attachment, &id, Some(&key), ("deleted", "pod key not owned")),
    }
}

fn load_owner(inv: &Invocation, store: &Store, attachment: &Attachment, key: &PodKey) -> Result<Option<Ownership>> {
    match store.load_owner(key)? {
        Loaded::Valid(owner) => Ok(Some(owner)),
        Loaded::Missing => {
            refuse_if_set_aside(inv, attachment, &store.set_aside_path_for_owner(key), Some(key))?;
            Ok(None)
        }
        Loaded::Corrupt { path, reason } => {
            let kept = store.set_aside(&path, &store.set_aside_path_for_owner(key), true)?;
            store.sync()?;
            Err(set_aside_error(inv, attachment, &kept, &reason, Some(key)))
        }
    }
}

fn remove_record(
    inv: &Invocation,
    store: &Store,
    attachment: &Attachment,
    id: &AttachmentId,
    key: Option<&PodKey>,
    (outcome, why): (&str, &str),
) -> Result<()> {
    store.remove_record(id)?;
    store.sync()?;
    let level = if outcome == "audited" { Level::Warn } else { Level::Info };
    inv.log.event(level, inv.verb, &inv.subject(Some(attachment), key.map(PodKey::pod)), outcome, why);
    Ok(())
}

fn stale_error(id: &AttachmentId, key: &PodKey, owner: &Ownership) -> GuardError {
    let uid = owner.pod_uid.as_deref().unwrap_or("unknown");
    let msg = format!(
        "stale DEL refused: sandbox {} is no longer pod {}'s sandbox on network {} ({}); sandbox {} \
         (pod UID {uid}, generation {}) owns it now, and passing this DEL on would let the primary \
         plugin release that sandbox's IP and endpoint. This DEL will pass once the newer sandbox \
         is stopped and removed; set \"staleDel\": \"audit\" to let such DELs through",
        id.container_id, key.pod(), key.network, key.if_name, owner.container_id, owner.generation
    );
    let details = serde_json::json!({
        "ownerContainerId": owner.container_id,
        "ownerPodUid": owner.pod_uid,
        "ownerGeneration": owner.generation,
        "pod": key.pod(),
        "ifName": key.if_name,
        "network": key.network,
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
        None => format!("which pod sandbox {} belonged to", attachment.container_id),
    };
    let err = GuardError::new(
        Kind::SetAside,
        format!(
            "DEL refused: the checkpoint that says {what} failed verification ({reason}) and is kept at {}. \
             Check with `crictl pods` whether a newer sandbox of the pod runs on this node: if none does, \
             delete {} and the runtime's retry will pass; if one does, stop and remove it first",
            kept.display(),
            kept.display()
        ),
    );
    inv.log.event(Level::Error, inv.verb, &inv.subject(Some(attachment), key.map(PodKey::pod)), "refused", &err.msg);
    err
}
