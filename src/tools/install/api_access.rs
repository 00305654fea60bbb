//! The plugin's kubeconfig, written from the DaemonSet's ServiceAccount as calico's installer
//! writes `calico-kubeconfig` and multus's writes `multus.d/multus.kubeconfig`: the API
//! server's address, the cluster's CA and the pod's projected token, in one JSON file, root's
//! and 0600. It lives in a folder of its own in the conf dir (`sandbox-guard.d`), as multus's
//! does: the runtimes' and the installer's own watches of the conf dir do not descend into
//! it, so a renewed token reloads no network and wakes no other installer. kubelet renews
//! the projected token before it expires; every look of the watch copies the current one, so
//! the file changes only when the token or the CA did.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::files::{self, Keep};
use crate::state::held::{HeldWith, VIEW_OFF, held_with_at};

/// The kubeconfig's folder in the conf dir, and its name there.
pub const KUBECONFIG_DIR: &str = "sandbox-guard.d";
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// Where the installer reads the ServiceAccount and the address of the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAccess {
    /// The projected ServiceAccount volume: `token` and `ca.crt`.
    pub service_account_dir: PathBuf,
    /// `--api-server`, else the `kubernetes` Service's address kubelet puts in every pod's
    /// environment (`KUBERNETES_SERVICE_HOST`, `_PORT`), as calico's installer takes it.
    pub server: Option<String>,
}

/// The kubeconfig's path under `conf_dir`.
pub fn kubeconfig_path(conf_dir: &Path) -> PathBuf {
    conf_dir.join(KUBECONFIG_DIR).join(KUBECONFIG_FILE)
}

/// The server from the `kubernetes` Service's environment.
fn server_from_env() -> Result<String, String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").unwrap_or_default();
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_default();
    if host.is_empty() || port.is_empty() {
        return Err(
            "KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is not set: give --api-server https://<host>:<port>"
                .to_string(),
        );
    }
    Ok(match host.contains(':') {
        true => format!("https://[{host}]:{port}"),
        false => format!("https://{host}:{port}"),
    })
}

/// The kubeconfig's bytes from the ServiceAccount volume.
fn render(access: &ApiAccess) -> Result<Vec<u8>, String> {
    let server = match &access.server {
        Some(server) => server.clone(),
        None => server_from_env()?,
    };
    let read = |name: &str| {
        let path = access.service_account_dir.join(name);
        std::fs::read(&path).map_err(|e| {
            format!(
                "cannot read {} ({e}): mount the DaemonSet's projected ServiceAccount token and kube-root-ca.crt there",
                path.display()
            )
        })
    };
    let token = String::from_utf8(read("token")?)
        .map_err(|_| "the ServiceAccount token is not text".to_string())?;
    let token = token.trim();
    if token.is_empty() {
        return Err(format!(
            "{} is empty",
            access.service_account_dir.join("token").display()
        ));
    }
    let ca = read("ca.crt")?;
    let name = "sandbox-guard";
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca),
        }}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    });
    let mut bytes = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes the kubeconfig under `conf_dir` when it is missing or differs from what the
/// ServiceAccount gives now; says what it wrote (`None`: it was current).
pub fn refresh(access: &ApiAccess, conf_dir: &Path) -> Result<Option<String>, String> {
    let bytes = render(access)?;
    let dir = conf_dir.join(KUBECONFIG_DIR);
    // Never through a symlink: this root must not write where a link in the host's conf dir
    // points, and the plugin refuses a kubeconfig read through one.
    match std::fs::symlink_metadata(&dir) {
        // Its mode as this installer makes it, whoever made it before.
        Ok(meta) if meta.is_dir() => {
            if meta.permissions().mode() & 0o7777 != 0o700 {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| format!("cannot make {} 0700: {e}", dir.display()))?;
            }
        }
        Ok(_) => {
            return Err(format!(
                "{} is not a directory: remove it, and the installer makes its own",
                dir.display()
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?,
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    }
    let path = dir.join(KUBECONFIG_FILE);
    // Read only a regular file (a FIFO would block the read); anything else is replaced.
    let current = match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => std::fs::read(&path).ok(),
        _ => None,
    };
    if current.as_deref() == Some(&bytes[..]) {
        return Ok(None);
    }
    files::write_atomic(&path, &bytes, Keep::mode(0o600))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Some(format!(
        "wrote {} from the ServiceAccount in {}",
        path.display(),
        access.service_account_dir.display()
    )))
}

/// The first network file that still names the kubeconfig under `conf_dir` in a `kubeconfig`
/// key, at any depth (multus thin's inlined copy too), or one that cannot be read, which may
/// (the kubeconfig stays until the next look): the files libcni loads from the conf dir, the
/// drop-ins in its network folders, and `also` (the file that holds the guard, which multus
/// thick may read from outside the conf dir). Each path is resolved as the host resolves it
/// (`network::under_host_root`) and compared by inode, so another spelling of the same file
/// counts. Reads only regular files, at most `MAX_NETWORK_FILE` bytes, never blocking.
pub fn named_in(conf_dir: &Path, host_root: &Path, also: &[&Path]) -> Option<PathBuf> {
    let ours = identity(&kubeconfig_path(conf_dir))?;
    let names_ours = |value: &str| {
        super::network::under_host_root(host_root, Path::new(value))
            .is_some_and(|resolved| identity(&resolved) == Some(ours))
    };
    first_naming(conf_dir, host_root, also, &names_ours)
}

/// Whether a network file names the kubeconfig's path while no file is there (so no inode
/// to compare): a `kubeconfig` key whose value is `<conf dir>/sandbox-guard.d/kubeconfig`,
/// its conf dir resolved as the host resolves it; or a file that cannot be read, which may.
pub fn names_path(conf_dir: &Path, host_root: &Path, also: &[&Path]) -> bool {
    let Some(ours) = identity(conf_dir) else {
        return true;
    };
    let names_ours = |value: &str| {
        let value = Path::new(value);
        let ends = value.file_name().is_some_and(|n| n == KUBECONFIG_FILE)
            && value
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == KUBECONFIG_DIR);
        ends && value
            .parent()
            .and_then(Path::parent)
            .and_then(|dir| super::network::under_host_root(host_root, dir))
            .is_some_and(|resolved| identity(&resolved) == Some(ours))
    };
    first_naming(conf_dir, host_root, also, &names_ours).is_some()
}

/// The first network file (`network_files`) with a `kubeconfig` key `names` takes for ours,
/// or one that cannot be read or parsed, which may name it.
fn first_naming(
    conf_dir: &Path,
    host_root: &Path,
    also: &[&Path],
    names: &dyn Fn(&str) -> bool,
) -> Option<PathBuf> {
    network_files(conf_dir, also).into_iter().find(|file| {
        match read_network_file(file, host_root) {
            Some(doc) => names_kubeconfig(&doc, names),
            None => true,
        }
    })
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The files libcni loads from the conf dir, the drop-ins in its network folders, and `also`.
fn network_files(conf_dir: &Path, also: &[&Path]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(conf_dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let dropin = path.join(super::edit::DROPIN_FILE);
            if std::fs::symlink_metadata(&dropin).is_ok() {
                files.push(dropin);
            }
        } else if super::network::is_candidate(&entry.file_name().to_string_lossy()) {
            files.push(path);
        }
    }
    files.extend(also.iter().map(|file| file.to_path_buf()));
    files
}

/// The most a network file is read of: libcni's are a few KiB.
const MAX_NETWORK_FILE: u64 = 1 << 20;

/// A network file's JSON, read as the host would read `file` (its links resolved under
/// `host_root`), or `None` when it is not a regular file, is larger than `MAX_NETWORK_FILE`,
/// or does not read or parse.
fn read_network_file(file: &Path, host_root: &Path) -> Option<serde_json::Value> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let resolved = match file.strip_prefix(host_root) {
        Ok(rest) => super::network::under_host_root(host_root, &Path::new("/").join(rest))?,
        Err(_) => file.to_path_buf(),
    };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(resolved)
        .ok()?;
    let meta = opened.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_NETWORK_FILE {
        return None;
    }
    let mut bytes = Vec::new();
    opened.take(MAX_NETWORK_FILE).read_to_end(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn names_kubeconfig(doc: &serde_json::Value, names_ours: &dyn Fn(&str) -> bool) -> bool {
    match doc {
        serde_json::Value::Object(pairs) => pairs.iter().any(|(key, value)| {
            (key == "kubeconfig" && value.as_str().is_some_and(names_ours))
                || names_kubeconfig(value, names_ours)
        }),
        serde_json::Value::Array(items) => items.iter().any(|v| names_kubeconfig(v, names_ours)),
        _ => false,
    }
}

/// What `turn_off` found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum TurnedOff {
    /// The sign was written; says where.
    Wrote(String),
    /// The plugin already reads the sign there.
    Already,
    /// No kubeconfig, and none was asked for.
    NothingThere,
    /// Its folder or file is not one the sign may be written through (a symlink, a
    /// directory) or cannot be looked at.
    CannotPlace,
}

/// Puts `VIEW_OFF` in place of the kubeconfig under `conf_dir` (its token is bound to a pod
/// that no longer renews it): the sign that lets the DELs held with it go by the local rule.
/// The file stays, so that sign outlives the view. Where no kubeconfig is, the sign is
/// written only when `for_held` (DELs are held with the file: an earlier release removed it
/// on turn-off), its folder made 0700 as `refresh` makes it. Never through a folder or file
/// that is a symlink. Whether the sign is already there is the plugin's own reading of the
/// file (`held_with_at`): a sign it would not trust (another spelling is fine, a file others
/// may write is not) is written again.
pub fn turn_off(conf_dir: &Path, for_held: bool) -> io::Result<TurnedOff> {
    let dir = conf_dir.join(KUBECONFIG_DIR);
    let path = dir.join(KUBECONFIG_FILE);
    if held_with_at(&path) == HeldWith::TurnedOff {
        return Ok(TurnedOff::Already);
    }
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound && for_held => {
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TurnedOff::NothingThere),
        _ => return Ok(TurnedOff::CannotPlace),
    }
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound && for_held => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TurnedOff::NothingThere),
        _ => return Ok(TurnedOff::CannotPlace),
    }
    files::write_atomic(&path, VIEW_OFF.as_bytes(), Keep::mode(0o600))?;
    Ok(TurnedOff::Wrote(format!(
        "wrote {} over the kubeconfig {}: the API server's view is off, and the DELs held with it replay by the local rule",
        VIEW_OFF.trim_end(),
        path.display()
    )))
}

/// Removes the kubeconfig, the temp files of a writer killed while it wrote one, and their
/// folder once empty; says what it removed. A folder that is not one (a symlink) is left.
pub fn remove(conf_dir: &Path) -> io::Result<Vec<String>> {
    let dir = conf_dir.join(KUBECONFIG_DIR);
    let mut removed = Vec::new();
    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Ok(removed);
    }
    let temp_prefix = format!(".{KUBECONFIG_FILE}.");
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours =
            name == KUBECONFIG_FILE || (name.starts_with(&temp_prefix) && name.ends_with(".tmp"));
        if ours && files::remove(&entry.path())? {
            removed.push(format!("removed {}", entry.path().display()));
        }
    }
    match std::fs::remove_dir(&dir) {
        Ok(()) => removed.push(format!("removed {}", dir.display())),
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {}
        Err(e) => return Err(e),
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Dir {
        fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "sg-api-access-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(path.join("sa")).unwrap();
            std::fs::create_dir_all(path.join("conf")).unwrap();
            Dir(path)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn access(dir: &Dir) -> ApiAccess {
        ApiAccess {
            service_account_dir: dir.0.join("sa"),
            server: Some("https://10.96.0.1:443".to_string()),
        }
    }

    #[test]
    fn a_network_file_names_the_kubeconfig_in_any_spelling_the_host_resolves() {
        let dir = Dir::new();
        // The host's root as the DaemonSet mounts it: its conf dir at <root>/etc/cni/net.d.
        let root = dir.0.join("root");
        let conf = root.join("etc/cni/net.d");
        std::fs::create_dir_all(conf.join(KUBECONFIG_DIR)).unwrap();
        std::fs::write(kubeconfig_path(&conf), "{}").unwrap();
        std::os::unix::fs::symlink("cni/net.d", root.join("etc/cni-link")).unwrap();
        // As the host resolves it: an absolute target is under the host's root.
        std::os::unix::fs::symlink("/etc/cni/net.d", root.join("etc/cni-abs")).unwrap();
        let write = |name: &str, text: &str| std::fs::write(conf.join(name), text).unwrap();
        write(
            "10-other.conflist",
            r#"{"name":"o","plugins":[{"type":"bridge"}]}"#,
        );
        assert_eq!(named_in(&conf, &root, &[]), None);
        for (file, spelling) in [
            ("20-a.conflist", "/etc/cni/net.d/sandbox-guard.d/kubeconfig"),
            ("20-a.conflist", "/etc/cni-link/sandbox-guard.d/kubeconfig"),
            ("20-a.conflist", "/etc/cni-abs/sandbox-guard.d/kubeconfig"),
            (
                "20-a.conflist",
                "/etc/cni/net.d/./sandbox-guard.d/kubeconfig",
            ),
        ] {
            write(
                file,
                &format!(r#"{{"plugins":[{{"type":"sandbox-guard","kubeconfig":"{spelling}"}}]}}"#),
            );
            assert_eq!(
                named_in(&conf, &root, &[]),
                Some(conf.join(file)),
                "{spelling}"
            );
        }
        std::fs::remove_file(conf.join("20-a.conflist")).unwrap();
        // multus thin's inlined copy, and a drop-in in a network's folder.
        write(
            "00-multus.conf",
            r#"{"type":"multus","delegates":[{"plugins":[{"type":"sandbox-guard","kubeconfig":"/etc/cni/net.d/sandbox-guard.d/kubeconfig"}]}]}"#,
        );
        assert_eq!(
            named_in(&conf, &root, &[]),
            Some(conf.join("00-multus.conf"))
        );
        std::fs::remove_file(conf.join("00-multus.conf")).unwrap();
        std::fs::create_dir(conf.join("pods")).unwrap();
        let dropin = conf
            .join("pods")
            .join(crate::tools::install::edit::DROPIN_FILE);
        std::fs::write(
            &dropin,
            r#"{"type":"sandbox-guard","kubeconfig":"/etc/cni/net.d/sandbox-guard.d/kubeconfig"}"#,
        )
        .unwrap();
        assert_eq!(named_in(&conf, &root, &[]), Some(dropin.clone()));
        std::fs::remove_file(&dropin).unwrap();
        // A file outside the conf dir (multus thick's), given by the install.
        let outside = dir.0.join("ovn.conflist");
        std::fs::write(
            &outside,
            r#"{"plugins":[{"type":"sandbox-guard","kubeconfig":"/etc/cni/net.d/sandbox-guard.d/kubeconfig"}]}"#,
        )
        .unwrap();
        assert_eq!(named_in(&conf, &root, &[&outside]), Some(outside.clone()));
        // Another file of that name elsewhere, or a relative path, is not it.
        write(
            "30-b.conflist",
            r#"{"plugins":[{"type":"sandbox-guard","kubeconfig":"/etc/kubernetes/kubeconfig"},{"type":"x","kubeconfig":"sandbox-guard.d/kubeconfig"}]}"#,
        );
        assert_eq!(named_in(&conf, &root, &[]), None);
        // A file that cannot be read as a network (cut mid-write, not a regular file) may name
        // it: the kubeconfig stays.
        write(
            "40-half.conflist",
            r#"{"plugins":[{"type":"sandbox-guard","kubecon"#,
        );
        assert_eq!(
            named_in(&conf, &root, &[]),
            Some(conf.join("40-half.conflist"))
        );
        std::fs::remove_file(conf.join("40-half.conflist")).unwrap();
        let fifo = conf.join("50-fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(named_in(&conf, &root, &[]), Some(fifo));
    }

    #[test]
    fn written_0600_rewritten_only_when_the_token_rotates_and_read_back_by_the_plugins_reader() {
        let dir = Dir::new();
        std::fs::write(dir.0.join("sa/token"), "first\n").unwrap();
        std::fs::write(dir.0.join("sa/ca.crt"), "PEM").unwrap();
        let conf = dir.0.join("conf");
        assert!(refresh(&access(&dir), &conf).unwrap().is_some());
        let path = kubeconfig_path(&conf);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(conf.join(KUBECONFIG_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let creds = crate::tools::api::kubeconfig::load(&path).unwrap();
        assert_eq!(creds.server, "https://10.96.0.1:443");
        assert_eq!(creds.token.as_deref(), Some("first"));
        assert_eq!(creds.ca.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(refresh(&access(&dir), &conf).unwrap(), None);
        std::fs::write(dir.0.join("sa/token"), "second").unwrap();
        assert!(refresh(&access(&dir), &conf).unwrap().is_some());
        let creds = crate::tools::api::kubeconfig::load(&path).unwrap();
        assert_eq!(creds.token.as_deref(), Some("second"));
    }

    #[test]
    fn a_missing_token_says_what_to_mount_and_a_symlink_is_replaced_not_followed() {
        let dir = Dir::new();
        let conf = dir.0.join("conf");
        let err = refresh(&access(&dir), &conf).unwrap_err();
        assert!(err.contains("projected ServiceAccount token"), "{err}");
        std::fs::write(dir.0.join("sa/token"), "t").unwrap();
        std::fs::write(dir.0.join("sa/ca.crt"), "PEM").unwrap();
        let elsewhere = dir.0.join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        std::fs::create_dir(conf.join(KUBECONFIG_DIR)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, kubeconfig_path(&conf)).unwrap();
        assert!(refresh(&access(&dir), &conf).unwrap().is_some());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        let meta = std::fs::symlink_metadata(kubeconfig_path(&conf)).unwrap();
        assert!(meta.file_type().is_file());
        // Its folder a symlink: refused, nothing written there.
        assert_eq!(remove(&conf).unwrap().len(), 2);
        let other = dir.0.join("other");
        std::fs::create_dir(&other).unwrap();
        std::os::unix::fs::symlink(&other, conf.join(KUBECONFIG_DIR)).unwrap();
        let err = refresh(&access(&dir), &conf).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
        assert!(remove(&conf).unwrap().is_empty());
        assert_eq!(turn_off(&conf, true).unwrap(), TurnedOff::CannotPlace);
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    }

    #[test]
    fn turned_off_the_kubeconfig_holds_the_sign_once_and_only_where_one_was() {
        let dir = Dir::new();
        let conf = dir.0.join("conf");
        assert_eq!(
            turn_off(&conf, false).unwrap(),
            TurnedOff::NothingThere,
            "no folder, nothing written"
        );
        std::fs::create_dir(conf.join(KUBECONFIG_DIR)).unwrap();
        assert_eq!(
            turn_off(&conf, false).unwrap(),
            TurnedOff::NothingThere,
            "no kubeconfig, nothing written"
        );
        assert!(!kubeconfig_path(&conf).exists());
        std::fs::write(dir.0.join("sa/token"), "t").unwrap();
        std::fs::write(dir.0.join("sa/ca.crt"), "PEM").unwrap();
        refresh(&access(&dir), &conf).unwrap();
        assert!(matches!(
            turn_off(&conf, false).unwrap(),
            TurnedOff::Wrote(_)
        ));
        let path = kubeconfig_path(&conf);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), VIEW_OFF);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(turn_off(&conf, true).unwrap(), TurnedOff::Already);
        // The sign as an operator may write it: another spelling is the sign; a file others
        // may write is not one the plugin trusts, so it is written again, 0600.
        std::fs::write(&path, r#"{"apiServerView":"off"}"#).unwrap();
        assert_eq!(turn_off(&conf, true).unwrap(), TurnedOff::Already);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
        assert!(matches!(
            turn_off(&conf, true).unwrap(),
            TurnedOff::Wrote(_)
        ));
        assert_eq!(held_with_at(&path), HeldWith::TurnedOff);
        // On again: the sign is replaced by the kubeconfig.
        assert!(refresh(&access(&dir), &conf).unwrap().is_some());
        assert!(crate::tools::api::kubeconfig::load(&path).is_ok());
        // Gone while DELs are held with it (an earlier release removed it): the sign is
        // written, its folder made 0700.
        std::fs::remove_dir_all(conf.join(KUBECONFIG_DIR)).unwrap();
        assert!(matches!(
            turn_off(&conf, true).unwrap(),
            TurnedOff::Wrote(_)
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), VIEW_OFF);
        let dir_mode = std::fs::metadata(conf.join(KUBECONFIG_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
    }
}
