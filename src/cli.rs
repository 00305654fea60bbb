//! The operator's side: the binary run by hand with flags instead of by a runtime.

use std::path::PathBuf;

use crate::config::DEFAULT_STATE_DIR;
use crate::dump::{self, Filter, Format};

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
  sandbox-guard --help       this text
  sandbox-guard --version    the plugin version and the CNI versions it speaks
";

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
        Ok(Command::Dump { state_dir, format, filter }) => match dump::run(&state_dir, format, &filter) {
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
}

fn parse(args: &[String]) -> Result<Command, String> {
    let mut mode = None;
    let mut state_dir = PathBuf::from(DEFAULT_STATE_DIR);
    let mut format = Format::Table;
    let mut filter = Filter::default();
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
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match mode {
        Some("dump") => Ok(Command::Dump { state_dir, format, filter }),
        _ => Err("no command given: use --dump-checkpoints, --help or --version".to_string()),
    }
}
