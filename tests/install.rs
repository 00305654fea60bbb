//! `--install` and `--uninstall` on conf dirs shaped as real primaries leave them
//! (testdata/install/<primary>/conf) and checked byte for byte against the expected dirs
//! (testdata/install/<primary>/<mode>): install, install again (not one file rewritten),
//! the primary's installer rewriting its file, uninstall (the primary's bytes back), and the
//! inputs refused without a write. `--watch` against a primary that keeps rewriting and
//! against a second watcher that strips the entry each time. No root needed.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/primary.rs"]
mod primary;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use install::{assert_matches_fixture, contents, copy_fixture, primary_rewrites, run, run_ok, tree};

const LOG: [&str; 2] = ["--log-file", "/var/log/sandbox-guard.log"];

/// Each primary's conf dir and the network file its installer writes, with the modes that
/// apply (a drop-in needs a .conflist) and the --network a dir of several networks needs.
const CASES: [(&str, &str, &[&str], Option<&str>); 5] = [
    ("calico", "10-calico.conflist", &["chained", "delegate", "dropin"], None),
    ("flannel", "10-flannel.conflist", &["chained", "delegate", "dropin"], None),
    ("cilium-chaining", "05-cilium.conflist", &["chained", "delegate", "dropin"], None),
    ("macvlan-conf", "20-macvlan.conf", &["chained", "delegate"], None),
    ("multus", "00-multus.conf", &["chained", "delegate"], Some("multus-cni-network")),
];

struct Node {
    dir: sys::TempDir,
}

impl Node {
    fn with(case: &str) -> Node {
        let node = Node { dir: sys::TempDir::new("sginst") };
        std::fs::create_dir_all(node.conf()).unwrap();
        copy_fixture(&format!("install/{case}/conf"), &node.conf());
        node
    }

    fn conf(&self) -> std::path::PathBuf {
        self.dir.path.join("net.d")
    }

    fn bin(&self) -> std::path::PathBuf {
        self.dir.path.join("bin")
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

    fn install(&self, mode: &str, network: Option<&str>) -> String {
        run_ok("--install", &self.conf(), &self.bin(), &Node::args(Some(mode), network))
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
            std::fs::set_permissions(&primary_file, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
            let before = contents(&node.conf());
            let when = format!("{case} {mode}");

            let said = node.install(mode, network);
            assert!(!said.contains("already installed"), "{when}: {said}");
            assert_matches_fixture(&node.conf(), &format!("install/{case}/{mode}"), &format!("{when}: install"));
            let stem = Path::new(file).file_stem().unwrap().to_str().unwrap();
            for (path, state) in tree(&node.conf()) {
                if *mode != "dropin" && path.to_str().unwrap().starts_with(stem) {
                    assert_eq!(state.mode, 0o640, "{when}: {} lost the primary's mode", path.display());
                }
            }

            let settled = tree(&node.conf());
            let said = node.install(mode, network);
            assert_eq!(said.trim(), "already installed: nothing changed", "{when}");
            assert_eq!(tree(&node.conf()), settled, "{when}: a second install rewrote a file");

            // The primary's installer writes its file again (an upgrade): the entry is gone.
            primary_rewrites(&primary_file, &original);
            std::fs::set_permissions(&primary_file, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
            node.install(mode, network);
            assert_matches_fixture(&node.conf(), &format!("install/{case}/{mode}"), &format!("{when}: after the primary's rewrite"));

            let said = node.uninstall(network);
            assert!(!said.contains("not installed"), "{when}: {said}");
            assert_eq!(contents(&node.conf()), before, "{when}: uninstall did not give the primary's files back");
            assert_eq!(cni::mode(&primary_file), 0o640, "{when}: uninstall lost the mode");
            assert_eq!(node.uninstall(network).trim(), "not installed: nothing changed", "{when}");
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
    node.install("chained", None);
    assert_eq!(std::fs::read(&binary).unwrap(), std::fs::read(cni::BIN).unwrap());
    assert_eq!(cni::mode(&binary), 0o755);
    let first = tree(&node.bin());
    node.install("delegate", None);
    assert_eq!(tree(&node.bin()), first, "an identical binary was copied again");
    node.uninstall(None);
    assert!(binary.exists(), "uninstall without --remove-binary removed the binary");
    node.install("chained", None);
    run_ok("--uninstall", &node.conf(), &node.bin(), &["--remove-binary"]);
    assert!(!binary.exists());
    assert_eq!(contents(&node.conf()), contents(&testdata::fixture_path("install/flannel/conf")));
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let refused = |node: &Node, args: &[&str], says: &str| {
        let before = tree(&node.dir.path);
        let out = run("--install", &node.conf(), &node.bin(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says) && stderr.contains("nothing written"), "{args:?}: {stderr}");
        assert_eq!(tree(&node.dir.path), before, "{args:?}: a refused install wrote");
        assert!(!node.bin().exists(), "{args:?}: the binary was copied before the refusal");
    };
    let empty = Node { dir: sys::TempDir::new("sginst") };
    std::fs::create_dir_all(empty.conf()).unwrap();
    std::fs::write(empty.conf().join("README"), "not a network").unwrap();
    refused(&empty, &[], "no CNI network in");

    let multus = Node::with("multus");
    refused(&multus, &[], "several networks in");
    refused(&multus, &["--network", "nope"], "no network named \"nope\"");
    refused(&multus, &["--network", "multus-cni-network", "--mode", "dropin"], "--mode dropin needs the network in a .conflist");

    let broken = Node::with("calico");
    std::fs::copy(testdata::fixture_path("conflists/broken/truncated.conflist"), broken.conf().join("05-half.conflist")).unwrap();
    refused(&broken, &[], "does not parse as JSON");
    // After the network it is not the runtime's choice either way: installed, left alone.
    std::fs::rename(broken.conf().join("05-half.conflist"), broken.conf().join("99-half.conflist")).unwrap();
    broken.install("chained", None);

    let inlined = Node::with("cilium-chaining");
    let file = inlined.conf().join("05-cilium.conflist");
    let text = std::fs::read_to_string(&file).unwrap().replacen('{', "{\n  \"loadOnlyInlinedPlugins\": true,", 1);
    std::fs::write(&file, text).unwrap();
    refused(&inlined, &["--mode", "dropin"], "loadOnlyInlinedPlugins");

    let converted_over = Node::with("macvlan-conf");
    std::fs::write(converted_over.conf().join("20-macvlan.conflist"), "{\"name\":\"other\",\"plugins\":[{\"type\":\"x\"}]}").unwrap();
    refused(&converted_over, &["--network", "macvlan-net"], "exists with other content");
}

/// A running `--install --watch` and the lines it logs, read as they come.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(node: &Node, mode: &str) -> Watcher {
        let mut child = Command::new(cni::BIN)
            .args(["--install", "--watch", "--mode", mode, "--conf-dir", node.conf().to_str().unwrap()])
            .args(["--bin-dir", node.bin().to_str().unwrap()])
            .args(LOG)
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
        watcher.wait_for("installed: put sandbox-guard into", Duration::from_secs(10));
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
        assert!(started.elapsed() < Duration::from_secs(3), "rewrite {i}: the entry came back after {:?}", started.elapsed());
        // Its own write wakes it once more and changes nothing: no further line, no write.
        let settled = tree(&node.conf());
        let more = watcher.drain(Duration::from_secs(2));
        assert!(more.is_empty(), "rewrite {i}: the watcher went on: {more:?}");
        assert_eq!(tree(&node.conf()), settled, "rewrite {i}: a write after the re-insert");
        assert_matches_fixture(&node.conf(), "install/calico/delegate", &format!("after rewrite {i}"));
    }
    let status = watcher.terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM must end --watch cleanly");
    assert_matches_fixture(&node.conf(), "install/calico/delegate", "after SIGTERM (stays installed)");
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
    assert!(lines.iter().any(|l| l.contains("another writer keeps rewriting")), "{lines:#?}");
    // Five in the first minute, then one more after each doubling wait (1 s, 2 s, 4 s).
    assert!(reinserts <= 9, "{reinserts} re-inserts in 12 s against {competitor_writes} strips: {lines:#?}");
    assert_eq!(watcher.terminate().code(), Some(0));
}

#[test]
fn usage_errors_exit_2_before_anything_runs() {
    let node = Node::with("calico");
    let before = tree(&node.dir.path);
    for (args, says) in [
        (&["--mode", "last"][..], "--mode \"last\": use chained, delegate or dropin"),
        (&["--state-dir", "var/lib/x"], "give an absolute path"),
        (&["--remove-binary"], "--remove-binary belongs to --uninstall"),
        (&["--lock-timeout", "3"], "--lock-timeout belongs to"),
        (&["extra"], "--install takes options only"),
    ] {
        let out = run("--install", &node.conf(), &node.bin(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = run("--uninstall", &node.conf(), &node.bin(), &["--watch"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
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
    run_ok("--install", &node.conf(), &node.bin(), &strs(&with_state("delegate")));
    // A stale DEL deferred on that network: ADD A, ADD B of one pod, then A's DEL.
    let store = cni::Store::with_state_dir(state_dir.clone(), &state.path);
    let recording = primary::RecordingPrimary::new();
    let pod = cni::Pod::new("lijiaob", "etcd1-0");
    let (a, b) = (cni::container_id(), cni::container_id());
    for call in [store.add(&a, &pod), store.add(&b, &pod), store.del(&a, &pod)] {
        recording.wrap(call.network("k8s-pod-network")).run().assert_ok();
    }
    let before = contents(&node.conf());
    for (mode, args) in [("--install", with_state("chained")), ("--uninstall", vec![])] {
        let out = run(mode, &node.conf(), &node.bin(), &strs(&args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mode} must refuse while a deferred DEL waits");
        assert!(stderr.contains("1 deferred DELs") && stderr.contains(&a[..12]) && stderr.contains("--force"), "{stderr}");
        assert_eq!(contents(&node.conf()), before, "{mode} refused, so nothing is written");
    }
    let out = run_ok("--uninstall", &node.conf(), &node.bin(), &["--force"]);
    assert!(out.contains("--force") && out.contains("dropped"), "--force says what is lost: {out}");
    assert!(contents(&node.conf()) != before, "--force goes on");
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
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
    assert!(!refused.status.success(), "without --force it cannot tell, so it refuses");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"), "and names the way out: {}", String::from_utf8_lossy(&refused.stderr));
    let out = run_ok("--uninstall", &node.conf(), &node.bin(), &["--force"]);
    assert!(out.contains("--force"), "--force says what it could not check: {out}");
    assert!(contents(&node.conf()) != before, "--force goes on");
}
