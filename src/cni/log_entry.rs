//! Reading the operation log back: the `outcome=` names and the one parser of a line, text
//! or JSON. Every program reads the log through this file (the doctor, the metrics, the
//! tests), so none can drift from the format the plugin writes.

/// `outcome=` of a line: what the operation came to. The names are read by programs (the
/// doctor, the metrics, the tests), so a name, once written, stays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Added,
    Deleted,
    /// A stale DEL passed on in audit mode.
    Audited,
    Refused,
    /// A stale DEL answered with success and kept for the primary until the pod is free.
    Deferred,
    Replayed,
    ReplayFailed,
    /// A cut-off ADD's rollback, and its sandbox's DEL answered from it.
    RolledBack,
    RollbackFailed,
    /// A cut-off ADD given up without a DEL as its sandbox.
    CutOff,
    /// A previous record or owner failed verification and was kept aside.
    SetAside,
    Checked,
    CheckFailed,
    Collected,
    /// Refused for its config (`cni::rejected`), with `reason=` one of a few words (`Kind`'s
    /// decode, invalid-config, incompatible-version).
    Rejected,
    Error,
    /// The log's own note that `logMaxBytes` was adjusted.
    LogCap,
    /// The API server was to be asked (`kubeconfig`) and did not answer in time: the local
    /// rule decided alone.
    ApiUnanswered,
}

impl Outcome {
    pub const ALL: [Outcome; 18] = [
        Outcome::Added,
        Outcome::Deleted,
        Outcome::Audited,
        Outcome::Refused,
        Outcome::Deferred,
        Outcome::Replayed,
        Outcome::ReplayFailed,
        Outcome::RolledBack,
        Outcome::RollbackFailed,
        Outcome::CutOff,
        Outcome::SetAside,
        Outcome::Checked,
        Outcome::CheckFailed,
        Outcome::Collected,
        Outcome::Rejected,
        Outcome::Error,
        Outcome::LogCap,
        Outcome::ApiUnanswered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Added => "added",
            Outcome::Deleted => "deleted",
            Outcome::Audited => "audited",
            Outcome::Refused => "refused",
            Outcome::Deferred => "deferred",
            Outcome::Replayed => "replayed",
            Outcome::ReplayFailed => "replay-failed",
            Outcome::RolledBack => "rolled-back",
            Outcome::RollbackFailed => "rollback-failed",
            Outcome::CutOff => "cut-off",
            Outcome::SetAside => "set-aside",
            Outcome::Checked => "checked",
            Outcome::CheckFailed => "check-failed",
            Outcome::Collected => "collected",
            Outcome::Rejected => "rejected",
            Outcome::Error => "error",
            Outcome::LogCap => "log-cap",
            Outcome::ApiUnanswered => "api-unanswered",
        }
    }

    pub fn from_name(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == name)
    }
}

/// `cause=` of a DEL refused (or let through in audit mode) because another sandbox owns the
/// pod; `owner=` then names that sandbox.
pub const CAUSE_STALE_DEL: &str = "stale-del";
/// `cause=` of a DEL refused because the checkpoint it needs failed verification.
pub const CAUSE_SET_ASIDE: &str = "set-aside";
/// Delegate mode refused the ADD of a sandbox a newer live one superseded.
pub const CAUSE_SUPERSEDED: &str = "superseded";
/// A DEL refused because the API server shows the pod's name on another pod (rule 7).
pub const CAUSE_NAME_MOVED: &str = "name-moved";
/// An ADD refused because the API server no longer has its pod under that name (rule 8).
pub const CAUSE_LATE_ADD: &str = "late-add";
/// A replayed DEL that passed but took more than half of `replayTimeoutSeconds`.
pub const CAUSE_SLOW_PRIMARY: &str = "slow-primary";

/// The machine-read part of one log line, text or JSON: its time, level, verb and fields (in
/// a text line, those before `outcome=`, `outcome=` itself and those right after it). The
/// text is not read.
#[derive(Debug, PartialEq)]
pub struct LogEntry {
    pub time: String,
    pub level: String,
    pub verb: String,
    fields: Vec<(String, String)>,
}

impl LogEntry {
    pub fn parse(line: &str) -> Option<LogEntry> {
        if line.starts_with('{') {
            return LogEntry::parse_json(line);
        }
        let mut words = line.split(' ');
        let time = words.next()?;
        words
            .next()
            .filter(|program| program.starts_with("sandbox-guard["))?;
        let level = words.next()?;
        let verb = words.next()?;
        let mut fields = Vec::new();
        let mut after_outcome = false;
        for word in words {
            let Some((key, value)) = word.split_once('=') else {
                break;
            };
            // After the outcome, fields are lower-case words; the first other word is text.
            if after_outcome && !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
                break;
            }
            after_outcome |= key == "outcome";
            fields.push((key.to_string(), value.to_string()));
        }
        after_outcome.then(|| LogEntry {
            time: time.into(),
            level: level.into(),
            verb: verb.into(),
            fields,
        })
    }

    fn parse_json(line: &str) -> Option<LogEntry> {
        let serde_json::Value::Object(object) = serde_json::from_str(line).ok()? else {
            return None;
        };
        let text = |key: &str| object.get(key).and_then(|v| v.as_str()).map(String::from);
        let (time, level, verb) = (text("time")?, text("level")?, text("verb")?);
        text("outcome")?;
        let fields = object
            .iter()
            .filter(|(key, _)| !matches!(key.as_str(), "time" | "level" | "verb" | "pid" | "msg"))
            .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
            .collect();
        Some(LogEntry {
            time,
            level,
            verb,
            fields,
        })
    }

    /// The `outcome=` field, when it is one of this build's names.
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::from_name(self.field("outcome")?)
    }

    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_and_the_text_is_not() {
        let line = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=refused cause=stale-del owner=bbb words=like this";
        let entry = LogEntry::parse(line).unwrap();
        assert_eq!(
            (
                entry.time.as_str(),
                entry.level.as_str(),
                entry.verb.as_str()
            ),
            ("2026-01-02T03:04:05Z", "WARN", "DEL")
        );
        assert_eq!(entry.field("cause"), Some(CAUSE_STALE_DEL));
        assert_eq!(entry.field("owner"), Some("bbb"));
        assert_eq!(entry.field("pod"), Some("ns/p"));
        assert_eq!(entry.field("words"), Some("like"));
        let prose_only = "2026-01-02T03:04:05Z sandbox-guard[42] INFO DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=deleted released pod key ns/p";
        assert_eq!(LogEntry::parse(prose_only).unwrap().field("cause"), None);
        assert_eq!(LogEntry::parse("garbage"), None);
        assert_eq!(LogEntry::parse(""), None);
    }

    #[test]
    fn json_lines_carry_the_same_fields() {
        let line = r#"{"time":"2026-01-02T03:04:05Z","pid":42,"level":"WARN","verb":"DEL","network":"net","container":"aaa","ifname":"eth0","pod":"ns/p","outcome":"refused","cause":"stale-del","owner":"bbb","msg":"words=like this"}"#;
        let entry = LogEntry::parse(line).unwrap();
        assert_eq!(
            (
                entry.time.as_str(),
                entry.level.as_str(),
                entry.verb.as_str()
            ),
            ("2026-01-02T03:04:05Z", "WARN", "DEL")
        );
        for (key, value) in [
            ("cause", "stale-del"),
            ("owner", "bbb"),
            ("pod", "ns/p"),
            ("outcome", "refused"),
            ("container", "aaa"),
        ] {
            assert_eq!(entry.field(key), Some(value), "{key}");
        }
        assert_eq!(entry.field("words"), None);
        assert_eq!(LogEntry::parse(r#"{"time":"t"}"#), None);
    }
}
