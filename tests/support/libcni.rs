//! Drives sandbox-guard through the real libcni (tests/libcni-driver, built from Debian's
//! libcni source): the library that containerd and CRI-O call, so plugin lookup, prevResult
//! injection, the result cache and DEL's reverse order are libcni's own, not a test's guess.
//! Needs `crate::sys`, `crate::testdata` and `crate::cni` (include tests/support/sys.rs,
//! testdata.rs and cni.rs next to this module).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::sys::{self, HostLink, Netns, TempDir};
use crate::{cni, testdata};

const REFERENCE_PLUGINS: &str = "/usr/lib/cni";
const REPO: &str = env!("CARGO_MANIFEST_DIR");
pub const IFNAME: &str = "eth0";

/// What a libcni test needs on the machine, for `sys::require`.
pub const TOOLS: &[&str] = &[
    "go",
    "ip",
    "ping",
    "/usr/share/gocode/src/github.com/containernetworking/cni/libcni",
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/macvlan",
    "/usr/lib/cni/host-local",
];

/// The driver binary, built once per test process. It lives in cargo's target tmp dir like
/// any other build output; the build script renames atomically, so parallel runs are safe.
pub fn driver() -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(|| build_driver("libcni-driver", None))
}

/// Where libcni 1.3's source lies (no third-party dependencies): the version containerd 2.1
/// and CRI-O 1.33 link, the first to append `<confdir>/<network name>/*.conf` drop-ins.
pub const LIBCNI_1_3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vendor/cni-1.3.0");

/// The same driver built against libcni 1.3 instead of Debian's 1.1.
pub fn driver_1_3() -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(|| build_driver("libcni-1.3-driver", Some(LIBCNI_1_3)))
}

fn build_driver(name: &str, gopath: Option<&str>) -> PathBuf {
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let script = Path::new(REPO).join("scripts/build-libcni-driver.sh");
    let mut args = vec![script.to_str().unwrap(), out_dir.to_str().unwrap()];
    args.extend(gopath);
    sys::run("bash", &args);
    out_dir.join("libcni-driver")
}

/// A /24 no other test of this process holds and no route or address of the host overlaps,
/// so a bridge gateway or a macvlan pod never answers for somebody else's network.
#[derive(Clone, Copy, Debug)]
pub struct Subnet {
    second: u8,
    third: u8,
}

impl Subnet {
    pub fn unique() -> Subnet {
        let [_, second, third] = sys::free_subnet(10, 200..=254);
        Subnet { second, third }
    }

    pub fn cidr(&self) -> String {
        format!("10.{}.{}.0/24", self.second, self.third)
    }

    pub fn host(&self, last: u8) -> String {
        format!("10.{}.{}.{last}", self.second, self.third)
    }

    /// The IPv6 twin of the /24: a unique local /64 that carries the same two octets.
    /// Written as the kernel and the plugins write it (RFC 5952): a third octet of 0 is a zero
    /// group, which the canonical form folds into `::`.
    pub fn cidr6(&self) -> String {
        format!("{}/64", self.host6(0))
    }

    pub fn host6(&self, last: u16) -> String {
        std::net::Ipv6Addr::new(
            0xfd5a,
            self.second.into(),
            self.third.into(),
            0,
            0,
            0,
            0,
            last,
        )
        .to_string()
    }

    /// The address of this subnet (or its IPv6 twin) with `address`'s host part: its last
    /// octet, or its last group for IPv6.
    fn moved(&self, address: &str) -> String {
        match address.rsplit_once(':') {
            Some((_, last)) => self
                .host6(u16::from_str_radix(last, 16).unwrap_or_else(|e| panic!("{address}: {e}"))),
            None => self.host(
                address
                    .rsplit('.')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap_or_else(|e| panic!("{address}: {e}")),
            ),
        }
    }

    /// Moves a host-local IPAM section into this subnet: each range's subnet becomes the /24
    /// (the /64 for IPv6); its rangeStart, rangeEnd and gateway, and each route's gw, keep
    /// their host part.
    pub fn take_over_ipam(&self, ipam: &mut Value) {
        for range in ipam["ranges"]
            .as_array_mut()
            .expect("ipam ranges")
            .iter_mut()
            .flat_map(|set| set.as_array_mut().unwrap())
        {
            let v6 = range["subnet"].as_str().unwrap().contains(':');
            range["subnet"] = json!(if v6 { self.cidr6() } else { self.cidr() });
            for key in ["rangeStart", "rangeEnd", "gateway"] {
                if let Some(address) = range[key].as_str() {
                    range[key] = json!(self.moved(address));
                }
            }
        }
        for route in ipam["routes"].as_array_mut().into_iter().flatten() {
            if let Some(gw) = route["gw"].as_str() {
                route["gw"] = json!(self.moved(gw));
            }
        }
    }

    /// Narrows every range of a host-local IPAM section to one address, the one with host
    /// part `last`: every ADD of the network gets the same address, so two ADDs' results
    /// can be compared whole.
    pub fn pin_one_address(&self, ipam: &mut Value, last: u8) {
        for range in ipam["ranges"]
            .as_array_mut()
            .expect("ipam ranges")
            .iter_mut()
            .flat_map(|set| set.as_array_mut().unwrap())
        {
            let address = if range["subnet"].as_str().unwrap().contains(':') {
                self.host6(last.into())
            } else {
                self.host(last)
            };
            range["rangeStart"] = json!(address);
            range["rangeEnd"] = json!(address);
        }
    }
}

/// A pod sandbox as kubelet describes it to the runtime: its own netns and container id,
/// and the pod identity containerd passes in CNI_ARGS.
pub struct Sandbox {
    pub container_id: String,
    pub netns: Netns,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// The pod interface's MAC, asked of the primary in `CNI_ARGS` (`MAC=`, which bridge and
    /// macvlan read): two ADDs of the sandbox then give the same interface.
    pub mac: Option<String>,
    /// CNI_IFNAME: `IFNAME` unless a test attaches the sandbox under another name (multus's
    /// `net1`, `net2`).
    pub ifname: String,
}

impl Sandbox {
    pub fn new(namespace: &str, pod: &str, uid: &str) -> Sandbox {
        Sandbox {
            container_id: format!("{}{}", sys::unique("sbx"), sys::unique("")),
            netns: Netns::new("sgpod"),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            uid: uid.to_string(),
            mac: None,
            ifname: IFNAME.to_string(),
        }
    }

    pub fn with_ifname(mut self, ifname: &str) -> Sandbox {
        self.ifname = ifname.to_string();
        self
    }

    pub fn with_mac(mut self, mac: &str) -> Sandbox {
        self.mac = Some(mac.to_string());
        self
    }

    pub fn netns_path(&self) -> String {
        self.netns.path().to_string_lossy().into_owned()
    }

    /// CNI_ARGS as containerd sends them (libcni-driver keeps one IgnoreUnknown=1).
    fn cni_args(&self) -> String {
        let values = [
            ("namespace", self.namespace.as_str()),
            ("name", &self.pod),
            ("uid", &self.uid),
            ("container", &self.container_id),
        ];
        let args = testdata::cni_args("containerd", &values);
        match &self.mac {
            Some(mac) => format!("{args};MAC={mac}"),
            None => args,
        }
    }

    /// Pings from inside this sandbox; a few tries, because the first packets may race ARP
    /// and the bridge port coming up.
    pub fn can_ping(&self, ip: &str) -> bool {
        (0..3).any(|_| self.netns.try_exec(&["ping", "-c", "1", "-W", "2", ip]))
    }
}

/// How a libcni operation failed: the plugin's CNI error code when one reached libcni, and
/// everything the driver printed.
#[derive(Debug)]
pub struct CniFailure {
    pub code: Option<u32>,
    pub stderr: String,
}

/// The CNI_NETNS an operation carries: ADD, CHECK and StopPodSandbox's DEL pass the
/// sandbox's; containerd's RemovePodSandbox repeats the DEL with none.
#[derive(Clone, Copy)]
pub enum NetnsArg {
    Sandbox,
    Empty,
}

/// How the guard sits in a conflist: `Chained` last after the primary, or `Delegate` in the
/// primary's place with the primary's entry under its `delegate` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Chained,
    Delegate,
}

/// The guard's entry of a conflist, wherever it sits.
pub fn guard_entry(conf: &mut Value) -> &mut Value {
    conf["plugins"]
        .as_array_mut()
        .expect("plugins")
        .iter_mut()
        .find(|p| p["type"] == "sandbox-guard")
        .expect("a sandbox-guard entry")
}

/// How a conflist places the guard, checked against the contract: last when chained, in the
/// primary's place (first) when it wraps the primary.
pub fn mode_of(conf: &Value, file: &str) -> Mode {
    let plugins = conf["plugins"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no plugins"));
    match plugins.iter().position(|p| p["type"] == "sandbox-guard") {
        Some(0) if plugins[0].get("delegate").is_some() => Mode::Delegate,
        Some(at) if at + 1 == plugins.len() && plugins[at].get("delegate").is_none() => {
            Mode::Chained
        }
        _ => panic!("{file}: sandbox-guard must be last, or first with a delegate"),
    }
}

/// The primary's entry: the first plugin when chained, the guard's `delegate` when wrapped.
pub fn primary_entry(conf: &mut Value, mode: Mode) -> &mut Value {
    match mode {
        Mode::Chained => &mut conf["plugins"][0],
        Mode::Delegate => &mut guard_entry(conf)["delegate"],
    }
}

/// One network's world: its conflists (rewritten from conf-examples/ or testdata/), plugin
/// dir, libcni cache, guard state and log, host-local store, all private to this test and
/// removed on drop.
pub struct Network {
    pub name: String,
    pub subnet: Subnet,
    pub conflist: PathBuf,
    /// The same network with the guard wrapping the primary, for a network built from a
    /// chained conflist and its delegate twin (`from_testdata`).
    pub delegate_conflist: Option<PathBuf>,
    /// The same network with the guard left out, to compare the guarded chain with its primary.
    pub primary_only_conflist: PathBuf,
    pub cache_dir: PathBuf,
    pub state_dir: PathBuf,
    pub log_file: PathBuf,
    pub ipam_dir: PathBuf,
    pub bin_dir: PathBuf,
    /// The libcni the operations go through: Debian's 1.1 unless `through` says otherwise.
    driver: Option<&'static Path>,
    // Declared before `dir`: links go first, then the files that describe them.
    _links: Vec<HostLink>,
    dir: TempDir,
}

impl Network {
    /// Loads `conf-examples/<example>`, makes every host-global name private to this run and
    /// lets `rewrite_primary` point the primary plugin at this test's links.
    pub fn from_example(
        example: &str,
        links: Vec<HostLink>,
        rewrite_primary: impl Fn(&mut Value, &Subnet),
    ) -> Network {
        let text = std::fs::read_to_string(Path::new(REPO).join("conf-examples").join(example))
            .unwrap_or_else(|e| panic!("read conf-examples/{example}: {e}"));
        let conf: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(mode_of(&conf, example), Mode::Chained, "{example}");
        Network::build(&[(example.to_string(), conf)], links, |primary, subnet| {
            primary["ipam"]["ranges"] = json!([[{ "subnet": subnet.cidr() }]]);
            if let Some(routes) = primary["ipam"]["routes"].as_array_mut() {
                for route in routes.iter_mut().filter(|r| r.get("gw").is_some()) {
                    route["gw"] = json!(subnet.host(1));
                }
            }
            rewrite_primary(primary, subnet);
        })
    }

    /// `testdata/conflists/<file>` (chained) and `testdata/conflists/delegate/<file>` (its
    /// delegate twin) as one network: one name, one host-local store, one guard state dir and
    /// one libcni cache, so that an attachment made through either conflist is the same
    /// attachment. Each address of the primary's IPAM (subnets, ranges, gateways) moves into
    /// this test's subnet with its host part kept; `rewrite_primary` then points the primary
    /// at this test's links.
    pub fn from_testdata(
        file: &str,
        links: Vec<HostLink>,
        rewrite_primary: impl Fn(&mut Value, &Subnet),
    ) -> Network {
        let chained = testdata::fixture_json(&format!("conflists/{file}"));
        let delegate = testdata::fixture_json(&format!("conflists/delegate/{file}"));
        assert_eq!(mode_of(&chained, file), Mode::Chained, "conflists/{file}");
        assert_eq!(
            mode_of(&delegate, file),
            Mode::Delegate,
            "conflists/delegate/{file}"
        );
        let files = [
            (file.to_string(), chained),
            (format!("delegate-{file}"), delegate),
        ];
        let mut net = Network::build(&files, links, |primary, subnet| {
            subnet.take_over_ipam(&mut primary["ipam"]);
            rewrite_primary(primary, subnet);
        });
        net.delegate_conflist = Some(net.dir.path.join(&files[1].0));
        net
    }

    /// Writes each of `confs` (a file name and its conflist, all of one network) into this
    /// network's dir, private to this run: the name, the guard's state dir and log, the
    /// primary's host-local store and whatever `place_primary` changes; links every plugin
    /// any of them runs into one plugin dir. The first is `conflist`.
    fn build(
        confs: &[(String, Value)],
        links: Vec<HostLink>,
        place_primary: impl Fn(&mut Value, &Subnet),
    ) -> Network {
        let dir = TempDir::new("sglcn");
        let name = sys::unique("sgnet");
        let subnet = Subnet::unique();
        let (cache_dir, state_dir, ipam_dir, bin_dir) = (
            dir.path.join("cache"),
            dir.path.join("state"),
            dir.path.join("ipam"),
            dir.path.join("bin"),
        );
        // The guard must not append to the node's real log from a test.
        let log_file = dir.path.join("guard.log");
        std::fs::create_dir_all(&bin_dir).unwrap();

        let mut primary_only = None;
        for (file, conf) in confs {
            let mut conf = conf.clone();
            let mode = mode_of(&conf, file);
            conf["name"] = json!(name);
            let guard = guard_entry(&mut conf);
            guard["stateDir"] = json!(state_dir);
            guard["logFile"] = json!(log_file);
            let primary = primary_entry(&mut conf, mode);
            primary["ipam"]["dataDir"] = json!(ipam_dir);
            place_primary(primary, &subnet);
            let primary = primary.clone();

            for plugin in conf["plugins"].as_array().unwrap().iter().chain([&primary]) {
                let kind = plugin["type"].as_str().unwrap();
                for needed in [kind, plugin["ipam"]["type"].as_str().unwrap_or(kind)] {
                    // A model primary of tests/cri (`<type>-plugin`) where no real one can run.
                    let model = Path::new(REPO)
                        .join("tests/cri")
                        .join(format!("{needed}-plugin"));
                    let target = if needed == "sandbox-guard" {
                        PathBuf::from(cni::bin())
                    } else if model.exists() {
                        model
                    } else {
                        Path::new(REFERENCE_PLUGINS).join(needed)
                    };
                    let link = bin_dir.join(needed);
                    if link.symlink_metadata().is_err() {
                        std::os::unix::fs::symlink(&target, &link).unwrap();
                    }
                }
            }
            std::fs::write(
                dir.path.join(file),
                serde_json::to_vec_pretty(&conf).unwrap(),
            )
            .unwrap();
            primary_only.get_or_insert_with(|| {
                let mut alone = conf.clone();
                alone["plugins"] = json!([primary]);
                alone
            });
        }
        let primary_only_conflist = dir.path.join(format!("primary-only-{}", confs[0].0));
        std::fs::write(
            &primary_only_conflist,
            serde_json::to_vec_pretty(&primary_only.unwrap()).unwrap(),
        )
        .unwrap();

        Network {
            name,
            subnet,
            conflist: dir.path.join(&confs[0].0),
            delegate_conflist: None,
            primary_only_conflist,
            cache_dir,
            state_dir,
            log_file,
            ipam_dir,
            bin_dir,
            driver: None,
            _links: links,
            dir,
        }
    }

    /// This network at another CNI version: every conflist of it (guarded, delegate twin,
    /// primary alone) rewritten with `cniVersion` set to `version`.
    pub fn at_version(self, version: &str) -> Network {
        let files = [
            Some(&self.conflist),
            self.delegate_conflist.as_ref(),
            Some(&self.primary_only_conflist),
        ];
        for file in files.into_iter().flatten() {
            let mut conf: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
            conf["cniVersion"] = json!(version);
            std::fs::write(file, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
        }
        self
    }

    /// This network with its operations run through `driver` (e.g. `driver_1_3()`).
    pub fn through(mut self, driver: &'static Path) -> Network {
        self.driver = Some(driver);
        self
    }

    /// The directory the conflist lies in: the runtime's conf dir.
    pub fn conf_dir(&self) -> &Path {
        &self.dir.path
    }

    /// The conflist of `mode`: the guard chained last, or wrapping the primary.
    pub fn conflist_of(&self, mode: Mode) -> &Path {
        match mode {
            Mode::Chained => &self.conflist,
            Mode::Delegate => self
                .delegate_conflist
                .as_deref()
                .expect("a network built from a conflist and its delegate twin"),
        }
    }

    pub fn add(&self, sandbox: &Sandbox) -> Result<Value, CniFailure> {
        self.add_with(&self.conflist, sandbox)
    }

    /// ADD through a given conflist of this network (the guarded one or the primary alone).
    pub fn add_with(&self, conflist: &Path, sandbox: &Sandbox) -> Result<Value, CniFailure> {
        let stdout = self.libcni(conflist, "add", sandbox, NetnsArg::Sandbox)?;
        Ok(serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("libcni ADD printed no result JSON ({e}): {stdout}")))
    }

    pub fn check(&self, sandbox: &Sandbox) -> Result<(), CniFailure> {
        self.check_with(&self.conflist, sandbox)
    }

    pub fn check_with(&self, conflist: &Path, sandbox: &Sandbox) -> Result<(), CniFailure> {
        self.libcni(conflist, "check", sandbox, NetnsArg::Sandbox)
            .map(drop)
    }

    pub fn del(&self, sandbox: &Sandbox, netns: NetnsArg) -> Result<(), CniFailure> {
        self.del_with(&self.conflist, sandbox, netns)
    }

    pub fn del_with(
        &self,
        conflist: &Path,
        sandbox: &Sandbox,
        netns: NetnsArg,
    ) -> Result<(), CniFailure> {
        self.libcni(conflist, "del", sandbox, netns).map(drop)
    }

    /// ADD through another libcni than this network's (`driver()` or `driver_1_3()`).
    pub fn add_through(
        &self,
        driver: &'static Path,
        sandbox: &Sandbox,
    ) -> Result<Value, CniFailure> {
        let stdout = self.libcni_of(driver, &self.conflist, "add", sandbox, NetnsArg::Sandbox)?;
        Ok(serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("libcni ADD printed no result JSON ({e}): {stdout}")))
    }

    fn libcni(
        &self,
        conflist: &Path,
        verb: &str,
        sandbox: &Sandbox,
        netns: NetnsArg,
    ) -> Result<String, CniFailure> {
        self.libcni_of(
            self.driver.unwrap_or_else(driver),
            conflist,
            verb,
            sandbox,
            netns,
        )
    }

    fn libcni_of(
        &self,
        driver: &Path,
        conflist: &Path,
        verb: &str,
        sandbox: &Sandbox,
        netns: NetnsArg,
    ) -> Result<String, CniFailure> {
        let netns = match netns {
            NetnsArg::Sandbox => sandbox.netns_path(),
            NetnsArg::Empty => String::new(),
        };
        let bin_dir = self.bin_dir.to_str().unwrap();
        let cache_dir = self.cache_dir.to_str().unwrap();
        let cni_args = sandbox.cni_args();
        let out = Command::new(driver)
            .args(["-conflist", conflist.to_str().unwrap(), "-bin-dir", bin_dir])
            .args([
                "-cache-dir",
                cache_dir,
                "-container-id",
                &sandbox.container_id,
            ])
            .args([
                "-netns",
                &netns,
                "-ifname",
                &sandbox.ifname,
                "-args",
                &cni_args,
                verb,
            ])
            .output()
            .expect("run libcni-driver");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let code = stderr
            .lines()
            .find_map(|line| line.strip_prefix("CNI error code "))
            .and_then(|rest| rest.split(':').next())
            .and_then(|code| code.parse().ok());
        Err(CniFailure { code, stderr })
    }

    /// libcni's cached result for the sandbox (what containerd hands back on CHECK and DEL).
    pub fn cached_result(&self, sandbox: &Sandbox) -> Option<Value> {
        let file = self.cache_dir.join("results").join(format!(
            "{}-{}-{}",
            self.name, sandbox.container_id, sandbox.ifname
        ));
        let text = std::fs::read_to_string(file).ok()?;
        let cached: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(cached["kind"], "cniCacheV1");
        Some(cached["result"].clone())
    }

    /// The guard's checkpoints for this network, as `--dump-checkpoints --output json` shows them.
    pub fn checkpoints(&self) -> Vec<Value> {
        let all = cni::dump_checkpoints(&self.state_dir, &[]);
        all.into_iter()
            .filter(|r| r["network"] == json!(self.name))
            .collect()
    }

    pub fn checkpoint(&self, sandbox: &Sandbox) -> Option<Value> {
        self.checkpoints()
            .into_iter()
            .find(|r| r["containerId"] == json!(sandbox.container_id))
    }

    /// The record file the contract's state layout names for this sandbox.
    pub fn record_file(&self, sandbox: &Sandbox) -> PathBuf {
        self.state_dir.join("records").join(format!(
            "{}:{}:{}",
            self.name, sandbox.container_id, sandbox.ifname
        ))
    }

    /// The addresses host-local holds for this network (its bookkeeping files aside).
    pub fn ipam_allocations(&self) -> Vec<String> {
        cni::files_in(&self.ipam_dir.join(&self.name))
            .iter()
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|name| name != "lock" && !name.starts_with("last_reserved_ip."))
            .collect()
    }

    /// The file names of libcni's result cache.
    pub fn cached_results(&self) -> Vec<String> {
        cni::files_in(&self.cache_dir.join("results"))
            .iter()
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    /// The files in the guard's `records/` and `owners/`.
    pub fn guard_files(&self) -> Vec<PathBuf> {
        let [records, owners] =
            ["records", "owners"].map(|dir| cni::files_in(&self.state_dir.join(dir)));
        records.into_iter().chain(owners).collect()
    }

    /// Waits (at most a minute and a half) until no replay worker of the guard runs: the
    /// owner's DEL answers before a replay that outlasts its short wait.
    pub fn wait_for_replays(&self) {
        let store = cni::Store::with_state_dir(self.state_dir.clone(), &self.state_dir);
        assert!(
            store.wait_for_replays(std::time::Duration::from_secs(90)),
            "the replay worker still runs"
        );
    }

    /// The guard's log, one parsed line per operation.
    pub fn log_lines(&self) -> Vec<cni::LogLine> {
        let text = std::fs::read_to_string(&self.log_file).unwrap_or_default();
        text.lines().map(cni::LogLine::parse).collect()
    }

    /// The container host-local has reserved `ip` (without prefix length) for, if any.
    pub fn ip_holder(&self, ip: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.ipam_dir.join(&self.name).join(ip)).ok()?;
        text.lines().next().map(|id| id.trim().to_string())
    }
}

/// Where a network's conflists come from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// conf-examples/, the operator's conflist (chained), its ranges widened to the subnet.
    Example,
    /// testdata/conflists/ and its delegate twin, ranges kept; `pin`: each range narrowed
    /// to the address with that host part (see `Subnet::pin_one_address`).
    Testdata { pin: Option<u8> },
}

impl Network {
    fn from_source(
        source: Source,
        example: &str,
        testdata: &str,
        links: Vec<HostLink>,
        rewrite_primary: impl Fn(&mut Value, &Subnet),
    ) -> Network {
        match source {
            Source::Example => Network::from_example(example, links, rewrite_primary),
            Source::Testdata { pin } => {
                Network::from_testdata(testdata, links, |primary, subnet| {
                    rewrite_primary(primary, subnet);
                    if let Some(last) = pin {
                        subnet.pin_one_address(&mut primary["ipam"], last);
                    }
                })
            }
        }
    }
}

/// calico v2's `.conf` as its manifests install it (testdata/conflists/calico-v2/, at
/// cniVersion 0.1.0) run by the calico v2 model (tests/cri/calico-v2-model-plugin, put in the
/// plugin dir as `calico`): `conflist` is the `.conf` as a list with the guard chained last,
/// `delegate_conflist` the guard wrapping the `.conf`'s plugin. The model keeps its addresses
/// (`ips/`), workload endpoints (`endpoints/`) and trace (`calls.log`) in `ipam_dir`.
pub fn calico_v2_network() -> Network {
    let conf = testdata::fixture_json("conflists/calico-v2/10-calico.conf");
    let mut primary = conf.clone();
    for key in ["name", "cniVersion"] {
        primary.as_object_mut().unwrap().remove(key);
    }
    let list = |plugins: Value| json!({"name": conf["name"], "cniVersion": conf["cniVersion"], "plugins": plugins});
    let files = [
        (
            "10-calico.conflist".to_string(),
            list(json!([primary, {"type": "sandbox-guard"}])),
        ),
        (
            "delegate-10-calico.conflist".to_string(),
            list(json!([{"type": "sandbox-guard", "delegate": primary}])),
        ),
    ];
    // calico names a pod's host veth from its pod name alone and deletes a link of that name
    // at ADD: tests that run the same pod name side by side need host veths of their own.
    let veth_prefix = sys::unique("c");
    let mut net = Network::build(&files, Vec::new(), |primary, subnet| {
        primary["stateDir"] = primary["ipam"]["dataDir"].clone();
        primary["subnet"] = json!(subnet.cidr());
        primary["hostVethPrefix"] = json!(veth_prefix);
    });
    let calico = net.bin_dir.join("calico");
    std::fs::remove_file(&calico).unwrap();
    std::os::unix::fs::symlink(
        Path::new(REPO).join("tests/cri/calico-v2-model-plugin"),
        &calico,
    )
    .unwrap();
    net.delegate_conflist = Some(net.dir.path.join(&files[1].0));
    net
}

/// conf-examples' bridge network on a bridge of its own.
/// A network whose primary is the model of calico up to 2.1 with etcd (tests/cri/calico-cni-v1-model-plugin,
/// which says in what it behaves as calico): IPAM handle, endpoint and host veth keyed by
/// `namespace.podname`. `conflist` chains the guard last; `delegate_conflist` has it wrap the
/// model. One model state dir for both, inside the network's dir.
pub fn podname_keyed_network() -> Network {
    let primary = json!({"type": "calico-cni-v1-model", "onMissingEndpoint": "ignore"});
    let chained = json!({"cniVersion": "1.0.0", "name": "-", "plugins": [primary, {"type": "sandbox-guard", "staleDel": "refuse"}]});
    let delegate = json!({"cniVersion": "1.0.0", "name": "-", "plugins": [{"type": "sandbox-guard", "delegate": primary}]});
    let files = [
        ("calico-cni-v1-model.conflist".to_string(), chained),
        (
            "delegate-calico-cni-v1-model.conflist".to_string(),
            delegate,
        ),
    ];
    let mut net = Network::build(&files, Vec::new(), |primary, subnet| {
        let data_dir = primary["ipam"]["dataDir"].as_str().unwrap().to_string();
        primary.as_object_mut().unwrap().remove("ipam");
        primary["stateDir"] = json!(format!("{data_dir}/model"));
        primary["subnet"] = json!(subnet.cidr());
    });
    net.delegate_conflist = Some(net.dir.path.join(&files[1].0));
    net
}

pub fn bridge_network() -> Network {
    bridge_network_from(Source::Example)
}

/// The bridge network of `source` on a bridge of its own.
pub fn bridge_network_from(source: Source) -> Network {
    let bridge = sys::unique("sgbr");
    let bridge_link = HostLink {
        name: bridge.clone(),
    };
    let conflists = ("30-bridge-guarded.conflist", "bridge-host-local.conflist");
    Network::from_source(
        source,
        conflists.0,
        conflists.1,
        vec![bridge_link],
        |primary, _| {
            primary["bridge"] = json!(bridge);
            // Masquerading adds host-wide iptables rules, which a crashed test would leave behind;
            // it plays no part in what the guard decides.
            primary["ipMasq"] = json!(false);
        },
    )
}

/// conf-examples' macvlan network on the master of a LAN of its own, plugged in with the
/// router at .1 of the network's subnet. The Network owns the master's cleanup; by name, so
/// a re-created master goes too.
pub fn macvlan_network_on_a_lan() -> (Lan, Network) {
    macvlan_network_from(Source::Example)
}

/// The macvlan network of `source` on a LAN of its own (see `macvlan_network_on_a_lan`).
pub fn macvlan_network_from(source: Source) -> (Lan, Network) {
    macvlan_network_of(source, Stack::V4)
}

/// The macvlan network dual-stack, as host-local serves it: a v4 range (the /24) and a v6
/// range (its /64 twin), a default route for each family through the router (.1 and ::1).
/// The router has both addresses (`Lan::plug_dual`).
pub fn dual_stack_macvlan_network_on_a_lan() -> (Lan, Network) {
    dual_stack_macvlan_network_from(Source::Example)
}

/// The macvlan network of `source` made dual-stack (see `dual_stack_macvlan_network_on_a_lan`).
pub fn dual_stack_macvlan_network_from(source: Source) -> (Lan, Network) {
    macvlan_network_of(source, Stack::Dual)
}

/// The macvlan network with its v6 range only (the /64 twin), a default route through the
/// router's ::1; the router has both addresses all the same.
#[allow(dead_code)]
pub fn ipv6_only_macvlan_network_on_a_lan() -> (Lan, Network) {
    macvlan_network_of(Source::Example, Stack::V6)
}

#[derive(Clone, Copy, PartialEq)]
enum Stack {
    V4,
    Dual,
    V6,
}

fn macvlan_network_of(source: Source, stack: Stack) -> (Lan, Network) {
    let lan = Lan::new();
    let conflists = ("20-macvlan-guarded.conflist", "macvlan-host-local.conflist");
    let net = Network::from_source(
        source,
        conflists.0,
        conflists.1,
        vec![HostLink {
            name: lan.master.clone(),
        }],
        |primary, subnet| {
            primary["master"] = json!(lan.master);
            match stack {
                Stack::V4 => {}
                Stack::Dual => {
                    primary["ipam"]["ranges"] =
                        json!([[{ "subnet": subnet.cidr() }], [{ "subnet": subnet.cidr6() }]]);
                    primary["ipam"]["routes"] = json!([{ "dst": "0.0.0.0/0", "gw": subnet.host(1) }, { "dst": "::/0", "gw": subnet.host6(1) }]);
                }
                Stack::V6 => {
                    primary["ipam"]["ranges"] = json!([[{ "subnet": subnet.cidr6() }]]);
                    primary["ipam"]["routes"] = json!([{ "dst": "::/0", "gw": subnet.host6(1) }]);
                }
            }
        },
    );
    if stack != Stack::V4 {
        lan.plug_dual(&net.subnet);
    } else {
        lan.plug(&format!("{}/24", net.subnet.host(1)));
    }
    (lan, net)
}

/// The node's NIC stand-in and the LAN behind it: `master` in the host, its peer in `lan`
/// as the LAN's router at .1 (the gateway conf-examples routes through).
pub struct Lan {
    pub netns: Netns,
    pub master: String,
    pub uplink: String,
}

impl Lan {
    pub fn new() -> Lan {
        let netns = Netns::new("sglan");
        // A gratuitous ARP creates a neighbour entry only where arp_accept is on: that is how
        // the test sees the restore's announcement arrive.
        netns.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.all.arp_accept=1"]);
        Lan {
            netns,
            master: sys::unique("sgmv"),
            uplink: sys::unique("sgup"),
        }
    }

    /// Creates the master and the router end; what a driver (re)load does for a real NIC.
    pub fn plug(&self, router_cidr: &str) {
        sys::run(
            "ip",
            &[
                "link",
                "add",
                &self.master,
                "type",
                "veth",
                "peer",
                "name",
                &self.uplink,
            ],
        );
        sys::run(
            "ip",
            &["link", "set", &self.uplink, "netns", &self.netns.name],
        );
        sys::run("ip", &["link", "set", &self.master, "up"]);
        self.netns
            .exec(&["ip", "addr", "add", router_cidr, "dev", &self.uplink]);
        self.netns.exec(&["ip", "link", "set", &self.uplink, "up"]);
    }

    /// `plug` with the router at .1 of `subnet` and at ::1 of its /64 twin; the router's
    /// IPv6 address without duplicate address detection, so it answers at once.
    pub fn plug_dual(&self, subnet: &Subnet) {
        self.plug(&format!("{}/24", subnet.host(1)));
        self.netns.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{}/64", subnet.host6(1)),
            "dev",
            &self.uplink,
            "nodad",
        ]);
    }

    /// The driver unload: the master goes, and with it every macvlan on it.
    pub fn unplug(&self) {
        sys::run("ip", &["link", "delete", &self.master]);
    }

    pub fn neighbour_mac(&self, ip: &str) -> Option<String> {
        let out = self.netns.exec(&["ip", "-j", "neigh", "show", ip]);
        let entries: Value = serde_json::from_slice(&out.stdout).ok()?;
        entries
            .as_array()?
            .iter()
            .find_map(|e| e["lladdr"].as_str().map(str::to_string))
    }
}

/// Addresses of a result without prefix length, e.g. ["10.200.3.2"].
pub fn result_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .map(|ip| ip["address"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn bare_ip(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

/// The JSON structure with the per-attachment values (names, MACs, addresses) blanked out:
/// two ADDs of the same network must agree on it whatever they were allocated.
pub fn shape(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::String(_) => json!("<string>"),
        Value::Number(_) => json!("<number>"),
        other => other.clone(),
    }
}

fn ip_json(netns: Option<&Netns>, args: &[&str]) -> Value {
    let mut cmd = vec!["-j"];
    cmd.extend_from_slice(args);
    let out = match netns {
        Some(ns) => {
            let mut full = vec!["ip"];
            full.extend_from_slice(&cmd);
            ns.exec(&full)
        }
        None => sys::run("ip", &cmd),
    };
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Asserts that every interface and address a result claims is what the kernel holds: a
/// result that merely looks right (e.g. replayed from a stale checkpoint) fails here.
pub fn assert_result_matches_kernel(result: &Value, sandbox: &Sandbox) {
    let interfaces = result["interfaces"].as_array().expect("result interfaces");
    let pod_addrs = ip_json(Some(&sandbox.netns), &["addr", "show"]);
    let host_links = ip_json(None, &["link", "show"]);
    for iface in interfaces {
        let name = iface["name"].as_str().unwrap();
        let mac = iface["mac"].as_str().unwrap();
        let links = match iface.get("sandbox").and_then(Value::as_str) {
            Some(netns) => {
                assert_eq!(
                    netns,
                    sandbox.netns_path(),
                    "interface {name} claims another netns"
                );
                &pod_addrs
            }
            None => &host_links,
        };
        let link = links
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifname"] == json!(name))
            .unwrap_or_else(|| panic!("result interface {name} does not exist"));
        assert_eq!(link["address"], json!(mac), "MAC of {name}");
    }
    for ip in result["ips"].as_array().expect("result ips") {
        let index = ip["interface"].as_u64().expect("ip names its interface") as usize;
        let iface = &interfaces[index];
        assert!(
            iface.get("sandbox").is_some(),
            "pod IP on a host interface: {ip}"
        );
        let (addr, prefix) = ip["address"].as_str().unwrap().split_once('/').unwrap();
        let link = pod_addrs
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifname"] == iface["name"])
            .unwrap();
        let configured = link["addr_info"].as_array().unwrap().iter().any(|a| {
            a["local"] == json!(addr)
                && a["prefixlen"].as_u64().map(|p| p.to_string()) == Some(prefix.to_string())
        });
        assert!(
            configured,
            "{addr}/{prefix} not configured on {} in the pod",
            iface["name"]
        );
    }
}

/// Nothing of any attachment is left: no address in host-local, no libcni cache, no record,
/// owner or deferred DEL of the guard.
pub fn assert_network_empty(net: &Network) {
    assert_eq!(
        net.ipam_allocations(),
        Vec::<String>::new(),
        "host-local allocations left"
    );
    assert_eq!(
        net.cached_results(),
        Vec::<String>::new(),
        "libcni cache entries left"
    );
    assert_eq!(
        net.guard_files(),
        Vec::<PathBuf>::new(),
        "guard records or owners left"
    );
    assert_eq!(
        net.checkpoints(),
        Vec::<Value>::new(),
        "the dump still lists something"
    );
}

/// The host ends of a result's veth pairs (bridge's `veth<random>`); the bridge itself is shared.
pub fn host_veths(result: &Value) -> Vec<String> {
    let interfaces = result["interfaces"].as_array().into_iter().flatten();
    interfaces
        .filter(|i| i.get("sandbox").is_none())
        .filter_map(|i| {
            i["name"]
                .as_str()
                .filter(|name| name.starts_with("veth"))
                .map(str::to_string)
        })
        .collect()
}

/// Whether the sandbox's netns still has `ifname` (a DEL that reached the primary removes it).
pub fn pod_has_link(sandbox: &Sandbox, ifname: &str) -> bool {
    sandbox.netns.try_exec(&["ip", "link", "show", ifname])
}
