//! The ownership rule: which sandbox a pod's name belongs to, and when a DEL is stale.
//!
//! A StatefulSet pod comes back under the same name in a new sandbox. Plugins that key
//! their state by `namespace.podname` cannot tell the old sandbox's DEL from the new
//! one's, so a retried DEL of the old sandbox tears down the new pod's network. The rule:
//!
//! 1. The pod key is what the primary keys its state by (`podKey`, `PodKeyRule`):
//!    (network, namespace, pod name) by default, as calico up to 2.1 with etcd and sticky-IP macvlan
//!    plugins do, so that an old sandbox attached as `net1` is stale once a new one attached
//!    as `net2` owns the pod; or (network, namespace, pod name, ifname) for a primary that
//!    keys per interface.
//! 2. The last successful ADD owns the key. A sandbox with several interfaces on one key
//!    owns it once; the DEL of one of them releases that interface only, the DEL of its
//!    last one the key (`released`).
//! 3. A DEL by a container that does not own its key, while another container does, is
//!    stale. It is refused (or, in audit mode, let through and logged). Two exceptions: an
//!    owner whose record is gone owns nothing (it is repaired, not obeyed), and a container
//!    whose ADD failed in the guard never took the key, so its cleanup DEL is not stale.
//! 4. Any other DEL goes on. It releases every key its container owns by this interface:
//!    the one its record holds, whatever CNI_ARGS say, and the one CNI_ARGS name.
//!
//! Delegate mode (the guard runs the primary itself) adds two:
//!
//! 5. A stale DEL is deferred instead of refused: answered with success, its primary DEL
//!    kept until nobody owns the key, then replayed (`may_replay`).
//! 6. An ADD by a container that a newer live owner superseded (its record is older than the
//!    owner's, or its DEL was deferred) is refused before the primary sees it: the primary
//!    would hand the pod's name back to the old sandbox (`judge_add`).
//!
//! With a kubeconfig (`kubeconfig`), the API server's pod of the name decides where the
//! store cannot (the store holds one node's sandboxes; the API, the pod a name belongs to now):
//!
//! 7. A DEL the rules above let go, of a pod UID the API no longer has under that name, is
//!    held while the API's pod is one the primary's state of the name reaches (`name_moved`):
//!    any, for a primary keyed across the cluster (`podKeyScope: "cluster"`); one on this node
//!    or not yet placed, for one keyed per node.
//! 8. An ADD whose pod name has an owner of another pod UID is refused when the API's pod of
//!    that name has another UID than the ADD's (`late_add`): a force-deleted pod's sandbox
//!    coming late. In delegate mode, for a primary keyed across the cluster, so is one of a
//!    name with no owner here: asked before the primary runs, its pod may live on another
//!    node.
//!
//! Where the API does not answer in time, rules 1-6 decide alone.
//!
//! This module decides; the store persists and the verbs act on the decision.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What the network's primary keys its state by: the `podKey` config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKeyRule {
    /// (network, namespace, pod name): calico up to 2.1 with etcd, sticky-IP macvlan plugins.
    Name,
    /// (network, namespace, pod name, ifname): a primary that keys per interface.
    NameAndIfname,
}

impl PodKeyRule {
    pub const CHOICES: [(&'static str, PodKeyRule); 2] = [
        ("name", PodKeyRule::Name),
        ("name-and-ifname", PodKeyRule::NameAndIfname),
    ];

    pub fn name(self) -> &'static str {
        match self {
            PodKeyRule::Name => "name",
            PodKeyRule::NameAndIfname => "name-and-ifname",
        }
    }

    pub fn key(self, network: &str, pod_namespace: &str, pod_name: &str, if_name: &str) -> PodKey {
        PodKey {
            network: network.to_string(),
            pod_namespace: pod_namespace.to_string(),
            pod_name: pod_name.to_string(),
            if_name: (self == PodKeyRule::NameAndIfname).then(|| if_name.to_string()),
        }
    }
}

/// How far the primary's state keyed by pod name reaches: the `podKeyScope` config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKeyScope {
    /// One node's: a DEL on this node can only hurt a pod of the name on this node.
    Node,
    /// The cluster's (calico up to 2.1's IPAM handle in etcd): a DEL on any node frees what
    /// the pod of that name holds on every node.
    Cluster,
}

impl PodKeyScope {
    pub const CHOICES: [(&'static str, PodKeyScope); 2] = [
        ("node", PodKeyScope::Node),
        ("cluster", PodKeyScope::Cluster),
    ];

    pub fn name(self) -> &'static str {
        match self {
            PodKeyScope::Node => "node",
            PodKeyScope::Cluster => "cluster",
        }
    }

    /// The scope a word names; an unknown word is the wider one.
    pub fn from_name(word: &str) -> PodKeyScope {
        match word {
            "node" => PodKeyScope::Node,
            _ => PodKeyScope::Cluster,
        }
    }
}

/// The pod the API server holds under a pod's namespace and name.
#[derive(Debug, Clone, Copy)]
pub struct ApiPod<'a> {
    pub uid: &'a str,
    /// `None` while it is not placed on a node.
    pub node: Option<&'a str>,
}

/// Rule 7: whether a DEL of pod UID `uid` that rules 1-6 let go must be held, because the name
/// now belongs to `api` (`None`: the API has no pod of that name).
pub fn name_moved(uid: &str, api: Option<ApiPod>, scope: PodKeyScope, this_node: &str) -> bool {
    match api {
        Some(pod) if pod.uid != uid => {
            scope == PodKeyScope::Cluster || pod.node.is_none_or(|node| node == this_node)
        }
        _ => false,
    }
}

/// Rule 8: whether an ADD of pod UID `uid`, whose name has an owner of another UID, comes from
/// a pod the API has replaced under that name. No pod of the name decides nothing: a static
/// pod's mirror can be missing while its sandbox starts.
pub fn late_add(uid: &str, api: Option<ApiPod>) -> bool {
    api.is_some_and(|pod| pod.uid != uid)
}

/// Identifies a pod by name across sandboxes, and one of its interfaces when the rule says so.
/// The release before `podKey` wrote every key with its ifname: those files read as
/// `NameAndIfname` keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodKey {
    pub network: String,
    pub pod_namespace: String,
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_name: Option<String>,
}

impl PodKey {
    /// A fixed-length file name for the key: namespace and pod name together can exceed
    /// what fits in one path component. A key without ifname hashes one field fewer, so it
    /// never names the file of a key with one.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for part in [&self.network, &self.pod_namespace, &self.pod_name]
            .into_iter()
            .chain(self.if_name.as_ref())
        {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        super::sealed::hex(&hasher.finalize())
    }

    pub fn rule(&self) -> PodKeyRule {
        if self.if_name.is_some() {
            PodKeyRule::NameAndIfname
        } else {
            PodKeyRule::Name
        }
    }

    pub fn pod(&self) -> String {
        crate::names::pod_text(Some(&self.pod_namespace), Some(&self.pod_name))
    }

    /// The pod, and its interface when the key has one: what messages name.
    pub fn label(&self) -> String {
        match &self.if_name {
            Some(if_name) => format!("{} ({if_name})", self.pod()),
            None => self.pod(),
        }
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
    /// A key without ifname: the owner's interfaces that hold it (its attachments on the
    /// network under this pod name). A key with one names its only interface itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// The boot it was written in (`Store::save_owner` stamps it); absent in earlier releases'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Ownership {
    /// Whether this ownership stands on `container_id`'s interface `if_name`.
    pub fn holds(&self, container_id: &str, if_name: &str) -> bool {
        self.container_id == container_id && self.interfaces().contains(&if_name)
    }

    /// The owner's interfaces that hold the key: its attachments an owner stands on.
    pub fn interfaces(&self) -> Vec<&str> {
        match &self.key.if_name {
            Some(if_name) => vec![if_name.as_str()],
            None => self.interfaces.iter().map(String::as_str).collect(),
        }
    }
}

/// The ownership an ADD of `container_id`'s interface `if_name` leaves: the sandbox that owned
/// the key already keeps its other interfaces; a sandbox that takes the key over holds it by
/// this interface alone.
pub fn taken(
    key: &PodKey,
    container_id: &str,
    if_name: &str,
    pod_uid: Option<String>,
    generation: u64,
    before: Option<&Ownership>,
) -> Ownership {
    let mut interfaces: Vec<String> = match before {
        Some(owner) if owner.container_id == container_id && key.if_name.is_none() => {
            owner.interfaces.clone()
        }
        _ => Vec::new(),
    };
    if key.if_name.is_none() && !interfaces.iter().any(|i| i == if_name) {
        interfaces.push(if_name.to_string());
    }
    Ownership {
        key: key.clone(),
        container_id: container_id.to_string(),
        pod_uid,
        generation,
        interfaces,
        boot_id: None,
    }
}

/// What the owner's DEL of `if_name` leaves of its ownership: the rest of its interfaces, or
/// `None` when that was its last one and the key is free.
pub fn released(owner: &Ownership, if_name: &str) -> Option<Ownership> {
    let rest: Vec<String> = owner
        .interfaces()
        .into_iter()
        .filter(|i| *i != if_name)
        .map(String::from)
        .collect();
    (owner.key.if_name.is_none() && !rest.is_empty()).then(|| Ownership {
        interfaces: rest,
        ..owner.clone()
    })
}

/// One owner for `key` from the owners of the keys it is made of (a change of rule, or the
/// upgrade from the release that keyed by ifname): the last ADD wins, with every interface
/// its sandbox held among them. `None` for no owners.
pub fn merged(key: &PodKey, owners: &[Ownership]) -> Option<Ownership> {
    let winner = owners.iter().max_by_key(|o| o.generation)?;
    let mut interfaces: Vec<String> = Vec::new();
    for owner in owners
        .iter()
        .filter(|o| o.container_id == winner.container_id)
    {
        for if_name in owner.interfaces() {
            if key.if_name.as_deref().is_none_or(|own| own == if_name)
                && !interfaces.iter().any(|i| i == if_name)
            {
                interfaces.push(if_name.to_string());
            }
        }
    }
    interfaces.sort();
    let interfaces = if key.if_name.is_some() {
        Vec::new()
    } else {
        interfaces
    };
    Some(Ownership {
        key: key.clone(),
        interfaces,
        ..winner.clone()
    })
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
    Stale {
        owner: &'a Ownership,
        ever_owned: bool,
    },
}

pub fn judge_del<'a>(
    container_id: &str,
    deleter: Deleter,
    owner: Option<Owner<'a>>,
) -> DelVerdict<'a> {
    match owner {
        None => DelVerdict::Proceed,
        Some(owner) if owner.ownership.container_id == container_id => DelVerdict::Release,
        Some(owner) if !owner.backed => DelVerdict::Repair(owner.ownership),
        Some(_) if deleter == Deleter::AddFailed => DelVerdict::Proceed,
        Some(owner) => DelVerdict::Stale {
            owner: owner.ownership,
            ever_owned: deleter == Deleter::Recorded,
        },
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
pub fn judge_add<'a>(
    container_id: &str,
    own_generation: Option<u64>,
    deferred: bool,
    owner: Option<Owner<'a>>,
    owner_alive: bool,
) -> AddVerdict<'a> {
    match owner {
        Some(owner)
            if owner.ownership.container_id != container_id && owner.backed && owner_alive =>
        {
            let older =
                own_generation.is_some_and(|generation| generation < owner.ownership.generation);
            if deferred || older {
                AddVerdict::Superseded {
                    owner: owner.ownership,
                }
            } else {
                AddVerdict::Take
            }
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
pub fn next_generation(
    store_counter: u64,
    owner: Option<&Ownership>,
    previous_record: Option<u64>,
) -> u64 {
    let seen = owner
        .map_or(0, |o| o.generation)
        .max(previous_record.unwrap_or(0));
    seen.max(store_counter) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dels_name_moved_by_scope_and_a_late_adds_uid() {
        use PodKeyScope::{Cluster, Node};
        let here = |uid| {
            Some(ApiPod {
                uid,
                node: Some("a"),
            })
        };
        let there = |uid| {
            Some(ApiPod {
                uid,
                node: Some("b"),
            })
        };
        let unplaced = |uid| Some(ApiPod { uid, node: None });
        // The same pod, or none of the name: rules 1-6 decide.
        for scope in [Node, Cluster] {
            assert!(!name_moved("u1", here("u1"), scope, "a"));
            assert!(!name_moved("u1", None, scope, "a"));
            assert!(name_moved("u1", here("u2"), scope, "a"));
            assert!(name_moved("u1", unplaced("u2"), scope, "a"));
        }
        // Another node's pod of the name: held only where the primary's state reaches it.
        assert!(name_moved("u1", there("u2"), Cluster, "a"));
        assert!(!name_moved("u1", there("u2"), Node, "a"));
        assert!(!late_add("u1", here("u1")));
        assert!(late_add("u1", here("u2")));
        assert!(!late_add("u1", None));
    }

    fn pod() -> PodKey {
        PodKeyRule::Name.key("net", "lijiaob", "etcd1-0", "eth0")
    }

    fn owned_by(container_id: &str, generation: u64) -> Ownership {
        taken(
            &pod(),
            container_id,
            "eth0",
            Some(format!("uid-{container_id}")),
            generation,
            None,
        )
    }

    fn backed(owner: &Ownership) -> Option<Owner<'_>> {
        Some(Owner {
            ownership: owner,
            backed: true,
        })
    }

    #[test]
    fn owner_deletes_and_releases() {
        let owner = owned_by("A", 1);
        assert_eq!(
            judge_del("A", Deleter::Recorded, backed(&owner)),
            DelVerdict::Release
        );
    }

    #[test]
    fn old_sandbox_is_stale_once_the_new_one_owns_the_name() {
        // The incident: ADD A, ADD B (same pod name), then the retried DEL of A.
        let owner = owned_by("B", 2);
        assert_eq!(
            judge_del("A", Deleter::Recorded, backed(&owner)),
            DelVerdict::Stale {
                owner: &owner,
                ever_owned: true
            }
        );
        // A sandbox from before the guard was installed is just as stale.
        assert_eq!(
            judge_del("A", Deleter::Unknown, backed(&owner)),
            DelVerdict::Stale {
                owner: &owner,
                ever_owned: false
            }
        );
    }

    #[test]
    fn unowned_key_lets_any_del_through() {
        // DEL B released the key; the old sandbox's DEL may now clean up.
        assert_eq!(judge_del("A", Deleter::Recorded, None), DelVerdict::Proceed);
    }

    #[test]
    fn an_owner_without_its_record_is_repaired_not_obeyed() {
        let owner = owned_by("B", 2);
        let orphan = Some(Owner {
            ownership: &owner,
            backed: false,
        });
        assert_eq!(
            judge_del("A", Deleter::Recorded, orphan),
            DelVerdict::Repair(&owner)
        );
    }

    #[test]
    fn the_cleanup_del_of_a_failed_add_is_not_stale() {
        let owner = owned_by("B", 2);
        assert_eq!(
            judge_del("A", Deleter::AddFailed, backed(&owner)),
            DelVerdict::Proceed
        );
    }

    #[test]
    fn a_late_add_of_a_superseded_sandbox_is_refused() {
        let owner = owned_by("B", 5);
        // A was the owner at generation 3, then B took over: A's re-ADD is late.
        assert_eq!(
            judge_add("A", Some(3), false, backed(&owner), true),
            AddVerdict::Superseded { owner: &owner }
        );
        // A's DEL was deferred: the runtime already tore A down.
        assert_eq!(
            judge_add("A", None, true, backed(&owner), true),
            AddVerdict::Superseded { owner: &owner }
        );
        // A sandbox never seen is a new one; so is any ADD once the owner's netns is gone.
        assert_eq!(
            judge_add("C", None, false, backed(&owner), true),
            AddVerdict::Take
        );
        assert_eq!(
            judge_add("A", Some(3), true, backed(&owner), false),
            AddVerdict::Take
        );
        assert_eq!(
            judge_add("B", Some(5), false, backed(&owner), true),
            AddVerdict::Take
        );
    }

    #[test]
    fn deferred_dels_wait_for_a_free_key() {
        let owner = owned_by("B", 2);
        assert!(!may_replay(backed(&owner)));
        assert!(may_replay(Some(Owner {
            ownership: &owner,
            backed: false
        })));
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

    #[test]
    fn by_name_every_interface_of_a_pod_is_one_key() {
        // The two-ifnames incident: A as net1, B as net2; by name, both take the same key.
        let (a, b) = (
            PodKeyRule::Name.key("net", "ns", "p", "net1"),
            PodKeyRule::Name.key("net", "ns", "p", "net2"),
        );
        assert_eq!(a, b);
        let owner = taken(&b, "B", "net2", None, 2, None);
        assert_eq!(
            judge_del("A", Deleter::Recorded, backed(&owner)),
            DelVerdict::Stale {
                owner: &owner,
                ever_owned: true
            }
        );
        // By name and ifname they are two keys, and two files: the old release's digest.
        let (a, b) = (
            PodKeyRule::NameAndIfname.key("net", "ns", "p", "net1"),
            PodKeyRule::NameAndIfname.key("net", "ns", "p", "net2"),
        );
        assert_ne!(a, b);
        assert_ne!(
            a.digest(),
            PodKeyRule::Name.key("net", "ns", "p", "net1").digest()
        );
        // The digest the release before podKey filed db-0's eth0 under (testdata/upgrade/state-v1).
        let old = PodKeyRule::NameAndIfname.key("k8s-pod-network", "lijiaob", "db-0", "eth0");
        assert_eq!(
            old.digest(),
            "f172e4d1bd5d0b3a4c8c2d8ee229bb6467cf6dffbaa0f90d9cc6351ee3687080"
        );
    }

    #[test]
    fn an_owner_with_two_interfaces_is_released_by_its_last() {
        let first = taken(&pod(), "C", "eth0", None, 3, None);
        let both = taken(&pod(), "C", "net1", None, 4, Some(&first));
        assert_eq!(both.interfaces(), ["eth0", "net1"]);
        let left = released(&both, "eth0").expect("net1 still holds the pod");
        assert_eq!(left.interfaces(), ["net1"]);
        assert_eq!(released(&left, "net1"), None);
        // A sandbox that takes the pod over holds it by its own interface alone.
        let taken_over = taken(&pod(), "D", "eth0", None, 5, Some(&both));
        assert_eq!(
            (taken_over.container_id.as_str(), taken_over.interfaces()),
            ("D", vec!["eth0"])
        );
        // Keyed by ifname, an owner has one interface and its DEL frees the key.
        let per_interface = taken(
            &PodKeyRule::NameAndIfname.key("net", "lijiaob", "etcd1-0", "eth0"),
            "C",
            "eth0",
            None,
            3,
            None,
        );
        assert_eq!(released(&per_interface, "eth0"), None);
    }

    #[test]
    fn merging_the_keys_of_another_rule_keeps_the_last_add() {
        // The old release's owners of one pod: A by net1 (generation 1), B by net2 (2), B by net3 (3).
        let old = |container: &str, if_name: &str, generation| {
            taken(
                &PodKeyRule::NameAndIfname.key("net", "lijiaob", "etcd1-0", if_name),
                container,
                if_name,
                None,
                generation,
                None,
            )
        };
        let owners = [
            old("A", "net1", 1),
            old("B", "net3", 3),
            old("B", "net2", 2),
        ];
        let merged = merged(&pod(), &owners).unwrap();
        assert_eq!(
            (
                merged.container_id.as_str(),
                merged.generation,
                merged.interfaces()
            ),
            ("B", 3, vec!["net2", "net3"])
        );
        // And back: each interface's key gets the owner that held it.
        let split = merged_for("net2", &merged);
        assert_eq!(
            (
                split.container_id.as_str(),
                split.key.if_name.as_deref(),
                split.interfaces()
            ),
            ("B", Some("net2"), vec!["net2"])
        );
        assert_eq!(super::merged(&pod(), &[]), None);
    }

    fn merged_for(if_name: &str, owner: &Ownership) -> Ownership {
        let key = PodKeyRule::NameAndIfname.key("net", "lijiaob", "etcd1-0", if_name);
        merged(
            &key,
            &[Ownership {
                interfaces: vec![if_name.into()],
                ..owner.clone()
            }],
        )
        .unwrap()
    }
}
