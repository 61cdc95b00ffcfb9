//! `bench scale`: what one request, one push and one worker cost as the fleet grows — synthetic
//! fleets of 4 to 4,096 pods over 1 to 200 pools, with 0 or 1,000 LoRA adapters and a spread of
//! load, measured per fleet size in up to three parts:
//!
//! - **wasmtime** (always; cheap): the release filter `.wasm` in `proxy-wasm-host` (one worker
//!   VM), the fleet pushed as the sidecar would (signed), then many routed requests of a 2 KB
//!   and a 20 KB chat body (varied shared system prompts, a unique user turn each): decision
//!   time p50/p99 (headers to the end of the last body callback: parse, pool lookup, scoring,
//!   headers set), the push and the first decision after it (which decodes the snapshot), the
//!   VM's linear memory and the shared data after the requests, then the prefix index's bytes
//!   after many distinct prompts (its steady state: `index_slots` per pool bound it).
//! - **envoy** (`--envoy`): the fleet's pods are in-process instant backends (one loopback
//!   listener each), every pool an Envoy cluster; plain Envoy and Envoy with the filter, the
//!   synthetic snapshot pushed into the latter (no sidecar: the load spread is the fleet's).
//!   Push-to-visible: POST the signed snapshot, then poll `/__llm_router/state` until it names
//!   the new generation and one routed request has been answered (shared data is one per Envoy
//!   process, so every worker reads the new generation at its next request; the decode each
//!   worker then does is the wasmtime part's first decision). Then `overhead::measure` with the
//!   arms direct, envoy and envoy_filter (interleaved sequential rounds, alternating closed
//!   loops): Envoy CPU per routed request and req/s ÷ plain Envoy, at 2 KB. The decision
//!   histogram `llm_router_decision_duration_microseconds` from Envoy's `/stats` (cumulative
//!   quantiles over every routed request of the run, read after Envoy's 5 s stats flush), and
//!   Envoy's VmRSS with the filter minus plain Envoy's.
//! - **sidecar** (`--sidecar`): `sidecar_cost::measure` at the fleet's pod count (one model-sim
//!   process serving every pod's `/metrics`, the real sidecar scraping every 50 ms), once per
//!   pod count (the sidecar's work does not depend on how the pods are split into pools).
//!
//! Writes `scale.json`, `scale.md` and one SVG chart per measure (against pods, log x) to the
//! output directory. Every part is bounded (request timeouts, poll deadlines); processes are
//! stopped by PID through their guards when a part ends or fails.

use crate::analysis::procfs::rss_bytes;
use crate::analysis::stats::percentile;
use crate::experiments::overhead::{self, OverheadOptions, RouterArm};
use crate::loadgen::instant::InstantBackend;
use crate::report::chart::{line_chart_svg, Series};
use crate::report::overhead::{DIRECT, ENVOY, ENVOY_FILTER};
use crate::stack::fleet::MODEL;
use crate::stack::{CLUSTER, POOL, SECRET};
use llm_router_snapshot::{Engine, Health, LoraState, Pod, Pool, Snapshot};
use proxy_wasm_host::{Host, Module, Vm};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::{EnvoySpec, Router};

/// The default pod counts.
pub const PODS: [usize; 5] = [4, 64, 256, 1024, 4096];
/// The default pool counts.
pub const POOLS: [usize; 3] = [1, 20, 200];
/// The default adapter counts.
pub const ADAPTERS: [usize; 2] = [0, 1000];
/// Body sizes of the wasmtime part, bytes.
pub const BODY_SIZES: [usize; 2] = [2 * 1024, 20 * 1024];
/// Adapter slots per pod (`max_loras`) in the synthetic fleets.
const MAX_LORAS: u16 = 4;
/// Distinct system prompts the requests share (prefix reuse).
const SYSTEM_PROMPTS: usize = 16;
/// Snapshot push path of the filter.
const PUSH_PATH: &str = "/__llm_router/snapshot";
/// State path of the filter.
const STATE_PATH: &str = "/__llm_router/state";

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// Pod counts.
    pub pods: Vec<usize>,
    /// Pool counts (pods spread over them; a size with fewer pods than pools is skipped).
    pub pools: Vec<usize>,
    /// Adapter counts (spread over the pools).
    pub adapters: Vec<usize>,
    /// Timed wasmtime requests per body size.
    pub wasm_requests: usize,
    /// Distinct prompts sent to fill the prefix index before its size is read.
    pub prefix_prompts: usize,
    /// Run the Envoy part.
    pub envoy: bool,
    /// Sequential requests per arm in the Envoy part (fleets over 1,000 pods use a quarter).
    pub envoy_requests: usize,
    /// Closed-loop seconds per arm in the Envoy part (0: none, so no req/s).
    pub rps_secs: f64,
    /// Pushes timed per fleet in the Envoy part.
    pub pushes: usize,
    /// Run the sidecar part.
    pub sidecar: bool,
    /// Sidecar measurement window, s.
    pub sidecar_secs: u64,
    /// Where scale.{json,md} and the charts go.
    pub out_dir: PathBuf,
    /// Seed of the fleets' load and the prompts.
    pub seed: u64,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        ScaleOptions {
            pods: PODS.to_vec(),
            pools: POOLS.to_vec(),
            adapters: ADAPTERS.to_vec(),
            wasm_requests: 1000,
            prefix_prompts: 2000,
            envoy: true,
            envoy_requests: 400,
            rps_secs: 2.0,
            pushes: 5,
            sidecar: true,
            sidecar_secs: 10,
            out_dir: testkit::workspace_root().join("test-harness/bench/results"),
            seed: 23,
        }
    }
}

/// One fleet size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FleetSize {
    /// Pods in the fleet.
    pub pods: usize,
    /// Pools they are spread over (pod `i` in pool `i mod pools`).
    pub pools: usize,
    /// LoRA adapters configured, spread over the pools (adapter `j` in pool `j mod pools`).
    pub adapters: usize,
}

/// The sizes `opts` asks for, pods-major; combinations with fewer than one pod per pool are
/// left out.
pub fn fleet_sizes(opts: &ScaleOptions) -> Vec<FleetSize> {
    let mut out = Vec::new();
    for &pods in &opts.pods {
        for &pools in &opts.pools {
            if pools == 0 || pods < pools {
                continue;
            }
            for &adapters in &opts.adapters {
                out.push(FleetSize {
                    pods,
                    pools,
                    adapters,
                });
            }
        }
    }
    out
}

/// A synthetic fleet: the snapshot the sidecar would push, the filter's configuration and the
/// pools' Envoy clusters.
#[derive(Debug, Clone)]
pub struct SyntheticFleet {
    /// The fleet's size.
    pub size: FleetSize,
    /// Its snapshot (generation 1).
    pub snapshot: Snapshot,
    /// The filter's plugin configuration (pools, models, adapters, the snapshot secret).
    pub config: Value,
    /// Per pool: name, cluster, base model, adapters, pod addresses.
    pub pools: Vec<PoolPlan>,
}

/// One pool of a synthetic fleet.
#[derive(Debug, Clone)]
pub struct PoolPlan {
    /// Pool name (the first pool is the bench's usual `POOL`).
    pub name: String,
    /// Its Envoy cluster.
    pub cluster: String,
    /// The base model it serves (the first pool's is `MODEL`, which the overhead bodies ask for).
    pub model: String,
    /// Its adapters.
    pub adapters: Vec<String>,
    /// Its pods' addresses.
    pub addresses: Vec<String>,
}

/// A realistic spread of load on one pod: mostly short queues with a tail of long ones, KV use
/// across the range, a few failing or stale pods, and when the pool has adapters some of them
/// resident (and sometimes one waiting).
fn pod(rng: &mut StdRng, address: String, adapters: &[String], now_ms: u64) -> Pod {
    let roll: f64 = rng.random();
    let (health, failures) = if roll < 0.02 {
        (Health::Failing, rng.random_range(1..4))
    } else if roll < 0.03 {
        (Health::Stale, 0)
    } else {
        (Health::Ok, 0)
    };
    let q: f64 = rng.random();
    let waiting = if q < 0.6 {
        0
    } else if q < 0.85 {
        rng.random_range(1..5)
    } else {
        rng.random_range(5..41)
    };
    let lora = (!adapters.is_empty()).then(|| {
        let resident = rng.random_range(0..=usize::from(MAX_LORAS).min(adapters.len()));
        let mut running: Vec<String> = Vec::with_capacity(resident);
        while running.len() < resident {
            let a = &adapters[rng.random_range(0..adapters.len())];
            if !running.contains(a) {
                running.push(a.clone());
            }
        }
        let waiting = if rng.random_bool(0.1) {
            vec![adapters[rng.random_range(0..adapters.len())].clone()]
        } else {
            vec![]
        };
        LoraState {
            running,
            waiting,
            max_loras: MAX_LORAS,
        }
    });
    Pod {
        address,
        engine: Engine::Vllm,
        health,
        failures,
        scraped_at_ms: now_ms.saturating_sub(rng.random_range(0..50)),
        waiting,
        running: rng.random_range(0..65),
        kv_usage: Some(rng.random_range(0.05..0.97)),
        block_size: 16,
        num_blocks: [2048, 4096, 8192, 16384][rng.random_range(0..4)],
        lora,
        peers: Default::default(),
    }
}

/// Synthetic pod addresses (10.x.y.z:8000) for the wasmtime part, where nothing is dialled.
pub fn synthetic_addresses(pods: usize) -> Vec<String> {
    (0..pods)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256))
        .collect()
}

/// The fleet of `size` on `addresses` (one per pod), loads drawn from `seed`.
pub fn synthetic(size: FleetSize, addresses: &[String], now_ms: u64, seed: u64) -> SyntheticFleet {
    let mut rng = StdRng::seed_from_u64(seed ^ (size.pods as u64) << 20 ^ size.pools as u64);
    let mut pools: Vec<PoolPlan> = (0..size.pools)
        .map(|p| {
            let (name, cluster, model) = if p == 0 {
                (POOL.to_string(), CLUSTER.to_string(), MODEL.to_string())
            } else {
                (
                    format!("pool-{p}"),
                    format!("pool_{p}"),
                    format!("org/model-{p}"),
                )
            };
            PoolPlan {
                name,
                cluster,
                model,
                adapters: Vec::new(),
                addresses: Vec::new(),
            }
        })
        .collect();
    for j in 0..size.adapters {
        pools[j % size.pools]
            .adapters
            .push(format!("adapter-{j:04}"));
    }
    for (i, a) in addresses.iter().take(size.pods).enumerate() {
        pools[i % size.pools].addresses.push(a.clone());
    }
    let snapshot = Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: now_ms,
        pools: pools
            .iter()
            .map(|p| Pool {
                name: p.name.clone(),
                cluster: p.cluster.clone(),
                models: vec![p.model.clone()],
                pods: p
                    .addresses
                    .iter()
                    .map(|a| pod(&mut rng, a.clone(), &p.adapters, now_ms))
                    .collect(),
                peer_contexts: Vec::new(),
            })
            .collect(),
    };
    let config = json!({
        "pools": pools.iter().map(|p| {
            let mut v = json!({"name": p.name, "cluster": p.cluster, "models": [p.model]});
            if !p.adapters.is_empty() {
                v["adapters"] = json!(p.adapters);
            }
            v
        }).collect::<Vec<_>>(),
        "snapshot": {"secret": SECRET, "stale_after_ms": 3_600_000},
    });
    SyntheticFleet {
        size,
        snapshot,
        config,
        pools,
    }
}

/// A chat body of about `size` bytes to `model`: one of [`SYSTEM_PROMPTS`] shared system
/// prompts (a few hundred bytes) and a user turn unique to `i`.
pub fn chat_body(model: &str, size: usize, i: usize) -> Vec<u8> {
    let system = format!(
        "System prompt {} of the fleet: you are a helpful assistant for team {}; answer briefly \
         and cite the documents you were given. {}",
        i % SYSTEM_PROMPTS,
        i % SYSTEM_PROMPTS,
        "Keep to the facts. ".repeat(8)
    );
    let mut rng = StdRng::seed_from_u64(i as u64);
    let mut user = format!("request {i}: ");
    let want = size.saturating_sub(system.len() + 120).max(16);
    while user.len() < want {
        user.push_str(crate::loadgen::workload::text(&mut rng, 64).as_str());
        user.push(' ');
    }
    user.truncate(want);
    json!({"model": model, "stream": true, "max_tokens": 64, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]})
    .to_string()
    .into_bytes()
}

/// Decision time at one body size under wasmtime.
#[derive(Debug, Clone, Serialize)]
pub struct WasmDecision {
    /// Body bytes.
    pub body_bytes: usize,
    /// Timed requests.
    pub requests: usize,
    /// p50, µs.
    pub p50_us: f64,
    /// p99, µs.
    pub p99_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
}

/// What the wasmtime part measured for one fleet.
#[derive(Debug, Clone, Serialize)]
pub struct WasmFigures {
    /// Per body size.
    pub decisions: Vec<WasmDecision>,
    /// The push request (verify, decode, store, baselines), µs.
    pub push_us: f64,
    /// The first routed request after the push (decodes the snapshot for this worker), µs.
    pub first_decision_us: f64,
    /// The same for a second push (a new generation), µs, and its first decision.
    pub repush_us: f64,
    /// See `repush_us`.
    pub repush_first_decision_us: f64,
    /// The VM's linear memory after the push and the timed requests, bytes.
    pub memory_bytes: usize,
    /// Shared data (keys + values) after the timed requests, bytes (one per Envoy process,
    /// not per worker).
    pub shared_bytes: usize,
    /// The prefix index's pages (keys + values) after `prefix_prompts` more distinct prompts.
    pub prefix_index_bytes: usize,
    /// Its pages.
    pub prefix_index_pages: usize,
    /// Distinct prompts sent before the index was read.
    pub prefix_prompts: usize,
    /// The VM's linear memory after those prompts, bytes.
    pub memory_after_prefix_bytes: usize,
}

fn push_wasm(vm: &Vm, bytes: &[u8]) -> Result<f64, String> {
    let sig = llm_router_snapshot::sign(SECRET.as_bytes(), bytes);
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", PUSH_PATH),
        (llm_router_snapshot::SIGNATURE_HEADER, &sig),
    ])
    .property("source.address", "127.0.0.1:1")
    .body(bytes);
    let t = Instant::now();
    r.send().map_err(|e| e.to_string())?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    let status = r.local_response().map(|l| l.status);
    r.finish().map_err(|e| e.to_string())?;
    if status != Some(200) {
        return Err(format!("push answered {status:?}"));
    }
    Ok(us)
}

/// One routed request; its decision time, µs.
fn route_wasm(vm: &Vm, body: &[u8]) -> Result<f64, String> {
    let len = body.len().to_string();
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", &len),
    ])
    .body_split(body, 16 * 1024);
    let t = Instant::now();
    r.send().map_err(|e| e.to_string())?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    if r.upstream_header("x-gateway-destination-endpoint")
        .is_none()
    {
        return Err(format!("not routed: {}", r.explain()));
    }
    r.finish().map_err(|e| e.to_string())?;
    Ok(us)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The wasmtime part for one fleet.
pub fn wasm_part(
    module: &Module,
    size: FleetSize,
    opts: &ScaleOptions,
) -> Result<WasmFigures, String> {
    let host = Host::new(module);
    let now = host.now_ms();
    let fleet = synthetic(size, &synthetic_addresses(size.pods), now, opts.seed);
    let vm = host
        .builder()
        .plugin_config({
            let mut c = fleet.config.clone();
            c["snapshot"]["endpoints"] = json!(true);
            c.to_string()
        })
        .trace(false)
        .start()
        .map_err(|e| e.to_string())?;
    let bytes = fleet.snapshot.encode().map_err(|e| e.to_string())?;
    let push_us = push_wasm(&vm, &bytes)?;
    let pool0 = &fleet.pools[0];
    // A fifth of the requests ask for one of the first pool's adapters, when it has any.
    let model_of = |i: usize| -> &str {
        if !pool0.adapters.is_empty() && i % 5 == 4 {
            &pool0.adapters[i % pool0.adapters.len()]
        } else {
            &pool0.model
        }
    };
    let first_decision_us = route_wasm(&vm, &chat_body(model_of(0), BODY_SIZES[0], 0))?;
    let mut decisions = Vec::new();
    let mut i = 1;
    for &body_bytes in &BODY_SIZES {
        let n = opts.wasm_requests.max(10);
        let warm = (n / 10).max(5);
        let mut times = Vec::with_capacity(n);
        for k in 0..n + warm {
            let body = chat_body(model_of(i), body_bytes, i);
            i += 1;
            let t = route_wasm(&vm, &body)?;
            if k >= warm {
                times.push(t);
            }
            if k % 256 == 0 {
                vm.forget_finished();
            }
        }
        decisions.push(WasmDecision {
            body_bytes,
            requests: times.len(),
            p50_us: percentile(&times, 50.0),
            p99_us: percentile(&times, 99.0),
            mean_us: mean(&times),
        });
    }
    vm.forget_finished();
    let memory_bytes = vm.memory_bytes();
    let shared = |prefix: &str| -> (usize, usize) {
        let keys: Vec<String> = host
            .shared_keys()
            .into_iter()
            .filter(|k| k.starts_with(prefix))
            .collect();
        let bytes = keys
            .iter()
            .map(|k| k.len() + host.shared_data(k).map_or(0, |(v, _)| v.len()))
            .sum();
        (bytes, keys.len())
    };
    let (shared_bytes, _) = shared("");
    // A new generation, as the sidecar pushes every scrape: the push and the decode it causes.
    let mut next = fleet.snapshot.clone();
    next.generation = 2;
    let bytes2 = next.encode().map_err(|e| e.to_string())?;
    let repush_us = push_wasm(&vm, &bytes2)?;
    let repush_first_decision_us = route_wasm(&vm, &chat_body(model_of(i), BODY_SIZES[0], i))?;
    i += 1;
    for k in 0..opts.prefix_prompts {
        route_wasm(&vm, &chat_body(model_of(i), BODY_SIZES[0], i))?;
        i += 1;
        if k % 256 == 0 {
            vm.forget_finished();
        }
    }
    vm.forget_finished();
    let (prefix_index_bytes, prefix_index_pages) = shared("llmr/px/");
    Ok(WasmFigures {
        decisions,
        push_us,
        first_decision_us,
        repush_us,
        repush_first_decision_us,
        memory_bytes,
        shared_bytes,
        prefix_index_bytes,
        prefix_index_pages,
        prefix_prompts: opts.prefix_prompts,
        memory_after_prefix_bytes: vm.memory_bytes(),
    })
}

/// What the Envoy part measured for one fleet.
#[derive(Debug, Clone, Serialize)]
pub struct EnvoyFigures {
    /// Envoy worker threads.
    pub workers: u32,
    /// Push-to-visible per push, ms (POST sent → state names the generation and a routed
    /// request was answered).
    pub push_visible_ms: Vec<f64>,
    /// The POST alone (the push's round trip), ms, per push.
    pub push_post_ms: Vec<f64>,
    /// The filter's decision histogram (cumulative over the run), p50 / p99, µs; NaN when the
    /// histogram was not found.
    pub decision_p50_us: f64,
    /// See `decision_p50_us`.
    pub decision_p99_us: f64,
    /// The plain-vs-filter case at 2 KB (Envoy CPU per request, req/s ratio, latencies).
    pub case: Option<crate::report::overhead::OverheadCase>,
    /// Envoy with the filter's VmRSS minus plain Envoy's after the run, bytes.
    pub envoy_rss_extra_bytes: Option<i64>,
    /// Envoy with the filter's VmRSS after the run, bytes.
    pub envoy_filter_rss_bytes: Option<u64>,
}

/// `Pnn(interval,cumulative)` of Envoy's text histogram line → the cumulative value.
pub fn histogram_quantile(stats: &str, name: &str, q: &str) -> Option<f64> {
    let line = stats.lines().find(|l| {
        l.split(':')
            .next()
            .is_some_and(|n| n.trim().ends_with(name))
    })?;
    let tag = format!("{q}(");
    let rest = &line[line.find(&tag)? + tag.len()..];
    let inner = &rest[..rest.find(')')?];
    inner.split(',').nth(1)?.trim().parse().ok()
}

async fn state_generation(addr: SocketAddr) -> Option<u64> {
    // The summary reads the generation from the meta key: polling the whole state page would
    // decode the snapshot and render every pod per poll, and time the probe, not the push.
    let r = testkit::get(addr, &format!("{STATE_PATH}?summary"), &[])
        .await
        .ok()?;
    if r.status != 200 {
        return None;
    }
    r.json().ok()?.get("generation")?.as_u64()
}

/// The Envoy part for one fleet.
pub async fn envoy_part(size: FleetSize, opts: &ScaleOptions) -> Result<EnvoyFigures, String> {
    let mut backends = Vec::with_capacity(size.pods);
    for _ in 0..size.pods {
        backends.push(
            InstantBackend::start()
                .await
                .map_err(|e| format!("instant backend: {e}"))?,
        );
    }
    let addrs: Vec<String> = backends.iter().map(|b| b.addr().to_string()).collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let fleet = synthetic(size, &addrs, now, opts.seed);
    let with_pools = |mut spec: EnvoySpec| {
        for p in &fleet.pools {
            let eps: Vec<SocketAddr> = p.addresses.iter().filter_map(|a| a.parse().ok()).collect();
            spec = spec.pool(p.name.clone(), p.cluster.clone(), eps);
        }
        spec
    };
    let mut plain = with_pools(EnvoySpec::new(Router::RoundRobin));
    plain.name = "bench-scale-plain".into();
    let plain = plain
        .start()
        .await
        .map_err(|e| format!("plain Envoy: {e}"))?;
    // Instant backends: flow control admits every request, as in `bench overhead` (its
    // `instant_pool_settings`: a pool of one or two pods with an unchanging snapshot took the
    // closed loop's clients as a queue and held them, 0.03× plain Envoy's req/s at 200 pools).
    let mut config = fleet.config.clone();
    if let Some(pools) = config["pools"].as_array_mut() {
        for p in pools {
            p["saturation"] = overhead::instant_saturation();
        }
    }
    let mut spec = with_pools(EnvoySpec::new(Router::Filter)).plugin_config(config);
    spec.name = "bench-scale-filter".into();
    let workers = spec.concurrency;
    let envoy = spec
        .start()
        .await
        .map_err(|e| format!("Envoy with the filter: {e}"))?;
    let push = envoy.push_addr();
    let client = crate::loadgen::client::http_client();
    let routed_uri: hyper::Uri = envoy
        .url(overhead::ROUTED_PATH)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let probe = bytes::Bytes::from(chat_body(MODEL, 2048, 0));
    let mut push_visible_ms = Vec::new();
    let mut push_post_ms = Vec::new();
    for k in 0..opts.pushes.max(1) {
        let mut snap = fleet.snapshot.clone();
        snap.generation = now + k as u64;
        snap.created_ms = now;
        let bytes = snap.encode().map_err(|e| e.to_string())?;
        let sig = llm_router_snapshot::sign(SECRET.as_bytes(), &bytes);
        let t = Instant::now();
        let r = testkit::post_bytes(
            push,
            PUSH_PATH,
            &[(llm_router_snapshot::SIGNATURE_HEADER, sig.as_str())],
            bytes,
        )
        .await
        .map_err(|e| format!("push: {e}"))?;
        push_post_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if r.status != 200 {
            return Err(format!("push answered {}: {}", r.status, r.text()));
        }
        let deadline = t + Duration::from_secs(30);
        loop {
            if state_generation(push).await == Some(snap.generation) {
                break;
            }
            if Instant::now() > deadline {
                return Err("the pushed generation did not become visible in 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let req = hyper::Request::post(routed_uri.clone())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(probe.clone()))
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
            .await
            .map_err(|_| "routed probe timed out".to_string())?
            .map_err(|e| format!("routed probe: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("routed probe answered {}", resp.status()));
        }
        push_visible_ms.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let envoy_pid = envoy.pid();
    let plain_pid = plain.pid();
    let arms = vec![
        RouterArm::new(
            DIRECT,
            &format!("http://{}{}", backends[0].addr(), overhead::ROUTED_PATH),
            Vec::new(),
        )
        .map_err(|e| e.to_string())?,
        RouterArm::new(
            ENVOY,
            &plain.url(overhead::ROUTED_PATH),
            vec![("envoy".into(), plain_pid)],
        )
        .map_err(|e| e.to_string())?,
        RouterArm::new(
            ENVOY_FILTER,
            &envoy.url(overhead::ROUTED_PATH),
            vec![("envoy".into(), envoy_pid)],
        )
        .map_err(|e| e.to_string())?,
    ];
    let requests = if size.pods > 1000 {
        (opts.envoy_requests / 4).max(20)
    } else {
        opts.envoy_requests
    };
    let oo = OverheadOptions {
        latency_requests: requests,
        rps_duration: Duration::from_secs_f64(opts.rps_secs.clamp(0.0, 600.0)),
        concurrency: 16,
        pass_through: false,
        arms: Vec::new(),
        sizes: vec![2048],
    };
    let result = overhead::measure(&arms, &oo).await;
    // Envoy merges its workers' histograms at its stats flush (every 5 s).
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let stats = envoy
        .admin_get("/stats?filter=decision_duration")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let name = llm_router_core::metrics::DECISION_DURATION;
    let q = |p| histogram_quantile(&stats, name, p).unwrap_or(f64::NAN);
    let (rf, rp) = (rss_bytes(envoy_pid), rss_bytes(plain_pid));
    Ok(EnvoyFigures {
        workers,
        push_visible_ms,
        push_post_ms,
        decision_p50_us: q("P50"),
        decision_p99_us: q("P99"),
        case: result.cases.first().cloned(),
        envoy_rss_extra_bytes: rf.zip(rp).map(|(a, b)| a as i64 - b as i64),
        envoy_filter_rss_bytes: rf,
    })
}

/// One row of `scale.json`: a fleet size and everything measured for it (NaN / null where a
/// part did not run).
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    /// Pods.
    pub pods: usize,
    /// Pools.
    pub pools: usize,
    /// Adapters.
    pub adapters: usize,
    /// Pods in the pool the requests go to (the first).
    pub pods_in_pool: usize,
    /// Decision p50 / p99 under wasmtime, 20 KB body, µs.
    pub decision_p50_us: f64,
    /// See `decision_p50_us`.
    pub decision_p99_us: f64,
    /// Decision p50 / p99 under wasmtime, 2 KB body, µs.
    pub decision_2k_p50_us: f64,
    /// See `decision_2k_p50_us`.
    pub decision_2k_p99_us: f64,
    /// Decision p50 / p99 from Envoy's histogram (2 KB requests of the Envoy part), µs.
    pub envoy_decision_p50_us: f64,
    /// See `envoy_decision_p50_us`.
    pub envoy_decision_p99_us: f64,
    /// Envoy CPU per routed request (closed loop, 2 KB), µs.
    pub envoy_cpu_us_per_request: f64,
    /// Plain Envoy's, µs.
    pub plain_envoy_cpu_us_per_request: f64,
    /// req/s with the filter ÷ plain Envoy's (2 KB).
    pub rps_ratio: f64,
    /// The signed push body the sidecar would send, bytes.
    pub snapshot_bytes: usize,
    /// Push to visible on every worker, median, ms (Envoy part).
    pub push_visible_ms: f64,
    /// Of that, the push request alone (sent until answered), median, ms.
    pub push_post_ms: f64,
    /// The push request alone under wasmtime, µs, and the first decision after it (the decode).
    pub wasm_push_us: f64,
    /// See `wasm_push_us`.
    pub wasm_first_decision_us: f64,
    /// Filter memory per worker: the Wasm VM's linear memory after the push and the requests.
    pub filter_memory_bytes: usize,
    /// Shared data after the requests (per Envoy process).
    pub shared_data_bytes: usize,
    /// Prefix index bytes at steady state (after `prefix_prompts` distinct prompts).
    pub prefix_index_bytes: usize,
    /// Envoy VmRSS with the filter minus plain Envoy's.
    pub envoy_rss_extra_bytes: Option<i64>,
    /// Sidecar CPU scraping every pod every 50 ms, cores.
    pub sidecar_cores: f64,
    /// Sidecar VmRSS at the end of its window, bytes.
    pub sidecar_rss_bytes: Option<u64>,
    /// Everything the wasmtime part measured.
    pub wasm: Option<WasmFigures>,
    /// Everything the Envoy part measured.
    pub envoy: Option<EnvoyFigures>,
    /// Everything the sidecar part measured.
    pub sidecar: Option<crate::experiments::sidecar_cost::SidecarCost>,
    /// What failed.
    pub errors: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// When and where.
    pub machine: String,
    /// Runs of every measure (one per fleet size).
    pub runs: usize,
    /// Timed wasmtime requests per body size.
    pub wasm_requests: usize,
    /// Sequential Envoy requests per arm.
    pub envoy_requests: usize,
    /// Closed-loop seconds per arm.
    pub rps_secs: f64,
    /// The rows.
    pub rows: Vec<ScaleRow>,
    /// Notes.
    pub notes: Vec<String>,
}

/// The machine in one line: cores, Envoy version, Unix time of the run.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{cores} cores, {}, run at Unix time {secs}",
        crate::experiments::runner::envoy_version()
    )
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0)
}

fn row(size: FleetSize, fleet: &SyntheticFleet) -> ScaleRow {
    let bytes = fleet.snapshot.encode().map_or(0, |b| b.len());
    ScaleRow {
        pods: size.pods,
        pools: size.pools,
        adapters: size.adapters,
        pods_in_pool: fleet.pools[0].addresses.len(),
        decision_p50_us: f64::NAN,
        decision_p99_us: f64::NAN,
        decision_2k_p50_us: f64::NAN,
        decision_2k_p99_us: f64::NAN,
        envoy_decision_p50_us: f64::NAN,
        envoy_decision_p99_us: f64::NAN,
        envoy_cpu_us_per_request: f64::NAN,
        plain_envoy_cpu_us_per_request: f64::NAN,
        rps_ratio: f64::NAN,
        snapshot_bytes: bytes,
        push_visible_ms: f64::NAN,
        push_post_ms: f64::NAN,
        wasm_push_us: f64::NAN,
        wasm_first_decision_us: f64::NAN,
        filter_memory_bytes: 0,
        shared_data_bytes: 0,
        prefix_index_bytes: 0,
        envoy_rss_extra_bytes: None,
        sidecar_cores: f64::NAN,
        sidecar_rss_bytes: None,
        wasm: None,
        envoy: None,
        sidecar: None,
        errors: Vec::new(),
    }
}

/// Runs every fleet size of `opts`; writes the results after each size (so an interrupted run
/// keeps what it measured).
pub async fn run(opts: &ScaleOptions) -> Result<ScaleReport, String> {
    let module = Module::filter().map_err(|e| format!("the filter .wasm: {e}"))?;
    let sizes = fleet_sizes(opts);
    let mut report = ScaleReport {
        machine: machine(),
        runs: 1,
        wasm_requests: opts.wasm_requests,
        envoy_requests: opts.envoy_requests,
        rps_secs: opts.rps_secs,
        rows: Vec::new(),
        notes: vec![
            "one run per fleet size; decision_p50_us/p99_us are wasmtime's at 20 KB".into(),
        ],
    };
    if !opts.envoy {
        report
            .notes
            .push("wasmtime part only: no Envoy part (--wasm-only)".into());
    }
    if !opts.sidecar {
        report.notes.push("no sidecar part".into());
    }
    let mut sidecar_done: Vec<(usize, crate::experiments::sidecar_cost::SidecarCost)> = Vec::new();
    for size in sizes {
        eprintln!(
            "bench: scale: {} pods, {} pools, {} adapters",
            size.pods, size.pools, size.adapters
        );
        let fleet = synthetic(size, &synthetic_addresses(size.pods), 0, opts.seed);
        let mut r = row(size, &fleet);
        match wasm_part(&module, size, opts) {
            Ok(w) => {
                if let Some(d) = w.decisions.iter().find(|d| d.body_bytes == 20 * 1024) {
                    (r.decision_p50_us, r.decision_p99_us) = (d.p50_us, d.p99_us);
                }
                if let Some(d) = w.decisions.iter().find(|d| d.body_bytes == 2 * 1024) {
                    (r.decision_2k_p50_us, r.decision_2k_p99_us) = (d.p50_us, d.p99_us);
                }
                r.wasm_push_us = w.push_us;
                r.wasm_first_decision_us = w.first_decision_us;
                r.filter_memory_bytes = w.memory_bytes;
                r.shared_data_bytes = w.shared_bytes;
                r.prefix_index_bytes = w.prefix_index_bytes;
                r.wasm = Some(w);
            }
            Err(e) => r.errors.push(format!("wasmtime: {e}")),
        }
        if opts.envoy {
            match envoy_part(size, opts).await {
                Ok(e) => {
                    r.push_visible_ms = median(&e.push_visible_ms);
                    r.push_post_ms = median(&e.push_post_ms);
                    r.envoy_decision_p50_us = e.decision_p50_us;
                    r.envoy_decision_p99_us = e.decision_p99_us;
                    if let Some(c) = &e.case {
                        r.envoy_cpu_us_per_request = c.filter_cpu_us;
                        r.plain_envoy_cpu_us_per_request = c.plain_cpu_us;
                        r.rps_ratio = c.rps_ratio;
                    }
                    r.envoy_rss_extra_bytes = e.envoy_rss_extra_bytes;
                    r.envoy = Some(e);
                }
                Err(e) => r.errors.push(format!("envoy: {e}")),
            }
        }
        if opts.sidecar {
            let known = sidecar_done.iter().find(|(p, _)| *p == size.pods);
            let cost = match known {
                Some((_, c)) => Ok(c.clone()),
                None => crate::experiments::sidecar_cost::measure(
                    size.pods,
                    Duration::from_secs(opts.sidecar_secs),
                )
                .await
                .map_err(|e| e.to_string()),
            };
            match cost {
                Ok(c) => {
                    r.sidecar_cores = c.cores;
                    r.sidecar_rss_bytes = c.rss_bytes;
                    if known.is_none() {
                        sidecar_done.push((size.pods, c.clone()));
                    }
                    r.sidecar = Some(c);
                }
                Err(e) => r.errors.push(format!("sidecar: {e}")),
            }
        }
        for e in &r.errors {
            eprintln!("bench: scale: {e}");
        }
        report.rows.push(r);
        write(&report, &opts.out_dir)?;
    }
    Ok(report)
}

fn f(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "–".into()
    }
}

fn mib(b: usize) -> String {
    if b == 0 {
        "–".into()
    } else {
        format!("{:.2}", b as f64 / (1024.0 * 1024.0))
    }
}

/// The Markdown report: the table and the method.
pub fn markdown(rep: &ScaleReport) -> String {
    let mut out = String::from("# Scale bench\n\n");
    let _ = writeln!(
        out,
        "{}; {} timed wasmtime requests per body size, {} sequential Envoy requests per arm \
         (a quarter above 1,000 pods), {} s closed loop per arm; one run per fleet size.\n",
        rep.machine, rep.wasm_requests, rep.envoy_requests, rep.rps_secs
    );
    for n in &rep.notes {
        let _ = writeln!(out, "Note: {n}.\n");
    }
    out.push_str(
        "| pods | pools | adapters | pods in pool | decision p50 / p99 µs (wasmtime, 20 KB) | 2 KB p50 / p99 µs | Envoy histogram p50 / p99 µs | Envoy CPU µs / req (plain) | req/s ÷ plain | snapshot KiB | push→visible ms (the POST) | wasm push µs / first decision µs | filter memory MiB / worker | shared data MiB | prefix index MiB | sidecar cores | sidecar RSS MiB |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &rep.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} ({}) | {} | {:.1} | {} ({}) | {} / {} | {} | {} | {} | {} | {} |",
            r.pods,
            r.pools,
            r.adapters,
            r.pods_in_pool,
            f(r.decision_p50_us, 1),
            f(r.decision_p99_us, 1),
            f(r.decision_2k_p50_us, 1),
            f(r.decision_2k_p99_us, 1),
            f(r.envoy_decision_p50_us, 1),
            f(r.envoy_decision_p99_us, 1),
            f(r.envoy_cpu_us_per_request, 1),
            f(r.plain_envoy_cpu_us_per_request, 1),
            f(r.rps_ratio, 2),
            r.snapshot_bytes as f64 / 1024.0,
            f(r.push_visible_ms, 2),
            f(r.push_post_ms, 2),
            f(r.wasm_push_us, 0),
            f(r.wasm_first_decision_us, 0),
            mib(r.filter_memory_bytes),
            mib(r.shared_data_bytes),
            mib(r.prefix_index_bytes),
            f(r.sidecar_cores, 3),
            r.sidecar_rss_bytes.map_or("–".into(), |b| mib(b as usize)),
        );
    }
    let errors: Vec<String> = rep
        .rows
        .iter()
        .flat_map(|r| {
            r.errors.iter().map(move |e| {
                format!(
                    "- {} pods / {} pools / {} adapters: {e}",
                    r.pods, r.pools, r.adapters
                )
            })
        })
        .collect();
    if !errors.is_empty() {
        out.push_str("\nErrors:\n\n");
        out.push_str(&errors.join("\n"));
        out.push('\n');
    }
    out.push_str(METHOD);
    out
}

const METHOD: &str = "
## Method

`bench scale` (test-harness/bench/src/experiments/scale.rs). Fleets: pod *i* in pool *i* mod pools, adapter
*j* in pool *j* mod pools (4 adapter slots per pod, 0–4 resident, 10 % with one waiting);
per pod 60 % empty queues, 25 % 1–4 waiting, 15 % 5–40; running 0–64; KV use 5–97 %; 2 %
failing, 1 % stale; seeded. Requests go to the first pool (a fifth to one of its adapters when
it has any) with one of 16 shared system prompts and a unique user turn.

- **wasmtime**: the release filter `.wasm` in `proxy-wasm-host`, one worker VM: the signed push,
  the first decision (which decodes the snapshot), then the timed requests per body size
  (a tenth more first, untimed); decision time = headers to the end of the last body callback.
  Memory = the VM's linear memory after them; shared data = every key and value; then the
  prefix index (`llmr/px/` pages) after that many more distinct prompts.
- **Envoy**: one loopback listener per pod (in-process instant backends), every pool a cluster;
  the filter's pools with a queue bound no request reaches (admission runs, never holds: an
  instant backend is never seen busy), the synthetic snapshot pushed into Envoy with the filter
  (no sidecar); push → visible = POST
  sent until `/__llm_router/state?summary` names the generation and a routed request was answered
  (in brackets the POST alone: the push's validation and store)
  (shared data is one per Envoy process: every worker reads the new generation at its next
  request and decodes it then — the wasmtime first-decision figure). CPU per request and req/s
  ÷ plain Envoy: `overhead::measure` (arms direct, plain Envoy, Envoy with the filter;
  interleaved sequential rounds, alternating closed loops of 16 clients), 2 KB prompts;
  Envoy CPU only. The decision histogram: Envoy's cumulative P50/P99 over the run.
- **sidecar**: `bench sidecar-cost` at the fleet's pod count (one model-sim process serving
  every pod's `/metrics`, the real sidecar scraping every 50 ms, pushing into Envoy with the
  filter), once per pod count; CPU from `/proc/PID/stat`, RSS from `/proc/PID/status`.
";

/// Charts: one SVG per measure against pods (log x), one line per (pools, adapters).
pub fn charts(rep: &ScaleReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    type Get = fn(&ScaleRow) -> f64;
    let measures: [(&str, &str, Get); 10] = [
        (
            "decision_p50_us",
            "decision p50, µs (wasmtime, 20 KB)",
            |r| r.decision_p50_us,
        ),
        (
            "decision_p99_us",
            "decision p99, µs (wasmtime, 20 KB)",
            |r| r.decision_p99_us,
        ),
        (
            "envoy_decision_p50_us",
            "decision p50, µs (Envoy histogram)",
            |r| r.envoy_decision_p50_us,
        ),
        (
            "envoy_cpu_us_per_request",
            "Envoy CPU per routed request, µs",
            |r| r.envoy_cpu_us_per_request,
        ),
        ("rps_ratio", "req/s ÷ plain Envoy (2 KB)", |r| r.rps_ratio),
        ("snapshot_bytes", "snapshot, KiB", |r| {
            r.snapshot_bytes as f64 / 1024.0
        }),
        ("push_visible_ms", "push to visible, ms", |r| {
            r.push_visible_ms
        }),
        (
            "filter_memory_bytes",
            "filter memory per worker, MiB",
            |r| r.filter_memory_bytes as f64 / 1048576.0,
        ),
        ("prefix_index_bytes", "prefix index, MiB", |r| {
            r.prefix_index_bytes as f64 / 1048576.0
        }),
        ("sidecar_cores", "sidecar, cores (50 ms scrapes)", |r| {
            r.sidecar_cores
        }),
    ];
    let mut groups: Vec<(usize, usize)> = rep.rows.iter().map(|r| (r.pools, r.adapters)).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut written = Vec::new();
    for (key, title, get) in measures {
        let series: Vec<Series> = groups
            .iter()
            .map(|&(pools, adapters)| Series {
                label: format!("{pools} pool(s), {adapters} adapters"),
                points: rep
                    .rows
                    .iter()
                    .filter(|r| r.pools == pools && r.adapters == adapters)
                    .map(|r| (r.pods as f64, get(r)))
                    .filter(|(_, y)| y.is_finite())
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let path = dir.join(format!("scale-{key}.svg"));
        line_chart_svg(title, "pods (log scale)", &series, &path).map_err(|e| e.to_string())?;
        written.push(path);
    }
    Ok(written)
}

/// Writes scale.json, scale.md and the charts into `dir`.
pub fn write(rep: &ScaleReport, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(rep).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("scale.json"), json).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("scale.md"), markdown(rep)).map_err(|e| e.to_string())?;
    charts(rep, dir)?;
    Ok(())
}

/// `bench scale`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// Pod counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = PODS)]
    pods: Vec<usize>,
    /// Pool counts (pods spread over them; sizes with fewer pods than pools are skipped).
    #[arg(long, value_delimiter = ',', default_values_t = POOLS)]
    pools: Vec<usize>,
    /// Adapter counts (spread over the pools).
    #[arg(long, value_delimiter = ',', default_values_t = ADAPTERS)]
    adapters: Vec<usize>,
    /// Timed wasmtime requests per body size (2 KB, 20 KB).
    #[arg(long, default_value_t = 1000)]
    wasm_requests: usize,
    /// Distinct prompts sent before the prefix index's size is read.
    #[arg(long, default_value_t = 2000)]
    prefix_prompts: usize,
    /// Only the wasmtime part (no Envoy, no sidecar).
    #[arg(long)]
    wasm_only: bool,
    /// Skip the sidecar part.
    #[arg(long)]
    no_sidecar: bool,
    /// Sequential Envoy requests per arm (a quarter above 1,000 pods).
    #[arg(long, default_value_t = 400)]
    envoy_requests: usize,
    /// Closed-loop seconds per arm (0: no req/s, no closed-loop CPU).
    #[arg(long, default_value_t = 2.0)]
    rps_secs: f64,
    /// Pushes timed per fleet (push to visible).
    #[arg(long, default_value_t = 5)]
    pushes: usize,
    /// Sidecar window, seconds.
    #[arg(long, default_value_t = 10)]
    sidecar_secs: u64,
    /// Output directory (default: test-harness/bench/results in the repository).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// `bench scale`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, _out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        pods,
        pools,
        adapters,
        wasm_requests,
        prefix_prompts,
        wasm_only,
        no_sidecar,
        envoy_requests,
        rps_secs,
        pushes,
        sidecar_secs,
        out,
    } = args;
    let defaults = ScaleOptions::default();
    let opts = ScaleOptions {
        pods,
        pools,
        adapters,
        wasm_requests,
        prefix_prompts,
        envoy: !wasm_only,
        envoy_requests,
        rps_secs,
        pushes,
        sidecar: !wasm_only && !no_sidecar,
        sidecar_secs: sidecar_secs.clamp(1, 600),
        out_dir: out.unwrap_or(defaults.out_dir),
        seed: defaults.seed,
    };
    match run(&opts).await {
        Ok(rep) => {
            println!("{}", markdown(&rep));
            println!(
                "Results: {0}/scale.json, {0}/scale.md, charts {0}/scale-*.svg",
                opts.out_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: scale: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_skip_pools_with_no_pod() {
        let o = ScaleOptions {
            pods: vec![4, 256],
            pools: vec![1, 20],
            adapters: vec![0, 1000],
            ..ScaleOptions::default()
        };
        let s = fleet_sizes(&o);
        assert_eq!(s.len(), 6, "{s:?}");
        assert!(s.iter().all(|x| x.pods >= x.pools));
        assert!(!s.iter().any(|x| x.pods == 4 && x.pools == 20));
    }

    #[test]
    fn a_fleet_spreads_pods_and_adapters_over_its_pools() {
        let size = FleetSize {
            pods: 64,
            pools: 20,
            adapters: 1000,
        };
        let f = synthetic(size, &synthetic_addresses(64), 1_000_000, 1);
        assert_eq!(f.snapshot.pod_count(), 64);
        assert_eq!(f.snapshot.pools.len(), 20);
        assert_eq!(f.pools[0].addresses.len(), 4);
        assert_eq!(f.pools[19].addresses.len(), 3);
        assert_eq!(
            f.pools.iter().map(|p| p.adapters.len()).sum::<usize>(),
            1000
        );
        assert_eq!(f.snapshot.pools[0].models, [MODEL]);
        // Resident adapters are the pool's own.
        for (plan, pool) in f.pools.iter().zip(&f.snapshot.pools) {
            for pod in &pool.pods {
                let lora = pod.lora.as_ref().expect("adapters configured");
                assert!(lora.running.iter().all(|a| plan.adapters.contains(a)));
                let mut distinct = lora.running.clone();
                distinct.dedup();
                assert_eq!(distinct.len(), lora.running.len(), "{lora:?}");
            }
        }
        // The encoded snapshot decodes to the same fleet, and the config names every pool.
        let bytes = f.snapshot.encode().unwrap();
        let back = Snapshot::decode(&bytes).unwrap();
        assert_eq!(back.pod_count(), 64);
        assert_eq!(
            back.pools[3].pods[2].address,
            f.snapshot.pools[3].pods[2].address
        );
        assert_eq!(back.pools[3].pods[2].lora, f.snapshot.pools[3].pods[2].lora);
        assert_eq!(f.config["pools"].as_array().unwrap().len(), 20);
        // Without adapters the pods report no LoRA state.
        let g = synthetic(
            FleetSize {
                adapters: 0,
                ..size
            },
            &synthetic_addresses(64),
            1,
            1,
        );
        assert!(g
            .snapshot
            .pools
            .iter()
            .flat_map(|p| &p.pods)
            .all(|p| p.lora.is_none()));
    }

    #[test]
    fn bodies_have_their_size_and_differ() {
        for size in BODY_SIZES {
            let a = chat_body(MODEL, size, 1);
            let b = chat_body(MODEL, size, 2);
            assert!(
                a.len() > size * 9 / 10 && a.len() < size * 11 / 10,
                "{}",
                a.len()
            );
            assert_ne!(a, b);
            let v: Value = serde_json::from_slice(&a).unwrap();
            assert_eq!(v["model"], MODEL);
        }
    }

    #[test]
    fn envoy_histogram_lines_give_cumulative_quantiles() {
        let stats = "cluster.x.upstream_rq: 5\nllm_router_decision_duration_microseconds: \
                     P0(nan,11) P25(nan,20.5) P50(nan,31.25) P75(nan,40) P90(nan,50) \
                     P95(nan,60) P99(nan,88.5) P99.5(nan,90) P99.9(nan,99) P100(nan,120)\n";
        let n = "llm_router_decision_duration_microseconds";
        assert_eq!(histogram_quantile(stats, n, "P50"), Some(31.25));
        assert_eq!(histogram_quantile(stats, n, "P99"), Some(88.5));
        assert_eq!(histogram_quantile(stats, "nope", "P50"), None);
    }

    #[test]
    fn markdown_has_a_row_per_size() {
        let f = synthetic(
            FleetSize {
                pods: 4,
                pools: 1,
                adapters: 0,
            },
            &synthetic_addresses(4),
            0,
            1,
        );
        let mut r = row(f.size, &f);
        r.decision_p50_us = 12.5;
        let rep = ScaleReport {
            machine: "m".into(),
            runs: 1,
            wasm_requests: 10,
            envoy_requests: 10,
            rps_secs: 0.0,
            rows: vec![r],
            notes: vec![],
        };
        let md = markdown(&rep);
        assert!(md.contains("| 4 | 1 | 0 | 4 | 12.5 / – |"), "{md}");
        let v = serde_json::to_value(&rep).unwrap();
        for key in [
            "pods",
            "pools",
            "adapters",
            "decision_p50_us",
            "decision_p99_us",
            "envoy_cpu_us_per_request",
            "snapshot_bytes",
            "push_visible_ms",
            "filter_memory_bytes",
            "sidecar_cores",
        ] {
            assert!(v["rows"][0].get(key).is_some(), "{key}");
        }
    }
}
