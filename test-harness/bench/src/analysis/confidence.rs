//! The statistics that make a verdict hold: per-request observations of the measurement window,
//! confidence intervals of router ÷ baseline ratios over seeds, and the bisection over offered
//! rate that finds goodput.
//!
//! Why intervals over *seeds*, from per-seed log-ratios with Student-t quantiles: requests
//! inside one run are not independent (a queue that builds up delays every request behind it),
//! so the run (seed) is the independent unit, and the spread that decides whether a verdict
//! replicates is the run-to-run spread. Every router is sent byte-identical traffic per seed, so
//! each seed gives one paired ratio `stat(a, seed) ÷ stat(b, seed)`; the interval is
//! `exp(mean ± t(0.975, k−1) · sd / √k)` of their logarithms (ratios are multiplicative, and
//! the log makes 0.5× and 2× symmetric). Unlike a bootstrap over the seeds drawn, it widens with
//! the t quantile when there are few seeds (12.7 for two, 2.26 for ten), which is what a
//! skeptical reader needs: two or three seeds give wide intervals, and a verdict takes ten
//! (the bench's README). One seed gives a ratio and no interval: a direction, not a verdict.
//! The point estimate is the geometric mean of the per-seed ratios, the interval's centre.

use crate::analysis::stats::percentile_inf;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;

/// One request of the measurement window. Failed and timed-out requests have `ttft_ms` and
/// `e2e_ms` = +∞, so a router cannot improve a percentile by dropping requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Obs {
    /// Time to first token, ms (+∞ when the request failed).
    pub ttft_ms: f64,
    /// End-to-end latency, ms (+∞ when the request failed).
    pub e2e_ms: f64,
    /// Whether it succeeded.
    pub ok: bool,
    /// Output tokens (0 when failed).
    pub tokens: f64,
}

impl Obs {
    /// A failed request: +∞ latencies.
    pub fn failed() -> Self {
        Obs {
            ttft_ms: f64::INFINITY,
            e2e_ms: f64::INFINITY,
            ok: false,
            tokens: 0.0,
        }
    }
}

/// One run (seed) of one router in one scenario, reduced to its measurement window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunData {
    /// The workload seed.
    pub seed: u64,
    /// Request id → observation, for requests that arrived inside the window.
    pub obs: BTreeMap<u64, Obs>,
    /// Window length, seconds.
    pub window_s: f64,
    /// Run-level figures from the pods' counters (e.g. `adapter_loads`, `preemptions`).
    pub scalars: BTreeMap<String, f64>,
}

/// A figure that can be compared between routers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stat {
    /// TTFT percentile (nearest rank, failures +∞).
    Ttft(f64),
    /// End-to-end percentile (nearest rank, failures +∞).
    E2e(f64),
    /// Successful window requests per second of window.
    Throughput,
    /// Output tokens of successful window requests per second of window.
    TokensPerS,
    /// Error rate of the window's requests (0..=1).
    ErrorRate,
    /// Goodput: successful window requests whose TTFT is within this many ms, per second of
    /// window.
    WithinSlo(f64),
    /// A run-level figure, averaged over the runs drawn.
    Scalar(&'static str),
}

impl Stat {
    /// The statistic behind a JSON metric name of the report.
    pub fn from_metric(name: &'static str) -> Self {
        match name {
            "ttft_p50_ms" => Stat::Ttft(50.0),
            "ttft_p90_ms" => Stat::Ttft(90.0),
            "ttft_p95_ms" => Stat::Ttft(95.0),
            "ttft_p99_ms" => Stat::Ttft(99.0),
            "e2e_p50_ms" => Stat::E2e(50.0),
            "e2e_p95_ms" => Stat::E2e(95.0),
            "e2e_p99_ms" => Stat::E2e(99.0),
            "throughput_rps" => Stat::Throughput,
            "output_tokens_per_s" => Stat::TokensPerS,
            "error_rate" => Stat::ErrorRate,
            other => Stat::Scalar(other),
        }
    }
}

/// A run flattened for resampling: observations in id order.
struct Flat<'a> {
    obs: Vec<Obs>,
    window_s: f64,
    scalars: &'a BTreeMap<String, f64>,
}

impl<'a> Flat<'a> {
    fn new(r: &'a RunData) -> Self {
        Flat {
            obs: r.obs.values().copied().collect(),
            window_s: r.window_s,
            scalars: &r.scalars,
        }
    }
}

/// The statistic over a set of runs, each contributing the requests listed (indices into its
/// observations); `None` = all of them.
fn eval(stat: Stat, runs: &[(&Flat, Option<&[usize]>)], buf: &mut Vec<f64>) -> f64 {
    let each = |f: &mut dyn FnMut(&Obs)| {
        for (r, idx) in runs {
            match idx {
                Some(ix) => ix.iter().filter_map(|i| r.obs.get(*i)).for_each(&mut *f),
                None => r.obs.iter().for_each(&mut *f),
            }
        }
    };
    let window: f64 = runs.iter().map(|(r, _)| r.window_s).sum();
    match stat {
        Stat::Ttft(p) | Stat::E2e(p) => {
            buf.clear();
            let ttft = matches!(stat, Stat::Ttft(_));
            each(&mut |o| buf.push(if ttft { o.ttft_ms } else { o.e2e_ms }));
            percentile_inf(buf, p)
        }
        Stat::Throughput => {
            let mut n = 0usize;
            each(&mut |o| n += usize::from(o.ok));
            n as f64 / window
        }
        Stat::WithinSlo(slo) => {
            let mut n = 0usize;
            each(&mut |o| n += usize::from(o.ok && o.ttft_ms <= slo));
            n as f64 / window
        }
        Stat::TokensPerS => {
            let mut t = 0.0;
            each(&mut |o| t += o.tokens);
            t / window
        }
        Stat::ErrorRate => {
            let (mut n, mut bad) = (0usize, 0usize);
            each(&mut |o| {
                n += 1;
                bad += usize::from(!o.ok);
            });
            if n == 0 {
                f64::NAN
            } else {
                bad as f64 / n as f64
            }
        }
        Stat::Scalar(name) => {
            let v: Vec<f64> = runs
                .iter()
                .filter_map(|(r, _)| r.scalars.get(name).copied())
                .collect();
            if v.len() < runs.len() || v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        }
    }
}

/// The statistic over all runs (every seed once, every window request once).
pub fn pooled(stat: Stat, runs: &[RunData]) -> f64 {
    let flat: Vec<Flat> = runs.iter().map(Flat::new).collect();
    let all: Vec<(&Flat, Option<&[usize]>)> = flat.iter().map(|r| (r, None)).collect();
    eval(stat, &all, &mut Vec::new())
}

/// a ÷ b with the conventions of the report: both zero → 1 (as good as), both +∞ or NaN →
/// undefined, b zero → undefined.
pub fn safe_ratio(a: f64, b: f64) -> Option<f64> {
    if a.is_nan() || b.is_nan() || (a.is_infinite() && b.is_infinite()) {
        return None;
    }
    if b == 0.0 {
        return (a == 0.0).then_some(1.0);
    }
    Some(a / b)
}

/// A ratio with its interval over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct RatioCi {
    /// Point estimate: the geometric mean of the per-seed ratios when every seed's ratio is
    /// finite and positive, else pooled(a) ÷ pooled(b).
    pub ratio: Option<f64>,
    /// The 95 % interval from the per-seed log-ratios and Student-t (`None` with fewer than two
    /// seeds, or when a seed's ratio is undefined, zero or infinite: a failed percentile).
    pub ci95: Option<[f64; 2]>,
    /// Seeds behind the figure.
    pub seeds: usize,
    /// Each pair's own ratio, in the order of the pairs (`None`: undefined, e.g. a baseline of
    /// zero; infinite: a failed percentile): what lets later runs be pooled with this one.
    pub per_seed: Vec<Option<f64>>,
}

/// The two-sided 95 % quantile of Student's t with `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64)
        .map(|t| t.inverse_cdf(0.975))
        .unwrap_or(f64::NAN)
}

/// The geometric mean of `ratios` (all finite and positive) with its Student-t 95 % interval
/// over them (`None` below two).
pub fn log_t_interval(ratios: &[f64]) -> (f64, Option<[f64; 2]>) {
    let k = ratios.len();
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / k.max(1) as f64;
    if k < 2 {
        return (mean.exp(), None);
    }
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1) as f64;
    let half = t975(k - 1) * (var / k as f64).sqrt();
    (mean.exp(), Some([(mean - half).exp(), (mean + half).exp()]))
}

/// `stat(a) ÷ stat(b)` for every statistic in `stats`, with its interval over seeds
/// ([`log_t_interval`] of the per-seed ratios).
///
/// `a` and `b` are the same seeds' runs of two routers, in the same order (pairs are matched by
/// position; each pair is compared on the request ids both hold).
pub fn ratio_cis(a: &[RunData], b: &[RunData], stats: &[Stat]) -> Vec<RatioCi> {
    // Align each pair on common ids.
    let pairs: Vec<(RunData, RunData)> = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let keep = |r: &RunData, other: &RunData| RunData {
                obs: r
                    .obs
                    .iter()
                    .filter(|(k, _)| other.obs.contains_key(k))
                    .map(|(k, v)| (*k, *v))
                    .collect(),
                ..r.clone()
            };
            (keep(x, y), keep(y, x))
        })
        .collect();
    let (pa, pb): (Vec<RunData>, Vec<RunData>) = pairs.into_iter().unzip();
    stats
        .iter()
        .map(|s| {
            let per_seed: Vec<Option<f64>> = pa
                .iter()
                .zip(&pb)
                .map(|(x, y)| {
                    safe_ratio(
                        pooled(*s, std::slice::from_ref(x)),
                        pooled(*s, std::slice::from_ref(y)),
                    )
                })
                .collect();
            let usable: Option<Vec<f64>> = per_seed
                .iter()
                .map(|r| r.filter(|v| v.is_finite() && *v > 0.0))
                .collect();
            match usable.filter(|v| !v.is_empty()) {
                Some(v) => {
                    let (point, ci95) = log_t_interval(&v);
                    RatioCi {
                        ratio: Some(point),
                        ci95,
                        seeds: v.len(),
                        per_seed,
                    }
                }
                // A seed whose percentile failed (+∞) makes the ratio
                // infinite: a failure is never averaged away by the other seeds.
                None if per_seed.iter().any(|r| r.is_some_and(f64::is_infinite)) => RatioCi {
                    ratio: Some(f64::INFINITY),
                    ci95: None,
                    seeds: pa.len(),
                    per_seed,
                },
                None => RatioCi {
                    ratio: safe_ratio(pooled(*s, &pa), pooled(*s, &pb)),
                    ci95: None,
                    seeds: pa.len(),
                    per_seed,
                },
            }
        })
        .collect()
}

/// The goodput search: the highest offered rate that passes (TTFT p95 ≤ SLO, errors ≤ 1 %),
/// assuming passing is monotone in the rate. Starting at `start`, it doubles (or halves) until
/// it brackets the limit, then bisects geometrically until the bracket is within `rel_tol`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bisection {
    start: f64,
    rel_tol: f64,
    max_probes: usize,
    min_rate: f64,
    /// Highest passing rate seen.
    pub pass: Option<f64>,
    /// Lowest failing rate seen.
    pub fail: Option<f64>,
    /// Every probe so far: (rate, passed).
    pub probes: Vec<(f64, bool)>,
}

impl Bisection {
    /// A search starting at `start` req/s, stopping when fail ÷ pass ≤ 1 + `rel_tol` or after
    /// `max_probes`, and giving up below `start` / 64.
    pub fn new(start: f64, rel_tol: f64, max_probes: usize) -> Self {
        Bisection {
            start,
            rel_tol,
            max_probes,
            min_rate: start / 64.0,
            pass: None,
            fail: None,
            probes: Vec::new(),
        }
    }

    /// The next rate to probe, or `None` when done.
    pub fn next_rate(&self) -> Option<f64> {
        if self.probes.len() >= self.max_probes || self.start <= 0.0 {
            return None;
        }
        match (self.pass, self.fail) {
            (None, None) => Some(self.start),
            (Some(p), None) => Some(p * 2.0),
            (None, Some(f)) => {
                let r = f / 2.0;
                (r >= self.min_rate).then_some(r)
            }
            (Some(p), Some(f)) => (f / p > 1.0 + self.rel_tol).then(|| (p * f).sqrt()),
        }
    }

    /// Record a probe's outcome.
    pub fn record(&mut self, rate: f64, passed: bool) {
        self.probes.push((rate, passed));
        if passed {
            self.pass = Some(self.pass.map_or(rate, |p| p.max(rate)));
        } else {
            self.fail = Some(self.fail.map_or(rate, |f| f.min(rate)));
        }
        // A non-monotone outcome (a pass above a fail): trust the fail, keep the bracket valid.
        if let (Some(p), Some(f)) = (self.pass, self.fail) {
            if p >= f {
                self.pass = self
                    .probes
                    .iter()
                    .filter(|(r, ok)| *ok && *r < f)
                    .map(|(r, _)| *r)
                    .reduce(f64::max);
            }
        }
    }

    /// The goodput found: the highest passing rate below every failing one (0 when none passed).
    pub fn goodput(&self) -> f64 {
        self.pass.unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, ttfts: &[f64], window_s: f64) -> RunData {
        RunData {
            seed,
            obs: ttfts
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    let o = if t.is_finite() {
                        Obs {
                            ttft_ms: t,
                            e2e_ms: 2.0 * t,
                            ok: true,
                            tokens: 10.0,
                        }
                    } else {
                        Obs::failed()
                    };
                    (i as u64, o)
                })
                .collect(),
            window_s,
            scalars: BTreeMap::new(),
        }
    }

    #[test]
    fn failures_are_infinite_in_percentiles() {
        // 96 successes at 1..=96 ms and 4 failures: p95 is a success, p99 is +∞.
        let mut v: Vec<f64> = (1..=96).map(f64::from).collect();
        v.extend([f64::INFINITY; 4]);
        let r = run(1, &v, 10.0);
        assert_eq!(pooled(Stat::Ttft(50.0), std::slice::from_ref(&r)), 50.0);
        assert_eq!(pooled(Stat::Ttft(95.0), std::slice::from_ref(&r)), 95.0);
        assert_eq!(
            pooled(Stat::Ttft(99.0), std::slice::from_ref(&r)),
            f64::INFINITY
        );
        assert_eq!(pooled(Stat::ErrorRate, std::slice::from_ref(&r)), 0.04);
        assert!((pooled(Stat::Throughput, std::slice::from_ref(&r)) - 9.6).abs() < 1e-12);
        // Goodput counts successes within the SLO only: 40 of the 96 are ≤ 40 ms.
        assert!((pooled(Stat::WithinSlo(40.0), &[r]) - 4.0).abs() < 1e-12);
        // Dropping the slow requests does not help: a router that fails its 10 slowest requests
        // has a worse p95 than one that serves them slowly.
        let slow: Vec<f64> = (1..=100).map(f64::from).collect();
        let mut dropped = slow.clone();
        for x in dropped.iter_mut().skip(90) {
            *x = f64::INFINITY;
        }
        let (a, b) = (run(1, &dropped, 1.0), run(1, &slow, 1.0));
        assert!(pooled(Stat::Ttft(95.0), &[a]) > pooled(Stat::Ttft(95.0), &[b]));
        assert!(percentile_inf(&mut [], 50.0).is_nan());
    }

    #[test]
    fn safe_ratio_conventions() {
        assert_eq!(safe_ratio(2.0, 4.0), Some(0.5));
        assert_eq!(safe_ratio(0.0, 0.0), Some(1.0));
        assert_eq!(safe_ratio(1.0, 0.0), None);
        assert_eq!(safe_ratio(f64::INFINITY, 4.0), Some(f64::INFINITY));
        assert_eq!(safe_ratio(4.0, f64::INFINITY), Some(0.0));
        assert_eq!(safe_ratio(f64::INFINITY, f64::INFINITY), None);
        assert_eq!(safe_ratio(f64::NAN, 1.0), None);
    }

    /// A run of `n` requests whose TTFTs are spread deterministically from the seed.
    fn noisy(seed: u64, n: usize, scale: f64) -> RunData {
        let v: Vec<f64> = (0..n)
            .map(|i| {
                let u = ((i as u64 * 2_654_435_761 + seed * 97) % 1000) as f64 / 1000.0;
                scale * (1.0 + 3.0 * u.powi(3))
            })
            .collect();
        run(seed, &v, 10.0)
    }

    fn scaled(r: &RunData, k: f64) -> RunData {
        RunData {
            obs: r
                .obs
                .iter()
                .map(|(id, o)| {
                    (
                        *id,
                        Obs {
                            ttft_ms: o.ttft_ms * k,
                            ..*o
                        },
                    )
                })
                .collect(),
            ..r.clone()
        }
    }

    #[test]
    fn the_t_quantile_is_students() {
        // Tables: t(0.975; 1) = 12.706, t(0.975; 9) = 2.262, t(0.975; 29) = 2.045.
        assert!((t975(1) - 12.706).abs() < 1e-3);
        assert!((t975(9) - 2.262).abs() < 1e-3);
        assert!((t975(29) - 2.045).abs() < 1e-3);
    }

    #[test]
    fn the_interval_is_over_seeds_from_log_ratios() {
        // Router a is exactly 0.5× router b on every request of every seed: 0.5, no spread.
        let b: Vec<RunData> = (0..5).map(|s| noisy(s, 400, 100.0)).collect();
        let a: Vec<RunData> = b.iter().map(|r| scaled(r, 0.5)).collect();
        let c = ratio_cis(&a, &b, &[Stat::Ttft(95.0)])[0].clone();
        assert!((c.ratio.unwrap() - 0.5).abs() < 1e-12);
        let [lo, hi] = c.ci95.unwrap();
        assert!((lo - 0.5).abs() < 1e-12 && (hi - 0.5).abs() < 1e-12);
        assert_eq!(c.seeds, 5);

        // Per-seed ratios 0.5 and 2: geometric mean 1, interval exp(±12.706 · ln 2 · √2 / √2).
        let a2 = vec![scaled(&b[0], 0.5), scaled(&b[1], 2.0)];
        let c = ratio_cis(&a2, &b[..2], &[Stat::Ttft(95.0)])[0].clone();
        assert!((c.ratio.unwrap() - 1.0).abs() < 1e-9);
        let [lo, hi] = c.ci95.unwrap();
        let half = 12.706_f64 * 2f64.ln();
        assert!(
            (lo.ln() + half).abs() < 1e-2 && (hi.ln() - half).abs() < 1e-2,
            "{lo} {hi}"
        );

        // Ten seeds scattered around 0.8: the interval holds 0.8 and is far narrower than two
        // seeds' with the same scatter.
        let ks = [0.7, 0.9, 0.75, 0.85, 0.8, 0.72, 0.88, 0.78, 0.82, 0.8];
        let b10: Vec<RunData> = (0..10).map(|s| noisy(s, 200, 100.0)).collect();
        let a10: Vec<RunData> = b10.iter().zip(ks).map(|(r, k)| scaled(r, k)).collect();
        let ten = ratio_cis(&a10, &b10, &[Stat::Ttft(50.0)])[0].clone();
        let [lo, hi] = ten.ci95.unwrap();
        assert!(lo < 0.8 && hi > 0.8 && hi < 0.9 && lo > 0.7, "{lo} {hi}");
        let two = ratio_cis(&a10[..2], &b10[..2], &[Stat::Ttft(50.0)])[0].clone();
        let [lo2, hi2] = two.ci95.unwrap();
        assert!(
            hi2 / lo2 > 3.0 * (hi / lo),
            "two seeds {lo2}..{hi2} vs ten {lo}..{hi}"
        );
    }

    #[test]
    fn one_seed_or_a_failed_percentile_gives_no_interval() {
        let b = vec![noisy(1, 100, 10.0), noisy(2, 100, 10.0)];
        let a: Vec<RunData> = b.iter().map(|r| scaled(r, 0.9)).collect();
        let one = ratio_cis(&a[..1], &b[..1], &[Stat::Ttft(95.0)])[0].clone();
        assert!((one.ratio.unwrap() - 0.9).abs() < 1e-9 && one.ci95.is_none());
        // A seed whose p99 is a failure (+∞): that ratio is infinite, so no interval; the
        // point is ∞.
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        v[99] = f64::INFINITY;
        v[98] = f64::INFINITY;
        let failed = vec![run(1, &v, 10.0), scaled(&b[1], 0.9)];
        let c = ratio_cis(&failed, &b, &[Stat::Ttft(99.0)])[0].clone();
        assert!(c.ci95.is_none() && c.ratio == Some(f64::INFINITY));
    }

    #[test]
    fn run_level_figures_need_two_seeds_for_an_interval() {
        let mut a = vec![noisy(1, 50, 10.0), noisy(2, 50, 10.0)];
        let mut b = a.clone();
        for (i, r) in a.iter_mut().enumerate() {
            r.scalars
                .insert("adapter_loads".into(), 10.0 + 10.0 * i as f64);
        }
        for r in &mut b {
            r.scalars.insert("adapter_loads".into(), 40.0);
        }
        let s = [Stat::Scalar("adapter_loads")];
        let two = ratio_cis(&a, &b, &s)[0].clone();
        // Per seed 0.25 and 0.5: geometric mean √(0.125).
        assert!((two.ratio.unwrap() - 0.125f64.sqrt()).abs() < 1e-12);
        assert!(two.ci95.is_some());
        let one = ratio_cis(&a[..1], &b[..1], &s)[0].clone();
        assert!(one.ratio.is_some() && one.ci95.is_none());
    }

    #[test]
    fn bisection_finds_a_threshold() {
        for limit in [0.3, 3.7, 12.0, 19.9, 150.0] {
            let mut b = Bisection::new(5.0, 0.05, 30);
            while let Some(r) = b.next_rate() {
                b.record(r, r <= limit);
            }
            let g = b.goodput();
            assert!(g <= limit && g >= limit / 1.05, "limit {limit}: {g}");
            assert!(b.probes.len() <= 20, "{}", b.probes.len());
        }
        // Nothing passes: goodput 0 after halving down to start/64.
        let mut b = Bisection::new(8.0, 0.05, 30);
        while let Some(r) = b.next_rate() {
            b.record(r, false);
        }
        assert_eq!(b.goodput(), 0.0);
        assert!(b.probes.iter().all(|(r, _)| *r >= 8.0 / 64.0));
        // The probe budget is respected.
        let mut b = Bisection::new(1.0, 0.0001, 4);
        while let Some(r) = b.next_rate() {
            b.record(r, true);
        }
        assert_eq!(b.probes.len(), 4);
        assert_eq!(b.goodput(), 8.0);
    }

    #[test]
    fn bisection_keeps_a_valid_bracket_when_noise_breaks_monotonicity() {
        let mut b = Bisection::new(10.0, 0.05, 30);
        b.record(10.0, true);
        b.record(20.0, false);
        b.record(14.0, true);
        b.record(17.0, false);
        b.record(15.0, true);
        // A late pass above the lowest fail does not raise the goodput above that fail.
        b.record(18.0, true);
        assert_eq!(b.fail, Some(17.0));
        assert_eq!(b.goodput(), 15.0);
    }
}
