//! The recording primary (tests/primaries/recording-plugin) wrapped by the guard in delegate
//! mode: a bin dir holding it for CNI_PATH, its state dir, and readers of what reached it.
//! Needs `sys` and `cni` (tests/support/sys.rs, cni.rs) included by the test crate.
#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::cni::Cni;
use crate::sys::TempDir;

pub const TYPE: &str = "recording-primary";

pub struct RecordingPrimary {
    _dir: TempDir,
    pub bin_dir: PathBuf,
    pub state_dir: PathBuf,
}

/// One line of the primary's calls.log: `<time> start|end|failed <container> netns=.. args=.. <VERB>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub time: f64,
    pub phase: String,
    pub container: String,
    pub netns: String,
    pub args: String,
    pub verb: String,
}

impl RecordingPrimary {
    pub fn new() -> RecordingPrimary {
        let dir = TempDir::new("sgprim");
        let bin_dir = dir.path.join("bin");
        let state_dir = dir.path.join("primary");
        fs::create_dir_all(&bin_dir).unwrap();
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/primaries/recording-plugin"
        );
        std::os::unix::fs::symlink(script, bin_dir.join(TYPE)).unwrap();
        RecordingPrimary {
            _dir: dir,
            bin_dir,
            state_dir,
        }
    }

    /// The guard's `delegate` object for this primary, with `extra` keys of the primary's own.
    pub fn delegate(&self, extra: Value) -> Value {
        let mut object = json!({"type": TYPE, "stateDir": self.state_dir});
        if let (Some(into), Some(from)) = (object.as_object_mut(), extra.as_object()) {
            into.extend(from.clone());
        }
        object
    }

    /// `call` as a runtime runs the guard standing first in the chain, wrapping this primary:
    /// no prevResult on ADD (nothing ran before it), the cached result on CHECK and DEL.
    pub fn wrap(&self, call: Cni) -> Cni {
        let call = call
            .config("delegate", Some(self.delegate(json!({}))))
            .env("CNI_PATH", Some(self.bin_dir.to_str().unwrap()));
        if call.verb() == "ADD" {
            call.no_prev_result()
        } else {
            call
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        fs::read_to_string(self.state_dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut words = line.split(' ');
                Some(Call {
                    time: words.next()?.parse().ok()?,
                    phase: words.next()?.to_string(),
                    container: words.next()?.to_string(),
                    netns: words.next()?.strip_prefix("netns=")?.to_string(),
                    args: words.next()?.strip_prefix("args=")?.to_string(),
                    verb: words.next()?.to_string(),
                })
            })
            .collect()
    }

    /// The calls that reached the primary, as `(VERB, container)` in the order they started.
    pub fn started(&self) -> Vec<(String, String)> {
        self.calls()
            .into_iter()
            .filter(|c| c.phase == "start")
            .map(|c| (c.verb, c.container))
            .collect()
    }

    /// The stdin the primary got for the last `verb` of `container`.
    pub fn stdin(&self, verb: &str, container: &str) -> Value {
        let text = fs::read_to_string(self.state_dir.join(format!("stdin-{verb}-{container}")))
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("the primary's stdin for {verb} {container} is not JSON ({e}): {text}")
        })
    }

    /// How many DELs of `container` the primary accepted.
    pub fn dels(&self, container: &str) -> usize {
        fs::read_to_string(self.state_dir.join(format!("dels-{container}")))
            .map_or(0, |text| text.lines().count())
    }

    /// Makes the primary answer `verb` of `container` with this CNI error until `heal`.
    pub fn fail(&self, verb: &str, container: &str, error: &Value) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(
            self.state_dir.join(format!("fail-{verb}-{container}")),
            error.to_string(),
        )
        .unwrap();
    }

    pub fn heal(&self, verb: &str, container: &str) {
        let _ = fs::remove_file(self.state_dir.join(format!("fail-{verb}-{container}")));
    }

    /// Makes the primary take `seconds` over `verb` of `container`.
    pub fn slow(&self, verb: &str, container: &str, seconds: f64) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(
            self.state_dir.join(format!("sleep-{verb}-{container}")),
            seconds.to_string(),
        )
        .unwrap();
    }

    /// Makes the primary leave a daemon behind on `verb` of `container`, living `seconds` and
    /// holding the primary's stdout open.
    pub fn daemon(&self, verb: &str, container: &str, seconds: f64) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(
            self.state_dir.join(format!("daemon-{verb}-{container}")),
            seconds.to_string(),
        )
        .unwrap();
    }

    /// Makes the primary leave a daemon of its own session behind on `verb` of `container`
    /// (`setsid`, its stdio on /dev/null, every other descriptor it inherited kept), living
    /// `seconds`: out of reach of its process group's kill.
    pub fn setsid_daemon(&self, verb: &str, container: &str, seconds: f64) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(
            self.state_dir.join(format!("setsid-{verb}-{container}")),
            seconds.to_string(),
        )
        .unwrap();
    }

    /// Makes the primary answer ADD of `container` with exactly these bytes.
    pub fn answer_add(&self, container: &str, result: &str) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(self.state_dir.join(format!("result-{container}")), result).unwrap();
    }
}
