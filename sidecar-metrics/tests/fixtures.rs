//! Every real `/metrics` sample in `test-harness/fixtures/metrics/` parses, and normalises to
//! exactly the values written in it (or to the precise error when the text has no load gauge).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use llm_router_snapshot::{Engine, LoraState};
use sidecar_metrics::engines::{normalise, NormaliseError, Options, PodMetrics};
use sidecar_metrics::prom::{parse_all, LineError};

fn read(name: &str) -> String {
    let p = common::metrics_fixtures_dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn detailed(name: &str) -> Result<PodMetrics, NormaliseError> {
    normalise(
        &read(name),
        Options {
            engine: None,
            detailed: true,
        },
    )
}

/// The fast path (what the scrape loop runs) must agree with the detailed one on the figures.
fn fast_agrees(name: &str) {
    let text = read(name);
    let slow = normalise(
        &text,
        Options {
            engine: None,
            detailed: true,
        },
    );
    let fast = normalise(
        &text,
        Options {
            engine: None,
            detailed: false,
        },
    );
    match (slow, fast) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (
                    a.engine,
                    a.waiting,
                    a.running,
                    a.kv_usage,
                    a.block_size,
                    a.num_blocks,
                    &a.lora
                ),
                (
                    b.engine,
                    b.waiting,
                    b.running,
                    b.kv_usage,
                    b.block_size,
                    b.num_blocks,
                    &b.lora
                ),
                "{name}"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name}"),
        (a, b) => panic!("{name}: detailed {a:?} vs fast {b:?}"),
    }
}

#[test]
fn every_fixture_is_covered_by_a_test() {
    let mut names: Vec<String> = std::fs::read_dir(common::metrics_fixtures_dir())
        .expect("read fixtures")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".prom"))
        .collect();
    names.sort();
    let covered = [
        "llamacpp-ik_llama-pr695-comment-partial.prom",
        "llamacpp-server-0c1e570-local-busy.prom",
        "llamacpp-server-0c1e570-local-idle.prom",
        "sglang-0.4.4-pr4444-partial.prom",
        "sglang-docs-production-metrics.prom",
        "triton-core-nv_inference-readme.prom",
        "triton-trtllm-backend-readme-inflight-batcher.prom",
        "triton-trtllm-backend-readme-v1-model.prom",
        "trtllm-dynamo-docs-illustrative.prom",
        "vllm-0.32-cpu-local-lora-slot-wait.prom",
        "vllm-design-doc-example-with-ellipsis.prom",
        "vllm-v0.2-aioprometheus-vllm-windows.prom",
        "vllm-v0.7-aibrix-runtime-doc.prom",
        "vllm-v1-grep-head40-llama-vllm-single.prom",
    ];
    assert_eq!(
        names, covered,
        "a fixture was added or removed: add its test"
    );
    for n in covered {
        fast_agrees(n);
    }
}

/// Sample count and bad lines of the raw parse, per fixture.
#[test]
fn raw_parse_of_every_fixture() {
    let expect: [(&str, usize, &[usize]); 14] = [
        ("llamacpp-ik_llama-pr695-comment-partial.prom", 4, &[]),
        ("llamacpp-server-0c1e570-local-busy.prom", 15, &[]),
        ("llamacpp-server-0c1e570-local-idle.prom", 15, &[]),
        ("sglang-0.4.4-pr4444-partial.prom", 4, &[]),
        ("sglang-docs-production-metrics.prom", 91, &[]),
        ("triton-core-nv_inference-readme.prom", 10, &[]),
        (
            "triton-trtllm-backend-readme-inflight-batcher.prom",
            20,
            &[],
        ),
        ("triton-trtllm-backend-readme-v1-model.prom", 3, &[]),
        ("trtllm-dynamo-docs-illustrative.prom", 15, &[]),
        (
            "vllm-design-doc-example-with-ellipsis.prom",
            14,
            &[4, 8, 14],
        ),
        ("vllm-v0.2-aioprometheus-vllm-windows.prom", 7, &[]),
        ("vllm-0.32-cpu-local-lora-slot-wait.prom", 433, &[]),
        ("vllm-v0.7-aibrix-runtime-doc.prom", 29, &[]),
        ("vllm-v1-grep-head40-llama-vllm-single.prom", 13, &[]),
    ];
    for (name, samples, bad) in expect {
        let text = read(name);
        let (s, e) = parse_all(&text);
        assert_eq!(s.len(), samples, "{name}: sample count");
        let lines: Vec<usize> = e.iter().map(|e: &LineError| e.line).collect();
        assert_eq!(lines, bad, "{name}: bad lines {e:?}");
    }
}

#[test]
fn raw_values_with_labels_and_odd_numbers() {
    let text = read("sglang-docs-production-metrics.prom");
    let (s, _) = parse_all(&text);
    let first = s.first().expect("a sample");
    assert_eq!(first.name, "sglang:prompt_tokens_total");
    assert_eq!(first.value, 8.128902e6);
    let b = s
        .iter()
        .find(|x| x.label("le").as_deref() == Some("0.07500000000000001"))
        .expect("long bucket bound");
    assert_eq!(b.name, "sglang:func_latency_seconds_bucket");
    assert_eq!(b.label("name").as_deref(), Some("generate_request"));
    assert_eq!(b.value, 14006.0);

    let text = read("vllm-v0.7-aibrix-runtime-doc.prom");
    let (s, _) = parse_all(&text);
    let cc = s
        .iter()
        .find(|x| x.name == "vllm:cache_config_info")
        .expect("cache_config_info");
    assert_eq!(cc.labels().count(), 12);
    assert_eq!(cc.label("num_gpu_blocks_override").as_deref(), Some("None"));
    let lora = s
        .iter()
        .find(|x| x.name == "vllm:lora_requests_info")
        .expect("lora");
    assert_eq!(lora.value, 1.7382173358407154e9);
    assert_eq!(lora.label("running_lora_adapters").as_deref(), Some(""));
    let hit = s
        .iter()
        .find(|x| x.name == "vllm:gpu_prefix_cache_hit_rate")
        .expect("hit rate");
    assert_eq!(hit.value, -1.0);

    let text = read("trtllm-dynamo-docs-illustrative.prom");
    let (s, _) = parse_all(&text);
    let b = s
        .iter()
        .find(|x| x.name == "trtllm_time_to_first_token_seconds_bucket")
        .expect("bucket");
    let labels: Vec<(&str, String)> = b.labels().map(|(k, v)| (k, v.into_owned())).collect();
    assert_eq!(
        labels,
        vec![
            ("le", "0.01".to_owned()),
            ("model_name", "Qwen/Qwen3-0.6B".to_owned()),
            ("engine_type", "trtllm".to_owned())
        ]
    );
}

#[test]
fn vllm_v1_new_kv_name() {
    let m = detailed("vllm-v1-grep-head40-llama-vllm-single.prom").expect("usable");
    assert_eq!(m.engine, Engine::Vllm);
    assert!(m.engine_detected);
    assert_eq!((m.waiting, m.running, m.kv_usage), (0, 0, Some(0.0)));
    assert_eq!((m.block_size, m.num_blocks), (0, 0));
    assert_eq!(m.lora, None);
    assert_eq!(m.models, vec!["llama-vllm-single"]);
    assert!(m.missing.is_empty());
    assert!(m.bad_lines.is_empty());
}

/// A real vLLM 0.32 (CPU build) with one adapter slot, scraped while two requests of `a0` ran
/// and one of `a1` waited for the slot: the newest `lora_requests_info` series names `a0` in
/// both lists (`a1` in neither; an older series from a1's earlier run names it): the batch is
/// `a0`, and nothing is reported waiting.
#[test]
fn vllm_0_32_lists_only_scheduled_adapters_in_both_labels() {
    let m = detailed("vllm-0.32-cpu-local-lora-slot-wait.prom").expect("usable");
    assert_eq!(m.engine, Engine::Vllm);
    assert_eq!((m.waiting, m.running), (1, 2));
    assert_eq!((m.block_size, m.num_blocks), (128, 4096));
    assert_eq!(
        m.lora,
        Some(LoraState {
            running: vec!["a0".into()],
            waiting: vec![],
            max_loras: 1,
        })
    );
}

#[test]
fn vllm_v0_7_old_kv_name_cache_config_and_lora() {
    let m = detailed("vllm-v0.7-aibrix-runtime-doc.prom").expect("usable");
    assert_eq!(m.engine, Engine::Vllm);
    assert_eq!((m.waiting, m.running, m.kv_usage), (0, 0, Some(0.0)));
    assert_eq!((m.block_size, m.num_blocks), (16, 81767));
    assert_eq!(
        m.lora,
        Some(LoraState {
            running: vec![],
            waiting: vec![],
            max_loras: 0
        })
    );
    assert_eq!(m.models, vec!["Qwen/Qwen2.5-Coder-1.5B-Instruct"]);
}

#[test]
fn vllm_v0_2_old_kv_without_running_sample() {
    let m = detailed("vllm-v0.2-aioprometheus-vllm-windows.prom").expect("usable");
    assert_eq!(m.engine, Engine::Vllm);
    assert_eq!(m.kv_usage, Some(0.388_494_88_f32));
    assert_eq!((m.waiting, m.running), (0, 0));
    assert_eq!(m.missing, vec!["waiting", "running"]);
    assert_eq!(m.models, vec!["/models/mistral-7b"]);
}

#[test]
fn vllm_design_doc_tolerates_ellipsis_lines() {
    let m = detailed("vllm-design-doc-example-with-ellipsis.prom").expect("usable");
    assert_eq!(m.engine, Engine::Vllm);
    assert_eq!(m.running, 8);
    assert_eq!(m.missing, vec!["waiting", "kv_usage"]);
    assert_eq!(m.kv_usage, None);
    assert_eq!(
        m.bad_lines.iter().map(|e| e.line).collect::<Vec<_>>(),
        vec![4, 8, 14]
    );
}

#[test]
fn sglang_production_and_partial() {
    let m = detailed("sglang-docs-production-metrics.prom").expect("usable");
    assert_eq!(m.engine, Engine::Sglang);
    assert_eq!((m.waiting, m.running, m.kv_usage), (2826, 162, Some(0.28)));
    assert_eq!(m.lora, None);
    assert_eq!(m.models, vec!["meta-llama/Llama-3.1-8B-Instruct"]);

    let m = detailed("sglang-0.4.4-pr4444-partial.prom").expect("usable");
    assert_eq!(m.engine, Engine::Sglang);
    assert_eq!((m.waiting, m.running, m.kv_usage), (0, 0, Some(0.0)));
    assert_eq!(m.missing, vec!["waiting"]);
}

#[test]
fn triton_inflight_batcher() {
    let m = detailed("triton-trtllm-backend-readme-inflight-batcher.prom").expect("usable");
    assert_eq!(m.engine, Engine::TritonTrtllm);
    assert_eq!((m.waiting, m.running, m.kv_usage), (1, 1, Some(0.4875)));
    assert_eq!((m.block_size, m.num_blocks), (64, 6239));
    assert_eq!(m.models, vec!["tensorrt_llm"]);
}

#[test]
fn triton_core_uses_pending_count() {
    let m = detailed("triton-core-nv_inference-readme.prom").expect("usable");
    assert_eq!(m.engine, Engine::TritonTrtllm);
    assert_eq!((m.waiting, m.running, m.kv_usage), (0, 0, None));
    assert_eq!(m.missing, vec!["running", "kv_usage"]);
}

#[test]
fn texts_without_load_gauges_are_refused_with_the_names_expected() {
    match detailed("triton-trtllm-backend-readme-v1-model.prom") {
        Err(NormaliseError::NoLoadGauges {
            engine: "triton", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let e = detailed("trtllm-dynamo-docs-illustrative.prom").expect_err("no gauges");
    assert!(
        matches!(
            e,
            NormaliseError::NoLoadGauges {
                engine: "trtllm",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("trtllm_num_requests_waiting"), "{e}");
    let e = detailed("llamacpp-ik_llama-pr695-comment-partial.prom").expect_err("no gauges");
    assert!(
        matches!(
            e,
            NormaliseError::NoLoadGauges {
                engine: "llamacpp",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn llamacpp_busy_and_idle() {
    let m = detailed("llamacpp-server-0c1e570-local-busy.prom").expect("usable");
    assert_eq!(m.engine, Engine::LlamaCpp);
    assert_eq!((m.waiting, m.running, m.kv_usage), (2, 1, None));
    assert_eq!(m.missing, vec!["kv_usage"]);
    let m = detailed("llamacpp-server-0c1e570-local-idle.prom").expect("usable");
    assert_eq!((m.engine, m.waiting, m.running), (Engine::LlamaCpp, 0, 0));
}

#[test]
fn configured_engine_overrides_detection() {
    let text = read("sglang-docs-production-metrics.prom");
    let m = normalise(
        &text,
        Options {
            engine: Some(Engine::Sglang),
            detailed: false,
        },
    )
    .expect("ok");
    assert!(!m.engine_detected);
    // Configured as vLLM, an SGLang text has none of vLLM's gauges.
    let e = normalise(
        &text,
        Options {
            engine: Some(Engine::Vllm),
            detailed: false,
        },
    )
    .expect_err("wrong engine");
    assert!(matches!(
        e,
        NormaliseError::NoLoadGauges { engine: "vllm", .. }
    ));
}
