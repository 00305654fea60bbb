//! A private containerd 1.6 with its CRI plugin, driven the way kubelet drives it, so the
//! end-to-end test sees CNI calls exactly as a node makes them (libcni's result cache,
//! reverse-order DEL, the second DEL from RemovePodSandbox, the error text kubelet gets).
//! Everything lives under one temp dir; `Drop` kills the containers, shims and containerd,
//! unmounts what they mounted there and deletes the host links, also when a test panics.
//! Needs `sys` and `cni` (tests/support/sys.rs, cni.rs) included by the test crate.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::sys;

/// Tools the harness runs besides cargo; a test passes them to `sys::require`.
pub const TOOLS: &[&str] = &[
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "catatonit",
    "protoc",
    "ip",
    "nsenter",
    "flock",
    "ping",
    "tar",
    "sha1sum",
    "timeout",
    "mount",
    "umount",
    "/usr/lib/cni/loopback",
];

const PAUSE_IMAGE: &str = "localhost/sandbox-guard-pause:e2e";
const K8S_NAMESPACE: &str = "k8s.io";
/// Upper bound for one CRI call or ctr run: a hung containerd must fail the test, not stall CI.
const CALL_TIMEOUT_SECS: &str = "90";

/// The model of a primary plugin a node runs (tests/cri/), linked into its CNI bin dir under
/// the plugin type `plugin_type()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primary {
    /// calico-cni <= v1.6.2 (calico <= 2.1.3) with etcd: IPAM handle, endpoint and host veth
    /// all keyed by the pod name.
    CalicoCniV1,
    /// IPAM per container, the host veth named from the pod name and deleted by that name by a
    /// DEL with an empty netns: a chained plugin acting on a pod-named veth (cilium#44530).
    PodNamedVeth,
    /// The in-house sticky-IP macvlan plugin: the IP reserved for the pod name (sticky), the
    /// interface a macvlan on the node's master link, living in the sandbox's netns only.
    StickyMacvlan,
    /// Not a model: the reference macvlan plugin with host-local IPAM (/usr/lib/cni), on the
    /// node's master link, for what a real primary does (dual-stack, DAD at ADD).
    ReferenceMacvlan,
    /// calico v2.x: `CalicoCniV1` (as calico-cni v1.6.1+, a DEL without endpoint passes) run
    /// at cniVersion 0.1.0/0.2.0 with 0.2.0-shaped results (tests/cri/calico-v2-model-plugin).
    CalicoV2,
}

impl Primary {
    pub fn plugin_type(self) -> &'static str {
        match self {
            Primary::CalicoCniV1 => "calico-cni-v1-model",
            Primary::PodNamedVeth => "podnamed-veth",
            Primary::StickyMacvlan => "sticky-macvlan",
            Primary::ReferenceMacvlan => "macvlan",
            Primary::CalicoV2 => "calico-v2-model",
        }
    }

    /// The model's executable (its shared shell code lies next to it).
    pub fn executable(self) -> PathBuf {
        let file = match self {
            Primary::CalicoCniV1 => "calico-cni-v1-model-plugin",
            Primary::PodNamedVeth => "podnamed-veth-plugin",
            Primary::StickyMacvlan => "sticky-macvlan-plugin",
            Primary::ReferenceMacvlan => return PathBuf::from("/usr/lib/cni/macvlan"),
            Primary::CalicoV2 => "calico-v2-model-plugin",
        };
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/cri")
            .join(file)
    }

    /// Whether every sandbox of a pod gets the same address while a new sandbox's ADD leaves
    /// the old sandbox's interface alone: a re-created pod's two sandboxes hold its address at
    /// once until the old one's DEL.
    pub fn sticky_ip(self) -> bool {
        self == Primary::StickyMacvlan
    }
}

/// Paths and names of one node that the test's conflist refers to.
pub struct NodeLayout {
    pub dir: PathBuf,
    /// The model primary linked into the node's CNI bin dir.
    pub primary: Primary,
    /// State dir of the test's primary plugin (its `ips/` and `calls.log`, see tests/cri/).
    pub primary_state: PathBuf,
    pub guard_state: PathBuf,
    pub guard_log: PathBuf,
    /// Prefix of every host link the primary creates, unique to this node so the links can
    /// be swept on drop and never collide with a concurrently running test.
    pub veth_prefix: String,
    /// A /24 of this node's pod addresses, distinct per node for the same reason.
    pub subnet: String,
    /// The /24's IPv6 twin, a /64 (`fd64:<third octet>::/64`), for dual-stack pods.
    pub subnet6: String,
    /// The host link a macvlan primary hangs its pods' interfaces off (a NIC or its vlan on a
    /// real node): a veth end, whose peer holds the subnet's .1, the pods' gateway.
    pub master: Option<String>,
    /// cgroupfs parent of this node's sandboxes (containerd would otherwise share /k8s.io).
    pub cgroup_parent: String,
}

pub struct CriNode {
    pub layout: NodeLayout,
    socket: PathBuf,
    cri_client: PathBuf,
    containerd: Option<Child>,
    /// Sandboxes this node ran: libcni caches their results under /var/lib/cni/results
    /// (containerd 1.6 offers no other cache dir), outside the temp dir.
    sandboxes: std::cell::RefCell<Vec<String>>,
    /// Deleted after the drop's teardown, taking any macvlan left on it along.
    _master: Option<sys::HostLink>,
    // Last field: removed only after everything inside it was unmounted.
    _dir: sys::TempDir,
}

/// A failed CRI call: gRPC code and the message kubelet would log.
#[derive(Debug)]
pub struct CriError {
    pub code: Option<i64>,
    pub message: String,
}

impl CriNode {
    /// Starts containerd with the conflist `conflist(layout)` as its only CNI network, the
    /// model `primary` and sandbox-guard in its CNI bin dir and the catatonit pause image
    /// imported, and waits until CRI reports the network ready.
    pub fn start(primary: Primary, conflist: impl FnOnce(&NodeLayout) -> Value) -> CriNode {
        let cri_client = cri_client_binary();
        let dir = sys::TempDir::new("sgcri");
        let root = dir.path.clone();
        let unique = sys::unique("s");
        let subnet = free_subnet();
        let subnet6 = ipv6_twin(&subnet);
        let master = matches!(primary, Primary::StickyMacvlan | Primary::ReferenceMacvlan)
            .then(|| create_master_link(&subnet, &subnet6));
        let layout = NodeLayout {
            primary,
            primary_state: root.join("primary"),
            guard_state: root.join("guard"),
            guard_log: root.join("guard.log"),
            master: master.as_ref().map(|m| m.name.clone()),
            subnet,
            subnet6,
            cgroup_parent: format!("/sandbox-guard-e2e-{unique}"),
            veth_prefix: unique,
            dir: root.clone(),
        };
        for sub in ["bin", "net.d", "primary", "opt"] {
            fs::create_dir_all(root.join(sub)).expect("create node dir");
        }
        link_cni_plugins(&root.join("bin"), primary);
        let conflist_text = serde_json::to_string_pretty(&conflist(&layout)).unwrap();
        fs::write(root.join("net.d/10-e2e.conflist"), conflist_text).expect("write conflist");
        fs::write(root.join("config.toml"), containerd_config(&root)).expect("write config");

        let log = fs::File::create(root.join("containerd.log")).expect("containerd log");
        let containerd = Command::new("containerd")
            .arg("--config")
            .arg(root.join("config.toml"))
            .env("PATH", plugin_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        let node = CriNode {
            socket: root.join("containerd.sock"),
            cri_client,
            containerd: Some(containerd),
            sandboxes: Default::default(),
            layout,
            _master: master,
            _dir: dir,
        };
        node.wait_until("containerd serves CRI", || node.cri(&["version"]).is_ok());
        node.import_pause_image();
        node.wait_until("CRI reports the CNI network ready", || {
            node.cri(&["status"])
                .is_ok_and(|status| network_ready(&status))
        });
        node
    }

    /// RunPodSandbox; returns the sandbox id.
    pub fn run_pod(&self, name: &str, namespace: &str, uid: &str) -> Result<String, CriError> {
        let log_dir = self.layout.dir.join("pod-logs").join(uid);
        let log_dir = log_dir.to_str().unwrap();
        let args = [
            "run-pod",
            "--name",
            name,
            "--namespace",
            namespace,
            "--uid",
            uid,
            "--log-dir",
            log_dir,
            "--cgroup-parent",
            &self.layout.cgroup_parent,
        ];
        let id = self
            .cri(&args)
            .map(|reply| reply["id"].as_str().expect("sandbox id").to_string())?;
        self.sandboxes.borrow_mut().push(id.clone());
        Ok(id)
    }

    pub fn stop_pod(&self, id: &str) -> Result<(), CriError> {
        self.cri(&["stop-pod", id]).map(drop)
    }

    pub fn remove_pod(&self, id: &str) -> Result<(), CriError> {
        self.cri(&["remove-pod", id]).map(drop)
    }

    /// PodSandboxStatus as {id, state, ip, name, namespace, uid}.
    pub fn pod_status(&self, id: &str) -> Value {
        self.cri(&["pod-status", id])
            .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e:?}"))
    }

    /// Makes the primary plugin's next DEL fail once, before it touches anything.
    pub fn fail_next_primary_del(&self) {
        fs::write(self.layout.primary_state.join("fail-next-del"), "").expect("write marker");
    }

    /// Makes every DEL of the primary plugin take `seconds` from now on.
    pub fn slow_primary_dels(&self, seconds: f64) {
        fs::write(
            self.layout.primary_state.join("slow-dels"),
            seconds.to_string(),
        )
        .expect("write marker");
    }

    /// The primary plugin's own trace: one line per call, plus what each call did to whose
    /// endpoint, host link or address (tests/cri/model-lib.sh).
    pub fn primary_calls(&self) -> String {
        fs::read_to_string(self.layout.primary_state.join("calls.log")).unwrap_or_default()
    }

    /// The primary's address allocations left (`ips/<address>`, each naming its handle).
    pub fn primary_allocations(&self) -> Vec<String> {
        fs::read_dir(self.layout.primary_state.join("ips"))
            .map(|dir| {
                dir.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The netns the primary's ADD of sandbox `id` got (from its trace), which containerd
    /// keeps while the sandbox's network is not torn down.
    pub fn primary_netns(&self, id: &str) -> PathBuf {
        let calls = self.primary_calls();
        calls
            .lines()
            .find_map(|line| {
                let words: Vec<&str> = line.split(' ').collect();
                (words.get(1..3) == Some(&["ADD", id][..]))
                    .then(|| words.last()?.strip_prefix("netns="))
                    .flatten()
            })
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("the primary's trace has no ADD of {id}:\n{calls}"))
    }

    /// Keeps sandbox `id`'s netns (the one the primary's ADD got) alive past containerd's
    /// teardown, as a process left in it would, with a bind mount under the node's dir (the
    /// node's drop unmounts it); returns the mount's path.
    pub fn pin_netns(&self, id: &str) -> PathBuf {
        let netns = self.primary_netns(id);
        let pin = self.layout.dir.join("pinned-netns").join(id);
        fs::create_dir_all(pin.parent().unwrap()).expect("create pinned-netns dir");
        fs::write(&pin, "").expect("create netns mount point");
        sys::run(
            "mount",
            &["--bind", netns.to_str().unwrap(), pin.to_str().unwrap()],
        );
        pin
    }

    /// A NIC driver reload: the master link goes, taking every macvlan on it along, and
    /// comes back under its name with its gateways.
    pub fn reload_master(&self) {
        let master = self
            .layout
            .master
            .as_deref()
            .expect("a node with a master link");
        sys::run("ip", &["link", "delete", master]);
        plug_master(master, &self.layout.subnet, &self.layout.subnet6);
    }

    /// Host links named with this node's prefix: the primary's host veths.
    pub fn host_links(&self) -> Vec<String> {
        let out = Command::new("ip").args(["-o", "link", "show"]).output();
        let Ok(out) = out else { return Vec::new() };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            // "12: name@if11: <...": the name ends at '@' or ':'.
            .filter_map(|line| line.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .filter(|name| name.starts_with(&self.layout.veth_prefix))
            .collect()
    }

    /// What happened on this node, for a failing test's output.
    pub fn diagnostics(&self) -> String {
        let root = &self.layout.dir;
        let mut out = String::new();
        for (title, path) in [
            (
                "primary plugin calls",
                self.layout.primary_state.join("calls.log"),
            ),
            ("sandbox-guard log", self.layout.guard_log.clone()),
            ("containerd log (tail)", root.join("containerd.log")),
        ] {
            let text = fs::read_to_string(&path).unwrap_or_else(|e| format!("({e})"));
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            out.push_str(&format!(
                "--- {title} ({})\n{}\n",
                path.display(),
                tail.join("\n")
            ));
        }
        out
    }

    fn cri(&self, args: &[&str]) -> Result<Value, CriError> {
        let out = Command::new("timeout")
            .arg(CALL_TIMEOUT_SECS)
            .arg(&self.cri_client)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run cri-client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let reply: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "cri-client {args:?}: {} with unparsable stdout {stdout:?}, stderr {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        if out.status.success() {
            return Ok(reply);
        }
        Err(CriError {
            code: reply["error"]["code"].as_i64(),
            message: reply["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        })
    }

    fn ctr(&self, args: &[&str]) {
        let mut full = vec![
            CALL_TIMEOUT_SECS,
            "ctr",
            "--address",
            self.socket.to_str().unwrap(),
        ];
        full.extend_from_slice(&["--namespace", K8S_NAMESPACE]);
        full.extend_from_slice(args);
        sys::run("timeout", &full);
    }

    fn import_pause_image(&self) {
        let tarball = build_pause_image(&self.layout.dir.join("pause-image"));
        self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
            tarball.to_str().unwrap(),
        ]);
    }

    fn wait_until(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn runc_root(&self) -> PathBuf {
        self.layout.dir.join("runc").join(K8S_NAMESPACE)
    }

    /// Kills every container of this node with runc directly: going through CRI would send
    /// DELs that a test may have set up to fail.
    fn kill_containers(&self) {
        let root = self.runc_root();
        let root = root.to_str().unwrap();
        let Ok(out) = Command::new("runc")
            .args(["--root", root, "list", "-q"])
            .output()
        else {
            return;
        };
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            sys::try_run("runc", &["--root", root, "kill", id, "KILL"]);
            sys::try_run("runc", &["--root", root, "delete", "--force", id]);
        }
    }

    /// Shims outlive containerd by design; ours are the ones serving our socket.
    fn kill_shims(&self) {
        let socket = self.socket.to_str().unwrap();
        for pid in processes_with_args(&["containerd-shim-runc-v2", socket]) {
            sys::try_run("kill", &["-KILL", &pid.to_string()]);
        }
    }

    fn stop_containerd(&mut self) {
        let Some(mut child) = self.containerd.take() else {
            return;
        };
        sys::try_run("kill", &["-TERM", &child.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// runc deletes each sandbox's cgroup but not the parent the node chose.
    fn remove_cgroups(&self) {
        let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let relative = self.layout.cgroup_parent.trim_start_matches('/');
        for hierarchy in hierarchies.flatten() {
            let parent = hierarchy.path().join(relative);
            if let Ok(children) = fs::read_dir(&parent) {
                for child in children.flatten().filter(|c| c.path().is_dir()) {
                    let _ = fs::remove_dir(child.path());
                }
            }
            let _ = fs::remove_dir(&parent);
        }
    }

    fn delete_host_links(&self) {
        for name in self.host_links() {
            sys::try_run("ip", &["link", "delete", &name]);
        }
    }
}

impl CriNode {
    fn remove_libcni_cache(&self) {
        let Ok(entries) = fs::read_dir("/var/lib/cni/results") else {
            return;
        };
        let sandboxes = self.sandboxes.borrow();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if sandboxes.iter().any(|id| name.contains(&format!("-{id}-"))) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
        self.kill_containers();
        self.kill_shims();
        self.stop_containerd();
        unmount_below(&self.layout.dir);
        self.delete_host_links();
        self.remove_cgroups();
        self.remove_libcni_cache();
    }
}

fn ipv6_twin(subnet: &str) -> String {
    let third: u16 = subnet
        .split('.')
        .nth(2)
        .and_then(|t| t.parse().ok())
        .expect("a dotted /24");
    // Canonical (RFC 5952), as the kernel and the plugins write it back: a third octet of 0
    // would otherwise read "fd64:0::/64" here and "fd64::/64" in their output.
    format!(
        "{}/64",
        std::net::Ipv6Addr::new(0xfd64, third, 0, 0, 0, 0, 0, 0)
    )
}

/// A veth pair standing in for a node's uplink: the end returned is the macvlan master
/// (deleting it deletes its peer); the other, on the host too, holds the subnet's .1 (and
/// the /64's ::1), so the host reaches the pods through it.
fn create_master_link(subnet: &str, subnet6: &str) -> sys::HostLink {
    let name = sys::unique("mv");
    plug_master(&format!("{name}m"), subnet, subnet6);
    sys::HostLink {
        name: format!("{name}m"),
    }
}

/// Creates the veth pair of master `master` (its peer the same name ending in `g` instead of
/// `m`), the peer holding the gateways of `subnet` and `subnet6`.
fn plug_master(master: &str, subnet: &str, subnet6: &str) {
    let uplink = format!("{}g", master.strip_suffix('m').unwrap_or(master));
    sys::run(
        "ip",
        &[
            "link", "add", master, "type", "veth", "peer", "name", &uplink,
        ],
    );
    let gateway = format!("{}.1/24", subnet.trim_end_matches(".0/24"));
    sys::run("ip", &["addr", "add", &gateway, "dev", &uplink]);
    // Without duplicate address detection: the gateway answers from the first packet.
    let gateway6 = format!("{}1/64", subnet6.trim_end_matches("/64"));
    sys::run(
        "ip",
        &["-6", "addr", "add", &gateway6, "dev", &uplink, "nodad"],
    );
    for end in [master, uplink.as_str()] {
        sys::run("ip", &["link", "set", end, "up"]);
    }
}

/// Builds tests/cri-client once per test process, in its own target dir: its tonic stack
/// must stay out of the plugin's dependency graph.
pub fn cri_client_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            let target_dir = manifest_dir.join("target/cri-client");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let manifest = manifest_dir.join("tests/cri-client/Cargo.toml");
            // Cargo names the executable, wherever a build target or profile puts it.
            let out = Command::new(cargo)
                .args([
                    "build",
                    "--release",
                    "--message-format=json-render-diagnostics",
                    "--manifest-path",
                ])
                .arg(&manifest)
                .env("CARGO_TARGET_DIR", &target_dir)
                .stderr(Stdio::inherit())
                .output()
                .expect("run cargo build for tests/cri-client");
            assert!(
                out.status.success(),
                "building {} failed",
                manifest.display()
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .filter_map(|msg| msg["executable"].as_str().map(PathBuf::from))
                .find(|exe| exe.ends_with("cri-client"))
                .expect("cargo reported no cri-client executable")
        })
        .clone()
}

/// containerd runs each CNI plugin with its own PATH; the primary plugin needs ip, nsenter,
/// flock and coreutils, which sudo's or CI's PATH may lack the sbin part of.
fn plugin_path() -> String {
    let inherited = std::env::var("PATH").unwrap_or_default();
    format!("{inherited}:/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin")
}

fn link_cni_plugins(bin_dir: &Path, primary: Primary) {
    let plugins = [
        ("loopback", PathBuf::from("/usr/lib/cni/loopback")),
        (primary.plugin_type(), primary.executable()),
        ("sandbox-guard", PathBuf::from(crate::cni::bin())),
    ];
    let ipam = (primary == Primary::ReferenceMacvlan)
        .then(|| ("host-local", PathBuf::from("/usr/lib/cni/host-local")));
    for (name, target) in plugins.into_iter().chain(ipam) {
        std::os::unix::fs::symlink(&target, bin_dir.join(name)).expect("link CNI plugin");
    }
}

fn containerd_config(root: &Path) -> String {
    let r = root.display();
    // Everything containerd would put in /var/lib, /run, /opt or /var/run/netns goes under
    // `root`, so nodes of concurrent tests never share state and drop can find every mount.
    format!(
        r#"version = 2
root = "{r}/root"
state = "{r}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{r}/containerd.sock"
[ttrpc]
  address = "{r}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE on these machines.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{r}/bin"
    conf_dir = "{r}/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{r}/runc"
"#
    )
}

fn network_ready(status: &Value) -> bool {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "NetworkReady" && c["status"] == true)
}

/// A /24 of 100.64.0.0/16 (shared address space, which the other tests leave alone) that
/// no other node of this process took and no host address or route uses yet: two nodes
/// with the same pod addresses would fight over the host routes.
fn free_subnet() -> String {
    let [a, b, c] = sys::free_subnet(100, 64..=64);
    format!("{a}.{b}.{c}.0/24")
}

/// A docker-archive image whose only file is Debian's static catatonit, run as `catatonit -P`
/// (pause mode): the sandbox image without a registry.
fn build_pause_image(dir: &Path) -> PathBuf {
    let layer_root = dir.join("rootfs");
    fs::create_dir_all(&layer_root).expect("create image dir");
    fs::copy("/usr/bin/catatonit", layer_root.join("catatonit")).expect("copy catatonit");
    sys::run(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "-C",
            layer_root.to_str().unwrap(),
            "-cf",
            dir.join("layer.tar").to_str().unwrap(),
            "catatonit",
        ],
    );
    let layer_digest = sys::hex(&Sha256::digest(fs::read(dir.join("layer.tar")).unwrap()));
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = json!({
        "architecture": architecture,
        "os": "linux",
        "config": {"Entrypoint": ["/catatonit", "-P"], "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let manifest =
        json!([{"Config": "config.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]}]);
    fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    let tarball = dir.join("pause.tar");
    sys::run(
        "tar",
        &[
            "-C",
            dir.to_str().unwrap(),
            "-cf",
            tarball.to_str().unwrap(),
            "manifest.json",
            "config.json",
            "layer.tar",
        ],
    );
    tarball
}

/// Pids whose command line contains every one of `needles` as a whole argument.
fn processes_with_args(needles: &[&str]) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let matches = needles
                .iter()
                .all(|needle| args.iter().any(|arg| arg.ends_with(needle.as_bytes())));
            matches.then_some(pid)
        })
        .collect()
}

/// Unmounts everything mounted at or below `dir`, deepest first (rootfs overlays, the sandbox
/// /dev/shm, the netns bind mounts), so the directory can be removed.
fn unmount_below(dir: &Path) {
    for _ in 0..5 {
        let points = sys::mounts_below(dir);
        if points.is_empty() {
            return;
        }
        for point in points {
            sys::try_run("umount", &["--lazy", &point.to_string_lossy()]);
        }
    }
}
