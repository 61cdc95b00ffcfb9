//! The running sidecar: scrape rounds, snapshot assembly, change-only pushes, and its own face.
//!
//! One task owns all pod state. Every interval (jittered) it starts a scrape for each pod that is
//! not still busy from an earlier round, up to the concurrency bound; the round ends when those
//! scrapes are all back or when the next round is due (a hanging pod never holds the fleet's
//! view back: it turns `stale`, then `failing` when its timeout fires). At the end of a round the
//! snapshot is built and pushed if it differs from the last accepted one, if the heartbeat is due,
//! or if the last push failed. Each push's generation is one past the last one and never behind
//! the Unix clock in ms ([`next_generation`]), so a restarted sidecar is always newer than its
//! previous life and no generation runs ahead of the clock; a 409 naming a newer generation is
//! jumped past unless that generation is from the future ([`after_conflict`]). Before a push the
//! snapshot is trimmed to its byte budgets (`crate::budget`).
//!
//! Where things are: this file holds the pools' pods and the loop's state (`Loop`: what a
//! round's end, a push's answer or a hub snapshot does to it); `sidecar/start.rs` starts it all
//! ([`start`]), `sidecar/run_loop.rs` is the loop's `select!`, and `sidecar/follow.rs` decides
//! which hub a sidecar following hubs listens to.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use llm_router_snapshot::{Engine, Health, Pod, Pool, Snapshot};
use rand::Rng;
use tokio::sync::watch;

use crate::budget::{self, Budget, Trim};
use crate::config::{Config, MIN_SNAPSHOT_MAX_BYTES};
use crate::endpoints::Endpoints;
use crate::engines::PodMetrics;
use crate::http1::Target;
use crate::keys::HubKeys;
use crate::push::{PushOutcome, PushResult, Pusher};
use crate::scrape::{self, PodIo, ScrapeError};
use crate::share::TallyBoard;
use crate::stats::Stats;

mod follow;
mod rewrite_sources;
mod run_loop;
mod start;

use rewrite_sources::RewriteSources;

/// The clock lives in `crate::clock` (a leaf, so no module needs the sidecar for it); named here
/// too, where callers of [`start`] have always found it.
pub use crate::clock::now_ms;
pub use follow::MAX_FRAME_AGE_MS;
pub use start::{start, Running, StartError};

/// Consecutive failures are reported up to this count; beyond it the snapshot stops changing
/// (so an outage does not turn into a push every round). The exact count is on `/metrics`.
pub const MAX_REPORTED_FAILURES: u32 = 10;

/// The generation of the next push: one past the last one used (or past the newest a 409 named)
/// and never behind the clock, `max(last + 1, now_ms)`; `None` only at the end of `u64`.
pub fn next_generation(last: u64, now_ms: u64) -> Option<u64> {
    last.checked_add(1).map(|n| n.max(now_ms))
}

/// After a 409 naming the proxy's stored generation `newer`: the new "last generation" to count
/// on from, or `None` when `newer` is more than [`llm_router_snapshot::MAX_GENERATION_LEAD_MS`]
/// ahead of our clock (a forged or corrupt generation held by the proxy: jumping past it would
/// push every later generation far into the future, up to the end of `u64`).
pub fn after_conflict(last: u64, newer: u64, now_ms: u64) -> Option<u64> {
    (newer <= now_ms.saturating_add(llm_router_snapshot::MAX_GENERATION_LEAD_MS))
        .then_some(last.max(newer))
}

/// Which budget cut the last snapshot (for logging each change once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrimState {
    Whole,
    Trimmed,
    OverBudget,
}

struct PodSlot {
    addr: SocketAddr,
    addr_str: String,
    target: Target,
    /// The plain `/metrics` target, while `target` carries the `name[]` query: used instead if
    /// the pod refuses the query.
    fallback: Option<Target>,
    in_flight: bool,
    io: Option<PodIo>,
    last: Option<PodMetrics>,
    last_ok_ms: u64,
    failures: u32,
    /// Not scraped again before this (`scrape.max_duty`).
    rest_until: Option<Instant>,
}

struct PoolRt {
    name: String,
    cluster: String,
    models: Vec<String>,
    engine: Option<Engine>,
    path: String,
    /// `path` with the `name[]` query (when `scrape.name_filter`).
    filtered_path: Option<String>,
    rx: watch::Receiver<Endpoints>,
    pods: Vec<PodSlot>,
}

fn new_slot(addr: SocketAddr, path: &str, filtered: Option<&str>) -> Option<PodSlot> {
    let plain = Target::new(addr, path)?;
    let (target, fallback) = match filtered.and_then(|f| Target::new(addr, f)) {
        Some(t) => (t, Some(plain)),
        None => (plain, None),
    };
    Some(PodSlot {
        addr,
        addr_str: addr.to_string(),
        target,
        fallback,
        in_flight: false,
        rest_until: None,
        io: Some(PodIo::default()),
        last: None,
        last_ok_ms: 0,
        failures: 0,
    })
}

impl PoolRt {
    /// Replaces the pod list by `set`, keeping the state of pods that stay.
    fn resync(&mut self, set: &[SocketAddr], stats: &Stats) {
        let max = llm_router_snapshot::MAX_PODS_PER_POOL;
        let set = match set.get(..max) {
            Some(head) if set.len() > max => {
                tracing::error!(pool = %self.name, pods = set.len(), max, "more pods than a snapshot can carry; keeping the first");
                head
            }
            _ => set,
        };
        // Keyed by address: a list searched per pod made each resync quadratic in the pool.
        let mut old: HashMap<SocketAddr, PodSlot> = std::mem::take(&mut self.pods)
            .into_iter()
            .map(|p| (p.addr, p))
            .collect();
        let before = old.len();
        for addr in set {
            match old.remove(addr) {
                Some(slot) => self.pods.push(slot),
                None => match new_slot(*addr, &self.path, self.filtered_path.as_deref()) {
                    Some(s) => self.pods.push(s),
                    None => {
                        tracing::error!(pool = %self.name, pod = %addr, path = %self.path, "cannot form a scrape URI")
                    }
                },
            }
        }
        self.pods.sort_by_key(|p| p.addr);
        if !old.is_empty() || self.pods.len() != before {
            let names: HashSet<&str> = old.values().map(|p| p.addr_str.as_str()).collect();
            tracing::info!(pool = %self.name, pods = self.pods.len(), removed = ?names, "pool membership changed");
            let pool = self.name.clone();
            stats.retain_pods(|p, pod| p != pool || !names.contains(&pod));
        }
    }
}

/// How long a pod whose scrape took `elapsed` rests before the next one
/// (`scrape.max_duty`), counted from the answer; `None` when it may be scraped next round.
fn rest(cfg: &Config, elapsed: Duration) -> Option<Duration> {
    let duty = cfg.scrape.max_duty;
    if duty <= 0.0 {
        return None;
    }
    let gap = (elapsed.as_secs_f64() / duty).min(cfg.pod_stale_after_ms as f64 / 2000.0);
    let rest = Duration::try_from_secs_f64(gap)
        .unwrap_or_default()
        .saturating_sub(elapsed);
    (rest > Duration::from_millis(cfg.scrape.interval_ms)).then_some(rest)
}

struct Done {
    pool: usize,
    addr: SocketAddr,
    round: u64,
    io: PodIo,
    result: Result<PodMetrics, ScrapeError>,
    elapsed: Duration,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where finished snapshots go.
enum Output {
    /// Mode `sidecar`: POSTed into the local proxy.
    Push(Box<Pusher>),
    /// Mode `hub`: signed into a frame for every subscriber's stream (`crate::hub`), with the
    /// replicas' tallies on the board.
    Publish {
        keys: HubKeys,
        frames: watch::Sender<Option<Bytes>>,
        board: Arc<TallyBoard>,
    },
}

struct Loop {
    cfg: Config,
    pools: Vec<PoolRt>,
    out: Output,
    stats: Arc<Stats>,
    /// The generation of the last push (or the newest a 409 named); 0 before the first.
    last_generation: u64,
    /// The budgets in force: the configured ones, `max_bytes` lowered after a 413.
    budget: Budget,
    trim_state: TrimState,
    /// A 409 named a generation from the future (logged once until a push is accepted).
    future_logged: bool,
    last_accepted: Option<Snapshot>,
    last_accepted_at: Option<Instant>,
    in_flight_snapshot: Option<Snapshot>,
    retry: bool,
    last_push_label: &'static str,
    snapshots: watch::Sender<Option<Snapshot>>,
    /// Fleet-wide index of the pod the next round starts with.
    next_pod: usize,
    /// This gateway replica's id in the tallies it shares (its own is left out of the hubs'
    /// frames it pushes).
    replica: u64,
    /// Mode hub: the last frame's trim; with `last_accepted` (its snapshot) what a frame for
    /// new tallies repeats.
    last_trim: Trim,
    /// Mode hub: when the last frame was published.
    published_at: Option<tokio::time::Instant>,
    /// Mode sidecar: the newest snapshot that came while a push was in flight (or, if it only
    /// brings other replicas' work, before `peer_push_at`), with whether it only brings that;
    /// pushed as soon as it may be, so news never waits for the next round.
    queued: Option<(Snapshot, Trim, bool)>,
    /// Following hubs: the last hub snapshot as it came (before the others' work was merged),
    /// to tell a frame with new pod states from one that only brings other replicas' work.
    last_hub_pods: Option<Snapshot>,
    /// When the last push started.
    push_started: Option<Instant>,
    /// A snapshot that only brings other replicas' work is not pushed before this: pushing
    /// takes at most 1 / (1 + [`PEER_PUSH_SPACING`]) of the proxy's time for such news.
    peer_push_at: Option<tokio::time::Instant>,
    /// The rewrite rules every snapshot carries (`crate::rewrites`); `None` without a
    /// `rewrites` section. Without one, or while its sources give no rules, snapshots carry
    /// no rewrites section and the filter uses its own.
    rewrites: Option<RewriteSources>,
    /// The `InferenceObjective` priorities every snapshot carries (`objectives.kubernetes`);
    /// `None` without an `objectives` section. Without one, or while no object names the
    /// sidecar's pools, snapshots carry no objectives section and the filter uses its own.
    objectives: Option<watch::Receiver<Option<Vec<llm_router_snapshot::Objective>>>>,
    /// The rewrite targets no pool of the last snapshot serves, as last logged
    /// ([`crate::rewrites::unknown_targets`]).
    unknown_targets: Vec<String>,
}

impl Loop {
    fn jittered(&self) -> Duration {
        let base = self.cfg.scrape.interval_ms as f64;
        let j = self.cfg.scrape.jitter;
        let f = if j > 0.0 {
            rand::rng().random_range(-j..=j)
        } else {
            0.0
        };
        Duration::from_secs_f64((base * (1.0 + f)).max(1.0) / 1000.0)
    }

    fn start_round(&mut self, round: u64, inflight: &mut FuturesUnordered<BoxFut<Done>>) -> usize {
        let timeout = Duration::from_millis(self.cfg.scrape.timeout_ms);
        let max = self.cfg.scrape.max_response_bytes;
        let cap = self.cfg.scrape.concurrency;
        for pool in &mut self.pools {
            if pool.rx.has_changed().unwrap_or(false) {
                let set = pool.rx.borrow_and_update().clone();
                pool.resync(&set, &self.stats);
            }
        }
        // Pods in one fleet-wide order, starting where the last round stopped, so that with more
        // pods than `concurrency` every pod gets its turn.
        let total: usize = self.pools.iter().map(|p| p.pods.len()).sum();
        if total == 0 {
            return 0;
        }
        let mut started = 0;
        let first = self.next_pod % total;
        for k in 0..total {
            if inflight.len() >= cap {
                break;
            }
            let mut idx = (first + k) % total;
            let Some((pi, pool)) = self.pools.iter_mut().enumerate().find(|(_, p)| {
                if idx < p.pods.len() {
                    true
                } else {
                    idx -= p.pods.len();
                    false
                }
            }) else {
                continue;
            };
            let engine = pool.engine;
            let Some(slot) = pool.pods.get_mut(idx) else {
                continue;
            };
            if slot.in_flight || slot.rest_until.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            slot.in_flight = true;
            let target = slot.target.clone();
            let addr = slot.addr;
            let mut io = slot.io.take().unwrap_or_default();
            inflight.push(Box::pin(async move {
                let t = Instant::now();
                let result = scrape::scrape(&target, &mut io, engine, timeout, max).await;
                Done {
                    pool: pi,
                    addr,
                    round,
                    io,
                    result,
                    elapsed: t.elapsed(),
                }
            }));
            started += 1;
            self.next_pod = first + k + 1;
        }
        started
    }

    fn apply(&mut self, d: Done) {
        let Some(pool) = self.pools.get_mut(d.pool) else {
            return;
        };
        let Ok(i) = pool.pods.binary_search_by_key(&d.addr, |p| p.addr) else {
            return;
        };
        let Some(slot) = pool.pods.get_mut(i) else {
            return;
        };
        slot.in_flight = false;
        slot.io = Some(d.io);
        if d.result.is_ok() {
            slot.rest_until = rest(&self.cfg, d.elapsed).map(|r| Instant::now() + r);
        }
        let err_kind = d.result.as_ref().err().map(ScrapeError::kind);
        self.stats.scrape_done(
            &pool.name,
            &slot.addr_str,
            d.elapsed.as_secs_f64(),
            err_kind,
        );
        match d.result {
            Ok(m) => {
                if slot.failures > 0 {
                    tracing::info!(pool = %pool.name, pod = %slot.addr_str, after_failures = slot.failures, "pod answers again");
                }
                if slot.last.is_none() {
                    tracing::info!(pool = %pool.name, pod = %slot.addr_str, engine = %m.engine, "first scrape");
                }
                slot.failures = 0;
                slot.last_ok_ms = now_ms();
                slot.last = Some(m);
            }
            Err(ScrapeError::Status(code @ (400 | 404 | 405 | 414 | 422)))
                if slot.fallback.is_some() =>
            {
                // A server that refuses the query string: scrape the plain path from now on.
                tracing::info!(pool = %pool.name, pod = %slot.addr_str, status = code, "pod refuses ?name[]=…; scraping the full /metrics");
                if let Some(plain) = slot.fallback.take() {
                    slot.target = plain;
                }
                slot.failures = slot.failures.saturating_add(1);
            }
            Err(e) => {
                slot.failures = slot.failures.saturating_add(1);
                if slot.failures == 1 {
                    tracing::warn!(pool = %pool.name, pod = %slot.addr_str, error = %e, "scrape failed");
                } else {
                    tracing::debug!(pool = %pool.name, pod = %slot.addr_str, error = %e, failures = slot.failures, "scrape failed again");
                }
            }
        }
    }

    fn pod_entry(&self, pool: &PoolRt, s: &PodSlot, now: u64) -> Pod {
        let (health, failures) = if s.failures > 0 {
            (
                Health::Failing,
                s.failures.min(MAX_REPORTED_FAILURES) as u16,
            )
        } else if s.last_ok_ms == 0
            || now.saturating_sub(s.last_ok_ms) > self.cfg.pod_stale_after_ms
        {
            (Health::Stale, 0)
        } else {
            (Health::Ok, 0)
        };
        let m = s.last.as_ref();
        Pod {
            address: s.addr_str.clone(),
            engine: m
                .map(|m| m.engine)
                .or(pool.engine)
                .unwrap_or(Engine::Unknown),
            health,
            failures,
            scraped_at_ms: s.last_ok_ms,
            waiting: m.map_or(0, |m| m.waiting),
            running: m.map_or(0, |m| m.running),
            kv_usage: m.and_then(|m| m.kv_usage),
            block_size: m.map_or(0, |m| m.block_size),
            num_blocks: m.map_or(0, |m| m.num_blocks),
            lora: m.and_then(|m| m.lora.clone()),
            peers: Default::default(),
        }
    }

    /// Applies the budgets; logs when what they cut changes.
    fn trim(&mut self, snap: &mut Snapshot) -> Trim {
        let t = budget::apply(snap, &self.budget);
        let state = if !t.fits(&self.budget) {
            TrimState::OverBudget
        } else if t.dropped() > 0 {
            TrimState::Trimmed
        } else {
            TrimState::Whole
        };
        if state != self.trim_state {
            let b = &self.budget;
            match state {
                TrimState::OverBudget => tracing::error!(
                    bytes_without_adapters = t.floor_bytes,
                    max_bytes = b.max_bytes,
                    pods = snap.pod_count(),
                    "the snapshot exceeds snapshot.max_bytes even without adapter names; not pushed (raise snapshot.max_bytes with the filter's snapshot.max_bytes and the internal listener's per_connection_buffer_limit_bytes)"
                ),
                TrimState::Trimmed => tracing::warn!(
                    dropped_for_pod_budget = t.by_pod.total(),
                    dropped_for_total_budget = t.by_total.total(),
                    pods_trimmed = t.pods_trimmed,
                    bytes = t.bytes,
                    max_bytes = b.max_bytes,
                    max_pod_bytes = b.max_pod_bytes,
                    "adapter names dropped from the snapshot to fit its byte budgets (waiting adapters first)"
                ),
                TrimState::Whole => {
                    tracing::info!(bytes = t.bytes, "the snapshot fits its budgets whole again")
                }
            }
            self.trim_state = state;
        }
        t
    }

    /// A 413: the proxy buffers less than our budget. Halve the budget (down to the smallest
    /// accepted) so that the next pushes fit rather than repeating the same refusal.
    fn too_large(&mut self, bytes: usize) {
        let configured = self.cfg.snapshot.max_bytes;
        let lowered = (bytes / 2)
            .max(MIN_SNAPSHOT_MAX_BYTES)
            .min(self.budget.max_bytes);
        if lowered < self.budget.max_bytes {
            self.budget.max_bytes = lowered;
            self.stats.snapshot_budget(lowered);
            tracing::error!(
                bytes,
                configured_max_bytes = configured,
                now_max_bytes = lowered,
                "the proxy refused a snapshot push of {bytes} bytes with 413: its buffer (the internal listener's per_connection_buffer_limit_bytes) is smaller than snapshot.max_bytes ({configured}); trimming snapshots to {lowered} bytes until restart. Set the listener's limit to snapshot.max_bytes"
            );
        } else {
            tracing::error!(
                bytes,
                configured_max_bytes = configured,
                now_max_bytes = self.budget.max_bytes,
                "the proxy refused a snapshot push of {bytes} bytes with 413 at the smallest budget; raise the internal listener's per_connection_buffer_limit_bytes"
            );
        }
    }

    fn build(&self, now: u64) -> Snapshot {
        let pools = self
            .pools
            .iter()
            .map(|p| Pool {
                name: p.name.clone(),
                cluster: p.cluster.clone(),
                models: p.models.clone(),
                pods: p.pods.iter().map(|s| self.pod_entry(p, s, now)).collect(),
                peer_contexts: Vec::new(),
            })
            .collect();
        Snapshot {
            rewrites: None,
            objectives: None,
            generation: 0,
            created_ms: now,
            pools,
        }
    }

    /// Puts this sidecar's rewrite rules and objectives into `snap` (over a hub's), when a
    /// source gives some, and counts the rules' targets that no pool of `snap` serves (logged
    /// when they change).
    fn set_sections(&mut self, snap: &mut Snapshot) {
        if let Some(rules) = self.rewrites.as_mut().and_then(|s| s.current()) {
            snap.rewrites = Some(rules.to_vec());
        }
        if let Some(list) = self.objectives.as_ref().and_then(|rx| rx.borrow().clone()) {
            snap.objectives = Some(list);
        }
        let unknown = crate::rewrites::unknown_targets(snap);
        if unknown != self.unknown_targets {
            if !unknown.is_empty() {
                tracing::warn!(
                    targets = ?unknown,
                    "rewrite targets that no pool serves (no pool lists them in models, no pod reports them as an adapter): the filter drops their rules unless its configuration knows the names"
                );
            }
            self.stats.rewrite_targets_unknown(unknown.len());
            self.unknown_targets = unknown;
        }
    }

    /// End of a round: build, publish health, push when needed (and none is in flight).
    fn finish_round(&mut self, push_fut: &mut Option<BoxFut<PushOutcome>>) {
        let now = now_ms();
        let mut snap = self.build(now);
        self.set_sections(&mut snap);
        let trim = self.trim(&mut snap);
        self.stats.round_done(now);
        self.deliver(snap, trim, now, false, push_fut);
    }

    /// A verified snapshot from a hub, used as this round's: the hub's pod states and
    /// `created_ms`, with this sidecar's own generation (so the proxy sees one increasing
    /// sequence whichever hub, or its own scraping, the snapshots come from), and the other
    /// replicas' work from the tallies the frame carried (never this replica's own).
    fn offer_hub(
        &mut self,
        mut snap: Snapshot,
        tallies: &[llm_router_snapshot::Tally],
        push_fut: &mut Option<BoxFut<PushOutcome>>,
    ) {
        let now = now_ms();
        self.stats.hub_frame_applied(now);
        let peer_only = self
            .last_hub_pods
            .as_ref()
            .is_some_and(|l| l.same_state(&snap));
        if !peer_only {
            self.last_hub_pods = Some(snap.clone());
        }
        self.set_sections(&mut snap);
        let oldest = llm_router_snapshot::tally::merge_peers(&mut snap, tallies, self.replica);
        self.stats
            .peer_work_age(oldest.map(|t| now.saturating_sub(t)));
        // The others' placed contexts only save cold prefills: they never cost the snapshot
        // its pods or adapters under the byte budget.
        if budget::encoded_len(&snap) > self.budget.max_bytes {
            snap.pools.iter_mut().for_each(|p| p.peer_contexts.clear());
        }
        let trim = self.trim(&mut snap);
        self.deliver(snap, trim, now, peer_only, push_fut);
    }

    /// Publishes pod health, then pushes (mode sidecar: when needed, none is in flight and, for
    /// a snapshot that only brings other replicas' work (`peer_only`), the last push has been
    /// answered long enough ago; else it waits in `queued`) or publishes to the hub's
    /// subscribers (mode hub: every round, the stream's heartbeat).
    fn deliver(
        &mut self,
        mut snap: Snapshot,
        trim: Trim,
        now: u64,
        peer_only: bool,
        push_fut: &mut Option<BoxFut<PushOutcome>>,
    ) {
        for p in &snap.pools {
            for pod in &p.pods {
                self.stats.pod_health(
                    &p.name,
                    &pod.address,
                    pod.health.name(),
                    u32::from(pod.failures),
                );
            }
        }
        if let Output::Publish { .. } = self.out {
            self.publish(snap, &trim, now);
            return;
        }
        let early = peer_only
            && self
                .peer_push_at
                .is_some_and(|t| t > tokio::time::Instant::now());
        if push_fut.is_some() || early {
            self.queued = Some((snap, trim, peer_only));
            return;
        }
        self.queued = None;
        let changed = self
            .last_accepted
            .as_ref()
            .is_none_or(|l| !l.same_state(&snap));
        let heartbeat = self
            .last_accepted_at
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(self.cfg.heartbeat_ms));
        if !(changed || heartbeat || self.retry) {
            return;
        }
        let Some(bytes) = self.stamp_and_encode(&mut snap, &trim, now, "pushed") else {
            return;
        };
        let bytes = Bytes::from(bytes);
        self.last_generation = snap.generation;
        self.stats.snapshot_trimmed(&trim);
        let Output::Push(pusher) = &self.out else {
            return;
        };
        let pusher = Pusher::clone(pusher);
        let (generation, created) = (snap.generation, snap.created_ms);
        tracing::debug!(
            generation,
            changed,
            heartbeat,
            pods = snap.pod_count(),
            "pushing snapshot"
        );
        self.in_flight_snapshot = Some(snap);
        self.push_started = Some(Instant::now());
        *push_fut = Some(Box::pin(async move {
            pusher.push(bytes, generation, created).await
        }));
    }

    /// The snapshot within its budget, given the next generation and encoded (counted), or
    /// `None` with the reason logged; `what` is "pushed" or "published". The caller records the
    /// generation once the snapshot is sent.
    fn stamp_and_encode(
        &mut self,
        snap: &mut Snapshot,
        trim: &Trim,
        now: u64,
        what: &str,
    ) -> Option<Vec<u8>> {
        if !trim.fits(&self.budget) {
            self.stats.snapshot_over_budget();
            return None;
        }
        let Some(generation) = next_generation(self.last_generation, now) else {
            tracing::error!(
                last = self.last_generation,
                "no generation left after the last one; not {what} (restart the proxy)"
            );
            return None;
        };
        snap.generation = generation;
        match snap.encode() {
            Ok(b) if b.len() <= self.budget.max_bytes => {
                self.stats.snapshot_encoded(b.len());
                Some(b)
            }
            Ok(b) => {
                tracing::error!(
                    bytes = b.len(),
                    max_bytes = self.budget.max_bytes,
                    "snapshot over its budget after trimming; not {what}"
                );
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "snapshot cannot be encoded; not {what}");
                None
            }
        }
    }

    /// Mode hub: the last round's snapshot again with the replicas' tallies as they are now
    /// (a tally changed the board), created now so subscribers take it as news.
    fn republish(&mut self) {
        let Some(snap) = self.last_accepted.clone() else {
            return;
        };
        self.stats.hub_tally_frame();
        let trim = self.last_trim;
        self.publish(snap, &trim, now_ms());
    }

    /// Mode hub: the snapshot, with the next generation, signed into a frame for every stream.
    /// Frames' `created_ms` increase strictly (subscribers refuse an older or equal one).
    fn publish(&mut self, mut snap: Snapshot, trim: &Trim, now: u64) {
        if !matches!(self.out, Output::Publish { .. }) {
            return;
        }
        let after = self.last_accepted.as_ref().map_or(0, |s| s.created_ms);
        snap.created_ms = now.max(after.saturating_add(1));
        let Some(bytes) = self.stamp_and_encode(&mut snap, trim, now, "published") else {
            return;
        };
        let Output::Publish {
            keys,
            frames,
            board,
        } = &self.out
        else {
            return;
        };
        let tallies = board.current(Instant::now());
        let tally_bytes = match llm_router_snapshot::Tally::encode_all(&tallies) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "the replicas' tallies cannot be encoded; published without them");
                llm_router_snapshot::Tally::encode_all(&[]).unwrap_or_default()
            }
        };
        self.stats.hub_replicas(tallies.len());
        let generation = snap.generation;
        self.stats.snapshot_trimmed(trim);
        match crate::hub::frame(&keys.frame, &bytes, &tally_bytes) {
            Ok(f) => {
                let _ = frames.send(Some(f));
            }
            Err(e) => {
                self.stats.hub_frame_unsent();
                tracing::error!(error = %e, "frame not published (raise no limit: lower snapshot.max_bytes)");
                return;
            }
        }
        self.last_generation = generation;
        self.stats.hub_published(generation, snap.created_ms);
        let _ = self.snapshots.send(Some(snap.clone()));
        self.last_trim = *trim;
        self.published_at = Some(tokio::time::Instant::now());
        self.last_accepted = Some(snap);
    }

    /// Mode hub: the board, when tallies are to wake the loop (`hub.tally_frame_ms` > 0).
    fn tally_board(&self) -> Option<Arc<TallyBoard>> {
        match &self.out {
            Output::Publish { board, .. } if self.cfg.hub.tally_frame_ms > 0 => Some(board.clone()),
            _ => None,
        }
    }

    /// When the snapshot waiting in `queued` may be pushed (`None`: nothing waits, or a push
    /// is in flight and its answer delivers it).
    fn queued_due(&self, pushing: bool) -> Option<tokio::time::Instant> {
        match &self.queued {
            Some((_, _, peer_only)) if !pushing => Some(
                self.peer_push_at
                    .filter(|_| *peer_only)
                    .unwrap_or_else(tokio::time::Instant::now),
            ),
            _ => None,
        }
    }

    fn push_answered(&mut self, o: PushOutcome) {
        if let Some(t) = self.push_started.take() {
            self.peer_push_at = Some(tokio::time::Instant::now() + t.elapsed() * PEER_PUSH_SPACING);
        }
        let label = o.result.label();
        let transition = label != self.last_push_label;
        self.last_push_label = label;
        match &o.result {
            PushResult::Accepted => {
                self.stats
                    .push_done(label, Some((o.generation, o.created_ms)));
                self.retry = false;
                self.future_logged = false;
                self.last_accepted_at = Some(Instant::now());
                let snap = self.in_flight_snapshot.take();
                if transition {
                    tracing::info!(generation = o.generation, answer = %o.body.trim(), "snapshot accepted by the proxy");
                } else {
                    tracing::debug!(generation = o.generation, answer = %o.body.trim(), "snapshot accepted");
                }
                let _ = self.snapshots.send(snap.clone());
                self.last_accepted = snap;
            }
            other => {
                self.stats.push_done(label, None);
                self.retry = true;
                self.in_flight_snapshot = None;
                match other {
                    PushResult::Stale { newer: Some(g) } => {
                        let now = now_ms();
                        match after_conflict(self.last_generation, *g, now) {
                            Some(last) => self.last_generation = last,
                            None if !self.future_logged => {
                                self.future_logged = true;
                                tracing::error!(
                                    stored_generation = *g,
                                    ahead_ms = g.saturating_sub(now),
                                    max_lead_ms = llm_router_snapshot::MAX_GENERATION_LEAD_MS,
                                    "the proxy holds a snapshot generation from the future (not from this sidecar's clock); not jumping past it. Restart the proxy (a filter that bounds generations refuses such pushes), or fix the clock that made it"
                                );
                            }
                            None => {}
                        }
                    }
                    PushResult::TooLarge => self.too_large(o.bytes),
                    _ => {}
                }
                if transition {
                    tracing::warn!(generation = o.generation, result = ?other, answer = %o.body.trim(), "snapshot push failed; retrying next round");
                } else {
                    tracing::debug!(generation = o.generation, result = ?other, "snapshot push failed again");
                }
            }
        }
    }
}

/// A snapshot that only brings other replicas' work waits, after a push that took `d`, until
/// `d × PEER_PUSH_SPACING` has passed since its answer: such news costs the proxy at most a
/// quarter of its time however often the hub streams it (a push's cost grows with the fleet:
/// ≈ 5 ms of Wasm at 1,024 pods), while in a small fleet (a push ≈ 1 ms) it waits a few ms.
const PEER_PUSH_SPACING: u32 = 3;

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;
    use llm_router_snapshot::MAX_GENERATION_LEAD_MS;

    #[test]
    fn a_slow_answer_buys_its_pod_a_rest_bounded_by_half_the_staleness() {
        let mut cfg = Config::embedded_default().expect("the embedded configuration parses");
        cfg.scrape.interval_ms = 50;
        cfg.pod_stale_after_ms = 1000;
        let ms = Duration::from_millis;
        // 2 %: 1 ms answers cost a round nothing; 9 ms ones (vLLM on a busy CPU) 450 ms apart.
        assert_eq!(rest(&cfg, ms(1)), None);
        assert_eq!(rest(&cfg, ms(9)), Some(ms(441)));
        // Never so long that the pod would be reported stale.
        assert_eq!(rest(&cfg, ms(40)), Some(ms(460)));
        cfg.scrape.max_duty = 0.0;
        assert_eq!(rest(&cfg, ms(40)), None, "0: no bound");
        cfg.scrape.max_duty = 1.0;
        assert_eq!(rest(&cfg, ms(40)), None, "1: back to back");
    }

    #[test]
    fn generations_follow_the_clock_and_never_wrap() {
        assert_eq!(next_generation(0, 1_000), Some(1_000));
        assert_eq!(next_generation(1_000, 1_000), Some(1_001));
        assert_eq!(
            next_generation(1_001, 5_000),
            Some(5_000),
            "catches up with the clock"
        );
        assert_eq!(next_generation(9_000, 5_000), Some(9_001));
        assert_eq!(next_generation(u64::MAX - 1, 5), Some(u64::MAX));
        assert_eq!(next_generation(u64::MAX, 5), None);
    }

    #[test]
    fn a_conflict_from_the_future_is_not_followed() {
        let now = 1_700_000_000_000;
        assert_eq!(after_conflict(now, now + 10, now), Some(now + 10));
        assert_eq!(after_conflict(now + 50, now + 10, now), Some(now + 50));
        let edge = now + MAX_GENERATION_LEAD_MS;
        assert_eq!(after_conflict(now, edge, now), Some(edge));
        assert_eq!(after_conflict(now, edge + 1, now), None);
        assert_eq!(after_conflict(now, u64::MAX, now), None);
        assert_eq!(after_conflict(5, u64::MAX, u64::MAX - 3), Some(u64::MAX));
    }
}
