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
        Ok(Keep {
            mode: meta.mode() & 0o7777,
            owner: Some((meta.uid(), meta.gid())),
        })
    }

    pub fn mode(mode: u32) -> Keep {
        Keep { mode, owner: None }
    }
}

pub fn write_atomic(target: &Path, bytes: &[u8], keep: Keep) -> io::Result<()> {
    write_atomic_if(target, bytes, keep, &Expect::Any).map(|_| ())
}

/// What a file held when the installer read it: it is replaced only if it still does.
pub enum Expect<'a> {
    /// Whatever it holds (a file only the installer writes).
    Any,
    Bytes(&'a [u8]),
}

impl Expect<'_> {
    pub fn holds(&self, file: &Path) -> bool {
        match (self, fs::read(file)) {
            (Expect::Any, _) => true,
            (Expect::Bytes(expected), Ok(now)) => now == *expected,
            _ => false,
        }
    }
}

/// `write_atomic`, replacing the target only if it still holds what `expect` says: when
/// another writer replaced it since it was read, the answer is false and the file is as
/// that writer left it, so the caller starts over from the new content instead of putting
/// back an older one. The target is looked at after the slow part (the write and fsync of
/// the temp file), then swapped with the temp file in one step (renameat2 EXCHANGE); the
/// old content, now under the temp name, is looked at once more, and if a write slipped in
/// between the look and the swap it is swapped back. Where the file system cannot exchange,
/// a plain rename follows the look.
pub fn write_atomic_if(
    target: &Path,
    bytes: &[u8],
    keep: Keep,
    expect: &Expect,
) -> io::Result<bool> {
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?;
    let (temp, mut file) = create_temp(dir, &name.to_string_lossy())?;
    let written = (|| {
        if let Some((uid, gid)) = keep.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        // After the chown, which clears set-id bits; and beyond the umask.
        file.set_permissions(fs::Permissions::from_mode(keep.mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        if !expect.holds(target) {
            return Ok(false);
        }
        let unsupported = |e: &io::Error| {
            matches!(
                e.raw_os_error(),
                Some(nix::libc::EINVAL | nix::libc::ENOSYS)
            )
        };
        match expect {
            Expect::Any => fs::rename(&temp, target).map(|()| true),
            Expect::Bytes(_) => match rename2(&temp, target, nix::libc::RENAME_EXCHANGE) {
                Ok(()) if expect.holds(&temp) => Ok(true),
                Ok(()) => {
                    // Unless the other writer wrote yet again, its file goes back in place.
                    let ours = file.metadata()?.ino();
                    if fs::metadata(target).is_ok_and(|m| m.ino() == ours) {
                        rename2(&temp, target, nix::libc::RENAME_EXCHANGE)?;
                    }
                    Ok(false)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) if unsupported(&e) => fs::rename(&temp, target).map(|()| true),
                Err(e) => Err(e),
            },
        }
    })();
    // The temp name holds our bytes (not used) or, after an exchange, the replaced file's.
    let _ = fs::remove_file(&temp);
    if written? {
        sync_dir(dir)?;
        return Ok(true);
    }
    Ok(false)
}

/// The most an in-place write may cover: one page (4096 bytes, the smallest page of any
/// Linux arch). A write within one page at offset 0 is one copy into one cached page; a
/// longer one is copied page by page, and a reader between two pages gets the new start
/// with the old end, which no JSON parser takes. (XFS makes readers wait for the whole
/// write; ext4 does not, so within a page a reader can still meet the one copy under way.)
/// On disk it is one block of a 4 KiB-block file system.
pub const IN_PLACE_MAX: usize = 4096;

/// How many bytes an in-place write of `new_len` bytes over `old_len` covers: the old
/// length at least, since a shorter file is padded with spaces over the old bytes first.
pub fn in_place_span(old_len: usize, new_len: usize) -> usize {
    old_len.max(new_len)
}

/// The refusal of an in-place write longer than `IN_PLACE_MAX`, for the caller to phrase.
pub fn too_long_in_place(target: &Path, span: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "writing {} in place would cover {span} bytes, more than one page ({IN_PLACE_MAX}): a reader could see \
             it half-written",
            target.display()
        ),
    )
}

/// Writes `bytes` into `target` itself, same inode, if it still holds what `expect` says:
/// for a file others watch by path, which a rename over it would read as removed. It never
/// reads as anything but JSON: the new bytes go over the old in one `pwrite` at offset 0,
/// padded with spaces to the old length (trailing whitespace is valid JSON), and only then
/// is the file cut to the new length. Refused, with nothing written, when that write would
/// cover more than `IN_PLACE_MAX`. The room a longer file needs is taken before the old
/// bytes are touched, and a write that fails all the same (a full disk) puts the old bytes
/// back: a file others read is never left cut inside the new JSON.
pub fn write_in_place_if(target: &Path, bytes: &[u8], expect: &Expect) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new().read(true).write(true).open(target)?;
    if !expect.holds(target) {
        return Ok(false);
    }
    let mut old = Vec::new();
    io::Read::read_to_end(&mut &file, &mut old)?;
    let span = in_place_span(old.len(), bytes.len());
    if span > IN_PLACE_MAX {
        return Err(too_long_in_place(target, span));
    }
    let old_len = old.len() as u64;
    let mut padded = bytes.to_vec();
    padded.resize(span, b' ');
    if padded.len() as u64 > old_len {
        reserve(&file, padded.len() as u64)?;
    }
    // One call: a loop of shorter writes would show a reader each step.
    let written = match file.write_at(&padded, 0) {
        Ok(n) if n == padded.len() => file.sync_all(),
        Ok(n) => Err(io::Error::other(format!(
            "wrote {n} of {} bytes",
            padded.len()
        ))),
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        // Within the old length: the blocks are the file's already.
        let _ = file
            .write_at(&old, 0)
            .and_then(|_| file.set_len(old_len))
            .and_then(|()| file.sync_all());
        return Err(e);
    }
    if (bytes.len() as u64) < old_len {
        file.set_len(bytes.len() as u64)?;
        file.sync_all()?;
    }
    Ok(true)
}

/// Allocates the file's blocks up to `len` without changing its size (what readers see),
/// so that the write after it does not run out of room half way. File systems that cannot
/// are left to the write and its undo.
fn reserve(file: &File, len: u64) -> io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    match fallocate(file, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len as i64) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// A new temp file beside the target. The pid alone does not name it: in a container the
/// installer is PID 1 in every pod, and a pod killed mid-write (SIGKILL after the grace
/// period, the OOM killer) leaves its temp behind under exactly that name, which would
/// make every later installer on the node fail with EEXIST.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut attempt = 0;
    loop {
        let temp = dir.join(format!(
            ".{name}.{}-{nanos:x}-{attempt}.tmp",
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
        {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Whether `name` is a temp file of `create_temp` (or of the installers before it, which
/// named them by pid alone): what a killed installer leaves behind.
pub fn is_installer_temp(name: &str) -> bool {
    let Some((file, tag)) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".tmp"))
        .and_then(|n| n.rsplit_once('.'))
    else {
        return false;
    };
    let parts: Vec<&str> = tag.split('-').collect();
    let tag_ok = match parts.as_slice() {
        [pid] => pid.bytes().all(|b| b.is_ascii_digit()),
        [pid, nanos, attempt] => {
            pid.bytes().all(|b| b.is_ascii_digit())
                && nanos.bytes().all(|b| b.is_ascii_hexdigit())
                && attempt.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    };
    let ours = [".conflist", ".conf", ".json", ORIGINAL_SUFFIX, ".prom"]
        .iter()
        .any(|ext| file.ends_with(ext))
        || BINARIES.contains(&file);
    !tag.is_empty() && tag_ok && ours
}

/// renameat2(2) with `flags` (RENAME_EXCHANGE), by system call: libc
/// wrappers for it are not in every libc a static build may use.
fn rename2(from: &Path, to: &Path, flags: std::ffi::c_uint) -> io::Result<()> {
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
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

/// The binaries the installer puts in a bin dir, in the order it writes them: the operator's
/// first, so that a plugin there always has its commands beside it.
pub const BINARIES: [&str; 2] = [crate::CTL_BINARY, super::edit::GUARD_TYPE];

/// The bytes of the plugin this installer ships: the `sandbox-guard` beside this binary, as
/// the build and the image leave them. What the runtime execs, and what readiness compares
/// with the one the runtime finds.
pub fn plugin_bytes() -> Result<Vec<u8>, String> {
    let plugin = std::env::current_exe()
        .map(|ctl| ctl.with_file_name(super::edit::GUARD_TYPE))
        .map_err(|e| format!("cannot find this binary: {e}"))?;
    fs::read(&plugin).map_err(|e| {
        format!(
            "cannot read the plugin {} that ships beside this binary: {e}",
            plugin.display()
        )
    })
}

/// What the installer says of a binary `install_binaries` wrote.
pub fn copied(written: &Path) -> String {
    if written.file_name() == Some(std::ffi::OsStr::new(crate::CTL_BINARY)) {
        format!("copied the operator's binary to {}", written.display())
    } else {
        format!("copied the binary to {}", written.display())
    }
}

/// Copies `BINARIES` into `bin_dir`, each unless the same bytes are there already: this
/// operator's binary and the plugin beside it. The files written.
pub fn install_binaries(bin_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let ctl = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let ctl = fs::read(&ctl).map_err(|e| format!("cannot read {}: {e}", ctl.display()))?;
    let plugin = plugin_bytes()?;
    let mut written = Vec::new();
    for (name, bytes) in BINARIES.into_iter().zip([ctl, plugin]) {
        let target = bin_dir.join(name);
        if fs::read(&target).is_ok_and(|there| there == bytes) {
            continue;
        }
        fs::create_dir_all(bin_dir)
            .map_err(|e| format!("cannot create {}: {e}", bin_dir.display()))?;
        write_atomic(&target, &bytes, Keep::mode(0o755))
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        written.push(target);
    }
    Ok(written)
}
