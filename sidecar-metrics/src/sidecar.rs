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

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use llm_router_snapshot::{Engine, Health, Pod, Pool, Snapshot};
use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::budget::{self, Budget, Trim};
use crate::clock::now_ms;
use crate::config::{Config, Mode, PoolConfig, MIN_SNAPSHOT_MAX_BYTES};
use crate::discovery::{self, DiscoveryError};
use crate::endpoints::Endpoints;
use crate::engines::PodMetrics;
use crate::admin;
use crate::http1::Target;
use crate::hub::HubEvent;
use crate::keys::{Credential, HubKeys};
use crate::push::{PushOutcome, PushResult, PushSetupError, Pusher};
use crate::scrape::{self, PodIo, ScrapeError};
use TallyBoard;
use crate::stats::Stats;

/// Consecutive failures are reported up to this count; beyond it the snapshot stops changing
/// (so an outage does not turn into a push every round). The exact count is on `/metrics`.
pub const MAX_REPORTED_FAILURES: u32 = 10;

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Push(#[from] PushSetupError),
    #[error("hub.upstreams {hub:?}: {reason}")]
    Hub { hub: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

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
            if slot.in_flight {
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
            generation: 0,
            created_ms: now,
            pools,
        }
    }

    /// End of a round: build, publish health, push when needed (and none is in flight).
    fn finish_round(&mut self, push_fut: &mut Option<BoxFut<PushOutcome>>) {
        let now = now_ms();
        let mut snap = self.build(now);
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

/// Resolves when the board (if any) changed; never without one.
async fn board_changed(board: &Option<Arc<TallyBoard>>) {
    match board {
        Some(b) => b.changed().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never when `None`.
async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn poll_opt<F: Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// A sidecar following hubs: which one it uses, and when it last heard from each.
struct Follow {
    events: mpsc::Receiver<HubEvent>,
    /// No hub snapshot for this long: scrape on our own.
    fallback_after: Duration,
    /// The hub whose snapshots are used.
    current: Option<usize>,
    /// When each hub last sent a verified frame.
    seen: Vec<Option<Instant>>,
    /// `created_ms` of the last hub snapshot used: an older or equal one (a replay, or a
    /// restarted hub whose clock went back) is never used.
    last_created_ms: u64,
    /// When the current hub's silence becomes a fallback.
    deadline: tokio::time::Instant,
}

/// What a hub event means for the loop.
#[derive(Debug, PartialEq, Eq)]
enum FollowStep {
    /// Use this snapshot (and stop scraping on our own if we were).
    Use,
    /// Ignore it: a standby hub's (the current one is alive).
    Standby,
    /// Ignore it: not newer than the last one used.
    Old,
    /// Nothing to use any more: scrape on our own now.
    Fallback,
    /// Nothing changes.
    Nothing,
}

impl Follow {
    fn fresh(&self, hub: usize, now: Instant) -> bool {
        self.seen
            .get(hub)
            .copied()
            .flatten()
            .is_some_and(|t| now.duration_since(t) < self.fallback_after)
    }

    /// A verified frame from `hub`, created at `created_ms`, at `now_ms` by our clock (a frame
    /// from further in the future than the clocks' skew is refused: it would make every honest
    /// frame after it look old).
    fn on_frame(&mut self, hub: usize, created_ms: u64, now: Instant, now_ms: u64) -> FollowStep {
        if created_ms > now_ms.saturating_add(llm_router_snapshot::tally::MAX_CLOCK_SKEW_MS) {
            return FollowStep::Old;
        }
        if let Some(slot) = self.seen.get_mut(hub) {
            *slot = Some(now);
        }
        if let Some(c) = self.current {
            if c != hub && self.fresh(c, now) {
                return FollowStep::Standby;
            }
        }
        if created_ms <= self.last_created_ms {
            return FollowStep::Old;
        }
        self.current = Some(hub);
        self.last_created_ms = created_ms;
        self.deadline = tokio::time::Instant::from_std(now + self.fallback_after);
        FollowStep::Use
    }

    /// The connection to `hub` ended. Another hub heard from recently takes over; else fall back.
    fn on_down(&mut self, hub: usize, now: Instant) -> FollowStep {
        if let Some(slot) = self.seen.get_mut(hub) {
            *slot = None;
        }
        if self.current != Some(hub) {
            return FollowStep::Nothing;
        }
        let other = (0..self.seen.len()).find(|&h| h != hub && self.fresh(h, now));
        self.current = other;
        match other.and_then(|h| self.seen.get(h).copied().flatten()) {
            Some(t) => {
                self.deadline = tokio::time::Instant::from_std(t + self.fallback_after);
                FollowStep::Nothing
            }
            None => FollowStep::Fallback,
        }
    }
}

async fn next_event(f: &mut Option<Follow>) -> Option<HubEvent> {
    match f.as_mut() {
        Some(f) => f.events.recv().await,
        None => std::future::pending().await,
    }
}

/// The scrape loop: rounds of scrapes (or, following hubs, their snapshots), pushes and their
/// answers, hub frames, and (mode hub) tally frames, until `shutdown`.
async fn run_loop(lp: Loop, follow: Option<Follow>, mut shutdown: watch::Receiver<bool>) {
    let mut d = Driver::new(lp, follow);
    let far = || tokio::time::Instant::now() + Duration::from_secs(86_400);
    loop {
        let hub_deadline = d
            .follow
            .as_ref()
            .filter(|_| !d.scraping)
            .map_or_else(far, |f| f.deadline);
        let mut fall_back = None;
        let queued_due = d.lp.queued_due(d.push_fut.is_some());
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(first) = d.inflight.next(), if !d.inflight.is_empty() => {
                d.scrapes_back(first).await;
            }
            outcome = poll_opt(&mut d.push_fut) => {
                d.push_fut = None;
                d.lp.push_answered(outcome);
            }
            _ = sleep_opt(queued_due) => {
                if let Some((snap, trim, peer_only)) = d.lp.queued.take() {
                    d.lp.deliver(snap, trim, now_ms(), peer_only, &mut d.push_fut);
                }
            }
            _ = board_changed(&d.board), if d.tally_frame_due.is_none() => {
                let now = tokio::time::Instant::now();
                d.tally_frame_due =
                    Some(d.lp.published_at.map_or(now, |t| (t + d.tally_gap).max(now)));
            }
            _ = sleep_opt(d.tally_frame_due) => {
                d.tally_frame_due = None;
                d.lp.republish();
            }
            Some(ev) = next_event(&mut d.follow) => fall_back = d.hub_event(ev),
            _ = tokio::time::sleep_until(hub_deadline), if d.follow.is_some() && !d.scraping => {
                if let Some(f) = d.follow.as_mut() {
                    f.current = None;
                }
                fall_back = Some("silent");
            }
            _ = tokio::time::sleep_until(d.next_round), if d.scraping => d.next_round_due(),
        }
        if let Some(reason) = fall_back {
            d.scraping = true;
            d.next_round = tokio::time::Instant::now();
            d.lp.stats.hub_source("scrape", Some(reason));
            tracing::warn!(reason, "no hub answers; scraping on our own until one does");
        }
    }
    // Let a push in flight finish (bounded by its timeout) so the last state is not lost.
    if let Some(f) = d.push_fut {
        let o = f.await;
        d.lp.push_answered(o);
    }
    tracing::info!("scrape loop stopped");
}

/// What [`run_loop`] tracks besides [`Loop`]: the scrapes and the push in flight, the round
/// being collected, whether it scrapes on its own or follows hubs, and (mode hub) when the next
/// tally frame is due.
struct Driver {
    lp: Loop,
    follow: Option<Follow>,
    inflight: FuturesUnordered<BoxFut<Done>>,
    push_fut: Option<BoxFut<PushOutcome>>,
    round: u64,
    /// Scrapes of the open round not back yet.
    pending: usize,
    round_open: bool,
    next_round: tokio::time::Instant,
    coalesce: Duration,
    /// Following hubs: no scraping of our own until they stay silent.
    scraping: bool,
    /// Mode hub: a changed tally schedules a frame, at most one per `tally_frame_ms` after the
    /// last frame of any kind.
    board: Option<Arc<TallyBoard>>,
    tally_gap: Duration,
    tally_frame_due: Option<tokio::time::Instant>,
}

impl Driver {
    fn new(lp: Loop, follow: Option<Follow>) -> Driver {
        Driver {
            inflight: FuturesUnordered::new(),
            push_fut: None,
            round: 0,
            pending: 0,
            round_open: false,
            next_round: tokio::time::Instant::now(),
            coalesce: Duration::from_millis(lp.cfg.scrape.coalesce_ms),
            scraping: follow.is_none(),
            board: lp.tally_board(),
            tally_gap: Duration::from_millis(lp.cfg.hub.tally_frame_ms),
            tally_frame_due: None,
            lp,
            follow,
        }
    }

    /// Scrapes came back, `first` among them. Take every answer that is already there, then, if
    /// the round still waits for some, pause briefly so the rest arrive together: one wake-up
    /// per batch instead of one per pod (context switches were the largest cost in the profile).
    async fn scrapes_back(&mut self, first: Done) {
        let mut next = Some(first);
        while let Some(done) = next {
            let this_round = done.round == self.round;
            self.lp.apply(done);
            if this_round && self.round_open {
                self.pending = self.pending.saturating_sub(1);
                if self.pending == 0 {
                    self.round_open = false;
                    self.lp.finish_round(&mut self.push_fut);
                }
            }
            next = self.inflight.next().now_or_never().flatten();
        }
        if self.round_open && !self.inflight.is_empty() && !self.coalesce.is_zero() {
            tokio::time::sleep(self.coalesce).await;
        }
    }

    /// The next round is due: the open one ends as it is, the next one starts.
    fn next_round_due(&mut self) {
        if self.round_open {
            self.round_open = false;
            self.lp.finish_round(&mut self.push_fut);
        }
        self.round += 1;
        self.pending = self.lp.start_round(self.round, &mut self.inflight);
        let now = tokio::time::Instant::now();
        self.next_round += self.lp.jittered();
        if self.next_round < now {
            self.next_round = now + self.lp.jittered();
        }
        if self.pending == 0 {
            self.lp.finish_round(&mut self.push_fut);
        } else {
            self.round_open = true;
        }
    }

    /// A hub's frame or loss; the reason to scrape on our own from now on, if it is one.
    fn hub_event(&mut self, ev: HubEvent) -> Option<&'static str> {
        let f = self.follow.as_mut()?;
        let now = Instant::now();
        match ev {
            HubEvent::Frame {
                hub,
                snapshot,
                tallies,
            } => match f.on_frame(hub, snapshot.created_ms, now, now_ms()) {
                FollowStep::Use => {
                    if self.scraping {
                        self.scraping = false;
                        // Scrapes still in flight finish and are applied to the pods' state,
                        // without closing a round.
                        self.round_open = false;
                        self.lp.stats.hub_source("hub", None);
                        tracing::info!(hub, "using the hub's snapshots; not scraping on our own");
                    }
                    self.lp.offer_hub(snapshot, &tallies, &mut self.push_fut);
                }
                FollowStep::Old => self.lp.stats.hub_frame_refused("old"),
                _ => {}
            },
            HubEvent::Down { hub, reason } => {
                if f.on_down(hub, now) == FollowStep::Fallback && !self.scraping {
                    tracing::debug!(hub, reason = %reason, "the hub in use is gone");
                    return Some("closed");
                }
            }
        }
        None
    }
}

/// What this process holds of the hub's keys: all of them in mode hub (or when it derives its own
/// credential from the hub secret), and its replica's credential.
struct HubSecrets {
    hub: Option<HubKeys>,
    credential: Credential,
}

/// The hub keys from `hub.credential_file`, else `hub.secret*`, else (the configuration from
/// before the roles were split) the push secret, logged as opening the hub to the proxy.
fn resolve_hub_keys(cfg: &Config, push_secret: &str) -> Result<HubSecrets, StartError> {
    let bad = |reason: String| StartError::Hub {
        hub: "hub.secret".into(),
        reason,
    };
    if let Some(path) = &cfg.hub.credential_file {
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
        let credential =
            Credential::parse(&text).map_err(|e| bad(format!("{path}: {e}")))?;
        return Ok(HubSecrets {
            hub: None,
            credential,
        });
    }
    let hub_secret = cfg.resolve_hub_secret().map_err(|e| bad(e.to_string()))?;
    let uses_hub = cfg.mode == Mode::Hub || !cfg.hub.upstreams.is_empty();
    if hub_secret.is_none() && uses_hub {
        tracing::warn!("no hub.secret_file: the push secret serves as the hub secret, so whoever holds it (the proxy's environment included) can subscribe, forge frames and speak for every replica; give the hubs hub.secret_file and each gateway sidecar hub.credential_file (`sidecar-metrics credential`)");
    } else if cfg.mode == Mode::Sidecar && !cfg.hub.upstreams.is_empty() {
        tracing::warn!("this sidecar holds the hub secret: it could speak for any replica; give it hub.credential_file (`sidecar-metrics credential`) instead");
    }
    let keys =
        HubKeys::from_secret(hub_secret.as_deref().unwrap_or(push_secret).as_bytes());
    Ok(HubSecrets {
        credential: keys.credential(crate::share::replica_id()),
        hub: Some(keys),
    })
}

/// A restarted subscriber takes no frame created more than this before it started: a replay of
/// an older capture is refused (frames come every scrape interval; a restart reconnects within
/// the fallback time).
pub const MAX_FRAME_AGE_MS: u64 = 2_000;

/// A started sidecar.
pub struct Running {
    /// Where its own `/metrics` and `/healthz` listen.
    pub face_addr: SocketAddr,
    /// Mode hub: where the snapshot stream listens.
    pub hub_addr: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    /// Every snapshot the proxy accepted (latest), for tests and debugging.
    pub accepted: watch::Receiver<Option<Snapshot>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops scraping, lets the last push finish, stops the face.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Asks the loop and the face to stop; [`Running::wait`] then resolves.
    pub fn signal_stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Resolves when the loop and the face have ended.
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts discovery, the scrape loop and the face. `cfg` must be validated.
pub async fn start(cfg: Config, secret: String) -> Result<Running, StartError> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let stats = Arc::new(Stats::default());
    let pools = cfg
        .pools
        .iter()
        .map(|p| PoolRt::start(p, &cfg, shutdown_rx.clone(), &stats))
        .collect::<Result<Vec<_>, _>>()?;
    let (frames_tx, frames_rx) = watch::channel(None);
    let board = Arc::new(TallyBoard::new(Duration::from_millis(cfg.hub.tally_ttl_ms)));
    let hub_secret = resolve_hub_keys(&cfg, &secret)?;
    let cred = hub_secret.credential;
    let out = output(&cfg, &secret, hub_secret.hub.clone(), frames_tx, board.clone())?;
    let mut tasks = Vec::new();
    let hub_addr = match cfg.mode {
        Mode::Hub => {
            let keys = hub_secret.hub;
            let (addr, task) = serve_hub(&cfg, keys, frames_rx, board, &stats, &shutdown_rx).await?;
            tasks.push(task);
            Some(addr)
        }
        Mode::Sidecar => None,
    };
    let follow = follow_hubs(&cfg, &cred, &stats, &shutdown_rx, &mut tasks)?;
    let (listener, face_addr) = bind(&cfg.listen).await?;
    stats.snapshot_budget(cfg.snapshot.max_bytes);
    let (snap_tx, snap_rx) = watch::channel(None);
    log_started(&out, face_addr, hub_addr, &cfg);
    let face_task = tokio::spawn(admin::serve(
        listener,
        stats.clone(),
        cfg.scrape.interval_ms,
        shutdown_rx.clone(),
    ));
    let lp = Loop::new(cfg, pools, out, stats.clone(), snap_tx, cred.replica);
    let loop_task = tokio::spawn(run_loop(lp, follow, shutdown_rx));
    tasks.push(loop_task);
    tasks.push(face_task);
    Ok(Running {
        face_addr,
        hub_addr,
        stats,
        accepted: snap_rx,
        shutdown: shutdown_tx,
        tasks,
    })
}

impl PoolRt {
    /// Starts the discovery of pool `p` and takes the pods it already knows.
    fn start(
        p: &PoolConfig,
        cfg: &Config,
        shutdown: watch::Receiver<bool>,
        stats: &Stats,
    ) -> Result<PoolRt, StartError> {
        let rx = discovery::start(&p.name, &p.discovery, shutdown)?;
        let path = p
            .metrics_path
            .clone()
            .unwrap_or_else(|| cfg.scrape.path.clone());
        let filtered_path = cfg.scrape.name_filter.then(|| {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!(
                "{path}{sep}{}",
                crate::engines::name_filter_query(p.engine())
            )
        });
        let mut rt = PoolRt {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            models: p.models.clone(),
            engine: p.engine(),
            path,
            filtered_path,
            rx,
            pods: Vec::new(),
        };
        let initial = rt.rx.borrow_and_update().clone();
        rt.resync(&initial, stats);
        Ok(rt)
    }
}

/// Where this process's snapshots go: the local proxy (mode sidecar) or the hub's streams.
fn output(
    cfg: &Config,
    secret: &str,
    hub_keys: Option<HubKeys>,
    frames: watch::Sender<Option<Bytes>>,
    board: Arc<TallyBoard>,
) -> Result<Output, StartError> {
    Ok(match cfg.mode {
        Mode::Sidecar => Output::Push(Box::new(Pusher::new(
            &cfg.push.address,
            &cfg.push.path,
            secret,
            Duration::from_millis(cfg.push.timeout_ms),
        )?)),
        Mode::Hub => {
            llm_router_snapshot::check_secret(secret).map_err(PushSetupError::BadSecret)?;
            Output::Publish {
                keys: hub_keys.ok_or_else(|| no_hub_secret(cfg))?,
                frames,
                board,
            }
        }
    })
}

fn no_hub_secret(cfg: &Config) -> StartError {
    StartError::Hub {
        hub: cfg.hub.listen.clone(),
        reason: "no hub secret".into(),
    }
}

/// Binds `addr`; the address it got (the port, for `:0`).
async fn bind(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Mode hub: listens on `hub.listen` and serves the snapshot stream; the address it got and
/// the task.
async fn serve_hub(
    cfg: &Config,
    keys: Option<HubKeys>,
    frames: watch::Receiver<Option<Bytes>>,
    board: Arc<TallyBoard>,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), StartError> {
    let (listener, addr) = bind(&cfg.hub.listen).await?;
    let keys = keys.ok_or_else(|| no_hub_secret(cfg))?;
    let task = tokio::spawn(crate::hub::serve(
        listener,
        keys,
        frames,
        board,
        stats.clone(),
        shutdown.clone(),
    ));
    Ok((addr, task))
}

/// Mode sidecar with `hub.upstreams`: a subscription to each hub and, with `hub.share_ms`, this
/// replica's tally sent to them (tasks in `tasks`); `None` when it follows no hub.
fn follow_hubs(
    cfg: &Config,
    cred: &Credential,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<Follow>, StartError> {
    if cfg.mode != Mode::Sidecar || cfg.hub.upstreams.is_empty() {
        return Ok(None);
    }
    let (tx, rx) = mpsc::channel(8);
    let mut hub_uris = Vec::with_capacity(cfg.hub.upstreams.len());
    let opts = crate::hub::SubscribeOptions {
        timeout: Duration::from_millis(cfg.hub.timeout_ms),
        max_backoff: Duration::from_secs(1),
    };
    for (i, u) in cfg.hub.upstreams.iter().enumerate() {
        let uri = crate::hub::hub_uri(u).map_err(|reason| StartError::Hub {
            hub: u.clone(),
            reason,
        })?;
        hub_uris.push(uri.clone());
        tasks.push(tokio::spawn(crate::hub::subscribe(
            i,
            uri,
            cred.clone(),
            opts,
            tx.clone(),
            stats.clone(),
            shutdown.clone(),
        )));
    }
    if cfg.hub.share_ms > 0 {
        tasks.push(spawn_share(cfg, hub_uris, cred, stats, shutdown)?);
    }
    let fallback_after = cfg.hub_fallback_after();
    stats.hub_source("hub", None);
    Ok(Some(Follow {
        events: rx,
        fallback_after,
        current: None,
        seen: vec![None; cfg.hub.upstreams.len()],
        last_created_ms: now_ms().saturating_sub(MAX_FRAME_AGE_MS),
        deadline: tokio::time::Instant::now() + fallback_after,
    }))
}

/// Sends this replica's tally (read from `push.tally_path`) to the `hubs` every `hub.share_ms`.
fn spawn_share(
    cfg: &Config,
    hubs: Vec<hyper::Uri>,
    cred: &Credential,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, StartError> {
    let tally_uri: hyper::Uri = format!("http://{}{}", cfg.push.address, cfg.push.tally_path)
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| StartError::Hub {
            hub: cfg.push.address.clone(),
            reason: format!("push.tally_path: {e}"),
        })?;
    Ok(tokio::spawn(crate::share::share(
        crate::share::ShareOptions {
            interval: Duration::from_millis(cfg.hub.share_ms),
            tally_uri,
            hubs,
            timeout: Duration::from_millis(cfg.hub.timeout_ms),
        },
        cred.clone(),
        stats.clone(),
        shutdown.clone(),
    )))
}

fn log_started(out: &Output, face_addr: SocketAddr, hub_addr: Option<SocketAddr>, cfg: &Config) {
    match out {
        Output::Push(p) => tracing::info!(
            face = %face_addr,
            push = %p.uri(),
            hubs = ?cfg.hub.upstreams,
            pools = cfg.pools.len(),
            interval_ms = cfg.scrape.interval_ms,
            "sidecar-metrics started"
        ),
        Output::Publish { .. } => tracing::info!(
            face = %face_addr,
            hub = ?hub_addr,
            pools = cfg.pools.len(),
            interval_ms = cfg.scrape.interval_ms,
            "sidecar-metrics hub started"
        ),
    }
}

impl Loop {
    /// The loop's state before its first round.
    fn new(
        cfg: Config,
        pools: Vec<PoolRt>,
        out: Output,
        stats: Arc<Stats>,
        snapshots: watch::Sender<Option<Snapshot>>,
        replica: u64,
    ) -> Loop {
        Loop {
            pools,
            out,
            stats,
            last_generation: 0,
            budget: Budget {
                max_bytes: cfg.snapshot.max_bytes,
                max_pod_bytes: cfg.snapshot.max_pod_bytes,
            },
            trim_state: TrimState::Whole,
            future_logged: false,
            last_accepted: None,
            last_accepted_at: None,
            in_flight_snapshot: None,
            retry: false,
            last_push_label: "none",
            snapshots,
            next_pod: 0,
            replica,
            last_trim: Trim::default(),
            published_at: None,
            queued: None,
            last_hub_pods: None,
            push_started: None,
            peer_push_at: None,
            cfg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_router_snapshot::MAX_GENERATION_LEAD_MS;

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

    fn follow(hubs: usize) -> Follow {
        let (_tx, rx) = mpsc::channel(1);
        Follow {
            events: rx,
            fallback_after: Duration::from_millis(150),
            current: None,
            seen: vec![None; hubs],
            last_created_ms: 0,
            deadline: tokio::time::Instant::now(),
        }
    }

    #[tokio::test]
    async fn one_hub_is_followed_and_its_old_snapshots_are_not() {
        let mut f = follow(1);
        let t0 = Instant::now();
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Use);
        assert_eq!(f.current, Some(0));
        // A replay, or a restarted hub whose clock went back: never used.
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Old);
        assert_eq!(f.on_frame(0, 999, t0, 2_000), FollowStep::Old);
        assert_eq!(f.on_frame(0, 1_050, t0, 2_000), FollowStep::Use);
        assert_eq!(
            f.deadline,
            tokio::time::Instant::from_std(t0 + Duration::from_millis(150))
        );
        // Its connection ends and no other hub is there: scrape on our own.
        assert_eq!(f.on_down(0, t0), FollowStep::Fallback);
        assert_eq!(f.current, None);
        // Back: its next newer snapshot is used again.
        assert_eq!(f.on_frame(0, 1_100, t0, 2_000), FollowStep::Use);
    }

    #[tokio::test]
    async fn two_hubs_one_in_use_the_other_standing_by() {
        let mut f = follow(2);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(f.on_frame(0, 1_000, t0, 2_000), FollowStep::Use);
        assert_eq!(
            f.on_frame(1, 1_010, t0 + ms(10), 2_000),
            FollowStep::Standby
        );
        assert_eq!(f.on_frame(0, 1_050, t0 + ms(50), 2_000), FollowStep::Use);
        assert_eq!(
            f.on_frame(1, 1_060, t0 + ms(60), 2_000),
            FollowStep::Standby
        );
        // Hub 0's connection ends: hub 1, heard from 10 ms ago, takes over without a fallback.
        assert_eq!(f.on_down(0, t0 + ms(70)), FollowStep::Nothing);
        assert_eq!(f.current, Some(1));
        assert_eq!(
            f.deadline,
            tokio::time::Instant::from_std(t0 + ms(60) + ms(150))
        );
        assert_eq!(f.on_frame(1, 1_110, t0 + ms(110), 2_000), FollowStep::Use);
        // Hub 0 is back, but hub 1 is alive: it stays standby.
        assert_eq!(
            f.on_frame(0, 1_120, t0 + ms(120), 2_000),
            FollowStep::Standby
        );
        // Hub 1 goes silent (no close): after fallback_after, hub 0's frames are used.
        assert_eq!(f.on_frame(0, 1_300, t0 + ms(300), 2_000), FollowStep::Use);
        assert_eq!(f.current, Some(0));
        // A standby's loss changes nothing.
        assert_eq!(f.on_down(1, t0 + ms(310)), FollowStep::Nothing);
        assert_eq!(f.current, Some(0));
        // Losing the last one falls back.
        assert_eq!(f.on_down(0, t0 + ms(320)), FollowStep::Fallback);
    }

    /// A restarted subscriber refuses a frame older than it could have seen (a replay of an old
    /// capture), and any subscriber one from beyond the clocks' skew.
    #[tokio::test]
    async fn a_restarted_subscriber_refuses_old_and_future_frames() {
        let now = 1_700_000_000_000u64;
        let mut f = follow(1);
        f.last_created_ms = now - MAX_FRAME_AGE_MS;
        let t0 = Instant::now();
        assert_eq!(f.on_frame(0, now - 60_000, t0, now), FollowStep::Old);
        assert_eq!(
            f.on_frame(0, now - MAX_FRAME_AGE_MS, t0, now),
            FollowStep::Old
        );
        let skew = llm_router_snapshot::tally::MAX_CLOCK_SKEW_MS;
        assert_eq!(f.on_frame(0, now + skew + 1, t0, now), FollowStep::Old);
        assert_eq!(f.on_frame(0, u64::MAX, t0, now), FollowStep::Old);
        assert_eq!(f.on_frame(0, now - 10, t0, now), FollowStep::Use);
        assert_eq!(f.on_frame(0, now + skew, t0, now), FollowStep::Use);
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
