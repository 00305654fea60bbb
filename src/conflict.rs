//! IP conflicts: an ADD handed an address that another sandbox's network namespace still
//! uses. In seed 004 a force-deleted pod's container lived on in D state, the address was
//! released anyway, and the next pod given it failed with "address already in use".
//!
//! Searching every record for the address would make ADD cost more as the store grows, so
//! the store keeps an index: one small file per (network, address) naming the attachment ADD
//! last gave the address to.
//!
//! ```text
//! <stateDir>/ips/<network>:<address>    IpHolder, sealed
//! ```
//!
//! DEL leaves the entry where it is on purpose: once the record is gone, the entry is the only
//! trace of which namespace had the address, and that is what tells "deleted, but its
//! namespace lives on" (the incident) from an ordinary reuse. The directory stays bounded by
//! the addresses the network's IPAM hands out, because the next ADD of an address overwrites
//! its entry; GC drops the entries whose namespace is gone.
//!
//! An entry is a hint, never a verdict on its own: every read checks it against the holder's
//! record and namespace. So it is written without fsync (a power cut that loses one costs one
//! missed warning), and a damaged one is ignored.

use std::collections::HashMap;
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::commands::Invocation;
use crate::config::IpConflictPolicy;
use crate::env::Attachment;
use crate::error::{GuardError, Kind, Result};
use crate::prev_result::ResultView;
use crate::store::checkpoint::{AttachmentId, Checkpoint};
use crate::store::{sealed, Loaded, Store};


/// The attachment an address was last given to, and the namespace it went into.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpHolder {
    pub network: String,
    pub address: IpAddr,
    pub container_id: String,
    pub if_name: String,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub netns: String,
    /// The namespace's inode at ADD. An nsfs inode names one namespace for as long as it
    /// lives, so it finds the namespace again after its path is gone (a process still in
    /// it) and tells it from a new namespace mounted at the same path.
    pub netns_inode: Option<u64>,
    pub since: String,
}

impl IpHolder {
    pub fn attachment(&self) -> AttachmentId {
        AttachmentId {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            if_name: self.if_name.clone(),
        }
    }

    pub fn pod(&self) -> String {
        pod_text(self.pod_namespace.as_deref(), self.pod_name.as_deref())
    }
}

pub fn pod_text(namespace: Option<&str>, name: Option<&str>) -> String {
    match (namespace, name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "-".to_string(),
    }
}

pub fn index_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(crate::store::IPS)
}

fn entry_name(network: &str, address: IpAddr) -> String {
    // Network names are plain (validated) and addresses print without '/', so the name is
    // one path component an operator can read in `ls`.
    format!("{network}:{address}")
}

// ---------------------------------------------------------------------------------------
// Is a recorded namespace still alive?

/// Where a recorded network namespace stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsState {
    /// The recorded path is still a namespace file, of the recorded namespace when its
    /// inode is known: whatever is configured in it still exists.
    Mounted,
    /// The path is gone or names another namespace, but these processes are still in the
    /// recorded one (found by inode), so its interfaces and addresses still exist.
    HeldBy(Vec<u32>),
    Gone,
}

impl NetnsState {
    pub fn is_alive(&self) -> bool {
        !matches!(self, NetnsState::Gone)
    }
}

/// The inode of the network namespace at `path`, when `path` is a namespace file: a bind
/// mount of one (what `ip netns add` and the runtimes make) or /proc/<pid>/ns/net. A file
/// left behind after its namespace was unmounted is on tmpfs, not nsfs, and gives `None`.
pub fn netns_inode(path: &str) -> Option<u64> {
    if path.is_empty() {
        return None;
    }
    let fs = nix::sys::statfs::statfs(path).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return None;
    }
    fs::metadata(path).ok().map(|meta| meta.ino())
}

/// Two cheap system calls answer for a mounted namespace; `users` (a /proc scan, which
/// ADD never pays for) is needed only to find one whose path is gone.
pub fn netns_state(path: &str, recorded_inode: Option<u64>, users: Option<&NetnsUsers>) -> NetnsState {
    match (netns_inode(path), recorded_inode) {
        (Some(now), Some(then)) if now == then => return NetnsState::Mounted,
        (Some(_), None) => return NetnsState::Mounted,
        _ => {}
    }
    match (recorded_inode, users) {
        (Some(inode), Some(users)) => match users.pids(inode) {
            [] => NetnsState::Gone,
            pids => NetnsState::HeldBy(pids.to_vec()),
        },
        _ => NetnsState::Gone,
    }
}

/// Which processes are in which network namespace, read once from /proc.
#[derive(Debug, Default)]
pub struct NetnsUsers {
    by_inode: HashMap<u64, Vec<u32>>,
}

impl NetnsUsers {
    pub fn scan() -> NetnsUsers {
        let mut by_inode: HashMap<u64, Vec<u32>> = HashMap::new();
        let Ok(entries) = fs::read_dir("/proc") else { return NetnsUsers { by_inode } };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            // The link reads `net:[4026532281]`; a process that exits meanwhile just drops out.
            let Ok(target) = fs::read_link(entry.path().join("ns/net")) else { continue };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("net:[")?.strip_suffix(']')?.parse::<u64>().ok());
            if let Some(inode) = inode {
                by_inode.entry(inode).or_default().push(pid);
            }
        }
        NetnsUsers { by_inode }
    }

    pub fn pids(&self, inode: u64) -> &[u32] {
        self.by_inode.get(&inode).map_or(&[], Vec::as_slice)
    }
}

// ---------------------------------------------------------------------------------------
// ADD

/// A live namespace that holds an address an ADD is about to record for another sandbox.
#[derive(Debug)]
pub struct Conflict {
    pub holder: IpHolder,
    /// The holder's record is gone: its sandbox was deleted (or collected) but its
    /// namespace outlived that.
    pub record_gone: bool,
}

/// The new holders of an ADD's addresses, written once its record is.
#[must_use]
pub struct Claim {
    holders: Vec<IpHolder>,
    /// In "warn" mode, the conflicts found, for the ADD's own log line: a log reader counts
    /// one line per operation.
    warning: Option<String>,
}

/// Called by ADD before it writes anything: finds the live holders of the new addresses and
/// warns or refuses as `ipConflict` says. Reads one index entry, at most one record and one
/// namespace per address: the cost does not depend on how many records the store holds.
pub fn check_addresses(inv: &Invocation, store: &Store, attachment: &Attachment, id: &AttachmentId, view: &ResultView) -> Result<Claim> {
    let dir = index_dir(store.root());
    let own_inode = netns_inode(&attachment.netns);
    let mut addresses: Vec<IpAddr> = view.ips.iter().map(|ip| ip.address.ip()).collect();
    addresses.sort();
    addresses.dedup();

    let conflicts: Vec<Conflict> = addresses
        .iter()
        .filter_map(|&address| live_holder(store, &dir, id, address, own_inode))
        .collect();
    let pod = pod_text(attachment.pod.namespace.as_deref(), attachment.pod.name.as_deref());
    let mut warning = None;
    if !conflicts.is_empty() {
        let err = conflict_error(id, &pod, &attachment.netns, &conflicts, inv.conf.ip_conflict);
        match inv.conf.ip_conflict {
            IpConflictPolicy::Refuse => return Err(err),
            IpConflictPolicy::Warn => warning = Some(format!("; {}", err.msg)),
        }
    }
    let since = crate::clock::now_rfc3339();
    let holders = addresses
        .into_iter()
        .map(|address| IpHolder {
            network: id.network.clone(),
            address,
            container_id: id.container_id.clone(),
            if_name: id.if_name.clone(),
            pod_namespace: attachment.pod.namespace.clone(),
            pod_name: attachment.pod.name.clone(),
            netns: attachment.netns.clone(),
            netns_inode: own_inode,
            since: since.clone(),
        })
        .collect();
    Ok(Claim { holders, warning })
}

impl Claim {
    /// Makes the ADD the holder of its addresses and returns the conflict warning for its
    /// log line. Best effort: a lost hint costs a missed warning later, and failing a pod's
    /// ADD that has been recorded already for it would not be worth it.
    pub fn record(self, store: &Store) -> Option<String> {
        let dir = index_dir(store.root());
        if let Err(e) = crate::store::ensure_dir(&dir) {
            eprintln!("sandbox-guard: cannot keep the address index: {e}");
            return self.warning;
        }
        for holder in self.holders {
            let name = entry_name(&holder.network, holder.address);
            if let Err(e) = sealed::replace(&dir, &name, &sealed::seal(&holder), sealed::Durability::Hint) {
                eprintln!("sandbox-guard: cannot record the holder of {} in {}: {e}", holder.address, dir.display());
            }
        }
        self.warning
    }
}

/// The holder of `address` named by the index, if it is another sandbox whose namespace is
/// still mounted. An entry the holder's record contradicts is a leftover, not a holder.
fn live_holder(store: &Store, dir: &Path, id: &AttachmentId, address: IpAddr, own_inode: Option<u64>) -> Option<Conflict> {
    let holder = read_entry(&dir.join(entry_name(&id.network, address)))?;
    if holder.network != id.network || holder.address != address || holder.attachment() == *id {
        return None;
    }
    let (netns, inode, record_gone) = match store.load_record(&holder.attachment()).ok()? {
        Loaded::Valid(record) => {
            if !record_holds(&record, address) {
                return None;
            }
            // Re-ADDed into another namespace: the inode recorded with the old one says nothing.
            let inode = holder.netns_inode.filter(|_| record.netns == holder.netns);
            (record.netns, inode, false)
        }
        Loaded::Missing => (holder.netns.clone(), holder.netns_inode, true),
        Loaded::Corrupt { .. } => (holder.netns.clone(), holder.netns_inode, false),
    };
    if netns_state(&netns, inode, None) != NetnsState::Mounted {
        return None;
    }
    // The same namespace under another attachment name is not two pods sharing an address.
    if own_inode.is_some() && netns_inode(&netns) == own_inode {
        return None;
    }
    Some(Conflict { holder: IpHolder { netns, ..holder }, record_gone })
}

pub fn record_holds(record: &Checkpoint, address: IpAddr) -> bool {
    ResultView::parse(&record.prev_result).is_ok_and(|view| view.ips.iter().any(|ip| ip.address.ip() == address))
}

fn conflict_error(id: &AttachmentId, pod: &str, netns: &str, conflicts: &[Conflict], policy: IpConflictPolicy) -> GuardError {
    let first = &conflicts[0];
    let h = &first.holder;
    let fate = if first.record_gone { "deleted " } else { "" };
    let more = match conflicts.len() {
        1 => String::new(),
        n => format!(" (and {} more addresses)", n - 1),
    };
    let msg = format!(
        "IP conflict: {} is still held by {fate}sandbox {} (pod {}) in live netns {}{more}",
        h.address,
        h.container_id,
        h.pod(),
        h.netns
    );
    let way_out = format!(
        "The IPAM handed the address to sandbox {} (pod {pod}, netns {netns}) as well, and two namespaces with one \
         address break both pods. Find what keeps the holder's namespace alive (a container process stuck in D \
         state, a sandbox the runtime could not stop: `sandbox-guard --doctor` names the processes) and remove it, \
         or release the address in the IPAM. {}",
        id.container_id,
        match policy {
            IpConflictPolicy::Refuse => "\"ipConflict\": \"warn\" only logs such conflicts.",
            IpConflictPolicy::Warn => "The ADD went on because ipConflict is \"warn\"; \"refuse\" fails such ADDs.",
        }
    );
    let holders: Vec<serde_json::Value> = conflicts
        .iter()
        .map(|c| {
            serde_json::json!({
                "address": c.holder.address,
                "holderContainerId": c.holder.container_id,
                "holderPod": c.holder.pod(),
                "holderIfName": c.holder.if_name,
                "holderNetns": c.holder.netns,
                "holderDeleted": c.record_gone,
            })
        })
        .collect();
    let details = serde_json::json!({ "network": id.network, "conflicts": holders, "wayOut": way_out });
    GuardError::new(Kind::IpConflict, msg).with_details(details.to_string())
}

// ---------------------------------------------------------------------------------------
// The index on disk

pub fn read_entry(path: &Path) -> Option<IpHolder> {
    match sealed::read::<IpHolder>(path) {
        // A checksum is no signature: names from the file are checked before they make a path.
        Ok(Loaded::Valid(holder)) if plain_names(&holder) => Some(holder),
        _ => None,
    }
}

fn plain_names(holder: &IpHolder) -> bool {
    use crate::names::{check_ifname, check_plain, MAX_CONTAINER_ID, MAX_NETWORK};
    check_plain("network", &holder.network, MAX_NETWORK, Kind::Io).is_ok()
        && check_plain("container", &holder.container_id, MAX_CONTAINER_ID, Kind::Io).is_ok()
        && check_ifname(&holder.if_name).is_ok()
}

/// Every entry of the index (the doctor and GC; never ADD).
pub fn list_entries(state_dir: &Path) -> Vec<(PathBuf, Option<IpHolder>)> {
    let dir = index_dir(state_dir);
    let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() };
    let mut found: Vec<(PathBuf, Option<IpHolder>)> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let path = e.path();
            let holder = read_entry(&path);
            (path, holder)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

// ---------------------------------------------------------------------------------------
// GC

/// Drops the entries of `network` that no longer say anything: their holder has no record
/// and no process is left in its namespace, or they are damaged or temp files of killed
/// writers. Returns how many went.
pub fn forget_released(store: &Store, network: &str) -> usize {
    let dir = index_dir(store.root());
    let Ok(entries) = fs::read_dir(&dir) else { return 0 };
    let mut users = None;
    let mut forgotten = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let obsolete = if name.starts_with('.') {
            name.ends_with(".tmp")
        } else if name.split(':').next() != Some(network) {
            false
        } else {
            match read_entry(&path) {
                None => true,
                Some(holder) => match store.load_record(&holder.attachment()) {
                    Ok(Loaded::Missing) => {
                        let users = users.get_or_insert_with(NetnsUsers::scan);
                        netns_state(&holder.netns, holder.netns_inode, Some(users)) == NetnsState::Gone
                    }
                    _ => false,
                },
            }
        };
        if obsolete && crate::store::remove(&path).is_ok() {
            forgotten += 1;
        }
    }
    forgotten
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_one_component() {
        assert_eq!(entry_name("net", "10.1.2.3".parse().unwrap()), "net:10.1.2.3");
        assert_eq!(entry_name("net", "fd00::1".parse().unwrap()), "net:fd00::1");
    }

    #[test]
    fn a_plain_file_is_no_namespace() {
        let path = std::env::temp_dir().join(format!("sg-netns-{}", std::process::id()));
        fs::write(&path, b"").unwrap();
        assert_eq!(netns_inode(path.to_str().unwrap()), None);
        assert_eq!(netns_state(path.to_str().unwrap(), Some(1), Some(&NetnsUsers::default())), NetnsState::Gone);
        fs::remove_file(&path).unwrap();
        assert_eq!(netns_inode(""), None);
    }

    #[test]
    fn our_own_namespace_is_found_by_inode() {
        let inode = netns_inode("/proc/self/ns/net").expect("/proc/self/ns/net is a namespace file");
        let users = NetnsUsers::scan();
        assert!(users.pids(inode).contains(&std::process::id()));
        assert_eq!(netns_state("/nonexistent", Some(inode), Some(&users)), NetnsState::HeldBy(users.pids(inode).to_vec()));
        assert_eq!(netns_state("/proc/self/ns/net", Some(inode), None), NetnsState::Mounted);
    }
}
