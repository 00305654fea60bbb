//! The changes `--restore` makes, one kernel request each.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoMacVlan, InfoVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType, RouteVia,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::read::{Side, macvlan_mode_from_name};
use super::socket::NlError;
use super::{Kernel, errno, failed};
use crate::error::{GuardError, Kind, Result};

/// Right after a netns teardown the kernel may still hold the old macvlan's MAC on the
/// parent (the teardown is asynchronous): creating its twin fails with EADDRINUSE until the
/// old one is really gone, which takes milliseconds.
const ADDRESS_IN_USE_PATIENCE: Duration = Duration::from_secs(3);
const ADDRESS_IN_USE_PAUSE: Duration = Duration::from_millis(50);

/// A macvlan to create in the pod's netns.
#[derive(Debug)]
pub struct NewMacvlan<'a> {
    pub name: &'a str,
    pub parent_index: u32,
    pub mode: &'a str,
    pub mac: &'a [u8],
    pub mtu: Option<u32>,
}

/// Every change is new (EXCL) and acknowledged (ACK): its refusal comes back as an errno.
const CHANGE: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;

impl Kernel {
    fn change(&self, side: Side, message: RouteNetlinkMessage) -> std::result::Result<(), NlError> {
        self.socket(side).request(message, CHANGE).map(drop)
    }

    pub fn create_vlan(
        &self,
        name: &str,
        lower_index: u32,
        vlan_id: u16,
        mtu: Option<u32>,
    ) -> Result<()> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        message.attributes.push(LinkAttribute::Link(lower_index));
        message.attributes.extend(mtu.map(LinkAttribute::Mtu));
        message.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vlan),
            LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(vlan_id)])),
        ]));
        self.change(Side::Host, RouteNetlinkMessage::NewLink(message))
            .map_err(|e| {
                failed(
                    &format!("create vlan {name} (id {vlan_id}) on link #{lower_index}"),
                    e,
                )
            })
    }

    pub fn set_up(&self, side: Side, name: &str) -> Result<()> {
        let mut message = LinkMessage::default();
        message.header.flags |= LinkFlags::Up;
        message.header.change_mask |= LinkFlags::Up;
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        self.change(side, RouteNetlinkMessage::SetLink(message))
            .map_err(|e| failed(&format!("set {name} up"), e))
    }

    /// Creates the macvlan on its host parent straight inside the pod's netns, under its
    /// final name: no temporary name can collide in the host, and an interrupted restore
    /// leaves nothing behind there.
    pub fn create_macvlan_in_pod(&self, link: &NewMacvlan) -> Result<()> {
        let mode = macvlan_mode_from_name(link.mode).ok_or_else(|| {
            GuardError::new(
                Kind::Netlink,
                format!(
                    "macvlan mode {:?} is not one this plugin can create",
                    link.mode
                ),
            )
        })?;
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(link.name.to_string()));
        message
            .attributes
            .push(LinkAttribute::Link(link.parent_index));
        message
            .attributes
            .push(LinkAttribute::Address(link.mac.to_vec()));
        message
            .attributes
            .push(LinkAttribute::NetNsFd(self.pod_netns_fd()));
        message.attributes.extend(link.mtu.map(LinkAttribute::Mtu));
        message.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::MacVlan),
            LinkInfo::Data(InfoData::MacVlan(vec![InfoMacVlan::Mode(mode)])),
        ]));
        let started = Instant::now();
        loop {
            match self.change(Side::Host, RouteNetlinkMessage::NewLink(message.clone())) {
                Err(err)
                    if errno(&err) == Some(nix::libc::EADDRINUSE)
                        && started.elapsed() < ADDRESS_IN_USE_PATIENCE =>
                {
                    std::thread::sleep(ADDRESS_IN_USE_PAUSE);
                }
                outcome => {
                    return outcome.map_err(|e| {
                        failed(
                            &format!(
                                "create macvlan {} on link #{} in the pod's netns",
                                link.name, link.parent_index
                            ),
                            e,
                        )
                    });
                }
            }
        }
    }

    /// Removes link #`index` of the pod's netns; one already gone is no error.
    pub fn delete_pod_link(&self, index: u32) -> Result<()> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        match self.socket(Side::Pod).request(
            RouteNetlinkMessage::DelLink(message),
            NLM_F_REQUEST | NLM_F_ACK,
        ) {
            Err(err) if errno(&err) == Some(nix::libc::ENODEV) => Ok(()),
            outcome => outcome
                .map(drop)
                .map_err(|e| failed(&format!("delete link #{index} in the pod's netns"), e)),
        }
    }

    pub fn add_address(&self, index: u32, cidr: IpNetwork) -> Result<()> {
        let mut message = AddressMessage::default();
        message.header.index = index;
        message.header.prefix_len = cidr.prefix();
        // As `ip address add` (and rtnetlink's builder) words it: local and peer the same,
        // the broadcast of an IPv4 subnet spelled out.
        match cidr.ip() {
            IpAddr::V4(ip) => {
                message.header.family = AddressFamily::Inet;
                if !ip.is_multicast() {
                    message
                        .attributes
                        .push(AddressAttribute::Address(ip.into()));
                    message.attributes.push(AddressAttribute::Local(ip.into()));
                    if cidr.prefix() < 31 {
                        let broadcast = std::net::Ipv4Addr::from(
                            u32::MAX >> u32::from(cidr.prefix()) | u32::from(ip),
                        );
                        message
                            .attributes
                            .push(AddressAttribute::Broadcast(broadcast));
                    }
                }
            }
            IpAddr::V6(ip) => {
                message.header.family = AddressFamily::Inet6;
                if ip.is_multicast() {
                    message.attributes.push(AddressAttribute::Multicast(ip));
                } else {
                    message
                        .attributes
                        .push(AddressAttribute::Address(ip.into()));
                    message.attributes.push(AddressAttribute::Local(ip.into()));
                }
            }
        }
        match self.change(Side::Pod, RouteNetlinkMessage::NewAddress(message)) {
            Err(err) if errno(&err) == Some(nix::libc::EEXIST) => Ok(()),
            outcome => outcome.map_err(|e| failed(&format!("add address {cidr}"), e)),
        }
    }

    /// Removes the IPv6 address `cidr` from pod link #`index`; one already gone is no error.
    pub fn delete_address(&self, index: u32, cidr: IpNetwork) -> Result<()> {
        let mut message = AddressMessage::default();
        message.header.index = index;
        message.header.prefix_len = cidr.prefix();
        message.header.family = if cidr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        message.attributes.push(AddressAttribute::Local(cidr.ip()));
        match self.socket(Side::Pod).request(
            RouteNetlinkMessage::DelAddress(message),
            NLM_F_REQUEST | NLM_F_ACK,
        ) {
            Err(err) if errno(&err) == Some(nix::libc::EADDRNOTAVAIL) => Ok(()),
            outcome => outcome
                .map(drop)
                .map_err(|e| failed(&format!("delete address {cidr}"), e)),
        }
    }

    pub fn add_route(
        &self,
        index: u32,
        dst: IpNetwork,
        gateway: Option<IpAddr>,
        link_scope: bool,
        metric: Option<u32>,
    ) -> Result<()> {
        let mut message = RouteMessage::default();
        message.header.table = RouteHeader::RT_TABLE_MAIN;
        message.header.protocol = RouteProtocol::Static;
        message.header.scope = if link_scope {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        message.header.kind = RouteType::Unicast;
        message.header.address_family = if dst.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        message.header.destination_prefix_length = dst.prefix();
        message
            .attributes
            .push(RouteAttribute::Destination(dst.ip().into()));
        message.attributes.push(RouteAttribute::Oif(index));
        match (dst.ip(), gateway) {
            (_, None) => {}
            (IpAddr::V4(_), Some(gateway @ IpAddr::V4(_)))
            | (IpAddr::V6(_), Some(gateway @ IpAddr::V6(_))) => {
                message
                    .attributes
                    .push(RouteAttribute::Gateway(gateway.into()));
            }
            // RFC 5549: an IPv4 route through an IPv6 next hop.
            (IpAddr::V4(_), Some(IpAddr::V6(gateway))) => message
                .attributes
                .push(RouteAttribute::Via(RouteVia::Inet6(gateway))),
            (IpAddr::V6(_), Some(gateway @ IpAddr::V4(_))) => {
                return Err(GuardError::new(
                    Kind::Netlink,
                    format!(
                        "route to {dst} via {gateway}: invalid address family {:?}",
                        AddressFamily::Inet6
                    ),
                ));
            }
        }
        message
            .attributes
            .extend(metric.map(RouteAttribute::Priority));
        match self.change(Side::Pod, RouteNetlinkMessage::NewRoute(message)) {
            // The connected route of an address may already be there: same route, same effect.
            Err(err) if errno(&err) == Some(nix::libc::EEXIST) => Ok(()),
            outcome => outcome.map_err(|e| failed(&format!("add route {dst}"), e)),
        }
    }
}
