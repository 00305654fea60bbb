//! Whether the state dir's file system journals its metadata: what lets an ownership be a
//! symlink made durable by its directory's fsync alone (`Store::save_owner`).
//!
//! A journaling file system (ext4 with its journal, XFS, btrfs) commits a new symlink's inode
//! with the directory entry that names it, in the order the changes were made. ext2, ext3 and
//! ext4 without a journal (`mkfs.ext4 -O ^has_journal`, some cloud images' root), vfat and
//! the rest do not: a directory fsync there writes the entry but not the new inode, so a
//! power cut could lose an ownership ADD reported made. Those get the regular file with its
//! own fsync, as releases before the symlink form wrote it. Unknown means no journal: the
//! durable form costs a sync, the other could cost the outage the guard prevents.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use nix::sys::statfs::{
    BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC, fstatfs,
};

/// How the state dir's file system makes metadata durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    /// One log written in the order of the changes (jbd2 under ext3 and ext4, XFS's log): a
    /// sync that commits a change commits every change made before it, in whatever directory.
    /// On ext4 a directory's fsync commits the whole running transaction; on XFS it forces the
    /// log up to the directory's last change. tmpfs counts here too: nothing survives a power
    /// cut there, so there is no order to keep.
    Ordered,
    /// A log per inode (btrfs's log tree): each directory's fsync logs that directory only.
    PerInode,
    /// No journal (ext2, ext4 made without one) or one not known.
    None,
}

/// `file` is any file of the state dir's file system (the lock file). One fstatfs; on the ext
/// family (one magic for ext2, ext3 and ext4) an fstat, a readlink and an access more.
pub fn journal_of(file: &File) -> Journal {
    let Ok(fs) = fstatfs(file) else {
        return Journal::None;
    };
    match fs.filesystem_type() {
        XFS_SUPER_MAGIC | TMPFS_MAGIC => Journal::Ordered,
        BTRFS_SUPER_MAGIC => Journal::PerInode,
        EXT4_SUPER_MAGIC
            if file
                .metadata()
                .is_ok_and(|meta| ext_has_journal(meta.dev())) =>
        {
            Journal::Ordered
        }
        _ => Journal::None,
    }
}

/// jbd2 lists each journal it runs as /proc/fs/jbd2/<device>-<journal inode>, 8 for an
/// internal one; the device's name comes from /sys/dev/block. Without /proc or /sys (a bare
/// container) or with an external journal, no journal is found: the durable form is taken.
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

/// What a state dir's file system does for a power cut, for `--doctor` and the installer
/// (the store decides per exec with `journal_of`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerCut {
    /// Journaled: what the guard acknowledged survives.
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
    match fs.filesystem_type() {
        XFS_SUPER_MAGIC | BTRFS_SUPER_MAGIC => return PowerCut::Journaled,
        EXT4_SUPER_MAGIC => {}
        _ => return PowerCut::Unknown,
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
    committed, ADDs the guard acknowledged with it";

pub const NO_BARRIER_FIX: &str = "remount the file system with barriers (mount -o remount,barrier \
    <mount point>, and drop nobarrier from fstab), unless the drive's write cache is \
    non-volatile (battery- or capacitor-backed)";

/// What a file system without a journal costs, said the same by `--doctor` and the installer.
pub const NO_JOURNAL_COST: &str = "a power cut can lose ADDs the guard acknowledged (measured: 63 \
    acknowledged ADDs lost at 16 of 1,390 cuts) and leave the file system for a manual fsck \
    (e2fsck -p gives up at most cuts), and every ADD pays two data syncs and two directory \
    syncs instead of one commit";

/// How to get a journal there.
pub fn no_journal_fix(device: &str) -> String {
    format!(
        "put the state dir (stateDir) on a journaled file system (ext4 with its journal, XFS), or add a \
         journal to this one: tune2fs -O has_journal /dev/{device} (effective at its next mount)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_a_journal_is_found_to_have_none() {
        assert!(!ext_has_journal(nix::sys::stat::makedev(0, 0)));
    }
}
