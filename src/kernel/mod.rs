//! The kernel: the one way into a pod's network namespace, netlink reads and writes, the
//! link facts recorded at ADD, ARP announcements and IPv6 neighbour advertisements, and a stale sandbox's local teardown. Nothing here knows of CNI or the store.

pub mod arp;
pub mod link_facts;
pub mod ndisc;
pub mod netlink;
pub mod netns;
pub mod processes;
mod raw_socket;
pub mod sysctl;
pub mod teardown;
