//! The client half of `cni::pod_in_api`: `sandbox-guard-ctl --get-pod <namespace>/<name>
//! <kubeconfig>` GETs the pod and prints what the plugin needs of it (`PodInApi`) as one
//! line of JSON; exit status 1 and one line on stderr when it cannot tell. The plugin runs it
//! only where its local rule cannot decide, and kills it at `API_BOUND`.

pub mod kubeconfig;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::cni::pod_in_api::{PodInApi, REQUEST_BOUND};

/// `args`: what follows the flag.
pub fn run(args: &[String]) -> i32 {
    let [pod, kubeconfig] = args else {
        eprintln!("sandbox-guard: --get-pod takes <namespace>/<name> and a kubeconfig");
        return 2;
    };
    match get_pod(pod, Path::new(kubeconfig)) {
        Ok(pod) => {
            println!("{}", serde_json::to_string(&pod).unwrap_or_default());
            0
        }
        Err(why) => {
            eprintln!("sandbox-guard: {why}");
            1
        }
    }
}

/// A namespace or pod name as the API server takes it (DNS-1123 subdomain characters), so
/// that it makes one path segment of the URL and nothing else.
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

pub fn get_pod(pod: &str, kubeconfig: &Path) -> Result<PodInApi, String> {
    let Some((namespace, name)) = pod.split_once('/') else {
        return Err(format!("{pod:?} is not <namespace>/<name>"));
    };
    if !is_object_name(namespace) || !is_object_name(name) {
        return Err(format!("{pod:?} is not a pod's namespace and name"));
    }
    let creds = kubeconfig::load(kubeconfig)?;
    let agent = agent(&creds)?;
    let url = format!("{}/api/v1/namespaces/{namespace}/pods/{name}", creds.server);
    let mut request = agent.get(&url).header("Accept", "application/json");
    if let Some(token) = &creds.token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let mut response = request.call().map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(4 << 20)
        .read_to_string()
        .map_err(|e| format!("GET {url}: {e}"))?;
    match status {
        200 => {}
        404 if is_not_found_of_the_pod(&body) => {
            return Ok(PodInApi {
                found: false,
                uid: None,
                node_name: None,
            });
        }
        _ => {
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("message")?.as_str().map(str::to_string))
                .unwrap_or_default();
            return Err(format!("GET {url}: HTTP {status} {message}"));
        }
    }
    let pod: Value =
        serde_json::from_str(&body).map_err(|e| format!("GET {url}: not a pod: {e}"))?;
    let text = |value: Option<&Value>| {
        value
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    // The object asked for, not whatever the server or a proxy in front of it answered.
    let asked = (
        text(pod.get("kind")),
        text(pod.pointer("/metadata/namespace")),
        text(pod.pointer("/metadata/name")),
    );
    if asked
        != (
            Some("Pod".into()),
            Some(namespace.into()),
            Some(name.into()),
        )
    {
        return Err(format!(
            "GET {url}: the answer is not that pod (kind, namespace, name: {asked:?})"
        ));
    }
    // A static pod's mirror has a UID of its own; kubelet's (the one in CNI_ARGS) is in the
    // mirror annotation.
    let uid = text(pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror"))
        .or_else(|| text(pod.pointer("/metadata/uid")))
        .ok_or_else(|| format!("GET {url}: the pod has no metadata.uid"))?;
    Ok(PodInApi {
        found: true,
        uid: Some(uid),
        node_name: text(pod.pointer("/spec/nodeName")),
    })
}

/// A 404 of the pod itself (a `Status` of reason NotFound naming pods), not of a proxy or a
/// path the server does not serve: only then is the name free.
fn is_not_found_of_the_pod(body: &str) -> bool {
    let Ok(status) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    status.get("kind").and_then(Value::as_str) == Some("Status")
        && status.get("reason").and_then(Value::as_str) == Some("NotFound")
        && status.pointer("/details/kind").and_then(Value::as_str) == Some("pods")
}

/// The certificates of a PEM text, its other items (keys) left out.
fn certificates(pem: &[u8]) -> Vec<ureq::tls::Certificate<'static>> {
    ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect()
}

fn agent(creds: &kubeconfig::Credentials) -> Result<ureq::Agent, String> {
    use ureq::tls::{ClientCert, PrivateKey, RootCerts, TlsConfig};
    let roots = match &creds.ca {
        Some(pem) => {
            let certs = certificates(pem);
            if certs.is_empty() {
                return Err(
                    "the kubeconfig's certificate authority holds no PEM certificate".into(),
                );
            }
            RootCerts::Specific(Arc::new(certs))
        }
        None => RootCerts::WebPki,
    };
    let client_cert = match &creds.client_cert {
        Some((cert, key)) => {
            let chain = certificates(cert);
            let key = PrivateKey::from_pem(key)
                .map_err(|e| format!("the kubeconfig's client key: {e}"))?;
            Some(ClientCert::new_with_certs(&chain, key))
        }
        None => None,
    };
    let tls = TlsConfig::builder()
        .root_certs(roots)
        .client_cert(client_cert)
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(REQUEST_BOUND))
        // The API server answers a GET of a pod itself; a redirect is not followed, and never
        // to plain HTTP.
        .max_redirects(0)
        .https_only(true)
        .http_status_as_error(false)
        .build()
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pods_not_found_frees_the_name() {
        let pods =
            r#"{"kind":"Status","reason":"NotFound","details":{"name":"db-0","kind":"pods"}}"#;
        assert!(is_not_found_of_the_pod(pods));
        assert!(!is_not_found_of_the_pod(
            r#"{"kind":"Status","reason":"NotFound"}"#
        ));
        assert!(!is_not_found_of_the_pod("404 page not found"));
    }

    #[test]
    fn names_that_would_make_another_path_are_refused() {
        let k = Path::new("/nonexistent");
        for pod in [
            "db-0", "ns/../x", "ns/a/b", "ns/A", "/db-0", "ns/", "ns/a%2f",
        ] {
            let err = get_pod(pod, k).unwrap_err();
            assert!(err.contains("not"), "{pod}: {err}");
        }
    }
}
