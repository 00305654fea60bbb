//! CHECK: the attachment must have a checkpoint, the runtime's view of it (the prevResult)
//! must still match what was checkpointed at ADD, and so must the pod's netns: the
//! interface present, with its MAC, addresses and routes. The last part is what notices a
//! NIC driver reload, which takes the host parent and every macvlan on it away.

use std::path::Path;

use crate::cni::config::DEFAULT_STATE_DIR;
use crate::cni::env::Attachment;
use crate::cni::log::{Level, Outcome};
use crate::cni::result::ResultView;
use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::{self, Expected, LinkFacts};
use crate::state::checkpoint::Checkpoint;
use crate::state::{Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let prev_result = inv.conf.prev_result.as_ref().ok_or_else(|| {
        GuardError::new(
            Kind::InvalidConfig,
            "CHECK needs a prevResult: the runtime passes the cached ADD result",
        )
    })?;
    let current = ResultView::validated(prev_result, &inv.conf.cni_version)?;
    let id = inv.attachment_id(attachment);
    // The lock is held for the read only: the netlink round trips below must not hold up
    // the ADDs and DELs of other pods.
    let root = inv.conf.state_dir.clone();
    let loaded = if std::fs::symlink_metadata(&root).is_err() {
        (Loaded::Missing, root)
    } else {
        let store = Store::open_read_only(&root)?;
        let _lock = store.read_lock(inv.conf.lock_timeout, &|_| {})?;
        (store.load_record(&id)?, root)
    };

    // The log line names the pod even when CNI_ARGS do not (podman, a hand-run CHECK).
    let mut record_key = None;
    let failure = match loaded {
        (Loaded::Missing, root) => Some(
            GuardError::new(
                Kind::CheckFailed,
                format!("no checkpoint for container {} interface {} on network {}", crate::names::short_id(&id.container_id), id.if_name, id.network),
            )
            .with_details(format!(
                "{} holds none: the sandbox was added before sandbox-guard was installed, or its record was collected; \
                 re-create the pod sandbox to checkpoint it",
                root.display()
            )),
        ),
        (Loaded::Corrupt { path, reason }, _) => Some(
            GuardError::new(Kind::CheckFailed, format!("the checkpoint {} failed verification", path.display())).with_details(
                format!("{reason}; the next ADD or DEL sets it aside; re-create the pod sandbox to checkpoint it again"),
            ),
        ),
        (Loaded::Valid(record), _) => {
            record_key = record.pod_key(inv.conf.pod_key);
            let mut differences = runtime_differences(&record, &current)?;
            differences.extend(kernel_differences(inv, attachment, &record)?);
            (!differences.is_empty()).then(|| {
                let more = match differences.len() {
                    1 => String::new(),
                    n => format!(" (and {} more differences)", n - 1),
                };
                GuardError::new(
                    Kind::CheckFailed,
                    format!("container {} interface {} differs from its checkpoint: {}{more}", crate::names::short_id(&id.container_id), id.if_name, differences[0]),
                )
                .with_details(
                    serde_json::json!({ "differences": differences, "generation": record.generation, "checkpointedAt": record.updated_at })
                        .to_string(),
                )
            })
        }
    };
    let pod = inv.pod_key(attachment).or(record_key).map(|key| key.pod());
    let subject = inv.subject(Some(attachment), pod);
    match failure {
        None => {
            inv.log
                .event(Level::Info, inv.verb, &subject, Outcome::Checked, "");
            Ok(())
        }
        Some(err) => {
            inv.log.event(
                Level::Warn,
                inv.verb,
                &subject,
                Outcome::CheckFailed,
                &err.msg,
            );
            Err(err)
        }
    }
}

/// The runtime's cached result against the checkpointed one.
fn runtime_differences(record: &Checkpoint, current: &ResultView) -> Result<Vec<String>> {
    let recorded = ResultView::parse(&record.prev_result)?.cidrs();
    let now = current.cidrs();
    Ok(if recorded == now {
        Vec::new()
    } else {
        vec![format!(
            "the runtime has addresses [{}], the checkpoint has [{}]",
            now.join(", "),
            recorded.join(", ")
        )]
    })
}

/// The pod's netns against the link facts (or, without them, the checkpointed result).
fn kernel_differences(
    inv: &Invocation,
    attachment: &Attachment,
    record: &Checkpoint,
) -> Result<Vec<String>> {
    let expected = expected(record)?;
    let netns = &attachment.netns;
    match link_facts::observe_for_check(Path::new(netns), &expected) {
        // Neither ADD's look into the netns nor the result named the interface (a 0.1.0/0.2.0
        // primary that calls it otherwise): its absence under CNI_IFNAME says nothing, and
        // --restore could not rebuild it anyway.
        Ok(observed) if observed.link.is_none() && !interface_known(record)? => Ok(Vec::new()),
        Ok(observed) => Ok(link_facts::differences(
            &expected,
            &observed,
            netns,
            &restore_command(inv, record),
        )),
        Err(err) if err.kind == Kind::NetnsGone => {
            Ok(vec![format!("{}: the sandbox's netns is gone", err.msg)])
        }
        Err(err) => Err(err),
    }
}

/// Whether ADD saw the interface in the netns, or the primary's result names one.
fn interface_known(record: &Checkpoint) -> Result<bool> {
    if let Some(LinkFacts::Observed(_)) = &record.links {
        return Ok(true);
    }
    Ok(!ResultView::parse(&record.prev_result)?
        .interfaces
        .is_empty())
}

fn restore_command(inv: &Invocation, record: &Checkpoint) -> String {
    let state_dir = &inv.conf.state_dir;
    if state_dir == Path::new(DEFAULT_STATE_DIR) {
        format!("sandbox-guard --restore {}", record.container_id)
    } else {
        format!(
            "sandbox-guard --restore --state-dir {} {}",
            state_dir.display(),
            record.container_id
        )
    }
}

/// What CHECK expects in the netns: the link facts when ADD recorded them, else what the
/// primary's result says (records from before link facts, or facts that were unavailable).
fn expected(record: &Checkpoint) -> Result<Expected> {
    if let Some(LinkFacts::Observed(facts)) = &record.links {
        return Ok(Expected {
            if_name: record.if_name.clone(),
            mac: facts.mac.clone(),
            addresses: facts.addresses.clone(),
            routes: facts.routes.iter().map(|r| (r.dst, r.gateway)).collect(),
            parent: facts.parent.clone(),
        });
    }
    let view = ResultView::parse(&record.prev_result)?;
    let mac = view
        .interfaces
        .iter()
        .find(|i| i.name == record.if_name && i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        .and_then(|i| i.mac.clone());
    Ok(Expected {
        if_name: record.if_name.clone(),
        mac: mac.map(|m| m.to_ascii_lowercase()),
        addresses: view.ips.iter().map(|ip| ip.address).collect(),
        routes: view.routes.iter().map(|r| (r.dst, r.gw)).collect(),
        parent: None,
    })
}
