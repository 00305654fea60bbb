//! CRI-O's network settings from its own HTTP endpoint on the CRI socket (`GET /config`,
//! served beside gRPC on the same listener): the TOML of its running configuration, of
//! which `[crio.network]` says where it reads CNI configs (`network_dir`), where it looks
//! for plugins (`plugin_dirs`) and which network it takes (`cni_default_network`, else the
//! first file by name). CRI-O's CRI Status does not carry these, nor the network it loaded.

use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrioNetwork {
    pub conf_dir: PathBuf,
    pub plugin_dirs: Vec<PathBuf>,
    pub default_network: Option<String>,
}

pub fn network<S: Read + Write>(stream: &mut S) -> Result<CrioNetwork, String> {
    let body = get(stream, "/config")?;
    let text = String::from_utf8(body).map_err(|_| "GET /config is not UTF-8".to_string())?;
    parse_network(&text)
}

/// An HTTP/1.0 GET: the server closes the connection after the body, so no chunking and no
/// keep-alive are involved; a chunked body is decoded all the same.
fn get<S: Read + Write>(stream: &mut S, path: &str) -> Result<Vec<u8>, String> {
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .map_err(|e| format!("cannot send GET {path}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .take(super::http2::MAX_ANSWER as u64 + 1)
        .read_to_end(&mut answer)
        .map_err(|e| format!("GET {path}: {e}"))?;
    if answer.len() > super::http2::MAX_ANSWER {
        return Err(format!(
            "GET {path}: an answer of more than {} bytes",
            super::http2::MAX_ANSWER
        ));
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no HTTP answer"))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let body = &answer[split + 4..];
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("GET {path}: {}", crate::names::shorten(status)));
    }
    if head.contains("transfer-encoding: chunked") {
        return unchunk(body).ok_or_else(|| format!("GET {path}: a broken chunked body"));
    }
    Ok(body.to_vec())
}

fn unchunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        let rest = body.get(end + 2..)?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

/// The keys of `[crio.network]` as BurntSushi's TOML encoder writes them: one `key = value`
/// a line (indented), strings in double quotes with backslash escapes, arrays inline.
pub fn parse_network(toml: &str) -> Result<CrioNetwork, String> {
    let mut section = String::new();
    let (mut conf_dir, mut plugin_dirs, mut plugin_dir, mut default_network) =
        (None, None, None, None);
    for line in toml.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        if section != "crio.network" {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "network_dir" => conf_dir = Some(strings(value)?.concat()),
            "plugin_dirs" => plugin_dirs = Some(strings(value)?),
            "plugin_dir" => plugin_dir = Some(strings(value)?.concat()),
            "cni_default_network" => default_network = Some(strings(value)?.concat()),
            _ => {}
        }
    }
    let conf_dir = conf_dir.ok_or("CRI-O's configuration has no [crio.network] network_dir")?;
    // CRI-O adds the deprecated single plugin_dir to the list when it is set.
    let mut dirs = plugin_dirs.unwrap_or_default();
    dirs.extend(plugin_dir.filter(|d| !d.is_empty()));
    Ok(CrioNetwork {
        conf_dir: PathBuf::from(conf_dir),
        plugin_dirs: dirs.into_iter().map(PathBuf::from).collect(),
        default_network: default_network.filter(|n| !n.is_empty()),
    })
}

/// The double-quoted strings of a TOML value (one, or an inline array's), unescaped.
fn strings(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut text = String::new();
        loop {
            match chars.next() {
                None => return Err(format!("an unterminated string in {value:?}")),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => text.push('\n'),
                    Some('t') => text.push('\t'),
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        let c = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(|| format!("a bad escape in {value:?}"))?;
                        text.push(c);
                    }
                    Some(c) => text.push(c),
                    None => return Err(format!("an unterminated string in {value:?}")),
                },
                Some(c) => text.push(c),
            }
        }
        out.push(text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::runtime::http2::tests::{Canned, XorShift};

    /// The shape of CRI-O's `GET /config` (server/inspect.go: `config.ToBytes()`, BurntSushi
    /// toml's encoder over `tomlConfig`, tables indented by two spaces a level), cut to the
    /// tables around `[crio.network]`. CRI-O does not run here: recorded from its source.
    pub const CONFIG: &str = r#"[crio]
  root = "/var/lib/containers/storage"
  runroot = "/run/containers/storage"
  [crio.api]
    listen = "/var/run/crio/crio.sock"
  [crio.runtime]
    default_runtime = "crun"
    [crio.runtime.runtimes]
      [crio.runtime.runtimes.crun]
        runtime_path = "/usr/libexec/crio/crun"
  [crio.image]
    pause_image = "registry.k8s.io/pause:3.10"
  [crio.network]
    cni_default_network = ""
    network_dir = "/etc/kubernetes/cni/net.d/"
    plugin_dirs = ["/var/lib/cni/bin", "/usr/libexec/cni", "/opt/\"odd\"\\bin"]
    cni_status_grace_period = "0s"
  [crio.metrics]
    enable_metrics = true
"#;

    fn http(head: &str, body: &str) -> Vec<u8> {
        format!("{head}\r\nContent-Type: application/toml\r\n\r\n{body}").into_bytes()
    }

    #[test]
    fn reads_the_network_settings() {
        let mut peer = Canned::new(http("HTTP/1.0 200 OK", CONFIG));
        let net = network(&mut peer).unwrap();
        assert_eq!(
            peer.written,
            b"GET /config HTTP/1.0\r\nHost: localhost\r\n\r\n"
        );
        assert_eq!(net.conf_dir, PathBuf::from("/etc/kubernetes/cni/net.d/"));
        assert_eq!(
            net.plugin_dirs,
            ["/var/lib/cni/bin", "/usr/libexec/cni", "/opt/\"odd\"\\bin"].map(PathBuf::from)
        );
        assert_eq!(net.default_network, None);
        let named = CONFIG.replace(
            "cni_default_network = \"\"",
            "cni_default_network = \"ovn\"",
        );
        assert_eq!(
            parse_network(&named).unwrap().default_network.as_deref(),
            Some("ovn")
        );
    }

    #[test]
    fn chunked_and_failed_answers() {
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{CONFIG}\r\n0\r\n\r\n",
            CONFIG.len()
        );
        assert!(network(&mut Canned::new(chunked.into_bytes())).is_ok());
        let err = network(&mut Canned::new(http("HTTP/1.0 404 Not Found", "404"))).unwrap_err();
        assert!(err.contains("404"), "{err}");
        let err = network(&mut Canned::new(http("HTTP/1.0 200 OK", "[crio]\n"))).unwrap_err();
        assert!(err.contains("network_dir"), "{err}");
        let mut rng = XorShift(7);
        let good = http(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
            "5\r\nab\"\\u\r\n0\r\n\r\n",
        );
        for _ in 0..5000 {
            let mut input = good.clone();
            let at = rng.next_u64() as usize % input.len();
            input[at] = rng.next_u64() as u8;
            input.truncate(rng.next_u64() as usize % (input.len() + 1));
            let _ = network(&mut Canned::new(input));
        }
        for _ in 0..5000 {
            let mut text: Vec<u8> = CONFIG.as_bytes().to_vec();
            let at = rng.next_u64() as usize % text.len();
            text[at] = b"\"\\u[]=\n"[rng.next_u64() as usize % 7];
            let _ = parse_network(&String::from_utf8_lossy(&text));
        }
    }
}
