//! Delegate mode at the CNI protocol level: the guard wraps a primary that records what
//! reaches it (tests/primaries/recording-plugin), run as a runtime runs it. What the primary
//! is given, and when, is the subject: its stdin, its errors passed on, the stale DEL kept
//! from it and replayed once the pod's name is free, the late ADD it never sees, and its
//! CHECK, GC and STATUS going first.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/mount.rs"]
mod mount;

use cni::{Incident, Store, container_id};
use primary::RecordingPrimary;
use serde_json::{Value, json};

/// The incident's cast with a primary to wrap.
fn incident() -> (Incident, RecordingPrimary) {
    (Incident::of("lijiaob", "etcd1-0"), RecordingPrimary::new())
}

/// ADD A, ADD B of the same pod, then A's StopPodSandbox DEL: deferred.
fn incident_deferred() -> (Incident, RecordingPrimary) {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    (i, primary)
}

fn deferred(store: &Store) -> Vec<Value> {
    store.dump().into_iter().filter(|row| row["status"] == "deferred").collect()
}

fn outcomes(store: &Store) -> Vec<(String, String)> {
    store.log_lines().into_iter().map(|l| (l.outcome, l.container)).collect()
}

#[test]
fn add_hands_the_primary_its_own_object_and_returns_its_result_unchanged() {
    let (i, primary) = incident();
    let delegate = primary.delegate(json!({"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]]}, "mtu": 1400}));
    // A field no version of the spec knows must survive, byte for byte.
    let result = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"02:00:00:00:00:0a","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.22.0.9/24","interface":0}],"dns":{},"vendor.example/extra":{"k":[1,2]}}"#;
    primary.answer_add(&i.a, result);
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).config("delegate", Some(delegate)).run();
    reply.assert_ok();
    assert_eq!(reply.stdout.trim_end(), result, "the primary's result must reach the runtime as it wrote it");

    let stdin = primary.stdin("ADD", &i.a);
    assert_eq!(stdin["name"], cni::NETWORK);
    assert_eq!(stdin["cniVersion"], cni::LATEST_VERSION);
    assert_eq!(stdin["type"], primary::TYPE);
    assert_eq!(stdin["mtu"], 1400);
    assert_eq!(stdin["ipam"]["type"], "host-local");
    assert_eq!(stdin["stateDir"], json!(primary.state_dir), "the primary's own stateDir, not the guard's");
    for key in ["logFile", "staleDel", "delegate", "prevResult"] {
        assert!(stdin.get(key).is_none(), "the guard's {key} must not reach the primary: {stdin}");
    }
    assert!(i.store.is_owner(&i.a, "eth0"), "the ADD is checkpointed and owns the pod");
}

#[test]
fn a_primary_error_reaches_the_runtime_as_the_primary_wrote_it_and_nothing_is_recorded() {
    let (i, primary) = incident();
    let error = json!({"cniVersion": "1.1.0", "code": 100, "msg": "error getting ClusterInformation: connection refused", "details": "calico-node not ready"});
    primary.fail("ADD", &i.a, &error);
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).run();
    let err = reply.assert_error(100);
    assert_eq!(reply.json(), error);
    assert_eq!(err.details, "calico-node not ready");
    assert!(i.store.dump().is_empty(), "a failed ADD records nothing: {:?}", i.store.dump());
}

#[test]
fn a_delegate_that_is_not_in_cni_path_is_an_invalid_config() {
    let (i, primary) = incident();
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).env("CNI_PATH", Some("/nonexistent")).run();
    let err = reply.assert_error(7);
    assert!(err.msg.contains(primary::TYPE) && err.text().contains("CNI_PATH"), "{err:?}");
}

#[test]
fn a_stale_del_succeeds_without_the_primary_and_is_replayed_once_the_owner_goes() {
    // containerd's StopPodSandbox (netns and cached result), then RemovePodSandbox (empty netns).
    let (i, primary) = incident_deferred();
    primary.wrap(i.store.del(&i.a, &i.pod_a)).netns("").run().assert_ok();
    assert_eq!(primary.dels(&i.a), 0, "the stale DEL must not reach the primary while {} owns the pod", i.b);
    let waiting = deferred(&i.store);
    assert_eq!(waiting.len(), 1, "one deferred DEL for sandbox A, however often it came: {waiting:?}");
    assert_eq!(waiting[0]["containerId"], json!(i.a));
    assert_eq!(waiting[0]["deferredForOwner"], json!(i.b));
    assert!(i.store.is_owner(&i.b, "eth0"));
    assert!(i.store.entry(&i.a, "eth0").is_none_or(|row| row["status"] == "deferred"), "A's checkpoint went with its DEL");

    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let dels: Vec<(String, String)> = primary.started().into_iter().filter(|(verb, _)| verb == "DEL").collect();
    assert_eq!(dels, [("DEL".to_string(), i.b.clone()), ("DEL".to_string(), i.a.clone())], "the owner's DEL first, then A's replay");
    let replay = primary.calls().into_iter().find(|c| c.verb == "DEL" && c.container == i.a).unwrap();
    assert_eq!(replay.netns, "", "a replay comes with an empty CNI_NETNS, as containerd's second DEL does");
    assert_eq!(replay.args, i.pod_a.cni_args(&i.a), "the stale DEL's own CNI_ARGS");
    let stdin = primary.stdin("DEL", &i.a);
    assert_eq!(stdin["prevResult"]["interfaces"][0]["sandbox"], json!(cni::default_netns(&i.a)), "A's checkpointed result: {stdin}");
    assert!(deferred(&i.store).is_empty());
    assert!(i.store.dump().is_empty(), "nothing left: {:?}", i.store.dump());
    let log = outcomes(&i.store);
    assert!(log.contains(&("deferred".to_string(), i.a.clone())), "{log:?}");
    assert!(log.contains(&("replayed".to_string(), i.a.clone())), "{log:?}");
}

#[test]
fn deferred_dels_reach_the_primary_in_the_order_they_came_even_within_a_second() {
    let (i, primary) = incident();
    let olds: Vec<String> = (0..6).map(|_| container_id()).collect();
    for old in &olds {
        primary.wrap(i.store.add(old, &i.pod_a)).run().assert_ok();
    }
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    for old in &olds {
        primary.wrap(i.store.del(old, &i.pod_a)).run().assert_ok();
    }
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let replayed: Vec<String> =
        primary.started().into_iter().filter(|(verb, container)| verb == "DEL" && *container != i.b).map(|(_, c)| c).collect();
    assert_eq!(replayed, olds, "oldest first");
}

#[test]
fn a_replay_the_primary_refuses_stays_deferred_and_gc_retries_it() {
    let (i, primary) = incident_deferred();
    primary.fail("DEL", &i.a, &json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"}));
    // The owner's own DEL passes whatever becomes of the replay.
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let waiting = deferred(&i.store);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0]["attempts"], 1);
    assert_eq!(waiting[0]["lastError"], "datastore is locked");
    assert!(outcomes(&i.store).contains(&("replay-failed".to_string(), i.a.clone())));

    primary.heal("DEL", &i.a);
    let gc = primary.wrap(i.store.cni("GC", "")).config("cni.dev/valid-attachments", Some(json!([]))).run();
    gc.assert_ok();
    assert_eq!(primary.dels(&i.a), 1, "GC replays the deferred DEL once the primary takes it");
    assert!(deferred(&i.store).is_empty());
    assert_eq!(primary.started().iter().filter(|(verb, _)| verb == "GC").count(), 1, "GC reaches the primary too");
}

#[test]
fn the_late_add_of_a_superseded_sandbox_never_reaches_the_primary() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    // B is alive: its netns path names a live namespace (the plugin's own, needing no root).
    primary.wrap(i.store.add(&i.b, &i.pod_b)).netns("/proc/self/ns/net").run().assert_ok();
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).run();
    let err = reply.assert_error(104);
    assert!(err.msg.contains("superseded") && err.msg.contains(&i.b), "{err:?}");
    let adds: Vec<_> = primary.started().into_iter().filter(|(verb, _)| verb == "ADD").collect();
    assert_eq!(adds.len(), 2, "the primary saw A's late ADD: {adds:?}");
    assert!(i.store.is_owner(&i.b, "eth0"), "B keeps the pod's name");
    // Deferred, A is just as superseded.
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_error(104);
    assert_eq!(primary.started().iter().filter(|(verb, _)| verb == "ADD").count(), 2);
    // Once B is gone, a sandbox is no longer superseded by it.
    primary.wrap(i.store.del(&i.b, &i.pod_b)).netns("/proc/self/ns/net").run().assert_ok();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    assert!(deferred(&i.store).is_empty(), "A's deferred DEL was replayed when B went");
}

/// containerd keeps a stopped sandbox's netns pinned: with a sticky IP, the old interface
/// would answer ARP for the address the new sandbox has.
#[test]
fn a_deferred_del_takes_the_stale_sandboxs_interface_out_of_its_netns() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let (add_a, netns_a) = primary.wrap(i.store.add(&i.a, &i.pod_a)).in_pod_netns();
    add_a.run().assert_ok();
    let (add_b, netns_b) = primary.wrap(i.store.add(&i.b, &i.pod_b)).in_pod_netns();
    add_b.run().assert_ok();
    primary.wrap(i.store.del(&i.a, &i.pod_a)).netns(&netns_a.path()).run().assert_ok();
    assert!(!netns_a.netns.try_exec(&["ip", "link", "show", "eth0"]), "the stale sandbox's eth0 must be gone from its netns");
    assert!(netns_b.netns.try_exec(&["ip", "link", "show", "eth0"]), "the owner's eth0 stays");
    assert_eq!(deferred(&i.store).len(), 1);
}

#[test]
fn an_interface_that_is_not_the_checkpointed_one_is_left_alone() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let (add_a, netns_a) = primary.wrap(i.store.add(&i.a, &i.pod_a)).in_pod_netns();
    add_a.run().assert_ok();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).netns("/proc/self/ns/net").run().assert_ok();
    netns_a.netns.exec(&["ip", "link", "set", "eth0", "address", "02:00:00:00:99:99"]);
    primary.wrap(i.store.del(&i.a, &i.pod_a)).netns(&netns_a.path()).run().assert_ok();
    assert!(netns_a.netns.try_exec(&["ip", "link", "show", "eth0"]), "an eth0 with another MAC is not the one checkpointed");
    assert_eq!(deferred(&i.store).len(), 1);
}

#[test]
fn a_slow_primary_holds_up_its_own_pod_only() {
    let (i, primary) = incident();
    let other = cni::Pod::new("lijiaob", "etcd2-0");
    let c = container_id();
    primary.slow("ADD", &i.a, 2.0);
    let slow = primary.wrap(i.store.add(&i.a, &i.pod_a)).spawn();
    // Once the slow ADD is inside the primary, another pod's ADD and the same pod's next one.
    while !primary.calls().iter().any(|call| call.container == i.a && call.phase == "start") {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let same_pod = primary.wrap(i.store.add(&i.b, &i.pod_b)).spawn();
    primary.wrap(i.store.add(&c, &other)).run().assert_ok();
    let calls = primary.calls();
    let slow_end = calls.iter().find(|call| call.container == i.a && call.phase == "end");
    assert!(slow_end.is_none(), "the other pod's ADD finished while the slow one was still in the primary: {calls:?}");
    slow.wait().assert_ok();
    same_pod.wait().assert_ok();
    let calls = primary.calls();
    let time = |container: &str, phase: &str| calls.iter().find(|c| c.container == container && c.phase == phase).unwrap().time;
    assert!(time(&i.b, "start") >= time(&i.a, "end"), "the same pod's ADDs must reach the primary one at a time: {calls:?}");
    assert!(i.store.is_owner(&i.b, "eth0"));
}

#[test]
fn check_and_status_go_to_the_primary_first() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.fail("CHECK", &i.a, &json!({"cniVersion": "1.1.0", "code": 100, "msg": "interface eth0 is gone"}));
    let err = primary.wrap(i.store.cni("CHECK", &i.a).pod(&i.pod_a)).run().assert_error(100);
    assert_eq!(err.msg, "interface eth0 is gone");

    let status = primary.wrap(i.store.cni("STATUS", ""));
    status.run().assert_ok();
    // The primary's calls without an attachment log as container "none".
    primary.fail("STATUS", "none", &json!({"cniVersion": "1.1.0", "code": 50, "msg": "calico-node is not ready"}));
    let err = status.run().assert_error(50);
    assert_eq!(err.msg, "calico-node is not ready");
}

/// ext4 remounts itself read-only after a disk error: no deferral can be written then, so a
/// stale DEL is refused as in chained mode, and every other DEL still reaches the primary.
#[test]
fn on_a_read_only_store_the_owners_del_reaches_the_primary_and_a_stale_one_is_refused() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    let read_only = mount::Mount::read_only_bind(&i.store.state_dir);
    let err = primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_error(11);
    assert!(err.msg.contains("stale DEL") && err.details.contains("cannot be deferred"), "{err:?}");
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert_eq!((primary.dels(&i.a), primary.dels(&i.b)), (0, 1), "only the owner's DEL reached the primary");
    drop(read_only);
}

/// calico v2's networks are 0.1.0: the primary's 0.2.0-shaped result reaches the runtime as
/// it wrote it and is checkpointed; one that does not parse is code 6 and leaves no trace
/// in the store.
#[test]
fn legacy_results_of_the_primary_pass_through_and_a_malformed_one_writes_nothing() {
    let (i, primary) = incident();
    let result = r#"{"cniVersion":"0.1.0","ip4":{"ip":"10.22.0.9/32"},"dns":{}}"#;
    primary.answer_add(&i.a, result);
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).version("0.1.0").run();
    reply.assert_ok();
    assert_eq!(reply.stdout.trim_end(), result, "the primary's result must reach the runtime as it wrote it");
    assert_eq!(primary.stdin("ADD", &i.a)["cniVersion"], "0.1.0");
    assert_eq!(i.store.entry(&i.a, "eth0").expect("A's checkpoint")["ips"], json!(["10.22.0.9/32"]));

    primary.answer_add(&i.b, r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.22.0.10"}}"#);
    let before = i.store.snapshot();
    let reply = primary.wrap(i.store.add(&i.b, &i.pod_b)).version("0.2.0").run();
    let error = reply.assert_error(6);
    assert!(error.msg.contains("prevResult.ip4.ip"), "{error:?}");
    assert_eq!(i.store.snapshot(), before, "a refused result must leave the store as it was");
    assert!(i.store.log_lines().iter().all(|l| !(l.container == i.b && l.outcome == "added")), "B's ADD was logged as a success");
}

/// A primary of the 0.1.0 era answers ADD without `cniVersion` (the 0.1.0 spec had none;
/// weave-net and host-local releases did so later too), and libcni reads such a result as
/// being in the config's version (`invoke.fixupResultVersion`, containernetworking/cni#896).
/// Wrapped by the guard, the primary has set the pod up: refusing its result fails every ADD
/// of a network that works without the guard.
#[test]
fn a_primary_result_without_cni_version_is_in_the_configs_version_as_libcni_reads_it() {
    for (version, result, fixed) in [
        ("0.1.0", r#"{"ip4":{"ip":"10.22.0.9/32"},"dns":{}}"#, r#"{"cniVersion":"0.1.0","ip4":{"ip":"10.22.0.9/32"},"dns":{}}"#),
        ("0.2.0", r#"{"cniVersion":"","ip4":{"ip":"10.22.0.9/32"}}"#, r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.22.0.9/32"}}"#),
        (
            "0.3.1",
            r#"{"ips":[{"version":"4","address":"10.22.0.9/32"}],"dns":{}}"#,
            r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.22.0.9/32"}],"dns":{}}"#,
        ),
    ] {
        let (i, primary) = incident();
        primary.answer_add(&i.a, result);
        let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).version(version).run();
        reply.assert_ok();
        assert_eq!(reply.stdout.trim_end(), fixed, "at {version}: the result in the config's version, as libcni reads it");
        assert_eq!(i.store.entry(&i.a, "eth0").expect("A's checkpoint")["ips"], json!(["10.22.0.9/32"]), "at {version}");
    }
}
