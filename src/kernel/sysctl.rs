//! The per-interface IPv6 sysctls a restore reads and sets, in the pod's netns.
//!
//! A link made in a netns takes that netns's `net.ipv6.conf.default` settings. Where the
//! runtime or the pod disabled IPv6 by default, the reference plugins turned it on for the
//! pod's interface at ADD (pkg/ipam ConfigureIface writes `disable_ipv6=0` before adding an
//! IPv6 address); the re-created interface needs the same, or the kernel refuses its
//! addresses ("IPv6 is disabled on this device").

use std::fs;

use super::netns::{self, Netns};
use crate::error::{GuardError, Kind, Result};

/// Sets `net.ipv6.conf.<if_name>.disable_ipv6` to 0 in `netns` unless it is 0 already, so that
/// nothing is written where nothing needs to change.
pub fn enable_ipv6(netns: &Netns, if_name: &str) -> Result<()> {
    let path = ipv6_conf(if_name, "disable_ipv6")?;
    netns::inside(netns, || {
        if read(&path)? == "0" {
            return Ok(());
        }
        fs::write(&path, "0").map_err(|e| failed(&format!("write 0 to {path}"), e))
    })
}

/// Whether the interface forwards IPv6 (`net.ipv6.conf.<if_name>.forwarding`): a router's
/// neighbour advertisements carry the Router flag, as the kernel's own do.
pub fn ipv6_forwarding(netns: &Netns, if_name: &str) -> Result<bool> {
    let path = ipv6_conf(if_name, "forwarding")?;
    netns::inside(netns, || Ok(read(&path)? != "0"))
}

/// /proc/sys/net shows the netns of the thread that opens it: callers read and write inside.
fn ipv6_conf(if_name: &str, key: &str) -> Result<String> {
    crate::names::check_ifname(if_name)?;
    Ok(format!("/proc/sys/net/ipv6/conf/{if_name}/{key}"))
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
