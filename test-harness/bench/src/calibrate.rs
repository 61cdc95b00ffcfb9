//! `bench calibrate`: the saturation throughput of one emulated pod, measured directly (no
//! Envoy) with a closed loop of many clients, so scenario load levels can be set from pod
//! capacity rather than from any router's results. `--scenario NAME` measures one pod of each
//! profile of that scenario's fleet on the scenario's own requests.

use crate::arrivals::Arrival;
use crate::client::{http_client, send};
use crate::stack::{start_pods, FleetSpec, PodSpec};
use crate::workload::{generate, Prompts, Range, RequestSpec, WorkloadSpec};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One calibration measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Capacity {
    /// Scenario whose pods and requests were used, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// GPU profile.
    pub profile: String,
    /// Emulator speed-up of the measurement (`rps` and `tokens_per_s` are divided by it, so
    /// they are in emulated, real-GPU units).
    pub speedup: f64,
    /// Concurrent clients.
    pub concurrency: usize,
    /// Completed requests per second.
    pub rps: f64,
    /// Output tokens per second.
    pub tokens_per_s: f64,
    /// Mean TTFT at this concurrency, ms.
    pub ttft_mean_ms: f64,
}

/// Measure one pod of `profile` with `concurrency` clients for `secs`, prompts as given.
pub async fn capacity(
    profile: &'static str,
    prompt_tokens: Range,
    max_tokens: Range,
    concurrency: usize,
    secs: u64,
) -> Result<Capacity, String> {
    let reqs = generate(&WorkloadSpec {
        seed: 7,
        arrival: Arrival::Poisson { rate: 1000.0 },
        horizon: Duration::from_secs(100),
        max_requests: 20_000,
        model: crate::stack::MODEL.into(),
        prompts: Prompts::Independent {
            prompt_tokens,
            max_tokens,
        },
        tagging: None,
    });
    measure(PodSpec::new(profile), 1.0, reqs, concurrency, secs).await
}

/// Measure one pod of each profile of scenario `name`'s fleet (its first pod of that profile,
/// at the scenario's quick-mode speed-up) on the scenario's own requests, in order.
pub async fn scenario_capacity(
    name: &str,
    concurrency: usize,
    secs: u64,
) -> Result<Vec<Capacity>, String> {
    let mode = crate::scenarios::Mode {
        quick: false,
        ..crate::scenarios::Mode::quick(7)
    };
    let sc = crate::scenarios::scenario(name, mode).ok_or_else(|| format!("no scenario {name}"))?;
    let reqs = generate(&sc.workload);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for p in &sc.fleet.pods {
        if seen.contains(&p.profile) {
            continue;
        }
        seen.push(p.profile);
        let mut c = measure(p.clone(), sc.fleet.speedup, reqs.clone(), concurrency, secs).await?;
        c.scenario = Some(name.to_string());
        out.push(c);
    }
    Ok(out)
}

async fn measure(
    pod: PodSpec,
    speedup: f64,
    reqs: Vec<RequestSpec>,
    concurrency: usize,
    secs: u64,
) -> Result<Capacity, String> {
    let profile = pod.profile;
    let fleet = FleetSpec {
        pods: vec![pod],
        speedup,
        seed: 1,
    };
    let pods = start_pods(&fleet).await.map_err(|e| e.to_string())?;
    let reqs = Arc::new(reqs);
    let uri: hyper::Uri = format!("http://{}/v1/chat/completions", pods.addrs[0])
        .parse()
        .map_err(|e| format!("{e}"))?;
    let client = http_client();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(AtomicU64::new(0));
    let ttft_us = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let warm = Instant::now() + Duration::from_secs(secs / 4);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, uri, reqs, next, done, tokens, ttft_us) = (
            client.clone(),
            uri.clone(),
            reqs.clone(),
            next.clone(),
            done.clone(),
            tokens.clone(),
            ttft_us.clone(),
        );
        set.spawn(async move {
            while Instant::now() < end {
                let i = next.fetch_add(1, Ordering::Relaxed) % reqs.len();
                let o = send(&client, &uri, reqs[i].body.clone(), &[]).await;
                if o.ok() && Instant::now() > warm && Instant::now() < end {
                    done.fetch_add(1, Ordering::Relaxed);
                    tokens.fetch_add(o.output_tokens.unwrap_or(0), Ordering::Relaxed);
                    ttft_us.fetch_add(
                        (o.ttft_ms.unwrap_or(0.0) * 1000.0) as u64,
                        Ordering::Relaxed,
                    );
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let window = (secs - secs / 4) as f64;
    let n = done.load(Ordering::Relaxed);
    Ok(Capacity {
        scenario: None,
        profile: profile.into(),
        speedup,
        concurrency,
        rps: n as f64 / window / speedup,
        tokens_per_s: tokens.load(Ordering::Relaxed) as f64 / window / speedup,
        ttft_mean_ms: ttft_us.load(Ordering::Relaxed) as f64 / 1000.0 / n.max(1) as f64,
    })
}
