//! Which records a restore takes: those asked for, each with its pod still its own.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::Selection;
use super::report::{Outcome, Row};
use crate::error::{GuardError, Kind, Result};
use crate::state::checkpoint::{AttachmentId, Checkpoint};
use crate::state::lock::WaitNotice;
use crate::state::ownership::{Ownership, PodKey};
use crate::state::{Folder, Loaded, Store, read_entry_for_listing};

/// A selected checkpoint, or a selection that named something unusable.
pub enum Selected {
    Record(Box<Checkpoint>),
    Unusable(Row),
    Superseded(Row),
}

pub fn select(
    state_dir: &Path,
    selection: &Selection,
    lock_timeout: Duration,
) -> Result<Vec<Selected>> {
    if std::fs::symlink_metadata(state_dir).is_err() {
        return Err(GuardError::new(
            Kind::Io,
            format!(
                "no state directory at {}: pass --state-dir with the plugin's stateDir",
                state_dir.display()
            ),
        ));
    }
    // Read under the shared lock, then let it go: the kernel work below may take seconds
    // and must not hold up the runtime's ADDs and DELs.
    let store = Store::open_as_it_is(state_dir)?;
    let notice = WaitNotice::new(state_dir, lock_timeout);
    let on_wait = |holder: &str| notice.hear(holder);
    let mut listed = store.read_in_batches(Folder::Records, lock_timeout, &on_wait, |p| {
        Some(store.load_record_at(p))
    })?;
    // Sorted, so the report reads the same from run to run.
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let owners = store.read_in_batches(Folder::Owners, lock_timeout, &on_wait, |p| {
        Some(read_entry_for_listing::<Ownership>(p))
    })?;
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
            Loaded::Valid(record) if wanted(&record.container_id) => {
                let why_not = of_another_boot(&store, &record).or_else(|| {
                    record.held.as_ref().map(|moved| {
                        format!(
                            "its DEL is held because the API server shows pod {} under its pod's name (chained mode took its \
                             interface out on purpose)",
                            moved.pod_uid
                        )
                    })
                });
                if let Some(why) = why_not {
                    selected.push(Selected::Unusable(Row {
                        container_id: record.container_id.clone(),
                        if_name: record.if_name.clone(),
                        network: record.network.clone(),
                        netns: record.netns.clone(),
                        outcome: Outcome::NotRestorable(why),
                    }));
                    continue;
                }
                match superseded_by(&record, &owners, &netns_of) {
                    Some(why) => selected.push(Selected::Superseded(Row {
                        container_id: record.container_id.clone(),
                        if_name: record.if_name.clone(),
                        network: record.network.clone(),
                        netns: record.netns.clone(),
                        outcome: Outcome::Superseded(why),
                    })),
                    None => selected.push(Selected::Record(Box::new(record))),
                }
            }
            Loaded::Corrupt { reason, .. } if unusable_is_wanted(&path, selection) => selected
                .push(Selected::Unusable(Row {
                    container_id: file_name(&path),
                    if_name: "-".into(),
                    network: "-".into(),
                    netns: "-".into(),
                    outcome: Outcome::NotRestorable(format!(
                        "its checkpoint failed verification ({reason})"
                    )),
                })),
            _ => {}
        }
    }
    if let Selection::ContainerIds(ids) = selection {
        for id in ids {
            let matched = selected.iter().any(|s| match s {
                Selected::Record(record) => record.container_id.starts_with(id.as_str()),
                Selected::Unusable(row) | Selected::Superseded(row) => {
                    row.container_id.contains(id.as_str())
                }
            });
            if !matched {
                selected.push(Selected::Unusable(Row {
                    container_id: id.clone(),
                    if_name: "-".into(),
                    network: "-".into(),
                    netns: "-".into(),
                    outcome: Outcome::NotRestorable(format!(
                        "no checkpoint in {} for this container ID",
                        state_dir.display()
                    )),
                }));
            }
        }
    }
    Ok(selected)
}

/// Why `record` must never be entered: its sandbox ended with an earlier boot, and the netns
/// path, inode and cookie it names are counters of that boot, which can name a live netns of
/// this one.
fn of_another_boot(store: &Store, record: &Checkpoint) -> Option<String> {
    if let crate::state::boot::LiveFolders::Previous(boot) = store.live_folders() {
        return Some(format!(
            "its sandbox ended with the boot {boot} (the state dir's live folders are that boot's: no verb ran since)"
        ));
    }
    (!store.of_this_boot(record.boot_id.as_deref())).then(|| {
        format!(
            "its sandbox ended with the boot {} (its checkpoint says so)",
            record.boot_id.as_deref().unwrap_or("-")
        )
    })
}

/// Why `record` must be left alone: another sandbox owns its pod key, so the pod's address
/// belongs there. Reviving this one would put it on the wire twice while the owner lives; and
/// when the owner's netns is gone or unknown, the pod's name is still not this sandbox's.
fn superseded_by(
    record: &Checkpoint,
    owners: &HashMap<PodKey, Ownership>,
    netns_of: &HashMap<AttachmentId, String>,
) -> Option<String> {
    let (key, owner) = record
        .pod_keys()
        .into_iter()
        .find_map(|key| Some((key.clone(), owners.get(&key)?)))?;
    let owner = Some(owner).filter(|o| o.container_id != record.container_id)?;
    let remove = format!(
        "remove it instead (`crictl rmp {}`)",
        crate::names::short_id(&record.container_id)
    );
    let owner_netns = owner
        .interfaces()
        .into_iter()
        .find_map(|if_name| netns_of.get(&AttachmentId::of(&key, &owner.container_id, if_name)));
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
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// A corrupt file is named `<network>:<container>:<if>`: only its name can say whose it is.
fn unusable_is_wanted(path: &Path, selection: &Selection) -> bool {
    match selection {
        Selection::All => true,
        Selection::ContainerIds(ids) => {
            let container = AttachmentId::from_file_name(path)
                .map(|id| id.container_id)
                .unwrap_or_default();
            ids.iter().any(|id| container.starts_with(id.as_str()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            identity: None,
            cni_version: "1.0.0".into(),
            generation: 1,
            created_at: String::new(),
            updated_at: String::new(),
            prev_result: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            links: None,
            boot_id: None,
            held: None,
        };
        let old = record("old", "/proc/self/ns/net");
        let key = old
            .pod_key(crate::state::ownership::PodKeyRule::Name)
            .unwrap();
        let owner = crate::state::ownership::taken(&key, "new", "eth0", None, 2, None);
        let owners = HashMap::from([(key, owner)]);
        let new_id = AttachmentId {
            network: "net".into(),
            container_id: "new".into(),
            if_name: "eth0".into(),
        };
        let alive = HashMap::from([(new_id.clone(), "/proc/self/ns/net".to_string())]);
        assert!(
            superseded_by(&old, &owners, &alive)
                .unwrap()
                .contains("alive")
        );
        // The owner's netns gone, or its record unknown: still not this sandbox's pod.
        let gone = HashMap::from([(new_id, "/nonexistent".to_string())]);
        assert!(
            superseded_by(&old, &owners, &gone)
                .unwrap()
                .contains("not brought back")
        );
        assert!(superseded_by(&old, &owners, &HashMap::new()).is_some());
        // Its own pod key: nothing in the way.
        assert!(superseded_by(&record("new", "/proc/self/ns/net"), &owners, &alive).is_none());
    }
}
