//! Runs scenarios × routers × seeds (and the goodput sweeps) and writes the report (JSON,
//! Markdown, PNGs) under `target/bench/`.
//!
//! For every router the same seeded workload is sent to fresh pods through a fresh Envoy; each
//! run has an identical warm-up that is not counted, a measurement window whose arrivals make
//! the figures, and a tail of arrivals so the window ends under load ([`Windows`]). The CPU time
//! of every process (Envoy, pods, sidecar, this load generator) is recorded so the report can
//! show that neither Envoy nor the load generator was the bottleneck.

use crate::analysis::confidence::{ratio_cis, Bisection, Obs, RatioCi, RunData, Stat};
use crate::analysis::diagnostics::{
    condition_met, lateness_check, Diagnostics, InvalidRun, RunView,
};
use crate::analysis::podmetrics::{self, PodWindow};
use crate::analysis::procfs::cpu_seconds;
use crate::analysis::stats::{summarize, Summary};
use crate::experiments::scenarios::{floor_ttfts, scenario, scenario_at, Mode, Scenario};
use crate::loadgen::workload::{generate, RequestSpec};
use crate::loadgen::{run, RunOptions, RunResult, Sample};
use crate::report::verdicts::check_targets;
use crate::report::{
    markdown, GoodputSweep, Machine, Probe, RatioRow, Report, ScenarioResult, SeedRatio, FLOOR,
};
use crate::stack::fleet::{PodEngine, MODEL};
use crate::stack::{heterogeneous, start_stack, RouterKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of a benchmark run that stop it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Unknown scenario or router name.
    #[error("unknown {what} {name:?} (known: {known})")]
    Unknown {
        /// `scenario` or `router`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The names accepted.
        known: String,
    },
    /// Writing results failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The Envoy version string (`envoy --version`), or "unknown".
pub fn envoy_version() -> String {
    let Ok(bin) = testkit::envoy_binary() else {
        return "not found".into();
    };
    match std::process::Command::new(bin).arg("--version").output() {
        Ok(o) => {
            let s = String::from_utf8_lossy(&o.stdout);
            s.split("version:")
                .nth(1)
                .map(|v| v.trim().split('/').nth(1).unwrap_or(v.trim()).to_string())
                .unwrap_or_else(|| s.trim().to_string())
        }
        Err(_) => "unknown".into(),
    }
}

/// Longest measurement window of a full-mode run, wall seconds (the budget's cap).
pub const MAX_WINDOW_S: f64 = 45.0;

/// The measurement protocol of one run, in wall time: a warm-up whose requests are sent but
/// not counted (identical for every router: same seed, same arrivals), the window whose
/// arrivals make the figures, and a tail of arrivals after it so window requests finish under
/// the same load instead of in an emptying system.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Windows {
    /// Warm-up.
    pub warmup: Duration,
    /// Measurement window.
    pub window: Duration,
    /// Arrivals after the window (not counted).
    pub tail: Duration,
}

impl Windows {
    /// The benchmark's protocol for a run that is one of `seeds` (or a goodput `probe`): the
    /// scenario's warm-up (`sc.warmup`, wall clock), then the measurement window, then a tail
    /// of 2 s (quick) / 5 s (full) of emulated time.
    ///
    /// Quick takes the scenario's own window (horizon − warm-up). Full sizes it for the seeds:
    /// long enough for [`Windows::min_requests`] arrivals at the scenario's mean rate and at
    /// least 30 emulated seconds, at most [`MAX_WINDOW_S`] wall seconds (the 2-hour budget; the
    /// report gives the tail samples behind each p99), and for bursty arrivals whole on/off
    /// cycles with at least ⌈10 ÷ seeds⌉ bursts per run (≥ 10 over the seeds).
    pub fn for_scenario(sc: &Scenario, mode: &Mode, seeds: usize, probe: bool) -> Self {
        // The scenario's own speed-up: the mode's for emulated pods, 1 for real ones.
        let s = sc.fleet.speedup.max(0.01);
        let tail = Duration::from_secs_f64(if mode.quick { 2.0 } else { 5.0 } / s);
        if mode.quick {
            return Windows {
                warmup: sc.warmup,
                window: sc.workload.horizon.saturating_sub(sc.warmup),
                tail,
            };
        }
        let needed = if sc.rate_rps > 0.0 {
            Self::min_requests(mode, seeds, probe) as f64 / sc.rate_rps
        } else {
            0.0
        };
        let mut window = needed.max(30.0 / s).min(MAX_WINDOW_S);
        if let crate::loadgen::arrivals::Arrival::Bursty { on_s, off_s, .. } = sc.workload.arrival {
            let period = on_s + off_s;
            if period > 0.0 {
                let min_cycles = if probe {
                    1.0
                } else {
                    (10.0 / seeds.max(1) as f64).ceil()
                };
                window = (window / period).ceil().max(min_cycles) * period;
            }
        }
        Windows {
            warmup: sc.warmup,
            window: Duration::from_secs_f64(window),
            tail,
        }
    }

    /// Window arrivals full mode asks for: each pooled p99 resting on ≥ 20 tail samples
    /// (2,000 requests over the seeds); a sweep probe (one seed, judged on p95) 20 behind its
    /// p95 (400). Quick: none (the scenario's window as it is).
    pub fn min_requests(mode: &Mode, seeds: usize, probe: bool) -> usize {
        match (mode.quick, probe) {
            (true, _) => 0,
            (false, true) => 400,
            (false, false) => 2000usize.div_ceil(seeds.max(1)),
        }
    }

    /// No warm-up and no tail: the whole horizon is the window (demo, smoke test).
    pub fn whole(sc: &Scenario) -> Self {
        Windows {
            warmup: Duration::ZERO,
            window: sc.workload.horizon,
            tail: Duration::ZERO,
        }
    }
}

/// One scenario under one router and one seed, reduced to its measurement window.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Workload seed.
    pub seed: u64,
    /// Figures of the window's requests (pod shares keyed `pod<i> (<profile>)`).
    pub summary: Summary,
    /// The window's requests for the per-seed ratios.
    pub data: RunData,
    /// Each pod's window figures, fleet order.
    pub pods: Vec<(String, PodWindow)>,
    /// Fleet prefix-cache hits and queries in the window, if exported.
    pub prefix: Option<(f64, f64)>,
    /// Whether every pod accepted the stats reset at the window start.
    pub stats_reset: bool,
    /// Every sample of the run (warm-up and tail included; wall-clock ms, pod addresses).
    pub result: RunResult,
    /// The window's samples (emulated ms, pods labelled `pod<i> (<profile>)`).
    pub window: Vec<Sample>,
    /// Why the run is invalid (step lateness), if it is.
    pub invalid: Option<String>,
}

impl RunOutcome {
    /// The view [`Diagnostics::from_runs`] aggregates.
    pub fn view(&self) -> RunView<'_> {
        RunView {
            seed: self.seed,
            pods: &self.pods,
            shares: &self.summary.pod_share,
            requests: self.summary.requests,
            errors: &self.summary.errors_by_status,
            prefix: self.prefix,
            stats_reset: self.stats_reset,
        }
    }
}

/// Model-sim's default GPU adapter slots per pod (`--max-loras`).
const DEFAULT_MAX_LORAS: u32 = 4;

/// The fewest adapter loads any router could make on the adapter requests that arrive in
/// `[from_ms, to_ms)` ([`podmetrics::adapter_loads_floor`] over the fleet's GPU slots).
pub fn adapter_floor(sc: &Scenario, reqs: &[RequestSpec], from_ms: f64, to_ms: f64) -> u64 {
    let slots: u32 = sc
        .fleet
        .pods
        .iter()
        .map(|p| p.max_loras.unwrap_or(DEFAULT_MAX_LORAS))
        .sum();
    let seq: Vec<&str> = reqs
        .iter()
        .filter(|r| {
            let at = r.at.as_secs_f64() * 1000.0;
            at >= from_ms && at < to_ms && r.model != MODEL
        })
        .map(|r| r.model.as_str())
        .collect();
    podmetrics::adapter_loads_floor(&seq, slots as usize)
}

/// One scenario under one router: start the stack, send the workload, summarise, stop. The
/// whole horizon is the window (no warm-up); see [`run_windowed`] for the benchmark protocol.
pub async fn run_one(sc: &Scenario, router: RouterKind) -> Result<(Summary, RunResult), String> {
    let o = run_windowed(sc, router, Windows::whole(sc)).await?;
    Ok((o.summary, o.result))
}

/// One scenario under one router with the [`Windows`] protocol: the pods' `*_max` gauges are
/// reset and their counters read at the window start, read again at its end; the figures come
/// from the requests that arrived inside the window.
pub async fn run_windowed(
    sc: &Scenario,
    router: RouterKind,
    w: Windows,
) -> Result<RunOutcome, String> {
    let mut sc = sc.clone();
    sc.workload.horizon = w.warmup + w.window + w.tail;
    sc.workload.max_requests = sc.workload.max_requests.max(1_000_000);
    let reqs = generate(&sc.workload);
    let stack = start_stack(&sc.fleet, router, &sc.adapters, &sc.filter_config)
        .await
        .map_err(|e| e.to_string())?;
    let pids: Vec<(String, String)> = stack
        .pids()
        .into_iter()
        .map(|(role, pid)| (role.to_string(), pid.to_string()))
        .chain(std::iter::once(("loadgen".to_string(), "self".to_string())))
        .collect();
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|(_, p)| cpu_seconds(p).unwrap_or(0.0))
        .collect();
    let start = Instant::now() + Duration::from_millis(100);
    let addrs = stack.pods.addrs.clone();
    let emulated = sc.fleet.engine == PodEngine::ModelSim;
    let marks = tokio::spawn(async move {
        tokio::time::sleep_until((start + w.warmup).into()).await;
        // Only the emulator has `*_max` gauges to reset (a real vLLM answers 404).
        let reset = emulated && podmetrics::reset_stats(&addrs).await;
        let m0 = podmetrics::scrape_each(&addrs).await;
        let t0 = Instant::now();
        tokio::time::sleep_until((start + w.warmup + w.window).into()).await;
        let m1 = podmetrics::scrape_each(&addrs).await;
        (reset, m0, m1, t0.elapsed().as_secs_f64())
    });
    let opts = RunOptions {
        url: stack.chat_url(),
        replica_urls: stack.chat_urls().split_off(1),
        headers: sc.client_headers.clone(),
        drain: sc.drain,
        request_timeout: sc.workload.horizon + sc.drain + Duration::from_secs(5),
        start: Some(start),
    };
    let result = match run(&reqs, &opts).await {
        Ok(r) => r,
        Err(e) => {
            marks.abort();
            stack.stop();
            return Err(e.to_string());
        }
    };
    let (stats_reset, m0, m1, window_wall) = marks
        .await
        .unwrap_or_else(|_| (false, vec![], vec![], w.window.as_secs_f64()));
    let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
    for ((k, p), c0) in pids.iter().zip(cpu0) {
        *cpu.entry(k.clone()).or_default() += cpu_seconds(p).unwrap_or(c0) - c0;
    }
    let labels: BTreeMap<String, String> = stack
        .pods
        .addrs
        .iter()
        .zip(&sc.fleet.pods)
        .enumerate()
        .map(|(i, (a, p))| (a.to_string(), format!("pod{i} ({})", p.profile)))
        .collect();
    let label_list: Vec<String> = stack
        .pods
        .addrs
        .iter()
        .map(|a| labels.get(&a.to_string()).cloned().unwrap_or_default())
        .collect();
    let gateway = stack.gateway.counts().await;
    stack.stop();

    let (from_ms, to_ms) = (
        w.warmup.as_secs_f64() * 1000.0,
        (w.warmup + w.window).as_secs_f64() * 1000.0,
    );
    // Figures are in emulated time: wall latencies × speed-up, rates ÷ speed-up (so they
    // compare with the scenario's rates and SLO whatever the speed-up).
    let k = sc.fleet.speedup.max(0.01);
    let window_samples: Vec<Sample> = result
        .samples
        .iter()
        .filter(|s| s.at_ms >= from_ms && s.at_ms < to_ms)
        .cloned()
        .map(|mut s| {
            if let Some(p) = s.outcome.pod.take() {
                s.outcome.pod = Some(labels.get(&p).cloned().unwrap_or(p));
            }
            s.outcome.ttft_ms = s.outcome.ttft_ms.map(|t| t * k);
            s.outcome.e2e_ms *= k;
            s.outcome.itl_ms.iter_mut().for_each(|t| *t *= k);
            s
        })
        .collect();
    if let Some(dir) = std::env::var_os(SAMPLES_ENV) {
        if let Err(e) = dump_samples(
            Path::new(&dir),
            &format!(
                "{}-{}-{}{}",
                sc.name,
                router.name(),
                sc.workload.seed,
                // A real scenario's model-sim twin (`calibrate --compare`).
                if crate::experiments::scenarios::REAL_NAMES.contains(&sc.name) && emulated {
                    "-twin"
                } else {
                    ""
                }
            ),
            &window_samples,
            &reqs,
        ) {
            eprintln!("bench: {SAMPLES_ENV}: {e}");
        }
    }
    let window_s = w.window.as_secs_f64() * k;
    let mut summary = summarize(&RunResult {
        samples: window_samples.clone(),
        wall_s: window_s,
    });
    if let Some(cold) = cold_long_reads(&window_samples) {
        summary.extra.insert("cold_long_reads".into(), cold as f64);
    }
    let pods: Vec<(String, PodWindow)> = label_list
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let empty = BTreeMap::new();
            let a = m0.get(i).unwrap_or(&empty);
            let b = m1.get(i).unwrap_or(&empty);
            (l, podmetrics::pod_window(a, b, window_wall))
        })
        .collect();
    let fleet_delta = |name: &str| -> Option<f64> {
        let mut any = false;
        let mut t = 0.0;
        for (a, b) in m0.iter().zip(&m1) {
            if let Some(y) = b.get(name) {
                any = true;
                t += (y - a.get(name).copied().unwrap_or(0.0)).max(0.0);
            }
        }
        any.then_some(t)
    };
    let prefix = fleet_delta("vllm:prefix_cache_hits_total")
        .zip(fleet_delta("vllm:prefix_cache_queries_total"));
    if let Some((h, q)) = prefix {
        if q > 0.0 {
            summary.extra.insert("prefix_hit_rate".into(), h / q);
        }
    }
    if let Some(p) = fleet_delta("vllm:num_preemptions_total") {
        summary.extra.insert("preemptions".into(), p);
    }
    // The whole run's (warm-up and tail included): what the gateway did, not window figures.
    summary.extra.extend(gateway);
    // Real pods name no pod in their responses: each pod's share of the window's requests from
    // its own count of finished requests.
    if summary.pod_share.is_empty() {
        summary.pod_share = podmetrics::shares_from_counts(
            &pods.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(),
            &m0,
            &m1,
        );
    }
    if !sc.adapters.is_empty() {
        match fleet_delta("model_sim:lora_loads_total") {
            Some(v) => {
                summary.extra.insert("adapter_loads".into(), v);
            }
            // Real pods neither count loads nor name the pod per request: not known.
            None if window_samples.iter().all(|s| s.outcome.pod.is_none()) => {}
            None => {
                let max = sc.fleet.pods.first().and_then(|p| p.max_loras).unwrap_or(1) as usize;
                summary.extra.insert(
                    "adapter_loads".into(),
                    podmetrics::estimate_adapter_loads(&window_samples, MODEL, max) as f64,
                );
                summary.extra.insert("adapter_loads_estimated".into(), 1.0);
            }
        }
        if let Some(v) = fleet_delta("model_sim:lora_disk_loads_total") {
            summary.extra.insert("adapter_loads_disk".into(), v);
        }
        summary.extra.insert(
            "adapter_loads_floor".into(),
            adapter_floor(&sc, &reqs, from_ms, to_ms) as f64,
        );
    }
    for (k, v) in cpu {
        summary
            .extra
            .insert(format!("cpu_cores_{k}"), v / result.wall_s.max(1e-9));
    }
    // Lateness is wall time: compare it with the wall-clock TTFT p50.
    let invalid = match lateness_check(
        &pods.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        summary.ttft_p50_ms / k,
    ) {
        Ok(Some(l)) => {
            summary.extra.insert("step_lateness_ms".into(), l);
            None
        }
        Ok(None) => None,
        Err(reason) => Some(reason),
    };
    let data = RunData {
        seed: sc.workload.seed,
        obs: window_samples
            .iter()
            .map(|s| {
                let o = &s.outcome;
                let obs = if o.ok() {
                    Obs {
                        ttft_ms: o.ttft_ms.unwrap_or(f64::INFINITY),
                        e2e_ms: o.e2e_ms,
                        ok: true,
                        tokens: o.output_tokens.unwrap_or(u64::from(o.content_chunks)) as f64,
                    }
                } else {
                    Obs::failed()
                };
                (s.id, obs)
            })
            .collect(),
        window_s,
        scalars: summary
            .extra
            .iter()
            .filter(|(k, _)| !k.starts_with("cpu_cores_"))
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
    };
    Ok(RunOutcome {
        seed: sc.workload.seed,
        summary,
        data,
        pods,
        prefix,
        stats_reset,
        result,
        window: window_samples,
        invalid,
    })
}

/// Set to a folder: every run writes its window's requests there as JSON lines
/// (`<scenario>-<router>-<seed>.jsonl`: the sample — pod, TTFT, prompt and cached tokens —
/// with the request's prefix group, prompt size and, for a chat turn, its `conv` "N turn T" as
/// the workload wrote it), to study a tail request, or a conversation's moves, request by request.
pub const SAMPLES_ENV: &str = "LLMR_BENCH_SAMPLES";

fn dump_samples(
    dir: &Path,
    stem: &str,
    samples: &[Sample],
    reqs: &[RequestSpec],
) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let by_id: BTreeMap<u64, &RequestSpec> = reqs.iter().map(|r| (r.id, r)).collect();
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{stem}.jsonl")))?);
    for s in samples {
        let spec = by_id.get(&s.id);
        let mut v = serde_json::to_value(s)?;
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "prefix_group".into(),
                serde_json::json!(spec.and_then(|r| r.prefix_group)),
            );
            o.insert(
                "prompt_chars".into(),
                serde_json::json!(spec.map(|r| r.prompt_chars)),
            );
            // The workload's "[conversation N turn T]" marker, the last in the body (its latest
            // user turn).
            let conv = spec.and_then(|r| {
                let b = std::str::from_utf8(&r.body).ok()?;
                let at = b.rfind("[conversation ")?;
                let rest = &b[at + 14..];
                let end = rest.find(']')?;
                Some(rest[..end].to_string())
            });
            o.insert("conv".into(), serde_json::json!(conv));
        }
        writeln!(out, "{v}")?;
    }
    out.flush()
}

/// What `bench run` does.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Quick or full, speed-up, first seed.
    pub mode: Mode,
    /// Seeds per (scenario, router): `mode.seed`, `mode.seed + 1`, ...
    pub seeds: usize,
    /// Scenario names (empty = all).
    pub scenarios: Vec<String>,
    /// Routers (empty = the default set).
    pub routers: Vec<String>,
    /// Scenarios that get a goodput sweep.
    pub sweep: Vec<String>,
    /// Fixed-load rate as a fraction of round robin's goodput (swept scenarios).
    pub load_fraction: f64,
    /// Fixed-load rate as a fraction of the fleet's measured capacity (`--load`), for the
    /// scenarios not swept; `None` = each scenario's nominal rate.
    pub load_of_capacity: Option<f64>,
    /// Run the overhead bench too.
    pub overhead: bool,
    /// Output folder (`target/bench`).
    pub out_dir: PathBuf,
}

impl BenchConfig {
    /// The defaults of a mode: quick = 1 seed (a direction, no interval), no sweep; full =
    /// 10 seeds (what a verdict needs: confidence.rs), a sweep of `mixed_gpu`; fixed load at
    /// 70 % of round robin's goodput where swept.
    pub fn defaults(mode: Mode, out_dir: PathBuf) -> Self {
        BenchConfig {
            mode,
            seeds: if mode.quick { 1 } else { 10 },
            scenarios: vec![],
            routers: vec![],
            sweep: if mode.quick {
                vec![]
            } else {
                vec!["mixed_gpu".into()]
            },
            load_fraction: 0.7,
            load_of_capacity: None,
            overhead: true,
            out_dir,
        }
    }
}

fn write(path: &Path, data: &[u8]) -> Result<(), RunError> {
    std::fs::write(path, data).map_err(|source| RunError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn samples_csv(r: &RunResult) -> String {
    let mut s =
        String::from("id,model,at_ms,lag_ms,status,ttft_ms,e2e_ms,output_tokens,pod,error,prompt_tokens,cached_tokens,group\n");
    for x in &r.samples {
        let o = &x.outcome;
        let _ = writeln!(
            s,
            "{},{},{:.1},{:.1},{},{},{:.1},{},{},{},{},{},{}",
            x.id,
            x.model,
            x.at_ms,
            x.lag_ms,
            o.status,
            o.ttft_ms.map_or(String::new(), |t| format!("{t:.1}")),
            o.e2e_ms,
            o.output_tokens.map_or(String::new(), |t| t.to_string()),
            o.pod.as_deref().unwrap_or(""),
            o.error.as_deref().unwrap_or("").replace([',', '\n'], " "),
            o.prompt_tokens.map_or(String::new(), |t| t.to_string()),
            o.cached_tokens.map_or(String::new(), |t| t.to_string()),
            x.group.map_or(String::new(), |g| g.to_string()),
        );
    }
    s
}

/// Resolve names to scenarios and routers (all scenarios / the default routers when empty).
pub fn select(cfg: &BenchConfig) -> Result<(Vec<Scenario>, Vec<RouterKind>), RunError> {
    let names: Vec<String> = if cfg.scenarios.is_empty() {
        crate::experiments::scenarios::NAMES
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        cfg.scenarios.clone()
    };
    let mut scs = Vec::new();
    for n in names.iter().chain(&cfg.sweep) {
        let sc = scenario(n, cfg.mode).ok_or_else(|| RunError::Unknown {
            what: "scenario",
            name: n.clone(),
            known: crate::experiments::scenarios::all_names()
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        if names.contains(n) && !scs.iter().any(|s: &Scenario| s.name == sc.name) {
            scs.push(sc);
        }
    }
    let mut routers = Vec::new();
    if cfg.routers.is_empty() {
        // Quick leaves out the full-scan least request to fit its budget (named, it runs).
        routers.extend(
            RouterKind::ALL
                .into_iter()
                .filter(|r| !cfg.mode.quick || *r != RouterKind::LeastRequestFull),
        );
        // The field's routers: the comparison users make. Quick takes one to fit its budget.
        if cfg.mode.quick {
            routers.extend(RouterKind::QUICK_PEERS);
        } else {
            routers.extend(RouterKind::PEERS);
        }
    }
    for r in &cfg.routers {
        routers.push(RouterKind::from_name(r).ok_or_else(|| RunError::Unknown {
            what: "router",
            name: r.clone(),
            known: RouterKind::names().join(", "),
        })?);
    }
    Ok((scs, routers))
}

/// Uncached prompt tokens above which an answered read counts as a cold long read: more than a
/// system prompt of the shared-prefix scenarios (1,500 tokens) prefilled, so a document or a
/// whole conversation read where no pod's cache held it.
pub const COLD_READ_TOKENS: u64 = 1_500;

/// Answered requests among `samples` that prefilled more than [`COLD_READ_TOKENS`] (prompt
/// tokens less cached tokens, as the server reported them); `None` when no answer reported
/// cached tokens (a server that does not count them).
pub fn cold_long_reads(samples: &[Sample]) -> Option<u64> {
    let reported: Vec<(u64, u64)> = samples
        .iter()
        .filter_map(|s| Some((s.outcome.prompt_tokens?, s.outcome.cached_tokens?)))
        .collect();
    if reported.is_empty() {
        return None;
    }
    Some(
        reported
            .iter()
            .filter(|&&(prompt, cached)| prompt.saturating_sub(cached) > COLD_READ_TOKENS)
            .count() as u64,
    )
}

/// The metrics whose ratios get an interval.
pub const RATIO_METRICS: [&str; 9] = [
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "e2e_p95_ms",
    "throughput_rps",
    "output_tokens_per_s",
    "adapter_loads",
    "prefix_hit_rate",
];

/// Ratios router ÷ baseline with their intervals over the seeds both have valid runs for: every
/// router ÷ round robin and ÷ least request; the replica routers ÷ the one-gateway filter; the
/// filter routers ÷ every other router that ran (Envoy's balancers and the field's routers), so
/// that a target against the best other router ([`crate::report::best_other`]) finds its row
/// whichever router is best at the metric judged.
pub fn scenario_ratios(
    scenario: &str,
    runs: &BTreeMap<&'static str, Vec<RunOutcome>>,
) -> Vec<RatioRow> {
    use crate::report::{is_other, CHECKED_ROUTERS, REPLICA_ROUTERS};
    let mut out = Vec::new();
    let valid = |r: &str| -> BTreeMap<u64, &RunData> {
        runs.get(r)
            .map(|v| {
                v.iter()
                    .filter(|o| o.invalid.is_none())
                    .map(|o| (o.seed, &o.data))
                    .collect()
            })
            .unwrap_or_default()
    };
    for baseline in runs.keys() {
        let b = valid(baseline);
        if b.is_empty() {
            continue;
        }
        let compared = |r: &str| {
            r != *baseline
                && match *baseline {
                    "round_robin" | "least_request" => true,
                    "filter" => REPLICA_ROUTERS.contains(&r),
                    other => is_other(other) && CHECKED_ROUTERS.contains(&r),
                }
        };
        for router in runs.keys().filter(|r| compared(r)) {
            let a = valid(router);
            let seeds: Vec<u64> = a.keys().filter(|s| b.contains_key(s)).copied().collect();
            if seeds.is_empty() {
                continue;
            }
            let xa: Vec<RunData> = seeds.iter().map(|s| a[s].clone()).collect();
            let xb: Vec<RunData> = seeds.iter().map(|s| b[s].clone()).collect();
            let metrics: Vec<&'static str> = RATIO_METRICS
                .into_iter()
                .filter(|m| {
                    Stat::from_metric(m) != Stat::Scalar(m)
                        || xa.iter().all(|r| r.scalars.contains_key(*m))
                })
                .collect();
            let stats: Vec<Stat> = metrics.iter().map(|m| Stat::from_metric(m)).collect();
            for (m, c) in metrics.iter().zip(ratio_cis(&xa, &xb, &stats)) {
                out.push(ratio_row(scenario, router, baseline, m, &seeds, c));
            }
        }
    }
    out
}

/// One row of the report from a ratio and its interval over `seeds` (in the order of its pairs).
fn ratio_row(
    scenario: &str,
    router: &str,
    baseline: &str,
    metric: &str,
    seeds: &[u64],
    c: RatioCi,
) -> RatioRow {
    RatioRow {
        scenario: scenario.into(),
        router: router.into(),
        baseline: baseline.into(),
        metric: metric.into(),
        ratio: c.ratio,
        ci95: c.ci95,
        seeds: seeds.len(),
        per_seed: seeds
            .iter()
            .zip(&c.per_seed)
            .map(|(&seed, &ratio)| SeedRatio { seed, ratio })
            .collect(),
    }
}

/// The TTFT percentiles the floor is compared at.
pub const FLOOR_METRICS: [&str; 4] = ["ttft_p50_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms"];

/// One seed's floor as a run: each request's TTFT served alone on an idle pod
/// ([`floor_ttfts`]), emulated ms (`k`: the fleet's speed-up), keyed by request id like a
/// router's window, so that [`ratio_cis`] pairs it with a router's run on the same requests.
pub fn floor_run(sc: &Scenario, reqs: &[RequestSpec], k: f64) -> RunData {
    RunData {
        seed: sc.workload.seed,
        obs: floor_ttfts(&sc.fleet, reqs)
            .into_iter()
            .map(|(r, ttft_s)| {
                let ms = ttft_s * 1000.0 * k;
                let obs = Obs {
                    ttft_ms: ms,
                    e2e_ms: ms,
                    ok: true,
                    tokens: 1.0,
                };
                (r.id, obs)
            })
            .collect(),
        window_s: 0.0,
        scalars: BTreeMap::new(),
    }
}

/// The floor ÷ every other router that ran ([`crate::report::is_other`]), per seed at the TTFT
/// percentiles of [`FLOOR_METRICS`], as rows of router `floor`: how far below a router the best
/// any router could do lies, with the interval those seeds allow. A target on a ratio to the best
/// other router that the floor's own ratio does not meet is below what any router can reach.
pub fn floor_ratios(
    scenario: &str,
    floors: &BTreeMap<u64, RunData>,
    runs: &BTreeMap<&'static str, Vec<RunOutcome>>,
) -> Vec<RatioRow> {
    let stats: Vec<Stat> = FLOOR_METRICS.iter().map(|m| Stat::from_metric(m)).collect();
    let mut out = Vec::new();
    for (router, outcomes) in runs.iter().filter(|(r, _)| crate::report::is_other(r)) {
        let (xa, xb): (Vec<RunData>, Vec<RunData>) = outcomes
            .iter()
            .filter(|o| o.invalid.is_none())
            .filter_map(|o| Some((floors.get(&o.seed)?.clone(), o.data.clone())))
            .unzip();
        if xa.is_empty() {
            continue;
        }
        let seeds: Vec<u64> = xa.iter().map(|d| d.seed).collect();
        for (m, c) in FLOOR_METRICS.iter().zip(ratio_cis(&xa, &xb, &stats)) {
            out.push(ratio_row(scenario, FLOOR, router, m, &seeds, c));
        }
    }
    out
}

/// Pool the valid runs of one router: figures over every valid seed's window, diagnostics.
pub fn aggregate(runs: &[RunOutcome], w: Windows, offered_rps: f64) -> Option<Summary> {
    let valid: Vec<&RunOutcome> = runs.iter().filter(|o| o.invalid.is_none()).collect();
    let invalid: Vec<InvalidRun> = runs
        .iter()
        .filter_map(|o| {
            o.invalid.as_ref().map(|r| InvalidRun {
                seed: o.seed,
                reason: r.clone(),
            })
        })
        .collect();
    let mut diag =
        Diagnostics::from_runs(&valid.iter().map(|o| o.view()).collect::<Vec<_>>(), invalid);
    diag.warmup_s = w.warmup.as_secs_f64();
    diag.window_s = w.window.as_secs_f64();
    diag.offered_rps = offered_rps;
    if valid.is_empty() {
        // Every run invalid: no figures, but the diagnostics say why.
        return Some(Summary {
            ttft_p50_ms: f64::NAN,
            ttft_p90_ms: f64::NAN,
            ttft_p95_ms: f64::NAN,
            ttft_p99_ms: f64::NAN,
            e2e_p95_ms: f64::NAN,
            throughput_rps: f64::NAN,
            output_tokens_per_s: f64::NAN,
            error_rate: f64::NAN,
            diagnostics: Some(diag),
            ..Summary::default()
        })
        .filter(|_| !runs.is_empty());
    }
    let samples: Vec<Sample> = valid.iter().flat_map(|o| o.window.clone()).collect();
    let mut sum = summarize(&RunResult {
        samples,
        wall_s: valid.iter().map(|o| o.data.window_s).sum(),
    });
    // Pod shares by label, averaged over the seeds (addresses differ per seed).
    sum.pod_share = diag
        .pods
        .iter()
        .map(|(k, p)| (k.clone(), p.share))
        .collect();
    let mut extra: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for o in &valid {
        for (k, v) in &o.summary.extra {
            extra.entry(k.clone()).or_default().push(*v);
        }
    }
    sum.extra = extra
        .into_iter()
        .map(|(k, v)| (k, v.iter().sum::<f64>() / v.len() as f64))
        .collect();
    if let Some(p) = diag.prefix_hit_rate {
        sum.extra.insert("prefix_hit_rate".into(), p);
    }
    sum.max_send_lag_ms = valid
        .iter()
        .map(|o| o.summary.max_send_lag_ms)
        .fold(0.0, f64::max);
    sum.diagnostics = Some(diag);
    Some(sum)
}

/// Whether a probe passes: valid, TTFT p95 ≤ SLO, errors ≤ 1 %.
pub fn probe_passes(o: &RunOutcome, slo_ms: f64) -> bool {
    o.invalid.is_none()
        && o.summary.ttft_p95_ms <= slo_ms
        && o.summary.error_rate <= crate::report::verdicts::MAX_ERROR_RATE
}

/// The goodput sweep of one scenario: a bisection per router over the offered rate.
async fn sweep(
    name: &str,
    mode: Mode,
    routers: &[RouterKind],
    runs_dir: &Path,
) -> Result<GoodputSweep, RunError> {
    let base = scenario(name, mode).ok_or_else(|| RunError::Unknown {
        what: "scenario",
        name: name.into(),
        known: crate::experiments::scenarios::all_names()
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    // The bisection runs in emulated req/s (what the report shows); scenario_at takes wall.
    let k = base.fleet.speedup.max(0.01);
    let nominal = base.rate_rps / k;
    let slo = base.slo_ttft_ms * k;
    let mut g = GoodputSweep {
        slo_ttft_ms: slo,
        seed: mode.seed,
        ..GoodputSweep::default()
    };
    for r in routers {
        let mut b = Bisection::new(nominal, 0.1, 8);
        let mut probes = Vec::new();
        while let Some(rate) = b.next_rate() {
            let Some(sc) = scenario_at(name, mode, rate * k) else {
                break;
            };
            let w = Windows::for_scenario(&sc, &mode, 1, true);
            match run_windowed(&sc, *r, w).await {
                Ok(o) => {
                    let passed = probe_passes(&o, slo);
                    eprintln!(
                        "bench:   sweep {name} {:<18} {rate:>7.2} req/s: TTFT p95 {:>9.1} ms, errors {:.1} % -> {}",
                        r.name(),
                        o.summary.ttft_p95_ms,
                        o.summary.error_rate * 100.0,
                        if passed { "pass" } else { "fail" }
                    );
                    write(
                        &runs_dir.join(format!("{name}-{}-sweep-{rate:.2}.csv", r.name())),
                        samples_csv(&o.result).as_bytes(),
                    )?;
                    probes.push(Probe {
                        rate_rps: rate,
                        ttft_p95_ms: o.summary.ttft_p95_ms,
                        error_rate: o.summary.error_rate,
                        passed,
                        invalid: o.invalid.clone(),
                    });
                    b.record(rate, passed);
                }
                Err(e) => {
                    eprintln!("bench:   sweep {name} {} at {rate:.2}: {e}", r.name());
                    // Not a measurement: stop this router's sweep (its goodput is unknown).
                    probes.push(Probe {
                        rate_rps: rate,
                        ttft_p95_ms: f64::NAN,
                        error_rate: f64::NAN,
                        passed: false,
                        invalid: Some(format!("not measured: {e}")),
                    });
                    break;
                }
            }
        }
        g.probes.insert(r.name().to_string(), probes);
    }
    Ok(g)
}

/// Goodput per router from a sweep (the bisection's answer replayed from its probes); routers
/// whose sweep stopped on a run that could not be measured are left out (unknown).
pub fn goodputs(g: &GoodputSweep) -> BTreeMap<String, f64> {
    g.probes
        .iter()
        .filter(|(_, ps)| ps.iter().all(|p| !p.ttft_p95_ms.is_nan()))
        .map(|(r, ps)| {
            let fail = ps
                .iter()
                .filter(|p| !p.passed)
                .map(|p| p.rate_rps)
                .fold(f64::INFINITY, f64::min);
            let pass = ps
                .iter()
                .filter(|p| p.passed && p.rate_rps < fail)
                .map(|p| p.rate_rps)
                .fold(0.0, f64::max);
            (r.clone(), pass)
        })
        .collect()
}

/// Fill the sweep's filter ÷ round robin, ÷ the best baseline (Envoy's balancers) and ÷ the best
/// other router (every router but the filter's, the field's included).
pub fn goodput_ratios(g: &mut GoodputSweep) {
    let gp = goodputs(g);
    let filter = gp.get("filter").copied();
    let ratio = |b: Option<f64>| match (filter, b) {
        (Some(f), Some(b)) => crate::analysis::confidence::safe_ratio(f, b),
        _ => None,
    };
    g.filter_vs_round_robin = ratio(gp.get("round_robin").copied());
    let best = crate::report::BASELINES
        .iter()
        .filter_map(|b| gp.get(*b).map(|v| (*b, *v)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    g.best_baseline = best.map(|(b, _)| b.to_string());
    g.filter_vs_best_baseline = ratio(best.map(|(_, v)| v));
    let other = gp
        .iter()
        .filter(|(r, _)| crate::report::is_other(r))
        .max_by(|a, b| a.1.total_cmp(b.1));
    g.best_other = other.map(|(r, _)| r.clone());
    g.filter_vs_best_other = ratio(other.map(|(_, v)| *v));
}

/// Run the benchmark and write `<out>/<stem>.json`, `.md` and the charts; returns the report.
pub async fn run_bench(cfg: &BenchConfig, stem: &str) -> Result<Report, RunError> {
    let (scs, routers) = select(cfg)?;
    let runs_dir = cfg.out_dir.join("runs").join(stem);
    std::fs::create_dir_all(&runs_dir).map_err(|source| RunError::Io {
        path: runs_dir.display().to_string(),
        source,
    })?;
    let mode_name = if cfg.mode.quick { "quick" } else { "full" };
    let seeds: Vec<u64> = (0..cfg.seeds.max(1) as u64)
        .map(|i| cfg.mode.seed + i)
        .collect();
    let setup = format!(
        "One machine runs everything: Envoy (2 workers) or, for the peer routers (SMG 1.13, vllm-router 0.1.17: their documented defaults, retries and circuit breakers as they ship), the peer instead of Envoy; the model-sim pods (one process each, speed-up {}), the sidecar (filter runs) and this load generator. Per-process CPU use is in the JSON (`cpu_cores_*`; `cpu_cores_router` for a peer).",
        cfg.mode.speedup
    );
    let proto = scs
        .first()
        .map(|sc| {
            Windows::for_scenario(sc, &cfg.mode, seeds.len(), false)
        })
        .map(|w| {
            format!(
                "Figures are in emulated time (wall latencies × speed-up, rates ÷ speed-up; step lateness in wall ms). Protocol: per run the scenario's warm-up ({:.1} s wall for `{}`; identical traffic for every router, excluded), its measurement window ({:.1} s wall; in full mode at least 2,000 arrivals over the seeds), then {:.1} s more arrivals so window requests finish under load; failed and timed-out requests count as ∞ in percentiles; a run whose worst pod's mean step lateness exceeds 5 % of its TTFT p50 is invalid and left out. Seeds {:?} per (scenario, router), run seed-major (every router for a seed before the next seed). Ratios: per seed, over the seeds both routers have valid runs for; the point is their geometric mean, the interval the Student-t 95 % interval of the per-seed log-ratios{}. Goodput: bisection over the offered rate (×2 / ÷2 to bracket, then geometric halving to 10 %, ≤ 8 probes, seed {}); swept: {}; fixed load at {:.0} % of round robin's goodput where swept, else the scenario's nominal rate.",
                w.warmup.as_secs_f64(),
                sc_name(&scs),
                w.window.as_secs_f64(),
                w.tail.as_secs_f64(),
                seeds,
                if seeds.len() < 2 {
                    " — one seed gives no interval: every ratio here is a direction, not a verdict"
                } else if seeds.len() < 10 {
                    " — fewer than 10 seeds: directions, not verdicts"
                } else {
                    ""
                },
                cfg.mode.seed,
                if cfg.sweep.is_empty() {
                    "none".to_string()
                } else {
                    cfg.sweep.join(", ")
                },
                cfg.load_fraction * 100.0
            )
        })
        .unwrap_or_default()
        + &cfg
            .load_of_capacity
            .map(|f| {
                format!(
                    " This run: the scenarios not swept at {:.0} % of their fleet's measured capacity (`--load`), not their nominal rate.",
                    f * 100.0
                )
            })
            .unwrap_or_default();
    eprintln!("bench: {}", plan(cfg, &scs, &routers, seeds.len()));
    let mut rep = Report {
        machine: Machine::detect(envoy_version(), setup),
        mode: mode_name.into(),
        protocol: proto,
        seeds: seeds.clone(),
        ..Report::default()
    };
    for base in &scs {
        let name = base.name;
        let routers_here: Vec<RouterKind> = routers
            .iter()
            .copied()
            .filter(|r| *r != RouterKind::WeightedRr || heterogeneous(&base.fleet))
            .collect();
        if routers_here.len() < routers.len() {
            rep.notes.push(format!(
                "{name}: weighted_rr not run (uniform fleet: equal weights = round_robin)"
            ));
        }
        // Scenario figures are wall clock; the report is in emulated time (× / ÷ speed-up;
        // 1 for real pods).
        let k = base.fleet.speedup.max(0.01);
        let nominal = base.rate_rps / k;
        let mut entry = ScenarioResult {
            floor_ms: base.floor_ms * k,
            slo_ttft_ms: base.slo_ttft_ms * k,
            condition: format!("{:?}", base.condition),
            offered_rps: nominal,
            load_basis: "nominal rate of the scenario".into(),
            card: base.card.to_string(),
            ..ScenarioResult::default()
        };
        if cfg.sweep.iter().any(|s| s == name) {
            eprintln!(
                "bench: scenario {name}: goodput sweep (SLO TTFT p95 ≤ {} ms)",
                base.slo_ttft_ms * k
            );
            let mut g = sweep(name, cfg.mode, &routers_here, &runs_dir).await?;
            goodput_ratios(&mut g);
            let gp = goodputs(&g);
            match gp.get("round_robin") {
                Some(rr) if *rr > 0.0 => {
                    entry.offered_rps = cfg.load_fraction * rr;
                    entry.load_basis = format!(
                        "{:.0} % of round robin's goodput ({rr:.2} req/s)",
                        cfg.load_fraction * 100.0
                    );
                }
                _ => rep.notes.push(format!(
                    "{name}: round robin's goodput unknown or 0: fixed load at the nominal rate"
                )),
            }
            entry.goodput = Some(g);
        } else if let Some(f) = cfg.load_of_capacity {
            entry.offered_rps = f * base.capacity_rps / k;
            entry.load_of_capacity = Some(f);
            entry.load_basis = format!(
                "{:.0} % of the fleet's measured capacity ({:.2} req/s)",
                f * 100.0,
                base.capacity_rps / k
            );
        }
        let mut runs: BTreeMap<&'static str, Vec<RunOutcome>> = BTreeMap::new();
        let mut floors: BTreeMap<u64, RunData> = BTreeMap::new();
        let mut windows = None;
        let mut cold = Vec::new();
        for seed in &seeds {
            let mode = Mode {
                seed: *seed,
                ..cfg.mode
            };
            let Some(sc) = scenario_at(name, mode, entry.offered_rps * k) else {
                continue;
            };
            let w = Windows::for_scenario(&sc, &mode, seeds.len(), false);
            windows = Some(w);
            let mut wl = sc.workload.clone();
            wl.horizon = w.warmup + w.window + w.tail;
            wl.max_requests = wl.max_requests.max(1_000_000);
            let reqs = generate(&wl);
            // On real pods the floor is their model-sim twin's, calibrated on another machine:
            // no bound for these pods, so no floor rows.
            if sc.fleet.engine == PodEngine::ModelSim {
                floors.insert(*seed, floor_run(&sc, &reqs, k));
            }
            cold.push(sc.cold_read_fraction());
            eprintln!(
                "bench: scenario {name} seed {seed} — {} ({} requests, {:.2} req/s)",
                sc.about,
                reqs.len(),
                entry.offered_rps
            );
            for r in &routers_here {
                match run_windowed(&sc, *r, w).await {
                    Ok(o) => {
                        eprintln!(
                            "bench:   {:<20} TTFT p50 {:>8.1} p95 {:>8.1} p99 {:>8.1} ms, {:.2} req/s, errors {:.2} %{}",
                            r.name(),
                            o.summary.ttft_p50_ms,
                            o.summary.ttft_p95_ms,
                            o.summary.ttft_p99_ms,
                            o.summary.throughput_rps,
                            o.summary.error_rate * 100.0,
                            o.invalid.as_deref().map(|i| format!(" — INVALID: {i}")).unwrap_or_default()
                        );
                        write(
                            &runs_dir.join(format!("{name}-{}-seed{seed}.csv", r.name())),
                            samples_csv(&o.result).as_bytes(),
                        )?;
                        runs.entry(r.name()).or_default().push(o);
                    }
                    Err(e) => {
                        eprintln!("bench:   {} failed: {e}", r.name());
                        rep.notes.push(format!(
                            "{name} / {} / seed {seed}: not measured: {e}",
                            r.name()
                        ));
                    }
                }
            }
        }
        let Some(w) = windows else {
            continue;
        };
        let cold: Vec<f64> = cold.into_iter().filter(|c| !c.is_nan()).collect();
        entry.cold_read_fraction =
            (!cold.is_empty()).then(|| cold.iter().sum::<f64>() / cold.len() as f64);
        let gp = entry.goodput.as_ref().map(goodputs).unwrap_or_default();
        for (r, outcomes) in &runs {
            if let Some(mut sum) = aggregate(outcomes, w, entry.offered_rps) {
                sum.goodput_rps = gp.get(*r).copied();
                entry.insert(r.to_string(), sum);
            }
        }
        let diags: BTreeMap<String, Diagnostics> = entry
            .iter()
            .filter_map(|(r, s)| Some((r.clone(), s.diagnostics.clone()?)))
            .collect();
        entry.condition_met = condition_met(
            &base.condition,
            &diags,
            entry.cold_read_fraction.unwrap_or(f64::NAN),
        );
        entry.best_other = crate::report::best_other(&entry, "ttft_p95_ms");
        rep.ratios.extend(scenario_ratios(name, &runs));
        rep.ratios.extend(floor_ratios(name, &floors, &runs));
        rep.scenarios.insert(name.to_string(), entry);
    }
    rep.targets = check_targets(&rep.scenarios, &rep.ratios);
    rep.ci_widths = crate::report::ci_width_summary(&rep);
    for (metric, c) in &rep.ci_widths {
        eprintln!(
            "bench: interval widths {metric}: {} ratios, median {:.0} %, widest {:.0} %",
            c.ratios,
            c.median * 100.0,
            c.widest * 100.0
        );
    }
    if cfg.overhead {
        eprintln!("bench: overhead (direct, Envoy, Envoy + filter, Envoy + ext_proc floor; instant backend)");
        let opts = crate::experiments::overhead::OverheadOptions {
            latency_requests: if cfg.mode.quick { 400 } else { 2000 },
            rps_duration: Duration::from_secs(if cfg.mode.quick { 1 } else { 5 }),
            ..crate::experiments::overhead::OverheadOptions::default()
        };
        match crate::experiments::overhead::run(opts).await {
            Ok(o) => {
                rep.overhead = o.cases;
                rep.overhead_arms = o.arms;
                rep.notes
                    .extend(o.notes.into_iter().map(|n| format!("overhead: {n}")));
                if !o.snapshot {
                    rep.notes.push("overhead: the filter had no snapshot (sidecar push did not arrive); its arm measured the fallback path".into());
                }
            }
            Err(e) => rep.notes.push(format!("overhead not measured: {e}")),
        }
    }
    if cfg.overhead {
        eprintln!("bench: sidecar cost (100 metrics-only pods, 50 ms interval)");
        let window = Duration::from_secs(if cfg.mode.quick { 5 } else { 15 });
        match crate::experiments::sidecar_cost::measure(100, window).await {
            Ok(c) => rep.sidecar = serde_json::to_value(&c).ok(),
            Err(e) => rep.notes.push(format!("sidecar cost not measured: {e}")),
        }
    }
    write_outputs(&rep, &cfg.out_dir, stem)?;
    Ok(rep)
}

/// Seconds of wall time a run costs beyond its arrivals (stack start, snapshot wait, drain of
/// the last requests, stop): ~2–3 s observed on this 2-core machine (a whole quick run took
/// 306 s for 25 runs of ~8.4 s of arrivals plus ~40 s of overhead benches), rounded up.
const RUN_OVERHEAD_S: f64 = 4.0;

/// The run plan and its estimated wall time.
pub fn plan(cfg: &BenchConfig, scs: &[Scenario], routers: &[RouterKind], seeds: usize) -> String {
    let (mut runs, mut probes, mut secs) = (0usize, 0usize, 0.0);
    for sc in scs {
        let w = Windows::for_scenario(sc, &cfg.mode, seeds, false);
        let per = (w.warmup + w.window + w.tail).as_secs_f64() + RUN_OVERHEAD_S;
        let wp = Windows::for_scenario(sc, &cfg.mode, 1, true);
        let per_probe = (wp.warmup + wp.window + wp.tail).as_secs_f64() + RUN_OVERHEAD_S;
        let n = routers
            .iter()
            .filter(|r| **r != RouterKind::WeightedRr || heterogeneous(&sc.fleet))
            .count();
        runs += n * seeds;
        secs += (n * seeds) as f64 * per;
        if sc.fleet.engine == PodEngine::Vllm {
            // The real fleet's start, once per scenario (30-45 s quiet; minutes when loaded),
            // and each run's drain and cache reset.
            secs += 60.0 + (n * seeds) as f64 * 5.0;
        }
        if cfg.sweep.iter().any(|x| x == sc.name) {
            // A bisection to 10 % typically takes 5-7 probes (≤ 8).
            probes += 6 * n;
            secs += (6 * n) as f64 * per_probe;
        }
    }
    if cfg.overhead {
        // Overhead (4 arms × 4 sizes: ~25 s quick, ~2 min full) and sidecar cost (5 s / 15 s).
        secs += if cfg.mode.quick { 45.0 } else { 150.0 };
    }
    let real = scs
        .iter()
        .filter(|s| s.fleet.engine == PodEngine::Vllm)
        .count();
    let mut text = format!(
        "plan: {runs} fixed-load runs ({seeds} seed(s)) + ~{probes} sweep probes, speed-up {}{}: about {:.0} min",
        cfg.mode.speedup,
        if real > 0 {
            format!(" ({real} scenario(s) on real vLLM pods: speed-up 1)")
        } else {
            String::new()
        },
        secs / 60.0
    );
    // Workload-only figures, known before any run (the fixed-load rate is the nominal one
    // unless the scenario is swept).
    for sc in scs.iter().filter(|s| !s.adapters.is_empty()) {
        let floors: Vec<String> = (0..seeds.max(1) as u64)
            .filter_map(|i| {
                let mode = Mode {
                    seed: cfg.mode.seed + i,
                    ..cfg.mode
                };
                let sc = scenario(sc.name, mode)?;
                let w = Windows::for_scenario(&sc, &mode, seeds, false);
                let mut wl = sc.workload.clone();
                wl.horizon = w.warmup + w.window + w.tail;
                wl.max_requests = wl.max_requests.max(1_000_000);
                let from = w.warmup.as_secs_f64() * 1000.0;
                let to = (w.warmup + w.window).as_secs_f64() * 1000.0;
                Some(adapter_floor(&sc, &generate(&wl), from, to).to_string())
            })
            .collect();
        let _ = write!(
            text,
            "\n{}: adapter-load floor in the window (Belady over the fleet's GPU slots) per seed: {}",
            sc.name,
            floors.join(", ")
        );
    }
    text
}

fn sc_name(scs: &[Scenario]) -> &'static str {
    scs.first().map_or("", |s| s.name)
}

/// Write `<stem>.json`, `<stem>.md`, `<stem>-ttft.png` and one `<stem>-goodput-<scenario>.png`
/// per swept scenario into `out`.
pub fn write_outputs(rep: &Report, out: &Path, stem: &str) -> Result<(), RunError> {
    std::fs::create_dir_all(out).map_err(|source| RunError::Io {
        path: out.display().to_string(),
        source,
    })?;
    let json = serde_json::to_vec_pretty(rep).unwrap_or_default();
    write(&out.join(format!("{stem}.json")), &json)?;
    // The chart sits beside the report and is linked by its name, so a report copied into
    // `results/` with its chart keeps a working link (a machine's path did not).
    let png_name = format!("{stem}-ttft.png");
    let png = out.join(&png_name);
    let mut md = markdown(rep);
    match crate::report::chart::ttft_chart(rep, &png) {
        Ok(text) => {
            let _ = writeln!(
                md,
                "\nChart: [`{png_name}`]({png_name}){}",
                if text {
                    ""
                } else {
                    " (no font found: drawn without labels)"
                }
            );
        }
        Err(e) => {
            let _ = writeln!(md, "\nChart not drawn: {e}");
        }
    }
    for (name, sc) in &rep.scenarios {
        let Some(g) = &sc.goodput else {
            continue;
        };
        let curve = format!("{stem}-goodput-{name}.png");
        match crate::report::chart::goodput_chart(name, g, &out.join(&curve)) {
            Ok(_) => {
                let _ = writeln!(md, "Goodput curve `{name}`: [`{curve}`]({curve})");
            }
            Err(e) => {
                let _ = writeln!(md, "Goodput chart `{name}` not drawn: {e}");
            }
        }
    }
    write(&out.join(format!("{stem}.md")), md.as_bytes())?;
    Ok(())
}

/// `bench run`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// CI-sized: every scenario in a few minutes.
    #[arg(long)]
    quick: bool,
    /// Only these scenarios (repeatable): mixed_gpu bursty shared_prefix lora uniform long_prompt.
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Only these routers (repeatable): round_robin least_request least_request_full
    /// weighted_rr filter (default set), filter_gaie_weights, filter_x2, filter_x4 and filter_x2_nohub (extras: gateway replicas with a metrics hub, and two without), and
    /// the field's routers smg_cache_aware smg_least_load smg_power_of_two smg_prefix_hash
    /// vllm_router_cache_aware vllm_router_power_of_two (run by default; `./build.sh setup`
    /// installs them).
    #[arg(long = "router")]
    routers: Vec<String>,
    /// Emulator speed-up (rates and windows scale with it). Default: the scenarios'
    /// QUICK_SPEEDUP / FULL_SPEEDUP.
    #[arg(long)]
    speedup: Option<f64>,
    /// First workload seed (seeds are SEED, SEED+1, ...).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Seeds per (scenario, router). Default: 1 quick, 10 full (a verdict needs ten: confidence.rs).
    #[arg(long)]
    seeds: Option<usize>,
    /// Goodput sweep for these scenarios (repeatable). Default: none quick; mixed_gpu full.
    #[arg(long = "sweep")]
    sweep: Vec<String>,
    /// No goodput sweep at all.
    #[arg(long, conflicts_with = "sweep")]
    no_sweep: bool,
    /// Print the run plan and its estimated duration, run nothing.
    #[arg(long)]
    plan: bool,
    /// Skip the overhead bench.
    #[arg(long)]
    no_overhead: bool,
    /// Offer this fraction of each scenario's measured fleet capacity instead of its nominal
    /// rate (a load sweep's point: run 0.3, 0.5, 0.8 and 1.1, then `bench load-chart`).
    #[arg(long, value_parser = positive_fraction)]
    load: Option<f64>,
}

/// A load of `--load`: a finite number above 0 (at most 4: four times the capacity).
fn positive_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 4.0 => Ok(f),
        _ => Err(format!("{s}: a fraction of the capacity in (0, 4]")),
    }
}

/// `bench run`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        quick,
        scenarios,
        routers,
        speedup,
        seed,
        seeds,
        sweep,
        no_sweep,
        plan,
        no_overhead,
        load,
    } = args;
    let partial = !scenarios.is_empty() || !routers.is_empty();
    let mode = Mode {
        quick,
        speedup: speedup.unwrap_or(if quick {
            crate::experiments::scenarios::QUICK_SPEEDUP
        } else {
            crate::experiments::scenarios::FULL_SPEEDUP
        }),
        seed,
    };
    let mut cfg = BenchConfig::defaults(mode, out_dir.to_path_buf());
    cfg.seeds = seeds.unwrap_or(cfg.seeds);
    cfg.load_of_capacity = load;
    if no_sweep {
        cfg.sweep.clear();
    } else if !sweep.is_empty() {
        cfg.sweep = sweep;
    }
    if !scenarios.is_empty() {
        cfg.sweep.retain(|s| scenarios.contains(s));
    }
    cfg.scenarios = scenarios;
    cfg.routers = routers;
    cfg.overhead = !no_overhead && !partial;
    if plan {
        return match select(&cfg) {
            Ok((scs, routers)) => {
                println!("{}", self::plan(&cfg, &scs, &routers, cfg.seeds.max(1)));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A real pod's speed is this machine's: measure it first where not yet done.
    let names: Vec<&str> = cfg.scenarios.iter().map(String::as_str).collect();
    if let Err(e) = crate::experiments::calibrate::ensure_real_capacities(&names).await {
        eprintln!("bench: measuring real-pod capacities: {e}");
        return ExitCode::FAILURE;
    }
    let stem = match (quick, partial) {
        (true, false) => "quick",
        (false, false) => "latest",
        (true, true) => "quick-partial",
        (false, true) => "latest-partial",
    };
    match run_bench(&cfg, stem).await {
        Ok(rep) => {
            println!("{}", markdown(&rep));
            println!(
                "Results: {0}/{stem}.json, {0}/{stem}.md, chart {0}/{stem}-ttft.png",
                out_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::client::Outcome;
    use crate::loadgen::Sample;

    #[test]
    fn reads_own_cpu_time() {
        let a = cpu_seconds("self").unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let b = cpu_seconds("self").unwrap();
        assert!(b >= a);
        assert!(cpu_seconds("no-such-pid").is_none());
    }

    #[test]
    fn csv_has_one_row_per_sample() {
        let r = RunResult {
            samples: vec![Sample {
                id: 3,
                model: "m".into(),
                at_ms: 1.0,
                lag_ms: 0.0,
                tag: None,
                group: None,
                outcome: Outcome {
                    status: 503,
                    error: Some("status 503: a, b\nc".into()),
                    ..Outcome::default()
                },
            }],
            wall_s: 1.0,
        };
        let csv = samples_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[1].starts_with("3,m,1.0,0.0,503,"));
    }

    #[test]
    fn selection_rejects_unknown_names() {
        let mut cfg = BenchConfig::defaults(
            Mode {
                quick: true,
                speedup: 1.0,
                seed: 1,
            },
            PathBuf::from("/nonexistent"),
        );
        let (s, r) = select(&cfg).unwrap();
        assert_eq!(s.len(), 6);
        // Quick: round_robin, least_request, weighted_rr, filter, smg_cache_aware.
        assert_eq!(r.len(), 5);
        assert!(!r.contains(&RouterKind::FilterGaieWeights));
        assert!(!r.contains(&RouterKind::FilterReplicas));
        assert!(!r.contains(&RouterKind::LeastRequestFull));
        assert_eq!(r[4], RouterKind::SmgCacheAware);
        cfg.mode.quick = false;
        // Full: the five of ALL, then the six peers.
        let full = select(&cfg).unwrap().1;
        assert_eq!(full.len(), 11);
        assert_eq!(full[5..], RouterKind::PEERS);
        cfg.mode.quick = true;
        cfg.routers = vec!["vllm_router_power_of_two".into()];
        assert_eq!(select(&cfg).unwrap().1, [RouterKind::VllmRouterPowerOfTwo]);
        cfg.routers = vec![];
        cfg.mode.quick = true;
        cfg.sweep = vec!["nope".into()];
        assert!(matches!(
            select(&cfg),
            Err(RunError::Unknown {
                what: "scenario",
                ..
            })
        ));
        cfg.sweep = vec![];
        cfg.scenarios = vec!["lora".into()];
        cfg.routers = vec!["filter".into()];
        let (s, r) = select(&cfg).unwrap();
        assert_eq!((s[0].name, r[0]), ("lora", RouterKind::Filter));
        cfg.routers = vec!["magic".into()];
        assert!(matches!(
            select(&cfg),
            Err(RunError::Unknown { what: "router", .. })
        ));
    }

    fn outcome(seed: u64, ttfts: &[f64], invalid: Option<&str>) -> RunOutcome {
        let samples: Vec<Sample> = ttfts
            .iter()
            .enumerate()
            .map(|(i, t)| Sample {
                id: i as u64,
                model: "m".into(),
                at_ms: 1000.0 + i as f64,
                lag_ms: 0.0,
                tag: None,
                group: None,
                outcome: Outcome {
                    status: 200,
                    ttft_ms: Some(*t),
                    e2e_ms: 2.0 * t,
                    output_tokens: Some(1),
                    pod: Some("pod0 (a10g)".into()),
                    ..Outcome::default()
                },
            })
            .collect();
        let result = RunResult {
            samples,
            wall_s: 10.0,
        };
        let summary = summarize(&result);
        RunOutcome {
            seed,
            data: RunData {
                seed,
                obs: ttfts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        (
                            i as u64,
                            Obs {
                                ttft_ms: *t,
                                e2e_ms: 2.0 * t,
                                ok: true,
                                tokens: 1.0,
                            },
                        )
                    })
                    .collect(),
                window_s: 10.0,
                scalars: BTreeMap::new(),
            },
            summary,
            pods: vec![("pod0 (a10g)".into(), PodWindow::default())],
            prefix: None,
            stats_reset: true,
            window: result.samples.clone(),
            result,
            invalid: invalid.map(str::to_string),
        }
    }

    #[test]
    fn invalid_runs_are_left_out_of_figures_and_ratios() {
        let w = Windows {
            warmup: Duration::from_secs(1),
            window: Duration::from_secs(10),
            tail: Duration::ZERO,
        };
        let runs = vec![
            outcome(1, &[100.0; 20], None),
            outcome(2, &[5000.0; 20], Some("step lateness 9 ms > 5 %")),
        ];
        let s = aggregate(&runs, w, 3.0).unwrap();
        assert_eq!(s.ttft_p99_ms, 100.0);
        assert_eq!(s.requests, 20);
        let d = s.diagnostics.unwrap();
        assert_eq!(d.seeds, [1]);
        assert_eq!(d.invalid_runs[0].seed, 2);
        assert_eq!(d.offered_rps, 3.0);
        // Every run invalid: no figures, the diagnostics say why.
        let none = aggregate(&runs[1..], w, 3.0).unwrap();
        assert!(none.ttft_p50_ms.is_nan());
        assert_eq!(none.diagnostics.unwrap().invalid_runs.len(), 1);
        // Ratios use only seeds valid for both routers.
        let mut by: BTreeMap<&'static str, Vec<RunOutcome>> = BTreeMap::new();
        by.insert(
            "round_robin",
            vec![
                outcome(1, &[200.0; 20], None),
                outcome(2, &[200.0; 20], None),
            ],
        );
        by.insert("filter", runs);
        let rows = scenario_ratios("uniform", &by);
        let p95 = rows
            .iter()
            .find(|r| r.router == "filter" && r.metric == "ttft_p95_ms")
            .unwrap();
        assert_eq!((p95.seeds, p95.ratio), (1, Some(0.5)));
        // One seed: a direction, no interval; the seed's own ratio kept for pooling.
        assert_eq!(p95.ci95, None);
        assert_eq!(
            p95.per_seed,
            [SeedRatio {
                seed: 1,
                ratio: Some(0.5)
            }]
        );
    }

    #[test]
    fn the_floor_is_compared_with_every_other_router_on_its_seeds_and_requests() {
        // Floor runs: 50 ms for every request of seeds 1 and 2 (ids 0..20), plus a request the
        // routers never saw (id 99), which the pairing must leave out.
        let floor = |seed: u64| {
            let mut d = outcome(seed, &[50.0; 20], None).data;
            d.obs.insert(
                99,
                Obs {
                    ttft_ms: 1e6,
                    e2e_ms: 1e6,
                    ok: true,
                    tokens: 1.0,
                },
            );
            d
        };
        let floors: BTreeMap<u64, RunData> = [(1, floor(1)), (2, floor(2))].into();
        let mut by: BTreeMap<&'static str, Vec<RunOutcome>> = BTreeMap::new();
        by.insert(
            "round_robin",
            vec![
                outcome(1, &[100.0; 20], None),
                outcome(2, &[200.0; 20], None),
            ],
        );
        // An invalid seed is left out, as it is of the routers' own ratios.
        by.insert(
            "least_request_full",
            vec![
                outcome(1, &[50.0; 20], None),
                outcome(2, &[10.0; 20], Some("late")),
            ],
        );
        by.insert("filter", vec![outcome(1, &[60.0; 20], None)]);
        let rows = floor_ratios("bursty", &floors, &by);
        assert!(rows
            .iter()
            .all(|r| r.router == FLOOR && r.baseline != "filter"));
        assert_eq!(rows.len(), 2 * FLOOR_METRICS.len());
        let get = |b: &str| {
            rows.iter()
                .find(|r| r.baseline == b && r.metric == "ttft_p95_ms")
                .unwrap()
        };
        let rr = get("round_robin");
        assert_eq!(rr.seeds, 2);
        let per: Vec<Option<f64>> = rr.per_seed.iter().map(|x| x.ratio).collect();
        assert_eq!(per, [Some(0.5), Some(0.25)]);
        assert!((rr.ratio.unwrap() - (0.5f64 * 0.25).sqrt()).abs() < 1e-12);
        let lr = get("least_request_full");
        assert_eq!((lr.seeds, lr.ratio), (1, Some(1.0)));
    }

    #[test]
    fn a_seeds_floor_run_holds_its_requests_in_emulated_ms() {
        let sc = scenario("uniform", Mode::quick(42)).unwrap();
        let reqs = generate(&sc.workload);
        let k = sc.fleet.speedup;
        let d = floor_run(&sc, &reqs, k);
        assert_eq!(d.seed, 42);
        assert!(!d.obs.is_empty() && d.obs.len() <= reqs.len());
        assert!(d.obs.keys().all(|id| reqs.iter().any(|r| r.id == *id)));
        // The scenario's floor (wall ms, from the warm-up on) is the same computation.
        let after: Vec<f64> = reqs
            .iter()
            .filter(|r| r.at >= sc.warmup)
            .filter_map(|r| d.obs.get(&r.id).map(|o| o.ttft_ms / k))
            .collect();
        let p95 = crate::analysis::stats::percentile(&after, 95.0);
        assert!((p95 - sc.floor_ms).abs() < 1e-6, "{p95} vs {}", sc.floor_ms);
    }

    #[test]
    fn each_seeds_own_ratio_is_kept_with_its_seed() {
        let mut by: BTreeMap<&'static str, Vec<RunOutcome>> = BTreeMap::new();
        by.insert(
            "round_robin",
            vec![
                outcome(7, &[200.0; 20], None),
                outcome(3, &[400.0; 20], None),
                outcome(5, &[100.0; 20], None),
            ],
        );
        by.insert(
            "filter",
            vec![
                outcome(3, &[100.0; 20], None),
                outcome(7, &[150.0; 20], None),
            ],
        );
        let rows = scenario_ratios("uniform", &by);
        let p95 = rows
            .iter()
            .find(|r| r.router == "filter" && r.metric == "ttft_p95_ms")
            .unwrap();
        let got: Vec<(u64, f64)> = p95
            .per_seed
            .iter()
            .map(|s| (s.seed, s.ratio.unwrap()))
            .collect();
        assert_eq!(got, [(3, 0.25), (7, 0.75)]);
        // The point is their geometric mean.
        assert!((p95.ratio.unwrap() - (0.25f64 * 0.75).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn the_filter_routers_are_compared_with_every_other_router() {
        let mut by: BTreeMap<&'static str, Vec<RunOutcome>> = BTreeMap::new();
        by.insert("round_robin", vec![outcome(1, &[400.0; 20], None)]);
        by.insert("weighted_rr", vec![outcome(1, &[250.0; 20], None)]);
        by.insert("filter", vec![outcome(1, &[100.0; 20], None)]);
        by.insert("filter_x2", vec![outcome(1, &[110.0; 20], None)]);
        by.insert("smg_cache_aware", vec![outcome(1, &[200.0; 20], None)]);
        by.insert(
            "vllm_router_cache_aware",
            vec![outcome(1, &[300.0; 20], None)],
        );
        let rows = scenario_ratios("shared_prefix", &by);
        let against =
            |b: &str| -> Vec<&RatioRow> { rows.iter().filter(|r| r.baseline == b).collect() };
        // Envoy's weighted round robin is an "other" router like the field's.
        for b in ["smg_cache_aware", "vllm_router_cache_aware", "weighted_rr"] {
            let v = against(b);
            assert!(
                !v.is_empty() && v.iter().all(|r| r.router == "filter"),
                "{b}"
            );
        }
        let p95 = against("smg_cache_aware")
            .into_iter()
            .find(|r| r.metric == "ttft_p95_ms")
            .unwrap();
        assert_eq!(p95.ratio, Some(0.5));
        // Replicas are compared with the one gateway, everyone with round robin, nobody with a
        // replica router.
        assert!(against("filter").iter().all(|r| r.router == "filter_x2"));
        assert!(rows
            .iter()
            .any(|r| r.router == "vllm_router_cache_aware" && r.baseline == "round_robin"));
        assert!(against("filter_x2").is_empty());
    }

    #[test]
    fn goodput_from_probes_and_its_ratios() {
        let p = |rate: f64, passed: bool| Probe {
            rate_rps: rate,
            ttft_p95_ms: 1.0,
            error_rate: 0.0,
            passed,
            invalid: None,
        };
        let mut g = GoodputSweep::default();
        g.probes.insert(
            "round_robin".into(),
            vec![p(4.0, true), p(8.0, false), p(5.6, true)],
        );
        g.probes.insert(
            "least_request".into(),
            vec![p(4.0, true), p(8.0, true), p(16.0, false)],
        );
        // A pass above a fail (noise) does not count.
        g.probes.insert(
            "filter".into(),
            vec![
                p(4.0, true),
                p(8.0, true),
                p(16.0, false),
                p(11.3, false),
                p(20.0, true),
            ],
        );
        g.probes.insert(
            "weighted_rr".into(),
            vec![Probe {
                ttft_p95_ms: f64::NAN,
                ..p(4.0, false)
            }],
        );
        let gp = goodputs(&g);
        assert!(!gp.contains_key("weighted_rr"));
        assert_eq!(gp["round_robin"], 5.6);
        assert_eq!(gp["filter"], 8.0);
        goodput_ratios(&mut g);
        assert!((g.filter_vs_round_robin.unwrap() - 8.0 / 5.6).abs() < 1e-12);
        assert_eq!(g.best_baseline.as_deref(), Some("least_request"));
        assert_eq!(g.filter_vs_best_baseline, Some(1.0));
    }

    #[test]
    fn windows_come_from_the_scenario() {
        let m = |quick, speedup| Mode {
            quick,
            speedup,
            seed: 1,
        };
        let mut sc = scenario("uniform", m(false, 2.0)).unwrap();
        // A scenario with a 10 s warm-up and a 40 s window at 10 req/s (wall clock).
        sc.warmup = Duration::from_secs(10);
        sc.workload.horizon = Duration::from_secs(50);
        sc.rate_rps = 10.0;
        // Quick: the scenario's window; tail 2 emulated s = 1 s at speed-up 2.
        let q = Windows::for_scenario(&sc, &m(true, 2.0), 1, false);
        assert_eq!(
            (q.warmup, q.window, q.tail),
            (
                Duration::from_secs(10),
                Duration::from_secs(40),
                Duration::from_secs(1)
            )
        );
        // Full, 8 seeds: 250 arrivals at 10 req/s = 25 s; tail 5 emulated s = 2.5 s.
        let w = Windows::for_scenario(&sc, &m(false, 2.0), 8, false);
        assert!((w.window.as_secs_f64() - 25.0).abs() < 1e-6);
        assert_eq!(w.tail, Duration::from_millis(2500));
        // 2 seeds would need 100 s: capped at the budget's 45 s.
        let w = Windows::for_scenario(&sc, &m(false, 2.0), 2, false);
        assert_eq!(w.window.as_secs_f64(), MAX_WINDOW_S);
        // At least 30 emulated seconds (15 s wall at speed-up 2) even at high rates.
        sc.rate_rps = 1000.0;
        let w = Windows::for_scenario(&sc, &m(false, 2.0), 5, false);
        assert_eq!(w.window, Duration::from_secs(15));
        // Bursty: whole cycles, ≥ 2 bursts per run with 5 seeds (10 in all), 1 for a probe.
        sc.workload.arrival = crate::loadgen::arrivals::Arrival::Bursty {
            on_rate: 2000.0,
            off_rate: 10.0,
            on_s: 5.0,
            off_s: 10.0,
        };
        let w = Windows::for_scenario(&sc, &m(false, 2.0), 5, false);
        assert_eq!(w.window, Duration::from_secs(30));
        let w = Windows::for_scenario(&sc, &m(false, 2.0), 1, true);
        assert_eq!(w.window, Duration::from_secs(15));
        assert_eq!(Windows::min_requests(&m(false, 1.0), 5, false), 400);
        assert_eq!(Windows::min_requests(&m(false, 1.0), 1, true), 400);
        assert_eq!(Windows::min_requests(&m(true, 1.0), 5, false), 0);
    }

    #[test]
    fn cold_long_reads_count_answers_that_prefilled_more_than_a_system_prompt() {
        let read = |prompt: Option<u64>, cached: Option<u64>| Sample {
            id: 0,
            model: "m".into(),
            at_ms: 0.0,
            lag_ms: 0.0,
            tag: None,
            group: Some(1),
            outcome: Outcome {
                status: 200,
                prompt_tokens: prompt,
                cached_tokens: cached,
                ..Outcome::default()
            },
        };
        let samples = [
            read(Some(4_200), Some(0)),     // a document read cold
            read(Some(4_200), Some(4_000)), // the same, cached
            read(Some(1_501), Some(0)),     // just over a system prompt
            read(Some(1_500), Some(0)),     // a system prompt alone: not long
            read(Some(9_000), Some(7_400)), // a conversation missing 1,600 tokens
            read(None, None),               // failed: nothing reported
        ];
        assert_eq!(cold_long_reads(&samples), Some(3));
        assert_eq!(cold_long_reads(&[read(Some(4_000), None)]), None);
        assert_eq!(cold_long_reads(&[]), None);
    }
}
