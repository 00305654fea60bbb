//! What is left of a primary whose guard was killed: the primary dies with the guard
//! (`PR_SET_PDEATHSIG`), the plugins it runs (its IPAM) do not. They stay in its process
//! group and carry its environment, which is how they are found: a process counts only in
//! that group and with the call's marker (`NAME=nonce`), or, if it carries no such variable
//! (a plugin that builds its children's environment), with the call's `CNI_CONTAINERID`. So
//! a reused pid or group id never takes an unrelated process down, not even another
//! network's call for the same container, which carries a marker of its own.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the killed processes get to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// The environment a call's processes carry: its container, and its marker (`NAME=value`).
#[derive(Debug, Clone, Copy)]
pub struct CallIdentity<'a> {
    pub container_id: &'a str,
    pub marker: Option<&'a str>,
}

impl CallIdentity<'_> {
    fn carried_by(&self, environ: &[u8]) -> bool {
        let vars = || environ.split(|&b| b == 0);
        if let Some((name, _)) = self.marker.and_then(|m| m.split_once('=')) {
            let prefix = format!("{name}=");
            if let Some(var) = vars().find(|var| var.starts_with(prefix.as_bytes())) {
                return self.marker.is_some_and(|m| var == m.as_bytes());
            }
        }
        let container = format!("CNI_CONTAINERID={}", self.container_id);
        vars().any(|var| var == container.as_bytes())
    }
}

/// Kills every live process of group `pgid` that carries `call`, and returns how many still
/// run after `GONE_WITHIN` (a process in an uninterruptible wait).
pub fn kill_leftovers(pgid: i32, call: CallIdentity) -> usize {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        let left = leftovers(pgid, call);
        if left.is_empty() || Instant::now() >= until {
            return left.len();
        }
        for pid in left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The live (not zombie) processes of group `pgid` that carry `call`.
pub fn leftovers(pgid: i32, call: CallIdentity) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|&pid| live_in_group(pid, pgid))
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| call.carried_by(&environ))
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
    fn only_the_group_members_that_carry_the_call_are_killed() {
        // Only the variables given, so nothing inherited speaks for the process.
        let spawn = |vars: &[(&str, &str)]| {
            let mut command = std::process::Command::new("/bin/sleep");
            command
                .arg("30")
                .env_clear()
                .envs(vars.iter().copied())
                .process_group(0);
            command.spawn().unwrap()
        };
        // What a new process shows of itself in /proc may lag its spawn on a loaded machine.
        let eventually = |pgid: i32, call: CallIdentity| {
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                let found = leftovers(pgid, call);
                if !found.is_empty() || Instant::now() >= until {
                    return found;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let call = CallIdentity {
            container_id: "cut-off",
            marker: Some("SANDBOX_GUARD_ADD=1234"),
        };
        let mut ours = spawn(&[
            ("CNI_CONTAINERID", "cut-off"),
            ("SANDBOX_GUARD_ADD", "1234"),
        ]);
        let group = ours.id() as i32;
        assert_eq!(eventually(group, call), vec![group]);
        let without_marker = CallIdentity {
            marker: None,
            ..call
        };
        assert_eq!(leftovers(group, without_marker), vec![group]);
        let another = CallIdentity {
            container_id: "another",
            marker: None,
        };
        assert!(leftovers(group, another).is_empty());
        let prefix = CallIdentity {
            container_id: "cut",
            marker: None,
        };
        assert!(leftovers(group, prefix).is_empty(), "a prefix matched");
        // Another call for the same container: its own marker, or none (a plugin that built
        // its child's environment) and the container.
        let mut other_call = spawn(&[
            ("CNI_CONTAINERID", "cut-off"),
            ("SANDBOX_GUARD_ADD", "5678"),
        ]);
        assert!(leftovers(other_call.id() as i32, call).is_empty());
        let rebuilt = spawn(&[("CNI_CONTAINERID", "cut-off")]);
        assert_eq!(
            eventually(rebuilt.id() as i32, call),
            vec![rebuilt.id() as i32]
        );
        // A zombie (not reaped yet) is gone already.
        assert_eq!(kill_leftovers(group, call), 0);
        assert!(ours.wait().unwrap().code().is_none());
        assert!(
            other_call.try_wait().unwrap().is_none(),
            "another call's process was killed"
        );
        for mut child in [other_call, rebuilt] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
