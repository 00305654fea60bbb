//! ADD: checkpoint the attachment and make this sandbox the owner of its pod key.

use crate::cni::env::Attachment;
use crate::cni::log::{Level, Outcome};
use crate::cni::result::ResultView;
use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::LinkFacts;
use crate::state::Loaded;
use crate::state::checkpoint::Checkpoint;
use crate::state::ownership;
use serde_json::value::RawValue;

/// Returns the primary's result in the config's cniVersion: byte for byte when it is in that
/// version already (a chained plugin that changes nothing must not drop fields it does not
/// know), else converted, unknown fields kept. A failure of the guard's own (the lock, the
/// disk, an IP conflict) is noted (see `store::failed_add`) so that the runtime's cleanup DEL
/// of this sandbox is not taken for a stale one; input it rejects leaves the store untouched.
pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<String> {
    let prev_result = inv.conf.prev_result.as_ref().ok_or_else(|| {
        GuardError::new(
            Kind::InvalidConfig,
            "no prevResult: chained, sandbox-guard goes LAST in the conflist's \"plugins\", after the \
             primary plugin that sets up the interface (or wrap the primary: \"delegate\")",
        )
    })?;
    if let Some(key) = inv.pod_key(attachment) {
        super::api_check::refuse_late_add(inv, attachment, &key)?;
    }
    checkpoint(inv, attachment, prev_result)
}

/// Checkpoints the attachment the primary set up, with the primary's result, and takes its
/// pod key.
pub(super) fn checkpoint(
    inv: &Invocation,
    attachment: &Attachment,
    prev_result: &RawValue,
) -> Result<String> {
    add(inv, attachment, prev_result).inspect_err(|err| {
        if matches!(
            err.kind,
            Kind::Busy
                | Kind::Io
                | Kind::ReadOnly
                | Kind::IpConflict
                | Kind::Netlink
                | Kind::NetnsGone
        ) {
            crate::state::failed_add::mark(
                &inv.conf.state_dir,
                &inv.attachment_id(attachment),
                err,
            );
        }
    })
}

fn add(inv: &Invocation, attachment: &Attachment, prev_result: &RawValue) -> Result<String> {
    // Both before the store is opened: a result that is not one must leave no trace.
    let view = ResultView::validated(prev_result, &inv.conf.cni_version)?;
    let output = crate::cni::result::as_version(prev_result, &inv.conf.cni_version)?;
    // Read from the kernel before the lock is taken: no ADD holds it while waiting on netlink.
    let seen = crate::kernel::link_facts::read_at_add(&attachment.netns, &attachment.ifname);
    let links = seen.links;
    let identity = seen.netns_id.map(|(netns_dev, netns_inode)| {
        let if_kind = match &links {
            crate::kernel::link_facts::LinkFacts::Observed(facts) => facts.kind.clone(),
            _ => None,
        };
        crate::state::checkpoint::SandboxIdentity {
            netns_dev,
            netns_inode,
            netns_cookie: seen.netns_cookie,
            if_index: seen.if_index,
            if_kind,
        }
    });

    let id = inv.attachment_id(attachment);
    let pod = &attachment.pod;
    let pod_key = inv.pod_key(attachment);
    let subject = inv.subject(Some(attachment), pod_key.as_ref().map(|k| k.pod()));

    let store = inv
        .open_store(Some(attachment))
        .map_err(|err| match err.kind {
            Kind::ReadOnly => read_only_error(inv, attachment, err),
            _ => err,
        })?;
    let previous: Option<Checkpoint> = match store.load_record(&id)? {
        Loaded::Valid(record) => Some(record),
        Loaded::Missing => None,
        Loaded::Corrupt { path, reason } => {
            let kept = store.keep_copy(&path, &store.set_aside_path_for_record(&id))?;
            inv.log.event(Level::Warn, inv.verb, &subject, Outcome::SetAside,
                &format!("previous checkpoint failed verification ({reason}); kept at {}; this ADD writes a fresh one", kept.display()));
            None
        }
    };
    let owner = match &pod_key {
        None => None,
        Some(key) => match store.load_owner(key)? {
            Loaded::Valid(owner) => Some(owner),
            Loaded::Missing => None,
            Loaded::Corrupt { path, reason } => {
                let kept = store.keep_copy(&path, &store.set_aside_path_for_owner(key))?;
                inv.log.event(Level::Warn, inv.verb, &subject, Outcome::SetAside,
                    &format!("ownership record failed verification ({reason}); kept at {}; this ADD takes ownership", kept.display()));
                None
            }
        },
    };

    let previous_key = previous
        .as_ref()
        .and_then(|record| record.pod_key(inv.conf.pod_key));
    let previous_created = previous.as_ref().map(|r| r.created_at.clone());
    let generation = ownership::next_generation(
        store.generation_counter(),
        owner.as_ref(),
        previous.as_ref().map(|r| r.generation),
    );
    // Before the record and the ownership are written: an ADD refused for an address that
    // another live namespace holds must not take the pod key.
    let address_claim = super::ip_conflict::check_addresses(
        inv.conf.ip_conflict,
        &store,
        attachment,
        &id,
        &view,
        seen.netns_id.map(|(_, inode)| inode),
    )?;
    let now = crate::clock::now_rfc3339();
    let record = Checkpoint {
        network: id.network.clone(),
        container_id: id.container_id.clone(),
        if_name: id.if_name.clone(),
        pod_namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        infra_container_id: pod.infra_container_id.clone(),
        netns: attachment.netns.clone(),
        cni_version: inv.conf.cni_version.clone(),
        generation,
        created_at: previous_created.clone().unwrap_or_else(|| now.clone()),
        updated_at: now,
        prev_result: prev_result.to_owned(),
        links: Some(links),
        identity,
        boot_id: store.boot_id().map(str::to_string),
        held: None,
    };
    // Re-ADDed under another pod name: the key its old record held is no longer this
    // interface's. Released first, so no crash leaves an owner whose record names another key.
    if let Some(old_key) = previous_key.filter(|old| Some(old) != pod_key.as_ref())
        && let Loaded::Valid(owner) = store.load_owner(&old_key)?
        && owner.container_id == id.container_id
    {
        store.update_owner(&old_key, ownership::released(&owner, &id.if_name).as_ref())?;
        store.sync()?;
    }
    // The record before the ownership that points at it: no killed writer leaves an owner
    // without its record. Where the store is not scoped to a boot, `Store::sync` then makes
    // both durable in that order, with the removal of an earlier failed ADD's note (this
    // sandbox has a record now).
    store.save_record(&record)?;
    store.remove_failed_add(&id)?;
    if let Some(key) = &pod_key {
        let owner = ownership::taken(
            key,
            &id.container_id,
            &id.if_name,
            pod.uid.clone(),
            generation,
            owner.as_ref(),
        );
        if let Err(err) = store.save_owner(&owner) {
            // Failed before it took the key: a first record would make the runtime's cleanup
            // DEL look like the DEL of a superseded sandbox, so it goes again.
            if previous_created.is_none() {
                let _ = store.remove_record(&id).and_then(|()| store.sync());
            }
            return Err(err);
        }
    }
    // The address index is a hint, never synced: its entries go in once the record and the
    // ownership are in place, so a failed ADD never displaces the live holder an entry names.
    let ip_conflict = address_claim.record(&store);
    // This ADD is counted as added now, and its log line below is not counted again.
    crate::cni::metrics::commit_with(inv, &store, true, Some(Outcome::Added));
    if inv.conf.pod_key == crate::state::ownership::PodKeyRule::NameAndIfname {
        store.set_generation_counter_durably(generation)?;
    }
    store.sync()?;
    // Blockers are disarmed only once what they stood for is durable again.
    let mut unblocked = store.unblock(&store.set_aside_path_for_record(&id))?;
    if let Some(key) = &pod_key {
        unblocked |= store.unblock(&store.set_aside_path_for_owner(key))?;
    }
    if unblocked {
        store.sync()?;
    }
    store.set_generation_counter(generation);

    let took_over = owner
        .filter(|o| o.container_id != id.container_id)
        .map(|o| {
            format!(
                "; took the pod key over from sandbox {} (generation {})",
                crate::names::short_id(&o.container_id),
                o.generation
            )
        });
    let facts_missing = record.links.as_ref().and_then(LinkFacts::missing_note);
    let level = if ip_conflict.is_some() || facts_missing.is_some() {
        Level::Warn
    } else {
        Level::Info
    };
    // Fields for programs, then the text for people; the text starts with a word of its own,
    // as a first word `key=value` would read as a forged field and be escaped.
    let generation = generation.to_string();
    inv.log.event_with(
        level,
        inv.verb,
        &subject,
        Outcome::Added,
        &[
            ("generation", generation.as_str()),
            ("netns", attachment.netns.as_str()),
        ],
        &format!(
            "checkpointed{}{}{}",
            took_over.unwrap_or_default(),
            ip_conflict.unwrap_or_default(),
            facts_missing.unwrap_or_default()
        ),
    );
    if inv.metrics_committed.get() {
        // Counted above.
        inv.log.take_outcomes();
    }
    Ok(output.into_owned())
}

fn read_only_error(
    inv: &Invocation,
    attachment: &Attachment,
    err: crate::error::GuardError,
) -> crate::error::GuardError {
    GuardError::new(
        Kind::ReadOnly,
        format!(
            "cannot checkpoint sandbox {}: the state dir {} is on a read-only filesystem",
            crate::names::short_id(&attachment.container_id),
            inv.conf.state_dir.display()
        ),
    )
    .with_details(format!(
        "Without its checkpoint the guard could not tell this pod's DELs from stale ones, so the pod would run \
         unprotected. {} ({})",
        err.details, err.msg
    ))
}
