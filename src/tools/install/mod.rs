//! `--install` and `--uninstall`: put the guard into the network the runtime runs and take
//! it out again, leaving the primary's configuration as it was. Run by hand or by a
//! DaemonSet (`--watch`), never on a runtime's exec.
//!
//! Every run starts from the files as they are: it finds the network (`network`), computes
//! the list it wants (`edit`) and writes only what differs (`files`), so a second run writes
//! nothing and a run after the primary's installer rewrote its file puts the entry back.

mod edit;
mod files;
mod json;
mod network;
mod waiting;
mod watch;

use std::path::{Path, PathBuf};

pub use edit::{Entry, Mode};
use edit::DROPIN_FILE;
use files::{Keep, original_of};
use json::{Doc, Json};
use network::{Network, file_name};

pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";

#[derive(Debug, Clone)]
pub struct Options {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub network: Option<String>,
    pub mode: Mode,
    pub entry: Entry,
    pub watch: bool,
    pub remove_binary: bool,
    /// Leave delegate mode although deferred DELs wait.
    pub force: bool,
}

pub fn run_install(options: &Options) -> i32 {
    if options.watch {
        return watch::run(options);
    }
    report(install(options), "already installed: nothing changed")
}

pub fn run_uninstall(options: &Options) -> i32 {
    report(uninstall(options), "not installed: nothing changed")
}

fn report(outcome: Result<Vec<String>, String>, unchanged: &str) -> i32 {
    match outcome {
        Ok(done) if done.is_empty() => {
            println!("{unchanged}");
            0
        }
        Ok(done) => {
            done.iter().for_each(|line| println!("{line}"));
            0
        }
        Err(err) => {
            eprintln!("sandbox-guard: {err}; nothing written");
            1
        }
    }
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> String {
    let path = path.display().to_string();
    let what = what.to_string();
    move |e| format!("cannot {what} {path}: {e}")
}

/// Puts the guard in; what it changed, one line each (none: all was in place). Every check
/// that can refuse runs before the first write.
pub fn install(options: &Options) -> Result<Vec<String>, String> {
    let net = network::find(&options.conf_dir, options.network.as_deref())?;
    let dropin = options.conf_dir.join(&net.name).join(DROPIN_FILE);
    let mut done = Vec::new();
    waiting::refuse_leaving_delegate(&net, Some(options.mode), options.force, &mut done)?;
    if options.mode == Mode::Dropin {
        check_dropin(&net, &dropin)?;
        if files::install_binary(&options.bin_dir)? {
            done.push(format!("copied the binary to {}", options.bin_dir.join(edit::GUARD_TYPE).display()));
        }
        if edit::has_guard(&net.doc.root) {
            restore(&net, &edit::strip(&net.doc.root), &mut done)?;
        }
        let wanted = Doc::new(options.entry.json());
        let current = std::fs::read(&dropin).ok().and_then(|b| Doc::parse(&b).ok());
        if !current.is_some_and(|doc| doc.root.same_as(&wanted.root)) {
            let dir = dropin.parent().expect("a drop-in has a directory");
            std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
            files::write_atomic(&dropin, &wanted.render(), Keep::mode(0o644)).map_err(io_err("write", &dropin))?;
            done.push(format!("wrote the drop-in {} for network {}", dropin.display(), net.name));
        }
        return Ok(done);
    }

    let list = if net.single { edit::upconvert(&net.doc.root) } else { net.doc.root.clone() };
    let wanted = edit::insert(&edit::strip(&list), options.mode, &options.entry);
    let target = if net.single { net.file.with_extension("conflist") } else { net.file.clone() };
    if net.single {
        // Ours from an earlier conversion, or nobody's: anything else is not ours to replace.
        if let Ok(bytes) = std::fs::read(&target) {
            let ours = Doc::parse(&bytes).is_ok_and(|d| d.root.get("name") == wanted.get("name") && edit::has_guard(&d.root));
            if !ours {
                return Err(format!(
                    "{} must become {} to hold a list, and that file exists with other content",
                    file_name(&net.file),
                    file_name(&target)
                ));
            }
        }
    }
    if files::install_binary(&options.bin_dir)? {
        done.push(format!("copied the binary to {}", options.bin_dir.join(edit::GUARD_TYPE).display()));
    }
    if net.single || !wanted.same_as(&net.doc.root) {
        let keep = Keep::of(&net.file).map_err(io_err("read", &net.file))?;
        // The primary's own bytes, for --uninstall: kept each time the primary wrote them.
        if !edit::has_guard(&list) {
            let original = original_of(&net.file);
            files::write_atomic(&original, &net.bytes, keep).map_err(io_err("write", &original))?;
        }
        files::write_atomic(&target, &net.doc.with_root(wanted).render(), keep).map_err(io_err("write", &target))?;
        if net.single {
            // Only now: until the list is in place the runtime keeps reading the plugin.
            files::remove(&net.file).map_err(io_err("remove", &net.file))?;
            done.push(format!("converted {} into {} with sandbox-guard ({})", file_name(&net.file), target.display(), options.mode.name()));
        } else {
            done.push(format!("put sandbox-guard into {} ({})", target.display(), options.mode.name()));
        }
    }
    remove_dropin(&dropin, &mut done)?;
    Ok(done)
}

/// A drop-in runs only from a `.conflist` that lets libcni load drop-ins, and is the last of
/// them (the last plugin is the first on DEL).
fn check_dropin(net: &Network, dropin: &Path) -> Result<(), String> {
    if net.single {
        return Err(format!(
            "--mode dropin needs the network in a .conflist: runtimes do not add drop-ins to a single plugin such as {}; use --mode chained",
            file_name(&net.file)
        ));
    }
    let inlined_only = match net.doc.root.get("loadOnlyInlinedPlugins") {
        Some(Json::Bool(b)) => *b,
        Some(Json::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    };
    if inlined_only {
        return Err(format!("{} sets loadOnlyInlinedPlugins: libcni would ignore a drop-in; use --mode chained", file_name(&net.file)));
    }
    let dir = dropin.parent().expect("a drop-in has a directory");
    if let Ok(entries) = std::fs::read_dir(dir) {
        let after: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conf") && n.as_str() > DROPIN_FILE)
            .collect();
        if !after.is_empty() {
            return Err(format!(
                "{} holds drop-ins that sort after {DROPIN_FILE} ({}): the guard would not be the first plugin on DEL",
                dir.display(),
                after.join(", ")
            ));
        }
    }
    Ok(())
}

fn remove_dropin(dropin: &Path, done: &mut Vec<String>) -> Result<(), String> {
    if files::remove(dropin).map_err(io_err("remove", dropin))? {
        done.push(format!("removed the drop-in {}", dropin.display()));
        // Only an empty directory goes: the primary's own drop-ins stay.
        let _ = std::fs::remove_dir(dropin.parent().expect("a drop-in has a directory"));
    }
    Ok(())
}

/// Takes the guard out of every place it may be; the binary goes only when asked.
pub fn uninstall(options: &Options) -> Result<Vec<String>, String> {
    let net = network::find(&options.conf_dir, options.network.as_deref())?;
    let mut done = Vec::new();
    waiting::refuse_leaving_delegate(&net, None, options.force, &mut done)?;
    if !net.single && edit::has_guard(&net.doc.root) {
        restore(&net, &edit::strip(&net.doc.root), &mut done)?;
    }
    remove_dropin(&options.conf_dir.join(&net.name).join(DROPIN_FILE), &mut done)?;
    if options.remove_binary {
        let binary = options.bin_dir.join(edit::GUARD_TYPE);
        if files::remove(&binary).map_err(io_err("remove", &binary))? {
            done.push(format!("removed {}", binary.display()));
        }
    }
    Ok(done)
}

/// Writes the list without the guard: the primary's own bytes when the kept original says
/// the same (a converted plugin goes back to its own file), else the stripped list.
fn restore(net: &Network, stripped: &Json, done: &mut Vec<String>) -> Result<(), String> {
    let keep = Keep::of(&net.file).map_err(io_err("read", &net.file))?;
    let kept = |file: &Path| -> Option<Vec<u8>> {
        let bytes = std::fs::read(original_of(file)).ok()?;
        Doc::parse(&bytes).ok().map(|doc| (doc, bytes))
            .filter(|(doc, _)| {
                let list = if file == net.file { doc.root.clone() } else { edit::upconvert(&doc.root) };
                list.same_as(stripped)
            })
            .map(|(_, bytes)| bytes)
    };
    for single in [net.file.with_extension("conf"), net.file.with_extension("json")] {
        if single == net.file {
            continue;
        }
        if let Some(bytes) = kept(&single) {
            files::write_atomic(&single, &bytes, keep).map_err(io_err("write", &single))?;
            files::remove(&net.file).map_err(io_err("remove", &net.file))?;
            files::remove(&original_of(&single)).map_err(io_err("remove", &original_of(&single)))?;
            done.push(format!("restored {} and removed {}", single.display(), file_name(&net.file)));
            return Ok(());
        }
    }
    let bytes = kept(&net.file).unwrap_or_else(|| net.doc.with_root(stripped.clone()).render());
    files::write_atomic(&net.file, &bytes, keep).map_err(io_err("write", &net.file))?;
    files::remove(&original_of(&net.file)).map_err(io_err("remove", &original_of(&net.file)))?;
    done.push(format!("took sandbox-guard out of {}", net.file.display()));
    Ok(())
}
