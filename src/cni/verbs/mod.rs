//! One file per CNI verb. Each gets the parsed invocation and returns what goes to stdout.

pub mod add;
mod api_check;
pub mod check;
pub mod del;
pub mod delegated;
pub mod gc;
pub mod ip_conflict;
mod judgement;
pub mod mode;
mod old_interface;
pub mod pending;
pub mod replay;
pub mod status;

pub use crate::cni::invocation::Invocation;
