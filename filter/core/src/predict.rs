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
}

/// A pod's predicted prefill behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Milliseconds per prompt token of queued or own prefill work.
    pub cost_ms_per_token: f64,
    /// Fixed latency (scheduling, first decode step, network), ms.
    pub base_ms: f64,
}

impl Rate {
    /// Predicted time to first token for `work` tokens of prefill ahead of and including ours.
    pub fn ttft_ms(&self, work_tokens: f64) -> f64 {
        self.base_ms + work_tokens.max(0.0) * self.cost_ms_per_token
    }
}

impl Fit {
    /// Adds one observation: `work` tokens were ahead (including the request's `own` uncached
    /// ones), the first byte came after `ttft_ms`. Non-finite or negative inputs are ignored.
    pub fn observe(&mut self, work: f64, own: f64, ttft_ms: f64) {
        if !(work.is_finite() && ttft_ms.is_finite() && work >= 0.0 && ttft_ms >= 0.0) {
            return;
        }
        let d = DECAY;
        self.n = self.n * d + 1.0;
        self.sw = self.sw * d + work;
        self.st = self.st * d + ttft_ms;
        self.sww = self.sww * d + work * work;
        self.swt = self.swt * d + work * ttft_ms;
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
        let var = self.n * self.sww - self.sw * self.sw;
        let (mut cost, mut base) = (f64::NAN, f64::NAN);
        if var > 1e-9 * self.n * self.sww {
            cost = (self.n * self.swt - self.sw * self.st) / var;
            base = (self.st - cost * self.sw) / self.n;
        }
        if !(cost.is_finite() && base.is_finite() && cost > 0.0 && base >= 0.0) {
            // Through the origin: minimises Σ(t − c·w)².
            cost = if self.sww > 0.0 {
                self.swt / self.sww
            } else {
                0.0
            };
            base = 0.0;
        }
        // The regression's slope is diluted towards zero; the prefill-dominated observations'
        // is not. The larger one wins and the intercept follows it through the mean.
        if let Some(p) = self.prefill_cost().filter(|p| *p > cost) {
            cost = p;
            base = ((self.st - cost * self.sw) / self.n).max(0.0);
        }
        Some(Rate {
            cost_ms_per_token: cost.clamp(MIN_COST_MS_PER_TOKEN, MAX_COST_MS_PER_TOKEN),
            base_ms: base.clamp(0.0, MAX_BASE_MS),
        })
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
    Rate {
        cost_ms_per_token: rates
            .get(mid)
            .map_or(prior.cost_ms_per_token, |r| r.cost_ms_per_token),
        base_ms: bases.get(mid).copied().unwrap_or(prior.base_ms),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn a_line_is_recovered_from_noiseless_observations() {
        let mut f = Fit::default();
        assert_eq!(f.rate(), None);
        for w in [100.0, 2_000.0, 500.0, 8_000.0, 50.0, 3_000.0] {
            f.observe(w, 0.0, 40.0 + 0.25 * w);
        }
        let r = f.rate().unwrap();
        assert!(close(r.cost_ms_per_token, 0.25, 1e-6), "{r:?}");
        assert!(close(r.base_ms, 40.0, 1e-6), "{r:?}");
        assert!(close(r.ttft_ms(1_000.0), 290.0, 1e-6));
    }

    #[test]
    fn a_fast_and_a_slow_pod_learn_different_costs() {
        let (mut fast, mut slow) = (Fit::default(), Fit::default());
        for i in 0..30 {
            let w = 200.0 + 150.0 * f64::from(i % 7);
            fast.observe(w, 0.0, 10.0 + 0.02 * w);
            slow.observe(w, 0.0, 40.0 + 0.3 * w);
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
            f.observe(w, 0.0, 0.5 * w);
        }
        // The pod got 4× faster: after a few dozen observations the fit follows.
        for i in 0..60 {
            let w = 100.0 + 100.0 * f64::from(i % 5);
            f.observe(w, 0.0, 0.125 * w);
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
            f.observe(counted, own, base + cost * own + 5.0 * noise());
        }
        let diluted = f.rate().unwrap().cost_ms_per_token;
        assert!(diluted < 0.3 * cost, "the regression alone: {diluted}");
        assert_eq!(f.prefill_cost(), None);
        for own in [4_000.0, 2_500.0] {
            f.observe(own, own, base + cost * own);
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
            g.observe(10_000.0, 2_000.0, 900.0);
        }
        assert_eq!(g.prefill_cost(), None);
    }

    #[test]
    fn constant_work_falls_back_to_a_line_through_the_origin() {
        let mut f = Fit::default();
        for _ in 0..5 {
            f.observe(1_000.0, 0.0, 200.0);
        }
        let r = f.rate().unwrap();
        assert!(close(r.cost_ms_per_token, 0.2, 1e-6), "{r:?}");
        assert_eq!(r.base_ms, 0.0);
    }

    #[test]
    fn garbage_is_ignored_and_bounds_hold() {
        let mut f = Fit::default();
        f.observe(f64::NAN, 0.0, 1.0);
        f.observe(-1.0, 0.0, 1.0);
        f.observe(1.0, 0.0, f64::INFINITY);
        assert_eq!(f, Fit::default());
        for _ in 0..5 {
            f.observe(1.0, 0.0, 1e9);
        }
        let r = f.rate().unwrap();
        assert!(r.cost_ms_per_token <= MAX_COST_MS_PER_TOKEN && r.base_ms <= MAX_BASE_MS);
    }

    #[test]
    fn the_pool_rate_is_the_median_or_the_prior() {
        let prior = Rate {
            cost_ms_per_token: 0.2,
            base_ms: 30.0,
        };
        assert_eq!(pool_rate(std::iter::empty(), prior), prior);
        let r = |c: f64, b: f64| Rate {
            cost_ms_per_token: c,
            base_ms: b,
        };
        let p = pool_rate([r(0.1, 5.0), r(1.0, 50.0), r(0.3, 20.0)].into_iter(), prior);
        assert_eq!(p, r(0.3, 20.0));
    }
}
