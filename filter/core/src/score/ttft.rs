//! `ttft`: predicted time to first token, from work queued in tokens and each pod's speed.
//!
//! `predicted = base + (queued prefill tokens + this request's uncached tokens) × ms per token`,
//! with each pod's `base` and cost learned from this proxy's own traffic ([`crate::predict`]).
//! A cached prefix lowers the uncached tokens, so the prefill a pod saves and the work queued
//! there are weighed in the same unit. The value is `(best + c) / (predicted + c)`: 1 for the
//! fastest pod, ½ for a pod predicted twice as slow (`c` keeps near-zero predictions from
//! turning noise into large ratios).
//!
//! A pod that lacks a prefix another candidate holds is also charged the prefill it would do
//! *again* (its uncached tokens beyond the fewest any candidate needs), once more at its own
//! speed: that work is not only this request's wait, it is a second copy of the context in a
//! second pod's KV cache and prefill every later request queued there waits behind. Without
//! the charge a warm request whose home has a short queue moves to a cold idle pod at an even
//! predicted time, re-prefills its whole context there, and each such move pushes other
//! contexts out of the cache. Measured on the bench's shared-prefix scenario (5 seeds each,
//! `test-harness/bench/results/peers-v1.md` and `peers-v2-shared_prefix.md`): the filter's
//! TTFT p95 went from 1.91× [1.34, 3.40] to 1.09× [1.00, 1.19] that of sglang-router's
//! `cache_aware` (which keeps strict prefix affinity). A hot context still gets a second copy
//! once its home's queue is longer than re-prefilling it twice.

use super::Inputs;

/// Milliseconds added to both sides of the ratio.
const SMOOTH_MS: f64 = 10.0;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    let fewest = x
        .cands
        .iter()
        .map(|c| c.uncached_tokens(x.req))
        .fold(f64::INFINITY, f64::min);
    let mut best = f64::INFINITY;
    for (o, c) in out.iter_mut().zip(x.cands) {
        let again = (c.uncached_tokens(x.req) - fewest).max(0.0);
        *o = c.predicted_ttft_ms(x.req, x.mode) + again * c.rate.cost_ms_per_token.max(0.0);
        best = best.min(*o);
    }
    for o in out.iter_mut() {
        *o = (best + SMOOTH_MS) / (*o + SMOOTH_MS);
    }
    true
}
