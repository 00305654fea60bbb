//! The stale-DEL incident (seed 001) under containerd 1.6's CRI, with a primary plugin that
//! keys its endpoint by namespace/pod name as calico CNI did before 1.10
//! (tests/cri/podname-keyed-plugin). A StatefulSet pod is recreated under the same name while
//! the old sandbox still awaits its network teardown; the old sandbox's DEL, retried by kubelet,
//! then tears down the NEW pod's network. Each scenario runs once without sandbox-guard, to
//! prove the test sees the damage, and once with sandbox-guard last in the chain, where the
//! stale DEL must be refused, the new pod must keep its network, and both sandboxes must still
//! be removable in kubelet's order.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/cri_node.rs"]
mod cri_node;

use cri_node::{CriError, CriNode, NodeLayout};
use serde_json::{Value, json};

const NAMESPACE: &str = "lijiaob";
const POD: &str = "etcd1-0";

/// How the primary answers a DEL whose endpoint is gone: calico 1.5.0 failed ("resource does
/// not exist"), which kept kubelet retrying forever; calico 1.10.0 ignores it. The guarded
/// nodes need the 1.10 behaviour because containerd DELs twice per sandbox (Stop, Remove) and
/// the tests finish by removing both sandboxes; the unguarded ones keep 1.5.0's, the version
/// of the incident.
#[derive(Clone, Copy)]
enum MissingEndpoint {
    Fail,
    Ignore,
}

fn conflist(layout: &NodeLayout, guarded: bool, missing: MissingEndpoint) -> Value {
    let mut plugins = vec![json!({
        "type": "podname-keyed",
        "stateDir": layout.primary_state,
        "subnet": layout.subnet,
        "hostVethPrefix": layout.veth_prefix,
        "onMissingEndpoint": match missing {
            MissingEndpoint::Fail => "fail",
            MissingEndpoint::Ignore => "ignore",
        },
    })];
    if guarded {
        plugins.push(json!({
            "type": "sandbox-guard",
            "stateDir": layout.guard_state,
            "staleDel": "refuse",
            "logFile": layout.guard_log,
        }));
    }
    json!({"cniVersion": "1.0.0", "name": "e2e-pod-network", "plugins": plugins})
}

/// A node of the incident: no guard, and the primary of calico 1.5.0.
fn unguarded_node() -> CriNode {
    CriNode::start(|layout| conflist(layout, false, MissingEndpoint::Fail))
}

/// The same node with sandbox-guard last in the chain, and the primary of calico 1.10.0.
fn guarded_node() -> CriNode {
    CriNode::start(|layout| conflist(layout, true, MissingEndpoint::Ignore))
}

/// The host reaches a pod through the primary's /32 route to its host veth; a pod whose
/// endpoint was torn down is unreachable. Several tries absorb the first ARP resolution.
fn reachable(ip: &str) -> bool {
    (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "1", ip]))
}

/// Runs a sandbox of the StatefulSet pod and checks it got a reachable address.
fn run_pod(node: &CriNode, uid: &str) -> (String, String) {
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

fn state_of(node: &CriNode, id: &str) -> String {
    node.pod_status(id)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The StatefulSet pod recreated under its name, and how the old sandbox's (last) stop ended.
struct Recreated {
    old: String,
    new: String,
    new_ip: String,
    stop_old: Result<(), CriError>,
}

/// The incident's sequence: the old sandbox's teardown fails once (the primary's own
/// failure), the pod is recreated under the same name, then kubelet retries the old teardown.
fn recreate_after_failed_stop(node: &CriNode) -> Recreated {
    let (old, _) = run_pod(node, "1");
    node.fail_next_primary_del();
    let first_stop = node.stop_pod(&old).expect_err("the injected primary failure must fail StopPodSandbox");
    assert!(first_stop.message.contains("injected primary failure"), "{first_stop:?}");
    assert_eq!(state_of(node, &old), "SANDBOX_NOTREADY");
    let (new, new_ip) = run_pod(node, "2");
    let stop_old = node.stop_pod(&old);
    Recreated { old, new, new_ip, stop_old }
}

/// The same name recreated while the old sandbox is still up (no failure first), then the
/// old sandbox stopped.
fn recreate_then_stop_old(node: &CriNode) -> Recreated {
    let (old, _) = run_pod(node, "1");
    let (new, new_ip) = run_pod(node, "2");
    let stop_old = node.stop_pod(&old);
    Recreated { old, new, new_ip, stop_old }
}

/// The primary's trace line saying a DEL of `old` tore down `new`'s endpoint.
fn stale_teardown(old: &str, new: &str) -> String {
    format!("DEL by {old} removes endpoint of {new}")
}

fn assert_stale_del_destroys_new_pod(node: &CriNode, pods: Recreated) {
    let Recreated { old, new, new_ip, stop_old } = pods;
    stop_old
        .unwrap_or_else(|e| panic!("without the guard the old sandbox's DEL goes through: {e:?}"));
    println!("primary plugin calls:\n{}", node.primary_calls());
    assert!(
        node.primary_calls().contains(&stale_teardown(&old, &new)),
        "the old sandbox's DEL should have reached the new pod's endpoint\n{}",
        node.diagnostics()
    );
    assert!(
        !reachable(&new_ip),
        "the old sandbox's DEL should have torn down the new pod's endpoint at {new_ip}; \
         if it did not, this test cannot see the incident\n{}",
        node.diagnostics()
    );
}

/// With the guard the stale DEL is refused, the new pod keeps its network, and kubelet's
/// order (new sandbox stopped and removed, then the old one) completes.
fn assert_guard_refuses_and_both_sandboxes_go(node: &CriNode, pods: Recreated) {
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
        !node.primary_calls().contains(&stale_teardown(old, new)),
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
    let leftover: Vec<_> = std::fs::read_dir(node.layout.primary_state.join("ips"))
        .map(|dir| dir.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftover.is_empty(),
        "addresses still allocated after both sandboxes went: {leftover:?}"
    );
    let records = guard_records(node);
    assert!(
        records.is_empty(),
        "checkpoints left after both sandboxes went: {records:?}"
    );
    println!("primary plugin calls:\n{}", node.primary_calls());
}

/// sandbox-guard's checkpoint records of the StatefulSet pod.
fn guard_records(node: &CriNode) -> Vec<Value> {
    cni::dump_checkpoints(&node.layout.guard_state, &["--namespace", NAMESPACE, "--pod", POD])
}

/// The container that owns the pod's key in sandbox-guard's checkpoints.
fn pod_owner(node: &CriNode) -> String {
    let records = guard_records(node);
    let owners: Vec<&Value> = records.iter().filter(|r| r["owner"] == true).collect();
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

#[test]
fn failed_stop_then_recreate_then_retry_without_guard_destroys_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = unguarded_node();
    let pods = recreate_after_failed_stop(&node);
    let new = pods.new.clone();
    assert_stale_del_destroys_new_pod(&node, pods);
    // The seed's vicious circle: the new pod's own teardown now fails, so kubelet retries it
    // until the next pod of that name is created and becomes the next victim.
    let stuck = node.stop_pod(&new).expect_err("the new pod's endpoint is gone, calico 1.5.0 fails its DEL");
    assert!(stuck.message.contains("resource does not exist"), "{stuck:?}");
}

#[test]
fn failed_stop_then_recreate_then_retry_with_guard_keeps_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = guarded_node();
    assert_guard_refuses_and_both_sandboxes_go(&node, recreate_after_failed_stop(&node));
}

#[test]
fn recreate_then_stop_old_without_guard_destroys_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = unguarded_node();
    assert_stale_del_destroys_new_pod(&node, recreate_then_stop_old(&node));
}

#[test]
fn recreate_then_stop_old_with_guard_keeps_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = guarded_node();
    assert_guard_refuses_and_both_sandboxes_go(&node, recreate_then_stop_old(&node));
}
