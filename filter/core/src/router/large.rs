//! A large pool's shortlist against scoring every pod: seeded random pools of more than
//! [`score::LARGE_POOL`] pods (reports with many exact ties, stale and failing pods, baseline
//! counts, this proxy's entries with learned rates, pending work and error runs, cached
//! prefixes, contradicted pods), random requests, presets, `top_k` and priorities. The
//! shortlisted decision must be the whole pool's, byte for byte: the same endpoints in the same
//! order with the same scores, or the same rejection.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use super::*;
use crate::inflight::{PodLoad, Table};
use crate::predict::Fit;
use crate::request::{parse, ApiKind};
use crate::score;
use crate::store::MemoryStore;
use llm_router_snapshot::{Engine, Health, LoraState, PeerWork, Pod, Pool, Snapshot};
use std::sync::atomic::Ordering::Relaxed;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const NOW_MS: u64 = 1_000_000;

/// SplitMix64: a small seeded generator, so every case can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        score::mix(self.0, 0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn addr(i: usize) -> String {
    format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256)
}

/// One case: the router, its fleet and the shared store after some traffic, and the requests
/// to compare. The same seed builds the same case.
fn case(seed: u64) -> (Router, Fleet, MemoryStore, Vec<(String, Context)>) {
    let mut rng = Rng(seed);
    let preset = ["latency", "throughput", "gaie"][rng.below(3) as usize];
    let top_k = 1 + rng.below(4);
    let json = format!(
        r#"{{"pools": [{{"name": "llama", "cluster": "pool_llama", "models": ["{MODEL}"],
             "adapters": ["sql-lora"], "preset": "{preset}"}}],
           "snapshot": {{"secret": "router-test-secret-0123456789abcdef", "stale_after_ms": 1000000}},
           "top_k": {top_k}}}"#
    );
    let router = Router::new(Config::parse(json.as_bytes()).unwrap());
    let n = score::LARGE_POOL + 30 + rng.below(600) as usize;
    // Few distinct reports: exact ties in every gauge, and a uniform pool now and then.
    let spread = if rng.chance(15) { 1 } else { 2 + rng.below(6) };
    // A loaded pool now and then: most pods past the queue threshold, near it, or some.
    let queued = [0, 0, 3, 4, 5][rng.below(5) as usize];
    let pods: Vec<Pod> = (0..n)
        .map(|i| Pod {
            address: addr(i),
            engine: Engine::Vllm,
            health: match rng.below(40) {
                0 => Health::Failing,
                1 | 2 => Health::Stale,
                _ => Health::Ok,
            },
            waiting: queued + rng.below(spread) as u32,
            running: rng.below(spread * 3) as u32,
            kv_usage: match rng.below(10) {
                0 => None,
                _ => Some(rng.below(spread) as f32 / 8.0),
            },
            block_size: 16,
            num_blocks: 1000,
            lora: rng.chance(30).then(|| LoraState {
                running: vec!["sql-lora".into()],
                waiting: vec![],
                max_loras: 2,
            }),
            // Other gateway replicas' work, from a hub.
            peers: if rng.chance(2) {
                PeerWork {
                    in_flight: 1 + rng.below(3) as u32,
                    pending_tokens: rng.below(4_000) as u32,
                }
            } else {
                PeerWork::default()
            },
            ..Pod::default()
        })
        .collect();
    let store = MemoryStore::new();
    // This proxy's counts when the snapshot was accepted: some pods report fewer than that
    // (contradicted).
    let mut baseline = Table::default();
    for _ in 0..rng.below(6) {
        let i = rng.below(n as u64) as usize;
        let load = PodLoad {
            in_flight: 1 + rng.below(5) as u32,
            ..PodLoad::default()
        };
        baseline.entries.push((addr(i), load));
    }
    store
        .set(&inflight::baseline_key("llama"), &baseline.encode(), None)
        .unwrap();
    let snapshot = Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: NOW_MS,
        pools: vec![Pool {
            name: "llama".into(),
            cluster: "pool_llama".into(),
            models: vec![MODEL.into()],
            pods,
            peer_contexts: Vec::new(),
        }],
    };
    let fleet = Fleet::load(&store, snapshot, NOW_MS, &router.config);
    let documents = 1 + rng.below(4);
    let body = |rng: &mut Rng| {
        let doc = rng.below(documents);
        let mut text = format!("document {doc}: ");
        for _ in 0..(20 + rng.below(200)) {
            text.push_str("the quick brown fox jumps over the lazy dog ");
        }
        text.push_str(&format!("question {}", rng.next()));
        // An adapter request now and then: scored over the whole pool, the same homes.
        let model = if rng.chance(10) { "sql-lora" } else { MODEL };
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": text}]})
            .to_string()
    };
    let context = |rng: &mut Rng| Context {
        priority: [-1, 0, 0, 1][rng.below(4) as usize],
        now_ms: NOW_MS + rng.below(100),
        tie: rng.next(),
        deadline_ms: None,
    };
    // Traffic before: cached prefixes and requests in flight.
    for _ in 0..rng.below(12) {
        let b = body(&mut rng);
        let req = parse(ApiKind::ChatCompletions, b.as_bytes()).unwrap();
        let c = Context {
            priority: 1,
            ..context(&mut rng)
        };
        let _ = router.route(&store, Some(&fleet), &req, c);
    }
    // Learned rates, pending work, error runs.
    let mut live = inflight::read(&store, "llama");
    for _ in 0..rng.below(20) {
        let i = rng.below(n as u64) as usize;
        let mut fit = Fit::default();
        let cost = 0.05 + rng.below(20) as f64 / 100.0;
        for _ in 0..rng.below(6) {
            let w = 100.0 + rng.below(4000) as f64;
            fit.observe(w, w, 20.0 + cost * w);
        }
        let errors = if rng.chance(20) { 5 } else { 0 };
        let load = PodLoad {
            in_flight: rng.below(4) as u32,
            pending_tokens: rng.below(3000) as u32,
            fit,
            errors,
            ejected_until_ms: if errors > 0 { NOW_MS + 10_000 } else { 0 },
            life_ms: 0.0,
        };
        live.entries.retain(|(a, _)| *a != addr(i));
        live.entries.push((addr(i), load));
    }
    if rng.chance(50) {
        live.mean_prefill_tokens = 200.0 + rng.below(2000) as f32;
    }
    store
        .set(&inflight::key("llama"), &live.encode(), None)
        .unwrap();
    let requests = (0..4)
        .map(|_| (body(&mut rng), context(&mut rng)))
        .collect();
    (router, fleet, store, requests)
}

#[test]
fn a_large_pools_shortlist_decides_as_scoring_every_pod() {
    let (mut routed, mut rejected) = (0, 0);
    let mut shortlisted = 0;
    let (mut rejudged, mut shortlisted_admitted) = (0, 0);
    for seed in 0..300 {
        let (router, fleet, store, requests) = case(seed);
        let (_, mut whole, whole_store, _) = case(seed);
        for pool in &mut whole.pools {
            pool.shortlist = None;
        }
        assert!(
            fleet.pools[0].shortlist.is_some(),
            "seed {seed}: no shortlist"
        );
        for (i, (body, c)) in requests.iter().enumerate() {
            let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
            let before = SHORTLISTED.load(Relaxed);
            let got = router.route(&store, Some(&fleet), &req, *c);
            shortlisted += usize::from(SHORTLISTED.load(Relaxed) > before);
            let want = router.route(&whole_store, Some(&whole), &req, *c);
            // Debug output compares the work estimate's NaN too.
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "seed {seed}, request {i}"
            );
            match got {
                Ok(_) => routed += 1,
                Err(_) => rejected += 1,
            }
            // With flow control (on by default): held or admitted exactly as the whole pool,
            // the shortlist kept whenever every pod on it fits.
            let before = (SHORTLISTED.load(Relaxed), REJUDGED.load(Relaxed));
            let got = router.decide(&store, Some(&fleet), &req, *c, Hold::IfFull);
            let kept = SHORTLISTED.load(Relaxed) > before.0 && REJUDGED.load(Relaxed) == before.1;
            let want = router.decide(&whole_store, Some(&whole), &req, *c, Hold::IfFull);
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "seed {seed}, request {i}, flow control"
            );
            rejudged += REJUDGED.load(Relaxed) - before.1;
            shortlisted_admitted += usize::from(kept);
        }
    }
    println!(
        "with flow control: {shortlisted_admitted} shortlisted and admitted, {rejudged} judged whole"
    );
    assert!(rejudged > 0, "no shortlist was set aside");
    assert!(
        shortlisted_admitted > 200,
        "only {shortlisted_admitted} decisions under flow control were shortlisted"
    );
    // The cases cover both outcomes, and most decisions were shortlisted.
    println!("{routed} routed, {rejected} rejected, {shortlisted} shortlisted");
    assert!(
        routed > 300 && rejected > 30,
        "{routed} routed, {rejected} rejected"
    );
    assert!(
        shortlisted > 900,
        "only {shortlisted} decisions were shortlisted"
    );
    assert!(
        shortlisted < routed + rejected,
        "no decision was scored whole"
    );
}
