//! The stale-DEL incident under containerd 1.6's CRI (cri_node.rs): a StatefulSet
//! pod is recreated under the same name while the old sandbox still awaits its network
//! teardown, on a node whose primary is one of the models of tests/cri/, run without
//! sandbox-guard, with it chained last, or with it wrapping the primary as its delegate. The
//! sequences, the conflists and what each way must end in, shared by the test files that play
//! them. Needs `sys`, `cni` and `cri_node` (tests/support/) included by the test crate.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::cni;
use crate::cri_node::{CriError, CriNode, NodeLayout, Primary};
use crate::sys;

pub const NAMESPACE: &str = "lijiaob";
pub const POD: &str = "etcd1-0";

/// How a node runs sandbox-guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The primary alone, as on the node of the incident.
    Unguarded,
    /// sandbox-guard last in the conflist, after the primary.
    Chained,
    /// sandbox-guard in the primary's place, running it as its `delegate`.
    Delegate,
}

/// How the calico-cni v1 model answers a DEL whose endpoint is gone: calico-cni 1.5.x failed
/// ("resource does not exist"), which kept kubelet retrying forever; calico-cni v1.6.1 ignores
/// it.
#[derive(Clone, Copy)]
pub enum MissingEndpoint {
    Fail,
    Ignore,
}

/// The node's only network: the model primary alone, followed by sandbox-guard, or inside
/// sandbox-guard's entry as its `delegate`.
pub fn conflist(layout: &NodeLayout, mode: Mode, missing: MissingEndpoint) -> Value {
    let mut primary = json!({
        "type": layout.primary.plugin_type(),
        "stateDir": layout.primary_state,
        "subnet": layout.subnet,
        "hostVethPrefix": layout.veth_prefix,
    });
    if let Some(master) = &layout.master {
        primary["master"] = json!(master);
    }
    if layout.primary == Primary::CalicoCniV1 {
        primary["onMissingEndpoint"] = json!(match missing {
            MissingEndpoint::Fail => "fail",
            MissingEndpoint::Ignore => "ignore",
        });
    }
    let mut guard = json!({
        "type": "sandbox-guard",
        "stateDir": layout.guard_state,
        "staleDel": "refuse",
        "logFile": layout.guard_log,
    });
    let plugins = match mode {
        Mode::Unguarded => vec![primary],
        Mode::Chained => vec![primary, guard],
        Mode::Delegate => {
            guard["delegate"] = primary;
            vec![guard]
        }
    };
    json!({"cniVersion": "1.0.0", "name": "e2e-pod-network", "plugins": plugins})
}

/// A node of the incident run `mode`. Unguarded, the calico-cni v1 model is calico-cni 1.5.x,
/// the version of the incident; guarded it is v1.6.1: containerd DELs twice per sandbox (Stop,
/// Remove) and the guarded tests finish by removing both sandboxes, and in delegate mode the
/// replayed DEL of the old sandbox finds the endpoint gone with the new one's DEL.
pub fn node(primary: Primary, mode: Mode) -> CriNode {
    let missing = match mode {
        Mode::Unguarded => MissingEndpoint::Fail,
        Mode::Chained | Mode::Delegate => MissingEndpoint::Ignore,
    };
    CriNode::start(primary, |layout| conflist(layout, mode, missing))
}

/// `node` with its network at `version` (calico v2's manifests install 0.1.0 networks), a
/// guarded one: every model's DEL that finds no endpoint passes, as calico-cni v1.6.1's does.
pub fn node_at_version(primary: Primary, mode: Mode, version: &str) -> CriNode {
    CriNode::start(primary, |layout| {
        let mut list = conflist(layout, mode, MissingEndpoint::Ignore);
        list["cniVersion"] = json!(version);
        list
    })
}

/// The host reaches a pod through the primary's /32 route to its host veth, or the macvlan
/// master's peer; a pod whose endpoint was torn down is unreachable. Several tries absorb the
/// first ARP resolution, which starts afresh: the host's entry may still name the MAC of a
/// sandbox that answered for the same (sticky) address and is gone.
pub fn reachable(ip: &str) -> bool {
    sys::try_run("ip", &["neigh", "flush", "to", ip]);
    (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "1", ip]))
}

/// Runs a sandbox of the StatefulSet pod and checks it got a reachable address.
pub fn run_pod(node: &CriNode, uid: &str) -> (String, String) {
    let id = node
        .run_pod(POD, NAMESPACE, uid)
        .unwrap_or_else(|e| panic!("RunPodSandbox uid {uid}: {e:?}"));
    let status = node.pod_status(&id);
    assert_eq!(status["state"], "SANDBOX_READY", "{status}");
    let ip = status["ip"].as_str().expect("pod ip").to_string();
    assert!(
        reachable(&ip),
        "new sandbox {id} at {ip} is not reachable from the host"
    );
    (id, ip)
}

pub fn state_of(node: &CriNode, id: &str) -> String {
    node.pod_status(id)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The StatefulSet pod recreated under its name, and how the old sandbox's (last) stop ended.
pub struct Recreated {
    pub old: String,
    pub new: String,
    pub new_ip: String,
    pub stop_old: Result<(), CriError>,
    /// The old sandbox's netns, pinned before that stop (a successful one makes containerd
    /// drop its own pin), to see what is left in it.
    pub old_netns: PathBuf,
    /// The addresses the old sandbox's netns held then, with the new sandbox running.
    pub old_addresses: Vec<String>,
}

/// The two orders of the incident.
#[derive(Clone, Copy, Debug)]
pub enum Sequence {
    /// The old sandbox's teardown fails once (the primary's own failure), the pod is
    /// recreated under the same name, then kubelet retries the old teardown.
    FailedStopThenRetry,
    /// The same name recreated while the old sandbox is still up (no failure first): ADD A,
    /// ADD B, then the old sandbox stopped (DEL A).
    RecreateThenStopOld,
}

impl Sequence {
    pub fn play(self, node: &CriNode) -> Recreated {
        match self {
            Sequence::FailedStopThenRetry => recreate_after_failed_stop(node),
            Sequence::RecreateThenStopOld => recreate_then_stop_old(node),
        }
    }
}

/// Runs the new sandbox, then stops the old one, seeing first what its netns holds.
fn stop_old_after_new(node: &CriNode, old: String) -> Recreated {
    let (new, new_ip) = run_pod(node, "2");
    let old_netns = node.pin_netns(&old);
    let old_addresses = netns_addresses(&old_netns);
    let stop_old = node.stop_pod(&old);
    Recreated {
        old,
        new,
        new_ip,
        stop_old,
        old_netns,
        old_addresses,
    }
}

pub fn recreate_after_failed_stop(node: &CriNode) -> Recreated {
    let (old, _) = run_pod(node, "1");
    node.fail_next_primary_del();
    let first_stop = node
        .stop_pod(&old)
        .expect_err("the injected primary failure must fail StopPodSandbox");
    assert!(
        first_stop.message.contains("injected primary failure"),
        "{first_stop:?}"
    );
    assert_eq!(state_of(node, &old), "SANDBOX_NOTREADY");
    stop_old_after_new(node, old)
}

pub fn recreate_then_stop_old(node: &CriNode) -> Recreated {
    let (old, _) = run_pod(node, "1");
    stop_old_after_new(node, old)
}

/// Whether the primary's trace shows a DEL of `old` tearing down something of `new`: the
/// calico-cni v1 model's "DEL by <old> removes endpoint of <new>", the calico model's "DEL
/// by <old> deletes host link <name> of <new> (by name, empty netns)" (podnamed-veth), the
/// sticky-IP model's "DEL by <old> releases <address> of <new> (sticky for <pod>)".
pub fn old_del_hit_new(node: &CriNode, old: &str, new: &str) -> bool {
    let (by_old, of_new) = (format!("DEL by {old} "), format!(" of {new}"));
    node.primary_calls()
        .lines()
        .map(str::trim_start)
        .any(|line| line.starts_with(&by_old) && line.contains(&of_new))
}

/// The primary's calls in order, as (verb, container ID).
pub fn primary_call_list(node: &CriNode) -> Vec<(String, String)> {
    node.primary_calls()
        .lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| {
            let mut words = line.split(' ').skip(1);
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

/// Without the guard the old sandbox's teardown goes through and reaches the new pod: the
/// calico-cni v1 model's DEL removes the new pod's endpoint at StopPodSandbox; the calico
/// model's StopPodSandbox DEL (the old netns named) hurts no one, its RemovePodSandbox DEL
/// (an empty netns) deletes the new pod's host veth by name. The sticky-IP model's harm is
/// the address's (`assert_stale_del_frees_new_pods_address`).
pub fn assert_stale_del_destroys_new_pod(node: &CriNode, pods: Recreated) {
    if node.layout.primary.sticky_ip() {
        return assert_stale_del_frees_new_pods_address(node, pods);
    }
    let Recreated {
        old,
        new,
        new_ip,
        stop_old,
        ..
    } = pods;
    stop_old
        .unwrap_or_else(|e| panic!("without the guard the old sandbox's DEL goes through: {e:?}"));
    if node.layout.primary == Primary::PodNamedVeth {
        assert!(
            reachable(&new_ip) && !old_del_hit_new(node, &old, &new),
            "the pod-named-veth model's DEL of the old sandbox with its netns named should not touch the new pod\n{}",
            node.diagnostics()
        );
        node.remove_pod(&old).unwrap_or_else(|e| {
            panic!("without the guard RemovePodSandbox({old}) goes through: {e:?}")
        });
    }
    println!("primary plugin calls:\n{}", node.primary_calls());
    assert!(
        old_del_hit_new(node, &old, &new),
        "the old sandbox's DEL should have reached the new pod's endpoint or host veth\n{}",
        node.diagnostics()
    );
    assert!(
        !reachable(&new_ip),
        "the old sandbox's DEL should have torn down the new pod's endpoint at {new_ip}; \
         if it did not, this test cannot see the incident\n{}",
        node.diagnostics()
    );
    if node.layout.primary == Primary::PodNamedVeth {
        let links = node.host_links();
        assert!(
            links.is_empty(),
            "the new pod's host veth should be gone with the old sandbox's DEL: {links:?}"
        );
    } else {
        // Calico's DEL leaves the host veth: the endpoint (with its route) and the address
        // are what it takes.
        assert!(
            !node.layout.primary_state.join("ips").join(&new_ip).exists(),
            "the old sandbox's DEL should have released the new pod's address {new_ip}\n{}",
            node.diagnostics()
        );
    }
}

/// With a sticky IP, the new sandbox got the address the old one still held: two netns answer
/// for it (the duplicate address).
pub fn assert_both_sandboxes_hold_the_address(node: &CriNode, pods: &Recreated) {
    let (old, new, ip) = (&pods.old, &pods.new, &pods.new_ip);
    assert!(
        pods.old_addresses.contains(ip),
        "the old sandbox {old} should still hold {ip} once the new one ran: {:?}\n{}",
        pods.old_addresses,
        node.diagnostics()
    );
    assert_new_holds_its_address(node, pods);
    println!("duplicate address: {ip} is held by the netns of {old} and of {new}");
}

fn assert_new_holds_its_address(node: &CriNode, pods: &Recreated) {
    let held = netns_addresses(&node.primary_netns(&pods.new));
    assert!(
        held.contains(&pods.new_ip),
        "the new sandbox {} should hold {}: {held:?}\n{}",
        pods.new,
        pods.new_ip,
        node.diagnostics()
    );
}

/// Without the guard, the sticky-IP model's DEL of the old sandbox (its netns named) takes
/// the old interface out but releases the pod name's address, which the new pod still holds:
/// the node's next pod is given it.
fn assert_stale_del_frees_new_pods_address(node: &CriNode, pods: Recreated) {
    pods.stop_old
        .as_ref()
        .unwrap_or_else(|e| panic!("without the guard the old sandbox's DEL goes through: {e:?}"));
    let (old, new, ip) = (&pods.old, &pods.new, &pods.new_ip);
    println!("primary plugin calls:\n{}", node.primary_calls());
    assert!(
        old_del_hit_new(node, old, new),
        "the old sandbox's DEL should have released the address of the new pod\n{}",
        node.diagnostics()
    );
    assert!(
        !node.primary_allocations().contains(ip),
        "{ip} should be free in the primary's IPAM"
    );
    assert_new_holds_its_address(node, &pods);
    let next = node
        .run_pod("etcd1-1", NAMESPACE, "3")
        .unwrap_or_else(|e| panic!("RunPodSandbox of the next pod: {e:?}"));
    assert_eq!(
        node.pod_status(&next)["ip"].as_str(),
        Some(ip.as_str()),
        "the next pod should be given {ip}, which {new} still holds\n{}",
        node.diagnostics()
    );
}

/// Chained, the stale DEL is refused, the new pod keeps its network, and the test's order (new
/// sandbox stopped and removed, then the old one; kubelet's GC goes the other way, old first,
/// which chained mode refuses while the new pod lives) completes.
pub fn assert_guard_refuses_and_both_sandboxes_go(node: &CriNode, pods: Recreated) {
    let refusal = pods
        .stop_old
        .expect_err("sandbox-guard must refuse the old sandbox's DEL");
    let (old, new, new_ip) = (pods.old.as_str(), pods.new.as_str(), pods.new_ip.as_str());
    println!("StopPodSandbox({old}) refused: {}", refusal.message);
    assert!(refusal.message.contains("stale DEL"), "{refusal:?}");
    assert!(
        refusal.message.contains(new),
        "the refusal names the owner {new}: {refusal:?}"
    );
    assert_eq!(state_of(node, old), "SANDBOX_NOTREADY");
    // What chained mode cannot help: the refused DEL leaves the old netns as it was, with a
    // sticky IP still answering for the new pod's address.
    let left = netns_addresses(&pods.old_netns);
    assert_eq!(
        left, pods.old_addresses,
        "the old netns changed though its DEL was refused"
    );
    println!("the old sandbox's netns still holds {left:?}");
    assert!(
        reachable(new_ip),
        "the new pod at {new_ip} lost its network\n{}",
        node.diagnostics()
    );
    assert_eq!(
        pod_owner(node),
        new,
        "the new sandbox must stay the owner of the pod key"
    );
    assert!(
        !old_del_hit_new(node, old, new),
        "the primary got the stale DEL\n{}",
        node.primary_calls()
    );

    node.stop_pod(new)
        .unwrap_or_else(|e| panic!("StopPodSandbox new {new}: {e:?}"));
    node.remove_pod(new)
        .unwrap_or_else(|e| panic!("RemovePodSandbox new {new}: {e:?}"));
    node.stop_pod(old)
        .unwrap_or_else(|e| panic!("StopPodSandbox old {old} after the new one went: {e:?}"));
    node.remove_pod(old)
        .unwrap_or_else(|e| panic!("RemovePodSandbox old {old}: {e:?}"));
    assert_nothing_left(node, "both sandboxes went");
    println!("primary plugin calls:\n{}", node.primary_calls());
}

/// In delegate mode the old sandbox's Stop and Remove succeed on their first call while the
/// primary never sees its DEL, the new pod keeps its network and address, and the old netns
/// holds no interface: what the primary left there (with a sticky IP, the duplicate address)
/// the guard removed itself; once the new sandbox is stopped and removed, the deferred DEL
/// reaches the primary and nothing is left.
pub fn assert_delegate_defers_and_replays(node: &CriNode, pods: Recreated) {
    let (old, new, new_ip) = (pods.old.clone(), pods.new.clone(), pods.new_ip.clone());
    pods.stop_old.as_ref().unwrap_or_else(|e| {
        panic!(
            "in delegate mode StopPodSandbox({old}) succeeds on its first call: {e:?}\n{}",
            node.diagnostics()
        )
    });
    assert_eq!(state_of(node, &old), "SANDBOX_NOTREADY");
    assert!(
        reachable(&new_ip),
        "the new pod at {new_ip} lost its network\n{}",
        node.diagnostics()
    );
    assert_eq!(
        pod_owner(node),
        new,
        "the new sandbox must stay the owner of the pod key"
    );
    assert_holds_no_interface(&pods.old_netns);
    assert_new_holds_its_address(node, &pods);
    let deferral = guard_log(node)
        .into_iter()
        .find(|l| l.container == old && l.outcome == cni::Outcome::Deferred)
        .unwrap_or_else(|| {
            panic!(
                "the guard's log has no outcome=deferred for {old}\n{}",
                node.diagnostics()
            )
        });
    let teardown = if pods.old_addresses.is_empty() {
        "its interface is gone already"
    } else {
        "removed eth0 ("
    };
    assert!(
        deferral.raw.contains(teardown),
        "the deferral should say {teardown:?}: {}",
        deferral.raw
    );
    node.remove_pod(&old).unwrap_or_else(|e| {
        panic!(
            "in delegate mode RemovePodSandbox({old}) succeeds on its first call: {e:?}\n{}",
            node.diagnostics()
        )
    });
    assert!(
        reachable(&new_ip),
        "the new pod at {new_ip} lost its network to the old sandbox's removal\n{}",
        node.diagnostics()
    );
    let deferred: Vec<String> = deferred_dels(node)
        .iter()
        .map(|entry| {
            entry["containerId"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        deferred,
        [old.as_str()],
        "the old sandbox's DEL is deferred, once"
    );
    let calls = primary_call_list(node);
    let added_new = position(&calls, "ADD", &new).expect("the primary added the new sandbox");
    assert!(
        !calls[added_new..]
            .iter()
            .any(|(verb, id)| verb == "DEL" && *id == old),
        "the primary got the old sandbox's DEL while the new one lives\n{}",
        node.primary_calls()
    );

    node.stop_pod(&new)
        .unwrap_or_else(|e| panic!("StopPodSandbox new {new}: {e:?}\n{}", node.diagnostics()));
    node.remove_pod(&new)
        .unwrap_or_else(|e| panic!("RemovePodSandbox new {new}: {e:?}\n{}", node.diagnostics()));
    println!("primary plugin calls:\n{}", node.primary_calls());
    let calls = primary_call_list(node);
    let deleted_new = position(&calls, "DEL", &new).expect("the primary got the new sandbox's DEL");
    assert!(
        calls[deleted_new..]
            .iter()
            .any(|(verb, id)| verb == "DEL" && *id == old),
        "the deferred DEL of {old} should reach the primary after the new sandbox's DEL\n{}",
        node.diagnostics()
    );
    assert!(
        guard_log(node)
            .iter()
            .any(|l| l.container == old && l.outcome == cni::Outcome::Replayed),
        "the guard's log has no outcome=replayed for {old}\n{}",
        node.diagnostics()
    );
    assert_nothing_left(
        node,
        "both sandboxes went and the deferred DEL was replayed",
    );
}

fn position(calls: &[(String, String)], verb: &str, id: &str) -> Option<usize> {
    calls.iter().position(|(v, c)| v == verb && c == id)
}

/// The global addresses (without their prefix length) the netns at `path` holds.
pub fn netns_addresses(path: &Path) -> Vec<String> {
    let netns = format!("--net={}", path.display());
    let out = sys::run(
        "nsenter",
        &[&netns, "ip", "-o", "addr", "show", "scope", "global"],
    );
    // "2: eth0    inet 100.64.3.2/24 scope global eth0 ...": the word after the family.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line
                .split_whitespace()
                .skip_while(|w| !w.starts_with("inet"));
            words
                .nth(1)
                .map(|cidr| cidr.split('/').next().unwrap_or(cidr).to_string())
        })
        .collect()
}

/// The netns at `path` holds no link but loopback, so no address but loopback's.
pub fn assert_holds_no_interface(path: &Path) {
    let netns = format!("--net={}", path.display());
    let out = sys::run("nsenter", &[&netns, "ip", "-o", "link", "show"]);
    let links = String::from_utf8_lossy(&out.stdout);
    assert!(
        links
            .lines()
            .all(|line| line.split(": ").nth(1) == Some("lo")),
        "the old sandbox's netns {} still holds an interface:\n{links}",
        path.display()
    );
}

/// No address allocated by the primary, no host veth of the node's prefix, no checkpoint,
/// no ownership and no deferred DEL in sandbox-guard's store.
pub fn assert_nothing_left(node: &CriNode, after: &str) {
    let allocations = node.primary_allocations();
    assert!(
        allocations.is_empty(),
        "addresses still allocated after {after}: {allocations:?}\n{}",
        node.diagnostics()
    );
    let links = node.host_links();
    assert!(links.is_empty(), "host veths left after {after}: {links:?}");
    let entries = cni::dump_checkpoints(&node.layout.guard_state, &[]);
    assert!(
        entries.is_empty(),
        "checkpoints or deferred DELs left after {after}: {entries:?}"
    );
}

/// sandbox-guard's checkpoint records of the StatefulSet pod.
pub fn guard_records(node: &CriNode) -> Vec<Value> {
    cni::dump_checkpoints(
        &node.layout.guard_state,
        &["--namespace", NAMESPACE, "--pod", POD],
    )
}

/// The deferred DELs in sandbox-guard's store (the dump's entries of that status).
pub fn deferred_dels(node: &CriNode) -> Vec<Value> {
    cni::dump_checkpoints(&node.layout.guard_state, &[])
        .into_iter()
        .filter(|entry| entry["status"] == "deferred")
        .collect()
}

/// The container that owns the pod's key in sandbox-guard's checkpoints.
pub fn pod_owner(node: &CriNode) -> String {
    let records = guard_records(node);
    let owners: Vec<&Value> = records
        .iter()
        .filter(|r| r["owner"] == true && r["status"] != "deferred")
        .collect();
    assert_eq!(
        owners.len(),
        1,
        "exactly one owner of the pod key: {records:?}"
    );
    owners[0]["containerId"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// sandbox-guard's log lines on this node.
pub fn guard_log(node: &CriNode) -> Vec<cni::LogLine> {
    std::fs::read_to_string(&node.layout.guard_log)
        .unwrap_or_default()
        .lines()
        .map(cni::LogLine::parse)
        .collect()
}
