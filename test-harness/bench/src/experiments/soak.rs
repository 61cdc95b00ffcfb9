//! `bench soak`: the whole gateway kept busy while things break, to show that nothing is lost,
//! nothing hangs and nothing leaks.
//!
//! Four model-sim pods in two pools (two models; LoRA adapters on the first), Envoy with the
//! filter and the shipped retry policy, and the real sidecar. A bounded number of mixed requests
//! (streaming and not, both models, adapters, and a share of hostile bodies the filter must turn
//! away) runs from a fixed number of concurrent clients; a third of the way in one pod is
//! killed, two thirds in the sidecar is restarted. Every request is classified, and the run
//! passes when no request that had not started streaming was lost, none outlived its timeout,
//! every hostile body got its 4xx, and Envoy's and the sidecar's resident memory at the end is
//! within 10 % of what it was after the warm-up.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
#[cfg(test)]
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::{ChildGuard, EnvoyProcess, EnvoySpec, Router};

use crate::analysis::stats::percentile;
use crate::loadgen::client::{http_client, ms, HttpClient};
use crate::report::soak::{markdown, SoakReport};
use crate::report::verdicts::verdict;
use crate::stack::{free_ports, wait_snapshot_at, StackError, SECRET};

/// The two models (one pool each) and the adapters of the first.
const MODELS: [&str; 2] = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
];
const POOLS: [(&str, &str); 2] = [("llama", "pool_llama"), ("qwen", "pool_qwen")];
const ADAPTERS: [&str; 3] = ["sql-lora", "chat-lora", "code-lora"];
/// How big a soak.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Requests sent in all.
    pub requests: usize,
    /// Concurrent clients (closed loop).
    pub concurrency: usize,
    /// Emulator speed-up.
    pub speedup: f64,
    /// Workload seed.
    pub seed: u64,
    /// Bound of every request; one that takes longer is a hang.
    pub request_timeout: Duration,
}

impl SoakConfig {
    /// CI-sized: 1,500 requests, well under two minutes.
    pub fn ci() -> Self {
        SoakConfig {
            requests: 1500,
            concurrency: 24,
            speedup: 20.0,
            seed: 1,
            request_timeout: Duration::from_secs(30),
        }
    }

    /// The full size: 10,000 requests.
    pub fn full() -> Self {
        SoakConfig {
            requests: 10_000,
            ..SoakConfig::ci()
        }
    }
}

/// What a request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat { model: usize, stream: bool },
    Adapter { stream: bool },
    Hostile(Hostile),
}

/// Bodies the filter must refuse, each with the status it documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hostile {
    NotJson,
    WrongType,
    UnknownModel,
    TooLarge,
    DeepNesting,
}

impl Hostile {
    const ALL: [Hostile; 5] = [
        Hostile::NotJson,
        Hostile::WrongType,
        Hostile::UnknownModel,
        Hostile::TooLarge,
        Hostile::DeepNesting,
    ];

    fn body(self) -> Vec<u8> {
        match self {
            Hostile::NotJson => {
                b"{\"model\": \"meta-llama/Llama-3.1-8B-Instruct\", \"messages\": [".to_vec()
            }
            Hostile::WrongType => br#"{"model": 42, "messages": "hi"}"#.to_vec(),
            Hostile::UnknownModel => {
                br#"{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}"#
                    .to_vec()
            }
            Hostile::TooLarge => {
                let filler = "x".repeat(1_100_000);
                json!({"model": MODELS[0], "messages": [{"role": "user", "content": filler}]})
                    .to_string()
                    .into_bytes()
            }
            Hostile::DeepNesting => {
                let depth = 5000;
                format!(
                    "{{\"model\": \"{}\", \"x\": {}{}}}",
                    MODELS[0],
                    "[".repeat(depth),
                    "]".repeat(depth)
                )
                .into_bytes()
            }
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum End {
    /// Complete answer (a stream with `[DONE]`, a JSON completion).
    Ok,
    /// A hostile body refused with a 4xx, as documented.
    Refused,
    /// Failed before any of the answer reached the client (status or transport): lost.
    Lost(String),
    /// A stream that had started and was cut (its pod died): the client saw the error.
    Cut,
    /// A hostile body that was not refused.
    HostileServed(u16),
    /// Outlived its timeout.
    Hang,
}

impl End {
    fn cause(&self) -> String {
        match self {
            End::Ok => "ok".into(),
            End::Refused => "hostile body refused (4xx)".into(),
            End::Lost(why) => format!("lost: {why}"),
            End::Cut => "stream cut after it started".into(),
            End::HostileServed(s) => format!("hostile body answered {s}"),
            End::Hang => "hang (timeout)".into(),
        }
    }
}

/// `VmRSS` of a process, kB (0 if it cannot be read).
pub fn vm_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| parse_vm_rss(&s))
        .unwrap_or(0)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn tk(what: &str) -> impl FnOnce(testkit::Error) -> StackError + '_ {
    move |source| StackError::Testkit {
        what: what.to_string(),
        source,
    }
}

/// The soak's stack: pods (two per model), Envoy, the sidecar.
struct SoakStack {
    pods: Vec<ChildGuard>,
    addrs: Vec<SocketAddr>,
    envoy: EnvoyProcess,
    sidecar: ChildGuard,
    sidecar_config: PathBuf,
    dir: PathBuf,
}

async fn start_stack(cfg: &SoakConfig) -> Result<SoakStack, StackError> {
    let bin = testkit::bin("model-sim").map_err(tk("model-sim binary"))?;
    let ports = free_ports(4).map_err(|source| StackError::Io {
        path: "bind 127.0.0.1:0 (free ports)".into(),
        source,
    })?;
    let mut pods = Vec::new();
    let mut addrs = Vec::new();
    for (i, port) in ports.into_iter().enumerate() {
        let model = MODELS[i / 2];
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", &port.to_string(), "--profile", "h100"])
            .args(["--speedup", &cfg.speedup.to_string()])
            .args(["--seed", &(cfg.seed + i as u64).to_string()])
            .args(["--model", model, "--max-loras", "4"]);
        pods.push(ChildGuard::spawn(&format!("soak-model-sim-{i}"), cmd).map_err(tk("model-sim"))?);
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    for (g, a) in pods.iter().zip(&addrs) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = testkit::get(*a, "/health", &[]).await {
                if r.status == 200 {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(StackError::NotReady {
                    what: format!("model-sim {a}"),
                    secs: 20,
                    log: g.log_path().display().to_string(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let pools = json!([
        {"name": POOLS[0].0, "cluster": POOLS[0].1, "models": [MODELS[0]], "adapters": ADAPTERS},
        {"name": POOLS[1].0, "cluster": POOLS[1].1, "models": [MODELS[1]]},
    ]);
    let mut spec = EnvoySpec::new(Router::Filter)
        .pool(POOLS[0].0, POOLS[0].1, addrs[..2].to_vec())
        .pool(POOLS[1].0, POOLS[1].1, addrs[2..].to_vec())
        .concurrency(2)
        .plugin_config(json!({"pools": pools, "snapshot": {"secret": SECRET}}));
    spec.name = "soak-envoy".into();
    let envoy = spec.start().await.map_err(tk("start Envoy"))?;
    let dir = testkit::testlog_dir("soak-sidecar").map_err(tk("log dir"))?;
    let listen = SocketAddr::from(([127, 0, 0, 1], testkit::free_port().map_err(tk("port"))?));
    let sidecar_config = dir.join("sidecar.yaml");
    let pool_yaml = |p: usize, pods: &[SocketAddr]| {
        let list: Vec<String> = pods.iter().map(|a| format!("\"{a}\"")).collect();
        format!(
            "  - name: {}\n    cluster: {}\n    models: [\"{}\"]\n    engine: vllm\n    discovery:\n      static: [{}]\n",
            POOLS[p].0, POOLS[p].1, MODELS[p], list.join(", ")
        )
    };
    let text = format!(
        "# Generated by bench soak.\npush:\n  address: {}\n  path: /__llm_router/snapshot\n  secret: {SECRET}\nscrape:\n  interval_ms: 100\nlisten: {listen}\npools:\n{}{}",
        envoy.push_addr(),
        pool_yaml(0, &addrs[..2]),
        pool_yaml(1, &addrs[2..])
    );
    std::fs::write(&sidecar_config, text).map_err(|source| StackError::Io {
        path: sidecar_config.display().to_string(),
        source,
    })?;
    let sidecar = start_sidecar(&sidecar_config, &dir, 0)?;
    wait_snapshot_at(envoy.push_addr(), 4, Duration::from_secs(15), "").await?;
    Ok(SoakStack {
        pods,
        addrs,
        envoy,
        sidecar,
        sidecar_config,
        dir,
    })
}

// The stack's error type, as `stack.rs`'s starters return it (theirs are async, which this
// lint does not look at); boxing it for this one function would only add conversions.
#[allow(clippy::result_large_err)]
fn start_sidecar(config: &Path, dir: &Path, n: usize) -> Result<ChildGuard, StackError> {
    let bin = testkit::bin("sidecar-metrics").map_err(tk("sidecar-metrics binary"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("--config").arg(config);
    ChildGuard::spawn_logged(
        "sidecar-metrics",
        cmd,
        &dir.join(format!("sidecar-{n}.log")),
    )
    .map_err(tk("start sidecar-metrics"))
}

/// The kind of request `i` (seeded): 10 % adapters, 5 % hostile, the rest split over the two
/// models; half of the non-hostile ones stream.
fn kind_of(rng: &mut StdRng) -> Kind {
    let stream = rng.random_bool(0.5);
    let roll: f64 = rng.random();
    if roll < 0.05 {
        Kind::Hostile(Hostile::ALL[rng.random_range(0..Hostile::ALL.len())])
    } else if roll < 0.15 {
        Kind::Adapter { stream }
    } else {
        Kind::Chat {
            model: usize::from(roll >= 0.6),
            stream,
        }
    }
}

fn body_of(kind: Kind, i: usize, rng: &mut StdRng) -> Vec<u8> {
    let max_tokens = rng.random_range(8..48);
    let text = format!(
        "soak request {i}: {}",
        "tell me about GPUs. ".repeat(rng.random_range(1..40))
    );
    let (model, stream) = match kind {
        Kind::Hostile(h) => return h.body(),
        Kind::Chat { model, stream } => (MODELS[model].to_string(), stream),
        Kind::Adapter { stream } => (ADAPTERS[i % ADAPTERS.len()].to_string(), stream),
    };
    json!({"model": model, "stream": stream, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": text}]})
    .to_string()
    .into_bytes()
}

/// Sends one request and classifies how it ended (bounded by `timeout`).
async fn one(
    client: &HttpClient,
    uri: &hyper::Uri,
    kind: Kind,
    body: Vec<u8>,
    timeout: Duration,
) -> (End, f64) {
    let start = Instant::now();
    let end = match tokio::time::timeout(timeout, exchange(client, uri, kind, body)).await {
        Ok(end) => end,
        Err(_) => End::Hang,
    };
    (end, ms(start.elapsed()))
}

async fn exchange(client: &HttpClient, uri: &hyper::Uri, kind: Kind, body: Vec<u8>) -> End {
    let req = match Request::post(uri.clone())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
    {
        Ok(r) => r,
        Err(e) => return End::Lost(format!("request: {e}")),
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        // A hostile body must get its documented answer, not a dropped connection.
        Err(_) if matches!(kind, Kind::Hostile(_)) => return End::HostileServed(0),
        Err(_) => return End::Lost("transport error before the answer".into()),
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut text = Vec::new();
    let mut broken = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    text.extend_from_slice(&d);
                }
            }
            Err(_) => {
                broken = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    if let Kind::Hostile(_) = kind {
        return if (400..500).contains(&status) && text.contains("\"error\"") {
            End::Refused
        } else {
            End::HostileServed(status)
        };
    }
    if !(200..300).contains(&status) {
        return End::Lost(format!("status {status}"));
    }
    let streaming = matches!(
        kind,
        Kind::Chat { stream: true, .. } | Kind::Adapter { stream: true }
    );
    match (streaming, broken) {
        (true, _) if text.contains("data: [DONE]") && !broken => End::Ok,
        (true, _) => End::Cut,
        // A non-streaming answer is one body: cut means it never fully arrived.
        (false, true) => End::Lost("non-streaming body cut".into()),
        (false, false) if text.contains("\"choices\"") => End::Ok,
        (false, false) => End::Lost("non-streaming body incomplete".into()),
    }
}

/// The bench's percentile ([`percentile`], nearest rank) of the succeeded requests' latencies;
/// 0 when none succeeded (the report then says so through its counts, not through NaN).
fn latency_percentile(ok_ms: &[f64], p: f64) -> f64 {
    if ok_ms.is_empty() {
        0.0
    } else {
        percentile(ok_ms, p)
    }
}

/// Runs the soak and returns its figures (the verdict is [`verdict`]'s).
pub async fn run(cfg: &SoakConfig) -> Result<SoakReport, StackError> {
    let mut stack = start_stack(cfg).await?;
    let client = http_client();
    let uri: hyper::Uri = stack.envoy.url("/v1/chat/completions").parse().map_err(
        |e: hyper::http::uri::InvalidUri| StackError::Io {
            path: "Envoy URL".into(),
            source: std::io::Error::other(e.to_string()),
        },
    )?;
    let warmup = (cfg.requests / 10).max(50);
    let kill_at = cfg.requests / 3;
    let restart_at = cfg.requests * 2 / 3;
    let next = Arc::new(AtomicUsize::new(0));
    let results: Arc<Mutex<Vec<(End, f64)>>> =
        Arc::new(Mutex::new(Vec::with_capacity(cfg.requests)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..cfg.concurrency {
        let (client, uri, next, results) =
            (client.clone(), uri.clone(), next.clone(), results.clone());
        let (total, timeout) = (cfg.requests, cfg.request_timeout);
        let mut rng = StdRng::seed_from_u64(cfg.seed.wrapping_mul(1000).wrapping_add(w as u64));
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= total {
                    break;
                }
                let kind = kind_of(&mut rng);
                let body = body_of(kind, i, &mut rng);
                let r = one(&client, &uri, kind, body, timeout).await;
                if let Ok(mut list) = results.lock() {
                    list.push(r);
                }
            }
        }));
    }
    // The events, keyed to the number of requests sent.
    let wait_for = |n: usize| {
        let next = next.clone();
        async move {
            while next.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let mut report = SoakReport {
        sent: cfg.requests,
        ..SoakReport::default()
    };
    wait_for(warmup).await;
    report.envoy_rss_kb.0 = vm_rss_kb(stack.envoy.pid());
    report.sidecar_rss_kb.0 = vm_rss_kb(stack.sidecar.pid());
    wait_for(kill_at).await;
    // The last pod of the second pool (its pool keeps one pod), killed outright (SIGKILL: no
    // goodbye to its connections), then reaped.
    if let Some(p) = stack.pods.get_mut(3) {
        let _ = Command::new("kill")
            .args(["-KILL", &p.pid().to_string()])
            .status();
        p.stop();
    }
    report.killed_pod = stack
        .addrs
        .get(3)
        .map(|a| a.to_string())
        .unwrap_or_default();
    report.events_at.0 = next.load(Ordering::SeqCst);
    wait_for(restart_at).await;
    stack.sidecar.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.sidecar = start_sidecar(&stack.sidecar_config, &stack.dir, 1)?;
    report.events_at.1 = next.load(Ordering::SeqCst);
    // The restarted sidecar's reference figure, after the same warm-up in requests.
    let restarted_warm = (restart_at + warmup).min(cfg.requests);
    wait_for(restarted_warm).await;
    let sidecar_restart_rss = vm_rss_kb(stack.sidecar.pid());
    for w in workers {
        let _ = w.await;
    }
    report.wall_s = started.elapsed().as_secs_f64();
    // Let the connections and counters settle, then the end figures.
    tokio::time::sleep(Duration::from_millis(500)).await;
    report.envoy_rss_kb.1 = vm_rss_kb(stack.envoy.pid());
    let sidecar_end = vm_rss_kb(stack.sidecar.pid());
    // The sidecar's start is its first process's figure; if the restarted one warmed up higher
    // (it is a new process), judge its end against that too.
    report.sidecar_rss_kb = (
        report.sidecar_rss_kb.0.max(sidecar_restart_rss),
        sidecar_end,
    );
    let results = results.lock().map(|l| l.clone()).unwrap_or_default();
    let mut ok_ms = Vec::new();
    for (end, t) in &results {
        report.max_ms = report.max_ms.max(*t);
        match end {
            End::Ok => {
                report.succeeded += 1;
                ok_ms.push(*t);
            }
            End::Refused => report.refused_hostile += 1,
            other => {
                *report.failed_by_cause.entry(other.cause()).or_default() += 1;
                match other {
                    End::Lost(_) => report.lost += 1,
                    End::Cut => report.cut += 1,
                    End::Hang => report.hangs += 1,
                    End::HostileServed(_) => report.hostile_served += 1,
                    End::Ok | End::Refused => {}
                }
            }
        }
    }
    // Every request taken by a worker counts as sent; one without a result is unaccounted.
    report.sent = next.load(Ordering::SeqCst).min(cfg.requests);
    report.p50_ms = latency_percentile(&ok_ms, 50.0);
    report.p99_ms = latency_percentile(&ok_ms, 99.0);
    for (pool, cluster) in POOLS {
        let count = |stat: &str| {
            stack
                .envoy
                .counter(&format!("cluster.{cluster}.{stat}"))
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        report.envoy_retries.insert(
            pool.to_string(),
            (
                count("upstream_rq_retry"),
                count("upstream_cx_connect_fail"),
            ),
        );
    }
    stack.sidecar.stop();
    stack.envoy.stop();
    for p in &mut stack.pods {
        p.stop();
    }
    Ok(report)
}

/// `bench soak`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// The full size (10,000 requests) instead of the CI size (1,500).
    #[arg(long)]
    full: bool,
    /// Requests (overrides the size).
    #[arg(long)]
    requests: Option<usize>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `bench soak`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        full,
        requests,
        seed,
    } = args;
    let mut cfg = if full {
        SoakConfig::full()
    } else {
        SoakConfig::ci()
    };
    cfg.requests = requests.unwrap_or(cfg.requests);
    cfg.seed = seed;
    match run(&cfg).await {
        Ok(rep) => {
            let v = verdict(&rep);
            let md = markdown(&rep, &v);
            println!("{md}");
            let _ = std::fs::create_dir_all(out_dir);
            let json = serde_json::to_string_pretty(&rep).unwrap_or_default();
            let _ = std::fs::write(out_dir.join("soak.json"), json);
            let _ = std::fs::write(out_dir.join("soak.md"), md);
            if v.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passing() -> SoakReport {
        SoakReport {
            sent: 100,
            succeeded: 90,
            refused_hostile: 5,
            failed_by_cause: BTreeMap::from([("stream cut after it started".into(), 5)]),
            cut: 5,
            envoy_rss_kb: (50_000, 54_000),
            sidecar_rss_kb: (8_000, 8_100),
            ..SoakReport::default()
        }
    }

    #[test]
    fn cut_streams_pass_and_every_other_failure_fails() {
        assert!(verdict(&passing()).passed(), "{:?}", verdict(&passing()));
        let mut lost = passing();
        lost.succeeded -= 1;
        lost.lost = 1;
        lost.failed_by_cause.insert("lost: status 502".into(), 1);
        assert!(!verdict(&lost).passed());
        let mut hang = passing();
        hang.succeeded -= 1;
        hang.hangs = 1;
        hang.failed_by_cause.insert("hang (timeout)".into(), 1);
        let v = verdict(&hang);
        assert_eq!(v.failures.len(), 1, "{v:?}");
        assert!(v.failures[0].contains("hung"));
        let mut served = passing();
        served.refused_hostile -= 1;
        served.hostile_served = 1;
        served
            .failed_by_cause
            .insert("hostile body answered 200".into(), 1);
        assert!(!verdict(&served).passed());
        let mut missing = passing();
        missing.succeeded -= 3;
        assert!(verdict(&missing).failures[0].contains("accounted"));
        assert!(!verdict(&SoakReport::default()).passed());
    }

    #[test]
    fn memory_may_grow_ten_percent_and_no_more() {
        let mut r = passing();
        r.envoy_rss_kb = (50_000, 55_000);
        assert!(verdict(&r).passed());
        r.envoy_rss_kb = (50_000, 55_001);
        let v = verdict(&r);
        assert!(!v.passed() && v.failures[0].contains("Envoy"), "{v:?}");
        let mut r = passing();
        r.sidecar_rss_kb = (8_000, 9_000);
        assert!(verdict(&r).failures[0].contains("sidecar"));
        let mut r = passing();
        r.sidecar_rss_kb = (0, 9_000);
        assert!(verdict(&r).failures[0].contains("not measured"));
        assert!(markdown(&r, &verdict(&r)).contains("FAIL"));
        assert!(markdown(&passing(), &verdict(&passing())).starts_with("## Soak: PASS"));
    }

    #[test]
    fn vm_rss_is_read_from_proc_status() {
        assert_eq!(
            parse_vm_rss("Name:\tenvoy\nVmPeak:\t 900 kB\nVmRSS:\t  51234 kB\n"),
            Some(51234)
        );
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert!(vm_rss_kb(std::process::id()) > 0);
    }

    #[test]
    fn the_workload_mixes_every_kind() {
        let mut rng = StdRng::seed_from_u64(1);
        let kinds: Vec<Kind> = (0..2000).map(|_| kind_of(&mut rng)).collect();
        let count = |f: &dyn Fn(&Kind) -> bool| kinds.iter().filter(|k| f(k)).count();
        assert!(count(&|k| matches!(k, Kind::Hostile(_))) > 50);
        assert!(count(&|k| matches!(k, Kind::Adapter { .. })) > 100);
        assert!(count(&|k| matches!(k, Kind::Chat { model: 0, .. })) > 500);
        assert!(count(&|k| matches!(k, Kind::Chat { model: 1, .. })) > 500);
        assert!(count(&|k| matches!(k, Kind::Chat { stream: true, .. })) > 500);
        for h in Hostile::ALL {
            assert!(kinds.contains(&Kind::Hostile(h)), "{h:?} never drawn");
        }
        assert!(Hostile::TooLarge.body().len() > 1_000_000);
    }
}
