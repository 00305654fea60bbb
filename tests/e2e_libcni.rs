//! sandbox-guard under the real libcni, with the reference bridge/macvlan/host-local plugins
//! and the conflists the README ships (conf-examples/), in namespaces made for the test.
//! Unit tests prove the guard's decisions; these prove a runtime gets them: libcni passes
//! the prevResult the guard records, caches what the guard prints, and halts DEL when the
//! guard refuses, so the primary never tears down the newer sandbox.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/libcni.rs"]
mod libcni;

use libcni::{
    IFNAME, Network, NetnsArg, Sandbox, assert_result_matches_kernel, bare_ip, bridge_network, macvlan_network_on_a_lan,
    pod_has_link, result_ips, shape,
};
use serde_json::{Value, json};

fn add(net: &Network, sandbox: &Sandbox) -> Value {
    net.add(sandbox)
        .unwrap_or_else(|e| panic!("libcni ADD {} failed: {}", sandbox.container_id, e.stderr))
}

/// After ADD: what libcni returned is what it cached, what the kernel holds and what the guard
/// checkpointed as prevResult. The last equality is the pass-through proof: the prevResult the
/// guard recorded is the primary's result as libcni handed it over, and the cached result is
/// what the guard printed.
fn assert_attached(net: &Network, sandbox: &Sandbox, result: &Value) {
    let cached = net.cached_result(sandbox).expect("libcni cached the ADD result");
    assert_eq!(result, &cached, "libcni's returned and cached results differ");
    assert_result_matches_kernel(result, sandbox);
    net.check(sandbox)
        .unwrap_or_else(|e| panic!("libcni CHECK {} failed: {}", sandbox.container_id, e.stderr));

    let record = net.checkpoint(sandbox).expect("the guard checkpointed the ADD");
    assert_eq!(record["prevResult"], cached, "checkpointed prevResult vs libcni's cache");
    assert_eq!(record["ifName"], IFNAME);
    assert_eq!(record["netns"], json!(sandbox.netns_path()));
    assert_eq!(record["podNamespace"], json!(sandbox.namespace));
    assert_eq!(record["podName"], json!(sandbox.pod));
    assert_eq!(record["podUid"], json!(sandbox.uid));
    assert_eq!(record["setAside"], json!(false));
    assert_eq!(record["ips"], json!(result_ips(&cached)), "checkpointed IPs vs libcni's cache");
    let pod_mac = |interfaces: &Value| {
        interfaces
            .as_array()
            .and_then(|all| all.iter().find(|i| i["sandbox"] == json!(sandbox.netns_path())))
            .map(|i| i["mac"].clone())
    };
    let mac = pod_mac(&cached["interfaces"]).expect("the result names the pod's interface");
    assert_eq!(pod_mac(&record["interfaces"]), Some(mac), "checkpointed pod MAC vs libcni's cache");
    assert!(net.record_file(sandbox).is_file(), "record file at the contract's path");
    for ip in result_ips(result) {
        assert_eq!(net.ip_holder(bare_ip(&ip)), Some(sandbox.container_id.clone()), "{ip} reserved");
    }
}

/// The guarded chain carries exactly what the primary alone returns through libcni: same
/// structure and the same network-wide values; only per-attachment values may differ.
fn assert_same_as_primary_alone(net: &Network, guarded: &Value) {
    let probe = Sandbox::new("default", "probe", "uid-probe");
    let bare = net
        .add_with(&net.primary_only_conflist, &probe)
        .unwrap_or_else(|e| panic!("primary alone ADD failed: {}", e.stderr));
    assert_eq!(shape(guarded), shape(&bare), "guarded {guarded}\nprimary alone {bare}");
    for key in ["cniVersion", "routes", "dns"] {
        assert_eq!(guarded.get(key), bare.get(key), "{key}");
    }
    let gateways = |r: &Value| r["ips"].as_array().unwrap().iter().map(|ip| ip["gateway"].clone()).collect::<Vec<_>>();
    assert_eq!(gateways(guarded), gateways(&bare));
    let host_side = |r: &Value| {
        r["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i.get("sandbox").is_none() && !i["name"].as_str().unwrap().starts_with("veth"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(host_side(guarded), host_side(&bare), "shared host interfaces (the bridge)");
    assert!(net.checkpoint(&probe).is_none(), "a chain without the guard left a checkpoint");
    net.del_with(&net.primary_only_conflist, &probe, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("primary alone DEL failed: {}", e.stderr));
}

/// DEL through libcni removes everything, and the retries runtimes send succeed: kubelet's
/// repeated StopPodSandbox (netns given) and containerd's RemovePodSandbox (no netns).
fn assert_del_leaves_nothing(net: &Network, sandbox: &Sandbox, result: &Value) {
    net.del(sandbox, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL {} failed: {}", sandbox.container_id, e.stderr));
    assert!(net.checkpoint(sandbox).is_none(), "checkpoint left after DEL");
    assert!(!net.record_file(sandbox).exists(), "record file left after DEL");
    assert!(net.cached_result(sandbox).is_none(), "libcni cache left after DEL");
    assert!(!pod_has_link(sandbox, IFNAME), "the primary's DEL did not run");
    for ip in result_ips(result) {
        assert_eq!(net.ip_holder(bare_ip(&ip)), None, "{ip} still reserved");
    }
    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        net.del(sandbox, netns)
            .unwrap_or_else(|e| panic!("repeated DEL {} failed: {}", sandbox.container_id, e.stderr));
    }
    assert!(net.checkpoint(sandbox).is_none(), "a repeated DEL re-created a checkpoint");
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
    assert!(pods[0].can_ping(&first_ip(&results[1])), "{first} -> {second} {how}");
    assert!(pods[1].can_ping(&first_ip(&results[0])), "{second} -> {first} {how}");
    assert!(pods[0].can_ping(&net.subnet.host(1)), "{first} -> {gateway}");

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
    two_pods_through_the_chain(&net, ["db-0", "db-1"], "(macvlan bridge mode)", "the LAN router behind the master");
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
    assert_eq!(net.checkpoint(&old).expect("A's record")["owner"], json!(false));
    assert_eq!(net.checkpoint(&new).expect("B's record")["owner"], json!(true));

    for netns in [NetnsArg::Sandbox, NetnsArg::Empty] {
        let refused = net.del(&old, netns).expect_err("the stale DEL of A must be refused");
        assert_eq!(refused.code, Some(11), "{}", refused.stderr);
        assert!(refused.stderr.contains("stale DEL"), "{}", refused.stderr);
        assert!(refused.stderr.contains(&new.container_id), "names the owner: {}", refused.stderr);
    }
    // libcni halted at the guard: bridge and host-local never saw A's DEL, and libcni kept
    // A's cache so the DEL can be retried once the pod is really gone.
    assert!(net.cached_result(&old).is_some(), "libcni dropped A's cache after a failed DEL");
    assert!(pod_has_link(&old, IFNAME));

    assert_result_matches_kernel(&new_result, &new);
    let new_ip = first_ip(&new_result);
    assert_eq!(net.ip_holder(&new_ip), Some(new.container_id.clone()), "B's IP still allocated");
    net.check(&new).unwrap_or_else(|e| panic!("CHECK of B after the refused DEL: {}", e.stderr));
    assert!(
        (0..3).any(|_| sys::try_run("ping", &["-c", "1", "-W", "2", &new_ip])),
        "node -> B ({new_ip}) after the refused DEL"
    );

    assert_del_leaves_nothing(&net, &new, &new_result);
    assert_del_leaves_nothing(&net, &old, &old_result);
}
