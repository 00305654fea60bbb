//! The DaemonSet manifests (conf-examples/kubernetes): they pass the Kubernetes schemas
//! (`kubernetes-validate --strict`, from PyPI: scripts/test.sh installs it in
//! target/python), and they ask for no more than the installer needs: SELinux's container
//! type that may write host dirs, the runtime's seccomp profile, no service-account token,
//! an image a node can pull by digest, and host paths that a node without them does not
//! turn into a failing pod.

#[path = "support/sys.rs"]
mod sys;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/conf-examples/kubernetes");
/// The oldest Kubernetes the manifests are for: the schemas of later ones only add fields.
const KUBERNETES: &str = "1.27.0";

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(MANIFESTS)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    files
}

/// `kubernetes-validate` where scripts/test.sh puts it, else on PATH; None (a skip, or a
/// failure under CI) without it.
fn kubernetes_validate(test: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/python/bin/kubernetes-validate");
    if venv.is_file() {
        return Some(venv);
    }
    sys::require(test, false, &["kubernetes-validate"]).then(|| PathBuf::from("kubernetes-validate"))
}

/// The interpreter kubernetes-validate runs with: it has PyYAML, which the package needs.
fn python_of(tool: &Path) -> PathBuf {
    let found = if tool.is_absolute() {
        Some(tool.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(tool)).find(|p| p.is_file()))
    };
    let shebang = found.and_then(|path| std::fs::read_to_string(path).ok()).and_then(|text| {
        let first = text.lines().next()?.strip_prefix("#!")?.trim().to_string();
        Path::new(&first).is_absolute().then(|| PathBuf::from(first))
    });
    shebang.unwrap_or_else(|| PathBuf::from("python3"))
}

/// Every document of `file`, as JSON.
fn documents(python: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(python)
        .args(["-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    assert!(out.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let Some(tool) = kubernetes_validate(sys::test_name!()) else { return };
    for file in manifests() {
        let out = Command::new(&tool).args(["--strict", "--no-warn", "-k", KUBERNETES]).arg(&file).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("passed"), "{}:\n{said}", file.display());
    }
}

#[test]
fn the_daemonsets_ask_for_no_more_than_the_installer_needs() {
    let Some(tool) = kubernetes_validate(sys::test_name!()) else { return };
    let python = python_of(&tool);
    for file in manifests() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let daemonsets: Vec<Value> = documents(&python, &file).into_iter().filter(|doc| doc["kind"] == "DaemonSet").collect();
        assert_eq!(daemonsets.len(), 1, "{name}");
        let pod = &daemonsets[0]["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], Value::Bool(false), "{name}: the installer never calls the API server");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        let host_paths: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|volume| volume.get("hostPath").is_some())
            .map(|volume| {
                // A node without one of these dirs (no CNI yet, a platform keeping its
                // plugins elsewhere) must not keep the pod from starting.
                assert_eq!(volume["hostPath"]["type"], "DirectoryOrCreate", "{name}: {volume}");
                volume["name"].as_str().unwrap()
            })
            .collect();
        let containers = [pod["initContainers"].as_array(), pod["containers"].as_array()].into_iter().flatten().flatten();
        let mut guard_images = 0;
        for container in containers {
            let mounts_host = container["volumeMounts"]
                .as_array()
                .is_some_and(|mounts| mounts.iter().any(|m| host_paths.contains(&m["name"].as_str().unwrap_or(""))));
            if !mounts_host {
                continue;
            }
            let security = &container["securityContext"];
            // Enforcing SELinux nodes label the CNI dirs for the host only: container_t may
            // not write them, spc_t may.
            assert_eq!(security["seLinuxOptions"]["type"], "spc_t", "{name}: {container}");
            assert_eq!(security["allowPrivilegeEscalation"], Value::Bool(false), "{name}: {container}");
            assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]), "{name}: {container}");
            let image = container["image"].as_str().unwrap();
            guard_images += 1;
            // A name a registry serves: a digest-pinned reference or one with a registry host
            // (scripts/image.sh --push prints the pinned one). `localhost/` exists only on a
            // node the archive was loaded onto by hand.
            let host = image.split('/').next().unwrap();
            assert!(
                image.contains("@sha256:") || (image.contains('/') && host != "localhost" && (host.contains('.') || host.contains(':'))),
                "{name}: image {image} is not a reference a registry can serve"
            );
        }
        assert!(guard_images > 0, "{name}");
    }
}
