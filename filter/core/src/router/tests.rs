//! The whole decision: model → pool, snapshot freshness, every rejection path, in-flight and
//! prefix side effects, with real fixture bodies.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use super::*;
use crate::prefix;
use crate::request::{parse, ApiKind};
use crate::store::MemoryStore;
use llm_router_snapshot::{Engine, Health, LoraState, PeerWork, Pod, Pool, Snapshot};

const CONFIG: &str = r#"{
  "pools": [
    {"name": "llama", "cluster": "pool_llama",
     "models": ["meta-llama/Llama-3.1-8B-Instruct", {"name": "llama-8b", "rewrite": "meta-llama/Llama-3.1-8B-Instruct"}],
     "adapters": ["sql-lora"]},
    {"name": "qwen", "cluster": "pool_qwen", "models": ["Qwen/Qwen3-32B"], "preset": "throughput"}
  ],
  "snapshot": {"secret": "router-test-secret-0123456789abcdef", "stale_after_ms": 1000},
  "top_k": 2
}"#;

fn router(json: &str) -> Router {
    Router::new(Config::parse(json.as_bytes()).unwrap())
}

fn pod(addr: &str, waiting: u32, kv: f32) -> Pod {
    Pod {
        address: addr.into(),
        engine: Engine::Vllm,
        waiting,
        running: 4,
        kv_usage: Some(kv),
        block_size: 16,
        num_blocks: 1000,
        ..Pod::default()
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 1000,
        pools: vec![
            Pool {
                name: "llama".into(),
                cluster: "pool_llama".into(),
                models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
                pods: vec![
                    pod("10.0.0.1:8000", 3, 0.7),
                    pod("10.0.0.2:8000", 0, 0.2),
                    pod("10.0.0.3:8000", 1, 0.5),
                ],
                peer_contexts: Vec::new(),
            },
            Pool {
                name: "qwen".into(),
                cluster: "pool_qwen".into(),
                models: vec!["Qwen/Qwen3-32B".into()],
                pods: vec![pod("10.0.1.1:8000", 0, 0.1)],
                peer_contexts: Vec::new(),
            },
            Pool {
                name: "discovered".into(),
                cluster: "pool_discovered".into(),
                models: vec!["mistral-7b".into()],
                pods: vec![Pod {
                    lora: Some(LoraState {
                        running: vec!["fr-lora".into()],
                        waiting: vec![],
                        max_loras: 2,
                    }),
                    ..pod("10.0.2.1:8000", 0, 0.1)
                }],
                peer_contexts: Vec::new(),
            },
        ],
    }
}

fn chat(model: &str, text: &str) -> String {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": text}]}).to_string()
}

fn ctx(now_ms: u64) -> Context {
    Context {
        priority: 0,
        now_ms,
        tie: 42,
        deadline_ms: None,
    }
}

fn go(
    r: &Router,
    store: &MemoryStore,
    fleet: Option<&Fleet>,
    body: &str,
    c: Context,
) -> Result<Route, Rejection> {
    let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    r.route(store, fleet, &req, c)
}

#[test]
fn routes_to_the_pod_the_snapshot_favours_with_fallbacks() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let out = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap();
    assert_eq!(out.cluster, "pool_llama");
    assert_eq!(out.endpoints, ["10.0.0.2:8000", "10.0.0.3:8000"]);
    assert_eq!(out.mode, RouteMode::Scored);
    assert_eq!(out.inflight_pod.as_deref(), Some("10.0.0.2:8000"));
    let load = inflight::read(&s, "llama").get("10.0.0.2:8000");
    assert_eq!(
        (load.in_flight, load.pending_tokens),
        (1, out.pending_tokens)
    );
    assert!(out.pending_tokens > 0 && out.work_tokens >= f64::from(out.pending_tokens));
    r.finished(&s, "llama", "10.0.0.2:8000", out.pending_tokens);
    assert_eq!(
        inflight::read(&s, "llama").get("10.0.0.2:8000"),
        inflight::PodLoad::default()
    );
}

#[test]
fn two_models_two_clusters_and_rewrite() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let q = go(
        &r,
        &s,
        Some(&fleet),
        &chat("Qwen/Qwen3-32B", "hi"),
        ctx(1100),
    )
    .unwrap();
    assert_eq!(
        (q.cluster.as_str(), q.endpoints[0].as_str()),
        ("pool_qwen", "10.0.1.1:8000")
    );
    let l = go(&r, &s, Some(&fleet), &chat("llama-8b", "hi"), ctx(1100)).unwrap();
    assert_eq!(l.cluster, "pool_llama");
    assert_eq!(
        l.rewrite.as_deref(),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );
}

#[test]
fn models_and_adapters_known_only_from_the_snapshot() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let m = go(&r, &s, Some(&fleet), &chat("mistral-7b", "hi"), ctx(1100)).unwrap();
    assert_eq!(m.cluster, "pool_discovered");
    let a = go(&r, &s, Some(&fleet), &chat("fr-lora", "bonjour"), ctx(1100)).unwrap();
    assert_eq!(a.endpoints, ["10.0.2.1:8000"]);
    let e = go(&r, &s, Some(&fleet), &chat("gpt-5", "hi"), ctx(1100)).unwrap_err();
    assert_eq!((e.status, e.code), (404, "model_not_found"));
    assert!(e.body().contains("gpt-5"));
}

fn lora_pod(addr: &str, running: &[&str]) -> Pod {
    Pod {
        lora: Some(LoraState {
            running: running.iter().map(|a| a.to_string()).collect(),
            waiting: vec![],
            max_loras: 1,
        }),
        ..pod(addr, 0, 0.2)
    }
}

#[test]
fn an_adapter_goes_home_before_it_goes_where_it_is_loaded() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let addrs = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
    let home = crate::lora::homes(&["sql-lora".to_string()], &addrs, &[1, 1, 1])["sql-lora"];
    let elsewhere = (home + 1) % 3;
    let mut snap = snapshot();
    // The adapter runs on a pod that is not its home; the home's slot is free (its adapter
    // idle), the third pod's runs another adapter.
    snap.pools[0].pods = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| match i {
            i if i == elsewhere => lora_pod(a, &["sql-lora"]),
            i if i == home => lora_pod(a, &[]),
            _ => lora_pod(a, &["other"]),
        })
        .collect();
    let fleet = Fleet::new(snap.clone(), 1000, vec![], &r.config);
    let query = format!("select {}", "name, ".repeat(300)); // ≈ 450 tokens
    let out = go(&r, &s, Some(&fleet), &chat("sql-lora", &query), ctx(1100)).unwrap();
    assert_eq!(out.endpoints[0], addrs[home], "{:?}", out.scores);
    // ... unless the home is far busier (12 such prompts waiting, over a second of prefill):
    // then the pod that has it loaded.
    snap.pools[0].pods[home].waiting = 12;
    let s = MemoryStore::new();
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let out = go(&r, &s, Some(&fleet), &chat("sql-lora", &query), ctx(1100)).unwrap();
    assert_eq!(out.endpoints[0], addrs[elsewhere], "{:?}", out.scores);
}

/// A pod whose batch runs `max_loras` other adapters makes the request wait for one of them to
/// leave (vLLM schedules at most `max_loras` adapters per batch): the adapter goes where a slot
/// is free or where it runs, even away from its home.
/// One answered request on `addr` that took a second from routing to its last byte: the pod's
/// learned request life (what a wait for a LoRA batch slot is priced in).
fn answered_in_a_second(r: &Router, s: &MemoryStore, addr: &str) {
    inflight::routed(s, "llama", addr, 0);
    r.finished_with_status(
        s,
        "llama",
        addr,
        0,
        Answer {
            status: 200,
            now_ms: 0,
            life_ms: Some(1000.0),
        },
    );
}

#[test]
fn an_adapter_does_not_wait_at_home_for_a_batch_slot() {
    let r = router(CONFIG);
    let addrs = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
    let home = crate::lora::homes(&["sql-lora".to_string()], &addrs, &[2, 2, 2])["sql-lora"];
    let two = |a: &str, running: &[&str]| {
        let mut p = lora_pod(a, running);
        if let Some(l) = p.lora.as_mut() {
            l.max_loras = 2;
        }
        p
    };
    let fleet_with = |free: usize| {
        let mut snap = snapshot();
        snap.pools[0].pods = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| match i {
                i if i == home => two(a, &["hot-1", "hot-2"]),
                i if i == free => two(a, &["hot-3"]),
                _ => two(a, &["hot-3", "hot-4"]),
            })
            .collect();
        Fleet::new(snap, 1000, vec![], &r.config)
    };
    let free = (home + 1) % 3;
    let s = MemoryStore::new();
    // Requests there take about a second from routing to their last byte.
    for addr in addrs {
        answered_in_a_second(&r, &s, addr);
    }
    let out = go(
        &r,
        &s,
        Some(&fleet_with(free)),
        &chat("sql-lora", "select 1"),
        ctx(1100),
    )
    .unwrap();
    assert_eq!(out.endpoints[0], addrs[free], "{:?}", out.scores);
    // With the home's batch free again, it goes home.
    let mut snap = snapshot();
    snap.pools[0].pods = addrs
        .iter()
        .map(|a| {
            two(
                a,
                if *a == addrs[home] {
                    &["hot-1"]
                } else {
                    &["hot-3", "hot-4"]
                },
            )
        })
        .collect();
    let s = MemoryStore::new();
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let out = go(
        &r,
        &s,
        Some(&fleet),
        &chat("sql-lora", "select 3"),
        ctx(1100),
    )
    .unwrap();
    assert_eq!(out.endpoints[0], addrs[home], "{:?}", out.scores);
}

/// Every pod's batch is full of other adapters; at the home, two more adapters already wait for
/// a slot: the request goes where it is first in line, though both pods are blocked.
#[test]
fn a_blocked_adapter_queues_where_fewest_adapters_wait_for_a_slot() {
    let r = router(CONFIG);
    let addrs = ["10.0.0.1:8000", "10.0.0.2:8000"];
    let home = crate::lora::homes(&["sql-lora".to_string()], &addrs, &[2, 2])["sql-lora"];
    let other = 1 - home;
    let pod_of = |a: &str, waiting: &[&str]| {
        let mut p = lora_pod(a, &["hot-1", "hot-2"]);
        if let Some(l) = p.lora.as_mut() {
            l.max_loras = 2;
            l.waiting = waiting.iter().map(|w| w.to_string()).collect();
        }
        p
    };
    let decide = |home_waiting: &[&str]| {
        let mut snap = snapshot();
        snap.pools[0].pods = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| pod_of(a, if i == home { home_waiting } else { &["hot-1"] }))
            .collect();
        let fleet = Fleet::new(snap, 1000, vec![], &r.config);
        let s = MemoryStore::new();
        for addr in addrs {
            answered_in_a_second(&r, &s, addr);
        }
        go(
            &r,
            &s,
            Some(&fleet),
            &chat("sql-lora", "select 1"),
            ctx(1100),
        )
        .unwrap()
    };
    // Nobody waits for a slot at home: blocked everywhere, it stays home.
    let out = decide(&["hot-2"]);
    assert_eq!(out.endpoints[0], addrs[home], "{:?}", out.scores);
    // Two adapters wait for a slot at home: the other pod frees one for it sooner.
    let out = decide(&["cold-1", "cold-2"]);
    assert_eq!(out.endpoints[0], addrs[other], "{:?}", out.scores);
}

/// A pool of LoRA pods at `addrs` with two batch slots each, pod `i` running `batch(i)`; `v1`:
/// reported as vLLM V1 does (the same adapters in both lists).
fn two_slot_fleet(
    r: &Router,
    addrs: &[&str],
    batch: impl Fn(usize) -> [&'static str; 2],
    v1: bool,
) -> Fleet {
    let mut snap = snapshot();
    snap.pools[0].pods = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut p = lora_pod(a, &batch(i));
            if let Some(l) = p.lora.as_mut() {
                l.max_loras = 2;
                if v1 {
                    l.waiting = l.running.clone();
                }
            }
            p
        })
        .collect();
    Fleet::new(snap, 1000, vec![], &r.config)
}

/// Routes a `sql-lora` request over `fleet` after this proxy has learned that requests at each
/// pod of `addrs` take about a second and has `in_flight[i]` requests (one per name, repeats
/// allowed) in flight at pod `i`.
fn route_sql_lora(r: &Router, fleet: &Fleet, addrs: &[&str], in_flight: &[Vec<&str>]) -> Route {
    let s = MemoryStore::new();
    for (addr, adapters) in addrs.iter().zip(in_flight) {
        answered_in_a_second(r, &s, addr);
        for adapter in adapters {
            inflight::routed(&s, "llama", addr, 0);
            crate::lora::note(&s, "llama", addr, adapter, false);
        }
    }
    go(r, &s, Some(fleet), &chat("sql-lora", "select 1"), ctx(1100)).unwrap()
}

/// Every pod's batch is full of other adapters, nobody waits for a slot; at the home this proxy
/// has three requests in flight for each batch adapter, at the other pod one for one of them:
/// that slot frees first (a busy adapter's slot frees only in a lull of its own traffic).
#[test]
fn a_blocked_adapter_queues_where_a_batch_slot_frees_first() {
    let r = router(CONFIG);
    let addrs = ["10.0.0.1:8000", "10.0.0.2:8000"];
    let home = crate::lora::homes(&["sql-lora".to_string()], &addrs, &[2, 2])["sql-lora"];
    let other = 1 - home;
    let batch = |i: usize| {
        if i == home {
            ["hot-1", "hot-2"]
        } else {
            ["hot-3", "hot-4"]
        }
    };
    let fleet = two_slot_fleet(&r, &addrs, batch, false);
    // Requests there take about a second from routing to their last byte; `counts[i][j]` of
    // this proxy's are in flight for pod `i`'s batch adapter `j`.
    let decide = |counts: [[usize; 2]; 2]| {
        let ours: Vec<Vec<&str>> = (0..2)
            .map(|i| {
                batch(i)
                    .iter()
                    .zip(counts[i])
                    .flat_map(|(a, n)| std::iter::repeat_n(*a, n))
                    .collect()
            })
            .collect();
        route_sql_lora(&r, &fleet, &addrs, &ours)
    };
    let mut counts = [[0; 2]; 2];
    // As busy everywhere: it stays home.
    counts[home] = [1, 1];
    counts[other] = [1, 1];
    let out = decide(counts);
    assert_eq!(out.endpoints[0], addrs[home], "{:?}", out.scores);
    // The home's batch adapters keep their slots busy; one of the other pod's has one request
    // (as many in flight on each pod).
    counts[home] = [3, 3];
    counts[other] = [1, 5];
    let out = decide(counts);
    assert_eq!(out.endpoints[0], addrs[other], "{:?}", out.scores);
}

/// vLLM V1 reports only adapters with a scheduled request (the same names in both of its
/// lists): both pods' batches are full; at the home this proxy also has requests in flight for
/// two adapters the report does not list, which wait there for a slot: the other pod frees one
/// sooner.
#[test]
fn a_blocked_adapter_queues_where_fewest_of_this_proxys_adapters_wait_for_a_slot() {
    let r = router(CONFIG);
    let addrs = ["10.0.0.1:8000", "10.0.0.2:8000"];
    let home = crate::lora::homes(&["sql-lora".to_string()], &addrs, &[2, 2])["sql-lora"];
    let other = 1 - home;
    let fleet = two_slot_fleet(&r, &addrs, |_| ["hot-1", "hot-2"], true);
    let decide = |home_waiters: &[&str]| {
        let ours: Vec<Vec<&str>> = (0..2)
            .map(|i| {
                let mut v = vec!["hot-1", "hot-2"];
                if i == home {
                    v.extend_from_slice(home_waiters);
                }
                v
            })
            .collect();
        route_sql_lora(&r, &fleet, &addrs, &ours)
    };
    // Nobody waits for a slot: blocked everywhere, it stays home.
    let out = decide(&[]);
    assert_eq!(out.endpoints[0], addrs[home], "{:?}", out.scores);
    // Two of this proxy's adapters wait at home, unseen by the engine's report.
    let out = decide(&["cold-1", "cold-2"]);
    assert_eq!(out.endpoints[0], addrs[other], "{:?}", out.scores);
}

#[test]
fn routed_adapters_are_remembered_per_pod() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let out = go(&r, &s, Some(&fleet), &chat("sql-lora", "select"), ctx(1100)).unwrap();
    let recent = crate::lora::read(&s, "llama");
    let counted = |recent: &crate::lora::Recent| -> Vec<(String, u16)> {
        recent
            .of(&out.endpoints[0])
            .iter()
            .map(|r| (r.adapter.clone(), r.in_flight))
            .collect()
    };
    assert_eq!(counted(&recent), [("sql-lora".to_string(), 1)]);
    assert_eq!(out.adapter.as_deref(), Some("sql-lora"));
    // Base-model requests leave no trace.
    go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap();
    assert_eq!(crate::lora::read(&s, "llama"), recent);
    // Its end is counted too.
    r.adapter_ended(&s, "llama", &out.endpoints[0], "sql-lora");
    assert_eq!(
        counted(&crate::lora::read(&s, "llama")),
        [("sql-lora".to_string(), 0)]
    );
}

#[test]
fn no_snapshot_falls_back_or_rejects_as_configured() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let out = go(
        &r,
        &s,
        None,
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(0),
    )
    .unwrap();
    assert_eq!(out.mode, RouteMode::Fallback);
    assert!(out.endpoints.is_empty());
    assert_eq!(out.cluster, "pool_llama");
    let strict = router(&CONFIG.replace(
        "\"stale_after_ms\": 1000",
        "\"stale_after_ms\": 1000, \"on_missing\": \"reject\"",
    ));
    let e = go(
        &strict,
        &s,
        None,
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(0),
    )
    .unwrap_err();
    assert_eq!(e.status, 503);
    // Without a snapshot, models that only a snapshot would name are unknown.
    assert_eq!(
        go(&r, &s, None, &chat("mistral-7b", "hi"), ctx(0))
            .unwrap_err()
            .status,
        404
    );
}

#[test]
fn stale_snapshot_uses_least_inflight_by_default() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    // Our own in-flight: pod 2 (the snapshot's favourite) is busy, pod 1 idle.
    for _ in 0..3 {
        inflight::routed(&s, "llama", "10.0.0.2:8000", 100);
        inflight::routed(&s, "llama", "10.0.0.3:8000", 100);
    }
    let out = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(5000),
    )
    .unwrap();
    assert_eq!(out.mode, RouteMode::LeastInflight);
    assert_eq!(out.endpoints[0], "10.0.0.1:8000");
    // The same moment with a fresh snapshot trusts the metrics (pod 1 has a queue of 3).
    let fresh = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1500),
    )
    .unwrap();
    assert_eq!(fresh.mode, RouteMode::Scored);
    assert_ne!(fresh.endpoints[0], "10.0.0.1:8000");
    for (policy, want) in [("fallback", Ok(RouteMode::Fallback)), ("reject", Err(503))] {
        let r = router(&CONFIG.replace(
            "\"stale_after_ms\": 1000",
            &format!("\"stale_after_ms\": 1000, \"on_stale\": \"{policy}\""),
        ));
        let got = go(
            &r,
            &s,
            Some(&fleet),
            &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
            ctx(5000),
        );
        assert_eq!(got.map(|o| o.mode).map_err(|e| e.status), want, "{policy}");
    }
}

#[test]
fn failing_pods_are_excluded_and_an_empty_pool_is_503() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let mut snap = snapshot();
    snap.pools[0].pods[1].health = Health::Failing;
    let fleet = Fleet::new(snap.clone(), 1000, vec![], &r.config);
    let out = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap();
    assert!(!out.endpoints.contains(&"10.0.0.2:8000".to_string()));
    for p in &mut snap.pools[0].pods {
        p.health = Health::Failing;
    }
    let fleet = Fleet::new(snap.clone(), 1000, vec![], &r.config);
    let e = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap_err();
    assert_eq!((e.status, e.reason), (503, "rejected-no-endpoints"));
    assert!(e.message.contains("failing"));
    snap.pools[0].pods.clear();
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let e = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap_err();
    assert_eq!(e.status, 503);
}

#[test]
fn saturated_pool_sheds_sheddable_requests_with_retry_after() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        p.waiting = 8;
    }
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let body = chat("meta-llama/Llama-3.1-8B-Instruct", "hi");
    let e = go(
        &r,
        &s,
        Some(&fleet),
        &body,
        Context {
            priority: -1,
            ..ctx(1100)
        },
    )
    .unwrap_err();
    assert_eq!((e.status, e.retry_after_s), (429, Some(1)));
    assert!(e.body().starts_with("{\"error\":{"));
    // Rejected requests leave no in-flight trace.
    assert!(inflight::read(&s, "llama").entries.is_empty());
    assert!(go(&r, &s, Some(&fleet), &body, ctx(1100)).is_ok());
}

#[test]
fn held_work_waits_behind_earlier_work_unless_the_pool_would_shed_it() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let body = chat("meta-llama/Llama-3.1-8B-Instruct", "hi");
    let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    let at = |priority| Context {
        priority,
        ..ctx(1100)
    };
    let is_wait = |d: Result<Decision, Rejection>| matches!(d, Ok(Decision::Wait { .. }));
    // A pod with room: placed at once, or held behind work already waiting for the pool.
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let f = Some(&fleet);
    assert!(matches!(
        r.decide(&s, f, &req, at(0), Hold::IfFull),
        Ok(Decision::Routed(_))
    ));
    assert!(is_wait(r.decide(&s, f, &req, at(0), Hold::Behind)));
    assert!(is_wait(r.decide(&s, f, &req, at(-1), Hold::Behind)));
    // A saturated pool: the sheddable request is refused whether or not work waits ahead,
    // the standard and the critical one wait.
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        p.waiting = 8;
    }
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let f = Some(&fleet);
    for hold in [Hold::IfFull, Hold::Behind] {
        let e = r.decide(&s, f, &req, at(-1), hold).unwrap_err();
        assert_eq!(e.status, 429, "{hold:?}");
        assert!(is_wait(r.decide(&s, f, &req, at(0), hold)), "{hold:?}");
        assert!(is_wait(r.decide(&s, f, &req, at(1), hold)), "{hold:?}");
    }
    // Without holding the standard request is placed however full the pods.
    assert!(matches!(
        r.decide(&s, f, &req, at(0), Hold::Never),
        Ok(Decision::Routed(_))
    ));
}

#[test]
fn a_burst_between_snapshots_spreads_over_pods() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        *p = pod(&p.address, 0, 0.2);
    }
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let mut per_pod = std::collections::HashMap::<String, u32>::new();
    for i in 0..30 {
        let out = go(
            &r,
            &s,
            Some(&fleet),
            &chat("meta-llama/Llama-3.1-8B-Instruct", &format!("q{i}")),
            Context {
                tie: i,
                ..ctx(1100)
            },
        )
        .unwrap();
        *per_pod.entry(out.endpoints[0].clone()).or_default() += 1;
    }
    assert_eq!(per_pod.len(), 3, "{per_pod:?}");
    assert!(
        per_pod.values().all(|&n| (8..=12).contains(&n)),
        "{per_pod:?}"
    );
}

#[test]
fn work_other_replicas_sent_counts_before_the_engine_reports_it() {
    // Three idle pods as the last scrape saw them; another gateway replica has just sent two
    // long prompts to the first (the hub's merged tallies): no pick goes there while the others
    // are free, whatever the tie-breaking bits.
    let r = router(CONFIG);
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        *p = pod(&p.address, 0, 0.2);
    }
    snap.pools[0].pods[0].peers = PeerWork {
        in_flight: 2,
        pending_tokens: 6_000,
    };
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let prompt = "a question about a long report ".repeat(60);
    for tie in 0..24 {
        // A fresh store each time: this proxy has nothing in flight.
        let out = go(
            &r,
            &MemoryStore::new(),
            Some(&fleet),
            &chat(
                "meta-llama/Llama-3.1-8B-Instruct",
                &format!("{tie} {prompt}"),
            ),
            Context { tie, ..ctx(1100) },
        )
        .unwrap();
        assert_ne!(
            out.endpoints[0], "10.0.0.1:8000",
            "tie {tie}: {:?}",
            out.scores
        );
    }
}

#[test]
fn conversation_turns_stick_to_the_pod_with_their_prefix() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        *p = pod(&p.address, 0, 0.2);
    }
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let history = "A long shared system prompt about the company's refund policy. ".repeat(40);
    let first = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", &history),
        ctx(1100),
    )
    .unwrap();
    r.finished(&s, "llama", &first.endpoints[0], first.pending_tokens);
    for turn in 0..5 {
        let body = chat(
            "meta-llama/Llama-3.1-8B-Instruct",
            &format!("{history} follow-up question {turn}"),
        );
        let out = go(
            &r,
            &s,
            Some(&fleet),
            &body,
            Context {
                tie: turn,
                ..ctx(1100)
            },
        )
        .unwrap();
        assert_eq!(out.endpoints[0], first.endpoints[0], "turn {turn}");
        assert!(out.prefix_hit, "turn {turn} found its prefix");
        assert!(!out.lora_hit, "no adapter");
        r.finished(&s, "llama", &out.endpoints[0], out.pending_tokens);
    }
    assert!(!first.prefix_hit, "the first turn had nothing cached");
}

#[test]
fn every_candidate_is_scored_for_the_debug_header_only_when_asked() {
    let s = MemoryStore::new();
    let body = chat("meta-llama/Llama-3.1-8B-Instruct", "hi");
    let plain = router(CONFIG);
    let fleet = Fleet::new(snapshot(), 1000, vec![], &plain.config);
    let out = go(&plain, &s, Some(&fleet), &body, ctx(1100)).unwrap();
    assert_eq!(out.scores.len(), 2, "top_k only: {:?}", out.scores);
    let debug = router(&CONFIG.replace(r#""top_k": 2"#, r#""top_k": 2, "debug_scores": true"#));
    let out = go(&debug, &s, Some(&fleet), &body, ctx(1100)).unwrap();
    assert_eq!(out.endpoints.len(), 2, "the endpoints are still top_k");
    assert_eq!(out.scores.len(), 3, "every pod: {:?}", out.scores);
    assert_eq!(out.scores[0].0, out.endpoints[0]);
    assert!(out.scores.windows(2).all(|w| w[0].1 >= w[1].1));
}

#[test]
fn rejections_name_their_pool_and_outcome() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let mut snap = snapshot();
    for p in &mut snap.pools[0].pods {
        p.waiting = 100;
    }
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let shed = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1100),
    )
    .unwrap_err();
    assert_eq!((shed.pool.as_str(), shed.outcome()), ("llama", "shed"));
    let unknown = go(&r, &s, Some(&fleet), &chat("gpt-9", "hi"), ctx(1100)).unwrap_err();
    assert_eq!(
        (unknown.pool.as_str(), unknown.outcome()),
        ("", "unknown_model")
    );
    assert_eq!(Rejection::too_large(1).outcome(), "too_large");
    assert_eq!(Rejection::bad_request("x", "y").outcome(), "bad_request");
    assert_eq!(
        Rejection::no_endpoints("p", "why").outcome(),
        "no_endpoints"
    );
}

#[test]
fn retried_elsewhere_moves_the_count() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    inflight::routed(&s, "llama", "a:1", 40);
    r.moved(&s, "llama", "a:1", "b:2", 40);
    let t = inflight::read(&s, "llama");
    assert_eq!((t.in_flight("a:1"), t.in_flight("b:2")), (0, 1));
    assert_eq!(t.get("b:2").pending_tokens, 40);
}

#[test]
fn baseline_from_the_store_is_used() {
    let s = MemoryStore::new();
    inflight::routed(&s, "llama", "10.0.0.2:8000", 1);
    inflight::snapshot_baseline(&s, "llama");
    let fleet = Fleet::load(&s, snapshot(), 1000, &router(CONFIG).config);
    assert_eq!(fleet.baselines[0].in_flight("10.0.0.2:8000"), 1);
}

#[test]
fn config_errors_name_the_field() {
    let bad = [
        (
            r#"{"pools":[{"name":"a","models":["m"]},{"name":"a"}]}"#,
            "pools[1].name",
        ),
        (
            r#"{"pools":[{"name":"a","models":["m"]},{"name":"b","models":["m"]}]}"#,
            "pools[1].models[0]",
        ),
        (
            r#"{"pools":[{"name":"a","preset":"fast"}]}"#,
            "pools[0].preset",
        ),
        (
            r#"{"pools":[{"name":"a","weights":{"queue":-1}}]}"#,
            "pools[0].weights.queue",
        ),
        (
            r#"{"pools":[{"name":"a","weights":{"ttft":0,"queue":0,"kv_cache":0,"prefix":0,"lora":0,"load":0,"affinity":0}}]}"#,
            "at least one",
        ),
        (
            r#"{"pools":[{"name":"a","weights":{"speed":1}}]}"#,
            "pools[0].weights.speed: unknown scorer",
        ),
        (
            r#"{"pools":[{"name":"a","predict":{"chars_per_token":0}}]}"#,
            "pools[0].predict.chars_per_token",
        ),
        (
            r#"{"pools":[{"name":"a","prefix":{"page_blocks":0}}]}"#,
            "pools[0].prefix.page_blocks",
        ),
        (
            r#"{"retry_after_s":5,"retry_after_max_s":2}"#,
            "retry_after_max_s",
        ),
        (
            r#"{"pools":[{"name":"a","saturation":{"kv_threshold":1.5}}]}"#,
            "kv_threshold",
        ),
        (
            r#"{"pools":[{"name":"a","prefix":{"block_chars":1}}]}"#,
            "block_chars",
        ),
        (
            r#"{"pools":[{"name":"a","colour":"red"}]}"#,
            "unknown field `colour`",
        ),
        (r#"{"top_k":0}"#, "top_k"),
        (r#"{"endpoint_header":"X Bad"}"#, "endpoint_header"),
        (r#"{"snapshot":{"on_stale":"panic"}}"#, "snapshot.on_stale"),
        (r#"{"snapshot":{"push_path":"nope"}}"#, "snapshot.push_path"),
        (r#"{"max_body_bytes":10}"#, "max_body_bytes"),
        (r#"{"pools":"#, "not valid configuration JSON"),
        (r#"[1]"#, "not valid configuration JSON"),
    ];
    for (json, needle) in bad {
        let e = Config::parse(json.as_bytes()).unwrap_err();
        assert!(e.to_string().contains(needle), "{json} → {e}");
    }
    let c = Config::parse(b"").unwrap();
    assert_eq!(c.top_k, 3);
    assert_eq!(c.endpoint_header, "x-gateway-destination-endpoint");
    let c = Config::parse(CONFIG.as_bytes()).unwrap();
    assert_eq!(
        Some(c.pools[1].weights),
        crate::config::Weights::preset("throughput")
    );
    assert_eq!(c.pools[0].cluster, "pool_llama");
}

/// From the `snapshot` fuzz target (its first crash, in the harness): the snapshot format lets a
/// pool list an empty model name. No request can name it (an empty `model` is a 400), and the
/// pool's other models still route.
#[test]
fn a_pool_listing_an_empty_model_name_still_routes_its_models() {
    let bytes: &[u8] = b"LRSN\x01\x00\x00\x00*\x00\x00\x00\x00\x00\x00\x00\xf4i\xe5\xcf\x8b\x01\x00\x00\x01\x00\x05\x00llama\x0a\x00pool_ll\x01\x00\x00\x04\x00\x00\x00\x0c\x00\x00\x00\x01\x07\x10\x00\x00\x00\x00' \x00\x00\x00\x01\x00\x00\x00\x00";
    let mut snap = Snapshot::decode(bytes).unwrap();
    assert!(snap.pools[0].models.iter().any(String::is_empty));
    snap.pools[0].models.push("named".into());
    snap.pools[0].pods = vec![pod("10.0.9.1:8000", 0, 0.1)];
    snap.created_ms = 1000;
    let r = router(r#"{"top_k": 2}"#);
    let fleet = Fleet::new(snap, 1000, vec![], &r.config);
    let s = MemoryStore::new();
    let out = go(&r, &s, Some(&fleet), &chat("named", "hi"), ctx(1100)).unwrap();
    assert_eq!(out.pool, "llama");
    assert_eq!(out.endpoints, ["10.0.9.1:8000"]);
    assert_eq!(
        parse(ApiKind::ChatCompletions, chat("", "hi").as_bytes()),
        Err(crate::request::RequestError::BadModel)
    );
}

/// Four alike pods of `llama`, each running `running` requests by the engines' count, and a
/// baseline table where this proxy had `own` of each pod's running and waiting requests in
/// flight (`None`: all of them, a lone gateway) — and still has: the replica's own store holds
/// the same counts.
fn replica(r: &Router, running: u32, own: Option<u32>, kv: &[f32; 4]) -> (Fleet, MemoryStore) {
    let mut snap = snapshot();
    snap.pools[0].pods = (0..4)
        .map(|i| Pod {
            running,
            ..pod(&format!("10.0.0.{}:8000", i + 1), 0, kv[i])
        })
        .collect();
    let baseline = inflight::Table {
        entries: snap.pools[0]
            .pods
            .iter()
            .map(|p| {
                let load = inflight::PodLoad {
                    in_flight: own.unwrap_or(p.running + p.waiting),
                    ..inflight::PodLoad::default()
                };
                (p.address.clone(), load)
            })
            .collect(),
        ..inflight::Table::default()
    };
    let store = MemoryStore::new();
    store
        .set(&inflight::key("llama"), &baseline.encode(), None)
        .unwrap();
    (Fleet::new(snap, 1000, vec![baseline], &r.config), store)
}

/// A system prompt of ≈ 94 blocks, a long document, then a question: the shape of document
/// Q&A, where the question changes and the document stays.
fn doc_question(doc: usize, question: usize) -> String {
    let system = "You answer questions about the documents you are given. ".repeat(107);
    let document = format!("Document {doc}, paragraph on warehouse logistics. ").repeat(340);
    serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("{document}\n\nQuestion {question}: what does it say?")},
    ]})
    .to_string()
}

/// Routes `body` and ends its stream, so the decision leaves only its prefix record behind.
fn route_and_finish(r: &Router, s: &MemoryStore, fleet: &Fleet, body: &str, tie: u64) -> Route {
    let out = go(r, s, Some(fleet), body, Context { tie, ..ctx(1100) }).unwrap();
    r.finished(s, "llama", &out.endpoints[0], out.pending_tokens);
    out
}

/// Two replicas that each sent `tokens` of prompt since the snapshot, which the other does not
/// know of: replica one to the first two pods, replica two to the last two.
fn busy_apart(one: MemoryStore, two: MemoryStore, tokens: u32) -> (MemoryStore, MemoryStore) {
    for (s, busy) in [(&one, [0, 1]), (&two, [2, 3])] {
        inflight::update(s, "llama", |t| {
            for (i, (_, load)) in t.entries.iter_mut().enumerate() {
                if busy.contains(&i) {
                    load.pending_tokens = tokens;
                }
            }
        });
    }
    (one, two)
}

#[test]
fn replicas_agree_on_a_long_context_neither_has_seen() {
    let r = router(CONFIG);
    // Two replicas, two stores (no shared memory), each with half the pool's traffic: the
    // engines run 4 requests per pod, each replica had 2 of them in flight.
    let (fleet, one) = replica(&r, 4, Some(2), &[0.2; 4]);
    let (_, two) = replica(&r, 4, Some(2), &[0.2; 4]);
    // Since the snapshot each replica has sent prompts the other does not know of: replica one
    // to the first two pods, replica two to the last two. Left to what each sees, they would
    // put every new document on different pods.
    let (one, two) = busy_apart(one, two, 600);
    // Each replica has served the system prompt before (it is the only thing they know).
    for (i, s) in [&one, &two].into_iter().enumerate() {
        route_and_finish(&r, s, &fleet, &doc_question(99, i), 7);
    }
    let mut agreed = 0;
    for doc in 0..8 {
        let first = route_and_finish(&r, &one, &fleet, &doc_question(doc, 1), doc as u64);
        let second = route_and_finish(&r, &two, &fleet, &doc_question(doc, 2), 1000 + doc as u64);
        if first.endpoints[0] == second.endpoints[0] {
            agreed += 1;
        }
    }
    assert_eq!(
        agreed, 8,
        "both replicas expect each document on its anchor's home"
    );
}

/// `fleet` again with `change` made to its snapshot (same baselines).
fn refleet(
    r: &Router,
    fleet: &Fleet,
    s: &MemoryStore,
    change: impl FnOnce(&mut Snapshot),
) -> Fleet {
    let mut snap = fleet.snapshot.clone();
    change(&mut snap);
    let baseline = inflight::read_baseline(s, "llama");
    let baseline = if baseline.entries.is_empty() {
        inflight::read(s, "llama")
    } else {
        baseline
    };
    Fleet::new(snap, 1000, vec![baseline], &r.config)
}

/// A replica whose snapshot shows another replica at work (a peer's request on pod 4), on
/// four alike pods: it places long contexts and notes where.
fn replica_among_others(r: &Router) -> (Fleet, MemoryStore) {
    let (fleet, store) = replica(r, 4, Some(2), &[0.2; 4]);
    let with_peer = refleet(r, &fleet, &store, |snap| {
        snap.pools[0].pods[3].peers = PeerWork {
            in_flight: 1,
            pending_tokens: 0,
        };
    });
    (with_peer, store)
}

/// Long prompts this replica sent to pods 1 and 3 (the even indices) since its snapshot.
fn pending_on_even_pods(store: &MemoryStore) {
    inflight::update(store, "llama", |t| {
        for (i, (_, load)) in t.entries.iter_mut().enumerate() {
            if i % 2 == 0 {
                load.pending_tokens = 40_000;
            }
        }
    });
}

/// How many of `expected.len()` requests (`body(i)`) a second replica sends to `expected[i]`,
/// every pod alike, with `contexts` (another replica's notes, the hub's merge) in its snapshot
/// and `warm` routed first (what it knows of the shared prefix).
fn second_replica_agrees(
    r: &Router,
    contexts: Vec<llm_router_snapshot::PeerContext>,
    warm: &str,
    expected: &[String],
    body: impl Fn(usize) -> String,
) -> usize {
    let (fleet, two) = replica(r, 4, Some(2), &[0.2; 4]);
    let two_fleet = refleet(r, &fleet, &two, |snap| {
        snap.pools[0].peer_contexts = contexts
    });
    route_and_finish(r, &two, &two_fleet, warm, 7);
    (0..expected.len())
        .filter(|&i| {
            let out = route_and_finish(r, &two, &two_fleet, &body(i), 100 + i as u64);
            expected.get(i) == out.endpoints.first()
        })
        .count()
}

#[test]
fn a_context_one_replica_placed_is_found_by_the_others() {
    let r = router(CONFIG);
    // Replica one sees other replicas at work (a peer's request on pod 4): it places new
    // documents by load and by their homes, and notes where.
    let (one_fleet, one) = replica_among_others(&r);
    // Since that snapshot replica one has sent long prompts to pods 1 and 3 that replica two
    // does not know of: it avoids them for a while.
    pending_on_even_pods(&one);
    route_and_finish(&r, &one, &one_fleet, &doc_question(99, 0), 7);
    let placed: Vec<String> = (0..8)
        .map(|doc| route_and_finish(&r, &one, &one_fleet, &doc_question(doc, 1), doc as u64))
        .map(|out| out.endpoints[0].clone())
        .collect();
    let tally = inflight::tally(&one, ["llama"], 1100);
    let contexts = tally.pools[0].contexts.clone();
    // One note per new document (the first request's included).
    assert_eq!(contexts.len(), 9, "{contexts:?}");

    // Replica two, later: every pod alike, the system prompt known, the documents not. With
    // replica one's notes in its snapshot (the hub's merge) it finds each document where it
    // went; with none it can only expect each on its home, and misses those placed by load.
    let agreed = |contexts| {
        second_replica_agrees(&r, contexts, &doc_question(99, 1), &placed, |doc| {
            doc_question(doc, 2)
        })
    };
    assert_eq!(
        agreed(contexts),
        8,
        "where replica one put them: {placed:?}"
    );
    assert!(agreed(Vec::new()) < 8, "by the homes alone: {placed:?}");

    // A replica that sees no others shares nothing (no write per request).
    let (fleet, lone) = replica(&r, 4, None, &[0.6, 0.1, 0.6, 0.6]);
    route_and_finish(&r, &lone, &fleet, &doc_question(99, 0), 7);
    route_and_finish(&r, &lone, &fleet, &doc_question(3, 1), 3);
    let tally = inflight::tally(&lone, ["llama"], 1100);
    assert!(
        tally.pools.iter().all(|p| p.contexts.is_empty()),
        "{tally:?}"
    );
}

#[test]
fn a_second_copy_of_a_context_is_noted_for_the_other_replicas_too() {
    let r = router(CONFIG);
    let (one_fleet, one) = replica_among_others(&r);
    route_and_finish(&r, &one, &one_fleet, &doc_question(99, 0), 7);
    let first = route_and_finish(&r, &one, &one_fleet, &doc_question(5, 1), 5).endpoints[0].clone();
    let notes = |s: &MemoryStore| {
        inflight::tally(s, ["llama"], 1100).pools[0]
            .contexts
            .iter()
            .map(|c| c.pod)
            .collect::<Vec<u32>>()
    };
    let before = notes(&one);
    // The pod holding the document is swamped: the next read of it is copied elsewhere, and
    // the others must learn of that copy as they learned of the first.
    inflight::update(&one, "llama", |t| {
        for (address, load) in t.entries.iter_mut() {
            if *address == first {
                load.pending_tokens = 400_000;
            }
        }
    });
    let second =
        route_and_finish(&r, &one, &one_fleet, &doc_question(5, 2), 55).endpoints[0].clone();
    assert_ne!(second, first, "the swamped holder is avoided");
    let after = notes(&one);
    assert_eq!(after.len(), before.len() + 1, "{before:?} → {after:?}");
    assert_eq!(after.last().copied(), Some(prefix::pod_id(&second)));
    // A read where this replica already made a copy is no new copy: nothing more is noted.
    route_and_finish(&r, &one, &one_fleet, &doc_question(5, 3), 56);
    assert_eq!(notes(&one).len(), after.len());
}

#[test]
fn a_lone_gateway_places_new_contexts_by_load_alone() {
    let r = router(CONFIG);
    // Pod 1 has the most free KV cache. A lone gateway (every request the engines count is its
    // own) puts each new document there; were other replicas sending half the traffic, some
    // documents would go to the pod where those replicas would have put them.
    for (own, expect_all_on_idle) in [(None, true), (Some(0), false)] {
        let (fleet, s) = replica(&r, 4, own, &[0.6, 0.1, 0.6, 0.6]);
        route_and_finish(&r, &s, &fleet, &doc_question(99, 0), 7);
        let on_idle = (0..8)
            .filter(|&doc| {
                let out = route_and_finish(&r, &s, &fleet, &doc_question(doc, 1), doc as u64);
                assert!(
                    own.is_some() || out.work_tokens.is_finite(),
                    "a lone gateway knows"
                );
                out.endpoints[0] == "10.0.0.2:8000"
            })
            .count();
        assert_eq!(
            on_idle == 8,
            expect_all_on_idle,
            "own {own:?}: {on_idle} of 8 on the idle pod"
        );
    }
}

#[test]
fn what_a_replica_knows_outweighs_the_prior() {
    let r = router(CONFIG);
    let (fleet, s) = replica(&r, 4, Some(1), &[0.2; 4]);
    route_and_finish(&r, &s, &fleet, &doc_question(99, 0), 7);
    for doc in 0..8 {
        let first = route_and_finish(&r, &s, &fleet, &doc_question(doc, 1), doc as u64);
        let again = route_and_finish(&r, &s, &fleet, &doc_question(doc, 2), 50 + doc as u64);
        assert_eq!(again.endpoints[0], first.endpoints[0], "document {doc}");
        assert!(again.prefix_hit);
    }
}

/// A prompt that runs past the hashed range (`prefix.max_blocks`) is taken as wholly cached on
/// a pod holding all of that range: nothing pending is counted there, so warm requests queue no
/// phantom prefill and teach no false rate; a pod without it still owes the whole prompt.
#[test]
fn a_prompt_past_the_hashed_range_is_cached_where_all_its_blocks_are() {
    let r = router(CONFIG);
    let (fleet, s) = replica(&r, 4, Some(1), &[0.2; 4]);
    let long = doc_question(3, 0);
    let hashed = r.config.pools[0].prefix.max_blocks * r.config.pools[0].prefix.block_chars;
    assert!(
        long.len() > hashed + 4_000,
        "the document must run well past the hashed range"
    );
    let cold = route_and_finish(&r, &s, &fleet, &long, 1);
    assert!(!cold.prefix_hit && cold.work_tokens.is_finite(), "{cold:?}");
    let tokens_past = (long.len() - hashed) as f64 / 4.0;
    assert!(f64::from(cold.pending_tokens) > tokens_past, "{cold:?}");
    let warm = route_and_finish(&r, &s, &fleet, &doc_question(3, 1), 2);
    assert_eq!(warm.endpoints[0], cold.endpoints[0]);
    assert!(warm.prefix_hit && warm.work_tokens.is_finite(), "{warm:?}");
    assert!(f64::from(warm.pending_tokens) < 100.0, "{warm:?}");
}

/// Turn `turn` of conversation `c`: a shared system prompt, then `turn` exchanges of long
/// messages, then the new question.
fn conversation_turn(c: usize, turn: usize) -> String {
    let mut messages = vec![serde_json::json!({"role": "system",
        "content": "You are the support assistant of a hardware shop. ".repeat(60)})];
    for t in 0..=turn {
        let user = format!("Conversation {c}, question {t} about my order. ").repeat(20);
        messages.push(serde_json::json!({"role": "user", "content": user}));
        if t < turn {
            let reply = format!("Conversation {c}, answer {t}: let me check. ").repeat(20);
            messages.push(serde_json::json!({"role": "assistant", "content": reply}));
        }
    }
    serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": messages})
        .to_string()
}

#[test]
fn replicas_keep_a_conversation_on_one_pod_when_its_turns_alternate() {
    let r = router(CONFIG);
    let (fleet, one) = replica(&r, 4, Some(2), &[0.2; 4]);
    let (_, two) = replica(&r, 4, Some(2), &[0.2; 4]);
    // Each replica has some work of its own in flight that the other does not see.
    let (one, two) = busy_apart(one, two, 100);
    for (i, s) in [&one, &two].into_iter().enumerate() {
        route_and_finish(&r, s, &fleet, &conversation_turn(99, 0), i as u64);
    }
    for c in 0..6 {
        // Turns alternate between the replicas; from turn 1 on, both send it to one pod.
        let pods: Vec<String> = (0..5)
            .map(|turn| {
                let s = if turn % 2 == 0 { &one } else { &two };
                let body = conversation_turn(c, turn);
                route_and_finish(&r, s, &fleet, &body, (10 * c + turn) as u64).endpoints[0].clone()
            })
            .collect();
        assert!(
            pods[1..].iter().all(|p| *p == pods[1]),
            "conversation {c}: {pods:?}"
        );
    }
}

#[test]
fn a_conversation_one_replica_started_is_found_by_the_others() {
    let r = router(CONFIG);
    // Replica one sees other replicas at work and has sent long prompts to pods 1 and 3 since
    // its snapshot: it starts conversations by load, wherever their keys' homes are.
    let (one_fleet, one) = replica_among_others(&r);
    pending_on_even_pods(&one);
    route_and_finish(&r, &one, &one_fleet, &conversation_turn(99, 0), 7);
    let started: Vec<String> = (0..8)
        .map(|c| route_and_finish(&r, &one, &one_fleet, &conversation_turn(c, 0), c as u64))
        .map(|out| out.endpoints[0].clone())
        .collect();
    let contexts = inflight::tally(&one, ["llama"], 1100).pools[0]
        .contexts
        .clone();
    // One note per conversation started (the first request's included), and the system
    // prompt's first copy (a long context's).
    assert_eq!(contexts.len(), 10, "{contexts:?}");

    // Replica two gets each conversation's second turn, knowing only the system prompt. With
    // replica one's notes it sends each where its first turn went; by the keys' homes alone
    // it moves those replica one started by load.
    let followed = |contexts| {
        second_replica_agrees(&r, contexts, &conversation_turn(99, 1), &started, |c| {
            conversation_turn(c, 1)
        })
    };
    assert_eq!(
        followed(contexts),
        8,
        "where replica one started them: {started:?}"
    );
    assert!(followed(Vec::new()) < 8, "by the homes alone: {started:?}");

    // Replica one gets each conversation's third turn, the second having gone (with its note)
    // where the first did, unnoted: knowing only the first turn, it finds the conversation by
    // its own note, not the key's home, now that the load is gone.
    inflight::update(&one, "llama", |t| {
        t.entries
            .iter_mut()
            .for_each(|(_, load)| load.pending_tokens = 0)
    });
    let kept = (0..8)
        .filter(|&c| {
            let out = route_and_finish(&r, &one, &one_fleet, &conversation_turn(c, 2), c as u64);
            out.endpoints[0] == started[c]
        })
        .count();
    assert_eq!(kept, 8, "where replica one started them: {started:?}");

    // A turn that goes where the notes put its conversation writes nothing.
    let (fleet, three) = replica_among_others(&r);
    let notes = inflight::tally(&one, ["llama"], 1100).pools[0]
        .contexts
        .clone();
    let keys: Vec<u64> = notes.iter().map(|c| c.key).collect();
    let three_fleet = refleet(&r, &fleet, &three, |snap| {
        snap.pools[0].peer_contexts = notes
    });
    let out = route_and_finish(&r, &three, &three_fleet, &conversation_turn(2, 1), 3);
    assert_eq!(out.endpoints[0], started[2]);
    let tally = inflight::tally(&three, ["llama"], 1100);
    assert!(
        tally.pools[0]
            .contexts
            .iter()
            .all(|c| !keys.contains(&c.key)),
        "{tally:?}"
    );
}

/// A pod that reports itself the best of the pool but answers every request with a server
/// error: after a run of errors it goes behind the others (Envoy's outlier ejection does not
/// stop `override_host` from sending it what the filter names), then one request probes it.
#[test]
fn a_pod_answering_server_errors_goes_behind_the_others_then_is_probed() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let broken = "10.0.0.2:8000"; // the snapshot's favourite (waiting 0, KV 0.2)
    let mut to_broken = 0;
    for i in 0..100u64 {
        let now = 1100 + i;
        let out = go(
            &r,
            &s,
            Some(&fleet),
            &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
            ctx(now),
        )
        .unwrap();
        let pod = out.endpoints[0].clone();
        let status = if pod == broken { 500 } else { 200 };
        to_broken += usize::from(pod == broken);
        r.finished_with_status(
            &s,
            "llama",
            &pod,
            out.pending_tokens,
            Answer::status(status, now),
        );
    }
    assert_eq!(
        to_broken,
        usize::from(inflight::EJECT_AFTER_ERRORS),
        "the broken pod serves its error run, then nothing"
    );
    let load = inflight::read(&s, "llama").get(broken);
    assert!(load.ejected(1200) && !load.ejected(1200 + inflight::EJECT_MS));
    // Past the window one request probes it; a success ends the run.
    let later = 1200 + inflight::EJECT_MS;
    let fresh = Fleet::new(snapshot(), later - 100, vec![], &r.config);
    let out = go(
        &r,
        &s,
        Some(&fresh),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(later),
    )
    .unwrap();
    assert_eq!(out.endpoints[0], broken);
    r.finished_with_status(
        &s,
        "llama",
        broken,
        out.pending_tokens,
        Answer::status(200, later),
    );
    assert_eq!(inflight::read(&s, "llama").get(broken).errors, 0);
    // Client errors (4xx) are not the pod's fault: no run.
    for _ in 0..10 {
        r.finished_with_status(&s, "llama", broken, 0, Answer::status(404, later));
    }
    assert!(!inflight::read(&s, "llama").get(broken).ejected(later));
}

/// At most half of a pool goes behind the others: when every pod errs, the longest runs do.
#[test]
fn at_most_half_of_a_pool_is_put_behind() {
    let r = router(CONFIG);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    for (pod, n) in [
        ("10.0.0.1:8000", 9u32),
        ("10.0.0.2:8000", 6),
        ("10.0.0.3:8000", 5),
    ] {
        for _ in 0..n {
            inflight::routed(&s, "llama", pod, 0);
            r.finished_with_status(&s, "llama", pod, 0, Answer::status(503, 1100));
        }
    }
    let out = go(
        &r,
        &s,
        Some(&fleet),
        &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
        ctx(1101),
    )
    .unwrap();
    // One of three may be put behind: the longest run (10.0.0.1); the others rank as before.
    assert_eq!(out.endpoints, ["10.0.0.2:8000", "10.0.0.3:8000"]);
}

/// A rewrite rule picks a served name per request: the body's new model, its pool's cluster,
/// and the served name reported; a target that is an alias is served under the alias' rewrite;
/// a name without a rule is untouched.
#[test]
fn a_rewrite_rule_splits_a_model_name_over_its_targets_and_pools() {
    let json = CONFIG.replacen(
        r#""top_k": 2"#,
        r#""top_k": 2, "rewrites": [{"model": "llama", "targets": [
             {"model": "llama-8b", "weight": 90}, {"model": "Qwen/Qwen3-32B", "weight": 10}]}]"#,
        1,
    );
    let r = router(&json);
    let s = MemoryStore::new();
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let mut qwen = 0;
    for i in 0..1_000u64 {
        let c = Context {
            tie: i,
            ..ctx(1100)
        };
        let out = go(&r, &s, Some(&fleet), &chat("llama", "hi"), c).unwrap();
        match out.served_model.as_deref() {
            Some("Qwen/Qwen3-32B") => {
                qwen += 1;
                assert_eq!(out.cluster, "pool_qwen");
                assert_eq!(out.rewrite.as_deref(), Some("Qwen/Qwen3-32B"));
            }
            Some("meta-llama/Llama-3.1-8B-Instruct") => {
                assert_eq!(out.cluster, "pool_llama");
                assert_eq!(
                    out.rewrite.as_deref(),
                    Some("meta-llama/Llama-3.1-8B-Instruct")
                );
            }
            other => panic!("served {other:?}"),
        }
        let pod = out.inflight_pod.unwrap();
        r.finished(&s, &out.pool, &pod, out.pending_tokens);
    }
    assert!(
        (70..=130).contains(&qwen),
        "{qwen} of 1000 to the 10% target"
    );
    let plain = go(&r, &s, Some(&fleet), &chat("llama-8b", "hi"), ctx(1100)).unwrap();
    assert_eq!(plain.served_model, None);
    // A rule naming a model that is not configured otherwise is not a 404.
    assert!(!r.config.models.contains_key("llama"));
}

/// A canary pool declared without `models` serves its target only through the rule: a client
/// naming the target directly gets 404, even with the snapshot reporting the pods that serve it
/// and even while the canary is drained to weight 0; the rule still reaches it.
#[test]
fn a_canary_target_is_reachable_only_through_its_rule() {
    let config = |canary_weight: u32| {
        format!(
            r#"{{
  "pools": [
    {{"name": "llama", "cluster": "pool_llama", "models": ["meta-llama/Llama-3.1-8B-Instruct"]}},
    {{"name": "discovered", "cluster": "pool_discovered"}}
  ],
  "rewrites": [{{"model": "llama", "targets": [
    {{"model": "meta-llama/Llama-3.1-8B-Instruct", "weight": {stable}}},
    {{"model": "mistral-7b", "pool": "discovered", "weight": {canary_weight}}}]}}],
  "snapshot": {{"secret": "router-test-secret-0123456789abcdef", "stale_after_ms": 1000}}
}}"#,
            stable = 100 - canary_weight
        )
    };
    for weight in [0, 100] {
        let r = router(&config(weight));
        let s = MemoryStore::new();
        let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
        let e = go(&r, &s, Some(&fleet), &chat("mistral-7b", "hi"), ctx(1100)).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (404, "model_not_found"),
            "weight {weight}"
        );
        let stable = go(
            &r,
            &s,
            Some(&fleet),
            &chat("meta-llama/Llama-3.1-8B-Instruct", "hi"),
            ctx(1100),
        )
        .unwrap();
        assert_eq!(stable.cluster, "pool_llama");
        let via_rule = go(&r, &s, Some(&fleet), &chat("llama", "hi"), ctx(1100)).unwrap();
        let want = if weight == 0 {
            "pool_llama"
        } else {
            "pool_discovered"
        };
        assert_eq!(via_rule.cluster, want, "weight {weight}");
    }
}

/// The snapshot's canary rule with weights `(stable, canary)`: "llama" → the configured
/// base model and the "discovered" pool's model, and a second rule whose target no
/// configured pool serves.
fn snapshot_with_rules(stable: u32, canary: u32) -> Snapshot {
    use llm_router_snapshot::{RewriteRule, RewriteSticky, RewriteTarget};
    let target = |model: &str, weight| RewriteTarget {
        model: model.into(),
        weight,
    };
    Snapshot {
        rewrites: Some(vec![
            RewriteRule {
                model: "llama".into(),
                sticky: RewriteSticky::None,
                targets: vec![
                    target("meta-llama/Llama-3.1-8B-Instruct", stable),
                    target("mistral-7b", canary),
                ],
            },
            RewriteRule {
                model: "typo".into(),
                sticky: RewriteSticky::Conversation,
                targets: vec![target("no-such-model", 1)],
            },
        ]),
        ..snapshot()
    }
}

/// CONFIG with the "discovered" pool configured (no models: the canary's served name is the
/// snapshot's) and a configured rule the snapshot's rules replace.
fn config_with_a_rule() -> String {
    CONFIG.replacen(
        r#""top_k": 2"#,
        r#""top_k": 2, "rewrites": [{"model": "llama", "targets": [{"model": "Qwen/Qwen3-32B"}]}]"#,
        1,
    )
    .replacen(
        r#"{"name": "qwen","#,
        r#"{"name": "discovered", "cluster": "pool_discovered"}, {"name": "qwen","#,
        1,
    )
}

/// A snapshot's rewrites section replaces the configured rules, resolved once with the fleet:
/// the weight change of a canary is a new snapshot, not a new configuration.
#[test]
fn the_snapshot_rules_replace_the_configured_ones_and_follow_their_weights() {
    let r = router(&config_with_a_rule());
    let s = MemoryStore::new();
    // Without a section: the configured rule.
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    assert!(fleet.rewrites.is_none());
    let out = go(&r, &s, Some(&fleet), &chat("llama", "hi"), ctx(1100)).unwrap();
    assert_eq!(out.served_model.as_deref(), Some("Qwen/Qwen3-32B"));
    // No snapshot at all: still the configured rule.
    assert_eq!(r.rewrites(None), &r.config.rewrites);
    for (stable, canary, want) in [
        (100, 0, "pool_llama"),
        (0, 100, "pool_discovered"),
        (100, 0, "pool_llama"),
    ] {
        let fleet = Fleet::new(snapshot_with_rules(stable, canary), 1000, vec![], &r.config);
        for tie in 0..50 {
            let c = Context { tie, ..ctx(1100) };
            let out = go(&r, &s, Some(&fleet), &chat("llama", "hi"), c).unwrap();
            assert_eq!(out.cluster, want, "{stable}/{canary}");
            r.finished(
                &s,
                &out.pool,
                &out.inflight_pod.unwrap(),
                out.pending_tokens,
            );
        }
    }
}

/// A snapshot rule whose target no configured pool serves is dropped when the fleet is built,
/// naming the rule and the target; the others apply; the dropped rule's model is then simply
/// not rewritten (here: not a model at all, 404), never a panic.
#[test]
fn a_snapshot_rule_that_does_not_resolve_is_dropped_and_named() {
    let r = router(&config_with_a_rule());
    let fleet = Fleet::new(snapshot_with_rules(0, 100), 1000, vec![], &r.config);
    let rules = fleet.rewrites.as_ref().unwrap();
    assert_eq!(rules.rules.len(), 1);
    assert_eq!(rules.rules[0].model, "llama");
    assert_eq!(
        rules.rules[0].salt,
        crate::rewrite::sticky_salt("router-test-secret-0123456789abcdef")
    );
    assert_eq!(fleet.dropped_rewrites.len(), 1);
    let dropped = &fleet.dropped_rewrites[0];
    assert_eq!(dropped.model, "typo");
    assert!(
        dropped.reason.contains("\"typo\"") && dropped.reason.contains("\"no-such-model\""),
        "{}",
        dropped.reason
    );
    // The reason says where the rule came from: the snapshot (a configured rule is never
    // dropped: it refuses the configuration, naming `rewrites[i]`, config/tests.rs).
    assert!(
        dropped
            .reason
            .starts_with("snapshot rewrite \"typo\".targets[0].model: \"no-such-model\""),
        "{}",
        dropped.reason
    );
    let s = MemoryStore::new();
    let e = go(&r, &s, Some(&fleet), &chat("typo", "hi"), ctx(1100)).unwrap_err();
    assert_eq!(e.status, 404);
    // Weights are checked as configured ones are: all zero, or above the maximum, drops.
    for weights in [(0, 0), (crate::config::MAX_REWRITE_WEIGHT + 1, 1)] {
        let fleet = Fleet::new(
            snapshot_with_rules(weights.0, weights.1),
            1000,
            vec![],
            &r.config,
        );
        assert!(fleet.rewrites.as_ref().unwrap().rule("llama").is_none());
        assert_eq!(fleet.dropped_rewrites.len(), 2, "{weights:?}");
    }
    // An empty section: no rule in force, the configured one included.
    let empty = Snapshot {
        rewrites: Some(vec![]),
        ..snapshot()
    };
    let fleet = Fleet::new(empty, 1000, vec![], &r.config);
    assert!(r.rewrites(Some(&fleet)).is_empty());
}

/// A snapshot's objectives section replaces the configured `objectives` whole (an objective
/// only the configuration lists is standard then); without the section, or without a
/// snapshot, the configured map applies; an explicit priority header still wins; nothing is
/// read where client headers are not trusted.
#[test]
fn the_snapshot_objectives_replace_the_configured_ones() {
    use llm_router_snapshot::Objective;
    let trusted = CONFIG.replacen(
        r#""top_k": 2"#,
        r#""top_k": 2, "priority": {"trust_headers": true}, "objectives": {"batch": -1, "vip": 1}"#,
        1,
    );
    let r = router(&trusted);
    let with = |list: Option<Vec<Objective>>| {
        Fleet::new(
            Snapshot {
                objectives: list,
                ..snapshot()
            },
            1000,
            vec![],
            &r.config,
        )
    };
    let none = with(None);
    let listed = with(Some(vec![
        Objective {
            name: "batch".into(),
            priority: 5,
        },
        Objective {
            name: "bulk".into(),
            priority: -3,
        },
    ]));
    let empty = with(Some(vec![]));
    let p = |fleet: Option<&Fleet>, priority: Option<&str>, objective: &str| {
        r.request_priority(fleet, priority, Some(objective))
    };
    assert_eq!(p(None, None, "batch"), -1);
    assert_eq!(p(Some(&none), None, "batch"), -1);
    assert_eq!(p(Some(&none), None, "vip"), 1);
    assert_eq!(p(Some(&listed), None, "batch"), 5);
    assert_eq!(p(Some(&listed), None, "bulk"), -3);
    assert_eq!(
        p(Some(&listed), None, "vip"),
        0,
        "configured only: replaced"
    );
    assert_eq!(
        p(Some(&listed), Some("2"), "bulk"),
        2,
        "the priority header wins"
    );
    assert_eq!(p(Some(&empty), None, "batch"), 0);
    let untrusted = router(&CONFIG.replacen(
        r#""top_k": 2"#,
        r#""top_k": 2, "objectives": {"batch": -1}"#,
        1,
    ));
    assert_eq!(
        untrusted.request_priority(Some(&listed), None, Some("bulk")),
        0
    );
    assert_eq!(untrusted.request_priority(None, None, Some("batch")), 0);
}

/// The next snapshot with the same rules and pools reuses the resolution (a sidecar repeats
/// the rules every 50 ms); a weight change resolves again.
#[test]
fn the_rules_are_resolved_once_per_change() {
    let r = router(&config_with_a_rule());
    let first = Fleet::new(snapshot_with_rules(100, 0), 1000, vec![], &r.config);
    let next = Fleet::new_after(
        snapshot_with_rules(100, 0),
        1050,
        vec![],
        &r.config,
        Some(&first),
    );
    assert_eq!(next.rewrites, first.rewrites);
    let changed = Fleet::new_after(
        snapshot_with_rules(0, 100),
        1100,
        vec![],
        &r.config,
        Some(&next),
    );
    let weights: Vec<u32> = changed.rewrites.as_ref().unwrap().rules[0]
        .targets
        .iter()
        .map(|t| t.weight)
        .collect();
    assert_eq!(weights, [0, 100]);
}

/// With no pool in the configuration (pools come from the snapshot alone), a request before
/// the first snapshot is 503 with `retry-after` (the model may be a pool's the snapshot will
/// bring), not 404; once the snapshot arrives its models route and an unknown one is 404.
/// With configured pools an unknown model stays 404 before any snapshot.
#[test]
fn without_configured_pools_a_request_before_the_first_snapshot_is_503_not_404() {
    let r = router(r#"{"top_k": 2}"#);
    let s = MemoryStore::new();
    let before = go(&r, &s, None, &chat("mistral-7b", "hi"), ctx(1000)).unwrap_err();
    assert_eq!((before.status, before.code), (503, "no_endpoints"));
    assert_eq!(before.retry_after_s, Some(1));
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    let out = go(&r, &s, Some(&fleet), &chat("mistral-7b", "hi"), ctx(1100)).unwrap();
    assert_eq!(out.cluster, "pool_discovered");
    let unknown = go(&r, &s, Some(&fleet), &chat("nope", "hi"), ctx(1100)).unwrap_err();
    assert_eq!(unknown.status, 404);
    let configured = router(CONFIG);
    let unknown = go(&configured, &s, None, &chat("nope", "hi"), ctx(1000)).unwrap_err();
    assert_eq!(unknown.status, 404);
}

/// The configured pools checked against the snapshot's once per snapshot: none when they
/// agree (or nothing is configured); a configured pool the snapshot lacks and a cluster the
/// two name differently, each with the names involved.
#[test]
fn pools_the_configuration_and_the_snapshot_disagree_on_are_named() {
    use super::fleet::pool_mismatches;
    assert!(pool_mismatches(&snapshot(), &router(CONFIG).config).is_empty());
    assert!(pool_mismatches(&snapshot(), &router(r#"{"top_k": 2}"#).config).is_empty());
    let odd = CONFIG
        .replacen(r#""cluster": "pool_qwen""#, r#""cluster": "qwen_v2""#, 1)
        .replacen(
            r#""pools": ["#,
            r#""pools": [{"name": "ghost", "cluster": "pool_ghost"},"#,
            1,
        );
    let r = router(&odd);
    let m = pool_mismatches(&snapshot(), &r.config);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m[0].contains("\"ghost\"")
            && m[0].contains("\"pool_ghost\"")
            && m[0].contains("\"discovered\""),
        "{m:?}"
    );
    assert!(
        m[1].contains("\"qwen\"") && m[1].contains("\"qwen_v2\"") && m[1].contains("\"pool_qwen\""),
        "{m:?}"
    );
    let fleet = Fleet::new(snapshot(), 1000, vec![], &r.config);
    assert_eq!(fleet.pool_mismatches, m);
}
