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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_a_journal_is_found_to_have_none() {
        assert!(!ext_has_journal(nix::sys::stat::makedev(0, 0)));
    }
}
