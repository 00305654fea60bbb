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
