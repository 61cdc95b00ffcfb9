//! The overhead bench's figures and their table: what [`crate::experiments::overhead`]
//! measures and the report prints (the arms' names, plain Envoy against Envoy with the filter
//! per body size, every arm at every prompt size).

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Straight to the backend: the baseline.
pub const DIRECT: &str = "direct";
/// Plain Envoy.
pub const ENVOY: &str = "envoy";
/// Envoy with the filter (and its sidecar).
pub const ENVOY_FILTER: &str = "envoy_filter";
/// Envoy with a BUFFERED ext_proc filter and a no-op ext_proc server: the picker floor.
pub const ENVOY_EXT_PROC: &str = "envoy_ext_proc";
/// The project's own arms, in order.
pub const ARMS: [&str; 4] = [DIRECT, ENVOY, ENVOY_FILTER, ENVOY_EXT_PROC];
/// SMG 1.13 (SGLang's gateway) with its default policy (`cache_aware`).
pub const SMG: &str = "smg";
/// vllm-router 0.1.17 with its default policy (`cache_aware`).
pub const VLLM_ROUTER: &str = "vllm_router";

/// One body size of the overhead bench: plain Envoy vs Envoy with the filter, same run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OverheadCase {
    /// Request body size, bytes.
    pub body_bytes: usize,
    /// Latency without the filter, p50 / p99, ms (sequential requests).
    pub plain_p50_ms: f64,
    /// See `plain_p50_ms`.
    pub plain_p99_ms: f64,
    /// Latency with the filter, p50 / p99, ms.
    pub filter_p50_ms: f64,
    /// See `filter_p50_ms`.
    pub filter_p99_ms: f64,
    /// filter − plain at p50, ms.
    pub added_p50_ms: f64,
    /// filter − plain at p99, ms.
    pub added_p99_ms: f64,
    /// filter / plain at p50.
    pub p50_ratio: f64,
    /// filter / plain at p99.
    pub p99_ratio: f64,
    /// Closed-loop maximum requests/s without the filter.
    pub plain_max_rps: f64,
    /// Closed-loop maximum requests/s with the filter.
    pub filter_max_rps: f64,
    /// filter / plain max requests/s.
    pub rps_ratio: f64,
    /// Envoy CPU time (all threads) per request in the closed loop without the filter, µs.
    pub plain_cpu_us: f64,
    /// Same, with the filter.
    pub filter_cpu_us: f64,
    /// plain / filter CPU per request: the req/s ratio a CPU-bound Envoy would reach, measured
    /// as CPU time, which other load on a shared machine disturbs far less than throughput.
    pub cpu_ratio: f64,
    /// Envoy CPU per sequential request (the latency phase) without the filter, µs.
    pub plain_seq_cpu_us: f64,
    /// Same, with the filter.
    pub filter_seq_cpu_us: f64,
    /// Errors seen in either arm.
    pub errors: u64,
}

/// One arm at one prompt size: the field's two figures and what they derive from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ArmFigures {
    /// Arm name.
    pub arm: String,
    /// Prompt bytes (the user message).
    pub prompt_bytes: usize,
    /// The whole request body, bytes.
    pub body_bytes: usize,
    /// Sequential requests answered 2xx.
    pub requests: usize,
    /// Sequential latency (full exchange), mean / p50 / p99, ms.
    pub mean_ms: f64,
    /// See `mean_ms`.
    pub p50_ms: f64,
    /// See `mean_ms`.
    pub p99_ms: f64,
    /// Mean minus direct's mean, ms: the router's added latency.
    pub added_mean_ms: f64,
    /// p50 minus direct's p50, ms.
    pub added_p50_ms: f64,
    /// p99 minus direct's p99, ms (tails side by side, not the router's own p99).
    pub added_p99_ms: f64,
    /// Closed-loop requests/s.
    pub max_rps: f64,
    /// CPU of every process of the router per 1,000 requests in the closed loop, ms (0 for
    /// direct, which has none; NaN when not measured).
    pub cpu_ms_per_1k: f64,
    /// The same per process label (`envoy`, `sidecar`, `extproc`, …).
    pub cpu_ms_per_1k_by_process: BTreeMap<String, f64>,
    /// Failed requests (sequential and closed loop).
    pub errors: u64,
}

/// "290 B", "2 KiB", "2.1 KiB", "200 KiB".
pub fn size_label(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else if bytes % 1024 == 0 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// The per-arm table of the report (markdown): one row per arm and size.
pub fn arms_table(arms: &[ArmFigures]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| prompt | arm | mean ms | added mean ms | p50 ms | added p50 ms | p99 ms | added p99 ms | max req/s | router CPU ms / 1,000 req | × envoy_filter's | by process | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for a in arms {
        let filter_cpu = arms
            .iter()
            .find(|x| x.arm == ENVOY_FILTER && x.prompt_bytes == a.prompt_bytes)
            .map_or(f64::NAN, |x| x.cpu_ms_per_1k);
        let by: Vec<String> = a
            .cpu_ms_per_1k_by_process
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect();
        let rel = if a.processes_counted() {
            format!("{:.2}×", a.cpu_ms_per_1k / filter_cpu)
        } else {
            "–".to_string()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:+.3} | {:.3} | {:+.3} | {:.3} | {:+.3} | {:.0} | {:.1} | {rel} | {} | {} |",
            size_label(a.prompt_bytes),
            a.arm,
            a.mean_ms,
            a.added_mean_ms,
            a.p50_ms,
            a.added_p50_ms,
            a.p99_ms,
            a.added_p99_ms,
            a.max_rps,
            a.cpu_ms_per_1k,
            if by.is_empty() { "–".to_string() } else { by.join(", ") },
            a.errors
        );
    }
    out
}

impl ArmFigures {
    /// Whether the arm has router processes (not `direct`).
    pub(crate) fn processes_counted(&self) -> bool {
        !self.cpu_ms_per_1k_by_process.is_empty()
    }
}
