//! The store against the node: namespaces that outlived their sandbox and still hold its
//! address (a force-deleted pod whose process hangs), addresses held twice, records whose DEL never came, interfaces gone
//! from live sandboxes. The store's own health is `store_health`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::finding::{Finding, Report, Severity, capped};
use super::store_health;
use crate::cni::result::ResultView;
use crate::kernel::netlink::{self, Side};
use crate::kernel::netns::{NetnsState, NetnsUsers, netns_inode, netns_state};
use crate::names::pod_text;
use crate::state::checkpoint::Checkpoint;
use crate::state::ip_index::{self, IpHolder};
use crate::state::lock::WaitNotice;
use crate::state::ownership::{Ownership, PodKey};
use crate::state::{Folder, Loaded, Store, read_entry_for_listing};

/// Every pod key's owner across the stores read, for judging the log's stale DELs.
pub type Owners = HashMap<PodKey, Ownership>;

/// A record whose namespace is still alive, with what identifies that namespace.
struct LiveRecord {
    record: Checkpoint,
    state: NetnsState,
    /// The namespace inode now, else the one recorded at ADD: two records with one identity
    /// are one namespace, not two pods sharing an address.
    identity: String,
    addresses: Vec<IpAddr>,
    /// A held DEL's interfaces, taken out on purpose (rule 7): gone from the namespace.
    taken_out: bool,
}

pub fn check(
    state_dir: &Path,
    users: &NetnsUsers,
    report: &mut Report,
    owners_seen: &mut Owners,
    lock_timeout: Duration,
    kubeconfigs: &[std::path::PathBuf],
) {
    let root_display = state_dir.display().to_string();
    store_health::check_journal(state_dir, report);
    if std::fs::symlink_metadata(state_dir).is_err() {
        report.add(Finding::new(
            Severity::Ok,
            "store",
            format!("no state dir at {root_display} yet: no pod has been added through sandbox-guard there"),
        ));
        return;
    }
    store_health::check_permissions(state_dir, report);
    let store = match Store::open_as_it_is(state_dir) {
        Ok(store) => store,
        Err(e) => {
            report.add(
                Finding::new(
                    Severity::Error,
                    "store",
                    format!("cannot open the store: {e}"),
                )
                .fix("run --doctor as root"),
            );
            return;
        }
    };
    // The lock is held for batches of the listing only: what follows enters namespaces and
    // scans /proc, and a large store must not hold its writers up.
    let notice = WaitNotice::new(state_dir, lock_timeout);
    let on_wait = |holder: &str| notice.hear(holder);
    let listed = (|| -> crate::error::Result<_> {
        let mut records = store.read_in_batches(Folder::Records, lock_timeout, &on_wait, |p| {
            Some(store.load_record_at(p))
        })?;
        let mut owners = store.read_in_batches(Folder::Owners, lock_timeout, &on_wait, |p| {
            let owner = read_entry_for_listing::<Ownership>(p);
            let backed = matches!(&owner, Loaded::Valid(o) if store.owner_is_backed(o));
            Some((owner, backed))
        })?;
        // Sorted, so the report reads the same from run to run.
        records.sort_by(|a, b| a.0.cmp(&b.0));
        owners.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((records, owners, store.list_set_aside()?))
    })();
    let (records, owners, set_aside) = match listed {
        Ok(listed) => listed,
        Err(e) => {
            report.add(Finding::new(
                Severity::Error,
                "store",
                format!("cannot read the store: {e}"),
            ));
            return;
        }
    };
    // An ended boot's ownership blocks nothing: `check_boot` reports those folders.
    let orphaned: Vec<Ownership> = owners
        .iter()
        .filter_map(|(_, (loaded, backed))| match loaded {
            Loaded::Valid(owner)
                if !backed && store.ended_with(owner.boot_id.as_deref()).is_none() =>
            {
                Some(owner.clone())
            }
            _ => None,
        })
        .collect();
    let owners: Owners = owners
        .into_iter()
        .filter_map(|(_, (loaded, _))| match loaded {
            Loaded::Valid(owner) => Some((owner.key.clone(), owner)),
            _ => None,
        })
        .collect();
    owners_seen.extend(owners.iter().map(|(k, v)| (k.clone(), v.clone())));
    let index = ip_index::list_entries(state_dir);

    store_health::check_untrusted(&root_display, &records, &set_aside, report);
    store_health::check_orphans(&root_display, &orphaned, report);
    store_health::check_temp_files(&root_display, &store, report);
    store_health::check_boot(state_dir, &store, report);
    store_health::check_deferred(&root_display, &store, kubeconfigs, report);
    store_health::check_pending_adds(state_dir, report);
    let valid: Vec<Checkpoint> = records
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(record) => Some(record),
            _ => None,
        })
        .map(|mut record| {
            // A hold ends with its boot: no verb judges by that record any more.
            if store.ended_with(record.boot_id.as_deref()).is_some() {
                record.held = None;
            }
            record
        })
        .collect();
    let held = held_dels(&valid);
    let live = check_namespaces(&root_display, valid, &index, users, &owners, report);
    check_held(&root_display, held, &live, report);
    check_shared_addresses(&root_display, &live, report);
    check_deleted_holders(&root_display, &store, &index, &live, users, report);
    check_interfaces(&root_display, &live, report);
}

fn check_namespaces(
    root: &str,
    records: Vec<Checkpoint>,
    index: &[(std::path::PathBuf, Option<IpHolder>)],
    users: &NetnsUsers,
    owners: &Owners,
    report: &mut Report,
) -> Vec<LiveRecord> {
    // The inode recorded at ADD, from the address index.
    let recorded_inode: HashMap<(String, String, String, String), u64> = index
        .iter()
        .filter_map(|(_, holder)| holder.as_ref())
        .filter_map(|h| {
            Some((
                (
                    h.network.clone(),
                    h.container_id.clone(),
                    h.if_name.clone(),
                    h.netns.clone(),
                ),
                h.netns_inode?,
            ))
        })
        .collect();
    let mut total = records.len();
    let mut gone = Vec::new();
    let mut live = Vec::new();
    for record in records {
        if record.netns.is_empty() {
            continue;
        }
        let key = (
            record.network.clone(),
            record.container_id.clone(),
            record.if_name.clone(),
            record.netns.clone(),
        );
        let inode = recorded_inode.get(&key).copied();
        let state = netns_state(&record.netns, inode, Some(users));
        // A held DEL did come (`held-by-api`): deleting its record would drop the hold.
        if state == NetnsState::Gone && record.held.is_some() {
            total -= 1;
            continue;
        }
        if state == NetnsState::Gone {
            gone.push(format!(
                "{}: sandbox {} of pod {} ({}), netns {} (added {})",
                record.network,
                record.container_id,
                pod_text(record.pod_namespace.as_deref(), record.pod_name.as_deref()),
                record.if_name,
                record.netns,
                record.created_at
            ));
            continue;
        }
        let identity = netns_inode(&record.netns)
            .or(inode)
            .map_or_else(|| record.netns.clone(), |i| format!("inode {i}"));
        // A held DEL's interface taken out on purpose holds no address. The removal can have
        // been skipped (no netns cookie, another boot's record), so the namespace is looked at.
        let taken_out = record.held.is_some() && {
            let names = recorded_interfaces(&record);
            let count = names.len();
            absent_interfaces(&netns_path(&record, &state), names)
                .is_ok_and(|absent| absent.len() == count)
        };
        let addresses = ResultView::parse(&record.prev_result)
            .ok()
            .filter(|_| !taken_out)
            .map(|v| v.ips.iter().map(|ip| ip.address.ip()).collect())
            .unwrap_or_default();
        live.push(LiveRecord {
            record,
            state,
            identity,
            addresses,
            taken_out,
        });
    }
    if gone.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "sandbox-netns",
            format!("{root}: every recorded namespace ({total}) still exists"),
        ));
    } else {
        let mut finding = Finding::new(
            Severity::Warning,
            "sandbox-netns",
            format!("{root}: {} records name a network namespace that is gone: their DEL never came", gone.len()),
        )
        .fix(
            "after a reboot or a runtime crash this is expected: a CNI 1.1 runtime's GC removes them; otherwise run \
             the DEL by hand or delete the record files once `crictl pods` no longer lists the sandboxes",
        );
        finding.evidence = capped(gone);
        report.add(finding);
    }
    for entry in &live {
        let record = &entry.record;
        let Some((key, owner)) = record
            .pod_keys()
            .into_iter()
            .find_map(|key| Some((key.clone(), owners.get(&key)?)))
        else {
            continue;
        };
        if owner.container_id == record.container_id || entry.taken_out {
            continue;
        }
        report.add(
            Finding::new(
                Severity::Warning,
                "superseded-netns",
                format!(
                    "sandbox {} of pod {} was superseded by sandbox {} (generation {}), but its namespace is alive: {} still in use there",
                    record.container_id,
                    key.pod(),
                    owner.container_id,
                    owner.generation,
                    address_list(&entry.addresses)
                ),
            )
            .evidence(describe_state(&record.netns, &entry.state, users))
            .fix(format!(
                "the runtime has not finished tearing it down: `crictl stopp {0}` and `crictl rmp {0}`; if its processes are \
                 stuck in D state, only they (or a reboot) free the address",
                crate::names::short_id(&record.container_id)
            )),
        );
    }
    live
}

fn check_shared_addresses(root: &str, live: &[LiveRecord], report: &mut Report) {
    let mut holders: BTreeMap<(String, IpAddr), Vec<&LiveRecord>> = BTreeMap::new();
    for entry in live {
        for address in &entry.addresses {
            holders
                .entry((entry.record.network.clone(), *address))
                .or_default()
                .push(entry);
        }
    }
    let mut clean = true;
    for ((network, address), entries) in holders {
        let mut identities: Vec<&str> = entries.iter().map(|e| e.identity.as_str()).collect();
        identities.sort();
        identities.dedup();
        if identities.len() < 2 {
            continue;
        }
        clean = false;
        let mut finding = Finding::new(
            Severity::Error,
            "ip-conflict",
            format!("{address} on network {network} is held by {} live sandboxes in different namespaces", entries.len()),
        )
        .fix("one of them got the address although the other still uses it (a force-deleted pod whose container lived on): remove the older sandbox, then restart the pod that lost traffic");
        for entry in entries {
            let r = &entry.record;
            finding = finding.evidence(format!(
                "sandbox {} of pod {} ({}), netns {} ({}), added {}",
                r.container_id,
                pod_text(r.pod_namespace.as_deref(), r.pod_name.as_deref()),
                r.if_name,
                r.netns,
                entry.identity,
                r.created_at
            ));
        }
        report.add(finding);
    }
    if clean {
        report.add(Finding::new(
            Severity::Ok,
            "ip-conflict",
            format!("{root}: no address is held by two live namespaces"),
        ));
    }
}

/// Index entries whose sandbox is gone from the store but whose namespace lives on: the
/// IPAM believes the address is free, and the next pod given it fails.
fn check_deleted_holders(
    root: &str,
    store: &Store,
    index: &[(std::path::PathBuf, Option<IpHolder>)],
    live: &[LiveRecord],
    users: &NetnsUsers,
    report: &mut Report,
) {
    let mut found = false;
    for holder in index.iter().filter_map(|(_, h)| h.as_ref()) {
        if !matches!(store.load_record(&holder.attachment()), Ok(Loaded::Missing)) {
            continue;
        }
        let state = netns_state(&holder.netns, holder.netns_inode, Some(users));
        if !state.is_alive() {
            continue;
        }
        found = true;
        let mut finding = Finding::new(
            Severity::Error,
            "deleted-netns",
            format!(
                "{} of deleted sandbox {} (pod {}, {}) is still in use: its network namespace outlived the sandbox",
                holder.address,
                holder.container_id,
                holder.pod(),
                holder.if_name
            ),
        )
        .evidence(describe_state(&holder.netns, &state, users))
        .evidence(format!("{} was given the address at {}; its record is gone from the store", holder.container_id, holder.since));
        for other in live
            .iter()
            .filter(|l| l.record.network == holder.network && l.addresses.contains(&holder.address))
        {
            finding = finding.evidence(format!(
                "sandbox {} of pod {} has the same address now: the two conflict",
                other.record.container_id,
                pod_text(
                    other.record.pod_namespace.as_deref(),
                    other.record.pod_name.as_deref()
                )
            ));
        }
        report.add(finding.fix(
            "the IPAM considers the address free and will hand it out again (\"address already in use\"): find the \
             container behind the processes above (`crictl ps -a`, `nsenter -t <pid> -n ip addr`) and remove it; a \
             process in D state leaves only a reboot. Until then set \"ipConflict\": \"refuse\" to stop the next ADD of \
             this address",
        ));
    }
    if !found {
        report.add(Finding::new(
            Severity::Ok,
            "deleted-netns",
            format!("{root}: no namespace of a deleted sandbox still holds an address"),
        ));
    }
}

/// A DEL rule 7 holds in chained mode: its sandbox's attachment, and what `held-by-api` says
/// of it.
struct HeldDel {
    container_id: String,
    if_name: String,
    netns: String,
    line: String,
}

fn held_dels(records: &[Checkpoint]) -> Vec<HeldDel> {
    records
        .iter()
        .filter_map(|record| {
            let moved = record.held.as_ref()?;
            Some(HeldDel {
                container_id: record.container_id.clone(),
                if_name: record.if_name.clone(),
                netns: record.netns.clone(),
                line: format!(
                    "sandbox {} of pod {}: its DEL is held for pod UID {} in the API server (kubeconfig {})",
                    record.container_id,
                    pod_text(record.pod_namespace.as_deref(), record.pod_name.as_deref()),
                    moved.pod_uid,
                    moved.kubeconfig.display()
                ),
            })
        })
        .collect()
}

/// Chained mode's DELs that rule 7 refuses while the API server shows the pod's name on
/// another pod, whether or not their namespace is still there: their interfaces taken out on
/// purpose where they could be (`live` says which are still there), their records holding the
/// refusal.
fn check_held(root: &str, dels: Vec<HeldDel>, live: &[LiveRecord], report: &mut Report) {
    let held: Vec<String> = dels
        .into_iter()
        .map(|del| {
            // The removal is skipped without a netns cookie or on an identity mismatch.
            let still_there = live.iter().any(|l| {
                l.record.container_id == del.container_id
                    && l.record.if_name == del.if_name
                    && !l.taken_out
            });
            match still_there {
                true => format!(
                    "{}; its interface is still in netns {} (its removal was skipped), so its address is in use there",
                    del.line, del.netns
                ),
                false => del.line,
            }
        })
        .collect();
    if held.is_empty() {
        return;
    }
    let mut finding = Finding::new(
        Severity::Warning,
        "held-by-api",
        format!(
            "{root}: {} sandboxes' DELs are refused because the API server shows their pod's name on another pod; \
             their interfaces are taken out on purpose where the guard could (any still there is named)",
            held.len()
        ),
    )
    .fix("each DEL passes once the API server answers that no other pod has the name (the StatefulSet scaled down, or \
          the pod deleted); without an API server, write {\"apiServerView\": \"off\"} over the kubeconfig named (a file \
          of root's, mode 0600), and the next retry goes by the local rule. Never `--restore` them. Delete a record's \
          files only once `crictl pods` no longer lists its sandbox (no DEL comes for it then): before, that drops the \
          hold");
    finding.evidence = capped(held);
    report.add(finding);
}

fn check_interfaces(root: &str, live: &[LiveRecord], report: &mut Report) {
    let mut missing = Vec::new();
    let mut unreadable = Vec::new();
    let mut held = 0;
    for entry in live {
        let record = &entry.record;
        // Chained mode took its interface out on purpose when the API server's pod of the
        // name moved (rule 7): `held-by-api` lists it.
        if record.held.is_some() {
            held += 1;
            continue;
        }
        if ResultView::parse(&record.prev_result).is_err() {
            continue;
        }
        let path = netns_path(record, &entry.state);
        match absent_interfaces(&path, recorded_interfaces(record)) {
            Ok(absent) if absent.is_empty() => {}
            Ok(absent) => missing.push(format!(
                "sandbox {} of pod {}: {} missing from netns {}",
                record.container_id,
                pod_text(record.pod_namespace.as_deref(), record.pod_name.as_deref()),
                absent.join(", "),
                record.netns
            )),
            Err(e) => unreadable.push(e.msg),
        }
    }
    if !missing.is_empty() {
        let mut finding = Finding::new(
            Severity::Error,
            "sandbox-interfaces",
            format!("{root}: {} live sandboxes lost an interface their checkpoint records: those pods have no network", missing.len()),
        )
        .fix("a NIC driver reload or a hand-deleted link takes the pods' interfaces with it: `sandbox-guard --restore` re-creates them from the checkpoints, or re-create the pods");
        finding.evidence = capped(missing);
        report.add(finding);
    } else if unreadable.is_empty() {
        report.add(Finding::new(
            Severity::Ok,
            "sandbox-interfaces",
            format!(
                "{root}: every live sandbox ({}) has its interfaces{}",
                live.len() - held,
                match held {
                    0 => String::new(),
                    n =>
                        format!(" ({n} more held for the API server, without theirs: held-by-api)"),
                }
            ),
        ));
    }
    if !unreadable.is_empty() {
        let mut finding = Finding::new(
            Severity::Info,
            "sandbox-interfaces",
            format!(
                "{root}: {} namespaces could not be entered",
                unreadable.len()
            ),
        )
        .fix("run --doctor as root");
        finding.evidence = capped(unreadable);
        report.add(finding);
    }
}

/// The interfaces `record`'s result puts in the sandbox, else its `CNI_IFNAME`.
fn recorded_interfaces(record: &Checkpoint) -> Vec<String> {
    let mut names: Vec<String> = ResultView::parse(&record.prev_result)
        .map(|view| {
            view.interfaces
                .iter()
                .filter(|i| i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
                .map(|i| i.name.clone())
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        names.push(record.if_name.clone());
    }
    names
}

/// Where `record`'s namespace can be entered: a process of it, where its path is gone.
fn netns_path(record: &Checkpoint, state: &NetnsState) -> String {
    match state {
        NetnsState::HeldBy(pids) => format!("/proc/{}/ns/net", pids[0]),
        _ => record.netns.clone(),
    }
}

/// The names among `names` that do not exist in the namespace at `netns`, asked of the
/// kernel from inside it.
fn absent_interfaces(netns: &str, names: Vec<String>) -> crate::error::Result<Vec<String>> {
    netlink::with_pod_netns(Path::new(netns), |kernel| {
        let mut absent = Vec::new();
        for name in names {
            // A name no interface can have (too long, say) is absent without asking.
            if crate::names::check_ifname(&name).is_err()
                || kernel.link_by_name(Side::Pod, &name)?.is_none()
            {
                absent.push(name);
            }
        }
        Ok(absent)
    })
}

/// What keeps a namespace alive, for the evidence: its mount and the processes in it.
fn describe_state(netns: &str, state: &NetnsState, users: &NetnsUsers) -> String {
    let pids: Vec<u32> = match state {
        NetnsState::HeldBy(pids) => pids.clone(),
        _ => netns_inode(netns)
            .map(|i| users.pids(i).to_vec())
            .unwrap_or_default(),
    };
    let processes: Vec<String> = pids
        .iter()
        .take(5)
        .map(|&pid| describe_process(pid))
        .collect();
    let held = if processes.is_empty() {
        "no process in it".to_string()
    } else {
        format!("processes in it: {}", processes.join(", "))
    };
    match state {
        NetnsState::HeldBy(_) => {
            format!("netns {netns} is unmounted, but the namespace lives on; {held}")
        }
        _ => format!("netns {netns} is still mounted; {held}"),
    }
}

/// `pid 4242 (pause, state D)`, from /proc/<pid>/stat.
fn describe_process(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let comm = stat
        .find('(')
        .zip(stat.rfind(')'))
        .and_then(|(a, b)| stat.get(a + 1..b))
        .unwrap_or("?");
    let state = stat
        .rfind(')')
        .and_then(|b| stat.get(b + 2..b + 3))
        .unwrap_or("?");
    let stuck = if state == "D" {
        ", uninterruptible: stuck in the kernel"
    } else {
        ""
    };
    format!("pid {pid} ({comm}, state {state}{stuck})")
}

fn address_list(addresses: &[IpAddr]) -> String {
    match addresses {
        [] => "its interfaces are".to_string(),
        [one] => format!("{one} is"),
        many => format!(
            "{} are",
            many.iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
