//! The routing decision of wasm-llm-router, as plain Rust.
//!
//! Snapshot + request → ranked pods or a rejection. Nothing here knows proxy-wasm: shared state
//! is reached through the [`store::SharedStore`] trait, time and randomness are passed in. The
//! same code is tested natively, runs inside the Wasm filter under wasmtime, and inside Envoy.
//!
//! - [`config`]: the plugin configuration, validated at load.
//! - [`priority`]: the priority classes (sheddable, standard, critical).
//! - [`request`]: one pass over an OpenAI / Anthropic body → model, stream, prompt pieces.
//! - [`prefix`]: chained block hashes and the shared, bounded prefix index.
//! - [`replica_prior`]: where other gateway replicas probably put a prompt this one has not seen.
//! - [`placed`]: the ring of long contexts this replica placed, served to the other replicas.
//! - [`inflight`]: this proxy's load per pod (in flight, pending prefill work, learned rate),
//!   shared by all workers.
//! - [`predict`]: time to first token per pod, learned from the proxy's own traffic.
//! - [`lora`]: adapter homes (bounded-load rendezvous) and inferred residency.
//! - [`candidate`]: a pod and a request as the ranking sees them.
//! - [`score`]: scorers (one per file), saturation and ranking.
//! - [`weights`]: the scorers' names, the weight presets and a pool's weights.
//! - [`trust`]: bounds on what one pod's reports and timing can claim.
//! - [`rewrite`]: canary and weighted model rewrites (`InferenceModelRewrite`-like rules).
//! - [`router`]: the decision for one request.
//! - [`reject`]: OpenAI-style error replies.
//! - [`metrics`]: metric names and their labels as Envoy stat names.
//! - [`usage`]: token usage read from response bodies as they stream past.

pub mod candidate;
pub mod config;
pub mod flow;
pub mod inflight;
pub mod lora;
pub mod metrics;
pub mod placed;
pub mod predict;
pub mod prefix;
pub mod priority;
pub mod reject;
pub mod replica_prior;
pub mod request;
pub mod rewrite;
pub mod router;
pub mod score;
mod shortlist;
pub mod store;
pub mod trust;
pub mod usage;
pub mod weights;
mod wire;

pub use config::Config;
pub use reject::Rejection;
pub use request::{parse, ApiKind, ParsedRequest, RequestError};
pub use router::{Context, Fleet, Hold, Route, RouteMode, Router};
pub use store::{MemoryStore, SharedStore, StoreError};
