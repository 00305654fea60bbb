//! The NIC driver reload, end to end with real links: a macvlan pod set up through libcni on
//! a veth end that stands in for the node's NIC (or its vlan link), then that master deleted
//! and re-created, which takes the pod's macvlan away exactly as a driver reload does. CHECK
//! must name the loss, `--restore` must bring the interface back with the same MAC, addresses
//! and routes so that traffic passes, and a second `--restore` must change nothing.
//!
//! This kernel has no vlan module, so the path that re-creates a lost vlan parent is covered
//! by the unit tests of the restore plan (src/restore.rs), not here.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/cri_node.rs"]
mod cri_node;
#[path = "support/libcni.rs"]
mod libcni;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::process::Output;
use std::time::{Duration, Instant};

use cni::{Cni, Reply, guard};
use libcni::{
    IFNAME, Lan, NetnsArg, Network, Sandbox, assert_result_matches_kernel, bare_ip, bridge_network,
    dual_stack_macvlan_network_on_a_lan, ipv6_only_macvlan_network_on_a_lan,
    macvlan_network_on_a_lan, pod_has_link,
};
use serde_json::{Value, json};

/// The guard's own CHECK, given what libcni gives it: its conflist entry with the cached
/// result as prevResult. Through libcni the primary's CHECK runs first and, with the
/// interface gone, fails with its own words (macvlan: "eth0 not found"), so the guard's
/// diagnosis is read here directly.
fn guard_check(net: &Network, sandbox: &Sandbox) -> Reply {
    let conflist: Value = serde_json::from_slice(&std::fs::read(&net.conflist).unwrap()).unwrap();
    let mut entry = conflist["plugins"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
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
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
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
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let pod_ip = bare_ip(result["ips"][0]["address"].as_str().unwrap()).to_string();
    let pod_mac = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["sandbox"].is_string())
        .map(|i| i["mac"].as_str().unwrap().to_string())
        .unwrap();
    net.check(&pod)
        .unwrap_or_else(|e| panic!("CHECK of a healthy pod failed: {}", e.stderr));
    assert!(guard_check(&net, &pod).status.success());
    assert!(pod.can_ping(&router), "pod -> router before the reload");
    let routes_before = pod_routes(&pod);
    assert!(
        routes_before
            .iter()
            .any(|r| r["dst"] == "default" && r["gateway"] == json!(router)),
        "{routes_before:?}"
    );

    // ADD recorded what a restore needs, and the dump shows it.
    let record = net.checkpoint(&pod).expect("checkpoint");
    let links = &record["links"];
    assert_eq!(links["state"], "observed", "{links}");
    assert_eq!(links["kind"], "macvlan");
    assert_eq!(links["macvlanMode"], "bridge");
    assert_eq!(links["mac"], json!(pod_mac));
    assert_eq!(links["parent"]["name"], json!(lan.master));
    assert!(
        links["addresses"]
            .as_array()
            .unwrap()
            .contains(&result["ips"][0]["address"]),
        "{links}"
    );
    assert!(
        links["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["dst"] == "0.0.0.0/0" && r["gateway"] == json!(router)),
        "{links}"
    );

    // The reload: the master and the pod's macvlan vanish; the master comes back, the macvlan does not.
    lan.unplug();
    assert!(
        !pod_has_link(&pod, IFNAME),
        "the macvlan should vanish with its master"
    );
    lan.plug(&format!("{router}/24"));
    assert!(!pod_has_link(&pod, IFNAME));

    net.check(&pod)
        .expect_err("libcni CHECK must fail while the interface is gone");
    let failed = guard_check(&net, &pod);
    let reply: Value = serde_json::from_str(&failed.stdout)
        .unwrap_or_else(|e| panic!("CHECK reply ({e}): {}{}", failed.stdout, failed.stderr));
    assert_eq!(reply["code"], 100, "{reply}");
    let msg = reply["msg"].as_str().unwrap();
    for needle in [
        format!(
            "interface {IFNAME} is missing from netns {}",
            pod.netns_path()
        ),
        format!("parent link {} was re-created", lan.master),
        format!(
            "sandbox-guard --restore --state-dir {state_dir} {}",
            pod.container_id
        ),
    ] {
        assert!(msg.contains(&needle), "CHECK should say {needle:?}: {msg}");
    }

    let dry = guard(&[
        "--restore",
        "--dry-run",
        "--state-dir",
        &state_dir,
        &pod.container_id,
    ]);
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(text(&dry).contains("would restore"), "{}", text(&dry));
    assert!(
        text(&dry).contains(&format!("address {pod_mac}")),
        "{}",
        text(&dry)
    );
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
    assert_eq!(
        lan.neighbour_mac(&pod_ip),
        Some(pod_mac.clone()),
        "gratuitous ARP not seen by the router"
    );
    assert!(pod.can_ping(&router), "pod -> router after the restore");
    net.check(&pod)
        .unwrap_or_else(|e| panic!("CHECK after the restore failed: {}", e.stderr));

    // Again: nothing to do, nothing touched.
    let ifindex = pod_ifindex(&pod);
    let again = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("intact"), "{}", text(&again));
    assert!(text(&again).contains("0 restored"), "{}", text(&again));
    assert_eq!(
        pod_ifindex(&pod),
        ifindex,
        "a second restore re-created the interface"
    );

    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A veth's host end belongs to the primary (here a bridge port): restore must say it cannot
/// rebuild it, and why, rather than half-build it.
#[test]
fn a_lost_veth_is_reported_not_restorable() {
    sys::skip_unless_root!(libcni::TOOLS);
    let net = bridge_network();
    let pod = Sandbox::new("default", "web-0", "uid-web-0");
    net.add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    assert_eq!(
        net.checkpoint(&pod).expect("checkpoint")["links"]["kind"],
        "veth"
    );
    pod.netns.exec(&["ip", "link", "delete", IFNAME]);

    let state_dir = net.state_dir.to_str().unwrap();
    let out = guard(&["--restore", "--state-dir", state_dir, &pod.container_id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("NOT RESTORABLE"), "{}", text(&out));
    assert!(
        text(&out).contains("veth's host end belongs to the primary plugin"),
        "{}",
        text(&out)
    );
    assert!(
        !pod_has_link(&pod, IFNAME),
        "restore must not touch what it cannot rebuild"
    );

    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
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
    net.add(&old)
        .unwrap_or_else(|e| panic!("libcni ADD of the old sandbox failed: {}", e.stderr));
    net.add(&new)
        .unwrap_or_else(|e| panic!("libcni ADD of the new sandbox failed: {}", e.stderr));
    let refused = net
        .del(&old, NetnsArg::Sandbox)
        .expect_err("the old sandbox's DEL is stale");
    assert!(refused.stderr.contains("stale DEL"), "{}", refused.stderr);

    lan.unplug();
    lan.plug(&format!("{}/24", net.subnet.host(1)));
    assert!(!pod_has_link(&old, IFNAME) && !pod_has_link(&new, IFNAME));

    let out = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("superseded") && said.contains(&new.container_id),
        "the old row says who owns the pod: {said}"
    );
    assert!(pod_has_link(&new, IFNAME), "the owner is restored: {said}");
    assert!(
        !pod_has_link(&old, IFNAME),
        "the superseded sandbox must stay without its interface: {said}"
    );

    net.del(&new, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL of the owner failed: {}", e.stderr));
    net.del(&old, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL of the old sandbox failed: {}", e.stderr));
}

/// A pod's address of one family, without its prefix length, and its pod-side MAC.
fn address_of(result: &Value, v6: bool) -> String {
    let ips = result["ips"].as_array().unwrap();
    let cidr = ips
        .iter()
        .map(|ip| ip["address"].as_str().unwrap())
        .find(|a| a.contains(':') == v6)
        .expect("an address of the family");
    bare_ip(cidr).to_string()
}

fn pod_mac_of(result: &Value) -> String {
    let interfaces = result["interfaces"].as_array().unwrap();
    interfaces
        .iter()
        .find(|i| i["sandbox"].is_string())
        .map(|i| i["mac"].as_str().unwrap().to_string())
        .unwrap()
}

/// One ping, one second: what a pod's first connection after the restore gets.
fn pings_at_once(from: &Sandbox, to: &str) -> bool {
    from.netns.try_exec(&["ping", "-c", "1", "-W", "1", to])
}

/// The IPv6 addresses of the pod's interface that are not yet, or never will be, usable.
fn unsettled_ipv6(sandbox: &Sandbox) -> Vec<Value> {
    let links = pod_json(sandbox, &["-6", "addr", "show", "dev", IFNAME]);
    links
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a.get("tentative").is_some() || a.get("dadfailed").is_some())
        .collect()
}

/// Makes the router's neighbour entry for `ip` point at a MAC nobody has, as one left from
/// before the reload might: only an advertisement with Override puts the pod's MAC back.
fn poison_neighbour(lan: &Lan, ip: &str) {
    lan.netns.exec(&[
        "ip",
        "-6",
        "neigh",
        "replace",
        ip,
        "lladdr",
        "02:00:5e:00:00:01",
        "dev",
        &lan.uplink,
        "nud",
        "stale",
    ]);
}

/// The driver reload with dual-stack pods (host-local with a v4 and a v6 range, a default
/// route each): `--restore` must give back both families, with the IPv6 addresses usable
/// the moment it returns (not tentative: pod to pod over IPv6 at once) and advertised to the
/// router as IPv4's are with gratuitous ARP.
#[test]
fn dual_stack_pods_are_usable_over_both_families_right_after_restore() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let (router4, router6) = (net.subnet.host(1), net.subnet.host6(1));

    let pods = [
        Sandbox::new("db", "pg-0", "uid-pg-0"),
        Sandbox::new("db", "pg-1", "uid-pg-1"),
    ];
    let results = pods.each_ref().map(|pod| {
        net.add(pod)
            .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr))
    });
    for (pod, result) in pods.iter().zip(&results) {
        assert_eq!(
            result["ips"].as_array().unwrap().len(),
            2,
            "a v4 and a v6 address: {result}"
        );
        net.check(pod)
            .unwrap_or_else(|e| panic!("CHECK of a healthy dual-stack pod failed: {}", e.stderr));
        assert!(
            pod.can_ping(&router4) && pod.can_ping(&router6),
            "pod -> router over both families before the reload"
        );
        let links = net.checkpoint(pod).expect("checkpoint")["links"].clone();
        assert!(
            links["routes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["dst"] == "::/0" && r["gateway"] == json!(router6)),
            "{links}"
        );
    }
    let routes_before = pods.each_ref().map(pod_routes);
    let (pg1_v6, pg1_mac) = (address_of(&results[1], true), pod_mac_of(&results[1]));

    lan.unplug();
    lan.plug_dual(&net.subnet);
    assert!(pods.iter().all(|pod| !pod_has_link(pod, IFNAME)));
    poison_neighbour(&lan, &pg1_v6);

    let dry = guard(&[
        "--restore",
        "--dry-run",
        "--state-dir",
        &state_dir,
        &pods[1].container_id,
    ]);
    let said = text(&dry);
    assert!(dry.status.success(), "{said}");
    for needle in [
        format!(
            "ip -n <pod> -6 addr add {} dev {IFNAME}",
            results[1]["ips"]
                .as_array()
                .unwrap()
                .iter()
                .find(|ip| ip["address"].as_str().unwrap().contains(':'))
                .unwrap()["address"]
                .as_str()
                .unwrap()
        ),
        format!("ip -n <pod> route add ::/0 via {router6} dev {IFNAME}"),
        format!(
            "wait for duplicate address detection of {pg1_v6} on {IFNAME}: until `ip -n <pod> -6 addr show dev {IFNAME} tentative` is empty"
        ),
        format!("unsolicited neighbour advertisement (override) on {IFNAME} for {pg1_v6}"),
        format!(
            "gratuitous ARP on {IFNAME} for {}",
            address_of(&results[1], false)
        ),
    ] {
        assert!(
            said.contains(&needle),
            "the dry run should show {needle:?}: {said}"
        );
    }
    assert!(!pod_has_link(&pods[1], IFNAME), "a dry run changed the pod");

    let restored = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let said = text(&restored);
    assert!(restored.status.success(), "{said}");
    // No sleep: the first packets after the restore are the ones that must pass.
    assert!(
        pings_at_once(&pods[0], &pg1_v6),
        "pod -> pod over IPv6 right after the restore: {:?}\n{said}",
        unsettled_ipv6(&pods[1])
    );
    assert!(
        pings_at_once(&pods[1], &address_of(&results[0], false)),
        "pod -> pod over IPv4 right after the restore"
    );
    for (pod, result) in pods.iter().zip(&results) {
        assert_eq!(
            unsettled_ipv6(pod),
            Vec::<Value>::new(),
            "tentative or failed IPv6 addresses after the restore"
        );
        assert_result_matches_kernel(result, pod);
    }
    assert_eq!(
        pods.each_ref().map(pod_routes),
        routes_before,
        "routes of both families after the restore"
    );
    assert_eq!(
        lan.neighbour_mac(&pg1_v6),
        Some(pg1_mac),
        "the router did not take the advertised MAC"
    );
    assert!(
        pods[0].can_ping(&router6) && pods[0].can_ping(&router4),
        "pod -> router over both families after the restore"
    );
    let again = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    assert!(
        again.status.success() && text(&again).contains("0 restored, 2 intact"),
        "{}",
        text(&again)
    );
    for pod in &pods {
        net.check(pod)
            .unwrap_or_else(|e| panic!("CHECK after the restore failed: {}", e.stderr));
        net.del(pod, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
    }
}

/// While the pod's macvlan was gone another node took its IPv6 address: duplicate address
/// detection fails, and `--restore` must say so for that sandbox (exit 1, FAILED, the
/// address named), not advertise the address over its holder's; IPv4 is back regardless.
#[test]
fn a_taken_ipv6_address_fails_the_restore_of_its_sandbox() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let pod_v6 = address_of(&result, true);

    lan.unplug();
    lan.plug_dual(&net.subnet);
    // The router plays the other node: it holds the pod's IPv6 address and defends it.
    lan.netns.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{pod_v6}/128"),
        "dev",
        &lan.uplink,
        "nodad",
    ]);

    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("FAILED"), "{said}");
    assert!(
        said.contains(&format!(
            "duplicate address detection of {pod_v6} on {IFNAME}"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "it failed for {pod_v6}: another node on the link answers for it"
        )),
        "{said}"
    );
    assert!(
        !said.contains("neighbour advertisement (override)"),
        "an address another node holds must not be advertised: {said}"
    );
    let failed = unsettled_ipv6(&pod);
    assert!(
        failed
            .iter()
            .any(|a| a["local"] == json!(pod_v6) && a.get("dadfailed").is_some()),
        "{failed:?}"
    );
    assert!(
        pod.can_ping(&net.subnet.host(1)),
        "IPv4 is restored all the same (not announced: the sandbox has an address held elsewhere)"
    );
    // The interface is back; CHECK keeps naming the loss until detection passes.
    let check = guard_check(&net, &pod);
    let reply: Value = serde_json::from_str(&check.stdout)
        .unwrap_or_else(|e| panic!("CHECK reply ({e}): {}{}", check.stdout, check.stderr));
    assert_eq!(reply["code"], 100, "{reply}");
    assert!(
        reply["msg"].as_str().unwrap().contains(&format!(
            "{pod_v6}/64 on {IFNAME} failed duplicate address detection"
        )),
        "{reply}"
    );

    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// The guard's CHECK of a dual-stack pod names a lost IPv6 address and a lost IPv6 default
/// route as it names IPv4's, and passes both families when nothing is lost.
#[test]
fn check_names_what_a_dual_stack_pod_lost_in_either_family() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net) = dual_stack_macvlan_network_on_a_lan();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let cidr_of = |v6: bool| {
        let ips = result["ips"].as_array().unwrap();
        ips.iter()
            .map(|ip| ip["address"].as_str().unwrap().to_string())
            .find(|a| a.contains(':') == v6)
            .unwrap()
    };
    assert!(
        guard_check(&net, &pod).status.success(),
        "a healthy dual-stack pod"
    );
    let reply_of = |check: Reply| -> Value {
        serde_json::from_str(&check.stdout)
            .unwrap_or_else(|e| panic!("CHECK reply ({e}): {}{}", check.stdout, check.stderr))
    };

    pod.netns
        .exec(&["ip", "-6", "route", "del", "default", "dev", IFNAME]);
    let reply = reply_of(guard_check(&net, &pod));
    assert_eq!(reply["code"], 100, "{reply}");
    assert!(
        reply["msg"].as_str().unwrap().contains(&format!(
            "route ::/0 via {} is missing from {IFNAME}",
            net.subnet.host6(1)
        )),
        "{reply}"
    );

    pod.netns
        .exec(&["ip", "addr", "del", &cidr_of(true), "dev", IFNAME]);
    pod.netns
        .exec(&["ip", "addr", "del", &cidr_of(false), "dev", IFNAME]);
    let reply = reply_of(guard_check(&net, &pod));
    let details = reply["details"].as_str().unwrap();
    for lost in [
        format!("address {} is missing", cidr_of(false)),
        format!("address {} is missing", cidr_of(true)),
    ] {
        assert!(
            details.contains(&lost),
            "CHECK should name {lost:?}: {reply}"
        );
    }
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// One dual-stack pod under containerd's CRI, with the reference macvlan and host-local
/// plugins and the guard chained: RunPodSandbox gives it both families (the IPv6 one as
/// CRI's additional IP), the NIC driver reload takes its macvlan, `--restore` brings it back
/// and the host reaches it over IPv6 at once; Stop and Remove then go through.
#[test]
fn a_dual_stack_pod_under_cri_comes_back_with_both_families() {
    sys::skip_unless_root!(&[cri_node::TOOLS, libcni::TOOLS].concat());
    let node = cri_node::CriNode::start(cri_node::Primary::ReferenceMacvlan, |layout| {
        let (v4, v6) = (&layout.subnet, &layout.subnet6);
        json!({"cniVersion": "1.0.0", "name": "dual-stack", "plugins": [
            {
                "type": "macvlan",
                "master": layout.master,
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "dataDir": layout.dir.join("host-local"),
                    "ranges": [[{ "subnet": v4 }], [{ "subnet": v6 }]],
                    "routes": [
                        { "dst": "0.0.0.0/0", "gw": v4.replace(".0/24", ".1") },
                        { "dst": "::/0", "gw": v6.replace("::/64", "::1") }
                    ]
                }
            },
            { "type": "sandbox-guard", "stateDir": layout.guard_state, "logFile": layout.guard_log }
        ]})
    });
    let id = node
        .run_pod("pg-0", "db", "uid-pg-0")
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"));
    let status = node.pod_status(&id);
    assert_eq!(status["state"], "SANDBOX_READY", "{status}");
    let v4 = status["ip"].as_str().unwrap().to_string();
    let v6 = status["additionalIps"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no IPv6 address: {status}"))
        .to_string();
    assert!(!v4.contains(':') && v6.contains(':'), "{status}");
    let ping = |ip: &str| sys::try_run("ping", &["-c", "1", "-W", "1", ip]);
    assert!(ping(&v4) && ping(&v6), "host -> pod over both families");

    let state_dir = node.layout.guard_state.to_str().unwrap().to_string();
    let record = cni::dump_checkpoints(&node.layout.guard_state, &[])
        .into_iter()
        .find(|e| e["containerId"] == json!(id))
        .expect("the pod's record");
    let addresses = record["links"]["addresses"].to_string();
    assert!(
        addresses.contains(&v4) && addresses.contains(&v6),
        "{record}"
    );

    node.reload_master();
    let restored = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let said = text(&restored);
    assert!(
        restored.status.success() && said.contains("restored"),
        "{said}"
    );
    // No sleep: the host's first packets to the pod after the restore.
    assert!(
        ping(&v6),
        "host -> pod over IPv6 right after the restore: {said}"
    );
    assert!(ping(&v4), "host -> pod over IPv4 right after the restore");

    node.stop_pod(&id)
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}"));
    node.remove_pod(&id)
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}"));
    let left = cni::dump_checkpoints(&node.layout.guard_state, &[]);
    assert!(
        left.iter().all(|e| e["containerId"] != json!(id)),
        "the record outlived the pod: {left:?}"
    );
}

// ---------------------------------------------------------------------------------------
// What an operator meets after a reload with IPv6 pods.

/// One dual-stack pod added through libcni (after `prepare` set up its netns), then the
/// driver reload that takes its macvlan: the LAN, the network, the pod and its ADD result.
fn one_dual_stack_pod_after_a_reload(
    prepare: impl FnOnce(&Sandbox),
) -> (Lan, Network, Sandbox, Value) {
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    prepare(&pod);
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    lan.unplug();
    lan.plug_dual(&net.subnet);
    (lan, net, pod, result)
}

/// After a DAD failure the operator does what the FAILED line says (finds the node that holds
/// the address and stops it) and runs `--restore` again. The kernel never re-runs detection for
/// an address it marked `dadfailed`, so the pod's IPv6 address stays unusable; the second
/// restore must not call that sandbox `intact` and exit 0 (CHECK calls it lost meanwhile).
#[test]
fn a_restore_after_the_holder_left_brings_a_dadfailed_address_back() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|_| {});
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod_v6 = address_of(&result, true);
    let held = format!("{pod_v6}/128");
    lan.netns.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &held,
        "dev",
        &lan.uplink,
        "nodad",
    ]);
    let first = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    assert_eq!(first.status.code(), Some(1), "{}", text(&first));

    // Still held: a second run must keep saying so, not `intact`.
    let second = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&second);
    assert!(
        !said.contains("1 intact"),
        "a sandbox whose IPv6 address failed DAD is not intact: {said}"
    );
    assert_eq!(second.status.code(), Some(1), "{said}");

    // The holder is gone: the next run must give the pod its address back.
    lan.netns
        .exec(&["ip", "-6", "addr", "del", &held, "dev", &lan.uplink]);
    let third = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&third);
    assert!(third.status.success(), "{said}");
    assert_eq!(
        unsettled_ipv6(&pod),
        Vec::<Value>::new(),
        "the address is still dadfailed after the holder left: {said}"
    );
    assert!(
        pod.can_ping(&net.subnet.host6(1)),
        "pod -> router over IPv6 after the holder left: {said}"
    );
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// The reference plugins' ConfigureIface (pkg/ipam) writes `net.ipv6.conf.<if>.disable_ipv6=0`
/// before it adds an IPv6 address, so a pod whose netns disables IPv6 for new links (the
/// runtime's or the pod's `net.ipv6.conf.default.disable_ipv6=1`) still gets one at ADD. The
/// re-created macvlan inherits that default: `--restore` must enable IPv6 on it as ADD did, and
/// in any case IPv4 must come back (routes, gratuitous ARP) whatever happens to IPv6.
#[test]
fn a_pod_netns_with_ipv6_disabled_by_default_gets_both_families_back() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|pod| {
        pod.netns
            .exec(&["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"]);
    });
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    let routes = pod_routes(&pod);
    assert!(
        routes
            .iter()
            .any(|r| r["dst"] == "default" && r["gateway"] == json!(net.subnet.host(1))),
        "IPv4's default route must come back whatever IPv6 does: {routes:?}\n{said}"
    );
    assert!(out.status.success(), "{said}");
    assert!(
        pings_at_once(&pod, &net.subnet.host6(1)),
        "IPv6 right after the restore: {said}"
    );
    assert_result_matches_kernel(&result, &pod);
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// The NIC is back but has no link yet (autonegotiation, an LACP bond, a switch port coming
/// up): a fresh macvlan on it keeps its IPv6 addresses tentative until it has carrier, however
/// long detection is set to take. The restore must say that, and not spend 10 s per sandbox
/// before blaming the pod's dad_transmits sysctl.
#[test]
fn a_parent_without_carrier_is_named_not_waited_on() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net, pod, _) = one_dual_stack_pod_after_a_reload(|_| {});
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    lan.netns.exec(&["ip", "link", "set", &lan.uplink, "down"]);
    let started = Instant::now();
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let took = started.elapsed();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("carrier"),
        "the reason is the link without carrier, not the DAD sysctls: {said}"
    );
    assert!(
        took < Duration::from_secs(5),
        "waited {took:?} on a link that cannot finish detection: {said}"
    );
    lan.netns.exec(&["ip", "link", "set", &lan.uplink, "up"]);
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// The restore's neighbour advertisement as the router receives it, decoded by tcpdump: ICMPv6
/// type 136 with a valid checksum, hop limit 255 (receivers drop anything less, RFC 4861
/// 7.1.2), from the pod's own address to ff02::1, Override set and Solicited/Router clear, the
/// pod's MAC as target link-layer address.
#[test]
fn the_neighbour_advertisement_is_well_formed_on_the_wire() {
    sys::skip_unless_root!(&[libcni::TOOLS, &["tcpdump"]].concat());
    let (pod_v6, pod_mac, advert) = advertisement_on_the_wire(false);
    for needle in [
        format!("{pod_mac} > 33:33:00:00:00:01"),
        "hlim 255".to_string(),
        format!("{pod_v6} > ff02::1"),
        "icmp6 sum ok".to_string(),
        "neighbor advertisement".to_string(),
        "Flags [override]".to_string(),
        // tcpdump names the target link-layer address option "destination link-address".
        format!("destination link-address option (2), length 8 (1): {pod_mac}"),
    ] {
        assert!(
            advert.contains(&needle),
            "{needle:?} missing from the advertisement: {advert}"
        );
    }
}

/// A pod that routes IPv6 (forwarding on: a CNF, a VPN or NAT64 pod on a macvlan) must
/// advertise with the Router flag, as the kernel's own unsolicited advertisement does
/// (`router = forwarding`, ndisc_send_unsol_na): a receiver that sees IsRouter go from true
/// to false takes the pod out of its default router list (RFC 4861 7.2.5).
#[test]
fn a_routing_pod_advertises_itself_as_a_router() {
    sys::skip_unless_root!(&[libcni::TOOLS, &["tcpdump"]].concat());
    let (pod_v6, _, advert) = advertisement_on_the_wire(true);
    assert!(
        advert.contains(&format!("tgt is {pod_v6}, Flags [router, override]")),
        "the Router flag is missing: {advert}"
    );
}

/// Adds a dual-stack pod (with IPv6 forwarding on in its netns when `routing`), reloads the
/// LAN's master, restores the pod while tcpdump listens on the router's end, and returns the
/// pod's IPv6 address, its MAC and tcpdump's decoding of the advertisement for it.
fn advertisement_on_the_wire(routing: bool) -> (String, String, String) {
    let (lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|pod| {
        if routing {
            pod.netns
                .exec(&["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"]);
        }
    });
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let (pod_v6, pod_mac) = (address_of(&result, true), pod_mac_of(&result));
    let capture = std::env::temp_dir().join(format!("{}.pcap", sys::unique("sgna")));
    let capture_path = capture.to_str().unwrap().to_string();
    let mut tcpdump = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &lan.netns.name,
            "tcpdump",
            "--immediate-mode",
            "-i",
            &lan.uplink,
            "-U",
            "-n",
            "-w",
            &capture_path,
            "icmp6",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tcpdump");
    // tcpdump opens the capture before it writes the pcap header; without --immediate-mode
    // the last packets can sit in the capture ring when it is stopped.
    let started = Instant::now();
    while std::fs::metadata(&capture).map_or(true, |m| m.len() == 0)
        && started.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    std::thread::sleep(Duration::from_millis(300));
    sys::run("kill", &["-INT", &tcpdump.id().to_string()]);
    tcpdump.wait().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let decoded = sys::run("tcpdump", &["-r", &capture_path, "-n", "-vv", "-e"]);
    let _ = std::fs::remove_file(&capture);
    let decoded = String::from_utf8_lossy(&decoded.stdout).to_string();
    // The packet's line and its indented option lines.
    let lines: Vec<&str> = decoded.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&format!("tgt is {pod_v6}")))
        .unwrap_or_else(|| panic!("no advertisement for {pod_v6}: {decoded}"));
    let advert = std::iter::once(lines[at])
        .chain(
            lines[at + 1..]
                .iter()
                .copied()
                .take_while(|l| l.starts_with(char::is_whitespace)),
        )
        .collect::<Vec<_>>()
        .join("\n");
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
    (pod_v6, pod_mac, advert)
}

/// A node's worth of dual-stack pods after the reload, one of whose IPv6 addresses another
/// node took meanwhile: that sandbox alone is FAILED, naming the address; the others are
/// restored and usable over IPv6 at once; the run exits 1 and the summary counts both.
#[test]
fn one_taken_ipv6_address_among_many_fails_only_its_sandbox() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pods: Vec<Sandbox> = (0..4)
        .map(|i| Sandbox::new("db", &format!("pg-{i}"), &format!("uid-pg-{i}")))
        .collect();
    let results: Vec<Value> = pods
        .iter()
        .map(|pod| {
            net.add(pod)
                .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr))
        })
        .collect();
    let taken = address_of(&results[2], true);

    lan.unplug();
    lan.plug_dual(&net.subnet);
    lan.netns.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{taken}/128"),
        "dev",
        &lan.uplink,
        "nodad",
    ]);
    let out = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("4 sandboxes: 3 restored, 0 intact"), "{said}");
    assert!(said.contains("1 failed"), "{said}");
    // The detail line names the sandbox in full.
    assert!(
        said.lines()
            .any(|l| l.starts_with(&pods[2].container_id) && l.ends_with("FAILED")),
        "{said}"
    );
    assert!(said.contains(&format!("it failed for {taken}")), "{said}");
    for (i, (pod, result)) in pods.iter().zip(&results).enumerate() {
        if i == 2 {
            continue;
        }
        assert!(
            pings_at_once(pod, &net.subnet.host6(1)),
            "pod {i} -> router over IPv6 right after the restore: {said}"
        );
        assert_eq!(unsettled_ipv6(pod), Vec::<Value>::new());
        assert_result_matches_kernel(result, pod);
    }
    lan.netns.exec(&[
        "ip",
        "-6",
        "addr",
        "del",
        &format!("{taken}/128"),
        "dev",
        &lan.uplink,
    ]);
    for pod in &pods {
        net.del(pod, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
    }
}

/// An IPv6-only pod (host-local with a v6 range alone): the restore has no IPv4 to announce
/// and must still rebuild, wait for detection and advertise, and the pod reaches the router
/// over IPv6 the moment it returns; CHECK passes afterwards.
#[test]
fn an_ipv6_only_pod_is_usable_right_after_restore() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = ipv6_only_macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let ips = result["ips"].as_array().unwrap();
    assert!(
        ips.len() == 1 && ips[0]["address"].as_str().unwrap().contains(':'),
        "an IPv6 address only: {result}"
    );

    lan.unplug();
    lan.plug_dual(&net.subnet);
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("gratuitous ARP"), "{said}");
    assert!(
        pings_at_once(&pod, &net.subnet.host6(1)),
        "pod -> router over IPv6 right after the restore: {said}"
    );
    assert_result_matches_kernel(&result, &pod);
    net.check(&pod)
        .unwrap_or_else(|e| panic!("CHECK after the restore failed: {}", e.stderr));
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A pod netns that turned detection off for new links (`accept_dad=0`, as some CNFs do to
/// come up faster): the re-created interface does none, so the guard probes for a holder
/// itself before it adds the address; nobody holds it, so it is usable and advertised.
#[test]
fn a_pod_without_dad_is_probed_by_the_guard_then_advertised() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (_lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|pod| {
        pod.netns
            .exec(&["sysctl", "-q", "-w", "net.ipv6.conf.default.accept_dad=0"]);
    });
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("neighbour solicitations for duplicate address detection on eth0"),
        "{said}"
    );
    assert!(
        said.contains("neighbour advertisement (override)"),
        "{said}"
    );
    assert!(
        pings_at_once(&pod, &net.subnet.host6(1)),
        "pod -> router over IPv6 right after the restore: {said}"
    );
    assert_result_matches_kernel(&result, &pod);
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A node's worth of dual-stack pods after the reload: docs/cli.md says the DAD wait is paid about
/// once per run, not once per pod. Forty pods' waits must overlap: the whole restore within
/// a few seconds, not the sum of per-batch waits.
#[test]
fn forty_dual_stack_pods_wait_for_detection_about_once() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pods: Vec<Sandbox> = (0..40)
        .map(|i| Sandbox::new("db", &format!("pg-{i}"), &format!("uid-pg-{i}")))
        .collect();
    for pod in &pods {
        net.add(pod)
            .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    }
    lan.unplug();
    lan.plug_dual(&net.subnet);
    let started = Instant::now();
    let out = guard(&["--restore", "--state-dir", &state_dir, "--all"]);
    let (took, said) = (started.elapsed(), text(&out));
    assert!(out.status.success(), "{said}");
    eprintln!("restore of {} dual-stack pods took {took:?}", pods.len());
    for pod in &pods {
        assert_eq!(unsettled_ipv6(pod), Vec::<Value>::new());
    }
    assert!(
        took < Duration::from_secs(4),
        "40 pods' DAD waits did not overlap: {took:?}"
    );
    for pod in &pods {
        net.del(pod, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
    }
}

// ---------------------------------------------------------------------------------------
// Another node on the same L2 holds the pod's sticky address: no restore may move the
// router's ARP or neighbour entry away from it.

/// The node that took a pod's address while its interface was gone: a netns of its own with
/// a macvlan in bridge mode on the LAN's master, so it shares the L2 with the pods (its
/// sibling macvlans) and with the router (through the master's peer).
struct Holder {
    _netns: sys::Netns,
    mac: String,
}

impl Holder {
    /// `v4` and `v6` are `address/prefix`; IPv6 without detection, so it holds them at once.
    fn on(lan: &Lan, v4: Option<&str>, v6: Option<&str>) -> Holder {
        let netns = sys::Netns::new("sghold");
        let link = sys::unique("sgho");
        sys::run(
            "ip",
            &[
                "link",
                "add",
                "link",
                &lan.master,
                "name",
                &link,
                "netns",
                &netns.name,
                "type",
                "macvlan",
                "mode",
                "bridge",
            ],
        );
        netns.exec(&["ip", "link", "set", &link, "name", "eth0"]);
        netns.exec(&["ip", "link", "set", "eth0", "up"]);
        if let Some(v4) = v4 {
            netns.exec(&["ip", "addr", "add", v4, "dev", "eth0"]);
        }
        if let Some(v6) = v6 {
            netns.exec(&["ip", "-6", "addr", "add", v6, "dev", "eth0", "nodad"]);
        }
        let shown: Value =
            serde_json::from_slice(&netns.exec(&["ip", "-j", "link", "show", "eth0"]).stdout)
                .unwrap();
        let mac = shown[0]["address"].as_str().unwrap().to_string();
        Holder { _netns: netns, mac }
    }
}

/// The router talks to the holder, so that its ARP or neighbour entry for `ip` names the
/// holder's MAC; then waits out the ARP lock time (`locktime`, 1 s), within which Linux
/// ignores a second answer, so that a gratuitous ARP from the pod would take the entry.
fn router_reaches(lan: &Lan, ip: &str, holder: &Holder) {
    assert!(
        lan.netns.try_exec(&["ping", "-c", "1", "-W", "2", ip]),
        "router -> holder at {ip}"
    );
    assert_eq!(lan.neighbour_mac(ip), Some(holder.mac.clone()), "{ip}");
    std::thread::sleep(Duration::from_millis(1200));
}

fn pod_addresses(sandbox: &Sandbox) -> Vec<String> {
    pod_json(sandbox, &["addr", "show", "dev", IFNAME])
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a.get("dadfailed").is_none())
        .map(|a| a["local"].as_str().unwrap().to_string())
        .filter(|a| !a.starts_with("fe80"))
        .collect()
}

/// While the pod's macvlan was gone another node took its IPv4 address. The restore must
/// probe before it announces (RFC 5227), find the holder, report FAILED naming the address,
/// leave it off the pod's interface, and leave the router's ARP entry on the holder.
#[test]
fn an_ipv4_holder_keeps_its_address_and_the_routers_arp_entry() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let pod_v4 = address_of(&result, false);
    lan.unplug();
    lan.plug(&format!("{}/24", net.subnet.host(1)));
    let holder = Holder::on(&lan, Some(&format!("{pod_v4}/24")), None);
    router_reaches(&lan, &pod_v4, &holder);

    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lan.neighbour_mac(&pod_v4),
        Some(holder.mac.clone()),
        "the restore took the holder's ARP entry on the router: {said}"
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("FAILED"), "{said}");
    assert!(
        said.contains(&format!("{pod_v4} is held by {}", holder.mac)),
        "{said}"
    );
    assert!(!said.contains("gratuitous ARP on"), "{said}");
    assert!(
        !pod_addresses(&pod).contains(&pod_v4),
        "the held address must stay off the pod's interface: {said}"
    );

    // The holder leaves: the next run probes again and gives the pod its address back.
    drop(holder);
    let again = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&again);
    assert!(again.status.success(), "{said}");
    assert_result_matches_kernel(&result, &pod);
    assert!(pod.can_ping(&net.subnet.host(1)), "{said}");
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// The NIC is back but has no carrier yet, and another node across it holds the pod's IPv4
/// address. ARP probes sent on a link without carrier reach nobody, so silence proves nothing:
/// the restore must not add the address and call the sandbox restored, or the pod answers for
/// the holder's address the moment carrier comes.
#[test]
fn an_ipv4_probe_on_a_link_without_carrier_proves_nothing() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = macvlan_network_on_a_lan();
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let pod_v4 = address_of(&result, false);
    lan.unplug();
    lan.plug(&format!("{}/24", net.subnet.host(1)));
    // The holder: a node behind the uplink (here the router's own netns) that has the address.
    let held = format!("{pod_v4}/32");
    lan.netns
        .exec(&["ip", "addr", "add", &held, "dev", &lan.uplink]);
    lan.netns.exec(&["ip", "link", "set", &lan.uplink, "down"]);
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    let on_pod = pod_addresses(&pod);
    lan.netns.exec(&["ip", "link", "set", &lan.uplink, "up"]);
    assert!(
        !on_pod.contains(&pod_v4),
        "an address probed on a link without carrier went on the pod: {said}"
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("carrier"),
        "the reason is the missing carrier: {said}"
    );
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// Another node holds both of a dual-stack pod's addresses. IPv6's detection fails, and the
/// IPv4 probe finds the holder too: the sandbox is FAILED for both, and neither family is
/// announced, so the router keeps both entries on the holder.
#[test]
fn a_holder_of_both_addresses_gets_nothing_announced_over_it() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|_| {});
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let (pod_v4, pod_v6) = (address_of(&result, false), address_of(&result, true));
    let holder = Holder::on(
        &lan,
        Some(&format!("{pod_v4}/24")),
        Some(&format!("{pod_v6}/64")),
    );
    router_reaches(&lan, &pod_v4, &holder);
    router_reaches(&lan, &pod_v6, &holder);

    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lan.neighbour_mac(&pod_v4),
        Some(holder.mac.clone()),
        "the router's ARP entry moved off the holder: {said}"
    );
    assert_eq!(
        lan.neighbour_mac(&pod_v6),
        Some(holder.mac.clone()),
        "the router's neighbour entry moved off the holder: {said}"
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("{pod_v4} is held by {}", holder.mac)),
        "{said}"
    );
    assert!(said.contains(&format!("it failed for {pod_v6}")), "{said}");
    assert!(!said.contains("gratuitous ARP on"), "{said}");
    assert!(
        !said.contains("neighbour advertisement (override) on"),
        "{said}"
    );
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

/// A pod netns where the rebuilt link does no duplicate address detection (`sysctl` of
/// `net.ipv6.conf.default`): the kernel never marks the address tentative, so only the
/// guard's own solicitation can find the holder before the advertisement with Override.
fn a_held_ipv6_address_without_detection(sysctl: &str) {
    let (lan, net, pod, result) = one_dual_stack_pod_after_a_reload(|pod| {
        pod.netns.exec(&["sysctl", "-q", "-w", sysctl]);
    });
    let state_dir = net.state_dir.to_str().unwrap().to_string();
    let pod_v6 = address_of(&result, true);
    let holder = Holder::on(&lan, None, Some(&format!("{pod_v6}/64")));
    router_reaches(&lan, &pod_v6, &holder);

    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lan.neighbour_mac(&pod_v6),
        Some(holder.mac.clone()),
        "the advertisement took the holder's neighbour entry on the router: {said}"
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("{pod_v6} is held by {}", holder.mac)),
        "{said}"
    );
    assert!(
        !said.contains("neighbour advertisement (override) on"),
        "{said}"
    );
    assert!(!said.contains("gratuitous ARP on"), "{said}");
    assert!(
        !pod_addresses(&pod).contains(&pod_v6),
        "the held address must stay off the pod's interface: {said}"
    );
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}

#[test]
fn with_accept_dad_off_a_held_ipv6_address_is_probed_not_advertised() {
    sys::skip_unless_root!(libcni::TOOLS);
    a_held_ipv6_address_without_detection("net.ipv6.conf.default.accept_dad=0");
}

#[test]
fn with_dad_transmits_zero_a_held_ipv6_address_is_probed_not_advertised() {
    sys::skip_unless_root!(libcni::TOOLS);
    a_held_ipv6_address_without_detection("net.ipv6.conf.default.dad_transmits=0");
}

/// What a tuning plugin (or the primary) set on the pod's interface at ADD comes back with
/// the rebuilt interface: the reference `tuning` plugin, chained before the guard, sets
/// IPv4 and IPv6 sysctls of eth0 and its address generation mode (`addr_gen_mode` 1 is
/// `addrgenmode none`: no link-local address).
#[test]
fn settings_made_at_add_come_back_with_the_interface() {
    sys::skip_unless_root!(libcni::TOOLS);
    let (lan, net) = dual_stack_macvlan_network_on_a_lan();
    let settings = [
        ("ipv4", "arp_ignore", "1"),
        ("ipv6", "accept_ra", "0"),
        ("ipv6", "accept_dad", "0"),
        ("ipv6", "addr_gen_mode", "1"),
    ];
    let mut conflist: Value =
        serde_json::from_slice(&std::fs::read(&net.conflist).unwrap()).unwrap();
    let sysctl: serde_json::Map<String, Value> = settings
        .iter()
        .map(|(family, key, value)| (format!("net.{family}.conf.{IFNAME}.{key}"), json!(value)))
        .collect();
    let plugins = conflist["plugins"].as_array_mut().unwrap();
    let at = plugins.len() - 1;
    plugins.insert(at, json!({"type": "tuning", "sysctl": sysctl}));
    std::fs::write(&net.conflist, serde_json::to_vec_pretty(&conflist).unwrap()).unwrap();
    let _ = std::os::unix::fs::symlink("/usr/lib/cni/tuning", net.bin_dir.join("tuning"));
    let state_dir = net.state_dir.to_str().unwrap().to_string();

    let pod = Sandbox::new("db", "pg-0", "uid-pg-0");
    // The netns's defaults stay the kernel's: the accept_ra the interface had was the tuning
    // plugin's, not a default it inherits again.
    let result = net
        .add(&pod)
        .unwrap_or_else(|e| panic!("libcni ADD failed: {}", e.stderr));
    let read = |family: &str, key: &str| {
        let out = pod.netns.exec(&[
            "cat",
            &format!("/proc/sys/net/{family}/conf/{IFNAME}/{key}"),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for (family, key, value) in settings {
        assert_eq!(read(family, key), value, "{family} {key} after ADD");
    }
    let record = net.checkpoint(&pod).expect("checkpoint");
    let recorded = &record["links"]["settings"];
    for (family, key, value) in settings {
        assert_eq!(
            recorded[family][key].to_string(),
            value,
            "{family} {key} in the record: {recorded}"
        );
    }

    lan.unplug();
    lan.plug_dual(&net.subnet);
    let out = guard(&["--restore", "--state-dir", &state_dir, &pod.container_id]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for (family, key, value) in settings {
        assert_eq!(
            read(family, key),
            value,
            "{family} {key} after the restore: {said}"
        );
    }
    let link = pod_json(&pod, &["-d", "link", "show", IFNAME]);
    assert_eq!(
        link[0]["inet6_addr_gen_mode"], "none",
        "addrgenmode after the restore: {link}"
    );
    let link_local: Vec<Value> = pod_json(
        &pod,
        &["-6", "addr", "show", "dev", IFNAME, "scope", "link"],
    )
    .as_array()
    .unwrap()
    .iter()
    .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
    .collect();
    assert_eq!(
        link_local,
        Vec::<Value>::new(),
        "a link-local the pod never had: {said}"
    );
    assert_result_matches_kernel(&result, &pod);
    // The link does no detection: the guard's own probe found nobody, and advertised.
    assert!(
        said.contains("neighbour advertisement (override) on"),
        "{said}"
    );
    assert!(
        pings_at_once(&pod, &net.subnet.host6(1)) || pod.can_ping(&net.subnet.host6(1)),
        "pod -> router over IPv6: {said}"
    );
    net.del(&pod, NetnsArg::Sandbox)
        .unwrap_or_else(|e| panic!("libcni DEL failed: {}", e.stderr));
}
