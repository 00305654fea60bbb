//! Checks that a name coming from a runtime is plain before it is used in a path, a log
//! line or a comparison. The limits keep `<network>:<containerID>:<ifname>`, and the
//! names derived from it (a set-aside copy adds `~<nanoseconds>`), under the 255-byte
//! file-name limit.

use crate::error::{GuardError, Kind, Result};

/// How a pod is shown everywhere the guard names one: `namespace/name`, the bare name when
/// the runtime gave no namespace (podman), `-` when it gave no name.
pub fn pod_text(namespace: Option<&str>, name: Option<&str>) -> String {
    match (namespace, name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "-".to_string(),
    }
}

pub const MAX_NETWORK: usize = 64;
pub const MAX_CONTAINER_ID: usize = 128;
pub const MAX_IFNAME: usize = 15;
pub const MAX_POD_FIELD: usize = 253;

/// The CNI spec's rule for container IDs and network names: an alphanumeric first, then
/// alphanumerics, `_`, `.` and `-`. `..` is refused too so that no name reads as a path.
pub fn check_plain(what: &str, value: &str, max: usize, kind: Kind) -> Result<()> {
    let first_ok = value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if value.len() > max || !first_ok || !rest_ok || value.contains("..") {
        return Err(GuardError::new(kind, format!("{what} {:?} is not plain", shorten(value))).with_details(format!(
            "use at most {max} characters from [A-Za-z0-9_.-], starting with a letter or digit, without \"..\""
        )));
    }
    Ok(())
}

/// Linux interface names: 1 to 15 bytes, no `/`, `:`, white space or control characters,
/// and not `.` or `..` (what the kernel's dev_valid_name accepts, minus `:` aliases), and no
/// `~`: the store's file names join their parts with `:` and a kept copy's time with `~`,
/// so a name holding either would be read back as another attachment.
pub fn check_ifname(value: &str) -> Result<()> {
    let bad_char = value.chars().any(|c| {
        c == '/' || c == ':' || c == '~' || c.is_whitespace() || c.is_control() || !c.is_ascii()
    });
    if value.is_empty() || value.len() > MAX_IFNAME || bad_char || value == "." || value == ".." {
        return Err(GuardError::new(
            Kind::InvalidEnvironment,
            format!(
                "CNI_IFNAME {:?} is not a valid interface name",
                shorten(value)
            ),
        )
        .with_details(format!(
            "use 1 to {MAX_IFNAME} ASCII characters without '/', ':', '~' or spaces"
        )));
    }
    Ok(())
}

/// The first 13 characters of a container ID, as crictl prints them: enough to tell sandboxes
/// apart in a message a person reads.
pub fn short_id(container_id: &str) -> &str {
    container_id.get(..13).unwrap_or(container_id)
}

/// Keeps hostile input from flooding an error message or a log line.
pub fn shorten(value: &str) -> String {
    const SHOWN: usize = 64;
    if value.chars().count() <= SHOWN {
        value.to_string()
    } else {
        let head: String = value.chars().take(SHOWN).collect();
        format!("{head}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass() {
        for name in ["etcd1-0", "a", "0b1c", "pod.with.dots", "under_score"] {
            check_plain("x", name, 253, Kind::InvalidEnvironment).unwrap();
        }
    }

    #[test]
    fn names_that_could_escape_a_path_fail() {
        let long = "a".repeat(254);
        for name in [
            "",
            "../etc",
            "a/b",
            "a..b",
            ".hidden",
            "-flag",
            "a\0b",
            "a b",
            long.as_str(),
        ] {
            assert!(
                check_plain("x", name, 253, Kind::InvalidEnvironment).is_err(),
                "{name:?}"
            );
        }
    }

    #[test]
    fn longest_derived_file_name_fits() {
        let record = MAX_NETWORK + 1 + MAX_CONTAINER_ID + 1 + MAX_IFNAME;
        let set_aside_suffix = 1 + u128::MAX.to_string().len();
        assert!(record + set_aside_suffix <= 255);
    }

    #[test]
    fn ifnames() {
        check_ifname("eth0").unwrap();
        check_ifname("net1@x").unwrap();
        for name in [
            "",
            ".",
            "..",
            "a/b",
            "eth0:1",
            "eth~1",
            "with space",
            "sixteen-chars-xx",
        ] {
            assert!(check_ifname(name).is_err(), "{name:?}");
        }
    }
}
