//! Delegate mode's local teardown of a stale sandbox: its interface leaves its netns, so an
//! old sandbox kept pinned by the runtime no longer answers for the address the pod's new
//! sandbox has (a sticky IP), while the primary's own DEL waits.

use std::path::Path;

use super::netlink::{self, Side};
use crate::error::{Kind, Result};

#[derive(Debug, PartialEq, Eq)]
pub enum Teardown {
    Removed,
    /// The netns is gone, or holds no interface of that name.
    Absent,
    /// An interface of that name with another MAC: not the one checkpointed, left alone.
    OtherMac(String),
}

/// Removes `if_name` from the netns at `netns` if its MAC is `mac`.
pub fn remove_interface(netns: &str, if_name: &str, mac: &str) -> Result<Teardown> {
    // A path left behind after its namespace was unmounted is no namespace.
    if super::netns::netns_inode(netns).is_none() {
        return Ok(Teardown::Absent);
    }
    let found = netlink::with_pod_netns(Path::new(netns), |kernel| {
        let Some(link) = kernel.link_by_name(Side::Pod, if_name)? else { return Ok(Teardown::Absent) };
        match &link.mac {
            Some(have) if have.eq_ignore_ascii_case(mac) => {
                kernel.delete_pod_link(link.index)?;
                Ok(Teardown::Removed)
            }
            other => Ok(Teardown::OtherMac(other.clone().unwrap_or_default())),
        }
    });
    match found {
        Err(err) if err.kind == Kind::NetnsGone => Ok(Teardown::Absent),
        other => other,
    }
}
