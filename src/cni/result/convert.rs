//! A result in another cniVersion, converted as libcni's converters do.

use std::borrow::Cow;
use std::net::IpAddr;

use serde_json::value::RawValue;

use super::json::{
    At, Found, ItemAt, Json, MemberAt, Members, array, cidr_member, json_string, kind, object,
    optional, shown, string, write_object,
};
use super::validate::check_result;
use super::{Shape, family, invalid, read_top, shape_of};
use crate::error::{GuardError, Kind, Result};

/// A primary's own answer, as libcni's `invoke.fixupResultVersion` reads it before anything
/// else does: without a `cniVersion`, or with an empty or non-string one, it is in the
/// config's version. The 0.1.0 spec's results had no such key, and weave-net and host-local
/// releases still left it out (containernetworking/cni#896). Delegate mode reads the
/// primary's output itself, so it must read it as the runtime would have. Anything that is
/// not one object is returned as it is, for the validation to refuse.
pub fn versioned_as_libcni_reads_it(result: Box<RawValue>, config_version: &str) -> Box<RawValue> {
    let Ok(members) = serde_json::from_str::<Members>(result.get()) else {
        return result;
    };
    let versioned = members.0.iter().any(|(key, value)| {
        key == "cniVersion"
            && serde_json::from_str::<String>(value.get()).is_ok_and(|v| !v.is_empty())
    });
    if versioned {
        return result;
    }
    let version = json_string(config_version);
    let mut out = String::with_capacity(result.get().len() + 32);
    let rest = members
        .0
        .iter()
        .filter(|(key, _)| key != "cniVersion")
        .map(|(key, value)| (key.as_str(), value.get()));
    write_object(
        &mut out,
        std::iter::once(("cniVersion", version.as_str())).chain(rest),
    );
    RawValue::from_string(out).unwrap_or(result)
}

/// ADD's output: the prevResult in the config's cniVersion, as the spec wants a plugin's
/// result. In that version already, it is the runtime's bytes, untouched. Otherwise it is
/// converted as libcni's `types/040` and `types/100` converters do, except that members the
/// spec does not define are kept:
/// - the new `cniVersion`;
/// - pre-1.0 to 1.0+: `ips[].version` removed;
/// - 1.0+ to pre-1.0: `ips[].version` set from the address family, and the interfaces'
///   `mtu`, `socketPath` and `pciID` dropped (libcni's 0.4.0 interface has no place for
///   them), while the routes' `mtu`, `advmss`, `priority`, `table` and `scope` stay (libcni
///   shares one route type between the versions);
/// - between 0.3.0, 0.3.1 and 0.4.0, 1.0.0 and 1.1.0, or 0.1.0 and 0.2.0: nothing else;
/// - 0.1.0/0.2.0 up (libcni's `types/040` `convertFrom02x`): `ip4` then `ip6` become `ips`
///   (`version` "4"/"6" below 1.0), their `routes`, IPv4's first, become `routes` (omitted
///   when none), no `interfaces`; their members `version`, `address` and `interface` are
///   dropped (libcni does not read them, and the new IP defines them);
/// - down to 0.1.0/0.2.0 (`convertTo02x`): the first IPv4 and the first IPv6 of `ips` become
///   `ip4` and `ip6` (below 1.0 only IPs whose `version` says their family count, as libcni
///   reads them), each route goes to the IP config of its `dst`'s family as `dst` and `gw`
///   alone (and is dropped when that family has none), `interfaces` are dropped, and a
///   result with no IP cannot be converted (0.2.0 needs one).
///
/// The converted result must then be a valid result of the config's version (a 1.0.0
/// result's unknown `mtu` becomes a 1.1.0 field). Call after `ResultView::validated`.
pub fn as_version<'r>(raw: &'r RawValue, config_version: &str) -> Result<Cow<'r, str>> {
    let top = read_top(raw, config_version)?;
    if top.version == config_version {
        return Ok(Cow::Borrowed(raw.get()));
    }
    let Some(to) = shape_of(config_version) else {
        // The config's version was refused before any verb ran; this is a backstop.
        return Err(GuardError::new(
            Kind::IncompatibleVersion,
            format!(
                "cannot convert the prevResult to cniVersion {}: sandbox-guard does not speak it",
                shown(config_version)
            ),
        ));
    };
    let converted = convert(&top.members, top.shape, to, config_version)
        .and_then(|converted| addresses_as_libcni_writes(&converted))
        .map_err(|msg| invalid(msg, &top.version))?;
    let again: Members = serde_json::from_str(&converted).map_err(|e| {
        invalid(
            format!("prevResult converted to cniVersion {config_version} cannot be read back: {e}"),
            config_version,
        )
    })?;
    check_result(&again, to).map_err(|msg| {
        invalid(
            format!("converted to the config's cniVersion {config_version}, {msg}"),
            config_version,
        )
    })?;
    Ok(Cow::Owned(converted))
}

pub(super) fn convert(top: &Members, from: Shape, to: Shape, to_version: &str) -> Found<String> {
    match (from == Shape::Legacy, to == Shape::Legacy) {
        (true, true) => return Ok(with_version(top, to_version)),
        (true, false) => return convert_up_from_legacy(top, to, to_version),
        (false, true) => return convert_down_to_legacy(top, from, to_version),
        (false, false) => {}
    }
    let version_changes = (from == Shape::Pre1) != (to == Shape::Pre1);
    let mut out = String::with_capacity(
        top.0
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + 4)
            .sum::<usize>()
            + 64,
    );
    let mut fields = Vec::with_capacity(top.0.len());
    for (key, value) in &top.0 {
        let text = match key.as_str() {
            "cniVersion" => Cow::Owned(json_string(to_version)),
            "ips" if version_changes && kind(value) == Json::Array => {
                Cow::Owned(convert_ips(value, to == Shape::Pre1)?)
            }
            "interfaces"
                if from != Shape::Pre1 && to == Shape::Pre1 && kind(value) == Json::Array =>
            {
                Cow::Owned(map_objects(
                    value,
                    &"prevResult.interfaces",
                    |_, members| {
                        members
                            .0
                            .retain(|(k, _)| !matches!(k.as_str(), "mtu" | "socketPath" | "pciID"));
                        Ok(())
                    },
                )?)
            }
            _ => Cow::Borrowed(value.get()),
        };
        fields.push((key.as_str(), text));
    }
    write_object(&mut out, fields.iter().map(|(k, v)| (*k, v.as_ref())));
    Ok(out)
}

/// The result with only its `cniVersion` changed.
pub(super) fn with_version(top: &Members, to_version: &str) -> String {
    let version = json_string(to_version);
    let mut out = String::new();
    write_object(
        &mut out,
        top.0.iter().map(|(k, v)| {
            (
                k.as_str(),
                if k == "cniVersion" {
                    version.as_str()
                } else {
                    v.get()
                },
            )
        }),
    );
    out
}

/// 0.1.0/0.2.0 to 0.3.0 and later, as libcni's `convertFrom02x`. The new `ips` and `routes`
/// take the place of `ip4`; keys the new version defines that the old result carried as
/// unknown ones (`interfaces`, `ips`, `routes`) would clash with them and are dropped.
pub(super) fn convert_up_from_legacy(top: &Members, to: Shape, to_version: &str) -> Found<String> {
    let at: At = &"prevResult";
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    for (key, family) in [("ip4", "4"), ("ip6", "6")] {
        let Some(value) = top.get(key, at)? else {
            continue;
        };
        let path = MemberAt(at, key);
        let members = object(value, &path)?;
        let mut ip = Vec::new();
        if to == Shape::Pre1 {
            ip.push(("version", json_string(family)));
        }
        for (member, value) in &members.0 {
            match member.as_str() {
                "ip" => ip.push(("address", value.get().to_string())),
                "routes" => {
                    if kind(value) != Json::Null {
                        routes.extend(
                            array(value, &MemberAt(&path, "routes"))?
                                .iter()
                                .map(|r| r.get().to_string()),
                        );
                    }
                }
                // Names a newer IP defines for itself: libcni reads only `ip`, `gateway` and
                // `routes` here, and kept they would clash with the converted IP's own.
                "version" | "address" | "interface" => {}
                // gateway and members the spec does not define stay with their IP.
                other => ip.push((other, value.get().to_string())),
            }
        }
        let mut text = String::new();
        write_object(&mut text, ip.iter().map(|(k, v)| (*k, v.as_str())));
        ips.push(text);
    }
    let version = json_string(to_version);
    let ips = format!("[{}]", ips.join(","));
    let routes = format!("[{}]", routes.join(","));
    let mut fields: Vec<(&str, &str)> = Vec::with_capacity(top.0.len() + 2);
    let mut placed = false;
    for (key, value) in &top.0 {
        match key.as_str() {
            "cniVersion" => fields.push(("cniVersion", version.as_str())),
            "ip4" | "ip6" => {
                if !placed {
                    placed = true;
                    fields.push(("ips", ips.as_str()));
                    if routes != "[]" {
                        fields.push(("routes", routes.as_str()));
                    }
                }
            }
            "interfaces" | "ips" | "routes" => {}
            _ => fields.push((key.as_str(), value.get())),
        }
    }
    let mut out = String::new();
    write_object(&mut out, fields.into_iter());
    Ok(out)
}

/// 0.3.0 and later down to 0.1.0/0.2.0, as libcni's `convertTo02x`.
pub(super) fn convert_down_to_legacy(
    top: &Members,
    from: Shape,
    to_version: &str,
) -> Found<String> {
    let at: At = &"prevResult";
    let mut configs: [Option<Vec<(&str, String)>>; 2] = [None, None];
    if let Some(value) = top.get("ips", at)? {
        let path = MemberAt(at, "ips");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            let item_at = ItemAt(&path, i);
            let members = object(item, &item_at)?;
            let Some(address_text) = members.get("address", &item_at)? else {
                return Err(format!("{item_at} has no address"));
            };
            let address = cidr_member(address_text, &MemberAt(&item_at, "address"))?;
            // libcni's 0.4.0 IP says its family in `version` only; 1.0 derives it.
            let family = match from {
                Shape::Pre1 => optional(&members, &item_at, "version", string)?,
                _ => Some(family(&address).to_string()),
            };
            let slot = match family.as_deref() {
                Some("4") => 0,
                Some("6") => 1,
                _ => continue,
            };
            if configs[slot].is_some() {
                continue;
            }
            let mut config = vec![("ip", address_text.get().to_string())];
            if let Some(gateway) = members.get("gateway", &item_at)? {
                config.push(("gateway", gateway.get().to_string()));
            }
            configs[slot] = Some(config);
        }
    }
    if configs.iter().all(Option::is_none) {
        return Err(format!(
            "prevResult has no IP address, and a CNI {to_version} result needs one"
        ));
    }
    let mut routes: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    if let Some(value) = top.get("routes", at)? {
        let path = MemberAt(at, "routes");
        for (i, item) in array(value, &path)?.iter().enumerate() {
            let route_at = ItemAt(&path, i);
            let members = object(item, &route_at)?;
            let Some(dst) = members.get("dst", &route_at)? else {
                return Err(format!("{route_at} has no dst"));
            };
            let slot = if family(&cidr_member(dst, &MemberAt(&route_at, "dst"))?) == "4" {
                0
            } else {
                1
            };
            let mut route = vec![("dst", dst.get())];
            if let Some(gw) = members.get("gw", &route_at)? {
                route.push(("gw", gw.get()));
            }
            let mut text = String::new();
            write_object(&mut text, route.into_iter());
            routes[slot].push(text);
        }
    }
    let mut legacy: [Option<String>; 2] = [None, None];
    for (slot, config) in configs.into_iter().enumerate() {
        let Some(mut members) = config else { continue };
        if !routes[slot].is_empty() {
            members.push(("routes", format!("[{}]", routes[slot].join(","))));
        }
        let mut text = String::new();
        write_object(&mut text, members.iter().map(|(k, v)| (*k, v.as_str())));
        legacy[slot] = Some(text);
    }
    let version = json_string(to_version);
    let mut fields: Vec<(&str, &str)> = Vec::with_capacity(top.0.len() + 2);
    let mut placed = false;
    for (key, value) in &top.0 {
        match key.as_str() {
            "cniVersion" => fields.push(("cniVersion", version.as_str())),
            "ips" | "interfaces" | "routes" => {
                if !placed {
                    placed = true;
                    for (name, config) in ["ip4", "ip6"].into_iter().zip(&legacy) {
                        if let Some(config) = config {
                            fields.push((name, config.as_str()));
                        }
                    }
                }
            }
            "ip4" | "ip6" => {}
            _ => fields.push((key.as_str(), value.get())),
        }
    }
    let mut out = String::new();
    write_object(&mut out, fields.into_iter());
    Ok(out)
}

pub(super) fn convert_ips(value: &RawValue, to_pre1: bool) -> Found<String> {
    map_objects(value, &"prevResult.ips", |at, members| {
        members.0.retain(|(k, _)| k != "version");
        if to_pre1 {
            let address = match members.get("address", at)? {
                Some(address) => cidr_member(address, &MemberAt(at, "address"))?,
                None => return Err(format!("{at} has no address")),
            };
            let version =
                RawValue::from_string(json_string(family(&address))).map_err(|e| e.to_string())?;
            members.0.insert(0, ("version".to_string(), version));
        }
        Ok(())
    })
}

/// An array of objects with `edit` applied to each object's members.
pub(super) fn map_objects(
    value: &RawValue,
    at: At,
    edit: impl Fn(At, &mut Members) -> Found<()>,
) -> Found<String> {
    let mut out = String::with_capacity(value.get().len() + 16);
    out.push('[');
    for (i, item) in array(value, at)?.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let path = ItemAt(at, i);
        let mut members = object(item, &path)?;
        edit(&path, &mut members)?;
        write_object(
            &mut out,
            members.0.iter().map(|(k, v)| (k.as_str(), v.get())),
        );
    }
    out.push(']');
    Ok(out)
}

/// An address of a converted result as libcni writes it when it marshals its types again: an
/// IPv4-mapped one in its IPv4 form (a prefix keeps its last 32 bits, as Go's `IPNet` prints
/// it), an empty gateway left out (`None`). Every other text stays as it was.
pub(super) fn as_libcni_writes(value: &RawValue, with_prefix: bool) -> Option<String> {
    let Ok(text) = serde_json::from_str::<String>(value.get()) else {
        return Some(value.get().to_string());
    };
    if text.is_empty() && !with_prefix {
        return None;
    }
    let (address, prefix) = match text.split_once('/') {
        Some((address, prefix)) if with_prefix => (address, prefix.parse::<u8>().ok()),
        _ => (text.as_str(), None),
    };
    let mapped = match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => v6.to_ipv4_mapped(),
        _ => None,
    };
    Some(match (mapped, prefix, with_prefix) {
        (Some(v4), Some(prefix), true) => {
            json_string(&format!("{v4}/{}", prefix.saturating_sub(96)))
        }
        (Some(v4), None, false) => json_string(&v4.to_string()),
        _ => value.get().to_string(),
    })
}

/// A converted result's addresses, gateways and routes as libcni writes them
/// (`as_libcni_writes`); the members of each object stay in their order.
pub(super) fn addresses_as_libcni_writes(converted: &str) -> Found<String> {
    const ADDRESSES: [(&str, bool); 5] = [
        ("address", true),
        ("ip", true),
        ("dst", true),
        ("gateway", false),
        ("gw", false),
    ];
    fn rewrite(members: &mut Members) -> Found<()> {
        let mut kept = Vec::with_capacity(members.0.len());
        for (key, value) in members.0.drain(..) {
            let Some(&(_, with_prefix)) = ADDRESSES.iter().find(|(name, _)| *name == key) else {
                kept.push((key, value));
                continue;
            };
            if let Some(text) = as_libcni_writes(&value, with_prefix) {
                let value = RawValue::from_string(text).map_err(|e| e.to_string())?;
                kept.push((key, value));
            }
        }
        members.0 = kept;
        Ok(())
    }
    fn rewrite_list(value: &RawValue, at: At) -> Found<String> {
        map_objects(value, at, |at, members| {
            rewrite(members)?;
            if let Some(at_routes) = members.0.iter().position(|(k, _)| k == "routes")
                && kind(&members.0[at_routes].1) == Json::Array
            {
                let text = rewrite_list(&members.0[at_routes].1, &MemberAt(at, "routes"))?;
                members.0[at_routes].1 = RawValue::from_string(text).map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }
    let raw = RawValue::from_string(converted.to_string()).map_err(|e| e.to_string())?;
    let mut top = object(&raw, &"prevResult")?;
    for (key, value) in top.0.iter_mut() {
        let text = match key.as_str() {
            "ips" | "routes" if kind(value) == Json::Array => {
                rewrite_list(value, &MemberAt(&"prevResult", key))?
            }
            "ip4" | "ip6" if kind(value) == Json::Object => {
                let wrapped = RawValue::from_string(format!("[{}]", value.get()))
                    .map_err(|e| e.to_string())?;
                let list = rewrite_list(&wrapped, &MemberAt(&"prevResult", key))?;
                list[1..list.len() - 1].to_string()
            }
            _ => continue,
        };
        *value = RawValue::from_string(text).map_err(|e| e.to_string())?;
    }
    let mut out = String::with_capacity(converted.len());
    write_object(&mut out, top.0.iter().map(|(k, v)| (k.as_str(), v.get())));
    Ok(out)
}
