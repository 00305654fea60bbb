//! sandbox-guard-ctl, the operator's commands: `--dump-checkpoints`, `--restore`, `--doctor`,
//! `--install`, `--uninstall`, `--downgrade`. The plugin the runtime execs for every pod
//! (src/main.rs) hands any command line to this binary beside it, so that it carries none of
//! their code and `sandbox-guard --doctor` keeps working.

use sandbox_guard::cni::{config, version};
use sandbox_guard::error::{GuardError, Kind};

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.is_empty() && std::env::var_os("CNI_COMMAND").is_some_and(|c| !c.is_empty()) {
        std::process::exit(not_a_plugin());
    }
    std::process::exit(sandbox_guard::tools::cli::run(&args));
}

/// A conflist that names this binary as a plugin: the runtime reads a CNI error, not a usage
/// line, and the error says which type to name.
fn not_a_plugin() -> i32 {
    let requested = config::read_stdin()
        .ok()
        .and_then(|stdin| config::peek_version(&stdin));
    let err = GuardError::new(
        Kind::InvalidConfig,
        format!(
            "{} is the operator's binary of sandbox-guard, not a CNI plugin",
            sandbox_guard::CTL_BINARY
        ),
    )
    .with_details("name \"sandbox-guard\" as the plugin's type in the network configuration");
    println!(
        "{}",
        err.to_cni_json(version::for_reply(requested.as_deref()))
    );
    eprintln!("sandbox-guard-ctl: {err}");
    1
}
