//! The fleet snapshot in shared data: accepting a push from the sidecar, and keeping each
//! worker's decoded copy current without decoding on every request.
//!
//! Keys: `llmr/snapshot` holds the encoded snapshot; `llmr/snapshot/meta` holds
//! `generation u64 | accepted_ms u64`. The push writes the snapshot, then the in-flight
//! baselines, then the meta key last, so a worker that sees a new generation in the meta key
//! finds a snapshot at least that new. Workers read only the 16-byte meta key per request and
//! decode the snapshot once per generation.

use llm_router_core::inflight;
use llm_router_core::store::SharedStore;
use llm_router_core::{Config, Fleet};
use llm_router_snapshot::Snapshot;
use std::rc::Rc;

pub const SNAPSHOT_KEY: &str = "llmr/snapshot";
pub const META_KEY: &str = "llmr/snapshot/meta";

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
    StoreFailed,
}

/// Validates and stores a pushed snapshot. A bad snapshot changes nothing.
pub fn accept(store: &impl SharedStore, bytes: &[u8], now_ms: u64) -> PushOutcome {
    let snap = match Snapshot::decode(bytes) {
        Ok(s) => s,
        Err(e) => return PushOutcome::Invalid(e.to_string()),
    };
    let current = store.get(META_KEY);
    let cas = current.as_ref().map(|(_, c)| *c);
    if let Some(m) = current.as_ref().and_then(|(v, _)| Meta::decode(v)) {
        if snap.generation <= m.generation {
            return PushOutcome::StaleGeneration {
                generation: snap.generation,
                current: m.generation,
            };
        }
    }
    if store.set(SNAPSHOT_KEY, bytes, None).is_err() {
        return PushOutcome::StoreFailed;
    }
    for pool in &snap.pools {
        inflight::snapshot_baseline(store, &pool.name);
    }
    let meta = Meta {
        generation: snap.generation,
        accepted_ms: now_ms,
    };
    // CAS on the meta key: of two concurrent pushes, the one that read first loses.
    if store.set(META_KEY, &meta.encode(), cas).is_err() {
        return PushOutcome::StoreFailed;
    }
    PushOutcome::Accepted {
        generation: snap.generation,
        pools: snap.pools.len(),
        pods: snap.pod_count(),
    }
}

/// A worker's decoded copy of the fleet.
#[derive(Debug, Default)]
pub struct Cache {
    generation: u64,
    fleet: Option<Rc<Fleet>>,
}

impl Cache {
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
                self.fleet = Some(Rc::new(Fleet::load(store, snap, meta.accepted_ms, config)));
                self.generation = meta.generation;
            }
        }
        self.fleet.clone()
    }
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
                "pods": p.pods.iter().map(|pod| serde_json::json!({
                    "address": pod.address,
                    "engine": pod.engine.name(),
                    "health": pod.health.name(),
                    "waiting": pod.waiting,
                    "running": pod.running,
                    "kv_usage": pod.kv_usage,
                    "lora_running": pod.lora.as_ref().map(|l| &l.running),
                    "in_flight": live.in_flight(&pod.address),
                    "pending_tokens": live.get(&pod.address).pending_tokens,
                    "prefill_ms_per_token": live.get(&pod.address).fit.rate().map(|r| r.cost_ms_per_token),
                    "base_ms": live.get(&pod.address).fit.rate().map(|r| r.base_ms),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "generation": meta.map(|m| m.generation),
        "age_ms": meta.map(|m| now_ms.saturating_sub(m.accepted_ms)),
        "pools": pools,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use llm_router_core::MemoryStore;
    use llm_router_snapshot::{Pod, Pool};

    fn snap(generation: u64) -> Vec<u8> {
        Snapshot {
            generation,
            created_ms: 5,
            pools: vec![Pool {
                name: "p".into(),
                cluster: "c".into(),
                models: vec!["m".into()],
                pods: vec![Pod {
                    address: "127.0.0.1:1".into(),
                    ..Pod::default()
                }],
            }],
        }
        .encode()
        .unwrap()
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
