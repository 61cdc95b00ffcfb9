//! The decision for one request: which pool, which pods in which order, or which rejection.
//!
//! [`Router::route`] takes the configuration, the fleet as of the latest accepted snapshot, the
//! parsed request and the shared store (in-flight counts, prefix index), and returns ranked
//! endpoints or a [`Rejection`]. It knows nothing of proxy-wasm: the filter calls it with a
//! store backed by Envoy's shared data; tests call it with [`crate::store::MemoryStore`].

use crate::config::{Config, OnMissing, OnStale, PoolConfig};
use crate::inflight::{self, Table};
use crate::prefix::{self, PrefixIndex};
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::score::{self, Candidate, Features, Mode};
use crate::store::SharedStore;
use llm_router_snapshot::{Health, Snapshot};
use std::collections::HashMap;

/// The fleet as of one accepted snapshot, with what is derived from it once (not per request).
#[derive(Debug, Clone)]
pub struct Fleet {
    pub snapshot: Snapshot,
    /// When this proxy accepted the snapshot (ms, proxy clock).
    pub accepted_ms: u64,
    /// In-flight counts per snapshot pool when the snapshot was accepted.
    baselines: Vec<Table>,
    /// Model or adapter name → (snapshot pool index, is an adapter).
    models: HashMap<String, (usize, bool)>,
}

impl Fleet {
    /// Indexes a snapshot. `baselines[i]` belongs to `snapshot.pools[i]` (missing = empty).
    pub fn new(snapshot: Snapshot, accepted_ms: u64, baselines: Vec<Table>) -> Fleet {
        let mut models = HashMap::new();
        for (i, pool) in snapshot.pools.iter().enumerate() {
            for m in &pool.models {
                models.entry(m.clone()).or_insert((i, false));
            }
        }
        for (i, pool) in snapshot.pools.iter().enumerate() {
            for pod in &pool.pods {
                if let Some(l) = &pod.lora {
                    for a in l.running.iter().chain(&l.waiting) {
                        models.entry(a.clone()).or_insert((i, true));
                    }
                }
            }
        }
        Fleet {
            snapshot,
            accepted_ms,
            baselines,
            models,
        }
    }

    /// Reads the baselines of every pool of `snapshot` from the store.
    pub fn load(store: &impl SharedStore, snapshot: Snapshot, accepted_ms: u64) -> Fleet {
        let baselines = snapshot
            .pools
            .iter()
            .map(|p| inflight::read_baseline(store, &p.name))
            .collect();
        Fleet::new(snapshot, accepted_ms, baselines)
    }

    fn is_stale(&self, now_ms: u64, stale_after_ms: u64) -> bool {
        now_ms.saturating_sub(self.accepted_ms) > stale_after_ms
    }
}

/// How the endpoints were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMode {
    /// From fresh metrics.
    Scored,
    /// The snapshot is stale: by this proxy's in-flight counts.
    LeastInflight,
    /// No usable snapshot: no endpoint set, Envoy's fallback policy picks.
    Fallback,
}

impl RouteMode {
    pub fn name(self) -> &'static str {
        match self {
            RouteMode::Scored => "scored",
            RouteMode::LeastInflight => "least_inflight",
            RouteMode::Fallback => "fallback",
        }
    }
}

/// A routing decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub pool: String,
    pub cluster: String,
    /// Best first; empty when Envoy's fallback policy should choose.
    pub endpoints: Vec<String>,
    /// New value for the body's `model`.
    pub rewrite: Option<String>,
    pub mode: RouteMode,
    /// `(address, score)` of the endpoints, for logs.
    pub scores: Vec<(String, f64)>,
    /// Pod whose in-flight count this request incremented (decrement it when the stream ends).
    pub inflight_pod: Option<String>,
}

/// Priority and tie-break bits that come from the request's headers and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    pub priority: i32,
    pub now_ms: u64,
    pub tie: u64,
}

/// The configured router.
#[derive(Debug, Clone)]
pub struct Router {
    pub config: Config,
}

impl Router {
    pub fn new(config: Config) -> Router {
        Router { config }
    }

    /// Resolves a model name to its pool settings, pool name, rewrite and adapter flag.
    fn resolve<'r>(
        &'r self,
        model: &str,
        fleet: Option<&'r Fleet>,
    ) -> Option<(PoolConfig, Option<String>, bool)> {
        if let Some(route) = self.config.models.get(model) {
            let pool = self.config.pools.get(route.pool)?.clone();
            return Some((pool, route.rewrite.clone(), route.adapter));
        }
        let fleet = fleet?;
        let &(i, adapter) = fleet.models.get(model)?;
        let sp = fleet.snapshot.pools.get(i)?;
        let pool = match self.config.pool(&sp.name) {
            Some(p) => p.clone(),
            None => PoolConfig {
                name: sp.name.clone(),
                cluster: sp.cluster.clone(),
                ..self.config.default_pool.clone()
            },
        };
        Some((pool, None, adapter))
    }

    /// Decides where `req` goes. On success the chosen pod's in-flight count is incremented and
    /// the prompt's blocks are recorded for it in the prefix index.
    pub fn route<S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&Fleet>,
        req: &ParsedRequest<'_>,
        ctx: Context,
    ) -> Result<Routed, Rejection> {
        let model = req.model.as_ref();
        let (pool, rewrite, adapter) = self
            .resolve(model, fleet)
            .ok_or_else(|| Rejection::model_not_found(model))?;
        let fallback = |why: &str, reject: bool| -> Result<Routed, Rejection> {
            if reject {
                return Err(Rejection::no_endpoints(&pool.name, why));
            }
            Ok(Routed {
                pool: pool.name.clone(),
                cluster: pool.cluster.clone(),
                endpoints: Vec::new(),
                rewrite: rewrite.clone(),
                mode: RouteMode::Fallback,
                scores: Vec::new(),
                inflight_pod: None,
            })
        };
        let snap = &self.config.snapshot;
        let reject_missing = snap.on_missing == OnMissing::Reject;
        let Some(fleet) = fleet else {
            return fallback("no fleet snapshot has arrived yet", reject_missing);
        };
        let Some((pool_index, sp)) = fleet
            .snapshot
            .pools
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == pool.name)
        else {
            return fallback("the fleet snapshot does not list this pool", reject_missing);
        };
        let mode = if fleet.is_stale(ctx.now_ms, snap.stale_after_ms) {
            match snap.on_stale {
                OnStale::LeastInflight => Mode::LeastInflight,
                OnStale::Fallback => return fallback("", false),
                OnStale::Reject => return fallback("the fleet snapshot is stale", true),
            }
        } else {
            Mode::Full
        };

        let live = inflight::read(store, &pool.name);
        let empty = Table::default();
        let baseline = fleet.baselines.get(pool_index).unwrap_or(&empty);
        let hashes = prefix::block_hashes(
            model,
            &req.pieces,
            pool.prefix.block_chars,
            pool.prefix.max_blocks,
        );
        let index = PrefixIndex::new(
            store,
            &pool.name,
            pool.prefix.index_slots,
            pool.prefix.pods_per_block,
        );
        let found = index.lookup(&hashes);

        let cands: Vec<Candidate<'_>> = sp
            .pods
            .iter()
            .filter(|p| p.health != Health::Failing)
            .map(|p| {
                let full = mode == Mode::Full;
                Candidate {
                    address: &p.address,
                    stale: p.health == Health::Stale,
                    waiting: if full { p.waiting } else { 0 },
                    running: if full { p.running } else { 0 },
                    kv_usage: if full { p.kv_usage } else { None },
                    lora: p.lora.as_ref(),
                    inflight: live.get(&p.address),
                    inflight_baseline: if full { baseline.get(&p.address) } else { 0 },
                    prefix_blocks: found.blocks_for(&p.address),
                }
            })
            .collect();
        if cands.is_empty() {
            let why = if sp.pods.is_empty() {
                "the pool has no pods"
            } else {
                "every pod is failing its metrics scrapes"
            };
            return Err(Rejection::no_endpoints(&pool.name, why));
        }
        let features = Features {
            adapter: adapter.then_some(model),
            prompt_blocks: hashes.len() as u32,
            priority: ctx.priority,
            tie: ctx.tie,
        };
        let ranked = score::rank(
            &pool,
            &cands,
            &features,
            mode,
            self.config.top_k,
            self.config.retry_after_s,
        )?;
        let endpoints: Vec<String> = ranked
            .iter()
            .filter_map(|s| cands.get(s.index))
            .map(|c| c.address.to_string())
            .collect();
        let scores = ranked
            .iter()
            .filter_map(|s| cands.get(s.index).map(|c| (c.address.to_string(), s.score)))
            .collect();
        let chosen = endpoints.first().cloned();
        if let Some(pod) = &chosen {
            index.record(&hashes, pod, &found);
            inflight::adjust(store, &pool.name, pod, 1);
        }
        Ok(Routed {
            pool: pool.name.clone(),
            cluster: pool.cluster.clone(),
            endpoints,
            rewrite,
            mode: if mode == Mode::Full {
                RouteMode::Scored
            } else {
                RouteMode::LeastInflight
            },
            scores,
            inflight_pod: chosen,
        })
    }

    /// The stream of a routed request ended: its pod has one request less in flight.
    pub fn finished(&self, store: &impl SharedStore, pool: &str, pod: &str) {
        inflight::adjust(store, pool, pod, -1);
    }

    /// The request was served by `served` although `chosen` was counted (an Envoy retry went to
    /// a fallback endpoint): move the in-flight count.
    pub fn moved(&self, store: &impl SharedStore, pool: &str, chosen: &str, served: &str) {
        if chosen != served {
            inflight::adjust(store, pool, chosen, -1);
            inflight::adjust(store, pool, served, 1);
        }
    }
}

#[cfg(test)]
mod tests;
