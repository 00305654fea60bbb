//! The stale-DEL incident under containerd 1.6's CRI, with a primary plugin that
//! keys its endpoint by namespace/pod name as calico-cni did up to v1.6.2 (calico 2.1.3)
//! (tests/cri/calico-cni-v1-model-plugin). A StatefulSet pod is recreated under the same name while
//! the old sandbox still awaits its network teardown; the old sandbox's DEL, retried by kubelet,
//! then tears down the NEW pod's network. Each scenario runs once without sandbox-guard, to
//! prove the test sees the damage, and once with sandbox-guard last in the chain, where the
//! stale DEL must be refused, the new pod must keep its network, and both sandboxes must still
//! be removable, the new one first (the test's order: kubelet's container GC removes the old
//! sandbox of a deleted pod while the new pod lives, which chained mode refuses). The sequences and what each way must end in are
//! tests/support/cri_incident.rs's; tests/e2e_delegate.rs plays them with the other models
//! (a pod-named veth, a sticky-IP macvlan) and in delegate mode.

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

use cri_incident::{
    Mode, assert_guard_refuses_and_both_sandboxes_go, assert_stale_del_destroys_new_pod, node,
    recreate_after_failed_stop, recreate_then_stop_old,
};
use cri_node::Primary;

#[test]
fn failed_stop_then_recreate_then_retry_without_guard_destroys_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = node(Primary::CalicoCniV1, Mode::Unguarded);
    let pods = recreate_after_failed_stop(&node);
    let new = pods.new.clone();
    assert_stale_del_destroys_new_pod(&node, pods);
    // The seed's vicious circle: the new pod's own teardown now fails, so kubelet retries it
    // until the next pod of that name is created and becomes the next victim.
    let stuck = node
        .stop_pod(&new)
        .expect_err("the new pod's endpoint is gone, calico 1.5.0 fails its DEL");
    assert!(
        stuck.message.contains("resource does not exist"),
        "{stuck:?}"
    );
}

#[test]
fn failed_stop_then_recreate_then_retry_with_guard_keeps_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = node(Primary::CalicoCniV1, Mode::Chained);
    assert_guard_refuses_and_both_sandboxes_go(&node, recreate_after_failed_stop(&node));
}

#[test]
fn recreate_then_stop_old_without_guard_destroys_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = node(Primary::CalicoCniV1, Mode::Unguarded);
    assert_stale_del_destroys_new_pod(&node, recreate_then_stop_old(&node));
}

#[test]
fn recreate_then_stop_old_with_guard_keeps_new_pod() {
    sys::skip_unless_root!(cri_node::TOOLS);
    let node = node(Primary::CalicoCniV1, Mode::Chained);
    assert_guard_refuses_and_both_sandboxes_go(&node, recreate_then_stop_old(&node));
}
