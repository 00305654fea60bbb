//! Staleness judged by the key the primary uses (`podKey`). Primaries keyed by pod name alone
//! (calico up to 2.1 with etcd, sticky-IP macvlan plugins) release whatever the pod's name holds on any
//! DEL: an old sandbox attached as `net1` tears down a new one attached as `net2` (multus
//! numbers interfaces by their place in the pod's annotation). Also: a sandbox with two
//! interfaces on one network, and a state dir written by the release that keyed by ifname;
//! that release's own binary (built from its commit, tests/support/old_release.rs) and this
//! one interleaved: a rolling upgrade, its unsynced generations, the way back.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/old_release.rs"]
mod old_release;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Incident, NETWORK, Pod, Store, files_in, verify_envelope};
use primary::RecordingPrimary;
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

/// ADD A as net1, ADD B as net2: the same pod on the same network, re-created.
fn two_ifnames(i: &Incident, wrap: impl Fn(cni::Cni) -> cni::Cni) {
    wrap(i.store.add(&i.a, &i.pod_a).ifname("net1"))
        .run()
        .assert_ok();
    wrap(i.store.add(&i.b, &i.pod_b).ifname("net2"))
        .run()
        .assert_ok();
}

#[test]
fn an_old_sandboxs_del_under_another_ifname_is_refused() {
    let i = Incident::of("lijiaob", "etcd1-0");
    two_ifnames(&i, |call| call);
    let refused = i
        .store
        .del(&i.a, &i.pod_a)
        .ifname("net1")
        .run()
        .assert_error(11);
    assert!(
        refused.msg.contains("stale DEL") && refused.msg.contains(&i.b[..13]),
        "{}",
        refused.text()
    );
    // Whatever ifname the old sandbox's DEL names.
    i.store
        .del(&i.a, &i.pod_a)
        .ifname("eth0")
        .run()
        .assert_error(11);
    i.store.assert_every_owner_has_its_record();
    // Once B is gone, A's DEL passes.
    i.store.del(&i.b, &i.pod_b).ifname("net2").run().assert_ok();
    i.store.del(&i.a, &i.pod_a).ifname("net1").run().assert_ok();
    assert!(i.store.owner_files().is_empty());
}

#[test]
fn an_old_sandboxs_del_under_another_ifname_is_deferred_in_delegate_mode() {
    let i = Incident::of("lijiaob", "etcd1-0");
    let primary = RecordingPrimary::new();
    two_ifnames(&i, |call| primary.wrap(call));
    primary
        .wrap(i.store.del(&i.a, &i.pod_a).ifname("net1"))
        .run()
        .assert_ok();
    assert_eq!(
        primary.dels(&i.a),
        0,
        "A's DEL must not reach the primary while B owns the pod"
    );
    let deferred: Vec<Value> = i
        .store
        .dump()
        .into_iter()
        .filter(|row| row["status"] == "deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "{deferred:?}");
    assert_eq!(
        (&deferred[0]["containerId"], &deferred[0]["ifName"]),
        (&json!(i.a), &json!("net1"))
    );
    assert!(i.store.is_owner(&i.b, "net2"));

    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("net2"))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        primary.dels(&i.a),
        1,
        "A's DEL is replayed once the pod's name is free"
    );
    let replay = primary.stdin("DEL", &i.a);
    assert_eq!(
        replay["prevResult"]["interfaces"][0]["name"],
        json!("net1"),
        "A's own result: {replay}"
    );
    assert!(i.store.dump().is_empty(), "{:?}", i.store.dump());
}

#[test]
fn with_pod_key_name_and_ifname_each_interface_is_its_own_key() {
    let i = Incident::of("lijiaob", "etcd1-0");
    let per_interface = |call: cni::Cni| call.config("podKey", Some(json!("name-and-ifname")));
    two_ifnames(&i, per_interface);
    per_interface(i.store.del(&i.a, &i.pod_a).ifname("net1"))
        .run()
        .assert_ok();
    // The same ifname is still the same key.
    let c = cni::container_id();
    per_interface(i.store.add(&c, &i.pod_a).ifname("net2"))
        .run()
        .assert_ok();
    per_interface(i.store.del(&i.b, &i.pod_b).ifname("net2"))
        .run()
        .assert_error(11);
}

#[test]
fn an_unknown_pod_key_is_an_invalid_config_and_writes_nothing() {
    let i = Incident::of("lijiaob", "etcd1-0");
    for verb in ["ADD", "DEL"] {
        let call = i
            .store
            .cni(verb, &i.a)
            .pod(&i.pod_a)
            .config("podKey", Some(json!("ifname")));
        let error = call.run().assert_error(7);
        assert!(
            error.msg.contains("podKey") && error.msg.contains("\"name\""),
            "{}",
            error.text()
        );
    }
    assert!(
        !i.store.state_dir.exists(),
        "a rejected config leaves no trace"
    );
}

/// A: the old sandbox (eth0). B: the new one, attached twice to the same network (eth0, net1).
fn two_interfaces() -> Incident {
    let i = Incident::of("shop", "web-0");
    i.store.add(&i.a, &i.pod_a).run().assert_ok();
    i.store.add(&i.b, &i.pod_b).ifname("eth0").run().assert_ok();
    i.store.add(&i.b, &i.pod_b).ifname("net1").run().assert_ok();
    i
}

#[test]
fn a_sandbox_with_two_interfaces_keeps_the_pod_until_its_last_del() {
    let i = two_interfaces();
    assert_eq!(i.store.owner_files().len(), 1, "one pod, one owner");
    assert!(i.store.is_owner(&i.b, "eth0") && i.store.is_owner(&i.b, "net1"));

    i.store.del(&i.b, &i.pod_b).ifname("eth0").run().assert_ok();
    i.store.assert_every_owner_has_its_record();
    assert!(
        i.store.is_owner(&i.b, "net1"),
        "net1 is still attached: B still owns the pod"
    );
    i.store.del(&i.a, &i.pod_a).run().assert_error(11);

    i.store.del(&i.b, &i.pod_b).ifname("net1").run().assert_ok();
    assert!(
        i.store.owner_files().is_empty(),
        "B's last interface went: the pod's name is free"
    );
    i.store.del(&i.a, &i.pod_a).run().assert_ok();
}

#[test]
fn gc_releases_the_interfaces_the_runtime_no_longer_lists_one_by_one() {
    let i = two_interfaces();
    let listed =
        json!([{"containerID": i.a, "ifname": "eth0"}, {"containerID": i.b, "ifname": "net1"}]);
    i.store
        .cni("GC", "")
        .config("cni.dev/valid-attachments", Some(listed))
        .run()
        .assert_ok();
    i.store.assert_every_owner_has_its_record();
    assert!(i.store.is_owner(&i.b, "net1"));
    i.store.del(&i.a, &i.pod_a).run().assert_error(11);
}

// ---------------------------------------------------------------------------------------
// Upgrade in place from the release that keyed by (network, namespace, name, ifname)

/// The containers of testdata/upgrade/state-v1 (see its make script): etcd1-0's A (net1) and
/// B (net2), web-0's C and D (C's DEL refused), db-0's E and F (E's DEL deferred).
fn fixture_ids() -> std::collections::HashMap<String, String> {
    testdata::fixture("upgrade/state-v1.ids")
        .lines()
        .filter_map(|line| {
            line.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// A copy of the old release's state dir, with the modes git does not keep.
fn old_store() -> (sys::TempDir, Store) {
    let root = sys::TempDir::new("sgup");
    let state_dir = root.path.join("state");
    cni::copy_state_dir(&testdata::fixture_path("upgrade/state-v1"), &state_dir);
    let store = Store::with_state_dir(state_dir, &root.path);
    (root, store)
}

fn pod(name: &str, uid: &str) -> Pod {
    Pod {
        uid: uid.into(),
        ..Pod::new("lijiaob", name)
    }
}

#[test]
fn an_old_releases_state_dir_keeps_every_pod_protected_and_moves_to_the_new_keys() {
    let (_root, store) = old_store();
    let ids = fixture_ids();
    let (etcd_a, web_c) = (pod("etcd1-0", "uid-a"), pod("web-0", "uid-c"));
    let before: Vec<Value> = store.dump();
    assert!(
        before
            .iter()
            .any(|row| row["containerId"] == ids["b"] && row["owner"] == true),
        "the dump reads the old layout: {before:?}"
    );

    // The old release gave A (net1) and B (net2) a key each; by pod name B owns the pod now.
    store
        .del(&ids["a"], &etcd_a)
        .ifname("net1")
        .run()
        .assert_error(11);
    store
        .del(&ids["a"], &etcd_a)
        .ifname("eth0")
        .run()
        .assert_error(11);
    store.del(&ids["c"], &web_c).run().assert_error(11);
    store.assert_every_owner_has_its_record();

    // Moved: no owner, ledger entry or deferred DEL is keyed by ifname any more.
    for path in files_in(&store.state_dir.join("owners")) {
        let owner = verify_envelope(&path).unwrap();
        assert!(
            owner.get("ifName").is_none() && owner["interfaces"].is_array(),
            "{owner}"
        );
    }
    let ledger = store
        .ledger_entry(&web_c)
        .expect("web-0's ledger entry under its new key");
    assert_eq!(
        ledger["refused"],
        json!(2),
        "the old release's refusal is kept and the new one counted: {ledger}"
    );
    assert_eq!(
        files_in(&store.state_dir.join("ledger")).len(),
        3,
        "web-0, db-0 and etcd1-0's new entry"
    );
    let owners: Vec<Value> = files_in(&store.state_dir.join("owners"))
        .iter()
        .map(|p| verify_envelope(p).unwrap())
        .collect();
    let etcd = owners.iter().find(|o| o["podName"] == "etcd1-0").unwrap();
    assert_eq!(
        (&etcd["containerId"], &etcd["interfaces"]),
        (&json!(ids["b"]), &json!(["net2"])),
        "the last ADD wins"
    );
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert!(store.state_dir.join("pod-keys").join(NETWORK).exists());

    // db-0's deferred DEL, made under the old key, reaches the primary once F goes.
    let primary = RecordingPrimary::new();
    let db_f = pod("db-0", "uid-f");
    primary.wrap(store.del(&ids["f"], &db_f)).run().assert_ok();
    store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(primary.dels(&ids["e"]), 1, "E's deferred DEL was replayed");
    assert!(store.dump().iter().all(|row| row["status"] != "deferred"));

    // And the pods B and D still own release as they should.
    store
        .del(&ids["b"], &pod("etcd1-0", "uid-b"))
        .ifname("net2")
        .run()
        .assert_ok();
    store
        .del(&ids["a"], &etcd_a)
        .ifname("net1")
        .run()
        .assert_ok();
    store
        .del(&ids["d"], &pod("web-0", "uid-d"))
        .run()
        .assert_ok();
    store.del(&ids["c"], &web_c).run().assert_ok();
    assert!(store.owner_files().is_empty());
}

#[test]
fn an_old_releases_state_dir_needs_no_move_under_name_and_ifname() {
    let (_root, store) = old_store();
    let ids = fixture_ids();
    let owners_before = files_in(&store.state_dir.join("owners"));
    let per_interface = |call: cni::Cni| call.config("podKey", Some(json!("name-and-ifname")));
    per_interface(store.del(&ids["c"], &pod("web-0", "uid-c")))
        .run()
        .assert_error(11);
    assert_eq!(
        files_in(&store.state_dir.join("owners")),
        owners_before,
        "the old keys are this rule's keys"
    );
    // Changing the rule later moves them then.
    store
        .del(&ids["a"], &pod("etcd1-0", "uid-a"))
        .ifname("net1")
        .run()
        .assert_error(11);
    per_interface(
        store
            .del(&ids["a"], &pod("etcd1-0", "uid-a"))
            .ifname("net1"),
    )
    .run()
    .assert_ok();
}

#[test]
fn an_old_releases_damaged_ownership_still_refuses_the_del_that_needs_it() {
    let (_root, store) = old_store();
    let ids = fixture_ids();
    // web-0's owner (D), filed by the old release under the digest of (network, lijiaob, web-0, eth0).
    let owner = store
        .state_dir
        .join("owners/4ef0268c358362ee07eb31bb753cf10a380c295b4dbcb7c96f38d06bd631650a");
    cni::corrupt_one_digit(&owner, ids["d"].as_bytes());
    let refused = store
        .del(&ids["c"], &pod("web-0", "uid-c"))
        .run()
        .assert_error(101);
    assert!(refused.text().contains("set-aside"), "{}", refused.text());
    // The way out the error gives: the operator checks and deletes the set-aside file.
    for path in files_in(&store.state_dir.join("set-aside")) {
        std::fs::remove_file(path).unwrap();
    }
    store
        .del(&ids["c"], &pod("web-0", "uid-c"))
        .run()
        .assert_ok();
}

/// Delegate mode: A (eth0) superseded by B, attached as eth0 and net1; A's DEL deferred.
fn deferred_behind_two_interfaces() -> (Incident, RecordingPrimary) {
    let i = Incident::of("shop", "web-0");
    let primary = RecordingPrimary::new();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b).ifname("eth0"))
        .run()
        .assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b).ifname("net1"))
        .run()
        .assert_ok();
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    (i, primary)
}

#[test]
fn in_delegate_mode_a_deferred_del_waits_for_the_owners_last_interface() {
    let (i, primary) = deferred_behind_two_interfaces();
    assert_eq!(
        primary.dels(&i.a),
        0,
        "A's DEL is deferred while B owns the pod"
    );

    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("eth0"))
        .run()
        .assert_ok();
    assert_eq!(
        primary.dels(&i.a),
        0,
        "B's net1 is still attached: A's DEL still waits"
    );
    i.store.assert_every_owner_has_its_record();

    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("net1"))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        primary.dels(&i.a),
        1,
        "B's last interface went: A's DEL is replayed"
    );
    assert!(i.store.dump().is_empty(), "{:?}", i.store.dump());
}

/// A node whose state dir went read-only (a disk error remounts ext4 so) before the first verb
/// after the upgrade: the re-key cannot run, and the owners still sit under the old digests.
/// An old sandbox's stale DEL must still be refused, in both modes, and nothing written.
#[test]
fn an_old_releases_state_dir_that_cannot_be_rekeyed_still_refuses_stale_dels() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let (_root, store) = old_store();
    let ids = fixture_ids();
    let before = store.dump();
    let read_only = mount::Mount::read_only_bind(&store.state_dir);
    // B (net2) took etcd1-0 after A (net1): by pod name A's DELs are stale, whatever ifname.
    for if_name in ["net1", "eth0"] {
        let refused = store
            .del(&ids["a"], &pod("etcd1-0", "uid-a"))
            .ifname(if_name)
            .run()
            .assert_error(11);
        assert!(
            refused.msg.contains("stale DEL") && refused.msg.contains(&ids["b"][..13]),
            "{}",
            refused.text()
        );
        assert!(
            refused.details.contains("podKey"),
            "details say why and how out: {}",
            refused.text()
        );
        let primary = RecordingPrimary::new();
        primary
            .wrap(
                store
                    .del(&ids["a"], &pod("etcd1-0", "uid-a"))
                    .ifname(if_name),
            )
            .run()
            .assert_error(11);
        assert_eq!(primary.dels(&ids["a"]), 0, "the primary never saw A's DEL");
    }
    // web-0's C was already refused once under the old key; D still owns the pod.
    store
        .del(&ids["c"], &pod("web-0", "uid-c"))
        .run()
        .assert_error(11);
    // The owner's own DEL still passes (its record stays until the store takes writes).
    store
        .del(&ids["b"], &pod("etcd1-0", "uid-b"))
        .ifname("net2")
        .run()
        .assert_ok();
    drop(read_only);
    assert_eq!(store.dump(), before, "nothing was written");
    // Writable again: the next verb re-keys, and the protection stays.
    store
        .del(&ids["a"], &pod("etcd1-0", "uid-a"))
        .ifname("net1")
        .run()
        .assert_error(11);
    assert!(store.state_dir.join("pod-keys").join(NETWORK).exists());
}

/// What the re-key leaves behind, to compare runs: each owner, deferred DEL, set-aside file
/// (a kept copy without its time) and marker by path, with what it holds when it verifies.
fn rekeyed_state(store: &Store) -> std::collections::BTreeMap<String, Value> {
    files_under(store, &["owners", "deferred", "set-aside", "pod-keys"])
}

/// Each file under the store's `dirs` (temp files aside) by path, a kept copy without its
/// time, with what it holds when it verifies.
fn files_under(store: &Store, dirs: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let mut found = std::collections::BTreeMap::new();
    let mut dirs: Vec<std::path::PathBuf> = dirs.iter().map(|d| store.state_dir.join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for path in files_in(&dir) {
            let name = path
                .strip_prefix(&store.state_dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if name.rsplit('/').next().unwrap().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = name.split('~').next().unwrap().to_string();
            found.insert(name, verify_envelope(&path).unwrap_or(Value::Null));
        }
    }
    found
}

/// The system calls a store's writer makes its steps with, one kind at a time: a test kills it
/// on entry to each in turn.
const WRITE_STEPS: [&str; 5] = [
    "rename",
    "link,linkat",
    "unlink,unlinkat",
    "fsync,fdatasync",
    "mkdir,mkdirat",
];

/// SIGKILL on entry to each of the re-key's steps in turn (every rename, link, unlink, fsync
/// and mkdir it makes, until a run gets through), on the old release's state dir, with and
/// without a damaged owner file under an old digest: no owner is ever without its record,
/// every stale DEL stays refused, and the re-run leaves what an uncut run leaves, the old
/// refusals counted once.
#[test]
fn a_rekey_killed_at_any_step_loses_nothing_and_runs_again_to_the_same_store() {
    sys::skip_unless_root!(&["strace"]);
    let ids = fixture_ids();
    let (etcd_a, web_c) = (pod("etcd1-0", "uid-a"), pod("web-0", "uid-c"));
    for damaged in [false, true] {
        let fresh = || {
            let (root, store) = old_store();
            if damaged {
                let owner = store.state_dir.join(
                    "owners/4ef0268c358362ee07eb31bb753cf10a380c295b4dbcb7c96f38d06bd631650a",
                );
                cni::corrupt_one_digit(&owner, ids["d"].as_bytes());
            }
            (root, store)
        };
        let web_code = if damaged { 101 } else { 11 };
        let finish = |store: &Store| {
            store
                .del(&ids["a"], &etcd_a)
                .ifname("net1")
                .run()
                .assert_error(11);
            store.del(&ids["c"], &web_c).run().assert_error(web_code);
            store.assert_every_owner_has_its_record();
        };
        let (_uncut_root, uncut) = fresh();
        uncut
            .del(&ids["a"], &etcd_a)
            .ifname("net1")
            .run()
            .assert_error(11);
        finish(&uncut);
        let expected = rekeyed_state(&uncut);
        let web_refused = uncut
            .ledger_entry(&web_c)
            .map(|entry| entry["refused"].clone());
        let mut kills = 0;
        for syscalls in WRITE_STEPS {
            for nth in 1..100 {
                let (_root, store) = fresh();
                let reply = store.del(&ids["a"], &etcd_a).ifname("net1").run_killed_at(
                    cni::Traced::PluginOnly,
                    syscalls,
                    nth,
                );
                if reply.status.signal() != Some(9) {
                    reply.assert_error(11);
                    break;
                }
                kills += 1;
                store.assert_every_owner_has_its_record();
                finish(&store);
                assert_eq!(
                    rekeyed_state(&store),
                    expected,
                    "killed at {syscalls} #{nth}"
                );
                let refused = store
                    .ledger_entry(&web_c)
                    .map(|entry| entry["refused"].clone());
                assert_eq!(
                    refused, web_refused,
                    "killed at {syscalls} #{nth}: web-0's old refusal counted once"
                );
            }
        }
        assert!(kills > 10, "only {kills} kills: the test proves little");
    }
}

/// As containerd tears a sandbox down: StopPodSandbox's DEL with the netns, then
/// RemovePodSandbox's with an empty netns and no prevResult.
fn containerd_dels(call: impl Fn() -> cni::Cni) -> [cni::Reply; 2] {
    [call().run(), call().netns("").no_prev_result().run()]
}

#[test]
fn an_owner_with_two_interfaces_keeps_the_pod_through_the_runtimes_sequences() {
    let i = two_interfaces();
    // B's eth0 goes (twice, as containerd sends it); net1 still holds the pod.
    for reply in containerd_dels(|| i.store.del(&i.b, &i.pod_b).ifname("eth0")) {
        reply.assert_ok();
    }
    assert!(i.store.is_owner(&i.b, "net1"));
    for reply in containerd_dels(|| i.store.del(&i.a, &i.pod_a)) {
        reply.assert_error(11);
    }
    // GC listing only one of B's interfaces keeps B the owner by it.
    let listed =
        json!([{"containerID": i.a, "ifname": "eth0"}, {"containerID": i.b, "ifname": "net1"}]);
    i.store
        .cni("GC", "")
        .config("cni.dev/valid-attachments", Some(listed))
        .run()
        .assert_ok();
    i.store.del(&i.a, &i.pod_a).run().assert_error(11);
    // Re-ADDed under another ifname, B holds the pod by both; the DEL of one keeps it.
    i.store.add(&i.b, &i.pod_b).ifname("net2").run().assert_ok();
    i.store.del(&i.b, &i.pod_b).ifname("net1").run().assert_ok();
    assert!(i.store.is_owner(&i.b, "net2"));
    i.store.del(&i.a, &i.pod_a).run().assert_error(11);
    i.store.assert_every_owner_has_its_record();
    // Re-ADDed under another pod name, B's last interface on web-0 is gone: the name is free.
    let other_pod = Pod {
        uid: i.pod_b.uid.clone(),
        ..Pod::new("shop", "web-1")
    };
    i.store
        .add(&i.b, &other_pod)
        .ifname("net2")
        .run()
        .assert_ok();
    i.store.assert_every_owner_has_its_record();
    i.store.del(&i.a, &i.pod_a).run().assert_ok();
    i.store
        .del(&i.b, &other_pod)
        .ifname("net2")
        .run()
        .assert_ok();
    assert!(i.store.owner_files().is_empty());
}

#[test]
fn in_delegate_mode_a_twice_sent_del_of_one_interface_replays_nothing_early() {
    let i = Incident::of("shop", "web-0");
    let primary = RecordingPrimary::new();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b).ifname("eth0"))
        .run()
        .assert_ok();
    primary
        .wrap(i.store.add(&i.b, &i.pod_b).ifname("net1"))
        .run()
        .assert_ok();
    for reply in containerd_dels(|| primary.wrap(i.store.del(&i.a, &i.pod_a))) {
        reply.assert_ok();
    }
    for reply in containerd_dels(|| primary.wrap(i.store.del(&i.b, &i.pod_b).ifname("eth0"))) {
        reply.assert_ok();
    }
    assert_eq!(
        primary.dels(&i.a),
        0,
        "B's net1 is still attached: A's DEL waits"
    );
    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("net1"))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(primary.dels(&i.a), 1, "A's DEL is replayed once");
    i.store.assert_every_owner_has_its_record();
}

/// The same on a full disk: the store opens (its folders are there) but the re-key's first
/// write fails. The DEL then judges from the old files too, in both modes.
#[test]
fn an_old_releases_state_dir_on_a_full_disk_still_refuses_stale_dels() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let ids = fixture_ids();
    let logs = sys::TempDir::new("sglogs");
    let disk = mount::Mount::tmpfs("size=256k,mode=0755");
    let state_dir = disk.path.join("state");
    cni::copy_state_dir(&testdata::fixture_path("upgrade/state-v1"), &state_dir);
    for folder in [
        "set-aside",
        "failed-adds",
        "ledger",
        "deferred",
        "pod-locks",
    ] {
        std::fs::create_dir_all(state_dir.join(folder)).unwrap();
    }
    let store = Store::with_state_dir(state_dir, &logs.path);
    let filler = disk.path.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).unwrap();
        while file.write(&[0xa5u8; 4096]).is_ok_and(|n| n > 0) {}
    }
    let refused = store
        .del(&ids["a"], &pod("etcd1-0", "uid-a"))
        .ifname("net1")
        .run()
        .assert_error(11);
    assert!(refused.msg.contains(&ids["b"][..13]), "{}", refused.text());
    let primary = RecordingPrimary::new();
    let deferred = primary
        .wrap(
            store
                .del(&ids["a"], &pod("etcd1-0", "uid-a"))
                .ifname("eth0"),
        )
        .run();
    assert!(
        !deferred.succeeded() || !store.dump().iter().all(|row| row["status"] != "deferred"),
        "told success, kept nowhere: {deferred:?}"
    );
    assert_eq!(primary.dels(&ids["a"]), 0, "the primary never saw A's DEL");
    assert!(
        !store.state_dir.join("pod-keys").join(NETWORK).exists(),
        "the disk was full: no move"
    );
    std::fs::remove_file(&filler).unwrap();
    store
        .del(&ids["a"], &pod("etcd1-0", "uid-a"))
        .ifname("net1")
        .run()
        .assert_error(11);
    assert!(store.state_dir.join("pod-keys").join(NETWORK).exists());
}

/// The first verbs after the upgrade race, on two networks of one state dir: each network is
/// re-keyed once, by whichever writer comes first, and every stale DEL is refused meanwhile.
#[test]
fn the_first_verbs_after_the_upgrade_race_on_two_networks() {
    let ids = fixture_ids();
    for _ in 0..3 {
        let (_root, store) = old_store();
        let other = |call: cni::Cni| call.config("name", Some(json!("other-net")));
        let replies: Vec<(bool, cni::Reply)> = std::thread::scope(|scope| {
            let mut running = Vec::new();
            for n in 0..4 {
                let store = &store;
                let ids = &ids;
                running.push(scope.spawn(move || {
                    (
                        true,
                        store
                            .del(&ids["a"], &pod("etcd1-0", "uid-a"))
                            .ifname(if n % 2 == 0 { "net1" } else { "eth0" })
                            .run(),
                    )
                }));
                running.push(scope.spawn(move || {
                    (
                        false,
                        other(store.add(&cni::container_id(), &Pod::new("lijiaob", "etcd1-0")))
                            .run(),
                    )
                }));
            }
            running.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (stale, reply) in replies {
            if stale {
                reply.assert_error(11);
            } else {
                reply.assert_ok();
            }
        }
        for network in [NETWORK, "other-net"] {
            assert!(
                store.state_dir.join("pod-keys").join(network).exists(),
                "{network} marked"
            );
        }
        store.assert_every_owner_has_its_record();
        let owners: Vec<Value> = store
            .owner_files()
            .iter()
            .map(|p| verify_envelope(p).unwrap())
            .collect();
        let ours: Vec<&Value> = owners.iter().filter(|o| o["network"] == NETWORK).collect();
        assert_eq!(
            ours.len(),
            3,
            "etcd1-0, web-0 and db-0, each once: {ours:?}"
        );
        assert!(ours.iter().all(|o| o.get("ifName").is_none()));
        assert_eq!(
            owners
                .iter()
                .filter(|o| o["network"] == "other-net")
                .count(),
            1,
            "the last ADD on other-net owns its etcd1-0"
        );
        let etcd = store
            .ledger_entry(&pod("etcd1-0", "uid-a"))
            .expect("etcd1-0's refusals");
        assert_eq!(etcd["refused"], json!(4), "{etcd}");
    }
}

/// An operator switches `podKey` to "name-and-ifname" and back on a live store in delegate
/// mode: the owner with two interfaces, the deferred DEL of the old sandbox and its ledger
/// entry go both ways, and the deferred DEL reaches the primary once, after the owner's last
/// interface.
#[test]
fn switching_pod_key_back_and_forth_keeps_owners_and_deferred_dels() {
    let (i, primary) = deferred_behind_two_interfaces();
    let per_interface = |call: cni::Cni| call.config("podKey", Some(json!("name-and-ifname")));
    let unrelated = || {
        (
            cni::container_id(),
            Pod::new("shop", &format!("other-{}", &cni::container_id()[..6])),
        )
    };
    for rule in [
        per_interface as fn(cni::Cni) -> cni::Cni,
        |call| call,
        per_interface,
        |call| call,
    ] {
        let (c, p) = unrelated();
        primary.wrap(rule(i.store.add(&c, &p))).run().assert_ok();
        assert_eq!(primary.dels(&i.a), 0, "B still holds eth0: A's DEL waits");
        assert!(i.store.is_owner(&i.b, "eth0") && i.store.is_owner(&i.b, "net1"));
        i.store.assert_every_owner_has_its_record();
        assert_eq!(
            i.store
                .dump()
                .iter()
                .filter(|row| row["status"] == "deferred")
                .count(),
            1
        );
    }
    let ledger = i
        .store
        .ledger_entry(&i.pod_a)
        .expect("the deferral counted under the name key");
    assert_eq!(ledger["deferred"], json!(1), "{ledger}");
    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("eth0"))
        .run()
        .assert_ok();
    assert_eq!(primary.dels(&i.a), 0);
    primary
        .wrap(i.store.del(&i.b, &i.pod_b).ifname("net1"))
        .run()
        .assert_ok();
    i.store.wait_for_replays(REPLAYS_DONE);
    assert_eq!(
        primary.dels(&i.a),
        1,
        "A's DEL is replayed once, after B's last interface"
    );
}

/// The old release filed etcd1-0 under two keys, A's (net1) and B's (net2); B's file is
/// damaged. By pod name B's is the one that counts: A's DEL must not pass on A's own old key.
#[test]
fn a_damaged_owner_under_another_interfaces_old_key_still_refuses_the_old_sandbox() {
    let ids = fixture_ids();
    for read_only in [false, true] {
        if read_only && !sys::require(sys::test_name!(), true, &["mount", "umount"]) {
            continue;
        }
        let (_root, store) = old_store();
        let owner_of_b = store
            .owner_files()
            .into_iter()
            .find(|p| {
                std::fs::read(p)
                    .unwrap()
                    .windows(64)
                    .any(|w| w == ids["b"].as_bytes())
            })
            .unwrap();
        cni::corrupt_one_digit(&owner_of_b, ids["b"].as_bytes());
        let _mount = read_only.then(|| mount::Mount::read_only_bind(&store.state_dir));
        let reply = store
            .del(&ids["a"], &pod("etcd1-0", "uid-a"))
            .ifname("net1")
            .run();
        let refused = reply.assert_error_in(&[11, 101]);
        assert!(
            refused.text().contains("set-aside") || refused.text().contains("failed verification"),
            "read-only={read_only}: {}",
            refused.text()
        );
    }
}

/// The operator's read-only commands on a store the upgrade has not re-keyed yet: they read
/// both layouts and write nothing, not even the move (no file, no mtime changes).
#[test]
fn the_dump_and_the_doctor_on_an_old_releases_state_dir_write_nothing() {
    let (_root, store) = old_store();
    let tree = |dir: &Path| {
        let mut found = Vec::new();
        let mut dirs = vec![dir.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for path in files_in(&dir) {
                let meta = std::fs::symlink_metadata(&path).unwrap();
                found.push((path.clone(), meta.modified().unwrap(), meta.len()));
                if meta.is_dir() {
                    dirs.push(path);
                }
            }
        }
        found
    };
    let before = tree(&store.state_dir);
    let state_dir = store.state_dir.to_str().unwrap();
    assert_eq!(store.dump().len(), 6, "every record and the deferred DEL");
    for args in [
        &["--dump-checkpoints", "--state-dir", state_dir][..],
        &["--doctor", "--state-dir", state_dir],
    ] {
        cni::guard(args);
    }
    assert_eq!(tree(&store.state_dir), before, "a read-only command wrote");
    assert!(!store.state_dir.join("pod-keys").exists());
}

#[test]
fn a_superseded_sandboxs_late_add_on_another_interface_is_refused() {
    // ADD A eth0, ADD B eth0, ADD A net1: A's record on eth0 (or its deferred DEL) says it was
    // superseded, whichever interface its late ADD names.
    for deferred_first in [false, true] {
        let i = Incident::of("lijiaob", "etcd1-0");
        let primary = RecordingPrimary::new();
        primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
        // B is alive: its netns path names a live namespace (the plugin's own).
        primary
            .wrap(i.store.add(&i.b, &i.pod_b))
            .netns("/proc/self/ns/net")
            .run()
            .assert_ok();
        if deferred_first {
            primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
        }
        let err = primary
            .wrap(i.store.add(&i.a, &i.pod_a).ifname("net1"))
            .run()
            .assert_error(104);
        assert!(err.msg.contains(&i.b), "{err:?}");
        assert!(i.store.is_owner(&i.b, "eth0"), "B keeps the pod's name");
        let adds_of_a = primary
            .started()
            .iter()
            .filter(|(verb, c)| verb == "ADD" && c == &i.a)
            .count();
        assert_eq!(adds_of_a, 1, "A's late ADD reached the primary");
    }
}

#[test]
fn the_sweep_replays_a_deferred_del_whose_owner_has_no_record() {
    // The owner's record is gone (the pod left the node; a crash between the two removals):
    // an owner without its record owns nothing, and its file alone must not hold the
    // deferred DEL back for ever.
    let i = Incident::of("lijiaob", "etcd1-0");
    let primary = RecordingPrimary::new();
    primary.wrap(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
    primary.wrap(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
    primary.wrap(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
    assert_eq!(primary.dels(&i.a), 0, "deferred while B owns the pod");
    std::fs::remove_file(i.store.record_path(NETWORK, &i.b, "eth0")).unwrap();
    assert!(!i.store.owner_files().is_empty(), "B's owner file stays");
    // Another pod's verb sweeps.
    let other = Pod::new("lijiaob", "web-0");
    primary
        .wrap(i.store.add(&cni::container_id(), &other))
        .run()
        .assert_ok();
    // The sweep runs in the replay worker, which that ADD does not wait for.
    assert!(
        i.store.wait_for_replays(REPLAYS_DONE),
        "the replay worker did not finish"
    );
    assert_eq!(
        primary.dels(&i.a),
        1,
        "the sweep replays A's DEL: B's owner has no record"
    );
}

/// A rolling upgrade: the old release's ADD of B is in flight (in delegate mode, waiting on
/// its primary; chained, it simply runs late) when this release's first verb re-keys the
/// store; B's owner lands under the old release's key after the marker says the move is done.
/// This release must still find it: A's DEL is stale, B's own passes.
#[test]
fn an_old_releases_add_that_lands_after_the_rekey_still_owns_the_pod() {
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    for delegated in [true, false] {
        let i = Incident::of("lijiaob", "etcd1-0");
        let primary = RecordingPrimary::new();
        let wrap = |call: cni::Cni| if delegated { primary.wrap(call) } else { call };
        old_release::by_old(wrap(i.store.add(&i.a, &i.pod_a)), &old)
            .run()
            .assert_ok();
        let unrelated = || {
            wrap(
                i.store
                    .add(&cni::container_id(), &Pod::new("lijiaob", "web-0")),
            )
        };
        if delegated {
            primary.slow("ADD", &i.b, 1.5);
            let in_flight = old_release::by_old(wrap(i.store.add(&i.b, &i.pod_b)), &old).spawn();
            while !primary
                .started()
                .iter()
                .any(|(verb, c)| verb == "ADD" && c == &i.b)
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // This release's first verb on the node re-keys while B's ADD waits.
            unrelated().run().assert_ok();
            in_flight.wait().assert_ok();
        } else {
            unrelated().run().assert_ok();
            old_release::by_old(wrap(i.store.add(&i.b, &i.pod_b)), &old)
                .run()
                .assert_ok();
        }
        let mode = if delegated { "delegate" } else { "chained" };
        let del_a = wrap(i.store.del(&i.a, &i.pod_a)).run();
        if delegated {
            del_a.assert_ok();
            assert_eq!(
                primary.dels(&i.a),
                0,
                "{mode}: A's stale DEL reached the primary"
            );
        } else {
            del_a.assert_error(11);
        }
        wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
        if delegated {
            assert_eq!(
                primary.dels(&i.b),
                1,
                "{mode}: B's own DEL reaches the primary"
            );
        }
        i.store.assert_every_owner_has_its_record();
    }
}

/// README's way back: the previous release refuses (or defers) A's stale DEL; upgrade; then
/// scripts/downgrade-owners.sh and the older binary, with an ADD of this release in flight
/// across the switch. Every owner must still be one the older release reads: A's DEL stays
/// stale, its deferred DEL is one that release replays, B's own DEL passes.
#[test]
fn a_downgrade_to_the_previous_release_keeps_every_owner() {
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    for delegated in [false, true] {
        let mode = if delegated { "delegate" } else { "chained" };
        let i = Incident::of("lijiaob", "etcd1-0");
        let primary = RecordingPrimary::new();
        let wrap = |call: cni::Cni| if delegated { primary.wrap(call) } else { call };
        let by_old = |call: cni::Cni| old_release::by_old(wrap(call), &old);
        let stale_del_of_a =
            |call: cni::Cni| assert_stale(call, &i.a, delegated.then_some(&primary));
        by_old(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
        by_old(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
        stale_del_of_a(by_old(i.store.del(&i.a, &i.pod_a)));
        // The upgrade: this release's first verb moves the store to its keys.
        let db = Pod::new("lijiaob", "db-0");
        let d = cni::container_id();
        wrap(
            i.store
                .add(&cni::container_id(), &Pod::new("lijiaob", "web-0")),
        )
        .run()
        .assert_ok();
        stale_del_of_a(wrap(i.store.del(&i.a, &i.pod_a)));
        // The way back, with this release's ADD of D in flight across the first run.
        let downgrade = || downgrade_script(&i.store);
        if delegated {
            primary.slow("ADD", &d, 1.0);
            let in_flight = wrap(i.store.add(&d, &db)).spawn();
            while !primary
                .started()
                .iter()
                .any(|(verb, c)| verb == "ADD" && c == &d)
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            downgrade();
            in_flight.wait().assert_ok();
        } else {
            downgrade();
            wrap(i.store.add(&d, &db)).run().assert_ok();
        }
        // The older binary is in place: the second run.
        downgrade();
        // The ledger is back in that release's form: one entry per interface, holding the
        // stale DELs of A both releases counted; the older one counts on in it.
        let stale_dels_of_a = || -> Vec<u64> {
            files_in(&i.store.state_dir.join("ledger"))
                .iter()
                .map(|path| verify_envelope(path).unwrap())
                .filter(|entry| entry["podName"] == "etcd1-0")
                .map(|entry| {
                    assert_eq!(entry["ifName"], "eth0", "{mode}: {entry}");
                    ["refused", "deferred"]
                        .iter()
                        .map(|n| entry[n].as_u64().unwrap())
                        .sum()
                })
                .collect()
        };
        assert_eq!(
            stale_dels_of_a(),
            [2],
            "{mode}: the ledger after the downgrade"
        );
        stale_del_of_a(by_old(i.store.del(&i.a, &i.pod_a)));
        assert_eq!(
            stale_dels_of_a(),
            [3],
            "{mode}: the older release counts on"
        );
        by_old(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
        if delegated {
            assert_eq!(
                primary.dels(&i.b),
                1,
                "{mode}: B's own DEL reaches the primary"
            );
            // The older release read the deferred DEL the two moves kept, and replayed it
            // once B's DEL freed the pod.
            assert_eq!(
                primary.dels(&i.a),
                1,
                "{mode}: A's deferred DEL is replayed"
            );
        }
        by_old(i.store.del(&i.a, &i.pod_a)).run().assert_ok();
        // D, added by this release, is the older one's to protect and release too.
        by_old(i.store.del(&d, &db)).run().assert_ok();
        i.store.assert_every_owner_has_its_record();
    }
}

/// The operator goes back and forth: the previous release, this one (its first verb re-keys),
/// the way back (the script twice, around the older binary), the pod re-created under the
/// older binary, then this release again. The markers say whatever the last move wrote; the
/// owner the older binary filed since must still be the one this release judges by: the old
/// sandbox's DEL stays stale, the new one's own DEL passes.
#[test]
fn downgrade_recreate_and_upgrade_again_keeps_the_new_owner() {
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    for (delegated, mode) in [(false, "chained"), (true, "delegate")] {
        let (i, primary) = (Incident::of("lijiaob", "etcd1-0"), RecordingPrimary::new());
        let wrap = |call: cni::Cni| if delegated { primary.wrap(call) } else { call };
        let unrelated = || {
            wrap(
                i.store
                    .add(&cni::container_id(), &Pod::new("lijiaob", "web-0")),
            )
        };
        old_release::by_old(wrap(i.store.add(&i.a, &i.pod_a)), &old)
            .run()
            .assert_ok();
        unrelated().run().assert_ok();
        downgrade_script(&i.store);
        downgrade_script(&i.store);
        old_release::by_old(wrap(i.store.add(&i.b, &i.pod_b)), &old)
            .run()
            .assert_ok();
        unrelated().run().assert_ok();
        assert_stale(
            wrap(i.store.del(&i.a, &i.pod_a)),
            &i.a,
            delegated.then_some(&primary),
        );
        wrap(i.store.del(&i.b, &i.pod_b)).run().assert_ok();
        i.store.wait_for_replays(REPLAYS_DONE);
        if delegated {
            assert_eq!(
                (primary.dels(&i.b), primary.dels(&i.a)),
                (1, 1),
                "{mode}: B's own DEL, then A's replay"
            );
        }
        i.store.assert_every_owner_has_its_record();
    }
}

/// SIGKILL on entry to each of `--downgrade`'s steps in turn (every rename, link, unlink,
/// fsync and mkdir it makes, until a run gets through), in both modes, on a store this release
/// re-keyed: an owner, the stale DELs of its old sandbox counted in the ledger and, in delegate
/// mode, that sandbox's deferred DEL. `--downgrade` run again leaves the owners, deferred DELs
/// and ledger an uncut run leaves (nothing lost, nothing doubled), and the older binary then
/// judges as after an uncut downgrade: the old sandbox's DEL stays stale and is counted once
/// more, the owner's own DEL passes, the deferred DEL is replayed once.
#[test]
fn a_downgrade_killed_at_any_step_keeps_every_owner_and_runs_again_to_the_same_store() {
    sys::skip_unless_root!(&["strace", "cp"]);
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    for (delegated, mode) in [(false, "chained"), (true, "delegate")] {
        let (i, primary) = (Incident::of("lijiaob", "etcd1-0"), RecordingPrimary::new());
        let wrap = |call: cni::Cni| if delegated { primary.wrap(call) } else { call };
        let by_old = |call: cni::Cni| old_release::by_old(wrap(call), &old);
        by_old(i.store.add(&i.a, &i.pod_a)).run().assert_ok();
        by_old(i.store.add(&i.b, &i.pod_b)).run().assert_ok();
        assert_stale(
            by_old(i.store.del(&i.a, &i.pod_a)),
            &i.a,
            delegated.then_some(&primary),
        );
        // The upgrade: this release's first verb moves the store to its keys.
        wrap(
            i.store
                .add(&cni::container_id(), &Pod::new("lijiaob", "web-0")),
        )
        .run()
        .assert_ok();
        assert_stale(
            wrap(i.store.del(&i.a, &i.pod_a)),
            &i.a,
            delegated.then_some(&primary),
        );
        i.store.wait_for_replays(REPLAYS_DONE);
        // Each run on its own copy of that store.
        let copy = || {
            let root = sys::TempDir::new("sgdown");
            let state_dir = root.path.join("state");
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(&i.store.state_dir)
                .arg(&state_dir)
                .status()
                .unwrap();
            assert!(copied.success(), "cp -a of the state dir failed");
            let store = Store::with_state_dir(state_dir, &root.path);
            (root, store)
        };
        let downgrade = |store: &Store, killed_at: Option<(&str, usize)>| {
            let state_dir = store.state_dir.to_str().unwrap();
            let command = [cni::bin(), "--downgrade", "--state-dir", state_dir];
            let (trace, inject) =
                killed_at.map_or((String::new(), String::new()), |(calls, nth)| {
                    (
                        format!("trace={calls}"),
                        format!("inject={calls}:signal=SIGKILL:when={nth}"),
                    )
                });
            let strace = [
                "strace",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                &trace,
                "-e",
                &inject,
            ];
            let argv: Vec<&str> = match killed_at {
                Some(_) => strace.iter().chain(command.iter()).copied().collect(),
                None => command.to_vec(),
            };
            std::process::Command::new(argv[0])
                .args(&argv[1..])
                .output()
                .unwrap()
        };
        let stale_dels_of_a = |store: &Store| -> Vec<u64> {
            files_in(&store.state_dir.join("ledger"))
                .iter()
                .filter_map(|path| verify_envelope(path).ok())
                .filter(|entry| entry["podName"] == "etcd1-0")
                .map(|entry| {
                    ["refused", "deferred"]
                        .iter()
                        .map(|n| entry[n].as_u64().unwrap_or_default())
                        .sum()
                })
                .collect()
        };
        let older_judges = |store: &Store, run: &str| {
            let replays_before = primary.dels(&i.a);
            let stale = by_old(store.del(&i.a, &i.pod_a)).run();
            if delegated {
                stale.assert_ok();
                assert_eq!(
                    primary.dels(&i.a),
                    replays_before,
                    "{mode}, {run}: the older release sent the stale DEL to the primary"
                );
            } else {
                stale.assert_error(11);
            }
            assert_eq!(
                stale_dels_of_a(store),
                [3],
                "{mode}, {run}: the older release counts on from the two stale DELs"
            );
            by_old(store.del(&i.b, &i.pod_b)).run().assert_ok();
            store.wait_for_replays(REPLAYS_DONE);
            if delegated {
                assert_eq!(
                    primary.dels(&i.a) - replays_before,
                    1,
                    "{mode}, {run}: the deferred DEL replayed once"
                );
            }
            store.assert_every_owner_has_its_record();
        };
        // Owners, deferred DELs and the ledger; a ledger entry's `mergedFrom` only where the
        // entry it names still exists (the next re-key forgets the others: they mean nothing).
        let kept = |store: &Store| {
            let mut files = files_under(store, &["owners", "deferred", "ledger"]);
            for (name, entry) in files.iter_mut() {
                let Some(merged) = entry.get_mut("mergedFrom").and_then(Value::as_array_mut) else {
                    continue;
                };
                merged.retain(|digest| {
                    let digest = digest.as_str().unwrap_or_default();
                    store.state_dir.join("ledger").join(digest).exists()
                });
                if merged.is_empty() {
                    entry.as_object_mut().unwrap().remove("mergedFrom");
                }
                assert!(name.starts_with("ledger/"), "{mode}: mergedFrom in {name}");
            }
            files
        };
        let (_uncut_root, uncut) = copy();
        let out = downgrade(&uncut, None);
        assert!(out.status.success(), "{mode}: {out:?}");
        let expected = kept(&uncut);
        assert_eq!(
            stale_dels_of_a(&uncut),
            [2],
            "{mode}: the uncut downgrade's ledger"
        );
        assert!(
            expected.keys().any(|k| k.starts_with("deferred/")) == delegated,
            "{mode}: the deferred DELs the uncut downgrade left: {expected:?}"
        );
        older_judges(&uncut, "uncut");
        let mut kills = 0;
        for syscalls in WRITE_STEPS {
            for nth in 1..100 {
                let (_root, store) = copy();
                let out = downgrade(&store, Some((syscalls, nth)));
                if out.status.signal() != Some(9) {
                    assert!(out.status.success(), "{mode}: {out:?}");
                    break;
                }
                kills += 1;
                let run = format!("killed at {syscalls} #{nth}");
                let again = downgrade(&store, None);
                assert!(
                    again.status.success(),
                    "{mode}, {run}, run again: {again:?}"
                );
                assert_eq!(kept(&store), expected, "{mode}, {run}");
                older_judges(&store, &run);
            }
        }
        assert!(
            kills > 10,
            "{mode}: only {kills} kills: the test proves little"
        );
    }
}

/// scripts/downgrade-owners.sh over `store`, with this release's binary, as README says.
fn downgrade_script(store: &Store) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/downgrade-owners.sh");
    let out = std::process::Command::new("sh")
        .args([script, store.state_dir.to_str().unwrap(), cni::bin()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `call`, the DEL of the superseded sandbox `stale`: refused (chained), or answered and kept
/// from `primary` (delegate).
fn assert_stale(call: cni::Cni, stale: &str, primary: Option<&RecordingPrimary>) {
    let reply = call.run();
    match primary {
        Some(primary) => {
            reply.assert_ok();
            assert_eq!(primary.dels(stale), 0, "the stale DEL reached the primary");
        }
        None => {
            reply.assert_error(11);
        }
    }
}

/// The release before this one never synced its generation counter: after a power cut a
/// newer ADD of the pod on another interface may get a lower generation than an older one.
/// The move to pod-name keys must not hand the pod to the older sandbox when its netns is
/// gone and the newer one's lives.
#[test]
fn the_upgrades_merge_does_not_trust_the_old_releases_unsynced_generations() {
    let Some(old) = old_release::required(sys::test_name!()) else {
        return;
    };
    for delegated in [false, true] {
        let mode = if delegated { "delegate" } else { "chained" };
        let i = Incident::of("lijiaob", "etcd1-0");
        let primary = RecordingPrimary::new();
        let wrap = |call: cni::Cni| if delegated { primary.wrap(call) } else { call };
        let by_old = |call: cni::Cni| old_release::by_old(wrap(call), &old);
        for n in 0..2 {
            let seed = Pod::new("lijiaob", &format!("seed-{n}"));
            by_old(i.store.add(&cni::container_id(), &seed))
                .run()
                .assert_ok();
        }
        // A (generation 3) as net1; its sandbox is gone since (its netns path names nothing).
        let gone = "/var/run/netns/sandbox-guard-test-gone";
        by_old(i.store.add(&i.a, &i.pod_a).ifname("net1").netns(gone))
            .run()
            .assert_ok();
        // The power cut takes the unsynced counter back; B, newer, gets generation 1 as net2.
        let lock = i.store.state_dir.join("lock");
        let mut counter = std::fs::read(&lock).unwrap();
        counter[..20].copy_from_slice(b"00000000000000000000");
        std::fs::write(&lock, counter).unwrap();
        let live = "/proc/self/ns/net";
        by_old(i.store.add(&i.b, &i.pod_b).ifname("net2").netns(live))
            .run()
            .assert_ok();
        // This release moves the store; A's DEL is stale, B owns the pod.
        let del_a = wrap(i.store.del(&i.a, &i.pod_a).ifname("net1").netns(gone)).run();
        if delegated {
            del_a.assert_ok();
            assert_eq!(
                primary.dels(&i.a),
                0,
                "{mode}: A's stale DEL reached the primary"
            );
        } else {
            del_a.assert_error(11);
        }
        assert!(
            i.store.is_owner(&i.b, "net2"),
            "{mode}: B, alive, owns the pod"
        );
        wrap(i.store.del(&i.b, &i.pod_b).ifname("net2").netns(live))
            .run()
            .assert_ok();
    }
}

/// How long a test waits for the replay worker to finish: the owner's DEL answers before a
/// replay that outlasts its short wait, so a count right after it would race the worker.
const REPLAYS_DONE: std::time::Duration = std::time::Duration::from_secs(90);

/// The ledger as the release before reads it: (ifName, refused) of every entry, sorted; and
/// how many owner files there are.
fn ledger_per_interface(store: &Store) -> (Vec<(String, u64)>, usize) {
    let mut entries: Vec<(String, u64)> = files_in(&store.state_dir.join("ledger"))
        .iter()
        .map(|path| verify_envelope(path).unwrap())
        .map(|entry| {
            (
                entry["ifName"]
                    .as_str()
                    .unwrap_or("(whole pod)")
                    .to_string(),
                entry["refused"].as_u64().unwrap(),
            )
        })
        .collect();
    entries.sort();
    let owners = store
        .owner_files()
        .iter()
        .filter(|path| !path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .count();
    let temp: Vec<_> = store
        .owner_files()
        .into_iter()
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    assert!(temp.is_empty(), "temp files left in owners/: {temp:?}");
    (entries, owners)
}

/// `--downgrade` SIGKILLed on entry to each of its steps in turn (every rename, link, unlink
/// and fsync), then run again: the whole pod's ledger entry is cut into one per interface
/// with each interface's refusals counted once, as an uncut run cuts it, and no owner is
/// without its record.
#[test]
fn a_downgrade_killed_at_any_step_runs_again_to_the_same_ledger() {
    sys::skip_unless_root!(&["strace"]);
    let fresh = || {
        let i = two_interfaces();
        i.store.del(&i.a, &i.pod_a).run().assert_error(11);
        for _ in 0..2 {
            i.store
                .del(&i.a, &i.pod_a)
                .ifname("net1")
                .run()
                .assert_error(11);
        }
        i
    };
    let downgrade = |store: &Store, kill: Option<(&str, usize)>| {
        let mut command = match kill {
            Some((syscalls, nth)) => {
                let mut strace = std::process::Command::new("strace");
                strace.args([
                    "-o",
                    "/dev/null",
                    &format!("--trace={syscalls}"),
                    &format!("--inject={syscalls}:signal=SIGKILL:when={nth}"),
                    cni::bin(),
                ]);
                strace
            }
            None => std::process::Command::new(cni::bin()),
        };
        command
            .args(["--downgrade", "--lock-timeout", "5", "--state-dir"])
            .arg(&store.state_dir)
            .output()
            .unwrap()
    };
    let uncut = fresh();
    assert!(downgrade(&uncut.store, None).status.success());
    let expected = ledger_per_interface(&uncut.store);
    assert_eq!(
        expected.0,
        [("eth0".to_string(), 1), ("net1".to_string(), 2)],
        "the uncut run"
    );
    let mut kills = 0;
    for syscalls in [
        "rename",
        "link,linkat",
        "unlink,unlinkat",
        "fsync,fdatasync",
    ] {
        for nth in 1..200 {
            let i = fresh();
            let out = downgrade(&i.store, Some((syscalls, nth)));
            let killed = out.status.signal() == Some(9) || out.status.code() == Some(137);
            if !killed {
                assert!(out.status.success(), "{syscalls} #{nth}: {out:?}");
                break;
            }
            kills += 1;
            i.store.assert_every_owner_has_its_record();
            let again = downgrade(&i.store, None);
            assert!(again.status.success(), "{syscalls} #{nth}: {again:?}");
            assert_eq!(
                ledger_per_interface(&i.store),
                expected,
                "killed at {syscalls} #{nth}"
            );
            i.store.assert_every_owner_has_its_record();
        }
    }
    assert!(kills > 10, "only {kills} kills: the test proves little");
}
