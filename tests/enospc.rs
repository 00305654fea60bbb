//! A full /var/lib: the ADD must fail as an I/O error that says where and why, leave no partial
//! checkpoint behind, and work again as soon as there is room.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Pod, Store, container_id};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Writes `path` until the filesystem refuses with ENOSPC.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 4096];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(28) || e.kind() == ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

/// A state dir on a small tmpfs, the log file elsewhere (logging is not what should fail).
struct SmallDisk {
    store: Store,
    disk: mount::Mount,
    _logs: sys::TempDir,
}

impl SmallDisk {
    fn new() -> SmallDisk {
        let logs = sys::TempDir::new("sglogs");
        let disk = mount::Mount::tmpfs("size=256k,mode=0755");
        let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
        SmallDisk {
            store,
            disk,
            _logs: logs,
        }
    }

    /// Fills the disk; removing the returned file frees it again.
    fn fill(&self) -> PathBuf {
        let filler = self.disk.path.join("filler");
        fill(&filler);
        filler
    }
}

#[test]
fn add_on_a_full_state_dir_fails_with_5_and_leaves_nothing_behind() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let small_disk = SmallDisk::new();
    let store = &small_disk.store;
    let pod = Pod::new("default", "web-0");
    let leaving_pod = Pod::new("default", "web-1");
    let [settled, leaving, blocked] = std::array::from_fn(|_| container_id());
    store.add(&settled, &pod).run().assert_ok();
    store.add(&leaving, &leaving_pod).run().assert_ok();

    let filler = small_disk.fill();
    let before = store.snapshot();
    let error = store.add(&blocked, &pod).run().assert_error(5);
    let text = error.text();
    assert!(
        text.to_lowercase().contains("no space"),
        "the message must say the disk is full: {error:?}"
    );
    assert!(
        text.contains(store.state_dir.to_str().unwrap()),
        "the message must name the state dir: {error:?}"
    );
    // Only the note that this ADD failed, so that its cleanup DEL is not taken for a stale one.
    let mut after = store.snapshot();
    let note = std::path::PathBuf::from(format!("failed-adds/{}:{blocked}:eth0", cni::NETWORK));
    // The note holds no data (a full disk has no block for it): its length alone, a hole,
    // carries the generation counter at the failure.
    let noted = after.remove(&note);
    assert!(
        noted
            .as_ref()
            .is_some_and(|bytes| bytes.iter().all(|b| *b == 0)),
        "the failed ADD is noted in a file without data: {noted:?} {after:?}"
    );
    assert_eq!(
        after, before,
        "no temp file, no record, no ownership change"
    );
    assert!(store.is_owner(&settled, "eth0"));
    // The node must stop getting pods while ADDs cannot be recorded...
    store.cni("STATUS", "").run().assert_error(50);
    // ...but pods must still be torn down: a DEL only removes files.
    store.del(&leaving, &leaving_pod).run().assert_ok();

    std::fs::remove_file(&filler).unwrap();
    store.cni("STATUS", "").run().assert_ok();
    store.add(&blocked, &pod).run().assert_ok();
    assert!(store.is_owner(&blocked, "eth0"));
    assert!(store.entry(&settled, "eth0").is_some());
}

#[test]
fn an_add_that_failed_is_not_logged_as_added() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let small_disk = SmallDisk::new();
    let store = &small_disk.store;
    let pod = Pod::new("default", "web-0");
    let (settled, blocked) = (container_id(), container_id());
    store.add(&settled, &pod).run().assert_ok();
    small_disk.fill();
    store.add(&blocked, &pod).run().assert_error(5);

    let outcomes: Vec<cni::Outcome> = store
        .log_lines()
        .into_iter()
        .filter(|l| l.container == blocked)
        .map(|l| l.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [cni::Outcome::Error],
        "whoever reads the log must not see this pod as added"
    );
}

#[test]
fn the_cleanup_del_of_an_add_that_failed_on_a_full_disk_passes() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let small_disk = SmallDisk::new();
    let store = &small_disk.store;
    let (pod_settled, pod_new) = (Pod::new("default", "web-0"), Pod::new("default", "web-0"));
    let (settled, failed) = (container_id(), container_id());
    store.add(&settled, &pod_settled).run().assert_ok();
    small_disk.fill();
    store.add(&failed, &pod_new).run().assert_error(5);
    // The runtime tears the sandbox down at once, the disk still full: it never owned the pod.
    store.del(&failed, &pod_new).run().assert_ok();
    assert!(store.is_owner(&settled, "eth0"), "the owner keeps its pod");
}
