//! STATUS: can the plugin serve an ADD now? Only if the state dir takes a write.

use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::state::Store;

pub fn run(inv: &Invocation) -> Result<()> {
    let unavailable = |e: GuardError| {
        GuardError::new(
            Kind::NotAvailable,
            format!("sandbox-guard cannot record new pods: {}", e.msg),
        )
        .with_details(e.details)
    };
    // A held lock is no reason to report the network down (the runtime stops scheduling
    // pods here on a STATUS error) unless it outlasts the wait an ADD would give it.
    crate::state::ensure_dir(&inv.conf.state_dir).map_err(unavailable)?;
    let store = Store::open_read_only(&inv.conf.state_dir).map_err(unavailable)?;
    drop(
        store
            .read_lock(inv.conf.lock_timeout, &|_| {})
            .map_err(unavailable)?,
    );
    crate::state::probe_write(store.root(), true).map_err(unavailable)
}
