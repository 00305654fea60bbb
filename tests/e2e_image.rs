//! The node image (scripts/image.sh: FROM scratch, the static binary alone) built around the
//! binary under test, published with `--push` to a registry (Debian's docker-registry, the
//! CNCF distribution registry, run here on a loopback port), pulled back by the digest it
//! printed, as a DaemonSet pinned to it pulls it, and run as the DaemonSet runs it: with
//! podman, the host's CNI dirs mounted, `--install`, then `--uninstall`. The conf dir must end
//! as the installer's own tests expect it (testdata/install/calico), byte for byte.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/podman.rs"]
mod podman;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::process::Command;

use install::{assert_matches_fixture, copy_fixture, stub_plugins};

const TOOLS: &[&str] = &["podman", "readelf", "bash", "docker-registry"];

/// A registry of its own on a free loopback port, storage in `dir`; killed on drop.
struct Registry {
    child: std::process::Child,
    address: String,
}

impl Registry {
    fn start(dir: &std::path::Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!("version: 0.1\nlog: {{ level: error }}\nstorage: {{ filesystem: {{ rootdirectory: {} }} }}\nhttp: {{ addr: \"{address}\" }}\n", dir.join("blobs").display()),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run docker-registry");
        let registry = Registry { child, address };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the registry did not listen on {}",
                registry.address
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch image has no loader: only a static binary runs in it. The test suite's binary
/// is static when scripts/test.sh builds it (CI); a plain `cargo test` makes a dynamic one.
fn binary_is_static() -> bool {
    let out = Command::new("readelf")
        .args(["-lW", cni::bin()])
        .output()
        .expect("run readelf");
    !String::from_utf8_lossy(&out.stdout).contains("program interpreter")
}

#[test]
fn the_image_installs_and_uninstalls_the_guard_as_the_daemonset_runs_it() {
    sys::skip_unless_root!(TOOLS);
    if !binary_is_static() {
        assert!(
            std::env::var("CI").is_err(),
            "under CI the binary under test must be static (scripts/test.sh builds it so)"
        );
        println!(
            "SKIPPED the_image_installs_and_uninstalls_the_guard_as_the_daemonset_runs_it: {} is not static (run scripts/test.sh)",
            cni::bin()
        );
        return;
    }
    let dir = sys::TempDir::new("sgimg");
    let registry = Registry::start(&dir.path);
    let tag = format!(
        "{}/sandbox-guard:test-{}",
        registry.address,
        sys::unique("t")
    );
    let archive = dir.path.join("image.tar");
    let built = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/image.sh"))
        .args(["", &tag, "--push"])
        .env("SANDBOX_GUARD_BIN", cni::bin())
        .env("SANDBOX_GUARD_IMAGE_ARCHIVE", &archive)
        .env("SANDBOX_GUARD_TLS_VERIFY", "false")
        .output()
        .expect("run scripts/image.sh");
    // The build went to the host's storage; the archive and the registry are what nodes use.
    let _ = Command::new("podman")
        .args(["rmi", "--force", &tag])
        .output();
    assert!(
        built.status.success(),
        "scripts/image.sh failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let printed = String::from_utf8_lossy(&built.stdout).into_owned();
    let lines: Vec<&str> = printed.lines().collect();
    let repository = tag.rsplit_once(':').unwrap().0;
    assert_eq!(lines.len(), 2, "{printed}");
    assert_eq!(lines[0], archive.to_str().unwrap());
    let pinned = lines[1];
    let digest = pinned
        .strip_prefix(&format!("{repository}@sha256:"))
        .unwrap_or_else(|| panic!("not {repository}@sha256:...: {pinned}"));
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{pinned}"
    );

    let env = podman::PodmanEnv::new();
    env.podman(&["load", "--quiet", "--input", archive.to_str().unwrap()]);
    // What a node does with a DaemonSet pinned to the digest: pull exactly those bytes.
    env.podman(&["pull", "--quiet", "--tls-verify=false", pinned]);
    let tag = pinned;
    let (conf_dir, bin_dir) = (dir.path.join("net.d"), dir.path.join("bin"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::create_dir_all(&bin_dir).unwrap();
    copy_fixture("install/calico/conf", &conf_dir);
    // The primary's plugins where the runtime looks: the installer refuses a bin dir without them.
    stub_plugins(&conf_dir, &bin_dir);
    let mounts = [
        format!("{}:/host/etc/cni/net.d", conf_dir.display()),
        format!("{}:/host/opt/cni/bin", bin_dir.display()),
    ];
    let run = |args: &[&str]| {
        let mut all = vec![
            "run",
            "--rm",
            "--pull",
            "never",
            "--network",
            "none",
            "-v",
            &mounts[0],
            "-v",
            &mounts[1],
            tag,
        ];
        all.extend_from_slice(args);
        all.extend_from_slice(&[
            "--conf-dir",
            "/host/etc/cni/net.d",
            "--bin-dir",
            "/host/opt/cni/bin",
        ]);
        env.podman(&all);
    };

    run(&["--install", "--log-file", "/var/log/sandbox-guard.log"]);
    assert_matches_fixture(
        &conf_dir,
        "install/calico/chained",
        "after the image's --install",
    );
    assert_eq!(
        std::fs::read(bin_dir.join("sandbox-guard")).unwrap(),
        std::fs::read(cni::bin()).unwrap(),
        "the image installs itself"
    );
    assert_eq!(
        std::fs::read(bin_dir.join("sandbox-guard-ctl")).unwrap(),
        std::fs::read(cni::ctl()).unwrap(),
        "the image installs the operator's binary beside the plugin"
    );
    run(&["--uninstall", "--remove-binary"]);
    assert_matches_fixture(
        &conf_dir,
        "install/calico/conf",
        "after the image's --uninstall",
    );
    assert!(!bin_dir.join("sandbox-guard").exists());
    assert!(!bin_dir.join("sandbox-guard-ctl").exists());
    env.podman(&["rmi", "--force", tag]);
}
