//! `--install` and `--uninstall` on a live node: a private containerd 1.6 (cri_node.rs) whose
//! CRI plugin reloads its conf dir when a file there changes, running the pod-named-veth
//! model (tests/cri/podnamed-veth-plugin) alone. A pod started before the install is not
//! checkpointed, one started after it is, and after the uninstall (the conf dir back byte
//! for byte) the next one is not again. A sandbox from before the install is stopped and
//! removed through the guard without trouble: a DEL the guard has no checkpoint for passes.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/cri_incident.rs"]
mod cri_incident;
#[path = "support/cri_node.rs"]
mod cri_node;
#[path = "support/install.rs"]
mod install;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::time::Duration;

use cri_incident::{MissingEndpoint, Mode, conflist};
use cri_node::{CriNode, Primary};
use install::{contents, run_ok};

const NAMESPACE: &str = "shop";

/// containerd's conf syncer reloads on the directory's inotify events; give it a moment.
fn let_containerd_reload() {
    std::thread::sleep(Duration::from_secs(2));
}

fn checkpointed(node: &CriNode) -> Vec<String> {
    if !node.layout.guard_state.exists() {
        return Vec::new();
    }
    let entries = cni::dump_checkpoints(&node.layout.guard_state, &[]);
    entries
        .iter()
        .map(|e| e["containerId"].as_str().unwrap().to_string())
        .collect()
}

fn install_while_containerd_runs(mode: &str) {
    let node = CriNode::start(Primary::PodNamedVeth, |layout| {
        conflist(layout, Mode::Unguarded, MissingEndpoint::Ignore)
    });
    let conf = node.layout.dir.join("net.d");
    let bin = node.layout.dir.join("bin");
    let before = contents(&conf);

    let earlier = node
        .run_pod("web-0", NAMESPACE, "uid-web-0")
        .expect("run web-0");
    let guard_state = node.layout.guard_state.to_str().unwrap();
    let guard_log = node.layout.guard_log.to_str().unwrap();
    run_ok(
        "--install",
        &conf,
        &bin,
        &[
            "--mode",
            mode,
            "--state-dir",
            guard_state,
            "--log-file",
            guard_log,
        ],
    );
    let_containerd_reload();

    let guarded = node
        .run_pod("web-1", NAMESPACE, "uid-web-1")
        .expect("run web-1 with the guard installed");
    assert_eq!(
        checkpointed(&node),
        std::slice::from_ref(&guarded),
        "{mode}: the pod started after the install is the one checkpointed"
    );
    assert!(
        node.pod_status(&guarded)["ip"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty()),
        "{mode}: no IP through the guard"
    );
    node.stop_pod(&earlier)
        .expect("stop a sandbox from before the install");
    node.remove_pod(&earlier)
        .expect("remove a sandbox from before the install");

    run_ok("--uninstall", &conf, &bin, &[]);
    assert_eq!(
        contents(&conf),
        before,
        "{mode}: the conf dir is not as before the install"
    );
    let_containerd_reload();
    let later = node
        .run_pod("web-2", NAMESPACE, "uid-web-2")
        .expect("run web-2 after the uninstall");
    assert_eq!(
        checkpointed(&node),
        [guarded],
        "{mode}: {later} was checkpointed after the uninstall"
    );
}

#[test]
fn chained_install_and_uninstall_on_a_running_containerd() {
    sys::skip_unless_root!(cri_node::TOOLS);
    install_while_containerd_runs("chained");
}

#[test]
fn delegate_install_and_uninstall_on_a_running_containerd() {
    sys::skip_unless_root!(cri_node::TOOLS);
    install_while_containerd_runs("delegate");
}
