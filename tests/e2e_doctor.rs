//! `--doctor` and the `ipConflict` check at ADD against real links and namespaces: the
//! enslaved macvlan master, the node without a default route, two
//! namespaces with one address and a namespace that outlived its DEL, a held DEL's address
//! with and without its interface, stale DELs per pod, and a clean node that reports clean.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use cni::{Pod, Store, container_id, prev_result_for};
use serde_json::{Value, json};
use sys::{Netns, TempDir};
use testdata::{fixture_path, fixtures_in, guarded_conflist};

const TOOLS: &[&str] = &["ip", "sleep"];

/// What one doctor run said.
struct Diagnosis {
    status: i32,
    findings: Vec<Value>,
    raw: String,
}

impl Diagnosis {
    fn of(check: &str, findings: &[Value]) -> Vec<Value> {
        findings
            .iter()
            .filter(|f| f["check"] == check)
            .cloned()
            .collect()
    }

    fn with(&self, check: &str, severity: &str) -> Vec<Value> {
        Diagnosis::of(check, &self.findings)
            .into_iter()
            .filter(|f| f["severity"] == severity)
            .collect()
    }

    /// The one finding of `check` at `severity`, panicking with the whole report otherwise.
    fn one(&self, check: &str, severity: &str) -> Value {
        let found = self.with(check, severity);
        assert_eq!(
            found.len(),
            1,
            "expected one {severity} {check} finding:\n{}",
            self.raw
        );
        found.into_iter().next().unwrap()
    }

    fn none(&self, check: &str, severity: &str) {
        assert!(
            self.with(check, severity).is_empty(),
            "expected no {severity} {check} finding:\n{}",
            self.raw
        );
    }
}

/// The finding as one string (summary, evidence, fix), for "does it say X" checks.
fn text(finding: &Value) -> String {
    let evidence: Vec<&str> = finding["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    format!(
        "{}\n{}\n{}",
        finding["summary"].as_str().unwrap_or(""),
        evidence.join("\n"),
        finding["fix"].as_str().unwrap_or("")
    )
}

/// Runs `--doctor --output json` with `args`, inside `netns` when given (through `ip netns
/// exec`, which also gives it that namespace's /sys/class/net).
fn doctor(netns: Option<&Netns>, args: &[&str]) -> Diagnosis {
    let args = [&["--doctor", "--output", "json"], args].concat();
    let out = match netns {
        Some(ns) => cni::guard_in(ns, &args),
        None => cni::guard(&args),
    };
    diagnosis(out)
}

/// `doctor` on this machine with CNI_PATH set, where it looks for delegate primaries.
fn doctor_with_cni_path(cni_path: &str, args: &[&str]) -> Diagnosis {
    let args = [&["--doctor", "--output", "json"], args].concat();
    diagnosis(cni::guard_with_env(&args, &[("CNI_PATH", cni_path)]))
}

fn diagnosis(out: std::process::Output) -> Diagnosis {
    let raw = format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let body: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the report is not JSON ({e}): {raw}"));
    let findings = body["findings"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no findings array: {raw}"));
    Diagnosis {
        status: out.status.code().unwrap_or(-1),
        findings,
        raw,
    }
}

/// A conflist dir with one network named cni::NETWORK: testdata/conflists/<file>, its
/// sandbox-guard entry using `store`, its primary pointed at the test's links by `primary`.
fn conf_dir(store: &Store, file: &str, primary: impl FnOnce(&mut Value)) -> TempDir {
    let dir = TempDir::new("sgcnf");
    let use_store = |guard: &mut Value| {
        guard["stateDir"] = json!(store.state_dir);
        guard["logFile"] = json!(store.log_file);
    };
    let mut conflist = guarded_conflist(file, use_store, primary);
    conflist["name"] = json!(cni::NETWORK);
    std::fs::write(dir.path.join("10-net.conflist"), conflist.to_string()).unwrap();
    dir
}

fn path_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A namespace with the pod end of a veth named `eth0` in it, as a primary plugin leaves it.
/// The host end goes with the namespace.
fn pod_netns() -> Netns {
    let ns = Netns::new("sgdp");
    let host_end = sys::unique("sgh");
    sys::run(
        "ip",
        &[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ],
    );
    ns.exec(&["ip", "link", "set", "eth0", "up"]);
    ns
}

/// ADD of `container` for `pod` into `netns` with `address` as the primary's result.
fn add(store: &Store, container: &str, pod: &Pod, netns: &Netns, address: &str) -> cni::Cni {
    let netns_path = netns.path().to_string_lossy().into_owned();
    let mut result = prev_result_for(cni::LATEST_VERSION, container, "eth0", &netns_path);
    result["ips"][0]["address"] = json!(address);
    store
        .add(container, pod)
        .netns(&netns_path)
        .prev_result(&result)
}

/// `add` with every address of `addresses` in the result (a dual-stack ADD gives two).
fn add_with_addresses(
    store: &Store,
    container: &str,
    pod: &Pod,
    netns: &Netns,
    addresses: &[&str],
) -> cni::Cni {
    let netns_path = netns.path().to_string_lossy().into_owned();
    let mut result = prev_result_for(cni::LATEST_VERSION, container, "eth0", &netns_path);
    let template = result["ips"][0].clone();
    result["ips"] = addresses
        .iter()
        .map(|address| {
            let mut ip = template.clone();
            ip["address"] = json!(address);
            ip.as_object_mut().unwrap().remove("gateway");
            ip
        })
        .collect();
    store
        .add(container, pod)
        .netns(&netns_path)
        .prev_result(&result)
}

/// Gives `node` an uplink at `<net>.2/24` with the default route via `<net>.1`; returns its name.
fn add_uplink(node: &Netns, net: &str) -> String {
    let (uplink, far) = (sys::unique("sgu"), sys::unique("sgg"));
    node.exec(&[
        "ip", "link", "add", &uplink, "type", "veth", "peer", "name", &far,
    ]);
    node.exec(&["ip", "addr", "add", &format!("{net}.2/24"), "dev", &uplink]);
    node.exec(&["ip", "link", "set", &uplink, "up"]);
    node.exec(&["ip", "link", "set", &far, "up"]);
    node.exec(&["ip", "route", "add", "default", "via", &format!("{net}.1")]);
    uplink
}

/// A process kept in a namespace, killed on drop.
struct Resident(Child);

impl Resident {
    fn start(netns: &Netns) -> Resident {
        let child = Command::new("ip")
            .args(["netns", "exec", &netns.name, "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start sleep in the namespace");
        // Until `ip` has exec'd sleep inside the namespace, it is not in it.
        let target = std::fs::read_link("/proc/self/ns/net").unwrap();
        for _ in 0..200 {
            let now = std::fs::read_link(format!("/proc/{}/ns/net", child.id()));
            let comm =
                std::fs::read_to_string(format!("/proc/{}/comm", child.id())).unwrap_or_default();
            if now.is_ok_and(|n| n != target) && comm.trim() == "sleep" {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Resident(child)
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn macvlan_on_a_bridge_port_is_reported_as_device_busy() {
    sys::skip_unless_root!(TOOLS);
    // A namespace of its own: the links and /sys/class/net the doctor reads are the test's.
    let node = Netns::new("sgdn");
    let (lower, peer, bridge) = (sys::unique("sgl"), sys::unique("sgp"), sys::unique("sgb"));
    let (free, free_peer) = (sys::unique("sgf"), sys::unique("sgq"));
    node.exec(&[
        "ip", "link", "add", &lower, "type", "veth", "peer", "name", &peer,
    ]);
    node.exec(&[
        "ip", "link", "add", &free, "type", "veth", "peer", "name", &free_peer,
    ]);
    node.exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
    node.exec(&["ip", "link", "set", &lower, "master", &bridge]);
    for link in [&lower, &peer, &bridge, &free, &free_peer] {
        node.exec(&["ip", "link", "set", link, "up"]);
    }
    // What the doctor predicts is what the kernel does ("device or resource busy").
    let probe = Command::new("ip")
        .args([
            "netns", "exec", &node.name, "ip", "link", "add", "link", &lower, "name", "sgmv",
            "type", "macvlan", "mode", "bridge",
        ])
        .output()
        .unwrap();
    assert!(
        !probe.status.success(),
        "this kernel let a macvlan onto a bridge port"
    );
    assert!(
        String::from_utf8_lossy(&probe.stderr)
            .to_lowercase()
            .contains("busy"),
        "{probe:?}"
    );

    let store = Store::new();
    let conf = conf_dir(&store, "macvlan-host-local.conflist", |macvlan| {
        macvlan["master"] = json!(lower)
    });
    let other = TempDir::new("sgcnf");
    std::fs::write(other.path.join("20-free.conflist"),
        json!({"cniVersion": "1.0.0", "name": "free", "plugins": [{"type": "ipvlan", "master": free}]}).to_string()).unwrap();
    std::fs::copy(
        conf.path.join("10-net.conflist"),
        other.path.join("10-net.conflist"),
    )
    .unwrap();

    let report = doctor(Some(&node), &["--conf-dir", path_arg(&other.path)]);
    assert_eq!(
        report.status, 1,
        "an error must make the exit status 1:\n{}",
        report.raw
    );
    let busy = text(&report.one("lower-link", "error"));
    assert!(busy.contains(&format!("macvlan on {lower} will fail with \"device or resource busy\": {lower} is a slave of {bridge} (a bridge)")), "{busy}");
    assert!(
        busy.contains(&format!("ip link set {lower} nomaster")),
        "the fix must say how to free it: {busy}"
    );
    let fine = text(&report.one("lower-link", "ok"));
    assert!(
        fine.contains(&free),
        "the free ipvlan master is fine: {fine}"
    );
}

#[test]
fn a_node_without_default_route_cannot_reach_cluster_ips() {
    sys::skip_unless_root!(TOOLS);
    let node = Netns::new("sgdr");
    let conf = TempDir::new("sgcnf");
    let store = Store::new();
    let args = [
        "--conf-dir",
        path_arg(&conf.path),
        "--state-dir",
        path_arg(&store.state_dir),
    ];

    let report = doctor(Some(&node), &args);
    assert_eq!(report.status, 1, "{}", report.raw);
    let unreachable = text(&report.one("service-route", "error"));
    for needed in [
        "10.96.0.1",
        "10.96.0.0/12",
        "unreachable",
        "no default route",
        "DNAT",
        "ip route add 10.96.0.0/12",
    ] {
        assert!(
            unreachable.contains(needed),
            "the finding must mention {needed:?}: {unreachable}"
        );
    }

    // An uplink with a default route makes ClusterIPs routable again.
    let uplink = add_uplink(&node, "192.168.213");
    let report = doctor(Some(&node), &args);
    report.none("service-route", "error");
    let routed = text(&report.one("service-route", "ok"));
    assert!(
        routed.contains(&format!("default via 192.168.213.1 dev {uplink}")),
        "{routed}"
    );
}

#[test]
fn a_failed_add_leaves_the_address_to_its_live_holder_in_the_index() {
    sys::skip_unless_root!(&["ip", "sleep", "strace"]);
    let store = Store::new();
    let (ns_a, ns_x, ns_c) = (pod_netns(), pod_netns(), pod_netns());
    let (a, x, c) = (container_id(), container_id(), container_id());
    add(
        &store,
        &a,
        &Pod::new("shop", "cart-0"),
        &ns_a,
        "10.77.2.5/24",
    )
    .run()
    .assert_ok();

    // The IPAM hands A's address to X too, and X's ADD fails in the store (the kernel refuses
    // its ownership, after its record: the first symlink it makes, or the first rename where
    // the file system has no journal and the ownership is a regular file): X took nothing, so
    // the index must still name A.
    let links = "symlink,symlinkat,rename,renameat,renameat2";
    add(
        &store,
        &x,
        &Pod::new("shop", "cart-1"),
        &ns_x,
        "10.77.2.5/24",
    )
    .wrapped_in(&[
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        &format!("trace={links}"),
        "-e",
        &format!("inject={links}:error=EIO:when=1"),
    ])
    .run()
    .assert_cni_error();
    assert!(
        store.entry(&x, "eth0").is_none(),
        "the failed ADD left a record"
    );

    let error = add(
        &store,
        &c,
        &Pod::new("shop", "cart-2"),
        &ns_c,
        "10.77.2.5/24",
    )
    .config("ipConflict", Some(json!("refuse")))
    .run()
    .assert_error(102);
    assert!(
        error.text().contains(&a),
        "the conflict must name the live holder {a}, not the failed ADD's sandbox: {error:?}"
    );
}

#[test]
fn multipath_and_reject_routes_are_read_as_ip_route_shows_them() {
    sys::skip_unless_root!(TOOLS);
    let node = Netns::new("sgdr");
    let store = Store::new();
    let (up1, up2) = (sys::unique("sgu"), sys::unique("sgu"));
    for (up, net) in [(&up1, "192.168.214"), (&up2, "192.168.215")] {
        let far = sys::unique("sgg");
        node.exec(&[
            "ip", "link", "add", up, "type", "veth", "peer", "name", &far,
        ]);
        node.exec(&["ip", "addr", "add", &format!("{net}.2/24"), "dev", up]);
        node.exec(&["ip", "link", "set", up, "up"]);
        node.exec(&["ip", "link", "set", &far, "up"]);
    }
    node.exec(&[
        "ip",
        "route",
        "add",
        "default",
        "nexthop",
        "via",
        "192.168.214.1",
        "dev",
        &up1,
        "nexthop",
        "via",
        "192.168.215.1",
        "dev",
        &up2,
    ]);
    node.exec(&["ip", "route", "add", "unreachable", "10.96.0.0/12"]);

    // A macvlan without "master" takes the default route's device: the first next hop's.
    let conf = conf_dir(&store, "macvlan-host-local.conflist", |macvlan| {
        macvlan.as_object_mut().unwrap().remove("master");
    });
    let report = doctor(
        Some(&node),
        &[
            "--conf-dir",
            path_arg(&conf.path),
            "--state-dir",
            path_arg(&store.state_dir),
        ],
    );
    let lower = text(&report.one("lower-link", "ok"));
    assert!(
        lower.contains(&up1),
        "the multipath default route's first device is the lower link: {}",
        report.raw
    );
    // The reject route is what makes the service CIDR unreachable, and the evidence says so.
    let service = text(&report.one("service-route", "error"));
    assert!(
        service.contains("unreachable 10.96.0.0/12"),
        "{}",
        report.raw
    );
}

#[test]
fn two_namespaces_with_one_address_are_a_conflict() {
    sys::skip_unless_root!(TOOLS);
    let store = Store::new();
    let (ns_a, ns_b, ns_c) = (pod_netns(), pod_netns(), pod_netns());
    let (a, b, c) = (container_id(), container_id(), container_id());
    let (pod_a, pod_b, pod_c) = (
        Pod::new("shop", "cart-0"),
        Pod::new("shop", "cart-1"),
        Pod::new("shop", "cart-2"),
    );
    add(&store, &a, &pod_a, &ns_a, "10.77.0.5/24")
        .run()
        .assert_ok();

    // Default "warn": the ADD passes and says why it should not have been needed.
    let warned = add(&store, &b, &pod_b, &ns_b, "10.77.0.5/24").run();
    warned.assert_ok();
    assert!(
        warned.stderr.contains("IP conflict") && warned.stderr.contains(&a),
        "{}",
        warned.stderr
    );
    // In the ADD's one log line, at WARN.
    let line = store
        .log_lines()
        .into_iter()
        .find(|l| l.container == b)
        .expect("a log line for the ADD");
    assert!(
        line.outcome == cni::Outcome::Added
            && line.level == "WARN"
            && line.raw.contains("IP conflict"),
        "{line:?}"
    );

    // "refuse": the ADD fails naming the sandbox, pod and netns that hold the address, and
    // takes nothing.
    let error = add(&store, &c, &pod_c, &ns_c, "10.77.0.5/24")
        .config("ipConflict", Some(json!("refuse")))
        .run()
        .assert_error(102);
    let said = error.text();
    for needed in [
        b.as_str(),
        "shop/cart-1",
        path_arg(&ns_b.path()),
        "10.77.0.5",
    ] {
        assert!(
            said.contains(needed),
            "the refusal must name {needed}: {said}"
        );
    }
    assert!(
        store.entry(&c, "eth0").is_none(),
        "a refused ADD leaves no record"
    );
    // Another address passes in refuse mode.
    add(&store, &c, &pod_c, &ns_c, "10.77.0.6/24")
        .config("ipConflict", Some(json!("refuse")))
        .run()
        .assert_ok();

    let conf = conf_dir(&store, "bridge-host-local.conflist", |_| {});
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    assert_eq!(report.status, 1, "{}", report.raw);
    let conflict = text(&report.one("ip-conflict", "error"));
    for needed in [
        a.as_str(),
        b.as_str(),
        "10.77.0.5",
        "shop/cart-0",
        "shop/cart-1",
    ] {
        assert!(
            conflict.contains(needed),
            "the conflict must name {needed}: {conflict}"
        );
    }
    assert!(!conflict.contains(&c), "{conflict}");

    // An interface gone from a live sandbox (the CHECK of the restore issue).
    ns_c.exec(&["ip", "link", "delete", "eth0"]);
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    let missing = text(&report.one("sandbox-interfaces", "error"));
    assert!(
        missing.contains(&c) && missing.contains("eth0") && missing.contains("--restore"),
        "{missing}"
    );
}

#[test]
fn a_namespace_that_outlives_its_del_still_holds_the_address() {
    sys::skip_unless_root!(TOOLS);
    let store = Store::new();
    let conf = conf_dir(&store, "bridge-host-local.conflist", |_| {});
    let ns_old = pod_netns();
    let ns_new = pod_netns();
    let (old, new) = (container_id(), container_id());
    let (pod_old, pod_new) = (Pod::new("pay", "api-7d9f"), Pod::new("pay", "api-5c2a"));
    add(&store, &old, &pod_old, &ns_old, "10.77.1.5/24")
        .run()
        .assert_ok();
    // The pod is force-deleted; its DEL passes but the namespace stays.
    store
        .del(&old, &pod_old)
        .netns(path_arg(&ns_old.path()))
        .run()
        .assert_ok();

    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    assert_eq!(report.status, 1, "{}", report.raw);
    let leaked = text(&report.one("deleted-netns", "error"));
    for needed in [old.as_str(), "pay/api-7d9f", "10.77.1.5", "still mounted"] {
        assert!(
            leaked.contains(needed),
            "the finding must name {needed}: {leaked}"
        );
    }

    // The IPAM hands the address out again: "refuse" stops the ADD before the pod breaks.
    let error = add(&store, &new, &pod_new, &ns_new, "10.77.1.5/24")
        .config("ipConflict", Some(json!("refuse")))
        .run()
        .assert_error(102);
    assert!(
        error.msg.contains(&old) && error.msg.contains("deleted"),
        "{error:?}"
    );

    // Unmounted, but a process is still in it (the D-state container): found by inode.
    let resident = Resident::start(&ns_old);
    sys::run("ip", &["netns", "delete", &ns_old.name]);
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    let held = text(&report.one("deleted-netns", "error"));
    assert!(
        held.contains("unmounted")
            && held.contains(&format!("pid {}", resident.0.id()))
            && held.contains("sleep"),
        "{held}"
    );

    // Once the last process is gone, so is the finding.
    drop(resident);
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    report.none("deleted-netns", "error");
    report.one("deleted-netns", "ok");
}

/// A DEL rule 7 holds (chained mode) takes its sandbox's interface out on purpose: the old
/// sandbox's recorded address is then in use nowhere, and a new sandbox of the name given it
/// again (a sticky-IP primary) is no conflict. While the interface is still there (its removal
/// skipped: no netns cookie, an identity mismatch) it is one; and an unheld record's address
/// counts whether or not its interface is there, as before.
#[test]
fn a_held_records_address_conflicts_only_while_its_interface_is_there() {
    sys::skip_unless_root!(TOOLS);
    let store = Store::new();
    let conf = conf_dir(&store, "bridge-host-local.conflist", |_| {});
    let (ns_old, ns_new) = (pod_netns(), pod_netns());
    let (old, new) = (container_id(), container_id());
    // One name, two pods (each `Pod::new` is a new UID).
    let (pod_old, pod_new) = (Pod::new("shop", "db-0"), Pod::new("shop", "db-0"));
    add(&store, &old, &pod_old, &ns_old, "10.77.3.5/24")
        .run()
        .assert_ok();
    add(&store, &new, &pod_new, &ns_new, "10.77.3.5/24")
        .run()
        .assert_ok();
    let conflict = |report: &Diagnosis| {
        report
            .with("ip-conflict", "error")
            .iter()
            .map(text)
            .any(|t| t.contains(&old) && t.contains(&new))
    };
    let args = ["--conf-dir", path_arg(&conf.path)];
    // Not held, its interface taken out by hand: the recorded address still counts.
    ns_old.exec(&["ip", "link", "delete", "eth0"]);
    assert!(
        conflict(&doctor(None, &args)),
        "an unheld record's address stopped counting"
    );
    ns_old.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ]);
    // Held, as rule 7 leaves a chained record, its interface still there: a conflict.
    let library =
        sandbox_guard::state::Store::open(&store.state_dir, std::time::Duration::from_secs(5))
            .unwrap();
    let path = store.record_path("k8s-pod-network", &old, "eth0");
    let sandbox_guard::state::Loaded::Valid(mut record) = library.load_record_at(&path) else {
        panic!("the old sandbox's record does not read back")
    };
    record.held = Some(sandbox_guard::state::held::MovedTo {
        pod_uid: pod_new.uid.clone(),
        node: Some("node-b".into()),
        kubeconfig: store.state_dir.join("kubeconfig"),
        scope: "node".into(),
        this_node: "node-a".into(),
    });
    library.save_record(&record).unwrap();
    drop(library);
    let report = doctor(None, &args);
    assert!(conflict(&report), "{}", report.raw);
    let held = text(&report.one("held-by-api", "warning"));
    assert!(held.contains("is still in netns"), "{held}");
    // Taken out, as the hold does: no conflict.
    ns_old.exec(&["ip", "link", "delete", "eth0"]);
    let report = doctor(None, &args);
    assert!(!conflict(&report), "{}", report.raw);
    let held = text(&report.one("held-by-api", "warning"));
    assert!(
        held.contains(&old) && !held.contains("is still in netns"),
        "{held}"
    );
}

#[test]
fn stale_dels_are_reported_per_pod_with_the_owner_they_protected() {
    sys::skip_unless_root!(TOOLS);
    let store = Store::new();
    let conf = conf_dir(&store, "bridge-host-local.conflist", |_| {});
    let (a, b) = (container_id(), container_id());
    let (pod_a, pod_b) = (
        Pod::new("lijiaob", "etcd1-0"),
        Pod::new("lijiaob", "etcd1-0"),
    );
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    for _ in 0..3 {
        store.del(&a, &pod_a).run().assert_error(11);
    }
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    let stale = text(&report.one("stale-dels", "warning"));
    for needed in [
        "lijiaob/etcd1-0",
        "3 stale DELs refused",
        &b[..13],
        &a[..13],
    ] {
        assert!(
            stale.contains(needed),
            "the finding must name {needed}: {stale}"
        );
    }

    // Once the owner is gone the refusals are history, not a warning.
    store.del(&b, &pod_b).run().assert_ok();
    store.del(&a, &pod_a).run().assert_ok();
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    report.none("stale-dels", "warning");
    assert!(
        text(&report.one("stale-dels", "info")).contains("history"),
        "{}",
        report.raw
    );
}

#[test]
fn a_clean_node_reports_clean() {
    sys::skip_unless_root!(TOOLS);
    let node = Netns::new("sgdc");
    let uplink = add_uplink(&node, "192.168.214");

    let store = Store::new();
    let conf = conf_dir(&store, "macvlan-host-local.conflist", |macvlan| {
        macvlan["master"] = json!(uplink)
    });
    let pod_ns = pod_netns();
    add(
        &store,
        &container_id(),
        &Pod::new("web", "front-0"),
        &pod_ns,
        "10.77.2.5/24",
    )
    .run()
    .assert_ok();

    let report = doctor(Some(&node), &["--conf-dir", path_arg(&conf.path)]);
    // The test's state dir lies on this machine's file system, whose journal is the machine's,
    // not the node's CNI: a warning about it is allowed here (tests/durability.rs makes both
    // kinds of file system and checks that warning). macvlan with host-local keys its DEL by
    // container ID: that the guard is not needed there is a note the doctor must give.
    let not_needed = |f: &&Value| {
        f["check"] == "primary-need"
            && f["severity"] == "info"
            && f["verdict"]["need"] == "not-needed"
            && f["verdict"]["primary"] == "macvlan with host-local"
    };
    assert_eq!(
        report.findings.iter().filter(not_needed).count(),
        1,
        "{}",
        report.raw
    );
    let bad: Vec<&Value> = report
        .findings
        .iter()
        .filter(|f| f["severity"] != "ok")
        .filter(|f| !(f["check"] == "store-journal" && f["severity"] == "warning"))
        .filter(|f| !not_needed(f))
        .collect();
    assert!(
        bad.is_empty(),
        "a clean node must report clean:\n{}",
        report.raw
    );
    assert_eq!(report.status, 0, "{}", report.raw);
    for check in [
        "cni-config",
        "lower-link",
        "service-route",
        "store-permissions",
        "store-checksums",
        "sandbox-netns",
        "ip-conflict",
        "deleted-netns",
        "sandbox-interfaces",
        "stale-dels",
    ] {
        report.one(check, "ok");
    }
}

/// The conflists real primaries ship, sandbox-guard chained last (testdata/conflists/), each
/// alone in a conf dir: the doctor reads every shape as one guarded network and finds the
/// lower link a macvlan sits on; the broken ones it reports with what to do.
#[test]
fn the_conflists_of_real_primaries_are_read_as_guarded() {
    let store = Store::new();
    let state_args = [
        "--state-dir",
        path_arg(&store.state_dir),
        "--log-file",
        path_arg(&store.log_file),
    ];
    for file in fixtures_in("conflists") {
        let conf = conf_dir(&store, file.strip_prefix("conflists/").unwrap(), |_| {});
        let report = doctor(
            None,
            &[&["--conf-dir", path_arg(&conf.path)], &state_args[..]].concat(),
        );
        report.none("cni-config", "error");
        let read = text(&report.one("cni-config", "ok"));
        assert!(
            read.contains("1 CNI config files") && read.contains("1 networks guarded"),
            "{file}: {read}"
        );
        if file.contains("macvlan") {
            let lower: Vec<Value> = Diagnosis::of("lower-link", &report.findings);
            assert!(
                lower.iter().any(|f| text(f).contains("eth1")),
                "{file}: the macvlan's master is checked:\n{}",
                report.raw
            );
        }
    }
    for (file, says) in [
        ("broken/truncated.conflist", "not valid JSON"),
        ("broken/guard-not-last.conflist", "must be LAST"),
    ] {
        let conf = TempDir::new("sgcnf");
        std::fs::copy(
            fixture_path(&format!("conflists/{file}")),
            conf.path.join("10-net.conflist"),
        )
        .unwrap();
        let report = doctor(
            None,
            &[&["--conf-dir", path_arg(&conf.path)], &state_args[..]].concat(),
        );
        let broken = text(&report.one("cni-config", "error"));
        assert!(broken.contains(says), "{file}: {broken}");
    }
}

/// `ipConflict` and the doctor's ip-conflict finding with IPv6: a dual-stack sandbox whose
/// IPv6 address the IPAM hands out again (its IPv4 one not) is found as an IPv4 conflict is,
/// and an address written another way (`fd77:0:0::5`) is the same address.
#[test]
fn an_ipv6_address_of_a_dual_stack_sandbox_conflicts_as_an_ipv4_one_does() {
    sys::skip_unless_root!(TOOLS);
    let store = Store::new();
    let (ns_a, ns_b, ns_c) = (pod_netns(), pod_netns(), pod_netns());
    let (a, b, c) = (container_id(), container_id(), container_id());
    let (pod_a, pod_b, pod_c) = (
        Pod::new("shop", "cart-0"),
        Pod::new("shop", "cart-1"),
        Pod::new("shop", "cart-2"),
    );
    add_with_addresses(&store, &a, &pod_a, &ns_a, &["10.77.3.5/24", "fd77::5/64"])
        .run()
        .assert_ok();

    let error = add_with_addresses(
        &store,
        &c,
        &pod_c,
        &ns_c,
        &["10.77.3.6/24", "fd77:0:0::5/64"],
    )
    .config("ipConflict", Some(json!("refuse")))
    .run()
    .assert_error(102);
    let said = error.text();
    for needed in [a.as_str(), "shop/cart-0", path_arg(&ns_a.path()), "fd77::5"] {
        assert!(
            said.contains(needed),
            "the refusal must name {needed}: {said}"
        );
    }
    assert!(
        !said.contains("10.77.3.6"),
        "only the IPv6 address is held by another sandbox: {said}"
    );
    assert!(
        store.entry(&c, "eth0").is_none(),
        "a refused ADD leaves no record"
    );

    // An IPv6-only ADD given the same address, in "warn" mode: it passes, and the doctor
    // names both holders.
    let warned = add_with_addresses(&store, &b, &pod_b, &ns_b, &["fd77::5/64"]).run();
    warned.assert_ok();
    assert!(
        warned.stderr.contains("IP conflict") && warned.stderr.contains(&a),
        "{}",
        warned.stderr
    );
    let conf = conf_dir(&store, "bridge-host-local.conflist", |_| {});
    let report = doctor(None, &["--conf-dir", path_arg(&conf.path)]);
    let conflict = text(&report.one("ip-conflict", "error"));
    for needed in [
        a.as_str(),
        b.as_str(),
        "fd77::5",
        "shop/cart-0",
        "shop/cart-1",
    ] {
        assert!(
            conflict.contains(needed),
            "the conflict must name {needed}: {conflict}"
        );
    }
}

/// The service-route check per family: with an IPv6 (or dual-stack) service range, a node
/// without an IPv6 default route is told so for that range, and one with it is not, whatever
/// IPv4 says.
#[test]
fn an_ipv6_service_range_needs_an_ipv6_route() {
    sys::skip_unless_root!(TOOLS);
    let node = Netns::new("sgdr");
    let conf = TempDir::new("sgcnf");
    let store = Store::new();
    let args = [
        "--conf-dir",
        path_arg(&conf.path),
        "--state-dir",
        path_arg(&store.state_dir),
        "--service-cidr",
        "10.96.0.0/12",
        "--service-cidr",
        "fd00:10:96::/112",
    ];
    let of_range = |report: &Diagnosis, range: &str, severity: &str| -> String {
        let found: Vec<String> = report
            .with("service-route", severity)
            .iter()
            .map(text)
            .filter(|t| t.contains(range))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one {severity} service-route finding for {range}:\n{}",
            report.raw
        );
        found[0].clone()
    };

    let report = doctor(Some(&node), &args);
    assert_eq!(report.status, 1, "{}", report.raw);
    let unreachable = of_range(&report, "fd00:10:96::/112", "error");
    for needed in [
        "fd00:10:96::1",
        "no default route",
        "ip route add fd00:10:96::/112",
    ] {
        assert!(
            unreachable.contains(needed),
            "the finding must mention {needed:?}: {unreachable}"
        );
    }
    of_range(&report, "10.96.0.0/12", "error");

    // An IPv6 uplink only: the IPv6 range is routable, the IPv4 one still is not.
    let (uplink, far) = (sys::unique("sgu"), sys::unique("sgg"));
    node.exec(&[
        "ip", "link", "add", &uplink, "type", "veth", "peer", "name", &far,
    ]);
    node.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00:213::2/64",
        "dev",
        &uplink,
        "nodad",
    ]);
    node.exec(&["ip", "link", "set", &uplink, "up"]);
    node.exec(&["ip", "link", "set", &far, "up"]);
    node.exec(&[
        "ip",
        "-6",
        "route",
        "add",
        "default",
        "via",
        "fd00:213::1",
        "dev",
        &uplink,
    ]);
    let report = doctor(Some(&node), &args);
    let routed = of_range(&report, "fd00:10:96::/112", "ok");
    assert!(
        routed.contains(&format!("default via fd00:213::1 dev {uplink}"))
            && routed.contains("fd00:213::2"),
        "{routed}"
    );
    of_range(&report, "10.96.0.0/12", "error");
}

/// A conf dir with testdata/conflists/<file> at `version`, its guard on `store`.
fn conf_dir_at_version(store: &Store, file: &str, version: &str) -> TempDir {
    let dir = TempDir::new("sgcnf");
    let mut conf = testdata::fixture_json(&format!("conflists/{file}"));
    conf["cniVersion"] = json!(version);
    conf["name"] = json!(cni::NETWORK);
    for plugin in conf["plugins"].as_array_mut().unwrap() {
        if plugin["type"] == "sandbox-guard" {
            plugin["stateDir"] = json!(store.state_dir);
            plugin["logFile"] = json!(store.log_file);
        }
    }
    std::fs::write(dir.path.join("10-net.conflist"), conf.to_string()).unwrap();
    dir
}

/// The doctor names a network the guard cannot run at all (a cniVersion it does not speak)
/// and, in delegate mode, one whose primary does not list the network's cniVersion in its
/// VERSION answer (Debian's reference plugins stop at 1.0.0).
#[test]
fn networks_whose_version_the_guard_or_the_primary_cannot_run_are_named() {
    sys::skip_unless_tools!(&["/usr/lib/cni/bridge"]);
    let store = Store::new();
    let state_args = [
        "--state-dir",
        path_arg(&store.state_dir),
        "--log-file",
        path_arg(&store.log_file),
    ];
    let run = |file: &str, version: &str, cni_path: &str| {
        let conf = conf_dir_at_version(&store, file, version);
        doctor_with_cni_path(
            cni_path,
            &[&["--conf-dir", path_arg(&conf.path)], &state_args[..]].concat(),
        )
    };

    for version in ["0.1.0", "0.2.0", "1.0.0"] {
        let report = run(
            "delegate/bridge-host-local.conflist",
            version,
            "/usr/lib/cni",
        );
        report.none("cni-config", "error");
        assert!(
            text(&report.one("primary-version", "ok")).contains(version),
            "{}",
            report.raw
        );
    }

    let report = run(
        "delegate/bridge-host-local.conflist",
        "1.1.0",
        "/usr/lib/cni",
    );
    let error = text(&report.one("primary-version", "error"));
    assert!(
        error.contains("bridge does not speak the network's cniVersion 1.1.0"),
        "{error}"
    );
    assert!(
        error.contains("lists 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0"),
        "{error}"
    );
    assert_eq!(report.status, 1, "{}", report.raw);

    for file in [
        "bridge-host-local.conflist",
        "delegate/bridge-host-local.conflist",
    ] {
        let report = run(file, "1.2.0", "/usr/lib/cni");
        let error = text(&report.one("cni-config", "error"));
        assert!(
            error.contains("cniVersion \"1.2.0\", which sandbox-guard does not speak"),
            "{file}: {error}"
        );
        report.none("primary-version", "error");
    }

    let empty = TempDir::new("sgbin");
    let report = run(
        "delegate/bridge-host-local.conflist",
        "1.0.0",
        path_arg(&empty.path),
    );
    assert!(
        text(&report.one("primary-version", "warning")).contains("cannot ask the primary bridge"),
        "{}",
        report.raw
    );
}

/// A conf dir with one delegate-mode network at 0.1.0 whose primary is `primary_type`.
fn conf_dir_with_primary(store: &Store, primary_type: &str) -> TempDir {
    let dir = TempDir::new("sgcnf");
    let conf = json!({"cniVersion": "0.1.0", "name": cni::NETWORK, "plugins": [
        {"type": "sandbox-guard", "stateDir": store.state_dir, "logFile": store.log_file, "delegate": {"type": primary_type}}
    ]});
    std::fs::write(dir.path.join("10-net.conflist"), conf.to_string()).unwrap();
    dir
}

fn write_script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A primary's VERSION may leave a process behind that keeps its stdout open (a plugin that
/// starts its daemon on first use, a shell wrapper's background job). The doctor's 5 s bound
/// must hold all the same: it is what an operator runs while the node is on fire.
#[test]
fn a_primary_whose_version_leaves_a_process_holding_stdout_does_not_hang_the_doctor() {
    let store = Store::new();
    let bin = TempDir::new("sgbin");
    write_script(
        &bin.path,
        "daemonizing",
        r#"sleep 25 &
echo '{"cniVersion":"0.2.0","supportedVersions":["0.1.0","0.2.0"]}'"#,
    );
    let conf = conf_dir_with_primary(&store, "daemonizing");
    let started = std::time::Instant::now();
    let report = doctor_with_cni_path(
        path_arg(&bin.path),
        &[
            "--conf-dir",
            path_arg(&conf.path),
            "--state-dir",
            path_arg(&store.state_dir),
            "--log-file",
            path_arg(&store.log_file),
        ],
    );
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(12),
        "the doctor took {took:?}: {}",
        report.raw
    );
    assert!(
        text(&report.one("primary-version", "ok")).contains("0.1.0"),
        "{}",
        report.raw
    );
}

/// The doctor runs what the guard would run and nothing else: the guard refuses a
/// `delegate.type` that is a path (libcni's FindInPath too), so the doctor must not run it.
#[test]
fn the_doctor_never_runs_a_delegate_type_that_is_a_path() {
    let store = Store::new();
    let bin = TempDir::new("sgbin");
    let marker = bin.path.join("ran");
    let script = write_script(
        &bin.path,
        "not-a-plugin",
        &format!(
            "touch {}\necho '{{\"cniVersion\":\"0.2.0\",\"supportedVersions\":[\"0.1.0\"]}}'",
            marker.display()
        ),
    );
    let conf = conf_dir_with_primary(&store, path_arg(&script));
    let empty = TempDir::new("sgbin");
    let report = doctor_with_cni_path(
        path_arg(&empty.path),
        &[
            "--conf-dir",
            path_arg(&conf.path),
            "--state-dir",
            path_arg(&store.state_dir),
            "--log-file",
            path_arg(&store.log_file),
        ],
    );
    assert!(
        !marker.exists(),
        "the doctor ran {}: {}",
        script.display(),
        report.raw
    );
}

/// The doctor says per network whether its primary needs the guard, calico's by the version
/// its own binary prints (`-v`), with stand-ins answering as calico-cni v1.6.2 (calico
/// 2.1.3), calico v3.17.2 and v3.26.1 do; an unknown primary is to be audited first.
#[test]
fn the_doctor_names_whether_each_primary_needs_the_guard() {
    // (what -v prints, datastore_type, IPAM, the verdict, its mode)
    for (release, datastore, ipam, need, mode) in [
        (
            "v1.6.2",
            Some("etcdv2"),
            "calico-ipam",
            "needed",
            Some("delegate"),
        ),
        // calico-cni v1.x deletes the endpoint by namespace.pod whatever the IPAM.
        (
            "v1.6.2",
            Some("etcdv2"),
            "host-local",
            "needed",
            Some("delegate"),
        ),
        (
            "v1.11.8",
            Some("kubernetes"),
            "host-local",
            "not-needed",
            None,
        ),
        (
            "v3.17.2",
            Some("kubernetes"),
            "calico-ipam",
            "needed",
            Some("delegate"),
        ),
        // From 3.17 no datastore_type and no etcd endpoint is the Kubernetes datastore.
        ("v3.17.2", None, "calico-ipam", "needed", Some("delegate")),
        ("v3.17.2", Some("etcdv3"), "calico-ipam", "not-needed", None),
        (
            "v3.26.1",
            Some("kubernetes"),
            "calico-ipam",
            "not-needed",
            None,
        ),
        ("", Some("kubernetes"), "calico-ipam", "unknown", None),
    ] {
        let dir = TempDir::new("sgneed");
        let (conf, bin) = (dir.path.join("net.d"), dir.path.join("bin"));
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        install::copy_fixture("install/calico/conf", &conf);
        let file = conf.join("10-calico.conflist");
        let mut list: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        match datastore {
            Some(kind) => list["plugins"][0]["datastore_type"] = json!(kind),
            None => {
                list["plugins"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("datastore_type");
            }
        }
        list["plugins"][0]["ipam"]["type"] = json!(ipam);
        std::fs::write(&file, list.to_string()).unwrap();
        if !release.is_empty() {
            install::calico_stand_in(&bin, release);
        }
        let found = doctor(
            None,
            &[
                "--conf-dir",
                conf.to_str().unwrap(),
                "--bin-dir",
                bin.to_str().unwrap(),
                "--runtime-socket",
                "none",
                "--state-dir",
                dir.path.join("state").to_str().unwrap(),
            ],
        );
        let case = format!("calico {release:?} on {datastore:?} with {ipam}");
        let verdicts: Vec<&Value> = found
            .findings
            .iter()
            .filter(|f| f["check"] == "primary-need")
            .collect();
        assert_eq!(verdicts.len(), 1, "{case}: {}", found.raw);
        let verdict = &verdicts[0]["verdict"];
        assert_eq!(verdict["need"], need, "{case}: {}", found.raw);
        assert_eq!(verdict["mode"].as_str(), mode, "{case}: {}", found.raw);
        if !release.is_empty() {
            let primary = verdict["primary"].as_str().unwrap();
            assert!(
                primary.starts_with("calico") && primary.contains(release),
                "{case}: {}",
                found.raw
            );
            assert!(
                verdict["read"].to_string().contains("-v printed"),
                "{case}: {}",
                found.raw
            );
        }
        assert!(!verdict["source"].as_str().unwrap().is_empty(), "{case}");
    }
    // A primary the table does not know: audit first, whatever it prints.
    let dir = TempDir::new("sgneedx");
    std::fs::write(
        dir.path.join("10-sticky.conflist"),
        json!({"cniVersion": "1.0.0", "name": "sticky", "plugins": [{"type": "sticky-ip"}]})
            .to_string(),
    )
    .unwrap();
    let found = doctor(
        None,
        &[
            "--conf-dir",
            dir.path.to_str().unwrap(),
            "--bin-dir",
            dir.path.to_str().unwrap(),
            "--runtime-socket",
            "none",
            "--state-dir",
            dir.path.join("state").to_str().unwrap(),
        ],
    );
    let verdict = found
        .findings
        .iter()
        .find(|f| f["check"] == "primary-need")
        .unwrap_or_else(|| panic!("{}", found.raw));
    assert_eq!(verdict["verdict"]["need"], "unknown", "{}", found.raw);
    assert!(
        verdict["fix"].as_str().unwrap().contains("audit"),
        "{}",
        found.raw
    );
}
