//! GC: forget every attachment of this network that the runtime no longer lists, and the
//! ownership those attachments held. The one verb that may cost more as the store grows.

use std::collections::HashSet;

use crate::cni::config::ValidAttachment;
use crate::cni::log::{Level, Outcome};
use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::state::Loaded;
use crate::state::checkpoint::AttachmentId;

pub fn run(inv: &Invocation) -> Result<()> {
    let valid: HashSet<&ValidAttachment> = inv
        .conf
        .valid_attachments
        .as_ref()
        .ok_or_else(|| {
            // Treating a missing list as empty would forget every pod on the node.
            GuardError::new(
                Kind::InvalidConfig,
                "GC needs cni.dev/valid-attachments (or the legacy cni.dev/attachments) in the config",
            )
        })?
        .iter()
        .collect();
    let network = &inv.conf.network;
    let is_valid = |container_id: &str, if_name: &str| {
        valid.contains(&ValidAttachment {
            container_id: container_id.to_string(),
            ifname: if_name.to_string(),
        })
    };

    let store = inv.open_store(None)?;
    let records = store.list_records()?;
    let recorded: HashSet<AttachmentId> = records
        .iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(record) => Some(record.id()),
            _ => None,
        })
        .collect();

    // Owners first, made durable before any record goes: a crash in between leaves records
    // without owners (harmless), never an owner without its record.
    let mut released = 0;
    let mut repaired = 0;
    for (_, loaded) in store.list_owners()? {
        let Loaded::Valid(owner) = loaded else {
            continue;
        };
        if owner.key.network != *network {
            continue;
        }
        // Each interface the runtime no longer lists gives its part up; the last one the key.
        let listed: Vec<String> = owner
            .interfaces()
            .into_iter()
            .filter(|if_name| is_valid(&owner.container_id, if_name))
            .map(String::from)
            .collect();
        if listed.is_empty() {
            store.remove_owner(&owner.key)?;
            released += 1;
        } else if listed.len() < owner.interfaces().len() {
            store.save_owner(&crate::state::ownership::Ownership {
                interfaces: listed,
                ..owner
            })?;
        } else if !store.owner_is_backed(&owner) {
            store.remove_owner(&owner.key)?;
            repaired += 1;
        }
    }
    store.sync()?;

    let mut removed_records = 0;
    let mut set_aside = 0;
    for (path, loaded) in records {
        match loaded {
            Loaded::Valid(record)
                if record.network == *network
                    && !is_valid(&record.container_id, &record.if_name) =>
            {
                store.remove_record(&record.id())?;
                removed_records += 1;
            }
            Loaded::Corrupt { .. } => {
                let Some(id) = AttachmentId::from_file_name(&path) else {
                    continue;
                };
                if id.network == *network {
                    // Kept either way; it blocks DELs only while the runtime still lists it.
                    let blocking = is_valid(&id.container_id, &id.if_name);
                    store.set_aside(&path, &store.set_aside_path_for_record(&id), blocking)?;
                    set_aside += 1;
                }
            }
            _ => {}
        }
    }
    // A record blocker of an attachment the runtime no longer lists guards nothing.
    for path in store.list_set_aside()? {
        let Some(id) = AttachmentId::from_file_name(&path) else {
            continue;
        };
        if id.network == *network
            && crate::state::set_aside_blocks(&path)
            && !is_valid(&id.container_id, &id.if_name)
        {
            store.unblock(&path)?;
        }
    }
    // A failed ADD's note matters only until its cleanup DEL, which a listed attachment may still get.
    let mut notes = 0;
    for (path, id) in store.list_failed_adds()? {
        let obsolete = match &id {
            Some(id) => {
                id.network == *network && !is_valid(&id.container_id, &id.if_name)
                    || recorded.contains(id)
            }
            None => true,
        };
        if obsolete {
            store.remove_failed_add_at(&path)?;
            notes += 1;
        }
    }
    // A rollback's mark answers its sandbox's own DEL, which an attachment no longer listed
    // does not get.
    for id in crate::state::pending_add::rolled_back_ids(store.root()) {
        if id.network == *network && !is_valid(&id.container_id, &id.if_name) {
            crate::state::pending_add::remove_rolled_back(store.root(), &id)?;
        }
    }
    let temp_files = store.remove_dead_temp_files()?;
    let forgotten = super::ip_conflict::forget_released(&store, network);
    store.sync()?;
    // GC lists the store anyway: the count the metrics read is made exact again.
    store.recount_records()?;
    inv.log.event(
        Level::Info,
        inv.verb,
        &inv.subject(None, None),
        Outcome::Collected,
        &format!(
            "kept {} valid attachments; released {released} pod keys, dropped {repaired} owners without a record, \
             removed {removed_records} records, set aside {set_aside} corrupt records, removed {notes} failed-ADD \
             notes and {temp_files} temp files of dead writers, forgot {forgotten} released addresses",
            valid.len()
        ),
    );
    Ok(())
}
