//! What ADD and DEL sync, on the file systems a node's /var/lib may be: nothing, in a store
//! scoped to the boot (docs/store.md), whatever the file system; records and ownerships are
//! plain files. Run under strace on loop-mounted ext4 with and without a journal, and XFS.
//! Stores of the releases before (symlink entries) are made here from this release's files,
//! as those releases wrote them, for the downgrade's tests.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Pod, Store, container_id};
use std::path::Path;

/// The syncs of an ADD and of a DEL (a second sandbox's ADD, which rewrites the ownership, and
/// its DEL), after a first ADD made the folders and marked the boot.
fn syncs_on(disk: &mount::Mount) -> Vec<String> {
    let (syncs, _) = add_with_routes_on(disk, 0);
    syncs
}

/// The default prevResult of `container`'s eth0 with `routes` routes more: each makes its
/// record 43 bytes longer.
fn result_with_routes(container: &str, routes: usize) -> serde_json::Value {
    let netns = cni::default_netns(container);
    let mut result = cni::prev_result_for(cni::LATEST_VERSION, container, "eth0", &netns);
    for n in 0..routes {
        result["routes"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!(
                {"dst": format!("10.{}.{}.0/24", n / 256, n % 256), "gw": "10.22.0.1"}
            ));
    }
    result
}

/// `syncs_on` with a prevResult of `routes` routes more; and the record's length.
fn add_with_routes_on(disk: &mount::Mount, routes: usize) -> (Vec<String>, usize) {
    let logs = sys::TempDir::new("sglogs");
    let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let pod = Pod::new("durable", "db-0");
    store.add(&container_id(), &pod).run().assert_ok();
    let b = container_id();
    let result = result_with_routes(&b, routes);
    let trace = logs.path.join("trace");
    let strace = sync_tracer(&trace);
    store
        .add(&b, &pod)
        .prev_result(&result)
        .wrapped_in(&strace)
        .run()
        .assert_ok();
    let mut syncs: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| format!("ADD: {l}"))
        .collect();
    let owners = store.owner_files();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let record = store.record_path(cni::NETWORK, &b, "eth0");
    for entry in [&record, &owners[0]] {
        assert!(!is_symlink(entry), "{entry:?} is a plain file");
        assert_eq!(cni::mode(entry), 0o600);
        cni::verify_envelope(entry).unwrap();
    }
    let full = std::fs::read(&record).unwrap().len();
    store.del(&b, &pod).wrapped_in(&strace).run().assert_ok();
    syncs.extend(
        std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .map(|l| format!("DEL: {l}")),
    );
    (syncs, full)
}

/// strace's arguments to log every sync call of the plugin and its children to `trace`.
fn sync_tracer(trace: &Path) -> [&str; 8] {
    [
        "strace",
        "-f",
        "-qq",
        "-y",
        "-e",
        "trace=fsync,fdatasync,sync,syncfs,sync_file_range",
        "-o",
        trace.to_str().unwrap(),
    ]
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_symlink()
}

/// A power cut is a new boot, whose first writer moves what this boot's ADDs and DELs wrote
/// aside: they sync nothing, on a journal or without one, with a record of any length.
#[test]
fn add_and_del_sync_nothing_on_any_file_system() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "mkfs.xfs", "strace"]);
    for disk in [
        mount::Mount::ext4("^has_journal"),
        mount::Mount::ext4("has_journal"),
        mount::Mount::image(&["mkfs.xfs", "-q", "-f"]),
    ] {
        let syncs = syncs_on(&disk);
        assert!(syncs.is_empty(), "{syncs:#?}");
    }
    let disk = mount::Mount::image(&["mkfs.xfs", "-q", "-f"]);
    let (syncs, full) = add_with_routes_on(&disk, 150);
    assert!(full > 4096, "{full} bytes");
    assert!(syncs.is_empty(), "{syncs:#?}");
}

/// The first writer of a boot marks the store as this boot's, durably, before its entries.
#[test]
fn the_first_writer_of_a_boot_makes_the_marker_durable_first() {
    sys::skip_unless_root!(&["strace"]);
    let store = Store::new();
    let logs = sys::TempDir::new("sgtrace");
    let trace = logs.path.join("trace");
    let strace = sync_tracer(&trace);
    store
        .add(&container_id(), &Pod::new("durable", "db-0"))
        .wrapped_in(&strace)
        .run()
        .assert_ok();
    let syncs: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The marker's data and the state dir, first; then only what outlives the boot: the
    // network's `podKey` marker (`pod-keys/`), which a first ADD writes.
    assert!(syncs.len() >= 2, "{syncs:#?}");
    let marker_tmp = format!("/state/.{}", syncs[0].split(' ').next().unwrap());
    assert!(
        syncs[0].contains(" fdatasync(") && syncs[0].contains(&marker_tmp),
        "{syncs:#?}"
    );
    assert!(
        syncs[1].contains(" fsync(") && syncs[1].ends_with("/state>) = 0"),
        "{syncs:#?}"
    );
    for sync in &syncs[2..] {
        assert!(
            sync.contains("/state/pod-keys") || sync.ends_with("/state>) = 0"),
            "{syncs:#?}"
        );
    }
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.state_dir.join("boot")).unwrap()).unwrap();
    assert_eq!(marker["formatVersion"], 2);
    assert_eq!(
        marker["bootId"].as_str().unwrap(),
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
    );
}

/// The longest names an ownership can hold (a pod name of 253 characters, a namespace of 63,
/// a container ID of 128), and one sandbox attached to the network under 40 interfaces of 15
/// characters: its ownership (the pod key has no ifname by default) lists them all, over 1 KiB,
/// past what XFS (1,023 bytes) or ext4 with 1 KiB blocks keeps as a symlink's target.
fn add_of_the_longest_names(disk: &mount::Mount) {
    let logs = sys::TempDir::new("sglogs");
    let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let pod = Pod::new(&"n".repeat(63), &"p".repeat(253));
    let container = "c".repeat(128);
    let interfaces: Vec<String> = (1..=40).map(|i| format!("net-interface{i:02}")).collect();
    for ifname in &interfaces {
        store.add(&container, &pod).ifname(ifname).run().assert_ok();
    }
    assert!(store.is_owner(&container, &interfaces[39]));
    let stale = store.del(&"d".repeat(128), &pod).run();
    assert!(stale.stdout.contains("\"code\":11"), "{stale:?}");
    for ifname in &interfaces {
        store.del(&container, &pod).ifname(ifname).run().assert_ok();
    }
    assert!(store.owner_files().is_empty());
}

#[test]
fn an_ownership_of_the_longest_names_is_written_on_xfs() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.xfs"]);
    let disk = mount::Mount::image(&["mkfs.xfs", "-q", "-f"]);
    add_of_the_longest_names(&disk);
}

#[test]
fn an_ownership_of_the_longest_names_is_written_on_ext4_with_small_blocks() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4"]);
    let disk = mount::Mount::image(&["mkfs.ext4", "-q", "-F", "-b", "1024"]);
    add_of_the_longest_names(&disk);
}

/// Where a new record cannot be linked in from an unnamed file (no O_TMPFILE on overlayfs
/// before 6.6 or NFS, no CAP_DAC_READ_SEARCH for linkat's AT_EMPTY_PATH in a container), ADD
/// writes it through a temp file as a rewrite does: it succeeds, whole, with nothing left over.
/// The records are too long for a symlink, so they are files on a journal too.
#[test]
fn add_without_an_unnamed_file_to_link_writes_the_record_through_a_temp_file() {
    sys::skip_unless_root!(&["strace"]);
    let store = Store::new();
    let pod = Pod::new("tmpfile", "db-0");
    let (a, b) = (container_id(), container_id());
    let logs = sys::TempDir::new("sgtrace");
    let trace = logs.path.join("trace");
    for (container, error) in [(&a, "EOPNOTSUPP"), (&b, "ENOENT")] {
        let inject = format!("inject=linkat:error={error}");
        let strace = [
            "strace",
            "-f",
            "-qq",
            "-o",
            trace.to_str().unwrap(),
            "-e",
            "trace=linkat",
            "-e",
            &inject,
        ];
        store
            .add(container, &pod)
            .prev_result(&result_with_routes(container, 150))
            .wrapped_in(&strace)
            .run()
            .assert_ok();
        let traced = std::fs::read_to_string(&trace).unwrap();
        assert!(traced.contains("(INJECTED)"), "no linkat refused: {traced}");
    }
    assert!(store.is_owner(&b, "eth0"));
    store.del(&a, &pod).run().assert_error(11);
    store.assert_every_owner_has_its_record();
    let records = cni::files_in(&store.state_dir.join("records"));
    assert_eq!(records.len(), 2, "a temp file left behind? {records:?}");
    for record in &records {
        cni::verify_envelope(record).unwrap();
    }
}

/// Releases before the symlink form refuse a symlink in the state dir, on every ADD and DEL of
/// its pod, and say to remove it, which would drop the pod's owner (releases before records
/// took it, a record that is one); the release before the pod
/// key reads owners only under its own keys. scripts/downgrade-owners.sh (this release's
/// `--downgrade`) moves them there and writes them as the regular files that release reads.
/// A store on a journaled ext4 (its disk and log dir, held by the caller) with two sandboxes
/// of one pod added, the second owning it.
fn two_sandboxes_on_a_journal() -> (mount::Mount, sys::TempDir, Store, Pod, String, String) {
    let disk = mount::Mount::ext4("has_journal");
    let logs = sys::TempDir::new("sglogs");
    let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let pod = Pod::new("down", "db-0");
    let (a, b) = (container_id(), container_id());
    store.add(&a, &pod).run().assert_ok();
    store.add(&b, &pod).run().assert_ok();
    as_the_release_before_wrote_it(&store.state_dir);
    (disk, logs, store, pod, a, b)
}

/// Turns this release's files into the symlink entries the release before wrote on a journal:
/// ownerships and address index entries hold their sealed text as a target, records theirs
/// compacted; none carries a format version.
fn as_the_release_before_wrote_it(state_dir: &Path) {
    for dir in ["owners", "ips", "records"] {
        for path in cni::files_in(&state_dir.join(dir)) {
            let text = String::from_utf8(std::fs::read(&path).unwrap()).unwrap();
            let text = text.replacen("\"formatVersion\":2,", "", 1);
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink("{}", &path).unwrap();
            cni::write_entry_like(&path, text.as_bytes());
            assert!(is_symlink(&path));
            cni::verify_envelope(&path).unwrap();
        }
    }
}

#[test]
fn the_downgrade_script_turns_every_symlink_back_into_the_file_of_the_release_before() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "flock"]);
    let (_disk, _logs, store, pod, a, b) = two_sandboxes_on_a_journal();
    let owner = store.owner_files().pop().unwrap();
    assert!(is_symlink(&owner), "the new form, to be turned back");
    let record = store.record_path(cni::NETWORK, &b, "eth0");
    assert!(is_symlink(&record), "the new form, to be turned back");
    let planted = store.state_dir.join("owners").join("planted");
    std::os::unix::fs::symlink("/etc/hostname", &planted).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/downgrade-owners.sh");
    sys::run(
        "sh",
        &[script, store.state_dir.to_str().unwrap(), cni::bin()],
    );
    assert!(
        is_symlink(&planted),
        "a link the store did not write is left alone"
    );
    std::fs::remove_file(&planted).unwrap();
    let owners = cni::files_in(&store.state_dir.join("owners"));
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert!(!is_symlink(owner));
    assert_eq!(cni::mode(owner), 0o600);
    // The text that release wrote: a sealed record keyed by ifname, newline-terminated.
    let record = cni::verify_envelope(owner).unwrap();
    assert_eq!(
        (record["ifName"].as_str(), record["containerId"].as_str()),
        (Some("eth0"), Some(b.as_str()))
    );
    assert!(std::fs::read(owner).unwrap().ends_with(b"}\n"));
    for record in cni::files_in(&store.state_dir.join("records")) {
        assert!(!is_symlink(&record), "{record:?}");
        assert_eq!(cni::mode(&record), 0o600);
        cni::verify_envelope(&record).unwrap();
    }
    store.del(&a, &pod).run().assert_error(11);
    store.del(&b, &pod).run().assert_ok();
}

/// A release before the record's symlink form cannot open a record that is one, and its GC
/// moves each it finds to `set-aside/` as damaged (a rename), where it refuses its DELs: the
/// downgrade puts every such record, which still verifies, back as the file that release reads.
#[test]
fn the_downgrade_puts_back_the_records_an_older_release_set_aside() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4"]);
    let (_disk, _logs, store, pod, a, b) = two_sandboxes_on_a_journal();
    let set_aside = store.state_dir.join("set-aside");
    let record_of = |container: &str| store.record_path(cni::NETWORK, container, "eth0");
    assert!(is_symlink(&record_of(&a)) && is_symlink(&record_of(&b)));
    std::fs::rename(
        record_of(&b),
        set_aside.join(record_of(&b).file_name().unwrap()),
    )
    .unwrap();
    // As a downgrade killed between putting a record back and removing its copy leaves it.
    std::fs::hard_link(
        record_of(&a),
        set_aside.join(record_of(&a).file_name().unwrap()),
    )
    .unwrap();

    let said = sys::run(
        cni::bin(),
        &[
            "--downgrade",
            "--state-dir",
            store.state_dir.to_str().unwrap(),
        ],
    );
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("entries rewritten"), "{said}");
    assert!(
        cni::files_in(&set_aside).is_empty(),
        "{:?}",
        cni::files_in(&set_aside)
    );
    for container in [&a, &b] {
        let record = record_of(container);
        assert!(!is_symlink(&record), "{record:?}");
        assert_eq!(cni::mode(&record), 0o600);
        cni::verify_envelope(&record).unwrap();
    }
    store.assert_every_owner_has_its_record();
    assert!(store.is_owner(&b, "eth0"));
    store.del(&a, &pod).run().assert_error(11);
    store.del(&b, &pod).run().assert_ok();
}

/// A symlink planted where an ownership goes, pointing elsewhere, is refused as every symlink
/// in the state dir always was, never followed, and the error says what it is and how out
/// (it said "cannot read checkpoint" of an ownership, with no details).
#[test]
fn a_planted_symlink_for_an_ownership_is_refused_with_its_way_out() {
    let store = Store::new();
    let pod = Pod::new("planted", "db-0");
    let a = container_id();
    store.add(&a, &pod).run().assert_ok();
    let owner = store.owner_files().pop().unwrap();
    std::fs::remove_file(&owner).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &owner).unwrap();
    let refused = store.del(&container_id(), &pod).run().assert_error(5);
    let text = refused.text();
    assert!(
        text.contains("symbolic link")
            && text.contains("/etc/hostname")
            && !text.contains("checkpoint"),
        "{text}"
    );
    assert!(text.contains("remove the link"), "no way out: {text}");
    assert!(is_symlink(&owner));
}

/// What `--doctor` and the installer say of a state dir on `disk` (made there by an ADD, or
/// not yet, as before a node's first pod): the doctor's store-journal finding, `--install`'s
/// warnings and `--install --check`'s lines.
fn said_of_journal(disk: &mount::Mount, made: bool) -> (String, String, String) {
    let logs = sys::TempDir::new("sglogs");
    let state_dir = disk.path.join(if made { "state" } else { "not-yet" });
    if made {
        let store = Store::with_state_dir(state_dir.clone(), &logs.path);
        store
            .add(&container_id(), &Pod::new("journal", "web-0"))
            .run()
            .assert_ok();
    }
    let state = state_dir.to_str().unwrap();
    let node = sys::TempDir::new("sgjournal");
    let (conf, bin) = (node.path.join("net.d"), node.path.join("bin"));
    std::fs::create_dir_all(&conf).unwrap();
    install::copy_fixture("install/calico/conf", &conf);
    install::stub_plugins(&conf, &bin);
    let doctor = cni::guard(&[
        "--doctor",
        "--output",
        "json",
        "--conf-dir",
        conf.to_str().unwrap(),
        "--state-dir",
        state,
    ]);
    let findings: serde_json::Value = serde_json::from_slice(&doctor.stdout)
        .unwrap_or_else(|e| panic!("--doctor did not answer JSON ({e}): {doctor:?}"));
    let journal: Vec<String> = findings["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings in {findings}"))
        .iter()
        .filter(|f| f["check"] == "store-journal")
        .map(|f| f.to_string())
        .collect();
    let installed = install::run("--install", &conf, &bin, &["--state-dir", state]);
    assert!(installed.status.success(), "{installed:?}");
    let check = install::run("--install", &conf, &bin, &["--check"]);
    assert!(check.status.success(), "{check:?}");
    (
        journal.join("\n"),
        String::from_utf8_lossy(&installed.stderr).into_owned(),
        String::from_utf8_lossy(&check.stdout).into_owned(),
    )
}

#[test]
fn the_doctor_and_the_installer_warn_of_a_state_dir_without_a_journal() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4"]);
    let disk = mount::Mount::ext4("^has_journal");
    for made in [true, false] {
        let (doctor, install, check) = said_of_journal(&disk, made);
        let context = format!("state dir made: {made}");
        assert!(
            doctor.contains("\"warning\"")
                && doctor.contains("without a journal")
                && doctor.contains("deferred DELs can be lost")
                && doctor.contains("63 acknowledged ADDs")
                && doctor.contains("journal_task reads <none>")
                && doctor.contains("tune2fs -O has_journal"),
            "{context}: {doctor}"
        );
        for said in [&install, &check] {
            assert!(
                said.contains("warning: the state dir")
                    && said.contains("without a journal")
                    && said.contains("power cut"),
                "{context}: {said}"
            );
        }
    }
}

#[test]
fn with_a_journal_neither_the_doctor_nor_the_installer_warns() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4", "mkfs.xfs"]);
    for disk in [
        mount::Mount::ext4("has_journal"),
        mount::Mount::image(&["mkfs.xfs", "-q", "-f"]),
    ] {
        let (doctor, install, check) = said_of_journal(&disk, true);
        assert!(
            doctor.contains("\"ok\"") && doctor.contains("on a journaled file system"),
            "{doctor}"
        );
        assert!(!install.contains("without a journal"), "{install}");
        assert!(!check.contains("without a journal"), "{check}");
    }
}

/// ext4 with its journal but mounted `nobarrier` (or `barrier=0`): jbd2 then sends the drive
/// no cache flush, so on a drive with a volatile write cache a power cut can lose or reorder
/// what the journal committed, acknowledged ADDs with it. The doctor and the installer must
/// not call that journaled and safe.
#[test]
fn the_doctor_and_the_installer_warn_of_a_journal_mounted_without_barriers() {
    sys::skip_unless_root!(&["mount", "umount", "mkfs.ext4"]);
    let disk = mount::Mount::ext4("has_journal");
    sys::run(
        "mount",
        &["-o", "remount,nobarrier", disk.path.to_str().unwrap()],
    );
    let (doctor, install, check) = said_of_journal(&disk, true);
    assert!(
        doctor.contains("\"warning\"") && doctor.contains("nobarrier"),
        "{doctor}"
    );
    for said in [&install, &check] {
        assert!(
            said.contains("warning: the state dir") && said.contains("nobarrier"),
            "{said}"
        );
    }
}
