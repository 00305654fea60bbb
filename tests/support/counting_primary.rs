//! tests/primaries/counting-primary as the primary of a delegate-mode guard: the config that
//! wraps it, and its call log read back as what reached the primary, in order.
//! Needs `crate::sys` and `crate::cni` (include tests/support/sys.rs, testdata.rs and cni.rs).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::cni::Cni;
use crate::sys::TempDir;

const PRIMARIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/primaries");

/// One call that reached the primary (a line of its call log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryCall {
    pub verb: String,
    pub container: String,
    pub ifname: String,
    /// `namespace/name`, or `-` when CNI_ARGS named no pod.
    pub pod: String,
    /// CNI_NETNS, `-` when empty.
    pub netns: String,
    /// The first address of the prevResult it got (without prefix length), `-` for none.
    pub prev_address: String,
    /// The pid of the process that ran it: the guard.
    pub caller: u32,
    /// GC's valid attachments (container IDs).
    pub valid: Vec<String>,
}

impl PrimaryCall {
    fn parse(line: &str) -> PrimaryCall {
        let mut words = line.split(' ');
        let verb = words.next().unwrap_or_default().to_string();
        let fields: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let field = |key: &str| {
            fields
                .get(key)
                .unwrap_or_else(|| panic!("call log line lacks {key}=: {line}"))
                .to_string()
        };
        let valid = field("valid");
        PrimaryCall {
            verb,
            container: field("cid"),
            ifname: field("if"),
            pod: field("pod"),
            netns: field("netns"),
            prev_address: field("prev"),
            caller: field("ppid")
                .parse()
                .unwrap_or_else(|e| panic!("ppid in {line}: {e}")),
            valid: if valid == "-" {
                Vec::new()
            } else {
                valid.split(',').map(str::to_string).collect()
            },
        }
    }
}

/// A counting primary with a call log of its own.
pub struct CountingPrimary {
    pub call_log: PathBuf,
    _dir: TempDir,
}

impl CountingPrimary {
    pub fn new() -> CountingPrimary {
        let dir = TempDir::new("sgcp");
        CountingPrimary {
            call_log: dir.path.join("calls.log"),
            _dir: dir,
        }
    }

    /// The guard's entry wrapping this primary (`delegate`), found in CNI_PATH as a runtime
    /// finds plugins; a short per-pod-lock wait, so a lock a killed guard left held would
    /// fail the test instead of stalling it.
    pub fn wrap(&self, call: Cni) -> Cni {
        call.config(
            "delegate",
            Some(json!({"type": "counting-primary", "callLog": self.call_log})),
        )
        .config("podLockTimeoutSeconds", Some(json!(10)))
        .config("replayTimeoutSeconds", Some(json!(10)))
        .env("CNI_PATH", Some(PRIMARIES))
    }

    /// `wrap`, with an ADD that first waits `seconds` for a child of its own (an IPAM plugin).
    pub fn wrap_with_slow_ipam(&self, call: Cni, seconds: f64) -> Cni {
        self.wrap(call).config(
            "delegate",
            Some(json!({"type": "counting-primary", "callLog": self.call_log, "ipamSeconds": seconds.to_string()})),
        )
    }

    /// Every call so far, oldest first. Waits for calls still running (one that outlived its
    /// killed guard) to finish first.
    pub fn calls(&self) -> Vec<PrimaryCall> {
        self.wait_idle();
        let text = std::fs::read_to_string(&self.call_log).unwrap_or_default();
        text.lines().map(PrimaryCall::parse).collect()
    }

    /// Blocks until no call of the primary runs (each holds the log's lock throughout).
    pub fn wait_idle(&self) {
        let lock = lock_path(&self.call_log);
        let file = File::options()
            .create(true)
            .append(true)
            .open(&lock)
            .unwrap_or_else(|e| panic!("{}: {e}", lock.display()));
        file.lock()
            .unwrap_or_else(|e| panic!("lock {}: {e}", lock.display()));
    }
}

fn lock_path(call_log: &Path) -> PathBuf {
    let mut name = call_log.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}
