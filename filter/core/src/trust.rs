//! What one pod can do to the pool: bounds on what its reports and its timing may claim.
//!
//! A pod is ranked on what it says (its engine's gauges in the snapshot) and on what this proxy
//! measured (its learned prefill rate). A broken or hostile pod can say it is empty and can
//! answer before it computed anything; without bounds either draws the pool's traffic to it and
//! switches shedding off (the least loaded pod decides). Three bounds, each from something the
//! filter knows for certain:
//!
//! - **A plausible speed.** Pods of one pool serve one model; no accelerator serving the same
//!   model prefills more than about ten times faster than another one in the same pool (dense
//!   bf16: A10G 125 TFLOPs, H100 989, ×8; model-sim's profiles: 0.25 against 0.04 ms/token,
//!   ×6). A learned cost below [`COST_FLOOR_FRACTION`] of the pool's median (1/16: room for a
//!   pool spanning two GPU generations plus batching effects) is a pod answering before it
//!   did the work, and is raised to that floor ([`cost_floor`]).
//! - **Reports that agree with this proxy's own count.** An engine's `running + waiting`
//!   counts every request it holds, so it is at least the requests this proxy has in flight
//!   there — up to the few sent between the scrape and the snapshot's arrival (a fraction of a
//!   scrape interval, against requests that last seconds). A pod that reports fewer than half
//!   of this proxy's in-flight requests, and at least two fewer, is **contradicted**
//!   ([`contradicted`]): its gauges are not believed and count as its trusted peers' medians
//!   (it is assumed no emptier than they are), and while this proxy has more requests in flight
//!   there than on an average other pod it is ranked after every pod that is not contradicted
//!   ([`over_share`]): its share of this proxy's concurrent requests stays at about a fair one.
//! - **Saturation judged on the pool.** A pool is saturated when the pods holding more than
//!   half of its capacity are saturated ([`pool_saturation`]), each pod weighing its learned
//!   speed but no more than the median pod: one pod reporting empty, or learning an absurd
//!   speed, cannot keep the pool from shedding; one idle pod in a pool that is not saturated
//!   does not make it shed either.

use crate::candidate::Candidate;

/// A pod's learned cost may not fall below this fraction of the pool's median cost.
pub const COST_FLOOR_FRACTION: f64 = 1.0 / 16.0;

/// Fewest requests by which a report must fall short of this proxy's own count to contradict
/// it: one request routed between the scrape and the snapshot's arrival is normal.
pub const MIN_SHORTFALL: u32 = 2;

/// The lowest cost (ms per token) a pod may be predicted at, given the pool's median cost.
pub fn cost_floor(median_ms_per_token: f64) -> f64 {
    if median_ms_per_token.is_finite() && median_ms_per_token > 0.0 {
        median_ms_per_token * COST_FLOOR_FRACTION
    } else {
        0.0
    }
}

/// Whether a pod that reported `reported` requests (`running + waiting`) contradicts this
/// proxy's `own` requests in flight there when the snapshot was accepted.
pub fn contradicted(reported: u32, own: u32) -> bool {
    let short = own.saturating_sub(reported);
    short >= MIN_SHORTFALL && short > reported
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The median of `v` and `extra_count` more values `extra` (as [`median`] of them all, without
/// writing them out: a large pool's pods left out of a shortlist all have the pool's rate).
pub fn median_with(mut v: Vec<f64>, extra: f64, extra_count: usize) -> Option<f64> {
    let n = v.len() + extra_count;
    if n == 0 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = n / 2;
    // The extra values sit after the listed ones below them (a stable sort keeps equal values
    // in either order: equal, so the median is the same).
    let below = v.partition_point(|x| x.total_cmp(&extra).is_le());
    if mid < below {
        v.get(mid).copied()
    } else if mid < below + extra_count {
        Some(extra)
    } else {
        v.get(mid - extra_count).copied()
    }
}

/// Marks contradicted candidates and replaces their gauges by the medians of the others (a
/// pod whose gauges are absent keeps them absent). With no trusted pod left, contradicted
/// pods keep their own gauges: there is nothing better to compare with, and the own-view
/// corrections (in-flight counts, pending work) still hold.
pub fn distrust(cands: &mut [Candidate<'_>]) {
    for c in cands.iter_mut() {
        c.contradicted = contradicted(c.waiting.saturating_add(c.running), c.in_flight_baseline);
    }
    if !cands.iter().any(|c| c.contradicted) {
        return;
    }
    let trusted = || cands.iter().filter(|c| !c.contradicted);
    let waiting = median(trusted().map(|c| f64::from(c.waiting)).collect());
    let running = median(trusted().map(|c| f64::from(c.running)).collect());
    let kv = median(
        trusted()
            .filter_map(|c| c.kv_usage.map(f64::from))
            .collect(),
    );
    let (Some(waiting), Some(running)) = (waiting, running) else {
        return;
    };
    for c in cands.iter_mut().filter(|c| c.contradicted) {
        c.waiting = c.waiting.max(waiting as u32);
        c.running = c.running.max(running as u32);
        if let (Some(mine), Some(kv)) = (c.kv_usage, kv) {
            c.kv_usage = Some(mine.max(kv as f32));
        }
    }
}

/// Whether candidate `i` is contradicted and holds more of this proxy's in-flight requests
/// than the mean of the other pods (so it goes after every pod that is not contradicted).
pub fn over_share(cands: &[Candidate<'_>], i: usize) -> bool {
    over_share_of(cands, i, cands.len())
}

/// [`over_share`] in a pool of `pods` candidates of which `cands` are those with requests of
/// this proxy in flight (and any others): a large pool's shortlist ([`crate::shortlist`]).
pub fn over_share_of(cands: &[Candidate<'_>], i: usize, pods: usize) -> bool {
    let Some(c) = cands.get(i).filter(|c| c.contradicted) else {
        return false;
    };
    let others = pods.saturating_sub(1);
    if others == 0 {
        return false;
    }
    let total: f64 = cands.iter().map(|c| f64::from(c.in_flight)).sum();
    let mean_others = (total - f64::from(c.in_flight)) / others as f64;
    f64::from(c.in_flight) > mean_others.ceil()
}

/// The pool's saturation from each pod's `(saturation, capacity weight)`: the largest `s`
/// such that pods holding more than half of the capacity are at least at `s`. One pod of
/// several cannot move it alone (unless it holds most of the capacity). Weights that are not
/// finite and positive count as 1.
pub fn pool_saturation(pods: &[(f64, f64)]) -> f64 {
    let w = |x: f64| if x.is_finite() && x > 0.0 { x } else { 1.0 };
    let total: f64 = pods.iter().map(|&(_, x)| w(x)).sum();
    let mut by_sat: Vec<(f64, f64)> = pods.iter().map(|&(s, x)| (s, w(x))).collect();
    by_sat.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut held = 0.0;
    for (s, x) in by_sat {
        held += x;
        if held > total / 2.0 {
            return s;
        }
    }
    0.0
}

/// A pod's capacity weight for [`pool_saturation`]: its learned speed (tokens per ms), at most
/// the median pod's, relative to the median (so 1 for a median or faster pod).
pub fn capacity_weights(cands: &[Candidate<'_>]) -> Vec<f64> {
    let speeds: Vec<f64> = cands
        .iter()
        .map(|c| 1.0 / c.rate.cost_ms_per_token.max(1e-9))
        .collect();
    let Some(mid) = median(speeds.clone()) else {
        return Vec::new();
    };
    speeds.iter().map(|s| (s / mid).min(1.0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_below_half_the_own_count_contradicts_it() {
        assert!(!contradicted(0, 0));
        assert!(
            !contradicted(0, 1),
            "one request sent after the scrape is normal"
        );
        assert!(contradicted(0, 2));
        assert!(contradicted(3, 8));
        assert!(!contradicted(4, 8));
        assert!(!contradicted(20, 8));
    }

    #[test]
    fn the_cost_floor_is_a_sixteenth_of_the_median() {
        assert_eq!(cost_floor(0.16), 0.01);
        assert_eq!(cost_floor(f64::NAN), 0.0);
        assert_eq!(cost_floor(0.0), 0.0);
    }

    #[test]
    fn one_pod_cannot_set_the_pool_saturation() {
        // Three saturated, one empty: the pool is saturated.
        assert_eq!(
            pool_saturation(&[(2.0, 1.0), (0.0, 1.0), (1.5, 1.0), (3.0, 1.0)]),
            1.5
        );
        // One idle pod in a pool that is not saturated: not saturated.
        assert!(pool_saturation(&[(0.5, 1.0), (0.0, 1.0), (0.4, 1.0), (0.6, 1.0)]) < 1.0);
        // Half saturated: the free half takes the work.
        assert_eq!(pool_saturation(&[(2.0, 1.0), (0.0, 1.0)]), 0.0);
        // A slow pod weighs less: two fast saturated pods hold most of the capacity.
        assert_eq!(
            pool_saturation(&[(2.0, 1.0), (2.0, 1.0), (0.0, 0.2), (0.0, 0.2)]),
            2.0
        );
        assert_eq!(pool_saturation(&[(1.2, 1.0)]), 1.2);
        assert_eq!(pool_saturation(&[]), 0.0);
    }
}
