//! Operation log: one line per operation to the configured log file, warnings and errors
//! also to stderr. Never stdout, which belongs to the CNI result.
//!
//! Writers log while they hold the store lock, so the file's order is the order in which
//! operations took effect.

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
        let line = format!(
            "{} sandbox-guard[{}] {} {} network={} container={} ifname={} pod={} outcome={outcome} {text}\n",
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
