//! sandbox-guard: a chained CNI plugin that checkpoints pod attachments and refuses the
//! stale DEL of an old sandbox once a newer sandbox owns the same pod name. The library the
//! plugin's binary (src/main.rs), its tests and its bench are built on.

pub mod clock;
pub mod cni;
pub mod error;
pub mod kernel;
pub mod names;
pub mod state;
pub mod tools;
