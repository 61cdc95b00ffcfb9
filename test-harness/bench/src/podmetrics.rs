//! Figures read from the pods after a run: prefix-cache hit rate, preemptions, adapter loads.
//!
//! Pods are fresh for every router, so their counters cover exactly one run. Adapter loads come
//! from a pod counter when the emulator exports one (any metric whose name contains
//! `lora_load`); otherwise they are estimated by replaying each pod's served adapter sequence
//! through an LRU of `max_loras` slots (marked `adapter_loads_estimated`).

use crate::loadgen::Sample;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Sum of every sample of each metric family in Prometheus text, keyed by name without labels.
pub fn sum_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find('{') {
            Some(i) => match line[i..].find('}') {
                Some(j) => (&line[..i], &line[i + j + 1..]),
                None => continue,
            },
            None => match line.split_once(' ') {
                Some((n, r)) => (n, r),
                None => continue,
            },
        };
        let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if v.is_finite() {
            *out.entry(name.to_string()).or_insert(0.0) += v;
        }
    }
    out
}

/// Scrape every pod once and sum the families over the fleet.
pub async fn scrape(pods: &[SocketAddr]) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    for p in pods {
        if let Ok(r) = testkit::get(*p, "/metrics", &[]).await {
            for (k, v) in sum_metrics(&r.text()) {
                *total.entry(k).or_insert(0.0) += v;
            }
        }
    }
    total
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
    use crate::client::Outcome;

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
            outcome: Outcome {
                status: 200,
                pod: Some(pod.into()),
                ..Outcome::default()
            },
        }
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
