//! Flow control: requests wait in the proxy while their pool is full, instead of joining a pod's
//! queue early (issue 21, "hold, don't dump").
//!
//! Two parts, both pure (time is passed in, nothing here knows proxy-wasm):
//!
//! - [`admit`]: the admission stage of [`crate::Router`]'s pipeline. Given the pool's pods as the
//!   router sees them (trusted gauges, this proxy's live load table) and the request's predicted
//!   work, can some pod take it without passing a saturation bound? If none can, the request
//!   waits; the pods that can are the only candidates the ranking chooses from.
//! - [`queue`]: where waiting requests wait, per pool: bands by integer priority (strict order,
//!   higher first), round robin between fairness ids within a band, first come first served
//!   within one id; per priority class bounds (`max_requests`, `max_bytes`) and a time to live.
//!
//! Priority classes follow llm-d's `InferenceObjective.priority`: `< 0` sheddable, `0` standard,
//! `> 0` critical. Sheddable requests are the first to go: they are refused when the pool is
//! saturated (as before flow control), and a waiting sheddable request is displaced when the
//! queue is full and a request of a higher class arrives.

pub mod admit;
pub mod queue;
pub mod summary;

pub use admit::{admit, Admission, PodRoom};
pub use queue::{Band, Pushed, Queue, Refusal};

/// The three priority classes, each with its own bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Sheddable,
    Standard,
    Critical,
}

impl Class {
    pub fn of(priority: i32) -> Class {
        match priority {
            p if p < 0 => Class::Sheddable,
            0 => Class::Standard,
            _ => Class::Critical,
        }
    }

    /// Index into per-class arrays (`[sheddable, standard, critical]`).
    pub fn index(self) -> usize {
        match self {
            Class::Sheddable => 0,
            Class::Standard => 1,
            Class::Critical => 2,
        }
    }

    /// Label value in metrics and the configuration key.
    pub fn name(self) -> &'static str {
        match self {
            Class::Sheddable => "sheddable",
            Class::Standard => "standard",
            Class::Critical => "critical",
        }
    }

    pub const ALL: [Class; 3] = [Class::Sheddable, Class::Standard, Class::Critical];
}

/// Bounds of one priority class of one pool's queue (on one Envoy worker: each worker holds
/// the streams it paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandLimits {
    /// Requests waiting at most.
    pub max_requests: usize,
    /// Request body bytes held at most.
    pub max_bytes: usize,
    /// Longest wait (ms); then the request is refused with 429.
    pub ttl_ms: u64,
}

impl Default for BandLimits {
    fn default() -> Self {
        // llm-d's default TTL is 60 s; its per-band request bound is 5,000 per gateway. Here the
        // bound is per Envoy worker and the body is held in the VM's memory: 1,000 requests and
        // 64 MiB per class keep a worker's queue well inside a Wasm VM's memory.
        BandLimits {
            max_requests: 1000,
            max_bytes: 64 * 1024 * 1024,
            ttl_ms: 60_000,
        }
    }
}

/// The `flow` section of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowConfig {
    /// Hold requests while their pool is full (else every request is routed at once, the
    /// behaviour before flow control).
    pub enabled: bool,
    /// Bounds of a pool's whole queue (every class): when it is full, a request of a higher
    /// class than sheddable displaces the newest waiting sheddable one.
    pub max_requests: usize,
    pub max_bytes: usize,
    /// Per class, `[sheddable, standard, critical]`.
    pub bands: [BandLimits; 3],
    /// How often a worker with waiting requests tries to dispatch them (ms).
    pub tick_ms: u64,
    /// A worker's published queue summary older than this is ignored by the others (ms): a
    /// worker that stopped cannot hold the pool's order.
    pub summary_stale_ms: u64,
    /// Predicted KV use after admission up to which a pod takes held work. Above the pool's
    /// `saturation.kv_threshold` (0.8, where scoring calls a pod full and sheddable work goes):
    /// the engine itself admits until its KV is full, and holding at 0.8 left a fifth of a
    /// KV-limited fleet idle — bursty TTFT p95 2.3× round robin's with no preemption at all,
    /// 0.72× at 0.95 with half of round robin's preemptions, 0.80× and 9 preemptions a run at
    /// 1.0 (one sweep, one run each: `test-harness/bench/results/flow-v1-bursty.md`).
    pub kv_threshold: f64,
    /// After a fairness id's oldest waiting request has waited this long (ms), that id's
    /// newest request goes first: the queue is standing, not absorbing a burst (0: always first
    /// come first served; see [`queue`]).
    pub newest_first_after_ms: u64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            // On: below saturation nothing waits (shared prefix and mixed GPUs unchanged);
            // bursty p99 0.79× of placing at once, within the spread of single runs
            // (results/flow-v1-bursty.md).
            enabled: true,
            max_requests: 1000,
            max_bytes: 64 * 1024 * 1024,
            bands: [BandLimits::default(); 3],
            tick_ms: 20,
            summary_stale_ms: 1000,
            kv_threshold: 0.95,
            newest_first_after_ms: NEWEST_FIRST_AFTER_MS,
        }
    }
}

/// Enqueued before this, a request waiting at `now_ms` is standing, for a bound of `after_ms`
/// (0: nothing ever is).
fn standing_before(after_ms: u64, now_ms: u64) -> u64 {
    if after_ms == 0 {
        0
    } else {
        now_ms.saturating_sub(after_ms)
    }
}

/// Default of [`FlowConfig::newest_first_after_ms`]: 5 s, past the time-to-first-token
/// objectives interactive serving states (a few hundred ms to a few seconds) — a request that
/// has waited that long in the proxy alone has missed any of them, and served in arrival order
/// so would everything behind it — and far below the 60 s time to live. On real vLLM offered
/// 1.5× its capacity for 60 s (`vllm_uneven`) goodput within a 1 s TTFT was 0.50 requests/s
/// in arrival order, 9.03 and 2.00 in two runs with this order (round robin 0.78, the peers
/// 0.48–0.55 in the second); on model-sim's overload the proxy's queue never stood that long
/// and nothing changed (`test-harness/bench/results/flow-v4-newest-first.md`).
pub const NEWEST_FIRST_AFTER_MS: u64 = 5_000;

impl FlowConfig {
    /// Waiting requests enqueued before this are standing at `now_ms` (0: none can be).
    pub fn standing_before(&self, now_ms: u64) -> u64 {
        standing_before(self.newest_first_after_ms, now_ms)
    }

    pub fn limits(&self, class: Class) -> BandLimits {
        self.bands.get(class.index()).copied().unwrap_or_default()
    }
}
