//! Readiness as containerd's own view says it, to compare the probe's answer with.

use std::path::Path;

use serde_json::Value;

/// What containerd's own view (its CRI status's `cniconfig`, as the generated client or
/// `crictl info` print it) says readiness is: the guard last, or first wrapping a
/// primary, in the pods' network, and found in one of the dirs containerd searches.
pub fn ready_per_containerd(info: &Value) -> bool {
    let eth0 = info["cniconfig"]["Networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["IFName"] == "eth0");
    let Some(plugins) = eth0.and_then(|n| n["Config"]["Plugins"].as_array()) else {
        return false;
    };
    let types: Vec<&str> = plugins
        .iter()
        .map(|p| p["Network"]["type"].as_str().unwrap_or_default())
        .collect();
    let delegates = |p: &Value| {
        serde_json::from_str::<Value>(p["Source"].as_str().unwrap_or_default())
            .is_ok_and(|s| s["delegate"]["type"].is_string())
    };
    let placed = (types.len() > 1 && types.last() == Some(&"sandbox-guard"))
        || (types.first() == Some(&"sandbox-guard") && delegates(&plugins[0]));
    let found = info["cniconfig"]["PluginDirs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|d| Path::new(d).join("sandbox-guard").is_file());
    placed && found
}
