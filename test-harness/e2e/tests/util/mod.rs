//! Helpers shared by the end-to-end scenarios: a fleet of echo backends behind a real Envoy with
//! the filter, snapshot pushes, and chat requests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llm_router_snapshot::{Engine, Health, LoraState, Pod, Pool, Snapshot};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use testkit::{EchoBackend, EchoConfig, EnvoyProcess, EnvoySpec, HttpResponse, Router};

pub const SECRET: &str = "e2e-test-secret-0123456789abcdef-0123";
pub const PUSH: &str = "/__llm_router/snapshot";
pub const STATE: &str = "/__llm_router/state";

/// One pool of echo backends.
pub struct TestPool {
    pub name: &'static str,
    pub cluster: &'static str,
    pub model: &'static str,
    pub pods: Vec<EchoBackend>,
}

impl TestPool {
    pub async fn start(
        name: &'static str,
        model: &'static str,
        n: usize,
        config: EchoConfig,
    ) -> TestPool {
        let mut pods = Vec::new();
        for _ in 0..n {
            pods.push(EchoBackend::start_with(config.clone()).await.unwrap());
        }
        let cluster = Box::leak(format!("pool_{name}").into_boxed_str());
        TestPool {
            name,
            cluster,
            model,
            pods,
        }
    }

    pub fn addr(&self, i: usize) -> String {
        self.pods[i].addr().to_string()
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.pods.iter().map(EchoBackend::addr).collect()
    }
}

/// The plugin configuration for `pools`, merged with `extra` (top-level keys).
pub fn plugin_config(pools: &[&TestPool], extra: Value) -> Value {
    let pools: Vec<Value> = pools
        .iter()
        .map(|p| json!({"name": p.name, "cluster": p.cluster, "models": [p.model], "adapters": [format!("{}-lora", p.name)]}))
        .collect();
    let mut cfg = json!({"pools": pools, "snapshot": {"secret": SECRET}});
    if let (Some(obj), Some(more)) = (cfg.as_object_mut(), extra.as_object()) {
        for (k, v) in more {
            obj.insert(k.clone(), v.clone());
        }
    }
    cfg
}

/// A real Envoy with the filter in front of `pools` (two workers).
pub async fn envoy(pools: &[&TestPool], config: Value) -> EnvoyProcess {
    envoy_with_workers(pools, config, 2).await
}

/// The same with `workers` worker threads.
pub async fn envoy_with_workers(pools: &[&TestPool], config: Value, workers: u32) -> EnvoyProcess {
    let mut spec = EnvoySpec::new(Router::Filter)
        .concurrency(workers)
        .plugin_config(config);
    for p in pools {
        spec = spec.pool(p.name, p.cluster, p.addrs());
    }
    spec.wasm_path = Some(testkit::filter_wasm().unwrap_or_else(|e| panic!("{e}")));
    spec.start()
        .await
        .unwrap_or_else(|e| panic!("envoy did not start: {e}"))
}

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A strictly increasing generation: the clock in ms, like the sidecar, plus a counter (the
/// filter refuses generations more than `MAX_GENERATION_LEAD_MS` ahead of its clock).
pub fn next_generation() -> u64 {
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    base + GENERATION.fetch_add(1, Ordering::SeqCst)
}

pub fn pod(addr: &str, waiting: u32, kv: f32) -> Pod {
    Pod {
        address: addr.to_string(),
        engine: Engine::Vllm,
        health: Health::Ok,
        waiting,
        running: 2,
        kv_usage: Some(kv),
        block_size: 16,
        num_blocks: 2000,
        ..Pod::default()
    }
}

pub fn with_lora(mut p: Pod, running: &[&str], max: u16) -> Pod {
    p.lora = Some(LoraState {
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: vec![],
        max_loras: max,
    });
    p
}

pub fn snapshot(pools: Vec<(&TestPool, Vec<Pod>)>) -> Snapshot {
    Snapshot {
        rewrites: None,
        objectives: None,
        generation: next_generation(),
        created_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
        pools: pools
            .into_iter()
            .map(|(p, pods)| Pool {
                name: p.name.into(),
                cluster: p.cluster.into(),
                models: vec![p.model.into()],
                pods,
                peer_contexts: Vec::new(),
            })
            .collect(),
    }
}

/// The signature header for `bytes` under [`SECRET`], as the sidecar sends it.
pub fn signed(bytes: &[u8]) -> (&'static str, String) {
    (
        llm_router_snapshot::SIGNATURE_HEADER,
        llm_router_snapshot::sign(SECRET.as_bytes(), bytes),
    )
}

/// Pushes `snap` signed, to the internal listener (as the sidecar does).
pub async fn push(envoy: &EnvoyProcess, snap: &Snapshot) -> HttpResponse {
    let bytes = snap.encode().unwrap();
    let (name, value) = signed(&bytes);
    testkit::post_bytes(envoy.push_addr(), PUSH, &[(name, &value)], bytes)
        .await
        .unwrap()
}

pub async fn push_ok(envoy: &EnvoyProcess, snap: &Snapshot) {
    let r = push(envoy, snap).await;
    assert_eq!(
        r.status,
        200,
        "push refused: {} / {}",
        r.text(),
        envoy.log_tail(20)
    );
    assert_eq!(r.json().unwrap()["accepted"], json!(true));
}

pub async fn chat(
    envoy: &EnvoyProcess,
    model: &str,
    text: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    testkit::post_json(envoy.listen_addr, "/v1/chat/completions", headers, &body)
        .await
        .unwrap()
}

/// The echo backend that answered.
pub fn backend(r: &HttpResponse) -> String {
    r.header("x-echo-backend").unwrap_or_default().to_string()
}

pub async fn state(envoy: &EnvoyProcess) -> Value {
    let r = testkit::get(envoy.push_addr(), STATE, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

/// Total in-flight count the filter reports over all pods of all pools.
pub async fn total_in_flight(envoy: &EnvoyProcess) -> u64 {
    let s = state(envoy).await;
    s["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["pods"].as_array().cloned().unwrap_or_default())
        .map(|pod| pod["in_flight"].as_u64().unwrap_or(0))
        .sum()
}

/// Polls the filter's state until its total in-flight count is `want` (or 2 s pass); returns
/// the last count seen.
pub async fn wait_in_flight(envoy: &EnvoyProcess, want: u64) -> u64 {
    let mut seen = u64::MAX;
    for _ in 0..100 {
        seen = total_in_flight(envoy).await;
        if seen == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    seen
}
