//! Files that carry their own sha256, written atomically and durably.
//!
//! On disk: `{"checksum":"sha256:<hex>","record":<record>}`. The checksum covers the exact
//! bytes of `<record>`, so verifying needs no re-serialisation.

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

/// What reading a sealed file found.
#[derive(Debug)]
pub enum Loaded<T> {
    Missing,
    Valid(T),
    /// The file exists but fails its checksum or does not decode: never trusted.
    Corrupt { path: PathBuf, reason: String },
}

/// Opens without following a symlink and without blocking on a planted FIFO.
pub fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
}

pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Loaded<T>> {
    let file = match open_nofollow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(GuardError::io("open checkpoint", path, e)),
    };
    let meta = file.metadata().map_err(|e| GuardError::io("stat checkpoint", path, e))?;
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
            reason: format!("it is {} bytes, larger than any checkpoint ({MAX_SEALED_FILE})", meta.len()),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_SEALED_FILE).read_to_end(&mut bytes).map_err(|e| GuardError::io("read checkpoint", path, e))?;
    Ok(match verify::<T>(&bytes) {
        Ok(value) => Loaded::Valid(value),
        Err(reason) => Loaded::Corrupt { path: path.to_path_buf(), reason },
    })
}

fn verify<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        checksum: &'a str,
        #[serde(borrow)]
        record: &'a RawValue,
    }
    let envelope: Envelope = serde_json::from_slice(bytes).map_err(|e| format!("not a sealed checkpoint: {e}"))?;
    let expected = format!("sha256:{}", hex(&Sha256::digest(envelope.record.get().as_bytes())));
    if envelope.checksum != expected {
        return Err(format!("checksum mismatch: file says {}, content hashes to {expected}", envelope.checksum));
    }
    serde_json::from_str(envelope.record.get()).map_err(|e| format!("checksum holds but the record does not decode: {e}"))
}

pub fn seal<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising our own plain structs cannot fail.
    let record = serde_json::to_string(value).unwrap_or_default();
    let checksum = hex(&Sha256::digest(record.as_bytes()));
    format!("{{\"checksum\":\"sha256:{checksum}\",\"record\":{record}}}\n").into_bytes()
}

/// Writes `dir/name` so that a crash leaves either the old file or the new one, never a
/// mix: a temp file in the same directory, fsync, rename. The caller fsyncs `dir` once
/// for all its renames (see `Store::sync`).
pub fn write<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<()> {
    replace(dir, name, &seal(value), Durability::Durable)
        .map_err(|e| GuardError::io("write checkpoint", &dir.join(name), e))
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
    // Named by pid alone: a process writes one file at a time, and deriving the temp name
    // from `name` could push it past the 255-byte limit.
    let temp = dir.join(format!(".{}.tmp", std::process::id()));
    let written = write_temp(&temp, bytes, durability).and_then(|()| fs::rename(&temp, dir.join(name)));
    if written.is_err() {
        // Leave nothing half-written behind, even on ENOSPC.
        let _ = fs::remove_file(&temp);
    }
    written
}

fn write_temp(temp: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
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
    match durability {
        Durability::Durable => file.sync_data(),
        Durability::Hint => Ok(()),
    }
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

    #[test]
    fn round_trip_and_tamper() {
        let sealed = seal(&serde_json::json!({"a": 1}));
        assert!(verify::<serde_json::Value>(&sealed).is_ok());
        let tampered = String::from_utf8(sealed).unwrap().replace("\"a\":1", "\"a\":2");
        assert!(verify::<serde_json::Value>(tampered.as_bytes()).unwrap_err().contains("checksum mismatch"));
        assert!(verify::<serde_json::Value>(b"{\"checksum\":").is_err());
    }
}
