//! Helpers shared by the filter tests: the plugin configuration, snapshots built with the real
//! `llm-router-snapshot` crate, and requests shaped like the ones Envoy hands the filter.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use llm_router_snapshot::{Health, LoraState, Pod, Pool, Snapshot};
use proxy_wasm_host::{Host, Request, Vm};

pub const SECRET: &str = "wasm-host-test-secret-0123456789abcdef";
pub const PUSH_PATH: &str = "/__llm_router/snapshot";
pub const STATE_PATH: &str = "/__llm_router/state";
pub const TALLY_PATH: &str = "/__llm_router/tally";
pub const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
pub const ENDPOINT: &str = "x-gateway-destination-endpoint";
pub const CLUSTER: &str = "x-llm-router-cluster";
pub const REASON: &str = "x-llm-router-dropped-reason";
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
pub const REWRITE: &str = "x-gateway-model-name-rewrite";

/// The real request bodies kept in the repository (`test-harness/fixtures/bodies`); a missing
/// folder fails the calling test and names the path.
pub fn bodies_fixtures_dir() -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/bodies"));
    assert!(
        dir.is_dir(),
        "request body fixtures missing: {} (part of the repository; is the checkout complete?)",
        dir.display()
    );
    dir
}

/// The plugin configuration of the brief: two pools, aliases, adapters, a secret. For brevity
/// one instance both routes and serves the snapshot endpoints (`snapshot.endpoints`); the
/// shipped configs split those over a public and an internal listener, see [`public_config`].
pub fn config() -> String {
    config_with("")
}

/// The same with extra top-level fields (`extra` starts with a comma, or is empty).
pub fn config_with(extra: &str) -> String {
    format!(
        r#"{{
  "pools": [
    {{"name": "llama", "cluster": "pool_llama",
      "models": ["{LLAMA}", {{"name": "llama-8b", "rewrite": "{LLAMA}"}}],
      "adapters": ["sql-lora", "chat-lora"], "preset": "latency"}},
    {{"name": "qwen", "cluster": "pool_qwen", "models": ["Qwen/Qwen2.5-7B-Instruct"]}}
  ],
  "top_k": 3,
  "snapshot": {{"secret": "{SECRET}", "stale_after_ms": 3000, "endpoints": true}}{extra}
}}"#
    )
}

/// [`config`] as the public listener's instance has it: no snapshot endpoints.
pub fn public_config() -> String {
    config().replace(r#", "endpoints": true"#, "")
}

/// The internal listener's instance: only the snapshot section, endpoints on.
pub fn internal_config() -> String {
    format!(r#"{{"snapshot": {{"secret": "{SECRET}", "endpoints": true}}}}"#)
}

/// `x-llm-router-signature` for `bytes` under [`SECRET`].
pub fn signature(bytes: &[u8]) -> String {
    llm_router_snapshot::sign(SECRET.as_bytes(), bytes)
}

/// A host on the release filter; a missing `.wasm` fails with the command that builds it.
pub fn host() -> Host {
    Host::filter().unwrap_or_else(|e| panic!("{e}"))
}

/// A started VM with [`config`].
pub fn vm(host: &Host) -> Vm {
    host.vm(&config()).unwrap_or_else(|e| panic!("{e}"))
}

/// A healthy vLLM pod.
pub fn pod(addr: &str, waiting: u32, running: u32, kv: f32) -> Pod {
    Pod {
        address: addr.into(),
        engine: llm_router_snapshot::Engine::Vllm,
        health: Health::Ok,
        failures: 0,
        scraped_at_ms: 0,
        waiting,
        running,
        kv_usage: Some(kv),
        block_size: 16,
        num_blocks: 1000,
        lora: Some(LoraState {
            running: vec![],
            waiting: vec![],
            max_loras: 0,
        }),
        peers: Default::default(),
    }
}

/// A pod with these adapters loaded and `slots` adapter slots.
pub fn lora_pod(addr: &str, running: &[&str], slots: u16) -> Pod {
    let mut p = pod(addr, 0, 1, 0.2);
    p.lora = Some(LoraState {
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: vec![],
        max_loras: slots,
    });
    p
}

pub fn pool(name: &str, cluster: &str, models: &[&str], pods: Vec<Pod>) -> Pool {
    Pool {
        name: name.into(),
        cluster: cluster.into(),
        models: models.iter().map(|s| s.to_string()).collect(),
        pods,
        peer_contexts: Vec::new(),
    }
}

/// Encoded snapshot bytes, `created_ms` from the host clock.
pub fn snapshot(host: &Host, generation: u64, pools: Vec<Pool>) -> Vec<u8> {
    let now = host.now_ms();
    let mut snap = Snapshot {
        rewrites: None,
        objectives: None,
        generation,
        created_ms: now,
        pools,
    };
    for p in &mut snap.pools {
        for pod in &mut p.pods {
            pod.scraped_at_ms = now;
        }
    }
    snap.encode().expect("test snapshot encodes")
}

/// A push as the sidecar sends it: signed with [`SECRET`], binary body.
pub fn push_request(vm: &Vm, bytes: &[u8]) -> Request {
    push_signed(vm, bytes, Some(&signature(bytes)))
}

/// A push carrying `signature` (none when `None`) in `x-llm-router-signature`.
pub fn push_signed(vm: &Vm, bytes: &[u8], signature: Option<&str>) -> Request {
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", PUSH_PATH),
        (":authority", "127.0.0.1:10001"),
        ("content-type", "application/octet-stream"),
        ("content-length", &bytes.len().to_string()),
    ])
    .property("source.address", "127.0.0.1:41234");
    if let Some(sig) = signature {
        r.header(llm_router_snapshot::SIGNATURE_HEADER, sig);
    }
    r.body(bytes);
    r
}

/// `GET` on the state path.
pub fn state_request(vm: &Vm) -> Request {
    let mut r = vm.request();
    r.headers(&[(":method", "GET"), (":path", STATE_PATH)])
        .property("source.address", "127.0.0.1:5000");
    r
}

/// `GET` on the tally path.
pub fn tally_request(vm: &Vm) -> Request {
    let mut r = vm.request();
    r.headers(&[(":method", "GET"), (":path", TALLY_PATH)])
        .property("source.address", "127.0.0.1:5000");
    r
}

/// Pushes and finishes; panics unless the filter answered 200.
pub fn push_ok(vm: &Vm, bytes: &[u8]) {
    let mut r = push_request(vm, bytes);
    r.send().unwrap_or_else(|e| panic!("{e}"));
    let lr = r
        .local_response()
        .unwrap_or_else(|| panic!("push got no answer\n{}", r.explain()));
    assert_eq!(
        lr.status,
        200,
        "push refused: {}\n{}",
        lr.body_text(),
        r.explain()
    );
    r.finish().unwrap();
}

/// A chat request body with this model and user prompt.
pub fn chat_body(model: &str, prompt: &str) -> Vec<u8> {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
        .to_string()
        .into_bytes()
}

/// A POST to `path` with `body` (content-length set), from a client on loopback.
pub fn post(vm: &Vm, path: &str, body: &[u8]) -> Request {
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", path),
        (":authority", "gateway.local"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("content-length", &body.len().to_string()),
    ])
    .property("source.address", "10.0.0.99:50000");
    r
}

/// Sends a chat request for `model` and returns it (not finished).
pub fn chat(vm: &Vm, model: &str, prompt: &str) -> Request {
    let body = chat_body(model, prompt);
    let mut r = post(vm, "/v1/chat/completions", &body);
    r.body(&body);
    r.send().unwrap_or_else(|e| panic!("{e}"));
    r
}

/// The endpoint list the filter set for the upstream.
pub fn endpoints(r: &Request) -> Vec<String> {
    r.upstream_header(ENDPOINT)
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// The filter's per-pod load table of a pool from shared data, decoded by the core itself.
pub fn load_table(host: &Host, pool: &str) -> llm_router_core::inflight::Table {
    host.shared_data(&llm_router_core::inflight::key(pool))
        .map(|(bytes, _)| llm_router_core::inflight::Table::decode(&bytes))
        .unwrap_or_default()
}

/// One pod's entry in that table (in flight, pending prefill tokens, learned rate).
pub fn pod_load(host: &Host, pool: &str, addr: &str) -> llm_router_core::inflight::PodLoad {
    load_table(host, pool).get(addr)
}

/// Pods with requests in flight or pending work, sorted: `(address, in flight)`.
pub fn inflight(host: &Host, pool: &str) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = load_table(host, pool)
        .entries
        .into_iter()
        .filter(|(_, l)| l.in_flight > 0 || l.pending_tokens > 0)
        .map(|(a, l)| (a, l.in_flight))
        .collect();
    out.sort();
    out
}

/// The in-flight count of one pod.
pub fn inflight_of(host: &Host, pool: &str, addr: &str) -> u32 {
    inflight(host, pool)
        .into_iter()
        .find(|(a, _)| a == addr)
        .map(|(_, c)| c)
        .unwrap_or(0)
}

/// The parsed JSON body of a local reply.
pub fn json_of(r: &Request) -> serde_json::Value {
    let lr = r
        .local_response()
        .unwrap_or_else(|| panic!("no local response\n{}", r.explain()));
    serde_json::from_slice(&lr.body)
        .unwrap_or_else(|e| panic!("local reply body is not JSON ({e}): {}", lr.body_text()))
}

/// A stat name decoded the way Envoy's `stats_tags` regexes of `envoy/envoy.yaml` decode it:
/// every `label=.=value;.;` piece is a label, what remains is the metric name.
pub fn decode_stat(stat: &str) -> (String, Vec<(String, String)>) {
    let mut labels = Vec::new();
    let mut rest = stat;
    while let Some((piece, tail)) = rest.split_once(";.;") {
        let Some((k, v)) = piece.split_once("=.=") else {
            break;
        };
        labels.push((k.to_string(), v.to_string()));
        rest = tail;
    }
    (rest.to_string(), labels)
}

/// The sum over every series of metric `name` whose labels include all of `labels`.
pub fn metric_sum(host: &Host, name: &str, labels: &[(&str, &str)]) -> i64 {
    host.metrics()
        .iter()
        .filter_map(|(stat, m)| {
            let (n, ls) = decode_stat(stat);
            let all = labels
                .iter()
                .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v));
            (n == name && all).then_some(m.value)
        })
        .sum()
}

/// Every series of metric `name`: its labels (sorted) and value.
pub fn series(host: &Host, name: &str) -> Vec<(Vec<(String, String)>, i64)> {
    let mut out: Vec<_> = host
        .metrics()
        .iter()
        .filter_map(|(stat, m)| {
            let (n, mut ls) = decode_stat(stat);
            ls.sort();
            (n == name).then_some((ls, m.value))
        })
        .collect();
    out.sort();
    out
}
