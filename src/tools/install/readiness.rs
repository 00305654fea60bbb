//! `--install --check` against what the runtime loaded: where a runtime's socket answers,
//! ready means the network it uses for pods (its first, `eth0`) holds the guard in its
//! place (last, or wrapping the plugin whose DEL acts on the pod's name), at a cniVersion
//! the guard speaks, with the guard's binary the one found first in the dirs the runtime
//! searches. Where no socket answers, the files are read as before (`super::check`). Either
//! way the first line says which.

use std::path::{Path, PathBuf};

use super::{
    Failure, Options, Reason,
    edit::{DROPIN_FILE, GUARD_TYPE},
};
use crate::tools::runtime::{self, Loaded, Network};

/// Multus's types: the runtime runs multus, which reads the network it delegates to itself.
const MULTUS_TYPES: [&str; 2] = ["multus", "multus-shim"];

/// The source line, then the verdict.
pub fn check(options: &Options) -> (String, Result<Vec<String>, Failure>) {
    let sockets = sockets(options.runtime_socket.as_deref(), &options.host_root);
    match runtime::ask(&sockets) {
        Ok(Loaded::Containerd {
            socket,
            conf_dir,
            plugin_dirs,
            networks,
            load_error,
        }) => {
            let source = format!("source: containerd CRI status ({})", socket.display());
            let dirs: Vec<PathBuf> = plugin_dirs
                .iter()
                .map(|d| on_host(&options.host_root, d))
                .collect();
            let conf_dir = on_host(&options.host_root, &conf_dir);
            let verdict = match networks.first() {
                None => Err(Failure::new(
                    Reason::Network,
                    format!(
                        "containerd has loaded no network from {}{}",
                        conf_dir.display(),
                        load_error
                            .map(|e| format!(" (its last load: {e})"))
                            .unwrap_or_default()
                    ),
                )),
                Some(net) if net.plugins.iter().any(|p| MULTUS_TYPES.contains(&p.kind.as_str())) => {
                    // Multus reads the cluster network from the conf dir on each ADD.
                    let through = Options {
                        conf_dir: conf_dir.clone(),
                        bin_dir: first_holding(&options.host_root, &dirs, GUARD_TYPE)
                            .unwrap_or_else(|| options.bin_dir.clone()),
                        platform: None,
                        runtime_socket: Some(PathBuf::from("none")),
                        ..options.clone()
                    };
                    super::check(&through).map(|mut lines| {
                        lines.insert(0, format!("containerd loaded multus (network {}); the network multus hands pods to was read from {}", net.name, conf_dir.display()));
                        lines
                    })
                }
                Some(net) => loaded_verdict(&options.host_root, net, &dirs, "containerd", true).map(|mut lines| {
                    if let Some(e) = load_error {
                        lines.push(format!("warning: containerd's last CNI config load failed ({e}): it runs what it loaded before"));
                    }
                    if conf_dir != options.conf_dir {
                        lines.push(format!(
                            "note: containerd reads {}, not {}",
                            conf_dir.display(),
                            options.conf_dir.display()
                        ));
                    }
                    lines
                }),
            };
            (source, verdict)
        }
        Ok(Loaded::Crio {
            socket,
            network,
            version,
        }) => {
            let source = format!(
                "source: CRI-O config (GET /config on {}), its network read from its files",
                socket.display()
            );
            let dirs: Vec<PathBuf> = network
                .plugin_dirs
                .iter()
                .map(|d| on_host(&options.host_root, d))
                .collect();
            let Some(bin_dir) = first_holding(&options.host_root, &dirs, GUARD_TYPE) else {
                return (source, Err(not_in_dirs(&dirs, "CRI-O")));
            };
            let as_crio = Options {
                conf_dir: on_host(&options.host_root, &network.conf_dir),
                bin_dir,
                platform: None,
                runtime_socket: Some(PathBuf::from("none")),
                network: network.default_network.clone().or(options.network.clone()),
                ..options.clone()
            };
            (source, crio_verdict(&as_crio, &dirs, &version))
        }
        // Not asked again: the files' check goes by --bin-dir or the platform's dir.
        Err(why) if why.is_empty() => (
            "source: files (--runtime-socket none)".to_string(),
            super::check(options),
        ),
        Err(why) => (
            format!("source: files ({})", why.join("; ")),
            super::check(&Options {
                runtime_socket: Some(PathBuf::from("none")),
                ..options.clone()
            }),
        ),
    }
}

/// CRI-O's network as the files give it, judged against every dir CRI-O searches (a
/// primary and the guard may sit in different ones). The guard's drop-in counts where
/// CRI-O's version loads drop-ins (`crio_loads_dropins`), appended as libcni appends them;
/// a network without the guard at all gets the file check and its reasons.
fn crio_verdict(
    as_crio: &Options,
    dirs: &[PathBuf],
    version: &Result<String, String>,
) -> Result<Vec<String>, Failure> {
    let found = super::network::find(
        &as_crio.conf_dir,
        as_crio.network.as_deref(),
        &as_crio.host_root,
    );
    let Some(found) = found.ok().filter(|f| f.runtime_runs_it) else {
        return super::check(as_crio);
    };
    let list = found.net.list();
    let mut plugins = super::edit::plugins(&list).to_vec();
    let mut notes = found.notes.clone();
    if !super::edit::has_guard(&list) {
        let conf_dir = found.net.file.parent().unwrap_or(&as_crio.conf_dir);
        let dropin = conf_dir.join(&found.net.name).join(DROPIN_FILE);
        // Through multus, multus's own libcni reads the drop-ins, whatever CRI-O's version.
        if !dropin.is_file() || found.via_multus.is_some() {
            return super::check(as_crio);
        }
        plugins.extend(crio_dropins(&found.net, &dropin, version)?);
        notes.push(format!(
            "CRI-O {} loads drop-ins (libcni 1.3): network {} read with {}",
            version.as_deref().unwrap_or_default(),
            found.net.name,
            dropin.display()
        ));
    }
    let net = Network {
        name: found.net.name.clone(),
        cni_version: super::network::version(&found.net),
        plugins: plugins
            .iter()
            .map(|p| runtime::Plugin {
                kind: p
                    .get("type")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_string(),
                conf: p.to_value(),
            })
            .collect(),
    };
    let mut lines = loaded_verdict(&as_crio.host_root, &net, dirs, "CRI-O", true)?;
    // Multus runs the network with its own search: its binDir first (thick: alone).
    let this = super::files::plugin_bytes()?;
    let bin_dir = super::network::host_dir(&as_crio.host_root, &as_crio.bin_dir);
    super::multus_bin_dir_ready(as_crio, &found, &bin_dir, &this)?;
    lines.splice(0..0, notes);
    Ok(lines)
}

/// CRI-O took libcni 1.3, which appends `<conf dir>/<network>/*.conf` to a `.conflist`'s
/// plugins, in 1.33.0 (its go.mod: containernetworking/cni v1.2.3 through 1.32.x, v1.3.0 from
/// 1.33.0). `None` for a version that does not read as `major.minor`.
fn crio_loads_dropins(version: &str) -> Option<bool> {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split(['.', '-', '+']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= (1, 33))
}

/// The drop-ins of `net` as CRI-O's libcni appends them (every `.conf` of the dir, by name),
/// or why CRI-O runs the network without the guard's `dropin`.
fn crio_dropins(
    net: &super::network::Network,
    dropin: &Path,
    version: &Result<String, String>,
) -> Result<Vec<super::json::Json>, Failure> {
    let unguarded = |why: String| {
        Failure::new(
            Reason::Network,
            format!(
                "sandbox-guard is only in the drop-in {}, and {why}: CRI-O runs network {} without it; use --mode \
                 chained or delegate",
                dropin.display(),
                net.name
            ),
        )
    };
    match version.as_deref().map(crio_loads_dropins) {
        Ok(Some(true)) => {}
        Ok(Some(false)) => {
            return Err(unguarded(format!(
                "CRI-O {} loads no drop-ins (libcni 1.3 came with CRI-O 1.33)",
                crate::names::shorten(version.as_deref().unwrap_or_default())
            )));
        }
        Ok(None) => {
            return Err(unguarded(format!(
                "CRI-O's version {:?} does not say whether it loads drop-ins (CRI-O 1.33+ does)",
                crate::names::shorten(version.as_deref().unwrap_or_default())
            )));
        }
        Err(why) => {
            return Err(unguarded(format!(
                "CRI-O did not say its version ({why}), which decides whether it loads drop-ins (1.33+ does)"
            )));
        }
    }
    // A single-plugin file, loadOnlyInlinedPlugins, a drop-in after the guard's.
    super::check_dropin(net, dropin)?;
    let dir = dropin.parent().expect("a drop-in has a directory");
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| {
            Failure::new(
                Reason::Network,
                format!("cannot read {}: {e}", dir.display()),
            )
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|file| {
            std::fs::read(file)
                .map_err(|e| e.to_string())
                .and_then(|b| super::json::Doc::parse(&b).map_err(|e| e.to_string()))
                .map(|doc| doc.root)
                .map_err(|e| {
                    Failure::new(
                        Reason::Entry,
                        format!(
                            "the drop-in {} does not parse: {e}: CRI-O fails every ADD",
                            file.display()
                        ),
                    )
                })
        })
        .collect()
}

/// `--runtime-socket` (`none`: no socket), else the runtimes' usual sockets under the
/// host's root.
pub fn sockets(given: Option<&Path>, host_root: &Path) -> Vec<PathBuf> {
    match given {
        Some(socket) if socket.as_os_str() == "none" => Vec::new(),
        Some(socket) => vec![socket.to_path_buf()],
        None => runtime::DEFAULT_SOCKETS
            .iter()
            .map(|s| on_host(host_root, Path::new(s)))
            .collect(),
    }
}

/// A path the runtime gave (the host's), as seen from here.
pub fn on_host(host_root: &Path, path: &Path) -> PathBuf {
    host_root.join(path.strip_prefix("/").unwrap_or(path))
}

/// libcni's `FindInPath`: the first dir holding the plugin is the one that runs. The dirs
/// are the host's seen under `host_root`, and so are their links' absolute targets (k3s's
/// `data/cni` holds nothing else).
fn first_holding(host_root: &Path, dirs: &[PathBuf], plugin: &str) -> Option<PathBuf> {
    dirs.iter()
        .find(|d| {
            let path = d.join(plugin);
            super::network::host_resolve(host_root, &path).is_file() || path.is_file()
        })
        .cloned()
}

fn not_in_dirs(dirs: &[PathBuf], runtime: &str) -> Failure {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Failure::new(
        Reason::BinDir,
        format!(
            "sandbox-guard is in none of the dirs {runtime} searches for plugins ({}): every ADD would fail \
             \"failed to find plugin\"; give the runtime's dir with --bin-dir or --platform",
            dirs.join(", ")
        ),
    )
}

/// The verdict on the network the runtime uses for pods.
/// `this_binary`: the one found must be the plugin this installer ships (the installer's
/// probe; the doctor may be another version).
fn loaded_verdict(
    host_root: &Path,
    net: &Network,
    dirs: &[PathBuf],
    runtime: &str,
    this_binary: bool,
) -> Result<Vec<String>, Failure> {
    let types: Vec<&str> = net.plugins.iter().map(|p| p.kind.as_str()).collect();
    let not_placed = |why: String| {
        Failure::new(
            Reason::Network,
            format!(
                "{runtime} runs network {} with plugins {}: {why}",
                net.name,
                types.join(", ")
            ),
        )
    };
    let last = net.plugins.len().saturating_sub(1);
    let place = match net.plugins.iter().position(|p| p.kind == GUARD_TYPE) {
        None => {
            return Err(not_placed(
                "sandbox-guard is not among them (a file naming it was not loaded: run --install, \
                 or wait for the runtime to reload its conf dir)"
                    .to_string(),
            ));
        }
        Some(i) if net.plugins[i].conf["delegate"]["type"].is_string() => {
            let primary = net.plugins[i].conf["delegate"]["type"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let chain = serde_json::json!({
                "plugins": net.plugins.iter().map(|p| p.conf.clone()).collect::<Vec<_>>()
            });
            if let Some((_, target)) = crate::tools::primaries::misplaced_wrapper(&chain) {
                return Err(not_placed(format!(
                    "sandbox-guard wraps {primary}, but {target}'s DEL, which acts on the pod's name, runs before it \
                     and unheld: run --install to wrap {target}"
                )));
            }
            format!("delegate, wrapping {primary}")
        }
        Some(i) if i == last && i > 0 => "chained, last".to_string(),
        Some(_) => {
            return Err(not_placed(
                "sandbox-guard is neither the last plugin (chained: first on DEL) nor wrapping a plugin \
                 (delegate): run --install to put it back in its place"
                    .to_string(),
            ));
        }
    };
    if !crate::cni::version::SUPPORTED.contains(&net.cni_version.as_str()) {
        return Err(Failure::new(
            Reason::Version,
            format!(
                "{runtime} runs network {} at cniVersion {}, which sandbox-guard does not speak ({}): every ADD would fail",
                net.name,
                crate::names::shorten(&net.cni_version),
                crate::cni::version::SUPPORTED.join(", ")
            ),
        ));
    }
    if let Some(problem) = loaded_entry_problem(net) {
        return Err(Failure::new(
            Reason::Entry,
            format!(
                "{runtime} runs network {}, and {problem}: every ADD fails",
                net.name
            ),
        ));
    }
    let Some(dir) = first_holding(host_root, dirs, GUARD_TYPE) else {
        return Err(not_in_dirs(dirs, runtime));
    };
    // Every binary the runtime execs for the network: the plugins, a wrapped or delegated
    // plugin, and their IPAM plugins.
    let mut wanted: Vec<&str> = types.clone();
    for conf in net.plugins.iter().map(|p| &p.conf) {
        let delegate = conf.get("delegate");
        wanted.extend(delegate.and_then(|d| d.get("type")?.as_str()));
        for ipam in [Some(conf), delegate].into_iter().flatten() {
            wanted.extend(ipam.get("ipam").and_then(|i| i.get("type")?.as_str()));
        }
    }
    let mut missing: Vec<&str> = Vec::new();
    for plugin in wanted {
        if !missing.contains(&plugin) && first_holding(host_root, dirs, plugin).is_none() {
            missing.push(plugin);
        }
    }
    if !missing.is_empty() {
        return Err(Failure::new(
            Reason::BinDir,
            format!(
                "{runtime} runs network {} but cannot find its plugins {} in the dirs it searches: every ADD would fail",
                net.name,
                missing.join(", ")
            ),
        ));
    }
    let binary = dir.join(GUARD_TYPE);
    let found = super::network::host_resolve(host_root, &binary);
    let this = match this_binary {
        true => Some(super::files::plugin_bytes()?),
        false => None,
    };
    if this.is_some_and(|this| {
        !std::fs::read(&found).is_ok_and(|there| there == this)
            && !std::fs::read(&binary).is_ok_and(|there| there == this)
    }) {
        return Err(Failure::new(
            Reason::BinDir,
            format!(
                "{} is the sandbox-guard the runtime finds first, and it is not this version",
                binary.display()
            ),
        ));
    }
    Ok(vec![format!(
        "ready: {runtime} runs sandbox-guard in network {} ({place}), cniVersion {}, binary {}",
        net.name,
        net.cni_version,
        binary.display()
    )])
}

/// For `--doctor`, beside its look at the files: where containerd answers on one of
/// `sockets`, whether the network it runs for pods runs the guard (the line to show), or
/// why not with the way out. `None` when no containerd answers or it runs multus (whose
/// cluster network the doctor reads from the files).
pub fn runtime_view(sockets: &[PathBuf]) -> Option<Result<String, (String, &'static str)>> {
    let Ok(Loaded::Containerd {
        socket,
        plugin_dirs,
        networks,
        load_error,
        ..
    }) = runtime::ask(sockets)
    else {
        return None;
    };
    let way_out = "run sandbox-guard --install --check: it says what containerd runs and why the guard is not ready there";
    let Some(net) = networks.first() else {
        return Some(Err((
            format!(
                "containerd ({}) has loaded no CNI network{}",
                socket.display(),
                load_error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
            way_out,
        )));
    };
    if net
        .plugins
        .iter()
        .any(|p| MULTUS_TYPES.contains(&p.kind.as_str()))
    {
        return None;
    }
    let said = |msg: &str| format!("per containerd's CRI status ({}): {msg}", socket.display());
    Some(
        loaded_verdict(Path::new("/"), net, &plugin_dirs, "containerd", false)
            .map(|lines| said(&lines.join("; ")))
            .map_err(|failure| (said(&failure.msg), way_out)),
    )
}

/// Why the plugin would reject the guard's entry as the runtime loaded it, parsed by the
/// plugin's own parser (`edit::entry_problem`).
fn loaded_entry_problem(net: &Network) -> Option<String> {
    let entry = net.plugins.iter().find(|p| p.kind == GUARD_TYPE)?;
    let list = serde_json::json!({
        "cniVersion": net.cni_version,
        "name": net.name,
        "plugins": [entry.conf],
    });
    let list: super::json::Json = serde_json::from_value(list).ok()?;
    super::edit::entry_problem(&list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::runtime::Plugin;
    use serde_json::json;

    fn net(version: &str, plugins: &[serde_json::Value]) -> Network {
        Network {
            name: "pods".to_string(),
            cni_version: version.to_string(),
            plugins: plugins
                .iter()
                .map(|p| Plugin {
                    kind: p["type"].as_str().unwrap_or_default().to_string(),
                    conf: p.clone(),
                })
                .collect(),
        }
    }

    /// Plugin dirs: the first empty, the second holding `plugins`.
    fn dirs(name: &str, plugins: &[&str]) -> Vec<PathBuf> {
        let root = std::env::temp_dir().join(format!("sg-readiness-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (empty, full) = (root.join("empty"), root.join("full"));
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::create_dir_all(&full).unwrap();
        for plugin in plugins {
            std::fs::write(full.join(plugin), b"").unwrap();
        }
        vec![empty, full]
    }

    fn verdict(net: &Network, dirs: &[PathBuf]) -> Result<String, String> {
        loaded_verdict(Path::new("/"), net, dirs, "containerd", false)
            .map(|lines| lines.join("\n"))
            .map_err(|f| f.msg)
    }

    #[test]
    fn an_entry_the_plugin_rejects_is_not_ready() {
        let all = dirs("entry", &["bridge", GUARD_TYPE]);
        let bridge = json!({"type": "bridge"});
        for guard in [
            json!({"type": GUARD_TYPE, "staleDel": "Audit"}),
            json!({"type": GUARD_TYPE, "delegate": {"type": "bridge"}, "podLockTimeoutSeconds": 10}),
        ] {
            let plugins = if guard.get("delegate").is_some() {
                vec![guard.clone()]
            } else {
                vec![bridge.clone(), guard.clone()]
            };
            let err = verdict(&net("1.0.0", &plugins), &all).unwrap_err();
            assert!(
                err.contains("staleDel") || err.contains("podLockTimeoutSeconds"),
                "{err}"
            );
        }
        let _ = std::fs::remove_dir_all(all[0].parent().unwrap());
    }

    #[test]
    fn placement_version_and_dirs() {
        let all = dirs("all", &["bridge", "portmap", GUARD_TYPE]);
        let bridge = json!({"type": "bridge"});
        let guard = json!({"type": GUARD_TYPE});
        let wrapped = json!({"type": GUARD_TYPE, "delegate": {"type": "bridge"}});
        let portmap = json!({"type": "portmap"});

        let ok = verdict(&net("1.0.0", &[bridge.clone(), guard.clone()]), &all).unwrap();
        assert!(
            ok.contains("(chained, last)") && ok.contains("full/sandbox-guard"),
            "{ok}"
        );
        let ok = verdict(&net("0.3.1", &[wrapped.clone(), portmap.clone()]), &all).unwrap();
        assert!(ok.contains("delegate, wrapping bridge"), "{ok}");

        for (plugins, says) in [
            (vec![bridge.clone()], "not among them"),
            (vec![guard.clone()], "neither the last plugin"),
            (
                vec![bridge.clone(), guard.clone(), portmap.clone()],
                "neither the last plugin",
            ),
            // A wrapper runs its plugin wherever it stands (after cilium-cni's primary too).
            (
                vec![portmap.clone(), wrapped.clone()],
                "delegate, wrapping bridge",
            ),
        ] {
            match verdict(&net("1.0.0", &plugins), &all) {
                Err(msg) => assert!(msg.contains(says), "{plugins:?}: {msg}"),
                Ok(line) => assert!(line.contains(says), "{plugins:?}: {line}"),
            }
        }
        let err = verdict(&net("2.0.0", &[bridge.clone(), guard.clone()]), &all).unwrap_err();
        assert!(err.contains("cniVersion 2.0.0"), "{err}");

        let no_guard = dirs("noguard", &["bridge"]);
        let err = verdict(&net("1.0.0", &[bridge.clone(), guard.clone()]), &no_guard).unwrap_err();
        assert!(
            err.contains("in none of the dirs containerd searches"),
            "{err}"
        );
        let no_ipam = dirs("noipam", &["bridge", GUARD_TYPE]);
        let with_ipam = json!({"type": GUARD_TYPE,
            "delegate": {"type": "bridge", "ipam": {"type": "host-local"}}});
        let err = verdict(&net("1.0.0", std::slice::from_ref(&with_ipam)), &no_ipam).unwrap_err();
        assert!(err.contains("cannot find its plugins host-local"), "{err}");
        let _ = std::fs::remove_dir_all(no_ipam[0].parent().unwrap());
        let no_primary = dirs("noprimary", &[GUARD_TYPE]);
        let err = verdict(&net("1.0.0", std::slice::from_ref(&wrapped)), &no_primary).unwrap_err();
        assert!(err.contains("cannot find its plugins bridge"), "{err}");
        for d in [all, no_guard, no_primary] {
            let _ = std::fs::remove_dir_all(d[0].parent().unwrap());
        }
    }

    #[test]
    fn crio_loads_dropins_from_1_33() {
        for (version, loads) in [
            ("1.33.0", Some(true)),
            ("1.34.2-dev", Some(true)),
            ("v2.0.0", Some(true)),
            ("1.32.13", Some(false)),
            ("1.9.10", Some(false)),
            ("", None),
            ("unknown", None),
        ] {
            assert_eq!(crio_loads_dropins(version), loads, "{version}");
        }
    }

    #[test]
    fn sockets_under_the_host_root() {
        let host = Path::new("/host");
        assert_eq!(
            sockets(None, host)[0],
            PathBuf::from("/host/run/containerd/containerd.sock")
        );
        assert!(sockets(Some(Path::new("none")), host).is_empty());
        assert_eq!(
            sockets(Some(Path::new("/x.sock")), host),
            [PathBuf::from("/x.sock")]
        );
    }
}
