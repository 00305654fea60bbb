//! Runs the built plugin exactly as a container runtime does: the six CNI_* variables that
//! libcni always sets (empty when they do not apply), the plugin's entry of a conflist on stdin
//! with `name`, `cniVersion` and `prevResult` filled in, and nothing else inherited from the
//! test's own environment. Also reads back what the plugin leaves behind: its checkpoint
//! store, its dump and its log file. Every exec of the plugin binary in the tests goes
//! through here: the CNI verbs through `Cni`, the operator CLI through `guard` and its kin.
//! Needs `#[path = "support/sys.rs"] mod sys;` and `#[path = "support/testdata.rs"] mod
//! testdata;` in the including test crate.
#![allow(dead_code)]

use crate::sys::{HostLink, Netns, TempDir, hex, run, unique};
use crate::testdata;
/// The guard's own reader of its log and its `outcome=` names.
pub use sandbox_guard::cni::log_entry::{LogEntry, Outcome};
/// How a format-1 record's symlink entry holds its text: the guard's own table.
use sandbox_guard::state::entry_text;
use serde_json::{Map, Value, json, value::RawValue};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The plugin under test: the release build `scripts/test.sh` makes once and names in
/// `SANDBOX_GUARD_RELEASE_DIR` (the binaries the nodes get, whatever profile built the
/// tests), else the one cargo built for these tests.
pub fn bin() -> &'static str {
    &under_test().0
}

/// The operator's binary beside the plugin under test.
pub fn ctl() -> &'static str {
    &under_test().1
}

/// Whether the binaries under test are the ones cargo built for these tests.
pub fn cargo_built() -> bool {
    std::env::var_os("SANDBOX_GUARD_RELEASE_DIR").is_none()
}

fn under_test() -> &'static (String, String) {
    static BINARIES: OnceLock<(String, String)> = OnceLock::new();
    BINARIES.get_or_init(|| match std::env::var_os("SANDBOX_GUARD_RELEASE_DIR") {
        Some(dir) => {
            let dir = Path::new(&dir)
                .canonicalize()
                .unwrap_or_else(|e| panic!("SANDBOX_GUARD_RELEASE_DIR={dir:?}: {e}"));
            let named = |name: &str| {
                let path = dir.join(name);
                assert!(
                    path.is_file(),
                    "SANDBOX_GUARD_RELEASE_DIR={} holds no {name}",
                    dir.display()
                );
                path
            };
            let (plugin, ctl) = (named("sandbox-guard"), named("sandbox-guard-ctl"));
            // A directory left in the variable would test an old build of this source.
            assert_built_from_this_source(&plugin);
            assert_built_from_this_source(&ctl);
            let text = |path: PathBuf| path.to_str().expect("a UTF-8 path").to_owned();
            (text(plugin), text(ctl))
        }
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "under CI the tests run the release binaries that scripts/test.sh builds and names in SANDBOX_GUARD_RELEASE_DIR, which is unset"
            );
            (
                env!("CARGO_BIN_EXE_sandbox-guard").to_owned(),
                env!("CARGO_BIN_EXE_sandbox-guard-ctl").to_owned(),
            )
        }
    })
}

/// Refuses `binary` unless the source files cargo built it from, as its dep-info beside it
/// lists them (cargo's own view: a file only the tests compile is not among them), are this
/// checkout's and none changed after it.
fn assert_built_from_this_source(binary: &Path) {
    let dep_info = binary.with_extension("d");
    let text = std::fs::read_to_string(&dep_info).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; SANDBOX_GUARD_RELEASE_DIR must be the directory cargo built the release in (bash scripts/build.sh)",
            dep_info.display()
        )
    });
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified());
    let built = modified(binary).unwrap();
    // The first line: the binary, a colon, its sources separated by spaces (a space in a
    // path escaped with a backslash).
    let line = text.lines().next().unwrap_or_default();
    let listed = line.split_once(": ").map_or("", |(_, sources)| sources);
    let mut sources = vec![String::new()];
    let mut chars = listed.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => sources.last_mut().unwrap().extend(chars.next()),
            ' ' => sources.push(String::new()),
            _ => sources.last_mut().unwrap().push(c),
        }
    }
    sources.retain(|source| !source.is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap();
    assert!(
        sources.iter().any(|source| Path::new(source)
            .canonicalize()
            .is_ok_and(|s| s.starts_with(&root))),
        "{} was not built from {}: build this checkout's release (bash scripts/build.sh) and name its directory",
        binary.display(),
        root.display()
    );
    for source in &sources {
        let changed = modified(Path::new(source));
        assert!(
            changed.as_ref().is_ok_and(|changed| *changed <= built),
            "{} is older than {source} it is built from, or that file is gone: rebuild it (bash scripts/build.sh) or unset SANDBOX_GUARD_RELEASE_DIR",
            binary.display()
        );
    }
}

pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// The versions whose results have `ip4`/`ip6` and no interfaces.
pub const LEGACY_VERSIONS: [&str; 2] = ["0.1.0", "0.2.0"];
pub const LATEST_VERSION: &str = "1.1.0";
pub const NETWORK: &str = "k8s-pod-network";
const CNI_PATH: &str = "/opt/cni/bin:/usr/lib/cni";
/// The PATH a runtime gives a plugin, and the operator CLI gets here.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// A plugin that has not answered by then is hung (for instance on the store lock); failing
/// beats blocking the whole test run.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// A fresh 64-hex-digit sandbox id, shaped like containerd's.
pub fn container_id() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seed = format!(
        "{}-{}-{:?}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        Instant::now()
    );
    hex(&Sha256::digest(seed.as_bytes()))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// One incarnation of a Kubernetes pod: a StatefulSet pod re-created under the same name gets
/// a new UID, which is exactly the situation of the stale-DEL incident.
#[derive(Clone, Debug)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Pod {
    pub fn new(namespace: &str, name: &str) -> Pod {
        let id = container_id();
        let uid = format!(
            "{}-{}-{}-{}-{}",
            &id[0..8],
            &id[8..12],
            &id[12..16],
            &id[16..20],
            &id[20..32]
        );
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            uid,
        }
    }

    /// CNI_ARGS as containerd's CRI plugin builds it for this pod's sandbox `container`.
    pub fn cni_args(&self, container: &str) -> String {
        self.cni_args_as("containerd", container)
    }

    /// CNI_ARGS as `testdata/cni-args/<runtime>.txt` shapes them for this pod's sandbox.
    pub fn cni_args_as(&self, runtime: &str, container: &str) -> String {
        let values = [
            ("namespace", self.namespace.as_str()),
            ("name", &self.name),
            ("uid", &self.uid),
            ("container", container),
        ];
        testdata::cni_args(runtime, &values)
    }
}

/// The stale-DEL incident's cast: a fresh store, a pod before and after its re-creation under
/// the same name (a new UID), and the sandbox of each, A the old one and B the new one.
/// Nothing is added yet.
pub struct Incident {
    pub store: Store,
    pub pod_a: Pod,
    pub pod_b: Pod,
    pub a: String,
    pub b: String,
}

impl Incident {
    pub fn of(namespace: &str, name: &str) -> Incident {
        let (pod_a, pod_b) = (Pod::new(namespace, name), Pod::new(namespace, name));
        Incident {
            store: Store::new(),
            pod_a,
            pod_b,
            a: container_id(),
            b: container_id(),
        }
    }
}

/// A checkpoint store of its own (state dir + log file) in a temporary directory.
pub struct Store {
    _root: Option<TempDir>,
    pub state_dir: PathBuf,
    pub log_file: PathBuf,
}

impl Store {
    pub fn new() -> Store {
        let root = TempDir::new("sgst");
        // A state dir that does not exist yet, so the plugin creates it with the modes it wants.
        let state_dir = root.path.join("state");
        let log_file = root.path.join("guard.log");
        Store {
            _root: Some(root),
            state_dir,
            log_file,
        }
    }

    /// A store whose state dir lives elsewhere (a small tmpfs, a bind mount); the log file
    /// stays in `log_dir` so that logging is not what fails.
    pub fn with_state_dir(state_dir: PathBuf, log_dir: &Path) -> Store {
        Store {
            _root: None,
            state_dir,
            log_file: log_dir.join(format!("{}.log", unique("sglog"))),
        }
    }

    /// A store whose state dir starts as a copy of `testdata/<fixture>`, a state dir an earlier
    /// release wrote (modes set as the plugin sets them: git keeps no 0600).
    pub fn from_fixture(fixture: &str) -> Store {
        let store = Store::new();
        copy_state_dir(&testdata::fixture_path(fixture), &store.state_dir);
        store
    }

    /// A fresh store in which one sandbox of the pod `namespace/name` went through ADD:
    /// the store, the pod and the sandbox's container ID.
    pub fn with_one_sandbox(namespace: &str, name: &str) -> (Store, Pod, String) {
        let store = Store::new();
        let (pod, container) = (Pod::new(namespace, name), container_id());
        store.add(&container, &pod).run().assert_ok();
        (store, pod, container)
    }

    pub fn cni(&self, verb: &str, container: &str) -> Cni {
        Cni::new(verb, container, &self.state_dir, &self.log_file)
    }

    /// `--doctor`'s findings (its JSON report's) over this store, with `extra` arguments and
    /// an empty conf dir.
    pub fn doctor_findings(&self, extra: &[&str]) -> Vec<Value> {
        doctor_findings(&self.state_dir, extra, guard)
    }

    /// Waits, at most `limit`, until no delegate-mode replay worker of this store runs (each
    /// holds `replay.lock` shared while it lives); whether none does. A store without the
    /// file has had no worker.
    pub fn wait_for_replays(&self, limit: Duration) -> bool {
        let Ok(file) = std::fs::File::open(self.state_dir.join("replay.lock")) else {
            return true;
        };
        let until = Instant::now() + limit;
        loop {
            if file.try_lock().is_ok() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The processes that hold this store's `replay.lock` open: its replay workers.
    pub fn replay_workers(&self) -> Vec<u32> {
        let lock = self.state_dir.join("replay.lock");
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let holds = std::fs::read_dir(entry.path().join("fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == lock));
            if holds && pid != std::process::id() {
                pids.push(pid);
            }
        }
        pids
    }

    /// Kills this store's replay workers and the process groups of the primaries they run
    /// (a test's hung primary would outlive it).
    pub fn kill_replay_workers(&self) {
        for worker in self.replay_workers() {
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
                // pid (comm) state ppid pgrp ...
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map(|(_, rest)| rest.split_whitespace().collect())
                    .unwrap_or_default();
                if fields.get(1) == Some(&worker.to_string().as_str()) {
                    let group = format!("-{}", entry.file_name().to_string_lossy());
                    let _ = Command::new("kill")
                        .args(["-9", "--", &group])
                        .stderr(Stdio::null())
                        .status();
                }
            }
            let _ = Command::new("kill")
                .args(["-9", &worker.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    pub fn add(&self, container: &str, pod: &Pod) -> Cni {
        self.cni("ADD", container).pod(pod)
    }

    pub fn del(&self, container: &str, pod: &Pod) -> Cni {
        self.cni("DEL", container).pod(pod)
    }

    /// A DEL whose CNI_ARGS name no pod (`IgnoreUnknown=1` alone): only the record can say
    /// whose sandbox it is.
    pub fn identityless_del(&self, container: &str) -> Cni {
        self.cni("DEL", container).cni_args("IgnoreUnknown=1")
    }

    /// `--dump-checkpoints --output json` with extra filter arguments; panics unless it exits 0
    /// with a JSON array.
    pub fn dump_filtered(&self, filters: &[&str]) -> Vec<Value> {
        dump_checkpoints(&self.state_dir, filters)
    }

    pub fn dump(&self) -> Vec<Value> {
        self.dump_filtered(&[])
    }

    /// The dump entry of one attachment, if the dump lists it.
    pub fn entry(&self, container: &str, ifname: &str) -> Option<Value> {
        self.dump()
            .into_iter()
            .find(|e| e["containerId"] == container && e["ifName"] == ifname)
    }

    pub fn is_owner(&self, container: &str, ifname: &str) -> bool {
        self.entry(container, ifname)
            .is_some_and(|e| e["owner"] == true)
    }

    pub fn record_path(&self, network: &str, container: &str, ifname: &str) -> PathBuf {
        self.state_dir
            .join("records")
            .join(format!("{network}:{container}:{ifname}"))
    }

    /// The refusal ledger's entry of a pod (its sealed record) under the default `podKey`
    /// rule, (network, namespace, name), if there is one.
    pub fn ledger_entry(&self, pod: &Pod) -> Option<Value> {
        let mut hasher = Sha256::new();
        for part in [NETWORK, pod.namespace.as_str(), pod.name.as_str()] {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        let path = self.state_dir.join("ledger").join(hex(&hasher.finalize()));
        path.exists()
            .then(|| verify_envelope(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    pub fn owner_files(&self) -> Vec<PathBuf> {
        files_in(&self.state_dir.join("owners"))
    }

    /// The invariant every crash, race and DEL must keep: each owner names a container whose
    /// record exists and holds the same pod key (or was set aside, failing its checksum, and
    /// blocks the DELs that need it: the store then trusts the owner). An owner keyed by pod
    /// name (`podKey: "name"`) lists its interfaces: one record of them is enough.
    /// A temp file of a writer that is dead (`.<pid>.tmp`) is no owner: it is never renamed
    /// into place, and the store's listings skip names that start with a dot.
    pub fn assert_every_owner_has_its_record(&self) {
        for path in self.owner_files() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let writer = name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".tmp"))
                .and_then(|pid| pid.parse::<u32>().ok());
            if writer.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                continue;
            }
            let Ok(owner) = verify_envelope(&path) else {
                continue;
            };
            let container = owner["containerId"].as_str().unwrap();
            let ifnames: Vec<&str> = match owner["ifName"].as_str() {
                Some(ifname) => vec![ifname],
                None => owner["interfaces"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_str().unwrap())
                    .collect(),
            };
            let mut reasons = Vec::new();
            let backed = ifnames.iter().any(|ifname| {
                let record_path =
                    self.record_path(owner["network"].as_str().unwrap(), container, ifname);
                if !entry_exists(&record_path)
                    && entry_exists(
                        &self
                            .state_dir
                            .join("set-aside")
                            .join(record_path.file_name().unwrap()),
                    )
                {
                    return true;
                }
                let record = match verify_envelope(&record_path) {
                    Ok(record) => record,
                    Err(e) => {
                        reasons.push(format!("{ifname}: {e}"));
                        return false;
                    }
                };
                let fields: &[&str] = if owner["ifName"].is_string() {
                    &["network", "podNamespace", "podName", "ifName"]
                } else {
                    &["network", "podNamespace", "podName"]
                };
                fields.iter().all(|field| {
                    let same = owner[*field] == record[*field];
                    if !same {
                        reasons.push(format!("{ifname}: owner and record disagree on {field}"));
                    }
                    same
                })
            });
            assert!(
                backed,
                "owner {} has no record: {reasons:?}",
                path.display()
            );
        }
    }

    pub fn log_lines(&self) -> Vec<LogLine> {
        let text = std::fs::read_to_string(&self.log_file).unwrap_or_default();
        text.lines().map(LogLine::parse).collect()
    }

    /// Every non-directory entry under the state dir (symlinks as their target) except the
    /// lock file, whose mere existence says nothing, and the refusal ledger's entries, which
    /// count the very refusals a snapshot is taken around (`ledger_entry` reads them). Comparing
    /// two snapshots catches temp files and records left behind whatever they are named.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        for path in walk(&self.state_dir) {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let relative = path.strip_prefix(&self.state_dir).unwrap().to_path_buf();
            let ledger_entry = relative.starts_with("ledger")
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if meta.is_dir() || relative == Path::new("lock") || ledger_entry {
                continue;
            }
            let content = if meta.file_type().is_symlink() {
                format!(
                    "symlink -> {}",
                    std::fs::read_link(&path).unwrap().display()
                )
                .into_bytes()
            } else {
                std::fs::read(&path).unwrap()
            };
            files.insert(relative, content);
        }
        files
    }
}

/// The operator CLI as an operator runs it: the plugin binary with `args`, no stdin, and an
/// environment of PATH alone (no CNI_* variable leaks in from the test).
fn guard_command(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", PATH)
        .stdin(Stdio::null());
    command
}

/// The doctor's findings (JSON) for `state_dir`, with a conf dir of its own, run by `run`
/// (the guard as it is, or under a wrapper).
pub fn doctor_findings(
    state_dir: &Path,
    extra: &[&str],
    run: impl Fn(&[&str]) -> std::process::Output,
) -> Vec<Value> {
    let conf = TempDir::new("sgdoc");
    let args = [
        &[
            "--doctor",
            "--output",
            "json",
            "--conf-dir",
            conf.path.to_str().unwrap(),
            "--state-dir",
            state_dir.to_str().unwrap(),
        ],
        extra,
    ]
    .concat();
    let out = run(&args);
    let body: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the report is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    body["findings"].as_array().cloned().unwrap_or_default()
}

/// Runs the operator CLI (`--dump-checkpoints`, `--restore`, `--doctor`, `--help`) and
/// returns what it said, whatever its exit status.
pub fn guard(args: &[&str]) -> Output {
    guard_command(bin(), args)
        .output()
        .unwrap_or_else(|e| panic!("cannot exec {}: {e}", bin()))
}

/// `guard` with these environment variables besides PATH (e.g. the doctor's CNI_PATH).
pub fn guard_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = guard_command(bin(), args);
    command.envs(env.iter().copied());
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot exec {}: {e}", bin()))
}

/// `guard`, panicking with both streams unless it exits 0.
pub fn guard_ok(args: &[&str]) -> Output {
    let out = guard(args);
    crate::sys::assert_succeeded("sandbox-guard", args, &out);
    out
}

/// `guard` inside `netns` (through `ip netns exec`, which also gives it that namespace's
/// /sys/class/net).
pub fn guard_in(netns: &Netns, args: &[&str]) -> Output {
    let mut wrapped = vec!["netns", "exec", netns.name.as_str(), bin()];
    wrapped.extend_from_slice(args);
    guard_command("ip", &wrapped)
        .output()
        .unwrap_or_else(|e| panic!("cannot exec {} in {}: {e}", bin(), netns.name))
}

/// The operator CLI left running with its stdout piped and unread, as behind a pager nobody
/// scrolls; the caller kills it.
pub fn spawn_guard(args: &[&str]) -> Child {
    guard_command(bin(), args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot exec {}: {e}", bin()))
}

/// `--dump-checkpoints --output json` of `state_dir` with extra filter arguments; panics
/// unless it exits 0 with a JSON array.
pub fn dump_checkpoints(state_dir: &Path, filters: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "--dump-checkpoints",
        "--state-dir",
        state_dir.to_str().unwrap(),
        "--output",
        "json",
    ];
    args.extend_from_slice(filters);
    let out = guard_ok(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str(&stdout) {
        Ok(Value::Array(entries)) => entries,
        other => panic!("dump output is not a JSON array ({other:?}): {stdout}"),
    }
}

/// Every path below `dir` (not following symlinks), `dir` excluded; empty if it is missing.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let is_dir = std::fs::symlink_metadata(&path)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        found.push(path.clone());
        if is_dir {
            found.extend(walk(&path));
        }
    }
    found
}

/// The direct entries of `dir`, sorted; empty if it is missing.
pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

pub fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Flips the first digit of `needle` in the file at `path`, so that its checksum fails;
/// returns the corrupted bytes.
pub fn corrupt_one_digit(path: &Path, needle: &[u8]) -> Vec<u8> {
    let mut bytes = read_entry(path).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{} does not hold the value to corrupt", path.display()));
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    write_entry_like(path, &bytes);
    bytes
}

/// Copies a state dir kept under testdata/ with the modes the plugin gives (git keeps no 0600).
pub fn copy_state_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_state_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

/// The bytes of a store entry: a regular file's content, or the target of a symlink (the form
/// ownerships, address index entries and records on a journal take), read without following
/// it, a record's expanded as the guard expands it.
pub fn read_entry(path: &Path) -> std::io::Result<Vec<u8>> {
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        let target = std::fs::read_link(path)?;
        Ok(entry_text::expand(target.as_os_str().as_encoded_bytes()).into_owned())
    } else {
        std::fs::read(path)
    }
}

/// Whether the store has an entry at `path`, in either form (`Path::exists` follows a symlink,
/// and a record's or an ownership's target is its text, no path).
pub fn entry_exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Puts `bytes` at `path` as a regular file (0600) in place of the entry there, whatever its
/// form: the store reads either, and a symlink cannot hold every damage a test makes.
pub fn put_file(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Rewrites a store entry in the form it has: a symlink's target (a record's compacted as
/// the guard compacts it), or a file's content.
pub fn write_entry_like(path: &Path, bytes: &[u8]) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(path).unwrap();
        let in_records = path.parent().is_some_and(|dir| dir.ends_with("records"));
        let bytes = match in_records {
            true => entry_text::compact(bytes).unwrap_or_else(|| bytes.to_vec()),
            false => bytes.to_vec(),
        };
        let target = std::ffi::OsStr::from_bytes(bytes.strip_suffix(b"\n").unwrap_or(&bytes));
        std::os::unix::fs::symlink(target, path).unwrap();
    } else {
        std::fs::write(path, bytes).unwrap();
    }
}

/// Parses a store file `{"checksum":"sha256:<hex>","record":{...}}` and checks the checksum
/// against the exact bytes of `record`; returns the record.
pub fn verify_envelope(path: &Path) -> Result<Value, String> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        checksum: String,
        #[serde(borrow)]
        record: &'a RawValue,
    }
    let bytes = read_entry(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let envelope: Envelope =
        serde_json::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
    let expected = format!("sha256:{}", sha256_hex(envelope.record.get().as_bytes()));
    if envelope.checksum != expected {
        return Err(format!(
            "{}: checksum {} but the record hashes to {expected}",
            path.display(),
            envelope.checksum
        ));
    }
    serde_json::from_str(envelope.record.get()).map_err(|e| format!("{}: {e}", path.display()))
}

#[derive(Clone)]
enum PrevResult {
    /// What libcni would pass: the primary plugin's result on ADD and CHECK, and the cached
    /// one on DEL from 0.4.0 on.
    Default,
    Absent,
    Raw(String),
}

/// Builder methods of `Cni` that each set one text field: `name => field`.
macro_rules! text_setters {
    ($($(#[$doc:meta])* $name:ident => $field:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: &str) -> Cni {
                self.$field = value.into();
                self
            }
        )*
    };
}

/// One plugin invocation, built up like a runtime would and run with `run()` or `spawn()`.
#[derive(Clone)]
pub struct Cni {
    verb: String,
    container: String,
    cni_version: String,
    network: String,
    ifname: String,
    netns: Option<String>,
    cni_args: String,
    prev_result: PrevResult,
    config_overrides: Vec<(String, Option<Value>)>,
    env_overrides: Vec<(String, Option<String>)>,
    stdin_override: Option<Vec<u8>>,
    wrapper: Vec<String>,
    state_dir: PathBuf,
    log_file: PathBuf,
}

impl Cni {
    fn new(verb: &str, container: &str, state_dir: &Path, log_file: &Path) -> Cni {
        Cni {
            verb: verb.into(),
            container: container.into(),
            cni_version: LATEST_VERSION.into(),
            network: NETWORK.into(),
            ifname: "eth0".into(),
            netns: None,
            cni_args: String::new(),
            prev_result: PrevResult::Default,
            config_overrides: Vec::new(),
            env_overrides: Vec::new(),
            stdin_override: None,
            wrapper: Vec::new(),
            state_dir: state_dir.to_path_buf(),
            log_file: log_file.to_path_buf(),
        }
    }

    /// An invocation whose stdin is `config` whole, as a runtime built it from a conflist
    /// that is not a `Store`'s (its `name` and `cniVersion` included).
    pub fn with_config(verb: &str, container: &str, config: &Value) -> Cni {
        let mut call = Cni::new(verb, container, Path::new(""), Path::new(""))
            .stdin(config.to_string().into_bytes());
        call.network = config["name"].as_str().unwrap_or(NETWORK).into();
        call.cni_version = config["cniVersion"]
            .as_str()
            .unwrap_or(LATEST_VERSION)
            .into();
        call
    }

    pub fn pod(mut self, pod: &Pod) -> Cni {
        self.cni_args = pod.cni_args(&self.container);
        self
    }

    text_setters! {
        /// CNI_ARGS exactly as given.
        cni_args => cni_args,
        /// The cniVersion of the config.
        version => cni_version,
        /// The network name, `name` of the config.
        network => network,
        /// CNI_IFNAME.
        ifname => ifname,
    }

    pub fn netns(mut self, netns: &str) -> Cni {
        self.netns = Some(netns.into());
        self
    }

    pub fn no_prev_result(mut self) -> Cni {
        self.prev_result = PrevResult::Absent;
        self
    }

    /// The prevResult exactly as these bytes, spliced into stdin untouched.
    pub fn prev_result_raw(mut self, raw: &str) -> Cni {
        self.prev_result = PrevResult::Raw(raw.into());
        self
    }

    pub fn prev_result(self, result: &Value) -> Cni {
        let raw = result.to_string();
        self.prev_result_raw(&raw)
    }

    /// Sets (or with `None` removes) a top-level key of the plugin's config.
    pub fn config(mut self, key: &str, value: Option<Value>) -> Cni {
        self.config_overrides.push((key.into(), value));
        self
    }

    /// Sets (or with `None` removes) an environment variable after the runtime-like defaults.
    pub fn env(mut self, key: &str, value: Option<&str>) -> Cni {
        self.env_overrides
            .push((key.into(), value.map(String::from)));
        self
    }

    pub fn stdin(mut self, bytes: Vec<u8>) -> Cni {
        self.stdin_override = Some(bytes);
        self
    }

    /// Runs the plugin as the last argument of `wrapper` (a shell setting a umask, an
    /// unshare placing it at a chosen pid); the wrapper must pass stdin and stdout through.
    pub fn wrapped_in(mut self, wrapper: &[&str]) -> Cni {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn container(&self) -> &str {
        &self.container
    }

    pub fn verb(&self) -> &str {
        &self.verb
    }

    pub fn network_name(&self) -> &str {
        &self.network
    }

    pub fn netns_path(&self) -> String {
        self.netns
            .clone()
            .unwrap_or_else(|| default_netns(&self.container))
    }

    /// The primary plugin's result this invocation passes by default.
    pub fn default_prev_result(&self) -> Value {
        prev_result_for(
            &self.cni_version,
            &self.container,
            &self.ifname,
            &self.netns_path(),
        )
    }

    fn attachment_scoped(&self) -> bool {
        matches!(self.verb.as_str(), "ADD" | "DEL" | "CHECK")
    }

    fn environment(&self) -> Vec<(String, Option<String>)> {
        let (container, netns, ifname, args) = if self.verb == "VERSION" {
            // libcni's GetVersionInfo fills these with fake values for old skel-based plugins.
            (
                String::new(),
                "dummy".to_string(),
                "dummy".to_string(),
                String::new(),
            )
        } else if self.attachment_scoped() {
            (
                self.container.clone(),
                self.netns_path(),
                self.ifname.clone(),
                self.cni_args.clone(),
            )
        } else {
            Default::default()
        };
        let mut env = vec![
            ("PATH".to_string(), Some(PATH.to_string())),
            ("CNI_COMMAND".to_string(), Some(self.verb.clone())),
            ("CNI_CONTAINERID".to_string(), Some(container)),
            ("CNI_NETNS".to_string(), Some(netns)),
            ("CNI_ARGS".to_string(), Some(args)),
            ("CNI_IFNAME".to_string(), Some(ifname)),
            ("CNI_PATH".to_string(), Some(CNI_PATH.to_string())),
        ];
        for (key, value) in &self.env_overrides {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        env
    }

    /// The plugin entry as libcni hands it over, prevResult spliced in as raw bytes.
    pub fn stdin_bytes(&self) -> Vec<u8> {
        if let Some(bytes) = &self.stdin_override {
            return bytes.clone();
        }
        if self.verb == "VERSION" {
            return format!(r#"{{"cniVersion":"{}"}}"#, self.cni_version).into_bytes();
        }
        let mut config = Map::new();
        config.insert("cniVersion".into(), json!(self.cni_version));
        config.insert("name".into(), json!(self.network));
        config.insert("type".into(), json!("sandbox-guard"));
        config.insert("stateDir".into(), json!(self.state_dir));
        config.insert("staleDel".into(), json!("refuse"));
        config.insert("logFile".into(), json!(self.log_file));
        for (key, value) in &self.config_overrides {
            match value {
                Some(value) => config.insert(key.clone(), value.clone()),
                None => config.remove(key),
            };
        }
        let mut text = Value::Object(config).to_string();
        let prev_result = match &self.prev_result {
            PrevResult::Raw(raw) => Some(raw.clone()),
            PrevResult::Default if self.passes_cached_result() => {
                Some(self.default_prev_result().to_string())
            }
            _ => None,
        };
        if let Some(raw) = prev_result {
            text.pop();
            text.push_str(&format!(r#","prevResult":{raw}}}"#));
        }
        text.into_bytes()
    }

    fn passes_cached_result(&self) -> bool {
        match self.verb.as_str() {
            "ADD" | "CHECK" => true,
            "DEL" => !self.cni_version.starts_with("0.3."),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        let args = if self.cni_args.is_empty() {
            "-"
        } else {
            &self.cni_args
        };
        format!(
            "{} v{} network={} container={} ifname={} args={args}",
            self.verb, self.cni_version, self.network, self.container, self.ifname
        )
    }

    /// Gives this attachment a real sandbox netns, as the runtime and the primary plugin
    /// leave it before the guard runs: the interface inside, up, with the MAC, address and
    /// default route of the default prevResult. The plugin reads the kernel at ADD and
    /// CHECK; a path to nothing would test another situation. Needs root.
    pub fn in_pod_netns(self) -> (Cni, PodNetns) {
        let netns = Netns::new("sgpod");
        let (call, host_end) = self.with_interface_in(&netns);
        (
            call,
            PodNetns {
                _host_end: host_end,
                netns,
            },
        )
    }

    /// This call's interface (a veth end named by its ifname, with its default result's MAC
    /// and address) made in `netns`, which may hold other interfaces of the sandbox.
    pub fn with_interface_in(self, netns: &Netns) -> (Cni, HostLink) {
        let call = self.netns(netns.path().to_str().unwrap());
        let result = call.default_prev_result();
        let (mac, address) = (
            result["interfaces"][0]["mac"].as_str().unwrap(),
            result["ips"][0]["address"].as_str().unwrap(),
        );
        let gateway = result["ips"][0]["gateway"].as_str().unwrap();
        let host_end = HostLink {
            name: unique("sgh"),
        };
        let pod_end = unique("sgp");
        run(
            "ip",
            &[
                "link",
                "add",
                &host_end.name,
                "type",
                "veth",
                "peer",
                "name",
                &pod_end,
            ],
        );
        run("ip", &["link", "set", &pod_end, "netns", &netns.name]);
        run("ip", &["link", "set", &host_end.name, "up"]);
        let ifname = call.ifname.as_str();
        netns.exec(&["ip", "link", "set", &pod_end, "name", ifname]);
        netns.exec(&["ip", "link", "set", ifname, "address", mac, "up"]);
        netns.exec(&["ip", "addr", "add", address, "dev", ifname]);
        if netns
            .exec(&["ip", "route", "show", "default"])
            .stdout
            .is_empty()
        {
            netns.exec(&[
                "ip", "route", "add", "default", "via", gateway, "dev", ifname,
            ]);
        }
        (call, host_end)
    }

    pub fn spawn(&self) -> Running {
        self.spawn_read_for(None)
    }

    /// `spawn`, the read ends of its stdout and stderr closed `after` in, unread: as when the
    /// runtime that ran the plugin exits before it could kill it (a containerd restart;
    /// libcni's exec reads both through pipes).
    pub fn spawn_runtime_gone_after(&self, after: Duration) -> Running {
        self.spawn_read_for(Some(after))
    }

    fn spawn_read_for(&self, gone_after: Option<Duration>) -> Running {
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut wrapped = Command::new(program);
                wrapped.args(args).arg(bin());
                wrapped
            }
            None => Command::new(bin()),
        };
        command
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in self.environment() {
            if let Some(value) = value {
                command.env(key, value);
            }
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot exec {}: {e}", bin()));
        let stdin = self.stdin_bytes();
        let mut pipe = child.stdin.take().unwrap();
        // A plugin may stop reading early (oversized input) and exit: a broken pipe is its answer.
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&stdin);
        });
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let (stdout, stderr) = match gone_after {
            None => (drain(stdout), drain(stderr)),
            Some(after) => (
                std::thread::spawn(move || {
                    std::thread::sleep(after);
                    drop((stdout, stderr));
                    Vec::new()
                }),
                std::thread::spawn(Vec::new),
            ),
        };
        Running {
            pid: child.id(),
            child,
            writer,
            stdout,
            stderr,
            what: self.describe(),
        }
    }

    pub fn run(&self) -> Reply {
        self.spawn().wait()
    }

    /// Runs under strace, which SIGKILLs the plugin on entry to its `nth` call of `syscalls`
    /// (comma separated). Each traced process counts its own calls.
    pub fn run_killed_at(self, traced: Traced, syscalls: &str, nth: usize) -> Reply {
        let inject = format!("inject={syscalls}:signal=SIGKILL:when={nth}");
        let trace = format!("trace={syscalls}");
        let follow: &[&str] = match traced {
            Traced::WithChildren => &["-f"],
            Traced::PluginOnly => &[],
        };
        let strace = [
            &["strace"],
            follow,
            &["-qq", "-o", "/dev/null", "-e", &trace, "-e", &inject],
        ]
        .concat();
        self.wrapped_in(&strace).run()
    }
}

/// Which processes of a plugin exec strace follows.
#[derive(Clone, Copy, Debug)]
pub enum Traced {
    /// The plugin and whatever it starts, each counting (and killed at) its own calls.
    WithChildren,
    /// The plugin alone: the primary a delegate-mode guard runs is neither counted nor killed.
    PluginOnly,
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

pub fn default_netns(container: &str) -> String {
    let short: String = container
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect();
    format!("/var/run/netns/cni-{short}")
}

/// A primary plugin's result (calico/bridge-like) for `version`: one interface in the sandbox,
/// one IPv4 address derived from the attachment, a default route.
pub fn prev_result_for(version: &str, container: &str, ifname: &str, netns: &str) -> Value {
    let digest = Sha256::digest(format!("{container}/{ifname}").as_bytes());
    let address = format!("10.22.{}.{}/16", digest[0], digest[1].max(2));
    let mac = format!(
        "0a:58:{:02x}:{:02x}:{:02x}:{:02x}",
        digest[2], digest[3], digest[4], digest[5]
    );
    if LEGACY_VERSIONS.contains(&version) {
        return json!({
            "cniVersion": version,
            "ip4": {"ip": address, "gateway": "10.22.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}]},
            "dns": {}
        });
    }
    let mut ip = json!({"address": address, "gateway": "10.22.0.1", "interface": 0});
    if version.starts_with("0.") {
        ip["version"] = json!("4");
    }
    json!({
        "cniVersion": version,
        "interfaces": [{"name": ifname, "mac": mac, "sandbox": netns}],
        "ips": [ip],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
        "dns": {}
    })
}

/// A sandbox's network namespace with its interface; both go away on drop.
pub struct PodNetns {
    // Declared first, so dropped first: the veth pair goes before its namespace.
    _host_end: HostLink,
    pub netns: Netns,
}

impl PodNetns {
    pub fn path(&self) -> String {
        self.netns.path().to_str().unwrap().to_string()
    }
}

/// A plugin process in flight.
pub struct Running {
    pub pid: u32,
    child: Child,
    writer: JoinHandle<()>,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
    what: String,
}

impl Running {
    /// SIGKILLs the plugin unless it already exited; true when the kill landed.
    pub fn kill(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None)) && self.child.kill().is_ok()
    }

    pub fn wait(mut self) -> Reply {
        let deadline = Instant::now() + EXEC_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the plugin") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{} hung for {EXEC_TIMEOUT:?} (pid {})", self.what, self.pid);
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        let _ = self.writer.join();
        Reply {
            status,
            stdout: String::from_utf8_lossy(&self.stdout.join().unwrap()).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr.join().unwrap()).into_owned(),
            pid: self.pid,
            what: self.what,
        }
    }
}

/// What one invocation answered.
#[derive(Debug)]
pub struct Reply {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub pid: u32,
    pub what: String,
}

/// A `msg` says what happened in a sentence; the longer text goes in `details`.
pub const MAX_MSG_PROSE: usize = 200;

/// The length of `msg` without the names it must quote whole: paths and container IDs.
pub fn prose_length(msg: &str) -> usize {
    msg.split(|c: char| {
        c.is_whitespace() || c == '`' || c == ',' || c == ';' || c == '(' || c == ')'
    })
    .filter(|word| {
        !(word.starts_with('/')
            || (word.len() >= 32 && word.bytes().all(|b| b.is_ascii_hexdigit())))
    })
    .map(|word| word.chars().count() + 1)
    .sum()
}

/// The CNI error object a failed invocation printed.
#[derive(Debug)]
pub struct CniError {
    pub code: u64,
    pub msg: String,
    pub details: String,
}

impl CniError {
    /// msg and details together, for "does the answer mention X" checks.
    pub fn text(&self) -> String {
        format!("{}\n{}", self.msg, self.details)
    }
}

impl Reply {
    fn context(&self) -> String {
        format!(
            "{}\nstatus: {}\nstdout: {}\nstderr: {}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    pub fn succeeded(&self) -> bool {
        self.status.success()
    }

    pub fn assert_ok(&self) -> &Reply {
        assert!(
            self.status.success(),
            "expected success:\n{}",
            self.context()
        );
        self
    }

    /// stdout parsed as exactly one JSON value.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", self.context()))
    }

    /// A CNI error as the spec shapes it: no crash, non-zero exit, stdout one JSON object with
    /// a string cniVersion, a numeric code and a non-empty msg.
    pub fn assert_cni_error(&self) -> CniError {
        assert!(
            self.status.signal().is_none(),
            "the plugin died of a signal:\n{}",
            self.context()
        );
        assert!(
            !self.status.success(),
            "expected a CNI error:\n{}",
            self.context()
        );
        let body = self.json();
        assert!(
            body.is_object(),
            "the error is not a JSON object:\n{}",
            self.context()
        );
        assert!(
            body["cniVersion"].is_string(),
            "the error has no cniVersion:\n{}",
            self.context()
        );
        let code = body["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("the error has no numeric code:\n{}", self.context()));
        let msg = body["msg"].as_str().unwrap_or_default().to_string();
        assert!(!msg.is_empty(), "the error has no msg:\n{}", self.context());
        let details = body["details"].as_str().unwrap_or_default().to_string();
        let prose = prose_length(&msg);
        assert!(
            prose <= MAX_MSG_PROSE,
            "msg has {prose} characters of prose (at most {MAX_MSG_PROSE}): the way out goes in details:\n{}",
            self.context()
        );
        CniError { code, msg, details }
    }

    pub fn assert_error(&self, code: u64) -> CniError {
        self.assert_error_in(&[code])
    }

    pub fn assert_error_in(&self, codes: &[u64]) -> CniError {
        let error = self.assert_cni_error();
        assert!(
            codes.contains(&error.code),
            "expected error code {codes:?}, got {}:\n{}",
            error.code,
            self.context()
        );
        error
    }
}

/// One line of the plugin's log file, read by the guard's own parser (`LogEntry::parse`):
/// `<time> sandbox-guard[<pid>] <LEVEL> <VERB> network=.. container=.. ifname=.. pod=ns/name|- outcome=.. <text>`.
/// A line it cannot read, or an outcome that is not one of the guard's names, fails the test.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub time: String,
    pub pid: u32,
    pub level: String,
    pub verb: String,
    pub network: String,
    pub container: String,
    pub ifname: String,
    pub pod: String,
    pub outcome: Outcome,
    pub raw: String,
}

impl LogLine {
    pub fn parse(line: &str) -> LogLine {
        let entry = LogEntry::parse(line)
            .unwrap_or_else(|| panic!("the guard's parser cannot read: {line}"));
        let pid = match line.starts_with('{') {
            true => serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|object| object["pid"].as_u64())
                .and_then(|pid| u32::try_from(pid).ok()),
            false => line
                .split(' ')
                .nth(1)
                .and_then(|program| program.strip_prefix("sandbox-guard["))
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|pid| pid.parse().ok()),
        }
        .unwrap_or_else(|| panic!("log line lacks its pid: {line}"));
        let field = |key: &str| {
            entry
                .field(key)
                .unwrap_or_else(|| panic!("log line lacks {key}=: {line}"))
                .to_string()
        };
        LogLine {
            pid,
            network: field("network"),
            container: field("container"),
            ifname: field("ifname"),
            pod: field("pod"),
            outcome: entry
                .outcome()
                .unwrap_or_else(|| panic!("log line's outcome is none of the guard's: {line}")),
            time: entry.time,
            level: entry.level,
            verb: entry.verb,
            raw: line.to_string(),
        }
    }
}

/// Random operations from several threads at once, each thread with its own seeded
/// generator, so that a failing run replays the same sequences.
pub struct Workload {
    pub workers: u64,
    pub ops_per_worker: usize,
    pub seed: u64,
}

impl Workload {
    pub fn total(&self) -> usize {
        self.workers as usize * self.ops_per_worker
    }

    /// Runs `op` `ops_per_worker` times on each of `workers` threads (worker `w` draws from
    /// `SeededRng::new(seed + w)`) and returns what every call returned.
    pub fn run<T: Send>(&self, op: impl Fn(&mut SeededRng) -> T + Sync) -> Vec<T> {
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.workers)
                .map(|worker| {
                    let op = &op;
                    scope.spawn(move || {
                        let mut rng = SeededRng::new(self.seed + worker);
                        (0..self.ops_per_worker)
                            .map(|_| op(&mut rng))
                            .collect::<Vec<T>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        })
    }
}

/// A small seeded generator (xorshift64*), so a failing random sequence can be replayed.
pub struct SeededRng(u64);

impl SeededRng {
    pub fn new(seed: u64) -> SeededRng {
        SeededRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }
}
