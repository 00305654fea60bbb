//! ARP for a restored interface. First RFC 5227 probes, before its IPv4 addresses go on the
//! link: another node that answers holds the address, and an announcement would take its
//! traffic. Then the gratuitous ARP: neighbours (the gateway first of all) still map the pod's
//! IP to its MAC, but after the link vanished some may have dropped or aged the entry; one
//! broadcast re-teaches them before the pod's first packet needs an answer.
//!
//! The AF_PACKET socket is made inside the pod's netns (`netns::inside`): like the netlink
//! sockets, it belongs to the netns it was created in.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

use nix::libc;

use super::netns::Netns;
use super::raw_socket;
use crate::error::Result;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const BROADCAST: [u8; 6] = [0xff; 6];

/// An ARP request for `ip` from `ip` (RFC 5227's announcement): every receiver that knows
/// `ip` updates its entry, and nobody answers.
pub fn announcement(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 28] {
    let mut packet = [0u8; 28];
    packet[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
    packet[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
    packet[4] = 6;
    packet[5] = 4;
    packet[6..8].copy_from_slice(&ARPOP_REQUEST.to_be_bytes());
    packet[8..14].copy_from_slice(&mac);
    packet[14..18].copy_from_slice(&ip.octets());
    // Target hardware address stays zero: it is what is being asked for.
    packet[24..28].copy_from_slice(&ip.octets());
    packet
}

/// Broadcasts one announcement per address out of link `index` of `netns`.
pub fn announce(netns: &Netns, index: u32, mac: [u8; 6], addresses: &[Ipv4Addr]) -> Result<()> {
    if addresses.is_empty() {
        return Ok(());
    }
    // SOCK_DGRAM: the kernel builds the Ethernet header from the sockaddr_ll.
    let socket = super::netns::inside(netns, || {
        raw_socket::open(
            libc::AF_PACKET,
            libc::SOCK_DGRAM,
            i32::from(ETH_P_ARP.to_be()),
        )
        .map_err(|e| raw_socket::failed("open an AF_PACKET socket", e))
    })?;
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value that is filled in below.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = ETH_P_ARP.to_be();
    to.sll_ifindex = i32::try_from(index).map_err(|_| {
        raw_socket::failed("address link", io::Error::from(io::ErrorKind::InvalidInput))
    })?;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&BROADCAST);
    for ip in addresses {
        raw_socket::send_to(&socket, &announcement(mac, *ip), &to)
            .map_err(|e| raw_socket::failed(&format!("send the gratuitous ARP for {ip}"), e))?;
    }
    Ok(())
}

/// RFC 5227's probe: an ARP request for `ip` from the unspecified sender 0.0.0.0, so that
/// no receiver learns anything from it, and a node that holds `ip` answers.
pub fn probe(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 28] {
    let mut packet = announcement(mac, ip);
    packet[14..18].copy_from_slice(&[0; 4]);
    packet
}

/// Whether `packet`, an ARP message another node sent, says that node holds `ip` (RFC 5227
/// 2.1.1): it names `ip` as its sender (a reply to the probe, an announcement), or it probes
/// for `ip` itself. `ours` is the prober's MAC. Returns the holder's MAC.
pub fn holder_of(packet: &[u8], ip: Ipv4Addr, ours: [u8; 6]) -> Option<[u8; 6]> {
    if packet.len() < 28 || packet[0..6] != [0, 1, 8, 0, 6, 4] {
        return None;
    }
    let mut sender = [0u8; 6];
    sender.copy_from_slice(&packet[8..14]);
    let (sender_ip, target_ip) = (&packet[14..18], &packet[24..28]);
    let request = packet[6..8] == ARPOP_REQUEST.to_be_bytes();
    let held =
        sender_ip == ip.octets() || (request && sender_ip == [0; 4] && target_ip == ip.octets());
    (held && sender != ours).then_some(sender)
}

/// ARP probes for a link's IPv4 addresses, sent and listened for on one AF_PACKET socket made
/// inside the pod's netns and bound to the link.
pub struct Prober {
    socket: OwnedFd,
    to: libc::sockaddr_ll,
    mac: [u8; 6],
    addresses: Vec<Ipv4Addr>,
}

impl Prober {
    pub fn open(
        netns: &Netns,
        index: u32,
        mac: [u8; 6],
        addresses: Vec<Ipv4Addr>,
    ) -> Result<Prober> {
        let (socket, mut to) =
            raw_socket::packet_socket_on(netns, index, libc::SOCK_DGRAM, ETH_P_ARP)?;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&BROADCAST);
        Ok(Prober {
            socket,
            to,
            mac,
            addresses,
        })
    }

    /// One probe for each address.
    pub fn send(&self) -> Result<()> {
        for ip in &self.addresses {
            raw_socket::send_to(&self.socket, &probe(self.mac, *ip), &self.to)
                .map_err(|e| raw_socket::failed(&format!("send the ARP probe for {ip}"), e))?;
        }
        Ok(())
    }

    /// The addresses it probes for.
    pub fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.addresses.iter().copied()
    }

    /// The addresses another node has shown to hold since the last call, with its MAC.
    pub fn held(&self) -> Result<Vec<(Ipv4Addr, [u8; 6])>> {
        let heard = raw_socket::drain(&self.socket)
            .map_err(|e| raw_socket::failed("read ARP answers", e))?;
        Ok(heard
            .iter()
            .flat_map(|frame| {
                self.addresses.iter().filter_map(|ip| {
                    holder_of(&frame.payload, *ip, self.mac).map(|holder| (*ip, holder))
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcement_is_a_request_for_its_own_address() {
        let mac = [0x6e, 0x92, 0x1a, 0xb4, 0xfc, 0x34];
        let packet = announcement(mac, Ipv4Addr::new(10, 161, 75, 155));
        assert_eq!(&packet[0..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&packet[8..14], &mac);
        assert_eq!(&packet[14..18], &[10, 161, 75, 155]);
        assert_eq!(&packet[18..24], &[0; 6]);
        assert_eq!(&packet[24..28], &[10, 161, 75, 155]);
    }

    #[test]
    fn a_probe_has_no_sender_address_and_finds_the_holder() {
        let ours = [0x6e, 0x92, 0x1a, 0xb4, 0xfc, 0x34];
        let theirs = [0x02, 0, 0, 0, 0, 9];
        let ip = Ipv4Addr::new(10, 161, 75, 155);
        let packet = probe(ours, ip);
        assert_eq!(&packet[14..18], &[0; 4]);
        assert_eq!(&packet[24..28], &ip.octets());
        // Our own probe, looped back, is no holder; another node's probe is.
        assert_eq!(holder_of(&packet, ip, ours), None);
        assert_eq!(holder_of(&probe(theirs, ip), ip, ours), Some(theirs));
        // A reply from the holder: sender IP the address, op 2.
        let mut reply = announcement(theirs, ip);
        reply[7] = 2;
        assert_eq!(holder_of(&reply, ip, ours), Some(theirs));
        // Somebody else's business.
        let other = announcement(theirs, Ipv4Addr::new(10, 161, 75, 1));
        assert_eq!(holder_of(&other, ip, ours), None);
    }
}
