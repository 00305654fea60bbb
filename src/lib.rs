//! sandbox-guard: a chained CNI plugin that checkpoints pod attachments and refuses the
//! stale DEL of an old sandbox once a newer sandbox owns the same pod name. The library its two
//! binaries are built on: the plugin (src/main.rs) and the operator's commands
//! (src/bin/sandbox-guard-ctl.rs); so are its tests and its bench.

/// `eprintln!` that cannot abort the plugin. Its stderr is often a pipe of the runtime that
/// ran it (libcni reads it into a buffer), and a runtime that exits mid-call leaves that pipe
/// without a reader: a line nobody can read is dropped, where `eprintln!` would panic.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// musl's allocator maps and unmaps a group of slots at a time, dozens of system calls in one
/// ADD; dlmalloc takes the kernel's memory in segments of 64 KiB and more (docs/benchmarks.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

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
