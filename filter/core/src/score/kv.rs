//! `kv_cache`: more free KV cache, `1 − kv_usage` (0.5 when the engine exports no KV gauge):
//! room for this request without preempting others. Needs fresh metrics.

use super::Inputs;
use crate::candidate::Mode;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    if x.mode != Mode::Full {
        return false;
    }
    for (o, c) in out.iter_mut().zip(x.cands) {
        *o = c.kv_usage.map_or(0.5, |kv| 1.0 - f64::from(kv));
    }
    true
}
