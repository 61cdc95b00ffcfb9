//! Big fleets through a real Envoy and the real filter `.wasm`: 64 emulated vLLM pods reporting
//! 1,000 LoRA adapters each (names of realistic length) give a ~2.4 MB snapshot that is pushed
//! whole and applied (the filter's state lists every pod and its adapters); the same pods
//! reporting the worst the format allows (2 × 1024 names of 200 bytes, ~0.4 MB each, 26 MB in
//! all) give a snapshot trimmed to the budget, pushed and applied — never a 413 from the
//! internal listener (`testkit::INTERNAL_BUFFER_LIMIT_BYTES`, the shipped configs' value).
//!
//! Needs Envoy (`./build.sh setup`) and the filter `.wasm`: skipped with a message when missing,
//! failed when `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sidecar_metrics::config::Discovery;
use sidecar_metrics::sidecar::{self, Running};
use testkit::{EnvoyProcess, EnvoySpec, Router};

const PODS: usize = 64;
const LIMIT: Duration = Duration::from_secs(30);

fn prerequisites() -> bool {
    let missing: Vec<String> = [
        testkit::envoy_binary().err().map(|e| e.to_string()),
        testkit::filter_wasm().err().map(|e| e.to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("e2e prerequisites missing: {missing:?}");
    }
    eprintln!("SKIPPED e2e_budget: {missing:?}");
    false
}

async fn state(envoy: &EnvoyProcess) -> Value {
    let r = testkit::get(envoy.push_addr(), "/__llm_router/state", &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

/// Waits (bounded) until the filter holds a snapshot newer than `after` from this sidecar in
/// which every pod lists `running` adapters as `ok_running` finds; returns the state. Fails at once on a 413.
async fn wait_applied(
    envoy: &EnvoyProcess,
    running: &Running,
    after: u64,
    ok_running: impl Fn(usize) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let sum = running.stats.summary();
        assert_eq!(
            sum.pushes.get("too_large"),
            None,
            "the proxy refused a push with 413: {sum:?}\n{}",
            envoy.log_tail(20)
        );
        if sum.last_accepted_generation > after {
            let s = state(envoy).await;
            let pods = s["pools"][0]["pods"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let all = pods.len() == PODS
                && pods.iter().all(|p| {
                    p["lora_running"]
                        .as_array()
                        .is_some_and(|l| ok_running(l.len()))
                });
            if s["generation"].as_u64() > Some(after) && all {
                return s;
            }
        }
        assert!(
            start.elapsed() < LIMIT,
            "no snapshot applied: {sum:?}\n{}",
            envoy.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Value of one of the sidecar's own series.
async fn own_metric(face: SocketAddr, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (status, text) = http_get(face, "/metrics").await;
    assert_eq!(status, 200);
    let (samples, _) = sidecar_metrics::prom::parse_all(&text);
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.label(k).as_deref() == Some(*v))
        })
        .map(|s| s.value)
}

fn set_adapters(fleet: &FakeFleet, running: usize, waiting: usize, len: usize) {
    for (i, a) in fleet.addrs.iter().enumerate() {
        let text = vllm_lora_text(
            &adapter_names(&format!("p{i:02}r"), running, len),
            &adapter_names(&format!("p{i:02}w"), waiting, len),
        );
        fleet.set(*a, Answer::Text(text));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_adapters_on_64_pods_reach_the_filter_and_worse_is_trimmed_not_refused() {
    if !prerequisites() {
        return;
    }
    let t = Instant::now();
    let fleet = FakeFleet::start(PODS, Answer::Text(vllm_text(0, 0, 0.1))).await;
    // Realistic: 600 running + 400 waiting adapters per pod, 36-byte names.
    set_adapters(&fleet, 600, 400, 36);
    let envoy = EnvoySpec::new(Router::Filter)
        .pool("llama", "pool_llama", fleet.addrs.clone())
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": ["m1"]}],
            "snapshot": {"secret": SECRET, "stale_after_ms": 5000}
        }))
        .start()
        .await
        .unwrap();
    eprintln!("envoy up after {:?}", t.elapsed());
    let mut cfg = config(
        envoy.push_addr(),
        Discovery::Static(fleet.endpoints()),
        200,
        1000,
    );
    cfg.push.timeout_ms = 5000;
    cfg.scrape.timeout_ms = 2000;
    let running = sidecar::start(cfg, SECRET.into()).await.unwrap();

    let t = Instant::now();
    let s = wait_applied(&envoy, &running, 0, |n| n == 600).await;
    eprintln!("applied after {:?}", t.elapsed());
    let pods = s["pools"][0]["pods"].as_array().unwrap();
    for p in pods {
        assert_eq!(
            p["lora_running"].as_array().map(Vec::len),
            Some(600),
            "{}",
            p["address"]
        );
    }
    let face = running.face_addr;
    let bytes = own_metric(face, "llm_router_sidecar_snapshot_bytes", &[])
        .await
        .unwrap();
    eprintln!("64 pods × 1,000 adapters of 36 bytes: {bytes} bytes pushed whole");
    assert!(bytes > 2_000_000.0, "{bytes}");
    for (b, l) in [
        ("pod", "waiting"),
        ("total", "waiting"),
        ("total", "running"),
    ] {
        assert_eq!(
            own_metric(
                face,
                "llm_router_sidecar_snapshot_adapters_dropped_total",
                &[("budget", b), ("list", l)]
            )
            .await,
            Some(0.0),
            "{b}/{l}"
        );
    }

    // The worst the format allows on every pod: trimmed to the budgets, pushed, applied.
    let before = running.stats.summary().last_accepted_generation;
    set_adapters(&fleet, 1024, 1024, 200);
    let t = Instant::now();
    let s = wait_applied(&envoy, &running, before, |n| n != 600 && n > 0).await;
    eprintln!("trimmed snapshot applied after {:?}", t.elapsed());
    let bytes = own_metric(face, "llm_router_sidecar_snapshot_bytes", &[])
        .await
        .unwrap();
    eprintln!("64 pods × 2,048 adapters of 200 bytes: trimmed to {bytes} bytes");
    assert!(bytes <= f64::from(testkit::INTERNAL_BUFFER_LIMIT_BYTES));
    let pods = s["pools"][0]["pods"].as_array().unwrap();
    let kept: Vec<usize> = pods
        .iter()
        .map(|p| p["lora_running"].as_array().map_or(0, Vec::len))
        .collect();
    // 64 KiB per pod: ~325 running names of 201 bytes, the waiting ones all dropped.
    assert!(kept.iter().all(|k| (300..1024).contains(k)), "{kept:?}");
    let dropped_waiting = own_metric(
        face,
        "llm_router_sidecar_snapshot_adapters_trimmed",
        &[("budget", "pod"), ("list", "waiting")],
    )
    .await
    .unwrap();
    assert_eq!(dropped_waiting, (PODS * 1024) as f64);
    let sum = running.stats.summary();
    eprintln!("{sum:?}");
    assert_eq!(sum.pushes.get("too_large"), None, "{sum:?}");
    assert_eq!(sum.pushes.get("forbidden"), None, "{sum:?}");
    running.stop().await;
}
