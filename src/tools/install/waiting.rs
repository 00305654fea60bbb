//! Leaving delegate mode (another mode, or `--uninstall`) while deferred DELs wait would
//! leave them to nobody: only delegate mode replays them, so their sandboxes' addresses
//! would stay allocated in the primary for good. Refused unless `--force`. The look is made
//! with no replay running (`replay.lock` held exclusively, returned to the caller to hold
//! until the network file is rewritten): a worker that starts or finishes meanwhile would
//! make the answer stale.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::edit::{self, Mode};
use super::json::Json;
use super::network::Network;
use crate::cni::config::DEFAULT_STATE_DIR;

/// How long leaving delegate mode waits for the replays running now (each primary run ends
/// within the network's replayTimeoutSeconds); no other lock is held meanwhile.
const REPLAYS_WAIT: Duration = Duration::from_secs(10);

/// `to`: the mode being installed, `None` for `--uninstall`. With `force` (what makes it
/// go on: `--force`, the guard standing aside), goes on and says in `done` what is lost.
/// Returns `replay.lock` of the network's state dir, held: no replay starts until it is
/// dropped.
/// The entry's stateDir is the host's path: it is looked at under `host_root` (the
/// DaemonSets' `/host`), where a dir not mounted into the pod cannot be told from one
/// without deferred DELs, so that is refused too.
pub fn refuse_leaving_delegate(
    net: &Network,
    to: Option<Mode>,
    host_root: &Path,
    force: Option<&str>,
    done: &mut Vec<String>,
) -> Result<Option<File>, String> {
    if to == Some(Mode::Delegate) {
        return Ok(None);
    }
    let Some(on_host) = delegate_state_dir(&net.doc.root) else {
        return Ok(None);
    };
    let state_dir = host_root.join(on_host.strip_prefix("/").unwrap_or(&on_host));
    // On the host itself (root /) a missing dir is a store never made: nothing waits.
    let visible = host_root == Path::new("/") || state_dir.parent().is_none_or(Path::is_dir);
    if let (false, Some(why)) = (visible, force) {
        // Going on without looking: said, as the DELs that may wait there are lost to it.
        done.push(format!(
            "{why}: {} is not there to tell whether deferred DELs of network {} wait in {}; any that do are \
             replayed only when delegate mode returns",
            state_dir.parent().unwrap_or(&state_dir).display(),
            net.name,
            on_host.display()
        ));
        return Ok(None);
    }
    if !visible {
        return Err(format!(
            "network {} is guarded in delegate mode with stateDir {}, and {} is not there to tell whether deferred DELs \
             wait (only delegate mode replays them): mount the host's {} under {} (the shipped DaemonSets mount \
             /var/lib/cni), or give --force to go on without looking",
            net.name,
            on_host.display(),
            state_dir.parent().unwrap_or(&state_dir).display(),
            on_host.parent().unwrap_or(&on_host).display(),
            host_root.display()
        ));
    }
    let replays = match crate::state::surely_absent(&state_dir) {
        true => None,
        false => match crate::state::hold_off_replays(&state_dir, REPLAYS_WAIT) {
            Ok(held) => held,
            Err(e) if force.is_some() => {
                done.push(format!(
                    "{}: {e}; the replays running now may leave deferred DELs behind",
                    force.unwrap_or_default()
                ));
                None
            }
            Err(e) => {
                return Err(format!(
                    "network {} is guarded in delegate mode: {e}; or give --force to go on (any deferred DELs left are then not replayed)",
                    net.name
                ));
            }
        },
    };
    let waiting = match crate::state::deferred::waiting(&state_dir, &net.name) {
        Ok(waiting) => waiting,
        // --force is the way out the refusal names: a store that cannot be read must not
        // keep the node in delegate mode for good.
        Err(e) if force.is_some() => {
            done.push(format!("{}: cannot tell whether deferred DELs wait in {} ({e}); any that do are not replayed", force.unwrap_or_default(), state_dir.display()));
            return Ok(replays);
        }
        Err(e) => {
            return Err(format!(
                "cannot tell whether deferred DELs wait in {}: {e}; fix that, or give --force to go on (any waiting are then not replayed)",
                state_dir.display()
            ));
        }
    };
    if waiting.is_empty() {
        return Ok(replays);
    }
    let names: Vec<String> = waiting
        .iter()
        .take(5)
        .map(|e| {
            format!(
                "{} of pod {}",
                crate::names::short_id(&e.container_id),
                e.key.pod()
            )
        })
        .collect();
    let more = if waiting.len() > names.len() {
        format!(" and {} more", waiting.len() - names.len())
    } else {
        String::new()
    };
    let what = format!(
        "{} deferred DELs of network {} wait in {} ({}{more}), and only delegate mode replays them",
        waiting.len(),
        net.name,
        state_dir.display(),
        names.join(", ")
    );
    if let Some(why) = force {
        done.push(format!("{why}: {what}; they are dropped from replay: they stay in the store, but only delegate mode replays them, so until it comes back the primary never gets those DELs (their addresses may stay allocated)"));
        return Ok(replays);
    }
    Err(format!(
        "{what}: stop and remove the pods that own those names (or wait until they go; `sandbox-guard --doctor` lists them), \
         or give --force to go on and lose them"
    ))
}

/// The stateDir of the network's guard entry when that entry wraps a primary.
fn delegate_state_dir(list: &Json) -> Option<PathBuf> {
    let entry = edit::plugins(list).iter().find(|p| {
        p.get("type").and_then(Json::as_str) == Some(edit::GUARD_TYPE)
            && p.get("delegate").is_some()
    })?;
    Some(
        entry
            .get("stateDir")
            .and_then(Json::as_str)
            .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), PathBuf::from),
    )
}
