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
    GuardError::new(Kind::Netlink, format!("cannot {action}: {err}"))
}
