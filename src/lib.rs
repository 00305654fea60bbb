//! sandbox-guard: a chained CNI plugin that checkpoints pod attachments and refuses the
//! stale DEL of an old sandbox once a newer sandbox owns the same pod name. The library its two
//! binaries are built on: the plugin (src/main.rs) and the operator's commands
//! (src/bin/sandbox-guard-ctl.rs); so are its tests and its bench.

pub mod clock;
pub mod cni;
pub mod error;
pub mod kernel;
pub mod names;
pub mod state;
pub mod tools;

/// The operator's binary, which the plugin execs from beside itself when it is given a
/// command line (src/bin/sandbox-guard-ctl.rs).
pub const CTL_BINARY: &str = "sandbox-guard-ctl";
