//! The stale-DEL incident (seed 001) under containerd 1.6's CRI (cri_node.rs): a StatefulSet
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

/// How the pod-name-keyed model answers a DEL whose endpoint is gone: calico 1.5.0 failed
/// ("resource does not exist"), which kept kubelet retrying forever; calico 1.10.0 ignores it.
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
    if layout.primary == Primary::PodnameKeyed {
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

/// A node of the incident run `mode`. Unguarded, the pod-name-keyed model is calico 1.5.0,
/// the version of the incident; guarded it is 1.10.0: containerd DELs twice per sandbox (Stop,
/// Remove) and the guarded tests finish by removing both sandboxes, and in delegate mode the
/// replayed DEL of the old sandbox finds the endpoint gone with the new one's DEL.
pub fn node(primary: Primary, mode: Mode) -> CriNode {
    let missing = match mode {
        Mode::Unguarded => MissingEndpoint::Fail,
        Mode::Chained | Mode::Delegate => MissingEndpoint::Ignore,
    };
    CriNode::start(primary, |layout| conflist(layout, mode, missing))
}

/// The host reaches a pod through the primary's /32 route to its host veth; a pod whose
/// endpoint was torn down is unreachable. Several tries absorb the first ARP resolution.
pub fn reachable(ip: &str) -> bool {
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
    let (new, new_ip) = run_pod(node, "2");
    let old_netns = node.pin_netns(&old);
    let stop_old = node.stop_pod(&old);
    Recreated { old, new, new_ip, stop_old, old_netns }
}

pub fn recreate_then_stop_old(node: &CriNode) -> Recreated {
    let (old, _) = run_pod(node, "1");
    let (new, new_ip) = run_pod(node, "2");
    let old_netns = node.pin_netns(&old);
    let stop_old = node.stop_pod(&old);
    Recreated { old, new, new_ip, stop_old, old_netns }
}

/// Whether the primary's trace shows a DEL of `old` tearing down something of `new`: the
/// pod-name-keyed model's "DEL by <old> removes endpoint of <new>", the calico model's "DEL
/// by <old> deletes host link <name> of <new> (by name, empty netns)".
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
/// pod-name-keyed model's DEL removes the new pod's endpoint at StopPodSandbox; the calico
/// model's StopPodSandbox DEL (the old netns named) hurts no one, its RemovePodSandbox DEL
/// (an empty netns) deletes the new pod's host veth by name.
pub fn assert_stale_del_destroys_new_pod(node: &CriNode, pods: Recreated) {
    let Recreated { old, new, new_ip, stop_old, .. } = pods;
    stop_old
        .unwrap_or_else(|e| panic!("without the guard the old sandbox's DEL goes through: {e:?}"));
    if node.layout.primary == Primary::CurrentCalico {
        assert!(
            reachable(&new_ip) && !old_del_hit_new(node, &old, &new),
            "calico 3.x's DEL of the old sandbox with its netns named should not touch the new pod\n{}",
            node.diagnostics()
        );
        node.remove_pod(&old)
            .unwrap_or_else(|e| panic!("without the guard RemovePodSandbox({old}) goes through: {e:?}"));
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
    let links = node.host_links();
    assert!(
        links.is_empty(),
        "the new pod's host veth should be gone with the old sandbox's DEL: {links:?}"
    );
}

/// Chained, the stale DEL is refused, the new pod keeps its network, and kubelet's order (new
/// sandbox stopped and removed, then the old one) completes.
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
/// primary never sees its DEL, the new pod keeps its network, and the old netns holds no
/// address; once the new sandbox is stopped and removed, the deferred DEL reaches the primary
/// and nothing is left.
pub fn assert_delegate_defers_and_replays(node: &CriNode, pods: Recreated) {
    let Recreated { old, new, new_ip, stop_old, old_netns } = pods;
    stop_old.unwrap_or_else(|e| {
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
    assert_eq!(pod_owner(node), new, "the new sandbox must stay the owner of the pod key");
    assert_holds_no_address(&old_netns);
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
        .map(|entry| entry["containerId"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(deferred, [old.as_str()], "the old sandbox's DEL is deferred, once");
    let calls = primary_call_list(node);
    let added_new = position(&calls, "ADD", &new).expect("the primary added the new sandbox");
    assert!(
        !calls[added_new..].iter().any(|(verb, id)| verb == "DEL" && *id == old),
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
        calls[deleted_new..].iter().any(|(verb, id)| verb == "DEL" && *id == old),
        "the deferred DEL of {old} should reach the primary after the new sandbox's DEL\n{}",
        node.diagnostics()
    );
    for outcome in ["deferred", "replayed"] {
        assert!(
            guard_log(node).iter().any(|l| l.container == old && l.outcome == outcome),
            "the guard's log has no outcome={outcome} for {old}\n{}",
            node.diagnostics()
        );
    }
    assert_nothing_left(node, "both sandboxes went and the deferred DEL was replayed");
}

fn position(calls: &[(String, String)], verb: &str, id: &str) -> Option<usize> {
    calls.iter().position(|(v, c)| v == verb && c == id)
}

/// The netns at `path` holds no address but loopback's.
pub fn assert_holds_no_address(path: &Path) {
    let netns = format!("--net={}", path.display());
    let out = sys::run("nsenter", &[&netns, "ip", "-o", "addr", "show", "scope", "global"]);
    let addresses = String::from_utf8_lossy(&out.stdout);
    assert!(
        addresses.trim().is_empty(),
        "the old sandbox's netns {} still holds an address:\n{addresses}",
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
    cni::dump_checkpoints(&node.layout.guard_state, &["--namespace", NAMESPACE, "--pod", POD])
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
