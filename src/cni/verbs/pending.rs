//! Delegate mode's ADDs cut off at the primary (`state::pending_add`). Whoever takes the
//! pod's lock next (an ADD, DEL or CHECK of the pod, the replay sweep) finds the note of an
//! ADD that neither committed nor failed, and before its own work rolls it back: what is
//! left of that primary run is killed, and the primary gets the DEL of that sandbox. So no
//! other DEL of the pod reaches the primary beside that sandbox's half-made state.
//!
//! While another sandbox holds the pod with a live netns, a DEL as the cut-off sandbox could
//! tear the holder's network down by the pod's name (its primary may have been killed before
//! it acted): then only the holder's own DEL rolls back (its network goes anyway), and the
//! note of an ADD that reaches the primary replaces it (at the primary that ADD takes the
//! pod's name over). Any other verb only kills what is left, and the note waits.
//!
//! A rollback the primary refuses keeps its note, and the verb fails with code 11 (the runtime
//! retries it): nothing else of the pod may reach the primary meanwhile.

use serde_json::value::RawValue;

use super::Invocation;
use crate::cni::delegate::{Delegate, EnvOverride};
use crate::cni::env::Attachment;
use crate::cni::log::{Level, Outcome, Subject};
use crate::error::{GuardError, Kind, Result};
use crate::state::deferred::DeferredDel;
use crate::state::ownership::PodKey;
use crate::state::pending_add::{self, PendingAdd};
use crate::state::{Loaded, Store, surely_absent};

/// Failed rollbacks after which the note goes and the pod's verbs go on without it.
const GIVE_UP_AFTER: u32 = 5;

/// The verb that takes the pod's lock after a cut-off ADD, which decides what may reach the
/// primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextVerb<'a> {
    /// The DEL of this container.
    Del(&'a str),
    /// An ADD, a CHECK, a replay or a sweep.
    Other,
}

/// What the primary of a noted ADD is given: where it writes its pid, and its nonce.
pub struct Noted {
    pub pid_file: std::path::PathBuf,
    pub nonce: String,
}

/// Notes the ADD of `attachment` before its primary runs; `None` when no note could be
/// written (the ADD goes on as without one).
pub fn note(
    inv: &Invocation,
    delegate: &Delegate,
    attachment: &Attachment,
    key: &PodKey,
) -> Option<Noted> {
    let note = PendingAdd::new(
        key,
        &attachment.container_id,
        &attachment.ifname,
        &attachment.netns,
        &attachment.args,
        &inv.conf.cni_version,
        delegate.recorded_conf(),
    );
    let root = &inv.conf.state_dir;
    // A mark of an earlier try of this sandbox speaks for that try only.
    let _ = pending_add::remove_rolled_back(root, &note.id());
    let replaced = match pending_add::load(root, &key.digest()) {
        Ok(Loaded::Valid(kept)) if kept.id() != note.id() => Some(kept),
        _ => None,
    };
    match pending_add::save(root, &note) {
        Ok(()) => {
            if let Some(kept) = replaced {
                // Kept while a live sandbox owns the pod (`resolve` killed what was left):
                // this ADD takes the pod's name over at the primary.
                log_given_up(
                    inv,
                    &kept,
                    "this ADD takes the pod's name over at the primary",
                );
            }
            Some(Noted {
                pid_file: pending_add::pid_path(root, &key.digest()),
                nonce: note.nonce,
            })
        }
        Err(err) => {
            stderr_line!(
                "sandbox-guard: the ADD goes on without its note ({err}); if it is cut off, the next DEL of the pod may reach the primary beside what it left"
            );
            None
        }
    }
}

/// Removes the note of the ADD that just committed or failed.
pub fn clear(inv: &Invocation, key: &PodKey) {
    if let Err(err) = pending_add::clear(&inv.conf.state_dir, &key.digest()) {
        stderr_line!("sandbox-guard: the note of this ADD could not be removed: {err}");
    }
}

/// Rolls back the cut-off ADD noted for `key`, if there is one, before `verb` does its own
/// work; the caller holds the pod's lock.
pub fn resolve(inv: &Invocation, current: &Delegate, key: &PodKey, verb: NextVerb) -> Result<()> {
    let root = &inv.conf.state_dir;
    let digest = key.digest();
    if surely_absent(&pending_add::note_path(root, &digest)) {
        return Ok(());
    }
    // The note is a safety net: a store that cannot read or remove it fails no verb.
    let forget = || {
        if let Err(err) = pending_add::clear(root, &digest) {
            stderr_line!("sandbox-guard: a note of a cut-off ADD could not be removed: {err}");
        }
    };
    let mut note = match pending_add::load(root, &digest) {
        Ok(Loaded::Valid(note)) if !note.of_another_boot() && note.key == *key => note,
        Ok(Loaded::Missing) => return Ok(()),
        Err(err) => {
            stderr_line!("sandbox-guard: a note of a cut-off ADD could not be read: {err}");
            return Ok(());
        }
        // Unreadable, or of another boot (nothing of it runs): nothing to roll back by.
        Ok(_) => {
            forget();
            return Ok(());
        }
    };
    let id = note.id();
    let holder = Holder::of(root, key, &note.container_id, &note.if_name);
    let Some(pid) = pending_add::primary_pid(root, &digest).filter(|_| holder != Holder::Itself)
    else {
        // Committed (its guard died before removing the note), or its primary never ran.
        forget();
        return Ok(());
    };
    let left = note.kill_processes(pid);
    let pod = &note.key;
    let rule_key = inv.conf.pod_key.key(
        &pod.network,
        &pod.pod_namespace,
        &pod.pod_name,
        &note.if_name,
    );
    if left == 0 && rule_key != *pod {
        // Keyed by the rule before the network's podKey changed: the pod's owner and locks
        // are under other keys now, so whether a DEL as this sandbox is safe cannot be told.
        forget();
        log_given_up(inv, &note, "the network's podKey rule changed since");
        return Ok(());
    }
    let owners_del =
        matches!((&holder, verb), (Holder::Live(Some(owner)), NextVerb::Del(del)) if *owner == del);
    if left == 0 && matches!(holder, Holder::Live(_)) && !owners_del {
        // The primary may have been killed before it acted on this ADD: a DEL as this
        // sandbox could then tear down the live owner's network by the pod's name. Kept for
        // the owner's DEL, or for the note of an ADD that reaches the primary; this verb is
        // judged as without a note (the sandbox's own DEL as any stale one).
        return Ok(());
    }
    let outcome = if left > 0 {
        Err(GuardError::new(
            Kind::Busy,
            format!("{left} processes of the primary's ADD still run after SIGKILL"),
        ))
    } else {
        delete_as(inv, current, &note)
    };
    match outcome {
        Ok(()) => {
            // Without its mark the sandbox's own DEL is judged as any; without the note's
            // removal the next verb gives the primary this DEL again, which it tolerates.
            if let Err(err) = pending_add::mark_rolled_back(root, &id) {
                stderr_line!("sandbox-guard: a rollback could not be marked: {err}");
            }
            forget();
            inv.log.event(Level::Warn, inv.verb, &note_subject(&note), Outcome::RolledBack, &format!(
                "the ADD of sandbox {} (since {}) was cut off at the primary; what was left of it was killed and the primary had its DEL",
                note.container_id, note.written_at
            ));
            Ok(())
        }
        Err(err) if note.attempts + 1 >= GIVE_UP_AFTER => {
            // The pod's teardown is not held for good: what the primary made of the cut-off
            // sandbox stays, as without a note, and its own DEL is judged as any.
            forget();
            inv.log.event(Level::Error, inv.verb, &note_subject(&note), Outcome::RollbackFailed, &format!(
                "the rollback of sandbox {}'s cut-off ADD failed {GIVE_UP_AFTER} times and is given up (what the primary made \
                 of it may stay): {}",
                note.container_id, err.msg
            ));
            Ok(())
        }
        Err(err) => {
            note.attempts += 1;
            note.last_error = Some(crate::names::shorten(&err.msg));
            match pending_add::update(root, &note) {
                Ok(true) => {}
                // Removed meanwhile: the operator gave the rollback up.
                Ok(false) => return Ok(()),
                // Uncounted, the attempts would hold the pod's teardown for as long as the
                // store takes no write (a full disk, when kubelet evicts pods); but while
                // processes of the cut-off ADD still run, nothing may go to the primary.
                Err(unsaved) if left == 0 => {
                    forget();
                    inv.log.event(Level::Error, inv.verb, &note_subject(&note), Outcome::RollbackFailed, &format!(
                        "the rollback of sandbox {}'s cut-off ADD failed and is given up, since its note cannot count the \
                         attempt ({}): {}",
                        note.container_id, unsaved.msg, err.msg
                    ));
                    return Ok(());
                }
                Err(_) => {}
            }
            inv.log.event(Level::Error, inv.verb, &note_subject(&note), Outcome::RollbackFailed, &format!(
                "the ADD of sandbox {} was cut off at the primary and its rollback failed (attempt {}): {}",
                note.container_id, note.attempts, err.msg
            ));
            let path = pending_add::note_path(root, &digest);
            Err(GuardError::new(
                Kind::Busy,
                format!(
                    "pod {} waits for the rollback of sandbox {}'s cut-off ADD, which failed: {}",
                    key.pod(),
                    crate::names::short_id(&note.container_id),
                    err.msg
                ),
            )
            .with_details(format!(
                "Nothing else of the pod reaches the primary beside that sandbox's half-made state. The runtime retries; \
                 the next try rolls back again. To give the rollback up (what the primary made of that sandbox stays), remove {}",
                path.display()
            )))
        }
    }
}

fn note_subject(note: &PendingAdd) -> Subject<'_> {
    Subject {
        network: &note.key.network,
        container_id: &note.container_id,
        if_name: &note.if_name,
        pod: Some(note.key.pod()),
    }
}

/// Logs a cut-off ADD whose note goes without a DEL as its sandbox (`Outcome::CutOff`), and `why`.
fn log_given_up(inv: &Invocation, note: &PendingAdd, why: &str) {
    inv.log.event(Level::Warn, inv.verb, &note_subject(note), Outcome::CutOff, &format!(
        "the ADD of sandbox {} (since {}) was cut off at the primary and what was left of it was killed; {why}, so its \
         rollback is given up and the cut-off sandbox's own DEL is judged as any stale one",
        note.container_id, note.written_at
    ));
}

/// The primary's DEL as the cut-off sandbox: its recorded object, `CNI_ARGS` and version,
/// its netns while the path still names it, no prevResult (the ADD gave none), the replay
/// budget.
fn delete_as(inv: &Invocation, current: &Delegate, note: &PendingAdd) -> Result<()> {
    let recorded = Delegate::from_recorded(note.delegate.clone());
    let delegate = recorded.as_ref().unwrap_or(current);
    let netns = match note.netns_id {
        Some(then) if crate::kernel::netns::netns_identity(&note.netns) == Some(then) => {
            note.netns.as_str()
        }
        _ => "",
    };
    let env = EnvOverride {
        command: Some("DEL"),
        container_id: Some(&note.container_id),
        netns: Some(netns),
        if_name: Some(&note.if_name),
        args: Some(&note.cni_args),
        pid_file: None,
        marker: None,
    };
    let deadline = std::time::Instant::now() + inv.conf.replay_timeout;
    let none: Option<&RawValue> = None;
    delegate
        .call_within(
            &note.key.network,
            &note.cni_version,
            none,
            &env,
            Some(deadline),
        )
        .map(|_| ())
}

/// Who holds a pod key, seen from one attachment of a sandbox.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// The sandbox itself, by this attachment: its ADD committed.
    Itself,
    /// Another sandbox whose netns lives (`None`: the store cannot say who).
    Live(Option<String>),
    /// Nobody, or a sandbox whose netns is gone.
    None,
}

impl Holder {
    fn of(root: &std::path::Path, key: &PodKey, container_id: &str, if_name: &str) -> Holder {
        // A store that cannot say is read as a live owner: no DEL goes to the primary.
        let Ok(store) = Store::open_read_only(root) else {
            return Holder::Live(None);
        };
        match store.load_owner(key) {
            Ok(Loaded::Valid(owner)) if owner.holds(container_id, if_name) => Holder::Itself,
            Ok(Loaded::Valid(owner)) if store.owner_netns_alive(&owner) => {
                Holder::Live(Some(owner.container_id))
            }
            Ok(Loaded::Valid(_) | Loaded::Missing) => Holder::None,
            _ => Holder::Live(None),
        }
    }
}

/// A deferred DEL of a sandbox whose cut-off ADD was rolled back since: the primary has had
/// it, so the entry goes without calling the primary. `false`: not such an entry, or one
/// whose removal failed (it is replayed as any).
pub fn answered_by_rollback(inv: &Invocation, entry: &DeferredDel) -> bool {
    let root = &inv.conf.state_dir;
    let id = entry.id();
    if !pending_add::rolled_back(root, &id) {
        return false;
    }
    let removed = Store::open(root, inv.conf.lock_timeout)
        .and_then(|store| store.remove_deferred(&entry.key, &id));
    if removed.is_err() {
        return false;
    }
    let _ = pending_add::remove_rolled_back(root, &id);
    let subject = Subject {
        network: &entry.key.network,
        container_id: &entry.container_id,
        if_name: entry.if_name(),
        pod: Some(entry.key.pod()),
    };
    inv.log.event(Level::Info, inv.verb, &subject, Outcome::RolledBack, &format!(
        "the deferred DEL of sandbox {} goes without the primary: its cut-off ADD was rolled back, which gave the primary this DEL",
        entry.container_id
    ));
    true
}

/// A DEL of a sandbox whose cut-off ADD was rolled back: the primary has had it, so it is
/// answered here (once; a later one is judged as any). `false`: not such a DEL.
pub fn answered_as_rolled_back(inv: &Invocation, attachment: &Attachment) -> bool {
    let root = &inv.conf.state_dir;
    let id = inv.attachment_id(attachment);
    if !pending_add::rolled_back(root, &id) {
        return false;
    }
    let _ = pending_add::remove_rolled_back(root, &id);
    if inv.pod_key(attachment).is_none_or(|key| {
        Holder::of(root, &key, &attachment.container_id, &attachment.ifname) == Holder::Itself
    }) {
        // Added again since: its DEL is judged as any owner's.
        return false;
    }
    let subject = inv.subject(Some(attachment), None);
    inv.log.event(
        Level::Info,
        inv.verb,
        &subject,
        Outcome::RolledBack,
        &format!(
            "sandbox {}'s cut-off ADD was rolled back, so the primary has had this DEL already",
            attachment.container_id
        ),
    );
    true
}
