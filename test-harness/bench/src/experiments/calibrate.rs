//! `bench calibrate`: the saturation throughput of one emulated pod, measured directly (no
//! Envoy) with a closed loop of many clients, so scenario load levels can be set from pod
//! capacity rather than from any router's results. `--scenario NAME` measures one pod of each
//! profile of that scenario's fleet on the scenario's own requests.

use crate::loadgen::arrivals::Arrival;
use crate::loadgen::client::{http_client, send};
use crate::loadgen::workload::{generate, Prompts, Range, RequestSpec, WorkloadSpec};
use crate::stack::fleet::{FleetSpec, PodEngine, PodSpec};
use crate::stack::start_pods;
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
        model: crate::stack::fleet::MODEL.into(),
        prompts: Prompts::Independent {
            prompt_tokens,
            max_tokens,
        },
        tagging: None,
    });
    let fleet = FleetSpec {
        pods: vec![PodSpec::new(profile)],
        speedup: 1.0,
        seed: 1,
        engine: PodEngine::ModelSim,
        admission: None,
    };
    measure(&fleet, &[], reqs, concurrency, secs).await
}

/// Offered rate of the prompts a capacity measurement draws from when the scenario has no
/// nominal rate yet (wall req/s; only the number of distinct bodies depends on it).
const CAPACITY_PROMPTS_RPS: f64 = 10.0;

/// Measure one pod of each profile of scenario `name`'s fleet (its first pod of that profile,
/// at the scenario's quick-mode speed-up) on the scenario's own requests, in order.
/// `twin`: measure a real scenario's pods as their model-sim twins instead (the emulator's
/// capacity on the same requests, to compare with the real one).
pub async fn scenario_capacity(
    name: &str,
    concurrency: usize,
    secs: u64,
    twin: bool,
) -> Result<Vec<Capacity>, String> {
    let mode = crate::experiments::scenarios::Mode {
        quick: false,
        ..crate::experiments::scenarios::Mode::quick(7)
    };
    let sc = crate::experiments::scenarios::scenario(name, mode)
        .ok_or_else(|| format!("no scenario {name}"))?;
    let mut reqs = generate(&sc.workload);
    if reqs.is_empty() {
        // A scenario whose pods were never measured has no nominal rate yet: its prompts at
        // any rate are the same kind (the closed loop only draws bodies from them).
        let at = crate::experiments::scenarios::scenario_at(name, mode, CAPACITY_PROMPTS_RPS)
            .ok_or_else(|| format!("no scenario {name}"))?;
        reqs = generate(&at.workload);
    }
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for p in &sc.fleet.pods {
        if seen.contains(&p.profile) {
            continue;
        }
        seen.push(p.profile);
        let mut fleet = FleetSpec {
            pods: vec![p.clone()],
            ..sc.fleet.clone()
        };
        if twin {
            fleet.engine = PodEngine::ModelSim;
        }
        let mut c = measure(&fleet, &sc.adapters, reqs.clone(), concurrency, secs).await?;
        c.scenario = Some(name.to_string());
        out.push(c);
    }
    Ok(out)
}

/// Measures, on this machine, the real-pod capacities the real scenarios among `names` need
/// and have not got yet ([`crate::experiments::scenarios::unmeasured_real`]), and keeps them in
/// [`crate::experiments::scenarios::local_capacity_file`] for every later run on this machine. About
/// 2 minutes per profile (the pod's start and 60 s of load), once per machine.
pub async fn ensure_real_capacities(names: &[&str]) -> Result<(), String> {
    use crate::experiments::scenarios::{
        local_capacity_file, machine_key, unmeasured_real, REAL_CAPACITY_CLIENTS,
        REAL_CAPACITY_SECS,
    };
    for (name, missing) in unmeasured_real(names) {
        eprintln!(
            "bench: {name}: measuring this machine's ({}) capacity of {} (once per machine, \
             about 2 min per profile; kept in {})",
            machine_key(),
            missing.join(", "),
            local_capacity_file().display()
        );
        let measured =
            scenario_capacity(name, REAL_CAPACITY_CLIENTS, REAL_CAPACITY_SECS, false).await;
        crate::stack::realpods::release();
        let path = local_capacity_file();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut lines = String::new();
        for c in measured? {
            eprintln!(
                "bench: {name}: {} serves {:.2} req/s here",
                c.profile, c.rps
            );
            lines.push_str(&serde_json::to_string(&c).map_err(|e| e.to_string())?);
            lines.push('\n');
        }
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(lines.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// One pod (`fleet` holds one) under a closed loop of `concurrency` clients sending `reqs`.
async fn measure(
    fleet: &FleetSpec,
    adapters: &[String],
    reqs: Vec<RequestSpec>,
    concurrency: usize,
    secs: u64,
) -> Result<Capacity, String> {
    if reqs.is_empty() {
        return Err("no requests to measure with".into());
    }
    let profile = fleet.pods.first().map_or("", |p| p.profile);
    let speedup = fleet.speedup;
    let pods = start_pods(fleet, adapters)
        .await
        .map_err(|e| e.to_string())?;
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

/// The prompt sizes of the prefill probe (model-sim tokens: 4 characters each).
pub const FIT_PROMPTS: [u32; 7] = [64, 256, 512, 1024, 1536, 2048, 3000];
/// Requests per prefill size (the median is kept).
const FIT_REPS: usize = 5;
/// Batch sizes of the decode probe.
pub const FIT_BATCHES: [usize; 5] = [1, 2, 4, 8, 16];
/// Prompt sizes of the decode probe: short, and long (the context every step reads).
pub const FIT_DECODE_PROMPTS: [u32; 2] = [64, 2000];
/// Tokens each decode-probe stream generates. Only the gaps after every stream of the probe
/// has its first token count (before that, steps carry the others' prefills): at 16 streams
/// of 2,000 tokens the prefills take ~1 s of the run.
const FIT_DECODE_TOKENS: u32 = 256;

/// One prefill probe: TTFT of a prompt sent alone to an idle pod, nothing of it cached.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PrefillPoint {
    /// Prompt size asked for, model-sim tokens (characters ÷ 4).
    pub tokens: u32,
    /// The engine's own count of the prompt (`usage.prompt_tokens`).
    pub engine_tokens: Option<u64>,
    /// Median TTFT over the probe's requests, ms.
    pub ttft_ms: f64,
}

/// One decode probe: `batch` streams started together, each generating
/// [`FIT_DECODE_TOKENS`] tokens after a `prompt_tokens` prompt.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DecodePoint {
    /// Concurrent streams.
    pub batch: usize,
    /// Prompt size of each, model-sim tokens.
    pub prompt_tokens: u32,
    /// Median gap between tokens once every stream decodes, ms: one engine step.
    pub step_ms: f64,
    /// Gaps behind the median.
    pub gaps: usize,
}

/// The gaps of streams started together that come after the last stream's first token: pure
/// decode steps of the whole batch.
pub fn decode_gaps(streams: &[crate::loadgen::client::Outcome]) -> Vec<f64> {
    let last_first = streams.iter().filter_map(|o| o.ttft_ms).fold(0.0, f64::max);
    let mut out = Vec::new();
    for o in streams {
        let mut t = o.ttft_ms.unwrap_or(f64::INFINITY);
        for g in &o.itl_ms {
            t += g;
            // The step that ends after the last prefill, started after it too.
            if t - g >= last_first {
                out.push(*g);
            }
        }
    }
    out
}

/// `bench calibrate --fit PROFILE`: probes of one pod and the step-time terms of model-sim's
/// [`model_sim::profile::Profile`] fitted to them by least squares, in milliseconds per
/// model-sim token (4 characters) — the unit the emulator counts and the workload sizes
/// prompts in.
///
/// - decode: `step = step_base + batch · decode_per_seq + batch · context · kv_read_per_token`
///   over every decode probe (context = prompt + half the generated tokens);
/// - prefill: `TTFT − step_base = overhead + P · prefill_per_token + P² · prefill_attn / 2`
///   (a prompt's tokens attend on average to half of it), where `overhead` is what the
///   server adds before and after the engine's step (HTTP, chat template, tokenisation,
///   streaming).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileFit {
    /// Profile fitted.
    pub profile: String,
    /// `vllm` (a real pod) or `model-sim` (its twin, to check the fit).
    pub engine: String,
    /// Prompt characters per engine token, over the prefill probes (model-sim counts 4).
    pub chars_per_token: f64,
    /// KV block size and blocks of the pod (`vllm:cache_config_info`), engine tokens.
    pub block_size: Option<u32>,
    /// KV blocks.
    pub num_gpu_blocks: Option<u32>,
    /// The probes.
    pub prefill: Vec<PrefillPoint>,
    /// The probes.
    pub decode: Vec<DecodePoint>,
    /// Fitted: fixed cost of one step, ms.
    pub step_base_ms: f64,
    /// Fitted: cost per decoding sequence in the batch, ms.
    pub decode_per_seq_ms: f64,
    /// Fitted: cost per token of context the batch's attention reads, ms.
    pub kv_read_per_token_ms: f64,
    /// Fitted: cost per prefill token, ms.
    pub prefill_per_token_ms: f64,
    /// Fitted: attention cost of a prefill token per context token, ms.
    pub prefill_attn_ms: f64,
    /// Fitted: the server's own time per request around the engine, ms.
    pub overhead_ms: f64,
    /// Largest relative error of the fit on a probe (decode and prefill).
    pub worst_error: f64,
}

/// Least squares for `y ≈ X·β` with up to a few columns (normal equations, Gaussian
/// elimination with partial pivoting); `None` when the columns are degenerate.
pub fn least_squares(rows: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let k = rows.first()?.len();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (r, yi) in rows.iter().zip(y) {
        for i in 0..k {
            for j in 0..k {
                a[i][j] += r[i] * r[j];
            }
            a[i][k] += r[i] * yi;
        }
    }
    for c in 0..k {
        let p = (c..k).max_by(|&x, &z| a[x][c].abs().total_cmp(&a[z][c].abs()))?;
        if a[p][c].abs() < 1e-12 {
            return None;
        }
        a.swap(c, p);
        let pivot = a[c].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, pv) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= f * pv;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

fn probe_body(seed: u64, tokens: u32, max_tokens: u32) -> (bytes::Bytes, usize) {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // A distinct first block: nothing of the prompt is in the prefix cache.
    let prompt = format!(
        "probe {seed}: {}",
        crate::loadgen::workload::text(&mut rng, (tokens as usize) * 4)
    );
    let chars = prompt.len();
    let v = serde_json::json!({
        "model": crate::stack::fleet::MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    (bytes::Bytes::from(v.to_string()), chars)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::analysis::stats::percentile(v, 50.0)
}

/// Probe one pod of `profile` (real vLLM or model-sim at speed-up 1) `rounds` times and fit the
/// profile's step-time terms to each probe's median over the rounds. Nothing else may run on
/// the pod; the machine should be quiet.
pub async fn fit(
    profile: &'static str,
    engine: PodEngine,
    rounds: usize,
) -> Result<ProfileFit, String> {
    let fleet = FleetSpec {
        pods: vec![PodSpec::new(profile)],
        speedup: 1.0,
        seed: 1,
        engine,
        admission: None,
    };
    let pods = start_pods(&fleet, &[]).await.map_err(|e| e.to_string())?;
    let addr = pods.addrs[0];
    let uri: hyper::Uri = format!("http://{addr}/v1/chat/completions")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let client = http_client();
    // Warm the server (first requests pay one-time costs).
    for i in 0..3 {
        let (b, _) = probe_body(900 + i, 256, 4);
        send(&client, &uri, b, &[]).await;
    }
    let mut seed = 1000u64;
    let mut cpt = Vec::new();
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); FIT_PROMPTS.len()];
    let mut engine_tokens: Vec<Option<u64>> = vec![None; FIT_PROMPTS.len()];
    let points: Vec<(u32, usize)> = FIT_DECODE_PROMPTS
        .iter()
        .flat_map(|&p| FIT_BATCHES.iter().map(move |&b| (p, b)))
        .collect();
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); points.len()];
    let mut gap_counts = vec![0usize; points.len()];
    // Rounds of every probe, one after another: slow drift of the machine touches every point.
    for _ in 0..rounds.max(1) {
        for (i, &tokens) in FIT_PROMPTS.iter().enumerate() {
            for _ in 0..FIT_REPS {
                seed += 1;
                let (b, chars) = probe_body(seed, tokens, 1);
                let o = send(&client, &uri, b, &[]).await;
                if !o.ok() {
                    return Err(format!("prefill probe failed: {:?}", o.error));
                }
                ttfts[i].push(o.ttft_ms.unwrap_or(f64::NAN));
                if let Some(n) = o.prompt_tokens.filter(|n| *n > 0) {
                    engine_tokens[i] = Some(n);
                    cpt.push(chars as f64 / n as f64);
                }
            }
        }
        for (i, &(prompt_tokens, batch)) in points.iter().enumerate() {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..batch {
                seed += 1;
                let (b, _) = probe_body(seed, prompt_tokens, FIT_DECODE_TOKENS);
                let (client, uri) = (client.clone(), uri.clone());
                set.spawn(async move { send(&client, &uri, b, &[]).await });
            }
            let mut streams = Vec::new();
            while let Some(r) = set.join_next().await {
                let o = r.map_err(|e| e.to_string())?;
                if !o.ok() {
                    return Err(format!("decode probe failed: {:?}", o.error));
                }
                streams.push(o);
            }
            let mut gaps = decode_gaps(&streams);
            if gaps.len() < 20 {
                return Err(format!(
                    "decode probe {batch} x {prompt_tokens}: only {} gaps after the prefills",
                    gaps.len()
                ));
            }
            gap_counts[i] += gaps.len();
            steps[i].push(median(&mut gaps));
        }
    }
    let prefill: Vec<PrefillPoint> = FIT_PROMPTS
        .iter()
        .zip(ttfts.iter_mut().zip(engine_tokens))
        .map(|(&tokens, (t, engine_tokens))| PrefillPoint {
            tokens,
            engine_tokens,
            ttft_ms: median(t),
        })
        .collect();
    let decode: Vec<DecodePoint> = points
        .iter()
        .zip(steps.iter_mut().zip(gap_counts))
        .map(|(&(prompt_tokens, batch), (s, gaps))| DecodePoint {
            batch,
            prompt_tokens,
            // The median round: one round's median gap each.
            step_ms: median(s),
            gaps,
        })
        .collect();
    let metrics = testkit::get(addr, "/metrics", &[])
        .await
        .map(|r| r.text())
        .unwrap_or_default();
    let cache_label = |name: &str| -> Option<u32> {
        let line = metrics
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))?;
        let key = format!("{name}=\"");
        let rest = &line[line.find(&key)? + key.len()..];
        rest[..rest.find('"')?].parse().ok()
    };
    let block_size = cache_label("block_size");
    let num_gpu_blocks = cache_label("num_gpu_blocks");
    drop(pods);
    let chars_per_token = if cpt.is_empty() {
        4.0
    } else {
        median(&mut cpt)
    };
    fit_points(
        profile,
        engine,
        chars_per_token,
        block_size,
        num_gpu_blocks,
        prefill,
        decode,
    )
    .ok_or_else(|| "the probes do not determine the fit (degenerate)".to_string())
}

/// The least-squares fit of [`ProfileFit`] to measured probes.
pub fn fit_points(
    profile: &str,
    engine: PodEngine,
    chars_per_token: f64,
    block_size: Option<u32>,
    num_gpu_blocks: Option<u32>,
    prefill: Vec<PrefillPoint>,
    decode: Vec<DecodePoint>,
) -> Option<ProfileFit> {
    let half = f64::from(FIT_DECODE_TOKENS) / 2.0;
    let drows: Vec<Vec<f64>> = decode
        .iter()
        .map(|d| {
            let b = d.batch as f64;
            vec![1.0, b, b * (f64::from(d.prompt_tokens) + half)]
        })
        .collect();
    let dy: Vec<f64> = decode.iter().map(|d| d.step_ms).collect();
    let dfit = least_squares(&drows, &dy)?;
    let (base, per_seq, kv_read) = (dfit[0], dfit[1], dfit[2]);
    let prows: Vec<Vec<f64>> = prefill
        .iter()
        .map(|p| {
            let t = f64::from(p.tokens);
            vec![1.0, t, t * t / 2.0]
        })
        .collect();
    let py: Vec<f64> = prefill.iter().map(|p| p.ttft_ms - base).collect();
    let pfit = least_squares(&prows, &py)?;
    let rel = |model: f64, seen: f64| ((model - seen) / seen).abs();
    let worst = drows
        .iter()
        .zip(&dy)
        .map(|(r, y)| rel(r[0] * base + r[1] * per_seq + r[2] * kv_read, *y))
        .chain(prows.iter().zip(&prefill).map(|(r, p)| {
            rel(
                base + r[0] * pfit[0] + r[1] * pfit[1] + r[2] * pfit[2],
                p.ttft_ms,
            )
        }))
        .fold(0.0, f64::max);
    Some(ProfileFit {
        profile: profile.to_string(),
        engine: match engine {
            PodEngine::Vllm => "vllm",
            PodEngine::ModelSim => "model-sim",
        }
        .into(),
        chars_per_token,
        block_size,
        num_gpu_blocks,
        prefill,
        decode,
        step_base_ms: base,
        decode_per_seq_ms: per_seq,
        kv_read_per_token_ms: kv_read,
        prefill_per_token_ms: pfit[1],
        prefill_attn_ms: pfit[2],
        overhead_ms: pfit[0],
        worst_error: worst,
    })
}

/// One load of [`compare_twin`]: the same workload under round robin on the real pods and on
/// their model-sim twins.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TwinPoint {
    /// Offered load as a fraction of the fleet's measured capacity.
    pub load: f64,
    /// Offered rate, req/s.
    pub rate_rps: f64,
    /// Real vLLM: TTFT p50, p95 (ms), window requests, errors.
    pub real: [f64; 2],
    /// model-sim twin: TTFT p50, p95 (ms).
    pub twin: [f64; 2],
    /// Window requests of the real and the twin run.
    pub requests: [u64; 2],
    /// twin ÷ real − 1 for p50 and p95.
    pub error: [f64; 2],
    /// Prefix-cache hit rate (hit ÷ queried blocks) of the real and the twin run, if any.
    pub prefix_hit_rate: [Option<f64>; 2],
    /// Preemptions of the real and the twin run.
    pub preemptions: [Option<f64>; 2],
    /// Mean TTFT, ms (real, twin): the whole distribution's weight, beside its quantiles.
    pub ttft_mean_ms: [f64; 2],
}

/// `bench calibrate --compare SCENARIO`: the scenario's workload under round robin at each
/// load (fraction of its measured capacity), on its real vLLM fleet and on the same fleet of
/// model-sim twins (the fitted `cpu-*` profiles, same limits, speed-up 1), one seed each;
/// the emulator is calibrated where TTFT p50 and p95 agree within 25 %.
pub async fn compare_twin(name: &str, loads: &[f64], seed: u64) -> Result<Vec<TwinPoint>, String> {
    use crate::experiments::runner::{run_windowed, Windows};
    use crate::experiments::scenarios::{scenario, scenario_at, Mode};
    use crate::stack::RouterKind;
    let mode = Mode {
        quick: false,
        ..Mode::full(seed)
    };
    let base = scenario(name, mode).ok_or_else(|| format!("no scenario {name}"))?;
    if base.fleet.engine != PodEngine::Vllm {
        return Err(format!("{name} runs on emulated pods: nothing to compare"));
    }
    let mut out = Vec::new();
    for &load in loads {
        let rate = load * base.capacity_rps;
        let real = scenario_at(name, mode, rate).ok_or("scenario")?;
        let w = Windows::for_scenario(&real, &mode, 1, false);
        let mut twin = real.clone();
        twin.fleet.engine = PodEngine::ModelSim;
        let mut figures = Vec::new();
        for sc in [&real, &twin] {
            let o = run_windowed(sc, RouterKind::RoundRobin, w).await?;
            eprintln!(
                "calibrate: {name} at {:.0} % ({rate:.2} req/s) on {:?}: TTFT p50 {:.1} p95 {:.1} ms, {} requests, errors {:.2} %",
                load * 100.0,
                sc.fleet.engine,
                o.summary.ttft_p50_ms,
                o.summary.ttft_p95_ms,
                o.summary.requests,
                o.summary.error_rate * 100.0
            );
            figures.push(o.summary);
        }
        let (r, t) = (&figures[0], &figures[1]);
        out.push(TwinPoint {
            load,
            rate_rps: rate,
            real: [r.ttft_p50_ms, r.ttft_p95_ms],
            twin: [t.ttft_p50_ms, t.ttft_p95_ms],
            requests: [r.requests, t.requests],
            error: [
                t.ttft_p50_ms / r.ttft_p50_ms - 1.0,
                t.ttft_p95_ms / r.ttft_p95_ms - 1.0,
            ],
            prefix_hit_rate: [
                r.extra.get("prefix_hit_rate").copied(),
                t.extra.get("prefix_hit_rate").copied(),
            ],
            preemptions: [
                r.extra.get("preemptions").copied(),
                t.extra.get("preemptions").copied(),
            ],
            ttft_mean_ms: [r.ttft_mean_ms, t.ttft_mean_ms],
        });
    }
    Ok(out)
}

/// `bench calibrate`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// GPU profile: h100 or a10g.
    #[arg(long, default_value = "a10g")]
    profile: String,
    /// Prompt tokens, min and max.
    #[arg(long, num_args = 2, default_values_t = [200u32, 1000])]
    prompt: Vec<u32>,
    /// max_tokens, min and max.
    #[arg(long, num_args = 2, default_values_t = [50u32, 200])]
    max_tokens: Vec<u32>,
    /// Concurrent clients (repeatable).
    #[arg(long, default_values_t = [8usize, 32, 128])]
    concurrency: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 20)]
    secs: u64,
    /// Measure one pod of each profile of this scenario on its own requests instead.
    #[arg(long)]
    scenario: Option<String>,
    /// Fit model-sim's step-time terms to one pod of this profile instead (`cpu-small`,
    /// `cpu-large`; prefill and decode probes, least squares; CALIBRATION.md): prints the
    /// fit as JSON and writes it to <target>/bench/fit-<profile>-<engine>.json.
    #[arg(long)]
    fit: Option<String>,
    /// The pod `--fit` probes: `vllm` (the real engine, `./build.sh setup-vllm`) or
    /// `model-sim` (the emulator's profile of that name, to check the fit); with
    /// `--scenario` on a real scenario, `model-sim` measures its pods' twins.
    #[arg(long, default_value = "vllm")]
    engine: String,
    /// Rounds of `--fit`'s probes (each probe's median over the rounds is fitted).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run this real-vLLM scenario's workload under round robin on its real pods and on
    /// their model-sim twins at each `--loads` fraction of its capacity, and compare TTFT
    /// p50/p95 (CALIBRATION.md); writes <target>/bench/twin-<scenario>.json.
    #[arg(long)]
    compare: Option<String>,
    /// Loads of `--compare`, fractions of the fleet's measured capacity.
    #[arg(long, value_delimiter = ',', default_values_t = [0.3, 0.6, 0.9])]
    loads: Vec<f64>,
}

/// `bench calibrate`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        profile,
        prompt,
        max_tokens,
        concurrency,
        secs,
        scenario,
        fit,
        engine,
        rounds,
        compare,
        loads,
    } = args;
    if let Some(name) = compare {
        return match compare_twin(&name, &loads, 42).await {
            Ok(points) => {
                let json = serde_json::to_string_pretty(&points).unwrap_or_default();
                println!("{json}");
                let path = out_dir.join(format!("twin-{name}.json"));
                let _ = std::fs::create_dir_all(out_dir);
                if let Err(e) = std::fs::write(&path, json) {
                    eprintln!("calibrate: writing {}: {e}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("calibrate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(profile) = fit {
        let engine = match engine.as_str() {
            "vllm" => crate::stack::fleet::PodEngine::Vllm,
            "model-sim" => crate::stack::fleet::PodEngine::ModelSim,
            other => {
                eprintln!("calibrate: --engine {other}: vllm or model-sim");
                return ExitCode::FAILURE;
            }
        };
        let Some(profile) = crate::stack::realpods::TWIN_PROFILES
            .iter()
            .copied()
            .find(|p| *p == profile)
        else {
            eprintln!(
                "calibrate: --fit {profile}: one of {:?}",
                crate::stack::realpods::TWIN_PROFILES
            );
            return ExitCode::FAILURE;
        };
        let r = self::fit(profile, engine, rounds).await;
        crate::stack::realpods::release();
        return match r {
            Ok(f) => {
                let json = serde_json::to_string_pretty(&f).unwrap_or_default();
                println!("{json}");
                let path = out_dir.join(format!("fit-{profile}-{}.json", f.engine));
                let _ = std::fs::create_dir_all(out_dir);
                if let Err(e) = std::fs::write(&path, json) {
                    eprintln!("calibrate: writing {}: {e}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("calibrate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(name) = scenario {
        for c in concurrency {
            match scenario_capacity(&name, c, secs, engine == "model-sim").await {
                Ok(caps) => {
                    for cap in caps {
                        println!("{}", serde_json::to_string(&cap).unwrap_or_default())
                    }
                }
                Err(e) => {
                    eprintln!("calibrate: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let profile: &'static str = if profile == "h100" { "h100" } else { "a10g" };
    let r = |v: &[u32]| crate::loadgen::workload::Range::new(v[0], v[v.len() - 1]);
    for c in concurrency {
        match capacity(profile, r(&prompt), r(&max_tokens), c, secs).await {
            Ok(cap) => println!("{}", serde_json::to_string(&cap).unwrap_or_default()),
            Err(e) => {
                eprintln!("calibrate: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_gaps_start_after_the_last_prefill() {
        let stream = |ttft: f64, gaps: &[f64]| crate::loadgen::client::Outcome {
            status: 200,
            ttft_ms: Some(ttft),
            itl_ms: gaps.to_vec(),
            ..Default::default()
        };
        // The second stream's first token at 30 ms: the first stream's gaps before it carry
        // its prefill (20 ms) and are left out.
        let g = decode_gaps(&[stream(10.0, &[20.0, 5.0, 5.0]), stream(30.0, &[6.0, 6.0])]);
        assert_eq!(g, vec![5.0, 5.0, 6.0, 6.0]);
    }

    #[test]
    fn least_squares_recovers_a_plane_and_refuses_degenerate_columns() {
        let rows: Vec<Vec<f64>> = (0..6)
            .map(|i| vec![1.0, f64::from(i), f64::from(i * i)])
            .collect();
        let y: Vec<f64> = rows.iter().map(|r| 2.0 + 3.0 * r[1] - 0.5 * r[2]).collect();
        let b = least_squares(&rows, &y).unwrap();
        for (got, want) in b.iter().zip([2.0, 3.0, -0.5]) {
            assert!((got - want).abs() < 1e-9, "{b:?}");
        }
        let same = vec![vec![1.0, 2.0], vec![1.0, 2.0]];
        assert!(least_squares(&same, &[1.0, 1.0]).is_none());
    }

    #[test]
    fn the_fit_recovers_the_step_terms_that_made_the_probes() {
        let (base, per_seq, kv, pre, attn, over) = (5.0, 0.4, 0.0002, 0.05, 0.00001, 9.0);
        let half = f64::from(FIT_DECODE_TOKENS) / 2.0;
        let decode: Vec<DecodePoint> = FIT_DECODE_PROMPTS
            .iter()
            .flat_map(|&p| {
                FIT_BATCHES.iter().map(move |&b| DecodePoint {
                    batch: b,
                    prompt_tokens: p,
                    gaps: 100,
                    step_ms: base + b as f64 * per_seq + b as f64 * (f64::from(p) + half) * kv,
                })
            })
            .collect();
        let prefill: Vec<PrefillPoint> = FIT_PROMPTS
            .iter()
            .map(|&t| {
                let t64 = f64::from(t);
                PrefillPoint {
                    tokens: t,
                    engine_tokens: None,
                    ttft_ms: base + over + t64 * pre + t64 * t64 * attn / 2.0,
                }
            })
            .collect();
        let f = fit_points(
            "cpu-small",
            PodEngine::Vllm,
            5.4,
            Some(128),
            Some(4096),
            prefill,
            decode,
        )
        .unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-9) + 1e-9;
        assert!(close(f.step_base_ms, base), "{f:?}");
        assert!(close(f.decode_per_seq_ms, per_seq), "{f:?}");
        assert!(close(f.kv_read_per_token_ms, kv), "{f:?}");
        assert!(close(f.prefill_per_token_ms, pre), "{f:?}");
        assert!(close(f.prefill_attn_ms, attn), "{f:?}");
        assert!(close(f.overhead_ms, over), "{f:?}");
        assert!(f.worst_error < 1e-6);
    }
}
