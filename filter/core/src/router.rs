//! The decision for one request: which pool, which pods in which order, or which rejection.
//!
//! [`Router::route`] takes the configuration, the fleet as of the latest accepted snapshot, the
//! parsed request and the shared store (in-flight counts, prefix index), and returns ranked
//! endpoints or a [`Rejection`]. It knows nothing of proxy-wasm: the filter calls it with a
//! store backed by Envoy's shared data; tests call it with [`crate::store::MemoryStore`].

use crate::candidate::{Candidate, Features, Mode};
use crate::config::{Config, OnMissing, OnStale, PoolConfig};
use crate::flow::{self, Admission, PodRoom};
use crate::inflight::{self, PodLoad, Table};
use crate::lora::{self, Placement};
use crate::predict::{self, Rate};
use crate::prefix::{self, PrefixIndex};
use crate::prior;
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::score::{self, Scope, Unscored};
use crate::shortlist::Shortlist;
use crate::store::SharedStore;
use crate::trust;
use llm_router_snapshot::{Health, PeerContext, Snapshot};
use std::collections::HashMap;

/// What is derived once per snapshot for one of its pools.
#[derive(Debug, Clone, Default)]
struct PoolIndex {
    /// Prefix-index id of each pod, in snapshot order.
    pod_ids: Vec<u32>,
    /// Adapter → home pod (snapshot order), by bounded-load rendezvous.
    homes: HashMap<String, usize>,
    /// [`lora::homes_key`] of what `homes` was solved from.
    homes_key: u64,
    /// This proxy's share of the requests the pool's engines counted ([`prior::own_share`]).
    own_share: f64,
    /// What a large pool's decisions shortlist from ([`crate::shortlist`]); `None` for a
    /// pool scored whole.
    shortlist: Option<Shortlist>,
    /// Long contexts other gateway replicas placed on the pool's pods, by key
    /// ([`crate::placed::note_placed`]).
    peer_contexts: Vec<llm_router_snapshot::PeerContext>,
    /// The snapshot shows other gateway replicas at work in the pool (their requests or
    /// their placed contexts): this proxy's own placements are then worth sharing.
    peers: bool,
}

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
    /// Per snapshot pool.
    pools: Vec<PoolIndex>,
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
            .map(|(i, pool)| {
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
                let own_share = baselines.get(i).map_or(1.0, |b| prior::own_share(pool, b));
                let homes_key = lora::homes_key(&adapters, &addrs, &slots);
                let pod_ids: Vec<u32> = addrs.iter().map(|a| prefix::pod_id(a)).collect();
                let empty = Table::default();
                let pool_config = config.pool(&pool.name).unwrap_or(&config.default_pool);
                let shortlist = Shortlist::new(
                    pool,
                    baselines.get(i).unwrap_or(&empty),
                    &pod_ids,
                    pool_config,
                );
                let reused = prev.and_then(|f| {
                    let j = f.snapshot.pools.iter().position(|p| p.name == pool.name)?;
                    let old = f.pools.get(j).filter(|d| d.homes_key == homes_key)?;
                    Some(old.homes.clone())
                });
                let mut peer_contexts = pool.peer_contexts.clone();
                peer_contexts.sort_unstable();
                let peers =
                    !peer_contexts.is_empty() || pool.pods.iter().any(|p| !p.peers.is_none());
                PoolIndex {
                    pod_ids,
                    homes: reused.unwrap_or_else(|| lora::homes(&adapters, &addrs, &slots)),
                    homes_key,
                    own_share,
                    shortlist,
                    peer_contexts,
                    peers,
                }
            })
            .collect();
        Fleet {
            snapshot,
            accepted_ms,
            baselines,
            models,
            pools,
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
    /// snapshot was accepted ([`prior::own_share`]).
    pub fn own_share(&self, pool: &str) -> Option<f64> {
        let i = self.snapshot.pools.iter().position(|p| p.name == pool)?;
        self.pools.get(i).map(|d| d.own_share)
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
    /// The served model name a rewrite rule chose (for the response header and the metrics);
    /// `None` when no rule matched.
    pub served_model: Option<String>,
    pub mode: RouteMode,
    /// `(address, score)` best first: the endpoints', or every candidate's when
    /// `debug_scores` is on (logs and the debug header).
    pub scores: Vec<(String, f64)>,
    /// The chosen pod probably has a cached prefix of this prompt (prefix-index match).
    pub prefix_hit: bool,
    /// An adapter request went to a pod where the adapter is resident or at home.
    pub lora_hit: bool,
    /// Pod whose in-flight count this request incremented (decrement it when the stream ends).
    pub inflight_pod: Option<String>,
    /// Prefill tokens this request added to that pod's pending work (release them at its first
    /// response byte, or when it ends without one).
    pub pending_tokens: u32,
    /// Prefill work ahead of and including this request on that pod when it was routed: with
    /// the time to its first byte, one observation of the pod's rate. NaN (no observation)
    /// when the pod was chosen on a guess of what it has cached ([`crate::prior`]).
    pub work_tokens: f64,
    /// The LoRA adapter counted in flight on that pod ([`lora::note`]; report its end with
    /// [`Router::adapter_ended`]).
    pub adapter: Option<String>,
}

/// What a request's model name resolves to ([`Router::resolve`]).
struct Resolved {
    pool: PoolConfig,
    rewrite: Option<String>,
    adapter: bool,
    served_model: Option<String>,
}

/// Priority and tie-break bits that come from the request's headers and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    pub priority: i32,
    pub now_ms: u64,
    pub tie: u64,
    /// When the request's own time-to-first-token objective ends (host ms; llm-d's
    /// `x-slo-ttft-ms` from its arrival): with flow control, only pods predicted to answer
    /// by then take it ([`crate::flow::admit`]).
    pub deadline_ms: Option<u64>,
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

    /// Resolves a request's model name: the pool settings, the body's new `model` (an alias's
    /// rewrite, or the target a rewrite rule chose), whether the served name is an adapter, and
    /// the served name when a rewrite rule chose it ([`crate::rewrite`]; drawn from `ctx.tie`,
    /// or the conversation for sticky rules).
    fn resolve<'r>(
        &'r self,
        req: &ParsedRequest<'_>,
        ctx: Context,
        fleet: Option<&'r Fleet>,
    ) -> Option<Resolved> {
        let model = req.model.as_ref();
        if let Some(rule) = self.config.rewrites.rule(model) {
            let target = rule.choose(req, ctx.tie)?;
            let pool = self.config.pools.get(target.pool)?.clone();
            // A target that is itself an alias is served under the alias' rewrite.
            let served = self
                .config
                .models
                .get(&target.model)
                .filter(|m| m.pool == target.pool)
                .and_then(|m| m.rewrite.clone())
                .unwrap_or_else(|| target.model.clone());
            return Some(Resolved {
                pool,
                rewrite: (served != model).then(|| served.clone()),
                adapter: target.adapter,
                served_model: Some(served),
            });
        }
        if let Some(route) = self.config.models.get(model) {
            let pool = self.config.pools.get(route.pool)?.clone();
            return Some(Resolved {
                pool,
                rewrite: route.rewrite.clone(),
                adapter: route.adapter,
                served_model: None,
            });
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
        Some(Resolved {
            pool,
            rewrite: None,
            adapter,
            served_model: None,
        })
    }

    /// The pool `req` goes to, if any (what its wait queue is keyed by). A rewrite rule whose
    /// targets sit in different pools draws its target from `ctx.tie` here and again when the
    /// request is dispatched: sticky rules (or one pool per rule) keep both the same.
    pub fn pool_of(
        &self,
        req: &ParsedRequest<'_>,
        ctx: Context,
        fleet: Option<&Fleet>,
    ) -> Option<String> {
        self.resolve(req, ctx, fleet).map(|r| r.pool.name)
    }

    /// Decides where `req` goes, never holding it (flow control off, or a dispatch that may not
    /// wait). On success the chosen pod's in-flight count is incremented and the prompt's blocks
    /// are recorded for it in the prefix index.
    pub fn route<S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&Fleet>,
        req: &ParsedRequest<'_>,
        ctx: Context,
    ) -> Result<Routed, Rejection> {
        match self.decide(store, fleet, req, ctx, Hold::Never)? {
            Decision::Routed(r) => Ok(r),
            // Not reached: with `Hold::Never` the admission stage admits every request.
            Decision::Wait { pool } => Err(Rejection::saturated(&pool, self.config.retry_after_s)),
        }
    }

    /// The decision as a pipeline: resolve → pool view → candidates → admit or wait → features
    /// → rank → account. With [`Hold::IfFull`], a request no pod can take now
    /// ([`flow::admit`]) comes back as [`Decision::Wait`], with [`Hold::Behind`] every request
    /// does; either way one the pool would shed (sheddable in a saturated pool, standard far
    /// past it) is refused instead: sheddable requests are the first to go.
    pub fn decide<S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&Fleet>,
        req: &ParsedRequest<'_>,
        ctx: Context,
        hold: Hold,
    ) -> Result<Decision, Rejection> {
        let target = self
            .resolve(req, ctx, fleet)
            .ok_or_else(|| Rejection::model_not_found(&req.model))?;
        let view = match self.pool_view(store, fleet, target, ctx)? {
            Viewed::Ready(v) => v,
            Viewed::Fallback(r) => return Ok(Decision::Routed(*r)),
        };
        // A large pool's shortlist ranks exactly what scoring every pod would for the best
        // `top_k`: not for the debug scores, which list them all, nor for work queued behind
        // held work (the whole pool decides whether it waits).
        let shortlist =
            (hold != Hold::Behind && !self.config.debug_scores).then_some(self.config.top_k);
        let mut cands = candidates(store, &view, req, ctx, shortlist)?;
        let retry = (self.config.retry_after_s, self.config.retry_after_max_s);
        let kv_threshold = self.config.flow.kv_threshold;
        let mut admitted = admit_or_wait(&view, &cands, req, ctx, hold, kv_threshold, retry);
        // Flow control's admission over a shortlist is the whole pool's when every pod on it
        // fits: the pool's best pods are on it, so they fit, and ranking the fitting pods of
        // the pool gives the same best `top_k`. Otherwise a pod left off may be the best that
        // fits, or the only one with room: the whole pool is judged.
        if !cands.positions.is_empty() && !matches!(admitted, Ok(Some(None))) {
            #[cfg(test)]
            REJUDGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cands = candidates(store, &view, req, ctx, None)?;
            admitted = admit_or_wait(&view, &cands, req, ctx, hold, kv_threshold, retry);
        }
        let Some(fits) = admitted? else {
            return Ok(Decision::Wait {
                pool: view.pool.name,
            });
        };
        // Owned here: the features borrow it while `view` moves into the accounting.
        let served = view.served_model.clone();
        let model = served.as_deref().unwrap_or(req.model.as_ref());
        let features = features(&view, &mut cands, req, model, ctx);
        let ranked = self.rank(&view, &cands, &features, fits.as_deref())?;
        Ok(Decision::Routed(account(
            store,
            view,
            &cands,
            &features,
            &ranked,
            self.config.top_k,
        )))
    }

    /// Stage 2: the pool's state as of the snapshot and the live load table, or the fallback
    /// decision (no snapshot, pool not listed, stale snapshot per `on_stale`).
    fn pool_view<'f, S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&'f Fleet>,
        target: Resolved,
        ctx: Context,
    ) -> Result<Viewed<'f>, Rejection> {
        let Resolved {
            pool,
            rewrite,
            adapter,
            served_model,
        } = target;
        let fallback = |why: &str, reject: bool| -> Result<Viewed<'f>, Rejection> {
            if reject {
                return Err(Rejection::no_endpoints(&pool.name, why));
            }
            Ok(Viewed::Fallback(Box::new(Routed {
                pool: pool.name.clone(),
                cluster: pool.cluster.clone(),
                endpoints: Vec::new(),
                rewrite: rewrite.clone(),
                served_model: served_model.clone(),
                mode: RouteMode::Fallback,
                scores: Vec::new(),
                prefix_hit: false,
                lora_hit: false,
                inflight_pod: None,
                pending_tokens: 0,
                work_tokens: 0.0,
                adapter: None,
            })))
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
        // Read once: ranks the pods and, with its CAS token, is the base of the write in
        // [`account`].
        let (live, live_cas) = inflight::read_for_update(store, &pool.name);
        Ok(Viewed::Ready(PoolView {
            pool,
            rewrite,
            adapter,
            served_model,
            sp,
            baseline: fleet.baselines.get(pool_index),
            derived: fleet.pools.get(pool_index),
            mode,
            live,
            live_cas,
        }))
    }

    /// Stage 6: scores and ranks the candidates; with `fits` (some pods would pass their KV
    /// bound), the first pick is the best-ranked pod that fits, the others stay behind it as
    /// fallbacks in rank order (a retry to a full pod beats none).
    fn rank(
        &self,
        view: &PoolView<'_>,
        c: &Candidates<'_>,
        features: &Features<'_>,
        fits: Option<&[bool]>,
    ) -> Result<Vec<score::Scored>, Rejection> {
        // Every candidate is kept ranked when its score is shown, or when those that fit are
        // to be put first.
        let keep = if self.config.debug_scores || fits.is_some() {
            c.cands.len()
        } else {
            self.config.top_k
        };
        let scope = Scope {
            positions: &c.positions,
            pool_pods: c.pool_pods,
            unscored: c.unscored.as_ref(),
        };
        let ranked = score::rank_in(
            &view.pool,
            &c.cands,
            features,
            view.mode,
            keep,
            (self.config.retry_after_s, self.config.retry_after_max_s),
            &scope,
        )?;
        let Some(fits) = fits else {
            return Ok(ranked);
        };
        let fit = |s: &score::Scored| fits.get(s.index).copied().unwrap_or(false);
        let (mut first, rest): (Vec<_>, Vec<_>) = ranked.into_iter().partition(fit);
        first.extend(rest);
        Ok(first)
    }

    /// The first response byte of a request routed to `pod` arrived after `ttft_ms`: its
    /// `pending` tokens are no longer queued there, and, when the timing reflects prefill (a
    /// streamed response, an embedding), `observed = Some((work_tokens, ttft_ms))` teaches the
    /// pod's rate.
    pub fn first_byte(
        &self,
        store: &impl SharedStore,
        pool: &str,
        pod: &str,
        pending: u32,
        observed: Option<(f64, f64)>,
    ) -> bool {
        inflight::first_byte(store, pool, pod, pending, observed)
    }

    /// The stream of a routed request ended: its pod has one request less in flight, and the
    /// `pending` tokens it still had (no first byte came) are released. False when the update
    /// did not land (the caller owes it: [`inflight::Ledger`]).
    pub fn finished(&self, store: &impl SharedStore, pool: &str, pod: &str, pending: u32) -> bool {
        inflight::finished(store, pool, pod, pending)
    }

    /// [`Router::finished`], with how the pod answered: a run of server errors puts the pod
    /// behind the others for a while, an answer's life teaches the pod's request life
    /// ([`inflight::finished_with`]).
    pub fn finished_with_status(
        &self,
        store: &impl SharedStore,
        pool: &str,
        pod: &str,
        pending: u32,
        answer: Answer,
    ) -> bool {
        let end = inflight::Ending {
            outcome: inflight::Outcome::of_status(answer.status),
            now_ms: answer.now_ms,
            life_ms: answer.life_ms,
        };
        inflight::finished_with(store, pool, pod, pending, end)
    }

    /// A request for LoRA adapter `adapter` that was counted on `pod` has ended
    /// ([`Routed::adapter`]).
    pub fn adapter_ended(&self, store: &impl SharedStore, pool: &str, pod: &str, adapter: &str) {
        lora::ended(store, pool, pod, adapter);
    }

    /// The request was served by `served` although `chosen` was counted (an Envoy retry went to
    /// a fallback endpoint): move the in-flight count and the pending work.
    pub fn moved(
        &self,
        store: &impl SharedStore,
        pool: &str,
        chosen: &str,
        served: &str,
        pending: u32,
    ) -> bool {
        chosen == served || inflight::moved(store, pool, chosen, served, pending)
    }
}

/// How a routed request's answer ended, for [`Router::finished_with_status`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Answer {
    /// The status the pod answered (0 = none reached the filter).
    pub status: u16,
    /// Host time (ms) of the end: needed only for a server error (an error run's window).
    pub now_ms: u64,
    /// Time from routing to the end (ms), when it is known.
    pub life_ms: Option<f64>,
}

impl Answer {
    /// An answer with `status` at `now_ms`, its life unknown.
    pub fn status(status: u16, now_ms: u64) -> Answer {
        Answer {
            status,
            now_ms,
            life_ms: None,
        }
    }
}

/// Whether a request may be held in the proxy ([`crate::flow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Route at once (flow control off): placed or refused, never held.
    Never,
    /// Hold it if no pod of its pool can take it now.
    IfFull,
    /// Work of its band or above already waits for the pool: it queues behind that work
    /// unless the pool would shed it.
    Behind,
}

/// What the decision came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Routed(Routed),
    /// No pod of pool `pool` can take the request now: hold it and ask again later.
    Wait {
        pool: String,
    },
}

/// The pool as one decision sees it.
struct PoolView<'f> {
    pool: PoolConfig,
    rewrite: Option<String>,
    adapter: bool,
    /// The served name a rewrite rule chose: its own prefix cache, its own adapter home.
    served_model: Option<String>,
    sp: &'f llm_router_snapshot::Pool,
    /// In-flight counts when the snapshot was accepted.
    baseline: Option<&'f Table>,
    derived: Option<&'f PoolIndex>,
    mode: Mode,
    live: Table,
    live_cas: Option<u32>,
}

impl PoolView<'_> {
    /// The model name the request is served as (a rewrite rule's target, else its own).
    fn model<'a>(&'a self, req: &'a ParsedRequest<'_>) -> &'a str {
        self.served_model.as_deref().unwrap_or(req.model.as_ref())
    }
}

#[allow(clippy::large_enum_variant)] // one per decision, on the stack
enum Viewed<'f> {
    Ready(PoolView<'f>),
    Fallback(Box<Routed>),
}

/// The pods a request may go to, with what the later stages need of the prefix index.
struct Candidates<'f> {
    cands: Vec<Candidate<'f>>,
    /// Prefix-index id per candidate.
    ids: Vec<u32>,
    /// KV capacity per candidate, for admission.
    rooms: Vec<PodRoom>,
    hashes: prefix::Hashes,
    found: prefix::PrefixMatch,
    /// `(candidate, its own prefix record)` for candidates credited by [`features`].
    credited: Vec<(usize, u32)>,
    /// The prompt's anchor `(key, depth)`, for a long context: when it goes to a pod that
    /// holds less of it than the anchor depth (a new copy: no record of this replica's and
    /// no other replica's note puts it there), [`account`] shares where it went
    /// ([`crate::placed::note_placed`]).
    anchor: Option<(u64, usize)>,
    /// Candidates other replicas' notes put the anchor on (not a new copy there).
    peer_placed: Vec<usize>,
    /// Each candidate's position among the pool's candidates when they are a large pool's
    /// shortlist (ascending); empty when they are the whole pool.
    positions: Vec<u32>,
    /// Candidates in the whole pool.
    pool_pods: usize,
    /// A shortlist's homes: `(key, position)`.
    homes: Option<Vec<(u64, Option<u32>)>>,
    /// What the ranking needs of the pods a shortlist left out.
    unscored: Option<Unscored<'f>>,
    /// A large pool's index for the generation, when its candidates are the whole pool (its
    /// positions are then the candidates' indices): the homes without a rendezvous built per
    /// decision.
    index: Option<&'f Shortlist>,
}

impl Candidates<'_> {
    /// The candidate every gateway replica takes as the home of `key`: the rendezvous choice
    /// among the pool's candidates ([`prior::rendezvous`]; over the addresses' hashes in a
    /// large pool, [`prior::Rendezvous`]).
    fn home(&self, key: u64) -> Option<usize> {
        if let Some(homes) = &self.homes {
            let (_, at) = homes.iter().find(|(k, _)| *k == key)?;
            return self.positions.binary_search(&(*at)?).ok();
        }
        if self.cands.len() > score::LARGE_POOL {
            if let Some(sl) = self.index.filter(|sl| sl.len() == self.cands.len()) {
                return sl.home(key).map(|at| at as usize);
            }
            let hashes = self.cands.iter().map(|c| prior::address_hash(c.address));
            return prior::Rendezvous::new(hashes).home(key);
        }
        prior::rendezvous(self.cands.iter().map(|c| c.address), key)
    }
}

/// The anchor of a long context ([`prior::anchor_depth`]): its chained block hash and depth.
/// Other replicas may have put the context somewhere when this replica knows less of the prompt
/// than the depth (`.filter(|&(_, depth)| known < depth)` at the callers).
fn anchor(pool: &PoolConfig, hashes: &prefix::Hashes, prompt_chars: usize) -> Option<(u64, usize)> {
    let n = hashes.blocks.len();
    let prompt_blocks = prompt_chars / pool.prefix.block_chars.max(1);
    let depth = prior::anchor_depth(n, prompt_blocks, pool.prefix.page_blocks)?;
    let key = hashes.blocks.get(depth.checked_sub(1)?).copied()?;
    Some((key, depth))
}

/// The contexts other gateway replicas placed under `key` ([`crate::placed::note_placed`]).
fn peer_placed(d: &PoolIndex, key: u64) -> impl Iterator<Item = &PeerContext> {
    let from = d.peer_contexts.partition_point(|p| p.key < key);
    d.peer_contexts
        .get(from..)
        .unwrap_or_default()
        .iter()
        .take_while(move |p| p.key == key)
}

/// Stage 3: every pod that is not failing, with its gauges, this proxy's load, its learned
/// rate, the prompt's cached prefix there and the adapter's placement; pods with an error run
/// put behind (at most half), contradicted pods' gauges replaced ([`trust::distrust`]).
fn candidates<'f, S: SharedStore>(
    store: &S,
    view: &PoolView<'f>,
    req: &ParsedRequest<'_>,
    ctx: Context,
    shortlist: Option<usize>,
) -> Result<Candidates<'f>, Rejection> {
    let (pool, sp, live) = (&view.pool, view.sp, &view.live);
    let model = view.model(req);
    let empty = Table::default();
    let baseline = view.baseline.unwrap_or(&empty);
    let pod_id = |i: usize| {
        view.derived
            .and_then(|d| d.pod_ids.get(i).copied())
            .unwrap_or(0)
    };
    let hashes = prefix::block_hashes(
        model,
        &req.pieces,
        pool.prefix.block_chars,
        pool.prefix.max_blocks,
        req.key_pieces,
    );
    let index = PrefixIndex::new(
        store,
        &pool.name,
        pool.prefix.index_slots,
        pool.prefix.page_blocks,
        pool.prefix.entries_per_page,
    );
    let found = index.lookup(&hashes.blocks);
    let predict = pool.predict;
    let prior = Rate {
        cost_ms_per_token: predict.prior_ms_per_token,
        base_ms: predict.prior_base_ms,
    };
    let large = view
        .derived
        .and_then(|d| d.shortlist.as_ref())
        .filter(|_| view.mode == Mode::Full && !view.adapter);
    if let (Some(sl), Some(top_k)) = (large, shortlist) {
        if let Some(s) = shortlisted(view, sl, &hashes, &found, req, ctx, prior, top_k) {
            return Ok(Candidates {
                cands: s.cands,
                ids: s.ids,
                rooms: s.rooms,
                hashes,
                found,
                credited: Vec::new(),
                anchor: None,
                peer_placed: Vec::new(),
                positions: s.positions,
                pool_pods: sl.len(),
                homes: Some(s.homes),
                unscored: Some(s.unscored),
                index: None,
            });
        }
    }
    let addrs = || sp.pods.iter().map(|p| p.address.as_str());
    let loads = live.get_all(addrs());
    let baselines = baseline.get_all(addrs());
    // Each pod's fit is solved once per decision; no pod is believed much faster than the
    // pool's median pod (`trust::cost_floor`: a pod answering before it did the work).
    let rates: Vec<Option<Rate>> = loads.iter().map(|l| l.fit.rate()).collect();
    let pool_rate = predict::pool_rate(rates.iter().flatten().copied(), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let rates: Vec<Option<Rate>> = rates
        .into_iter()
        .map(|r| {
            r.map(|r| Rate {
                cost_ms_per_token: r.cost_ms_per_token.max(floor),
                ..r
            })
        })
        .collect();

    let adapter_name = view.adapter.then_some(model);
    let recent = match adapter_name {
        Some(_) => lora::read(store, &pool.name),
        None => lora::Recent::default(),
    };
    let home_of_adapter = adapter_name.and_then(|a| {
        view.derived
            .and_then(|d| d.homes.get(a).copied())
            .or_else(|| {
                let addrs: Vec<&str> = sp.pods.iter().map(|p| p.address.as_str()).collect();
                lora::rendezvous_home(a, &addrs)
            })
    });

    // The pool's mean request life, for a pod that has answered nothing yet (adapter requests
    // only: nothing else prices a slot wait).
    let pool_life_ms = match adapter_name {
        None => 0.0,
        Some(_) => {
            let (sum, n) = loads
                .iter()
                .filter(|l| l.life_ms > 0.0)
                .fold((0.0, 0u32), |(s, n), l| (s + f64::from(l.life_ms), n + 1));
            if n == 0 {
                0.0
            } else {
                sum / f64::from(n)
            }
        }
    };
    let full = view.mode == Mode::Full;
    let mut ids = Vec::with_capacity(sp.pods.len());
    let mut rooms = Vec::with_capacity(sp.pods.len());
    let mut cands: Vec<Candidate<'f>> = Vec::with_capacity(sp.pods.len());
    for (i, ((p, l), (b, r))) in sp
        .pods
        .iter()
        .zip(&loads)
        .zip(baselines.iter().zip(&rates))
        .enumerate()
    {
        if p.health == Health::Failing {
            continue;
        }
        let id = pod_id(i);
        ids.push(id);
        rooms.push(PodRoom {
            kv_capacity_tokens: u64::from(p.block_size) * u64::from(p.num_blocks),
            adapter_slots: p.lora.as_ref().is_some_and(|l| l.max_loras > 0),
        });
        let placement = match adapter_name {
            Some(a) => lora::placement(
                a,
                p.lora.as_ref(),
                recent.of(&p.address),
                home_of_adapter == Some(i),
                l.in_flight,
            ),
            None => Placement::default(),
        };
        let adapter_ms = match adapter_name {
            None => 0.0,
            Some(_) => {
                let load = if placement.resident {
                    0.0
                } else {
                    pool.lora.load_ms
                };
                let stray = if placement.home {
                    0.0
                } else {
                    pool.lora.stray_ms
                };
                // A blocked pod frees a slot when one batch adapter's requests there have all
                // ended while its new ones keep joining ahead: sooner for an adapter with few
                // requests there than for one that keeps its slot busy
                // ([`lora::drain_lives`]); then one request life more for each adapter already
                // waiting for a slot (the engine gives freed slots first come first served).
                let slot_wait = if placement.blocked {
                    let life = if l.life_ms > 0.0 {
                        f64::from(l.life_ms)
                    } else {
                        pool_life_ms
                    };
                    life * (lora::drain_lives(placement.drain) + f64::from(placement.slot_queue))
                } else {
                    0.0
                };
                load + stray + slot_wait
            }
        };
        cands.push(Candidate {
            address: &p.address,
            stale: p.health == Health::Stale,
            waiting: if full { p.waiting } else { 0 },
            running: if full { p.running } else { 0 },
            kv_usage: if full { p.kv_usage } else { None },
            in_flight: l.in_flight,
            in_flight_baseline: if full { b.in_flight } else { 0 },
            pending_tokens: l.pending_tokens,
            peer_in_flight: if full { p.peers.in_flight } else { 0 },
            peer_pending_tokens: if full { p.peers.pending_tokens } else { 0 },
            rate: r.unwrap_or(pool_rate),
            prefix_blocks: found.blocks_for(id),
            lora: placement,
            adapter_ms,
            contradicted: false,
            ejected: l.ejected(ctx.now_ms),
        });
    }
    // Pods answering server errors go behind the others, at most half of the pool (the
    // longest error runs first), as Envoy's outlier detection bounds its ejections.
    let ejected = cands.iter().filter(|c| c.ejected).count();
    if ejected > cands.len() / 2 {
        let mut runs: Vec<(u16, usize)> = cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.ejected)
            .map(|(i, c)| (live.get(c.address).errors, i))
            .collect();
        runs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in runs.iter().skip(cands.len() / 2) {
            if let Some(c) = cands.get_mut(i) {
                c.ejected = false;
            }
        }
    }
    if full {
        trust::distrust(&mut cands);
    }
    if cands.is_empty() {
        let why = if sp.pods.is_empty() {
            "the pool has no pods"
        } else {
            "every pod is failing its metrics scrapes"
        };
        return Err(Rejection::no_endpoints(&pool.name, why));
    }
    let pool_pods = cands.len();
    Ok(Candidates {
        cands,
        ids,
        rooms,
        hashes,
        found,
        credited: Vec::new(),
        anchor: None,
        peer_placed: Vec::new(),
        positions: Vec::new(),
        pool_pods,
        homes: None,
        unscored: None,
        index: view.derived.and_then(|d| d.shortlist.as_ref()),
    })
}

/// Decisions made over a shortlist (tests check that they were).
#[cfg(test)]
static SHORTLISTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Shortlists flow control's admission set aside for the whole pool.
#[cfg(test)]
static REJUDGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Stage 3 over a large pool's shortlist ([`crate::shortlist`]).
struct Shortlisted<'f> {
    cands: Vec<Candidate<'f>>,
    ids: Vec<u32>,
    rooms: Vec<PodRoom>,
    positions: Vec<u32>,
    homes: Vec<(u64, Option<u32>)>,
    unscored: Unscored<'f>,
}

/// The candidates of a large pool's shortlist for a request in a fresh snapshot that names no
/// adapter: each built as [`candidates`] builds it over the whole pool (the gauges already
/// distrusted once for the generation, [`Shortlist::new`]). `None` when the shortlist cannot
/// be sure of the best pods ([`Shortlist::plan`]); the whole pool is scored then.
#[allow(clippy::too_many_arguments)]
fn shortlisted<'f>(
    view: &PoolView<'f>,
    sl: &'f Shortlist,
    hashes: &prefix::Hashes,
    found: &prefix::PrefixMatch,
    req: &ParsedRequest<'_>,
    ctx: Context,
    prior: Rate,
    top_k: usize,
) -> Option<Shortlisted<'f>> {
    let (pool, sp, live) = (&view.pool, view.sp, &view.live);
    let saturations = sl.saturations(pool)?;
    // This proxy's entries for the pool's pods by snapshot index (the last of an address that
    // repeats, as [`Table::get_all`] reads it).
    let mut loads: Vec<(usize, PodLoad)> = live
        .entries
        .iter()
        .rev()
        .filter_map(|(a, l)| Some((sl.index_of(a)?, *l)))
        .collect();
    loads.sort_by_key(|&(i, _)| i);
    loads.dedup_by_key(|&mut (i, _)| i);
    let load_of = |i: usize| {
        loads
            .binary_search_by_key(&i, |&(j, _)| j)
            .ok()
            .and_then(|k| loads.get(k))
            .map_or_else(PodLoad::default, |&(_, l)| l)
    };
    let pool_rate = predict::pool_rate(loads.iter().filter_map(|(_, l)| l.fit.rate()), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let holders: Vec<(u32, u32)> = found
        .per_pod
        .iter()
        .filter_map(|&(id, blocks)| Some((sl.position_of_id(id)?, blocks)))
        .collect();
    let known = holders.iter().map(|&(_, b)| b).max().unwrap_or(0);
    let share = view.derived.map_or(1.0, |d| d.own_share);
    let mut keys = vec![hashes.key];
    let n = hashes.blocks.len();
    let anchored =
        anchor(pool, hashes, req.prompt_chars()).filter(|&(_, depth)| (known as usize) < depth);
    keys.extend(
        anchored
            .filter(|_| prior::credit(n, known, share).is_some())
            .map(|(k, _)| k),
    );
    // The pods other replicas placed the context on are scored too.
    let placed: Vec<u32> = anchored
        .zip(view.derived)
        .map(|((key, _), d)| {
            peer_placed(d, key)
                .filter_map(|p| sl.position_of_id(p.pod))
                .collect()
        })
        .unwrap_or_default();
    let touched = loads
        .iter()
        .filter_map(|&(i, _)| sl.position_of(i))
        .chain(holders.iter().map(|&(at, _)| at))
        .chain(placed);
    let plan = sl.plan(touched, &keys, top_k, ctx.tie)?;
    let blocks_of = |at: u32| {
        holders
            .iter()
            .find(|&&(h, _)| h == at)
            .map_or(0, |&(_, b)| b)
    };
    let n = plan.positions.len();
    let (mut cands, mut ids, mut rooms) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut scored = Vec::new();
    for &at in &plan.positions {
        let i = *sl.pods.get(at as usize)? as usize;
        let (p, g) = (sp.pods.get(i)?, sl.gauges.get(at as usize)?);
        let l = load_of(i);
        let rate = l.fit.rate().map_or(pool_rate, |r| Rate {
            cost_ms_per_token: r.cost_ms_per_token.max(floor),
            ..r
        });
        scored.extend(sl.saturation_of(pool, at));
        ids.push(
            view.derived
                .and_then(|d| d.pod_ids.get(i).copied())
                .unwrap_or(0),
        );
        rooms.push(PodRoom {
            kv_capacity_tokens: u64::from(p.block_size) * u64::from(p.num_blocks),
            adapter_slots: p.lora.as_ref().is_some_and(|l| l.max_loras > 0),
        });
        cands.push(Candidate {
            address: &p.address,
            stale: g.stale,
            waiting: g.waiting,
            running: g.running,
            kv_usage: g.kv_usage,
            in_flight: l.in_flight,
            in_flight_baseline: g.baseline,
            pending_tokens: l.pending_tokens,
            // The shortlist serves fresh snapshots only (a stale one is scored whole).
            peer_in_flight: p.peers.in_flight,
            peer_pending_tokens: p.peers.pending_tokens,
            rate,
            prefix_blocks: blocks_of(at),
            lora: Placement::default(),
            adapter_ms: 0.0,
            contradicted: g.contradicted,
            ejected: l.ejected(ctx.now_ms),
        });
    }
    // As over the whole pool: at most half of it is put behind for its errors.
    let half = sl.len() / 2;
    if cands.iter().filter(|c| c.ejected).count() > half {
        let mut runs: Vec<(u16, usize)> = cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.ejected)
            .map(|(i, c)| (live.get(c.address).errors, i))
            .collect();
        runs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in runs.iter().skip(half) {
            if let Some(c) = cands.get_mut(i) {
                c.ejected = false;
            }
        }
    }
    #[cfg(test)]
    SHORTLISTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let unscored = Unscored {
        pods: saturations.len().saturating_sub(scored.len()),
        rate: pool_rate,
        saturations,
        scored,
    };
    Some(Shortlisted {
        cands,
        ids,
        rooms,
        positions: plan.positions,
        homes: plan.homes,
        unscored,
    })
}

/// The request's size as admission and scoring see it, before any prefix credit.
fn base_features<'r>(
    view: &PoolView<'_>,
    req: &ParsedRequest<'_>,
    model: &'r str,
    ctx: Context,
) -> Features<'r> {
    let pool = &view.pool;
    let chars_per_token = pool.predict.chars_per_token.max(0.1);
    let prompt_tokens = (req.prompt_chars() as f64 / chars_per_token).ceil();
    Features {
        adapter: view.adapter.then_some(model),
        prompt_tokens: prompt_tokens.min(f64::from(u32::MAX)) as u32,
        prompt_blocks: 0,
        truncated: false,
        tokens_per_block: pool.prefix.block_chars as f64 / chars_per_token,
        // Until the pool's mean is known, a waiting request is assumed as big as this one.
        mean_prefill_tokens: if view.live.mean_prefill_tokens > 0.0 {
            f64::from(view.live.mean_prefill_tokens)
        } else {
            prompt_tokens
        },
        home: None,
        priority: ctx.priority,
        tie: ctx.tie,
    }
}

/// Stage 4: admit or wait ([`flow::admit`]): `Ok(None)` when the request waits; else
/// `Ok(Some(None))` when any pod may be picked, `Ok(Some(Some(fits)))` when only the pods
/// marked keep their KV bound. A request the ranking would shed (sheddable in a saturated pool,
/// standard far past it) is refused instead. A pod past the *queue* bound may still be picked
/// when some pod has room: a busy pod holding the prompt's prefix may still answer first, and
/// the ranking weighs that (restricting the pick to pods with room sent shared-prefix requests
/// to cold pods: TTFT p95 591 against 160 ms, results/flow-v1-bursty.md). A pod past the *KV*
/// bound may not: the engine would preempt what runs there.
#[allow(clippy::type_complexity)]
fn admit_or_wait(
    view: &PoolView<'_>,
    c: &Candidates<'_>,
    req: &ParsedRequest<'_>,
    ctx: Context,
    hold: Hold,
    kv_threshold: f64,
    retry_after: (u32, u32),
) -> Result<Option<Option<Vec<bool>>>, Rejection> {
    if hold == Hold::Never {
        return Ok(Some(None));
    }
    let f = base_features(view, req, view.model(req), ctx);
    let budget_ms = ctx.deadline_ms.map(|d| d.saturating_sub(ctx.now_ms) as f64);
    let admission = match hold {
        Hold::Behind => Admission::Wait,
        _ => flow::admit(
            &view.pool,
            kv_threshold,
            &c.cands,
            &c.rooms,
            &f,
            view.mode,
            budget_ms,
        ),
    };
    match admission {
        Admission::Admit(fits) if fits.iter().all(|&f| f) => Ok(Some(None)),
        Admission::Admit(fits) => Ok(Some(Some(fits))),
        Admission::Late => Err(Rejection::not_queued(
            &view.pool.name,
            flow::Refusal::Late.reason(),
            retry_after.0,
        )),
        Admission::Wait => {
            // Ranking with every pod judges saturation exactly as without flow control: a
            // saturated pool refuses a sheddable request now, and a pool `critical_factor`
            // times past saturation a standard one, rather than hold what would time out.
            score::rank(&view.pool, &c.cands, &f, view.mode, 1, retry_after)?;
            Ok(None)
        }
    }
}

/// Stage 5: the request's features, with the pods other gateway replicas probably warmed for
/// it credited ([`prior`]). A prompt deeper than anything this replica knows may be on the pod
/// where other replicas put it: credit that pod with the blocks it would save, weighed by the
/// other replicas' share of the pool's traffic. Two places are expected: a long context's
/// anchor home, and a conversation's home (its key's) for the history its earlier turns left.
/// The pods' own records are kept for the work accounting ([`Candidates::credited`]).
fn features<'r>(
    view: &PoolView<'_>,
    c: &mut Candidates<'_>,
    req: &ParsedRequest<'_>,
    model: &'r str,
    ctx: Context,
) -> Features<'r> {
    let pool = &view.pool;
    let full = view.mode == Mode::Full;
    let key_home = c.home(c.hashes.key);
    let prompt_chars = req.prompt_chars();
    if full {
        let known = c.cands.iter().map(|c| c.prefix_blocks).max().unwrap_or(0);
        let block_chars = pool.prefix.block_chars.max(1);
        let share = view.derived.map_or(1.0, |d| d.own_share);
        let n = c.hashes.blocks.len();
        c.anchor = anchor(pool, &c.hashes, prompt_chars);
        let anchored = c.anchor.filter(|&(_, depth)| (known as usize) < depth);
        // Where other replicas placed the context, when their rings say: a fact, in full.
        let placed: Vec<(usize, u32)> = anchored
            .zip(view.derived)
            .map(|((key, _), d)| {
                let ids = &c.ids;
                peer_placed(d, key)
                    .filter_map(|p| {
                        let at = ids.iter().position(|&id| id == p.pod)?;
                        Some((at, p.blocks.min(n as u32)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        c.peer_placed = placed.iter().map(|&(at, _)| at).collect();
        // Otherwise where they probably put it: its home, believed by their share.
        let context = anchored.filter(|_| placed.is_empty()).and_then(|(key, _)| {
            let credit = prior::credit(n, known, share)?;
            Some((c.home(key)?, credit))
        });
        let conversation = req.history_bytes().and_then(|bytes| {
            let credit = prior::credit((bytes / block_chars).min(n), known, share)?;
            Some((key_home?, credit))
        });
        for (home, credit) in placed.into_iter().chain(context).chain(conversation) {
            if let Some(cand) = c.cands.get_mut(home) {
                if !c.credited.iter().any(|&(j, _)| j == home) {
                    c.credited.push((home, cand.prefix_blocks));
                }
                cand.prefix_blocks = cand.prefix_blocks.max(credit);
            }
        }
    }
    Features {
        prompt_blocks: c.hashes.blocks.len() as u32,
        truncated: prompt_chars / pool.prefix.block_chars.max(1) > c.hashes.blocks.len(),
        home: key_home,
        ..base_features(view, req, model, ctx)
    }
}

/// Stage 7: the decision, accounted: the chosen pod's in-flight count and pending work go up
/// in the shared load table, the prompt's blocks are recorded for it in the prefix index, an
/// adapter is noted as used there.
fn account<S: SharedStore>(
    store: &S,
    view: PoolView<'_>,
    c: &Candidates<'_>,
    features: &Features<'_>,
    ranked: &[score::Scored],
    top_k: usize,
) -> Routed {
    let pool = &view.pool;
    let endpoints: Vec<String> = ranked
        .iter()
        .take(top_k)
        .filter_map(|s| c.cands.get(s.index))
        .map(|c| c.address.to_string())
        .collect();
    let scores = ranked
        .iter()
        .filter_map(|s| {
            c.cands
                .get(s.index)
                .map(|c| (c.address.to_string(), s.score))
        })
        .collect();
    let best = ranked.first().map(|s| s.index);
    let chosen = best.and_then(|i| c.cands.get(i).map(|c| (i, c)));
    let recorded = |i: usize, cand: &Candidate<'_>| {
        c.credited
            .iter()
            .find(|&&(j, _)| j == i)
            .map_or(cand.prefix_blocks, |&(_, blocks)| blocks)
    };
    let (mut pending_tokens, mut work_tokens) = (0, 0.0);
    let (mut prefix_hit, mut lora_hit) = (false, false);
    if let Some((i, cand)) = chosen {
        let known = recorded(i, cand);
        prefix_hit = known > 0;
        lora_hit = features.adapter.is_some() && (cand.lora.resident || cand.lora.home);
        let uncached = features.uncached_tokens(known);
        pending_tokens = uncached.min(f64::from(u32::MAX)) as u32;
        // When the pod was credited with a guess of what it holds, its timing says nothing
        // sure about its rate: no observation (NaN is ignored by the fit).
        work_tokens = if known < cand.prefix_blocks {
            f64::NAN
        } else {
            cand.queued_tokens(features, view.mode) + uncached
        };
        let index = PrefixIndex::new(
            store,
            &pool.name,
            pool.prefix.index_slots,
            pool.prefix.page_blocks,
            pool.prefix.entries_per_page,
        );
        let id = c.ids.get(i).copied().unwrap_or(0);
        index.record(&c.hashes.blocks, id, &c.found);
        // A new copy of a long context (the pod held less of it than the anchor, by this
        // replica's records and the others' notes), made while other replicas are at work in
        // the pool: tell them where it went (through the tally), so they need not guess — the
        // first copy, and every later one (a busy holder avoided), which the others would
        // otherwise not know of and copy again.
        if let Some((key, depth)) = c.anchor {
            if view.derived.is_some_and(|d| d.peers)
                && (known as usize) < depth
                && !c.peer_placed.contains(&i)
            {
                let blocks = c.hashes.blocks.len() as u32;
                crate::placed::note_placed(
                    store,
                    &pool.name,
                    PeerContext {
                        key,
                        pod: id,
                        blocks,
                    },
                );
            }
        }
        inflight::routed_after_read(
            store,
            &pool.name,
            // Without a CAS token (no table yet) a blind write could overwrite another
            // worker's first entry: read again instead.
            view.live_cas.map(|cas| (view.live, Some(cas))),
            cand.address,
            pending_tokens,
        );
        if let Some(a) = features.adapter {
            lora::note(store, &pool.name, cand.address, a, cand.in_flight == 0);
        }
    }
    Routed {
        pool: pool.name.clone(),
        cluster: pool.cluster.clone(),
        endpoints,
        rewrite: view.rewrite.clone(),
        served_model: view.served_model.clone(),
        mode: if view.mode == Mode::Full {
            RouteMode::Scored
        } else {
            RouteMode::LeastInflight
        },
        scores,
        prefix_hit,
        lora_hit,
        inflight_pod: chosen.map(|(_, c)| c.address.to_string()),
        pending_tokens,
        work_tokens,
        adapter: chosen.and(features.adapter).map(str::to_string),
    }
}

#[cfg(test)]
mod large;
#[cfg(test)]
mod lying;
#[cfg(test)]
mod tests;
