//! The kubeconfig the plugin reads the API server with: its current context's server, CA and
//! credentials. JSON only (a JSON document is a kubeconfig kubectl reads too): the installer
//! writes it so, and a YAML parser is not worth its weight for one file we write ourselves.

use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// What a request needs from the kubeconfig.
pub struct Credentials {
    pub server: String,
    /// PEM: the cluster's CA, or `None` for the system's roots.
    pub ca: Option<Vec<u8>>,
    pub token: Option<String>,
    /// PEM: a client certificate chain and its key.
    pub client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(rename = "current-context", default)]
    current_context: String,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
struct Cluster {
    server: String,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<PathBuf>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure: bool,
}

#[derive(Deserialize, Default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(rename = "client-certificate")]
    cert_file: Option<PathBuf>,
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key")]
    key_file: Option<PathBuf>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// Reads `path`. A relative path inside it is relative to its folder, as kubectl reads it.
pub fn load(path: &Path) -> Result<Credentials, String> {
    let text = read_trusted(path, true)?;
    if crate::state::held::is_view_off(&text) {
        return Err(format!(
            "{} holds {{\"apiServerView\": \"off\"}}, the sign that the API server's view is turned off: no ask is made with it",
            path.display()
        ));
    }
    let config: Kubeconfig = serde_json::from_slice(&text).map_err(|e| {
        format!(
            "{} is not a JSON kubeconfig ({e}); write it as JSON: kubectl config view --raw --flatten -o json",
            path.display()
        )
    })?;
    let base = path.parent().unwrap_or(Path::new("/"));
    let context = match config
        .contexts
        .iter()
        .find(|c| c.name == config.current_context)
    {
        Some(context) => &context.value,
        None if config.contexts.len() == 1 => &config.contexts[0].value,
        None => return Err(format!("{} names no current context", path.display())),
    };
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .map(|c| &c.value)
        .ok_or_else(|| format!("{} has no cluster {:?}", path.display(), context.cluster))?;
    if cluster.insecure {
        return Err(format!(
            "{} skips the server's certificate check: give it the cluster's CA",
            path.display()
        ));
    }
    if !cluster.server.starts_with("https://") {
        return Err(format!(
            "{}: the server {:?} is not https: the node's credentials go over TLS only",
            path.display(),
            cluster.server
        ));
    }
    let default_user = User::default();
    let user = config
        .users
        .iter()
        .find(|u| u.name == context.user)
        .map_or(&default_user, |u| &u.value);
    let ca = data_or_file(
        "certificate-authority",
        &cluster.ca_data,
        &cluster.ca_file,
        base,
    )?;
    let token = match (&user.token, &user.token_file) {
        (Some(token), _) => Some(token.trim().to_string()),
        (None, Some(file)) => {
            let file = base.join(file);
            let token = read_trusted(&file, false)?;
            Some(String::from_utf8_lossy(&token).trim().to_string())
        }
        (None, None) => None,
    };
    let cert = data_or_file("client-certificate", &user.cert_data, &user.cert_file, base)?;
    let key = data_or_file("client-key", &user.key_data, &user.key_file, base)?;
    let client_cert = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(format!(
                "{} gives a client certificate or key without the other",
                path.display()
            ));
        }
    };
    if token.is_none() && client_cert.is_none() {
        return Err(format!(
            "{} gives no credentials: a token, a tokenFile or a client certificate",
            path.display()
        ));
    }
    Ok(Credentials {
        server: cluster.server.trim_end_matches('/').to_string(),
        ca,
        token,
        client_cert,
    })
}

/// When a ServiceAccount token was issued and when it expires (its JWT's `iat`, if there,
/// and `exp`, seconds since the epoch), read without checking its signature: only the API
/// server can, and this only says when the token stops working. `None`: not a JWT, or one
/// without `exp`.
pub fn token_life(token: &str) -> Option<(Option<u64>, u64)> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let issued = claims.get("iat").and_then(serde_json::Value::as_u64);
    Some((issued, claims.get("exp")?.as_u64()?))
}

/// Reads a file the node's credentials come from, if only this user could have written it:
/// owned by it, not writable by group or others (the kubeconfig names the server the token goes
/// to). The kubeconfig itself is never followed through a symlink.
fn read_trusted(path: &Path, no_symlink: bool) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let flags = nix::libc::O_CLOEXEC | if no_symlink { nix::libc::O_NOFOLLOW } else { 0 };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { nix::libc::geteuid() };
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is owned by uid {} with mode {:o}: it must be this user's (uid {me}) and writable by it alone",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let mut bytes = Vec::new();
    file.take(1 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes)
}

fn data_or_file(
    what: &str,
    data: &Option<String>,
    file: &Option<PathBuf>,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(data) = data {
        return base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(Some)
            .map_err(|e| format!("{what}-data is not base64: {e}"));
    }
    match file {
        Some(file) => read_trusted(&base.join(file), false).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("kubeconfig");
        fs::write(&path, text).unwrap();
        (dir, path)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "sg-kubeconfig-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn the_current_contexts_server_ca_and_token_file_relative_to_the_kubeconfig() {
        let (dir, path) = write(
            r#"{"clusters":[{"name":"a","cluster":{"server":"https://10.0.0.1:6443/","certificate-authority-data":"UEVN"}}],
               "users":[{"name":"u","user":{"tokenFile":"token"}}],
               "contexts":[{"name":"other","context":{"cluster":"b","user":"v"}},{"name":"c","context":{"cluster":"a","user":"u"}}],
               "current-context":"c"}"#,
        );
        fs::write(dir.0.join("token"), "abc\n").unwrap();
        let creds = load(&path).unwrap();
        assert_eq!(creds.server, "https://10.0.0.1:6443");
        assert_eq!(creds.ca.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(creds.token.as_deref(), Some("abc"));
        assert!(creds.client_cert.is_none());
    }

    #[test]
    fn the_installers_off_sign_is_said_as_such() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, path) = write(crate::state::held::VIEW_OFF);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let err = load(&path).err().unwrap();
        assert!(err.contains("view is turned off"), "{err}");
    }

    #[test]
    fn a_tokens_life_is_its_jwt_iat_and_exp_and_none_for_anything_else() {
        let encode = |json: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        let jwt = |claims: &str| format!("{}.{}.sig", encode(r#"{"alg":"RS256"}"#), encode(claims));
        assert_eq!(
            token_life(&jwt(r#"{"iat":1767139200,"exp":1767225600,"sub":"x"}"#)),
            Some((Some(1767139200), 1767225600))
        );
        assert_eq!(
            token_life(&jwt(r#"{"exp":1767225600}"#)),
            Some((None, 1767225600))
        );
        assert_eq!(token_life(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(token_life("opaque-static-token"), None);
        assert_eq!(token_life("a.!!!.c"), None);
    }

    #[test]
    fn a_kubeconfig_others_can_write_or_a_symlink_to_one_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, path) = write(r#"{"clusters":[]}"#);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(load(&path).err().unwrap().contains("writable by it alone"));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.0.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(load(&link).err().unwrap().contains("cannot read"));
    }

    #[test]
    fn yaml_plain_http_no_credentials_and_skipped_verification_are_refused_with_the_way_out() {
        let (_d, yaml) = write("apiVersion: v1\nkind: Config\n");
        assert!(load(&yaml).err().unwrap().contains("-o json"));
        let one = |cluster: &str, user: &str| {
            format!(
                r#"{{"clusters":[{{"name":"a","cluster":{cluster}}}],"users":[{{"name":"u","user":{user}}}],"contexts":[{{"name":"c","context":{{"cluster":"a","user":"u"}}}}],"current-context":"c"}}"#
            )
        };
        let (_d, http) = write(&one(r#"{"server":"http://x"}"#, r#"{"token":"t"}"#));
        assert!(load(&http).err().unwrap().contains("not https"));
        let (_d, none) = write(&one(r#"{"server":"https://x"}"#, "{}"));
        assert!(load(&none).err().unwrap().contains("no credentials"));
        let (_d, insecure) = write(&one(
            r#"{"server":"https://x","insecure-skip-tls-verify":true}"#,
            r#"{"token":"t"}"#,
        ));
        assert!(load(&insecure).err().unwrap().contains("CA"));
    }
}
