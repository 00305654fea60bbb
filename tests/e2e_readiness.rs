//! `--install --check` against a live containerd: the probe asks containerd's CRI Status what
//! it loaded over its hand-written client, and its answer is compared with what containerd
//! says it loaded to a generated gRPC client (tests/cri-client `info`, the tonic client
//! cri_node.rs uses; `crictl info` prints the same map).
//! containerd 1.6 is Debian's (as in cri_node.rs); 2.2 is the binary the real node caches
//! under /var/cache/sg-node. Each runs as a private process with its state, socket and CNI
//! dirs in a temp dir, no pod started: CRI Status is all the probe reads. The cases are the
//! ones where the files and the runtime disagree: containerd's conf syncer reloads on writes,
//! renames and removals in the conf dir and ignores creations, so a write to a symlink's
//! target and a conf moved in from another dir stay unloaded; a bin dir containerd does not
//! search; the guard not last; a broken conf that leaves containerd no network.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/cri_node.rs"]
mod cri_node;
#[path = "support/install.rs"]
mod install;
#[path = "support/loaded.rs"]
mod loaded;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CONTAINERD_2: &str = "/var/cache/sg-node/bin/containerd-2.2.9/containerd";

#[derive(Clone, Copy, Debug)]
enum Version {
    /// Debian's containerd 1.6 from PATH, CRI plugin `io.containerd.grpc.v1.cri`.
    Debian16,
    /// containerd 2.2, CRI's CNI settings under `io.containerd.cri.v1.runtime`.
    V22,
}

impl Version {
    fn binary(self) -> &'static str {
        match self {
            Version::Debian16 => "containerd",
            Version::V22 => CONTAINERD_2,
        }
    }
}

/// True when the test may go on: root, this containerd, the reference plugins and protoc
/// (for tests/cri-client) present (under CI=true a missing one fails, naming it).
fn require(test: &str, version: Version) -> bool {
    sys::require(
        test,
        true,
        &[
            version.binary(),
            "/usr/lib/cni/bridge",
            "/usr/lib/cni/portmap",
            "protoc",
        ],
    )
}

/// A containerd whose CRI plugin reads `net.d` and searches `bin` for plugins.
struct Containerd {
    child: Child,
    dir: sys::TempDir,
    version: Version,
}

impl Containerd {
    fn start(version: Version) -> Containerd {
        let dir = sys::TempDir::new("sgready");
        let root = dir.path.clone();
        for sub in ["bin", "net.d", "elsewhere", "store"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        fs::write(root.join("config.toml"), config(version, &root)).unwrap();
        let log = fs::File::create(root.join("containerd.log")).unwrap();
        let child = Command::new(version.binary())
            .arg("--config")
            .arg(root.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", version.binary()));
        let node = Containerd {
            child,
            dir,
            version,
        };
        node.wait_for("containerd serves CRI", |info| info.is_some());
        node
    }

    fn root(&self) -> &Path {
        &self.dir.path
    }

    fn socket(&self) -> PathBuf {
        self.root().join("containerd.sock")
    }

    /// The verbose CRI Status's info map, through the generated client: what containerd
    /// says it loaded.
    fn cri_info(&self) -> Option<Value> {
        let out = Command::new("timeout")
            .arg("30")
            .arg(cri_node::cri_client_binary())
            .arg("--socket")
            .arg(self.socket())
            .arg("info")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// The plugin types of the network containerd gives pods (`eth0`), per containerd.
    fn loaded_types(&self) -> Vec<String> {
        self.cri_info()
            .map(|info| eth0_types(&info))
            .unwrap_or_default()
    }

    /// Waits (bounded) until containerd's own view satisfies `done`; a runtime that never
    /// gets there fails the test with its log.
    fn wait_for(&self, what: &str, done: impl Fn(Option<Value>) -> bool) {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if done(self.cri_info()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "{:?}: {what} did not happen; containerd's log:\n{}",
            self.version,
            fs::read_to_string(self.root().join("containerd.log")).unwrap_or_default()
        );
    }

    fn wait_until_loaded(&self, types: &[&str]) {
        self.wait_for(&format!("containerd loads {types:?}"), |info| {
            info.is_some_and(|info| eth0_types(&info) == types)
        });
    }

    /// `--install --check` asking this containerd (or only the files: `socket` "none").
    fn check(&self, socket: &str, bin_dir: &Path) -> (bool, String) {
        let socket = if socket == "none" {
            "none".to_string()
        } else {
            self.socket().display().to_string()
        };
        let out = cni::guard(&[
            "--install",
            "--check",
            "--conf-dir",
            self.root().join("net.d").to_str().unwrap(),
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--runtime-socket",
            &socket,
        ]);
        (out.status.success(), said(&out))
    }

    /// `--doctor` asking this containerd: its `cni-runtime` finding.
    fn doctor_says(&self) -> String {
        let out = cni::guard(&[
            "--doctor",
            "--conf-dir",
            self.root().join("net.d").to_str().unwrap(),
            "--runtime-socket",
            self.socket().to_str().unwrap(),
            "-o",
            "json",
        ]);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("--doctor -o json: {e}: {}", said(&out)));
        let found: Vec<String> = report["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["check"] == "cni-runtime")
            .map(|f| format!("{} {}", f["severity"], f["summary"]))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{:?}: one cni-runtime finding: {}",
            self.version,
            said(&out)
        );
        found[0].clone()
    }

    /// The probe asking this containerd, its verdict checked against containerd's own
    /// answer (tests/support/loaded.rs).
    fn asked(&self) -> (bool, String) {
        let said = self.check("asked", &self.root().join("bin"));
        assert!(
            said.1.starts_with(&format!(
                "source: containerd CRI status ({})",
                self.socket().display()
            )),
            "{:?}: the probe did not say it asked containerd: {}",
            self.version,
            said.1
        );
        assert_eq!(
            said.0,
            loaded::ready_per_containerd(&self.cri_info().unwrap()),
            "{:?}: the probe and containerd's own answer differ: {}",
            self.version,
            said.1
        );
        said
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn eth0_types(info: &Value) -> Vec<String> {
    info["cniconfig"]["Networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["IFName"] == "eth0")
        .map(|n| {
            n["Config"]["Plugins"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    p["Network"]["type"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn config(version: Version, root: &Path) -> String {
    let r = root.display();
    let common = format!(
        r#"root = "{r}/root"
state = "{r}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]
[grpc]
  address = "{r}/containerd.sock"
[ttrpc]
  address = "{r}/containerd.sock.ttrpc"
"#
    );
    match version {
        Version::Debian16 => format!(
            r#"version = 2
{common}[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{r}/bin"
    conf_dir = "{r}/net.d"
    max_conf_num = 1
"#
        ),
        Version::V22 => format!(
            r#"version = 3
{common}[plugins.'io.containerd.internal.v1.opt']
  path = "{r}/opt"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{r}/bin"]
    conf_dir = "{r}/net.d"
    max_conf_num = 1
"#
        ),
    }
}

fn bridge() -> Value {
    json!({"type": "bridge", "bridge": "sgready0", "ipam": {}})
}

fn guard() -> Value {
    json!({"type": "sandbox-guard", "stateDir": "/var/lib/cni/sandbox-guard-readiness-test"})
}

fn conflist(plugins: Vec<Value>) -> String {
    json!({"cniVersion": "1.0.0", "name": "pods", "plugins": plugins}).to_string()
}

fn link_plugins(dir: &Path) {
    std::os::unix::fs::symlink("/usr/lib/cni/bridge", dir.join("bridge")).unwrap();
    std::os::unix::fs::symlink("/usr/lib/cni/portmap", dir.join("portmap")).unwrap();
    std::os::unix::fs::symlink(cni::bin(), dir.join("sandbox-guard")).unwrap();
}

/// Writes `text` to `file` through a temp file, as installers do.
fn replace(file: &Path, text: &str) {
    let tmp = file.with_extension("tmp-write");
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, file).unwrap();
}

fn ready_where_containerd_loaded_the_guard(version: Version) {
    let node = Containerd::start(version);
    link_plugins(&node.root().join("bin"));
    let file = node.root().join("net.d/10-pods.conflist");

    replace(&file, &conflist(vec![bridge(), guard()]));
    node.wait_until_loaded(&["bridge", "sandbox-guard"]);
    let (ready, said) = node.asked();
    assert!(
        ready && said.contains("(chained, last)"),
        "{version:?}: {said}"
    );

    let mut wrapper = guard();
    wrapper["delegate"] = bridge();
    replace(&file, &conflist(vec![wrapper]));
    node.wait_until_loaded(&["sandbox-guard"]);
    let (ready, said) = node.asked();
    assert!(
        ready && said.contains("delegate, wrapping bridge"),
        "{version:?}: {said}"
    );

    // The guard in the list, not last: first on ADD, last on DEL, too late to refuse.
    replace(
        &file,
        &conflist(vec![
            bridge(),
            guard(),
            json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        ]),
    );
    node.wait_until_loaded(&["bridge", "sandbox-guard", "portmap"]);
    let (ready, said) = node.asked();
    assert!(
        !ready && said.contains("neither the last plugin"),
        "{version:?}: {said}"
    );

    // A broken file sorting first: containerd's reload fails and leaves it no network.
    replace(&file, &conflist(vec![bridge(), guard()]));
    node.wait_until_loaded(&["bridge", "sandbox-guard"]);
    replace(
        &node.root().join("net.d/05-broken.conflist"),
        "{\"plugins\": [",
    );
    node.wait_until_loaded(&[]);
    let (ready, said) = node.asked();
    assert!(
        !ready && said.contains("has loaded no network") && said.contains("05-broken.conflist"),
        "{version:?}: {said}"
    );
}

/// A write event in the conf dir: containerd's conf syncer reloads on writes, renames and
/// removals, and ignores creations (a symlink made, a file moved in from another dir).
fn nudge(node: &Containerd) {
    let file = node.root().join("net.d/nudge.txt");
    fs::write(&file, "reload").unwrap();
    fs::remove_file(&file).unwrap();
}

/// The files probe says ready, containerd still runs the network without the guard, and
/// the probe that asks containerd says not ready, as containerd's own answer does.
fn files_say_ready_containerd_runs_no_guard(node: &Containerd, case: &str) {
    let version = node.version;
    let (files_ready, files_said) = node.check("none", &node.root().join("bin"));
    assert!(files_ready, "{version:?}: {case}: {files_said}");
    assert_eq!(
        node.loaded_types(),
        ["bridge"],
        "{version:?}: {case}: containerd reloaded after all"
    );
    let (ready, said) = node.asked();
    assert!(
        !ready && said.contains("sandbox-guard is not among them"),
        "{version:?}: {case}: {said}"
    );
    let doctor = node.doctor_says();
    assert!(
        doctor.contains("\"error\"") && doctor.contains("sandbox-guard is not among them"),
        "{version:?}: {case}: {doctor}"
    );
}

fn not_ready_where_containerd_runs_something_else(version: Version) {
    let node = Containerd::start(version);
    let bin = node.root().join("bin");
    link_plugins(&bin);
    let in_conf_dir = node.root().join("net.d/10-pods.conflist");
    // The conf dir holds a symlink (as config-management tools leave it); containerd
    // reloads on events in the conf dir, not on writes to the link's target.
    let target = node.root().join("store/10-pods.conflist");
    fs::write(&target, conflist(vec![bridge()])).unwrap();
    std::os::unix::fs::symlink(&target, &in_conf_dir).unwrap();
    nudge(&node);
    node.wait_until_loaded(&["bridge"]);

    replace(&target, &conflist(vec![bridge(), guard()]));
    files_say_ready_containerd_runs_no_guard(&node, "the symlink's target names the guard");

    // The guarded conf moved in over the unguarded one from another dir: to inotify that is
    // a creation, which containerd does not reload on.
    fs::remove_file(&in_conf_dir).unwrap();
    fs::write(&in_conf_dir, conflist(vec![bridge()])).unwrap();
    node.wait_until_loaded(&["bridge"]);
    fs::write(&target, conflist(vec![bridge(), guard()])).unwrap();
    fs::rename(&target, &in_conf_dir).unwrap();
    files_say_ready_containerd_runs_no_guard(&node, "the moved-in file names the guard");
    // The next event in the conf dir makes containerd load it: ready, by both views.
    nudge(&node);
    node.wait_until_loaded(&["bridge", "sandbox-guard"]);
    let (ready, said) = node.asked();
    assert!(ready, "{version:?}: {said}");

    // A bin dir containerd does not search: the guard and the primary copied there, the
    // network guarded, and containerd's own bin dir without the guard.
    let elsewhere = node.root().join("elsewhere");
    link_plugins(&elsewhere);
    fs::remove_file(bin.join("sandbox-guard")).unwrap();
    fs::remove_file(node.root().join("net.d/10-pods.conflist")).unwrap();
    replace(
        &node.root().join("net.d/10-pods.conflist"),
        &conflist(vec![bridge(), guard()]),
    );
    node.wait_until_loaded(&["bridge", "sandbox-guard"]);
    let (files_ready, files_said) = node.check("none", &elsewhere);
    assert!(
        files_ready,
        "{version:?}: the files and --bin-dir agree: {files_said}"
    );
    let (ready, said) = node.check("asked", &elsewhere);
    assert!(
        !ready && said.contains("in none of the dirs containerd searches"),
        "{version:?}: {said}"
    );
    assert_eq!(
        ready,
        loaded::ready_per_containerd(&node.cri_info().unwrap())
    );
}

#[test]
fn containerd_16_ready_where_it_loaded_the_guard() {
    if require(sys::test_name!(), Version::Debian16) {
        ready_where_containerd_loaded_the_guard(Version::Debian16);
    }
}

#[test]
fn containerd_16_not_ready_where_it_runs_something_else() {
    if require(sys::test_name!(), Version::Debian16) {
        not_ready_where_containerd_runs_something_else(Version::Debian16);
    }
}

#[test]
fn containerd_22_ready_where_it_loaded_the_guard() {
    if require(sys::test_name!(), Version::V22) {
        ready_where_containerd_loaded_the_guard(Version::V22);
    }
}

#[test]
fn containerd_22_not_ready_where_it_runs_something_else() {
    if require(sys::test_name!(), Version::V22) {
        not_ready_where_containerd_runs_something_else(Version::V22);
    }
}

/// A runtime that accepts and never answers: the probe gives up within its bound and reads
/// the files, saying so.
#[test]
fn a_hung_runtime_falls_back_to_the_files() {
    let dir = sys::TempDir::new("sghung");
    let socket = dir.path.join("hung.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let conf = dir.path.join("net.d");
    let bin = dir.path.join("bin");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    let out = cni::guard(&[
        "--install",
        "--check",
        "--conf-dir",
        conf.to_str().unwrap(),
        "--bin-dir",
        bin.to_str().unwrap(),
        "--runtime-socket",
        socket.to_str().unwrap(),
    ]);
    drop(listener);
    let said = said(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.starts_with(&format!("source: files ({}: ", socket.display()))
            && said.contains("no answer within"),
        "{said}"
    );
}

/// An HTTP/2 frame, for the stand-in CRI-O below.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// CRI-O does not run here. This stands in for its socket, answering as its source does
/// (cmd/crio/main.go: gRPC and HTTP/1 on one listener): Status with `info` holding only
/// `config` (server/runtime_status.go), and `GET /config` with the TOML of its running
/// configuration (server/inspect.go, BurntSushi toml's encoder, tables indented two spaces).
struct FakeCrio {
    socket: PathBuf,
    _serving: std::thread::JoinHandle<()>,
}

impl FakeCrio {
    /// Answers CRI Version with `version` as its `runtime_version`.
    fn start(dir: &Path, conf_dir: &Path, plugin_dirs: &[&Path], version: &str) -> FakeCrio {
        use std::io::{Read, Write};
        let socket = dir.join("crio.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let dirs: Vec<String> = plugin_dirs
            .iter()
            .map(|d| format!("{:?}", d.display().to_string()))
            .collect();
        let toml = format!(
            "[crio]\n  root = \"/var/lib/containers/storage\"\n  [crio.api]\n    listen = \"/var/run/crio/crio.sock\"\n  \
             [crio.runtime]\n    default_runtime = \"crun\"\n  [crio.network]\n    cni_default_network = \"\"\n    \
             network_dir = \"{}/\"\n    plugin_dirs = [{}]\n    cni_status_grace_period = \"0s\"\n  [crio.metrics]\n    \
             enable_metrics = false\n",
            conf_dir.display(),
            dirs.join(", ")
        );
        // A gRPC answer: SETTINGS, HEADERS :status 200, the message, trailers.
        let grpc = |message: Vec<u8>| {
            let mut data = vec![0];
            data.extend((message.len() as u32).to_be_bytes());
            data.extend(message);
            let mut out = frame(4, 0, 0, &[]);
            out.extend(frame(1, 4, 1, &[0x88]));
            out.extend(frame(0, 0, 1, &data));
            out.extend(frame(1, 5, 1, &[0x40, 1, b'x', 1, b'0']));
            out
        };
        // VersionResponse: version, runtime_name, runtime_version, runtime_api_version.
        let mut version_response = Vec::new();
        for (number, text) in [(1u8, "0.1.0"), (2, "cri-o"), (3, version), (4, "v1")] {
            version_response.extend([number << 3 | 2, text.len() as u8]);
            version_response.extend(text.as_bytes());
        }
        let serving = std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let answer = loop {
                    let Ok(n) = stream.read(&mut buf) else {
                        break None;
                    };
                    if n == 0 {
                        break None;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.starts_with(b"GET /config ") && got.ends_with(b"\r\n\r\n") {
                        break Some(
                            format!(
                                "HTTP/1.0 200 OK\r\nContent-Type: application/toml\r\nContent-Length: {}\r\n\r\n{toml}",
                                toml.len()
                            )
                            .into_bytes(),
                        );
                    }
                    let asks_version = got.windows(8).any(|w| w == b"/Version");
                    if got.starts_with(b"PRI * HTTP/2.0") && asks_version && got.ends_with(&[0; 5])
                    {
                        break Some(grpc(version_response.clone()));
                    }
                    if got.starts_with(b"PRI * HTTP/2.0") && got.ends_with(&[0x08, 0x01]) {
                        let config = r#"{"sandboxImage":"registry.k8s.io/pause:3.10","crio":{"default_runtime":"crun"}}"#;
                        let mut entry = vec![0x0a, 6];
                        entry.extend(b"config");
                        entry.extend([0x12, config.len() as u8]);
                        entry.extend(config.as_bytes());
                        let mut message = vec![0x12, entry.len() as u8];
                        message.extend(entry);
                        break Some(grpc(message));
                    }
                };
                if let Some(answer) = answer {
                    let _ = stream.write_all(&answer);
                    // gRPC: held open until the client is done (it acknowledges the
                    // SETTINGS); HTTP/1.0 ends with the close.
                    if answer.starts_with(&frame(4, 0, 0, &[])) {
                        let _ = stream.read_to_end(&mut Vec::new());
                    }
                }
            }
        });
        FakeCrio {
            socket,
            _serving: serving,
        }
    }
}

/// Where CRI-O answers, its network dir and plugin dirs are the ones checked, whatever
/// --conf-dir and --bin-dir say.
#[test]
fn crio_is_asked_for_its_dirs() {
    let dir = sys::TempDir::new("sgcrio");
    let (conf, bin, other) = (
        dir.path.join("net.d"),
        dir.path.join("bin"),
        dir.path.join("other"),
    );
    for d in [&conf, &bin, &other] {
        fs::create_dir_all(d).unwrap();
    }
    link_plugins(&bin);
    fs::write(
        conf.join("10-pods.conflist"),
        conflist(vec![bridge(), guard()]),
    )
    .unwrap();
    let primaries = dir.path.join("primaries");
    fs::create_dir_all(&primaries).unwrap();
    let crio = FakeCrio::start(
        &dir.path,
        &conf,
        &[&dir.path.join("missing"), &bin, &primaries],
        "1.34.1",
    );
    let check = |conf_dir: &Path, bin_dir: &Path| {
        let out = cni::guard(&[
            "--install",
            "--check",
            "--conf-dir",
            conf_dir.to_str().unwrap(),
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--runtime-socket",
            crio.socket.to_str().unwrap(),
        ]);
        (out.status.success(), said(&out))
    };
    // The operator's flags point elsewhere; CRI-O's own dirs hold the guarded network.
    let (ready, said) = check(&other, &other);
    assert!(ready, "{said}");
    assert!(
        said.starts_with(&format!(
            "source: CRI-O config (GET /config on {})",
            crio.socket.display()
        )),
        "{said}"
    );
    // The primary in another of CRI-O's plugin dirs than the guard: CRI-O finds both.
    fs::rename(bin.join("bridge"), primaries.join("bridge")).unwrap();
    let (ready, said) = check(&conf, &bin);
    assert!(ready && said.contains("CRI-O runs sandbox-guard"), "{said}");
    // The guard in no dir CRI-O searches.
    fs::remove_file(bin.join("sandbox-guard")).unwrap();
    let (ready, said) = check(&conf, &bin);
    assert!(
        !ready && said.contains("in none of the dirs CRI-O searches"),
        "{said}"
    );
}

/// The `installed` line of the watch's metrics file, once written.
fn installed_metric(file: &Path) -> Option<String> {
    fs::read_to_string(file).ok()?.lines().find_map(|line| {
        line.strip_prefix("sandbox_guard_install_installed ")
            .map(|v| v.trim().to_string())
    })
}

/// Waits (bounded, so a broken watch fails instead of hanging the suite) until `done`.
fn wait_until(what: &str, watch: &mut Child, log: &Path, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(120) && matches!(watch.try_wait(), Ok(None)),
            "{what}: never; the watch said:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The watch's readiness (its `installed` metric) is the probe's verdict, the runtime's word
/// first, and its looks follow the runtime without a conf-dir event: CRI-O restarted with
/// another plugin dir (a config change) finds no guard there, and the watch's next look puts
/// it there, saying not ready meanwhile. Before the installer asked the runtime where it
/// looks, the watch kept copying into --bin-dir and stayed not ready for good.
#[test]
fn the_watch_follows_the_runtimes_plugin_dir_without_a_conf_dir_event() {
    let dir = sys::TempDir::new("sgwatchrt");
    let (conf, bin, searched) = (
        dir.path.join("net.d"),
        dir.path.join("bin"),
        dir.path.join("searched"),
    );
    for d in [&conf, &bin, &searched] {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join("bridge"), b"").unwrap();
    }
    fs::write(conf.join("10-pods.conflist"), conflist(vec![bridge()])).unwrap();
    let crio = FakeCrio::start(&dir.path, &conf, &[&bin], "1.34.1");
    // Installed before the watch starts, so the watch writes nothing and no event of its own
    // wakes it: only its own looks can see the runtime's dir move.
    let flags = [
        "--mode",
        "chained",
        "--conf-dir",
        conf.to_str().unwrap(),
        "--bin-dir",
        bin.to_str().unwrap(),
    ];
    let out = cni::guard(&[&["--install"][..], &flags].concat());
    assert!(out.status.success(), "{}", said(&out));
    let (metrics, log) = (dir.path.join("install.prom"), dir.path.join("watch.log"));
    let mut watch = Command::new(cni::bin())
        .args(["--install", "--watch"])
        .args(flags)
        .arg("--metrics-file")
        .arg(&metrics)
        .arg("--runtime-socket")
        .arg(&crio.socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until("the watch says ready", &mut watch, &log, || {
        installed_metric(&metrics).as_deref() == Some("1")
    });
    assert!(
        fs::read_to_string(&log)
            .unwrap()
            .contains("already installed"),
        "the watch wrote at its start: no look without an event is shown"
    );
    // CRI-O comes back searching another dir: no event in the conf dir the watch watches.
    fs::remove_file(&crio.socket).unwrap();
    let _moved = FakeCrio::start(&dir.path, &conf, &[&searched], "1.34.1");
    wait_until(
        "ready once CRI-O's dir holds the guard",
        &mut watch,
        &log,
        || {
            installed_metric(&metrics).as_deref() == Some("1")
                && searched.join("sandbox-guard").is_file()
        },
    );
    let said = fs::read_to_string(&log).unwrap();
    assert!(
        said.contains(&format!(
            "re-inserted: copied the binary to {}",
            searched.join("sandbox-guard").display()
        )),
        "{said}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
}

/// A conf dir with network `pods` (a bridge) and the guard only in its drop-in, put there by
/// `--install --mode dropin`; `plugins` stand in the bin dir. `check` asks a stand-in CRI-O
/// of `version` what it runs.
struct DropinNode {
    dir: sys::TempDir,
    conf: PathBuf,
    bin: PathBuf,
}

impl DropinNode {
    fn new(prefix: &str, plugins: &[&str]) -> DropinNode {
        let dir = sys::TempDir::new(prefix);
        let (conf, bin) = (dir.path.join("net.d"), dir.path.join("bin"));
        fs::create_dir_all(&conf).unwrap();
        fs::create_dir_all(&bin).unwrap();
        for plugin in plugins {
            fs::write(bin.join(plugin), b"").unwrap();
        }
        fs::write(conf.join("10-pods.conflist"), conflist(vec![bridge()])).unwrap();
        let node = DropinNode { dir, conf, bin };
        let out = cni::guard(&[&["--install", "--mode", "dropin"][..], &node.flags()].concat());
        assert!(out.status.success(), "{}", said(&out));
        assert!(node.conf.join("pods/sandbox-guard.conf").is_file());
        node
    }

    fn flags(&self) -> [&str; 4] {
        [
            "--conf-dir",
            self.conf.to_str().unwrap(),
            "--bin-dir",
            self.bin.to_str().unwrap(),
        ]
    }

    fn check(&self, version: &str) -> (bool, String) {
        let at = self.dir.path.join(version);
        fs::create_dir_all(&at).unwrap();
        let crio = FakeCrio::start(&at, &self.conf, &[&self.bin], version);
        let out = cni::guard(
            &[
                &["--install", "--check", "--runtime-socket"][..],
                &[crio.socket.to_str().unwrap()],
                &self.flags(),
            ]
            .concat(),
        );
        (out.status.success(), said(&out))
    }
}

/// Under CRI-O the guard's drop-in counts where CRI-O's version loads drop-ins (libcni 1.3,
/// CRI-O 1.33+): ready there, judged with the drop-in appended; not ready on CRI-O 1.32,
/// saying why.
#[test]
fn crio_judges_the_dropin_by_its_version() {
    let node = DropinNode::new("sgcriodropin", &["bridge"]);
    let (ready, says) = node.check("1.33.0");
    assert!(ready, "{says}");
    assert!(
        says.contains("CRI-O 1.33.0 loads drop-ins")
            && says.contains("CRI-O runs sandbox-guard in network pods (chained, last)"),
        "{says}"
    );
    let (ready, says) = node.check("1.32.13");
    assert!(!ready, "{says}");
    assert!(says.contains("CRI-O 1.32.13 loads no drop-ins"), "{says}");
}

/// Under CRI-O running multus the guard's drop-in is judged by the files (never ready), not by
/// CRI-O's version: multus reads the cluster network itself, with its own libcni and its own
/// loader, so whether the drop-in runs is multus's to say (its v4.2.1+ appends
/// `<dir>/<network>/*.conf` to a cluster network given as a `.conflist` path, v4.2.0 does
/// not, its inlined delegates never), which no file shows. Ready here would be a guess that
/// leaves pods unguarded under an older multus.
#[test]
fn crio_running_multus_does_not_vouch_for_a_dropin() {
    // The drop-in first: with multus in place the installer refuses to write one.
    let node = DropinNode::new("sgcriomultus", &["bridge", "multus-shim"]);
    let pods = node.conf.join("10-pods.conflist");
    fs::write(
        node.conf.join("00-multus.conf"),
        json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim",
               "clusterNetwork": pods.display().to_string()})
        .to_string(),
    )
    .unwrap();
    // A CRI-O whose own libcni loads drop-ins.
    let (ready, says) = node.check("1.34.1");
    assert!(!ready, "{says}");
    assert!(says.contains("only in the drop-in"), "{says}");
}

/// A protobuf length prefix.
fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// containerd's CRI Status answer (StatusResponse: `info`, field 2, a map of strings) over
/// HTTP/2, as its gRPC server frames it: SETTINGS, headers, one DATA, trailers.
fn status_answer(info: &[(&str, String)]) -> Vec<u8> {
    let mut message = Vec::new();
    for (key, value) in info {
        let mut entry = vec![0x0a];
        varint(key.len(), &mut entry);
        entry.extend(key.as_bytes());
        entry.push(0x12);
        varint(value.len(), &mut entry);
        entry.extend(value.as_bytes());
        message.push(0x12);
        varint(entry.len(), &mut message);
        message.extend(entry);
    }
    let mut data = vec![0];
    data.extend((message.len() as u32).to_be_bytes());
    data.extend(message);
    let mut out = frame(4, 0, 0, &[]);
    out.extend(frame(1, 4, 1, &[0x88]));
    for chunk in data.chunks(16_384) {
        out.extend(frame(0, 0, 1, chunk));
    }
    out.extend(frame(1, 5, 1, &[0x40, 1, b'x', 1, b'0']));
    out
}

/// A containerd socket that answers CRI Status with `cniconfig`, for layouts this machine's
/// containerd cannot be given (another node's paths, seen under --host-root).
fn fake_containerd(socket: &Path, cniconfig: Value) -> std::thread::JoinHandle<()> {
    fake_containerd_with(socket, move || cniconfig.clone())
}

/// The same, its `cniconfig` made anew for each connection: a runtime whose dirs and
/// loaded network change while it runs.
fn fake_containerd_with(
    socket: &Path,
    cniconfig: impl Fn() -> Value + Send + 'static,
) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let answer = status_answer(&[
                ("cniconfig", cniconfig().to_string()),
                ("lastCNILoadStatus", "OK".to_string()),
            ]);
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if got.starts_with(b"PRI * HTTP/2.0") && got.ends_with(&[0x08, 0x01]) {
                    // The connection stays open, for the client's acknowledgements.
                    let _ = stream.write_all(&answer);
                }
            }
        }
    })
}

/// containerd's `cniconfig` for a node seen under a host root: its conf dir and plugin dirs
/// as the host names them, and the network it loaded, read from `file` now (containerd
/// reloads on every write to its conf dir).
fn cniconfig_of(conf_dir: &str, plugin_dirs: &[&str], file: &Path) -> Value {
    let list: Value = fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null);
    let plugins: Vec<Value> = list["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({"Network": {"type": p["type"]}, "Source": p.to_string()}))
        .collect();
    json!({
        "PluginConfDir": conf_dir,
        "PluginDirs": plugin_dirs,
        "PluginMaxConfNum": 1,
        "Prefix": "eth",
        "Networks": [
            {"IFName": "lo", "Config": {"Name": "cni-loopback", "CNIVersion": "0.3.1",
                "Plugins": [{"Network": {"type": "loopback"}, "Source": "{\"type\":\"loopback\"}"}]}},
            {"IFName": "eth0", "Config": {"Name": list["name"], "CNIVersion": list["cniVersion"],
                "Plugins": plugins}}
        ]
    })
}

/// k3s since its data/cni: containerd (k3s's socket) searches `data/cni`, whose plugins are
/// absolute links into `data/<hash>/bin`. Seen from the installer's pod those links name the
/// host's paths, which resolve only under --host-root.
#[test]
fn k3s_links_in_the_runtimes_plugin_dir_resolve_under_the_host_root() {
    // Catches the runtime's answer judged with the links followed in the pod's own root, where
    // /var/lib/rancher does not exist: "cannot find its plugins flannel, portmap, bandwidth" on
    // every healthy k3s node, a probe that never passes.
    let dir = sys::TempDir::new("sgk3sprobe");
    let host = dir.path.join("host");
    install::k3s_host(&host);
    let conf = host.join("var/lib/rancher/k3s/agent/etc/cni/net.d");
    let root = host.to_str().unwrap();
    let out = cni::guard(&["--install", "--platform", "k3s", "--host-root", root]);
    assert!(out.status.success(), "{}", said(&out));
    // What k3s's containerd then reports: its dirs as the host names them, and the network.
    let cniconfig = cniconfig_of(
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        &["/var/lib/rancher/k3s/data/cni"],
        &conf.join("10-flannel.conflist"),
    );
    let plugins = &cniconfig["Networks"][1]["Config"]["Plugins"];
    assert_eq!(
        plugins.as_array().unwrap().last().unwrap()["Network"]["type"],
        "sandbox-guard"
    );
    let socket = dir.path.join("containerd.sock");
    let _serving = fake_containerd(&socket, cniconfig);
    let out = cni::guard(&[
        "--install",
        "--check",
        "--platform",
        "k3s",
        "--host-root",
        root,
        "--runtime-socket",
        socket.to_str().unwrap(),
    ]);
    let said = said(&out);
    assert!(said.starts_with("source: containerd CRI status"), "{said}");
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("ready: containerd runs sandbox-guard"),
        "{said}"
    );
}

/// Under CRI-O running multus thick, the guard must be in multus's binDir too: multus's
/// daemon runs every delegate from there alone, whatever dirs CRI-O searches. Fails before
/// this change: CRI-O's dirs held the guard, and the probe said ready while multus would
/// fail every ADD to find it.
#[test]
fn crio_running_multus_thick_needs_the_guard_in_multus_bin_dir() {
    let dir = sys::TempDir::new("sgcriomultusbin");
    let (conf, bin, multus_bin) = (
        dir.path.join("net.d"),
        dir.path.join("bin"),
        dir.path.join("multus-bin"),
    );
    for d in [&conf, &bin, &multus_bin] {
        fs::create_dir_all(d).unwrap();
    }
    for plugin in ["bridge", "multus-shim"] {
        fs::write(bin.join(plugin), b"").unwrap();
    }
    fs::write(multus_bin.join("bridge"), b"").unwrap();
    let pods = conf.join("10-pods.conflist");
    fs::write(&pods, conflist(vec![bridge()])).unwrap();
    fs::write(
        conf.join("00-multus.conf"),
        json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim",
               "clusterNetwork": pods.display().to_string(),
               "binDir": multus_bin.display().to_string()})
        .to_string(),
    )
    .unwrap();
    let flags = [
        "--conf-dir",
        conf.to_str().unwrap(),
        "--bin-dir",
        bin.to_str().unwrap(),
    ];
    let out = cni::guard(&[&["--install", "--mode", "chained"][..], &flags].concat());
    assert!(out.status.success(), "{}", said(&out));
    assert!(multus_bin.join("sandbox-guard").is_file(), "{}", said(&out));
    let check = |name: &str| {
        let at = dir.path.join(name);
        fs::create_dir_all(&at).unwrap();
        let crio = FakeCrio::start(&at, &conf, &[&bin], "1.34.1");
        let out = cni::guard(
            &[
                &["--install", "--check", "--runtime-socket"][..],
                &[crio.socket.to_str().unwrap()],
                &flags,
            ]
            .concat(),
        );
        (out.status.success(), said(&out))
    };
    let (ready, says) = check("crio-a");
    assert!(ready, "{says}");
    fs::remove_file(multus_bin.join("sandbox-guard")).unwrap();
    let (ready, says) = check("crio-b");
    assert!(!ready && says.contains("binDir"), "{says}");
}

/// The file names in a dir, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A GKE node under the plain DaemonSet, not the GKE preset: containerd searches
/// /home/kubernetes/bin (its config's `bin_dir`), and an image or an earlier CNI left the
/// network's plugins in /opt/cni/bin as well, so the files alone point at /opt/cni/bin. The
/// installer asks containerd where it looks. Where the pod cannot see that dir (the plain
/// DaemonSet does not mount it) the install is refused with nothing written; where it can,
/// the guard goes there and nowhere else. Catches a guard put into /opt/cni/bin and into the
/// network, where every pod ADD then fails to find it.
#[test]
fn gke_with_plugins_in_opt_cni_bin_too_guards_where_containerd_looks() {
    for mounted in [false, true] {
        let dir = sys::TempDir::new("sggkebin");
        let host = dir.path.join("host");
        let conf = host.join("etc/cni/net.d");
        let (opt_bin, gke_bin) = (host.join("opt/cni/bin"), host.join("home/kubernetes/bin"));
        fs::create_dir_all(&conf).unwrap();
        install::copy_fixture("install/calico/conf", &conf);
        install::stub_plugins(&conf, &opt_bin);
        if mounted {
            install::stub_plugins(&conf, &gke_bin);
        }
        let file = conf.join("10-calico.conflist");
        let socket = host.join("run/containerd/containerd.sock");
        fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let loaded = file.clone();
        let _serving = fake_containerd_with(&socket, move || {
            cniconfig_of("/etc/cni/net.d", &["/home/kubernetes/bin"], &loaded)
        });
        let root = format!("--host-root={}", host.display());
        // The plain DaemonSet's args; where the dir is mounted, `auto` would find GKE by it
        // anyway: `default` keeps the files pointing at /opt/cni/bin.
        let platform = if mounted {
            "--platform=default"
        } else {
            "--platform=auto"
        };
        let before = install::tree(&host.join("etc"));
        let out = cni::guard(&["--install", "--mode=delegate", platform, &root]);
        let said = said(&out);
        let probe = cni::guard(&["--install", "--check", platform, &root]);
        if !mounted {
            assert_eq!(out.status.code(), Some(1), "{said}");
            assert!(
                said.contains("mount the host's /home/kubernetes/bin"),
                "{said}"
            );
            assert_eq!(install::tree(&host.join("etc")), before, "{said}");
            assert!(!opt_bin.join("sandbox-guard").exists(), "{said}");
            assert!(!probe.status.success(), "{}", self::said(&probe));
            continue;
        }
        assert!(out.status.success(), "{said}");
        assert_eq!(
            fs::read(gke_bin.join("sandbox-guard")).ok(),
            fs::read(cni::bin()).ok(),
            "{said}"
        );
        assert!(!opt_bin.join("sandbox-guard").exists(), "{said}");
        assert!(
            fs::read_to_string(&file).unwrap().contains("sandbox-guard"),
            "{said}"
        );
        let probe = cni::guard(&["--install", "--check", platform, &root]);
        let says = self::said(&probe);
        assert!(probe.status.success(), "{says}");
        assert!(says.contains("home/kubernetes/bin/sandbox-guard"), "{says}");
    }
}

/// k3s before its data/cni (PR #10868), upgraded under a running watch: the new release is
/// unpacked into data/<new>/bin, data/current re-pointed, containerd restarted with
/// `bin_dir` the new dir, and flannel's list written again. The watch's next look puts the
/// guard into the new dir with the list, and its metrics never say installed while the dir
/// the runtime searches lacks it: asking k3s's containerd, and from the files alone
/// (`--runtime-socket none`), where `data/current` says which release runs. Fails before
/// this change: the bin dir was fixed when the watch started (the old release's), so the
/// guard never reached the new dir while the network named it; the files said installed.
#[test]
fn a_k3s_upgrade_under_the_watch_ends_guarded_in_the_new_release() {
    for asked in [true, false] {
        let dir = sys::TempDir::new("sgk3sup");
        let host = dir.path.join("host");
        let old_bin = install::k3s_host_before_data_cni(&host, "5c2b9e1d07aa");
        let conf = host.join("var/lib/rancher/k3s/agent/etc/cni/net.d");
        let file = conf.join("10-flannel.conflist");
        let flannels = fs::read(&file).unwrap();
        let runs = std::sync::Arc::new(std::sync::Mutex::new(
            "/var/lib/rancher/k3s/data/5c2b9e1d07aa/bin".to_string(),
        ));
        let socket = host.join("run/k3s/containerd/containerd.sock");
        fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let (loaded, bin_dir) = (file.clone(), runs.clone());
        let _serving = fake_containerd_with(&socket, move || {
            let bin_dir = bin_dir.lock().unwrap().clone();
            cniconfig_of(
                "/var/lib/rancher/k3s/agent/etc/cni/net.d",
                &[&bin_dir],
                &loaded,
            )
        });
        let (metrics, log) = (dir.path.join("install.prom"), dir.path.join("watch.log"));
        let mut args = vec![
            "--install".to_string(),
            "--watch".to_string(),
            "--platform=k3s".to_string(),
            format!("--host-root={}", host.display()),
            format!("--metrics-file={}", metrics.display()),
        ];
        if !asked {
            args.push("--runtime-socket=none".to_string());
        }
        let mut watch = Command::new(cni::bin())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_until("installed in the first release", &mut watch, &log, || {
            installed_metric(&metrics).as_deref() == Some("1")
        });
        assert!(old_bin.join("sandbox-guard").is_file());
        let upgraded_at = fs::read_to_string(&log).unwrap().len();

        let new_bin = install::k3s_release(&host, "8e41f0c3b6d2");
        *runs.lock().unwrap() = "/var/lib/rancher/k3s/data/8e41f0c3b6d2/bin".to_string();
        replace(&file, &String::from_utf8(flannels.clone()).unwrap());
        let new_guard = new_bin.join("sandbox-guard");
        // The watch's look after flannel's write: it re-inserts the entry, and writes its
        // metrics after that.
        wait_until("the watch's next look", &mut watch, &log, || {
            fs::read_to_string(&log).unwrap_or_default()[upgraded_at..].contains("re-inserted")
                && metrics.metadata().and_then(|m| m.modified()).ok()
                    >= file.metadata().and_then(|m| m.modified()).ok()
        });
        let said = fs::read_to_string(&log).unwrap();
        assert!(
            installed_metric(&metrics).as_deref() != Some("1") || new_guard.is_file(),
            "asked {asked}: installed 1 while {} lacks the guard:\n{said}",
            new_bin.display()
        );
        wait_until("installed in the new release", &mut watch, &log, || {
            installed_metric(&metrics).as_deref() == Some("1") && new_guard.is_file()
        });
        let said = fs::read_to_string(&log).unwrap()[upgraded_at..].to_string();
        // In the look that re-inserted the entry, not a later one.
        let copied = said.find(&format!(
            "re-inserted: copied the binary to {}",
            new_guard.display()
        ));
        let put = said.find("re-inserted: put sandbox-guard into");
        assert!(
            copied.is_some()
                && put.is_some()
                && said[..put.unwrap()]
                    .lines()
                    .all(|l| !l.contains("not ready")),
            "asked {asked}:\n{said}"
        );
        assert_eq!(fs::read(&new_guard).ok(), fs::read(cni::bin()).ok());
        let _ = watch.kill();
        let _ = watch.wait();
    }
}

/// Against a real containerd: `--install` puts the binary into the dir containerd reports
/// it searches (its CRI status), not `--bin-dir`; where that dir lacks one of the network's
/// plugins it refuses, naming both dirs, and writes nothing. Catches a guard put into `--bin-dir`,
/// a dir containerd does not search, and into the network.
fn install_puts_the_guard_where_containerd_searches(version: Version) {
    let node = Containerd::start(version);
    let (bin, elsewhere) = (node.root().join("bin"), node.root().join("elsewhere"));
    for plugin in ["bridge", "portmap"] {
        std::os::unix::fs::symlink(format!("/usr/lib/cni/{plugin}"), elsewhere.join(plugin))
            .unwrap();
    }
    std::os::unix::fs::symlink("/usr/lib/cni/portmap", bin.join("portmap")).unwrap();
    let conf = node.root().join("net.d");
    let file = conf.join("10-pods.conflist");
    replace(&file, &conflist(vec![bridge()]));
    node.wait_until_loaded(&["bridge"]);
    let install = || {
        cni::guard(&[
            "--install",
            "--conf-dir",
            conf.to_str().unwrap(),
            "--bin-dir",
            elsewhere.to_str().unwrap(),
            "--runtime-socket",
            node.socket().to_str().unwrap(),
        ])
    };
    let before = install::tree(&conf);
    let out = install();
    let says = said(&out);
    assert_eq!(out.status.code(), Some(1), "{version:?}: {says}");
    assert!(
        says.contains(&bin.display().to_string())
            && says.contains(&elsewhere.display().to_string())
            && says.contains("bridge"),
        "{version:?}: {says}"
    );
    assert_eq!(install::tree(&conf), before, "{version:?}: {says}");
    assert_eq!(names_in(&bin), ["portmap"], "{version:?}");
    assert_eq!(names_in(&elsewhere), ["bridge", "portmap"], "{version:?}");

    std::os::unix::fs::symlink("/usr/lib/cni/bridge", bin.join("bridge")).unwrap();
    let out = install();
    let says = said(&out);
    assert!(out.status.success(), "{version:?}: {says}");
    assert_eq!(
        fs::read(bin.join("sandbox-guard")).ok(),
        fs::read(cni::bin()).ok(),
        "{version:?}: {says}"
    );
    assert!(!elsewhere.join("sandbox-guard").exists(), "{version:?}");
    node.wait_until_loaded(&["bridge", "sandbox-guard"]);
    let (ready, said) = node.asked();
    assert!(ready, "{version:?}: {said}");
}

#[test]
fn containerd_16_install_puts_the_guard_where_it_searches() {
    if require(sys::test_name!(), Version::Debian16) {
        install_puts_the_guard_where_containerd_searches(Version::Debian16);
    }
}

#[test]
fn containerd_22_install_puts_the_guard_where_it_searches() {
    if require(sys::test_name!(), Version::V22) {
        install_puts_the_guard_where_containerd_searches(Version::V22);
    }
}

/// A GKE host under `host` with calico's list in /etc/cni/net.d and its plugins in
/// /opt/cni/bin, and containerd (`socket` under it) answering that it searches `dirs`.
fn gke_host(dir: &Path, dirs: &'static [&'static str]) -> (PathBuf, std::thread::JoinHandle<()>) {
    let host = dir.join("host");
    let conf = host.join("etc/cni/net.d");
    fs::create_dir_all(&conf).unwrap();
    install::copy_fixture("install/calico/conf", &conf);
    install::stub_plugins(&conf, &host.join("opt/cni/bin"));
    let socket = host.join("run/containerd/containerd.sock");
    fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let loaded = conf.join("10-calico.conflist");
    let serving = fake_containerd_with(&socket, move || {
        cniconfig_of("/etc/cni/net.d", dirs, &loaded)
    });
    (host, serving)
}

/// A network that names the guard already (put in /opt/cni/bin by an installer that did not
/// ask containerd) on a GKE node whose /home/kubernetes/bin the pod cannot see: every pod ADD
/// fails to find the guard. The install takes the guard out of the network, saying so, and
/// pods start unguarded. Catches a refusal, "nothing written", that leaves the network naming a
/// guard containerd cannot find.
#[test]
fn a_guard_named_where_containerd_cannot_be_seen_stands_aside() {
    let dir = sys::TempDir::new("sggkeaside");
    let (host, _serving) = gke_host(&dir.path, &["/home/kubernetes/bin"]);
    let root = format!("--host-root={}", host.display());
    let file = host.join("etc/cni/net.d/10-calico.conflist");
    let out = cni::guard(&[
        "--install",
        "--platform=default",
        "--runtime-socket=none",
        &root,
    ]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(fs::read_to_string(&file).unwrap().contains("sandbox-guard"));
    let out = cni::guard(&["--install", "--platform=auto", &root]);
    let says = said(&out);
    assert_eq!(out.status.code(), Some(1), "{says}");
    assert!(
        says.contains("start unguarded") && says.contains("/home/kubernetes/bin"),
        "{says}"
    );
    assert!(
        !fs::read_to_string(&file).unwrap().contains("sandbox-guard"),
        "{says}"
    );
}

/// CRI-O searching /opt/cni/bin and then /usr/libexec/cni (Fedora's and RHEL's setting), the
/// network's plugins in the second, which the base DaemonSet does not mount: the guard goes
/// into the first, which CRI-O searches first, and the install says what it could not see.
/// Before, it refused, saying the runtime could not run the network.
#[test]
fn a_searched_dir_not_mounted_is_said_not_refused() {
    let dir = sys::TempDir::new("sglibexec");
    let host = dir.path.join("host");
    let conf = host.join("etc/cni/net.d");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(host.join("opt/cni/bin")).unwrap();
    fs::write(conf.join("10-pods.conflist"), conflist(vec![bridge()])).unwrap();
    let socket_dir = host.join("var/run/crio");
    fs::create_dir_all(&socket_dir).unwrap();
    let _crio = FakeCrio::start(
        &socket_dir,
        Path::new("/etc/cni/net.d"),
        &[Path::new("/opt/cni/bin/"), Path::new("/usr/libexec/cni/")],
        "1.33.2",
    );
    let out = cni::guard(&[
        "--install",
        "--platform=auto",
        &format!("--host-root={}", host.display()),
    ]);
    let says = said(&out);
    assert!(out.status.success(), "{says}");
    assert!(host.join("opt/cni/bin/sandbox-guard").is_file(), "{says}");
    assert!(
        says.contains("/usr/libexec/cni") && says.contains("not mounted here"),
        "{says}"
    );
}

/// Multus thin runs its delegates from its binDir first: the cluster network's plugins there
/// and not in the runtime's dir is a node that works, and installs. Before, the runtime's dirs
/// alone were searched and the install was refused.
#[test]
fn multus_thins_bin_dir_counts_for_its_delegates() {
    let dir = sys::TempDir::new("sgthinbin");
    let host = dir.path.join("host");
    let conf = host.join("etc/cni/net.d");
    let (opt_bin, multus_bin) = (host.join("opt/cni/bin"), host.join("var/lib/cni/bin"));
    fs::create_dir_all(&conf).unwrap();
    install::copy_fixture("install/calico/conf", &conf);
    install::stub_plugins(&conf, &multus_bin);
    fs::create_dir_all(&opt_bin).unwrap();
    fs::write(opt_bin.join("multus"), b"").unwrap();
    let calico: Value =
        serde_json::from_slice(&fs::read(conf.join("10-calico.conflist")).unwrap()).unwrap();
    fs::write(
        conf.join("00-multus.conf"),
        json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
               "binDir": "/var/lib/cni/bin", "delegates": [calico],
               "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig"})
        .to_string(),
    )
    .unwrap();
    let socket = host.join("run/containerd/containerd.sock");
    fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let loaded = conf.join("00-multus.conf");
    let _serving = fake_containerd_with(&socket, move || {
        let mut config = cniconfig_of("/etc/cni/net.d", &["/opt/cni/bin"], &loaded);
        config["Networks"][1]["Config"]["Plugins"] =
            json!([{"Network": {"type": "multus"}, "Source": "{}"}]);
        config
    });
    let out = cni::guard(&[
        "--install",
        "--mode=delegate",
        &format!("--host-root={}", host.display()),
    ]);
    let says = said(&out);
    assert!(out.status.success(), "{says}");
}

/// An uninstall after a k3s upgrade (before data/cni) stands the running watch down: the
/// watch's lock is in k3s's data dir, not in the release dir the watch started with, which
/// the uninstall no longer resolves. Before, the uninstall found no lock in the new release's
/// dir, and the watch put the guard back.
#[test]
fn an_uninstall_after_a_k3s_upgrade_stands_the_watch_down() {
    let dir = sys::TempDir::new("sgk3sun");
    let host = dir.path.join("host");
    install::k3s_host_before_data_cni(&host, "5c2b9e1d07aa");
    let file = host.join("var/lib/rancher/k3s/agent/etc/cni/net.d/10-flannel.conflist");
    let root = format!("--host-root={}", host.display());
    let log = dir.path.join("watch.log");
    let mut watch = Command::new(cni::bin())
        .args([
            "--install",
            "--watch",
            "--platform=k3s",
            "--runtime-socket=none",
            &root,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until("installed", &mut watch, &log, || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ready:")
    });
    install::k3s_release(&host, "8e41f0c3b6d2");
    let out = cni::guard(&[
        "--uninstall",
        "--platform=k3s",
        "--runtime-socket=none",
        &root,
    ]);
    assert!(out.status.success(), "{}", said(&out));
    wait_until("the watch stands down", &mut watch, &log, || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("standing down")
    });
    std::thread::sleep(Duration::from_secs(2));
    let said = fs::read_to_string(&log).unwrap();
    assert!(
        !fs::read_to_string(&file).unwrap().contains("sandbox-guard"),
        "{said}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
}
