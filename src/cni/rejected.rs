//! An operation refused for its config (not JSON, a key's bad value, a cniVersion the plugin
//! does not speak) is logged and counted like any other: after a bad install every pod fails
//! on it, and the log and the metrics are where an operator looks first.
//!
//! The config is the thing that is wrong, so the paths come from it best effort (`Salvaged`):
//! `logFile`, `logFormat`, `logMaxBytes`, `metricsFile`, `stateDir` (default: the default
//! state dir) and `name` are taken from the JSON if it parses, else from `"key": "value"`
//! pairs in the text (a file cut short keeps its early keys); each only when it would be
//! valid in a good config. Nothing found, nothing written: the line goes to stderr, as before.
//! Nothing here changes the runtime's answer: every failure is said on stderr and dropped.

use std::path::{Path, PathBuf};

use crate::cni::config::{self, DEFAULT_STATE_DIR};
use crate::cni::env::{Attachment, Verb};
use crate::cni::log::{Level, Log, LogFormat, LogOptions, Outcome, Subject};
use crate::cni::metrics;
use crate::error::{GuardError, Kind};
use crate::names::{self, MAX_NETWORK};

/// `reason=` of a rejected config: a word per error kind, so the label's values stay few.
fn reason(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Decode => Some("decode"),
        Kind::InvalidConfig => Some("invalid-config"),
        Kind::IncompatibleVersion => Some("incompatible-version"),
        _ => None,
    }
}

/// Logs and counts `err`, the refusal of `stdin` as the config of `verb`.
pub fn record(verb: Verb, attachment: Option<&Attachment>, stdin: &[u8], err: &GuardError) {
    let Some(reason) = reason(err.kind) else {
        stderr_line!("sandbox-guard: {err}");
        return;
    };
    let found = Salvaged::from(stdin);
    let format = match found.text("logFormat") {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    let log = Log::open(
        found.path("logFile").as_deref(),
        LogOptions::with_max_bytes(format, found.value("logMaxBytes")),
    );
    let network = found.text("name").filter(|name| {
        names::check_plain("network name", name, MAX_NETWORK, Kind::InvalidConfig).is_ok()
    });
    let subject = Subject {
        network: network.unwrap_or("-"),
        container_id: attachment.map_or("-", |a| a.container_id.as_str()),
        if_name: attachment.map_or("-", |a| a.ifname.as_str()),
        pod: attachment.and_then(|a| a.pod.label()),
    };
    // Also to stderr: the runtime's log shows it beside the error it got.
    log.event_with(
        Level::Error,
        verb,
        &subject,
        Outcome::Rejected,
        &[("reason", reason)],
        &err.msg,
    );
    if let Some(metrics_file) = found.path("metricsFile") {
        let state_dir = match found.value("stateDir") {
            None => Some(PathBuf::from(DEFAULT_STATE_DIR)),
            Some(_) => found.path("stateDir"),
        };
        match state_dir {
            Some(state_dir) => metrics::count_rejected(&state_dir, &metrics_file, verb, reason),
            None => stderr_line!(
                "sandbox-guard: this rejected {} is not counted: its stateDir is not usable",
                verb.name()
            ),
        }
    }
}

/// The keys of a config the plugin refused, as far as they can be read.
enum Salvaged {
    Json(serde_json::Map<String, serde_json::Value>),
    Text(String),
    Nothing,
}

impl Salvaged {
    fn from(stdin: &[u8]) -> Salvaged {
        match serde_json::from_slice(stdin) {
            Ok(serde_json::Value::Object(object)) => Salvaged::Json(object),
            Ok(_) => Salvaged::Nothing,
            Err(_) => std::str::from_utf8(stdin)
                .map_or(Salvaged::Nothing, |text| Salvaged::Text(text.to_string())),
        }
    }

    fn value(&self, key: &str) -> Option<&serde_json::Value> {
        match self {
            Salvaged::Json(object) => object.get(key),
            // Only strings are read from a text; a key that is there at all is "given".
            Salvaged::Text(text) => text
                .contains(&format!("\"{key}\""))
                .then_some(&serde_json::Value::Null),
            Salvaged::Nothing => None,
        }
    }

    fn text(&self, key: &str) -> Option<&str> {
        match self {
            Salvaged::Json(object) => object.get(key)?.as_str(),
            Salvaged::Text(text) => string_after_key(text, key),
            Salvaged::Nothing => None,
        }
    }

    /// A path key, only as a good config would have it: absolute, no `..`.
    fn path(&self, key: &str) -> Option<PathBuf> {
        let path = Path::new(self.text(key)?);
        config::require_absolute(key, path)
            .is_ok()
            .then(|| path.to_path_buf())
    }
}

/// The string after the first `"key":` in `text`, when it has no escapes (paths and names
/// never need them).
fn string_after_key<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let quoted = format!("\"{key}\"");
    let after = &text[text.find(&quoted)? + quoted.len()..];
    let value = after
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let end = value.find(['"', '\\'])?;
    let found = &value[..end];
    (value[end..].starts_with('"') && !found.chars().any(char::is_control)).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_in_json_and_in_a_text_cut_short() {
        let json = Salvaged::from(
            br#"{"logFile":"/var/log/g.log","stateDir":"relative","name":"net","metricsFile":7}"#,
        );
        assert_eq!(json.path("logFile"), Some(PathBuf::from("/var/log/g.log")));
        assert_eq!(
            (json.path("stateDir"), json.value("stateDir").is_some()),
            (None, true)
        );
        assert_eq!(json.path("metricsFile"), None);
        assert_eq!(json.text("name"), Some("net"));
        let cut = Salvaged::from(br#"{"cniVersion":"1.0.0", "logFile" : "/var/log/g.log","metricsFile":"/m/x\"y.prom","stateDir":"/s/../t","name":"n"#);
        assert_eq!(cut.path("logFile"), Some(PathBuf::from("/var/log/g.log")));
        assert_eq!(cut.path("metricsFile"), None, "escapes are not read");
        assert_eq!(cut.path("stateDir"), None);
        assert!(cut.value("stateDir").is_some() && cut.value("logMaxBytes").is_none());
        assert_eq!(cut.text("name"), None, "an unterminated string is not read");
        assert!(matches!(Salvaged::from(b"\xff\x00"), Salvaged::Nothing));
        assert!(matches!(Salvaged::from(b"[1]"), Salvaged::Nothing));
    }
}
