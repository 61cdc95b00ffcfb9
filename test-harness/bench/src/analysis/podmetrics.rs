//! Figures read from the pods after a run: prefix-cache hit rate, preemptions, adapter loads.
//!
//! Pods are fresh for every router, so their counters cover exactly one run. Adapter loads come
//! from a pod counter when the emulator exports one (any metric whose name contains
//! `lora_load`); otherwise they are estimated by replaying each pod's served adapter sequence
//! through an LRU of `max_loras` slots (marked `adapter_loads_estimated`).

use crate::loadgen::Sample;
use serde::Serialize;
use std::collections::BTreeMap;

// Reading the pods' `/metrics` lives in testkit (the stack launchers scrape too); re-exported so
// `podmetrics::scrape` and friends keep their paths here.
pub use testkit::podmetrics::{reset_stats, scrape, scrape_each, sum_metrics};

/// Each pod's share of the requests finished in the window, from its own counter
/// (`vllm:request_success_total`, differenced), keyed by `labels` (fleet order): for pods that
/// name no pod in their responses (real vLLM). Requests finished in the window approximate
/// those that arrived in it. Empty when no pod exports the counter or none finished.
pub fn shares_from_counts(
    labels: &[String],
    m0: &[BTreeMap<String, f64>],
    m1: &[BTreeMap<String, f64>],
) -> BTreeMap<String, f64> {
    const DONE: &str = "vllm:request_success_total";
    let done: Vec<(String, f64)> = labels
        .iter()
        .zip(m0.iter().zip(m1))
        .filter_map(|(l, (a, b))| {
            let end = b.get(DONE)?;
            Some((
                l.clone(),
                (end - a.get(DONE).copied().unwrap_or(0.0)).max(0.0),
            ))
        })
        .collect();
    let total: f64 = done.iter().map(|(_, n)| n).sum();
    if total <= 0.0 {
        return BTreeMap::new();
    }
    done.into_iter().map(|(l, n)| (l, n / total)).collect()
}

/// One pod over the measurement window, from its metrics at the window start (`m0`, just after
/// the `*_max` gauges were reset) and end (`m1`); counters are differenced. `None` = the pod
/// does not export that metric.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodWindow {
    /// Peak KV-cache use in the window, 0..=1 (`model_sim:kv_usage_perc_max`).
    pub kv_peak: Option<f64>,
    /// Mean KV-cache use over the window, 0..=1 (Δ`model_sim:kv_usage_perc_seconds_sum` ÷ Δwall).
    pub kv_mean: Option<f64>,
    /// Peak waiting queue (`model_sim:num_requests_waiting_max`).
    pub queue_peak: Option<f64>,
    /// Preemptions in the window (Δ`vllm:num_preemptions_total`).
    pub preemptions: Option<f64>,
    /// Adapter loads into a GPU slot, any source (Δ`model_sim:lora_loads_total`).
    pub adapter_loads_gpu: Option<f64>,
    /// The part of those loads that came from disk (Δ`model_sim:lora_disk_loads_total`); the
    /// rest were swapped in from the CPU cache.
    pub adapter_loads_disk: Option<f64>,
    /// Prefix-cache hits ÷ queries in the window (tokens).
    pub prefix_hit_rate: Option<f64>,
    /// Mean step lateness in the window, ms (Δlateness sum ÷ Δsteps).
    pub step_lateness_mean_ms: Option<f64>,
    /// Worst step lateness since the reset, ms (`model_sim:step_lateness_seconds_max`).
    pub step_lateness_max_ms: Option<f64>,
}

fn counter(m: &BTreeMap<String, f64>, name: &str) -> Option<f64> {
    m.get(name)
        .or_else(|| m.get(name.trim_end_matches("_total")))
        .copied()
}

/// The window figures of one pod (see [`PodWindow`]).
pub fn pod_window(
    m0: &BTreeMap<String, f64>,
    m1: &BTreeMap<String, f64>,
    wall_s: f64,
) -> PodWindow {
    let delta = |name: &str| -> Option<f64> {
        let b = counter(m1, name)?;
        Some((b - counter(m0, name).unwrap_or(0.0)).max(0.0))
    };
    let hit_rate = match (
        delta("vllm:prefix_cache_hits_total"),
        delta("vllm:prefix_cache_queries_total"),
    ) {
        (Some(h), Some(q)) if q > 0.0 => Some(h / q),
        _ => None,
    };
    let lateness = match (
        delta("model_sim:step_lateness_seconds_sum"),
        delta("model_sim:steps_total"),
    ) {
        (Some(l), Some(n)) if n > 0.0 => Some(1000.0 * l / n),
        (Some(_), Some(_)) => Some(0.0),
        _ => None,
    };
    PodWindow {
        kv_peak: m1.get("model_sim:kv_usage_perc_max").copied(),
        kv_mean: delta("model_sim:kv_usage_perc_seconds_sum")
            .filter(|_| wall_s > 0.0)
            .map(|v| v / wall_s),
        queue_peak: m1.get("model_sim:num_requests_waiting_max").copied(),
        preemptions: delta("vllm:num_preemptions_total"),
        adapter_loads_gpu: delta("model_sim:lora_loads_total"),
        adapter_loads_disk: delta("model_sim:lora_disk_loads_total"),
        prefix_hit_rate: hit_rate,
        step_lateness_mean_ms: lateness,
        step_lateness_max_ms: m1
            .get("model_sim:step_lateness_seconds_max")
            .map(|v| v * 1000.0),
    }
}

/// LRU replay of the adapters each pod served, in send order: misses = estimated loads.
pub fn estimate_adapter_loads(samples: &[Sample], base_model: &str, max_loras: usize) -> u64 {
    let mut order: Vec<&Sample> = samples.iter().filter(|s| s.outcome.ok()).collect();
    order.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    let mut slots: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut loads = 0;
    for s in order {
        if s.model == base_model {
            continue;
        }
        let Some(pod) = s.outcome.pod.as_deref() else {
            continue;
        };
        let lru = slots.entry(pod).or_default();
        if let Some(i) = lru.iter().position(|a| *a == s.model) {
            let a = lru.remove(i);
            lru.push(a);
        } else {
            loads += 1;
            if lru.len() >= max_loras.max(1) {
                lru.remove(0);
            }
            lru.push(&s.model);
        }
    }
    loads
}

/// A lower bound on the adapter loads any router can reach for a sequence of adapter requests
/// (in arrival order) on a fleet with `slots` GPU adapter slots in all: Belady's optimal offline
/// replacement (evict the adapter needed again furthest in the future) on one cache of all the
/// fleet's slots, minus the `slots` first loads, which an ideal warm-up would have made. Splitting
/// the slots over pods and adapters pinned while their requests run can only add loads, so no
/// router does better than this.
pub fn adapter_loads_floor(seq: &[&str], slots: usize) -> u64 {
    let slots = slots.max(1);
    // next[i]: index of the next request for seq[i]'s adapter after i (usize::MAX: none).
    let mut next = vec![usize::MAX; seq.len()];
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, a) in seq.iter().enumerate().rev() {
        if let Some(j) = seen.insert(a, i) {
            next[i] = j;
        }
    }
    // Resident adapters with the index of their next use.
    let mut cache: BTreeMap<&str, usize> = BTreeMap::new();
    let mut misses = 0u64;
    for (i, a) in seq.iter().enumerate() {
        if cache.insert(a, next[i]).is_none() {
            misses += 1;
            if cache.len() > slots {
                let victim = cache
                    .iter()
                    .filter(|(k, _)| **k != *a)
                    .max_by_key(|(_, n)| **n)
                    .map(|(k, _)| *k);
                if let Some(v) = victim {
                    cache.remove(v);
                }
            }
        }
    }
    misses.saturating_sub(slots as u64)
}

/// The extras of one run from the fleet's counters (and the samples, for adapter loads).
pub fn extras(
    metrics: &BTreeMap<String, f64>,
    samples: &[Sample],
    base_model: &str,
    max_loras: Option<usize>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let get = |prefix: &str| -> Option<f64> {
        metrics
            .iter()
            .filter(|(k, _)| *k == prefix || **k == format!("{prefix}_total"))
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b)
    };
    if let (Some(h), Some(q)) = (
        get("vllm:prefix_cache_hits"),
        get("vllm:prefix_cache_queries"),
    ) {
        if q > 0.0 {
            out.insert("prefix_hit_rate".to_string(), h / q);
        }
    }
    if let Some(p) = get("vllm:num_preemptions") {
        out.insert("preemptions".to_string(), p);
    }
    if let Some(max) = max_loras {
        let exported: Option<f64> = metrics
            .iter()
            .filter(|(k, _)| k.contains("lora_load") && !k.ends_with("_created"))
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b);
        match exported {
            Some(v) => {
                out.insert("adapter_loads".to_string(), v);
            }
            None => {
                out.insert(
                    "adapter_loads".to_string(),
                    estimate_adapter_loads(samples, base_model, max) as f64,
                );
                out.insert("adapter_loads_estimated".to_string(), 1.0);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_come_from_each_pods_finished_requests() {
        let m = |n: f64| BTreeMap::from([("vllm:request_success_total".to_string(), n)]);
        let labels = [
            "pod0 (cpu-small)".to_string(),
            "pod1 (cpu-large)".to_string(),
        ];
        let s = shares_from_counts(&labels, &[m(10.0), m(5.0)], &[m(40.0), m(15.0)]);
        assert!((s["pod0 (cpu-small)"] - 0.75).abs() < 1e-9);
        assert!((s["pod1 (cpu-large)"] - 0.25).abs() < 1e-9);
        // Pods without the counter (model-sim names its pod in every response) give nothing.
        let empty = BTreeMap::new();
        assert!(shares_from_counts(
            &labels,
            &[empty.clone(), empty.clone()],
            &[empty.clone(), empty]
        )
        .is_empty());
    }
    use crate::loadgen::client::Outcome;

    #[test]
    fn sums_families_over_labels() {
        let text = "# HELP x\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 30\nvllm:prefix_cache_queries_total{engine=\"0\"} 120\nvllm:prefix_cache_queries_total{engine=\"1\"} 0\nplain 2.5\nbad{ 1\n";
        let m = sum_metrics(text);
        assert_eq!(m["vllm:prefix_cache_hits_total"], 30.0);
        assert_eq!(m["vllm:prefix_cache_queries_total"], 120.0);
        assert_eq!(m["plain"], 2.5);
        let e = extras(&m, &[], "base", None);
        assert_eq!(e["prefix_hit_rate"], 0.25);
        assert!(!e.contains_key("adapter_loads"));
    }

    fn s(at: f64, model: &str, pod: &str) -> Sample {
        Sample {
            id: 0,
            model: model.into(),
            at_ms: at,
            lag_ms: 0.0,
            tag: None,
            group: None,
            outcome: Outcome {
                status: 200,
                pod: Some(pod.into()),
                ..Outcome::default()
            },
        }
    }

    #[test]
    fn window_figures_difference_counters() {
        let m0 = sum_metrics(
            "vllm:num_preemptions_total 3\nvllm:prefix_cache_hits_total 10\nvllm:prefix_cache_queries_total 20\nmodel_sim:steps_total 100\nmodel_sim:step_lateness_seconds_sum 0.5\nmodel_sim:kv_usage_perc_seconds_sum 4\nmodel_sim:lora_loads_total 2\n",
        );
        let m1 = sum_metrics(
            "vllm:num_preemptions_total 5\nvllm:prefix_cache_hits_total 40\nvllm:prefix_cache_queries_total 80\nmodel_sim:steps_total 300\nmodel_sim:step_lateness_seconds_sum 0.9\nmodel_sim:kv_usage_perc_seconds_sum 9\nmodel_sim:kv_usage_perc_max 0.8\nmodel_sim:num_requests_waiting_max 7\nmodel_sim:step_lateness_seconds_max 0.012\nmodel_sim:lora_loads_total 6\nmodel_sim:lora_disk_loads_total 1\n",
        );
        let w = pod_window(&m0, &m1, 10.0);
        assert_eq!(w.preemptions, Some(2.0));
        assert_eq!(w.prefix_hit_rate, Some(0.5));
        assert!((w.step_lateness_mean_ms.unwrap() - 2.0).abs() < 1e-9);
        assert!((w.step_lateness_max_ms.unwrap() - 12.0).abs() < 1e-9);
        assert_eq!(w.kv_mean, Some(0.5));
        assert_eq!(w.kv_peak, Some(0.8));
        assert_eq!(w.queue_peak, Some(7.0));
        assert_eq!(w.adapter_loads_gpu, Some(4.0));
        // A counter that appears during the window counts from zero.
        assert_eq!(w.adapter_loads_disk, Some(1.0));
        // A pod without the emulator's extras: unknown, not zero.
        let bare = pod_window(&BTreeMap::new(), &BTreeMap::new(), 10.0);
        assert_eq!(bare, PodWindow::default());
    }

    #[test]
    fn adapter_floor_is_beladys_minimum_after_a_warm_start() {
        // Everything fits: no load after the warm-up.
        assert_eq!(adapter_loads_floor(&["a", "b", "a", "b", "a"], 2), 0);
        // 3 adapters cycling through 2 slots: Belady misses a b c (b evicted: needed last) then
        // b, then a: 5 misses - 2 warm = 3; LRU would miss all 7.
        let seq = ["a", "b", "c", "a", "b", "c", "a"];
        assert_eq!(adapter_loads_floor(&seq, 2), 3);
        let lru = {
            let mut loads = 0;
            let mut l: Vec<&str> = vec![];
            for a in seq {
                if let Some(i) = l.iter().position(|x| *x == a) {
                    l.remove(i);
                } else {
                    loads += 1;
                    if l.len() == 2 {
                        l.remove(0);
                    }
                }
                l.push(a);
            }
            loads
        };
        assert_eq!(lru, 7);
        // Every distinct adapter beyond the slots costs at least one load.
        let seq: Vec<String> = (0..10).map(|i| format!("x{i}")).collect();
        let seq: Vec<&str> = seq.iter().map(String::as_str).collect();
        assert_eq!(adapter_loads_floor(&seq, 4), 6);
        assert_eq!(adapter_loads_floor(&[], 4), 0);
    }

    #[test]
    fn lru_replay_counts_misses_per_pod() {
        let seq = vec![
            s(0.0, "a", "p1"),
            s(1.0, "b", "p1"),
            s(2.0, "a", "p1"), // hit
            s(3.0, "c", "p1"), // evicts b (LRU with 2 slots)
            s(4.0, "b", "p1"), // miss
            s(5.0, "a", "p2"), // other pod: miss
            s(6.0, "base", "p2"),
        ];
        assert_eq!(estimate_adapter_loads(&seq, "base", 2), 5);
        let e = extras(&BTreeMap::new(), &seq, "base", Some(2));
        assert_eq!(e["adapter_loads"], 5.0);
        assert_eq!(e["adapter_loads_estimated"], 1.0);
        let mut m = BTreeMap::new();
        m.insert("model_sim:lora_loads_total".to_string(), 7.0);
        assert_eq!(extras(&m, &seq, "base", Some(2))["adapter_loads"], 7.0);
    }
}
