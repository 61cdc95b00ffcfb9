//! What a benchmark run's pods are: the model they serve ([`MODEL`]), each pod ([`PodSpec`]),
//! what serves them ([`PodEngine`]) and the whole fleet ([`FleetSpec`]). Started by
//! [`crate::stack`] (emulated pods) and [`crate::stack::realpods`] (real vLLM).

use std::time::Duration;

/// The base model every pod serves.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// One pod: emulated (model-sim) or, in a [`PodEngine::Vllm`] fleet, a real vLLM instance.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSpec {
    /// GPU profile (`h100`, `a10g`, `h100-70b`; `cpu-small`, `cpu-large`: the tiny models on
    /// real vLLM's CPU build, and their fitted twins in model-sim).
    pub profile: &'static str,
    /// LoRA slots, if not the emulator's default (real vLLM: `--max-loras`, default 1).
    pub max_loras: Option<u32>,
    /// CPU LoRA cache (`--max-cpu-loras`), if not the emulator's default (= `max_loras`).
    pub max_cpu_loras: Option<u32>,
    /// `--max-num-seqs`, if not the profile's.
    pub max_num_seqs: Option<u32>,
    /// KV blocks (`--num-gpu-blocks-override` on vLLM, `--num-gpu-blocks` on model-sim), if
    /// not the profile's.
    pub kv_blocks: Option<u32>,
    /// The CPU core a real pod is pinned to (default: pod `i` on core `i mod cores`).
    pub core: Option<usize>,
    /// Output length mode (`--output-len max|uniform|lognormal`), if not the default (max).
    pub output_len: Option<&'static str>,
    /// A lying pod (`--lie-metrics`): `/metrics` reports an empty engine whatever its state.
    pub lie_metrics: bool,
}

impl PodSpec {
    /// A pod of `profile` with the emulator's defaults otherwise.
    pub fn new(profile: &'static str) -> Self {
        PodSpec {
            profile,
            ..PodSpec::default()
        }
    }
}

/// What serves a fleet's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodEngine {
    /// model-sim, the emulator: fresh pods for every run.
    #[default]
    ModelSim,
    /// Real vLLM (CPU build, `./build.sh setup-vllm`): started once and reset between runs
    /// ([`crate::stack::realpods`]); speed-up 1.
    Vllm,
}

/// The fleet of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    /// The pods.
    pub pods: Vec<PodSpec>,
    /// Emulator time speed-up (times are divided by it; 1 for real pods).
    pub speedup: f64,
    /// Seed of the pods (pod i gets seed + i).
    pub seed: u64,
    /// Emulated or real pods.
    pub engine: PodEngine,
    /// The admission bound of the routers that have one
    /// ([`crate::stack::RouterKind::admits`]); `None` where the scenario judges no overload
    /// (such a router then refuses to start).
    pub admission: Option<AdmissionBound>,
}

/// What a router with admission control may hold, sized by the scenario for its fleet the way
/// an operator sizes it (the bench's `experiments::scenarios::admission_for`), the same for every
/// router that admits ([`crate::stack::RouterKind::ADMISSION`]). The filter's flow control is not
/// sized by it: it holds on the engines' state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionBound {
    /// Requests in flight through the router to the pool.
    pub in_flight: u32,
    /// Requests waiting at the router for one of those places.
    pub queue: u32,
    /// How long one may wait there (wall time), where the router has such a bound (SMG).
    pub queue_timeout: Duration,
}
