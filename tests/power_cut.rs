//! The power cut, judged by decisions, not bytes (docs/store.md).
//!
//! A sequence of delegate-mode verbs runs on a state dir on journaled ext4 whose block writes
//! are recorded (tests/blockrec: a loop device over a FUSE file that logs each write and each
//! cache flush). At every cut of that log, the image as the disk held it then is mounted (its
//! journal replayed) and the next boot is played on it under a new boot id, as kubelet and
//! containerd play it: every old sandbox the runtime still has is stopped and removed (DELs
//! with an empty netns), each pod's new sandbox is added, the container GC repeats the old
//! DELs, a GC sweeps, and at last the pods are scaled to zero. A pod-name-keyed primary
//! (tests/primaries/counting-primary) logs every call. Harm is:
//! - a DEL of another sandbox of a pod reaching the primary while the pod's new sandbox lives
//!   (it would free the new pod's name-keyed state);
//! - a pod that cannot restart (its new ADD fails) or an old sandbox that cannot be torn down;
//! - a deferred DEL the guard acknowledged before the cut that never reaches the primary (its
//!   sandbox is gone from the runtime, so nothing else will ever tear it down there);
//! - an owner that is not a sandbox of the new boot.
//!
//! The control is the same test with a build whose deferral is written without its sync
//! (`--features power-cut-control`): it must show harm.

#[path = "support/boot.rs"]
mod boot;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/counting_primary.rs"]
mod counting_primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use boot::Boot;
use cni::{Cni, Pod, Store};
use counting_primary::CountingPrimary;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

const TOOLS: &[&str] = &[
    "go",
    "cargo",
    "mkfs.ext4",
    "losetup",
    "mount",
    "umount",
    "unshare",
    "strace",
    "ip",
    "flock",
    "sha256sum",
    "paste",
];
const REPLAYS: Duration = Duration::from_secs(20);

/// tests/blockrec built once into the test's target dir (Go, from the module proxy).
fn blockrec() -> &'static Path {
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINARY.get_or_init(build_blockrec)
}

fn build_blockrec() -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("blockrec");
    let binary = out.join("blockrec");
    std::fs::create_dir_all(&out).unwrap();
    let lock = std::fs::File::create(out.join(".lock")).unwrap();
    lock.lock().unwrap();
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/blockrec");
    let built = Command::new("go")
        .args(["build", "-o", binary.to_str().unwrap(), "."])
        .current_dir(source)
        .status()
        .unwrap();
    assert!(built.success(), "cannot build {source}");
    binary
}

/// This source built with its deferral unsynced (the control), once, cached like the old
/// release's binary (tests/support/old_release.rs).
fn control_binary() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("power-cut-control");
    std::fs::create_dir_all(&target).unwrap();
    let lock = std::fs::File::create(target.join(".lock")).unwrap();
    lock.lock().unwrap();
    let built = Command::new("cargo")
        .args([
            "build",
            "--offline",
            "--features",
            "power-cut-control",
            "--bins",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap();
    assert!(built.success(), "cannot build the control");
    target.join("debug").join("sandbox-guard")
}

/// Which plugin binary runs the verbs.
#[derive(Clone, Copy)]
enum Build<'a> {
    Tested,
    Control(&'a Path),
}

impl Build<'_> {
    /// `call` run under `boot`, by this build.
    fn run(self, boot: &Boot, call: Cni) -> cni::Reply {
        let mut wrapper = boot.wrapper();
        if let Build::Control(binary) = self {
            // The wrapper's shell gets the tested binary as $1; it runs the control instead.
            let last = wrapper.len() - 2;
            wrapper[last] =
                wrapper[last].replace("exec \"$@\"", &format!("exec {}", binary.display()));
        }
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        call.wrapped_in(&wrapper).run()
    }
}

/// A disk whose writes blockrec records: the FUSE server, the loop device over its file and
/// the file system mounted from it at `mnt`.
struct Recording {
    server: Child,
    fuse: PathBuf,
    device: String,
    mnt: PathBuf,
}

impl Recording {
    fn start(blockrec: &Path, base: &Path, log: &Path, work: &Path, mnt: &Path) -> Recording {
        let fuse = work.join("fuse");
        std::fs::create_dir_all(&fuse).unwrap();
        let server = Command::new(blockrec)
            .args(["serve", "--base"])
            .arg(base)
            .arg("--log")
            .arg(log)
            .arg("--mnt")
            .arg(&fuse)
            .spawn()
            .unwrap();
        let disk = fuse.join("disk");
        for _ in 0..200 {
            if disk.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert!(disk.exists(), "blockrec did not mount {}", fuse.display());
        let device = attach(&disk);
        sys::run("mount", &[&device, mnt.to_str().unwrap()]);
        Recording {
            server,
            fuse,
            device,
            mnt: mnt.to_path_buf(),
        }
    }

    fn stop(mut self) {
        sys::run("umount", &[self.mnt.to_str().unwrap()]);
        sys::run("losetup", &["-d", &self.device]);
        let _ = Command::new("kill")
            .args(["-TERM", &self.server.id().to_string()])
            .status();
        let status = self.server.wait().unwrap();
        assert!(status.success(), "blockrec serve: {status}");
        let _ = std::fs::remove_dir(&self.fuse);
    }
}

fn attach(file: &Path) -> String {
    let out = sys::run("losetup", &["--find", "--show", file.to_str().unwrap()]);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// How many write records a blockrec log holds in its first `bytes` bytes (the log read while
/// being written: each record goes in whole, at once).
fn writes_within(log: &Path, bytes: u64) -> usize {
    let data = std::fs::read(log).unwrap();
    let end = (bytes as usize).min(data.len());
    let (mut at, mut writes) = (24, 0);
    while at + 32 <= end {
        let kind = data[at];
        let len = u64::from_le_bytes(data[at + 24..at + 32].try_into().unwrap()) as usize;
        let next = at + 32 + if kind == b'W' { len } else { 0 };
        if next > end {
            break;
        }
        if kind == b'W' || kind == b'Z' {
            writes += 1;
        }
        at = next;
    }
    writes
}

/// The pods and sandboxes of the sequence.
struct Cast {
    pods: [Pod; 3],
    /// Per pod: the sandboxes of the boot before, in order of their ADD.
    old: [Vec<String>; 3],
    /// Per pod: its sandbox in the new boot.
    new: [String; 3],
}

impl Cast {
    fn new() -> Cast {
        let id = |c: char| c.to_string().repeat(64);
        Cast {
            pods: [
                Pod::new("cut", "db-0"),
                Pod::new("cut", "web-0"),
                Pod::new("cut", "cache-0"),
            ],
            old: [
                vec![id('a'), id('b')],
                vec![id('c'), id('d')],
                vec![id('e')],
            ],
            new: [id('1'), id('2'), id('3')],
        }
    }
}

/// What the sequence before the cut left: the recorded log, the primary's calls then, and
/// where in the log the guard acknowledged each deferral.
struct Recorded {
    base: PathBuf,
    log: PathBuf,
    calls_before: String,
    /// The deferred DELs (container IDs) and how many writes the log held when each was
    /// acknowledged.
    deferred: Vec<(String, usize)>,
}

/// Before the cut, in one boot: db-0's sandbox a, then b (the pod force-deleted and made
/// again: b's ADD before a's DEL), a's DEL and its repeat from RemovePodSandbox (deferred:
/// b owns the pod); web-0's c torn down as a pod is (its DEL passes), then d; cache-0's e.
fn record(
    build: Build,
    cast: &Cast,
    primary: &CountingPrimary,
    store: &Store,
    work: &Path,
    mnt: &Path,
) -> Recorded {
    let base = work.join("base.img");
    let log = work.join("writes.log");
    sys::run("truncate", &["-s", "64M", base.to_str().unwrap()]);
    sys::run("mkfs.ext4", &["-q", "-F", base.to_str().unwrap()]);
    let recording = Recording::start(blockrec(), &base, &log, work, mnt);
    let boot = Boot::new(0xa);
    let verb = |call: Cni| {
        let reply = build.run(&boot, primary.wrap(call));
        reply.assert_ok();
        assert!(
            store.wait_for_replays(REPLAYS),
            "a replay outlived {REPLAYS:?}"
        );
    };
    let [db, web, cache] = &cast.pods;
    verb(store.add(&cast.old[0][0], db));
    verb(store.add(&cast.old[0][1], db));
    verb(store.del(&cast.old[0][0], db));
    let acked = writes_within(&log, std::fs::metadata(&log).unwrap().len());
    let deferred = vec![(cast.old[0][0].clone(), acked)];
    verb(store.del(&cast.old[0][0], db).netns(""));
    verb(store.add(&cast.old[1][0], web));
    verb(store.del(&cast.old[1][0], web));
    verb(store.del(&cast.old[1][0], web).netns(""));
    verb(store.add(&cast.old[1][1], web));
    verb(store.add(&cast.old[2][0], cache));
    let_go(store);
    recording.stop();
    let calls_before = std::fs::read_to_string(&primary.call_log).unwrap_or_default();
    assert!(
        !calls_before
            .lines()
            .any(|l| l.starts_with("DEL ") && l.contains(&cast.old[0][0])),
        "a's DEL was not deferred: {calls_before}"
    );
    Recorded {
        base,
        log,
        calls_before,
        deferred,
    }
}

/// The cuts to play: every number of writes the disk may have held.
fn cuts(log: &Path) -> Vec<usize> {
    let out = sys::run(
        blockrec().to_str().unwrap(),
        &["cuts", "--log", log.to_str().unwrap()],
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// Plays the next boot on the disk cut after `writes` writes; the harm it finds.
#[allow(clippy::too_many_arguments)]
fn play_cut(
    build: Build,
    cast: &Cast,
    recorded: &Recorded,
    primary: &CountingPrimary,
    store: &Store,
    work: &Path,
    mnt: &Path,
    (writes, subset): (usize, Option<u64>),
) -> Vec<String> {
    let image = work.join("cut.img");
    let _ = std::fs::remove_file(&image);
    let (upto, seed) = (writes.to_string(), subset.unwrap_or_default().to_string());
    let mut args = vec![
        "replay",
        "--base",
        recorded.base.to_str().unwrap(),
        "--log",
        recorded.log.to_str().unwrap(),
        "--upto",
        &upto,
        "--out",
        image.to_str().unwrap(),
    ];
    if subset.is_some() {
        args.extend(["--subset", &seed]);
    }
    sys::run(blockrec().to_str().unwrap(), &args);
    let device = attach(&image);
    sys::run("mount", &[&device, mnt.to_str().unwrap()]);
    std::fs::write(&primary.call_log, &recorded.calls_before).unwrap();
    let boot = Boot::new(0xb);
    let mut harm = Vec::new();
    let verb = |what: &str, call: Cni, harm: &mut Vec<String>| {
        let reply = build.run(&boot, primary.wrap(call));
        if !reply.status.success() {
            harm.push(format!("{what} failed: {}", reply.stdout.trim()));
        }
        if !store.wait_for_replays(REPLAYS) {
            harm.push(format!("a replay after {what} outlived {REPLAYS:?}"));
        }
    };
    // The runtime stops and removes every sandbox it still has; a's was removed before.
    let still_there: Vec<(usize, &String)> = cast
        .old
        .iter()
        .enumerate()
        .flat_map(|(pod, ids)| ids.iter().map(move |id| (pod, id)))
        .filter(|(_, id)| **id != cast.old[0][0] && **id != cast.old[1][0])
        .collect();
    for &(pod, id) in &still_there {
        for _ in 0..2 {
            verb(
                "an old sandbox's DEL",
                store.del(id, &cast.pods[pod]).netns(""),
                &mut harm,
            );
        }
    }
    for (pod, id) in cast.new.iter().enumerate() {
        verb(
            "a new sandbox's ADD",
            store.add(id, &cast.pods[pod]),
            &mut harm,
        );
    }
    for &(pod, id) in &still_there {
        verb(
            "the GC's repeat of an old DEL",
            store.del(id, &cast.pods[pod]).netns(""),
            &mut harm,
        );
    }
    let valid: Vec<serde_json::Value> = cast
        .new
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    verb(
        "the GC sweep",
        store
            .cni("GC", "")
            .config("cni.dev/valid-attachments", Some(json!(valid))),
        &mut harm,
    );
    let rows = boot.dump(&store.state_dir);
    for row in rows.iter().filter(|r| r["owner"] == true) {
        let owner = row["containerId"].as_str().unwrap_or_default();
        if !cast.new.iter().any(|id| id == owner) {
            harm.push(format!(
                "{owner} owns its pod, and is no sandbox of the new boot"
            ));
        }
    }
    for (pod, id) in cast.new.iter().enumerate() {
        verb(
            "the scale to zero",
            store.del(id, &cast.pods[pod]),
            &mut harm,
        );
    }
    verb(
        "a GC after the scale to zero",
        store
            .cni("GC", "")
            .config("cni.dev/valid-attachments", Some(json!([]))),
        &mut harm,
    );
    let calls = primary.calls();
    let after_cut = &calls[recorded.calls_before.lines().count()..];
    for (pod, new) in cast.new.iter().enumerate() {
        let name = format!("{}/{}", cast.pods[pod].namespace, cast.pods[pod].name);
        let lives = |i: usize| {
            let added = after_cut[..i]
                .iter()
                .any(|c| c.verb == "ADD" && c.container == *new);
            let gone = after_cut[..i]
                .iter()
                .any(|c| c.verb == "DEL" && c.container == *new);
            added && !gone
        };
        for (i, call) in after_cut.iter().enumerate() {
            if call.verb == "DEL" && call.pod == name && call.container != *new && lives(i) {
                harm.push(format!(
                    "{}'s DEL reached the primary while {new} owned {name}",
                    call.container
                ));
            }
        }
    }
    for (id, acked) in &recorded.deferred {
        // A subset may drop the writes the deferral's own flush made durable at a cut right at
        // its acknowledgement: that flush is the barrier after them, not among the cut's.
        let durable = match subset {
            None => *acked <= writes,
            Some(_) => *acked < writes,
        };
        if durable && !calls.iter().any(|c| c.verb == "DEL" && c.container == *id) {
            harm.push(format!(
                "{id}'s deferred DEL, acknowledged at write {acked}, never reached the primary"
            ));
        }
    }
    let_go(store);
    sys::run("umount", &[mnt.to_str().unwrap()]);
    sys::run("losetup", &["-d", &device]);
    harm
}

/// Ends the replay workers and waits for them to go: each runs in the mount namespace of the
/// verb that started it, with its copy of the disk's mount, which would keep the file system
/// and the loop device alive past the umount and send its last writes into the next cut.
fn let_go(store: &Store) {
    store.kill_replay_workers();
    for _ in 0..400 {
        if store.replay_workers().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "replay workers outlived their kill: {:?}",
        store.replay_workers()
    );
}

/// The harm found, by cut (writes, and the seed of the unflushed writes kept).
type Harmed = BTreeMap<(usize, Option<u64>), Vec<String>>;

/// Records the sequence with `build` and plays every cut, and with `subsets` each cut again
/// with a random half of the writes since the last flush lost (a drive's volatile cache).
fn run(build: Build, subsets: bool) -> (usize, Harmed) {
    let work = sys::TempDir::new("sgcut");
    let mnt = work.path.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cast = Cast::new();
    let primary = CountingPrimary::new();
    let store = Store::with_state_dir(mnt.join("state"), &work.path);
    let recorded = record(build, &cast, &primary, &store, &work.path, &mnt);
    let cuts = cuts(&recorded.log);
    let mut harmed = BTreeMap::new();
    let seeds = if subsets {
        vec![None, Some(0x5eed)]
    } else {
        vec![None]
    };
    for &writes in &cuts {
        for &seed in &seeds {
            let cut = (writes, seed.map(|s: u64| s + writes as u64));
            let harm = play_cut(
                build, &cast, &recorded, &primary, &store, &work.path, &mnt, cut,
            );
            if !harm.is_empty() {
                harmed.insert(cut, harm);
            }
        }
    }
    eprintln!(
        "{} cuts of {} writes, {} plays (deferral acknowledged at write {:?}); harm at {} plays",
        cuts.len(),
        cuts.last().unwrap_or(&0),
        cuts.len() * seeds.len(),
        recorded
            .deferred
            .iter()
            .map(|(_, at)| at)
            .collect::<Vec<_>>(),
        harmed.len()
    );
    (cuts.len(), harmed)
}

#[test]
fn at_every_cut_of_the_write_log_the_next_boot_decides_without_harm() {
    sys::skip_unless_root!(TOOLS);
    let (cuts, harmed) = run(Build::Tested, true);
    assert!(cuts > 10, "only {cuts} cuts: nothing was recorded?");
    assert!(
        harmed.is_empty(),
        "harm at {} of {cuts} cuts: {harmed:#?}",
        harmed.len()
    );
}

/// The control: without the deferral's sync a deferred DEL is lost at some cut.
#[test]
fn a_build_without_the_deferrals_sync_loses_a_deferred_del() {
    sys::skip_unless_root!(TOOLS);
    let control = control_binary();
    let (cuts, harmed) = run(Build::Control(&control), false);
    let lost = harmed
        .values()
        .flatten()
        .filter(|h| h.contains("never reached the primary"))
        .count();
    eprintln!("control: {lost} lost deferrals over {cuts} cuts; all harm: {harmed:#?}");
    assert!(
        lost > 0,
        "the control showed no lost deferral over {cuts} cuts: {harmed:#?}"
    );
}
