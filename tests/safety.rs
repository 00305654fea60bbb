//! The first principle: the guard never blocks a teardown, never revives a superseded sandbox,
//! never keeps an owner without its record, and never stalls one pod behind another. Each
//! test is one way today's plugin used to break that, driven as a runtime or an operator would.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/mount.rs"]
mod mount;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{
    Incident, NETWORK, Pod, Store, Traced, container_id, corrupt_one_digit, files_in, guard,
    spawn_guard, verify_envelope, walk,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn gc(store: &Store, valid: &[&str]) -> cni::Reply {
    let list: Vec<Value> = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    store
        .cni("GC", "")
        .config("cni.dev/valid-attachments", Some(Value::Array(list)))
        .run()
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn state_arg(store: &Store) -> &str {
    store.state_dir.to_str().unwrap()
}

/// `--doctor --output json` on `store` alone (an empty conf dir), parsed.
fn doctor_findings(store: &Store) -> Vec<Value> {
    let conf = sys::TempDir::new("sgconf");
    let out = guard(&[
        "--doctor",
        "--conf-dir",
        conf.path.to_str().unwrap(),
        "--state-dir",
        state_arg(store),
        "--output",
        "json",
    ]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor JSON ({e}): {}", text(&out)));
    report["findings"].as_array().cloned().unwrap_or_default()
}

fn finding<'a>(findings: &'a [Value], check: &str, severity: &str) -> Option<&'a Value> {
    findings
        .iter()
        .find(|f| f["check"] == check && f["severity"] == severity)
}

// ---------------------------------------------------------------------------------------
// An owner without a record

#[test]
fn a_del_naming_another_pod_still_releases_what_its_record_owned() {
    let (store, web0, a) = Store::with_one_sandbox("shop", "web-0");
    let web1 = Pod::new("shop", "web-1");
    // The DEL's CNI_ARGS name another pod (a hand-run DEL, a runtime bug).
    store
        .cni("DEL", &a)
        .cni_args(&web1.cni_args(&a))
        .run()
        .assert_ok();
    assert!(
        store.owner_files().is_empty(),
        "A's record is gone, so must be the ownership it held"
    );
    // Another sandbox of web-0 is torn down without being refused in the name of A.
    store.del(&container_id(), &web0).run().assert_ok();
}

#[test]
fn a_re_add_under_another_pod_name_gives_the_old_name_up() {
    let (store, p1, a) = Store::with_one_sandbox("shop", "p1");
    let p2 = Pod::new("shop", "p2");
    store.add(&a, &p2).run().assert_ok();
    assert_eq!(store.owner_files().len(), 1, "A owns p2 only");
    store.assert_every_owner_has_its_record();
    store.del(&a, &p2).run().assert_ok();
    assert!(store.owner_files().is_empty());
    store.del(&container_id(), &p1).run().assert_ok();
}

#[test]
fn an_owner_left_without_its_record_is_shown_and_repaired_by_del() {
    let store = Store::new();
    let web0 = Pod::new("shop", "web-0");
    let a = container_id();
    store.add(&a, &web0).run().assert_ok();
    // What an older version left behind: the record gone, the ownership still there.
    std::fs::remove_file(store.record_path(NETWORK, &a, "eth0")).unwrap();

    let dump = store.dump();
    let orphan = dump
        .iter()
        .find(|e| e["containerId"] == a.as_str())
        .unwrap_or_else(|| panic!("the dump must show it: {dump:?}"));
    assert_eq!(orphan["status"], "owner-without-record", "{orphan}");
    assert_eq!(orphan["owner"], true);
    let table = guard(&["--dump-checkpoints", "--state-dir", state_arg(&store)]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("NO RECORD"),
        "{}",
        text(&table)
    );
    let findings = doctor_findings(&store);
    let warned = finding(&findings, "store-owners", "warning")
        .unwrap_or_else(|| panic!("the doctor must report it: {findings:?}"));
    assert!(warned.to_string().contains(&a), "{warned}");

    // The next DEL of the pod repairs it instead of refusing in A's name.
    store.del(&container_id(), &web0).run().assert_ok();
    assert!(store.owner_files().is_empty());
    assert!(finding(&doctor_findings(&store), "store-owners", "ok").is_some());
}

#[test]
fn gc_repairs_an_owner_without_its_record() {
    let store = Store::new();
    let a = container_id();
    store.add(&a, &Pod::new("shop", "web-0")).run().assert_ok();
    std::fs::remove_file(store.record_path(NETWORK, &a, "eth0")).unwrap();
    // The runtime still lists A (its record was lost, not its sandbox).
    gc(&store, &[&a]).assert_ok();
    assert!(
        store.owner_files().is_empty(),
        "GC drops an ownership with no record behind it"
    );
}

// ---------------------------------------------------------------------------------------
// Bounded waits: no holder of the lock freezes the node

/// Holds `<stateDir>/lock` exclusively, as an operator's `flock` or a hung process would.
/// `-o` keeps the lock in flock itself, not in its `sleep`, so killing flock releases it.
struct LockHolder(Child);

impl LockHolder {
    fn start(store: &Store) -> LockHolder {
        let lock = store.state_dir.join("lock");
        let child = Command::new("flock")
            .arg("-o")
            .arg(&lock)
            .args(["sleep", "60"])
            .spawn()
            .expect("run flock");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Command::new("flock")
            .args(["-n"])
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap()
            .success()
        {
            assert!(Instant::now() < deadline, "flock never took the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        LockHolder(child)
    }

    fn pid(&self) -> String {
        format!("pid {}", self.0.id())
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An ADD the guard fails: the lock stays held past its wait.
fn fail_add_on_the_lock(store: &Store, container: &str, pod: &Pod) {
    let _holder = LockHolder::start(store);
    store
        .add(container, pod)
        .config("lockTimeoutSeconds", Some(json!(0.2)))
        .run()
        .assert_error(11);
}

/// A runtime that execs the plugin with fd 1 closed: the plugin puts /dev/null there before
/// it opens anything, so no file it opens (the pod's netns, the lock, a record) becomes
/// what it writes its result to. Seen while the verb waits on a held lock.
#[test]
fn a_verb_started_without_stdout_has_dev_null_there_not_a_state_file() {
    sys::skip_unless_tools!(&["flock"]);
    let (store, _pod, _a) = Store::with_one_sandbox("shop", "web-0");
    let holder = LockHolder::start(&store);
    let add = store
        .add(&container_id(), &Pod::new("shop", "web-1"))
        .config("lockTimeoutSeconds", Some(json!(10)))
        .wrapped_in(&["/bin/sh", "-c", "exec \"$0\" >&-"])
        .spawn();
    let lock = std::fs::canonicalize(store.state_dir.join("lock")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let fds = format!("/proc/{}/fd", add.pid);
    // Until the verb holds the lock file open, waiting on it.
    while !std::fs::read_dir(&fds)
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to == lock))
    {
        assert!(Instant::now() < deadline, "the ADD never opened the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stdout = std::fs::read_link(format!("{fds}/1"));
    drop(holder);
    let _ = add.wait();
    assert_eq!(stdout.unwrap(), Path::new("/dev/null"));
}

#[test]
fn every_verb_gives_up_on_a_held_lock_and_names_the_holder() {
    sys::skip_unless_tools!(&["flock"]);
    let (store, pod, a) = Store::with_one_sandbox("shop", "web-0");
    let holder = LockHolder::start(&store);
    let wait = Some(json!(0.3));
    let verbs = [
        (
            "ADD",
            store.add(&container_id(), &Pod::new("shop", "web-1")),
            11,
        ),
        ("DEL", store.del(&a, &pod), 11),
        ("CHECK", store.cni("CHECK", &a).pod(&pod), 11),
        (
            "GC",
            store
                .cni("GC", "")
                .config("cni.dev/valid-attachments", Some(json!([]))),
            11,
        ),
        // STATUS reports the network down only when an ADD could not get through either.
        ("STATUS", store.cni("STATUS", ""), 50),
    ];
    for (verb, call, code) in verbs {
        let started = Instant::now();
        let error = call
            .config("lockTimeoutSeconds", wait.clone())
            .run()
            .assert_error(code);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{verb} waited {:?}",
            started.elapsed()
        );
        assert!(
            error.msg.contains(&holder.pid()),
            "{verb} must name the holder ({}): {error:?}",
            holder.pid()
        );
        assert!(
            error.details.contains("lockTimeoutSeconds"),
            "{verb}: details say how out: {error:?}"
        );
    }
    for args in [
        vec!["--dump-checkpoints"],
        vec!["--restore", "--dry-run", "--all"],
        vec!["--doctor", "--conf-dir", "/nonexistent"],
    ] {
        let mut args = args.clone();
        args.extend(["--state-dir", state_arg(&store), "--lock-timeout", "0.3"]);
        let started = Instant::now();
        let out = guard(&args);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} waited {:?}",
            started.elapsed()
        );
        let said = text(&out);
        assert!(
            said.contains("waiting") && said.contains(&holder.pid()),
            "{args:?} says it waits, and for whom: {said}"
        );
        if args[0] != "--doctor" {
            assert!(!out.status.success(), "{args:?}: {said}");
        }
    }
    drop(holder);
    store.del(&a, &pod).run().assert_ok();
}

#[test]
fn a_dump_left_open_in_a_pager_stalls_no_add_or_del() {
    let store = Store::new();
    for i in 0..300 {
        store
            .add(&container_id(), &Pod::new("bulk", &format!("db-{i}")))
            .run()
            .assert_ok();
    }
    // `sandbox-guard --dump-checkpoints | less`, and nobody scrolls: the pipe fills up.
    let mut pager = spawn_guard(&[
        "--dump-checkpoints",
        "--output",
        "json",
        "--state-dir",
        state_arg(&store),
    ]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pager.try_wait().unwrap().is_none(),
        "the dump must still be blocked on its full pipe"
    );

    let (pod, fresh) = (Pod::new("shop", "web-0"), container_id());
    let started = Instant::now();
    store.add(&fresh, &pod).run().assert_ok();
    store.del(&fresh, &pod).run().assert_ok();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "ADD and DEL waited {:?} behind the dump",
        started.elapsed()
    );
    let _ = pager.kill();
    let _ = pager.wait();
}

// ---------------------------------------------------------------------------------------
// A read-only store

#[test]
fn a_read_only_store_still_lets_every_teardown_but_a_stale_one_through() {
    sys::skip_unless_root!(&["mount", "umount", "ip"]);
    let store = Store::new();
    let (web0_old, web0_new, db0) = (
        Pod::new("shop", "web-0"),
        Pod::new("shop", "web-0"),
        Pod::new("shop", "db-0"),
    );
    let [old, owner, other] = std::array::from_fn(|_| container_id());
    store.add(&old, &web0_old).run().assert_ok();
    let (check_owner, _owner_netns) = store.add(&owner, &web0_new).in_pod_netns();
    check_owner.run().assert_ok();
    store.add(&other, &db0).run().assert_ok();
    // ext4 with errors=remount-ro after a disk error.
    let read_only = mount::Mount::read_only_bind(&store.state_dir);

    let error = store.del(&old, &web0_old).run().assert_error(11);
    assert!(
        error.msg.contains("stale DEL") && error.msg.contains(&owner[..13]),
        "{error:?}"
    );
    let passed = store.del(&other, &db0).run();
    passed.assert_ok();
    assert!(
        passed.stderr.contains("read-only"),
        "stderr says the record stays: {passed:?}"
    );
    let logged = store
        .log_lines()
        .into_iter()
        .find(|l| l.container == other && l.verb == "DEL")
        .expect("DEL logged");
    assert!(
        logged.raw.contains("read-only") && logged.raw.contains("record stays"),
        "{}",
        logged.raw
    );

    let error = store
        .add(&container_id(), &Pod::new("shop", "api-0"))
        .run()
        .assert_error(5);
    assert!(error.msg.contains("read-only"), "{error:?}");
    assert!(
        error.details.contains("unprotected"),
        "details say why it matters: {error:?}"
    );

    assert_eq!(store.dump().len(), 3, "the dump reads a read-only store");
    store
        .cni("CHECK", &owner)
        .pod(&web0_new)
        .netns(&check_owner.netns_path())
        .run()
        .assert_ok();
    let findings = doctor_findings(&store);
    assert!(
        !findings
            .iter()
            .any(|f| f["check"] == "store" && f["severity"] == "error"),
        "{findings:?}"
    );

    drop(read_only);
    // Writable again: the next DEL of the sandbox removes what stayed.
    store.del(&other, &db0).run().assert_ok();
    assert!(store.entry(&other, "eth0").is_none());
}

// ---------------------------------------------------------------------------------------
// Crash ordering: SIGKILL at the n-th change of the store, by strace's fault injection

#[test]
fn gc_killed_at_any_unlink_leaves_no_owner_without_its_record() {
    sys::skip_unless_root!(&["strace"]);
    for nth in 1..=6 {
        let store = Store::new();
        for i in 0..3 {
            store
                .add(&container_id(), &Pod::new("gc", &format!("db-{i}")))
                .run()
                .assert_ok();
        }
        let call = store
            .cni("GC", "")
            .config("cni.dev/valid-attachments", Some(json!([])));
        call.run_killed_at(Traced::WithChildren, "unlink,unlinkat", nth);
        store.assert_every_owner_has_its_record();
    }
}

#[test]
fn add_killed_at_any_rename_disarms_no_blocker_before_its_record_is_there() {
    sys::skip_unless_root!(&["strace"]);
    for nth in 1..=4 {
        let (store, pod, a) = Store::with_one_sandbox("lijiaob", "etcd1-0");
        // A corrupt record that an identityless DEL needed: set aside, and blocking.
        let record = store.record_path(NETWORK, &a, "eth0");
        corrupt_one_digit(&record, pod.uid.as_bytes());
        store.identityless_del(&a).run().assert_error(101);
        let blocker = store
            .state_dir
            .join("set-aside")
            .join(record.file_name().unwrap());
        assert!(cni::entry_exists(&blocker));

        store
            .add(&a, &pod)
            .run_killed_at(Traced::WithChildren, "rename,renameat,renameat2", nth);
        if !blocker.exists() {
            verify_envelope(&record).unwrap_or_else(|e| {
                panic!("kill at rename {nth}: the blocker went before the record came: {e}")
            });
        }
        store.assert_every_owner_has_its_record();
    }
}

// ---------------------------------------------------------------------------------------
// Read-only commands never write

/// Every path below and including `dir`, with its mode and modification time.
fn stat_tree(dir: &Path) -> BTreeMap<PathBuf, (u32, i64, i64)> {
    let mut tree = BTreeMap::new();
    for path in std::iter::once(dir.to_path_buf()).chain(walk(dir)) {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        tree.insert(
            path,
            (meta.permissions().mode(), meta.mtime(), meta.mtime_nsec()),
        );
    }
    tree
}

fn read_only_commands(store: &Store, record_owner: &str, pod: &Pod) {
    let conf = sys::TempDir::new("sgconf");
    let state = state_arg(store);
    for args in [
        vec!["--dump-checkpoints", "--state-dir", state],
        vec![
            "--dump-checkpoints",
            "--output",
            "json",
            "--state-dir",
            state,
        ],
        vec!["--restore", "--dry-run", "--all", "--state-dir", state],
        vec![
            "--doctor",
            "--conf-dir",
            conf.path.to_str().unwrap(),
            "--state-dir",
            state,
        ],
    ] {
        let out = guard(&args);
        assert!(out.status.code().is_some(), "{args:?}: {}", text(&out));
    }
    let _ = store.cni("CHECK", record_owner).pod(pod).run();
}

#[test]
fn read_only_commands_create_chmod_and_lock_nothing() {
    let store = Store::new();
    let pod = Pod::new("shop", "web-0");
    let a = container_id();
    // Nothing there yet: a read must not create the state dir.
    read_only_commands(&store, &a, &pod);
    assert!(
        !store.state_dir.exists(),
        "a read-only command created {}",
        store.state_dir.display()
    );

    store.add(&a, &pod).run().assert_ok();
    // Loose modes the doctor should report, not silently fix; no lock file yet.
    std::fs::set_permissions(&store.state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A record that is a symlink (on a journal) has no mode of its own to loosen.
    let record = store.record_path(NETWORK, &a, "eth0");
    if !std::fs::symlink_metadata(&record).unwrap().is_symlink() {
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::remove_file(store.state_dir.join("lock")).unwrap();
    let before = stat_tree(&store.state_dir);
    std::thread::sleep(Duration::from_millis(20));
    read_only_commands(&store, &a, &pod);
    assert_eq!(
        stat_tree(&store.state_dir),
        before,
        "modes, mtimes and entries must stay as they were"
    );
    let findings = doctor_findings(&store);
    assert!(
        finding(&findings, "store-permissions", "warning").is_some(),
        "reported: {findings:?}"
    );
    assert_eq!(
        stat_tree(&store.state_dir),
        before,
        "and still not fixed behind the operator's back"
    );
}

#[test]
fn read_only_commands_work_on_a_read_only_mount() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let (store, _, _) = Store::with_one_sandbox("shop", "web-0");
    std::fs::set_permissions(&store.state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _read_only = mount::Mount::read_only_bind(&store.state_dir);
    assert_eq!(store.dump().len(), 1);
    let out = guard(&[
        "--restore",
        "--dry-run",
        "--all",
        "--state-dir",
        state_arg(&store),
    ]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("read-only"),
        "{}",
        text(&out)
    );
    let findings = doctor_findings(&store);
    assert!(
        !findings
            .iter()
            .any(|f| f["check"] == "store" && f["severity"] == "error"),
        "{findings:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Temp files left by killed writers

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn temp_files_of_killed_writers_are_reported_and_collected() {
    let store = Store::new();
    let a = container_id();
    store.add(&a, &Pod::new("shop", "web-0")).run().assert_ok();
    let dead = dead_pid();
    let dead_files = [
        store.state_dir.join(format!("records/.{dead}.tmp")),
        store.state_dir.join(format!("owners/.{dead}.tmp")),
        // Delegate mode's folders, as a runtime's timeout leaves them.
        store.state_dir.join(format!("pending-adds/.{dead}.tmp")),
        store.state_dir.join(format!("rolled-back/.{dead}.tmp")),
    ];
    for path in &dead_files {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, testdata::fixture_bytes("checkpoints/truncated.json")).unwrap();
    }
    // A writer still at work (this test process stands in for it).
    let live_file = store
        .state_dir
        .join(format!("records/.{}.tmp", std::process::id()));
    std::fs::write(&live_file, b"{").unwrap();

    let findings = doctor_findings(&store);
    let warned =
        finding(&findings, "store-temp-files", "warning").unwrap_or_else(|| panic!("{findings:?}"));
    assert!(
        warned["summary"].as_str().unwrap().contains("4 temp files"),
        "{warned}"
    );

    gc(&store, &[&a]).assert_ok();
    assert!(
        dead_files.iter().all(|p| !p.exists()),
        "GC removes what dead writers left"
    );
    assert!(
        live_file.exists(),
        "GC leaves a live writer's temp file alone"
    );
    std::fs::remove_file(live_file).unwrap();
}

#[test]
fn add_and_del_never_list_a_directory() {
    sys::skip_unless_root!(&["strace"]);
    let store = Store::new();
    for i in 0..20 {
        store
            .add(&container_id(), &Pod::new("bulk", &format!("db-{i}")))
            .run()
            .assert_ok();
    }
    let trace = sys::TempDir::new("sgtrace");
    let (pod, a) = (Pod::new("shop", "web-0"), container_id());
    for (verb, call) in [("ADD", store.add(&a, &pod)), ("DEL", store.del(&a, &pod))] {
        let log = trace.path.join(verb);
        let log_arg = log.to_str().unwrap();
        call.wrapped_in(&[
            "strace",
            "-f",
            "-qq",
            "-o",
            log_arg,
            "-e",
            "trace=getdents64,getdents",
        ])
        .run()
        .assert_ok();
        let listed = std::fs::read_to_string(&log).unwrap();
        assert!(
            !listed.contains("getdents"),
            "{verb} listed a directory:\n{listed}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The cleanup DEL of a failed ADD, and what a refusal says

#[test]
fn the_cleanup_del_of_an_add_the_guard_failed_passes() {
    sys::skip_unless_tools!(&["flock"]);
    let store = Store::new();
    let (pod_old, pod_new) = (Pod::new("shop", "web-0"), Pod::new("shop", "web-0"));
    let (owner, failed) = (container_id(), container_id());
    store.add(&owner, &pod_old).run().assert_ok();
    fail_add_on_the_lock(&store, &failed, &pod_new);
    // The runtime tears the half-made sandbox down: it never owned the pod, so nothing is stale.
    store.del(&failed, &pod_new).run().assert_ok();
    assert!(store.is_owner(&owner, "eth0"), "the owner keeps the pod");
    assert!(
        files_in(&store.state_dir.join("failed-adds")).is_empty(),
        "the DEL removes the note"
    );
    // A sandbox that was never seen at all is still refused: it may predate the guard.
    let error = store.del(&container_id(), &pod_old).run().assert_error(11);
    assert!(error.msg.contains("has no checkpoint here"), "{error:?}");
}

/// Kubelet's container GC repeats the DEL of an old sandbox after the new one took the pod's
/// name: the old sandbox owned the pod and released it, so the refusal must not claim it
/// "never owned" it.
#[test]
fn the_refusal_of_a_gc_del_after_release_does_not_say_never_owned() {
    let i = Incident::of("shop", "web-0");
    let (store, a, b) = (&i.store, &i.a, &i.b);
    store.add(a, &i.pod_a).run().assert_ok();
    store.del(a, &i.pod_a).run().assert_ok();
    store.add(b, &i.pod_b).run().assert_ok();
    let error = store.del(a, &i.pod_a).netns("").run().assert_error(11);
    assert!(!error.msg.contains("never owned"), "{error:?}");
    assert!(error.msg.contains("has no checkpoint here"), "{error:?}");
    let details: Value = serde_json::from_str(&error.details).expect("details are JSON");
    assert!(
        details["wayOut"]
            .as_str()
            .is_some_and(|way| way.contains("already passed")),
        "{details}"
    );
}

#[test]
fn a_refused_del_says_briefly_who_owns_the_pod_and_whether_it_ever_did() {
    let Incident {
        store,
        pod_a,
        pod_b,
        a,
        b,
    } = Incident::of("shop", "web-0");
    store.add(&a, &pod_a).run().assert_ok();
    store.add(&b, &pod_b).run().assert_ok();
    let error = store.del(&a, &pod_a).run().assert_error(11);
    assert!(
        error.msg.contains("stale DEL") && error.msg.contains(&b[..13]),
        "{error:?}"
    );
    // One short form for people, as crictl prints IDs: 13 characters, never the full 64.
    assert!(
        !error.msg.contains(&b) && !error.msg.contains(&a),
        "{error:?}"
    );
    assert!(error.msg.contains("owned it before"), "{error:?}");
    assert!(
        error.msg.chars().count() <= 200,
        "{} characters: {}",
        error.msg.chars().count(),
        error.msg
    );
    let details: Value = serde_json::from_str(&error.details).expect("details are JSON");
    assert_eq!(details["ownerContainerId"], b.as_str());
    assert_eq!(details["refusedEverOwned"], true);
    assert!(
        details["wayOut"]
            .as_str()
            .unwrap()
            .contains("stopped and removed"),
        "{details}"
    );
}

// ---------------------------------------------------------------------------------------
// Operator text

#[test]
fn the_dump_table_says_where_an_untrusted_file_is_and_why() {
    let (store, pod, a) = Store::with_one_sandbox("shop", "web-0");
    store
        .add(&container_id(), &Pod::new("shop", "db-0"))
        .run()
        .assert_ok();
    let record = store.record_path(NETWORK, &a, "eth0");
    corrupt_one_digit(&record, pod.uid.as_bytes());

    let out = guard(&["--dump-checkpoints", "--state-dir", state_arg(&store)]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table.contains(record.to_str().unwrap()) && table.contains("checksum mismatch"),
        "path and reason: {table}"
    );
    let footer: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("CORRUPT: 1 file fails verification"))
        .collect();
    assert_eq!(footer.len(), 1, "{table}");
    assert!(
        footer[0].contains("/records") && !footer[0].contains("set-aside"),
        "the footer says where it is: {table}"
    );
}

#[test]
fn the_doctor_tells_a_broken_conflist_to_be_fixed_not_reordered() {
    let conf = sys::TempDir::new("sgconf");
    std::fs::copy(
        testdata::fixture_path("conflists/broken/truncated.conflist"),
        conf.path.join("10-net.conflist"),
    )
    .unwrap();
    let out = guard(&[
        "--doctor",
        "--conf-dir",
        conf.path.to_str().unwrap(),
        "--state-dir",
        "/nonexistent",
        "--output",
        "json",
    ]);
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let broken = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "cni-config" && f["severity"] == "error")
        .unwrap_or_else(|| panic!("{report}"));
    let fix = broken["fix"].as_str().unwrap();
    assert!(fix.contains("JSON") && !fix.contains("LAST"), "{fix}");
}

#[test]
fn a_failed_add_excuses_no_del_against_a_sandbox_that_came_later() {
    sys::skip_unless_tools!(&["flock"]);
    let store = Store::new();
    let pod = Pod::new("shop", "web-0");
    let (seed, failed, later) = (container_id(), container_id(), container_id());
    store
        .add(&seed, &Pod::new("shop", "seed"))
        .run()
        .assert_ok();
    fail_add_on_the_lock(&store, &failed, &pod);
    // No cleanup DEL came (a read-only store ate it, say); then a newer sandbox took the pod.
    std::thread::sleep(Duration::from_millis(20));
    store
        .add(&later, &Pod::new("shop", "web-0"))
        .run()
        .assert_ok();
    let error = store.del(&failed, &pod).run().assert_error(11);
    assert!(error.msg.contains(&later[..13]), "{error:?}");

    // A failed ADD followed by one that succeeded leaves no note behind.
    fail_add_on_the_lock(&store, &seed, &Pod::new("shop", "seed"));
    assert!(
        files_in(&store.state_dir.join("failed-adds"))
            .iter()
            .all(|p| !p.to_string_lossy().contains(&seed)),
        "a recorded sandbox gets no note"
    );
    let fresh = container_id();
    fail_add_on_the_lock(&store, &fresh, &Pod::new("shop", "api-0"));
    store
        .add(&fresh, &Pod::new("shop", "api-0"))
        .run()
        .assert_ok();
    assert!(
        files_in(&store.state_dir.join("failed-adds"))
            .iter()
            .all(|p| !p.to_string_lossy().contains(&fresh)),
        "the ADD that succeeded removes the note"
    );
}

#[test]
fn the_cleanup_del_of_a_failed_add_passes_after_the_owner_adds_an_interface() {
    // The owner's file is rewritten when it adds a second interface: that is no new owner,
    // and the cleanup DEL of the ADD that failed next to it must still pass.
    sys::skip_unless_tools!(&["flock"]);
    let store = Store::new();
    let pod = Pod::new("shop", "web-0");
    let (owner, failed) = (container_id(), container_id());
    store.add(&owner, &pod).run().assert_ok();
    fail_add_on_the_lock(&store, &failed, &pod);
    // Orders the owner's rewrite after the note in file times too (what the check compared).
    std::thread::sleep(Duration::from_millis(20));
    store.add(&owner, &pod).ifname("net1").run().assert_ok();
    store.del(&failed, &pod).run().assert_ok();
    assert!(store.is_owner(&owner, "eth0"), "the owner keeps the pod");
}

#[test]
fn a_del_passes_where_no_state_dir_can_exist() {
    sys::skip_unless_root!(&["mount", "umount"]);
    let logs = sys::TempDir::new("sglogs");
    let disk = mount::Mount::tmpfs("ro,size=64k,mode=0755");
    let store = Store::with_state_dir(disk.path.join("state"), &logs.path);
    let pod = Pod::new("shop", "web-0");
    store.del(&container_id(), &pod).run().assert_ok();
    store.add(&container_id(), &pod).run().assert_error(5);
}

#[test]
fn a_stale_del_leaves_a_corrupt_record_where_it_is() {
    let Incident {
        store,
        pod_a: old_pod,
        pod_b: new_pod,
        a: old,
        b: new,
    } = Incident::of("shop", "web-0");
    store.add(&old, &old_pod).run().assert_ok();
    store.add(&new, &new_pod).run().assert_ok();
    let record = store.record_path(NETWORK, &old, "eth0");
    let corrupted = corrupt_one_digit(&record, old_pod.uid.as_bytes());
    // CNI_ARGS name the pod, so the record is not needed; the DEL is stale all the same.
    store.del(&old, &old_pod).run().assert_error(11);
    assert_eq!(
        cni::read_entry(&record).unwrap(),
        corrupted,
        "a refused DEL changes nothing, the corrupt record included"
    );
    store.assert_every_owner_has_its_record();
    store.del(&new, &new_pod).run().assert_ok();
    store.del(&old, &old_pod).run().assert_ok();
    assert!(!cni::entry_exists(&record));
    let kept: Vec<PathBuf> = files_in(&store.state_dir.join("set-aside"));
    assert!(
        kept.iter()
            .any(|p| cni::read_entry(p).unwrap() == corrupted),
        "the corrupt record is kept: {kept:?}"
    );
}
