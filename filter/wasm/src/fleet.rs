//! The fleet snapshot in shared data: accepting a push from the sidecar, and keeping each
//! worker's decoded copy current without decoding on every request.
//!
//! Keys: `llmr/snapshot` holds the encoded snapshot; `llmr/snapshot/meta` holds
//! `generation u64 | accepted_ms u64`. The snapshot key is the truth and is written by one
//! compare-and-swap against the value the push read, so a push that loses a race to another
//! writes nothing (it reads again and is refused as stale, or wins on the retry when the other
//! push was older). The winner then records the in-flight baselines and raises the meta key,
//! which is only the cheap change signal for the workers: it is written after the snapshot,
//! never lowered, and ends at the newest accepted generation. Workers read only the 16-byte meta
//! key per request and decode the snapshot once per change of it.
//!
//! One gap the proxy-wasm ABI leaves: a key that does not exist yet cannot be guarded by CAS,
//! so two pushes racing to write the very first snapshot both succeed, the later write winning
//! (the next push of the sidecar, a scrape later, replaces it).

use llm_router_core::inflight;
use llm_router_core::store::{SharedStore, StoreError};
use llm_router_core::{Config, Fleet};
use llm_router_snapshot::{Snapshot, MAX_GENERATION_LEAD_MS};
use std::rc::Rc;

pub const SNAPSHOT_KEY: &str = "llmr/snapshot";
pub const META_KEY: &str = "llmr/snapshot/meta";
/// Per pool of the stored snapshot, its scrape mark ([`scrape_mark`]).
pub const SCRAPES_KEY: &str = "llmr/snapshot/scrapes";

/// Generation and acceptance time of the stored snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub generation: u64,
    pub accepted_ms: u64,
}

impl Meta {
    fn encode(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        let (g, a) = b.split_at_mut(8);
        g.copy_from_slice(&self.generation.to_le_bytes());
        a.copy_from_slice(&self.accepted_ms.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Meta> {
        let g: [u8; 8] = b.get(0..8)?.try_into().ok()?;
        let a: [u8; 8] = b.get(8..16)?.try_into().ok()?;
        Some(Meta {
            generation: u64::from_le_bytes(g),
            accepted_ms: u64::from_le_bytes(a),
        })
    }

    pub fn read(store: &impl SharedStore) -> Option<Meta> {
        store.get(META_KEY).and_then(|(v, _)| Meta::decode(&v))
    }
}

/// The result of a push, as the sidecar sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum PushOutcome {
    Accepted {
        generation: u64,
        pools: usize,
        pods: usize,
    },
    Invalid(String),
    StaleGeneration {
        generation: u64,
        current: u64,
    },
    /// The generation is more than [`MAX_GENERATION_LEAD_MS`] ahead of this proxy's clock:
    /// stored, it would make every honest push stale until the proxy restarts.
    GenerationAhead {
        generation: u64,
        limit: u64,
    },
    StoreFailed,
}

/// How often a push re-reads and retries after losing a compare-and-swap race (each loss means
/// another push was accepted meanwhile, so this bounds nothing a real fleet reaches).
const CAS_ATTEMPTS: usize = 8;

/// Validates and stores a pushed snapshot. A bad, stale, far-ahead or losing push changes
/// nothing.
pub fn accept(store: &impl SharedStore, bytes: &[u8], now_ms: u64) -> PushOutcome {
    let snap = match Snapshot::decode(bytes) {
        Ok(s) => s,
        Err(e) => return PushOutcome::Invalid(e.to_string()),
    };
    // Generations only grow: one far in the future (a signed `u64::MAX`) would freeze the
    // snapshot. The sidecar's generations follow its clock in ms, never ahead of it.
    let limit = now_ms.saturating_add(MAX_GENERATION_LEAD_MS);
    if snap.generation > limit {
        return PushOutcome::GenerationAhead {
            generation: snap.generation,
            limit,
        };
    }
    for _ in 0..CAS_ATTEMPTS {
        let current = store.get(SNAPSHOT_KEY);
        let cas = current.as_ref().map(|(_, c)| *c);
        // The stored bytes were validated when they were accepted: their header is enough
        // (decoding them again cost as much as the push's own decode: at 4,096 pods most of a
        // push's time). One whose header does not read (none should) is replaced.
        let stored = current
            .as_ref()
            .and_then(|(v, _)| Snapshot::peek_generation(v));
        if let Some(current) = stored {
            if snap.generation <= current {
                return PushOutcome::StaleGeneration {
                    generation: snap.generation,
                    current,
                };
            }
        }
        match store.set(SNAPSHOT_KEY, bytes, cas) {
            Ok(()) => {}
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Failed) => return PushOutcome::StoreFailed,
        }
        let before = store
            .get(SCRAPES_KEY)
            .map(|(v, _)| decode_marks(&v))
            .unwrap_or_default();
        let marks: Vec<(u64, u64)> = snap.pools.iter().map(scrape_mark).collect();
        for (pool, mark) in snap.pools.iter().zip(&marks) {
            if !before.contains(mark) {
                inflight::snapshot_baseline(store, &pool.name);
            }
        }
        // Not guarded by CAS: of two pushes accepted at once the older's marks may stay, and
        // the next push then takes a baseline it did not need (an estimate that heals).
        let _ = store.set(SCRAPES_KEY, &encode_marks(&marks), None);
        raise_meta(
            store,
            Meta {
                generation: snap.generation,
                accepted_ms: now_ms,
            },
        );
        return PushOutcome::Accepted {
            generation: snap.generation,
            pools: snap.pools.len(),
            pods: snap.pod_count(),
        };
    }
    PushOutcome::StoreFailed
}

/// A pool's scrape mark: its name and its pods' addresses and scrape times, hashed. A pushed
/// pool whose mark the stored snapshot did not have was observed again (a new pool, new pods or
/// a new scrape): only then is this proxy's in-flight table copied to the pool's baseline. A
/// push that repeats the last scrape (a metrics hub streaming the other gateway replicas' new
/// work between its scrape rounds) keeps the baseline: the engines' counts are as old as
/// before, so the requests this proxy sent since that scrape are still not in them.
fn scrape_mark(pool: &llm_router_snapshot::Pool) -> (u64, u64) {
    use std::hash::{Hash, Hasher};
    let mut name = std::collections::hash_map::DefaultHasher::new();
    pool.name.hash(&mut name);
    let mut pods = std::collections::hash_map::DefaultHasher::new();
    for p in &pool.pods {
        p.address.hash(&mut pods);
        p.scraped_at_ms.hash(&mut pods);
    }
    (name.finish(), pods.finish())
}

fn encode_marks(marks: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(marks.len() * 16);
    for (a, b) in marks {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

fn decode_marks(bytes: &[u8]) -> Vec<(u64, u64)> {
    bytes
        .chunks_exact(16)
        .filter_map(|c| {
            let a = u64::from_le_bytes(c.get(..8)?.try_into().ok()?);
            let b = u64::from_le_bytes(c.get(8..)?.try_into().ok()?);
            Some((a, b))
        })
        .collect()
}

/// Sets the meta key to `meta` unless it already names that generation or a newer one. Written
/// by CAS and read back, so of concurrent winners the newest generation is what stays.
fn raise_meta(store: &impl SharedStore, meta: Meta) {
    for _ in 0..CAS_ATTEMPTS {
        let current = store.get(META_KEY);
        if let Some(m) = current.as_ref().and_then(|(v, _)| Meta::decode(v)) {
            if m.generation >= meta.generation {
                return;
            }
        }
        let cas = current.as_ref().map(|(_, c)| *c);
        if let Err(StoreError::Failed) = store.set(META_KEY, &meta.encode(), cas) {
            return;
        }
    }
}

/// A worker's decoded copy of the fleet.
#[derive(Debug, Default)]
pub struct Cache {
    generation: u64,
    fleet: Option<Rc<Fleet>>,
}

impl Cache {
    /// The fleet last decoded here, not refreshed (no shared-data read at all).
    pub fn last(&self) -> Option<Rc<Fleet>> {
        self.fleet.clone()
    }

    /// The current fleet, refreshed from shared data when the generation moved.
    pub fn current(&mut self, store: &impl SharedStore, config: &Config) -> Option<Rc<Fleet>> {
        let Some(meta) = Meta::read(store) else {
            return self.fleet.clone();
        };
        if meta.generation != self.generation || self.fleet.is_none() {
            if let Some(snap) = store
                .get(SNAPSHOT_KEY)
                .and_then(|(v, _)| Snapshot::decode(&v).ok())
            {
                let fleet =
                    Fleet::load_after(store, snap, meta.accepted_ms, config, self.fleet.as_deref());
                self.fleet = Some(Rc::new(fleet));
                self.generation = meta.generation;
            }
        }
        self.fleet.clone()
    }
}

/// JSON for `GET /__llm_router/state?summary`: the stored generation and its age only, from
/// the 16-byte meta key (no snapshot decode: cheap enough to poll at any fleet size).
pub fn state_summary_json(store: &impl SharedStore, now_ms: u64) -> String {
    let meta = Meta::read(store);
    serde_json::json!({
        "generation": meta.map(|m| m.generation),
        "age_ms": meta.map(|m| now_ms.saturating_sub(m.accepted_ms)),
    })
    .to_string()
}

/// JSON for `GET /__llm_router/state`: the snapshot summary and live in-flight counts.
pub fn state_json(store: &impl SharedStore, now_ms: u64) -> String {
    let meta = Meta::read(store);
    let snap = store
        .get(SNAPSHOT_KEY)
        .and_then(|(v, _)| Snapshot::decode(&v).ok());
    let pools: Vec<serde_json::Value> = snap
        .iter()
        .flat_map(|s| s.pools.iter())
        .map(|p| {
            let live = inflight::read(store, &p.name);
            serde_json::json!({
                "name": p.name,
                "cluster": p.cluster,
                "models": p.models,
                // Long contexts: the others' placements (in this snapshot) and this proxy's.
                "peer_contexts": p.peer_contexts.len(),
                "placed_contexts": llm_router_core::placed::placed(store, &p.name).len(),
                "pods": p.pods.iter().map(|pod| serde_json::json!({
                    "address": pod.address,
                    "engine": pod.engine.name(),
                    "health": pod.health.name(),
                    "waiting": pod.waiting,
                    "running": pod.running,
                    "kv_usage": pod.kv_usage,
                    "lora_running": pod.lora.as_ref().map(|l| &l.running),
                    "in_flight": live.in_flight(&pod.address),
                    "peer_in_flight": pod.peers.in_flight,
                    "peer_pending_tokens": pod.peers.pending_tokens,
                    "pending_tokens": live.get(&pod.address).pending_tokens,
                    "prefill_ms_per_token": live.get(&pod.address).fit.rate().map(|r| r.cost_ms_per_token),
                    "base_ms": live.get(&pod.address).fit.rate().map(|r| r.base_ms),
                    "measured_prefill_ms_per_token": live.get(&pod.address).fit.prefill_cost(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "generation": meta.map(|m| m.generation),
        "age_ms": meta.map(|m| now_ms.saturating_sub(m.accepted_ms)),
        "pools": pools,
        "rewrites": snap.as_ref().and_then(|s| s.rewrites.as_deref()).map(rewrites_json),
        "objectives": snap.as_ref().and_then(|s| s.objectives.as_deref()).map(|list| {
            list.iter()
                .map(|o| (o.name.clone(), serde_json::Value::from(o.priority)))
                .collect::<serde_json::Map<_, _>>()
        }),
    })
    .to_string()
}

/// The snapshot's rewrite rules as the sidecar sent them (before this proxy resolved them).
fn rewrites_json(rules: &[llm_router_snapshot::RewriteRule]) -> serde_json::Value {
    rules
        .iter()
        .map(|r| {
            serde_json::json!({
                "model": r.model,
                "sticky": r.sticky.name(),
                "targets": r.targets.iter().map(|t| serde_json::json!({
                    "model": t.model, "weight": t.weight,
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use llm_router_core::MemoryStore;
    use llm_router_snapshot::{Pod, Pool};

    fn snap(generation: u64) -> Vec<u8> {
        snap_at(generation, "127.0.0.1:1")
    }

    fn snap_at(generation: u64, address: &str) -> Vec<u8> {
        Snapshot {
            rewrites: None,
            objectives: None,
            generation,
            created_ms: 5,
            pools: vec![Pool {
                name: "p".into(),
                cluster: "c".into(),
                models: vec!["m".into()],
                pods: vec![Pod {
                    address: address.into(),
                    ..Pod::default()
                }],
                peer_contexts: Vec::new(),
            }],
        }
        .encode()
        .unwrap()
    }

    type Hook = Box<dyn FnOnce(&MemoryStore)>;

    /// A store whose first write lets another push run to completion first: the interleaving
    /// of two workers accepting pushes at the same time (both read, then both write).
    struct RacingStore {
        inner: MemoryStore,
        before_first_write: std::cell::RefCell<Option<Hook>>,
    }

    impl SharedStore for RacingStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.inner.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            let hook = self.before_first_write.borrow_mut().take();
            if let Some(other_push) = hook {
                other_push(&self.inner);
            }
            self.inner.set(key, value, cas)
        }
    }

    /// Pushes `ours` while `theirs` is accepted between our read and our write.
    fn race(ours: Vec<u8>, theirs: Vec<u8>) -> (PushOutcome, PushOutcome, MemoryStore) {
        let inner = MemoryStore::new();
        assert!(matches!(
            accept(&inner, &snap_at(1, "10.0.0.1:1"), 10),
            PushOutcome::Accepted { .. }
        ));
        let their_outcome = std::rc::Rc::new(std::cell::RefCell::new(None));
        let seen = their_outcome.clone();
        let store = RacingStore {
            inner,
            before_first_write: std::cell::RefCell::new(Some(Box::new(move |s: &MemoryStore| {
                *seen.borrow_mut() = Some(accept(s, &theirs, 20));
            }))),
        };
        let our_outcome = accept(&store, &ours, 30);
        let theirs = their_outcome.borrow_mut().take().unwrap();
        (our_outcome, theirs, store.inner)
    }

    /// What every worker would route with, and the raw stored bytes.
    fn stored(s: &MemoryStore) -> (u64, Vec<String>, Vec<u8>) {
        let fleet = Cache::default().current(s, &Config::default()).unwrap();
        let pods = fleet.snapshot.pools[0]
            .pods
            .iter()
            .map(|p| p.address.clone())
            .collect();
        (
            fleet.snapshot.generation,
            pods,
            s.get(SNAPSHOT_KEY).unwrap().0,
        )
    }

    #[test]
    fn a_push_that_loses_the_race_to_a_newer_one_leaves_nothing_behind() {
        let older = snap_at(5, "10.0.0.5:1");
        let newer = snap_at(6, "10.0.0.6:1");
        let (ours, theirs, s) = race(older, newer.clone());
        assert!(matches!(
            theirs,
            PushOutcome::Accepted { generation: 6, .. }
        ));
        assert_eq!(
            ours,
            PushOutcome::StaleGeneration {
                generation: 5,
                current: 6
            }
        );
        assert_eq!(
            stored(&s),
            (6, vec!["10.0.0.6:1".to_string()], newer),
            "the loser's bytes replaced the winner's"
        );
        assert_eq!(Meta::read(&s).unwrap().generation, 6);
    }

    #[test]
    fn a_newer_push_that_lost_the_cas_to_an_older_one_retries_and_wins() {
        let older = snap_at(5, "10.0.0.5:1");
        let newer = snap_at(6, "10.0.0.6:1");
        let (ours, theirs, s) = race(newer.clone(), older);
        assert!(matches!(
            theirs,
            PushOutcome::Accepted { generation: 5, .. }
        ));
        assert!(
            matches!(ours, PushOutcome::Accepted { generation: 6, .. }),
            "{ours:?}"
        );
        assert_eq!(stored(&s), (6, vec!["10.0.0.6:1".to_string()], newer));
        assert_eq!(
            Meta::read(&s).unwrap(),
            Meta {
                generation: 6,
                accepted_ms: 30
            },
            "the change signal must name the stored generation"
        );
    }

    /// A signed `u64::MAX` would make every later push stale until Envoy restarts: a generation
    /// more than `MAX_GENERATION_LEAD_MS` ahead of the clock is refused and stores nothing.
    #[test]
    fn a_generation_far_ahead_of_the_clock_is_refused() {
        let s = MemoryStore::new();
        let now = 1_700_000_000_000;
        assert!(matches!(
            accept(&s, &snap(now), now),
            PushOutcome::Accepted { .. }
        ));
        for far in [u64::MAX, now + MAX_GENERATION_LEAD_MS + 1] {
            assert_eq!(
                accept(&s, &snap(far), now),
                PushOutcome::GenerationAhead {
                    generation: far,
                    limit: now + MAX_GENERATION_LEAD_MS
                }
            );
        }
        assert_eq!(Meta::read(&s).unwrap().generation, now);
        assert_eq!(stored(&s).0, now);
        // At the bound it is still accepted (clocks of two hosts may disagree), and the next
        // honest push is judged against it as usual.
        let edge = now + MAX_GENERATION_LEAD_MS;
        assert!(matches!(
            accept(&s, &snap(edge), now),
            PushOutcome::Accepted { .. }
        ));
        // Near the end of u64 the bound saturates instead of wrapping.
        let s = MemoryStore::new();
        assert!(matches!(
            accept(&s, &snap(u64::MAX), u64::MAX - 5),
            PushOutcome::Accepted { .. }
        ));
    }

    #[test]
    fn the_meta_key_is_never_lowered() {
        let s = MemoryStore::new();
        raise_meta(
            &s,
            Meta {
                generation: 9,
                accepted_ms: 1,
            },
        );
        raise_meta(
            &s,
            Meta {
                generation: 4,
                accepted_ms: 2,
            },
        );
        assert_eq!(Meta::read(&s).unwrap().generation, 9);
    }

    /// One pod scraped at `scraped_at_ms`, with other replicas' `peer_in_flight` on it.
    fn scraped(generation: u64, scraped_at_ms: u64, peer_in_flight: u32) -> Vec<u8> {
        let mut snap = Snapshot::decode(&snap(generation)).unwrap();
        let pod = &mut snap.pools[0].pods[0];
        pod.scraped_at_ms = scraped_at_ms;
        pod.peers.in_flight = peer_in_flight;
        snap.encode().unwrap()
    }

    #[test]
    fn a_push_that_repeats_the_last_scrape_keeps_the_baseline() {
        let s = MemoryStore::new();
        let pod = "127.0.0.1:1";
        let accepted =
            |b: Vec<u8>| assert!(matches!(accept(&s, &b, 100), PushOutcome::Accepted { .. }));
        accepted(scraped(1, 1_000, 0));
        // Two requests sent after that scrape: the engine's counts do not have them yet.
        assert!(inflight::routed(&s, "p", pod, 10));
        assert!(inflight::routed(&s, "p", pod, 10));
        // The hub streams another replica's new work over the same scrape: still not in them.
        accepted(scraped(2, 1_000, 3));
        assert_eq!(inflight::read_baseline(&s, "p").in_flight(pod), 0);
        // A new scrape: the engine has seen them now.
        accepted(scraped(3, 1_050, 3));
        assert_eq!(inflight::read_baseline(&s, "p").in_flight(pod), 2);
        // A new pod list is a new observation too.
        assert!(inflight::routed(&s, "p", pod, 10));
        accepted(snap_at(4, "127.0.0.1:2"));
        assert_eq!(inflight::read_baseline(&s, "p").in_flight(pod), 3);
    }

    #[test]
    fn accepts_newer_generations_only_and_workers_follow() {
        let s = MemoryStore::new();
        let mut cache = Cache::default();
        assert!(cache.current(&s, &Config::default()).is_none());
        assert_eq!(
            accept(&s, &snap(2), 100),
            PushOutcome::Accepted {
                generation: 2,
                pools: 1,
                pods: 1
            }
        );
        assert_eq!(
            cache
                .current(&s, &Config::default())
                .unwrap()
                .snapshot
                .generation,
            2
        );
        assert_eq!(
            accept(&s, &snap(2), 101),
            PushOutcome::StaleGeneration {
                generation: 2,
                current: 2
            }
        );
        assert!(
            matches!(accept(&s, b"garbage", 102), PushOutcome::Invalid(m) if m.contains("magic"))
        );
        assert_eq!(
            Meta::read(&s).unwrap(),
            Meta {
                generation: 2,
                accepted_ms: 100
            }
        );
        assert!(matches!(
            accept(&s, &snap(3), 200),
            PushOutcome::Accepted { .. }
        ));
        let f = cache.current(&s, &Config::default()).unwrap();
        assert_eq!((f.snapshot.generation, f.accepted_ms), (3, 200));
        let json = state_json(&s, 250);
        assert!(
            json.contains("\"generation\":3") && json.contains("\"age_ms\":50"),
            "{json}"
        );
    }
}
