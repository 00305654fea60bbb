//! The address index, for IP conflicts: an ADD handed an address that another sandbox's network namespace still
//! uses. When a force-deleted pod's container lives on in D state and the address is
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
//! Entries written by earlier releases as symlinks whose target is the sealed text are read
//! too. The index is boot-scoped (`boot`): after a reboot no namespace it names exists.
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

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::AttachmentId;
use super::{Loaded, Store, sealed};
use crate::error::Kind;

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
        crate::names::pod_text(self.pod_namespace.as_deref(), self.pod_name.as_deref())
    }
}

fn index_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(super::IPS)
}

fn entry_name(network: &str, address: IpAddr) -> String {
    // Network names are plain (validated) and addresses print without '/', so the name is
    // one path component an operator can read in `ls`.
    format!("{network}:{address}")
}

impl Store {
    /// Who the index says was last given `address` on `network`: one file read, whatever
    /// the store holds. A hint to be checked against the holder's record and namespace.
    pub fn ip_holder(&self, network: &str, address: IpAddr) -> Option<IpHolder> {
        read_entry(&index_dir(self.root()).join(entry_name(network, address)))
    }

    /// Makes `holders` the holders of their addresses, as far as it can; the first failure
    /// is returned after the rest were tried. Without fsync: a power cut that loses an entry
    /// costs one missed warning, not a pod's ADD.
    pub fn record_ip_holders(&self, holders: &[IpHolder]) -> crate::error::Result<()> {
        let dir = index_dir(self.root());
        super::ensure_dir(&dir)?;
        let mut first_failure = None;
        for holder in holders {
            let name = entry_name(&holder.network, holder.address);
            let written =
                sealed::replace(&dir, &name, &sealed::seal(holder), sealed::Durability::Hint);
            if let Err(e) = written {
                first_failure.get_or_insert(crate::error::GuardError::io(
                    "record the holder of an address in",
                    &dir.join(&name),
                    e,
                ));
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// Drops the index entries of `network` for which `released` says yes, and damaged
    /// entries and temp files of killed writers. Returns how many went (GC).
    pub fn forget_ip_holders(
        &self,
        network: &str,
        mut released: impl FnMut(&IpHolder) -> bool,
    ) -> usize {
        let Ok(entries) = fs::read_dir(index_dir(self.root())) else {
            return 0;
        };
        let mut forgotten = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let obsolete = if name.starts_with('.') {
                name.ends_with(".tmp")
            } else if name.split(':').next() != Some(network) {
                false
            } else {
                read_entry(&path).is_none_or(|holder| released(&holder))
            };
            if obsolete && super::remove(&path).is_ok() {
                forgotten += 1;
            }
        }
        forgotten
    }
}

fn read_entry(path: &Path) -> Option<IpHolder> {
    match sealed::read_any::<IpHolder>(path) {
        // A checksum is no signature: names from the file are checked before they make a path.
        Ok(Loaded::Valid(holder)) if plain_names(&holder) => Some(holder),
        _ => None,
    }
}

fn plain_names(holder: &IpHolder) -> bool {
    use crate::names::{MAX_CONTAINER_ID, MAX_NETWORK, check_ifname, check_plain};
    check_plain("network", &holder.network, MAX_NETWORK, Kind::Io).is_ok()
        && check_plain(
            "container",
            &holder.container_id,
            MAX_CONTAINER_ID,
            Kind::Io,
        )
        .is_ok()
        && check_ifname(&holder.if_name).is_ok()
}

/// Every entry of the index, damaged ones as `None` (the doctor; never ADD).
pub fn list_entries(state_dir: &Path) -> Vec<(PathBuf, Option<IpHolder>)> {
    let Ok(entries) = fs::read_dir(index_dir(state_dir)) else {
        return Vec::new();
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_one_component() {
        assert_eq!(
            entry_name("net", "10.1.2.3".parse().unwrap()),
            "net:10.1.2.3"
        );
        assert_eq!(entry_name("net", "fd00::1".parse().unwrap()), "net:fd00::1");
    }
}
