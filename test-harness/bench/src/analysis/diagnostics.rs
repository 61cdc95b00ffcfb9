//! What happened inside a run, so a reader can tell *why* a router won or lost: per-pod KV use,
//! queues, preemptions, adapter loads, prefix hits, step lateness and share, errors by cause and
//! the seeds used — and the two checks that decide whether figures are reported at all: the
//! emulator kept up with wall time (step lateness), and the scenario's anchor condition occurred.

use crate::analysis::podmetrics::PodWindow;
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Requests at or above the pooled TTFT p99 (nearest rank): how many samples the p99
    /// rests on (the protocol aims at ≥ 20).
    pub p99_tail_samples: u64,
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
        let wr = d.window_requests;
        d.p99_tail_samples = if wr == 0 {
            0
        } else {
            wr - crate::analysis::stats::nearest_rank(99.0, wr as usize) as u64 + 1
        };
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

/// What must have happened in a run for the scenario to show its anchor condition; the bench
/// evaluates it from the run's diagnostics and reports the scenario invalid when it fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// Nothing special to check (the steady, uniform cases).
    None,
    /// Under `router`, the pods preempted at least `min` times in the measurement window.
    PreemptionsUnder {
        /// Router name (`round_robin`, ...).
        router: &'static str,
        /// Fewest preemptions, summed over pods.
        min: u64,
    },
    /// Under `router`, some pod of `profile` had a waiting queue of at least `min_peak`.
    QueueUnder {
        /// Router name.
        router: &'static str,
        /// GPU profile of the pods to look at.
        profile: &'static str,
        /// Smallest peak of `vllm:num_requests_waiting` on one such pod.
        min_peak: u32,
    },
    /// Under `router`, the mean KV use (`model_sim:kv_usage_perc_seconds_sum` over the window)
    /// of the `slow` profile's pods is at least `min_ratio` times that of the `fast` profile's:
    /// the slow generation is loaded far beyond its share of the fleet.
    MeanKvRatioUnder {
        /// Router name.
        router: &'static str,
        /// Profile of the slower pods.
        slow: &'static str,
        /// Profile of the faster pods.
        fast: &'static str,
        /// Smallest ratio of the two profiles' mean KV use (averaged over their pods).
        min_ratio: f64,
    },
    /// Under `router`, adapters were swapped in from the CPU cache at least `min_cpu` times
    /// (`model_sim:lora_loads_total` − `model_sim:lora_disk_loads_total`) and read from disk at
    /// least `min_disk` times (`model_sim:lora_disk_loads_total`), summed over pods.
    AdapterLoadsUnder {
        /// Router name.
        router: &'static str,
        /// Fewest swap-ins from the CPU cache.
        min_cpu: u64,
        /// Fewest loads from disk.
        min_disk: u64,
    },
    /// Steady state: of the requests in the measurement window, fewer than `max_frac` are the
    /// first read of their shared prefix (cold for every router). Computed from the workload:
    /// [`Scenario::cold_read_fraction`].
    ColdReadsBelow {
        /// Largest share of cold reads.
        max_frac: f64,
    },
    /// All of these.
    All(Vec<Condition>),
}

/// Whether the scenario's anchor condition occurred, from each router's diagnostics (valid
/// runs) and the window's cold-read share. `None` = could not be checked (the router it names
/// was not run, or its pods do not export the metric); `All` is false if any part is false,
/// else unknown if any part is unknown.
pub fn condition_met(
    c: &Condition,
    diags: &BTreeMap<String, Diagnostics>,
    cold_reads: f64,
) -> Option<bool> {
    let fleet = |router: &str, f: fn(&Diagnostics) -> Option<f64>| diags.get(router).and_then(f);
    match c {
        Condition::None => Some(true),
        Condition::PreemptionsUnder { router, min } => {
            fleet(router, |d| d.preemptions).map(|p| p >= *min as f64)
        }
        Condition::QueueUnder {
            router,
            profile,
            min_peak,
        } => {
            let d = diags.get(*router)?;
            let suffix = format!("({profile})");
            let peaks: Vec<f64> = d
                .pods
                .iter()
                .filter(|(label, _)| label.ends_with(&suffix))
                .filter_map(|(_, p)| p.window.queue_peak)
                .collect();
            (!peaks.is_empty()).then(|| peaks.iter().any(|q| *q >= f64::from(*min_peak)))
        }
        Condition::MeanKvRatioUnder {
            router,
            slow,
            fast,
            min_ratio,
        } => {
            let d = diags.get(*router)?;
            let mean_kv = |profile: &str| -> Option<f64> {
                let suffix = format!("({profile})");
                let v: Vec<f64> = d
                    .pods
                    .iter()
                    .filter(|(label, _)| label.ends_with(&suffix))
                    .filter_map(|(_, p)| p.window.kv_mean)
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            };
            let (s, f) = (mean_kv(slow)?, mean_kv(fast)?);
            if f > 0.0 {
                Some(s / f >= *min_ratio)
            } else {
                Some(s > 0.0)
            }
        }
        Condition::AdapterLoadsUnder {
            router,
            min_cpu,
            min_disk,
        } => {
            let gpu = fleet(router, |d| d.adapter_loads_gpu)?;
            let disk = fleet(router, |d| d.adapter_loads_disk)?;
            Some(gpu - disk >= *min_cpu as f64 && disk >= *min_disk as f64)
        }
        Condition::ColdReadsBelow { max_frac } => {
            (!cold_reads.is_nan()).then_some(cold_reads < *max_frac)
        }
        Condition::All(parts) => {
            let v: Vec<Option<bool>> = parts
                .iter()
                .map(|p| condition_met(p, diags, cold_reads))
                .collect();
            if v.contains(&Some(false)) {
                Some(false)
            } else if v.contains(&None) {
                None
            } else {
                Some(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn diag(preemptions: f64, queue: &[(&str, f64)], gpu: f64, disk: f64) -> Diagnostics {
        Diagnostics {
            preemptions: Some(preemptions),
            adapter_loads_gpu: Some(gpu),
            adapter_loads_disk: Some(disk),
            pods: queue
                .iter()
                .map(|(label, q)| {
                    (
                        label.to_string(),
                        PodDiag {
                            share: 0.25,
                            window: PodWindow {
                                queue_peak: Some(*q),
                                ..PodWindow::default()
                            },
                        },
                    )
                })
                .collect(),
            ..Diagnostics::default()
        }
    }

    #[test]
    fn kv_ratio_condition() {
        let pod = |kv: f64| PodDiag {
            share: 0.25,
            window: PodWindow {
                kv_mean: Some(kv),
                ..PodWindow::default()
            },
        };
        let mut rr = Diagnostics::default();
        rr.pods.insert("pod0 (h100)".into(), pod(0.1));
        rr.pods.insert("pod1 (h100)".into(), pod(0.2));
        rr.pods.insert("pod2 (a10g)".into(), pod(0.5));
        rr.pods.insert("pod3 (a10g)".into(), pod(0.4));
        let mut d = BTreeMap::new();
        d.insert("round_robin".to_string(), rr);
        let c = |min_ratio| Condition::MeanKvRatioUnder {
            router: "round_robin",
            slow: "a10g",
            fast: "h100",
            min_ratio,
        };
        // 0.45 / 0.15 = 3.
        assert_eq!(condition_met(&c(2.9), &d, f64::NAN), Some(true));
        assert_eq!(condition_met(&c(3.1), &d, f64::NAN), Some(false));
        let other = Condition::MeanKvRatioUnder {
            router: "round_robin",
            slow: "a10g",
            fast: "h100-70b",
            min_ratio: 1.0,
        };
        assert_eq!(condition_met(&other, &d, f64::NAN), None);
    }

    #[test]
    fn condition_checks() {
        let mut d = BTreeMap::new();
        d.insert(
            "round_robin".to_string(),
            diag(
                0.0,
                &[("pod0 (h100)", 9.0), ("pod2 (a10g)", 0.0)],
                10.0,
                0.0,
            ),
        );
        d.insert(
            "filter".to_string(),
            diag(3.0, &[("pod2 (a10g)", 2.0)], 5.0, 1.0),
        );
        let pre = |router, min| Condition::PreemptionsUnder { router, min };
        assert_eq!(
            condition_met(&pre("round_robin", 1), &d, f64::NAN),
            Some(false)
        );
        assert_eq!(condition_met(&pre("filter", 3), &d, f64::NAN), Some(true));
        assert_eq!(condition_met(&pre("least_request", 1), &d, f64::NAN), None);
        let queue = |router, min_peak| Condition::QueueUnder {
            router,
            profile: "a10g",
            min_peak,
        };
        // The H100's queue of 9 does not count for an A10G condition.
        assert_eq!(
            condition_met(&queue("round_robin", 1), &d, f64::NAN),
            Some(false)
        );
        assert_eq!(condition_met(&queue("filter", 2), &d, f64::NAN), Some(true));
        let loads = |router, min_cpu, min_disk| Condition::AdapterLoadsUnder {
            router,
            min_cpu,
            min_disk,
        };
        assert_eq!(
            condition_met(&loads("round_robin", 1, 1), &d, f64::NAN),
            Some(false)
        );
        assert_eq!(
            condition_met(&loads("filter", 4, 1), &d, f64::NAN),
            Some(true)
        );
        let cold = Condition::ColdReadsBelow { max_frac: 0.02 };
        assert_eq!(condition_met(&cold, &d, 0.05), Some(false));
        assert_eq!(condition_met(&cold, &d, 0.01), Some(true));
        assert_eq!(condition_met(&cold, &d, f64::NAN), None);
        assert_eq!(condition_met(&Condition::None, &d, f64::NAN), Some(true));
        let all = |v| Condition::All(v);
        assert_eq!(
            condition_met(&all(vec![pre("filter", 1), cold.clone()]), &d, 0.01),
            Some(true)
        );
        assert_eq!(
            condition_met(
                &all(vec![pre("least_request", 1), pre("round_robin", 1)]),
                &d,
                0.0
            ),
            Some(false)
        );
        assert_eq!(
            condition_met(
                &all(vec![pre("least_request", 1), pre("filter", 1)]),
                &d,
                0.0
            ),
            None
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
        // 200 requests: p99 is rank 198, so 3 samples at or above it.
        assert_eq!(d.p99_tail_samples, 3);
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
