//! One exec of the plugin as the verbs see it: the verb, the network's config, the log, and
//! what they derive from them (the attachment's id and pod key, the store, a log subject).

use crate::cni::config::NetConf;
use crate::cni::env::{Attachment, Verb};
use crate::cni::log::{Log, Subject};
use crate::state::Store;
use crate::state::checkpoint::AttachmentId;
use crate::state::ownership::PodKey;

/// What every verb needs besides its attachment: the config and the log.
pub struct Invocation {
    pub verb: Verb,
    pub conf: NetConf,
    pub log: Log,
    /// The verb's success is counted already (`metrics::commit`).
    pub metrics_committed: std::cell::Cell<bool>,
    /// The network configuration as it came on stdin: the replay worker gets it too.
    pub conf_bytes: Vec<u8>,
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
        crate::state::checkpoint::pod_key(
            self.conf.pod_key,
            &self.conf.network,
            pod.namespace.as_deref(),
            pod.name.as_deref(),
            &attachment.ifname,
        )
    }

    /// The store for writing, its files keyed by the network's `podKey` rule: a writer moves
    /// them there first if they are not (`state::rekey`: the upgrade from the release that
    /// keyed by ifname, or a changed rule), under the lock it holds anyway. An ADD fails when
    /// that fails (a store that cannot be written fails it anyway); every other verb goes on,
    /// saying why on stderr: a DEL that is not stale never waits on the guard's bookkeeping.
    ///
    /// `attachment`: the verb's own, whose pod's files of the other rule are looked for even
    /// where the marker says the move is done (`rekey::ensure`).
    pub fn open_store(&self, attachment: Option<&Attachment>) -> crate::error::Result<Store> {
        let store = Store::open(&self.conf.state_dir, self.conf.lock_timeout)?;
        let stray = attachment
            .and_then(|attachment| Some((self.pod_key(attachment)?, attachment)))
            .is_some_and(|(key, attachment)| {
                crate::state::rekey::stray(&self.conf.state_dir, &key, &attachment.ifname).is_some()
            });
        match store.rekey(&self.conf.network, self.conf.pod_key, stray) {
            Err(err) if self.verb == Verb::Add => Err(err),
            Err(err) => {
                stderr_line!(
                    "sandbox-guard: the store's files could not be moved to podKey {:?} yet: {err}",
                    self.conf.pod_key.name()
                );
                Ok(store)
            }
            Ok(()) => Ok(store),
        }
    }

    pub fn subject<'a>(
        &'a self,
        attachment: Option<&'a Attachment>,
        pod: Option<String>,
    ) -> Subject<'a> {
        Subject {
            network: &self.conf.network,
            container_id: attachment.map_or("-", |a| a.container_id.as_str()),
            if_name: attachment.map_or("-", |a| a.ifname.as_str()),
            pod,
        }
    }
}
