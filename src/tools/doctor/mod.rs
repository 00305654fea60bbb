//! `--doctor`: reads a node for the CNI failure classes that each cost someone hours (the
//! seeds), before they bite. Every finding says how bad it is, what was read and what to do;
//! the exit status is 1 when any finding is an error, so monitoring can run it.
//!
//! It only reads: the conflists, sysfs, the routing table, /proc, the plugin's log files and
//! the stores (listed under their shared lock, like the dump). It creates, chmods and locks
//! nothing, and what it reports it leaves as it found it.

mod conflists;
mod finding;
mod host;
mod primary_need;
mod primary_versions;
mod sandboxes;
mod stale_dels;
mod store_health;

use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;

use crate::kernel::netns::NetnsUsers;
use crate::tools::dump::Format;
use crate::tools::install;
use finding::{Finding, Report, Severity};

pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";

pub struct Options {
    pub conf_dir: PathBuf,
    /// Overrides the stateDirs the conflists name.
    pub state_dir: Option<PathBuf>,
    /// Overrides the logFiles the conflists name.
    pub log_file: Option<PathBuf>,
    pub service_cidrs: Vec<IpNetwork>,
    pub format: Format,
    pub lock_timeout: std::time::Duration,
    /// The runtime's socket to ask what it loaded (`none`: do not ask), else the usual ones.
    pub runtime_socket: Option<PathBuf>,
    /// Where the primaries are looked for (`--bin-dir`), else `bin_dirs`'s default.
    pub bin_dir: Option<PathBuf>,
}

/// Returns the exit status: 0 clean or warnings only, 1 when any finding is an error.
pub fn run(options: &Options) -> i32 {
    let mut report = Report::default();
    let node = conflists::read(&options.conf_dir, &mut report);
    runtime_view(options, &mut report);
    let bin_dirs = bin_dirs(options);
    primary_versions::check(&node.guards, &bin_dirs, &mut report);
    primary_need::check(&options.conf_dir, &bin_dirs, &mut report);
    check_api_server(&node.guards, &mut report);
    host::check_lower_links(&node.lower_links, &mut report);
    host::check_service_routes(&options.service_cidrs, &mut report);

    let mut state_dirs: Vec<PathBuf> = match &options.state_dir {
        Some(dir) => vec![dir.clone()],
        None => node.guards.iter().map(|g| g.state_dir.clone()).collect(),
    };
    if state_dirs.is_empty() {
        state_dirs.push(PathBuf::from(crate::cni::config::DEFAULT_STATE_DIR));
    }
    state_dirs.sort();
    state_dirs.dedup();
    let users = NetnsUsers::scan();
    let mut owners = sandboxes::Owners::new();
    // The kubeconfigs this node's networks ask with: a held DEL's sweep may ask with them.
    let mut kubeconfigs: Vec<PathBuf> = node
        .guards
        .iter()
        .filter_map(|g| g.kubeconfig.clone())
        .collect();
    kubeconfigs.sort();
    kubeconfigs.dedup();
    for dir in &state_dirs {
        sandboxes::check(
            dir,
            &users,
            &mut report,
            &mut owners,
            options.lock_timeout,
            &kubeconfigs,
        );
    }

    let mut log_files: Vec<(String, Option<PathBuf>)> = match &options.log_file {
        Some(path) => vec![("-".to_string(), Some(path.clone()))],
        None => node
            .guards
            .iter()
            .map(|g| (g.network.clone(), g.log_file.clone()))
            .collect(),
    };
    // Networks sharing one log file are read once.
    log_files.sort_by(|a, b| a.1.cmp(&b.1));
    log_files.dedup_by(|a, b| a.1.is_some() && a.1 == b.1);
    stale_dels::check_slow_replays(&log_files, &mut report);
    stale_dels::check(
        &state_dirs,
        &log_files,
        &owners,
        options.lock_timeout,
        &mut report,
    );

    let status = report.exit_status();
    let mut out = std::io::stdout().lock();
    match report.write(&mut out, options.format) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("sandbox-guard: cannot write the report: {e}");
            1
        }
        _ => status,
    }
}

/// The pod the `api-server` check asks for: a name no pod has, so that the answer is the
/// API's own "not found", which only credentials allowed to get pods receive.
const PROBE_POD: &str = "kube-system/sandbox-guard-doctor-probe";

/// Each entry's `kubeconfig` (rules 7 and 8): read, and answering a GET of a pod as the plugin
/// makes it, within the plugin's bound.
fn check_api_server(guards: &[conflists::GuardEntry], report: &mut Report) {
    let mut kubeconfigs: Vec<(&PathBuf, &str)> = guards
        .iter()
        .filter_map(|g| Some((g.kubeconfig.as_ref()?, g.network.as_str())))
        .collect();
    kubeconfigs.sort();
    kubeconfigs.dedup_by(|a, b| a.0 == b.0);
    for (kubeconfig, network) in kubeconfigs {
        if let Some(finding) = token_expiry_finding(kubeconfig, network) {
            report.add(finding);
        }
        let started = std::time::Instant::now();
        let answer = crate::tools::api::get_pod(PROBE_POD, kubeconfig);
        let took = started.elapsed();
        let bound = crate::cni::pod_in_api::API_BOUND;
        let finding = match answer {
            Ok(_) if took < bound => Finding::new(
                Severity::Ok,
                "api-server",
                format!(
                    "network {network}: the API server answers with {} in {} ms",
                    kubeconfig.display(),
                    took.as_millis()
                ),
            ),
            Ok(_) => Finding::new(
                Severity::Warning,
                "api-server",
                format!(
                    "network {network}: the API server answered with {} in {} ms, past the plugin's bound of {} ms: the plugin would decide by its local rule alone",
                    kubeconfig.display(),
                    took.as_millis(),
                    bound.as_millis()
                ),
            ),
            Err(why) => Finding::new(
                Severity::Error,
                "api-server",
                format!("network {network}: the API server cannot be asked with {}: {why}", kubeconfig.display()),
            )
            .fix("Until it can, a DEL or ADD the store cannot decide is decided by the local rule alone (logged as outcome=api-unanswered). Give the kubeconfig a token that may get pods, as JSON, owned by root and 0600."),
        };
        report.add(finding);
    }
}

/// The share of its life (in percent) a token has left when it is worth a warning: kubelet
/// renews a projected token once 80% of its life has passed, writing it at its next sync of
/// the volume, and the installer's watch copies it at once: a token this close to its end
/// was not renewed.
/// Without `iat`, an hour.
const TOKEN_WARN_PERCENT_LEFT: u64 = 15;
const TOKEN_WARN_WITHIN: u64 = 3600;

/// The kubeconfig's token expired, or soon will: the installer's watch copies kubelet's
/// rotated token, so an old one means the watch is not running on this node.
fn token_expiry_finding(kubeconfig: &Path, network: &str) -> Option<Finding> {
    let token = crate::tools::api::kubeconfig::load(kubeconfig)
        .ok()?
        .token?;
    let (issued, expires) = crate::tools::api::kubeconfig::token_life(&token)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let fix = "Where the installer wrote it (--api-credentials), its watch copies the token kubelet renews: see that the DaemonSet's pod runs on this node (kubectl -n kube-system get pods -l app.kubernetes.io/name=sandbox-guard -o wide) and read its log; else renew the token in the kubeconfig.";
    if expires <= now {
        return Some(
            Finding::new(
                Severity::Error,
                "api-server",
                format!(
                    "network {network}: the token in {} expired {} s ago: the API server refuses it, and the plugin decides by its local rule alone",
                    kubeconfig.display(),
                    now - expires
                ),
            )
            .fix(fix),
        );
    }
    let warn_within = match issued {
        Some(issued) if issued < expires => (expires - issued) * TOKEN_WARN_PERCENT_LEFT / 100,
        _ => TOKEN_WARN_WITHIN,
    };
    (expires - now < warn_within).then(|| {
        Finding::new(
            Severity::Warning,
            "api-server",
            format!(
                "network {network}: the token in {} expires in {} s: a token the installer copied from kubelet's would have been renewed by now",
                kubeconfig.display(),
                expires - now
            ),
        )
        .fix(fix)
    })
}

/// Where the runtime finds the primaries: `--bin-dir`, else CNI_PATH, else the dirs the
/// runtime says it searches, else containerd's default.
fn bin_dirs(options: &Options) -> Vec<PathBuf> {
    if let Some(dir) = &options.bin_dir {
        return vec![dir.clone()];
    }
    if let Some(path) = std::env::var_os("CNI_PATH").filter(|p| !p.is_empty()) {
        return std::env::split_paths(&path).collect();
    }
    let sockets = install::runtime_sockets(options.runtime_socket.as_deref(), Path::new("/"));
    let asked = match crate::tools::runtime::ask(&sockets) {
        Ok(crate::tools::runtime::Loaded::Containerd { plugin_dirs, .. }) => plugin_dirs,
        Ok(crate::tools::runtime::Loaded::Crio { network, .. }) => network.plugin_dirs,
        Err(_) => Vec::new(),
    };
    if asked.is_empty() {
        vec![PathBuf::from("/opt/cni/bin")]
    } else {
        asked
    }
}

/// What the runtime says it runs, beside what the files say: they differ until it reloads,
/// and where it searches for plugins only it knows.
fn runtime_view(options: &Options, report: &mut Report) {
    let sockets = install::runtime_sockets(options.runtime_socket.as_deref(), Path::new("/"));
    match install::runtime_view(&sockets) {
        None => {}
        Some(Ok(line)) => report.add(Finding::new(Severity::Ok, "cni-runtime", line)),
        Some(Err((problem, fix))) => {
            report.add(Finding::new(Severity::Error, "cni-runtime", problem).fix(fix))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;

    /// A kubeconfig whose token is a JWT issued `issued` and expiring `expires` seconds from now.
    fn kubeconfig_with(dir: &Path, issued: i64, expires: i64) -> PathBuf {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let encode = |json: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        let token = format!(
            "{}.{}.sig",
            encode(r#"{"alg":"RS256"}"#.to_string()),
            encode(format!(
                r#"{{"iat":{},"exp":{}}}"#,
                now + issued,
                now + expires
            ))
        );
        let config = serde_json::json!({
            "clusters": [{"name": "c", "cluster": {"server": "https://10.96.0.1:443"}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        });
        let path = dir.join(format!("kubeconfig-{issued}-{expires}"));
        std::fs::write(&path, config.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    #[test]
    fn an_expired_or_unrenewed_token_is_said_and_a_renewed_one_is_not() {
        let dir = std::env::temp_dir().join(format!("sg-doctor-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let severity = |issued, expires| {
            token_expiry_finding(&kubeconfig_with(&dir, issued, expires), "net").map(|f| f.severity)
        };
        // A day's token: renewed by kubelet after 80% of it, so 10% left was not renewed.
        assert_eq!(severity(-86_400 - 60, -60), Some(Severity::Error));
        assert_eq!(severity(-77_760, 8_640), Some(Severity::Warning));
        assert_eq!(severity(-3_600, 82_800), None);
        // An hour's token at 48 minutes, when kubelet renews it, has 12 minutes left: not yet
        // worth a warning.
        assert_eq!(severity(-2_880, 720), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
