//! `--install` / `--uninstall` as an operator or a DaemonSet runs them, and what they leave
//! in a conf dir. Needs `crate::sys`, `crate::testdata` and `crate::cni`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::{cni, testdata};

/// What a file is: its bytes and mode, and whether it was rewritten (inode and mtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub bytes: Vec<u8>,
    pub mode: u32,
    pub identity: (u64, i64, i64),
}

/// Every file below a dir by relative path; directories count as empty entries.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, FileState> {
    cni::walk(dir)
        .into_iter()
        .map(|path| {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let bytes = if meta.is_dir() {
                Vec::new()
            } else {
                std::fs::read(&path).unwrap()
            };
            let state = FileState {
                bytes,
                mode: meta.permissions().mode() & 0o7777,
                identity: (meta.ino(), meta.mtime(), meta.mtime_nsec()),
            };
            (path.strip_prefix(dir).unwrap().to_path_buf(), state)
        })
        .collect()
}

/// The bytes of every file below `dir` (directories as empty), by relative path.
pub fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    tree(dir)
        .into_iter()
        .map(|(path, state)| (path, state.bytes))
        .collect()
}

/// The files of `testdata/<fixture>` copied into `dir` (which must exist).
pub fn copy_fixture(fixture: &str, dir: &Path) {
    let from = testdata::fixture_path(fixture);
    for path in cni::walk(&from) {
        let to = dir.join(path.strip_prefix(&from).unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&to).unwrap();
        } else {
            std::fs::copy(&path, &to).unwrap();
        }
    }
}

/// Asserts that `dir` holds exactly the files of `testdata/<fixture>`, byte for byte.
pub fn assert_matches_fixture(dir: &Path, fixture: &str, when: &str) {
    let expected = contents(&testdata::fixture_path(fixture));
    let actual = contents(dir);
    if expected != actual {
        let show = |m: &BTreeMap<PathBuf, Vec<u8>>| -> String {
            m.iter()
                .map(|(p, b)| format!("--- {}\n{}\n", p.display(), String::from_utf8_lossy(b)))
                .collect()
        };
        panic!(
            "{when}: conf dir differs from testdata/{fixture}\nexpected:\n{}\nactual:\n{}",
            show(&expected),
            show(&actual)
        );
    }
}

/// The primary's installer writing its file again as calico's install-cni does: a temp
/// file renamed over it.
pub fn primary_rewrites(file: &Path, bytes: &[u8]) {
    let temp = file.with_extension("primary-tmp");
    std::fs::write(&temp, bytes).unwrap();
    std::fs::rename(&temp, file).unwrap();
}

/// `sandbox-guard --install` (or any other mode's words) with a conf dir and a bin dir.
pub fn run(mode: &str, conf_dir: &Path, bin_dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        mode,
        "--conf-dir",
        conf_dir.to_str().unwrap(),
        "--bin-dir",
        bin_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cni::guard(&args)
}

pub fn run_ok(mode: &str, conf_dir: &Path, bin_dir: &Path, extra: &[&str]) -> String {
    let out = run(mode, conf_dir, bin_dir, extra);
    assert!(
        out.status.success(),
        "{mode} {extra:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every plugin the networks of `conf_dir` name (their IPAM plugins too, a delegate's, and
/// what multus inlines), as a file in `bin_dir`: the installer and its readiness check look
/// for the files the runtime would exec. They are empty: none is run as a plugin, and the
/// `-v` the installer asks calico fails on one (its verdict: unknown).
pub fn stub_plugins(conf_dir: &Path, bin_dir: &Path) {
    fn types(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(t)) = map.get("type") {
                    out.push(t.clone());
                }
                map.values().for_each(|v| types(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| types(v, out)),
            _ => {}
        }
    }
    std::fs::create_dir_all(bin_dir).unwrap();
    let mut names = Vec::new();
    for path in cni::walk(conf_dir).into_iter().filter(|p| p.is_file()) {
        if let Ok(value) =
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(&path).unwrap())
        {
            types(&value, &mut names);
        }
    }
    for name in names
        .into_iter()
        .filter(|n| n != "sandbox-guard" && !n.is_empty() && !n.contains('/'))
    {
        let file = bin_dir.join(name);
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// The files of a conf dir that libcni would read as networks.
pub fn network_files(conf_dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
        })
        .collect();
    files.sort();
    files
}

/// The CNI plugins a k3s release unpacks into data/<hash>/bin, each a link to its multi-call
/// `cni`.
const K3S_PLUGINS: [&str; 6] = [
    "bandwidth",
    "bridge",
    "flannel",
    "host-local",
    "loopback",
    "portmap",
];

/// k3s's data dir under `root`.
pub fn k3s_data(root: &Path) -> PathBuf {
    root.join("var/lib/rancher/k3s/data")
}

/// A k3s node as it is since k3s's data/cni: containerd's bin_dir holds absolute links
/// into data/<hash>/bin, where the release's multi-call `cni` and its relative links are.
pub fn k3s_host(root: &Path) {
    let conf = root.join("var/lib/rancher/k3s/agent/etc/cni/net.d");
    std::fs::create_dir_all(&conf).unwrap();
    copy_fixture("install/k3s/conf", &conf);
    let data = k3s_data(root);
    k3s_release(root, "3d1f7b5e0c9a");
    std::fs::create_dir_all(data.join("cni")).unwrap();
    for plugin in K3S_PLUGINS {
        std::os::unix::fs::symlink(
            "/var/lib/rancher/k3s/data/3d1f7b5e0c9a/bin/cni",
            data.join("cni").join(plugin),
        )
        .unwrap();
    }
}

/// One k3s release's bin dir, data/<hash>/bin, as k3s's `extract` (cmd/k3s/main.go) leaves
/// it, and `data/current` pointed at it with an absolute link (the one before it becomes
/// `data/previous`). Before k3s's data/cni (PR #10868) containerd's bin_dir is this dir
/// itself: the agent finds `host-local` in the PATH that starts with it.
pub fn k3s_release(root: &Path, hash: &str) -> PathBuf {
    let data = k3s_data(root);
    let release = data.join(hash).join("bin");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::write(release.join("cni"), b"").unwrap();
    for plugin in K3S_PLUGINS {
        std::os::unix::fs::symlink("cni", release.join(plugin)).unwrap();
    }
    let current = data.join("current");
    if std::fs::symlink_metadata(&current).is_ok() {
        std::fs::rename(&current, data.join("previous")).unwrap();
    }
    std::os::unix::fs::symlink(format!("/var/lib/rancher/k3s/data/{hash}"), &current).unwrap();
    release
}

/// A k3s node before data/cni: its agent's conf dir with flannel's list, one release.
pub fn k3s_host_before_data_cni(root: &Path, hash: &str) -> PathBuf {
    let conf = root.join("var/lib/rancher/k3s/agent/etc/cni/net.d");
    std::fs::create_dir_all(&conf).unwrap();
    copy_fixture("install/k3s/conf", &conf);
    k3s_release(root, hash)
}

/// A stand-in for calico's binary as `release` answers `-v`: calico-cni v1.x (`calico.go`
/// main) and calico 3.x (`cni-plugin/pkg/plugin/plugin.go` Main) print their `git describe`
/// version and exit 0; any CNI verb fails, as no datastore is reachable here.
pub fn calico_stand_in(bin_dir: &Path, release: &str) {
    std::fs::create_dir_all(bin_dir).unwrap();
    let file = bin_dir.join("calico");
    let _ = std::fs::remove_file(&file);
    std::fs::write(
        &file,
        format!(
            "#!/bin/sh\nif [ \"$1\" = \"-v\" ]; then echo {release}; exit 0; fi\n\
             echo '{{\"code\":100,\"msg\":\"stand-in: no datastore\"}}'; exit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
}
