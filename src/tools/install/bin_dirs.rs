//! Where the runtime looks for plugins, and where the guard's binary goes. The runtime's own
//! word first: containerd's CRI status (`cniconfig.PluginDirs`, its `bin_dir`, or 2.x's
//! `bin_dirs`) or CRI-O's config (`plugin_dirs`), taken only from a runtime that reads the
//! conf dir being installed into; else `--bin-dir`; else the platform's dir as the node
//! has it now. Asked again on every look: the dir can move under a running watch (k3s's
//! upgrade points containerd at the new release's dir, a changed containerd config).

use std::path::{Path, PathBuf};

use super::edit::GUARD_TYPE;
use super::network::{self, Network};
use super::{Failure, Options, Reason, readiness};
use crate::tools::runtime::{self, Loaded};

#[derive(Debug, Clone)]
pub struct BinDirs {
    /// The dirs searched for plugins, in the runtime's order, as seen from here.
    pub searched: Vec<PathBuf>,
    /// Where the binary goes, its links resolved as the host resolves them: the searched
    /// dir that holds a sandbox-guard already (libcni runs the first it finds), else the
    /// one holding the network's primary, else the first.
    pub target: PathBuf,
    /// Who named the dirs, for messages: `containerd (its answer on ...)`, `--bin-dir`.
    pub named_by: String,
    /// Whether the runtime named them.
    pub asked: bool,
    /// Said on every run: a runtime that answered for another conf dir.
    pub notes: Vec<String>,
}

impl BinDirs {
    /// The network's plugins not found in any searched dir (the guard's own left out: it is
    /// what the install puts there).
    pub fn missing(&self, host_root: &Path, net: &Network) -> Vec<String> {
        network::plugin_types(net)
            .into_iter()
            .filter(|t| {
                !self
                    .searched
                    .iter()
                    .any(|d| network::plugin_found(d, host_root, t))
            })
            .collect()
    }
}

/// The dirs for `net`, or why the guard cannot be put where the runtime looks.
pub fn locate(options: &Options, net: &Network) -> Result<BinDirs, Failure> {
    let (fallback, fallback_name) = fallback(options);
    let mut notes = Vec::new();
    let asked = match runtime_dirs(options) {
        Ok(found) => Some(found),
        Err(note) => {
            notes.extend(note);
            None
        }
    };
    let Some((runtime, searched)) = asked else {
        return Ok(BinDirs {
            target: network::host_dir(&options.host_root, &fallback),
            searched: vec![fallback],
            named_by: fallback_name,
            asked: false,
            notes,
        });
    };
    let host_root = &options.host_root;
    let holds = |dir: &PathBuf, plugin: &str| network::plugin_found(dir, host_root, plugin);
    let primary = network::plugin_types(net).into_iter().next();
    let target = searched
        .iter()
        .find(|d| holds(d, GUARD_TYPE))
        .or_else(|| {
            primary
                .as_deref()
                .and_then(|p| searched.iter().find(|d| holds(d, p)))
        })
        .unwrap_or(&searched[0])
        .clone();
    let seen = network::host_dir(host_root, &target);
    if !seen.is_dir() {
        return Err(Failure::new(
            Reason::BinDir,
            format!(
                "{runtime} looks for plugins in {}, which is not mounted here (no dir at {}): sandbox-guard \
                 cannot be put where {runtime} looks, and a network naming it would fail every pod's ADD; mount the \
                 host's {} at {} (the GKE preset, conf-examples/platforms/gke, mounts /home/kubernetes/bin)",
                on_the_host(host_root, &target).display(),
                target.display(),
                on_the_host(host_root, &target).display(),
                target.display()
            ),
        ));
    }
    Ok(BinDirs {
        searched,
        target: seen,
        named_by: runtime,
        asked: true,
        notes,
    })
}

/// The refusal for plugins of `net` that no searched dir holds, naming where they are
/// instead where that is `--bin-dir` or the platform's dir.
pub fn missing_failure(options: &Options, dirs: &BinDirs, net: &Network) -> Option<Failure> {
    let missing = dirs.missing(&options.host_root, net);
    if missing.is_empty() {
        return None;
    }
    let shown: Vec<String> = dirs
        .searched
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let msg = if dirs.asked {
        let (fallback, fallback_name) = fallback(options);
        let there = missing
            .iter()
            .all(|t| network::plugin_found(&fallback, &options.host_root, t));
        let elsewhere = if there {
            format!(
                "; they are in {} ({fallback_name}), a dir the runtime does not search",
                fallback.display()
            )
        } else {
            String::new()
        };
        format!(
            "network {} names plugins {} cannot find in the dirs it searches ({}): {}{elsewhere}; the runtime \
             cannot run this network as the node is now, and sandbox-guard would not be found beside them either: \
             put the network's plugins in the runtime's dir, or point the runtime at theirs",
            net.name,
            dirs.named_by,
            shown.join(", "),
            missing.join(", ")
        )
    } else {
        format!(
            "network {} names plugins the runtime cannot find in {} ({}): {}; if the runtime looks elsewhere it \
             would not find sandbox-guard there either: give the runtime's plugin dir with --bin-dir, or \
             --platform (gke: /home/kubernetes/bin, openshift: /var/lib/cni/bin, k3s: /var/lib/rancher/k3s/data/cni), \
             or let the installer ask the runtime (--runtime-socket)",
            net.name,
            shown.join(", "),
            dirs.named_by,
            missing.join(", ")
        )
    };
    Some(Failure::new(Reason::BinDir, msg))
}

/// `--bin-dir` as given, else the platform's dir as the node has it now.
fn fallback(options: &Options) -> (PathBuf, String) {
    match options.platform {
        Some(platform) => (
            platform.dirs(&options.host_root).1,
            format!("the platform's, {}", platform.name()),
        ),
        None => (options.bin_dir.clone(), "--bin-dir".to_string()),
    }
}

/// The dirs a runtime that reads this conf dir searches, seen from here, with its name; or
/// the note to say when none answered for it (`None`: none answered at all).
fn runtime_dirs(options: &Options) -> Result<(String, Vec<PathBuf>), Option<String>> {
    let sockets = readiness::sockets(options.runtime_socket.as_deref(), &options.host_root);
    let (runtime, socket, conf_dir, dirs) = match runtime::ask(&sockets) {
        Ok(Loaded::Containerd {
            socket,
            conf_dir,
            plugin_dirs,
            ..
        }) => ("containerd", socket, conf_dir, plugin_dirs),
        Ok(Loaded::Crio {
            socket, network, ..
        }) => ("CRI-O", socket, network.conf_dir, network.plugin_dirs),
        Err(_) => return Err(None),
    };
    let seen = |p: &Path| options.host_root.join(p.strip_prefix("/").unwrap_or(p));
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    let conf_seen = network::host_dir(&options.host_root, &seen(&conf_dir));
    if !same(&conf_seen, &options.conf_dir) {
        return Err(Some(format!(
            "{runtime} on {} reads {}, not {}: the dirs it searches are not taken for this network",
            socket.display(),
            conf_dir.display(),
            options.conf_dir.display()
        )));
    }
    if dirs.is_empty() {
        return Err(None);
    }
    Ok((
        format!("{runtime} (its answer on {})", socket.display()),
        dirs.iter().map(|d| seen(d)).collect(),
    ))
}

/// A dir seen from here as the host names it.
fn on_the_host(host_root: &Path, seen: &Path) -> PathBuf {
    match seen.strip_prefix(host_root) {
        Ok(rest) if host_root != Path::new("/") => Path::new("/").join(rest),
        _ => seen.to_path_buf(),
    }
}
