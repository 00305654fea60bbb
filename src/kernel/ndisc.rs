//! Unsolicited neighbour advertisements for a restored interface: IPv6's gratuitous ARP
//! (RFC 4861 7.2.6). Neighbours that still map the pod's address to a link-layer address
//! (the router first of all) take the one advertised, since the Override flag is set; the
//! kernel sends none itself unless `ndisc_notify` is on.
//!
//! A raw ICMPv6 socket made inside the pod's netns (`netns::inside`), bound to the address
//! it advertises: the kernel adds the IPv6 header and the checksum, and picks the multicast
//! MAC of ff02::1. Sent only once duplicate address detection has settled: advertising an
//! address another node holds, with Override, would take its traffic away. Where the link
//! does no detection of its own, `Prober` sends the kernel's probe for it.

use std::io;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::libc;

use super::netns::Netns;
use super::raw_socket;
use crate::error::Result;

const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
const ROUTER: u8 = 0x80;
const OVERRIDE: u8 = 0x20;
const TARGET_LINK_LAYER_ADDRESS: u8 = 2;
/// Receivers drop neighbour discovery that crossed a router (RFC 4861 7.1.2).
const HOP_LIMIT: i32 = 255;

/// The ICMPv6 message: an advertisement of `ip` at `mac`, not solicited, overriding what
/// receivers have cached, and a router's when the pod forwards: receivers take a clear Router
/// flag from a neighbour they knew as a router to mean it no longer is one (RFC 4861 7.2.5),
/// so the flag is set as the kernel sets it in its own (from the `forwarding` sysctl). The
/// checksum stays zero for the kernel to fill.
pub fn advertisement(mac: [u8; 6], ip: Ipv6Addr, router: bool) -> [u8; 32] {
    let mut packet = [0u8; 32];
    packet[0] = NEIGHBOUR_ADVERTISEMENT;
    packet[4] = OVERRIDE | if router { ROUTER } else { 0 };
    packet[8..24].copy_from_slice(&ip.octets());
    packet[24] = TARGET_LINK_LAYER_ADDRESS;
    // Option length in units of 8 bytes.
    packet[25] = 1;
    packet[26..32].copy_from_slice(&mac);
    packet
}

/// Sends one advertisement per address to all nodes (ff02::1) out of link `index` of `netns`.
/// Each address must be usable (not tentative): it is the packet's source.
pub fn advertise(
    netns: &Netns,
    index: u32,
    mac: [u8; 6],
    router: bool,
    addresses: &[Ipv6Addr],
) -> Result<()> {
    let sockets = super::netns::inside(netns, || {
        addresses
            .iter()
            .map(|ip| {
                icmpv6_socket(index, *ip)
                    .map_err(|e| raw_socket::failed(&format!("open an ICMPv6 socket for {ip}"), e))
            })
            .collect::<Result<Vec<OwnedFd>>>()
    })?;
    let to = sockaddr(SocketAddrV6::new(
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        0,
        0,
        index,
    ));
    for (ip, socket) in addresses.iter().zip(sockets) {
        raw_socket::send_to(&socket, &advertisement(mac, *ip, router), &to).map_err(|e| {
            raw_socket::failed(&format!("send the neighbour advertisement for {ip}"), e)
        })?;
    }
    Ok(())
}

fn icmpv6_socket(index: u32, source: Ipv6Addr) -> io::Result<OwnedFd> {
    let socket = raw_socket::open(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)?;
    set_int(&socket, libc::IPV6_MULTICAST_HOPS, HOP_LIMIT)?;
    set_int(
        &socket,
        libc::IPV6_MULTICAST_IF,
        i32::try_from(index).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
    )?;
    // A link-local source needs its link as the scope; a global one ignores it.
    let bound = sockaddr(SocketAddrV6::new(source, 0, 0, index));
    // SAFETY: the address pointer is valid for the length passed.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&raw const bound).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

fn set_int(socket: &OwnedFd, option: i32, value: i32) -> io::Result<()> {
    // SAFETY: the value pointer is valid for the length passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            option,
            (&raw const value).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn sockaddr(address: SocketAddrV6) -> libc::sockaddr_in6 {
    // SAFETY: sockaddr_in6 is plain old data; all-zero is a valid value that is filled in below.
    let mut raw: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    raw.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    raw.sin6_port = address.port().to_be();
    raw.sin6_addr.s6_addr = address.ip().octets();
    raw.sin6_scope_id = address.scope_id();
    raw
}

const NEIGHBOUR_SOLICITATION: u8 = 135;
const ETH_P_IPV6: u16 = 0x86dd;
const ICMPV6: u8 = 58;
const IPV6_HEADER: usize = 40;

/// ff02::1:ffXX:XXXX, the group a node that holds `ip` listens on.
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The Ethernet group of an IPv6 multicast address (RFC 2464 7).
fn multicast_mac(group: Ipv6Addr) -> [u8; 6] {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// A duplicate address detection probe for `target` (RFC 4862 5.4.2), IPv6 header included:
/// a neighbour solicitation from the unspecified address :: to `target`'s solicited-node
/// group, hop limit 255, no option, so that no receiver learns anything from it and a node
/// that holds `target` answers with an advertisement to all nodes. Built whole, since the
/// kernel would put an address of the link's as the source of a raw ICMPv6 socket's packet.
pub fn solicitation(target: Ipv6Addr) -> [u8; IPV6_HEADER + 24] {
    let mut packet = [0u8; IPV6_HEADER + 24];
    let to = solicited_node(target);
    packet[0] = 0x60;
    packet[4..6].copy_from_slice(&24u16.to_be_bytes());
    packet[6] = ICMPV6;
    packet[7] = HOP_LIMIT as u8;
    // Source :: stays zero.
    packet[24..40].copy_from_slice(&to.octets());
    let icmp = &mut packet[IPV6_HEADER..];
    icmp[0] = NEIGHBOUR_SOLICITATION;
    icmp[8..24].copy_from_slice(&target.octets());
    let sum = checksum(Ipv6Addr::UNSPECIFIED, to, &packet[IPV6_HEADER..]);
    packet[IPV6_HEADER + 2..IPV6_HEADER + 4].copy_from_slice(&sum.to_be_bytes());
    packet
}

/// The ICMPv6 checksum (RFC 4443 2.3) over the pseudo-header and `message`.
fn checksum(from: Ipv6Addr, to: Ipv6Addr, message: &[u8]) -> u16 {
    let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut pseudo = Vec::with_capacity(40 + message.len());
    pseudo.extend_from_slice(&from.octets());
    pseudo.extend_from_slice(&to.octets());
    pseudo.extend_from_slice(&length.to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, ICMPV6]);
    pseudo.extend_from_slice(message);
    let mut sum: u32 = pseudo
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether `packet`, an IPv6 packet from MAC `from`, says another node holds `target` (RFC
/// 4862 5.4.3, 5.4.4): an advertisement for it, or a detection probe of its own for it.
/// `ours` is the prober's MAC.
pub fn holder_of(packet: &[u8], target: Ipv6Addr, from: [u8; 6], ours: [u8; 6]) -> bool {
    if from == ours
        || packet.len() < IPV6_HEADER + 24
        || packet[0] >> 4 != 6
        || packet[6] != ICMPV6
        || packet[7] != HOP_LIMIT as u8
    {
        return false;
    }
    let icmp = &packet[IPV6_HEADER..];
    if icmp[8..24] != target.octets() {
        return false;
    }
    match icmp[0] {
        NEIGHBOUR_ADVERTISEMENT => true,
        NEIGHBOUR_SOLICITATION => packet[8..24] == [0; 16],
        _ => false,
    }
}

/// Detection probes for a link's IPv6 addresses, sent and listened for on one AF_PACKET socket
/// made inside the pod's netns and bound to the link; it hears the all-nodes group (where a
/// holder answers) and each address's solicited-node group (where another node probes).
pub struct Prober {
    socket: OwnedFd,
    link: libc::sockaddr_ll,
    mac: [u8; 6],
    addresses: Vec<Ipv6Addr>,
}

impl Prober {
    pub fn open(
        netns: &Netns,
        index: u32,
        mac: [u8; 6],
        addresses: Vec<Ipv6Addr>,
    ) -> Result<Prober> {
        let (socket, link) =
            raw_socket::packet_socket_on(netns, index, libc::SOCK_DGRAM, ETH_P_IPV6)?;
        let groups = std::iter::once(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1))
            .chain(addresses.iter().map(|ip| solicited_node(*ip)));
        for group in groups {
            raw_socket::join_multicast(&socket, index, multicast_mac(group))
                .map_err(|e| raw_socket::failed(&format!("listen on {group}"), e))?;
        }
        Ok(Prober {
            socket,
            link,
            mac,
            addresses,
        })
    }

    /// One probe for each address.
    pub fn send(&self) -> Result<()> {
        for ip in &self.addresses {
            let mut to = self.link;
            to.sll_halen = 6;
            to.sll_addr[..6].copy_from_slice(&multicast_mac(solicited_node(*ip)));
            raw_socket::send_to(&self.socket, &solicitation(*ip), &to).map_err(|e| {
                raw_socket::failed(&format!("send the neighbour solicitation for {ip}"), e)
            })?;
        }
        Ok(())
    }

    /// The addresses it probes for.
    pub fn addresses(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.addresses.iter().copied()
    }

    /// The addresses another node has shown to hold since the last call, with its MAC.
    pub fn held(&self) -> Result<Vec<(Ipv6Addr, [u8; 6])>> {
        let heard = raw_socket::drain(&self.socket)
            .map_err(|e| raw_socket::failed("read neighbour discovery answers", e))?;
        Ok(heard
            .iter()
            .flat_map(|frame| {
                self.addresses
                    .iter()
                    .filter(|ip| holder_of(&frame.payload, **ip, frame.from, self.mac))
                    .map(|ip| (*ip, frame.from))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertisement_overrides_and_carries_the_mac() {
        let mac = [0x6e, 0x92, 0x1a, 0xb4, 0xfc, 0x34];
        let ip: Ipv6Addr = "fd5a:c8:3::5".parse().unwrap();
        let packet = advertisement(mac, ip, false);
        // Type 136, code 0, checksum left to the kernel; R=0 S=0 O=1.
        assert_eq!(&packet[0..8], &[136, 0, 0, 0, 0x20, 0, 0, 0]);
        // A forwarding pod's: R=1 S=0 O=1.
        assert_eq!(advertisement(mac, ip, true)[4], 0xa0);
        assert_eq!(&packet[8..24], &ip.octets());
        assert_eq!(&packet[24..26], &[2, 1]);
        assert_eq!(&packet[26..32], &mac);
    }

    #[test]
    fn a_detection_probe_comes_from_nowhere_to_the_solicited_node_group() {
        let ip: Ipv6Addr = "fd5a:c8:3::1:2345".parse().unwrap();
        let packet = solicitation(ip);
        assert_eq!(&packet[0..8], &[0x60, 0, 0, 0, 0, 24, 58, 255]);
        assert_eq!(&packet[8..24], &[0; 16]);
        assert_eq!(
            Ipv6Addr::from(<[u8; 16]>::try_from(&packet[24..40]).unwrap()),
            "ff02::1:ff01:2345".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(packet[40], 135);
        assert_eq!(&packet[48..64], &ip.octets());
        // A message with its checksum in place sums to zero.
        let to = solicited_node(ip);
        assert_eq!(checksum(Ipv6Addr::UNSPECIFIED, to, &packet[40..]), 0);
        assert_eq!(multicast_mac(to), [0x33, 0x33, 0xff, 0x01, 0x23, 0x45]);
    }

    #[test]
    fn an_advertisement_or_another_probe_shows_a_holder() {
        let ip: Ipv6Addr = "fd5a:c8:3::5".parse().unwrap();
        let (ours, theirs) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let probe = solicitation(ip);
        assert!(holder_of(&probe, ip, theirs, ours));
        assert!(!holder_of(&probe, ip, ours, ours));
        assert!(!holder_of(
            &probe,
            "fd5a:c8:3::6".parse().unwrap(),
            theirs,
            ours
        ));
        let mut answer = [0u8; 64];
        answer[0] = 0x60;
        answer[6] = 58;
        answer[7] = 255;
        answer[40..72 - 8].copy_from_slice(&advertisement(theirs, ip, false)[..24]);
        assert!(holder_of(&answer, ip, theirs, ours));
        answer[7] = 64;
        assert!(!holder_of(&answer, ip, theirs, ours), "crossed a router");
    }
}
