//! `--restore`: bring back pod interfaces that vanished with their host parent (a NIC driver
//! reload takes the vlan link and every macvlan on it along), from the link facts recorded
//! at ADD, so that kubelet finds each sandbox with its IP and re-creates none.
//!
//! For each recorded sandbox: look (netns alive? interface there? parent there?), plan
//! (pure, `plan`), then carry the plan out. A sandbox whose interface is present is never
//! touched, so running it again is harmless; a failure stops only its own sandbox.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::{InterfaceFacts, LinkFacts, RouteFacts};
use crate::kernel::arp as garp;
use crate::kernel::netlink::{self, Kernel, LinkState, NewMacvlan, Side};
use crate::state::checkpoint::{AttachmentId, Checkpoint};
use crate::state::ownership::{Ownership, PodKey};
use crate::state::lock::WaitNotice;
use crate::state::{Folder, Loaded, Store, read_for_listing};

pub enum Selection {
    All,
    /// Prefixes, as people copy the short IDs crictl prints.
    ContainerIds(Vec<String>),
}

/// One change to the kernel. `Display` writes it as the iproute2 command that does the same,
/// which is what an operator reading a dry run knows.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateVlan { name: String, lower: String, id: u16, mtu: u32 },
    SetHostLinkUp { name: String },
    /// Created on `parent` directly inside the pod's netns, under its own name.
    CreateMacvlan { name: String, parent: String, mode: String, mac: String, mtu: u32 },
    SetUp { name: String },
    AddAddress { name: String, address: IpNetwork },
    AddRoute { name: String, route: RouteFacts },
    Announce { name: String, addresses: Vec<Ipv4Addr> },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::CreateVlan { name, lower, id, mtu } => write!(f, "ip link add link {lower} name {name} mtu {mtu} type vlan id {id}"),
            Step::SetHostLinkUp { name } => write!(f, "ip link set {name} up"),
            Step::CreateMacvlan { name, parent, mode, mac, mtu } => {
                write!(f, "ip link add link {parent} name {name} address {mac} mtu {mtu} netns <pod> type macvlan mode {mode}")
            }
            Step::SetUp { name } => write!(f, "ip -n <pod> link set {name} up"),
            Step::AddAddress { name, address } => write!(f, "ip -n <pod> addr add {address} dev {name}"),
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
        }
    }
}

/// What was seen of one sandbox before deciding.
#[derive(Debug, Default)]
pub struct Seen {
    pub interface_present: bool,
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
        return Decision::Intact;
    }
    let facts = match links {
        Some(LinkFacts::Observed(facts)) => facts,
        Some(LinkFacts::Unavailable { reason }) => {
            return Decision::NotRestorable(format!("ADD could not record its link facts ({reason})"));
        }
        None => return Decision::NotRestorable("its checkpoint predates link facts: re-create the pod".to_string()),
    };
    match facts.kind.as_deref() {
        Some("macvlan") => {}
        Some("veth") => {
            return Decision::NotRestorable(
                "a veth's host end belongs to the primary plugin (a bridge port, calico's routes): \
                 re-create the pod so the primary sets both ends up"
                    .to_string(),
            )
        }
        other => {
            return Decision::NotRestorable(format!(
                "restore rebuilds macvlan interfaces only; this one is {}",
                other.unwrap_or("a link without a driver kind")
            ))
        }
    }
    let (Some(parent), Some(mac), Some(mode)) = (&facts.parent, &facts.mac, &facts.macvlan_mode) else {
        return Decision::NotRestorable("its link facts lack the parent link, the MAC or the macvlan mode".to_string());
    };
    let mut steps = Vec::new();
    match (&seen.parent, &parent.vlan) {
        (Some(present), _) => {
            if !present.up {
                steps.push(Step::SetHostLinkUp { name: parent.name.clone() });
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
                steps.push(Step::SetHostLinkUp { name: lower.name.clone() });
            }
            steps.push(Step::CreateVlan { name: parent.name.clone(), lower: vlan.lower.clone(), id: vlan.id, mtu: parent.mtu });
            steps.push(Step::SetHostLinkUp { name: parent.name.clone() });
        }
        (None, None) => {
            return Decision::NotRestorable(format!(
                "its parent link {} is missing and is not a vlan that could be re-created: bring it back \
                 (finish the driver upgrade) and run again",
                parent.name
            ))
        }
    }
    steps.extend(pod_steps(if_name, facts, parent.name.clone(), mac.clone(), mode.clone()));
    Decision::Rebuild(steps)
}

fn pod_steps(if_name: &str, facts: &InterfaceFacts, parent: String, mac: String, mode: String) -> Vec<Step> {
    let name = if_name.to_string();
    let mut steps = vec![
        Step::CreateMacvlan { name: name.clone(), parent, mode, mac, mtu: facts.mtu },
        Step::SetUp { name: name.clone() },
    ];
    steps.extend(facts.addresses.iter().map(|address| Step::AddAddress { name: name.clone(), address: *address }));
    // Routes through a gateway need the route to the gateway first: on-link ones go first.
    let (on_link, via_gateway): (Vec<&RouteFacts>, Vec<&RouteFacts>) = facts.routes.iter().partition(|r| r.gateway.is_none());
    steps.extend(on_link.into_iter().chain(via_gateway).map(|route| Step::AddRoute { name: name.clone(), route: route.clone() }));
    let ipv4: Vec<Ipv4Addr> = facts
        .addresses
        .iter()
        .filter_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .collect();
    if !ipv4.is_empty() {
        steps.push(Step::Announce { name, addresses: ipv4 });
    }
    steps
}

/// How one sandbox ended.
enum Outcome {
    Intact,
    /// Another sandbox owns the pod key: the pod's address belongs there, not here.
    Superseded(String),
    NetnsGone(String),
    NotRestorable(String),
    Planned(Vec<Step>),
    Restored(Vec<Step>),
    Failed { done: Vec<Step>, error: String },
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Intact => "intact",
            Outcome::Superseded(_) => "superseded",
            Outcome::NetnsGone(_) => "netns-gone",
            Outcome::NotRestorable(_) => "NOT RESTORABLE",
            Outcome::Planned(_) => "would restore",
            Outcome::Restored(_) => "restored",
            Outcome::Failed { .. } => "FAILED",
        }
    }

    fn is_problem(&self) -> bool {
        matches!(self, Outcome::NotRestorable(_) | Outcome::Failed { .. })
    }
}

struct Row {
    container_id: String,
    if_name: String,
    network: String,
    netns: String,
    outcome: Outcome,
}

/// Returns the process exit status: 0 when every selected sandbox is intact, restored (or,
/// in a dry run, restorable) or dead anyway; 1 when one could not be restored.
pub fn run(state_dir: &Path, selection: &Selection, dry_run: bool, lock_timeout: Duration) -> i32 {
    let rows = match select(state_dir, selection, lock_timeout) {
        Ok(rows) => rows,
        Err(err) => {
            eprintln!("sandbox-guard: {err}");
            return 1;
        }
    };
    let rows: Vec<Row> = rows.into_iter().map(|selected| selected.and_then_restore(dry_run)).collect();
    let out = io::stdout();
    let written = write_report(&mut out.lock(), &rows, dry_run);
    if let Err(e) = written
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        eprintln!("sandbox-guard: cannot write the report: {e}");
    }
    i32::from(rows.iter().any(|row| row.outcome.is_problem()))
}

/// A selected checkpoint, or a selection that named something unusable.
enum Selected {
    Record(Box<Checkpoint>),
    Unusable(Row),
    Superseded(Row),
}

impl Selected {
    fn and_then_restore(self, dry_run: bool) -> Row {
        match self {
            Selected::Unusable(row) | Selected::Superseded(row) => row,
            Selected::Record(record) => Row {
                outcome: restore_one(&record, dry_run),
                container_id: record.container_id.clone(),
                if_name: record.if_name.clone(),
                network: record.network.clone(),
                netns: record.netns.clone(),
            },
        }
    }
}

fn select(state_dir: &Path, selection: &Selection, lock_timeout: Duration) -> Result<Vec<Selected>> {
    if std::fs::symlink_metadata(state_dir).is_err() {
        return Err(GuardError::new(
            Kind::Io,
            format!("no state directory at {}: pass --state-dir with the plugin's stateDir", state_dir.display()),
        ));
    }
    // Read under the shared lock, then let it go: the kernel work below may take seconds
    // and must not hold up the runtime's ADDs and DELs.
    let store = Store::open_read_only(state_dir)?;
    let notice = WaitNotice::new(state_dir, lock_timeout);
    let on_wait = |holder: &str| notice.hear(holder);
    let mut listed = store.read_in_batches(Folder::Records, lock_timeout, &on_wait, |p| Some(read_for_listing::<Checkpoint>(p)))?;
    // Sorted, so the report reads the same from run to run.
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let owners = store.read_in_batches(Folder::Owners, lock_timeout, &on_wait, |p| Some(read_for_listing::<Ownership>(p)))?;
    let owners: HashMap<PodKey, Ownership> = owners
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(owner) => Some((owner.key.clone(), owner)),
            _ => None,
        })
        .collect();
    let netns_of: HashMap<AttachmentId, String> = listed
        .iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(r) => Some((r.id(), r.netns.clone())),
            _ => None,
        })
        .collect();
    let wanted = |container_id: &str| match selection {
        Selection::All => true,
        Selection::ContainerIds(ids) => ids.iter().any(|id| container_id.starts_with(id.as_str())),
    };
    let mut selected = Vec::new();
    for (path, loaded) in listed {
        match loaded {
            Loaded::Valid(record) if wanted(&record.container_id) => match superseded_by(&record, &owners, &netns_of) {
                Some(why) => selected.push(Selected::Superseded(Row {
                    container_id: record.container_id.clone(),
                    if_name: record.if_name.clone(),
                    network: record.network.clone(),
                    netns: record.netns.clone(),
                    outcome: Outcome::Superseded(why),
                })),
                None => selected.push(Selected::Record(Box::new(record))),
            },
            Loaded::Corrupt { reason, .. } if unusable_is_wanted(&path, selection) => selected.push(Selected::Unusable(Row {
                container_id: file_name(&path),
                if_name: "-".into(),
                network: "-".into(),
                netns: "-".into(),
                outcome: Outcome::NotRestorable(format!("its checkpoint failed verification ({reason})")),
            })),
            _ => {}
        }
    }
    if let Selection::ContainerIds(ids) = selection {
        for id in ids {
            let matched = selected.iter().any(|s| match s {
                Selected::Record(record) => record.container_id.starts_with(id.as_str()),
                Selected::Unusable(row) | Selected::Superseded(row) => row.container_id.contains(id.as_str()),
            });
            if !matched {
                selected.push(Selected::Unusable(Row {
                    container_id: id.clone(),
                    if_name: "-".into(),
                    network: "-".into(),
                    netns: "-".into(),
                    outcome: Outcome::NotRestorable(format!("no checkpoint in {} for this container ID", state_dir.display())),
                }));
            }
        }
    }
    Ok(selected)
}

/// Why `record` must be left alone: another sandbox owns its pod key, so the pod's address
/// belongs there. Reviving this one would put it on the wire twice while the owner lives; and
/// when the owner's netns is gone or unknown, the pod's name is still not this sandbox's.
fn superseded_by(
    record: &Checkpoint,
    owners: &HashMap<PodKey, Ownership>,
    netns_of: &HashMap<AttachmentId, String>,
) -> Option<String> {
    let key = record.pod_key()?;
    let owner = owners.get(&key).filter(|o| o.container_id != record.container_id)?;
    let remove = format!("remove it instead (`crictl rmp {}`)", crate::names::short_id(&record.container_id));
    let owner_id = AttachmentId { network: key.network.clone(), container_id: owner.container_id.clone(), if_name: key.if_name.clone() };
    let owner_netns = netns_of.get(&owner_id);
    Some(match owner_netns {
        Some(netns) if crate::kernel::netns::netns_state(netns, None, None).is_alive() => format!(
            "pod {} now lives in sandbox {} (netns {netns}, alive): restoring this older sandbox would put its \
             address on the wire a second time; {remove}",
            key.pod(),
            owner.container_id
        ),
        _ => format!(
            "pod {} belongs to sandbox {}, not this one (the owner's netns is gone or unknown): an older \
             sandbox is not brought back; {remove}",
            key.pod(),
            owner.container_id
        ),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap_or_default().to_string_lossy().into_owned()
}

/// A corrupt file is named `<network>:<container>:<if>`: only its name can say whose it is.
fn unusable_is_wanted(path: &Path, selection: &Selection) -> bool {
    match selection {
        Selection::All => true,
        Selection::ContainerIds(ids) => {
            let container = AttachmentId::from_file_name(path).map(|id| id.container_id).unwrap_or_default();
            ids.iter().any(|id| container.starts_with(id.as_str()))
        }
    }
}

fn restore_one(record: &Checkpoint, dry_run: bool) -> Outcome {
    let netns = PathBuf::from(&record.netns);
    if record.netns.is_empty() {
        return Outcome::NotRestorable("the checkpoint names no netns".into());
    }
    let attempt = netlink::with_pod_netns(&netns, |kernel| {
        let seen = look(kernel, record)?;
        Ok(match plan(&record.if_name, record.links.as_ref(), &seen) {
            Decision::Intact => Outcome::Intact,
            Decision::NotRestorable(why) => Outcome::NotRestorable(why),
            Decision::Rebuild(steps) if dry_run => Outcome::Planned(steps),
            Decision::Rebuild(steps) => carry_out(kernel, steps),
        })
    });
    match attempt {
        Ok(outcome) => outcome,
        Err(err) if err.kind == Kind::NetnsGone => Outcome::NetnsGone(format!("{}: the sandbox is dead; nothing to restore", err.msg)),
        Err(err) => Outcome::Failed { done: Vec::new(), error: err.msg },
    }
}

fn look(kernel: &Kernel, record: &Checkpoint) -> Result<Seen> {
    let interface_present = kernel.link_by_name(Side::Pod, &record.if_name)?.is_some();
    let Some(LinkFacts::Observed(InterfaceFacts { parent: Some(parent), .. })) = &record.links else {
        return Ok(Seen { interface_present, ..Seen::default() });
    };
    let parent_now = kernel.link_by_name(Side::Host, &parent.name)?;
    let vlan_lower = match (&parent_now, &parent.vlan) {
        (None, Some(vlan)) => kernel.link_by_name(Side::Host, &vlan.lower)?,
        _ => None,
    };
    Ok(Seen { interface_present, parent: parent_now, vlan_lower })
}

/// Runs the steps in order; the first failure ends this sandbox's restore and is reported
/// with the steps that did take effect.
fn carry_out(kernel: &Kernel, steps: Vec<Step>) -> Outcome {
    let mut done = Vec::new();
    for step in steps {
        if let Err(err) = apply(kernel, &step) {
            return Outcome::Failed { done, error: format!("{step}: {}", err.msg) };
        }
        done.push(step);
    }
    Outcome::Restored(done)
}

fn apply(kernel: &Kernel, step: &Step) -> Result<()> {
    match step {
        Step::CreateVlan { name, lower, id, mtu } => {
            let lower = host_link(kernel, lower)?;
            kernel.create_vlan(name, lower.index, *id, Some(*mtu))
        }
        Step::SetHostLinkUp { name } => kernel.set_up(Side::Host, name),
        Step::CreateMacvlan { name, parent, mode, mac, mtu } => {
            let parent = host_link(kernel, parent)?;
            let mac = parse_mac(mac)?;
            kernel.create_macvlan_in_pod(&NewMacvlan { name, parent_index: parent.index, mode, mac: &mac, mtu: Some(*mtu) })
        }
        Step::SetUp { name } => kernel.set_up(Side::Pod, name),
        Step::AddAddress { name, address } => kernel.add_address(pod_link(kernel, name)?.index, *address),
        Step::AddRoute { name, route } => {
            kernel.add_route(pod_link(kernel, name)?.index, route.dst, route.gateway, route.link_scope, route.metric)
        }
        Step::Announce { name, addresses } => {
            let link = pod_link(kernel, name)?;
            let mac = parse_mac(link.mac.as_deref().unwrap_or_default())?;
            // The kernel's view, not the record's: what neighbours must learn is the MAC in use.
            garp::announce(link.index, mac, addresses)
        }
    }
}

fn host_link(kernel: &Kernel, name: &str) -> Result<LinkState> {
    kernel
        .link_by_name(Side::Host, name)?
        .ok_or_else(|| GuardError::new(Kind::Netlink, format!("host link {name} is missing")))
}

fn pod_link(kernel: &Kernel, name: &str) -> Result<LinkState> {
    kernel
        .link_by_name(Side::Pod, name)?
        .ok_or_else(|| GuardError::new(Kind::Netlink, format!("interface {name} is missing from the pod's netns")))
}

fn parse_mac(text: &str) -> Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = parts
            .next()
            .and_then(|part| u8::from_str_radix(part, 16).ok())
            .ok_or_else(|| GuardError::new(Kind::Decode, format!("MAC {text:?} is not six hex bytes")))?;
    }
    if parts.next().is_some() {
        return Err(GuardError::new(Kind::Decode, format!("MAC {text:?} is not six hex bytes")));
    }
    Ok(mac)
}

fn write_report(out: &mut impl Write, rows: &[Row], dry_run: bool) -> io::Result<()> {
    let mut lines = vec![["CONTAINER", "IF", "NETWORK", "NETNS", "RESULT"].map(String::from)];
    for row in rows {
        lines.push([
            row.container_id.chars().take(13).collect(),
            row.if_name.clone(),
            row.network.clone(),
            row.netns.clone(),
            row.outcome.word().to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..5).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    let mut detailed = false;
    for row in rows {
        let (heading, steps, note): (&str, &[Step], Option<&str>) = match &row.outcome {
            Outcome::Intact => continue,
            Outcome::NetnsGone(why) | Outcome::NotRestorable(why) | Outcome::Superseded(why) => ("", &[], Some(why)),
            Outcome::Planned(steps) => ("would run:", steps, None),
            Outcome::Restored(steps) => ("ran:", steps, None),
            Outcome::Failed { done, error } => ("ran before the failure:", done, Some(error)),
        };
        if !detailed {
            writeln!(out)?;
            detailed = true;
        }
        writeln!(out, "{} {} ({}): {}", row.container_id, row.if_name, row.network, row.outcome.word())?;
        if let Some(note) = note {
            writeln!(out, "  {note}")?;
        }
        if !steps.is_empty() {
            writeln!(out, "  {heading}")?;
            for step in steps {
                writeln!(out, "    {step}")?;
            }
        }
    }
    let count = |word: &str| rows.iter().filter(|r| r.outcome.word() == word).count();
    writeln!(
        out,
        "\n{} sandboxes: {} {}, {} intact (untouched), {} superseded (untouched), {} with their netns gone, {} not restorable, {} failed{}",
        rows.len(),
        count(if dry_run { "would restore" } else { "restored" }),
        if dry_run { "would be restored" } else { "restored" },
        count("intact"),
        count("superseded"),
        count("netns-gone"),
        count("NOT RESTORABLE"),
        count("FAILED"),
        if dry_run { " (dry run: nothing was changed)" } else { "" },
    )
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
                RouteFacts { dst: "0.0.0.0/0".parse().unwrap(), gateway: Some("10.161.72.1".parse().unwrap()), link_scope: false, metric: None },
                RouteFacts { dst: "10.200.0.0/16".parse().unwrap(), gateway: None, link_scope: true, metric: Some(5) },
            ],
            parent: Some(ParentFacts {
                name: "bond4.3".into(),
                index: 7,
                kind: Some("vlan".into()),
                mtu: 1500,
                vlan: Some(VlanFacts { id: 3, lower: "bond4".into() }),
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
        let seen = Seen { interface_present: true, ..Seen::default() };
        assert_eq!(plan("eth0", Some(&incident_facts()), &seen), Decision::Intact);
        // Even without facts: present means present.
        assert_eq!(plan("eth0", None, &seen), Decision::Intact);
    }

    #[test]
    fn a_lost_vlan_parent_is_recreated_on_its_lower_link() {
        let seen = Seen { interface_present: false, parent: None, vlan_lower: Some(link("bond4", true)) };
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
    fn a_down_lower_link_is_brought_up_first() {
        let seen = Seen { interface_present: false, parent: None, vlan_lower: Some(link("bond4", false)) };
        let steps = texts(plan("eth0", Some(&incident_facts()), &seen));
        assert_eq!(steps[0], "ip link set bond4 up");
        assert!(steps[1].starts_with("ip link add link bond4 name bond4.3"));
    }

    #[test]
    fn a_present_parent_is_reused() {
        let seen = Seen { interface_present: false, parent: Some(link("bond4.3", true)), vlan_lower: None };
        let steps = texts(plan("eth0", Some(&incident_facts()), &seen));
        assert!(steps[0].starts_with("ip link add link bond4.3 name eth0 address 6e:92:1a:b4:fc:34"), "{steps:?}");
        assert!(!steps.iter().any(|s| s.contains("type vlan")));
    }

    #[test]
    fn what_cannot_be_rebuilt_says_why() {
        let lost_everything = Seen::default();
        let Decision::NotRestorable(why) = plan("eth0", Some(&incident_facts()), &lost_everything) else { panic!() };
        assert!(why.contains("bond4.3") && why.contains("bond4") && why.contains("driver"), "{why}");

        let LinkFacts::Observed(mut veth) = incident_facts() else { unreachable!() };
        veth.kind = Some("veth".into());
        let Decision::NotRestorable(why) = plan("eth0", Some(&LinkFacts::Observed(veth)), &lost_everything) else { panic!() };
        assert!(why.contains("primary plugin"), "{why}");

        let unavailable = LinkFacts::Unavailable { reason: "cannot open netns /proc/1/ns/x".into() };
        let Decision::NotRestorable(why) = plan("eth0", Some(&unavailable), &lost_everything) else { panic!() };
        assert!(why.contains("cannot open netns"), "{why}");
        assert!(matches!(plan("eth0", None, &lost_everything), Decision::NotRestorable(_)));

        let LinkFacts::Observed(mut plain_parent) = incident_facts() else { unreachable!() };
        plain_parent.parent.as_mut().unwrap().vlan = None;
        let Decision::NotRestorable(why) = plan("eth0", Some(&LinkFacts::Observed(plain_parent)), &lost_everything) else { panic!() };
        assert!(why.contains("not a vlan"), "{why}");
    }

    #[test]
    fn an_older_sandbox_of_an_owned_pod_is_never_brought_back() {
        let record = |container: &str, netns: &str| Checkpoint {
            network: "net".into(),
            container_id: container.into(),
            if_name: "eth0".into(),
            pod_namespace: Some("db".into()),
            pod_name: Some("etcd-0".into()),
            pod_uid: None,
            infra_container_id: None,
            netns: netns.into(),
            cni_version: "1.0.0".into(),
            generation: 1,
            created_at: String::new(),
            updated_at: String::new(),
            prev_result: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            links: None,
        };
        let old = record("old", "/proc/self/ns/net");
        let key = old.pod_key().unwrap();
        let owner = Ownership { key: key.clone(), container_id: "new".into(), pod_uid: None, generation: 2 };
        let owners = HashMap::from([(key, owner)]);
        let new_id = AttachmentId { network: "net".into(), container_id: "new".into(), if_name: "eth0".into() };
        let alive = HashMap::from([(new_id.clone(), "/proc/self/ns/net".to_string())]);
        assert!(superseded_by(&old, &owners, &alive).unwrap().contains("alive"));
        // The owner's netns gone, or its record unknown: still not this sandbox's pod.
        let gone = HashMap::from([(new_id, "/nonexistent".to_string())]);
        assert!(superseded_by(&old, &owners, &gone).unwrap().contains("not brought back"));
        assert!(superseded_by(&old, &owners, &HashMap::new()).is_some());
        // Its own pod key: nothing in the way.
        assert!(superseded_by(&record("new", "/proc/self/ns/net"), &owners, &alive).is_none());
    }

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(parse_mac("6e:92:1a:b4:fc:34").unwrap(), [0x6e, 0x92, 0x1a, 0xb4, 0xfc, 0x34]);
        for bad in ["", "6e:92:1a:b4:fc", "6e:92:1a:b4:fc:34:00", "zz:92:1a:b4:fc:34"] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}
