//! Fuzz target: the plugin configuration parser (`llm_router_core::Config::parse`), which Envoy
//! feeds whatever an operator wrote.
//!
//! Properties checked, beyond "no panic":
//! - refused input gets a `ConfigError` with a message (the one log line at load);
//! - an accepted configuration round-trips: written back as JSON (`serde_json::Value`) and
//!   parsed again it gives the same `Config`, so nothing depends on formatting or key order
//!   beyond what JSON means;
//! - what was accepted is coherent: every model route points at a pool, `top_k` ≥ 1, the
//!   Retry-After bounds are ordered, the push endpoints have a secret, weights are finite and
//!   not negative;
//! - a router built from it decides a request for each configured model without panicking,
//!   with or without a snapshot.
#![no_main]
// A fuzz target asserts with panics: libFuzzer records each as a crash.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use llm_router_core::request::{parse, ApiKind};
use llm_router_core::{Config, Context, Fleet, MemoryStore, Router};
use llm_router_snapshot::{Engine, Pod, Pool, Snapshot};

fn snapshot(config: &Config) -> Snapshot {
    Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 1_000,
        pools: config
            .pools
            .iter()
            .take(4)
            .enumerate()
            .map(|(i, p)| Pool {
                name: p.name.clone(),
                cluster: p.cluster.clone(),
                models: Vec::new(),
                pods: (0..3u32)
                    .map(|j| Pod {
                        address: format!("10.0.{i}.{j}:8000"),
                        engine: Engine::Vllm,
                        waiting: j * 3,
                        running: 2,
                        kv_usage: Some(0.3 * j as f32),
                        ..Pod::default()
                    })
                    .collect(),
                    peer_contexts: Vec::new(),
            })
            .collect(),
    }
}

fn check_accepted(config: &Config) {
    assert!(config.top_k >= 1);
    assert!(config.retry_after_s <= config.retry_after_max_s);
    assert!(!config.snapshot.endpoints || !config.snapshot.secret.is_empty());
    for route in config.models.values() {
        assert!(route.pool < config.pools.len());
    }
    for pool in config.pools.iter().chain([&config.default_pool]) {
        let w = pool.weights.0;
        assert!(w.iter().all(|x| x.is_finite() && *x >= 0.0), "{w:?}");
    }
}

fn route_models(config: Config) {
    let router = Router::new(config);
    // A snapshot whose pools are the configured ones (no snapshot at all is also a case).
    let snap = snapshot(&router.config);
    let fleet = Fleet::new(snap, 1_000, Vec::new(), &router.config);
    let mut models: Vec<&String> = router.config.models.keys().collect();
    models.sort();
    for model in models.into_iter().take(4) {
        let body = serde_json::json!({
            "model": model, "stream": true,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Name three prime numbers."}]
        })
        .to_string();
        let req = parse(ApiKind::ChatCompletions, body.as_bytes()).expect("a valid body");
        for fleet in [None, Some(&fleet)] {
            let store = MemoryStore::new();
            let ctx = Context {
                priority: 0,
                now_ms: 1_100,
                tie: 3,
                deadline_ms: None,
            };
            if let Err(rejection) = router.route(&store, fleet, &req, ctx) {
                let body: serde_json::Value =
                    serde_json::from_str(&rejection.body()).expect("rejection bodies are JSON");
                assert!(body["error"]["message"].is_string());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(config) => {
            check_accepted(&config);
            // Empty input means all defaults; otherwise it was JSON, and JSON's meaning is all
            // that counts.
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
                let again = Config::parse(value.to_string().as_bytes())
                    .expect("an accepted configuration, rewritten, is accepted");
                assert_eq!(again, config, "the configuration did not round-trip");
            }
            route_models(config);
        }
        Err(e) => assert!(!e.0.is_empty()),
    }
});
