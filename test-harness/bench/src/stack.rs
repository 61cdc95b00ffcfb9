//! Starts and stops what one benchmark run needs: fresh model-sim pods, Envoy with the router
//! under test and, for the filter, the metrics sidecar pushing snapshots into it.
//!
//! Every process is a `testkit::ChildGuard` (stopped by PID on drop), so a failed or interrupted
//! run leaves nothing behind.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::{ChildGuard, EnvoyProcess, EnvoySpec, Router as EnvoyRouter};

/// The base model every pod serves.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
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
    /// with its own sidecar, no shared state; the load generator alternates requests between
    /// them (so the turns of one conversation reach both). An optional extra that measures
    /// whether replicas agree on prefix placement.
    FilterReplicas,
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
    pub const EXTRA: [RouterKind; 2] = [RouterKind::FilterGaieWeights, RouterKind::FilterReplicas];

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
        }
    }

    /// Parse a router name (default set and extras).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::EXTRA)
            .find(|r| r.name() == s)
    }

    /// Every accepted name.
    pub fn names() -> Vec<&'static str> {
        Self::ALL
            .into_iter()
            .chain(Self::EXTRA)
            .map(Self::name)
            .collect()
    }

    /// Whether the filter (and therefore the sidecar) is in the path.
    pub fn uses_filter(self) -> bool {
        matches!(
            self,
            RouterKind::Filter | RouterKind::FilterGaieWeights | RouterKind::FilterReplicas
        )
    }

    /// How many gateway replicas (Envoy processes) the router runs.
    pub fn replicas(self) -> usize {
        match self {
            RouterKind::FilterReplicas => 2,
            _ => 1,
        }
    }
}

/// Static weight of a GPU profile for the weighted round robin: its saturation throughput
/// measured with `bench calibrate` (closed loop, one pod), relative to an A10G-like pod —
/// H100-like ≈ 18 req/s vs A10G-like ≈ 1.8 req/s with the mixed-GPU prompts. Profiles never
/// mixed with others get 1 (weights only matter between different profiles).
pub fn capacity_weight(profile: &str) -> u32 {
    match profile {
        "h100" => 10,
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
) -> EnvoySpec {
    let envoy_router = match router {
        RouterKind::RoundRobin | RouterKind::WeightedRr => EnvoyRouter::RoundRobin,
        RouterKind::LeastRequest | RouterKind::LeastRequestFull => EnvoyRouter::LeastRequest,
        RouterKind::Filter | RouterKind::FilterGaieWeights | RouterKind::FilterReplicas => {
            EnvoyRouter::Filter
        }
    };
    let mut spec = EnvoySpec::new(envoy_router)
        .pool(POOL, CLUSTER, pods.to_vec())
        .concurrency(2);
    spec.name = format!("bench-envoy-{}", router.name());
    match router {
        RouterKind::LeastRequestFull => {
            spec.cluster_lb_policy = Some(testkit::least_request_full_scan_policy());
        }
        RouterKind::WeightedRr => {
            spec.endpoint_weights = pods
                .iter()
                .zip(&fleet.pods)
                .map(|(a, p)| (*a, capacity_weight(p.profile)))
                .collect();
        }
        RouterKind::Filter | RouterKind::FilterGaieWeights | RouterKind::FilterReplicas => {
            spec = spec.plugin_config(plugin_config(
                adapters,
                router == RouterKind::FilterGaieWeights,
            ));
        }
        RouterKind::RoundRobin | RouterKind::LeastRequest => {}
    }
    spec
}

/// One emulated pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSpec {
    /// GPU profile (`h100`, `a10g`, `h100-70b`).
    pub profile: &'static str,
    /// LoRA slots, if not the emulator's default.
    pub max_loras: Option<u32>,
    /// CPU LoRA cache (`--max-cpu-loras`), if not the emulator's default (= `max_loras`).
    pub max_cpu_loras: Option<u32>,
    /// Output length mode (`--output-len max|uniform|lognormal`), if not the default (max).
    pub output_len: Option<&'static str>,
    /// A lying pod (`--lie-metrics`): `/metrics` reports an empty engine whatever its state.
    pub lie_metrics: bool,
}

impl PodSpec {
    /// A pod of `profile` with the emulator's defaults otherwise.
    pub fn new(profile: &'static str) -> Self {
        PodSpec {
            profile,
            ..PodSpec::default()
        }
    }
}

/// The fleet of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    /// The pods.
    pub pods: Vec<PodSpec>,
    /// Emulator time speed-up (times are divided by it).
    pub speedup: f64,
    /// Seed of the pods (pod i gets seed + i).
    pub seed: u64,
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
        source: testkit::Error,
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
    /// Writing a config file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn tk(what: impl Into<String>) -> impl FnOnce(testkit::Error) -> StackError {
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
        if let Ok(r) = testkit::get(addr, path, &[]).await {
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

/// Start fresh model-sim pods (one process each) and wait for their `/health`.
pub async fn start_pods(fleet: &FleetSpec) -> Result<Pods, StackError> {
    let bin = testkit::bin("model-sim").map_err(tk("model-sim binary"))?;
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
        if let Some(m) = p.output_len {
            cmd.arg("--output-len").arg(m);
        }
        if p.lie_metrics {
            cmd.arg("--lie-metrics");
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
/// the snapshot secret; `gaie_weights` swaps in GAIE's default weights.
pub fn plugin_config(adapters: &[String], gaie_weights: bool) -> Value {
    let mut pool = json!({"name": POOL, "cluster": CLUSTER, "models": [MODEL]});
    if !adapters.is_empty() {
        pool["adapters"] = json!(adapters);
    }
    if gaie_weights {
        pool["weights"] = json!({"queue": 2, "kv_cache": 2, "prefix": 3, "lora": 0, "load": 0});
    }
    json!({"pools": [pool], "snapshot": {"secret": SECRET}})
}

/// The sidecar's configuration for these pods, pushing to `envoy`.
pub fn sidecar_config(envoy: SocketAddr, pods: &[SocketAddr], listen: SocketAddr) -> String {
    let list: Vec<String> = pods.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "# Generated by bench for one run.\npush:\n  address: {envoy}\n  path: /__llm_router/snapshot\n  secret: {SECRET}\nscrape:\n  interval_ms: 50\nlisten: {listen}\npools:\n  - name: {POOL}\n    cluster: {CLUSTER}\n    models: [\"{MODEL}\"]\n    engine: vllm\n    discovery:\n      static: [{}]\n",
        list.join(", ")
    )
}

/// A running stack for one router.
pub struct Stack {
    /// The router.
    pub router: RouterKind,
    /// The pods.
    pub pods: Pods,
    /// Envoy.
    pub envoy: EnvoyProcess,
    /// The sidecar (filter routers only).
    pub sidecar: Option<ChildGuard>,
    /// Further gateway replicas, each an Envoy with its own sidecar ([`RouterKind::replicas`]).
    pub replicas: Vec<(EnvoyProcess, ChildGuard)>,
}

impl Stack {
    /// The chat completions URL through Envoy.
    pub fn chat_url(&self) -> String {
        self.envoy.url("/v1/chat/completions")
    }

    /// The chat completions URL of every gateway replica, the first one first.
    pub fn chat_urls(&self) -> Vec<String> {
        std::iter::once(&self.envoy)
            .chain(self.replicas.iter().map(|(e, _)| e))
            .map(|e| e.url("/v1/chat/completions"))
            .collect()
    }

    /// PIDs of the processes of the stack, by role (`envoy`, `pods`, `sidecar`).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        let mut v = vec![("envoy", self.envoy.pid())];
        v.extend(self.replicas.iter().map(|(e, _)| ("envoy", e.pid())));
        v.extend(self.pods.guards.iter().map(|g| ("pods", g.pid())));
        v.extend(self.sidecar.iter().map(|g| ("sidecar", g.pid())));
        v.extend(self.replicas.iter().map(|(_, s)| ("sidecar", s.pid())));
        v
    }

    /// Stop everything (also done on drop): sidecar, Envoy, pods.
    pub fn stop(mut self) {
        if let Some(s) = self.sidecar.as_mut() {
            s.stop();
        }
        for (e, s) in &mut self.replicas {
            s.stop();
            e.stop();
        }
        self.envoy.stop();
        for g in &mut self.pods.guards {
            g.stop();
        }
    }
}

/// Start pods, Envoy with `router` and (for the filter) the sidecar; wait until the filter holds
/// a snapshot with every pod.
pub async fn start_stack(
    fleet: &FleetSpec,
    router: RouterKind,
    adapters: &[String],
) -> Result<Stack, StackError> {
    let pods = start_pods(fleet).await?;
    let spec = envoy_spec(router, fleet, &pods.addrs, adapters);
    let envoy = spec.start().await.map_err(tk("start Envoy"))?;
    let sidecar = if router.uses_filter() {
        Some(start_sidecar(envoy.push_addr(), &pods.addrs).await?)
    } else {
        None
    };
    let mut replicas = Vec::new();
    for i in 1..router.replicas() {
        let mut spec = envoy_spec(router, fleet, &pods.addrs, adapters);
        spec.name = format!("{}-replica{i}", spec.name);
        let e = spec.start().await.map_err(tk("start Envoy replica"))?;
        let s = start_sidecar(e.push_addr(), &pods.addrs).await?;
        replicas.push((e, s));
    }
    let stack = Stack {
        router,
        pods,
        envoy,
        sidecar,
        replicas,
    };
    if router.uses_filter() {
        wait_snapshot(&stack, Duration::from_secs(15)).await?;
        for (e, s) in &stack.replicas {
            wait_snapshot_at(
                e.push_addr(),
                stack.pods.addrs.len() as u64,
                Duration::from_secs(15),
                &s.log_path().display().to_string(),
            )
            .await?;
        }
    }
    Ok(stack)
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
    let bin = testkit::bin("sidecar-metrics").map_err(tk("sidecar-metrics binary"))?;
    let dir = testkit::testlog_dir("bench-sidecar").map_err(tk("log dir"))?;
    let listen = match listen {
        Some(a) => a,
        None => SocketAddr::from((
            [127, 0, 0, 1],
            testkit::free_port().map_err(tk("free port"))?,
        )),
    };
    let path: PathBuf = dir.join("sidecar.yaml");
    let text = sidecar_config(envoy, pods, listen);
    std::fs::write(&path, text).map_err(|source| StackError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("--config").arg(&path);
    let g = ChildGuard::spawn_logged("sidecar-metrics", cmd, &dir.join("sidecar.log"))
        .map_err(tk("start sidecar-metrics"))?;
    Ok((g, listen))
}

/// Wait until the filter reports a snapshot holding every pod (`GET /__llm_router/state`).
pub async fn wait_snapshot(stack: &Stack, timeout: Duration) -> Result<(), StackError> {
    let log = stack
        .sidecar
        .as_ref()
        .map(|s| s.log_path().display().to_string())
        .unwrap_or_default();
    wait_snapshot_at(
        stack.envoy.push_addr(),
        stack.pods.addrs.len() as u64,
        timeout,
        &log,
    )
    .await
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
        if let Ok(r) = testkit::get(listener, "/__llm_router/state", &[]).await {
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
    use super::*;

    #[test]
    fn plugin_config_is_the_default_plus_membership() {
        let c = plugin_config(&[], false);
        let pool = &c["pools"][0];
        assert_eq!(pool["cluster"], CLUSTER);
        assert_eq!(pool["models"][0], MODEL);
        assert!(pool.get("weights").is_none() && pool.get("preset").is_none());
        assert_eq!(c["snapshot"]["secret"], SECRET);
        let g = plugin_config(&["a".into()], true);
        assert_eq!(g["pools"][0]["adapters"][0], "a");
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
            let doc = envoy_spec(r, &f, &pods, &[])
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

    #[test]
    fn router_names_round_trip() {
        for r in RouterKind::ALL.into_iter().chain(RouterKind::EXTRA) {
            assert_eq!(RouterKind::from_name(r.name()), Some(r));
        }
        assert_eq!(RouterKind::from_name("random"), None);
        assert!(RouterKind::Filter.uses_filter() && !RouterKind::LeastRequest.uses_filter());
    }
}
