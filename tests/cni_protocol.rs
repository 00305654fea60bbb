//! The plugin as a runtime sees it: one exec per operation, CNI_* environment, config on stdin.
//! Covers the stale-DEL incident and its variants, the pass-through of the primary
//! plugin's result, the other verbs, the dump, the store's hardening and every bad input.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{
    CniError, Incident, NETWORK, Pod, SUPPORTED_VERSIONS, Store, container_id, corrupt_one_digit,
    files_in, mode, verify_envelope, walk,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;

/// The pods of the incident: a StatefulSet pod re-created under its old name, new UID.
fn etcd_incarnations() -> (Pod, Pod) {
    (
        Pod::new("lijiaob", "etcd1-0"),
        Pod::new("lijiaob", "etcd1-0"),
    )
}

/// The incident's cast, with the incident's pod.
fn incident() -> Incident {
    Incident::of("lijiaob", "etcd1-0")
}

/// True when `text` states `generation` as a number right after the word "generation"
/// (`generation 3`, `generation=3`, `"generation":3`).
fn mentions_generation(text: &str, generation: u64) -> bool {
    let lower = text.to_lowercase();
    lower.match_indices("generation").any(|(at, word)| {
        let rest = lower[at + word.len()..].trim_start_matches([' ', '=', ':', '"']);
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits == generation.to_string()
    })
}

fn generation_of(store: &Store, container: &str) -> u64 {
    let entry = store
        .entry(container, "eth0")
        .unwrap_or_else(|| panic!("no checkpoint of {container}"));
    entry["generation"]
        .as_u64()
        .unwrap_or_else(|| panic!("generation is not a number: {entry}"))
}

fn assert_stale_del(error: &CniError, owner: &str, owner_pod: &Pod, owner_generation: u64) {
    assert_eq!(error.code, 11, "{error:?}");
    assert!(
        error.msg.contains("stale DEL"),
        "msg must say stale DEL: {error:?}"
    );
    assert!(
        error.msg.contains(&owner[..13]),
        "msg must name the owning container {owner} as crictl does: {error:?}"
    );
    assert!(
        error.details.contains(&owner_pod.uid),
        "details must name the owner's pod UID {}: {error:?}",
        owner_pod.uid
    );
    assert!(
        mentions_generation(&error.details, owner_generation),
        "details must name the owner's generation {owner_generation}: {error:?}"
    );
}

#[test]
fn incident_sequence_refuses_the_stale_del_until_the_new_sandbox_is_gone() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();

    store.add(&a, &pod_a).run().assert_ok();
    store.del(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    let generation_b = generation_of(&store, &b);

    // The kubelet's retry of A's teardown, as in the incident log: empty CNI_NETNS.
    let before = store.snapshot();
    let reply = store.del(&a, &pod_a).netns("").no_prev_result().run();
    assert_eq!(
        reply.status.code(),
        Some(1),
        "a refused DEL exits 1: {reply:?}"
    );
    assert_stale_del(&reply.assert_error(11), &b, &pod_b, generation_b);
    assert_eq!(
        store.snapshot(),
        before,
        "a refused DEL must not change the store"
    );
    assert!(store.is_owner(&b, "eth0"));

    store.del(&b, &pod_b).run().assert_ok();
    store.del(&a, &pod_a).run().assert_ok();
    assert_eq!(store.dump(), Vec::<Value>::new());
    assert!(store.owner_files().is_empty());
}

#[test]
fn del_of_the_older_sandbox_is_refused_while_the_newer_one_owns_the_pod() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    assert!(!store.is_owner(&a, "eth0") && store.is_owner(&b, "eth0"));

    let before = store.snapshot();
    let error = store.del(&a, &pod_a).run().assert_error(11);
    assert_stale_del(&error, &b, &pod_b, generation_of(&store, &b));
    assert_eq!(store.snapshot(), before);
}

#[test]
fn del_of_an_unknown_container_is_refused_while_another_owns_the_pod() {
    let Incident {
        store,
        pod_a: pod_old,
        pod_b,
        a: never_added,
        b,
    } = incident();
    store.add(&b, &pod_b).run().assert_ok();

    let error = store.del(&never_added, &pod_old).run().assert_error(11);
    assert_stale_del(&error, &b, &pod_b, generation_of(&store, &b));
    assert!(store.is_owner(&b, "eth0"));
}

#[test]
fn repeated_add_is_idempotent_and_bumps_the_generation() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    let first = store.add(&a, &pod).run();
    first.assert_ok();
    let generation = generation_of(&store, &a);
    let second = store.add(&a, &pod).run();
    second.assert_ok();
    assert_eq!(second.stdout, first.stdout);

    let entries = store.dump();
    assert_eq!(
        entries.len(),
        1,
        "one attachment, one checkpoint: {entries:?}"
    );
    assert_eq!(entries[0]["owner"], true);
    assert!(
        generation_of(&store, &a) > generation,
        "the generation must grow on a repeated ADD: {entries:?}"
    );
    assert_eq!(store.owner_files().len(), 1);
}

#[test]
fn networks_and_ifnames_are_separate_pod_keys() {
    // podKey "name-and-ifname": each (network, ifname) is a key. By the default rule a pod's
    // interfaces on one network share one key (tests/pod_key.rs).
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    let keyed = |call: cni::Cni| call.config("podKey", Some(json!("name-and-ifname")));
    let second_network = "storage-net";
    keyed(store.add(&a, &pod_a)).run().assert_ok();
    keyed(store.add(&a, &pod_a))
        .ifname("net1")
        .run()
        .assert_ok();
    keyed(store.add(&a, &pod_a))
        .network(second_network)
        .run()
        .assert_ok();
    // The new sandbox takes over only (NETWORK, eth0).
    keyed(store.add(&b, &pod_b)).run().assert_ok();

    let owners: BTreeSet<(String, String, String)> = store
        .dump()
        .iter()
        .filter(|e| e["owner"] == true)
        .map(|e| {
            (
                e["network"].as_str().unwrap().into(),
                e["containerId"].as_str().unwrap().into(),
                e["ifName"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected = [
        (NETWORK, &b, "eth0"),
        (NETWORK, &a, "net1"),
        (second_network, &a, "eth0"),
    ]
    .map(|(network, container, ifname)| {
        (
            network.to_string(),
            container.to_string(),
            ifname.to_string(),
        )
    });
    assert_eq!(
        owners,
        BTreeSet::from(expected),
        "each (network, ifname) is its own pod key"
    );

    keyed(store.del(&a, &pod_a))
        .ifname("net1")
        .run()
        .assert_ok();
    keyed(store.del(&a, &pod_a))
        .network(second_network)
        .run()
        .assert_ok();
    keyed(store.del(&a, &pod_a)).run().assert_error(11);
    keyed(store.del(&b, &pod_b))
        .ifname("net1")
        .run()
        .assert_ok();
    assert!(store.is_owner(&b, "eth0"));
}

#[test]
fn audit_mode_lets_the_stale_del_pass_logs_it_and_keeps_the_owner() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();

    store
        .del(&a, &pod_a)
        .config("staleDel", Some(json!("audit")))
        .run()
        .assert_ok();

    let lines = store.log_lines();
    let last = lines.last().expect("a log line per operation");
    assert_eq!(
        (
            last.verb.as_str(),
            last.container.as_str(),
            last.outcome.as_str()
        ),
        ("DEL", a.as_str(), "audited"),
        "{last:?}"
    );
    assert!(
        store.is_owner(&b, "eth0"),
        "an audited stale DEL must not take the ownership away"
    );
    assert_eq!(store.owner_files().len(), 1);
}

#[test]
fn second_del_without_netns_or_prev_result_is_accepted_and_still_guarded() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    store.add(&a, &pod_a).run().assert_ok();
    // StopPodSandbox, then RemovePodSandbox's DEL with an empty CNI_NETNS and no prevResult.
    store.del(&a, &pod_a).run().assert_ok();
    store
        .del(&a, &pod_a)
        .netns("")
        .no_prev_result()
        .run()
        .assert_ok();
    assert!(store.dump().is_empty());

    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    store
        .del(&a, &pod_a)
        .netns("")
        .no_prev_result()
        .run()
        .assert_error(11);
}

#[test]
fn del_with_neither_pod_identity_nor_record_passes() {
    let store = Store::new();
    for args in ["", "IgnoreUnknown=1"] {
        store
            .cni("DEL", &container_id())
            .cni_args(args)
            .run()
            .assert_ok();
        store
            .cni("DEL", &container_id())
            .cni_args(args)
            .netns("")
            .no_prev_result()
            .run()
            .assert_ok();
    }
}

#[test]
fn del_without_pod_identity_uses_the_recorded_identity() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();

    let error = store.identityless_del(&a).run().assert_error(11);
    assert_stale_del(&error, &b, &pod_b, generation_of(&store, &b));

    store.identityless_del(&b).run().assert_ok();
    assert!(
        store.owner_files().is_empty(),
        "B's DEL must release its ownership"
    );
    store.identityless_del(&a).run().assert_ok();
    assert!(store.dump().is_empty());
}

#[test]
fn podman_args_without_namespace_only_checkpoint() {
    let store = Store::new();
    let (a, b) = (container_id(), container_id());
    let podman_args = testdata::cni_args("podman", &[("name", "web")]);
    store
        .cni("ADD", &a)
        .cni_args(&podman_args)
        .run()
        .assert_ok();
    store
        .cni("ADD", &b)
        .cni_args(&podman_args)
        .run()
        .assert_ok();

    let entry = store
        .entry(&b, "eth0")
        .expect("podman attachments are checkpointed");
    assert_eq!(entry["podName"], "web");
    assert_eq!(entry["podNamespace"], Value::Null);
    assert_eq!(entry["podUid"], Value::Null);
    store
        .cni("DEL", &a)
        .cni_args(&podman_args)
        .run()
        .assert_ok();
    store
        .cni("DEL", &b)
        .cni_args(&podman_args)
        .run()
        .assert_ok();
}

/// containerd builds CNI_ARGS from a Go map, so the order of its keys varies from call to call.
#[test]
fn containerd_args_in_another_order_name_the_same_pod() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = incident();
    store.add(&a, &pod_a).run().assert_ok();
    store
        .add(&b, &pod_b)
        .cni_args(&pod_b.cni_args_as("containerd-reordered", &b))
        .run()
        .assert_ok();
    let entry = store.entry(&b, "eth0").expect("B is checkpointed");
    assert_eq!(
        (&entry["podNamespace"], &entry["podName"], &entry["podUid"]),
        (&json!("lijiaob"), &json!("etcd1-0"), &json!(pod_b.uid))
    );

    let error = store
        .del(&a, &pod_a)
        .cni_args(&pod_a.cni_args_as("containerd-reordered", &a))
        .run()
        .assert_error(11);
    assert_stale_del(&error, &b, &pod_b, generation_of(&store, &b));
}

#[test]
fn add_prints_the_prev_result_back_byte_for_byte() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    // Odd spacing, unsorted keys, a float, escapes and fields no CNI version defines: a typed
    // round trip would change every one of them.
    let raw = testdata::fixture("results/verbatim/1.0.0.json");
    let reply = store
        .add(&a, &pod)
        .version("1.0.0")
        .prev_result_raw(&raw)
        .run();
    reply.assert_ok();
    assert_eq!(
        reply.stdout.strip_suffix('\n').unwrap_or(&reply.stdout),
        raw
    );
    store
        .del(&a, &pod)
        .version("1.0.0")
        .prev_result_raw(&raw)
        .run()
        .assert_ok();
}

fn attachment(container: &str) -> Value {
    json!({"containerID": container, "ifname": "eth0"})
}

#[test]
fn gc_keeps_only_the_valid_attachments_and_their_ownership() {
    let store = Store::new();
    let (pod_a, pod_b) = etcd_incarnations();
    let (pod_c, pod_d) = (
        Pod::new("default", "cache-0"),
        Pod::new("default", "queue-0"),
    );
    let [a, b, c, d, other] = std::array::from_fn(|_| container_id());
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    store.add(&c, &pod_c).run().assert_ok();
    store.add(&d, &pod_d).run().assert_ok();
    store
        .add(&other, &pod_d)
        .network("other-net")
        .run()
        .assert_ok();
    assert_eq!(store.owner_files().len(), 4);

    let gc = |key: &str, valid: &[&String]| {
        let list: Vec<Value> = valid.iter().map(|id| attachment(id)).collect();
        store
            .cni("GC", "")
            .config(key, Some(Value::Array(list)))
            .run()
    };
    gc("cni.dev/valid-attachments", &[&b, &c]).assert_ok();
    let kept: BTreeSet<(String, bool)> = store
        .dump()
        .iter()
        .map(|e| {
            (
                e["containerId"].as_str().unwrap().to_string(),
                e["owner"] == true,
            )
        })
        .collect();
    let expected = BTreeSet::from([(b.clone(), true), (c.clone(), true), (other.clone(), true)]);
    assert_eq!(
        kept, expected,
        "GC of {NETWORK} keeps B, C and the other network's attachment"
    );
    assert_eq!(
        store.owner_files().len(),
        3,
        "D's ownership goes with its record"
    );
    // B is still alive and owns the pod: A's DEL would still tear B's network down.
    store.del(&a, &pod_a).run().assert_error(11);

    gc("cni.dev/attachments", &[&c]).assert_ok();
    assert!(store.entry(&b, "eth0").is_none());
    assert_eq!(
        store.owner_files().len(),
        2,
        "B's ownership goes with its record"
    );
    // The runtime has declared B gone: nothing left that A's teardown could hurt.
    store.del(&a, &pod_a).run().assert_ok();
    store.del(&b, &pod_b).run().assert_ok();
    assert!(
        store
            .log_lines()
            .iter()
            .any(|l| l.verb == "GC" && l.outcome == cni::Outcome::Collected)
    );

    // No list at all is a broken runtime, not "nothing is valid": forgetting every pod of
    // the node would disarm the guard.
    store.cni("GC", "").run().assert_cni_error();
    assert!(store.is_owner(&c, "eth0"));
}

#[test]
fn status_is_ok_on_a_usable_state_dir() {
    let store = Store::new();
    store.cni("STATUS", "").run().assert_ok();
    store
        .add(&container_id(), &Pod::new("default", "web-0"))
        .run()
        .assert_ok();
    store.cni("STATUS", "").run().assert_ok();
}

#[test]
fn status_is_50_when_a_file_is_in_the_way_of_the_state_dir() {
    let store = Store::new();
    std::fs::write(&store.state_dir, b"not a directory").unwrap();
    store.cni("STATUS", "").run().assert_error(50);
    assert_eq!(std::fs::read(&store.state_dir).unwrap(), b"not a directory");
}

#[test]
fn status_is_50_on_a_read_only_state_dir() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let store = Store::new();
    store
        .add(&container_id(), &Pod::new("default", "web-0"))
        .run()
        .assert_ok();
    let _read_only = mount::Mount::read_only_bind(&store.state_dir);
    store.cni("STATUS", "").run().assert_error(50);

    let tmpfs = mount::Mount::tmpfs("ro,size=64k,mode=0700");
    let on_tmpfs = Store::with_state_dir(tmpfs.path.clone(), store.log_file.parent().unwrap());
    on_tmpfs.cni("STATUS", "").run().assert_error(50);
}

#[test]
fn version_lists_the_supported_versions() {
    let store = Store::new();
    for asked in ["1.1.0", "0.3.1"] {
        let reply = store.cni("VERSION", "").version(asked).run();
        reply.assert_ok();
        let body = reply.json();
        assert!(body["cniVersion"].is_string(), "{body}");
        let listed: Vec<&str> = body["supportedVersions"]
            .as_array()
            .expect("supportedVersions")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for version in SUPPORTED_VERSIONS {
            assert!(
                listed.contains(&version),
                "{version} missing from {listed:?}"
            );
        }
    }
}

#[test]
fn add_and_del_work_at_every_supported_version() {
    let store = Store::new();
    for version in SUPPORTED_VERSIONS {
        let pod = Pod::new("default", &format!("v{}", version.replace('.', "-")));
        let a = container_id();
        let add = store.add(&a, &pod).version(version);
        let reply = add.run();
        reply.assert_ok();
        assert_eq!(
            reply.json(),
            add.default_prev_result(),
            "ADD at {version} passes prevResult through"
        );
        store.del(&a, &pod).version(version).run().assert_ok();
    }
    assert!(store.dump().is_empty());
}

#[test]
fn verbs_are_refused_below_their_cni_version() {
    let (store, pod, a) = Store::with_one_sandbox("default", "web-0");
    for old in ["0.3.0", "0.3.1"] {
        store
            .cni("CHECK", &a)
            .pod(&pod)
            .version(old)
            .run()
            .assert_error(1);
    }
    store
        .cni("GC", "")
        .version("1.0.0")
        .config("cni.dev/valid-attachments", Some(json!([])))
        .run()
        .assert_error(1);
    store
        .cni("STATUS", "")
        .version("1.0.0")
        .run()
        .assert_error(1);
    assert!(
        store.entry(&a, "eth0").is_some(),
        "a refused GC must not collect anything"
    );
}

#[test]
fn every_verb_at_0_1_0_and_0_2_0_answers_as_the_spec_says() {
    for version in cni::LEGACY_VERSIONS {
        let Incident {
            store,
            pod_a,
            pod_b,
            a,
            b,
        } = incident();
        let reply = store.cni("VERSION", "").version(version).run();
        reply.assert_ok();
        assert_eq!(
            reply.json()["cniVersion"],
            version,
            "VERSION echoes a version it speaks"
        );
        assert_eq!(reply.json()["supportedVersions"], json!(SUPPORTED_VERSIONS));

        let add = store.add(&a, &pod_a).version(version);
        let reply = add.run();
        reply.assert_ok();
        assert_eq!(
            reply.json(),
            add.default_prev_result(),
            "ADD at {version} passes the legacy result through"
        );
        assert_eq!(store.entry(&a, "eth0").unwrap()["cniVersion"], version);
        store.add(&b, &pod_b).version(version).run().assert_ok();
        // libcni sends no prevResult on DEL below 0.4.0.
        let before = store.snapshot();
        let reply = store
            .del(&a, &pod_a)
            .version(version)
            .no_prev_result()
            .run();
        assert_stale_del(
            &reply.assert_error(11),
            &b,
            &pod_b,
            generation_of(&store, &b),
        );
        assert_eq!(
            reply.json()["cniVersion"],
            version,
            "the error is in the config's version"
        );
        assert_eq!(
            store.snapshot(),
            before,
            "a refused DEL must not change the store"
        );

        // CHECK came with 0.4.0, GC and STATUS with 1.1.0: refused with code 1, nothing read or written.
        let error = store
            .cni("CHECK", &b)
            .pod(&pod_b)
            .version(version)
            .run()
            .assert_error(1);
        assert!(
            error.msg.contains("CHECK needs cniVersion 0.4.0"),
            "{error:?}"
        );
        let gc = store
            .cni("GC", "")
            .version(version)
            .config("cni.dev/valid-attachments", Some(json!([])))
            .run();
        assert!(gc.assert_error(1).msg.contains("GC needs cniVersion 1.1.0"));
        store
            .cni("STATUS", "")
            .version(version)
            .run()
            .assert_error(1);
        assert_eq!(
            store.snapshot(),
            before,
            "refused verbs must not change the store"
        );

        store
            .del(&b, &pod_b)
            .version(version)
            .no_prev_result()
            .run()
            .assert_ok();
        store
            .del(&a, &pod_a)
            .version(version)
            .no_prev_result()
            .run()
            .assert_ok();
        assert_eq!(store.dump(), Vec::<Value>::new(), "{version}");
    }
}

/// A legacy result names no interface: the checkpoint's MAC and link facts come from the
/// interface CNI_IFNAME names in CNI_NETNS; without one there, the record has none and the
/// ADD log line says so, and the pod is guarded all the same.
#[test]
fn a_legacy_result_is_checkpointed_with_the_interface_cni_ifname_names() {
    sys::skip_unless_root!(&["ip"]);
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    let (add, _sandbox) = store.add(&a, &pod).in_pod_netns();
    let mac = add.default_prev_result()["interfaces"][0]["mac"].clone();
    for version in cni::LEGACY_VERSIONS {
        add.clone().version(version).run().assert_ok();
        let record = store.entry(&a, "eth0").unwrap();
        assert!(
            record["interfaces"].as_array().unwrap().is_empty(),
            "{record}"
        );
        assert_eq!(record["links"]["state"], "observed", "{version}: {record}");
        assert_eq!(record["links"]["mac"], mac, "{version}: {record}");
    }

    let (b, pod_b) = (container_id(), Pod::new("default", "web-1"));
    store.add(&b, &pod_b).version("0.2.0").run().assert_ok();
    let record = store.entry(&b, "eth0").unwrap();
    assert_eq!(record["links"]["state"], "unavailable", "{record}");
    let added = store
        .log_lines()
        .into_iter()
        .rev()
        .find(|l| l.container == b && l.outcome == cni::Outcome::Added)
        .expect("B's ADD line");
    assert_eq!(added.level, "WARN", "{}", added.raw);
    assert!(
        added.raw.contains("link facts not recorded"),
        "{}",
        added.raw
    );
    let (c, pod_c) = (container_id(), Pod::new("default", "web-1"));
    store.add(&c, &pod_c).version("0.2.0").run().assert_ok();
    store
        .del(&b, &pod_b)
        .version("0.2.0")
        .no_prev_result()
        .run()
        .assert_error(11);
    for (container, pod) in [(&c, &pod_c), (&b, &pod_b), (&a, &pod)] {
        store
            .del(container, pod)
            .version("0.2.0")
            .no_prev_result()
            .run()
            .assert_ok();
    }
    assert_eq!(store.dump(), Vec::<Value>::new());
}

#[test]
fn a_config_without_cni_version_is_0_1_0() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    let legacy = cni::prev_result_for("0.1.0", &a, "eth0", "");
    let reply = store
        .add(&a, &pod)
        .config("cniVersion", None)
        .prev_result(&legacy)
        .run();
    reply.assert_ok();
    assert_eq!(reply.json(), legacy);
    assert_eq!(store.entry(&a, "eth0").unwrap()["cniVersion"], "0.1.0");
    store
        .cni("CHECK", &a)
        .pod(&pod)
        .config("cniVersion", None)
        .prev_result(&legacy)
        .run()
        .assert_error(1);
    store
        .del(&a, &pod)
        .config("cniVersion", None)
        .no_prev_result()
        .run()
        .assert_ok();
}

#[test]
fn check_passes_for_the_recorded_attachment_and_fails_otherwise() {
    sys::skip_unless_root!(&["ip"]);
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    let (add, sandbox) = store.add(&a, &pod).in_pod_netns();
    add.run().assert_ok();
    let check = store.cni("CHECK", &a).pod(&pod).netns(&sandbox.path());
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        check.clone().version(version).run().assert_ok();
    }

    store
        .cni("CHECK", &container_id())
        .pod(&Pod::new("default", "web-1"))
        .netns(&sandbox.path())
        .run()
        .assert_cni_error();

    let mut moved = check.default_prev_result();
    moved["ips"][0]["address"] = json!("10.99.0.7/16");
    let error = check.prev_result(&moved).run().assert_error(100);
    assert!(
        error.text().contains("10.99.0.7"),
        "say what differs: {error:?}"
    );
    let outcomes: Vec<String> = store
        .log_lines()
        .iter()
        .filter(|l| l.verb == "CHECK")
        .map(|l| l.outcome.as_str().to_string())
        .collect();
    assert!(
        outcomes.contains(&"checked".to_string()) && outcomes.contains(&"check-failed".to_string()),
        "{outcomes:?}"
    );
}

fn is_rfc3339(text: &str) -> bool {
    let bytes = text.as_bytes();
    let shape = bytes.len() >= 20
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && matches!(bytes[10], b'T' | b't')
        && bytes[13] == b':'
        && bytes[16] == b':';
    let zone = text.ends_with('Z')
        || text.ends_with('z')
        || matches!(bytes[bytes.len().saturating_sub(6)], b'+' | b'-');
    shape && zone
}

#[test]
fn dump_json_carries_the_documented_fields() {
    let store = Store::new();
    let pod = Pod::new("lijiaob", "etcd1-0");
    let a = container_id();
    let add = store.add(&a, &pod);
    add.run().assert_ok();
    let prev_result = add.default_prev_result();

    let entries = store.dump();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["network"], NETWORK);
    assert_eq!(entry["containerId"], a.as_str());
    assert_eq!(entry["ifName"], "eth0");
    assert_eq!(entry["podNamespace"], "lijiaob");
    assert_eq!(entry["podName"], "etcd1-0");
    assert_eq!(entry["podUid"], pod.uid.as_str());
    assert_eq!(entry["netns"], add.netns_path().as_str());
    assert!(entry["generation"].is_u64(), "{entry}");
    assert_eq!(entry["owner"], true);
    assert_eq!(entry["ips"], json!([prev_result["ips"][0]["address"]]));
    assert!(
        entry["createdAt"].as_str().is_some_and(is_rfc3339),
        "createdAt must be RFC 3339: {entry}"
    );
    assert_eq!(entry["interfaces"], prev_result["interfaces"]);
    assert_eq!(entry["routes"], prev_result["routes"]);
    assert_eq!(entry["setAside"], false);
    assert_eq!(entry["prevResult"], prev_result);
}

#[test]
fn dump_filters_select_by_namespace_pod_uid_and_container() {
    let store = Store::new();
    let (web, db) = (Pod::new("shop", "web-0"), Pod::new("billing", "db-0"));
    let (w, d) = (container_id(), container_id());
    store.add(&w, &web).run().assert_ok();
    store.add(&d, &db).run().assert_ok();

    let selected = |filters: &[&str]| -> Vec<String> {
        store
            .dump_filtered(filters)
            .iter()
            .map(|e| e["containerId"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(selected(&["--namespace", "shop"]), vec![w.clone()]);
    assert_eq!(selected(&["--pod", "db-0"]), vec![d.clone()]);
    assert_eq!(selected(&["--pod-uid", &web.uid]), vec![w.clone()]);
    assert_eq!(selected(&["--container-id", &d]), vec![d.clone()]);
    assert_eq!(selected(&["--namespace", "nowhere"]), Vec::<String>::new());

    let state_dir = store.state_dir.to_str().unwrap();
    let table = cni::guard_ok(&[
        "--dump-checkpoints",
        "--state-dir",
        state_dir,
        "--output",
        "table",
    ]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("web-0") && table.contains("db-0"), "{table}");
}

#[test]
fn help_and_version_flags_exit_zero() {
    let help = cni::guard_ok(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--dump-checkpoints"));
    let version = cni::guard_ok(&["--version"]);
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn state_dir_and_files_are_private_whatever_the_umask() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let permissive_umask = ["/bin/sh", "-c", "umask 000 && exec \"$0\""];
    store
        .add(&container_id(), &pod)
        .wrapped_in(&permissive_umask)
        .run()
        .assert_ok();
    store
        .add(&container_id(), &pod)
        .wrapped_in(&permissive_umask)
        .run()
        .assert_ok();

    assert_eq!(mode(&store.state_dir), 0o700, "state dir");
    let paths = walk(&store.state_dir);
    assert!(
        paths.len() >= 4,
        "expected records, owners and a lock: {paths:?}"
    );
    for path in paths {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            assert_eq!(mode(&path), 0o700, "{}", path.display());
        } else if meta.file_type().is_symlink() {
            // An ownership, an address index entry or, on a journal, a record: a symlink whose
            // target is its sealed text. A link has no mode of its own (Linux ignores it); its
            // 0700 directory keeps it private.
            let dir = path.parent().unwrap();
            assert!(
                dir.ends_with("owners") || dir.ends_with("ips") || dir.ends_with("records"),
                "{} is a symlink outside records/, owners/ and ips/",
                path.display()
            );
            verify_envelope(&path).unwrap_or_else(|e| panic!("{e}"));
        } else {
            assert!(
                meta.is_file(),
                "{} is neither a file nor a directory",
                path.display()
            );
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

const DECOY: &[u8] = b"root:x:0:0:root:/root:/bin/bash\n";

#[test]
fn symlinks_planted_in_the_state_dir_are_refused() {
    let store = Store::new();
    let outside = sys::TempDir::new("sgdecoy");
    let decoy_file = outside.path.join("passwd");
    std::fs::write(&decoy_file, DECOY).unwrap();
    let decoy_dir = outside.path.join("records-elsewhere");
    std::fs::create_dir(&decoy_dir).unwrap();
    let pod = Pod::new("default", "web-0");
    let [a, b, c] = std::array::from_fn(|_| container_id());

    // A record replaced by a link: the DEL has to read it (no pod identity in CNI_ARGS).
    store.add(&a, &pod).run().assert_ok();
    let record = store.record_path(NETWORK, &a, "eth0");
    std::fs::remove_file(&record).unwrap();
    std::os::unix::fs::symlink(&decoy_file, &record).unwrap();
    store.identityless_del(&a).run().assert_cni_error();
    assert_eq!(std::fs::read(&decoy_file).unwrap(), DECOY);

    // A link waiting where a new record will be written.
    let planted = store.record_path(NETWORK, &b, "eth0");
    std::os::unix::fs::symlink(&decoy_file, &planted).unwrap();
    store
        .add(&b, &Pod::new("default", "web-1"))
        .run()
        .assert_cni_error();
    assert_eq!(std::fs::read(&decoy_file).unwrap(), DECOY);

    // An ownership file replaced by a link, then the pod's next sandbox comes up.
    let owners = store.owner_files();
    assert_eq!(owners.len(), 1, "{owners:?}");
    std::fs::remove_file(&owners[0]).unwrap();
    std::os::unix::fs::symlink(&decoy_file, &owners[0]).unwrap();
    store
        .add(&c, &Pod::new("default", "web-0"))
        .run()
        .assert_cni_error();
    assert_eq!(std::fs::read(&decoy_file).unwrap(), DECOY);

    // The records directory itself a link.
    let other = Store::new();
    other.add(&a, &pod).run().assert_ok();
    other.del(&a, &pod).run().assert_ok();
    let records = other.state_dir.join("records");
    std::fs::remove_dir(&records).unwrap();
    std::os::unix::fs::symlink(&decoy_dir, &records).unwrap();
    other.add(&b, &pod).run().assert_cni_error();
    assert!(
        files_in(&decoy_dir).is_empty(),
        "nothing may be written through the link"
    );

    // The state dir itself a link: refused, and the failed ADD's note not written through it.
    let linked = Store::new();
    std::fs::create_dir_all(linked.state_dir.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&decoy_dir, &linked.state_dir).unwrap();
    linked.add(&c, &pod).run().assert_error(5);
    assert!(
        walk(&decoy_dir).is_empty(),
        "nothing may be written through the linked state dir: {:?}",
        walk(&decoy_dir)
    );
}

#[test]
fn corrupted_record_is_set_aside_and_an_identityless_del_refused_with_101() {
    let (store, pod, a) = Store::with_one_sandbox("lijiaob", "etcd1-0");
    let record = store.record_path(NETWORK, &a, "eth0");
    let bytes = corrupt_one_digit(&record, pod.uid.as_bytes());

    let identityless_del = store.identityless_del(&a);
    let error = identityless_del.run().assert_error(101);
    assert!(!record.exists(), "the corrupted record leaves records/");
    let kept = kept_copy(&store, &bytes);
    assert!(
        error.text().contains(kept.to_str().unwrap()),
        "the error must say where the record went, so the operator can recover: {error:?}"
    );
    let flagged: Vec<Value> = store
        .dump()
        .into_iter()
        .filter(|e| e["setAside"] == true)
        .collect();
    assert_eq!(
        flagged.len(),
        1,
        "the dump flags the set-aside record: {flagged:?}"
    );
    if !flagged[0]["containerId"].is_null() {
        assert_eq!(flagged[0]["containerId"], a.as_str());
    }

    // The runtime retries the same DEL: it must not slip through now that the record is gone.
    identityless_del.run().assert_error(101);
    // The recovery the message names: the operator removes the kept file.
    std::fs::remove_file(kept).unwrap();
    identityless_del.run().assert_ok();
}

#[test]
fn corrupted_ownership_refuses_the_del_with_101() {
    let (store, pod, a) = Store::with_one_sandbox("lijiaob", "etcd1-0");
    let owners = store.owner_files();
    assert_eq!(owners.len(), 1);
    let bytes = corrupt_one_digit(&owners[0], a.as_bytes());

    // Without a trustworthy owner the guard cannot tell a stale DEL from a good one.
    store.del(&a, &pod).run().assert_error(101);
    kept_copy(&store, &bytes);
}

#[test]
fn a_new_add_ends_the_refusals_a_corrupt_file_caused_and_del_stays_idempotent() {
    let store = Store::new();
    let (pod, recreated) = etcd_incarnations();
    let a = container_id();
    store.add(&a, &pod).run().assert_ok();
    let owner = store.owner_files().remove(0);
    let bytes = corrupt_one_digit(&owner, a.as_bytes());
    store.del(&a, &pod).run().assert_error(101);

    // The pod is re-created: its ADD makes ownership known again, so the set-aside file,
    // still kept, must stop refusing DELs, or the repeat of a DEL that succeeded would fail.
    let b = container_id();
    store.add(&b, &recreated).run().assert_ok();
    store.del(&b, &recreated).run().assert_ok();
    store.del(&b, &recreated).run().assert_ok();
    store.del(&a, &pod).run().assert_ok();
    kept_copy(&store, &bytes);
}

#[test]
fn a_corrupt_record_del_did_not_need_blocks_nothing_later() {
    let (store, pod, a) = Store::with_one_sandbox("lijiaob", "etcd1-0");
    let record = store.record_path(NETWORK, &a, "eth0");
    let bytes = corrupt_one_digit(&record, pod.uid.as_bytes());

    // CNI_ARGS name the pod, so the record was not needed: the DEL passes and keeps it...
    store.del(&a, &pod).run().assert_ok();
    // ...and containerd's second DEL, which may lack the pod's identity, passes too.
    store.identityless_del(&a).run().assert_ok();
    kept_copy(&store, &bytes);
}

#[test]
fn every_damaged_checkpoint_is_set_aside_and_refuses_the_del_that_needs_it() {
    let damaged: Vec<String> = testdata::fixtures_in("checkpoints")
        .into_iter()
        .filter(|f| f != VALID_CHECKPOINT)
        .collect();
    assert!(damaged.len() >= 8, "{damaged:?}");
    for fixture in damaged {
        let store = Store::new();
        let a = container_id();
        store
            .add(&a, &Pod::new("lijiaob", "etcd1-0"))
            .run()
            .assert_ok();
        let bytes = testdata::fixture_bytes(&fixture);
        let record = store.record_path(NETWORK, &a, "eth0");
        cni::put_file(&record, &bytes);

        let error = store.identityless_del(&a).run().assert_error(101);
        assert!(
            !record.exists(),
            "{fixture}: the damaged record leaves records/"
        );
        let kept = kept_copy(&store, &bytes);
        assert!(
            error.text().contains(kept.to_str().unwrap()),
            "{fixture}: the error says where the file went: {error:?}"
        );
        let flagged = store
            .dump()
            .into_iter()
            .filter(|e| e["setAside"] == true)
            .count();
        assert_eq!(flagged, 1, "{fixture}: the dump flags the set-aside file");
    }
}

const VALID_CHECKPOINT: &str = "checkpoints/valid.json";

/// The damaged fixtures are this file with one kind of damage each: it must be one the
/// plugin trusts, or they would prove nothing.
#[test]
fn the_valid_checkpoint_fixture_is_trusted() {
    let store = Store::new();
    store
        .add(&container_id(), &Pod::new("default", "settled-0"))
        .run()
        .assert_ok();
    let bytes = testdata::fixture_bytes(VALID_CHECKPOINT);
    let record =
        verify_envelope(&testdata::fixture_path(VALID_CHECKPOINT)).expect("the seal holds");
    let container = record["containerId"].as_str().unwrap();
    let path = store.record_path(
        record["network"].as_str().unwrap(),
        container,
        record["ifName"].as_str().unwrap(),
    );
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    let entry = store.entry(container, "eth0").expect("the dump lists it");
    assert_eq!(
        (&entry["setAside"], &entry["podName"], &entry["generation"]),
        (&json!(false), &json!("etcd1-0"), &json!(7)),
        "{entry}"
    );
    store.identityless_del(container).run().assert_ok();
    assert!(!path.exists(), "the DEL removed the record it trusted");
}

#[test]
fn a_huge_file_in_the_store_is_untrusted_not_a_crash() {
    let (store, _, a) = Store::with_one_sandbox("lijiaob", "etcd1-0");
    // Sparse: 8 TiB that cost no disk, which a whole-file read would try to allocate.
    let record = store.record_path(NETWORK, &a, "eth0");
    cni::put_file(&record, b"");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&record)
        .unwrap()
        .set_len(8 << 40)
        .unwrap();

    let error = store.identityless_del(&a).run().assert_error(101);
    assert!(
        error.text().contains("larger than any checkpoint"),
        "{error:?}"
    );
}

/// Changes one hex digit inside `needle` in the file: still valid JSON, so only the checksum
/// can tell. Returns the corrupted bytes, to find them again under set-aside/.
/// The file under set-aside/ that holds exactly `bytes`: a corrupt file is kept, never deleted.
fn kept_copy(store: &Store, bytes: &[u8]) -> std::path::PathBuf {
    let set_aside: Vec<_> = walk(&store.state_dir.join("set-aside"))
        .into_iter()
        .filter(|p| !p.is_dir())
        .collect();
    set_aside
        .iter()
        .find(|p| cni::read_entry(p).unwrap() == bytes)
        .cloned()
        .unwrap_or_else(|| panic!("the corrupted bytes are kept under set-aside/: {set_aside:?}"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn log_lines_follow_the_documented_format() {
    sys::skip_unless_root!(&["ip"]);
    let store = Store::new();
    let (pod_a, pod_b) = etcd_incarnations();
    let [a, b, unknown] = std::array::from_fn(|_| container_id());
    let (add_a, sandbox_a) = store.add(&a, &pod_a).in_pod_netns();
    let (add_b, _sandbox_b) = store.add(&b, &pod_b).in_pod_netns();
    let replies = [
        add_a.run(),
        add_b.run(),
        store.del(&a, &pod_a).netns(&sandbox_a.path()).run(),
        store.cni("DEL", &unknown).netns("").run(),
    ];
    let lines = store.log_lines();
    assert_eq!(
        lines.len(),
        replies.len(),
        "one line per operation: {lines:#?}"
    );
    let expected = [
        ("ADD", &a, "lijiaob/etcd1-0", "added"),
        ("ADD", &b, "lijiaob/etcd1-0", "added"),
        ("DEL", &a, "lijiaob/etcd1-0", "refused"),
        ("DEL", &unknown, "-", "deleted"),
    ];
    for ((line, reply), (verb, container, pod, outcome)) in lines.iter().zip(&replies).zip(expected)
    {
        assert!(
            is_rfc3339(&line.time) && line.time.ends_with('Z'),
            "UTC RFC 3339 time: {line:?}"
        );
        assert_eq!(line.pid, reply.pid, "{line:?}");
        assert!(
            !line.level.is_empty() && line.level.chars().all(|c| c.is_ascii_uppercase()),
            "{line:?}"
        );
        assert_eq!(
            (
                line.verb.as_str(),
                line.network.as_str(),
                line.container.as_str(),
                line.ifname.as_str(),
                line.pod.as_str(),
                line.outcome.as_str()
            ),
            (verb, NETWORK, container.as_str(), "eth0", pod, outcome),
            "{line:?}"
        );
    }
}

#[test]
fn one_log_line_per_operation_even_when_the_netns_cannot_be_read() {
    // A netns path to nothing: the guard records what it can and lets the pod through.
    let (store, pod, a) = Store::with_one_sandbox("default", "web-0");
    let b = container_id();
    let elsewhere = sys::TempDir::new("sgblk");
    let blocked = elsewhere.path.join("state-is-a-file");
    std::fs::write(&blocked, b"").unwrap();
    store
        .add(&b, &pod)
        .config("stateDir", Some(json!(blocked)))
        .run()
        .assert_error(5);

    let seen: Vec<(String, String, String)> = store
        .log_lines()
        .iter()
        .map(|l| {
            (
                l.verb.clone(),
                l.container.clone(),
                l.outcome.as_str().to_string(),
            )
        })
        .collect();
    let expected = [("ADD", &a, "added"), ("ADD", &b, "error")]
        .map(|(v, c, o)| (v.to_string(), c.to_string(), o.to_string()));
    assert_eq!(
        seen, expected,
        "a log reader counts one line per operation, and only an ADD that happened says added"
    );
}

#[test]
fn log_lines_name_the_pod_whenever_the_runtime_gave_it() {
    sys::skip_unless_root!(&["ip"]);
    let store = Store::new();
    let pod = Pod::new("lijiaob", "etcd1-0");
    let a = container_id();
    let (add, sandbox) = store.add(&a, &pod).in_pod_netns();
    add.clone().run().assert_ok();
    store
        .cni("CHECK", &a)
        .pod(&pod)
        .netns(&sandbox.path())
        .run()
        .assert_ok();
    let elsewhere = sys::TempDir::new("sgblk");
    let blocked = elsewhere.path.join("state-is-a-file");
    std::fs::write(&blocked, b"").unwrap();
    add.config("stateDir", Some(json!(blocked)))
        .run()
        .assert_error(5);

    let lines = store.log_lines();
    let seen: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|l| (l.verb.as_str(), l.outcome.as_str(), l.pod.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("ADD", "added", "lijiaob/etcd1-0"),
            ("CHECK", "checked", "lijiaob/etcd1-0"),
            ("ADD", "error", "lijiaob/etcd1-0")
        ],
        "grepping the log for a pod must find all of its operations"
    );
}

/// One bad input: what the runtime sends, and the error codes the spec allows for it.
struct BadInput {
    what: &'static str,
    call: cni::Cni,
    codes: &'static [u64],
}

fn bad_inputs(store: &Store) -> Vec<BadInput> {
    let pod = Pod::new("default", "web-0");
    let add = |container: &str| store.add(container, &pod);
    let long_name = "x".repeat(1024);
    let add_with_pod = |namespace: &str, name: &str| {
        let container = container_id();
        store.add(&container, &Pod::new(namespace, name))
    };
    let prev_result_with = |mutate: &dyn Fn(&mut Value)| {
        let call = add(&container_id());
        let mut result = call.default_prev_result();
        mutate(&mut result);
        call.prev_result(&result)
    };
    let mut oversized = add(&container_id()).default_prev_result();
    oversized["x-padding"] = json!("p".repeat((1 << 20) + 1024));
    let oversized_call = add(&container_id()).prev_result(&oversized);

    vec![
        BadInput {
            what: "malformed JSON",
            call: add(&container_id()).stdin(br#"{"cniVersion":"1.1.0","name":"#.to_vec()),
            codes: &[6],
        },
        BadInput {
            what: "empty stdin",
            call: add(&container_id()).stdin(Vec::new()),
            codes: &[6],
        },
        BadInput {
            what: "config not an object",
            call: add(&container_id()).stdin(b"[1,2]".to_vec()),
            codes: &[6],
        },
        BadInput {
            what: "cniVersion 0.2.1",
            call: add(&container_id()).version("0.2.1"),
            codes: &[1],
        },
        BadInput {
            what: "cniVersion v1.0.0",
            call: add(&container_id()).version("v1.0.0"),
            codes: &[1],
        },
        BadInput {
            what: "cniVersion 9.9.9",
            call: add(&container_id()).version("9.9.9"),
            codes: &[1],
        },
        // Without CNI_COMMAND the plugin prints its about line, as skel's plugins do (tests/cli.rs).
        BadInput {
            what: "CNI_COMMAND unknown",
            call: add(&container_id()).env("CNI_COMMAND", Some("FROB")),
            codes: &[4],
        },
        BadInput {
            what: "CNI_CONTAINERID unset",
            call: add(&container_id()).env("CNI_CONTAINERID", None),
            codes: &[4],
        },
        BadInput {
            what: "CNI_CONTAINERID empty",
            call: add(&container_id()).env("CNI_CONTAINERID", Some("")),
            codes: &[4],
        },
        BadInput {
            what: "CNI_IFNAME unset",
            call: add(&container_id()).env("CNI_IFNAME", None),
            codes: &[4],
        },
        BadInput {
            what: "CNI_IFNAME empty",
            call: add(&container_id()).env("CNI_IFNAME", Some("")),
            codes: &[4],
        },
        BadInput {
            what: "CNI_NETNS unset on ADD",
            call: add(&container_id()).env("CNI_NETNS", None),
            codes: &[4],
        },
        BadInput {
            what: "CNI_NETNS empty on ADD",
            call: add(&container_id()).netns(""),
            codes: &[4],
        },
        BadInput {
            what: "container id with /",
            call: add("abc/../../etc"),
            codes: &[4],
        },
        BadInput {
            what: "container id ..",
            call: add(".."),
            codes: &[4],
        },
        BadInput {
            what: "container id .",
            call: add("."),
            codes: &[4],
        },
        BadInput {
            what: "container id with :",
            call: add("abc:eth0"),
            codes: &[4],
        },
        BadInput {
            what: "container id over-long",
            call: add(&long_name),
            codes: &[4],
        },
        BadInput {
            what: "ifname with /",
            call: add(&container_id()).ifname("eth0/x"),
            codes: &[4],
        },
        BadInput {
            what: "ifname ..",
            call: add(&container_id()).ifname(".."),
            codes: &[4],
        },
        BadInput {
            what: "ifname with :",
            call: add(&container_id()).ifname("eth0:1"),
            codes: &[4],
        },
        BadInput {
            what: "ifname over 15 bytes",
            call: add(&container_id()).ifname("abcdefghijklmnop"),
            codes: &[4],
        },
        // A NUL cannot travel in an environment variable (execve strings end at NUL), so no
        // runtime can send one in CNI_ARGS or CNI_CONTAINERID: nothing to test.
        BadInput {
            what: "pod name with /",
            call: add_with_pod("default", "web/0"),
            codes: &[4],
        },
        BadInput {
            what: "pod name ..",
            call: add_with_pod("default", ".."),
            codes: &[4],
        },
        BadInput {
            what: "pod namespace with /",
            call: add_with_pod("../kube-system", "web-0"),
            codes: &[4],
        },
        BadInput {
            what: "pod name over-long",
            call: add_with_pod("default", &long_name),
            codes: &[4],
        },
        BadInput {
            what: "pod namespace over-long",
            call: add_with_pod(&long_name, "web-0"),
            codes: &[4],
        },
        BadInput {
            what: "network name with /",
            call: add(&container_id()).network("../escape"),
            codes: &[4, 7],
        },
        BadInput {
            what: "stdin over 1 MiB",
            call: oversized_call,
            codes: &[6, 7],
        },
        BadInput {
            what: "ADD without prevResult",
            call: add(&container_id()).no_prev_result(),
            codes: &[7],
        },
        BadInput {
            what: "prevResult a string",
            call: add(&container_id()).prev_result(&json!("10.22.0.5/16")),
            codes: &[6],
        },
        BadInput {
            what: "prevResult ips not an array",
            call: prev_result_with(&|r| r["ips"] = json!({"address": "10.22.0.5/16"})),
            codes: &[6],
        },
        BadInput {
            what: "prevResult ip without prefix",
            call: prev_result_with(&|r| r["ips"][0]["address"] = json!("10.22.0.5")),
            codes: &[6],
        },
        BadInput {
            what: "prevResult ip not an address",
            call: prev_result_with(&|r| r["ips"][0]["address"] = json!("banana/24")),
            codes: &[6],
        },
        BadInput {
            what: "staleDel invalid",
            call: add(&container_id()).config("staleDel", Some(json!("maybe"))),
            codes: &[7],
        },
        // A wrong JSON type fails the decoding of the config itself: 6 is as right as 7.
        BadInput {
            what: "staleDel not a string",
            call: add(&container_id()).config("staleDel", Some(json!(true))),
            codes: &[6, 7],
        },
        BadInput {
            what: "logFile relative",
            call: add(&container_id()).config("logFile", Some(json!("guard.log"))),
            codes: &[7],
        },
    ]
}

#[test]
fn every_bad_input_is_a_cni_error_and_leaves_the_store_untouched() {
    let store = Store::new();
    store
        .add(&container_id(), &Pod::new("default", "settled-0"))
        .run()
        .assert_ok();
    let before = store.snapshot();
    let mut failures = Vec::new();
    for bad in bad_inputs(&store) {
        let reply = bad.call.run();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let error = reply.assert_error_in(bad.codes);
            assert_eq!(store.snapshot(), before, "the store changed");
            error
        }));
        match outcome {
            Ok(error) if bad.what == "ADD without prevResult" => {
                if !error.text().to_lowercase().contains("chain") {
                    failures.push(format!(
                        "{}: the message must say the plugin must be chained: {error:?}",
                        bad.what
                    ));
                }
            }
            Ok(_) => {}
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "panic".into());
                failures.push(format!("{}: {why}", bad.what));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} bad inputs mishandled:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn bad_input_on_del_is_a_cni_error_too() {
    let (store, pod, a) = Store::with_one_sandbox("default", "web-0");
    let before = store.snapshot();
    store
        .del(&a, &pod)
        .stdin(b"{not json".to_vec())
        .run()
        .assert_error(6);
    store
        .del(&a, &pod)
        .env("CNI_CONTAINERID", Some(""))
        .run()
        .assert_error(4);
    store.del(&a, &pod).ifname("../eth0").run().assert_error(4);
    store
        .del(&a, &pod)
        .config("staleDel", Some(json!("never")))
        .run()
        .assert_error(7);
    assert_eq!(store.snapshot(), before);
    assert!(cni::entry_exists(&store.record_path(NETWORK, &a, "eth0")));
}

/// The longest name of `build(len)` the plugin accepts (1..=512), found with DELs of nothing,
/// which validate names like an ADD and leave no record.
fn longest_accepted(store: &Store, build: impl Fn(usize) -> cni::Cni) -> usize {
    let (mut accepted, mut refused) = (1, 513);
    while refused - accepted > 1 {
        let len = (accepted + refused) / 2;
        let reply = build(len).run();
        if reply.succeeded() {
            accepted = len;
        } else {
            reply.assert_error_in(&[4, 7]);
            refused = len;
        }
    }
    assert!(store.dump().is_empty());
    accepted
}

/// An ADD of the longest network name, container id and ifname the plugin accepts.
fn longest_names_add(store: &Store) -> cni::Cni {
    let network_len = longest_accepted(store, |len| {
        store.cni("DEL", &container_id()).network(&"n".repeat(len))
    });
    let container_len = longest_accepted(store, |len| store.cni("DEL", &"c".repeat(len)));
    store
        .add(&"c".repeat(container_len), &Pod::new("default", "web-0"))
        .network(&"n".repeat(network_len))
        .ifname("abcdefghijklmno")
}

#[test]
fn longest_accepted_names_work_at_a_five_digit_pid() {
    sys::skip_unless_root!(&["unshare"]);
    let store = Store::new();
    let add = longest_names_add(&store);
    // Pids run up to pid_max - 1 (32767 by default, 4194303 where systemd raises it): any
    // file name the plugin derives with its pid must still fit in 255 bytes there.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let at_high_pid = format!(
        "echo {} > /proc/sys/kernel/ns_last_pid && \"$0\"",
        pid_max - 100
    );
    let high_pid = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "/bin/sh",
        "-c",
        at_high_pid.as_str(),
    ];
    add.wrapped_in(&high_pid).run().assert_ok();
    assert_eq!(store.dump().len(), 1);
}

#[test]
fn add_over_a_corrupted_record_with_long_names_writes_a_fresh_one() {
    let store = Store::new();
    let longest = longest_names_add(&store);
    // The longest container id whose ADD goes through at this test's pids; whatever an ADD
    // once wrote, a later ADD must be able to replace after corruption.
    let added = (1..=64)
        .map(|shorter| {
            let container = "c".repeat(longest.container().len() - shorter);
            store
                .add(&container, &Pod::new("default", "web-0"))
                .network(longest.network_name())
                .ifname("abcdefghijklmno")
        })
        .find(|add| add.run().succeeded())
        .expect("some long container id can be added");
    let records = files_in(&store.state_dir.join("records"));
    assert_eq!(records.len(), 1, "{records:?}");
    let mut bytes = cni::read_entry(&records[0]).unwrap();
    let at = find(&bytes, b"web-0").expect("the record holds the pod name");
    bytes[at] = b'W';
    cni::write_entry_like(&records[0], &bytes);

    added.run().assert_ok();
    assert!(
        store.dump().iter().any(|e| e["setAside"] != true),
        "a fresh, valid checkpoint"
    );
}

// ---------------------------------------------------------------------------------------
// A state dir written by the previous release (its ownerships regular files)

/// `testdata/state-previous-release-owners` (how it was made: testdata/README.md): db-0 added
/// by sandbox A, then by B (B owns it, A is stale), web-0 by C.
pub const PREVIOUS_RELEASE: &str = "state-previous-release-owners";

fn previous_release_cast() -> (Store, Pod, Pod, [String; 3]) {
    let store = Store::from_fixture(PREVIOUS_RELEASE);
    let [a, b, c] = ['a', 'b', 'c'].map(|x| x.to_string().repeat(64));
    (
        store,
        Pod::new("migrate", "db-0"),
        Pod::new("migrate", "web-0"),
        [a, b, c],
    )
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_symlink()
}

#[test]
fn a_state_dir_of_the_previous_release_keeps_working_and_its_owners_change_form_on_change() {
    let (store, db0, web0, [a, b, c]) = previous_release_cast();
    let owners = store.owner_files();
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert!(
        owners.iter().all(|p| !is_symlink(p)),
        "the fixture holds the previous release's regular files"
    );

    // Read as they are: B owns db-0, so A's retried DEL is stale; C owns web-0.
    store.del(&a, &db0).run().assert_error(11);
    assert!(store.is_owner(&b, "eth0") && store.is_owner(&c, "eth0"));
    store.assert_every_owner_has_its_record();

    // db-0's next sandbox takes the key: its ownership is rewritten in the new form (where the
    // file system journals metadata; a regular file synced on its own elsewhere); web-0's
    // stays as it was until it changes.
    let d = container_id();
    store.add(&d, &db0).run().assert_ok();
    let owners = store.owner_files();
    assert_eq!(owners.len(), 2, "{owners:?}");
    let owner_of = |id: &str| {
        owners
            .iter()
            .find(|p| verify_envelope(p).unwrap()["containerId"] == id)
            .unwrap_or_else(|| panic!("no owner {id}: {owners:?}"))
    };
    assert_eq!(
        is_symlink(owner_of(&d)),
        sys::journals_metadata(&store.state_dir),
        "{owners:?}"
    );
    assert!(!is_symlink(owner_of(&c)), "{owners:?}");
    store.del(&b, &db0).run().assert_error(11);
    store.del(&a, &db0).run().assert_error(11);

    // The old-form ownership goes with its owner's DEL, as before.
    store.del(&c, &web0).run().assert_ok();
    store.del(&d, &db0).run().assert_ok();
    assert!(store.owner_files().is_empty(), "{:?}", store.owner_files());
    store.del(&a, &db0).run().assert_ok();
    store.del(&b, &db0).run().assert_ok();
    assert!(store.dump().is_empty());
}

/// docs/how-it-decides.md: a 0.1.0/0.2.0 pod whose interface is not `CNI_IFNAME` in its netns at ADD has no
/// link facts, and "a network later raised to 0.4.0 or more is checked against the result's
/// addresses and routes only". --restore cannot rebuild such an interface, so a CHECK that
/// says "interface eth0 is missing; run --restore" fails the healthy pod for good and sends
/// the operator to a command that cannot help.
#[test]
fn a_legacy_pod_without_its_interface_at_add_is_checked_against_its_result_only() {
    sys::skip_unless_root!(&["ip"]);
    let ns = sys::Netns::new("sglegacy");
    let netns = ns.path().to_str().unwrap().to_string();
    let store = Store::new();
    let (a, pod) = (container_id(), Pod::new("default", "legacy-0"));
    let legacy = r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","gateway":"10.0.0.1","routes":[{"dst":"0.0.0.0/0"}]}}"#;
    store
        .add(&a, &pod)
        .version("0.2.0")
        .netns(&netns)
        .prev_result_raw(legacy)
        .run()
        .assert_ok();
    // libcni's cached 0.2.0 result, converted to the raised version as CheckNetworkList does.
    let cached = r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
    let reply = store
        .cni("CHECK", &a)
        .pod(&pod)
        .version("0.4.0")
        .netns(&netns)
        .prev_result_raw(cached)
        .run();
    assert!(
        reply.succeeded(),
        "CHECK of a legacy pod whose interface was never seen: {reply:?}"
    );
}
