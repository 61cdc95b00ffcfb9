//! Measures the emulator's own CPU cost (it shares two cores with Envoy, the sidecar and the
//! load generator): a fleet of 8 pods in one `model-sim` process at 50 requests/s in total,
//! half of them streaming. Prints cores used (child CPU time / wall time, from /proc); asserts
//! only that the load was served. Ignored by default because it takes ~25 s:
//! `cargo test --release -p model-sim --test cpu_cost -- --ignored --nocapture`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / clk_tck()
}

fn start(spec: &str, extra: &[&str], n: usize) -> (Sim, Vec<SocketAddr>) {
    let mut args = vec!["fleet", "--spec", spec];
    args.extend_from_slice(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_model-sim"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let out = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let mut lines = BufReader::new(out).lines();
    let mut addrs = Vec::new();
    while addrs.len() < n {
        let line = lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("model-sim exited early"));
        let addr = line
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        addrs.push(addr);
    }
    (Sim(child), addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints the emulator's CPU cost"]
async fn fleet_of_8_at_50_rps() {
    let spec = "h100:0,h100:0,h100:0,h100:0,a10g:0,a10g:0,a10g:0,a10g:0";
    // MODEL_SIM_BENCH_SPEEDUP=10 measures a sped-up fleet (more tokens per second).
    let speedup = std::env::var("MODEL_SIM_BENCH_SPEEDUP").unwrap_or_else(|_| "1".into());
    let (sim, addrs) = start(spec, &["--speedup", &speedup], 8);
    let pid = sim.0.id();

    // Idle cost first.
    let c0 = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = (cpu_seconds(pid) - c0) / 3.0;

    let rate = 50.0;
    let secs = 20.0;
    let ok = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(AtomicU64::new(0));
    let shared = "You are a helpful assistant. Answer briefly and precisely. ".repeat(10);
    let c0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let n = (rate * secs) as usize;
    for i in 0..n {
        let due = t0 + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let addr = addrs[i % addrs.len()];
        let stream = i % 2 == 0;
        let prompt = format!("{shared} question {i}: {}", "lorem ipsum ".repeat(30));
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 128, "stream": stream, "stream_options": {"include_usage": true}
        })
        .to_string();
        let (ok, tokens) = (ok.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            if let Ok(r) = common::http(addr, "POST", "/v1/chat/completions", Some(&body)).await {
                if r.status == 200 && r.complete {
                    ok.fetch_add(1, Ordering::Relaxed);
                    tokens.fetch_add(128, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - c0;
    let served = ok.load(Ordering::Relaxed);
    println!(
        "model-sim CPU cost: 8 pods (4 h100 + 4 a10g, speedup {speedup}), {rate} req/s for {secs} s, half streaming: \
         {:.3} cores ({cpu:.2} s CPU over {wall:.1} s wall; {served}/{n} requests, {} output tokens); idle {:.4} cores",
        cpu / wall,
        tokens.load(Ordering::Relaxed),
        idle
    );
    assert!(served as f64 >= n as f64 * 0.99, "served {served} of {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints the cost of 100 metrics-only pods scraped every 50 ms"]
async fn hundred_metrics_only_pods() {
    let (sim, addrs) = start("h100:0", &["--metrics-only"], 1);
    drop((sim, addrs));
    // 100 pods: one spec item per pod.
    let spec = vec!["h100:0"; 100].join(",");
    let (sim, addrs) = start(&spec, &["--metrics-only"], 100);
    let pid = sim.0.id();
    let c0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut scrapes = 0u64;
    while t0.elapsed() < Duration::from_secs(10) {
        let mut tasks = Vec::new();
        for a in &addrs {
            let a = *a;
            tasks.push(tokio::spawn(async move {
                common::http(a, "GET", "/metrics", None)
                    .await
                    .map(|r| r.status)
            }));
        }
        for t in tasks {
            if let Ok(Ok(200)) = t.await {
                scrapes += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - c0;
    println!(
        "model-sim CPU cost: 100 metrics-only pods, {scrapes} scrapes in {wall:.1} s ({:.0}/s): {:.3} cores",
        scrapes as f64 / wall,
        cpu / wall
    );
    assert!(scrapes > 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints wall-clock vs modelled latency at several speed-ups"]
async fn timing_fidelity() {
    use model_sim::profile::Profile;
    use model_sim::server::{spawn_pod, PodConfig};
    for profile in [Profile::h100(), Profile::a10g()] {
        for speedup in [1.0, 5.0, 20.0] {
            let mut cfg = PodConfig::new(0, profile.clone());
            cfg.speedup = speedup;
            let p = spawn_pod(cfg).await.unwrap_or_else(|e| panic!("{e}"));
            let body = serde_json::json!({
                "messages": [{"role": "user", "content": "x".repeat(4000)}],
                "max_tokens": 256, "stream": true
            })
            .to_string();
            let t0 = Instant::now();
            let r = common::http(p.addr(), "POST", "/v1/chat/completions", Some(&body))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let wall = t0.elapsed().as_secs_f64();
            assert!(r.complete);
            let m = common::parse_metrics(&p.pod().metrics_text());
            // Modelled e2e: the histogram's sum (one request).
            let text = p.pod().metrics_text();
            let sum: f64 = text
                .lines()
                .find(|l| l.starts_with("vllm:e2e_request_latency_seconds_sum"))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN);
            assert_eq!(
                common::get(&m, "vllm:e2e_request_latency_seconds", &[]),
                Some(1.0)
            );
            println!(
                "timing fidelity {} speedup {speedup:>4}: modelled e2e {:.4} s, wall {:.4} s, ratio {:.3}",
                profile.name,
                sum,
                wall,
                wall / sum
            );
        }
    }
}
