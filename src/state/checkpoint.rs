//! The checkpoint of one attachment: what the runtime and the primary plugin told us at ADD.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::state::ownership::{PodKey, PodKeyRule};

/// Names one attachment the way libcni does: network, container, interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttachmentId {
    pub network: String,
    pub container_id: String,
    pub if_name: String,
}

impl AttachmentId {
    /// `:` occurs in none of the three (they are validated), so the name is unambiguous
    /// and an operator can read it in `ls`.
    pub fn file_name(&self) -> String {
        format!("{}:{}:{}", self.network, self.container_id, self.if_name)
    }

    /// The attachment of `container_id`'s interface `if_name` on `key`'s network: one an owner
    /// or a deferred DEL names.
    pub fn of(key: &PodKey, container_id: &str, if_name: &str) -> AttachmentId {
        AttachmentId {
            network: key.network.clone(),
            container_id: container_id.to_string(),
            if_name: if_name.to_string(),
        }
    }

    /// The attachment a record-like file name stands for; `None` for a name that is not one.
    pub fn from_file_name(path: &std::path::Path) -> Option<AttachmentId> {
        let (network, container_id, if_name) = split_file_name(path.file_name()?.to_str()?)?;
        Some(AttachmentId {
            network: network.into(),
            container_id: container_id.into(),
            if_name: if_name.into(),
        })
    }
}

/// Joins a kept copy's name to the time it was kept (`<name>~<nanoseconds>`): a copy kept for
/// the operator, which blocks nothing. `~` is in none of the three names.
pub const KEPT_COPY_MARK: char = '~';

pub fn is_kept_copy(file_name: &str) -> bool {
    file_name.contains(KEPT_COPY_MARK)
}

/// The network, container and interface a record-like file name holds (a kept copy's mark
/// and time are not part of the interface name). Names read from disk are validated like
/// the runtime's before they make a path or a row.
pub fn split_file_name(file_name: &str) -> Option<(&str, &str, &str)> {
    use crate::error::Kind;
    use crate::names::{MAX_CONTAINER_ID, MAX_NETWORK, check_ifname, check_plain};
    let mut parts = file_name.splitn(3, ':');
    let (network, container_id, if_name) = (parts.next()?, parts.next()?, parts.next()?);
    let if_name = if_name.split(KEPT_COPY_MARK).next()?;
    check_plain("network", network, MAX_NETWORK, Kind::Io).ok()?;
    check_plain("container", container_id, MAX_CONTAINER_ID, Kind::Io).ok()?;
    check_ifname(if_name).ok()?;
    Some((network, container_id, if_name))
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub network: String,
    pub container_id: String,
    pub if_name: String,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub infra_container_id: Option<String>,
    pub netns: String,
    pub cni_version: String,
    /// Grows with every ADD of this attachment and of its pod key.
    pub generation: u64,
    pub created_at: String,
    pub updated_at: String,
    /// The primary's result exactly as the runtime passed it.
    pub prev_result: Box<RawValue>,
    /// What the kernel showed of the interface and its host parent at ADD; absent in
    /// records written before link facts existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<crate::kernel::link_facts::LinkFacts>,
    /// What tells this sandbox's netns and interface from others that later take the same
    /// path and name; absent in records of earlier releases and when ADD could not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<SandboxIdentity>,
    /// The boot its sandbox lives in; absent in earlier releases' records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Chained mode: the API server's pod of the name when a DEL of this sandbox was first
    /// refused by rule 7. Its retries stay refused until an answer frees the name or the
    /// view is turned off: an API server that stops answering cannot let them through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::state::held::MovedTo>,
}

/// The sandbox's netns and interface as ADD found them. A netns path can come to name another
/// namespace (a `/proc/<pid>/ns/net` whose pid came back, a named netns made again) holding
/// an interface of the same name and MAC; the namespace's device and inode and the link's
/// index in it do not repeat while the sandbox's namespace lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxIdentity {
    pub netns_dev: u64,
    pub netns_inode: u64,
    /// The namespace's cookie (`kernel::netns::netns_cookie`), where the kernel has one: the
    /// only one of these a namespace made later never repeats. Without it the local teardown
    /// is left to the primary's replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_cookie: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_index: Option<u32>,
    /// The link's kind (`veth`, `macvlan`, ...; none for a physical NIC, as host-device and
    /// SR-IOV move into a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_kind: Option<String>,
}

impl Checkpoint {
    pub fn id(&self) -> AttachmentId {
        AttachmentId {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            if_name: self.if_name.clone(),
        }
    }

    /// The pod key this attachment takes under `rule`.
    pub fn pod_key(&self, rule: PodKeyRule) -> Option<PodKey> {
        pod_key(
            rule,
            &self.network,
            self.pod_namespace.as_deref(),
            self.pod_name.as_deref(),
            &self.if_name,
        )
    }

    /// Its pod key under each rule, for the tools, which read no network's config: an owner
    /// of either is an owner of this attachment's pod.
    pub fn pod_keys(&self) -> Vec<PodKey> {
        PodKeyRule::CHOICES
            .iter()
            .filter_map(|(_, rule)| self.pod_key(*rule))
            .collect()
    }
}

/// A pod key needs both namespace and name: podman, for one, passes only K8S_POD_NAME,
/// and a bare container name is no pod identity to guard.
pub fn pod_key(
    rule: PodKeyRule,
    network: &str,
    namespace: Option<&str>,
    name: Option<&str>,
    if_name: &str,
) -> Option<PodKey> {
    Some(rule.key(network, namespace?, name?, if_name))
}
