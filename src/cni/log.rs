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
//! In text format every value and the text are written escaped (`escaped`): a primary's
//! message with a newline cannot start a line of its own, nor its first word pass for a field.
//!
//! Bounded: no file of the log (`<file>`, `<file>.1` .. `<file>.<LOG_BACKUPS>`) grows past
//! `logMaxBytes`, however many processes write at once; only a file holding one line longer
//! than the cap is larger. Each line is written under an flock of the file, after checking
//! that the path still names that file and that the line fits; if it does not, the writer
//! renames the file to `<file>.1` (`.1` to `.2` ...) and writes to a new one. A writer that
//! cannot get the lock within LOCK_WAIT (another one stopped while holding it) writes the line
//! to stderr instead, which keeps the bound. A `logMaxBytes` below MIN_MAX_BYTES is raised to
//! it, and one that is not a number of bytes gives the default: no value fails an operation,
//! and each file the log starts then opens with a line saying so.
//! On a tmpfs or ramfs the log takes the node's memory: without an explicit `logMaxBytes`
//! it is capped at TMPFS_MAX_BYTES there.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cni::env::Verb;
pub use crate::cni::log_entry::{
    CAUSE_LATE_ADD, CAUSE_NAME_MOVED, CAUSE_SET_ASIDE, CAUSE_SLOW_PRIMARY, CAUSE_STALE_DEL,
    CAUSE_SUPERSEDED, LogEntry, Outcome,
};

/// Rotated files kept beside the log: `<file>.1` (newest) .. `<file>.<LOG_BACKUPS>`.
pub const LOG_BACKUPS: u32 = 2;
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 << 20;
/// The cap on a tmpfs or ramfs when `logMaxBytes` is not given: there the log is RAM.
pub const TMPFS_MAX_BYTES: u64 = 1 << 20;
/// The smallest cap: below a few lines the log would rotate on every operation.
pub const MIN_MAX_BYTES: u64 = 4096;
/// How long a line waits for the lock (another writer holds it for one write, or for a
/// rotation's renames) before it goes to stderr instead.
const LOCK_WAIT: Duration = Duration::from_millis(100);

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
    /// `logMaxBytes` as given, when it was not used as it is.
    pub max_bytes_adjusted: Option<MaxBytesAdjusted>,
}

/// A `logMaxBytes` the plugin could not use as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxBytesAdjusted {
    /// Below MIN_MAX_BYTES: raised to it.
    Raised(u64),
    /// Negative or not a number: the default cap instead.
    NotASize,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions {
            format: LogFormat::Text,
            max_bytes: None,
            max_bytes_adjusted: None,
        }
    }
}

impl LogOptions {
    /// `logMaxBytes` as the config holds it, made a cap. No value fails: the config is the
    /// node's pod networking, the log is only its record.
    pub fn with_max_bytes(format: LogFormat, value: Option<&serde_json::Value>) -> LogOptions {
        let whole = value.and_then(|v| {
            v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .map(|f| f as u64)
            })
        });
        let (max_bytes, max_bytes_adjusted) = match (value, whole) {
            (None | Some(serde_json::Value::Null), _) => (None, None),
            (_, Some(0)) => (Some(0), None),
            (_, Some(bytes)) if bytes < MIN_MAX_BYTES => {
                (Some(MIN_MAX_BYTES), Some(MaxBytesAdjusted::Raised(bytes)))
            }
            (_, Some(bytes)) => (Some(bytes), None),
            (Some(_), None) => (None, Some(MaxBytesAdjusted::NotASize)),
        };
        LogOptions {
            format,
            max_bytes,
            max_bytes_adjusted,
        }
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
    /// The file this process appends to; another once a rotation renamed it away.
    file: RefCell<Option<File>>,
    path: Option<PathBuf>,
    options: LogOptions,
    /// (verb, outcome) of every event so far, for the metrics (`cni::metrics`).
    outcomes: RefCell<Vec<(Verb, Outcome)>>,
}

impl Log {
    pub fn open(path: Option<&Path>, options: LogOptions) -> Log {
        let file = path.and_then(|path| {
            open_append(path)
                .map_err(|e| {
                    // A broken log must not fail the pod's network setup.
                    stderr_line!(
                        "sandbox-guard: cannot open logFile {}: {e}; logging to stderr only",
                        path.display()
                    );
                })
                .ok()
        });
        Log {
            file: RefCell::new(file),
            path: path.map(Path::to_path_buf),
            options,
            outcomes: RefCell::new(Vec::new()),
        }
    }

    pub fn has_outcomes(&self) -> bool {
        !self.outcomes.borrow().is_empty()
    }

    /// The events logged so far, taken: each is counted once.
    pub fn take_outcomes(&self) -> Vec<(Verb, Outcome)> {
        std::mem::take(&mut *self.outcomes.borrow_mut())
    }

    pub fn event(&self, level: Level, verb: Verb, subject: &Subject, outcome: Outcome, text: &str) {
        self.event_with(level, verb, subject, outcome, &[], text);
    }

    /// An event with fields for programs after the outcome. Keys are single lower-case words;
    /// values are names and IDs the guard validated (written escaped all the same).
    pub fn event_with(
        &self,
        level: Level,
        verb: Verb,
        subject: &Subject,
        outcome: Outcome,
        fields: &[(&str, &str)],
        text: &str,
    ) {
        self.outcomes.borrow_mut().push((verb, outcome));
        let time = crate::clock::now_rfc3339();
        let event = Event {
            time: &time,
            level,
            verb,
            subject,
            outcome,
            fields,
            text,
        };
        if self.file.borrow().is_some() {
            let note = || {
                let text = match self.options.max_bytes_adjusted? {
                    MaxBytesAdjusted::Raised(bytes) => {
                        format!("logMaxBytes {bytes} is below {MIN_MAX_BYTES}: the log rotates at {MIN_MAX_BYTES} bytes instead")
                    }
                    MaxBytesAdjusted::NotASize => {
                        "logMaxBytes is not a number of bytes: the log rotates at the default size instead".to_string()
                    }
                };
                let note = Event {
                    level: Level::Warn,
                    outcome: Outcome::LogCap,
                    fields: &[],
                    text: &text,
                    ..event
                };
                Some(note.line(self.options.format))
            };
            self.append(&event.line(self.options.format), note);
        }
        if level != Level::Info {
            // Never a panic: the runtime that reads our stderr may be gone.
            let _ = std::io::stderr().write_all(event.line(LogFormat::Text).as_bytes());
        }
    }
}

/// One line's contents.
#[derive(Clone, Copy)]
struct Event<'a> {
    time: &'a str,
    level: Level,
    verb: Verb,
    subject: &'a Subject<'a>,
    outcome: Outcome,
    fields: &'a [(&'a str, &'a str)],
    text: &'a str,
}

impl Event<'_> {
    fn line(&self, format: LogFormat) -> String {
        let level = match self.level {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        };
        let subject = self.subject;
        let pod = subject.pod.as_deref().unwrap_or("-");
        match format {
            LogFormat::Text => {
                let fields: String = self
                    .fields
                    .iter()
                    .map(|(key, value)| format!("{key}={} ", escaped(value, Part::Value)))
                    .collect();
                format!(
                    "{} sandbox-guard[{}] {level} {} network={} container={} ifname={} pod={} outcome={} {fields}{}\n",
                    self.time,
                    std::process::id(),
                    self.verb.name(),
                    escaped(subject.network, Part::Value),
                    escaped(subject.container_id, Part::Value),
                    escaped(subject.if_name, Part::Value),
                    escaped(pod, Part::Value),
                    escaped(self.outcome.as_str(), Part::Value),
                    escaped(self.text, Part::Text),
                )
            }
            LogFormat::Json => {
                let mut object = serde_json::Map::new();
                object.insert("time".into(), serde_json::json!(self.time));
                object.insert("pid".into(), serde_json::json!(std::process::id()));
                for (key, value) in [
                    ("level", level),
                    ("verb", self.verb.name()),
                    ("network", subject.network),
                    ("container", subject.container_id),
                    ("ifname", subject.if_name),
                    ("pod", pod),
                    ("outcome", self.outcome.as_str()),
                ] {
                    object.insert(key.to_string(), serde_json::json!(value));
                }
                for (key, value) in self.fields {
                    object.insert((*key).to_string(), serde_json::json!(value));
                }
                object.insert("msg".to_string(), serde_json::json!(self.text));
                format!("{}\n", serde_json::Value::Object(object))
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    /// A field's value: one word.
    Value,
    /// The text at the end of the line.
    Text,
}

/// `text` for a text-format line: control characters (and the Unicode line separators)
/// escaped, so that it cannot end the line; in a value, spaces too, so it cannot end the
/// value; in the text, the `=` of a first word that would read as one more field.
fn escaped(text: &str, part: Part) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || (part == Part::Value && c == ' ')
    };
    let first_word = text.split(' ').next().unwrap_or("");
    let forges_field = part == Part::Text
        && first_word
            .split_once('=')
            .is_some_and(|(key, _)| key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
    if !forges_field && !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for (at, c) in text.char_indices() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '=' if forges_field && at < first_word.len() => out.push_str("\\x3d"),
            c if unsafe_char(c) && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
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

    /// Appends `line` within the cap (see the module's doc); `note` is the line a file the
    /// rotation starts opens with. Best effort: a log that cannot rotate keeps growing and
    /// says so on stderr; nothing here fails the operation.
    fn append(&self, line: &str, note: impl Fn() -> Option<String>) {
        let Some(path) = self.path.as_deref() else {
            return;
        };
        let mut slot = self.file.borrow_mut();
        if self.options.max_bytes == Some(0) {
            // Never rotated: O_APPEND alone keeps concurrent lines whole.
            if let Some(mut file) = slot.as_ref() {
                let _ = file.write_all(line.as_bytes());
            }
            return;
        }
        let mut rotated = false;
        // A rotation by another process between our open and our lock moves us on to the new
        // file; three in a row within one line's time means writers far busier than a node's.
        for _ in 0..3 {
            let Some(file) = slot.as_ref() else {
                return not_in_file(path, "it could not be opened again", line);
            };
            if !lock_within(file, LOCK_WAIT) {
                return not_in_file(path, &format!("it stayed locked for {LOCK_WAIT:?}"), line);
            }
            let (Ok(meta), Ok(named)) = (file.metadata(), std::fs::symlink_metadata(path)) else {
                // The path is gone: another writer has just rotated our file to `.1` and no
                // line has made the new one yet (or it was removed by hand). Writing on would
                // grow `.1` past the cap; the line goes to a new file at the path instead.
                let _ = file.unlock();
                *slot = open_append(path).ok();
                continue;
            };
            if (named.ino(), named.dev()) != (meta.ino(), meta.dev()) {
                let _ = file.unlock();
                *slot = open_append(path).ok();
                continue;
            }
            let cap = self.cap(file, meta.len() + line.len() as u64);
            if meta.len() > 0 && meta.len() + line.len() as u64 > cap {
                match rotate(path) {
                    Ok(()) => {
                        let _ = file.unlock();
                        *slot = open_append(path).ok();
                        rotated = true;
                        continue;
                    }
                    Err(e) => stderr_line!(
                        "sandbox-guard: cannot rotate logFile {}: {e}",
                        path.display()
                    ),
                }
            }
            let text = match (rotated && meta.len() == 0).then(&note).flatten() {
                Some(note) => Cow::Owned(note + line),
                None => Cow::Borrowed(line),
            };
            let _ = (&*file).write_all(text.as_bytes());
            let _ = file.unlock();
            return;
        }
        not_in_file(path, "it was rotated under every attempt to write", line);
    }
}

/// A line that could not be written within the bound goes to stderr, saying why.
fn not_in_file(path: &Path, why: &str, line: &str) {
    let _ = write!(
        std::io::stderr(),
        "sandbox-guard: this line is not in logFile {} ({why}): {line}",
        path.display()
    );
}

/// `<file>` to `<file>.1`, `.1` to `.2` ... The caller holds the lock of the file `path` names.
fn rotate(path: &Path) -> std::io::Result<()> {
    let backup = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    for n in (1..LOG_BACKUPS).rev() {
        match std::fs::rename(backup(n), backup(n + 1)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(path, backup(1))
}

/// The exclusive flock of `file`, waiting at most `wait`: writers hold it for one write.
fn lock_within(file: &File, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return true,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(_) => return false,
        }
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
    fstatfs(file)
        .is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC || fs.filesystem_type() == RAMFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ADD's `added` line, as the verb logs it.
    fn added(log: &Log, subject: &Subject, text: &str) {
        log.event(Level::Info, Verb::Add, subject, Outcome::Added, text);
    }

    /// An empty dir of its own and the log's path in it.
    fn fresh_log(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("guard.log");
        (dir, path)
    }

    #[test]
    fn a_full_log_rotates_keeping_its_backups() {
        let (dir, path) = fresh_log("sg-log-test");
        let subject = Subject {
            network: "net",
            container_id: "aaa",
            if_name: "eth0",
            pod: None,
        };
        for format in [LogFormat::Text, LogFormat::Json] {
            for _ in 0..40 {
                let log = Log::open(
                    Some(&path),
                    LogOptions {
                        format,
                        max_bytes: Some(1000),
                        ..LogOptions::default()
                    },
                );
                added(&log, &subject, "generation=1");
            }
        }
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        assert!(size(&path) <= 1000, "{}", size(&path));
        for n in 1..=LOG_BACKUPS {
            // Full: the next line would not have fitted.
            let backup = PathBuf::from(format!("{}.{n}", path.display()));
            assert!(
                size(&backup) > 600 && size(&backup) <= 1000,
                "{}: {}",
                backup.display(),
                size(&backup)
            );
        }
        assert!(!PathBuf::from(format!("{}.{}", path.display(), LOG_BACKUPS + 1)).exists());
        let newest = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            newest
                .lines()
                .all(|l| LogEntry::parse(l).is_some_and(|e| e.field("outcome") == Some("added"))),
            "{newest}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_log_max_bytes_value_makes_a_cap() {
        use serde_json::json;
        let cases = [
            (json!(null), None, None),
            (json!(0), Some(0), None),
            (
                json!(1),
                Some(MIN_MAX_BYTES),
                Some(MaxBytesAdjusted::Raised(1)),
            ),
            (
                json!(4095.9),
                Some(MIN_MAX_BYTES),
                Some(MaxBytesAdjusted::Raised(4095)),
            ),
            (json!(4096), Some(4096), None),
            (json!(u64::MAX), Some(u64::MAX), None),
            (json!(-1), None, Some(MaxBytesAdjusted::NotASize)),
            (json!("10MiB"), None, Some(MaxBytesAdjusted::NotASize)),
            (json!(f64::MAX), Some(u64::MAX), None),
        ];
        for (value, max_bytes, adjusted) in cases {
            let options = LogOptions::with_max_bytes(LogFormat::Text, Some(&value));
            assert_eq!(
                (options.max_bytes, options.max_bytes_adjusted),
                (max_bytes, adjusted),
                "{value}"
            );
        }
        assert_eq!(
            LogOptions::with_max_bytes(LogFormat::Text, None).max_bytes,
            None
        );
    }

    #[test]
    fn a_writer_stopped_holding_the_lock_costs_a_line_its_place_not_the_operation_its_time() {
        let (dir, path) = fresh_log("sg-log-held");
        let subject = Subject {
            network: "net",
            container_id: "aaa",
            if_name: "eth0",
            pod: None,
        };
        let options = LogOptions {
            max_bytes: Some(MIN_MAX_BYTES),
            ..LogOptions::default()
        };
        Log::open(Some(&path), options).event(
            Level::Info,
            Verb::Add,
            &subject,
            Outcome::Added,
            "first",
        );
        let holder = File::open(&path).unwrap();
        holder.lock().unwrap();
        let started = Instant::now();
        Log::open(Some(&path), options).event(
            Level::Info,
            Verb::Add,
            &subject,
            Outcome::Added,
            "second",
        );
        assert!(started.elapsed() < LOCK_WAIT * 5, "{:?}", started.elapsed());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            1,
            "the line went to stderr"
        );
        drop(holder);
        Log::open(Some(&path), options).event(
            Level::Info,
            Verb::Add,
            &subject,
            Outcome::Added,
            "third",
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_text_cannot_forge_a_line_or_a_field() {
        let (dir, path) = fresh_log("sg-log-forge");
        let subject = Subject {
            network: "net",
            container_id: "aaa",
            if_name: "eth0",
            pod: None,
        };
        let forged = "2026-01-02T03:04:05Z sandbox-guard[42] WARN DEL network=net container=bbb ifname=eth0 pod=ns/p outcome=refused cause=stale-del owner=ccc stale";
        let log = Log::open(Some(&path), LogOptions::default());
        log.event(
            Level::Error,
            Verb::Add,
            &subject,
            Outcome::Error,
            &format!("the primary failed: boom\n{forged}\r\n{forged}"),
        );
        log.event(
            Level::Error,
            Verb::Add,
            &subject,
            Outcome::Error,
            "cause=stale-del owner=ccc the primary's words",
        );
        log.event_with(
            Level::Warn,
            Verb::Del,
            &subject,
            Outcome::Refused,
            &[("owner", "x y\nz")],
            "text",
        );
        let written = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 3, "{written}");
        for line in &lines {
            let entry = LogEntry::parse(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(entry.field("cause"), None, "{line}");
            assert_eq!(entry.field("container"), Some("aaa"), "{line}");
        }
        assert!(
            lines[0].contains("boom\\n2026"),
            "the newline is shown, escaped: {}",
            lines[0]
        );
        assert_eq!(
            LogEntry::parse(lines[2]).unwrap().field("owner"),
            Some("x\\x20y\\nz"),
            "{}",
            lines[2]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The window of a rotation: another writer has renamed the file this one holds open to
    /// `.1`, and no line has made the new file yet. The line must not go into `.1`.
    #[test]
    fn a_line_after_another_writers_rotation_goes_to_the_new_file() {
        let (dir, path) = fresh_log("sg-log-rot");
        std::fs::write(&path, "x".repeat(4000) + "\n").unwrap();
        let subject = Subject {
            network: "net",
            container_id: "c",
            if_name: "eth0",
            pod: None,
        };
        let log = Log::open(
            Some(&path),
            LogOptions {
                max_bytes: Some(4096),
                ..LogOptions::default()
            },
        );
        std::fs::rename(&path, dir.join("guard.log.1")).unwrap();
        added(&log, &subject, "generation=1");
        assert_eq!(
            std::fs::metadata(dir.join("guard.log.1")).unwrap().len(),
            4001,
            "the line went into the rotated file"
        );
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            now.contains("outcome=added"),
            "{now:?} {:?}",
            std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parallel_writers_never_push_a_file_past_its_cap() {
        let (dir, path) = fresh_log("sg-log-par");
        let cap = 4096;
        let writers: Vec<_> = (0..16)
            .map(|n| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let container = format!("c{n}");
                    let subject = Subject {
                        network: "net",
                        container_id: &container,
                        if_name: "eth0",
                        pod: None,
                    };
                    for _ in 0..50 {
                        // Each its own open file, as each plugin process has.
                        let log = Log::open(
                            Some(&path),
                            LogOptions {
                                max_bytes: Some(cap),
                                ..LogOptions::default()
                            },
                        );
                        added(
                            &log,
                            &subject,
                            "generation=1 and some words to fill the line",
                        );
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        for name in ["guard.log", "guard.log.1", "guard.log.2"] {
            let size = std::fs::metadata(dir.join(name))
                .map(|m| m.len())
                .unwrap_or(0);
            assert!(size <= cap, "{name}: {size} bytes, over {cap}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
