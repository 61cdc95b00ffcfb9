//! Fuzz target: the snapshot decoder (`llm_router_snapshot::Snapshot::decode`), which reads the
//! bytes of every push before the filter trusts them, and the router on whatever it accepts.
//!
//! Properties checked, beyond "no panic":
//! - a decoded snapshot re-encodes to exactly the input bytes (the format has one encoding per
//!   snapshot, so nothing is lost or invented by the decoder) and passes `validate`;
//! - an error is one of the typed `DecodeError`s whose positions lie inside the input;
//! - a request for any model of any decoded pool is routed to pods of that pool or refused with
//!   an OpenAI-style error, and leaves no in-flight count behind once finished.
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
use llm_router_core::{inflight, Config, Context, Fleet, MemoryStore, Router};
use llm_router_snapshot::{DecodeError, Snapshot};

/// No pools of its own: every pool and model comes from the snapshot.
const CONFIG: &str = r#"{"top_k": 3}"#;

thread_local! {
    static ROUTER: Router =
        Router::new(Config::parse(CONFIG.as_bytes()).expect("the fuzz configuration is valid"));
}

fn check_error(e: &DecodeError, len: usize) {
    match e {
        DecodeError::Truncated { at, .. } => assert!(*at <= len),
        DecodeError::TrailingBytes { at, extra } => assert_eq!(at + extra, len),
        DecodeError::BadUtf8 { at } => assert!(*at < len),
        DecodeError::TooMany { count, max, .. } => assert!(count > max),
        _ => {}
    }
    assert!(!e.to_string().is_empty());
}

fn route_each_pool(router: &Router, snapshot: Snapshot) {
    let fleet = Fleet::new(snapshot, 1_000, Vec::new(), &router.config);
    for pool in fleet.snapshot.pools.iter().take(4) {
        let Some(model) = pool.models.first() else {
            continue;
        };
        let body = serde_json::json!({
            "model": model, "stream": true,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]
        })
        .to_string();
        // The format allows an empty model name, which no request can ask for.
        let Ok(req) = parse(ApiKind::ChatCompletions, body.as_bytes()) else {
            assert!(model.is_empty(), "a request for {model:?} does not parse");
            continue;
        };
        let store = MemoryStore::new();
        let ctx = Context {
            priority: 0,
            now_ms: 1_200,
            tie: 7,
            deadline_ms: None,
        };
        match router.route(&store, Some(&fleet), &req, ctx) {
            Ok(routed) => {
                let routed_pool = fleet.snapshot.pool(&routed.pool).expect("a snapshot pool");
                for e in &routed.endpoints {
                    assert!(routed_pool.pods.iter().any(|p| &p.address == e));
                }
                if let Some(pod) = &routed.inflight_pod {
                    router.finished(&store, &routed.pool, pod, routed.pending_tokens);
                    let load = inflight::read(&store, &routed.pool).get(pod);
                    assert_eq!((load.in_flight, load.pending_tokens), (0, 0));
                }
            }
            Err(rejection) => {
                let body: serde_json::Value =
                    serde_json::from_str(&rejection.body()).expect("rejection bodies are JSON");
                assert!(body["error"]["message"].is_string());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    match Snapshot::decode(data) {
        Ok(snapshot) => {
            snapshot.validate().expect("a decoded snapshot is valid");
            let again = snapshot.encode().expect("a decoded snapshot encodes");
            assert_eq!(again, data, "decode → encode changed the bytes");
            ROUTER.with(|router| route_each_pool(router, snapshot));
        }
        Err(e) => check_error(&e, data.len()),
    }
});
