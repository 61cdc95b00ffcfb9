//! Load generator, benchmark scenarios, report and demo for wasm-llm-router.
//!
//! The benchmark decides whether the product works: the same seeded open-loop workload is sent
//! through the same real Envoy to fresh emulated pods under Envoy's own balancers and under the
//! filter, and the report compares them against the targets of the issue.

pub mod arrivals;
pub mod calibrate;
pub mod chart;
pub mod client;
pub mod confidence;
pub mod dashboard_chart;
pub mod demo;
pub mod diagnostics;
pub mod fleet;
pub mod flowbench;
pub mod instant;
pub mod loadgen;
pub mod overhead;
pub mod podmetrics;
pub mod procfs;
pub mod realpods;
pub mod report;
pub mod runner;
pub mod scale;
pub mod scenario_names;
pub mod scenarios;
pub mod sidecar_cost;
pub mod soak;
pub mod sse;
pub mod stack;
pub mod stats;
pub mod workload;
