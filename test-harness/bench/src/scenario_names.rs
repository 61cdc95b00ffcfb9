//! The benchmark's scenario names, in the order of the report's tables: the emulated ones
//! ([`SCENARIOS`], what `bench run` runs by default) and those on real vLLM pods
//! ([`REAL_SCENARIOS`]); and the canary's names, which the flow verdict reads. What each
//! scenario is, is [`crate::experiments::scenarios`]'s.

/// Scenario names, in the order of the tables.
pub const SCENARIOS: [&str; 6] = [
    "mixed_gpu",
    "bursty",
    "shared_prefix",
    "lora",
    "uniform",
    "long_prompt",
];
/// Scenarios on real vLLM pods (CPU build, the project's tiny models; `./build.sh setup-vllm`),
/// in the order of the tables after [`SCENARIOS`]; run only when named (`--scenario`).
pub const REAL_SCENARIOS: [&str; 4] = [
    "vllm_uneven",
    "vllm_shared_prefix",
    "vllm_lora",
    "vllm_limited",
];

/// Every scenario a report may hold, in table order: the emulated ones, then the real ones.
pub fn all_scenarios() -> impl Iterator<Item = &'static str> {
    SCENARIOS.into_iter().chain(REAL_SCENARIOS)
}

/// The canary's served name (an adapter of the pool, so model-sim serves it).
pub const CANARY_TARGET: &str = "adapter-canary";
/// The canary rule's weights: stable, canary.
pub const CANARY_WEIGHTS: (u32, u32) = (90, 10);
