//! sandbox-guard under a real runtime: podman 4.3 with its CNI backend, the guard last in a
//! bridge + host-local chain. Podman is the runtime that sends only K8S_POD_NAME (no
//! K8S_POD_NAMESPACE), so besides showing that ADD and DEL reach the guard and keep its
//! checkpoints in step with the containers, these tests show that the guard never blocks
//! such a runtime, whatever order its containers go away in.
//!
//! Needs root and the podman, runc, catatonit and containernetworking-plugins packages.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/podman.rs"]
mod podman;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use podman::{Container, PodmanEnv};
use serde_json::Value;

#[test]
fn podman_add_and_del_go_through_the_guard() {
    sys::skip_unless_root!(podman::TOOLS);
    let env = PodmanEnv::new();
    let name = sys::unique("sgc");
    let container = env.run_container(&name);

    let record = env.record_of(&container.id).unwrap_or_else(|| {
        panic!(
            "no checkpoint after the ADD: {:#?}",
            env.checkpoint_records()
        )
    });
    assert_record_matches(&env, &record, &container, &name);
    assert!(
        env.libcni_cache_entry(&container.id).exists(),
        "libcni cached no ADD result"
    );
    assert!(
        env.ipam_reservation(&container.ip).exists(),
        "host-local reserved no address"
    );

    env.podman(&["stop", "--time", "5", &container.id]);
    env.wait_for_record_removal(&container.id);
    assert_del_went_down_the_whole_chain(&env, &container);

    env.podman(&["rm", &container.id]);
    assert_eq!(
        env.checkpoint_records(),
        Vec::<Value>::new(),
        "records left after rm"
    );
    assert_one_quiet_add_and_del_logged(&env, &[&container]);
}

/// The stale-DEL shape from Kubernetes (the old sandbox's DEL arrives after the new sandbox's
/// ADD for the same pod name) played with podman. Renames give both containers the same
/// K8S_POD_NAME at ADD and at the older one's DEL. Without K8S_POD_NAMESPACE there is no pod
/// identity, so the guard, even with staleDel=refuse, must let that DEL through.
#[test]
fn podman_without_pod_namespace_is_never_refused() {
    sys::skip_unless_root!(podman::TOOLS);
    let env = PodmanEnv::new();
    let pod_name = sys::unique("sgc");
    let older = env.run_container(&pod_name);
    env.podman(&["rename", &older.id, &format!("{pod_name}-old")]);
    let newer = env.run_container(&pod_name);
    env.podman(&["rename", &newer.id, &format!("{pod_name}-new")]);
    env.podman(&["rename", &older.id, &pod_name]);

    for container in [&older, &newer] {
        let record = env
            .record_of(&container.id)
            .unwrap_or_else(|| panic!("no checkpoint for {}", container.id));
        assert_record_matches(&env, &record, container, &pod_name);
    }

    env.podman(&["stop", "--time", "5", &older.id]);
    env.wait_for_record_removal(&older.id);
    assert_del_went_down_the_whole_chain(&env, &older);
    let survivor = env
        .record_of(&newer.id)
        .expect("the older container's DEL took the newer container's checkpoint with it");
    assert_record_matches(&env, &survivor, &newer, &pod_name);
    assert!(
        env.ipam_reservation(&newer.ip).exists(),
        "the newer container lost its address"
    );

    env.podman(&["rm", "--force", "--time", "0", &newer.id]);
    env.wait_for_record_removal(&newer.id);
    assert_del_went_down_the_whole_chain(&env, &newer);
    env.podman(&["rm", &older.id]);
    assert_eq!(
        env.checkpoint_records(),
        Vec::<Value>::new(),
        "records left after rm"
    );
    assert_one_quiet_add_and_del_logged(&env, &[&older, &newer]);
}

/// The record holds what podman saw of the attachment, and no pod identity beyond the name
/// podman sent.
fn assert_record_matches(env: &PodmanEnv, record: &Value, container: &Container, pod_name: &str) {
    let context = || format!("record: {record:#}\ncontainer: {container:#?}");
    assert_eq!(record["network"], env.network.as_str(), "{}", context());
    assert_eq!(record["ifName"], podman::IFNAME, "{}", context());
    assert_eq!(record["podName"], pod_name, "{}", context());
    assert_eq!(record["podNamespace"], Value::Null, "{}", context());
    assert_eq!(record["podUid"], Value::Null, "{}", context());
    assert_eq!(record["netns"], container.netns.as_str(), "{}", context());
    assert_eq!(record["setAside"], false, "{}", context());
    // Ownership is per pod (namespace + name); with no namespace there is nothing to own.
    assert_eq!(record["owner"], false, "{}", context());
    let ips = record["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips: {}", context()));
    assert!(
        ips.contains(&Value::from(container.ip_cidr.as_str())),
        "{}",
        context()
    );
    let interfaces = record["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no interfaces: {}", context()));
    assert!(
        interfaces
            .iter()
            .any(|interface| interface["name"] == podman::IFNAME
                && interface["mac"] == container.mac.as_str()
                && interface["sandbox"] == container.netns.as_str()),
        "{}",
        context()
    );
}

/// A DEL the guard refused would stop the chain before host-local, and libcni would keep its
/// cached result; both gone means every plugin got the DEL.
fn assert_del_went_down_the_whole_chain(env: &PodmanEnv, container: &Container) {
    assert!(
        !env.libcni_cache_entry(&container.id).exists(),
        "libcni kept its cache entry for {}: a DEL in the chain failed; guard log:\n{}",
        container.id,
        env.guard_log()
    );
    assert!(
        !env.ipam_reservation(&container.ip).exists(),
        "host-local still holds {} of {}: it never got the DEL; guard log:\n{}",
        container.ip,
        container.id,
        env.guard_log()
    );
}

/// One log line per operation: each container's ADD and DEL exactly once, and nothing the
/// guard found worth a warning (a refusal or an audited stale DEL would be one).
fn assert_one_quiet_add_and_del_logged(env: &PodmanEnv, containers: &[&Container]) {
    let log = env.guard_log();
    let loud: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    assert!(
        loud.is_empty(),
        "the guard warned about a podman lifecycle:\n{log}"
    );
    for container in containers {
        let lines: Vec<&str> = log
            .lines()
            .filter(|line| line.contains(&container.id))
            .collect();
        for verb in [" ADD ", " DEL "] {
            assert_eq!(
                lines.iter().filter(|line| line.contains(verb)).count(),
                1,
                "expected one{verb}line for {}:\n{log}",
                container.id
            );
        }
    }
}
