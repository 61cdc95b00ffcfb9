//! A large pool's shortlist: the pods one request can go to, found without scoring every pod.
//!
//! Scoring every pod of a pool of thousands costs a decision thousands of times the work of one
//! pod (issue 23: 20× the instructions at 4,096 pods of those at 64). Most of those pods are
//! alike for the request: this proxy has nothing in flight there and has learned nothing of
//! them, they hold none of the prompt's prefix, and they are not the prompt's home. Such a pod
//! (a *static* pod) is scored from its report alone — waiting, running, KV in use, stale — and
//! every scorer gives a pod no worse a value for fewer waiting, fewer running, less KV and a
//! fresh report, whatever the request (one that names no adapter: where an adapter is loaded
//! is not in these four; [`crate::score::Gauges`]). A static pod that another
//! static pod beats or equals in all four (and differs from) ranks after it, so a static pod
//! with `k` such *dominators* cannot be among the best `k`.
//!
//! So once per snapshot generation ([`Shortlist::new`]) the static pods are grouped by their
//! four gauges and the groups kept that have fewer than [`DEPTH`] dominators (in a real pool a
//! handful; all of a uniform pool's pods are one group). Per request ([`Shortlist::plan`]) the
//! candidates are the pods the request touches — this proxy's table entries, baseline entries,
//! prefix holders, the prompt's homes — and from each kept group that fewer than `top_k`
//! untouched pods dominate, the first `top_k` untouched members from the request's starting
//! position ([`crate::score::rank_in`] breaks a large pool's exact ties that way). The best
//! `top_k` of the pool are then among the candidates, ranked exactly as over the whole pool.
//!
//! What normalises against the whole pool comes from the whole pool too: the `ttft` scorer's
//! best prediction and fewest uncached tokens, the `load` scorer's least and most loaded pod
//! (the static pod with the fewest waiting, and the least and most loaded one, are candidates
//! as well), the pool's saturation (the static pods' saturations, sorted once per generation:
//! [`crate::score::Unscored`]) and the pods' median speed. Pools of at most
//! [`crate::score::LARGE_POOL`] pods are not shortlisted; a request the shortlist cannot serve
//! exactly (an adapter, a stale snapshot, flow control holding it, debug scores, more touched
//! pods than [`DEPTH`] allows) is scored over the whole pool.

use crate::candidate::Candidate;
use crate::config::PoolConfig;
use crate::inflight::Table;
use crate::lora::Placement;
use crate::predict::Rate;
use crate::replica_prior;
use crate::score;
use crate::trust;
use llm_router_snapshot::{Health, Pool};
use std::collections::HashMap;

/// Dominators a group of static pods may have and still be kept: bounds `top_k` plus the
/// static pods one request touches (more, and the request is scored over the whole pool).
pub const DEPTH: usize = 48;

/// One pod's gauges as every decision sees them this generation (after
/// [`trust::distrust`]), with its baseline count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gauges {
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: Option<f32>,
    pub stale: bool,
    pub contradicted: bool,
    /// This proxy's requests in flight there when the snapshot was accepted.
    pub baseline: u32,
    /// Other gateway replicas have work there (the snapshot's `peers`): scored every time,
    /// like a baseline pod, since that work is not in the four gauges.
    pub peers: bool,
}

impl Gauges {
    /// A static pod: nothing of this proxy in flight there at the snapshot, nor of other
    /// replicas.
    fn is_static(&self) -> bool {
        self.baseline == 0 && !self.peers
    }

    /// Not worse in any gauge than `o`, and not the same.
    fn dominates(&self, o: &Gauges) -> bool {
        let (a, b) = (self.key(), o.key());
        a != b && a.0 <= b.0 && a.1 <= b.1 && a.2.total_cmp(&b.2).is_le() && self.load() <= o.load()
    }

    fn load(&self) -> u64 {
        u64::from(self.waiting) + u64::from(self.running)
    }

    /// `(stale, waiting, KV as the kv_cache scorer reads it, load)`: what a static pod's score
    /// and tie-break depend on.
    fn key(&self) -> (bool, u32, f64, u64) {
        (
            self.stale,
            self.waiting,
            self.kv_usage.map_or(0.5, f64::from),
            self.load(),
        )
    }
}

/// Static pods with the same gauges.
#[derive(Debug, Clone)]
struct Group {
    gauges: Gauges,
    /// Pods of kept groups that dominate this one.
    dominators: usize,
    /// Positions, ascending.
    members: Vec<u32>,
}

/// What one snapshot generation knows of a large pool, for [`Shortlist::plan`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Shortlist {
    /// Snapshot index of each position (the pool's pods that are not failing, in order: the
    /// order of a whole-pool decision's candidates).
    pub pods: Vec<u32>,
    /// Snapshot index of each address.
    by_address: HashMap<String, u32>,
    /// Position of each snapshot pod (`u32::MAX`: failing).
    positions: Vec<u32>,
    /// Position of each prefix-index pod id.
    by_id: HashMap<u32, u32>,
    /// Homes by rendezvous over the positions' [`replica_prior::address_hash`]es.
    homes: replica_prior::Rendezvous,
    /// Per position.
    pub gauges: Vec<Gauges>,
    /// Positions with a baseline count (every decision scores them).
    baseline: Vec<u32>,
    /// Kept groups of static pods, fewest waiting first.
    groups: Vec<Group>,
    /// Static positions by waiting, and by load (each ascending).
    by_waiting: Vec<u32>,
    by_load: Vec<u32>,
    /// Static pods' saturations, ascending, and the thresholds they were judged at.
    saturations: Vec<f64>,
    thresholds: (f64, f64),
}

/// One request's shortlist.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    /// Positions to score, ascending.
    pub positions: Vec<u32>,
    /// `(key, home position)` of the keys asked for.
    pub homes: Vec<(u64, Option<u32>)>,
}

impl Shortlist {
    /// Indexes `pool` (with its baseline and its pods' prefix-index ids) when it has more than
    /// [`score::LARGE_POOL`] pods that are not failing; `None` for a smaller pool, or one whose
    /// addresses or ids repeat or whose KV gauges are not numbers (scored whole).
    pub fn new(pool: &Pool, baseline: &Table, ids: &[u32], config: &PoolConfig) -> Option<Self> {
        let serving = pool.pods.iter().filter(|p| p.health != Health::Failing);
        if serving.count() <= score::LARGE_POOL || ids.len() != pool.pods.len() {
            return None;
        }
        let mut s = Shortlist::default();
        let mut cands = s.index_pods(pool, baseline, ids)?;
        // What every decision's distrust does to these pods: it depends only on their reports
        // and the baseline, both fixed for the generation.
        trust::distrust(&mut cands);
        s.gauges = cands
            .iter()
            .map(|c| Gauges {
                waiting: c.waiting,
                running: c.running,
                kv_usage: c.kv_usage,
                stale: c.stale,
                contradicted: c.contradicted,
                baseline: c.in_flight_baseline,
                peers: c.peer_in_flight > 0 || c.peer_pending_tokens > 0,
            })
            .collect();
        s.thresholds = (
            config.saturation.queue_threshold,
            config.saturation.kv_threshold,
        );
        let mut statics: Vec<u32> = Vec::new();
        for (at, g) in s.gauges.iter().enumerate() {
            let at = u32::try_from(at).ok()?;
            if g.is_static() {
                statics.push(at);
            } else {
                s.baseline.push(at);
            }
        }
        let gauges = |at: &u32| s.gauges.get(*at as usize).copied();
        let mut by_waiting = statics.clone();
        by_waiting.sort_by_key(|at| gauges(at).map(|g| g.waiting));
        let mut by_load = statics.clone();
        by_load.sort_by_key(|at| gauges(at).map(|g| g.load()));
        let mut saturations: Vec<f64> = statics
            .iter()
            .filter_map(&gauges)
            .map(|g| score::saturation_of(config, f64::from(g.waiting), g.kv_usage))
            .collect();
        saturations.sort_by(f64::total_cmp);
        let groups = dominance_groups(statics, gauges);
        s.groups = groups;
        s.by_waiting = by_waiting;
        s.by_load = by_load;
        s.saturations = saturations;
        Some(s)
    }

    /// Indexes the pool's pods (addresses, positions, prefix-index ids, rendezvous homes) and
    /// returns each serving pod as a candidate; `None` when addresses or ids repeat or a KV
    /// gauge is not a number.
    fn index_pods<'p>(
        &mut self,
        pool: &'p Pool,
        baseline: &Table,
        ids: &[u32],
    ) -> Option<Vec<Candidate<'p>>> {
        let counts = baseline.get_all(pool.pods.iter().map(|p| p.address.as_str()));
        let mut cands = Vec::new();
        let mut hashes = Vec::new();
        for (i, (p, b)) in pool.pods.iter().zip(&counts).enumerate() {
            let i = u32::try_from(i).ok()?;
            if self.by_address.insert(p.address.clone(), i).is_some() {
                return None;
            }
            if p.kv_usage.is_some_and(|kv| !kv.is_finite()) {
                return None;
            }
            if p.health == Health::Failing {
                self.positions.push(u32::MAX);
                continue;
            }
            let at = u32::try_from(self.pods.len()).ok()?;
            self.positions.push(at);
            self.pods.push(i);
            let id = ids.get(i as usize).copied()?;
            if self.by_id.insert(id, at).is_some() {
                return None;
            }
            hashes.push(replica_prior::address_hash(&p.address));
            cands.push(Candidate {
                address: &p.address,
                stale: p.health == Health::Stale,
                waiting: p.waiting,
                running: p.running,
                kv_usage: p.kv_usage,
                in_flight: 0,
                in_flight_baseline: b.in_flight,
                pending_tokens: 0,
                peer_in_flight: p.peers.in_flight,
                peer_pending_tokens: p.peers.pending_tokens,
                rate: Rate {
                    cost_ms_per_token: 0.0,
                    base_ms: 0.0,
                },
                prefix_blocks: 0,
                lora: Placement::default(),
                adapter_ms: 0.0,
                contradicted: false,
                ejected: false,
            });
        }
        self.homes = replica_prior::Rendezvous::new(hashes.into_iter());
        Some(cands)
    }

    /// Pods that are not failing.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// The snapshot index of `address`.
    pub fn index_of(&self, address: &str) -> Option<usize> {
        self.by_address.get(address).map(|&i| i as usize)
    }

    /// The position of snapshot pod `i` (`None`: failing).
    pub fn position_of(&self, i: usize) -> Option<u32> {
        self.positions.get(i).copied().filter(|&at| at != u32::MAX)
    }

    /// The position of the pod with prefix-index id `id`.
    pub fn position_of_id(&self, id: u32) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    /// The saturations a shortlist's left-out pods may have ([`score::Unscored`]), when judged
    /// at `pool`'s thresholds.
    pub fn saturations(&self, pool: &PoolConfig) -> Option<&[f64]> {
        let t = (
            pool.saturation.queue_threshold,
            pool.saturation.kv_threshold,
        );
        (t == self.thresholds).then_some(self.saturations.as_slice())
    }

    /// The saturation of static position `at` as [`Shortlist::saturations`] holds it.
    pub fn saturation_of(&self, pool: &PoolConfig, at: u32) -> Option<f64> {
        let g = self.gauges.get(at as usize).filter(|g| g.is_static())?;
        Some(score::saturation_of(pool, f64::from(g.waiting), g.kv_usage))
    }

    /// The rendezvous home of `key` among the positions ([`replica_prior::Rendezvous`]).
    pub fn home(&self, key: u64) -> Option<u32> {
        self.homes.home(key).and_then(|i| u32::try_from(i).ok())
    }

    /// The positions one request scores: `touched` (its table entries, prefix holders; in any
    /// order, repeats allowed), the homes of `keys`, every baseline pod, and the static pods
    /// that may be among the best `top_k` for a request with tie-break bits `tie`. `None`
    /// when the request touches too many static pods for the kept groups to be sure.
    pub fn plan(
        &self,
        touched: impl IntoIterator<Item = u32>,
        keys: &[u64],
        top_k: usize,
        tie: u64,
    ) -> Option<Plan> {
        let homes: Vec<(u64, Option<u32>)> = keys.iter().map(|&k| (k, self.home(k))).collect();
        let mut picked: Vec<u32> = touched
            .into_iter()
            .chain(homes.iter().filter_map(|&(_, h)| h))
            .collect();
        picked.sort_unstable();
        picked.dedup();
        let is_static = |at: u32| self.gauges.get(at as usize).is_some_and(|g| g.is_static());
        let touched: Vec<u32> = picked.iter().copied().filter(|&at| is_static(at)).collect();
        let k = top_k.max(1);
        if k + touched.len() > DEPTH {
            return None;
        }
        let untouched = |at: &u32| touched.binary_search(at).is_err();
        let start = u32::try_from(score::rotation_start(tie, self.pods.len())).ok()?;
        for g in self
            .groups
            .iter()
            .filter(|g| g.dominators < k + touched.len())
        {
            let by_touched = touched
                .iter()
                .filter_map(|&at| self.gauges.get(at as usize))
                .filter(|t| t.dominates(&g.gauges))
                .count();
            if g.dominators.saturating_sub(by_touched) >= k {
                continue;
            }
            // The first `k` untouched members from the starting position round the pool.
            let from = g.members.partition_point(|&at| at < start);
            let (wrapped, first) = g.members.split_at(from.min(g.members.len()));
            picked.extend(
                first
                    .iter()
                    .chain(wrapped)
                    .filter(|at| untouched(at))
                    .take(k),
            );
        }
        // The static pods that bound the scorers' normalisation: fewest waiting (best predicted
        // time to first token and its fewest uncached tokens), least and most loaded.
        picked.extend(self.by_waiting.iter().find(|at| untouched(at)));
        picked.extend(self.by_load.iter().find(|at| untouched(at)));
        picked.extend(self.by_load.iter().rev().find(|at| untouched(at)));
        picked.extend(&self.baseline);
        picked.sort_unstable();
        picked.dedup();
        Some(Plan {
            positions: picked,
            homes,
        })
    }
}

/// The kept groups of static pods (positions `statics`): pods with equal gauges form a group,
/// in the order of their gauges (a dominator comes before what it dominates); a group is kept
/// while fewer than [`DEPTH`] pods of kept groups dominate it.
fn dominance_groups(statics: Vec<u32>, gauges: impl Fn(&u32) -> Option<Gauges>) -> Vec<Group> {
    // Groups in the order of their gauges: a dominator comes before what it dominates.
    let mut sorted = statics;
    sorted.sort_by(|a, b| {
        let (ka, kb) = (gauges(a).map(|g| g.key()), gauges(b).map(|g| g.key()));
        let (Some(ka), Some(kb)) = (ka, kb) else {
            return a.cmp(b);
        };
        ka.0.cmp(&kb.0)
            .then(ka.1.cmp(&kb.1))
            .then(ka.2.total_cmp(&kb.2))
            .then(ka.3.cmp(&kb.3))
            .then(a.cmp(b))
    });
    let mut groups: Vec<Group> = Vec::new();
    let mut i = 0;
    while let Some(first) = sorted.get(i).and_then(&gauges) {
        let mut members = Vec::new();
        while let Some(&at) = sorted.get(i) {
            if gauges(&at).map(|g| g.key()) != Some(first.key()) {
                break;
            }
            members.push(at);
            i += 1;
        }
        // Counted over the kept groups only: a dominator that was not kept has DEPTH
        // dominators of its own, which dominate this group too.
        let mut dominators = 0;
        for g in &groups {
            if g.gauges.dominates(&first) {
                dominators += g.members.len();
                if dominators >= DEPTH {
                    break;
                }
            }
        }
        if dominators < DEPTH {
            groups.push(Group {
                gauges: first,
                dominators,
                members,
            });
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use llm_router_snapshot::{Engine, Pod};

    fn pool(n: usize, report: impl Fn(usize) -> (u32, u32, f32)) -> (Pool, Vec<u32>) {
        let pods: Vec<Pod> = (0..n)
            .map(|i| {
                let (waiting, running, kv) = report(i);
                Pod {
                    address: format!("10.0.{}.{}:8000", i / 256, i % 256),
                    engine: Engine::Vllm,
                    waiting,
                    running,
                    kv_usage: Some(kv),
                    ..Pod::default()
                }
            })
            .collect();
        let ids = pods
            .iter()
            .map(|p| crate::prefix::pod_id(&p.address))
            .collect();
        let pool = Pool {
            name: "p".into(),
            pods,
            ..Pool::default()
        };
        (pool, ids)
    }

    fn config() -> PoolConfig {
        crate::Config::default().default_pool
    }

    #[test]
    fn a_small_pool_is_not_shortlisted() {
        let (p, ids) = pool(score::LARGE_POOL, |_| (0, 0, 0.0));
        assert!(Shortlist::new(&p, &Table::default(), &ids, &config()).is_none());
    }

    #[test]
    fn a_requests_shortlist_does_not_grow_with_the_pool() {
        // A uniform pool is one group: the first top_k from the request's start, plus the
        // pods that bound the normalisation and the homes.
        for n in [200, 4096] {
            let (p, ids) = pool(n, |_| (1, 4, 0.25));
            let s = Shortlist::new(&p, &Table::default(), &ids, &config()).unwrap();
            assert_eq!(s.groups.len(), 1);
            let plan = s.plan([], &[7, 8], 3, 42).unwrap();
            assert!(
                plan.positions.len() <= 3 + 3 + 2,
                "{n}: {:?}",
                plan.positions
            );
        }
        // The decision guard's pool: varied reports, few groups can hold the best.
        let (p, ids) = pool(4096, |i| {
            (
                (i * 7 % 5) as u32,
                (i * 13 % 17) as u32,
                (i * 37 % 80) as f32 / 100.0,
            )
        });
        let s = Shortlist::new(&p, &Table::default(), &ids, &config()).unwrap();
        let plan = s.plan([5, 900, 4000], &[7, 8], 3, 42).unwrap();
        assert!(plan.positions.len() <= 40, "{:?}", plan.positions);
        // Too many touched pods for the kept groups: scored whole.
        assert!(s.plan(0..DEPTH as u32, &[], 3, 42).is_none());
    }
}
