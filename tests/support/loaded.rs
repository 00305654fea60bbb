//! Readiness as containerd's own view says it, to compare the probe's answer with.
#![allow(dead_code)]

use std::path::Path;

use serde_json::Value;

/// What containerd's own view (its CRI status's `cniconfig`, as the generated client or
/// `crictl info` print it) says readiness is: the guard last, or first wrapping a
/// primary, in the pods' network, and found in one of the dirs containerd searches.
pub fn ready_per_containerd(info: &Value) -> bool {
    let Some(plugins) = pods_plugins(info) else {
        return false;
    };
    let types: Vec<&str> = plugins
        .iter()
        .map(|p| p["type"].as_str().unwrap_or_default())
        .collect();
    let placed = (types.len() > 1 && types.last() == Some(&"sandbox-guard"))
        || (types.first() == Some(&"sandbox-guard") && plugins[0]["delegate"]["type"].is_string());
    let found = info["cniconfig"]["PluginDirs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|d| Path::new(d).join("sandbox-guard").is_file());
    placed && found
}

/// Whether containerd's view holds the pods' plugins at all: multus thick's shim fetches the
/// network from its daemon, so containerd sees only the shim.
pub fn containerd_shows_the_pods_network(info: &Value) -> bool {
    pods_plugins(info).is_some_and(|plugins| !plugins.iter().any(|p| p["type"] == "multus-shim"))
}

/// The plugins of the network containerd gives eth0, each as its JSON; through multus thin,
/// those of the network multus inlined as its first delegate (the cluster network it runs).
fn pods_plugins(info: &Value) -> Option<Vec<Value>> {
    let eth0 = info["cniconfig"]["Networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["IFName"] == "eth0")?;
    let plugins: Vec<Value> = eth0["Config"]["Plugins"]
        .as_array()?
        .iter()
        .map(|p| {
            serde_json::from_str(p["Source"].as_str().unwrap_or_default()).unwrap_or(Value::Null)
        })
        .collect();
    match plugins.as_slice() {
        [multus] if multus["type"] == "multus" => {
            let cluster = &multus["delegates"][0];
            match cluster["plugins"].as_array() {
                Some(list) => Some(list.clone()),
                None => Some(vec![cluster.clone()]),
            }
        }
        _ => Some(plugins),
    }
}
