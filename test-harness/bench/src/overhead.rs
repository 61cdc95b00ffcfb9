//! The filter's own cost: the same Envoy with and without the filter in front of an instant
//! backend, 2 KB and 200 KB bodies, measured in one run (interleaved, so drift hits both arms).
//!
//! Latency is measured with one request at a time (p50/p99 of the full exchange); maximum
//! throughput with a closed loop of concurrent clients for a fixed time, the arms alternating
//! in short slices so a change in the machine's other load hits both. Each Envoy's own CPU time
//! (every thread's, from `/proc/<pid>/task/*/schedstat`) is read around each phase: CPU per
//! request is the filter's cost as such, which other processes on a shared machine disturb far
//! less than they disturb throughput.

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

/// Closed-loop slices per arm (alternating plain, filter, plain, …).
const SLICES: u32 = 4;

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct OverheadOptions {
    /// Sequential requests per arm for the 2 KB case (the 200 KB case uses a quarter).
    pub latency_requests: usize,
    /// Closed-loop duration per arm and size (in [`SLICES`] alternating slices).
    pub rps_duration: Duration,
    /// Concurrent clients in the closed loop.
    pub concurrency: usize,
    /// Send the requests to a path the filter does not route ([`PASS_THROUGH_PATH`]): the
    /// filter only sees the headers and lets the body stream, so its arm measures the floor of
    /// the Wasm mechanism (the per-stream callbacks) without buffering or a decision.
    pub pass_through: bool,
}

/// The routed path of the bench's requests.
pub const ROUTED_PATH: &str = "/v1/chat/completions";
/// A path the filter passes through untouched (both Envoys route it to the same backend).
pub const PASS_THROUGH_PATH: &str = "/v1/pass-through";

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

/// CPU time (ns) every thread of process `pid` has used so far; `None` where `/proc` does not
/// tell (not Linux, or the process is gone).
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// CPU used by `pid` while `f` runs (ns; `None` where it cannot be read).
async fn with_cpu<T>(pid: u32, f: impl std::future::Future<Output = T>) -> (T, Option<u64>) {
    let before = cpu_ns(pid);
    let out = f.await;
    let used = before.zip(cpu_ns(pid)).map(|(b, a)| a.saturating_sub(b));
    (out, used)
}

/// A closed loop of `opts.concurrency` clients on `uri` for `duration`: (completed requests,
/// errors, seconds).
async fn closed_loop(
    uri: &hyper::Uri,
    body: &Bytes,
    opts: &OverheadOptions,
    duration: Duration,
) -> (u64, u64, f64) {
    let client = http_client();
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + duration;
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
    (
        done.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64(),
    )
}

/// One arm's totals over its closed-loop slices.
#[derive(Debug, Default, Clone, Copy)]
struct Arm {
    done: u64,
    errors: u64,
    secs: f64,
    cpu_ns: Option<u64>,
}

impl Arm {
    fn add(&mut self, (done, errors, secs): (u64, u64, f64), cpu: Option<u64>, first: bool) {
        self.done += done;
        self.errors += errors;
        self.secs += secs;
        self.cpu_ns = match (first, self.cpu_ns, cpu) {
            (true, _, c) => c,
            (false, Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }

    /// Requests/s (NaN when the closed loop did not run).
    fn rps(&self) -> f64 {
        if self.secs > 0.0 {
            self.done as f64 / self.secs
        } else {
            f64::NAN
        }
    }

    /// Envoy CPU per completed request, µs.
    fn cpu_us_per_request(&self) -> f64 {
        self.cpu_ns
            .filter(|_| self.done > 0)
            .map_or(f64::NAN, |ns| ns as f64 / 1e3 / self.done as f64)
    }
}

/// Maximum requests/s of both arms: [`SLICES`] closed-loop slices each, alternating.
async fn max_rps(
    plain: (&hyper::Uri, u32),
    filter: (&hyper::Uri, u32),
    body: &Bytes,
    opts: &OverheadOptions,
) -> (Arm, Arm) {
    let slice = opts.rps_duration / SLICES;
    let (mut p, mut f) = (Arm::default(), Arm::default());
    if slice.is_zero() {
        return (p, f);
    }
    for i in 0..SLICES {
        let (r, cpu) = with_cpu(plain.1, closed_loop(plain.0, body, opts, slice)).await;
        p.add(r, cpu, i == 0);
        let (r, cpu) = with_cpu(filter.1, closed_loop(filter.0, body, opts, slice)).await;
        f.add(r, cpu, i == 0);
    }
    (p, f)
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
    if opts.pass_through {
        // The shipped routes send only what the filter routed to a pool; this measurement-only
        // route lets the untouched path through on both Envoys alike.
        plain.pass_through_paths = vec![PASS_THROUGH_PATH.into()];
        filt.pass_through_paths = vec![PASS_THROUGH_PATH.into()];
    }
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
    let path = if opts.pass_through {
        PASS_THROUGH_PATH
    } else {
        ROUTED_PATH
    };
    let plain_uri = parse(plain.url(path))?;
    let filt_uri = parse(filt.url(path))?;
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
        let (cpu_plain, cpu_filter) = (cpu_ns(plain.pid()), cpu_ns(filt.pid()));
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
        // CPU per sequential request: each Envoy works only for its own arm's requests.
        let per_request = |before: Option<u64>, pid: u32, served: usize| {
            before
                .zip(cpu_ns(pid))
                .filter(|_| served > 0)
                .map_or(f64::NAN, |(b, a)| {
                    a.saturating_sub(b) as f64 / 1e3 / served as f64
                })
        };
        let seq_cpu = (
            per_request(cpu_plain, plain.pid(), lp.len()),
            per_request(cpu_filter, filt.pid(), lf.len()),
        );
        let (ap, af) = max_rps(
            (&plain_uri, plain.pid()),
            (&filt_uri, filt.pid()),
            &b,
            &opts,
        )
        .await;
        let (rp, rf) = (ap.rps(), af.rps());
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
            plain_cpu_us: ap.cpu_us_per_request(),
            filter_cpu_us: af.cpu_us_per_request(),
            cpu_ratio: ap.cpu_us_per_request() / af.cpu_us_per_request(),
            plain_seq_cpu_us: seq_cpu.0,
            filter_seq_cpu_us: seq_cpu.1,
            errors: errors + ap.errors + af.errors,
        });
    }
    drop(sidecar);
    drop(plain);
    drop(filt);
    Ok((cases, snapshot))
}
