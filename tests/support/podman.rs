//! A podman 4.3 sealed off from the host's own podman: private containers.conf and
//! storage.conf (picked up through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF), storage,
//! run state, locks, events, CNI plugin and network config directories all under one temp
//! dir, and a CNI network of its own (bridge + host-local, sandbox-guard last). Podman
//! cannot pull here (offline), so the image is imported from a rootfs holding only the
//! static `catatonit`, which sleeps until signalled.
//!
//! Everything the environment makes is removed on drop, also when a test panics: the
//! containers (so their netns and veths go), leftover mounts, the bridge link, libcni's
//! result cache entries, and the temp dir. Needs `crate::sys` and `crate::cni`.
#![allow(dead_code)]

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cni;
use crate::sys::{self, HostLink, TempDir};

/// Static binary used as the image's only content; Debian installs it here (package
/// `catatonit`, which podman depends on).
pub const CATATONIT: &str = "/usr/bin/catatonit";

/// What `sys::require` must find before a podman test can run.
pub const TOOLS: &[&str] = &[
    "podman",
    "runc",
    "conmon",
    "tar",
    "ip",
    CATATONIT,
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/host-local",
];

const IMAGE: &str = "localhost/sandbox-guard-e2e:latest";
const REFERENCE_PLUGINS: &str = "/usr/lib/cni";
/// libcni's default cache dir, which podman 4.3 does not let us move: entries are named
/// `<network>-<containerId>-<ifname>` and survive a DEL that failed anywhere in the chain.
const LIBCNI_RESULTS: &str = "/var/lib/cni/results";
pub const IFNAME: &str = "eth0";

/// A running container as podman reports it after the CNI ADD.
#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub netns: String,
    /// The address with its prefix length, the way the guard records it ("10.1.2.3/24").
    pub ip_cidr: String,
    pub ip: String,
    pub mac: String,
}

pub struct PodmanEnv {
    /// CNI network name; also the bridge's name, so one unique string covers both.
    pub network: String,
    guard_state_dir: PathBuf,
    guard_log: PathBuf,
    guard_bin: PathBuf,
    ipam_data_dir: PathBuf,
    containers_conf: PathBuf,
    storage_conf: PathBuf,
    netns_seen: RefCell<Vec<String>>,
    // Fields drop in declaration order after `Drop::drop`: the bridge goes before the dir.
    _bridge: HostLink,
    dir: TempDir,
}

impl PodmanEnv {
    /// Builds the configuration, with the sandbox-guard binary under test in the chain, and
    /// imports the image.
    pub fn new() -> PodmanEnv {
        let dir = TempDir::new("sgpod");
        let network = sys::unique("sgp");
        let root = &dir.path;
        let env = PodmanEnv {
            guard_state_dir: root.join("guard-state"),
            guard_log: root.join("guard.log"),
            guard_bin: PathBuf::from(cni::bin()),
            ipam_data_dir: root.join("ipam"),
            containers_conf: root.join("containers.conf"),
            storage_conf: root.join("storage.conf"),
            netns_seen: RefCell::new(Vec::new()),
            // Owned from the start so that a failure further down still deletes the bridge
            // once the first ADD has created it.
            _bridge: HostLink {
                name: network.clone(),
            },
            network,
            dir,
        };
        env.write_configs();
        env.import_image();
        env
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path.join(name)
    }

    fn write_configs(&self) {
        let plugin_dir = self.path("cni-bin");
        let net_dir = self.path("net.d");
        for dir in [
            &plugin_dir,
            &net_dir,
            &self.path("tmp"),
            &self.path("image-tmp"),
        ] {
            std::fs::create_dir_all(dir).expect("create podman dir");
        }
        // Podman takes one CNI_PATH for the whole chain, so the reference plugins and the
        // guard have to be reachable from the same directory.
        for entry in std::fs::read_dir(REFERENCE_PLUGINS).expect("read the CNI plugin dir") {
            let entry = entry.expect("CNI plugin dir entry");
            std::os::unix::fs::symlink(entry.path(), plugin_dir.join(entry.file_name()))
                .expect("link a reference plugin");
        }
        std::os::unix::fs::symlink(&self.guard_bin, plugin_dir.join("sandbox-guard"))
            .expect("link sandbox-guard");

        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.network,
                    "isGateway": true,
                    // No masquerading: the test needs no traffic off the host, and it keeps
                    // iptables untouched.
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": self.ipam_data_dir,
                        "ranges": [[{ "subnet": free_subnet() }]]
                    }
                },
                {
                    "type": "sandbox-guard",
                    "stateDir": self.guard_state_dir,
                    "staleDel": "refuse",
                    "logFile": self.guard_log
                }
            ]
        });
        write(
            &net_dir.join(format!("{}.conflist", self.network)),
            &serde_json::to_string_pretty(&conflist).unwrap(),
        );

        // CONTAINERS_CONF makes podman read this file alone, so nothing from /etc or the
        // host's podman leaks in. runc, cgroupfs and the ulimits are what podman needs on
        // these machines (crun fails on their hybrid cgroups); file locks and file events
        // keep podman off the shared /dev/shm lock segment and the journal.
        let containers_conf = format!(
            r#"[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[network]
network_backend = "cni"
cni_plugin_dirs = ["{plugins}"]
network_config_dir = "{net_dir}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
lock_type = "file"
events_logger = "file"
events_logfile_path = "{events}"
tmp_dir = "{tmp}"
image_copy_tmp_dir = "{image_tmp}"
volume_path = "{volumes}"
"#,
            plugins = plugin_dir.display(),
            net_dir = net_dir.display(),
            events = self.path("events.log").display(),
            tmp = self.path("tmp").display(),
            image_tmp = self.path("image-tmp").display(),
            volumes = self.path("volumes").display(),
        );
        write(&self.containers_conf, &containers_conf);

        // vfs: the image is one small layer, and vfs leaves no layer mounts behind when a
        // test dies half-way.
        let storage_conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            self.path("storage").display(),
            self.path("run").display()
        );
        write(&self.storage_conf, &storage_conf);
    }

    fn import_image(&self) {
        let rootfs = self.path("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).expect("create rootfs");
        std::fs::copy(CATATONIT, rootfs.join("bin/catatonit")).expect("copy catatonit");
        let tarball = self.path("rootfs.tar");
        sys::run(
            "tar",
            &["-C", path_str(&rootfs), "-cf", path_str(&tarball), "."],
        );
        self.podman(&[
            "import",
            "--quiet",
            // -P: no child to run, only wait for a signal; SIGTERM ends it, so `podman stop`
            // is quick.
            "--change",
            r#"ENTRYPOINT ["/bin/catatonit", "-P"]"#,
            path_str(&tarball),
            IMAGE,
        ]);
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.args(args)
            .env("CONTAINERS_CONF", &self.containers_conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage_conf)
            // A remote podman would run outside our configuration altogether.
            .env_remove("CONTAINER_HOST")
            .env_remove("CONTAINER_CONNECTION");
        cmd
    }

    /// Runs podman and returns its output without judging it (for cleanup and probes).
    pub fn podman_unchecked(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run podman: {e}"))
    }

    /// Runs podman, panicking with both streams when it fails. Podman only logs a failed
    /// CNI DEL (as `level=error`) and still exits 0, so error lines fail the call too.
    pub fn podman(&self, args: &[&str]) -> Output {
        let out = self.podman_unchecked(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("level=error"),
            "podman {} failed: {}\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            stderr
        );
        out
    }

    /// Starts a detached container named `name` on the test network and reads back what
    /// the CNI ADD gave it.
    pub fn run_container(&self, name: &str) -> Container {
        let out = self.podman(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            &self.network,
            IMAGE,
        ]);
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let container = self.inspect(&id);
        self.netns_seen.borrow_mut().push(container.netns.clone());
        container
    }

    fn inspect(&self, id: &str) -> Container {
        let out = self.podman(&["container", "inspect", id]);
        let inspected: Value = serde_json::from_slice(&out.stdout).expect("podman inspect JSON");
        let settings = &inspected[0]["NetworkSettings"];
        let attachment = &settings["Networks"][&self.network];
        let text = |v: &Value| {
            v.as_str()
                .unwrap_or_else(|| panic!("podman inspect of {id} lacks a field: {inspected:#}"))
                .to_string()
        };
        let ip = text(&attachment["IPAddress"]);
        let prefix_len = attachment["IPPrefixLen"].as_u64().expect("IPPrefixLen");
        Container {
            id: text(&inspected[0]["Id"]),
            netns: text(&settings["SandboxKey"]),
            ip_cidr: format!("{ip}/{prefix_len}"),
            ip,
            mac: text(&attachment["MacAddress"]),
        }
    }

    /// The guard's checkpoint records, through its own CLI (`--dump-checkpoints`).
    pub fn checkpoint_records(&self) -> Vec<Value> {
        if !self.guard_state_dir.exists() {
            // No ADD has reached the guard yet.
            return Vec::new();
        }
        cni::dump_checkpoints(&self.guard_state_dir, &[])
    }

    pub fn record_of(&self, container_id: &str) -> Option<Value> {
        self.checkpoint_records()
            .into_iter()
            .find(|record| record["containerId"] == container_id)
    }

    /// Waits for the container's checkpoint record to go. The teardown behind `podman stop`
    /// may run in conmon's cleanup process, whose errors nobody sees, so on timeout this
    /// shows what the guard did instead.
    pub fn wait_for_record_removal(&self, container_id: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.record_of(container_id).is_some() {
            assert!(
                Instant::now() < deadline,
                "the checkpoint of {container_id} outlived its container's DEL \
                 (libcni cache entry still there: {})\nrecords: {:#?}\nguard log:\n{}",
                self.libcni_cache_entry(container_id).exists(),
                self.checkpoint_records(),
                self.guard_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The guard's log (`logFile`), empty if it has written nothing.
    pub fn guard_log(&self) -> String {
        std::fs::read_to_string(&self.guard_log).unwrap_or_default()
    }

    /// libcni's cached ADD result for the container; it outlives a DEL that failed.
    pub fn libcni_cache_entry(&self, container_id: &str) -> PathBuf {
        Path::new(LIBCNI_RESULTS).join(format!("{}-{container_id}-{IFNAME}", self.network))
    }

    /// host-local's reservation of `ip`; it exists only until host-local itself gets the DEL,
    /// which happens after the guard's (a chain's DEL runs last plugin first).
    pub fn ipam_reservation(&self, ip: &str) -> PathBuf {
        self.ipam_data_dir.join(&self.network).join(ip)
    }
}

impl Drop for PodmanEnv {
    fn drop(&mut self) {
        // Removing the containers runs their DELs and deletes their netns and veths.
        self.podman_unchecked(&["rm", "--all", "--force", "--time", "0"]);
        // If a DEL failed podman may still have dropped its handle on the netns.
        for netns in self.netns_seen.borrow().iter() {
            if Path::new(netns).exists() {
                let name = Path::new(netns).file_name().unwrap().to_string_lossy();
                sys::try_run("ip", &["netns", "delete", &name]);
            }
        }
        // Per-container shm tmpfs mounts are left behind when podman itself could not
        // clean up; remove_dir_all cannot cross them.
        for mount in sys::mounts_below(&self.dir.path) {
            sys::try_run("umount", &["--lazy", &mount.to_string_lossy()]);
        }
        if let Ok(entries) = std::fs::read_dir(LIBCNI_RESULTS) {
            let prefix = format!("{}-", self.network);
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// A /24 of 10.100.0.0-10.199.255.255 that no host address or route overlaps yet and no
/// other network of this process took.
fn free_subnet() -> String {
    let [a, b, c] = sys::free_subnet(10, 100..=199);
    format!("{a}.{b}.{c}.0/24")
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}
