//! STATUS: can the plugin serve an ADD now? Only if the state dir takes a write.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::state::Store;

pub fn run(inv: &Invocation) -> Result<()> {
    let unavailable = |e: GuardError| {
        GuardError::new(Kind::NotAvailable, format!("sandbox-guard cannot record new pods: {}", e.msg)).with_details(e.details)
    };
    // A held lock is no reason to report the network down (the runtime stops scheduling
    // pods here on a STATUS error) unless it outlasts the wait an ADD would give it.
    crate::state::ensure_dir(&inv.conf.state_dir).map_err(unavailable)?;
    let store = Store::open_read_only(&inv.conf.state_dir).map_err(unavailable)?;
    drop(store.read_lock(inv.conf.lock_timeout, &|_| {}).map_err(unavailable)?);
    // Permission bits do not stop root, and a read-only or full filesystem shows only on
    // a real write: make one.
    let probe = store.root().join(format!(".status.{}.tmp", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"status probe\n").and_then(|()| f.sync_data()));
    let _ = fs::remove_file(&probe);
    written.map_err(|e| unavailable(GuardError::io("write a probe file in", store.root(), e)))
}
