//! Load generator, benchmark scenarios, report and demo for wasm-llm-router.
//!
//! The benchmark decides whether the product works: the same seeded open-loop workload is sent
//! through the same real Envoy to fresh emulated pods under Envoy's own balancers and under the
//! filter, and the report compares them against the targets of the issue.
//!
//! The folders split the work as the field's tools do (inference-perf: datagen/, loadgen/,
//! client/, reportgen/), each depending only on those listed before it:
//!
//! | module | what it holds |
//! |---|---|
//! | [`scenario_names`] | the scenario names in table order (a leaf: the report and the scenarios both read it) |
//! | [`loadgen`] | what is sent and how: arrivals, workloads, the HTTP/SSE client, the open-loop generator, the instant backend |
//! | [`analysis`] | from samples to figures: percentiles and summaries, intervals over seeds, per-run diagnostics, pod metrics, `/proc` |
//! | [`stack`] | what a run starts: pods (emulated or real vLLM), the sidecar, Envoy or a peer router (`testkit::stack`, re-exported: the `e2e` tests start the same stacks) |
//! | [`report`] | the JSON contract, the Markdown tables, the verdicts against the targets, the charts |
//! | [`experiments`] | each `bench` subcommand: its scenarios, its runner, its CLI arguments |

pub mod analysis;
pub mod experiments;
pub mod loadgen;
pub mod report;
pub mod scenario_names;
pub use testkit::stack;

// The paths the integration tests (`tests/`, `e2e`) name: unchanged by the folders.
pub use analysis::stats;
pub use experiments::{runner, scenarios};
pub use loadgen::{arrivals, client, workload};
pub use stack::fleet;
