//! The store lives as long as what it describes: one boot's records and owners. A new boot is
//! played by bind-mounting another id over `/proc/sys/kernel/random/boot_id` in a mount
//! namespace of the plugin's own (the kernel's file, read as the plugin reads it).

#[path = "support/cni.rs"]
mod cni;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{BIN, Cni, Pod, Store, container_id};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A boot id of the test's own, in a file to bind-mount over the kernel's.
struct Boot {
    id: String,
    file: PathBuf,
    _dir: sys::TempDir,
}

impl Boot {
    fn new(n: u8) -> Boot {
        let dir = sys::TempDir::new("sgboot");
        let id = format!("{n:08x}-0000-4000-8000-{:012x}", std::process::id());
        let file = dir.path.join("boot_id");
        std::fs::write(&file, format!("{id}\n")).unwrap();
        Boot {
            id,
            file,
            _dir: dir,
        }
    }

    /// `command`'s program and arguments run under this boot id.
    fn wrapper(&self) -> Vec<String> {
        vec![
            "/usr/bin/unshare".into(),
            "-m".into(),
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "/usr/bin/mount --bind {} /proc/sys/kernel/random/boot_id && exec \"$@\"",
                self.file.display()
            ),
            "sh".into(),
        ]
    }

    fn cni(&self, cni: Cni) -> Cni {
        let wrapper = self.wrapper();
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        cni.wrapped_in(&wrapper)
    }

    /// The operator's command `args` (the plugin hands them to the ctl beside it).
    fn guard(&self, args: &[&str]) -> std::process::Output {
        let wrapper = self.wrapper();
        Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .arg(BIN)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap()
    }

    /// Whether the dump, read in this boot, shows `container`'s eth0 as its pod's owner.
    fn is_owner(&self, store: &Store, container: &str) -> bool {
        self.dump(&store.state_dir)
            .iter()
            .any(|r| r["containerId"] == container && r["ifName"] == "eth0" && r["owner"] == true)
    }

    fn dump(&self, state_dir: &Path) -> Vec<serde_json::Value> {
        let out = self.guard(&[
            "--dump-checkpoints",
            "--state-dir",
            state_dir.to_str().unwrap(),
            "--output",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn marker(state_dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(state_dir.join("boot")).unwrap()).unwrap()
}

/// After a reboot the old sandbox's owner is dead: kubelet's StopPodSandbox of it (a DEL with
/// an empty netns) reaches the primary, which holds only that sandbox's state, and the
/// first writer moved the old boot's folders aside. The new sandbox then owns the pod, and
/// the container GC's later DEL of the old one is judged against it: refused, as stale.
#[test]
fn a_new_boot_moves_the_old_boots_owners_aside_and_judges_later_dels_by_its_own() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let (before, after) = (Boot::new(1), Boot::new(2));
    let store = Store::new();
    let pod = Pod::new("db", "etcd-0");
    let (old, new) = (container_id(), container_id());
    before.cni(store.add(&old, &pod)).run().assert_ok();
    assert_eq!(marker(&store.state_dir)["bootId"], before.id.as_str());
    let owner = &store.owner_files()[0];
    let text = std::fs::read(owner).unwrap();
    assert!(
        std::fs::symlink_metadata(owner).unwrap().is_file(),
        "an ownership is a plain file, read with jq"
    );
    let sealed: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(sealed["formatVersion"], 2);
    assert_eq!(sealed["record"]["bootId"], before.id.as_str());

    // Read in the new boot before any verb: the dump shows the record as the old boot's,
    // and reading moves nothing.
    let rows = after.dump(&store.state_dir);
    let row = rows
        .iter()
        .find(|r| r["containerId"] == old.as_str())
        .unwrap();
    assert_eq!(row["status"], "previous-boot", "{row}");
    assert!(store.record_path(cni::NETWORK, &old, "eth0").exists());
    assert_eq!(marker(&store.state_dir)["bootId"], before.id.as_str());

    // The old sandbox's DEL after the reboot: its owner is dead, so it passes.
    after.cni(store.del(&old, &pod).netns("")).run().assert_ok();
    assert_eq!(marker(&store.state_dir)["bootId"], after.id.as_str());
    let aside = store.state_dir.join("previous-boot").join(&before.id);
    assert!(aside.join("owners").is_dir() && aside.join("records").is_dir());
    assert!(store.owner_files().is_empty());

    // The new sandbox takes the pod; the GC's repeat of the old DEL is stale.
    after.cni(store.add(&new, &pod)).run().assert_ok();
    after
        .cni(store.del(&old, &pod).netns(""))
        .run()
        .assert_error(11);
    assert!(after.is_owner(&store, &new));
}

/// What a power cut can leave of an ownership written without a sync: its name without its
/// data. In the next boot it is the old boot's and refuses nothing: the old sandbox's DEL
/// passes and the pod can start again. The control reads the same torn file as a store not
/// scoped to the boot reads it (the boot unchanged): every DEL of the pod is refused as
/// untrusted (code 101), the outage the scope prevents.
#[test]
fn an_ownership_torn_by_a_power_cut_blocks_nothing_in_the_next_boot() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let pod = Pod::new("db", "etcd-0");
    for next_boot in [true, false] {
        let (before, after) = (Boot::new(9), Boot::new(10));
        let after = if next_boot { &after } else { &before };
        let store = Store::new();
        let old = container_id();
        before.cni(store.add(&old, &pod)).run().assert_ok();
        std::fs::write(&store.owner_files()[0], b"").unwrap();
        let reply = after.cni(store.del(&old, &pod).netns("")).run();
        match next_boot {
            true => {
                reply.assert_ok();
            }
            false => {
                reply.assert_error(101);
            }
        }
    }
}

/// Within one boot nothing moves, and a stale DEL is refused as before.
#[test]
fn within_one_boot_nothing_moves_and_the_owner_stays() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let boot = Boot::new(3);
    let store = Store::new();
    let pod = Pod::new("db", "etcd-0");
    let (a, b) = (container_id(), container_id());
    boot.cni(store.add(&a, &pod)).run().assert_ok();
    boot.cni(store.add(&b, &pod)).run().assert_ok();
    boot.cni(store.del(&a, &pod).netns(""))
        .run()
        .assert_error(11);
    assert!(!store.state_dir.join("previous-boot").exists());
    assert!(boot.is_owner(&store, &b));
}

/// A store of a release before the marker (its files written durably, no boot named in them)
/// is adopted as this boot's: an upgrade in place keeps every owner, and its stale DEL is
/// still refused.
#[test]
fn a_store_without_a_marker_is_adopted_with_its_owners() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let boot = Boot::new(4);
    let store = Store::from_fixture("state-previous-release-owners");
    let pod = Pod::new("migrate", "db-0");
    boot.cni(store.del(&"a".repeat(64), &pod).netns(""))
        .run()
        .assert_error(11);
    assert_eq!(marker(&store.state_dir)["bootId"], boot.id.as_str());
    assert!(!store.state_dir.join("previous-boot").exists());
    assert!(boot.is_owner(&store, &"b".repeat(64)));
}

/// An ownership copied in from another boot's store names that boot: its sandbox has ended,
/// so it refuses nothing.
#[test]
fn an_owner_that_names_another_boot_refuses_nothing() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let (boot, other) = (Boot::new(6), Boot::new(7));
    let (copied, store) = (Store::new(), Store::new());
    let pod = Pod::new("db", "etcd-0");
    let (a, b) = (container_id(), container_id());
    other.cni(copied.add(&b, &pod)).run().assert_ok();
    boot.cni(store.add(&a, &pod)).run().assert_ok();
    let owner = store.owner_files().remove(0);
    std::fs::copy(&copied.owner_files()[0], &owner).unwrap();
    boot.cni(store.del(&a, &pod).netns("")).run().assert_ok();
}

/// In a store scoped to the boot, ADD and DEL make no sync at all: a power cut is a new boot,
/// and its first writer moves what they wrote aside.
#[test]
fn add_and_del_make_no_sync() {
    sys::skip_unless_root!(&["unshare", "mount", "strace"]);
    let boot = Boot::new(8);
    let store = Store::new();
    let pod = Pod::new("db", "etcd-0");
    let (a, b) = (container_id(), container_id());
    // The first verb of the boot marks the store, durably.
    boot.cni(store.add(&a, &pod)).run().assert_ok();
    let logs = sys::TempDir::new("sgstrace");
    let trace = logs.path.join("trace");
    for (n, verb) in [store.add(&b, &pod), store.del(&b, &pod)]
        .into_iter()
        .enumerate()
    {
        let trace = trace.with_extension(n.to_string());
        let mut wrapper = boot.wrapper();
        wrapper.extend(
            [
                "/usr/bin/strace",
                "-f",
                "-qq",
                "-e",
                "trace=fsync,fdatasync,sync,syncfs,sync_file_range",
                "-o",
                trace.to_str().unwrap(),
            ]
            .map(String::from),
        );
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        verb.wrapped_in(&wrapper).run().assert_ok();
        let syncs = std::fs::read_to_string(&trace).unwrap();
        assert!(syncs.trim().is_empty(), "{}: {syncs}", ["ADD", "DEL"][n]);
    }
}
