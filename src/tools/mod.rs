//! The operator's side: the command line and what it runs by hand, never on a runtime's
//! exec: the checkpoint dump, `--restore`, `--doctor`, and `--install`/`--uninstall`.

pub mod api;
pub mod cli;
pub mod doctor;
pub mod downgrade;
pub mod dump;
pub mod install;
pub mod plugin_exec;
pub mod primaries;
pub mod restore;
pub mod runtime;

/// `count` and the noun, singular or plural as the count asks.
pub(crate) fn counted(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}
