//! Delegate mode's local teardown of a stale sandbox: its interface leaves its netns, so an
//! old sandbox kept pinned by the runtime no longer answers for the address the pod's new
//! sandbox has (a sticky IP), while the primary's own DEL waits.
//!
//! Only what ADD recorded is deleted. A netns path can name another namespace by the time
//! the stale DEL comes (a `/proc/<pid>/ns/net` whose pid came back, as cri-dockerd passes
//! them; a named netns made again), holding an interface of the same name and MAC (ipvlan
//! slaves share their master's MAC; sticky-IP plugins derive the MAC from the IP). So the
//! namespace must be the one recorded (its netns cookie: a reused inode does not tell a new
//! namespace at the old path from the old one), must not be the host's or one a
//! live sandbox uses, and the link must be of a kind the sandbox owns outright (a veth, a
//! macvlan...) with the recorded kind, index and MAC. A physical NIC or a host vlan or bond
//! moved in by host-device or SR-IOV is the host's: its primary's replay gives it back.
//! Anything that does not match is left alone, and the caller logs why.

use std::path::Path;

use super::netlink::{self, Side};
use super::netns::{netns_cookie, netns_identity};
use crate::error::{Kind, Result};

/// Kinds made for one sandbox and gone with it: deleting one frees nothing of the host's.
const SANDBOX_KINDS: [&str; 5] = ["veth", "macvlan", "ipvlan", "macvtap", "ipvtap"];

#[derive(Debug, PartialEq, Eq)]
pub enum Teardown {
    Removed,
    /// The netns is gone, or holds no interface of that name.
    Absent,
    /// Not provably the recorded interface in the recorded netns: left alone, and why.
    LeftAlone(String),
}

/// What ADD recorded of the stale sandbox's interface.
#[derive(Debug)]
pub struct Recorded<'a> {
    pub netns: &'a str,
    pub if_name: &'a str,
    pub mac: Option<&'a str>,
    /// The namespace's device and inode; `None` for a checkpoint of an earlier release.
    pub netns_id: Option<(u64, u64)>,
    /// Its cookie; `None` for a checkpoint of an earlier release or a kernel without one.
    pub netns_cookie: Option<u64>,
    pub if_index: Option<u32>,
    pub if_kind: Option<&'a str>,
}

/// Removes the recorded interface if it is still there, unchanged, in the recorded netns, and
/// that netns is neither the host's nor in `live_netns` (the namespaces of live sandboxes).
pub fn remove_interface(recorded: &Recorded, live_netns: &[(u64, u64)]) -> Result<Teardown> {
    let left = |why: String| Ok(Teardown::LeftAlone(why));
    // A path left behind after its namespace was unmounted is no namespace.
    let Some(now) = netns_identity(recorded.netns) else {
        return Ok(Teardown::Absent);
    };
    if ["/proc/1/ns/net", "/proc/self/ns/net"]
        .iter()
        .any(|host| netns_identity(host) == Some(now))
    {
        return left(format!("{} is the host's own netns", recorded.netns));
    }
    if live_netns.contains(&now) {
        return left(format!("{} is the netns of a live sandbox", recorded.netns));
    }
    match recorded.netns_id {
        None => return left("its netns was not identified at ADD (a checkpoint of an earlier release), so it cannot be told from a new one at the same path".into()),
        Some(then) if then != now => return left(format!("{} is another netns than at ADD (inode {} then, {} now)", recorded.netns, then.1, now.1)),
        Some(_) => {}
    }
    // The kernel hands a freed namespace's inode to the next one made: only the cookie tells
    // the old namespace from a new one at the old path.
    match (recorded.netns_cookie, netns_cookie(recorded.netns)) {
        (None, _) => return left("its netns cookie was not recorded at ADD (a kernel before 5.14, or a checkpoint of an earlier release), and device and inode alone do not tell it from a new netns at the same path".into()),
        (Some(then), Some(now)) if then == now => {}
        (Some(then), now) => return left(format!("{} is another netns than at ADD (cookie {then} then, {} now)", recorded.netns, now.map_or("none".to_string(), |c| c.to_string()))),
    }
    let kind = match recorded.if_kind {
        Some(kind) if SANDBOX_KINDS.contains(&kind) => kind,
        Some(kind) => {
            return left(format!(
                "{} is a {kind} link, which its primary gives back to the host",
                recorded.if_name
            ));
        }
        None => {
            return left(format!(
                "{} has no recorded kind (a physical NIC, or facts not read at ADD): its primary gives it back",
                recorded.if_name
            ));
        }
    };
    let found = netlink::with_pod_netns(Path::new(recorded.netns), |kernel| {
        let Some(link) = kernel.link_by_name(Side::Pod, recorded.if_name)? else {
            return Ok(Teardown::Absent);
        };
        if link.kind.as_deref() != Some(kind) {
            return left(format!(
                "{} is a {} link now, not the {kind} of ADD",
                recorded.if_name,
                link.kind.as_deref().unwrap_or("kindless")
            ));
        }
        if let Some(index) = recorded.if_index.filter(|&index| index != link.index) {
            return left(format!(
                "{} has index {} now, not {index} as at ADD",
                recorded.if_name, link.index
            ));
        }
        if let Some(mac) = recorded.mac
            && !link
                .mac
                .as_deref()
                .is_some_and(|have| have.eq_ignore_ascii_case(mac))
        {
            return left(format!(
                "{} has MAC {}, not {mac}",
                recorded.if_name,
                link.mac.unwrap_or_default()
            ));
        }
        kernel.delete_pod_link(link.index)?;
        Ok(Teardown::Removed)
    });
    match found {
        Err(err) if err.kind == Kind::NetnsGone => Ok(Teardown::Absent),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(netns: &str, netns_id: Option<(u64, u64)>) -> Recorded<'_> {
        Recorded {
            netns,
            if_name: "lo",
            mac: None,
            netns_id,
            netns_cookie: None,
            if_index: Some(1),
            if_kind: Some("veth"),
        }
    }

    #[test]
    fn nothing_is_deleted_in_the_hosts_netns_or_without_a_recorded_identity() {
        let own = "/proc/self/ns/net";
        let Some(id) = netns_identity(own) else {
            return;
        };
        // Even with every fact matching, the host's own netns is never touched.
        assert!(
            matches!(remove_interface(&recorded(own, Some(id)), &[]), Ok(Teardown::LeftAlone(why)) if why.contains("host"))
        );
        assert!(matches!(
            remove_interface(&recorded(own, None), &[]),
            Ok(Teardown::LeftAlone(_))
        ));
        assert_eq!(
            remove_interface(&recorded("/nonexistent/netns", Some(id)), &[]).unwrap(),
            Teardown::Absent
        );
    }
}
