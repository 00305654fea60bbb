//! `--install` and `--uninstall`: put the guard into the network the runtime runs and take
//! it out again, leaving the primary's configuration as it was. Run by hand or by a
//! DaemonSet (`--watch`), never on a runtime's exec.
//!
//! Every run starts from the files as they are: it finds the network (`network`), computes
//! the list it wants (`edit`) and writes only what differs (`files`), so a second run writes
//! nothing and a run after the primary's installer rewrote its file puts the entry back.

mod api_access;
mod bin_dirs;
mod edit;
mod files;
mod handover;
mod json;
mod leftovers;
mod metrics;
mod network;
mod platform;
mod readiness;
mod waiting;
mod watch;

use std::path::{Path, PathBuf};

pub use api_access::ApiAccess;
use api_access::TurnedOff;
use bin_dirs::BinDirs;
use edit::DROPIN_FILE;
pub use edit::{Entry, Mode, entry_keys};
use files::{Expect, Keep, original_of};
use json::{Doc, Json};
use network::{Found, Network, file_name};
pub use platform::Platform;
pub use readiness::{runtime_view, sockets as runtime_sockets};

#[derive(Debug, Clone)]
pub struct Options {
    pub conf_dir: PathBuf,
    /// `--bin-dir`, else the platform's as it was at the start. Where the runtime answers,
    /// its own dirs win (`bin_dirs`).
    pub bin_dir: PathBuf,
    /// The platform whose bin dir is looked up again on every look (no `--bin-dir` given):
    /// k3s's moves with each release.
    pub platform: Option<Platform>,
    /// Where the host's `/` is (`/host` in the DaemonSet): multus's paths are the host's.
    pub host_root: PathBuf,
    pub network: Option<String>,
    pub mode: Mode,
    pub entry: Entry,
    pub watch: bool,
    pub remove_binary: bool,
    /// Leave delegate mode although deferred DELs wait.
    pub force: bool,
    /// Only look (`--check`): exit 0 when the guard is in place and can run.
    pub check: bool,
    /// The installer's own textfile for node_exporter (`--metrics-file`).
    pub metrics_file: Option<PathBuf>,
    /// The runtime's socket to ask where it looks for plugins and what it loaded (`none`:
    /// only the files), else the usual ones under the host root.
    pub runtime_socket: Option<PathBuf>,
    /// `--api-credentials`: the plugin's kubeconfig is written from this ServiceAccount.
    pub api_access: Option<ApiAccess>,
}

/// The entry's `kubeconfig` key for the file `--api-credentials` writes, named as the host
/// (where the runtime runs the plugin) sees it.
pub fn kubeconfig_entry_key(conf_dir: &Path, host_root: &Path) -> (String, Json) {
    let on_host = match conf_dir.strip_prefix(host_root) {
        Ok(rest) => Path::new("/").join(rest),
        Err(_) => conf_dir.to_path_buf(),
    };
    let path = api_access::kubeconfig_path(&on_host);
    (
        "kubeconfig".to_string(),
        Json::String(path.to_string_lossy().into_owned()),
    )
}

/// The entry's `nodeName` key (`--node-name`).
pub fn node_name_entry_key(name: String) -> (String, Json) {
    ("nodeName".to_string(), Json::String(name))
}

/// Writes the plugin's kubeconfig where `--api-credentials` asks for one: before the entry
/// that names it. A failure is said, never a reason to leave the node unguarded: without the
/// file the plugin decides by its local rule and logs each DEL it could not ask about.
/// Answers whether the kubeconfig is current, or `None` when none is asked for.
fn refresh_api_access(options: &Options, say: &mut dyn FnMut(String)) -> Option<bool> {
    let access = options.api_access.as_ref()?;
    match api_access::refresh(access, &options.conf_dir) {
        Ok(Some(line)) => say(line),
        Ok(None) => {}
        Err(why) => {
            say(format!(
                "warning: the plugin's kubeconfig cannot be written: {why}; until it is, the plugin decides by its local rule alone"
            ));
            // The view is asked for: an off sign left from before must not release the DELs
            // held with the file while it cannot be written. Gone, they stay held.
            let path = api_access::kubeconfig_path(&options.conf_dir);
            if crate::state::held::held_with_at(&path) == crate::state::held::HeldWith::TurnedOff
                && files::remove(&path).is_ok_and(|removed| removed)
            {
                say(format!(
                    "removed the off sign {}: DELs held with it stay held until the kubeconfig is written",
                    path.display()
                ));
            }
            return Some(false);
        }
    }
    Some(true)
}

/// Without `--api-credentials`, the kubeconfig an earlier install wrote is turned off
/// (`api_access::turn_off`) once no network file names it any more (`Entry::unset` took the
/// key out of the guard's entry). Left while any file names it: another guarded network,
/// multus's inlined copy, the operator's ConfigMap; and where this install does not unset
/// the key. Where the entry names a kubeconfig of the operator's instead, the file is removed
/// rather than turned off: the DELs held with it then ask with that one.
fn forget_api_access(options: &Options, installed: &Installed, say: &mut dyn FnMut(String)) {
    if options.api_access.is_some() || options.entry.unset.is_empty() {
        return;
    }
    if api_access::named_in(&options.conf_dir, &options.host_root, &[&installed.file]).is_some() {
        return;
    }
    let dir = options.conf_dir.display();
    // Only a path counts: `null` or "" is how a ConfigMap says none, as the plugin reads it.
    let another = installed
        .entry
        .as_ref()
        .and_then(|e| e.get("kubeconfig"))
        .and_then(|k| k.as_str())
        .filter(|k| !k.is_empty())
        .map(str::to_string);
    if let Some(another) = another {
        match api_access::remove(&options.conf_dir) {
            Ok(removed) if !removed.is_empty() => {
                removed.into_iter().for_each(&mut *say);
                say(format!(
                    "the entry names the kubeconfig {another}: DELs held with the one removed ask with it"
                ));
            }
            Ok(_) => {}
            Err(e) => say(format!(
                "warning: cannot remove the kubeconfig an earlier install wrote under {dir}: {e}"
            )),
        }
        return;
    }
    let held = held_with_the_kubeconfig(options, installed.entry.as_ref());
    let any_held = may_hold(held.as_deref());
    // Absent, the file is named by no inode: a network naming its path keeps it unwritten.
    if any_held && api_access::names_path(&options.conf_dir, &options.host_root, &[&installed.file])
    {
        return;
    }
    if any_held {
        turn_off_for(&options.conf_dir, held.as_deref(), say);
        return;
    }
    match api_access::turn_off(&options.conf_dir, false) {
        Ok(TurnedOff::Wrote(wrote)) => say(wrote),
        Ok(_) => {}
        Err(e) => say(format!(
            "warning: cannot turn off the kubeconfig an earlier install wrote under {dir}: {e}"
        )),
    }
}

/// Writes the off sign over the installer's kubeconfig for the DELs held with it (`held`:
/// their pods; `None`: the state dir could not be read), and says what follows for them.
fn turn_off_for(conf_dir: &Path, held: Option<&[String]>, say: &mut dyn FnMut(String)) {
    let whose = match held {
        Some(pods) => format!(
            "{} DELs were held with it ({})",
            pods.len(),
            pods.join(", ")
        ),
        None => "the state dir cannot be read, so DELs may be held with it".to_string(),
    };
    match api_access::turn_off(conf_dir, true) {
        Ok(TurnedOff::Wrote(wrote)) => {
            say(wrote);
            say(format!(
                "warning: {whose}: each now goes by the local rule (chained mode's at its next retry, delegate mode's at the \
                 node's next verb), which lets it free what the primary holds under the pod's name, though a pod of that name \
                 may live on another node"
            ));
        }
        // Already the sign (an earlier turn-off, or every look of the watch): nothing new.
        Ok(TurnedOff::Already) => {}
        Ok(TurnedOff::NothingThere | TurnedOff::CannotPlace) => say(format!(
            "warning: {whose}, and the off sign could not be put in place of {} (not a regular file): they stay held",
            conf_dir.display()
        )),
        Err(e) => say(format!(
            "warning: {whose}, and the kubeconfig under {} cannot be turned off: {e}; they stay held",
            conf_dir.display()
        )),
    }
}

/// Whether DELs may be held with the installer's kubeconfig: `held` (`held_with_the_kubeconfig`)
/// names some, or the state dir could not be read.
fn may_hold(held: Option<&[String]>) -> bool {
    held.is_none_or(|pods| !pods.is_empty())
}

/// The pods whose DELs are held for the API server's pod with the installer's kubeconfig
/// (delegate mode's deferred entries, chained mode's records), read from the guard's state
/// dir, the entry's own `stateDir` first; `None` where it cannot be read. Paths compare by
/// their components, so `//` or `/./` in either match.
fn held_with_the_kubeconfig(options: &Options, entry: Option<&Json>) -> Option<Vec<String>> {
    let (_, seen) = state_dir(options, entry);
    let (_, kubeconfig) = kubeconfig_entry_key(&options.conf_dir, &options.host_root);
    let kubeconfig = kubeconfig.as_str().unwrap_or_default().to_string();
    if crate::state::surely_absent(&seen) {
        return Some(Vec::new());
    }
    let ours = |held: Option<&crate::state::held::MovedTo>| {
        held.is_some_and(|moved| Path::new(&kubeconfig) == moved.kubeconfig)
    };
    let store = crate::state::Store::open_read_only(&seen).ok()?;
    let deferred = store
        .list_deferred()
        .ok()?
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            crate::state::Loaded::Valid(entry) if ours(entry.moved_to.as_ref()) => {
                Some(entry.key.pod())
            }
            _ => None,
        });
    let records = store.list_records().ok()?;
    let refused = records.into_iter().filter_map(|(_, loaded)| match loaded {
        crate::state::Loaded::Valid(record) if ours(record.held.as_ref()) => Some(
            crate::names::pod_text(record.pod_namespace.as_deref(), record.pod_name.as_deref()),
        ),
        _ => None,
    });
    Some(deferred.chain(refused).collect())
}

/// Why an install did not happen, as counted in the installer's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// No network, a broken file before it, a name not found, multus's target not found.
    Network,
    /// A cniVersion the plugin does not speak.
    Version,
    /// None of the network's plugins in the bin dir: the runtime looks elsewhere.
    BinDir,
    /// A file in the way, a drop-in the network cannot load.
    Conflict,
    /// The primary kept writing the file while it was being replaced.
    Changing,
    /// A file owner that reverts each insert.
    Fight,
    /// An entry key the plugin would reject.
    Entry,
    Io,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Network => "network",
            Reason::Version => "version",
            Reason::BinDir => "bin-dir",
            Reason::Conflict => "conflict",
            Reason::Changing => "changing",
            Reason::Fight => "fight",
            Reason::Entry => "entry",
            Reason::Io => "io",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub msg: String,
    /// The guard cannot run in its network as the node is now (a version it does not speak,
    /// a binDir multus runs it from that it cannot be put in): it must not stay named there.
    guard_cannot_run: bool,
    /// What was written all the same: the guard taken out of its network (`stand_aside`).
    pub done: Vec<String>,
}

impl Failure {
    fn new(reason: Reason, msg: impl Into<String>) -> Failure {
        Failure {
            reason,
            msg: msg.into(),
            guard_cannot_run: false,
            done: Vec::new(),
        }
    }

    fn guard_cannot_run(mut self) -> Failure {
        self.guard_cannot_run = true;
        self
    }
}

impl From<String> for Failure {
    fn from(msg: String) -> Failure {
        Failure::new(Reason::Io, msg)
    }
}

/// What one install did.
#[derive(Debug, Default)]
pub struct Installed {
    /// What it changed, one line each (none: all was in place).
    pub done: Vec<String>,
    /// What the operator should know (which network, and why), said on every run.
    pub notes: Vec<String>,
    pub warnings: Vec<String>,
    /// The file that holds the guard (the network's list, or the drop-in).
    pub file: PathBuf,
    /// The network's list without the guard, as the primary had it: the watch compares the
    /// next one with it to tell a file owner reverting the insert from an upgrade.
    pub primary_list: Option<Json>,
    /// The entry as it is now: the watch puts the operator's keys back from it.
    pub entry: Option<Json>,
    /// Whether the network's primary needs the guard, per README's table.
    pub verdict: Option<crate::tools::primaries::Verdict>,
}

pub fn run_install(options: &Options) -> i32 {
    if options.watch {
        return watch::run(options);
    }
    if options.check {
        let (source, verdict) = readiness::check(options);
        println!("{source}");
        return match verdict {
            Ok(lines) => {
                lines.iter().for_each(|line| println!("{line}"));
                0
            }
            Err(failure) => {
                println!("not ready: {}", failure.msg);
                1
            }
        };
    }
    // A running watch owns the entry's keys: a run by hand without --api-credentials leaves
    // the watch's kubeconfig and its key alone.
    let mut options = options.clone();
    if options.api_access.is_none()
        && !options.entry.unset.is_empty()
        && handover::watch_runs(&handover_dir(&options))
    {
        eprintln!(
            "sandbox-guard: a --watch runs for this node's plugins: it owns the entry's kubeconfig key, left as it is (turn the API server's view off in the DaemonSet's arguments)"
        );
        options.entry.unset.clear();
    }
    let options = &options;
    refresh_api_access(options, &mut |line| eprintln!("sandbox-guard: {line}"));
    if options.api_access.is_some() {
        eprintln!(
            "sandbox-guard: warning: without --watch nothing copies a renewed token into the plugin's kubeconfig: \
             once this one expires (or the pod it is bound to goes) the plugin decides by its local rule alone"
        );
    }
    match install_retrying(options, None) {
        Ok(installed) => {
            forget_api_access(options, &installed, &mut |line| {
                eprintln!("sandbox-guard: {line}")
            });
            installed
                .notes
                .iter()
                .for_each(|line| eprintln!("sandbox-guard: {line}"));
            installed
                .warnings
                .iter()
                .for_each(|line| eprintln!("sandbox-guard: warning: {line}"));
            report(Ok(installed.done), "already installed: nothing changed")
        }
        Err(failure) if !failure.done.is_empty() => {
            failure.done.iter().for_each(|line| println!("{line}"));
            eprintln!("sandbox-guard: {}", failure.msg);
            1
        }
        Err(failure) => report(Err(failure.msg), ""),
    }
}

/// Where the watches' lock lives, one place for the life of a node: the bin dir as given or
/// as the platform had it at the start, but k3s's data dir, whose release dirs come and go
/// (an uninstall after an upgrade must find the lock the watch took before it).
fn handover_dir(options: &Options) -> PathBuf {
    match options.platform.map(|p| p.resolve(&options.host_root)) {
        Some(Platform::K3s) => platform::k3s_data(&options.host_root),
        _ => options.bin_dir.clone(),
    }
}

pub fn run_uninstall(options: &Options) -> i32 {
    let outcome = if options.conf_dir.is_dir() {
        handover::while_no_watch_runs(&options.conf_dir, &handover_dir(options), || {
            uninstall(options)
        })
    } else {
        uninstall(options)
    };
    report(outcome, "not installed: nothing changed")
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

/// How many times an install starts over because the primary wrote again meanwhile.
const ATTEMPTS: usize = 5;

/// `install`, started over while the primary keeps writing the file under it. A refusal
/// that means the guard cannot run where its network names it takes it out (`stand_aside`).
pub fn install_retrying(
    options: &Options,
    remembered: Option<&Json>,
) -> Result<Installed, Failure> {
    let mut outcome = install(options, remembered);
    for _ in 1..ATTEMPTS {
        match outcome {
            Err(ref failure) if failure.reason == Reason::Changing => {
                outcome = install(options, remembered);
            }
            _ => break,
        }
    }
    outcome.map_err(|mut failure| {
        if failure.guard_cannot_run {
            match stand_aside(options) {
                Ok(done) => failure.done = done,
                Err(e) => {
                    failure.msg = format!(
                        "{}; and it cannot be taken out of its network: {e}",
                        failure.msg
                    );
                }
            }
        }
        failure
    })
}

/// Takes the guard out of the network it cannot run in: the runtime (or multus) would fail
/// every pod's ADD on it, and pods that start unguarded are the node as it was without the
/// guard. Delegate mode's deferred DELs stay in the store, for its return.
fn stand_aside(options: &Options) -> Result<Vec<String>, String> {
    let found = network::find(
        &options.conf_dir,
        options.network.as_deref(),
        &options.host_root,
    )?;
    let net = &found.net;
    let mut done = Vec::new();
    if edit::has_guard(&net.list()) {
        let _replays = waiting::refuse_leaving_delegate(
            net,
            None,
            &options.host_root,
            Some("standing aside"),
            &mut done,
        )?;
        restore_current(net, found.named_by.as_deref(), &mut done)?;
    }
    remove_dropin(
        &options.conf_dir.join(&net.name).join(DROPIN_FILE),
        &mut done,
    )?;
    if !done.is_empty() {
        done.push(format!(
            "pods of network {} start unguarded until sandbox-guard can run there",
            net.name
        ));
    }
    Ok(done)
}

fn changed(file: &Path) -> Failure {
    Failure::new(
        Reason::Changing,
        format!(
            "{} changed while it was being replaced: another writer is at work; run again once it settles",
            file.display()
        ),
    )
}

/// The network the guard goes into and the dirs its runtime searches, refused when the
/// guard could not run there: a cniVersion it does not speak (every ADD would fail), a
/// runtime's dir it cannot be put in, or dirs that hold none of the network's plugins (the
/// runtime looks for plugins elsewhere: the guard would not be found).
pub fn runnable(options: &Options) -> Result<(Found, BinDirs), Failure> {
    let found = network::find(
        &options.conf_dir,
        options.network.as_deref(),
        &options.host_root,
    )
    .map_err(|msg| Failure::new(Reason::Network, msg))?;
    let net = &found.net;
    let version = network::version(net);
    // A config without cniVersion is 0.1.0 to the runtime (network::version).
    if !crate::cni::version::SUPPORTED.contains(&version.as_str()) {
        return Err(Failure::new(
            Reason::Version,
            format!(
                "network {} in {} is at cniVersion {}, which sandbox-guard does not speak ({}): every ADD on the node \
                 would fail; leave this network unguarded, or raise its cniVersion in the primary's own config first",
                net.name,
                file_name(&net.file),
                crate::names::shorten(&version),
                crate::cni::version::SUPPORTED.join(", ")
            ),
        )
        .guard_cannot_run());
    }
    let dirs = bin_dirs::locate(options, &found)?;
    if let Some(failure) = bin_dirs::missing_failure(options, &dirs, &found) {
        return Err(failure);
    }
    Ok((found, dirs))
}

/// Puts the guard in. Every check that can refuse runs before the first write; each write
/// of the network's file renames only if the file still holds what was read (else it
/// answers `Reason::Changing`, and `install_retrying` starts over from the new content).
/// `remembered`: the entry the watch saw last, whose keys come back after a primary's
/// rewrite dropped it.
pub fn install(options: &Options, remembered: Option<&Json>) -> Result<Installed, Failure> {
    let (found, dirs) = runnable(options)?;
    let (name, list) = (found.net.name.clone(), found.net.list().to_value());
    let mut out = put_in(options, remembered, found, &dirs)?;
    // After the writes: a primary's binary that is slow to say its version never holds the
    // guard's return back.
    let resolved: Vec<PathBuf> = dirs
        .searched
        .iter()
        .map(|d| network::host_dir(&options.host_root, d))
        .collect();
    let verdict = crate::tools::primaries::judge(&list, &resolved, &|p| {
        network::host_resolve(&options.host_root, p)
    });
    out.notes
        .push(format!("network {name}: {}", verdict.line()));
    use crate::tools::primaries::Need;
    let chosen = match options.mode {
        Mode::Delegate => "delegate",
        Mode::Chained | Mode::Dropin => "chained",
    };
    match (verdict.need, verdict.mode) {
        (Need::NotNeeded, _) => out.warnings.push(format!(
            "{} does not need sandbox-guard ({}), and {} mode only costs here: {}",
            verdict.primary,
            verdict.why,
            options.mode.name(),
            primary_cost(options.mode)
        )),
        // Chained, last, holds every plugin's DEL: it protects, at its cost.
        (Need::Needed, Some("delegate")) if chosen == "chained" => out.notes.push(format!(
            "{} needs sandbox-guard ({}): chained mode holds that DEL, but {}; delegate mode does not",
            verdict.primary,
            verdict.why,
            primary_cost(options.mode)
        )),
        (Need::Needed, Some(mode)) if mode != chosen => out.warnings.push(format!(
            "{} needs sandbox-guard in {mode} mode: {}; run --install --mode {mode}",
            verdict.primary, verdict.why
        )),
        _ => {}
    }
    out.verdict = Some(verdict);
    Ok(out)
}

/// `install` up to the verdict: the checks, then the writes.
fn put_in(
    options: &Options,
    remembered: Option<&Json>,
    found: Found,
    dirs: &BinDirs,
) -> Result<Installed, Failure> {
    let multus_dir = multus_bin_dir(options, &found, &dirs.target)?;
    let Found {
        net,
        notes,
        warnings,
        via_multus,
        named_by,
        ..
    } = found;
    let dropin = options.conf_dir.join(&net.name).join(DROPIN_FILE);
    let dropin_doc = std::fs::read(&dropin)
        .ok()
        .and_then(|b| Doc::parse(&b).ok());
    let list = net.list();
    let current_entry =
        edit::guard_entry(&list).or_else(|| dropin_doc.as_ref().map(|d| d.root.clone()));
    let mut notes = notes;
    notes.extend(dirs.notes.iter().cloned());
    if dirs.asked {
        notes.push(format!(
            "{} searches {} for plugins: sandbox-guard goes into {}",
            dirs.named_by,
            shown(&dirs.searched),
            dirs.target.display()
        ));
    }
    let mut warnings = warnings;
    let entry = checked_entry(
        options,
        &list,
        current_entry.as_ref(),
        remembered,
        &mut warnings,
    )?;
    warnings.extend(no_journal_warning(options, Some(&entry)));
    let mut out = Installed {
        notes,
        warnings,
        primary_list: Some(edit::strip(&list)),
        entry: Some(entry.clone()),
        ..Installed::default()
    };
    let done = &mut out.done;
    let _replays = waiting::refuse_leaving_delegate(
        &net,
        Some(options.mode),
        &options.host_root,
        options.force.then_some("--force"),
        done,
    )?;
    if options.mode == Mode::Dropin {
        out.file = dropin.clone();
        if let Some(kind) = via_multus {
            return Err(Failure::new(
                Reason::Conflict,
                format!(
                    "--mode dropin: multus ({kind}) runs {} itself, and whether it appends drop-ins is its version's to say (v4.2.1+ for a cluster network given as a .conflist path, never its inlined copy), which no file shows; use --mode chained or delegate",
                    file_name(&net.file)
                ),
            ));
        }
        check_dropin(&net, &dropin)?;
        for written in files::install_binaries(&dirs.target)? {
            done.push(files::copied(&written));
        }
        if edit::has_guard(&net.doc.root)
            && !restore(&net, &edit::strip(&net.doc.root), named_by.as_deref(), done)?
        {
            return Err(changed(&net.file));
        }
        let wanted = Doc::new(entry);
        if !dropin_doc.is_some_and(|doc| doc.root.same_as(&wanted.root)) {
            let dir = dropin.parent().expect("a drop-in has a directory");
            std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
            files::write_atomic(&dropin, &wanted.render(), Keep::mode(0o644))
                .map_err(io_err("write", &dropin))?;
            done.push(format!(
                "wrote the drop-in {} for network {}",
                dropin.display(),
                net.name
            ));
        }
        return Ok(out);
    }

    if net.single && options.mode == Mode::Chained {
        return Err(Failure::new(
            Reason::Conflict,
            format!(
                "{} holds a single plugin: chained mode would have to turn it into a .conflist, removing a file {}; \
                 use --mode delegate, which wraps the plugin in place and keeps the file",
                net.file.display(),
                named_by.as_deref().map_or_else(
                    || "its owner writes again at its next start".to_string(),
                    |who| format!("that {who}")
                )
            ),
        ));
    }
    let wanted = edit::insert(&edit::strip(&list), options.mode, &entry);
    // A single plugin stays one: the guard takes its place in its own file.
    let wanted = if net.single {
        edit::single_of(&wanted)
    } else {
        wanted
    };
    out.file = net.file.clone();
    let changes = !wanted.same_as(&net.doc.root);
    let bytes = net.doc.with_root(wanted).render();
    if changes && in_place(&net, named_by.as_deref()) {
        fits_in_place(&net, bytes.len(), named_by.as_deref())?;
    }
    for written in files::install_binaries(&dirs.target)? {
        done.push(files::copied(&written));
    }
    if let Some(dir) = &multus_dir {
        let written = files::install_binaries(dir).map_err(|e| {
            // A guard there (an older build) is one multus runs: the node stays guarded.
            let older = dir.join(edit::GUARD_TYPE).is_file();
            let failure = Failure::new(
                Reason::BinDir,
                format!(
                    "{e}: multus ({}) looks for its delegates there first, its binDir, and {}; mount the host's \
                     dir writable at that path",
                    via_multus.unwrap_or("multus"),
                    if older {
                        "runs the sandbox-guard already there, another build, until this one is put there"
                    } else {
                        "without sandbox-guard there it would fail to find it"
                    }
                ),
            );
            if older {
                failure
            } else {
                failure.guard_cannot_run()
            }
        })?;
        for written in written {
            done.push(format!(
                "{} too: multus looks for its delegates there first (its binDir)",
                files::copied(&written)
            ));
        }
    }
    if changes {
        let keep = Keep::of(&net.file).map_err(io_err("read", &net.file))?;
        // The primary's own bytes, for --uninstall: kept each time the primary wrote them.
        if !edit::has_guard(&list) {
            let original = original_of(&net.file);
            files::write_atomic(&original, &net.bytes, keep).map_err(io_err("write", &original))?;
        }
        let expect = Expect::Bytes(&net.bytes);
        let written = if in_place(&net, named_by.as_deref()) {
            files::write_in_place_if(&net.file, &bytes, &expect)
        } else {
            files::write_atomic_if(&net.file, &bytes, keep, &expect)
        }
        .map_err(io_err("write", &net.file))?;
        if !written {
            return Err(changed(&net.file));
        }
        done.push(format!(
            "put sandbox-guard into {} ({})",
            net.file.display(),
            options.mode.name()
        ));
    }
    remove_dropin(&dropin, done)?;
    Ok(out)
}

/// What a mode costs over a primary that does not need the guard (the doctor's names:
/// `delegate`, `chained`).
pub fn mode_cost(mode: &str) -> &'static str {
    primary_cost(if mode == "delegate" {
        Mode::Delegate
    } else {
        Mode::Chained
    })
}

fn primary_cost(mode: Mode) -> &'static str {
    match mode {
        Mode::Delegate => {
            "it holds the old sandbox's DEL (its address release) back from the primary while the new pod lives"
        }
        Mode::Chained | Mode::Dropin => {
            "it refuses the old sandbox's DELs while the new pod lives: that sandbox stays NotReady and kubelet's \
             GC retries every minute"
        }
    }
}

/// A chained guard runs only if it is the last plugin (the first on DEL): anywhere else
/// the plugins after it see a stale DEL before it can refuse it. A wrapper holds only the
/// DEL of the plugin it wraps: the one whose DEL acts on the pod's name.
fn first_on_del(net: &Network) -> Result<(), Failure> {
    let list = net.list();
    let plugins = edit::plugins(&list);
    let last = plugins.len().saturating_sub(1);
    let chained = plugins.iter().enumerate().find(|(_, p)| {
        p.get("type").and_then(Json::as_str) == Some(edit::GUARD_TYPE)
            && p.get("delegate").is_none()
    });
    match chained {
        Some((i, _)) if i != last => Err(Failure::new(
            Reason::Conflict,
            format!(
                "sandbox-guard is plugin {} of {} in {}, not the last: the plugins after it get a stale DEL before it \
                 can refuse it; run --install again to put it last",
                i + 1,
                plugins.len(),
                file_name(&net.file)
            ),
        )),
        _ => match crate::tools::primaries::misplaced_wrapper(&list.to_value()) {
            Some((wrapped, target)) => Err(Failure::new(
                Reason::Conflict,
                format!(
                    "sandbox-guard wraps {wrapped} in {}, but {target}'s DEL, which acts on the pod's name, runs before \
                     it and unheld; run --install again to wrap {target}",
                    file_name(&net.file)
                ),
            )),
            None => Ok(()),
        },
    }
}

/// Multus thin runs its own inlined copy of the network: the guard counts only once it is
/// there too.
fn multus_copy_guarded(found: &Found) -> Result<(), Failure> {
    match &found.multus_copy {
        Some((file, copy)) if !edit::names_guard_anywhere(copy) => Err(Failure::new(
            Reason::Network,
            format!(
                "multus (thin) runs its own copy of {} inlined in {}, made when it started, and that copy has no \
                 sandbox-guard: pods are not guarded. Restart multus's pod on this node (it inlines the file again), \
                 or run multus thin with --cleanup-config-on-exit, which re-reads the file every second",
                file_name(&found.net.file),
                file_name(file)
            ),
        )),
        Some((file, copy)) => match inlined_misplaced(copy) {
            Some((wrapped, target)) => Err(Failure::new(
                Reason::Network,
                format!(
                    "multus (thin) runs its own copy of {} inlined in {}, made when it started, where sandbox-guard \
                     wraps {wrapped}, and {target}'s DEL, which acts on the pod's name, runs unheld. Restart multus's \
                     pod on this node (it inlines the file again)",
                    file_name(&found.net.file),
                    file_name(file)
                ),
            )),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// A misplaced wrapper (`primaries::misplaced_wrapper`) in any list inlined in multus's conf.
fn inlined_misplaced(doc: &Json) -> Option<(String, String)> {
    let value = doc.to_value();
    let lists = value.get("delegates").and_then(|d| d.as_array())?;
    lists
        .iter()
        .find_map(crate::tools::primaries::misplaced_wrapper)
}

/// Files do not say whether the runtime loads drop-ins (libcni 1.3: containerd 2.1+, CRI-O
/// 1.33+; older ones ignore them and run the network unguarded): reading files alone, a
/// drop-in is never ready. Asking the runtime what it loaded can say more.
fn dropin_unknown(net: &Network, dropin: &Path) -> Failure {
    Failure::new(
        Reason::Network,
        format!(
            "sandbox-guard is only in the drop-in {}, which only libcni 1.3 runtimes (containerd 2.1+, CRI-O 1.33+) \
             load into network {}: the files do not say which runtime runs; use --mode chained or delegate, or \
             let the probe ask the runtime",
            dropin.display(),
            net.name
        ),
    )
}

/// Dirs for a message, comma-separated.
fn shown(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Multus's `binDir` (under the host root) when the guard must be there too, it not being
/// the bin dir: for thick, when it holds this network's plugins (its daemon runs them from
/// there and looks nowhere else, so without the guard every ADD fails "failed to find
/// plugin"); for either, when it holds a sandbox-guard (thin looks there before the
/// runtime's dirs, so an older guard there would run instead). Thin finds the guard in the
/// runtime's dirs otherwise. A binDir holding none of the network's plugins and no guard is
/// not where thick finds them (multus cannot run this network from there either): left
/// alone. A binDir thick's file names that is not a dir under the host root (not mounted,
/// a relative path) is refused: multus would run every pod's delegates from a dir the guard
/// cannot be put into or seen in.
fn multus_bin_dir(
    options: &Options,
    found: &Found,
    bin_dir: &Path,
) -> Result<Option<PathBuf>, Failure> {
    let Some((named, explicit)) = found.multus_bin_dir.as_ref() else {
        return Ok(None);
    };
    let root = &options.host_root;
    let thick = found.via_multus == Some("thick");
    let Some(dir) = network::under_host_root(root, named).filter(|d| d.is_dir()) else {
        // Multus's default where no binDir is named: the default DaemonSet mounts it, and a
        // host without it gives multus none of the network's plugins either.
        if !thick || !explicit {
            return Ok(None);
        }
        return Err(Failure::new(
            Reason::BinDir,
            format!(
                "multus (thick) runs every delegate from its binDir, {}, and looks nowhere else, but that is no dir \
                 under --host-root {}: sandbox-guard could not be put there, and every pod ADD would fail to find \
                 it; mount the host's {} at the same path under the host root (or set multus's binDir, in its daemon \
                 config, to the runtime's plugin dir)",
                named.display(),
                root.display(),
                named.display()
            ),
        ));
    };
    let canonical = |d: &Path| d.canonicalize().ok();
    if canonical(&dir) == canonical(bin_dir) {
        return Ok(None);
    }
    let plugins: Vec<String> = network::plugin_types(&found.net)
        .into_iter()
        .filter(|t| t != edit::GUARD_TYPE)
        .collect();
    let runs_there = thick
        && !plugins.is_empty()
        && plugins.iter().all(|t| network::plugin_found(&dir, root, t));
    Ok((runs_there || dir.join(edit::GUARD_TYPE).is_file()).then_some(dir))
}

/// Not ready while multus's binDir, where it looks for its delegates first (thick: only
/// there), lacks this binary (`this`): multus would fail to find the guard or run another.
fn multus_bin_dir_ready(
    options: &Options,
    found: &Found,
    bin_dir: &Path,
    this: &[u8],
) -> Result<(), Failure> {
    let Some(dir) = multus_bin_dir(options, found, bin_dir)? else {
        return Ok(());
    };
    if std::fs::read(dir.join(edit::GUARD_TYPE)).is_ok_and(|there| there == this) {
        return Ok(());
    }
    Err(Failure::new(
        Reason::BinDir,
        format!(
            "multus ({}) looks for its delegates first in its binDir, {}, where network {}'s plugins are, and \
             sandbox-guard there is missing or not this version: multus (thick: only there) would fail to find it \
             or run another; run --install, which copies it there, with that dir mounted",
            found.via_multus.unwrap_or("multus"),
            dir.display(),
            found.net.name
        ),
    ))
}

/// Whether the network's file is written in place (same inode, never renamed over): a
/// primary's single-plugin file, or one another component names by path. A watcher of
/// that path (multus's readiness indicator, its config watch) reads a rename over it as
/// the file going away, and multus then deletes its own config and exits; an in-place
/// write reads as a write.
fn in_place(net: &Network, named_by: Option<&str>) -> bool {
    net.single || named_by.is_some()
}

/// An in-place write longer than one page could be read half-done (`files::IN_PLACE_MAX`):
/// refused before anything is written, saying how to make it fit.
fn fits_in_place(net: &Network, new_len: usize, named_by: Option<&str>) -> Result<(), Failure> {
    let span = files::in_place_span(net.bytes.len(), new_len);
    if span <= files::IN_PLACE_MAX {
        return Ok(());
    }
    let why =
        named_by.unwrap_or("it is the primary's single-plugin file, which its owner names by path");
    Err(Failure::new(
        Reason::Conflict,
        format!(
            "{} must be written in place ({why}), and with sandbox-guard it would take {span} bytes, more than one \
             page ({}), the most one write puts in place whole: a reader could get part old, part new JSON, and \
             so could a crash; shorten the entry (fewer or shorter keys in --entry or --entry-file, the ConfigMap) \
             or the primary's own config until it fits",
            net.file.display(),
            files::IN_PLACE_MAX
        ),
    ))
}

/// The list as the runtime would hand the entry to the plugin, for `edit::entry_problem`.
fn with_entry(list: &Json, mode: Mode, entry: &Json) -> Json {
    let mode = if mode == Mode::Delegate {
        Mode::Delegate
    } else {
        Mode::Chained
    };
    edit::insert(&edit::strip(list), mode, entry)
}

/// The entry to write, refused (naming the key) when the plugin would reject it. A watch
/// keeps the entry it last wrote instead: a bad ConfigMap must not take the guard out of
/// the network the primary rewrites meanwhile; its probe says not ready until it is fixed.
fn checked_entry(
    options: &Options,
    list: &Json,
    current: Option<&Json>,
    remembered: Option<&Json>,
    warnings: &mut Vec<String>,
) -> Result<Json, Failure> {
    let entry = options
        .entry
        .json(current.or(remembered))
        .map_err(|msg| Failure::new(Reason::Entry, msg))?;
    let Some(problem) = edit::entry_problem(&with_entry(list, options.mode, &entry)) else {
        return Ok(entry);
    };
    let good = current
        .into_iter()
        .chain(remembered)
        .find(|last| edit::entry_problem(&with_entry(list, options.mode, last)).is_none());
    match good {
        Some(last) if options.watch => {
            warnings.push(format!(
                "{problem}; the last good entry stays: fix the key in --entry or --entry-file (the ConfigMap)"
            ));
            Ok(last.clone())
        }
        _ => Err(Failure::new(
            Reason::Entry,
            format!(
                "{problem}: every ADD would fail; fix the key in --entry or --entry-file (the ConfigMap)"
            ),
        )),
    }
}

/// The readiness check: the guard is in the network the runtime loads (or, for multus,
/// the one it delegates to), that network can run it, and its binary is where the runtime
/// looks. Only reads.
pub fn check(options: &Options) -> Result<Vec<String>, Failure> {
    let (found, dirs) = runnable(options)?;
    let net = &found.net;
    if !found.runtime_runs_it {
        return Err(Failure::new(Reason::Network, found.warnings.join("; ")));
    }
    let dropin = options.conf_dir.join(&net.name).join(DROPIN_FILE);
    let place = if edit::has_guard(&net.list()) {
        first_on_del(net)?;
        multus_copy_guarded(&found)?;
        format!("in {}", file_name(&net.file))
    } else if dropin.is_file() && !net.single {
        return Err(dropin_unknown(net, &dropin));
    } else {
        // Where the guard stood aside, the reason it could not stay.
        let why = shipped_plugin()
            .and_then(|this| multus_bin_dir_ready(options, &found, &dirs.target, &this))
            .err()
            .map(|failure| format!(": {}", failure.msg))
            .unwrap_or_default();
        return Err(Failure::new(
            Reason::Network,
            format!(
                "sandbox-guard is not in network {} ({}){why}",
                net.name,
                file_name(&net.file)
            ),
        ));
    };
    entry_ready(options, net, &dropin)?;
    let binary = dirs.target.join(edit::GUARD_TYPE);
    let this = shipped_plugin()?;
    if !std::fs::read(&binary).is_ok_and(|there| there == this) {
        return Err(Failure::new(
            Reason::BinDir,
            format!(
                "{} is missing or not this version{}",
                binary.display(),
                if dirs.asked {
                    format!(", and {} searches it", dirs.named_by)
                } else {
                    String::new()
                }
            ),
        ));
    }
    multus_bin_dir_ready(options, &found, &dirs.target, &this)?;
    let mut lines = found.notes.clone();
    lines.extend(dirs.notes.iter().cloned());
    let entry = edit::guard_entry(&net.list()).or_else(|| {
        std::fs::read(&dropin)
            .ok()
            .and_then(|b| Doc::parse(&b).ok())
            .map(|d| d.root)
    });
    lines.extend(
        no_journal_warning(options, entry.as_ref()).map(|warning| format!("warning: {warning}")),
    );
    lines.push(format!(
        "ready: sandbox-guard is {place}, network {} at cniVersion {}, binary {}",
        net.name,
        network::version(net),
        binary.display()
    ));
    Ok(lines)
}

fn shipped_plugin() -> Result<Vec<u8>, Failure> {
    files::plugin_bytes().map_err(Failure::from)
}

/// The guard's state dir: the entry's `stateDir`, else `--state-dir`, else the default; as
/// the host names it, and as this installer sees it through the host root.
fn state_dir(options: &Options, entry: Option<&Json>) -> (PathBuf, PathBuf) {
    let on_host = entry
        .and_then(|e| e.get("stateDir"))
        .and_then(Json::as_str)
        .map(PathBuf::from)
        .or_else(|| options.entry.state_dir.clone())
        .unwrap_or_else(|| PathBuf::from(crate::cni::config::DEFAULT_STATE_DIR));
    let seen = options
        .host_root
        .join(on_host.strip_prefix("/").unwrap_or(&on_host));
    (on_host, seen)
}

/// The guard's state dir (the entry's stateDir, seen through the host root) on a file system
/// without a journal: what that costs and how out. Read only.
fn no_journal_warning(options: &Options, entry: Option<&Json>) -> Option<String> {
    use crate::state::journal::{
        NO_BARRIER_COST, NO_BARRIER_FIX, NO_JOURNAL_COST, PowerCut, no_journal_fix, power_cut_of,
    };
    let (on_host, seen) = state_dir(options, entry);
    match power_cut_of(&seen) {
        PowerCut::NoJournal { device, evidence } => Some(format!(
            "the state dir {} is on {device}, an ext file system without a journal ({evidence}): {NO_JOURNAL_COST}; {}",
            on_host.display(),
            no_journal_fix(&device)
        )),
        PowerCut::NoBarrier { device, evidence } => Some(format!(
            "the state dir {} is on {device}, journaled but mounted nobarrier ({evidence}): {NO_BARRIER_COST}; {NO_BARRIER_FIX}",
            on_host.display()
        )),
        PowerCut::Journaled | PowerCut::Unknown => None,
    }
}

/// Not ready while the entry the runtime hands the plugin, or the one the installer is told
/// to write, is one the plugin rejects.
fn entry_ready(options: &Options, net: &Network, dropin: &Path) -> Result<(), Failure> {
    let list = net.list();
    let (in_place, mode) = match edit::guard_entry(&list) {
        Some(entry) => (Some(entry), None),
        None => {
            let doc = std::fs::read(dropin).ok().map(|b| Doc::parse(&b));
            match doc {
                Some(Ok(doc)) => (Some(doc.root), Some(Mode::Chained)),
                Some(Err(e)) => {
                    return Err(Failure::new(
                        Reason::Entry,
                        format!("the drop-in {} does not parse: {e}", dropin.display()),
                    ));
                }
                None => (None, None),
            }
        }
    };
    let guarded = match mode {
        Some(mode) => in_place.as_ref().map(|e| with_entry(&list, mode, e)),
        None => Some(list.clone()),
    };
    if let Some(problem) = guarded.as_ref().and_then(edit::entry_problem) {
        return Err(Failure::new(
            Reason::Entry,
            format!("{problem}: every ADD fails"),
        ));
    }
    let told = options
        .entry
        .json(in_place.as_ref())
        .map_err(|msg| Failure::new(Reason::Entry, msg))?;
    if let Some(problem) = edit::entry_problem(&with_entry(&list, options.mode, &told)) {
        return Err(Failure::new(
            Reason::Entry,
            format!("{problem}; the installed entry stays until the key is fixed"),
        ));
    }
    Ok(())
}

/// For `--doctor`: the network the runtime runs from `conf_dir` (the lexically first; where
/// that is multus, the cluster network it delegates to) as JSON, its file, and whether it
/// came through multus.
pub fn runtime_network(conf_dir: &Path) -> Option<(PathBuf, serde_json::Value, bool)> {
    let found = network::find(conf_dir, None, Path::new("/")).ok()?;
    Some((
        found.net.file.clone(),
        found.net.list().to_value(),
        found.via_multus.is_some(),
    ))
}

/// For `--doctor`, which knows no bin dir and checks each guarded network's version on its
/// own: why the guards of `conf_dir` do not run for the runtime's pods, with the way out.
pub fn runtime_problem(conf_dir: &Path) -> Option<(String, &'static str)> {
    let found = network::find(conf_dir, None, Path::new("/")).ok()?;
    let net = &found.net;
    let guarded =
        edit::has_guard(&net.list()) || conf_dir.join(&net.name).join(DROPIN_FILE).is_file();
    (!guarded).then(|| {
        (
            format!(
                "sandbox-guard is not in network {} ({}), the one the runtime loads{}: no pod is guarded",
                net.name,
                file_name(&net.file),
                if found.via_multus.is_some() { " through multus" } else { "" }
            ),
            "run sandbox-guard --install (it picks the network the runtime loads), and --uninstall first to take it out of the others",
        )
    })
}

/// A drop-in runs only from a `.conflist` that lets libcni load drop-ins, and is the last of
/// them (the last plugin is the first on DEL).
fn check_dropin(net: &Network, dropin: &Path) -> Result<(), Failure> {
    let conflict = |msg: String| Failure::new(Reason::Conflict, msg);
    if net.single {
        return Err(conflict(format!(
            "--mode dropin needs the network in a .conflist: runtimes do not add drop-ins to a single plugin such as {}; use --mode chained",
            file_name(&net.file)
        )));
    }
    let inlined_only = match net.doc.root.get("loadOnlyInlinedPlugins") {
        Some(Json::Bool(b)) => *b,
        Some(Json::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    };
    if inlined_only {
        return Err(conflict(format!(
            "{} sets loadOnlyInlinedPlugins: libcni would ignore a drop-in; use --mode chained",
            file_name(&net.file)
        )));
    }
    let dir = dropin.parent().expect("a drop-in has a directory");
    if let Ok(entries) = std::fs::read_dir(dir) {
        let after: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conf") && n.as_str() > DROPIN_FILE)
            .collect();
        if !after.is_empty() {
            return Err(conflict(format!(
                "{} holds drop-ins that sort after {DROPIN_FILE} ({}): the guard would not be the first plugin on DEL",
                dir.display(),
                after.join(", ")
            )));
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

/// Takes the guard out of every place it may be, whichever network it went into and
/// whatever happened since: every network file that names it (a converted list whose
/// plugin file the primary re-created goes whole, multus thin's re-inlined copy is
/// stripped), every drop-in, every kept original. The binary goes only when asked.
pub fn uninstall(options: &Options) -> Result<Vec<String>, String> {
    // Room for a refusal while the store holds what only the guard can finish (delegate
    // mode's deferred DELs): it goes here, before the first write.
    let mut done = Vec::new();
    // A node without the conf dir (no CNI yet, another platform's layout) has no config to
    // take the guard out of: nothing to do there is a success, or the uninstall DaemonSet's
    // init container crash-loops on exactly the nodes that are already clean.
    if !options.conf_dir.exists() {
        println!(
            "no CNI config dir {}: no config to take sandbox-guard out of",
            options.conf_dir.display()
        );
        remove_binary(options, Vec::new(), &mut done)?;
        return Ok(done);
    }
    let mut networks = network::scan(&options.conf_dir)?.networks;
    // The file the runtime's network names by path, wherever it is (multus thick's cluster
    // network outside the conf dir), is written in place.
    let (mut named, mut named_by) = (None, None);
    // Where the install put the binary: the runtime's dir, and multus's binDir.
    let mut other_dirs = Vec::new();
    if let Ok(found) = network::find(&options.conf_dir, None, &options.host_root) {
        let target = bin_dirs::locate(options, &found)
            .map(|dirs| dirs.target)
            .unwrap_or_else(|_| network::host_dir(&options.host_root, &options.bin_dir));
        other_dirs.extend(multus_bin_dir(options, &found, &target).ok().flatten());
        other_dirs.push(target);
        if found.named_by.is_some() {
            named = Some(found.net.file.clone());
            named_by = found.named_by.clone();
        }
        if !networks.iter().any(|n| n.file == found.net.file) {
            networks.push(found.net);
        }
    }
    // The entry's own stateDir, read before the entry goes: where DELs held with the
    // kubeconfig are kept.
    let guard_entry = networks
        .iter()
        .find_map(|net| edit::guard_entry(&net.list()));
    // A file taken back in place past one page is refused (restore): before any other is
    // written, so that a refusal leaves the node as it was.
    for net in &networks {
        let named_by = named_by
            .as_deref()
            .filter(|_| named.as_ref() == Some(&net.file));
        if edit::has_guard(&net.list())
            && in_place(net, named_by)
            && net.bytes.len() > files::IN_PLACE_MAX
        {
            return Err(format!(
                "{}; have its owner write it again (that takes the guard out), then run this again",
                files::too_long_in_place(&net.file, net.bytes.len())
            ));
        }
    }
    // Held until the files are rewritten: no replay starts on a store being left.
    let mut _replays = Vec::new();
    for net in &networks {
        _replays.push(waiting::refuse_leaving_delegate(
            net,
            None,
            &options.host_root,
            options.force.then_some("--force"),
            &mut done,
        )?);
    }
    for net in &networks {
        let list = net.list();
        let named_by = named_by
            .as_deref()
            .filter(|_| named.as_ref() == Some(&net.file));
        if edit::has_guard(&list) {
            restore_current(net, named_by, &mut done)?;
        } else if edit::names_guard_anywhere(&net.doc.root) {
            let keep = Keep::of(&net.file).map_err(io_err("read", &net.file))?;
            let stripped = net.doc.with_root(edit::strip_anywhere(&net.doc.root));
            files::write_atomic(&net.file, &stripped.render(), keep)
                .map_err(io_err("write", &net.file))?;
            done.push(format!(
                "took sandbox-guard out of the lists inlined in {}",
                net.file.display()
            ));
        }
    }
    leftovers::strip_backups(&options.conf_dir, &mut done)?;
    for entry in std::fs::read_dir(&options.conf_dir)
        .map_err(io_err("read", &options.conf_dir))?
        .flatten()
    {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_dropin_and_temps(&path.join(DROPIN_FILE), &mut done)?;
        } else if (path.to_string_lossy().ends_with(files::ORIGINAL_SUFFIX)
            || is_temp(&entry.file_name()))
            && files::remove(&path).map_err(io_err("remove", &path))?
        {
            done.push(format!("removed {}", path.display()));
        }
    }
    // After the network files: a kubeconfig that cannot be removed is said, never a reason
    // to stop before the binaries. One that DELs are held with (chained mode's, which
    // CRI-O's cached configs still reach) takes the off sign instead: gone, it would hold
    // them for good.
    let held = held_with_the_kubeconfig(options, guard_entry.as_ref());
    if may_hold(held.as_deref()) {
        turn_off_for(&options.conf_dir, held.as_deref(), &mut |line| {
            done.push(line)
        });
    } else {
        match api_access::remove(&options.conf_dir) {
            Ok(removed) => done.extend(removed),
            Err(e) => done.push(format!(
                "warning: cannot remove the plugin's kubeconfig under {}: {e}",
                options.conf_dir.display()
            )),
        }
    }
    remove_binary(options, other_dirs, &mut done)?;
    Ok(done)
}

/// The drop-in and the temp files an installer killed while it wrote one left beside it;
/// the directory too, once nothing else is in it.
fn remove_dropin_and_temps(dropin: &Path, done: &mut Vec<String>) -> Result<(), String> {
    let dir = dropin.parent().expect("a drop-in has a directory");
    let mut removed = false;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let (name, path) = (entry.file_name(), entry.path());
        if name
            .to_string_lossy()
            .starts_with(&format!(".{DROPIN_FILE}."))
            && is_temp(&name)
            && files::remove(&path).map_err(io_err("remove", &path))?
        {
            done.push(format!("removed {}", path.display()));
            removed = true;
        }
    }
    remove_dropin(dropin, done)?;
    if removed {
        // Only an empty directory goes: the primary's own drop-ins stay.
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

fn is_temp(name: &std::ffi::OsStr) -> bool {
    files::is_installer_temp(&name.to_string_lossy())
}

/// The temp files a killed installer left in the bin dir and in `other_dirs` (the runtime's
/// dir and multus's binDir, where the install put the binary too); with `--remove-binary`
/// the binary as well, unless a cached attachment still names the guard.
fn remove_binary(
    options: &Options,
    other_dirs: Vec<PathBuf>,
    done: &mut Vec<String>,
) -> Result<(), String> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let canonical = |d: &Path| d.canonicalize().unwrap_or_else(|_| d.to_path_buf());
    for dir in std::iter::once(options.bin_dir.clone()).chain(other_dirs) {
        if !dirs.iter().any(|d| canonical(d) == canonical(&dir)) {
            dirs.push(dir);
        }
    }
    for dir in &dirs {
        // Left by an installer killed while it copied the binary.
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let path = entry.path();
            let name_text = name.to_string_lossy();
            if files::BINARIES
                .iter()
                .any(|binary| name_text.starts_with(&format!(".{binary}.")))
                && is_temp(&name)
                && files::remove(&path).map_err(io_err("remove", &path))?
            {
                done.push(format!("removed {}", path.display()));
            }
        }
    }
    if !options.remove_binary {
        return Ok(());
    }
    // In the reverse of the install's order: the plugin goes before its commands.
    let binaries: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| files::BINARIES.iter().rev().map(|binary| d.join(binary)))
        .filter(|b| b.exists())
        .collect();
    // A pod attached through the guard is torn down through it: its DEL would fail to
    // find the plugin and the pod would never go.
    let cached = leftovers::cached_attachments(&options.host_root);
    if !cached.is_empty() && !binaries.is_empty() {
        let shown: Vec<String> = cached
            .iter()
            .take(3)
            .map(|p| p.display().to_string())
            .collect();
        let kept: Vec<String> = binaries.iter().map(|b| b.display().to_string()).collect();
        done.push(format!(
            "kept {}: {} cached attachment(s) still name sandbox-guard ({}{}), and their DEL runs it; \
             run --uninstall --remove-binary again once those pods are gone",
            kept.join(", "),
            cached.len(),
            shown.join(", "),
            if cached.len() > shown.len() { ", ..." } else { "" }
        ));
        return Ok(());
    }
    for binary in binaries {
        if files::remove(&binary).map_err(io_err("remove", &binary))? {
            done.push(format!("removed {}", binary.display()));
        }
    }
    Ok(())
}

/// `restore` of the file as it is now: its owner may write it meanwhile (the wait for the
/// replays can be long), and what it wrote is read again, never overwritten; a write that
/// took the guard out ends it.
fn restore_current(
    net: &Network,
    named_by: Option<&str>,
    done: &mut Vec<String>,
) -> Result<(), String> {
    let mut now: Option<Network> = None;
    let mut attempts = 0;
    loop {
        let current = now.as_ref().unwrap_or(net);
        let list = current.list();
        if !edit::has_guard(&list) || restore(current, &edit::strip(&list), named_by, done)? {
            return Ok(());
        }
        attempts += 1;
        if attempts == ATTEMPTS {
            return Err(changed(&current.file).msg);
        }
        now = Some(network::reread(current)?);
    }
}

/// Writes the list without the guard: the primary's own bytes when the kept original says
/// the same (a converted plugin goes back to its own file), else the stripped list. False
/// when the file no longer holds what was read (`net.bytes`): its owner wrote it since, and
/// what it wrote is left as it is, for the caller to read again.
fn restore(
    net: &Network,
    stripped: &Json,
    named_by: Option<&str>,
    done: &mut Vec<String>,
) -> Result<bool, String> {
    let keep = Keep::of(&net.file).map_err(io_err("read", &net.file))?;
    let kept = |file: &Path| -> Option<Vec<u8>> {
        let bytes = std::fs::read(original_of(file)).ok()?;
        Doc::parse(&bytes)
            .ok()
            .map(|doc| (doc, bytes))
            .filter(|(doc, _)| {
                let list = if file == net.file && !net.single {
                    doc.root.clone()
                } else {
                    edit::upconvert(&doc.root)
                };
                list.same_as(stripped)
            })
            .map(|(_, bytes)| bytes)
    };
    for single in [
        net.file.with_extension("conf"),
        net.file.with_extension("json"),
    ] {
        if single == net.file {
            continue;
        }
        if single.exists() && original_of(&single).exists() {
            // The primary wrote its plugin file again after the conversion: its bytes are
            // newer than the kept ones, and the converted list is ours alone.
            files::remove(&net.file).map_err(io_err("remove", &net.file))?;
            files::remove(&original_of(&single))
                .map_err(io_err("remove", &original_of(&single)))?;
            done.push(format!(
                "removed {}, left {} as the primary wrote it again",
                net.file.display(),
                single.display()
            ));
            return Ok(true);
        }
        if let Some(bytes) = kept(&single) {
            files::write_atomic(&single, &bytes, keep).map_err(io_err("write", &single))?;
            files::remove(&net.file).map_err(io_err("remove", &net.file))?;
            files::remove(&original_of(&single))
                .map_err(io_err("remove", &original_of(&single)))?;
            done.push(format!(
                "restored {} and removed {}",
                single.display(),
                file_name(&net.file)
            ));
            return Ok(true);
        }
    }
    let bytes = kept(&net.file).unwrap_or_else(|| {
        let root = if net.single {
            edit::single_of(stripped)
        } else {
            stripped.clone()
        };
        net.doc.with_root(root).render()
    });
    let expect = Expect::Bytes(&net.bytes);
    let written = if in_place(net, named_by) {
        files::write_in_place_if(&net.file, &bytes, &expect).map_err(|e| match e.kind() {
            std::io::ErrorKind::FileTooLarge => format!(
                "{e}; have its owner write it again (that takes the guard out), then run this again"
            ),
            _ => io_err("write", &net.file)(e),
        })?
    } else {
        files::write_atomic_if(&net.file, &bytes, keep, &expect)
            .map_err(io_err("write", &net.file))?
    };
    if !written {
        return Ok(false);
    }
    files::remove(&original_of(&net.file)).map_err(io_err("remove", &original_of(&net.file)))?;
    done.push(format!("took sandbox-guard out of {}", net.file.display()));
    Ok(true)
}
