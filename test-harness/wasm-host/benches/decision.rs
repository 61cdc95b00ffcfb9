//! Decision time per request of the release filter `.wasm` under the wasmtime host, for pools of
//! 4, 16, 64 and 256 pods and bodies of 1 KB, 20 KB and 200 KB, against two baselines measured
//! in the same run: the same decision in native Rust (`llm-router-core` on an in-memory store),
//! and a pass-through request through the same VM (the host's own per-request floor).
//!
//! Run: `cargo bench --profile release --workspace --bench decision` (add `-- --quick` for
//! fewer iterations, `-- --only 64/20KB` for one case). Prints a table of p50/p99 in µs. A request is timed from its headers to the
//! end of its last body callback (the decision), delivered in 16 KB chunks like Envoy reads.

use std::hint::black_box;
use std::time::Instant;

use llm_router_core::request::{self, ApiKind};
use llm_router_core::{Config, Context, Fleet, MemoryStore, Router};
use llm_router_snapshot::{Engine, Health, LoraState, Pod, Pool, Snapshot};
use proxy_wasm_host::{Host, Module, Vm};

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
const SECRET: &str = "wasm-host-bench-secret-0123456789abcdef";
const CHUNK: usize = 16 * 1024;

fn config() -> String {
    format!(
        r#"{{"pools": [{{"name": "llama", "cluster": "pool_llama", "models": ["{LLAMA}"], "adapters": ["sql-lora"]}}],
            "snapshot": {{"secret": "{SECRET}", "stale_after_ms": 3600000, "endpoints": true}}}}"#
    )
}

/// A pool of `n` pods with varied load, some with adapters.
fn fleet(n: usize, now_ms: u64) -> Snapshot {
    let pods = (0..n)
        .map(|i| Pod {
            address: format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256),
            engine: Engine::Vllm,
            health: Health::Ok,
            failures: 0,
            scraped_at_ms: now_ms,
            waiting: (i * 7 % 5) as u32,
            running: (i * 13 % 17) as u32,
            kv_usage: Some((i * 37 % 80) as f32 / 100.0),
            block_size: 16,
            num_blocks: 4096,
            lora: Some(LoraState {
                running: if i % 3 == 0 {
                    vec!["sql-lora".into()]
                } else {
                    vec![]
                },
                waiting: vec![],
                max_loras: 2,
            }),
            peers: Default::default(),
        })
        .collect();
    Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: now_ms,
        pools: vec![Pool {
            name: "llama".into(),
            cluster: "pool_llama".into(),
            models: vec![LLAMA.into()],
            pods,
            peer_contexts: Vec::new(),
        }],
    }
}

/// A chat body of about `size` bytes: a shared system prompt and a varying user turn.
fn body(size: usize, i: usize) -> Vec<u8> {
    let system = "You are a helpful assistant that answers briefly. ";
    let user_len = size.saturating_sub(200).max(16);
    let mut user = format!("request {i}: ");
    while user.len() < user_len {
        user.push_str("the quick brown fox jumps over the lazy dog ");
    }
    user.truncate(user_len);
    serde_json::json!({"model": LLAMA, "stream": true, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]})
    .to_string()
    .into_bytes()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (pct(&v, 0.5), pct(&v, 0.99))
}

fn push(vm: &Vm, bytes: &[u8]) {
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", "/__llm_router/snapshot"),
        (
            llm_router_snapshot::SIGNATURE_HEADER,
            &llm_router_snapshot::sign(SECRET.as_bytes(), bytes),
        ),
    ])
    .property("source.address", "127.0.0.1:1")
    .body(bytes);
    r.send().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(200),
        "push refused"
    );
    r.finish().unwrap_or_else(|e| panic!("{e}"));
}

/// µs per request through the Wasm filter; also host calls per request and the VM's linear
/// memory (bytes) at the end.
fn wasm_run(
    module: &Module,
    pods: usize,
    size: usize,
    iters: usize,
) -> (Vec<f64>, Vec<f64>, f64, usize) {
    let host = Host::new(module);
    let vm = host
        .builder()
        .plugin_config(config())
        .trace(false)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        &vm,
        &fleet(pods, host.now_ms())
            .encode()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let bodies: Vec<Vec<u8>> = (0..16).map(|i| body(size, i)).collect();
    let mut decide = Vec::with_capacity(iters);
    let mut floor = Vec::with_capacity(iters);
    let calls0 = vm.host_calls();
    for i in 0..iters + iters / 10 {
        let b = &bodies[i % bodies.len()];
        let len = b.len().to_string();
        let mut r = vm.request();
        r.headers(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", &len),
        ])
        .body_split(b, CHUNK);
        let t = Instant::now();
        r.send().unwrap_or_else(|e| panic!("{e}"));
        let dt = t.elapsed().as_secs_f64() * 1e6;
        assert!(
            r.upstream_header("x-gateway-destination-endpoint")
                .is_some(),
            "not routed"
        );
        r.finish().unwrap_or_else(|e| panic!("{e}"));
        // The same VM, a request the filter lets through at once: the host's floor.
        let mut p = vm.request();
        p.headers(&[(":method", "GET"), (":path", "/v1/models")]);
        let t = Instant::now();
        p.send().unwrap_or_else(|e| panic!("{e}"));
        let pt = t.elapsed().as_secs_f64() * 1e6;
        p.finish().unwrap_or_else(|e| panic!("{e}"));
        if i >= iters / 10 {
            decide.push(dt);
            floor.push(pt);
        }
        if i % 256 == 0 {
            vm.forget_finished();
        }
    }
    let per_req = (vm.host_calls() - calls0) as f64 / (iters + iters / 10) as f64;
    (decide, floor, per_req, vm.memory_bytes())
}

/// µs per request for the same decision in native Rust (parse + route + release).
fn native_run(pods: usize, size: usize, iters: usize) -> Vec<f64> {
    let store = MemoryStore::new();
    let router = Router::new(Config::parse(config().as_bytes()).unwrap_or_else(|e| panic!("{e}")));
    let now = 1_767_225_600_000;
    let fleet = Fleet::load(&store, fleet(pods, now), now, &router.config);
    let bodies: Vec<Vec<u8>> = (0..16).map(|i| body(size, i)).collect();
    let mut out = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let b = &bodies[i % bodies.len()];
        let t = Instant::now();
        let parsed = request::parse(ApiKind::ChatCompletions, b).unwrap_or_else(|e| panic!("{e}"));
        let ctx = Context {
            priority: 0,
            now_ms: now,
            tie: i as u64,
            deadline_ms: None,
        };
        let routed = router
            .route(&store, Some(&fleet), &parsed, ctx)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let dt = t.elapsed().as_secs_f64() * 1e6;
        black_box(&routed);
        if let Some(pod) = &routed.inflight_pod {
            router.finished(&store, &routed.pool, pod, routed.pending_tokens);
        }
        if i >= iters / 10 {
            out.push(dt);
        }
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let module = Module::filter().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "decision time per request, release filter .wasm under wasmtime (µs; body in {} KB chunks)",
        CHUNK / 1024
    );
    println!(
        "{:>5} {:>7} | {:>9} {:>9} | {:>10} {:>10} | {:>9} {:>9} | {:>10} {:>9} {:>8}",
        "pods",
        "body",
        "wasm p50",
        "wasm p99",
        "native p50",
        "native p99",
        "pass p50",
        "pass p99",
        "wasm/nat",
        "calls/req",
        "VM KiB"
    );
    for pods in [4, 16, 64, 256] {
        for (label, size) in [("1KB", 1024), ("20KB", 20 * 1024), ("200KB", 200 * 1024)] {
            if only
                .as_ref()
                .is_some_and(|o| *o != format!("{pods}/{label}"))
            {
                continue;
            }
            let iters = match (size, quick) {
                (s, true) if s > 100_000 => 30,
                (_, true) => 100,
                (s, false) if s > 100_000 => 200,
                (s, false) if s > 10_000 => 600,
                _ => 1500,
            };
            let (wasm, floor, calls, memory) = wasm_run(&module, pods, size, iters);
            let native = native_run(pods, size, iters);
            let (w50, w99) = stats(wasm);
            let (n50, n99) = stats(native);
            let (f50, f99) = stats(floor);
            println!(
                "{pods:>5} {label:>7} | {w50:>9.1} {w99:>9.1} | {n50:>10.1} {n99:>10.1} | {f50:>9.1} {f99:>9.1} | {:>9.1}x {calls:>9.1} {:>8}",
                w50 / n50.max(0.001),
                memory / 1024
            );
        }
    }
}
