//! The plugin's only way into the kernel's network state: rtnetlink over one socket in the
//! host's netns and one in a pod's, both used from the calling thread.
//!
//! Only ADD (link facts), CHECK, `--restore` and `--doctor` come here; VERSION, DEL, GC,
//! STATUS and the dump never open a socket, so they keep their start-up cost.
//!
//! A netlink socket answers for the netns it was opened in: the pod's is opened from inside
//! it (`super::netns::inside`), and then used from the host like the other.
//!
//! Plain blocking sockets (netlink-sys) carrying netlink-packet-route's messages, as netavark
//! does: the kernel builds an rtnetlink answer inside the calls themselves (the sendmsg() of
//! the request, the recvmsg() that drains a dump), so one request at a time waits for
//! nothing an event loop could overlap. It replaced rtnetlink on a tokio current-thread
//! runtime, which cost more time, RSS and binary: see docs/benchmarks.md.

mod read;
mod socket;
mod write;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ipnetwork::IpNetwork;

use super::netns::{self, Netns};
use super::sysctl::Family;
use crate::error::{GuardError, Kind, Result};

pub use read::{Side, main_routes_here};
pub use write::NewMacvlan;

use socket::{NlError, RouteSocket};

/// The link attributes `LinkState` is made of (`read::link_state`), by number: IFLA_ADDRESS,
/// IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_LINKINFO, IFLA_AF_SPEC and IFLA_LINK_NETNSID. Only
/// these are parsed out of a link's answer (`socket`): the kernel sends forty-odd more, which
/// every ADD would parse for nothing. An attribute `link_state` starts reading goes here too;
/// a test in `read` holds the two together.
const LINK_ATTRIBUTES_READ: [u16; 7] = [1, 3, 4, 5, 18, 26, 37];

/// A link as the kernel reports it, reduced to what the guard records and compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    /// `macvlan`, `veth`, `vlan`, ...; None for a link without a driver kind (a real NIC).
    pub kind: Option<String>,
    /// `bridge`, `private`, `vepa`, `passthru` or `source`, for a macvlan.
    pub macvlan_mode: Option<String>,
    /// The VLAN ID, for a vlan link.
    pub vlan_id: Option<u16>,
    pub mtu: u32,
    /// Lower-case `aa:bb:...`, as CNI results write it.
    pub mac: Option<String>,
    /// IFLA_LINK: the master of a macvlan or vlan, the peer of a veth.
    pub parent_index: Option<u32>,
    /// The parent lives in another netns (IFLA_LINK_NETNSID is set): for a pod's interface,
    /// the host's.
    pub parent_elsewhere: bool,
    pub up: bool,
    /// IFF_LOWER_UP: the link has carrier. A macvlan has it when its parent has.
    pub carrier: bool,
    /// IFF_NOARP: the link does no ARP nor IPv6 neighbour discovery.
    pub noarp: bool,
    /// Its values of `sysctl::RESTORED`, as the kernel reports them with the link.
    pub settings: Vec<(Family, &'static str, i32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Scope link: the destination is on the wire, no gateway.
    pub link_scope: bool,
    pub metric: Option<u32>,
    /// Added by the kernel itself (the connected route of an address, IPv6 link-local):
    /// it comes back with the address and must not be recorded as the pod's own.
    pub by_kernel: bool,
    pub main_table: bool,
    /// A multipath route: `gateway` and `oif` are its first next hop's. Never recorded as a
    /// pod's own route: it cannot be restored as one.
    pub multipath: bool,
    /// `unreachable`, `prohibit` or `blackhole`: a route that refuses its traffic.
    pub reject: Option<&'static str>,
}

/// Where duplicate address detection stands for an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dad {
    /// Usable: detection ended, or never ran (`nodad`, `accept_dad` 0).
    Settled,
    /// Detection runs: the address neither answers nor sends.
    Tentative,
    /// Another node answered for the address: the kernel will not use it.
    Failed,
}

/// How long a socket waits for each datagram of the kernel's answer; past it ADD records the
/// link facts as unavailable. It bounds an answer that never comes, not the kernel's own
/// wait for its routing lock (rtnl_lock) inside a request, which no timeout of ours can cut
/// short (a thread waiting there would hold the process back from exiting just the same).
/// ADD reads link facts before it takes the store's lock, so such a wait is one pod's.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// An open pair of netlink sockets: one in the host netns, one in a pod's.
pub struct Kernel {
    host: RouteSocket,
    pod: RouteSocket,
    /// Kept open: it names the pod's netns when a link is created straight into it.
    pod_netns: Netns,
}

/// Runs `job` with sockets in both the netns at `netns_path` and the host's.
pub fn with_pod_netns<T>(netns_path: &Path, job: impl FnOnce(&Kernel) -> Result<T>) -> Result<T> {
    with_open_netns(Netns::open(netns_path)?, job)
}

/// `with_pod_netns` for a namespace already open.
pub fn with_open_netns<T>(pod_netns: Netns, job: impl FnOnce(&Kernel) -> Result<T>) -> Result<T> {
    job(&Kernel::open(pod_netns)?)
}

impl Kernel {
    fn open(pod_netns: Netns) -> Result<Kernel> {
        let host = connect()?;
        let pod = netns::inside(&pod_netns, connect)?;
        Ok(Kernel {
            host,
            pod,
            pod_netns,
        })
    }

    fn socket(&self, side: Side) -> &RouteSocket {
        match side {
            Side::Host => &self.host,
            Side::Pod => &self.pod,
        }
    }

    fn pod_netns_fd(&self) -> i32 {
        self.pod_netns.raw_fd()
    }

    /// The cookie of the pod's netns, from the socket made in it.
    pub fn pod_netns_cookie(&self) -> Option<u64> {
        netns::socket_netns_cookie(self.pod.raw_fd())
    }

    /// The pod's netns, for other sockets that must be made inside it (ARP).
    pub fn pod_netns(&self) -> &Netns {
        &self.pod_netns
    }
}

fn connect() -> Result<RouteSocket> {
    netns::refuse_if_stranded()?;
    RouteSocket::open(ANSWER_TIMEOUT).map_err(|e| {
        GuardError::new(Kind::Netlink, format!("cannot open a netlink socket: {e}")).with_source(e)
    })
}

/// The errno of a kernel refusal, to tell "not there" and "busy" from real failures.
fn errno(err: &NlError) -> Option<i32> {
    match err {
        NlError::Kernel(message) => Some(message.raw_code().abs()),
        _ => None,
    }
}

fn failed(action: &str, err: NlError) -> GuardError {
    let text = match &err {
        NlError::Kernel(message) => message.to_io().to_string(),
        other => other.to_string(),
    };
    GuardError::new(Kind::Netlink, format!("cannot {action}: {text}"))
}
