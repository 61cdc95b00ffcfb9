//! `load`: less total load (running + waiting + own in-flight), min-max normalised over the
//! pool (all equal → 1). Spreads work on uniform fleets; across GPU generations a fast pod's many
//! running requests are not comparable to a slow pod's few, so presets weigh it low.

use super::Inputs;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    let (lo, hi) = x
        .cands
        .iter()
        .map(|c| c.est_load())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    for (o, c) in out.iter_mut().zip(x.cands) {
        *o = if hi > lo {
            (hi - c.est_load()) / (hi - lo)
        } else {
            1.0
        };
    }
    true
}
