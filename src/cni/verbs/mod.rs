//! One file per CNI verb. Each gets the parsed invocation and returns what goes to stdout.

pub mod add;
pub mod check;
pub mod del;
pub mod delegated;
pub mod gc;
pub mod ip_conflict;
pub mod status;

use crate::cni::config::NetConf;
use crate::cni::env::{Attachment, Verb};
use crate::cni::log::{Log, Subject};
use crate::state::checkpoint::AttachmentId;
use crate::state::ownership::PodKey;

/// What every verb needs besides its attachment: the config and the log.
pub struct Invocation {
    pub verb: Verb,
    pub conf: NetConf,
    pub log: Log,
    /// The verb's success is counted already (`metrics::commit`).
    pub metrics_committed: std::cell::Cell<bool>,
}

impl Invocation {
    pub fn attachment_id(&self, attachment: &Attachment) -> AttachmentId {
        AttachmentId {
            network: self.conf.network.clone(),
            container_id: attachment.container_id.clone(),
            if_name: attachment.ifname.clone(),
        }
    }

    /// The pod key `CNI_ARGS` name for `attachment`, if they name a pod.
    pub fn pod_key(&self, attachment: &Attachment) -> Option<PodKey> {
        let pod = &attachment.pod;
        crate::state::checkpoint::pod_key(&self.conf.network, pod.namespace.as_deref(), pod.name.as_deref(), &attachment.ifname)
    }

    pub fn subject<'a>(&'a self, attachment: Option<&'a Attachment>, pod: Option<String>) -> Subject<'a> {
        Subject {
            network: &self.conf.network,
            container_id: attachment.map_or("-", |a| a.container_id.as_str()),
            if_name: attachment.map_or("-", |a| a.ifname.as_str()),
            pod,
        }
    }
}
