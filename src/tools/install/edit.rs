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
    /// In the primary's place, the primary under `delegate`.
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

/// The guard's own keys, as the installer writes them.
#[derive(Debug, Clone)]
pub struct Entry {
    pub state_dir: PathBuf,
    pub log_file: Option<PathBuf>,
}

impl Entry {
    pub fn json(&self) -> Json {
        let mut pairs = vec![
            ("type", Json::String(GUARD_TYPE.to_string())),
            ("stateDir", Json::String(self.state_dir.to_string_lossy().into_owned())),
        ];
        if let Some(log_file) = &self.log_file {
            pairs.push(("logFile", Json::String(log_file.to_string_lossy().into_owned())));
        }
        Json::object(pairs)
    }
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
    pairs.push(("name", plugin.get("name").cloned().unwrap_or(Json::String(String::new()))));
    pairs.push(("plugins", Json::Array(vec![plugin.clone()])));
    Json::object(pairs)
}

/// `list` (already stripped) with the guard put in for `mode` (chained or delegate).
pub fn insert(list: &Json, mode: Mode, entry: &Entry) -> Json {
    let mut list = list.clone();
    let plugins = plugins_mut(&mut list);
    match mode {
        Mode::Chained => plugins.push(entry.json()),
        Mode::Delegate => {
            let primary = plugins.remove(0);
            let Json::Object(mut pairs) = entry.json() else { unreachable!() };
            // libcni hands runtimeConfig only to an entry that declares the capability.
            if let Some(capabilities) = primary.get("capabilities") {
                pairs.insert(1, ("capabilities".to_string(), capabilities.clone()));
            }
            pairs.push(("delegate".to_string(), primary));
            plugins.insert(0, Json::Object(pairs));
        }
        Mode::Dropin => unreachable!("a drop-in leaves the list alone"),
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry { state_dir: "/s".into(), log_file: None }
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
        assert_eq!(plugins(&wrapped)[0].get("capabilities"), plugins(&list)[0].get("capabilities"));
    }
}
