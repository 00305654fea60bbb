//! The one per-interface sysctl a restore sets: IPv6 on for the re-created interface.
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
    crate::names::check_ifname(if_name)?;
    // /proc/sys/net shows the netns of the thread that opens it, hence inside.
    let path = format!("/proc/sys/net/ipv6/conf/{if_name}/disable_ipv6");
    let failed = |action: &str, e: std::io::Error| GuardError::new(Kind::Netlink, format!("cannot {action} {path}: {e}"));
    netns::inside(netns, || {
        let now = fs::read_to_string(&path).map_err(|e| failed("read", e))?;
        if now.trim() == "0" {
            return Ok(());
        }
        fs::write(&path, "0").map_err(|e| failed("write 0 to", e))
    })
}
