//! A result checked against the shape of its cniVersion: every key the spec defines has the
//! type and the form the spec gives it.

use serde_json::value::RawValue;

use super::json::{
    At, Found, ItemAt, MemberAt, Members, array, cidr_member, gateway_ip, integer, object,
    optional, shown, string, unsigned,
};
use super::view::{InterfaceView, IpView, ResultView, RouteView};
use super::{Shape, family, invalid, is_v4_mapped, read_top};
use crate::error::Result;

impl ResultView {
    /// The runtime's prevResult at ADD and CHECK, checked against the result shape of its
    /// cniVersion; `config_version` names the version to ask for when the result has none.
    /// A result that is not one is code 6 (a decode failure, as the spec lists it), a
    /// result in a version the guard does not read is code 1 (see `read_top`).
    pub fn validated(raw: &RawValue, config_version: &str) -> Result<ResultView> {
        let top = read_top(raw, config_version)?;
        check_result(&top.members, top.shape).map_err(|msg| invalid(msg, &top.version))
    }
}

pub(super) fn check_result(top: &Members, shape: Shape) -> Found<ResultView> {
    let at: At = &"prevResult";
    let mut view = ResultView {
        interfaces: Vec::new(),
        ips: Vec::new(),
        routes: Vec::new(),
    };
    if shape == Shape::Legacy {
        // Here `interfaces`, `ips` and `routes` are unknown keys, passed on unread.
        for (key, family) in [("ip4", "4"), ("ip6", "6")] {
            if let Some(value) = top.get(key, at)? {
                check_legacy_ip(value, &MemberAt(at, key), family, &mut view)?;
            }
        }
        if let Some(value) = top.get("dns", at)? {
            check_dns(value, &MemberAt(at, "dns"))?;
        }
        return Ok(view);
    }
    if let Some(value) = top.get("interfaces", at)? {
        let path = MemberAt(at, "interfaces");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            view.interfaces
                .push(check_interface(item, &ItemAt(&path, i), shape)?);
        }
    }
    if let Some(value) = top.get("ips", at)? {
        let path = MemberAt(at, "ips");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            view.ips.push(check_ip(
                item,
                &ItemAt(&path, i),
                shape,
                view.interfaces.len(),
            )?);
        }
    }
    if let Some(value) = top.get("routes", at)? {
        let path = MemberAt(at, "routes");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            view.routes
                .push(check_route(item, &ItemAt(&path, i), shape)?);
        }
    }
    if let Some(value) = top.get("dns", at)? {
        check_dns(value, &MemberAt(at, "dns"))?;
    }
    Ok(view)
}

/// An `ip4` or `ip6` of a 0.1.0/0.2.0 result: `ip` in CIDR form and of the key's family.
pub(super) fn check_legacy_ip(
    value: &RawValue,
    at: At,
    want_family: &str,
    view: &mut ResultView,
) -> Found<()> {
    let members = object(value, at)?;
    let address = match members.get("ip", at)? {
        Some(address) => cidr_member(address, &MemberAt(at, "ip"))?,
        None => return Err(format!("{at} has no ip")),
    };
    if family(&address) != want_family && !is_v4_mapped(&address) {
        return Err(format!(
            "{at}.ip {address} is not an IPv{want_family} address"
        ));
    }
    optional(&members, at, "gateway", gateway_ip)?;
    view.ips.push(IpView { address });
    if let Some(value) = members.get("routes", at)? {
        let path = MemberAt(at, "routes");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            view.routes
                .push(check_route(item, &ItemAt(&path, i), Shape::Legacy)?);
        }
    }
    Ok(())
}

pub(super) fn check_interface(value: &RawValue, at: At, shape: Shape) -> Found<InterfaceView> {
    let members = object(value, at)?;
    let name = match members.get("name", at)? {
        Some(name) => string(name, &MemberAt(at, "name"))?,
        None => return Err(format!("{at} has no name")),
    };
    if name.is_empty() {
        return Err(format!("{at}.name is empty"));
    }
    let mac = optional(&members, at, "mac", string)?;
    let sandbox = optional(&members, at, "sandbox", string)?;
    if shape == Shape::V1_1 {
        optional(&members, at, "mtu", unsigned)?;
        optional(&members, at, "socketPath", string)?;
        optional(&members, at, "pciID", string)?;
    }
    Ok(InterfaceView { name, mac, sandbox })
}

pub(super) fn check_ip(value: &RawValue, at: At, shape: Shape, interfaces: usize) -> Found<IpView> {
    let members = object(value, at)?;
    let address = match members.get("address", at)? {
        Some(address) => cidr_member(address, &MemberAt(at, "address"))?,
        None => return Err(format!("{at} has no address")),
    };
    optional(&members, at, "gateway", gateway_ip)?;
    if let Some(index) = optional(&members, at, "interface", unsigned)?
        && index >= interfaces as u64
    {
        let plural = if interfaces == 1 { "" } else { "s" };
        return Err(format!(
            "{at}.interface {index} is out of range: the result has {interfaces} interface{plural}"
        ));
    }
    // Before 1.0 an IP may say its family; 1.0 dropped the key, so there it is an unknown one.
    // An empty one says nothing (libcni reads it, and converts the IP by its address alone).
    if shape == Shape::Pre1
        && let Some(version) = optional(&members, at, "version", string)?
        && !version.is_empty()
    {
        let family = family(&address);
        if version != "4" && version != "6" {
            return Err(format!(
                "{at}.version {} is not \"4\" or \"6\"",
                shown(&version)
            ));
        }
        if version != family && !is_v4_mapped(&address) {
            return Err(format!(
                "{at}.version is \"{version}\" but the address {address} is IPv{family}"
            ));
        }
    }
    Ok(IpView { address })
}

pub(super) fn check_route(value: &RawValue, at: At, shape: Shape) -> Found<RouteView> {
    let members = object(value, at)?;
    let dst = match members.get("dst", at)? {
        Some(dst) => cidr_member(dst, &MemberAt(at, "dst"))?,
        None => return Err(format!("{at} has no dst")),
    };
    let gw = optional(&members, at, "gw", gateway_ip)?.flatten();
    if shape == Shape::V1_1 {
        for key in ["mtu", "advmss", "priority", "table", "scope"] {
            optional(&members, at, key, integer)?;
        }
    }
    Ok(RouteView { dst, gw })
}

pub(super) fn check_dns(value: &RawValue, at: At) -> Found<()> {
    let members = object(value, at)?;
    for key in ["nameservers", "search", "options"] {
        if let Some(list) = members.get(key, at)? {
            let path = MemberAt(at, key);
            for (i, item) in array(list, &path)?.iter().enumerate() {
                string(item, &ItemAt(&path, i))?;
            }
        }
    }
    optional(&members, at, "domain", string)?;
    Ok(())
}
