//! What happened inside a run, so a reader can tell *why* a router won or lost: per-pod KV use,
//! queues, preemptions, adapter loads, prefix hits, step lateness and share, errors by cause and
//! the seeds used — and the two checks that decide whether figures are reported at all: the
//! emulator kept up with wall time (step lateness), and the scenario's anchor condition occurred.

use crate::podmetrics::PodWindow;
use crate::scenarios::Condition;
use crate::workload::RequestSpec;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

/// A run left out of the figures, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvalidRun {
    /// Its workload seed.
    pub seed: u64,
    /// Why (e.g. step lateness above 5 % of TTFT p50).
    pub reason: String,
}

/// One pod over the valid runs: peaks are the highest seen, means and counts the mean per run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodDiag {
    /// Share of the window's successful requests it served.
    pub share: f64,
    /// The window figures (see [`PodWindow`]).
    #[serde(flatten)]
    pub window: PodWindow,
}

/// Diagnostics of one router in one scenario, over its valid runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Diagnostics {
    /// Seeds whose runs make the figures.
    pub seeds: Vec<u64>,
    /// Runs left out (step lateness, failed start...).
    pub invalid_runs: Vec<InvalidRun>,
    /// Warm-up per run (wall seconds; identical for every router), excluded from the figures.
    pub warmup_s: f64,
    /// Measurement window per run (wall seconds).
    pub window_s: f64,
    /// Offered rate, req/s of emulated time.
    pub offered_rps: f64,
    /// Requests that arrived in the windows (all seeds).
    pub window_requests: u64,
    /// Failed ÷ sent over the windows.
    pub error_rate: f64,
    /// Failures by cause: HTTP status, `timeout`, `transport`, `stream`.
    pub errors_by_cause: BTreeMap<String, u64>,
    /// Fleet preemptions per run.
    pub preemptions: Option<f64>,
    /// Fleet adapter loads into GPU slots per run.
    pub adapter_loads_gpu: Option<f64>,
    /// Of those, loads from disk per run (the rest came from the CPU cache).
    pub adapter_loads_disk: Option<f64>,
    /// Fleet prefix-cache hit rate (hits ÷ queries, tokens).
    pub prefix_hit_rate: Option<f64>,
    /// Worst pod's mean step lateness, worst run, ms.
    pub step_lateness_ms: Option<f64>,
    /// Worst single step lateness, ms.
    pub step_lateness_max_ms: Option<f64>,
    /// Whether every pod accepted the `*_max` reset at each window start (if not, peaks cover
    /// the warm-up too).
    pub stats_reset: bool,
    /// Per pod (`pod<i> (<profile>)`, fleet order).
    pub pods: BTreeMap<String, PodDiag>,
}

/// What [`Diagnostics::from_runs`] needs of one valid run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView<'a> {
    /// Seed.
    pub seed: u64,
    /// Pod label and window figures, fleet order.
    pub pods: &'a [(String, PodWindow)],
    /// Pod label → share of successful window requests.
    pub shares: &'a BTreeMap<String, f64>,
    /// Window requests, failures by cause.
    pub requests: u64,
    /// Failures by cause.
    pub errors: &'a BTreeMap<String, u64>,
    /// Fleet prefix hits and queries in the window, if exported.
    pub prefix: Option<(f64, f64)>,
    /// Whether the reset was accepted.
    pub stats_reset: bool,
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn mean_opt(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let xs: Vec<f64> = v.flatten().collect();
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn sum_opt(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    v.reduce(|a, b| Some(a? + b?)).flatten()
}

impl Diagnostics {
    /// Aggregate the valid runs of one router (peaks: max; means and counts: mean per run).
    pub fn from_runs(runs: &[RunView], invalid: Vec<InvalidRun>) -> Self {
        let mut d = Diagnostics {
            seeds: runs.iter().map(|r| r.seed).collect(),
            invalid_runs: invalid,
            stats_reset: !runs.is_empty() && runs.iter().all(|r| r.stats_reset),
            ..Diagnostics::default()
        };
        let n = runs.len().max(1) as f64;
        for r in runs {
            d.window_requests += r.requests;
            for (k, v) in r.errors {
                *d.errors_by_cause.entry(k.clone()).or_default() += v;
            }
        }
        let failed: u64 = d.errors_by_cause.values().sum();
        d.error_rate = if d.window_requests == 0 {
            f64::NAN
        } else {
            failed as f64 / d.window_requests as f64
        };
        let fleet = |f: fn(&PodWindow) -> Option<f64>| {
            mean_opt(
                runs.iter()
                    .map(|r| sum_opt(r.pods.iter().map(|(_, p)| f(p)))),
            )
        };
        d.preemptions = fleet(|p| p.preemptions);
        d.adapter_loads_gpu = fleet(|p| p.adapter_loads_gpu);
        d.adapter_loads_disk = fleet(|p| p.adapter_loads_disk);
        let (h, q) = runs
            .iter()
            .filter_map(|r| r.prefix)
            .fold((0.0, 0.0), |(a, b), (h, q)| (a + h, b + q));
        d.prefix_hit_rate = (q > 0.0).then(|| h / q);
        for r in runs {
            for (label, p) in r.pods {
                d.step_lateness_ms = max_opt(d.step_lateness_ms, p.step_lateness_mean_ms);
                d.step_lateness_max_ms = max_opt(d.step_lateness_max_ms, p.step_lateness_max_ms);
                let e = d.pods.entry(label.clone()).or_default();
                e.share += r.shares.get(label).copied().unwrap_or(0.0) / n;
            }
        }
        let labels: Vec<String> = d.pods.keys().cloned().collect();
        for label in labels {
            let of = |f: fn(&PodWindow) -> Option<f64>| {
                runs.iter()
                    .filter_map(|r| r.pods.iter().find(|(l, _)| *l == label))
                    .map(move |(_, p)| f(p))
            };
            let w = PodWindow {
                kv_peak: of(|p| p.kv_peak).reduce(max_opt).flatten(),
                kv_mean: mean_opt(of(|p| p.kv_mean)),
                queue_peak: of(|p| p.queue_peak).reduce(max_opt).flatten(),
                preemptions: mean_opt(of(|p| p.preemptions)),
                adapter_loads_gpu: mean_opt(of(|p| p.adapter_loads_gpu)),
                adapter_loads_disk: mean_opt(of(|p| p.adapter_loads_disk)),
                prefix_hit_rate: mean_opt(of(|p| p.prefix_hit_rate)),
                step_lateness_mean_ms: of(|p| p.step_lateness_mean_ms).reduce(max_opt).flatten(),
                step_lateness_max_ms: of(|p| p.step_lateness_max_ms).reduce(max_opt).flatten(),
            };
            if let Some(e) = d.pods.get_mut(&label) {
                e.window = w;
            }
        }
        d
    }
}

/// Share of step lateness allowed, relative to the run's TTFT p50.
pub const LATENESS_LIMIT: f64 = 0.05;

/// The run's step lateness (worst pod's mean, ms) and whether it is acceptable: `Err(reason)`
/// when it exceeds [`LATENESS_LIMIT`] × TTFT p50 (the run is then marked invalid, not reported).
/// Pods that do not export lateness give `Ok(None)`.
pub fn lateness_check(pods: &[PodWindow], ttft_p50_ms: f64) -> Result<Option<f64>, String> {
    let limit = LATENESS_LIMIT * ttft_p50_ms;
    let worst = pods
        .iter()
        .filter_map(|p| p.step_lateness_mean_ms)
        .reduce(f64::max);
    match worst {
        // A NaN p50 (nothing served) cannot vouch for the run: invalid rather than trusted.
        Some(l) if limit.is_nan() || l > limit => Err(format!(
            "step lateness {l:.1} ms > {:.0} % of TTFT p50 {ttft_p50_ms:.1} ms: the emulator fell behind wall time",
            LATENESS_LIMIT * 100.0
        )),
        w => Ok(w),
    }
}

/// Share of the requests arriving in `[from, to)` that are *cold reads*: less than half of their
/// prompt (in 256-byte blocks of the request body's messages, chained like a prefix cache's
/// block hashes) was sent by any earlier request of the run. A perfect router still pays these.
pub fn cold_read_fraction(reqs: &[RequestSpec], from: Duration, to: Duration) -> f64 {
    const BLOCK: usize = 256;
    let mut seen: HashSet<u64> = HashSet::new();
    let mut order: Vec<&RequestSpec> = reqs.iter().collect();
    order.sort_by_key(|r| (r.at, r.id));
    let (mut n, mut cold) = (0usize, 0usize);
    for r in order {
        let body = r.body.as_ref();
        let start = body
            .windows(10)
            .position(|w| w == b"\"messages\"")
            .unwrap_or(0);
        let mut h = DefaultHasher::new();
        let mut hashes = Vec::new();
        for chunk in body[start..].chunks_exact(BLOCK) {
            chunk.hash(&mut h);
            hashes.push(h.finish());
        }
        let hit = hashes.iter().take_while(|x| seen.contains(x)).count();
        if r.at >= from && r.at < to {
            n += 1;
            if hashes.len() >= 4 && hit * 2 < hashes.len() {
                cold += 1;
            }
        }
        seen.extend(hashes);
    }
    if n == 0 {
        f64::NAN
    } else {
        cold as f64 / n as f64
    }
}

/// Whether the scenario's anchor condition occurred. `preemptions` gives each router's fleet
/// preemptions per run (valid runs); `cold_reads` the window's cold-read share. `None` = could
/// not be checked (the router it names was not run, or its pods do not export the counter).
pub fn condition_met(
    c: Condition,
    preemptions: &BTreeMap<String, Option<f64>>,
    cold_reads: f64,
) -> Option<bool> {
    match c {
        Condition::None => Some(true),
        Condition::PreemptionsUnder(router) => {
            preemptions.get(router).copied().flatten().map(|p| p > 0.0)
        }
        Condition::ColdReadsBelow(frac) => (!cold_reads.is_nan()).then_some(cold_reads < frac),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn pod(lateness: Option<f64>) -> PodWindow {
        PodWindow {
            step_lateness_mean_ms: lateness,
            ..PodWindow::default()
        }
    }

    #[test]
    fn a_late_emulator_makes_the_run_invalid() {
        // 5 % of a 200 ms p50 is 10 ms.
        assert_eq!(
            lateness_check(&[pod(Some(2.0)), pod(Some(9.9))], 200.0),
            Ok(Some(9.9))
        );
        let e = lateness_check(&[pod(Some(2.0)), pod(Some(10.5))], 200.0).unwrap_err();
        assert!(e.contains("10.5 ms"), "{e}");
        // No lateness exported: nothing to judge.
        assert_eq!(lateness_check(&[pod(None)], 200.0), Ok(None));
        // No successful request (p50 +∞ or NaN) with lateness: invalid rather than trusted.
        assert!(lateness_check(&[pod(Some(1.0))], f64::NAN).is_err());
    }

    #[test]
    fn condition_checks() {
        let mut pre = BTreeMap::new();
        pre.insert("round_robin".to_string(), Some(0.0));
        pre.insert("filter".to_string(), Some(3.0));
        assert_eq!(
            condition_met(Condition::PreemptionsUnder("round_robin"), &pre, f64::NAN),
            Some(false)
        );
        assert_eq!(
            condition_met(Condition::PreemptionsUnder("filter"), &pre, f64::NAN),
            Some(true)
        );
        assert_eq!(
            condition_met(Condition::PreemptionsUnder("least_request"), &pre, f64::NAN),
            None
        );
        assert_eq!(
            condition_met(Condition::ColdReadsBelow(0.02), &pre, 0.05),
            Some(false)
        );
        assert_eq!(
            condition_met(Condition::ColdReadsBelow(0.1), &pre, 0.05),
            Some(true)
        );
        assert_eq!(condition_met(Condition::None, &pre, f64::NAN), Some(true));
    }

    fn req(id: u64, at_s: u64, text: &str) -> RequestSpec {
        let body = format!("{{\"model\":\"m\",\"messages\":[{{\"content\":\"{text}\"}}]}}");
        RequestSpec {
            id,
            at: Duration::from_secs(at_s),
            model: "m".into(),
            max_tokens: 1,
            prompt_chars: text.len(),
            body: Bytes::from(body),
        }
    }

    #[test]
    fn cold_reads_are_first_reads_of_long_prefixes() {
        let doc_a = "a".repeat(3000);
        let doc_b = "b".repeat(3000);
        let reqs = vec![
            req(0, 0, &format!("{doc_a} q0")),  // cold, before the window
            req(1, 10, &format!("{doc_a} q1")), // warm
            req(2, 11, &format!("{doc_b} q2")), // cold
            req(3, 12, "short"),                // too short to be a cold read
            req(4, 13, &format!("{doc_b} q4")), // warm
        ];
        let f = cold_read_fraction(&reqs, Duration::from_secs(10), Duration::from_secs(20));
        assert!((f - 0.25).abs() < 1e-12, "{f}");
        assert!(
            cold_read_fraction(&reqs, Duration::from_secs(30), Duration::from_secs(40)).is_nan()
        );
    }

    #[test]
    fn aggregates_runs() {
        let pods_a = vec![
            (
                "pod0 (h100)".to_string(),
                PodWindow {
                    kv_peak: Some(0.5),
                    preemptions: Some(1.0),
                    step_lateness_mean_ms: Some(1.0),
                    ..PodWindow::default()
                },
            ),
            (
                "pod1 (a10g)".to_string(),
                PodWindow {
                    kv_peak: Some(0.9),
                    preemptions: Some(3.0),
                    ..PodWindow::default()
                },
            ),
        ];
        let mut pods_b = pods_a.clone();
        pods_b[1].1.kv_peak = Some(0.95);
        pods_b[1].1.preemptions = Some(5.0);
        let shares: BTreeMap<String, f64> = [
            ("pod0 (h100)".to_string(), 0.75),
            ("pod1 (a10g)".to_string(), 0.25),
        ]
        .into();
        let mut errs = BTreeMap::new();
        errs.insert("timeout".to_string(), 2u64);
        let none = BTreeMap::new();
        let runs = [
            RunView {
                seed: 1,
                pods: &pods_a,
                shares: &shares,
                requests: 100,
                errors: &errs,
                prefix: Some((10.0, 40.0)),
                stats_reset: true,
            },
            RunView {
                seed: 2,
                pods: &pods_b,
                shares: &shares,
                requests: 100,
                errors: &none,
                prefix: Some((30.0, 40.0)),
                stats_reset: true,
            },
        ];
        let d = Diagnostics::from_runs(&runs, vec![]);
        assert_eq!(d.seeds, [1, 2]);
        assert_eq!(d.error_rate, 0.01);
        assert_eq!(d.errors_by_cause["timeout"], 2);
        assert_eq!(d.preemptions, Some(5.0)); // (4 + 6) / 2 runs
        assert_eq!(d.prefix_hit_rate, Some(0.5));
        assert_eq!(d.pods["pod1 (a10g)"].window.kv_peak, Some(0.95));
        assert_eq!(d.pods["pod1 (a10g)"].window.preemptions, Some(4.0));
        assert!((d.pods["pod0 (h100)"].share - 0.75).abs() < 1e-12);
        assert_eq!(d.step_lateness_ms, Some(1.0));
        assert!(d.stats_reset);
        assert_eq!(d.adapter_loads_gpu, None);
    }
}
