//! Carrying a restore's plan out in the kernel, after looking at what is there.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::plan::{DAD_PATIENCE, Detection, PROBE_INTERVAL, PROBE_LISTEN, PROBES, Seen, Step};
use super::report::Outcome;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::{InterfaceFacts, LinkFacts};
use crate::kernel::netlink::{Dad, Kernel, LinkState, NewMacvlan, Side};
use crate::kernel::sysctl::{self, Family};
use crate::kernel::{arp, ndisc};
use crate::state::checkpoint::Checkpoint;

pub fn look(kernel: &Kernel, record: &Checkpoint) -> Result<Seen> {
    let present = kernel.link_with_addresses_and_routes(Side::Pod, &record.if_name)?;
    let facts = match &record.links {
        Some(LinkFacts::Observed(facts)) => Some(facts),
        _ => None,
    };
    let has_ipv6 = facts.is_some_and(|f| f.addresses.iter().any(|a| a.is_ipv6()));
    let detection = if has_ipv6 {
        detection(
            kernel,
            record,
            facts,
            present.as_ref().map(|(link, _, _)| link),
        )?
    } else {
        Detection::Kernel
    };
    let dad_failed = match (&present, facts) {
        (Some((link, _, _)), Some(facts)) if has_ipv6 => kernel
            .ipv6_dad_states(link.index)?
            .into_iter()
            .filter(|(ip, dad)| {
                *dad == Dad::Failed && facts.addresses.iter().any(|a| a.ip() == IpAddr::V6(*ip))
            })
            .map(|(ip, _)| ip)
            .collect(),
        _ => Vec::new(),
    };
    let new_link_defaults = match (&present, facts) {
        (
            None,
            Some(InterfaceFacts {
                settings: Some(_), ..
            }),
        ) => sysctl::defaults(kernel.pod_netns())?,
        _ => Vec::new(),
    };
    let interface_present = present.is_some();
    let addresses = present
        .map(|(_, addresses, _)| addresses)
        .unwrap_or_default();
    let Some(InterfaceFacts {
        parent: Some(parent),
        ..
    }) = facts
    else {
        return Ok(Seen {
            interface_present,
            addresses,
            dad_failed,
            detection,
            new_link_defaults,
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
        addresses,
        dad_failed,
        detection,
        new_link_defaults,
        parent: parent_now,
        vlan_lower,
    })
}

/// How the interface checks its IPv6 addresses: the present one by its own settings; one to
/// be made by those it will have, its netns's defaults with what ADD recorded written over.
fn detection(
    kernel: &Kernel,
    record: &Checkpoint,
    facts: Option<&InterfaceFacts>,
    present: Option<&LinkState>,
) -> Result<Detection> {
    let netns = kernel.pod_netns();
    let all_accept_dad = sysctl::read_conf(netns, Family::Ipv6, "all", "accept_dad")?;
    let value = |key: &str| -> Result<i32> {
        if let Some(link) = present {
            return match link
                .settings
                .iter()
                .find(|(f, k, _)| *f == Family::Ipv6 && *k == key)
            {
                Some((_, _, value)) => Ok(*value),
                None => sysctl::read_conf(netns, Family::Ipv6, &record.if_name, key),
            };
        }
        // The restore writes every recorded setting; one not recorded was the kernel's default.
        match facts.and_then(|f| f.settings.as_ref()) {
            Some(settings) => settings
                .get(Family::Ipv6, key)
                .or(sysctl::kernel_default(Family::Ipv6, key))
                .ok_or_else(|| {
                    GuardError::new(Kind::Netlink, format!("no default known for {key}"))
                }),
            None => sysctl::read_conf(netns, Family::Ipv6, "default", key),
        }
    };
    let noarp = present.is_some_and(|link| link.noarp);
    Ok(
        match sysctl::detection_off(
            all_accept_dad,
            value("accept_dad")?,
            value("dad_transmits")?,
            noarp,
        ) {
            None => Detection::Kernel,
            Some(why) if noarp => Detection::Nothing(why),
            Some(why) => Detection::Guard(why),
        },
    )
}

/// Runs the steps in order after those `done` already. Consecutive checks for a holder of
/// the pod's addresses run side by side (`check`). The first failure of any other step ends
/// this sandbox's restore; a check that fails does not, but what runs after it is only what
/// `Step::runs_after_a_failed_check` allows, and the sandbox is reported failed with the
/// steps that did take effect.
pub fn carry_out(kernel: &Kernel, mut done: Vec<Step>, steps: Vec<Step>) -> Outcome {
    let mut steps = steps.into_iter().peekable();
    let mut held: Vec<IpAddr> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    while let Some(step) = steps.next() {
        if step.is_check() {
            let mut checks = vec![step];
            while let Some(next) = steps.next_if(Step::is_check) {
                checks.push(next);
            }
            let found = check(kernel, &checks);
            held.extend(found.held);
            failures.extend(found.failures);
            done.extend(checks);
            continue;
        }
        if !failures.is_empty() && !step.runs_after_a_failed_check(&held) {
            continue;
        }
        if let Err(err) = apply(kernel, &step) {
            failures.push(format!("{step}: {}", err.msg));
            break;
        }
        done.push(step);
    }
    if failures.is_empty() {
        Outcome::Restored(done)
    } else {
        Outcome::Failed {
            done,
            error: failures.join("; "),
        }
    }
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
        Step::SetSysctl {
            name,
            family,
            key,
            value,
        } => sysctl::set_conf(kernel.pod_netns(), *family, name, key, *value),
        Step::SettingsNotRecorded { .. } | Step::NoAdvertisement { .. } => Ok(()),
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
        Step::ProbeArp { .. } | Step::ProbeNs { .. } | Step::AwaitDad { .. } => {
            let found = check(kernel, std::slice::from_ref(step));
            match found.failures.is_empty() {
                true => Ok(()),
                false => Err(GuardError::new(Kind::Netlink, found.failures.join("; "))),
            }
        }
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

/// What the checks of one sandbox found: the pod's addresses another node holds, and one
/// sentence per failed check.
#[derive(Default)]
struct Found {
    held: Vec<IpAddr>,
    failures: Vec<String>,
}

/// Runs `checks` (`Step::is_check`, all on one link) side by side: the ARP probes and the
/// guard's neighbour solicitations go out `PROBES` times `PROBE_INTERVAL` apart and their
/// answers are heard for `PROBE_LISTEN`, while the kernel's duplicate address detection is
/// polled every `DAD_POLL`; the checks end together, when the last one does.
fn check(kernel: &Kernel, checks: &[Step]) -> Found {
    let mut found = Found::default();
    let mut arp_probe = None;
    let mut ns_probe = None;
    let mut dad = None;
    for step in checks {
        let opened = match step {
            Step::ProbeArp { name, addresses } => {
                probe_link(kernel, name).and_then(|(index, mac)| {
                    arp_probe = Some((
                        step,
                        arp::Prober::open(kernel.pod_netns(), index, mac, addresses.clone())?,
                    ));
                    Ok(())
                })
            }
            Step::ProbeNs {
                name, addresses, ..
            } => probe_link(kernel, name).and_then(|(index, mac)| {
                ns_probe = Some((
                    step,
                    ndisc::Prober::open(kernel.pod_netns(), index, mac, addresses.clone())?,
                ));
                Ok(())
            }),
            Step::AwaitDad { name, addresses } => {
                dad = Some((step, name, addresses));
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(err) = opened {
            found.failures.push(format!("{step}: {}", err.msg));
        }
    }
    let started = Instant::now();
    let mut sent = 0;
    let mut holders: Vec<(IpAddr, [u8; 6], &Step)> = Vec::new();
    // Probes sent on a link without carrier reach nobody, and their silence would pass for
    // "nobody holds it": they start once it has carrier (`probes_from`), or not at all.
    let mut probes_from = None;
    loop {
        let probing = arp_probe.is_some() || ns_probe.is_some();
        if probing && probes_from.is_none() {
            let step = arp_probe
                .as_ref()
                .map(|(step, _)| *step)
                .or(ns_probe.as_ref().map(|(step, _)| *step));
            if let Some(Step::ProbeArp { name, .. } | Step::ProbeNs { name, .. }) = step {
                match pod_link(kernel, name) {
                    Ok(link) if link.carrier => probes_from = Some(Instant::now()),
                    Ok(_) if started.elapsed() < NO_CARRIER_PATIENCE => {}
                    outcome => {
                        let why = match outcome {
                            Err(err) => err.msg,
                            Ok(_) => format!(
                                "{name} has no carrier (its parent link has none: the NIC still negotiating, a cable or \
                                 switch port down), so probes would reach nobody and silence would prove nothing"
                            ),
                        };
                        for (step, addresses) in [
                            arp_probe.take().map(|(step, p)| {
                                (step, p.addresses().map(IpAddr::V4).collect::<Vec<_>>())
                            }),
                            ns_probe.take().map(|(step, p)| {
                                (step, p.addresses().map(IpAddr::V6).collect::<Vec<_>>())
                            }),
                        ]
                        .into_iter()
                        .flatten()
                        {
                            found.held.extend(addresses.iter().copied());
                            found.failures.push(format!(
                                "{step}: {why}; {} left off {name} and nothing announced. Run --restore again once \
                                 `ip -n <pod> link show {name}` shows LOWER_UP",
                                list_ips(&addresses)
                            ));
                        }
                    }
                }
            }
        }
        let probes_started = probes_from.map(|from: Instant| from.elapsed());
        if let Some(since) = probes_started
            && sent < PROBES
            && since >= PROBE_INTERVAL * sent
        {
            sent += 1;
            let sends = [
                arp_probe.as_ref().map(|(step, p)| (*step, p.send())),
                ns_probe.as_ref().map(|(step, p)| (*step, p.send())),
            ];
            for (step, sent) in sends.into_iter().flatten() {
                if let Err(err) = sent {
                    found.failures.push(format!("{step}: {}", err.msg));
                }
            }
        }
        if let Some((step, prober)) = &arp_probe {
            match prober.held() {
                Ok(heard) => holders.extend(
                    heard
                        .into_iter()
                        .map(|(ip, mac)| (IpAddr::V4(ip), mac, *step)),
                ),
                Err(err) => found.failures.push(format!("{step}: {}", err.msg)),
            }
        }
        if let Some((step, prober)) = &ns_probe {
            match prober.held() {
                Ok(heard) => holders.extend(
                    heard
                        .into_iter()
                        .map(|(ip, mac)| (IpAddr::V6(ip), mac, *step)),
                ),
                Err(err) => found.failures.push(format!("{step}: {}", err.msg)),
            }
        }
        if let Some((step, name, addresses)) = dad {
            match poll_dad(kernel, name, addresses, started) {
                Ok(false) => {}
                Ok(true) => dad = None,
                Err((taken, err)) => {
                    found.held.extend(taken.into_iter().map(IpAddr::V6));
                    found.failures.push(format!("{step}: {}", err.msg));
                    dad = None;
                }
            }
        }
        if dad.is_none() && (!probing || probes_started.is_some_and(|since| since >= PROBE_LISTEN))
        {
            break;
        }
        std::thread::sleep(DAD_POLL);
    }
    holders.sort_by_key(|(ip, _, _)| *ip);
    holders.dedup_by_key(|(ip, _, _)| *ip);
    for (ip, mac, step) in holders {
        let neigh = if ip.is_ipv4() {
            "ip neigh"
        } else {
            "ip -6 neigh"
        };
        let mac = mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        let name = match step {
            Step::ProbeArp { name, .. } | Step::ProbeNs { name, .. } => name.as_str(),
            _ => "",
        };
        found.held.push(ip);
        found.failures.push(format!(
            "{step}: {ip} is held by {mac}: another node on the link answers for it, so it was left off {name} \
             and none of the pod's addresses was announced. Find that node (`{neigh} show {ip}` on the router \
             names the MAC too) and stop it, then run --restore again, which probes anew; or re-create the pod \
             for a new address"
        ));
    }
    found
}

fn list_ips(addresses: &[IpAddr]) -> String {
    addresses
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The index and MAC of the pod's link `name`: what a probe is sent out of and from.
fn probe_link(kernel: &Kernel, name: &str) -> Result<(u32, [u8; 6])> {
    let link = pod_link(kernel, name)?;
    // The kernel's view, not the record's: what neighbours hear is the MAC in use.
    Ok((
        link.index,
        parse_mac(link.mac.as_deref().unwrap_or_default())?,
    ))
}

/// One look at duplicate address detection on the pod's link `name`, `started` ago: true
/// once every IPv6 address is usable, the restored `addresses` and the link-local one the
/// kernel made at link up alike (as the reference plugins wait at ADD); an error at once
/// when detection failed for one (the kernel keeps it, unused, as evidence: `dadfailed` in
/// `ip addr`), with the addresses that failed, and after `DAD_PATIENCE` when one is still
/// tentative.
fn poll_dad(
    kernel: &Kernel,
    name: &str,
    addresses: &[Ipv6Addr],
    started: Instant,
) -> std::result::Result<bool, (Vec<Ipv6Addr>, GuardError)> {
    let link = pod_link(kernel, name).map_err(|e| (Vec::new(), e))?;
    let states = kernel
        .ipv6_dad_states(link.index)
        .map_err(|e| (Vec::new(), e))?;
    let taken: Vec<Ipv6Addr> = states
        .iter()
        .filter(|(_, dad)| *dad == Dad::Failed)
        .map(|(ip, _)| *ip)
        .collect();
    if let Some(first) = taken.first() {
        return Err((
            taken.clone(),
            GuardError::new(
                Kind::Netlink,
                format!(
                    "it failed for {first}: another node on the link answers for it; the kernel keeps it as dadfailed, \
                     unused, and none of the pod's addresses was announced. Find that node (`ip -6 neigh show {first}` on the \
                     router names its MAC) and stop it, then run --restore again, which runs detection anew; or re-create \
                     the pod for a new address"
                ),
            ),
        ));
    }
    if let Some(missing) = addresses
        .iter()
        .find(|ip| !states.iter().any(|(have, _)| have == *ip))
    {
        return Err((
            Vec::new(),
            GuardError::new(
                Kind::Netlink,
                format!(
                    "address {missing} vanished from the interface during duplicate address detection"
                ),
            ),
        ));
    }
    let tentative: Vec<String> = states
        .iter()
        .filter(|(_, dad)| *dad == Dad::Tentative)
        .map(|(ip, _)| ip.to_string())
        .collect();
    if tentative.is_empty() {
        return Ok(true);
    }
    if !link.carrier && started.elapsed() >= NO_CARRIER_PATIENCE {
        return Err((
            Vec::new(),
            GuardError::new(
                Kind::Netlink,
                format!(
                    "{} still tentative: {name} has no carrier (its parent link has none: the NIC still negotiating, \
                     a cable or switch port down), and the kernel starts detection only once it has; the addresses \
                     become usable by themselves then (`ip -n <pod> link show {name}` shows LOWER_UP)",
                    tentative.join(", ")
                ),
            ),
        ));
    }
    if started.elapsed() >= DAD_PATIENCE {
        return Err((
            Vec::new(),
            GuardError::new(
                Kind::Netlink,
                format!(
                    "{} still tentative after {} s of duplicate address detection: it becomes usable once detection \
                     ends (the pod's dad_transmits and retrans_time_ms sysctls set how long); `ip -6 addr` in the pod shows when",
                    tentative.join(", "),
                    DAD_PATIENCE.as_secs()
                ),
            ),
        ));
    }
    Ok(false)
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
