//! The six scenarios of the issue, after the seeds: fleet, arrival process, prompt shape, load.
//!
//! Load levels are set from the emulated pods' capacity (see the comments and the crate README),
//! never from the filter's results: each scenario puts the fleet where the seeds say round robin
//! suffers (or, for `uniform` and `long_prompt`, where no gain is expected). Rates are given for
//! real-time pods and multiplied by the emulator speed-up.

use crate::arrivals::Arrival;
use crate::stack::{FleetSpec, PodSpec, MODEL};
use crate::workload::{adapter_name, generate, Prompts, Range, WorkloadSpec};
use std::time::Duration;

/// One scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name used in the report (`mixed_gpu`, ...).
    pub name: &'static str,
    /// One line saying what it shows.
    pub about: &'static str,
    /// The pods (fresh ones for every router).
    pub fleet: FleetSpec,
    /// The requests.
    pub workload: WorkloadSpec,
    /// LoRA adapters the pool serves (filter configuration: pool membership, not tuning).
    pub adapters: Vec<String>,
    /// How long open requests may finish after the last arrival.
    pub drain: Duration,
    /// The scenario's card (Markdown lines: fleet, rates, anchor, check, floor). // simfid replaces
    pub card: &'static str,
    /// Arrivals before this offset are the warm-up (wall clock); the horizon is warm-up +
    /// measurement window. // simfid replaces
    pub warmup: Duration,
    /// Mean offered rate, wall-clock requests per second. // simfid replaces
    pub rate_rps: f64,
    /// The fleet's measured capacity, wall-clock req/s (NaN = not stated). // simfid replaces
    pub capacity_rps: f64,
    /// TTFT p95 SLO used for goodput, wall-clock ms. // simfid replaces
    pub slo_ttft_ms: f64,
    /// What a perfect router could reach (TTFT p95, wall-clock ms; NaN = not stated). // simfid replaces
    pub floor_ms: f64,
    /// The check that the scenario's anchor condition occurred. // simfid replaces
    pub condition: Condition,
}

/// The anchor condition a scenario must show for its verdict to count (the bench evaluates it
/// from the run's diagnostics). // simfid replaces
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// Nothing to check.
    None,
    /// Under `router`, the pods preempted at least `min` times in the window (fleet sum).
    PreemptionsUnder {
        /// Router name.
        router: &'static str,
        /// Fewest preemptions.
        min: u64,
    },
    /// Under `router`, some pod of `profile` had a waiting queue of at least `min_peak`.
    QueueUnder {
        /// Router name.
        router: &'static str,
        /// GPU profile.
        profile: &'static str,
        /// Smallest peak queue on one such pod.
        min_peak: u32,
    },
    /// Under `router`, the mean KV use of the `slow` profile's pods is at least `min_ratio`
    /// times that of the `fast` profile's.
    MeanKvRatioUnder {
        /// Router name.
        router: &'static str,
        /// Profile of the slower pods.
        slow: &'static str,
        /// Profile of the faster pods.
        fast: &'static str,
        /// Smallest ratio of the two profiles' mean KV use.
        min_ratio: f64,
    },
    /// Under `router`, adapters were swapped in from the CPU cache at least `min_cpu` times and
    /// read from disk at least `min_disk` times (fleet sums).
    AdapterLoadsUnder {
        /// Router name.
        router: &'static str,
        /// Fewest swap-ins from the CPU cache.
        min_cpu: u64,
        /// Fewest loads from disk.
        min_disk: u64,
    },
    /// Fewer than `max_frac` of the window's requests are cold first reads of a shared prefix.
    ColdReadsBelow {
        /// Largest share of cold reads.
        max_frac: f64,
    },
    /// All of these.
    All(Vec<Condition>),
}

impl Scenario {
    /// Share of the measured requests (after the warm-up) that are cold first reads of a long
    /// prefix. // simfid replaces
    pub fn cold_read_fraction(&self) -> f64 {
        cold_read_fraction(&generate(&self.workload), self.warmup)
    }
}

/// Share of the requests from `from` on that are *cold reads*: less than half of their prompt
/// (in 256-byte blocks of the body's messages, chained like a prefix cache's block hashes) was
/// sent by any earlier request. // simfid replaces
pub fn cold_read_fraction(reqs: &[crate::workload::RequestSpec], from: Duration) -> f64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    const BLOCK: usize = 256;
    let mut seen = std::collections::HashSet::new();
    let (mut n, mut cold) = (0usize, 0usize);
    for r in reqs {
        let body = r.body.as_ref();
        let start = body
            .windows(10)
            .position(|w| w == b"\"messages\"")
            .unwrap_or(0);
        let mut h = DefaultHasher::new();
        let hashes: Vec<u64> = body[start..]
            .chunks_exact(BLOCK)
            .map(|c| {
                c.hash(&mut h);
                h.finish()
            })
            .collect();
        let hit = hashes.iter().take_while(|x| seen.contains(*x)).count();
        if r.at >= from {
            n += 1;
            cold += usize::from(hashes.len() >= 4 && hit * 2 < hashes.len());
        }
        seen.extend(hashes);
    }
    if n == 0 {
        0.0
    } else {
        cold as f64 / n as f64
    }
}

/// Speed-up for quick runs. // simfid replaces
pub const QUICK_SPEEDUP: f64 = 2.0;
/// Speed-up for full runs. // simfid replaces
pub const FULL_SPEEDUP: f64 = 4.0;

/// Knobs shared by all scenarios of one run.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Quick (CI-sized) or full.
    pub quick: bool,
    /// Emulator speed-up (rates are multiplied by it).
    pub speedup: f64,
    /// Workload seed.
    pub seed: u64,
}

/// Names of all scenarios, in run order.
pub const NAMES: [&str; 6] = crate::report::SCENARIOS;

fn pods(profiles: &[&'static str], max_loras: Option<u32>) -> Vec<PodSpec> {
    profiles
        .iter()
        .map(|p| PodSpec {
            profile: p,
            max_loras,
        })
        .collect()
}

/// Build a scenario by name.
pub fn scenario(name: &str, mode: Mode) -> Option<Scenario> {
    let s = mode.speedup.max(0.01);
    // Arrival windows: long enough for queues to build (full) or a CI-sized glimpse (quick).
    let horizon =
        |full: u64, quick: u64| Duration::from_secs(if mode.quick { quick } else { full });
    let max_requests = if mode.quick { 600 } else { 20_000 };
    let fleet = |pods: Vec<PodSpec>| FleetSpec {
        pods,
        speedup: s,
        seed: mode.seed,
    };
    let spec = |arrival: Arrival, h: Duration, prompts: Prompts| WorkloadSpec {
        seed: mode.seed,
        arrival,
        horizon: h,
        max_requests,
        model: MODEL.to_string(),
        prompts,
    };
    let drain = Duration::from_secs(if mode.quick { 10 } else { 45 });
    let sc = match name {
        // 2 H100-like + 2 A10G-like pods. Saturation throughput measured with `bench calibrate`
        // (one pod, closed loop, no Envoy): ≈ 18 req/s per H100 with these prompts (300-1200
        // tokens, 50-250 out), ≈ 1.8 req/s per A10G: ≈ 40 req/s for the fleet. 20 req/s is half
        // the fleet's capacity, but round robin gives each A10G 5 req/s, ~2.8x what it serves.
        "mixed_gpu" => Scenario {
            name: "mixed_gpu",
            about: "2 H100 + 2 A10G, Poisson at half the fleet's capacity",
            fleet: fleet(pods(&["h100", "h100", "a10g", "a10g"], None)),
            workload: spec(
                Arrival::Poisson { rate: 20.0 * s },
                horizon(45, 8),
                Prompts::Independent {
                    prompt_tokens: Range::new(300, 1200),
                    max_tokens: Range::new(50, 250),
                },
            ),
            adapters: vec![],
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        // Uniform A10G fleet (≈ 1.8 req/s each by `bench calibrate`, ≈ 7.3 for the fleet):
        // bursts of 8 s at 20 req/s (~2.7x capacity, enough to fill the pods' KV cache), then
        // 12 s at 1 req/s, during which the backlog drains (mean 8.6 req/s).
        "bursty" => Scenario {
            name: "bursty",
            about: "4 A10G, on/off bursts at 2x capacity",
            fleet: fleet(pods(&["a10g"; 4], None)),
            workload: spec(
                Arrival::Bursty {
                    on_rate: 20.0 * s,
                    off_rate: 1.0 * s,
                    on_s: 8.0 / s,
                    off_s: 12.0 / s,
                },
                horizon(45, 8),
                Prompts::Independent {
                    prompt_tokens: Range::new(200, 1000),
                    max_tokens: Range::new(50, 200),
                },
            ),
            adapters: vec![],
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        // A10G fleet (36K KV tokens each): 16 documents of 3,000 tokens and 48 conversations
        // growing to ~2,000 tokens need ~140K tokens of cache — more than any one pod holds, so
        // only prefix-aware placement keeps hitting. 3.5 req/s.
        "shared_prefix" => Scenario {
            name: "shared_prefix",
            about: "4 A10G, multi-turn chats + document Q&A with long shared prefixes",
            fleet: fleet(pods(&["a10g"; 4], None)),
            workload: spec(
                Arrival::Poisson { rate: 3.5 * s },
                horizon(60, 12),
                Prompts::SharedPrefix {
                    conversations: 48,
                    max_turns: 6,
                    system_tokens: 300,
                    turn_tokens: Range::new(50, 150),
                    reply_tokens: 100,
                    documents: 16,
                    document_tokens: 3000,
                    document_share: 0.5,
                    max_tokens: Range::new(30, 120),
                },
            ),
            adapters: vec![],
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        // 4 H100 with 4 LoRA slots each, 16 adapters (Zipf popularity), 10 req/s.
        "lora" => Scenario {
            name: "lora",
            about: "4 H100, 16 adapters, max_loras 4",
            fleet: fleet(pods(&["h100"; 4], Some(4))),
            workload: spec(
                Arrival::Poisson { rate: 10.0 * s },
                horizon(45, 8),
                Prompts::Lora {
                    adapters: 16,
                    zipf_s: 1.0,
                    base_share: 0.1,
                    prompt_tokens: Range::new(200, 800),
                    max_tokens: Range::new(50, 150),
                },
            ),
            adapters: (0..16).map(adapter_name).collect(),
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        // Uniform A10G fleet, steady Poisson at half its measured capacity (≈ 7.3 req/s):
        // no gain expected.
        "uniform" => Scenario {
            name: "uniform",
            about: "4 A10G, steady Poisson at half capacity (no gain expected)",
            fleet: fleet(pods(&["a10g"; 4], None)),
            workload: spec(
                Arrival::Poisson { rate: 3.6 * s },
                horizon(45, 8),
                Prompts::Independent {
                    prompt_tokens: Range::new(200, 1000),
                    max_tokens: Range::new(50, 200),
                },
            ),
            adapters: vec![],
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        // ~200 KB bodies (≈ 50K tokens; H100 only: 2 s of prefill each), 1 req/s: the cost of
        // reading big bodies in the proxy.
        "long_prompt" => Scenario {
            name: "long_prompt",
            about: "4 H100, ~200 KB prompts",
            fleet: fleet(pods(&["h100"; 4], None)),
            workload: spec(
                Arrival::Poisson { rate: 1.0 * s },
                horizon(45, 8),
                Prompts::Independent {
                    prompt_tokens: Range::new(48_000, 52_000),
                    max_tokens: Range::new(20, 80),
                },
            ),
            adapters: vec![],
            drain,
            card: "",
            warmup: Duration::ZERO,
            rate_rps: f64::NAN,
            capacity_rps: f64::NAN,
            slo_ttft_ms: f64::NAN,
            floor_ms: f64::NAN,
            condition: Condition::None,
        },
        _ => return None,
    };
    Some(with_card(sc, mode)) // simfid replaces
}

/// Placeholder cards and windows until simfid's definitions land: the v1 horizon becomes the
/// measurement window in emulated seconds, after a warm-up of 6 s (quick) / 20 s (full);
/// everything in wall clock (÷ speed-up). // simfid replaces
fn with_card(mut sc: Scenario, mode: Mode) -> Scenario {
    let s = mode.speedup.max(0.01);
    let (slo, condition) = match sc.name {
        "bursty" => (
            2000.0,
            Condition::PreemptionsUnder {
                router: "round_robin",
                min: 1,
            },
        ),
        "shared_prefix" => (1500.0, Condition::None),
        "long_prompt" => (5000.0, Condition::None),
        _ => (1000.0, Condition::None),
    };
    let warmup = Duration::from_secs_f64(if mode.quick { 6.0 } else { 20.0 } / s);
    sc.workload.horizon = warmup + sc.workload.horizon.div_f64(s);
    sc.warmup = warmup;
    sc.rate_rps = sc.workload.arrival.mean_rate();
    sc.slo_ttft_ms = slo / s;
    sc.condition = condition;
    sc
}

/// The scenario `name` at another mean offered rate (wall-clock req/s): every arrival rate is
/// scaled by the same factor. // simfid replaces
pub fn scenario_at(name: &str, mode: Mode, rate_rps: f64) -> Option<Scenario> {
    let mut sc = scenario(name, mode)?;
    let now = sc.workload.arrival.mean_rate();
    if now > 0.0 && rate_rps > 0.0 {
        let k = rate_rps / now;
        sc.workload.arrival = match sc.workload.arrival {
            Arrival::Poisson { rate } => Arrival::Poisson { rate: rate * k },
            Arrival::Bursty {
                on_rate,
                off_rate,
                on_s,
                off_s,
            } => Arrival::Bursty {
                on_rate: on_rate * k,
                off_rate: off_rate * k,
                on_s,
                off_s,
            },
        };
        sc.rate_rps = rate_rps;
    }
    Some(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_builds_and_is_deterministic() {
        let mode = Mode {
            quick: true,
            speedup: 1.0,
            seed: 42,
        };
        for n in NAMES {
            let a = scenario(n, mode).unwrap();
            let b = scenario(n, mode).unwrap();
            assert_eq!(a.name, n);
            let (wa, wb) = (
                crate::workload::generate(&a.workload),
                crate::workload::generate(&b.workload),
            );
            assert!(!wa.is_empty(), "{n}");
            assert_eq!(wa, wb, "{n}");
            assert_eq!(a.fleet, b.fleet);
        }
        assert!(scenario("nope", mode).is_none());
    }

    #[test]
    fn cold_reads_are_first_reads_of_long_prefixes() {
        let req = |id: u64, at_s: u64, text: &str| crate::workload::RequestSpec {
            id,
            at: Duration::from_secs(at_s),
            body: bytes::Bytes::from(format!(
                "{{\"model\":\"m\",\"messages\":[{{\"content\":\"{text}\"}}]}}"
            )),
            ..crate::workload::generate(
                &scenario(
                    "uniform",
                    Mode {
                        quick: true,
                        speedup: 1.0,
                        seed: 1,
                    },
                )
                .unwrap()
                .workload,
            )[0]
            .clone()
        };
        let (a, b) = ("a".repeat(3000), "b".repeat(3000));
        let reqs = vec![
            req(0, 0, &format!("{a} q0")),  // cold, before the window
            req(1, 10, &format!("{a} q1")), // warm
            req(2, 11, &format!("{b} q2")), // cold
            req(3, 12, "short"),            // too short to be a cold read
            req(4, 13, &format!("{b} q4")), // warm
        ];
        let f = cold_read_fraction(&reqs, Duration::from_secs(10));
        assert!((f - 0.25).abs() < 1e-12, "{f}");
    }

    #[test]
    fn long_prompt_bodies_are_about_200_kb() {
        let mode = Mode {
            quick: true,
            speedup: 1.0,
            seed: 1,
        };
        let s = scenario("long_prompt", mode).unwrap();
        for r in crate::workload::generate(&s.workload) {
            assert!(
                (180_000..230_000).contains(&r.body.len()),
                "{}",
                r.body.len()
            );
        }
    }

    #[test]
    fn mixed_gpu_has_two_generations() {
        let s = scenario(
            "mixed_gpu",
            Mode {
                quick: false,
                speedup: 1.0,
                seed: 1,
            },
        )
        .unwrap();
        let profiles: Vec<&str> = s.fleet.pods.iter().map(|p| p.profile).collect();
        assert_eq!(profiles, ["h100", "h100", "a10g", "a10g"]);
    }
}
