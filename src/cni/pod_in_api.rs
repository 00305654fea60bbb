//! The API server's view of a pod's name, asked where the local rule cannot decide
//! (`state::ownership::name_moved`, `late_add`): one GET of the pod, bounded by `API_BOUND`,
//! made by the operator's binary beside the plugin (`tools::api`), so that the binary the
//! runtime execs for every pod carries no TLS or HTTP code. An answer that does not come in
//! time, or does not parse, is `Unknown`: the verb falls back to the local rule and says so.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The longest a verb waits for the API server's answer, exec of the client included.
pub const API_BOUND: Duration = Duration::from_secs(1);
/// The client's own bound on the request, inside `API_BOUND`: the rest is its exec and TLS
/// set-up, and the plugin kills it at `API_BOUND` whatever it is doing.
pub const REQUEST_BOUND: Duration = Duration::from_millis(800);
/// How long a killed client is waited for before it is left to init.
const REAP_WAIT: Duration = Duration::from_millis(100);
/// The hidden command of the operator's binary that asks.
pub const GET_POD_FLAG: &str = "--get-pod";

/// What the API server holds under a pod's namespace and name: the client's stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInApi {
    pub found: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Empty while the pod is not scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// The answer, or why there is none.
#[derive(Debug)]
pub enum Asked {
    Answered(PodInApi),
    Unknown(String),
}

/// Asks for `namespace/name` with `kubeconfig`. Never blocks longer than `API_BOUND`.
pub fn ask(kubeconfig: &Path, namespace: &str, name: &str) -> Asked {
    let client = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(crate::CTL_BINARY),
        Err(err) => return Asked::Unknown(format!("cannot find this binary's folder: {err}")),
    };
    ask_with(&client, kubeconfig, namespace, name)
}

pub fn ask_with(client: &Path, kubeconfig: &Path, namespace: &str, name: &str) -> Asked {
    let started = Instant::now();
    let spawned = Command::new(client)
        .arg(GET_POD_FLAG)
        .arg(format!("{namespace}/{name}"))
        .arg(kubeconfig)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            return Asked::Unknown(format!("cannot run {}: {err}", client.display()));
        }
    };
    let status = crate::cni::delegate::wait_until(&mut child, Some(started + API_BOUND));
    let Ok(Some(status)) = status else {
        let group = nix::unistd::Pid::from_raw(child.id() as nix::libc::pid_t);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        // Reaped if it dies at once; one stuck in the kernel (a hung file system) is left to
        // init rather than waited for.
        let killed = Instant::now();
        while matches!(child.try_wait(), Ok(None)) && killed.elapsed() < REAP_WAIT {
            std::thread::sleep(Duration::from_millis(2));
        }
        return Asked::Unknown(format!(
            "the API server did not answer within {} ms",
            API_BOUND.as_millis()
        ));
    };
    // The client has exited: its pipes hold all it wrote, a few hundred bytes.
    let mut out = Vec::new();
    let mut err = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.by_ref().take(64 * 1024).read_to_end(&mut out);
    }
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.by_ref().take(4096).read_to_string(&mut err);
    }
    if !status.success() {
        let err = err.trim();
        return Asked::Unknown(if err.is_empty() {
            format!("{} ended with {status}", client.display())
        } else {
            err.trim_start_matches("sandbox-guard: ").to_string()
        });
    }
    match serde_json::from_slice::<PodInApi>(&out) {
        Ok(pod) if !pod.found || pod.uid.is_some() => Asked::Answered(pod),
        _ => Asked::Unknown(format!(
            "{} printed no pod: {:?}",
            client.display(),
            String::from_utf8_lossy(&out)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(body: &str) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "sg-api-client-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn an_answer_a_failure_and_a_hung_client_within_the_bound() {
        let answered = script(r#"echo '{"found":true,"uid":"u-2","nodeName":"b"}'"#);
        match ask_with(&answered, Path::new("/k"), "ns", "db-0") {
            Asked::Answered(pod) => {
                assert_eq!(pod.uid.as_deref(), Some("u-2"));
                assert_eq!(pod.node_name.as_deref(), Some("b"));
            }
            other => panic!("{other:?}"),
        }
        let failed = script("echo 'sandbox-guard: connection refused' >&2; exit 1");
        match ask_with(&failed, Path::new("/k"), "ns", "db-0") {
            Asked::Unknown(why) => assert_eq!(why, "connection refused"),
            other => panic!("{other:?}"),
        }
        let hung = script("sleep 30");
        let started = Instant::now();
        match ask_with(&hung, Path::new("/k"), "ns", "db-0") {
            Asked::Unknown(why) => assert!(why.contains("did not answer"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The bound itself, with room for a loaded machine: never the 30 s of the client.
        assert!(started.elapsed() < Duration::from_secs(10));
        for path in [answered, failed, hung] {
            let _ = std::fs::remove_file(path);
        }
    }
}
