//! The primary plugin's result. ADD and CHECK check it against the result shape of its own
//! cniVersion (`ResultView::validated`, `validate`) and ADD prints it in the config's
//! cniVersion (`as_version`, `convert`); a typed view reads what the guard compares and shows
//! (`view`). The checkpoint keeps the bytes as the runtime passed them.
//!
//! Only the keys the spec defines are read: every other member stays unparsed text and
//! passes through byte for byte, whatever it holds (`json` reads a result's members so).

mod convert;
mod json;
mod validate;
mod view;

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::value::RawValue;

use crate::error::{GuardError, Kind, Result};
use json::{Json, Members, kind, read_members, shown, string};

pub use convert::{as_version, versioned_as_libcni_reads_it};
pub use view::{InterfaceView, IpView, ResultView, RouteView};

/// The result shapes of the versions the guard speaks (`version::SUPPORTED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 0.1.0 and 0.2.0: `ip4` and `ip6`, each `{ip, gateway, routes}`; no interfaces.
    Legacy,
    /// 0.3.0, 0.3.1 and 0.4.0: each IP may say its family in `version`, "4" or "6".
    Pre1,
    /// 1.0.0: `ips[].version` is gone.
    V1_0,
    /// 1.1.0: interfaces gain `mtu`, `socketPath` and `pciID`; routes gain `mtu`, `advmss`,
    /// `priority`, `table` and `scope`.
    V1_1,
}

fn shape_of(version: &str) -> Option<Shape> {
    match version {
        "0.1.0" | "0.2.0" => Some(Shape::Legacy),
        "0.3.0" | "0.3.1" | "0.4.0" => Some(Shape::Pre1),
        "1.0.0" => Some(Shape::V1_0),
        "1.1.0" => Some(Shape::V1_1),
        _ => None,
    }
}

/// A code-6 error for a result that does not have the shape of `version`.
fn invalid(msg: String, version: &str) -> GuardError {
    GuardError::new(Kind::Decode, msg).with_details(format!(
        "the plugin before sandbox-guard in the conflist must return a valid CNI {version} result"
    ))
}

/// The top of a result: its members and the version it claims.
struct Top {
    members: Members,
    version: String,
    shape: Shape,
}

fn read_top(raw: &RawValue, config_version: &str) -> Result<Top> {
    let bad = |msg: String| invalid(msg, config_version);
    let members = match kind(raw) {
        Json::Object => read_members(raw, &"prevResult").map_err(bad)?,
        other => {
            return Err(bad(format!(
                "prevResult is {other}, not a CNI result object"
            )));
        }
    };
    let version = match members.get("cniVersion", &"prevResult").map_err(bad)? {
        Some(value) => string(value, &"prevResult.cniVersion").map_err(bad)?,
        None => return Err(bad("prevResult has no cniVersion".to_string())),
    };
    let Some(shape) = shape_of(&version) else {
        // The spec's code 1 is "incompatible CNI version": a result in a version the guard
        // does not read (0.2.0's ip4/ip6, a newer spec) is well-formed, just not one it can
        // check or convert, and the way out is the same as for a config's version. A
        // cniVersion that is no version at all fails to decode, which is code 6.
        let is_version = version.split('.').count() == 3
            && version.split('.').all(|part| {
                !part.is_empty() && part.len() <= 9 && part.bytes().all(|b| b.is_ascii_digit())
            });
        if !is_version {
            return Err(bad(format!(
                "prevResult.cniVersion {} is not a CNI version",
                shown(&version)
            )));
        }
        return Err(GuardError::new(
            Kind::IncompatibleVersion,
            format!(
                "prevResult has cniVersion {version}, which sandbox-guard cannot read or convert to {}",
                crate::names::shorten(config_version)
            ),
        )
        .with_details(format!(
            "the plugin before sandbox-guard in the conflist must return its result in the conflist's \
             cniVersion; sandbox-guard reads results of {}",
            crate::cni::version::SUPPORTED.join(", ")
        )));
    };
    Ok(Top {
        members,
        version,
        shape,
    })
}

/// An address's family as libcni reads it (`To4() != nil`): an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is IPv4.
fn family(address: &IpNetwork) -> &'static str {
    if address.is_ipv4() || is_v4_mapped(address) {
        "4"
    } else {
        "6"
    }
}

fn is_v4_mapped(address: &IpNetwork) -> bool {
    match address.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        IpAddr::V4(_) => false,
    }
}

#[cfg(test)]
mod tests;
