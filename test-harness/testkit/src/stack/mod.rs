//! Starts and stops what one benchmark run (or an end-to-end test) needs: fresh model-sim pods,
//! then the gateway in front of them ([`Gateway`]): Envoy with the router under test and, for
//! the filter, the metrics sidecar pushing snapshots into it; or, for the field's routers, the
//! peer router itself (SMG, vllm-router: no Envoy, no sidecar).
//!
//! It lives in testkit, not in `bench`, because the `e2e` fault tests start the same stacks;
//! `bench` re-exports it as `bench::stack`.
//!
//! Every process is a [`ChildGuard`] (stopped by PID on drop), so a failed or interrupted
//! run leaves nothing behind.
//!
//! [`fleet`] says what the pods are; [`realpods`] runs real vLLM ones; this file starts the rest.

pub mod fleet;
pub mod realpods;

use crate::peers::{PeerProcess, PeerRouter};
use crate::{ChildGuard, EnvoyProcess, EnvoySpec, Router as EnvoyRouter};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The tests build fleets (`use super::*`).
#[cfg(test)]
use crate::stack::fleet::PodSpec;
use crate::stack::fleet::{AdmissionBound, FleetSpec, PodEngine, MODEL};

/// Pool and cluster names of the single pool.
pub const POOL: &str = "llama";
/// Envoy cluster of the pool.
pub const CLUSTER: &str = "pool_llama";
/// The snapshot secret shared by the sidecar (signing) and the filter (verifying).
pub const SECRET: &str = "bench-stack-secret-0123456789abcdef-0123";

/// Who picks the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    /// Envoy `ROUND_ROBIN`.
    RoundRobin,
    /// Envoy `LEAST_REQUEST` as shipped: two random choices (P2C).
    LeastRequest,
    /// Envoy least request comparing every endpoint (`selection_method: FULL_SCAN`; a
    /// `choice_count` equal to the pool size would still draw with replacement and miss the
    /// least loaded pod in (1 − 1/n)^n of picks).
    LeastRequestFull,
    /// Envoy `ROUND_ROBIN` with static endpoint weights following each profile's measured
    /// capacity ([`capacity_weight`]); the same as round robin on a uniform fleet.
    WeightedRr,
    /// The filter with its default configuration.
    Filter,
    /// The filter with GAIE's default weights (queue 2, kv_cache 2, prefix 3, others 0); an
    /// optional extra, not in the default set.
    FilterGaieWeights,
    /// Two gateway replicas: two Envoy processes with the filter's default configuration, each
    /// with its own sidecar following one metrics hub (which alone scrapes the pods and merges
    /// the replicas' tallies, so each replica counts the other's work); the load generator
    /// alternates requests between them (so the turns of one conversation reach both). An
    /// optional extra that measures whether replicas route as one gateway.
    FilterReplicas,
    /// Four gateway replicas the same way (four Envoys, four sidecars, one hub); requests go
    /// to them in turn.
    FilterReplicas4,
    /// Two gateway replicas whose sidecars each scrape the pods on their own, no hub: what each
    /// replica knows of the other's work is only what the engines' gauges show.
    FilterReplicasNoHub,
    /// SMG 1.13 (SGLang's gateway), `cache_aware` (its default): a radix tree of the prompt
    /// text it routed, its own in-flight counts and dispatch bookings, spill gates to the least
    /// loaded worker. Started as shipped ([`crate::peers`]).
    SmgCacheAware,
    /// SMG 1.13, `least_load`: the engines' load polled by its load monitor (every 10 s by
    /// default: `GET /metrics`, `/v1/loads`, `/loads`), plus its own dispatches since the poll
    /// and a KV-pressure term.
    SmgLeastLoad,
    /// SMG 1.13, `power_of_two`: two random workers, the one with the lower expected wait.
    SmgPowerOfTwo,
    /// SMG 1.13, `prefix_hash`: a hash ring over the prompt's first 256 tokens, walking on past
    /// a worker above 1.25× the average load.
    SmgPrefixHash,
    /// vllm-router 0.1.17, `cache_aware` (its default): a radix tree of token ids from the
    /// workers' `/v1/*/render` (or `/tokenize`), else load only.
    VllmRouterCacheAware,
    /// vllm-router 0.1.17, `power_of_two`: `GET /get_load` every 5 s, else its own counts.
    VllmRouterPowerOfTwo,
    /// Envoy `ROUND_ROBIN` with admission: the cluster's circuit breakers bound the requests in
    /// flight and waiting at the scenario's [`AdmissionBound`], and an overflow is answered 429
    /// with `retry-after` (Envoy's local reply mapper), as an operator deploys it for overload.
    RoundRobinAdmission,
    /// SMG 1.13 `cache_aware` with its own admission on: `--max-concurrent-requests`,
    /// `--queue-size` and `--queue-timeout-secs` at the scenario's [`AdmissionBound`] (its
    /// default bound, 1,024 per core and at least 4,096, never binds on a bench fleet).
    SmgCacheAwareAdmission,
}

impl RouterKind {
    /// The default routers, in report order.
    pub const ALL: [RouterKind; 5] = [
        RouterKind::RoundRobin,
        RouterKind::LeastRequest,
        RouterKind::LeastRequestFull,
        RouterKind::WeightedRr,
        RouterKind::Filter,
    ];

    /// Routers run only when named.
    pub const EXTRA: [RouterKind; 4] = [
        RouterKind::FilterGaieWeights,
        RouterKind::FilterReplicas,
        RouterKind::FilterReplicas4,
        RouterKind::FilterReplicasNoHub,
    ];

    /// The field's routers (real binaries from PyPI, `./build.sh setup`), in report order: a
    /// full run runs them all by default after [`RouterKind::ALL`]; quick only
    /// [`RouterKind::QUICK_PEERS`].
    pub const PEERS: [RouterKind; 6] = [
        RouterKind::SmgCacheAware,
        RouterKind::SmgLeastLoad,
        RouterKind::SmgPowerOfTwo,
        RouterKind::SmgPrefixHash,
        RouterKind::VllmRouterCacheAware,
        RouterKind::VllmRouterPowerOfTwo,
    ];

    /// The routers with an admission bound of their own ([`AdmissionBound`]): run beside the
    /// unbounded ones where overload is judged, only when named elsewhere.
    pub const ADMISSION: [RouterKind; 2] = [
        RouterKind::RoundRobinAdmission,
        RouterKind::SmgCacheAwareAdmission,
    ];

    /// The peers a quick run includes by default: SMG's `cache_aware` (the default policy of
    /// both peers, and the best SMG policy on the uneven fleets and shared prefixes). Each peer
    /// adds one run per scenario (≈ 22 s each in quick); one keeps quick within its 10-minute
    /// budget (`--plan`). Named, any runs.
    pub const QUICK_PEERS: [RouterKind; 1] = [RouterKind::SmgCacheAware];

    /// The name used in the JSON and the tables.
    pub fn name(self) -> &'static str {
        match self {
            RouterKind::RoundRobin => "round_robin",
            RouterKind::LeastRequest => "least_request",
            RouterKind::LeastRequestFull => "least_request_full",
            RouterKind::WeightedRr => "weighted_rr",
            RouterKind::Filter => "filter",
            RouterKind::FilterGaieWeights => "filter_gaie_weights",
            RouterKind::FilterReplicas => "filter_x2",
            RouterKind::FilterReplicas4 => "filter_x4",
            RouterKind::FilterReplicasNoHub => "filter_x2_nohub",
            RouterKind::SmgCacheAware => "smg_cache_aware",
            RouterKind::SmgLeastLoad => "smg_least_load",
            RouterKind::SmgPowerOfTwo => "smg_power_of_two",
            RouterKind::SmgPrefixHash => "smg_prefix_hash",
            RouterKind::VllmRouterCacheAware => "vllm_router_cache_aware",
            RouterKind::VllmRouterPowerOfTwo => "vllm_router_power_of_two",
            RouterKind::RoundRobinAdmission => "round_robin_admission",
            RouterKind::SmgCacheAwareAdmission => "smg_cache_aware_admission",
        }
    }

    /// The peer router and its policy, for the field's routers.
    pub fn peer(self) -> Option<(PeerRouter, &'static str)> {
        match self {
            RouterKind::SmgCacheAware | RouterKind::SmgCacheAwareAdmission => {
                Some((PeerRouter::Smg, "cache_aware"))
            }
            RouterKind::SmgLeastLoad => Some((PeerRouter::Smg, "least_load")),
            RouterKind::SmgPowerOfTwo => Some((PeerRouter::Smg, "power_of_two")),
            RouterKind::SmgPrefixHash => Some((PeerRouter::Smg, "prefix_hash")),
            RouterKind::VllmRouterCacheAware => Some((PeerRouter::VllmRouter, "cache_aware")),
            RouterKind::VllmRouterPowerOfTwo => Some((PeerRouter::VllmRouter, "power_of_two")),
            _ => None,
        }
    }

    /// Every router: the default set, the extras, the peers.
    pub fn every() -> impl Iterator<Item = RouterKind> {
        Self::ALL
            .into_iter()
            .chain(Self::EXTRA)
            .chain(Self::PEERS)
            .chain(Self::ADMISSION)
    }

    /// Parse a router name (default set and extras).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::every().find(|r| r.name() == s)
    }

    /// Every accepted name.
    pub fn names() -> Vec<&'static str> {
        Self::every().map(Self::name).collect()
    }

    /// Whether the filter (and therefore the sidecar) is in the path.
    pub fn uses_filter(self) -> bool {
        matches!(
            self,
            RouterKind::Filter
                | RouterKind::FilterGaieWeights
                | RouterKind::FilterReplicas
                | RouterKind::FilterReplicas4
                | RouterKind::FilterReplicasNoHub
        )
    }

    /// How many gateway replicas (Envoy processes) the router runs.
    pub fn replicas(self) -> usize {
        match self {
            RouterKind::FilterReplicas | RouterKind::FilterReplicasNoHub => 2,
            RouterKind::FilterReplicas4 => 4,
            _ => 1,
        }
    }

    /// Whether it bounds what it holds at the scenario's [`AdmissionBound`].
    pub fn admits(self) -> bool {
        Self::ADMISSION.contains(&self)
    }

    /// Whether its sidecars follow a metrics hub (started with the stack) instead of scraping.
    pub fn hub(self) -> bool {
        matches!(
            self,
            RouterKind::FilterReplicas | RouterKind::FilterReplicas4
        )
    }
}

/// Static weight of a GPU profile for the weighted round robin: its saturation throughput
/// measured with `bench calibrate` (closed loop, one pod), relative to an A10G-like pod —
/// H100-like ≈ 18 req/s vs A10G-like ≈ 1.8 req/s with the mixed-GPU prompts. Profiles never
/// mixed with others get 1 (weights only matter between different profiles).
pub fn capacity_weight(profile: &str) -> u32 {
    match profile {
        "h100" => 10,
        // Real vLLM: the tiny models' measured capacities on `vllm_uneven`'s requests, 21.3
        // and 6.87 req/s (`scenarios::CAPACITY`): 3.1 : 1. (The real-v1 run used 8 : 3, from a
        // measurement taken while builds ran.)
        "cpu-small" => 3,
        "cpu-large" => 1,
        _ => 1,
    }
}

/// Whether the fleet mixes profiles (a weighted round robin differs from round robin).
pub fn heterogeneous(fleet: &FleetSpec) -> bool {
    fleet
        .pods
        .windows(2)
        .any(|w| capacity_weight(w[0].profile) != capacity_weight(w[1].profile))
}

/// Envoy with `router` in front of `pods` (not started): the cluster policy, weights and, for
/// the filter, its plugin configuration.
pub fn envoy_spec(
    router: RouterKind,
    fleet: &FleetSpec,
    pods: &[SocketAddr],
    adapters: &[String],
    scenario_config: &Value,
) -> EnvoySpec {
    let envoy_router = match router {
        RouterKind::RoundRobin | RouterKind::WeightedRr | RouterKind::RoundRobinAdmission => {
            EnvoyRouter::RoundRobin
        }
        RouterKind::LeastRequest | RouterKind::LeastRequestFull => EnvoyRouter::LeastRequest,
        RouterKind::Filter
        | RouterKind::FilterGaieWeights
        | RouterKind::FilterReplicas
        | RouterKind::FilterReplicas4
        | RouterKind::FilterReplicasNoHub => EnvoyRouter::Filter,
        // Not an Envoy router (start_stack starts the peer instead); plain round robin if asked.
        RouterKind::SmgCacheAware
        | RouterKind::SmgLeastLoad
        | RouterKind::SmgPowerOfTwo
        | RouterKind::SmgPrefixHash
        | RouterKind::VllmRouterCacheAware
        | RouterKind::VllmRouterPowerOfTwo
        | RouterKind::SmgCacheAwareAdmission => EnvoyRouter::RoundRobin,
    };
    let mut spec = EnvoySpec::new(envoy_router)
        .pool(POOL, CLUSTER, pods.to_vec())
        .concurrency(2);
    spec.name = format!("bench-envoy-{}", router.name());
    match router {
        RouterKind::LeastRequestFull => {
            spec.cluster_lb_policy = Some(crate::least_request_full_scan_policy());
        }
        RouterKind::WeightedRr => {
            spec.endpoint_weights = pods
                .iter()
                .zip(&fleet.pods)
                .map(|(a, p)| (*a, capacity_weight(p.profile)))
                .collect();
        }
        RouterKind::Filter
        | RouterKind::FilterGaieWeights
        | RouterKind::FilterReplicas
        | RouterKind::FilterReplicas4
        | RouterKind::FilterReplicasNoHub => {
            let mut config = plugin_config(
                adapters,
                router == RouterKind::FilterGaieWeights,
                scenario_config,
            );
            in_emulated_time(&mut config, fleet.speedup);
            spec = spec.plugin_config(config);
        }
        RouterKind::RoundRobinAdmission => {
            spec.admission = fleet.admission.map(|a| crate::Admission {
                max_in_flight: a.in_flight,
                max_pending: a.queue,
            });
        }
        _ => {}
    }
    spec
}

/// SMG's admission flags for `bound` (the documented ones: `--max-concurrent-requests`,
/// `--queue-size`, `--queue-timeout-secs`, whole seconds, at least 1).
pub fn smg_admission_args(bound: &AdmissionBound) -> Vec<String> {
    vec![
        "--max-concurrent-requests".into(),
        bound.in_flight.to_string(),
        "--queue-size".into(),
        bound.queue.to_string(),
        "--queue-timeout-secs".into(),
        bound
            .queue_timeout
            .as_secs_f64()
            .ceil()
            .max(1.0)
            .to_string(),
    ]
}

/// Errors starting the stack.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// testkit could not find or start something.
    #[error("{what}: {source}")]
    Testkit {
        /// What was being done.
        what: String,
        /// testkit's error (names the missing file and the command that builds it).
        source: crate::Error,
    },
    /// A process did not become ready.
    #[error("{what} not ready after {secs} s (log: {log})")]
    NotReady {
        /// Which process.
        what: String,
        /// How long we waited.
        secs: u64,
        /// Its log file.
        log: String,
    },
    /// A router with admission asked for on a fleet whose scenario sizes none.
    #[error("{0}: the scenario sets no admission bound (only overload scenarios size one)")]
    NoAdmission(&'static str),
    /// The real vLLM fleet could not be started or reset.
    #[error("real vLLM pods: {0} (logs: <target>/testlogs/bench-vllm*/vllm.log)")]
    RealPods(String),
    /// Writing a config file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn tk(what: impl Into<String>) -> impl FnOnce(crate::Error) -> StackError {
    let what = what.into();
    move |source| StackError::Testkit { what, source }
}

/// Running pods.
pub struct Pods {
    /// Their processes.
    pub guards: Vec<ChildGuard>,
    /// Their addresses, in fleet order.
    pub addrs: Vec<SocketAddr>,
}

async fn wait_http_ok(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(r) = crate::get(addr, path, &[]).await {
            if r.status == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// `n` distinct free loopback ports: all are held open while picking (so the OS cannot hand the
/// same one out twice), then released for the child processes to bind.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(std::net::TcpListener::bind(("127.0.0.1", 0))?);
    }
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Pods for one run, answering `/health`: fresh model-sim pods (one process each), or the real
/// vLLM fleet ([`crate::stack::realpods::acquire`]: started once, reset between runs; the stack does
/// not own its processes). `adapters`: the LoRA adapters the real pods register.
pub async fn start_pods(fleet: &FleetSpec, adapters: &[String]) -> Result<Pods, StackError> {
    if fleet.engine == PodEngine::Vllm {
        let addrs = crate::stack::realpods::acquire(fleet, adapters)
            .await
            .map_err(StackError::RealPods)?;
        return Ok(Pods {
            guards: Vec::new(),
            addrs,
        });
    }
    let bin = crate::bin("model-sim").map_err(tk("model-sim binary"))?;
    let mut guards = Vec::new();
    let mut addrs = Vec::new();
    let ports = free_ports(fleet.pods.len()).map_err(|source| StackError::Io {
        path: "bind 127.0.0.1:0 (free ports)".into(),
        source,
    })?;
    for ((i, p), port) in fleet.pods.iter().enumerate().zip(ports) {
        let mut cmd = Command::new(&bin);
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--profile")
            .arg(p.profile)
            .arg("--speedup")
            .arg(fleet.speedup.to_string())
            .arg("--seed")
            .arg((fleet.seed + i as u64).to_string())
            .arg("--model")
            .arg(MODEL);
        if let Some(n) = p.max_loras {
            cmd.arg("--max-loras").arg(n.to_string());
        }
        if let Some(n) = p.max_cpu_loras {
            cmd.arg("--max-cpu-loras").arg(n.to_string());
        }
        if !adapters.is_empty() {
            // Registered up front, as a vLLM deployment's `--lora-modules`: every pod can load
            // every adapter, and its `/v1/models` lists them (SMG routes only to listed models).
            cmd.arg("--lora-modules").arg(adapters.join(","));
        }
        if let Some(m) = p.output_len {
            cmd.arg("--output-len").arg(m);
        }
        if p.lie_metrics {
            cmd.arg("--lie-metrics");
        }
        if let Some(n) = p.max_num_seqs {
            cmd.arg("--max-num-seqs").arg(n.to_string());
        }
        if let Some(n) = p.kv_blocks {
            cmd.arg("--num-gpu-blocks").arg(n.to_string());
        }
        let g = ChildGuard::spawn(&format!("model-sim-{i}-{}", p.profile), cmd)
            .map_err(tk("start model-sim"))?;
        guards.push(g);
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    for (g, a) in guards.iter().zip(&addrs) {
        if !wait_http_ok(*a, "/health", Duration::from_secs(20)).await {
            return Err(StackError::NotReady {
                what: format!("model-sim {a}"),
                secs: 20,
                log: g.log_path().display().to_string(),
            });
        }
    }
    Ok(Pods { guards, addrs })
}

/// The filter's plugin configuration: the defaults, plus pool membership (models, adapters) and
/// the snapshot secret; `gaie_weights` swaps in GAIE's default weights; `scenario_config` (a
/// JSON object or null) is what the scenario's deployment needs besides, merged as
/// [`EXPERIMENT_ENV`] is (e.g. which identity headers are trusted, a canary rule) — never a
/// routing knob.
pub fn plugin_config(adapters: &[String], gaie_weights: bool, scenario_config: &Value) -> Value {
    let mut pool = json!({"name": POOL, "cluster": CLUSTER, "models": [MODEL]});
    if !adapters.is_empty() {
        pool["adapters"] = json!(adapters);
    }
    if gaie_weights {
        pool["weights"] = json!({"queue": 2, "kv_cache": 2, "prefix": 3, "lora": 0, "load": 0});
    }
    let mut config = json!({"pools": [pool], "snapshot": {"secret": SECRET}});
    if let Value::Object(extra) = scenario_config {
        merge(&mut config, extra.clone());
    }
    merge_experiment(&mut config, std::env::var(EXPERIMENT_ENV).ok().as_deref());
    config
}

/// Converts the filter's bounds on how long a request may wait — durations of the engines'
/// time, which model-sim runs `speedup` times faster than the wall clock the filter reads —
/// into wall time: each band's time to live and `flow.newest_first_after_ms` (the configured
/// value, else the filter's default), divided by the speed-up. Without it a 60 s time to live
/// would be 180 emulated seconds at speed-up 3, and a bound of seconds would never be reached
/// in a run. The filter's mechanisms (its tick, the snapshot's staleness, the sidecar's scrape)
/// stay in wall time: they pace the proxy, not the engines.
pub fn in_emulated_time(config: &mut Value, speedup: f64) {
    if speedup.is_nan() || speedup <= 1.0 {
        return;
    }
    let defaults = llm_router_core::flow::FlowConfig::default();
    let wall = |ms: u64| (ms as f64 / speedup).round() as u64;
    if !config["flow"].is_object() {
        config["flow"] = json!({});
    }
    let flow = &mut config["flow"];
    let newest = flow["newest_first_after_ms"]
        .as_u64()
        .unwrap_or(defaults.newest_first_after_ms);
    flow["newest_first_after_ms"] = json!(wall(newest));
    if !flow["bands"].is_object() {
        flow["bands"] = json!({});
    }
    for class in llm_router_core::priority::Class::ALL {
        let band = &mut flow["bands"][class.name()];
        if !band.is_object() {
            *band = json!({});
        }
        let ttl = band["ttl_ms"]
            .as_u64()
            .unwrap_or(defaults.limits(class).ttl_ms);
        band["ttl_ms"] = json!(wall(ttl).max(1));
    }
}

/// An on-demand experiment's settings, merged over the filter's configuration: a JSON object
/// whose `pool` entry merges into the pool and whose other keys replace the top level's, e.g.
/// `{"flow": {"kv_threshold": 0.9}}`. Never set by the bench itself: results are the defaults'.
pub const EXPERIMENT_ENV: &str = "LLMR_BENCH_FILTER_CONFIG";

// A malformed experiment is the operator's typo, not a run's failure: stop at once, as the
// bench always has (testkit denies `panic` elsewhere).
#[allow(clippy::panic)]
fn merge_experiment(config: &mut Value, extra: Option<&str>) {
    let Some(extra) = extra.filter(|e| !e.trim().is_empty()) else {
        return;
    };
    let Ok(Value::Object(extra)) = serde_json::from_str::<Value>(extra) else {
        panic!("{EXPERIMENT_ENV} must be a JSON object, got {extra:?}");
    };
    merge(config, extra);
}

/// Merge `extra` over `config`: its `pool` entry's fields into the first pool, its other keys
/// over the top level.
fn merge(config: &mut Value, extra: serde_json::Map<String, Value>) {
    for (k, v) in extra {
        if k == "pool" {
            if let (Some(p), Value::Object(fields)) = (config["pools"].get_mut(0), v) {
                for (pk, pv) in fields {
                    p[pk] = pv;
                }
            }
        } else {
            config[k] = v;
        }
    }
}

/// The sidecar's scrape interval: 50 ms (GAIE's default refresh), or `LLMR_BENCH_SCRAPE_MS` for an
/// experiment on the cost of scraping.
pub fn scrape_interval_ms() -> u64 {
    std::env::var("LLMR_BENCH_SCRAPE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&ms| ms > 0)
        .unwrap_or(50)
}

/// A hub setting from the environment for an experiment (`LLMR_BENCH_SHARE_MS`: how often each
/// gateway sidecar sends its tally, default 25; `LLMR_BENCH_TALLY_FRAME_MS`: the hub's gap
/// between frames for changed tallies, default 5, 0 = only with scrape rounds), as a YAML line
/// under `hub:`; empty when unset.
fn hub_setting(var: &str, key: &str) -> String {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or_else(String::new, |v| format!("  {key}: {v}\n"))
}

/// The sidecar's configuration for these pods, pushing to `envoy`.
pub fn sidecar_config(envoy: SocketAddr, pods: &[SocketAddr], listen: SocketAddr) -> String {
    let list: Vec<String> = pods.iter().map(|a| format!("\"{a}\"")).collect();
    let interval_ms = scrape_interval_ms();
    format!(
        "# Generated by bench for one run.\npush:\n  address: {envoy}\n  path: /__llm_router/snapshot\n  secret: {SECRET}\nscrape:\n  interval_ms: {interval_ms}\nlisten: {listen}\npools:\n  - name: {POOL}\n    cluster: {CLUSTER}\n    models: [\"{MODEL}\"]\n    engine: vllm\n    discovery:\n      static: [{}]\n",
        list.join(", ")
    )
}

/// What sits in front of the pods: Envoy (with the sidecar for the filter routers), or a peer
/// router on its own. Everything that reads a stack's gateway (URLs, PIDs for the CPU figures,
/// logs, stop) goes through this.
pub enum Gateway {
    /// Envoy with the router under test; the sidecar feeding the filter, if any.
    Envoy {
        /// Envoy (boxed: a peer's variant is much smaller).
        envoy: Box<EnvoyProcess>,
        /// The sidecar (filter routers only).
        sidecar: Option<ChildGuard>,
        /// Where the sidecar serves its own `/metrics`.
        sidecar_metrics: Option<SocketAddr>,
    },
    /// SMG or vllm-router in front of the pods (no Envoy, no sidecar).
    Peer(PeerProcess),
}

impl Gateway {
    /// `http://<listener><path>`.
    pub fn url(&self, path: &str) -> String {
        match self {
            Gateway::Envoy { envoy, .. } => envoy.url(path),
            Gateway::Peer(p) => p.url(path),
        }
    }

    /// Where clients connect.
    pub fn listen_addr(&self) -> SocketAddr {
        match self {
            Gateway::Envoy { envoy, .. } => envoy.listen_addr,
            Gateway::Peer(p) => p.addr,
        }
    }

    /// Envoy, if this gateway is one.
    pub fn envoy(&self) -> Option<&EnvoyProcess> {
        match self {
            Gateway::Envoy { envoy, .. } => Some(envoy.as_ref()),
            Gateway::Peer(_) => None,
        }
    }

    /// The sidecar, if any.
    pub fn sidecar(&self) -> Option<&ChildGuard> {
        match self {
            Gateway::Envoy { sidecar, .. } => sidecar.as_ref(),
            Gateway::Peer(_) => None,
        }
    }

    /// PIDs by role: `envoy` and `sidecar`, or `router` for a peer (the keys of the
    /// `cpu_cores_*` figures).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        match self {
            Gateway::Envoy { envoy, sidecar, .. } => std::iter::once(("envoy", envoy.pid()))
                .chain(sidecar.iter().map(|s| ("sidecar", s.pid())))
                .collect(),
            Gateway::Peer(p) => vec![("router", p.pid())],
        }
    }

    /// What the gateway counted by the end of a run, for the reports' diagnostics (keys of
    /// [`gateway_counts`], plus the sidecar's `gateway_sidecar_scrape_failures`,
    /// `gateway_sidecar_scrapes` and `gateway_sidecar_scrape_mean_ms`). Empty for a peer, whose
    /// counts are its own.
    pub async fn counts(&self) -> BTreeMap<String, f64> {
        let Gateway::Envoy {
            envoy,
            sidecar_metrics,
            ..
        } = self
        else {
            return BTreeMap::new();
        };
        let mut out = envoy
            .stats()
            .map(|s| gateway_counts(&s))
            .unwrap_or_default();
        if let Some(addr) = sidecar_metrics {
            let m = crate::podmetrics::scrape(&[*addr]).await;
            let get = |k: &str| m.get(k).copied();
            if let Some(f) = get("llm_router_sidecar_scrape_failures_total") {
                out.insert("gateway_sidecar_scrape_failures".into(), f);
            }
            let count = get("llm_router_sidecar_scrape_duration_seconds_count");
            let sum = get("llm_router_sidecar_scrape_duration_seconds_sum");
            if let (Some(n), Some(t)) = (count, sum) {
                out.insert("gateway_sidecar_scrapes".into(), n);
                if n > 0.0 {
                    out.insert("gateway_sidecar_scrape_mean_ms".into(), 1000.0 * t / n);
                }
            }
        }
        out
    }

    /// The gateway's own log (Envoy's or the peer router's).
    pub fn log_path(&self) -> PathBuf {
        match self {
            Gateway::Envoy { envoy, .. } => envoy.log_path.clone(),
            Gateway::Peer(p) => p.log_path().to_path_buf(),
        }
    }

    /// Stop it: the sidecar first, then Envoy; or the peer router.
    pub fn stop(&mut self) {
        match self {
            Gateway::Envoy { envoy, sidecar, .. } => {
                if let Some(s) = sidecar.as_mut() {
                    s.stop();
                }
                envoy.stop();
            }
            Gateway::Peer(p) => {
                p.stop();
            }
        }
    }
}

/// The filter's counters in Envoy's `/stats` (full names: labels are encoded in them, see
/// `llm_router_core::metrics`), summed over pools and models: `gateway_requests_<outcome>`
/// (`least_inflight`: decided on a stale snapshot, `fallback`: with none), `gateway_flow_<outcome>`
/// (how held requests ended) and `gateway_pushes_<result>`.
pub fn gateway_counts(stats: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    const FAMILIES: [(&str, &str, &str); 3] = [
        ("llm_router_requests_total", "outcome", "gateway_requests_"),
        ("llm_router_flow_requests_total", "outcome", "gateway_flow_"),
        (
            "llm_router_snapshot_pushes_total",
            "result",
            "gateway_pushes_",
        ),
    ];
    let mut out = BTreeMap::new();
    for (name, v) in stats {
        for (family, label, key) in FAMILIES {
            if let Some(value) = crate::filter_stat_label(name, family, label) {
                *out.entry(format!("{key}{value}")).or_insert(0.0) += *v as f64;
            }
        }
    }
    out
}

/// A running stack for one router.
pub struct Stack {
    /// The router.
    pub router: RouterKind,
    /// The pods.
    pub pods: Pods,
    /// The gateway clients talk to.
    pub gateway: Gateway,
    /// Further gateway replicas ([`RouterKind::replicas`]), each an Envoy with its own sidecar.
    pub replicas: Vec<Gateway>,
    /// The metrics hub the gateways' sidecars follow ([`RouterKind::hub`]).
    pub hub: Option<ChildGuard>,
}

impl Stack {
    /// The chat completions URL through the gateway.
    pub fn chat_url(&self) -> String {
        self.gateway.url("/v1/chat/completions")
    }

    /// The chat completions URL of every gateway replica, the first one first.
    pub fn chat_urls(&self) -> Vec<String> {
        std::iter::once(&self.gateway)
            .chain(&self.replicas)
            .map(|g| g.url("/v1/chat/completions"))
            .collect()
    }

    /// PIDs of the processes of the stack, by role (`envoy`, `sidecar`, `router`, `pods`).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        let mut v: Vec<(&'static str, u32)> = std::iter::once(&self.gateway)
            .chain(&self.replicas)
            .flat_map(Gateway::pids)
            .collect();
        v.extend(self.hub.iter().map(|g| ("hub", g.pid())));
        v.extend(self.pods.guards.iter().map(|g| ("pods", g.pid())));
        v
    }

    /// Stop everything (also done on drop): gateways (sidecar before Envoy), then pods.
    pub fn stop(mut self) {
        for g in &mut self.replicas {
            g.stop();
        }
        self.gateway.stop();
        if let Some(h) = self.hub.as_mut() {
            h.stop();
        }
        for g in &mut self.pods.guards {
            g.stop();
        }
    }
}

/// Start pods, then the gateway: the peer router for the field's routers (ready when its
/// `/readiness` reports every pod healthy), else Envoy with `router` and (for the filter) the
/// sidecar; waits until the filter holds a snapshot with every pod.
pub async fn start_stack(
    fleet: &FleetSpec,
    router: RouterKind,
    adapters: &[String],
    scenario_config: &Value,
) -> Result<Stack, StackError> {
    let pods = start_pods(fleet, adapters).await?;
    let hub = if router.hub() {
        Some(start_hub(&pods.addrs).await?)
    } else {
        None
    };
    let hub_addr = hub.as_ref().map(|(_, a)| *a);
    let gateway = start_gateway_following(
        router,
        fleet,
        &pods.addrs,
        adapters,
        scenario_config,
        None,
        hub_addr,
    )
    .await?;
    let mut replicas = Vec::new();
    for i in 1..router.replicas() {
        let mut spec = envoy_spec(router, fleet, &pods.addrs, adapters, scenario_config);
        spec.name = format!("{}-replica{i}", spec.name);
        let e = spec.start().await.map_err(tk("start Envoy replica"))?;
        let (s, m) = start_sidecar_following(e.push_addr(), &pods.addrs, None, hub_addr).await?;
        replicas.push(Gateway::Envoy {
            envoy: Box::new(e),
            sidecar: Some(s),
            sidecar_metrics: Some(m),
        });
    }
    let stack = Stack {
        router,
        pods,
        gateway,
        replicas,
        hub: hub.map(|(g, _)| g),
    };
    if router.uses_filter() {
        for g in std::iter::once(&stack.gateway).chain(&stack.replicas) {
            wait_snapshot_of(g, stack.pods.addrs.len() as u64, Duration::from_secs(15)).await?;
        }
    }
    Ok(stack)
}

/// The gateway for `router` in front of `pods` (Envoy on `listen_port` if given, else a free
/// port; a peer always on a free port): for the filter routers with its sidecar, not yet
/// waited for a snapshot.
pub async fn start_gateway(
    router: RouterKind,
    fleet: &FleetSpec,
    pods: &[SocketAddr],
    adapters: &[String],
    scenario_config: &Value,
    listen_port: Option<u16>,
) -> Result<Gateway, StackError> {
    start_gateway_following(
        router,
        fleet,
        pods,
        adapters,
        scenario_config,
        listen_port,
        None,
    )
    .await
}

/// [`start_gateway`] whose sidecar follows the metrics hub at `hub`, if given.
async fn start_gateway_following(
    router: RouterKind,
    fleet: &FleetSpec,
    pods: &[SocketAddr],
    adapters: &[String],
    scenario_config: &Value,
    listen_port: Option<u16>,
    hub: Option<SocketAddr>,
) -> Result<Gateway, StackError> {
    if router.admits() && fleet.admission.is_none() {
        return Err(StackError::NoAdmission(router.name()));
    }
    if let Some((kind, policy)) = router.peer() {
        let extra = match (router, &fleet.admission) {
            (RouterKind::SmgCacheAwareAdmission, Some(a)) => smg_admission_args(a),
            _ => Vec::new(),
        };
        let p = crate::peers::start_with(kind, policy, pods, &extra)
            .await
            .map_err(tk(format!("start {} ({policy})", kind.package())))?;
        return Ok(Gateway::Peer(p));
    }
    let mut spec = envoy_spec(router, fleet, pods, adapters, scenario_config);
    if let Some(port) = listen_port {
        spec.listen_port = port;
    }
    let envoy = spec.start().await.map_err(tk("start Envoy"))?;
    let (sidecar, sidecar_metrics) = if router.uses_filter() {
        let (s, m) = start_sidecar_following(envoy.push_addr(), pods, None, hub).await?;
        (Some(s), Some(m))
    } else {
        (None, None)
    };
    Ok(Gateway::Envoy {
        envoy: Box::new(envoy),
        sidecar,
        sidecar_metrics,
    })
}

/// Start the sidecar for `pods`, pushing into the Envoy listener at `envoy` (the internal one).
pub async fn start_sidecar(
    envoy: SocketAddr,
    pods: &[SocketAddr],
) -> Result<ChildGuard, StackError> {
    start_sidecar_at(envoy, pods, None).await.map(|(g, _)| g)
}

/// [`start_sidecar`] with its own `/metrics` on `listen` (a free port when `None`); returns the
/// process and that address.
pub async fn start_sidecar_at(
    envoy: SocketAddr,
    pods: &[SocketAddr],
    listen: Option<SocketAddr>,
) -> Result<(ChildGuard, SocketAddr), StackError> {
    start_sidecar_following(envoy, pods, listen, None).await
}

/// [`start_sidecar_at`] following the metrics hub at `hub`, if given (it scrapes on its own only
/// while the hub is silent, and shares its proxy's tally with it).
pub async fn start_sidecar_following(
    envoy: SocketAddr,
    pods: &[SocketAddr],
    listen: Option<SocketAddr>,
    hub: Option<SocketAddr>,
) -> Result<(ChildGuard, SocketAddr), StackError> {
    let listen = match listen {
        Some(a) => a,
        None => free_loopback().await?,
    };
    let mut text = sidecar_config(envoy, pods, listen);
    if let Some(h) = hub {
        text.push_str(&format!(
            "hub:\n  upstreams: [\"http://{h}\"]\n{}",
            hub_setting("LLMR_BENCH_SHARE_MS", "share_ms")
        ));
    }
    let g = spawn_sidecar("bench-sidecar", &text).await?;
    Ok((g, listen))
}

/// A metrics hub (`sidecar-metrics` in mode `hub`) scraping `pods`; returns it and where it
/// streams.
pub async fn start_hub(pods: &[SocketAddr]) -> Result<(ChildGuard, SocketAddr), StackError> {
    let (listen, stream) = (free_loopback().await?, free_loopback().await?);
    let text = format!(
        "mode: hub\nhub:\n  listen: {stream}\n{}{}",
        hub_setting("LLMR_BENCH_TALLY_FRAME_MS", "tally_frame_ms"),
        // The same pools and scraping as a gateway's sidecar; `push` names only the secret.
        sidecar_config(SocketAddr::from(([127, 0, 0, 1], 1)), pods, listen)
            .replace("  address: 127.0.0.1:1\n", "")
    );
    let g = spawn_sidecar("bench-hub", &text).await?;
    Ok((g, stream))
}

async fn free_loopback() -> Result<SocketAddr, StackError> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        crate::free_port().map_err(tk("free port"))?,
    )))
}

/// Runs `sidecar-metrics run` with the configuration `text`, logging under a fresh `label` dir.
async fn spawn_sidecar(label: &str, text: &str) -> Result<ChildGuard, StackError> {
    let bin = crate::bin("sidecar-metrics").map_err(tk("sidecar-metrics binary"))?;
    let dir = crate::testlog_dir(label).map_err(tk("log dir"))?;
    let path: PathBuf = dir.join("sidecar.yaml");
    std::fs::write(&path, text).map_err(|source| StackError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("--config").arg(&path);
    ChildGuard::spawn_logged("sidecar-metrics", cmd, &dir.join("sidecar.log"))
        .map_err(tk("start sidecar-metrics"))
}

/// Wait until the filter behind `gateway` reports a snapshot holding `want` pods
/// (`GET /__llm_router/state`); immediate for a gateway without Envoy.
pub async fn wait_snapshot_of(
    gateway: &Gateway,
    want: u64,
    timeout: Duration,
) -> Result<(), StackError> {
    let Gateway::Envoy { envoy, sidecar, .. } = gateway else {
        return Ok(());
    };
    let log = sidecar
        .as_ref()
        .map(|s| s.log_path().display().to_string())
        .unwrap_or_default();
    wait_snapshot_at(envoy.push_addr(), want, timeout, &log).await
}

/// Wait until the filter of the stack's gateway reports a snapshot holding every pod.
pub async fn wait_snapshot(stack: &Stack, timeout: Duration) -> Result<(), StackError> {
    wait_snapshot_of(&stack.gateway, stack.pods.addrs.len() as u64, timeout).await
}

/// Wait until the filter behind `listener` (the internal listener) reports a snapshot with at
/// least `want` pods.
pub async fn wait_snapshot_at(
    listener: SocketAddr,
    want: u64,
    timeout: Duration,
    sidecar_log: &str,
) -> Result<(), StackError> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(r) = crate::get(listener, "/__llm_router/state", &[]).await {
            if r.status == 200 {
                if let Ok(v) = r.json() {
                    if count_pods(&v) >= want {
                        return Ok(());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(StackError::NotReady {
        what: "filter snapshot (sidecar push)".into(),
        secs: timeout.as_secs(),
        log: sidecar_log.to_string(),
    })
}

/// Pods in a `/__llm_router/state` answer: a top-level `pods` number or array, or the sum over
/// `pools[].pods`.
pub fn count_pods(v: &Value) -> u64 {
    if let Some(n) = v.get("pods").and_then(Value::as_u64) {
        return n;
    }
    if let Some(a) = v.get("pods").and_then(Value::as_array) {
        return a.len() as u64;
    }
    if let Some(s) = v.get("snapshot") {
        let n = count_pods(s);
        if n > 0 {
            return n;
        }
    }
    v.get("pools")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| match p.get("pods") {
                    Some(Value::Array(a)) => a.len() as u64,
                    Some(x) => x.as_u64().unwrap_or(0),
                    None => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_experiment_merges_over_the_top_level_and_the_pool() {
        let mut c = plugin_config(&[], false, &Value::Null);
        merge_experiment(
            &mut c,
            Some(r#"{"flow": {"kv_threshold": 0.9}, "pool": {"preset": "latency"}}"#),
        );
        assert_eq!(c["flow"]["kv_threshold"], 0.9);
        assert_eq!(c["pools"][0]["preset"], "latency");
        assert_eq!(c["pools"][0]["name"], POOL);
        let before = plugin_config(&[], false, &Value::Null);
        let mut same = before.clone();
        merge_experiment(&mut same, Some(" "));
        assert_eq!(same, before);
    }

    #[test]
    fn the_filters_counters_are_summed_by_outcome_over_pools_and_models() {
        use llm_router_core::metrics::{stat_name, FLOW_OUTCOMES, REQUESTS, SNAPSHOT_PUSHES};
        let name = |family: &str, labels: &[(&str, &str)]| {
            format!("wasmcustom.{}", stat_name(family, labels))
        };
        let stats: BTreeMap<String, u64> = [
            (
                name(
                    REQUESTS,
                    &[
                        ("pool", "a"),
                        ("model", "m"),
                        ("target", ""),
                        ("outcome", "routed"),
                    ],
                ),
                5,
            ),
            (
                name(
                    REQUESTS,
                    &[
                        ("pool", "b"),
                        ("model", "n"),
                        ("target", ""),
                        ("outcome", "routed"),
                    ],
                ),
                2,
            ),
            (
                name(
                    REQUESTS,
                    &[
                        ("pool", "a"),
                        ("model", "m"),
                        ("target", ""),
                        ("outcome", "least_inflight"),
                    ],
                ),
                3,
            ),
            (
                name(
                    FLOW_OUTCOMES,
                    &[
                        ("pool", "a"),
                        ("band", "standard"),
                        ("outcome", "queue_timeout"),
                    ],
                ),
                4,
            ),
            (name(SNAPSHOT_PUSHES, &[("result", "accepted")]), 9),
            ("cluster.pool.upstream_rq_total".to_string(), 11),
            (name(REQUESTS, &[("pool", "a")]), 1),
        ]
        .into_iter()
        .collect();
        let c = gateway_counts(&stats);
        let want: BTreeMap<String, f64> = [
            ("gateway_requests_routed", 7.0),
            ("gateway_requests_least_inflight", 3.0),
            ("gateway_flow_queue_timeout", 4.0),
            ("gateway_pushes_accepted", 9.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(c, want);
    }

    #[test]
    fn waiting_bounds_are_converted_to_the_emulators_time() {
        let mut c = plugin_config(&[], false, &Value::Null);
        in_emulated_time(&mut c, 1.0);
        assert!(c.get("flow").is_none(), "real pods: nothing converted");
        in_emulated_time(&mut c, 3.0);
        let d = llm_router_core::flow::FlowConfig::default();
        assert_eq!(
            c["flow"]["newest_first_after_ms"],
            (d.newest_first_after_ms as f64 / 3.0).round() as u64
        );
        assert_eq!(c["flow"]["bands"]["standard"]["ttl_ms"], 20_000);
        // A configured value is converted the same way; other settings are left alone.
        let mut e = plugin_config(&[], false, &Value::Null);
        merge_experiment(
            &mut e,
            Some(
                r#"{"flow": {"newest_first_after_ms": 0, "tick_ms": 20, "bands": {"critical": {"ttl_ms": 9000, "max_requests": 5}}}}"#,
            ),
        );
        in_emulated_time(&mut e, 3.0);
        assert_eq!(e["flow"]["newest_first_after_ms"], 0);
        assert_eq!(e["flow"]["tick_ms"], 20);
        assert_eq!(e["flow"]["bands"]["critical"]["ttl_ms"], 3000);
        assert_eq!(e["flow"]["bands"]["critical"]["max_requests"], 5);
        assert_eq!(e["flow"]["bands"]["sheddable"]["ttl_ms"], 20_000);
    }

    #[test]
    fn plugin_config_is_the_default_plus_membership() {
        let c = plugin_config(&[], false, &Value::Null);
        let pool = &c["pools"][0];
        assert_eq!(pool["cluster"], CLUSTER);
        assert_eq!(pool["models"][0], MODEL);
        assert!(pool.get("weights").is_none() && pool.get("preset").is_none());
        assert_eq!(c["snapshot"]["secret"], SECRET);
        let g = plugin_config(&["a".into()], true, &Value::Null);
        assert_eq!(g["pools"][0]["adapters"][0], "a");
        // A scenario's deployment settings merge like an experiment's.
        let t = plugin_config(
            &[],
            false,
            &json!({"priority": {"trust_headers": true}, "pool": {"adapters": ["b"]}}),
        );
        assert_eq!(t["priority"]["trust_headers"], true);
        assert_eq!(t["pools"][0]["adapters"][0], "b");
        assert_eq!(t["pools"][0]["cluster"], CLUSTER);
        let w = &g["pools"][0]["weights"];
        assert_eq!(
            (
                w["queue"].as_f64(),
                w["kv_cache"].as_f64(),
                w["prefix"].as_f64()
            ),
            (Some(2.0), Some(2.0), Some(3.0))
        );
        assert_eq!(
            (w["lora"].as_f64(), w["load"].as_f64()),
            (Some(0.0), Some(0.0))
        );
    }

    #[test]
    fn sidecar_config_lists_every_pod() {
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9001)),
            SocketAddr::from(([127, 0, 0, 1], 9002)),
        ];
        let y = sidecar_config(
            SocketAddr::from(([127, 0, 0, 1], 10000)),
            &pods,
            SocketAddr::from(([127, 0, 0, 1], 9464)),
        );
        assert!(y.contains("address: 127.0.0.1:10000"));
        assert!(y.contains("static: [\"127.0.0.1:9001\", \"127.0.0.1:9002\"]"));
        assert!(y.contains(&format!("secret: {SECRET}")));
        assert!(y.contains("interval_ms: 50"));
    }

    #[test]
    fn counts_pods_in_state_answers() {
        assert_eq!(count_pods(&json!({"pods": 4})), 4);
        assert_eq!(count_pods(&json!({"pods": [1, 2]})), 2);
        assert_eq!(
            count_pods(&json!({"snapshot": {"pools": [{"pods": [1, 2, 3]}, {"pods": 1}]}})),
            4
        );
        assert_eq!(count_pods(&json!({"nothing": true})), 0);
    }

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(50).unwrap();
        let set: std::collections::BTreeSet<u16> = p.iter().copied().collect();
        assert_eq!(set.len(), 50);
    }

    fn fleet(profiles: &[&'static str]) -> FleetSpec {
        FleetSpec {
            pods: profiles
                .iter()
                .map(|p| PodSpec {
                    profile: p,
                    ..PodSpec::default()
                })
                .collect(),
            speedup: 1.0,
            seed: 1,
            engine: PodEngine::ModelSim,
            admission: None,
        }
    }

    #[test]
    fn baselines_render_their_envoy_policies() {
        let f = fleet(&["h100", "a10g"]);
        assert!(heterogeneous(&f) && !heterogeneous(&fleet(&["a10g", "a10g"])));
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9001)),
            SocketAddr::from(([127, 0, 0, 1], 9002)),
        ];
        let cluster = |r: RouterKind| {
            let doc = envoy_spec(r, &f, &pods, &[], &Value::Null)
                .bootstrap(std::path::Path::new("/x"), std::path::Path::new("/y"))
                .unwrap();
            doc["static_resources"]["clusters"][0].clone()
        };
        assert_eq!(cluster(RouterKind::RoundRobin)["lb_policy"], "ROUND_ROBIN");
        assert_eq!(
            cluster(RouterKind::LeastRequest)["lb_policy"],
            "LEAST_REQUEST"
        );
        let full = cluster(RouterKind::LeastRequestFull);
        assert_eq!(
            full["load_balancing_policy"]["policies"][0]["typed_extension_config"]["typed_config"]
                ["selection_method"],
            "FULL_SCAN"
        );
        let w = cluster(RouterKind::WeightedRr);
        assert_eq!(w["lb_policy"], "ROUND_ROBIN");
        let eps = &w["load_assignment"]["endpoints"][0]["lb_endpoints"];
        assert_eq!(eps[0]["load_balancing_weight"], 10);
        assert_eq!(eps[1]["load_balancing_weight"], 1);
        assert!(
            cluster(RouterKind::RoundRobin)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
                .get("load_balancing_weight")
                .is_none()
        );
    }

    /// The routers with admission carry the scenario's bound: Envoy's circuit breakers at it
    /// with overflow answered 429, SMG's documented flags; the unbounded ones stay unbounded.
    #[test]
    fn admission_routers_carry_the_scenarios_bound() {
        let mut f = fleet(&["h100", "h100"]);
        let pods = [
            SocketAddr::from(([127, 0, 0, 1], 9001)),
            SocketAddr::from(([127, 0, 0, 1], 9002)),
        ];
        let bound = AdmissionBound {
            in_flight: 24,
            queue: 100,
            queue_timeout: Duration::from_millis(20_500),
        };
        f.admission = Some(bound);
        let doc = |r: RouterKind| {
            envoy_spec(r, &f, &pods, &[], &Value::Null)
                .bootstrap(std::path::Path::new("/x"), std::path::Path::new("/y"))
                .unwrap()
        };
        let d = doc(RouterKind::RoundRobinAdmission);
        let cluster = &d["static_resources"]["clusters"][0];
        let limits = &cluster["circuit_breakers"]["thresholds"][0];
        assert_eq!(cluster["lb_policy"], "ROUND_ROBIN");
        assert_eq!(
            (
                &limits["max_requests"],
                &limits["max_connections"],
                &limits["max_pending_requests"]
            ),
            (&json!(24), &json!(24), &json!(100))
        );
        assert!(d.to_string().contains("\"status_code\":429"));
        let plain = doc(RouterKind::RoundRobin);
        assert_eq!(
            plain["static_resources"]["clusters"][0]["circuit_breakers"]["thresholds"][0]
                ["max_requests"],
            100_000
        );
        assert!(!plain.to_string().contains("\"status_code\":429"));
        assert_eq!(
            smg_admission_args(&bound),
            [
                "--max-concurrent-requests",
                "24",
                "--queue-size",
                "100",
                "--queue-timeout-secs",
                "21"
            ]
        );
    }

    #[test]
    fn router_names_round_trip() {
        for r in RouterKind::every() {
            assert_eq!(RouterKind::from_name(r.name()), Some(r));
        }
        assert_eq!(RouterKind::names().len(), 17);
        for r in RouterKind::PEERS {
            let (_, policy) = r.peer().unwrap();
            assert!(r.name().ends_with(policy) && !r.uses_filter() && r.replicas() == 1);
        }
        assert!(RouterKind::every()
            .filter(|r| !RouterKind::PEERS.contains(r) && !r.admits())
            .all(|r| r.peer().is_none()));
        assert_eq!(
            RouterKind::SmgCacheAwareAdmission.peer(),
            RouterKind::SmgCacheAware.peer()
        );
        assert!(RouterKind::every()
            .filter(|r| r.admits())
            .all(|r| !r.uses_filter() && r.name().ends_with("_admission")));
        assert_eq!(RouterKind::from_name("random"), None);
        assert!(RouterKind::Filter.uses_filter() && !RouterKind::LeastRequest.uses_filter());
    }
}
