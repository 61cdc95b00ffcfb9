//! The configuration as the router uses it: every setting resolved to a value (the
//! configured one, else its default) and checked. [`Config::fallback_defaults`] holds the
//! defaults of the top-level settings; each section's type its own ([`Default`]).

use std::collections::HashMap;

use crate::priority::Class;
use crate::rewrite::Rewrites;
use crate::weights::Weights;

/// How prompt size and pod speed are estimated before the filter has learned them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictConfig {
    /// Characters per token when estimating prompt tokens from text (English ≈ 4).
    pub chars_per_token: f64,
    /// Prefill cost assumed for a pod until the filter has observed it (ms per token).
    pub prior_ms_per_token: f64,
    /// Fixed latency assumed likewise (ms).
    pub prior_base_ms: f64,
}

impl Default for PredictConfig {
    fn default() -> Self {
        // Priors only order pods until a few streamed requests have been observed; with every
        // pod at the prior, the ranking follows queued work alone. 0.2 ms/token ≈ 5,000 prompt
        // tokens/s, a mid-range GPU's prefill rate for an 8B model.
        PredictConfig {
            chars_per_token: 4.0,
            prior_ms_per_token: 0.2,
            prior_base_ms: 30.0,
        }
    }
}

/// What LoRA adapters cost, in the unit of predicted time to first token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraConfig {
    /// Loading an adapter that is not resident (ms): vLLM loads a rank-16 adapter of an 8B
    /// model from local disk in a few hundred ms, from its CPU cache in far less.
    pub load_ms: f64,
    /// Sending an adapter away from its home (ms): it takes a slot there, evicting another
    /// adapter that will have to be loaded again. The home keeps an adapter's requests until
    /// its predicted time to first token is this much worse than elsewhere.
    pub stray_ms: f64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            load_ms: 300.0,
            stray_ms: 500.0,
        }
    }
}

/// When a pool counts as saturated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saturation {
    /// Waiting requests at which a pod is saturated (GAIE: 5).
    pub queue_threshold: f64,
    /// KV-cache use at which a pod is saturated (GAIE: 0.8).
    pub kv_threshold: f64,
    /// Standard-priority requests are rejected only when the pool (the pods holding most of
    /// its capacity, `trust::pool_saturation`) is this many times past saturation (0 = never
    /// reject standard requests). Sheddable ones go at 1×.
    pub critical_factor: f64,
}

impl Default for Saturation {
    fn default() -> Self {
        Saturation {
            queue_threshold: 5.0,
            kv_threshold: 0.8,
            critical_factor: 10.0,
        }
    }
}

/// Prefix-affinity settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixConfig {
    /// Characters per hashed block (≈ 16 tokens of 4 characters, like vLLM's block size).
    pub block_chars: usize,
    /// Blocks hashed at most per prompt (GAIE: 256).
    pub max_blocks: usize,
    /// Slots of the shared prefix index per pool (bounded memory; collisions overwrite).
    pub index_slots: u32,
    /// Blocks per index page (one shared-data key per page of a prompt).
    pub page_blocks: usize,
    /// Pods (with how far they got) remembered per page.
    pub entries_per_page: usize,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            block_chars: 64,
            max_blocks: 256,
            index_slots: 65_536,
            page_blocks: 16,
            entries_per_page: 16,
        }
    }
}

/// Bounds of one priority class of one pool's queue (on one Envoy worker: each worker holds
/// the streams it paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandLimits {
    /// Requests waiting at most.
    pub max_requests: usize,
    /// Request body bytes held at most.
    pub max_bytes: usize,
    /// Longest wait (ms); then the request is refused with 429.
    pub ttl_ms: u64,
}

impl Default for BandLimits {
    fn default() -> Self {
        // llm-d's default TTL is 60 s; its per-band request bound is 5,000 per gateway. Here the
        // bound is per Envoy worker and the body is held in the VM's memory: 1,000 requests and
        // 64 MiB per class keep a worker's queue well inside a Wasm VM's memory.
        BandLimits {
            max_requests: 1000,
            max_bytes: 64 * 1024 * 1024,
            ttl_ms: 60_000,
        }
    }
}

/// The `flow` section of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowConfig {
    /// Hold requests while their pool is full (else every request is routed at once, the
    /// behaviour before flow control).
    pub enabled: bool,
    /// Bounds of a pool's whole queue (every class): when it is full, a request of a higher
    /// class than sheddable displaces the newest waiting sheddable one.
    pub max_requests: usize,
    pub max_bytes: usize,
    /// Per class, `[sheddable, standard, critical]`.
    pub bands: [BandLimits; 3],
    /// How often a worker with waiting requests tries to dispatch them (ms).
    pub tick_ms: u64,
    /// A worker's published queue summary older than this is ignored by the others (ms): a
    /// worker that stopped cannot hold the pool's order.
    pub summary_stale_ms: u64,
    /// Predicted KV use after admission up to which a pod takes held work. Above the pool's
    /// `saturation.kv_threshold` (0.8, where scoring calls a pod full and sheddable work goes):
    /// the engine itself admits until its KV is full, and holding at 0.8 left a fifth of a
    /// KV-limited fleet idle — bursty TTFT p95 2.3× round robin's with no preemption at all,
    /// 0.72× at 0.95 with half of round robin's preemptions, 0.80× and 9 preemptions a run at
    /// 1.0 (one sweep, one run each: `test-harness/bench/results/flow-v1-bursty.md`).
    pub kv_threshold: f64,
    /// After a fairness id's oldest waiting request has waited this long (ms), that id's
    /// newest request goes first: the queue is standing, not absorbing a burst (0: always first
    /// come first served; see [`crate::flow::queue`]).
    pub newest_first_after_ms: u64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            // On: below saturation nothing waits (shared prefix and mixed GPUs unchanged);
            // bursty p99 0.79× of placing at once, within the spread of single runs
            // (results/flow-v1-bursty.md).
            enabled: true,
            max_requests: 1000,
            max_bytes: 64 * 1024 * 1024,
            bands: [BandLimits::default(); 3],
            tick_ms: 20,
            summary_stale_ms: 1000,
            kv_threshold: 0.95,
            newest_first_after_ms: NEWEST_FIRST_AFTER_MS,
        }
    }
}

/// Enqueued before this, a request waiting at `now_ms` is standing, for a bound of `after_ms`
/// (0: nothing ever is).
pub(crate) fn standing_before(after_ms: u64, now_ms: u64) -> u64 {
    if after_ms == 0 {
        0
    } else {
        now_ms.saturating_sub(after_ms)
    }
}

/// Default of [`FlowConfig::newest_first_after_ms`]: 5 s, past the time-to-first-token
/// objectives interactive serving states (a few hundred ms to a few seconds) — a request that
/// has waited that long in the proxy alone has missed any of them, and served in arrival order
/// so would everything behind it — and far below the 60 s time to live. On real vLLM offered
/// 1.5× its capacity for 60 s (`vllm_uneven`) goodput within a 1 s TTFT was 0.50 requests/s
/// in arrival order, 9.03 and 2.00 in two runs with this order (round robin 0.78, the peers
/// 0.48–0.55 in the second); on model-sim's overload the proxy's queue never stood that long
/// and nothing changed (`test-harness/bench/results/flow-v4-newest-first.md`).
pub const NEWEST_FIRST_AFTER_MS: u64 = 5_000;

impl FlowConfig {
    /// Waiting requests enqueued before this are standing at `now_ms` (0: none can be).
    pub fn standing_before(&self, now_ms: u64) -> u64 {
        standing_before(self.newest_first_after_ms, now_ms)
    }

    pub fn limits(&self, class: Class) -> BandLimits {
        self.bands.get(class.index()).copied().unwrap_or_default()
    }
}

/// One pool of interchangeable pods behind one Envoy cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    pub cluster: String,
    pub weights: Weights,
    pub saturation: Saturation,
    pub prefix: PrefixConfig,
    pub predict: PredictConfig,
    pub lora: LoraConfig,
}

/// What a model name from a request resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    /// Index into [`Config::pools`].
    pub pool: usize,
    /// Replace the body's `model` with this name before forwarding.
    pub rewrite: Option<String>,
    /// The name is a LoRA adapter served on the pool's base model.
    pub adapter: bool,
}

/// What to do when the snapshot is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStale {
    /// Keep the last pod list and rank by the filter's own in-flight counts (and prefix).
    LeastInflight,
    /// Set no endpoint: Envoy's fallback policy (round robin) chooses.
    Fallback,
    /// Answer 503.
    Reject,
}

/// What to do before any snapshot arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMissing {
    /// Set no endpoint: Envoy's fallback policy chooses.
    Fallback,
    /// Answer 503.
    Reject,
}

/// Snapshot push endpoint and freshness policy.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotConfig {
    pub push_path: String,
    pub state_path: String,
    /// Where the sidecar reads this proxy's tally (`llm_router_snapshot::Tally`: its requests
    /// in flight and pending prompt tokens per pod), which it sends to a metrics hub so other
    /// gateway replicas count this one's work.
    pub tally_path: String,
    /// This filter instance serves `push_path`, `state_path` and `tally_path` (meant for the
    /// instance on a loopback-bound internal listener). Off (the default), they answer 404.
    pub endpoints: bool,
    /// The HMAC-SHA256 key pushes are signed with; required when `endpoints` is on. From
    /// `secret`, or read from the environment variable `secret_env` names at load time.
    pub secret: String,
    pub stale_after_ms: u64,
    pub on_stale: OnStale,
    pub on_missing: OnMissing,
    /// Largest snapshot accepted, in bytes.
    pub max_bytes: usize,
}

/// The whole, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub pools: Vec<PoolConfig>,
    /// Model name → route, from the configuration (the snapshot may add more at run time).
    pub models: HashMap<String, ModelRoute>,
    /// Defaults for pools that only the snapshot names.
    pub default_pool: PoolConfig,
    pub cluster_header: String,
    pub endpoint_header: String,
    pub served_header: String,
    pub reason_header: String,
    pub rewrite_header: String,
    pub priority_header: String,
    /// Objective name (header `x-gateway-inference-objective`) → priority.
    pub objectives: HashMap<String, i32>,
    pub objective_header: String,
    pub top_k: usize,
    pub max_body_bytes: usize,
    /// Bounds of the `Retry-After` of a saturated pool (seconds): the estimated drain time of
    /// the least loaded pod's queue, at least `retry_after_s`, at most `retry_after_max_s`.
    pub retry_after_s: u32,
    pub retry_after_max_s: u32,
    pub snapshot: SnapshotConfig,
    /// Whether client-supplied priority headers count.
    pub priority: PriorityConfig,
    /// Add `scores_header` to routed responses: every scored pod's score (debugging aid, off by
    /// default: it tells clients about the fleet).
    pub debug_scores: bool,
    pub scores_header: String,
    /// What clients are told about the fleet.
    pub disclose: Disclose,
    /// What happens to a request on a path the filter does not route.
    pub unknown_paths: UnknownPaths,
    /// Canary and weighted model rewrites (`rewrites`), checked against `pools` and `models`.
    pub rewrites: Rewrites,
    /// Response header naming the model a rewrite rule chose (the served name).
    pub served_model_header: String,
    /// Holding requests while their pool is full ([`crate::flow`]).
    pub flow: FlowConfig,
}

/// llm-d's objective header; read before the configured `objective_header`.
pub const LLMD_OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// A request's time-to-first-token objective in ms (llm-d's SLO-aware scheduling header): a
/// request held while its pool is full is refused with 429 once it can no longer meet it,
/// instead of at its class's time to live ([`crate::flow::queue`]). Read from any client: it
/// only shortens that client's own wait.
pub const SLO_TTFT_HEADER: &str = "x-slo-ttft-ms";

/// The objective of [`SLO_TTFT_HEADER`], when it is a number of ms from 1 ms to an hour.
pub fn slo_ttft_ms(value: &str) -> Option<u64> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| (1..=3_600_000).contains(ms))
}

/// Fairness id (tenant) headers, llm-d's first, then the older GAIE name.
pub const FAIRNESS_HEADERS: [&str; 2] = [
    "x-llm-d-inference-fairness-id",
    "x-gateway-inference-fairness-id",
];

/// What the filter does with a request on a path that is neither an API path it routes, the
/// model list, nor a snapshot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownPaths {
    /// Let it through untouched (routing headers stripped): for a filter that shares its
    /// listener with other routes.
    #[default]
    Pass,
    /// Answer 404 `not_found`: for a filter that is the last word on its listener, so nothing
    /// reaches a pool unrouted.
    Reject,
}

/// What the filter tells clients about the pods and pools behind it. Both off by default: a
/// public listener should not hand strangers pod addresses or the health of its pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Disclose {
    /// Set `served_header` (the `ip:port` of the pod that served) on routed responses.
    pub served_pod: bool,
    /// Name the pool and say why it has no usable pod in 429 / 503 error bodies.
    pub pool_detail: bool,
}

/// Who may set a request's priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PriorityConfig {
    /// Read `priority_header` and `objective_header` (mapped through `objectives`). Off (the
    /// default), both are ignored and every request is standard: clients must not exempt
    /// themselves from shedding. Turn on only when a trusted filter before this one sets or
    /// strips those headers.
    pub trust_headers: bool,
}

impl Config {
    /// What every setting falls back to: the configuration an empty object resolves to.
    pub(super) fn fallback_defaults() -> Config {
        let pool = PoolConfig {
            name: String::new(),
            cluster: String::new(),
            weights: Weights::default_preset(),
            saturation: Saturation::default(),
            prefix: PrefixConfig::default(),
            predict: PredictConfig::default(),
            lora: LoraConfig::default(),
        };
        Config {
            pools: Vec::new(),
            models: HashMap::new(),
            default_pool: pool,
            cluster_header: "x-llm-router-cluster".into(),
            endpoint_header: "x-gateway-destination-endpoint".into(),
            served_header: "x-gateway-destination-endpoint-served".into(),
            reason_header: "x-llm-router-dropped-reason".into(),
            rewrite_header: "x-gateway-model-name-rewrite".into(),
            priority_header: "x-llm-router-priority".into(),
            objectives: HashMap::new(),
            objective_header: "x-gateway-inference-objective".into(),
            top_k: 3,
            // Just under Envoy's default 1 MiB stream buffer, so an oversized body gets this
            // filter's OpenAI-style 413 rather than Envoy's plain-text one. Raise both together
            // (listener `per_connection_buffer_limit_bytes`).
            max_body_bytes: 1_000_000,
            retry_after_s: 1,
            retry_after_max_s: 30,
            snapshot: SnapshotConfig {
                push_path: "/__llm_router/snapshot".into(),
                state_path: "/__llm_router/state".into(),
                tally_path: "/__llm_router/tally".into(),
                endpoints: false,
                secret: String::new(),
                stale_after_ms: 3000,
                on_stale: OnStale::LeastInflight,
                on_missing: OnMissing::Fallback,
                max_bytes: 4 * 1024 * 1024,
            },
            priority: PriorityConfig::default(),
            debug_scores: false,
            scores_header: "x-llm-router-scores".into(),
            disclose: Disclose::default(),
            unknown_paths: UnknownPaths::Pass,
            rewrites: Rewrites::default(),
            served_model_header: "x-llm-router-served-model".into(),
            flow: FlowConfig::default(),
        }
    }

    /// A request's priority from its `priority_header` and `objective_header` values (the
    /// objective through `objectives`); 0 (standard) unless `priority.trust_headers` is on.
    pub fn request_priority(&self, priority: Option<&str>, objective: Option<&str>) -> i32 {
        self.request_priority_with(priority, objective, |o| self.objectives.get(o).copied())
    }

    /// As [`Config::request_priority`], the objective's priority looked up by `objectives`
    /// (the snapshot's objectives where it carries them, `crate::router::Router::request_priority`).
    pub fn request_priority_with(
        &self,
        priority: Option<&str>,
        objective: Option<&str>,
        objectives: impl Fn(&str) -> Option<i32>,
    ) -> i32 {
        if !self.priority.trust_headers {
            return 0;
        }
        priority
            .and_then(|p| p.trim().parse::<i32>().ok())
            .or_else(|| objective.and_then(objectives))
            .unwrap_or(0)
    }

    /// The fairness id of a request from its fairness headers ([`FAIRNESS_HEADERS`], the first
    /// present), where the configuration trusts client headers; else every request shares one
    /// id (empty).
    pub fn fairness_id<'a>(&self, values: impl IntoIterator<Item = Option<&'a str>>) -> &'a str {
        if !self.priority.trust_headers {
            return "";
        }
        values.into_iter().flatten().next().unwrap_or("")
    }

    /// The configured pool with this name.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The LoRA adapters the configuration lists for the pool named `pool`.
    pub fn adapters_of(&self, pool: &str) -> Vec<String> {
        let Some(index) = self.pools.iter().position(|p| p.name == pool) else {
            return Vec::new();
        };
        self.models
            .iter()
            .filter(|(_, r)| r.adapter && r.pool == index)
            .map(|(name, _)| name.clone())
            .collect()
    }
}
