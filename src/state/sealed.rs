//! Files that carry their own sha256, written atomically (and durably where asked).
//!
//! On disk: `{"formatVersion":2,"checksum":"sha256:<hex>","record":<record>}`. The checksum
//! covers the exact bytes of `<record>`, so verifying needs no re-serialisation. A file
//! without `formatVersion` is of format 1 (releases before it) and reads alike; one of a
//! format newer than this release knows is never trusted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::error::{GuardError, Result};

const MAX_SEALED_FILE: u64 = 4 << 20;

/// The store's format: 2 is the boot-scoped store of plain files (`boot`). Files without a
/// version are of format 1 (every release before), read as they are.
pub const FORMAT_VERSION: u32 = 2;

/// What reading a sealed file found.
#[derive(Debug)]
pub enum Loaded<T> {
    Missing,
    Valid(T),
    /// The file exists but fails its checksum or does not decode: never trusted.
    Corrupt {
        path: PathBuf,
        reason: String,
    },
}

/// Opens without following a symlink and without blocking on a planted FIFO.
pub fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
}

pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Loaded<T>> {
    read_file(path, false)
}

/// Reads a store entry: a file, or the symlink entry (`read_entry`) that releases before
/// wrote for ownerships, address index entries and, on a journal, records.
pub fn read_any<T: DeserializeOwned>(path: &Path) -> Result<Loaded<T>> {
    read_file(path, true)
}

/// `or_entry`: a symlink there is read as an entry (`read_entry`) instead of refused.
fn read_file<T: DeserializeOwned>(path: &Path, or_entry: bool) -> Result<Loaded<T>> {
    match open_nofollow(path) {
        Ok(file) => read_opened(&file, path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Loaded::Missing),
        Err(e) if or_entry && e.raw_os_error() == Some(nix::libc::ELOOP) => read_entry(path),
        Err(e) => Err(GuardError::io("open checkpoint", path, e)),
    }
}

fn read_opened<T: DeserializeOwned>(file: &File, path: &Path) -> Result<Loaded<T>> {
    let meta = file
        .metadata()
        .map_err(|e| GuardError::io("stat checkpoint", path, e))?;
    if !meta.file_type().is_file() {
        return Err(GuardError::io(
            "read checkpoint",
            path,
            io::Error::other("not a regular file: remove it from the state dir"),
        ));
    }
    // No checkpoint comes near this (a prevResult is at most 1 MiB): a larger file was not
    // written by the plugin, and reading it whole could exhaust memory.
    if meta.len() > MAX_SEALED_FILE {
        return Ok(Loaded::Corrupt {
            path: path.to_path_buf(),
            reason: format!(
                "it is {} bytes, larger than any checkpoint ({MAX_SEALED_FILE})",
                meta.len()
            ),
        });
    }
    // A sealed file is whole once it has a name (written unnamed, or under a temp name, then
    // linked or renamed in): its size at open is all there is, so no further read looks for
    // the end. One that came out shorter fails its checksum below.
    let mut bytes = vec![0; meta.len() as usize];
    let mut filled = 0;
    let mut reader = file;
    while filled < bytes.len() {
        match reader.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(GuardError::io("read checkpoint", path, e)),
        }
    }
    bytes.truncate(filled);
    // A compacted text copied into a file as it was (a release that wrote records' symlinks
    // uncompacted copies them so when it rewrites them as files) reads as its symlink did.
    // Only one of a target's length is expanded: a longer file of codes would grow tenfold.
    if bytes.len() <= MAX_LINK_TARGET + 1 {
        return Ok(verified(&super::entry_text::expand(&bytes), path));
    }
    Ok(verified(&bytes, path))
}

fn verified<T: DeserializeOwned>(bytes: &[u8], path: &Path) -> Loaded<T> {
    match verify::<T>(bytes) {
        Ok(value) => Loaded::Valid(value),
        Err(reason) => Loaded::Corrupt {
            path: path.to_path_buf(),
            reason,
        },
    }
}

/// Reads an entry that `write_entry` wrote: a symlink whose target is the sealed text (a
/// record's compacted, see `entry_text`), read with readlink and never followed. A regular
/// file holding the same text (what releases before the symlink form wrote, and the fallback
/// for a text too long for a target) reads as `read` reads it.
pub fn read_entry<T: DeserializeOwned>(path: &Path) -> Result<Loaded<T>> {
    // nix's readlink asks once with room for the longest target; std's starts at 256 bytes and
    // asks again for each doubling, four calls for a record.
    let target = match nix::fcntl::readlink(path).map_err(io::Error::from) {
        Ok(target) => target,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        // EINVAL: there, but no symlink.
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => return read(path),
        Err(e) => return Err(GuardError::io("read checkpoint", path, e)),
    };
    // Not one the store wrote (a sealed text starts with '{', compacted or not): a link
    // planted to point elsewhere fails as a symlink always has in the state dir, it is no
    // damaged entry to overwrite.
    if !target.as_encoded_bytes().starts_with(b"{") {
        return Err(GuardError::new(
            crate::error::Kind::Io,
            format!("{} is a symbolic link to {} that the guard did not write", path.display(), target.display()),
        )
        .with_details("the state dir never follows a link: remove the link (the guard's own hold their sealed text, starting with '{')"));
    }
    Ok(verified(
        &super::entry_text::expand(target.as_encoded_bytes()),
        path,
    ))
}

/// The longest symlink target Linux stores (PATH_MAX, 4096, with its NUL).
const MAX_LINK_TARGET: usize = 4095;

fn verify<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope<'a> {
        #[serde(default)]
        format_version: Option<u32>,
        checksum: &'a str,
        #[serde(borrow)]
        record: &'a RawValue,
    }
    let envelope: Envelope =
        serde_json::from_slice(bytes).map_err(|e| format!("not a sealed checkpoint: {e}"))?;
    if let Some(version) = envelope.format_version.filter(|&v| v > FORMAT_VERSION) {
        return Err(format!(
            "it is of format {version}, which a newer release writes; this one reads up to {}",
            FORMAT_VERSION
        ));
    }
    let expected = format!(
        "sha256:{}",
        hex(&Sha256::digest(envelope.record.get().as_bytes()))
    );
    if envelope.checksum != expected {
        return Err(format!(
            "checksum mismatch: file says {}, content hashes to {expected}",
            envelope.checksum
        ));
    }
    serde_json::from_str(envelope.record.get())
        .map_err(|e| format!("checksum holds but the record does not decode: {e}"))
}

pub fn seal<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising our own plain structs cannot fail.
    let record = serde_json::to_string(value).unwrap_or_default();
    let checksum = hex(&Sha256::digest(record.as_bytes()));
    format!(
        "{{\"formatVersion\":{},\"checksum\":\"sha256:{checksum}\",\"record\":{record}}}\n",
        FORMAT_VERSION
    )
    .into_bytes()
}

/// Writes `dir/name` so that a crash leaves either the old file or the new one, never a
/// mix: a temp file in the same directory, fsync, rename. The caller fsyncs `dir` where the
/// name must be durable too.
pub fn write<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<()> {
    replace(dir, name, &seal(value), Durability::Durable)
        .map_err(|e| GuardError::io("write checkpoint", &dir.join(name), e))
}

/// Puts `sealed` (from `seal`) at `dir/name`, atomically but not durably, and returns the file
/// for a caller that must sync it (`Store::save_record` where no boot scopes the store). A
/// power cut before a sync may leave the new name with its data missing (a file system
/// allocates the blocks at writeback): it then reads as corrupt, never as valid and wrong.
/// `new`: `name` is known to be free, so the data goes into an unnamed file (O_TMPFILE)
/// that is linked in once written: no temp name is created, renamed or left by a kill.
pub fn write_unsynced(dir: &Path, name: &str, sealed: &[u8], new: bool) -> Result<File> {
    let path = dir.join(name);
    let written = if new {
        link_new(dir, &path, sealed)
    } else {
        None
    }
    .unwrap_or_else(|| {
        let temp = temp_path(dir);
        let written = write_temp(&temp, sealed, Durability::Hint)
            .and_then(|file| fs::rename(&temp, &path).map(|()| file));
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written
    });
    written.map_err(|e| GuardError::io("write checkpoint", &path, e))
}

/// Writes an unnamed file in `dir` and links it in at `path`; `None` where the file system
/// or the process cannot (no O_TMPFILE, no CAP_DAC_READ_SEARCH for AT_EMPTY_PATH, `path`
/// taken after all): the caller goes the temp file's way.
fn link_new(dir: &Path, path: &Path, bytes: &[u8]) -> Option<io::Result<File>> {
    use nix::fcntl::{AT_FDCWD, AtFlags};
    let mut file = OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_TMPFILE | nix::libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    if let Err(e) = file.write_all(bytes) {
        return Some(Err(e));
    }
    nix::unistd::linkat(&file, "", AT_FDCWD, path, AtFlags::AT_EMPTY_PATH).ok()?;
    Some(Ok(file))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync before the rename: the file survives a power cut.
    Durable,
    /// No fsync: for hints that every reader verifies anyway, where a power cut may lose
    /// the newest version but never leaves a torn one.
    Hint,
}

/// Replaces `dir/name` atomically with `bytes` (temp file in the same directory, rename).
pub fn replace(dir: &Path, name: &str, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let temp = temp_path(dir);
    let written =
        write_temp(&temp, bytes, durability).and_then(|_| fs::rename(&temp, dir.join(name)));
    if written.is_err() {
        // Leave nothing half-written behind, even on ENOSPC.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Named by pid alone: a process writes one file at a time, and deriving the temp name from
/// the final one could push it past the 255-byte limit.
fn temp_path(dir: &Path) -> PathBuf {
    dir.join(format!(".{}.tmp", std::process::id()))
}

fn write_temp(temp: &Path, bytes: &[u8], durability: Durability) -> io::Result<File> {
    // A temp file left by a killed process with our pid would make create_new fail; it is
    // ours to replace (remove_file removes a link itself, never its target).
    let _ = fs::remove_file(temp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(temp)?;
    file.write_all(bytes)?;
    if durability == Durability::Durable {
        file.sync_data()?;
    }
    Ok(file)
}

/// Lower-case hex, for checksums and digests.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// An entry reads whole in either form: the file this release writes, and the symlink
    /// whose target is the sealed text that releases before wrote.
    #[test]
    fn either_form_reads() {
        let dir = std::env::temp_dir().join(format!("sg-sealed-either-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let value = serde_json::json!({"a": 1});
        let sealed = seal(&value);
        let target = std::ffi::OsStr::from_bytes(sealed.strip_suffix(b"\n").unwrap());
        std::os::unix::fs::symlink(target, dir.join("link")).unwrap();
        replace(&dir, "file", &sealed, Durability::Hint).unwrap();
        for name in ["link", "file"] {
            let read = read_any::<serde_json::Value>(&dir.join(name));
            assert!(
                matches!(&read, Ok(Loaded::Valid(v)) if *v == value),
                "{name}: {read:?}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Format 1 (no version) and this release's read; a newer format is never trusted.
    #[test]
    fn a_file_of_a_newer_format_is_not_trusted() {
        let sealed = String::from_utf8(seal(&serde_json::json!({"a": 1}))).unwrap();
        assert!(sealed.starts_with("{\"formatVersion\":2,"), "{sealed}");
        let unversioned = sealed.replace("\"formatVersion\":2,", "");
        assert!(verify::<serde_json::Value>(unversioned.as_bytes()).is_ok());
        let newer = sealed.replace("\"formatVersion\":2,", "\"formatVersion\":3,");
        let reason = verify::<serde_json::Value>(newer.as_bytes()).unwrap_err();
        assert!(reason.contains("format 3"), "{reason}");
    }

    /// A release that wrote records' symlinks uncompacted copies a compacted one into a file as
    /// it is when it rewrites it as a file (its `--downgrade`): that file reads as the link did.
    /// A link whose target does not start as a sealed text, compacted or not, is refused even
    /// where its expansion would start like one.
    #[test]
    fn a_compacted_text_reads_from_a_file_and_no_planted_link_reads_as_an_entry() {
        let dir = std::env::temp_dir().join(format!("sg-sealed-compact-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let value = serde_json::json!({"netns": "/run/netns/x", "mtu": 1500});
        let compacted = super::super::entry_text::compact(&seal(&value)).unwrap();
        assert_ne!(compacted, seal(&value));
        replace(&dir, "file", &compacted, Durability::Hint).unwrap();
        assert!(
            matches!(read::<serde_json::Value>(&dir.join("file")), Ok(Loaded::Valid(v)) if v == value)
        );
        let planted = [0x1a]
            .iter()
            .chain(b"10.0.0.0/8\"}")
            .copied()
            .collect::<Vec<u8>>();
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&planted), dir.join("planted"))
            .unwrap();
        assert!(read_entry::<serde_json::Value>(&dir.join("planted")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn round_trip_and_tamper() {
        let sealed = seal(&serde_json::json!({"a": 1}));
        assert!(verify::<serde_json::Value>(&sealed).is_ok());
        let tampered = String::from_utf8(sealed)
            .unwrap()
            .replace("\"a\":1", "\"a\":2");
        assert!(
            verify::<serde_json::Value>(tampered.as_bytes())
                .unwrap_err()
                .contains("checksum mismatch")
        );
        assert!(verify::<serde_json::Value>(b"{\"checksum\":").is_err());
    }
}
