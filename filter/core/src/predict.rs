//! Time to first token per pod, learned from this proxy's own traffic (no predictor service).
//!
//! For every streamed request the filter knows the prefill work that was ahead of it on its pod
//! when it was routed — the estimated prompt tokens of the requests this proxy had sent there and
//! that had not yet returned a first response byte, plus its own uncached tokens — and, when the
//! first response byte arrives, how long that took. A pod serves prefill work at some rate after
//! some fixed latency, so per pod `ttft ≈ base + work × cost`, where `cost` is milliseconds per
//! token. [`Fit`] keeps exponentially decayed sums of `(work, ttft)` pairs and solves that line
//! by least squares: a handful of numbers per pod, updated in O(1), stored in shared data with
//! the pod's in-flight count so every worker reads and improves the same estimate.
//!
//! A fast pod (H100) learns a small `cost`, a slow one (A10G) a large one; a pod whose engine
//! exports no load metrics is still predicted from its own history.
//!
//! That line alone underestimates `cost`, often by far. The work ahead is known only roughly —
//! a request counted as pending may be half prefilled already — and most observations are warm
//! requests whose TTFT is mostly the engine's step time, so the work hardly varies: errors in
//! the regressor flatten the fitted slope towards zero and push the intercept up (regression
//! dilution). Seen on the bench's shared-prefix scenario (A10G-like pods, 0.083 ms per token in
//! wall time): fitted costs of 0.002–0.054 ms per token, intercepts up to 535 ms. With such a
//! cost a cached 4,000-token context is worth a few ms, and a warm request goes to a cold pod
//! whose fitted intercept happens to be lower. So the fit also keeps a second estimate from the
//! observations that measure prefill directly: the request's own uncached tokens were most of
//! the work ahead of it and many tokens ([`PREFILL_MIN_TOKENS`]), so its TTFT is its own
//! prefill. Through the origin (`Σ w·t / Σ w²`), it errs high by at most `base / w` (≈ 15 % on
//! the emulated pods), never towards zero. The pod's cost is the larger of the two and the
//! intercept is solved again for it.
//!
//! A pod's TTFT also grows with the requests it is already serving: each engine step runs the
//! whole batch, so a new request's prefill shares its steps with every running decode (and on a
//! CPU-served pod the API server streaming their tokens takes the same core). Prefill work
//! alone does not see it: two pods with empty queues predict the same TTFT at 2 running
//! requests and at 10, and a tie-break (the KV scorer's fraction, which favours the pod with
//! more KV blocks) then loads one pod while another idles. Seen on two real vLLM pods of equal
//! compute, one with fewer sequences and KV blocks: the filter sent 58–75 % of requests to the
//! other and its TTFT p50 was 1.3–1.5× round robin's (issue 40). So the line has a second
//! regressor, the pod's batch when the request was routed ([`crate::candidate::Candidate::batch`]):
//! `ttft ≈ base + work × cost + batch × batch_ms`, solved by least squares on the same decayed
//! sums. A pod whose steps barely slow with the batch (a GPU) learns a small `batch_ms`; one
//! whose core is shared learns a large one. When the batch did not vary enough to separate its
//! effect, or the effect comes out negative, `batch_ms` is 0 and the line is the one above.

/// Weight kept by old observations at each new one (≈ the last 20 observations count).
pub const DECAY: f64 = 0.95;
/// Observations needed before a pod's own fit is trusted over the pool's.
pub const MIN_OBSERVATIONS: f64 = 3.0;
/// Weight kept by old prefill-dominated observations at each new one: they are rarer (a cold
/// context, a long new prompt), and a pod's prefill speed changes slowly.
pub const PREFILL_DECAY: f64 = 0.9;
/// Own uncached tokens from which an observation measures prefill speed, when they are also at
/// least [`PREFILL_MIN_SHARE`] of the work ahead.
pub const PREFILL_MIN_TOKENS: f64 = 1024.0;
pub const PREFILL_MIN_SHARE: f64 = 0.8;
/// Decayed weight of prefill-dominated observations needed before they count (two recent ones).
pub const PREFILL_MIN_OBSERVATIONS: f64 = 1.5;
/// Bounds that keep a wild fit (clock jumps, a stalled pod) from ruling the ranking.
const MIN_COST_MS_PER_TOKEN: f64 = 1e-4;
const MAX_COST_MS_PER_TOKEN: f64 = 100.0;
const MAX_BASE_MS: f64 = 60_000.0;
const MAX_BATCH_MS: f64 = 10_000.0;
/// Variance of the batch (requests²) below which its effect is not fitted: a pod whose batch
/// hardly changed says nothing about what a larger one costs.
const BATCH_MIN_VARIANCE: f64 = 0.05;
/// Standard errors taken off a fitted batch effect: what is kept is a lower bound on it (≈ 97.5
/// % one-sided), so noise in the TTFTs (warm requests whose counted work is mostly already
/// prefilled) does not pass for an effect and move traffic; 0 when the bound is not above 0.
const BATCH_SURE_SE: f64 = 2.0;

/// Decayed least-squares sums of (work tokens, TTFT ms) for one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fit {
    /// Sum of weights (effective number of observations).
    pub n: f64,
    pub sw: f64,
    pub st: f64,
    pub sww: f64,
    pub swt: f64,
    /// Decayed weight, Σ w² and Σ w·t of the prefill-dominated observations.
    pub pn: f64,
    pub pww: f64,
    pub pwt: f64,
    /// Σ b, Σ b², Σ w·b and Σ b·t of the pod's batch `b` at routing, and Σ t² (for how
    /// sure the batch effect is).
    pub sb: f64,
    pub sbb: f64,
    pub swb: f64,
    pub sbt: f64,
    pub stt: f64,
}

/// A pod's predicted prefill behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Milliseconds per prompt token of queued or own prefill work.
    pub cost_ms_per_token: f64,
    /// Fixed latency (scheduling, first decode step, network), ms.
    pub base_ms: f64,
    /// Milliseconds each request in the pod's batch adds.
    pub batch_ms: f64,
}

impl Rate {
    /// A rate with no batch effect (a prior, a test).
    pub const fn flat(cost_ms_per_token: f64, base_ms: f64) -> Rate {
        Rate {
            cost_ms_per_token,
            base_ms,
            batch_ms: 0.0,
        }
    }

    /// Predicted time to first token for `work` tokens of prefill ahead of and including ours,
    /// on a pod serving `batch` requests.
    pub fn ttft_ms(&self, work_tokens: f64, batch: f64) -> f64 {
        self.base_ms
            + work_tokens.max(0.0) * self.cost_ms_per_token
            + batch.max(0.0) * self.batch_ms
    }
}

/// One observation of a pod: what was ahead of a request there when it was routed, and how
/// long its first byte took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Prefill tokens ahead of and including the request's own uncached ones.
    pub work: f64,
    /// Requests the pod was serving ([`crate::candidate::Candidate::batch`]).
    pub batch: f64,
    pub ttft_ms: f64,
}

impl Fit {
    /// Adds one observation (`own`: the request's uncached tokens among the work). Non-finite
    /// or negative inputs are ignored.
    pub fn observe(&mut self, o: Observation, own: f64) {
        let Observation {
            work,
            batch,
            ttft_ms,
        } = o;
        if !([work, batch, ttft_ms]
            .iter()
            .all(|x| x.is_finite() && *x >= 0.0))
        {
            return;
        }
        let d = DECAY;
        self.n = self.n * d + 1.0;
        self.sw = self.sw * d + work;
        self.st = self.st * d + ttft_ms;
        self.sww = self.sww * d + work * work;
        self.swt = self.swt * d + work * ttft_ms;
        self.sb = self.sb * d + batch;
        self.sbb = self.sbb * d + batch * batch;
        self.swb = self.swb * d + work * batch;
        self.sbt = self.sbt * d + batch * ttft_ms;
        self.stt = self.stt * d + ttft_ms * ttft_ms;
        if own.is_finite() && own >= PREFILL_MIN_TOKENS && own >= PREFILL_MIN_SHARE * work {
            let d = PREFILL_DECAY;
            self.pn = self.pn * d + 1.0;
            self.pww = self.pww * d + work * work;
            self.pwt = self.pwt * d + work * ttft_ms;
        }
    }

    /// Milliseconds per token measured by the prefill-dominated observations, once there are
    /// enough of them.
    pub fn prefill_cost(&self) -> Option<f64> {
        (self.pn >= PREFILL_MIN_OBSERVATIONS && self.pww > 0.0)
            .then(|| self.pwt / self.pww)
            .filter(|c| c.is_finite() && *c > 0.0)
    }

    /// Whether enough observations back this fit.
    pub fn trusted(&self) -> bool {
        self.n >= MIN_OBSERVATIONS
    }

    /// The least-squares line, or `None` without enough observations. When the observed work
    /// did not vary enough to separate slope from intercept, or the line comes out with a
    /// negative part, falls back to a line through the origin.
    pub fn rate(&self) -> Option<Rate> {
        if !self.trusted() || self.sw <= 0.0 {
            return None;
        }
        let (mut cost, mut base, mut batch) = self
            .line_with_batch()
            .unwrap_or_else(|| self.line_without_batch());
        // The regression's slope is diluted towards zero; the prefill-dominated observations'
        // is not. The larger one wins and the rest of the line is solved again for it.
        if let Some(p) = self.prefill_cost().filter(|p| *p > cost) {
            cost = p;
            (base, batch) = self.line_for_cost(p);
        }
        Some(Rate {
            cost_ms_per_token: cost.clamp(MIN_COST_MS_PER_TOKEN, MAX_COST_MS_PER_TOKEN),
            base_ms: base.clamp(0.0, MAX_BASE_MS),
            batch_ms: batch.clamp(0.0, MAX_BATCH_MS),
        })
    }

    /// Centred sums: (Σ(w−w̄)², Σ(b−b̄)², Σ(w−w̄)(b−b̄), Σ(w−w̄)(t−t̄), Σ(b−b̄)(t−t̄),
    /// Σ(t−t̄)²).
    fn centred(&self) -> [f64; 6] {
        let n = self.n;
        [
            self.sww - self.sw * self.sw / n,
            self.sbb - self.sb * self.sb / n,
            self.swb - self.sw * self.sb / n,
            self.swt - self.sw * self.st / n,
            self.sbt - self.sb * self.st / n,
            self.stt - self.st * self.st / n,
        ]
    }

    /// `(cost, base, batch_ms)` of the line in both work and batch, when the batch varied
    /// enough, independently of the work, to tell their effects apart, and the batch effect is
    /// sure to be positive ([`BATCH_SURE_SE`]; what is kept is its lower bound). Otherwise the
    /// plain line stands.
    fn line_with_batch(&self) -> Option<(f64, f64, f64)> {
        let [ww, bb, wb, wt, bt, tt] = self.centred();
        let det = ww * bb - wb * wb;
        if !(bb > BATCH_MIN_VARIANCE * self.n && det > 1e-6 * ww * bb && self.n > 3.0) {
            return None;
        }
        let cost = (wt * bb - wb * bt) / det;
        let batch = (ww * bt - wb * wt) / det;
        // Residual variance with three fitted parameters; Var(batch) = s² · Σ(w−w̄)² / det.
        let s2 = ((tt - cost * wt - batch * bt) / (self.n - 3.0)).max(0.0);
        let sure = batch - BATCH_SURE_SE * (s2 * ww / det).sqrt();
        let base = (self.st - cost * self.sw - sure * self.sb) / self.n;
        [cost, sure, base]
            .iter()
            .all(|x| x.is_finite() && *x > 0.0)
            .then_some((cost, base, sure))
    }

    /// `(cost, base, 0)`: the line in work alone; through the origin when the work did not vary
    /// enough to separate slope from intercept, or the line comes out with a negative part.
    fn line_without_batch(&self) -> (f64, f64, f64) {
        let var = self.n * self.sww - self.sw * self.sw;
        if var > 1e-9 * self.n * self.sww {
            let cost = (self.n * self.swt - self.sw * self.st) / var;
            let base = (self.st - cost * self.sw) / self.n;
            if cost.is_finite() && base.is_finite() && cost > 0.0 && base >= 0.0 {
                return (cost, base, 0.0);
            }
        }
        // Through the origin: minimises Σ(t − c·w)².
        let cost = if self.sww > 0.0 {
            self.swt / self.sww
        } else {
            0.0
        };
        (cost, 0.0, 0.0)
    }

    /// `(base, batch_ms)` of the line with its cost fixed at `cost`: what is left of each TTFT
    /// after `cost × work`, fitted on the batch (its sure part, as in [`Fit::line_with_batch`];
    /// 0 when the batch did not vary), its intercept through the means.
    fn line_for_cost(&self, cost: f64) -> (f64, f64) {
        let [ww, bb, wb, wt, bt, tt] = self.centred();
        let mut batch = 0.0;
        if bb > BATCH_MIN_VARIANCE * self.n && self.n > 2.0 {
            // The residual r = t − cost·w: Σ(r−r̄)(b−b̄) and Σ(r−r̄)².
            let rb = bt - cost * wb;
            let rr = tt - 2.0 * cost * wt + cost * cost * ww;
            let fitted = rb / bb;
            let s2 = ((rr - fitted * rb) / (self.n - 2.0)).max(0.0);
            let sure = fitted - BATCH_SURE_SE * (s2 / bb).sqrt();
            if sure.is_finite() {
                batch = sure.max(0.0);
            }
        }
        let base = (self.st - cost * self.sw - batch * self.sb) / self.n;
        (base.max(0.0), batch)
    }
}

/// The rate to assume for pods without a trusted fit: the median of the pool's fitted pods, or
/// `prior` when none is fitted yet (then every pod is alike and ranking follows queued work).
pub fn pool_rate(fitted: impl Iterator<Item = Rate>, prior: Rate) -> Rate {
    let mut rates: Vec<Rate> = fitted.collect();
    if rates.is_empty() {
        return prior;
    }
    rates.sort_by(|a, b| a.cost_ms_per_token.total_cmp(&b.cost_ms_per_token));
    let mid = rates.len() / 2;
    let mut bases: Vec<f64> = rates.iter().map(|r| r.base_ms).collect();
    bases.sort_by(f64::total_cmp);
    let mut batches: Vec<f64> = rates.iter().map(|r| r.batch_ms).collect();
    batches.sort_by(f64::total_cmp);
    Rate {
        cost_ms_per_token: rates
            .get(mid)
            .map_or(prior.cost_ms_per_token, |r| r.cost_ms_per_token),
        base_ms: bases.get(mid).copied().unwrap_or(prior.base_ms),
        batch_ms: batches.get(mid).copied().unwrap_or(prior.batch_ms),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An observation at batch 0.
    fn obs(work: f64, ttft_ms: f64) -> Observation {
        Observation {
            work,
            batch: 0.0,
            ttft_ms,
        }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn a_line_is_recovered_from_noiseless_observations() {
        let mut f = Fit::default();
        assert_eq!(f.rate(), None);
        for w in [100.0, 2_000.0, 500.0, 8_000.0, 50.0, 3_000.0] {
            f.observe(obs(w, 40.0 + 0.25 * w), 0.0);
        }
        let r = f.rate().unwrap();
        assert!(close(r.cost_ms_per_token, 0.25, 1e-6), "{r:?}");
        assert!(close(r.base_ms, 40.0, 1e-6), "{r:?}");
        assert!(close(r.ttft_ms(1_000.0, 0.0), 290.0, 1e-6));
    }

    #[test]
    fn a_fast_and_a_slow_pod_learn_different_costs() {
        let (mut fast, mut slow) = (Fit::default(), Fit::default());
        for i in 0..30 {
            let w = 200.0 + 150.0 * f64::from(i % 7);
            fast.observe(obs(w, 10.0 + 0.02 * w), 0.0);
            slow.observe(obs(w, 40.0 + 0.3 * w), 0.0);
        }
        let (f, s) = (fast.rate().unwrap(), slow.rate().unwrap());
        assert!(
            s.cost_ms_per_token > 10.0 * f.cost_ms_per_token,
            "{f:?} {s:?}"
        );
    }

    #[test]
    fn old_observations_fade() {
        let mut f = Fit::default();
        for i in 0..40 {
            let w = 100.0 + 100.0 * f64::from(i % 5);
            f.observe(obs(w, 0.5 * w), 0.0);
        }
        // The pod got 4× faster: after a few dozen observations the fit follows.
        for i in 0..60 {
            let w = 100.0 + 100.0 * f64::from(i % 5);
            f.observe(obs(w, 0.125 * w), 0.0);
        }
        let r = f.rate().unwrap();
        assert!(r.cost_ms_per_token < 0.16, "{r:?}");
    }

    /// Warm requests whose counted work is mostly noise (pending tokens already prefilled)
    /// flatten the regression; a few prefill-dominated observations restore the slope.
    #[test]
    fn prefill_dominated_observations_undo_the_dilution_of_the_slope() {
        let (base, cost) = (11.0, 0.083);
        let mut f = Fit::default();
        let mut x: u64 = 7;
        let mut noise = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as f64 / (1u64 << 31) as f64
        };
        for _ in 0..60 {
            let own = 100.0 + 200.0 * noise();
            let counted = own + 3_000.0 * noise();
            f.observe(obs(counted, base + cost * own + 5.0 * noise()), own);
        }
        let diluted = f.rate().unwrap().cost_ms_per_token;
        assert!(diluted < 0.3 * cost, "the regression alone: {diluted}");
        assert_eq!(f.prefill_cost(), None);
        for own in [4_000.0, 2_500.0] {
            f.observe(obs(own, base + cost * own), own);
        }
        let r = f.rate().unwrap();
        assert!(
            r.cost_ms_per_token > 0.95 * cost && r.cost_ms_per_token < 1.2 * cost,
            "{r:?}"
        );
        // The intercept follows the larger slope through the mean instead of staying inflated.
        assert!(r.base_ms < base * 2.0, "{r:?}");
        // A long prompt behind a longer queue says nothing about prefill speed alone.
        let mut g = Fit::default();
        for _ in 0..5 {
            g.observe(obs(10_000.0, 900.0), 2_000.0);
        }
        assert_eq!(g.prefill_cost(), None);
    }

    /// A pseudo-random sequence in [0, 1) for the tests' noise and spread.
    fn lcg(seed: u64) -> impl FnMut() -> f64 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as f64 / (1u64 << 31) as f64
        }
    }

    #[test]
    fn the_batch_effect_is_learned_beside_the_prefill_cost() {
        let mut f = Fit::default();
        let mut u = lcg(11);
        for _ in 0..200 {
            let work = 200.0 + 1_500.0 * u();
            let batch = (12.0 * u()).floor();
            let o = Observation {
                work,
                batch,
                ttft_ms: 8.0 + 0.05 * work + 4.0 * batch,
            };
            f.observe(o, 0.0);
        }
        let r = f.rate().unwrap();
        assert!(close(r.batch_ms, 4.0, 1e-6), "{r:?}");
        assert!(close(r.cost_ms_per_token, 0.05, 1e-6), "{r:?}");
        assert!(close(r.base_ms, 8.0, 1e-6), "{r:?}");
        // Two pods with nothing queued: the busier one is predicted slower by its batch.
        assert!(close(
            r.ttft_ms(500.0, 10.0) - r.ttft_ms(500.0, 2.0),
            32.0,
            1e-6
        ));
    }

    #[test]
    fn a_batch_that_never_varies_or_seems_to_help_adds_nothing() {
        let (mut still, mut helps) = (Fit::default(), Fit::default());
        let mut u = lcg(5);
        for _ in 0..100 {
            let work = 100.0 + 900.0 * u();
            let batch = (8.0 * u()).floor();
            still.observe(
                Observation {
                    work,
                    batch: 3.0,
                    ttft_ms: 20.0 + 0.1 * work,
                },
                0.0,
            );
            helps.observe(
                Observation {
                    work,
                    batch,
                    ttft_ms: 60.0 + 0.1 * work - 2.0 * batch,
                },
                0.0,
            );
        }
        let r = still.rate().unwrap();
        assert_eq!(r.batch_ms, 0.0);
        assert!(close(r.cost_ms_per_token, 0.1, 1e-6) && close(r.base_ms, 20.0, 1e-6));
        let r = helps.rate().unwrap();
        assert_eq!(r.batch_ms, 0.0, "{r:?}");
        assert!(close(r.cost_ms_per_token, 0.1, 0.1), "{r:?}");
    }

    /// When the prefill-dominated observations set the cost, the batch effect is fitted again
    /// on what that cost leaves of each TTFT: a large one is found, one lost in the noise of
    /// the counted work is not believed.
    #[test]
    fn the_batch_effect_is_fitted_again_when_the_prefill_cost_takes_over() {
        let fitted = |per: f64| {
            let (base, cost) = (11.0, 0.083);
            let mut f = Fit::default();
            let mut u = lcg(7);
            for _ in 0..60 {
                let own = 100.0 + 200.0 * u();
                let counted = own + 3_000.0 * u();
                let batch = (10.0 * u()).floor();
                let o = Observation {
                    work: counted,
                    batch,
                    ttft_ms: base + cost * own + per * batch,
                };
                f.observe(o, own);
            }
            for own in [4_000.0, 2_500.0] {
                let o = Observation {
                    work: own,
                    batch: 1.0,
                    ttft_ms: base + cost * own + per,
                };
                f.observe(o, own);
            }
            f.rate().unwrap()
        };
        let strong = fitted(40.0);
        assert!(strong.cost_ms_per_token > 0.95 * 0.083, "{strong:?}");
        assert!(
            strong.batch_ms > 10.0 && strong.batch_ms < 40.0,
            "{strong:?}"
        );
        let weak = fitted(1.0);
        assert_eq!(weak.batch_ms, 0.0, "{weak:?}");
    }

    #[test]
    fn constant_work_falls_back_to_a_line_through_the_origin() {
        let mut f = Fit::default();
        for _ in 0..5 {
            f.observe(obs(1_000.0, 200.0), 0.0);
        }
        let r = f.rate().unwrap();
        assert!(close(r.cost_ms_per_token, 0.2, 1e-6), "{r:?}");
        assert_eq!(r.base_ms, 0.0);
    }

    #[test]
    fn garbage_is_ignored_and_bounds_hold() {
        let mut f = Fit::default();
        f.observe(obs(f64::NAN, 1.0), 0.0);
        f.observe(obs(-1.0, 1.0), 0.0);
        f.observe(obs(1.0, f64::INFINITY), 0.0);
        assert_eq!(f, Fit::default());
        for _ in 0..5 {
            f.observe(obs(1.0, 1e9), 0.0);
        }
        let r = f.rate().unwrap();
        assert!(r.cost_ms_per_token <= MAX_COST_MS_PER_TOKEN && r.base_ms <= MAX_BASE_MS);
    }

    #[test]
    fn the_pool_rate_is_the_median_or_the_prior() {
        let prior = Rate::flat(0.2, 30.0);
        assert_eq!(pool_rate(std::iter::empty(), prior), prior);
        let r = Rate::flat;
        let p = pool_rate([r(0.1, 5.0), r(1.0, 50.0), r(0.3, 20.0)].into_iter(), prior);
        assert_eq!(p, r(0.3, 20.0));
    }
}
