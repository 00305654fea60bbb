//! IP conflicts: an ADD handed an address that another sandbox's network namespace still
//! uses. When a force-deleted pod's container lives on in D state and the address is
//! released anyway, and the next pod given it failed with "address already in use".
//!
//! The store's address index (`state::ip_index`) says who was last given an address; this is
//! what ADD and GC make of it. An entry is a hint, never a verdict on its own: every read is
//! checked against the holder's record and namespace.

use std::net::IpAddr;

use crate::cni::config::IpConflictPolicy;
use crate::cni::env::Attachment;
use crate::cni::result::ResultView;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::netns::{NetnsState, NetnsUsers, netns_inode, netns_state};
use crate::names::pod_text;
use crate::state::checkpoint::{AttachmentId, Checkpoint};
use crate::state::ip_index::IpHolder;
use crate::state::{Loaded, Store};

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
/// `own_inode` is the inode of the ADD's own namespace, which it has read already.
pub fn check_addresses(
    policy: IpConflictPolicy,
    store: &Store,
    attachment: &Attachment,
    id: &AttachmentId,
    view: &ResultView,
    own_inode: Option<u64>,
) -> Result<Claim> {
    let mut addresses: Vec<IpAddr> = view.ips.iter().map(|ip| ip.address.ip()).collect();
    addresses.sort();
    addresses.dedup();

    let conflicts: Vec<Conflict> = addresses
        .iter()
        .filter_map(|&address| live_holder(store, id, address, own_inode))
        .collect();
    let pod = pod_text(
        attachment.pod.namespace.as_deref(),
        attachment.pod.name.as_deref(),
    );
    let mut warning = None;
    if !conflicts.is_empty() {
        let err = conflict_error(id, &pod, &attachment.netns, &conflicts, policy);
        match policy {
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
        if let Err(e) = store.record_ip_holders(&self.holders) {
            stderr_line!("sandbox-guard: cannot keep the address index: {e}");
        }
        self.warning
    }
}

/// The holder of `address` named by the index, if it is another sandbox whose namespace is
/// still mounted. An entry the holder's record contradicts is a leftover, not a holder.
fn live_holder(
    store: &Store,
    id: &AttachmentId,
    address: IpAddr,
    own_inode: Option<u64>,
) -> Option<Conflict> {
    let holder = store.ip_holder(&id.network, address)?;
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
    Some(Conflict {
        holder: IpHolder { netns, ..holder },
        record_gone,
    })
}

pub fn record_holds(record: &Checkpoint, address: IpAddr) -> bool {
    ResultView::parse(&record.prev_result)
        .is_ok_and(|view| view.ips.iter().any(|ip| ip.address.ip() == address))
}

fn conflict_error(
    id: &AttachmentId,
    pod: &str,
    netns: &str,
    conflicts: &[Conflict],
    policy: IpConflictPolicy,
) -> GuardError {
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
            IpConflictPolicy::Warn =>
                "The ADD went on because ipConflict is \"warn\"; \"refuse\" fails such ADDs.",
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
    let details =
        serde_json::json!({ "network": id.network, "conflicts": holders, "wayOut": way_out });
    GuardError::new(Kind::IpConflict, msg).with_details(details.to_string())
}

/// Drops the entries of `network` that no longer say anything: their holder has no record
/// and no process is left in its namespace, or they are damaged or temp files of killed
/// writers. Returns how many went.
pub fn forget_released(store: &Store, network: &str) -> usize {
    let mut users = None;
    store.forget_ip_holders(network, |holder| {
        match store.load_record(&holder.attachment()) {
            Ok(Loaded::Missing) => {
                let users = users.get_or_insert_with(NetnsUsers::scan);
                netns_state(&holder.netns, holder.netns_inode, Some(users)) == NetnsState::Gone
            }
            _ => false,
        }
    })
}
