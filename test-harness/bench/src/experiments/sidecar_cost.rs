//! Sidecar cost: CPU and memory of the real `sidecar-metrics` process scraping N (default 100)
//! metrics-only pods every 50 ms (one model-sim process hosts the pods), pushing into Envoy with the filter.
//!
//! Measured from outside (`/proc/PID/stat`), so it is the whole process's cost; rounds are read
//! from the sidecar's own `llm_router_sidecar_scrape_duration_seconds_count` (scrapes) ÷ pods. The
//! sidecar's in-crate benchmark (`sidecar-metrics/benches/scrape_cost.rs`) measures the same
//! thing without Envoy; both figures can be compared.

use crate::analysis::podmetrics::sum_metrics;
use crate::analysis::procfs::{cpu_seconds, rss_bytes};
use crate::stack::{plugin_config, start_sidecar_at, CLUSTER, POOL};
use serde::Serialize;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::{ChildGuard, EnvoySpec, Router};

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarCost {
    /// Pods scraped.
    pub pods: usize,
    /// Configured scrape interval, ms.
    pub interval_ms: u64,
    /// Measurement window, s.
    pub window_s: f64,
    /// Sidecar CPU over the window, in cores (CPU seconds per second).
    pub cores: f64,
    /// Scrape rounds in the window (scrapes ÷ pods).
    pub rounds: f64,
    /// CPU per round (all 100 pods), ms.
    pub cpu_ms_per_round: f64,
    /// CPU of the model-sim process serving the 100 pods' metrics, cores (context only).
    pub pods_cores: f64,
    /// The sidecar's VmRSS at the end of the window, bytes.
    pub rss_bytes: Option<u64>,
}

/// Errors of the measurement.
#[derive(Debug, thiserror::Error)]
#[error("sidecar cost: {0}")]
pub struct SidecarCostError(String);

async fn scrapes(addr: SocketAddr) -> Option<f64> {
    let r = testkit::get(addr, "/metrics", &[]).await.ok()?;
    sum_metrics(&r.text())
        .get("llm_router_sidecar_scrape_duration_seconds_count")
        .copied()
}

/// Run the measurement over `window`.
pub async fn measure(pods: usize, window: Duration) -> Result<SidecarCost, SidecarCostError> {
    let e = |x: String| SidecarCostError(x);
    let bin = testkit::bin("model-sim").map_err(|x| e(x.to_string()))?;
    let mut addrs = Vec::new();
    let mut cmd = Command::new(bin);
    for p in crate::stack::free_ports(pods).map_err(|x| e(x.to_string()))? {
        cmd.arg("--port").arg(p.to_string());
        addrs.push(SocketAddr::from(([127, 0, 0, 1], p)));
    }
    cmd.arg("--metrics-only");
    let sim = ChildGuard::spawn("bench-metrics-pods", cmd).map_err(|x| e(x.to_string()))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    for a in &addrs {
        while !testkit::get(*a, "/metrics", &[])
            .await
            .is_ok_and(|r| r.status == 200)
        {
            if Instant::now() > deadline {
                return Err(e(format!(
                    "metrics-only pod {a} not up (log {})",
                    sim.log_path().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut spec = EnvoySpec::new(Router::Filter)
        .pool(POOL, CLUSTER, addrs.clone())
        .plugin_config(plugin_config(&[], false, &serde_json::Value::Null));
    spec.name = "bench-sidecar-cost-envoy".into();
    let envoy = spec.start().await.map_err(|x| e(x.to_string()))?;
    let (sidecar, listen) = start_sidecar_at(envoy.push_addr(), &addrs, None)
        .await
        .map_err(|x| e(x.to_string()))?;
    // Warm up: connections open, first snapshot pushed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (pid, sim_pid) = (sidecar.pid().to_string(), sim.pid().to_string());
    let s0 = scrapes(listen).await;
    let (c0, p0, t0) = (cpu_seconds(&pid), cpu_seconds(&sim_pid), Instant::now());
    tokio::time::sleep(window).await;
    let (c1, p1, secs) = (
        cpu_seconds(&pid),
        cpu_seconds(&sim_pid),
        t0.elapsed().as_secs_f64(),
    );
    let s1 = scrapes(listen).await;
    let rss_bytes = rss_bytes(sidecar.pid());
    drop(sidecar);
    drop(envoy);
    drop(sim);
    let (Some(c0), Some(c1)) = (c0, c1) else {
        return Err(e("cannot read the sidecar's CPU time".into()));
    };
    let cpu = c1 - c0;
    let rounds = match (s0, s1) {
        (Some(a), Some(b)) if b > a => (b - a) / pods as f64,
        _ => secs / 0.05,
    };
    Ok(SidecarCost {
        pods,
        interval_ms: 50,
        window_s: secs,
        cores: cpu / secs,
        rounds,
        cpu_ms_per_round: cpu * 1000.0 / rounds.max(1.0),
        pods_cores: match (p0, p1) {
            (Some(a), Some(b)) => (b - a) / secs,
            _ => f64::NAN,
        },
        rss_bytes,
    })
}

/// `bench sidecar-cost`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// Pods.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Window, seconds.
    #[arg(long, default_value_t = 10)]
    secs: u64,
}

/// `bench sidecar-cost`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, _out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args { pods, secs } = args;
    match measure(pods, std::time::Duration::from_secs(secs)).await {
        Ok(c) => {
            println!("{}", serde_json::to_string_pretty(&c).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}
