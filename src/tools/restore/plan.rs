//! The pure half of a restore: from the checkpoint's link facts and what is there now, the
//! steps that rebuild what is missing, each shown as the iproute2 command that does the same.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::kernel::link_facts::{InterfaceFacts, LinkFacts, RouteFacts};
use crate::kernel::netlink::LinkState;
use crate::kernel::sysctl::{self, Family};

/// One change to the kernel. `Display` writes it as the iproute2 command that does the same,
/// which is what an operator reading a dry run knows.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateVlan {
        name: String,
        lower: String,
        id: u16,
        mtu: u32,
    },
    SetHostLinkUp {
        name: String,
    },
    /// Created on `parent` directly inside the pod's netns, under its own name.
    CreateMacvlan {
        name: String,
        parent: String,
        mode: String,
        mac: String,
        mtu: u32,
    },
    /// A per-interface sysctl as ADD recorded it (`kernel::sysctl::RESTORED`), written before
    /// the link is up: `addr_gen_mode` decides its link-local, `accept_dad` its addresses' fate.
    SetSysctl {
        name: String,
        family: Family,
        key: String,
        value: i32,
    },
    /// A record of an earlier release, without the interface's settings: the rebuilt one
    /// has its netns's defaults. Changes nothing; the report says so.
    SettingsNotRecorded {
        name: String,
    },
    SetUp {
        name: String,
    },
    /// `disable_ipv6` 0 for the interface, before its first IPv6 address (`kernel::sysctl`).
    EnableIpv6 {
        name: String,
    },
    AddAddress {
        name: String,
        address: IpNetwork,
    },
    /// Taken off so that adding it again runs duplicate address detection anew: the kernel
    /// never retries detection for an address it marked `dadfailed`.
    DeleteAddress {
        name: String,
        address: IpNetwork,
    },
    AddRoute {
        name: String,
        route: RouteFacts,
    },
    Announce {
        name: String,
        addresses: Vec<Ipv4Addr>,
    },
    /// RFC 5227 probes, before the addresses are on the link: a node that answers, or probes
    /// for one of them itself, holds it. Runs beside the other checks (`Step::is_check`).
    ProbeArp {
        name: String,
        addresses: Vec<Ipv4Addr>,
    },
    /// The guard's own duplicate address detection, before the addresses are on the link,
    /// where the link does none (`why`): the probes the kernel would send.
    ProbeNs {
        name: String,
        addresses: Vec<Ipv6Addr>,
        why: String,
    },
    /// Waits, at most `DAD_PATIENCE`, until duplicate address detection has settled for each
    /// address: a tentative address neither answers nor sends, and a failed one belongs to
    /// another node.
    AwaitDad {
        name: String,
        addresses: Vec<Ipv6Addr>,
    },
    /// Unsolicited neighbour advertisements with the Override flag, IPv6's gratuitous ARP.
    Advertise {
        name: String,
        addresses: Vec<Ipv6Addr>,
    },
    /// Where the link does no neighbour discovery at all (NOARP): nothing to advertise.
    NoAdvertisement {
        name: String,
        addresses: Vec<Ipv6Addr>,
        why: String,
    },
}

/// How many probes the guard sends for each address (as RFC 5227's PROBE_NUM), how far
/// apart, and how long it listens for a holder after the first. Shorter than RFC 5227's 1-2 s
/// apart and 2 s of waiting so that the IPv4 probe fits inside IPv6's detection (1-2 s with
/// the kernel's defaults), which it runs beside: a node's restore is not made longer by it.
/// On a LAN a holder answers within milliseconds.
pub const PROBES: u32 = 3;
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
pub const PROBE_LISTEN: Duration = Duration::from_secs(1);

impl Step {
    /// A check for a holder of the pod's addresses: consecutive ones run side by side, and
    /// nothing is announced unless all passed.
    pub fn is_check(&self) -> bool {
        matches!(
            self,
            Step::ProbeArp { .. } | Step::ProbeNs { .. } | Step::AwaitDad { .. }
        )
    }

    /// Whether the step still runs after a check found some of the pod's addresses held
    /// elsewhere (`held`): the other addresses are added and routed, not announced.
    pub fn runs_after_a_failed_check(&self, held: &[IpAddr]) -> bool {
        match self {
            Step::AddAddress { address, .. } => !held.contains(&address.ip()),
            Step::AddRoute { route, .. } => {
                !held.iter().any(|ip| ip.is_ipv4() == route.dst.is_ipv4())
            }
            Step::Announce { .. } | Step::Advertise { .. } => false,
            _ => true,
        }
    }
}

/// Detection takes `dad_transmits` (1) probes `retrans_time` (1 s) apart after a random delay
/// of up to `rtr_solicit_delay` (1 s): 1-2 s with the kernel's defaults. The reference plugins
/// give it 10 s at ADD; so does a restore, past which the sandbox is reported failed.
pub const DAD_PATIENCE: Duration = Duration::from_secs(10);

fn list<T: ToString>(addresses: &[T]) -> String {
    addresses
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::CreateVlan {
                name,
                lower,
                id,
                mtu,
            } => write!(
                f,
                "ip link add link {lower} name {name} mtu {mtu} type vlan id {id}"
            ),
            Step::SetHostLinkUp { name } => write!(f, "ip link set {name} up"),
            Step::CreateMacvlan {
                name,
                parent,
                mode,
                mac,
                mtu,
            } => {
                write!(
                    f,
                    "ip link add link {parent} name {name} address {mac} mtu {mtu} netns <pod> type macvlan mode {mode}"
                )
            }
            Step::SetSysctl {
                name,
                family: Family::Ipv6,
                key,
                value,
            } if key == "addr_gen_mode" && sysctl::addr_gen_mode_name(*value).is_some() => write!(
                f,
                "ip -n <pod> link set {name} addrgenmode {}",
                sysctl::addr_gen_mode_name(*value).unwrap_or_default()
            ),
            Step::SetSysctl {
                name,
                family,
                key,
                value,
            } => write!(
                f,
                "ip netns exec <pod> sysctl -qw net/{}/conf/{name}/{key}={value}",
                family.dir()
            ),
            Step::SettingsNotRecorded { name } => write!(
                f,
                "# {name}'s net.ipv4.conf/net.ipv6.conf settings and addrgenmode: not recorded \
                 (a checkpoint of an earlier release), not restored: the netns's defaults apply"
            ),
            Step::SetUp { name } => write!(f, "ip -n <pod> link set {name} up"),
            Step::EnableIpv6 { name } => write!(
                f,
                "ip netns exec <pod> sysctl -qw net/ipv6/conf/{name}/disable_ipv6=0"
            ),
            Step::AddAddress {
                name,
                address: address @ IpNetwork::V4(_),
            } => write!(f, "ip -n <pod> addr add {address} dev {name}"),
            Step::AddAddress {
                name,
                address: address @ IpNetwork::V6(_),
            } => write!(f, "ip -n <pod> -6 addr add {address} dev {name}"),
            Step::DeleteAddress { name, address } => {
                write!(f, "ip -n <pod> -6 addr del {address} dev {name}")
            }
            Step::AddRoute { name, route } => {
                write!(f, "ip -n <pod> route add {}", route.dst)?;
                if let Some(gateway) = route.gateway {
                    write!(f, " via {gateway}")?;
                }
                write!(f, " dev {name}")?;
                if route.link_scope {
                    write!(f, " scope link")?;
                }
                if let Some(metric) = route.metric {
                    write!(f, " metric {metric}")?;
                }
                Ok(())
            }
            Step::Announce { name, addresses } => {
                let list: Vec<String> = addresses.iter().map(Ipv4Addr::to_string).collect();
                write!(f, "gratuitous ARP on {name} for {}", list.join(", "))
            }
            Step::ProbeArp { name, addresses } => write!(
                f,
                "ARP probes on {name} for {} (RFC 5227: from 0.0.0.0, {PROBES} over {} ms, answers heard for {} ms) \
                 before the address is added: a node that answers holds it",
                list(addresses),
                PROBE_INTERVAL.as_millis() * u128::from(PROBES - 1),
                PROBE_LISTEN.as_millis()
            ),
            Step::ProbeNs {
                name,
                addresses,
                why,
            } => write!(
                f,
                "neighbour solicitations for duplicate address detection on {name} for {} (from :: to the \
                 solicited-node group, {PROBES} over {} ms, answers heard for {} ms) before the address is added: {why}",
                list(addresses),
                PROBE_INTERVAL.as_millis() * u128::from(PROBES - 1),
                PROBE_LISTEN.as_millis()
            ),
            Step::NoAdvertisement {
                name,
                addresses,
                why,
            } => write!(
                f,
                "# no neighbour advertisement on {name} for {}: {why}",
                list(addresses)
            ),
            Step::AwaitDad { name, addresses } => {
                let list: Vec<String> = addresses.iter().map(Ipv6Addr::to_string).collect();
                write!(
                    f,
                    "wait for duplicate address detection of {} on {name}: until `ip -n <pod> -6 addr show dev {name} tentative` is empty \
                     (one also marked dadfailed never leaves it: another node holds it), at most {} s",
                    list.join(", "),
                    DAD_PATIENCE.as_secs()
                )
            }
            Step::Advertise { name, addresses } => {
                let list: Vec<String> = addresses.iter().map(Ipv6Addr::to_string).collect();
                write!(
                    f,
                    "unsolicited neighbour advertisement (override) on {name} for {}",
                    list.join(", ")
                )
            }
        }
    }
}

/// What was seen of one sandbox before deciding.
#[derive(Debug, Default)]
pub struct Seen {
    pub interface_present: bool,
    /// The present interface's addresses.
    pub addresses: Vec<IpNetwork>,
    /// Recorded IPv6 addresses the present interface holds as `dadfailed`.
    pub dad_failed: Vec<Ipv6Addr>,
    /// How the interface (the present one, or the one to be made) checks its IPv6 addresses.
    pub detection: Detection,
    /// What a link made in the pod's netns now starts with (its `conf/default`), of each of
    /// `sysctl::RESTORED`: the recorded settings that differ are written.
    pub new_link_defaults: Vec<(Family, &'static str, i32)>,
    /// The recorded parent, looked up by name on the host.
    pub parent: Option<LinkState>,
    /// The recorded parent's lower link, when the parent is a vlan and is missing.
    pub vlan_lower: Option<LinkState>,
}

/// Who finds out that another node holds one of the interface's IPv6 addresses.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Detection {
    /// The kernel's duplicate address detection: the addresses are added, then waited for.
    #[default]
    Kernel,
    /// The link does none (why): the guard probes before it adds them.
    Guard(String),
    /// The link does no neighbour discovery at all (why): nothing to probe or advertise.
    Nothing(String),
}

#[derive(Debug, PartialEq)]
pub enum Decision {
    Intact,
    NotRestorable(String),
    Rebuild(Vec<Step>),
}

/// The pure half of a restore: from the checkpoint's link facts and what is there now, the
/// steps that rebuild what is missing, or why nothing should be done.
pub fn plan(if_name: &str, links: Option<&LinkFacts>, seen: &Seen) -> Decision {
    if seen.interface_present {
        return match links {
            Some(LinkFacts::Observed(facts)) => match check_again(if_name, facts, seen) {
                Some(steps) => Decision::Rebuild(steps),
                None => Decision::Intact,
            },
            _ => Decision::Intact,
        };
    }
    let facts = match links {
        Some(LinkFacts::Observed(facts)) => facts,
        Some(LinkFacts::Unavailable { reason }) => {
            return Decision::NotRestorable(format!(
                "ADD could not record its link facts ({reason})"
            ));
        }
        None => {
            return Decision::NotRestorable(
                "its checkpoint predates link facts: re-create the pod".to_string(),
            );
        }
    };
    match facts.kind.as_deref() {
        Some("macvlan") => {}
        Some("veth") => return Decision::NotRestorable(
            "a veth's host end belongs to the primary plugin (a bridge port, calico's routes): \
                 re-create the pod so the primary sets both ends up"
                .to_string(),
        ),
        other => {
            return Decision::NotRestorable(format!(
                "restore rebuilds macvlan interfaces only; this one is {}",
                other.unwrap_or("a link without a driver kind")
            ));
        }
    }
    let (Some(parent), Some(mac), Some(mode)) = (&facts.parent, &facts.mac, &facts.macvlan_mode)
    else {
        return Decision::NotRestorable(
            "its link facts lack the parent link, the MAC or the macvlan mode".to_string(),
        );
    };
    let mut steps = Vec::new();
    match (&seen.parent, &parent.vlan) {
        (Some(present), _) => {
            if !present.up {
                steps.push(Step::SetHostLinkUp {
                    name: parent.name.clone(),
                });
            }
        }
        (None, Some(vlan)) => {
            let Some(lower) = &seen.vlan_lower else {
                return Decision::NotRestorable(format!(
                    "its parent {} and the parent's lower link {} are both missing: bring the NIC back \
                     (finish the driver upgrade) and run again",
                    parent.name, vlan.lower
                ));
            };
            if !lower.up {
                steps.push(Step::SetHostLinkUp {
                    name: lower.name.clone(),
                });
            }
            steps.push(Step::CreateVlan {
                name: parent.name.clone(),
                lower: vlan.lower.clone(),
                id: vlan.id,
                mtu: parent.mtu,
            });
            steps.push(Step::SetHostLinkUp {
                name: parent.name.clone(),
            });
        }
        (None, None) => {
            return Decision::NotRestorable(format!(
                "its parent link {} is missing and is not a vlan that could be re-created: bring it back \
                 (finish the driver upgrade) and run again",
                parent.name
            ));
        }
    }
    steps.extend(pod_steps(
        if_name,
        facts,
        parent.name.clone(),
        mac.clone(),
        mode.clone(),
        &seen.detection,
        &seen.new_link_defaults,
    ));
    Decision::Rebuild(steps)
}

fn pod_steps(
    if_name: &str,
    facts: &InterfaceFacts,
    parent: String,
    mac: String,
    mode: String,
    detection: &Detection,
    new_link_defaults: &[(Family, &'static str, i32)],
) -> Vec<Step> {
    let name = if_name.to_string();
    let mut steps = vec![Step::CreateMacvlan {
        name: name.clone(),
        parent,
        mode,
        mac,
        mtu: facts.mtu,
    }];
    match &facts.settings {
        Some(settings) => steps.extend(new_link_defaults.iter().filter_map(
            |&(family, key, netns_default)| {
                let value = settings
                    .get(family, key)
                    .or(sysctl::kernel_default(family, key))?;
                (value != netns_default).then(|| Step::SetSysctl {
                    name: name.clone(),
                    family,
                    key: key.to_string(),
                    value,
                })
            },
        )),
        None => steps.push(Step::SettingsNotRecorded { name: name.clone() }),
    }
    steps.push(Step::SetUp { name: name.clone() });
    if facts.addresses.iter().any(IpNetwork::is_ipv6) {
        steps.push(Step::EnableIpv6 { name: name.clone() });
    }
    steps.extend(checked_then_announced(
        &name,
        facts,
        &facts.addresses,
        &[],
        detection,
    ));
    steps
}

/// The addresses `to_add` (a rebuilt interface's, or those missing from a present one) and
/// `to_detect_again` (IPv6 addresses the kernel holds as `dadfailed`) checked for a holder
/// elsewhere, all side by side: IPv6 addresses the kernel detects are added first (they stay
/// tentative, neither answering nor sending, until it is done); IPv4 addresses, and IPv6
/// addresses the guard probes for itself, are added only after. Then every recorded route
/// (on-link ones first: routes through a gateway need the route to it) and, once every check
/// passed, the announcement of every recorded address. A sandbox with one address held
/// elsewhere announces none: its other addresses are added but not announced
/// (`Step::runs_after_a_failed_check`).
fn checked_then_announced(
    name: &str,
    facts: &InterfaceFacts,
    to_add: &[IpNetwork],
    to_detect_again: &[IpNetwork],
    detection: &Detection,
) -> Vec<Step> {
    let name = name.to_string();
    let (v4_to_add, v6_to_add): (Vec<IpNetwork>, Vec<IpNetwork>) =
        to_add.iter().partition(|a| a.is_ipv4());
    let kernel_detects = *detection == Detection::Kernel;
    let mut steps = Vec::new();
    for address in to_detect_again {
        steps.push(Step::DeleteAddress {
            name: name.clone(),
            address: *address,
        });
        steps.push(Step::AddAddress {
            name: name.clone(),
            address: *address,
        });
    }
    if kernel_detects {
        steps.extend(v6_to_add.iter().map(|address| Step::AddAddress {
            name: name.clone(),
            address: *address,
        }));
    }
    if !v4_to_add.is_empty() {
        steps.push(Step::ProbeArp {
            name: name.clone(),
            addresses: v4_to_add.iter().map(|a| ipv4(a.ip())).collect(),
        });
    }
    let detected: Vec<Ipv6Addr> = to_detect_again
        .iter()
        .chain(if kernel_detects { &v6_to_add[..] } else { &[] })
        .map(|a| ipv6(a.ip()))
        .collect();
    if !detected.is_empty() {
        steps.push(Step::AwaitDad {
            name: name.clone(),
            addresses: detected,
        });
    }
    if let (Detection::Guard(why), false) = (detection, v6_to_add.is_empty()) {
        steps.push(Step::ProbeNs {
            name: name.clone(),
            addresses: v6_to_add.iter().map(|a| ipv6(a.ip())).collect(),
            why: format!("{why}, so the guard probes as it would"),
        });
    }
    let added_after = v4_to_add.iter().chain(if kernel_detects {
        &[][..]
    } else {
        &v6_to_add[..]
    });
    steps.extend(added_after.map(|address| Step::AddAddress {
        name: name.clone(),
        address: *address,
    }));
    let (on_link, via_gateway): (Vec<&RouteFacts>, Vec<&RouteFacts>) =
        facts.routes.iter().partition(|r| r.gateway.is_none());
    steps.extend(
        on_link
            .into_iter()
            .chain(via_gateway)
            .map(|route| Step::AddRoute {
                name: name.clone(),
                route: route.clone(),
            }),
    );
    let (mut all_v4, mut all_v6) = (Vec::new(), Vec::new());
    for address in &facts.addresses {
        match address.ip() {
            IpAddr::V4(ip) => all_v4.push(ip),
            IpAddr::V6(ip) => all_v6.push(ip),
        }
    }
    if !all_v4.is_empty() {
        steps.push(Step::Announce {
            name: name.clone(),
            addresses: all_v4,
        });
    }
    if !all_v6.is_empty() {
        steps.push(match detection {
            Detection::Nothing(why) => Step::NoAdvertisement {
                name,
                addresses: all_v6,
                why: why.clone(),
            },
            _ => Step::Advertise {
                name,
                addresses: all_v6,
            },
        });
    }
    steps
}

fn ipv4(ip: IpAddr) -> Ipv4Addr {
    match ip {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    }
}

fn ipv6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(ip) => ip,
        IpAddr::V4(ip) => ip.to_ipv6_mapped(),
    }
}

/// For an interface that is back but lacks recorded addresses (a restore left them off
/// while another node held them) or holds recorded IPv6 addresses as `dadfailed` (the kernel
/// never runs detection again by itself): those checked again, and added where free, then
/// the pod's routes and, when every check passed, the announcement of all its addresses.
/// Where the holder is still there the check fails again and nothing is announced. None when
/// nothing recorded is missing or failed.
fn check_again(if_name: &str, facts: &InterfaceFacts, seen: &Seen) -> Option<Vec<Step>> {
    let missing: Vec<IpNetwork> = facts
        .addresses
        .iter()
        .copied()
        .filter(|a| !seen.addresses.iter().any(|have| have.ip() == a.ip()))
        .collect();
    let failed: Vec<IpNetwork> = facts
        .addresses
        .iter()
        .copied()
        .filter(|a| matches!(a.ip(), IpAddr::V6(ip) if seen.dad_failed.contains(&ip)))
        .collect();
    if missing.is_empty() && failed.is_empty() {
        return None;
    }
    Some(checked_then_announced(
        if_name,
        facts,
        &missing,
        &failed,
        &seen.detection,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::link_facts::{InterfaceSettings, ParentFacts, VlanFacts};

    fn link(name: &str, up: bool) -> LinkState {
        LinkState {
            index: 40,
            name: name.into(),
            kind: None,
            macvlan_mode: None,
            vlan_id: None,
            mtu: 1500,
            mac: None,
            parent_index: None,
            parent_elsewhere: false,
            up,
            carrier: true,
            noarp: false,
            settings: Vec::new(),
        }
    }

    /// The incident's pod: a macvlan on the vlan link bond4.3 (VLAN 3 on bond4).
    fn incident_facts() -> LinkFacts {
        LinkFacts::Observed(InterfaceFacts {
            name: "eth0".into(),
            kind: Some("macvlan".into()),
            macvlan_mode: Some("bridge".into()),
            mtu: 1500,
            mac: Some("6e:92:1a:b4:fc:34".into()),
            addresses: vec!["10.161.75.155/22".parse().unwrap()],
            routes: vec![
                RouteFacts {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gateway: Some("10.161.72.1".parse().unwrap()),
                    link_scope: false,
                    metric: None,
                },
                RouteFacts {
                    dst: "10.200.0.0/16".parse().unwrap(),
                    gateway: None,
                    link_scope: true,
                    metric: Some(5),
                },
            ],
            parent: Some(ParentFacts {
                name: "bond4.3".into(),
                index: 7,
                kind: Some("vlan".into()),
                mtu: 1500,
                vlan: Some(VlanFacts {
                    id: 3,
                    lower: "bond4".into(),
                }),
            }),
            settings: Some(InterfaceSettings {
                ipv4: [("arp_ignore".to_string(), 1)].into(),
                ipv6: [("addr_gen_mode".to_string(), 1)].into(),
            }),
        })
    }

    fn kernel_defaults() -> Vec<(Family, &'static str, i32)> {
        sysctl::RESTORED.to_vec()
    }

    fn texts(decision: Decision) -> Vec<String> {
        match decision {
            Decision::Rebuild(steps) => steps.iter().map(Step::to_string).collect(),
            other => panic!("expected a rebuild, got {other:?}"),
        }
    }

    const ARP_PROBE: &str = "ARP probes on eth0 for 10.161.75.155 (RFC 5227: from 0.0.0.0, 3 over 500 ms, \
         answers heard for 1000 ms) before the address is added: a node that answers holds it";
    const DAD_WAIT: &str = "wait for duplicate address detection of fd00:161::9b on eth0: until \
         `ip -n <pod> -6 addr show dev eth0 tentative` is empty \
         (one also marked dadfailed never leaves it: another node holds it), at most 10 s";

    /// What ends a dual-stack plan once every check passed.
    const DUAL_STACK_ROUTES_THEN_ANNOUNCEMENTS: [&str; 5] = [
        "ip -n <pod> route add 10.200.0.0/16 dev eth0 scope link metric 5",
        "ip -n <pod> route add 0.0.0.0/0 via 10.161.72.1 dev eth0",
        "ip -n <pod> route add ::/0 via fd00:161::1 dev eth0 metric 1024",
        "gratuitous ARP on eth0 for 10.161.75.155",
        "unsolicited neighbour advertisement (override) on eth0 for fd00:161::9b",
    ];

    fn dual_stack_facts() -> LinkFacts {
        let LinkFacts::Observed(mut facts) = incident_facts() else {
            unreachable!()
        };
        facts.addresses.push("fd00:161::9b/64".parse().unwrap());
        facts.routes.push(RouteFacts {
            dst: "::/0".parse().unwrap(),
            gateway: Some("fd00:161::1".parse().unwrap()),
            link_scope: false,
            metric: Some(1024),
        });
        LinkFacts::Observed(facts)
    }

    fn recorded_addresses(facts: &LinkFacts) -> Vec<IpNetwork> {
        match facts {
            LinkFacts::Observed(facts) => facts.addresses.clone(),
            LinkFacts::Unavailable { .. } => Vec::new(),
        }
    }

    #[test]
    fn a_present_interface_is_never_touched() {
        let seen = Seen {
            interface_present: true,
            addresses: recorded_addresses(&incident_facts()),
            ..Seen::default()
        };
        assert_eq!(
            plan("eth0", Some(&incident_facts()), &seen),
            Decision::Intact
        );
        // Even without facts: present means present.
        assert_eq!(plan("eth0", None, &seen), Decision::Intact);
    }

    #[test]
    fn a_lost_vlan_parent_is_recreated_on_its_lower_link() {
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: None,
            vlan_lower: Some(link("bond4", true)),
            ..Seen::default()
        };
        assert_eq!(
            texts(plan("eth0", Some(&incident_facts()), &seen)),
            [
                "ip link add link bond4 name bond4.3 mtu 1500 type vlan id 3",
                "ip link set bond4.3 up",
                "ip link add link bond4.3 name eth0 address 6e:92:1a:b4:fc:34 mtu 1500 netns <pod> type macvlan mode bridge",
                "ip netns exec <pod> sysctl -qw net/ipv4/conf/eth0/arp_ignore=1",
                "ip -n <pod> link set eth0 addrgenmode none",
                "ip -n <pod> link set eth0 up",
                ARP_PROBE,
                "ip -n <pod> addr add 10.161.75.155/22 dev eth0",
                "ip -n <pod> route add 10.200.0.0/16 dev eth0 scope link metric 5",
                "ip -n <pod> route add 0.0.0.0/0 via 10.161.72.1 dev eth0",
                "gratuitous ARP on eth0 for 10.161.75.155",
            ]
        );
    }

    #[test]
    fn ipv6_addresses_are_waited_for_beside_the_ipv4_probe_then_all_announced() {
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: Some(link("bond4.3", true)),
            vlan_lower: None,
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&dual_stack_facts()), &seen));
        assert_eq!(
            steps[1..],
            [
                "ip netns exec <pod> sysctl -qw net/ipv4/conf/eth0/arp_ignore=1",
                "ip -n <pod> link set eth0 addrgenmode none",
                "ip -n <pod> link set eth0 up",
                "ip netns exec <pod> sysctl -qw net/ipv6/conf/eth0/disable_ipv6=0",
                "ip -n <pod> -6 addr add fd00:161::9b/64 dev eth0",
                ARP_PROBE,
                DAD_WAIT,
                "ip -n <pod> addr add 10.161.75.155/22 dev eth0",
            ]
            .into_iter()
            .chain(DUAL_STACK_ROUTES_THEN_ANNOUNCEMENTS)
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn where_the_link_does_no_detection_the_guard_probes_before_adding() {
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: Some(link("bond4.3", true)),
            detection: Detection::Guard(
                "the link does no duplicate address detection (accept_dad 0)".into(),
            ),
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&dual_stack_facts()), &seen));
        assert_eq!(
            steps[4..],
            [
                "ip netns exec <pod> sysctl -qw net/ipv6/conf/eth0/disable_ipv6=0",
                ARP_PROBE,
                "neighbour solicitations for duplicate address detection on eth0 for fd00:161::9b (from :: to the \
                 solicited-node group, 3 over 500 ms, answers heard for 1000 ms) before the address is added: the link \
                 does no duplicate address detection (accept_dad 0), so the guard probes as it would",
                "ip -n <pod> addr add 10.161.75.155/22 dev eth0",
                "ip -n <pod> -6 addr add fd00:161::9b/64 dev eth0",
            ]
            .into_iter()
            .chain(DUAL_STACK_ROUTES_THEN_ANNOUNCEMENTS)
            .collect::<Vec<_>>()
        );
        let noarp = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: Some(link("bond4.3", true)),
            detection: Detection::Nothing(
                "the link is NOARP: it does no neighbour discovery".into(),
            ),
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&dual_stack_facts()), &noarp));
        assert_eq!(
            steps.last().unwrap(),
            "# no neighbour advertisement on eth0 for fd00:161::9b: the link is NOARP: it does no neighbour discovery"
        );
        assert!(
            !steps.iter().any(|s| s.contains("solicitation")),
            "{steps:?}"
        );
    }

    #[test]
    fn a_record_without_settings_says_they_are_not_restored() {
        let LinkFacts::Observed(mut facts) = incident_facts() else {
            unreachable!()
        };
        facts.settings = None;
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: Some(link("bond4.3", true)),
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&LinkFacts::Observed(facts)), &seen));
        assert!(steps[1].contains("not recorded"), "{steps:?}");
        assert!(steps[1].contains("not restored"), "{steps:?}");
        assert!(!steps.iter().any(|s| s.contains("sysctl")), "{steps:?}");
    }

    #[test]
    fn after_a_holder_is_found_nothing_is_announced_and_its_family_not_routed() {
        let held: Vec<IpAddr> = vec!["10.161.75.155".parse().unwrap()];
        let name = "eth0".to_string();
        let v4: IpNetwork = "10.161.75.155/22".parse().unwrap();
        let v6: IpNetwork = "fd00:161::9b/64".parse().unwrap();
        let route = |dst: &str| Step::AddRoute {
            name: name.clone(),
            route: RouteFacts {
                dst: dst.parse().unwrap(),
                gateway: None,
                link_scope: false,
                metric: None,
            },
        };
        let add = |address| Step::AddAddress {
            name: name.clone(),
            address,
        };
        assert!(!add(v4).runs_after_a_failed_check(&held));
        assert!(add(v6).runs_after_a_failed_check(&held));
        assert!(!route("0.0.0.0/0").runs_after_a_failed_check(&held));
        assert!(route("::/0").runs_after_a_failed_check(&held));
        let announce = Step::Announce {
            name: name.clone(),
            addresses: vec![],
        };
        let advertise = Step::Advertise {
            name: name.clone(),
            addresses: vec![],
        };
        assert!(!announce.runs_after_a_failed_check(&[]));
        assert!(!advertise.runs_after_a_failed_check(&[]));
    }

    #[test]
    fn a_present_interface_with_a_dadfailed_address_runs_detection_again() {
        let facts = dual_stack_facts();
        let intact = Seen {
            interface_present: true,
            addresses: recorded_addresses(&facts),
            ..Seen::default()
        };
        assert_eq!(plan("eth0", Some(&facts), &intact), Decision::Intact);
        let taken = Seen {
            interface_present: true,
            addresses: recorded_addresses(&facts),
            dad_failed: vec!["fd00:161::9b".parse().unwrap()],
            ..Seen::default()
        };
        assert_eq!(
            texts(plan("eth0", Some(&facts), &taken)),
            [
                "ip -n <pod> -6 addr del fd00:161::9b/64 dev eth0",
                "ip -n <pod> -6 addr add fd00:161::9b/64 dev eth0",
                DAD_WAIT,
            ]
            .into_iter()
            .chain(DUAL_STACK_ROUTES_THEN_ANNOUNCEMENTS)
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_present_interface_without_an_ipv4_address_a_holder_had_probes_again() {
        let facts = dual_stack_facts();
        let left_off = Seen {
            interface_present: true,
            addresses: vec!["fd00:161::9b/64".parse().unwrap()],
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&facts), &left_off));
        assert_eq!(steps[0], ARP_PROBE);
        assert_eq!(steps[1], "ip -n <pod> addr add 10.161.75.155/22 dev eth0");
        assert_eq!(
            steps.last().unwrap(),
            "unsolicited neighbour advertisement (override) on eth0 for fd00:161::9b"
        );
    }

    #[test]
    fn a_down_lower_link_is_brought_up_first() {
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: None,
            vlan_lower: Some(link("bond4", false)),
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&incident_facts()), &seen));
        assert_eq!(steps[0], "ip link set bond4 up");
        assert!(steps[1].starts_with("ip link add link bond4 name bond4.3"));
    }

    #[test]
    fn a_present_parent_is_reused() {
        let seen = Seen {
            interface_present: false,
            new_link_defaults: kernel_defaults(),
            parent: Some(link("bond4.3", true)),
            vlan_lower: None,
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&incident_facts()), &seen));
        assert!(
            steps[0].starts_with("ip link add link bond4.3 name eth0 address 6e:92:1a:b4:fc:34"),
            "{steps:?}"
        );
        assert!(!steps.iter().any(|s| s.contains("type vlan")));
    }

    #[test]
    fn what_cannot_be_rebuilt_says_why() {
        let lost_everything = Seen::default();
        let Decision::NotRestorable(why) = plan("eth0", Some(&incident_facts()), &lost_everything)
        else {
            panic!()
        };
        assert!(
            why.contains("bond4.3") && why.contains("bond4") && why.contains("driver"),
            "{why}"
        );

        let LinkFacts::Observed(mut veth) = incident_facts() else {
            unreachable!()
        };
        veth.kind = Some("veth".into());
        let Decision::NotRestorable(why) =
            plan("eth0", Some(&LinkFacts::Observed(veth)), &lost_everything)
        else {
            panic!()
        };
        assert!(why.contains("primary plugin"), "{why}");

        let unavailable = LinkFacts::Unavailable {
            reason: "cannot open netns /proc/1/ns/x".into(),
        };
        let Decision::NotRestorable(why) = plan("eth0", Some(&unavailable), &lost_everything)
        else {
            panic!()
        };
        assert!(why.contains("cannot open netns"), "{why}");
        assert!(matches!(
            plan("eth0", None, &lost_everything),
            Decision::NotRestorable(_)
        ));

        let LinkFacts::Observed(mut plain_parent) = incident_facts() else {
            unreachable!()
        };
        plain_parent.parent.as_mut().unwrap().vlan = None;
        let Decision::NotRestorable(why) = plan(
            "eth0",
            Some(&LinkFacts::Observed(plain_parent)),
            &lost_everything,
        ) else {
            panic!()
        };
        assert!(why.contains("not a vlan"), "{why}");
    }
}
