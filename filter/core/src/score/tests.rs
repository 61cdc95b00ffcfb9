//! Each scorer, saturation and ranking, on hand-made pods.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::config::Config;

fn pool(weights: Weights) -> PoolConfig {
    let mut p = Config::default().default_pool;
    p.name = "pool".into();
    p.weights = weights;
    p
}

/// A pool that uses only the named scorer.
fn only(name: &str) -> PoolConfig {
    let mut w = [0.0; N];
    w[Weights::index(name).unwrap()] = 1.0;
    pool(Weights(w))
}

fn latency() -> PoolConfig {
    pool(Weights::default_preset())
}

const PRIOR: Rate = Rate {
    cost_ms_per_token: 0.2,
    base_ms: 30.0,
};

fn pod(address: &str) -> Candidate<'_> {
    Candidate {
        address,
        stale: false,
        waiting: 0,
        running: 0,
        kv_usage: Some(0.0),
        in_flight: 0,
        in_flight_baseline: 0,
        pending_tokens: 0,
        peer_in_flight: 0,
        peer_pending_tokens: 0,
        rate: PRIOR,
        prefix_blocks: 0,
        lora: Placement::default(),
        adapter_ms: 0.0,
        contradicted: false,
        ejected: false,
    }
}

const F: Features<'static> = Features {
    adapter: None,
    prompt_tokens: 500,
    prompt_blocks: 0,
    truncated: false,
    tokens_per_block: 16.0,
    mean_prefill_tokens: 0.0,
    home: None,
    priority: 0,
    tie: 1,
};

fn order(p: &PoolConfig, c: &[Candidate<'_>], f: &Features<'_>) -> Vec<String> {
    rank(p, c, f, Mode::Full, 10, (1, 30))
        .unwrap()
        .iter()
        .map(|s| c[s.index].address.to_string())
        .collect()
}

#[test]
fn every_scorer_has_a_weight_in_every_preset_and_a_unique_name() {
    let mut names: Vec<&str> = SCORERS.iter().map(|s| s.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), N);
    for (name, w) in PRESETS {
        assert!(w.iter().all(|x| x.is_finite() && *x >= 0.0), "{name}");
        assert!(w.iter().sum::<f64>() > 0.0, "{name}");
    }
    assert_eq!(Weights::preset("latency"), Some(Weights::default_preset()));
    assert_eq!(Weights::preset("warp"), None);
}

#[test]
fn queue_scorer_prefers_short_queues() {
    let c = [
        Candidate {
            waiting: 4,
            ..pod("a")
        },
        pod("b"),
        Candidate {
            waiting: 1,
            ..pod("c")
        },
    ];
    assert_eq!(order(&only("queue"), &c, &F), ["b", "c", "a"]);
}

#[test]
fn kv_scorer_prefers_free_cache_and_needs_fresh_metrics() {
    let c = [
        Candidate {
            kv_usage: Some(0.9),
            ..pod("a")
        },
        Candidate {
            kv_usage: Some(0.1),
            ..pod("b")
        },
        Candidate {
            kv_usage: None,
            ..pod("c")
        },
    ];
    assert_eq!(order(&only("kv_cache"), &c, &F), ["b", "c", "a"]);
    let stale = score_all(&only("kv_cache"), &c, &F, Mode::LeastInflight);
    assert!(stale.iter().all(|s| s.score == 0.0), "{stale:?}");
}

#[test]
fn load_scorer_is_min_max_over_running_waiting_and_inflight() {
    let c = [
        Candidate {
            running: 10,
            ..pod("a")
        },
        Candidate {
            running: 2,
            in_flight: 5,
            ..pod("b")
        },
        Candidate {
            running: 3,
            ..pod("c")
        },
    ];
    assert_eq!(order(&only("load"), &c, &F), ["c", "b", "a"]);
    let s = score_all(&only("load"), &c, &F, Mode::Full);
    assert_eq!(s[0].score, 0.0);
    assert_eq!(s[2].score, 1.0);
}

#[test]
fn inflight_since_the_snapshot_spreads_a_burst() {
    // The snapshot says both idle; this proxy has since sent 3 requests to "a".
    let c = [
        Candidate {
            in_flight: 3,
            in_flight_baseline: 0,
            ..pod("a")
        },
        Candidate {
            in_flight: 1,
            in_flight_baseline: 1,
            ..pod("b")
        },
    ];
    assert_eq!(order(&latency(), &c, &F), ["b", "a"]);
    assert_eq!(c[0].est_waiting(), 3.0);
    assert_eq!(c[1].est_waiting(), 0.0);
}

#[test]
fn one_long_queued_prompt_outweighs_several_short_ones() {
    // "a" has one 8,000-token prompt pending, "b" four of 100 tokens: by request count "a"
    // looks better, by work it is far worse.
    let c = [
        Candidate {
            pending_tokens: 8_000,
            in_flight: 1,
            in_flight_baseline: 1,
            ..pod("a")
        },
        Candidate {
            pending_tokens: 400,
            in_flight: 4,
            in_flight_baseline: 4,
            ..pod("b")
        },
    ];
    assert_eq!(order(&only("ttft"), &c, &F), ["b", "a"]);
    assert_eq!(order(&latency(), &c, &F), ["b", "a"]);
    // The engine's waiting count turns into work at the pool's mean prefill size.
    let f = Features {
        mean_prefill_tokens: 3_000.0,
        ..F
    };
    let engine = [
        Candidate {
            waiting: 3,
            ..pod("a")
        },
        Candidate {
            pending_tokens: 2_000,
            ..pod("b")
        },
    ];
    assert_eq!(engine[0].queued_tokens(&f, Mode::Full), 9_000.0);
    assert_eq!(engine[0].queued_tokens(&f, Mode::LeastInflight), 0.0);
    assert_eq!(order(&only("ttft"), &engine, &f), ["b", "a"]);
}

#[test]
fn a_fast_pod_with_a_queue_beats_an_idle_slow_one() {
    let fast = Rate {
        cost_ms_per_token: 0.02,
        base_ms: 10.0,
    };
    let slow = Rate {
        cost_ms_per_token: 0.3,
        base_ms: 40.0,
    };
    let c = [
        Candidate {
            rate: slow,
            ..pod("a10g")
        },
        Candidate {
            rate: fast,
            pending_tokens: 4_000,
            in_flight: 4,
            in_flight_baseline: 4,
            running: 12,
            ..pod("h100")
        },
    ];
    // 10 + 4,500 × 0.02 = 100 ms against 40 + 500 × 0.3 = 190 ms.
    assert_eq!(order(&latency(), &c, &F), ["h100", "a10g"]);
    assert!((c[1].predicted_ttft_ms(&F, Mode::Full) - 100.0).abs() < 1e-9);
    // The queue scorer alone sees only that the H100 is busier.
    let q = [
        Candidate {
            waiting: 0,
            ..c[0].clone()
        },
        Candidate {
            waiting: 3,
            ..c[1].clone()
        },
    ];
    assert_eq!(order(&only("queue"), &q, &F), ["a10g", "h100"]);
}

#[test]
fn a_cached_prefix_counts_as_prefill_saved_against_queued_work() {
    let f = Features {
        prompt_tokens: 3_200,
        prompt_blocks: 200,
        ..F
    };
    // "a" holds 190 of 200 blocks and has 1,000 tokens queued; "b" is idle and cold.
    let c = [
        Candidate {
            prefix_blocks: 190,
            pending_tokens: 1_000,
            ..pod("a")
        },
        pod("b"),
    ];
    assert_eq!(c[0].uncached_tokens(&f), 160.0);
    assert_eq!(order(&only("ttft"), &c, &f), ["a", "b"]);
    // With 5,000 tokens queued "b" would answer sooner (3,200 vs 5,160 tokens of work ahead),
    // but only by prefilling 3,040 tokens "a" already holds — a second copy of the context and
    // work that every later request on "b" waits behind, charged once more: "a" stays first.
    let busy = |queued| {
        [
            Candidate {
                pending_tokens: queued,
                ..c[0].clone()
            },
            pod("b"),
        ]
    };
    assert_eq!(order(&only("ttft"), &busy(5_000), &f), ["a", "b"]);
    // Past twice the re-prefill (3,200 + 3,040 = 6,240 tokens against 7,000 + 160) the home is
    // too busy: the context gets its second copy.
    assert_eq!(order(&only("ttft"), &busy(7_000), &f), ["b", "a"]);
    // Where no candidate holds the prefix, nothing is charged twice: the idle pod wins at once.
    let cold = [
        Candidate {
            pending_tokens: 1_000,
            ..pod("a")
        },
        pod("b"),
    ];
    assert_eq!(order(&only("ttft"), &cold, &f), ["b", "a"]);
}

#[test]
fn prefix_scorer_prefers_the_pod_holding_the_prefix() {
    let c = [
        Candidate {
            prefix_blocks: 4,
            ..pod("a")
        },
        Candidate {
            prefix_blocks: 10,
            ..pod("b")
        },
        pod("c"),
    ];
    let f = Features {
        prompt_blocks: 10,
        ..F
    };
    assert_eq!(order(&only("prefix"), &c, &f), ["b", "a", "c"]);
    // No blocks in the prompt: the prefix weight does not count at all.
    let mut w = [0.0; N];
    w[Weights::index("queue").unwrap()] = 1.0;
    w[Weights::index("prefix").unwrap()] = 5.0;
    let s = score_all(&pool(Weights(w)), &c, &F, Mode::Full);
    assert!(s.iter().all(|x| x.score == 1.0));
}

#[test]
fn lora_placement_orders_home_loaded_free_then_the_rest() {
    let at = |home, resident, free_slot| Placement {
        home,
        resident,
        free_slot,
        blocked: false,
        slot_queue: 0,
        drain: 0,
    };
    let c = [
        Candidate {
            lora: at(false, false, false),
            ..pod("full")
        },
        Candidate {
            lora: at(false, false, true),
            ..pod("free")
        },
        Candidate {
            lora: at(true, false, false),
            ..pod("home")
        },
        Candidate {
            lora: at(false, true, false),
            ..pod("loaded")
        },
    ];
    let f = Features {
        adapter: Some("x"),
        ..F
    };
    assert_eq!(
        order(&only("lora"), &c, &f),
        ["home", "loaded", "free", "full"]
    );
    // A home whose batch runs `max_loras` other adapters is no better than a full pod.
    let mut blocked = c.clone();
    blocked[2].lora.blocked = true;
    let s = score_all(&only("lora"), &blocked, &f, Mode::Full);
    assert_eq!((s[2].score, s[0].score), (0.0, 0.0), "{s:?}");
    // Only for adapter requests.
    assert!(score_all(&only("lora"), &c, &F, Mode::Full)
        .iter()
        .all(|s| s.score == 0.0));
    // In time: leaving home costs `stray_ms` (here 500), so a short queue at home does not
    // send the adapter away …
    let home_busy = |pending| {
        [
            Candidate {
                lora: at(true, true, false),
                pending_tokens: pending,
                in_flight: 1,
                ..pod("home")
            },
            Candidate {
                lora: at(false, true, false),
                adapter_ms: 500.0,
                ..pod("loaded")
            },
        ]
    };
    assert_eq!(order(&latency(), &home_busy(500), &f)[0], "home");
    // … a long one does.
    assert_eq!(order(&latency(), &home_busy(20_000), &f)[0], "loaded");
}

#[test]
fn the_replica_home_breaks_near_ties_only() {
    let c = [pod("a"), pod("b"), pod("c")];
    let f = Features {
        home: Some(2),
        prompt_tokens: 2_000,
        ..F
    };
    for tie in 0..16 {
        assert_eq!(order(&latency(), &c, &Features { tie, ..f })[0], "c");
    }
    let busy = [
        pod("a"),
        pod("b"),
        Candidate {
            pending_tokens: 5_000,
            waiting: 2,
            ..pod("c")
        },
    ];
    assert_ne!(order(&latency(), &busy, &f)[0], "c");
    // A short prompt gains little from its home: one more waiting request outweighs it.
    let short = Features {
        prompt_tokens: 20,
        ..f
    };
    let one_waiting = [
        pod("a"),
        Candidate {
            waiting: 1,
            ..pod("c")
        },
    ];
    let f1 = Features {
        home: Some(1),
        ..short
    };
    assert_eq!(order(&latency(), &one_waiting, &f1)[0], "a");
}

#[test]
fn stale_pods_are_demoted_not_dropped() {
    let c = [
        Candidate {
            stale: true,
            ..pod("a")
        },
        Candidate {
            waiting: 1,
            ..pod("b")
        },
    ];
    assert_eq!(order(&latency(), &c, &F), ["b", "a"]);
}

#[test]
fn ties_are_broken_by_the_tie_bits_not_by_position() {
    let c = [pod("a"), pod("b"), pod("c"), pod("d")];
    let firsts: std::collections::HashSet<String> = (0..64)
        .map(|t| order(&latency(), &c, &Features { tie: t, ..F })[0].clone())
        .collect();
    assert_eq!(firsts.len(), 4, "{firsts:?}");
}

#[test]
fn the_top_k_are_the_stable_ranking_of_every_pod() {
    // Pods in a few load classes (many exact ties in score and load), each top_k and tie: the
    // partitioned ranking is the full stable sort by (score, load, tie bits), cut at k. Past
    // `LARGE_POOL` pods the ties go by gauges, then round the pool from a per-request start.
    for pods in [120, 200] {
        let names: Vec<String> = (0..pods)
            .map(|i| format!("10.0.{}.{}:8000", i / 256, i % 256))
            .collect();
        let c: Vec<Candidate<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Candidate {
                waiting: (i % 3) as u32,
                running: (i % 5) as u32,
                in_flight: (i % 2) as u32,
                kv_usage: Some(((i % 4) as f32) / 10.0),
                ..pod(n)
            })
            .collect();
        let p = latency();
        for tie in [0, 1, 7, u64::MAX] {
            let f = Features { tie, ..F };
            let mut all = score_all(&p, &c, &f, Mode::Full);
            let load = |s: &Scored| c[s.index].est_load();
            let start = rotation_start(tie, pods);
            let tie_key = |s: &Scored| {
                if pods > LARGE_POOL {
                    (s.index as u64 + pods as u64 - start) % pods as u64
                } else {
                    mix(f.tie, s.index as u64)
                }
            };
            let gauges = |s: &Scored| {
                if pods > LARGE_POOL {
                    Gauges::of(&c[s.index])
                } else {
                    Gauges::default()
                }
            };
            all.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then(load(a).total_cmp(&load(b)))
                    .then(gauges(a).cmp(&gauges(b)))
                    .then(tie_key(a).cmp(&tie_key(b)))
            });
            for k in [1, 2, 5, 32, 200, 500] {
                let got: Vec<usize> = rank(&p, &c, &f, Mode::Full, k, (1, 30))
                    .unwrap()
                    .iter()
                    .map(|s| s.index)
                    .collect();
                let want: Vec<usize> = all.iter().take(k).map(|s| s.index).collect();
                assert_eq!(got, want, "{pods} pods, tie {tie}, top {k}");
            }
        }
    }
}

#[test]
fn top_k_bounds_the_list() {
    let c = [pod("a"), pod("b"), pod("c")];
    assert_eq!(
        rank(&latency(), &c, &F, Mode::Full, 2, (1, 30))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn saturation_sheds_sheddable_first_then_standard() {
    let p = latency();
    let busy = [
        Candidate {
            waiting: 6,
            ..pod("a")
        },
        Candidate {
            kv_usage: Some(0.85),
            ..pod("b")
        },
    ];
    let shed = rank(
        &p,
        &busy,
        &Features { priority: -1, ..F },
        Mode::Full,
        3,
        (7, 30),
    )
    .unwrap_err();
    assert_eq!(shed.status, 429);
    assert_eq!(shed.retry_after_s, Some(7));
    assert_eq!(shed.reason, "rejected-saturated");
    assert!(rank(&p, &busy, &F, Mode::Full, 3, (7, 30)).is_ok());
    // One pod with room: nothing is shed.
    let one_free = [
        Candidate {
            waiting: 6,
            ..pod("a")
        },
        pod("b"),
    ];
    let sheddable = Features { priority: -1, ..F };
    assert!(rank(&p, &one_free, &sheddable, Mode::Full, 3, (7, 30)).is_ok());
    // Standard requests go at the critical factor; critical ones never.
    let drowning = [
        Candidate {
            waiting: 60,
            ..pod("a")
        },
        Candidate {
            waiting: 51,
            ..pod("b")
        },
    ];
    let e = rank(&p, &drowning, &F, Mode::Full, 3, (7, 30)).unwrap_err();
    assert_eq!(e.status, 429);
    let critical = Features { priority: 1, ..F };
    assert!(rank(&p, &drowning, &critical, Mode::Full, 3, (7, 30)).is_ok());
    // Without metrics (stale snapshot) nothing is shed.
    assert!(rank(&p, &drowning, &sheddable, Mode::LeastInflight, 3, (7, 30)).is_ok());
}

#[test]
fn retry_after_is_the_time_to_drain_the_least_loaded_queue_bounded() {
    let p = latency();
    let f = Features {
        mean_prefill_tokens: 1_000.0,
        priority: -1,
        ..F
    };
    let queue = |waiting, cost| Candidate {
        waiting,
        rate: Rate {
            cost_ms_per_token: cost,
            base_ms: 0.0,
        },
        ..pod("x")
    };
    // 20 waiting × 1,000 tokens, 5 allowed: 15,000 tokens at 0.2 ms = 3 s (the other pod: 12 s).
    let c = [queue(20, 0.2), queue(20, 0.8)];
    assert_eq!(retry_after_s(&p, &c, &f, 1, 30), 3);
    assert_eq!(
        rank(&p, &c, &f, Mode::Full, 3, (1, 30))
            .unwrap_err()
            .retry_after_s,
        Some(3)
    );
    // Bounded on both sides, and the minimum without a known prefill size.
    assert_eq!(retry_after_s(&p, &[queue(500, 1.0)], &f, 1, 30), 30);
    assert_eq!(retry_after_s(&p, &[queue(6, 0.001)], &f, 2, 30), 2);
    let unknown = Features {
        mean_prefill_tokens: 0.0,
        ..f
    };
    assert_eq!(retry_after_s(&p, &c, &unknown, 1, 30), 1);
}

#[test]
fn empty_pool_is_no_endpoints() {
    let e = rank(&latency(), &[], &F, Mode::Full, 3, (1, 30)).unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(e.reason, "rejected-no-endpoints");
}

#[test]
fn scores_stay_in_unit_range_for_extreme_inputs() {
    let c = [
        Candidate {
            waiting: u32::MAX,
            running: u32::MAX,
            in_flight: u32::MAX,
            pending_tokens: u32::MAX,
            kv_usage: Some(1.0),
            prefix_blocks: 999,
            ..pod("a")
        },
        Candidate {
            in_flight_baseline: u32::MAX,
            kv_usage: Some(0.0),
            rate: Rate {
                cost_ms_per_token: 0.0,
                base_ms: 0.0,
            },
            ..pod("b")
        },
    ];
    let f = Features {
        prompt_blocks: 3,
        prompt_tokens: u32::MAX,
        mean_prefill_tokens: f64::MAX,
        adapter: Some("x"),
        home: Some(7),
        ..F
    };
    for (name, w) in PRESETS {
        for mode in [Mode::Full, Mode::LeastInflight] {
            for s in score_all(&pool(Weights(w)), &c, &f, mode) {
                assert!((0.0..=1.0).contains(&s.score), "{name}: {s:?}");
            }
        }
    }
}
