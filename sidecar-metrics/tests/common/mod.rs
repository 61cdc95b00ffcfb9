//! Shared helpers for the integration tests: a fake fleet of `/metrics` endpoints whose text the
//! test can change, a fake push target that records every request it gets, a raw tally POST to a
//! hub, and the pod that served a request through a real gateway.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use llm_router_snapshot::Snapshot;
use sidecar_metrics::config::{Config, Discovery, PoolConfig, PushConfig, ScrapeConfig};
use tokio::net::TcpListener;

/// The push secret every test sidecar and fake proxy uses (the sidecar refuses secrets under 32
/// bytes, as the filter does).
pub const SECRET: &str = "sidecar-test-secret-0123456789abcdef";

/// The real `/metrics` samples kept in the repository (`test-harness/fixtures/metrics`); a
/// missing folder fails the calling test and names the path.
pub fn metrics_fixtures_dir() -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../test-harness/fixtures/metrics"
    ));
    assert!(
        dir.is_dir(),
        "metrics fixtures missing: {} (part of the repository; is the checkout complete?)",
        dir.display()
    );
    dir
}

/// vLLM text with the given load figures.
pub fn vllm_text(waiting: u32, running: u32, kv: f64) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m1\"}} {running}.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m1\"}} {waiting}.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m1\"}} {kv}\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"1000\"}} 1.0\n"
    )
}

/// `n` adapter names of exactly `len` bytes, distinct per `tag`.
pub fn adapter_names(tag: &str, n: usize, len: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let s = format!("{tag}-{i:05}-lora-");
            format!("{s}{}", "x".repeat(len.saturating_sub(s.len())))
        })
        .collect()
}

/// vLLM text as [`vllm_text`] plus a `vllm:lora_requests_info` series listing these adapters.
pub fn vllm_lora_text(running: &[String], waiting: &[String]) -> String {
    format!(
        "{}# TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"8\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} 1.7e9\n",
        vllm_text(1, 2, 0.3),
        running.join(","),
        waiting.join(",")
    )
}

/// What a fake pod answers.
#[derive(Clone)]
pub enum Answer {
    Text(String),
    /// The text after a delay (a pod whose API server is busy).
    Slow(Duration, String),
    Status(u16),
    Hang,
}

/// One listener per pod; `set` changes what a pod answers.
pub struct FakeFleet {
    pub addrs: Vec<SocketAddr>,
    answers: Arc<Mutex<HashMap<u16, Answer>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl FakeFleet {
    pub async fn start(n: usize, initial: Answer) -> FakeFleet {
        let answers = Arc::new(Mutex::new(HashMap::new()));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..n {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            answers
                .lock()
                .expect("lock")
                .insert(addr.port(), initial.clone());
            let a = answers.clone();
            let port = addr.port();
            let app = Router::new().route(
                "/metrics",
                get(move || {
                    let a = a.clone();
                    async move {
                        let ans = a.lock().expect("lock").get(&port).cloned();
                        match ans {
                            Some(Answer::Text(t)) => (StatusCode::OK, t),
                            Some(Answer::Slow(d, t)) => {
                                tokio::time::sleep(d).await;
                                (StatusCode::OK, t)
                            }
                            Some(Answer::Status(s)) => (
                                StatusCode::from_u16(s)
                                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                                String::new(),
                            ),
                            Some(Answer::Hang) => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                                (StatusCode::OK, String::new())
                            }
                            None => (StatusCode::NOT_FOUND, String::new()),
                        }
                    }
                }),
            );
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            }));
            addrs.push(addr);
        }
        addrs.sort();
        FakeFleet {
            addrs,
            answers,
            tasks,
        }
    }

    pub fn set(&self, addr: SocketAddr, a: Answer) {
        self.answers.lock().expect("lock").insert(addr.port(), a);
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.iter().map(|a| a.to_string()).collect()
    }
}

impl Drop for FakeFleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One request the fake proxy received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The old clear-text secret header (must not be sent any more).
    pub plain_secret: Option<String>,
    /// The body's HMAC in `x-llm-router-signature` verifies under the test [`SECRET`].
    pub signed: bool,
    pub content_type: Option<String>,
    pub snapshot: Result<Snapshot, String>,
    pub at: Instant,
}

/// A stand-in for the filter's push endpoint: records requests, answers like the contract says.
pub struct FakeProxy {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Received>>>,
    /// Status to answer with (200 normally).
    pub status: Arc<Mutex<u16>>,
    /// The generation it holds (a 409 is answered for anything not newer).
    pub stored: Arc<Mutex<u64>>,
    /// Bodies longer than this are answered 413 (as Envoy does past the listener's buffer).
    pub max_body: Arc<Mutex<usize>>,
    /// What `GET /__llm_router/tally` answers (the filter's work in flight; empty at first).
    pub tally: Arc<Mutex<llm_router_snapshot::Tally>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ProxyState {
    got: Arc<Mutex<Vec<Received>>>,
    status: Arc<Mutex<u16>>,
    stored: Arc<Mutex<u64>>,
    max_body: Arc<Mutex<usize>>,
    tally: Arc<Mutex<llm_router_snapshot::Tally>>,
}

async fn tally(State(s): State<ProxyState>) -> Vec<u8> {
    let t = s.tally.lock().expect("lock").clone();
    t.encode().expect("tally encodes")
}

async fn receive(
    State(s): State<ProxyState>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let snapshot = Snapshot::decode(&body).map_err(|e| e.to_string());
    let mut status = *s.status.lock().expect("lock");
    if body.len() > *s.max_body.lock().expect("lock") {
        status = 413;
    }
    s.got.lock().expect("lock").push(Received {
        plain_secret: h("x-llm-router-secret"),
        signed: llm_router_snapshot::verify(
            SECRET.as_bytes(),
            &body,
            h(llm_router_snapshot::SIGNATURE_HEADER).as_deref(),
        )
        .is_ok(),
        content_type: h("content-type"),
        snapshot: snapshot.clone(),
        at: Instant::now(),
    });
    if status != 200 {
        return (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "{}".into(),
        );
    }
    match snapshot {
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("{{\"error\":{{\"message\":{e:?}}}}}"),
        ),
        Ok(snap) => {
            let mut stored = s.stored.lock().expect("lock");
            if snap.generation <= *stored {
                return (
                    StatusCode::CONFLICT,
                    format!("{{\"accepted\":false,\"reason\":\"stale generation\",\"stored_generation\":{}}}", *stored),
                );
            }
            *stored = snap.generation;
            (
                StatusCode::OK,
                format!(
                    "{{\"accepted\":true,\"generation\":{},\"pools\":{},\"pods\":{}}}",
                    snap.generation,
                    snap.pools.len(),
                    snap.pod_count()
                ),
            )
        }
    }
}

impl FakeProxy {
    pub async fn start() -> FakeProxy {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(Mutex::new(200));
        let stored = Arc::new(Mutex::new(0));
        let max_body = Arc::new(Mutex::new(usize::MAX));
        let tally_state = Arc::new(Mutex::new(llm_router_snapshot::Tally::default()));
        let st = ProxyState {
            got: got.clone(),
            status: status.clone(),
            stored: stored.clone(),
            max_body: max_body.clone(),
            tally: tally_state.clone(),
        };
        let app = Router::new()
            .route("/__llm_router/snapshot", post(receive))
            .route("/__llm_router/tally", axum::routing::get(tally))
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(st);
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        FakeProxy {
            addr,
            got,
            status,
            stored,
            max_body,
            tally: tally_state,
            task,
        }
    }

    /// Sets the work in flight its tally reports: `(pool, pod, in_flight, pending_tokens)`.
    pub fn set_tally(&self, work: &[(&str, &str, u32, u32)]) {
        let mut pools: Vec<llm_router_snapshot::TallyPool> = Vec::new();
        for &(pool, pod, n, tokens) in work {
            let entry = llm_router_snapshot::TallyPod {
                address: pod.into(),
                in_flight: n,
                pending_tokens: tokens,
            };
            match pools.iter_mut().find(|p| p.name == pool) {
                Some(p) => p.pods.push(entry),
                None => pools.push(llm_router_snapshot::TallyPool {
                    name: pool.into(),
                    pods: vec![entry],
                    contexts: Vec::new(),
                }),
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        *self.tally.lock().expect("lock") = llm_router_snapshot::Tally {
            replica: 0,
            seq: 0,
            taken_ms: now,
            pools,
        };
    }

    pub fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }

    /// Waits (bounded) until `pred` holds for the accepted snapshots so far; returns them.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&[Snapshot]) -> bool,
    ) -> Vec<Snapshot> {
        let start = Instant::now();
        loop {
            let snaps: Vec<Snapshot> = self
                .received()
                .into_iter()
                .filter_map(|r| r.snapshot.ok())
                .collect();
            if pred(&snaps) {
                return snaps;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting for {what}; got {} snapshots, last: {:#?}",
                    snaps.len(),
                    snaps.last()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A config pushing to `proxy` with one pool using `discovery`.
pub fn config(
    proxy: SocketAddr,
    discovery: Discovery,
    interval_ms: u64,
    heartbeat_ms: u64,
) -> Config {
    Config {
        push: PushConfig {
            address: proxy.to_string(),
            path: "/__llm_router/snapshot".into(),
            tally_path: "/__llm_router/tally".into(),
            secret: Some(SECRET.into()),
            secret_env: None,
            secret_file: None,
            timeout_ms: 1000,
        },
        scrape: ScrapeConfig {
            interval_ms,
            timeout_ms: 300,
            ..Default::default()
        },
        heartbeat_ms,
        pod_stale_after_ms: 1000,
        mode: Default::default(),
        hub: Default::default(),
        listen: "127.0.0.1:0".into(),
        log: Default::default(),
        snapshot: Default::default(),
        rewrites: None,
        objectives: None,
        path: None,
        pools: vec![PoolConfig {
            name: "llama".into(),
            cluster: "pool_llama".into(),
            models: vec!["m1".into()],
            engine: None,
            metrics_path: None,
            discovery,
        }],
    }
}

/// Addresses of the pods in pool `llama` of a snapshot.
pub fn pod_addrs(s: &Snapshot) -> Vec<String> {
    s.pool("llama")
        .map(|p| p.pods.iter().map(|p| p.address.clone()).collect())
        .unwrap_or_default()
}

/// Minimal HTTP/1.0 GET for the sidecar's face (no client crate needed in tests).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("timeout")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A raw POST of a tally to a hub's tally endpoint, with `replica` as the replica header and
/// `signature` as the signature header, whatever they say (a test sends what no sidecar would):
/// the status code of the answer, 0 when the hub closed first.
pub async fn post_tally(hub: SocketAddr, replica: &str, signature: &str, body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(hub).await.expect("connect");
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: hub\r\ncontent-length: {}\r\n{}: {replica}\r\n{}: {signature}\r\nconnection: close\r\n\r\n",
        sidecar_metrics::share::TALLY_PATH,
        body.len(),
        sidecar_metrics::share::REPLICA_HEADER,
        llm_router_snapshot::SIGNATURE_HEADER,
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Sends one chat request through the gateway listening on `listen` and returns the pod that
/// served it: the filter's served header when it discloses it, else model-sim's own.
pub async fn served_by(listen: SocketAddr, body: &serde_json::Value) -> String {
    let r = testkit::post_json(listen, "/v1/chat/completions", &[], body)
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-gateway-destination-endpoint-served")
        .or(r.header("x-model-sim-pod"))
        .unwrap_or_default()
        .to_string()
}
