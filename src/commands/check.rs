//! CHECK: the attachment must have a checkpoint, the runtime's view of it (the prevResult)
//! must still match what was checkpointed at ADD, and so must the pod's netns: the
//! interface present, with its MAC, addresses and routes. The last part is what notices a
//! NIC driver reload, which takes the host parent and every macvlan on it away.

use std::path::Path;

use crate::commands::Invocation;
use crate::config::DEFAULT_STATE_DIR;
use crate::env::Attachment;
use crate::error::{GuardError, Kind, Result};
use crate::link_facts::{self, Expected};
use crate::log::Level;
use crate::prev_result::ResultView;
use crate::store::checkpoint::{self, Checkpoint};
use crate::store::{Access, Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let prev_result = inv.conf.prev_result.as_ref().ok_or_else(|| {
        GuardError::new(Kind::InvalidConfig, "CHECK needs a prevResult: the runtime passes the cached ADD result")
    })?;
    let current = ResultView::validated(prev_result, &inv.conf.cni_version)?;
    let id = inv.attachment_id(attachment);
    // The lock is held for the read only: the netlink round trips below must not hold up
    // the ADDs and DELs of other pods.
    let loaded = {
        let store = Store::open(&inv.conf.state_dir, Access::Shared)?;
        (store.load_record(&id)?, store.root().to_path_buf())
    };

    // The log line names the pod even when CNI_ARGS do not (podman, a hand-run CHECK).
    let mut record_key = None;
    let failure = match loaded {
        (Loaded::Missing, root) => Some(GuardError::new(
            Kind::CheckFailed,
            format!(
                "no checkpoint for container {} interface {} on network {} in {}: the sandbox was not \
                 added through sandbox-guard (was it added before the plugin was installed?) or its \
                 record was collected; re-create the pod sandbox to checkpoint it",
                id.container_id, id.if_name, id.network, root.display()
            ),
        )),
        (Loaded::Corrupt { path, reason }, _) => Some(GuardError::new(
            Kind::CheckFailed,
            format!(
                "the checkpoint {} failed verification ({reason}); the next ADD or DEL sets it aside; \
                 re-create the pod sandbox to checkpoint it again",
                path.display()
            ),
        )),
        (Loaded::Valid(record), _) => {
            record_key = record.pod_key();
            let mut differences = runtime_differences(&record, &current)?;
            differences.extend(kernel_differences(inv, attachment, &record)?);
            (!differences.is_empty()).then(|| {
                GuardError::new(
                    Kind::CheckFailed,
                    format!(
                        "container {} interface {} differs from its checkpoint (generation {}, {}): {}",
                        id.container_id, id.if_name, record.generation, record.updated_at, differences.join("; ")
                    ),
                )
                .with_details(serde_json::json!({ "differences": differences }).to_string())
            })
        }
    };
    let pod = checkpoint::pod_key(&id.network, attachment.pod.namespace.as_deref(), attachment.pod.name.as_deref(), &id.if_name)
        .or(record_key)
        .map(|key| key.pod());
    let subject = inv.subject(Some(attachment), pod);
    match failure {
        None => {
            inv.log.event(Level::Info, inv.verb, &subject, "checked", "");
            Ok(())
        }
        Some(err) => {
            inv.log.event(Level::Warn, inv.verb, &subject, "check-failed", &err.msg);
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
        vec![format!("the runtime has addresses [{}], the checkpoint has [{}]", now.join(", "), recorded.join(", "))]
    })
}

/// The pod's netns against the link facts (or, without them, the checkpointed result).
fn kernel_differences(inv: &Invocation, attachment: &Attachment, record: &Checkpoint) -> Result<Vec<String>> {
    let expected = Expected::from_record(record)?;
    let netns = &attachment.netns;
    match link_facts::observe_for_check(Path::new(netns), &expected) {
        Ok(observed) => Ok(link_facts::differences(&expected, &observed, netns, &restore_command(inv, record))),
        Err(err) if err.kind == Kind::NetnsGone => Ok(vec![format!("{}: the sandbox's netns is gone", err.msg)]),
        Err(err) => Err(err),
    }
}

fn restore_command(inv: &Invocation, record: &Checkpoint) -> String {
    let state_dir = &inv.conf.state_dir;
    if state_dir == Path::new(DEFAULT_STATE_DIR) {
        format!("sandbox-guard --restore {}", record.container_id)
    } else {
        format!("sandbox-guard --restore --state-dir {} {}", state_dir.display(), record.container_id)
    }
}
