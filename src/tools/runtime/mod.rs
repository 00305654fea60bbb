//! What the container runtime itself says it loaded, asked over its socket: containerd's
//! CRI Status (`cniconfig`), CRI-O's `GET /config`. For the readiness probe and the doctor
//! only, never on a runtime's exec; every call is bounded by `TIMEOUT`, so a hung runtime
//! makes the probe fall back to the files instead of hanging it.

pub mod cri_status;
pub mod crio;
pub mod http2;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Everything asked of one socket together: connecting, sending, reading each answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The runtimes' sockets where their packages put them: containerd, k3s's containerd, CRI-O.
pub const DEFAULT_SOCKETS: [&str; 3] = [
    "/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
];

/// One plugin of a loaded network: its type and its config as the runtime read it.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub kind: String,
    pub conf: Value,
}

#[derive(Debug, Clone)]
pub struct Network {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Plugin>,
}

/// What a runtime answered about its CNI setup.
#[derive(Debug, Clone)]
pub enum Loaded {
    /// containerd: the networks its CNI plugin holds now, pods' interfaces in order
    /// (`eth0` first; the loopback left out), the dirs it searches, its last load's outcome.
    Containerd {
        socket: PathBuf,
        conf_dir: PathBuf,
        plugin_dirs: Vec<PathBuf>,
        networks: Vec<Network>,
        /// `lastCNILoadStatus` when it is not `OK`.
        load_error: Option<String>,
    },
    /// CRI-O: where it reads and searches; which network it loaded is not exposed.
    Crio {
        socket: PathBuf,
        network: crio::CrioNetwork,
        /// Its CRI Version's `runtime_version` (`1.33.0`), or why it did not say.
        version: Result<String, String>,
    },
}

/// A socket with one deadline for everything done on it.
struct Timed {
    stream: UnixStream,
    deadline: Instant,
}

impl Timed {
    fn connect(socket: &Path, deadline: Instant) -> Result<Timed, String> {
        let stream = UnixStream::connect(socket).map_err(|e| format!("cannot connect: {e}"))?;
        Ok(Timed { stream, deadline })
    }

    fn left(&self) -> std::io::Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", TIMEOUT.as_secs()),
                )
            })
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The first of `sockets` whose runtime answers, or why none did (one line per socket).
/// All of them together within `TIMEOUT`.
pub fn ask(sockets: &[PathBuf]) -> Result<Loaded, Vec<String>> {
    ask_until(sockets, |_| Ok(()))
}

/// The first of `sockets` whose runtime answers and `wanted` takes (a runtime reading a
/// given conf dir, where a node runs two), or why none did; within one `TIMEOUT` in all.
pub fn ask_until(
    sockets: &[PathBuf],
    wanted: impl Fn(&Loaded) -> Result<(), String>,
) -> Result<Loaded, Vec<String>> {
    let deadline = Instant::now() + TIMEOUT;
    let mut why = Vec::new();
    for socket in sockets {
        if !socket.exists() {
            why.push(format!("no runtime socket at {}", socket.display()));
            continue;
        }
        match ask_one(socket, deadline).and_then(|loaded| wanted(&loaded).map(|()| loaded)) {
            Ok(loaded) => return Ok(loaded),
            Err(e) => why.push(format!("{}: {e}", socket.display())),
        }
    }
    Err(why)
}

fn ask_one(socket: &Path, deadline: Instant) -> Result<Loaded, String> {
    let info = cri_status::info(|| Timed::connect(socket, deadline));
    match info {
        Ok(info) if info.iter().any(|(k, _)| k == "cniconfig") => containerd(socket, &info),
        // CRI-O answers Status with its runtime config only; its network settings come from
        // its HTTP endpoint on the same socket.
        status => {
            let mut stream = Timed::connect(socket, deadline)?;
            let network = crio::network(&mut stream).map_err(|e| match status {
                Ok(_) => format!("CRI Status has no cniconfig, and {e}"),
                Err(status) => format!("{status}; {e}"),
            })?;
            // Which libcni it runs, hence whether it loads drop-ins, goes by its version.
            let version = Timed::connect(socket, deadline)
                .and_then(|mut stream| cri_status::version(&mut stream))
                .map(|(_, version)| version)
                .map_err(|e| format!("CRI Version: {e}"));
            Ok(Loaded::Crio {
                socket: socket.to_path_buf(),
                network,
                version,
            })
        }
    }
}

fn containerd(socket: &Path, info: &[(String, String)]) -> Result<Loaded, String> {
    let value = |key: &str| info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let cniconfig: Value = serde_json::from_str(value("cniconfig").unwrap_or_default())
        .map_err(|e| format!("containerd's cniconfig is not JSON: {e}"))?;
    let load_error = value("lastCNILoadStatus")
        .filter(|s| *s != "OK")
        .map(str::to_string);
    let (conf_dir, plugin_dirs, networks) = parse_cniconfig(&cniconfig)?;
    Ok(Loaded::Containerd {
        socket: socket.to_path_buf(),
        conf_dir,
        plugin_dirs,
        networks,
        load_error,
    })
}

/// go-cni's `ConfigResult`: `PluginConfDir`, `PluginDirs`, and `Networks`, each with its
/// `IFName` and `Config` (libcni's NetworkConfigList: `Name`, `CNIVersion`, `Plugins` with
/// each plugin's parsed `Network.type` and raw `Source`).
pub fn parse_cniconfig(cniconfig: &Value) -> Result<(PathBuf, Vec<PathBuf>, Vec<Network>), String> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let conf_dir = PathBuf::from(text(&cniconfig["PluginConfDir"]));
    let plugin_dirs = cniconfig["PluginDirs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(PathBuf::from)
        .collect();
    let mut networks = Vec::new();
    for network in cniconfig["Networks"].as_array().into_iter().flatten() {
        // containerd loads the loopback itself, for `lo`, outside the conf dir.
        if network["IFName"] == "lo" {
            continue;
        }
        let config = &network["Config"];
        let plugins = config["Plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| Plugin {
                kind: text(&p["Network"]["type"]),
                conf: p["Source"]
                    .as_str()
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(Value::Null),
            })
            .collect();
        networks.push(Network {
            name: text(&config["Name"]),
            cni_version: text(&config["CNIVersion"]),
            plugins,
        });
    }
    if cniconfig.get("PluginDirs").is_none() {
        return Err("containerd's cniconfig has no PluginDirs".to_string());
    }
    Ok((conf_dir, plugin_dirs, networks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_containerds_cniconfig() {
        // As containerd 1.6.20 and 2.2.9 answer (2.x leaves out the empty `dns`).
        let cniconfig = serde_json::json!({
            "Networks": [
                {"Config": {"CNIVersion": "0.3.1", "Name": "cni-loopback",
                    "Plugins": [{"Network": {"ipam": {}, "type": "loopback"}, "Source": "{\"type\":\"loopback\"}"}],
                    "Source": "{}"}, "IFName": "lo"},
                {"Config": {"CNIVersion": "1.0.0", "Name": "a",
                    "Plugins": [
                        {"Network": {"dns": {}, "ipam": {}, "type": "bridge"}, "Source": "{\"bridge\":\"x\",\"type\":\"bridge\"}"},
                        {"Network": {"dns": {}, "ipam": {}, "type": "sandbox-guard"}, "Source": "{\"stateDir\":\"/tmp/x\",\"type\":\"sandbox-guard\"}"}
                    ],
                    "Source": "{}"}, "IFName": "eth0"}
            ],
            "PluginConfDir": "/etc/cni/net.d",
            "PluginDirs": ["/opt/cni/bin", "/usr/lib/cni"],
            "PluginMaxConfNum": 1,
            "Prefix": "eth"
        });
        let (conf_dir, dirs, networks) = parse_cniconfig(&cniconfig).unwrap();
        assert_eq!(conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(dirs, ["/opt/cni/bin", "/usr/lib/cni"].map(PathBuf::from));
        assert_eq!(networks.len(), 1);
        assert_eq!(networks[0].name, "a");
        assert_eq!(networks[0].cni_version, "1.0.0");
        assert_eq!(networks[0].plugins[1].kind, "sandbox-guard");
        assert_eq!(networks[0].plugins[1].conf["stateDir"], "/tmp/x");
        assert!(parse_cniconfig(&serde_json::json!({"Networks": 1})).is_err());
    }

    #[test]
    fn a_silent_runtime_cannot_hang_the_probe() {
        let dir = std::env::temp_dir().join(format!("sg-silent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("runtime.sock");
        let _ = std::fs::remove_file(&socket);
        // Accepts connections and never answers: the probe must give up on its own.
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let held = std::thread::spawn(move || {
            let mut kept = Vec::new();
            for _ in 0..3 {
                if let Ok((stream, _)) = listener.accept() {
                    kept.push(stream);
                }
            }
            kept
        });
        let why = ask(&[socket.clone(), dir.join("absent.sock")]).unwrap_err();
        assert!(why[0].contains("no answer within"), "{why:?}");
        assert!(why[1].contains("no runtime socket at"), "{why:?}");
        drop(held.join());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
