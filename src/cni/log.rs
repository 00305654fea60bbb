//! Operation log: one line per operation to the configured log file, warnings and errors
//! also to stderr. Never stdout, which belongs to the CNI result.
//!
//! Writers log while they hold the store lock, so the file's order is the order in which
//! operations took effect.
//!
//! A line is `<time> sandbox-guard[<pid>] <LEVEL> <VERB> network=.. container=.. ifname=..
//! pod=ns/name|- outcome=.. [<field>=<value> ...] <text>`, or with `logFormat: "json"` one
//! JSON object per line with the same fields (`time`, `pid`, `level`, `verb`, `network`,
//! `container`, `ifname`, `pod`, `outcome`, the extra fields, `msg`). The fields are for
//! programs; the text is for people and may be reworded at will. `LogEntry::parse` is the
//! one reader of both formats.
//!
//! Bounded: past `logMaxBytes` the file is renamed to `<file>.1` (`.1` to `.2`, up to
//! LOG_BACKUPS) and the next line starts a new one. The rename happens under an flock of the
//! file being rotated, and only if the path still names the file this process writes to, so
//! two processes never rotate twice; lines other processes append meanwhile land in `.1`.
//! On a tmpfs or ramfs the log takes the node's memory: without an explicit `logMaxBytes`
//! it is capped at TMPFS_MAX_BYTES there.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::cni::env::Verb;

/// Rotated files kept beside the log: `<file>.1` (newest) .. `<file>.<LOG_BACKUPS>`.
pub const LOG_BACKUPS: u32 = 2;
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 << 20;
/// The cap on a tmpfs or ramfs when `logMaxBytes` is not given: there the log is RAM.
pub const TMPFS_MAX_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// How the log file is written and bounded (`logFormat`, `logMaxBytes`).
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    pub format: LogFormat,
    /// `None`: the default cap (smaller on a tmpfs); `Some(0)`: never rotate.
    pub max_bytes: Option<u64>,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions { format: LogFormat::Text, max_bytes: None }
    }
}

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
    path: Option<PathBuf>,
    options: LogOptions,
    /// (verb, outcome) of every event so far, for the metrics (`cni::metrics`).
    outcomes: RefCell<Vec<(Verb, String)>>,
}

impl Log {
    pub fn open(path: Option<&Path>, options: LogOptions) -> Log {
        let file = path.and_then(|path| {
            open_append(path)
                .map_err(|e| {
                    // A broken log must not fail the pod's network setup.
                    eprintln!("sandbox-guard: cannot open logFile {}: {e}; logging to stderr only", path.display());
                })
                .ok()
        });
        Log { file, path: path.map(Path::to_path_buf), options, outcomes: RefCell::new(Vec::new()) }
    }

    pub fn has_outcomes(&self) -> bool {
        !self.outcomes.borrow().is_empty()
    }

    /// The events logged so far, taken: each is counted once.
    pub fn take_outcomes(&self) -> Vec<(Verb, String)> {
        std::mem::take(&mut *self.outcomes.borrow_mut())
    }

    pub fn event(&self, level: Level, verb: Verb, subject: &Subject, outcome: &str, text: &str) {
        self.event_with(level, verb, subject, outcome, &[], text);
    }

    /// An event with fields for programs after the outcome. Keys and values are single
    /// words (names and IDs the guard validated).
    pub fn event_with(&self, level: Level, verb: Verb, subject: &Subject, outcome: &str, fields: &[(&str, &str)], text: &str) {
        self.outcomes.borrow_mut().push((verb, outcome.to_string()));
        let time = crate::clock::now_rfc3339();
        let level = match level {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        };
        let pod = subject.pod.as_deref().unwrap_or("-");
        let text_line = || {
            let fields: String = fields.iter().map(|(key, value)| format!("{key}={value} ")).collect();
            format!(
                "{time} sandbox-guard[{}] {level} {} network={} container={} ifname={} pod={pod} outcome={outcome} {fields}{text}\n",
                std::process::id(),
                verb.name(),
                subject.network,
                subject.container_id,
                subject.if_name,
            )
        };
        if let Some(mut file) = self.file.as_ref() {
            let line = match self.options.format {
                LogFormat::Text => text_line(),
                LogFormat::Json => {
                    let mut object = serde_json::Map::new();
                    for (key, value) in [("time", time.as_str()), ("pid", ""), ("level", level), ("verb", verb.name()),
                        ("network", subject.network), ("container", subject.container_id), ("ifname", subject.if_name),
                        ("pod", pod), ("outcome", outcome)]
                    {
                        let value = if key == "pid" { serde_json::json!(std::process::id()) } else { serde_json::json!(value) };
                        object.insert(key.to_string(), value);
                    }
                    for (key, value) in fields {
                        object.insert((*key).to_string(), serde_json::json!(value));
                    }
                    object.insert("msg".to_string(), serde_json::json!(text));
                    format!("{}\n", serde_json::Value::Object(object))
                }
            };
            // One write(2) with O_APPEND: concurrent lines never interleave.
            let _ = file.write_all(line.as_bytes());
            self.rotate_if_full(file);
        }
        if level != "INFO" {
            eprint!("{}", text_line());
        }
    }
}

impl Log {
    fn cap(&self, file: &File, size: u64) -> u64 {
        match self.options.max_bytes {
            Some(cap) => cap,
            // Only a file past the smaller cap pays for the statfs.
            None if size > TMPFS_MAX_BYTES && on_tmpfs(file) => TMPFS_MAX_BYTES,
            None => DEFAULT_LOG_MAX_BYTES,
        }
    }

    /// Rotates the file this process appends to once it is past its cap (see the module's
    /// doc). Best effort: a log that cannot rotate keeps growing, and says so on stderr.
    fn rotate_if_full(&self, file: &File) {
        let (Some(path), Ok(meta)) = (self.path.as_deref(), file.metadata()) else { return };
        let cap = self.cap(file, meta.len());
        if cap == 0 || meta.len() <= cap {
            return;
        }
        // Another process rotating now: it does the work.
        if file.try_lock().is_err() {
            return;
        }
        let same = std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == meta.ino() && m.dev() == meta.dev());
        if same {
            let backup = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
            let mut renamed = Ok(());
            for n in (1..LOG_BACKUPS).rev() {
                match std::fs::rename(backup(n), backup(n + 1)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => renamed = Err(e),
                    _ => {}
                }
            }
            if let Err(e) = renamed.and_then(|()| std::fs::rename(path, backup(1))) {
                eprintln!("sandbox-guard: cannot rotate logFile {}: {e}", path.display());
            }
        }
        let _ = file.unlock();
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

fn on_tmpfs(file: &File) -> bool {
    use nix::sys::statfs::{FsType, TMPFS_MAGIC, fstatfs};
    // ramfs has no constant in nix.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
    fstatfs(file).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC || fs.filesystem_type() == RAMFS_MAGIC)
}

/// `cause=` of a DEL refused (or let through in audit mode) because another sandbox owns the
/// pod; `owner=` then names that sandbox.
pub const CAUSE_STALE_DEL: &str = "stale-del";
/// `cause=` of a DEL refused because the checkpoint it needs failed verification.
pub const CAUSE_SET_ASIDE: &str = "set-aside";
/// Delegate mode refused the ADD of a sandbox a newer live one superseded.
pub const CAUSE_SUPERSEDED: &str = "superseded";

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
            fields.push((key.to_string(), value.to_string()));
        }
        after_outcome.then(|| LogEntry { time: time.into(), level: level.into(), verb: verb.into(), fields })
    }

    fn parse_json(line: &str) -> Option<LogEntry> {
        let serde_json::Value::Object(object) = serde_json::from_str(line).ok()? else { return None };
        let text = |key: &str| object.get(key).and_then(|v| v.as_str()).map(String::from);
        let (time, level, verb) = (text("time")?, text("level")?, text("verb")?);
        text("outcome")?;
        let fields = object
            .iter()
            .filter(|(key, _)| !matches!(key.as_str(), "time" | "level" | "verb" | "pid" | "msg"))
            .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
            .collect();
        Some(LogEntry { time, level, verb, fields })
    }

    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, value)| value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_and_the_text_is_not() {
        let line = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=aaa ifname=eth0 pod=ns/p outcome=refused cause=stale-del owner=bbb words=like this";
        let entry = LogEntry::parse(line).unwrap();
        assert_eq!((entry.time.as_str(), entry.level.as_str(), entry.verb.as_str()), ("2026-01-02T03:04:05Z", "WARN", "DEL"));
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
        assert_eq!((entry.time.as_str(), entry.level.as_str(), entry.verb.as_str()), ("2026-01-02T03:04:05Z", "WARN", "DEL"));
        for (key, value) in [("cause", "stale-del"), ("owner", "bbb"), ("pod", "ns/p"), ("outcome", "refused"), ("container", "aaa")] {
            assert_eq!(entry.field(key), Some(value), "{key}");
        }
        assert_eq!(entry.field("words"), None);
        assert_eq!(LogEntry::parse(r#"{"time":"t"}"#), None);
    }

    #[test]
    fn a_full_log_rotates_keeping_its_backups() {
        let dir = std::env::temp_dir().join(format!("sg-log-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("guard.log");
        let subject = Subject { network: "net", container_id: "aaa", if_name: "eth0", pod: None };
        for format in [LogFormat::Text, LogFormat::Json] {
            for _ in 0..40 {
                let log = Log::open(Some(&path), LogOptions { format, max_bytes: Some(1000) });
                log.event(Level::Info, Verb::Add, &subject, "added", "generation=1");
            }
        }
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        assert!(size(&path) <= 1400, "{}", size(&path));
        for n in 1..=LOG_BACKUPS {
            let backup = PathBuf::from(format!("{}.{n}", path.display()));
            assert!(size(&backup) > 1000 && size(&backup) < 1400, "{}: {}", backup.display(), size(&backup));
        }
        assert!(!PathBuf::from(format!("{}.{}", path.display(), LOG_BACKUPS + 1)).exists());
        // Rotation follows the write that fills the file: when the last write did, the next
        // line starts the file anew (how many lines fill it depends on the pid's digits).
        let newest = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(newest.lines().all(|l| LogEntry::parse(l).is_some_and(|e| e.field("outcome") == Some("added"))), "{newest}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
