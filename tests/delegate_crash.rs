//! Delegate mode can lose the guard at any instruction too (OOM killer, a runtime's timeout,
//! power), now with a primary process of its own in flight and DELs it promised to run later.
//! SIGKILL lands at each of the guard's steps in turn (strace stops it on entry to the n-th
//! rename, unlink, fsync, lock, netlink request, fork, wait or write, for every n until a run
//! gets through), then at random moments, during a deferral (a stale DEL recorded instead of
//! run), a replay (the owner's DEL, then each deferred DEL of the pod handed to the primary)
//! and a GC's replay.
//! Each interrupted operation is retried as the runtime retries it, and then:
//! - no deferred DEL is lost: each stale DEL that got success is deferred or has reached the
//!   primary, and each reaches it once the pod is free;
//! - none reaches the primary while another sandbox holds the pod there (what a primary keyed
//!   by pod name cannot survive), and one reaches it twice only when the guard that handed it
//!   over was killed before it could note so (what a DEL-idempotent primary tolerates);
//! - the store keeps its invariants: no owner without its record, one deferred DEL per
//!   attachment and never one of the pod's owner.
//!
//! The primary is tests/primaries/counting-primary, which logs every call it gets.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/counting_primary.rs"]
mod counting_primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Cni, Pod, Reply, SeededRng, Store, Traced, container_id};
use counting_primary::{CountingPrimary, PrimaryCall};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The guard's steps: the store's writes (fsync, rename) and removals, its locks, netlink
/// requests (taking the interface out of a stale sandbox), starting the primary, feeding it
/// and waiting for it, the log and the answer. strace counts each
/// system call on its own, so each is a loop of its own; `?`: not every arch has each.
const KILL_POINTS: [&str; 23] = [
    "?rename",
    "?renameat",
    "?renameat2",
    "?unlink",
    "?unlinkat",
    "?rmdir",
    "?mkdir",
    "?mkdirat",
    "?fsync",
    "?fdatasync",
    "?flock",
    "?sendto",
    "?sendmsg",
    "?clone",
    "?clone3",
    "?vfork",
    "?fork",
    "?wait4",
    "?waitid",
    "?write",
    // How the store makes a new record (linked in) and an ownership or index entry (a symlink).
    "?linkat",
    "?symlink",
    "?symlinkat",
];
/// More calls of one system call than any operation here makes: a loop that reaches it
/// never finished.
const MAX_NTH: usize = 100;
const RANDOM_ROUNDS: usize = 20;
const SEED: u64 = 0xde1e_9a7e;
const TOOLS: &[&str] = &["ip", "strace", "flock", "sha256sum", "paste"];
const SIGKILL: i32 = 9;
/// DELs that reached the primary again after a kill, so the summary shows the case was met.
static REPEATS: AtomicUsize = AtomicUsize::new(0);

/// One sandbox of the pod, attached through the guard to the primary.
struct Sandbox {
    container: String,
    pod: Pod,
    netns: sys::Netns,
    /// The guard's ADD result, which the runtime caches and hands back on DEL.
    result: Value,
}

impl Sandbox {
    fn address(&self) -> String {
        let cidr = self.result["ips"][0]["address"].as_str().unwrap();
        cidr.split('/').next().unwrap().to_string()
    }

    fn has_interface(&self) -> bool {
        self.netns.try_exec(&["ip", "link", "show", "eth0"])
    }
}

#[derive(Clone, Copy, Debug)]
enum Kill {
    Never,
    /// On entry to the guard's n-th call of a system call.
    AtNth(&'static str, usize),
    After(Duration),
    /// The runtime that ran the guard exits this long in without killing it: nobody reads
    /// its answer (a containerd restart can do that).
    RuntimeGone(Duration),
}

/// A DEL that reached the primary: the run that handed it over, its index in the call log.
struct Delivery {
    run: usize,
    at: usize,
    call: PrimaryCall,
}

/// How one exec of the guard went.
struct Outcome {
    reply: Reply,
    killed: bool,
    took: Duration,
}

/// One exec of the guard, and the primary's calls it made (their indices in the call log).
struct Run {
    what: String,
    killed: bool,
    calls: Range<usize>,
}

/// A store, a counting primary behind it and every guard exec so far.
struct World {
    store: Store,
    primary: CountingPrimary,
    runs: Vec<Run>,
}

impl World {
    /// A new world with `N` sandboxes of the pod crash/etcd-0, ADDed oldest first: the last
    /// one owns the pod.
    fn with_sandboxes<const N: usize>() -> (World, [Sandbox; N]) {
        let mut world = World {
            store: Store::new(),
            primary: CountingPrimary::new(),
            runs: Vec::new(),
        };
        let sandboxes = std::array::from_fn(|_| world.sandbox("crash", "etcd-0"));
        (world, sandboxes)
    }

    /// A new sandbox of `namespace/name` (a new pod UID), ADDed through the guard.
    fn sandbox(&mut self, namespace: &str, name: &str) -> Sandbox {
        let (container, pod, netns) = (
            container_id(),
            Pod::new(namespace, name),
            sys::Netns::new("sgdc"),
        );
        let netns_path = netns.path().to_string_lossy().into_owned();
        let call = self.primary.wrap(
            self.store
                .add(&container, &pod)
                .netns(&netns_path)
                .no_prev_result(),
        );
        let result = self.run(call, Kill::Never).reply.json();
        Sandbox {
            container,
            pod,
            netns,
            result,
        }
    }

    /// A newer sandbox of `pod`'s name (a new pod UID), ADDed through the guard as `kill`
    /// says, its primary first waiting `ipam_seconds` for a child of its own when given.
    fn newer_sandbox(
        &mut self,
        pod: &Pod,
        kill: Kill,
        ipam_seconds: Option<f64>,
    ) -> (Sandbox, Outcome) {
        let (container, pod, netns) = (
            container_id(),
            Pod::new(&pod.namespace, &pod.name),
            sys::Netns::new("sgdc"),
        );
        let netns_path = netns.path().to_string_lossy().into_owned();
        let add = self
            .store
            .add(&container, &pod)
            .netns(&netns_path)
            .no_prev_result();
        let call = match ipam_seconds {
            Some(seconds) => self.primary.wrap_with_slow_ipam(add, seconds),
            None => self.primary.wrap(add),
        };
        let outcome = self.run(call, kill);
        let result = if outcome.killed {
            Value::Null
        } else {
            outcome.reply.json()
        };
        let sandbox = Sandbox {
            container,
            pod,
            netns,
            result,
        };
        (sandbox, outcome)
    }

    /// A newer sandbox of `pod`'s name (a new pod UID), not ADDed yet, and its ADD's call.
    fn unstarted_sandbox(&self, pod: &Pod) -> (Sandbox, Cni) {
        let sandbox = Sandbox {
            container: container_id(),
            pod: Pod::new(&pod.namespace, &pod.name),
            netns: sys::Netns::new("sgdc"),
            result: Value::Null,
        };
        let add = self
            .store
            .add(&sandbox.container, &sandbox.pod)
            .netns(&sandbox.netns.path().to_string_lossy())
            .no_prev_result();
        (sandbox, add)
    }

    /// A newer sandbox of `owner`'s pod whose ADD is cut off half a second in, while its
    /// primary waits `ipam_seconds` for a child of its own; and the path of its note.
    fn cut_off_beside(&mut self, owner: &Sandbox, ipam_seconds: f64) -> (Sandbox, PathBuf) {
        let (cut_off, interrupted) = self.newer_sandbox(
            &owner.pod,
            Kill::After(Duration::from_millis(500)),
            Some(ipam_seconds),
        );
        assert!(interrupted.killed, "the ADD was not cut off at the primary");
        let note = self
            .store
            .state_dir
            .join("pending-adds")
            .join(owner_digest(self, owner));
        (cut_off, note)
    }

    /// Runs `owner`'s DEL, which must give the primary `cut_off`'s DEL before its own.
    fn assert_owners_del_rolls_back_first(&mut self, owner: &Sandbox, cut_off: &Sandbox) {
        let owners_del = self.runs.len();
        self.run(self.del(owner, true), Kill::Never);
        let first =
            |dels: Vec<Delivery>| dels.into_iter().find(|d| d.run == owners_del).map(|d| d.at);
        let (cut_off_at, owner_at) = (first(self.dels_of(cut_off)), first(self.dels_of(owner)));
        assert!(
            matches!((cut_off_at, owner_at), (Some(a), Some(b)) if a < b),
            "the owner's DEL did not give the primary the cut-off sandbox's DEL before its own:\n{}",
            self.history()
        );
    }

    /// The runtime's DEL of `sandbox`: StopPodSandbox's with the netns, RemovePodSandbox's
    /// without; both with the cached result, if its ADD gave one.
    fn del(&self, sandbox: &Sandbox, with_netns: bool) -> Cni {
        let netns = if with_netns {
            sandbox.netns.path().to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let del = self
            .store
            .del(&sandbox.container, &sandbox.pod)
            .netns(&netns);
        self.primary.wrap(if sandbox.result.is_null() {
            del.no_prev_result()
        } else {
            del.prev_result(&sandbox.result)
        })
    }

    /// GC listing `valid` as the runtime's attachments.
    fn gc(&self, valid: &[&Sandbox]) -> Cni {
        let list: Vec<Value> = valid
            .iter()
            .map(|s| json!({"containerID": s.container, "ifname": "eth0"}))
            .collect();
        self.primary.wrap(
            self.store
                .cni("GC", "")
                .config("cni.dev/valid-attachments", Some(Value::Array(list))),
        )
    }

    /// Runs `call`, killing the guard as `kill` says; a run that was not killed must succeed.
    fn run(&mut self, call: Cni, kill: Kill) -> Outcome {
        let before = self.primary.calls().len();
        let started = Instant::now();
        let reply = match kill {
            Kill::Never => call.run(),
            Kill::AtNth(syscall, nth) => call.run_killed_at(Traced::PluginOnly, syscall, nth),
            Kill::After(delay) => {
                let mut running = call.spawn();
                std::thread::sleep(delay);
                running.kill();
                running.wait()
            }
            Kill::RuntimeGone(after) => call.spawn_runtime_gone_after(after).wait(),
        };
        let took = started.elapsed();
        // Ended without a result the runtime took: killed, or answered to nobody.
        let killed = reply.status.signal() == Some(SIGKILL) || matches!(kill, Kill::RuntimeGone(_));
        if !killed {
            reply.assert_ok();
        }
        // The replays it handed to the worker are its calls too (the worker outlives a
        // killed guard, and the next run must not be charged with them).
        self.store.wait_for_replays(Duration::from_secs(60));
        // Waits for a primary call that outlived its killed guard.
        let after = self.primary.calls().len();
        self.runs.push(Run {
            what: reply.what.clone(),
            killed,
            calls: before..after,
        });
        Outcome {
            reply,
            killed,
            took,
        }
    }

    /// Each DEL of `sandbox` the primary got, oldest first.
    fn dels_of(&self, sandbox: &Sandbox) -> Vec<Delivery> {
        let calls = self.primary.calls();
        let mut dels = Vec::new();
        for (run, exec) in self.runs.iter().enumerate() {
            for at in exec.calls.clone() {
                if calls[at].verb == "DEL" && calls[at].container == sandbox.container {
                    dels.push(Delivery {
                        run,
                        at,
                        call: calls[at].clone(),
                    });
                }
            }
        }
        dels
    }

    fn deferred(&self) -> Vec<Value> {
        self.store
            .dump()
            .into_iter()
            .filter(|e| e["status"] == "deferred")
            .collect()
    }

    fn deferred_at(&self, sandbox: &Sandbox) -> String {
        let entry = self
            .deferred()
            .into_iter()
            .find(|e| e["containerId"] == json!(sandbox.container));
        let entry = entry.unwrap_or_else(|| panic!("{} is not deferred", sandbox.container));
        entry["deferredAt"].as_str().unwrap().to_string()
    }

    fn is_deferred(&self, sandbox: &Sandbox) -> bool {
        self.deferred()
            .iter()
            .any(|e| e["containerId"] == json!(sandbox.container))
    }

    /// What must hold after any kill: the store's invariants, no DEL at the primary while
    /// another sandbox holds the pod there, and each of `stale` (sandboxes whose DEL the
    /// guard answered with success) deferred or handed to the primary.
    fn assert_consistent(&self, stale: &[&Sandbox], when: &str) {
        self.store.assert_every_owner_has_its_record();
        let owners: Vec<String> = self
            .store
            .owner_files()
            .iter()
            .filter_map(|path| cni::verify_envelope(path).ok())
            .map(|owner| owner["containerId"].as_str().unwrap().to_string())
            .collect();
        // deferred/<pod key>/<attachment>: each file a sealed entry, or the temp file of a
        // writer that was killed, which nothing reads.
        for path in cni::files_in(&self.store.state_dir.join("deferred"))
            .iter()
            .flat_map(|dir| cni::files_in(dir))
        {
            if !path.to_string_lossy().ends_with(".tmp") {
                cni::verify_envelope(&path)
                    .unwrap_or_else(|e| panic!("{when}: a deferred DEL does not verify: {e}"));
            }
        }
        let mut per_attachment = BTreeMap::new();
        for entry in self.deferred() {
            for field in [
                "containerId",
                "ifName",
                "network",
                "podNamespace",
                "podName",
                "deferredAt",
                "deferredForOwner",
            ] {
                assert!(
                    entry.get(field).is_some_and(|v| !v.is_null()),
                    "{when}: a deferred DEL without {field}: {entry}"
                );
            }
            let container = entry["containerId"].as_str().unwrap().to_string();
            assert!(
                !owners.contains(&container),
                "{when}: the owner of a pod has a deferred DEL: {entry}"
            );
            let key = (
                container,
                entry["ifName"].to_string(),
                entry["network"].to_string(),
            );
            *per_attachment.entry(key).or_insert(0) += 1;
        }
        for (attachment, count) in per_attachment {
            assert_eq!(
                count, 1,
                "{when}: {count} deferred DELs of one attachment {attachment:?}"
            );
        }
        for sandbox in stale {
            assert!(
                self.is_deferred(sandbox) || !self.dels_of(sandbox).is_empty(),
                "{when}: the stale DEL of {} got success, yet it is neither deferred nor run:\n{:#?}\n{}",
                sandbox.container,
                self.deferred(),
                self.history()
            );
        }
        if let Err(harm) = no_del_reached_a_held_pod(&self.primary.calls(), &self.teardowns()) {
            panic!("{when}: {harm}\n{}", self.history());
        }
    }

    /// For each primary call made within the runtime's DEL of a sandbox, before that
    /// sandbox's own DEL reached the primary: that sandbox (its network was going then).
    fn teardowns(&self) -> BTreeMap<usize, String> {
        let calls = self.primary.calls();
        let mut teardowns = BTreeMap::new();
        for run in &self.runs {
            let Some(container) = run
                .what
                .strip_prefix("DEL ")
                .and_then(|rest| rest.split(' ').find_map(|w| w.strip_prefix("container=")))
            else {
                continue;
            };
            for at in run.calls.clone() {
                if calls[at].verb == "DEL" && calls[at].container == container {
                    break;
                }
                teardowns.insert(at, container.to_string());
            }
        }
        teardowns
    }

    /// Every guard exec so far and the calls it made to the primary, for failure messages.
    fn history(&self) -> String {
        let calls = self.primary.calls();
        let mut text = String::from("guard execs and the primary calls each made:\n");
        for run in &self.runs {
            text += &format!("{}{}\n", run.what, if run.killed { "  KILLED" } else { "" });
            for call in &calls[run.calls.clone()] {
                text += &format!(
                    "    primary {} {} netns={} prev={}\n",
                    call.verb, call.container, call.netns, call.prev_address
                );
            }
        }
        text
    }

    /// `sandbox`'s deferred DEL reached the primary as a replay (no netns, the cached result,
    /// the pod named), and more than once only when each guard that handed it over before
    /// the last was killed: at most once per run, never again after a run that finished.
    fn assert_replayed(&self, sandbox: &Sandbox, when: &str) {
        let dels = self.dels_of(sandbox);
        assert!(
            !dels.is_empty(),
            "{when}: the deferred DEL of {} never reached the primary",
            sandbox.container
        );
        let pod = format!("{}/{}", sandbox.pod.namespace, sandbox.pod.name);
        for Delivery { call, .. } in &dels {
            assert_eq!(
                (call.netns.as_str(), call.pod.as_str(), call.ifname.as_str()),
                ("-", pod.as_str(), "eth0"),
                "{when}: {call:?}"
            );
            assert_eq!(
                call.prev_address,
                sandbox.address(),
                "{when}: the replay's prevResult is not the cached result: {call:?}"
            );
        }
        let runs: Vec<usize> = dels.iter().map(|d| d.run).collect();
        REPEATS.fetch_add(runs.len() - 1, Ordering::Relaxed);
        for pair in runs.windows(2) {
            let earlier = &self.runs[pair[0]];
            assert!(
                pair[0] != pair[1],
                "{when}: one run handed the primary {}'s DEL twice: {}",
                sandbox.container,
                earlier.what
            );
            assert!(
                earlier.killed,
                "{when}: {}'s DEL reached the primary again after a run that finished: {}",
                sandbox.container, earlier.what
            );
        }
    }

    /// Nothing is left: no record, owner or deferred DEL.
    fn assert_empty(&self, when: &str) {
        assert_eq!(
            self.store.dump(),
            Vec::<Value>::new(),
            "{when}: the store still holds something"
        );
        assert!(self.store.owner_files().is_empty(), "{when}: owners left");
    }
}

/// Replays the primary's calls through a primary keyed by pod name (legacy calico): ADD makes
/// the sandbox the pod's holder, a DEL by the holder frees the pod, GC frees the pods whose
/// holder it does not list. A DEL by any other sandbox while the pod is held would tear the
/// holder's network down, but the DEL of a sandbox the primary never had an ADD of within
/// the runtime's DEL of the holder itself, before the holder's own (`teardowns`, by call
/// index): that network was being torn down by the runtime's own call (the rollback of an ADD
/// cut off before its primary logged it).
fn no_del_reached_a_held_pod(
    calls: &[PrimaryCall],
    teardowns: &BTreeMap<usize, String>,
) -> Result<(), String> {
    let mut holder: BTreeMap<&str, &str> = BTreeMap::new();
    let mut added = std::collections::BTreeSet::new();
    for (index, call) in calls.iter().enumerate() {
        match call.verb.as_str() {
            "ADD" => {
                holder.insert(&call.pod, &call.container);
                added.insert(&call.container);
            }
            "DEL" => match holder.get(call.pod.as_str()) {
                Some(&live)
                    if live != call.container
                        && (added.contains(&call.container)
                            || teardowns.get(&index).map(String::as_str) != Some(live)) =>
                {
                    return Err(format!(
                        "call {index}: DEL of {} reached the primary while {live} holds {} there",
                        call.container, call.pod
                    ));
                }
                Some(_) => {
                    holder.remove(call.pod.as_str());
                }
                None => {}
            },
            "GC" => holder.retain(|_, live| call.valid.iter().any(|v| v == live)),
            _ => {}
        }
    }
    Ok(())
}

/// Runs `scenario` with the guard killed on entry to its 1st, 2nd, ... call of each of
/// `KILL_POINTS` until a run gets through, then `RANDOM_ROUNDS` times after a random delay (up
/// to one and a half times an unkilled run's duration). `scenario` returns whether its
/// operation was killed and how long it took.
fn kill_everywhere(name: &str, scenario: impl Fn(Kill, &str) -> (bool, Duration)) {
    let started = Instant::now();
    let repeats_before = REPEATS.load(Ordering::Relaxed);
    let mut points = Vec::new();
    for syscall in KILL_POINTS {
        let mut calls = 0;
        for nth in 1..=MAX_NTH {
            let (killed, _) = scenario(
                Kill::AtNth(syscall, nth),
                &format!("{name}, killed at {syscall} #{nth}"),
            );
            if !killed {
                break;
            }
            calls = nth;
            assert!(nth < MAX_NTH, "{name}: still killed at {syscall} #{nth}");
        }
        if calls > 0 {
            points.push(format!("{}({calls})", syscall.trim_start_matches('?')));
        }
    }
    assert!(
        points.len() >= 3,
        "{name}: kill points {points:?}: the kills landed nowhere interesting"
    );
    let (_, unkilled) = scenario(Kill::Never, &format!("{name}, not killed"));
    let mut rng = SeededRng::new(SEED);
    let max_micros = (unkilled.as_micros() as u64 * 3 / 2).max(1000);
    let mut random_kills = 0;
    for round in 0..RANDOM_ROUNDS {
        let delay = Duration::from_micros(rng.below(max_micros));
        let (killed, _) = scenario(
            Kill::After(delay),
            &format!("{name}, random round {round}, killed after {delay:?}"),
        );
        random_kills += usize::from(killed);
    }
    eprintln!(
        "{name}: killed at {}, then {random_kills} of {RANDOM_ROUNDS} random kills landed (unkilled run {unkilled:?}); \
         {} DELs reached the primary again after a kill; in {:?}",
        points.join(" "),
        REPEATS.load(Ordering::Relaxed) - repeats_before,
        started.elapsed()
    );
}

/// A stale DEL killed anywhere: its retry succeeds, the DEL is deferred once and never run
/// while the newer sandbox lives, the stale netns has lost its interface, and the newer
/// sandbox's DEL later replays it.
#[test]
fn a_deferral_killed_anywhere_is_deferred_once_and_replayed_later() {
    sys::skip_unless_root!(TOOLS);
    kill_everywhere("deferral", |kill, when| {
        let (mut world, [old, new]) = World::with_sandboxes();
        let interrupted = world.run(world.del(&old, true), kill);
        let answered: &[&Sandbox] = if interrupted.killed { &[] } else { &[&old] };
        world.assert_consistent(answered, when);

        // kubelet retries StopPodSandbox, then RemovePodSandbox.
        for with_netns in [true, false] {
            world.run(world.del(&old, with_netns), Kill::Never);
        }
        world.assert_consistent(&[&old], when);
        assert!(
            world.is_deferred(&old),
            "{when}: the stale DEL is not deferred"
        );
        assert!(
            world.dels_of(&old).is_empty(),
            "{when}: the primary got the stale DEL"
        );
        assert!(
            !old.has_interface(),
            "{when}: the stale sandbox's netns kept its interface"
        );
        assert!(
            new.has_interface(),
            "{when}: the newer sandbox lost its interface"
        );

        world.run(world.del(&new, true), Kill::Never);
        world.assert_consistent(&[&old], when);
        world.assert_replayed(&old, when);
        world.assert_empty(when);
        (interrupted.killed, interrupted.took)
    });
}

/// The owner's DEL killed anywhere while it hands two deferred DELs to the primary: the
/// runtime's retries (and at worst the next GC) replay each, oldest first, none while the
/// owner lives there and none twice but after a kill.
#[test]
fn a_replay_killed_anywhere_loses_no_deferred_del() {
    sys::skip_unless_root!(TOOLS);
    let gc_needed = std::cell::Cell::new(0);
    kill_everywhere("replay", |kill, when| {
        let (mut world, [older, old, owner]) = World::with_sandboxes();
        for stale in [&older, &old] {
            world.run(world.del(stale, true), Kill::Never);
        }
        let stale = [&older, &old];
        world.assert_consistent(&stale, when);
        let deferred_at = stale.map(|sandbox| world.deferred_at(sandbox));

        let interrupted = world.run(world.del(&owner, true), kill);
        world.assert_consistent(&stale, when);
        for with_netns in [true, false] {
            world.run(world.del(&owner, with_netns), Kill::Never);
            world.assert_consistent(&stale, when);
        }
        if !world.deferred().is_empty() {
            assert!(
                interrupted.killed,
                "{when}: the owner's DEL finished and left deferred DELs: {:#?}\n{}",
                world.deferred(),
                world.history()
            );
            gc_needed.set(gc_needed.get() + 1);
            world.run(world.gc(&[]), Kill::Never);
            world.assert_consistent(&stale, when);
        }
        for sandbox in stale {
            world.assert_replayed(sandbox, when);
        }
        // Oldest first, as far as deferredAt (whole seconds) tells them apart.
        let first = |sandbox: &Sandbox| world.dels_of(sandbox)[0].at;
        if deferred_at[0] < deferred_at[1] {
            assert!(
                first(&older) < first(&old),
                "{when}: the younger deferred DEL was replayed first\n{}",
                world.history()
            );
        }
        world.assert_empty(when);
        (interrupted.killed, interrupted.took)
    });
    eprintln!(
        "replay: {} interrupted replays were left for GC",
        gc_needed.get()
    );
}

/// GC killed anywhere while it drops the owner the runtime no longer lists and replays the
/// deferred DEL that freed: its retry completes the replay.
#[test]
fn a_gc_replay_killed_anywhere_loses_no_deferred_del() {
    sys::skip_unless_root!(TOOLS);
    kill_everywhere("GC replay", |kill, when| {
        // The owner is the second, which the runtime no longer lists.
        let (mut world, [old, _owner]) = World::with_sandboxes();
        world.run(world.del(&old, true), Kill::Never);
        world.assert_consistent(&[&old], when);

        let interrupted = world.run(world.gc(&[]), kill);
        world.assert_consistent(&[&old], when);
        world.run(world.gc(&[]), Kill::Never);
        world.assert_consistent(&[&old], when);
        world.assert_replayed(&old, when);
        world.assert_empty(when);
        (interrupted.killed, interrupted.took)
    });
}

/// The live processes whose environment names `container` as CNI_CONTAINERID: what is left
/// of a primary's run for that sandbox.
fn processes_of(container: &str) -> Vec<String> {
    let wanted = format!("CNI_CONTAINERID={container}");
    cni::files_in(std::path::Path::new("/proc"))
        .into_iter()
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|path| {
            let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').map(|(_, after)| after.trim_start());
            !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
        })
        .filter(|path| {
            std::fs::read(path.join("environ")).is_ok_and(|environ| {
                environ
                    .split(|&b| b == 0)
                    .any(|var| var == wanted.as_bytes())
            })
        })
        .map(|path| {
            let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
            format!(
                "{} {}",
                path.display(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect()
}

/// An ADD of a newer sandbox killed anywhere (as a runtime restart or a CRI timeout kills
/// it), with and without its primary waiting for an IPAM child that outlives the kill. Then,
/// as the issue's sequence: the older owner's DEL, the cut-off sandbox's DEL, a third
/// sandbox's ADD and a GC. What the cut-off ADD left reaches the primary as that sandbox's
/// DEL before the owner's DEL does, no process of its primary outlives the pod's next verb,
/// no note is left after the GC and the third sandbox owns the pod.
#[test]
fn an_add_cut_off_anywhere_is_rolled_back_by_the_pods_next_verb() {
    sys::skip_unless_root!(TOOLS);
    for ipam_seconds in [None, Some(0.5)] {
        let name = match ipam_seconds {
            None => "cut-off ADD".to_string(),
            Some(seconds) => format!("cut-off ADD, IPAM child of {seconds}s"),
        };
        kill_everywhere(&name, |kill, when| {
            let (mut world, [owner]) = World::with_sandboxes();
            let (cut_off, interrupted) = world.newer_sandbox(&owner.pod, kill, ipam_seconds);
            world.assert_consistent(&[], when);

            let owners_del = world.runs.len();
            world.run(world.del(&owner, true), Kill::Never);
            let left = processes_of(&cut_off.container);
            assert!(
                left.is_empty(),
                "{when}: processes of the cut-off ADD outlived the pod's next verb: {left:?}\n{}",
                world.history()
            );
            world.assert_consistent(&[], when);
            for with_netns in [true, false] {
                world.run(world.del(&cut_off, with_netns), Kill::Never);
                world.assert_consistent(&[], when);
            }
            let (third, _) = world.newer_sandbox(&owner.pod, Kill::Never, None);
            world.run(world.gc(&[&third]), Kill::Never);
            world.assert_consistent(&[], when);
            let notes: Vec<_> = cni::files_in(&world.store.state_dir.join("pending-adds"))
                .into_iter()
                .filter(|path| !path.to_string_lossy().ends_with(".tmp"))
                .collect();
            assert!(
                notes.is_empty(),
                "{when}: notes left after the GC: {notes:?}"
            );
            let owners: Vec<Value> = world
                .store
                .owner_files()
                .iter()
                .filter_map(|path| cni::verify_envelope(path).ok())
                .collect();
            assert_eq!(owners.len(), 1, "{when}: owners {owners:?}");
            assert_eq!(owners[0]["containerId"], json!(third.container), "{when}");
            assert!(
                third.has_interface(),
                "{when}: the third sandbox has no interface"
            );
            // Rolled back by the owner's DEL: the cut-off sandbox's own DEL, next, was
            // answered without the primary.
            let dels = world.dels_of(&cut_off);
            if dels.iter().any(|d| d.run == owners_del) {
                assert!(
                    !dels.iter().any(|d| d.run == owners_del + 1),
                    "{when}: the primary had the rolled-back sandbox's DEL again\n{}",
                    world.history()
                );
            }
            (interrupted.killed, interrupted.took)
        });
    }
}

/// The runtime that ran an ADD exits before it could kill the guard (a containerd restart can)
/// while the primary hangs. Nobody reads the answer, so the guard ends the call as that kill
/// would have: the primary and what it started killed, the note kept, so that the pod's next
/// verb rolls it back. The pod's verbs then go on at once rather than wait behind its lock
/// for as long as the primary hangs.
#[test]
fn an_add_whose_runtime_is_gone_ends_and_is_rolled_back() {
    sys::skip_unless_root!(TOOLS);
    // Longer than the harness waits for a guard exec: a guard that waits for it hangs.
    const HANGS_SECONDS: f64 = 120.0;
    let (mut world, [owner]) = World::with_sandboxes();
    let (cut_off, unheard) = world.newer_sandbox(
        &owner.pod,
        Kill::RuntimeGone(Duration::from_secs(1)),
        Some(HANGS_SECONDS),
    );
    let logged = world
        .store
        .log_lines()
        .iter()
        .any(|line| line.raw.contains("nobody reads its answer"));
    assert!(
        unheard.reply.status.code() == Some(1) && logged,
        "the guard did not end the call whose runtime is gone: {:?}, logged: {logged}",
        unheard.reply.status
    );
    let left = processes_of(&cut_off.container);
    assert!(
        left.is_empty(),
        "processes of the unheard ADD outlived it: {left:?}"
    );
    world.assert_consistent(&[], "the runtime gone during an ADD");

    // Its note kept: the owner's DEL gives the primary the unheard sandbox's DEL first.
    world.assert_owners_del_rolls_back_first(&owner, &cut_off);
    let (next, _) = world.newer_sandbox(&owner.pod, Kill::Never, None);
    assert!(next.has_interface(), "the next sandbox has no interface");
}

/// A primary that closes its stdout and goes on running (a daemon it forks, a hung child it
/// waits for) while the runtime that ran the guard is gone: the guard has read the primary's
/// whole answer and waits for it to exit; nobody reads the guard's own answer, so it ends the
/// call as the runtime's kill would have, the primary's group with it, rather than wait for as
/// long as the primary runs.
#[test]
fn an_add_whose_primary_closed_its_stdout_and_hangs_ends_when_the_runtime_is_gone() {
    sys::skip_unless_root!(TOOLS);
    let (world, [owner]) = World::with_sandboxes();
    let (hanging, add) = world.unstarted_sandbox(&owner.pod);
    let bin_dir = sys::TempDir::new("sgdc-bin");
    let plugin = bin_dir.path.join("closes-stdout");
    // Longer than the harness waits for a guard exec: a guard that waits for it hangs.
    std::fs::write(
        &plugin,
        "#!/bin/sh\ncat >/dev/null\nexec >&-\nexec sleep 120\n",
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let reply = add
        .config("delegate", Some(json!({"type": "closes-stdout"})))
        .env("CNI_PATH", Some(bin_dir.path.to_str().unwrap()))
        .spawn_runtime_gone_after(Duration::from_secs(1))
        .wait();
    assert_eq!(reply.status.code(), Some(1), "{reply:?}");
    let logged = world
        .store
        .log_lines()
        .iter()
        .any(|line| line.raw.contains("nobody reads its answer"));
    assert!(logged, "the guard did not say why it ended the call");
    let left = processes_of(&hanging.container);
    assert!(
        left.is_empty(),
        "the primary outlived the unheard ADD: {left:?}"
    );
}

/// How a meta plugin (multus thin; the multus daemon for thick) runs the guard: it reads the
/// guard's stdout into a buffer, as libcni does, and answers its own runtime once the guard
/// has exited. A shell's command substitution plays it; `$0` is the guard.
const META_PLUGIN: &str = r#"out=$("$0" 2>/dev/null); s=$?; printf '%s\n' "$out"; exit $s"#;

/// The runtime kills a meta plugin on its deadline or shutdown (Go's `exec.CommandContext`:
/// SIGKILL to the direct child only) while the guard under it runs an ADD whose primary
/// hangs. Nobody reads the guard's answer then: it ends the call as if its own runtime were
/// gone, and the owner's DEL rolls that ADD back first.
#[test]
fn an_add_under_a_meta_plugin_its_runtime_killed_ends_and_is_rolled_back() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [owner]) = World::with_sandboxes();
    let (cut_off, add) = world.unstarted_sandbox(&owner.pod);
    let call = world
        .primary
        .wrap_with_slow_ipam(add, 120.0)
        .wrapped_in(&["sh", "-c", META_PLUGIN]);
    // Returns once the primary's call is over: at once when the guard ends it, after the
    // IPAM child's 120 s when it waits.
    let killed = world.run(call, Kill::After(Duration::from_secs(1)));
    assert!(killed.killed, "the meta plugin had exited before its kill");
    let gone_by = Instant::now() + Duration::from_secs(10);
    while !processes_of(&cut_off.container).is_empty() && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = processes_of(&cut_off.container);
    assert!(
        left.is_empty(),
        "the guard under the killed meta plugin ran on: {left:?} ({:?} after the kill)",
        killed.took
    );
    world.assert_owners_del_rolls_back_first(&owner, &cut_off);
}

/// Runs `add` (its primary waiting for a slow IPAM child), kills the guard a second in and
/// returns once it is dead, the IPAM child still running; its reply is reaped by the thread
/// returned (the guard's stderr is the primary's too: only once that child is gone).
fn cut_off_while_ipam_runs(add: Cni) -> std::thread::JoinHandle<Reply> {
    let mut running = add.spawn();
    std::thread::sleep(Duration::from_secs(1));
    let guard_pid = running.pid;
    assert!(running.kill(), "the ADD was not cut off at the primary");
    let reaped = std::thread::spawn(move || running.wait());
    let dead = || {
        std::fs::read_to_string(format!("/proc/{guard_pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, s)| s.trim_start().starts_with('Z'))
        })
    };
    while !dead() {
        std::thread::sleep(Duration::from_millis(10));
    }
    reaped
}

/// What an operator reads of a cut-off ADD: the dump shows its note (its primary's pid and
/// what of it still runs) and then its rolled-back mark; the doctor lists the store's notes;
/// `--downgrade` says it leaves them for the older release, which does not read them.
#[test]
fn a_cut_off_add_shows_in_the_dump_the_doctor_and_the_downgrade() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [owner]) = World::with_sandboxes();
    // Killed while its primary waits for its IPAM child, which the dump then finds running.
    let (cut_off, add) = world.unstarted_sandbox(&owner.pod);
    let reaped = cut_off_while_ipam_runs(world.primary.wrap_with_slow_ipam(add, 5.0));
    let state_dir = world.store.state_dir.to_str().unwrap().to_string();
    let guard = |args: &[&str]| {
        let out = std::process::Command::new(cni::bin())
            .args(args)
            .args(["--state-dir", &state_dir])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let row_of = |container: &str| -> Value {
        let (code, out) = guard(&["--dump-checkpoints", "--output", "json"]);
        assert_eq!(code, Some(0), "{out}");
        let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
        rows.into_iter()
            .find(|row| row["containerId"] == json!(container))
            .unwrap_or(Value::Null)
    };

    let row = row_of(&cut_off.container);
    assert_eq!(row["status"], "pending-add", "{row}");
    assert!(row["primaryPid"].is_i64(), "the primary ran: {row}");
    assert_eq!(row["standing"], "cut-off", "its guard is gone: {row}");
    assert!(
        row["primaryProcesses"].as_u64() >= Some(1),
        "its IPAM child still runs: {row}"
    );
    let (_, table) = guard(&["--dump-checkpoints"]);
    assert!(
        table.contains("pending-add") && table.contains("the pod's next verb"),
        "{table}"
    );
    let (_, doctor) = guard(&["--doctor", "--output", "json"]);
    let report: Value = serde_json::from_str(&doctor).unwrap();
    let finding = report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["check"] == "store-pending-adds")
        .cloned()
        .unwrap_or(Value::Null);
    assert!(
        finding["severity"] == "info"
            && finding["summary"]
                .as_str()
                .is_some_and(|s| s.contains("1 ADD cut off at the primary")),
        "{doctor}"
    );
    assert_eq!(reaped.join().unwrap().status.signal(), Some(SIGKILL));
    let (code, downgraded) = guard(&["--downgrade"]);
    assert_eq!(code, Some(0), "{downgraded}");
    assert!(
        downgraded.contains("1 ADD cut off at the primary is not rolled back"),
        "{downgraded}"
    );

    // The owner's DEL, by this release again, rolls the cut-off ADD back.
    world.run(world.del(&owner, true), Kill::Never);
    let row = row_of(&cut_off.container);
    assert_eq!(row["status"], "rolled-back", "{row}");
    let (_, downgraded) = guard(&["--downgrade"]);
    assert!(
        downgraded.contains("1 mark of a rolled-back sandbox stays"),
        "{downgraded}"
    );
    world.run(world.gc(&[]), Kill::Never);
    assert_eq!(row_of(&cut_off.container), Value::Null, "GC keeps the mark");
}

/// While another sandbox holds the pod, a verb that may not give the primary the cut-off
/// sandbox's DEL (that sandbox's own DEL, as containerd's cleanup of a failed RunPodSandbox
/// sends it, and GC's sweep) kills what is left and keeps the note. The holder's DEL then
/// rolls it back before the holder's own DEL reaches the primary, and the cut-off sandbox's
/// deferred DEL goes without the primary, which has had it.
#[test]
fn a_cut_off_add_whose_own_del_comes_first_is_rolled_back_by_the_owners_del() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [owner]) = World::with_sandboxes();
    let (cut_off, note) = world.cut_off_beside(&owner, 2.0);
    world.run(world.del(&cut_off, true), Kill::Never);
    world.run(world.gc(&[&owner]), Kill::Never);
    world.assert_consistent(&[&cut_off], "after the cut-off sandbox's own DEL and a GC");
    assert!(
        world.dels_of(&cut_off).is_empty(),
        "a DEL as the cut-off sandbox reached the primary while the owner lived:\n{}",
        world.history()
    );
    assert!(note.exists(), "the note went before the owner's DEL");

    world.assert_owners_del_rolls_back_first(&owner, &cut_off);
    world.run(world.gc(&[]), Kill::Never);
    world.assert_consistent(&[], "after the owner's DEL and a GC");
    assert_eq!(
        world.dels_of(&cut_off).len(),
        1,
        "the primary had the rolled-back sandbox's DEL again:\n{}",
        world.history()
    );
    assert!(!note.exists(), "the note outlived the owner's DEL");
    assert!(
        world.deferred().is_empty(),
        "deferred: {:?}",
        world.deferred()
    );
}

/// The file name of `sandbox`'s pod key's note: its owner file's.
fn owner_digest(world: &World, sandbox: &Sandbox) -> String {
    world
        .store
        .owner_files()
        .iter()
        .find(|path| {
            cni::verify_envelope(path)
                .is_ok_and(|owner| owner["containerId"] == json!(sandbox.container))
        })
        .and_then(|path| path.file_name()?.to_str().map(str::to_string))
        .expect("the owner's file")
}

/// An ADD the guard refuses before its primary runs (a superseded sandbox's late ADD) takes
/// nothing over at the primary: the note kept for the owner's DEL stays, and that DEL still
/// gives the primary the cut-off sandbox's DEL before its own.
#[test]
fn a_kept_note_outlives_an_add_refused_before_the_primary() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [superseded, owner]) = World::with_sandboxes();
    let (cut_off, note) = world.cut_off_beside(&owner, 2.0);
    let late = world.primary.wrap(
        world
            .store
            .add(&superseded.container, &superseded.pod)
            .netns(superseded.netns.path().to_str().unwrap())
            .no_prev_result(),
    );
    late.run().assert_error(104);
    assert!(
        note.exists(),
        "the note went with an ADD that never reached the primary"
    );

    world.assert_owners_del_rolls_back_first(&owner, &cut_off);
}

/// Keyed by the pod's name, one sandbox attached twice to the network: the ADD of its second
/// interface cut off at the primary is not taken for committed because the sandbox holds the
/// pod by its first. The next verb kills what that ADD left running.
#[test]
fn a_cut_off_add_of_the_owners_second_interface_is_not_taken_for_committed() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [owner]) = World::with_sandboxes();
    let second = world
        .store
        .add(&owner.container, &owner.pod)
        .netns(owner.netns.path().to_str().unwrap())
        .env("CNI_IFNAME", Some("net1"))
        .no_prev_result();
    let reaped = cut_off_while_ipam_runs(world.primary.wrap_with_slow_ipam(second, 5.0));
    assert!(
        !processes_of(&owner.container).is_empty(),
        "no IPAM child outlived the cut, so this test cannot fail"
    );
    world.run(
        world.del(&owner, true).env("CNI_IFNAME", Some("net1")),
        Kill::Never,
    );
    let left = processes_of(&owner.container);
    assert!(
        left.is_empty(),
        "processes of the cut-off ADD outlived the pod's next verb: {left:?}\n{}",
        world.history()
    );
    assert_eq!(reaped.join().unwrap().status.signal(), Some(SIGKILL));
}

/// A note written under the network's earlier `podKey` rule, found by a GC's sweep after an
/// operator changed the rule: the owner's files are under the new rule's keys, so the old
/// key reads as free. No DEL as the cut-off sandbox may reach the primary while the owner
/// lives; what is left of the ADD is killed, and the note goes.
#[test]
fn a_note_of_an_earlier_pod_key_rule_sends_no_del_beside_a_live_owner() {
    sys::skip_unless_root!(TOOLS);
    let (mut world, [owner]) = World::with_sandboxes();
    let (cut_off, _) = world.cut_off_beside(&owner, 30.0);
    let rekeyed = |call: Cni| call.config("podKey", Some(json!("name-and-ifname")));
    world.run(rekeyed(world.gc(&[&owner])), Kill::Never);
    world.run(rekeyed(world.gc(&[&owner])), Kill::Never);
    assert!(
        world.dels_of(&cut_off).is_empty(),
        "a DEL as the cut-off sandbox reached the primary while the owner lived:\n{}",
        world.history()
    );
    let left = processes_of(&cut_off.container);
    assert!(
        left.is_empty(),
        "processes of the cut-off ADD run on: {left:?}"
    );
    let notes: Vec<_> = cni::files_in(&world.store.state_dir.join("pending-adds"))
        .into_iter()
        .filter(|path| !path.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(notes.is_empty(), "notes left: {notes:?}");
}
