//! `--install` and `--uninstall` on conf dirs shaped as real primaries leave them
//! (testdata/install/<primary>/conf) and checked byte for byte against the expected dirs
//! (testdata/install/<primary>/<mode>): install, install again (not one file rewritten),
//! the primary's installer rewriting its file, uninstall (the primary's bytes back), and the
//! inputs refused without a write. `--watch` against a primary that keeps rewriting and
//! against a second watcher that strips the entry each time. No root needed.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use install::{
    assert_matches_fixture, contents, copy_fixture, primary_rewrites, run, run_ok, stub_plugins,
    tree,
};

const LOG: [&str; 2] = ["--log-file", "/var/log/sandbox-guard.log"];

/// Each primary's conf dir and the network file the guard goes into, with the modes that
/// apply (a drop-in needs a .conflist that the runtime reads itself, not through multus)
/// and a --network to give. Multus (thick and thin, as they write their files) is guarded
/// in the cluster network it delegates to, multus's own file left alone.
const CASES: [(&str, &str, &[&str], Option<&str>); 8] = [
    (
        "calico",
        "10-calico.conflist",
        &["chained", "delegate", "dropin"],
        None,
    ),
    (
        "flannel",
        "10-flannel.conflist",
        &["chained", "delegate", "dropin"],
        None,
    ),
    (
        "cilium-chaining",
        "05-cilium.conflist",
        &["chained", "delegate", "dropin"],
        None,
    ),
    ("macvlan-conf", "20-macvlan.conf", &["delegate"], None),
    (
        "ovn-multus-thick",
        "10-ovn-kubernetes.conf",
        &["delegate"],
        None,
    ),
    (
        "multus-thick",
        "10-calico.conflist",
        &["chained", "delegate"],
        None,
    ),
    (
        "multus-thin",
        "10-calico.conflist",
        &["chained", "delegate"],
        None,
    ),
    (
        "multus-thick",
        "10-calico.conflist",
        &["chained"],
        Some("multus-cni-network"),
    ),
];

struct Node {
    dir: sys::TempDir,
}

impl Node {
    /// A layout's conf dir (`conf`), or a whole host's tree (`host`, OpenShift's dirs).
    fn with(case: &str) -> Node {
        let node = Node {
            dir: sys::TempDir::new("sginst"),
        };
        if testdata::fixture_path("install")
            .join(case)
            .join("host")
            .is_dir()
        {
            std::fs::create_dir_all(node.dir.path.join("host")).unwrap();
            copy_fixture(&format!("install/{case}/host"), &node.dir.path.join("host"));
            stub_plugins(&node.dir.path.join("host"), &node.bin());
            return node;
        }
        std::fs::create_dir_all(node.conf()).unwrap();
        copy_fixture(&format!("install/{case}/conf"), &node.conf());
        stub_plugins(&node.conf(), &node.bin());
        node
    }

    /// The host's root, for a layout that is a whole host's tree.
    fn host(&self) -> Option<PathBuf> {
        Some(self.dir.path.join("host")).filter(|h| h.is_dir())
    }

    fn conf(&self) -> std::path::PathBuf {
        match self.host() {
            Some(host) => host.join("etc/kubernetes/cni/net.d"),
            None => self.dir.path.join("net.d"),
        }
    }

    fn bin(&self) -> std::path::PathBuf {
        match self.host() {
            Some(host) => host.join("var/lib/cni/bin"),
            None => self.dir.path.join("bin"),
        }
    }

    /// `--host-root` for a host's tree.
    fn host_args(&self) -> Vec<String> {
        self.host()
            .map(|h| vec!["--host-root".to_string(), h.display().to_string()])
            .unwrap_or_default()
    }

    /// `run` with the node's host root.
    fn run(&self, mode: &str, extra: &[&str]) -> std::process::Output {
        let host = self.host_args();
        let mut args: Vec<&str> = host.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        run(mode, &self.conf(), &self.bin(), &args)
    }

    fn args<'a>(mode: Option<&'a str>, network: Option<&'a str>) -> Vec<&'a str> {
        let mut args = LOG.to_vec();
        if let Some(mode) = mode {
            args.extend(["--mode", mode]);
        }
        if let Some(network) = network {
            args.extend(["--network", network]);
        }
        args
    }

    /// `run` with `--host-root` the node's own dir: a host path such as multus's binDir is
    /// then one of its dirs, and this machine's cached attachments stay out of it.
    fn run_under_its_dir(&self, mode: &str, extra: &[&str]) -> std::process::Output {
        let root = self.dir.path.display().to_string();
        run(
            mode,
            &self.conf(),
            &self.bin(),
            &[&["--host-root", root.as_str()][..], extra].concat(),
        )
    }

    /// `/multus-bin` under the node's dir, holding the networks' plugins: a binDir multus
    /// runs them from.
    fn multus_bin_dir(&self) -> PathBuf {
        let dir = self.dir.path.join("multus-bin");
        stub_plugins(&self.conf(), &dir);
        dir
    }

    /// Multus thick's file naming `/multus-bin` as its binDir (a host's dir beside
    /// `var/lib/cni`), which holds the networks' plugins: returns that dir.
    fn with_multus_bin_dir_named(&self) -> PathBuf {
        std::fs::create_dir_all(self.dir.path.join("var/lib/cni")).unwrap();
        let multus_bin = self.multus_bin_dir();
        let multus = self.conf().join("00-multus.conf");
        let mut conf: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&multus).unwrap()).unwrap();
        conf["binDir"] = "/multus-bin".into();
        std::fs::write(&multus, conf.to_string()).unwrap();
        multus_bin
    }

    fn install(&self, mode: &str, network: Option<&str>) -> String {
        run_ok(
            "--install",
            &self.conf(),
            &self.bin(),
            &Node::args(Some(mode), network),
        )
    }

    fn uninstall(&self, network: Option<&str>) -> String {
        let mut args = vec![];
        if let Some(network) = network {
            args.extend(["--network", network]);
        }
        run_ok("--uninstall", &self.conf(), &self.bin(), &args)
    }
}

#[test]
fn install_reinstall_rewrite_uninstall_byte_for_byte() {
    for (case, file, modes, network) in CASES {
        for mode in modes {
            let node = Node::with(case);
            let primary_file = node.conf().join(file);
            let original = std::fs::read(&primary_file).unwrap();
            // The primary's mode, which every file the installer writes in its place keeps.
            std::fs::set_permissions(
                &primary_file,
                std::os::unix::fs::PermissionsExt::from_mode(0o640),
            )
            .unwrap();
            let before = contents(&node.conf());
            let when = format!("{case} {mode}");

            let said = node.install(mode, network);
            assert!(!said.contains("already installed"), "{when}: {said}");
            assert_matches_fixture(
                &node.conf(),
                &format!("install/{case}/{mode}"),
                &format!("{when}: install"),
            );
            let stem = Path::new(file).file_stem().unwrap().to_str().unwrap();
            for (path, state) in tree(&node.conf()) {
                if *mode != "dropin" && path.to_str().unwrap().starts_with(stem) {
                    assert_eq!(
                        state.mode,
                        0o640,
                        "{when}: {} lost the primary's mode",
                        path.display()
                    );
                }
            }

            let settled = tree(&node.conf());
            let said = node.install(mode, network);
            assert_eq!(said.trim(), "already installed: nothing changed", "{when}");
            assert_eq!(
                tree(&node.conf()),
                settled,
                "{when}: a second install rewrote a file"
            );

            // The primary's installer writes its file again (an upgrade): the entry is gone.
            primary_rewrites(&primary_file, &original);
            std::fs::set_permissions(
                &primary_file,
                std::os::unix::fs::PermissionsExt::from_mode(0o640),
            )
            .unwrap();
            node.install(mode, network);
            assert_matches_fixture(
                &node.conf(),
                &format!("install/{case}/{mode}"),
                &format!("{when}: after the primary's rewrite"),
            );

            let said = node.uninstall(network);
            assert!(!said.contains("not installed"), "{when}: {said}");
            assert_eq!(
                contents(&node.conf()),
                before,
                "{when}: uninstall did not give the primary's files back"
            );
            assert_eq!(
                cni::mode(&primary_file),
                0o640,
                "{when}: uninstall lost the mode"
            );
            assert_eq!(
                node.uninstall(network).trim(),
                "not installed: nothing changed",
                "{when}"
            );
        }
    }
}

#[test]
fn switching_modes_leaves_one_guard_and_uninstall_still_restores() {
    let node = Node::with("calico");
    let before = contents(&node.conf());
    for mode in ["chained", "delegate", "dropin", "delegate", "chained"] {
        node.install(mode, None);
        assert_matches_fixture(&node.conf(), &format!("install/calico/{mode}"), mode);
    }
    node.uninstall(None);
    assert_eq!(contents(&node.conf()), before);
}

#[test]
fn the_binary_is_copied_once_and_removed_only_when_asked() {
    let node = Node::with("flannel");
    let binary = node.bin().join("sandbox-guard");
    let ctl = node.bin().join("sandbox-guard-ctl");
    node.install("chained", None);
    assert_eq!(
        std::fs::read(&binary).unwrap(),
        std::fs::read(cni::bin()).unwrap()
    );
    assert_eq!(
        std::fs::read(&ctl).unwrap(),
        std::fs::read(cni::ctl()).unwrap(),
        "the operator's binary goes beside the plugin"
    );
    assert_eq!(cni::mode(&binary), 0o755);
    assert_eq!(cni::mode(&ctl), 0o755);
    let first = tree(&node.bin());
    node.install("delegate", None);
    assert_eq!(
        tree(&node.bin()),
        first,
        "an identical binary was copied again"
    );
    node.uninstall(None);
    assert!(
        binary.exists(),
        "uninstall without --remove-binary removed the binary"
    );
    node.install("chained", None);
    let root = private_root(&node);
    run_ok(
        "--uninstall",
        &node.conf(),
        &node.bin(),
        &["--remove-binary", "--host-root", &root],
    );
    assert!(!binary.exists());
    assert!(!ctl.exists());
    assert_eq!(
        contents(&node.conf()),
        contents(&testdata::fixture_path("install/flannel/conf"))
    );
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let refused = |node: &Node, args: &[&str], says: &str| {
        let before = tree(&node.dir.path);
        let out = run("--install", &node.conf(), &node.bin(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("nothing written"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            tree(&node.dir.path),
            before,
            "{args:?}: a refused install wrote"
        );
        assert!(
            !node.bin().join("sandbox-guard").exists(),
            "{args:?}: the binary was copied before the refusal"
        );
    };
    let empty = Node {
        dir: sys::TempDir::new("sginst"),
    };
    std::fs::create_dir_all(empty.bin()).unwrap();
    std::fs::create_dir_all(empty.conf()).unwrap();
    std::fs::write(empty.conf().join("README"), "not a network").unwrap();
    refused(&empty, &[], "no CNI network in");

    // Several networks without --network are no longer refused: the runtime's is guarded.
    let multus = Node::with("multus-thick");
    refused(&multus, &["--network", "nope"], "no network named \"nope\"");
    // Multus runs its cluster network itself: a drop-in there would never run.
    refused(
        &multus,
        &["--network", "multus-cni-network", "--mode", "dropin"],
        "multus (thick) runs 10-calico.conflist itself",
    );
    let macvlan = Node::with("macvlan-conf");
    refused(
        &macvlan,
        &["--mode", "dropin"],
        "--mode dropin needs the network in a .conflist",
    );

    let broken = Node::with("calico");
    std::fs::copy(
        testdata::fixture_path("conflists/broken/truncated.conflist"),
        broken.conf().join("05-half.conflist"),
    )
    .unwrap();
    refused(&broken, &[], "does not parse as JSON");
    // After the network it is not the runtime's choice either way: installed, left alone.
    std::fs::rename(
        broken.conf().join("05-half.conflist"),
        broken.conf().join("99-half.conflist"),
    )
    .unwrap();
    broken.install("chained", None);

    let inlined = Node::with("cilium-chaining");
    let file = inlined.conf().join("05-cilium.conflist");
    let text = std::fs::read_to_string(&file).unwrap().replacen(
        '{',
        "{\n  \"loadOnlyInlinedPlugins\": true,",
        1,
    );
    std::fs::write(&file, text).unwrap();
    refused(&inlined, &["--mode", "dropin"], "loadOnlyInlinedPlugins");

    // A single plugin's file is never converted (its owner and others name it by path).
    refused(
        &Node::with("macvlan-conf"),
        &["--mode", "chained"],
        "use --mode delegate, which wraps the plugin in place",
    );
}

/// A running `--install --watch` and the lines it logs, read as they come.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(node: &Node, mode: &str) -> Watcher {
        Watcher::start_with(node, mode, &[], "installed: put sandbox-guard into")
    }

    /// A watcher with `extra` arguments, started once it logged `first`.
    fn start_with(node: &Node, mode: &str, extra: &[&str], first: &str) -> Watcher {
        let mut child = Command::new(cni::bin())
            .args([
                "--install",
                "--watch",
                "--mode",
                mode,
                "--conf-dir",
                node.conf().to_str().unwrap(),
            ])
            .args(["--bin-dir", node.bin().to_str().unwrap()])
            .args(LOG)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let watcher = Watcher { child, lines };
        watcher.wait_for("watching", Duration::from_secs(10));
        watcher.wait_for(first, Duration::from_secs(10));
        // Then whether the probe would say ready, logged once each time that changes.
        watcher.wait_for("ready", Duration::from_secs(10));
        watcher
    }

    fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} within {within:?}"),
            }
        }
    }

    /// Every line logged until `quiet` passes without one.
    fn drain(&self, quiet: Duration) -> Vec<String> {
        std::iter::from_fn(|| self.lines.recv_timeout(quiet).ok()).collect()
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        send_signal(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "--watch ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send_signal(pid: u32, signal: &str) {
    sys::run("kill", &[&format!("-{signal}"), &pid.to_string()]);
}

#[test]
fn watch_puts_the_entry_back_after_each_rewrite_without_a_loop() {
    let node = Node::with("calico");
    let file = node.conf().join("10-calico.conflist");
    let original = std::fs::read(&file).unwrap();
    let watcher = Watcher::start(&node, "delegate");
    assert_matches_fixture(&node.conf(), "install/calico/delegate", "watch start");

    // The primary's installer, three ways: rename over, write in place, delete and re-create.
    let rewrites: [&dyn Fn(); 3] = [
        &|| primary_rewrites(&file, &original),
        &|| std::fs::write(&file, &original).unwrap(),
        &|| {
            std::fs::remove_file(&file).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            std::fs::write(&file, &original).unwrap();
        },
    ];
    for (i, rewrite) in rewrites.iter().enumerate() {
        let started = Instant::now();
        rewrite();
        watcher.wait_for("re-inserted", Duration::from_secs(5));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "rewrite {i}: the entry came back after {:?}",
            started.elapsed()
        );
        // Its own write wakes it once more and changes nothing: no further line, no write.
        let settled = tree(&node.conf());
        let more = watcher.drain(Duration::from_secs(2));
        assert!(
            more.is_empty(),
            "rewrite {i}: the watcher went on: {more:?}"
        );
        assert_eq!(
            tree(&node.conf()),
            settled,
            "rewrite {i}: a write after the re-insert"
        );
        assert_matches_fixture(
            &node.conf(),
            "install/calico/delegate",
            &format!("after rewrite {i}"),
        );
    }
    let status = watcher.terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM must end --watch cleanly");
    assert_matches_fixture(
        &node.conf(),
        "install/calico/delegate",
        "after SIGTERM (stays installed)",
    );
}

#[test]
fn watch_backs_off_from_a_watcher_that_strips_the_entry() {
    let node = Node::with("flannel");
    let file = node.conf().join("10-flannel.conflist");
    let original = std::fs::read(&file).unwrap();
    let watcher = Watcher::start(&node, "chained");
    // A second watcher that puts its own version back whenever the file is not it: the two
    // would rewrite each other for ever.
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut competitor_writes = 0;
    while Instant::now() < deadline {
        if std::fs::read(&file).unwrap() != original {
            primary_rewrites(&file, &original);
            competitor_writes += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines = watcher.drain(Duration::from_millis(200));
    let reinserts = lines.iter().filter(|l| l.contains("re-inserted")).count();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("another writer keeps rewriting")),
        "{lines:#?}"
    );
    // Five in the first minute, then one more after each doubling wait (1 s, 2 s, 4 s).
    assert!(
        reinserts <= 9,
        "{reinserts} re-inserts in 12 s against {competitor_writes} strips: {lines:#?}"
    );
    assert_eq!(watcher.terminate().code(), Some(0));
}

#[test]
fn usage_errors_exit_2_before_anything_runs() {
    let node = Node::with("calico");
    let before = tree(&node.dir.path);
    for (args, says) in [
        (
            &["--mode", "last"][..],
            "--mode \"last\": use chained, delegate or dropin",
        ),
        (&["--state-dir", "var/lib/x"], "give an absolute path"),
        (
            &["--remove-binary"],
            "--remove-binary belongs to --uninstall",
        ),
        (&["--lock-timeout", "3"], "--lock-timeout belongs to"),
        (&["extra"], "--install takes options only"),
        (
            &["--metrics-file", "/tmp/x.prom"],
            "--metrics-file goes with --watch",
        ),
        (
            &["--check", "--watch"],
            "--check and --watch exclude each other",
        ),
        (
            &["--platform", "eks"],
            "use auto, default, gke, k3s or openshift",
        ),
        (&["--entry", "[1]"], "--entry is not a JSON object"),
    ] {
        let out = run("--install", &node.conf(), &node.bin(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = run("--uninstall", &node.conf(), &node.bin(), &["--watch"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&node.dir.path), before);
    let help = cni::guard_ok(&["--install", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--mode chained|delegate|dropin"));
}

/// Only delegate mode replays deferred DELs: leaving it while some wait would leave them to
/// nobody, and the primary would never free those sandboxes' addresses.
#[test]
fn leaving_delegate_mode_while_deferred_dels_wait_is_refused_unless_forced() {
    let node = Node::with("calico");
    let state = sys::TempDir::new("sginstst");
    let state_dir = state.path.join("state");
    let with_state = |mode: &str| {
        let mut args = Node::args(Some(mode), None);
        args.extend(["--state-dir", state_dir.to_str().unwrap()]);
        args.into_iter().map(String::from).collect::<Vec<String>>()
    };
    run_ok(
        "--install",
        &node.conf(),
        &node.bin(),
        &strs(&with_state("delegate")),
    );
    let a = defer_a_stale_del(&state_dir, &state.path);
    let before = contents(&node.conf());
    for (mode, args) in [
        ("--install", with_state("chained")),
        ("--uninstall", vec![]),
    ] {
        let out = run(mode, &node.conf(), &node.bin(), &strs(&args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{mode} must refuse while a deferred DEL waits"
        );
        assert!(
            stderr.contains("1 deferred DELs")
                && stderr.contains(&a[..12])
                && stderr.contains("--force"),
            "{stderr}"
        );
        assert_eq!(
            contents(&node.conf()),
            before,
            "{mode} refused, so nothing is written"
        );
    }
    let out = run_ok("--uninstall", &node.conf(), &node.bin(), &["--force"]);
    assert!(
        out.contains("--force") && out.contains("dropped"),
        "--force says what is lost: {out}"
    );
    assert!(contents(&node.conf()) != before, "--force goes on");
}

/// Turning the API server's view off (an install without `--api-credentials`) while delegate
/// mode holds a DEL with its kubeconfig: the installer writes the off sign over the file, which
/// lets that DEL reach the primary at the next verb, and says which DELs those are.
#[test]
fn turning_the_view_off_says_which_held_dels_now_reach_the_primary() {
    let node = Node::with("calico");
    let state = sys::TempDir::new("sginstvw");
    let state_dir = state.path.join("state");
    let sa = state.path.join("sa");
    std::fs::create_dir(&sa).unwrap();
    std::fs::write(sa.join("token"), "t").unwrap();
    std::fs::write(sa.join("ca.crt"), "PEM").unwrap();
    let args = |view: bool| {
        let mut args: Vec<String> = Node::args(Some("delegate"), None)
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--state-dir".into(), state_dir.display().to_string()]);
        if view {
            args.extend(["--api-credentials".into(), sa.display().to_string()]);
            args.extend(["--api-server".into(), "https://127.0.0.1:6443".into()]);
        }
        args
    };
    run_ok("--install", &node.conf(), &node.bin(), &strs(&args(true)));
    let kubeconfig = node.conf().join("sandbox-guard.d/kubeconfig");
    assert!(kubeconfig.is_file());
    defer_a_stale_del(&state_dir, &state.path);
    // Held for the API server's pod with that kubeconfig, as rule 7 keeps it.
    let store = sandbox_guard::state::Store::open(&state_dir, Duration::from_secs(5)).unwrap();
    let (_, loaded) = store.list_deferred().unwrap().pop().unwrap();
    let sandbox_guard::state::Loaded::Valid(mut held) = loaded else {
        panic!("the deferred DEL does not read back")
    };
    held.moved_to = Some(sandbox_guard::state::held::MovedTo {
        pod_uid: "the-pod-on-node-b".into(),
        node: Some("node-b".into()),
        kubeconfig: kubeconfig.clone(),
        scope: "cluster".into(),
        this_node: "node-a".into(),
    });
    store.save_deferred(&held).unwrap();
    drop(store);
    let out = run("--install", &node.conf(), &node.bin(), &strs(&args(false)));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).unwrap(),
        sandbox_guard::state::held::VIEW_OFF
    );
    let said = stderr_of(&out);
    assert!(
        said.contains("warning: 1 DELs") && said.contains("lijiaob/etcd1-0"),
        "the turn-off did not name the held DEL: {said}"
    );
    // Looked at again (as the watch does), the sign already there: nothing to warn of.
    let again = stderr_of(&run(
        "--install",
        &node.conf(),
        &node.bin(),
        &strs(&args(false)),
    ));
    assert!(!again.contains("stay held"), "{again}");
    // The sign in a file others may write, which the plugin does not trust (an operator's
    // `echo` under umask 002): it is written again, 0600, so the held DEL is let go.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o664)).unwrap();
    let untrusted = stderr_of(&run(
        "--install",
        &node.conf(),
        &node.bin(),
        &strs(&args(false)),
    ));
    assert!(
        untrusted.contains("wrote") && !untrusted.contains("stay held"),
        "{untrusted}"
    );
    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{untrusted}");

    // Gone while the DEL is held with it, as an earlier release left it on turn-off, and
    // another network names its path: nothing is written, that network asks with it.
    std::fs::remove_dir_all(kubeconfig.parent().unwrap()).unwrap();
    let other = node.conf().join("20-other.conflist");
    std::fs::write(
        &other,
        serde_json::json!({"cniVersion": "1.0.0", "name": "other", "plugins": [
            {"type": "bridge"},
            {"type": "sandbox-guard", "kubeconfig": kubeconfig.to_str().unwrap()},
        ]})
        .to_string(),
    )
    .unwrap();
    let out = run("--install", &node.conf(), &node.bin(), &strs(&args(false)));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        !kubeconfig.exists(),
        "the sign was written while {} names the file: {}",
        other.display(),
        stderr_of(&out)
    );
    std::fs::remove_file(&other).unwrap();
    // Then with nothing naming it: the install writes the sign again, in a folder of its own,
    // finding the held DEL in the entry's own stateDir (no --state-dir given this time).
    let without_state_dir: Vec<String> = Node::args(Some("delegate"), None)
        .into_iter()
        .map(String::from)
        .collect();
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &strs(&without_state_dir),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).unwrap(),
        sandbox_guard::state::held::VIEW_OFF,
        "{}",
        stderr_of(&out)
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(kubeconfig.parent().unwrap())
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700);

    // Turned on again while the ServiceAccount's files cannot be read: the sign goes, so the
    // held DEL waits for the kubeconfig instead of being released.
    let empty = state.path.join("empty-sa");
    std::fs::create_dir(&empty).unwrap();
    let mut on: Vec<String> = args(false);
    on.extend(["--api-credentials".into(), empty.display().to_string()]);
    on.extend(["--api-server".into(), "https://127.0.0.1:6443".into()]);
    let out = run("--install", &node.conf(), &node.bin(), &strs(&on));
    assert!(
        !kubeconfig.exists(),
        "the off sign stayed while the view is asked for: {}",
        stderr_of(&out)
    );

    // The view turned on with a kubeconfig of the operator's instead, and --api-credentials
    // gone: the installer's file is removed, not turned off, so the held DEL asks with the
    // operator's.
    run_ok("--install", &node.conf(), &node.bin(), &strs(&args(true)));
    assert!(kubeconfig.is_file());
    let own = state.path.join("own.kubeconfig");
    let mut theirs = args(false);
    theirs.extend([
        "--entry".into(),
        format!(r#"{{"kubeconfig": "{}"}}"#, own.display()),
    ]);
    let out = run("--install", &node.conf(), &node.bin(), &strs(&theirs));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        !kubeconfig.exists(),
        "the installer's kubeconfig stayed (or holds the off sign) while the entry names another: {}",
        stderr_of(&out)
    );

    // A `null` kubeconfig is none, as the plugin reads it: the file is turned off.
    run_ok("--install", &node.conf(), &node.bin(), &strs(&args(true)));
    let mut none = args(false);
    none.extend(["--entry".into(), r#"{"kubeconfig": null}"#.into()]);
    let out = run("--install", &node.conf(), &node.bin(), &strs(&none));
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).unwrap_or_default(),
        sandbox_guard::state::held::VIEW_OFF,
        "{}",
        stderr_of(&out)
    );
}

/// Whether deferred DELs wait is a question only while no replay runs: a replay worker that
/// fails an attempt keeps its entry, one that is about to start would find the guard gone
/// after. --uninstall waits a bounded time for the workers (each holds `replay.lock` shared,
/// as the test does here) and, failing that, refuses and writes nothing. The state dir is
/// mounted read-only, as the DaemonSets mount the host's.
#[test]
fn leaving_delegate_mode_waits_for_the_replays_running_and_refuses_if_they_go_on() {
    let node = Node::with("calico");
    let state = sys::TempDir::new("sginstrp");
    let state_dir = state.path.join("state");
    let mut args = Node::args(Some("delegate"), None);
    args.extend(["--state-dir", state_dir.to_str().unwrap()]);
    run_ok("--install", &node.conf(), &node.bin(), &args);
    std::fs::create_dir_all(&state_dir).unwrap();
    let worker = std::fs::File::create(state_dir.join("replay.lock")).unwrap();
    worker.lock_shared().unwrap();
    let _read_only = mount::Mount::read_only_bind(&state_dir);
    let before = contents(&node.conf());
    let out = run("--uninstall", &node.conf(), &node.bin(), &[]);
    assert!(
        !out.status.success() && stderr_of(&out).contains("replay workers"),
        "--uninstall went on beside a replay: {out:?}"
    );
    assert_eq!(
        contents(&node.conf()),
        before,
        "refused, so nothing is written"
    );
    drop(worker);
    run_ok("--uninstall", &node.conf(), &node.bin(), &[]);
    assert!(contents(&node.conf()) != before);
}

/// A node upgraded from a guard that wrapped aws-cni in a chain with cilium-cni after it:
/// `--install --mode delegate` now wraps cilium-cni (whose DEL is the one acting by the pod's
/// name), and goes on while a stale DEL deferred for the plugin wrapped before waits: each
/// deferred DEL keeps the plugin it was deferred for, and its replay goes there.
#[test]
fn an_upgrade_wraps_cilium_cni_and_keeps_the_deferred_dels_plugin() {
    let node = Node::with("aws-vpc-cni");
    let state = sys::TempDir::new("sginstrw");
    let state_dir = state.path.join("state");
    let file = install::network_files(&node.conf())[0].clone();
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let plugins = list["plugins"].as_array_mut().unwrap();
    let aws = plugins.remove(0);
    plugins.insert(
        0,
        serde_json::json!({"type": "sandbox-guard", "stateDir": state_dir, "delegate": aws}),
    );
    plugins.push(serde_json::json!({"type": "cilium-cni", "chaining-mode": "aws-cni"}));
    std::fs::write(&file, list.to_string()).unwrap();
    std::fs::write(node.bin().join("cilium-cni"), b"").unwrap();
    let a = defer_a_stale_del_on(&state_dir, &state.path, "aws-cni");
    let deferred_for = || {
        let entry = cni::walk(&state_dir.join("deferred"))
            .into_iter()
            .find(|p| p.to_string_lossy().contains(&a))
            .expect("A's deferred DEL");
        let entry: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry).unwrap()).unwrap();
        entry["record"]["delegate"]["type"].clone()
    };
    let before = deferred_for();
    assert!(before.is_string(), "{before}");
    let mut args = Node::args(Some("delegate"), None);
    args.extend(["--state-dir", state_dir.to_str().unwrap()]);
    // Not ready as it stands: cilium-cni's DEL runs unheld.
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &[&args[..], &["--check"]].concat(),
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
    assert!(
        !out.status.success()
            && said.contains("wraps aws-cni")
            && said.contains("run --install again to wrap cilium-cni"),
        "{said}"
    );
    run_ok("--install", &node.conf(), &node.bin(), &args);
    let list: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(list["plugins"][0]["type"], "aws-cni", "{list}");
    let last = list["plugins"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["delegate"]["type"], "cilium-cni", "{list}");
    assert_eq!(deferred_for(), before, "the deferred DEL's plugin changed");
}

/// A chained DEL refused because the API server showed the pod's name on another pod keeps
/// that hold in its record, and CRI-O hands its retries the cached config of its ADD, which
/// names the installer's kubeconfig: an uninstall removing that file would hold them for good.
/// It writes the off sign there instead, and says whose DELs now go by the local rule.
#[test]
fn an_uninstall_leaves_the_off_sign_where_chained_dels_are_held() {
    let node = Node::with("calico");
    let state = sys::TempDir::new("sginstch");
    let state_dir = state.path.join("state");
    let sa = state.path.join("sa");
    std::fs::create_dir(&sa).unwrap();
    std::fs::write(sa.join("token"), "t").unwrap();
    std::fs::write(sa.join("ca.crt"), "PEM").unwrap();
    let mut args: Vec<String> = Node::args(Some("chained"), None)
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(["--state-dir".into(), state_dir.display().to_string()]);
    args.extend(["--api-credentials".into(), sa.display().to_string()]);
    args.extend(["--api-server".into(), "https://127.0.0.1:6443".into()]);
    run_ok("--install", &node.conf(), &node.bin(), &strs(&args));
    let kubeconfig = node.conf().join("sandbox-guard.d/kubeconfig");
    assert!(kubeconfig.is_file());
    let store = cni::Store::with_state_dir(state_dir.clone(), &state.path);
    store
        .add(&cni::container_id(), &cni::Pod::new("lijiaob", "etcd1-0"))
        .run()
        .assert_ok();
    // Refused by rule 7, as the record keeps it.
    let kept = sandbox_guard::state::Store::open(&state_dir, Duration::from_secs(5)).unwrap();
    let (_, loaded) = kept.list_records().unwrap().pop().unwrap();
    let sandbox_guard::state::Loaded::Valid(mut record) = loaded else {
        panic!("the record does not read back")
    };
    record.held = Some(sandbox_guard::state::held::MovedTo {
        pod_uid: "the-pod-on-node-b".into(),
        node: Some("node-b".into()),
        kubeconfig: kubeconfig.clone(),
        scope: "cluster".into(),
        this_node: "node-a".into(),
    });
    kept.save_record(&record).unwrap();
    drop(kept);

    let out = run_ok("--uninstall", &node.conf(), &node.bin(), &[]);
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).ok().as_deref(),
        Some(sandbox_guard::state::held::VIEW_OFF),
        "the kubeconfig DELs are held with was not turned off: {out}"
    );
    assert!(out.contains("lijiaob/etcd1-0"), "{out}");
}

/// A stale DEL deferred on calico's network in delegate mode: ADD A, ADD B of one pod, then
/// A's DEL. Returns A.
fn defer_a_stale_del(state_dir: &Path, scratch: &Path) -> String {
    defer_a_stale_del_on(state_dir, scratch, "k8s-pod-network")
}

/// `defer_a_stale_del` on network `network`.
fn defer_a_stale_del_on(state_dir: &Path, scratch: &Path, network: &str) -> String {
    let store = cni::Store::with_state_dir(state_dir.to_path_buf(), scratch);
    let recording = primary::RecordingPrimary::new();
    let pod = cni::Pod::new("lijiaob", "etcd1-0");
    let (a, b) = (cni::container_id(), cni::container_id());
    for call in [
        store.add(&a, &pod),
        store.add(&b, &pod),
        store.del(&a, &pod),
    ] {
        recording.wrap(call.network(network)).run().assert_ok();
    }
    a
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Whether the guard speaks a CNI version, from `--version`: "sandbox-guard X (CNI a, b)".
fn speaks(version: &str) -> bool {
    let said = String::from_utf8_lossy(&cni::guard_ok(&["--version"]).stdout).into_owned();
    let versions = said
        .split("(CNI ")
        .nth(1)
        .unwrap_or_default()
        .trim_end()
        .trim_end_matches(')');
    versions.split(", ").any(|v| v == version)
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Sets the cniVersion of every network file of a conf dir (a list's and its plugins').
fn set_version(conf: &Path, version: Option<&str>) {
    for file in install::network_files(conf) {
        let mut value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let set = |v: &mut serde_json::Value| match version {
            Some(version) => v["cniVersion"] = version.into(),
            None => drop(v.as_object_mut().unwrap().remove("cniVersion")),
        };
        set(&mut value);
        std::fs::write(&file, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    }
}

#[test]
fn a_network_the_guard_cannot_run_in_is_refused_and_nothing_is_written() {
    // Catches both being installed, which fails every ADD on the node.
    for version in [Some("0.5.0"), Some("2.0.0")] {
        let node = Node::with("calico");
        set_version(&node.conf(), version);
        let before = tree(&node.dir.path);
        let out = run("--install", &node.conf(), &node.bin(), &[]);
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{version:?}: {stderr}");
        assert!(
            stderr.contains("which sandbox-guard does not speak")
                && stderr.contains("nothing written"),
            "{version:?}: {stderr}"
        );
        assert_eq!(
            tree(&node.dir.path),
            before,
            "{version:?}: a refused install wrote"
        );
    }
    // A config without cniVersion is the oldest version to the runtime: refused or guarded
    // exactly as that version is.
    let node = Node::with("calico");
    set_version(&node.conf(), None);
    let speaks_0_1_0 = speaks("0.1.0");
    let out = run("--install", &node.conf(), &node.bin(), &[]);
    assert_eq!(out.status.success(), speaks_0_1_0, "{}", stderr_of(&out));

    // The bin dir the runtime does not use: none of calico's plugins in it.
    let node = Node::with("calico");
    let elsewhere = node.dir.path.join("opt-cni-bin");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let before = tree(&node.dir.path);
    let out = run("--install", &node.conf(), &elsewhere, &[]);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("network k8s-pod-network names plugins the runtime cannot find in")
            && stderr.contains("calico, calico-ipam, portmap, bandwidth")
            && stderr.contains("--platform"),
        "{stderr}"
    );
    assert_eq!(tree(&node.dir.path), before);
}

#[test]
fn platform_presets_and_detection_find_the_runtimes_dirs() {
    // Each platform's layout under a host root, as the DaemonSet mounts it under /host.
    for (platform, conf, bin) in [
        ("gke", "etc/cni/net.d", "home/kubernetes/bin"),
        (
            "k3s",
            "var/lib/rancher/k3s/agent/etc/cni/net.d",
            "var/lib/rancher/k3s/data/9f3a8c/bin",
        ),
        ("openshift", "etc/kubernetes/cni/net.d", "var/lib/cni/bin"),
    ] {
        let root = sys::TempDir::new("sgplat");
        let (conf, bin) = (root.path.join(conf), root.path.join(bin));
        std::fs::create_dir_all(&conf).unwrap();
        copy_fixture("install/flannel/conf", &conf);
        stub_plugins(&conf, &bin);
        // Without the platform the default bin dir holds none of flannel's plugins.
        let root_arg = root.path.to_str().unwrap();
        let out = cni::guard(&[
            "--install",
            "--host-root",
            root_arg,
            "--conf-dir",
            conf.to_str().unwrap(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{platform}: {}",
            stderr_of(&out)
        );
        for how in ["auto", platform] {
            let out = cni::guard(&[
                "--install",
                "--host-root",
                root_arg,
                "--platform",
                how,
                "--log-file",
                "/var/log/sandbox-guard.log",
            ]);
            assert!(
                out.status.success(),
                "{platform} ({how}): {}",
                stderr_of(&out)
            );
            assert!(
                bin.join("sandbox-guard").is_file(),
                "{platform} ({how}): the binary is not where the runtime looks"
            );
            assert_matches_fixture(
                &conf,
                "install/flannel/chained",
                &format!("{platform} ({how})"),
            );
            let check = cni::guard(&[
                "--install",
                "--check",
                "--host-root",
                root_arg,
                "--platform",
                how,
            ]);
            assert!(
                check.status.success(),
                "{platform} ({how}): {}",
                String::from_utf8_lossy(&check.stdout)
            );
        }
        let out = cni::guard(&[
            "--uninstall",
            "--remove-binary",
            "--host-root",
            root_arg,
            "--platform",
            "auto",
        ]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        assert_eq!(
            contents(&conf),
            contents(&testdata::fixture_path("install/flannel/conf")),
            "{platform}"
        );
    }
}

#[test]
fn several_networks_guard_the_one_the_runtime_loads_and_say_so() {
    // containerd's and podman's leftovers beside calico's list: the runtime loads 10-calico.
    let node = Node::with("calico");
    copy_fixture("install/flannel/conf", &node.conf());
    std::fs::rename(
        node.conf().join("10-flannel.conflist"),
        node.conf().join("87-podman-bridge.conflist"),
    )
    .unwrap();
    stub_plugins(&node.conf(), &node.bin());
    let out = run("--install", &node.conf(), &node.bin(), &LOG);
    let stderr = stderr_of(&out);
    // Catches an install that answers "several networks ... give the one to guard with --network".
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the runtime loads the lexically first, k8s-pod-network (10-calico.conflist), which is guarded"), "{stderr}");
    assert_eq!(
        std::fs::read(node.conf().join("10-calico.conflist")).unwrap(),
        testdata::fixture_bytes("install/calico/chained/10-calico.conflist")
    );
    assert!(check(&node).0, "the guard is in the runtime's network");

    // --network naming the other one: installed there, with a warning, and not ready.
    let other = Node::with("calico");
    copy_fixture("install/flannel/conf", &other.conf());
    stub_plugins(&other.conf(), &other.bin());
    let out = run(
        "--install",
        &other.conf(),
        &other.bin(),
        &["--network", "cbr0"],
    );
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warning: --network cbr0 (10-flannel.conflist) is not the network the runtime loads"
        ),
        "{stderr}"
    );
    // The probe asks about the runtime's network, where the guard is not.
    let (ready, said) = check(&other);
    assert!(
        !ready && said.contains("sandbox-guard is not in network k8s-pod-network"),
        "{said}"
    );
}

/// `--install --check` on a node: ready or not, and what it said.
fn check(node: &Node) -> (bool, String) {
    let out = node.run("--install", &["--check"]);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr_of(&out)
        ),
    )
}

/// Every file below `dir` whose bytes name the guard, and every kept original.
fn traces_of_the_guard(dir: &Path) -> Vec<String> {
    contents(dir)
        .into_iter()
        .filter(|(path, bytes)| {
            String::from_utf8_lossy(bytes).contains("sandbox-guard")
                || path.to_string_lossy().contains("sandbox-guard")
        })
        .map(|(path, _)| path.display().to_string())
        .collect()
}

#[test]
fn uninstall_leaves_nothing_that_names_the_guard() {
    for (case, file, modes, network) in CASES {
        for mode in modes {
            let when = format!("{case} {mode}");
            let node = Node::with(case);
            node.install(mode, network);
            let primary = node.conf().join(file);
            // The primary writes its own file again after the install: calico's upgrade, or a
            // re-created .conf beside the converted list (multus removes and rewrites its file
            // on every start). For macvlan-conf, catches the guarded .conflist staying, which loads
            // as soon as the .conf goes.
            let original = testdata::fixture_bytes(&format!("install/{case}/conf/{file}"));
            primary_rewrites(&primary, &original);
            // Multus thin re-inlines the guarded master into its own file within a second.
            if case == "multus-thin" {
                node.install(mode, network);
                reinline_master(&node.conf());
            }
            let root = private_root(&node);
            let out = run(
                "--uninstall",
                &node.conf(),
                &node.bin(),
                &["--remove-binary", "--host-root", &root],
            );
            assert!(out.status.success(), "{when}: {}", stderr_of(&out));
            assert_eq!(
                traces_of_the_guard(&node.conf()),
                Vec::<String>::new(),
                "{when}"
            );
            assert!(!node.bin().join("sandbox-guard").exists(), "{when}");
            assert_eq!(
                std::fs::read(&primary).unwrap(),
                original,
                "{when}: the primary's own bytes"
            );
        }
    }
}

/// What multus thin's entrypoint does on its next hash check: its file written again with
/// the master's current JSON (compact, keys sorted as Go's encoder writes a map) inlined.
fn reinline_master(conf: &Path) {
    let multus = conf.join("00-multus.conflist");
    let master: serde_json::Value =
        serde_json::from_slice(&std::fs::read(conf.join("10-calico.conflist")).unwrap()).unwrap();
    let text = std::fs::read_to_string(&multus).unwrap();
    let start = text.find("\"delegates\": [\n            ").unwrap()
        + "\"delegates\": [\n            ".len();
    let end = start + text[start..].find('\n').unwrap();
    let inlined = format!(
        "{}{}{}",
        &text[..start],
        serde_json::to_string(&master).unwrap(),
        &text[end..]
    );
    assert!(inlined.contains("sandbox-guard"));
    std::fs::write(&multus, inlined).unwrap();
}

#[test]
fn the_operators_keys_survive_every_install_and_the_daemonset_can_set_them() {
    let node = Node::with("calico");
    node.install("chained", None);
    let file = node.conf().join("10-calico.conflist");
    // The operator sets audit-first rollout and metrics on the entry by hand.
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let entry = list["plugins"].as_array_mut().unwrap().last_mut().unwrap();
    entry["staleDel"] = "audit".into();
    entry["metricsFile"] = "/var/lib/node_exporter/sandbox-guard.prom".into();
    std::fs::write(&file, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
    let guard_entry = || -> serde_json::Value {
        let list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "sandbox-guard")
            .unwrap()
            .clone()
    };
    // Catches the next run writing the entry afresh, the keys gone.
    for mode in ["chained", "delegate", "chained"] {
        node.install(mode, None);
        let entry = guard_entry();
        assert_eq!(entry["staleDel"], "audit", "{mode}: {entry}");
        assert_eq!(
            entry["metricsFile"], "/var/lib/node_exporter/sandbox-guard.prom",
            "{mode}: {entry}"
        );
    }
    // The DaemonSet's way: keys as JSON, inline or from a ConfigMap's file.
    let keys = node.dir.path.join("entry.json");
    std::fs::write(&keys, r#"{"logFormat": "json", "staleDel": "refuse"}"#).unwrap();
    run_ok(
        "--install",
        &node.conf(),
        &node.bin(),
        &[
            "--entry",
            r#"{"ipConflict":"refuse"}"#,
            "--entry-file",
            keys.to_str().unwrap(),
        ],
    );
    let entry = guard_entry();
    assert_eq!(
        (
            &entry["ipConflict"],
            &entry["logFormat"],
            &entry["staleDel"]
        ),
        (&"refuse".into(), &"json".into(), &"refuse".into()),
        "{entry}"
    );
    assert_eq!(
        entry["metricsFile"], "/var/lib/node_exporter/sandbox-guard.prom",
        "{entry}"
    );
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &["--entry", r#"{"type":"x"}"#],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    // Under --watch, a primary's rewrite drops the entry: it comes back with the keys.
    let watcher = Watcher::start_with(&node, "chained", &[], "already installed");
    primary_rewrites(
        &file,
        &testdata::fixture_bytes("install/calico/conf/10-calico.conflist"),
    );
    watcher.wait_for("re-inserted", Duration::from_secs(5));
    let entry = guard_entry();
    assert_eq!(
        (&entry["ipConflict"], &entry["staleDel"]),
        (&"refuse".into(), &"refuse".into()),
        "{entry}"
    );
    assert_eq!(
        entry["metricsFile"], "/var/lib/node_exporter/sandbox-guard.prom",
        "{entry}"
    );
    assert_eq!(watcher.terminate().code(), Some(0));
}

#[test]
fn a_write_of_the_primary_while_the_installer_replaces_its_file_is_not_lost() {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    // Aimed at the window: when the installer's temp file for 10-calico.conflist appears (it
    // then writes and fsyncs it, and renames it over the file), the primary writes its new
    // version. Catches the rename putting back the older content; five rounds, since one
    // may miss the window.
    for round in 0..5 {
        let node = Node::with("calico");
        let file = node.conf().join("10-calico.conflist");
        let newer = std::fs::read_to_string(&file)
            .unwrap()
            .replace("\"mtu\": 0", "\"mtu\": 1440");
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
        inotify
            .add_watch(&node.conf(), AddWatchFlags::IN_CREATE)
            .unwrap();
        let (conf, newer_bytes) = (node.conf(), newer.clone());
        let primary = std::thread::spawn(move || {
            loop {
                for event in inotify.read_events().unwrap() {
                    let name = event
                        .name
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let temp_of_the_list = name
                        .strip_prefix(".10-calico.conflist.")
                        .and_then(|rest| rest.strip_suffix(".tmp"))
                        .is_some_and(|tag| !tag.is_empty() && !tag.contains('.'));
                    if temp_of_the_list {
                        primary_rewrites(&conf.join("10-calico.conflist"), newer_bytes.as_bytes());
                        return;
                    }
                }
            }
        });
        let out = run("--install", &node.conf(), &node.bin(), &LOG);
        assert!(out.status.success(), "{}", stderr_of(&out));
        primary.join().unwrap();
        let now: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            now["plugins"][0]["mtu"], 1440,
            "round {round}: the primary's write in the window was lost"
        );
    }
}

#[test]
fn frequent_rewrites_are_followed_and_a_fight_is_reported_not_ready() {
    // A primary that rewrites its file every 0.7 s with new content (kindnet's and multus
    // thin's way): each is an upgrade, followed every time, with no back-off. Fails before
    // this change: past five re-inserts a minute the watch backed off as from a fight.
    let node = Node::with("flannel");
    let file = node.conf().join("10-flannel.conflist");
    let metrics = node.dir.path.join("install.prom");
    let original = std::fs::read_to_string(&file).unwrap();
    let watcher = Watcher::start_with(
        &node,
        "chained",
        &["--metrics-file", metrics.to_str().unwrap()],
        "installed: put sandbox-guard into",
    );
    for i in 0..10 {
        let text = original.replace(
            "\"hairpinMode\": true",
            &format!("\"hairpinMode\": true, \"rev\": {i}"),
        );
        primary_rewrites(&file, text.as_bytes());
        watcher.wait_for("re-inserted", Duration::from_secs(3));
        std::thread::sleep(Duration::from_millis(300));
    }
    let lines = watcher.drain(Duration::from_millis(500));
    assert!(
        !lines.iter().any(|l| l.contains("another writer")),
        "{lines:#?}"
    );
    assert!(check(&node).0, "{:?}", check(&node).1);
    let text = std::fs::read_to_string(&metrics).unwrap();
    if let Some(samples) = prometheus::prometheus_parse(sys::test_name!(), &text) {
        let value = |name: &str| {
            samples
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, v)| *v)
        };
        assert_eq!(
            value("sandbox_guard_install_installed"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value("sandbox_guard_install_reinserts_total"),
            Some(10.0),
            "{text}"
        );
        assert_eq!(value("sandbox_guard_install_fight"), Some(0.0), "{text}");
    }
    assert_eq!(watcher.terminate().code(), Some(0));

    // The file's owner puts its own list back right after each insert (cilium's exclusive
    // mode): a fight. Said once with the drop-in as the way out, and not ready.
    let node = Node::with("cilium-chaining");
    let file = node.conf().join("05-cilium.conflist");
    let original = std::fs::read(&file).unwrap();
    let metrics = node.dir.path.join("install.prom");
    let watcher = Watcher::start_with(
        &node,
        "chained",
        &["--metrics-file", metrics.to_str().unwrap()],
        "installed: put sandbox-guard into",
    );
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        if std::fs::read(&file).unwrap() != original {
            primary_rewrites(&file, &original);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = watcher.drain(Duration::from_millis(300));
    let fight = lines
        .iter()
        .find(|l| l.contains("reverts each insert"))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(fight.contains("--mode dropin"), "{fight}");
    assert!(
        !check(&node).0,
        "the owner's file is back without the guard"
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    if let Some(samples) = prometheus::prometheus_parse(sys::test_name!(), &text) {
        let value = |name: &str, reason: Option<&str>| {
            samples
                .iter()
                .find(|(n, l, _)| n == name && reason.is_none_or(|r| l["reason"] == r))
                .map(|(_, _, v)| *v)
        };
        assert_eq!(
            value("sandbox_guard_install_installed", None),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            value("sandbox_guard_install_fight", None),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value("sandbox_guard_install_failures_total", Some("fight")),
            Some(1.0),
            "{text}"
        );
    }
    assert_eq!(watcher.terminate().code(), Some(0));
}

#[test]
fn ready_only_where_the_runtime_runs_the_guard() {
    // Catches a DaemonSet with no readiness check (`--check` unknown).
    let node = Node::with("calico");
    let (ready, said) = check(&node);
    assert!(
        !ready && said.contains("not in network k8s-pod-network"),
        "{said}"
    );
    node.install("chained", None);
    let (ready, said) = check(&node);
    assert!(
        ready && said.contains("ready: sandbox-guard is in 10-calico.conflist"),
        "{said}"
    );
    // The binary gone from where the runtime looks.
    std::fs::remove_file(node.bin().join("sandbox-guard")).unwrap();
    let (ready, said) = check(&node);
    assert!(
        !ready && said.contains("sandbox-guard is missing"),
        "{said}"
    );
    node.install("chained", None);
    // A plugin of the network the runtime cannot find.
    std::fs::remove_file(node.bin().join("portmap")).unwrap();
    let (ready, said) = check(&node);
    assert!(
        !ready && said.contains("cannot find") && said.contains("portmap"),
        "{said}"
    );
    // --check writes nothing.
    let before = tree(&node.dir.path);
    check(&node);
    assert_eq!(tree(&node.dir.path), before);
}

/// The network a runtime loads from the node's conf dir, found the test's own way: the
/// lexically first file that parses, or for multus the master file it delegates to (thick:
/// the file its clusterNetwork names, under the host's root for a host's tree; thin: the
/// first file not named 00-multus*).
fn loaded_network(node: &Node) -> Option<(PathBuf, serde_json::Value)> {
    let conf = node.conf();
    let parsed: Vec<(PathBuf, serde_json::Value)> = install::network_files(&conf)
        .into_iter()
        .filter_map(|f| {
            serde_json::from_slice(&std::fs::read(&f).ok()?)
                .ok()
                .map(|v| (f, v))
        })
        .collect();
    let (file, first) = parsed.first()?.clone();
    let first_plugin = first
        .get("plugins")
        .and_then(|p| p.get(0))
        .unwrap_or(&first)
        .clone();
    let target = match first_plugin["type"].as_str() {
        Some("multus-shim") => {
            let path = first_plugin["clusterNetwork"].as_str()?;
            match node.host() {
                Some(host) => host.join(path.trim_start_matches("/host/")),
                None => conf.join(path.rsplit('/').next()?),
            }
        }
        Some("multus") => parsed.iter().map(|(f, _)| f.clone()).find(|f| {
            !f.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("00-multus")
        })?,
        _ => return Some((file, first)),
    };
    let value = serde_json::from_slice(&std::fs::read(&target).ok()?).ok()?;
    Some((target, value))
}

/// The files multus's config names by path (its cluster network, its readiness indicator):
/// none may ever go missing, whatever the installer did.
fn named_by_path(node: &Node) -> Vec<PathBuf> {
    let Some(file) = install::network_files(&node.conf()).into_iter().next() else {
        return Vec::new();
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(&file).unwrap())
    else {
        return Vec::new();
    };
    ["clusterNetwork", "readinessindicatorfile"]
        .into_iter()
        .filter_map(|key| value[key].as_str())
        .filter(|path| path.starts_with('/'))
        .map(|path| match node.host() {
            Some(host) => host.join(path.trim_start_matches("/host/")),
            None => node.conf().join(path.rsplit('/').next().unwrap()),
        })
        .collect()
}

/// Asks of a node what the readiness probe must never get wrong: when it says ready, the
/// network the runtime loads names the guard last (chained) or first (delegate), every
/// plugin it names is in the bin dir, and its version is one the guard speaks. And, ready
/// or not, no file another component names by path is missing.
fn ready_means_runnable(node: &Node, when: &str) {
    for file in named_by_path(node) {
        assert!(file.is_file(), "{when}: {} is gone", file.display());
    }
    let (ready, said) = check(node);
    if !ready {
        return;
    }
    let (file, net) =
        loaded_network(node).unwrap_or_else(|| panic!("{when}: ready without a network: {said}"));
    let version = net["cniVersion"].as_str().unwrap_or("0.1.0");
    assert!(
        speaks(version),
        "{when}: ready, but {} is at {version}",
        file.display()
    );
    let mut names = Vec::new();
    let plugins = net
        .get("plugins")
        .and_then(|p| p.as_array())
        .cloned()
        .unwrap_or_else(|| vec![net.clone()]);
    for (i, plugin) in plugins.iter().enumerate() {
        let guard = plugin["type"] == "sandbox-guard";
        if guard && plugin.get("delegate").is_none() {
            assert_eq!(
                i + 1,
                plugins.len(),
                "{when}: ready, but the guard is not last"
            );
        }
        let wrapped = plugin.get("delegate").filter(|_| guard);
        for plugin in [Some(plugin), wrapped].into_iter().flatten() {
            names.extend(
                [plugin["type"].as_str(), plugin["ipam"]["type"].as_str()]
                    .into_iter()
                    .flatten()
                    .map(str::to_string),
            );
        }
    }
    assert!(
        names.iter().any(|n| n == "sandbox-guard"),
        "{when}: ready, but {} does not name the guard",
        file.display()
    );
    for name in names {
        assert!(
            node.bin().join(&name).is_file(),
            "{when}: ready, but the runtime cannot find {name} for {}",
            file.display()
        );
    }
}

/// The guard's entry in the loaded network, changed by `change`.
fn edit_guard_entry(node: &Node, change: impl Fn(&mut serde_json::Value)) -> bool {
    let Some((file, mut net)) = loaded_network(node) else {
        return false;
    };
    let mut changed = false;
    if net["type"] == "sandbox-guard" {
        change(&mut net);
        changed = true;
    }
    for plugin in net["plugins"].as_array_mut().into_iter().flatten() {
        if plugin["type"] == "sandbox-guard" {
            change(plugin);
            changed = true;
        }
    }
    std::fs::write(&file, serde_json::to_vec_pretty(&net).unwrap()).unwrap();
    changed
}

#[test]
fn no_layout_ends_ready_with_a_network_the_runtime_cannot_run() {
    // Every layout of testdata/install, as it is and broken five ways (a version the guard
    // cannot speak, a bin dir without the primary's plugins, one plugin missing, an entry
    // key the plugin rejects, the guard moved off the end), through every mode and an
    // uninstall: the probe never says ready where the runtime would fail, and no file
    // another component names by path ever goes missing.
    // Failed before this change on OVN-Kubernetes under multus thick (its .conf converted
    // away), OpenShift's layout, a bad entry key and a guard not last.
    let layouts: Vec<String> = std::fs::read_dir(testdata::fixture_path("install"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(layouts.len() >= 10, "{layouts:?}");
    for layout in &layouts {
        for damage in [
            "none",
            "version",
            "empty-bin",
            "missing-plugin",
            "bad-entry",
            "not-last",
        ] {
            for mode in ["chained", "delegate", "dropin"] {
                let when = format!("{layout}, damage {damage}, {mode}");
                let node = Node::with(layout);
                match damage {
                    "version" => {
                        let (file, _) = loaded_network(&node).unwrap();
                        set_version(file.parent().unwrap(), Some("2.0.0"));
                    }
                    "empty-bin" => {
                        std::fs::remove_dir_all(node.bin()).unwrap();
                        std::fs::create_dir_all(node.bin()).unwrap();
                    }
                    "missing-plugin" => {
                        let stub = std::fs::read_dir(node.bin())
                            .unwrap()
                            .map(|e| e.unwrap().path())
                            .find(|p| !p.ends_with(".keep"))
                            .unwrap();
                        std::fs::remove_file(stub).unwrap();
                    }
                    _ => {}
                }
                let out = node.run("--install", &["--mode", mode]);
                if damage == "version" || damage == "empty-bin" {
                    assert_eq!(
                        out.status.code(),
                        Some(1),
                        "{when}: installed: {}",
                        stderr_of(&out)
                    );
                }
                ready_means_runnable(&node, &when);
                // Multus thin pods run its own copy, guarded only once it re-inlines.
                if damage == "none" && out.status.success() && layout == "multus-thin" {
                    reinline_master(&node.conf());
                }
                if damage == "none" && out.status.success() && mode != "dropin" {
                    assert!(
                        check(&node).0,
                        "{when}: installed but not ready: {}",
                        check(&node).1
                    );
                }
                let damaged = match damage {
                    "bad-entry" => edit_guard_entry(&node, |e| e["staleDel"] = "Audit".into()),
                    "not-last" => {
                        let (file, mut net) = loaded_network(&node).unwrap();
                        let moved = net["plugins"].as_array_mut().is_some_and(|plugins| {
                            let last = plugins.len() - 1;
                            let guard = plugins[last]["type"] == "sandbox-guard" && last > 0;
                            if guard {
                                plugins.swap(0, last);
                            }
                            guard
                        });
                        std::fs::write(&file, serde_json::to_vec_pretty(&net).unwrap()).unwrap();
                        moved
                    }
                    _ => false,
                };
                if damaged {
                    assert!(!check(&node).0, "{when}: ready: {}", check(&node).1);
                }
                ready_means_runnable(&node, &format!("{when}, damaged"));
                let out = node.run("--uninstall", &[]);
                assert!(out.status.success(), "{when}: {}", stderr_of(&out));
                ready_means_runnable(&node, &format!("{when}, uninstalled"));
                assert!(!check(&node).0, "{when}: ready after the uninstall");
                for file in named_by_path(&node) {
                    assert!(
                        !std::fs::read_to_string(&file)
                            .unwrap()
                            .contains("sandbox-guard"),
                        "{when}: {} names the guard after the uninstall",
                        file.display()
                    );
                }
            }
        }
    }
}

#[test]
fn the_doctor_does_not_say_ok_where_the_runtime_does_not_run_the_guard() {
    let cni_config_findings = |node: &Node| -> Vec<serde_json::Value> {
        let state = node.dir.path.join("state");
        let out = cni::guard(&[
            "--doctor",
            "--conf-dir",
            node.conf().to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "-o",
            "json",
        ]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", stderr_of(&out)));
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] == "cni-config")
            .cloned()
            .collect()
    };
    // Catches both saying "... networks guarded" with severity ok.
    // The guard in a network the runtime does not load (the second of two).
    let node = Node::with("calico");
    copy_fixture("install/flannel/conf", &node.conf());
    stub_plugins(&node.conf(), &node.bin());
    run_ok(
        "--install",
        &node.conf(),
        &node.bin(),
        &["--network", "cbr0"],
    );
    let findings = cni_config_findings(&node);
    assert!(
        findings.iter().all(|f| f["severity"] != "ok"),
        "{findings:#?}"
    );
    assert!(
        findings.iter().any(|f| f["severity"] == "error"
            && f["summary"]
                .as_str()
                .unwrap()
                .contains("not in network k8s-pod-network")),
        "{findings:#?}"
    );

    // The guard in the runtime's network at a version it cannot speak (written by hand).
    let node = Node::with("calico");
    node.install("chained", None);
    set_version(&node.conf(), Some("2.0.0"));
    let findings = cni_config_findings(&node);
    assert!(
        findings.iter().any(|f| f["severity"] == "error"
            && f["summary"].as_str().unwrap().contains("does not speak")),
        "{findings:#?}"
    );

    let node = Node::with("calico");
    node.install("chained", None);
    let findings = cni_config_findings(&node);
    assert!(
        findings.iter().any(|f| f["severity"] == "ok"),
        "{findings:#?}"
    );
}

#[test]
fn the_daemonsets_args_install_and_its_probe_says_ready() {
    // The installer's args and readiness probe exactly as the DaemonSet gives them, with the
    // host's root at a temp dir instead of /host.
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf-examples/kubernetes/sandbox-guard.yaml"
    ))
    .unwrap();
    let root = sys::TempDir::new("sgds");
    let host = |arg: &str| arg.replace("=/host", &format!("={}", root.path.display()));
    let args: Vec<String> = manifest
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .take_while(|l| l.starts_with("- --"))
        .map(|l| host(&l[2..]))
        .filter(|a| a != "--watch")
        .collect();
    assert!(
        args.contains(&"--install".to_string())
            && args.iter().any(|a| a.starts_with("--host-root=")),
        "{args:?}"
    );
    let probe_line = manifest
        .lines()
        .find(|l| l.contains("command: [/sandbox-guard"))
        .unwrap();
    let probe: Vec<String> = probe_line
        .split('[')
        .nth(1)
        .unwrap()
        .trim_end_matches(']')
        .split(", ")
        .skip(1)
        .map(host)
        .collect();

    let (conf, bin) = (
        root.path.join("etc/cni/net.d"),
        root.path.join("opt/cni/bin"),
    );
    std::fs::create_dir_all(&conf).unwrap();
    copy_fixture("install/calico/conf", &conf);
    stub_plugins(&conf, &bin);
    let not_yet = cni::guard(&probe.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(not_yet.status.code(), Some(1), "ready before the install");
    let out = cni::guard(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{args:?}: {}", stderr_of(&out));
    let ready = cni::guard(&probe.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        ready.status.success(),
        "{probe:?}: {}",
        String::from_utf8_lossy(&ready.stdout)
    );
}

#[test]
fn multus_thick_naming_its_cluster_network_by_name() {
    // multus-daemon's clusterNetwork may be a network's name instead of a path.
    let node = Node::with("multus-thick");
    let multus = node.conf().join("00-multus.conf");
    let by_name = |name: &str| {
        let text = testdata::fixture("install/multus-thick/conf/00-multus.conf")
            .replace("/host/etc/cni/net.d/10-calico.conflist", name);
        std::fs::write(&multus, text).unwrap();
    };
    by_name("k8s-pod-network");
    let multus_bytes = std::fs::read(&multus).unwrap();
    node.install("chained", None);
    assert_eq!(
        std::fs::read(node.conf().join("10-calico.conflist")).unwrap(),
        testdata::fixture_bytes("install/multus-thick/chained/10-calico.conflist")
    );
    assert_eq!(
        std::fs::read(&multus).unwrap(),
        multus_bytes,
        "multus's own file was touched"
    );
    assert!(check(&node).0, "{}", check(&node).1);
    node.uninstall(None);
    // A network only a NetworkAttachmentDefinition holds: refused, nothing written.
    by_name("macvlan-nad");
    let before = tree(&node.dir.path);
    let out = run("--install", &node.conf(), &node.bin(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("its clusterNetwork \"macvlan-nad\" is no network in"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(tree(&node.dir.path), before);
}

#[test]
fn naming_multus_cluster_network_is_the_runtimes_network() {
    // --network naming the network multus delegates to: no warning, ready, and no drop-in
    // (multus runs it from its own copy).
    let node = Node::with("multus-thin");
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &["--network", "k8s-pod-network", "--mode", "dropin"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("multus (thin) runs 10-calico.conflist itself"),
        "{}",
        stderr_of(&out)
    );
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &["--network", "k8s-pod-network"],
    );
    assert!(
        out.status.success()
            && !stderr_of(&out)
                .lines()
                .any(|l| l.contains("warning") && !l.contains("without a journal")),
        "{}",
        stderr_of(&out)
    );
    // Ready once multus thin's own copy has the guard too.
    reinline_master(&node.conf());
    assert!(check(&node).0, "{}", check(&node).1);
}

/// `--force` is the way out the refusal names: it must work even when the store cannot be
/// read (here a state dir that is a symlink, which the guard refuses to open), or the node
/// could never leave delegate mode.
#[test]
fn uninstall_with_force_goes_on_when_the_store_cannot_be_read() {
    let node = Node::with("calico");
    let state = sys::TempDir::new("sginstsl");
    let real = state.path.join("real");
    std::fs::create_dir_all(real.join("deferred").join("0".repeat(64))).unwrap();
    let link = state.path.join("state");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let mut args = Node::args(Some("delegate"), None);
    args.extend(["--state-dir", link.to_str().unwrap()]);
    run_ok("--install", &node.conf(), &node.bin(), &args);
    let before = contents(&node.conf());
    let refused = run("--uninstall", &node.conf(), &node.bin(), &[]);
    assert!(
        !refused.status.success(),
        "without --force it cannot tell, so it refuses"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--force"),
        "and names the way out: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let out = run_ok("--uninstall", &node.conf(), &node.bin(), &["--force"]);
    assert!(
        out.contains("--force"),
        "--force says what it could not check: {out}"
    );
    assert!(contents(&node.conf()) != before, "--force goes on");
}

#[test]
fn the_uninstall_daemonsets_args_succeed_on_a_node_with_nothing_to_uninstall() {
    // The uninstall DaemonSet's init container, with its args exactly as the manifest gives
    // them, on a node that never had a CNI network: a failure there is a crash-looping pod
    // that never lets `rollout status` finish.
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf-examples/kubernetes/uninstall/sandbox-guard-uninstall.yaml"
    ))
    .unwrap();
    let root = sys::TempDir::new("sgun");
    let line = manifest
        .lines()
        .find(|l| l.trim().starts_with("args: [--uninstall"))
        .unwrap();
    let args: Vec<String> = line
        .split('[')
        .nth(1)
        .unwrap()
        .trim_end_matches(']')
        .split(", ")
        .map(|arg| arg.replace("=/host", &format!("={}", root.path.display())))
        .collect();
    let out = cni::guard(&strs(&args));
    assert!(
        out.status.success(),
        "{args:?} on an empty host: {}",
        stderr_of(&out)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("nothing changed"), "{said}");
    assert!(
        std::fs::read_dir(&root.path).unwrap().next().is_none(),
        "an uninstall on a clean node wrote: {:?}",
        tree(&root.path)
    );
    // The same node once kubelet made the DaemonSet's DirectoryOrCreate mounts: empty dirs.
    for dir in ["etc/cni/net.d", "opt/cni/bin"] {
        std::fs::create_dir_all(root.path.join(dir)).unwrap();
    }
    let before = tree(&root.path);
    let out = cni::guard(&strs(&args));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("nothing changed"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(tree(&root.path), before);
}

#[test]
fn a_killed_installers_temp_files_do_not_stop_the_next_one() {
    // In the DaemonSet the installer is its container's PID 1, in every pod it ever runs
    // in: a pod killed mid-write (the grace period's SIGKILL, the OOM killer, a power cut)
    // leaves its temp files under the name the next pod's installer picks.
    if !sys::require(sys::test_name!(), true, &["unshare"]) {
        return;
    }
    let node = Node::with("calico");
    std::fs::write(
        node.conf().join(".10-calico.conflist.1.tmp"),
        b"{\"half\": ",
    )
    .unwrap();
    std::fs::write(node.bin().join(".sandbox-guard.1.tmp"), b"\x7fELF").unwrap();
    let (conf, bin) = (node.conf(), node.bin());
    let out = Command::new("unshare")
        .args(["--pid", "--fork", cni::bin(), "--install", "--conf-dir"])
        .args([&conf, Path::new("--bin-dir"), &bin])
        .args(LOG)
        .output()
        .unwrap();
    assert!(out.status.success(), "as PID 1: {}", stderr_of(&out));
    assert!(check(&node).0, "{}", check(&node).1);
}

#[test]
fn deferred_dels_in_the_hosts_state_dir_stop_a_daemonsets_uninstall() {
    // The DaemonSets run with --host-root=/host, and the entry's stateDir is the host's
    // path: the deferred DELs are looked for under the host's root, not in the pod's own
    // filesystem, where that dir never exists.
    let root = sys::TempDir::new("sgdsst");
    let (conf, bin) = (
        root.path.join("etc/cni/net.d"),
        root.path.join("opt/cni/bin"),
    );
    std::fs::create_dir_all(&conf).unwrap();
    copy_fixture("install/calico/conf", &conf);
    stub_plugins(&conf, &bin);
    let host_root = format!("--host-root={}", root.path.display());
    let daemonset = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![host_root.clone(), "--platform=default".to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let install = daemonset(&[
        "--install",
        "--mode=delegate",
        "--state-dir=/var/lib/cni/sandbox-guard",
        "--log-file=/var/log/sandbox-guard.log",
    ]);
    let out = cni::guard(&strs(&install));
    assert!(out.status.success(), "{}", stderr_of(&out));
    // On the host, the plugin keeps its store at that path: under the root here.
    let state_dir = root.path.join("var/lib/cni/sandbox-guard");
    defer_a_stale_del(&state_dir, &root.path);
    let before = contents(&conf);
    for args in [
        daemonset(&["--uninstall", "--remove-binary"]),
        daemonset(&["--install", "--mode=chained"]),
    ] {
        let out = cni::guard(&strs(&args));
        assert!(
            !out.status.success(),
            "{args:?} went on while a deferred DEL waits in the host's state dir"
        );
        assert!(
            stderr_of(&out).contains("1 deferred DELs"),
            "{}",
            stderr_of(&out)
        );
        assert_eq!(
            contents(&conf),
            before,
            "{args:?} refused, so nothing is written"
        );
    }
}

#[test]
fn uninstall_removes_the_temp_files_of_a_killed_installer() {
    // A write cut short (the pod killed after its grace period) leaves the installer's temp
    // file, holding a guarded list, beside the primary's file: no runtime reads it, but an
    // uninstall that leaves it has left something that names the guard.
    let node = Node::with("calico");
    node.install("chained", None);
    let guarded = std::fs::read(node.conf().join("10-calico.conflist")).unwrap();
    std::fs::write(node.conf().join(".10-calico.conflist.1.tmp"), &guarded).unwrap();
    std::fs::write(
        node.conf().join(".10-calico.conflist.1-3b9aca00-0.tmp"),
        &guarded,
    )
    .unwrap();
    for binary in ["sandbox-guard", "sandbox-guard-ctl"] {
        std::fs::write(
            node.bin().join(format!(".{binary}.1-3b9aca00-0.tmp")),
            b"\x7fELF",
        )
        .unwrap();
    }
    // Another writer's dotfile is not the installer's to remove.
    std::fs::write(node.conf().join(".calico-install.tmp"), b"theirs").unwrap();
    let root = private_root(&node);
    // Without --remove-binary the binary stays, its killed copy's temp file does not.
    run_ok(
        "--uninstall",
        &node.conf(),
        &node.bin(),
        &["--host-root", &root],
    );
    assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    assert_eq!(
        traces_of_the_guard(&node.bin()),
        ["sandbox-guard", "sandbox-guard-ctl"]
    );
    run_ok(
        "--uninstall",
        &node.conf(),
        &node.bin(),
        &["--remove-binary", "--host-root", &root],
    );
    assert_eq!(traces_of_the_guard(&node.bin()), Vec::<String>::new());
    assert!(node.conf().join(".calico-install.tmp").exists());
}

#[test]
fn uninstall_removes_a_killed_installers_dropin_temp_and_the_dropin_dir() {
    // An installer killed while it wrote the drop-in leaves its temp file in
    // <conf dir>/<network>/. Catches --uninstall leaving the temp, and with it the directory, if it
    // removes the directory only when empty.
    let node = Node::with("calico");
    let dir = node.conf().join("k8s-pod-network");
    for before_the_first_write in [false, true] {
        if before_the_first_write {
            // Killed before the drop-in was ever renamed into place: only the temp is there.
            std::fs::create_dir_all(&dir).unwrap();
        } else {
            node.install("dropin", None);
            assert!(dir.join("sandbox-guard.conf").is_file());
        }
        std::fs::write(
            dir.join(".sandbox-guard.conf.1-3b9aca00-0.tmp"),
            br#"{"type":"sandbox-guard"}"#,
        )
        .unwrap();
        let said = node.uninstall(None);
        assert!(
            !dir.exists(),
            "before the first write: {before_the_first_write}: {said}; left {:?}",
            std::fs::read_dir(&dir).map(|d| d.count())
        );
        assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    }
    // The primary's own drop-ins keep the directory, and a temp file not of the installer
    // stays.
    node.install("dropin", None);
    std::fs::write(dir.join("90-tuning.conf"), br#"{"type":"tuning"}"#).unwrap();
    std::fs::write(dir.join(".90-tuning.conf.swp"), b"theirs").unwrap();
    std::fs::write(dir.join(".sandbox-guard.conf.1-3b9aca00-0.tmp"), b"{}").unwrap();
    node.uninstall(None);
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [".90-tuning.conf.swp", "90-tuning.conf"]);
}

#[test]
fn the_installer_says_whether_the_primary_needs_the_guard() {
    // calico v3.26.1 keys its DEL by container ID: delegate mode there only costs, and the
    // install says what. calico-cni v1.6.2 on etcd keys it by pod name: needed, no warning.
    let node = Node::with("calico");
    install::calico_stand_in(&node.bin(), "v3.26.1");
    let out = node.run("--install", &["--mode", "delegate"]);
    let said = stderr_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("calico v3.26.1 (kubernetes datastore): NOT NEEDED")
            && said.contains(
                "warning: calico v3.26.1 (kubernetes datastore) does not need sandbox-guard"
            )
            && said.contains("holds the old sandbox's DEL"),
        "{said}"
    );
    node.uninstall(None);
    let file = node.conf().join("10-calico.conflist");
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    list["plugins"][0]["datastore_type"] = "etcdv2".into();
    std::fs::write(&file, list.to_string()).unwrap();
    install::calico_stand_in(&node.bin(), "v1.6.2");
    let metrics = node.dir.path.join("install.prom");
    let watch = Watcher::start_with(
        &node,
        "delegate",
        &["--metrics-file", metrics.to_str().unwrap()],
        "installed: put sandbox-guard into",
    );
    let said = watch.drain(Duration::from_millis(500)).join("\n");
    assert!(!said.contains("does not need"), "{said}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        text.contains("sandbox_guard_install_primary_need{need=\"needed\"} 1")
            && text.contains("sandbox_guard_install_primary_need{need=\"unknown\"} 0"),
        "{text}"
    );
    // Cilium chained after aws-cni: cilium-cni's DEL is the one acting by the pod's name, and
    // libcni runs it before the primary's, so delegate mode wraps cilium-cni, not aws-cni; the
    // row names chained mode, whose guard, last, holds every plugin's DEL.
    let node = Node::with("aws-vpc-cni");
    let file = install::network_files(&node.conf())[0].clone();
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    list["plugins"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "cilium-cni", "chaining-mode": "aws-cni"}));
    std::fs::write(&file, list.to_string()).unwrap();
    std::fs::write(node.bin().join("cilium-cni"), b"").unwrap();
    let out = node.run("--install", &["--mode", "delegate"]);
    let said = stderr_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("needs sandbox-guard in chained mode")
            && said.contains("delegate mode would wrap cilium-cni alone")
            && said.contains("--mode chained"),
        "{said}"
    );
    let installed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let types: Vec<&str> = installed["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types.first(), Some(&"aws-cni"), "{installed}");
    assert_eq!(types.last(), Some(&"sandbox-guard"), "{installed}");
    assert_eq!(
        installed["plugins"][types.len() - 1]["delegate"]["type"],
        "cilium-cni",
        "{installed}"
    );
    assert_eq!(
        installed["plugins"][types.len() - 1]["delegate"]["chaining-mode"],
        "aws-cni",
        "{installed}"
    );
    let (ready, said) = check(&node);
    assert!(ready, "{said}");
    let out = node.run("--install", &["--mode", "chained"]);
    let said = stderr_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("NEEDED, chained mode") && !said.contains("needs sandbox-guard"),
        "{said}"
    );
}

/// Entry keys the plugin rejects, each with the key an operator must see named.
const BAD_ENTRIES: [(&str, &str, &str); 5] = [
    (r#"{"staleDel":"Audit"}"#, "chained", "staleDel"),
    (r#"{"ipConflict":true}"#, "chained", "ipConflict"),
    (
        r#"{"lockTimeoutSeconds":900}"#,
        "chained",
        "lockTimeoutSeconds",
    ),
    (r#"{"stateDir":"var/lib/sg"}"#, "chained", "stateDir"),
    (
        r#"{"podLockTimeoutSeconds":10}"#,
        "delegate",
        "podLockTimeoutSeconds",
    ),
];

#[test]
fn an_entry_the_plugin_rejects_is_refused_kept_out_and_not_ready() {
    // Catches any one of them written to the network (every ADD then failing) and the probe saying
    // ready.
    for (keys, mode, key) in BAD_ENTRIES {
        let node = Node::with("calico");
        let before = tree(&node.dir.path);
        let out = run(
            "--install",
            &node.conf(),
            &node.bin(),
            &["--mode", mode, "--entry", keys],
        );
        let said = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{keys}: {said}");
        assert!(
            said.contains(key) && said.contains("nothing written"),
            "{keys}: {said}"
        );
        assert_eq!(
            tree(&node.dir.path),
            before,
            "{keys}: a refused entry wrote"
        );

        // Written by hand, the probe fails on it, naming the key.
        node.install(mode, None);
        assert!(check(&node).0, "{keys}: {}", check(&node).1);
        let file = node.conf().join("10-calico.conflist");
        let mut list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let extra: serde_json::Value = serde_json::from_str(keys).unwrap();
        for plugin in list["plugins"].as_array_mut().unwrap() {
            if plugin["type"] == "sandbox-guard" {
                for (k, v) in extra.as_object().unwrap() {
                    plugin[k] = v.clone();
                }
            }
        }
        std::fs::write(&file, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
        let (ready, said) = check(&node);
        assert!(!ready && said.contains(key), "{keys}: {said}");
    }
}

#[test]
fn the_watch_keeps_the_last_good_entry_when_the_configmap_goes_bad() {
    // Catches the bad key reaching the network at the next look.
    let node = Node::with("calico");
    let keys = node.dir.path.join("entry.json");
    std::fs::write(&keys, r#"{"staleDel":"audit"}"#).unwrap();
    let file = node.conf().join("10-calico.conflist");
    let watcher = Watcher::start_with(
        &node,
        "chained",
        &["--entry-file", keys.to_str().unwrap()],
        "installed",
    );
    std::fs::write(&keys, r#"{"staleDel":"Audit"}"#).unwrap();
    primary_rewrites(
        &file,
        &testdata::fixture_bytes("install/calico/conf/10-calico.conflist"),
    );
    watcher.wait_for("staleDel", Duration::from_secs(5));
    watcher.wait_for("re-inserted", Duration::from_secs(5));
    let list: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let entry = list["plugins"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(entry["staleDel"], "audit", "{entry}");
    let out = run(
        "--install",
        &node.conf(),
        &node.bin(),
        &["--check", "--entry-file", keys.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("staleDel"));
    assert_eq!(watcher.terminate().code(), Some(0));
}

fn inode(file: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).unwrap().ino()
}

#[test]
fn a_single_plugin_file_multus_names_is_wrapped_in_place_never_converted() {
    // Catches chained converting 10-ovn-kubernetes.conf into a .conflist and removing the .conf
    // multus thick names as its cluster network (every pod ADD then failing), and delegate doing
    // the same.
    let node = Node::with("ovn-multus-thick");
    let ovn = node.conf().join("10-ovn-kubernetes.conf");
    let before = tree(&node.dir.path);
    let out = node.run("--install", &["--mode", "chained"]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("multus")
            && said.contains("--mode delegate")
            && said.contains("nothing written"),
        "{said}"
    );
    assert_eq!(tree(&node.dir.path), before, "a refused install wrote");

    // Delegate: the .conf stays a one-plugin .conf, written in place (same inode: a
    // watcher of that path sees a write, never a removal).
    let ino = inode(&ovn);
    let watcher = PathWatcher::new(&ovn);
    node.install("delegate", None);
    assert_eq!(inode(&ovn), ino, "the file was replaced, not written");
    watcher.saw_a_write_only();
    assert_matches_fixture(
        &node.conf(),
        "install/ovn-multus-thick/delegate",
        "installed",
    );
    assert!(check(&node).0, "{}", check(&node).1);
    // ovnkube-node writes its file again: wrapped again, in place.
    primary_rewrites(
        &ovn,
        &testdata::fixture_bytes("install/ovn-multus-thick/conf/10-ovn-kubernetes.conf"),
    );
    let ino = inode(&ovn);
    node.install("delegate", None);
    assert_eq!(inode(&ovn), ino);
    assert_matches_fixture(
        &node.conf(),
        "install/ovn-multus-thick/delegate",
        "re-installed",
    );
    let watcher = PathWatcher::new(&ovn);
    node.uninstall(None);
    assert_eq!(inode(&ovn), ino, "the uninstall replaced the file");
    watcher.saw_a_write_only();
    assert_matches_fixture(&node.conf(), "install/ovn-multus-thick/conf", "uninstalled");
}

/// The guard run with OpenShift's preset on the host tree `host`.
fn on_openshift(host: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "--platform",
        "openshift",
        "--host-root",
        host.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cni::guard(&args)
}

#[test]
fn openshift_keeps_ovns_file_and_multus_readiness_indicator() {
    // Catches the cluster network outside the conf dir not being found, and the refusal's advice
    // (--conf-dir /run/multus/cni/net.d) converting OVN's .conf, which is also multus's readiness
    // indicator file, away.
    let node = Node::with("openshift");
    let host = node.host().unwrap();
    let ovn = host.join("run/multus/cni/net.d/10-ovn-kubernetes.conf");
    let platform = |extra: &[&str]| on_openshift(&host, extra);
    let before = tree(&node.dir.path);
    for extra in [
        &["--install", "--mode", "chained"][..],
        &[
            "--install",
            "--mode",
            "chained",
            "--conf-dir",
            ovn.parent().unwrap().to_str().unwrap(),
        ],
    ] {
        let out = platform(extra);
        let said = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {said}");
        assert!(said.contains("--mode delegate"), "{extra:?}: {said}");
        assert_eq!(
            tree(&node.dir.path),
            before,
            "{extra:?}: a refused install wrote"
        );
    }
    let ino = inode(&ovn);
    let out = platform(&["--install", "--mode", "delegate"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(inode(&ovn), ino);
    let wrapped: serde_json::Value = serde_json::from_slice(&std::fs::read(&ovn).unwrap()).unwrap();
    assert_eq!(wrapped["type"], "sandbox-guard", "{wrapped}");
    assert_eq!(
        wrapped["delegate"]["type"], "ovn-k8s-cni-overlay",
        "{wrapped}"
    );
    assert!(host.join("var/lib/cni/bin/sandbox-guard").is_file());
    // Multus's binDir (its daemon config's, CNO's CNIBinDir) is the runtime's: one copy.
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("too") && !host.join("opt").exists(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = platform(&["--install", "--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = platform(&["--uninstall"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(inode(&ovn), ino);
    assert_eq!(
        std::fs::read(&ovn).unwrap(),
        testdata::fixture_bytes(
            "install/openshift/host/run/multus/cni/net.d/10-ovn-kubernetes.conf"
        )
    );
    assert!(!platform(&["--install", "--check"]).status.success());
}

#[test]
fn k3s_data_cni_gets_the_binary_and_its_links_resolve_under_the_host_root() {
    // Catches the binary put into data/<hash>/bin, where containerd (bin_dir data/cni) never looks,
    // and the probe saying ready.
    let dir = sys::TempDir::new("sgk3s");
    let host = dir.path.join("host");
    install::k3s_host(&host);
    let root = host.to_str().unwrap();
    let out = cni::guard(&["--install", "--platform", "auto", "--host-root", root]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let runtime_bin = host.join("var/lib/rancher/k3s/data/cni");
    assert!(runtime_bin.join("sandbox-guard").is_file());
    assert!(
        !host
            .join("var/lib/rancher/k3s/data/3d1f7b5e0c9a/bin/sandbox-guard")
            .exists()
    );
    let out = cni::guard(&[
        "--install",
        "--check",
        "--platform",
        "k3s",
        "--host-root",
        root,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The links name the host's paths: resolved under the host root, not this one's.
    let out = cni::guard(&[
        "--install",
        "--check",
        "--host-root",
        root,
        "--conf-dir",
        host.join("var/lib/rancher/k3s/agent/etc/cni/net.d")
            .to_str()
            .unwrap(),
        "--bin-dir",
        runtime_bin.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_partial_plugin_set_is_refused_and_a_drop_in_is_not_ready_from_files() {
    // Catches a network with one of its plugins missing from the bin dir (the runtime looks
    // elsewhere) written anyway, and a drop-in ready whatever the runtime.
    let node = Node::with("calico");
    std::fs::remove_file(node.bin().join("portmap")).unwrap();
    let before = tree(&node.dir.path);
    let out = node.run("--install", &[]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("portmap") && said.contains("nothing written"),
        "{said}"
    );
    assert_eq!(tree(&node.dir.path), before);

    let node = Node::with("calico");
    node.install("dropin", None);
    let (ready, said) = check(&node);
    assert!(!ready && said.contains("drop-in"), "{said}");
}

/// `--host-root` for an uninstall that must not see this machine's own caches: a root
/// with an empty /var/lib/cni.
fn private_root(node: &Node) -> String {
    let root = node.dir.path.join("root");
    std::fs::create_dir_all(root.join("var/lib/cni")).unwrap();
    root.display().to_string()
}

#[test]
fn remove_binary_keeps_it_while_a_cached_attachment_names_the_guard() {
    // Catches the binary going, and the DEL of every pod attached through the guard (CRI-O and
    // multus replay the cached config) then failing to find the plugin.
    let node = Node::with("calico");
    node.install("chained", None);
    let root = private_root(&node);
    let binary = node.bin().join("sandbox-guard");
    let config = std::fs::read(node.conf().join("10-calico.conflist")).unwrap();
    let encoded = {
        let mut child = Command::new("base64")
            .arg("-w0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &config).unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    let results = Path::new(&root).join("var/lib/cni/results");
    std::fs::create_dir_all(&results).unwrap();
    let cached = results.join("k8s-pod-network-4f1c2a-eth0");
    std::fs::write(
        &cached,
        format!(r#"{{"kind":"cniCacheV1","containerId":"4f1c2a","config":"{encoded}","ifName":"eth0","networkName":"k8s-pod-network"}}"#),
    )
    .unwrap();
    let multus = Path::new(&root).join("var/lib/cni/multus");
    std::fs::create_dir_all(&multus).unwrap();
    std::fs::write(
        multus.join("9e8d7c"),
        br#"{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"},{"type":"sandbox-guard"}]}"#,
    )
    .unwrap();
    let said = run_ok(
        "--uninstall",
        &node.conf(),
        &node.bin(),
        &["--remove-binary", "--host-root", &root],
    );
    assert!(binary.exists(), "{said}");
    assert!(
        said.contains("kept") && said.contains("2 cached attachment"),
        "{said}"
    );
    assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    std::fs::remove_file(&cached).unwrap();
    std::fs::remove_file(multus.join("9e8d7c")).unwrap();
    run_ok(
        "--uninstall",
        &node.conf(),
        &node.bin(),
        &["--remove-binary", "--host-root", &root],
    );
    assert!(!binary.exists());
}

#[test]
fn uninstall_takes_the_guard_out_of_cilium_backups() {
    // Where cilium's exclusive mode has renamed the guarded file to .cilium_bak, catches the
    // uninstall leaving it naming the guard, which cilium puts back.
    let node = Node::with("calico");
    node.install("chained", None);
    let calico = node.conf().join("10-calico.conflist");
    std::fs::rename(&calico, node.conf().join("10-calico.conflist.cilium_bak")).unwrap();
    copy_fixture("install/cilium-chaining/conf", &node.conf());
    node.uninstall(None);
    assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    assert_eq!(
        std::fs::read(node.conf().join("10-calico.conflist.cilium_bak")).unwrap(),
        testdata::fixture_bytes("install/calico/conf/10-calico.conflist"),
        "the backup is not calico's own bytes"
    );
}

#[test]
fn multus_thins_own_copy_without_the_guard_is_not_ready() {
    // Upstream's multus thin (no --cleanup-config-on-exit) never re-reads the master file: catches
    // pods running its inlined copy unguarded and the probe saying ready.
    for mode in ["chained", "delegate"] {
        let node = Node::with("multus-thin");
        node.install(mode, None);
        let (ready, said) = check(&node);
        assert!(
            !ready && said.contains("multus (thin) runs its own copy") && said.contains("Restart"),
            "{mode}: {said}"
        );
        // Multus inlines the guarded master again (restarted, or with its watch loop).
        reinline_master(&node.conf());
        let (ready, said) = check(&node);
        assert!(ready, "{mode}: {said}");
    }
}

#[test]
fn an_uninstall_waits_for_the_watch_to_stand_down_and_stays_done() {
    // Catches the uninstall exiting 0 and the live watch putting everything back within its
    // settling pause.
    let node = Node::with("calico");
    let watcher = Watcher::start(&node, "chained");
    let said = node.uninstall(None);
    assert!(said.contains("took sandbox-guard out"), "{said}");
    watcher.wait_for("standing down", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    assert_eq!(
        contents(&node.conf()),
        contents(&testdata::fixture_path("install/calico/conf"))
    );
    // The primary writes its file again: the watch that stood down stays down.
    primary_rewrites(
        &node.conf().join("10-calico.conflist"),
        &testdata::fixture_bytes("install/calico/conf/10-calico.conflist"),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(traces_of_the_guard(&node.conf()), Vec::<String>::new());
    assert_eq!(watcher.terminate().code(), Some(0));
    // A later install (a new DaemonSet) runs as usual.
    node.install("chained", None);
    assert!(check(&node).0, "{}", check(&node).1);
}

#[test]
fn a_marker_left_by_a_killed_uninstall_does_not_stand_down_later_watches() {
    // An uninstall killed while it waits for the watches (Ctrl-C, a Job's deadline, the OOM
    // killer) leaves its marker in the conf dir (planted here). Catches every watch started
    // after it standing down at once, for good: the guard never put back after the primary's
    // next rewrite, and the DaemonSet staying not ready saying an uninstall is under way.
    let node = Node::with("calico");
    std::fs::write(node.conf().join(".sandbox-guard-uninstalling"), b"4242\n").unwrap();
    let watcher = Watcher::start(&node, "chained");
    assert!(check(&node).0, "{}", check(&node).1);
    assert_eq!(watcher.terminate().code(), Some(0));
}

/// An inotify watch on one file, as multus's config watch and readiness check hold one.
struct PathWatcher {
    inotify: nix::sys::inotify::Inotify,
}

impl PathWatcher {
    fn new(file: &Path) -> PathWatcher {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        inotify
            .add_watch(
                file,
                AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
            )
            .unwrap();
        PathWatcher { inotify }
    }

    /// The watcher saw the file written, and never removed, moved or replaced.
    fn saw_a_write_only(&self) {
        use nix::sys::inotify::AddWatchFlags;
        let mut seen = AddWatchFlags::empty();
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            events.iter().for_each(|e| seen |= e.mask);
        }
        let gone =
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED;
        assert!(
            !seen.intersects(gone),
            "the watcher saw the file go: {seen:?}"
        );
        assert!(
            seen.contains(AddWatchFlags::IN_MODIFY),
            "no write seen: {seen:?}"
        );
    }
}

/// OVN-Kubernetes' `.conf`, which multus thick names by path, grown by a `comment` key to
/// `len` bytes.
fn ovn_conf_of(len: usize) -> String {
    let mut text = String::from(
        r#"{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay","ipam":{},"comment":""#,
    );
    text.push_str(&"x".repeat(len - text.len() - 2));
    text.push_str("\"}");
    assert_eq!(text.len(), len);
    text
}

#[test]
fn an_in_place_write_longer_than_a_page_is_refused_writing_nothing() {
    // Catches the delegate wrap of a file multus names by path going in place whatever its length.
    // Past one page the kernel copies it page by page, so multus or the runtime reading meanwhile
    // gets the new first page with the old rest (and a crash can leave that on disk): JSON nothing
    // parses, and every pod ADD fails.
    let node = Node::with("ovn-multus-thick");
    let ovn = node.conf().join("10-ovn-kubernetes.conf");
    std::fs::write(&ovn, ovn_conf_of(4000)).unwrap();
    let before = tree(&node.dir.path);
    let out = node.run("--install", &["--mode", "delegate"]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("more than one page (4096)")
            && said.contains("multus")
            && said.contains("shorten the entry")
            && said.contains("nothing written"),
        "{said}"
    );
    assert_eq!(tree(&node.dir.path), before, "a refused install wrote");
    // What fits in a page goes in, in place.
    std::fs::write(&ovn, ovn_conf_of(3000)).unwrap();
    let ino = inode(&ovn);
    node.install("delegate", None);
    assert_eq!(inode(&ovn), ino);
    let wrapped = std::fs::read(&ovn).unwrap();
    assert!(wrapped.len() <= 4096, "{}", wrapped.len());
    assert!(check(&node).0, "{}", check(&node).1);
}

#[test]
fn an_uninstall_past_one_page_in_place_says_how_out() {
    // A wrapped file longer than a page (as an installer without the page rule wrote it):
    // taking the guard out in place would be a write of that length, so the uninstall
    // leaves it whole and says how to get the primary's own file back.
    let node = Node::with("ovn-multus-thick");
    let ovn = node.conf().join("10-ovn-kubernetes.conf");
    node.install("delegate", None);
    let mut wrapped: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&ovn).unwrap()).unwrap();
    wrapped["delegate"]["comment"] = "x".repeat(4096).into();
    std::fs::write(&ovn, wrapped.to_string()).unwrap();
    let before = std::fs::read(&ovn).unwrap();
    let out = node.run("--uninstall", &[]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("more than one page") && said.contains("have its owner write it again"),
        "{said}"
    );
    assert_eq!(std::fs::read(&ovn).unwrap(), before);
}

#[test]
fn a_file_a_crash_cut_is_never_called_ready() {
    // What a crash in an in-place write can leave where the disk or the file system tears:
    // the file grown to its new length with the old bytes and zeros after them, or the new
    // bytes cut short. Neither parses, for multus or the runtime: the probe must not say
    // ready, and an install must not say it succeeded.
    let node = Node::with("ovn-multus-thick");
    let ovn = node.conf().join("10-ovn-kubernetes.conf");
    let old = std::fs::read(&ovn).unwrap();
    node.install("delegate", None);
    let new = std::fs::read(&ovn).unwrap();
    let mut grown = old.clone();
    grown.resize(new.len(), 0);
    for torn in [grown, new[..new.len() / 2].to_vec()] {
        std::fs::write(&ovn, &torn).unwrap();
        let (ready, said) = check(&node);
        assert!(!ready && said.contains("does not parse"), "{said}");
        let out = node.run("--install", &["--mode", "delegate"]);
        let now = std::fs::read(&ovn).unwrap();
        assert!(
            !out.status.success() || serde_json::from_slice::<serde_json::Value>(&now).is_ok(),
            "the install said it succeeded and left {:?}",
            String::from_utf8_lossy(&now)
        );
    }
}

#[test]
fn an_in_place_write_that_runs_out_of_room_leaves_the_file_as_it_was() {
    // Catches the in-place write of a primary's single-plugin .conf getting its first block over
    // the old bytes, then ENOSPC for the block beyond them: the file left cut inside the new JSON,
    // which no runtime or multus can parse, and the install exiting with the error. A full root
    // file system is a common node failure. An ext4 of 1 KiB blocks: a file within one page still
    // needs a second block to grow.
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "/usr/lib/cni/bridge"]);
    let disk = mount::Mount::image(&["mkfs.ext4", "-q", "-F", "-b", "1024", "-O", "^has_journal"]);
    let conf = disk.path.join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    let bin = sys::TempDir::new("sgfullbin");
    std::os::unix::fs::symlink("/usr/lib/cni/bridge", bin.path.join("bridge")).unwrap();
    // A primary's .conf of just under a block: the guard's wrap needs a second one.
    let mut text = String::from(
        r#"{"cniVersion":"1.0.0","name":"pods","type":"bridge","bridge":"sgfull0","ipam":{},"comment":""#,
    );
    text.push_str(&"x".repeat(1020 - text.len() - 2));
    text.push_str("\"}");
    assert_eq!(text.len(), 1020);
    let file = conf.join("10-pods.conf");
    std::fs::write(&file, &text).unwrap();
    // Room for the kept original (one block), none for the file's second block.
    let slack = disk.path.join("slack");
    std::fs::write(&slack, vec![0u8; 1024]).unwrap();
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(disk.path.join("filler")).unwrap();
        for size in [1 << 20, 1024] {
            let chunk = vec![0xa5u8; size];
            while filler.write(&chunk).is_ok_and(|n| n > 0) {}
        }
        let _ = filler.sync_all();
    }
    std::fs::remove_file(&slack).unwrap();
    let out = cni::guard(&[
        "--install",
        "--mode",
        "delegate",
        "--conf-dir",
        conf.to_str().unwrap(),
        "--bin-dir",
        bin.path.to_str().unwrap(),
    ]);
    let now = std::fs::read_to_string(&file).unwrap();
    assert!(!out.status.success(), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("space"),
        "not the full disk: {}",
        stderr_of(&out)
    );
    assert!(
        now == text,
        "{}: the file now ends {:?}",
        stderr_of(&out),
        &now[now.len().saturating_sub(60)..]
    );
    drop(disk);
}

#[test]
fn multus_finds_the_guard_in_its_bin_dir() {
    // With multus thick's binDir (its daemon's config, written into 00-multus.conf) another dir
    // than the runtime's, catches the guard going only into the runtime's bin dir and the probe
    // saying ready, while multus's daemon, which searches binDir alone (the runtime's CNI_PATH does
    // not reach it), fails every ADD with "failed to find plugin sandbox-guard". binDir is the
    // host's path: under --host-root here, which also keeps this machine's cached attachments out
    // of --remove-binary.
    let node = Node::with("multus-thick");
    let guard = |mode: &str, extra: &[&str]| node.run_under_its_dir(mode, extra);
    let said = |out: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr_of(out))
    };
    // Where leaving delegate mode looks for deferred DELs: none wait.
    std::fs::create_dir_all(node.dir.path.join("var/lib/cni")).unwrap();
    let multus_bin = node.multus_bin_dir();
    let multus = node.conf().join("00-multus.conf");
    let mut conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&multus).unwrap()).unwrap();
    let set_bin_dir = |conf: &mut serde_json::Value, dir: &str| {
        conf["binDir"] = dir.into();
        std::fs::write(&multus, conf.to_string()).unwrap();
    };
    set_bin_dir(&mut conf, "/multus-bin");
    let out = guard("--install", &["--mode", "delegate"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("multus-bin/sandbox-guard too"),
        "{}",
        said(&out)
    );
    assert_eq!(
        std::fs::read(multus_bin.join("sandbox-guard")).unwrap(),
        std::fs::read(node.bin().join("sandbox-guard")).unwrap()
    );
    let out = guard("--install", &["--check"]);
    assert!(out.status.success(), "{}", said(&out));
    std::fs::remove_file(multus_bin.join("sandbox-guard")).unwrap();
    let out = guard("--install", &["--check"]);
    assert!(
        !out.status.success() && said(&out).contains("its binDir"),
        "{}",
        said(&out)
    );
    // A binDir holding none of the network's plugins is not where multus finds them (its
    // daemon config names another dir): nothing is copied there, and it does not count.
    std::fs::create_dir_all(node.dir.path.join("elsewhere")).unwrap();
    set_bin_dir(&mut conf, "/elsewhere");
    let out = guard("--install", &["--mode", "delegate"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(!node.dir.path.join("elsewhere/sandbox-guard").exists());
    let out = guard("--install", &["--check"]);
    assert!(out.status.success(), "{}", said(&out));
    // --remove-binary takes the copy in multus's binDir as well.
    set_bin_dir(&mut conf, "/multus-bin");
    let out = guard("--install", &["--mode", "delegate"]);
    assert!(multus_bin.join("sandbox-guard").is_file(), "{}", said(&out));
    let out = guard("--uninstall", &["--remove-binary"]);
    assert!(out.status.success(), "{}", said(&out));
    for dir in [&multus_bin, &node.bin()] {
        for binary in ["sandbox-guard", "sandbox-guard-ctl"] {
            assert!(!dir.join(binary).exists(), "{}", said(&out));
        }
    }
}

#[test]
fn multus_thin_runs_the_guard_its_bin_dir_holds_first() {
    // Multus thin searches its binDir before the runtime's dirs (its CNI_PATH): a guard
    // there is the one it runs, so it must be this one; with none there it finds the guard
    // where the runtime does, and nothing is copied.
    let node = Node::with("multus-thin");
    let guard = |mode: &str, extra: &[&str]| node.run_under_its_dir(mode, extra);
    let multus_bin = node.multus_bin_dir();
    let multus = node.conf().join("00-multus.conflist");
    let mut conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&multus).unwrap()).unwrap();
    conf["plugins"][0]["binDir"] = "/multus-bin".into();
    std::fs::write(&multus, conf.to_string()).unwrap();
    let out = guard("--install", &["--mode", "chained"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(!multus_bin.join("sandbox-guard").exists());
    // Multus inlines the guarded master file again (its pod restarted).
    conf["plugins"][0]["delegates"][0] =
        serde_json::from_slice(&std::fs::read(node.conf().join("10-calico.conflist")).unwrap())
            .unwrap();
    std::fs::write(&multus, conf.to_string()).unwrap();
    let out = guard("--install", &["--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // An older guard in multus's binDir: replaced, and not ready while it is there.
    std::fs::write(multus_bin.join("sandbox-guard"), b"older").unwrap();
    let out = guard("--install", &["--check"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !out.status.success() && said.contains("its binDir"),
        "{said}"
    );
    let out = guard("--install", &["--mode", "chained"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read(multus_bin.join("sandbox-guard")).unwrap(),
        std::fs::read(node.bin().join("sandbox-guard")).unwrap()
    );
}

#[test]
fn multus_thick_bin_dir_the_installer_cannot_see_is_refused_and_never_written_outside() {
    // Multus thick runs every delegate from its binDir alone. Catches a binDir the installer cannot
    // see under --host-root (not mounted, a relative path) "left alone": the guard put into the
    // cluster network, multus failing every pod ADD with "failed to find plugin", and the probe
    // saying ready. Also catches a binDir that is an absolute link (the host's path), or that
    // climbs with `..`, resolved in the installer's own root and the binary copied outside
    // --host-root.
    let node = Node::with("multus-thick");
    let guard = |mode: &str, extra: &[&str]| node.run_under_its_dir(mode, extra);
    let said = |out: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr_of(out))
    };
    std::fs::create_dir_all(node.dir.path.join("var/lib/cni")).unwrap();
    // A dir of this machine holding the network's plugins, outside the host root.
    let outside = sys::TempDir::new("sgoutside");
    stub_plugins(&node.conf(), &outside.path);
    let multus = node.conf().join("00-multus.conf");
    let mut conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&multus).unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside.path, node.dir.path.join("linked-bin")).unwrap();
    let climbing = format!(
        "/{}{}",
        "../".repeat(16),
        outside.path.strip_prefix("/").unwrap().display()
    );
    for bin_dir in [
        "/not-mounted",
        "relative/bin",
        "/linked-bin",
        climbing.as_str(),
    ] {
        conf["binDir"] = bin_dir.into();
        std::fs::write(&multus, conf.to_string()).unwrap();
        let before = (tree(&node.conf()), tree(&node.bin()));
        let out = guard("--install", &["--mode", "delegate"]);
        assert_eq!(out.status.code(), Some(1), "{bin_dir}: {}", said(&out));
        assert!(
            said(&out).contains("binDir") && said(&out).contains("mount"),
            "{bin_dir}: {}",
            said(&out)
        );
        assert_eq!(
            (tree(&node.conf()), tree(&node.bin())),
            before,
            "{bin_dir}: a refused install wrote"
        );
        assert!(
            !outside.path.join("sandbox-guard").exists(),
            "{bin_dir}: copied outside the host root"
        );
    }
    // The host's own links resolve under the host root: an absolute link to /multus-bin.
    let multus_bin = node.multus_bin_dir();
    std::fs::remove_file(node.dir.path.join("linked-bin")).unwrap();
    std::os::unix::fs::symlink("/multus-bin", node.dir.path.join("linked-bin")).unwrap();
    conf["binDir"] = "/linked-bin".into();
    std::fs::write(&multus, conf.to_string()).unwrap();
    let out = guard("--install", &["--mode", "delegate"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(multus_bin.join("sandbox-guard").is_file(), "{}", said(&out));
    assert!(
        std::fs::symlink_metadata(node.dir.path.join("linked-bin"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let out = guard("--install", &["--check"]);
    assert!(out.status.success(), "{}", said(&out));
    // The guard in the network, multus's binDir gone from view: not ready.
    conf["binDir"] = "/not-mounted".into();
    std::fs::write(&multus, conf.to_string()).unwrap();
    let out = guard("--install", &["--check"]);
    assert!(
        !out.status.success() && said(&out).contains("binDir"),
        "{}",
        said(&out)
    );
}

#[test]
fn an_uninstall_refused_past_one_page_writes_nothing_first() {
    // Catches the uninstall taking the guard out of the networks that sort before the one it then
    // refuses (OpenShift's OVN file, outside the conf dir, comes last), and saying "nothing
    // written".
    let node = Node::with("openshift");
    let host = node.host().unwrap();
    let ovn = host.join("run/multus/cni/net.d/10-ovn-kubernetes.conf");
    let platform = |extra: &[&str]| on_openshift(&host, extra);
    let out = platform(&["--install", "--mode", "delegate"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // A network the guard went into by hand (--network), beside multus's file.
    copy_fixture("install/calico/chained", &node.conf());
    let mut wrapped: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&ovn).unwrap()).unwrap();
    wrapped["delegate"]["comment"] = "x".repeat(4096).into();
    std::fs::write(&ovn, wrapped.to_string()).unwrap();
    let before = tree(&host);
    let out = platform(&["--uninstall"]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("more than one page"), "{said}");
    assert!(tree(&host) == before, "a refused uninstall wrote: {said}");
}

#[test]
fn multus_bin_dir_the_installer_cannot_write_says_how_out() {
    // Catches a binDir of multus thick mounted read-only (the default DaemonSet mounts /var/lib/cni
    // read-only, where OpenShift-like setups keep their plugins) failing the install with the bare
    // write error and no way out.
    sys::skip_unless_root!(&["mount", "umount"]);
    let node = Node::with("multus-thick");
    let multus_bin = node.with_multus_bin_dir_named();
    let read_only = mount::Mount::read_only_bind(&multus_bin);
    let before = tree(&node.conf());
    let out = node.run_under_its_dir("--install", &["--mode", "delegate"]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("binDir") && said.contains("writable"),
        "{said}"
    );
    assert!(
        tree(&node.conf()) == before,
        "the network was written: {said}"
    );
    drop(read_only);
}

#[test]
fn a_guard_multus_cannot_find_is_taken_out_of_its_network() {
    // The guard installed, then multus thick deployed with a binDir the installer cannot write (the
    // default DaemonSet mounts the host's /var/lib/cni read-only; OpenShift keeps its plugins in
    // /var/lib/cni/bin). Catches the install refused but the cluster network still naming the
    // guard, and multus thick, which runs delegates from its binDir alone, failing every pod ADD on
    // the node while the watch waits. Instead the guard stands aside: pods start unguarded rather
    // than not at all, and the probe says why; once the dir is writable the guard goes back in.
    sys::skip_unless_root!(&["mount", "umount"]);
    for mode in ["chained", "delegate"] {
        let node = Node::with("multus-thick");
        std::fs::create_dir_all(node.dir.path.join("var/lib/cni")).unwrap();
        let said = |out: &std::process::Output| {
            format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr_of(out))
        };
        let multus = node.conf().join("00-multus.conf");
        let deployed = std::fs::read(&multus).unwrap();
        std::fs::remove_file(&multus).unwrap();
        let calico = node.conf().join("10-calico.conflist");
        let primary = std::fs::read(&calico).unwrap();
        let out = node.run_under_its_dir("--install", &["--mode", mode]);
        assert!(out.status.success(), "{mode}: {}", said(&out));
        assert!(std::fs::read(&calico).unwrap() != primary);
        // Multus thick arrives, its binDir read-only to the installer.
        let multus_bin = node.multus_bin_dir();
        let mut conf: serde_json::Value = serde_json::from_slice(&deployed).unwrap();
        conf["binDir"] = "/multus-bin".into();
        std::fs::write(&multus, conf.to_string()).unwrap();
        let read_only = mount::Mount::read_only_bind(&multus_bin);
        let out = node.run_under_its_dir("--install", &["--mode", mode]);
        assert_eq!(out.status.code(), Some(1), "{mode}: {}", said(&out));
        assert!(
            said(&out).contains("took sandbox-guard out of") && said(&out).contains("writable"),
            "{mode}: {}",
            said(&out)
        );
        assert!(
            std::fs::read(&calico).unwrap() == primary,
            "{mode}: the cluster network still names a guard multus cannot find: {}",
            said(&out)
        );
        let out = node.run_under_its_dir("--install", &["--check"]);
        assert!(
            !out.status.success() && said(&out).contains("binDir"),
            "{mode}: {}",
            said(&out)
        );
        // Once the dir can be written, the guard goes back in.
        drop(read_only);
        let out = node.run_under_its_dir("--install", &["--mode", mode]);
        assert!(out.status.success(), "{mode}: {}", said(&out));
        assert!(multus_bin.join("sandbox-guard").is_file());
        let out = node.run_under_its_dir("--install", &["--check"]);
        assert!(out.status.success(), "{mode}: {}", said(&out));
    }
}

#[test]
fn a_guard_in_a_network_raised_to_a_version_it_does_not_speak_stands_aside() {
    // The guard installed, then the primary's config moved to a cniVersion the guard does not speak
    // with the entry kept (an operator's edit, a primary that merges its file): catches the install
    // refused and the network keeping the guard, so that every ADD fails on the version.
    for mode in ["chained", "delegate"] {
        let node = Node::with("calico");
        node.install(mode, None);
        let file = node.conf().join("10-calico.conflist");
        let mut list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        list["cniVersion"] = "2.0.0".into();
        std::fs::write(&file, list.to_string()).unwrap();
        let out = run(
            "--install",
            &node.conf(),
            &node.bin(),
            &Node::args(Some(mode), None),
        );
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{mode}: {stderr}");
        assert!(
            stderr.contains("does not speak") && !stderr.contains("nothing written"),
            "{mode}: {stderr}"
        );
        let now = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        assert!(
            !now.contains("sandbox-guard") && now.contains("2.0.0"),
            "{mode}: {now}"
        );
    }
}

#[test]
fn the_watch_stands_aside_when_multus_cannot_find_the_guard_and_comes_back() {
    // The same under the DaemonSet's watch: multus thick arrives with a binDir the watch
    // cannot write; the guard leaves the cluster network, the metric and the log say so,
    // and it returns once the dir is writable.
    sys::skip_unless_root!(&["mount", "umount"]);
    let node = Node::with("multus-thick");
    std::fs::create_dir_all(node.dir.path.join("var/lib/cni")).unwrap();
    let multus = node.conf().join("00-multus.conf");
    let deployed = std::fs::read(&multus).unwrap();
    std::fs::remove_file(&multus).unwrap();
    let calico = node.conf().join("10-calico.conflist");
    let primary = std::fs::read(&calico).unwrap();
    let metrics = node.dir.path.join("install.prom");
    let root = node.dir.path.display().to_string();
    let watcher = Watcher::start_with(
        &node,
        "chained",
        &[
            "--host-root",
            &root,
            "--metrics-file",
            metrics.to_str().unwrap(),
        ],
        "installed: put sandbox-guard into",
    );
    let multus_bin = node.multus_bin_dir();
    let read_only = mount::Mount::read_only_bind(&multus_bin);
    let mut conf: serde_json::Value = serde_json::from_slice(&deployed).unwrap();
    conf["binDir"] = "/multus-bin".into();
    std::fs::write(&multus, conf.to_string()).unwrap();
    watcher.wait_for(
        "stood aside: took sandbox-guard out of",
        Duration::from_secs(10),
    );
    watcher.wait_for("writable", Duration::from_secs(10));
    assert!(std::fs::read(&calico).unwrap() == primary);
    let value = |name: &str| {
        let text = std::fs::read_to_string(&metrics).unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while value("sandbox_guard_install_stood_aside_total").as_deref() != Some("1") {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            std::fs::read_to_string(&metrics)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        value("sandbox_guard_install_installed ").as_deref(),
        Some("0")
    );
    // Its own write wakes it once: it stays aside without writing again.
    let settled = tree(&node.conf());
    watcher.drain(Duration::from_secs(2));
    assert_eq!(tree(&node.conf()), settled);
    // The dir made writable (the DaemonSet fixed and rolled): the next change puts it back.
    drop(read_only);
    std::fs::write(&multus, conf.to_string()).unwrap();
    watcher.wait_for(
        "re-inserted: put sandbox-guard into",
        Duration::from_secs(10),
    );
    assert!(multus_bin.join("sandbox-guard").is_file());
    assert_eq!(watcher.terminate().code(), Some(0));
}

#[test]
fn a_bin_dir_that_is_a_link_resolves_under_the_host_root() {
    // Catches a bin dir under --host-root that is an absolute link (the host's path, as k3s's
    // data/current is) followed in the installer's own root when that root happens to hold the same
    // path, and the binary copied outside the host root, where the runtime never looks.
    let node = Node::with("calico");
    let root = &node.dir.path;
    // The host's real dir, and a dir of this machine at the same absolute path.
    let outside = sys::TempDir::new("sgbinout");
    stub_plugins(&node.conf(), &outside.path);
    let on_host = root.join(outside.path.strip_prefix("/").unwrap());
    stub_plugins(&node.conf(), &on_host);
    let link = root.join("opt-cni-bin");
    std::os::unix::fs::symlink(&outside.path, &link).unwrap();
    let out = run(
        "--install",
        &node.conf(),
        &link,
        &["--host-root", root.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        !outside.path.join("sandbox-guard").exists(),
        "copied outside the host root"
    );
    assert!(on_host.join("sandbox-guard").is_file());
}

#[test]
fn an_older_guard_multus_can_run_is_not_taken_out_when_its_dir_cannot_be_written() {
    // Multus's binDir holds a guard (an older build: the image was upgraded) in a dir the installer
    // can no longer write (mounted read-only, full). Multus runs that guard, so the node is
    // guarded; catches the install taking the guard out of the cluster network all the same, as if
    // multus could not find it. Only a dir without a guard is one the guard cannot run from.
    sys::skip_unless_root!(&["mount", "umount"]);
    let node = Node::with("multus-thick");
    let multus_bin = node.with_multus_bin_dir_named();
    let out = node.run_under_its_dir("--install", &["--mode", "chained"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let guarded = std::fs::read(node.conf().join("10-calico.conflist")).unwrap();
    assert!(multus_bin.join("sandbox-guard").is_file());
    // The older build: other bytes, the same guard to multus.
    let older = multus_bin.join("sandbox-guard");
    let mut bytes = std::fs::read(&older).unwrap();
    bytes.extend_from_slice(b"older build");
    std::fs::write(&older, bytes).unwrap();
    let read_only = mount::Mount::read_only_bind(&multus_bin);
    let out = node.run_under_its_dir("--install", &["--mode", "chained"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        std::fs::read(node.conf().join("10-calico.conflist")).unwrap() == guarded,
        "the guard multus runs was taken out of its network: {said}"
    );
    assert!(
        said.contains("writable") && !said.contains("took sandbox-guard out"),
        "{said}"
    );
    drop(read_only);
}

#[test]
fn taking_the_guard_out_never_writes_back_a_network_the_primary_rewrote_meanwhile() {
    // Standing aside (and --uninstall) reads the network, then waits for delegate mode's replays to
    // pause (up to ten seconds). Catches it then writing the guard-less copy of what it read over
    // whatever is there: a primary that writes its file in between loses its bytes. The replay
    // worker is this test holding `replay.lock`; the installer waits on it once it holds
    // `replay-waits`, after its read.
    for verb in ["--install", "--uninstall"] {
        let node = Node::with("calico");
        let state = sys::TempDir::new("sginstsa");
        let state_dir = state.path.join("state");
        let mut args = Node::args(Some("delegate"), None);
        args.extend(["--state-dir", state_dir.to_str().unwrap()]);
        run_ok("--install", &node.conf(), &node.bin(), &args);
        let file = node.conf().join("10-calico.conflist");
        if verb == "--install" {
            // A version the guard does not speak, the entry kept: it stands aside.
            let mut list: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            list["cniVersion"] = "2.0.0".into();
            std::fs::write(&file, list.to_string()).unwrap();
        } else {
            args.clear();
        }
        std::fs::create_dir_all(&state_dir).unwrap();
        let worker = std::fs::File::create(state_dir.join("replay.lock")).unwrap();
        worker.lock_shared().unwrap();
        let installer = Command::new(cni::bin())
            .arg(verb)
            .args(["--conf-dir", node.conf().to_str().unwrap()])
            .args(["--bin-dir", node.bin().to_str().unwrap()])
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let waits = state_dir.join("replay-waits");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !waits.exists() || std::fs::File::open(&waits).is_ok_and(|f| f.try_lock().is_ok()) {
            assert!(Instant::now() < deadline, "{verb} never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The primary writes its own file again, without the guard.
        let rewritten = br#"{"name":"k8s-pod-network","cniVersion":"1.0.0","plugins":[{"type":"calico","mtu":1440,"ipam":{"type":"calico-ipam"}}]}"#;
        std::fs::write(&file, rewritten).unwrap();
        drop(worker);
        let out = installer.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr_of(&out)
        );
        assert_eq!(
            String::from_utf8_lossy(&std::fs::read(&file).unwrap()),
            String::from_utf8_lossy(rewritten),
            "{verb}: the primary's write was lost: {said}"
        );
    }
}

#[test]
fn standing_aside_says_when_it_could_not_look_for_deferred_dels() {
    // A delegate-mode stateDir not mounted under --host-root cannot tell whether deferred DELs
    // wait. Catches standing aside going on (as it must) without a word about them, so that the
    // operator never learns that some may wait for delegate mode.
    let node = Node::with("calico");
    let state = ["--state-dir", "/not-mounted/sandbox-guard"];
    let out = node.run_under_its_dir("--install", &[&["--mode", "delegate"][..], &state].concat());
    assert!(out.status.success(), "{}", stderr_of(&out));
    let file = node.conf().join("10-calico.conflist");
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    list["cniVersion"] = "2.0.0".into();
    std::fs::write(&file, list.to_string()).unwrap();
    let out = node.run_under_its_dir("--install", &[&["--mode", "delegate"][..], &state].concat());
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}{}", stderr_of(&out));
    assert!(said.contains("took sandbox-guard out of"), "{said}");
    assert!(
        said.contains("standing aside") && said.contains("/not-mounted/sandbox-guard"),
        "nothing said about the deferred DELs it could not look for: {said}"
    );
}

#[test]
fn a_multus_bin_dir_the_installer_cannot_see_does_not_unguard_the_node() {
    // With the guard installed, catches multus thick's binDir not under --host-root (not mounted
    // into the installer's pod, or a wrong --host-root) taking the guard out. The installer cannot
    // tell "not mounted" from "not on the node", and on a node without that dir multus runs no
    // delegate at all, guard or not: taking it out could only unguard a working node. Refused, not
    // ready, nothing written.
    let node = Node::with("multus-thick");
    std::fs::create_dir_all(node.dir.path.join("var/lib/cni")).unwrap();
    let multus = node.conf().join("00-multus.conf");
    let deployed = std::fs::read(&multus).unwrap();
    std::fs::remove_file(&multus).unwrap();
    let out = node.run_under_its_dir("--install", &["--mode", "chained"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let mut conf: serde_json::Value = serde_json::from_slice(&deployed).unwrap();
    conf["binDir"] = "/not-mounted".into();
    std::fs::write(&multus, conf.to_string()).unwrap();
    let before = tree(&node.dir.path);
    let out = node.run_under_its_dir("--install", &["--mode", "chained"]);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("binDir") && said.contains("mount"), "{said}");
    assert!(
        tree(&node.dir.path) == before,
        "a binDir it cannot see took the guard out: {said}"
    );
}
