//! Delegate mode's deferred DELs: a stale DEL the guard answered with success without
//! passing it to the primary, kept until the pod key is free and the primary can be given
//! it without tearing down the owner's network (see `ownership`, rule 5).
//!
//! `<stateDir>/deferred/<sha256 of the pod key>/<network>:<container>:<if>`, one sealed file
//! each. A folder per key: the owner's DEL replays its key's entries by listing one small
//! folder, never the whole store. Each entry is written durably before the stale DEL is
//! answered, and removed (durably) only after the primary accepted its replay: a crash
//! loses none, and at worst replays one again, which a primary's DEL must tolerate anyway.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::checkpoint::AttachmentId;
use super::held::MovedTo;
use super::ownership::PodKey;
use super::sealed::{self, Loaded};
use super::{Store, ensure_dir, remove};
use crate::error::{GuardError, Result};

pub const DEFERRED: &str = "deferred";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeferredDel {
    #[serde(flatten)]
    pub key: PodKey,
    pub container_id: String,
    pub pod_uid: Option<String>,
    /// The stale DEL's `CNI_ARGS`, replayed as they came.
    pub cni_args: String,
    pub cni_version: String,
    /// The sandbox's result (its checkpoint's, else the DEL's prevResult), replayed as the
    /// DEL's prevResult.
    pub prev_result: Option<Box<RawValue>>,
    /// Where the sandbox's interface was, and its MAC: the interface the guard removes there.
    pub netns: String,
    pub mac: Option<String>,
    /// The sandbox that owned the pod key when this DEL came; for a DEL held for the API
    /// server's pod of the name (`moved_to`), that pod's UID.
    pub owner: String,
    pub deferred_at: String,
    /// The deferral's time in nanoseconds: replays go oldest first, and several stale DELs
    /// of one pod often come within a second.
    pub deferred_at_ns: u128,
    /// Replays the primary refused so far, and what it said the last time.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub last_attempt_at: Option<String>,
    /// The stale sandbox's interface, when the key does not name it (`podKey: "name"`).
    #[serde(default, rename = "interface", skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The last attempt's wall-clock time, for earlier releases; back-offs use the boot clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ns: Option<u128>,
    /// The last attempt on the boot clock (`clock::boot_nanos`) of the boot `boot_id`: the
    /// back-off, unmoved by a wall clock set back. Of another boot, it is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_boot_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The boot the entry was made in: its `netns` and `identity` are that boot's counters,
    /// which can name a live netns of another. Absent in entries of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred_in_boot: Option<String>,
    /// How long the last replay ran, in seconds (killed or answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replay_seconds: Option<f64>,
    /// The last replay ran out of its time (`replayTimeoutSeconds`) and was killed while the
    /// primary still worked: slow or hung, not refused. Retried at the longest back-off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hung: bool,
    /// The primary's object as the stale DEL would have handed it over (its own
    /// `runtimeConfig`, no GC list) and that DEL's network `cniVersion`: the replay is that
    /// call, whatever the conflist says by then. Absent in entries of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conf_version: Option<String>,
    /// What identified the sandbox's netns and interface at its ADD (from its checkpoint):
    /// the local teardown deletes only that interface in that netns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::state::checkpoint::SandboxIdentity>,
    /// Held for the API server's pod of the name (rule 7), not for an owner here: replayed once
    /// the API has no other pod of the name that the primary's state reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<MovedTo>,
}

impl DeferredDel {
    /// The netns a repeated DEL without one of its own tears the stale interface down in:
    /// the entry's, unless it was made in another boot (nothing of that boot lives now).
    pub fn netns_in_this_boot(&self, now: Option<&str>) -> &str {
        match (&self.deferred_in_boot, now) {
            (Some(made), Some(now)) if made != now => "",
            _ => &self.netns,
        }
    }

    /// The stale sandbox's interface: the one its replay names in CNI_IFNAME.
    pub fn if_name(&self) -> &str {
        self.interface
            .as_deref()
            .or(self.key.if_name.as_deref())
            .unwrap_or_default()
    }

    pub fn id(&self) -> AttachmentId {
        AttachmentId::of(&self.key, &self.container_id, self.if_name())
    }

    /// Whether the back-off after the last attempt is over at `now_boot_ns` of boot `boot_id`.
    /// Never tried, tried in another boot, or noted by an earlier release (wall clock only):
    /// over.
    pub fn retry_due(
        &self,
        retry_after: std::time::Duration,
        now_boot_ns: u64,
        boot_id: Option<&str>,
    ) -> bool {
        match (self.boot_id.as_deref(), self.last_attempt_boot_ns) {
            (Some(then_boot), Some(then)) if Some(then_boot) == boot_id => {
                u128::from(now_boot_ns.saturating_sub(then)) >= retry_after.as_nanos()
            }
            _ => true,
        }
    }
}

/// The folder of one pod key's deferred DELs, by the key's digest. Delegate mode looks at it
/// without opening the store (a stat says whether anything waits), and GC keeps the pod
/// lock of a key that has one.
pub fn key_dir(state_dir: &Path, digest: &str) -> PathBuf {
    state_dir.join(DEFERRED).join(digest)
}

/// The deferred DELs of `network` waiting in `state_dir`, read without the lock and without
/// writing (the installer's question before it takes delegate mode away: nothing would
/// replay them after).
pub fn waiting(state_dir: &Path, network: &str) -> Result<Vec<DeferredDel>> {
    if super::surely_absent(&state_dir.join(DEFERRED)) {
        return Ok(Vec::new());
    }
    let store = Store::open_read_only(state_dir)?;
    Ok(store
        .list_deferred()?
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(entry) if entry.key.network == network => Some(entry),
            _ => None,
        })
        .collect())
}

/// Whether a pod key, by its digest, has an owner that owns it (`Store::owns`), read in the
/// verbs' view of `state_dir`; a state dir that cannot be opened counts as owned.
pub fn owned(state_dir: &Path, digest: &str) -> bool {
    Store::open_read_only(state_dir).map_or(true, |store| store.owns(digest))
}

impl Store {
    /// Whether a pod key, by its digest, has an owner that owns it: its deferred DELs surely
    /// wait then (a stat, and where there is an owner file, it and its records read; no lock).
    /// An owner whose record is gone owns nothing (`Store::owner_is_backed`), nor does one of
    /// another boot. A name that is no digest, or an owner file that cannot be read, counts
    /// as owned: nothing is done with it.
    pub fn owns(&self, digest: &str) -> bool {
        let digest_like = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        if !digest_like {
            return true;
        }
        let path = self.owners.join(digest);
        if super::surely_absent(&path) {
            return false;
        }
        match super::sealed::read_any::<super::ownership::Ownership>(&path) {
            Ok(Loaded::Valid(owner)) if owner.key.digest() == digest => {
                self.of_this_boot(owner.boot_id.as_deref()) && self.owner_is_backed(&owner)
            }
            _ => true,
        }
    }
}

impl Store {
    fn deferred_dir(&self, key: &PodKey) -> PathBuf {
        key_dir(&self.root, &key.digest())
    }

    pub fn deferred_path(&self, key: &PodKey, id: &AttachmentId) -> PathBuf {
        self.deferred_dir(key).join(id.file_name())
    }

    pub fn load_deferred(&self, key: &PodKey, id: &AttachmentId) -> Result<Loaded<DeferredDel>> {
        sealed::read(&self.deferred_path(key, id))
    }

    /// Writes the entry and makes it durable at once: the stale DEL is answered only after.
    pub fn save_deferred(&self, deferred: &DeferredDel) -> Result<()> {
        let parent = self.root.join(DEFERRED);
        let dir = self.deferred_dir(&deferred.key);
        let created = super::surely_absent(&dir);
        let parent_created = super::surely_absent(&parent);
        ensure_dir(&parent)?;
        ensure_dir(&dir)?;
        if cfg!(feature = "power-cut-control") {
            let name = deferred.id().file_name();
            return sealed::replace(
                &dir,
                &name,
                &sealed::seal(deferred),
                sealed::Durability::Hint,
            )
            .map_err(|e| GuardError::io("write checkpoint", &dir.join(name), e));
        }
        sealed::write(&dir, &deferred.id().file_name(), deferred)?;
        sync_dir(&dir)?;
        if created {
            sync_dir(&parent)?;
        }
        if parent_created {
            sync_dir(&self.root)?;
        }
        Ok(())
    }

    pub fn remove_deferred(&self, key: &PodKey, id: &AttachmentId) -> Result<()> {
        let dir = self.deferred_dir(key);
        remove(&dir.join(id.file_name()))?;
        sync_dir(&dir).or_else(|e| {
            if super::surely_absent(&dir) {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        // The key's folder goes with its last entry (a writer holds the store's lock, so
        // nobody adds to it meanwhile); a folder that is not empty stays.
        let _ = std::fs::remove_dir(&dir);
        Ok(())
    }

    /// The deferred DELs of one pod key, oldest first.
    pub fn deferred_of(&self, key: &PodKey) -> Result<Vec<(PathBuf, Loaded<DeferredDel>)>> {
        let mut found = super::list(&self.deferred_dir(key), |path| {
            Ok(super::read_for_listing(path))
        })?;
        found.sort_by_key(|(_, loaded)| deferred_at(loaded));
        Ok(found)
    }

    /// Whether nobody owns the pod key of `entry` any more (`ownership::may_replay`): the
    /// entry then waits only for a replay to pass. A damaged owner file counts as owned.
    pub fn name_is_free(&self, key: &PodKey) -> bool {
        match self.load_owner(key) {
            Ok(Loaded::Missing) => true,
            Ok(Loaded::Valid(owner)) => {
                let backed = self.owner_is_backed(&owner);
                super::ownership::may_replay(Some(super::ownership::Owner {
                    ownership: &owner,
                    backed,
                }))
            }
            _ => false,
        }
    }

    /// Every deferred DEL, for GC, the dump and the doctor.
    pub fn list_deferred(&self) -> Result<Vec<(PathBuf, Loaded<DeferredDel>)>> {
        let mut all = Vec::new();
        for (dir, ()) in super::list(&self.root.join(DEFERRED), |_| Ok(()))? {
            if dir.is_dir() {
                all.extend(super::list(&dir, |path| Ok(super::read_for_listing(path)))?);
            }
        }
        Ok(all)
    }
}

fn deferred_at(loaded: &Loaded<DeferredDel>) -> u128 {
    match loaded {
        Loaded::Valid(entry) => entry.deferred_at_ns,
        _ => 0,
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| GuardError::io("sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(extra: serde_json::Value) -> DeferredDel {
        let mut json = serde_json::json!({
            "network": "net", "podNamespace": "ns", "podName": "p", "ifName": "eth0",
            "containerId": "c", "podUid": null, "cniArgs": "", "cniVersion": "1.0.0",
            "prevResult": null, "netns": "", "mac": null, "owner": "o",
            "deferredAt": "2026-01-01T00:00:00Z", "deferredAtNs": 0
        });
        json.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json).unwrap()
    }

    /// A netns path, inode and cookie are counters of one boot: a repeated DEL after a
    /// reboot (kubelet's, with no netns of its own) tears down in none.
    #[test]
    fn an_entry_of_another_boot_names_no_netns_of_this_one() {
        let made = |boot: Option<&str>| {
            entry(serde_json::json!({"netns": "/proc/4242/ns/net", "deferredInBoot": boot}))
        };
        assert_eq!(
            made(Some("b1")).netns_in_this_boot(Some("b1")),
            "/proc/4242/ns/net"
        );
        assert_eq!(made(Some("b1")).netns_in_this_boot(Some("b2")), "");
        // An entry of an earlier release says no boot: as before.
        assert_eq!(
            made(None).netns_in_this_boot(Some("b2")),
            "/proc/4242/ns/net"
        );
    }

    #[test]
    fn a_back_off_runs_on_this_boots_clock_and_ends_with_the_boot() {
        let retry = Duration::from_secs(60);
        let now = 1_000_000_000_000;
        // Tried a second ago in this boot: not due.
        let recent =
            entry(serde_json::json!({"lastAttemptBootNs": now - 1_000_000_000, "bootId": "b1"}));
        assert!(!recent.retry_due(retry, now, Some("b1")));
        assert!(recent.retry_due(retry, now + 61_000_000_000, Some("b1")));
        // The same numbers of another boot say nothing: due.
        assert!(recent.retry_due(retry, now, Some("b2")));
        // An earlier release's wall-clock note, an hour ahead after a clock step back: due.
        let wall = entry(serde_json::json!({"lastAttemptNs": 1_800_003_600_000_000_000u64}));
        assert!(wall.retry_due(retry, now, Some("b1")));
    }
}
