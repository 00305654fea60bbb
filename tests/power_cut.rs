//! The power cut, judged by decisions, not bytes (docs/store.md).
//!
//! A sequence of delegate-mode verbs runs on a state dir on journaled ext4 whose block writes
//! are recorded (tests/blockrec: a loop device over a FUSE file that logs each write and each
//! cache flush). At every cut of that log, the image as the disk held it then is mounted (its
//! journal replayed) and the next boot is played on it under a new boot id, in both orders
//! kubelet has (`Order`), as containerd runs it (no CNI GC): every old sandbox the runtime
//! still has is stopped and removed (DELs with an empty netns), each pod's new sandbox added,
//! the container GC's DELs repeated, and at last the pods scaled to zero. The primary
//! (tests/primaries/counting-primary) logs every call; which pod a call is of comes from the
//! cast, so its harm is judged as a pod-name-keyed primary would suffer it. Harm is:
//! - a DEL of another sandbox of a pod reaching the primary while the pod's new sandbox lives
//!   (it would free the new pod's name-keyed state);
//! - a pod that cannot restart (its new ADD fails), or an old sandbox's DEL that fails;
//! - a deferred DEL the guard acknowledged before the cut that never reaches the primary (its
//!   sandbox is gone from the runtime, so nothing else will ever tear it down there), any old
//!   sandbox never torn down at the primary, or a deferred DEL left once every pod is gone;
//! - owners other than none after the old DELs (same UID), and the new sandboxes after the
//!   new ADDs.
//!
//! The control is a build whose deferral is written without its sync (`--features
//! power-cut-control`), recording its own sequence as a node running it would: it must lose
//! the deferral at some cut. The recording mount commits its journal on syncs alone (no
//! timer within the sequence), so that loss does not hang on the journal's timer.

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
use cni::{Cni, Pod, Store, container_id};
use counting_primary::CountingPrimary;
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
        self.wrap(boot, call).run()
    }

    /// `call` under `boot`, by this build, to run.
    fn wrap(self, boot: &Boot, call: Cni) -> Cni {
        let mut wrapper = boot.wrapper();
        if let Build::Control(binary) = self {
            // The wrapper's shell gets the tested binary as $1; it runs the control instead.
            let last = wrapper.len() - 2;
            wrapper[last] =
                wrapper[last].replace("exec \"$@\"", &format!("exec {}", binary.display()));
        }
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        call.wrapped_in(&wrapper)
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
        // No journal commit on the timer while the sequence runs (it takes a second): what is
        // durable at a cut is what a sync made so, for the tested build and the control alike.
        sys::run(
            "mount",
            &["-o", "commit=300", &device, mnt.to_str().unwrap()],
        );
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
            // The cut-off sandbox's ID is this run's alone: its processes are found by it
            // (`cut_off_at_the_primary`), and the other test may run beside this one.
            old: [
                vec![id('a'), id('b')],
                vec![id('c'), id('d')],
                vec![id('e'), container_id()],
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
    /// The deferred DEL (a's) and how many writes the log held when it was acknowledged.
    deferred: Vec<(String, usize)>,
    /// The sandboxes whose DEL the runtime saw succeed before the cut, and from which write on
    /// (a's, deferred, and c's): a cut before leaves them with the runtime.
    torn_down: Vec<(String, usize)>,
}

/// Before the cut, in one boot: db-0's sandbox a, then b (the pod force-deleted and made
/// again: b's ADD before a's DEL), a's DEL and its repeat from RemovePodSandbox (deferred:
/// b owns the pod); web-0's c torn down as a pod is (its DEL passes), then d; cache-0's e,
/// then f, whose ADD the power cut ends while the primary has it (`cut_off_at_the_primary`).
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
    let acked = || writes_within(&log, std::fs::metadata(&log).unwrap().len());
    verb(store.del(&cast.old[0][0], db));
    let deferred = vec![(cast.old[0][0].clone(), acked())];
    verb(store.del(&cast.old[0][0], db).netns(""));
    verb(store.add(&cast.old[1][0], web));
    verb(store.del(&cast.old[1][0], web));
    let torn_down = vec![deferred[0].clone(), (cast.old[1][0].clone(), acked())];
    verb(store.del(&cast.old[1][0], web).netns(""));
    verb(store.add(&cast.old[1][1], web));
    verb(store.add(&cast.old[2][0], cache));
    cut_off_at_the_primary(
        build.wrap(
            &boot,
            primary.wrap_with_slow_ipam(store.add(&cast.old[2][1], cache), 600.0),
        ),
        &cast.old[2][1],
        primary,
    );
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
        torn_down,
    }
}

/// Runs `add` (of sandbox `container`) until the primary has logged it, then kills every
/// process of that ADD at once, the guard's and the primary's (its environment names the
/// sandbox), as the power cut ends them: nothing of the ADD writes after. Its sandbox is one
/// the runtime still has after the reboot (its metadata made before the network), so it gets
/// the old sandboxes' DELs; a runtime that lost it sends none, which asks less of the guard.
fn cut_off_at_the_primary(add: Cni, container: &str, primary: &CountingPrimary) {
    let running = add.spawn();
    let at_primary = format!("ADD cid={container} ");
    let logged = || {
        std::fs::read_to_string(&primary.call_log)
            .unwrap_or_default()
            .lines()
            .any(|line| line.starts_with(&at_primary))
    };
    for _ in 0..800 {
        if logged() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        logged(),
        "the cut-off ADD of {container} never reached the primary"
    );
    let marker = format!("CNI_CONTAINERID={container}").into_bytes();
    let of_the_add = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == marker))
            })
            .collect()
    };
    for _ in 0..400 {
        let pids = of_the_add();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        of_the_add().is_empty(),
        "the cut-off ADD's processes outlived their kill"
    );
    let reply = running.wait();
    assert!(
        !reply.status.success(),
        "the cut-off ADD answered: {reply:?}"
    );
}

/// The cuts to play: every number of writes the disk may have held, or (`at_flushes`) those
/// at which the disk flushed its cache.
fn cuts(log: &Path, at_flushes: bool) -> Vec<usize> {
    let mut args = vec!["cuts", "--log", log.to_str().unwrap()];
    if at_flushes {
        args.push("--barriers");
    }
    let out = sys::run(blockrec().to_str().unwrap(), &args);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// The orders in which kubelet's next boot reaches the plugin (field notes, 2026-11-25 and
/// 2026-12-01): for one pod UID, every old sandbox stopped and removed before the new one
/// runs; for a pod made again under a new UID (a StatefulSet's, force-deleted), the new
/// sandbox first, and the container GC's stops and removals of the old ones after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Order {
    SameUid,
    NewUid,
}

/// A cut to play: the writes the disk held, the seed of the unflushed writes kept (none: all
/// of them), and the order of the next boot.
type Cut = (usize, Option<u64>, Order);

/// A disk image attached and mounted at `mnt`, taken down on drop (a failed check too).
struct Mounted {
    device: String,
    mnt: PathBuf,
}

impl Mounted {
    fn new(image: &Path, mnt: &Path) -> Mounted {
        let mounted = Mounted {
            device: attach(image),
            mnt: mnt.to_path_buf(),
        };
        sys::run("mount", &[&mounted.device, mnt.to_str().unwrap()]);
        mounted
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// What one play found: the harm, and whether the disk held the note of the ADD the power
/// cut ended at the primary.
struct Played {
    harm: Vec<String>,
    noted: bool,
}

/// Plays the next boot on the disk of `cut`.
fn play_cut(
    build: Build,
    cast: &Cast,
    recorded: &Recorded,
    primary: &CountingPrimary,
    store: &Store,
    work: &Path,
    (writes, subset, order): Cut,
) -> Played {
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
    let mounted = Mounted::new(&image, store.state_dir.parent().unwrap());
    let noted = cni::walk(&store.state_dir.join("pending-adds"))
        .iter()
        .any(|path| path.is_file());
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
    let owners = |harm: &mut Vec<String>, expected: &[String]| {
        let mut found: Vec<String> = boot
            .dump(&store.state_dir)
            .iter()
            .filter(|r| r["owner"] == true)
            .filter_map(|r| r["containerId"].as_str().map(str::to_string))
            .collect();
        found.sort();
        if found != expected {
            harm.push(format!("the owners are {found:?}, not {expected:?}"));
        }
    };
    // In that order the pods come back under new UIDs (the same names).
    let pods: Vec<Pod> = cast
        .pods
        .iter()
        .map(|pod| match order {
            Order::SameUid => pod.clone(),
            Order::NewUid => Pod::new(&pod.namespace, &pod.name),
        })
        .collect();
    // What the runtime still has: every old sandbox but those whose DEL it saw succeed.
    let still_there: Vec<(usize, &String)> = cast
        .old
        .iter()
        .enumerate()
        .flat_map(|(pod, ids)| ids.iter().map(move |id| (pod, id)))
        .filter(|(_, id)| {
            !recorded
                .torn_down
                .iter()
                .any(|(gone, acked)| gone == *id && *acked <= writes)
        })
        .collect();
    let old_dels = |harm: &mut Vec<String>| {
        for &(pod, id) in &still_there {
            for _ in 0..2 {
                let del = store.del(id, &cast.pods[pod]).netns("");
                verb("an old sandbox's DEL", del, harm);
            }
        }
    };
    let new_adds = |harm: &mut Vec<String>| {
        for (pod, id) in cast.new.iter().enumerate() {
            verb("a new sandbox's ADD", store.add(id, &pods[pod]), harm);
        }
    };
    match order {
        Order::SameUid => {
            old_dels(&mut harm);
            owners(&mut harm, &[]);
            new_adds(&mut harm);
        }
        Order::NewUid => {
            new_adds(&mut harm);
            old_dels(&mut harm);
        }
    }
    // The container GC's repeats; then the new sandboxes own every pod.
    for &(pod, id) in &still_there {
        let del = store.del(id, &cast.pods[pod]).netns("");
        verb("the GC's repeat of an old DEL", del, &mut harm);
    }
    let mut new: Vec<String> = cast.new.to_vec();
    new.sort();
    owners(&mut harm, &new);
    for (pod, id) in cast.new.iter().enumerate() {
        verb("the scale to zero", store.del(id, &pods[pod]), &mut harm);
    }
    let calls = primary.calls();
    let after_cut = &calls[recorded.calls_before.lines().count()..];
    // Whose pod each sandbox is, from the cast (the log's pod= is what CNI_ARGS said).
    let pod_of = |container: &str| {
        (0..cast.pods.len()).find(|&pod| {
            cast.old[pod].iter().any(|id| id == container) || cast.new[pod] == container
        })
    };
    for (pod, new) in cast.new.iter().enumerate() {
        let added = after_cut
            .iter()
            .position(|c| c.verb == "ADD" && c.container == *new);
        let gone = after_cut
            .iter()
            .position(|c| c.verb == "DEL" && c.container == *new);
        let (Some(added), Some(gone)) = (added, gone) else {
            harm.push(format!("{new}'s ADD or DEL never reached the primary"));
            continue;
        };
        for call in &after_cut[added..gone] {
            if call.verb == "DEL" && pod_of(&call.container) == Some(pod) && call.container != *new
            {
                harm.push(format!(
                    "{}'s DEL reached the primary while {new} owned {}",
                    call.container, cast.pods[pod].name
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
    // Every sandbox the runtime still had is torn down at the primary once its pod is gone,
    // and nothing is left deferred.
    for &(_, id) in &still_there {
        if !calls.iter().any(|c| c.verb == "DEL" && c.container == *id) {
            harm.push(format!("{id} was never torn down at the primary"));
        }
    }
    let left = cni::walk(&store.state_dir.join("deferred"))
        .into_iter()
        .filter(|p| p.is_file())
        .count();
    if left > 0 {
        harm.push(format!("{left} deferred DELs left after every pod is gone"));
    }
    let_go(store);
    drop(mounted);
    Played { harm, noted }
}

/// Ends the replay workers and waits for them to go: each runs in the mount namespace of the
/// verb that started it, with its copy of the disk's mount, which would keep the file system
/// and the loop device alive past the umount and send its last writes into the next cut.
fn let_go(store: &Store) {
    let workers = store.replay_workers();
    store.kill_replay_workers();
    // Gone, or a zombie: its mount namespace, and with it the disk's mount, is released.
    let alive = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    for _ in 0..400 {
        if !workers.iter().any(alive) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("replay workers outlived their kill: {workers:?}");
}

/// The harm found, by cut.
type Harmed = BTreeMap<Cut, Vec<String>>;

/// Records the sequence with `build` and plays every cut in `orders`; with `subsets`, each cut
/// at a flush again with a random half of the writes since the one before lost (a drive's
/// volatile cache), in the first order. Returns how many plays ran, the harm, and in how many
/// plays the disk held the cut-off ADD's note.
fn run(build: Build, orders: &[Order], subsets: bool) -> (usize, Harmed, usize) {
    let work = sys::TempDir::new("sgcut");
    let mnt = work.path.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cast = Cast::new();
    let primary = CountingPrimary::new();
    let store = Store::with_state_dir(mnt.join("state"), &work.path);
    let recorded = record(build, &cast, &primary, &store, &work.path, &mnt);
    let mut plays: Vec<Cut> = cuts(&recorded.log, false)
        .into_iter()
        .flat_map(|writes| orders.iter().map(move |&order| (writes, None, order)))
        .collect();
    if subsets {
        let at_flushes = cuts(&recorded.log, true);
        plays.extend(
            at_flushes
                .iter()
                .map(|&writes| (writes, Some(0x5eed + writes as u64), orders[0])),
        );
    }
    let (mut harmed, mut noted) = (BTreeMap::new(), 0);
    for &cut in &plays {
        let played = play_cut(build, &cast, &recorded, &primary, &store, &work.path, cut);
        noted += usize::from(played.noted);
        if !played.harm.is_empty() {
            harmed.insert(cut, played.harm);
        }
    }
    eprintln!(
        "{} plays over {} writes (deferral acknowledged at write {:?}, the runtime's teardowns at {:?}; the cut-off ADD's note on the disk in {noted}); harm at {} plays",
        plays.len(),
        cuts(&recorded.log, false).last().unwrap_or(&0),
        recorded
            .deferred
            .iter()
            .map(|(_, at)| at)
            .collect::<Vec<_>>(),
        recorded
            .torn_down
            .iter()
            .map(|(_, at)| at)
            .collect::<Vec<_>>(),
        harmed.len()
    );
    (plays.len(), harmed, noted)
}

#[test]
fn at_every_cut_of_the_write_log_the_next_boot_decides_without_harm() {
    sys::skip_unless_root!(TOOLS);
    let (cuts, harmed, noted) = run(Build::Tested, &[Order::SameUid, Order::NewUid], true);
    assert!(cuts > 10, "only {cuts} cuts: nothing was recorded?");
    // Played both with and without it on the disk.
    assert!(
        noted > 0 && noted < cuts,
        "the cut-off ADD's note was on the disk in {noted} of {cuts} plays"
    );
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
    let (cuts, harmed, _) = run(Build::Control(&control), &[Order::SameUid], false);
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
