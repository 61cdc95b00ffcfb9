//! From measured samples to figures: [`stats`] (the one percentile definition, a run's summary),
//! [`confidence`] (per-seed ratios and their Student-t intervals), [`diagnostics`] (what happened
//! inside a run), [`podmetrics`] (what the pods' `/metrics` say), [`procfs`] (a process's CPU
//! and memory).

pub mod confidence;
pub mod diagnostics;
pub mod podmetrics;
pub mod procfs;
pub mod stats;
