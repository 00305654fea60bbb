//! The ownership rule: which sandbox a pod's name belongs to, and when a DEL is stale.
//!
//! A StatefulSet pod comes back under the same name in a new sandbox. Plugins that key
//! their state by `namespace.podname` cannot tell the old sandbox's DEL from the new
//! one's, so a retried DEL of the old sandbox tears down the new pod's network. The rule:
//!
//! 1. The pod key is (network, namespace, pod name, ifname).
//! 2. The last successful ADD owns the key.
//! 3. A DEL by a container that does not own its key, while another container does, is
//!    stale. It is refused (or, in audit mode, let through and logged).
//! 4. Any other DEL goes on; if its container owned the key, the key is released.
//!
//! This module decides; the store persists and the verbs act on the decision.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Identifies one interface of one pod by name, across sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodKey {
    pub network: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub if_name: String,
}

impl PodKey {
    /// A fixed-length file name for the key: namespace and pod name together can exceed
    /// what fits in one path component.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for part in [&self.network, &self.pod_namespace, &self.pod_name, &self.if_name] {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        crate::hex(&hasher.finalize())
    }

    pub fn pod(&self) -> String {
        format!("{}/{}", self.pod_namespace, self.pod_name)
    }
}

/// Who owns a pod key now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ownership {
    #[serde(flatten)]
    pub key: PodKey,
    pub container_id: String,
    pub pod_uid: Option<String>,
    /// The generation of the ADD that took ownership.
    pub generation: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum DelVerdict<'a> {
    /// The deleting container owns the key: remove its record and release the key.
    Release,
    /// Nobody owns the key: remove the container's record, nothing to release.
    Proceed,
    /// Another container owns the key: this DEL would tear down the owner's network.
    Stale(&'a Ownership),
}

pub fn judge_del<'a>(container_id: &str, owner: Option<&'a Ownership>) -> DelVerdict<'a> {
    match owner {
        None => DelVerdict::Proceed,
        Some(owner) if owner.container_id == container_id => DelVerdict::Release,
        Some(owner) => DelVerdict::Stale(owner),
    }
}

/// The generation of a new ADD: past every generation this key and this attachment have
/// seen, and past the store-wide counter, so that a later ADD always reads as newer.
pub fn next_generation(store_counter: u64, owner: Option<&Ownership>, previous_record: Option<u64>) -> u64 {
    let seen = owner.map_or(0, |o| o.generation).max(previous_record.unwrap_or(0));
    seen.max(store_counter) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned_by(container_id: &str, generation: u64) -> Ownership {
        Ownership {
            key: PodKey {
                network: "net".into(),
                pod_namespace: "lijiaob".into(),
                pod_name: "etcd1-0".into(),
                if_name: "eth0".into(),
            },
            container_id: container_id.into(),
            pod_uid: Some(format!("uid-{container_id}")),
            generation,
        }
    }

    #[test]
    fn owner_deletes_and_releases() {
        let owner = owned_by("A", 1);
        assert_eq!(judge_del("A", Some(&owner)), DelVerdict::Release);
    }

    #[test]
    fn old_sandbox_is_stale_once_the_new_one_owns_the_name() {
        // The incident: ADD A, ADD B (same pod name), then the retried DEL of A.
        let owner = owned_by("B", 2);
        assert_eq!(judge_del("A", Some(&owner)), DelVerdict::Stale(&owner));
    }

    #[test]
    fn unowned_key_lets_any_del_through() {
        // DEL B released the key; the old sandbox's DEL may now clean up.
        assert_eq!(judge_del("A", None), DelVerdict::Proceed);
    }

    #[test]
    fn generations_only_grow() {
        let owner = owned_by("A", 7);
        assert_eq!(next_generation(3, Some(&owner), None), 8);
        assert_eq!(next_generation(10, Some(&owner), Some(9)), 11);
        assert_eq!(next_generation(0, None, None), 1);
    }

    #[test]
    fn digest_separates_fields() {
        let mut a = owned_by("A", 1).key;
        let mut b = a.clone();
        a.pod_namespace = "ab".into();
        a.pod_name = "c".into();
        b.pod_namespace = "a".into();
        b.pod_name = "bc".into();
        assert_ne!(a.digest(), b.digest());
    }
}
