//! The statistics that make a verdict hold: per-request observations of the measurement window,
//! paired bootstrap confidence intervals of router ÷ baseline ratios, and the bisection over
//! offered rate that finds goodput.
//!
//! Why a *hierarchical, paired* bootstrap: requests inside one run are not independent (a queue
//! that builds up delays every request behind it), so resampling requests alone understates the
//! run-to-run spread; the run (seed) is the independent unit. Each replicate therefore draws the
//! seeds with replacement and then, inside each drawn seed, the window's requests with
//! replacement (Davison & Hinkley's two-stage bootstrap for clustered data, conservative when the
//! within-run part is added). Both routers get the *same* draws (same seeds, same request ids):
//! every router was sent byte-identical traffic per seed, so the comparison is paired, which
//! removes the workload's own variance from the ratio. With one seed only the within-run stage is
//! left, and the interval then understates between-run variance (quick mode says so).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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

/// Nearest-rank percentile (`p` in 0..=100) of values that may hold +∞ (NaN when empty). Works
/// in place (reorders `v`).
pub fn percentile_inf(v: &mut [f64], p: f64) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    let k = rank.clamp(1, n) - 1;
    let (_, x, _) = v.select_nth_unstable_by(k, f64::total_cmp);
    *x
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

/// A ratio with its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioCi {
    /// Point estimate: pooled(a) ÷ pooled(b).
    pub ratio: Option<f64>,
    /// 2.5th and 97.5th percentiles of the bootstrap ratios (`None` when not estimable: a
    /// run-level figure with fewer than two seeds, or too many undefined replicates).
    pub ci95: Option<[f64; 2]>,
}

/// Bootstrap options.
#[derive(Debug, Clone, Copy)]
pub struct Bootstrap {
    /// Replicates.
    pub reps: usize,
    /// Seed of the resampling (results are reproducible).
    pub seed: u64,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            reps: 1000,
            seed: 0x5eed,
        }
    }
}

/// Paired hierarchical bootstrap of `stat(a) ÷ stat(b)` for every statistic in `stats`.
///
/// `a` and `b` are the same seeds' runs of two routers, in the same order (pairs are matched by
/// position and must share request ids; ids present in only one side are dropped). See the
/// module doc for why seeds and then requests are drawn, and drawn identically for both sides.
pub fn ratio_cis(a: &[RunData], b: &[RunData], stats: &[Stat], opts: Bootstrap) -> Vec<RatioCi> {
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
    let points: Vec<Option<f64>> = stats
        .iter()
        .map(|s| safe_ratio(pooled(*s, &pa), pooled(*s, &pb)))
        .collect();
    let (fa, fb): (Vec<Flat>, Vec<Flat>) = (
        pa.iter().map(Flat::new).collect(),
        pb.iter().map(Flat::new).collect(),
    );
    let mut buf = Vec::new();
    let k = pa.len();
    let mut reps: Vec<Vec<f64>> = vec![Vec::with_capacity(opts.reps); stats.len()];
    let mut undefined = vec![0usize; stats.len()];
    if k > 0 {
        let mut rng = StdRng::seed_from_u64(opts.seed);
        for _ in 0..opts.reps {
            let seeds: Vec<usize> = (0..k).map(|_| rng.random_range(0..k)).collect();
            let idx: Vec<Vec<usize>> = seeds
                .iter()
                .map(|&s| {
                    let n = fa[s].obs.len();
                    (0..n).map(|_| rng.random_range(0..n.max(1))).collect()
                })
                .collect();
            let ra: Vec<(&Flat, Option<&[usize]>)> = seeds
                .iter()
                .zip(&idx)
                .map(|(&s, ix)| (&fa[s], Some(ix.as_slice())))
                .collect();
            let rb: Vec<(&Flat, Option<&[usize]>)> = seeds
                .iter()
                .zip(&idx)
                .map(|(&s, ix)| (&fb[s], Some(ix.as_slice())))
                .collect();
            for (j, s) in stats.iter().enumerate() {
                let (x, y) = (eval(*s, &ra, &mut buf), eval(*s, &rb, &mut buf));
                match safe_ratio(x, y) {
                    Some(r) => reps[j].push(r),
                    None => undefined[j] += 1,
                }
            }
        }
    }
    stats
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let run_level = matches!(s, Stat::Scalar(_));
            let estimable = k > 0
                && !(run_level && k < 2)
                // More than 2.5 % undefined replicates would move a percentile end: no interval.
                && undefined[j] * 40 <= opts.reps;
            let ci95 = estimable.then(|| {
                let v = &mut reps[j];
                [percentile_inf(v, 2.5), percentile_inf(v, 97.5)]
            });
            RatioCi {
                ratio: points[j],
                ci95: ci95.filter(|c| !c[0].is_nan() && !c[1].is_nan()),
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

    /// A run of `n` requests whose TTFTs are lognormal-ish (deterministic from the seed).
    fn noisy(seed: u64, n: usize, scale: f64) -> RunData {
        let mut rng = StdRng::seed_from_u64(seed);
        let v: Vec<f64> = (0..n)
            .map(|_| scale * (1.0 + 3.0 * rng.random::<f64>().powi(3)))
            .collect();
        run(seed, &v, 10.0)
    }

    #[test]
    fn bootstrap_ci_covers_a_known_ratio_and_narrows_with_seeds() {
        // Router a is exactly 0.5× router b on every request: every replicate sees 0.5.
        let b: Vec<RunData> = (0..5).map(|s| noisy(s, 400, 100.0)).collect();
        let a: Vec<RunData> = b
            .iter()
            .map(|r| RunData {
                obs: r
                    .obs
                    .iter()
                    .map(|(k, o)| {
                        (
                            *k,
                            Obs {
                                ttft_ms: o.ttft_ms * 0.5,
                                ..*o
                            },
                        )
                    })
                    .collect(),
                ..r.clone()
            })
            .collect();
        let c = ratio_cis(&a, &b, &[Stat::Ttft(95.0)], Bootstrap::default());
        assert!((c[0].ratio.unwrap() - 0.5).abs() < 1e-12);
        let [lo, hi] = c[0].ci95.unwrap();
        assert!((lo - 0.5).abs() < 1e-12 && (hi - 0.5).abs() < 1e-12);

        // Independent noise (different request draws, same scale): the interval holds 1 and is
        // wider with one seed than with eight.
        let xa: Vec<RunData> = (10..18).map(|s| noisy(s, 300, 100.0)).collect();
        let xb: Vec<RunData> = (20..28).map(|s| noisy(s, 300, 100.0)).collect();
        let many = ratio_cis(&xa, &xb, &[Stat::Ttft(95.0)], Bootstrap::default())[0];
        let one = ratio_cis(
            &xa[..1],
            &xb[..1],
            &[Stat::Ttft(95.0)],
            Bootstrap::default(),
        )[0];
        let [lo, hi] = many.ci95.unwrap();
        assert!(lo < 1.0 && hi > 1.0, "{lo} {hi}");
        let [lo1, hi1] = one.ci95.unwrap();
        assert!(
            hi1 - lo1 > hi - lo,
            "one seed {lo1}..{hi1} vs eight {lo}..{hi}"
        );
        // Reproducible.
        assert_eq!(
            many,
            ratio_cis(&xa, &xb, &[Stat::Ttft(95.0)], Bootstrap::default())[0]
        );
    }

    #[test]
    fn run_level_figures_need_two_seeds_for_an_interval() {
        let mut a = vec![noisy(1, 50, 10.0), noisy(2, 50, 10.0)];
        let mut b = a.clone();
        for (i, r) in a.iter_mut().enumerate() {
            r.scalars.insert("adapter_loads".into(), 10.0 + i as f64);
        }
        for r in &mut b {
            r.scalars.insert("adapter_loads".into(), 40.0);
        }
        let s = [Stat::Scalar("adapter_loads")];
        let two = ratio_cis(&a, &b, &s, Bootstrap::default())[0];
        assert!((two.ratio.unwrap() - 10.5 / 40.0).abs() < 1e-12);
        let [lo, hi] = two.ci95.unwrap();
        assert!((lo - 0.25).abs() < 1e-12 && (hi - 11.0 / 40.0).abs() < 1e-12);
        let one = ratio_cis(&a[..1], &b[..1], &s, Bootstrap::default())[0];
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
