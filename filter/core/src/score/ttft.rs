//! `ttft`: predicted time to first token, from work queued in tokens and each pod's speed.
//!
//! `predicted = base + (queued prefill tokens + this request's uncached tokens) × ms per token`,
//! with each pod's `base` and cost learned from this proxy's own traffic ([`crate::predict`]).
//! A cached prefix lowers the uncached tokens, so the prefill a pod saves and the work queued
//! there are weighed in the same unit. The value is `(best + c) / (predicted + c)`: 1 for the
//! fastest pod, ½ for a pod predicted twice as slow (`c` keeps near-zero predictions from
//! turning noise into large ratios).

use super::Inputs;

/// Milliseconds added to both sides of the ratio.
const SMOOTH_MS: f64 = 10.0;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    let mut best = f64::INFINITY;
    for (o, c) in out.iter_mut().zip(x.cands) {
        *o = c.predicted_ttft_ms(x.req, x.mode);
        best = best.min(*o);
    }
    for o in out.iter_mut() {
        *o = (best + SMOOTH_MS) / (*o + SMOOTH_MS);
    }
    true
}
