//! The CNI protocol: what the runtime hands the plugin (environment, config, the primary's
//! result), the versions it speaks, the operation log, and the verbs themselves.

pub mod config;
pub mod delegate;
pub mod env;
pub mod invocation;
pub mod log;
pub mod log_entry;
pub mod metrics;
pub mod pod_in_api;
pub mod rejected;
pub mod result;
pub mod verbs;
pub mod version;
