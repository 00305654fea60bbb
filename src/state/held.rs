//! What a DEL rule 7 holds keeps of its hold: the API server's pod of the name when it was
//! held and the kubeconfig it was asked with. A deferred DEL (delegate mode) and a refused
//! DEL's record (chained mode) carry it, so a later ask goes as the first did, and an API
//! that does not answer then cannot let the DEL through.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The pod the API server showed under the name when the DEL was held, and what the held
/// DEL's own network asks the API with: a sweep of another network (one state dir serves
/// several) judges it by these, not by its own config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MovedTo {
    pub pod_uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub kubeconfig: std::path::PathBuf,
    /// `podKeyScope`'s word.
    pub scope: String,
    pub this_node: String,
}

/// What the installer leaves in place of its kubeconfig when the API server's view is turned
/// off, and what an operator writes over a kubeconfig of their own to say the same: the one
/// sign that lets a held DEL go by the local rule. A missing file is no such sign: the
/// operator may have moved it, and a DEL's config may be one cached before the view.
pub const VIEW_OFF: &str = "{\"apiServerView\": \"off\"}\n";

/// The most of a held DEL's kubeconfig read to tell the off sign: the sign is a few bytes.
const VIEW_OFF_READ: u64 = 4096;

/// What the kubeconfig a DEL was held with says now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldWith {
    /// Something is there: the hold asks with it.
    Present,
    /// Nothing is there (not merely unreadable).
    Gone,
    /// `VIEW_OFF` is there.
    TurnedOff,
}

impl MovedTo {
    pub fn held_with(&self) -> HeldWith {
        held_with_at(&self.kubeconfig)
    }
}

/// What the kubeconfig at `path` says now. Reads a regular file only, never through a
/// symlink, never blocking: what cannot be read is `Present`, and an ask with it fails. The
/// sign counts only in a file of this user's that no one else can write, as a kubeconfig must
/// be: a folder others can write in must not let them lift the holds.
pub fn held_with_at(path: &Path) -> HeldWith {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HeldWith::Gone,
        Err(_) => return HeldWith::Present,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { nix::libc::geteuid() };
    let trusted = file.metadata().is_ok_and(|m| {
        m.is_file() && m.len() <= VIEW_OFF_READ && m.uid() == me && m.mode() & 0o022 == 0
    });
    let mut bytes = Vec::new();
    if !trusted || file.take(VIEW_OFF_READ).read_to_end(&mut bytes).is_err() {
        return HeldWith::Present;
    }
    match is_view_off(&bytes) {
        true => HeldWith::TurnedOff,
        false => HeldWith::Present,
    }
}

/// Whether a kubeconfig's bytes are the off sign: JSON whose `apiServerView` is `"off"`,
/// however it is spaced.
pub fn is_view_off(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .is_ok_and(|doc| doc.get("apiServerView").and_then(|v| v.as_str()) == Some("off"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_dels_kubeconfig_is_off_only_where_it_holds_the_sign() {
        let dir = std::env::temp_dir().join(format!("sg-held-with-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let moved = |name: &str| MovedTo {
            pod_uid: "u".into(),
            node: None,
            kubeconfig: dir.join(name),
            scope: "cluster".into(),
            this_node: "n".into(),
        };
        assert_eq!(moved("none").held_with(), HeldWith::Gone);
        std::fs::write(dir.join("off"), VIEW_OFF).unwrap();
        assert_eq!(moved("off").held_with(), HeldWith::TurnedOff);
        std::fs::write(dir.join("compact"), r#"{"apiServerView":"off"}"#).unwrap();
        assert_eq!(moved("compact").held_with(), HeldWith::TurnedOff);
        std::fs::write(dir.join("config"), r#"{"kind":"Config"}"#).unwrap();
        assert_eq!(moved("config").held_with(), HeldWith::Present);
        // The sign in a file others may write is no sign.
        std::fs::write(dir.join("open"), VIEW_OFF).unwrap();
        std::fs::set_permissions(
            dir.join("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
        assert_eq!(moved("open").held_with(), HeldWith::Present);
        std::fs::write(dir.join("empty"), "").unwrap();
        assert_eq!(moved("empty").held_with(), HeldWith::Present);
        // Never through a symlink, never a FIFO read: both are there, and not the sign.
        std::os::unix::fs::symlink(dir.join("off"), dir.join("link")).unwrap();
        assert_eq!(moved("link").held_with(), HeldWith::Present);
        nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(moved("fifo").held_with(), HeldWith::Present);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
