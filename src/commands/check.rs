//! CHECK: the attachment must have a checkpoint, and the runtime's view of it (the
//! prevResult) must still match what was checkpointed at ADD.

use crate::commands::Invocation;
use crate::env::Attachment;
use crate::error::{GuardError, Kind, Result};
use crate::log::Level;
use crate::prev_result::ResultView;
use crate::store::{Access, Loaded, Store};

pub fn run(inv: &Invocation, attachment: &Attachment) -> Result<()> {
    let prev_result = inv.conf.prev_result.as_ref().ok_or_else(|| {
        GuardError::new(Kind::InvalidConfig, "CHECK needs a prevResult: the runtime passes the cached ADD result")
    })?;
    let current = ResultView::parse(prev_result)?;
    let id = inv.attachment_id(attachment);
    let store = Store::open(&inv.conf.state_dir, Access::Shared)?;

    let failure = match store.load_record(&id)? {
        Loaded::Missing => Some(GuardError::new(
            Kind::CheckFailed,
            format!(
                "no checkpoint for container {} interface {} on network {} in {}: the sandbox was not \
                 added through sandbox-guard (was it added before the plugin was installed?) or its \
                 record was collected; re-create the pod sandbox to checkpoint it",
                id.container_id, id.if_name, id.network, store.root().display()
            ),
        )),
        Loaded::Corrupt { path, reason } => Some(GuardError::new(
            Kind::SetAside,
            format!(
                "the checkpoint {} failed verification ({reason}); the next ADD or DEL sets it aside; \
                 re-create the pod sandbox to checkpoint it again",
                path.display()
            ),
        )),
        Loaded::Valid(record) => {
            let recorded = ResultView::parse(&record.prev_result)?.cidrs();
            let now = current.cidrs();
            (recorded != now).then(|| {
                GuardError::new(
                    Kind::CheckFailed,
                    format!(
                        "the addresses of container {} interface {} differ from its checkpoint: the \
                         runtime has [{}], the checkpoint (generation {}, {}) has [{}]",
                        id.container_id, id.if_name, now.join(", "), record.generation, record.updated_at,
                        recorded.join(", ")
                    ),
                )
            })
        }
    };
    let subject = inv.subject(Some(attachment), None);
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
