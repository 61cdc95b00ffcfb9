//! Scoring and ranking the pods of one pool: the pure heart of the decision.
//!
//! Every scorer lives in its own file under `score/` behind one signature, [`ScoreFn`]: it fills
//! one value in [0, 1] per candidate (higher is better) and says whether it applies to this
//! request at all. [`SCORERS`] lists them; a pool's [`crate::weights::Weights`] (one per
//! scorer, from a preset in [`crate::weights::PRESETS`] or the configuration) combine them as a
//! weighted mean; the best pods come first. Adding a scorer means one new file, its name in
//! [`crate::weights::NAMES`], one line in [`SCORERS`] and a column in
//! [`crate::weights::PRESETS`].
//! Saturation is judged here too, so a full pool turns into a 429 — with a `Retry-After` from
//! the pool's own state — instead of a longer queue.

mod affinity;
mod kv;
mod load;
mod lora;
mod prefix;
mod queue;
mod ttft;

use crate::candidate::{Candidate, Features, Mode};
use crate::config::PoolConfig;
use crate::predict::Rate;
use crate::reject::Rejection;
use crate::trust;
use crate::weights::{N, NAMES};
/// What the tests (`use super::*`) build candidates and weights from.
#[cfg(test)]
use crate::{
    lora::Placement,
    weights::{Weights, PRESETS},
};

/// One scorer: writes `out[i]` for candidate `i` and returns whether it applies to this
/// request (a scorer that does not apply is left out of the weighted mean).
pub type ScoreFn = fn(&Inputs<'_>, &mut [f64]) -> bool;

/// A named scorer.
#[derive(Clone, Copy)]
pub struct Scorer {
    /// Name in the configuration (`weights.<name>`).
    pub name: &'static str,
    pub score: ScoreFn,
}

/// Every scorer, in the order of [`NAMES`], [`crate::weights::Weights`] and
/// [`crate::weights::PRESETS`].
pub const SCORERS: [Scorer; N] = [
    Scorer {
        name: NAMES[0],
        score: ttft::score,
    },
    Scorer {
        name: NAMES[1],
        score: queue::score,
    },
    Scorer {
        name: NAMES[2],
        score: kv::score,
    },
    Scorer {
        name: NAMES[3],
        score: prefix::score,
    },
    Scorer {
        name: NAMES[4],
        score: lora::score,
    },
    Scorer {
        name: NAMES[5],
        score: load::score,
    },
    Scorer {
        name: NAMES[6],
        score: affinity::score,
    },
];

/// Everything a scorer may look at.
pub struct Inputs<'a> {
    pub pool: &'a PoolConfig,
    pub cands: &'a [Candidate<'a>],
    pub req: &'a Features<'a>,
    pub mode: Mode,
}

/// A pod's score, for ranking and for logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Index into the candidates.
    pub index: usize,
    pub score: f64,
    pub saturation: f64,
}

/// How saturated a pod is: ≥ 1 means past a threshold (GAIE: `max(queue/5, kv/0.8)`).
pub fn saturation(pool: &PoolConfig, c: &Candidate<'_>) -> f64 {
    saturation_of(pool, c.est_waiting(), c.kv_usage)
}

/// [`saturation`] of a pod with `waiting` requests waiting and `kv_usage`.
pub fn saturation_of(pool: &PoolConfig, waiting: f64, kv_usage: Option<f32>) -> f64 {
    let q = waiting / pool.saturation.queue_threshold;
    let kv = f64::from(kv_usage.unwrap_or(0.0)) / pool.saturation.kv_threshold;
    q.max(kv)
}

/// Scores every candidate (no filtering, no sorting).
pub fn score_all(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    mode: Mode,
) -> Vec<Scored> {
    let inputs = Inputs {
        pool,
        cands,
        req: f,
        mode,
    };
    let mut sum = vec![0.0; cands.len()];
    let mut weight = 0.0;
    let mut values = vec![0.0; cands.len()];
    for (scorer, &w) in SCORERS.iter().zip(pool.weights.0.iter()) {
        if w <= 0.0 {
            continue;
        }
        values.iter_mut().for_each(|v| *v = 0.0);
        if !(scorer.score)(&inputs, &mut values) {
            continue;
        }
        weight += w;
        for (s, v) in sum.iter_mut().zip(&values) {
            *s += w * v.clamp(0.0, 1.0);
        }
    }
    let full = mode == Mode::Full;
    cands
        .iter()
        .zip(sum)
        .enumerate()
        .map(|(index, (c, s))| {
            let mut score = if weight > 0.0 { s / weight } else { 0.0 };
            if c.stale && full {
                score *= 0.5;
            }
            Scored {
                index,
                score,
                saturation: if full { saturation(pool, c) } else { 0.0 },
            }
        })
        .collect()
}

pub(crate) fn mix(a: u64, b: u64) -> u64 {
    // SplitMix64 finaliser: a cheap, well-spread hash of (tie, index).
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seconds until the least loaded pod's queued prefill work has drained to the saturation
/// threshold, at its learned rate: what a shed client should wait. Bounded to `[min_s, max_s]`;
/// `min_s` when the pool's prefill size is not known yet.
pub fn retry_after_s(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    min_s: u32,
    max_s: u32,
) -> u32 {
    if f.mean_prefill_tokens <= 0.0 {
        return min_s;
    }
    let allowed = pool.saturation.queue_threshold * f.mean_prefill_tokens;
    let drain_ms = cands
        .iter()
        .map(|c| (c.queued_tokens(f, Mode::Full) - allowed).max(0.0) * c.rate.cost_ms_per_token)
        .fold(f64::INFINITY, f64::min);
    if !drain_ms.is_finite() {
        return min_s;
    }
    let secs = (drain_ms / 1000.0).ceil();
    (secs.max(f64::from(min_s)).min(f64::from(max_s.max(min_s)))) as u32
}

/// Pools with more candidates than this break exact ties differently ([`Scope`]) and may be
/// ranked from a shortlist ([`crate::shortlist`]); smaller pools rank exactly as they always did.
pub const LARGE_POOL: usize = 128;

/// Which pods a ranking sees: the whole pool, or a large pool's shortlist
/// ([`crate::shortlist`]) with what the ranking needs of the pods left out.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The candidates' positions among the pool's candidates (empty: the candidates are the
    /// whole pool, in order).
    pub positions: &'a [u32],
    /// Candidates in the whole pool.
    pub pool_pods: usize,
    /// The pods left out, when the candidates are a shortlist.
    pub unscored: Option<&'a Unscored<'a>>,
}

impl Scope<'_> {
    /// The candidates are the whole pool.
    pub fn whole(pods: usize) -> Scope<'static> {
        Scope {
            positions: &[],
            pool_pods: pods,
            unscored: None,
        }
    }

    fn position(&self, index: usize) -> usize {
        self.positions
            .get(index)
            .map_or(index, |&p| usize::try_from(p).unwrap_or(usize::MAX))
    }
}

/// What the pool's saturation needs of the pods a shortlist left out: each of them has no
/// entry in this proxy's tables, so it is predicted at the pool's rate and its saturation is
/// its report's, known when the snapshot was indexed.
#[derive(Debug, Clone)]
pub struct Unscored<'a> {
    /// Pods left out.
    pub pods: usize,
    /// Their rate (the pool's).
    pub rate: Rate,
    /// Saturation of every pod the shortlist may leave out, ascending.
    pub saturations: &'a [f64],
    /// The saturations (in `saturations`) of those pods that are candidates after all.
    pub scored: Vec<f64>,
}

impl Unscored<'_> {
    /// Left-out pods at `limit` or above.
    fn at_least(&self, limit: f64) -> usize {
        let all = self.saturations.len() - self.saturations.partition_point(|&s| s < limit);
        let scored = self.scored.iter().filter(|&&s| s >= limit).count();
        all.saturating_sub(scored)
    }
}

/// Ranks the candidates best first (at most `top_k`), or rejects when the pool is saturated
/// for this request's priority. `retry_after` bounds the `Retry-After` of a rejection.
pub fn rank(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    mode: Mode,
    top_k: usize,
    retry_after: (u32, u32),
) -> Result<Vec<Scored>, Rejection> {
    rank_in(
        pool,
        cands,
        f,
        mode,
        top_k,
        retry_after,
        &Scope::whole(cands.len()),
    )
}

/// The pool's saturation is at `limit` or past it: the pods holding more than half of its
/// capacity are ([`trust::pool_saturation`]), counted over the candidates and the pods a
/// shortlist left out.
fn saturated(cands: &[Candidate<'_>], scored: &[Scored], rest: &Unscored<'_>, limit: f64) -> bool {
    let speed = |r: &Rate| 1.0 / r.cost_ms_per_token.max(1e-9);
    let rest_speed = speed(&rest.rate);
    let Some(mid) = trust::median_with(
        cands.iter().map(|c| speed(&c.rate)).collect(),
        rest_speed,
        rest.pods,
    ) else {
        return false;
    };
    let w = |x: f64| {
        let x = (x / mid).min(1.0);
        if x.is_finite() && x > 0.0 {
            x
        } else {
            1.0
        }
    };
    let (mut total, mut held) = (0.0, 0.0);
    for (c, s) in cands.iter().zip(scored) {
        let x = w(speed(&c.rate));
        total += x;
        if s.saturation >= limit {
            held += x;
        }
    }
    let x = w(rest_speed);
    total += x * rest.pods as f64;
    held += x * rest.at_least(limit) as f64;
    held > total / 2.0
}

/// [`rank`] over the candidates of `scope`. Ties: in a pool of at most [`LARGE_POOL`]
/// candidates, equal pods go in a per-request shuffle; in a larger one, by their gauges
/// (fewer waiting, then less KV in use), then from a per-request starting position round the
/// pool, so a shortlist can find the tied pods that come first without visiting the others.
pub fn rank_in(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    mode: Mode,
    top_k: usize,
    retry_after: (u32, u32),
    scope: &Scope<'_>,
) -> Result<Vec<Scored>, Rejection> {
    if cands.is_empty() {
        return Err(Rejection::no_endpoints(&pool.name, "the pool has no pods"));
    }
    let scored = score_all(pool, cands, f, mode);
    if mode == Mode::Full {
        refuse_if_saturated(pool, cands, f, &scored, retry_after, scope)?;
    }
    let large = scope.pool_pods > LARGE_POOL;
    let n = scope.pool_pods.max(1) as u64;
    let start = rotation_start(f.tie, scope.pool_pods);
    // A contradicted pod holding more than its share of this proxy's requests goes after the
    // rest ([`trust::over_share`]). Then best score first; among equals the lighter pod, then
    // (large pools) the one with fewer waiting and less KV in use, then a per-request shuffle
    // (or starting position), then the index (a total order, so the unstable sort ranks
    // exactly as a stable one would). The keys are computed once per pod, not once per
    // comparison, and only the top `top_k` are sorted: a pool of hundreds of pods is
    // partitioned in linear time.
    let mut keyed: Vec<(Scored, f64, u64, bool)> = scored
        .into_iter()
        .map(|s| {
            let c = cands.get(s.index);
            let load = c.map(Candidate::est_load).unwrap_or(0.0);
            let over = trust::over_share_of(cands, s.index, scope.pool_pods)
                || c.is_some_and(|c| c.ejected);
            let tie = if large {
                let at = scope.position(s.index) as u64;
                (at % n + n - start) % n
            } else {
                mix(f.tie, s.index as u64)
            };
            (s, load, tie, over)
        })
        .collect();
    let k = top_k.max(1);
    if large {
        let gauges = |i: usize| cands.get(i).map(Gauges::of).unwrap_or_default();
        let order = |a: &(Scored, f64, u64, bool), b: &(Scored, f64, u64, bool)| {
            a.3.cmp(&b.3)
                .then(b.0.score.total_cmp(&a.0.score))
                .then(a.1.total_cmp(&b.1))
                .then_with(|| gauges(a.0.index).cmp(&gauges(b.0.index)))
                .then(a.2.cmp(&b.2))
                .then(a.0.index.cmp(&b.0.index))
        };
        best_k(&mut keyed, k, order);
    } else {
        let order = |a: &(Scored, f64, u64, bool), b: &(Scored, f64, u64, bool)| {
            a.3.cmp(&b.3)
                .then(b.0.score.total_cmp(&a.0.score))
                .then(a.1.total_cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.0.index.cmp(&b.0.index))
        };
        best_k(&mut keyed, k, order);
    }
    Ok(keyed.into_iter().map(|(s, ..)| s).collect())
}

/// A 429 when the pool is saturated for the request's priority: a sheddable request (< 0) at
/// 1×, a standard one at the pool's `critical_factor` (0: never), a critical one never.
fn refuse_if_saturated(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    scored: &[Scored],
    retry_after: (u32, u32),
    scope: &Scope<'_>,
) -> Result<(), Rejection> {
    let limit = match f.priority {
        p if p < 0 => Some(1.0),
        0 if pool.saturation.critical_factor > 0.0 => Some(pool.saturation.critical_factor),
        _ => None,
    };
    let saturated_at = |limit: f64| match scope.unscored {
        Some(rest) => saturated(cands, scored, rest, limit),
        None => {
            // Judged on the pool, not its best pod: the pods holding most of its capacity.
            let weights = trust::capacity_weights(cands);
            let pods: Vec<(f64, f64)> = scored
                .iter()
                .map(|s| (s.saturation, weights.get(s.index).copied().unwrap_or(1.0)))
                .collect();
            trust::pool_saturation(&pods) >= limit
        }
    };
    if let Some(limit) = limit {
        if saturated_at(limit) {
            let (min_s, max_s) = retry_after;
            let secs = retry_after_s(pool, cands, f, min_s, max_s);
            return Err(Rejection::saturated(&pool.name, secs));
        }
    }
    Ok(())
}

/// Keeps the first `k` of `keyed` in `order`, sorted: a partition in linear time, then a sort
/// of those `k` only.
fn best_k<T>(keyed: &mut Vec<T>, k: usize, order: impl Fn(&T, &T) -> std::cmp::Ordering + Copy) {
    if keyed.len() > k {
        keyed.select_nth_unstable_by(k - 1, order);
        keyed.truncate(k);
    }
    keyed.sort_unstable_by(order);
}

/// Where a large pool's exact ties start ([`rank_in`]): a position from the request's
/// tie-break bits.
pub fn rotation_start(tie: u64, pods: usize) -> u64 {
    let n = pods.max(1) as u64;
    mix(tie, n) % n
}

/// What orders equally scored, equally loaded pods of a large pool: fresh before stale, fewer
/// waiting, less KV in use (absent: half). Each makes a pod score no worse, so a pod at or
/// below another in all of them and its load ranks before it ([`crate::shortlist`] relies on
/// it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gauges {
    pub stale: bool,
    pub waiting: f64,
    pub kv: f64,
}

impl Gauges {
    pub fn of(c: &Candidate<'_>) -> Gauges {
        Gauges {
            stale: c.stale,
            waiting: c.est_waiting(),
            kv: c.kv_usage.map_or(0.5, f64::from),
        }
    }

    fn cmp(&self, o: &Gauges) -> std::cmp::Ordering {
        self.stale
            .cmp(&o.stale)
            .then(self.waiting.total_cmp(&o.waiting))
            .then(self.kv.total_cmp(&o.kv))
    }
}

#[cfg(test)]
mod tests;
