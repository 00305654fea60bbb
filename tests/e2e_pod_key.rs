//! The two-ifnames sequence through real libcni (tests/libcni-driver) against the model of
//! calico up to 2.1 with etcd (tests/cri/calico-cni-v1-model-plugin: IPAM handle, endpoint and host veth by
//! `namespace.podname`). The old sandbox attached as `net1`, the new one as `net2` (multus
//! numbers a pod's interfaces by their place in its annotation): the old sandbox's DEL must
//! not reach the model while the new one lives, or the model releases the new pod's address
//! and deletes its link. And a pod with two interfaces on one network, against Debian's
//! bridge and host-local: its name is the pod's until its last interface goes. And an upgrade
//! from the previous release's binary (built from its commit, tests/support/old_release.rs)
//! and the way back to it. Needs root, Go and Debian's libcni source (and git and cargo for
//! the old release).

#[path = "support/cni.rs"]
mod cni;
#[path = "support/libcni.rs"]
mod libcni;
#[path = "support/old_release.rs"]
mod old_release;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use libcni::{
    Mode, NetnsArg, Network, Sandbox, Source, assert_network_empty, assert_result_matches_kernel,
    bare_ip, bridge_network_from, host_veths, pod_has_link, podname_keyed_network, result_ips,
};

fn the_new_pod_keeps_its_address_and_link(mode: Mode) {
    let net = podname_keyed_network();
    let conflist = net.conflist_of(mode).to_path_buf();
    // The model names host links from the pod's name: a name of this test's own.
    let pod = sys::unique("etcd");
    let old = Sandbox::new("lijiaob", &pod, "uid1").with_ifname("net1");
    let new = Sandbox::new("lijiaob", &pod, "uid2").with_ifname("net2");
    net.add_with(&conflist, &old)
        .unwrap_or_else(|e| panic!("ADD A: {}", e.stderr));
    let new_result = net
        .add_with(&conflist, &new)
        .unwrap_or_else(|e| panic!("ADD B: {}", e.stderr));
    let new_ip = result_ip(&new_result);

    // StopPodSandbox of A (its netns), then RemovePodSandbox (an empty netns).
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        match mode {
            Mode::Chained => {
                let refused = net
                    .del_with(&conflist, &old, netns)
                    .expect_err("A's stale DEL must be refused");
                assert_eq!(refused.code, Some(11), "{}", refused.stderr);
                assert!(
                    refused.stderr.contains(&new.container_id),
                    "names the owner: {}",
                    refused.stderr
                );
            }
            Mode::Delegate => net
                .del_with(&conflist, &old, netns)
                .unwrap_or_else(|e| panic!("A's DEL is deferred: {}", e.stderr)),
        }
    }
    assert!(pod_has_link(&new, "net2"), "B lost its link to A's DEL");
    assert_result_matches_kernel(&new_result, &new);
    assert!(
        (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "2", &new_ip])),
        "node -> B ({new_ip}) after A's DEL"
    );

    // B goes; then A's DEL reaches the model (replayed in delegate mode, retried when chained).
    net.del_with(&conflist, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL B: {}", e.stderr));
    if mode == Mode::Chained {
        net.del_with(&conflist, &old, NetnsArg::Empty)
            .unwrap_or_else(|e| panic!("A's DEL once B is gone: {}", e.stderr));
    } else {
        net.wait_for_replays();
        let replayed = net
            .log_lines()
            .iter()
            .filter(|l| l.outcome == cni::Outcome::Replayed && l.container == old.container_id)
            .count();
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

/// Points `sandbox` at its interface `ifname`: one sandbox, one netns, one container id,
/// attached twice to one network as multus attaches a second interface.
fn on<'a>(sandbox: &'a mut Sandbox, ifname: &str) -> &'a Sandbox {
    sandbox.ifname = ifname.to_string();
    sandbox
}

fn assert_refused_for(net: &Network, stale: &Sandbox, owner: &Sandbox, when: &str) {
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        let refused = net.del(stale, netns).expect_err(when);
        assert_eq!(refused.code, Some(11), "{when}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(&owner.container_id),
            "{when}: names the owner: {}",
            refused.stderr
        );
    }
}

/// Whether host-local still holds each of the result's addresses for `sandbox`.
fn reserved_for(net: &Network, result: &serde_json::Value, sandbox: &Sandbox) -> bool {
    result_ips(result)
        .iter()
        .all(|ip| net.ip_holder(bare_ip(ip)).as_deref() == Some(sandbox.container_id.as_str()))
}

/// With the default `podKey` ("name") the pod's name stands for every interface its
/// sandbox has on the network. The owner's DEL of one of two interfaces must not free the name
/// while the other is attached, or the old sandbox's late DEL would pass and the primary would
/// tear down what the new sandbox still uses.
#[test]
fn a_pod_with_two_interfaces_on_one_network_keeps_its_name_until_the_last_goes() {
    sys::skip_unless_root!(libcni::TOOLS);
    // testdata's bridge + host-local (+ portmap) with the guard last and no `podKey`: the default.
    let net = bridge_network_from(Source::Testdata { pin: None });
    let old = Sandbox::new("lijiaob", "etcd1-0", "uid1");
    let mut new = Sandbox::new("lijiaob", "etcd1-0", "uid2");
    let add = |sandbox: &Sandbox| {
        net.add(sandbox).unwrap_or_else(|e| {
            panic!(
                "ADD {} {}: {}",
                sandbox.container_id, sandbox.ifname, e.stderr
            )
        })
    };
    let old_result = add(&old);
    let new_eth0 = add(on(&mut new, "eth0"));
    let new_net1 = add(on(&mut new, "net1"));

    assert_refused_for(&net, &old, &new, "A's stale DEL while C has two interfaces");
    for (ifname, result) in [("eth0", &new_eth0), ("net1", &new_net1)] {
        assert!(pod_has_link(&new, ifname), "C lost {ifname} to A's DEL");
        assert_result_matches_kernel(result, &new);
        assert!(
            reserved_for(&net, result, &new),
            "C's {ifname} address released by A's DEL"
        );
    }

    net.del(on(&mut new, "eth0"), NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL C eth0: {}", e.stderr));
    assert!(
        !pod_has_link(&new, "eth0"),
        "C's eth0 DEL did not reach the bridge"
    );
    assert!(
        result_ips(&new_eth0)
            .iter()
            .all(|ip| net.ip_holder(bare_ip(ip)).is_none()),
        "C's eth0 address still reserved"
    );
    assert_refused_for(&net, &old, &new, "A's stale DEL while C keeps net1");
    assert!(pod_has_link(&new, "net1"), "C lost net1");
    assert_result_matches_kernel(&new_net1, &new);
    assert!(
        reserved_for(&net, &new_net1, &new),
        "C's net1 address released"
    );

    // C's last interface goes (StopPodSandbox, then RemovePodSandbox for each); A's DEL then passes.
    net.del(on(&mut new, "net1"), NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL C net1: {}", e.stderr));
    for ifname in ["eth0", "net1"] {
        net.del(on(&mut new, ifname), NetnsArg::Empty)
            .unwrap_or_else(|e| panic!("C's repeated DEL of {ifname}: {}", e.stderr));
    }
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        net.del(&old, netns)
            .unwrap_or_else(|e| panic!("A's DEL once C is gone: {}", e.stderr));
    }
    assert!(
        !pod_has_link(&old, "eth0") && !pod_has_link(&new, "eth0") && !pod_has_link(&new, "net1"),
        "a pod interface is left"
    );
    for veth in [&old_result, &new_eth0, &new_net1]
        .into_iter()
        .flat_map(host_veths)
    {
        assert!(
            !sys::try_run("ip", &["link", "show", &veth]),
            "host veth {veth} left"
        );
    }
    assert_network_empty(&net);
}

/// The network's guard binary from now on: `binary` in the bin dir libcni runs plugins from.
fn install_guard(net: &Network, binary: &std::path::Path) {
    let link = net.bin_dir.join("sandbox-guard");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(binary, &link).unwrap();
}

/// The previous release, then this one (the upgrade), then README's way back
/// (scripts/downgrade-owners.sh, the older binary), through real libcni against the model of
/// a primary keyed by pod name: the old sandbox's DEL never reaches the model while the new
/// sandbox lives, under either binary, and each binary's DELs pass once the new one is gone.
/// Each switch happens with an ADD of another pod still in the primary (chained: the guard
/// that then runs is the next binary; delegate: the one that wraps the primary is the binary
/// before), and that pod stays protected too: its next sandbox's ADD by the older binary,
/// then its own stale DEL, refused or deferred.
fn the_new_pod_survives_an_upgrade_and_a_downgrade(mode: Mode, old_binary: &std::path::Path) {
    let net = podname_keyed_network();
    let conflist = net.conflist_of(mode).to_path_buf();
    let pod = sys::unique("etcd");
    let old = Sandbox::new("lijiaob", &pod, "uid1");
    let new = Sandbox::new("lijiaob", &pod, "uid2");
    let stale_del_of = |stale: &Sandbox, live: &Sandbox, when: &str| {
        for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
            match mode {
                Mode::Chained => {
                    let refused = net.del_with(&conflist, stale, netns).expect_err(when);
                    assert_eq!(refused.code, Some(11), "{when}: {}", refused.stderr);
                }
                Mode::Delegate => net
                    .del_with(&conflist, stale, netns)
                    .unwrap_or_else(|e| panic!("{when}: the stale DEL is deferred: {}", e.stderr)),
            }
        }
        assert!(
            pod_has_link(live, "eth0"),
            "{when}: the live sandbox lost its link to the stale DEL"
        );
    };
    let stale_del = |when: &str| stale_del_of(&old, &new, when);
    install_guard(&net, old_binary);
    net.add_with(&conflist, &old)
        .unwrap_or_else(|e| panic!("ADD A: {}", e.stderr));
    let new_result = net
        .add_with(&conflist, &new)
        .unwrap_or_else(|e| panic!("ADD B: {}", e.stderr));
    stale_del("the previous release");
    let across_upgrade = with_an_add_in_flight(&net, &conflist, || {
        install_guard(&net, std::path::Path::new(cni::bin()))
    });
    stale_del("after the upgrade");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/downgrade-owners.sh");
    let across_downgrade = with_an_add_in_flight(&net, &conflist, || {
        sys::run("sh", &[script, net.state_dir.to_str().unwrap(), cni::bin()]);
    });
    install_guard(&net, old_binary);
    sys::run("sh", &[script, net.state_dir.to_str().unwrap(), cni::bin()]);
    stale_del("after the way back");
    assert_result_matches_kernel(&new_result, &new);
    for (n, in_flight) in [across_upgrade, across_downgrade].iter().enumerate() {
        let next = Sandbox::new("lijiaob", &in_flight.pod, &format!("uid-next-{n}"));
        net.add_with(&conflist, &next)
            .unwrap_or_else(|e| panic!("ADD of {}'s next sandbox: {}", in_flight.pod, e.stderr));
        stale_del_of(
            in_flight,
            &next,
            &format!("{}'s sandbox added across a switch", in_flight.pod),
        );
        net.del_with(&conflist, &next, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("DEL of {}'s next sandbox: {}", in_flight.pod, e.stderr));
        net.del_with(&conflist, in_flight, NetnsArg::Empty)
            .unwrap_or_else(|e| {
                panic!(
                    "DEL of {}'s sandbox once its next went: {}",
                    in_flight.pod, e.stderr
                )
            });
    }

    net.del_with(&conflist, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL B: {}", e.stderr));
    net.del_with(&conflist, &old, NetnsArg::Empty)
        .unwrap_or_else(|e| panic!("A's DEL once B is gone: {}", e.stderr));
    assert!(
        !pod_has_link(&new, "eth0") && !pod_has_link(&old, "eth0"),
        "a pod interface is left"
    );
}

/// Runs `switch` while a libcni ADD of a new pod is still in the model primary (its trace
/// has the call; `slow-adds` holds it a second and a half there) and returns that pod's
/// sandbox once its ADD has passed.
fn with_an_add_in_flight(
    net: &Network,
    conflist: &std::path::Path,
    switch: impl FnOnce(),
) -> Sandbox {
    let sandbox = Sandbox::new("lijiaob", &sys::unique("web"), "uid-in-flight");
    let model = net.ipam_dir.join("model");
    std::fs::write(model.join("slow-adds"), "1.5").unwrap();
    std::thread::scope(|scope| {
        let add = scope.spawn(|| net.add_with(conflist, &sandbox).map(drop));
        let started = || {
            std::fs::read_to_string(model.join("calls.log"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(" ADD ") && l.contains(&sandbox.container_id))
        };
        while !started() && !add.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(started(), "the ADD never reached the primary");
        switch();
        std::fs::remove_file(model.join("slow-adds")).unwrap();
        add.join()
            .unwrap()
            .unwrap_or_else(|e| panic!("the ADD in flight across the switch: {}", e.stderr));
    });
    sandbox
}

#[test]
fn an_upgrade_and_a_downgrade_chained_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    the_new_pod_survives_an_upgrade_and_a_downgrade(Mode::Chained, &old);
}

#[test]
fn an_upgrade_and_a_downgrade_delegate_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    the_new_pod_survives_an_upgrade_and_a_downgrade(Mode::Delegate, &old);
}
