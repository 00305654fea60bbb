//! The store lives as long as what it describes: one boot's records and owners. A new boot is
//! played by bind-mounting another id over `/proc/sys/kernel/random/boot_id` in a mount
//! namespace of the plugin's own (the kernel's file, read as the plugin reads it).

#[path = "support/boot.rs"]
mod boot;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use boot::Boot;
use cni::{Pod, Store, container_id};
use std::path::Path;

fn marker_of(state_dir: &Path) -> serde_json::Value {
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
    assert_eq!(marker_of(&store.state_dir)["bootId"], before.id.as_str());
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
    assert_eq!(marker_of(&store.state_dir)["bootId"], before.id.as_str());

    // The old sandbox's DEL after the reboot: its owner is dead, so it passes.
    after.cni(store.del(&old, &pod).netns("")).run().assert_ok();
    assert_eq!(marker_of(&store.state_dir)["bootId"], after.id.as_str());
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

/// An ownership whose record is gone (removed by hand) is shown as its boot's too once that
/// boot has ended, in both outputs, and the table counts it as no checkpoint. The control is
/// the same store read in its own boot: an owner without a record.
#[test]
fn the_dump_shows_an_ended_boots_ownership_without_its_record_as_ended() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let (before, after) = (Boot::new(1), Boot::new(2));
    let store = Store::new();
    let old = container_id();
    before
        .cni(store.add(&old, &Pod::new("db", "etcd-0")))
        .run()
        .assert_ok();
    std::fs::remove_file(store.record_path(cni::NETWORK, &old, "eth0")).unwrap();

    let doctor = |boot: &Boot| {
        let findings = cni::doctor_findings(&store.state_dir, &[], |args| boot.guard(args));
        let owners = findings.iter().find(|f| f["check"] == "store-owners");
        owners
            .cloned()
            .unwrap_or_else(|| panic!("no store-owners: {findings:?}"))
    };

    let same_boot = before.dump(&store.state_dir);
    assert_eq!(same_boot.len(), 1, "{same_boot:?}");
    assert_eq!(same_boot[0]["status"], "owner-without-record");
    let warned = doctor(&before);
    assert_eq!(warned["severity"], "warning", "{warned}");

    let rows = after.dump(&store.state_dir);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["containerId"], old.as_str());
    assert_eq!(rows[0]["status"], "previous-boot", "{}", rows[0]);
    let table = after.guard(&[
        "--dump-checkpoints",
        "--state-dir",
        store.state_dir.to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|row| row.starts_with("db/etcd-0") && row.trim_end().ends_with(" previous-boot"))
            && table.contains("0 checkpoints, 0 owning their pod name (*), 0 not trusted")
            && table.contains("1 entry is of a sandbox that ended with an earlier boot"),
        "{table}"
    );
    let ok = doctor(&after);
    assert_eq!(ok["severity"], "ok", "{ok}");
}

/// What a power cut can leave of an ownership written without a sync: its name without its
/// data. In the next boot it is the old boot's and refuses nothing: the old sandbox's DEL
/// passes and the pod can start again. The control reads the same torn file as a store not
/// scoped to the boot reads it (the boot unchanged): every DEL of the pod is refused as
/// untrusted (code 101), the outage the scope prevents.
#[test]
fn an_ownership_torn_by_a_power_cut_blocks_nothing_in_the_next_boot() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    torn_ownership_then_its_del(false);
}

/// An old sandbox's DEL after its ownership was torn as a power cut leaves an unsynced one
/// (its name without its data), with the state dir `read_only` then: in the next boot it
/// passes; read in the same boot (what a store not scoped to the boot sees) it is refused as
/// untrusted, code 101, the control.
fn torn_ownership_then_its_del(read_only: bool) {
    let pod = Pod::new("db", "etcd-0");
    for next_boot in [true, false] {
        let (before, after) = (Boot::new(9), Boot::new(10));
        let after = if next_boot { &after } else { &before };
        let store = Store::new();
        let old = container_id();
        before.cni(store.add(&old, &pod)).run().assert_ok();
        std::fs::write(&store.owner_files()[0], b"").unwrap();
        let _read_only = read_only.then(|| mount::Mount::read_only_bind(&store.state_dir));
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
    assert_eq!(marker_of(&store.state_dir)["bootId"], boot.id.as_str());
    assert!(!store.state_dir.join("previous-boot").exists());
    assert!(boot.is_owner(&store, &"b".repeat(64)));
    // Stamped with this boot, so that an owner under the marker that names none is always
    // one a release without boots wrote.
    for owner in store.owner_files() {
        let sealed = cni::verify_envelope(&owner).unwrap();
        assert_eq!(sealed["bootId"], boot.id.as_str(), "{owner:?}");
    }
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

/// In a store scoped to the boot, ADD and DEL make no sync at all, nor does a refused stale
/// DEL (its ledger entry is history): a power cut is a new boot, and its first writer moves
/// what they wrote aside.
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
    // b's ADD, a's stale DEL (refused, counted in the ledger), b's DEL.
    let verbs = [
        ("ADD", store.add(&b, &pod), None),
        ("stale DEL", store.del(&a, &pod), Some(11)),
        ("DEL", store.del(&b, &pod), None),
    ];
    for (n, (what, verb, refused)) in verbs.into_iter().enumerate() {
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
        let reply = verb.wrapped_in(&wrapper).run();
        match refused {
            Some(code) => {
                reply.assert_error(code);
            }
            None => {
                reply.assert_ok();
            }
        }
        let syncs = std::fs::read_to_string(&trace).unwrap();
        assert!(syncs.trim().is_empty(), "{what}: {syncs}");
    }
}

/// A state dir that takes no write in the new boot (read-only after an error, full) cannot be
/// marked: a DEL then reads the live folders as the previous boot's, whose sandboxes have all
/// ended and whose files may be torn. The old sandbox's DEL passes; with the boot unchanged
/// the same torn ownership refuses it (code 101).
#[test]
fn a_read_only_state_dir_in_the_next_boot_judges_by_no_torn_file() {
    sys::skip_unless_root!(&["unshare", "mount", "umount"]);
    torn_ownership_then_its_del(true);
}

/// A release that knows no boot writes owners without one. Gone back to without
/// `--downgrade` (the marker stays) and rebooted, it files live owners under a marker that
/// names an earlier boot: when this release comes back, those come back from the move with
/// their records, and the stale DEL is still refused. The control: the same store adopted by
/// this release first (which stamps its owners with that boot), then rebooted: they go aside.
#[test]
fn owners_a_release_without_boots_wrote_under_the_marker_stay_live() {
    sys::skip_unless_root!(&["unshare", "mount"]);
    let (earlier, now) = (Boot::new(13), Boot::new(14));
    let pod = Pod::new("migrate", "db-0");
    for written_by_a_release_without_boots in [true, false] {
        let store = Store::from_fixture("state-previous-release-owners");
        if written_by_a_release_without_boots {
            std::fs::write(
                store.state_dir.join("boot"),
                format!("{{\"formatVersion\":2,\"bootId\":\"{}\"}}\n", earlier.id),
            )
            .unwrap();
        } else {
            let web = Pod::new("migrate", "web-1");
            earlier
                .cni(store.add(&container_id(), &web))
                .run()
                .assert_ok();
        }
        let reply = now.cni(store.del(&"a".repeat(64), &pod).netns("")).run();
        match written_by_a_release_without_boots {
            true => {
                reply.assert_error(11);
                assert!(now.is_owner(&store, &"b".repeat(64)));
            }
            false => {
                reply.assert_ok();
            }
        }
        assert!(
            store
                .state_dir
                .join("previous-boot")
                .join(&earlier.id)
                .is_dir()
        );
        assert_eq!(marker_of(&store.state_dir)["bootId"], now.id.as_str());
    }
}

/// Where no boot id can be read, nothing is scoped: every write is made durable, the record's
/// data and the ownership's, then each directory changed, in the order changed.
#[test]
fn without_a_boot_id_add_makes_every_write_durable() {
    sys::skip_unless_root!(&["unshare", "mount", "strace"]);
    let store = Store::new();
    let pod = Pod::new("db", "etcd-0");
    let logs = sys::TempDir::new("sgstrace");
    let trace = logs.path.join("trace");
    let wrapper = [
        "/usr/bin/unshare",
        "-m",
        "/bin/sh",
        "-c",
        "/usr/bin/mount --bind /dev/null /proc/sys/kernel/random/boot_id && exec \"$@\"",
        "sh",
        "/usr/bin/strace",
        "-f",
        "-qq",
        "-y",
        "-e",
        "trace=fsync,fdatasync",
        "-o",
        trace.to_str().unwrap(),
    ];
    store
        .add(&container_id(), &pod)
        .wrapped_in(&wrapper)
        .run()
        .assert_ok();
    store
        .add(&container_id(), &pod)
        .wrapped_in(&wrapper)
        .run()
        .assert_ok();
    let syncs = std::fs::read_to_string(&trace).unwrap();
    let at = |what: &str| {
        syncs
            .lines()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what}: {syncs}"))
    };
    let (record_data, owner_data, records_dir, owners_dir) = (
        at("/state/records/"),
        at("/state/owners/."),
        at("/state/records>"),
        at("/state/owners>"),
    );
    assert!(
        record_data < owner_data && owner_data < records_dir && records_dir < owners_dir,
        "{syncs}"
    );
    assert!(!store.state_dir.join("boot").exists());
}
