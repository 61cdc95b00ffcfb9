//! The six scenarios that reproduce the reference benchmark's conditions: fleet, arrival
//! process, prompt shape, load, and for each a *card* (the anchor condition it mirrors, the
//! check that the condition occurred, the TTFT SLO for goodput and the floor a perfect router
//! could reach).
//!
//! Load levels come from the pods' measured capacity (`bench calibrate --scenario NAME`: one pod
//! of each profile of the fleet, closed loop, no Envoy, the scenario's own requests), never from
//! any router's results; the figures used are in [`CAPACITY`]. Rates and times are designed in
//! emulated (real-GPU) seconds; a run at speed-up `s` sends `s` times the rate for `1/s` of the
//! time, so every wall-clock figure (rates, horizons, SLOs, floors) here is already divided by
//! `s`.

use crate::analysis::diagnostics::Condition;
use crate::loadgen::arrivals::Arrival;
use crate::loadgen::workload::{
    adapter_name, generate, Prompts, Range, RequestSpec, Tagging, WorkloadSpec,
};
use crate::scenario_names::{CANARY_TARGET, CANARY_WEIGHTS};
use crate::stack::fleet::{FleetSpec, PodEngine, PodSpec, MODEL};
use model_sim::engine::{Engine, Event, NewRequest};
use model_sim::profile::Profile;
use model_sim::prompt::{block_hashes, parse, Api};
use std::sync::Arc;
use std::time::Duration;

/// One scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name used in the report (`mixed_gpu`, ...).
    pub name: &'static str,
    /// One line saying what it shows.
    pub about: &'static str,
    /// The scenario's card (Markdown lines): fleet, rates relative to measured capacity, the
    /// anchor condition, its check, the SLO and the floor's definition.
    pub card: &'static str,
    /// The pods (fresh ones for every router).
    pub fleet: FleetSpec,
    /// The requests.
    pub workload: WorkloadSpec,
    /// LoRA adapters the pool serves (filter configuration: pool membership, not tuning).
    pub adapters: Vec<String>,
    /// Arrivals before this offset are the warm-up: identical for every router, excluded from
    /// the figures.
    pub warmup: Duration,
    /// How long open requests may finish after the last arrival.
    pub drain: Duration,
    /// Mean offered rate, wall-clock requests per second.
    pub rate_rps: f64,
    /// The fleet's measured capacity at this speed-up (sum over pods of one pod's closed-loop
    /// throughput on this workload), wall-clock requests per second: the unit of
    /// [`scenario_at`]'s rates.
    pub capacity_rps: f64,
    /// TTFT p95 objective for goodput, wall-clock ms.
    pub slo_ttft_ms: f64,
    /// TTFT p95 a perfect router could reach, wall-clock ms (see [`floor_ms`]).
    pub floor_ms: f64,
    /// What must have happened for the run to count.
    pub condition: Condition,
    /// Settings the scenario's deployment adds to the filter's configuration (JSON object or
    /// null), as [`crate::stack::plugin_config`] merges them: which identity headers are
    /// trusted, a canary rule. Never a routing knob.
    pub filter_config: serde_json::Value,
    /// Headers every client request carries (the same for every router), e.g. its TTFT
    /// objective ([`SLO_HEADER`]) in `bench flow --slo-header`.
    pub client_headers: Vec<(String, String)>,
}

impl Scenario {
    /// Share of the measured requests that are cold reads (first read of their shared prefix).
    pub fn cold_read_fraction(&self) -> f64 {
        crate::loadgen::workload::cold_read_fraction(&generate(&self.workload), self.warmup)
    }
}

/// Knobs shared by all scenarios of one run.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Quick (CI-sized) or full.
    pub quick: bool,
    /// Emulator speed-up (rates are multiplied by it, times divided).
    pub speedup: f64,
    /// Workload seed.
    pub seed: u64,
}

/// Speed-up for quick runs: 15 s of arrivals cover 60 emulated seconds.
pub const QUICK_SPEEDUP: f64 = 4.0;
/// Speed-up for full runs (a little slower, so step lateness stays small at the highest rates
/// of a goodput sweep).
pub const FULL_SPEEDUP: f64 = 3.0;

impl Mode {
    /// Quick mode at [`QUICK_SPEEDUP`].
    pub fn quick(seed: u64) -> Self {
        Mode {
            quick: true,
            speedup: QUICK_SPEEDUP,
            seed,
        }
    }

    /// Full mode at [`FULL_SPEEDUP`].
    pub fn full(seed: u64) -> Self {
        Mode {
            quick: false,
            speedup: FULL_SPEEDUP,
            seed,
        }
    }
}

/// Names of the emulated scenarios, in run order (what `bench run` runs by default).
pub const NAMES: [&str; 6] = crate::scenario_names::SCENARIOS;

/// Names of the scenarios on real vLLM pods (`./build.sh setup-vllm`), run only when named.
pub const REAL_NAMES: [&str; 4] = crate::scenario_names::REAL_SCENARIOS;

/// Every scenario name: emulated, then real.
pub fn all_names() -> impl Iterator<Item = &'static str> {
    crate::scenario_names::all_scenarios()
}

/// Measured capacity of one pod, emulated requests per second, per (scenario, profile):
/// `bench calibrate --scenario NAME --concurrency 64 --secs 20` (closed loop, no Envoy, speed-up
/// 4, one run each), measured on this 2-core machine on 2026-11-30 before any router ran. The
/// H100 of `mixed_gpu` was measured with 256 clients and still had no queue (TTFT 90 ms): 24 is
/// a lower bound (it only enters `capacity_rps`, not the nominal rate).
pub const CAPACITY: &[(&str, &str, f64)] = &[
    ("mixed_gpu", "h100", 24.1),
    ("mixed_gpu", "a10g", 3.47),
    ("bursty", "h100-70b", 0.83),
    ("shared_prefix", "a10g", 1.52),
    ("lora", "a10g", 2.77),
    ("uniform", "a10g", 3.67),
    ("long_prompt", "h100", 0.25),
    // Real vLLM (CPU build, one core per pod): wall req/s, measured the same way at speed-up 1
    // (`bench calibrate --scenario NAME --concurrency 32 --secs 60`: twice the pods'
    // `--max-num-seqs`, so the queue never empties).
    ("vllm_uneven", "cpu-small", VLLM_UNEVEN_SMALL),
    ("vllm_uneven", "cpu-large", VLLM_UNEVEN_LARGE),
    ("vllm_shared_prefix", "cpu-small", VLLM_SHARED_SMALL),
    ("vllm_lora", "cpu-small", VLLM_LORA_SMALL),
    ("vllm_limited", "cpu-small", VLLM_LIMITED_SMALL),
];

// Measured capacities of the real pods (see CAPACITY) on the reference machine (Intel Xeon, 2
// cores): 32 clients, 60 s each, one run, on 2026-12-02 with nothing else running
// (results/vllm/capacity.jsonl). Used only where this machine has not measured its own
// ([`local_capacity`]). A first measurement
// taken while builds ran found about half of these (11.09, 4.11, 8.33, 6.62): the real-v1
// results ran at the rates those gave.
const VLLM_UNEVEN_SMALL: f64 = 21.31;
const VLLM_UNEVEN_LARGE: f64 = 6.87;
const VLLM_SHARED_SMALL: f64 = 16.6;
const VLLM_LORA_SMALL: f64 = 8.96;
/// The limited pod of `vllm_limited` (`--max-num-seqs 4`, 48 KV blocks), measured the same
/// way on the same machine on 2026-12-06 with nothing else running.
const VLLM_LIMITED_SMALL: f64 = 9.71;

/// One pod's measured capacity for `scenario` on `profile` (emulated req/s). A real pod's is
/// this machine's own measurement when there is one ([`local_capacity`]): a CPU engine's speed
/// is the machine's (on an AMD EPYC machine a real pod decoded 2.5–3.5× slower than on the Intel
/// Xeon the constants were measured on, and `vllm_lora` at "0.6 of capacity" overloaded every
/// router), so `bench run` measures it once per machine before a real scenario
/// ([`REAL_CAPACITY_CLIENTS`] clients, [`REAL_CAPACITY_SECS`] s per profile).
pub fn pod_capacity(scenario: &str, profile: &str) -> f64 {
    if let Some(c) = local_capacity(scenario, profile) {
        return c;
    }
    CAPACITY
        .iter()
        .find(|(s, p, _)| *s == scenario && *p == profile)
        .map_or(0.0, |x| x.2)
}

/// Closed-loop clients of a real pod's capacity measurement: twice the pods' `--max-num-seqs`,
/// so the engine's queue never empties.
pub const REAL_CAPACITY_CLIENTS: usize = 32;
/// Seconds of a real pod's capacity measurement (the first quarter is warm-up).
pub const REAL_CAPACITY_SECS: u64 = 60;

/// This machine, as far as a CPU engine's speed goes: its CPU model and core count.
pub fn machine_key() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown-cpu");
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mut key: String = model
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while key.contains("--") {
        key = key.replace("--", "-");
    }
    format!("{}-{cores}cpu", key.trim_matches('-'))
}

/// Where this machine's real-pod capacities are kept (JSON lines of `bench calibrate`), in the
/// cache the vLLM install uses: `<cache>/wasm-llm-router/capacity/<machine_key>.jsonl`.
pub fn local_capacity_file() -> std::path::PathBuf {
    testkit::vllm::cache_root()
        .join("capacity")
        .join(format!("{}.jsonl", machine_key()))
}

/// This machine's measured capacity of `profile` in `scenario`, if measured (the last line
/// for the pair wins).
pub fn local_capacity(scenario: &str, profile: &str) -> Option<f64> {
    let text = std::fs::read_to_string(local_capacity_file()).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["scenario"] == scenario && v["profile"] == profile)
        .filter_map(|v| v["rps"].as_f64())
        .find(|r| r.is_finite() && *r > 0.0)
}

/// The real scenarios among `names` whose pods this machine has not measured yet, with the
/// missing profiles.
pub fn unmeasured_real(names: &[&str]) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out = Vec::new();
    for name in REAL_NAMES {
        if !names.contains(&name) {
            continue;
        }
        let Some(sc) = scenario(name, Mode::quick(7)) else {
            continue;
        };
        let mut missing: Vec<&'static str> = sc
            .fleet
            .pods
            .iter()
            .map(|p| p.profile)
            .filter(|p| local_capacity(name, p).is_none())
            .collect();
        missing.dedup();
        if !missing.is_empty() {
            out.push((name, missing));
        }
    }
    out
}

fn pods(profiles: &[&'static str], f: impl Fn(&mut PodSpec)) -> Vec<PodSpec> {
    profiles
        .iter()
        .map(|p| {
            let mut s = PodSpec::new(p);
            f(&mut s);
            s
        })
        .collect()
}

/// The design of one scenario in emulated units, before speed-up and mode are applied.
struct Design {
    /// Emulated or real pods (real: speed-up 1 whatever the mode).
    engine: PodEngine,
    about: &'static str,
    card: &'static str,
    pods: Vec<PodSpec>,
    prompts: Prompts,
    /// Nominal mean rate as a fraction of the fleet's measured capacity.
    load: f64,
    /// Bursts: (burst rate, quiet rate) as multiples of the mean, and (on, off) seconds.
    bursts: Option<((f64, f64), (f64, f64))>,
    adapters: Vec<String>,
    slo_ms: f64,
    condition: Condition,
    /// Emulated seconds the longest request may need after the last arrival.
    drain_s: f64,
}

const MIXED_CARD: &str = "\
- **Fleet**: 2 `h100` + 2 `a10g` (Llama-3.1-8B; the A10G has 1/12 of the KV and ~1/6 of the speed).
- **Traffic**: Poisson; prompts 300–1,200 tokens, 30–150 output tokens; nominal rate 80% of what \
round robin can sustain (4 × one A10G's measured capacity), ≈ 20% of the fleet's capacity.
- **Anchor**: mixed GPU generations behind one endpoint (the reference's H100 + A10G fleet).
- **Check**: under round robin the A10Gs' mean KV use is ≥ 3× the H100s' (equal shares of \
requests on unequal pods).
- **SLO**: TTFT p95 ≤ 1 s (emulated); **floor**: TTFT p95 with every request alone on an idle H100.";

const BURSTY_CARD: &str = "\
- **Fleet**: 4 `h100-70b` (Llama-3.1-70B, TP 2 on H100: 1,800 KV blocks, ~11 average requests).
- **Traffic**: ≥ 10 bursts (full mode): 10 s at 2.0× the fleet's measured capacity, 20 s at 0.3×; \
prompts lognormal (median 1,000 tokens, σ 0.8, cut at 8,000), output lengths from the pods' \
lognormal EOS (median 184, σ 1.27, cap 1,024: ~7% reach it).
- **Anchor**: bursty traffic that exhausts the KV cache of a KV-limited large model.
- **Check**: round robin preempts during the run (`vllm:num_preemptions_total` > 0); otherwise the \
run is invalid.
- **SLO**: TTFT p95 ≤ 3 s (emulated); **floor**: TTFT p95 with every request alone on an idle pod.";

const SHARED_CARD: &str = "\
- **Fleet**: 4 `a10g` (36K tokens of KV each, 144K in all).
- **Traffic**: Poisson; inference-perf `shared_prefix` style: 12 documents of 4,000 tokens asked \
about (50%) and multi-turn chats (history resent each turn, ≤ 6 turns) over 8 system prompts of \
1,500 tokens: a working set of ≈ 75K tokens, larger than one pod's KV and smaller than the \
fleet's. Nominal rate 60% of 4 × one pod's measured capacity on this workload.
- **Anchor**: shared prompt prefixes in steady state.
- **Check**: every shared prefix is first read during the warm-up, so cold reads are < 1% of the \
measured requests.
- **SLO**: TTFT p95 ≤ 1.5 s (emulated); **floor**: TTFT p95 on an idle A10G whose cache holds \
every prefix seen before (cold reads pay their prefill, warm reads only their new tokens).";

const LORA_CARD: &str = "\
- **Fleet**: 4 `a10g`, `max_loras` 4 GPU slots, `max_cpu_loras` 12 (vLLM's CPU tier). (A10Gs
rather than H100s keep the wall-clock token rate within what this 2-core machine can carry.)
- **Traffic**: Poisson; 32 adapters (Zipf 1.0) + 10% base model; prompts 200–800, 30–120 out; \
nominal rate 60% of 4 × one pod's measured capacity on this workload.
- **Anchor**: more adapters than GPU slots; a CPU swap-in is cheap (10 ms), a disk load dear (200 ms).
- **Check**: under round robin adapters are both swapped in from CPU and read from disk.
- **SLO**: TTFT p95 ≤ 1 s (emulated); **floor**: TTFT p95 alone on an idle A10G with the adapter \
resident.";

const UNIFORM_CARD: &str = "\
- **Fleet**: 4 `a10g`.
- **Traffic**: Poisson at 50% of the fleet's measured capacity; prompts 200–1,000, 50–200 out.
- **Anchor**: a uniform fleet at steady load: no gain expected; shows the router does not lose.
- **Check**: none.
- **SLO**: TTFT p95 ≤ 1 s (emulated); **floor**: TTFT p95 alone on an idle A10G.";

const LONG_CARD: &str = "\
- **Fleet**: 4 `h100`.
- **Traffic**: Poisson at 50% of the fleet's measured capacity; ~200 KB prompts (48K–52K tokens), \
20–80 out.
- **Anchor**: long prompts: the proxy reads and parses big bodies; prefill grows with the square \
of the context.
- **Check**: none.
- **SLO**: TTFT p95 ≤ 8 s (emulated); **floor**: TTFT p95 alone on an idle H100.";

fn design(name: &str) -> Option<Design> {
    Some(match name {
        "mixed_gpu" => Design {
            engine: PodEngine::ModelSim,
            about: "2 H100 + 2 A10G, Poisson just below what round robin sustains",
            card: MIXED_CARD,
            pods: pods(&["h100", "h100", "a10g", "a10g"], |_| {}),
            prompts: Prompts::Independent {
                prompt_tokens: Range::new(300, 1200),
                max_tokens: Range::new(30, 150),
            },
            // 80% of 4 A10Gs' capacity, as a fraction of the fleet's.
            load: 0.8 * 4.0 * pod_capacity("mixed_gpu", "a10g")
                / (2.0 * pod_capacity("mixed_gpu", "h100")
                    + 2.0 * pod_capacity("mixed_gpu", "a10g")),
            bursts: None,
            adapters: vec![],
            slo_ms: 1000.0,
            condition: Condition::MeanKvRatioUnder {
                router: "round_robin",
                slow: "a10g",
                fast: "h100",
                min_ratio: 3.0,
            },
            drain_s: 30.0,
        },
        "bursty" => Design {
            engine: PodEngine::ModelSim,
            about: "4 H100-70B (KV-limited), lognormal lengths, bursts at 2x capacity",
            card: BURSTY_CARD,
            pods: pods(&["h100-70b"; 4], |p| p.output_len = Some("lognormal")),
            prompts: Prompts::HeavyTailed {
                prompt_median: 1000,
                prompt_sigma: 0.8,
                prompt_max: 8000,
                max_tokens: 1024,
            },
            // Mean (2.0·10 + 0.3·20) / 30 = 0.87 of capacity.
            load: (2.0 * 10.0 + 0.3 * 20.0) / 30.0,
            bursts: Some(((2.0, 0.3), (10.0, 20.0))),
            adapters: vec![],
            slo_ms: 3000.0,
            condition: Condition::PreemptionsUnder {
                router: "round_robin",
                min: 1,
            },
            // 1,024 tokens at ~35 ms per step after a burst's backlog.
            drain_s: 90.0,
        },
        "shared_prefix" => Design {
            engine: PodEngine::ModelSim,
            about: "4 A10G, multi-turn chats + document Q&A, working set > one pod's KV",
            card: SHARED_CARD,
            pods: pods(&["a10g"; 4], |_| {}),
            prompts: Prompts::SharedPrefix {
                conversations: 24,
                max_turns: 6,
                system_prompts: 8,
                system_tokens: 1500,
                turn_tokens: Range::new(50, 150),
                reply_tokens: 120,
                documents: 12,
                document_tokens: 4000,
                document_share: 0.5,
                max_tokens: Range::new(30, 120),
            },
            load: 0.6,
            bursts: None,
            adapters: vec![],
            slo_ms: 1500.0,
            condition: Condition::ColdReadsBelow { max_frac: 0.01 },
            drain_s: 30.0,
        },
        "lora" => Design {
            engine: PodEngine::ModelSim,
            about: "4 A10G, 32 adapters over 4 GPU slots + 12 CPU slots per pod",
            card: LORA_CARD,
            pods: pods(&["a10g"; 4], |p| {
                p.max_loras = Some(4);
                p.max_cpu_loras = Some(12);
            }),
            prompts: Prompts::Lora {
                adapters: 32,
                zipf_s: 1.0,
                base_share: 0.1,
                prompt_tokens: Range::new(200, 800),
                max_tokens: Range::new(30, 120),
            },
            load: 0.6,
            bursts: None,
            adapters: (0..32).map(adapter_name).collect(),
            slo_ms: 1000.0,
            condition: Condition::AdapterLoadsUnder {
                router: "round_robin",
                min_cpu: 1,
                min_disk: 1,
            },
            drain_s: 30.0,
        },
        "uniform" => Design {
            engine: PodEngine::ModelSim,
            about: "4 A10G, steady Poisson at half capacity (no gain expected)",
            card: UNIFORM_CARD,
            pods: pods(&["a10g"; 4], |_| {}),
            prompts: Prompts::Independent {
                prompt_tokens: Range::new(200, 1000),
                max_tokens: Range::new(50, 200),
            },
            load: 0.5,
            bursts: None,
            adapters: vec![],
            slo_ms: 1000.0,
            condition: Condition::None,
            drain_s: 30.0,
        },
        "long_prompt" => Design {
            engine: PodEngine::ModelSim,
            about: "4 H100, ~200 KB prompts",
            card: LONG_CARD,
            pods: pods(&["h100"; 4], |_| {}),
            prompts: Prompts::Independent {
                prompt_tokens: Range::new(48_000, 52_000),
                max_tokens: Range::new(20, 80),
            },
            load: 0.5,
            bursts: None,
            adapters: vec![],
            slo_ms: 8000.0,
            condition: Condition::None,
            drain_s: 30.0,
        },
        "vllm_uneven" => Design {
            engine: PodEngine::Vllm,
            about: "real vLLM: a fast and a slow pod (5.5 M vs 22 M parameters), Poisson just below what round robin sustains",
            card: VLLM_UNEVEN_CARD,
            pods: pods(&["cpu-small", "cpu-large"], real_limits),
            prompts: Prompts::Independent {
                prompt_tokens: Range::new(300, 1200),
                max_tokens: Range::new(30, 150),
            },
            // 80 % of 2 × the slow pod's capacity (what round robin can carry).
            load: 0.8 * 2.0 * pod_capacity("vllm_uneven", "cpu-large")
                / (pod_capacity("vllm_uneven", "cpu-small")
                    + pod_capacity("vllm_uneven", "cpu-large")),
            bursts: None,
            adapters: vec![],
            slo_ms: 1000.0,
            condition: Condition::None,
            drain_s: 30.0,
        },
        "vllm_shared_prefix" => Design {
            engine: PodEngine::Vllm,
            about: "real vLLM: 2 pods with real prefix caching, chats + document Q&A, working set > one pod's KV",
            card: VLLM_SHARED_CARD,
            pods: pods(&["cpu-small", "cpu-small"], |p| {
                real_limits(p);
                p.kv_blocks = Some(96);
            }),
            prompts: Prompts::SharedPrefix {
                conversations: 12,
                max_turns: 6,
                system_prompts: 6,
                system_tokens: 1000,
                turn_tokens: Range::new(50, 150),
                reply_tokens: 100,
                documents: 6,
                document_tokens: 2000,
                document_share: 0.5,
                max_tokens: Range::new(30, 100),
            },
            load: 0.6,
            bursts: None,
            adapters: vec![],
            slo_ms: 500.0,
            condition: Condition::ColdReadsBelow { max_frac: 0.01 },
            drain_s: 30.0,
        },
        "vllm_lora" => Design {
            engine: PodEngine::Vllm,
            about: "real vLLM: 2 LoRA pods, 8 adapters loaded at runtime over 2 batch slots each",
            card: VLLM_LORA_CARD,
            pods: pods(&["cpu-small", "cpu-small"], |p| {
                real_limits(p);
                p.max_loras = Some(2);
            }),
            prompts: Prompts::Lora {
                adapters: 8,
                zipf_s: 1.0,
                base_share: 0.1,
                prompt_tokens: Range::new(200, 800),
                max_tokens: Range::new(30, 120),
            },
            // Not 0.6 as the others: a slot-bound pod's closed-loop capacity overstates what it
            // serves in open loop. With 32 clients waiting, vLLM keeps filling its batch with
            // the running adapters' requests while the others starve, which a closed loop does
            // not show (one pod on an AMD EPYC machine: 5.0 req/s at 32 clients, 3.2 at 16, 2.4
            // at 8 with a mean TTFT of 1.8 s). At 0.6 every router overloaded, on the machine
            // whose capacity it was (TTFT p95 11.7–15.6 s under round robin, sglang-router and
            // the filter, 2 seeds, 2026-12-02); 0.45 is where `real-v1` found all eight routers
            // with a p95 near 1.2 s.
            load: 0.45,
            bursts: None,
            adapters: (0..8).map(adapter_name).collect(),
            slo_ms: 1000.0,
            condition: Condition::None,
            drain_s: 30.0,
        },
        "vllm_limited" => Design {
            engine: PodEngine::Vllm,
            about: "real vLLM: 2 pods of equal compute, one with 4 sequences and 48 KV blocks, light load",
            card: VLLM_LIMITED_CARD,
            // The limited pod first: the bench measures the first pod of each profile, so the
            // capacity below is the limited pod's.
            pods: pods(&["cpu-small", "cpu-small"], real_limits)
                .into_iter()
                .enumerate()
                .map(|(i, mut p)| {
                    if i == 0 {
                        p.max_num_seqs = Some(4);
                        p.kv_blocks = Some(48);
                    }
                    p
                })
                .collect(),
            prompts: Prompts::Independent {
                prompt_tokens: Range::new(300, 1200),
                max_tokens: Range::new(30, 150),
            },
            // Light: each pod gets a third of the limited pod's capacity under round robin, so
            // neither pod's limit binds (issue 40's case: round robin's TTFT p95 < 300 ms).
            load: 1.0 / 3.0,
            bursts: None,
            adapters: vec![],
            slo_ms: 1000.0,
            condition: Condition::None,
            drain_s: 30.0,
        },
        _ => return None,
    })
}

/// The limits every real pod runs with, so that its signals move: at most 16 sequences in the
/// batch (vLLM's CPU default, 128, lets a core take so many that the queue never forms and
/// every step crawls) and 128 KV blocks of 128 tokens (16,384 tokens: the default 1 GiB holds
/// 524,288, so KV use would stay near 0).
fn real_limits(p: &mut PodSpec) {
    p.max_num_seqs = Some(16);
    p.kv_blocks = Some(128);
}

const VLLM_UNEVEN_CARD: &str = "\
- **Fleet**: real vLLM 0.32 (CPU build), one core each: `cpu-small` (the 5.5 M-parameter tiny \
model) and `cpu-large` (22 M parameters, the \"slower GPU\"); `--max-num-seqs 16`, 128 KV blocks.
- **Traffic**: Poisson; prompts 300–1,200 tokens (4 characters each; ≈ 0.74 of that in the \
tiny model's own tokens), 30–150 output tokens (`ignore_eos`); 80% of 2 × the slow pod's \
measured capacity.
- **Anchor**: mixed speeds behind one endpoint, on a real engine.
- **Check**: none (real pods export no emulator gauges).
- **SLO**: TTFT p95 ≤ 1 s; **floor**: TTFT p95 alone on an idle `cpu-small`, from its fitted \
model-sim twin (CALIBRATION.md).";

const VLLM_SHARED_CARD: &str = "\
- **Fleet**: 2 real vLLM `cpu-small` pods, one core each, 96 KV blocks of 128 tokens (12,288 \
tokens each), real automatic prefix caching (reset between runs).
- **Traffic**: Poisson; 6 documents of 2,000 tokens asked about (50%) and multi-turn chats \
(≤ 6 turns) over 6 system prompts of 1,000 tokens: a working set of ≈ 13,000 of the model's \
tokens, larger than one pod's KV and smaller than the fleet's; 60% of 2 × one pod's measured \
capacity.
- **Anchor**: shared prompt prefixes in steady state, with real eviction.
- **Check**: every shared prefix is first read during the warm-up (cold reads < 1%).
- **SLO**: TTFT p95 ≤ 500 ms; **floor**: from the fitted twin, every prefix seen before cached.";

const VLLM_LORA_CARD: &str = "\
- **Fleet**: 2 real vLLM `cpu-small` pods with `--enable-lora --max-loras 2` (two adapters per \
batch), one core each; 8 adapters registered at runtime (`POST /v1/load_lora_adapter`) and \
kept in the CPU cache.
- **Traffic**: Poisson; 8 adapters (Zipf 1.0) + 10% base model; prompts 200–800, 30–120 out; \
45% of 2 × one pod's measured (closed-loop) capacity: at 60% every router overloads.
- **Anchor**: more adapters than batch slots: a request whose adapter finds both slots taken \
waits in the engine's queue (`waiting_lora_adapters`).
- **Check**: none.
- **SLO**: TTFT p95 ≤ 1 s; **floor**: from the fitted twin, the adapter resident.";

const VLLM_LIMITED_CARD: &str = "\
- **Fleet**: 2 real vLLM `cpu-small` pods, one core each, equal compute: one limited to \
`--max-num-seqs 4` and 48 KV blocks (6,144 tokens), the other with the real pods' 16 and 128.
- **Traffic**: Poisson; prompts 300–1,200 tokens, 30–150 output tokens (`ignore_eos`); a third \
of 2 × the limited pod's measured capacity: neither pod's limit binds.
- **Anchor**: issue 40's light-load case, where the filter sent 58–75 % of requests to the larger \
pod (its KV fraction is lower) and lost the median to round robin.
- **Check**: none.
- **SLO**: TTFT p95 ≤ 1 s; **floor**: TTFT p95 alone on an idle `cpu-small`, from its fitted \
model-sim twin (CALIBRATION.md).";

/// Measured capacity of `pods` for scenario `name`, emulated req/s.
fn fleet_capacity(name: &str, pods: &[PodSpec]) -> f64 {
    pods.iter().map(|p| pod_capacity(name, p.profile)).sum()
}

/// Build a scenario by name at its nominal load.
pub fn scenario(name: &str, mode: Mode) -> Option<Scenario> {
    build(name, mode, f64::NAN)
}

/// The same scenario at another mean offered rate (wall-clock req/s), for a goodput sweep:
/// everything else (fleet, prompt shapes, burst shape, seed) stays.
pub fn scenario_at(name: &str, mode: Mode, rate_rps: f64) -> Option<Scenario> {
    build(name, mode, rate_rps)
}

/// `rate_rps` NaN means the design's nominal load.
fn build(name: &str, mode: Mode, rate_rps: f64) -> Option<Scenario> {
    let name: &'static str = all_names().find(|n| *n == name)?;
    let d = design(name)?;
    // Real pods run in real time.
    let s = match d.engine {
        PodEngine::ModelSim => mode.speedup.max(0.01),
        PodEngine::Vllm => 1.0,
    };
    let capacity_rps = fleet_capacity(name, &d.pods) * s;
    let rate = if rate_rps.is_finite() && rate_rps > 0.0 {
        rate_rps
    } else {
        d.load * capacity_rps
    };
    let arrival = match d.bursts {
        None => Arrival::Poisson { rate },
        Some(((hi, lo), (on, off))) => {
            // The burst shape is fixed relative to the mean.
            let mean = (hi * on + lo * off) / (on + off);
            Arrival::Bursty {
                on_rate: rate * hi / mean,
                off_rate: rate * lo / mean,
                on_s: on / s,
                off_s: off / s,
            }
        }
    };
    // Warm-up: identical for every router, long enough to see every shared prefix once.
    let warm_requests = 60.0;
    let warmup = if mode.quick {
        (warm_requests / rate).clamp(3.0, 5.0)
    } else {
        (warm_requests / rate).clamp(10.0, 30.0)
    };
    // Window: quick ~12 s; full ≥ 2,100 measured requests (≥ 21 above the p99), whole burst
    // cycles, capped at 5 minutes.
    let mut window = if mode.quick {
        12.0
    } else {
        (2100.0 / rate).clamp(60.0, 300.0)
    };
    if let Some((_, (on, off))) = d.bursts {
        let period = (on + off) / s;
        let cycles = (window / period)
            .ceil()
            .max(if mode.quick { 1.0 } else { 10.0 });
        window = cycles * period;
    }
    let horizon = Duration::from_secs_f64(warmup + window);
    let workload = WorkloadSpec {
        seed: mode.seed,
        arrival,
        horizon,
        max_requests: if mode.quick { 2_000 } else { 40_000 },
        model: MODEL.to_string(),
        prompts: d.prompts,
        tagging: None,
    };
    let fleet = FleetSpec {
        pods: d.pods,
        speedup: s,
        seed: mode.seed,
        engine: d.engine,
        admission: None,
    };
    let warmup = Duration::from_secs_f64(warmup);
    let floor_ms = floor_ms(&fleet, &generate(&workload), warmup);
    let drain =
        Duration::from_secs_f64(f64::max(if mode.quick { 8.0 } else { 30.0 }, d.drain_s / s));
    Some(Scenario {
        name,
        about: d.about,
        card: d.card,
        fleet,
        workload,
        adapters: d.adapters,
        warmup,
        drain,
        rate_rps: rate,
        capacity_rps,
        slo_ttft_ms: d.slo_ms / s,
        floor_ms,
        condition: d.condition,
        filter_config: serde_json::Value::Null,
        client_headers: vec![],
    })
}

/// The flow-control scenarios (issue 21), run by `bench flow`, not by `bench run`: each is a
/// standard scenario's fleet and prompts with who each request is, and the load that makes
/// holding matter.
pub const FLOW_NAMES: [&str; 6] = [
    "flow_bands",
    "flow_tenants",
    "flow_tenants_alone",
    "flow_overload",
    "flow_overload_vllm",
    "flow_canary",
];

/// llm-d's objective header: the request's band through the filter's `objectives` allowlist.
pub const OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// llm-d's per-request TTFT objective header (ms), sent by `bench flow --slo-header`.
pub const SLO_HEADER: &str = "x-slo-ttft-ms";
/// llm-d's fairness-id header: the tenant.
pub const FAIRNESS_HEADER: &str = "x-llm-d-inference-fairness-id";
/// The model name clients ask for in `flow_canary`; a rewrite rule splits it.
pub const CANARY_MODEL: &str = "llama";

/// The deployment a gateway with trusted identity headers has: the shipped `jwt_authn` chain
/// (`envoy/identity/`) writes them, so the filter trusts them; the objectives allowlist names
/// the three bands as llm-d's `InferenceObjective` priorities do.
fn trusted_identity() -> serde_json::Value {
    serde_json::json!({
        "priority": {"trust_headers": true},
        "objectives": {"critical": 1, "standard": 0, "sheddable": -1},
    })
}

/// An overload run judges what became of every request (served, or refused with 429), so it
/// watches until the filter has settled each one it holds: the drain after the last arrival
/// outlasts the longest time to live of its bands (the default's, in wall time at the fleet's
/// speed-up, as [`crate::stack::in_emulated_time`] sets it) by 5 s. The same drain for every
/// router: an engine's own queue gets as long to empty. Without it a request held within its
/// time to live when the drain ended counted as lost.
fn drain_past_time_to_live(s: &mut Scenario) {
    let flow = llm_router_core::flow::FlowConfig::default();
    let ttl_ms = flow.bands.iter().map(|b| b.ttl_ms).max().unwrap_or(0);
    let speedup = if s.fleet.speedup > 1.0 {
        s.fleet.speedup
    } else {
        1.0
    };
    let ttl = Duration::from_secs_f64(ttl_ms as f64 / 1000.0 / speedup);
    s.drain = s.drain.max(ttl + Duration::from_secs(5));
}

/// The admission bound an operator gives a router that has one, for `s`'s fleet and requests
/// ([`crate::stack::fleet::AdmissionBound`]), so routers with admission are compared like with like:
///
/// - in flight: per pod, as many requests as fit in its KV cache at their longest (prompt plus
///   `max_tokens`, the workload's mean), at most its `max_num_seqs`: admitted requests never
///   preempt one another; summed over the pods;
/// - queue: 100, SMG's documented default (`--queue-size`);
/// - time in the queue: the filter's longest band time to live in wall time, so a router's
///   queue may hold a request as long as the filter may.
///
/// No figure of a run enters it: it is a rule an operator can apply to any fleet.
pub fn admission_for(s: &Scenario) -> crate::stack::fleet::AdmissionBound {
    let reqs = generate(&s.workload);
    let mean_tokens = if reqs.is_empty() {
        1.0
    } else {
        reqs.iter()
            .map(|r| {
                r.prompt_chars as f64 / f64::from(crate::loadgen::workload::CHARS_PER_TOKEN)
                    + f64::from(r.max_tokens)
            })
            .sum::<f64>()
            / reqs.len() as f64
    };
    let in_flight: u32 = s
        .fleet
        .pods
        .iter()
        .map(|p| {
            let Ok(mut prof) = Profile::by_name(p.profile) else {
                return 1;
            };
            if let Some(n) = p.kv_blocks {
                prof.num_gpu_blocks = n;
            }
            let seqs = p.max_num_seqs.unwrap_or(prof.max_num_seqs);
            let fit = (prof.kv_tokens() as f64 / mean_tokens.max(1.0)).floor() as u32;
            fit.clamp(1, seqs.max(1))
        })
        .sum();
    let flow = llm_router_core::flow::FlowConfig::default();
    let ttl_ms = flow.bands.iter().map(|b| b.ttl_ms).max().unwrap_or(0);
    crate::stack::fleet::AdmissionBound {
        in_flight,
        queue: 100,
        queue_timeout: Duration::from_secs_f64(ttl_ms as f64 / 1000.0 / s.fleet.speedup.max(1.0)),
    }
}

/// Build a flow scenario ([`FLOW_NAMES`]) by name.
///
/// - `flow_bands`: `bursty` as it is, each request critical (20 %), standard (50 %) or
///   sheddable (30 %) by its objective header.
/// - `flow_tenants`: `bursty`'s fleet and prompts, Poisson at 1.2× the fleet's measured
///   capacity (saturated), two tenants by fairness id, `heavy` sending 10× `light`'s rate.
/// - `flow_tenants_alone`: the same workload with only `light`'s requests (the same requests
///   at the same times): its TTFT when alone.
/// - `flow_overload`: `bursty`'s fleet and prompts, Poisson at 1.5× the fleet's measured
///   capacity; `bench flow` sends it for 60 emulated seconds from an idle fleet and counts
///   every request.
/// - `flow_canary`: 4 `h100`, short prompts asking for [`CANARY_MODEL`], a 90/10 rewrite rule
///   to the base model and [`CANARY_TARGET`]; 10,000 requests (full), 2,000 (quick).
pub fn flow_scenario(name: &str, mode: Mode) -> Option<Scenario> {
    let name: &'static str = FLOW_NAMES.iter().find(|n| **n == name)?;
    let bursty = scenario("bursty", mode)?;
    let poisson_at = |load: f64| {
        let mut s = bursty.clone();
        let rate = load * s.capacity_rps;
        s.rate_rps = rate;
        s.workload.arrival = Arrival::Poisson { rate };
        s
    };
    let tenants = || {
        let mut s = poisson_at(1.2);
        s.workload.tagging = Some(Tagging::new(
            FAIRNESS_HEADER,
            &[("heavy", 10.0), ("light", 1.0)],
        ));
        s.filter_config = trusted_identity();
        s
    };
    let mut s = match name {
        "flow_bands" => {
            let mut s = bursty.clone();
            s.workload.tagging = Some(Tagging::new(
                OBJECTIVE_HEADER,
                &[("critical", 0.2), ("standard", 0.5), ("sheddable", 0.3)],
            ));
            s.filter_config = trusted_identity();
            s.about = "bursty with 20 % critical, 50 % standard, 30 % sheddable requests";
            s
        }
        "flow_tenants" => {
            let mut s = tenants();
            s.about = "bursty's fleet saturated (1.2x capacity), tenant heavy at 10x light's rate";
            s
        }
        "flow_tenants_alone" => {
            let mut s = tenants();
            if let Some(t) = s.workload.tagging.as_mut() {
                t.only = Some("light".into());
            }
            s.rate_rps /= 11.0;
            s.about = "flow_tenants' light tenant alone (the same requests)";
            s
        }
        "flow_overload" => {
            let mut s = poisson_at(1.5);
            s.warmup = Duration::ZERO;
            s.workload.horizon = Duration::from_secs_f64(60.0 / mode.speedup.max(0.01));
            drain_past_time_to_live(&mut s);
            s.fleet.admission = Some(admission_for(&s));
            s.about = "bursty's fleet offered 1.5x its capacity for 60 s";
            s
        }
        "flow_overload_vllm" => {
            let mut s = scenario("vllm_uneven", mode)?;
            let rate = 1.5 * s.capacity_rps;
            s.rate_rps = rate;
            s.workload.arrival = Arrival::Poisson { rate };
            s.warmup = Duration::ZERO;
            s.workload.horizon = Duration::from_secs(60);
            drain_past_time_to_live(&mut s);
            s.fleet.admission = Some(admission_for(&s));
            s.about = "vllm_uneven's real fleet offered 1.5x its capacity for 60 s";
            s
        }
        "flow_canary" => {
            let mut s = scenario("uniform", mode)?;
            s.fleet.pods = pods(&["h100"; 4], |_| {});
            let n = if mode.quick { 2_000 } else { 10_000 };
            // Wall-clock rate: light work, as fast as this machine carries it comfortably.
            let rate = 100.0;
            s.rate_rps = rate;
            s.warmup = Duration::ZERO;
            s.workload.arrival = Arrival::Poisson { rate };
            s.workload.max_requests = n;
            // Poisson arrivals: n ± √n requests.
            s.workload.horizon = Duration::from_secs_f64(n as f64 / rate);
            s.workload.model = CANARY_MODEL.to_string();
            s.workload.prompts = Prompts::Independent {
                prompt_tokens: Range::new(20, 60),
                max_tokens: Range::new(1, 8),
            };
            s.adapters = vec![CANARY_TARGET.to_string()];
            s.filter_config = serde_json::json!({"rewrites": [{"model": CANARY_MODEL, "targets": [
                {"model": MODEL, "weight": CANARY_WEIGHTS.0},
                {"model": CANARY_TARGET, "weight": CANARY_WEIGHTS.1}]}]});
            s.about = "a 90/10 canary rewrite over short requests";
            s
        }
        _ => return None,
    };
    s.name = name;
    s.card = "";
    Some(s)
}

/// The TTFT p95 (wall-clock ms) a perfect router could reach: every measured request served
/// alone on an idle pod of the fleet's fastest profile whose prefix cache holds every prefix
/// seen before (as big as the whole fleet's KV) and whose adapters are resident. Cold reads pay
/// their full prefill; nothing waits. Computed with model-sim's engine on a simulated clock.
pub fn floor_ms(fleet: &FleetSpec, reqs: &[RequestSpec], warmup: Duration) -> f64 {
    floor_percentile_ms(fleet, reqs, warmup, 95.0)
}

/// [`floor_ms`] at another percentile (`p` in 0..=100) of the requests from `warmup` on.
pub fn floor_percentile_ms(
    fleet: &FleetSpec,
    reqs: &[RequestSpec],
    warmup: Duration,
    percentile: f64,
) -> f64 {
    let ttfts: Vec<f64> = floor_ttfts(fleet, reqs)
        .into_iter()
        .filter(|(r, _)| r.at >= warmup)
        .map(|(_, ttft)| ttft)
        .collect();
    if ttfts.is_empty() {
        return 0.0;
    }
    crate::analysis::stats::percentile(&ttfts, percentile) * 1000.0
}

/// Each request's time to first token (wall-clock seconds) as [`floor_ms`] counts it: served
/// alone on an idle pod of the fleet's fastest profile, every prefix seen before cached, every
/// adapter resident. Requests the engine cannot parse or take are left out. The per-request
/// form lets a run compare the floor with a router seed by seed, on the same request ids.
pub fn floor_ttfts<'a>(fleet: &FleetSpec, reqs: &'a [RequestSpec]) -> Vec<(&'a RequestSpec, f64)> {
    let profiles: Vec<Profile> = fleet
        .pods
        .iter()
        .filter_map(|p| Profile::by_name(p.profile).ok())
        .collect();
    let Some(best) = profiles
        .iter()
        .min_by(|a, b| a.prefill_per_token_s.total_cmp(&b.prefill_per_token_s))
    else {
        return Vec::new();
    };
    let mut p = best.scaled(fleet.speedup);
    p.num_gpu_blocks = profiles.iter().map(|x| x.num_gpu_blocks).sum();
    p.lora_load_s = 0.0;
    p.lora_cpu_load_s = 0.0;
    let mut e = Engine::new(p, 4096);
    let mut t = 0.0;
    let mut out = Vec::new();
    let mut events = Vec::new();
    for r in reqs {
        let Ok(parsed) = parse(Api::Chat, &r.body) else {
            continue;
        };
        let adapter: Option<Arc<str>> = (r.model != MODEL).then(|| Arc::from(r.model.as_str()));
        let n = NewRequest {
            prompt_tokens: parsed.tokens.len().max(1) as u32,
            output_tokens: 1,
            max_tokens: 1,
            block_hashes: block_hashes(&parsed.tokens, 16, adapter.as_deref()),
            adapter,
        };
        if e.submit(n, t).is_err() {
            continue;
        }
        // Run the engine until this request produced its token.
        while let Some(end) = e.begin_step(t) {
            events.clear();
            e.finish_step(end, &mut events);
            t = end;
            if let Some(ttft) = events.iter().find_map(|ev| match ev {
                Event::Finished { ttft, .. } => Some(*ttft),
                _ => None,
            }) {
                out.push((r, ttft));
                break;
            }
        }
        t += 1.0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Mode {
        Mode::quick(42)
    }

    #[test]
    fn every_name_builds_and_is_deterministic() {
        for n in NAMES {
            let a = scenario(n, quick()).unwrap();
            let b = scenario(n, quick()).unwrap();
            assert_eq!(a.name, n);
            let (wa, wb) = (generate(&a.workload), generate(&b.workload));
            assert!(!wa.is_empty(), "{n}");
            assert_eq!(wa, wb, "{n}");
            assert_eq!(a.fleet, b.fleet);
            assert!(
                a.floor_ms > 0.0 && a.floor_ms < a.slo_ttft_ms,
                "{n}: floor {} slo {}",
                a.floor_ms,
                a.slo_ttft_ms
            );
            assert!(a.rate_rps > 0.0 && a.capacity_rps > a.rate_rps * 0.5, "{n}");
            assert!(!a.card.is_empty());
            // Quick mode stays small: ~15 s of arrivals.
            assert!(
                a.workload.horizon <= Duration::from_secs(21),
                "{n}: {:?}",
                a.workload.horizon
            );
        }
        assert!(scenario("nope", quick()).is_none());
    }

    #[test]
    fn flow_scenarios_say_who_each_request_is_and_load_the_fleet_as_the_issue_asks() {
        let m = quick();
        let bursty = scenario("bursty", m).unwrap();
        let bands = flow_scenario("flow_bands", m).unwrap();
        let reqs = generate(&bands.workload);
        // bursty's arrivals and prompts, plus the objective header in 20/50/30.
        assert_eq!(reqs.len(), generate(&bursty.workload).len());
        let share = |v: &str| {
            reqs.iter()
                .filter(|r| r.header == Some((OBJECTIVE_HEADER.into(), v.into())))
                .count() as f64
                / reqs.len() as f64
        };
        assert!(
            (share("critical") - 0.2).abs() < 0.05,
            "{}",
            share("critical")
        );
        assert!((share("sheddable") - 0.3).abs() < 0.05);
        assert_eq!(bands.filter_config["priority"]["trust_headers"], true);
        assert_eq!(bands.filter_config["objectives"]["sheddable"], -1);
        // Tenants: saturated, and the light tenant alone is the same requests at the same times.
        let mix = flow_scenario("flow_tenants", m).unwrap();
        assert!((mix.rate_rps / mix.capacity_rps - 1.2).abs() < 1e-9);
        let alone = flow_scenario("flow_tenants_alone", m).unwrap();
        let (all, light) = (generate(&mix.workload), generate(&alone.workload));
        let light_in_mix: Vec<_> = all
            .iter()
            .filter(|r| r.header.as_ref().is_some_and(|h| h.1 == "light"))
            .collect();
        assert_eq!(light.len(), light_in_mix.len());
        assert!(light
            .iter()
            .zip(&light_in_mix)
            .all(|(a, b)| a.id == b.id && a.at == b.at));
        let heavy = all.len() - light.len();
        assert!((7.0..14.0).contains(&(heavy as f64 / light.len() as f64)));
        // Overload: 1.5x capacity for 60 emulated seconds, all of it measured.
        let o = flow_scenario("flow_overload", m).unwrap();
        assert!((o.rate_rps / o.capacity_rps - 1.5).abs() < 1e-9);
        assert_eq!(
            o.workload.horizon,
            Duration::from_secs_f64(60.0 / m.speedup)
        );
        assert_eq!(o.warmup, Duration::ZERO);
        // Each overload run watches past the filter's time to live, so a request it still
        // holds is never counted lost (real pods: wall time; model-sim: emulated).
        let ttl = llm_router_core::flow::FlowConfig::default().bands[1].ttl_ms as f64 / 1000.0;
        let past = |s: &Scenario, speedup: f64| s.drain.as_secs_f64() >= ttl / speedup + 5.0;
        assert!(past(&o, m.speedup.max(1.0)), "{:?}", o.drain);
        let real = flow_scenario("flow_overload_vllm", m).unwrap();
        assert_eq!(real.fleet.speedup, 1.0);
        assert!(past(&real, 1.0), "{:?}", real.drain);
        assert!(!past(&bursty, 1.0), "other scenarios keep their drain");
        // Routers with admission get the operator's bound for the fleet: what fits in KV at
        // the requests' longest, far below max_num_seqs (4 × 1,024); SMG's queue; the filter's
        // time to live. Less KV, a smaller bound; other scenarios size none.
        let a = o.fleet.admission.unwrap();
        assert_eq!(a, admission_for(&o));
        assert!((4..=400).contains(&a.in_flight), "{a:?}");
        assert_eq!(a.queue, 100);
        assert_eq!(
            a.queue_timeout,
            Duration::from_secs_f64(ttl / m.speedup.max(1.0))
        );
        let mut small = o.clone();
        for p in &mut small.fleet.pods {
            p.kv_blocks = Some(900);
        }
        assert!(admission_for(&small).in_flight < a.in_flight);
        assert!(real.fleet.admission.is_some());
        assert!(bursty.fleet.admission.is_none());
        // Canary: clients ask for one name; a 90/10 rule splits it.
        let c = flow_scenario("flow_canary", Mode::full(1)).unwrap();
        let n = generate(&c.workload).len();
        assert!((9_500..10_500).contains(&n), "{n}");
        let rule = &c.filter_config["rewrites"][0];
        assert_eq!(rule["model"], CANARY_MODEL);
        assert_eq!(rule["targets"][1]["model"], CANARY_TARGET);
        assert!(flow_scenario("bursty", m).is_none());
    }

    #[test]
    fn scenario_at_changes_only_the_rate() {
        let a = scenario("bursty", quick()).unwrap();
        let b = scenario_at("bursty", quick(), a.rate_rps * 2.0).unwrap();
        assert!(
            (b.workload.arrival.mean_rate() - 2.0 * a.workload.arrival.mean_rate()).abs() < 1e-6
        );
        assert_eq!(a.fleet, b.fleet);
        assert_eq!(a.workload.prompts, b.workload.prompts);
        assert_eq!(a.slo_ttft_ms, b.slo_ttft_ms);
        let n1 = generate(&a.workload).len() as f64;
        let n2 = generate(&b.workload).len() as f64;
        assert!(n2 > 1.5 * n1, "{n1} {n2}");
    }

    #[test]
    fn real_scenarios_run_in_real_time_on_profiles_with_a_real_twin() {
        for n in REAL_NAMES {
            for mode in [quick(), Mode::full(5)] {
                let s = scenario(n, mode).unwrap();
                assert_eq!(s.fleet.engine, PodEngine::Vllm, "{n}");
                assert_eq!(s.fleet.speedup, 1.0, "{n}: real pods run in real time");
                assert!(s.fleet.pods.iter().all(|p| {
                    crate::stack::realpods::model_size(p.profile).is_some()
                        && p.max_num_seqs.is_some()
                        && p.kv_blocks.is_some()
                }));
                assert!(s.rate_rps > 0.0 && s.rate_rps < s.capacity_rps, "{n}");
                assert!(s.floor_ms > 0.0 && s.floor_ms < s.slo_ttft_ms, "{n}");
                // Every prompt fits the real model's 4,096 tokens (characters ÷ its measured
                // characters per token, with room for the chat template).
                let longest = generate(&s.workload)
                    .iter()
                    .map(|r| r.body.len())
                    .max()
                    .unwrap();
                let tokens = longest as f64 / model_sim::profile::TINY_CHARS_PER_TOKEN;
                assert!(tokens < 3900.0, "{n}: ~{tokens:.0} tokens");
            }
        }
        // Emulated scenarios stay emulated.
        for n in NAMES {
            assert_eq!(
                scenario(n, quick()).unwrap().fleet.engine,
                PodEngine::ModelSim
            );
        }
    }

    #[test]
    fn full_mode_has_enough_tail_samples_and_ten_bursts() {
        for n in NAMES {
            let s = scenario(n, Mode::full(1)).unwrap();
            let reqs = generate(&s.workload);
            let measured = reqs.iter().filter(|r| r.at >= s.warmup).count();
            // ≥ 20 samples above the p99, unless the 5-minute cap bites (low-rate scenarios).
            let cap = s.workload.horizon >= Duration::from_secs(300);
            assert!(measured >= 2000 || cap, "{n}: {measured}");
        }
        let b = scenario("bursty", Mode::full(1)).unwrap();
        let Arrival::Bursty { on_s, off_s, .. } = b.workload.arrival else {
            panic!("bursty must burst");
        };
        let bursts = (b.workload.horizon.as_secs_f64() - b.warmup.as_secs_f64()) / (on_s + off_s);
        assert!(bursts >= 10.0 - 1e-9, "{bursts}");
    }

    #[test]
    fn shared_prefix_working_set_sits_between_one_pod_and_the_fleet() {
        let s = scenario("shared_prefix", Mode::full(3)).unwrap();
        let reqs = generate(&s.workload);
        // Distinct 16-token blocks the workload ever reads = its working set of prefixes.
        let mut blocks = std::collections::HashSet::new();
        for r in &reqs {
            let p = parse(Api::Chat, &r.body).unwrap();
            blocks.extend(block_hashes(&p.tokens, 16, None));
        }
        let per_pod = Profile::a10g().num_gpu_blocks as usize;
        let fleet = per_pod * s.fleet.pods.len();
        // Shared prefixes only: documents and system prompts (not every conversation's history).
        let docs_and_systems = 12 * 4000 / 16 + 8 * 1500 / 16;
        eprintln!("blocks ever read {}, shared prefixes ≈ {docs_and_systems}, pod {per_pod}, fleet {fleet}", blocks.len());
        assert!(docs_and_systems > per_pod && docs_and_systems < fleet);
        // Steady state: cold reads are rare once the warm-up has seen every prefix.
        let cold = s.cold_read_fraction();
        assert!(cold < 0.01, "cold reads {cold}");
        let q = scenario("shared_prefix", quick()).unwrap();
        assert!(q.cold_read_fraction() < 0.01, "{}", q.cold_read_fraction());
    }

    #[test]
    fn the_floor_counts_prefill_and_prefix_hits() {
        // Long prompts cost more than short ones on the same fleet; a shared-prefix workload's
        // floor is below its documents' cold prefill.
        let long = scenario("long_prompt", quick()).unwrap();
        let uni = scenario("uniform", quick()).unwrap();
        assert!(
            long.floor_ms > 20.0 * uni.floor_ms / 4.0,
            "{} {}",
            long.floor_ms,
            uni.floor_ms
        );
        let sp = scenario("shared_prefix", quick()).unwrap();
        let cold_doc_ms = 4000.0 * Profile::a10g().prefill_per_token_s * 1000.0 / QUICK_SPEEDUP;
        assert!(
            sp.floor_ms < cold_doc_ms,
            "{} vs {cold_doc_ms}",
            sp.floor_ms
        );
    }

    #[test]
    fn long_prompt_bodies_are_about_200_kb() {
        let s = scenario("long_prompt", quick()).unwrap();
        for r in generate(&s.workload) {
            assert!(
                (180_000..230_000).contains(&r.body.len()),
                "{}",
                r.body.len()
            );
        }
    }

    #[test]
    fn fleets_match_their_cards() {
        let profiles = |n: &str| -> Vec<&str> {
            scenario(n, quick())
                .unwrap()
                .fleet
                .pods
                .iter()
                .map(|p| p.profile)
                .collect()
        };
        assert_eq!(profiles("mixed_gpu"), ["h100", "h100", "a10g", "a10g"]);
        assert_eq!(profiles("bursty"), ["h100-70b"; 4]);
        let l = scenario("lora", quick()).unwrap();
        assert!(l
            .fleet
            .pods
            .iter()
            .all(|p| p.max_loras == Some(4) && p.max_cpu_loras == Some(12)));
        assert!(
            l.adapters.len() > 4 * 4,
            "more adapters than the fleet's GPU slots"
        );
    }
}
