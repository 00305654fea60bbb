//! Moves a network's owners, deferred DELs and ledger entries to the keys of its `podKey`
//! rule: once when a node upgrades from the release that keyed every pod by (network,
//! namespace, name, ifname), and again whenever an operator changes the rule. Until then
//! the files sit under the digests of the other rule, where the verbs' lookups would not
//! find them: an old sandbox's DEL would pass while the new one owns the pod.
//!
//! `<stateDir>/pod-keys/<network>` holds the rule the network's files are keyed by. Every
//! verb reads it first (one small file); a network whose marker names another rule, or has
//! none, is re-keyed under the store's lock before the verb does anything else. The order
//! makes any crash safe to re-run: each new file is written and made durable before any old
//! one goes, so a crash leaves both at worst, never neither; the merge of owners (the last
//! ADD wins) gives the same owner when run again, deferred DELs are written under the same
//! name again, a ledger entry lists the entries it took in and takes none twice; the marker
//! is written last, so a crash before it means the next verb runs the whole re-key again.
//! Pod locks need no move: the verbs lock the new digests, and GC removes the old files,
//! which no owner and no deferred DEL names any more.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::ledger::LedgerEntry;
use super::ownership::{self, Ownership, PodKey, PodKeyRule};
use super::{Loaded, Store, ensure_dir, surely_absent, sync_path};
use crate::error::{GuardError, Result};

pub const POD_KEYS: &str = "pod-keys";

/// An owner file that cannot be trusted (see `Store::damaged_owners`).
#[derive(Debug, Clone)]
pub struct Damaged {
    pub file: PathBuf,
    /// The highest generation the file could hold.
    pub generation: u64,
}

fn marker_path(root: &std::path::Path, network: &str) -> PathBuf {
    root.join(POD_KEYS).join(network)
}

/// The rule `network`'s files are keyed by, as its marker says; `None` without one.
fn marked(root: &std::path::Path, network: &str) -> Option<PodKeyRule> {
    let Ok(Loaded::Valid(name)) = super::sealed::read::<String>(&marker_path(root, network)) else {
        return None;
    };
    PodKeyRule::CHOICES
        .iter()
        .find(|(choice, _)| *choice == name)
        .map(|(_, rule)| *rule)
}

/// Re-keys `network`'s files to `rule` unless its marker says they are already. Costs one
/// read when nothing is to be done; a state dir that does not exist has nothing to re-key.
///
/// The marker alone is not trusted: a verb of the release before (a rolling upgrade, an ADD
/// in flight across the switch) may file an owner or a deferred DEL under the other rule's
/// key after it was written. `key` (the attachment's pod key under `rule`) and `if_name`
/// name the one place such a file of this attachment's pod would be; found there, it is
/// merged as in the first move (two stats when there is none).
pub fn ensure(
    state_dir: &std::path::Path,
    network: &str,
    rule: PodKeyRule,
    wait: Duration,
    key: Option<(&PodKey, &str)>,
) -> Result<()> {
    if surely_absent(state_dir) {
        return Ok(());
    }
    let stray = key.is_some_and(|(key, if_name)| stray(state_dir, key, if_name).is_some());
    if marked(state_dir, network) == Some(rule) && !stray {
        return Ok(());
    }
    Store::open(state_dir, wait)?.rekey(network, rule, stray)
}

/// The key of `key`'s pod under the other rule for the attachment `if_name`, when an owner
/// or deferred DELs sit there (two stats).
pub fn stray(root: &std::path::Path, key: &PodKey, if_name: &str) -> Option<PodKey> {
    let other = other(key.rule()).key(&key.network, &key.pod_namespace, &key.pod_name, if_name);
    let digest = other.digest();
    let there = !surely_absent(&root.join(super::OWNERS).join(&digest))
        || !surely_absent(&super::deferred::key_dir(root, &digest));
    there.then_some(other)
}

/// Whether `network`'s files may still sit under the keys of the other rule: its marker
/// names another rule, or there is none (a re-key that could not run, or has not yet).
pub fn pending(root: &std::path::Path, network: &str, rule: PodKeyRule) -> bool {
    marked(root, network) != Some(rule)
}

/// The rule that is not `rule`.
pub fn other(rule: PodKeyRule) -> PodKeyRule {
    PodKeyRule::CHOICES
        .iter()
        .map(|(_, r)| *r)
        .find(|r| *r != rule)
        .unwrap_or(rule)
}

/// Writes an entry's sealed text (a symlink target, read from `from`) at `dir/name` as the
/// regular file releases before the symlink form read, durably, by an atomic rename.
fn write_as_file(
    dir: &std::path::Path,
    name: &str,
    text: &[u8],
    from: &std::path::Path,
) -> Result<()> {
    let mut bytes = text.to_vec();
    bytes.push(b'\n');
    super::sealed::replace(dir, name, &bytes, super::sealed::Durability::Durable)
        .map_err(|e| crate::error::GuardError::io("rewrite as a regular file", from, e))
}

impl Store {
    /// The owners of `key` the re-key would merge into it, read where they sit now: every valid
    /// owner file of the same pod under the other rule, cut down to the interfaces `key`
    /// stands for. For a DEL judged while the re-key cannot run (a store that takes no
    /// write): without them an old sandbox's DEL would pass while the new one owns the pod.
    /// Lists the owners folder; only a network whose re-key is pending pays for it.
    pub fn owners_under_other_rule(&self, key: &PodKey) -> Result<Vec<Ownership>> {
        let mut parts = Vec::new();
        for (_, loaded) in self.list_owners()? {
            let Loaded::Valid(owner) = loaded else {
                continue;
            };
            let same_pod = (
                &owner.key.network,
                &owner.key.pod_namespace,
                &owner.key.pod_name,
            ) == (&key.network, &key.pod_namespace, &key.pod_name);
            if !same_pod || owner.key.rule() == key.rule() {
                continue;
            }
            for if_name in owner.interfaces() {
                if key
                    .rule()
                    .key(&key.network, &key.pod_namespace, &key.pod_name, if_name)
                    == *key
                {
                    parts.push(Ownership {
                        key: key.clone(),
                        interfaces: vec![if_name.to_string()],
                        ..owner.clone()
                    });
                }
            }
        }
        Ok(parts)
    }

    /// See the module's comment for the order and why a crash anywhere in it is safe.
    /// `stray`: files of the other rule were found after the marker (see `ensure`); the
    /// move runs whatever the marker says.
    pub fn rekey(&self, network: &str, rule: PodKeyRule, stray: bool) -> Result<()> {
        if !stray && marked(&self.root, network) == Some(rule) {
            return Ok(());
        }
        let new_key = |key: &PodKey, if_name: &str| {
            rule.key(&key.network, &key.pod_namespace, &key.pod_name, if_name)
        };

        let damaged = self.rekey_untrusted_owners(network, rule)?;

        // Owners: grouped by their new key with the owner already there, merged, written.
        let mut old_owners: Vec<PodKey> = Vec::new();
        let mut groups: BTreeMap<String, (PodKey, Vec<Ownership>)> = BTreeMap::new();
        for (_, loaded) in self.list_owners()? {
            let Loaded::Valid(owner) = loaded else {
                continue;
            };
            if owner.key.network != network || owner.key.rule() == rule {
                continue;
            }
            for if_name in owner.interfaces() {
                let key = new_key(&owner.key, if_name);
                let part = Ownership {
                    key: key.clone(),
                    interfaces: vec![if_name.to_string()],
                    ..owner.clone()
                };
                groups
                    .entry(key.digest())
                    .or_insert_with(|| (key, Vec::new()))
                    .1
                    .push(part);
            }
            old_owners.push(owner.key);
        }
        for (key, mut owners) in groups.into_values() {
            if let Some(damaged) = damaged.get(&key.digest()) {
                owners.retain(|owner| owner.generation > damaged.generation);
            }
            if let Loaded::Valid(there) = self.load_owner(&key)? {
                owners.push(there);
            }
            // Generations of different keys were never compared before the move, and the
            // release before this one never synced the counter they come from: after a power
            // cut an older ADD may carry the higher one. A sandbox whose netns is gone is no
            // candidate while one of another sandbox lives; among the living the last ADD wins.
            let alive: Vec<bool> = owners.iter().map(|o| self.sandbox_alive(o)).collect();
            if alive.contains(&true) && alive.contains(&false) {
                let mut alive = alive.into_iter();
                owners.retain(|_| alive.next().unwrap_or(true));
            }
            if let Some(owner) = ownership::merged(&key, &owners) {
                self.save_owner(&owner)?;
            }
        }
        self.sync()?;

        // Deferred DELs: each written under its new key (durably) before the old goes.
        for (_, loaded) in self.list_deferred()? {
            let Loaded::Valid(mut entry) = loaded else {
                continue;
            };
            if entry.key.network != network || entry.key.rule() == rule {
                continue;
            }
            let (old_key, id) = (entry.key.clone(), entry.id());
            entry.key = new_key(&old_key, &id.if_name);
            entry.interface = entry.key.if_name.is_none().then(|| id.if_name.clone());
            self.save_deferred(&entry)?;
            self.remove_deferred(&old_key, &id)?;
        }

        // The ledger: counts added up under the new key, each old entry taken in once. An
        // entry taken in and removed by an earlier re-key is forgotten first: the other rule's
        // key may have an entry again (the rule was switched back and forth), and its counts
        // are new.
        for mut entry in self.list_ledger()? {
            let before = entry.merged_from.len();
            // A name from a file is checked before it makes a path; one that is no digest
            // names no entry.
            entry.merged_from.retain(|digest| {
                digest.len() == 64
                    && digest.bytes().all(|b| b.is_ascii_hexdigit())
                    && !surely_absent(&self.ledger.join(digest))
            });
            if entry.key.network == network && entry.merged_from.len() < before {
                self.save_ledger(&entry)?;
            }
        }
        let mut old_entries = Vec::new();
        for entry in self.list_ledger()? {
            if entry.key.network != network || entry.key.rule() == rule {
                continue;
            }
            let digest = entry.key.digest();
            let parts = match &entry.key.if_name {
                // One key per interface to the pod's key: the entry is taken in whole.
                Some(if_name) => vec![(new_key(&entry.key, if_name), entry.clone())],
                // The pod's key to one per interface: cut by the interfaces its stale DELs
                // came by. Counts of no known interface go to the pod's only one; without
                // it the entry stays where it is, history only, rather than be guessed.
                None => {
                    let only = self.only_interface(&entry.key)?;
                    let Some(parts) = entry
                        .per_interface(only.as_deref(), |if_name| new_key(&entry.key, if_name))
                    else {
                        continue;
                    };
                    parts
                        .into_iter()
                        .map(|part| (part.key.clone(), part))
                        .collect()
                }
            };
            for (key, part) in parts {
                match self.load_ledger(&key)? {
                    Loaded::Valid(mut there) if !there.merged_from.contains(&digest) => {
                        there.absorb(&part, &digest);
                        self.save_ledger(&there)?;
                    }
                    Loaded::Valid(_) => {}
                    _ => {
                        let mut fresh = LedgerEntry {
                            key,
                            merged_from: Vec::new(),
                            by_interface: Default::default(),
                            refused: 0,
                            audited: 0,
                            deferred: 0,
                            more_sandboxes: 0,
                            stale_sandboxes: Vec::new(),
                            ..part.clone()
                        };
                        fresh.absorb(&part, &digest);
                        self.save_ledger(&fresh)?;
                    }
                }
            }
            old_entries.push(entry.key);
        }
        self.sync()?;

        // The old files go only now that what replaces them is durable.
        for key in old_entries {
            self.remove_ledger(&key)?;
        }
        for key in old_owners {
            self.remove_owner(&key)?;
        }
        self.sync()?;
        self.mark(network, rule)
    }

    /// An owner file that fails its checksum cannot say whose pod it is, nor can a set-aside
    /// one that blocks the DELs needing it; the records can: each record's key under the other
    /// rule names the old file, its key under `rule` where it must block now. A corrupt owner
    /// is set aside there, blocking (the DEL that needs it is refused, as before the move); a
    /// blocker is linked there, then the old name goes. Returns `damaged_owners` of what it found.
    fn rekey_untrusted_owners(
        &self,
        network: &str,
        rule: PodKeyRule,
    ) -> Result<BTreeMap<String, Damaged>> {
        let damaged = self.damaged_owners(network, rule, None, true)?;
        let mut old_blockers = Vec::new();
        for (_, loaded) in self.list_records()? {
            let Loaded::Valid(record) = loaded else {
                continue;
            };
            let (Some(old), Some(new)) = (record.pod_key(other(rule)), record.pod_key(rule)) else {
                continue;
            };
            if record.network != network {
                continue;
            }
            let blocker = self.set_aside_path_for_owner(&old);
            if !surely_absent(&blocker) {
                let target = self.set_aside_path_for_owner(&new);
                if surely_absent(&target) {
                    std::fs::hard_link(&blocker, &target).map_err(|e| {
                        crate::error::GuardError::io(
                            "move a set-aside ownership to its new key",
                            &blocker,
                            e,
                        )
                    })?;
                    self.mark_dirty(super::Dir::SetAside);
                }
                old_blockers.push(blocker);
            }
        }
        self.sync()?;
        for blocker in old_blockers {
            super::remove(&blocker)?;
            self.mark_dirty(super::Dir::SetAside);
        }
        self.sync()?;
        Ok(damaged)
    }

    /// The owner files of `network` that cannot be trusted, found through the records (of
    /// `pod`'s only, if given): per key under `rule` (by digest), the file and the highest
    /// generation it could hold, that of the newest record filed under it. A file of the other
    /// rule that fails its checksum or is set aside blocking, or one under `rule` set aside
    /// blocking, counts. An owner merged from the other rule's files must be newer than that:
    /// the damaged file may name the sandbox that took the pod last. `move_aside`: a corrupt
    /// file of the other rule is set aside where it blocks under `rule` (the re-key); without
    /// it nothing is written (a DEL judging a store that cannot be re-keyed).
    pub fn damaged_owners(
        &self,
        network: &str,
        rule: PodKeyRule,
        pod: Option<(&str, &str)>,
        move_aside: bool,
    ) -> Result<BTreeMap<String, Damaged>> {
        let mut damaged: BTreeMap<String, Damaged> = BTreeMap::new();
        let mut corrupt_old: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (_, loaded) in self.list_records()? {
            let Loaded::Valid(record) = loaded else {
                continue;
            };
            let (Some(old), Some(new)) = (record.pod_key(other(rule)), record.pod_key(rule)) else {
                continue;
            };
            if record.network != network
                || pod.is_some_and(|(ns, name)| {
                    (ns, name) != (new.pod_namespace.as_str(), new.pod_name.as_str())
                })
            {
                continue;
            }
            if !corrupt_old.contains_key(&old.digest())
                && let Loaded::Corrupt { path, .. } = self.load_owner(&old)?
                && !surely_absent(&path)
            {
                let kept = if move_aside {
                    self.set_aside(&path, &self.set_aside_path_for_owner(&new), true)?
                } else {
                    path
                };
                corrupt_old.insert(old.digest(), kept);
            }
            let file = corrupt_old
                .get(&old.digest())
                .cloned()
                .into_iter()
                .chain(
                    [
                        self.set_aside_path_for_owner(&old),
                        self.set_aside_path_for_owner(&new),
                    ]
                    .into_iter()
                    .filter(|path| !surely_absent(path)),
                )
                .next();
            if let Some(file) = file {
                let found = damaged.entry(new.digest()).or_insert(Damaged {
                    file,
                    generation: 0,
                });
                found.generation = found.generation.max(record.generation);
            }
        }
        Ok(damaged)
    }
    /// Puts the store back in the form the release before the pod key reads, for a downgrade
    /// to it: every network's owners, deferred DELs and ledger moved to the keys of
    /// "name-and-ifname" (that release's only rule; the move is `rekey`'s, crash-safe, run
    /// whatever the markers say), then every record, ownership and address index entry that
    /// is a symlink (this release's form, which that release and, for records, every release
    /// before this one refuse) rewritten as the regular file it read, each by an atomic
    /// rename, and the records such a release set aside put back. Run under the store's lock;
    /// running it again finds nothing left to do. A ledger entry of a whole pod ("name") is cut into one per
    /// interface by the counts it keeps per interface; one whose counts no interface can be
    /// found for (counts outside `by_interface`, of a pod without one single interface on the
    /// node) stays, and that release skips it (history only):
    /// `Store::ledger_left_behind` counts those.
    /// Returns the networks moved and how many entries were rewritten.
    pub fn downgrade(&self) -> Result<(Vec<String>, usize)> {
        // Replays must not move the deferred DELs meanwhile: the caller holds them off
        // (`hold_off_replays`).
        // The marker goes first: without it, the next release that knows boots adopts what
        // the release before writes (and stamps it); with it, that release's owners would go
        // aside at the next boot, and a run cut short would leave rewritten files under it.
        if super::remove(&self.root.join(super::boot::BOOT))? {
            sync_path(&self.root)?;
        }
        let mut networks = std::collections::BTreeSet::new();
        if let Ok(markers) = std::fs::read_dir(self.root.join(POD_KEYS)) {
            for name in markers
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
            {
                if !name.starts_with('.')
                    && crate::names::check_plain(
                        "network",
                        &name,
                        crate::names::MAX_NETWORK,
                        crate::error::Kind::Io,
                    )
                    .is_ok()
                {
                    networks.insert(name);
                }
            }
        }
        for (_, loaded) in self.list_owners()? {
            if let Loaded::Valid(owner) = loaded {
                networks.insert(owner.key.network);
            }
        }
        for (_, loaded) in self.list_deferred()? {
            if let Loaded::Valid(entry) = loaded {
                networks.insert(entry.key.network);
            }
        }
        for network in &networks {
            self.rekey(network, PodKeyRule::NameAndIfname, true)?;
        }
        let mut rewritten = 0;
        for dir in [
            self.records.clone(),
            self.owners.clone(),
            self.root.join(super::IPS),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(target) = std::fs::read_link(entry.path()) else {
                    continue;
                };
                // A link that holds no sealed text was not written by the store: left alone.
                let text = target.as_os_str().as_encoded_bytes();
                if name.starts_with('.') || !text.starts_with(b"{") {
                    continue;
                }
                let text = super::entry_text::expand(text);
                write_as_file(&dir, &name, &text, &entry.path())?;
                rewritten += 1;
            }
            sync_path(&dir)?;
        }
        rewritten += self.restore_set_aside_records()?;
        // This boot's files were written without a sync (`boot`), and the release before
        // knows no boot: after a power cut it would judge by whatever of them reached the disk.
        let root = std::fs::File::open(&self.root)
            .map_err(|e| GuardError::io("open the state dir", &self.root, e))?;
        nix::unistd::syncfs(&root)
            .map_err(|e| GuardError::io("sync the file system of", &self.root, e.into()))?;
        Ok((networks.into_iter().collect(), rewritten))
    }

    /// A release before the record's symlink form cannot open a record that is one: its GC
    /// sets each it finds aside as if damaged, where it refuses its attachment's DELs, and
    /// removing it as that release's dump advises would leave its owner without a record.
    /// Such a record still verifies (one set aside by this release never does): put back in
    /// `records/` as the file that release reads, where no record took its place since, and
    /// taken out of `set-aside/`, the record first.
    fn restore_set_aside_records(&self) -> Result<usize> {
        let Ok(entries) = std::fs::read_dir(&self.set_aside) else {
            return Ok(0);
        };
        let mut restored = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with('.')
                || name.starts_with(super::OWNER_PREFIX)
                || super::checkpoint::is_kept_copy(&name)
                || !entry.file_type().is_ok_and(|t| t.is_symlink())
                || !matches!(
                    super::sealed::read_entry::<super::checkpoint::Checkpoint>(&path),
                    Ok(Loaded::Valid(_))
                )
            {
                continue;
            }
            if surely_absent(&self.records.join(&name)) {
                let target = std::fs::read_link(&path)
                    .map_err(|e| crate::error::GuardError::io("read", &path, e))?;
                write_as_file(
                    &self.records,
                    &name,
                    &super::entry_text::expand(target.as_os_str().as_encoded_bytes()),
                    &path,
                )?;
            }
            restored.push(path);
        }
        if restored.is_empty() {
            return Ok(0);
        }
        sync_path(&self.records)?;
        for path in &restored {
            super::remove(path)?;
        }
        sync_path(&self.set_aside)?;
        Ok(restored.len())
    }

    /// Whether `owner`'s sandbox may still live: the netns its record names exists, or no
    /// record says (it cannot be ruled out).
    fn sandbox_alive(&self, owner: &Ownership) -> bool {
        owner.interfaces().into_iter().all(|if_name| {
            let id = super::checkpoint::AttachmentId::of(&owner.key, &owner.container_id, if_name);
            match self.load_record(&id) {
                Ok(Loaded::Valid(record)) => {
                    crate::kernel::netns::netns_state(&record.netns, None, None).is_alive()
                }
                _ => true,
            }
        })
    }

    /// The ledger entries of whole pods' keys a downgrade could not cut per interface (see
    /// `downgrade`): history the release before cannot read.
    pub fn ledger_left_behind(&self) -> Result<usize> {
        Ok(self
            .list_ledger()?
            .iter()
            .filter(|entry| entry.key.if_name.is_none())
            .count())
    }

    /// The one interface the pod's owner under `key` (a key of the whole pod) holds, if it
    /// holds exactly one.
    fn only_interface(&self, key: &PodKey) -> Result<Option<String>> {
        Ok(match self.load_owner(key)? {
            Loaded::Valid(owner) => match owner.interfaces().as_slice() {
                [if_name] => Some(if_name.to_string()),
                _ => None,
            },
            _ => None,
        })
    }

    /// Writes the marker durably: the re-key is done.
    fn mark(&self, network: &str, rule: PodKeyRule) -> Result<()> {
        let dir = self.root.join(POD_KEYS);
        ensure_dir(&dir)?;
        super::sealed::write(&dir, network, &rule.name())?;
        sync_path(&dir)?;
        sync_path(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::Handled;

    fn old_key(if_name: &str) -> PodKey {
        PodKeyRule::NameAndIfname.key("net", "lijiaob", "etcd1-0", if_name)
    }

    /// What the release before podKey left: A owned (net1) at generation 1, then B (net2) at
    /// 2; two stale DELs of A refused under B's key.
    fn leave_old_files(store: &Store) {
        for (container, if_name, generation) in [("A", "net1", 1), ("B", "net2", 2)] {
            store
                .save_owner(&ownership::taken(
                    &old_key(if_name),
                    container,
                    if_name,
                    None,
                    generation,
                    None,
                ))
                .unwrap();
        }
        store.sync().unwrap();
    }

    /// A new store at a temp dir named `name`, with `leave_old_files` and two refusals of A
    /// under net2's key, as the release before counted them.
    fn old_store_with_two_refusals(name: &str) -> (PathBuf, Store) {
        let root = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = Store::open(&root, Duration::from_secs(1)).unwrap();
        leave_old_files(&store);
        for _ in 0..2 {
            store
                .note_stale_del(&old_key("net2"), Handled::Refused, "net2", "A", "B", 2)
                .unwrap();
        }
        store.sync().unwrap();
        (root, store)
    }

    #[test]
    fn a_rekey_cut_short_by_a_crash_gives_the_same_store_when_run_again() {
        let (root, store) = old_store_with_two_refusals("sg-rekey-test");
        let old_ledger = std::fs::read(root.join("ledger").join(old_key("net2").digest())).unwrap();

        store.rekey("net", PodKeyRule::Name, false).unwrap();
        let new_key = PodKeyRule::Name.key("net", "lijiaob", "etcd1-0", "net2");
        let check = |store: &Store| {
            let Loaded::Valid(owner) = store.load_owner(&new_key).unwrap() else {
                panic!("no owner under the name key")
            };
            assert_eq!(
                (
                    owner.container_id.as_str(),
                    owner.generation,
                    owner.interfaces()
                ),
                ("B", 2, vec!["net2"])
            );
            let Loaded::Valid(ledger) = store.load_ledger(&new_key).unwrap() else {
                panic!("no ledger entry")
            };
            assert_eq!(ledger.refused, 2);
            assert_eq!(
                store.list_owners().unwrap().len(),
                1,
                "the old owners are gone"
            );
            assert_eq!(
                store.list_ledger().unwrap().len(),
                1,
                "the old entry is gone"
            );
        };
        check(&store);

        // A crash after the new files were durable, before the old ones and the marker went.
        leave_old_files(&store);
        std::fs::write(
            root.join("ledger").join(old_key("net2").digest()),
            &old_ledger,
        )
        .unwrap();
        std::fs::remove_file(root.join(POD_KEYS).join("net")).unwrap();
        store.rekey("net", PodKeyRule::Name, false).unwrap();
        check(&store);

        // And back to one key per interface: each interface's key gets the owner that held it.
        store
            .rekey("net", PodKeyRule::NameAndIfname, false)
            .unwrap();
        let Loaded::Valid(owner) = store.load_owner(&old_key("net2")).unwrap() else {
            panic!("no owner of net2")
        };
        assert_eq!(
            (owner.container_id.as_str(), owner.key.if_name.as_deref()),
            ("B", Some("net2"))
        );
        assert_eq!(marked(&root, "net"), Some(PodKeyRule::NameAndIfname));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn switching_the_rule_back_and_forth_keeps_every_refusal_counted() {
        let root = std::env::temp_dir().join(format!("sg-rekey-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = Store::open(&root, Duration::from_secs(1)).unwrap();
        leave_old_files(&store);
        let count = |store: &Store, key: &PodKey| {
            store
                .note_stale_del(key, Handled::Refused, "net2", "A", "B", 2)
                .and_then(|()| store.sync())
                .unwrap()
        };
        let name_key = PodKeyRule::Name.key("net", "lijiaob", "etcd1-0", "net2");
        let refused = |store: &Store| match store.load_ledger(&name_key).unwrap() {
            Loaded::Valid(entry) => entry.refused,
            _ => 0,
        };
        // Two refusals by the old release, one under "name".
        count(&store, &old_key("net2"));
        count(&store, &old_key("net2"));
        store.rekey("net", PodKeyRule::Name, false).unwrap();
        count(&store, &name_key);
        // The operator switches to "name-and-ifname": two more, under net2's key again.
        store
            .rekey("net", PodKeyRule::NameAndIfname, false)
            .unwrap();
        count(&store, &old_key("net2"));
        count(&store, &old_key("net2"));
        // And back: all five are the pod's.
        store.rekey("net", PodKeyRule::Name, false).unwrap();
        assert_eq!(
            refused(&store),
            5,
            "the refusals made under name-and-ifname are kept"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_downgrade_gives_each_interface_the_stale_dels_it_counted_under_the_pods_key() {
        // Two refusals under net2's key by the release before; the upgrade; then, under the
        // pod's key, two more by net2 and one deferral by net1.
        let (root, store) = old_store_with_two_refusals("sg-rekey-down");
        store.rekey("net", PodKeyRule::Name, false).unwrap();
        let pod_key = PodKeyRule::Name.key("net", "lijiaob", "etcd1-0", "net2");
        for (if_name, handled) in [
            ("net2", Handled::Refused),
            ("net2", Handled::Refused),
            ("net1", Handled::Deferred),
        ] {
            store
                .note_stale_del(&pod_key, handled, if_name, "A", "B", 2)
                .unwrap();
        }
        store.sync().unwrap();
        let pod_entry = std::fs::read(root.join("ledger").join(pod_key.digest())).unwrap();

        store.downgrade().unwrap();
        let counts = |if_name: &str| match store.load_ledger(&old_key(if_name)).unwrap() {
            Loaded::Valid(entry) => (entry.refused, entry.deferred),
            _ => (0, 0),
        };
        assert_eq!(
            counts("net2"),
            (4, 0),
            "net2's own history and what came since"
        );
        assert_eq!(counts("net1"), (0, 1));
        assert_eq!(
            store.ledger_left_behind().unwrap(),
            0,
            "nothing stays under the pod's key"
        );
        // Each file is one the release before reads: a key with its ifname.
        for file in std::fs::read_dir(root.join("ledger")).unwrap().flatten() {
            let text = std::fs::read_to_string(file.path()).unwrap();
            assert!(text.contains("\"ifName\""), "{text}");
        }
        // A crash after the cut entries were durable, before the pod's entry went: run
        // again, nothing counted twice.
        std::fs::write(root.join("ledger").join(pod_key.digest()), &pod_entry).unwrap();
        store.downgrade().unwrap();
        assert_eq!((counts("net2"), counts("net1")), ((4, 0), (0, 1)));
        assert_eq!(store.ledger_left_behind().unwrap(), 0);
        let _ = std::fs::remove_dir_all(&root);
    }
}
