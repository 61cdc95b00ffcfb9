//! The gateway under faults, end to end: a real Envoy with the real `.wasm` and the route retry
//! policy of `envoy/envoy.yaml` (testkit renders the same), model-sim pods (their `/admin/fault`
//! switch makes them refuse, die, answer 503/429 or hang), and the real `sidecar-metrics` where
//! the test is about it.
//!
//! - A pod that refuses connections while the snapshot still ranks it first: requests are
//!   retried on the next address of the filter's list and succeed; after the sidecar's next
//!   scrape the pod is no longer chosen.
//! - A stream already started when its pod dies, or that the pod cuts: the client sees the
//!   stream end at once, incomplete (no `[DONE]`), instead of hanging.
//! - 503 is retried on the next pod, 429 passed on to the client, a pod that hangs is abandoned
//!   after the per-try idle timeout and the request retried.
//! - The sidecar stops (routing goes on, also once the snapshot is stale), restarts (its new
//!   snapshot is used), pushes garbage (refused; routing goes on).
//! - A client that hangs up mid-stream leaves no in-flight count behind.
//!
//! Needs Envoy, the filter `.wasm`, `model-sim` and `sidecar-metrics` (`./build.sh`): skipped
//! with a message when missing, failed when `CI` is set.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llm_router_snapshot::{Engine, Health, Pod, Pool, Snapshot};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::stack::fleet::{FleetSpec, PodSpec, MODEL};
use testkit::stack::{self, Pods, RouterKind, CLUSTER, POOL, SECRET};
use testkit::{AccessLogEntry, EnvoyProcess, HttpResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PUSH: &str = "/__llm_router/snapshot";
const STATE: &str = "/__llm_router/state";
/// Bound of every wait in these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// model-sim pods (H100 profile) at `speedup`, and Envoy with the filter in front of them,
/// its per-try idle timeout set to `idle`.
async fn start(n: usize, speedup: f64, idle: Duration) -> (Pods, EnvoyProcess) {
    let fleet = FleetSpec {
        pods: vec![PodSpec::new("h100"); n],
        speedup,
        seed: 7,
        engine: Default::default(),
        admission: None,
    };
    let pods = stack::start_pods(&fleet, &[]).await.unwrap();
    let mut spec = stack::envoy_spec(
        RouterKind::Filter,
        &fleet,
        &pods.addrs,
        &[],
        &serde_json::Value::Null,
    );
    spec.name = "e2e-faults".into();
    spec.per_try_idle_timeout = idle;
    let envoy = spec.start().await.unwrap();
    (pods, envoy)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A snapshot of the pool whose pods have these queue lengths (the shortest is ranked first).
fn snapshot(pods: &[(SocketAddr, u32)]) -> Snapshot {
    Snapshot {
        rewrites: None,
        objectives: None,
        // Below any generation the sidecar uses (the Unix time in ms at its start).
        generation: now_ms() / 2,
        created_ms: now_ms(),
        pools: vec![Pool {
            name: POOL.into(),
            cluster: CLUSTER.into(),
            models: vec![MODEL.into()],
            pods: pods
                .iter()
                .map(|(a, waiting)| Pod {
                    address: a.to_string(),
                    engine: Engine::Vllm,
                    health: Health::Ok,
                    waiting: *waiting,
                    running: 1,
                    kv_usage: Some(0.1),
                    block_size: 16,
                    num_blocks: 2000,
                    ..Pod::default()
                })
                .collect(),
            peer_contexts: Vec::new(),
        }],
    }
}

/// Pushes `bytes` signed with the stack's secret to the internal listener.
async fn push_bytes(envoy: &EnvoyProcess, bytes: Vec<u8>) -> HttpResponse {
    let sig = llm_router_snapshot::sign(SECRET.as_bytes(), &bytes);
    testkit::post_bytes(
        envoy.push_addr(),
        PUSH,
        &[(llm_router_snapshot::SIGNATURE_HEADER, &sig)],
        bytes,
    )
    .await
    .unwrap()
}

async fn push_ok(envoy: &EnvoyProcess, snap: &Snapshot) {
    let r = push_bytes(envoy, snap.encode().unwrap()).await;
    assert_eq!(r.status, 200, "push refused: {}", r.text());
}

async fn state(envoy: &EnvoyProcess) -> Value {
    let r = testkit::get(envoy.push_addr(), STATE, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

fn generation(s: &Value) -> u64 {
    s["generation"].as_u64().unwrap_or(0)
}

fn health_of(s: &Value, addr: SocketAddr) -> Option<String> {
    s["pools"][0]["pods"]
        .as_array()?
        .iter()
        .find(|p| p["address"] == json!(addr.to_string()))
        .and_then(|p| p["health"].as_str().map(str::to_string))
}

/// Polls the filter's state until `pred` holds (bounded by [`LIMIT`]).
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Total in-flight count over all pods.
fn in_flight(s: &Value) -> u64 {
    s["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["pods"].as_array().cloned().unwrap_or_default())
        .map(|pod| pod["in_flight"].as_u64().unwrap_or(0))
        .sum()
}

async fn fault(pod: SocketAddr, mode: &str) {
    let r = testkit::post_json(pod, "/admin/fault", &[], &json!({"mode": mode}))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

async fn chat(envoy: &EnvoyProcess, text: &str, max_tokens: u32) -> HttpResponse {
    let body = json!({"model": MODEL, "max_tokens": max_tokens,
                      "messages": [{"role": "user", "content": text}]});
    testkit::request_with_timeout(
        "POST",
        envoy.listen_addr,
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().into(),
        LIMIT,
    )
    .await
    .unwrap()
}

/// The model-sim pod that answered.
fn served_by(r: &HttpResponse) -> String {
    r.header("x-model-sim-pod").unwrap_or_default().to_string()
}

/// The access-log entries of the chat requests (the internal listener logs to the same file),
/// once there are `n` of them.
async fn chat_log(envoy: &EnvoyProcess, n: usize) -> Vec<AccessLogEntry> {
    let start = Instant::now();
    loop {
        let chats: Vec<AccessLogEntry> = envoy
            .access_log()
            .into_iter()
            .filter(|e| e.path == "/v1/chat/completions")
            .collect();
        if chats.len() >= n {
            return chats;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{} of {n} chat log lines",
            chats.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Envoy's counter of retried requests of the pool's cluster.
fn retries(envoy: &EnvoyProcess) -> u64 {
    envoy
        .counter(&format!("cluster.{CLUSTER}.upstream_rq_retry"))
        .unwrap()
        .unwrap_or(0)
}

/// A raw streaming request on its own connection: the response head and the first event have
/// arrived when this returns.
async fn open_stream(envoy: &EnvoyProcess, max_tokens: u32) -> (TcpStream, String) {
    let body = json!({"model": MODEL, "stream": true, "max_tokens": max_tokens,
                      "messages": [{"role": "user", "content": "tell me a long story"}]})
    .to_string();
    let mut s = TcpStream::connect(envoy.listen_addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + LIMIT;
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .expect("no first event")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        seen.extend_from_slice(buf.get(..n).unwrap());
    }
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    (s, text)
}

/// Reads the rest of a stream until the connection ends; `None` if it did not within `within`.
async fn rest_of_stream(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&rest).into_owned()),
            Ok(Ok(n)) => rest.extend_from_slice(buf.get(..n).unwrap()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_refuses_connections_is_retried_on_the_next_and_then_avoided() {
    if !testkit::stack_ready("a_pod_that_refuses_connections", []) {
        return;
    }
    let (mut pods, envoy) = start(3, 20.0, testkit::PER_TRY_IDLE_TIMEOUT).await;
    let [dead, second, third] = [pods.addrs[0], pods.addrs[1], pods.addrs[2]];
    // The snapshot ranks the pod about to die first.
    push_ok(&envoy, &snapshot(&[(dead, 0), (second, 5), (third, 9)])).await;
    let r = chat(&envoy, "warm up", 4).await;
    assert_eq!((r.status, served_by(&r)), (200, dead.to_string()));
    // Killed: its port refuses connections; the snapshot still ranks it first.
    pods.guards[0].stop();
    let before = retries(&envoy);
    for i in 0..6 {
        let r = chat(&envoy, &format!("after the kill {i}"), 4).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_ne!(served_by(&r), dead.to_string());
    }
    let log = chat_log(&envoy, 7).await;
    let last = log.last().unwrap();
    assert!(
        last.endpoint_header.starts_with(&dead.to_string()),
        "the filter still chose the dead pod first: {last:?}"
    );
    assert!(
        retries(&envoy) >= before + 6,
        "each request was retried once"
    );
    // The real sidecar scrapes: the dead pod fails its scrape and is no longer chosen.
    let (mut sidecar, _) = stack::start_sidecar_at(envoy.push_addr(), &pods.addrs, None)
        .await
        .unwrap();
    wait_state(&envoy, "the dead pod marked failing", |s| {
        health_of(s, dead).as_deref() == Some("failing")
    })
    .await;
    let settled = retries(&envoy);
    for i in 0..6 {
        let r = chat(&envoy, &format!("after the scrape {i}"), 4).await;
        assert_eq!(r.status, 200);
    }
    let log = chat_log(&envoy, 13).await;
    for e in log.iter().skip(7) {
        assert!(
            !e.endpoint_header.contains(&dead.to_string()),
            "still chosen: {e:?}"
        );
    }
    assert_eq!(
        retries(&envoy),
        settled,
        "no retries once the pod is avoided"
    );
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_stream_whose_pod_dies_or_cuts_it_ends_promptly_for_the_client() {
    if !testkit::stack_ready("a_started_stream_whose_pod_dies", []) {
        return;
    }
    // Speed-up 1: 2000 tokens take many seconds, so the stream is mid-way when the pod goes.
    let (mut pods, envoy) = start(2, 1.0, testkit::PER_TRY_IDLE_TIMEOUT).await;
    let [a, b] = [pods.addrs[0], pods.addrs[1]];
    push_ok(&envoy, &snapshot(&[(a, 0), (b, 5)])).await;
    // Killed mid-stream (SIGTERM, then SIGKILL after the grace period).
    let (mut s, head) = open_stream(&envoy, 2000).await;
    assert!(head.contains(&format!("x-model-sim-pod: {a}")), "{head}");
    let killed = Instant::now();
    pods.guards[0].stop();
    let rest = rest_of_stream(&mut s, Duration::from_secs(5))
        .await
        .expect("the client was left hanging after the pod died");
    assert!(
        !rest.contains("[DONE]"),
        "a cut stream must not look complete"
    );
    eprintln!("stream ended {:?} after the kill", killed.elapsed());
    // Cut by the pod itself (it closes the connection after two tokens).
    fault(b, "close_mid_stream").await;
    push_ok(&envoy, &snapshot(&[(b, 0)])).await;
    let (mut s, head) = open_stream(&envoy, 2000).await;
    assert!(head.contains(&format!("x-model-sim-pod: {b}")), "{head}");
    let rest = rest_of_stream(&mut s, Duration::from_secs(5))
        .await
        .expect("the client was left hanging after the pod cut the stream");
    assert!(!rest.contains("[DONE]"));
    // Nothing stays counted in flight.
    wait_state(&envoy, "in-flight back to 0", |s| in_flight(s) == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_retried_a_429_passed_on_and_a_hanging_pod_abandoned() {
    if !testkit::stack_ready("a_503_is_retried", []) {
        return;
    }
    let idle = Duration::from_secs(1);
    let (pods, envoy) = start(2, 20.0, idle).await;
    let [a, b] = [pods.addrs[0], pods.addrs[1]];
    push_ok(&envoy, &snapshot(&[(a, 0), (b, 5)])).await;

    // 503 (no work taken): retried on the next pod of the list.
    fault(a, "error503").await;
    let before = retries(&envoy);
    let r = chat(&envoy, "503 then", 4).await;
    assert_eq!(
        (r.status, served_by(&r)),
        (200, b.to_string()),
        "{}",
        r.text()
    );
    assert_eq!(retries(&envoy), before + 1);

    // 429 (back off): passed on to the client as the pod sent it, not retried.
    fault(a, "error429").await;
    let before = retries(&envoy);
    let r = chat(&envoy, "429 then", 4).await;
    assert_eq!(
        (r.status, served_by(&r)),
        (429, a.to_string()),
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(retries(&envoy), before);

    // A pod that hangs: abandoned after the per-try idle timeout, retried on the next.
    fault(a, "hang").await;
    let start = Instant::now();
    let r = chat(&envoy, "hang then", 4).await;
    let took = start.elapsed();
    assert_eq!(
        (r.status, served_by(&r)),
        (200, b.to_string()),
        "{}",
        r.text()
    );
    assert!(took >= idle, "answered before the idle timeout: {took:?}");
    assert!(took < idle * 5, "bounded by the idle timeout: {took:?}");

    // Every pod answers 503: the client gets the 503 after the retries, promptly.
    fault(a, "error503").await;
    fault(b, "error503").await;
    let r = chat(&envoy, "all 503", 4).await;
    assert_eq!(r.status, 503, "{}", r.text());
    fault(a, "none").await;
    fault(b, "none").await;
    wait_state(&envoy, "in-flight back to 0", |s| in_flight(s) == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_survives_the_sidecar_stopping_restarting_and_pushing_garbage() {
    if !testkit::stack_ready("routing_survives_the_sidecar", []) {
        return;
    }
    let (mut pods, envoy) = start(3, 20.0, testkit::PER_TRY_IDLE_TIMEOUT).await;
    let (mut sidecar, _) = stack::start_sidecar_at(envoy.push_addr(), &pods.addrs, None)
        .await
        .unwrap();
    let first = wait_state(&envoy, "the sidecar's snapshot", |s| {
        s["pools"][0]["pods"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    // Garbage, signed by the secret holder: refused with 400; the snapshot stays.
    let r = push_bytes(&envoy, b"LRSN but not a snapshot".to_vec()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = chat(&envoy, "after garbage", 4).await;
    assert_eq!(r.status, 200);

    // The sidecar stops: routing goes on, before and after the snapshot goes stale (3 s).
    sidecar.stop();
    let stopped = Instant::now();
    let stale_gen = generation(&state(&envoy).await);
    assert!(stale_gen >= generation(&first));
    let mut n = 0;
    while stopped.elapsed() < Duration::from_millis(4500) {
        let r = chat(&envoy, &format!("no sidecar {n}"), 4).await;
        assert_eq!(r.status, 200, "request {n}: {}", r.text());
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = state(&envoy).await;
    assert_eq!(generation(&s), stale_gen, "nothing pushed while stopped");
    assert!(s["age_ms"].as_u64().unwrap() > 3000, "not stale yet: {s}");
    // `llm_router_requests_total{outcome="least_inflight"}`: Envoy's /stats lists it under its
    // full name, the labels encoded before the metric's name.
    let least_inflight = envoy
        .filter_stat_sum("llm_router_requests_total", "outcome", "least_inflight")
        .unwrap();
    assert!(
        least_inflight > 0,
        "stale mode (least in-flight) never used"
    );
    assert!(
        envoy.access_log().iter().all(|e| e.code < 500),
        "a 5xx while the sidecar was away"
    );

    // A pod dies while the sidecar is away; the restarted sidecar's snapshot is used.
    pods.guards[2].stop();
    let dead = pods.addrs[2];
    let (mut again, _) = stack::start_sidecar_at(envoy.push_addr(), &pods.addrs, None)
        .await
        .unwrap();
    let s = wait_state(&envoy, "the restarted sidecar's snapshot", |s| {
        generation(s) > stale_gen && health_of(s, dead).as_deref() == Some("failing")
    })
    .await;
    assert!(s["age_ms"].as_u64().unwrap() < 3000);
    for i in 0..4 {
        let r = chat(&envoy, &format!("after the restart {i}"), 4).await;
        assert_eq!(r.status, 200);
        assert_ne!(served_by(&r), dead.to_string());
    }
    again.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_stream_leaves_nothing_in_flight() {
    if !testkit::stack_ready("a_client_that_hangs_up", []) {
        return;
    }
    let (pods, envoy) = start(2, 1.0, testkit::PER_TRY_IDLE_TIMEOUT).await;
    push_ok(&envoy, &snapshot(&[(pods.addrs[0], 0), (pods.addrs[1], 0)])).await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(open_stream(&envoy, 2000).await.0);
    }
    let s = wait_state(&envoy, "4 in flight", |s| in_flight(s) == 4).await;
    assert_eq!(in_flight(&s), 4);
    drop(streams);
    wait_state(&envoy, "in-flight back to 0", |s| in_flight(s) == 0).await;
    // The pods stop generating for the gone clients too (Envoy resets the upstream streams).
    for a in &pods.addrs {
        let start = Instant::now();
        loop {
            let st = testkit::get(*a, "/admin/state", &[]).await.unwrap();
            let v = st.json().unwrap();
            if v["running"] == 0 && v["waiting"] == 0 {
                break;
            }
            assert!(start.elapsed() < LIMIT, "{a} still generating: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
