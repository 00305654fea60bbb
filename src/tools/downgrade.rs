//! `--downgrade`: the state dir put back in the form of the release before the pod key
//! (`Store::downgrade`), under the store's lock, for the operator who goes back to it. No
//! replay runs meanwhile: a worker of delegate mode would read and rewrite deferred DELs
//! while they move (`replay.lock`, taken first and exclusively, waited for at most
//! `--lock-timeout` while no other lock is held). The temp files of writers that are gone go
//! too, a killed run's among them. Delegate mode's notes of cut-off ADDs and marks of
//! rolled-back ones stay as they are and are reported: the older release reads neither.

use std::path::Path;
use std::time::Duration;

use crate::state::Store;
use crate::tools::counted;

pub fn run(state_dir: &Path, lock_timeout: Duration) -> i32 {
    if crate::state::surely_absent(state_dir) {
        println!(
            "no state dir at {}: nothing to downgrade",
            state_dir.display()
        );
        return 0;
    }
    let done = crate::state::hold_off_replays(state_dir, lock_timeout).and_then(|_replays| {
        let store = Store::open(state_dir, lock_timeout)?;
        let done = store.downgrade()?;
        // A killed run leaves its temp files; the older release never collects them.
        store.remove_dead_temp_files()?;
        Ok((done, store.ledger_left_behind()?))
    });
    match done {
        Ok(((networks, rewritten), ledger_left)) => {
            println!(
                "downgraded {}: networks {} keyed by \"name-and-ifname\", {rewritten} entries rewritten as regular files",
                state_dir.display(),
                if networks.is_empty() {
                    "(none)".to_string()
                } else {
                    networks.join(", ")
                }
            );
            if ledger_left > 0 {
                println!(
                    "{ledger_left} refusal ledger entries of whole pods stay as they are: they hold counts of no known interface and their pod has no single interface on the node to give them to. The older release skips them (history only; nothing it protects depends on them)."
                );
            }
            let notes = crate::state::pending_add::digests(state_dir).len();
            let marks = crate::state::pending_add::rolled_back_ids(state_dir).len();
            if notes > 0 {
                let verb = if notes == 1 { "is" } else { "are" };
                println!(
                    "{} cut off at the primary {verb} not rolled back yet and stay in pending-adds/: the older release does not read them, so what the primary made of a cut-off sandbox stays, as it did under that release (the next DEL of an older sandbox of its pod may reach the primary beside it). This release rolls each back at its pod's next verb if it comes back; this release's --dump-checkpoints shows them (the older one's does not).",
                    counted(notes, "ADD", "ADDs")
                );
            }
            if marks > 0 {
                let verb = if marks == 1 { "stays" } else { "stay" };
                println!(
                    "{} {verb} in rolled-back/: the older release does not read them and judges such a sandbox's late DEL as any other (the primary may have that DEL a second time, for what it no longer holds).",
                    counted(
                        marks,
                        "mark of a rolled-back sandbox",
                        "marks of rolled-back sandboxes"
                    )
                );
            }
            println!(
                "Install the older binary now. A verb of this release that runs before it is in place moves the \
                 files back to this release's keys: run this command again (with this release's binary kept \
                 aside) once the older one is installed."
            );
            0
        }
        Err(err) => {
            eprintln!("sandbox-guard: {err}");
            1
        }
    }
}
