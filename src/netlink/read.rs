//! Reading links, addresses and routes into the plain values of `super`.

use futures_util::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{InfoData, InfoMacVlan, InfoVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVlanMode};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::{Kernel, LinkState, RouteState, errno, failed};
use crate::error::Result;

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
    fn handle(&self, side: Side) -> &Handle {
        match side {
            Side::Host => &self.host,
            Side::Pod => &self.pod,
        }
    }

    pub fn link_by_name(&self, side: Side, name: &str) -> Result<Option<LinkState>> {
        let request = self.handle(side).link().get().match_name(name.to_string()).execute();
        self.first_link(request, &format!("read link {name}"))
    }

    pub fn link_by_index(&self, side: Side, index: u32) -> Result<Option<LinkState>> {
        let request = self.handle(side).link().get().match_index(index).execute();
        self.first_link(request, &format!("read link #{index}"))
    }

    fn first_link(
        &self,
        request: impl futures_util::Stream<Item = std::result::Result<LinkMessage, rtnetlink::Error>>,
        action: &str,
    ) -> Result<Option<LinkState>> {
        let found = self.block_on(async move {
            futures_util::pin_mut!(request);
            request.try_next().await
        });
        match found {
            Ok(message) => Ok(message.map(|m| link_state(&m))),
            // The kernel answers a lookup of a missing link with ENODEV.
            Err(err) if errno(&err) == Some(nix::libc::ENODEV) => Ok(None),
            Err(err) => Err(failed(action, err)),
        }
    }

    async fn route_dump(&self, side: Side) -> Result<Vec<RouteState>> {
        let request = self.handle(side).route().get(RouteMessageBuilder::<std::net::IpAddr>::new().build()).execute();
        let messages: Vec<RouteMessage> = request.try_collect().await.map_err(|e| failed("read the routes", e))?;
        Ok(messages.iter().filter_map(route_state).collect())
    }

    async fn address_dump(&self, side: Side) -> Result<Vec<(u32, IpNetwork)>> {
        let request = self.handle(side).address().get().execute();
        let messages: Vec<AddressMessage> = request.try_collect().await.map_err(|e| failed("read the addresses", e))?;
        Ok(messages.iter().filter_map(|m| Some((m.header.index, address_cidr(m)?))).collect())
    }

    /// A link with its addresses and the routes of its netns, asked for in one go: ADD
    /// pays one round trip instead of three.
    pub fn link_with_addresses_and_routes(&self, side: Side, name: &str) -> Result<Option<LinkWithSurroundings>> {
        let link_request = self.handle(side).link().get().match_name(name.to_string()).execute();
        let (link, addresses, routes) = self.block_on(async {
            futures_util::pin_mut!(link_request);
            futures_util::join!(link_request.try_next(), self.address_dump(side), self.route_dump(side))
        });
        let link = match link {
            Ok(Some(message)) => link_state(&message),
            Ok(None) => return Ok(None),
            Err(err) if errno(&err) == Some(nix::libc::ENODEV) => return Ok(None),
            Err(err) => return Err(failed(&format!("read link {name}"), err)),
        };
        let addresses = addresses?.into_iter().filter(|(index, _)| *index == link.index).map(|(_, cidr)| cidr).collect();
        Ok(Some((link, addresses, routes?)))
    }
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
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => link.name = name.clone(),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::Address(bytes) if !bytes.is_empty() => link.mac = Some(mac_text(bytes)),
            LinkAttribute::Link(index) => link.parent_index = Some(*index),
            LinkAttribute::LinkNetNsId(_) => link.parent_elsewhere = true,
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

fn mac_text(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
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

fn route_state(message: &RouteMessage) -> Option<RouteState> {
    if message.header.kind != RouteType::Unicast {
        return None;
    }
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
            _ => {}
        }
    }
    let prefix = message.header.destination_prefix_length;
    let dst = match dst {
        Some(ip) => IpNetwork::new(ip, prefix).ok()?,
        // No RTA_DST is the default route of the family.
        None => match message.header.address_family {
            rtnetlink::packet_route::AddressFamily::Inet => IpNetwork::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0).ok()?,
            rtnetlink::packet_route::AddressFamily::Inet6 => IpNetwork::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0).ok()?,
            _ => return None,
        },
    };
    Some(RouteState {
        dst,
        gateway,
        oif,
        link_scope: message.header.scope == RouteScope::Link,
        metric,
        by_kernel: matches!(message.header.protocol, RouteProtocol::Kernel | RouteProtocol::Ra),
        main_table: table == RT_TABLE_MAIN,
    })
}

fn route_ip(address: &RouteAddress) -> Option<std::net::IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some((*ip).into()),
        RouteAddress::Inet6(ip) => Some((*ip).into()),
        _ => None,
    }
}
