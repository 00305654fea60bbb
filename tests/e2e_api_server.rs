//! Rules 7 and 8 (`state::ownership`) against a real kube-apiserver (`scripts/node.sh up
//! --api-only`: etcd and the API server built from their modules, with RBAC), read with a
//! ServiceAccount token whose ClusterRole may `get` pods and nothing else, as the plugin's
//! kubeconfig gives it. The CNI calls are made to the plugin directly, as a runtime makes them,
//! on one node (`nodeName: node-a`); the API's pods are placed by `spec.nodeName`, with no
//! kubelet or controller to move them.
//!
//! - The failover: db-0 (UID 1) runs here; it is force deleted and made again on node-b
//!   (UID 2); then this node's DEL of the old sandbox comes. Without a kubeconfig, and in audit
//!   mode (the negative control), it passes: a primary keyed by name across the cluster frees
//!   the new pod's address. With one, under `podKeyScope: "cluster"`, chained mode refuses it
//!   (code 11, naming the API's pod UID and node) and delegate mode defers it (answered with
//!   success, its repeat too, the primary never has it); under `"node"` it passes. Once the API
//!   has no db-0 (scaled to zero), chained mode's retry passes and delegate mode's next sweep
//!   replays it to the primary, once.
//! - A late ADD: db-1 (UID 3) is force deleted while its sandbox is made, after db-1 (UID 4)
//!   took the name here; UID 3's ADD is refused (the delegate's primary never sees it), where
//!   without a kubeconfig, and in audit mode, it takes the name. On a node without the name
//!   (the pod made again on node-b), delegate mode under `podKeyScope: "cluster"` refuses it
//!   before its primary runs; without a kubeconfig, in audit mode, under `"node"` and chained
//!   (whose ADD comes after the primary's) it goes through.
//! - The API server stopped (SIGSTOP: it takes connections and never answers) and killed: an
//!   ADD that asks (the name owned here by another pod UID) and a DEL that asks (the owner's)
//!   pass within the bound, and the log says the local rule decided alone.
//! - The installer's kubeconfig from the shipped manifest's ServiceAccount (`installers_kubeconfig`).

#[path = "support/boot.rs"]
mod boot;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cni::{Cni, Pod, Store, container_id};
use primary::RecordingPrimary;
use serde_json::{Value, json};

const THIS_NODE: &str = "node-a";
const NAMESPACE: &str = "api-check";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The API alone, taken down on drop.
struct Api {
    env: BTreeMap<String, String>,
}

impl Api {
    fn up() -> Api {
        let out = Command::new("bash")
            .arg(repo().join("scripts/node.sh"))
            .args(["up", "--api-only"])
            .output()
            .expect("run scripts/node.sh up --api-only");
        if !out.status.success() {
            let _ = Command::new("bash")
                .arg(repo().join("scripts/node.sh"))
                .arg("down")
                .output();
            panic!(
                "scripts/node.sh up --api-only failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Api { env }
    }

    fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("node.sh up --api-only printed no {name}"))
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new(self.var("PATH_KUBECTL"))
            .arg("--kubeconfig")
            .arg(self.var("KUBECONFIG"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        sys::assert_succeeded("kubectl", args, &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Makes pod `name` on `node`; its UID.
    fn pod_on(&self, name: &str, node: &str) -> String {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        });
        self.kubectl_ok(&["create", "-f", "-"], Some(&pod.to_string()));
        self.kubectl_ok(
            &[
                "get",
                "pod",
                "-n",
                NAMESPACE,
                name,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        )
    }

    fn force_delete(&self, name: &str) {
        self.kubectl_ok(
            &[
                "delete",
                "pod",
                "-n",
                NAMESPACE,
                name,
                "--grace-period=0",
                "--force",
            ],
            None,
        );
    }

    /// The ServiceAccount, its role (get on pods, nothing else) and a kubeconfig with its
    /// token, JSON and 0600, as the plugin reads it.
    fn plugin_kubeconfig(&self, dir: &Path) -> PathBuf {
        let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "sandbox-guard-cni", "namespace": "kube-system"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "sandbox-guard-cni"},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "sandbox-guard-cni"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sandbox-guard-cni"},
             "subjects": [{"kind": "ServiceAccount", "name": "sandbox-guard-cni", "namespace": "kube-system"}]},
        ]});
        self.kubectl_ok(&["apply", "-f", "-"], Some(&rbac.to_string()));
        let token = self.kubectl_ok(
            &[
                "create",
                "token",
                "-n",
                "kube-system",
                "sandbox-guard-cni",
                "--duration=1h",
            ],
            None,
        );
        let admin: Value = serde_json::from_str(&self.kubectl_ok(
            &["config", "view", "--raw", "--flatten", "-o", "json"],
            None,
        ))
        .unwrap();
        let cluster = &admin["clusters"][0]["cluster"];
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "sandbox-guard-cni", "user": {"token": token.trim()}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sandbox-guard-cni"}}],
            "current-context": "c",
        });
        let path = dir.join("sandbox-guard.kubeconfig");
        fs::write(&path, kubeconfig.to_string()).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn signal_apiserver(&self, signal: &str) {
        use nix::sys::signal::Signal;
        let pid: i32 = fs::read_to_string(self.var("APISERVER_PID_FILE"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let signal = match signal {
            "STOP" => Signal::SIGSTOP,
            "CONT" => Signal::SIGCONT,
            _ => Signal::SIGKILL,
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/node.sh"))
            .arg("down")
            .output();
    }
}

/// The guard's entry keys for a run: the kubeconfig or none, and the scope.
#[derive(Clone)]
struct Keys {
    kubeconfig: Option<PathBuf>,
    scope: &'static str,
    stale_del: &'static str,
}

impl Keys {
    fn on(&self, call: Cni) -> Cni {
        call.config(
            "kubeconfig",
            self.kubeconfig.as_ref().map(|p| json!(p.to_str().unwrap())),
        )
        .config("podKeyScope", Some(json!(self.scope)))
        .config("nodeName", Some(json!(THIS_NODE)))
        .config("staleDel", Some(json!(self.stale_del)))
    }

    /// `on`, chained, or wrapping `delegate`.
    fn in_mode(&self, call: Cni, delegate: Option<&RecordingPrimary>) -> Cni {
        match delegate {
            Some(primary) => primary.wrap(self.on(call)),
            None => self.on(call),
        }
    }
}

/// The installer's kubeconfig (`--install --api-credentials`), from the shipped manifest's
/// ServiceAccount: written 0600 into the conf dir and named in the entry with the node's
/// name; it answers a GET of a pod and nothing more; a renewed token reaches it at once under
/// `--watch`; the uninstall removes it.
fn installers_kubeconfig(api: &Api, report: &mut Vec<String>) {
    let manifest = repo().join("conf-examples/kubernetes/sandbox-guard.yaml");
    api.kubectl_ok(&["apply", "-f", manifest.to_str().unwrap()], None);
    let account = "system:serviceaccount:kube-system:sandbox-guard";
    for (verb, allowed) in [
        ("get", "yes"),
        ("list", "no"),
        ("watch", "no"),
        ("delete", "no"),
    ] {
        let answer = api.kubectl(
            &["auth", "can-i", verb, "pods", "-A", "--as", account],
            None,
        );
        assert!(
            String::from_utf8_lossy(&answer.stdout).starts_with(allowed),
            "the manifest's ServiceAccount: can-i {verb} pods gave {:?}",
            String::from_utf8_lossy(&answer.stdout)
        );
    }
    let work = sys::TempDir::new("sg-api-install");
    let (conf, bin, sa) = (
        work.path.join("net.d"),
        work.path.join("bin"),
        work.path.join("serviceaccount"),
    );
    for dir in [&conf, &bin, &sa] {
        fs::create_dir_all(dir).unwrap();
    }
    let network =
        json!({"cniVersion": "1.0.0", "name": "api-check", "plugins": [{"type": "bridge"}]});
    fs::write(conf.join("10-api.conflist"), network.to_string()).unwrap();
    fs::write(bin.join("bridge"), "").unwrap();
    fs::set_permissions(bin.join("bridge"), fs::Permissions::from_mode(0o755)).unwrap();
    // The volume as kubelet's AtomicWriter lays it out: the files in a timestamped dir,
    // `..data` a link to it, each name a link through `..data`; a renewal writes a new dir
    // and swaps `..data` in one rename.
    let ca = Path::new(api.var("NODE_DIR")).join("pki/ca.crt");
    let mut generation = 0;
    let mut token = |sa: &Path| {
        let token = api.kubectl_ok(
            &[
                "create",
                "token",
                "-n",
                "kube-system",
                "sandbox-guard",
                "--duration=1h",
            ],
            None,
        );
        generation += 1;
        let data = format!("..2026_12_05_{generation}");
        fs::create_dir(sa.join(&data)).unwrap();
        fs::write(sa.join(&data).join("token"), token.trim()).unwrap();
        fs::copy(&ca, sa.join(&data).join("ca.crt")).unwrap();
        std::os::unix::fs::symlink(&data, sa.join("..data_tmp")).unwrap();
        fs::rename(sa.join("..data_tmp"), sa.join("..data")).unwrap();
        for name in ["token", "ca.crt"] {
            let _ = std::os::unix::fs::symlink(format!("..data/{name}"), sa.join(name));
        }
        if generation > 1 {
            fs::remove_dir_all(sa.join(format!("..2026_12_05_{}", generation - 1))).unwrap();
        }
        token.trim().to_string()
    };
    let first = token(&sa);
    let admin: Value = serde_json::from_str(&api.kubectl_ok(
        &["config", "view", "--raw", "--flatten", "-o", "json"],
        None,
    ))
    .unwrap();
    let server = admin["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_string();
    let ctl = cni::ctl();
    let install_args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "--install",
            "--mode",
            "chained",
            "--runtime-socket",
            "none",
            "--node-name",
            THIS_NODE,
            "--api-server",
            &server,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (flag, path) in [
            ("--conf-dir", &conf),
            ("--bin-dir", &bin),
            ("--api-credentials", &sa),
        ] {
            args.push(flag.to_string());
            args.push(path.to_str().unwrap().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let args = install_args(&[]);
    let out = Command::new(ctl).args(&args).output().unwrap();
    sys::assert_succeeded("sandbox-guard-ctl", &["--install"], &out);
    let written = conf.join("sandbox-guard.d/kubeconfig");
    let mode = fs::metadata(&written).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the plugin's kubeconfig");
    let dir_mode = fs::metadata(written.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "the kubeconfig's folder");
    let list: Value =
        serde_json::from_slice(&fs::read(conf.join("10-api.conflist")).unwrap()).unwrap();
    let entry = &list["plugins"][1];
    assert_eq!(entry["type"], "sandbox-guard", "{list:#}");
    assert_eq!(
        entry["kubeconfig"],
        json!(written.to_str().unwrap()),
        "{entry:#}"
    );
    assert_eq!(entry["nodeName"], THIS_NODE, "{entry:#}");
    let get = |kubeconfig: &Path| {
        let out = sys::run(
            ctl,
            &[
                "--get-pod",
                &format!("{NAMESPACE}/none-0"),
                kubeconfig.to_str().unwrap(),
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(get(&written), r#"{"found":false}"#);
    let holds = |token: &str| fs::read_to_string(&written).is_ok_and(|t| t.contains(token));
    assert!(holds(&first));

    // Renewed: kubelet swaps the projected volume's files; the watch copies the new token
    // without waiting for its next look at the conf dir.
    let watch = Command::new(ctl)
        .args(install_args(&["--watch"]))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !fs::read_to_string(conf.join("10-api.conflist"))
        .is_ok_and(|t| t.contains("sandbox-guard"))
        && started.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let second = token(&sa);
    let renewed = Instant::now();
    while !holds(&second) && renewed.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let copied_in = renewed.elapsed();
    // A run by hand without --api-credentials while the watch runs: the watch's key and file
    // stay (the watch would write them back, and a DEL meanwhile would find no kubeconfig).
    let mut off = install_args(&[]);
    for flag in ["--api-credentials", "--api-server"] {
        let at = off.iter().position(|a| a == flag).unwrap();
        off.drain(at..at + 2);
    }
    let out = Command::new(ctl).args(&off).output().unwrap();
    sys::assert_succeeded("sandbox-guard-ctl", &["--install"], &out);
    let list: Value =
        serde_json::from_slice(&fs::read(conf.join("10-api.conflist")).unwrap()).unwrap();
    let by_hand_kept = list["plugins"][1].get("kubeconfig").is_some() && written.exists();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let watched = watch.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&watched.stderr);
    assert!(
        by_hand_kept,
        "a run by hand without --api-credentials took the running watch's kubeconfig:\n{list:#}\n{said}"
    );
    assert!(
        holds(&second),
        "the watch did not copy the renewed token:
{said}"
    );
    assert_eq!(get(&written), r#"{"found":false}"#);
    report.push(format!(
        "installer: the manifest's ServiceAccount gets pods only; its kubeconfig written 0600 and named in the entry; a renewed token (the volume's ..data link swapped) copied by the watch in {} ms; a run by hand without --api-credentials meanwhile left it",
        copied_in.as_millis()
    ));

    // Turned off while another network's guard names the file, through a symlinked spelling
    // of the conf dir: the entry loses the key, the file stays.
    let link = work.path.join("net.d-link");
    std::os::unix::fs::symlink(&conf, &link).unwrap();
    let other = conf.join("20-other.conflist");
    let named = link.join("sandbox-guard.d/kubeconfig");
    fs::write(
        &other,
        json!({"cniVersion": "1.0.0", "name": "other", "plugins": [
            {"type": "bridge"},
            {"type": "sandbox-guard", "kubeconfig": named.to_str().unwrap()},
        ]})
        .to_string(),
    )
    .unwrap();
    // An install without --api-credentials, no watch running: the entry loses the key.
    let turn_off = || {
        let out = Command::new(ctl).args(&off).output().unwrap();
        sys::assert_succeeded("sandbox-guard-ctl", &["--install"], &out);
        let list: Value =
            serde_json::from_slice(&fs::read(conf.join("10-api.conflist")).unwrap()).unwrap();
        assert!(list["plugins"][1].get("kubeconfig").is_none(), "{list:#}");
    };
    turn_off();
    assert!(
        written.exists(),
        "the kubeconfig went while {} names it as {}",
        other.display(),
        named.display()
    );
    fs::remove_file(&other).unwrap();
    report.push("installer: run without --api-credentials while another network names the file (a symlinked spelling): the key goes, the file stays".into());

    // Turned off: an install without --api-credentials, no watch running and nothing else
    // naming the file, takes the key out and leaves the turn-off sign in the file, for the
    // DELs held with it; on again, it writes them back.
    turn_off();
    assert_eq!(
        fs::read_to_string(&written).unwrap(),
        sandbox_guard::state::held::VIEW_OFF,
        "the kubeconfig, once no network names it"
    );
    assert_eq!(
        fs::metadata(&written).unwrap().permissions().mode() & 0o777,
        0o600
    );
    report.push("installer: run without --api-credentials, the entry's kubeconfig key is gone and the file holds the turn-off sign".into());
    let out = Command::new(ctl).args(install_args(&[])).output().unwrap();
    sys::assert_succeeded("sandbox-guard-ctl", &["--install"], &out);
    assert!(holds(&second));

    let out = Command::new(ctl)
        .args([
            "--uninstall",
            "--runtime-socket",
            "none",
            "--conf-dir",
            conf.to_str().unwrap(),
            "--bin-dir",
            bin.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    sys::assert_succeeded("sandbox-guard-ctl", &["--uninstall"], &out);
    assert!(
        !written.parent().unwrap().exists(),
        "the uninstall left the plugin's kubeconfig or its folder"
    );
    api.kubectl_ok(&["delete", "-f", manifest.to_str().unwrap()], None);
}

fn pod(name: &str, uid: &str) -> Pod {
    Pod {
        namespace: NAMESPACE.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The failover in one mode: the old sandbox's DEL after its pod moved to node-b. Whether it
/// got past the guard (chained: it answered 0; delegate: the primary had it), and the answer.
fn failover_del(api: &Api, keys: &Keys, delegate: Option<&RecordingPrimary>) -> (bool, String) {
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let wrap = |call: Cni| keys.in_mode(call, delegate);
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let old = container_id();
    // The old sandbox's netns with its eth0, as the runtime and primary left it.
    let (add, sandbox) = store.add(&old, &pod(&name, &uid_1)).in_pod_netns();
    wrap(add).run().assert_ok();
    api.force_delete(&name);
    let uid_2 = api.pod_on(&name, "node-b");
    let reply = wrap(store.del(&old, &pod(&name, &uid_1)).netns(&sandbox.path())).run();
    let passed = match delegate {
        Some(primary) => primary.dels(&old) > 0,
        None => reply.succeeded(),
    };
    if passed {
        api.force_delete(&name);
        return (true, "passed".into());
    }
    // Held, in either mode: the old sandbox's interface is taken out of its netns at once.
    assert!(
        !sandbox.netns.try_exec(&["ip", "link", "show", "eth0"]),
        "the old sandbox kept its eth0 while its DEL was held: {}",
        reply.stdout
    );
    let answer = match delegate {
        // Deferred: answered with success, kept for the primary with the API's pod it waits
        // for, and forgotten as the pod's owner.
        Some(primary) => {
            reply.assert_ok();
            let rows = store.dump();
            let entry = rows
                .iter()
                .find(|row| row["status"] == "deferred" && row["containerId"] == old.as_str())
                .unwrap_or_else(|| panic!("no deferred DEL of the old sandbox: {rows:#?}"));
            assert!(
                !store.is_owner(&old, "eth0"),
                "the old sandbox still owns the pod"
            );
            // The dump says what it waits for: the API's pod, not a sandbox here.
            let said = entry.to_string();
            assert!(
                said.contains(&uid_2) && said.contains("API server") && said.contains("node-b"),
                "{said}"
            );
            // The runtime's repeat is answered the same way, and reaches no primary either.
            wrap(store.del(&old, &pod(&name, &uid_1))).run().assert_ok();
            assert_eq!(primary.dels(&old), 0);
            // Scaled to zero: the API has no pod of the name, and the next verb on the node
            // starts the sweep that replays it.
            api.force_delete(&name);
            let other = container_id();
            wrap(store.add(&other, &Pod::new(NAMESPACE, "sweep-0")))
                .run()
                .assert_ok();
            assert!(store.wait_for_replays(Duration::from_secs(60)));
            assert_eq!(
                primary.dels(&old),
                1,
                "the DEL reaches the primary once the name is free"
            );
            format!("deferred: {entry}")
        }
        None => {
            let err = reply.assert_error(11);
            assert!(
                err.msg.contains(&uid_2) && err.msg.contains("node-b") && err.msg.contains(&uid_1),
                "the refusal names the API's pod and node: {}",
                err.text()
            );
            // Scaled to zero: the API has no pod of the name, and the DEL passes.
            api.force_delete(&name);
            wrap(store.del(&old, &pod(&name, &uid_1))).run().assert_ok();
            err.msg
        }
    };
    (false, answer)
}

/// A copy of `kubeconfig` in `dir` that a test may turn off, the keys naming it, and the same
/// keys naming no kubeconfig (a config cached from before the view).
fn own_kubeconfig(dir: &sys::TempDir, kubeconfig: &Path) -> (PathBuf, Keys, Keys) {
    let own = dir.path.join("kubeconfig");
    fs::copy(kubeconfig, &own).unwrap();
    fs::set_permissions(&own, fs::Permissions::from_mode(0o600)).unwrap();
    let on = Keys {
        kubeconfig: Some(own.clone()),
        scope: "cluster",
        stale_del: "refuse",
    };
    let none = Keys {
        kubeconfig: None,
        ..on.clone()
    };
    (own, on, none)
}

/// Chained mode, a DEL rule 7 refused (db's pod moved to node-b), retried as kubelet retries
/// it. With the API server stopped (SIGSTOP) the retry is refused again, within the ask's
/// bound, rather than let through by the local rule; so it is by a config naming no
/// kubeconfig while the file is there (an ADD's config, cached from before the view). Once
/// the file holds the installer's off sign the local rule decides, and the DEL passes.
fn chained_held_while_the_api_is_stopped(api: &Api, kubeconfig: &Path) {
    let dir = sys::TempDir::new("sg-api-chained");
    let (own, on, cached) = own_kubeconfig(&dir, kubeconfig);
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let old = container_id();
    let (add, sandbox) = store.add(&old, &pod(&name, &uid_1)).in_pod_netns();
    on.on(add).run().assert_ok();
    api.force_delete(&name);
    let uid_2 = api.pod_on(&name, "node-b");
    let del = |keys: &Keys| {
        keys.on(store.del(&old, &pod(&name, &uid_1)).netns(&sandbox.path()))
            .run()
    };
    let first = del(&on).assert_error(11);
    assert!(first.msg.contains(&uid_2), "{}", first.text());
    // The doctor does not take the interface rule 7 took out for a lost one, and `--restore`
    // will not give it back.
    let ctl = |args: &[&str]| {
        let out = Command::new(cni::ctl())
            .args(args)
            .args(["--state-dir", store.state_dir.to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let doctor: Value = serde_json::from_str(&ctl(&[
        "--doctor",
        "--output",
        "json",
        "--conf-dir",
        dir.path.to_str().unwrap(),
        "--runtime-socket",
        "none",
    ]))
    .unwrap();
    let findings = doctor["findings"].as_array().cloned().unwrap_or_default();
    let of = |check: &str, severity: &str| {
        findings
            .iter()
            .filter(|f| f["check"] == check && f["severity"] == severity)
            .map(Value::to_string)
            .collect::<Vec<_>>()
    };
    assert!(of("sandbox-interfaces", "error").is_empty(), "{doctor}");
    let held = of("held-by-api", "warning");
    assert!(
        held.len() == 1 && held[0].contains(&old) && held[0].contains("apiServerView"),
        "{doctor}"
    );
    let restore = ctl(&["--restore", "--dry-run", "--all"]);
    assert!(restore.contains("held"), "{restore}");
    // The record keeps the hold, and the dump says so.
    let row = store
        .dump()
        .into_iter()
        .find(|row| row["containerId"] == old.as_str())
        .expect("the refused sandbox's record");
    let reason = row["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("its DEL is refused") && reason.contains(&uid_2),
        "{row}"
    );

    api.signal_apiserver("STOP");
    let stopped = del(&on);
    api.signal_apiserver("CONT");
    let err = stopped.assert_error(11);
    assert!(
        err.msg.contains("first held") && err.msg.contains(&uid_2),
        "the retry with the API server stopped was not refused as held: {}",
        err.text()
    );
    // The way out is named: the file and the sign to write there.
    assert!(
        err.details.contains(own.to_str().unwrap()) && err.details.contains("apiServerView"),
        "{}",
        err.text()
    );
    let said = fs::read_to_string(&store.log_file).unwrap();
    assert!(
        said.contains("could not be asked, so the DELs of pod"),
        "{said}"
    );
    let err = del(&cached).assert_error(11);
    assert!(err.msg.contains("first held"), "{}", err.text());

    fs::write(&own, sandbox_guard::state::held::VIEW_OFF).unwrap();
    del(&on).assert_ok();
    api.force_delete(&name);
}

/// Chained mode, a sandbox whose ADD named no pod UID (its record has none), refused by rule
/// 7 on a DEL that named one: its retry without a pod UID is held while the API server has
/// any pod of the name, and passes once it has none.
fn chained_held_without_a_pod_uid(api: &Api, kubeconfig: &Path) {
    let dir = sys::TempDir::new("sg-api-nouid");
    let (_, on, _) = own_kubeconfig(&dir, kubeconfig);
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let old = container_id();
    on.on(store.add(&old, &pod(&name, ""))).run().assert_ok();
    api.force_delete(&name);
    let uid_2 = api.pod_on(&name, "node-b");
    on.on(store.del(&old, &pod(&name, &uid_1)))
        .run()
        .assert_error(11);
    let retry = || on.on(store.del(&old, &pod(&name, ""))).run();
    let err = retry().assert_error(11);
    assert!(
        err.msg.contains("first held") && err.msg.contains(&uid_2),
        "{}",
        err.text()
    );
    // Its netns path names no namespace (as after the runtime removed it): the doctor lists
    // the hold and does not advise deleting the record, which would drop it.
    let findings = store.doctor_findings(&[]);
    let of = |check: &str| {
        findings
            .iter()
            .filter(|f| f["check"] == check && f["severity"] == "warning")
            .map(Value::to_string)
            .collect::<Vec<_>>()
    };
    let held = of("held-by-api");
    assert!(held.len() == 1 && held[0].contains(&old), "{findings:?}");
    assert!(of("sandbox-netns").is_empty(), "{findings:?}");
    api.force_delete(&name);
    retry().assert_ok();
}

/// Chained mode, two DELs of one sandbox at once (kubelet's retry while the runtime still runs
/// the first): one asks with a kubeconfig whose server takes the connection and never
/// answers, the other with one that answers that the name moved, and writes the hold while the
/// first still waits. The first, judged before the hold was there, finds it when it judges
/// again and asks as a hold: refused, never let through by its own unanswered ask.
fn chained_concurrent_dels_one_unanswered(api: &Api, kubeconfig: &Path) {
    let dir = sys::TempDir::new("sg-api-race");
    let (_, on, _) = own_kubeconfig(&dir, kubeconfig);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config: Value = serde_json::from_str(&fs::read_to_string(kubeconfig).unwrap()).unwrap();
    config["clusters"][0]["cluster"]["server"] =
        json!(format!("https://{}", silent.local_addr().unwrap()));
    let silent_path = dir.path.join("silent.kubeconfig");
    fs::write(&silent_path, config.to_string()).unwrap();
    fs::set_permissions(&silent_path, fs::Permissions::from_mode(0o600)).unwrap();
    let unanswered = Keys {
        kubeconfig: Some(silent_path),
        ..on.clone()
    };
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let old = container_id();
    on.on(store.add(&old, &pod(&name, &uid_1)))
        .run()
        .assert_ok();
    api.force_delete(&name);
    let uid_2 = api.pod_on(&name, "node-b");
    let del = |keys: &Keys| keys.on(store.del(&old, &pod(&name, &uid_1)));
    let waiting = del(&unanswered).spawn();
    // Well inside the first's ask (its bound is 1 s): it has judged, and waits for its answer.
    std::thread::sleep(Duration::from_millis(300));
    let answered = del(&on).run().assert_error(11);
    assert!(answered.msg.contains(&uid_2), "{}", answered.text());
    let raced = waiting.wait().assert_error(11);
    assert!(raced.msg.contains(&uid_2), "{}", raced.text());
    // It asked the silent server as a first DEL (only a DEL that found no hold asks with its
    // own file): the race was run, not a retry that came after the hold.
    let said = fs::read_to_string(&store.log_file).unwrap();
    let unanswered_first = format!(
        "so the local rule alone decides: GET https://{}/",
        silent.local_addr().unwrap()
    );
    assert!(said.contains(&unanswered_first), "{said}");
    api.force_delete(&name);
}

/// Delegate mode, a DEL held by rule 7 (db's pod moved to node-b) and the sweeps of what
/// follows. A config without a `kubeconfig` while the file is there (the config of an ADD
/// from before the view was on, which CRI-O and multus hand to the DEL) keeps it held; so does
/// the file gone while the config names it (between two writes), and the file gone with such
/// a cached config (the operator moved the file and deleted the old one). Only the sign the
/// installer leaves when it turns the view off lets the local rule decide, and the DEL
/// reaches the primary.
fn held_until_the_view_is_turned_off(api: &Api, kubeconfig: &Path, primary: &RecordingPrimary) {
    let dir = sys::TempDir::new("sg-api-off");
    let (own, on, off) = own_kubeconfig(&dir, kubeconfig);
    let (name, old, store) = held_on_node_b(api, &on, primary);
    let sweep = |keys: &Keys, pod_name: &str| sweep_with(&store, keys, primary, pod_name);
    sweep(&on, "sweep-held");
    assert_eq!(
        primary.dels(&old),
        0,
        "held while node-b's pod has the name"
    );
    sweep(&off, "sweep-cached");
    assert_eq!(
        primary.dels(&old),
        0,
        "a config without a kubeconfig while the file is there (an ADD's, cached from before the view): still held"
    );
    fs::remove_file(&own).unwrap();
    sweep(&on, "sweep-gone");
    assert_eq!(
        primary.dels(&old),
        0,
        "a kubeconfig that is not there says nothing of the name: still held"
    );
    sweep(&off, "sweep-moved");
    assert_eq!(
        primary.dels(&old),
        0,
        "the file gone (moved by the operator) and a config naming none (cached from before the view): still held"
    );
    fs::write(&own, sandbox_guard::state::held::VIEW_OFF).unwrap();
    sweep(&on, "sweep-off");
    assert_eq!(
        primary.dels(&old),
        1,
        "the installer's turn-off sign in the file: the local rule replays the DEL at the next sweep"
    );
    let said = fs::read_to_string(&store.log_file).unwrap();
    assert!(
        said.contains("says the API server's view is turned off"),
        "{said}"
    );
    api.force_delete(&name);
}

/// Delegate mode, a DEL held with a kubeconfig whose token then dies (a pod-bound token whose
/// pod is gone) while the network names one that answers: the sweep falls back to that one,
/// so the DEL stays held while node-b's pod lives and reaches the primary once the API has
/// no pod of the name.
fn held_with_a_dead_token(api: &Api, kubeconfig: &Path, primary: &RecordingPrimary) {
    let dir = sys::TempDir::new("sg-api-dead");
    let (held_with, network) = two_kubeconfigs(&dir, kubeconfig);
    let dead = held_with.kubeconfig.clone().unwrap();
    let (name, old, store) = held_on_node_b(api, &held_with, primary);
    let mut config: Value = serde_json::from_slice(&fs::read(&dead).unwrap()).unwrap();
    for user in config["users"].as_array_mut().unwrap() {
        user["user"]["token"] = json!("a-token-the-api-server-refuses");
    }
    fs::write(&dead, config.to_string()).unwrap();
    sweep_with(&store, &network, primary, "sweep-dead");
    assert_eq!(
        primary.dels(&old),
        0,
        "held while node-b's pod has the name"
    );
    // The doctor names the held entry whose kubeconfig the API server refuses.
    let out = cni::guard(&[
        "--doctor",
        "--output",
        "json",
        "--conf-dir",
        dir.path.to_str().unwrap(),
        "--state-dir",
        store.state_dir.to_str().unwrap(),
    ]);
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = body["findings"].as_array().unwrap().iter().any(|f| {
        f["check"] == "store-deferred"
            && f["evidence"].as_array().is_some_and(|lines| {
                lines.iter().any(|line| {
                    line.as_str().is_some_and(|line| {
                        line.contains(&name)
                            && line.contains(dead.to_str().unwrap())
                            && line.contains("cannot be asked")
                    })
                })
            })
    });
    assert!(listed, "the doctor did not list the held DEL: {body:#}");
    api.force_delete(&name);
    sweep_with(&store, &network, primary, "sweep-fallback");
    assert_eq!(
        primary.dels(&old),
        1,
        "the held-with kubeconfig refused, the network's answers that no pod has the name: replayed"
    );
}

/// Delegate mode, a DEL held with a kubeconfig that then holds the off sign while the network
/// names another that answers (the operator moved the view to a kubeconfig of their own): the
/// sign must not release it while the network's kubeconfig says the name is node-b's pod's.
fn held_with_a_turned_off_file_while_the_network_names_another(
    api: &Api,
    kubeconfig: &Path,
    primary: &RecordingPrimary,
) {
    let dir = sys::TempDir::new("sg-api-offother");
    let (held_with, network) = two_kubeconfigs(&dir, kubeconfig);
    let first = held_with.kubeconfig.clone().unwrap();
    let (name, old, store) = held_on_node_b(api, &held_with, primary);
    fs::write(&first, sandbox_guard::state::held::VIEW_OFF).unwrap();
    sweep_with(&store, &network, primary, "sweep-offother");
    assert_eq!(
        primary.dels(&old),
        0,
        "the off sign released the DEL while the network's kubeconfig shows node-b's pod"
    );
    api.force_delete(&name);
    sweep_with(&store, &network, primary, "sweep-offother-free");
    assert_eq!(
        primary.dels(&old),
        1,
        "the network's kubeconfig shows no pod of the name: replayed"
    );
}

/// Delegate mode, a DEL held with a kubeconfig that then goes while the network names another
/// (the operator moved it, say from a ConfigMap's file to the installer's): the sweep asks
/// with the one the network names, so the DEL stays held while node-b's pod lives and
/// reaches the primary once the API has no pod of the name.
fn held_asks_with_the_networks_kubeconfig(
    api: &Api,
    kubeconfig: &Path,
    primary: &RecordingPrimary,
) {
    let dir = sys::TempDir::new("sg-api-moved");
    let (held_with, moved) = two_kubeconfigs(&dir, kubeconfig);
    let first = held_with.kubeconfig.clone().unwrap();
    let (name, old, store) = held_on_node_b(api, &held_with, primary);
    fs::remove_file(&first).unwrap();
    sweep_with(&store, &moved, primary, "sweep-moved");
    assert_eq!(
        primary.dels(&old),
        0,
        "held while node-b's pod has the name"
    );
    api.force_delete(&name);
    sweep_with(&store, &moved, primary, "sweep-free");
    assert_eq!(
        primary.dels(&old),
        1,
        "the API, asked with the network's kubeconfig, has no pod of the name: replayed"
    );
}

/// Delegate mode, one pod name's two DELs held with two kubeconfigs: s1's (the older) with
/// the first, s2's with the second; then the installer's off sign written over the first, and a
/// sweep by a network that names no kubeconfig. The second still shows the name on node-b's
/// pod, so neither DEL may go; once the API has no pod of the name, both do.
fn held_with_two_kubeconfigs_one_turned_off(
    api: &Api,
    kubeconfig: &Path,
    primary: &RecordingPrimary,
) {
    let dir = sys::TempDir::new("sg-api-two");
    let (first, second) = two_kubeconfigs(&dir, kubeconfig);
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let (s1, s2) = (container_id(), container_id());
    for (sandbox, keys) in [(&s1, &first), (&s2, &second)] {
        let uid = api.pod_on(&name, THIS_NODE);
        keys.in_mode(store.add(sandbox, &pod(&name, &uid)), Some(primary))
            .run()
            .assert_ok();
        api.force_delete(&name);
        api.pod_on(&name, "node-b");
        keys.in_mode(store.del(sandbox, &pod(&name, &uid)), Some(primary))
            .run()
            .assert_ok();
        assert!(store.wait_for_replays(Duration::from_secs(60)));
        api.force_delete(&name);
    }
    api.pod_on(&name, "node-b");
    assert_eq!(
        (primary.dels(&s1), primary.dels(&s2)),
        (0, 0),
        "the DELs of db's sandboxes were not both held"
    );
    fs::write(
        first.kubeconfig.as_ref().unwrap(),
        r#"{"apiServerView": "off"}"#,
    )
    .unwrap();
    let none = Keys {
        kubeconfig: None,
        ..second.clone()
    };
    sweep_with(&store, &none, primary, "sweep-two-a");
    assert_eq!(
        (primary.dels(&s1), primary.dels(&s2)),
        (0, 0),
        "the off sign over one kubeconfig released the name's DELs while the other shows node-b's pod"
    );
    api.force_delete(&name);
    sweep_with(&store, &none, primary, "sweep-two-b");
    assert_eq!(
        (primary.dels(&s1), primary.dels(&s2)),
        (1, 1),
        "the API has no pod of the name: both replayed"
    );
}

/// Two copies of the plugin's kubeconfig in `dir`, each private to root: the keys a DEL is
/// held with (`first`), and those of the network that sweeps later (`second`).
fn two_kubeconfigs(dir: &sys::TempDir, kubeconfig: &Path) -> (Keys, Keys) {
    let (first, second) = (dir.path.join("first"), dir.path.join("second"));
    for file in [&first, &second] {
        fs::copy(kubeconfig, file).unwrap();
        fs::set_permissions(file, fs::Permissions::from_mode(0o600)).unwrap();
    }
    let held_with = Keys {
        kubeconfig: Some(first),
        scope: "cluster",
        stale_del: "refuse",
    };
    let later = Keys {
        kubeconfig: Some(second),
        ..held_with.clone()
    };
    (held_with, later)
}

/// A delegate-mode DEL held by rule 7: db's pod on this node, force deleted and re-created on
/// node-b, then its old sandbox's DEL. Answers the pod's name, the old sandbox and the store.
fn held_on_node_b(api: &Api, keys: &Keys, primary: &RecordingPrimary) -> (String, String, Store) {
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let old = container_id();
    keys.in_mode(store.add(&old, &pod(&name, &uid_1)), Some(primary))
        .run()
        .assert_ok();
    api.force_delete(&name);
    api.pod_on(&name, "node-b");
    keys.in_mode(store.del(&old, &pod(&name, &uid_1)), Some(primary))
        .run()
        .assert_ok();
    // The hold's own sweep, done before the caller changes what it asks with.
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!(
        primary.dels(&old),
        0,
        "the DEL of db's old sandbox was not held"
    );
    (name, old, store)
}

/// An ADD of another pod with `keys`, whose replay sweep reaches the held DELs; waits for it.
fn sweep_with(store: &Store, keys: &Keys, primary: &RecordingPrimary, pod_name: &str) {
    keys.in_mode(
        store.add(&container_id(), &Pod::new(NAMESPACE, pod_name)),
        Some(primary),
    )
    .run()
    .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
}

/// `sweep_with` under `boot`.
fn sweep_in_boot(
    boot: &boot::Boot,
    store: &Store,
    keys: &Keys,
    primary: &RecordingPrimary,
    pod_name: &str,
) {
    boot.cni(keys.in_mode(
        store.add(&container_id(), &Pod::new(NAMESPACE, pod_name)),
        Some(primary),
    ))
    .run()
    .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
}

/// Delegate mode, a stale DEL already waiting when the owner's DEL is held: sandbox s1 of
/// db's first pod, s2 of its second (s1's DEL deferred, s2 owns the name here), then the pod
/// moves to node-b and s2's DEL comes. Neither DEL may reach the primary while node-b's pod
/// lives; both do once it is gone.
fn held_with_an_older_deferral(api: &Api, keys: &Keys, primary: &RecordingPrimary) {
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let wrap = |call: Cni| keys.in_mode(call, Some(primary));
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let (s1, s2) = (container_id(), container_id());
    wrap(store.add(&s1, &pod(&name, &uid_1))).run().assert_ok();
    api.force_delete(&name);
    let uid_2 = api.pod_on(&name, THIS_NODE);
    wrap(store.add(&s2, &pod(&name, &uid_2))).run().assert_ok();
    wrap(store.del(&s1, &pod(&name, &uid_1))).run().assert_ok();
    api.force_delete(&name);
    api.pod_on(&name, "node-b");
    wrap(store.del(&s2, &pod(&name, &uid_2))).run().assert_ok();
    // The hold's own sweep, and one more started by another pod's ADD.
    wrap(store.add(&container_id(), &Pod::new(NAMESPACE, "sweep-1")))
        .run()
        .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!(
        (primary.dels(&s1), primary.dels(&s2)),
        (0, 0),
        "a DEL of the name reached the primary while node-b's pod lives"
    );
    api.force_delete(&name);
    wrap(store.add(&container_id(), &Pod::new(NAMESPACE, "sweep-2")))
        .run()
        .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!((primary.dels(&s1), primary.dels(&s2)), (1, 1));
}

/// Delegate mode, a DEL held while node-b's pod has the name, on a node where no other pod
/// comes or goes afterwards: the runtime's STATUS (containerd 2.0.1+, CRI-O 1.32+, for a
/// network at cniVersion 1.1.0) sweeps it to the primary once the API has no pod of the name,
/// at most once a minute (kubelet asks every 5 s; each sweep asks the API server).
fn held_replayed_at_status(api: &Api, keys: &Keys, primary: &RecordingPrimary) {
    let (name, old, store) = held_on_node_b(api, keys, primary);
    let status = || {
        keys.in_mode(store.cni("STATUS", ""), Some(primary))
            .run()
            .assert_ok();
        assert!(store.wait_for_replays(Duration::from_secs(60)));
    };
    // The last sweep's stamp, set back as if a minute had gone by.
    let a_minute_on = || {
        fs::File::options()
            .write(true)
            .open(store.state_dir.join("sweep.lock"))
            .unwrap()
            .set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
            .unwrap();
    };
    a_minute_on();
    status();
    assert_eq!(
        primary.dels(&old),
        0,
        "held while node-b's pod has the name"
    );
    api.force_delete(&name);
    status();
    assert_eq!(
        primary.dels(&old),
        0,
        "a STATUS within a minute of the last sweep started another"
    );
    a_minute_on();
    status();
    assert_eq!(
        primary.dels(&old),
        1,
        "the name free in the API: the runtime's STATUS did not sweep the held DEL to the primary"
    );
}

/// Delegate mode, a stale DEL deferred (db's pod's sandbox made again here), then the node
/// down: its pod force deleted and made again on node-b, the node rebooted (its owners here
/// end with the boot; no DEL of the newer sandbox comes). The first sweep of the new boot finds
/// the name free here; it must not replay the old DEL while node-b's pod has the name, and
/// does once the API has none.
fn deferred_waits_after_a_reboot_while_the_pod_lives_elsewhere(
    api: &Api,
    keys: &Keys,
    primary: &RecordingPrimary,
) {
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let (before, after) = (boot::Boot::new(1), boot::Boot::new(2));
    let in_boot = |boot: &boot::Boot, call: Cni| boot.cni(keys.in_mode(call, Some(primary)));
    let uid_1 = api.pod_on(&name, THIS_NODE);
    let (s1, s2) = (container_id(), container_id());
    in_boot(&before, store.add(&s1, &pod(&name, &uid_1)))
        .run()
        .assert_ok();
    in_boot(&before, store.add(&s2, &pod(&name, &uid_1)))
        .run()
        .assert_ok();
    in_boot(&before, store.del(&s1, &pod(&name, &uid_1)))
        .run()
        .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!(primary.dels(&s1), 0, "s1's stale DEL was not deferred");
    api.force_delete(&name);
    api.pod_on(&name, "node-b");
    let sweep = |pod_name: &str| sweep_in_boot(&after, &store, keys, primary, pod_name);
    // The first sweep by another network on the node, whose primary has the same type.
    in_boot(
        &after,
        store
            .add(&container_id(), &Pod::new(NAMESPACE, "sweep-reboot-0"))
            .config("name", Some(json!("other-net"))),
    )
    .run()
    .assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!(
        primary.dels(&s1),
        0,
        "another network's sweep after the reboot replayed the old DEL while node-b's pod has the name"
    );
    sweep("sweep-reboot-1");
    assert_eq!(
        primary.dels(&s1),
        0,
        "the first sweep after the reboot replayed the old DEL while node-b's pod has the name"
    );
    // No answer (the API server stopped, as while kube-proxy's rules are not back yet): it
    // still waits, and says so.
    api.signal_apiserver("STOP");
    sweep("sweep-reboot-stopped");
    api.signal_apiserver("CONT");
    assert_eq!(
        primary.dels(&s1),
        0,
        "a sweep whose ask got no answer replayed the old DEL while node-b's pod has the name"
    );
    let said = fs::read_to_string(&store.log_file).unwrap();
    assert!(
        said.contains("its deferred DELs wait for a later sweep"),
        "{said}"
    );
    api.force_delete(&name);
    sweep("sweep-reboot-2");
    assert_eq!(
        primary.dels(&s1),
        1,
        "the name free in the API: the old DEL was not replayed"
    );
}

/// Delegate mode under `podKeyScope: "cluster"`, the API server stopped: the owner's DEL of a
/// name whose older sandbox's DEL is deferred goes by the local rule once its own ask got no
/// answer, and the deferred DEL waits for an answer (`replay_waits`). While the runtime waits
/// for that DEL, no other process asks the API server for it: a second ask would add its bound
/// to the DEL's answer for the outcome the first already gave. The deferred DEL is replayed
/// once the API answers.
fn owners_del_unanswered_asks_once(api: &Api, keys: &Keys, primary: &RecordingPrimary) {
    let name = format!("db-{}", &container_id()[..6]);
    let store = Store::new();
    let wrap = |call: Cni| keys.in_mode(call, Some(primary));
    let uid = api.pod_on(&name, THIS_NODE);
    let (s1, s2) = (container_id(), container_id());
    wrap(store.add(&s1, &pod(&name, &uid))).run().assert_ok();
    wrap(store.add(&s2, &pod(&name, &uid))).run().assert_ok();
    wrap(store.del(&s1, &pod(&name, &uid))).run().assert_ok();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    assert_eq!(primary.dels(&s1), 0, "s1's stale DEL was not deferred");
    let before = fs::read_to_string(&store.log_file).unwrap().lines().count();
    api.signal_apiserver("STOP");
    let started = Instant::now();
    wrap(store.del(&s2, &pod(&name, &uid))).run().assert_ok();
    let took = started.elapsed();
    // What the DEL's process and the processes it started logged by the time it answered;
    // a sweep it started and did not wait for asks later.
    let said_by_then = fs::read_to_string(&store.log_file).unwrap();
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    api.signal_apiserver("CONT");
    let asks: Vec<&str> = said_by_then
        .lines()
        .skip(before)
        .filter(|line| line.contains("outcome=api-unanswered"))
        .collect();
    println!(
        "   the owner's DEL with the API server stopped and a deferred DEL: {} ms, {} unanswered asks by then",
        took.as_millis(),
        asks.len()
    );
    assert_eq!(
        asks.len(),
        1,
        "the API server was asked again while the runtime waited for the owner's DEL: {asks:#?}"
    );
    assert_eq!(
        primary.dels(&s2),
        1,
        "the owner's DEL did not reach the primary"
    );
    assert_eq!(
        primary.dels(&s1),
        0,
        "the deferred DEL was replayed with no answer from the API server"
    );
    sweep_with(&store, keys, primary, &format!("{name}-sweep"));
    assert_eq!(
        primary.dels(&s1),
        1,
        "the deferred DEL was not replayed once the API server answered"
    );
}

/// Delegate mode: the node rebooted while its pod was made again on node-b, and the API
/// server does not answer when kubelet stops the old sandbox (a DEL with an empty netns; the
/// Service address not reachable yet). Under `podKeyScope: "cluster"` (`keys`) the DEL is
/// answered with success and kept: the primary gets it neither then nor at a sweep while the
/// API is silent or shows node-b's pod, and does once the name is free in the API; its retry
/// stays kept. Under `podKeyScope: "node"` (`node_keys`), and in audit mode (`audit_keys`), the
/// local rule decides it as before: it reaches the primary at once.
fn an_old_boots_del_unanswered_waits(
    api: &Api,
    keys: &Keys,
    node_keys: &Keys,
    audit_keys: &Keys,
    primary: &RecordingPrimary,
) {
    for (label, scope_keys, kept) in [
        ("podKeyScope cluster", keys, true),
        ("podKeyScope node", node_keys, false),
        ("audit mode", audit_keys, false),
    ] {
        let name = format!("db-{}", &container_id()[..6]);
        let store = Store::new();
        let (before, after) = (boot::Boot::new(3), boot::Boot::new(4));
        let in_boot =
            |boot: &boot::Boot, call: Cni| boot.cni(scope_keys.in_mode(call, Some(primary)));
        let uid_1 = api.pod_on(&name, THIS_NODE);
        let old = container_id();
        in_boot(&before, store.add(&old, &pod(&name, &uid_1)))
            .run()
            .assert_ok();
        api.force_delete(&name);
        api.pod_on(&name, "node-b");
        api.signal_apiserver("STOP");
        let del = in_boot(&after, store.del(&old, &pod(&name, &uid_1)).netns("")).run();
        // The sweep it started asks too; done before the API answers again.
        assert!(store.wait_for_replays(Duration::from_secs(60)));
        api.signal_apiserver("CONT");
        del.assert_ok();
        let said = fs::read_to_string(&store.log_file).unwrap();
        if !kept {
            assert_eq!(
                primary.dels(&old),
                1,
                "{label}: the old boot's DEL did not go by the local rule: {said}"
            );
            continue;
        }
        assert_eq!(
            primary.dels(&old),
            0,
            "the old boot's DEL reached the primary while the API server was silent and node-b's pod had the name"
        );
        assert!(said.contains("is of the boot before this one"), "{said}");
        // kubelet's retry (and the GC's): kept too, without asking.
        in_boot(&after, store.del(&old, &pod(&name, &uid_1)).netns(""))
            .run()
            .assert_ok();
        assert!(store.wait_for_replays(Duration::from_secs(60)));
        assert_eq!(primary.dels(&old), 0, "the retry reached the primary");
        let rows = after.dump(&store.state_dir);
        assert!(
            rows.iter().any(|row| row["containerId"] == old.as_str()
                && row["reason"]
                    .as_str()
                    .is_some_and(|why| why.contains("of a sandbox of the boot before"))),
            "the dump does not say why the old boot's DEL waits: {rows:#?}"
        );
        let sweep = |pod_name: &str| sweep_in_boot(&after, &store, scope_keys, primary, pod_name);
        sweep(&format!("{name}-sweep-1"));
        assert_eq!(
            primary.dels(&old),
            0,
            "a sweep replayed the old boot's DEL while node-b's pod has the name"
        );
        api.force_delete(&name);
        sweep(&format!("{name}-sweep-2"));
        assert_eq!(
            primary.dels(&old),
            1,
            "the name free in the API: the old boot's DEL was not replayed"
        );
    }
}

/// Delegate mode under `podKeyScope: "cluster"`: after a reboot with the API server stopped,
/// the old sandboxes of two pods are kept as holds. A sweep while it is still stopped asks for
/// the first key it reaches and waits its bound, and keeps the second without asking again:
/// each further key would wait the bound for the same outcome, holding its pod's lock.
fn held_keys_ask_once_per_sweep_while_unanswered(
    api: &Api,
    keys: &Keys,
    primary: &RecordingPrimary,
) {
    let store = Store::new();
    let (before, after) = (boot::Boot::new(5), boot::Boot::new(6));
    let in_boot = |boot: &boot::Boot, call: Cni| boot.cni(keys.in_mode(call, Some(primary)));
    let mut olds = Vec::new();
    for _ in 0..2 {
        let name = format!("db-{}", &container_id()[..6]);
        let uid = api.pod_on(&name, THIS_NODE);
        let old = container_id();
        in_boot(&before, store.add(&old, &pod(&name, &uid)))
            .run()
            .assert_ok();
        api.force_delete(&name);
        api.pod_on(&name, "node-b");
        olds.push((old, name, uid));
    }
    api.signal_apiserver("STOP");
    for (old, name, uid) in &olds {
        in_boot(&after, store.del(old, &pod(name, uid)).netns(""))
            .run()
            .assert_ok();
    }
    assert!(store.wait_for_replays(Duration::from_secs(60)));
    let before_sweep = fs::read_to_string(&store.log_file).unwrap().lines().count();
    sweep_in_boot(&after, &store, keys, primary, "sweep-stopped");
    api.signal_apiserver("CONT");
    let said = fs::read_to_string(&store.log_file).unwrap();
    let held: Vec<&str> = said
        .lines()
        .skip(before_sweep)
        .filter(|line| line.contains("held for it stay held"))
        .collect();
    assert_eq!(held.len(), 2, "{held:#?}");
    assert_eq!(
        held.iter()
            .filter(|line| line.contains("no answer earlier in this sweep"))
            .count(),
        1,
        "the sweep asked again for the second held key: {held:#?}"
    );
    for (old, _, _) in &olds {
        assert_eq!(primary.dels(old), 0, "{old}'s kept DEL reached the primary");
    }
}

/// A late ADD: the pod force deleted while its sandbox was made, after the new pod's ADD
/// here. Whether the late ADD took the name (it answered 0 and owns the pod).
fn late_add(api: &Api, keys: &Keys, delegate: Option<&RecordingPrimary>) -> bool {
    let name = format!("web-{}", &container_id()[..6]);
    let store = Store::new();
    let wrap = |call: Cni| keys.in_mode(call, delegate);
    let uid_3 = api.pod_on(&name, THIS_NODE);
    api.force_delete(&name);
    let uid_4 = api.pod_on(&name, THIS_NODE);
    let (late, new) = (container_id(), container_id());
    wrap(store.add(&new, &pod(&name, &uid_4))).run().assert_ok();
    let reply = wrap(store.add(&late, &pod(&name, &uid_3))).run();
    let took = reply.succeeded() && store.is_owner(&late, "eth0");
    if !reply.succeeded() {
        let err = reply.assert_error(104);
        assert!(err.msg.contains(&uid_3), "{}", err.text());
        assert!(store.is_owner(&new, "eth0"), "the new pod keeps its name");
        if let Some(primary) = delegate {
            assert!(
                !primary
                    .started()
                    .iter()
                    .any(|(verb, c)| verb == "ADD" && *c == late),
                "the late ADD never reaches the primary"
            );
        }
    }
    api.force_delete(&name);
    took
}

/// A late ADD on a node without the name: the pod force deleted while its sandbox was made
/// here, and made again on node-b. Whether the late ADD went through (answered 0).
fn late_add_elsewhere(api: &Api, keys: &Keys, delegate: Option<&RecordingPrimary>) -> bool {
    let name = format!("web-{}", &container_id()[..6]);
    let store = Store::new();
    let uid_1 = api.pod_on(&name, THIS_NODE);
    api.force_delete(&name);
    api.pod_on(&name, "node-b");
    let late = container_id();
    let reply = keys
        .in_mode(store.add(&late, &pod(&name, &uid_1)), delegate)
        .run();
    if !reply.succeeded() {
        let err = reply.assert_error(104);
        assert!(err.msg.contains(&uid_1), "{}", err.text());
    }
    if let Some(primary) = delegate {
        let at_primary = primary
            .started()
            .iter()
            .any(|(verb, c)| verb == "ADD" && *c == late);
        assert_eq!(
            at_primary,
            reply.succeeded(),
            "the late ADD reaches the primary exactly when it goes through"
        );
    }
    api.force_delete(&name);
    reply.succeeded()
}

#[test]
fn the_api_servers_pod_decides_a_del_or_add_the_store_cannot() {
    sys::skip_unless_root!(&["openssl", "curl"]);
    let api = Api::up();
    let dir = sys::TempDir::new("sg-api");
    api.kubectl_ok(&["create", "namespace", NAMESPACE], None);
    api.kubectl_ok(
        &["create", "serviceaccount", "-n", NAMESPACE, "default"],
        None,
    );
    let kubeconfig = api.plugin_kubeconfig(&dir.path);

    // The role allows get on pods and nothing else, and the token is what the plugin reads.
    let ctl = cni::ctl();
    let as_plugin = |args: &[&str]| {
        Command::new(api.var("PATH_KUBECTL"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        String::from_utf8_lossy(&as_plugin(&["auth", "can-i", "get", "pods", "-A"]).stdout)
            .starts_with("yes")
    );
    for verb in ["list", "watch", "delete", "update"] {
        assert!(
            String::from_utf8_lossy(&as_plugin(&["auth", "can-i", verb, "pods", "-A"]).stdout)
                .starts_with("no"),
            "the plugin's role allows {verb} on pods"
        );
    }
    let missing = sys::run(
        ctl,
        &[
            "--get-pod",
            &format!("{NAMESPACE}/none-0"),
            kubeconfig.to_str().unwrap(),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&missing.stdout).trim(),
        r#"{"found":false}"#
    );

    let unguarded = Keys {
        kubeconfig: None,
        scope: "cluster",
        stale_del: "refuse",
    };
    let audit = Keys {
        kubeconfig: Some(kubeconfig.clone()),
        scope: "cluster",
        stale_del: "audit",
    };
    let cluster = Keys {
        kubeconfig: Some(kubeconfig.clone()),
        scope: "cluster",
        stale_del: "refuse",
    };
    let node = Keys {
        kubeconfig: Some(kubeconfig.clone()),
        scope: "node",
        stale_del: "refuse",
    };

    let mut report = Vec::new();
    for (label, keys, primary) in [
        ("no kubeconfig, chained", &unguarded, None),
        (
            "no kubeconfig, delegate",
            &unguarded,
            Some(RecordingPrimary::new()),
        ),
        ("audit mode (control), chained", &audit, None),
        ("podKeyScope cluster, chained", &cluster, None),
        (
            "podKeyScope cluster, delegate",
            &cluster,
            Some(RecordingPrimary::new()),
        ),
        ("podKeyScope node, chained", &node, None),
    ] {
        let (passed, answer) = failover_del(&api, keys, primary.as_ref());
        report.push(format!(
            "failover DEL, {label}: {}",
            match (passed, primary.is_some()) {
                (true, _) => "reached the primary",
                (false, false) => "refused (code 11)",
                (false, true) => "deferred, then replayed once the name was free",
            }
        ));
        let harm_expected =
            keys.kubeconfig.is_none() || keys.stale_del == "audit" || keys.scope == "node";
        assert_eq!(passed, harm_expected, "{label}: {answer}");
    }
    chained_held_while_the_api_is_stopped(&api, &kubeconfig);
    chained_held_without_a_pod_uid(&api, &kubeconfig);
    chained_concurrent_dels_one_unanswered(&api, &kubeconfig);
    report.push("chained, a DEL refused by rule 7 and retried: refused again with the API server stopped (SIGSTOP) and with a config naming no kubeconfig while the file was there; passed once the file held the installer's off sign; a retry without a pod UID held while the API had a pod of the name, passed once it had none; of two DELs at once, the one whose ask got no answer refused once the other's answer held the name".into());
    held_with_an_older_deferral(&api, &cluster, &RecordingPrimary::new());
    report.push("delegate, a stale DEL waiting when the owner's DEL is held: neither replayed while node-b's pod lived, both after".into());
    held_until_the_view_is_turned_off(&api, &kubeconfig, &RecordingPrimary::new());
    report.push("delegate, a held DEL: still held by a config without a kubeconfig while the file is there, by the file gone while the config names it, and by the file gone with a config naming none; replayed by the local rule once the file holds the installer's turn-off sign".into());
    held_with_a_dead_token(&api, &kubeconfig, &RecordingPrimary::new());
    held_with_a_turned_off_file_while_the_network_names_another(
        &api,
        &kubeconfig,
        &RecordingPrimary::new(),
    );
    report.push("delegate, a held DEL whose kubeconfig holds the off sign while the network names one that answers: asked with that one, held while node-b's pod lived, replayed after".into());
    report.push("delegate, a held DEL whose kubeconfig's token the API server refuses while the network names one that answers: asked with that one, held while node-b's pod lived, replayed after".into());
    held_asks_with_the_networks_kubeconfig(&api, &kubeconfig, &RecordingPrimary::new());
    report.push("delegate, a held DEL whose kubeconfig went while the network names another: asked with that one, held while node-b's pod lived, replayed after".into());
    held_replayed_at_status(&api, &cluster, &RecordingPrimary::new());
    report.push("delegate, a held DEL on a node where no other verb came: held at the runtime's STATUS while node-b's pod lived; after, no sweep at a STATUS within a minute of the last, replayed at the next".into());
    deferred_waits_after_a_reboot_while_the_pod_lives_elsewhere(
        &api,
        &cluster,
        &RecordingPrimary::new(),
    );
    report.push("delegate, a stale DEL deferred, then the node rebooted while its pod moved to node-b: not replayed by the new boot's sweeps while node-b's pod lived, nor by one whose ask the stopped API server left unanswered; replayed after".into());
    an_old_boots_del_unanswered_waits(&api, &cluster, &node, &audit, &RecordingPrimary::new());
    report.push("delegate, the node rebooted while its pod moved to node-b, the old sandbox's DEL with the API server stopped: podKeyScope cluster, kept (success), its retry kept, replayed only once the name was free in the API; podKeyScope node and audit mode, the local rule passed it at once".into());
    held_keys_ask_once_per_sweep_while_unanswered(&api, &cluster, &RecordingPrimary::new());
    report.push("delegate, two old sandboxes' DELs kept after a reboot, a sweep with the API server stopped: one ask, the second key kept without asking again".into());
    owners_del_unanswered_asks_once(&api, &cluster, &RecordingPrimary::new());
    report.push("delegate, the owner's DEL of a name whose older sandbox's DEL waits, the API server stopped: passed by the local rule after its one ask, nobody else asked before it answered, the deferred DEL replayed once the API answered".into());
    held_with_two_kubeconfigs_one_turned_off(&api, &kubeconfig, &RecordingPrimary::new());
    report.push("delegate, one name's two DELs held with two kubeconfigs, the older's then holding the off sign, swept by a network naming none: both held while the other showed node-b's pod, both replayed after".into());
    for (label, keys, primary) in [
        ("no kubeconfig, chained", &unguarded, None),
        ("audit mode (control), chained", &audit, None),
        ("podKeyScope cluster, chained", &cluster, None),
        (
            "podKeyScope cluster, delegate",
            &cluster,
            Some(RecordingPrimary::new()),
        ),
    ] {
        let took = late_add(&api, keys, primary.as_ref());
        report.push(format!(
            "late ADD, {label}: {}",
            if took { "took the name" } else { "refused" }
        ));
        assert_eq!(
            took,
            keys.kubeconfig.is_none() || keys.stale_del == "audit",
            "{label}"
        );
    }
    // On a node without the name, only delegate mode asks (before its primary runs), and only
    // for a primary keyed across the cluster.
    for (label, keys, primary) in [
        (
            "no kubeconfig, delegate",
            &unguarded,
            Some(RecordingPrimary::new()),
        ),
        (
            "audit mode (control), delegate",
            &audit,
            Some(RecordingPrimary::new()),
        ),
        (
            "podKeyScope node, delegate",
            &node,
            Some(RecordingPrimary::new()),
        ),
        ("podKeyScope cluster, chained", &cluster, None),
        (
            "podKeyScope cluster, delegate",
            &cluster,
            Some(RecordingPrimary::new()),
        ),
    ] {
        let went = late_add_elsewhere(&api, keys, primary.as_ref());
        report.push(format!(
            "late ADD on a node without the name, its pod made again on node-b, {label}: {}",
            if went {
                "went through"
            } else {
                "refused before the primary ran"
            }
        ));
        let refusing = keys.kubeconfig.is_some()
            && keys.stale_del == "refuse"
            && keys.scope == "cluster"
            && primary.is_some();
        assert_eq!(went, !refusing, "{label}");
    }

    installers_kubeconfig(&api, &mut report);

    // The doctor asks as the plugin does: the ServiceAccount's kubeconfig answers; one whose
    // token the API refuses is an error, saying what the plugin then does.
    let refused = dir.path.join("refused.kubeconfig");
    let mut bad: Value = serde_json::from_slice(&fs::read(&kubeconfig).unwrap()).unwrap();
    bad["users"][0]["user"]["token"] = json!("not-a-token");
    fs::write(&refused, bad.to_string()).unwrap();
    fs::set_permissions(&refused, fs::Permissions::from_mode(0o600)).unwrap();
    for (file, severity) in [(&kubeconfig, "ok"), (&refused, "error")] {
        let conf = sys::TempDir::new("sg-api-conf");
        let entry = json!({"cniVersion": "1.0.0", "name": "api-check", "plugins": [
            {"type": "bridge"},
            {"type": "sandbox-guard", "kubeconfig": file.to_str().unwrap(), "podKeyScope": "cluster"},
        ]});
        fs::write(conf.path.join("10-api.conflist"), entry.to_string()).unwrap();
        let out = cni::guard(&[
            "--doctor",
            "--output",
            "json",
            "--conf-dir",
            conf.path.to_str().unwrap(),
        ]);
        let body: Value = serde_json::from_slice(&out.stdout).unwrap();
        let found: Vec<&Value> = body["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] == "api-server")
            .collect();
        assert_eq!(found.len(), 1, "{body:#}");
        assert_eq!(found[0]["severity"], severity, "{:#}", found[0]);
        report.push(format!(
            "doctor api-server with {}: {}",
            file.file_name().unwrap().to_string_lossy(),
            found[0]["summary"]
        ));
    }

    // The API server stopped (no answer) and then gone (refused): the local rule alone, within
    // the bound, and said.
    for (signal, how) in [("STOP", "stopped"), ("KILL", "killed")] {
        let name = format!("db-{}", &container_id()[..6]);
        let uid = if signal == "STOP" {
            api.pod_on(&name, THIS_NODE)
        } else {
            "u-gone".to_string()
        };
        api.signal_apiserver(signal);
        let store = Store::new();
        let sandbox = container_id();
        cluster
            .on(store.add(&sandbox, &pod(&name, &uid)))
            .run()
            .assert_ok();
        // An ADD of the name for another pod UID asks (rule 8), and so does the DEL of the
        // sandbox that then owns the name (rule 7).
        let (newer, newer_uid) = (container_id(), "u-newer");
        let started = Instant::now();
        cluster
            .on(store.add(&newer, &pod(&name, newer_uid)))
            .run()
            .assert_ok();
        let add_took = started.elapsed();
        let started = Instant::now();
        cluster
            .on(store.del(&newer, &pod(&name, newer_uid)))
            .run()
            .assert_ok();
        let took = started.elapsed();
        report.push(format!(
            "ADD and DEL with the API server {how}: passed in {} ms and {} ms",
            add_took.as_millis(),
            took.as_millis()
        ));
        // The bound is 1 s; the rest is room for a loaded machine, not a speed target.
        assert!(
            add_took < Duration::from_secs(5),
            "the ADD waited {add_took:?}"
        );
        assert!(took < Duration::from_secs(5), "the DEL waited {took:?}");
        let said = fs::read_to_string(&store.log_file).unwrap();
        assert_eq!(
            said.matches("outcome=api-unanswered").count(),
            2,
            "the ADD and the DEL each said that the local rule decided alone: {said}"
        );
        if signal == "STOP" {
            api.signal_apiserver("CONT");
        }
    }
    println!("{}", report.join("\n"));
}
