//! Does this network need the guard? Its plugins matched against README's table "Do you need
//! it?", each row read in the primary's own source (docs/how-it-decides.md has the details):
//! a primary that acts on a pod's name when a DEL comes needs it, one that keys its DEL by
//! container ID does not, and one this table does not know is to be audited first. Of the
//! binaries only calico's is asked its version (`calico -v` prints its `git describe`, in
//! calico-cni v1.x `calico.go` main and in calico's `cni-plugin/pkg/plugin/plugin.go` Main);
//! the others' version ranges are named for the operator to check.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::plugin_exec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    Needed,
    NotNeeded,
    Unknown,
}

impl Need {
    pub fn name(self) -> &'static str {
        match self {
            Need::Needed => "needed",
            Need::NotNeeded => "not needed",
            Need::Unknown => "unknown",
        }
    }
}

/// The verdict on one network, with what it rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub need: Need,
    /// `delegate` or `chained`, where needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// The primary as identified: `calico v3.26.1 (kubernetes datastore)`.
    pub primary: String,
    /// What was read to identify it.
    pub read: Vec<String>,
    /// What its DEL acts on, or why it is not known.
    pub why: String,
    /// README's citation for the row.
    pub source: &'static str,
}

impl Verdict {
    /// Short, for a summary: `calico v3.26.1 (kubernetes datastore): NOT NEEDED`.
    pub fn line(&self) -> String {
        let need = self.need.name().to_uppercase();
        match self.mode {
            Some(mode) => format!("{}: {need}, {mode} mode", self.primary),
            None => format!("{}: {need}", self.primary),
        }
    }

    /// The why and the source, then what was read: for evidence lines.
    pub fn evidence(&self) -> Vec<String> {
        let mut lines = vec![
            format!("why: {}", self.why),
            format!("source: {}", self.source),
        ];
        lines.extend(self.read.iter().map(|r| format!("read: {r}")));
        lines
    }
}

const CALICO_NAME_KEYED: &str = "projectcalico/cni-plugin@v1.6.2 calico.go cmdDel, ipam/calico-ipam.go cmdDel; \
     cni-plugin@v1.7.0 k8s/k8s.go CmdDelK8s; calico#1117, libcalico#189, cni-plugin#385";
const CALICO_4710: &str =
    "calico#4710; fixed by libcalico-go#1472 (in cni-plugin v3.18.5, v3.19.2, v3.20.0)";
const CALICO_BY_ID: &str = "projectcalico/calico@87c1590 cni-plugin/pkg/k8s/k8s.go CmdDelK8s, \
     cni-plugin/internal/pkg/utils/utils.go GetHandleID, cni-plugin/pkg/ipamplugin/ipam_plugin.go cmdDel";
const CILIUM_BY_NAME: &str = "cilium#44463 (fixed by #44494), cilium#44530 (open); \
     aws-cni pkg/networkutils/names.go GeneratePodHostVethName, calico cni-plugin/pkg/k8s/k8s.go VethNameForWorkload";
const REFERENCE: &str = "containernetworking/plugins@v1.9.1 plugins/main/{bridge,macvlan,ipvlan,ptp} cmdDel, \
     plugins/ipam/host-local/backend/disk/backend.go ReleaseByID";
const AUDIT: &str = "README: Do you need it?";

/// Plugins that run after a primary and key what they undo by container ID or act inside
/// CNI_NETNS (portmap's chains, bandwidth's ifb, tuning's backup; aws's egress plugins'
/// SNAT chain and host-local), or are the guard itself.
const SAFE_CHAINED: [&str; 6] = [
    "portmap",
    "bandwidth",
    "tuning",
    "egress-cni",
    "egress-v4-cni",
    "sandbox-guard",
];
/// Main plugins of the reference set, which act only inside CNI_NETNS on a DEL.
const REFERENCE_MAIN: [&str; 4] = ["bridge", "macvlan", "ipvlan", "ptp"];
/// IPAM plugins whose DEL never frees what a live pod of the name holds: by container ID,
/// or skipped while a pod of the name lives. With why, and the source.
const SAFE_IPAM: [(&str, &str, &str); 3] = [
    (
        "host-local",
        "host-local releases by container ID",
        REFERENCE,
    ),
    (
        "whereabouts",
        "whereabouts releases by container ID",
        "k8snetworkplumbingwg/whereabouts pkg/allocate/allocate.go DeallocateIP",
    ),
    (
        "spiderpool",
        "spiderpool skips the release while a pod of the name lives",
        "spidernet-io/spiderpool@v1.2.2 pkg/ipam/release.go Release",
    ),
];
/// Primaries whose host veth is named from the pod: cilium chained after them tears down the
/// live pod's interface by that name.
const POD_NAMED_VETH: [&str; 2] = ["aws-cni", "calico"];

/// The index of the plugin delegate mode wraps in a chain of `types`: the one whose DEL acts
/// on the pod's name. That is the primary, except for cilium-cni chained after a primary with
/// pod-named host veths: libcni runs a chain's DELs last plugin first, so cilium-cni's DEL
/// would run before a guard wrapping the primary could decide.
pub fn delegate_target(types: &[&str]) -> usize {
    match types.iter().position(|t| *t == "cilium-cni") {
        Some(at) if at > 0 && POD_NAMED_VETH.contains(&types[0]) => at,
        _ => 0,
    }
}

/// The plugin the guard's entry in `network` wraps and the one delegate mode wraps there, when
/// the two differ and the other is not one that keys its DEL by container ID: that plugin's
/// DEL then runs unheld.
pub fn misplaced_wrapper(network: &Value) -> Option<(String, String)> {
    let plugins = chain(network);
    let types: Vec<&str> = plugins.iter().map(|p| plugin_type(p)).collect();
    // chain() keeps a wrapper's place: it puts the wrapped plugin there.
    let wrapped_at = listed(network)
        .iter()
        .filter(|p| !(plugin_type(p) == "sandbox-guard" && p.get("delegate").is_none()))
        .position(|p| plugin_type(p) == "sandbox-guard")?;
    let target = delegate_target(&types);
    if wrapped_at == target || SAFE_CHAINED.contains(&types[target]) {
        return None;
    }
    Some((types[wrapped_at].to_string(), types[target].to_string()))
}

/// The verdict on a network (a `.conflist`, or a single plugin's `.conf`), the guard's own
/// entry unwrapped; `bin_dirs` is where its binaries are looked for, and `resolve` follows
/// a path's links as the host does (the installer sees the host under `--host-root`).
pub fn judge(network: &Value, bin_dirs: &[PathBuf], resolve: &dyn Fn(&Path) -> PathBuf) -> Verdict {
    let plugins = chain(network);
    let types: Vec<&str> = plugins.iter().map(|p| plugin_type(p)).collect();
    let Some(primary) = plugins.first() else {
        return unknown(
            "no plugin".to_string(),
            Vec::new(),
            "the network lists no plugin",
        );
    };
    let mut read = vec![format!("plugins: {}", types.join(", "))];
    let target = delegate_target(&types);
    if target > 0 {
        // Chained, last, holds every plugin's DEL. Delegate mode wraps cilium-cni and holds
        // its DEL only; and its replay, once the name is free, can run after a new sandbox's
        // primary ADD (outside the guard's lock) made the veth of that name.
        let others: Vec<Value> = plugins
            .iter()
            .filter(|p| plugin_type(p) != "cilium-cni")
            .map(|p| (*p).clone())
            .collect();
        let alone = judge(&serde_json::json!({ "plugins": others }), bin_dirs, resolve);
        read.extend(alone.read.iter().skip(1).cloned());
        let mut why = format!(
            "the old endpoint's teardown finds the host veth by the name {} gives it from the pod: the live pod's; \
             delegate mode would wrap cilium-cni alone, and replay its DEL when the name frees, which can come after \
             a new sandbox's {} ADD made that veth",
            types[0], types[0]
        );
        if alone.need != Need::NotNeeded {
            why.push_str(&format!(
                "; and the rest of the chain ({}) is {}: {}",
                alone.primary,
                alone.need.name(),
                alone.why
            ));
        }
        return Verdict {
            need: Need::Needed,
            mode: Some("chained"),
            primary: format!("cilium-cni chained after {}", alone.primary),
            read,
            why,
            source: CILIUM_BY_NAME,
        };
    }
    if let Some(other) = types
        .iter()
        .skip(1)
        .find(|t| !SAFE_CHAINED.contains(t) && **t != "cilium-cni")
    {
        return unknown(
            types[0].to_string(),
            read,
            &format!(
                "plugin {other}, chained after the primary, is not in the table: what its DEL keys by is not known here"
            ),
        );
    }
    let ipam = primary
        .get("ipam")
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str);
    match types[0] {
        "calico" => calico(primary, ipam, bin_dirs, resolve, read),
        "cilium-cni" => not_needed(
            "cilium-cni",
            read,
            "its own veths (lxc + a hash of the container ID) and endpoints by container ID",
            "cilium plugins/cilium-cni/cmd/cmd.go Del",
        ),
        "aws-cni" => unknown(
            "aws-cni".to_string(),
            read,
            "ipamd releases by container ID (not needed), but with its network policy agent \
             (NETWORK_POLICY_ENFORCING_MODE set) a DEL asks the agent to delete the pod's policy by namespace \
             and name (cmd/routed-eni-cni-plugin/cni.go del, DeletePodNp), which is not audited here",
        ),
        "flannel" => flannel(primary, read),
        "kube-ovn" => not_needed(
            "kube-ovn",
            read,
            "OVS ports named by container ID; nothing done on an empty netns",
            "kubeovn/kube-ovn pkg/daemon/handler.go handleDel",
        ),
        "multus" | "multus-shim" => unknown(
            "multus".to_string(),
            read,
            "as safe as the delegates it runs: judge the cluster network it delegates to",
        ),
        "antrea" => {
            read.push("antrea's version is not read from its binary".to_string());
            unknown(
                "antrea".to_string(),
                read,
                "Antrea <= v0.7.1 finds the OVS port and host veth by pod name (needed, delegate mode; antrea#785), \
                 v0.7.2 and >= v0.8.0 by container ID (not needed): check the antrea-agent image's version",
            )
        }
        "terway" => {
            read.push("terway's version is not read from its binary".to_string());
            unknown(
                "terway".to_string(),
                read,
                "Terway v1.2.0-v1.4.0 releases IP resources by namespace/name (needed, delegate mode), >= v1.4.1 \
                 checks the container ID (not needed): check the terway image's version",
            )
        }
        main if REFERENCE_MAIN.contains(&main) => match ipam {
            Some(kind) => match SAFE_IPAM.iter().find(|(k, ..)| *k == kind) {
                Some((_, why, source)) => not_needed(
                    &format!("{main} with {kind}"),
                    read,
                    &format!("links only inside CNI_NETNS; {why}"),
                    source,
                ),
                None => unknown(
                    format!("{main} with {kind}"),
                    read,
                    &format!(
                        "the IPAM plugin {kind} is not in the table: what its DEL keys by is not known here"
                    ),
                ),
            },
            None => not_needed(main, read, "links only inside CNI_NETNS", REFERENCE),
        },
        other => unknown(
            other.to_string(),
            read,
            "not in the table: check what its DEL keys by (a pod's name: delegate mode), or run the guard with \
             staleDel audit first",
        ),
    }
}

/// The network's plugins in order, the guard unwrapped: a wrapping guard's `delegate` in
/// its place, a chained guard left out.
fn chain(network: &Value) -> Vec<&Value> {
    listed(network)
        .into_iter()
        .filter_map(|p| match (plugin_type(p), p.get("delegate")) {
            ("sandbox-guard", Some(delegate)) => Some(delegate),
            ("sandbox-guard", None) => None,
            _ => Some(p),
        })
        .collect()
}

/// A network's plugins as its file lists them: a `.conflist`'s `plugins`, or a `.conf`, which
/// is a plugin of its own.
pub fn listed(network: &Value) -> Vec<&Value> {
    match network.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![network],
    }
}

fn plugin_type(plugin: &Value) -> &str {
    plugin.get("type").and_then(Value::as_str).unwrap_or("")
}

/// calico by its own version and datastore: calico-cni <= v1.11.1 (calico <= 2.6.3) deletes
/// the workload endpoint by `namespace.pod` on the etcd datastore, whatever the IPAM; on the
/// Kubernetes datastore calico 2.x used host-local and could not delete endpoints. 3.16.0 to
/// 3.19.1 on the Kubernetes datastore blank the live pod's podIP annotations (calico#4710).
/// Everything else keys by container ID.
fn calico(
    conf: &Value,
    ipam: Option<&str>,
    bin_dirs: &[PathBuf],
    resolve: &dyn Fn(&Path) -> PathBuf,
    mut read: Vec<String>,
) -> Verdict {
    let named = conf.get("datastore_type").and_then(Value::as_str);
    let etcd_named = ["etcd_endpoints", "etcd_discovery_srv"].iter().any(|k| {
        conf.get(k)
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    });
    read.push(format!(
        "datastore_type {}, {}, ipam {}",
        named.unwrap_or("(none)"),
        if etcd_named {
            "etcd endpoints given"
        } else {
            "no etcd endpoints"
        },
        ipam.unwrap_or("(none)")
    ));
    let version = match plugin_exec::find("calico", bin_dirs, resolve) {
        None => Err(format!(
            "no calico binary in {}",
            bin_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        )),
        Some(path) => plugin_exec::run(&path, &["-v"], &[], b"").and_then(|(ok, out)| {
            let text = String::from_utf8_lossy(&out).trim().to_string();
            read.push(format!(
                "{} -v printed {:?}",
                path.display(),
                crate::names::shorten(&text)
            ));
            match (ok, release(&text)) {
                (true, Some(version)) => Ok(version),
                _ => Err(format!("{} -v gave no version", path.display())),
            }
        }),
    };
    let version = match version {
        Ok(version) => version,
        Err(why) => {
            read.push(why);
            return unknown(
                "calico".to_string(),
                read,
                "its version decides (calico-cni <= v1.11.1 on etcd, and calico 3.16.0-3.19.1 on the Kubernetes \
                 datastore, need delegate mode): run `calico -v` where the runtime finds it",
            );
        }
    };
    // Without datastore_type: calico 3.x takes the Kubernetes datastore where no etcd
    // endpoint is given (from 3.17, libcalico-go lib/apiconfig/load.go applyConfigDefaults;
    // 3.16 would need DATASTORE_TYPE from the runtime's environment, which the file does
    // not show), calico-cni v1.x etcd.
    let kdd = match named {
        Some(kind) => kind == "kubernetes",
        None => version >= (3, 0, 0) && !etcd_named,
    };
    let datastore = if kdd { "kubernetes" } else { "etcd" };
    // calico-cni's own numbers up to v2.x (v1.6.2 is calico 2.1.3, v2.0 calico 3.0).
    let name = if version < (3, 0, 0) {
        "calico-cni"
    } else {
        "calico"
    };
    let primary = format!(
        "{name} v{}.{}.{} ({datastore} datastore)",
        version.0, version.1, version.2
    );
    let by_4710 = (3, 16, 0) <= version
        && (version < (3, 18, 0)
            || (version.0 == 3 && version.1 == 18 && version.2 < 5)
            || (version.0 == 3 && version.1 == 19 && version.2 < 2));
    if named.is_none() && version.0 == 3 && version.1 == 16 && !etcd_named {
        return unknown(
            primary,
            read,
            "calico 3.16 without datastore_type or etcd endpoints runs on the datastore its environment names: \
             on the Kubernetes datastore it needs delegate mode (calico#4710); set datastore_type in the network",
        );
    }
    let needed = |why: &str, source| Verdict {
        need: Need::Needed,
        mode: Some("delegate"),
        primary: primary.clone(),
        read: read.clone(),
        why: why.to_string(),
        source,
    };
    if version < (1, 11, 2) && !kdd {
        return needed(
            "the workload endpoint by namespace.pod (its ActiveInstanceID check from v1.7.0 has holes), and with \
             calico-ipam the IPAM handle too",
            CALICO_NAME_KEYED,
        );
    }
    if version < (1, 11, 2) {
        return not_needed(
            &primary,
            read,
            "calico 2.x on the Kubernetes datastore used host-local, which releases by container ID, and could not \
             delete endpoints",
            REFERENCE,
        );
    }
    if kdd && by_4710 {
        return needed(
            "the old sandbox's DEL blanks the live pod's podIP annotations",
            CALICO_4710,
        );
    }
    not_needed(
        &primary,
        read,
        "IPAM handle <network>.<containerID>; the endpoint skipped when its container differs; links only inside \
         CNI_NETNS",
        CALICO_BY_ID,
    )
}

/// flannel keeps the delegate's config by container ID and runs its DEL (bridge with
/// host-local unless the config names another).
fn flannel(conf: &Value, read: Vec<String>) -> Verdict {
    let delegate = conf.get("delegate");
    let kind = delegate
        .and_then(|d| d.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("bridge");
    let ipam = delegate
        .and_then(|d| d.get("ipam"))
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("host-local");
    if kind == "bridge" && ipam == "host-local" {
        return not_needed(
            "flannel (bridge with host-local)",
            read,
            "flannel keeps its delegate's config by container ID; bridge acts inside CNI_NETNS, host-local releases by \
             container ID",
            "containernetworking/plugins@v0.9.1 plugins/meta/flannel/flannel_linux.go doCmdDel (consumeScratchNetConf)",
        );
    }
    unknown(
        format!("flannel ({kind} with {ipam})"),
        read,
        "flannel's delegate is not the default bridge with host-local: judge the delegate",
    )
}

/// `v3.26.1`, `v1.6.2-dirty`, `v3.18.5-12-gabcdef`: (major, minor, patch).
fn release(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().next()?;
    let mut parts = word
        .strip_prefix('v')
        .unwrap_or(word)
        .split(['.', '-', '+']);
    let mut number = || parts.next()?.parse::<u32>().ok();
    Some((number()?, number()?, number()?))
}

fn not_needed(primary: &str, read: Vec<String>, why: &str, source: &'static str) -> Verdict {
    Verdict {
        need: Need::NotNeeded,
        mode: None,
        primary: primary.to_string(),
        read,
        why: why.to_string(),
        source,
    }
}

fn unknown(primary: String, read: Vec<String>, why: &str) -> Verdict {
    Verdict {
        need: Need::Unknown,
        mode: None,
        primary,
        read,
        why: why.to_string(),
        source: AUDIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn versions_read_as_calico_prints_them() {
        assert_eq!(release("v3.26.1\n"), Some((3, 26, 1)));
        assert_eq!(release("v1.6.2-dirty"), Some((1, 6, 2)));
        assert_eq!(release("v3.18.5-12-gabc1234"), Some((3, 18, 5)));
        assert_eq!(release("3.20.0"), Some((3, 20, 0)));
        assert_eq!(release(""), None);
        assert_eq!(release("unknown"), None);
    }

    #[test]
    fn the_tables_rows_without_a_binary() {
        let none: [PathBuf; 0] = [];
        let judged = |net: Value| judge(&net, &none, &|p: &Path| p.to_path_buf());
        let bridge = judged(json!({"type": "bridge", "ipam": {"type": "host-local"}}));
        assert_eq!(bridge.need, Need::NotNeeded, "{bridge:?}");
        let wrapped = judged(json!({"plugins": [
            {"type": "sandbox-guard", "delegate": {"type": "macvlan", "ipam": {"type": "whereabouts"}}},
            {"type": "portmap"}]}));
        assert_eq!(wrapped.need, Need::NotNeeded, "{wrapped:?}");
        let flannel = judged(
            json!({"plugins": [{"type": "flannel", "delegate": {"hairpinMode": true}}, {"type": "portmap"}]}),
        );
        assert_eq!(flannel.need, Need::NotNeeded, "{flannel:?}");
        let cilium = judged(json!({"plugins": [{"type": "aws-cni"}, {"type": "cilium-cni"}]}));
        // aws-cni's own DEL is unknown (its policy agent): chained holds both DELs.
        assert_eq!((cilium.need, cilium.mode), (Need::Needed, Some("chained")));
        // Without its binary calico's version, so its own verdict, is unknown.
        let over_calico = judged(json!({"plugins": [{"type": "calico"}, {"type": "cilium-cni"}]}));
        assert_eq!(
            (over_calico.need, over_calico.mode),
            (Need::Needed, Some("chained")),
            "{over_calico:?}"
        );
        let wrapped = json!({"plugins": [{"type": "aws-cni"},
            {"type": "sandbox-guard", "delegate": {"type": "cilium-cni"}}]});
        assert_eq!(misplaced_wrapper(&wrapped), None);
        let on_portmap = json!({"plugins": [{"type": "calico"},
            {"type": "sandbox-guard", "delegate": {"type": "portmap"}}]});
        assert_eq!(
            misplaced_wrapper(&on_portmap),
            Some(("portmap".to_string(), "calico".to_string()))
        );
        let after_portmap = json!({"plugins": [{"type": "portmap"},
            {"type": "sandbox-guard", "delegate": {"type": "bridge"}}]});
        assert_eq!(misplaced_wrapper(&after_portmap), None);
        let twice = json!({"plugins": [{"type": "aws-cni"}, {"type": "cilium-cni"},
            {"type": "sandbox-guard", "delegate": {"type": "cilium-cni"}}]});
        assert!(misplaced_wrapper(&twice).is_some());
        let before = json!({"plugins": [{"type": "sandbox-guard", "delegate": {"type": "aws-cni"}},
            {"type": "cilium-cni"}]});
        assert_eq!(
            misplaced_wrapper(&before),
            Some(("aws-cni".to_string(), "cilium-cni".to_string()))
        );
        assert_eq!(delegate_target(&["aws-cni", "egress-cni", "cilium-cni"]), 2);
        assert_eq!(delegate_target(&["cilium-cni", "portmap"]), 0);
        assert_eq!(delegate_target(&["bridge", "cilium-cni"]), 0);
        for net in [
            json!({"type": "sticky-ip"}),
            json!({"plugins": [{"type": "bridge"}, {"type": "my-cleanup"}]}),
            json!({"type": "antrea"}),
            json!({"plugins": [{"type": "aws-cni"}, {"type": "egress-v4-cni"}]}),
            json!({"plugins": [{"type": "macvlan", "ipam": {"type": "spiderpool"}}, {"type": "coordinator"}]}),
            json!({"type": "calico"}),
            json!({"plugins": []}),
        ] {
            assert_eq!(judged(net.clone()).need, Need::Unknown, "{net}");
        }
    }
}
