//! The operator's side: the commands run by hand with flags instead of by a runtime, in
//! their own binary, sandbox-guard-ctl.
//!
//! Five modes (`--dump-checkpoints`, `--restore`, `--doctor`, `--install`, `--uninstall`),
//! exactly one per run, each with
//! its own options and its own `--help`. lexopt splits the words (`--flag value`,
//! `--flag=value`, `-o json`, `--`); the rules are checked here, after the whole line is read,
//! so that a mistake is refused before anything runs: an empty value, a flag of another mode,
//! a single-valued flag given twice, a container ID that could not be one. A usage error exits
//! 2 with one line and a pointer to the mode's help.
//!
//! Only the operator's binary parses (src/bin/sandbox-guard-ctl.rs): the plugin hands it any
//! command line, so a runtime's exec (no arguments) never reaches the parser.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lexopt::Arg;

use crate::cni::config::DEFAULT_STATE_DIR;
use crate::error::Kind;
use crate::names;
use crate::tools::doctor;
use crate::tools::dump::{self, Filter, Format};
use crate::tools::install;
use crate::tools::restore::{self, Selection};

/// How long a command waits for the state dir's lock unless `--lock-timeout` says otherwise.
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

const OVERVIEW: &str = "\
Usage: sandbox-guard MODE [options]

sandbox-guard records which pod sandbox owns each pod name and keeps the stale DEL of an
old sandbox away from a primary plugin that keys its state by pod name.

The container runtime runs it as a CNI plugin (CNI_COMMAND in the environment, the config
on stdin): chained, as the last plugin of the conflist, it refuses a stale DEL; in delegate
mode, in the primary's place with the primary under \"delegate\", it defers it. --install
puts it where its mode needs it, with sandbox-guard-ctl beside it: the operator's commands,
which `sandbox-guard MODE` runs. By hand, one mode a run:

Modes:
  --dump-checkpoints                  show what the checkpoints hold
  --restore (--all | CONTAINER-ID...)
                                      re-create pod interfaces that vanished with their
                                      host parent (a NIC driver reload)
  --doctor                            explain this node's CNI failure classes before they
                                      bite; exit status 1 on any error
  --install                           put it into the network the runtime runs, in the
                                      chosen mode, and copy the binaries
  --uninstall                         take it out, the primary's config as it was
  --downgrade                         put the state dir back in the form every earlier
                                      release reads, to go back to one
  MODE --help                         that mode's options
  --help                              this text
  --version                           the plugin version and the CNI versions it speaks

Options of --dump-checkpoints, --restore, --doctor and --downgrade:
  --state-dir DIR                     state directory (default /var/lib/cni/sandbox-guard)
  --lock-timeout SECONDS              how long to wait for the state dir's lock (default 10)

A valued option takes its value as --option VALUE or --option=VALUE. A usage error exits
with status 2.
";

const DUMP_HELP: &str = "\
Usage: sandbox-guard --dump-checkpoints [options]

Shows what the checkpoints hold: every sandbox with its pod, IPs and generation, the owner
of each pod key marked, untrusted files flagged. Only reads, under the state dir's shared
lock.

Options:
      --state-dir DIR          state directory (default /var/lib/cni/sandbox-guard)
      --lock-timeout SECONDS   how long to wait for the state dir's lock (default 10)
  -o, --output table|json      table for people (default), JSON array for tools
      --namespace NS           only pods in namespace NS
      --pod NAME               only pods named NAME
      --pod-uid UID            only the pod with UID
      --container-id ID        only sandboxes whose ID starts with ID
  -h, --help                   this text
";

const RESTORE_HELP: &str = "\
Usage: sandbox-guard --restore [--dry-run] [options] (--all | CONTAINER-ID...)

Re-creates pod interfaces that vanished with their host parent (a NIC driver reload): the
same MAC, addresses and routes, in the same netns. Sandboxes whose interface is present are
left alone, and so are superseded ones, whose pod another sandbox owns now (their address
belongs there). Stop kubelet first. A CONTAINER-ID may be a prefix, as crictl prints them.

Options:
      --all                    every checkpointed sandbox
      --dry-run                print what would be done, change nothing
      --state-dir DIR          state directory (default /var/lib/cni/sandbox-guard)
      --lock-timeout SECONDS   how long to wait for the state dir's lock (default 10)
  -h, --help                   this text
";

const DOCTOR_HELP: &str = "\
Usage: sandbox-guard --doctor [options]

Explains this node's CNI failure classes before they bite: enslaved macvlan/ipvlan
masters, no route for the service CIDR, addresses still held by deleted or superseded
sandboxes, stale DELs per pod, store health, interfaces missing from live sandboxes. Says
per network whether its primary needs the guard (needed, with the mode; not needed, with
the source; unknown: audit first), calico's by its own version (calico -v). Only reads;
of the plugins it runs only VERSION and calico -v. Exit status 1 on any error.

Options:
      --conf-dir DIR           CNI config dir (default /etc/cni/net.d)
      --state-dir DIR          state directory (default: each conflist's stateDir)
      --log-file FILE          plugin log (default: each conflist's logFile)
      --service-cidr CIDR      Kubernetes service range, repeatable (default 10.96.0.0/12)
  -o, --output table|json      table for people (default), JSON for monitoring
      --lock-timeout SECONDS   how long to wait for a state dir's lock (default 10)
      --runtime-socket PATH    ask this runtime what it loaded (default: containerd's,
                               k3s's and CRI-O's usual sockets); none: do not ask
      --bin-dir DIR            where the primaries are (default: CNI_PATH, else the dirs
                               the runtime says it searches, else /opt/cni/bin)
  -h, --help                   this text
";

const INSTALL_HELP: &str = "\
Usage: sandbox-guard --install [options]

Copies the plugin and sandbox-guard-ctl into the dir the runtime searches for plugins
(each skipped when the same bytes are there) and puts sandbox-guard into the network the runtime runs: the one file in the conf dir that the
runtime loads (libcni's order: the lexically first .conflist, .conf or .json that parses),
or the network --network names; for multus, the cluster network it delegates to (wherever
its clusterNetwork path is). Refuses a network at a cniVersion the plugin does not speak, a
bin dir missing any of the network's plugins, and an entry key the plugin would reject.
A single-plugin .conf is never converted: delegate wraps it in place, chained is refused.
The primary's own bytes are kept beside as FILE.sandbox-guard-orig for --uninstall. Writes
only what differs (a second run writes nothing), each file through a temp file renamed into
place, keeping its mode; a single-plugin file, or one multus names by path, is written in
place (a watcher of that path sees a write, not a removal). An error writes nothing, but
where the network already names the guard and it can no longer run there (a cniVersion it
does not speak; multus thick's binDir it cannot write, holding no guard): then it takes the
guard out of that network as --uninstall would, says so and exits 1, so that pods start
unguarded rather than every ADD failing.

Options:
      --mode chained|delegate|dropin
                               chained (default): last in the list; delegate: in the
                               primary's place, the primary under \"delegate\"; dropin:
                               CONF-DIR/NETWORK/sandbox-guard.conf (libcni 1.3 runtimes:
                               containerd 2.1+, CRI-O 1.33+), the primary's file untouched
      --conf-dir DIR           CNI config dir (default /etc/cni/net.d)
      --bin-dir DIR            CNI plugin dir (default /opt/cni/bin) where the runtime
                               does not say its own: where its socket answers for the
                               conf dir (containerd's CRI status, CRI-O's config), the
                               binary goes into the dir it searches, asked on every look
      --platform auto|default|gke|k3s|openshift
                               the conf and bin dirs of that platform's runtime (default:
                               default, /etc/cni/net.d and /opt/cni/bin); auto picks by the
                               dirs that exist under --host-root. --conf-dir and --bin-dir win
      --host-root DIR          where the host's / is mounted (default /; the DaemonSet: /host)
      --network NAME           guard this network instead of the one the runtime loads
                               (the lexically first file); warns, as the runtime will not
                               run it unless told to. Multus's own network means the
                               cluster network it delegates to
      --state-dir DIR          the entry's stateDir (default: the entry's own, else
                               /var/lib/cni/sandbox-guard)
      --log-file FILE          the entry's logFile (default: the entry's own, else none)
      --entry JSON             more keys for the entry, e.g. '{\"staleDel\":\"audit\"}';
                               keys given nowhere stay as the entry has them
      --entry-file FILE        the same from a file (a ConfigMap key), read on every look
      --watch                  stay running: put the entry back whenever the primary's
                               installer rewrites its file; SIGTERM ends it
      --force                  leave delegate mode although deferred DELs wait (they stay in
                               the store, replayed only once delegate mode is back: meanwhile
                               their sandboxes' addresses may leak)
      --metrics-file FILE      with --watch: the installer's textfile for node_exporter
      --check                  write nothing: exit 0 when the guard is in the network the
                               runtime loads, can run there, and its binary is in the bin
                               dir; else 1 and why (the DaemonSet's readiness probe).
                               Asks the runtime what it loaded where its socket answers
                               (containerd's CRI status, CRI-O's config), else reads the
                               files; the first line says which
      --runtime-socket PATH    the runtime's socket, asked where it looks for plugins
                               and, by --check and --watch, what it loaded (default:
                               containerd's, k3s's and CRI-O's usual ones under
                               --host-root); none: read the files only
      --api-credentials DIR    the DaemonSet's projected ServiceAccount volume (token,
                               ca.crt): write the plugin's kubeconfig from it into the conf
                               dir (sandbox-guard.d/kubeconfig, 0600), again whenever kubelet
                               renews the token, and name it in the entry; without it, one
                               an earlier install wrote goes (docs/api-server-check.md)
      --api-server URL         with --api-credentials: the API server's https URL (default:
                               from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)
      --node-name NAME         the entry's nodeName: this node's name as kubelet registers
                               it (the DaemonSet: spec.nodeName; default: the host name)
  -h, --help                   this text
";

const UNINSTALL_HELP: &str = "\
Usage: sandbox-guard --uninstall [options]

Takes sandbox-guard out of every network file that names it: a chained entry removed, a
wrapped primary put back in its place, every drop-in and every kept original deleted; the
primary's file gets back the bytes it had before the install (a .conf converted by an
older release returns as the .conf; a .conf the primary wrote again stays, and the
converted list goes). The binary stays unless asked.

Options:
      --conf-dir DIR           CNI config dir (default /etc/cni/net.d)
      --network NAME           accepted for symmetry: every network is cleaned
      --bin-dir DIR            CNI plugin dir (default /opt/cni/bin)
      --platform, --host-root, --runtime-socket
                               as for --install
      --remove-binary          remove sandbox-guard and sandbox-guard-ctl from BIN-DIR and
                               the runtime's dir
      --force                  go on although deferred DELs wait (they stay in the store,
                               replayed only once delegate mode is back: meanwhile their
                               sandboxes' addresses may leak)
  -h, --help                   this text
";

const DOWNGRADE_HELP: &str = "\
Usage: sandbox-guard --downgrade [options]

Moves owners, deferred DELs and the refusal ledger to the keys of the release before the
pod key (\"name-and-ifname\"), rewrites every ownership, address entry and checkpoint that
is a symlink as the regular file earlier releases read (a checkpoint's text expanded), and
puts back the checkpoints an earlier release's GC set aside, under the state dir's lock;
crash-safe, and running it again changes nothing more. Run it, install
the older binary, then run it again with this release's binaries kept aside in one dir, the
plugin and sandbox-guard-ctl (a verb of this release in between moves the files back).

Options:
      --state-dir DIR          state directory (default /var/lib/cni/sandbox-guard)
      --lock-timeout SECONDS   how long to wait for the state dir's lock (default 10)
  -h, --help                   this text
";

/// The modes in the order the overview and the man page list them.
const MODES: [Mode; 6] = [
    Mode::Dump,
    Mode::Restore,
    Mode::Doctor,
    Mode::Install,
    Mode::Uninstall,
    Mode::Downgrade,
];

pub fn run(args: &[String]) -> i32 {
    // Hidden: the man page, rendered from the same text as --help (docs/sandbox-guard.1).
    if args == ["--help-man"] {
        print!("{}", man_page());
        return 0;
    }
    // Hidden: the plugin's question to the API server (cni::pod_in_api).
    if args.first().map(String::as_str) == Some(crate::cni::pod_in_api::GET_POD_FLAG) {
        return crate::tools::api::run(&args[1..]);
    }
    match parse(args) {
        Ok(Command::Help(mode)) => {
            print!("{}", mode.map_or(OVERVIEW, Mode::help));
            0
        }
        Ok(Command::Version) => {
            println!("{}", crate::cni::version::version_line());
            0
        }
        Ok(Command::Doctor(options)) => doctor::run(&options),
        Ok(Command::Install(options)) => install::run_install(&options),
        Ok(Command::Uninstall(options)) => install::run_uninstall(&options),
        Ok(Command::Downgrade {
            state_dir,
            lock_timeout,
        }) => crate::tools::downgrade::run(&state_dir, lock_timeout),
        Ok(Command::Restore {
            state_dir,
            selection,
            dry_run,
            lock_timeout,
        }) => restore::run(&state_dir, &selection, dry_run, lock_timeout),
        Ok(Command::Dump {
            state_dir,
            format,
            filter,
            lock_timeout,
        }) => match dump::run(&state_dir, format, &filter, lock_timeout) {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("sandbox-guard: {err}");
                1
            }
        },
        Err(usage) => {
            let help = usage
                .mode
                .map_or(String::new(), |mode| format!("{} ", mode.flag()));
            eprintln!(
                "sandbox-guard: {}\nRun 'sandbox-guard {help}--help' for the usage.",
                usage.msg
            );
            2
        }
    }
}

enum Command {
    /// The overview, or one mode's usage.
    Help(Option<Mode>),
    Version,
    Dump {
        state_dir: PathBuf,
        format: Format,
        filter: Filter,
        lock_timeout: Duration,
    },
    Restore {
        state_dir: PathBuf,
        selection: Selection,
        dry_run: bool,
        lock_timeout: Duration,
    },
    Doctor(doctor::Options),
    Install(install::Options),
    Uninstall(install::Options),
    Downgrade {
        state_dir: PathBuf,
        lock_timeout: Duration,
    },
}

#[cfg(test)]
impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Help(_) => "Help",
            Command::Version => "Version",
            Command::Dump { .. } => "Dump",
            Command::Restore { .. } => "Restore",
            Command::Doctor(_) => "Doctor",
            Command::Install(_) => "Install",
            Command::Uninstall(_) => "Uninstall",
            Command::Downgrade { .. } => "Downgrade",
        })
    }
}

/// A usage error, with the mode whose help it points to.
#[derive(Debug)]
struct Usage {
    mode: Option<Mode>,
    msg: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dump,
    Restore,
    Doctor,
    Install,
    Uninstall,
    Downgrade,
}

impl Mode {
    fn from_long(name: &str) -> Option<Mode> {
        match name {
            "dump-checkpoints" => Some(Mode::Dump),
            "restore" => Some(Mode::Restore),
            "doctor" => Some(Mode::Doctor),
            "install" => Some(Mode::Install),
            "uninstall" => Some(Mode::Uninstall),
            "downgrade" => Some(Mode::Downgrade),
            _ => None,
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Mode::Dump => "--dump-checkpoints",
            Mode::Restore => "--restore",
            Mode::Doctor => "--doctor",
            Mode::Install => "--install",
            Mode::Uninstall => "--uninstall",
            Mode::Downgrade => "--downgrade",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Mode::Dump => DUMP_HELP,
            Mode::Restore => RESTORE_HELP,
            Mode::Doctor => DOCTOR_HELP,
            Mode::Install => INSTALL_HELP,
            Mode::Uninstall => UNINSTALL_HELP,
            Mode::Downgrade => DOWNGRADE_HELP,
        }
    }
}

/// Every option of every mode; the modes themselves, `--help` and `--version` are apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    StateDir,
    LockTimeout,
    Output,
    Namespace,
    Pod,
    PodUid,
    ContainerId,
    All,
    DryRun,
    ConfDir,
    LogFile,
    ServiceCidr,
    BinDir,
    Network,
    InstallMode,
    Watch,
    RemoveBinary,
    Force,
    Platform,
    HostRoot,
    Entry,
    EntryFile,
    Check,
    MetricsFile,
    RuntimeSocket,
    ApiCredentials,
    ApiServer,
    NodeName,
}

impl Opt {
    const EVERY: [Opt; 28] = [
        Opt::StateDir,
        Opt::LockTimeout,
        Opt::Output,
        Opt::Namespace,
        Opt::Pod,
        Opt::PodUid,
        Opt::ContainerId,
        Opt::All,
        Opt::DryRun,
        Opt::ConfDir,
        Opt::LogFile,
        Opt::ServiceCidr,
        Opt::BinDir,
        Opt::Network,
        Opt::InstallMode,
        Opt::Watch,
        Opt::RemoveBinary,
        Opt::Force,
        Opt::Platform,
        Opt::HostRoot,
        Opt::Entry,
        Opt::EntryFile,
        Opt::Check,
        Opt::MetricsFile,
        Opt::RuntimeSocket,
        Opt::ApiCredentials,
        Opt::ApiServer,
        Opt::NodeName,
    ];

    fn from_long(name: &str) -> Option<Opt> {
        Opt::EVERY.into_iter().find(|opt| &opt.flag()[2..] == name)
    }

    fn from_short(short: char) -> Option<Opt> {
        (short == 'o').then_some(Opt::Output)
    }

    fn flag(self) -> &'static str {
        match self {
            Opt::StateDir => "--state-dir",
            Opt::LockTimeout => "--lock-timeout",
            Opt::Output => "--output",
            Opt::Namespace => "--namespace",
            Opt::Pod => "--pod",
            Opt::PodUid => "--pod-uid",
            Opt::ContainerId => "--container-id",
            Opt::All => "--all",
            Opt::DryRun => "--dry-run",
            Opt::ConfDir => "--conf-dir",
            Opt::LogFile => "--log-file",
            Opt::ServiceCidr => "--service-cidr",
            Opt::BinDir => "--bin-dir",
            Opt::Network => "--network",
            Opt::InstallMode => "--mode",
            Opt::Watch => "--watch",
            Opt::RemoveBinary => "--remove-binary",
            Opt::Force => "--force",
            Opt::Platform => "--platform",
            Opt::HostRoot => "--host-root",
            Opt::Entry => "--entry",
            Opt::EntryFile => "--entry-file",
            Opt::Check => "--check",
            Opt::MetricsFile => "--metrics-file",
            Opt::RuntimeSocket => "--runtime-socket",
            Opt::ApiCredentials => "--api-credentials",
            Opt::ApiServer => "--api-server",
            Opt::NodeName => "--node-name",
        }
    }

    fn modes(self) -> &'static [Mode] {
        match self {
            Opt::StateDir => &[
                Mode::Dump,
                Mode::Restore,
                Mode::Doctor,
                Mode::Install,
                Mode::Downgrade,
            ],
            Opt::LockTimeout => &[Mode::Dump, Mode::Restore, Mode::Doctor, Mode::Downgrade],
            Opt::Output => &[Mode::Dump, Mode::Doctor],
            Opt::Namespace | Opt::Pod | Opt::PodUid | Opt::ContainerId => &[Mode::Dump],
            Opt::All | Opt::DryRun => &[Mode::Restore],
            Opt::ConfDir => &[Mode::Doctor, Mode::Install, Mode::Uninstall],
            Opt::LogFile => &[Mode::Doctor, Mode::Install],
            Opt::ServiceCidr => &[Mode::Doctor],
            Opt::BinDir => &[Mode::Install, Mode::Uninstall, Mode::Doctor],
            Opt::Network | Opt::Platform | Opt::HostRoot => &[Mode::Install, Mode::Uninstall],
            Opt::InstallMode
            | Opt::Watch
            | Opt::Entry
            | Opt::EntryFile
            | Opt::Check
            | Opt::MetricsFile
            | Opt::ApiCredentials
            | Opt::ApiServer
            | Opt::NodeName => &[Mode::Install],
            Opt::RuntimeSocket => &[Mode::Install, Mode::Uninstall, Mode::Doctor],
            Opt::RemoveBinary => &[Mode::Uninstall],
            Opt::Force => &[Mode::Install, Mode::Uninstall],
        }
    }

    fn takes_value(self) -> bool {
        !matches!(
            self,
            Opt::All | Opt::DryRun | Opt::Watch | Opt::RemoveBinary | Opt::Check | Opt::Force
        )
    }

    fn repeatable(self) -> bool {
        self == Opt::ServiceCidr
    }
}

/// One word (or `--flag value` pair) of the command line, kept in order until the mode is
/// known.
enum Given {
    Opt(Opt, Option<String>),
    Positional(String),
}

/// True for a word that reads as a flag: `--pod --restore` is a missing value, not a pod
/// named `--restore`. No name, ID, CIDR or number starts with `--`; a path that does is given
/// attached (`--state-dir=--odd`) or as `./--odd`.
fn is_flag(word: &str) -> bool {
    word.starts_with("--") || word == "-h" || word == "-o"
}

fn fail(mode: Option<Mode>, msg: String) -> Usage {
    Usage { mode, msg }
}

fn parse(args: &[String]) -> Result<Command, Usage> {
    // The mode is named first as a rule, but a usage error or `--help` before it still
    // points to that mode's help.
    let named_mode = args
        .iter()
        .find_map(|arg| arg.strip_prefix("--").and_then(Mode::from_long));

    let mut parser = lexopt::Parser::from_args(args);
    let mut mode = None;
    let mut given = Vec::new();
    loop {
        let arg = match parser.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => break,
            Err(err) => return Err(fail(mode.or(named_mode), lexopt_message(err))),
        };
        let opt = match arg {
            Arg::Long("help") | Arg::Short('h') => return Ok(Command::Help(mode.or(named_mode))),
            Arg::Long("version") => return Ok(Command::Version),
            Arg::Value(value) => {
                given.push(Given::Positional(value.to_string_lossy().into_owned()));
                continue;
            }
            Arg::Long(name) => {
                if let Some(new) = Mode::from_long(name) {
                    match mode {
                        None => mode = Some(new),
                        Some(old) if old == new => {
                            return Err(fail(mode, format!("{} given twice", new.flag())));
                        }
                        Some(old) => {
                            return Err(fail(
                                None,
                                format!(
                                    "{} and {} are separate modes: give one of them",
                                    old.flag(),
                                    new.flag()
                                ),
                            ));
                        }
                    }
                    continue;
                }
                let known = Opt::from_long(name);
                known
                    .ok_or_else(|| fail(mode.or(named_mode), format!("unknown option --{name}")))?
            }
            Arg::Short(short) => {
                let known = Opt::from_short(short);
                known
                    .ok_or_else(|| fail(mode.or(named_mode), format!("unknown option -{short}")))?
            }
        };
        let value = if opt.takes_value() {
            // Attached (`--opt=VALUE`, `-oVALUE`) or the next word, which must not be a flag.
            let value = match parser.optional_value() {
                Some(value) => value,
                None => match parser.value() {
                    Ok(value) if !is_flag(&value.to_string_lossy()) => value,
                    Ok(_) | Err(_) => {
                        return Err(fail(
                            mode.or(named_mode),
                            format!("{} needs a value", opt.flag()),
                        ));
                    }
                },
            };
            Some(value.to_string_lossy().into_owned())
        } else {
            None
        };
        given.push(Given::Opt(opt, value));
    }
    let Some(mode) = mode else {
        return Err(fail(
            None,
            "no mode given: use --dump-checkpoints, --restore, --doctor, --install, --uninstall or --downgrade"
                .to_string(),
        ));
    };
    build(mode, given).map_err(|msg| fail(Some(mode), msg))
}

fn lexopt_message(err: lexopt::Error) -> String {
    match err {
        lexopt::Error::MissingValue {
            option: Some(option),
        } => format!("{option} needs a value"),
        lexopt::Error::UnexpectedValue { option, value } => {
            format!(
                "{option} takes no value (got {:?})",
                value.to_string_lossy()
            )
        }
        other => other.to_string(),
    }
}

/// Checks the words against `mode`'s rules, in the order given, and makes the command.
fn build(mode: Mode, given: Vec<Given>) -> Result<Command, String> {
    let mut seen = Vec::new();
    let mut state_dir = None;
    let mut lock_timeout = DEFAULT_LOCK_TIMEOUT;
    let mut format = Format::Table;
    let mut filter = Filter::default();
    let (mut all, mut dry_run, mut container_ids) = (false, false, Vec::new());
    let (mut conf_dir, mut log_file, mut service_cidrs) = (None, None, Vec::new());
    let (mut bin_dir, mut network, mut install_mode, mut watch, mut remove_binary, mut force) =
        (None, None, install::Mode::Chained, false, false, false);
    let (mut platform, mut host_root, mut entry_keys, mut entry_file, mut check, mut metrics_file) = (
        install::Platform::Default,
        None,
        Vec::new(),
        None,
        false,
        None,
    );
    let mut runtime_socket = None;
    let (mut api_credentials, mut api_server, mut node_name) = (None, None, None);
    for item in given {
        let (opt, value) = match item {
            Given::Opt(opt, value) => (opt, value.unwrap_or_default()),
            Given::Positional(id) => match mode {
                Mode::Restore => {
                    container_ids.push(container_id("container ID", id)?);
                    continue;
                }
                Mode::Dump => {
                    return Err(format!(
                        "unexpected argument {id:?}: --dump-checkpoints filters by container ID with --container-id"
                    ));
                }
                Mode::Doctor | Mode::Install | Mode::Uninstall | Mode::Downgrade => {
                    return Err(format!(
                        "unexpected argument {id:?}: {} takes options only",
                        mode.flag()
                    ));
                }
            },
        };
        let flag = opt.flag();
        if !opt.modes().contains(&mode) {
            let owners: Vec<&str> = opt.modes().iter().map(|m| m.flag()).collect();
            return Err(format!(
                "{flag} belongs to {}, not {}",
                owners.join(" and "),
                mode.flag()
            ));
        }
        if seen.contains(&opt) && !opt.repeatable() {
            let once = if opt.takes_value() {
                ": it takes one value"
            } else {
                ""
            };
            return Err(format!("{flag} given twice{once}"));
        }
        seen.push(opt);
        if opt.takes_value() && value.is_empty() {
            return Err(format!("{flag} needs a value, and it is empty"));
        }
        match opt {
            Opt::StateDir => state_dir = Some(PathBuf::from(value)),
            Opt::LockTimeout => {
                // The same bounds as the config's lockTimeoutSeconds.
                let seconds = value.parse::<f64>().map_err(|_| {
                    format!(
                        "{flag} {value:?}: give a non-negative number of seconds, such as 10 or 0.5"
                    )
                })?;
                lock_timeout = crate::cni::config::lock_timeout(flag, seconds)?;
            }
            Opt::Output => {
                format = match value.as_str() {
                    "table" => Format::Table,
                    "json" => Format::Json,
                    _ => return Err(format!("{flag} {value:?}: use table or json")),
                }
            }
            Opt::Namespace => filter.namespace = Some(value),
            Opt::Pod => filter.pod_name = Some(value),
            Opt::PodUid => filter.pod_uid = Some(value),
            Opt::ContainerId => filter.container_id = Some(container_id(flag, value)?),
            Opt::All => all = true,
            Opt::DryRun => dry_run = true,
            Opt::ConfDir => conf_dir = Some(PathBuf::from(value)),
            Opt::LogFile => log_file = Some(PathBuf::from(value)),
            Opt::BinDir => bin_dir = Some(PathBuf::from(value)),
            Opt::Network => network = Some(value),
            Opt::InstallMode => {
                install_mode = install::Mode::parse(&value)
                    .ok_or_else(|| format!("{flag} {value:?}: use chained, delegate or dropin"))?
            }
            Opt::Watch => watch = true,
            Opt::RemoveBinary => remove_binary = true,
            Opt::Force => force = true,
            Opt::Platform => {
                platform = install::Platform::parse(&value).ok_or_else(|| {
                    format!("{flag} {value:?}: use auto, default, gke, k3s or openshift")
                })?
            }
            Opt::HostRoot => host_root = Some(PathBuf::from(value)),
            Opt::Entry => entry_keys = install::entry_keys(&value, flag)?,
            Opt::EntryFile => entry_file = Some(PathBuf::from(value)),
            Opt::Check => check = true,
            Opt::MetricsFile => metrics_file = Some(PathBuf::from(value)),
            Opt::RuntimeSocket => runtime_socket = Some(PathBuf::from(value)),
            Opt::ApiCredentials => api_credentials = Some(PathBuf::from(value)),
            Opt::ApiServer => {
                if !value.starts_with("https://") {
                    return Err(format!(
                        "{flag} {value:?}: give the API server's https URL, e.g. https://10.96.0.1:443"
                    ));
                }
                api_server = Some(value)
            }
            Opt::NodeName => node_name = Some(value),
            Opt::ServiceCidr => service_cidrs.push(
                value
                    .parse()
                    .map_err(|e| format!("{flag} {value:?}: {e}"))?,
            ),
        }
    }
    let absolute = |flag: &str, path: Option<PathBuf>| match path {
        Some(path) if path.is_relative() => Err(format!(
            "{flag} {}: give an absolute path (the runtime reads the entry from anywhere)",
            path.display()
        )),
        other => Ok(other),
    };
    Ok(match mode {
        Mode::Install | Mode::Uninstall => {
            if check && watch {
                return Err(
                    "--check and --watch exclude each other: --check only looks".to_string()
                );
            }
            if metrics_file.is_some() && !watch {
                return Err(
                    "--metrics-file goes with --watch: it counts what the watch does".to_string(),
                );
            }
            let host_root =
                absolute("--host-root", host_root)?.unwrap_or_else(|| PathBuf::from("/"));
            let (platform_conf, platform_bin) = platform.dirs(&host_root);
            let conf_dir = conf_dir.unwrap_or(platform_conf);
            if api_server.is_some() && api_credentials.is_none() {
                return Err("--api-server goes with --api-credentials".to_string());
            }
            let api_access = api_credentials.map(|dir| install::ApiAccess {
                service_account_dir: dir,
                server: api_server,
            });
            if api_access.is_some() && conf_dir.is_relative() {
                return Err(format!(
                    "--api-credentials: give an absolute --conf-dir, not {} (the entry names the kubeconfig in it)",
                    conf_dir.display()
                ));
            }
            if api_access.is_some()
                && host_root != Path::new("/")
                && !conf_dir.starts_with(&host_root)
            {
                return Err(format!(
                    "--api-credentials: the conf dir {} is not under --host-root {}, so the entry could not name the kubeconfig as the host sees it",
                    conf_dir.display(),
                    host_root.display()
                ));
            }
            // The kubeconfig key, set with --api-credentials and taken out without it (the
            // installer turns the file off then: docs/api-server-check.md).
            let kubeconfig_key = install::kubeconfig_entry_key(&conf_dir, &host_root);
            let mut entry_keys = entry_keys;
            let mut unset = Vec::new();
            match api_access.is_some() {
                true => entry_keys.push(kubeconfig_key),
                false => unset.push(kubeconfig_key),
            }
            if let Some(name) = node_name {
                entry_keys.push(install::node_name_entry_key(name));
            }
            let options = install::Options {
                conf_dir,
                platform: bin_dir.is_none().then_some(platform),
                bin_dir: bin_dir.unwrap_or(platform_bin),
                host_root,
                network,
                mode: install_mode,
                entry: install::Entry {
                    state_dir: absolute("--state-dir", state_dir)?,
                    log_file: absolute("--log-file", log_file)?,
                    keys: entry_keys,
                    keys_file: entry_file,
                    unset,
                },
                watch,
                remove_binary,
                force,
                check,
                metrics_file,
                runtime_socket,
                api_access,
            };
            if mode == Mode::Install {
                Command::Install(options)
            } else {
                Command::Uninstall(options)
            }
        }
        Mode::Dump => Command::Dump {
            state_dir: state_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            format,
            filter,
            lock_timeout,
        },
        Mode::Restore => {
            let selection = match (all, container_ids.is_empty()) {
                (true, true) => Selection::All,
                (false, false) => Selection::ContainerIds(container_ids),
                (true, false) => {
                    return Err(
                        "--all and container IDs exclude each other: give one of the two"
                            .to_string(),
                    );
                }
                (false, true) => return Err("--restore needs --all or container IDs".to_string()),
            };
            Command::Restore {
                state_dir: state_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
                selection,
                dry_run,
                lock_timeout,
            }
        }
        Mode::Doctor => {
            if service_cidrs.is_empty() {
                service_cidrs.push(
                    doctor::DEFAULT_SERVICE_CIDR
                        .parse()
                        .map_err(|e| format!("{e}"))?,
                );
            }
            Command::Doctor(doctor::Options {
                conf_dir: conf_dir.unwrap_or_else(|| PathBuf::from(doctor::DEFAULT_CONF_DIR)),
                // The conflists' stateDirs unless the operator named one.
                state_dir,
                log_file,
                service_cidrs,
                format,
                lock_timeout,
                runtime_socket,
                bin_dir,
            })
        }
        Mode::Downgrade => Command::Downgrade {
            state_dir: state_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            lock_timeout,
        },
    })
}

/// A container ID or a prefix of one: not empty, and plain as the plugin requires of the IDs
/// it records ([A-Za-z0-9_.-], see `names::check_plain`), so that no argument selects every
/// sandbox or reads as a path. A prefix that fails the rule could match no recorded ID.
fn container_id(what: &str, id: String) -> Result<String, String> {
    if id.is_empty() {
        return Err(format!("{what} is empty: give an ID or a prefix of one"));
    }
    names::check_plain(what, &id, names::MAX_CONTAINER_ID, Kind::InvalidEnvironment)
        .map_err(|err| err.msg)?;
    Ok(id)
}

/// Non-negative decimal seconds (`10`, `0.5`, `.25`, `3.`), exact to the nanosecond.
/// The man page in roff: the overview as its description and each mode's help as a section,
/// so that `--help` and `man` never say different things.
fn man_page() -> String {
    let mut out = format!(
        ".TH SANDBOX-GUARD 1 \"\" \"sandbox-guard {}\" \"User Commands\"\n",
        env!("CARGO_PKG_VERSION")
    );
    out.push_str(".SH NAME\nsandbox-guard \\- keep the stale CNI DEL of an old pod sandbox away from the primary plugin\n");
    out.push_str(".SH SYNOPSIS\n");
    for mode in MODES {
        if let Some(usage) = mode
            .help()
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("Usage: "))
        {
            out.push_str(&format!("{}\n.br\n", roff_escape(usage)));
        }
    }
    out.push_str("sandbox\\-guard \\-\\-version\n.SH DESCRIPTION\n");
    out.push_str(&roff_body(OVERVIEW));
    for mode in MODES {
        out.push_str(&format!(
            ".SH {}\n",
            roff_escape(&mode.flag()[2..].to_uppercase())
        ));
        out.push_str(&roff_body(mode.help()));
    }
    out.push_str(".SH SEE ALSO\nThe documentation in the source tree: README.md and docs/.\n");
    out
}

/// Plain help text as roff: paragraphs, bold headings (`Options:`), and tagged items for
/// the lines laid out as a term, two or more spaces, and its description (a deeper indent
/// continues the description).
fn roff_body(help: &str) -> String {
    let mut out = String::new();
    let mut paragraph: Vec<&str> = Vec::new();
    let flush = |out: &mut String, paragraph: &mut Vec<&str>| {
        if !paragraph.is_empty() {
            out.push_str(".PP\n");
            out.push_str(&roff_escape(&paragraph.join(" ")));
            out.push('\n');
            paragraph.clear();
        }
    };
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(usage) = line.strip_prefix("Usage: ") {
            flush(&mut out, &mut paragraph);
            out.push_str(&format!(".PP\n\\fB{}\\fR\n", roff_escape(usage)));
        } else if trimmed.is_empty() {
            flush(&mut out, &mut paragraph);
        } else if indent == 0 && trimmed.ends_with(':') && !trimmed.contains(". ") {
            flush(&mut out, &mut paragraph);
            out.push_str(&format!(".PP\n\\fB{}\\fR\n", roff_escape(trimmed)));
        } else if indent > 0 && indent <= 6 {
            flush(&mut out, &mut paragraph);
            let (term, description) = match trimmed.split_once("  ") {
                Some((term, description)) => (term, description.trim_start()),
                None => (trimmed, ""),
            };
            out.push_str(&format!(".TP\n\\fB{}\\fR\n", roff_escape(term)));
            if !description.is_empty() {
                out.push_str(&roff_escape(description));
                out.push('\n');
            }
        } else if indent > 6 {
            out.push_str(&roff_escape(trimmed));
            out.push('\n');
        } else {
            paragraph.push(trimmed);
        }
    }
    flush(&mut out, &mut paragraph);
    out
}

/// Text safe in roff: backslashes and hyphens escaped, no line starting as a request.
fn roff_escape(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    /// In each help text every description starts in one column, continuation lines too,
    /// and nothing contradicts delegate mode (which is not "last in the conflist").
    #[test]
    fn help_columns_are_aligned_and_true_for_every_mode() {
        for (name, help) in std::iter::once(("overview", OVERVIEW))
            .chain(MODES.iter().map(|mode| (mode.flag(), mode.help())))
        {
            let mut columns = std::collections::BTreeSet::new();
            for line in help.lines() {
                let trimmed = line.trim_start();
                let indent = line.len() - trimmed.len();
                if trimmed.is_empty() || indent == 0 {
                    continue;
                }
                if indent > 6 {
                    columns.insert(indent);
                } else if let Some((term, _)) = trimmed.split_once("  ") {
                    let description = &trimmed[term.len()..];
                    columns.insert(
                        indent + term.len() + description.len() - description.trim_start().len(),
                    );
                }
            }
            assert_eq!(
                columns.len(),
                1,
                "{name}: descriptions start at columns {columns:?}"
            );
            assert!(!help.contains("list it LAST"), "{name}");
        }
    }

    use super::*;

    fn parse_words(words: &[&str]) -> Result<Command, Usage> {
        parse(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn lock_timeout_reaches_every_mode() {
        let half = Duration::from_millis(500);
        match parse_words(&["--dump-checkpoints", "--lock-timeout", "0.5"]) {
            Ok(Command::Dump { lock_timeout, .. }) => assert_eq!(lock_timeout, half),
            other => panic!("{other:?}"),
        }
        match parse_words(&["--restore", "--all", "--lock-timeout=0.5"]) {
            Ok(Command::Restore { lock_timeout, .. }) => assert_eq!(lock_timeout, half),
            other => panic!("{other:?}"),
        }
        match parse_words(&["--doctor", "--lock-timeout", ".5"]) {
            Ok(Command::Doctor(options)) => assert_eq!(options.lock_timeout, half),
            other => panic!("{other:?}"),
        }
        match parse_words(&["--doctor"]) {
            Ok(Command::Doctor(options)) => assert_eq!(options.lock_timeout, DEFAULT_LOCK_TIMEOUT),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn runtime_socket_for_every_install() {
        assert!(parse_words(&["--install", "--runtime-socket", "/run/x.sock"]).is_ok());
        assert!(parse_words(&["--uninstall", "--runtime-socket", "/run/x.sock"]).is_ok());
        assert!(parse_words(&["--install", "--watch", "--runtime-socket", "/run/x.sock"]).is_ok());
        match parse_words(&["--install", "--check", "--runtime-socket=none"]) {
            Ok(Command::Install(options)) => {
                assert_eq!(options.runtime_socket, Some(PathBuf::from("none")))
            }
            _ => panic!("--runtime-socket with --check"),
        }
    }

    #[test]
    fn api_credentials_name_the_kubeconfig_as_the_host_sees_it_and_its_absence_unsets_it() {
        let words = |extra: &[&str]| {
            let mut words = vec!["--install", "--host-root", "/host", "--conf-dir"];
            words.extend(extra);
            parse_words(&words)
        };
        let named = r#"["kubeconfig","/etc/cni/net.d/sandbox-guard.d/kubeconfig"]"#;
        match words(&[
            "/host/etc/cni/net.d",
            "--api-credentials",
            "/sa",
            "--node-name",
            "n1",
        ]) {
            Ok(Command::Install(options)) => {
                let keys = serde_json::to_string(&options.entry.keys).unwrap();
                assert_eq!(keys, format!(r#"[{named},["nodeName","n1"]]"#));
                assert!(options.entry.unset.is_empty());
            }
            other => panic!("{other:?}"),
        }
        match words(&["/host/etc/cni/net.d"]) {
            Ok(Command::Install(options)) => {
                let unset = serde_json::to_string(&options.entry.unset).unwrap();
                assert_eq!(unset, format!("[{named}]"));
            }
            other => panic!("{other:?}"),
        }
        for outside in ["/etc/cni/net.d", "net.d"] {
            assert!(
                words(&[outside, "--api-credentials", "/sa"]).is_err(),
                "{outside}"
            );
        }
        assert!(parse_words(&["--install", "--api-server", "https://x:6443"]).is_err());
    }

    #[test]
    fn doctor_state_dir_only_when_given() {
        match parse_words(&[
            "--doctor",
            "--service-cidr",
            "10.0.0.0/16",
            "--service-cidr=fd00::/108",
        ]) {
            Ok(Command::Doctor(options)) => {
                assert_eq!(options.state_dir, None);
                assert_eq!(options.service_cidrs.len(), 2);
                assert_eq!(options.conf_dir, PathBuf::from(doctor::DEFAULT_CONF_DIR));
            }
            other => panic!("{other:?}"),
        }
        match parse_words(&["--doctor", "--state-dir=/s", "-o", "json"]) {
            Ok(Command::Doctor(options)) => {
                assert_eq!(options.state_dir, Some(PathBuf::from("/s")));
                assert_eq!(
                    options.service_cidrs,
                    vec![doctor::DEFAULT_SERVICE_CIDR.parse().unwrap()]
                );
                assert!(matches!(options.format, Format::Json));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn restore_selection() {
        match parse_words(&["--restore", "abc", "--dry-run", "d.e_f-1"]) {
            Ok(Command::Restore {
                selection: Selection::ContainerIds(ids),
                dry_run: true,
                ..
            }) => {
                assert_eq!(ids, ["abc", "d.e_f-1"])
            }
            other => panic!("{other:?}"),
        }
        match parse_words(&["--restore", "--all"]) {
            Ok(Command::Restore {
                selection: Selection::All,
                dry_run: false,
                state_dir,
                ..
            }) => {
                assert_eq!(state_dir, PathBuf::from(DEFAULT_STATE_DIR))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_flag_is_not_taken_for_a_value() {
        let err = parse_words(&["--dump-checkpoints", "--pod", "--restore"]).unwrap_err();
        assert_eq!(err.msg, "--pod needs a value");
        match parse_words(&["--dump-checkpoints", "--pod=--restore"]) {
            Ok(Command::Dump { filter, .. }) => {
                assert_eq!(filter.pod_name.as_deref(), Some("--restore"))
            }
            other => panic!("{other:?}"),
        }
    }
}
