//! The pure half of a restore: from the checkpoint's link facts and what is there now, the
//! steps that rebuild what is missing, each shown as the iproute2 command that does the same.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::kernel::link_facts::{InterfaceFacts, LinkFacts, RouteFacts};
use crate::kernel::netlink::LinkState;

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
}

/// Detection takes `dad_transmits` (1) probes `retrans_time` (1 s) apart after a random delay
/// of up to `rtr_solicit_delay` (1 s): 1-2 s with the kernel's defaults. The reference plugins
/// give it 10 s at ADD; so does a restore, past which the sandbox is reported failed.
pub const DAD_PATIENCE: Duration = Duration::from_secs(10);

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
    /// Recorded IPv6 addresses the present interface holds as `dadfailed`.
    pub dad_failed: Vec<Ipv6Addr>,
    /// The recorded parent, looked up by name on the host.
    pub parent: Option<LinkState>,
    /// The recorded parent's lower link, when the parent is a vlan and is missing.
    pub vlan_lower: Option<LinkState>,
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
            Some(LinkFacts::Observed(facts)) if !seen.dad_failed.is_empty() => {
                Decision::Rebuild(dad_again(if_name, facts, &seen.dad_failed))
            }
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
    ));
    Decision::Rebuild(steps)
}

fn pod_steps(
    if_name: &str,
    facts: &InterfaceFacts,
    parent: String,
    mac: String,
    mode: String,
) -> Vec<Step> {
    let name = if_name.to_string();
    let mut steps = vec![
        Step::CreateMacvlan {
            name: name.clone(),
            parent,
            mode,
            mac,
            mtu: facts.mtu,
        },
        Step::SetUp { name: name.clone() },
    ];
    if facts.addresses.iter().any(IpNetwork::is_ipv6) {
        steps.push(Step::EnableIpv6 { name: name.clone() });
    }
    steps.extend(facts.addresses.iter().map(|address| Step::AddAddress {
        name: name.clone(),
        address: *address,
    }));
    // Routes through a gateway need the route to the gateway first: on-link ones go first.
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
    let (mut ipv4, mut ipv6) = (Vec::new(), Vec::new());
    for address in &facts.addresses {
        match address.ip() {
            IpAddr::V4(ip) => ipv4.push(ip),
            IpAddr::V6(ip) => ipv6.push(ip),
        }
    }
    // IPv4 is announced before IPv6's wait: a conflict on the IPv6 address leaves it usable.
    if !ipv4.is_empty() {
        steps.push(Step::Announce {
            name: name.clone(),
            addresses: ipv4,
        });
    }
    if !ipv6.is_empty() {
        steps.push(Step::AwaitDad {
            name: name.clone(),
            addresses: ipv6.clone(),
        });
        steps.push(Step::Advertise {
            name,
            addresses: ipv6,
        });
    }
    steps
}

/// For an interface that is back but holds recorded IPv6 addresses as `dadfailed` (their
/// holder may have left since): each taken off and added again, so that detection runs once
/// more; then the same wait and advertisement as a rebuild's. Where the holder is still there
/// detection fails again and nothing is advertised.
fn dad_again(if_name: &str, facts: &InterfaceFacts, dad_failed: &[Ipv6Addr]) -> Vec<Step> {
    let name = if_name.to_string();
    let failed: Vec<IpNetwork> = facts
        .addresses
        .iter()
        .copied()
        .filter(|a| matches!(a.ip(), IpAddr::V6(ip) if dad_failed.contains(&ip)))
        .collect();
    let mut steps = Vec::new();
    for address in &failed {
        steps.push(Step::DeleteAddress {
            name: name.clone(),
            address: *address,
        });
        steps.push(Step::AddAddress {
            name: name.clone(),
            address: *address,
        });
    }
    let addresses: Vec<Ipv6Addr> = dad_failed.to_vec();
    steps.push(Step::AwaitDad {
        name: name.clone(),
        addresses: addresses.clone(),
    });
    steps.push(Step::Advertise { name, addresses });
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::link_facts::{ParentFacts, VlanFacts};

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
        })
    }

    fn texts(decision: Decision) -> Vec<String> {
        match decision {
            Decision::Rebuild(steps) => steps.iter().map(Step::to_string).collect(),
            other => panic!("expected a rebuild, got {other:?}"),
        }
    }

    #[test]
    fn a_present_interface_is_never_touched() {
        let seen = Seen {
            interface_present: true,
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
                "ip -n <pod> link set eth0 up",
                "ip -n <pod> addr add 10.161.75.155/22 dev eth0",
                "ip -n <pod> route add 10.200.0.0/16 dev eth0 scope link metric 5",
                "ip -n <pod> route add 0.0.0.0/0 via 10.161.72.1 dev eth0",
                "gratuitous ARP on eth0 for 10.161.75.155",
            ]
        );
    }

    #[test]
    fn ipv6_addresses_are_waited_for_then_advertised() {
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
        let seen = Seen {
            interface_present: false,
            parent: Some(link("bond4.3", true)),
            vlan_lower: None,
            ..Seen::default()
        };
        let steps = texts(plan("eth0", Some(&LinkFacts::Observed(facts)), &seen));
        assert_eq!(
            steps[2..],
            [
                "ip netns exec <pod> sysctl -qw net/ipv6/conf/eth0/disable_ipv6=0",
                "ip -n <pod> addr add 10.161.75.155/22 dev eth0",
                "ip -n <pod> -6 addr add fd00:161::9b/64 dev eth0",
                "ip -n <pod> route add 10.200.0.0/16 dev eth0 scope link metric 5",
                "ip -n <pod> route add 0.0.0.0/0 via 10.161.72.1 dev eth0",
                "ip -n <pod> route add ::/0 via fd00:161::1 dev eth0 metric 1024",
                "gratuitous ARP on eth0 for 10.161.75.155",
                "wait for duplicate address detection of fd00:161::9b on eth0: until \
                 `ip -n <pod> -6 addr show dev eth0 tentative` is empty \
                 (one also marked dadfailed never leaves it: another node holds it), at most 10 s",
                "unsolicited neighbour advertisement (override) on eth0 for fd00:161::9b",
            ]
        );
    }

    #[test]
    fn a_present_interface_with_a_dadfailed_address_runs_detection_again() {
        let LinkFacts::Observed(mut facts) = incident_facts() else {
            unreachable!()
        };
        facts.addresses.push("fd00:161::9b/64".parse().unwrap());
        let facts = LinkFacts::Observed(facts);
        let intact = Seen {
            interface_present: true,
            ..Seen::default()
        };
        assert_eq!(plan("eth0", Some(&facts), &intact), Decision::Intact);
        let taken = Seen {
            interface_present: true,
            dad_failed: vec!["fd00:161::9b".parse().unwrap()],
            ..Seen::default()
        };
        assert_eq!(
            texts(plan("eth0", Some(&facts), &taken)),
            [
                "ip -n <pod> -6 addr del fd00:161::9b/64 dev eth0",
                "ip -n <pod> -6 addr add fd00:161::9b/64 dev eth0",
                "wait for duplicate address detection of fd00:161::9b on eth0: until \
                 `ip -n <pod> -6 addr show dev eth0 tentative` is empty \
                 (one also marked dadfailed never leaves it: another node holds it), at most 10 s",
                "unsolicited neighbour advertisement (override) on eth0 for fd00:161::9b",
            ]
        );
    }

    #[test]
    fn a_down_lower_link_is_brought_up_first() {
        let seen = Seen {
            interface_present: false,
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
