//! Reading links, addresses and routes into the plain values of `super`.

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, Inet6DevConf, InetDevConf, InfoData, InfoMacVlan,
    InfoVlan, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo, LinkMessage, MacVlanMode,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::socket::{NlError, RouteSocket};
use super::{Dad, Kernel, LinkState, RouteState, errno, failed};
use crate::error::Result;
use crate::kernel::sysctl::{Family, RESTORED};

const RT_TABLE_MAIN: u32 = 254;

/// A link, its addresses and every route of its netns.
pub type LinkWithSurroundings = (LinkState, Vec<IpNetwork>, Vec<RouteState>);

/// Which netns a read is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Host,
    Pod,
}

impl Kernel {
    pub fn link_by_name(&self, side: Side, name: &str) -> Result<Option<LinkState>> {
        let mut request = LinkMessage::default();
        request
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        self.first_link(side, request, &format!("read link {name}"))
    }

    pub fn link_by_index(&self, side: Side, index: u32) -> Result<Option<LinkState>> {
        let mut request = LinkMessage::default();
        request.header.index = index;
        self.first_link(side, request, &format!("read link #{index}"))
    }

    fn first_link(
        &self,
        side: Side,
        request: LinkMessage,
        action: &str,
    ) -> Result<Option<LinkState>> {
        first_link(self.socket(side), request, action)
    }

    fn get_link(
        &self,
        side: Side,
        request: LinkMessage,
    ) -> std::result::Result<Option<LinkMessage>, NlError> {
        get_link(self.socket(side), request)
    }

    fn route_dump(&self, side: Side) -> Result<Vec<RouteState>> {
        route_dump(self.socket(side))
    }

    fn address_dump(&self, side: Side) -> Result<Vec<(u32, IpNetwork)>> {
        let answers = self
            .socket(side)
            .request(
                RouteNetlinkMessage::GetAddress(AddressMessage::default()),
                NLM_F_REQUEST | NLM_F_DUMP,
            )
            .map_err(|e| failed("read the addresses", e))?;
        let mut addresses = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                RouteNetlinkMessage::NewAddress(message) => {
                    addresses
                        .extend(address_cidr(&message).map(|cidr| (message.header.index, cidr)));
                }
                other => return Err(failed("read the addresses", unexpected(&other))),
            }
        }
        Ok(addresses)
    }

    /// Where duplicate address detection stands for each IPv6 address of pod link #`index`.
    pub fn ipv6_dad_states(&self, index: u32) -> Result<Vec<(std::net::Ipv6Addr, Dad)>> {
        let mut request = AddressMessage::default();
        request.header.family = AddressFamily::Inet6;
        let answers = self
            .socket(Side::Pod)
            .request(
                RouteNetlinkMessage::GetAddress(request),
                NLM_F_REQUEST | NLM_F_DUMP,
            )
            .map_err(|e| failed("read the IPv6 addresses", e))?;
        let mut states = Vec::new();
        for answer in answers {
            match answer {
                RouteNetlinkMessage::NewAddress(message) if message.header.index == index => {
                    if let Some(IpNetwork::V6(cidr)) = address_cidr(&message) {
                        states.push((cidr.ip(), dad_state(&message)));
                    }
                }
                RouteNetlinkMessage::NewAddress(_) => {}
                other => return Err(failed("read the IPv6 addresses", unexpected(&other))),
            }
        }
        Ok(states)
    }

    /// A link with its addresses and the routes of its netns: three requests in a row on one
    /// socket. The kernel answers each within the calls that send and read it, so there is no
    /// wait to overlap, and two dumps in flight on one socket would draw EBUSY.
    pub fn link_with_addresses_and_routes(
        &self,
        side: Side,
        name: &str,
    ) -> Result<Option<LinkWithSurroundings>> {
        let mut request = LinkMessage::default();
        request
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        let link = match self.get_link(side, request) {
            Ok(Some(message)) => link_state(&message),
            Ok(None) => return Ok(None),
            Err(err) if errno(&err) == Some(nix::libc::ENODEV) => return Ok(None),
            Err(err) => return Err(failed(&format!("read link {name}"), err)),
        };
        let addresses = self
            .address_dump(side)?
            .into_iter()
            .filter(|(index, _)| *index == link.index)
            .map(|(_, cidr)| cidr)
            .collect();
        Ok(Some((link, addresses, self.route_dump(side)?)))
    }
}

/// An answer of another kind than the request calls for.
fn unexpected(message: &RouteNetlinkMessage) -> NlError {
    NlError::Malformed(format!(
        "unexpected answer from the kernel (type {})",
        message.message_type()
    ))
}

fn link_state(message: &LinkMessage) -> LinkState {
    let mut link = LinkState {
        index: message.header.index,
        name: String::new(),
        kind: None,
        macvlan_mode: None,
        vlan_id: None,
        mtu: 0,
        mac: None,
        parent_index: None,
        parent_elsewhere: false,
        up: message.header.flags.contains(LinkFlags::Up),
        carrier: message.header.flags.contains(LinkFlags::LowerUp),
        noarp: message.header.flags.contains(LinkFlags::Noarp),
        settings: Vec::new(),
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => link.name = name.clone(),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::Address(bytes) if !bytes.is_empty() => link.mac = Some(mac_text(bytes)),
            LinkAttribute::Link(index) => link.parent_index = Some(*index),
            LinkAttribute::LinkNetNsId(_) => link.parent_elsewhere = true,
            LinkAttribute::AfSpecUnspec(families) => link.settings = restored_settings(families),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                        LinkInfo::Data(InfoData::MacVlan(data)) => {
                            link.macvlan_mode = data.iter().find_map(|d| match d {
                                InfoMacVlan::Mode(mode) => Some(macvlan_mode_name(*mode)),
                                _ => None,
                            });
                        }
                        LinkInfo::Data(InfoData::Vlan(data)) => {
                            link.vlan_id = data.iter().find_map(|d| match d {
                                InfoVlan::Id(id) => Some(*id),
                                _ => None,
                            });
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// The link's values of `sysctl::RESTORED`, from the per-family device configuration the
/// kernel sends with every link (IFLA_AF_SPEC): no file to read for them.
fn restored_settings(families: &[AfSpecUnspec]) -> Vec<(Family, &'static str, i32)> {
    let (mut ipv4, mut ipv6) = (None, None);
    for family in families {
        match family {
            AfSpecUnspec::Inet(values) => {
                ipv4 = values.iter().find_map(|v| match v {
                    AfSpecInet::DevConf(conf) => Some(*conf),
                    _ => None,
                });
            }
            AfSpecUnspec::Inet6(values) => {
                ipv6 = values.iter().find_map(|v| match v {
                    AfSpecInet6::DevConf(conf) => Some(*conf),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    RESTORED
        .iter()
        .filter_map(|&(family, key, _)| {
            let value = match family {
                Family::Ipv4 => ipv4_value(ipv4.as_ref()?, key),
                Family::Ipv6 => ipv6_value(ipv6.as_ref()?, key),
            }?;
            Some((family, key, value))
        })
        .collect()
}

fn ipv4_value(conf: &InetDevConf, key: &str) -> Option<i32> {
    Some(match key {
        "forwarding" => conf.forwarding,
        "rp_filter" => conf.rp_filter,
        "proxy_arp" => conf.proxy_arp,
        "arp_ignore" => conf.arp_ignore,
        "arp_announce" => conf.arp_announce,
        "arp_filter" => conf.arpfilter,
        "arp_notify" => conf.arp_notify,
        "accept_local" => conf.accept_local,
        "route_localnet" => conf.route_localnet,
        _ => return None,
    })
}

fn ipv6_value(conf: &Inet6DevConf, key: &str) -> Option<i32> {
    Some(match key {
        "forwarding" => conf.forwarding,
        "accept_ra" => conf.accept_ra,
        "autoconf" => conf.autoconf,
        "accept_dad" => conf.accept_dad,
        "dad_transmits" => conf.dad_transmits,
        "disable_ipv6" => conf.disable_ipv6,
        "use_tempaddr" => conf.use_tempaddr,
        "addr_gen_mode" => conf.addr_gen_mode,
        _ => return None,
    })
}

fn mac_text(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The names `ip -d link` prints, which is what an operator compares against.
fn macvlan_mode_name(mode: MacVlanMode) -> String {
    match mode {
        MacVlanMode::Private => "private".to_string(),
        MacVlanMode::Vepa => "vepa".to_string(),
        MacVlanMode::Bridge => "bridge".to_string(),
        MacVlanMode::Passthrough => "passthru".to_string(),
        MacVlanMode::Source => "source".to_string(),
        MacVlanMode::Other(value) => format!("mode-{value}"),
        _ => "unknown".to_string(),
    }
}

pub fn macvlan_mode_from_name(name: &str) -> Option<MacVlanMode> {
    Some(match name {
        "private" => MacVlanMode::Private,
        "vepa" => MacVlanMode::Vepa,
        "bridge" => MacVlanMode::Bridge,
        "passthru" => MacVlanMode::Passthrough,
        "source" => MacVlanMode::Source,
        _ => return None,
    })
}

/// IFA_LOCAL is the interface's own address on point-to-point links, IFA_ADDRESS the peer's;
/// on everything else they are equal and IFA_LOCAL may be absent (IPv6).
fn address_cidr(message: &AddressMessage) -> Option<IpNetwork> {
    let local = message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    IpNetwork::new(local.or(address)?, message.header.prefix_len).ok()
}

/// IFA_FLAGS carries all 32 bits when present; the header's byte holds the low eight, which
/// include both flags read here.
fn dad_state(message: &AddressMessage) -> Dad {
    let flags = message
        .attributes
        .iter()
        .find_map(|a| match a {
            AddressAttribute::Flags(flags) => Some(*flags),
            _ => None,
        })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(message.header.flags.bits())));
    if flags.contains(AddressFlags::Dadfailed) {
        Dad::Failed
    } else if flags.contains(AddressFlags::Tentative) {
        Dad::Tentative
    } else {
        Dad::Settled
    }
}

fn route_state(message: &RouteMessage) -> Option<RouteState> {
    let reject = match message.header.kind {
        RouteType::Unicast => None,
        RouteType::Unreachable => Some("unreachable"),
        RouteType::Prohibit => Some("prohibit"),
        RouteType::BlackHole => Some("blackhole"),
        _ => return None,
    };
    let mut multipath = false;
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut metric = None;
    let mut table = u32::from(message.header.table);
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(address) => dst = route_ip(address),
            RouteAttribute::Gateway(address) => gateway = route_ip(address),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Priority(value) => metric = Some(*value),
            RouteAttribute::Table(value) => table = *value,
            RouteAttribute::MultiPath(hops) => {
                multipath = true;
                if let Some(first) = hops.first() {
                    oif = oif.or(Some(first.interface_index));
                    gateway = gateway.or_else(|| {
                        first.attributes.iter().find_map(|a| match a {
                            RouteAttribute::Gateway(address) => route_ip(address),
                            _ => None,
                        })
                    });
                }
            }
            _ => {}
        }
    }
    let prefix = message.header.destination_prefix_length;
    let dst = match dst {
        Some(ip) => IpNetwork::new(ip, prefix).ok()?,
        // No RTA_DST is the default route of the family.
        None => match message.header.address_family {
            AddressFamily::Inet => {
                IpNetwork::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0).ok()?
            }
            AddressFamily::Inet6 => {
                IpNetwork::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0).ok()?
            }
            _ => return None,
        },
    };
    Some(RouteState {
        dst,
        gateway,
        oif,
        link_scope: message.header.scope == RouteScope::Link,
        metric,
        by_kernel: matches!(
            message.header.protocol,
            RouteProtocol::Kernel | RouteProtocol::Ra
        ),
        main_table: table == RT_TABLE_MAIN,
        multipath,
        reject,
    })
}

fn route_ip(address: &RouteAddress) -> Option<std::net::IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some((*ip).into()),
        RouteAddress::Inet6(ip) => Some((*ip).into()),
        _ => None,
    }
}

fn first_link(
    socket: &RouteSocket,
    request: LinkMessage,
    action: &str,
) -> Result<Option<LinkState>> {
    match get_link(socket, request) {
        Ok(message) => Ok(message.map(|m| link_state(&m))),
        // The kernel answers a lookup of a missing link with ENODEV.
        Err(err) if errno(&err) == Some(nix::libc::ENODEV) => Ok(None),
        Err(err) => Err(failed(action, err)),
    }
}

/// RTM_GETLINK for one link, by the name or the index in `request`. Its counters are left
/// out (`RTEXT_FILTER_SKIP_STATS`): nothing here reads them, and the kernel would sum them
/// over every CPU of the node, and the parser walk them, on every ADD.
fn get_link(
    socket: &RouteSocket,
    mut request: LinkMessage,
) -> std::result::Result<Option<LinkMessage>, NlError> {
    request
        .attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    let answers = socket.request(RouteNetlinkMessage::GetLink(request), NLM_F_REQUEST)?;
    match answers.into_iter().next() {
        Some(RouteNetlinkMessage::NewLink(message)) => Ok(Some(message)),
        Some(other) => Err(unexpected(&other)),
        None => Ok(None),
    }
}

fn route_dump(socket: &RouteSocket) -> Result<Vec<RouteState>> {
    // What rtnetlink's RouteMessageBuilder::<IpAddr>::new() sends: every family, and a
    // header the kernel does not filter a dump on (no NETLINK_GET_STRICT_CHK).
    let mut request = RouteMessage::default();
    request.header.table = RouteHeader::RT_TABLE_MAIN;
    request.header.protocol = RouteProtocol::Static;
    request.header.scope = RouteScope::Universe;
    request.header.kind = RouteType::Unicast;
    let answers = socket
        .request(
            RouteNetlinkMessage::GetRoute(request),
            NLM_F_REQUEST | NLM_F_DUMP,
        )
        .map_err(|e| failed("read the routes", e))?;
    let mut routes = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            RouteNetlinkMessage::NewRoute(message) => routes.extend(route_state(&message)),
            other => return Err(failed("read the routes", unexpected(&other))),
        }
    }
    Ok(routes)
}

/// A main-table route of the caller's netns and the name of its device.
pub type NamedRoute = (RouteState, Option<String>);

/// The main-table routes of the netns the calling thread is in, for the doctor: one socket,
/// no thread, a link lookup per distinct device.
pub fn main_routes_here() -> Result<Vec<NamedRoute>> {
    let socket = super::connect()?;
    let mut names: std::collections::HashMap<u32, Option<String>> =
        std::collections::HashMap::new();
    let mut named = Vec::new();
    for route in route_dump(&socket)?.into_iter().filter(|r| r.main_table) {
        let device = match route.oif {
            Some(index) => match names.get(&index) {
                Some(name) => name.clone(),
                None => {
                    let mut request = LinkMessage::default();
                    request.header.index = index;
                    let name = first_link(&socket, request, &format!("read link #{index}"))?
                        .map(|l| l.name);
                    names.insert(index, name.clone());
                    name
                }
            },
            None => None,
        };
        named.push((route, device));
    }
    Ok(named)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};
    use netlink_packet_route::link::{InfoKind, LinkFlags, State};

    /// A link answer with every attribute `link_state` reads and many it does not: read the
    /// way `socket` reads answers (`LINK_ATTRIBUTES_READ` only), it must give the same
    /// `LinkState` as the whole answer parsed. One that `link_state` starts reading without
    /// the list fails here, as long as it is in this answer.
    #[test]
    fn a_link_read_by_the_attributes_kept_is_the_link_read_whole() {
        let mut conf = InetDevConf::default();
        (conf.forwarding, conf.rp_filter, conf.arp_ignore) = (1, 2, 1);
        let mut conf6 = Inet6DevConf::default();
        (conf6.forwarding, conf6.accept_ra, conf6.disable_ipv6) = (1, 0, 1);
        let mut message = LinkMessage::default();
        message.header.index = 9;
        message.header.flags = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Noarp;
        message.attributes = vec![
            LinkAttribute::Address(vec![2, 0, 0, 0, 0, 9]),
            LinkAttribute::Broadcast(vec![0xff; 6]),
            LinkAttribute::PermAddress(vec![2, 0, 0, 0, 0, 8]),
            LinkAttribute::IfName("eth0".into()),
            LinkAttribute::IfAlias("pod".into()),
            LinkAttribute::Qdisc("noqueue".into()),
            LinkAttribute::Mtu(1450),
            LinkAttribute::MinMtu(68),
            LinkAttribute::MaxMtu(9000),
            LinkAttribute::TxQueueLen(1000),
            LinkAttribute::OperState(State::Up),
            LinkAttribute::Carrier(1),
            LinkAttribute::Link(12),
            LinkAttribute::Controller(3),
            LinkAttribute::LinkNetNsId(0),
            LinkAttribute::Group(0),
            LinkAttribute::Promiscuity(0),
            LinkAttribute::AllMulticast(0),
            LinkAttribute::NumTxQueues(2),
            LinkAttribute::NumRxQueues(2),
            LinkAttribute::CarrierChanges(1),
            LinkAttribute::GsoMaxSegs(65535),
            LinkAttribute::GsoMaxSize(65536),
            LinkAttribute::ParentDevName("0000:00:03.0".into()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::MacVlan),
                LinkInfo::Data(InfoData::MacVlan(vec![InfoMacVlan::Mode(
                    MacVlanMode::Bridge,
                )])),
            ]),
            LinkAttribute::AfSpecUnspec(vec![
                AfSpecUnspec::Inet(vec![AfSpecInet::DevConf(conf)]),
                AfSpecUnspec::Inet6(vec![AfSpecInet6::DevConf(conf6)]),
            ]),
        ];
        let mut bytes = vec![0u8; message.buffer_len()];
        message.emit(&mut bytes);

        let whole = LinkMessage::parse(&bytes[..]).expect("the whole answer parses");
        let kept = super::super::socket::link_message(&bytes).expect("the kept attributes parse");
        assert!(kept.attributes.len() < whole.attributes.len());
        let link = link_state(&kept);
        assert_eq!(link, link_state(&whole));
        // The answer exercises what link_state reads: none of it came out empty.
        assert_eq!(link.name, "eth0");
        assert_eq!(
            (link.mtu, link.parent_index, link.parent_elsewhere),
            (1450, Some(12), true)
        );
        assert_eq!(link.mac.as_deref(), Some("02:00:00:00:00:09"));
        assert_eq!(link.kind.as_deref(), Some("macvlan"));
        assert!(link.macvlan_mode.is_some());
        assert!(!link.settings.is_empty());
    }
}
