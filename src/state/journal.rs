//! What the state dir's file system does for a power cut, for `--doctor` and the installer.
//! The store itself syncs only what outlives the boot (`boot`): on ext2, ext3 and ext4 without
//! a journal the file system writes its blocks in its own order whatever a program syncs, so
//! even those can be lost, and a power cut can leave it for a manual fsck.

use std::os::unix::fs::MetadataExt;

use nix::sys::statfs::{BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, FsType};

/// XFS's magic (the kernel's include/uapi/linux/magic.h), which nix names only on glibc.
const XFS_MAGIC: FsType = FsType(0x5846_5342);

/// What a state dir's file system does for a power cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerCut {
    /// Journaled: what the guard syncs survives.
    Journaled,
    /// ext2, ext3 or ext4 without a journal, on this device: what ext4 itself says (a
    /// read-only look at /sys/fs/ext4/<device>/journal_task, "<none>" without one; where the
    /// ext4 driver does not show the device, jbd2's list /proc/fs/jbd2 has no entry for it).
    NoJournal { device: String, evidence: String },
    /// ext4 with its journal, mounted `nobarrier` (`barrier=0`): jbd2 sends the drive no cache
    /// flush, so a drive with a volatile write cache can lose or reorder what was committed.
    NoBarrier { device: String, evidence: String },
    /// Another file system, or one that could not be told (no /sys or /proc).
    Unknown,
}

/// Where the state dir `dir` is, or will be: its nearest existing ancestor when it has not
/// been made yet. Only reads (statfs, stat, readlink, a sysfs file): no write, no lock, so a
/// DaemonSet can ask it of the host's path through its host root mount, whose /sys and
/// /proc/fs/jbd2 are the kernel's own.
pub fn power_cut_of(dir: &std::path::Path) -> PowerCut {
    let Some(existing) = dir.ancestors().find(|d| d.exists()) else {
        return PowerCut::Unknown;
    };
    let Ok(fs) = nix::sys::statfs::statfs(existing) else {
        return PowerCut::Unknown;
    };
    let kind = fs.filesystem_type();
    if kind == XFS_MAGIC || kind == BTRFS_SUPER_MAGIC {
        return PowerCut::Journaled;
    }
    if kind != EXT4_SUPER_MAGIC {
        return PowerCut::Unknown;
    }
    let Ok(meta) = std::fs::metadata(existing) else {
        return PowerCut::Unknown;
    };
    let dev = meta.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let Some(device) = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|link| link.file_name().map(|n| n.to_string_lossy().into_owned()))
    else {
        return PowerCut::Unknown;
    };
    let task = format!("/sys/fs/ext4/{device}/journal_task");
    let journaled = match std::fs::read_to_string(&task) {
        Ok(text) if text.trim() == "<none>" => {
            return PowerCut::NoJournal {
                evidence: format!("{task} reads <none>"),
                device,
            };
        }
        Ok(_) => true,
        Err(_) => ext_has_journal(dev),
    };
    match journaled {
        true if mounted_nobarrier(major, minor) => PowerCut::NoBarrier {
            evidence: format!("/proc/self/mountinfo: device {major}:{minor} is mounted nobarrier"),
            device,
        },
        true => PowerCut::Journaled,
        false if std::path::Path::new("/proc/fs").is_dir() => PowerCut::NoJournal {
            evidence: format!("no journal /proc/fs/jbd2/{device}-8 runs for it"),
            device,
        },
        false => PowerCut::Unknown,
    }
}

/// Whether a mount of the device `major:minor` has `nobarrier` (or `barrier=0`, shown so) among
/// its file system's options, the last field of a /proc/self/mountinfo line: the options are
/// the file system's, so every mount of the device shows the same.
fn mounted_nobarrier(major: u64, minor: u64) -> bool {
    let device = format!("{major}:{minor}");
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|mounts| {
        mounts.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&device.as_str())
                && fields.last().is_some_and(|options| {
                    options
                        .split(',')
                        .any(|o| o == "nobarrier" || o == "barrier=0")
                })
        })
    })
}

/// What a journal without barriers costs, and how out.
pub const NO_BARRIER_COST: &str = "ext4 mounted nobarrier sends the drive no cache flush, so on a \
    drive with a volatile write cache a power cut can lose or reorder what the journal \
    committed, delegate mode's deferred DELs (the state the guard syncs) with it";

pub const NO_BARRIER_FIX: &str = "remount the file system with barriers (mount -o remount,barrier \
    <mount point>, and drop nobarrier from fstab), unless the drive's write cache is \
    non-volatile (battery- or capacitor-backed)";

/// What a file system without a journal costs, said the same by `--doctor` and the installer.
pub const NO_JOURNAL_COST: &str = "a power cut can leave the file system for a manual fsck \
    (e2fsck -p gave up at most of 1,390 cuts measured), so the node may not boot unattended, and \
    the file system writes its blocks in its own order whatever the guard syncs, so delegate \
    mode's deferred DELs can be lost (an earlier, synced store lost 63 acknowledged ADDs at 16 \
    of those cuts)";

/// How to get a journal there.
pub fn no_journal_fix(device: &str) -> String {
    format!(
        "put the state dir (stateDir) on a journaled file system (ext4 with its journal, XFS), or add a \
         journal to this one: tune2fs -O has_journal /dev/{device} (effective at its next mount)"
    )
}

/// jbd2 lists each journal it runs as /proc/fs/jbd2/<device>-<journal inode>, 8 for an
/// internal one; the device's name comes from /sys/dev/block.
fn ext_has_journal(dev: u64) -> bool {
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let Ok(device) = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")) else {
        return false;
    };
    let Some(name) = device.file_name() else {
        return false;
    };
    let mut jbd2 = std::ffi::OsString::from("/proc/fs/jbd2/");
    jbd2.push(name);
    jbd2.push("-8");
    std::path::Path::new(&jbd2).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_a_journal_is_found_to_have_none() {
        assert!(!ext_has_journal(nix::sys::stat::makedev(0, 0)));
    }
}
