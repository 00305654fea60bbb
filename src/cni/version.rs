//! Which CNI versions the plugin speaks and which verbs each of them allows.

use crate::cni::env::Verb;
use crate::error::{GuardError, Kind, Result};

/// Every version of the spec, as libcni's `version.All` lists them: the reference plugins
/// speak all of them, and so do the primaries the guard exists for (calico v2 installs
/// 0.1.0 networks).
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// What a config without `cniVersion` speaks: libcni's `version.ConfigDecoder` and the
/// plugins' skel read a missing or empty version as 0.1.0, the spec before the key existed.
pub const UNVERSIONED: &str = "0.1.0";
pub const LATEST: &str = "1.1.0";

/// What `--version` prints, the plugin's and the operator's binary's alike.
pub fn version_line() -> String {
    format!(
        "sandbox-guard {} (CNI {})",
        env!("CARGO_PKG_VERSION"),
        SUPPORTED.join(", ")
    )
}

/// The version to put in an error: the config's when we speak it, else our newest, so
/// the runtime can always decode the error.
pub fn for_reply(requested: Option<&str>) -> &str {
    match requested {
        Some(v) if SUPPORTED.contains(&v) => v,
        _ => LATEST,
    }
}

/// Refuses a version we do not speak and a verb the version predates (CHECK came with
/// 0.4.0, GC and STATUS with 1.1.0), as the spec requires.
pub fn check_verb_allowed(verb: Verb, version: &str) -> Result<()> {
    if !SUPPORTED.contains(&version) {
        return Err(GuardError::new(
            Kind::IncompatibleVersion,
            format!(
                "cniVersion {:?} is not supported: use one of {}",
                crate::names::shorten(version),
                SUPPORTED.join(", ")
            ),
        ));
    }
    let needs = match verb {
        Verb::Check => "0.4.0",
        Verb::Gc | Verb::Status => "1.1.0",
        _ => return Ok(()),
    };
    if parse(version) < parse(needs) {
        return Err(GuardError::new(
            Kind::IncompatibleVersion,
            format!(
                "{} needs cniVersion {needs} or later, the config says {version}: raise the \
                 conflist's cniVersion",
                verb.name()
            ),
        ));
    }
    Ok(())
}

/// Whether `version` is `min` or later (`at_least("0.3.1", "0.4.0")` is false).
pub fn at_least(version: &str, min: &str) -> bool {
    parse(version) >= parse(min)
}

/// The versions a plugin speaks, from its answer to VERSION, as libcni reads it
/// (`invoke.GetVersionInfo` and `version.PluginDecoder`): a plugin from before VERSION fails
/// it with exactly "unknown CNI_COMMAND: VERSION" and speaks 0.1.0; an answer without
/// `supportedVersions` speaks 0.1.0 and 0.2.0 when its `cniVersion` is 0.2.0 and is no answer
/// otherwise, nor is one without `cniVersion`. `exited_ok`: the plugin exited with 0. `Err`
/// says why the answer is none, as the rest of a sentence that starts with "VERSION".
pub fn read_plugin_versions(
    exited_ok: bool,
    reply: &[u8],
) -> std::result::Result<Vec<String>, String> {
    let answer: Option<serde_json::Value> = serde_json::from_slice(reply).ok();
    if !exited_ok {
        // libcni compares the error's text, which is its msg alone when it has no details.
        let field = |key: &str| answer.as_ref().and_then(|a| a.get(key)?.as_str());
        if field("msg") == Some("unknown CNI_COMMAND: VERSION")
            && field("details").is_none_or(str::is_empty)
        {
            return Ok(vec![UNVERSIONED.to_string()]);
        }
        return Err(format!(
            "failed: {}",
            crate::names::shorten(String::from_utf8_lossy(reply).trim())
        ));
    }
    let Some(serde_json::Value::Object(answer)) = answer else {
        return Err("wrote no JSON object".to_string());
    };
    let cni_version = match answer.get("cniVersion") {
        Some(serde_json::Value::String(version)) if !version.is_empty() => version.as_str(),
        _ => return Err("has no cniVersion".to_string()),
    };
    let listed: Vec<String> = match answer.get("supportedVersions") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<_>>()
            .ok_or("lists a supported version that is not a string")?,
        Some(_) => return Err("has a supportedVersions that is not a list".to_string()),
    };
    match (listed.is_empty(), cni_version) {
        (false, _) => Ok(listed),
        (true, "0.2.0") => Ok(vec!["0.1.0".to_string(), "0.2.0".to_string()]),
        _ => Err("has no supportedVersions".to_string()),
    }
}

fn parse(version: &str) -> (u32, u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// The VERSION reply. libcni sends `{"cniVersion": ...}` on stdin; the reply echoes it when
/// the plugin speaks it.
pub fn version_reply(requested: Option<&str>) -> String {
    version_reply_among(requested, &SUPPORTED)
}

/// The VERSION reply listing only `speaks` (delegate mode: what both the guard and its
/// primary speak).
pub fn version_reply_among(requested: Option<&str>, speaks: &[&str]) -> String {
    // Written out, not built as a JSON value: VERSION does little else, and each code page it
    // runs is a page fault of its exec. Every string here is one of SUPPORTED: nothing to escape.
    let versions = speaks
        .iter()
        .map(|v| format!("\"{v}\""))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "{{\"cniVersion\":\"{}\",\"supportedVersions\":[{versions}]}}",
        for_reply(requested)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_versions_are_read_as_libcni_reads_them() {
        let read = |ok, text: &str| read_plugin_versions(ok, text.as_bytes());
        assert_eq!(
            read(
                true,
                r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#
            ),
            Ok(vec!["0.4.0".to_string(), "1.0.0".to_string()])
        );
        // A 0.2.0-era answer without the list (libcni's PluginDecoder).
        assert_eq!(
            read(true, r#"{"cniVersion":"0.2.0"}"#),
            Ok(vec!["0.1.0".to_string(), "0.2.0".to_string()])
        );
        // A plugin from before VERSION (libcni's GetVersionInfo).
        assert_eq!(
            read(false, r#"{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}"#),
            Ok(vec!["0.1.0".to_string()])
        );
        for (ok, text) in [
            (
                false,
                r#"{"code":4,"msg":"unknown CNI_COMMAND: VERSION","details":"x"}"#,
            ),
            (false, r#"{"code":7,"msg":"no"}"#),
            (true, r#"{"cniVersion":"0.3.1"}"#),
            (true, r#"{"supportedVersions":["1.0.0"]}"#),
            (true, "not json"),
        ] {
            assert!(read(ok, text).is_err(), "{text}");
        }
    }

    #[test]
    fn version_reply_is_the_json_it_always_was() {
        let expected =
            serde_json::json!({"cniVersion": "0.4.0", "supportedVersions": SUPPORTED}).to_string();
        assert_eq!(version_reply(Some("0.4.0")), expected);
        assert!(version_reply(Some("9.9.9")).starts_with("{\"cniVersion\":\"1.1.0\""));
    }

    #[test]
    fn verbs_follow_the_spec() {
        assert!(check_verb_allowed(Verb::Add, "0.1.0").is_ok());
        assert!(check_verb_allowed(Verb::Del, "0.2.0").is_ok());
        assert!(check_verb_allowed(Verb::Check, "0.2.0").is_err());
        assert!(check_verb_allowed(Verb::Status, "0.1.0").is_err());
        assert!(check_verb_allowed(Verb::Add, "0.3.0").is_ok());
        assert!(check_verb_allowed(Verb::Check, "0.3.1").is_err());
        assert!(check_verb_allowed(Verb::Check, "0.4.0").is_ok());
        assert!(check_verb_allowed(Verb::Gc, "1.0.0").is_err());
        assert!(check_verb_allowed(Verb::Status, "1.1.0").is_ok());
        assert_eq!(
            check_verb_allowed(Verb::Add, "2.0.0").unwrap_err().code(),
            1
        );
        let huge = "9".repeat(100_000);
        assert!(check_verb_allowed(Verb::Del, &huge).unwrap_err().msg.len() < 256);
    }
}
