//! A vLLM-like model-server emulator that behaves like a GPU under load.
//!
//! Every routing claim of this project is measured against pods we cannot run here (no GPUs),
//! so this crate emulates them: continuous batching, a paged KV cache with prefix caching and
//! preemption, LoRA slots, per-GPU speed profiles, OpenAI endpoints (streaming and not), and
//! vLLM's (or SGLang's) Prometheus metrics, with fault injection for tests.
//!
//! - [`engine`]: the pure, clock-injected engine model (tests drive it without sleeping);
//! - [`server`]: one pod = one port, the engine on a real clock behind hyper;
//! - [`config`]: the command line and fleet files; [`profile`]: GPU defaults (see
//!   `CALIBRATION.md`); [`metrics`]: `/metrics` text; [`openai`]: response bodies;
//!   [`introspect`]: what routers read besides inference (render, tokenize, load, server info);
//!   [`prompt`]: request parsing and token counting; [`synthetic`]: metrics-only pods.

pub mod config;
pub mod engine;
pub mod introspect;
pub mod kv;
pub mod lora;
pub mod metrics;
pub mod openai;
pub mod profile;
pub mod prompt;
pub mod server;
pub mod synthetic;
