//! What ADD syncs, on the file systems a node's /var/lib may be: an ownership is a symlink made
//! durable by its directory's fsync only where a journal commits the symlink's inode with it;
//! on ext4 without a journal a directory fsync writes the entry but not the inode, so a power
//! cut could lose an ownership ADD reported made, and there it is a regular file synced on its
//! own. Run under strace on loop-mounted ext4 with and without a journal.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;

use cni::{Pod, Store, container_id};
use std::path::Path;

/// The data syncs of an ADD and whether the ownership it wrote is a symlink.
fn add_on(disk: &mount::Mount) -> (Vec<String>, bool) {
    let logs = sys::TempDir::new("sglogs");
    let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let pod = Pod::new("durable", "db-0");
    // A first ADD makes the folders and a second sandbox's ADD rewrites the key's ownership,
    // so both a new ownership and a rewrite are seen.
    store.add(&container_id(), &pod).run().assert_ok();
    let trace = logs.path.join("trace");
    let strace = ["strace", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", trace.to_str().unwrap()];
    store.add(&container_id(), &pod).wrapped_in(&strace).run().assert_ok();
    let syncs = std::fs::read_to_string(&trace).unwrap().lines().filter(|l| l.starts_with("fdatasync(")).map(str::to_string).collect();
    let owners = store.owner_files();
    assert_eq!(owners.len(), 1, "{owners:?}");
    (syncs, is_symlink(&owners[0]))
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).unwrap().file_type().is_symlink()
}

#[test]
fn without_a_journal_the_ownership_is_a_file_synced_on_its_own() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "strace"]);
    let disk = mount::Mount::ext4("^has_journal");
    let (syncs, symlink) = add_on(&disk);
    assert!(!symlink, "a directory fsync does not write a new symlink's inode here");
    assert!(syncs.iter().any(|l| l.contains("/owners/")), "the ownership's own data sync: {syncs:#?}");
    assert!(syncs.iter().any(|l| l.contains("/records/")), "the record's data sync: {syncs:#?}");
}

#[test]
fn with_a_journal_add_makes_one_data_sync_and_the_ownership_a_symlink() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "strace"]);
    let disk = mount::Mount::ext4("has_journal");
    let (syncs, symlink) = add_on(&disk);
    assert!(symlink);
    assert_eq!(syncs.len(), 1, "{syncs:#?}");
    assert!(syncs[0].contains("/records/"), "{syncs:#?}");
}
