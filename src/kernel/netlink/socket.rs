//! One blocking rtnetlink socket: a request out, its answers in, nothing else.
//!
//! Requests go one at a time, so the answers to read are those the kernel sent with the
//! request's sequence number; anything else on the socket is passed over. The
//! kernel's bytes are checked before they are trusted: a length that does not fit, an answer
//! that does not parse or a message type that makes no sense is an error, never a panic. Of a
//! link's attributes only those the guard reads are parsed; the others are passed over.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_packet_core::{
    DecodeError, ErrorMessage, NLM_F_ACK, NLM_F_MULTIPART, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NlasIterator, ParseableParametrized,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkHeader, LinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

/// The largest datagram the kernel sends on a netlink socket: a dump fills at most 32 KiB a
/// datagram, and a single answer without VF details (never asked for) is far smaller. Only
/// the pages an answer fills are touched.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// Why a request failed.
#[derive(Debug)]
pub enum NlError {
    /// The kernel refused the request (NLMSG_ERROR with a non-zero code).
    Kernel(ErrorMessage),
    /// The socket itself failed.
    Io(io::Error),
    /// The answer could not be read or was not what the request calls for.
    Malformed(String),
}

impl fmt::Display for NlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NlError::Kernel(message) => write!(f, "{}", message.to_io()),
            NlError::Io(err) => write!(f, "{err}"),
            NlError::Malformed(text) => f.write_str(text),
        }
    }
}

pub struct RouteSocket {
    socket: Socket,
    sequence: Cell<u32>,
    buffer: RefCell<Vec<u8>>,
}

impl RouteSocket {
    /// Opens a socket in the calling thread's netns whose reads give up after `timeout`.
    pub fn open(timeout: Duration) -> io::Result<RouteSocket> {
        let socket = Socket::new(NETLINK_ROUTE)?;
        let timeout = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)?;
        Ok(RouteSocket {
            socket,
            sequence: Cell::new(0),
            buffer: RefCell::new(Vec::new()),
        })
    }

    pub fn raw_fd(&self) -> i32 {
        self.socket.as_raw_fd()
    }

    /// Sends `message` with `flags` and collects the inner messages of the answer: one for a
    /// plain GET, every part for a dump, none for a change acknowledged (NLM_F_ACK).
    pub fn request(
        &self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        let sequence = self.sequence.get().wrapping_add(1);
        self.sequence.set(sequence);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = sequence;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::from(message));
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        let kernel = SocketAddr::new(0, 0);
        loop {
            match self.socket.send_to(&bytes, &kernel, 0) {
                Ok(_) => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(NlError::Io(err)),
            }
        }

        let expecting_ack = flags & NLM_F_ACK != 0;
        let mut answers = Vec::new();
        let mut buffer = self.buffer.borrow_mut();
        if buffer.capacity() < RECEIVE_BUFFER {
            buffer.reserve_exact(RECEIVE_BUFFER);
        }
        loop {
            buffer.clear();
            let received = match self.socket.recv_from(&mut *buffer, nix::libc::MSG_TRUNC) {
                // Only the kernel (port 0) answers; another process may not speak for it.
                Ok((_, sender)) if sender.port_number() != 0 => continue,
                Ok((received, _)) => received,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    return Err(NlError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the kernel did not answer in time",
                    )));
                }
                Err(err) => return Err(NlError::Io(err)),
            };
            if received > buffer.len() {
                return Err(NlError::Malformed(format!(
                    "the kernel's answer of {received} bytes does not fit the {} bytes read",
                    buffer.len()
                )));
            }
            if let Answer::Complete =
                read_datagram(&buffer[..received], sequence, expecting_ack, &mut answers)?
            {
                return Ok(answers);
            }
        }
    }
}

enum Answer {
    Complete,
    MoreToCome,
}

/// Walks the messages of one datagram, keeping those that answer `sequence`.
fn read_datagram(
    mut datagram: &[u8],
    sequence: u32,
    expecting_ack: bool,
    answers: &mut Vec<RouteNetlinkMessage>,
) -> Result<Answer, NlError> {
    while !datagram.is_empty() {
        let header = NetlinkBuffer::new_checked(datagram)
            .map_err(|e| NlError::Malformed(format!("cannot read the kernel's answer: {e}")))?;
        // new_checked made sure that the length fits the datagram and covers a header.
        let length = header.length() as usize;
        let (own_sequence, multipart) = (
            header.sequence_number() == sequence,
            header.flags() & NLM_F_MULTIPART != 0,
        );
        let bytes = &datagram[..length];
        // Messages are aligned to 4 bytes; the last one may lack its padding.
        datagram = datagram
            .get(length.next_multiple_of(4)..)
            .unwrap_or_default();
        if !own_sequence {
            continue;
        }
        // A link's answer is parsed here, for the attributes the guard reads; any other by the
        // crate, whole.
        let parsed = if header.message_type() == nix::libc::RTM_NEWLINK {
            link_message(header.payload())
                .map(|link| NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)))
        } else {
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map(|message| message.payload)
        };
        let payload = match parsed {
            Ok(payload) => payload,
            // One part of a dump that this crate cannot parse is left out; the rest still tells.
            Err(_) if multipart => continue,
            Err(e) => {
                return Err(NlError::Malformed(format!(
                    "cannot parse the kernel's answer: {e}"
                )));
            }
        };
        match payload {
            NetlinkPayload::InnerMessage(inner) => {
                answers.push(inner);
                if !multipart && !expecting_ack {
                    return Ok(Answer::Complete);
                }
            }
            NetlinkPayload::Done(_) => return Ok(Answer::Complete),
            NetlinkPayload::Error(error) if error.code.is_none() => return Ok(Answer::Complete),
            NetlinkPayload::Error(error) => return Err(NlError::Kernel(error)),
            other => {
                return Err(NlError::Malformed(format!(
                    "unexpected answer from the kernel (type {})",
                    other.message_type()
                )));
            }
        }
    }
    Ok(Answer::MoreToCome)
}

/// The size of a link message's own header (`struct ifinfomsg`), before its attributes.
const LINK_HEADER_LEN: usize = 16;

/// A link's answer with only the attributes the guard reads (`super::LINK_ATTRIBUTES_READ`)
/// parsed; the others are passed over unread, so one this crate cannot parse fails nothing.
pub(super) fn link_message(payload: &[u8]) -> Result<LinkMessage, DecodeError> {
    let header = LinkHeader::parse(payload)?;
    let family = header.interface_family;
    let mut link = LinkMessage::default();
    link.header = header;
    for attribute in NlasIterator::new(payload.get(LINK_HEADER_LEN..).unwrap_or_default()) {
        let attribute = attribute?;
        if super::LINK_ATTRIBUTES_READ.contains(&attribute.kind()) {
            link.attributes
                .push(LinkAttribute::parse_with_param(&attribute, family)?);
        }
    }
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{DoneMessage, NLM_F_REQUEST};
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    fn emitted(sequence: u32, flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = sequence;
        header.flags = flags;
        let mut message = NetlinkMessage::new(header, payload);
        message.finalize();
        let mut bytes = vec![0u8; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    fn link(name: &str) -> NetlinkPayload<RouteNetlinkMessage> {
        let mut message = LinkMessage::default();
        message.attributes.push(LinkAttribute::IfName(name.into()));
        NetlinkPayload::from(RouteNetlinkMessage::NewLink(message))
    }

    #[test]
    fn a_dump_is_complete_at_done_and_other_sequences_are_passed_over() {
        let mut datagram = emitted(6, NLM_F_MULTIPART, link("stale"));
        datagram.extend(emitted(7, NLM_F_MULTIPART, link("eth0")));
        datagram.extend(emitted(7, NLM_F_MULTIPART, link("eth1")));
        let mut answers = Vec::new();
        assert!(matches!(
            read_datagram(&datagram, 7, false, &mut answers),
            Ok(Answer::MoreToCome)
        ));
        let done = emitted(
            7,
            NLM_F_MULTIPART,
            NetlinkPayload::Done(DoneMessage::default()),
        );
        assert!(matches!(
            read_datagram(&done, 7, false, &mut answers),
            Ok(Answer::Complete)
        ));
        assert_eq!(answers.len(), 2);
    }

    #[test]
    fn a_link_answer_keeps_the_attributes_the_guard_reads_and_only_those() {
        use netlink_packet_core::Nla;
        use netlink_packet_route::link::{
            AfSpecInet, AfSpecUnspec, InetDevConf, InfoKind, LinkInfo, State,
        };
        let mut conf = InetDevConf::default();
        conf.forwarding = 1;
        let mut message = LinkMessage::default();
        message.header.index = 7;
        message.attributes = vec![
            LinkAttribute::Address(vec![2, 0, 0, 0, 0, 1]),
            LinkAttribute::IfName("eth0".into()),
            LinkAttribute::TxQueueLen(1000),
            LinkAttribute::Mtu(1450),
            LinkAttribute::OperState(State::Up),
            LinkAttribute::Link(12),
            LinkAttribute::Group(0),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth)]),
            LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::DevConf(conf)])]),
            LinkAttribute::LinkNetNsId(0),
            LinkAttribute::Promiscuity(0),
        ];
        let datagram = emitted(
            5,
            0,
            NetlinkPayload::from(RouteNetlinkMessage::NewLink(message.clone())),
        );
        let mut answers = Vec::new();
        assert!(matches!(
            read_datagram(&datagram, 5, false, &mut answers),
            Ok(Answer::Complete)
        ));
        let read: Vec<LinkAttribute> = message
            .attributes
            .iter()
            .filter(|a| super::super::LINK_ATTRIBUTES_READ.contains(&a.kind()))
            .cloned()
            .collect();
        assert_eq!(read.len(), super::super::LINK_ATTRIBUTES_READ.len());
        match &answers[..] {
            [RouteNetlinkMessage::NewLink(answer)] => {
                assert_eq!(answer.header, message.header);
                assert_eq!(answer.attributes, read);
            }
            other => panic!("one link expected, got {other:?}"),
        }
    }

    #[test]
    fn a_kernel_refusal_carries_its_errno() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-nix::libc::ENODEV);
        let datagram = emitted(1, 0, NetlinkPayload::Error(error));
        match read_datagram(&datagram, 1, false, &mut Vec::new()) {
            Err(NlError::Kernel(message)) => assert_eq!(message.raw_code(), -nix::libc::ENODEV),
            _ => panic!("a refusal must come back as NlError::Kernel"),
        }
    }

    #[test]
    fn garbage_from_the_kernel_is_an_error_not_a_panic() {
        let mut datagram = emitted(3, NLM_F_REQUEST, link("eth0"));
        for cut in 0..datagram.len() {
            let _ = read_datagram(&datagram[..cut], 3, false, &mut Vec::new());
        }
        // A length field larger than the datagram.
        datagram[0] = 0xff;
        assert!(matches!(
            read_datagram(&datagram, 3, false, &mut Vec::new()),
            Err(NlError::Malformed(_))
        ));
        // A length field smaller than a header.
        datagram[0] = 4;
        assert!(matches!(
            read_datagram(&datagram, 3, false, &mut Vec::new()),
            Err(NlError::Malformed(_))
        ));
    }
}
