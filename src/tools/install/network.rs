//! Which file holds the network the runtime will run, found as the runtimes find it:
//! containerd's go-cni and CRI-O's ocicni list `<conf-dir>` with libcni's `ConfFiles` for
//! `.conf`, `.conflist` and `.json` (regular entries, subdirectories skipped), sort the
//! paths, and read a `.conflist` as a list and anything else as one plugin (which must have
//! a `type`), upconverted to a list of one. A list with no plugins is no network.

use std::path::{Path, PathBuf};

use super::json::{Doc, Json};

const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// The chosen network's file as it is now.
#[derive(Debug)]
pub struct Network {
    pub file: PathBuf,
    pub name: String,
    pub doc: Doc,
    pub bytes: Vec<u8>,
    /// A single plugin (`.conf`, `.json`): the runtime upconverts it to a list of one.
    pub single: bool,
}

impl Network {
    /// The network as the runtime runs it: a list (a single plugin upconverted).
    pub fn list(&self) -> Json {
        if self.single {
            super::edit::upconvert(&self.doc.root)
        } else {
            self.doc.root.clone()
        }
    }
}

enum Read {
    Network(Network),
    /// Not a network the runtime would load, and why (not an error: go-cni and ocicni
    /// agree on skipping it only when it parses).
    Broken(PathBuf, String),
}

/// The extensions libcni reads, for the callers that must not match a file of their own.
pub fn is_candidate(name: &str) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.contains(&e))
}

pub fn files(conf_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(conf_dir)
        .map_err(|e| format!("cannot read the CNI config dir {}: {e}", conf_dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        // DirEntry's type, as Go's: a symlink to a file counts, a directory does not.
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter(|e| is_candidate(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

fn read(file: &Path) -> Read {
    let broken = |why: String| Read::Broken(file.to_path_buf(), why);
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) => return broken(format!("cannot be read: {e}")),
    };
    let doc = match Doc::parse(&bytes) {
        Ok(doc) => doc,
        Err(e) => return broken(format!("does not parse as JSON: {e}")),
    };
    let single = file.extension().is_none_or(|e| e != "conflist");
    let name = doc
        .root
        .get("name")
        .and_then(Json::as_str)
        .map(str::to_string);
    if single {
        if doc
            .root
            .get("type")
            .and_then(Json::as_str)
            .is_none_or(str::is_empty)
        {
            return broken(
                "has no \"type\": a plugin file needs one (a conflist must be named .conflist)"
                    .to_string(),
            );
        }
    } else {
        if name.is_none() {
            return broken("has no \"name\"".to_string());
        }
        match doc.root.get("plugins") {
            Some(Json::Array(plugins)) if !plugins.is_empty() => {
                if let Some(i) = plugins.iter().position(|p| {
                    p.get("type")
                        .and_then(Json::as_str)
                        .is_none_or(str::is_empty)
                }) {
                    return broken(format!("plugin {i} has no \"type\""));
                }
            }
            _ => return broken("has no plugins".to_string()),
        }
    }
    let file = file.to_path_buf();
    Read::Network(Network {
        file,
        name: name.unwrap_or_default(),
        doc,
        bytes,
        single,
    })
}

/// The network's file read again (its owner wrote it since `net` was read).
pub fn reread(net: &Network) -> Result<Network, String> {
    match read(&net.file) {
        Read::Network(again) => Ok(again),
        Read::Broken(file, why) => Err(format!("{} {why}", file.display())),
    }
}

/// Every network of a conf dir in the runtime's order, and the files it would not load.
pub struct Scan {
    pub networks: Vec<Network>,
    broken: Vec<(PathBuf, String)>,
}

pub fn scan(conf_dir: &Path) -> Result<Scan, String> {
    let mut scan = Scan {
        networks: Vec::new(),
        broken: Vec::new(),
    };
    for file in files(conf_dir)? {
        match read(&file) {
            Read::Network(net) => scan.networks.push(net),
            Read::Broken(file, why) => scan.broken.push((file, why)),
        }
    }
    Ok(scan)
}

/// The network to install into, and what the operator should know about the choice.
#[derive(Debug)]
pub struct Found {
    pub net: Network,
    /// Lines for the operator: which network the runtime loads, what multus delegates to.
    pub notes: Vec<String>,
    /// A `--network` that is not what the runtime runs: installed, but not where it counts.
    pub warnings: Vec<String>,
    /// The guard in `net` runs for the runtime's pods: `net` is the network the runtime
    /// loads, or the cluster network multus (loaded by the runtime) hands every pod to.
    pub runtime_runs_it: bool,
    /// Multus (`thick` or `thin`) runs `net` as its cluster network.
    pub via_multus: Option<&'static str>,
    /// Multus thin's file and its inlined copy of `net`, which is what its pods run.
    pub multus_copy: Option<(PathBuf, Json)>,
    /// Who else names `net.file` by its path (multus's `clusterNetwork`, its readiness
    /// indicator): that path must never go away, not even for an instant.
    pub named_by: Option<String>,
    /// Where multus looks first for its delegates' binaries, as the host names it, and
    /// whether multus's file names it (else it is multus's default).
    pub multus_bin_dir: Option<(PathBuf, bool)>,
}

/// The network to install into: the one the runtime loads (the lexically first that
/// parses, as containerd's go-cni and CRI-O's ocicni pick), or the one `wanted` names; when
/// that network is multus's own, the cluster network multus delegates to instead (multus
/// owns, rewrites and removes its file). A file that does not parse and sorts before the
/// chosen one is an error: containerd stops at it, CRI-O skips it, so which network a node
/// runs would depend on the runtime.
pub fn find(conf_dir: &Path, wanted: Option<&str>, host_root: &Path) -> Result<Found, String> {
    let mut scan = scan(conf_dir)?;
    let listing = |networks: &[Network]| -> String {
        networks
            .iter()
            .map(|n| format!("{} ({})", n.name, file_name(&n.file)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if scan.networks.is_empty() {
        let why: Vec<String> = scan
            .broken
            .iter()
            .map(|(f, why)| format!("{} {why}", file_name(f)))
            .collect();
        return Err(format!(
            "no CNI network in {} (a .conflist, .conf or .json the runtime would load){}",
            conf_dir.display(),
            if why.is_empty() {
                String::new()
            } else {
                format!(": {}", why.join("; "))
            }
        ));
    }
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    let first = &scan.networks[0];
    let (first_name, first_file) = (first.name.clone(), file_name(&first.file));
    let chosen = match wanted {
        None => {
            if scan.networks.len() > 1 {
                let guarded = if multus::kind(first).is_some() {
                    ""
                } else {
                    ", which is guarded"
                };
                notes.push(format!(
                    "several networks in {}: {}; the runtime loads the lexically first, {first_name} ({first_file}){guarded}",
                    conf_dir.display(),
                    listing(&scan.networks)
                ));
            }
            0
        }
        Some(name) => match scan.networks.iter().position(|n| n.name == name) {
            Some(i) => {
                if i != 0
                    && !multus::is_cluster_network_of(
                        &scan.networks[0],
                        &scan.networks[i],
                        &scan.networks,
                        conf_dir,
                        host_root,
                    )
                {
                    warnings.push(format!(
                        "--network {name} ({}) is not the network the runtime loads: containerd and CRI-O run the lexically \
                         first, {first_name} ({first_file}); the guard there runs only where the runtime is told to use {name} \
                         (CRI-O's cni_default_network), and the DaemonSet reports not ready",
                        file_name(&scan.networks[i].file)
                    ));
                }
                i
            }
            None => {
                return Err(format!(
                    "no network named {name:?} in {}; found: {}",
                    conf_dir.display(),
                    listing(&scan.networks)
                ));
            }
        },
    };
    let mut runtime_runs_it = chosen == 0;
    let mut chosen = chosen;
    let mut via_multus = None;
    // Multus thick may name a file outside the runtime's conf dir (OpenShift: OVN's in
    // /run/multus/cni/net.d): it is read where multus reads it.
    if let Some(outside) = multus::outside_file(&scan.networks[chosen], &scan.networks, host_root)
        && let Read::Network(net) = read(&outside)
    {
        scan.networks.push(net);
    }
    let named_by = multus::names_by_path(&scan.networks[chosen], conf_dir, host_root);
    let multus_copy = [&scan.networks[chosen], &scan.networks[0]]
        .into_iter()
        .find_map(|m| Some((m.file.clone(), multus::thin_copy(m)?)));
    let mut multus_bin_dir = None;
    if let Some(kind) = multus::kind(&scan.networks[chosen]) {
        let cluster =
            multus::cluster_network(&scan.networks[chosen], &scan.networks, conf_dir, host_root)?;
        notes.push(format!(
            "{} is multus's own ({kind}): guarding the cluster network it hands every pod to, {} ({}), never multus's file",
            file_name(&scan.networks[chosen].file),
            scan.networks[cluster].name,
            file_name(&scan.networks[cluster].file)
        ));
        multus_bin_dir = Some(multus::bin_dir(&scan.networks[chosen]));
        chosen = cluster;
        via_multus = Some(kind);
    } else if multus::is_cluster_network_of(
        &scan.networks[0],
        &scan.networks[chosen],
        &scan.networks,
        conf_dir,
        host_root,
    ) {
        // --network named multus's cluster network itself.
        runtime_runs_it = true;
        via_multus = multus::kind(&scan.networks[0]);
        multus_bin_dir = Some(multus::bin_dir(&scan.networks[0]));
    }
    let net = scan.networks.swap_remove(chosen);
    let named_by = named_by
        .into_iter()
        .find(|(file, _)| multus::same_file(file, &net.file))
        .map(|(_, who)| who);
    if let Some((file, why)) = scan
        .broken
        .iter()
        .find(|(f, _)| *f < net.file && f.parent() == net.file.parent())
    {
        return Err(format!(
            "{} {why}, and it sorts before {}: containerd would fail on it and CRI-O skip it; fix or remove it first",
            file.display(),
            file_name(&net.file)
        ));
    }
    Ok(Found {
        net,
        notes,
        warnings,
        runtime_runs_it,
        via_multus,
        named_by,
        multus_copy,
        multus_bin_dir,
    })
}

/// The network's cniVersion as the runtime reads it: a config without one is 0.1.0.
pub fn version(net: &Network) -> String {
    let version = net
        .doc
        .root
        .get("cniVersion")
        .and_then(Json::as_str)
        .filter(|v| !v.is_empty());
    version
        .unwrap_or(crate::cni::version::UNVERSIONED)
        .to_string()
}

/// The plugin types a network runs (their IPAM plugins too), the guard's own left out:
/// each a binary the runtime must find in its bin dir.
pub fn plugin_types(net: &Network) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    for plugin in super::edit::plugins(&net.list()) {
        // The guard's wrapped primary; other plugins' `delegate` (flannel's) is no plugin.
        let guard = plugin.get("type").and_then(Json::as_str) == Some(super::edit::GUARD_TYPE);
        let plugin = plugin.get("delegate").filter(|_| guard).unwrap_or(plugin);
        let ipam = plugin.get("ipam").and_then(|i| i.get("type"));
        for t in [plugin.get("type"), ipam]
            .into_iter()
            .flatten()
            .filter_map(Json::as_str)
        {
            if t != super::edit::GUARD_TYPE && !types.iter().any(|k| k == t) {
                types.push(t.to_string());
            }
        }
    }
    types
}

/// Whether the runtime finds plugin `name` in `bin_dir`: a file there, its symlinks
/// followed as the host resolves them (k3s links `data/cni/<plugin>` to an absolute path
/// in `data/<hash>/bin`, which means the host's, not this container's).
pub fn plugin_found(bin_dir: &Path, host_root: &Path, name: &str) -> bool {
    let path = host_dir(host_root, bin_dir).join(name);
    // Followed here as well: a mount seen through a link (no image has the host's paths).
    host_resolve(host_root, &path).is_file() || path.is_file()
}

/// A dir as the host resolves it (k3s's `data/current` is an absolute link): a dir under
/// `host_root` is walked there (`under_host_root`), never followed in this root, which
/// could hold the same path; one outside it, or not there, as before.
pub fn host_dir(host_root: &Path, dir: &Path) -> PathBuf {
    let on_host = dir
        .strip_prefix(host_root)
        .ok()
        .and_then(|rest| under_host_root(host_root, &Path::new("/").join(rest)));
    match on_host {
        Some(resolved) => resolved,
        None if dir.is_dir() => dir.to_path_buf(),
        None => host_resolve(host_root, dir),
    }
}

/// A path of the host's (`host_path`, absolute) where it is under `host_root`, every
/// component's symlink resolved as the host resolves it (an absolute target is under
/// `host_root`) and `..` stopping at it, as `/..` stops at `/`: never a path outside
/// `host_root`, which would be this container's own file, not the host's. None when the
/// path is relative, a component is missing, or the links go round.
pub fn under_host_root(host_root: &Path, host_path: &Path) -> Option<PathBuf> {
    use std::ffi::OsString;
    use std::path::Component;
    if !host_path.is_absolute() {
        return None;
    }
    let parent = OsString::from("..");
    // Still to walk, last component first.
    let push = |pending: &mut Vec<OsString>, path: &Path| {
        for part in path.components().rev() {
            match part {
                Component::Normal(name) => pending.push(name.to_os_string()),
                Component::ParentDir => pending.push(parent.clone()),
                _ => {}
            }
        }
    };
    let mut pending = Vec::new();
    push(&mut pending, host_path);
    let mut resolved = host_root.to_path_buf();
    let mut depth = 0usize;
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == parent {
            if depth > 0 {
                resolved.pop();
                depth -= 1;
            }
            continue;
        }
        let next = resolved.join(&part);
        let meta = std::fs::symlink_metadata(&next).ok()?;
        if !meta.file_type().is_symlink() {
            resolved = next;
            depth += 1;
            continue;
        }
        links += 1;
        if links > 40 {
            return None;
        }
        let target = std::fs::read_link(&next).ok()?;
        if target.is_absolute() {
            resolved = host_root.to_path_buf();
            depth = 0;
        }
        push(&mut pending, &target);
    }
    Some(resolved)
}

/// `path` with its symlinks resolved as the host resolves them: an absolute target is
/// under `host_root`. Gives up after as many links as the kernel follows.
pub fn host_resolve(host_root: &Path, path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&path) else {
            return path;
        };
        path = match target.strip_prefix("/") {
            Ok(relative) => host_root.join(relative),
            Err(_) => path.parent().unwrap_or(Path::new("/")).join(target),
        };
    }
    path
}

/// Multus, as its two installers leave a conf dir. Thick (multus-daemon) writes
/// `00-multus.conf`, type `multus-shim`, whose `clusterNetwork` is the path of the primary's
/// file as the daemon sees it (or a network name); thin (the thin entrypoint) writes
/// `00-multus.conf`, or `00-multus.conflist` for a 1.0.0 primary, type `multus`, with the
/// primary's file re-inlined under `delegates` whenever its hash changes (checked each
/// second). Both pick the primary as the lexically first `.conf`/`.conflist` whose name does
/// not start with `00-multus`.
mod multus {
    use super::{Json, Network, Path, file_name};

    pub fn kind(net: &Network) -> Option<&'static str> {
        match first_plugin(net)
            .and_then(|p| p.get("type"))
            .and_then(Json::as_str)
        {
            Some("multus-shim") => Some("thick"),
            Some("multus") => Some("thin"),
            _ => None,
        }
    }

    fn first_plugin(net: &Network) -> Option<&Json> {
        if net.single {
            Some(&net.doc.root)
        } else {
            super::super::edit::plugins(&net.doc.root).first()
        }
    }

    /// The index in `networks` of the network multus delegates every pod to.
    pub fn cluster_network(
        multus: &Network,
        networks: &[Network],
        conf_dir: &Path,
        host_root: &Path,
    ) -> Result<usize, String> {
        let plugin = first_plugin(multus).cloned().unwrap_or(Json::Null);
        let named = plugin
            .get("clusterNetwork")
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty());
        let found = match named {
            // A path as multus's daemon sees it: its file name in this conf dir, or the path
            // itself under the host's root (with or without the daemon's /host prefix).
            Some(path) if path.contains('/') => {
                let base = Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let under_root = |p: &str| host_root.join(p.trim_start_matches('/'));
                let candidates = [conf_dir.join(&base), under_root(path), under_root(path.strip_prefix("/host").unwrap_or(path))];
                networks.iter().position(|n| candidates.iter().any(|c| same_file(c, &n.file))).ok_or_else(|| {
                    let broken = candidates.iter().filter(|c| c.is_file()).find_map(|c| match super::read(c) {
                        super::Read::Broken(file, why) => Some((file, why)),
                        super::Read::Network(_) => None,
                    });
                    if let Some((file, why)) = broken {
                        return format!(
                            "{} is multus's, and the cluster network it names ({path}), {}, {why}: multus fails every \
                             pod ADD until it does (a write cut short by a crash leaves a file so); have its owner write \
                             it again (restart the primary's pod on this node), then run again",
                            file_name(&multus.file),
                            file.display()
                        );
                    }
                    format!(
                        "{} is multus's, and the cluster network it names ({path}) is not a network in {} nor under \
                         --host-root {}: mount the host's dir that holds {base} at the same path under the host root \
                         (the OpenShift preset mounts /run/multus/cni/net.d), and keep --conf-dir the runtime's, so \
                         that multus's file and its readiness indicator are seen and kept",
                        file_name(&multus.file),
                        conf_dir.display(),
                        host_root.display()
                    )
                })?
            }
            Some(name) => networks.iter().position(|n| n.name == name && kind(n).is_none()).ok_or_else(|| {
                format!(
                    "{} is multus's, and its clusterNetwork {name:?} is no network in {} (a NetworkAttachmentDefinition \
                     is not guarded from here): give --conf-dir the directory that holds it",
                    file_name(&multus.file),
                    conf_dir.display()
                )
            })?,
            None => networks
                .iter()
                .position(|n| {
                    let name = file_name(&n.file);
                    !name.starts_with("00-multus") && (name.ends_with(".conf") || name.ends_with(".conflist"))
                })
                .ok_or_else(|| format!("{} is multus's, and no primary network is beside it for multus to delegate to", file_name(&multus.file)))?,
        };
        Ok(found)
    }

    pub fn is_cluster_network_of(
        first: &Network,
        net: &Network,
        networks: &[Network],
        conf_dir: &Path,
        host_root: &Path,
    ) -> bool {
        kind(first).is_some()
            && cluster_network(first, networks, conf_dir, host_root)
                .is_ok_and(|i| networks[i].file == net.file)
    }

    /// The path multus thick names as its cluster network, under the host's root, when no
    /// network in `networks` is that file.
    pub fn outside_file(
        multus: &Network,
        networks: &[Network],
        host_root: &Path,
    ) -> Option<std::path::PathBuf> {
        if kind(multus) != Some("thick") {
            return None;
        }
        let path = first_plugin(multus)?
            .get("clusterNetwork")?
            .as_str()
            .filter(|p| p.starts_with('/'))?;
        let file = host_path(host_root, path)
            .into_iter()
            .find(|c| c.is_file())?;
        (!networks.iter().any(|n| same_file(&file, &n.file))).then_some(file)
    }

    /// The dir multus looks in first for a delegate's binary: its `binDir`, else its default
    /// (multus-cni pkg/types/conf.go). Every delegate call searches `binDir`, then the dirs of
    /// `CNI_PATH` in multus's own environment (pkg/multus/multus.go): thin is exec'd by the
    /// runtime, which sets `CNI_PATH` to its own plugin dirs; thick's daemon takes only the
    /// CNI_COMMAND, CONTAINERID, NETNS, IFNAME and ARGS of the shim's environment
    /// (pkg/server/server.go), so it searches `binDir` alone, the daemon config's key winning
    /// over this file's.
    pub fn bin_dir(multus: &Network) -> (std::path::PathBuf, bool) {
        let named = first_plugin(multus)
            .and_then(|p| p.get("binDir"))
            .and_then(Json::as_str)
            .filter(|d| !d.is_empty());
        (named.unwrap_or("/opt/cni/bin").into(), named.is_some())
    }

    /// A path as multus's daemon writes it (with or without its `/host` prefix), under the
    /// host's root: the first that exists, else both.
    fn host_path(host_root: &Path, path: &str) -> Vec<std::path::PathBuf> {
        let under_root = |p: &str| host_root.join(p.trim_start_matches('/'));
        let mut paths = vec![under_root(path)];
        if let Some(stripped) = path.strip_prefix("/host/") {
            paths.insert(0, under_root(stripped));
        }
        paths
    }

    /// The files multus's file names by path, with what names them: thick's
    /// `clusterNetwork`, and the readiness indicator file (multus deletes its own config and
    /// exits when that file goes away).
    pub fn names_by_path(
        multus: &Network,
        conf_dir: &Path,
        host_root: &Path,
    ) -> Vec<(std::path::PathBuf, String)> {
        let Some(plugin) = first_plugin(multus) else {
            return Vec::new();
        };
        let mut named = Vec::new();
        for (key, what) in [
            ("clusterNetwork", "its cluster network"),
            ("readinessindicatorfile", "its readiness indicator file"),
        ] {
            if let Some(path) = plugin
                .get(key)
                .and_then(Json::as_str)
                .filter(|p| p.starts_with('/'))
            {
                // As the daemon sees it, the conf dir may be mounted anywhere: its name there too.
                let base = Path::new(path).file_name().map(|n| conf_dir.join(n));
                for file in host_path(host_root, path).into_iter().chain(base) {
                    named.push((
                        file,
                        format!(
                            "multus ({}) names it as {what} ({path})",
                            file_name(&multus.file)
                        ),
                    ));
                }
            }
        }
        named
    }

    /// Multus thin's own copy of the network it delegates to (its first `delegates`), made
    /// when it wrote its file: the network pods actually get. Upstream's deployment re-reads
    /// the master file only with `--cleanup-config-on-exit`, so an edit of the master file
    /// may never reach this copy.
    pub fn thin_copy(multus: &Network) -> Option<Json> {
        if kind(multus) != Some("thin") {
            return None;
        }
        match first_plugin(multus)?.get("delegates")? {
            Json::Array(delegates) => delegates.first().cloned(),
            _ => None,
        }
    }

    pub fn same_file(a: &Path, b: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
}

pub fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::under_host_root;
    use std::path::{Path, PathBuf};

    /// A host root under the system's temp dir, removed when dropped.
    struct Root(PathBuf);

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_host_path_stays_under_the_host_root() {
        let root = Root(std::env::temp_dir().join(format!("sgroot{}", std::process::id())));
        let r = &root.0;
        std::fs::create_dir_all(r.join("opt/cni/bin")).unwrap();
        std::fs::create_dir_all(r.join("usr/libexec/cni")).unwrap();
        let link = |at: &str, to: &str| std::os::unix::fs::symlink(to, r.join(at)).unwrap();
        // The host's own absolute link, a relative one, and a loop.
        link("abs", "/usr/libexec/cni");
        link("rel", "usr/libexec/cni");
        link("loop", "/loop");
        let at = |p: &str| under_host_root(r, Path::new(p));
        assert_eq!(at("/opt/cni/bin/"), Some(r.join("opt/cni/bin")));
        assert_eq!(at("/abs"), Some(r.join("usr/libexec/cni")));
        assert_eq!(at("/rel"), Some(r.join("usr/libexec/cni")));
        assert_eq!(at("/../../../opt/cni/bin"), Some(r.join("opt/cni/bin")));
        assert_eq!(at("/abs/../../../../opt"), Some(r.join("opt")));
        assert_eq!(at("/loop"), None);
        assert_eq!(at("/missing/bin"), None);
        assert_eq!(at("opt/cni/bin"), None);
    }
}
