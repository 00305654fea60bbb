//! Carrying a restore's plan out in the kernel, after looking at what is there.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use super::plan::{DAD_PATIENCE, Seen, Step};
use super::report::Outcome;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::{InterfaceFacts, LinkFacts};
use crate::kernel::netlink::{Dad, Kernel, LinkState, NewMacvlan, Side};
use crate::kernel::{arp, ndisc, sysctl};
use crate::state::checkpoint::Checkpoint;

pub fn look(kernel: &Kernel, record: &Checkpoint) -> Result<Seen> {
    let interface = kernel.link_by_name(Side::Pod, &record.if_name)?;
    let interface_present = interface.is_some();
    let dad_failed = match (&interface, &record.links) {
        (Some(link), Some(LinkFacts::Observed(facts)))
            if facts.addresses.iter().any(|a| a.is_ipv6()) =>
        {
            kernel
                .ipv6_dad_states(link.index)?
                .into_iter()
                .filter(|(ip, dad)| {
                    *dad == Dad::Failed
                        && facts
                            .addresses
                            .iter()
                            .any(|a| a.ip() == std::net::IpAddr::V6(*ip))
                })
                .map(|(ip, _)| ip)
                .collect()
        }
        _ => Vec::new(),
    };
    let Some(LinkFacts::Observed(InterfaceFacts {
        parent: Some(parent),
        ..
    })) = &record.links
    else {
        return Ok(Seen {
            interface_present,
            dad_failed,
            ..Seen::default()
        });
    };
    let parent_now = kernel.link_by_name(Side::Host, &parent.name)?;
    let vlan_lower = match (&parent_now, &parent.vlan) {
        (None, Some(vlan)) => kernel.link_by_name(Side::Host, &vlan.lower)?,
        _ => None,
    };
    Ok(Seen {
        interface_present,
        dad_failed,
        parent: parent_now,
        vlan_lower,
    })
}

/// Runs the steps in order after those `done` already; the first failure ends this
/// sandbox's restore and is reported with the steps that did take effect.
pub fn carry_out(kernel: &Kernel, mut done: Vec<Step>, steps: Vec<Step>) -> Outcome {
    for step in steps {
        if let Err(err) = apply(kernel, &step) {
            return Outcome::Failed {
                done,
                error: format!("{step}: {}", err.msg),
            };
        }
        done.push(step);
    }
    Outcome::Restored(done)
}

fn apply(kernel: &Kernel, step: &Step) -> Result<()> {
    match step {
        Step::CreateVlan {
            name,
            lower,
            id,
            mtu,
        } => {
            let lower = host_link(kernel, lower)?;
            kernel.create_vlan(name, lower.index, *id, Some(*mtu))
        }
        Step::SetHostLinkUp { name } => kernel.set_up(Side::Host, name),
        Step::CreateMacvlan {
            name,
            parent,
            mode,
            mac,
            mtu,
        } => {
            let parent = host_link(kernel, parent)?;
            let mac = parse_mac(mac)?;
            kernel.create_macvlan_in_pod(&NewMacvlan {
                name,
                parent_index: parent.index,
                mode,
                mac: &mac,
                mtu: Some(*mtu),
            })
        }
        Step::SetUp { name } => kernel.set_up(Side::Pod, name),
        Step::EnableIpv6 { name } => sysctl::enable_ipv6(kernel.pod_netns(), name),
        Step::AddAddress { name, address } => {
            kernel.add_address(pod_link(kernel, name)?.index, *address)
        }
        Step::DeleteAddress { name, address } => {
            kernel.delete_address(pod_link(kernel, name)?.index, *address)
        }
        Step::AddRoute { name, route } => kernel.add_route(
            pod_link(kernel, name)?.index,
            route.dst,
            route.gateway,
            route.link_scope,
            route.metric,
        ),
        Step::Announce { name, addresses } => {
            let link = pod_link(kernel, name)?;
            let mac = parse_mac(link.mac.as_deref().unwrap_or_default())?;
            // The kernel's view, not the record's: what neighbours must learn is the MAC in use.
            arp::announce(kernel.pod_netns(), link.index, mac, addresses)
        }
        Step::AwaitDad { name, addresses } => await_dad(kernel, name, addresses),
        Step::Advertise { name, addresses } => {
            let link = pod_link(kernel, name)?;
            let mac = parse_mac(link.mac.as_deref().unwrap_or_default())?;
            let router = sysctl::ipv6_forwarding(kernel.pod_netns(), name)?;
            ndisc::advertise(kernel.pod_netns(), link.index, mac, router, addresses)
        }
    }
}

/// As the reference plugins' SettleAddresses; each poll is two small netlink requests.
const DAD_POLL: Duration = Duration::from_millis(50);
/// A fresh link without carrier (its parent's NIC still negotiating, a cable or switch port
/// down) keeps its IPv6 addresses tentative, whatever the DAD sysctls, until carrier comes:
/// past this the wait stops and names the link, rather than spend `DAD_PATIENCE` per sandbox.
const NO_CARRIER_PATIENCE: Duration = Duration::from_secs(3);

/// Returns once every IPv6 address of link #`index` is usable, the restored `addresses` and
/// the link-local one the kernel made at link up alike (as the reference plugins wait at
/// ADD); fails at once when detection failed for one (the kernel keeps it, unused, as
/// evidence: `dadfailed` in `ip addr`), and after `DAD_PATIENCE` when one is still tentative.
fn await_dad(kernel: &Kernel, name: &str, addresses: &[Ipv6Addr]) -> Result<()> {
    let started = Instant::now();
    loop {
        let link = pod_link(kernel, name)?;
        let states = kernel.ipv6_dad_states(link.index)?;
        if let Some((taken, _)) = states.iter().find(|(_, dad)| *dad == Dad::Failed) {
            return Err(GuardError::new(
                Kind::Netlink,
                format!(
                    "it failed for {taken}: another node on the link answers for it; the kernel keeps it as dadfailed, \
                     unused, and the pod's other addresses work. Find that node (`ip -6 neigh show {taken}` on the \
                     router names its MAC) and stop it, then run --restore again, which runs detection anew; or re-create \
                     the pod for a new address"
                ),
            ));
        }
        if let Some(missing) = addresses
            .iter()
            .find(|ip| !states.iter().any(|(have, _)| have == *ip))
        {
            return Err(GuardError::new(
                Kind::Netlink,
                format!(
                    "address {missing} vanished from the interface during duplicate address detection"
                ),
            ));
        }
        let tentative: Vec<String> = states
            .iter()
            .filter(|(_, dad)| *dad == Dad::Tentative)
            .map(|(ip, _)| ip.to_string())
            .collect();
        if tentative.is_empty() {
            return Ok(());
        }
        if !link.carrier && started.elapsed() >= NO_CARRIER_PATIENCE {
            return Err(GuardError::new(
                Kind::Netlink,
                format!(
                    "{} still tentative: {name} has no carrier (its parent link has none: the NIC still negotiating, \
                     a cable or switch port down), and the kernel starts detection only once it has; the addresses \
                     become usable by themselves then (`ip -n <pod> link show {name}` shows LOWER_UP)",
                    tentative.join(", ")
                ),
            ));
        }
        if started.elapsed() >= DAD_PATIENCE {
            return Err(GuardError::new(
                Kind::Netlink,
                format!(
                    "{} still tentative after {} s of duplicate address detection: it becomes usable once detection \
                     ends (the pod's dad_transmits and retrans_time_ms sysctls set how long); `ip -6 addr` in the pod shows when",
                    tentative.join(", "),
                    DAD_PATIENCE.as_secs()
                ),
            ));
        }
        std::thread::sleep(DAD_POLL);
    }
}

fn host_link(kernel: &Kernel, name: &str) -> Result<LinkState> {
    kernel
        .link_by_name(Side::Host, name)?
        .ok_or_else(|| GuardError::new(Kind::Netlink, format!("host link {name} is missing")))
}

fn pod_link(kernel: &Kernel, name: &str) -> Result<LinkState> {
    kernel.link_by_name(Side::Pod, name)?.ok_or_else(|| {
        GuardError::new(
            Kind::Netlink,
            format!("interface {name} is missing from the pod's netns"),
        )
    })
}

fn parse_mac(text: &str) -> Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = parts
            .next()
            .and_then(|part| u8::from_str_radix(part, 16).ok())
            .ok_or_else(|| {
                GuardError::new(Kind::Decode, format!("MAC {text:?} is not six hex bytes"))
            })?;
    }
    if parts.next().is_some() {
        return Err(GuardError::new(
            Kind::Decode,
            format!("MAC {text:?} is not six hex bytes"),
        ));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(
            parse_mac("6e:92:1a:b4:fc:34").unwrap(),
            [0x6e, 0x92, 0x1a, 0xb4, 0xfc, 0x34]
        );
        for bad in [
            "",
            "6e:92:1a:b4:fc",
            "6e:92:1a:b4:fc:34:00",
            "zz:92:1a:b4:fc:34",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}
