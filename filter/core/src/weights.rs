//! The scorers' names and a pool's weights for them ([`Weights`], from a preset in [`PRESETS`]
//! or the configuration): what the configuration holds of scoring, apart from the scorers
//! themselves ([`crate::score::SCORERS`], in the same order).

/// Number of scorers.
pub const N: usize = 7;

/// Every scorer's name in the configuration (`weights.<name>`), in
/// [`crate::score::SCORERS`] order.
pub const NAMES: [&str; N] = [
    "ttft", "queue", "kv_cache", "prefix", "lora", "load", "affinity",
];

/// Named weight sets, one weight per scorer in [`NAMES`] order:
/// `ttft, queue, kv_cache, prefix, lora, load, affinity`.
pub const PRESETS: [(&str, [f64; N]); 3] = [
    // Interactive traffic: predicted time to first token first (it already counts queued work,
    // each pod's learned speed, the prefill a cached prefix saves and what leaving an adapter's
    // home costs); the engine's queue and KV gauges add what other proxies sent; the replica
    // affinity only breaks near-ties.
    ("latency", [4.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.3]),
    // Offline batch: pack for cache reuse and free KV, tolerate queues.
    ("throughput", [1.0, 1.0, 3.0, 3.0, 4.0, 1.0, 0.3]),
    // The Gateway API Inference Extension's default weights (queue 2, kv 2, prefix 3).
    ("gaie", [0.0, 2.0, 2.0, 3.0, 0.0, 0.0, 0.0]),
];

/// A pool's weight per scorer, in [`NAMES`] order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights(pub [f64; N]);

impl Weights {
    /// The weights of a preset by name.
    pub fn preset(name: &str) -> Option<Weights> {
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, w)| Weights(*w))
    }

    /// The default preset's weights.
    pub fn default_preset() -> Weights {
        Weights(PRESETS[0].1)
    }

    /// Index of a scorer by name.
    pub fn index(name: &str) -> Option<usize> {
        NAMES.iter().position(|n| *n == name)
    }

    /// Weight of the scorer named `name` (0 for unknown names).
    pub fn get(&self, name: &str) -> f64 {
        Weights::index(name)
            .and_then(|i| self.0.get(i))
            .copied()
            .unwrap_or(0.0)
    }

    /// Scorer names, for messages.
    pub fn names() -> String {
        NAMES.join(", ")
    }
}
