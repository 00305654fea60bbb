//! The ownership rule: which sandbox a pod's name belongs to, and when a DEL is stale.
//!
//! A StatefulSet pod comes back under the same name in a new sandbox. Plugins that key
//! their state by `namespace.podname` cannot tell the old sandbox's DEL from the new
//! one's, so a retried DEL of the old sandbox tears down the new pod's network. The rule:
//!
//! 1. The pod key is (network, namespace, pod name, ifname).
//! 2. The last successful ADD owns the key.
//! 3. A DEL by a container that does not own its key, while another container does, is
//!    stale. It is refused (or, in audit mode, let through and logged). Two exceptions: an
//!    owner whose record is gone owns nothing (it is repaired, not obeyed), and a container
//!    whose ADD failed in the guard never took the key, so its cleanup DEL is not stale.
//! 4. Any other DEL goes on. It releases every key its container owns: the one its record
//!    holds, whatever CNI_ARGS say, and the one CNI_ARGS name.
//!
//! Delegate mode (the guard runs the primary itself) adds two:
//!
//! 5. A stale DEL is deferred instead of refused: answered with success, its primary DEL
//!    kept until nobody owns the key, then replayed (`may_replay`).
//! 6. An ADD by a container that a newer live owner superseded (its record is older than the
//!    owner's, or its DEL was deferred) is refused before the primary sees it: the primary
//!    would hand the pod's name back to the old sandbox (`judge_add`).
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
        super::sealed::hex(&hasher.finalize())
    }

    pub fn pod(&self) -> String {
        crate::names::pod_text(Some(&self.pod_namespace), Some(&self.pod_name))
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

/// An owner as the store found it.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub ownership: &'a Ownership,
    /// The owner's record still names this key (see `Store::owner_is_backed`).
    pub backed: bool,
}

/// What the store knows of the container that sends the DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleter {
    /// It has a record: its ADD succeeded and took its key.
    Recorded,
    /// No record, and its last ADD failed in the guard: it never took its key.
    AddFailed,
    /// No record at all: added before the guard was installed, or already deleted.
    Unknown,
}

#[derive(Debug, PartialEq, Eq)]
pub enum DelVerdict<'a> {
    /// The deleting container owns the key: release it.
    Release,
    /// Nobody owns the key, or the DEL cleans up an ADD that failed in the guard.
    Proceed,
    /// The key's owner has no record any more: drop that ownership, then go on.
    Repair(&'a Ownership),
    /// Another container owns the key: this DEL would tear down the owner's network.
    /// `ever_owned` says whether the deleting container ever held the key.
    Stale { owner: &'a Ownership, ever_owned: bool },
}

pub fn judge_del<'a>(container_id: &str, deleter: Deleter, owner: Option<Owner<'a>>) -> DelVerdict<'a> {
    match owner {
        None => DelVerdict::Proceed,
        Some(owner) if owner.ownership.container_id == container_id => DelVerdict::Release,
        Some(owner) if !owner.backed => DelVerdict::Repair(owner.ownership),
        Some(_) if deleter == Deleter::AddFailed => DelVerdict::Proceed,
        Some(owner) => DelVerdict::Stale { owner: owner.ownership, ever_owned: deleter == Deleter::Recorded },
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum AddVerdict<'a> {
    /// The ADD goes on and takes the key.
    Take,
    /// A newer live sandbox owns the key; this container's time has passed.
    Superseded { owner: &'a Ownership },
}

/// `own_generation`: the generation of the container's record, if it has one; `deferred`:
/// its DEL was deferred; `owner_alive`: the owner's netns still exists (or cannot be ruled
/// out). A container never seen before is a new sandbox: it takes the key.
pub fn judge_add<'a>(container_id: &str, own_generation: Option<u64>, deferred: bool, owner: Option<Owner<'a>>, owner_alive: bool) -> AddVerdict<'a> {
    match owner {
        Some(owner) if owner.ownership.container_id != container_id && owner.backed && owner_alive => {
            let older = own_generation.is_some_and(|generation| generation < owner.ownership.generation);
            if deferred || older { AddVerdict::Superseded { owner: owner.ownership } } else { AddVerdict::Take }
        }
        _ => AddVerdict::Take,
    }
}

/// A deferred DEL reaches the primary only when nobody owns its key any more (an owner
/// without its record owns nothing).
pub fn may_replay(owner: Option<Owner>) -> bool {
    owner.is_none_or(|owner| !owner.backed)
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

    fn backed(owner: &Ownership) -> Option<Owner<'_>> {
        Some(Owner { ownership: owner, backed: true })
    }

    #[test]
    fn owner_deletes_and_releases() {
        let owner = owned_by("A", 1);
        assert_eq!(judge_del("A", Deleter::Recorded, backed(&owner)), DelVerdict::Release);
    }

    #[test]
    fn old_sandbox_is_stale_once_the_new_one_owns_the_name() {
        // The incident: ADD A, ADD B (same pod name), then the retried DEL of A.
        let owner = owned_by("B", 2);
        assert_eq!(judge_del("A", Deleter::Recorded, backed(&owner)), DelVerdict::Stale { owner: &owner, ever_owned: true });
        // A sandbox from before the guard was installed is just as stale.
        assert_eq!(judge_del("A", Deleter::Unknown, backed(&owner)), DelVerdict::Stale { owner: &owner, ever_owned: false });
    }

    #[test]
    fn unowned_key_lets_any_del_through() {
        // DEL B released the key; the old sandbox's DEL may now clean up.
        assert_eq!(judge_del("A", Deleter::Recorded, None), DelVerdict::Proceed);
    }

    #[test]
    fn an_owner_without_its_record_is_repaired_not_obeyed() {
        let owner = owned_by("B", 2);
        let orphan = Some(Owner { ownership: &owner, backed: false });
        assert_eq!(judge_del("A", Deleter::Recorded, orphan), DelVerdict::Repair(&owner));
    }

    #[test]
    fn the_cleanup_del_of_a_failed_add_is_not_stale() {
        let owner = owned_by("B", 2);
        assert_eq!(judge_del("A", Deleter::AddFailed, backed(&owner)), DelVerdict::Proceed);
    }

    #[test]
    fn a_late_add_of_a_superseded_sandbox_is_refused() {
        let owner = owned_by("B", 5);
        // A was the owner at generation 3, then B took over: A's re-ADD is late.
        assert_eq!(judge_add("A", Some(3), false, backed(&owner), true), AddVerdict::Superseded { owner: &owner });
        // A's DEL was deferred: the runtime already tore A down.
        assert_eq!(judge_add("A", None, true, backed(&owner), true), AddVerdict::Superseded { owner: &owner });
        // A sandbox never seen is a new one; so is any ADD once the owner's netns is gone.
        assert_eq!(judge_add("C", None, false, backed(&owner), true), AddVerdict::Take);
        assert_eq!(judge_add("A", Some(3), true, backed(&owner), false), AddVerdict::Take);
        assert_eq!(judge_add("B", Some(5), false, backed(&owner), true), AddVerdict::Take);
    }

    #[test]
    fn deferred_dels_wait_for_a_free_key() {
        let owner = owned_by("B", 2);
        assert!(!may_replay(backed(&owner)));
        assert!(may_replay(Some(Owner { ownership: &owner, backed: false })));
        assert!(may_replay(None));
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
