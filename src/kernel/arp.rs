//! Gratuitous ARP for a restored interface: neighbours (the gateway first of all) still map
//! the pod's IP to its MAC, but after the link vanished some may have dropped or aged the
//! entry; one broadcast re-teaches them before the pod's first packet needs an answer.
//!
//! The AF_PACKET socket is made inside the pod's netns (`netns::inside`): like the netlink
//! sockets, it belongs to the netns it was created in.

use std::io;
use std::net::Ipv4Addr;

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
}
