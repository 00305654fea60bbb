//! The plugin's entry of the conflist, as libcni hands it on stdin (with `name`,
//! `cniVersion` and, when chained, `prevResult` filled in by the runtime).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{GuardError, Kind, Result};
use crate::names::{self, MAX_NETWORK};

pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/sandbox-guard";
/// How long a verb waits for the store's lock. Operations hold it for milliseconds; seconds
/// of waiting mean a stuck holder, and the runtime's retry is better than a hung pod start.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_LOCK_TIMEOUT_SECONDS: f64 = 600.0;
/// A conflist entry is a few KiB; more is a runaway writer, not a config.
pub const MAX_STDIN: u64 = 1 << 20;
/// How long an operation waits for the one before it on the same pod key to finish in the
/// delegate. A primary's ADD can take seconds (IPAM, a datastore); failing a RunPodSandbox
/// costs kubelet a whole new sandbox, so this wait is generous. Other pods never wait on it.
pub const DEFAULT_POD_LOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the replay worker gives the primary for one deferred DEL before it kills it with
/// its process group. No pod's verb waits on it, so it can be as long as the slowest healthy
/// primary DEL; a pod's own next ADD waits for it on its pod lock, so it may not exceed
/// `podLockTimeoutSeconds`.
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleDelPolicy {
    /// Fail the stale DEL so the primary plugin never sees it.
    Refuse,
    /// Let it pass and log what would have been refused (for rollouts).
    Audit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpConflictPolicy {
    /// Log the conflict and let the ADD pass: the primary plugin's IPAM has the last word.
    Warn,
    /// Fail the ADD, naming the sandbox whose namespace still holds the address.
    Refuse,
}

#[derive(Debug, Deserialize, serde::Serialize, PartialEq, Eq, Hash, Clone)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(rename = "ifname")]
    pub ifname: String,
}

#[derive(Debug, Deserialize)]
struct RawConf {
    #[serde(rename = "cniVersion")]
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "stateDir")]
    state_dir: Option<PathBuf>,
    #[serde(rename = "staleDel")]
    stale_del: Option<String>,
    #[serde(rename = "logFile")]
    log_file: Option<PathBuf>,
    #[serde(rename = "logFormat")]
    log_format: Option<String>,
    #[serde(rename = "logMaxBytes")]
    /// Any JSON: no value of it fails an operation (`LogOptions::with_max_bytes`).
    log_max_bytes: Option<serde_json::Value>,
    #[serde(rename = "metricsFile")]
    metrics_file: Option<PathBuf>,
    #[serde(rename = "ipConflict")]
    ip_conflict: Option<String>,
    #[serde(rename = "podKey")]
    pod_key: Option<String>,
    #[serde(rename = "lockTimeoutSeconds")]
    lock_timeout_seconds: Option<f64>,
    #[serde(rename = "podLockTimeoutSeconds")]
    pod_lock_timeout_seconds: Option<f64>,
    #[serde(rename = "replayTimeoutSeconds")]
    replay_timeout_seconds: Option<f64>,
    kubeconfig: Option<PathBuf>,
    #[serde(rename = "podKeyScope")]
    pod_key_scope: Option<String>,
    #[serde(rename = "nodeName")]
    node_name: Option<String>,
    delegate: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(rename = "runtimeConfig")]
    runtime_config: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(rename = "prevResult")]
    prev_result: Option<Box<RawValue>>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<ValidAttachment>>,
    #[serde(rename = "cni.dev/attachments")]
    legacy_attachments: Option<Vec<ValidAttachment>>,
}

#[derive(Debug)]
pub struct NetConf {
    pub cni_version: String,
    pub network: String,
    pub state_dir: PathBuf,
    pub stale_del: StaleDelPolicy,
    pub log_file: Option<PathBuf>,
    pub log: crate::cni::log::LogOptions,
    /// Where the Prometheus textfile goes (`cni::metrics`); `None`: no metrics kept.
    pub metrics_file: Option<PathBuf>,
    pub ip_conflict: IpConflictPolicy,
    /// What the primary keys its state by, and so what a DEL is judged stale by.
    pub pod_key: crate::state::ownership::PodKeyRule,
    pub lock_timeout: Duration,
    /// Kept as the exact bytes the runtime sent, so ADD can hand them on unchanged.
    pub prev_result: Option<Box<RawValue>>,
    /// GC's list; `None` when the runtime sent neither key.
    pub valid_attachments: Option<Vec<ValidAttachment>>,
    /// Delegate mode: the primary the guard wraps. `None`: chained mode.
    pub delegate: Option<crate::cni::delegate::Delegate>,
    pub pod_lock_timeout: Duration,
    /// Delegate mode: the time one replayed DEL may take in the primary.
    pub replay_timeout: Duration,
    /// Where the local rule cannot decide, ask the API server (`cni::pod_in_api`) with this
    /// kubeconfig; `None`: never ask.
    pub kubeconfig: Option<PathBuf>,
    /// How far the primary's pod-name state reaches: whether a DEL whose pod name the API
    /// shows on another node is held.
    pub pod_key_scope: crate::state::ownership::PodKeyScope,
    /// This node's name as kubelet registers it (`nodeName`, else the host name).
    pub node_name: Option<String>,
}

/// Reads stdin up to the limit; the bytes are parsed by `NetConf::parse`.
pub fn read_stdin() -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(4096);
    std::io::stdin()
        .lock()
        .take(MAX_STDIN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            GuardError::new(
                Kind::Io,
                format!("cannot read the network configuration from stdin: {e}"),
            )
            .with_source(e)
        })?;
    if bytes.len() as u64 > MAX_STDIN {
        return Err(GuardError::new(
            Kind::Decode,
            format!(
                "the network configuration on stdin is larger than {MAX_STDIN} bytes: it cannot be a conflist entry"
            ),
        ));
    }
    Ok(bytes)
}

/// Just the version, read first so that even a config we reject is answered in a version
/// the runtime speaks.
pub fn peek_version(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    serde_json::from_slice::<Peek>(bytes)
        .ok()
        .map(|p| version_or_unversioned(p.cni_version))
}

/// A missing or empty `cniVersion` is 0.1.0, as libcni's `create.DecodeVersion` reads it.
fn version_or_unversioned(version: Option<String>) -> String {
    version
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| crate::cni::version::UNVERSIONED.to_string())
}

impl NetConf {
    pub fn parse(bytes: &[u8]) -> Result<NetConf> {
        // Like the reference plugins: what does not unmarshal is a decode failure (6), what
        // unmarshals but is wrong is an invalid config (7).
        let raw: RawConf = serde_json::from_slice(bytes).map_err(|e| {
            GuardError::new(
                Kind::Decode,
                format!("cannot decode the network configuration: {e}"),
            )
            .with_source(e)
        })?;
        let cni_version = version_or_unversioned(raw.cni_version);
        let network = raw.name.ok_or_else(|| {
            GuardError::new(
                Kind::InvalidConfig,
                "the network configuration has no name: give the conflist a \"name\"",
            )
        })?;
        names::check_plain("network name", &network, MAX_NETWORK, Kind::InvalidConfig)?;
        let stale_del = choice(
            "staleDel",
            raw.stale_del.as_deref(),
            &[
                ("refuse", StaleDelPolicy::Refuse),
                ("audit", StaleDelPolicy::Audit),
            ],
        )?;
        let ip_conflict = choice(
            "ipConflict",
            raw.ip_conflict.as_deref(),
            &[
                ("warn", IpConflictPolicy::Warn),
                ("refuse", IpConflictPolicy::Refuse),
            ],
        )?;
        let pod_key = choice(
            "podKey",
            raw.pod_key.as_deref(),
            &crate::state::ownership::PodKeyRule::CHOICES,
        )?;
        let state_dir = raw
            .state_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        require_absolute("stateDir", &state_dir)?;
        if let Some(log_file) = &raw.log_file {
            require_absolute("logFile", log_file)?;
        }
        if let Some(metrics_file) = &raw.metrics_file {
            require_absolute("metricsFile", metrics_file)?;
        }
        use crate::cni::log::{LogFormat, LogOptions};
        let format = choice(
            "logFormat",
            raw.log_format.as_deref(),
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        )?;
        let log = LogOptions::with_max_bytes(format, raw.log_max_bytes.as_ref());
        let lock_timeout = match raw.lock_timeout_seconds {
            None => DEFAULT_LOCK_TIMEOUT,
            Some(seconds) => lock_timeout("lockTimeoutSeconds", seconds)
                .map_err(|msg| GuardError::new(Kind::InvalidConfig, msg))?,
        };
        let pod_lock_timeout = match raw.pod_lock_timeout_seconds {
            None => DEFAULT_POD_LOCK_TIMEOUT,
            Some(seconds) => self::lock_timeout("podLockTimeoutSeconds", seconds)
                .map_err(|msg| GuardError::new(Kind::InvalidConfig, msg))?,
        };
        let replay_timeout = match raw.replay_timeout_seconds {
            None => DEFAULT_REPLAY_TIMEOUT,
            Some(seconds) if seconds > 0.0 => {
                self::lock_timeout("replayTimeoutSeconds", seconds)
                    .map_err(|msg| GuardError::new(Kind::InvalidConfig, msg))?
            }
            Some(seconds) => {
                return Err(GuardError::new(
                    Kind::InvalidConfig,
                    format!(
                        "replayTimeoutSeconds {seconds} is not valid: use a positive number of seconds, at most {MAX_LOCK_TIMEOUT_SECONDS}"
                    ),
                ));
            }
        };
        if raw.delegate.is_some() && pod_lock_timeout < replay_timeout {
            return Err(GuardError::new(
                Kind::InvalidConfig,
                format!(
                    "podLockTimeoutSeconds {} is below replayTimeoutSeconds {}: a pod's next ADD would give up while a replay of its old sandbox's DEL still runs",
                    pod_lock_timeout.as_secs_f64(),
                    replay_timeout.as_secs_f64()
                ),
            )
            .with_details("Raise podLockTimeoutSeconds to at least replayTimeoutSeconds (defaults 60 and 30), or lower replayTimeoutSeconds."));
        }
        let pod_key_scope = choice(
            "podKeyScope",
            raw.pod_key_scope.as_deref(),
            &crate::state::ownership::PodKeyScope::CHOICES,
        )?;
        if let Some(kubeconfig) = &raw.kubeconfig {
            require_absolute("kubeconfig", kubeconfig)?;
        }
        if let Some(node_name) = &raw.node_name {
            names::check_plain(
                "nodeName",
                node_name,
                names::MAX_POD_FIELD,
                Kind::InvalidConfig,
            )?;
        }
        // GC's lists go to the primary under the keys the runtime wrote them.
        let gc_lists: Vec<(&str, serde_json::Value)> = crate::cni::delegate::GC_LIST_KEYS
            .into_iter()
            .zip([&raw.valid_attachments, &raw.legacy_attachments])
            .filter_map(|(key, list)| Some((key, serde_json::to_value(list.as_ref()?).ok()?)))
            .collect();
        let valid_attachments = raw.valid_attachments.or(raw.legacy_attachments);
        let delegate = match raw.delegate {
            None => None,
            Some(object) => Some(crate::cni::delegate::Delegate::from_conf(
                object,
                raw.runtime_config.as_ref(),
                &gc_lists,
            )?),
        };
        Ok(NetConf {
            cni_version,
            pod_lock_timeout,
            replay_timeout,
            delegate,
            lock_timeout,
            network,
            state_dir,
            stale_del,
            pod_key,
            log_file: raw.log_file,
            log,
            metrics_file: raw.metrics_file,
            ip_conflict,
            prev_result: raw.prev_result,
            valid_attachments,
            kubeconfig: raw.kubeconfig,
            pod_key_scope,
            node_name: raw.node_name,
        })
    }
}

/// A wait in seconds, for the config key and the CLI's --lock-timeout alike.
pub fn lock_timeout(what: &str, seconds: f64) -> std::result::Result<Duration, String> {
    if !(0.0..=MAX_LOCK_TIMEOUT_SECONDS).contains(&seconds) {
        return Err(format!(
            "{what} {seconds} is not valid: use a non-negative number of seconds, at most {MAX_LOCK_TIMEOUT_SECONDS}"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A key that takes one of a few words; the first is the default.
fn choice<T: Copy>(key: &str, value: Option<&str>, options: &[(&str, T)]) -> Result<T> {
    let Some(value) = value else {
        return Ok(options[0].1);
    };
    options
        .iter()
        .find(|(word, _)| *word == value)
        .map(|(_, policy)| *policy)
        .ok_or_else(|| {
            let words: Vec<String> = options
                .iter()
                .map(|(word, _)| format!("{word:?}"))
                .collect();
            GuardError::new(
                Kind::InvalidConfig,
                format!(
                    "{key} {:?} is not valid: use {}",
                    names::shorten(value),
                    words.join(" or ")
                ),
            )
        })
}

pub fn require_absolute(key: &str, path: &std::path::Path) -> Result<()> {
    let text = path.to_string_lossy();
    if !path.is_absolute() || text.split('/').any(|c| c == "..") {
        return Err(GuardError::new(
            Kind::InvalidConfig,
            format!(
                "{key} {:?} must be an absolute path without \"..\"",
                names::shorten(&text)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let conf = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"net","type":"sandbox-guard"}"#)
            .unwrap();
        assert_eq!(conf.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(conf.stale_del, StaleDelPolicy::Refuse);
        assert_eq!(conf.ip_conflict, IpConflictPolicy::Warn);
        assert!(conf.prev_result.is_none());
    }

    #[test]
    fn codes_for_bad_configs() {
        let cases: [(&[u8], u32); 13] = [
            (br#"{"cniVersion":"1.0.0","name":"n","logFormat":"xml"}"#, 7),
            (
                br#"{"cniVersion":"1.0.0","name":"n","metricsFile":"m.prom"}"#,
                7,
            ),
            (
                br#"{"cniVersion":"1.0.0","name":"n","lockTimeoutSeconds":-1}"#,
                7,
            ),
            (
                br#"{"cniVersion":"1.0.0","name":"n","lockTimeoutSeconds":"5s"}"#,
                6,
            ),
            (b"{not json", 6),
            (br#"{"cniVersion":"1.0.0"}"#, 7),
            (br#"{"name":"n","cniVersion":null,"delegate":7}"#, 6),
            (br#"{"cniVersion":1,"name":"n"}"#, 6),
            (
                br#"{"cniVersion":"1.0.0","name":"n","staleDel":"maybe"}"#,
                7,
            ),
            (
                br#"{"cniVersion":"1.0.0","name":"n","stateDir":"relative/dir"}"#,
                7,
            ),
            (br#"{"cniVersion":"1.0.0","name":"../n"}"#, 7),
            (
                br#"{"cniVersion":"1.0.0","name":"n","ipConflict":"maybe"}"#,
                7,
            ),
            (br#"{"cniVersion":"1.0.0","name":"n","ipConflict":true}"#, 6),
        ];
        for (bytes, code) in cases {
            assert_eq!(
                NetConf::parse(bytes).unwrap_err().code(),
                code,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn a_pod_lock_wait_below_the_replay_timeout_is_refused() {
        let parse = |extra: &str| {
            let text =
                format!(r#"{{"cniVersion":"1.0.0","name":"n","delegate":{{"type":"p"}}{extra}}}"#);
            NetConf::parse(text.as_bytes())
        };
        let err = parse(r#","podLockTimeoutSeconds":10"#).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.msg.contains("replayTimeoutSeconds"), "{err:?}");
        parse(r#","podLockTimeoutSeconds":10,"replayTimeoutSeconds":10"#).unwrap();
        for bad in ["0", "-1", "601"] {
            let extra = format!(r#","replayTimeoutSeconds":{bad}"#);
            assert_eq!(parse(&extra).unwrap_err().code(), 7, "{bad}");
        }
        assert_eq!(parse("").unwrap().replay_timeout, DEFAULT_REPLAY_TIMEOUT);
    }

    #[test]
    fn a_config_without_a_version_is_0_1_0() {
        for bytes in [
            &br#"{"name":"n"}"#[..],
            br#"{"name":"n","cniVersion":""}"#,
            br#"{"name":"n","cniVersion":null}"#,
        ] {
            assert_eq!(NetConf::parse(bytes).unwrap().cni_version, "0.1.0");
            assert_eq!(peek_version(bytes).as_deref(), Some("0.1.0"));
        }
        assert_eq!(peek_version(b"{not json"), None);
    }

    #[test]
    fn legacy_gc_key_is_accepted() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(conf.valid_attachments.unwrap().len(), 1);
    }
}
