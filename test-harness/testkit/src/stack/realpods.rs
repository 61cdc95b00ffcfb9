//! Real vLLM pods for the benchmark: the CPU build of vLLM (`./build.sh setup-vllm`) serving the
//! project's tiny model, one instance per core, in place of model-sim.
//!
//! A vLLM instance takes 25–45 s to start on a quiet machine (minutes on a loaded one), so real
//! pods are **kept across runs** of the same fleet instead of started fresh per run as
//! model-sim's are: [`acquire`] starts the fleet once and, before every later run, puts it back
//! into the state a fresh start would have — nothing running or queued (it waits), the prefix
//! cache empty (`POST /reset_prefix_cache`, served with `VLLM_SERVER_DEV_MODE=1`). What cannot
//! be reset is said where it matters: LoRA adapters stay loaded in vLLM's CPU cache (every
//! adapter of the scenario is registered at start through the runtime API, `POST
//! /v1/load_lora_adapter`, and the CPU cache holds them all), and which adapters occupy the
//! batch's LoRA slots at the start of a run is what the previous run left — the warm-up, sent
//! identically to every router and excluded, is what evens that out. A fleet of another shape
//! stops the one running; [`release`] stops whatever runs (the bench calls it before it exits).
//!
//! Every instance is pinned to its core ([`crate::stack::fleet::PodSpec::core`], else pod `i` on core
//! `i mod cores`); Envoy, the sidecar, the peer routers and the load generator share those
//! cores — the machine has no others.

use crate::stack::fleet::{FleetSpec, PodSpec, MODEL};
use crate::vllm::{ModelSize, VllmProcess, VllmSpec};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The profiles that exist both as a real vLLM pod and as a fitted model-sim profile.
pub const TWIN_PROFILES: [&str; 2] = ["cpu-small", "cpu-large"];

/// The model-sim profiles that have a real twin, and the tiny model each runs on vLLM:
/// `cpu-small` is the 5.5 M-parameter model, `cpu-large` the 22 M one (a slower "GPU").
pub fn model_size(profile: &str) -> Option<ModelSize> {
    match profile {
        "cpu-small" => Some(ModelSize::Small),
        "cpu-large" => Some(ModelSize::Large),
        _ => None,
    }
}

/// How long a run may take to drain before the next one starts.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The LoRA adapters built by `make_model.py` (`lora/adapter-0`, `adapter-1`); adapter `i` of a
/// scenario is registered with the weights of `i mod` this (one name, one adapter id: vLLM
/// keeps and schedules them as different adapters).
const BUILT_ADAPTERS: usize = 2;

struct Running {
    /// What was started: pods and adapters (a fleet of another shape restarts).
    key: String,
    procs: Vec<VllmProcess>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

fn key(fleet: &FleetSpec, adapters: &[String]) -> String {
    format!("{:?} {adapters:?}", fleet.pods)
}

/// The vLLM instance for pod `i` of the fleet.
pub fn spec(
    installed: &crate::vllm::Installed,
    i: usize,
    pod: &PodSpec,
    adapters: &[String],
) -> Result<VllmSpec, String> {
    let size = model_size(pod.profile).ok_or_else(|| {
        format!(
            "profile {} has no real vLLM twin (cpu-small, cpu-large)",
            pod.profile
        )
    })?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let core = pod.core.unwrap_or(i % cores);
    let mut s = VllmSpec::new(core, installed.model(size), MODEL);
    s.name = format!("bench-vllm{i}-{}", pod.profile);
    s.max_num_seqs = pod.max_num_seqs;
    s.num_gpu_blocks_override = pod.kv_blocks;
    // `/reset_prefix_cache` between runs.
    s.env.push(("VLLM_SERVER_DEV_MODE".into(), "1".into()));
    // `usage.prompt_tokens_details.cached_tokens` in every answer: how much of each prompt the
    // pod had cached (per-request samples, `LLMR_BENCH_SAMPLES`).
    s.extra_args.push("--enable-prompt-tokens-details".into());
    if !adapters.is_empty() {
        s.enable_lora = true;
        s.max_loras = Some(pod.max_loras.unwrap_or(1));
        s.runtime_lora_updating = true;
        // Every adapter stays in the CPU cache: the GPU slots are what routing decides.
        let cpu = pod
            .max_cpu_loras
            .unwrap_or(adapters.len() as u32)
            .max(s.max_loras.unwrap_or(1));
        s.extra_args
            .extend(["--max-cpu-loras".into(), cpu.to_string()]);
    }
    Ok(s)
}

/// Addresses of running real pods for `fleet`, started if needed, reset for a new run (idle,
/// prefix cache empty).
pub async fn acquire(fleet: &FleetSpec, adapters: &[String]) -> Result<Vec<SocketAddr>, String> {
    let want = key(fleet, adapters);
    let current = {
        let guard = RUNNING.lock().map_err(|e| e.to_string())?;
        guard
            .as_ref()
            .filter(|r| r.key == want)
            .map(|r| r.procs.iter().map(|p| p.addr).collect::<Vec<_>>())
    };
    let addrs = match current {
        Some(a) => a,
        None => {
            release();
            let fleet = fleet.clone();
            let adapters_owned = adapters.to_vec();
            let started = tokio::task::spawn_blocking(move || start(&fleet, &adapters_owned))
                .await
                .map_err(|e| e.to_string())??;
            let addrs: Vec<SocketAddr> = started.iter().map(|p| p.addr).collect();
            *RUNNING.lock().map_err(|e| e.to_string())? = Some(Running {
                key: want,
                procs: started,
            });
            load_adapters(&addrs, adapters).await?;
            addrs
        }
    };
    reset(&addrs).await?;
    Ok(addrs)
}

fn start(fleet: &FleetSpec, adapters: &[String]) -> Result<Vec<VllmProcess>, String> {
    let installed = crate::vllm::installed().map_err(|e| e.to_string())?;
    let specs = fleet
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| spec(&installed, i, p, adapters))
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    eprintln!(
        "bench: starting {} real vLLM pods ({})",
        specs.len(),
        fleet
            .pods
            .iter()
            .map(|p| p.profile)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let procs = crate::vllm::start_all(&specs).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: real vLLM pods ready in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    Ok(procs)
}

/// Register every adapter on every pod through vLLM's runtime API.
async fn load_adapters(addrs: &[SocketAddr], adapters: &[String]) -> Result<(), String> {
    let installed = crate::vllm::installed().map_err(|e| e.to_string())?;
    for a in addrs {
        for (i, name) in adapters.iter().enumerate() {
            let path = installed.lora(i % BUILT_ADAPTERS);
            let body = json!({"lora_name": name, "lora_path": path.display().to_string()});
            let r = crate::post_json(*a, "/v1/load_lora_adapter", &[], &body)
                .await
                .map_err(|e| format!("load adapter {name} on {a}: {e}"))?;
            if r.status != 200 {
                return Err(format!(
                    "load adapter {name} on {a}: status {}: {}",
                    r.status,
                    r.text()
                ));
            }
        }
    }
    Ok(())
}

/// Requests running and waiting on a pod, from its `/metrics`.
async fn busy(addr: SocketAddr) -> Option<f64> {
    let r = crate::get(addr, "/metrics", &[]).await.ok()?;
    let m = crate::podmetrics::sum_metrics(&r.text());
    Some(
        m.get("vllm:num_requests_running").copied().unwrap_or(0.0)
            + m.get("vllm:num_requests_waiting").copied().unwrap_or(0.0),
    )
}

/// Wait until no pod runs or queues anything, then empty every pod's prefix cache.
pub async fn reset(addrs: &[SocketAddr]) -> Result<(), String> {
    let deadline = Instant::now() + IDLE_TIMEOUT;
    for a in addrs {
        loop {
            match busy(*a).await {
                Some(0.0) => break,
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "real pod {a} still busy {} s after the run",
                        IDLE_TIMEOUT.as_secs()
                    ))
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        // Fails while blocks are held (a request just finishing): retry.
        let mut ok = false;
        for _ in 0..50 {
            if let Ok(r) = crate::post_json(*a, "/reset_prefix_cache", &[], &json!({})).await {
                if r.status == 200 && r.text().contains("true") {
                    ok = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !ok {
            return Err(format!("real pod {a}: /reset_prefix_cache did not succeed"));
        }
    }
    Ok(())
}

/// Stop the real pods, if any run.
pub fn release() {
    let running = RUNNING.lock().ok().and_then(|mut g| g.take());
    if let Some(mut r) = running {
        for p in &mut r.procs {
            if let Err(e) = p.stop() {
                eprintln!("bench: stopping a real vLLM pod: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_cpu_profiles_have_a_real_twin() {
        assert_eq!(model_size("cpu-small"), Some(ModelSize::Small));
        assert_eq!(model_size("cpu-large"), Some(ModelSize::Large));
        assert_eq!(model_size("a10g"), None);
    }
}
