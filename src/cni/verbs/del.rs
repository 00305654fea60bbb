//! DEL: remove the attachment's checkpoint, unless a newer sandbox owns the pod key.
//!
//! This plugin is last in the chain, so it runs first on DEL: refusing here keeps the DEL
//! from ever reaching the primary plugin, which would release the newer sandbox's IP. Every
//! other DEL must pass, even when the store cannot be written: a teardown is never held up
//! for the guard's own bookkeeping.

use super::api_check;
use super::judgement::{self, Judgement};
use crate::cni::config::StaleDelPolicy;
use crate::cni::env::Attachment;
use crate::cni::verbs::Invocation;
use crate::error::Result;
use crate::state::ledger::Handled;

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let mut asked_api = false;
    let mut moved = None;
    loop {
        let Some((store, unwritable)) = judgement::open(inv, attachment)? else {
            judgement::nothing_recorded(inv, attachment);
            return Ok(());
        };
        let mut judged = judgement::judge(inv, attachment, &store)?;
        if let Judgement::Go(plan) = &judged
            && !asked_api
            && plan.asks_api(inv)
        {
            // Asked without the store's lock, then judged again: a newer ADD of the pod may
            // have come in meanwhile.
            drop(store);
            asked_api = true;
            moved = api_check::name_moved(inv, attachment, &plan.keys, plan.pod_uid.as_deref());
            if let Some(moved) = moved.take_if(|_| inv.conf.stale_del == StaleDelPolicy::Refuse) {
                return Err(moved.refuse(inv, attachment));
            }
            continue;
        }
        if let (Judgement::Go(plan), Some(moved)) = (&mut judged, moved.take()) {
            plan.audit_moved(moved);
        }
        return decide(inv, attachment, store, unwritable, judged);
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
                    eprintln!("sandbox-guard: the refusal ledger could not be synced: {err}")
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
