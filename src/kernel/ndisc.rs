//! Unsolicited neighbour advertisements for a restored interface: IPv6's gratuitous ARP
//! (RFC 4861 7.2.6). Neighbours that still map the pod's address to a link-layer address
//! (the router first of all) take the one advertised, since the Override flag is set; the
//! kernel sends none itself unless `ndisc_notify` is on.
//!
//! A raw ICMPv6 socket made inside the pod's netns (`netns::inside`), bound to the address
//! it advertises: the kernel adds the IPv6 header and the checksum, and picks the multicast
//! MAC of ff02::1. Sent only once duplicate address detection has settled: advertising an
//! address another node holds, with Override, would take its traffic away.

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
}
