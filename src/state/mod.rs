//! The state: every file under the state directory, and the ownership rule that decides
//! from it. One sealed file per attachment, one per owned pod key, the files set aside
//! after a checksum failure, the ADDs that failed in the guard, and the address index.
//!
//! ```text
//! <stateDir>/lock                                  flock; holds the generation counter
//! <stateDir>/boot                                  the boot the folders below are of (boot)
//! <stateDir>/previous-boot/<boot id>/              the boot before's records, owners, ...
//! <stateDir>/records/<network>:<container>:<if>    Checkpoint
//! <stateDir>/owners/<sha256 of the pod key>        Ownership
//! <stateDir>/set-aside/<original name>             corrupt files, kept for the operator
//! <stateDir>/failed-adds/<network>:<container>:<if> an ADD the guard failed (see failed_add)
//! <stateDir>/ips/<network>:<address>               who was last given an address (ip_index)
//! <stateDir>/deferred/<sha256 of the pod key>/<network>:<container>:<if>
//!                                                  a stale DEL kept from the primary (delegate mode)
//! <stateDir>/pod-locks/<sha256 of the pod key>     flock per pod key (delegate mode)
//! <stateDir>/pod-waits/<sha256 of the pod key>     flock shared by the verbs waiting for that lock
//! <stateDir>/ledger/<sha256 of the pod key>        stale DELs handled per pod key (ledger)
//! <stateDir>/pod-keys/<network>                    the podKey rule the network's files follow (rekey)
//! <stateDir>/pending-adds/<sha256 of the pod key>[.pid]
//!                                                  an ADD at the primary now, and its pid (pending_add)
//! <stateDir>/rolled-back/<network>:<container>:<if> a cut-off ADD the primary had a DEL for
//! ```
//!
//! Every ADD, DEL and CHECK touches a fixed number of files whatever the store holds;
//! only GC, the operator tools, once per network and `podKey` rule `rekey`, and once per
//! boot its first writer's move (`boot`; and a reader's look at `owners/` while the marker
//! names another boot) list directories. Writers (`Store::open`) create what is
//! missing and hold the exclusive lock for their life; readers (`Store::open_read_only`)
//! create, chmod and lock-create nothing, and take the shared lock only around what must be
//! read consistently, never while they write to stdout.

pub mod boot;
pub mod checkpoint;
pub mod deferred;
pub mod entry_text;
pub mod failed_add;
pub mod held;
pub mod ip_index;
pub mod journal;
pub mod ledger;
pub mod lock;
pub mod ownership;
pub mod pending_add;
pub mod pod_lock;
pub mod rekey;
pub mod sealed;

use std::cell::Cell;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{GuardError, Kind, Result};
use crate::state::ownership::{Ownership, PodKey};
use checkpoint::{AttachmentId, Checkpoint};
pub use lock::Access;
pub use sealed::Loaded;

pub(crate) const RECORDS: &str = "records";
const OWNERS: &str = "owners";
pub(crate) const SET_ASIDE: &str = "set-aside";
pub const FAILED_ADDS: &str = "failed-adds";
/// The address index (ip_index.rs).
pub const IPS: &str = "ips";
pub(crate) const OWNER_PREFIX: &str = "owner-";
/// Where the record count sits in the lock file, after the generation counter's 20 digits.
const RECORD_COUNT_AT: u64 = 20;
/// The folders below the state dir whose changes a sync makes durable (`Store::sync`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Dir {
    #[default]
    Records,
    Owners,
    SetAside,
    FailedAdds,
    Ledger,
}

const FOLDERS: [&str; 5] = [RECORDS, OWNERS, SET_ASIDE, FAILED_ADDS, ledger::LEDGER];

pub struct Store {
    root: PathBuf,
    records: PathBuf,
    owners: PathBuf,
    set_aside: PathBuf,
    failed_adds: PathBuf,
    ledger: PathBuf,
    /// A writer holds the exclusive lock on it for the life of the Store (the OS drops the lock
    /// when the process dies). `None` only for a reader whose store has never been written.
    lock: Option<File>,
    writable: bool,
    /// Record files created (+) and removed (-) since the last sync: `sync` moves the count kept
    /// in the lock file by that much (see `record_count`).
    records_delta: Cell<i64>,
    /// Directories changed since the last sync, in the order of their first change: `sync`
    /// keeps that order.
    dirty: Cell<DirtyDirs>,
    /// A durable store's record written since the last sync, whose data `sync` makes durable
    /// first.
    unsynced_record: Cell<Option<File>>,
    /// This boot's id, where the kernel gives one.
    boot_now: Option<String>,
    /// Whether every write must be durable: a writer whose store is not scoped to the boot
    /// (no boot id to scope it by, `boot::enter`).
    durable: bool,
    /// What the boot marker says of the live folders (readers; a writer's are this boot's).
    live: boot::LiveFolders,
}

/// Folders, each at most once, in the order they were first marked.
#[derive(Debug, Default, Clone, Copy)]
struct DirtyDirs {
    order: [Dir; 5],
    len: u8,
}

impl DirtyDirs {
    fn mark(&mut self, dir: Dir) {
        if !self.in_order().contains(&dir) {
            self.order[usize::from(self.len)] = dir;
            self.len += 1;
        }
    }

    fn in_order(&self) -> &[Dir] {
        &self.order[..usize::from(self.len)]
    }

    fn forget(&mut self, dir: Dir) {
        if let Some(at) = self.in_order().iter().position(|&d| d == dir) {
            self.order.copy_within(at + 1..usize::from(self.len), at);
            self.len -= 1;
        }
    }
}

/// What `read_in_batches` reads.
#[derive(Debug, Clone, Copy)]
pub enum Folder {
    Records,
    Owners,
}

/// Files a reader reads under one hold of the shared lock.
pub const READ_BATCH: usize = 256;

/// A reader's shared lock, released on drop.
pub struct ReadLock<'a>(Option<&'a File>);

impl Drop for ReadLock<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.0 {
            let _ = file.unlock();
        }
    }
}

impl Store {
    /// For writers: creates (mode 0700) the state dir and its folders, and waits at most
    /// `wait` for the exclusive lock. On a read-only filesystem this fails with Kind::ReadOnly.
    ///
    /// The first writer of a boot moves the boot before's folders aside (`boot::enter`) before
    /// it makes the folders anew.
    pub fn open(root: &Path, wait: Duration) -> Result<Store> {
        ensure_dir(root)?;
        let lock_path = root.join("lock");
        let lock = open_lock_file(&lock_path)
            .map_err(|e| GuardError::io("open the lock file", &lock_path, e))?;
        lock::acquire(&lock, &lock_path, Access::Exclusive, wait, &|_| {})?;
        let store = Store {
            lock: Some(lock),
            live: boot::LiveFolders::ThisBoot,
            ..Store::at(root, None, true)
        };
        let boot_now = boot::enter(root, || store.set_record_count(0))?;
        let store = Store {
            durable: boot_now.is_none(),
            boot_now,
            ..store
        };
        for dir in [&store.records, &store.owners, &store.set_aside] {
            ensure_dir(dir)?;
        }
        Ok(store)
    }

    /// For the verbs that read (CHECK, STATUS, a DEL on a store that takes no write): the
    /// state dir must exist; nothing is created, chmodded or locked here. Take `read_lock`
    /// around reads that must be consistent with each other. Where no writer has moved the
    /// previous boot's folders aside yet (a state dir that takes no write), they read as
    /// empty: their sandboxes have ended, and their files may be torn.
    pub fn open_read_only(root: &Path) -> Result<Store> {
        let store = Store::open_as_it_is(root)?;
        Ok(match &store.live {
            boot::LiveFolders::Previous(_) => {
                let none = root.join(boot::ANOTHER_BOOTS);
                let [records, owners, set_aside, failed_adds] =
                    [RECORDS, OWNERS, SET_ASIDE, FAILED_ADDS].map(|dir| none.join(dir));
                Store {
                    records,
                    owners,
                    set_aside,
                    failed_adds,
                    ..store
                }
            }
            _ => store,
        })
    }

    /// For the operator's tools (the dump, the doctor, `--restore`): `open_read_only`, the
    /// live folders read as they are, whichever boot they are of (`live_folders` says).
    pub fn open_as_it_is(root: &Path) -> Result<Store> {
        match fs::symlink_metadata(root) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(symlinked(root)),
            Ok(meta) if !meta.is_dir() => return Err(not_a_dir(root)),
            Ok(_) => {}
            Err(e) => return Err(GuardError::io("open state directory", root, e)),
        }
        let lock_path = root.join("lock");
        let lock = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&lock_path)
        {
            Ok(file) => Some(file),
            // No writer has ever run here: there is nothing to be consistent with.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(GuardError::io("open the lock file", &lock_path, e)),
        };
        let boot_now = crate::clock::boot_id();
        Ok(Store {
            live: boot::live_folders(root, boot_now.as_deref()),
            boot_now,
            ..Store::at(root, lock, false)
        })
    }

    fn at(root: &Path, lock: Option<File>, writable: bool) -> Store {
        let [records, owners, set_aside, failed_adds, ledger] = FOLDERS.map(|dir| root.join(dir));
        Store {
            root: root.to_path_buf(),
            records,
            owners,
            set_aside,
            failed_adds,
            ledger,
            lock,
            writable,
            records_delta: Cell::new(0),
            dirty: Cell::new(DirtyDirs::default()),
            unsynced_record: Cell::new(None),
            boot_now: None,
            durable: true,
            live: boot::LiveFolders::Unscoped,
        }
    }

    /// A reader's shared lock, waited for at most `wait`; `on_wait` hears once who holds it
    /// when it is not free at once.
    pub fn read_lock(&self, wait: Duration, on_wait: &dyn Fn(&str)) -> Result<ReadLock<'_>> {
        let Some(file) = &self.lock else {
            return Ok(ReadLock(None));
        };
        lock::acquire(file, &self.root.join("lock"), Access::Shared, wait, on_wait)?;
        Ok(ReadLock(Some(file)))
    }

    /// Reads the files of `folder` with `load`, keeping what it returns, under the shared lock
    /// for at most READ_BATCH files at a time: a reader of a large store holds no writer up
    /// for long. Each file is whole (written by rename) whatever happens between batches. The
    /// folder is listed as it is read, so only what `load` keeps takes memory.
    pub fn read_in_batches<T>(
        &self,
        folder: Folder,
        wait: Duration,
        on_wait: &dyn Fn(&str),
        mut load: impl FnMut(&Path) -> Option<T>,
    ) -> Result<Vec<(PathBuf, T)>> {
        let mut paths = self.paths(folder)?;
        let mut found = Vec::new();
        loop {
            let _lock = self.read_lock(wait, on_wait)?;
            let mut read = 0;
            for path in paths.by_ref() {
                let path = path.map_err(|e| GuardError::io("list", self.folder(folder), e))?;
                if let Some(value) = load(&path) {
                    found.push((path, value));
                }
                read += 1;
                if read == READ_BATCH {
                    break;
                }
            }
            if read < READ_BATCH {
                return Ok(found);
            }
        }
    }

    /// How many files `folder` holds, temp files aside; nothing is read.
    pub fn count(&self, folder: Folder) -> Result<usize> {
        Ok(self.paths(folder)?.count())
    }

    fn folder(&self, folder: Folder) -> &Path {
        match folder {
            Folder::Records => &self.records,
            Folder::Owners => &self.owners,
        }
    }

    /// The paths of `folder`'s files in directory order, listed lazily; none for a folder
    /// that does not exist yet. A folder that is a symlink is refused, not listed: a reader
    /// has no `ensure_dir` to refuse it at open, and would list another directory's files.
    fn paths(&self, folder: Folder) -> Result<impl Iterator<Item = io::Result<PathBuf>> + use<>> {
        let dir = self.folder(folder);
        if fs::symlink_metadata(dir).is_ok_and(|meta| meta.file_type().is_symlink()) {
            return Err(symlinked(dir));
        }
        let entries = match fs::read_dir(dir) {
            Ok(entries) => Some(entries),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(GuardError::io("list", dir, e)),
        };
        Ok(entries
            .into_iter()
            .flatten()
            .filter_map(|entry| match entry {
                Ok(entry) if entry.file_name().as_encoded_bytes().starts_with(b".") => None,
                Ok(entry) => Some(Ok(entry.path())),
                Err(e) => Some(Err(e)),
            }))
    }

    /// Whether this Store was opened by `open` (it may write) or `open_read_only`.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn record_path(&self, id: &AttachmentId) -> PathBuf {
        self.records.join(id.file_name())
    }

    pub fn load_record(&self, id: &AttachmentId) -> Result<Loaded<Checkpoint>> {
        sealed::read_any(&self.record_path(id))
    }

    /// Puts the record in place, atomically: a writer killed at any point leaves the old file
    /// or the new one. Only a durable store (`durable`) syncs it, at the next `sync`, which it
    /// must then precede in the same operation.
    pub fn save_record(&self, record: &Checkpoint) -> Result<()> {
        let name = record.id().file_name();
        let new = surely_absent(&self.records.join(&name));
        let file = sealed::write_unsynced(&self.records, &name, &sealed::seal(record), new)?;
        if self.durable
            && let Some(earlier) = self.unsynced_record.replace(Some(file))
        {
            earlier
                .sync_data()
                .map_err(|e| GuardError::io("sync checkpoint in", &self.records, e))?;
        }
        self.mark_dirty(Dir::Records);
        self.records_delta
            .set(self.records_delta.get() + i64::from(new));
        Ok(())
    }

    pub fn remove_record(&self, id: &AttachmentId) -> Result<()> {
        if remove(&self.record_path(id))? {
            self.records_delta.set(self.records_delta.get() - 1);
        }
        self.mark_dirty(Dir::Records);
        Ok(())
    }

    /// How many records the store holds, kept in the lock file beside the generation counter
    /// (best effort, no fsync, like it) so that the metrics need not list ten thousand files
    /// on every ADD. `None` until `recount_records` first ran (a store from before the count,
    /// or whose count a crash may have skewed is recounted by GC and by the metrics).
    pub fn record_count(&self) -> Option<u64> {
        let mut buf = [0u8; 20];
        let read = self
            .lock
            .as_ref()
            .and_then(|lock| lock.read_at(&mut buf, RECORD_COUNT_AT).ok())?;
        (read == buf.len())
            .then(|| std::str::from_utf8(&buf).ok()?.parse().ok())
            .flatten()
    }

    fn set_record_count(&self, value: u64) {
        if let Some(lock) = &self.lock {
            let _ = lock.write_at(format!("{value:020}").as_bytes(), RECORD_COUNT_AT);
        }
    }

    /// Counts the records (one directory listing) and keeps the count. Writers only.
    pub fn recount_records(&self) -> Result<u64> {
        let count = self.count(Folder::Records)? as u64;
        self.records_delta.set(0);
        self.set_record_count(count);
        Ok(count)
    }

    pub fn owner_path(&self, key: &PodKey) -> PathBuf {
        self.owners.join(key.digest())
    }

    pub fn load_owner(&self, key: &PodKey) -> Result<Loaded<Ownership>> {
        Ok(self.judge_owner(key, self.read_owner_file(key)?))
    }

    /// The owner file of `key` as it is, before `judge_owner`.
    pub fn read_owner_file(&self, key: &PodKey) -> Result<Loaded<Ownership>> {
        sealed::read_any::<Ownership>(&self.owner_path(key))
    }

    /// What `load_owner` makes of `key`'s owner file, read as `loaded`.
    pub fn judge_owner(&self, key: &PodKey, loaded: Loaded<Ownership>) -> Loaded<Ownership> {
        match loaded {
            // A digest collision or a file copied by hand would name another key.
            Loaded::Valid(owner) if owner.key != *key => Loaded::Corrupt {
                path: self.owner_path(key),
                reason: format!(
                    "it names pod key {:?}, not the one its file name stands for",
                    owner.key
                ),
            },
            Loaded::Valid(owner) if !plain_owner(&owner) => Loaded::Corrupt {
                path: self.owner_path(key),
                reason: "it names a container or interface that is not plain".to_string(),
            },
            // Copied from another boot's store: its sandbox has ended with that boot.
            Loaded::Valid(owner) if !self.of_this_boot(owner.boot_id.as_deref()) => Loaded::Missing,
            other => other,
        }
    }

    /// Replaces the ownership atomically; a durable store syncs the record's data first, so no
    /// crash leaves an owner whose record's data is lost.
    pub fn save_owner(&self, owner: &Ownership) -> Result<()> {
        let name = owner.key.digest();
        if self.durable
            && let Some(record) = self.unsynced_record.take()
        {
            record
                .sync_data()
                .map_err(|e| GuardError::io("sync checkpoint in", &self.records, e))?;
        }
        let stamped = Ownership {
            boot_id: self.boot_now.clone(),
            ..owner.clone()
        };
        sealed::replace(
            &self.owners,
            &name,
            &sealed::seal(&stamped),
            self.durability(),
        )
        .map_err(|e| GuardError::io("write the ownership", &self.owners.join(&name), e))?;
        self.mark_dirty(Dir::Owners);
        Ok(())
    }

    /// How a file this store's verbs write is made: durable only where no boot scopes the
    /// store (`boot`).
    fn durability(&self) -> sealed::Durability {
        match self.durable {
            true => sealed::Durability::Durable,
            false => sealed::Durability::Hint,
        }
    }

    /// Whether an entry that names `boot` (none: written before entries named one) belongs
    /// to this boot. Where this boot's id is unknown, every entry is taken as its own.
    pub fn of_this_boot(&self, boot: Option<&str>) -> bool {
        match (boot, &self.boot_now) {
            (Some(boot), Some(now)) => boot == now,
            _ => true,
        }
    }

    /// This boot's id, which ADD writes into its record and ownership.
    pub fn boot_id(&self) -> Option<&str> {
        self.boot_now.as_deref()
    }

    /// What the boot marker says of the live folders (a writer's are always this boot's).
    pub fn live_folders(&self) -> &boot::LiveFolders {
        &self.live
    }

    /// The boot an entry's sandbox ended with (`written_in`: the boot the entry names), where
    /// it is not this one: the live folders are still an earlier boot's (no writer ran since),
    /// or the entry says so. No verb judges by such an entry.
    pub fn ended_with<'a>(&'a self, written_in: Option<&'a str>) -> Option<&'a str> {
        match &self.live {
            boot::LiveFolders::Previous(boot) => Some(boot),
            _ => written_in.filter(|boot| !self.of_this_boot(Some(boot))),
        }
    }

    pub fn remove_owner(&self, key: &PodKey) -> Result<()> {
        remove(&self.owner_path(key))?;
        self.mark_dirty(Dir::Owners);
        Ok(())
    }

    /// Writes what is left of the ownership of `key` (`ownership::released`), or removes it.
    pub fn update_owner(&self, key: &PodKey, left: Option<&Ownership>) -> Result<()> {
        match left {
            Some(owner) => self.save_owner(owner),
            None => self.remove_owner(key),
        }
    }

    /// Whether `owner` still stands on its record: one of its interfaces' records names the
    /// same pod key, or cannot be read (corrupt, set aside to block), in which case it is
    /// trusted. An owner whose records are gone owns nothing: it would refuse every other
    /// sandbox's DEL of the pod for ever.
    pub fn owner_is_backed(&self, owner: &Ownership) -> bool {
        // A checksum is no signature: names from a file are checked before they make a path.
        if !plain_owner(owner) {
            return true;
        }
        owner.interfaces().into_iter().any(|if_name| {
            let id = AttachmentId::of(&owner.key, &owner.container_id, if_name);
            match self.load_record(&id) {
                Ok(Loaded::Valid(record)) => {
                    record.pod_key(owner.key.rule()).as_ref() == Some(&owner.key)
                }
                Ok(Loaded::Missing) => !surely_absent(&self.set_aside_path_for_record(&id)),
                Ok(Loaded::Corrupt { .. }) | Err(_) => true,
            }
        })
    }

    /// Whether the owner's netns still exists; when its record cannot say, it is taken as
    /// alive.
    pub fn owner_netns_alive(&self, owner: &Ownership) -> bool {
        let first = owner
            .interfaces()
            .first()
            .map(|if_name| AttachmentId::of(&owner.key, &owner.container_id, if_name));
        match first.map(|id| self.load_record(&id)) {
            Some(Ok(Loaded::Valid(record))) => {
                crate::kernel::netns::netns_state(&record.netns, None, None).is_alive()
            }
            _ => true,
        }
    }

    /// The owner file's time (a note of a failed ADD from an earlier release is compared
    /// with it, see `failed_add`).
    pub fn owner_file_time(&self, key: &PodKey) -> Option<SystemTime> {
        fs::symlink_metadata(self.owner_path(key))
            .and_then(|m| m.modified())
            .ok()
    }

    /// The generation at which `owner`'s sandbox took its key: that of the oldest of its
    /// records that hold it (its first ADD of the pod), which its later ADDs of other
    /// interfaces leave as it is; the ownership's own where no record says.
    pub fn owner_taken_at(&self, owner: &Ownership) -> u64 {
        if !plain_owner(owner) {
            return owner.generation;
        }
        owner
            .interfaces()
            .into_iter()
            .filter_map(|if_name| {
                let id = AttachmentId::of(&owner.key, &owner.container_id, if_name);
                match self.load_record(&id) {
                    Ok(Loaded::Valid(record))
                        if record.pod_key(owner.key.rule()).as_ref() == Some(&owner.key) =>
                    {
                        Some(record.generation)
                    }
                    _ => None,
                }
            })
            .min()
            .unwrap_or(owner.generation)
    }

    /// Where a corrupt record, or a pod key's corrupt ownership, is kept. While it is there,
    /// a DEL that would have needed it is refused: the retry must not pass silently.
    pub fn set_aside_path_for_record(&self, id: &AttachmentId) -> PathBuf {
        self.set_aside.join(id.file_name())
    }

    pub fn set_aside_path_for_owner(&self, key: &PodKey) -> PathBuf {
        self.set_aside
            .join(format!("{OWNER_PREFIX}{}", key.digest()))
    }

    /// Moves a corrupt file out of the way, keeping it. `blocking` puts it at `to`, where
    /// it stops the DELs that would have needed it; otherwise (and when `to` is taken) it
    /// goes beside `to` under a unique name, kept but blocking nothing. ADD uses the latter:
    /// it writes a fresh, valid file in the same breath.
    pub fn set_aside(&self, from: &Path, to: &Path, blocking: bool) -> Result<PathBuf> {
        let target = if !blocking || fs::symlink_metadata(to).is_ok() {
            kept_copy_path(to)
        } else {
            to.to_path_buf()
        };
        fs::rename(from, &target)
            .map_err(|e| GuardError::io("set aside corrupt checkpoint", from, e))?;
        self.mark_dirty(Dir::SetAside);
        if from.starts_with(&self.records) {
            self.records_delta.set(self.records_delta.get() - 1);
            self.mark_dirty(Dir::Records);
        } else if from.starts_with(&self.owners) {
            self.mark_dirty(Dir::Owners);
        }
        Ok(target)
    }

    /// Keeps a copy of a corrupt file that the caller is about to overwrite (a hard link beside
    /// `to`, blocking nothing). Unlike a move, it leaves the original in place until the new
    /// file replaces it, so no crash in between leaves an owner without its record.
    pub fn keep_copy(&self, from: &Path, to: &Path) -> Result<PathBuf> {
        let target = kept_copy_path(to);
        fs::hard_link(from, &target)
            .map_err(|e| GuardError::io("keep a copy of corrupt checkpoint", from, e))?;
        self.mark_dirty(Dir::SetAside);
        Ok(target)
    }

    /// Keeps a blocking set-aside file but stops it blocking, once the state it stood for is
    /// known again (an ADD rewrote the record or took the pod key, or GC learnt that the
    /// attachment is gone). Left in place, it would refuse every later DEL, even repeats of
    /// one that already succeeded.
    /// Returns whether there was one (the caller syncs).
    pub fn unblock(&self, blocker: &Path) -> Result<bool> {
        if fs::symlink_metadata(blocker).is_err() {
            return Ok(false);
        }
        self.set_aside(blocker, blocker, false)?;
        Ok(true)
    }

    /// Where the store is scoped to the boot (`boot`), nothing a verb wrote needs a sync: a
    /// crash that loses page-cache writes is a new boot, whose first writer moves every one
    /// of these folders aside, and a killed writer leaves whole files (each is renamed in).
    /// Only the record count is brought up to date.
    ///
    /// A durable store (no boot id to scope it by) makes every change since the last sync
    /// durable: first the data of a record written since, then each changed directory in the
    /// order it was first changed (ADD: the record, then the ownership that points at it;
    /// DEL and GC: the ownership, then the record), so no crash leaves an owner without its
    /// record.
    pub fn sync(&self) -> Result<()> {
        let dirty = self.dirty.take();
        if self.durable {
            if let Some(record) = self.unsynced_record.take() {
                record
                    .sync_data()
                    .map_err(|e| GuardError::io("sync checkpoint in", &self.records, e))?;
            }
            for &dir in dirty.in_order() {
                sync_path(match dir {
                    Dir::Records => &self.records,
                    Dir::Owners => &self.owners,
                    Dir::SetAside => &self.set_aside,
                    Dir::FailedAdds => &self.failed_adds,
                    Dir::Ledger => &self.ledger,
                })?;
            }
        }
        let delta = self.records_delta.take();
        if delta != 0
            && self.writable
            && let Some(count) = self.record_count()
        {
            self.set_record_count(count.saturating_add_signed(delta));
        }
        Ok(())
    }

    /// DEL's and GC's sync once they released pod keys and then removed records: the
    /// ownerships' removal is what must be durable before the answer, and the fsync of owners/
    /// makes it so (on ext4 it commits the records' removal with it). A power cut may still
    /// bring a removed record back, unowned: it owns nothing, blocks no DEL, and the runtime's
    /// repeated DEL or GC removes it. So records/ is not synced after owners/: one sync.
    pub fn sync_released(&self) -> Result<()> {
        let mut dirty = self.dirty.get();
        if dirty.in_order().first() == Some(&Dir::Owners) {
            dirty.forget(Dir::Records);
            self.dirty.set(dirty);
        }
        self.sync()
    }

    fn mark_dirty(&self, dir: Dir) {
        let mut dirty = self.dirty.get();
        dirty.mark(dir);
        self.dirty.set(dirty);
    }

    /// The store-wide generation counter, kept in the lock file we hold anyway so that it
    /// costs no extra durable write. It is only a floor: generations are also derived from
    /// the durable records (see `ownership::next_generation`), so losing it in a power cut
    /// cannot make a generation go backwards for a pod key.
    pub fn generation_counter(&self) -> u64 {
        let mut buf = [0u8; 20];
        let read = self
            .lock
            .as_ref()
            .and_then(|lock| lock.read_at(&mut buf, 0).ok())
            .unwrap_or(0);
        std::str::from_utf8(&buf[..read])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn set_generation_counter(&self, value: u64) {
        // Best effort by design (see above).
        if let Some(lock) = &self.lock {
            let _ = lock.write_at(format!("{value:020}").as_bytes(), 0);
        }
    }

    /// The counter written and its data synced: where it alone orders the ADDs of one pod's
    /// different keys (`podKey: "name-and-ifname"`, whose owners a later move to "name"
    /// merges by generation), a power cut must not take it back.
    pub fn set_generation_counter_durably(&self, value: u64) -> Result<()> {
        self.set_generation_counter(value);
        match &self.lock {
            // In a store scoped to the boot a power cut takes every owner aside with it.
            Some(_) if !self.durable => Ok(()),
            Some(lock) => lock.sync_data().map_err(|e| {
                GuardError::io("sync the generation counter in", &self.root.join("lock"), e)
            }),
            None => Ok(()),
        }
    }

    /// Every record file, for GC and the doctor. A file that cannot even be opened safely (a
    /// planted symlink, a FIFO) is listed as corrupt: the tools that list must keep working.
    pub fn list_records(&self) -> Result<Vec<(PathBuf, Loaded<Checkpoint>)>> {
        list(&self.records, |path| Ok(self.load_record_at(path)))
    }

    /// The record files' paths in directory order, read lazily: a reader that loads one
    /// record at a time then needs no memory per record (ten thousand sorted paths alone
    /// would take the dump past 4 MiB).
    pub fn record_paths(&self) -> Result<impl Iterator<Item = io::Result<PathBuf>> + use<>> {
        self.paths(Folder::Records)
    }

    /// Reads one path of `record_paths` as `list_records` would.
    pub fn load_record_at(&self, path: &Path) -> Loaded<Checkpoint> {
        listed(path, sealed::read_any(path))
    }

    pub fn list_owners(&self) -> Result<Vec<(PathBuf, Loaded<Ownership>)>> {
        list(&self.owners, |path| Ok(read_entry_for_listing(path)))
    }

    /// The set-aside files, for the dump.
    pub fn list_set_aside(&self) -> Result<Vec<PathBuf>> {
        Ok(list(&self.set_aside, |_| Ok(()))?
            .into_iter()
            .map(|(path, ())| path)
            .collect())
    }

    /// The temp files that writers killed mid-write left behind (a runtime's timeout kills
    /// plugins), in the state dir and its folders. Only GC and the doctor list them.
    pub fn temp_files(&self) -> Vec<TempFile> {
        let mut found = Vec::new();
        let folders = [
            &self.root,
            &self.records,
            &self.owners,
            &self.set_aside,
            &self.failed_adds,
            &self.ledger,
        ];
        let (index, pod_keys) = (self.root.join(IPS), self.root.join(rekey::POD_KEYS));
        // Delegate mode's notes and marks, written by rename like the rest.
        let (notes, marks) = (
            self.root.join(pending_add::PENDING_ADDS),
            self.root.join(pending_add::ROLLED_BACK),
        );
        // Each pod key's deferred DELs have a folder of their own.
        let deferred_keys: Vec<PathBuf> = fs::read_dir(self.root.join(deferred::DEFERRED))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .collect();
        for dir in folders
            .into_iter()
            .chain([&index, &pod_keys, &notes, &marks])
            .chain(&deferred_keys)
        {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = temp_file_pid(&name.to_string_lossy()) else {
                    continue;
                };
                let modified = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                found.push(TempFile {
                    path: entry.path(),
                    pid,
                    modified,
                });
            }
        }
        found
    }

    /// Removes the temp files of writers that are gone; a live writer's (a STATUS probe, which
    /// takes no lock) is left alone. Returns how many went.
    pub fn remove_dead_temp_files(&self) -> Result<usize> {
        let mut removed = 0;
        for temp in self.temp_files() {
            if !temp.writer_alive() {
                remove(&temp.path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Held shared by every delegate-mode replay worker for its whole life (and by a verb that
/// replays itself when no worker could start); taken exclusively by the commands that must
/// not run beside a replay (`--downgrade`, leaving delegate mode).
pub const REPLAY_LOCK: &str = "replay.lock";

/// `replay.lock` taken exclusively within `wait`: while the file is held no replay runs and
/// none starts (a verb that finds it taken starts no worker and leaves its deferred DELs to a
/// later one). Taken before any other lock of the store and waited for holding none, so no
/// verb waits behind it; a replay running a slow primary past `wait` is a Busy error naming
/// the workers. Opened read-only where it exists (flock needs no write: the installer's pod
/// mounts the host's state dir read-only); `None` where it does not and cannot be made (a
/// read-only store): no replay has ever run there, as every worker's verb makes the file.
pub fn hold_off_replays(root: &Path, wait: Duration) -> Result<Option<File>> {
    let path = root.join(REPLAY_LOCK);
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path);
    let file = match opened {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match open_lock_file(&path) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EROFS) => return Ok(None),
            made => made,
        },
        opened => opened,
    }
    .map_err(|e| GuardError::io("open the replay lock", &path, e))?;
    // flock gives a waiting exclusive lock no precedence over new shared ones: the sign keeps
    // new workers from starting and running ones from starting their next replay meanwhile.
    let _awaiting = await_replays(root);
    lock::acquire(&file, &path, Access::Exclusive, wait, &|_| {}).map_err(|err| {
        if err.kind != Kind::Busy {
            return err;
        }
        let holder = lock::holders(&file).unwrap_or_else(|| "another process".to_string());
        GuardError::new(
            Kind::Busy,
            format!(
                "delegate mode's replay workers ({holder}) still hand deferred DELs to the primary in {}; gave up after {:.1}s",
                root.display(),
                wait.as_secs_f64()
            ),
        )
        .with_details(
            "Each primary run ends within the network's replayTimeoutSeconds and a worker starts no replay after ten \
             minutes: run the command again then, or with a longer --lock-timeout. Nothing was changed.",
        )
    })?;
    Ok(Some(file))
}

/// Held shared by a command waiting in `hold_off_replays`: no worker starts and none starts
/// its next replay while anyone holds it (`replays_awaited`).
pub const REPLAY_WAITS: &str = "replay-waits";

/// The sign of a command waiting for `replay.lock`, held until dropped; `None` where it cannot
/// be made (a read-only store where it never was): the command then only waits.
fn await_replays(root: &Path) -> Option<File> {
    let path = root.join(REPLAY_WAITS);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .or_else(|_| open_lock_file(&path))
        .ok()?;
    // Another look at it (`replays_awaited`) holds it exclusively for a moment only.
    lock::acquire(
        &file,
        &path,
        Access::Shared,
        Duration::from_secs(1),
        &|_| {},
    )
    .ok()?;
    Some(file)
}

/// Whether a command waits for `replay.lock` (`hold_off_replays`): a worker starts no replay
/// and a verb starts no worker then.
pub fn replays_awaited(root: &Path) -> bool {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(root.join(REPLAY_WAITS))
        .is_ok_and(|file| matches!(file.try_lock(), Err(fs::TryLockError::WouldBlock)))
}

/// A lock file of the store, made if missing (0600, never through a symlink), for flock.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

/// A set-aside file under its own name refuses the DELs that need it; a copy under
/// `<name>~<time>` is kept for inspection and blocks nothing.
pub fn set_aside_blocks(path: &Path) -> bool {
    !checkpoint::is_kept_copy(&path.file_name().unwrap_or_default().to_string_lossy())
}

/// Where a kept copy of `to` goes: beside it, under a name that blocks nothing.
fn kept_copy_path(to: &Path) -> PathBuf {
    let name = format!(
        "{}{}{}",
        to.file_name().unwrap_or_default().to_string_lossy(),
        checkpoint::KEPT_COPY_MARK,
        crate::clock::unix_nanos()
    );
    to.with_file_name(name)
}

/// A temp file left by a writer: `.<pid>.tmp`, or `.status.<pid>.tmp` from a STATUS probe.
pub struct TempFile {
    pub path: PathBuf,
    pub pid: u32,
    pub modified: SystemTime,
}

impl TempFile {
    pub fn writer_alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
    }
}

fn temp_file_pid(name: &str) -> Option<u32> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    inner.rsplit('.').next()?.parse().ok()
}

pub(crate) fn read_for_listing<T: serde::de::DeserializeOwned>(path: &Path) -> Loaded<T> {
    listed(path, sealed::read(path))
}

/// Reads an ownership or an address index entry (a file, or the symlink entry releases
/// before wrote) as `read_for_listing` reads a file.
pub(crate) fn read_entry_for_listing<T: serde::de::DeserializeOwned>(path: &Path) -> Loaded<T> {
    listed(path, sealed::read_any(path))
}

/// A listing goes on past a file it cannot read: that one shows as corrupt, with why.
fn listed<T>(path: &Path, read: Result<Loaded<T>>) -> Loaded<T> {
    read.unwrap_or_else(|e| Loaded::Corrupt {
        path: path.to_path_buf(),
        reason: e.msg,
    })
}

/// Lists a directory's files, skipping the temp files of writers in flight. A folder that
/// does not exist yet (a reader of a store no writer has filled) lists as empty.
fn list<T>(dir: &Path, mut load: impl FnMut(&Path) -> Result<T>) -> Result<Vec<(PathBuf, T)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(GuardError::io("list", dir, e)),
    };
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

/// fsyncs a directory: the names created, renamed or removed in it become durable.
pub(crate) fn sync_path(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| GuardError::io("sync directory", dir, e))
}

/// Fails when the store takes no write: permission bits do not stop root, and a read-only
/// or full filesystem shows only on a real write, so one is made (and synced if `durable`).
pub fn probe_write(root: &Path, durable: bool) -> Result<()> {
    use std::io::Write;
    let probe = root.join(format!(".probe.{}.tmp", std::process::id()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&probe)
        .and_then(|mut f| {
            f.write_all(b"probe\n")
                .and_then(|()| if durable { f.sync_data() } else { Ok(()) })
        });
    let _ = fs::remove_file(&probe);
    written.map_err(|e| GuardError::io("write a probe file in", root, e))
}

/// Removes a file; whether there was one.
pub(crate) fn remove(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(GuardError::io("remove", path, e)),
    }
}

/// Creates `dir` (0700) if missing, tightens it to 0700 if it is looser (checkpoints name
/// every pod on the node); refuses it if it is a symlink or not a directory. Writers only.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(symlinked(dir)),
        Ok(meta) if !meta.is_dir() => Err(not_a_dir(dir)),
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| GuardError::io("restrict the mode of", dir, e))
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| GuardError::io("create state directory", dir, e)),
        Err(e) => Err(GuardError::io("inspect state directory", dir, e)),
    }
}

fn plain_owner(owner: &Ownership) -> bool {
    use crate::names::{MAX_CONTAINER_ID, MAX_NETWORK, check_ifname, check_plain};
    check_plain("network", &owner.key.network, MAX_NETWORK, Kind::Io).is_ok()
        && check_plain("container", &owner.container_id, MAX_CONTAINER_ID, Kind::Io).is_ok()
        && owner
            .key
            .if_name
            .iter()
            .chain(&owner.interfaces)
            .all(|if_name| check_ifname(if_name).is_ok())
}

/// True only when `path` certainly does not exist: an I/O error on a failing disk is no
/// proof of absence, and a check that guards a teardown must not read it as one.
pub(crate) fn surely_absent(path: &Path) -> bool {
    matches!(fs::symlink_metadata(path), Err(e) if e.kind() == io::ErrorKind::NotFound)
}

fn symlinked(dir: &Path) -> GuardError {
    GuardError::new(
        Kind::Io,
        format!(
            "{} is a symbolic link, which the state dir never follows",
            dir.display()
        ),
    )
    .with_details("make it a real directory (mode 0700, owned by root)")
}

fn not_a_dir(dir: &Path) -> GuardError {
    GuardError::new(Kind::Io, format!("{} is not a directory", dir.display()))
        .with_details("move it away, or set stateDir to a directory")
}
