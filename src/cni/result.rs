//! The primary plugin's result. ADD and CHECK check it against the result shape of its own
//! cniVersion (`ResultView::validated`) and ADD prints it in the config's cniVersion
//! (`as_version`); a typed view reads what the guard compares and shows. The checkpoint
//! keeps the bytes as the runtime passed them.
//!
//! Only the keys the spec defines are read: every other member stays unparsed text and
//! passes through byte for byte, whatever it holds.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{GuardError, Kind, Result};

#[derive(Debug, Deserialize)]
pub struct ResultView {
    #[serde(default)]
    pub interfaces: Vec<InterfaceView>,
    #[serde(default)]
    pub ips: Vec<IpView>,
    #[serde(default)]
    pub routes: Vec<RouteView>,
}

#[derive(Debug, Deserialize)]
pub struct InterfaceView {
    pub name: String,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub sandbox: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct IpView {
    #[serde(deserialize_with = "cidr")]
    pub address: IpNetwork,
}

/// The spec writes addresses in CIDR form; a bare address (which ipnetwork would read as a
/// /32) means the primary's result is broken, and checkpointing it would hide that.
fn cidr<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<IpNetwork, D::Error> {
    let text = <std::borrow::Cow<str>>::deserialize(deserializer)?;
    if !text.contains('/') {
        return Err(serde::de::Error::custom(format!(
            "address {text:?} has no prefix length"
        )));
    }
    text.parse().map_err(serde::de::Error::custom)
}

#[derive(Debug, Deserialize)]
pub struct RouteView {
    pub dst: IpNetwork,
    #[serde(default, deserialize_with = "gateway")]
    pub gw: Option<IpAddr>,
}

/// A gateway: `""` reads as none, as Go's `net.IP` reads it (libcni's types).
fn gateway<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<IpAddr>, D::Error> {
    match <Option<std::borrow::Cow<str>>>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

impl ResultView {
    /// Reads a checkpointed result, leniently: records written before results were
    /// validated must stay readable by the dump, the doctor and CHECK.
    pub fn parse(raw: &RawValue) -> Result<ResultView> {
        let read = if is_legacy_text(raw) {
            serde_json::from_str::<LegacyView>(raw.get()).map(LegacyView::into_view)
        } else {
            serde_json::from_str(raw.get())
        };
        read.map_err(|e| {
            GuardError::new(
                Kind::Decode,
                format!(
                    "prevResult is not a CNI result ({e}): the plugin before sandbox-guard in the \
                     conflist must return a result with \"ips\" as CIDR strings"
                ),
            )
        })
    }

    /// The runtime's prevResult at ADD and CHECK, checked against the result shape of its
    /// cniVersion; `config_version` names the version to ask for when the result has none.
    /// A result that is not one is code 6 (a decode failure, as the spec lists it), a
    /// result in a version the guard does not read is code 1 (see `read_top`).
    pub fn validated(raw: &RawValue, config_version: &str) -> Result<ResultView> {
        let top = read_top(raw, config_version)?;
        check_result(&top.members, top.shape).map_err(|msg| invalid(msg, &top.version))
    }

    /// The addresses as CIDR strings, sorted so two results compare regardless of order.
    pub fn cidrs(&self) -> Vec<String> {
        let mut cidrs: Vec<String> = self.ips.iter().map(|ip| ip.address.to_string()).collect();
        cidrs.sort();
        cidrs
    }
}

/// A 0.1.0 or 0.2.0 result, as a checkpoint keeps it: `ip4` and `ip6`, each with its routes.
#[derive(Deserialize)]
struct LegacyView {
    #[serde(default)]
    ip4: Option<LegacyIpView>,
    #[serde(default)]
    ip6: Option<LegacyIpView>,
}

#[derive(Deserialize)]
struct LegacyIpView {
    #[serde(deserialize_with = "cidr")]
    ip: IpNetwork,
    #[serde(default)]
    routes: Option<Vec<RouteView>>,
}

impl LegacyView {
    fn into_view(self) -> ResultView {
        let mut view = ResultView {
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
        };
        for config in [self.ip4, self.ip6].into_iter().flatten() {
            view.ips.push(IpView { address: config.ip });
            view.routes.extend(config.routes.unwrap_or_default());
        }
        view
    }
}

/// Whether a stored result is in the 0.1.0/0.2.0 shape (ADD checkpoints results that say
/// their version).
fn is_legacy_text(raw: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion", default)]
        cni_version: Option<String>,
    }
    serde_json::from_str::<Peek>(raw.get())
        .is_ok_and(|p| matches!(p.cni_version.as_deref(), Some("0.1.0" | "0.2.0")))
}

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

/// Where in the result a value sits, for a message: written out only when there is one, so
/// that a valid result, the case on every ADD, formats no path.
type At<'a> = &'a dyn fmt::Display;

/// Where the member `.1` of the object at `.0` sits.
struct MemberAt<'a>(At<'a>, &'a str);

impl fmt::Display for MemberAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// Where the item `.1` of the array at `.0` sits.
struct ItemAt<'a>(At<'a>, usize);

impl fmt::Display for ItemAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// A problem found in the result: one sentence naming the member and what is wrong.
type Found<T> = std::result::Result<T, String>;

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

fn check_result(top: &Members, shape: Shape) -> Found<ResultView> {
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
fn check_legacy_ip(
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

fn check_interface(value: &RawValue, at: At, shape: Shape) -> Found<InterfaceView> {
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

fn check_ip(value: &RawValue, at: At, shape: Shape, interfaces: usize) -> Found<IpView> {
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

fn check_route(value: &RawValue, at: At, shape: Shape) -> Found<RouteView> {
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

fn check_dns(value: &RawValue, at: At) -> Found<()> {
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

fn convert(top: &Members, from: Shape, to: Shape, to_version: &str) -> Found<String> {
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
fn with_version(top: &Members, to_version: &str) -> String {
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
fn convert_up_from_legacy(top: &Members, to: Shape, to_version: &str) -> Found<String> {
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
fn convert_down_to_legacy(top: &Members, from: Shape, to_version: &str) -> Found<String> {
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

fn convert_ips(value: &RawValue, to_pre1: bool) -> Found<String> {
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
fn map_objects(
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

fn write_object<'a>(out: &mut String, members: impl Iterator<Item = (&'a str, &'a str)>) {
    out.push('{');
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json_string(key));
        out.push(':');
        out.push_str(value);
    }
    out.push('}');
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
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

/// An address of a converted result as libcni writes it when it marshals its types again: an
/// IPv4-mapped one in its IPv4 form (a prefix keeps its last 32 bits, as Go's `IPNet` prints
/// it), an empty gateway left out (`None`). Every other text stays as it was.
fn as_libcni_writes(value: &RawValue, with_prefix: bool) -> Option<String> {
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
fn addresses_as_libcni_writes(converted: &str) -> Found<String> {
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

/// One JSON object of the result: its members in order, their values unparsed.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Members, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

impl Members {
    /// The value of a key the spec defines. `null` counts as absent, as libcni's Go decoder
    /// reads it; a key given twice is refused, since readers would disagree on which counts.
    fn get(&self, key: &str, at: At) -> Found<Option<&RawValue>> {
        let mut values = self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| &**v);
        let first = values.next();
        if values.next().is_some() {
            return Err(format!("{at} has the key \"{key}\" twice"));
        }
        Ok(first.filter(|v| kind(v) != Json::Null))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Json {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Json::Object => "an object",
            Json::Array => "an array",
            Json::String => "a string",
            Json::Number => "a number",
            Json::Bool => "a boolean",
            Json::Null => "null",
        })
    }
}

/// The type of a value, from its first byte: the text is JSON already.
fn kind(value: &RawValue) -> Json {
    match value.get().trim_start().as_bytes().first() {
        Some(b'{') => Json::Object,
        Some(b'[') => Json::Array,
        Some(b'"') => Json::String,
        Some(b't' | b'f') => Json::Bool,
        Some(b'n') => Json::Null,
        _ => Json::Number,
    }
}

fn expect(value: &RawValue, at: At, want: Json) -> Found<()> {
    let have = kind(value);
    if have == want {
        Ok(())
    } else {
        Err(format!("{at} is {have}, not {want}"))
    }
}

fn read_members(value: &RawValue, at: At) -> Found<Members> {
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

fn object(value: &RawValue, at: At) -> Found<Members> {
    expect(value, at, Json::Object)?;
    read_members(value, at)
}

fn array(value: &RawValue, at: At) -> Found<Vec<Box<RawValue>>> {
    expect(value, at, Json::Array)?;
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

fn string(value: &RawValue, at: At) -> Found<String> {
    expect(value, at, Json::String)?;
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

fn number(value: &RawValue, at: At, what: &str) -> Found<serde_json::Number> {
    if kind(value) != Json::Number {
        return Err(format!("{at} is {}, not {what}", kind(value)));
    }
    // A number too large for a double does not read: it is not an integer we take either.
    serde_json::from_str(value.get())
        .map_err(|_| format!("{at} {} is not {what}", shown_number(value.get())))
}

fn unsigned(value: &RawValue, at: At) -> Found<u64> {
    let what = "an unsigned integer";
    number(value, at, what)?
        .as_u64()
        .ok_or_else(|| format!("{at} {} is not {what}", shown_number(value.get())))
}

fn integer(value: &RawValue, at: At) -> Found<()> {
    let what = "an integer";
    let n = number(value, at, what)?;
    if n.is_i64() || n.is_u64() {
        Ok(())
    } else {
        Err(format!("{at} {} is not {what}", shown_number(value.get())))
    }
}

/// A gateway: an IP address, or `""` for none (Go's `net.IP` reads it so, and libcni with it).
fn gateway_ip(value: &RawValue, at: At) -> Found<Option<IpAddr>> {
    let text = string(value, at)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| format!("{at} {} is not an IP address", shown(&text)))
}

fn cidr_member(value: &RawValue, at: At) -> Found<IpNetwork> {
    let text = string(value, at)?;
    parse_cidr(&text).ok_or_else(|| {
        if text.contains('/') {
            format!("{at} {} is not an address in CIDR form", shown(&text))
        } else {
            format!(
                "{at} {} has no prefix length: the spec wants CIDR form",
                shown(&text)
            )
        }
    })
}

/// `address/prefix` as Go's `net.ParseCIDR` reads it: a plain IPv4 or IPv6 address, a
/// decimal prefix no longer than the address. The address keeps its host bits.
fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (address, prefix) = text.split_once('/')?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNetwork::new(address.parse().ok()?, prefix.parse().ok()?).ok()
}

/// An optional member, read by `read` when present and not null.
fn optional<T>(
    members: &Members,
    at: At,
    key: &str,
    read: fn(&RawValue, At) -> Found<T>,
) -> Found<Option<T>> {
    members
        .get(key, at)?
        .map(|value| read(value, &MemberAt(at, key)))
        .transpose()
}

/// A value for a message: quoted, escaped, cut short so the message stays one line.
fn shown(text: &str) -> String {
    const MAX: usize = 48;
    let mut out = String::from("\"");
    for c in text.chars() {
        let escaped: String = c.escape_debug().collect();
        if out.len() + escaped.len() > MAX {
            out.push_str("\"...");
            return out;
        }
        out.push_str(&escaped);
    }
    out.push('"');
    out
}

/// A number for a message, cut short (JSON numbers are ASCII).
fn shown_number(text: &str) -> String {
    const MAX: usize = 24;
    match text.get(..MAX) {
        Some(head) if text.len() > MAX => format!("{head}..."),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    fn validate(text: &str) -> Result<ResultView> {
        ResultView::validated(&raw(text), "1.0.0")
    }

    /// The code and msg of a result that fails validation.
    fn refusal(text: &str) -> (u32, String) {
        let err = validate(text).expect_err(text);
        assert!(
            !err.msg.is_empty() && err.msg.len() <= 200,
            "msg must be short: {:?}",
            err.msg
        );
        assert!(
            !err.msg.contains('\n'),
            "msg must be one line: {:?}",
            err.msg
        );
        assert!(
            err.details.contains("plugin before sandbox-guard"),
            "details must say the way out: {err:?}"
        );
        (err.code(), err.msg)
    }

    fn converted(text: &str, to: &str) -> Value {
        let raw = raw(text);
        ResultView::validated(&raw, to).unwrap();
        serde_json::from_str(&as_version(&raw, to).unwrap()).unwrap()
    }

    #[test]
    fn reads_a_result() {
        let view = ResultView::parse(&raw(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/run/netns/x"}],
               "ips":[{"address":"10.1.0.9/24","gateway":"10.1.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"custom":1}"#,
        ))
        .unwrap();
        assert_eq!(view.cidrs(), vec!["10.1.0.9/24"]);
        assert_eq!(view.interfaces[0].mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
    }

    #[test]
    fn rejects_what_is_not_a_result() {
        for text in [
            r#""a string""#,
            r#"{"ips":"10.0.0.1"}"#,
            r#"{"ips":[{"address":"not-a-cidr"}]}"#,
            r#"{"ips":[{"address":"10.0.0.1"}]}"#,
            "[1]",
        ] {
            assert_eq!(
                ResultView::parse(&raw(text)).unwrap_err().code(),
                6,
                "{text}"
            );
        }
    }

    #[test]
    fn validates_a_full_result_of_every_version_and_reads_it() {
        for version in crate::cni::version::SUPPORTED
            .into_iter()
            .filter(|v| shape_of(v) != Some(Shape::Legacy))
        {
            let pre1 = version.starts_with("0.");
            let mut ip = json!({"address": "10.1.0.9/24", "gateway": "10.1.0.1", "interface": 0, "x-ip": [1]});
            let mut ip6 = json!({"address": "fd00::9/64", "interface": 1});
            if pre1 {
                ip["version"] = json!("4");
                ip6["version"] = json!("6");
            }
            let mut interface = json!({"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/run/netns/x", "x-if": {}});
            let mut route = json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1"});
            if version == "1.1.0" {
                interface["mtu"] = json!(1500);
                interface["socketPath"] = json!("/run/vhost.sock");
                interface["pciID"] = json!("0000:00:1f.6");
                route["mtu"] = json!(1400);
                route["advmss"] = json!(1360);
                route["priority"] = json!(100);
                route["table"] = json!(254);
                route["scope"] = json!(0);
            }
            let result = json!({
                "cniVersion": version,
                "interfaces": [interface, {"name": "veth1"}],
                "ips": [ip, ip6],
                "routes": [route],
                "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["svc"], "options": ["ndots:5"]},
                "x-top": 1e300
            });
            let view = ResultView::validated(&raw(&result.to_string()), version)
                .unwrap_or_else(|e| panic!("{version}: {e}"));
            assert_eq!(view.cidrs(), vec!["10.1.0.9/24", "fd00::9/64"]);
            assert_eq!(view.interfaces[0].mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
            assert_eq!(view.interfaces[0].sandbox.as_deref(), Some("/run/netns/x"));
            assert_eq!(view.routes[0].gw, Some("10.1.0.1".parse().unwrap()));
        }
    }

    #[test]
    fn every_supported_version_has_a_shape() {
        for version in crate::cni::version::SUPPORTED {
            assert!(shape_of(version).is_some(), "{version}");
        }
    }

    #[test]
    fn the_result_must_be_an_object_with_a_string_cni_version() {
        for (text, says) in [
            ("[]", "is an array"),
            ("{}", "no cniVersion"),
            (r#"{"interfaces":"0"}"#, "no cniVersion"),
            ("null", "is null"),
            ("42", "is a number"),
            (r#"{"cniVersion":1}"#, "cniVersion is a number"),
            (r#"{"cniVersion":null}"#, "no cniVersion"),
            (r#"{"cniVersion":"one"}"#, "not a CNI version"),
            (r#"{"cniVersion":"1.0.0","cniVersion":"1.0.0"}"#, "twice"),
        ] {
            let (code, msg) = refusal(text);
            assert_eq!(code, 6, "{text}: {msg}");
            assert!(msg.contains(says), "{text}: {msg}");
        }
    }

    #[test]
    fn a_version_the_guard_does_not_read_is_code_1() {
        for version in ["0.2.1", "0.5.0", "1.2.0", "2.0.0"] {
            let err =
                validate(&json!({"cniVersion": version, "ip4": {"ip": "10.0.0.2/24"}}).to_string())
                    .unwrap_err();
            assert_eq!(err.code(), 1, "{version}: {err}");
            assert!(err.msg.contains(version), "{err}");
        }
    }

    #[test]
    fn interfaces_are_objects_with_a_name() {
        for (text, says) in [
            (
                r#"{"cniVersion":"1.0.0","interfaces":"0"}"#,
                "prevResult.interfaces is a string, not an array",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[3]}"#,
                "prevResult.interfaces[0] is a number, not an object",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[null]}"#,
                "prevResult.interfaces[0] is null",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{}]}"#,
                "prevResult.interfaces[0] has no name",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":""}]}"#,
                "prevResult.interfaces[0].name is empty",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":7}]}"#,
                "prevResult.interfaces[0].name is a number",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","mac":false}]}"#,
                "prevResult.interfaces[0].mac is a boolean",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","sandbox":{}}]}"#,
                "prevResult.interfaces[0].sandbox is an object",
            ),
            (
                r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":-1}]}"#,
                "prevResult.interfaces[0].mtu -1 is not an unsigned integer",
            ),
            (
                r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":"1500"}]}"#,
                "mtu is a string",
            ),
            (
                r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":1.5}]}"#,
                "not an unsigned integer",
            ),
            (
                r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","socketPath":1}]}"#,
                "socketPath is a number",
            ),
            (
                r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","pciID":[]}]}"#,
                "pciID is an array",
            ),
        ] {
            let (code, msg) = refusal(text);
            assert_eq!(code, 6, "{text}: {msg}");
            assert!(msg.contains(says), "{text}: {msg}");
        }
        // 1.1.0's fields are unknown keys before 1.1.0: anything goes.
        validate(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","mtu":"big","pciID":[]}]}"#)
            .unwrap();
        // null is absent, as libcni's decoder reads it.
        validate(r#"{"cniVersion":"1.0.0","interfaces":null,"ips":null,"routes":null,"dns":null}"#)
            .unwrap();
        validate(r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mac":null,"mtu":null}]}"#)
            .unwrap();
    }

    #[test]
    fn ips_are_cidrs_on_interfaces_that_exist() {
        for (text, says) in [
            (
                r#"{"cniVersion":"1.0.0","ips":{}}"#,
                "prevResult.ips is an object, not an array",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{}]}"#,
                "prevResult.ips[0] has no address",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2"}]}"#,
                "prevResult.ips[0].address \"10.0.0.2\" has no prefix length",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/33"}]}"#,
                "is not an address in CIDR form",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0/24"}]}"#,
                "is not an address in CIDR form",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/+4"}]}"#,
                "is not an address in CIDR form",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"fd00::1/129"}]}"#,
                "is not an address in CIDR form",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":24}]}"#,
                "address is a number",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1/24"}]}"#,
                "gateway \"10.0.0.1/24\" is not an IP address",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","interface":3}]}"#,
                "prevResult.ips[0].interface 3 is out of range: the result has 0 interfaces",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":1}]}"#,
                "prevResult.ips[0].interface 1 is out of range: the result has 1 interface",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":-1}]}"#,
                "not an unsigned integer",
            ),
            (
                r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":"0"}]}"#,
                "interface is a string",
            ),
            (
                r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"fd00::2/64"}]}"#,
                "version is \"4\" but the address fd00::2/64 is IPv6",
            ),
            (
                r#"{"cniVersion":"0.3.1","ips":[{"version":"6","address":"10.0.0.2/24"}]}"#,
                "version is \"6\" but the address",
            ),
            (
                r#"{"cniVersion":"0.3.0","ips":[{"version":"5","address":"10.0.0.2/24"}]}"#,
                "version \"5\" is not \"4\" or \"6\"",
            ),
            (
                r#"{"cniVersion":"0.4.0","ips":[{"version":4,"address":"10.0.0.2/24"}]}"#,
                "version is a number",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","address":"10.0.0.3/24"}]}"#,
                "has the key \"address\" twice",
            ),
        ] {
            let (code, msg) = refusal(text);
            assert_eq!(code, 6, "{text}: {msg}");
            assert!(msg.contains(says), "{text}: {msg}");
        }
        // version is no 1.0 key, and pre-1.0 results may leave it out.
        validate(r#"{"cniVersion":"1.0.0","ips":[{"version":"6","address":"10.0.0.2/24"}]}"#)
            .unwrap();
        validate(r#"{"cniVersion":"0.4.0","ips":[{"address":"10.0.0.2/24"}]}"#).unwrap();
        let view = validate(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}],"interfaces":[{"name":"eth0"},{"name":"lo"}]}"#).unwrap();
        assert_eq!(view.interfaces.len(), 2);
    }

    #[test]
    fn routes_and_dns_have_their_shapes() {
        for (text, says) in [
            (
                r#"{"cniVersion":"1.0.0","routes":[{}]}"#,
                "prevResult.routes[0] has no dst",
            ),
            (
                r#"{"cniVersion":"1.0.0","routes":[{"dst":"default"}]}"#,
                "prevResult.routes[0].dst \"default\" has no prefix length",
            ),
            (
                r#"{"cniVersion":"1.0.0","routes":[{"dst":"0.0.0.0/0","gw":"gateway"}]}"#,
                "prevResult.routes[0].gw \"gateway\" is not an IP address",
            ),
            (
                r#"{"cniVersion":"1.0.0","routes":"0.0.0.0/0"}"#,
                "prevResult.routes is a string",
            ),
            (
                r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","mtu":"1400"}]}"#,
                "prevResult.routes[0].mtu is a string",
            ),
            (
                r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","table":1.5}]}"#,
                "prevResult.routes[0].table 1.5 is not an integer",
            ),
            (
                r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","scope":1e400}]}"#,
                "prevResult.routes[0].scope 1e400 is not an integer",
            ),
            (
                r#"{"cniVersion":"1.0.0","dns":[]}"#,
                "prevResult.dns is an array, not an object",
            ),
            (
                r#"{"cniVersion":"1.0.0","dns":{"nameservers":"10.96.0.10"}}"#,
                "prevResult.dns.nameservers is a string, not an array",
            ),
            (
                r#"{"cniVersion":"1.0.0","dns":{"search":[1]}}"#,
                "prevResult.dns.search[0] is a number, not a string",
            ),
            (
                r#"{"cniVersion":"1.0.0","dns":{"options":[null]}}"#,
                "prevResult.dns.options[0] is null",
            ),
            (
                r#"{"cniVersion":"1.0.0","dns":{"domain":["a"]}}"#,
                "prevResult.dns.domain is an array",
            ),
        ] {
            let (code, msg) = refusal(text);
            assert_eq!(code, 6, "{text}: {msg}");
            assert!(msg.contains(says), "{text}: {msg}");
        }
        validate(r#"{"cniVersion":"1.0.0","routes":[{"dst":"0.0.0.0/0","mtu":"x"}],"dns":{}}"#)
            .unwrap();
        validate(r#"{"cniVersion":"1.1.0","routes":[{"dst":"::/0","gw":"fd00::1","priority":-1,"table":18446744073709551615}]}"#).unwrap();
    }

    #[test]
    fn unknown_keys_are_allowed_anywhere_whatever_they_hold() {
        let text = r#"{"cniVersion":"1.1.0","x":1e400,"y":123456789012345678901234567890,"z":[[[{"q":null}]]],
            "interfaces":[{"name":"eth0","x":{"deep":[1,2]}}],"ips":[{"address":"10.0.0.2/24","x":"\u0000"}],
            "routes":[{"dst":"0.0.0.0/0","x":true}],"dns":{"x":false}}"#;
        validate(text).unwrap();
    }

    #[test]
    fn hostile_input_is_refused_without_a_panic() {
        let deep_unknown = format!(
            r#"{{"cniVersion":"1.0.0","x":{}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        // Unknown, so never parsed: it passes (and passes through).
        validate(&deep_unknown).unwrap();
        let deep_known = format!(
            r#"{{"cniVersion":"1.0.0","dns":{{"search":{}{}}}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(refusal(&deep_known).0, 6);
        let long = "9".repeat(100_000);
        let (code, msg) = refusal(&format!(
            r#"{{"cniVersion":"1.1.0","interfaces":[{{"name":"a","mtu":{long}}}]}}"#
        ));
        assert_eq!(code, 6, "{msg}");
        let (code, msg) = refusal(&format!(
            r#"{{"cniVersion":"1.0.0","ips":[{{"address":"{}"}}]}}"#,
            "\\u0001".repeat(10_000)
        ));
        assert_eq!(code, 6, "{msg}");
        let (code, msg) = refusal(&format!(r#"{{"cniVersion":"{}"}}"#, "9.".repeat(10_000)));
        assert_eq!(code, 6, "{msg}");
        let (code, msg) = refusal(
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/24","interface":18446744073709551616}]}"#,
        );
        assert_eq!(code, 6, "{msg}");
    }

    #[test]
    fn same_version_output_is_the_bytes_unchanged() {
        let text = "{ \"cniVersion\" : \"0.4.0\", \"ips\":[{\"version\":\"4\",\"address\":\"10.0.0.2/24\"}], \"x\": 1.0e2 }";
        let raw = raw(text);
        assert!(matches!(as_version(&raw, "0.4.0").unwrap(), Cow::Borrowed(t) if t == text));
    }

    #[test]
    fn converts_pre1_to_1x_dropping_ip_versions_and_keeping_unknown_members() {
        let text = r#"{"cniVersion":"0.4.0","x-top":123456789012345678901234567890,
            "interfaces":[{"name":"eth0","x-if":1}],
            "ips":[{"version":"4","address":"10.0.0.2/24","interface":0,"x-ip":[1.0e2]},{"version":"6","address":"fd00::2/64"}],
            "routes":[{"dst":"0.0.0.0/0","x-route":"r"}],"dns":{"nameservers":["10.96.0.10"],"x-dns":null}}"#;
        for to in ["1.0.0", "1.1.0"] {
            let out = as_version(&raw(text), to).unwrap().into_owned();
            // Unknown members keep their very text.
            assert!(
                out.contains(r#""x-top":123456789012345678901234567890"#),
                "{out}"
            );
            assert!(out.contains(r#""x-ip":[1.0e2]"#), "{out}");
            let out: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(out["cniVersion"], to);
            assert_eq!(
                out["ips"],
                json!([{"address":"10.0.0.2/24","interface":0,"x-ip":[100.0]},{"address":"fd00::2/64"}])
            );
            assert_eq!(out["interfaces"], json!([{"name":"eth0","x-if":1}]));
            assert_eq!(out["routes"], json!([{"dst":"0.0.0.0/0","x-route":"r"}]));
            assert_eq!(
                out["dns"],
                json!({"nameservers":["10.96.0.10"],"x-dns":null})
            );
        }
    }

    #[test]
    fn converts_1x_to_pre1_adding_ip_versions_as_libcni_does() {
        let text = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500, "socketPath": "/s", "pciID": "p", "x-if": 1}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0, "version": "6"}, {"address": "fd00::2/64"}],
            "routes": [{"dst": "0.0.0.0/0", "mtu": 1400, "advmss": 1360, "priority": 1, "table": 2, "scope": 0}],
            "x-top": {"a": 1}
        })
        .to_string();
        for to in ["0.3.0", "0.3.1", "0.4.0"] {
            let out = converted(&text, to);
            assert_eq!(out["cniVersion"], to);
            assert_eq!(
                out["ips"],
                json!([{"version":"4","address":"10.0.0.2/24","interface":0},{"version":"6","address":"fd00::2/64"}])
            );
            // libcni's 0.4.0 interface has no mtu, socketPath or pciID; its route type is shared.
            assert_eq!(
                out["interfaces"],
                json!([{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","x-if":1}])
            );
            assert_eq!(
                out["routes"],
                json!([{"dst":"0.0.0.0/0","mtu":1400,"advmss":1360,"priority":1,"table":2,"scope":0}])
            );
            assert_eq!(out["x-top"], json!({"a": 1}));
        }
    }

    #[test]
    fn converts_within_an_era_by_the_version_alone() {
        let v11 = json!({"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mtu":1500}],"ips":[{"address":"10.0.0.2/24","version":"4"}]});
        let mut expected = v11.clone();
        expected["cniVersion"] = json!("1.0.0");
        assert_eq!(converted(&v11.to_string(), "1.0.0"), expected);
        let v03 =
            json!({"cniVersion":"0.3.0","ips":[{"address":"10.0.0.2/24","version":"4"}],"x":[1]});
        let mut expected = v03.clone();
        expected["cniVersion"] = json!("0.4.0");
        assert_eq!(converted(&v03.to_string(), "0.4.0"), expected);
    }

    #[test]
    fn a_conversion_must_give_a_valid_result_of_the_config_version() {
        // 1.0.0's unknown "mtu" is 1.1.0's interface MTU.
        let text = raw(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mtu":"big"}]}"#);
        ResultView::validated(&text, "1.1.0").unwrap();
        let err = as_version(&text, "1.1.0").unwrap_err();
        assert_eq!(err.code(), 6, "{err}");
        assert!(
            err.msg.contains("prevResult.interfaces[0].mtu") && err.msg.contains("1.1.0"),
            "{err}"
        );
        assert!(err.msg.len() <= 200, "{err}");
    }

    #[test]
    fn converting_from_a_version_the_guard_does_not_read_is_code_1() {
        let err = as_version(
            &raw(r#"{"cniVersion":"1.2.0","ips":[{"address":"10.0.0.2/24"}]}"#),
            "0.4.0",
        )
        .unwrap_err();
        assert_eq!(err.code(), 1, "{err}");
    }

    #[test]
    fn validates_a_legacy_result_and_reads_its_addresses_and_routes() {
        for version in ["0.1.0", "0.2.0"] {
            let text = json!({
                "cniVersion": version,
                "ip4": {"ip": "10.1.0.9/24", "gateway": "10.1.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}], "x": 1},
                "ip6": {"ip": "fd00::9/64", "routes": [{"dst": "::/0"}]},
                "dns": {"nameservers": ["10.96.0.10"]},
                // 0.3's keys are unknown ones here.
                "interfaces": "not read", "ips": 7
            })
            .to_string();
            let view = ResultView::validated(&raw(&text), version)
                .unwrap_or_else(|e| panic!("{version}: {e}"));
            assert_eq!(view.cidrs(), vec!["10.1.0.9/24", "fd00::9/64"]);
            assert_eq!(view.routes.len(), 2);
            assert!(view.interfaces.is_empty());
            // A checkpoint's result reads the same way.
            let stored = ResultView::parse(&raw(
                &text.replace(r#""interfaces":"not read","ips":7"#, r#""y":0"#)
            ))
            .unwrap();
            assert_eq!(stored.cidrs(), view.cidrs());
            assert_eq!(stored.routes.len(), 2);
        }
    }

    #[test]
    fn a_legacy_result_that_does_not_parse_is_code_6() {
        for (text, says) in [
            (
                r#"{"cniVersion":"0.2.0","ip4":"10.0.0.2/24"}"#,
                "prevResult.ip4 is a string, not an object",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{}}"#,
                "prevResult.ip4 has no ip",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2"}}"#,
                "prevResult.ip4.ip \"10.0.0.2\" has no prefix length",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"fd00::2/64"}}"#,
                "prevResult.ip4.ip fd00::2/64 is not an IPv4 address",
            ),
            (
                r#"{"cniVersion":"0.1.0","ip6":{"ip":"10.0.0.2/24"}}"#,
                "is not an IPv6 address",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","gateway":"ten"}}"#,
                "prevResult.ip4.gateway \"ten\" is not an IP address",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","routes":{}}}"#,
                "prevResult.ip4.routes is an object",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","routes":[{"gw":"10.0.0.1"}]}}"#,
                "prevResult.ip4.routes[0] has no dst",
            ),
            (
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"},"dns":{"nameservers":"x"}}"#,
                "prevResult.dns.nameservers is a string",
            ),
        ] {
            let err = ResultView::validated(&raw(text), "0.2.0").expect_err(text);
            assert_eq!(err.code(), 6, "{text}: {err}");
            assert!(err.msg.contains(says), "{text}: {}", err.msg);
            assert!(
                err.details.contains("must return a valid CNI 0."),
                "{err:?}"
            );
        }
    }

    #[test]
    fn converts_between_0_1_0_and_0_2_0_by_the_version_alone() {
        let text = r#"{"cniVersion":"0.1.0","ip4":{"ip":"10.0.0.2/32","x":[1.0e2]},"dns":{},"x-top":true}"#;
        assert_eq!(
            as_version(&raw(text), "0.2.0").unwrap().into_owned(),
            text.replace("0.1.0", "0.2.0")
        );
    }

    #[test]
    fn converts_legacy_up_keeping_unknown_members() {
        let text = r#"{"cniVersion":"0.2.0","x-top":1e400,"ip4":{"ip":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k",
            "routes":[{"dst":"0.0.0.0/0","x-route":1}]},"ips":"an unknown key here","dns":{"domain":"d"}}"#;
        let out = as_version(&raw(text), "0.4.0").unwrap().into_owned();
        assert!(out.contains(r#""x-top":1e400"#), "{out}");
        assert_eq!(
            out,
            r#"{"cniVersion":"0.4.0","x-top":1e400,"ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k"}],"routes":[{"dst":"0.0.0.0/0","x-route":1}],"dns":{"domain":"d"}}"#
        );
        let out = as_version(&raw(text), "1.1.0").unwrap().into_owned();
        assert!(
            out.contains(r#""ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k"}]"#),
            "{out}"
        );
    }

    #[test]
    fn converting_down_needs_an_ip() {
        let err = as_version(
            &raw(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}]}"#),
            "0.2.0",
        )
        .unwrap_err();
        assert_eq!(err.code(), 6, "{err}");
        assert!(err.msg.contains("no IP address"), "{err}");
        // Below 1.0 an IP without `version` has no family to libcni.
        let err = as_version(
            &raw(r#"{"cniVersion":"0.4.0","ips":[{"address":"10.0.0.2/24"}]}"#),
            "0.1.0",
        )
        .unwrap_err();
        assert_eq!(err.code(), 6, "{err}");
    }

    #[test]
    fn a_result_without_a_version_is_in_the_configs_as_libcni_reads_it() {
        let fixed = |text: &str| {
            versioned_as_libcni_reads_it(raw(text), "0.2.0")
                .get()
                .to_string()
        };
        assert_eq!(
            fixed(r#"{"ip4":{"ip":"10.0.0.2/24"},"x":1e400}"#),
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"},"x":1e400}"#
        );
        assert_eq!(
            fixed(r#"{"cniVersion":"","ip4":{}}"#),
            r#"{"cniVersion":"0.2.0","ip4":{}}"#
        );
        assert_eq!(
            fixed(r#"{"cniVersion":1,"ip4":{}}"#),
            r#"{"cniVersion":"0.2.0","ip4":{}}"#
        );
        // A version it has, even one the guard does not read, is the result's own.
        for kept in [
            r#"{"cniVersion":"0.1.0","ip4":{}}"#,
            r#"{"cniVersion":"9.9.9"}"#,
            "[1]",
            "null",
        ] {
            assert_eq!(fixed(kept), kept);
        }
    }

    #[test]
    fn shown_values_stay_short() {
        assert_eq!(shown("abc"), "\"abc\"");
        assert!(shown(&"\u{1}".repeat(1000)).len() <= 52);
        assert!(shown(&"é".repeat(1000)).ends_with("\"..."));
    }
}
