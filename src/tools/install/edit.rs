//! The guard's entry in a network's config: put in for each mode, taken out of every form.

use std::path::PathBuf;

use super::json::Json;

pub const GUARD_TYPE: &str = "sandbox-guard";
/// The drop-in's file name under `<conf-dir>/<network name>/`.
pub const DROPIN_FILE: &str = "sandbox-guard.conf";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Last in the list: first on DEL, where refusing a stale DEL keeps it from the primary.
    Chained,
    /// In the primary's place, the primary under `delegate` (cilium-cni's, in a chain where
    /// its DEL is the one acting on the pod's name).
    Delegate,
    /// `<conf-dir>/<network>/sandbox-guard.conf`, which libcni 1.3 appends to the list.
    Dropin,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "chained" => Some(Mode::Chained),
            "delegate" => Some(Mode::Delegate),
            "dropin" => Some(Mode::Dropin),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Chained => "chained",
            Mode::Delegate => "delegate",
            Mode::Dropin => "dropin",
        }
    }
}

/// The guard's entry as the installer writes it. Keys it is not told about are the
/// operator's (staleDel, metricsFile, logFormat, ...): they stay as they are in the entry
/// already there, or in the one the watch saw last.
#[derive(Debug, Clone, Default)]
pub struct Entry {
    /// `None`: the entry's own, else the default.
    pub state_dir: Option<PathBuf>,
    pub log_file: Option<PathBuf>,
    /// Keys set on every install (`--entry JSON`), over the entry's own.
    pub keys: Vec<(String, Json)>,
    /// A JSON object read on every install (`--entry-file`, a ConfigMap's key), set after
    /// `keys`: a ConfigMap update reaches the entry at the watch's next look.
    pub keys_file: Option<PathBuf>,
    /// Keys the installer set before and no longer sets, taken out where the entry still has
    /// them with that value (the kubeconfig it wrote, once `--api-credentials` is gone).
    pub unset: Vec<(String, Json)>,
}

/// Keys an entry must not be given: the installer owns them.
pub const RESERVED_KEYS: [&str; 3] = ["type", "delegate", "capabilities"];

/// The keys of a JSON object for the entry, or why not.
pub fn entry_keys(text: &str, from: &str) -> Result<Vec<(String, Json)>, String> {
    match serde_json::from_str::<Json>(text) {
        Ok(Json::Object(pairs)) => match pairs
            .iter()
            .find(|(k, _)| RESERVED_KEYS.contains(&k.as_str()))
        {
            Some((key, _)) => Err(format!(
                "{from} sets {key:?}, which the installer owns: leave it out"
            )),
            None => Ok(pairs),
        },
        Ok(_) => Err(format!(
            "{from} is not a JSON object: give {{\"staleDel\": \"audit\", ...}}"
        )),
        Err(e) => Err(format!("{from} is not JSON: {e}")),
    }
}

impl Entry {
    /// The entry to write, built on `current` (the one there now or last seen).
    pub fn json(&self, current: Option<&Json>) -> Result<Json, String> {
        let mut pairs: Vec<(String, Json)> = match current {
            // A single plugin's wrapper carries the network's name and version: not the
            // operator's keys (libcni sets both on every entry of a list).
            Some(Json::Object(pairs)) => pairs
                .iter()
                .filter(|(k, _)| !RESERVED_KEYS.contains(&k.as_str()))
                .filter(|(k, _)| k != "cniVersion" && k != "name")
                .filter(|pair| !self.unset.contains(pair))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        pairs.insert(
            0,
            ("type".to_string(), Json::String(GUARD_TYPE.to_string())),
        );
        let mut set = |key: &str, value: Json| match pairs.iter_mut().find(|(k, _)| k == key) {
            Some(pair) => pair.1 = value,
            None => pairs.push((key.to_string(), value)),
        };
        let path = |p: &PathBuf| Json::String(p.to_string_lossy().into_owned());
        match &self.state_dir {
            Some(dir) => set("stateDir", path(dir)),
            None if current.and_then(|c| c.get("stateDir")).is_none() => set(
                "stateDir",
                Json::String(crate::cni::config::DEFAULT_STATE_DIR.to_string()),
            ),
            None => {}
        }
        if let Some(log_file) = &self.log_file {
            set("logFile", path(log_file));
        }
        for (key, value) in &self.keys {
            set(key, value.clone());
        }
        if let Some(file) = &self.keys_file {
            // A ConfigMap mounted `optional: true` and not created: no keys to set.
            let text = match std::fs::read_to_string(file) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::from("{}"),
                Err(e) => return Err(format!("cannot read --entry-file {}: {e}", file.display())),
            };
            for (key, value) in entry_keys(&text, &format!("--entry-file {}", file.display()))? {
                set(&key, value);
            }
        }
        Ok(Json::Object(pairs))
    }
}

/// Why the plugin would reject the guard's entry in `list`, parsed as the plugin parses what
/// the runtime hands it (the entry with the list's name and cniVersion): every ADD fails on
/// an entry it rejects, so nothing is written with one. Each key is tried alone first, so
/// the answer names the key whatever the parser says.
pub fn entry_problem(list: &Json) -> Option<String> {
    let entry = plugins(list).iter().find(|p| is_guard(p))?;
    let Json::Object(pairs) = entry else {
        return Some("the guard's entry is not a JSON object".to_string());
    };
    let conf = |pairs: &[(String, Json)]| -> Result<(), String> {
        let mut all: Vec<(String, Json)> = ["cniVersion", "name"]
            .into_iter()
            .filter_map(|k| Some((k.to_string(), list.get(k)?.clone())))
            .collect();
        all.extend(
            pairs
                .iter()
                .filter(|(k, _)| k != "cniVersion" && k != "name")
                .cloned(),
        );
        let bytes = serde_json::to_vec(&Json::Object(all)).map_err(|e| e.to_string())?;
        crate::cni::config::NetConf::parse(&bytes)
            .map(|_| ())
            .map_err(|e| e.msg)
    };
    for pair in pairs
        .iter()
        .filter(|(k, _)| !["type", "delegate", "capabilities"].contains(&k.as_str()))
    {
        if let Err(msg) = conf(std::slice::from_ref(pair)) {
            let value = serde_json::to_string(&pair.1).unwrap_or_default();
            return Some(format!(
                "the entry's key {:?} ({}) is one the plugin rejects: {msg}",
                pair.0,
                crate::names::shorten(&value)
            ));
        }
    }
    conf(pairs)
        .err()
        .map(|msg| format!("the plugin rejects the guard's entry: {msg}"))
}

/// The guard's entry in a list (chained, or the wrapper of a delegate), without the
/// wrapped primary.
pub fn guard_entry(list: &Json) -> Option<Json> {
    plugins(list)
        .iter()
        .find(|p| is_guard(p))
        .map(|entry| match entry {
            Json::Object(pairs) => Json::Object(
                pairs
                    .iter()
                    .filter(|(k, _)| k != "delegate")
                    .cloned()
                    .collect(),
            ),
            other => other.clone(),
        })
}

/// True when any list in `doc` names the guard: its plugins, or (multus thin) a list
/// re-inlined under `delegates`.
pub fn names_guard_anywhere(doc: &Json) -> bool {
    if is_guard(doc) || has_guard(doc) {
        return true;
    }
    let nested = |key: &str| match doc.get(key) {
        Some(Json::Array(items)) => items.iter().any(names_guard_anywhere),
        _ => false,
    };
    nested("delegates") || nested("plugins")
}

/// `doc` with the guard taken out of every list in it, as `strip` does for one.
pub fn strip_anywhere(doc: &Json) -> Json {
    let mut doc = if has_guard(doc) {
        strip(doc)
    } else {
        doc.clone()
    };
    if let Json::Object(pairs) = &mut doc {
        for (key, value) in pairs.iter_mut() {
            if let (true, Json::Array(items)) = (key == "delegates" || key == "plugins", value) {
                for item in items.iter_mut() {
                    *item = strip_anywhere(item);
                }
            }
        }
    }
    doc
}

fn is_guard(plugin: &Json) -> bool {
    plugin.get("type").and_then(Json::as_str) == Some(GUARD_TYPE)
}

fn plugins_mut(list: &mut Json) -> &mut Vec<Json> {
    match list.get_mut("plugins") {
        Some(Json::Array(plugins)) => plugins,
        _ => unreachable!("a network list has plugins (network::read checked)"),
    }
}

pub fn plugins(list: &Json) -> &[Json] {
    match list.get("plugins") {
        Some(Json::Array(plugins)) => plugins,
        _ => &[],
    }
}

pub fn has_guard(list: &Json) -> bool {
    plugins(list).iter().any(is_guard)
}

/// The list without the guard: chained entries dropped, a wrapped primary back in the
/// guard's place as it was given.
pub fn strip(list: &Json) -> Json {
    let mut list = list.clone();
    let plugins = plugins_mut(&mut list);
    let mut kept = Vec::with_capacity(plugins.len());
    for plugin in plugins.drain(..) {
        if !is_guard(&plugin) {
            kept.push(plugin);
        } else if let Some(primary) = plugin.get("delegate") {
            kept.push(primary.clone());
        }
    }
    *plugins = kept;
    list
}

/// A single plugin upconverted as libcni's `ConfListFromConf` does: the list takes its
/// name and cniVersion, the plugin stays whole.
pub fn upconvert(plugin: &Json) -> Json {
    let mut pairs = Vec::new();
    if let Some(version) = plugin.get("cniVersion") {
        pairs.push(("cniVersion", version.clone()));
    }
    pairs.push((
        "name",
        plugin
            .get("name")
            .cloned()
            .unwrap_or(Json::String(String::new())),
    ));
    pairs.push(("plugins", Json::Array(vec![plugin.clone()])));
    Json::object(pairs)
}

/// A list of one plugin as a single plugin's file holds it: the plugin with the list's
/// cniVersion and name, which libcni's upconversion gives back.
pub fn single_of(list: &Json) -> Json {
    let Some(Json::Object(plugin)) = plugins(list).first() else {
        return list.clone();
    };
    let mut pairs: Vec<(String, Json)> = ["cniVersion", "name"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), list.get(k)?.clone())))
        .collect();
    pairs.extend(
        plugin
            .iter()
            .filter(|(k, _)| k != "cniVersion" && k != "name")
            .cloned(),
    );
    Json::Object(pairs)
}

/// Where delegate mode wraps a plugin of `list` (already stripped).
fn delegate_index(list: &Json) -> usize {
    let types: Vec<&str> = plugins(list)
        .iter()
        .map(|p| p.get("type").and_then(Json::as_str).unwrap_or_default())
        .collect();
    crate::tools::primaries::delegate_target(&types)
}

/// `list` (already stripped) with `entry` put in for `mode` (chained or delegate).
pub fn insert(list: &Json, mode: Mode, entry: &Json) -> Json {
    let mut list = list.clone();
    let at = delegate_index(&list);
    let plugins = plugins_mut(&mut list);
    match mode {
        Mode::Chained => plugins.push(entry.clone()),
        Mode::Delegate => {
            let primary = plugins.remove(at);
            let Json::Object(mut pairs) = entry.clone() else {
                unreachable!("an entry is an object")
            };
            // libcni hands runtimeConfig only to an entry that declares the capability.
            if let Some(capabilities) = primary.get("capabilities") {
                pairs.insert(1, ("capabilities".to_string(), capabilities.clone()));
            }
            pairs.push(("delegate".to_string(), primary));
            plugins.insert(at, Json::Object(pairs));
        }
        Mode::Dropin => unreachable!("a drop-in leaves the list alone"),
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Json {
        Entry {
            state_dir: Some("/s".into()),
            ..Entry::default()
        }
        .json(None)
        .unwrap()
    }

    #[test]
    fn the_operators_keys_stay_and_the_installers_win() {
        let current: Json = serde_json::from_str(r#"{"type":"sandbox-guard","stateDir":"/old","staleDel":"audit","delegate":{"type":"x"}}"#).unwrap();
        let entry = Entry {
            log_file: Some("/l".into()),
            keys: vec![("ipConflict".into(), Json::String("refuse".into()))],
            ..Entry::default()
        };
        let json = entry.json(Some(&current)).unwrap();
        assert_eq!(
            serde_json::to_string(&json).unwrap(),
            r#"{"type":"sandbox-guard","stateDir":"/old","staleDel":"audit","logFile":"/l","ipConflict":"refuse"}"#
        );
        assert!(entry_keys(r#"{"type":"x"}"#, "--entry").is_err());
    }

    #[test]
    fn a_key_the_installer_no_longer_sets_goes_only_with_the_value_it_set() {
        let current: Json = serde_json::from_str(
            r#"{"type":"sandbox-guard","stateDir":"/s","kubeconfig":"/etc/cni/net.d/sandbox-guard.d/kubeconfig"}"#,
        )
        .unwrap();
        let ours = Json::String("/etc/cni/net.d/sandbox-guard.d/kubeconfig".into());
        let entry = Entry {
            unset: vec![("kubeconfig".into(), ours)],
            ..Entry::default()
        };
        let json = entry.json(Some(&current)).unwrap();
        assert_eq!(
            serde_json::to_string(&json).unwrap(),
            r#"{"type":"sandbox-guard","stateDir":"/s"}"#
        );
        let operators: Json = serde_json::from_str(
            r#"{"type":"sandbox-guard","stateDir":"/s","kubeconfig":"/etc/kubernetes/guard.json"}"#,
        )
        .unwrap();
        assert_eq!(entry.json(Some(&operators)).unwrap(), operators);
    }

    #[test]
    fn strip_undoes_both_forms() {
        let list: Json = serde_json::from_str(
            r#"{"name":"n","plugins":[{"type":"calico","capabilities":{"portMappings":true}},{"type":"portmap"}]}"#,
        )
        .unwrap();
        for mode in [Mode::Chained, Mode::Delegate] {
            let guarded = insert(&list, mode, &entry());
            assert!(has_guard(&guarded));
            assert_eq!(strip(&guarded), list, "{mode:?}");
            assert_eq!(strip(&insert(&strip(&guarded), mode, &entry())), list);
        }
        let wrapped = insert(&list, Mode::Delegate, &entry());
        assert_eq!(
            plugins(&wrapped)[0].get("capabilities"),
            plugins(&list)[0].get("capabilities")
        );
    }
}
