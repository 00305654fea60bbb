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

enum Read {
    Network(Network),
    /// Not a network the runtime would load, and why (not an error: go-cni and ocicni
    /// agree on skipping it only when it parses).
    Broken(PathBuf, String),
}

/// The extensions libcni reads, for the callers that must not match a file of their own.
pub fn is_candidate(name: &str) -> bool {
    Path::new(name).extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e))
}

pub fn files(conf_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(conf_dir).map_err(|e| format!("cannot read the CNI config dir {}: {e}", conf_dir.display()))?;
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
    let name = doc.root.get("name").and_then(Json::as_str).map(str::to_string);
    if single {
        if doc.root.get("type").and_then(Json::as_str).is_none_or(str::is_empty) {
            return broken("has no \"type\": a plugin file needs one (a conflist must be named .conflist)".to_string());
        }
    } else {
        if name.is_none() {
            return broken("has no \"name\"".to_string());
        }
        match doc.root.get("plugins") {
            Some(Json::Array(plugins)) if !plugins.is_empty() => {
                if let Some(i) = plugins.iter().position(|p| p.get("type").and_then(Json::as_str).is_none_or(str::is_empty)) {
                    return broken(format!("plugin {i} has no \"type\""));
                }
            }
            _ => return broken("has no plugins".to_string()),
        }
    }
    let file = file.to_path_buf();
    Read::Network(Network { file, name: name.unwrap_or_default(), doc, bytes, single })
}

/// The network to install into: the one named `wanted`, or the only one there is. A file
/// that does not parse and sorts before it is an error: containerd stops at it, CRI-O skips
/// it, so which network a node runs would depend on the runtime.
pub fn find(conf_dir: &Path, wanted: Option<&str>) -> Result<Network, String> {
    let files = files(conf_dir)?;
    let mut broken: Vec<(PathBuf, String)> = Vec::new();
    let mut networks: Vec<Network> = Vec::new();
    for file in &files {
        match read(file) {
            Read::Network(net) => networks.push(net),
            Read::Broken(file, why) => broken.push((file, why)),
        }
    }
    let chosen = match wanted {
        Some(name) => match networks.iter().position(|n| n.name == name) {
            Some(i) => i,
            None => {
                let found: Vec<String> = networks.iter().map(|n| format!("{} ({})", n.name, file_name(&n.file))).collect();
                return Err(format!(
                    "no network named {name:?} in {}{}",
                    conf_dir.display(),
                    if found.is_empty() { String::new() } else { format!("; found: {}", found.join(", ")) }
                ));
            }
        },
        None => {
            let mut names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            match names.len() {
                0 => {
                    let why: Vec<String> = broken.iter().map(|(f, why)| format!("{} {why}", file_name(f))).collect();
                    return Err(format!(
                        "no CNI network in {} (a .conflist, .conf or .json the runtime would load){}",
                        conf_dir.display(),
                        if why.is_empty() { String::new() } else { format!(": {}", why.join("; ")) }
                    ));
                }
                1 => 0,
                _ => {
                    let found: Vec<String> = networks.iter().map(|n| format!("{} ({})", n.name, file_name(&n.file))).collect();
                    return Err(format!(
                        "several networks in {}: {}; give the one to guard with --network NAME (the runtime \
                         loads the first, {}, unless its own config names another)",
                        conf_dir.display(),
                        found.join(", "),
                        networks[0].name
                    ));
                }
            }
        }
    };
    let net = networks.swap_remove(chosen);
    if let Some((file, why)) = broken.iter().find(|(f, _)| *f < net.file) {
        return Err(format!(
            "{} {why}, and it sorts before {}: containerd would fail on it and CRI-O skip it; fix or remove it first",
            file.display(),
            file_name(&net.file)
        ));
    }
    Ok(net)
}

pub fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
