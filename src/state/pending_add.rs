//! Delegate mode's pending ADDs: the ADD of a sandbox that is at the primary now. A runtime
//! that cancels its call (a containerd restart, kubelet's `runtimeRequestTimeout`) kills the
//! guard there, and the primary's children (an IPAM plugin it runs) live on: the note lets
//! the next verb of the pod, which takes the pod's lock after it, kill what is left and give
//! the primary the DEL of that sandbox before anything else of the pod reaches it.
//!
//! ```text
//! <stateDir>/pending-adds/<sha256 of the pod key>      the note, sealed JSON
//! <stateDir>/pending-adds/<sha256 of the pod key>.pid  the primary's pid, a JSON number
//! <stateDir>/rolled-back/<network>:<container>:<if>   a sandbox whose cut-off ADD was rolled back
//! ```
//!
//! The ADD writes its note before the primary runs and removes it with its commit or its
//! failure. The pid file is written by the primary's own process between its fork and its
//! exec, so a note without one names a primary that never ran. A rolled-back mark answers
//! the sandbox's own late DEL without the primary, which has had it.
//!
//! Atomic writes, never a sync: a note has to outlive the kill of its ADD, not a power cut,
//! after which nothing of its sandbox runs. Every file names its boot, and one of an earlier
//! boot is dropped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::checkpoint::AttachmentId;
use super::ownership::PodKey;
use super::sealed::{self, Durability, Loaded};
use super::{ensure_dir, remove, surely_absent};
use crate::error::{GuardError, Result};
use crate::kernel::processes::CallIdentity;

pub const PENDING_ADDS: &str = "pending-adds";
/// The variable that carries a note's nonce into its primary's environment, and so into
/// every process the primary starts: what the rollback kills is what carries it.
pub const MARKER_VAR: &str = "SANDBOX_GUARD_ADD";
pub const ROLLED_BACK: &str = "rolled-back";
/// The version of the note's format.
const FORMAT: u32 = 1;
const PID_SUFFIX: &str = ".pid";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAdd {
    pub format: u32,
    #[serde(flatten)]
    pub key: PodKey,
    pub container_id: String,
    #[serde(rename = "interface")]
    pub if_name: String,
    /// The sandbox's netns, and its (device, inode) then: the rollback's DEL is given the
    /// path only while it still names that namespace.
    pub netns: String,
    pub netns_id: Option<(u64, u64)>,
    pub cni_args: String,
    pub cni_version: String,
    /// The primary's object as the ADD handed it over (`Delegate::recorded_conf`).
    pub delegate: Map<String, Value>,
    pub boot_id: Option<String>,
    pub written_at: String,
    /// Rollbacks the primary refused so far, and what it said the last time.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub last_error: Option<String>,
    /// In the primary's environment as `MARKER_VAR`: no other call's process carries it, even
    /// one of the same container in a process group of a reused id.
    #[serde(default)]
    pub nonce: String,
}

impl PendingAdd {
    pub fn id(&self) -> AttachmentId {
        AttachmentId::of(&self.key, &self.container_id, &self.if_name)
    }

    /// The environment entry every process of this ADD's primary carries, if it has one.
    pub fn marker(&self) -> Option<String> {
        (!self.nonce.is_empty()).then(|| format!("{MARKER_VAR}={}", self.nonce))
    }

    /// `run` given what this ADD's primary's processes carry.
    fn with_call<T>(&self, run: impl FnOnce(CallIdentity) -> T) -> T {
        let marker = self.marker();
        run(CallIdentity {
            container_id: &self.container_id,
            marker: marker.as_deref(),
        })
    }

    /// The live processes of this ADD's primary, in its group `pgid`.
    pub fn processes_left(&self, pgid: i32) -> Vec<i32> {
        self.with_call(|call| crate::kernel::processes::leftovers(pgid, call))
    }

    /// Kills what runs of this ADD's primary; how many processes still run.
    pub fn kill_processes(&self, pgid: i32) -> usize {
        self.with_call(|call| crate::kernel::processes::kill_leftovers(pgid, call))
    }

    /// Written in another boot: nothing of its sandbox runs now.
    pub fn of_another_boot(&self) -> bool {
        self.boot_id != crate::clock::boot_id()
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        key: &PodKey,
        container_id: &str,
        if_name: &str,
        netns: &str,
        cni_args: &str,
        cni_version: &str,
        delegate: Map<String, Value>,
    ) -> PendingAdd {
        PendingAdd {
            format: FORMAT,
            key: key.clone(),
            container_id: container_id.into(),
            if_name: if_name.into(),
            netns: netns.into(),
            netns_id: crate::kernel::netns::netns_identity(netns),
            cni_args: cni_args.into(),
            cni_version: cni_version.into(),
            delegate,
            boot_id: crate::clock::boot_id(),
            written_at: crate::clock::now_rfc3339(),
            attempts: 0,
            last_error: None,
            nonce: nonce(),
        }
    }
}

/// 64 random bits, from the seed the standard library takes from the kernel per hasher.
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    )
}

/// Where a noted ADD stands, as a reader without the pod's lock (the dump, the doctor) can
/// tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Written in an earlier boot: nothing of it runs.
    EarlierBoot,
    /// Its sandbox owns the pod: it committed, and its guard died before removing the note.
    Committed,
    /// Its primary runs (the primary dies with its guard), or is about to start.
    AtThePrimary { processes: usize },
    /// Its guard is gone: `processes` of its primary's group still run.
    CutOff { processes: usize },
}

impl Standing {
    /// The processes of its primary still running.
    pub fn processes(self) -> usize {
        match self {
            Standing::AtThePrimary { processes } | Standing::CutOff { processes } => processes,
            Standing::EarlierBoot | Standing::Committed => 0,
        }
    }
}

/// How long a note without a pid may be an ADD about to start its primary.
const STARTING_WITHIN: i64 = 60;

/// Where the ADD noted under `digest` stands, and its primary's pid; read only.
pub fn standing(root: &Path, digest: &str, note: &PendingAdd) -> (Standing, Option<i32>) {
    let pid = primary_pid(root, digest);
    if note.of_another_boot() {
        return (Standing::EarlierBoot, pid);
    }
    let committed = super::Store::open_read_only(root)
        .and_then(|store| store.load_owner(&note.key))
        .is_ok_and(
            |owner| matches!(owner, Loaded::Valid(o) if o.holds(&note.container_id, &note.if_name)),
        );
    if committed {
        return (Standing::Committed, pid);
    }
    let standing = match pid {
        Some(pid) => {
            let left = note.processes_left(pid);
            if left.contains(&pid) {
                Standing::AtThePrimary {
                    processes: left.len(),
                }
            } else {
                Standing::CutOff {
                    processes: left.len(),
                }
            }
        }
        None => {
            let now = crate::clock::unix_seconds();
            let age = now - crate::clock::parse_rfc3339(&note.written_at).unwrap_or(now);
            if age < STARTING_WITHIN {
                Standing::AtThePrimary { processes: 0 }
            } else {
                Standing::CutOff { processes: 0 }
            }
        }
    };
    (standing, pid)
}

pub fn note_path(root: &Path, digest: &str) -> PathBuf {
    root.join(PENDING_ADDS).join(digest)
}

/// Where the primary of the ADD noted for `digest` writes its pid.
pub fn pid_path(root: &Path, digest: &str) -> PathBuf {
    root.join(PENDING_ADDS)
        .join(format!("{digest}{PID_SUFFIX}"))
}

/// Writes the note (replacing the one of a rollback that failed), without a pid file yet.
pub fn save(root: &Path, note: &PendingAdd) -> Result<()> {
    let dir = root.join(PENDING_ADDS);
    let digest = note.key.digest();
    ensure_dir(&dir)?;
    remove(&pid_path(root, &digest))?;
    sealed::replace(&dir, &digest, &sealed::seal(note), Durability::Hint)
        .map_err(|e| GuardError::io("write the note of an ADD in", &dir, e))
}

/// Keeps a failed rollback's count and error in its note, its pid file untouched. `false`: the
/// note was removed meanwhile (an operator giving the rollback up), and stays removed.
pub fn update(root: &Path, note: &PendingAdd) -> Result<bool> {
    let dir = root.join(PENDING_ADDS);
    if surely_absent(&note_path(root, &note.key.digest())) {
        return Ok(false);
    }
    sealed::replace(
        &dir,
        &note.key.digest(),
        &sealed::seal(note),
        Durability::Hint,
    )
    .map(|()| true)
    .map_err(|e| GuardError::io("write the note of an ADD in", &dir, e))
}

pub fn load(root: &Path, digest: &str) -> Result<Loaded<PendingAdd>> {
    sealed::read(&note_path(root, digest))
}

/// The pid the primary wrote, if it ran at all.
pub fn primary_pid(root: &Path, digest: &str) -> Option<i32> {
    let file = sealed::open_nofollow(&pid_path(root, digest)).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 32), &mut text).ok()?;
    text.trim().parse().ok().filter(|&pid| pid > 1)
}

/// Removes the note and then its pid file (a pid file alone means nothing).
pub fn clear(root: &Path, digest: &str) -> Result<()> {
    remove(&note_path(root, digest))?;
    remove(&pid_path(root, digest))?;
    Ok(())
}

/// The digests of every note, for the sweep and the dump.
pub fn digests(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root.join(PENDING_ADDS)) else {
        return Vec::new();
    };
    let mut digests: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|name| !name.ends_with(PID_SUFFIX) && !name.starts_with('.'))
        .collect();
    digests.sort();
    digests
}

/// Marks `id` as rolled back in this boot: the primary has had its DEL.
pub fn mark_rolled_back(root: &Path, id: &AttachmentId) -> Result<()> {
    let dir = root.join(ROLLED_BACK);
    ensure_dir(&dir)?;
    let boot = serde_json::to_vec(&crate::clock::boot_id()).unwrap_or_default();
    sealed::replace(&dir, &id.file_name(), &boot, Durability::Hint)
        .map_err(|e| GuardError::io("mark a rollback in", &dir, e))
}

/// Whether `id` was rolled back in this boot, read only.
pub fn marked_in_this_boot(root: &Path, id: &AttachmentId) -> bool {
    let path = root.join(ROLLED_BACK).join(id.file_name());
    let Ok(file) = sealed::open_nofollow(&path) else {
        return false;
    };
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::Read::take(file, 256), &mut text);
    let boot: Option<String> = serde_json::from_str(&text).unwrap_or_default();
    boot.is_some() && boot == crate::clock::boot_id()
}

/// Whether `id` was rolled back in this boot; a mark of another boot is removed.
pub fn rolled_back(root: &Path, id: &AttachmentId) -> bool {
    if marked_in_this_boot(root, id) {
        return true;
    }
    let _ = remove(&root.join(ROLLED_BACK).join(id.file_name()));
    false
}

pub fn remove_rolled_back(root: &Path, id: &AttachmentId) -> Result<()> {
    remove(&root.join(ROLLED_BACK).join(id.file_name())).map(|_| ())
}

/// The attachments marked as rolled back, for GC and the dump.
pub fn rolled_back_ids(root: &Path) -> Vec<AttachmentId> {
    let Ok(entries) = std::fs::read_dir(root.join(ROLLED_BACK)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| AttachmentId::from_file_name(&e.path()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PodKey {
        PodKey {
            network: "net".into(),
            pod_namespace: "ns".into(),
            pod_name: "web-0".into(),
            if_name: None,
        }
    }

    #[test]
    fn a_note_reads_back_and_its_pid_file_is_its_own() {
        let root = std::env::temp_dir().join(format!("pending-add-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let note = PendingAdd::new(&key(), "b", "eth0", "", "", "1.0.0", Map::new());
        let digest = key().digest();
        std::fs::create_dir_all(root.join(PENDING_ADDS)).unwrap();
        std::fs::write(pid_path(&root, &digest), "1234").unwrap();
        save(&root, &note).unwrap();
        // A pid file of an earlier note never speaks for a new one.
        assert_eq!(primary_pid(&root, &digest), None);
        std::fs::write(pid_path(&root, &digest), "1234").unwrap();
        assert_eq!(primary_pid(&root, &digest), Some(1234));
        let Loaded::Valid(read) = load(&root, &digest).unwrap() else {
            panic!("the note does not read back");
        };
        assert_eq!(read.container_id, "b");
        assert!(!read.of_another_boot());
        assert_eq!(digests(&root), vec![digest.clone()]);
        clear(&root, &digest).unwrap();
        assert!(digests(&root).is_empty());
        assert_eq!(primary_pid(&root, &digest), None);

        let id = note.id();
        assert!(!rolled_back(&root, &id));
        mark_rolled_back(&root, &id).unwrap();
        assert!(rolled_back(&root, &id));
        assert_eq!(rolled_back_ids(&root), vec![id.clone()]);
        std::fs::write(
            root.join(ROLLED_BACK).join(id.file_name()),
            "\"another-boot\"",
        )
        .unwrap();
        assert!(!rolled_back(&root, &id), "a mark of another boot counts");
        assert!(
            rolled_back_ids(&root).is_empty(),
            "a mark of another boot stays"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
