//! From a run's samples to the figures we publish (percentiles, rates, error counts, pod shares).
//!
//! Every number of the report is computed here from the measured samples and nothing else, so a
//! test can feed known samples and check each figure. Failed and timed-out requests count as +∞
//! in the TTFT and end-to-end percentiles (a router cannot win by dropping requests); the JSON
//! writes +∞ as `null`.

use crate::loadgen::RunResult;
use serde::Serialize;
use std::collections::BTreeMap;

/// The bench's one percentile definition, nearest rank: the 1-based rank, in `n` values sorted
/// ascending, of the `p`th percentile (`p` in 0..=100): ⌈p/100 · n⌉, at least 1 and at most `n`
/// (`n` ≥ 1). Every percentile the bench prints (report, intervals, soak, scale, overhead) and
/// every count of samples at or above one (`p99_tail_samples`) comes from this rank.
pub fn nearest_rank(p: f64, n: usize) -> usize {
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    rank.clamp(1, n)
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted values; NaN when there are none.
/// Non-finite values are left out: figures of served requests only (see [`percentile_inf`]).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[nearest_rank(p, v.len()) - 1]
}

/// [`percentile`]'s definition over values that may hold +∞ (NaN when empty): a failed request
/// counts as +∞ and stays in, above every served one, so a router cannot win by dropping
/// requests. Works in place (reorders `v`) and selects rather than sorts: the intervals over
/// seeds call it once per resample.
pub fn percentile_inf(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let k = nearest_rank(p, v.len()) - 1;
    let (_, x, _) = v.select_nth_unstable_by(k, f64::total_cmp);
    *x
}

/// The figures of one router in one scenario. The first eight fields are the JSON contract.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Summary {
    /// TTFT median, ms (failed requests count as +∞).
    pub ttft_p50_ms: f64,
    /// TTFT 90th percentile, ms (the shared-prefix verdict reads it beside p95).
    pub ttft_p90_ms: f64,
    /// TTFT 95th percentile, ms.
    pub ttft_p95_ms: f64,
    /// TTFT 99th percentile, ms.
    pub ttft_p99_ms: f64,
    /// End-to-end 95th percentile, ms (failed requests count as +∞).
    pub e2e_p95_ms: f64,
    /// Successful requests per second of the measurement window.
    pub throughput_rps: f64,
    /// Output tokens (usage) of successful requests per second of wall time.
    pub output_tokens_per_s: f64,
    /// Requests sent.
    pub requests: u64,
    /// Requests that failed (non-2xx, transport, stream error, timeout).
    pub errors: u64,
    /// TTFT mean, ms (successful requests only).
    pub ttft_mean_ms: f64,
    /// End-to-end median, ms.
    pub e2e_p50_ms: f64,
    /// End-to-end 99th percentile, ms.
    pub e2e_p99_ms: f64,
    /// Inter-token latency median over all gaps, ms.
    pub itl_p50_ms: f64,
    /// Inter-token latency 95th percentile, ms.
    pub itl_p95_ms: f64,
    /// Inter-token latency 99th percentile, ms.
    pub itl_p99_ms: f64,
    /// Errors by kind: the HTTP status, or `transport`/`timeout`/`stream`.
    pub errors_by_status: BTreeMap<String, u64>,
    /// Share of successful requests served by each pod (0..=1).
    pub pod_share: BTreeMap<String, f64>,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
    /// Worst lateness of the load generator's sends, ms (should stay small).
    pub max_send_lag_ms: f64,
    /// Failed ÷ sent (0..=1); gated at 1 %.
    pub error_rate: f64,
    /// Highest offered rate (req/s, emulated time) with TTFT p95 ≤ the scenario's SLO and
    /// errors ≤ 1 % (`None` when the scenario had no rate sweep).
    pub goodput_rps: Option<f64>,
    /// Per-pod and fleet diagnostics of the measurement window (multi-seed runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::analysis::diagnostics::Diagnostics>,
    /// Scenario-specific figures (e.g. `adapter_loads`, `prefix_hit_rate`, `preemptions`).
    #[serde(flatten)]
    pub extra: BTreeMap<String, f64>,
}

pub fn error_kind(status: u16, error: &str) -> String {
    if status != 0 && !(200..300).contains(&status) {
        status.to_string()
    } else if error.starts_with("timeout") {
        "timeout".to_string()
    } else if status == 0 {
        "transport".to_string()
    } else {
        "stream".to_string()
    }
}

/// Summarise a run.
pub fn summarize(run: &RunResult) -> Summary {
    let mut ttft = Vec::new();
    let mut e2e = Vec::new();
    let mut itl = Vec::new();
    let mut tokens = 0u64;
    let mut ok = 0u64;
    let mut errors_by_status = BTreeMap::new();
    let mut pods: BTreeMap<String, u64> = BTreeMap::new();
    let mut max_lag = 0.0f64;
    for s in &run.samples {
        max_lag = max_lag.max(s.lag_ms);
        let o = &s.outcome;
        if o.ok() {
            ok += 1;
            // A success without a content chunk has no first token: it counts as unbounded.
            ttft.push(o.ttft_ms.unwrap_or(f64::INFINITY));
            e2e.push(o.e2e_ms);
            itl.extend_from_slice(&o.itl_ms);
            tokens += o.output_tokens.unwrap_or(u64::from(o.content_chunks));
            if let Some(p) = &o.pod {
                *pods.entry(p.clone()).or_default() += 1;
            }
        } else {
            ttft.push(f64::INFINITY);
            e2e.push(f64::INFINITY);
            let kind = error_kind(o.status, o.error.as_deref().unwrap_or(""));
            *errors_by_status.entry(kind).or_default() += 1;
        }
    }
    let requests = run.samples.len() as u64;
    let wall = if run.wall_s > 0.0 {
        run.wall_s
    } else {
        f64::NAN
    };
    let served: u64 = pods.values().sum();
    let pod_share = pods
        .into_iter()
        .map(|(k, v)| (k, v as f64 / served as f64))
        .collect();
    let pct = |v: &[f64], p: f64| percentile_inf(&mut v.to_vec(), p);
    let served_ttft: Vec<f64> = ttft.iter().copied().filter(|t| t.is_finite()).collect();
    Summary {
        ttft_p50_ms: pct(&ttft, 50.0),
        ttft_p90_ms: pct(&ttft, 90.0),
        ttft_p95_ms: pct(&ttft, 95.0),
        ttft_p99_ms: pct(&ttft, 99.0),
        e2e_p95_ms: pct(&e2e, 95.0),
        throughput_rps: ok as f64 / wall,
        output_tokens_per_s: tokens as f64 / wall,
        requests,
        errors: requests - ok,
        ttft_mean_ms: if served_ttft.is_empty() {
            f64::NAN
        } else {
            served_ttft.iter().sum::<f64>() / served_ttft.len() as f64
        },
        e2e_p50_ms: pct(&e2e, 50.0),
        e2e_p99_ms: pct(&e2e, 99.0),
        itl_p50_ms: percentile(&itl, 50.0),
        itl_p95_ms: percentile(&itl, 95.0),
        itl_p99_ms: percentile(&itl, 99.0),
        errors_by_status,
        pod_share,
        duration_s: run.wall_s,
        max_send_lag_ms: max_lag,
        error_rate: if requests == 0 {
            f64::NAN
        } else {
            (requests - ok) as f64 / requests as f64
        },
        goodput_rps: None,
        diagnostics: None,
        extra: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::client::Outcome;
    use crate::loadgen::Sample;

    fn sample(id: u64, status: u16, ttft: Option<f64>, e2e: f64, pod: &str, tokens: u64) -> Sample {
        Sample {
            id,
            model: "m".into(),
            at_ms: 0.0,
            lag_ms: id as f64 / 10.0,
            tag: None,
            group: None,
            outcome: Outcome {
                status,
                error: if status == 200 {
                    None
                } else {
                    Some(format!("status {status}"))
                },
                ttft_ms: ttft,
                e2e_ms: e2e,
                itl_ms: vec![1.0, 3.0],
                output_tokens: Some(tokens),
                content_chunks: 3,
                pod: Some(pod.into()),
                ..Outcome::default()
            },
        }
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
    }

    #[test]
    fn summary_comes_from_the_samples() {
        let mut samples: Vec<Sample> = (0..20)
            .map(|i| {
                let pod = if i % 4 == 0 { "a" } else { "b" };
                sample(
                    i,
                    200,
                    Some(f64::from(i as u32 + 1) * 10.0),
                    1000.0 + i as f64,
                    pod,
                    5,
                )
            })
            .collect();
        samples.push(sample(20, 429, None, 1.0, "a", 0));
        samples.push(sample(21, 503, None, 1.0, "a", 0));
        samples.push(sample(22, 503, None, 1.0, "a", 0));
        let mut t = sample(23, 0, None, 1.0, "a", 0);
        t.outcome.error = Some("timeout".into());
        samples.push(t);
        let run = RunResult {
            samples,
            wall_s: 10.0,
        };
        let s = summarize(&run);
        assert_eq!(s.requests, 24);
        assert_eq!(s.errors, 4);
        // 24 requests, 4 failed (+∞): p50 = rank 12 = 120 ms; p95 (rank 23) and p99 are +∞.
        assert_eq!(s.ttft_p50_ms, 120.0);
        assert_eq!(s.ttft_p95_ms, f64::INFINITY);
        assert_eq!(s.ttft_p99_ms, f64::INFINITY);
        assert!((s.ttft_mean_ms - 105.0).abs() < 1e-9);
        assert_eq!(s.e2e_p95_ms, f64::INFINITY);
        assert_eq!(s.e2e_p50_ms, 1011.0);
        assert!((s.error_rate - 4.0 / 24.0).abs() < 1e-12);
        assert!((s.throughput_rps - 2.0).abs() < 1e-9);
        assert!((s.output_tokens_per_s - 10.0).abs() < 1e-9);
        assert_eq!(s.errors_by_status["429"], 1);
        assert_eq!(s.errors_by_status["503"], 2);
        assert_eq!(s.errors_by_status["timeout"], 1);
        assert!((s.pod_share["a"] - 0.25).abs() < 1e-9);
        assert!((s.pod_share["b"] - 0.75).abs() < 1e-9);
        assert_eq!(s.itl_p50_ms, 1.0);
        assert_eq!(s.itl_p99_ms, 3.0);
        assert!((s.max_send_lag_ms - 2.3).abs() < 1e-9);
    }
}
