//! The per-interface sysctls a restore reads and sets, in the pod's netns.
//!
//! A link made in a netns takes that netns's `net.ipv{4,6}.conf.default` settings. Where the
//! runtime or the pod disabled IPv6 by default, the reference plugins turned it on for the
//! pod's interface at ADD (pkg/ipam ConfigureIface writes `disable_ipv6=0` before adding an
//! IPv6 address); the re-created interface needs the same, or the kernel refuses its
//! addresses ("IPv6 is disabled on this device"). Whatever else a tuning plugin or the
//! primary set on the interface (`RESTORED`) is recorded at ADD where it differs from the
//! default, and written again on the rebuilt interface.

use std::fs;
use std::io;

use super::netns::{self, Netns};
use crate::error::{GuardError, Kind, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub fn dir(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }
}

/// The settings ADD records and a restore writes back: what changes how the interface
/// answers and speaks on the wire (ARP, reverse-path filtering, forwarding) and which IPv6
/// addresses it makes, detects and accepts (router advertisements, SLAAC, DAD, the
/// link-local's generation). Counters, timers and logging are left out: losing them costs no
/// traffic. Each with the kernel's built-in default (a new netns's IPv6 `conf/default`; its
/// IPv4 one copies the host's by default, `net.core.devconf_inherit_init_net`).
///
/// ADD records those of the interface's values that differ from the kernel's default: the
/// values come with the netlink answer it reads anyway, and comparing them with this table
/// reads no file, where reading the netns's `conf/default` files would cost each ADD 17 opens
/// in the pod's netns. A value not recorded is the kernel's default, so a restore knows each
/// one and writes those that differ from what its netns gives a new link.
pub const RESTORED: &[(Family, &str, i32)] = &[
    (Family::Ipv4, "forwarding", 0),
    (Family::Ipv4, "rp_filter", 0),
    (Family::Ipv4, "proxy_arp", 0),
    (Family::Ipv4, "arp_ignore", 0),
    (Family::Ipv4, "arp_announce", 0),
    (Family::Ipv4, "arp_filter", 0),
    (Family::Ipv4, "arp_notify", 0),
    (Family::Ipv4, "accept_local", 0),
    (Family::Ipv4, "route_localnet", 0),
    (Family::Ipv6, "forwarding", 0),
    (Family::Ipv6, "accept_ra", 1),
    (Family::Ipv6, "autoconf", 1),
    (Family::Ipv6, "accept_dad", 1),
    (Family::Ipv6, "dad_transmits", 1),
    (Family::Ipv6, "disable_ipv6", 0),
    (Family::Ipv6, "use_tempaddr", 0),
    (Family::Ipv6, "addr_gen_mode", 0),
];

/// The kernel's default of a setting of `RESTORED`.
pub fn kernel_default(family: Family, key: &str) -> Option<i32> {
    RESTORED
        .iter()
        .find(|(f, k, _)| *f == family && *k == key)
        .map(|(_, _, default)| *default)
}

/// The netns's `conf/default` value of each of `RESTORED`, read from inside `netns`: what a
/// link made there now starts with. A family the kernel has turned off altogether (no
/// `/proc/sys/net/ipv6`) has none.
pub fn defaults(netns: &Netns) -> Result<Vec<(Family, &'static str, i32)>> {
    netns::inside(netns, || {
        let mut values = Vec::with_capacity(RESTORED.len());
        for (family, key, _) in RESTORED {
            let path = format!("/proc/sys/net/{}/conf/default/{key}", family.dir());
            match fs::read_to_string(&path) {
                Ok(text) => values.extend(text.trim().parse().ok().map(|v| (*family, *key, v))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(&format!("read {path}"), e)),
            }
        }
        Ok(values)
    })
}

/// `net.<family>.conf.<if_name>.<key>` (or `conf.default`, `conf.all`) in `netns`.
pub fn read_conf(netns: &Netns, family: Family, if_name: &str, key: &str) -> Result<i32> {
    let path = conf_path(family, if_name, key)?;
    netns::inside(netns, || {
        read(&path)?
            .parse()
            .map_err(|_| GuardError::new(Kind::Netlink, format!("{path} is not a number")))
    })
}

/// Writes `value` to `net.<family>.conf.<if_name>.<key>` in `netns` unless it holds it
/// already, so that nothing is written where nothing needs to change.
pub fn set_conf(netns: &Netns, family: Family, if_name: &str, key: &str, value: i32) -> Result<()> {
    let path = conf_path(family, if_name, key)?;
    netns::inside(netns, || {
        if read(&path)? == value.to_string() {
            return Ok(());
        }
        fs::write(&path, value.to_string())
            .map_err(|e| failed(&format!("write {value} to {path}"), e))
    })
}

/// Sets `net.ipv6.conf.<if_name>.disable_ipv6` to 0 in `netns` unless it is 0 already.
pub fn enable_ipv6(netns: &Netns, if_name: &str) -> Result<()> {
    set_conf(netns, Family::Ipv6, if_name, "disable_ipv6", 0)
}

/// Whether the interface forwards IPv6 (`net.ipv6.conf.<if_name>.forwarding`): a router's
/// neighbour advertisements carry the Router flag, as the kernel's own do.
pub fn ipv6_forwarding(netns: &Netns, if_name: &str) -> Result<bool> {
    Ok(read_conf(netns, Family::Ipv6, if_name, "forwarding")? != 0)
}

/// Why a link with these values does no IPv6 duplicate address detection, if it does none:
/// the kernel skips it where neither `conf.all` nor the link's `accept_dad` is at least 1,
/// where the link's `dad_transmits` is 0, and on a NOARP link (addrconf_dad_begin).
pub fn detection_off(
    all_accept_dad: i32,
    accept_dad: i32,
    dad_transmits: i32,
    noarp: bool,
) -> Option<String> {
    if noarp {
        Some("the link is NOARP: it does no neighbour discovery".to_string())
    } else if all_accept_dad < 1 && accept_dad < 1 {
        Some(format!(
            "the link does no duplicate address detection (accept_dad {accept_dad})"
        ))
    } else if dad_transmits == 0 {
        Some("the link does no duplicate address detection (dad_transmits 0)".to_string())
    } else {
        None
    }
}

/// `addr_gen_mode` as `ip link` names it (`addrgenmode`).
pub fn addr_gen_mode_name(value: i32) -> Option<&'static str> {
    Some(match value {
        0 => "eui64",
        1 => "none",
        2 => "stable_secret",
        3 => "random",
        _ => return None,
    })
}

/// /proc/sys/net shows the netns of the thread that opens it: callers read and write inside.
fn conf_path(family: Family, if_name: &str, key: &str) -> Result<String> {
    if if_name != "all" && if_name != "default" {
        crate::names::check_ifname(if_name)?;
    }
    Ok(format!(
        "/proc/sys/net/{}/conf/{if_name}/{key}",
        family.dir()
    ))
}

fn read(path: &str) -> Result<String> {
    Ok(fs::read_to_string(path)
        .map_err(|e| failed(&format!("read {path}"), e))?
        .trim()
        .to_string())
}

fn failed(action: &str, e: std::io::Error) -> GuardError {
    GuardError::new(Kind::Netlink, format!("cannot {action}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_off_as_the_kernel_decides() {
        assert_eq!(detection_off(1, 1, 1, false), None);
        assert_eq!(detection_off(0, 1, 1, false), None);
        assert_eq!(detection_off(1, 0, 1, false), None);
        assert!(
            detection_off(0, 0, 1, false)
                .unwrap()
                .contains("accept_dad 0")
        );
        assert!(
            detection_off(1, 1, 0, false)
                .unwrap()
                .contains("dad_transmits 0")
        );
        assert!(detection_off(1, 1, 1, true).unwrap().contains("NOARP"));
    }
}
