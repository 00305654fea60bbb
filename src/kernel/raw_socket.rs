//! The two system calls the neighbour announcements share (`arp`, `ndisc`): a socket of a
//! raw kind, and one datagram sent to a socket address of any family.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::libc;

use crate::error::{GuardError, Kind};

/// `socket(domain, kind | SOCK_CLOEXEC, protocol)`.
pub fn open(domain: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; a non-negative result is a fresh descriptor we own.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `packet` to `to`, a `sockaddr_*` of the socket's family.
pub fn send_to<Address>(socket: &OwnedFd, packet: &[u8], to: &Address) -> io::Result<()> {
    // SAFETY: the buffer and address pointers are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (to as *const Address).cast(),
            std::mem::size_of::<Address>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn failed(action: &str, err: io::Error) -> GuardError {
    GuardError::new(Kind::Netlink, format!("cannot {action}: {err}")).with_source(err)
}

/// An AF_PACKET socket of `kind` for `protocol` (an EtherType), made inside `netns` and
/// bound to its link #`index`, so that it hears that link's frames of that protocol only.
pub fn packet_socket_on(
    netns: &super::netns::Netns,
    index: u32,
    kind: i32,
    protocol: u16,
) -> crate::error::Result<(OwnedFd, libc::sockaddr_ll)> {
    let socket = super::netns::inside(netns, || {
        open(libc::AF_PACKET, kind, i32::from(protocol.to_be()))
            .map_err(|e| failed("open an AF_PACKET socket", e))
    })?;
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value that is filled in below.
    let mut link: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    link.sll_family = libc::AF_PACKET as u16;
    link.sll_protocol = protocol.to_be();
    link.sll_ifindex = i32::try_from(index)
        .map_err(|_| failed("address link", io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: the address pointer is valid for the length passed.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&raw const link).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(failed(
            &format!("bind an AF_PACKET socket to link #{index}"),
            io::Error::last_os_error(),
        ));
    }
    Ok((socket, link))
}

/// Has the link of an AF_PACKET socket pass up frames sent to the multicast `mac`, as a
/// joined group's would be: what another node's probe is addressed to.
pub fn join_multicast(socket: &OwnedFd, index: u32, mac: [u8; 6]) -> io::Result<()> {
    // SAFETY: packet_mreq is plain old data; all-zero is a valid value that is filled in below.
    let mut request: libc::packet_mreq = unsafe { std::mem::zeroed() };
    request.mr_ifindex =
        i32::try_from(index).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    request.mr_type = libc::PACKET_MR_MULTICAST as u16;
    request.mr_alen = 6;
    request.mr_address[..6].copy_from_slice(&mac);
    // SAFETY: the request pointer is valid for the length passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            (&raw const request).cast(),
            std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A frame an AF_PACKET socket heard from another node: its payload and the sender's MAC.
pub struct Heard {
    pub payload: Vec<u8>,
    pub from: [u8; 6],
}

/// The frames waiting on an AF_PACKET socket, without waiting for more; those the host sent
/// itself are left out.
pub fn drain(socket: &OwnedFd) -> io::Result<Vec<Heard>> {
    let mut heard = Vec::new();
    let mut buffer = [0u8; 1500];
    loop {
        // SAFETY: sockaddr_ll is plain old data; the kernel fills it in.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: the buffer and address pointers are valid for the lengths passed.
        let got = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_DONTWAIT,
                (&raw mut from).cast(),
                &raw mut from_len,
            )
        };
        if got < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(heard),
                io::ErrorKind::Interrupted => continue,
                _ => Err(err),
            };
        }
        if from.sll_pkttype == libc::PACKET_OUTGOING || from.sll_halen != 6 {
            continue;
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&from.sll_addr[..6]);
        heard.push(Heard {
            payload: buffer[..got as usize].to_vec(),
            from: mac,
        });
    }
}
