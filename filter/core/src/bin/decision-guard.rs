//! A fixed routing decision, repeated: the input of the instruction-count regression guard
//! (`tests/instructions.rs` runs this under `valgrind --tool=callgrind`). Instruction counts
//! repeat on a noisy machine where wall-clock time does not.
//!
//! `decision-guard N [PODS]` parses, routes and releases N requests (after one warm-up; N at
//! most [`MAX_RUNS`]) of a 20 KB chat prompt over a pool of PODS pods (default 64, at most
//! [`MAX_PODS`]) on an in-memory store. The guard runs it with N = 0 and N > 0 and divides the
//! difference by N: instructions per decision, start-up, input preparation and the snapshot's
//! load excluded. Run at 64 and at 4,096 pods, the two counts show whether a decision's cost
//! grows with the pool (`tests/instructions.rs`, `a_decision_does_not_grow_with_the_pool`).
//!
//! `decision-guard replicas N [PODS]` makes the same decisions as one of several gateway
//! replicas behind a metrics hub: every pod shows another replica's request in flight, and the
//! snapshot carries the most peer contexts a pool holds (`MAX_PEER_CONTEXTS`, none of them the
//! prompt's), so each decision looks up the prompt's anchor among them and notes its new copy
//! in the ring its tally serves. Against the plain count: what sharing placements costs a
//! request.
//!
//! `decision-guard push N [PODS]` takes N pushes instead (after one warm-up): the encoded
//! snapshot of PODS pods decoded and validated, then indexed as a worker does on a new
//! generation ([`Fleet::load`]). Run at 256 and at 4,096 pods, the counts show whether a push
//! grows faster than the fleet (`a_push_grows_with_the_fleet_not_faster`).

use llm_router_core::request::{self, ApiKind};
use llm_router_core::router::Decision;
use llm_router_core::{Config, Context, Fleet, Hold, MemoryStore, Router};
use llm_router_snapshot::{
    Engine, Health, LoraState, PeerContext, PeerWork, Pod, Pool, Snapshot, MAX_PEER_CONTEXTS,
};
use std::hint::black_box;
use std::process::ExitCode;

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// Pods in the pool unless the second argument says otherwise.
const DEFAULT_PODS: usize = 64;
/// Largest pool.
const MAX_PODS: usize = 16_384;
const BODY_BYTES: usize = 20 * 1024;
const NOW_MS: u64 = 1_767_225_600_000;
/// Largest N; the bodies of all runs are made whatever N is, so only decisions differ.
const MAX_RUNS: usize = 50;

fn config() -> String {
    format!(
        r#"{{"pools": [{{"name": "llama", "cluster": "pool_llama", "models": ["{LLAMA}"], "adapters": ["sql-lora"]}}],
            "snapshot": {{"secret": "decision-guard-secret-0123456789abcdef", "stale_after_ms": 3600000}}}}"#
    )
}

/// `pods` pods with varied load, every third running an adapter.
fn snapshot(pods: usize) -> Snapshot {
    let pods = (0..pods)
        .map(|i| Pod {
            address: format!("10.0.{}.{}:8000", i / 256, i % 256),
            engine: Engine::Vllm,
            health: Health::Ok,
            failures: 0,
            scraped_at_ms: NOW_MS,
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
        created_ms: NOW_MS,
        pools: vec![Pool {
            name: "llama".into(),
            cluster: "pool_llama".into(),
            models: vec![LLAMA.into()],
            pods,
            peer_contexts: Vec::new(),
        }],
    }
}

/// [`snapshot`] as one of several gateway replicas sees it: another replica's request in
/// flight on every pod, and a full list of the contexts other replicas placed (keys no prompt
/// of [`body`] has, spread over the pods).
fn replicas_snapshot(pods: usize) -> Snapshot {
    let mut snap = snapshot(pods);
    for pool in &mut snap.pools {
        for pod in &mut pool.pods {
            pod.peers = PeerWork {
                in_flight: 1,
                pending_tokens: 512,
            };
        }
        let ids: Vec<u32> = pool
            .pods
            .iter()
            .map(|p| llm_router_core::prefix::pod_id(&p.address))
            .collect();
        pool.peer_contexts = (0..MAX_PEER_CONTEXTS)
            .map(|i| PeerContext {
                key: xxhash_rust::xxh64::xxh64(&(i as u64).to_le_bytes(), 7),
                pod: ids.get(i % ids.len().max(1)).copied().unwrap_or(0),
                blocks: 128,
            })
            .collect();
        pool.peer_contexts.sort_unstable();
    }
    snap
}

/// A chat body of 20 KB: a system prompt and a user turn that differs per request.
fn body(i: usize) -> Vec<u8> {
    let mut user = format!("request {i}: ");
    while user.len() < BODY_BYTES - 200 {
        user.push_str("the quick brown fox jumps over the lazy dog ");
    }
    serde_json::json!({"model": LLAMA, "stream": true, "messages": [
        {"role": "system", "content": "You are a helpful assistant that answers briefly."},
        {"role": "user", "content": user}]})
    .to_string()
    .into_bytes()
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let push = args.first().is_some_and(|a| a == "push");
    let replicas = args.first().is_some_and(|a| a == "replicas");
    if push || replicas {
        args.remove(0);
    }
    let runs: usize = match args.first().map(|a| a.parse()) {
        Some(Ok(n)) if n <= MAX_RUNS => n,
        _ => {
            eprintln!(
                "usage: decision-guard [push|replicas] N [PODS]  (0 <= N <= {MAX_RUNS}, 1 <= PODS <= {MAX_PODS})"
            );
            return ExitCode::from(2);
        }
    };
    let pods: usize = match args.get(1).map(|a| a.parse()) {
        None => DEFAULT_PODS,
        Some(Ok(p)) if (1..=MAX_PODS).contains(&p) => p,
        _ => {
            eprintln!("decision-guard: PODS must be in 1..={MAX_PODS}");
            return ExitCode::from(2);
        }
    };
    let config = match Config::parse(config().as_bytes()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let store = MemoryStore::new();
    if push {
        return pushes(&store, &config, pods, runs);
    }
    let router = Router::new(config);
    let snap = if replicas {
        replicas_snapshot(pods)
    } else {
        snapshot(pods)
    };
    let fleet = Fleet::load(&store, snap, NOW_MS, &router.config);
    // The same bodies whatever N is: runs differ only in the decisions they make.
    let bodies: Vec<Vec<u8>> = (0..=MAX_RUNS).map(body).collect();
    for (i, b) in bodies.iter().take(runs + 1).enumerate() {
        let Ok(parsed) = request::parse(ApiKind::ChatCompletions, b) else {
            eprintln!("the fixed body does not parse");
            return ExitCode::FAILURE;
        };
        let ctx = Context {
            priority: 0,
            now_ms: NOW_MS,
            tie: i as u64,
            deadline_ms: None,
        };
        // As Envoy decides by default: flow control on, nothing held before it.
        let Ok(Decision::Routed(routed)) =
            router.decide(&store, Some(&fleet), &parsed, ctx, Hold::IfFull)
        else {
            eprintln!("the fixed request was not routed");
            return ExitCode::FAILURE;
        };
        if let Some(pod) = &routed.inflight_pod {
            router.finished(&store, &routed.pool, pod, routed.pending_tokens);
        }
        black_box(routed);
    }
    ExitCode::SUCCESS
}

/// `runs` pushes (and a warm-up) of the encoded snapshot of `pods` pods: decoded, validated and
/// indexed as a worker does on a new generation.
fn pushes(store: &MemoryStore, config: &Config, pods: usize, runs: usize) -> ExitCode {
    let Ok(bytes) = snapshot(pods).encode() else {
        eprintln!("the fixed snapshot does not encode");
        return ExitCode::FAILURE;
    };
    for _ in 0..=runs {
        let Ok(snap) = Snapshot::decode(black_box(&bytes)) else {
            eprintln!("the fixed snapshot does not decode");
            return ExitCode::FAILURE;
        };
        black_box(Fleet::load(store, snap, NOW_MS, config));
    }
    ExitCode::SUCCESS
}
