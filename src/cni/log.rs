//! Operation log: one line per operation to the configured log file, warnings and errors
//! also to stderr. Never stdout, which belongs to the CNI result.
//!
//! Writers log while they hold the store lock, so the file's order is the order in which
//! operations took effect.
//!
//! A line is `<time> sandbox-guard[<pid>] <LEVEL> <VERB> network=.. container=.. ifname=..
//! pod=ns/name|- outcome=.. [<field>=<value> ...] <text>`. The fields are for programs (the
//! doctor reads stale DELs from `cause=` and `owner=`); the text is for people and may be
//! reworded at will. `LogEntry::parse` is the one reader of that format.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::cni::env::Verb;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// What an operation was about, for the log line.
pub struct Subject<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub if_name: &'a str,
    /// `namespace/name`, when the runtime or the record gave one.
    pub pod: Option<String>,
}

pub struct Log {
    file: Option<File>,
}

impl Log {
    pub fn open(path: Option<&Path>) -> Log {
        let file = path.and_then(|path| {
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| {
                    // A broken log must not fail the pod's network setup.
                    eprintln!("sandbox-guard: cannot open logFile {}: {e}; logging to stderr only", path.display());
                })
                .ok()
        });
        Log { file }
    }

    pub fn event(&self, level: Level, verb: Verb, subject: &Subject, outcome: &str, text: &str) {
        self.event_with(level, verb, subject, outcome, &[], text);
    }

    /// An event with fields for programs after the outcome. Keys and values are single
    /// words (names and IDs the guard validated).
    pub fn event_with(&self, level: Level, verb: Verb, subject: &Subject, outcome: &str, fields: &[(&str, &str)], text: &str) {
        let fields: String = fields.iter().map(|(key, value)| format!("{key}={value} ")).collect();
        let line = format!(
            "{} sandbox-guard[{}] {} {} network={} container={} ifname={} pod={} outcome={outcome} {fields}{text}\n",
            crate::clock::now_rfc3339(),
            std::process::id(),
            match level {
                Level::Info => "INFO",
                Level::Warn => "WARN",
                Level::Error => "ERROR",
            },
            verb.name(),
            subject.network,
            subject.container_id,
            subject.if_name,
            subject.pod.as_deref().unwrap_or("-"),
        );
        if let Some(mut file) = self.file.as_ref() {
            // One write(2) with O_APPEND: concurrent lines never interleave.
            let _ = file.write_all(line.as_bytes());
        }
        if level >= Level::Warn {
            eprint!("{line}");
        }
    }
}

/// `cause=` of a DEL refused (or let through in audit mode) because another sandbox owns the
/// pod; `owner=` then names that sandbox.
pub const CAUSE_STALE_DEL: &str = "stale-del";
/// `cause=` of a DEL refused because the checkpoint it needs failed verification.
pub const CAUSE_SET_ASIDE: &str = "set-aside";
/// Delegate mode refused the ADD of a sandbox a newer live one superseded.
pub const CAUSE_SUPERSEDED: &str = "superseded";

/// The machine-read part of one log line: its time, level, verb and `key=value` fields (those
/// before `outcome=`, `outcome=` itself and those right after it). The text is not read.
#[derive(Debug, PartialEq)]
pub struct LogEntry<'a> {
    pub time: &'a str,
    pub level: &'a str,
    pub verb: &'a str,
    fields: Vec<(&'a str, &'a str)>,
}

impl<'a> LogEntry<'a> {
    pub fn parse(line: &'a str) -> Option<LogEntry<'a>> {
        let mut words = line.split(' ');
        let time = words.next()?;
        words.next().filter(|program| program.starts_with("sandbox-guard["))?;
        let level = words.next()?;
        let verb = words.next()?;
        let mut fields = Vec::new();
        let mut after_outcome = false;
        for word in words {
            let Some((key, value)) = word.split_once('=') else { break };
            // After the outcome, fields are lower-case words; the first other word is text.
            if after_outcome && !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
                break;
            }
            after_outcome |= key == "outcome";
            fields.push((key, value));
        }
        after_outcome.then_some(LogEntry { time, level, verb, fields })
    }

    pub fn field(&self, key: &str) -> Option<&'a str> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, value)| *value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_and_the_text_is_not() {
        let line = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=refused cause=stale-del owner=bbb words=like this";
        let entry = LogEntry::parse(line).unwrap();
        assert_eq!((entry.time, entry.level, entry.verb), ("2026-01-02T03:04:05Z", "WARN", "DEL"));
        assert_eq!(entry.field("cause"), Some(CAUSE_STALE_DEL));
        assert_eq!(entry.field("owner"), Some("bbb"));
        assert_eq!(entry.field("pod"), Some("ns/p"));
        assert_eq!(entry.field("words"), Some("like"));
        let prose_only = "2026-01-02T03:04:05Z sandbox-guard[42] INFO DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=deleted released pod key ns/p";
        assert_eq!(LogEntry::parse(prose_only).unwrap().field("cause"), None);
        assert_eq!(LogEntry::parse("garbage"), None);
        assert_eq!(LogEntry::parse(""), None);
    }
}
