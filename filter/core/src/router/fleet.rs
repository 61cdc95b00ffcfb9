use crate::config::{resolve_snapshot_rewrites, Config, DroppedRewrite};
use crate::inflight::{self, Table};
use crate::lora;
use crate::prefix;
use crate::replica_prior;
use crate::rewrite::Rewrites;
use crate::shortlist::Shortlist;
use crate::store::SharedStore;
use llm_router_snapshot::Snapshot;
use std::collections::HashMap;

/// What is derived once per snapshot for one of its pools.
#[derive(Debug, Clone, Default)]
pub(super) struct PoolIndex {
    /// Prefix-index id of each pod, in snapshot order.
    pub(super) pod_ids: Vec<u32>,
    /// Adapter → home pod (snapshot order), by bounded-load rendezvous.
    pub(super) homes: HashMap<String, usize>,
    /// [`lora::homes_key`] of what `homes` was solved from.
    pub(super) homes_key: u64,
    /// This proxy's share of the requests the pool's engines counted
    /// ([`replica_prior::own_share`]).
    pub(super) own_share: f64,
    /// What a large pool's decisions shortlist from ([`crate::shortlist`]); `None` for a
    /// pool scored whole.
    pub(super) shortlist: Option<Shortlist>,
    /// Long contexts other gateway replicas placed on the pool's pods, by key
    /// ([`crate::placed::note_placed`]).
    pub(super) peer_contexts: Vec<llm_router_snapshot::PeerContext>,
    /// The snapshot shows other gateway replicas at work in the pool (their requests or
    /// their placed contexts): this proxy's own placements are then worth sharing.
    pub(super) peers: bool,
}

impl PoolIndex {
    /// What one decision needs derived from snapshot pool `pool` (with `baseline`, the
    /// in-flight counts when it was accepted), reusing `prev`'s adapter homes when the pool's
    /// pods, slots and adapters are unchanged.
    fn new(
        pool: &llm_router_snapshot::Pool,
        baseline: Option<&Table>,
        config: &Config,
        prev: Option<&Fleet>,
    ) -> PoolIndex {
        let addrs: Vec<&str> = pool.pods.iter().map(|p| p.address.as_str()).collect();
        let slots: Vec<u16> = pool
            .pods
            .iter()
            .map(|p| p.lora.as_ref().map_or(0, |l| l.max_loras))
            .collect();
        let mut adapters = config.adapters_of(&pool.name);
        if adapters.is_empty() {
            adapters = pool
                .pods
                .iter()
                .filter_map(|p| p.lora.as_ref())
                .flat_map(|l| l.running.iter().chain(&l.waiting).cloned())
                .collect();
        }
        let own_share = baseline.map_or(1.0, |b| replica_prior::own_share(pool, b));
        let homes_key = lora::homes_key(&adapters, &addrs, &slots);
        let pod_ids: Vec<u32> = addrs.iter().map(|a| prefix::pod_id(a)).collect();
        let empty = Table::default();
        let pool_config = config.pool(&pool.name).unwrap_or(&config.default_pool);
        let shortlist = Shortlist::new(pool, baseline.unwrap_or(&empty), &pod_ids, pool_config);
        let reused = prev.and_then(|f| {
            let j = f.snapshot.pools.iter().position(|p| p.name == pool.name)?;
            let old = f.pools.get(j).filter(|d| d.homes_key == homes_key)?;
            Some(old.homes.clone())
        });
        let mut peer_contexts = pool.peer_contexts.clone();
        peer_contexts.sort_unstable();
        let peers = !peer_contexts.is_empty() || pool.pods.iter().any(|p| !p.peers.is_none());
        PoolIndex {
            pod_ids,
            homes: reused.unwrap_or_else(|| lora::homes(&adapters, &addrs, &slots)),
            homes_key,
            own_share,
            shortlist,
            peer_contexts,
            peers,
        }
    }
}

/// The snapshot's rewrite rules resolved against `config` ([`resolve_snapshot_rewrites`]):
/// once per accepted generation, and not even then when `prev` carried the same rules (a
/// sidecar repeats them in every snapshot).
fn snapshot_rewrites(
    snapshot: &Snapshot,
    config: &Config,
    prev: Option<&Fleet>,
) -> (Option<Rewrites>, Vec<DroppedRewrite>) {
    let Some(rules) = &snapshot.rewrites else {
        return (None, Vec::new());
    };
    // Targets may resolve through the snapshot's pools: reused only when those are the same.
    let same_pools = |p: &Fleet| {
        p.snapshot.pools.len() == snapshot.pools.len()
            && p.snapshot
                .pools
                .iter()
                .zip(&snapshot.pools)
                .all(|(a, b)| a.name == b.name && a.models == b.models)
    };
    if let Some(prev) =
        prev.filter(|p| p.snapshot.rewrites.as_ref() == Some(rules) && same_pools(p))
    {
        return (prev.rewrites.clone(), prev.dropped_rewrites.clone());
    }
    let (rewrites, dropped) = resolve_snapshot_rewrites(snapshot, config);
    (Some(rewrites), dropped)
}

/// Where the configuration's pools and the snapshot's disagree, a line each naming the pool and
/// both sides: a configured pool the snapshot does not list (its requests fall back, or are
/// refused, as `snapshot.on_missing` says), one both list under different clusters (the
/// configured cluster is used). Empty when they agree, or when the configuration names no pool
/// (pools from the snapshot alone). The filter logs them when they change — with the first
/// snapshot, at startup — rather than per request.
pub fn pool_mismatches(snapshot: &Snapshot, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for p in &config.pools {
        match snapshot.pools.iter().find(|s| s.name == p.name) {
            None => out.push(format!(
                "pool {:?} (cluster {:?}) is configured but the snapshot does not list it (it lists {:?})",
                p.name,
                p.cluster,
                snapshot.pools.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
            )),
            Some(s) if s.cluster != p.cluster => out.push(format!(
                "pool {:?}: the configuration names cluster {:?}, the snapshot {:?} (the configured one is used)",
                p.name, p.cluster, s.cluster
            )),
            Some(_) => {}
        }
    }
    out
}

/// The fleet as of one accepted snapshot, with what is derived from it once (not per request).
#[derive(Debug, Clone)]
pub struct Fleet {
    pub snapshot: Snapshot,
    /// When this proxy accepted the snapshot (ms, proxy clock).
    pub accepted_ms: u64,
    /// In-flight counts per snapshot pool when the snapshot was accepted.
    pub(super) baselines: Vec<Table>,
    /// Model or adapter name → (snapshot pool index, is an adapter).
    pub(super) models: HashMap<String, (usize, bool)>,
    /// Per snapshot pool.
    pub(super) pools: Vec<PoolIndex>,
    /// The snapshot's rewrite rules resolved against the configuration, in force instead of
    /// the configured ones; `None` when the snapshot has no rewrites section.
    pub rewrites: Option<Rewrites>,
    /// The snapshot's rules that did not resolve (logged by the filter when they change).
    pub dropped_rewrites: Vec<DroppedRewrite>,
    /// Where the configured pools and the snapshot's disagree ([`pool_mismatches`]; logged by
    /// the filter when they change).
    pub pool_mismatches: Vec<String>,
}

impl Fleet {
    /// Indexes a snapshot. `baselines[i]` belongs to `snapshot.pools[i]` (missing = empty).
    /// Adapter homes cover the adapters `config` lists for the pool, or, for a pool the
    /// configuration does not list adapters for, the ones the pods report.
    pub fn new(
        snapshot: Snapshot,
        accepted_ms: u64,
        baselines: Vec<Table>,
        config: &Config,
    ) -> Fleet {
        Fleet::new_after(snapshot, accepted_ms, baselines, config, None)
    }

    /// As [`Fleet::new`], reusing `prev`'s adapter homes for every pool whose pods, slots and
    /// adapters are unchanged (the common case: a snapshot every 50 ms of the same fleet).
    pub fn new_after(
        snapshot: Snapshot,
        accepted_ms: u64,
        baselines: Vec<Table>,
        config: &Config,
        prev: Option<&Fleet>,
    ) -> Fleet {
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
        let pools = snapshot
            .pools
            .iter()
            .enumerate()
            .map(|(i, pool)| PoolIndex::new(pool, baselines.get(i), config, prev))
            .collect();
        let (rewrites, dropped_rewrites) = snapshot_rewrites(&snapshot, config, prev);
        let pool_mismatches = pool_mismatches(&snapshot, config);
        Fleet {
            snapshot,
            accepted_ms,
            baselines,
            models,
            pools,
            rewrites,
            dropped_rewrites,
            pool_mismatches,
        }
    }

    /// Reads the baselines of every pool of `snapshot` from the store.
    pub fn load(
        store: &impl SharedStore,
        snapshot: Snapshot,
        accepted_ms: u64,
        config: &Config,
    ) -> Fleet {
        Fleet::load_after(store, snapshot, accepted_ms, config, None)
    }

    /// As [`Fleet::load`], reusing what `prev` derived where it still holds
    /// ([`Fleet::new_after`]).
    pub fn load_after(
        store: &impl SharedStore,
        snapshot: Snapshot,
        accepted_ms: u64,
        config: &Config,
        prev: Option<&Fleet>,
    ) -> Fleet {
        let baselines = snapshot
            .pools
            .iter()
            .map(|p| inflight::read_baseline(store, &p.name))
            .collect();
        Fleet::new_after(snapshot, accepted_ms, baselines, config, prev)
    }

    /// This proxy's share of the requests the engines of pool `pool` reported, when the
    /// snapshot was accepted ([`replica_prior::own_share`]).
    pub fn own_share(&self, pool: &str) -> Option<f64> {
        let i = self.snapshot.pools.iter().position(|p| p.name == pool)?;
        self.pools.get(i).map(|d| d.own_share)
    }

    pub(super) fn is_stale(&self, now_ms: u64, stale_after_ms: u64) -> bool {
        now_ms.saturating_sub(self.accepted_ms) > stale_after_ms
    }
}
