//! Every write of the installer: a temp file in the target's own directory (named so that
//! no runtime reads it: libcni reads only `.conf`, `.conflist` and `.json`), fsynced, renamed
//! over the target, the directory fsynced. A reader sees the old file or the new one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Beside a file the installer changed, the bytes the primary had written there, for
/// `--uninstall` to put back exactly.
pub const ORIGINAL_SUFFIX: &str = ".sandbox-guard-orig";

pub fn original_of(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(ORIGINAL_SUFFIX);
    PathBuf::from(name)
}

/// The mode and owner a replacement keeps.
#[derive(Clone, Copy)]
pub struct Keep {
    mode: u32,
    owner: Option<(u32, u32)>,
}

impl Keep {
    pub fn of(file: &Path) -> io::Result<Keep> {
        let meta = fs::metadata(file)?;
        Ok(Keep { mode: meta.mode() & 0o7777, owner: Some((meta.uid(), meta.gid())) })
    }

    pub fn mode(mode: u32) -> Keep {
        Keep { mode, owner: None }
    }
}

pub fn write_atomic(target: &Path, bytes: &[u8], keep: Keep) -> io::Result<()> {
    write_atomic_if(target, bytes, keep, |_| true).map(|_| ())
}

/// What a file held when the installer read it: the rename happens only if it still does.
pub enum Expect<'a> {
    Absent,
    Bytes(&'a [u8]),
}

impl Expect<'_> {
    pub fn holds(&self, file: &Path) -> bool {
        match (self, fs::read(file)) {
            (Expect::Absent, Err(e)) => e.kind() == io::ErrorKind::NotFound,
            (Expect::Bytes(expected), Ok(now)) => now == *expected,
            _ => false,
        }
    }
}

/// `write_atomic`, but the target is looked at again right before the rename, after the
/// slow part (the write and fsync of the temp file): when another writer replaced it since
/// it was read (`unchanged` says no), nothing is renamed and the answer is false, so the
/// caller starts over from the new content instead of putting back an older one.
pub fn write_atomic_if(target: &Path, bytes: &[u8], keep: Keep, unchanged: impl Fn(&Path) -> bool) -> io::Result<bool> {
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().ok_or_else(|| io::Error::other("no file name"))?;
    let temp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temp)?;
        if let Some((uid, gid)) = keep.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        // After the chown, which clears set-id bits; and beyond the umask.
        file.set_permissions(fs::Permissions::from_mode(keep.mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        if !unchanged(target) {
            return Ok(false);
        }
        fs::rename(&temp, target).map(|()| true)
    })();
    if !matches!(written, Ok(true)) {
        let _ = fs::remove_file(&temp);
    }
    if written? {
        sync_dir(dir)?;
        return Ok(true);
    }
    Ok(false)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub fn remove(file: &Path) -> io::Result<bool> {
    match fs::remove_file(file) {
        Ok(()) => {
            sync_dir(file.parent().unwrap_or(Path::new(".")))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Copies this binary to `<bin-dir>/sandbox-guard` unless the same bytes are there already.
/// True when it wrote.
pub fn install_binary(bin_dir: &Path) -> Result<bool, String> {
    let source = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let bytes = fs::read(&source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
    let target = bin_dir.join(super::edit::GUARD_TYPE);
    if fs::read(&target).is_ok_and(|there| there == bytes) {
        return Ok(false);
    }
    fs::create_dir_all(bin_dir).map_err(|e| format!("cannot create {}: {e}", bin_dir.display()))?;
    write_atomic(&target, &bytes, Keep::mode(0o755)).map_err(|e| format!("cannot write {}: {e}", target.display()))?;
    Ok(true)
}
