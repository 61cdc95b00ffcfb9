//! Metrics-only pods (`--metrics-only`): realistic, slowly varying `/metrics` with no engine.
//!
//! Used to stand up 100+ pods cheaply for the sidecar's scrape-cost benchmark. Every value is a
//! pure function of (seed, time), computed only when `/metrics` is read: no task per pod.

use crate::metrics::{Histogram, MetricsView, E2E_BUCKETS, TTFT_BUCKETS};
use crate::profile::Profile;

const ADAPTERS: &[&str] = &[
    "sql-lora",
    "chat-lora",
    "code-lora",
    "summ-lora",
    "tool-lora",
];

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn unit(seed: u64, k: u64) -> f64 {
    (mix(seed ^ mix(k)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Smooth noise in [0, 1): linear interpolation of per-10-second random points.
fn smooth(seed: u64, t: f64) -> f64 {
    let x = t / 10.0;
    let k = x.floor();
    let f = x - k;
    let k = k.max(0.0) as u64;
    unit(seed, k) * (1.0 - f) + unit(seed, k + 1) * f
}

/// Load in [0, 1] of pod `seed` at `t` seconds: a slow sine plus smooth noise.
pub fn load(seed: u64, t: f64) -> f64 {
    let period = 60.0 + unit(seed, 1_000_001) * 120.0;
    let phase = unit(seed, 1_000_002) * std::f64::consts::TAU;
    let base = 0.45 + 0.3 * (std::f64::consts::TAU * t / period + phase).sin();
    (base + 0.25 * (smooth(seed, t) - 0.5)).clamp(0.0, 1.0)
}

/// The metrics view of a synthetic pod `t` seconds after start.
pub fn view(
    seed: u64,
    profile: &Profile,
    model: &str,
    max_lora: usize,
    t: f64,
    created_unix: f64,
) -> MetricsView {
    let l = load(seed, t);
    let running = (l * f64::from(profile.max_num_seqs.min(64))).round();
    let waiting = ((l - 0.7).max(0.0) * 60.0).round();
    let kv_usage = (l * 0.9 + 0.02).clamp(0.0, 1.0);
    let used_blocks = (kv_usage * f64::from(profile.num_gpu_blocks)) as u64;
    let t = t.max(0.0);
    let requests = (t * (2.0 + 3.0 * unit(seed, 7))) as u64;
    let gen_tokens = requests * 180;
    let prompt_tokens = requests * 700;
    let hits = (prompt_tokens as f64 * (0.2 + 0.5 * unit(seed, 8))) as u64;
    // Fixed distribution shapes scaled by the request count.
    let ttft_shape = [
        0.0, 0.0, 0.01, 0.05, 0.15, 0.3, 0.45, 0.55, 0.8, 0.9, 0.95, 0.97, 0.99,
    ];
    let e2e_shape = [0.0, 0.02, 0.1, 0.2, 0.4, 0.55, 0.7, 0.9, 0.97, 0.99];
    let cum = |shape: &[f64], n: usize| -> Vec<u64> {
        (0..n)
            .map(|i| (shape.get(i).copied().unwrap_or(1.0) * requests as f64) as u64)
            .collect()
    };
    let ttft = Histogram::from_parts(
        TTFT_BUCKETS,
        cum(&ttft_shape, TTFT_BUCKETS.len()),
        requests as f64 * 0.12,
        requests,
    );
    let e2e = Histogram::from_parts(
        E2E_BUCKETS,
        cum(&e2e_shape, E2E_BUCKETS.len()),
        requests as f64 * 2.5,
        requests,
    );
    let k = max_lora.min(ADAPTERS.len());
    let window = (t / 30.0) as u64;
    let active: Vec<&str> = (0..k)
        .filter(|i| unit(seed, window * 16 + *i as u64) < l)
        .map(|i| ADAPTERS[(i + seed as usize) % ADAPTERS.len()])
        .collect();
    let waiting_ad: Vec<&str> = if waiting > 0.0 {
        active.iter().take(1).copied().collect()
    } else {
        Vec::new()
    };
    MetricsView {
        model: model.to_string(),
        running,
        waiting,
        kv_usage,
        used_blocks,
        block_size: profile.block_size,
        num_gpu_blocks: profile.num_gpu_blocks,
        max_lora,
        lora_series: vec![(
            active.join(","),
            waiting_ad.join(","),
            created_unix + window as f64 * 30.0,
        )],
        prompt_tokens,
        generation_tokens: gen_tokens,
        prefix_queries: prompt_tokens,
        prefix_hits: hits,
        preemptions: (requests as f64 * (l - 0.8).max(0.0)) as u64,
        finished_stop: requests / 4,
        finished_length: requests - requests / 4,
        finished_abort: 0,
        ttft,
        e2e,
        lora_loads: requests / 50,
        lora_disk_loads: requests / 100,
        steps: (t * 50.0) as u64,
        step_lateness_sum: 0.0,
        step_lateness_max: 0.0,
        kv_usage_max: kv_usage,
        kv_usage_seconds: t * 0.5,
        waiting_max: waiting,
        gen_throughput: running * 25.0,
        created: created_unix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_varies_slowly_and_stays_in_range() {
        let mut prev = load(3, 0.0);
        let mut lo: f64 = 1.0;
        let mut hi: f64 = 0.0;
        for i in 1..3000 {
            let v = load(3, f64::from(i) * 0.1);
            assert!((0.0..=1.0).contains(&v));
            assert!((v - prev).abs() < 0.05, "jump {prev} -> {v}");
            lo = lo.min(v);
            hi = hi.max(v);
            prev = v;
        }
        assert!(hi - lo > 0.2, "should vary: {lo}..{hi}");
        assert_ne!(load(3, 50.0), load(4, 50.0));
    }
}
