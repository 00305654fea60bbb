//! The calico-cni v1 model's trace (tests/cri/calico-cni-v1-model-plugin), which the real-node
//! test counts as harm: a DEL's line "removes endpoint of Y" must name only a sandbox whose
//! ADD came after the DEL's own (or any, when the DEL's sandbox never ADDed), and every exit
//! must answer on stdout. The model runs in a network namespace of its own as its host, so no
//! link of the machine's is touched. Needs root.

#[path = "support/sys.rs"]
mod sys;

use std::io::Write;
use std::process::{Command, Output, Stdio};

const TOOLS: &[&str] = &["ip", "flock", "nsenter", "sha1sum"];

struct Model {
    host: sys::Netns,
    state: sys::TempDir,
    pod: String,
    subnet: &'static str,
    /// The config's `ipamDir` key, whole, when the model is given one.
    ipam_dir: String,
}

impl Model {
    fn new() -> Model {
        Model {
            host: sys::Netns::new("mdh"),
            state: sys::TempDir::new("model"),
            pod: sys::unique("web"),
            subnet: "100.64.98.0/24",
            ipam_dir: String::new(),
        }
    }

    /// The model of one node of two whose IPAM is in `ipam` (calico's etcd), allocating from
    /// `subnet`, for the pod `pod`.
    fn on_node(ipam: &sys::TempDir, subnet: &'static str, pod: &str) -> Model {
        Model {
            subnet,
            ipam_dir: format!(r#""ipamDir":"{}","#, ipam.path.display()),
            pod: pod.to_string(),
            ..Model::new()
        }
    }

    fn call(&self, verb: &str, container: &str, netns: &str) -> Output {
        let config = format!(
            r#"{{"cniVersion":"1.0.0","name":"m","type":"calico-cni-v1-model","stateDir":"{}",{}"subnet":"{}","hostVethPrefix":"md","onMissingEndpoint":"ignore"}}"#,
            self.state.path.display(),
            self.ipam_dir,
            self.subnet
        );
        let plugin = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/cri/calico-cni-v1-model-plugin"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host.name, plugin])
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent")
            .env(
                "CNI_ARGS",
                format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={}", self.pod),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the model");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(config.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success() || String::from_utf8_lossy(&out.stdout).contains("\"code\""),
            "{verb} {container} exited {} without a CNI error on stdout; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs a call that must succeed.
    fn ok(&self, verb: &str, container: &str, netns: &str) {
        let out = self.call(verb, container, netns);
        assert!(
            out.status.success(),
            "{verb} {container}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// Runs an ADD into a netns that does not exist: it takes an address, then fails.
    fn failed_add(&self, container: &str) {
        let out = self.call("ADD", container, "/var/run/netns/none-such");
        assert!(
            !out.status.success(),
            "ADD {container} into no netns passed"
        );
    }

    fn trace(&self) -> String {
        std::fs::read_to_string(self.state.path.join("calls.log")).unwrap_or_default()
    }
}

/// The trace's lines naming another sandbox's loss: "DEL by X removes endpoint of Y", Y not X.
fn losses(trace: &str) -> Vec<&str> {
    trace
        .lines()
        .map(str::trim)
        .filter(|line| {
            line.strip_prefix("DEL by ")
                .and_then(|rest| rest.split_once(" removes endpoint of "))
                .is_some_and(|(by, of)| of.split(' ').next() != Some(by))
        })
        .collect()
}

#[test]
fn an_older_sandboxs_del_is_traced_as_the_newer_ones_loss() {
    sys::skip_unless_root!(TOOLS);
    let model = Model::new();
    let (a, b) = (sys::Netns::new("mda"), sys::Netns::new("mdb"));
    model.ok("ADD", "A", &a.path().display().to_string());
    model.ok("ADD", "B", &b.path().display().to_string());
    model.ok("DEL", "A", "");
    let trace = model.trace();
    assert!(
        losses(&trace)
            .iter()
            .any(|l| l.starts_with("DEL by A removes endpoint of B ")),
        "{trace}"
    );
}

#[test]
fn a_newer_sandboxs_del_after_its_failed_add_is_no_loss_of_the_older() {
    sys::skip_unless_root!(TOOLS);
    let model = Model::new();
    let a = sys::Netns::new("mda");
    model.ok("ADD", "A", &a.path().display().to_string());
    // B's ADD takes an address, then fails: the endpoint is still A's.
    model.failed_add("B");
    model.ok("DEL", "B", "");
    let trace = model.trace();
    assert_eq!(losses(&trace), Vec::<&str>::new(), "{trace}");
    assert!(
        trace.contains("DEL by B removes what its older sandbox A left"),
        "{trace}"
    );
}

#[test]
fn two_failed_adds_then_the_newer_ones_del_is_no_loss() {
    sys::skip_unless_root!(TOOLS);
    let model = Model::new();
    model.failed_add("A");
    model.failed_add("B");
    model.ok("DEL", "B", "");
    let trace = model.trace();
    assert_eq!(losses(&trace), Vec::<&str>::new(), "{trace}");
}

#[test]
fn an_add_cut_off_before_it_named_its_address_is_no_ones_loss_at_its_own_del() {
    sys::skip_unless_root!(TOOLS);
    let model = Model::new();
    let a = sys::Netns::new("mda");
    model.ok("ADD", "A", &a.path().display().to_string());
    model.ok("DEL", "A", &a.path().display().to_string());
    // What B's ADD leaves when the runtime kills it right after it took A's freed address:
    // the address held for the pod's handle, no container named for it.
    std::fs::write(
        model.state.path.join("ips/100.64.98.2"),
        format!("ns.{}", model.pod),
    )
    .unwrap();
    model.ok("DEL", "B", "");
    let trace = model.trace();
    assert!(trace.contains("DEL by B releases 100.64.98.2"), "{trace}");
    assert_eq!(losses(&trace), Vec::<&str>::new(), "{trace}");
}

#[test]
fn a_del_of_a_sandbox_never_added_is_the_owners_loss_and_a_second_one_succeeds() {
    sys::skip_unless_root!(TOOLS);
    let model = Model::new();
    let b = sys::Netns::new("mdb");
    model.ok("ADD", "B", &b.path().display().to_string());
    model.ok("DEL", "Z", "");
    // No endpoint left: containerd's second DEL of the sandbox.
    model.ok("DEL", "Z", "");
    let trace = model.trace();
    assert_eq!(
        losses(&trace),
        vec![format!(
            "DEL by Z removes endpoint of B (workload ns.{})",
            model.pod
        )],
        "{trace}"
    );
}

/// The addresses in `dir`'s address store (`ips/`), each with the handle that holds it.
fn addresses(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut held: Vec<(String, String)> = std::fs::read_dir(dir.join("ips"))
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let handle = std::fs::read_to_string(entry.path()).ok()?;
            Some((entry.file_name().to_string_lossy().into_owned(), handle))
        })
        .collect();
    held.sort();
    held
}

/// Two nodes whose models share one `ipamDir`, as calico 2.1's nodes share its etcd: the pod
/// re-created on node b under its name, node a's late DEL of the old sandbox frees the new
/// sandbox's address on node b (the handle `<namespace>.<pod>` is the cluster's) and is traced
/// as its loss, while node b's endpoint, kept per node, stays.
#[test]
fn with_a_shared_ipam_dir_a_del_on_one_node_frees_the_handles_address_on_the_other() {
    sys::skip_unless_root!(TOOLS);
    let ipam = sys::TempDir::new("ipam");
    let node_a = Model::on_node(&ipam, "100.64.98.0/24", &sys::unique("web"));
    let node_b = Model::on_node(&ipam, "100.64.99.0/24", &node_a.pod);
    let (a, b) = (sys::Netns::new("mda"), sys::Netns::new("mdb"));
    node_a.ok("ADD", "A", &a.path().display().to_string());
    node_b.ok("ADD", "B", &b.path().display().to_string());
    let handle = format!("ns.{}", node_a.pod);
    assert_eq!(
        addresses(&ipam.path),
        [
            ("100.64.98.2".to_string(), handle.clone()),
            ("100.64.99.2".to_string(), handle.clone())
        ],
        "each node's address, from its own subnet, held by the one handle in the shared dir"
    );
    assert!(addresses(&node_a.state.path).is_empty() && addresses(&node_b.state.path).is_empty());
    node_a.ok("DEL", "A", "");
    assert!(
        addresses(&ipam.path).is_empty(),
        "{:?}",
        addresses(&ipam.path)
    );
    let trace = node_a.trace();
    assert!(
        losses(&trace).iter().any(
            |l| l.starts_with("DEL by A removes endpoint of B (workload ")
                && l.ends_with("releases its address 100.64.99.2)")
        ),
        "{trace}"
    );
    assert!(
        node_b.state.path.join("endpoints").join(&handle).is_file(),
        "node a's DEL removed node b's endpoint"
    );
}
