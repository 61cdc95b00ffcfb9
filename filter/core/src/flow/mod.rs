//! Flow control: requests wait in the proxy while their pool is full, instead of joining a pod's
//! queue early (issue 21, "hold, don't dump").
//!
//! Two parts, both pure (time is passed in, nothing here knows proxy-wasm):
//!
//! - [`admit`]: the admission stage of [`crate::Router`]'s pipeline. Given the pool's pods as the
//!   router sees them (trusted gauges, this proxy's live load table) and the request's predicted
//!   work, can some pod take it without passing a saturation bound? If none can, the request
//!   waits; the pods that can are the only candidates the ranking chooses from.
//! - [`queue`]: where waiting requests wait, per pool: bands by integer priority (strict order,
//!   higher first), round robin between fairness ids within a band, first come first served
//!   within one id; per priority class bounds (`max_requests`, `max_bytes`) and a time to live.
//!
//! Priority classes follow llm-d's `InferenceObjective.priority`: `< 0` sheddable, `0` standard,
//! `> 0` critical. Sheddable requests are the first to go: they are refused when the pool is
//! saturated (as before flow control), and a waiting sheddable request is displaced when the
//! queue is full and a request of a higher class arrives.

pub mod admit;
pub mod queue;
pub mod summary;

pub use admit::{admit, Admission, PodRoom};
pub use queue::{Band, Pushed, Queue, Refusal};
// The `flow` section of the configuration, defined with the rest of it.
pub use crate::config::{BandLimits, FlowConfig};
