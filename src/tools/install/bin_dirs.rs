//! Where the runtime looks for plugins, and where the guard's binary goes. The runtime's own
//! word first: containerd's CRI status (`cniconfig.PluginDirs`, its `bin_dir`, or 2.x's
//! `bin_dirs`) or CRI-O's config (`plugin_dirs`), taken from the runtime that reads the conf
//! dir being installed into; else `--bin-dir`; else the platform's dir as the node has it
//! now. Asked again on every look: the dir can move under a running watch (k3s's upgrade
//! points containerd at the new release's dir, a changed containerd config).

use std::path::{Path, PathBuf};

use super::edit::GUARD_TYPE;
use super::network::{self, Found};
use super::{Failure, Options, Reason, readiness};
use crate::tools::runtime::{self, Loaded};

#[derive(Debug, Clone)]
pub struct BinDirs {
    /// The dirs searched for plugins, in the runtime's order, as seen from here.
    pub searched: Vec<PathBuf>,
    /// Where the binary goes, its links resolved as the host resolves them: the first
    /// searched dir seen here that holds a sandbox-guard already (libcni runs the first it
    /// finds), else the first seen here.
    pub target: PathBuf,
    /// Who named the dirs, for messages: `containerd (asked on ...)`, `--bin-dir`.
    pub named_by: String,
    /// Whether the runtime named them.
    pub asked: bool,
    /// Said on every run: a runtime that answered for another conf dir, a searched dir that
    /// is not mounted here.
    pub notes: Vec<String>,
}

/// The dirs for the network of `found`, or why the guard cannot be put where the runtime
/// looks. A network that names the guard already and whose runtime's dirs are none of them
/// mounted here is one the guard cannot run in as far as this installer can make it.
pub fn locate(options: &Options, found: &Found) -> Result<BinDirs, Failure> {
    let host_root = &options.host_root;
    let (fallback, fallback_name) = fallback(options);
    let mut notes = Vec::new();
    let (named_by, searched) = match runtime_dirs(options) {
        Ok(asked) => asked,
        Err(note) => {
            notes.extend(note);
            return Ok(BinDirs {
                target: network::host_dir(host_root, &fallback),
                searched: vec![fallback],
                named_by: fallback_name,
                asked: false,
                notes,
            });
        }
    };
    let seen = |d: &PathBuf| network::host_dir(host_root, d).is_dir();
    let visible: Vec<&PathBuf> = searched.iter().filter(|d| seen(d)).collect();
    let unseen: Vec<String> = searched
        .iter()
        .filter(|d| !seen(d))
        .map(|d| on_the_host(host_root, d).display().to_string())
        .collect();
    let Some(first) = visible.first() else {
        let failure = Failure::new(
            Reason::BinDir,
            format!(
                "{named_by} looks for plugins in {}, none of them mounted under --host-root {}: sandbox-guard \
                 cannot be put where the runtime looks, and a network naming it fails every pod's ADD; mount the \
                 host's {} at the same path under --host-root{}",
                unseen.join(", "),
                host_root.display(),
                unseen[0],
                preset_hint(&unseen[0])
            ),
        );
        return Err(if super::edit::names_guard_anywhere(&found.net.doc.root) {
            failure.guard_cannot_run()
        } else {
            failure
        });
    };
    let target = visible
        .iter()
        .find(|d| network::plugin_found(d, host_root, GUARD_TYPE))
        .unwrap_or(first);
    if !unseen.is_empty() {
        notes.push(format!(
            "{named_by} also looks for plugins in {}, not mounted here: a sandbox-guard there, if it comes \
             before {} in the runtime's order, would run instead of this one, and the network's plugins there \
             are not checked; mount it at the same path under --host-root",
            unseen.join(", "),
            target.display()
        ));
    }
    Ok(BinDirs {
        target: network::host_dir(host_root, target),
        searched,
        named_by,
        asked: true,
        notes,
    })
}

/// The refusal for plugins of `found`'s network that no dir holds where the runtime (or
/// multus, for its cluster network) finds plugins, naming where they are instead where that
/// is `--bin-dir` or the platform's dir. None where a searched dir cannot be seen here: the
/// plugins may be there.
pub fn missing_failure(options: &Options, dirs: &BinDirs, found: &Found) -> Option<Failure> {
    let host_root = &options.host_root;
    if dirs
        .searched
        .iter()
        .any(|d| !network::host_dir(host_root, d).is_dir())
        && dirs.asked
    {
        return None;
    }
    // Multus runs its delegates from its binDir first (thin: then the runtime's dirs).
    let multus_dir = found
        .multus_bin_dir
        .as_ref()
        .and_then(|(named, _)| network::under_host_root(host_root, named));
    let missing: Vec<String> = network::plugin_types(&found.net)
        .into_iter()
        .filter(|t| {
            !dirs
                .searched
                .iter()
                .chain(multus_dir.as_ref())
                .any(|d| network::plugin_found(d, host_root, t))
        })
        .collect();
    if missing.is_empty() {
        return None;
    }
    let net = &found.net;
    let shown: Vec<String> = dirs
        .searched
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let msg = if dirs.asked {
        let (fallback, fallback_name) = fallback(options);
        let there = missing
            .iter()
            .all(|t| network::plugin_found(&fallback, host_root, t));
        let elsewhere = if there {
            format!(
                "; they are in {} ({fallback_name}), a dir the runtime does not search",
                fallback.display()
            )
        } else {
            String::new()
        };
        format!(
            "network {} names plugins that {} cannot find in the dirs it searches ({}): {}{elsewhere}; the \
             runtime cannot run this network as the node is now, guard or not: put the network's plugins in the \
             runtime's dir, or point the runtime at theirs",
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

/// The dirs the runtime that reads this conf dir searches, seen from here, with its name;
/// else the note to say (`None`: no runtime answered at all).
fn runtime_dirs(options: &Options) -> Result<(String, Vec<PathBuf>), Option<String>> {
    let host_root = &options.host_root;
    let seen = |p: &Path| readiness::on_host(host_root, p);
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    let conf_dir = |loaded: &Loaded| match loaded {
        Loaded::Containerd { conf_dir, .. } => conf_dir.clone(),
        Loaded::Crio { network, .. } => network.conf_dir.clone(),
    };
    let sockets = readiness::sockets(options.runtime_socket.as_deref(), host_root);
    let answered = runtime::ask_until(&sockets, |loaded| {
        let theirs = conf_dir(loaded);
        match same(
            &network::host_dir(host_root, &seen(&theirs)),
            &options.conf_dir,
        ) {
            true => Ok(()),
            false => Err(format!("reads {}, not this conf dir", theirs.display())),
        }
    });
    let (runtime, socket, dirs) = match answered {
        Ok(Loaded::Containerd {
            socket,
            plugin_dirs,
            ..
        }) => ("containerd", socket, plugin_dirs),
        Ok(Loaded::Crio {
            socket, network, ..
        }) => ("CRI-O", socket, network.plugin_dirs),
        Err(why) => {
            let other: Vec<String> = why.into_iter().filter(|w| w.contains("reads ")).collect();
            return Err((!other.is_empty()).then(|| {
                format!(
                    "the runtime that answered reads another conf dir ({}): the dirs it searches are not taken for {}",
                    other.join("; "),
                    options.conf_dir.display()
                )
            }));
        }
    };
    if dirs.is_empty() {
        return Err(None);
    }
    Ok((
        format!("{runtime} (asked on {})", socket.display()),
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

/// The preset that mounts a platform's plugin dir, where one does.
fn preset_hint(dir: &str) -> &'static str {
    match dir.trim_end_matches('/') {
        "/home/kubernetes/bin" => " (the GKE preset, conf-examples/platforms/gke, does)",
        "/var/lib/cni/bin" => " (the OpenShift preset, conf-examples/platforms/openshift, does)",
        d if d.starts_with("/var/lib/rancher/k3s/data") => {
            " (the k3s preset, conf-examples/platforms/k3s, mounts /var/lib/rancher/k3s/data)"
        }
        _ => "",
    }
}
