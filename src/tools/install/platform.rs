//! Where a platform's runtime looks for CNI configs and plugins, as istio-cni's platform
//! values set them: a preset (`--platform gke`) or `auto`, which takes the first platform
//! whose own directories exist under the host's root (the DaemonSet mounts the host's
//! directories under `/host`). `--conf-dir` and `--bin-dir` still win over either.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Auto,
    Default,
    Gke,
    K3s,
    Openshift,
}

const K3S_CONF: &str = "var/lib/rancher/k3s/agent/etc/cni/net.d";
const K3S_DATA: &str = "var/lib/rancher/k3s/data";

/// k3s's data dir, which holds each release's dir, under `host_root`.
pub fn k3s_data(host_root: &Path) -> PathBuf {
    host_root.join(K3S_DATA)
}

impl Platform {
    pub fn parse(text: &str) -> Option<Platform> {
        match text {
            "auto" => Some(Platform::Auto),
            "default" => Some(Platform::Default),
            "gke" => Some(Platform::Gke),
            "k3s" => Some(Platform::K3s),
            "openshift" => Some(Platform::Openshift),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Platform::Auto => "auto",
            Platform::Default => "default",
            Platform::Gke => "gke",
            Platform::K3s => "k3s",
            Platform::Openshift => "openshift",
        }
    }

    /// `auto` made concrete: GKE by its plugin dir, k3s by its agent's conf dir, OpenShift
    /// by multus's conf dir beside its plugin dir; else the upstream default.
    pub fn resolve(self, host_root: &Path) -> Platform {
        if self != Platform::Auto {
            return self;
        }
        let has = |p: &str| host_root.join(p).is_dir();
        if has("home/kubernetes/bin") {
            Platform::Gke
        } else if has(K3S_CONF) {
            Platform::K3s
        } else if has("var/lib/cni/bin") && has("etc/kubernetes/cni/net.d") {
            Platform::Openshift
        } else {
            Platform::Default
        }
    }

    /// The conf dir and bin dir under `host_root`.
    pub fn dirs(self, host_root: &Path) -> (PathBuf, PathBuf) {
        let at = |p: &str| host_root.join(p);
        match self.resolve(host_root) {
            Platform::Gke => (at("etc/cni/net.d"), at("home/kubernetes/bin")),
            Platform::K3s => (at(K3S_CONF), k3s_bin(host_root)),
            Platform::Openshift => (at("etc/kubernetes/cni/net.d"), at("var/lib/cni/bin")),
            Platform::Default | Platform::Auto => (at("etc/cni/net.d"), at("opt/cni/bin")),
        }
    }
}

/// k3s unpacks each release's binaries into `data/<hash>/bin` and points `data/current`
/// at the running one with an absolute link (the host's path: followed under `host_root`);
/// without that link, the newest `<hash>/bin`. Newer k3s points containerd at `data/cni`
/// instead (links into `data/<hash>/bin`): where it exists, that is the only dir the runtime
/// searches.
fn k3s_bin(host_root: &Path) -> PathBuf {
    let data = host_root.join(K3S_DATA);
    let cni = data.join("cni");
    if cni.is_dir() {
        return cni;
    }
    let current = Path::new("/").join(K3S_DATA).join("current/bin");
    if let Some(bin) = super::network::under_host_root(host_root, &current).filter(|d| d.is_dir()) {
        return bin;
    }
    std::fs::read_dir(&data)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.is_dir())
        .max_by_key(|bin| std::fs::metadata(bin).and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| data.join("current/bin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_finds_each_platform_by_its_dirs() {
        let root = std::env::temp_dir().join(format!("sg-platform-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dirs = |root: &Path| Platform::Auto.dirs(root);
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(
            dirs(&root),
            (root.join("etc/cni/net.d"), root.join("opt/cni/bin"))
        );
        std::fs::create_dir_all(root.join(K3S_CONF)).unwrap();
        std::fs::create_dir_all(root.join(K3S_DATA).join("abc123/bin")).unwrap();
        assert_eq!(
            dirs(&root),
            (root.join(K3S_CONF), root.join(K3S_DATA).join("abc123/bin"))
        );
        // data/current names the running release with the host's path, whatever the
        // newest dir: followed under the root, never in this one.
        std::fs::create_dir_all(root.join(K3S_DATA).join("fff999/bin")).unwrap();
        std::os::unix::fs::symlink(
            Path::new("/").join(K3S_DATA).join("abc123"),
            root.join(K3S_DATA).join("current"),
        )
        .unwrap();
        assert_eq!(dirs(&root).1, root.join(K3S_DATA).join("abc123/bin"));
        std::fs::create_dir_all(root.join("home/kubernetes/bin")).unwrap();
        assert_eq!(dirs(&root).1, root.join("home/kubernetes/bin"));
        assert_eq!(
            Platform::Openshift.dirs(&root),
            (
                root.join("etc/kubernetes/cni/net.d"),
                root.join("var/lib/cni/bin")
            )
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
