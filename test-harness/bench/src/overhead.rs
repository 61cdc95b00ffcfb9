//! The filter's own cost: the same Envoy with and without the filter in front of an instant
//! backend, 2 KB and 200 KB bodies, measured in one run (interleaved, so drift hits both arms).
//!
//! Latency is measured with one request at a time (p50/p99 of the full exchange); maximum
//! throughput with a closed loop of concurrent clients for a fixed time.

use crate::client::{http_client, ms, HttpClient};
use crate::instant::InstantBackend;
use crate::report::OverheadCase;
use crate::stack::{plugin_config, CLUSTER, MODEL, POOL};
use crate::stats::percentile;
use crate::workload::text;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{EnvoySpec, Router};

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct OverheadOptions {
    /// Sequential requests per arm for the 2 KB case (the 200 KB case uses a quarter).
    pub latency_requests: usize,
    /// Closed-loop duration per arm and size.
    pub rps_duration: Duration,
    /// Concurrent clients in the closed loop.
    pub concurrency: usize,
}

/// Errors of the overhead bench.
#[derive(Debug, thiserror::Error)]
pub enum OverheadError {
    /// Envoy or the backend could not start.
    #[error("overhead bench setup: {0}")]
    Setup(String),
}

fn body(bytes: usize) -> Bytes {
    let mut rng = StdRng::seed_from_u64(bytes as u64);
    let v = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": text(&mut rng, bytes.saturating_sub(120))}],
        "max_tokens": 1,
    });
    Bytes::from(v.to_string())
}

async fn one(client: &HttpClient, uri: &hyper::Uri, body: &Bytes) -> Option<f64> {
    let t = Instant::now();
    let req = hyper::Request::post(uri.clone())
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .ok()?;
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            note_error(format!("transport: {e}"));
            return None;
        }
    };
    let status = resp.status();
    let headers = format!("{:?}", resp.headers());
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    if status.is_success() {
        Some(ms(t.elapsed()))
    } else {
        note_error(format!(
            "status {status}: {headers} {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        ));
        None
    }
}

/// The first error of the bench, printed once so a failing arm says why.
fn note_error(e: String) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("bench: overhead: first failed request: {e}"));
}

async fn max_rps(uri: &hyper::Uri, body: &Bytes, opts: &OverheadOptions) -> (f64, u64) {
    let client = http_client();
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + opts.rps_duration;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..opts.concurrency {
        let (client, uri, body, done, errors) = (
            client.clone(),
            uri.clone(),
            body.clone(),
            done.clone(),
            errors.clone(),
        );
        set.spawn(async move {
            while Instant::now() < end {
                match one(&client, &uri, &body).await {
                    Some(_) => done.fetch_add(1, Ordering::Relaxed),
                    None => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    let start = Instant::now();
    while set.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

/// Run the overhead bench for 2 KB and 200 KB bodies.
/// Returns the cases and whether the filter held a snapshot (full scoring path) during them.
pub async fn run(opts: OverheadOptions) -> Result<(Vec<OverheadCase>, bool), OverheadError> {
    let backend = InstantBackend::start()
        .await
        .map_err(|e| OverheadError::Setup(format!("instant backend: {e}")))?;
    let eps = vec![backend.addr()];
    let mut plain = EnvoySpec::new(Router::RoundRobin).pool(POOL, CLUSTER, eps.clone());
    plain.name = "bench-overhead-plain".into();
    let mut filt = EnvoySpec::new(Router::Filter)
        .pool(POOL, CLUSTER, eps)
        .plugin_config(plugin_config(&[], false));
    filt.name = "bench-overhead-filter".into();
    let plain = plain
        .start()
        .await
        .map_err(|e| OverheadError::Setup(format!("plain Envoy: {e}")))?;
    let filt = filt
        .start()
        .await
        .map_err(|e| OverheadError::Setup(format!("Envoy with the filter: {e}")))?;
    let parse = |u: String| -> Result<hyper::Uri, OverheadError> {
        u.parse()
            .map_err(|e| OverheadError::Setup(format!("bad URL {u}: {e}")))
    };
    // The sidecar scrapes the backend's /metrics and pushes a snapshot, so the filter arm takes
    // its full path (body parse, pool lookup, scoring), not the no-snapshot fallback. It runs
    // during both arms, so its CPU use burdens both alike.
    let sidecar = crate::stack::start_sidecar(filt.push_addr(), &[backend.addr()])
        .await
        .map_err(|e| OverheadError::Setup(format!("sidecar: {e}")))?;
    let snapshot = crate::stack::wait_snapshot_at(
        filt.push_addr(),
        1,
        Duration::from_secs(15),
        &sidecar.log_path().display().to_string(),
    )
    .await
    .is_ok();
    let plain_uri = parse(plain.url("/v1/chat/completions"))?;
    let filt_uri = parse(filt.url("/v1/chat/completions"))?;
    let client = http_client();
    let mut cases = Vec::new();
    for size in [2_000usize, 200_000] {
        let b = body(size);
        let n = if size > 10_000 {
            (opts.latency_requests / 4).max(20)
        } else {
            opts.latency_requests.max(20)
        };
        // Warm up connections and the Wasm VMs.
        for _ in 0..20 {
            let _ = one(&client, &plain_uri, &b).await;
            let _ = one(&client, &filt_uri, &b).await;
        }
        let (mut lp, mut lf, mut errors) = (Vec::new(), Vec::new(), 0u64);
        for i in 0..n {
            // Alternate which arm goes first so neither always follows the other.
            let order = if i % 2 == 0 {
                [(&plain_uri, true), (&filt_uri, false)]
            } else {
                [(&filt_uri, false), (&plain_uri, true)]
            };
            for (uri, is_plain) in order {
                match one(&client, uri, &b).await {
                    Some(t) if is_plain => lp.push(t),
                    Some(t) => lf.push(t),
                    None => errors += 1,
                }
            }
        }
        let (rp, ep) = max_rps(&plain_uri, &b, &opts).await;
        let (rf, ef) = max_rps(&filt_uri, &b, &opts).await;
        let (p50p, p99p, p50f, p99f) = (
            percentile(&lp, 50.0),
            percentile(&lp, 99.0),
            percentile(&lf, 50.0),
            percentile(&lf, 99.0),
        );
        cases.push(OverheadCase {
            body_bytes: b.len(),
            plain_p50_ms: p50p,
            plain_p99_ms: p99p,
            filter_p50_ms: p50f,
            filter_p99_ms: p99f,
            added_p50_ms: p50f - p50p,
            added_p99_ms: p99f - p99p,
            p50_ratio: p50f / p50p,
            p99_ratio: p99f / p99p,
            plain_max_rps: rp,
            filter_max_rps: rf,
            rps_ratio: rf / rp,
            errors: errors + ep + ef,
        });
    }
    drop(sidecar);
    drop(plain);
    drop(filt);
    Ok((cases, snapshot))
}
