//! Link facts: what the pod's interface and its host parent were at ADD, read from the
//! kernel, so that CHECK can tell what went missing and `--restore` can rebuild it after a
//! NIC driver reload took the parent (and every macvlan on it) away.
//!
//! The primary's result names the interface, its MAC and addresses, but not its kind, its
//! macvlan mode, its parent or the parent's VLAN: those come from netlink here.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::netlink::{self, Dad, Kernel, LinkState, RouteState, Side};
use super::netns::Netns;
use super::sysctl::{self, Family};
use crate::error::{Kind, Result};

/// Stored in the checkpoint as `links`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
// One per record, read once: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum LinkFacts {
    Observed(InterfaceFacts),
    /// ADD could not read them (the netns was already gone, say); the pod was added anyway.
    Unavailable {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceFacts {
    pub name: String,
    /// The driver kind (`macvlan`, `veth`, `ipvlan`, ...); None for a link without one.
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvlan_mode: Option<String>,
    pub mtu: u32,
    pub mac: Option<String>,
    /// IPv6 link-local addresses are left out: the kernel makes them anew.
    pub addresses: Vec<IpNetwork>,
    /// Main-table routes out of this interface that the kernel did not add by itself.
    pub routes: Vec<RouteFacts>,
    /// The host link the interface hangs off: a macvlan's master, a veth's host end.
    pub parent: Option<ParentFacts>,
    /// Its settings of `sysctl::RESTORED` that differed from the kernel's defaults at ADD (one
    /// left out had the default); None in records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<InterfaceSettings>,
}

/// `net.ipv4.conf.<if>.<key>` and `net.ipv6.conf.<if>.<key>` values, by key
/// (`addr_gen_mode` is `ip link`'s `addrgenmode`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InterfaceSettings {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ipv4: BTreeMap<String, i32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ipv6: BTreeMap<String, i32>,
}

impl InterfaceSettings {
    pub fn get(&self, family: Family, key: &str) -> Option<i32> {
        match family {
            Family::Ipv4 => self.ipv4.get(key),
            Family::Ipv6 => self.ipv6.get(key),
        }
        .copied()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFacts {
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub link_scope: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentFacts {
    pub name: String,
    /// Tells a re-created parent (same name, new index) from the one the pod was added on.
    pub index: u32,
    pub kind: Option<String>,
    pub mtu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanFacts>,
}

/// The parent is a vlan link (`eth0.3`, `bond4.3`): what it takes to create it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VlanFacts {
    pub id: u16,
    pub lower: String,
}

/// What ADD reads of the pod's netns, before it takes the store lock, with the namespace
/// opened and entered once.
pub struct AtAdd {
    /// The facts of the interface. Never fails the pod: facts that cannot be read (within
    /// the sockets' answer timeout) are recorded as missing, with why, and ADD's log line
    /// warns with `missing_note`.
    pub links: LinkFacts,
    /// The interface's index in the netns (`None` when the facts are unavailable).
    pub if_index: Option<u32>,
    /// The namespace's device and inode, when the path is a namespace file.
    pub netns_id: Option<(u64, u64)>,
    /// Its cookie (`netns::netns_cookie`), read from the netlink socket made in it.
    pub netns_cookie: Option<u64>,
}

/// ADD's call: the facts of `if_name` in the netns at `netns`, and the namespace's identity.
pub fn read_at_add(netns: &str, if_name: &str) -> AtAdd {
    let pod_netns = match Netns::open(Path::new(netns)) {
        Ok(pod_netns) => pod_netns,
        Err(err) => {
            return AtAdd {
                links: LinkFacts::Unavailable { reason: err.msg },
                if_index: None,
                netns_id: None,
                netns_cookie: None,
            };
        }
    };
    let netns_id = pod_netns.identity();
    let mut netns_cookie = None;
    let observed = netlink::with_open_netns(pod_netns, |kernel| {
        netns_cookie = kernel.pod_netns_cookie();
        observe(kernel, if_name)
    });
    // No netlink socket could be made there: the cookie comes through a socket of its own.
    if netns_cookie.is_none() && netns_id.is_some() {
        netns_cookie = crate::kernel::netns::netns_cookie(netns);
    }
    let (links, if_index) = match observed {
        Ok((facts, index)) => (LinkFacts::Observed(facts), Some(index)),
        Err(err) => (LinkFacts::Unavailable { reason: err.msg }, None),
    };
    AtAdd {
        links,
        if_index,
        netns_id,
        netns_cookie,
    }
}

impl LinkFacts {
    /// For the ADD log line, which stays one line per operation.
    pub fn missing_note(&self) -> Option<String> {
        match self {
            LinkFacts::Observed(_) => None,
            LinkFacts::Unavailable { reason } => Some(format!(
                "; link facts not recorded ({reason}): CHECK compares with the prevResult only and \
                 --restore cannot rebuild this interface"
            )),
        }
    }
}

fn observe(kernel: &Kernel, if_name: &str) -> Result<(InterfaceFacts, u32)> {
    let (link, addresses, routes) = kernel
        .link_with_addresses_and_routes(Side::Pod, if_name)?
        .ok_or_else(|| {
            crate::error::GuardError::new(
                Kind::Netlink,
                format!("no interface {if_name} in the netns"),
            )
        })?;
    let parent = match (link.parent_elsewhere, link.parent_index) {
        (true, Some(index)) => kernel
            .link_by_index(Side::Host, index)?
            .map(|parent| parent_facts(kernel, parent))
            .transpose()?,
        _ => None,
    };
    let mut facts = interface_facts(&link, &addresses, &routes, parent);
    facts.settings = Some(settings_of(&link.settings));
    Ok((facts, link.index))
}

/// The link's values that differ from the kernel's defaults (`sysctl::RESTORED`); one not
/// recorded is the default.
fn settings_of(link: &[(Family, &'static str, i32)]) -> InterfaceSettings {
    let mut settings = InterfaceSettings::default();
    for &(family, key, value) in link {
        if sysctl::kernel_default(family, key).is_some_and(|default| default != value) {
            match family {
                Family::Ipv4 => settings.ipv4.insert(key.to_string(), value),
                Family::Ipv6 => settings.ipv6.insert(key.to_string(), value),
            };
        }
    }
    settings
}

fn parent_facts(kernel: &Kernel, parent: LinkState) -> Result<ParentFacts> {
    let vlan = match (parent.vlan_id, parent.parent_index) {
        (Some(id), Some(lower_index)) => {
            kernel
                .link_by_index(Side::Host, lower_index)?
                .map(|lower| VlanFacts {
                    id,
                    lower: lower.name,
                })
        }
        _ => None,
    };
    Ok(ParentFacts {
        name: parent.name,
        index: parent.index,
        kind: parent.kind,
        mtu: parent.mtu,
        vlan,
    })
}

/// What of the kernel's view is the pod's own: the pure half of `observe`.
fn interface_facts(
    link: &LinkState,
    addresses: &[IpNetwork],
    routes: &[RouteState],
    parent: Option<ParentFacts>,
) -> InterfaceFacts {
    InterfaceFacts {
        name: link.name.clone(),
        kind: link.kind.clone(),
        macvlan_mode: link.macvlan_mode.clone(),
        mtu: link.mtu,
        mac: link.mac.clone(),
        addresses: addresses
            .iter()
            .copied()
            .filter(|a| !is_ipv6_link_local(a))
            .collect(),
        routes: routes
            .iter()
            .filter(|r| {
                r.oif == Some(link.index)
                    && r.main_table
                    && !r.by_kernel
                    && !r.multipath
                    && r.reject.is_none()
            })
            .map(|r| RouteFacts {
                dst: r.dst,
                gateway: r.gateway,
                link_scope: r.link_scope,
                metric: r.metric,
            })
            .collect(),
        parent,
        settings: None,
    }
}

fn is_ipv6_link_local(address: &IpNetwork) -> bool {
    matches!(address.ip(), IpAddr::V6(ip) if ip.segments()[0] & 0xffc0 == 0xfe80)
}

/// What CHECK expects in the netns: the link facts when ADD recorded them, else what the
/// primary's result says (records from before link facts, or facts that were unavailable).
#[derive(Debug)]
pub struct Expected {
    pub if_name: String,
    pub mac: Option<String>,
    pub addresses: Vec<IpNetwork>,
    /// A route with no gateway matches any gateway: a CNI result leaves it out when the
    /// route goes via the address's gateway.
    pub routes: Vec<(IpNetwork, Option<IpAddr>)>,
    pub parent: Option<ParentFacts>,
}

/// What CHECK saw in the netns (and, when the interface is gone, of its parent on the host).
#[derive(Debug, Default)]
pub struct Observed {
    pub link: Option<LinkState>,
    pub addresses: Vec<IpNetwork>,
    pub routes: Vec<RouteState>,
    /// Looked up by the recorded parent's name, only when the interface is missing.
    pub parent_now: Option<LinkState>,
    /// IPv6 addresses the kernel holds but will not use: another node answered its duplicate
    /// address detection. Read only when an IPv6 address is expected.
    pub dad_failed: Vec<IpAddr>,
}

pub fn observe_for_check(netns: &Path, expected: &Expected) -> Result<Observed> {
    netlink::with_pod_netns(netns, |kernel| {
        let Some((link, addresses, routes)) =
            kernel.link_with_addresses_and_routes(Side::Pod, &expected.if_name)?
        else {
            let parent_now = match &expected.parent {
                Some(parent) => kernel.link_by_name(Side::Host, &parent.name)?,
                None => None,
            };
            return Ok(Observed {
                parent_now,
                ..Observed::default()
            });
        };
        let routes = routes
            .into_iter()
            .filter(|r| r.oif == Some(link.index) && r.main_table && !r.multipath)
            .collect();
        let dad_failed = if expected.addresses.iter().any(IpNetwork::is_ipv6) {
            let states = kernel.ipv6_dad_states(link.index)?;
            states
                .into_iter()
                .filter(|(_, dad)| *dad == Dad::Failed)
                .map(|(ip, _)| IpAddr::V6(ip))
                .collect()
        } else {
            Vec::new()
        };
        Ok(Observed {
            link: Some(link),
            addresses,
            routes,
            parent_now: None,
            dad_failed,
        })
    })
}

/// Every way the netns differs from what was checkpointed, one sentence each.
/// `restore_hint` is the command that brings a missing interface back.
pub fn differences(
    expected: &Expected,
    observed: &Observed,
    netns: &str,
    restore_hint: &str,
) -> Vec<String> {
    let if_name = &expected.if_name;
    let Some(link) = &observed.link else {
        let parent = match &expected.parent {
            None => String::new(),
            Some(parent) => match &observed.parent_now {
                None => format!("; its parent link {} is gone", parent.name),
                Some(now) if now.index != parent.index => format!(
                    "; its parent link {} was re-created (ifindex {} at ADD, {} now), which takes every macvlan on it along",
                    parent.name, parent.index, now.index
                ),
                Some(_) => format!(
                    "; its parent link {} is still there, so the interface itself was deleted",
                    parent.name
                ),
            },
        };
        return vec![format!(
            "interface {if_name} is missing from netns {netns}{parent}; run `{restore_hint}` to re-create it"
        )];
    };
    let mut found = Vec::new();
    if let (Some(want), Some(have)) = (&expected.mac, &link.mac)
        && !want.eq_ignore_ascii_case(have)
    {
        found.push(format!(
            "interface {if_name} has MAC {have}, the checkpoint has {want}"
        ));
    }
    for address in &expected.addresses {
        if !observed.addresses.contains(address) {
            found.push(format!("address {address} is missing from {if_name}"));
        } else if observed.dad_failed.contains(&address.ip()) {
            found.push(format!(
                "address {address} on {if_name} failed duplicate address detection: another node on the link holds it, \
                 so the pod cannot use it"
            ));
        }
    }
    for (dst, gateway) in &expected.routes {
        let present = observed
            .routes
            .iter()
            .any(|r| r.dst == *dst && (gateway.is_none() || r.gateway == *gateway));
        if !present {
            let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
            found.push(format!("route {dst}{via} is missing from {if_name}"));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn link(index: u32, name: &str) -> LinkState {
        LinkState {
            index,
            name: name.to_string(),
            kind: Some("macvlan".to_string()),
            macvlan_mode: Some("bridge".to_string()),
            vlan_id: None,
            mtu: 1500,
            mac: Some("6e:92:1a:b4:fc:34".to_string()),
            parent_index: Some(7),
            parent_elsewhere: true,
            up: true,
            carrier: true,
            noarp: false,
            settings: Vec::new(),
        }
    }

    fn route(dst: &str, gateway: Option<&str>, oif: u32, by_kernel: bool) -> RouteState {
        RouteState {
            dst: dst.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            oif: Some(oif),
            link_scope: gateway.is_none(),
            metric: None,
            by_kernel,
            main_table: true,
            multipath: false,
            reject: None,
        }
    }

    fn expected() -> Expected {
        Expected {
            if_name: "eth0".to_string(),
            mac: Some("6e:92:1a:b4:fc:34".to_string()),
            addresses: vec!["10.161.75.155/22".parse().unwrap()],
            routes: vec![(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.161.72.1".parse().unwrap()),
            )],
            parent: Some(ParentFacts {
                name: "bond4.3".into(),
                index: 7,
                kind: Some("vlan".into()),
                mtu: 1500,
                vlan: None,
            }),
        }
    }

    #[test]
    fn keeps_what_the_pod_owns() {
        let facts = interface_facts(
            &link(3, "eth0"),
            &[
                "10.161.75.155/22".parse().unwrap(),
                "fe80::1/64".parse().unwrap(),
                "fd00::5/64".parse().unwrap(),
            ],
            &[
                route("0.0.0.0/0", Some("10.161.72.1"), 3, false),
                route("10.161.72.0/22", None, 3, true),
                route("10.9.0.0/16", None, 3, false),
                route("0.0.0.0/0", Some("192.168.1.1"), 9, false),
            ],
            None,
        );
        assert_eq!(
            facts.addresses,
            vec![
                "10.161.75.155/22".parse::<IpNetwork>().unwrap(),
                "fd00::5/64".parse().unwrap()
            ]
        );
        let dsts: Vec<String> = facts.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["0.0.0.0/0", "10.9.0.0/16"]);
        assert!(facts.routes[1].link_scope);
    }

    #[test]
    fn only_settings_that_differ_from_the_kernels_defaults_are_recorded() {
        let link = [
            (Family::Ipv4, "arp_ignore", 1),
            (Family::Ipv4, "rp_filter", 0),
            (Family::Ipv6, "addr_gen_mode", 1),
            (Family::Ipv6, "accept_ra", 1),
            (Family::Ipv6, "accept_dad", 0),
        ];
        let settings = settings_of(&link);
        assert_eq!(
            serde_json::to_string(&settings).unwrap(),
            r#"{"ipv4":{"arp_ignore":1},"ipv6":{"accept_dad":0,"addr_gen_mode":1}}"#
        );
    }

    #[test]
    fn records_of_earlier_releases_have_no_settings() {
        let old = r#"{"state":"observed","name":"eth0","kind":"macvlan","mtu":1500,"mac":null,
            "addresses":[],"routes":[],"parent":null}"#;
        let LinkFacts::Observed(facts) = serde_json::from_str(old).unwrap() else {
            panic!()
        };
        assert_eq!(facts.settings, None);
    }

    #[test]
    fn facts_round_trip_through_json() {
        let facts = LinkFacts::Observed(interface_facts(
            &link(3, "eth0"),
            &[],
            &[route("0.0.0.0/0", Some("10.0.0.1"), 3, false)],
            None,
        ));
        let text = serde_json::to_string(&facts).unwrap();
        assert!(text.contains(r#""state":"observed""#), "{text}");
        assert_eq!(serde_json::from_str::<LinkFacts>(&text).unwrap(), facts);
        let missing: LinkFacts =
            serde_json::from_str(r#"{"state":"unavailable","reason":"netns gone"}"#).unwrap();
        assert_eq!(
            missing,
            LinkFacts::Unavailable {
                reason: "netns gone".into()
            }
        );
    }

    #[test]
    fn a_vanished_interface_names_its_parent_and_the_fix() {
        let hint = "sandbox-guard --restore abc";
        let gone = differences(&expected(), &Observed::default(), "/run/netns/p", hint);
        assert_eq!(gone.len(), 1);
        assert!(
            gone[0].contains("interface eth0 is missing from netns /run/netns/p"),
            "{}",
            gone[0]
        );
        assert!(
            gone[0].contains("parent link bond4.3 is gone"),
            "{}",
            gone[0]
        );
        assert!(gone[0].contains(hint), "{}", gone[0]);

        let recreated = Observed {
            parent_now: Some(link(12, "bond4.3")),
            ..Observed::default()
        };
        let text = &differences(&expected(), &recreated, "/run/netns/p", hint)[0];
        assert!(
            text.contains("was re-created (ifindex 7 at ADD, 12 now)"),
            "{text}"
        );
    }

    #[test]
    fn each_difference_is_reported() {
        let mut other = link(3, "eth0");
        other.mac = Some("02:00:00:00:00:01".into());
        let observed = Observed {
            link: Some(other),
            ..Observed::default()
        };
        let found = differences(&expected(), &observed, "/run/netns/p", "x");
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("MAC 02:00:00:00:00:01"));
        assert!(found[1].contains("address 10.161.75.155/22 is missing"));
        assert!(found[2].contains("route 0.0.0.0/0 via 10.161.72.1 is missing"));

        let intact = Observed {
            link: Some(link(3, "eth0")),
            addresses: vec!["10.161.75.155/22".parse().unwrap()],
            routes: vec![route("0.0.0.0/0", Some("10.161.72.1"), 3, false)],
            ..Observed::default()
        };
        assert!(differences(&expected(), &intact, "/run/netns/p", "x").is_empty());
    }

    #[test]
    fn an_ipv6_address_another_node_holds_is_a_difference() {
        let mut expected = expected();
        let v6: IpNetwork = "fd00:161::9b/64".parse().unwrap();
        expected.addresses.push(v6);
        let observed = Observed {
            link: Some(link(3, "eth0")),
            addresses: vec!["10.161.75.155/22".parse().unwrap(), v6],
            routes: vec![route("0.0.0.0/0", Some("10.161.72.1"), 3, false)],
            dad_failed: vec![v6.ip()],
            ..Observed::default()
        };
        let found = differences(&expected, &observed, "/run/netns/p", "x");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("address fd00:161::9b/64 on eth0 failed duplicate address detection"),
            "{}",
            found[0]
        );
    }
}
