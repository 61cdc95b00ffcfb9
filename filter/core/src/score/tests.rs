//! Each scorer, saturation and ranking, on hand-made pods.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::config::{Config, Preset, Weights};

fn pool(weights: Weights) -> PoolConfig {
    let mut p = Config::default().default_pool;
    p.name = "pool".into();
    p.weights = weights;
    p
}

fn only(queue: f64, kv: f64, prefix: f64, lora: f64, load: f64) -> PoolConfig {
    pool(Weights {
        queue,
        kv_cache: kv,
        prefix,
        lora,
        load,
    })
}

fn pod(address: &str) -> Candidate<'_> {
    Candidate {
        address,
        stale: false,
        waiting: 0,
        running: 0,
        kv_usage: Some(0.0),
        lora: None,
        inflight: 0,
        inflight_baseline: 0,
        prefix_blocks: 0,
    }
}

const F: Features<'static> = Features {
    adapter: None,
    prompt_blocks: 0,
    priority: 0,
    tie: 1,
};

fn order(p: &PoolConfig, c: &[Candidate<'_>], f: &Features<'_>) -> Vec<String> {
    rank(p, c, f, Mode::Full, 10, 1)
        .unwrap()
        .iter()
        .map(|s| c[s.index].address.to_string())
        .collect()
}

#[test]
fn queue_scorer_prefers_short_queues() {
    let c = [
        Candidate {
            waiting: 4,
            ..pod("a")
        },
        Candidate {
            waiting: 0,
            ..pod("b")
        },
        Candidate {
            waiting: 1,
            ..pod("c")
        },
    ];
    assert_eq!(
        order(&only(1.0, 0.0, 0.0, 0.0, 0.0), &c, &F),
        ["b", "c", "a"]
    );
}

#[test]
fn kv_scorer_prefers_free_cache() {
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
    assert_eq!(
        order(&only(0.0, 1.0, 0.0, 0.0, 0.0), &c, &F),
        ["b", "c", "a"]
    );
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
            inflight: 5,
            inflight_baseline: 0,
            ..pod("b")
        },
        Candidate {
            running: 3,
            ..pod("c")
        },
    ];
    assert_eq!(
        order(&only(0.0, 0.0, 0.0, 0.0, 1.0), &c, &F),
        ["c", "b", "a"]
    );
    let s = score_all(&only(0.0, 0.0, 0.0, 0.0, 1.0), &c, &F, Mode::Full);
    assert_eq!(s[0].score, 0.0);
    assert_eq!(s[2].score, 1.0);
}

#[test]
fn inflight_since_the_snapshot_spreads_a_burst() {
    // Identical pods by the snapshot; this proxy already sent two requests to "a".
    let c = [
        Candidate {
            inflight: 2,
            inflight_baseline: 0,
            ..pod("a")
        },
        pod("b"),
    ];
    assert_eq!(order(&pool(Preset::Latency.weights()), &c, &F)[0], "b");
    // Requests that finished since the snapshot lower the estimate (never below zero).
    let c = Candidate {
        waiting: 1,
        inflight: 0,
        inflight_baseline: 3,
        ..pod("x")
    };
    assert_eq!(c.est_waiting(), 0.0);
}

#[test]
fn prefix_scorer_prefers_the_pod_holding_the_prefix() {
    let c = [
        Candidate {
            prefix_blocks: 2,
            ..pod("a")
        },
        Candidate {
            prefix_blocks: 9,
            ..pod("b")
        },
        pod("c"),
    ];
    let f = Features {
        prompt_blocks: 10,
        ..F
    };
    assert_eq!(
        order(&only(0.0, 0.0, 1.0, 0.0, 0.0), &c, &f),
        ["b", "a", "c"]
    );
    // No blocks in the prompt: the prefix weight does not count at all.
    let s = score_all(&only(1.0, 0.0, 5.0, 0.0, 0.0), &c, &F, Mode::Full);
    assert!(s.iter().all(|x| x.score == 1.0));
}

#[test]
fn lora_affinity_values_follow_gaie() {
    let active = LoraState {
        running: vec!["x".into()],
        waiting: vec![],
        max_loras: 2,
    };
    let free = LoraState {
        running: vec!["y".into()],
        waiting: vec![],
        max_loras: 2,
    };
    let queued = LoraState {
        running: vec!["y".into(), "z".into()],
        waiting: vec!["x".into()],
        max_loras: 2,
    };
    let full = LoraState {
        running: vec!["y".into(), "z".into()],
        waiting: vec![],
        max_loras: 2,
    };
    assert_eq!(lora_score(Some(&active), "x", false), 1.0);
    assert_eq!(lora_score(Some(&free), "x", false), 0.8);
    assert_eq!(lora_score(Some(&queued), "x", false), 0.6);
    assert_eq!(lora_score(Some(&full), "x", false), 0.0);
    assert_eq!(lora_score(None, "x", false), 0.0);
    // The adapter's home pod gets a bonus below "loaded".
    assert_eq!(lora_score(Some(&active), "x", true), 1.0);
    assert!((lora_score(Some(&free), "x", true) - 0.95).abs() < 1e-9);
    assert!((lora_score(Some(&full), "x", true) - 0.3).abs() < 1e-9);
    let c = [
        Candidate {
            lora: Some(&full),
            ..pod("full")
        },
        Candidate {
            lora: Some(&queued),
            ..pod("queued")
        },
        Candidate {
            lora: Some(&active),
            ..pod("active")
        },
        Candidate {
            lora: Some(&free),
            ..pod("free")
        },
    ];
    let f = Features {
        adapter: Some("x"),
        ..F
    };
    assert_eq!(
        order(&only(0.0, 0.0, 0.0, 1.0, 0.0), &c, &f),
        ["active", "free", "queued", "full"]
    );
}

#[test]
fn adapters_loaded_nowhere_go_to_their_rendezvous_home() {
    let full = LoraState {
        running: vec!["a".into(), "b".into()],
        waiting: vec![],
        max_loras: 2,
    };
    let addrs: Vec<String> = (0..4).map(|i| format!("10.0.0.{i}:8000")).collect();
    let c: Vec<Candidate<'_>> = addrs
        .iter()
        .map(|a| Candidate {
            lora: Some(&full),
            ..pod(a)
        })
        .collect();
    let p = pool(Preset::Latency.weights());
    let mut homes = std::collections::HashMap::new();
    for n in 0..16 {
        let adapter = format!("adapter-{n}");
        // Whatever the tie bits, an adapter always lands on the same pod.
        let picks: std::collections::HashSet<String> = (0..8)
            .map(|t| {
                order(
                    &p,
                    &c,
                    &Features {
                        adapter: Some(&adapter),
                        tie: t,
                        ..F
                    },
                )[0]
                .clone()
            })
            .collect();
        assert_eq!(picks.len(), 1, "{adapter}: {picks:?}");
        *homes.entry(picks.into_iter().next().unwrap()).or_insert(0) += 1;
    }
    // ... and the adapters spread over the pods.
    assert!(homes.len() >= 3, "{homes:?}");
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
    assert_eq!(order(&pool(Preset::Latency.weights()), &c, &F), ["b", "a"]);
}

#[test]
fn ties_are_broken_by_the_tie_bits_not_by_position() {
    let c = [pod("a"), pod("b"), pod("c"), pod("d")];
    let firsts: std::collections::HashSet<String> = (0..64)
        .map(|t| {
            order(
                &pool(Preset::Latency.weights()),
                &c,
                &Features { tie: t, ..F },
            )[0]
            .clone()
        })
        .collect();
    assert!(firsts.len() >= 3, "{firsts:?}");
}

#[test]
fn top_k_bounds_the_list() {
    let c = [pod("a"), pod("b"), pod("c"), pod("d")];
    assert_eq!(
        rank(&pool(Preset::Latency.weights()), &c, &F, Mode::Full, 2, 1)
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn saturation_sheds_sheddable_first_then_standard() {
    let p = pool(Preset::Latency.weights());
    // Every pod past the thresholds (queue 5 / kv 0.8) but below 10x.
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
    let shed = rank(&p, &busy, &Features { priority: -1, ..F }, Mode::Full, 3, 7).unwrap_err();
    assert_eq!(shed.status, 429);
    assert_eq!(shed.retry_after_s, Some(7));
    assert_eq!(shed.reason, "rejected-saturated");
    assert!(rank(&p, &busy, &F, Mode::Full, 3, 7).is_ok());
    // One pod with room: nothing is shed.
    let one_free = [
        Candidate {
            waiting: 6,
            ..pod("a")
        },
        pod("b"),
    ];
    assert!(rank(
        &p,
        &one_free,
        &Features { priority: -1, ..F },
        Mode::Full,
        3,
        7
    )
    .is_ok());
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
    assert_eq!(
        rank(&p, &drowning, &F, Mode::Full, 3, 7)
            .unwrap_err()
            .status,
        429
    );
    assert!(rank(
        &p,
        &drowning,
        &Features { priority: 1, ..F },
        Mode::Full,
        3,
        7
    )
    .is_ok());
    // Without metrics (stale snapshot) nothing is shed.
    assert!(rank(
        &p,
        &drowning,
        &Features { priority: -1, ..F },
        Mode::LeastInflight,
        3,
        7
    )
    .is_ok());
}

#[test]
fn empty_pool_is_no_endpoints() {
    let e = rank(&pool(Preset::Latency.weights()), &[], &F, Mode::Full, 3, 1).unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(e.reason, "rejected-no-endpoints");
}

#[test]
fn scores_stay_in_unit_range_for_extreme_inputs() {
    let c = [
        Candidate {
            waiting: u32::MAX,
            running: u32::MAX,
            inflight: u32::MAX,
            kv_usage: Some(1.0),
            prefix_blocks: 999,
            ..pod("a")
        },
        Candidate {
            inflight_baseline: u32::MAX,
            kv_usage: Some(0.0),
            ..pod("b")
        },
    ];
    let f = Features {
        prompt_blocks: 3,
        adapter: Some("x"),
        ..F
    };
    for s in score_all(&pool(Preset::Throughput.weights()), &c, &f, Mode::Full) {
        assert!((0.0..=1.0).contains(&s.score), "{s:?}");
    }
}
