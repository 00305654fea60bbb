//! The NIC driver reload, end to end with real links: a macvlan pod set up through libcni on
//! a veth end that stands in for the node's NIC (or its vlan link), then that master deleted
//! and re-created, which takes the pod's macvlan away exactly as a driver reload does. CHECK
//! must name the loss, `--restore` must bring the interface back with the same MAC, addresses
//! and routes so that traffic passes, and a second `--restore` must change nothing.
//!
//! This kernel has no vlan module, so the path that re-creates a lost vlan parent is covered
//! by the unit tests of the restore plan (src/restore.rs), not here.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/libcni.rs"]
mod libcni;

use std::process::Output;
use std::time::{Duration, Instant};

use cni::{Cni, Reply, guard};
use libcni::{IFNAME, Network, NetnsArg, Sandbox, assert_result_matches_kernel, bare_ip, bridge_network, macvlan_network_on_a_lan, pod_has_link};
use serde_json::{Value, json};

/// The guard's own CHECK, given what libcni gives it: its conflist entry with the cached
/// result as prevResult. Through libcni the primary's CHECK runs first and, with the
/// interface gone, fails with its own words (macvlan: "eth0 not found"), so the guard's
/// diagnosis is read here directly.
fn guard_check(net: &Network, sandbox: &Sandbox) -> Reply {
    let conflist: Value = serde_json::from_slice(&std::fs::read(&net.conflist).unwrap()).unwrap();
    let mut entry = conflist["plugins"].as_array().unwrap().last().unwrap().clone();
    entry["name"] = conflist["name"].clone();
    entry["cniVersion"] = conflist["cniVersion"].clone();
    entry["prevResult"] = net.cached_result(sandbox).expect("libcni's cached result");
    Cni::with_config("CHECK", &sandbox.container_id, &entry)
        .netns(&sandbox.netns_path())
        .ifname(IFNAME)
        .env("CNI_PATH", Some("/usr/lib/cni"))
        .run()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn pod_json(sandbox: &Sandbox, args: &[&str]) -> Value {
    let mut cmd = vec!["ip", "-j"];
    cmd.extend_from_slice(args);
    serde_json::from_slice(&sandbox.netns.exec(&cmd).stdout).expect("ip -j output")
}

/// The pod interface's routes without the kernel's bookkeeping fields, sorted.
fn pod_routes(sandbox: &Sandbox) -> Vec<Value> {
    let mut routes: Vec<Value> = ["-4", "-6"]
        .iter()
        .flat_map(|family| pod_json(sandbox, &[family, "route", "show", "dev", IFNAME]).as_array().cloned().unwrap_or_default())
        .filter(|r| r["dst"].as_str().is_some_and(|d| !d.starts_with("fe80")))
        .map(|r| json!({"dst": r["dst"], "gateway": r["gateway"], "scope": r["scope"], "metric": r["metric"]}))
        .collect();
    routes.sort_by_key(|r| r.to_string());
    routes
}

fn pod_ifindex(sandbox: &Sandbox) -> Value {
    pod_json(sandbox, &["link", "show", IFNAME])[0]["ifindex"].clone()
}

#[test]
fn a_driver_reload_is_seen_by_check_and_undone_by_restore() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = macvlan_network_on_a_lan();
    let router = net.subnet.host(1);
    let state_dir = net.state_dir.to_str().unwrap().to_string();

    let pod = Sandbox::new("kube-system", "etcd-node1", "uid-etcd");
    let result = net.add(&pod).unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let pod_ip = bare_ip(result["ips"][0]["address"].as_str().unwrap()).to_string();
    let pod_mac = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["sandbox"].is_string())
        .map(|i| i["mac"].as_str().unwrap().to_string())
        .unwrap();
    net.check(&pod).unwrap_or_else(|e| panic!("CHECK of a healthy pod failed: {}", e.stderr));
    assert!(guard_check(&net, &pod).status.success());
    assert!(pod.can_ping(&router), "pod -> router before the reload");
    let routes_before = pod_routes(&pod);
    assert!(routes_before.iter().any(|r| r["dst"] == "default" && r["gateway"] == json!(router)), "{routes_before:?}");

    // ADD recorded what a restore needs, and the dump shows it.
    let record = net.checkpoint(&pod).expect("checkpoint");
    let links = &record["links"];
    assert_eq!(links["state"], "observed", "{links}");
    assert_eq!(links["kind"], "macvlan");
    assert_eq!(links["macvlanMode"], "bridge");
    assert_eq!(links["mac"], json!(pod_mac));
    assert_eq!(links["parent"]["name"], json!(lan.master));
    assert!(links["addresses"].as_array().unwrap().contains(&result["ips"][0]["address"]), "{links}");
    assert!(
        links["routes"].as_array().unwrap().iter().any(|r| r["dst"] == "0.0.0.0/0" && r["gateway"] == json!(router)),
        "{links}"
    );

    // The reload: the master and the pod's macvlan vanish; the master comes back, the macvlan does not.
    lan.unplug();
    assert!(!pod_has_link(&pod, IFNAME), "the macvlan should vanish with its master");
    lan.plug(&format!("{router}/24"));
    assert!(!pod_has_link(&pod, IFNAME));

    net.check(&pod).expect_err("libcni CHECK must fail while the interface is gone");
    let failed = guard_check(&net, &pod);
    let reply: Value = serde_json::from_str(&failed.stdout).unwrap_or_else(|e| panic!("CHECK reply ({e}): {}{}", failed.stdout, failed.stderr));
    assert_eq!(reply["code"], 100, "{reply}");
    let msg = reply["msg"].as_str().unwrap();
    for needle in [
        format!("interface {IFNAME} is missing from netns {}", pod.netns_path()),
        format!("parent link {} was re-created", lan.master),
        format!("sandbox-guard --restore --state-dir {state_dir} {}", pod.container_id),
    ] {
        assert!(msg.contains(&needle), "CHECK should say {needle:?}: {msg}");
    }

    let dry = guard(&["--restore", "--dry-run", "--state-dir", &state_dir, &pod.container_id]);
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(text(&dry).contains("would restore"), "{}", text(&dry));
    assert!(text(&dry).contains(&format!("address {pod_mac}")), "{}", text(&dry));
    assert!(!pod_has_link(&pod, IFNAME), "a dry run changed the pod");

    let restored = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    assert!(restored.status.success(), "{}", text(&restored));
    assert!(text(&restored).contains("restored"), "{}", text(&restored));
    eprintln!("{}", text(&restored));

    // Same MAC, addresses and routes as libcni's result says, in the same netns.
    assert_result_matches_kernel(&result, &pod);
    assert_eq!(pod_routes(&pod), routes_before, "routes after the restore");
    // The router learnt the pod's MAC from the gratuitous ARP, before the pod sent anything.
    let deadline = Instant::now() + Duration::from_secs(3);
    while lan.neighbour_mac(&pod_ip).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lan.neighbour_mac(&pod_ip), Some(pod_mac.clone()), "gratuitous ARP not seen by the router");
    assert!(pod.can_ping(&router), "pod -> router after the restore");
    net.check(&pod).unwrap_or_else(|e| panic!("CHECK after the restore failed: {}", e.stderr));

    // Again: nothing to do, nothing touched.
    let ifindex = pod_ifindex(&pod);
    let again = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("intact"), "{}", text(&again));
    assert!(text(&again).contains("0 restored"), "{}", text(&again));
    assert_eq!(pod_ifindex(&pod), ifindex, "a second restore re-created the interface");

    net.del(&pod, NetnsArg::Sandbox).unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A veth's host end belongs to the primary (here a bridge port): restore must say it cannot
/// rebuild it, and why, rather than half-build it.
#[test]
fn a_lost_veth_is_reported_not_restorable() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network();
    let pod = Sandbox::new("default", "web-0", "uid-web-0");
    net.add(&pod).unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    assert_eq!(net.checkpoint(&pod).expect("checkpoint")["links"]["kind"], "veth");
    pod.netns.exec(&["ip", "link", "delete", IFNAME]);

    let state_dir = net.state_dir.to_str().unwrap();
    let out = guard(&["--restore", "--state-dir", state_dir, &pod.container_id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("NOT RESTORABLE"), "{}", text(&out));
    assert!(text(&out).contains("veth's host end belongs to the primary plugin"), "{}", text(&out));
    assert!(!pod_has_link(&pod, IFNAME), "restore must not touch what it cannot rebuild");

    net.del(&pod, NetnsArg::Sandbox).unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A StatefulSet pod came back in a new sandbox while the old sandbox's DEL was refused (its
/// netns stays, pinned by the runtime). A driver reload takes both macvlans; `--restore --all`
/// must bring back the owner's only: the old one's interface next to the live owner would put
/// the pod's address (sticky with in-house IPAMs) on the wire twice.
#[test]
fn a_superseded_sandbox_is_not_revived_next_to_its_owner() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();

    let old = Sandbox::new("db", "etcd-0", "uid-etcd-old");
    let new = Sandbox::new("db", "etcd-0", "uid-etcd-new");
    net.add(&old).unwrap_or_else(|e| panic!("libcni ADD of the old sandbox failed: {}", e.stderr));
    net.add(&new).unwrap_or_else(|e| panic!("libcni ADD of the new sandbox failed: {}", e.stderr));
    let refused = net.del(&old, NetnsArg::Sandbox).expect_err("the old sandbox's DEL is stale");
    assert!(refused.stderr.contains("stale DEL"), "{}", refused.stderr);

    lan.unplug();
    lan.plug(&format!("{}/24", net.subnet.host(1)));
    assert!(!pod_has_link(&old, IFNAME) && !pod_has_link(&new, IFNAME));

    let out = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("superseded") && said.contains(&new.container_id), "the old row says who owns the pod: {said}");
    assert!(pod_has_link(&new, IFNAME), "the owner is restored: {said}");
    assert!(!pod_has_link(&old, IFNAME), "the superseded sandbox must stay without its interface: {said}");

    net.del(&new, NetnsArg::Sandbox).unwrap_or_else(|e| panic!("libcni DEL of the owner failed: {}", e.stderr));
    net.del(&old, NetnsArg::Sandbox).unwrap_or_else(|e| panic!("libcni DEL of the old sandbox failed: {}", e.stderr));
}
