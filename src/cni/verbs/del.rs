//! DEL: remove the attachment's checkpoint, unless a newer sandbox owns the pod key.
//!
//! This plugin is last in the chain, so it runs first on DEL: refusing here keeps the DEL
//! from ever reaching the primary plugin, which would release the newer sandbox's IP. Every
//! other DEL must pass, even when the store cannot be written: a teardown is never held up
//! for the guard's own bookkeeping. A DEL refused because the pod's name moved (rule 7) has
//! its sandbox's interface removed here first.

use super::api_check;
use super::judgement::{self, Judgement};
use super::old_interface;
use crate::cni::config::StaleDelPolicy;
use crate::cni::env::Attachment;
use crate::cni::verbs::Invocation;
use crate::error::Result;
use crate::state::checkpoint::AttachmentId;
use crate::state::ledger::Handled;
use crate::state::{Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let (mut asked_api, mut asked_held) = (false, false);
    let mut moved = None;
    loop {
        let Some((store, unwritable)) = judgement::open(inv, attachment)? else {
            judgement::nothing_recorded(inv, attachment);
            return Ok(());
        };
        let mut judged = judgement::judge(inv, attachment, &store)?;
        // A hold a concurrent DEL of this sandbox wrote after this one asked is asked as a
        // hold too: an unanswered ask of ours must not let it go.
        if let Judgement::Go(plan) = &judged
            && moved.is_none()
            && ((plan.held.is_some() && !asked_held) || (!asked_api && plan.asks_api(inv)))
        {
            // Asked without the store's lock, then judged again: a newer ADD of the pod may
            // have come in meanwhile.
            drop(store);
            asked_api = true;
            asked_held |= plan.held.is_some();
            moved = match (&plan.held, plan.keys.first()) {
                // A retry that cannot say its pod UID is held while any pod has the name.
                (Some(held), Some(key)) => api_check::held_in_record(
                    inv,
                    key,
                    plan.pod_uid.as_deref().unwrap_or_default(),
                    held,
                ),
                _ => api_check::name_moved(inv, attachment, &plan.keys, plan.pod_uid.as_deref())
                    .moved(),
            };
            continue;
        }
        if let (Judgement::Go(plan), Some(moved)) = (&mut judged, moved.take()) {
            if inv.conf.stale_del == StaleDelPolicy::Refuse {
                if plan.held.is_none() {
                    hold(inv, &store, &plan.id, &moved);
                }
                drop(store);
                let removed = remove_old_interface(inv, attachment, &plan.id);
                return Err(moved.refuse_removed(inv, attachment, removed));
            }
            plan.audit_moved(moved);
        }
        return decide(inv, attachment, store, unwritable, judged);
    }
}

/// Keeps the first rule-7 refusal of `id` in its record, so that its retries are not let
/// through by an API server that stops answering. A store that takes no write keeps none:
/// its retries are asked as the first was.
fn hold(inv: &Invocation, store: &Store, id: &AttachmentId, moved: &api_check::Moved) {
    if !store.is_writable() {
        return;
    }
    let Ok(Loaded::Valid(mut record)) = store.load_record(id) else {
        return;
    };
    record.held = api_check::moved_to(inv, moved);
    if record.held.is_some()
        && let Err(err) = store.save_record(&record)
    {
        stderr_line!("sandbox-guard: the refusal could not be kept in the sandbox's record: {err}");
    }
}

fn decide(
    inv: &Invocation,
    attachment: &Attachment,
    store: crate::state::Store,
    unwritable: Option<crate::error::GuardError>,
    judged: Judgement,
) -> Result<()> {
    match judged {
        Judgement::Stale(stale) => {
            judgement::note_in_ledger(
                &store,
                &stale.key,
                Handled::Refused,
                attachment,
                &stale.owner,
            );
            if store.is_writable() {
                // The refusal writes nothing else but the ledger's entry (`Store::sync` says
                // whether it is synced).
                let _ = store.sync().inspect_err(|err| {
                    stderr_line!("sandbox-guard: the refusal ledger could not be synced: {err}")
                });
            }
            let err = judgement::refuse(inv, attachment, stale);
            crate::cni::metrics::commit(inv, &store, false);
            Err(err)
        }
        Judgement::Go(plan) => {
            judgement::finish(inv, attachment, &store, unwritable, plan);
            Ok(())
        }
    }
}

/// A DEL rule 7 refuses is of a sandbox whose pod the API no longer has under that name: the
/// runtime keeps retrying it, with the sandbox's netns, until the name is free, which can take
/// as long as the newer pod lives. Its interface is taken out here meanwhile, as the primary's
/// DEL would, so the old netns stops answering for the pod's address; the primary's state of
/// the name waits for that DEL.
fn remove_old_interface(
    inv: &Invocation,
    attachment: &Attachment,
    id: &AttachmentId,
) -> Result<String> {
    let store = Store::open_read_only(&inv.conf.state_dir)?;
    let Loaded::Valid(record) = store.load_record(id)? else {
        return Ok("no record of its interface here, so nothing was removed".to_string());
    };
    let mac = old_interface::recorded_mac(
        Some(&record),
        Some(&*record.prev_result),
        &attachment.ifname,
    );
    let this_boot = store.of_this_boot(record.boot_id.as_deref());
    let netns = old_interface::netns_of(attachment, &record.netns, this_boot);
    let recorded = old_interface::Recorded {
        netns,
        mac: mac.as_deref(),
        identity: record.identity.as_ref(),
        this_boot,
    };
    let live = old_interface::live_netns(&store, &record.container_id, netns);
    drop(store);
    old_interface::remove(attachment, &recorded, &live)
}
