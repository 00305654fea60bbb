//! `--restore`: bring back pod interfaces that vanished with their host parent (a NIC driver
//! reload takes the vlan link and every macvlan on it along), from the link facts recorded
//! at ADD, so that kubelet finds each sandbox with its IP and re-creates none.
//!
//! For each selected sandbox (`select`: the records asked for, minus those whose pod another
//! sandbox owns now): look (netns alive? interface there? parent there?), plan (pure,
//! `plan`), carry the plan out (`apply`), and report a row (`report`). A sandbox whose
//! interface is present is never touched, so running it again is harmless; a failure stops
//! only its own sandbox.

mod apply;
mod plan;
mod report;
mod select;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::error::Kind;
use crate::kernel::netlink;
use crate::state::checkpoint::Checkpoint;

use plan::{Decision, Step};
use report::{Outcome, Row};
use select::Selected;

pub enum Selection {
    All,
    /// Prefixes, as people copy the short IDs crictl prints.
    ContainerIds(Vec<String>),
}

/// Returns the process exit status: 0 when every selected sandbox is intact, restored (or,
/// in a dry run, restorable) or dead anyway; 1 when one could not be restored.
pub fn run(state_dir: &Path, selection: &Selection, dry_run: bool, lock_timeout: Duration) -> i32 {
    let rows = match select::select(state_dir, selection, lock_timeout) {
        Ok(rows) => rows,
        Err(err) => {
            eprintln!("sandbox-guard: {err}");
            return 1;
        }
    };
    let rows = restore_all(rows, dry_run);
    let out = io::stdout();
    let written = report::write_report(&mut out.lock(), &rows, dry_run);
    if let Err(e) = written
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        eprintln!("sandbox-guard: cannot write the report: {e}");
    }
    i32::from(rows.iter().any(|row| row.outcome.is_problem()))
}

/// Sandboxes with IPv6 wait a second or two each for duplicate address detection: those
/// waits run side by side, so that a node's worth of pods (kubelet's default cap is 110) is
/// back within about two of them, not that times their number. A worker holds two netlink
/// sockets and polls every `apply::DAD_POLL`: 64 of them stay well inside a 1024-descriptor limit.
/// Everything else runs one sandbox at a time (`one_at_a_time`): two sandboxes on one lost
/// vlan parent must not both see it missing and both create it.
/// Rows keep the selection's order.
fn restore_all(selected: Vec<Selected>, dry_run: bool) -> Vec<Row> {
    const WORKERS: usize = 64;
    let workers = selected.len().min(WORKERS);
    let queue = Mutex::new(selected.into_iter().enumerate());
    let one_at_a_time = Mutex::new(());
    let mut rows: Vec<(usize, Row)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        // Its own statement: the lock is let go before the sandbox's work starts.
                        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                        let Some((at, selected)) = next else { break };
                        done.push((at, restore_selected(selected, dry_run, &one_at_a_time)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap_or_default())
            .collect()
    });
    rows.sort_by_key(|(at, _)| *at);
    rows.into_iter().map(|(_, row)| row).collect()
}

fn restore_selected(selected: Selected, dry_run: bool, one_at_a_time: &Mutex<()>) -> Row {
    match selected {
        Selected::Unusable(row) | Selected::Superseded(row) => row,
        Selected::Record(record) => Row {
            outcome: restore_one(&record, dry_run, one_at_a_time),
            container_id: record.container_id.clone(),
            if_name: record.if_name.clone(),
            network: record.network.clone(),
            netns: record.netns.clone(),
        },
    }
}

fn restore_one(record: &Checkpoint, dry_run: bool, one_at_a_time: &Mutex<()>) -> Outcome {
    let netns = PathBuf::from(&record.netns);
    if record.netns.is_empty() {
        return Outcome::NotRestorable("the checkpoint names no netns".into());
    }
    let attempt = netlink::with_pod_netns(&netns, |kernel| {
        let turn = one_at_a_time.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = apply::look(kernel, record)?;
        Ok(
            match plan::plan(&record.if_name, record.links.as_ref(), &seen) {
                Decision::Intact => Outcome::Intact,
                Decision::NotRestorable(why) => Outcome::NotRestorable(why),
                Decision::Rebuild(steps) if dry_run => Outcome::Planned(steps),
                Decision::Rebuild(mut steps) => {
                    let waits = steps.iter().position(Step::is_check).unwrap_or(steps.len());
                    let after_the_wait = steps.split_off(waits);
                    match apply::carry_out(kernel, Vec::new(), steps) {
                        Outcome::Restored(done) => {
                            drop(turn);
                            apply::carry_out(kernel, done, after_the_wait)
                        }
                        failed => failed,
                    }
                }
            },
        )
    });
    match attempt {
        Ok(outcome) => outcome,
        Err(err) if err.kind == Kind::NetnsGone => Outcome::NetnsGone(format!(
            "{}: the sandbox is dead; nothing to restore",
            err.msg
        )),
        Err(err) => Outcome::Failed {
            done: Vec::new(),
            error: err.msg,
        },
    }
}
