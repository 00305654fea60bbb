//! Delegate mode at the CNI protocol level: the guard wraps a primary that records what
//! reaches it (tests/primaries/recording-plugin), run as a runtime runs it. What the primary
//! is given, and when, is the subject: its stdin, its errors passed on, the stale DEL kept
//! from it and replayed once the pod's name is free, the late ADD it never sees, and its
//! CHECK, GC and STATUS going first.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

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
    store
        .dump()
        .into_iter()
        .filter(|row| row["status"] == "deferred")
        .collect()
}

fn outcomes(store: &Store) -> Vec<(cni::Outcome, String)> {
    store
        .log_lines()
        .into_iter()
        .map(|l| (l.outcome, l.container))
        .collect()
}

#[test]
fn add_hands_the_primary_its_own_object_and_returns_its_result_unchanged() {
    let (i, primary) = incident();
    let delegate = primary.delegate(json!({"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]]}, "mtu": 1400}));
    // A field no version of the spec knows must survive, byte for byte.
    let result = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"02:00:00:00:00:0a","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.22.0.9/24","interface":0}],"dns":{},"vendor.example/extra":{"k":[1,2]}}"#;
    primary.answer_add(&i.a, result);
    let reply = primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .config("delegate", Some(delegate))
        .run();
    reply.assert_ok();
    assert_eq!(
        reply.stdout.trim_end(),
        result,
        "the primary's result must reach the runtime as it wrote it"
    );

    let stdin = primary.stdin("ADD", &i.a);
    assert_eq!(stdin["name"], cni::NETWORK);
    assert_eq!(stdin["cniVersion"], cni::LATEST_VERSION);
    assert_eq!(stdin["type"], primary::TYPE);
    assert_eq!(stdin["mtu"], 1400);
    assert_eq!(stdin["ipam"]["type"], "host-local");
    assert_eq!(
        stdin["stateDir"],
        json!(primary.state_dir),
        "the primary's own stateDir, not the guard's"
    );
    for key in ["logFile", "staleDel", "delegate", "prevResult"] {
        assert!(
            stdin.get(key).is_none(),
            "the guard's {key} must not reach the primary: {stdin}"
        );
    }
    assert!(
        i.store.is_owner(&i.a, "eth0"),
        "the ADD is checkpointed and owns the pod"
    );
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
    assert!(
        i.store.dump().is_empty(),
        "a failed ADD records nothing: {:?}",
        i.store.dump()
    );
}

#[test]
fn a_delegate_that_is_not_in_cni_path_is_an_invalid_config() {
    let (i, primary) = incident();
    let reply = primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .env("CNI_PATH", Some("/nonexistent"))
        .run();
    let err = reply.assert_error(7);
    assert!(
        err.msg.contains(primary::TYPE) && err.text().contains("CNI_PATH"),
        "{err:?}"
    );
}

#[test]
fn a_stale_del_succeeds_without_the_primary_and_is_replayed_once_the_owner_goes() {
    // containerd's StopPodSandbox (netns and cached result), then RemovePodSandbox (empty netns).
    let (i, primary) = incident_deferred();
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns("")
        .run()
        .assert_ok();
    assert_eq!(
        primary.dels(&i.a),
        0,
        "the stale DEL must not reach the primary while {} owns the pod",
        i.b
    );
    let waiting = deferred(&i.store);
    assert_eq!(
        waiting.len(),
        1,
        "one deferred DEL for sandbox A, however often it came: {waiting:?}"
    );
    assert_eq!(waiting[0]["containerId"], json!(i.a));
    assert_eq!(waiting[0]["deferredForOwner"], json!(i.b));
    assert!(i.store.is_owner(&i.b, "eth0"));
    assert!(
        i.store
            .entry(&i.a, "eth0")
            .is_none_or(|row| row["status"] == "deferred"),
        "A's checkpoint went with its DEL"
    );

    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let dels: Vec<(String, String)> = primary
        .started()
        .into_iter()
        .filter(|(verb, _)| verb == "DEL")
        .collect();
    assert_eq!(
        dels,
        [
            ("DEL".to_string(), i.b.clone()),
            ("DEL".to_string(), i.a.clone())
        ],
        "the owner's DEL first, then A's replay"
    );
    let replay = primary
        .calls()
        .into_iter()
        .find(|c| c.verb == "DEL" && c.container == i.a)
        .unwrap();
    assert_eq!(
        replay.netns, "",
        "a replay comes with an empty CNI_NETNS, as containerd's second DEL does"
    );
    assert_eq!(
        replay.args,
        i.pod_a.cni_args(&i.a),
        "the stale DEL's own CNI_ARGS"
    );
    let stdin = primary.stdin("DEL", &i.a);
    assert_eq!(
        stdin["prevResult"]["interfaces"][0]["sandbox"],
        json!(cni::default_netns(&i.a)),
        "A's checkpointed result: {stdin}"
    );
    assert!(deferred(&i.store).is_empty());
    assert!(
        i.store.dump().is_empty(),
        "nothing left: {:?}",
        i.store.dump()
    );
    let log = outcomes(&i.store);
    assert!(
        log.contains(&(cni::Outcome::Deferred, i.a.clone())),
        "{log:?}"
    );
    assert!(
        log.contains(&(cni::Outcome::Replayed, i.a.clone())),
        "{log:?}"
    );
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
    i.store.wait_for_replays(REPLAYS_DONE);
    let replayed: Vec<String> = primary
        .started()
        .into_iter()
        .filter(|(verb, container)| verb == "DEL" && *container != i.b)
        .map(|(_, c)| c)
        .collect();
    assert_eq!(replayed, olds, "oldest first");
}

#[test]
fn a_replay_the_primary_refuses_stays_deferred_and_gc_retries_it() {
    let (i, primary) = incident_deferred();
    primary.fail(
        "DEL",
        &i.a,
        &json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"}),
    );
    // The owner's own DEL passes whatever becomes of the replay.
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let waiting = deferred(&i.store);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0]["attempts"], 1);
    assert_eq!(waiting[0]["lastError"], "datastore is locked");
    assert!(outcomes(&i.store).contains(&(cni::Outcome::ReplayFailed, i.a.clone())));

    primary.heal("DEL", &i.a);
    let gc = primary
        .wrap(i.store.cni("GC", ""))
        .config("cni.dev/valid-attachments", Some(json!([])))
        .run();
    gc.assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        primary.dels(&i.a),
        1,
        "GC replays the deferred DEL once the primary takes it"
    );
    assert!(deferred(&i.store).is_empty());
    assert_eq!(
        primary
            .started()
            .iter()
            .filter(|(verb, _)| verb == "GC")
            .count(),
        1,
        "GC reaches the primary too"
    );
}

#[test]
fn the_late_add_of_a_superseded_sandbox_never_reaches_the_primary() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    // B is alive: its netns path names a live namespace (the plugin's own, needing no root).
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    let reply = primary.wrap(i.store.add(&i.a, &i.pod_a)).run();
    let err = reply.assert_error(104);
    assert!(
        err.msg.contains("superseded") && err.msg.contains(&i.b),
        "{err:?}"
    );
    let adds: Vec<_> = primary
        .started()
        .into_iter()
        .filter(|(verb, _)| verb == "ADD")
        .collect();
    assert_eq!(adds.len(), 2, "the primary saw A's late ADD: {adds:?}");
    assert!(i.store.is_owner(&i.b, "eth0"), "B keeps the pod's name");
    // Deferred, A is just as superseded.
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .run()
        .assert_error(104);
    assert_eq!(
        primary
            .started()
            .iter()
            .filter(|(verb, _)| verb == "ADD")
            .count(),
        2
    );
    // Once B is gone, a sandbox is no longer superseded by it.
    primary
        .wrap(i.store.del(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    assert!(
        deferred(&i.store).is_empty(),
        "A's deferred DEL was replayed when B went"
    );
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
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns(&netns_a.path())
        .run()
        .assert_ok();
    assert!(
        !netns_a.netns.try_exec(&["ip", "link", "show", "eth0"]),
        "the stale sandbox's eth0 must be gone from its netns"
    );
    assert!(
        netns_b.netns.try_exec(&["ip", "link", "show", "eth0"]),
        "the owner's eth0 stays"
    );
    assert_eq!(deferred(&i.store).len(), 1);
}

#[test]
fn an_interface_that_is_not_the_checkpointed_one_is_left_alone() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let (add_a, netns_a) = primary.wrap(i.store.add(&i.a, &i.pod_a)).in_pod_netns();
    add_a.run().assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    netns_a
        .netns
        .exec(&["ip", "link", "set", "eth0", "address", "02:00:00:00:99:99"]);
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns(&netns_a.path())
        .run()
        .assert_ok();
    assert!(
        netns_a.netns.try_exec(&["ip", "link", "show", "eth0"]),
        "an eth0 with another MAC is not the one checkpointed"
    );
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
    while !primary
        .calls()
        .iter()
        .any(|call| call.container == i.a && call.phase == "start")
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let same_pod = primary.wrap(i.store.add(&i.b, &i.pod_b)).spawn();
    primary.wrap(i.store.add(&c, &other)).run().assert_ok();
    let calls = primary.calls();
    let slow_end = calls
        .iter()
        .find(|call| call.container == i.a && call.phase == "end");
    assert!(
        slow_end.is_none(),
        "the other pod's ADD finished while the slow one was still in the primary: {calls:?}"
    );
    slow.wait().assert_ok();
    same_pod.wait().assert_ok();
    let calls = primary.calls();
    let time = |container: &str, phase: &str| {
        calls
            .iter()
            .find(|c| c.container == container && c.phase == phase)
            .unwrap()
            .time
    };
    assert!(
        time(&i.b, "start") >= time(&i.a, "end"),
        "the same pod's ADDs must reach the primary one at a time: {calls:?}"
    );
    assert!(i.store.is_owner(&i.b, "eth0"));
}

#[test]
fn check_and_status_go_to_the_primary_first() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.fail(
        "CHECK",
        &i.a,
        &json!({"cniVersion": "1.1.0", "code": 100, "msg": "interface eth0 is gone"}),
    );
    let err = primary
        .wrap(i.store.cni("CHECK", &i.a).pod(&i.pod_a))
        .run()
        .assert_error(100);
    assert_eq!(err.msg, "interface eth0 is gone");

    let status = primary.wrap(i.store.cni("STATUS", ""));
    status.run().assert_ok();
    // The primary's calls without an attachment log as container "none".
    primary.fail(
        "STATUS",
        "none",
        &json!({"cniVersion": "1.1.0", "code": 50, "msg": "calico-node is not ready"}),
    );
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
    let err = primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .run()
        .assert_error(11);
    assert!(
        err.msg.contains("stale DEL") && err.details.contains("cannot be deferred"),
        "{err:?}"
    );
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert_eq!(
        (primary.dels(&i.a), primary.dels(&i.b)),
        (0, 1),
        "only the owner's DEL reached the primary"
    );
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
    let reply = primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .version("0.1.0")
        .run();
    reply.assert_ok();
    assert_eq!(
        reply.stdout.trim_end(),
        result,
        "the primary's result must reach the runtime as it wrote it"
    );
    assert_eq!(primary.stdin("ADD", &i.a)["cniVersion"], "0.1.0");
    assert_eq!(
        i.store.entry(&i.a, "eth0").expect("A's checkpoint")["ips"],
        json!(["10.22.0.9/32"])
    );

    primary.answer_add(&i.b, r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.22.0.10"}}"#);
    let before = i.store.snapshot();
    let reply = primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .version("0.2.0")
        .run();
    let error = reply.assert_error(6);
    assert!(error.msg.contains("prevResult.ip4.ip"), "{error:?}");
    assert_eq!(
        i.store.snapshot(),
        before,
        "a refused result must leave the store as it was"
    );
    assert!(
        i.store
            .log_lines()
            .iter()
            .all(|l| !(l.container == i.b && l.outcome == cni::Outcome::Added)),
        "B's ADD was logged as a success"
    );
}

/// Processes whose command line holds `needle` (a test's own sleep, left by a killed primary),
/// but for one the kernel holds a SIGKILL for: the kill was sent, and on a busy machine the
/// process runs to its exit moments after `kill` returned.
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains(needle) && !killed(&entry.path())).then_some(cmdline)
        })
        .collect()
}

/// Whether SIGKILL is pending for the process at `/proc/<pid>` (in its own set or its thread
/// group's), or the process is gone.
fn killed(proc_dir: &std::path::Path) -> bool {
    let Ok(status) = std::fs::read_to_string(proc_dir.join("status")) else {
        return true;
    };
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    status
        .lines()
        .filter_map(|line| {
            line.strip_prefix("SigPnd:")
                .or_else(|| line.strip_prefix("ShdPnd:"))
        })
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

/// A replay that hangs is the worker's to wait for, never the runtime's: the owner's DEL and
/// the pod's next ADD and DEL go on, and the primary is killed with its process group at
/// `replayTimeoutSeconds`.
#[test]
fn a_primary_hanging_on_a_replay_holds_up_neither_the_owners_del_nor_the_pods_next_add() {
    let (i, primary) = incident_deferred();
    // The recording primary sleeps in a child process (`sleep`), as a primary's IPAM runs
    // in one: killing only the primary would leave it holding the answer pipe open.
    primary.slow("DEL", &i.a, 47.25);
    let short = |call: cni::Cni| {
        primary
            .wrap(call)
            .config("replayTimeoutSeconds", Some(json!(3)))
    };
    short(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    for _ in 0..200 {
        if primary.started().last() == Some(&("DEL".to_string(), i.a.clone())) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !processes_with("sleep 47.25").is_empty(),
        "the owner's DEL answered while the replay still ran, so it did not wait for it"
    );
    // The pod's next sandbox: its ADD waits for the replay of its old sandbox (its pod lock,
    // at most replayTimeoutSeconds), and then goes on.
    let c = container_id();
    short(i.store.add(&c, &i.pod_a)).run().assert_ok();
    short(i.store.del(&c, &i.pod_a)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert!(
        processes_with("sleep 47.25").is_empty(),
        "the hanging primary's child outlived its deadline: {:?}",
        processes_with("sleep 47.25")
    );
    let waiting = deferred(&i.store);
    assert_eq!(
        waiting.len(),
        1,
        "the replay that ran out of time stays deferred: {waiting:?}"
    );
    assert_eq!(
        waiting[0]["attempts"], 2,
        "the owner's DEL and the next sandbox's each handed it to the worker"
    );
}

#[test]
fn a_replay_is_the_deferred_sandboxs_own_call() {
    let (i, primary) = incident();
    let with_ports = |marker: &str| {
        primary.delegate(json!({"capabilities": {"portMappings": true}, "marker": marker}))
    };
    let ports = |port: u16| json!({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]});
    primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .config("delegate", Some(with_ports("at-A")))
        .config("runtimeConfig", Some(ports(8001)))
        .run()
        .assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .config("delegate", Some(with_ports("at-A")))
        .config("runtimeConfig", Some(ports(8002)))
        .run()
        .assert_ok();
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .config("delegate", Some(with_ports("at-A")))
        .config("runtimeConfig", Some(ports(8001)))
        .run()
        .assert_ok();
    // The conflist changes before the owner goes: A's DEL is replayed as A's own call was.
    primary
        .wrap(i.store.del(&i.b, &i.pod_b))
        .config("delegate", Some(with_ports("at-B")))
        .config("runtimeConfig", Some(ports(8002)))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let replay = primary.stdin("DEL", &i.a);
    assert_eq!(
        replay["runtimeConfig"],
        ports(8001),
        "A's replay must carry A's own port mappings: {replay}"
    );
    assert_eq!(
        replay["marker"], "at-A",
        "A's replay goes to the primary as configured when A's DEL came: {replay}"
    );
    assert_eq!(primary.stdin("DEL", &i.b)["marker"], "at-B");
}

#[test]
fn a_replay_by_gc_carries_no_attachment_list_and_gc_hands_the_primary_both_keys() {
    let (i, primary) = incident_deferred();
    primary.fail(
        "DEL",
        &i.a,
        &json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"}),
    );
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    primary.heal("DEL", &i.a);
    let listed = json!([{"containerID": "other", "ifname": "eth0"}]);
    primary
        .wrap(i.store.cni("GC", ""))
        .config("cni.dev/valid-attachments", Some(listed.clone()))
        .config("cni.dev/attachments", Some(listed.clone()))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let replay = primary.stdin("DEL", &i.a);
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        assert!(
            replay.get(key).is_none(),
            "a replayed DEL carries no GC list: {replay}"
        );
    }
    let gc = primary.stdin("GC", "none");
    assert_eq!(
        (&gc["cni.dev/valid-attachments"], &gc["cni.dev/attachments"]),
        (&listed, &listed),
        "both keys, as libcni sets them: {gc}"
    );
}

#[test]
fn a_replay_below_0_4_0_carries_no_prev_result() {
    let (i, primary) = incident();
    let result = |c: &str| {
        json!({"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": cni::default_netns(c)}],
        "ips": [{"version": "4", "address": "10.22.0.5/24", "interface": 0}], "dns": {}})
    };
    for c in [&i.a, &i.b] {
        primary.answer_add(c, &result(c).to_string());
    }
    primary
        .wrap(i.store.add(&i.a, &i.pod_a).version("0.3.1"))
        .run()
        .assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b).version("0.3.1"))
        .run()
        .assert_ok();
    primary
        .wrap(
            i.store
                .del(&i.a, &i.pod_a)
                .version("0.3.1")
                .no_prev_result(),
        )
        .run()
        .assert_ok();
    primary
        .wrap(
            i.store
                .del(&i.b, &i.pod_b)
                .version("0.3.1")
                .no_prev_result(),
        )
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(primary.dels(&i.a), 1);
    let replay = primary.stdin("DEL", &i.a);
    assert_eq!(replay["cniVersion"], "0.3.1");
    assert!(
        replay.get("prevResult").is_none(),
        "libcni sends no prevResult on DEL below 0.4.0: {replay}"
    );
}

#[test]
fn a_deferred_del_whose_pods_name_is_free_is_replayed_without_the_pod_coming_back() {
    let (i, primary) = incident_deferred();
    primary.fail(
        "DEL",
        &i.a,
        &json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"}),
    );
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    primary
        .wrap(i.store.del(&i.b, &i.pod_b))
        .netns("")
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        deferred(&i.store)[0]["attempts"],
        2,
        "both of the owner's DELs tried it"
    );
    primary.heal("DEL", &i.a);
    // No GC comes (containerd sends none) and the pod never comes back; another pod's ADD
    // starts the sweep of the entries whose name is free, once their retry time
    // (2^attempts s) is past.
    std::thread::sleep(std::time::Duration::from_millis(4200));
    let other = cni::Pod::new("lijiaob", "etcd2-0");
    primary
        .wrap(i.store.add(&container_id(), &other))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(primary.dels(&i.a), 1, "the sweep replayed it");
    assert!(deferred(&i.store).is_empty());
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert_eq!(
        locks.len(),
        1,
        "only the other pod's lock file stays, not the swept pod's (containerd sends no GC): {locks:?}"
    );
}

/// Four slow replays of one pod (1.6 s each, more than the owner's DEL waits for them): the
/// owner's DEL answers, and the worker hands each to the primary, oldest first.
#[test]
fn slow_replays_of_one_pod_all_reach_the_primary_from_the_worker() {
    let (i, primary) = incident();
    let olds: Vec<String> = (0..4).map(|_| container_id()).collect();
    for old in &olds {
        primary.wrap(i.store.add(old, &i.pod_a)).run().assert_ok();
    }
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    for old in &olds {
        primary.wrap(i.store.del(old, &i.pod_a)).run().assert_ok();
        primary.slow("DEL", old, 1.6);
    }
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert!(
        !deferred(&i.store).is_empty(),
        "the owner's DEL waited for all four slow replays"
    );
    i.store.wait_for_replays(REPLAYS_DONE);
    assert!(
        deferred(&i.store).is_empty(),
        "the worker replays them all: {:?}",
        deferred(&i.store)
    );
    assert_eq!(
        olds.iter().map(|old| primary.dels(old)).collect::<Vec<_>>(),
        [1, 1, 1, 1]
    );
    let order: Vec<String> = primary
        .started()
        .into_iter()
        .filter(|(verb, c)| verb == "DEL" && olds.contains(c))
        .map(|(_, c)| c)
        .collect();
    assert_eq!(order, olds, "oldest first");
}

/// The pod's next sandbox comes while the worker replays its old sandboxes' slow DELs: the
/// worker lets the pod lock go between two entries, and the waiting ADD takes it then, so it
/// waits for one replay, not for all of them.
#[test]
fn the_pods_next_add_waits_for_one_slow_replay_not_all() {
    let (i, primary) = incident();
    let olds: Vec<String> = (0..4).map(|_| container_id()).collect();
    for old in &olds {
        primary.wrap(i.store.add(old, &i.pod_a)).run().assert_ok();
    }
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    for old in &olds {
        primary.wrap(i.store.del(old, &i.pod_a)).run().assert_ok();
        primary.slow("DEL", old, 2.5);
    }
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let c = container_id();
    primary
        .wrap(i.store.add(&c, &i.pod_a))
        .config("podLockTimeoutSeconds", Some(json!(60)))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let order: Vec<String> = primary
        .started()
        .into_iter()
        .filter(|(verb, id)| (verb == "DEL" && olds.contains(id)) || (verb == "ADD" && *id == c))
        .map(|(verb, id)| format!("{verb} {}", &id[..8]))
        .collect();
    let add_at = order.iter().position(|e| e.starts_with("ADD")).unwrap();
    assert!(
        add_at <= 1,
        "the ADD waited for more than one replay: {order:?}"
    );
}

#[test]
fn gc_goes_on_after_the_primarys_gc_error_and_returns_it_after_its_own_work() {
    let (i, primary) = incident_deferred();
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let c = container_id();
    primary.wrap(i.store.add(&c, &i.pod_a)).run().assert_ok();
    let error = json!({"cniVersion": "1.1.0", "code": 100, "msg": "calico datastore unreachable"});
    primary.fail("GC", "none", &error);
    let gc = primary
        .wrap(i.store.cni("GC", ""))
        .config("cni.dev/valid-attachments", Some(json!([])))
        .run();
    gc.assert_error(100);
    assert_eq!(gc.json(), error, "the primary's error, as it wrote it");
    assert!(
        i.store.entry(&c, "eth0").is_none(),
        "the guard's own GC ran: {:?}",
        i.store.dump()
    );
}

#[test]
fn pod_locks_go_with_the_pods() {
    let (i, primary) = incident();
    for n in 0..5 {
        let pod = cni::Pod::new("lijiaob", &format!("web-{n}"));
        let c = container_id();
        primary.wrap(i.store.add(&c, &pod)).run().assert_ok();
        primary.wrap(i.store.del(&c, &pod)).run().assert_ok();
    }
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert!(
        locks.is_empty(),
        "a pod that is gone leaves no lock file: {locks:?}"
    );
}

#[test]
fn version_answers_what_both_the_guard_and_the_primary_speak() {
    let (i, primary) = incident();
    let conf = |plugin: &str| json!({"cniVersion": "1.0.0", "name": cni::NETWORK, "type": "sandbox-guard", "delegate": {"type": plugin}});
    let ask = |plugin: &str| {
        cni::Cni::with_config("VERSION", "", &conf(plugin))
            .env("CNI_PATH", Some(primary.bin_dir.to_str().unwrap()))
            .run()
    };
    let reply = ask(primary::TYPE);
    reply.assert_ok();
    assert_eq!(
        reply.json()["supportedVersions"],
        json!(["0.4.0", "1.0.0", "1.1.0"]),
        "the recording primary speaks 0.4.0 on"
    );
    ask("no-such-primary").assert_error(7);
    // libcni's own VERSION carries no config: the guard answers for itself.
    i.store.cni("VERSION", "").run().assert_ok();
}

#[test]
fn version_reads_a_legacy_primarys_answer_as_libcni_does() {
    // libcni's reading (pkg/version PluginDecoder, pkg/invoke GetVersionInfo): a 0.2.0-era
    // answer without supportedVersions speaks 0.1.0 and 0.2.0; a plugin from before VERSION
    // fails it with "unknown CNI_COMMAND: VERSION" and speaks 0.1.0.
    let (_i, primary) = incident();
    for (plugin, script, speaks) in [
        (
            "primary-0-2-0",
            r#"printf '{"cniVersion":"0.2.0"}\n'"#,
            json!(["0.1.0", "0.2.0"]),
        ),
        (
            "primary-0-1-0",
            r#"printf '{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}\n'; exit 1"#,
            json!(["0.1.0"]),
        ),
    ] {
        let path = primary.bin_dir.join(plugin);
        std::fs::write(&path, format!("#!/bin/sh\ncat >/dev/null\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let conf = json!({"cniVersion": "0.2.0", "name": cni::NETWORK, "type": "sandbox-guard", "delegate": {"type": plugin}});
        let reply = cni::Cni::with_config("VERSION", "", &conf)
            .env("CNI_PATH", Some(primary.bin_dir.to_str().unwrap()))
            .run();
        assert!(reply.succeeded(), "{plugin}: {reply:?}");
        assert_eq!(reply.json()["supportedVersions"], speaks, "{plugin}");
    }
}

/// ext4 remounts itself read-only after a disk error: the primary must not set up a pod the
/// guard cannot record.
#[test]
fn an_add_on_a_store_that_takes_no_write_is_refused_before_the_primary() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    let read_only = mount::Mount::read_only_bind(&i.store.state_dir);
    let err = primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .run()
        .assert_error(5);
    assert!(err.msg.contains("before the primary"), "{err:?}");
    assert_eq!(
        primary
            .started()
            .iter()
            .filter(|(verb, _)| verb == "ADD")
            .count(),
        1,
        "the primary never saw the refused ADD"
    );
    drop(read_only);
}

/// A netns path reused by another namespace (a `/proc/<pid>/ns/net` whose pid came back, a
/// named netns made again) holding an interface of the same name and MAC: not the stale
/// sandbox's.
#[test]
fn a_reused_netns_path_keeps_its_interface_even_with_the_same_name_and_mac() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let (add_a, netns_a) = primary.wrap(i.store.add(&i.a, &i.pod_a)).in_pod_netns();
    add_a.run().assert_ok();
    let path = netns_a.path();
    let name = netns_a.netns.name.clone();
    drop(netns_a);
    // The same path, a new namespace, an eth0 with the same MAC (a new sandbox's).
    let host_end = sys::unique("sgh");
    sys::run("ip", &["netns", "add", &name]);
    sys::run(
        "ip",
        &[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &name,
        ],
    );
    let mac =
        cni::prev_result_for(cni::LATEST_VERSION, &i.a, "eth0", &path)["interfaces"][0]["mac"]
            .as_str()
            .unwrap()
            .to_string();
    sys::run("ip", &["-n", &name, "link", "set", "eth0", "address", &mac]);
    stale_del_keeps_the_new_eth0(&i, &primary, &name, &host_end);
}

/// B takes the pod, A's stale DEL comes with the netns path `name` now has: the eth0 there
/// (another sandbox's, with host end `host_end`) must stay. Both go after.
fn stale_del_keeps_the_new_eth0(
    i: &cni::Incident,
    primary: &RecordingPrimary,
    name: &str,
    host_end: &str,
) {
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns(&format!("/var/run/netns/{name}"))
        .run()
        .assert_ok();
    let kept = sys::try_run("ip", &["-n", name, "link", "show", "eth0"]);
    sys::try_run("ip", &["link", "del", host_end]);
    sys::try_run("ip", &["netns", "del", name]);
    assert!(
        kept,
        "the stale DEL deleted the eth0 of the namespace that now has its path"
    );
    assert_eq!(deferred(&i.store).len(), 1);
}

#[test]
fn a_bad_result_says_where_the_cleanup_del_goes() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    let c = container_id();
    primary.answer_add(&c, "not a result");
    let err = primary
        .wrap(i.store.add(&c, &i.pod_a))
        .run()
        .assert_error(6);
    assert!(
        err.details.contains("deferred") && err.details.contains(&i.b),
        "B owns the pod, so C's cleanup DEL is deferred: {err:?}"
    );
    primary.wrap(i.store.del(&c, &i.pod_a)).run().assert_ok();
    assert_eq!(
        primary.dels(&c),
        0,
        "as the message said, the cleanup DEL waits for the pod's name"
    );
    assert_eq!(deferred(&i.store).len(), 1);
}

/// host-device and SR-IOV move a host link (a NIC, a vlan, a bond) into the pod; deleting it
/// would destroy it instead of giving it back. A bridge stands in for such a link here (no
/// vlan or bond module on this kernel): a kind the sandbox does not own outright.
#[test]
fn an_interface_of_a_kind_the_primary_gives_back_is_left_to_the_replay() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let netns = sys::Netns::new("sgpod");
    netns.exec(&["ip", "link", "add", "eth0", "type", "bridge"]);
    netns.exec(&[
        "ip",
        "link",
        "set",
        "eth0",
        "address",
        "02:00:00:00:00:01",
        "up",
    ]);
    let path = netns.path().to_str().unwrap().to_string();
    primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .netns(&path)
        .run()
        .assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns(&path)
        .run()
        .assert_ok();
    assert!(
        netns.try_exec(&["ip", "link", "show", "eth0"]),
        "the host's link must be left for the primary to give back"
    );
    let deferral = i
        .store
        .log_lines()
        .into_iter()
        .find(|l| l.outcome == cni::Outcome::Deferred)
        .unwrap();
    assert!(deferral.raw.contains("bridge link"), "{}", deferral.raw);
}

/// A primary of the 0.1.0 era answers ADD without `cniVersion` (the 0.1.0 spec had none;
/// weave-net and host-local releases did so later too), and libcni reads such a result as
/// being in the config's version (`invoke.fixupResultVersion`, containernetworking/cni#896).
/// Wrapped by the guard, the primary has set the pod up: refusing its result fails every ADD
/// of a network that works without the guard.
#[test]
fn a_primary_result_without_cni_version_is_in_the_configs_version_as_libcni_reads_it() {
    for (version, result, fixed) in [
        (
            "0.1.0",
            r#"{"ip4":{"ip":"10.22.0.9/32"},"dns":{}}"#,
            r#"{"cniVersion":"0.1.0","ip4":{"ip":"10.22.0.9/32"},"dns":{}}"#,
        ),
        (
            "0.2.0",
            r#"{"cniVersion":"","ip4":{"ip":"10.22.0.9/32"}}"#,
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.22.0.9/32"}}"#,
        ),
        (
            "0.3.1",
            r#"{"ips":[{"version":"4","address":"10.22.0.9/32"}],"dns":{}}"#,
            r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.22.0.9/32"}],"dns":{}}"#,
        ),
    ] {
        let (i, primary) = incident();
        primary.answer_add(&i.a, result);
        let reply = primary
            .wrap(i.store.add(&i.a, &i.pod_a))
            .version(version)
            .run();
        reply.assert_ok();
        assert_eq!(
            reply.stdout.trim_end(),
            fixed,
            "at {version}: the result in the config's version, as libcni reads it"
        );
        assert_eq!(
            i.store.entry(&i.a, "eth0").expect("A's checkpoint")["ips"],
            json!(["10.22.0.9/32"]),
            "at {version}"
        );
    }
}

#[test]
fn a_sweep_never_replays_an_old_networks_deferred_del_while_the_pod_lives_under_the_new_name() {
    let (i, primary) = incident_deferred();
    primary.fail(
        "DEL",
        &i.a,
        &json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"}),
    );
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    // The conflist's network is renamed; the pod's next sandbox starts under the new name.
    // The primary keys by the pod's name (calico v2), not by the network's: A's DEL given
    // to it now would release C's handle and endpoint. The primary refuses A's DEL until C
    // is in: a replay while the name was still free (a slow machine lets the back-off run out
    // before C's ADD) must not be taken for one while C lives.
    let renamed = "k8s-pod-network-renamed";
    let c = container_id();
    primary
        .wrap(i.store.add(&c, &i.pod_a).network(renamed))
        .run()
        .assert_ok();
    primary.heal("DEL", &i.a);
    std::thread::sleep(std::time::Duration::from_millis(2200));
    primary
        .wrap(
            i.store
                .add(&container_id(), &cni::Pod::new("lijiaob", "etcd2-0"))
                .network(renamed),
        )
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    // The calls in the order they started, and the guard's log: whether A's DEL came before
    // C's ADD reached the primary (the name still free) or after it.
    assert_eq!(
        primary.dels(&i.a),
        0,
        "the old sandbox's DEL reached the primary while sandbox {c} of the pod lives; the \
         primary's calls: {:#?}\nthe guard's log: {}",
        primary.calls(),
        std::fs::read_to_string(&i.store.log_file).unwrap_or_default()
    );
    assert_eq!(
        deferred(&i.store).len(),
        1,
        "it waits, as the old name's own entries do"
    );
    // Once the pod's sandbox under the new name is gone, the entry is replayed.
    primary
        .wrap(i.store.del(&c, &i.pod_a).network(renamed))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        primary.dels(&i.a),
        1,
        "the pod's name is free under both names: {:?}",
        deferred(&i.store)
    );
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert!(
        locks.len() <= 1,
        "only the other pod's lock file stays: {locks:?}"
    );
}

/// podKey "name": the old sandbox has two interfaces on the network, so its two stale DELs
/// come one after the other. Its own other interface is no live sandbox: each DEL takes its
/// interface out of the old netns.
#[test]
fn each_stale_del_of_a_sandbox_with_two_interfaces_takes_its_interface_out() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let (add_eth0, netns_a) = primary.wrap(i.store.add(&i.a, &i.pod_a)).in_pod_netns();
    let (add_net1, _net1_host_end) = primary
        .wrap(i.store.add(&i.a, &i.pod_a).ifname("net1"))
        .with_interface_in(&netns_a.netns);
    add_eth0.run().assert_ok();
    add_net1.run().assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b))
        .netns("/proc/self/ns/net")
        .run()
        .assert_ok();
    primary
        .wrap(i.store.del(&i.a, &i.pod_a))
        .netns(&netns_a.path())
        .run()
        .assert_ok();
    assert!(
        !netns_a.netns.try_exec(&["ip", "link", "show", "eth0"]),
        "the stale sandbox's eth0 must be gone from its netns: its own net1 does not make it a live sandbox's; log: {:?}",
        i.store.log_lines().last()
    );
    primary
        .wrap(i.store.del(&i.a, &i.pod_a).ifname("net1"))
        .netns(&netns_a.path())
        .run()
        .assert_ok();
    assert!(
        !netns_a.netns.try_exec(&["ip", "link", "show", "net1"]),
        "and then its net1"
    );
    assert_eq!(deferred(&i.store).len(), 2);
}

/// A replay the primary hangs on holds its pod's lock for all of `replayTimeoutSeconds`: a
/// hang is not retried at each short back-off, but after the longest.
#[test]
fn a_replay_that_hung_is_not_swept_again_at_the_next_short_back_off() {
    let (i, primary) = incident_deferred();
    primary.slow("DEL", &i.a, 37.5);
    let short = |call: cni::Cni| {
        primary
            .wrap(call)
            .config("replayTimeoutSeconds", Some(json!(2)))
    };
    short(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        deferred(&i.store)[0]["attempts"],
        1,
        "the worker tried it and ran out of time"
    );
    assert_eq!(
        deferred(&i.store)[0]["hung"],
        true,
        "the dump says it hung: {:?}",
        deferred(&i.store)
    );
    std::thread::sleep(std::time::Duration::from_millis(2200));
    short(
        i.store
            .add(&container_id(), &cni::Pod::new("lijiaob", "etcd2-0")),
    )
    .run()
    .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        deferred(&i.store)[0]["attempts"],
        1,
        "the sweep ran the replay the primary hung on moments ago again"
    );
    assert!(processes_with("sleep 37.5").is_empty());
}

/// Kills the processes whose command line holds `needle` (a test's hung primary's sleep).
fn kill_processes_with(needle: &str) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(needle)
        {
            let _ = std::process::Command::new("kill")
                .args(["-9", &entry.file_name().to_string_lossy()])
                .status();
        }
    }
}

/// Long enough for any replay here: a runtime's own limit is minutes.
const REPLAYS_DONE: std::time::Duration = std::time::Duration::from_secs(90);

/// Fifty deferred DELs whose pods' names are free and whose primary DEL hangs: no other
/// pod's verb may wait on them. The count, not the time: when an unrelated ADD, CHECK, DEL or
/// STATUS returns, it has succeeded, no hung replay has been cut short (a verb that ran one would have killed it at its own
/// budget's end), and at most one runs at a time on the node.
#[test]
fn fifty_hung_deferred_dels_hold_up_no_other_pods_verb() {
    sys::skip_unless_root!(&["ip"]);
    let (i, primary) = incident();
    let long = |call: cni::Cni| {
        primary
            .wrap(call)
            .config("replayTimeoutSeconds", Some(json!(120)))
            .config("podLockTimeoutSeconds", Some(json!(120)))
    };
    let timed_adds = |namespace: &str| {
        let mut took: Vec<std::time::Duration> = (0..20)
            .map(|n| {
                let started = std::time::Instant::now();
                long(i.store.add(
                    &container_id(),
                    &cni::Pod::new(namespace, &format!("api-{n}")),
                ))
                .run()
                .assert_ok();
                started.elapsed()
            })
            .collect();
        took.sort();
        (took[took.len() / 2], took[took.len() - 1])
    };
    let baseline = timed_adds("quiet");
    let refused = json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"});
    let mut stale = Vec::new();
    for n in 0..50 {
        let pod = cni::Pod::new("hung", &format!("web-{n}"));
        let (a, b) = (container_id(), container_id());
        long(i.store.add(&a, &pod)).run().assert_ok();
        long(i.store.add(&b, &pod)).run().assert_ok();
        long(i.store.del(&a, &pod)).run().assert_ok();
        // The owner's DEL frees the name; its replay is refused, and then the primary hangs.
        primary.fail("DEL", &a, &refused);
        long(i.store.del(&b, &pod)).run().assert_ok();
        stale.push(a);
    }
    i.store.wait_for_replays(std::time::Duration::from_secs(10));
    for (n, a) in stale.iter().enumerate() {
        primary.heal("DEL", a);
        primary.slow("DEL", a, 300.0 + n as f64 / 100.0);
    }
    assert_eq!(deferred(&i.store).len(), 50);
    // Past the refused replays' back-off (2 s): every entry is due.
    std::thread::sleep(std::time::Duration::from_millis(2200));
    let attempts = || -> std::collections::BTreeMap<String, u64> {
        deferred(&i.store)
            .into_iter()
            .map(|e| {
                let id = e["containerId"].as_str().unwrap_or_default().to_string();
                (id, e["attempts"].as_u64().unwrap_or_default())
            })
            .collect()
    };
    // Each unrelated pod's ADD, CHECK and DEL, and a STATUS of the network, one at a time.
    let verbs = ["ADD", "CHECK", "DEL", "STATUS"];
    let mut took: std::collections::BTreeMap<&str, Vec<std::time::Duration>> = Default::default();
    for n in 0..20 {
        let pod = cni::Pod::new("busy", &format!("api-{n}"));
        let id = container_id();
        // The pod's sandbox as its primary leaves it: CHECK reads the kernel.
        let (add, sandbox) = long(i.store.add(&id, &pod)).in_pod_netns();
        primary.answer_add(&id, &add.default_prev_result().to_string());
        for verb in verbs {
            let call = match verb {
                "ADD" => add.clone(),
                "STATUS" => long(i.store.cni("STATUS", "")),
                _ => long(i.store.cni(verb, &id).pod(&pod)).netns(&sandbox.path()),
            };
            let before = attempts();
            let started = std::time::Instant::now();
            let answer = call.run();
            took.entry(verb).or_default().push(started.elapsed());
            answer.assert_ok();
            // A replay that ends in under two minutes here was cut short by the verb.
            let cut_short: Vec<String> = attempts()
                .into_iter()
                .filter(|(id, count)| before.get(id).is_some_and(|was| count > was))
                .map(|(id, _)| id)
                .collect();
            let running = processes_with("sleep 300.").len();
            assert!(
                cut_short.is_empty(),
                "unrelated {verb} {n} ran and cut short the replays of {cut_short:?}"
            );
            assert!(
                running <= 1,
                "{running} hung replays run at once: one worker per node"
            );
        }
        let reached: Vec<String> = primary
            .calls()
            .into_iter()
            .filter(|c| c.container == id && c.phase == "end")
            .map(|c| c.verb)
            .collect();
        assert_eq!(
            reached,
            ["ADD", "CHECK", "DEL"],
            "the unrelated pod {n}'s own verbs did not all reach the primary"
        );
    }
    assert_eq!(
        deferred(&i.store).len(),
        50,
        "an unrelated verb settled a hung deferred DEL"
    );
    let spread = |samples: &mut Vec<std::time::Duration>| {
        samples.sort();
        (samples[samples.len() / 2], samples[samples.len() - 1])
    };
    let (hung_median, hung_max) = timed_adds("busier");
    eprintln!(
        "20 unrelated ADDs: without deferred DELs {:?} median, {:?} max; with fifty hung ones {hung_median:?} \
         median, {hung_max:?} max (in a row)",
        baseline.0, baseline.1
    );
    for (verb, samples) in took.iter_mut() {
        let (median, max) = spread(samples);
        eprintln!(
            "20 unrelated {verb}s beside fifty hung deferred DELs (checked one by one): {median:?} median, {max:?} max"
        );
    }
    i.store.kill_replay_workers();
}

/// A primary whose DEL takes ten seconds, more than a verb could ever spend on another
/// sandbox: its replay runs to the end in the worker, within replayTimeoutSeconds (30 s).
#[test]
fn a_primary_whose_del_takes_ten_seconds_gets_its_replay() {
    let (i, primary) = incident_deferred();
    primary.slow("DEL", &i.a, 10.0);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    // More chances, as a busy node gives them.
    for _ in 0..3 {
        if primary.dels(&i.a) > 0 {
            break;
        }
        sweep_after_the_first_back_off(&i, &primary);
    }
    assert_eq!(
        primary.dels(&i.a),
        1,
        "the slow primary never got the deferred DEL: {:?}",
        deferred(&i.store)
    );
    assert!(deferred(&i.store).is_empty());
}

/// The kernel gives a freed netns's inode to the next namespace made: a netns made again at
/// the old path can have the old inode, and so the old device and inode. Its eth0 (a new
/// sandbox's, same name and MAC) must survive the old sandbox's stale DEL.
#[test]
fn a_netns_made_again_at_the_old_path_with_the_old_inode_keeps_its_interface() {
    sys::skip_unless_root!(&["ip"]);
    use std::os::unix::fs::MetadataExt;
    let name = sys::unique("sgreuse");
    let path = format!("/var/run/netns/{name}");
    let inode = |path: &str| std::fs::metadata(path).map(|m| m.ino()).ok();
    // A namespace whose inode comes back when it is made again (the lowest free one).
    let again = |want: Option<u64>| {
        for _ in 0..40 {
            sys::run("ip", &["netns", "add", &name]);
            if want.is_none() || inode(&path) == want {
                return true;
            }
            sys::run("ip", &["netns", "del", &name]);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    };
    let mut reused = false;
    for _ in 0..10 {
        again(None);
        let first = inode(&path);
        sys::run("ip", &["netns", "del", &name]);
        if again(first) {
            reused = true;
            break;
        }
    }
    if !reused {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the kernel never gave a netns its freed inode again: cannot reproduce"
        );
        eprintln!("SKIPPED: the kernel never gave a netns its freed inode again");
        return;
    }
    let old_inode = inode(&path);
    // Made inside the namespace both times, so each eth0 gets the same index there too.
    let eth0 = || {
        let host_end = sys::unique("sgh");
        sys::run(
            "ip",
            &[
                "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
        );
        sys::run(
            "ip",
            &[
                "-n",
                &name,
                "link",
                "set",
                "eth0",
                "address",
                "02:00:00:00:00:01",
            ],
        );
        host_end
    };
    let (i, primary) = incident();
    let host_a = eth0();
    primary
        .wrap(i.store.add(&i.a, &i.pod_a))
        .netns(&path)
        .run()
        .assert_ok();
    sys::try_run("ip", &["link", "del", &host_a]);
    sys::run("ip", &["netns", "del", &name]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    if !again(old_inode) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the netns did not get its old inode again"
        );
        eprintln!("SKIPPED: the netns did not get its old inode again");
        sys::try_run("ip", &["netns", "del", &name]);
        return;
    }
    let host_end = eth0();
    stale_del_keeps_the_new_eth0(&i, &primary, &name, &host_end);
}

/// A primary that leaves a daemon behind holding its stdout: its DEL answered and exited, so
/// the replay passed; the daemon goes with the primary's process group.
#[test]
fn a_replay_whose_primary_leaves_a_daemon_on_its_stdout_passes_and_the_daemon_goes() {
    let (i, primary) = incident_deferred();
    primary.daemon("DEL", &i.a, 91.25);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let left = processes_with("sleep 91.25");
    kill_processes_with("sleep 91.25");
    assert!(
        deferred(&i.store).is_empty(),
        "the replay passed, yet it stays deferred: {:?}",
        deferred(&i.store)
    );
    assert!(
        left.is_empty(),
        "the primary's daemon outlived its replay: {left:?}"
    );
}

/// A primary whose replayed DEL leaves a daemon of its own session behind (out of reach of
/// its process group's kill): the daemon must not inherit the replay worker's locks, or the
/// pod's next ADD waits on a lock nobody releases, and the replay never looks finished.
#[test]
fn a_daemon_the_primary_leaves_on_a_replay_holds_no_lock_of_the_worker() {
    let (i, primary) = incident_deferred();
    primary.setsid_daemon("DEL", &i.a, 93.25);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    let done = i.store.wait_for_replays(std::time::Duration::from_secs(20));
    let c = container_id();
    let added = primary
        .wrap(i.store.add(&c, &i.pod_a))
        .config("podLockTimeoutSeconds", Some(json!(5)))
        .config("replayTimeoutSeconds", Some(json!(4)))
        .run();
    let left = processes_with("sleep 93.25");
    kill_processes_with("sleep 93.25");
    assert!(!left.is_empty(), "the model primary left no daemon behind");
    added.assert_ok();
    assert!(
        done,
        "the primary's daemon holds the worker's replay.lock: the replay never looks finished"
    );
    assert_eq!(primary.dels(&i.a), 1, "the replay passed");
}

/// A DEL the primary refuses and a CHECK, of sandboxes nobody owns, leave no lock file.
#[test]
fn refused_dels_and_checks_leave_no_pod_lock_file() {
    let (i, primary) = incident();
    let c = container_id();
    let refused = json!({"cniVersion": "1.1.0", "code": 100, "msg": "datastore down"});
    primary.fail("DEL", &c, &refused);
    primary
        .wrap(i.store.del(&c, &i.pod_a))
        .run()
        .assert_error(100);
    let d = container_id();
    let _ = primary
        .wrap(
            i.store
                .cni("CHECK", &d)
                .pod(&cni::Pod::new("lijiaob", "etcd9-0")),
        )
        .run();
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert!(locks.is_empty(), "lock files left: {locks:?}");
}

/// A writer killed while it wrote a deferred DEL leaves a temp file in the key's folder:
/// the replay worker's sweep collects it, and the folder with it.
#[test]
fn temp_files_of_killed_writers_in_deferred_folders_are_collected() {
    let (i, primary) = incident_deferred();
    let refused = json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"});
    primary.fail("DEL", &i.a, &refused);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let folders = cni::files_in(&i.store.state_dir.join("deferred"));
    assert_eq!(folders.len(), 1);
    // A pid no process has (above the kernel's pid_max limit).
    let temp = folders[0].join(".k8s-pod-network:x:eth0.4194305.tmp");
    std::fs::write(&temp, b"half").unwrap();
    let lonely = i.store.state_dir.join("deferred").join("0".repeat(64));
    std::fs::create_dir(&lonely).unwrap();
    std::fs::write(lonely.join(".k8s-pod-network:y:eth0.4194305.tmp"), b"").unwrap();
    let summaries = doctor_summaries(&i.store);
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("store-temp-files") && s.contains("2 temp files")),
        "the doctor counts the temp files in deferred/*/: {summaries:#?}"
    );
    another_pods_add_sweeps(&i, &primary);
    assert!(!temp.exists(), "the temp file is still there");
    assert!(!lonely.exists(), "the folder it alone held is still there");
    assert_eq!(deferred(&i.store).len(), 1, "the entry itself stays");
}

/// Writes `path` until the filesystem refuses with ENOSPC.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 4096];
    while let Ok(n) = file.write(&chunk) {
        if n == 0 {
            break;
        }
    }
}

/// A full state dir cannot keep a stale DEL for later: refused with 11 as in chained mode
/// (the runtime retries), not failed as an I/O error, and the primary never sees it.
#[test]
fn a_stale_del_on_a_full_state_dir_is_refused_as_stale() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let logs = sys::TempDir::new("sglogs");
    let disk = mount::Mount::tmpfs("size=256k,mode=0755");
    let mut i = cni::Incident::of("lijiaob", "etcd1-0");
    i.store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let primary = RecordingPrimary::new();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    let filler = disk.path.join("filler");
    fill(&filler);
    let reply = primary.wrap(i.store.del(&i.a, &i.pod_a)).run();
    std::fs::remove_file(&filler).unwrap();
    let err = reply.assert_error(11);
    assert!(err.text().contains("deferred"), "{err:?}");
    assert_eq!(primary.dels(&i.a), 0, "the primary got the stale DEL");
    // With room again, the retry is deferred.
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    assert_eq!(deferred(&i.store).len(), 1);
    drop(i);
    drop(disk);
}

/// The doctor tells a slow primary (a replay that passed but took more than half of
/// replayTimeoutSeconds) from a broken one (a replay the primary answered with an error).
#[test]
fn the_doctor_tells_a_slow_primary_from_a_broken_one() {
    let (i, primary) = incident();
    let short = |call: cni::Cni| {
        primary
            .wrap(call)
            .config("replayTimeoutSeconds", Some(json!(10)))
    };
    let refused = json!({"cniVersion": "1.1.0", "code": 100, "msg": "datastore down"});
    for (n, slow) in [(1, true), (2, false)] {
        let pod = cni::Pod::new("lijiaob", &format!("etcd{n}-0"));
        let (a, b) = (container_id(), container_id());
        short(i.store.add(&a, &pod)).run().assert_ok();
        short(i.store.add(&b, &pod)).run().assert_ok();
        short(i.store.del(&a, &pod)).run().assert_ok();
        if slow {
            // Over half of replayTimeoutSeconds, with seconds to spare both ways on a loaded
            // machine (it ran out of a 3 s timeout with a 2 s primary on one).
            primary.slow("DEL", &a, 6.0);
        } else {
            primary.fail("DEL", &a, &refused);
        }
        short(i.store.del(&b, &pod)).run().assert_ok();
        i.store.wait_for_replays(REPLAYS_DONE);
    }
    let summaries = doctor_summaries(&i.store);
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("slow-replays") && s.contains("slow")),
        "{summaries:#?}"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("store-deferred") && s.contains("broken")),
        "{summaries:#?}"
    );
}

/// `--downgrade` moves the deferred DELs a replay worker reads and rewrites (its back-off, its
/// removal once replayed): it must not run beside one. While a worker still hands a slow
/// primary its replay, the command gives up after `--lock-timeout`, says why, and changes
/// nothing; once the worker is done it runs.
#[test]
fn the_downgrade_never_runs_beside_a_replay() {
    let (i, primary) = incident_deferred();
    primary.slow("DEL", &i.a, 8.0);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert!(
        !i.store.replay_workers().is_empty(),
        "the slow replay outlasts the owner's DEL"
    );
    let marker = i.store.state_dir.join("pod-keys").join(cni::NETWORK);
    let before = std::fs::read(&marker).unwrap();
    let downgrade = || {
        std::process::Command::new(cni::bin())
            .args(["--downgrade", "--lock-timeout", "1", "--state-dir"])
            .arg(&i.store.state_dir)
            .output()
            .unwrap()
    };
    let refused = downgrade();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("replay workers"),
        "the downgrade ran beside the replay: {refused:?}"
    );
    assert_eq!(
        std::fs::read(&marker).unwrap(),
        before,
        "it changed nothing"
    );
    assert!(i.store.wait_for_replays(REPLAYS_DONE));
    let done = downgrade();
    assert!(done.status.success(), "{done:?}");
    assert_eq!(primary.dels(&i.a), 1, "the replay ran to its end");
}

/// A refused replay's back-off runs on the boot clock, which no setting of the wall clock
/// moves. The wall clock itself is not stepped here: `date -s` would move it for every process
/// on this shared machine, a time namespace offsets only the monotonic and boot clocks (never
/// CLOCK_REALTIME), and faketime's LD_PRELOAD does not reach a static binary. What a step back
/// by an hour does to a deferred DEL is what this test writes: the wall-clock note of its last
/// attempt lies an hour (here: a year) ahead of the wall clock now, while its boot-clock note
/// and the boot clock go on as they were. The entry is sealed again as the store seals it;
/// it must be replayed once its back-off on the boot clock is over, where a back-off on the
/// wall clock would park it for that year.
#[test]
fn a_wall_clock_stepped_back_parks_no_deferred_del() {
    let (i, primary) = a_replay_refused_once();
    let folders = cni::files_in(&i.store.state_dir.join("deferred"));
    let files: Vec<_> = folders.iter().flat_map(|dir| cni::files_in(dir)).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut record = cni::verify_envelope(&files[0]).unwrap();
    assert_eq!(record["attempts"], 1, "{record}");
    let year_ns: u64 = 366 * 86_400 * 1_000_000_000;
    let wall_ns = record["lastAttemptNs"].as_u64().expect("a wall-clock note");
    record["lastAttemptNs"] = json!(wall_ns + year_ns);
    let at = record["lastAttemptAt"].as_str().unwrap().to_string();
    let year: u32 = at[..4].parse().unwrap();
    record["lastAttemptAt"] = json!(format!("{}{}", year + 1, &at[4..]));
    assert!(
        record["lastAttemptBootNs"].is_u64(),
        "a boot-clock note: {record}"
    );
    let text = record.to_string();
    let sealed = format!(
        "{{\"checksum\":\"sha256:{}\",\"record\":{text}}}\n",
        cni::sha256_hex(text.as_bytes())
    );
    std::fs::write(&files[0], sealed).unwrap();
    cni::verify_envelope(&files[0]).unwrap();

    sweep_after_the_first_back_off(&i, &primary);
    assert!(
        deferred(&i.store).is_empty(),
        "the entry is parked by its wall-clock note: {:?}",
        deferred(&i.store)
    );
    assert!(outcomes(&i.store).contains(&(cni::Outcome::Replayed, i.a.clone())));
}

/// Once a first attempt's back-off (two seconds on the boot clock) is over, another pod's ADD
/// starts the node's sweep.
fn sweep_after_the_first_back_off(i: &Incident, primary: &RecordingPrimary) {
    std::thread::sleep(std::time::Duration::from_millis(2200));
    another_pods_add_sweeps(i, primary);
}

/// Another pod's ADD, which starts the node's sweep; returns when its worker is done.
fn another_pods_add_sweeps(i: &Incident, primary: &RecordingPrimary) {
    primary
        .wrap(
            i.store
                .add(&container_id(), &cni::Pod::new("lijiaob", "etcd2-0")),
        )
        .run()
        .assert_ok();
    assert!(i.store.wait_for_replays(REPLAYS_DONE));
}

/// `--doctor`'s findings on `store` (with its log), "check: summary" each.
fn doctor_summaries(store: &Store) -> Vec<String> {
    store
        .doctor_findings(&["--log-file", store.log_file.to_str().unwrap()])
        .iter()
        .map(|f| format!("{}: {}", f["check"], f["summary"]))
        .collect()
}

/// GC is no pod's verb, but it is unrelated to the pods whose deferred DELs wait: it starts
/// the node's sweep and answers without waiting for the replays the sweep runs, each on
/// another pod's primary (here one that takes a little under a second).
#[test]
fn gc_does_not_wait_for_the_replays_its_sweep_runs() {
    let (i, primary) = a_replay_refused_once();
    primary.slow("DEL", &i.a, 0.9);
    primary
        .wrap(i.store.cni("GC", ""))
        .config("cni.dev/valid-attachments", Some(json!([])))
        .run()
        .assert_ok();
    let replayed_before_gc_answered = deferred(&i.store).is_empty();
    assert!(i.store.wait_for_replays(REPLAYS_DONE));
    assert!(deferred(&i.store).is_empty(), "the sweep replayed it");
    assert!(
        !replayed_before_gc_answered,
        "GC answered only once another pod's replay was done"
    );
}

/// The incident with A's DEL deferred, its replay refused once by the primary (when B's DEL
/// freed the pod) and the primary healed since.
fn a_replay_refused_once() -> (Incident, RecordingPrimary) {
    let (i, primary) = incident_deferred();
    let locked = json!({"cniVersion": "1.1.0", "code": 11, "msg": "datastore is locked"});
    primary.fail("DEL", &i.a, &locked);
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert!(i.store.wait_for_replays(REPLAYS_DONE));
    primary.heal("DEL", &i.a);
    (i, primary)
}

/// The flock held on `pod-waits/<digest>` by `pid`, shared, per /proc/locks.
fn holds_shared_flock(pid: u32, file: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(file).unwrap().ino();
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .any(|f| {
            f.len() >= 6
                && f[1] == "FLOCK"
                && f[3] == "READ"
                && f[4] == pid.to_string()
                && f[5].ends_with(&format!(":{ino}"))
        })
}

/// A verb that comes while someone looks at the pod's waiting sign (the worker's `try_acquire`,
/// GC's clean-up, another waiter leaving: each holds that file's flock exclusively for a
/// moment) still makes its sign once the look is over, so the worker does not take the pod
/// lock back before it.
#[test]
fn a_verb_that_waits_makes_its_sign_after_a_momentary_look_at_it() {
    let (i, primary) = incident();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert_eq!(locks.len(), 1, "{locks:?}");
    let lock_path = locks[0].clone();
    let held = std::fs::File::open(&lock_path).unwrap();
    held.try_lock().unwrap();
    let waits = i.store.state_dir.join("pod-waits");
    std::fs::create_dir_all(&waits).unwrap();
    let sign = waits.join(lock_path.file_name().unwrap());
    let look = std::fs::File::create(&sign).unwrap();
    look.try_lock().unwrap();
    let c = container_id();
    let running = primary
        .wrap(i.store.add(&c, &i.pod_a))
        .config("podLockTimeoutSeconds", Some(json!(60)))
        .spawn();
    // Ordering only: the verb has found the pod lock taken and the sign's file locked.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(look);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let signed = holds_shared_flock(running.pid, &sign);
    drop(held);
    running.wait().assert_ok();
    assert!(
        signed,
        "the waiting ADD holds no shared flock on its pod's pod-waits file: the worker would go before it"
    );
}

/// A worker with several slow replays of one pod ahead of it: an operator's `--downgrade` that
/// waits for `replay.lock` runs once the replay running when it came ends, not after every
/// replay the worker would still start (each a primary run of up to replayTimeoutSeconds, for
/// up to ten minutes of a worker's life): a worker starts no replay while an operator command
/// waits, and no verb starts a worker then.
#[test]
fn a_waiting_downgrade_goes_before_the_workers_next_replays() {
    let (i, primary) = incident();
    let olds: Vec<String> = (0..4).map(|_| container_id()).collect();
    for old in &olds {
        primary.wrap(i.store.add(old, &i.pod_a)).run().assert_ok();
    }
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    for old in &olds {
        primary.wrap(i.store.del(old, &i.pod_a)).run().assert_ok();
        primary.slow("DEL", old, 2.5);
    }
    primary.wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
    assert!(
        !i.store.replay_workers().is_empty(),
        "the slow replays outlast the owner's DEL"
    );
    let done = std::process::Command::new(cni::bin())
        .args(["--downgrade", "--lock-timeout", "60", "--state-dir"])
        .arg(&i.store.state_dir)
        .output()
        .unwrap();
    assert!(done.status.success(), "{done:?}");
    let replayed_before = olds
        .iter()
        .filter(|old| {
            primary
                .started()
                .iter()
                .any(|(verb, c)| verb == "DEL" && c == *old)
        })
        .count();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert!(
        replayed_before <= 2,
        "the downgrade waited for {replayed_before} of the worker's 4 slow replays"
    );
}

/// A verb killed while it waited for its pod's lock (the runtime's timeout) leaves its
/// `pod-waits` file; containerd before 2.0 sends no GC, so the sweep collects it.
#[test]
fn the_waiting_sign_of_a_killed_verb_goes_with_the_next_sweep() {
    let (i, primary) = incident_deferred();
    let locks = cni::files_in(&i.store.state_dir.join("pod-locks"));
    assert_eq!(locks.len(), 1, "{locks:?}");
    let held = std::fs::File::open(&locks[0]).unwrap();
    held.try_lock().unwrap();
    let sign = i
        .store
        .state_dir
        .join("pod-waits")
        .join(locks[0].file_name().unwrap());
    let mut running = primary
        .wrap(i.store.add(&container_id(), &i.pod_a))
        .config("podLockTimeoutSeconds", Some(json!(60)))
        .spawn();
    let mut polls = 0;
    while !(sign.exists() && holds_shared_flock(running.pid, &sign)) {
        polls += 1;
        assert!(polls < 3000, "the ADD never waited for the pod lock");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(running.kill());
    let _ = running.wait();
    drop(held);
    let other = cni::Pod::new("lijiaob", "etcd2-0");
    primary
        .wrap(i.store.add(&container_id(), &other))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    let waits = cni::files_in(&i.store.state_dir.join("pod-waits"));
    assert!(waits.is_empty(), "left: {waits:?}");
}
