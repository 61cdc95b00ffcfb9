//! The sidecar's own numbers, exposed in Prometheus text on its `/metrics` through the
//! `prometheus-client` crate: scrape latency and failures per pod, pods per pool and state,
//! pushes by result, snapshot size, age and generation (names in `sidecar-metrics/README.md`).
//!
//! One mutex guards the numbers; the scrape loop takes it once per finished scrape and the HTTP
//! face once per request, which is far below any contention that matters. A collector reads
//! them under that lock at exposition time, so pods that discovery dropped simply disappear.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Content type of [`Stats::render`]'s text (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of the scrape latency histogram.
pub const LATENCY_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Upper bounds (seconds) of the age of the other replicas' work when a hub frame is applied.
pub const PEER_AGE_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
];

/// Every push result, exported from the start (at 0) so that rates exist before the first one.
pub const PUSH_RESULTS: [&str; 8] = [
    "accepted",
    "invalid",
    "forbidden",
    "not_found",
    "stale",
    "too_large",
    "http_error",
    "transport_error",
];

#[derive(Debug)]
struct PodStat {
    latency: Histogram,
    failures_by_kind: BTreeMap<&'static str, u64>,
    health: &'static str,
    failures: u32,
}

impl PodStat {
    fn new() -> Self {
        PodStat {
            latency: Histogram::new(LATENCY_BUCKETS),
            failures_by_kind: BTreeMap::new(),
            health: "",
            failures: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// pool → pod → numbers (nested so that a lookup by `&str` allocates nothing).
    pods: BTreeMap<String, BTreeMap<String, PodStat>>,
    pushes: BTreeMap<&'static str, u64>,
    rounds: u64,
    last_round_ms: u64,
    last_accepted_created_ms: u64,
    last_accepted_generation: u64,
    last_push_result: &'static str,
    snapshot_bytes: u64,
    /// (budget, list) → adapters dropped from pushed snapshots, and from the last one.
    adapters_dropped: BTreeMap<(&'static str, &'static str), u64>,
    adapters_trimmed: BTreeMap<(&'static str, &'static str), u64>,
    budget_bytes: u64,
    over_budget: u64,
    /// Target names of the last snapshot's rewrite rules that no pool serves.
    rewrite_targets_unknown: u64,
    hub: HubNumbers,
    /// Subscriber side: age of the oldest other replica's tally in each applied hub frame.
    peer_age: Option<Histogram>,
}

/// The hub's and the subscriber's numbers.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct HubNumbers {
    /// Subscriber side: where the snapshots pushed now come from (`hub`, `scrape`; empty in a
    /// sidecar without hubs and in a hub).
    pub source: &'static str,
    /// Subscriber side: verified frames received (all hubs).
    pub frames_received: u64,
    /// Subscriber side: frames refused, by reason (`signature`, `invalid`, `old`).
    pub frames_refused: BTreeMap<&'static str, u64>,
    /// Subscriber side: switches to its own scraping, by reason (`silent`, `closed`).
    pub fallbacks: BTreeMap<&'static str, u64>,
    /// Subscriber side: when the last hub snapshot was applied (Unix ms).
    pub last_frame_ms: u64,
    /// Hub side: streams open now.
    pub subscribers: i64,
    /// Hub side: subscribe requests refused (no valid signature).
    pub subscribes_refused: u64,
    /// Hub side: snapshots published to the stream.
    pub published: u64,
    /// Hub side: of those, frames for changed tallies between scrape rounds.
    pub tally_frames: u64,
    /// Hub side: tallies received from gateway replicas, by result (`accepted`, `forbidden`,
    /// `invalid`, `refused`).
    pub tallies: BTreeMap<&'static str, u64>,
    /// Hub side: replicas whose tallies the last frame carried.
    pub replicas: u64,
    /// Hub side: frames not published because they exceeded the stream's limit.
    pub frames_unsent: u64,
    /// Subscriber side: tallies of this replica sent to hubs, by result (`sent` per hub,
    /// `hub_error` per hub, `proxy_error`: the proxy's tally could not be read).
    pub shared: BTreeMap<&'static str, u64>,
    /// Subscriber side: the age (ms) of the oldest other replica's tally in the last applied
    /// frame (0 when it carried none).
    pub peer_age_ms: u64,
}

/// The `budget` × `list` label pairs of the adapter counters, all exported from the start.
const TRIM_LABELS: [(&str, &str); 4] = [
    ("pod", "running"),
    ("pod", "waiting"),
    ("total", "running"),
    ("total", "waiting"),
];

/// Shared between the scrape loop and the HTTP face.
#[derive(Default)]
pub struct Stats {
    inner: Arc<Mutex<Inner>>,
}

/// A point-in-time view for `/healthz` and tests.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub rounds: u64,
    pub last_round_ms: u64,
    pub pods: usize,
    pub pods_ok: usize,
    pub pushes: BTreeMap<&'static str, u64>,
    pub last_push_result: &'static str,
    pub last_accepted_generation: u64,
    pub last_accepted_created_ms: u64,
    pub hub: HubNumbers,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave counters inconsistent in a harmful way.
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Inner {
    /// The numbers of one pod, created on first use (no allocation once it exists).
    fn pod_mut(&mut self, pool: &str, pod: &str) -> Option<&mut PodStat> {
        if !self.pods.contains_key(pool) {
            self.pods.insert(pool.to_owned(), BTreeMap::new());
        }
        let pods = self.pods.get_mut(pool)?;
        if !pods.contains_key(pod) {
            pods.insert(pod.to_owned(), PodStat::new());
        }
        pods.get_mut(pod)
    }

    fn iter(&self) -> impl Iterator<Item = ((&str, &str), &PodStat)> {
        self.pods.iter().flat_map(|(pool, pods)| {
            pods.iter()
                .map(move |(pod, s)| ((pool.as_str(), pod.as_str()), s))
        })
    }
}

/// Reads [`Inner`] when the registry is encoded; `now_ms` dates the snapshot age.
#[derive(Debug)]
struct Exposition {
    inner: Arc<Mutex<Inner>>,
    now_ms: u64,
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let i = lock(&self.inner);
        encode_scrapes(&mut enc, &i)?;
        encode_snapshots(&mut enc, &i, self.now_ms)?;
        encode_hub_frames(&mut enc, &i)?;
        encode_hub_tallies(&mut enc, &i)
    }
}

type Encoded = Result<(), std::fmt::Error>;

/// One family of one unlabelled sample.
fn single<M: EncodeMetric + ?Sized>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &M,
) -> Encoded {
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// One family with one sample per value of `label`.
fn by_label<'a, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, M)>,
) -> Encoded {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (value, metric) in samples {
        metric.encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// Counters of `keys` from `counts` (0 for a key not counted yet, so rates exist from the start).
fn counts_of<'a>(
    counts: &'a BTreeMap<&'static str, u64>,
    keys: &'a [&'a str],
) -> impl Iterator<Item = (&'a str, ConstCounter)> + 'a {
    keys.iter()
        .map(|k| (*k, ConstCounter::new(counts.get(k).copied().unwrap_or(0))))
}

/// Per pod: scrape latency, failures by kind, failures in a row; pods by pool and state.
fn encode_scrapes(enc: &mut DescriptorEncoder, i: &Inner) -> Encoded {
    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_scrape_duration_seconds",
        "Time to fetch and read one pod's /metrics.",
        None,
        MetricType::Histogram,
    )?;
    for ((pool, pod), s) in i.iter() {
        s.latency
            .encode(m.encode_family(&[("pool", pool), ("pod", pod)])?)?;
    }

    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_scrape_failures",
        "Failed scrapes by pod and kind (request, timeout, status, too_large, body, not_utf8, unusable).",
        None,
        MetricType::Counter,
    )?;
    for ((pool, pod), s) in i.iter() {
        for (kind, n) in &s.failures_by_kind {
            ConstCounter::new(*n).encode(m.encode_family(&[
                ("pool", pool),
                ("pod", pod),
                ("kind", kind),
            ])?)?;
        }
    }

    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_pod_consecutive_failures",
        "Failed scrapes in a row per pod.",
        None,
        MetricType::Gauge,
    )?;
    for ((pool, pod), s) in i.iter() {
        ConstGauge::new(i64::from(s.failures))
            .encode(m.encode_family(&[("pool", pool), ("pod", pod)])?)?;
    }

    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_pods",
        "Pods by pool and state (ok, failing, stale; unknown before the first round) in the last snapshot.",
        None,
        MetricType::Gauge,
    )?;
    let mut by: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for ((pool, _), s) in i.iter() {
        let state = if s.health.is_empty() {
            "unknown"
        } else {
            s.health
        };
        *by.entry((pool, state)).or_default() += 1;
    }
    for ((pool, state), n) in by {
        ConstGauge::new(n).encode(m.encode_family(&[("pool", pool), ("state", state)])?)?;
    }
    Ok(())
}

/// Pushes, the snapshot's size, budget, trims, age and generation, scrape rounds.
fn encode_snapshots(enc: &mut DescriptorEncoder, i: &Inner, now_ms: u64) -> Encoded {
    by_label(
        enc,
        (
            "llm_router_sidecar_pushes",
            "Snapshot pushes by result.",
            MetricType::Counter,
        ),
        "result",
        counts_of(&i.pushes, &PUSH_RESULTS),
    )?;
    single(
        enc,
        "llm_router_sidecar_snapshot_bytes",
        "Size of the last encoded snapshot (bytes).",
        &ConstGauge::new(i.snapshot_bytes as f64),
    )?;
    single(
        enc,
        "llm_router_sidecar_snapshot_budget_bytes",
        "Byte budget of a pushed snapshot in force: snapshot.max_bytes, or less after the proxy answered 413.",
        &ConstGauge::new(i.budget_bytes as f64),
    )?;
    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_snapshot_adapters_dropped",
        "LoRA adapter names dropped from pushed snapshots: budget=pod to keep a pod within snapshot.max_pod_bytes, budget=total to keep the snapshot within snapshot.max_bytes; list=running|waiting.",
        None,
        MetricType::Counter,
    )?;
    for (b, l) in TRIM_LABELS {
        let n = i.adapters_dropped.get(&(b, l)).copied().unwrap_or(0);
        ConstCounter::new(n).encode(m.encode_family(&[("budget", b), ("list", l)])?)?;
    }
    let mut m = enc.encode_descriptor(
        "llm_router_sidecar_snapshot_adapters_trimmed",
        "LoRA adapter names missing from the last pushed snapshot because of the budgets.",
        None,
        MetricType::Gauge,
    )?;
    for (b, l) in TRIM_LABELS {
        let n = i.adapters_trimmed.get(&(b, l)).copied().unwrap_or(0);
        ConstGauge::new(n as i64).encode(m.encode_family(&[("budget", b), ("list", l)])?)?;
    }
    single(
        enc,
        "llm_router_sidecar_snapshots_over_budget",
        "Snapshots not pushed because even without adapter names they exceed the byte budget.",
        &ConstCounter::new(i.over_budget),
    )?;
    let age = if i.last_accepted_created_ms == 0 {
        -1.0
    } else {
        now_ms.saturating_sub(i.last_accepted_created_ms) as f64 / 1000.0
    };
    single(
        enc,
        "llm_router_sidecar_snapshot_age_seconds",
        "Age of the last snapshot the proxy accepted (-1: none yet).",
        &ConstGauge::new(age),
    )?;
    single(
        enc,
        "llm_router_sidecar_snapshot_generation",
        "Generation of the last accepted snapshot.",
        &ConstGauge::new(i.last_accepted_generation as f64),
    )?;
    single(
        enc,
        "llm_router_sidecar_rewrite_targets_unknown",
        "Target names of the last snapshot's rewrite rules that no pool serves (in no pool's models, no pod's adapters; logged as a warning).",
        &ConstGauge::new(i.rewrite_targets_unknown as i64),
    )?;
    single(
        enc,
        "llm_router_sidecar_scrape_rounds",
        "Scrape rounds completed.",
        &ConstCounter::new(i.rounds),
    )
}

/// Hub frames: where a gateway sidecar's snapshots come from, frames received and refused,
/// fallbacks to its own scraping; the hub's subscribers and what it published.
fn encode_hub_frames(enc: &mut DescriptorEncoder, i: &Inner) -> Encoded {
    let h = &i.hub;
    let sources: &[&str] = if h.source.is_empty() {
        &[]
    } else {
        &["hub", "scrape"]
    };
    by_label(
        enc,
        (
            "llm_router_sidecar_hub_source",
            "1 for where the pushed snapshots come from now: the hub, or the sidecar's own scraping (a sidecar subscribed to hubs only).",
            MetricType::Gauge,
        ),
        "source",
        sources
            .iter()
            .map(|src| (*src, ConstGauge::new(i64::from(h.source == *src)))),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_frames_received",
        "Snapshot frames received from hubs, signature verified.",
        &ConstCounter::new(h.frames_received),
    )?;
    by_label(
        enc,
        (
            "llm_router_sidecar_hub_frames_refused",
            "Hub frames refused, by reason (signature: not signed with our secret, the connection is dropped; invalid: not a snapshot; old: not newer than the last one used).",
            MetricType::Counter,
        ),
        "reason",
        counts_of(&h.frames_refused, &["signature", "invalid", "old"]),
    )?;
    by_label(
        enc,
        (
            "llm_router_sidecar_hub_fallbacks",
            "Switches from the hubs to the sidecar's own scraping, by reason (closed: every hub's connection ended; silent: no frame for hub.fallback_after_ms).",
            MetricType::Counter,
        ),
        "reason",
        counts_of(&h.fallbacks, &["closed", "silent"]),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_subscribers",
        "Hub: gateway sidecars subscribed now.",
        &ConstGauge::new(h.subscribers),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_subscribes_refused",
        "Hub: subscribe requests refused for want of a valid signature.",
        &ConstCounter::new(h.subscribes_refused),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_published",
        "Hub: snapshots published to the subscribers' streams.",
        &ConstCounter::new(h.published),
    )?;
    Ok(())
}

/// Tallies: the hub's tally frames, tallies received and replicas carried; a gateway
/// sidecar's tallies shared and the age of the other replicas' work.
fn encode_hub_tallies(enc: &mut DescriptorEncoder, i: &Inner) -> Encoded {
    let h = &i.hub;
    single(
        enc,
        "llm_router_sidecar_hub_tally_frames",
        "Hub: of the published snapshots, frames sent between scrape rounds because a replica's tally changed (hub.tally_frame_ms).",
        &ConstCounter::new(h.tally_frames),
    )?;
    by_label(
        enc,
        (
            "llm_router_sidecar_hub_tallies",
            "Hub: gateway replicas' tallies received, by result (accepted; forbidden: not signed with the key of the replica it names; invalid: not a tally, or its body too slow; refused: a replayed or older seq, dated in the future or too old, or the board is full; too_large: over the size limit, refused unread).",
            MetricType::Counter,
        ),
        "result",
        counts_of(
            &h.tallies,
            &["accepted", "forbidden", "invalid", "refused", "too_large"],
        ),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_frames_unsent",
        "Hub: frames not published because they exceeded the stream's frame limit (logged as errors).",
        &ConstCounter::new(h.frames_unsent),
    )?;
    single(
        enc,
        "llm_router_sidecar_hub_replicas",
        "Hub: gateway replicas whose tallies the last published frame carried.",
        &ConstGauge::new(h.replicas as i64),
    )?;
    by_label(
        enc,
        (
            "llm_router_sidecar_tallies_shared",
            "This replica's tallies sent to hubs, by result (sent and hub_error count per hub; proxy_error: the proxy's tally could not be read).",
            MetricType::Counter,
        ),
        "result",
        counts_of(&h.shared, &["sent", "hub_error", "proxy_error"]),
    )?;
    if let Some(hist) = &i.peer_age {
        single(
            enc,
            "llm_router_sidecar_peer_work_age_seconds",
            "Age of the oldest other replica's tally in each hub frame applied (read by its sidecar → merged here), i.e. how old the others' work is when this proxy gets it, before the push.",
            hist,
        )?;
    }
    Ok(())
}

impl Stats {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    pub fn scrape_done(&self, pool: &str, pod: &str, seconds: f64, error: Option<&'static str>) {
        self.with(|i| {
            let Some(s) = i.pod_mut(pool, pod) else {
                return;
            };
            s.latency.observe(seconds);
            if let Some(kind) = error {
                *s.failures_by_kind.entry(kind).or_default() += 1;
            }
        });
    }

    pub fn pod_health(&self, pool: &str, pod: &str, health: &'static str, failures: u32) {
        self.with(|i| {
            let Some(s) = i.pod_mut(pool, pod) else {
                return;
            };
            s.health = health;
            s.failures = failures;
        });
    }

    /// Forget pods that discovery no longer lists.
    pub fn retain_pods(&self, keep: impl Fn(&str, &str) -> bool) {
        self.with(|i| {
            for (pool, pods) in i.pods.iter_mut() {
                pods.retain(|pod, _| keep(pool, pod));
            }
            i.pods.retain(|_, pods| !pods.is_empty());
        });
    }

    pub fn round_done(&self, now_ms: u64) {
        self.with(|i| {
            i.rounds += 1;
            i.last_round_ms = now_ms;
        });
    }

    /// A snapshot was encoded for a push: its size in bytes.
    pub fn snapshot_encoded(&self, bytes: usize) {
        self.with(|i| i.snapshot_bytes = bytes as u64);
    }

    /// The budget in force (bytes).
    pub fn snapshot_budget(&self, bytes: usize) {
        self.with(|i| i.budget_bytes = bytes as u64);
    }

    /// A snapshot about to be pushed lost these adapters to the budgets.
    pub fn snapshot_trimmed(&self, t: &crate::budget::Trim) {
        self.with(|i| {
            for (b, l) in TRIM_LABELS {
                let lists = if b == "pod" { t.by_pod } else { t.by_total };
                let n = if l == "running" {
                    lists.running
                } else {
                    lists.waiting
                };
                *i.adapters_dropped.entry((b, l)).or_default() += n;
                i.adapters_trimmed.insert((b, l), n);
            }
        });
    }

    /// A snapshot was not pushed: it exceeds the budget even without adapters.
    pub fn snapshot_over_budget(&self) {
        self.with(|i| i.over_budget += 1);
    }

    /// The target names of the snapshot's rewrite rules that no pool serves.
    pub fn rewrite_targets_unknown(&self, n: usize) {
        self.with(|i| i.rewrite_targets_unknown = n as u64);
    }

    pub fn push_done(&self, result: &'static str, accepted: Option<(u64, u64)>) {
        self.with(|i| {
            *i.pushes.entry(result).or_default() += 1;
            i.last_push_result = result;
            if let Some((generation, created_ms)) = accepted {
                i.last_accepted_generation = generation;
                i.last_accepted_created_ms = created_ms;
            }
        });
    }

    /// Hub side: a subscriber stream opened (+1) or closed (-1).
    pub fn hub_subscriber(&self, delta: i64) {
        self.with(|i| i.hub.subscribers += delta);
    }

    pub fn hub_subscribe_refused(&self) {
        self.with(|i| i.hub.subscribes_refused += 1);
    }

    /// Hub side: a snapshot went out to the stream.
    pub fn hub_published(&self, generation: u64, created_ms: u64) {
        self.with(|i| {
            i.hub.published += 1;
            i.last_accepted_generation = generation;
            i.last_accepted_created_ms = created_ms;
        });
    }

    pub fn hub_frame_received(&self) {
        self.with(|i| i.hub.frames_received += 1);
    }

    pub fn hub_frame_refused(&self, reason: &'static str) {
        self.with(|i| *i.hub.frames_refused.entry(reason).or_default() += 1);
    }

    /// Hub side: the next frame is for changed tallies, not a scrape round.
    pub fn hub_tally_frame(&self) {
        self.with(|i| i.hub.tally_frames += 1);
    }

    /// Hub side: a replica's tally arrived (`result`).
    pub fn hub_tally(&self, result: &'static str) {
        self.with(|i| *i.hub.tallies.entry(result).or_default() += 1);
    }

    /// Hub side: a frame over the stream's limit was not published.
    pub fn hub_frame_unsent(&self) {
        self.with(|i| i.hub.frames_unsent += 1);
    }

    /// Hub side: the replicas the frame just published carried.
    pub fn hub_replicas(&self, n: usize) {
        self.with(|i| i.hub.replicas = n as u64);
    }

    /// Subscriber side: one of this replica's tallies sent (`result`).
    pub fn tally_shared(&self, result: &'static str) {
        self.with(|i| *i.hub.shared.entry(result).or_default() += 1);
    }

    /// Subscriber side: a frame carrying other replicas' tallies, the oldest `age_ms` old.
    pub fn peer_work_age(&self, age_ms: Option<u64>) {
        self.with(|i| {
            i.hub.peer_age_ms = age_ms.unwrap_or(0);
            if let Some(ms) = age_ms {
                i.peer_age
                    .get_or_insert_with(|| Histogram::new(PEER_AGE_BUCKETS))
                    .observe(ms as f64 / 1000.0);
            }
        });
    }

    /// Subscriber side: a hub snapshot is the fleet's view now.
    pub fn hub_frame_applied(&self, now_ms: u64) {
        self.with(|i| i.hub.last_frame_ms = now_ms);
    }

    /// Subscriber side: the source of the snapshots changed (`hub` or `scrape`), and why when it
    /// is a fallback to scraping.
    pub fn hub_source(&self, source: &'static str, fallback: Option<&'static str>) {
        self.with(|i| {
            i.hub.source = source;
            if let Some(r) = fallback {
                *i.hub.fallbacks.entry(r).or_default() += 1;
            }
        });
    }

    pub fn summary(&self) -> Summary {
        self.with(|i| Summary {
            rounds: i.rounds,
            last_round_ms: i.last_round_ms,
            pods: i.iter().count(),
            pods_ok: i.iter().filter(|(_, p)| p.health == "ok").count(),
            pushes: i.pushes.clone(),
            last_push_result: if i.last_push_result.is_empty() {
                "none"
            } else {
                i.last_push_result
            },
            last_accepted_generation: i.last_accepted_generation,
            last_accepted_created_ms: i.last_accepted_created_ms,
            hub: i.hub.clone(),
        })
    }

    /// Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]) of everything above.
    pub fn render(&self, now_ms: u64) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition {
            inner: self.inner.clone(),
            now_ms,
        }));
        let mut out = String::with_capacity(4096);
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            // Writing into a String cannot fail; an encoder error would be a bug in a label.
            tracing::error!(error = %e, "cannot encode the sidecar's metrics");
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::prom::parse_all;

    #[test]
    fn renders_valid_exposition_text() {
        let s = Stats::default();
        s.scrape_done("llama", "127.0.0.1:1", 0.003, None);
        s.scrape_done("llama", "127.0.0.1:1", 2.0, Some("timeout"));
        s.pod_health("llama", "127.0.0.1:1", "failing", 1);
        s.push_done("accepted", Some((7, 1000)));
        s.push_done("transport_error", None);
        let text = s.render(3500);
        let (samples, errors) = parse_all(&text);
        assert!(errors.is_empty(), "{errors:?}");
        let get = |name: &str, label: Option<(&str, &str)>| {
            samples
                .iter()
                .find(|x| {
                    x.name == name && label.is_none_or(|(k, v)| x.label(k).as_deref() == Some(v))
                })
                .map(|x| x.value)
        };
        assert_eq!(
            get("llm_router_sidecar_scrape_duration_seconds_count", None),
            Some(2.0)
        );
        assert_eq!(
            get(
                "llm_router_sidecar_scrape_duration_seconds_bucket",
                Some(("le", "0.005"))
            ),
            Some(1.0)
        );
        assert_eq!(
            get(
                "llm_router_sidecar_scrape_duration_seconds_bucket",
                Some(("le", "+Inf"))
            ),
            Some(2.0)
        );
        assert_eq!(
            get(
                "llm_router_sidecar_scrape_failures_total",
                Some(("kind", "timeout"))
            ),
            Some(1.0)
        );
        assert_eq!(
            get(
                "llm_router_sidecar_pushes_total",
                Some(("result", "accepted"))
            ),
            Some(1.0)
        );
        assert_eq!(
            get(
                "llm_router_sidecar_pushes_total",
                Some(("result", "transport_error"))
            ),
            Some(1.0)
        );
        assert_eq!(
            get("llm_router_sidecar_snapshot_age_seconds", None),
            Some(2.5)
        );
        assert_eq!(
            get("llm_router_sidecar_snapshot_generation", None),
            Some(7.0)
        );
        assert_eq!(
            get("llm_router_sidecar_pods", Some(("state", "failing"))),
            Some(1.0)
        );
        assert_eq!(s.summary().last_push_result, "transport_error");
    }

    /// Every sample belongs to a family announced by `# TYPE` with that type, as Prometheus
    /// expects of text format 0.0.4 (counters end in `_total`, histograms have their suffixes).
    #[test]
    fn samples_belong_to_typed_families() {
        let s = Stats::default();
        s.scrape_done("llama", "127.0.0.1:1", 0.02, Some("status"));
        s.pod_health("llama", "127.0.0.1:1", "ok", 0);
        s.snapshot_encoded(321);
        s.round_done(5);
        let text = s.render(10);
        let mut types = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut it = line.split_whitespace().skip(2);
            let (name, kind) = (it.next().unwrap(), it.next().unwrap());
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "{line}"
            );
        }
        let (samples, errors) = parse_all(&text);
        assert!(errors.is_empty(), "{errors:?}");
        for x in &samples {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suf| {
                    x.name
                        .strip_suffix(suf)
                        .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
                })
                .unwrap_or(x.name);
            let kind = types
                .get(family)
                .unwrap_or_else(|| panic!("no TYPE for {}", x.name));
            if kind == "counter" {
                assert!(family.ends_with("_total"), "{family}");
            }
            assert!(family.starts_with("llm_router_sidecar_"), "{family}");
        }
        for name in [
            "llm_router_sidecar_scrape_duration_seconds",
            "llm_router_sidecar_scrape_failures_total",
            "llm_router_sidecar_pods",
            "llm_router_sidecar_pushes_total",
            "llm_router_sidecar_snapshot_bytes",
            "llm_router_sidecar_scrape_rounds_total",
        ] {
            assert!(types.contains_key(name), "{name} missing:\n{text}");
        }
        let get = |name: &str| samples.iter().find(|x| x.name == name).map(|x| x.value);
        assert_eq!(get("llm_router_sidecar_snapshot_bytes"), Some(321.0));
        assert_eq!(get("llm_router_sidecar_scrape_rounds_total"), Some(1.0));
        // No push yet: every result is there at 0, and the age says "none".
        let pushes: Vec<_> = samples
            .iter()
            .filter(|x| x.name == "llm_router_sidecar_pushes_total")
            .collect();
        assert_eq!(pushes.len(), PUSH_RESULTS.len());
        assert!(pushes.iter().all(|x| x.value == 0.0));
        assert_eq!(get("llm_router_sidecar_snapshot_age_seconds"), Some(-1.0));
    }

    #[test]
    fn pods_by_state_and_forgotten_pods() {
        let s = Stats::default();
        for (pod, state) in [("a:1", "ok"), ("b:1", "ok"), ("c:1", "stale")] {
            s.scrape_done("llama", pod, 0.001, None);
            s.pod_health("llama", pod, state, 0);
        }
        s.scrape_done("qwen", "d:1", 0.001, None);
        let count = |text: &str, pool: &str, state: &str| {
            let (samples, _) = parse_all(text);
            samples
                .iter()
                .find(|x| {
                    x.name == "llm_router_sidecar_pods"
                        && x.label("pool").as_deref() == Some(pool)
                        && x.label("state").as_deref() == Some(state)
                })
                .map(|x| x.value)
        };
        let text = s.render(0);
        assert_eq!(count(&text, "llama", "ok"), Some(2.0));
        assert_eq!(count(&text, "llama", "stale"), Some(1.0));
        assert_eq!(count(&text, "qwen", "unknown"), Some(1.0));
        s.retain_pods(|pool, pod| pool == "llama" && pod != "a:1");
        let text = s.render(0);
        assert_eq!(count(&text, "llama", "ok"), Some(1.0));
        assert_eq!(count(&text, "qwen", "unknown"), None);
        assert!(!text.contains("pod=\"a:1\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let s = Stats::default();
        s.scrape_done("we\"ird\\pool", "127.0.0.1:1", 0.001, Some("timeout"));
        let text = s.render(0);
        let (samples, errors) = parse_all(&text);
        assert!(errors.is_empty(), "{errors:?}\n{text}");
        assert!(samples
            .iter()
            .any(|x| x.label("pool").as_deref() == Some("we\"ird\\pool")));
    }
}
