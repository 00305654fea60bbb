//! A node can lose the plugin at any instruction (OOM killer, kubelet timeout, power): SIGKILL
//! execs at random moments and show that what stays on disk is always readable and
//! consistent, and that the plugin carries on from it.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Cni, NETWORK, Pod, Store, Traced, Workload, container_id, files_in, verify_envelope};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

const WORKLOAD: Workload = Workload {
    workers: 2,
    ops_per_worker: 200,
    seed: 0xc4a5_4e11,
};
const PODS: usize = 3;
const SANDBOXES: usize = 9;
/// Kills land anywhere from before exec to after exit.
const MAX_KILL_DELAY_MICROS: u64 = 3000;

struct Sandbox {
    container: String,
    pod: Pod,
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn sigkill_at_random_moments_leaves_a_consistent_store() {
    let store = Store::new();
    let sandboxes: Vec<Sandbox> = (0..SANDBOXES)
        .map(|i| Sandbox {
            container: container_id(),
            pod: Pod::new("crash", &format!("db-{}", i % PODS)),
        })
        .collect();
    let started = Instant::now();

    let outcomes = WORKLOAD.run(|rng| {
        let Sandbox { container, pod } = &sandboxes[rng.below(SANDBOXES as u64) as usize];
        let call = match rng.below(5) {
            0 | 1 => store.cni("ADD", container).pod(pod),
            2 | 3 => store.cni("DEL", container).pod(pod),
            // GC, as a CNI 1.1 runtime sends it, listing a random half.
            _ => {
                let valid: Vec<serde_json::Value> = sandboxes
                    .iter()
                    .filter(|_| rng.below(2) == 0)
                    .map(|s| serde_json::json!({"containerID": s.container, "ifname": "eth0"}))
                    .collect();
                store.cni("GC", "").config(
                    "cni.dev/valid-attachments",
                    Some(serde_json::Value::Array(valid)),
                )
            }
        };
        let mut running = call.spawn();
        std::thread::sleep(Duration::from_micros(rng.below(MAX_KILL_DELAY_MICROS)));
        let was_killed = running.kill();
        let reply = running.wait();
        let killed = was_killed && reply.status.signal().is_some();
        if !killed && !reply.succeeded() {
            reply.assert_error(11);
        }
        killed
    });
    let killed = outcomes.iter().filter(|&&killed| killed).count();
    let total = WORKLOAD.total();
    eprintln!("{total} execs, {killed} killed, in {:?}", started.elapsed());
    assert!(
        killed >= total / 10,
        "only {killed} of {total} execs were killed in flight: the test proves little"
    );

    let dump = store.dump();
    let ours: BTreeMap<String, &Sandbox> = sandboxes
        .iter()
        .map(|s| (format!("{NETWORK}:{}:eth0", s.container), s))
        .collect();
    let flagged: BTreeSet<String> = dump
        .iter()
        .filter(|e| e["setAside"] == true)
        .filter_map(|e| e["containerId"].as_str().map(String::from))
        .collect();

    // records/: every file named like a record verifies (or the dump flagged it); anything
    // else is a write that never got renamed into place and must be invisible.
    let mut valid_records: BTreeMap<String, Value> = BTreeMap::new();
    let mut leftovers = Vec::new();
    for path in files_in(&store.state_dir.join("records")) {
        let name = file_name(&path);
        let Some(sandbox) = ours.get(&name) else {
            leftovers.push(name);
            continue;
        };
        match verify_envelope(&path) {
            Ok(record) => {
                valid_records.insert(sandbox.container.clone(), record);
            }
            Err(e) => assert!(
                flagged.contains(&sandbox.container),
                "unreadable record not flagged by the dump: {e}"
            ),
        }
    }
    let listed: BTreeSet<String> = dump
        .iter()
        .filter(|e| e["setAside"] != true)
        .map(|e| e["containerId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed,
        valid_records.keys().cloned().collect(),
        "the dump lists exactly the valid records"
    );

    // owners/: every ownership verifies and points at a valid record of the same pod; one owner per pod key.
    let mut owned_keys = BTreeSet::new();
    let mut owners = BTreeSet::new();
    for path in store.owner_files() {
        let name = file_name(&path);
        if !(name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())) {
            leftovers.push(format!("owners/{name}"));
            continue;
        }
        let owner = verify_envelope(&path)
            .unwrap_or_else(|e| panic!("ownership file does not verify: {e}"));
        let container = owner["containerId"]
            .as_str()
            .unwrap_or_else(|| panic!("owner without containerId: {owner}"));
        let record = valid_records
            .get(container)
            .unwrap_or_else(|| panic!("{name} names {container}, which has no valid record"));
        for field in ["network", "podNamespace", "podName"] {
            assert_eq!(
                owner[field], record[field],
                "{name}: owner and record disagree on {field}"
            );
        }
        // Keyed by pod name (the default podKey), an owner names the interfaces it holds the pod by.
        let interfaces = owner["interfaces"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: owner without interfaces: {owner}"));
        assert!(
            interfaces.contains(&record["ifName"]),
            "{name}: owner and record disagree on the interface: {owner}"
        );
        let key = (
            owner["network"].to_string(),
            owner["podNamespace"].to_string(),
            owner["podName"].to_string(),
            owner["ifName"].to_string(),
        );
        assert!(owned_keys.insert(key.clone()), "two owners for {key:?}");
        owners.insert(container.to_string());
    }
    let flagged_owners: BTreeSet<String> = dump
        .iter()
        .filter(|e| e["owner"] == true)
        .map(|e| e["containerId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(flagged_owners, owners, "the dump's owner flags vs owners/");
    eprintln!(
        "{} records, {} owners, {} set aside, leftovers ignored: {leftovers:?}",
        valid_records.len(),
        owners.len(),
        flagged.len()
    );

    // The plugin carries on: a new sandbox per pod comes and goes, then every old one can go.
    for pod in sandboxes
        .iter()
        .take(PODS)
        .map(|s| Pod::new("crash", &s.pod.name))
    {
        let fresh = container_id();
        store.add(&fresh, &pod).run().assert_ok();
        assert!(store.is_owner(&fresh, "eth0"));
        store.del(&fresh, &pod).run().assert_ok();
    }
    for Sandbox { container, pod } in &sandboxes {
        store.del(container, pod).run().assert_ok();
    }
    assert!(
        store.dump().iter().all(|e| e["setAside"] == true),
        "every DEL went through"
    );
    assert!(
        store.owner_files().iter().all(|p| file_name(p).len() != 64),
        "no ownership left"
    );
}

// ---------------------------------------------------------------------------------------
// SIGKILL at every system call: each invocation of each syscall the plugin makes, one run
// each (strace's fault injection counts a syscall's invocations on their own, so every
// (syscall, n) pair is one place to die). What stays on disk must be whole and consistent, and
// the runtime's retry must carry on from it.

/// How often the run of `call` invokes each syscall (`strace -c`).
fn syscall_counts(call: Cni) -> Vec<(String, usize)> {
    let dir = sys::TempDir::new("sgcount");
    let table = dir.path.join("counts");
    call.wrapped_in(&["strace", "-qq", "-c", "-o", table.to_str().unwrap()])
        .run()
        .assert_ok();
    let text = std::fs::read_to_string(&table).unwrap();
    let counts: Vec<(String, usize)> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let name = *fields.last()?;
            let calls = fields.get(3)?.parse().ok()?;
            (name != "total"
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
            .then(|| (name.to_string(), calls))
        })
        .collect();
    assert!(counts.len() > 10, "strace -c gave no table: {text}");
    counts
}

/// For every invocation of every syscall that `call` makes on a store `setup` prepares: a
/// fresh store, the run killed there, then `check`. Returns how many runs were killed.
fn kill_at_every_syscall<S>(
    setup: impl Fn() -> S,
    call: impl Fn(&S) -> Cni,
    check: impl Fn(&S, &str),
) -> usize {
    let counts = syscall_counts(call(&setup()));
    let mut killed = 0;
    for (syscall, calls) in &counts {
        for nth in 1..=*calls {
            let state = setup();
            let reply = call(&state).run_killed_at(Traced::PluginOnly, syscall, nth);
            let where_ = format!("killed at {syscall} #{nth}");
            match reply.status.signal() {
                Some(_) => killed += 1,
                None => assert!(
                    reply.succeeded(),
                    "{where_}: not killed, yet failed: {}",
                    reply.stdout
                ),
            }
            check(&state, &where_);
        }
    }
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    eprintln!("{killed} of {total} syscalls killed the run");
    assert!(killed * 2 > total, "only {killed} of {total} kills landed");
    killed
}

/// Whatever a kill left: every record and every ownership whole (the store never shows a
/// torn one), and every owner on its record.
fn assert_whole(store: &Store, where_: &str) {
    for dir in ["records", "owners"] {
        for path in files_in(&store.state_dir.join(dir)) {
            if file_name(&path).starts_with('.') {
                continue;
            }
            verify_envelope(&path).unwrap_or_else(|e| panic!("{where_}: {e}"));
        }
    }
    store.assert_every_owner_has_its_record();
}

/// A store with one sandbox of a pod: in a temp dir on the root file system (ext4 without a
/// journal here), or on `disk`, a tmpfs. Records are plain files on every file system (the
/// symlink form that releases before took on a journal and on a tmpfs is only read).
fn store_with_one_sandbox(disk: Option<&mount::Mount>) -> (Store, Pod, String) {
    let Some(disk) = disk else {
        return Store::with_one_sandbox("crash", "db-0");
    };
    let store = Store::with_state_dir(disk.path.join(sys::unique("state")), &disk.path);
    let (pod, a) = (Pod::new("crash", "db-0"), container_id());
    store.add(&a, &pod).run().assert_ok();
    let record = store.record_path(NETWORK, &a, "eth0");
    assert!(std::fs::symlink_metadata(&record).unwrap().is_file());
    (store, pod, a)
}

#[test]
fn add_killed_at_every_syscall_leaves_the_old_owner_or_the_new_one_on_its_record() {
    sys::skip_unless_root!(&["strace"]);
    add_killed_at_every_syscall(None);
}

#[test]
fn add_killed_at_every_syscall_on_a_tmpfs_leaves_the_old_owner_or_the_new_one_on_its_record() {
    sys::skip_unless_root!(&["strace", "mount", "umount"]);
    add_killed_at_every_syscall(Some(&mount::Mount::tmpfs("size=32m,mode=0755")));
}

fn add_killed_at_every_syscall(disk: Option<&mount::Mount>) {
    let setup = || {
        let (store, pod, a) = store_with_one_sandbox(disk);
        (store, pod, a, container_id())
    };
    kill_at_every_syscall(
        setup,
        |(store, pod, _, b)| store.add(b, pod),
        |(store, pod, a, b), where_| {
            assert_whole(store, where_);
            assert!(
                store.is_owner(a, "eth0") || store.is_owner(b, "eth0"),
                "{where_}: the pod lost its owner"
            );
            // The runtime retries the ADD; the old sandbox's DEL is stale from then on.
            store.add(b, pod).run().assert_ok();
            store.del(a, pod).run().assert_error(11);
            assert_whole(store, where_);
        },
    );
}

#[test]
fn del_killed_at_every_syscall_releases_the_pod_only_with_its_record_gone_after() {
    sys::skip_unless_root!(&["strace"]);
    del_killed_at_every_syscall(None);
}

#[test]
fn del_killed_at_every_syscall_on_a_tmpfs_releases_the_pod_only_with_its_record_gone_after() {
    sys::skip_unless_root!(&["strace", "mount", "umount"]);
    del_killed_at_every_syscall(Some(&mount::Mount::tmpfs("size=32m,mode=0755")));
}

fn del_killed_at_every_syscall(disk: Option<&mount::Mount>) {
    let setup = || {
        let (store, pod, a) = store_with_one_sandbox(disk);
        let b = container_id();
        store.add(&b, &pod).run().assert_ok();
        (store, pod, a, b)
    };
    kill_at_every_syscall(
        setup,
        |(store, pod, _, b)| store.del(b, pod),
        |(store, pod, a, b), where_| {
            assert_whole(store, where_);
            if store.is_owner(b, "eth0") {
                store.del(a, pod).run().assert_error(11);
            }
            store.del(b, pod).run().assert_ok();
            assert!(
                store.owner_files().is_empty(),
                "{where_}: {:?}",
                store.owner_files()
            );
            store.del(a, pod).run().assert_ok();
            assert!(store.dump().is_empty(), "{where_}");
        },
    );
}

#[test]
fn gc_killed_at_every_syscall_keeps_the_valid_attachment_and_its_owner() {
    sys::skip_unless_root!(&["strace"]);
    let setup = || {
        let (store, kept_pod, kept) = Store::with_one_sandbox("crash", "db-0");
        store
            .add(&container_id(), &Pod::new("crash", "db-1"))
            .run()
            .assert_ok();
        (store, kept_pod, kept)
    };
    let gc = |(store, _, kept): &(Store, Pod, String)| {
        store.cni("GC", "").config(
            "cni.dev/valid-attachments",
            Some(serde_json::json!([{"containerID": kept, "ifname": "eth0"}])),
        )
    };
    kill_at_every_syscall(setup, gc, |state, where_| {
        let (store, kept_pod, kept) = state;
        assert_whole(store, where_);
        assert!(
            store.is_owner(kept, "eth0"),
            "{where_}: GC took the valid attachment's ownership"
        );
        gc(state).run().assert_ok();
        assert_eq!(store.owner_files().len(), 1, "{where_}");
        store.del(&container_id(), kept_pod).run().assert_error(11);
    });
}

/// A previous release's ownership (a regular file) rewritten as a symlink when the pod's next
/// sandbox takes it, killed at every syscall: the pod keeps its old owner or gets the new one.
#[test]
fn rewrite_of_a_previous_release_owner_killed_at_every_syscall_keeps_the_pod_owned() {
    sys::skip_unless_root!(&["strace"]);
    let [a, b, d] = ['a', 'b', 'd'].map(|x| x.to_string().repeat(64));
    let db0 = Pod::new("migrate", "db-0");
    let setup = || Store::from_fixture("state-previous-release-owners");
    kill_at_every_syscall(
        setup,
        |store| store.add(&d, &db0),
        |store, where_| {
            assert_whole(store, where_);
            assert_eq!(
                store
                    .owner_files()
                    .iter()
                    .filter(|p| !file_name(p).starts_with('.'))
                    .count(),
                2,
                "{where_}"
            );
            assert!(
                store.is_owner(&b, "eth0") || store.is_owner(&d, "eth0"),
                "{where_}: db-0 lost its owner"
            );
            store.del(&a, &db0).run().assert_error(11);
            store.add(&d, &db0).run().assert_ok();
            store.del(&b, &db0).run().assert_error(11);
            assert_whole(store, where_);
        },
    );
}
