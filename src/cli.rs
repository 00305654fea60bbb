//! The operator's side: the binary run by hand with flags instead of by a runtime.

use std::path::PathBuf;

use crate::config::DEFAULT_STATE_DIR;
use crate::dump::{self, Filter, Format};
use crate::doctor;
use crate::restore::{self, Selection};

const HELP: &str = "\
sandbox-guard: a chained CNI plugin that checkpoints every pod attachment and refuses the
stale DEL of an old sandbox once a newer sandbox owns the same pod name.

As a CNI plugin it is run by the container runtime (CNI_COMMAND in the environment,
config on stdin); list it LAST in the conflist. By hand:

  sandbox-guard --dump-checkpoints [options]   show what the checkpoints hold
      --state-dir DIR        state directory (default /var/lib/cni/sandbox-guard)
      --output table|json    table for people (default), JSON array for tools
      --namespace NS         only pods in namespace NS
      --pod NAME             only pods named NAME
      --pod-uid UID          only the pod with UID
      --container-id ID      only sandboxes whose ID starts with ID
  sandbox-guard --restore [--dry-run] [--state-dir DIR] (--all | CONTAINER-ID...)
                             re-create pod interfaces that vanished with their host
                             parent (a NIC driver reload): the same MAC, addresses and
                             routes, in the same netns; sandboxes whose interface is
                             present are left alone. Stop kubelet first.
      --all                  every checkpointed sandbox
      --dry-run              print what would be done, change nothing
  sandbox-guard --doctor [options]   explain this node's CNI failure classes before they
                             bite: enslaved macvlan/ipvlan masters, no route for the
                             service CIDR, addresses still held by deleted or superseded
                             sandboxes, stale DELs per pod, store health, interfaces
                             missing from live sandboxes. Exit status 1 on any error.
      --conf-dir DIR         CNI config dir (default /etc/cni/net.d)
      --state-dir DIR        state directory (default: each conflist's stateDir)
      --log-file FILE        plugin log (default: each conflist's logFile)
      --service-cidr CIDR    Kubernetes service range, repeatable (default 10.96.0.0/12)
      --output table|json    table for people (default), JSON for monitoring
  sandbox-guard --help       this text
  sandbox-guard --version    the plugin version and the CNI versions it speaks
";

const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub fn run(args: &[String]) -> i32 {
    match parse(args) {
        Ok(Command::Help) => {
            print!("{HELP}");
            0
        }
        Ok(Command::Version) => {
            println!(
                "sandbox-guard {} (CNI {})",
                env!("CARGO_PKG_VERSION"),
                crate::version::SUPPORTED.join(", ")
            );
            0
        }
        Ok(Command::Doctor(options)) => doctor::run(&options),
        Ok(Command::Restore { state_dir, selection, dry_run }) => restore::run(&state_dir, &selection, dry_run, LOCK_TIMEOUT),
        Ok(Command::Dump { state_dir, format, filter }) => match dump::run(&state_dir, format, &filter, LOCK_TIMEOUT) {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("sandbox-guard: {err}");
                1
            }
        },
        Err(msg) => {
            eprintln!("sandbox-guard: {msg}\nRun `sandbox-guard --help` for the options.");
            2
        }
    }
}

enum Command {
    Help,
    Version,
    Dump { state_dir: PathBuf, format: Format, filter: Filter },
    Restore { state_dir: PathBuf, selection: Selection, dry_run: bool },
    Doctor(doctor::Options),
}

fn parse(args: &[String]) -> Result<Command, String> {
    let mut mode = None;
    let mut state_dir = PathBuf::from(DEFAULT_STATE_DIR);
    let mut format = Format::Table;
    let mut filter = Filter::default();
    let (mut restore_all, mut dry_run, mut container_ids) = (false, false, Vec::new());
    let (mut conf_dir, mut service_cidrs, mut log_file) = (PathBuf::from(doctor::DEFAULT_CONF_DIR), Vec::new(), None);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = |flag: &str| rest.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--dump-checkpoints" => mode = Some("dump"),
            "--state-dir" => state_dir = PathBuf::from(value(arg)?),
            "--output" | "-o" => {
                format = match value(arg)?.as_str() {
                    "table" => Format::Table,
                    "json" => Format::Json,
                    other => return Err(format!("--output {other:?}: use table or json")),
                }
            }
            "--namespace" => filter.namespace = Some(value(arg)?),
            "--pod" => filter.pod_name = Some(value(arg)?),
            "--pod-uid" => filter.pod_uid = Some(value(arg)?),
            "--container-id" => filter.container_id = Some(value(arg)?),
            "--restore" => mode = Some("restore"),
            "--all" => restore_all = true,
            "--dry-run" => dry_run = true,
            "--doctor" => mode = Some("doctor"),
            "--conf-dir" => conf_dir = PathBuf::from(value(arg)?),
            "--log-file" => log_file = Some(PathBuf::from(value(arg)?)),
            "--service-cidr" => {
                let text = value(arg)?;
                service_cidrs.push(text.parse().map_err(|e| format!("--service-cidr {text:?}: {e}"))?);
            }
            id if !id.starts_with('-') => container_ids.push(id.to_string()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match mode {
        Some("dump") if container_ids.is_empty() => Ok(Command::Dump { state_dir, format, filter }),
        Some("dump") => Err(format!("unexpected argument {:?}: --dump-checkpoints filters with --container-id", container_ids[0])),
        Some("restore") => {
            let selection = match (restore_all, container_ids.is_empty()) {
                (true, true) => Selection::All,
                (false, false) => Selection::ContainerIds(container_ids),
                _ => return Err("--restore needs --all or container IDs: one of the two".to_string()),
            };
            Ok(Command::Restore { state_dir, selection, dry_run })
        }
        Some("doctor") if container_ids.is_empty() => {
            if service_cidrs.is_empty() {
                service_cidrs.push(doctor::DEFAULT_SERVICE_CIDR.parse().map_err(|e| format!("{e}"))?);
            }
            // The conflists' stateDirs unless the operator named one.
            let state_dir = args.iter().any(|a| a == "--state-dir").then_some(state_dir);
            Ok(Command::Doctor(doctor::Options { conf_dir, state_dir, log_file, service_cidrs, format, lock_timeout: LOCK_TIMEOUT }))
        }
        Some("doctor") => Err(format!("unexpected argument {:?}", container_ids[0])),
        _ => Err("no command given: use --dump-checkpoints, --restore, --doctor, --help or --version".to_string()),
    }
}
