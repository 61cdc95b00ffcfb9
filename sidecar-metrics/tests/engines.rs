//! Engine rules the fixtures do not exercise (written here as small synthetic texts, labelled as
//! such): vLLM's LoRA newest-timestamp rule and data-parallel series, the new KV name winning over
//! the old one, SGLang cache geometry, trtllm-serve, TGI, detection; plus a seeded fuzz test of
//! the reader on random and mutated input (no panics, and valid lines still read right).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llm_router_snapshot::{Engine, LoraState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sidecar_metrics::engines::{engine_of, normalise, NormaliseError, Options};
use sidecar_metrics::prom::{parse_all, parse_line, Line};

fn norm(text: &str) -> Result<sidecar_metrics::engines::PodMetrics, NormaliseError> {
    normalise(
        text,
        Options {
            engine: None,
            detailed: true,
        },
    )
}

#[test]
fn vllm_lora_takes_the_newest_series() {
    // Synthetic: vLLM keeps one series per label combination; the value is its update time.
    let text = r#"
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old-a",waiting_lora_adapters=""} 1.700000001e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="x-lora"} 1.700000009e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.700000005e+09
vllm:num_requests_waiting{model_name="m"} 1
"#;
    let m = norm(text).expect("ok");
    assert_eq!(
        m.lora,
        Some(LoraState {
            running: vec!["sql-lora".into(), "chat-lora".into()],
            waiting: vec!["x-lora".into()],
            max_loras: 4
        })
    );
}

#[test]
fn vllm_series_are_summed_and_new_kv_name_wins() {
    let text = r#"
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:cache_config_info{block_size="32",num_gpu_blocks="None"} 1.0
"#;
    let m = norm(text).expect("ok");
    assert_eq!((m.waiting, m.running), (5, 5));
    assert_eq!(m.kv_usage, Some(0.6));
    assert_eq!((m.block_size, m.num_blocks), (32, 0));
    assert_eq!(m.lora, None);
}

#[test]
fn out_of_range_values_are_clamped_not_trusted() {
    let text = "vllm:kv_cache_usage_perc 1.7\nvllm:num_requests_waiting -3\nvllm:num_requests_running NaN\n";
    let m = norm(text).expect("ok");
    assert_eq!((m.kv_usage, m.waiting, m.running), (Some(1.0), 0, 0));
    let m = norm("vllm:kv_cache_usage_perc -0.5\n").expect("ok");
    assert_eq!(m.kv_usage, Some(0.0));
    let m = norm("vllm:num_requests_waiting 1e12\n").expect("ok");
    assert_eq!(m.waiting, u32::MAX);
}

#[test]
fn sglang_cache_config_and_trtllm_serve_and_tgi() {
    // Synthetic texts with the names PRIOR-ART.md lists (no real samples of these exist).
    let m = norm(
        "sglang:num_queue_reqs 3\nsglang:num_running_reqs 7\nsglang:token_usage 0.5\n\
         sglang:cache_config_info{page_size=\"1\",num_pages=\"4096\"} 1\n",
    )
    .expect("ok");
    assert_eq!(
        (m.engine, m.waiting, m.running, m.kv_usage),
        (Engine::Sglang, 3, 7, Some(0.5))
    );
    assert_eq!((m.block_size, m.num_blocks), (1, 4096));

    let m = norm(
        "trtllm_num_requests_waiting{model_name=\"q\"} 4\ntrtllm_num_requests_running{model_name=\"q\"} 2\n\
         trtllm_kv_cache_utilization{model_name=\"q\"} 0.75\ntrtllm_kv_cache_tokens_per_block 32\n\
         trtllm_kv_cache_max_blocks 2048\n",
    )
    .expect("ok");
    assert_eq!(
        (m.engine, m.waiting, m.running, m.kv_usage),
        (Engine::TrtllmServe, 4, 2, Some(0.75))
    );
    assert_eq!((m.block_size, m.num_blocks), (32, 2048));

    let m = norm("# TYPE tgi_queue_size gauge\ntgi_queue_size 6\ntgi_batch_current_size 9\ntgi_batch_current_max_tokens 1000\n")
        .expect("ok");
    assert_eq!(
        (m.engine, m.waiting, m.running, m.kv_usage),
        (Engine::Tgi, 6, 9, None)
    );
    assert_eq!(m.missing, vec!["kv_usage"]);
}

#[test]
fn detection_by_prefix_and_refusals() {
    assert_eq!(engine_of("vllm:num_requests_waiting"), Some(Engine::Vllm));
    assert_eq!(engine_of("sglang:token_usage"), Some(Engine::Sglang));
    assert_eq!(
        engine_of("trtllm_kv_cache_utilization"),
        Some(Engine::TrtllmServe)
    );
    assert_eq!(
        engine_of("nv_trt_llm_request_metrics"),
        Some(Engine::TritonTrtllm)
    );
    assert_eq!(engine_of("nv_inference_count"), Some(Engine::TritonTrtllm));
    assert_eq!(engine_of("tgi_queue_size"), Some(Engine::Tgi));
    assert_eq!(
        engine_of("llamacpp:requests_deferred"),
        Some(Engine::LlamaCpp)
    );
    assert_eq!(engine_of("process_cpu_seconds_total"), None);
    assert_eq!(engine_of(""), None);

    // A generic exporter: no engine.
    let e = norm(
        "process_cpu_seconds_total 1\npython_gc_objects_collected_total{generation=\"0\"} 2\n",
    )
    .expect_err("none");
    assert!(
        matches!(e, NormaliseError::UnknownEngine { bad_lines: 0, .. }),
        "{e:?}"
    );
    // Not metrics at all (an HTML error page): refused, and the bad line is named.
    let e = norm("<html><body>502 Bad Gateway</body></html>\n").expect_err("html");
    assert!(e.to_string().contains("line 1"), "{e}");
    assert_eq!(
        norm("").map(|_| ()),
        Err(NormaliseError::UnknownEngine {
            bad_lines: 0,
            first_bad: None
        })
    );
    // Mostly vLLM names with a stray prefix elsewhere: the majority decides.
    let m = norm("tgi_queue_size 1\nvllm:num_requests_waiting 2\nvllm:num_requests_running 1\n")
        .expect("ok");
    assert_eq!(m.engine, Engine::Vllm);
}

const ALPHABET: &[u8] = b"abcvlm_:{}=\",. \t\n#-+e0123456789\\InfNa";

/// Seeded fuzz: random bytes and mutations of real lines never panic; reading is total.
#[test]
fn seeded_fuzz_never_panics_and_keeps_valid_lines() {
    let seeds = [
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0",
        "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 1.7e9",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        "sglang:token_usage{model_name=\"x\"} 0.28",
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"t\",version=\"1\"} 0.4875",
        "m{a=\"x\\\"}y\"} 1 1700000000000",
    ];
    let mut rng = StdRng::seed_from_u64(0x5eed_cafe);
    for round in 0..20_000 {
        let mut bytes: Vec<u8> = if round % 3 == 0 {
            (0..rng.random_range(0..120))
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
                .collect()
        } else {
            let mut b = seeds[rng.random_range(0..seeds.len())].as_bytes().to_vec();
            for _ in 0..rng.random_range(1..6) {
                let len = b.len();
                match rng.random_range(0..4) {
                    0 if len > 0 => {
                        b.remove(rng.random_range(0..len));
                    }
                    1 => b.insert(
                        rng.random_range(0..=len),
                        ALPHABET[rng.random_range(0..ALPHABET.len())],
                    ),
                    2 if len > 0 => b[rng.random_range(0..len)] = rng.random(),
                    _ => b.truncate(rng.random_range(0..=len)),
                }
            }
            b
        };
        if round % 7 == 0 {
            bytes.extend_from_slice(b"\nvllm:num_requests_running 4\n");
        }
        let text = String::from_utf8_lossy(&bytes);
        let (samples, errors) = parse_all(&text);
        for e in &errors {
            assert!(e.line >= 1 && e.line <= text.split('\n').count());
        }
        for s in &samples {
            // Every label of an accepted sample can be read back.
            for (k, _) in s.labels() {
                assert!(!k.is_empty());
            }
        }
        let r = normalise(
            &text,
            Options {
                engine: None,
                detailed: round % 2 == 0,
            },
        );
        if round % 7 == 0 {
            // The valid line appended at the end is always read, whatever came before.
            let m = r.expect("a valid vLLM line was appended");
            assert!(m.running >= 4, "round {round}: {:?}", text);
        }
    }
}

#[test]
fn fuzzed_numbers_round_trip() {
    let mut rng = StdRng::seed_from_u64(42);
    for _ in 0..5_000 {
        let v: f64 = rng.random_range(-1e12..1e12);
        let line = format!("x{{a=\"b\"}} {v:e}");
        match parse_line(&line, 1, |_| true) {
            Ok(Line::Sample(s)) => assert_eq!(s.value, v),
            other => panic!("{line}: {other:?}"),
        }
    }
}
