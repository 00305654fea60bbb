//! Stands in for kubelet in sandbox-guard's containerd test: each subcommand is one CRI
//! call, answered as one JSON line on stdout, so the test can drive containerd exactly
//! the way kubelet does (RunPodSandbox -> CNI ADD, StopPodSandbox -> DEL) without a cluster.
//! A failed call prints {"error":{"code":..,"message":..}} and exits 1: the test inspects
//! the message because that is where a CNI plugin's refusal surfaces to kubelet.

use std::process::ExitCode;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StatusRequest, StopPodSandboxRequest,
    VersionRequest,
};
use serde_json::{Value, json};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

const USAGE: &str = "usage: cri-client --socket PATH COMMAND
commands:
  version
  status                      runtime and network readiness
  info                        the verbose Status's info map (containerd: cniconfig, ...)
  run-pod --name N --namespace NS --uid U [--attempt A] [--log-dir DIR] [--cgroup-parent P]
  stop-pod ID
  remove-pod ID
  pod-status ID";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (socket, command) = match split_socket(&args) {
        Some(parts) => parts,
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(dispatch(&socket, &command)) {
        Ok(answer) => {
            println!("{answer}");
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(msg)) => {
            eprintln!("{msg}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Rpc(status)) => {
            println!(
                "{}",
                json!({"error": {"code": status.code() as i32, "message": status.message()}})
            );
            ExitCode::from(1)
        }
        Err(Failure::Connect(msg)) => {
            println!("{}", json!({"error": {"code": null, "message": msg}}));
            ExitCode::from(1)
        }
    }
}

enum Failure {
    Usage(String),
    Connect(String),
    Rpc(tonic::Status),
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Failure::Rpc(status)
    }
}

fn split_socket(args: &[String]) -> Option<(String, Vec<String>)> {
    match args {
        [flag, socket, rest @ ..] if flag == "--socket" && !rest.is_empty() => {
            Some((socket.clone(), rest.to_vec()))
        }
        _ => None,
    }
}

async fn connect(socket: &str) -> Result<RuntimeServiceClient<Channel>, Failure> {
    let path = socket.to_string();
    // The URI is a placeholder: every connection goes to the unix socket.
    let channel = Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| Failure::Connect(format!("connect {socket}: {e}")))?;
    Ok(RuntimeServiceClient::new(channel))
}

async fn dispatch(socket: &str, command: &[String]) -> Result<Value, Failure> {
    let (verb, rest) = command.split_first().expect("split_socket keeps a command");
    let mut client = connect(socket).await?;
    match verb.as_str() {
        "version" => {
            let v = client
                .version(VersionRequest::default())
                .await?
                .into_inner();
            Ok(
                json!({"runtimeName": v.runtime_name, "runtimeVersion": v.runtime_version,
                      "runtimeApiVersion": v.runtime_api_version}),
            )
        }
        "status" => {
            let status = client
                .status(StatusRequest { verbose: false })
                .await?
                .into_inner();
            let conditions: Vec<Value> = status
                .status
                .map(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| {
                    json!({"type": c.r#type, "status": c.status, "reason": c.reason,
                                "message": c.message})
                })
                .collect();
            Ok(json!({"conditions": conditions}))
        }
        "info" => {
            let status = client
                .status(StatusRequest { verbose: true })
                .await?
                .into_inner();
            // Values are JSON where the runtime wrote JSON (containerd's cniconfig).
            let info: serde_json::Map<String, Value> = status
                .info
                .into_iter()
                .map(|(k, v)| {
                    let value = serde_json::from_str(&v).unwrap_or(Value::String(v));
                    (k, value)
                })
                .collect();
            Ok(Value::Object(info))
        }
        "run-pod" => {
            let flags = Flags::parse(rest)?;
            let metadata = PodSandboxMetadata {
                name: flags.required("--name")?,
                namespace: flags.required("--namespace")?,
                uid: flags.required("--uid")?,
                attempt: flags
                    .optional("--attempt")
                    .map(|a| {
                        a.parse()
                            .map_err(|_| Failure::Usage(format!("bad --attempt {a}")))
                    })
                    .transpose()?
                    .unwrap_or(0),
            };
            let config = PodSandboxConfig {
                hostname: metadata.name.clone(),
                log_directory: flags.optional("--log-dir").unwrap_or_default(),
                metadata: Some(metadata),
                linux: Some(LinuxPodSandboxConfig {
                    cgroup_parent: flags.optional("--cgroup-parent").unwrap_or_default(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let reply = client
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await?
                .into_inner();
            Ok(json!({"id": reply.pod_sandbox_id}))
        }
        "stop-pod" => {
            let id = single_id(rest)?;
            client
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await?;
            Ok(json!({"stopped": id}))
        }
        "remove-pod" => {
            let id = single_id(rest)?;
            client
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await?;
            Ok(json!({"removed": id}))
        }
        "pod-status" => {
            let id = single_id(rest)?;
            let reply = client
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: id,
                    verbose: false,
                })
                .await?
                .into_inner();
            let status = reply.status.unwrap_or_default();
            let metadata = status.metadata.clone().unwrap_or_default();
            let additional_ips: Vec<String> = status
                .network
                .iter()
                .flat_map(|n| n.additional_ips.iter().map(|a| a.ip.clone()))
                .collect();
            Ok(json!({
                "id": status.id,
                "state": status.state().as_str_name(),
                "ip": status.network.map(|n| n.ip).unwrap_or_default(),
                "additionalIps": additional_ips,
                "name": metadata.name,
                "namespace": metadata.namespace,
                "uid": metadata.uid,
            }))
        }
        other => Err(Failure::Usage(format!("unknown command {other}"))),
    }
}

fn single_id(rest: &[String]) -> Result<String, Failure> {
    match rest {
        [id] => Ok(id.clone()),
        _ => Err(Failure::Usage("expected exactly one sandbox id".into())),
    }
}

/// `--key value` pairs of one subcommand.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(rest: &[String]) -> Result<Flags, Failure> {
        if !rest.len().is_multiple_of(2) {
            return Err(Failure::Usage("flags come in --key value pairs".into()));
        }
        Ok(Flags(
            rest.chunks(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect(),
        ))
    }

    fn optional(&self, key: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn required(&self, key: &str) -> Result<String, Failure> {
        self.optional(key)
            .ok_or_else(|| Failure::Usage(format!("missing {key}")))
    }
}
