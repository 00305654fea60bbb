//! What names the guard outside the networks the runtime loads, for `--uninstall`: other
//! components' backups of a guarded file (cilium's `.cilium_bak`), which they put back
//! later, and the runtimes' caches of attachments made through the guard, whose DEL still
//! execs it.

use std::path::{Path, PathBuf};

use super::edit;
use super::files::{self, Keep, original_of};
use super::json::{Doc, Json};

/// cilium's agent (`cni.exclusive`) renames every other network file to `<file>.cilium_bak`
/// and renames it back when it is removed.
const CILIUM_BACKUP: &str = ".cilium_bak";

/// Takes the guard out of every backup in `conf_dir` that names it, keeping the backup
/// (its owner puts it back): the primary's own bytes when the guard's kept original says
/// the same, else the backup without the guard.
pub fn strip_backups(conf_dir: &Path, done: &mut Vec<String>) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(conf_dir) else {
        return Ok(());
    };
    for path in entries.flatten().map(|e| e.path()) {
        let name = path.to_string_lossy();
        let Some(original_name) = name.strip_suffix(CILIUM_BACKUP) else {
            continue;
        };
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(doc) = Doc::parse(&bytes) else {
            continue;
        };
        if !edit::names_guard_anywhere(&doc.root) {
            continue;
        }
        let stripped = unguarded(&doc.root);
        let kept = std::fs::read(original_of(Path::new(original_name)))
            .ok()
            .filter(|b| Doc::parse(b).is_ok_and(|d| d.root.same_as(&stripped)));
        let bytes = kept.unwrap_or_else(|| doc.with_root(stripped).render());
        let keep = Keep::of(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        files::write_atomic(&path, &bytes, keep)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        done.push(format!(
            "took sandbox-guard out of cilium's backup {}",
            path.display()
        ));
    }
    Ok(())
}

/// A network file's JSON without the guard: a wrapped single plugin back as it was, the
/// guard out of every list.
fn unguarded(root: &Json) -> Json {
    let wraps = root.get("type").and_then(Json::as_str) == Some(edit::GUARD_TYPE);
    match root.get("delegate") {
        Some(primary) if wraps => {
            let mut list: Vec<(&str, Json)> = ["cniVersion", "name"]
                .into_iter()
                .filter_map(|k| Some((k, root.get(k)?.clone())))
                .collect();
            list.push(("plugins", Json::Array(vec![primary.clone()])));
            edit::single_of(&Json::object(list))
        }
        _ => edit::strip_anywhere(root),
    }
}

/// Where runtimes keep what they need for a later DEL, under the host's root: libcni's
/// result cache (containerd, CRI-O through ocicni), and multus's per-container copy of
/// the delegates it ran.
const CACHES: [&str; 2] = ["var/lib/cni/results", "var/lib/cni/multus"];

/// Cached attachments whose config names the guard: their DEL execs the guard, and fails
/// with "failed to find plugin" once the binary is gone, leaving the pod stuck.
pub fn cached_attachments(host_root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in CACHES.map(|d| host_root.join(d)) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if std::fs::read(&path).is_ok_and(|bytes| names_guard(&bytes)) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// libcni's cache (`cniCacheV1`) keeps the network's config as base64 bytes under
/// `config`; multus keeps its delegates as plain JSON.
fn names_guard(bytes: &[u8]) -> bool {
    let needle = format!("\"{}\"", edit::GUARD_TYPE);
    let has = |b: &[u8]| b.windows(needle.len()).any(|w| w == needle.as_bytes());
    if has(bytes) {
        return true;
    }
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("config")?.as_str().map(base64_decode))
        .is_some_and(|config| has(&config))
}

/// Standard base64 (Go's `encoding/json` for `[]byte`); what is not base64 decodes to
/// nothing that could name the guard.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for sextet in text.bytes().map_while(value) {
        acc = (acc << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn libcnis_base64_config_is_read() {
        assert_eq!(
            super::base64_decode("eyJ0eXBlIjoic2FuZGJveC1ndWFyZCJ9"),
            br#"{"type":"sandbox-guard"}"#
        );
        assert!(super::names_guard(
            br#"{"kind":"cniCacheV1","config":"eyJ0eXBlIjoic2FuZGJveC1ndWFyZCJ9"}"#
        ));
        assert!(!super::names_guard(
            br#"{"kind":"cniCacheV1","config":"eyJ0eXBlIjoiY2FsaWNvIn0="}"#
        ));
    }
}
