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
pub fn write_unsynced(
    dir: &Path,
    name: &str,
    sealed: &[u8],
    new: bool,
    durability: Durability,
) -> Result<File> {
    let path = dir.join(name);
    let written = if new {
        link_new(dir, &path, sealed)
    } else {
        None
    }
    .unwrap_or_else(|| {
        let temp = temp_path(dir);
        let written = write_temp(&temp, sealed, Durability::Hint)
            .and_then(|file| put_in_place(&temp, &path, durability).map(|()| file));
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
    /// fsync before the name changes: the file survives a power cut.
    Durable,
    /// No fsync: for hints that every reader verifies anyway and that outlive the boot (the
    /// ledger, the counters, notes of cut-off ADDs). Renamed in, so ext4 writes the data out
    /// before a rename that replaces another file commits: a power cut there leaves the old
    /// file or the new one.
    Hint,
    /// No fsync and no writeback asked for: an entry of this boot's folders, which the next
    /// boot's first writer moves aside, so a power cut leaves nothing a reader trusts.
    ThisBoot,
}

/// Replaces `dir/name` atomically with `bytes` (temp file in the same directory, rename).
pub fn replace(dir: &Path, name: &str, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let temp = temp_path(dir);
    let written = write_temp(&temp, bytes, durability)
        .and_then(|_| put_in_place(&temp, &dir.join(name), durability));
    if written.is_err() {
        // Leave nothing half-written behind, even on ENOSPC.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Puts `temp` at `path`, which holds the old file or the new one at every instant. Where
/// `path` holds a file the two are exchanged and the old one, now under the temp name,
/// unlinked: ext4 starts the writeback of a file renamed over another (`auto_da_alloc`), a
/// disk write queued by every verb that rewrites an entry, which an exchange does not ask
/// of it. Where the exchange cannot be made (no such `path`, a file system without it), a
/// rename; a directory at `path` is put back and refused, as rename refuses it.
pub fn rename_over(temp: &Path, path: &Path) -> io::Result<()> {
    if exchange(temp, path).is_err() {
        return fs::rename(temp, path);
    }
    match fs::remove_file(temp) {
        Err(e) if e.raw_os_error() == Some(nix::libc::EISDIR) => {
            exchange(temp, path)?;
            Err(e)
        }
        // Left behind (a kill, a failing unlink), it is a temp file like one a kill before a
        // rename leaves: the next write of this pid replaces it and GC removes it.
        _ => Ok(()),
    }
}

/// renameat2(2) with RENAME_EXCHANGE, by system call: libc wrappers for it are not in every
/// libc a static build may use.
pub fn exchange(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths that live until the call returns; AT_FDCWD resolves
    // them as open(2) would.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_renameat2,
            nix::libc::AT_FDCWD,
            from.as_ptr(),
            nix::libc::AT_FDCWD,
            to.as_ptr(),
            nix::libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How a written file takes its name: after an fsync, or by a rename the file system may
/// order after the data, or by an exchange that asks no writeback.
fn put_in_place(temp: &Path, path: &Path, durability: Durability) -> io::Result<()> {
    match durability {
        Durability::Hint => fs::rename(temp, path),
        Durability::Durable | Durability::ThisBoot => rename_over(temp, path),
    }
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

    /// An entry is replaced whole whether its name is free, a file or a link (the link, never
    /// its target), however it is put in place, and no temp file is left; a directory at the
    /// name is refused and stays.
    #[test]
    fn replace_leaves_the_new_file_and_no_temp() {
        for durability in [Durability::Durable, Durability::Hint, Durability::ThisBoot] {
            let dir = std::env::temp_dir().join(format!(
                "sg-sealed-replace-{}-{durability:?}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("a-dir")).unwrap();
            let outside = dir.join("outside");
            fs::write(&outside, "kept").unwrap();
            std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
            for (name, round) in [("free", 1), ("free", 2), ("link", 1)] {
                let bytes = format!("{name} {round}");
                replace(&dir, name, bytes.as_bytes(), durability).unwrap();
                let meta = fs::symlink_metadata(dir.join(name)).unwrap();
                assert!(meta.is_file(), "{durability:?} {name} {round}: {meta:?}");
                assert_eq!(fs::read_to_string(dir.join(name)).unwrap(), bytes);
            }
            assert!(replace(&dir, "a-dir", b"x", durability).is_err());
            assert!(dir.join("a-dir").is_dir(), "{durability:?}");
            assert_eq!(fs::read_to_string(&outside).unwrap(), "kept");
            let mut left: Vec<_> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            assert_eq!(left, ["a-dir", "free", "link", "outside"], "{durability:?}");
            fs::remove_dir_all(&dir).unwrap();
        }
    }
}
