//! Fuzz target: the request body parser (`llm_router_core::request::parse`) and the decision it
//! feeds, on any bytes a client can send.
//!
//! Every input is parsed as each of the five API kinds. Properties checked, beyond "no panic":
//! - a body that is not JSON (UTF-8 text) is refused as `Malformed`; an accepted body is a JSON
//!   object;
//! - an error becomes an OpenAI-style error body (JSON with the message) and a 400, repeating
//!   only a bounded amount of the client's text;
//! - `model_span` covers exactly the JSON string of `model`; writing another model name there
//!   (what the filter does for `rewrite`) gives a body that parses to the new name with the same
//!   `stream` and prompt pieces;
//! - the prompt text comes from the body: its pieces never add up to more bytes than the body;
//! - a routed request goes to pods of its pool (at most `top_k`), and once it finishes the pod's
//!   in-flight count and pending tokens are back to zero.
#![no_main]
// A fuzz target asserts with panics: libFuzzer records each as a crash.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use llm_router_core::reject::MAX_ECHO_BYTES;
use llm_router_core::request::{parse, ApiKind, Piece};
use llm_router_core::{inflight, Config, Context, Fleet, MemoryStore, Rejection, Router};
use llm_router_snapshot::{Engine, LoraState, Pod, Pool, Snapshot};

const KINDS: [ApiKind; 5] = [
    ApiKind::ChatCompletions,
    ApiKind::Completions,
    ApiKind::Embeddings,
    ApiKind::Responses,
    ApiKind::Messages,
];

/// Models of the bodies in test-harness/fixtures/bodies (the seed corpus), so seeds route.
const CONFIG: &str = r#"{
  "pools": [
    {"name": "chat", "cluster": "pool_chat",
     "models": ["gpt-4o-mini", "gpt-5.4", "claude-opus-5",
                {"name": "gpt-4o", "rewrite": "gpt-4o-2024-08-06"}],
     "adapters": ["sql-lora", "chat-lora"]},
    {"name": "embed", "cluster": "pool_embed", "preset": "throughput",
     "models": ["text-embedding-3-small", "text-embedding-ada-002"]}
  ],
  "top_k": 2
}"#;

fn pod(address: &str, waiting: u32, kv: f32, lora: Option<LoraState>) -> Pod {
    Pod {
        address: address.into(),
        engine: Engine::Vllm,
        waiting,
        running: 3,
        kv_usage: Some(kv),
        block_size: 16,
        num_blocks: 1000,
        lora,
        ..Pod::default()
    }
}

fn fleet(config: &Config) -> Fleet {
    let lora = LoraState {
        running: vec!["sql-lora".into()],
        waiting: vec!["chat-lora".into()],
        max_loras: 2,
    };
    let snapshot = Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 1_000,
        pools: vec![
            Pool {
                name: "chat".into(),
                cluster: "pool_chat".into(),
                models: vec!["gpt-4o-mini".into()],
                pods: vec![
                    pod("10.0.0.1:8000", 2, 0.5, Some(lora)),
                    pod("10.0.0.2:8000", 0, 0.1, None),
                    pod("10.0.0.3:8000", 7, 0.95, None),
                ],
                peer_contexts: Vec::new(),
            },
            Pool {
                name: "embed".into(),
                cluster: "pool_embed".into(),
                models: vec!["text-embedding-3-small".into()],
                pods: vec![pod("10.0.1.1:8000", 0, 0.0, None)],
                peer_contexts: Vec::new(),
            },
        ],
    };
    Fleet::new(snapshot, 1_000, Vec::new(), config)
}

struct Setup {
    router: Router,
    fleet: Fleet,
}

thread_local! {
    static SETUP: Setup = {
        let config = Config::parse(CONFIG.as_bytes()).expect("the fuzz configuration is valid");
        let fleet = fleet(&config);
        Setup { router: Router::new(config), fleet }
    };
}

fn text_len(pieces: &[Piece<'_>]) -> usize {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => t.len(),
            Piece::Tokens(_) => 0,
        })
        .sum()
}

fn check_error(e: &llm_router_core::RequestError) {
    // What the filter sends back (filter/wasm: `Rejection::bad_request(code, e.to_string())`):
    // a 400 whose JSON body says why, repeating at most `MAX_ECHO_BYTES` of the client's text.
    let rejection = Rejection::bad_request("invalid_json", e.to_string());
    assert_eq!(rejection.status, 400);
    assert!(!rejection.message.is_empty());
    assert!(rejection.message.len() <= MAX_ECHO_BYTES + '…'.len_utf8());
    let body: serde_json::Value =
        serde_json::from_str(&rejection.body()).expect("error bodies are JSON");
    assert_eq!(
        body["error"]["message"].as_str(),
        Some(rejection.message.as_str())
    );
    assert_eq!(body["error"]["code"].as_str(), Some("invalid_json"));
}

fn check(setup: &Setup, kind: ApiKind, data: &[u8], is_json: bool) {
    let req = match parse(kind, data) {
        Ok(req) => req,
        Err(e) => {
            if !is_json {
                assert!(
                    matches!(e, llm_router_core::RequestError::Malformed(_)),
                    "not JSON but {e:?}"
                );
            }
            check_error(&e);
            return;
        }
    };
    assert!(is_json, "accepted a body that is not JSON");
    assert_eq!(
        data.trim_ascii_start().first(),
        Some(&b'{'),
        "accepted a non-object"
    );
    assert!(!req.model.is_empty());
    assert!(req.key_pieces.is_none_or(|k| k <= req.pieces.len()));
    assert!(req.history_pieces.is_none_or(|k| k < req.pieces.len()));
    assert!(
        text_len(&req.pieces) <= data.len(),
        "more prompt text than body"
    );

    // The span is the model's JSON string, and rewriting it there keeps everything else.
    let (start, end) = req.model_span;
    let quoted = data.get(start..end).expect("model span inside the body");
    let model: String = serde_json::from_slice(quoted).expect("model span is a JSON string");
    assert_eq!(model, req.model);
    let mut rewritten = data.get(..start).expect("head").to_vec();
    rewritten.extend_from_slice(br#""rewritten\"model""#);
    rewritten.extend_from_slice(data.get(end..).expect("tail"));
    let again = parse(kind, &rewritten).expect("a rewritten body still parses");
    assert_eq!(again.model, "rewritten\"model");
    assert_eq!(again.stream, req.stream);
    assert_eq!(again.pieces, req.pieces);
    assert_eq!(again.key_pieces, req.key_pieces);
    assert_eq!(again.history_pieces, req.history_pieces);

    // The decision, then the end of the stream: nothing stays counted.
    let store = MemoryStore::new();
    let ctx = Context {
        priority: 0,
        now_ms: 1_500,
        tie: data.len() as u64,
        deadline_ms: None,
    };
    match setup.router.route(&store, Some(&setup.fleet), &req, ctx) {
        Ok(routed) => {
            let pool = setup
                .fleet
                .snapshot
                .pool(&routed.pool)
                .expect("routed to a pool of the snapshot");
            assert!(routed.endpoints.len() <= setup.router.config.top_k);
            for e in &routed.endpoints {
                assert!(pool.pods.iter().any(|p| &p.address == e), "{e} not in pool");
            }
            if let Some(pod) = &routed.inflight_pod {
                assert_eq!(routed.endpoints.first(), Some(pod));
                assert_eq!(inflight::read(&store, &routed.pool).get(pod).in_flight, 1);
                setup
                    .router
                    .finished(&store, &routed.pool, pod, routed.pending_tokens);
                let load = inflight::read(&store, &routed.pool).get(pod);
                assert_eq!((load.in_flight, load.pending_tokens), (0, 0));
            }
        }
        Err(rejection) => {
            let body: serde_json::Value =
                serde_json::from_str(&rejection.body()).expect("rejection bodies are JSON");
            assert!(body["error"]["message"].is_string());
            assert!(rejection.message.len() < 2 * MAX_ECHO_BYTES);
            assert!(matches!(rejection.status, 404 | 429 | 503));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // JSON text is UTF-8 (RFC 8259); `IgnoredAny` checks the syntax without any depth limit.
    let is_json = std::str::from_utf8(data).is_ok()
        && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok();
    SETUP.with(|setup| {
        for kind in KINDS {
            check(setup, kind, data, is_json);
        }
    });
});
