//! The filter's plugin configuration: parsed from the JSON that Envoy hands the filter, checked
//! once at load time, and turned into the resolved form the router uses per request.
//!
//! Every mistake is reported with the JSON path of the field and what was expected, so a bad
//! configuration fails at load with one clear log line instead of misrouting traffic later.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// A configuration problem, with the path of the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid llm-router configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

use crate::priority::Class;
use crate::rewrite::{Rewrites, Rule, Sticky, Target};
pub use crate::weights::Weights;

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

impl Default for Config {
    fn default() -> Self {
        // An empty object is a valid configuration; this cannot fail.
        Config::from_raw(RawConfig::default(), &|_| None)
            .unwrap_or_else(|_| Config::fallback_defaults())
    }
}

// ---- the JSON shape ------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    pools: Vec<RawPool>,
    cluster_header: Option<String>,
    endpoint_header: Option<String>,
    served_header: Option<String>,
    reason_header: Option<String>,
    rewrite_header: Option<String>,
    priority_header: Option<String>,
    objective_header: Option<String>,
    #[serde(default)]
    objectives: HashMap<String, i32>,
    top_k: Option<usize>,
    max_body_bytes: Option<usize>,
    retry_after_s: Option<u32>,
    retry_after_max_s: Option<u32>,
    snapshot: Option<RawSnapshot>,
    /// Applied to pools that appear only in the snapshot.
    defaults: Option<RawPoolTuning>,
    priority: Option<RawPriority>,
    debug_scores: Option<bool>,
    scores_header: Option<String>,
    disclose: Option<RawDisclose>,
    unknown_paths: Option<String>,
    #[serde(default)]
    rewrites: Vec<RawRewrite>,
    served_model_header: Option<String>,
    flow: Option<RawFlow>,
}

/// One `InferenceModelRewrite`-like rule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRewrite {
    model: String,
    targets: Vec<RawTarget>,
    sticky: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    model: String,
    /// Default 1.
    weight: Option<u32>,
    /// The pool serving `model` when `model` is not a configured model name.
    pool: Option<String>,
}

/// Largest weight of a rewrite target (weights are relative).
pub const MAX_REWRITE_WEIGHT: u32 = 1_000_000;

/// Checks the rules and resolves each target's pool: a configured model name (its pool and
/// adapter flag), or a `pool` that is configured.
fn rewrites(
    raw: &[RawRewrite],
    pools: &[PoolConfig],
    models: &HashMap<String, ModelRoute>,
) -> Result<Rewrites, ConfigError> {
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let path = format!("rewrites[{i}]");
        if r.model.is_empty() {
            return err(format!("{path}.model: must not be empty"));
        }
        if rules.iter().any(|q| q.model == r.model) {
            return err(format!(
                "{path}.model: {:?} already has a rule (one rule per model name)",
                r.model
            ));
        }
        if r.targets.is_empty() {
            return err(format!("{path}.targets: at least one target is needed"));
        }
        let sticky = match r.sticky.as_deref() {
            None | Some("none") => Sticky::None,
            Some("conversation") => Sticky::Conversation,
            Some(o) => {
                return err(format!(
                    "{path}.sticky: {o:?} is not one of none, conversation"
                ))
            }
        };
        let mut targets = Vec::with_capacity(r.targets.len());
        for (j, t) in r.targets.iter().enumerate() {
            let tpath = format!("{path}.targets[{j}]");
            if t.model.is_empty() {
                return err(format!("{tpath}.model: must not be empty"));
            }
            let weight = t.weight.unwrap_or(1);
            if weight > MAX_REWRITE_WEIGHT {
                return err(format!(
                    "{tpath}.weight: {weight} must be in 0..={MAX_REWRITE_WEIGHT}"
                ));
            }
            let route = models.get(&t.model);
            let (pool, adapter) = match (&t.pool, route) {
                (Some(name), _) => {
                    let Some(p) = pools.iter().position(|p| &p.name == name) else {
                        return err(format!("{tpath}.pool: {name:?} is not a configured pool"));
                    };
                    // The served name's own entry says whether it is an adapter there.
                    let adapter = route.is_some_and(|m| m.pool == p && m.adapter);
                    (p, adapter)
                }
                (None, Some(m)) => (m.pool, m.adapter),
                (None, None) => {
                    return err(format!(
                        "{tpath}.model: {:?} is not a configured model name; list it in a \
                         pool's models or adapters, or give the target a pool",
                        t.model
                    ))
                }
            };
            targets.push(Target {
                model: t.model.clone(),
                pool,
                adapter,
                weight,
            });
        }
        if targets.iter().all(|t| t.weight == 0) {
            return err(format!(
                "{path}.targets: the weights sum to 0; at least one must be above 0"
            ));
        }
        rules.push(Rule {
            model: r.model.clone(),
            targets,
            sticky,
            salt: 0,
        });
    }
    Ok(Rewrites { rules })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFlow {
    enabled: Option<bool>,
    max_requests: Option<usize>,
    max_bytes: Option<usize>,
    tick_ms: Option<u64>,
    summary_stale_ms: Option<u64>,
    kv_threshold: Option<f64>,
    newest_first_after_ms: Option<u64>,
    bands: Option<RawBands>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBands {
    sheddable: Option<RawBand>,
    standard: Option<RawBand>,
    critical: Option<RawBand>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawBand {
    max_requests: Option<usize>,
    max_bytes: Option<usize>,
    ttl_ms: Option<u64>,
}

fn flow_config(raw: Option<RawFlow>) -> Result<FlowConfig, ConfigError> {
    let mut out = FlowConfig::default();
    let Some(raw) = raw else {
        return Ok(out);
    };
    out.enabled = raw.enabled.unwrap_or(out.enabled);
    let positive = |name: &str, v: Option<usize>, slot: &mut usize| -> Result<(), ConfigError> {
        if let Some(v) = v {
            if v == 0 {
                return err(format!("{name}: must be above 0"));
            }
            *slot = v;
        }
        Ok(())
    };
    positive("flow.max_requests", raw.max_requests, &mut out.max_requests)?;
    positive("flow.max_bytes", raw.max_bytes, &mut out.max_bytes)?;
    if let Some(t) = raw.tick_ms {
        if !(1..=1000).contains(&t) {
            return err(format!("flow.tick_ms: {t} must be in 1..=1000"));
        }
        out.tick_ms = t;
    }
    if let Some(t) = raw.summary_stale_ms {
        if t < out.tick_ms.saturating_mul(2) {
            return err(format!(
                "flow.summary_stale_ms: {t} must be at least twice flow.tick_ms ({})",
                out.tick_ms
            ));
        }
        out.summary_stale_ms = t;
    }
    if let Some(t) = raw.newest_first_after_ms {
        out.newest_first_after_ms = t;
    }
    if let Some(k) = raw.kv_threshold {
        if !(k > 0.0 && k <= 1.0) {
            return err(format!("flow.kv_threshold: {k} must be in (0, 1]"));
        }
        out.kv_threshold = k;
    }
    let bands = raw.bands.unwrap_or_default();
    for (class, b) in [
        (Class::Sheddable, bands.sheddable),
        (Class::Standard, bands.standard),
        (Class::Critical, bands.critical),
    ] {
        let Some(b) = b else { continue };
        let Some(slot) = out.bands.get_mut(class.index()) else {
            continue;
        };
        let path = format!("flow.bands.{}", class.name());
        positive(
            &format!("{path}.max_requests"),
            b.max_requests,
            &mut slot.max_requests,
        )?;
        positive(
            &format!("{path}.max_bytes"),
            b.max_bytes,
            &mut slot.max_bytes,
        )?;
        if let Some(t) = b.ttl_ms {
            if t == 0 {
                return err(format!("{path}.ttl_ms: must be above 0"));
            }
            slot.ttl_ms = t;
        }
    }
    Ok(out)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDisclose {
    served_pod: Option<bool>,
    pool_detail: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPriority {
    trust_headers: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: String,
    cluster: Option<String>,
    /// Names or `{name, rewrite, adapter}` objects; checked field by field in [`raw_model`].
    #[serde(default)]
    models: Vec<serde_json::Value>,
    #[serde(default)]
    adapters: Vec<String>,
    preset: Option<String>,
    weights: Option<RawWeights>,
    saturation: Option<RawSaturation>,
    prefix: Option<RawPrefix>,
    predict: Option<RawPredict>,
    lora: Option<RawLora>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawPoolTuning {
    preset: Option<String>,
    weights: Option<RawWeights>,
    saturation: Option<RawSaturation>,
    prefix: Option<RawPrefix>,
    predict: Option<RawPredict>,
    lora: Option<RawLora>,
}

enum RawModel {
    Name(String),
    Full(RawModelFull),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelFull {
    name: String,
    rewrite: Option<String>,
    #[serde(default)]
    adapter: bool,
}

/// Largest weight a scorer may get (weights are relative; the bound keeps their sum finite).
pub const MAX_WEIGHT: f64 = 1_000_000.0;

const MODEL_FIELDS: [&str; 3] = ["name", "rewrite", "adapter"];

/// One entry of a pool's `models`: a name, or an object whose every field is known (a typo such
/// as `rewrit` is an error naming its path, not a silently ignored field).
fn raw_model(path: &str, v: &serde_json::Value) -> Result<RawModel, ConfigError> {
    match v {
        serde_json::Value::String(name) => Ok(RawModel::Name(name.clone())),
        serde_json::Value::Object(map) => {
            if let Some(key) = map.keys().find(|k| !MODEL_FIELDS.contains(&k.as_str())) {
                return err(format!(
                    "{path}.{key}: unknown field, expected one of name, rewrite, adapter"
                ));
            }
            serde_json::from_value(v.clone())
                .map(RawModel::Full)
                .map_err(|e| ConfigError(format!("{path}: {e}")))
        }
        other => err(format!(
            "{path}: expected a model name or an object with name, rewrite, adapter; got {other}"
        )),
    }
}

/// Scorer name → weight; names are checked against the scorer registry.
type RawWeights = BTreeMap<String, f64>;

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawLora {
    load_ms: Option<f64>,
    stray_ms: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawPredict {
    chars_per_token: Option<f64>,
    prior_ms_per_token: Option<f64>,
    prior_base_ms: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawSaturation {
    queue_threshold: Option<f64>,
    kv_threshold: Option<f64>,
    critical_factor: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawPrefix {
    block_chars: Option<usize>,
    max_blocks: Option<usize>,
    index_slots: Option<u32>,
    page_blocks: Option<usize>,
    entries_per_page: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSnapshot {
    push_path: Option<String>,
    state_path: Option<String>,
    tally_path: Option<String>,
    endpoints: Option<bool>,
    secret: Option<String>,
    /// The name of an environment variable holding the secret (Envoy passes it into the VM with
    /// `vm_config.environment_variables.host_env_keys`).
    secret_env: Option<String>,
    /// Removed (pushes are signed now); kept only to say so when a configuration sets it.
    secret_header: Option<String>,
    stale_after_ms: Option<u64>,
    on_stale: Option<String>,
    on_missing: Option<String>,
    max_bytes: Option<usize>,
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

fn header_name(path: &str, v: Option<String>, default: &str) -> Result<String, ConfigError> {
    let v = v.unwrap_or_else(|| default.to_string());
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !ok {
        return err(format!(
            "{path}: {v:?} is not a lower-case HTTP header name"
        ));
    }
    Ok(v)
}

fn tuning(path: &str, base: &PoolConfig, t: &RawPoolTuning) -> Result<PoolConfig, ConfigError> {
    let mut out = base.clone();
    if let Some(p) = &t.preset {
        out.weights = match Weights::preset(p) {
            Some(w) => w,
            None => {
                let names: Vec<&str> = crate::weights::PRESETS.iter().map(|(n, _)| *n).collect();
                return err(format!(
                    "{path}.preset: {p:?} is not one of {}",
                    names.join(", ")
                ));
            }
        };
    }
    if let Some(w) = &t.weights {
        for (name, &v) in w {
            let Some(i) = Weights::index(name) else {
                return err(format!(
                    "{path}.weights.{name}: unknown scorer (one of {})",
                    Weights::names()
                ));
            };
            // Weights are relative; the bound keeps their sum (the mean's divisor) finite.
            if !(0.0..=MAX_WEIGHT).contains(&v) {
                return err(format!(
                    "{path}.weights.{name}: {v} must be a number in 0..={MAX_WEIGHT}"
                ));
            }
            if let Some(slot) = out.weights.0.get_mut(i) {
                *slot = v;
            }
        }
        if out.weights.0.iter().sum::<f64>() <= 0.0 {
            return err(format!(
                "{path}.weights: at least one weight must be above 0"
            ));
        }
    }
    if let Some(l) = t.lora {
        for (name, v, slot) in [
            ("load_ms", l.load_ms, &mut out.lora.load_ms),
            ("stray_ms", l.stray_ms, &mut out.lora.stray_ms),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return err(format!("{path}.lora.{name}: {v} must be >= 0"));
                }
                *slot = v;
            }
        }
    }
    if let Some(p) = t.predict {
        let positive = |name: &str, v: Option<f64>, slot: &mut f64| -> Result<(), ConfigError> {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return err(format!("{path}.predict.{name}: {v} must be > 0"));
                }
                *slot = v;
            }
            Ok(())
        };
        positive(
            "chars_per_token",
            p.chars_per_token,
            &mut out.predict.chars_per_token,
        )?;
        positive(
            "prior_ms_per_token",
            p.prior_ms_per_token,
            &mut out.predict.prior_ms_per_token,
        )?;
        if let Some(b) = p.prior_base_ms {
            if !(b.is_finite() && b >= 0.0) {
                return err(format!("{path}.predict.prior_base_ms: {b} must be >= 0"));
            }
            out.predict.prior_base_ms = b;
        }
    }
    if let Some(s) = t.saturation {
        if let Some(q) = s.queue_threshold {
            if !(q.is_finite() && q > 0.0) {
                return err(format!(
                    "{path}.saturation.queue_threshold: {q} must be > 0"
                ));
            }
            out.saturation.queue_threshold = q;
        }
        if let Some(k) = s.kv_threshold {
            if !(k.is_finite() && k > 0.0 && k <= 1.0) {
                return err(format!(
                    "{path}.saturation.kv_threshold: {k} must be in (0, 1]"
                ));
            }
            out.saturation.kv_threshold = k;
        }
        if let Some(c) = s.critical_factor {
            if !(c.is_finite() && (c == 0.0 || c >= 1.0)) {
                return err(format!(
                    "{path}.saturation.critical_factor: {c} must be 0 (never) or >= 1"
                ));
            }
            out.saturation.critical_factor = c;
        }
    }
    if let Some(p) = t.prefix {
        if let Some(b) = p.block_chars {
            if !(4..=65_536).contains(&b) {
                return err(format!(
                    "{path}.prefix.block_chars: {b} must be in 4..=65536"
                ));
            }
            out.prefix.block_chars = b;
        }
        if let Some(m) = p.max_blocks {
            if m > 4096 {
                return err(format!(
                    "{path}.prefix.max_blocks: {m} must be at most 4096 (0 disables)"
                ));
            }
            out.prefix.max_blocks = m;
        }
        if let Some(s) = p.index_slots {
            if !(16..=4_194_304).contains(&s) {
                return err(format!(
                    "{path}.prefix.index_slots: {s} must be in 16..=4194304"
                ));
            }
            out.prefix.index_slots = s;
        }
        if let Some(n) = p.page_blocks {
            if !(1..=255).contains(&n) {
                return err(format!("{path}.prefix.page_blocks: {n} must be in 1..=255"));
            }
            out.prefix.page_blocks = n;
        }
        if let Some(n) = p.entries_per_page {
            if !(1..=255).contains(&n) {
                return err(format!(
                    "{path}.prefix.entries_per_page: {n} must be in 1..=255"
                ));
            }
            out.prefix.entries_per_page = n;
        }
    }
    Ok(out)
}

impl Config {
    /// Parses the plugin configuration. Empty input (no configuration) means all defaults.
    /// `snapshot.secret_env` is read from the process environment (in Envoy: the variables
    /// `vm_config.environment_variables` passes into the VM).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse_with_env(bytes, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with `env` as the environment.
    pub fn parse_with_env(
        bytes: &[u8],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let trimmed = bytes.iter().position(|b| !b.is_ascii_whitespace());
        if trimmed.is_none() {
            return Config::from_raw(RawConfig::default(), env);
        }
        let raw: RawConfig = serde_json::from_slice(bytes)
            .map_err(|e| ConfigError(format!("not valid configuration JSON: {e}")))?;
        Config::from_raw(raw, env)
    }

    fn fallback_defaults() -> Config {
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

    fn from_raw(
        raw: RawConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let base = Config::fallback_defaults();
        let default_pool = match &raw.defaults {
            Some(t) => tuning("defaults", &base.default_pool, t)?,
            None => base.default_pool.clone(),
        };
        let mut pools = Vec::with_capacity(raw.pools.len());
        let mut models: HashMap<String, ModelRoute> = HashMap::new();
        for (i, p) in raw.pools.iter().enumerate() {
            let path = format!("pools[{i}]");
            if p.name.is_empty() {
                return err(format!("{path}.name: must not be empty"));
            }
            if pools.iter().any(|q: &PoolConfig| q.name == p.name) {
                return err(format!("{path}.name: pool {:?} is defined twice", p.name));
            }
            let cluster = p.cluster.clone().unwrap_or_else(|| p.name.clone());
            if cluster.is_empty() {
                return err(format!("{path}.cluster: must not be empty"));
            }
            let t = RawPoolTuning {
                preset: p.preset.clone(),
                weights: p.weights.clone(),
                saturation: p.saturation,
                prefix: p.prefix,
                predict: p.predict,
                lora: p.lora,
            };
            let mut pool = tuning(&path, &default_pool, &t)?;
            pool.name = p.name.clone();
            pool.cluster = cluster;
            let mut add =
                |name: &str, route: ModelRoute, where_: String| -> Result<(), ConfigError> {
                    if name.is_empty() {
                        return err(format!("{where_}: model name must not be empty"));
                    }
                    if let Some(prev) = models.get(name) {
                        let other = raw
                            .pools
                            .get(prev.pool)
                            .map(|q| q.name.as_str())
                            .unwrap_or("?");
                        return err(format!(
                            "{where_}: model {name:?} is already mapped to pool {other:?}"
                        ));
                    }
                    models.insert(name.to_string(), route);
                    Ok(())
                };
            for (j, m) in p.models.iter().enumerate() {
                let m = raw_model(&format!("{path}.models[{j}]"), m)?;
                let (name, rewrite, adapter) = match &m {
                    RawModel::Name(n) => (n.as_str(), None, false),
                    RawModel::Full(f) => (f.name.as_str(), f.rewrite.clone(), f.adapter),
                };
                if rewrite.as_deref() == Some("") {
                    return err(format!("{path}.models[{j}].rewrite: must not be empty"));
                }
                add(
                    name,
                    ModelRoute {
                        pool: i,
                        rewrite,
                        adapter,
                    },
                    format!("{path}.models[{j}]"),
                )?;
            }
            for (j, a) in p.adapters.iter().enumerate() {
                add(
                    a,
                    ModelRoute {
                        pool: i,
                        rewrite: None,
                        adapter: true,
                    },
                    format!("{path}.adapters[{j}]"),
                )?;
            }
            pools.push(pool);
        }
        let top_k = raw.top_k.unwrap_or(base.top_k);
        if !(1..=32).contains(&top_k) {
            return err(format!("top_k: {top_k} must be in 1..=32"));
        }
        let max_body_bytes = raw.max_body_bytes.unwrap_or(base.max_body_bytes);
        if max_body_bytes < 1024 {
            return err(format!(
                "max_body_bytes: {max_body_bytes} must be at least 1024"
            ));
        }
        let retry_after_s = raw.retry_after_s.unwrap_or(base.retry_after_s);
        let retry_after_max_s = raw.retry_after_max_s.unwrap_or(base.retry_after_max_s);
        if retry_after_max_s < retry_after_s {
            return err(format!(
                "retry_after_max_s: {retry_after_max_s} must be >= retry_after_s ({retry_after_s})"
            ));
        }
        let unknown_paths = match raw.unknown_paths.as_deref() {
            None => base.unknown_paths,
            Some("pass") => UnknownPaths::Pass,
            Some("reject") => UnknownPaths::Reject,
            Some(o) => return err(format!("unknown_paths: {o:?} is not one of pass, reject")),
        };
        let rewrites = rewrites(&raw.rewrites, &pools, &models)?;
        let s = raw.snapshot.unwrap_or_default();
        let path_ok = |p: &str| p.starts_with('/') && !p.contains(['?', '#', ' ']);
        let push_path = s.push_path.unwrap_or(base.snapshot.push_path.clone());
        let state_path = s.state_path.unwrap_or(base.snapshot.state_path.clone());
        let tally_path = s.tally_path.unwrap_or(base.snapshot.tally_path.clone());
        for (name, p) in [
            ("snapshot.push_path", &push_path),
            ("snapshot.state_path", &state_path),
            ("snapshot.tally_path", &tally_path),
        ] {
            if !path_ok(p) {
                return err(format!(
                    "{name}: {p:?} must be an absolute path without query"
                ));
            }
        }
        let on_stale = match s.on_stale.as_deref() {
            None | Some("least_inflight") => OnStale::LeastInflight,
            Some("fallback") => OnStale::Fallback,
            Some("reject") => OnStale::Reject,
            Some(o) => {
                return err(format!(
                    "snapshot.on_stale: {o:?} is not one of least_inflight, fallback, reject"
                ))
            }
        };
        let on_missing = match s.on_missing.as_deref() {
            None | Some("fallback") => OnMissing::Fallback,
            Some("reject") => OnMissing::Reject,
            Some(o) => {
                return err(format!(
                    "snapshot.on_missing: {o:?} is not one of fallback, reject"
                ))
            }
        };
        let stale_after_ms = s.stale_after_ms.unwrap_or(base.snapshot.stale_after_ms);
        if stale_after_ms == 0 {
            return err("snapshot.stale_after_ms: must be above 0");
        }
        if s.secret_header.is_some() {
            return err(
                "snapshot.secret_header: no longer used: pushes are signed with HMAC-SHA256 of \
                 snapshot.secret in x-llm-router-signature; remove the field",
            );
        }
        let endpoints = s.endpoints.unwrap_or(base.snapshot.endpoints);
        let secret =
            match (s.secret, s.secret_env) {
                (Some(_), Some(_)) => return err(
                    "snapshot.secret, snapshot.secret_env: set one of them, not both (secret_env \
                     names the environment variable holding the secret)",
                ),
                (Some(literal), None) => {
                    if !literal.is_empty() {
                        if let Err(why) = llm_router_snapshot::check_secret(&literal) {
                            return err(format!("snapshot.secret: {why}"));
                        }
                    }
                    literal
                }
                (None, Some(name)) => {
                    // A portable variable name (letters, digits, `_`): nothing that could
                    // trouble the host's environment lookup, no `=` or NUL.
                    let portable = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if name.is_empty() || !portable {
                        return err(format!(
                            "snapshot.secret_env: {name:?} must name an environment variable \
                             (letters, digits and _)"
                        ));
                    }
                    // A trailing line end is not part of the secret: a Kubernetes Secret made
                    // from a file often ends in one, and the sidecar, reading the same Secret as
                    // a mounted file, drops it too (both sides must key the HMAC alike).
                    let value = env(&name)
                        .unwrap_or_default()
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    if value.is_empty() {
                        return err(format!(
                        "snapshot.secret_env: environment variable {name} is not set or empty in \
                         the Wasm VM (Envoy passes it only when it is listed in \
                         vm_config.environment_variables.host_env_keys and set in Envoy's own \
                         environment, e.g. from a Kubernetes Secret)"
                    ));
                    }
                    if let Err(why) = llm_router_snapshot::check_secret(&value) {
                        return err(format!(
                            "snapshot.secret_env: environment variable {name}: {why}"
                        ));
                    }
                    value
                }
                (None, None) => String::new(),
            };
        if endpoints && secret.is_empty() {
            return err(
                "snapshot.secret: must be set (or snapshot.secret_env) when snapshot.endpoints \
                 is true",
            );
        }
        let mut rewrites = rewrites;
        let salt = crate::rewrite::sticky_salt(&secret);
        for rule in &mut rewrites.rules {
            rule.salt = salt;
        }
        let snapshot = SnapshotConfig {
            push_path,
            state_path,
            tally_path,
            endpoints,
            secret,
            stale_after_ms,
            on_stale,
            on_missing,
            max_bytes: s.max_bytes.unwrap_or(base.snapshot.max_bytes),
        };
        Ok(Config {
            pools,
            models,
            default_pool,
            cluster_header: header_name(
                "cluster_header",
                raw.cluster_header,
                &base.cluster_header,
            )?,
            endpoint_header: header_name(
                "endpoint_header",
                raw.endpoint_header,
                &base.endpoint_header,
            )?,
            served_header: header_name("served_header", raw.served_header, &base.served_header)?,
            reason_header: header_name("reason_header", raw.reason_header, &base.reason_header)?,
            rewrite_header: header_name(
                "rewrite_header",
                raw.rewrite_header,
                &base.rewrite_header,
            )?,
            priority_header: header_name(
                "priority_header",
                raw.priority_header,
                &base.priority_header,
            )?,
            objective_header: header_name(
                "objective_header",
                raw.objective_header,
                &base.objective_header,
            )?,
            objectives: raw.objectives,
            top_k,
            max_body_bytes,
            retry_after_s,
            retry_after_max_s,
            snapshot,
            priority: PriorityConfig {
                trust_headers: raw
                    .priority
                    .and_then(|p| p.trust_headers)
                    .unwrap_or(base.priority.trust_headers),
            },
            debug_scores: raw.debug_scores.unwrap_or(base.debug_scores),
            scores_header: header_name("scores_header", raw.scores_header, &base.scores_header)?,
            disclose: {
                let d = raw.disclose.unwrap_or_default();
                Disclose {
                    served_pod: d.served_pod.unwrap_or(base.disclose.served_pod),
                    pool_detail: d.pool_detail.unwrap_or(base.disclose.pool_detail),
                }
            },
            unknown_paths,
            rewrites,
            served_model_header: header_name(
                "served_model_header",
                raw.served_model_header,
                &base.served_model_header,
            )?,
            flow: flow_config(raw.flow)?,
        })
    }

    /// A request's priority from its `priority_header` and `objective_header` values (the
    /// objective through `objectives`); 0 (standard) unless `priority.trust_headers` is on.
    pub fn request_priority(&self, priority: Option<&str>, objective: Option<&str>) -> i32 {
        if !self.priority.trust_headers {
            return 0;
        }
        priority
            .and_then(|p| p.trim().parse::<i32>().ok())
            .or_else(|| objective.and_then(|o| self.objectives.get(o).copied()))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn error_of(json: &str) -> String {
        Config::parse(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn the_readmes_configuration_reference_parses() {
        let readme = include_str!("../../README.md");
        let reference = readme
            .split("## Configuration reference")
            .nth(1)
            .and_then(|rest| rest.split("```json\n").nth(1))
            .and_then(|block| block.split("```").next())
            .unwrap_or_default();
        assert!(
            !reference.is_empty(),
            "filter/README.md lost its JSON reference"
        );
        // The reference names the secret's environment variable, as a deployment does.
        let env = |name: &str| {
            (name == "LLM_ROUTER_SNAPSHOT_SECRET")
                .then(|| "reference-secret-0123456789abcdef".into())
        };
        let c = Config::parse_with_env(reference.as_bytes(), &env);
        assert!(c.is_ok(), "filter/README.md's reference: {:?}", c.err());
        let c = c.unwrap();
        assert!(c.flow.enabled);
        assert_eq!(c.rewrites.rules.len(), 1);
        // The sticky draw is keyed by the snapshot secret the environment gave.
        assert_eq!(
            c.rewrites.rules[0].salt,
            crate::rewrite::sticky_salt("reference-secret-0123456789abcdef")
        );
        assert_ne!(c.rewrites.rules[0].salt, 0);
    }

    #[test]
    fn flow_control_is_on_by_default_and_its_admission_bound_is_checked() {
        let c = Config::parse(br#"{"pools":[{"name":"a","models":["x"]}]}"#).unwrap();
        assert!(c.flow.enabled);
        assert!((c.flow.kv_threshold - 0.95).abs() < 1e-9);
        let c = Config::parse(
            br#"{"pools":[{"name":"a","models":["x"]}],"flow":{"enabled":false,"kv_threshold":0.9}}"#,
        )
        .unwrap();
        assert!(!c.flow.enabled);
        assert!((c.flow.kv_threshold - 0.9).abs() < 1e-9);
        for bad in ["0", "1.5", "-0.2"] {
            let e = error_of(&format!(
                r#"{{"pools":[{{"name":"a","models":["x"]}}],"flow":{{"kv_threshold":{bad}}}}}"#
            ));
            assert!(e.contains("flow.kv_threshold"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_typo_inside_a_model_object_names_its_path() {
        let e = error_of(r#"{"pools":[{"name":"a","models":["x",{"name":"m","rewrit":"y"}]}]}"#);
        assert!(
            e.contains("pools[0].models[1].rewrit: unknown field"),
            "{e}"
        );
        let e = error_of(r#"{"pools":[{"name":"a","models":[{"name":"m","adapter":"yes"}]}]}"#);
        assert!(e.contains("pools[0].models[0]: invalid type"), "{e}");
        let e = error_of(r#"{"pools":[{"name":"a","models":[{"rewrite":"m"}]}]}"#);
        assert!(
            e.contains("pools[0].models[0]: missing field `name`"),
            "{e}"
        );
        let e = error_of(r#"{"pools":[{"name":"a","models":[7]}]}"#);
        assert!(
            e.contains("pools[0].models[0]: expected a model name"),
            "{e}"
        );
        let c = Config::parse(
            br#"{"pools":[{"name":"a","models":["x",{"name":"m","rewrite":"y","adapter":true}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            c.models["m"],
            ModelRoute {
                pool: 0,
                rewrite: Some("y".into()),
                adapter: true
            }
        );
        assert_eq!(c.models["x"].rewrite, None);
    }

    /// 40 bytes, not a placeholder: a secret the policy accepts.
    const KEY: &str = "config-test-secret-0123456789abcdef-0123";

    #[test]
    fn snapshot_endpoints_are_off_by_default_and_need_a_secret() {
        let c = Config::parse(b"{}").unwrap();
        assert!(!c.snapshot.endpoints);
        let c = Config::parse(
            format!(r#"{{"snapshot":{{"endpoints":true,"secret":"{KEY}"}}}}"#).as_bytes(),
        )
        .unwrap();
        assert!(c.snapshot.endpoints);
        assert_eq!(c.snapshot.secret, KEY);
        let e = error_of(r#"{"snapshot":{"endpoints":true}}"#);
        assert!(e.contains("snapshot.secret: must be set"), "{e}");
        let e = error_of(&format!(
            r#"{{"snapshot":{{"secret":"{KEY}","secret_header":"x-s"}}}}"#
        ));
        assert!(e.contains("snapshot.secret_header: no longer used"), "{e}");
    }

    /// The shipped `change-me` and short keys were accepted; now any configured secret goes
    /// through the shared policy, with how to make a good one.
    #[test]
    fn a_placeholder_or_short_secret_is_a_configuration_error() {
        for bad in ["change-me", "k", "s3cret-for-tests"] {
            let e = error_of(&format!(
                r#"{{"snapshot":{{"endpoints":true,"secret":"{bad}"}}}}"#
            ));
            assert!(
                e.contains("snapshot.secret:") && e.contains("openssl rand"),
                "{bad}: {e}"
            );
        }
        // Also where endpoints are off (the public listener's copy of the section).
        let e = error_of(r#"{"snapshot":{"secret":"change-me"}}"#);
        assert!(e.contains("placeholder"), "{e}");
    }

    #[test]
    fn the_secret_can_come_from_an_environment_variable() {
        let env = |name: &str| match name {
            "LLM_ROUTER_SNAPSHOT_SECRET" => Some(KEY.to_string()),
            "FROM_FILE" => Some(format!("{KEY}\r\n")),
            "SHORT" => Some("abc".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let parse = |json: &str| Config::parse_with_env(json.as_bytes(), &env);
        let c =
            parse(r#"{"snapshot":{"endpoints":true,"secret_env":"LLM_ROUTER_SNAPSHOT_SECRET"}}"#)
                .unwrap();
        assert_eq!(c.snapshot.secret, KEY);
        // As the sidecar reads a secret file: the trailing line end is not part of the key.
        let c = parse(r#"{"snapshot":{"endpoints":true,"secret_env":"FROM_FILE"}}"#).unwrap();
        assert_eq!(c.snapshot.secret, KEY);
        for (var, needle) in [
            ("UNSET", "environment variable UNSET is not set or empty"),
            ("EMPTY", "environment variable EMPTY is not set or empty"),
            (
                "SHORT",
                "environment variable SHORT: the snapshot secret is 3 bytes",
            ),
        ] {
            let e = parse(&format!(
                r#"{{"snapshot":{{"endpoints":true,"secret_env":"{var}"}}}}"#
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("snapshot.secret_env:") && e.contains(needle),
                "{e}"
            );
        }
        for bad in ["", "A=B", "has space", "X\\u0000"] {
            let e = parse(&format!(r#"{{"snapshot":{{"secret_env":"{bad}"}}}}"#))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("must name an environment variable"),
                "{bad}: {e}"
            );
        }
        let e = parse(&format!(
            r#"{{"snapshot":{{"secret":"{KEY}","secret_env":"LLM_ROUTER_SNAPSHOT_SECRET"}}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn unknown_paths_pass_by_default_and_reject_when_asked() {
        assert_eq!(
            Config::parse(b"{}").unwrap().unknown_paths,
            UnknownPaths::Pass
        );
        let c = Config::parse(br#"{"unknown_paths":"reject"}"#).unwrap();
        assert_eq!(c.unknown_paths, UnknownPaths::Reject);
        let c = Config::parse(br#"{"unknown_paths":"pass"}"#).unwrap();
        assert_eq!(c.unknown_paths, UnknownPaths::Pass);
        let e = error_of(r#"{"unknown_paths":"drop"}"#);
        assert!(
            e.contains("unknown_paths: \"drop\" is not one of pass, reject"),
            "{e}"
        );
    }

    #[test]
    fn nothing_about_the_fleet_is_disclosed_by_default() {
        let c = Config::parse(b"{}").unwrap();
        assert_eq!(c.disclose, Disclose::default());
        assert!(!c.disclose.served_pod && !c.disclose.pool_detail);
        let c = Config::parse(br#"{"disclose":{"served_pod":true}}"#).unwrap();
        assert!(c.disclose.served_pod && !c.disclose.pool_detail);
        let c = Config::parse(br#"{"disclose":{"pool_detail":true}}"#).unwrap();
        assert!(!c.disclose.served_pod && c.disclose.pool_detail);
        let e = error_of(r#"{"disclose":{"served":true}}"#);
        assert!(e.contains("unknown field `served`"), "{e}");
    }

    #[test]
    fn client_priority_is_not_trusted_by_default() {
        assert!(!Config::parse(b"{}").unwrap().priority.trust_headers);
        let c = Config::parse(br#"{"priority":{"trust_headers":true}}"#).unwrap();
        assert!(c.priority.trust_headers);
        let c = Config::parse(br#"{"objectives":{"batch":-1,"vip":1}}"#).unwrap();
        assert_eq!(c.request_priority(Some("1"), Some("vip")), 0);
        assert_eq!(c.request_priority(Some("-1"), Some("batch")), 0);
        let c = Config::parse(
            br#"{"objectives":{"batch":-1,"vip":1},"priority":{"trust_headers":true}}"#,
        )
        .unwrap();
        assert_eq!(c.request_priority(Some("2"), Some("batch")), 2);
        assert_eq!(c.request_priority(None, Some("batch")), -1);
        assert_eq!(c.request_priority(None, Some("unlisted")), 0);
        assert_eq!(c.request_priority(Some("x"), Some("vip")), 1);
        let e = error_of(r#"{"priority":{"trust":true}}"#);
        assert!(e.contains("unknown field `trust`"), "{e}");
    }

    #[test]
    fn rewrite_rules_need_weights_above_zero_and_targets_that_exist() {
        let pools = r#""pools":[{"name":"a","models":["llama-v1",{"name":"llama-v2","adapter":true}]},{"name":"b"}]"#;
        let parse =
            |rules: &str| Config::parse(format!("{{{pools},\"rewrites\":{rules}}}").as_bytes());
        let c = parse(
            r#"[{"model":"llama","sticky":"conversation","targets":[
                {"model":"llama-v1","weight":90},{"model":"llama-v2","weight":10},
                {"model":"other","pool":"b","weight":0}]}]"#,
        )
        .unwrap();
        let rule = c.rewrites.rule("llama").unwrap();
        assert_eq!(rule.sticky, Sticky::Conversation);
        let t: Vec<(&str, usize, bool, u32)> = rule
            .targets
            .iter()
            .map(|t| (t.model.as_str(), t.pool, t.adapter, t.weight))
            .collect();
        assert_eq!(
            t,
            [
                ("llama-v1", 0, false, 90),
                ("llama-v2", 0, true, 10),
                ("other", 1, false, 0)
            ]
        );
        assert!(c.rewrites.rule("llama-v1").is_none());
        assert_eq!(c.served_model_header, "x-llm-router-served-model");
        // A single target's weight defaults to 1.
        let c = parse(r#"[{"model":"alias","targets":[{"model":"llama-v1"}]}]"#).unwrap();
        assert_eq!(c.rewrites.rules[0].targets[0].weight, 1);
        for (rules, needle) in [
            (
                r#"[{"model":"llama","targets":[{"model":"llama-v1","weight":0}]}]"#,
                "rewrites[0].targets: the weights sum to 0",
            ),
            (
                r#"[{"model":"llama","targets":[]}]"#,
                "rewrites[0].targets: at least one target",
            ),
            (
                r#"[{"model":"llama","targets":[{"model":"llama-v3","weight":5}]}]"#,
                "rewrites[0].targets[0].model: \"llama-v3\" is not a configured model name",
            ),
            (
                r#"[{"model":"llama","targets":[{"model":"x","pool":"c"}]}]"#,
                "rewrites[0].targets[0].pool: \"c\" is not a configured pool",
            ),
            (
                r#"[{"model":"llama","targets":[{"model":"llama-v1","weight":1000001}]}]"#,
                "rewrites[0].targets[0].weight: 1000001 must be in 0..=1000000",
            ),
            (
                r#"[{"model":"llama","sticky":"session","targets":[{"model":"llama-v1"}]}]"#,
                "rewrites[0].sticky: \"session\" is not one of none, conversation",
            ),
            (
                r#"[{"model":"m","targets":[{"model":"llama-v1"}]},{"model":"m","targets":[{"model":"llama-v1"}]}]"#,
                "rewrites[1].model: \"m\" already has a rule",
            ),
            (
                r#"[{"model":"m","targets":[{"model":"llama-v1","wieght":3}]}]"#,
                "unknown field `wieght`",
            ),
        ] {
            let e = parse(rules).unwrap_err().to_string();
            assert!(e.contains(needle), "{rules}: {e}");
        }
    }

    /// From the `config` fuzz target (a crash of its round-trip property, which now builds
    /// serde_json with `float_roundtrip`): a weight written with more digits than an f64 holds
    /// is accepted, parsed to within an ULP or so (serde_json's default, best-effort precision).
    #[test]
    fn a_weight_with_more_digits_than_a_double_holds_is_accepted() {
        let c = Config::parse(
            br#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"affinity":1111.11151111111111111111111111510}}]}"#,
        )
        .unwrap();
        let affinity = c.pools[0].weights.0[6];
        assert!(
            (affinity / 1_111.111_511_111_111_2 - 1.0).abs() < 1e-14,
            "{affinity}"
        );
    }

    /// Weights near `f64::MAX` would each pass a finiteness check and still sum to infinity,
    /// turning every score into NaN: weights are bounded.
    #[test]
    fn weights_are_bounded_so_their_sum_stays_finite() {
        let e = error_of(
            r#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"ttft":1e308,"queue":1e308}}]}"#,
        );
        assert!(e.contains("weights.") && e.contains("0..=1000000"), "{e}");
        let ok = Config::parse(
            br#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"ttft":1000000,"queue":1000000}}]}"#,
        );
        assert!(ok.is_ok());
    }
}
