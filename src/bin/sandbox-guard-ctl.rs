//! sandbox-guard-ctl, the operator's commands: `--dump-checkpoints`, `--restore`, `--doctor`,
//! `--install`, `--uninstall`, `--downgrade`. The plugin the runtime execs for every pod
//! (src/main.rs) hands any command line to this binary beside it, so that it carries none of
//! their code and `sandbox-guard --doctor` keeps working.

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    std::process::exit(sandbox_guard::tools::cli::run(&args));
}
