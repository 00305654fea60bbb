//! The refusal ledger: per pod key, how many stale DELs the guard refused, let through in
//! audit mode or deferred, when the first and the last came, the owner the last one
//! protected and the stale sandboxes that sent them. `--doctor` and the dump read it; the
//! log is read only for what happened before a node had a ledger.
//!
//! `<stateDir>/ledger/<sha256 of the pod key>`, one sealed file each, written by the verb that
//! handles the stale DEL under the store's lock it holds anyway. Bounded twice: an entry keeps
//! at most `MAX_SANDBOXES` stale sandboxes (the newest; `moreSandboxes` counts the others),
//! and the folder at most `MAX_ENTRIES` entries: a new pod key past that drops the entry
//! written longest ago. ADD and a DEL that is not stale never touch it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ownership::PodKey;
use super::sealed::{self, Loaded};
use super::{Store, read_for_listing};
use crate::error::{GuardError, Result};

pub const LEDGER: &str = "ledger";
/// Stale sandboxes an entry names; a pod that churns for days still takes one small file.
pub const MAX_SANDBOXES: usize = 8;
/// Pod keys the ledger remembers. A node runs at most a few hundred pods; this keeps their
/// history and that of pods long gone without letting the folder grow for ever.
pub const MAX_ENTRIES: usize = 1024;

/// What the guard did with a stale DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Refused,
    Audited,
    /// Delegate mode: answered with success, kept from the primary until the pod is free.
    Deferred,
}

/// The stale DELs of one interface, as an entry of a whole pod's key counts them apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub refused: u64,
    pub audited: u64,
    pub deferred: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.refused += other.refused;
        self.audited += other.audited;
        self.deferred += other.deferred;
    }

    fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    #[serde(flatten)]
    pub key: PodKey,
    pub refused: u64,
    pub audited: u64,
    pub deferred: u64,
    /// RFC 3339, the first and the latest stale DEL of the key.
    pub first_at: String,
    pub last_at: String,
    /// The sandbox the latest stale DEL was kept from tearing down, and its generation.
    pub owner: String,
    pub owner_generation: u64,
    /// The stale sandboxes, oldest first, at most MAX_SANDBOXES.
    pub stale_sandboxes: Vec<String>,
    /// Stale sandboxes that no longer fit in `stale_sandboxes`.
    #[serde(default)]
    pub more_sandboxes: u64,
    /// The digests of the entries under another rule's keys that this one took in (see
    /// `rekey`): a re-key interrupted by a crash does not count them twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// Under a key of the whole pod ("name"): the counts per interface the stale DELs came
    /// by, so that a move back to one key per interface (the rule switched back, a
    /// downgrade) gives each interface's key its own entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_interface: BTreeMap<String, Counts>,
}

impl LedgerEntry {
    fn note(
        &mut self,
        handled: Handled,
        if_name: &str,
        stale: &str,
        owner: &str,
        owner_generation: u64,
        now: &str,
    ) {
        let one = match handled {
            Handled::Refused => Counts {
                refused: 1,
                ..Counts::default()
            },
            Handled::Audited => Counts {
                audited: 1,
                ..Counts::default()
            },
            Handled::Deferred => Counts {
                deferred: 1,
                ..Counts::default()
            },
        };
        self.add_counts(one);
        if self.key.if_name.is_none() {
            self.by_interface
                .entry(if_name.to_string())
                .or_default()
                .add(one);
        }
        self.last_at = now.to_string();
        self.owner = owner.to_string();
        self.owner_generation = owner_generation;
        if let Some(at) = self.stale_sandboxes.iter().position(|s| s == stale) {
            let again = self.stale_sandboxes.remove(at);
            self.stale_sandboxes.push(again);
        } else {
            self.stale_sandboxes.push(stale.to_string());
            if self.stale_sandboxes.len() > MAX_SANDBOXES {
                self.stale_sandboxes.remove(0);
                self.more_sandboxes += 1;
            }
        }
    }
}

impl LedgerEntry {
    pub fn counts(&self) -> Counts {
        Counts {
            refused: self.refused,
            audited: self.audited,
            deferred: self.deferred,
        }
    }

    fn add_counts(&mut self, counts: Counts) {
        self.refused += counts.refused;
        self.audited += counts.audited;
        self.deferred += counts.deferred;
    }

    /// An entry of the whole pod cut into one per interface, each with the counts of its
    /// stale DELs (the history otherwise the same), under `key_of(if_name)`; counts that no
    /// interface is known for go to the pod's only interface, `only` when given. `None` when
    /// some counts can go nowhere: the entry cannot be cut without losing them.
    pub fn per_interface(
        &self,
        only: Option<&str>,
        key_of: impl Fn(&str) -> PodKey,
    ) -> Option<Vec<LedgerEntry>> {
        let mut parts = self.by_interface.clone();
        let mut known = Counts::default();
        for counts in parts.values() {
            known.add(*counts);
        }
        let mut rest = self.counts();
        rest.refused = rest.refused.saturating_sub(known.refused);
        rest.audited = rest.audited.saturating_sub(known.audited);
        rest.deferred = rest.deferred.saturating_sub(known.deferred);
        if !rest.is_zero() {
            let single = match parts.len() {
                1 => parts.keys().next().cloned(),
                0 => only.map(str::to_string),
                _ => None,
            };
            parts.entry(single?).or_default().add(rest);
        }
        Some(
            parts
                .into_iter()
                .map(|(if_name, counts)| LedgerEntry {
                    key: key_of(&if_name),
                    refused: counts.refused,
                    audited: counts.audited,
                    deferred: counts.deferred,
                    merged_from: Vec::new(),
                    by_interface: BTreeMap::new(),
                    ..self.clone()
                })
                .collect(),
        )
    }

    /// Takes in the counts of `other`, an entry of a key this one's replaces (see `rekey`):
    /// counts add up, the first and latest times span both, the owner is the latest one's.
    /// `from`: the digest of the file `other` came from (its key's, unless it was cut).
    pub fn absorb(&mut self, other: &LedgerEntry, from: &str) {
        self.add_counts(other.counts());
        if self.key.if_name.is_none() {
            let mut theirs = other.by_interface.clone();
            if let Some(if_name) = &other.key.if_name {
                theirs
                    .entry(if_name.clone())
                    .or_default()
                    .add(other.counts());
            }
            for (if_name, counts) in theirs {
                self.by_interface.entry(if_name).or_default().add(counts);
            }
        }
        if other.first_at < self.first_at {
            self.first_at.clone_from(&other.first_at);
        }
        if other.last_at > self.last_at {
            self.last_at.clone_from(&other.last_at);
            self.owner.clone_from(&other.owner);
            self.owner_generation = other.owner_generation;
        }
        self.more_sandboxes += other.more_sandboxes;
        for stale in &other.stale_sandboxes {
            if !self.stale_sandboxes.contains(stale) {
                self.stale_sandboxes.push(stale.clone());
            }
        }
        while self.stale_sandboxes.len() > MAX_SANDBOXES {
            self.stale_sandboxes.remove(0);
            self.more_sandboxes += 1;
        }
        self.merged_from.push(from.to_string());
    }
}

impl Store {
    fn ledger_path(&self, key: &PodKey) -> PathBuf {
        self.ledger.join(key.digest())
    }

    /// Counts one stale DEL of `key` by `stale` that protected `owner`. The entry is written
    /// (data fsynced) and its folder marked for the verb's `sync`, so it rides in the
    /// directory sync the verb makes anyway; a verb that changes nothing else syncs for it.
    /// A store opened read-only (its disk failed) records nothing.
    pub fn note_stale_del(
        &self,
        key: &PodKey,
        handled: Handled,
        if_name: &str,
        stale: &str,
        owner: &str,
        owner_generation: u64,
    ) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        let created = super::surely_absent(&self.ledger);
        super::ensure_dir(&self.ledger)?;
        let now = crate::clock::now_rfc3339();
        let mut entry = match self.load_ledger(key)? {
            Loaded::Valid(entry) => entry,
            // A damaged entry is history only: it starts again rather than blocking anything.
            Loaded::Missing | Loaded::Corrupt { .. } => {
                self.make_room_in_ledger();
                LedgerEntry {
                    key: key.clone(),
                    refused: 0,
                    audited: 0,
                    deferred: 0,
                    first_at: now.clone(),
                    last_at: now.clone(),
                    owner: String::new(),
                    owner_generation: 0,
                    stale_sandboxes: Vec::new(),
                    more_sandboxes: 0,
                    merged_from: Vec::new(),
                    by_interface: BTreeMap::new(),
                }
            }
        };
        entry.note(handled, if_name, stale, owner, owner_generation, &now);
        // History: synced only where the store is not scoped to the boot (docs/store.md).
        let durability = self.durability();
        sealed::replace(
            &self.ledger,
            &key.digest(),
            &sealed::seal(&entry),
            durability,
        )
        .map_err(|e| GuardError::io("write checkpoint", &self.ledger.join(key.digest()), e))?;
        self.mark_dirty(super::Dir::Ledger);
        if created && self.durable {
            super::sync_path(&self.root)?;
        }
        Ok(())
    }

    /// Writes an entry whole (a re-key's); the caller syncs.
    pub fn save_ledger(&self, entry: &LedgerEntry) -> Result<()> {
        super::ensure_dir(&self.ledger)?;
        sealed::write(&self.ledger, &entry.key.digest(), entry)?;
        self.mark_dirty(super::Dir::Ledger);
        Ok(())
    }

    pub fn remove_ledger(&self, key: &PodKey) -> Result<()> {
        super::remove(&self.ledger_path(key))?;
        self.mark_dirty(super::Dir::Ledger);
        Ok(())
    }

    pub fn load_ledger(&self, key: &PodKey) -> Result<Loaded<LedgerEntry>> {
        Ok(match sealed::read::<LedgerEntry>(&self.ledger_path(key))? {
            Loaded::Valid(entry) if entry.key != *key => Loaded::Corrupt {
                path: self.ledger_path(key),
                reason: "it names another pod key than its file name stands for".to_string(),
            },
            other => other,
        })
    }

    /// Every ledger entry that verifies and is filed under its own key, for the doctor and the
    /// dump (readers: under the shared lock, creating nothing). Damaged files are skipped.
    pub fn list_ledger(&self) -> Result<Vec<LedgerEntry>> {
        let listed = super::list(&self.ledger, |path| {
            Ok(read_for_listing::<LedgerEntry>(path))
        })?;
        Ok(listed
            .into_iter()
            .filter_map(|(path, loaded)| match loaded {
                Loaded::Valid(entry)
                    if file_name_is(&path, &entry.key.digest()) && plain_key(&entry.key) =>
                {
                    Some(entry)
                }
                _ => None,
            })
            .collect())
    }

    /// Past MAX_ENTRIES, drops the entries written longest ago (their mtime) so that one more
    /// fits. Only a stale DEL of a pod key the ledger does not know yet lists the folder.
    fn make_room_in_ledger(&self) {
        let Ok(entries) = fs::read_dir(&self.ledger) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|entry| !entry.file_name().as_encoded_bytes().starts_with(b"."))
            .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
            .collect();
        if files.len() < MAX_ENTRIES {
            return;
        }
        files.sort();
        for (_, path) in files.iter().take(files.len() + 1 - MAX_ENTRIES) {
            let _ = super::remove(path);
        }
        self.mark_dirty(super::Dir::Ledger);
    }
}

fn file_name_is(path: &Path, name: &str) -> bool {
    path.file_name().is_some_and(|n| n == name)
}

/// A checksum is no signature: names from a file are checked before they reach a report.
fn plain_key(key: &PodKey) -> bool {
    use crate::error::Kind;
    use crate::names::{MAX_NETWORK, check_ifname, check_plain};
    check_plain("network", &key.network, MAX_NETWORK, Kind::Io).is_ok()
        && key
            .if_name
            .as_deref()
            .is_none_or(|if_name| check_ifname(if_name).is_ok())
        && !key.pod_namespace.is_empty()
        && !key.pod_name.is_empty()
        && !format!("{}{}", key.pod_namespace, key.pod_name)
            .contains(|c: char| c.is_whitespace() || c.is_control() || c == '/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PodKey {
        PodKey {
            network: "net".into(),
            pod_namespace: "ns".into(),
            pod_name: "p-0".into(),
            if_name: None,
        }
    }

    #[test]
    fn counts_and_caps_the_stale_sandboxes() {
        let mut entry = LedgerEntry {
            key: key(),
            refused: 0,
            audited: 0,
            deferred: 0,
            first_at: "t0".into(),
            last_at: "t0".into(),
            owner: String::new(),
            owner_generation: 0,
            stale_sandboxes: Vec::new(),
            more_sandboxes: 0,
            merged_from: Vec::new(),
            by_interface: BTreeMap::new(),
        };
        for n in 0..(MAX_SANDBOXES + 3) {
            entry.note(
                Handled::Refused,
                "eth0",
                &format!("s{n}"),
                "own",
                7,
                &format!("t{}", n + 1),
            );
        }
        entry.note(Handled::Deferred, "net1", "s5", "own2", 8, "tz");
        assert_eq!(
            (entry.refused, entry.deferred, entry.audited),
            (MAX_SANDBOXES as u64 + 3, 1, 0)
        );
        assert_eq!(entry.stale_sandboxes.len(), MAX_SANDBOXES);
        assert_eq!(entry.stale_sandboxes.last().map(String::as_str), Some("s5"));
        assert_eq!(entry.more_sandboxes, 3);
        assert_eq!(
            (
                entry.first_at.as_str(),
                entry.last_at.as_str(),
                entry.owner.as_str()
            ),
            ("t0", "tz", "own2")
        );
    }
}
