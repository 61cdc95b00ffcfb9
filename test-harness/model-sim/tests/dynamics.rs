//! Pins the emulator's dynamics on a simulated clock (no sleeping, deterministic): queueing,
//! prefix caching, KV pressure and preemption, LoRA loading, and relative GPU saturation.
//! Each test compares two runs of the same engine model, so it fails if the mechanism is broken.

use std::sync::Arc;

use model_sim::engine::{simulate, Engine, NewRequest, Outcome};
use model_sim::metrics::{engine_view, render_sglang, render_vllm, KvMetricName};
use model_sim::profile::Profile;
use model_sim::prompt::{block_hashes, count_tokens};

mod common;

fn req(text: &str, out: u32, adapter: Option<&str>) -> NewRequest {
    NewRequest {
        prompt_tokens: count_tokens(text),
        output_tokens: out,
        max_tokens: out,
        block_hashes: block_hashes(text, 16, adapter),
        adapter: adapter.map(Arc::from),
    }
}

/// A prompt of `chars` characters unique to `seed`.
fn text(seed: u64, chars: usize) -> String {
    let mut s = String::with_capacity(chars);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while s.len() < chars {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push((b'a' + (x % 26) as u8) as char);
    }
    s
}

fn by_index(mut o: Vec<Outcome>) -> Vec<Outcome> {
    o.sort_by_key(|x| x.index);
    o
}

#[test]
fn ttft_grows_with_queue_length() {
    // Bursts of N identical-size requests at t=0 on an A10G: the last one waits behind N-1.
    let mut last_ttft = Vec::new();
    for n in [1usize, 4, 16, 64] {
        let mut e = Engine::new(Profile::a10g(), 0);
        let arrivals: Vec<(f64, NewRequest)> = (0..n)
            .map(|i| (0.0, req(&text(i as u64, 4000), 64, None)))
            .collect();
        let mut max_waiting = 0;
        let out = by_index(simulate(&mut e, arrivals, 600.0, |e, _| {
            max_waiting = max_waiting.max(e.state().waiting);
        }));
        assert_eq!(out.len(), n);
        // FCFS: TTFT never decreases with arrival order.
        for w in out.windows(2) {
            assert!(w[1].ttft + 1e-9 >= w[0].ttft, "FCFS violated: {:?}", w);
        }
        if n >= 16 {
            assert!(max_waiting > 0, "a burst of {n} should queue");
        }
        last_ttft.push(out[n - 1].ttft);
    }
    eprintln!("last-request TTFT for bursts 1/4/16/64 on a10g: {last_ttft:?}");
    for w in last_ttft.windows(2) {
        assert!(
            w[1] > w[0] * 1.5,
            "TTFT of the last request must grow with the queue: {last_ttft:?}"
        );
    }
}

#[test]
fn cached_prefix_gives_shorter_ttft() {
    let mut e = Engine::new(Profile::a10g(), 0);
    let shared = text(1, 12_000); // ≈ 3000 tokens of shared prefix
    let warm = format!("{shared}{}", text(2, 400));
    let hit = format!("{shared}{}", text(3, 400));
    let miss = text(4, 12_400);
    let arrivals = vec![
        (0.0, req(&warm, 8, None)),
        (30.0, req(&hit, 8, None)),
        (60.0, req(&miss, 8, None)),
    ];
    let out = by_index(simulate(&mut e, arrivals, 600.0, |_, _| {}));
    assert_eq!(out.len(), 3);
    let (hit, miss) = (&out[1], &out[2]);
    eprintln!("TTFT prefix hit {:.4}s vs miss {:.4}s", hit.ttft, miss.ttft);
    assert!(
        hit.usage.cached_tokens >= 2900,
        "cached tokens {}",
        hit.usage.cached_tokens
    );
    assert_eq!(miss.usage.cached_tokens, 0);
    assert!(
        hit.ttft < miss.ttft / 3.0,
        "hit {} vs miss {}",
        hit.ttft,
        miss.ttft
    );
    let s = e.stats();
    assert_eq!(s.prefix_hits, u64::from(hit.usage.cached_tokens));
    assert!(
        s.prefix_queries
            >= u64::from(
                out[0].usage.prompt_tokens + hit.usage.prompt_tokens + miss.usage.prompt_tokens
            )
    );
    // The adapter is part of the hash: the same text under an adapter does not hit.
    let mut e = Engine::new(Profile::h100(), 2);
    let out = by_index(simulate(
        &mut e,
        vec![
            (0.0, req(&warm, 4, None)),
            (10.0, req(&warm, 4, Some("sql-lora"))),
        ],
        100.0,
        |_, _| {},
    ));
    assert!(out[1].usage.cached_tokens == 0);
}

#[test]
fn kv_usage_rises_with_concurrent_long_prompts_and_preempts_when_full() {
    // Few long requests: moderate KV, no preemption.
    let mut e = Engine::new(Profile::a10g(), 0);
    let few: Vec<(f64, NewRequest)> = (0..2)
        .map(|i| (0.0, req(&text(i, 8000), 500, None)))
        .collect();
    let mut peak_few: f64 = 0.0;
    simulate(&mut e, few, 600.0, |e, _| {
        peak_few = peak_few.max(e.state().kv_usage)
    });
    assert_eq!(e.stats().preemptions, 0);
    assert!(
        peak_few > 0.05 && peak_few < 0.3,
        "peak with 2 requests: {peak_few}"
    );

    // Many: blocks run out while sequences grow, so the newest are preempted.
    let mut e = Engine::new(Profile::a10g(), 0);
    let many: Vec<(f64, NewRequest)> = (0..24)
        .map(|i| (0.0, req(&text(100 + i, 8000), 1500, None)))
        .collect();
    let mut trace = Vec::new();
    let out = simulate(&mut e, many, 3600.0, |e, t| {
        trace.push((t, e.state().kv_usage, e.stats().preemptions))
    });
    assert_eq!(out.len(), 24, "every request still finishes");
    let peak = trace.iter().map(|x| x.1).fold(0.0, f64::max);
    assert!(peak > 0.95, "KV should fill up: peak {peak}");
    assert!(peak > 3.0 * peak_few);
    eprintln!(
        "KV peak few {peak_few:.3}, many {peak:.3}, preemptions {}",
        e.stats().preemptions
    );
    assert!(e.stats().preemptions > 0, "preemption when full");
    // Usage rises before the first preemption.
    let first_pre = trace.iter().position(|x| x.2 > 0).unwrap_or(trace.len());
    let early: Vec<f64> = trace[..first_pre].iter().map(|x| x.1).collect();
    assert!(early.len() > 10);
    assert!(
        early[early.len() - 1] > early[0] + 0.5,
        "usage rises: {:?}..{:?}",
        early.first(),
        early.last()
    );
    // After everything finished no block is held.
    assert_eq!(e.state().used_blocks, 0);
}

#[test]
fn non_resident_adapter_pays_load_latency_and_waits_for_a_slot() {
    let p = Profile::h100();
    let load = p.lora_load_s;
    let mut e = Engine::new(p, 1);
    let arrivals = vec![
        (0.0, req("hello adapter a", 4, Some("a"))), // cold: loads a
        (5.0, req("hello adapter a again", 4, Some("a"))), // warm
        (10.0, req("hello adapter b", 4, Some("b"))), // cold: evicts a
        (15.0, req("hello base model", 4, None)),    // no adapter
    ];
    let out = by_index(simulate(&mut e, arrivals, 100.0, |_, _| {}));
    assert!(out[0].ttft >= load, "cold load {}", out[0].ttft);
    assert!(out[1].ttft < load / 2.0, "resident {}", out[1].ttft);
    assert!(out[2].ttft >= load, "cold after eviction {}", out[2].ttft);
    assert!(out[3].ttft < load / 2.0);
    assert_eq!(e.lora_loads(), 2);

    // One slot busy with a long request for `a`: a request for `b` waits until it finishes,
    // while a base-model request behind it is not blocked.
    let mut e = Engine::new(Profile::h100(), 1);
    let arrivals = vec![
        (0.0, req("long a", 400, Some("a"))),
        (0.1, req("short b", 4, Some("b"))),
        (0.2, req("base", 4, None)),
    ];
    let out = by_index(simulate(&mut e, arrivals, 100.0, |_, _| {}));
    let a_done = out[0].arrival + out[0].e2e;
    assert!(
        out[1].arrival + out[1].ttft > a_done,
        "b must wait for the slot"
    );
    assert!(
        out[2].arrival + out[2].e2e < a_done,
        "base request passes the blocked one"
    );
}

/// Runs a steady load of `rate` req/s for `secs` and says whether the pod saturated the way GAIE
/// measures it (`max(queue/5, kv/0.8) ≥ 1`) at any step, plus the p90 TTFT.
fn saturates(p: Profile, rate: f64, secs: f64) -> (bool, f64) {
    let mut e = Engine::new(p, 0);
    let n = (rate * secs) as usize;
    let arrivals: Vec<(f64, NewRequest)> = (0..n)
        .map(|i| (i as f64 / rate, req(&text(i as u64, 2000), 128, None)))
        .collect();
    let mut sat = false;
    let out = simulate(&mut e, arrivals, secs * 20.0, |e, _| {
        let s = e.state();
        if (f64::from(s.waiting) / 5.0).max(s.kv_usage / 0.8) >= 1.0 {
            sat = true;
        }
    });
    let mut ttft: Vec<f64> = out.iter().map(|o| o.ttft).collect();
    ttft.sort_by(f64::total_cmp);
    (
        sat,
        ttft.get(ttft.len() * 9 / 10)
            .copied()
            .unwrap_or(f64::INFINITY),
    )
}

#[test]
fn a10g_saturates_before_h100() {
    let rates = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
    let first = |p: fn() -> Profile| rates.iter().position(|&r| saturates(p(), r, 20.0).0);
    let a = first(Profile::a10g);
    let h = first(Profile::h100);
    eprintln!("first saturating rate index: a10g {a:?}, h100 {h:?} of {rates:?}");
    let a = a.unwrap_or_else(|| panic!("a10g never saturated"));
    let h = h.unwrap_or(rates.len());
    assert!(
        a < h,
        "a10g saturates at {} req/s, h100 at index {h}",
        rates[a]
    );
    // At the a10g's saturating rate the h100 is comfortable and much faster.
    let (_, ttft_a) = saturates(Profile::a10g(), rates[a], 20.0);
    let (sat_h, ttft_h) = saturates(Profile::h100(), rates[a], 20.0);
    eprintln!(
        "at {} req/s: p90 TTFT a10g {ttft_a:.3}s, h100 {ttft_h:.3}s",
        rates[a]
    );
    assert!(!sat_h);
    assert!(
        ttft_a > 5.0 * ttft_h,
        "p90 TTFT a10g {ttft_a} vs h100 {ttft_h}"
    );
}

#[test]
fn metrics_text_parses_and_matches_engine_state() {
    // Stop a loaded simulation mid-way and compare /metrics text with the engine's own state.
    let mut e = Engine::new(Profile::a10g(), 2);
    let arrivals: Vec<(f64, NewRequest)> = (0..40)
        .map(|i| {
            let adapter = match i % 3 {
                0 => Some("sql-lora"),
                1 => Some("chat-lora"),
                _ => None,
            };
            (i as f64 * 0.05, req(&text(i, 6000), 300, adapter))
        })
        .collect();
    simulate(&mut e, arrivals, 3.0, |_, _| {});
    let st = e.state();
    assert!(st.running > 0 && st.waiting > 0, "want a busy pod: {st:?}");
    let series = vec![
        ("old".to_string(), String::new(), 1.0e9),
        (
            st.running_adapters.join(","),
            st.waiting_adapters.join(","),
            2.0e9,
        ),
    ];
    let view = engine_view("meta-llama/Llama-3.1-8B-Instruct", &e, series, 0.0, 1.0e9);
    let m = common::parse_metrics(&render_vllm(&view, KvMetricName::Both));
    let model = [("model_name", "meta-llama/Llama-3.1-8B-Instruct")];
    let g = |n: &str| common::get(&m, n, &model).unwrap_or_else(|| panic!("missing {n}"));
    assert_eq!(g("vllm:num_requests_running"), f64::from(st.running));
    assert_eq!(g("vllm:num_requests_waiting"), f64::from(st.waiting));
    assert!((g("vllm:kv_cache_usage_perc") - st.kv_usage).abs() < 1e-9);
    assert!((g("vllm:gpu_cache_usage_perc") - st.kv_usage).abs() < 1e-9);
    let s = e.stats();
    assert_eq!(
        g("vllm:prefix_cache_queries_total"),
        s.prefix_queries as f64
    );
    assert_eq!(g("vllm:prefix_cache_hits_total"), s.prefix_hits as f64);
    assert_eq!(
        g("vllm:generation_tokens_total"),
        s.generation_tokens as f64
    );
    assert_eq!(g("vllm:prompt_tokens_total"), s.prompt_tokens as f64);
    assert_eq!(g("vllm:num_preemptions_total"), s.preemptions as f64);
    assert_eq!(g("vllm:time_to_first_token_seconds"), s.ttft.count() as f64);
    assert_eq!(g("vllm:e2e_request_latency_seconds"), s.e2e.count() as f64);
    assert_eq!(g("model_sim:lora_loads_total"), e.lora_loads() as f64);
    assert!(e.lora_loads() >= 2);
    let cfg = common::series(&m, "vllm:cache_config_info");
    assert_eq!(cfg.len(), 1);
    assert_eq!(common::label(&cfg[0].0, "block_size"), Some("16"));
    assert_eq!(common::label(&cfg[0].0, "num_gpu_blocks"), Some("2250"));
    // LoRA: newest series (largest timestamp) carries the current adapters.
    let lora = common::series(&m, "vllm:lora_requests_info");
    assert_eq!(lora.len(), 2);
    let newest = lora
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|x| x.0.clone())
        .unwrap_or_default();
    assert_eq!(
        common::label(&newest, "running_lora_adapters"),
        Some(st.running_adapters.join(",").as_str())
    );
    assert_eq!(
        common::label(&newest, "waiting_lora_adapters"),
        Some(st.waiting_adapters.join(",").as_str())
    );
    assert_eq!(common::label(&newest, "max_lora"), Some("2"));
    assert!(!st.running_adapters.is_empty());

    // SGLang names for the same state.
    let m = common::parse_metrics(&render_sglang(&view));
    let g = |n: &str| common::get(&m, n, &model).unwrap_or_else(|| panic!("missing {n}"));
    assert_eq!(g("sglang:num_running_reqs"), f64::from(st.running));
    assert_eq!(g("sglang:num_queue_reqs"), f64::from(st.waiting));
    assert!((g("sglang:token_usage") - st.kv_usage).abs() < 1e-9);
    assert_eq!(g("sglang:num_used_tokens"), f64::from(st.used_blocks * 16));
    let cfg = common::series(&m, "sglang:cache_config_info");
    assert_eq!(common::label(&cfg[0].0, "num_pages"), Some("2250"));
    assert_eq!(common::label(&cfg[0].0, "page_size"), Some("16"));
}

#[test]
fn the_parser_accepts_colon_names_in_real_fixtures() {
    // Guard against a parser that silently rejects `vllm:`/`sglang:` names.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/metrics/sglang-docs-production-metrics.prom"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("metrics fixture missing: {path}: {e} (part of the repository)")
    });
    let m = common::parse_metrics(&text);
    assert_eq!(
        common::get(
            &m,
            "sglang:token_usage",
            &[("model_name", "meta-llama/Llama-3.1-8B-Instruct")]
        ),
        Some(0.28)
    );
}
