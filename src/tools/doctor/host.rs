//! Host facts the conflists depend on: the lower links of macvlan/ipvlan, from sysfs
//! (an enslaved master fails every macvlan ADD), and a route for the service CIDR, from the
//! kernel's main table (without it ClusterIPs are unreachable).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;

use ipnetwork::IpNetwork;

use super::conflists::LowerLink;
use super::finding::{Finding, Report, Severity};

const SYS_NET: &str = "/sys/class/net";
const IFF_UP: u32 = 0x1;
const IFF_SLAVE: u32 = 0x800;
const IFF_MASTER: u32 = 0x400;
/// Where boot scripts enslave links by hand (`ifenslave bond0 bond1 ...` in rc.local).
const BOOT_SCRIPTS: [&str; 3] = [
    "/etc/rc.local",
    "/etc/rc.d/rc.local",
    "/etc/network/interfaces",
];

pub fn check_lower_links(links: &[LowerLink], report: &mut Report) {
    // One finding per host link, naming every network that uses it.
    let mut by_master: BTreeMap<Option<String>, Vec<&LowerLink>> = BTreeMap::new();
    for link in links {
        by_master.entry(link.master.clone()).or_default().push(link);
    }
    for (master, users) in by_master {
        let plugin = users[0].plugin.as_str();
        let networks: Vec<String> = users
            .iter()
            .map(|l| format!("{} ({})", l.network, l.file.display()))
            .collect();
        let used_by = format!("used by {plugin} in {}", networks.join(", "));
        let name = match master {
            Some(name) => name,
            None => match default_route_device() {
                Some(name) => name,
                None => {
                    report.add(
                        Finding::new(
                            Severity::Error,
                            "lower-link",
                            format!("{plugin} without \"master\" will fail: it falls back to the default route's interface, and this node has no default route"),
                        )
                        .evidence(used_by)
                        .fix("set \"master\" in the conflist, or restore the default route"),
                    );
                    continue;
                }
            },
        };
        report.add(check_lower_link(plugin, &name, &used_by));
    }
}

fn check_lower_link(plugin: &str, name: &str, used_by: &str) -> Finding {
    let dir = Path::new(SYS_NET).join(name);
    if !dir.exists() {
        return Finding::new(
            Severity::Error,
            "lower-link",
            format!("{plugin} on {name} will fail: there is no link {name} on this node"),
        )
        .evidence(used_by.to_string())
        .evidence(format!("{} does not exist", dir.display()))
        .fix(format!(
            "create {name} (or fix its name in the conflist): `ip link show` lists the links"
        ));
    }
    let flags = read_trimmed(&dir.join("flags"))
        .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    let flag_text = format!("{name} flags {flags:#x}: {}", flag_names(flags));
    if let Some(upper) = link_name(&dir.join("master")) {
        let kind = upper_kind(&upper);
        let mut finding = Finding::new(
            Severity::Error,
            "lower-link",
            format!("{plugin} on {name} will fail with \"device or resource busy\": {name} is a slave of {upper} (a {kind})"),
        )
        .evidence(used_by.to_string())
        .evidence(format!("{}/master -> {upper} ({kind})", dir.display()))
        .evidence(flag_text)
        .evidence(format!(
            "a link enslaved to a {kind} already has the {kind}'s receive handler, and the kernel allows one per link: creating a {plugin} on it returns EBUSY"
        ));
        for line in boot_lines_naming(&upper, name) {
            finding = finding.evidence(line);
        }
        let fix = if kind == "bond" {
            format!(
                "take {name} out of {upper} (`ip link set {name} nomaster`) and fix what enslaved it at boot: an \
                 `ifenslave {upper} ... {name} ...` line lists {name} among {upper}'s slaves; give each bond its own \
                 line (`ifenslave {upper} <its NICs>`, `ifenslave {name} <its NICs>`)"
            )
        } else {
            format!(
                "take {name} out of {upper} (`ip link set {name} nomaster`), or put the {plugin} on a link that is no port of a {kind}"
            )
        };
        return finding.fix(fix);
    }
    if flags & IFF_UP == 0 {
        return Finding::new(
            Severity::Error,
            "lower-link",
            format!("{name}, the {plugin} lower link, is down: pods on it get no traffic"),
        )
        .evidence(used_by.to_string())
        .evidence(flag_text)
        .fix(format!(
            "`ip link set {name} up` and make it come up at boot"
        ));
    }
    let operstate = read_trimmed(&dir.join("operstate")).unwrap_or_default();
    if operstate == "down" || operstate == "lowerlayerdown" {
        return Finding::new(
            Severity::Warning,
            "lower-link",
            format!(
                "{name}, the {plugin} lower link, is up but has no carrier (operstate {operstate})"
            ),
        )
        .evidence(used_by.to_string())
        .fix(format!("check the cable or the switch port of {name}"));
    }
    Finding::new(
        Severity::Ok,
        "lower-link",
        format!(
            "{name} exists, is up (operstate {operstate}) and is no slave: {plugin} can use it"
        ),
    )
    .evidence(used_by.to_string())
}

fn upper_kind(upper: &str) -> &'static str {
    let dir = Path::new(SYS_NET).join(upper);
    if dir.join("bonding").exists() {
        "bond"
    } else if dir.join("bridge").exists() {
        "bridge"
    } else if read_trimmed(&dir.join("uevent"))
        .is_some_and(|u| u.lines().any(|l| l == "DEVTYPE=team"))
    {
        "team"
    } else {
        "master device"
    }
}

fn flag_names(flags: u32) -> String {
    let names: Vec<&str> = [(IFF_UP, "UP"), (IFF_MASTER, "MASTER"), (IFF_SLAVE, "SLAVE")]
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    if names.is_empty() {
        "not UP".to_string()
    } else {
        names.join(",")
    }
}

/// Boot-script lines that enslave by hand and name both links, e.g.
/// `/etc/rc.local:12: ifenslave bond0 bond1 enp661s0f0`.
fn boot_lines_naming(upper: &str, lower: &str) -> Vec<String> {
    BOOT_SCRIPTS
        .iter()
        .filter_map(|path| Some((path, std::fs::read_to_string(path).ok()?)))
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, line)| names_both(line, upper, lower))
                .map(|(n, line)| format!("{path}:{}: {}", n + 1, line.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn names_both(line: &str, upper: &str, lower: &str) -> bool {
    if line.trim_start().starts_with('#') {
        return false;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let enslaves = words
        .iter()
        .any(|w| w.ends_with("ifenslave") || *w == "master" || *w == "bond-slaves");
    enslaves && words.contains(&upper) && words.contains(&lower)
}

fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

// ---------------------------------------------------------------------------------------
// Routes

/// A route of the main table, as `ip route` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    dst: IpNetwork,
    gateway: Option<IpAddr>,
    /// None for a route without one (a reject route).
    device: Option<String>,
    reject: Option<&'static str>,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dst = if self.dst.prefix() == 0 {
            "default".to_string()
        } else {
            self.dst.to_string()
        };
        if let Some(kind) = self.reject {
            return write!(f, "{kind} {dst}");
        }
        let device = self.device.as_deref().unwrap_or("-");
        match self.gateway {
            Some(gw) => write!(f, "{dst} via {gw} dev {device}"),
            None => write!(f, "{dst} dev {device}"),
        }
    }
}

pub fn check_service_routes(service_cidrs: &[IpNetwork], report: &mut Report) {
    let routes = main_routes();
    for cidr in service_cidrs {
        report.add(check_service_route(*cidr, &routes));
    }
}

fn check_service_route(cidr: IpNetwork, routes: &[Route]) -> Finding {
    // The first address of the range is the `kubernetes` service, which calico-node and
    // every hostNetwork client of the API server dial.
    let probe = nth_address(cidr, 1);
    let covering = routes
        .iter()
        .filter(|r| r.dst.is_ipv4() == cidr.is_ipv4() && r.dst.contains(probe))
        .max_by_key(|r| r.dst.prefix());
    let default = routes
        .iter()
        .find(|r| r.dst.prefix() == 0 && r.dst.is_ipv4() == cidr.is_ipv4());
    match route_lookup(probe) {
        Ok(source) => {
            let mut finding = Finding::new(
                Severity::Ok,
                "service-route",
                format!(
                    "{probe} (service CIDR {cidr}) is routable from this host (source address {source})"
                ),
            );
            if let Some(route) = covering {
                finding = finding.evidence(format!("main table: {route}"));
            }
            finding
        }
        Err(e) => {
            let mut finding = Finding::new(
                Severity::Error,
                "service-route",
                format!("ClusterIP traffic such as {probe} is unreachable: this host has no route for the service CIDR {cidr}"),
            )
            .evidence(format!("connect() to {}: {e} (calico-node logs it as `dial tcp {}: connect: network is unreachable`)", SocketAddr::new(probe, 443), SocketAddr::new(probe, 443)))
            .evidence(match (default, covering) {
                (None, None) => "main table: no default route and no route covering the service CIDR".to_string(),
                (_, Some(route)) => format!("main table: {route}, yet the lookup fails (a reject route or a policy rule?)"),
                (Some(route), None) => format!("main table: {route}, yet the lookup fails"),
            })
            .evidence(
                "a connection the host opens is routed before kube-proxy's DNAT rewrites the ClusterIP to an endpoint: \
                 with no route at all the kernel refuses it first, although the DNAT rule is in place. calico-node and \
                 other hostNetwork clients then cannot reach the API server, sandboxes are re-created over and over and \
                 pods lose their IPs",
            );
            finding = finding.fix(format!(
                "restore the default route (an uplink whose DHCP lease failed leaves none: check `ip route` and the \
                 uplink's DHCP client), or route the service CIDR explicitly: `ip route add {cidr} via <gateway> dev \
                 <node interface>`; any route will do, the DNAT picks the real destination"
            ));
            finding
        }
    }
}

/// The kernel's own answer: connect() on a UDP socket runs the route lookup (all tables and
/// rules) and sends nothing. The source address it picks shows the route exists.
fn route_lookup(destination: IpAddr) -> io::Result<IpAddr> {
    let bind: SocketAddr = match destination {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(SocketAddr::new(destination, 443))?;
    Ok(socket.local_addr()?.ip())
}

fn nth_address(cidr: IpNetwork, n: u128) -> IpAddr {
    match cidr {
        IpNetwork::V4(net) => IpAddr::V4(Ipv4Addr::from(
            u32::from(net.network()).wrapping_add(n as u32),
        )),
        IpNetwork::V6(net) => IpAddr::V6(Ipv6Addr::from(u128::from(net.network()).wrapping_add(n))),
    }
}

fn default_route_device() -> Option<String> {
    main_routes()
        .into_iter()
        .find(|r| r.dst.prefix() == 0 && r.dst.is_ipv4() && r.reject.is_none())
        .and_then(|r| r.device)
}

/// The host's main table, from netlink. Read as root, as the doctor is run; a failed read
/// shows as no route, which the service-route finding then names.
fn main_routes() -> Vec<Route> {
    let routes = crate::kernel::netlink::main_routes_here().unwrap_or_else(|e| {
        eprintln!("sandbox-guard: cannot read the host's routes: {e}");
        Vec::new()
    });
    routes
        .into_iter()
        .map(|(route, device)| Route {
            dst: route.dst,
            gateway: route.gateway,
            device,
            reject: route.reject,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, gateway: Option<&str>) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            device: Some("eth0".into()),
            reject: None,
        }
    }

    #[test]
    fn routes_read_as_ip_route_prints_them() {
        assert_eq!(
            route("0.0.0.0/0", Some("192.0.2.1")).to_string(),
            "default via 192.0.2.1 dev eth0"
        );
        assert_eq!(
            route("192.0.2.0/24", None).to_string(),
            "192.0.2.0/24 dev eth0"
        );
        assert_eq!(route("fd00::/64", None).to_string(), "fd00::/64 dev eth0");
        assert_eq!(
            route("::/0", Some("fe80::1")).to_string(),
            "default via fe80::1 dev eth0"
        );
        let unreachable = Route {
            reject: Some("unreachable"),
            device: None,
            ..route("10.96.0.0/12", None)
        };
        assert_eq!(unreachable.to_string(), "unreachable 10.96.0.0/12");
    }

    #[test]
    fn the_main_table_is_read_from_the_kernel() {
        // Every netns has at least the loopback's routes in the local table, none in main
        // unless configured: reading must succeed either way.
        crate::kernel::netlink::main_routes_here().expect("a netlink route dump of this netns");
    }

    #[test]
    fn kubernetes_service_is_the_first_address() {
        assert_eq!(
            nth_address("10.96.0.0/12".parse().unwrap(), 1),
            "10.96.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            nth_address("fd00:10:96::/112".parse().unwrap(), 1),
            "fd00:10:96::1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn ifenslave_line_naming_both_bonds() {
        assert!(names_both(
            "ifenslave bond0 bond1 enp661s0f0 enp661s0f1",
            "bond0",
            "bond1"
        ));
        assert!(names_both("/sbin/ifenslave bond0 bond1", "bond0", "bond1"));
        assert!(!names_both("ifenslave bond0 enp661s0f0", "bond0", "bond1"));
        assert!(!names_both("# ifenslave bond0 bond1", "bond0", "bond1"));
    }
}
