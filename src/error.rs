//! The one error type of the plugin and its mapping to CNI error codes.
//!
//! Every failure a runtime or an operator can cause ends here, so the code a runtime sees
//! is decided in exactly one place (`GuardError::code`).

use std::fmt;
use std::io;
use std::path::Path;

/// What went wrong, in the terms the CNI spec gives error codes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The config asks for a CNI version or verb this version does not support.
    IncompatibleVersion,
    /// A `CNI_*` variable is missing or not plain.
    InvalidEnvironment,
    /// The state directory or a file in it could not be used.
    Io,
    /// Input that is not the JSON (or the result) it claims to be.
    Decode,
    /// JSON that decodes but is not a valid configuration for this plugin.
    InvalidConfig,
    /// A DEL for a sandbox that no longer owns its pod; the runtime should retry later.
    StaleDel,
    /// The state dir's lock stayed held past the wait; the runtime should retry later.
    Busy,
    /// The state dir is on a read-only filesystem.
    ReadOnly,
    /// STATUS: the plugin cannot serve ADDs now.
    NotAvailable,
    /// CHECK found the attachment different from its checkpoint.
    CheckFailed,
    /// A checkpoint failed its checksum; it was set aside and a DEL needing it is refused.
    SetAside,
    /// ADD: another sandbox's live network namespace still holds one of the new addresses.
    IpConflict,
    /// The kernel refused or could not answer a netlink request (link facts, CHECK, restore).
    Netlink,
    /// A sandbox's netns path no longer exists: the sandbox is dead.
    NetnsGone,
    /// Delegate mode: the primary answered with this CNI error code; `GuardError::verbatim`
    /// holds its error JSON, which goes to the runtime unchanged.
    Delegate(u32),
    /// Delegate mode: the primary could not be run, or failed without a CNI error.
    DelegateBroken,
    /// Delegate mode: an ADD of a sandbox that a newer live sandbox of its pod has superseded.
    Superseded,
    /// Delegate mode: the runtime that ran this verb is gone (nobody reads its answer), and
    /// the primary was killed, as the runtime's own kill would have done.
    Unheard,
}

#[derive(Debug)]
pub struct GuardError {
    pub kind: Kind,
    pub msg: String,
    pub details: String,
    /// An error object of the delegate's, passed on as it wrote it (code, msg, details).
    pub verbatim: Option<String>,
    /// The failure underneath (the system call's, the parser's), for whoever walks the chain
    /// (`std::error::Error::source`); `msg` already says it in words.
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

pub type Result<T> = std::result::Result<T, GuardError>;

impl GuardError {
    pub fn new(kind: Kind, msg: impl Into<String>) -> GuardError {
        GuardError {
            kind,
            msg: msg.into(),
            details: String::new(),
            verbatim: None,
            source: None,
        }
    }

    pub fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> GuardError {
        self.source = Some(Box::new(source));
        self
    }

    pub fn with_details(mut self, details: impl Into<String>) -> GuardError {
        self.details = details.into();
        self
    }

    /// An I/O failure on `path`: what happened in `msg`, the way out for the failures
    /// operators meet in `details`.
    pub fn io(action: &str, path: &Path, err: io::Error) -> GuardError {
        let (kind, way_out) = match err.raw_os_error() {
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) => (
                Kind::Io,
                "the filesystem is full: free space there or point stateDir at another filesystem",
            ),
            Some(nix::libc::EROFS) => (
                Kind::ReadOnly,
                "the filesystem is read-only (ext4 remounts read-only after an error: see dmesg); \
                 remount it read-write after fsck, or point stateDir at a writable filesystem",
            ),
            Some(nix::libc::EACCES) | Some(nix::libc::EPERM) => (
                Kind::Io,
                "the plugin runs as root from the runtime: check the mode and owner of the state dir",
            ),
            Some(nix::libc::ELOOP) => (
                Kind::Io,
                "it is a symbolic link, which the state dir never follows: remove the link",
            ),
            _ => (Kind::Io, ""),
        };
        GuardError::new(kind, format!("cannot {action} {}: {err}", path.display()))
            .with_details(way_out)
            .with_source(err)
    }

    /// The CNI error code; plugin-specific codes start at 100 as the spec reserves.
    pub fn code(&self) -> u32 {
        match self.kind {
            Kind::IncompatibleVersion => 1,
            Kind::InvalidEnvironment => 4,
            Kind::Io | Kind::ReadOnly => 5,
            Kind::Decode => 6,
            Kind::InvalidConfig => 7,
            Kind::StaleDel | Kind::Busy | Kind::Unheard => 11,
            Kind::NotAvailable => 50,
            Kind::CheckFailed => 100,
            Kind::SetAside => 101,
            Kind::IpConflict => 102,
            Kind::Netlink | Kind::NetnsGone => 5,
            Kind::Delegate(code) => code,
            Kind::DelegateBroken => 103,
            Kind::Superseded => 104,
        }
    }

    /// The error object a runtime reads from stdout.
    pub fn to_cni_json(&self, cni_version: &str) -> String {
        if let Some(verbatim) = &self.verbatim {
            return verbatim.clone();
        }
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.msg,
            "details": self.details,
        })
        .to_string()
    }
}

impl std::error::Error for GuardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn an_io_error_keeps_the_system_call_s_error_as_its_source() {
        let err = GuardError::io(
            "write",
            Path::new("/var/lib/cni/sandbox-guard/records/x"),
            io::Error::from_raw_os_error(nix::libc::ENOSPC),
        );
        assert_eq!(err.code(), 5);
        let source = err.source().expect("a source");
        let io = source.downcast_ref::<io::Error>().expect("an io::Error");
        assert_eq!(io.raw_os_error(), Some(nix::libc::ENOSPC));
        assert!(err.msg.ends_with(&io.to_string()), "{}", err.msg);
        assert!(GuardError::new(Kind::Busy, "held").source().is_none());
    }

    #[test]
    fn a_decode_error_keeps_the_parser_s_error_as_its_source() {
        let err = crate::cni::config::NetConf::parse(b"{").unwrap_err();
        assert_eq!(err.code(), 6);
        assert!(err.source().is_some_and(|s| s.is::<serde_json::Error>()));
    }
}
