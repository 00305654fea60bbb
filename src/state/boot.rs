//! The boot a store's sandboxes live in.
//!
//! A sandbox never outlives the boot that made it: after a power cut or a reboot the runtime
//! marks every old sandbox not ready and runs no CNI call of its own (kubelet's stops of
//! them come as DELs with an empty netns), and its netns, interfaces and the counters that
//! name them (netns inode and cookie, `/proc/<pid>` paths) are gone.
//! So the records and ownerships of one boot need no sync: within the boot the page cache is
//! the truth (a killed writer leaves a whole file or the old one, by rename), and a crash that
//! loses unsynced writes starts a new boot, whose first writer moves the old boot's folders to
//! `previous-boot/<its id>/`, where no owner is taken from them (delegate mode only looks
//! there to tell a DEL of a sandbox of that boot, `recorded_in_previous_boot`). What outlives
//! the boot (deferred DELs the primary has not yet received, the `podKey` markers) keeps its
//! syncs.
//!
//! `<stateDir>/boot` names the boot the live folders belong to. It is made durable before
//! the first entry of its boot is written, so a power cut never leaves a boot's unsynced
//! entries under a marker that the next boot takes for its own.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::sealed::{self, Durability};
use super::{ensure_dir, sync_path};
use crate::error::{GuardError, Result};

/// The marker file in the state dir.
pub const BOOT: &str = "boot";
/// Where the first writer of a boot puts the folders of the boot before it.
pub const PREVIOUS_BOOT: &str = "previous-boot";
/// Never made: where a verb's read-only view looks for the folders while the live ones are
/// another boot's (`Store::open_read_only`).
pub const ANOTHER_BOOTS: &str = ".folders-of-another-boot";
/// The folders whose files describe one boot's sandboxes.
pub const BOOT_SCOPED: [&str; 5] = [
    super::RECORDS,
    super::OWNERS,
    super::SET_ASIDE,
    super::FAILED_ADDS,
    super::IPS,
];

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Marker {
    format_version: u32,
    boot_id: String,
}

/// What the marker says of the live folders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveFolders {
    /// Of this boot.
    ThisBoot,
    /// Of the boot with this id: every sandbox they name has ended.
    Previous(String),
    /// No marker: a store no writer of a boot-scoped release has opened yet (its files were
    /// written durably), or a boot id that cannot be read.
    Unscoped,
}

/// What the marker of `root` says, for readers, `now` being this boot's id; reads only.
pub fn live_folders(root: &Path, now: Option<&str>) -> LiveFolders {
    match (read_marker(root), now) {
        (Some(Ok(marker)), Some(now)) if marker.boot_id == now => LiveFolders::ThisBoot,
        // As `enter` judges them: such owners are live, and the next writer keeps them.
        (Some(Ok(_)), Some(_)) if !unstamped_owners(&root.join(super::OWNERS)).is_empty() => {
            LiveFolders::Unscoped
        }
        (Some(Ok(marker)), Some(_)) => LiveFolders::Previous(marker.boot_id),
        _ => LiveFolders::Unscoped,
    }
}

/// For every writer, under the store's exclusive lock; the first of each boot moves the
/// previous boot's folders aside and marks the store as this boot's. Returns this boot's id,
/// or `None` where none can be read: then every write is made durable, as a store without a
/// boot must.
///
/// A store without a marker was written by a release that synced every entry: its files are
/// adopted as this boot's, so an upgrade in place keeps every owner. A marker that does not
/// decode is treated so too: keeping owners refuses stale DELs, which is the safe side.
/// `moved` runs once the folders went aside, before the marker says so: what counts their
/// files is reset there, so no kill leaves the old boot's count under this boot's marker.
pub fn enter(root: &Path, moved_aside: impl FnOnce()) -> Result<Option<String>> {
    let Some(now) = crate::clock::boot_id() else {
        return Ok(None);
    };
    match read_marker(root) {
        Some(Ok(marker)) if marker.boot_id == now => return Ok(Some(now)),
        Some(Ok(marker)) => {
            move_aside(root, &marker.boot_id)?;
            moved_aside();
            bring_back_unstamped(root, &marker.boot_id)?;
        }
        Some(Err(reason)) => {
            stderr_line!(
                "sandbox-guard: {} does not decode ({reason}); its folders are taken as this boot's",
                root.join(BOOT).display()
            );
            stamp_unstamped(root, &now)?;
        }
        None => stamp_unstamped(root, &now)?,
    }
    let marker = Marker {
        format_version: sealed::FORMAT_VERSION,
        boot_id: now.clone(),
    };
    let mut text = serde_json::to_vec(&marker).unwrap_or_default();
    text.push(b'\n');
    sealed::replace(root, BOOT, &text, Durability::Durable)
        .map_err(|e| GuardError::io("write the boot marker", &root.join(BOOT), e))?;
    sync_path(root)?;
    Ok(Some(now))
}

/// The ownerships in `dir` that name no boot, which only a release that knows no boot writes
/// under a marker (`stamp_unstamped` stamps those a marker adopts).
fn unstamped_owners(dir: &Path) -> Vec<(PathBuf, super::ownership::Ownership)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| !entry.file_name().as_encoded_bytes().starts_with(b"."))
        .filter_map(|entry| match sealed::read_any(&entry.path()) {
            Ok(super::Loaded::Valid(owner)) => Some((entry.path(), owner)),
            _ => None,
        })
        .filter(|(_, owner): &(PathBuf, super::ownership::Ownership)| owner.boot_id.is_none())
        .collect()
}

/// Adopting a store that no marker names (a release before the marker, its files synced):
/// each ownership is stamped with this boot, durably, before the marker is written, so an
/// ownership that names no boot under a marker is always one a release without boots wrote.
fn stamp_unstamped(root: &Path, now: &str) -> Result<()> {
    let owners = root.join(super::OWNERS);
    let unstamped = unstamped_owners(&owners);
    for (path, owner) in &unstamped {
        let stamped = super::ownership::Ownership {
            boot_id: Some(now.to_string()),
            ..owner.clone()
        };
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        sealed::replace(&owners, &name, &sealed::seal(&stamped), Durability::Durable)
            .map_err(|e| GuardError::io("stamp the ownership", path, e))?;
    }
    if !unstamped.is_empty() {
        sync_path(&owners)?;
    }
    Ok(())
}

/// After the move: the ownerships that name no boot, and their records, go back. A release
/// that knows no boot wrote them since the marker (gone back to without `--downgrade`, then
/// rebooted) and synced them: they are live owners.
fn bring_back_unstamped(root: &Path, boot: &str) -> Result<()> {
    let aside = previous_boot_dir(root, boot);
    let unstamped = unstamped_owners(&aside.join(super::OWNERS));
    if unstamped.is_empty() {
        return Ok(());
    }
    stderr_line!(
        "sandbox-guard: {} ownerships a release that knows no boot wrote since the marker stay live",
        unstamped.len()
    );
    for dir in [super::OWNERS, super::RECORDS] {
        ensure_dir(&root.join(dir))?;
    }
    for (path, owner) in &unstamped {
        let name = path.file_name().unwrap_or_default();
        let mut back = vec![(path.clone(), root.join(super::OWNERS).join(name))];
        for if_name in owner.interfaces() {
            let record =
                super::checkpoint::AttachmentId::of(&owner.key, &owner.container_id, if_name)
                    .file_name();
            back.push((
                aside.join(super::RECORDS).join(&record),
                root.join(super::RECORDS).join(&record),
            ));
        }
        // The records first: no owner is ever back without them.
        for (from, to) in back.iter().rev() {
            match fs::rename(from, to) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(GuardError::io("bring back", from, e));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn read_marker(root: &Path) -> Option<std::result::Result<Marker, String>> {
    let path = root.join(BOOT);
    let file = match sealed::open_nofollow(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(e.to_string())),
    };
    let mut text = Vec::new();
    if let Err(e) = io::Read::read_to_end(&mut io::Read::take(file, 4096), &mut text) {
        return Some(Err(e.to_string()));
    }
    Some(
        serde_json::from_slice::<Marker>(&text)
            .map_err(|e| e.to_string())
            .and_then(|marker| match plain_boot_id(&marker.boot_id) {
                true => Ok(marker),
                false => Err("its boot id is not one the kernel gives".to_string()),
            }),
    )
}

/// A boot id is a UUID: it names a folder, so nothing else passes.
fn plain_boot_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// `previous-boot/<boot>/`, where the folders of `boot` go. Only the boot before the current
/// one is kept: the one before that is removed, it ended two boots ago.
pub fn previous_boot_dir(root: &Path, boot: &str) -> PathBuf {
    root.join(PREVIOUS_BOOT).join(boot)
}

/// Whether the boot before this one recorded the attachment whose record file is
/// `record_name` (under `previous-boot/`, in `records/` or a `records.<pid>` a run cut short
/// left; a regular file, or the symlink an earlier release wrote): a sandbox that ended with
/// that boot. Only what that boot's writeback reached its disk is found there. Never through
/// a symlink.
pub fn recorded_in_previous_boot(root: &Path, record_name: &str) -> bool {
    let dirs = |path: &Path| -> Vec<PathBuf> {
        fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .collect()
    };
    let records_prefix = format!("{}.", super::RECORDS);
    dirs(&root.join(PREVIOUS_BOOT))
        .iter()
        .flat_map(|boot| dirs(boot))
        .filter(|folder| {
            folder
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name == super::RECORDS || name.starts_with(&records_prefix))
        })
        .any(|folder| {
            fs::symlink_metadata(folder.join(record_name))
                .is_ok_and(|meta| meta.is_file() || meta.is_symlink())
        })
}

/// Renames each boot-scoped folder into `previous-boot/<boot>/`. Run again after a kill, it
/// moves what is left; nothing here needs a sync: a power cut before the marker is durable
/// leaves the old marker, and the next boot moves the folders again.
fn move_aside(root: &Path, boot: &str) -> Result<()> {
    let previous = root.join(PREVIOUS_BOOT);
    ensure_dir(&previous)?;
    let entries = fs::read_dir(&previous).map_err(|e| GuardError::io("list", &previous, e))?;
    for entry in entries.flatten() {
        if entry.file_name() != boot {
            let path = entry.path();
            let removed = match entry.file_type() {
                Ok(kind) if kind.is_dir() => fs::remove_dir_all(&path),
                _ => fs::remove_file(&path),
            };
            // History only: a failure here must not stop the verbs.
            if let Err(e) = removed {
                stderr_line!("sandbox-guard: cannot remove {}: {e}", path.display());
            }
        }
    }
    let target = previous_boot_dir(root, boot);
    ensure_dir(&target)?;
    for folder in BOOT_SCOPED {
        let from = root.join(folder);
        match fs::symlink_metadata(&from) {
            Ok(meta) if meta.is_dir() => {}
            _ => continue,
        }
        let mut to = target.join(folder);
        // Moved already by a run cut short, after which a writer that takes no marker (a
        // release before it, in a rolling upgrade) made the folder again.
        if fs::symlink_metadata(&to).is_ok() {
            to = target.join(format!("{folder}.{}", std::process::id()));
        }
        fs::rename(&from, &to).map_err(|e| GuardError::io("move the previous boot's", &from, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_uuid_names_a_folder() {
        assert!(plain_boot_id("6146a751-55d6-44c4-9b8c-89e6f319b004"));
        for bad in ["", "..", "a/b", "x", &"a".repeat(65)] {
            assert!(!plain_boot_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_sandbox_of_the_boot_before_is_found_in_any_records_folder_it_left() {
        let root = std::env::temp_dir().join(format!("sg-prev-boot-{}", std::process::id()));
        let boot = previous_boot_dir(&root, "6146a751-55d6-44c4-9b8c-89e6f319b004");
        fs::create_dir_all(boot.join(crate::state::RECORDS)).unwrap();
        fs::create_dir_all(boot.join("records.4242")).unwrap();
        fs::write(boot.join(crate::state::RECORDS).join("net:a:eth0"), "{}").unwrap();
        // An earlier release's record on a journal: a symlink whose target is its text.
        std::os::unix::fs::symlink("{}", boot.join("records.4242").join("net:b:eth0")).unwrap();
        assert!(recorded_in_previous_boot(&root, "net:a:eth0"));
        assert!(recorded_in_previous_boot(&root, "net:b:eth0"));
        assert!(!recorded_in_previous_boot(&root, "net:c:eth0"));
        // Never through a symlinked folder.
        let elsewhere = root.join("elsewhere");
        fs::create_dir_all(elsewhere.join(crate::state::RECORDS)).unwrap();
        fs::write(
            elsewhere.join(crate::state::RECORDS).join("net:d:eth0"),
            "{}",
        )
        .unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(PREVIOUS_BOOT).join("linked")).unwrap();
        assert!(!recorded_in_previous_boot(&root, "net:d:eth0"));
        fs::remove_dir_all(&root).unwrap();
    }
}
