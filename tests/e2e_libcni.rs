//! sandbox-guard under the real libcni, with the reference bridge/macvlan/host-local plugins
//! and the conflists the README ships (conf-examples/) or testdata/conflists/ holds, in
//! namespaces made for the test. Unit tests prove the guard's decisions; these prove a
//! runtime gets them: libcni passes the prevResult the guard records, caches what the guard
//! prints, and halts DEL when the guard refuses, so the primary never tears down the newer
//! sandbox. In delegate mode the guard runs the primary itself: libcni must get from it what
//! it got from the chain, and a stale DEL succeeds while the primary's DEL waits.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/libcni.rs"]
mod libcni;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use libcni::{
    IFNAME, Mode, NetnsArg, Network, Sandbox, Source, assert_network_empty,
    assert_result_matches_kernel, bare_ip, bridge_network, bridge_network_from, calico_v2_network,
    dual_stack_macvlan_network_from, host_veths, macvlan_network_from, macvlan_network_on_a_lan,
    mode_of, pod_has_link, result_ips, shape,
};
use serde_json::{Value, json};
use std::os::unix::fs::OpenOptionsExt;

fn add(net: &Network, sandbox: &Sandbox) -> Value {
    net.add(sandbox)
        .unwrap_or_else(|e| panic!("libcni ADD {} failed: {}", sandbox.container_id, e.stderr))
}

/// After ADD: what libcni returned is what it cached, what the kernel holds and what the guard
/// checkpointed as prevResult. The last equality is the pass-through proof: the prevResult the
/// guard recorded is the primary's result as libcni handed it over, and the cached result is
/// what the guard printed.
fn assert_attached(net: &Network, sandbox: &Sandbox, result: &Value) {
    assert_attached_in(net, Mode::Chained, sandbox, result)
}

fn assert_attached_in(net: &Network, mode: Mode, sandbox: &Sandbox, result: &Value) {
    let cached = net
        .cached_result(sandbox)
        .expect("libcni cached the ADD result");
    assert_eq!(
        result, &cached,
        "libcni's returned and cached results differ"
    );
    assert_result_matches_kernel(result, sandbox);
    net.check_with(net.conflist_of(mode), sandbox)
        .unwrap_or_else(|e| {
            panic!(
                "libcni CHECK {} ({mode:?}) failed: {}",
                sandbox.container_id, e.stderr
            )
        });

    let record = net
        .checkpoint(sandbox)
        .expect("the guard checkpointed the ADD");
    assert_eq!(
        record["prevResult"], cached,
        "checkpointed prevResult vs libcni's cache"
    );
    assert_eq!(record["ifName"], IFNAME);
    assert_eq!(record["netns"], json!(sandbox.netns_path()));
    assert_eq!(record["podNamespace"], json!(sandbox.namespace));
    assert_eq!(record["podName"], json!(sandbox.pod));
    assert_eq!(record["podUid"], json!(sandbox.uid));
    assert_eq!(record["setAside"], json!(false));
    assert_eq!(
        record["ips"],
        json!(result_ips(&cached)),
        "checkpointed IPs vs libcni's cache"
    );
    let pod_mac = |interfaces: &Value| {
        interfaces
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|i| i["sandbox"] == json!(sandbox.netns_path()))
            })
            .map(|i| i["mac"].clone())
    };
    let mac = pod_mac(&cached["interfaces"]).expect("the result names the pod's interface");
    assert_eq!(
        pod_mac(&record["interfaces"]),
        Some(mac),
        "checkpointed pod MAC vs libcni's cache"
    );
    assert!(
        net.record_file(sandbox).is_file(),
        "record file at the contract's path"
    );
    for ip in result_ips(result) {
        assert_eq!(
            net.ip_holder(bare_ip(&ip)),
            Some(sandbox.container_id.clone()),
            "{ip} reserved"
        );
    }
}

/// The guarded chain carries exactly what the primary alone returns through libcni: same
/// structure and the same network-wide values; only per-attachment values may differ.
fn assert_same_as_primary_alone(net: &Network, guarded: &Value) {
    let probe = Sandbox::new("default", "probe", "uid-probe");
    let bare = net
        .add_with(&net.primary_only_conflist, &probe)
        .unwrap_or_else(|e| panic!("primary alone ADD failed: {}", e.stderr));
    assert_eq!(
        shape(guarded),
        shape(&bare),
        "guarded {guarded}\nprimary alone {bare}"
    );
    for key in ["cniVersion", "routes", "dns"] {
        assert_eq!(guarded.get(key), bare.get(key), "{key}");
    }
    let gateways = |r: &Value| {
        r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["gateway"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(gateways(guarded), gateways(&bare));
    let host_side = |r: &Value| {
        r["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| {
                i.get("sandbox").is_none() && !i["name"].as_str().unwrap().starts_with("veth")
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        host_side(guarded),
        host_side(&bare),
        "shared host interfaces (the bridge)"
    );
    assert!(
        net.checkpoint(&probe).is_none(),
        "a chain without the guard left a checkpoint"
    );
    net.del_with(&net.primary_only_conflist, &probe, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("primary alone DEL failed: {}", e.stderr));
}

/// DEL through libcni removes everything, and the retries runtimes send succeed: kubelet's
/// repeated StopPodSandbox (netns given) and containerd's RemovePodSandbox (no netns).
fn assert_del_leaves_nothing(net: &Network, sandbox: &Sandbox, result: &Value) {
    assert_del_leaves_nothing_in(net, Mode::Chained, sandbox, result)
}

fn assert_del_leaves_nothing_in(net: &Network, mode: Mode, sandbox: &Sandbox, result: &Value) {
    let conflist = net.conflist_of(mode);
    net.del_with(conflist, sandbox, NetnsArg::Sandbox)
        .unwrap_or_else(|e| {
            panic!(
                "libcni DEL {} ({mode:?}) failed: {}",
                sandbox.container_id, e.stderr
            )
        });
    assert!(
        net.checkpoint(sandbox).is_none(),
        "checkpoint left after DEL"
    );
    assert!(
        !net.record_file(sandbox).exists(),
        "record file left after DEL"
    );
    assert!(
        net.cached_result(sandbox).is_none(),
        "libcni cache left after DEL"
    );
    assert!(
        !pod_has_link(sandbox, IFNAME),
        "the primary's DEL did not run"
    );
    for veth in host_veths(result) {
        assert!(
            !sys::try_run("ip", &["link", "show", &veth]),
            "host veth {veth} left after DEL"
        );
    }
    for ip in result_ips(result) {
        assert_eq!(net.ip_holder(bare_ip(&ip)), None, "{ip} still reserved");
    }
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        net.del_with(conflist, sandbox, netns).unwrap_or_else(|e| {
            panic!(
                "repeated DEL {} ({mode:?}) failed: {}",
                sandbox.container_id, e.stderr
            )
        });
    }
    assert!(
        net.checkpoint(sandbox).is_none(),
        "a repeated DEL re-created a checkpoint"
    );
}

fn first_ip(result: &Value) -> String {
    bare_ip(&result_ips(result)[0]).to_string()
}

/// Two pods of `net` through libcni from ADD to DEL: what each ADD left, the chain against its
/// primary alone, and traffic between the pods (carried `how`) and to the gateway.
fn two_pods_through_the_chain(net: &Network, names: [&str; 2], how: &str, gateway: &str) {
    let pods = names.map(|name| Sandbox::new("default", name, &format!("uid-{name}")));
    let results: Vec<Value> = pods.iter().map(|pod| add(net, pod)).collect();
    for (pod, result) in pods.iter().zip(&results) {
        assert_attached(net, pod, result);
    }
    assert_same_as_primary_alone(net, &results[0]);

    let [first, second] = names;
    assert!(
        pods[0].can_ping(&first_ip(&results[1])),
        "{first} -> {second} {how}"
    );
    assert!(
        pods[1].can_ping(&first_ip(&results[0])),
        "{second} -> {first} {how}"
    );
    assert!(
        pods[0].can_ping(&net.subnet.host(1)),
        "{first} -> {gateway}"
    );

    for (pod, result) in pods.iter().zip(&results) {
        assert_del_leaves_nothing(net, pod, result);
    }
}

#[test]
fn bridge_chain_add_check_del_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network();
    two_pods_through_the_chain(&net, ["web-0", "web-1"], "over the bridge", "its gateway");
}

#[test]
fn macvlan_chain_add_check_del_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net) = macvlan_network_on_a_lan();
    two_pods_through_the_chain(
        &net,
        ["db-0", "db-1"],
        "(macvlan bridge mode)",
        "the LAN router behind the master",
    );
}

/// The incident: kubelet re-creates pod lijiaob/etcd1-0 (sandbox B) and then retries the DEL
/// of the old sandbox A. Without the guard that DEL reaches bridge/host-local with the pod's
/// identity and tears down what the live pod depends on; with it libcni stops at the guard.
#[test]
fn stale_del_is_refused_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network();
    let old = Sandbox::new("lijiaob", "etcd1-0", "uid1");
    let new = Sandbox::new("lijiaob", "etcd1-0", "uid2");
    let old_result = add(&net, &old);
    assert_attached(&net, &old, &old_result);
    let new_result = add(&net, &new);
    assert_attached(&net, &new, &new_result);
    assert_eq!(
        net.checkpoint(&old).expect("A's record")["owner"],
        json!(false)
    );
    assert_eq!(
        net.checkpoint(&new).expect("B's record")["owner"],
        json!(true)
    );

    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        let refused = net
            .del(&old, netns)
            .expect_err("the stale DEL of A must be refused");
        assert_eq!(refused.code, Some(11), "{}", refused.stderr);
        assert!(refused.stderr.contains("stale DEL"), "{}", refused.stderr);
        assert!(
            refused.stderr.contains(&new.container_id),
            "names the owner: {}",
            refused.stderr
        );
    }
    // libcni halted at the guard: bridge and host-local never saw A's DEL, and libcni kept
    // A's cache so the DEL can be retried once the pod is really gone.
    assert!(
        net.cached_result(&old).is_some(),
        "libcni dropped A's cache after a failed DEL"
    );
    assert!(pod_has_link(&old, IFNAME));

    assert_result_matches_kernel(&new_result, &new);
    let new_ip = first_ip(&new_result);
    assert_eq!(
        net.ip_holder(&new_ip),
        Some(new.container_id.clone()),
        "B's IP still allocated"
    );
    net.check(&new)
        .unwrap_or_else(|e| panic!("CHECK of B after the refused DEL: {}", e.stderr));
    assert!(
        (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "2", &new_ip])),
        "node -> B ({new_ip}) after the refused DEL"
    );

    assert_del_leaves_nothing(&net, &new, &new_result);
    assert_del_leaves_nothing(&net, &old, &old_result);
}

// ---------------------------------------------------------------------------------------
// Delegate mode: the guard in the primary's place, running it

/// Each delegate conflist of testdata/conflists/delegate/ is its chained twin converted as
/// an operator converts one: the primary's entry moved whole under the guard's `delegate`,
/// the guard in its place, the plugins between them kept in order after it.
#[test]
fn delegate_conflists_are_their_chained_twins_converted() {
    let files = testdata::fixtures_in("conflists/delegate");
    assert!(files.len() >= 2, "{files:?}");
    for file in files {
        let name = file.strip_prefix("conflists/delegate/").unwrap();
        let delegate = testdata::fixture_json(&file);
        let chained = testdata::fixture_json(&format!("conflists/{name}"));
        assert_eq!(mode_of(&delegate, &file), Mode::Delegate);
        assert_eq!(mode_of(&chained, name), Mode::Chained);
        for key in ["name", "cniVersion"] {
            assert_eq!(delegate[key], chained[key], "{file}: {key}");
        }
        let [wrapped, chain] =
            [&delegate, &chained].map(|conf| conf["plugins"].as_array().unwrap().clone());
        let (guard, chained_guard) = (&wrapped[0], chain.last().unwrap());
        assert_eq!(
            guard["delegate"], chain[0],
            "{file}: the primary's entry, unchanged"
        );
        assert_eq!(
            wrapped[1..],
            chain[1..chain.len() - 1],
            "{file}: the plugins after the primary, in order"
        );
        for key in ["stateDir", "logFile"] {
            assert_eq!(guard[key], chained_guard[key], "{file}: {key}");
        }
    }
}

/// A result with what two ADDs of the same sandbox cannot share blanked: the host end of a
/// veth pair (a random name and MAC) and the bridge's MAC, which follows its ports'.
fn without_host_randomness(result: &Value) -> Value {
    let mut result = result.clone();
    for iface in result["interfaces"].as_array_mut().unwrap() {
        if iface.get("sandbox").is_some() {
            continue;
        }
        if iface["name"].as_str().unwrap().starts_with("veth") {
            iface["name"] = json!("<host veth>");
        }
        iface["mac"] = json!("<host mac>");
    }
    result
}

/// One sandbox attached through the chained conflist and taken down, then attached through
/// the delegate conflist and taken down: libcni gets the same result either way (every
/// range holds one address and the sandbox asks for its MAC, so only the host's random
/// names differ), CHECK passes, and each DEL leaves nothing. `pinned`: the addresses every
/// ADD must get.
fn delegate_mode_matches_chained_mode(net: &Network, sandbox: &Sandbox, pinned: &[String]) {
    let results = [Mode::Chained, Mode::Delegate].map(|mode| {
        let result = net
            .add_with(net.conflist_of(mode), sandbox)
            .unwrap_or_else(|e| panic!("libcni ADD ({mode:?}) failed: {}", e.stderr));
        assert_attached_in(net, mode, sandbox, &result);
        assert_eq!(
            pod_mac(&result, sandbox),
            sandbox.mac,
            "{mode:?}: the MAC asked for"
        );
        assert_eq!(
            result_ips(&result),
            pinned,
            "{mode:?}: the one address of each range"
        );
        assert_del_leaves_nothing_in(net, mode, sandbox, &result);
        assert_network_empty(net);
        result
    });
    let [chained, delegated] = &results;
    assert_eq!(
        shape(chained),
        shape(delegated),
        "chained {chained}\ndelegate {delegated}"
    );
    assert_eq!(
        without_host_randomness(chained),
        without_host_randomness(delegated),
        "chained {chained}\ndelegate {delegated}"
    );
}

fn pod_mac(result: &Value, sandbox: &Sandbox) -> Option<String> {
    let interfaces = result["interfaces"].as_array()?;
    let pod = interfaces
        .iter()
        .find(|i| i["sandbox"] == json!(sandbox.netns_path()))?;
    pod["mac"].as_str().map(str::to_string)
}

#[test]
fn bridge_delegate_mode_gives_libcni_what_the_chain_gives() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network_from(Source::Testdata { pin: Some(10) });
    let sandbox = Sandbox::new("default", "web-0", "uid-web-0").with_mac("0a:58:0a:00:00:0a");
    let pinned = [
        format!("{}/24", net.subnet.host(10)),
        format!("{}/64", net.subnet.host6(10)),
    ];
    delegate_mode_matches_chained_mode(&net, &sandbox, &pinned);
}

#[test]
fn macvlan_delegate_mode_gives_libcni_what_the_chain_gives() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net) = macvlan_network_from(Source::Testdata { pin: Some(150) });
    let sandbox = Sandbox::new("default", "db-0", "uid-db-0").with_mac("0a:58:0a:00:00:96");
    delegate_mode_matches_chained_mode(&net, &sandbox, &[format!("{}/24", net.subnet.host(150))]);
}

/// Two pods through the delegate conflists from ADD to DEL, with traffic between them: the
/// wrapped primary really plumbs the pods (both modes' results could match and be wrong).
#[test]
fn bridge_and_macvlan_pods_talk_in_delegate_mode() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network_from(Source::Testdata { pin: None });
    delegate_pods_through_the_chain(&net, ["web-0", "web-1"], "over the bridge");
    let (_lan, net) = macvlan_network_from(Source::Testdata { pin: None });
    delegate_pods_through_the_chain(&net, ["db-0", "db-1"], "(macvlan bridge mode)");
}

fn delegate_pods_through_the_chain(net: &Network, names: [&str; 2], how: &str) {
    let pods = names.map(|name| Sandbox::new("default", name, &format!("uid-{name}")));
    let results: Vec<Value> = pods
        .iter()
        .map(|pod| add_in(net, Mode::Delegate, pod))
        .collect();
    for (pod, result) in pods.iter().zip(&results) {
        assert_attached_in(net, Mode::Delegate, pod, result);
    }
    let [first, second] = names;
    assert!(
        pods[0].can_ping(&first_ip(&results[1])),
        "{first} -> {second} {how}"
    );
    assert!(
        pods[1].can_ping(&first_ip(&results[0])),
        "{second} -> {first} {how}"
    );
    assert!(
        pods[0].can_ping(&net.subnet.host(1)),
        "{first} -> the gateway"
    );
    for (pod, result) in pods.iter().zip(&results) {
        assert_del_leaves_nothing_in(net, Mode::Delegate, pod, result);
    }
    assert_network_empty(net);
}

fn add_in(net: &Network, mode: Mode, sandbox: &Sandbox) -> Value {
    net.add_with(net.conflist_of(mode), sandbox)
        .unwrap_or_else(|e| {
            panic!(
                "libcni ADD {} ({mode:?}) failed: {}",
                sandbox.container_id, e.stderr
            )
        })
}

/// The dump's deferred DELs of a sandbox.
fn deferred_of(net: &Network, sandbox: &Sandbox) -> Vec<Value> {
    let all = cni::dump_checkpoints(&net.state_dir, &[]);
    all.into_iter()
        .filter(|e| e["status"] == "deferred" && e["containerId"] == json!(sandbox.container_id))
        .collect()
}

fn logged(net: &Network, sandbox: &Sandbox, outcome: cni::Outcome) -> usize {
    net.log_lines()
        .iter()
        .filter(|l| l.container == sandbox.container_id && l.outcome == outcome)
        .count()
}

/// The bridge network of testdata, and two sandboxes of lijiaob/etcd1-0, old and new.
fn bridge_incident() -> (Network, Sandbox, Sandbox) {
    (
        bridge_network_from(Source::Testdata { pin: None }),
        Sandbox::new("lijiaob", "etcd1-0", "uid1"),
        Sandbox::new("lijiaob", "etcd1-0", "uid2"),
    )
}

/// The incident of `stale_del_is_refused_through_libcni` in delegate mode: kubelet re-creates
/// lijiaob/etcd1-0 (B), a late ADD of the old sandbox A comes back, then A is stopped and
/// removed. The late ADD is refused before bridge sees it; A's DELs succeed for libcni on the
/// first call, A's netns loses its interface at once, but bridge and host-local see A's DEL
/// only once B is gone, and then nothing is left.
#[test]
fn stale_del_is_deferred_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (net, old, new) = bridge_incident();
    let delegate = net.conflist_of(Mode::Delegate);
    let old_result = add_in(&net, Mode::Delegate, &old);
    assert_attached_in(&net, Mode::Delegate, &old, &old_result);
    let new_result = add_in(&net, Mode::Delegate, &new);
    assert_attached_in(&net, Mode::Delegate, &new, &new_result);
    let (old_ip, new_ip) = (first_ip(&old_result), first_ip(&new_result));

    let allocated = net.ipam_allocations();
    let late = net
        .add_with(delegate, &old)
        .expect_err("the late ADD of the superseded sandbox must be refused");
    assert_eq!(late.code, Some(104), "{}", late.stderr);
    assert!(
        late.stderr.contains("superseded") && late.stderr.contains(&new.container_id),
        "{}",
        late.stderr
    );
    assert_eq!(
        net.ipam_allocations(),
        allocated,
        "host-local ran for the refused ADD"
    );
    assert_eq!(
        net.checkpoint(&new).expect("B's record")["owner"],
        json!(true),
        "the late ADD took the pod back"
    );

    // StopPodSandbox, then RemovePodSandbox: each succeeds on its first call.
    net.del_with(delegate, &old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| {
            panic!(
                "the stale DEL of A must succeed in delegate mode: {}",
                e.stderr
            )
        });
    assert!(
        net.cached_result(&old).is_none(),
        "libcni kept A's cache after its DEL succeeded"
    );
    assert!(
        !pod_has_link(&old, IFNAME),
        "A's netns still holds the interface the guard checkpointed"
    );
    for veth in host_veths(&old_result) {
        assert!(
            !sys::try_run("ip", &["link", "show", &veth]),
            "A's host veth {veth} outlived its pod end"
        );
    }
    assert_eq!(
        net.ip_holder(&old_ip),
        Some(old.container_id.clone()),
        "bridge/host-local saw A's DEL while B lives"
    );
    assert_eq!(
        deferred_of(&net, &old).len(),
        1,
        "A's DEL is recorded as deferred"
    );
    assert_eq!(
        logged(&net, &old, cni::Outcome::Deferred),
        1,
        "{:?}",
        net.log_lines()
    );
    net.del_with(delegate, &old, NetnsArg::Empty)
        .unwrap_or_else(|e| panic!("RemovePodSandbox's DEL of A must succeed: {}", e.stderr));
    assert_eq!(
        deferred_of(&net, &old).len(),
        1,
        "a repeated stale DEL is still one deferred DEL"
    );
    assert_eq!(
        net.ip_holder(&old_ip),
        Some(old.container_id.clone()),
        "A's address went while B lives"
    );

    // B never noticed.
    assert_result_matches_kernel(&new_result, &new);
    assert_eq!(
        net.ip_holder(&new_ip),
        Some(new.container_id.clone()),
        "B's IP still allocated"
    );
    net.check_with(delegate, &new)
        .unwrap_or_else(|e| panic!("CHECK of B after A's DEL: {}", e.stderr));
    assert!(
        (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "2", &new_ip])),
        "node -> B ({new_ip})"
    );

    // B goes: its DEL frees the pod key and A's deferred DEL reaches bridge and host-local.
    assert_del_leaves_nothing_in(&net, Mode::Delegate, &new, &new_result);
    net.wait_for_replays();
    assert_eq!(
        net.ip_holder(&old_ip),
        None,
        "A's deferred DEL never reached host-local"
    );
    assert!(
        deferred_of(&net, &old).is_empty(),
        "A's DEL is still deferred after its replay"
    );
    assert_eq!(
        logged(&net, &old, cni::Outcome::Replayed),
        1,
        "{:?}",
        net.log_lines()
    );
    assert_network_empty(&net);
}

/// Delegate mode's local teardown of a stale sandbox whose result is dual-stack (macvlan,
/// host-local with a v4 and a v6 range): the stale DEL takes A's interface, and with it both
/// its addresses, out of A's netns, while B keeps both families; the primary sees A's DEL
/// only once B is gone.
#[test]
fn a_stale_dual_stack_sandbox_loses_both_families_in_delegate_mode() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net) = dual_stack_macvlan_network_from(Source::Testdata { pin: None });
    let delegate = net.conflist_of(Mode::Delegate);
    let old = Sandbox::new("db", "pg-0", "uid1");
    let new = Sandbox::new("db", "pg-0", "uid2");
    let old_result = add_in(&net, Mode::Delegate, &old);
    let new_result = add_in(&net, Mode::Delegate, &new);
    assert_eq!(
        result_ips(&old_result).len(),
        2,
        "a v4 and a v6 address: {old_result}"
    );
    let old_ips = result_ips(&old_result);

    net.del_with(delegate, &old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| {
            panic!(
                "the stale DEL of A must succeed in delegate mode: {}",
                e.stderr
            )
        });
    assert!(
        !pod_has_link(&old, IFNAME),
        "A's netns still holds the interface the guard checkpointed"
    );
    let left: Value = serde_json::from_slice(
        &old.netns
            .exec(&["ip", "-j", "addr", "show", "scope", "global"])
            .stdout,
    )
    .unwrap();
    let left: Vec<&Value> = left
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().unwrap())
        .collect();
    assert!(left.is_empty(), "A's netns still answers for {left:?}");
    assert_eq!(
        deferred_of(&net, &old).len(),
        1,
        "A's DEL is recorded as deferred"
    );
    for ip in &old_ips {
        assert_eq!(
            net.ip_holder(bare_ip(ip)),
            Some(old.container_id.clone()),
            "host-local saw A's DEL while B lives ({ip})"
        );
    }

    assert_result_matches_kernel(&new_result, &new);
    assert!(
        new.can_ping(&net.subnet.host(1)) && new.can_ping(&net.subnet.host6(1)),
        "B -> router over both families"
    );
    net.del_with(delegate, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL of B failed: {}", e.stderr));
    for ip in &old_ips {
        assert_eq!(
            net.ip_holder(bare_ip(ip)),
            None,
            "A's deferred DEL never reached host-local ({ip})"
        );
    }
    assert_network_empty(&net);
}

// ---------------------------------------------------------------------------------------
// Every CNI version

/// The reference plugins this machine's package ships (containernetworking-plugins 1.1)
/// speak 0.1.0 to 1.0.0; 1.1.0 results come through the guard's own tests (cni_protocol,
/// results) and the model primaries.
const REFERENCE_PLUGIN_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The pod interface's MAC as the kernel has it.
fn kernel_mac(sandbox: &Sandbox) -> String {
    let out = sandbox
        .netns
        .exec(&["cat", &format!("/sys/class/net/{IFNAME}/address")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The pod's addresses from a result of any version: `ips`, or 0.1.0/0.2.0's `ip4`/`ip6`.
fn any_version_ips(result: &Value) -> Vec<String> {
    let legacy = ["ip4", "ip6"]
        .iter()
        .filter_map(|key| result[key]["ip"].as_str().map(str::to_string));
    result_ips(result).into_iter().chain(legacy).collect()
}

/// ADD of two sandboxes of one pod at `version`, the old one's late DEL, then both DELs, in
/// `mode`: the results are in the network's version (legacy ones without interfaces), the
/// checkpoint has the pod interface's MAC and link facts from the netns, the stale DEL
/// leaves the new pod its network, and nothing is left behind.
fn incident_at_version(net: &Network, mode: Mode, version: &str) {
    let conflist = net.conflist_of(mode);
    let old = Sandbox::new("lijiaob", "etcd1-0", "uid1");
    let new = Sandbox::new("lijiaob", "etcd1-0", "uid2");
    let mut results = Vec::new();
    for sandbox in [&old, &new] {
        let result = net
            .add_with(conflist, sandbox)
            .unwrap_or_else(|e| panic!("{version} {mode:?}: libcni ADD failed: {}", e.stderr));
        assert_eq!(
            result["cniVersion"], version,
            "{mode:?}: the result is in the network's version: {result}"
        );
        let legacy = version == "0.1.0" || version == "0.2.0";
        assert_eq!(
            result.get("interfaces").is_none(),
            legacy,
            "{version} {mode:?}: {result}"
        );
        assert_eq!(
            result.get("ip4").is_some(),
            legacy,
            "{version} {mode:?}: {result}"
        );
        let record = net
            .checkpoint(sandbox)
            .unwrap_or_else(|| panic!("{version} {mode:?}: no checkpoint"));
        assert_eq!(record["cniVersion"], version);
        assert_eq!(
            record["prevResult"],
            net.cached_result(sandbox).expect("libcni's cache"),
            "{version} {mode:?}"
        );
        let mut ips = any_version_ips(&result);
        ips.sort();
        assert_eq!(
            record["ips"],
            json!(ips),
            "{version} {mode:?}: checkpointed addresses"
        );
        // Found by CNI_IFNAME in the netns, whatever the result says of interfaces.
        assert_eq!(
            record["links"]["state"], "observed",
            "{version} {mode:?}: {record}"
        );
        assert_eq!(
            record["links"]["mac"],
            json!(kernel_mac(sandbox)),
            "{version} {mode:?}: {record}"
        );
        if version >= "0.4.0" {
            net.check_with(conflist, sandbox)
                .unwrap_or_else(|e| panic!("{version} {mode:?}: CHECK failed: {}", e.stderr));
        }
        results.push(result);
    }
    let new_ips = any_version_ips(&results[1]);
    match mode {
        Mode::Chained => {
            let refused = net
                .del_with(conflist, &old, NetnsArg::Sandbox)
                .expect_err("the stale DEL of A must be refused");
            assert_eq!(refused.code, Some(11), "{version}: {}", refused.stderr);
        }
        Mode::Delegate => {
            net.del_with(conflist, &old, NetnsArg::Sandbox)
                .unwrap_or_else(|e| {
                    panic!(
                        "{version}: delegate mode defers the stale DEL: {}",
                        e.stderr
                    )
                });
            // The local teardown knows A's interface by the MAC read at ADD, legacy result or not.
            assert!(
                !pod_has_link(&old, IFNAME),
                "{version}: the deferred DEL left A's interface in its netns"
            );
        }
    }
    assert!(
        pod_has_link(&new, IFNAME),
        "{version} {mode:?}: the new sandbox lost its interface"
    );
    for ip in &new_ips {
        assert_eq!(
            net.ip_holder(bare_ip(ip)),
            Some(new.container_id.clone()),
            "{version} {mode:?}: B's {ip}"
        );
    }
    assert!(
        new.can_ping(&net.subnet.host(1)),
        "{version} {mode:?}: B reaches its gateway after the stale DEL"
    );

    for sandbox in [&new, &old] {
        for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
            net.del_with(conflist, sandbox, netns).unwrap_or_else(|e| {
                panic!(
                    "{version} {mode:?}: DEL {} failed: {}",
                    sandbox.container_id, e.stderr
                )
            });
        }
    }
    for (sandbox, result) in [&old, &new].into_iter().zip(&results) {
        assert!(
            !pod_has_link(sandbox, IFNAME),
            "{version} {mode:?}: the primary's DEL did not run"
        );
        for ip in any_version_ips(result) {
            assert_eq!(
                net.ip_holder(bare_ip(&ip)),
                None,
                "{version} {mode:?}: {ip} still reserved"
            );
        }
    }
    assert_network_empty(net);
}

/// libcni 1.3 (containerd 2.1+, CRI-O 1.33+) at the legacy versions, as 1.1 above.
#[test]
fn legacy_versions_through_libcni_1_3_in_both_modes() {
    sys::skip_unless_root!(libcni::TOOLS);
    for version in ["0.1.0", "0.2.0"] {
        let net = bridge_network_from(Source::Testdata { pin: None })
            .at_version(version)
            .through(libcni::driver_1_3());
        for mode in [Mode::Chained, Mode::Delegate] {
            incident_at_version(&net, mode, version);
        }
    }
}

#[test]
fn every_cni_version_of_the_reference_plugins_through_libcni_in_both_modes() {
    sys::skip_unless_root!(libcni::TOOLS);
    for version in REFERENCE_PLUGIN_VERSIONS {
        let net = bridge_network_from(Source::Testdata { pin: None }).at_version(version);
        for mode in [Mode::Chained, Mode::Delegate] {
            incident_at_version(&net, mode, version);
        }
    }
}

// ---------------------------------------------------------------------------------------
// calico v2 (tests/cri/calico-v2-model-plugin): cniVersion 0.1.0, everything keyed by pod name

/// The addresses the calico v2 model holds, with the handle holding each.
fn calico_addresses(net: &Network) -> Vec<(String, String)> {
    let mut held: Vec<(String, String)> = cni::files_in(&net.ipam_dir.join("ips"))
        .iter()
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(path).unwrap(),
            )
        })
        .collect();
    held.sort();
    held
}

/// The container the pod's workload endpoint belongs to, if it has one.
fn calico_endpoint_owner(net: &Network, sandbox: &Sandbox) -> Option<String> {
    let file = net
        .ipam_dir
        .join("endpoints")
        .join(format!("{}.{}", sandbox.namespace, sandbox.pod));
    let text = std::fs::read_to_string(file).ok()?;
    text.split_whitespace().next().map(str::to_string)
}

/// The seed incident against calico v2 at `version`, through libcni, in `mode`: ADD A, ADD B
/// of the same pod name, A's late DEL (StopPodSandbox's, then RemovePodSandbox's without a
/// netns). B keeps its endpoint, its address and its link; then both DELs leave nothing.
fn calico_v2_incident(net: &Network, mode: Mode, version: &str) {
    let conflist = net.conflist_of(mode);
    let old = Sandbox::new("lijiaob", "etcd1-0", "uid1");
    let new = Sandbox::new("lijiaob", "etcd1-0", "uid2");
    for sandbox in [&old, &new] {
        let result = net
            .add_with(conflist, sandbox)
            .unwrap_or_else(|e| panic!("{version} {mode:?}: ADD failed: {}", e.stderr));
        assert_eq!(result["cniVersion"], version, "{mode:?}: {result}");
        assert!(
            result["ip4"]["ip"].is_string() && result.get("interfaces").is_none(),
            "{version} {mode:?}: a 0.2.0-shaped result: {result}"
        );
        let record = net
            .checkpoint(sandbox)
            .unwrap_or_else(|| panic!("{version} {mode:?}: no checkpoint"));
        assert_eq!(
            record["ips"],
            json!([result["ip4"]["ip"]]),
            "{version} {mode:?}"
        );
        assert_eq!(
            record["links"]["mac"],
            json!(kernel_mac(sandbox)),
            "{version} {mode:?}: the MAC read from the netns: {record}"
        );
    }
    assert_eq!(
        calico_endpoint_owner(net, &new),
        Some(new.container_id.clone())
    );
    let before = calico_addresses(net);
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        let outcome = net.del_with(conflist, &old, netns);
        match mode {
            Mode::Chained => assert_eq!(
                outcome.expect_err("the stale DEL must be refused").code,
                Some(11),
                "{version}"
            ),
            Mode::Delegate => outcome.unwrap_or_else(|e| {
                panic!(
                    "{version}: delegate mode defers the stale DEL: {}",
                    e.stderr
                )
            }),
        }
    }
    assert_eq!(
        calico_addresses(net),
        before,
        "{version} {mode:?}: calico released an address for the stale DEL"
    );
    assert_eq!(
        calico_endpoint_owner(net, &new),
        Some(new.container_id.clone()),
        "{version} {mode:?}: B's workload endpoint"
    );
    assert!(
        pod_has_link(&new, IFNAME),
        "{version} {mode:?}: B lost its interface"
    );
    assert!(
        new.can_ping("169.254.1.1"),
        "{version} {mode:?}: B reaches its gateway after the stale DEL"
    );

    for sandbox in [&new, &old] {
        for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
            net.del_with(conflist, sandbox, netns).unwrap_or_else(|e| {
                panic!(
                    "{version} {mode:?}: DEL {} failed: {}",
                    sandbox.container_id, e.stderr
                )
            });
        }
    }
    assert_eq!(
        calico_addresses(net),
        Vec::new(),
        "{version} {mode:?}: addresses left"
    );
    assert_eq!(
        calico_endpoint_owner(net, &new),
        None,
        "{version} {mode:?}: endpoint left"
    );
    assert!(
        !pod_has_link(&new, IFNAME) && !pod_has_link(&old, IFNAME),
        "{version} {mode:?}: a pod interface is left"
    );
    assert_eq!(
        net.cached_results(),
        Vec::<String>::new(),
        "{version} {mode:?}: libcni cache entries left"
    );
    assert_eq!(
        net.guard_files(),
        Vec::<std::path::PathBuf>::new(),
        "{version} {mode:?}: guard records or owners left"
    );
}

#[test]
fn calico_v2_keeps_the_new_pod_through_libcni_at_0_1_0_and_0_2_0_in_both_modes() {
    sys::skip_unless_root!(libcni::TOOLS);
    for version in ["0.1.0", "0.2.0"] {
        let net = calico_v2_network().at_version(version);
        for mode in [Mode::Chained, Mode::Delegate] {
            calico_v2_incident(&net, mode, version);
        }
    }
}

/// The model does what the guard exists to stop: unguarded, A's late DEL takes B's endpoint,
/// address and route (so the test above can fail).
#[test]
fn calico_v2_model_unguarded_loses_the_new_pod() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = calico_v2_network();
    let old = Sandbox::new("lijiaob", "etcd1-0", "uid1");
    let new = Sandbox::new("lijiaob", "etcd1-0", "uid2");
    let unguarded = net.primary_only_conflist.clone();
    let mut new_ip = String::new();
    for sandbox in [&old, &new] {
        let result = net
            .add_with(&unguarded, sandbox)
            .unwrap_or_else(|e| panic!("ADD failed: {}", e.stderr));
        assert_eq!(result["cniVersion"], "0.1.0", "{result}");
        new_ip = result["ip4"]["ip"].as_str().unwrap_or_default().to_string();
    }
    let route_to_new = || {
        let out = sys::run("ip", &["route", "show", "exact", &new_ip]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(!route_to_new().is_empty(), "B has no route to {new_ip}");
    net.del_with(&unguarded, &old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL failed: {}", e.stderr));
    assert_eq!(
        calico_addresses(&net),
        Vec::new(),
        "the stale DEL released B's address"
    );
    assert_eq!(
        calico_endpoint_owner(&net, &new),
        None,
        "the stale DEL removed B's endpoint"
    );
    assert_eq!(route_to_new(), "", "the stale DEL removed B's route");
    net.del_with(&unguarded, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("DEL of B failed: {}", e.stderr));
}

/// A deferred DEL whose primary hangs, through libcni in delegate mode, the primary the model
/// of a pod-name-keyed one (tests/cri/calico-cni-v1-model-plugin, its `hung-dels` marker: a DEL
/// that blocks on a dead datastore, holding none of the model's locks): the replay hangs in the worker, and unrelated pods' ADD
/// and CHECK through libcni succeed meanwhile without running it or cutting it short. Once
/// the primary answers again the hung DEL still reaches it.
#[test]
fn a_hung_replay_holds_up_no_other_pods_verb_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = libcni::podname_keyed_network();
    let conflist = net.conflist_of(Mode::Delegate).to_path_buf();
    let model = net.ipam_dir.join("model");
    let pod = sys::unique("etcd");
    let (old, new) = (
        Sandbox::new("lijiaob", &pod, "uid1"),
        Sandbox::new("lijiaob", &pod, "uid2"),
    );
    add_in(&net, Mode::Delegate, &old);
    add_in(&net, Mode::Delegate, &new);
    net.del_with(&conflist, &old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("A's stale DEL is deferred: {}", e.stderr));
    // B's own DEL frees the pod while the test holds replays off (as `--downgrade` does), so
    // the replay of A starts only once the primary hangs.
    let replay_lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(net.state_dir.join("replay.lock"))
        .unwrap();
    replay_lock.lock().unwrap();
    net.del_with(&conflist, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("B's own DEL: {}", e.stderr));
    std::fs::write(model.join("hung-dels"), "300").unwrap();
    replay_lock.unlock().unwrap();
    assert_eq!(deferred_of(&net, &old).len(), 1, "A's DEL is not deferred");
    let attempts = || {
        deferred_of(&net, &old)[0]["attempts"]
            .as_u64()
            .unwrap_or_default()
    };
    let replays_of_a = || {
        std::fs::read_to_string(model.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|line| line.ends_with(&format!(" HUNG-DEL {}", old.container_id)))
            .count()
    };
    let before = attempts();
    let store = cni::Store::with_state_dir(net.state_dir.clone(), &net.state_dir);
    let unrelated: Vec<Sandbox> = (0..3)
        .map(|n| Sandbox::new("lijiaob", &sys::unique(&format!("web{n}")), "uid3"))
        .collect();
    for (n, sandbox) in unrelated.iter().enumerate() {
        add_in(&net, Mode::Delegate, sandbox);
        if n == 0 {
            // The first ADD started the worker: its replay of A reaches the primary and hangs.
            for _ in 0..500 {
                if replays_of_a() > 0 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(replays_of_a(), 1, "the worker never ran A's replay");
        }
        net.check_with(&conflist, sandbox)
            .unwrap_or_else(|e| panic!("CHECK of unrelated pod {n}: {}", e.stderr));
        assert_eq!(
            attempts(),
            before,
            "unrelated pod {n}'s verbs cut the hung replay short"
        );
        assert_eq!(
            replays_of_a(),
            1,
            "unrelated pod {n}'s verbs ran A's replay again"
        );
    }
    assert!(
        !store.replay_workers().is_empty(),
        "the hung replay no longer runs"
    );
    // The primary answers again: a later verb's worker replays A (more verbs, as a busy node
    // gives them, in case the first came while the killed worker still held the sweep).
    store.kill_replay_workers();
    std::fs::remove_file(model.join("hung-dels")).unwrap();
    for sandbox in &unrelated {
        net.del_with(&conflist, sandbox, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("DEL of an unrelated pod: {}", e.stderr));
    }
    for _ in 0..5 {
        net.wait_for_replays();
        if deferred_of(&net, &old).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let later = Sandbox::new("lijiaob", &sys::unique("later"), "uid4");
        add_in(&net, Mode::Delegate, &later);
        net.del_with(&conflist, &later, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("DEL of a later pod: {}", e.stderr));
    }
    assert!(
        deferred_of(&net, &old).is_empty(),
        "A's DEL never reached the primary once it answered: {:?}",
        deferred_of(&net, &old)
    );
}

/// The kernel gives a new namespace the lowest free inode number, a deleted netns's among them
/// once its cleanup has run, so a netns made again at a stale sandbox's path can have its old
/// device and inode. Through libcni in delegate mode (bridge and host-local): A is added,
/// superseded by B, its netns goes and one is made again at its path with its old inode,
/// holding an eth0 of its own; A's stale DEL then must leave that eth0 alone (the netns cookie
/// tells the two apart) and still be deferred and replayed.
#[test]
fn a_netns_made_again_at_a_stale_sandboxs_path_keeps_its_interface_through_libcni() {
    sys::skip_unless_root!(libcni::TOOLS);
    sys::skip_unless_tools!(&["unshare", "umount"]);
    use std::os::unix::fs::MetadataExt;
    let (net, old, new) = bridge_incident();
    let delegate = net.conflist_of(Mode::Delegate);
    let old_result = add_in(&net, Mode::Delegate, &old);
    let (old_ip, old_mac) = (first_ip(&old_result), pod_mac(&old_result, &old).unwrap());
    let new_ip = first_ip(&add_in(&net, Mode::Delegate, &new));
    // A's sandbox goes; a namespace with A's old inode is made again at its path.
    let (name, path) = (old.netns.name.clone(), old.netns_path());
    let inode = || std::fs::metadata(&path).map(|m| m.ino()).ok();
    let old_inode = inode().unwrap_or_else(|| panic!("A's netns has no file at {path}"));
    sys::run("ip", &["netns", "del", &name]);
    // A new namespace takes the lowest free number of the kernel's proc inode pool (a netns
    // then takes about 70 more for its /proc/net entries), and a deleted netns's numbers come
    // free only once the kernel's cleanup of it has run, which lags on a busy node. Holes
    // below A's number are filled with UTS namespaces, one number each, kept until the end;
    // once one gets A's number, it is dropped and A's path made again at once, taking it.
    let fillers = UtsFillers::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let (mut reused, mut holes, mut last, mut lost) = (false, 0, 0, Vec::new());
    while !reused && std::time::Instant::now() < deadline {
        let (filler, number) = fillers.make();
        last = number;
        if number < old_inode {
            holes += 1;
            continue;
        }
        fillers.drop_one(&filler);
        if number == old_inode {
            sys::run("ip", &["netns", "add", &name]);
            reused = inode() == Some(old_inode);
            if !reused {
                // Another process took the number between the release and this netns.
                lost.extend(inode());
                sys::run("ip", &["netns", "del", &name]);
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    drop(fillers);
    if !reused {
        let why = format!(
            "no namespace got A's netns inode {old_inode} again in 120 s: {holes} holes below it \
             filled, the last filler got {last}; {} times the number came free but the netns made \
             at once got another ({lost:?}), so another process took it",
            lost.len()
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIPPED: {why}");
        return;
    }
    // Its own eth0, with the MAC A's had: only the namespace itself tells them apart.
    let host_end = sys::HostLink {
        name: sys::unique("sgh"),
    };
    let veth = format!(
        "link add {} type veth peer name {IFNAME} netns {name}",
        host_end.name
    );
    sys::run("ip", &veth.split(' ').collect::<Vec<_>>());
    sys::run(
        "ip",
        &["-n", &name, "link", "set", IFNAME, "address", &old_mac],
    );
    net.del_with(delegate, &old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("A's stale DEL must succeed in delegate mode: {}", e.stderr));
    assert!(
        sys::try_run("ip", &["-n", &name, "link", "show", IFNAME]),
        "A's stale DEL deleted the eth0 of the namespace that now has A's path"
    );
    assert_eq!(deferred_of(&net, &old).len(), 1, "A's DEL is not deferred");
    assert_eq!(
        net.ip_holder(&old_ip),
        Some(old.container_id.clone()),
        "bridge/host-local saw A's DEL while B lives"
    );
    assert!(pod_has_link(&new, IFNAME), "B lost its link to A's DEL");
    assert_eq!(net.ip_holder(&new_ip), Some(new.container_id.clone()));
    // B goes: A's deferred DEL reaches bridge and host-local.
    drop(host_end);
    net.del_with(delegate, &new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("B's own DEL: {}", e.stderr));
    net.wait_for_replays();
    assert_eq!(
        net.ip_holder(&old_ip),
        None,
        "A's deferred DEL never reached host-local"
    );
    assert!(deferred_of(&net, &old).is_empty());
}

/// UTS namespaces kept on files in one dir, each holding one number of the kernel's proc inode
/// pool; all are released when dropped, also when a test panics.
struct UtsFillers {
    dir: std::path::PathBuf,
}

impl UtsFillers {
    fn new() -> UtsFillers {
        let dir = std::path::PathBuf::from(format!("/run/{}", sys::unique("sgfill")));
        std::fs::create_dir(&dir).unwrap();
        UtsFillers { dir }
    }

    /// A new UTS namespace mounted on a file, and its inode number.
    fn make(&self) -> (std::path::PathBuf, u64) {
        use std::os::unix::fs::MetadataExt;
        let file = self.dir.join(sys::unique("uts"));
        std::fs::File::create(&file).unwrap();
        let arg = format!("--uts={}", file.display());
        sys::run("unshare", &[&arg, "true"]);
        let number = std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("no UTS namespace on {}: {e}", file.display()))
            .ino();
        (file, number)
    }

    fn drop_one(&self, filler: &std::path::Path) {
        sys::try_run("umount", &[&filler.to_string_lossy()]);
        let _ = std::fs::remove_file(filler);
    }
}

impl Drop for UtsFillers {
    fn drop(&mut self) {
        // Every file in the dir: a failed unshare leaves one unmounted.
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            self.drop_one(&entry.path());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
