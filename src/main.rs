//! sandbox-guard, the CNI plugin the runtime execs: reads the CNI call and hands it to the
//! library (src/lib.rs). An operator's command line goes to sandbox-guard-ctl beside it.

use std::ffi::{CString, OsString};
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;

use sandbox_guard::cni::config::{self, NetConf};
use sandbox_guard::cni::env::{CniEnv, Verb};
use sandbox_guard::cni::verbs::{self as commands, Invocation};
use sandbox_guard::cni::{log, version};
use sandbox_guard::error::{GuardError, Kind, Result};
use sandbox_guard::stderr_line;
use sandbox_guard::{CTL_BINARY, cni};

/// std's start-up runs first: fds 0-2 opened on /dev/null where the runtime closed one (so that
/// no state file opened later becomes stdout), and SIGPIPE ignored (a reader gone away is an
/// error to handle rather than a kill).
fn main() {
    run()
}

fn run() -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Some(handed) = std::env::var_os(commands::replay::worker::WORKER_ENV) {
        std::process::exit(run_replay_worker(&handed.to_string_lossy()));
    }
    let status = if args.is_empty() && std::env::var_os("CNI_COMMAND").is_none_or(|c| c.is_empty())
    {
        about()
    } else if args.is_empty() {
        run_cni()
    } else {
        run_ctl(&args)
    };
    std::process::exit(status);
}

/// The operator's commands, in the binary beside this one (the installer puts both in the
/// same dir; a symlink to the plugin is followed to it), run in this process's place. By
/// execv, not a PATH search: a file there that is not an executable is an error to say, never
/// a shell script to run. `--version` alone is the plugin's own: it names what the runtime runs.
fn run_ctl(args: &[OsString]) -> i32 {
    if args.len() == 1 && args[0] == "--version" {
        println!("{}", version::version_line());
        return 0;
    }
    let ctl = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(CTL_BINARY),
        Err(err) => {
            stderr_line!(
                "sandbox-guard: cannot find this binary to run {CTL_BINARY} beside it ({err}); run {CTL_BINARY} itself"
            );
            return 127;
        }
    };
    let argv: std::result::Result<Vec<CString>, _> = std::iter::once(ctl.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|arg| CString::new(arg.as_bytes()))
        .collect();
    let (status, err) = match argv {
        Ok(argv) => match nix::unistd::execv(&argv[0], &argv) {
            Err(Errno::ENOENT) => (127, "it is not there".to_string()),
            Err(errno) => (126, format!("it cannot be run: {errno}")),
        },
        Err(_) => (126, "a path or argument holds a NUL byte".to_string()),
    };
    stderr_line!(
        "sandbox-guard: the operator's commands are in {}, and {err}; put the {CTL_BINARY} of this build there \
         (scripts/build.sh builds both, the image holds both)",
        ctl.display()
    );
    status
}

/// Run by a person without CNI_COMMAND: what the reference plugins' skel prints then, on
/// stderr, exit status 0.
fn about() -> i32 {
    stderr_line!(
        "CNI sandbox-guard plugin v{}\nCNI protocol versions supported: {}\nRun 'sandbox-guard --help' for the operator's commands.",
        env!("CARGO_PKG_VERSION"),
        version::SUPPORTED.join(", ")
    );
    0
}

/// Runs one CNI verb. The result goes to stdout; an error goes to stdout as CNI error JSON
/// (what the runtime reads) and to stderr (what a person reads).
fn run_cni() -> i32 {
    // A person who runs the binary in a terminal gets an error, not a hang on stdin.
    let stdin = if std::io::stdin().is_terminal() {
        Ok(Vec::new())
    } else {
        config::read_stdin()
    };
    let requested_version = stdin.as_deref().ok().and_then(config::peek_version);
    let outcome = stdin.and_then(|bytes| dispatch(&bytes, requested_version.as_deref()));
    let mut stdout = std::io::stdout().lock();
    match outcome {
        Ok(output) => {
            if let Some(output) = output {
                let _ = writeln!(stdout, "{output}");
            }
            0
        }
        Err(err) => {
            let _ = writeln!(
                stdout,
                "{}",
                err.to_cni_json(version::for_reply(requested_version.as_deref()))
            );
            1
        }
    }
}

/// The replay worker a delegate-mode verb started (`cni::verbs::replay::worker`): the verb's
/// configuration on stdin, its environment, nobody reading its output.
fn run_replay_worker(handed: &str) -> i32 {
    // SAFETY: the process is single-threaded this early; the primaries it runs must not
    // take themselves for workers.
    unsafe { std::env::remove_var(commands::replay::worker::WORKER_ENV) };
    let Ok(stdin) = config::read_stdin() else {
        return 1;
    };
    let Ok(conf) = NetConf::parse(&stdin) else {
        return 1;
    };
    let verb = CniEnv::from_process().map_or(Verb::Gc, |env| env.verb);
    let log = log::Log::open(conf.log_file.as_deref(), conf.log);
    let inv = Invocation {
        verb,
        conf,
        log,
        metrics_committed: std::cell::Cell::new(false),
        conf_bytes: stdin,
    };
    let Some(delegate) = inv.conf.delegate.as_ref() else {
        return 1;
    };
    commands::replay::worker::run(&inv, delegate, handed);
    0
}

fn dispatch(stdin: &[u8], requested_version: Option<&str>) -> Result<Option<String>> {
    let env = CniEnv::from_process().inspect_err(|err| stderr_line!("sandbox-guard: {err}"))?;
    let conf = match env.verb {
        Verb::Version => None,
        verb => {
            let conf = NetConf::parse(stdin).and_then(|conf| {
                version::check_verb_allowed(verb, &conf.cni_version).map(|()| conf)
            });
            // Logged and counted where the config lets that be done (to stderr in any case).
            Some(conf.inspect_err(|err| {
                cni::rejected::record(verb, env.attachment.as_ref(), stdin, err)
            })?)
        }
    };
    let Some(conf) = conf else {
        let delegated = commands::delegated::version(stdin, requested_version)
            .inspect_err(|err| stderr_line!("sandbox-guard: {err}"))?;
        return Ok(Some(
            delegated.unwrap_or_else(|| version::version_reply(requested_version)),
        ));
    };
    let log = log::Log::open(conf.log_file.as_deref(), conf.log);
    let inv = Invocation {
        verb: env.verb,
        conf,
        log,
        metrics_committed: std::cell::Cell::new(false),
        conf_bytes: stdin.to_vec(),
    };
    let mode = commands::mode::of(&inv);
    let result = match (env.verb, &env.attachment) {
        (Verb::Add, Some(attachment)) => mode.add(&inv, attachment).map(Some),
        (Verb::Del, Some(attachment)) => mode.del(&inv, attachment).map(|()| None),
        (Verb::Check, Some(attachment)) => mode.check(&inv, attachment).map(|()| None),
        (Verb::Gc, _) => mode.gc(&inv).map(|()| None),
        (Verb::Status, _) => mode.status(&inv).map(|()| None),
        (verb, _) => Err(GuardError::new(
            Kind::InvalidEnvironment,
            format!("{} without its attachment", verb.name()),
        )),
    };
    if let Err(err) = &result {
        // The verbs log their own refusals (to stderr too); everything else is logged here.
        if !matches!(
            err.kind,
            Kind::StaleDel | Kind::SetAside | Kind::CheckFailed | Kind::Superseded
        ) {
            let pod = env.attachment.as_ref().and_then(|a| a.pod.label());
            inv.log.event(
                log::Level::Error,
                inv.verb,
                &inv.subject(env.attachment.as_ref(), pod),
                log::Outcome::Error,
                &err.msg,
            );
        }
    }
    cni::metrics::flush(&inv, result.is_ok());
    result
}
