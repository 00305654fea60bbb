//! The two-ifnames sequence through real libcni (tests/libcni-driver) against the model of
//! calico before 3.x (tests/cri/podname-keyed-plugin: IPAM handle, endpoint and host veth by
//! `namespace.podname`). The old sandbox attached as `net1`, the new one as `net2` (multus
//! numbers a pod's interfaces by their place in its annotation): the old sandbox's DEL must
//! not reach the model while the new one lives, or the model releases the new pod's address
//! and deletes its link. Needs root, Go and Debian's libcni source.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/libcni.rs"]
mod libcni;

use libcni::{Mode, NetnsArg, Sandbox, assert_result_matches_kernel, bare_ip, pod_has_link, podname_keyed_network};

fn the_new_pod_keeps_its_address_and_link(mode: Mode) {
    let net = podname_keyed_network();
    let conflist = net.conflist_of(mode).to_path_buf();
    // The model names host links from the pod's name: a name of this test's own.
    let pod = sys::unique("etcd");
    let old = Sandbox::new("lijiaob", &pod, "uid1").with_ifname("net1");
    let new = Sandbox::new("lijiaob", &pod, "uid2").with_ifname("net2");
    net.add_with(&conflist, &old).unwrap_or_else(|e| panic!("ADD A: {}", e.stderr));
    let new_result = net.add_with(&conflist, &new).unwrap_or_else(|e| panic!("ADD B: {}", e.stderr));
    let new_ip = result_ip(&new_result);

    // StopPodSandbox of A (its netns), then RemovePodSandbox (an empty netns).
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        match mode {
            Mode::Chained => {
                let refused = net.del_with(&conflist, &old, netns).expect_err("A's stale DEL must be refused");
                assert_eq!(refused.code, Some(11), "{}", refused.stderr);
                assert!(refused.stderr.contains(&new.container_id), "names the owner: {}", refused.stderr);
            }
            Mode::Delegate => net.del_with(&conflist, &old, netns).unwrap_or_else(|e| panic!("A's DEL is deferred: {}", e.stderr)),
        }
    }
    assert!(pod_has_link(&new, "net2"), "B lost its link to A's DEL");
    assert_result_matches_kernel(&new_result, &new);
    assert!(
        (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "2", &new_ip])),
        "node -> B ({new_ip}) after A's DEL"
    );

    // B goes; then A's DEL reaches the model (replayed in delegate mode, retried when chained).
    net.del_with(&conflist, &new, NetnsArg::Sandbox).unwrap_or_else(|e| panic!("DEL B: {}", e.stderr));
    if mode == Mode::Chained {
        net.del_with(&conflist, &old, NetnsArg::Empty).unwrap_or_else(|e| panic!("A's DEL once B is gone: {}", e.stderr));
    } else {
        let replayed = net.log_lines().iter().filter(|l| l.outcome == "replayed" && l.container == old.container_id).count();
        assert_eq!(replayed, 1, "{:?}", net.log_lines());
    }
    assert!(net.guard_files().is_empty(), "{:?}", net.guard_files());
}

fn result_ip(result: &serde_json::Value) -> String {
    bare_ip(result["ips"][0]["address"].as_str().expect("an address")).to_string()
}

#[test]
fn two_ifnames_chained_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    the_new_pod_keeps_its_address_and_link(Mode::Chained);
}

#[test]
fn two_ifnames_delegate_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    the_new_pod_keeps_its_address_and_link(Mode::Delegate);
}
