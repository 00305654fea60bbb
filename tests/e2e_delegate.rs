//! Delegate mode against the stale-DEL incident, under containerd 1.6's CRI, with the model
//! primaries of tests/cri/: the pod-name-keyed one (calico-cni <= v1.6.2: IPAM handle and
//! endpoint keyed by the pod name), the pod-named-veth one (IPAM per container, host veth
//! named from the pod name and deleted by that name when a DEL's netns is empty, as
//! RemovePodSandbox's is: a chained plugin acting on a pod-named veth, cilium#44530) and the
//! sticky-IP macvlan one (an in-house plugin: the pod name's address for every sandbox of the
//! pod, a macvlan in the sandbox's netns only). With the pod-name models the new sandbox's ADD
//! takes the old sandbox's interface along; with the sticky-IP one both sandboxes hold the
//! pod's address at once (the duplicate address, asserted first), which only the guard's own
//! teardown of the stale sandbox's interface, in delegate mode, removes.
//!
//! Both sequences of the incident (the failed stop and its retry; ADD A, ADD B, DEL A) run
//! three ways, each asserting what tests/support/cri_incident.rs says that way ends in:
//! - without the guard: the new pod loses its network (the test sees the harm);
//! - chained (the guard last): the old sandbox's StopPodSandbox is refused, the new pod safe;
//! - delegate (the guard wraps the primary): the old sandbox's Stop and Remove succeed on
//!   their first call, the new pod keeps its network, the old netns holds no address; once the
//!   new sandbox goes, the deferred DEL reaches the primary and nothing is left.
//!
//! The sticky-IP model's unguarded run shows its own harm: the old sandbox's DEL releases the
//! address the new pod holds, and the node's next pod is given it.
//!
//! The calico-cni v1 model's unguarded and chained runs are tests/e2e_containerd.rs's
//! (with the seed's vicious circle on top); this file holds the others. Last, a superseded
//! sandbox's late ADD is refused before the primary sees it, through the exec harness (CRI
//! cannot time out a RunPodSandbox on purpose).

#[path = "support/cni.rs"]
mod cni;
#[path = "support/cri_incident.rs"]
mod cri_incident;
#[path = "support/cri_node.rs"]
mod cri_node;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cri_incident::{Mode, NAMESPACE, POD, Sequence};
use cri_node::Primary;
use serde_json::{Value, json};

fn play(primary: Primary, sequence: Sequence, mode: Mode) {
    let node = cri_incident::node(primary, mode);
    let pods = sequence.play(&node);
    if primary.sticky_ip() {
        cri_incident::assert_both_sandboxes_hold_the_address(&node, &pods);
    }
    match mode {
        Mode::Unguarded => cri_incident::assert_stale_del_destroys_new_pod(&node, pods),
        Mode::Chained => cri_incident::assert_guard_refuses_and_both_sandboxes_go(&node, pods),
        Mode::Delegate => cri_incident::assert_delegate_defers_and_replays(&node, pods),
    }
}

macro_rules! incident_tests {
    ($($name:ident: $primary:ident, $sequence:ident, $mode:ident;)*) => {
        $(
            #[test]
            fn $name() {
                sys::skip_unless_root!(cri_node::TOOLS);
                play(Primary::$primary, Sequence::$sequence, Mode::$mode);
            }
        )*
    };
}

incident_tests! {
    podnamed_veth_failed_stop_then_retry_without_guard_destroys_new_pod:
        PodNamedVeth, FailedStopThenRetry, Unguarded;
    podnamed_veth_failed_stop_then_retry_chained_refuses_old_stop:
        PodNamedVeth, FailedStopThenRetry, Chained;
    podnamed_veth_failed_stop_then_retry_delegate_defers_old_del:
        PodNamedVeth, FailedStopThenRetry, Delegate;
    podnamed_veth_recreate_then_stop_old_without_guard_destroys_new_pod:
        PodNamedVeth, RecreateThenStopOld, Unguarded;
    podnamed_veth_recreate_then_stop_old_chained_refuses_old_stop:
        PodNamedVeth, RecreateThenStopOld, Chained;
    podnamed_veth_recreate_then_stop_old_delegate_defers_old_del:
        PodNamedVeth, RecreateThenStopOld, Delegate;
    podname_keyed_failed_stop_then_retry_delegate_defers_old_del:
        CalicoCniV1, FailedStopThenRetry, Delegate;
    podname_keyed_recreate_then_stop_old_delegate_defers_old_del:
        CalicoCniV1, RecreateThenStopOld, Delegate;
    sticky_ip_failed_stop_then_retry_without_guard_frees_new_pods_address:
        StickyMacvlan, FailedStopThenRetry, Unguarded;
    sticky_ip_failed_stop_then_retry_chained_refuses_and_leaves_duplicate:
        StickyMacvlan, FailedStopThenRetry, Chained;
    sticky_ip_failed_stop_then_retry_delegate_removes_duplicate:
        StickyMacvlan, FailedStopThenRetry, Delegate;
    sticky_ip_recreate_then_stop_old_without_guard_frees_new_pods_address:
        StickyMacvlan, RecreateThenStopOld, Unguarded;
    sticky_ip_recreate_then_stop_old_chained_refuses_and_leaves_duplicate:
        StickyMacvlan, RecreateThenStopOld, Chained;
    sticky_ip_recreate_then_stop_old_delegate_removes_duplicate:
        StickyMacvlan, RecreateThenStopOld, Delegate;
}

/// calico v2 as its manifests run it, at cniVersion 0.1.0 and 0.2.0 (0.2.0-shaped results
/// without interfaces): the incident's ADD A, ADD B, stop A under containerd's CRI, chained
/// and delegate, ends as it does at 1.0.0: the new pod keeps its network.
fn play_calico_v2(version: &str, mode: Mode) {
    let node = cri_incident::node_at_version(Primary::CalicoV2, mode, version);
    let pods = Sequence::RecreateThenStopOld.play(&node);
    match mode {
        Mode::Chained => cri_incident::assert_guard_refuses_and_both_sandboxes_go(&node, pods),
        Mode::Delegate => cri_incident::assert_delegate_defers_and_replays(&node, pods),
        Mode::Unguarded => unreachable!("the model's unguarded harm is e2e_libcni's"),
    }
}

#[test]
fn calico_v2_at_0_1_0_chained_refuses_old_stop() {
    sys::skip_unless_root!(cri_node::TOOLS);
    play_calico_v2("0.1.0", Mode::Chained);
}

#[test]
fn calico_v2_at_0_1_0_delegate_defers_old_del() {
    sys::skip_unless_root!(cri_node::TOOLS);
    play_calico_v2("0.1.0", Mode::Delegate);
}

#[test]
fn calico_v2_at_0_2_0_chained_refuses_old_stop() {
    sys::skip_unless_root!(cri_node::TOOLS);
    play_calico_v2("0.2.0", Mode::Chained);
}

#[test]
fn calico_v2_at_0_2_0_delegate_defers_old_del() {
    sys::skip_unless_root!(cri_node::TOOLS);
    play_calico_v2("0.2.0", Mode::Delegate);
}

/// Tools of the late-ADD test: the models' and the netns ones.
const EXEC_TOOLS: &[&str] = &["ip", "nsenter", "flock", "sha1sum"];

/// ADD A, ADD B (the same pod re-created), then A's slow ADD arriving again: the guard must
/// refuse it before the primary runs, so the primary's trace has two ADDs and the
/// new sandbox keeps its address and the pod key.
fn late_add_of_superseded_sandbox_is_refused(primary: Primary) {
    let incident = cni::Incident::of(NAMESPACE, POD);
    let dir = sys::TempDir::new("sglate");
    let bin = dir.path.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(primary.executable(), bin.join(primary.plugin_type())).unwrap();
    let primary_state = dir.path.join("primary");
    let [a, b, c] = sys::free_subnet(100, 64..=64);
    let config = json!({
        "cniVersion": "1.0.0",
        "name": "e2e-pod-network",
        "type": "sandbox-guard",
        "stateDir": incident.store.state_dir,
        "logFile": incident.store.log_file,
        "delegate": {
            "type": primary.plugin_type(),
            "stateDir": primary_state,
            "subnet": format!("{a}.{b}.{c}.0/24"),
            "hostVethPrefix": sys::unique("s"),
            "onMissingEndpoint": "ignore",
        },
    });
    let (netns_a, netns_b) = (sys::Netns::new("sgla"), sys::Netns::new("sglb"));
    let add = |container: &str, pod: &cni::Pod, netns: &sys::Netns| {
        cni::Cni::with_config("ADD", container, &config)
            .pod(pod)
            .netns(netns.path().to_str().unwrap())
            .env("CNI_PATH", Some(bin.to_str().unwrap()))
            .run()
    };
    let calls = || std::fs::read_to_string(primary_state.join("calls.log")).unwrap_or_default();

    add(&incident.a, &incident.pod_a, &netns_a).assert_ok();
    let added_b: Value = add(&incident.b, &incident.pod_b, &netns_b)
        .assert_ok()
        .json();
    let address_b = added_b["ips"][0]["address"]
        .as_str()
        .expect("B's address")
        .to_string();
    // 104: the guard's "superseded" refusal (src/error.rs), not 11: the runtime must give
    // up on this sandbox and make a new one, not retry it.
    let refusal = add(&incident.a, &incident.pod_a, &netns_a).assert_error(104);
    assert!(refusal.msg.contains("superseded"), "{}", refusal.text());
    println!(
        "late ADD of A refused: {}\nprimary plugin calls:\n{}",
        refusal.text(),
        calls()
    );
    let adds = calls()
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some("ADD"))
        .count();
    assert_eq!(adds, 2, "the primary saw the late ADD:\n{}", calls());
    assert!(
        incident.store.is_owner(&incident.b, "eth0"),
        "B must keep the pod key: {:?}",
        incident.store.dump()
    );
    let b_addresses = netns_b.exec(&["ip", "-o", "-4", "addr", "show", "dev", "eth0"]);
    let b_addresses = String::from_utf8_lossy(&b_addresses.stdout);
    assert!(
        b_addresses.contains(&address_b),
        "B lost its address {address_b}: {b_addresses}"
    );
}

#[test]
fn calico_late_add_of_superseded_sandbox_is_refused_before_the_primary() {
    sys::skip_unless_root!(EXEC_TOOLS);
    late_add_of_superseded_sandbox_is_refused(Primary::PodNamedVeth);
}

#[test]
fn podname_keyed_late_add_of_superseded_sandbox_is_refused_before_the_primary() {
    sys::skip_unless_root!(EXEC_TOOLS);
    late_add_of_superseded_sandbox_is_refused(Primary::CalicoCniV1);
}

/// A primary whose DEL takes ten seconds, under containerd's CRI: the stop of the pod's new
/// sandbox frees its name, and the old sandbox's deferred DEL reaches the primary in full (a
/// verb's few seconds would kill it mid-DEL at every try).
#[test]
fn podname_keyed_primary_whose_del_takes_ten_seconds_gets_the_deferred_del() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = cri_incident::node(Primary::CalicoCniV1, Mode::Delegate);
    let pods = Sequence::RecreateThenStopOld.play(&node);
    let (old, new) = (pods.old.clone(), pods.new.clone());
    pods.stop_old
        .as_ref()
        .unwrap_or_else(|e| panic!("StopPodSandbox old {old}: {e:?}\n{}", node.diagnostics()));
    node.remove_pod(&old)
        .unwrap_or_else(|e| panic!("RemovePodSandbox old {old}: {e:?}\n{}", node.diagnostics()));
    node.slow_primary_dels(10.0);
    node.stop_pod(&new)
        .unwrap_or_else(|e| panic!("StopPodSandbox new {new}: {e:?}\n{}", node.diagnostics()));
    node.remove_pod(&new)
        .unwrap_or_else(|e| panic!("RemovePodSandbox new {new}: {e:?}\n{}", node.diagnostics()));
    let guard =
        cni::Store::with_state_dir(node.layout.guard_state.clone(), &node.layout.guard_state);
    guard.wait_for_replays(std::time::Duration::from_secs(90));
    let calls = cri_incident::primary_call_list(&node);
    let new_del = calls
        .iter()
        .position(|(verb, id)| verb == "DEL" && *id == new)
        .expect("the primary got the new sandbox's DEL");
    assert!(
        calls[new_del..]
            .iter()
            .any(|(verb, id)| verb == "DEL" && *id == old),
        "the slow primary never got the old sandbox's deferred DEL\n{}",
        node.primary_calls()
    );
    assert!(
        cri_incident::deferred_dels(&node).is_empty(),
        "{:?}",
        cri_incident::deferred_dels(&node)
    );
}
