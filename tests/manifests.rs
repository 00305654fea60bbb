//! The DaemonSet manifests (conf-examples/kubernetes): they pass the Kubernetes schemas
//! (`kubernetes-validate --strict`, from PyPI: scripts/test.sh installs it in
//! target/python), and they ask for no more than the installer needs: SELinux's container
//! type that may write host dirs, the runtime's seccomp profile, no service-account token,
//! an image a node can pull by digest, and host paths that a node without them does not
//! turn into a failing pod. The platform presets (conf-examples/platforms, kustomize overlays)
//! are rendered with `kubectl kustomize` and run against a node laid out as that platform.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/conf-examples/kubernetes");
/// The oldest Kubernetes the manifests are for: the schemas of later ones only add fields.
const KUBERNETES: &str = "1.27.0";
/// kubectl as the real node builds it (scripts/node.sh build, which scripts/test.sh runs first):
/// Debian 12 packages no kubectl.
const KUBECTL: &str = "/var/cache/sg-node/bin/kubernetes-1.37.2/kubectl";

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [MANIFESTS.to_string(), format!("{MANIFESTS}/uninstall")]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "yaml")
                && !path.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    files
}

/// `kubernetes-validate` where scripts/test.sh puts it, else on PATH; None (a skip, or a
/// failure under CI) without it.
fn kubernetes_validate(test: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/python/bin/kubernetes-validate");
    if venv.is_file() {
        return Some(venv);
    }
    sys::require(test, false, &["kubernetes-validate"])
        .then(|| PathBuf::from("kubernetes-validate"))
}

/// The interpreter kubernetes-validate runs with: it has PyYAML, which the package needs.
fn python_of(tool: &Path) -> PathBuf {
    let found = if tool.is_absolute() {
        Some(tool.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(tool))
                .find(|p| p.is_file())
        })
    };
    let shebang = found
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| {
            let first = text.lines().next()?.strip_prefix("#!")?.trim().to_string();
            Path::new(&first)
                .is_absolute()
                .then(|| PathBuf::from(first))
        });
    shebang.unwrap_or_else(|| PathBuf::from("python3"))
}

/// Every document of `file`, as JSON.
fn documents(python: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(python)
        .args(["-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let Some(tool) = kubernetes_validate(sys::test_name!()) else {
        return;
    };
    for file in manifests() {
        let out = Command::new(&tool)
            .args(["--strict", "--no-warn", "-k", KUBERNETES])
            .arg(&file)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.contains("passed"),
            "{}:\n{said}",
            file.display()
        );
    }
}

#[test]
fn the_daemonsets_ask_for_no_more_than_the_installer_needs() {
    let Some(tool) = kubernetes_validate(sys::test_name!()) else {
        return;
    };
    let python = python_of(&tool);
    for file in manifests() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let daemonsets: Vec<Value> = documents(&python, &file)
            .into_iter()
            .filter(|doc| doc["kind"] == "DaemonSet")
            .collect();
        assert_eq!(daemonsets.len(), 1, "{name}");
        let pod = &daemonsets[0]["spec"]["template"]["spec"];
        assert_eq!(
            pod["automountServiceAccountToken"],
            Value::Bool(false),
            "{name}: the installer never calls the API server"
        );
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        let host_paths: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|volume| volume.get("hostPath").is_some())
            .map(|volume| {
                // A node without one of these dirs (no CNI yet, a platform keeping its
                // plugins elsewhere) must not keep the pod from starting.
                assert_eq!(
                    volume["hostPath"]["type"], "DirectoryOrCreate",
                    "{name}: {volume}"
                );
                volume["name"].as_str().unwrap()
            })
            .collect();
        let mut guard_images = 0;
        for container in containers(pod) {
            let mounts_host = container["volumeMounts"].as_array().is_some_and(|mounts| {
                mounts
                    .iter()
                    .any(|m| host_paths.contains(&m["name"].as_str().unwrap_or("")))
            });
            if !mounts_host {
                continue;
            }
            let security = &container["securityContext"];
            // Enforcing SELinux nodes label the CNI dirs for the host only: container_t may
            // not write them, spc_t may.
            assert_eq!(
                security["seLinuxOptions"]["type"], "spc_t",
                "{name}: {container}"
            );
            assert_eq!(
                security["allowPrivilegeEscalation"],
                Value::Bool(false),
                "{name}: {container}"
            );
            assert_eq!(
                security["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{name}: {container}"
            );
            let image = container["image"].as_str().unwrap();
            guard_images += 1;
            // A name a registry serves: a digest-pinned reference or one with a registry host
            // (scripts/image.sh --push prints the pinned one). `localhost/` exists only on a
            // node the archive was loaded onto by hand.
            let host = image.split('/').next().unwrap();
            assert!(
                image.contains("@sha256:")
                    || (image.contains('/')
                        && host != "localhost"
                        && (host.contains('.') || host.contains(':'))),
                "{name}: image {image} is not a reference a registry can serve"
            );
        }
        assert!(guard_images > 0, "{name}");
    }
}

/// A pod spec's init containers and containers.
fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    [
        pod["initContainers"].as_array(),
        pod["containers"].as_array(),
    ]
    .into_iter()
    .flatten()
    .flatten()
}

/// Each platform preset (conf-examples/platforms/<name>, `kubectl apply -k`) as kustomize
/// renders it, and a node of that platform: (preset, the host's conf dir, its bin dir, its
/// runtime's socket, dirs only that platform has).
const PLATFORMS: [(&str, &str, &str, &str, &[&str]); 3] = [
    (
        "gke",
        "etc/cni/net.d",
        "home/kubernetes/bin",
        "run/containerd/containerd.sock",
        &[],
    ),
    // k3s points data/current at the running release with an absolute link, which does
    // not resolve inside the pod: the installer takes the newest data/<hash>/bin there.
    (
        "k3s",
        "var/lib/rancher/k3s/agent/etc/cni/net.d",
        "var/lib/rancher/k3s/data/2d1d8d2b/bin",
        "run/k3s/containerd/containerd.sock",
        &["var/lib/rancher/k3s/data/current"],
    ),
    (
        "openshift",
        "etc/kubernetes/cni/net.d",
        "var/lib/cni/bin",
        "var/run/crio/crio.sock",
        &[],
    ),
];

fn rendered(preset: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("conf-examples/platforms")
        .join(preset);
    let out = Command::new(KUBECTL)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The one DaemonSet of a rendered preset, after it passed the schemas.
fn validated_daemonset(tool: &Path, work: &Path, preset: &str) -> Value {
    let file = work.join(format!("{}.yaml", preset.replace('/', "-")));
    std::fs::write(&file, rendered(preset)).unwrap();
    let out = Command::new(tool)
        .args(["--strict", "--no-warn", "-k", KUBERNETES])
        .arg(&file)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.contains("passed"),
        "{preset}:\n{said}"
    );
    documents(&python_of(tool), &file)
        .into_iter()
        .find(|doc| doc["kind"] == "DaemonSet")
        .unwrap()
}

/// The pod's view of `node` at `root`: each hostPath mount of `container`, as kubelet makes
/// it (DirectoryOrCreate creates a missing dir on the node); returns what to put for /host.
fn pod_view(daemonset: &Value, container: &Value, node: &Path, root: &Path) -> String {
    let pod = &daemonset["spec"]["template"]["spec"];
    // Outer mounts first, as the runtime makes them (OpenShift's bin dir lies inside
    // /var/lib/cni).
    let mut mounts: Vec<&Value> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    mounts.sort_by_key(|m| m["mountPath"].as_str().unwrap().len());
    for mount in mounts {
        let volume = volume_of(pod, mount);
        let Some(on_host) = volume["hostPath"]["path"].as_str() else {
            continue;
        };
        let on_host = node.join(on_host.trim_start_matches('/'));
        std::fs::create_dir_all(&on_host).unwrap();
        let at = root.join(mount["mountPath"].as_str().unwrap().trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        // Inside an outer mount that already shows the node's dir there: the same view.
        if at.canonicalize().ok() != Some(on_host.canonicalize().unwrap()) {
            std::os::unix::fs::symlink(&on_host, &at).unwrap();
        }
    }
    root.join("host").display().to_string()
}

fn guard_with(args: &[String]) -> std::process::Output {
    cni::guard(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn each_platform_preset_passes_the_schemas_and_installs_ready_on_its_platform() {
    let test = sys::test_name!();
    let Some(tool) = kubernetes_validate(test) else {
        return;
    };
    if !sys::require(test, false, &[KUBECTL]) {
        return;
    }
    for (platform, conf, bin, socket, extra) in PLATFORMS {
        let work = sys::TempDir::new("sgpf");
        let daemonset = validated_daemonset(&tool, &work.path, platform);
        let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
        // The node: the platform's own dirs and nothing of the others'.
        let node = work.path.join("node");
        std::fs::create_dir_all(node.join(conf)).unwrap();
        install::copy_fixture("install/calico/conf", &node.join(conf));
        install::stub_plugins(&node.join(conf), &node.join(bin));
        for dir in extra {
            std::os::unix::fs::symlink(Path::new("/").join(bin).parent().unwrap(), node.join(dir))
                .unwrap();
        }
        let host = pod_view(&daemonset, container, &node, &work.path.join("pod"));
        // The runtime's socket on the node, held by a runtime that never answers: the probe
        // reaches it through the pod's mount, gives up within its bound and reads the files.
        std::fs::create_dir_all(node.join(socket).parent().unwrap()).unwrap();
        let _runtime = std::os::unix::net::UnixListener::bind(node.join(socket)).unwrap();
        let asked = format!("{host}/{socket}: ");
        let pod_root = |arg: String| arg.replace("=/host", &format!("={host}"));
        let args: Vec<String> = strings(&container["args"])
            .into_iter()
            .filter(|a| a != "--watch")
            .map(pod_root)
            .collect();
        let probe: Vec<String> = strings(&container["readinessProbe"]["exec"]["command"])
            .into_iter()
            .skip(1)
            .map(pod_root)
            .collect();
        assert_eq!(
            guard_with(&probe).status.code(),
            Some(1),
            "{platform}: ready before the install"
        );
        let out = guard_with(&args);
        assert!(
            out.status.success(),
            "{platform}: {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ready = guard_with(&probe);
        let said = String::from_utf8_lossy(&ready.stdout);
        assert!(ready.status.success(), "{platform}: {probe:?}: {said}");
        assert!(
            said.contains(&asked) && said.contains("no answer within"),
            "{platform}: the probe did not reach the runtime's socket through the pod's mounts: {said}"
        );
        // Where the runtime of that platform looks: the guard in its conf dir, its binary
        // in its bin dir.
        let conflist = node.join(conf).join("10-calico.conflist");
        let binary = node.join(bin).join("sandbox-guard");
        assert!(binary.is_file(), "{platform}: no binary in {bin}");
        assert!(
            std::fs::read_to_string(&conflist)
                .unwrap()
                .contains("\"sandbox-guard\""),
            "{platform}"
        );

        // The platform's uninstall preset takes it out of those same dirs.
        let preset = format!("{platform}/uninstall");
        let daemonset = validated_daemonset(&tool, &work.path, &preset);
        let container = &daemonset["spec"]["template"]["spec"]["initContainers"][0];
        let host = pod_view(
            &daemonset,
            container,
            &node,
            &work.path.join("uninstall-pod"),
        );
        let args: Vec<String> = strings(&container["args"])
            .into_iter()
            .map(|a| a.replace("=/host", &format!("={host}")))
            .collect();
        let out = guard_with(&args);
        assert!(
            out.status.success(),
            "{preset}: {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!binary.exists(), "{preset}: the binary is left in {bin}");
        assert!(
            !std::fs::read_to_string(&conflist)
                .unwrap()
                .contains("sandbox-guard"),
            "{preset}: the guard is left in {conf}"
        );
    }
}

/// The options the base DaemonSet documents in comments, to uncomment (`# - --opt=PATH`).
fn documented_options() -> Vec<String> {
    std::fs::read_to_string(format!("{MANIFESTS}/sandbox-guard.yaml"))
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("# - --"))
        .map(|option| format!("--{option}"))
        .collect()
}

#[test]
fn the_daemonsets_mount_what_their_documented_options_write() {
    // Catches a commented --metrics-file naming a path under no mount, so that uncommenting it as
    // docs/install.md says makes every write fail on the read-only root.
    let test = sys::test_name!();
    let Some(tool) = kubernetes_validate(test) else {
        return;
    };
    if !sys::require(test, false, &[KUBECTL]) {
        return;
    }
    let written: Vec<String> = documented_options()
        .into_iter()
        .filter_map(|o| o.strip_prefix("--metrics-file=").map(str::to_string))
        .collect();
    assert!(!written.is_empty(), "{:?}", documented_options());
    let work = sys::TempDir::new("sgmounts");
    for (preset, ..) in PLATFORMS {
        let daemonset = validated_daemonset(&tool, &work.path, preset);
        let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
        for path in &written {
            let dir = Path::new(path).parent().unwrap();
            let mount = container["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| dir.starts_with(m["mountPath"].as_str().unwrap()));
            assert!(
                mount.is_some_and(|m| m["readOnly"] != true),
                "{preset}: --metrics-file={path} is under no writable mount: {mount:?}"
            );
        }
    }
}

#[test]
fn no_host_mount_asks_for_mount_propagation() {
    // Fails with the runtime socket mounted `mountPropagation: HostToContainer`: kubelet then
    // asks the runtime for a slave mount of that host dir, and containerd refuses to create
    // the container where the host mount holding it is not shared or slave ("is mounted on
    // / but it is not a shared or slave mount", as on a node whose / is private). The pod
    // would never start there, so the guard would never install on that node. No mount of
    // the installer needs the host's later mounts: it reads files and a socket.
    // The YAML is read by kubernetes-validate's own interpreter, which has PyYAML (Debian's
    // python3 has it only where another package brought python3-yaml).
    let Some(tool) = kubernetes_validate(sys::test_name!()) else {
        return;
    };
    sys::skip_unless_tools!(&[KUBECTL]);
    let python = python_of(&tool);
    let work = sys::TempDir::new("sgprop");
    let mut sources: Vec<(String, PathBuf)> = manifests()
        .into_iter()
        .map(|file| (file.display().to_string(), file))
        .collect();
    for (preset, ..) in PLATFORMS {
        for preset in [preset.to_string(), format!("{preset}/uninstall")] {
            let file = work.path.join(format!("{}.yaml", preset.replace('/', "-")));
            std::fs::write(&file, rendered(&preset)).unwrap();
            sources.push((preset, file));
        }
    }
    let mut mounts_seen = 0;
    for (name, file) in sources {
        for doc in documents(&python, &file) {
            let pod = &doc["spec"]["template"]["spec"];
            for mount in
                containers(pod).flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten())
            {
                mounts_seen += 1;
                assert!(
                    matches!(mount.get("mountPropagation"), None | Some(Value::Null))
                        || mount["mountPropagation"] == "None",
                    "{name}: {mount}"
                );
            }
        }
    }
    assert!(mounts_seen > 0);
}

/// The pod's volume a container's mount names.
fn volume_of<'a>(pod: &'a Value, mount: &Value) -> &'a Value {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume for the mount {mount}"))
}

#[test]
fn the_documented_api_credentials_are_a_projected_token_whose_role_only_gets_pods() {
    // Uncommenting --api-credentials as the manifest says must give the installer a token and
    // the cluster's CA there, of a ServiceAccount bound to a role that may get pods and do
    // nothing else (docs/api-server-check.md).
    let Some(tool) = kubernetes_validate(sys::test_name!()) else {
        return;
    };
    let file = PathBuf::from(format!("{MANIFESTS}/sandbox-guard.yaml"));
    let docs = documents(&python_of(&tool), &file);
    let of_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let dir: String = documented_options()
        .iter()
        .find_map(|o| o.strip_prefix("--api-credentials=").map(str::to_string))
        .expect("the manifest documents --api-credentials");
    let pod = &of_kind("DaemonSet")[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir.as_str())
        .unwrap_or_else(|| panic!("no mount at --api-credentials={dir}"));
    let volume = volume_of(pod, mount);
    let sources = volume["projected"]["sources"].as_array().unwrap();
    let paths: Vec<&str> = sources
        .iter()
        .flat_map(|s| {
            let token = s["serviceAccountToken"]["path"].as_str();
            let ca = s["configMap"]["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|_| s["configMap"]["name"] == "kube-root-ca.crt")
                .filter_map(|i| i["path"].as_str());
            token.into_iter().chain(ca)
        })
        .collect();
    assert_eq!(paths, ["token", "ca.crt"], "{volume}");
    let account = pod["serviceAccountName"]
        .as_str()
        .expect("a ServiceAccount");
    let bindings = of_kind("ClusterRoleBinding");
    let binding = bindings
        .iter()
        .find(|b| {
            b["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account)
        })
        .expect("a binding of the ServiceAccount");
    let roles = of_kind("ClusterRole");
    let role = roles
        .iter()
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .expect("the bound role");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        "{role}"
    );
    assert_eq!(of_kind("RoleBinding").len(), 0);
}
