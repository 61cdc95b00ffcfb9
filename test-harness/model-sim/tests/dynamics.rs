//! Pins the emulator's dynamics on a simulated clock (no sleeping, deterministic): queueing,
//! prefix caching on token blocks, KV pressure and preemption, quadratic prefill, two-tier LoRA
//! loading, the KV-limited 70B profile, and relative GPU saturation.
//! Each test compares two runs of the same engine model, so it fails if the mechanism is broken.

use std::sync::Arc;

use model_sim::engine::{simulate, Engine, NewRequest, Outcome};
use model_sim::metrics::{engine_view, render_sglang, render_vllm, KvMetricName};
use model_sim::profile::Profile;
use model_sim::prompt::{block_hashes, token_ends, tokenize};

mod common;

fn req(text: &str, out: u32, adapter: Option<&str>) -> NewRequest {
    let tokens = tokenize(text);
    NewRequest {
        prompt_tokens: tokens.len().max(1) as u32,
        output_tokens: out,
        max_tokens: out,
        block_hashes: block_hashes(&tokens, 16, adapter),
        adapter: adapter.map(Arc::from),
    }
}

/// A prompt of `chars` characters unique to `seed`: words of 1-9 letters.
fn text(seed: u64, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 10);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while s.len() < chars {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x % 6 == 0 && !s.is_empty() {
            s.push(' ');
        } else {
            s.push((b'a' + ((x >> 8) % 26) as u8) as char);
        }
    }
    s.truncate(chars);
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
    let shared_tokens = tokenize(&shared).len() as u32;
    assert!(
        hit.usage.cached_tokens + 20 >= shared_tokens && hit.usage.cached_tokens > 2000,
        "cached tokens {} of a {shared_tokens}-token shared prefix",
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
    // The crate folder as cargo gives it when the test runs, not as it was when the binary was
    // built: a target directory shared by two checkouts reuses a binary built for the other.
    let dir = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let path = format!("{dir}/../fixtures/metrics/sglang-docs-production-metrics.prom");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
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

/// TTFT of one prompt of `chars` characters on an idle pod.
fn idle_ttft(p: Profile, chars: usize) -> f64 {
    let mut e = Engine::new(p, 0);
    let out = simulate(
        &mut e,
        vec![(0.0, req(&text(7, chars), 1, None))],
        600.0,
        |_, _| {},
    );
    out[0].ttft
}

#[test]
fn prefill_grows_faster_than_linearly_with_context() {
    // 4x the prompt costs more than 4x the prefill: attention reads all earlier tokens.
    let ratio = |p: Profile| idle_ttft(p.clone(), 128_000) / idle_ttft(p, 32_000);
    let quadratic = ratio(Profile::h100());
    let mut linear_only = Profile::h100();
    linear_only.prefill_attn_s = 0.0;
    let linear = ratio(linear_only);
    eprintln!(
        "TTFT(32k tokens)/TTFT(8k tokens): {quadratic:.2} with attention, {linear:.2} without"
    );
    assert!(linear < 4.2, "{linear}");
    assert!(quadratic > 4.8, "{quadratic}");
    // The step cost counts the attention pairs of a chunk: n·c + n(n+1)/2.
    let mut e = Engine::new(Profile::h100(), 0);
    let r = req(&text(9, 4000), 1, None);
    let n = u64::from(r.prompt_tokens);
    e.submit(r, 0.0).unwrap_or_else(|err| panic!("{err}"));
    e.begin_step(0.0);
    let step = e.last_step().unwrap_or_else(|| panic!("no step"));
    assert_eq!(step.attention_pairs, n * (n + 1) / 2);
}

#[test]
fn engine_blocks_do_not_line_up_with_64_character_text_blocks() {
    // A router that hashes 64-character blocks of text assumes block j ends at 64·j characters.
    // The engine's blocks are 16 token ids, and tokens hold a variable number of characters, so
    // its block ends drift away from multiples of 64.
    let t = text(11, 20_000);
    let ends = token_ends(&t);
    let block_ends: Vec<i64> = ends
        .iter()
        .skip(15)
        .step_by(16)
        .map(|&e| e as i64)
        .collect();
    let aligned = block_ends
        .iter()
        .enumerate()
        .filter(|(j, &e)| e == 64 * (*j as i64 + 1))
        .count();
    let offsets: std::collections::BTreeSet<i64> = block_ends
        .iter()
        .enumerate()
        .map(|(j, &e)| e - 64 * (j as i64 + 1))
        .collect();
    eprintln!(
        "{} engine blocks, {aligned} end on a 64-character boundary; drift {:?}..{:?}",
        block_ends.len(),
        offsets.first(),
        offsets.last()
    );
    assert!(
        aligned * 5 < block_ends.len(),
        "{aligned} of {}",
        block_ends.len()
    );
    assert!(offsets.len() >= 10, "{offsets:?}");

    // Two prompts sharing k·64 characters: the engine hits the whole 16-token blocks the two
    // token sequences share, never more, never a block less.
    for k in [10usize, 17, 23, 29] {
        let shared = &t[..k * 64];
        let a = format!("{shared}{}", text(100 + k as u64, 400));
        let b = format!("{shared}{}", text(200 + k as u64, 400));
        let mut e = Engine::new(Profile::h100(), 0);
        let out = by_index(simulate(
            &mut e,
            vec![(0.0, req(&a, 2, None)), (1.0, req(&b, 2, None))],
            10.0,
            |_, _| {},
        ));
        let cached = out[1].usage.cached_tokens;
        let (ta, tb) = (tokenize(&a), tokenize(&b));
        let common = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count() as u32;
        assert_eq!(cached, common / 16 * 16, "k {k}");
    }
}

#[test]
fn cpu_lora_cache_makes_swap_ins_cheap_and_disk_loads_dear() {
    // One GPU slot; adapters a, b, a. With a CPU cache of 4 the second `a` swaps in from CPU;
    // with vLLM's default (CPU cache = max_loras = 1) it is read from disk again.
    let run = |max_cpu: usize| {
        let p = Profile::h100();
        let mut e = Engine::with_cpu_loras(p, 1, max_cpu);
        let out = by_index(simulate(
            &mut e,
            vec![
                (0.0, req("hello adapter a", 4, Some("a"))),
                (5.0, req("hello adapter b", 4, Some("b"))),
                (10.0, req("hello adapter a again", 4, Some("a"))),
            ],
            100.0,
            |_, _| {},
        ));
        (out[2].ttft, e.lora_loads(), e.lora_disk_loads())
    };
    let p = Profile::h100();
    let (cpu_ttft, loads, disk) = run(4);
    assert_eq!((loads, disk), (3, 2));
    assert!(cpu_ttft >= p.lora_cpu_load_s, "{cpu_ttft}");
    assert!(
        cpu_ttft < p.lora_load_s / 2.0,
        "swap-in from CPU is cheap: {cpu_ttft}"
    );
    let (disk_ttft, loads, disk) = run(1);
    assert_eq!((loads, disk), (3, 3));
    assert!(disk_ttft >= p.lora_load_s, "{disk_ttft}");
}

#[test]
fn seventy_b_profile_preempts_under_a_burst_that_an_8b_h100_absorbs() {
    // 24 requests of ~2,000 prompt tokens and 500 output tokens at once.
    let burst = || -> Vec<(f64, NewRequest)> {
        (0..24)
            .map(|i| (0.0, req(&text(300 + i, 8000), 500, None)))
            .collect()
    };
    let run = |p: Profile| {
        let mut e = Engine::new(p, 0);
        let out = simulate(&mut e, burst(), 3600.0, |_, _| {});
        assert_eq!(out.len(), 24);
        (e.stats().preemptions, e.stats().kv_usage_max)
    };
    let (pre_70b, kv_70b) = run(Profile::h100_70b());
    let (pre_8b, kv_8b) = run(Profile::h100());
    eprintln!("burst: 70b preemptions {pre_70b} (peak KV {kv_70b:.2}), 8b {pre_8b} ({kv_8b:.2})");
    assert!(pre_70b > 0 && kv_70b > 0.95);
    assert_eq!(pre_8b, 0);
    assert!(kv_8b < 0.2);
}

#[test]
fn peaks_and_kv_integral_follow_the_engine() {
    let mut e = Engine::new(Profile::a10g(), 0);
    let arrivals: Vec<(f64, NewRequest)> = (0..30)
        .map(|i| (i as f64 * 0.02, req(&text(500 + i, 6000), 200, None)))
        .collect();
    let mut trace: Vec<(f64, f64)> = Vec::new();
    let mut peak_wait = 0;
    simulate(&mut e, arrivals, 3600.0, |e, t| {
        trace.push((t, e.state().kv_usage));
        peak_wait = peak_wait.max(e.state().waiting);
    });
    let s = e.stats().clone();
    let peak = trace.iter().map(|x| x.1).fold(0.0, f64::max);
    assert!(
        s.kv_usage_max >= peak && s.kv_usage_max > 0.3,
        "{} vs {peak}",
        s.kv_usage_max
    );
    assert!(s.waiting_max >= peak_wait && peak_wait > 0);
    // ∫ kv dt from the engine equals the step-by-step integral of the trace (usage is constant
    // between the end of one step and the end of the next, as seen after each step).
    let mut integral = 0.0;
    let mut prev: Option<(f64, f64)> = None;
    for &(t, kv) in &trace {
        if let Some((t0, _)) = prev {
            integral += kv * (t - t0);
        }
        prev = Some((t, kv));
    }
    let end = trace.last().map_or(0.0, |x| x.0);
    let engine = e.kv_usage_seconds_at(end);
    eprintln!("∫kv dt: engine {engine:.3}, trace {integral:.3}");
    assert!(
        engine > 0.0 && (engine - integral).abs() <= 0.25 * integral,
        "{engine} vs {integral}"
    );
    e.reset_peaks();
    assert_eq!(e.stats().kv_usage_max, 0.0);
    assert_eq!(e.stats().waiting_max, 0);
}
