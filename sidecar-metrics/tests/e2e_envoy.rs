//! The sidecar with the real Envoy and the real filter `.wasm`, scraping two model-sim pods:
//! a pod made busy (`/admin/metrics_override`) reaches the filter within a couple of scrape rounds
//! and the filter's choice moves to the other pod; a pod that stops answering is marked failing
//! and avoided (the filter's own endpoint header names the other pod first); a sidecar with the
//! wrong secret is refused (403) and changes nothing, and one pushing to the public listener
//! instead of the internal one gets 404 and changes nothing.
//!
//! Needs Envoy (`./build.sh setup`), the filter `.wasm` and `target/release/model-sim`
//! (`./build.sh`): skipped with a message when missing, failed when `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::{ChildGuard, EnvoyProcess, EnvoySpec, Router};

const BIN: &str = env!("CARGO_BIN_EXE_sidecar-metrics");
const SECRET: &str = "e2e-sidecar-secret-0123456789abcdef";
const MODEL: &str = "llama-model";
const STATE: &str = "/__llm_router/state";
const LIMIT: Duration = Duration::from_secs(20);

/// True when everything the test needs is there; otherwise says what is missing (and fails in CI).
fn prerequisites() -> bool {
    let missing: Vec<String> = [
        testkit::envoy_binary().err().map(|e| e.to_string()),
        testkit::filter_wasm().err().map(|e| e.to_string()),
        testkit::bin("model-sim").err().map(|e| e.to_string()),
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
    eprintln!("SKIPPED e2e_envoy: {missing:?}");
    false
}

async fn state(envoy: &EnvoyProcess) -> Value {
    let r = testkit::get(envoy.push_addr(), STATE, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

fn pod(s: &Value, addr: SocketAddr) -> Option<&Value> {
    s["pools"][0]["pods"]
        .as_array()?
        .iter()
        .find(|p| p["address"] == json!(addr.to_string()))
}

/// Polls the filter's state until `pred` holds (bounded); returns it.
async fn wait_state(envoy: &EnvoyProcess, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = state(envoy).await;
        if pred(&s) {
            return s;
        }
        assert!(
            start.elapsed() < LIMIT,
            "timed out waiting for {what}; state: {s:#}\n{}",
            envoy.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Scrape rounds the sidecar has finished (its own /metrics).
async fn rounds(face: SocketAddr) -> u64 {
    let (status, body) = common::http_get(face, "/metrics").await;
    assert_eq!(status, 200);
    let (samples, _) = sidecar_metrics::prom::parse_all(&body);
    samples
        .iter()
        .find(|s| s.name == "llm_router_sidecar_scrape_rounds_total")
        .map(|s| s.value as u64)
        .unwrap_or(0)
}

/// Sends one chat request; returns the pod that served it.
async fn served(envoy: &EnvoyProcess, i: usize) -> String {
    let body = json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": format!("hello {i}")}]});
    common::served_by(envoy.listen_addr, &body).await
}

async fn override_metrics(pod: SocketAddr, body: Value) {
    let r = testkit::post_json(pod, "/admin/metrics_override", &[], &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_steers_the_filter_in_a_real_envoy() {
    if !prerequisites() {
        return;
    }
    let sim = ["--profile", "h100", "--speedup", "50", "--model", MODEL];
    let a = testkit::start_model_sim(&sim).await.unwrap();
    let mut b = testkit::start_model_sim(&sim).await.unwrap();
    let (pa, pb) = (a.addr, b.addr);
    let envoy = EnvoySpec::new(Router::Filter)
        .pool("llama", "pool_llama", vec![pa, pb])
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": [MODEL]}],
            "snapshot": {"secret": SECRET, "stale_after_ms": 3000}
        }))
        .start()
        .await
        .unwrap();

    let face: SocketAddr = format!("127.0.0.1:{}", testkit::free_port().unwrap())
        .parse()
        .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args([
        "run",
        "--push",
        &format!("http://{}", envoy.push_addr()),
        "--secret",
        SECRET,
    ])
    .args([
        "--pool",
        &format!("name=llama,cluster=pool_llama,models={MODEL},endpoints={pa}+{pb}"),
    ])
    // Every pod every round: the duty bound (`scrape.max_duty`, its own tests) would space a
    // pod's scrapes by 50× their duration, which on a loaded machine passes a round or two,
    // and the count of rounds below is this test's measure.
    .args([
        "--interval-ms",
        "50",
        "--max-duty",
        "0",
        "--listen",
        &face.to_string(),
    ]);
    let sidecar = ChildGuard::spawn("sidecar-metrics", cmd).unwrap();

    let ok = |s: &Value, p: SocketAddr| pod(s, p).is_some_and(|p| p["health"] == json!("ok"));
    wait_state(&envoy, "both pods ok", |s| ok(s, pa) && ok(s, pb)).await;

    // Pod A gets busy: the filter hears of it within a few scrape rounds and picks B.
    let before = rounds(face).await;
    override_metrics(pa, json!({"waiting": 40, "running": 16, "kv_usage": 0.97})).await;
    // Count rounds just before each look at the filter's state, so the count taken with the
    // first state that shows the change is not inflated by the time the look itself takes.
    let start = Instant::now();
    let took = loop {
        let r = rounds(face).await;
        let s = state(&envoy).await;
        if pod(&s, pa).is_some_and(|p| p["waiting"] == json!(40)) {
            break r - before;
        }
        assert!(
            start.elapsed() < LIMIT,
            "pod A's load never reached the filter: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    eprintln!("pod A's new load reached the filter after {took} scrape round(s)");
    // Two scrape intervals, plus the round in flight when the override landed.
    assert!(
        took <= 3,
        "the change took {took} scrape rounds to reach the filter"
    );
    for i in 0..8 {
        assert_eq!(
            served(&envoy, i).await,
            pb.to_string(),
            "request {i} was not steered away from the busy pod"
        );
    }

    // The other way round: B busy, A idle again.
    override_metrics(pa, json!({})).await;
    override_metrics(pb, json!({"waiting": 40, "running": 16, "kv_usage": 0.97})).await;
    wait_state(&envoy, "B busy, A idle", |s| {
        pod(s, pa).is_some_and(|p| p["waiting"] == json!(0))
            && pod(s, pb).is_some_and(|p| p["waiting"] == json!(40))
    })
    .await;
    for i in 0..8 {
        assert_eq!(served(&envoy, 100 + i).await, pa.to_string());
    }

    // B is idle again but stops answering altogether: marked failing, then avoided by the filter
    // itself (its endpoint header names A first; Envoy did not have to retry).
    override_metrics(pb, json!({})).await;
    wait_state(&envoy, "B idle", |s| {
        pod(s, pb).is_some_and(|p| p["waiting"] == json!(0))
    })
    .await;
    b.guard.stop();
    wait_state(&envoy, "B failing", |s| {
        pod(s, pb).is_some_and(|p| p["health"] == json!("failing"))
    })
    .await;
    let logged = envoy.access_log().len();
    for i in 0..8 {
        assert_eq!(served(&envoy, 200 + i).await, pa.to_string());
    }
    let entries = envoy.wait_access_log(logged + 8, LIMIT).unwrap();
    for e in entries
        .iter()
        .skip(logged)
        .filter(|e| e.path == "/v1/chat/completions")
    {
        assert!(
            e.endpoint_header.starts_with(&pa.to_string()),
            "filter still picked the dead pod first: {e:?}"
        );
    }

    // A sidecar with the wrong secret is refused, one pushing to the public listener finds no
    // endpoint; neither changes anything.
    for (target, secret, result) in [
        (
            envoy.push_addr(),
            "wrong-secret-0123456789abcdef-012345",
            "forbidden",
        ),
        (envoy.listen_addr, SECRET, "not_found"),
    ] {
        let mut cfg = common::config(
            target,
            sidecar_metrics::config::Discovery::Static(vec![pa.to_string()]),
            50,
            1000,
        );
        cfg.pools[0].name = "intruder".into();
        let intruder = sidecar_metrics::sidecar::start(cfg, secret.into())
            .await
            .unwrap();
        let start = Instant::now();
        while intruder
            .stats
            .summary()
            .pushes
            .get(result)
            .copied()
            .unwrap_or(0)
            < 2
        {
            assert!(
                start.elapsed() < LIMIT,
                "the {result} sidecar was never refused: {:?}",
                intruder.stats.summary()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let sum = intruder.stats.summary();
        assert_eq!(sum.pushes.get("accepted"), None, "{sum:?}");
        intruder.stop().await;
    }
    let s = state(&envoy).await;
    assert!(
        s["pools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["name"] != json!("intruder")),
        "{s:#}"
    );
    let (status, body) = common::http_get(face, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("llm_router_sidecar_pushes_total{result=\"forbidden\"} 0"),
        "{body}"
    );
    drop(sidecar);
}
