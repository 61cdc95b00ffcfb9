//! Where other gateway replicas probably put a prompt: a prior for prefixes this replica has
//! not seen.
//!
//! Each replica's prefix index knows only the prompts that replica routed. With several
//! replicas in front of one pool (separate Envoy processes, no shared state), a long shared
//! context that another replica sent to pod X looks new to this one, so it lands wherever load
//! is lowest — one more cold prefill, and one more copy of the context taking KV cache. Both
//! replicas can agree without talking if, for a prompt deeper than anything they know, they
//! both expect the context on the same pod: the rendezvous home of the prompt's chained block
//! hash at an *anchor depth*. The anchor is the largest power of two blocks within the first
//! half of the prompt, so a short per-request tail (a question after a document, a new turn)
//! does not move it, and it is the same on every replica.
//!
//! How much to believe it depends on how much of the pool's traffic other replicas send: a
//! lone gateway has seen everything it routed, so for it the prior is worth nothing. Each
//! snapshot tells: the engines count every gateway's requests (`running + waiting`), this
//! proxy knows its own in flight when it accepted the snapshot, and their ratio is its
//! [`own_share`]. The home is credited with the blocks it would save if another replica put
//! the prompt there, in full once other replicas send at least as much as this one
//! (`own_share ≤ ½`) and scaled down to nothing for a lone gateway: weight
//! `min(1, 2 (1 − own_share))`. Not just the chance `1 − own_share` that another replica got
//! there first: when none did, the placement decides where every replica will look, so the
//! pick pays for itself the next time any replica reads the context (one cold prefill and one
//! duplicate copy in KV cache avoided). The `ttft` and `prefix` scorers then weigh the credit
//! against the home's queue in their usual units: the home loses a context's first read only
//! when its queue is longer than that read's prefill elsewhere.
//! Nothing else changes: what the replica knows from its own index always stands, and the
//! work accounting (pending tokens, rate observations) uses only what it knows.
//!
//! A guess is all a replica has when it is alone with its index. With sidecars that follow a
//! metrics hub it need not guess: each replica keeps a ring of the long contexts it placed on
//! pods that held no copy it or the others knew of — the first copy, and any later one (a
//! busy holder avoided) — ([`crate::placed::note_placed`], at most
//! [`crate::placed::PLACED_RING`] per pool, in shared data), serves the ring in its tally, and
//! gets the others' in its snapshot ([`llm_router_snapshot::PeerContext`]). A context another
//! replica placed on pod X is then credited to X in full — a fact, not a prior — wherever the
//! rendezvous home would be; the home's guess stays for contexts no ring holds (placed before
//! the last [`crate::placed::PLACED_RING`] new ones, or with no hub).

use crate::inflight::Table;
use llm_router_snapshot::Pool;

/// The rendezvous (highest random weight) choice among `addrs` for `key`: the same on every
/// replica that sees the same pods, and only `1/n` of keys move when a pod comes or goes.
pub fn rendezvous<'a>(addrs: impl Iterator<Item = &'a str>, key: u64) -> Option<usize> {
    addrs
        .enumerate()
        .max_by_key(|(_, a)| xxhash_rust::xxh64::xxh64(a.as_bytes(), key))
        .map(|(i, _)| i)
}

/// A large pool's address hash for [`Rendezvous`], computed once per snapshot.
pub fn address_hash(address: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(address.as_bytes(), 0)
}

/// [`rendezvous`] for a pool of more than [`crate::score::LARGE_POOL`] pods, in two levels so
/// a request does not weigh every pod: the pods fall into about `√n` groups by the leading
/// bits of their [`address_hash`] (a power of two of them, so the groups change only when the
/// pool crosses a power of four), the key picks the group of highest weight, then the pod of
/// highest weight in it. A weight is a cheap mix of the key with the group's bits or the pod's
/// hash. About `2√n` mixes per key (128 at 4,096 pods) instead of a pass of xxHash64 over every
/// address. Still the same on every replica, and a pod that comes or goes moves only keys of
/// its own group, about `1/n` of them; the homes differ from [`rendezvous`]'s, so pools at most
/// that large keep theirs. Built once per snapshot ([`crate::shortlist`]), or per decision
/// where a large pool is scored whole.
#[derive(Debug, Clone, Default)]
pub struct Rendezvous {
    /// `(group, first member in members)`, by group, for the groups that have pods.
    groups: Vec<(u64, usize)>,
    /// `(hash, position)` of every pod, by group.
    members: Vec<(u64, usize)>,
}

impl Rendezvous {
    /// Over the pods with these hashes (positions in iteration order).
    pub fn new(hashes: impl Iterator<Item = u64>) -> Rendezvous {
        let mut members: Vec<(u64, usize)> = hashes.enumerate().map(|(i, h)| (h, i)).collect();
        let n = members.len().max(1);
        // ⌈log2 n⌉ / 2, rounded up: √n groups.
        let bits = (usize::BITS - (n - 1).leading_zeros()).div_ceil(2);
        let group = |h: u64| h.checked_shr(64 - bits).unwrap_or(0);
        members.sort_unstable_by_key(|&(h, i)| (group(h), i));
        let mut groups: Vec<(u64, usize)> = Vec::new();
        for (at, &(h, _)) in members.iter().enumerate() {
            if groups.last().is_none_or(|&(g, _)| g != group(h)) {
                groups.push((group(h), at));
            }
        }
        Rendezvous { groups, members }
    }

    /// The position of `key`'s home (`None` without pods).
    pub fn home(&self, key: u64) -> Option<usize> {
        let (g, (_, from)) = self
            .groups
            .iter()
            .enumerate()
            .max_by_key(|&(_, &(g, _))| crate::score::mix(g, key ^ GROUP_SALT))?;
        let to = self
            .groups
            .get(g + 1)
            .map_or(self.members.len(), |&(_, at)| at);
        self.members
            .get(*from..to)?
            .iter()
            .max_by_key(|&&(h, _)| crate::score::mix(h, key))
            .map(|&(_, i)| i)
    }
}

/// Keeps a group's weight for a key apart from a pod's whose hash equals the group's bits.
const GROUP_SALT: u64 = 0x6772_6F75_7073_616C;

/// This proxy's share of the requests the pool's engines report (1 when the engines report
/// none, or when the proxy has as many in flight as they count).
pub fn own_share(pool: &Pool, baseline: &Table) -> f64 {
    let engines: u64 = pool
        .pods
        .iter()
        .map(|p| u64::from(p.running) + u64::from(p.waiting))
        .sum();
    if engines == 0 {
        return 1.0;
    }
    let own: u64 = pool
        .pods
        .iter()
        .map(|p| u64::from(baseline.in_flight(&p.address)))
        .sum();
    (own as f64 / engines as f64).min(1.0)
}

/// The anchor depth in blocks: the largest power of two at most half the prompt's blocks
/// (`prompt_blocks`, counted over the whole prompt) and at most the hashed blocks, and at
/// least `min_blocks` (shorter contexts are not worth a prior).
pub fn anchor_depth(
    hashed_blocks: usize,
    prompt_blocks: usize,
    min_blocks: usize,
) -> Option<usize> {
    let limit = (prompt_blocks / 2).min(hashed_blocks);
    if limit == 0 {
        return None;
    }
    let depth = 1usize << (usize::BITS - 1 - limit.leading_zeros());
    (depth >= min_blocks.max(1)).then_some(depth)
}

/// How much of a prior to apply: 1 once other replicas send at least as much of the pool's
/// traffic as this one, falling to 0 for a lone gateway.
pub fn weight(own_share: f64) -> f64 {
    (2.0 * (1.0 - own_share.clamp(0.0, 1.0))).min(1.0)
}

/// The credit, in blocks, for a home believed to hold a prompt's first `target_blocks` blocks
/// when this replica's deepest known match on any pod is `known_blocks`: the known part plus the
/// unknown rest at the prior's [`weight`]. `None` when the prior does not apply: nothing of the
/// prompt is known to be shared at all (`known_blocks == 0`: a unique prompt), or this replica
/// already knows as much, or it sees the pool alone.
pub fn credit(target_blocks: usize, known_blocks: u32, own_share: f64) -> Option<u32> {
    let known = known_blocks as usize;
    let weight = weight(own_share);
    if known == 0 || known >= target_blocks || weight <= 0.0 {
        return None;
    }
    let gain = (target_blocks - known) as f64 * weight;
    Some(known_blocks.saturating_add(gain.round() as u32))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::inflight::PodLoad;
    use llm_router_snapshot::{Engine, Pod};

    fn pod(address: &str, running: u32, waiting: u32) -> Pod {
        Pod {
            address: address.into(),
            engine: Engine::Vllm,
            waiting,
            running,
            ..Pod::default()
        }
    }

    fn table(entries: &[(&str, u32)]) -> Table {
        Table {
            entries: entries
                .iter()
                .map(|(a, n)| {
                    (
                        a.to_string(),
                        PodLoad {
                            in_flight: *n,
                            ..PodLoad::default()
                        },
                    )
                })
                .collect(),
            ..Table::default()
        }
    }

    #[test]
    fn own_share_is_the_proxys_part_of_what_the_engines_count() {
        let pool = Pool {
            pods: vec![pod("a", 3, 1), pod("b", 2, 2)],
            ..Pool::default()
        };
        assert_eq!(own_share(&pool, &table(&[("a", 2), ("b", 2)])), 0.5);
        // A lone gateway: everything the engines count is its own (or more: sent, not arrived).
        assert_eq!(own_share(&pool, &table(&[("a", 5), ("b", 4)])), 1.0);
        let idle = Pool {
            pods: vec![pod("a", 0, 0)],
            ..Pool::default()
        };
        assert_eq!(own_share(&idle, &table(&[])), 1.0);
    }

    #[test]
    fn a_large_pools_homes_move_only_with_their_pod_and_spread_over_the_pool() {
        let addrs: Vec<String> = (0..1000)
            .map(|i| format!("10.1.{}.{}:8000", i / 256, i % 256))
            .collect();
        let homes = |skip: Option<usize>| {
            let kept: Vec<&String> = addrs
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != skip)
                .map(|(_, a)| a)
                .collect();
            let r = Rendezvous::new(kept.iter().map(|a| address_hash(a)));
            (0..20_000u64)
                .map(|k| kept[r.home(crate::score::mix(k, 7)).unwrap()].clone())
                .collect::<Vec<String>>()
        };
        let all = homes(None);
        let mut per_pod = std::collections::HashMap::new();
        for h in &all {
            *per_pod.entry(h.clone()).or_insert(0) += 1;
        }
        // 20 keys per pod on average: every pod gets some, none more than a few times that.
        assert_eq!(per_pod.len(), 1000);
        assert!(
            per_pod.values().all(|&n| n <= 80),
            "{:?}",
            per_pod.values().max()
        );
        // A pod leaves: only its keys move.
        let gone = &addrs[123];
        let after = homes(Some(123));
        for (before, now) in all.iter().zip(&after) {
            if before != gone {
                assert_eq!(before, now);
            }
        }
    }

    #[test]
    fn the_anchor_stays_put_while_a_tail_grows() {
        // A 4,000-token document after a system prompt, then questions of any length that
        // keep the prompt between 256 and 511 blocks: the anchor is block 128 every time.
        for prompt in [300, 344, 400, 511] {
            assert_eq!(anchor_depth(256, prompt, 16), Some(128), "{prompt}");
        }
        assert_eq!(anchor_depth(256, 512, 16), Some(256));
        // Within the hashed blocks, and not below the minimum.
        assert_eq!(anchor_depth(40, 1_000, 16), Some(32));
        assert_eq!(anchor_depth(256, 20, 16), None);
        assert_eq!(anchor_depth(0, 1_000, 16), None);
    }

    #[test]
    fn credit_grows_with_other_replicas_share_and_never_for_known_or_unique_prompts() {
        // Half the pool's traffic or more comes from elsewhere: all of the unknown blocks; a
        // quarter: half of them.
        assert_eq!(credit(256, 94, 0.5), Some(256));
        assert_eq!(credit(256, 94, 0.0), Some(256));
        assert_eq!(credit(256, 94, 0.75), Some(94 + 81));
        // A lone gateway, a prompt known as deep already, a prompt that shares nothing.
        assert_eq!(credit(256, 94, 1.0), None);
        assert_eq!(credit(256, 256, 0.5), None);
        assert_eq!(credit(256, 0, 0.5), None);
    }
}
