//! Scoring and ranking the pods of one pool: the pure heart of the decision.
//!
//! Each scorer maps a pod to [0, 1]; a pool's weights combine them; the best pods come first.
//! Saturation is judged here too, so a full pool turns into a 429 instead of a longer queue.

use crate::config::PoolConfig;
use crate::reject::Rejection;
use llm_router_snapshot::LoraState;

/// One pod as the ranking sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    pub address: &'a str,
    /// Metrics are old (the sidecar marked the pod stale): ranked below fresh pods.
    pub stale: bool,
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: Option<f32>,
    pub lora: Option<&'a LoraState>,
    /// This proxy's requests in flight to the pod now …
    pub inflight: u32,
    /// … and when the snapshot was accepted; the difference is load the snapshot cannot show.
    pub inflight_baseline: u32,
    /// Leading prompt blocks the pod probably has cached.
    pub prefix_blocks: u32,
}

impl Candidate<'_> {
    fn delta(&self) -> i64 {
        i64::from(self.inflight) - i64::from(self.inflight_baseline)
    }

    /// Waiting requests, corrected by what this proxy sent or saw finish since the snapshot.
    pub fn est_waiting(&self) -> f64 {
        (i64::from(self.waiting) + self.delta()).max(0) as f64
    }

    /// Running + waiting, corrected the same way.
    pub fn est_load(&self) -> f64 {
        (i64::from(self.waiting) + i64::from(self.running) + self.delta()).max(0) as f64
    }
}

/// What of the request matters to scoring.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features<'a> {
    /// LoRA adapter the request needs, if any.
    pub adapter: Option<&'a str>,
    /// Blocks the prompt was cut into (0: no prefix scoring).
    pub prompt_blocks: u32,
    /// < 0 sheddable, 0 standard, > 0 critical (never shed).
    pub priority: i32,
    /// Random bits to break exact ties.
    pub tie: u64,
}

/// How much the ranking can trust the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Fresh snapshot: every scorer and saturation checks.
    Full,
    /// Stale snapshot: only this proxy's in-flight counts and prefix affinity; never sheds.
    LeastInflight,
}

/// A pod's score, for ranking and for logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Index into the candidates.
    pub index: usize,
    pub score: f64,
    pub saturation: f64,
}

/// LoRA affinity. GAIE's values — loaded 1.0, free slot 0.8, queued 0.6, else 0 — plus a
/// stable home for every adapter: among the pods, the one with the highest rendezvous hash of
/// (adapter, address) is the adapter's home. When an adapter is loaded nowhere, its requests
/// all go to its home instead of loading it on every pod in turn, so the adapters partition
/// over the pods' slots and stop evicting each other. The home needs no shared state and is the
/// same on every worker and every proxy replica.
pub fn lora_score(lora: Option<&LoraState>, adapter: &str, home: bool) -> f64 {
    let base: f64 = match lora {
        None => 0.0,
        Some(l) if l.running.iter().any(|a| a == adapter) => 1.0,
        Some(l) if l.waiting.iter().any(|a| a == adapter) => 0.6,
        Some(l) if l.running.len() < usize::from(l.max_loras) => 0.8,
        Some(_) => 0.0,
    };
    match (base, home) {
        (b, true) if b < 1.0 => (b + 0.3).min(0.95),
        (b, _) => b,
    }
}

/// Rendezvous (highest-random-weight) hash of an adapter on a pod.
pub fn rendezvous(adapter: &str, address: &str) -> u64 {
    let a = xxhash_rust::xxh64::xxh64(adapter.as_bytes(), 0x4C6F_5241);
    xxhash_rust::xxh64::xxh64(address.as_bytes(), a)
}

/// How saturated a pod is: ≥ 1 means past a threshold (GAIE: `max(queue/5, kv/0.8)`).
pub fn saturation(pool: &PoolConfig, c: &Candidate<'_>) -> f64 {
    let q = c.est_waiting() / pool.saturation.queue_threshold;
    let kv = f64::from(c.kv_usage.unwrap_or(0.0)) / pool.saturation.kv_threshold;
    q.max(kv)
}

/// Scores every candidate (no filtering, no sorting).
pub fn score_all(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    mode: Mode,
) -> Vec<Scored> {
    let w = pool.weights;
    let (min_load, max_load) = cands
        .iter()
        .map(Candidate::est_load)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    let full = mode == Mode::Full;
    let home = f.adapter.and_then(|a| {
        cands
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| rendezvous(a, c.address))
            .map(|(i, _)| i)
    });
    cands
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let mut sum = 0.0;
            let mut weight = 0.0;
            let mut add = |w: f64, s: f64| {
                sum += w * s.clamp(0.0, 1.0);
                weight += w;
            };
            add(w.queue, 1.0 / (1.0 + c.est_waiting()));
            if full {
                add(
                    w.kv_cache,
                    c.kv_usage.map(|kv| 1.0 - f64::from(kv)).unwrap_or(0.5),
                );
            }
            let load = if max_load > min_load {
                (max_load - c.est_load()) / (max_load - min_load)
            } else {
                1.0
            };
            add(w.load, load);
            if f.prompt_blocks > 0 {
                add(
                    w.prefix,
                    f64::from(c.prefix_blocks) / f64::from(f.prompt_blocks),
                );
            }
            if let (Some(adapter), true) = (f.adapter, full) {
                add(w.lora, lora_score(c.lora, adapter, home == Some(index)));
            }
            let mut score = if weight > 0.0 { sum / weight } else { 0.0 };
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

fn mix(a: u64, b: u64) -> u64 {
    // SplitMix64 finaliser: a cheap, well-spread hash of (tie, index).
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Ranks the candidates best first (at most `top_k`), or rejects when the pool is saturated
/// for this request's priority. `cands` must not be empty.
pub fn rank(
    pool: &PoolConfig,
    cands: &[Candidate<'_>],
    f: &Features<'_>,
    mode: Mode,
    top_k: usize,
    retry_after_s: u32,
) -> Result<Vec<Scored>, Rejection> {
    if cands.is_empty() {
        return Err(Rejection::no_endpoints(&pool.name, "the pool has no pods"));
    }
    let mut scored = score_all(pool, cands, f, mode);
    if mode == Mode::Full {
        let least = scored
            .iter()
            .map(|s| s.saturation)
            .fold(f64::INFINITY, f64::min);
        let limit = match f.priority {
            p if p < 0 => Some(1.0),
            0 if pool.saturation.critical_factor > 0.0 => Some(pool.saturation.critical_factor),
            _ => None,
        };
        if let Some(limit) = limit {
            if least >= limit {
                return Err(Rejection::saturated(&pool.name, retry_after_s));
            }
        }
    }
    let load = |s: &Scored| cands.get(s.index).map(Candidate::est_load).unwrap_or(0.0);
    scored.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(load(a).total_cmp(&load(b)))
            .then(mix(f.tie, a.index as u64).cmp(&mix(f.tie, b.index as u64)))
    });
    scored.truncate(top_k.max(1));
    Ok(scored)
}

#[cfg(test)]
mod tests;
