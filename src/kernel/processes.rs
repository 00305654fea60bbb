//! What is left of a primary whose guard was killed: the primary dies with the guard
//! (`PR_SET_PDEATHSIG`), the plugins it runs (its IPAM) do not. They stay in its process
//! group and carry its `CNI_CONTAINERID`, which is how they are found: a process counts only
//! with both, so a reused pid or group id never takes an unrelated process down.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the killed processes get to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// Kills every live process of group `pgid` whose environment names `container_id`, and
/// returns how many still run after `GONE_WITHIN` (a process in an uninterruptible wait).
pub fn kill_leftovers(pgid: i32, container_id: &str) -> usize {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        let left = leftovers(pgid, container_id);
        if left.is_empty() || Instant::now() >= until {
            return left.len();
        }
        for pid in left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The live (not zombie) processes of group `pgid` whose environment names `container_id`.
pub fn leftovers(pgid: i32, container_id: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let wanted = format!("CNI_CONTAINERID={container_id}");
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|&pid| live_in_group(pid, pgid))
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|&b| b == 0)
                    .any(|var| var == wanted.as_bytes())
            })
        })
        .collect()
}

/// From `/proc/<pid>/stat`: after the command's closing parenthesis come the state and then
/// the parent, the process group.
fn live_in_group(pid: i32, pgid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((_, after)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = after.split_whitespace();
    let state = fields.next();
    let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
    !matches!(state, Some("Z" | "X")) && group == Some(pgid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn only_the_group_members_that_name_the_container_are_killed() {
        let spawn = |container: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env("CNI_CONTAINERID", container)
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut ours = spawn("cut-off");
        let mut other = spawn("another");
        let group = ours.id() as i32;
        assert_eq!(leftovers(group, "cut-off"), vec![group]);
        assert!(leftovers(group, "another").is_empty());
        assert!(leftovers(other.id() as i32, "cut-off").is_empty());
        // A zombie (not reaped yet) is gone already.
        assert_eq!(kill_leftovers(group, "cut-off"), 0);
        assert!(ours.wait().unwrap().code().is_none());
        assert!(
            other.try_wait().unwrap().is_none(),
            "another container's process was killed"
        );
        let _ = other.kill();
        let _ = other.wait();
    }
}
