//! The state directory: one sealed file per attachment, one per owned pod key, and the
//! files set aside after a checksum failure.
//!
//! ```text
//! <stateDir>/lock                                  flock; holds the generation counter
//! <stateDir>/records/<network>:<container>:<if>    Checkpoint
//! <stateDir>/owners/<sha256 of the pod key>        Ownership
//! <stateDir>/set-aside/<original name>             corrupt files, kept for the operator
//! ```
//!
//! Every ADD, DEL and CHECK touches a fixed number of files whatever the store holds;
//! only GC and the dump list directories.

pub mod checkpoint;
pub mod sealed;

use std::cell::Cell;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{GuardError, Kind, Result};
use crate::ownership::{Ownership, PodKey};
use checkpoint::{AttachmentId, Checkpoint};
pub use sealed::Loaded;

const RECORDS: &str = "records";
const OWNERS: &str = "owners";
const SET_ASIDE: &str = "set-aside";
const OWNER_PREFIX: &str = "owner-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Readers (CHECK, the dump) may run side by side.
    Shared,
    /// Writers (ADD, DEL, GC) run one at a time.
    Exclusive,
}

pub struct Store {
    root: PathBuf,
    records: PathBuf,
    owners: PathBuf,
    set_aside: PathBuf,
    /// Held for the life of the Store; the OS drops the lock when the process dies.
    lock: File,
    /// Directories renamed into since the last sync.
    dirty: Cell<[bool; 3]>,
}

impl Store {
    /// Opens (creating, mode 0700) the state dir and takes the lock.
    pub fn open(root: &Path, access: Access) -> Result<Store> {
        ensure_dir(root)?;
        let records = root.join(RECORDS);
        let owners = root.join(OWNERS);
        let set_aside = root.join(SET_ASIDE);
        for dir in [&records, &owners, &set_aside] {
            ensure_dir(dir)?;
        }
        let lock_path = root.join("lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(|e| GuardError::io("open the lock file", &lock_path, e))?;
        match access {
            Access::Shared => lock.lock_shared(),
            Access::Exclusive => lock.lock(),
        }
        .map_err(|e| GuardError::io("lock", &lock_path, e))?;
        Ok(Store { root: root.to_path_buf(), records, owners, set_aside, lock, dirty: Cell::new([false; 3]) })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn record_path(&self, id: &AttachmentId) -> PathBuf {
        self.records.join(id.file_name())
    }

    pub fn load_record(&self, id: &AttachmentId) -> Result<Loaded<Checkpoint>> {
        sealed::read(&self.record_path(id))
    }

    pub fn save_record(&self, record: &Checkpoint) -> Result<()> {
        sealed::write(&self.records, &record.id().file_name(), record)?;
        self.mark_dirty(0);
        Ok(())
    }

    pub fn remove_record(&self, id: &AttachmentId) -> Result<()> {
        remove(&self.record_path(id))?;
        self.mark_dirty(0);
        Ok(())
    }

    pub fn owner_path(&self, key: &PodKey) -> PathBuf {
        self.owners.join(key.digest())
    }

    pub fn load_owner(&self, key: &PodKey) -> Result<Loaded<Ownership>> {
        let loaded = sealed::read::<Ownership>(&self.owner_path(key))?;
        // A digest collision or a file copied by hand would name another key.
        Ok(match loaded {
            Loaded::Valid(owner) if owner.key != *key => Loaded::Corrupt {
                path: self.owner_path(key),
                reason: format!("it names pod key {:?}, not the one its file name stands for", owner.key),
            },
            other => other,
        })
    }

    pub fn save_owner(&self, owner: &Ownership) -> Result<()> {
        sealed::write(&self.owners, &owner.key.digest(), owner)?;
        self.mark_dirty(1);
        Ok(())
    }

    pub fn remove_owner(&self, key: &PodKey) -> Result<()> {
        remove(&self.owner_path(key))?;
        self.mark_dirty(1);
        Ok(())
    }

    /// Where a corrupt record, or a pod key's corrupt ownership, is kept. While it is there,
    /// a DEL that would have needed it is refused: the retry must not pass silently.
    pub fn set_aside_path_for_record(&self, id: &AttachmentId) -> PathBuf {
        self.set_aside.join(id.file_name())
    }

    pub fn set_aside_path_for_owner(&self, key: &PodKey) -> PathBuf {
        self.set_aside.join(format!("{OWNER_PREFIX}{}", key.digest()))
    }

    /// Moves a corrupt file out of the way, keeping it. `blocking` puts it at `to`, where
    /// it stops the DELs that would have needed it; otherwise (and when `to` is taken) it
    /// goes beside `to` under a unique name, kept but blocking nothing. ADD uses the latter:
    /// it writes a fresh, valid file in the same breath.
    pub fn set_aside(&self, from: &Path, to: &Path, blocking: bool) -> Result<PathBuf> {
        let mut target = to.to_path_buf();
        if !blocking || fs::symlink_metadata(&target).is_ok() {
            target.set_file_name(format!(
                "{}~{}",
                to.file_name().unwrap_or_default().to_string_lossy(),
                crate::clock::unix_nanos()
            ));
        }
        fs::rename(from, &target).map_err(|e| GuardError::io("set aside corrupt checkpoint", from, e))?;
        self.mark_dirty(2);
        if from.starts_with(&self.records) {
            self.mark_dirty(0);
        } else if from.starts_with(&self.owners) {
            self.mark_dirty(1);
        }
        Ok(target)
    }

    /// Keeps a blocking set-aside file but stops it blocking, once the state it stood for is
    /// known again (an ADD rewrote the record or took the pod key, or GC learnt that the
    /// attachment is gone). Left in place, it would refuse every later DEL, even repeats of
    /// one that already succeeded.
    pub fn unblock(&self, blocker: &Path) -> Result<()> {
        if fs::symlink_metadata(blocker).is_ok() {
            self.set_aside(blocker, blocker, false)?;
        }
        Ok(())
    }

    /// Makes every rename and unlink since the last sync durable (one fsync a directory).
    pub fn sync(&self) -> Result<()> {
        let dirty = self.dirty.replace([false; 3]);
        for (dir, is_dirty) in [&self.records, &self.owners, &self.set_aside].into_iter().zip(dirty) {
            if is_dirty {
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| GuardError::io("sync directory", dir, e))?;
            }
        }
        Ok(())
    }

    fn mark_dirty(&self, index: usize) {
        let mut dirty = self.dirty.get();
        dirty[index] = true;
        self.dirty.set(dirty);
    }

    /// The store-wide generation counter, kept in the lock file we hold anyway so that it
    /// costs no extra durable write. It is only a floor: generations are also derived from
    /// the durable records (see `ownership::next_generation`), so losing it in a power cut
    /// cannot make a generation go backwards for a pod key.
    pub fn generation_counter(&self) -> u64 {
        let mut buf = [0u8; 20];
        let read = self.lock.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..read]).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    pub fn set_generation_counter(&self, value: u64) {
        // Best effort by design (see above).
        let _ = self.lock.write_at(format!("{value:020}").as_bytes(), 0);
    }

    /// Every record file, for GC and the doctor. A file that cannot even be opened safely (a
    /// planted symlink, a FIFO) is listed as corrupt: the tools that list must keep working.
    pub fn list_records(&self) -> Result<Vec<(PathBuf, Loaded<Checkpoint>)>> {
        list(&self.records, |path| Ok(read_for_listing(path)))
    }

    /// The record files' paths in directory order, read lazily: a reader that loads one
    /// record at a time then needs no memory per record (ten thousand sorted paths alone
    /// would take the dump past 4 MiB).
    pub fn record_paths(&self) -> Result<impl Iterator<Item = io::Result<PathBuf>>> {
        let entries = fs::read_dir(&self.records).map_err(|e| GuardError::io("list", &self.records, e))?;
        Ok(entries.filter_map(|entry| match entry {
            Ok(entry) if entry.file_name().as_encoded_bytes().starts_with(b".") => None,
            Ok(entry) => Some(Ok(entry.path())),
            Err(e) => Some(Err(e)),
        }))
    }

    /// Reads one path of `record_paths` as `list_records` would.
    pub fn load_record_at(&self, path: &Path) -> Loaded<Checkpoint> {
        read_for_listing(path)
    }

    pub fn list_owners(&self) -> Result<Vec<(PathBuf, Loaded<Ownership>)>> {
        list(&self.owners, |path| Ok(read_for_listing(path)))
    }

    /// The set-aside files, for the dump.
    pub fn list_set_aside(&self) -> Result<Vec<PathBuf>> {
        Ok(list(&self.set_aside, |_| Ok(()))?.into_iter().map(|(path, ())| path).collect())
    }

    /// Removes temp files that killed writers left; only safe under the exclusive lock.
    pub fn remove_stale_temp_files(&self) -> Result<usize> {
        let mut removed = 0;
        for dir in [&self.records, &self.owners] {
            let entries = fs::read_dir(dir).map_err(|e| GuardError::io("list", dir, e))?;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.ends_with(".tmp") {
                    remove(&entry.path())?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

fn read_for_listing<T: serde::de::DeserializeOwned>(path: &Path) -> Loaded<T> {
    sealed::read(path).unwrap_or_else(|e| Loaded::Corrupt { path: path.to_path_buf(), reason: e.msg })
}

/// Lists a directory's files, skipping the temp files of writers in flight.
fn list<T>(dir: &Path, mut load: impl FnMut(&Path) -> Result<T>) -> Result<Vec<(PathBuf, T)>> {
    let entries = fs::read_dir(dir).map_err(|e| GuardError::io("list", dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| GuardError::io("list", dir, e))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let value = load(&path)?;
        out.push((path, value));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub(crate) fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(GuardError::io("remove", path, e)),
    }
}

/// Creates `dir` (0700) if missing, tightens it to 0700 if it is looser (checkpoints name
/// every pod on the node); refuses it if it is a symlink or not a directory.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(GuardError::new(
            Kind::Io,
            format!("{} is a symbolic link; the state dir never follows links: make it a real directory", dir.display()),
        )),
        Ok(meta) if !meta.is_dir() => Err(GuardError::new(
            Kind::Io,
            format!("{} is not a directory: move it away or set stateDir to a directory", dir.display()),
        )),
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| GuardError::io("restrict the mode of", dir, e)),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| GuardError::io("create state directory", dir, e)),
        Err(e) => Err(GuardError::io("inspect state directory", dir, e)),
    }
}
