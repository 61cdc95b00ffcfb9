//! The real HTTP server (in-process pods on free loopback ports): OpenAI bodies streaming and
//! not, `include_usage`, `[DONE]`, the pod header, errors, admin fault modes, metrics overrides,
//! metrics that agree with the pod's state, client-disconnect aborts, SGLang and metrics-only
//! pods.

use std::time::Duration;

use model_sim::metrics::Flavor;
use model_sim::profile::Profile;
use model_sim::prompt::{count_tokens, parse, Api};
use model_sim::server::{spawn_pod, PodConfig, PodHandle};
use serde_json::Value;

mod common;
use common::{get, http, parse_metrics, series};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Prompt tokens the emulator's tokenizer and chat template give `body` (unit-tested in
/// `prompt.rs`; here only the plumbing is checked).
fn tokens(api: Api, body: &str) -> usize {
    parse(api, body.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
        .tokens
        .len()
}

async fn pod(profile: Profile, f: impl FnOnce(&mut PodConfig)) -> PodHandle {
    let mut cfg = PodConfig::new(0, profile);
    cfg.speedup = 10.0;
    f(&mut cfg);
    spawn_pod(cfg).await.unwrap_or_else(|e| panic!("{e}"))
}

fn chat(content: &str, max_tokens: u32, stream: bool, include_usage: bool, model: &str) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": include_usage}
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_chat_and_completions() {
    let p = pod(Profile::h100(), |_| {}).await;
    let addr = p.addr();
    let content = "x".repeat(95);
    let body = chat(&content, 7, false, false, MODEL);
    let n = tokens(Api::Chat, &body);
    assert!(
        (20..50).contains(&n),
        "95 characters plus the chat template: {n}"
    );
    let r = http(addr, "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-model-sim-pod"), Some(addr.to_string().as_str()));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["usage"]["prompt_tokens"], n);
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["usage"]["total_tokens"], n + 7);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("chatcmpl-")));

    let body =
        serde_json::json!({"model": MODEL, "prompt": "abcdefgh", "max_completion_tokens": 3})
            .to_string();
    let r = http(addr, "POST", "/v1/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], tokens(Api::Completions, &body));
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // Embeddings: answered at once, same token counting.
    let body = serde_json::json!({"model": MODEL, "input": ["abcd", "abcdefgh"]}).to_string();
    let r = http(addr, "POST", "/v1/embeddings", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        v["usage"]["prompt_tokens"],
        count_tokens("abcd") + count_tokens("abcdefgh")
    );
    assert!(r.header("x-model-sim-pod").is_some());
    let r = http(addr, "POST", "/v1/embeddings", Some("{}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);

    // Health, models, errors.
    let r = http(addr, "GET", "/health", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    assert!(r.header("x-model-sim-pod").is_some());
    let r = http(addr, "POST", "/v1/chat/completions", Some("{not json"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    assert_eq!(r.json()["error"]["code"], 400);
    let long = "y".repeat(8 * 140_000);
    let r = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(&long, 8, false, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("maximum context length"), "{}", r.body);
    let r = http(addr, "GET", "/nope", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 404);
    let _ = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hi", 2, false, false, "sql-lora")),
    )
    .await;
    let ids = listed_models(addr).await;
    assert_eq!(ids, vec![MODEL.to_string(), "sql-lora".to_string()]);
}

/// The model ids a pod's `/v1/models` lists, in its order.
async fn listed_models(addr: std::net::SocketAddr) -> Vec<String> {
    let r = http(addr, "GET", "/v1/models", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    r.json()["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// As vLLM with `--lora-modules`: every registered adapter is listed before any request used it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_adapters_are_listed_before_first_use() {
    let p = pod(Profile::a10g(), |c| {
        c.lora_modules = Some(vec!["adapter-01".into(), "adapter-00".into()]);
    })
    .await;
    let ids = listed_models(p.addr()).await;
    assert_eq!(
        ids,
        vec![MODEL.to_string(), "adapter-00".into(), "adapter-01".into()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_chunks_usage_and_done() {
    let p = pod(Profile::a10g(), |_| {}).await;
    let addr = p.addr();
    let body = chat("hello world", 5, true, true, MODEL);
    let r = http(addr, "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    assert!(r.complete);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or(Value::Null))
        .collect();
    // role chunk + 5 token chunks + usage chunk
    assert_eq!(chunks.len(), 7, "{data:?}");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let id = chunks[0]["id"].clone();
    assert!(chunks.iter().all(|c| c["id"] == id));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for c in &chunks[1..5] {
        assert!(c["choices"][0]["finish_reason"].is_null());
        assert!(c["choices"][0]["delta"]["content"].is_string());
    }
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    let usage = &chunks[6];
    assert_eq!(usage["choices"].as_array().map(Vec::len), Some(0));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens"], tokens(Api::Chat, &body));

    // Without include_usage: no usage chunk.
    let r = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello world", 3, true, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let data = r.sse_data();
    assert_eq!(data.len(), 1 + 3 + 1);
    assert!(!r.body.contains("\"usage\""));

    // Legacy completions stream.
    let body = serde_json::json!({"prompt": "abc", "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}).to_string();
    let r = http(addr, "POST", "/v1/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let data = r.sse_data();
    assert_eq!(data.len(), 2 + 1 + 1);
    let first: Value = serde_json::from_str(&data[0]).unwrap_or(Value::Null);
    assert_eq!(first["object"], "text_completion");
    assert!(first["choices"][0]["text"].is_string());
    assert_eq!(data[3], "[DONE]");
}

async fn set_fault(addr: std::net::SocketAddr, mode: &str) {
    let r = http(
        addr,
        "POST",
        "/admin/fault",
        Some(&format!("{{\"mode\":\"{mode}\"}}")),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_modes() {
    let p = pod(Profile::h100(), |_| {}).await;
    let addr = p.addr();
    let req = chat("hello", 20, true, true, MODEL);

    set_fault(addr, "error500").await;
    let r = http(addr, "POST", "/v1/chat/completions", Some(&req))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 500);
    assert!(r.header("x-model-sim-pod").is_some());

    set_fault(addr, "error429").await;
    let r = http(addr, "POST", "/v1/completions", Some("{\"prompt\":\"a\"}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));

    set_fault(addr, "error503").await;
    let r = http(addr, "POST", "/v1/chat/completions", Some(&req))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 503);
    assert!(r.body.contains("error503"), "{}", r.body);

    set_fault(addr, "close_mid_stream").await;
    let r = http(addr, "POST", "/v1/chat/completions", Some(&req))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    assert!(!r.complete, "stream must be cut");
    assert!(!r.body.contains("[DONE]"));
    assert!(
        r.body.contains("chat.completion.chunk"),
        "some tokens first: {}",
        r.body
    );
    let r = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello", 20, false, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!r.complete, "non-streaming body must be cut too");

    set_fault(addr, "no_metrics").await;
    let r = http(addr, "GET", "/metrics", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 503);
    let r = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello", 2, false, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "inference still works without metrics");

    set_fault(addr, "hang").await;
    let hung = tokio::time::timeout(
        Duration::from_millis(500),
        http(addr, "POST", "/v1/chat/completions", Some(&req)),
    )
    .await;
    assert!(hung.is_err(), "hang must not answer");

    set_fault(addr, "none").await;
    let r = http(addr, "POST", "/v1/chat/completions", Some(&req))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.complete && r.body.ends_with("data: [DONE]\n\n"));
    let r = http(addr, "POST", "/admin/fault", Some("{\"mode\":\"explode\"}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);

    set_fault(addr, "die").await;
    p.stopped().await;
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "a dead pod refuses connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_override_and_agreement_with_state() {
    let p = pod(Profile::h100(), |c| c.max_loras = 2).await;
    let addr = p.addr();
    for i in 0..3 {
        let r = http(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat(&"z".repeat(60 + i), 4, i == 1, false, MODEL)),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200);
    }
    let _ = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("q", 2, false, false, "sql-lora")),
    )
    .await;
    let text = http(addr, "GET", "/metrics", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .body;
    let m = parse_metrics(&text);
    let st = http(addr, "GET", "/admin/state", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json();
    // Every /metrics request is counted (the scrape load on the pod): this test made one.
    assert_eq!(st["metrics_requests"], 1, "{st}");
    let model = [("model_name", MODEL)];
    let g = |n: &str| get(&m, n, &model).unwrap_or_else(|| panic!("missing {n}"));
    assert_eq!(g("vllm:generation_tokens_total"), 3.0 * 4.0 + 2.0);
    assert_eq!(
        Some(g("vllm:generation_tokens_total")),
        st["generation_tokens"].as_f64()
    );
    assert_eq!(
        Some(g("vllm:prompt_tokens_total")),
        st["prompt_tokens"].as_f64()
    );
    assert_eq!(
        get(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "length")]
        ),
        Some(4.0)
    );
    assert_eq!(g("vllm:time_to_first_token_seconds"), 4.0);
    assert_eq!(g("vllm:num_requests_running"), 0.0);
    assert_eq!(g("vllm:kv_cache_usage_perc"), 0.0);
    assert!(
        get(&m, "vllm:gpu_cache_usage_perc", &[]).is_none(),
        "old name only behind the switch"
    );

    // Override, then clear.
    let body = r#"{"waiting": 7, "running": 3, "kv_usage": 0.5, "running_adapters": ["a","b"], "waiting_adapters": "c"}"#;
    let r = http(addr, "POST", "/admin/metrics_override", Some(body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    let m = parse_metrics(
        &http(addr, "GET", "/metrics", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .body,
    );
    assert_eq!(get(&m, "vllm:num_requests_waiting", &[]), Some(7.0));
    assert_eq!(get(&m, "vllm:num_requests_running", &[]), Some(3.0));
    assert_eq!(get(&m, "vllm:kv_cache_usage_perc", &[]), Some(0.5));
    let lora = series(&m, "vllm:lora_requests_info");
    let newest = lora
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|x| x.0.clone())
        .unwrap_or_default();
    assert_eq!(common::label(&newest, "running_lora_adapters"), Some("a,b"));
    assert_eq!(common::label(&newest, "waiting_lora_adapters"), Some("c"));
    assert_eq!(common::label(&newest, "max_lora"), Some("2"));
    assert!(
        lora.iter().all(|x| x.1 > 1.0e9),
        "values are unix timestamps"
    );

    let r = http(
        addr,
        "POST",
        "/admin/metrics_override",
        Some("{\"kv_usage\": \"high\"}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
    let r = http(addr, "POST", "/admin/metrics_override", Some("{}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    let m = parse_metrics(
        &http(addr, "GET", "/metrics", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .body,
    );
    assert_eq!(get(&m, "vllm:num_requests_waiting", &[]), Some(0.0));
    assert_eq!(get(&m, "vllm:kv_cache_usage_perc", &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_the_request() {
    // Real time (speedup 1) and a long output, so the request is surely still running.
    let p = pod(Profile::a10g(), |c| c.speedup = 1.0).await;
    let addr = p.addr();
    let body = chat("hello", 2000, true, false, MODEL);
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Read until the first token arrived, so the request is surely in the running batch.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    for _ in 0..100 {
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert!(n > 0, "stream ended early");
        got.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&got).contains("data: ") {
            break;
        }
    }
    assert_eq!(p.pod().state().running, 1);
    drop(s);
    let mut running = 1;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        running = p.pod().state().running;
        if running == 0 {
            break;
        }
    }
    assert_eq!(running, 0, "the engine request must be aborted");
    let m = parse_metrics(&p.pod().metrics_text());
    assert_eq!(
        get(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "abort")]
        ),
        Some(1.0)
    );
    assert_eq!(get(&m, "vllm:kv_cache_usage_perc", &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_and_metrics_only_pods() {
    let p = pod(Profile::a10g(), |c| c.flavor = Flavor::Sglang).await;
    let _ = http(
        p.addr(),
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello", 3, false, false, MODEL)),
    )
    .await;
    let m = parse_metrics(
        &http(p.addr(), "GET", "/metrics", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .body,
    );
    assert_eq!(
        get(&m, "sglang:num_queue_reqs", &[("model_name", MODEL)]),
        Some(0.0)
    );
    assert_eq!(get(&m, "sglang:generation_tokens_total", &[]), Some(3.0));
    assert!(get(&m, "vllm:num_requests_waiting", &[]).is_none());

    let p = pod(Profile::h100(), |c| {
        c.metrics_only = true;
        c.seed = 42;
    })
    .await;
    let m = parse_metrics(
        &http(p.addr(), "GET", "/metrics", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .body,
    );
    let kv = get(&m, "vllm:kv_cache_usage_perc", &[]).unwrap_or(-1.0);
    assert!((0.0..=1.0).contains(&kv));
    assert!(get(&m, "vllm:num_requests_running", &[]).is_some_and(|r| r >= 0.0));
    assert_eq!(series(&m, "vllm:cache_config_info").len(), 1);
    let r = http(
        p.addr(),
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello", 3, true, true, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.body.ends_with("data: [DONE]\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_prompt_is_served_from_the_prefix_cache_and_uniform_lengths_stop() {
    let p = pod(Profile::h100(), |c| {
        c.output_len = model_sim::server::OutputLen::Uniform
    })
    .await;
    let addr = p.addr();
    let prompt = "You are a routing test. ".repeat(40); // 960 chars
    let first = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(&prompt, 16, false, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .json();
    let second = http(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(&prompt, 16, false, false, MODEL)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .json();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    let n = second["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(
        cached % 16 == 0 && cached + 17 >= n && cached > 0,
        "whole 16-token blocks of the repeated prompt are cached: {cached} of {n}"
    );
    let m = parse_metrics(&p.pod().metrics_text());
    assert_eq!(
        get(&m, "vllm:prefix_cache_hits_total", &[]),
        Some(cached as f64)
    );

    // --output-len uniform: lengths vary in 1..=max_tokens, shorter ones finish with "stop".
    let mut lens = std::collections::BTreeSet::new();
    let mut stops = 0;
    for i in 0..12 {
        let v = http(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat(&format!("q{i}"), 16, false, false, MODEL)),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json();
        let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        assert!((1..=16).contains(&n));
        if n < 16 {
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            stops += 1;
        }
        lens.insert(n);
    }
    assert!(lens.len() > 3 && stops > 0, "{lens:?}");
    // ignore_eos forces max_tokens.
    let body = serde_json::json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "ignore_eos": true}).to_string();
    let v = http(addr, "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 9);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// `event:` names and parsed `data:` of a named-event SSE body (Responses, Messages).
fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut kind = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(k) = line.strip_prefix("event: ") {
                    kind = k.to_string();
                }
                if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"));
                }
            }
            (kind, data)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_api_bodies_and_stream() {
    let p = pod(Profile::h100(), |_| {}).await;
    let addr = p.addr();
    let body = serde_json::json!({
        "model": MODEL, "instructions": "Answer briefly.", "max_output_tokens": 6,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "What is a KV cache?"}]}]
    })
    .to_string();
    let r = http(addr, "POST", "/v1/responses", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("x-model-sim-pod").is_some());
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("resp_")));
    assert_eq!(v["model"], MODEL);
    // max_output_tokens reached: incomplete, as OpenAI reports it.
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert!(v["output"][0]["content"][0]["text"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    let n = tokens(Api::Responses, &body);
    assert_eq!(v["usage"]["input_tokens"], n);
    assert_eq!(v["usage"]["output_tokens"], 6);
    assert_eq!(v["usage"]["total_tokens"], n + 6);

    // Streaming: the typed events in order, sequence numbers 0, 1, 2, ...
    let body = serde_json::json!({"model": MODEL, "input": "hello there", "stream": true,
                                  "max_output_tokens": 3, "ignore_eos": true})
    .to_string();
    let r = http(addr, "POST", "/v1/responses", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    assert!(r.complete);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(!r.body.contains("[DONE]"));
    let ev = named_events(&r.body);
    let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );
    for (i, (k, d)) in ev.iter().enumerate() {
        assert_eq!(d["type"], k.as_str());
        assert_eq!(d["sequence_number"], i);
    }
    let deltas: String = ev.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
    assert_eq!(ev[7].1["text"], deltas.as_str());
    assert_eq!(ev[10].1["response"]["usage"]["output_tokens"], 3);
    assert_eq!(ev[0].1["response"]["status"], "in_progress");

    let r = http(addr, "POST", "/v1/responses", Some("{\"model\": \"m\"}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_bodies_and_stream() {
    let p = pod(Profile::h100(), |c| c.max_loras = 2).await;
    let addr = p.addr();
    let body = serde_json::json!({
        "model": MODEL, "max_tokens": 5, "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "Hello!"}]
    })
    .to_string();
    let r = http(addr, "POST", "/v1/messages", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("msg_")));
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["input_tokens"], tokens(Api::Messages, &body));
    assert_eq!(v["usage"]["output_tokens"], 5);

    // Streaming with an adapter: Anthropic's event sequence.
    let body = serde_json::json!({
        "model": "sql-lora", "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Write a haiku"}]}]
    })
    .to_string();
    let r = http(addr, "POST", "/v1/messages", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let ev = named_events(&r.body);
    let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert!(ev.iter().all(|(k, d)| d["type"] == k.as_str()));
    assert_eq!(ev[0].1["message"]["model"], "sql-lora");
    assert_eq!(
        ev[0].1["message"]["usage"]["input_tokens"],
        tokens(Api::Messages, &body)
    );
    assert_eq!(ev[3].1["delta"]["type"], "text_delta");
    assert_eq!(ev[8].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(ev[8].1["usage"]["output_tokens"], 4);

    // Errors in Anthropic's shape: max_tokens is required.
    let r = http(
        addr,
        "POST",
        "/v1/messages",
        Some(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lognormal_output_lengths_end_at_eos_unless_ignore_eos() {
    let p = pod(Profile::h100(), |c| {
        c.output_len = model_sim::server::OutputLen::Lognormal;
        c.speedup = 50.0;
    })
    .await;
    let addr = p.addr();
    let mut lens = Vec::new();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..40 {
        set.spawn(async move {
            http(
                addr,
                "POST",
                "/v1/chat/completions",
                Some(&chat(&format!("question {i}"), 1000, false, false, MODEL)),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
        });
    }
    while let Some(v) = set.join_next().await {
        let v = v.unwrap_or_else(|e| panic!("{e}"));
        let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        let reason = v["choices"][0]["finish_reason"].clone();
        assert_eq!(reason, if n < 1000 { "stop" } else { "length" });
        lens.push(n);
    }
    lens.sort_unstable();
    let (median, max) = (lens[lens.len() / 2], lens[lens.len() - 1]);
    // Median 184, σ 1.27: the median of 40 lies well inside 60..500, the longest far above.
    assert!((60..500).contains(&median), "{lens:?}");
    assert!(max > 2 * median, "heavy tail: {lens:?}");
    let body = serde_json::json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 700, "ignore_eos": true}).to_string();
    let v = http(addr, "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmark_metrics_and_stats_reset() {
    let p = pod(Profile::a10g(), |_| {}).await;
    let addr = p.addr();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..6 {
        set.spawn(async move {
            http(
                addr,
                "POST",
                "/v1/chat/completions",
                Some(&chat(&"w ".repeat(2000 + i), 20, false, false, MODEL)),
            )
            .await
        });
    }
    while set.join_next().await.is_some() {}
    let model = [("model_name", MODEL)];
    let m = parse_metrics(&p.pod().metrics_text());
    let g = |m: &common::Metrics, n: &str| get(m, n, &model).unwrap_or_else(|| panic!("{n}"));
    assert!(g(&m, "model_sim:steps_total") >= 20.0);
    assert!(g(&m, "model_sim:kv_usage_perc_max") > 0.01);
    assert!(g(&m, "model_sim:kv_usage_perc_seconds_sum") > 0.0);
    assert!(g(&m, "model_sim:num_requests_waiting_max") >= 0.0);
    assert!(g(&m, "model_sim:step_lateness_seconds_sum") >= 0.0);
    assert_eq!(g(&m, "model_sim:lora_disk_loads_total"), 0.0);
    assert_eq!(g(&m, "vllm:kv_cache_usage_perc"), 0.0);
    let steps = g(&m, "model_sim:steps_total");
    let r = http(addr, "POST", "/admin/stats/reset", Some(""))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    let m = parse_metrics(&p.pod().metrics_text());
    // Peaks restart from the (idle) present; counters keep counting.
    assert_eq!(g(&m, "model_sim:kv_usage_perc_max"), 0.0);
    assert_eq!(g(&m, "model_sim:num_requests_waiting_max"), 0.0);
    assert_eq!(g(&m, "model_sim:step_lateness_seconds_max"), 0.0);
    assert_eq!(g(&m, "model_sim:steps_total"), steps);
}

/// A scheduler that cannot run on time (its thread is blocked, like a pod on an overloaded
/// machine) shows up as step lateness.
#[tokio::test(flavor = "current_thread")]
async fn blocked_scheduler_reports_step_lateness() {
    let p = pod(Profile::a10g(), |c| c.speedup = 1.0).await;
    let addr = p.addr();
    let req = tokio::spawn(async move {
        http(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat("hello", 30, false, false, MODEL)),
        )
        .await
    });
    // Let the request start, then block the only runtime thread for 300 ms mid-generation
    // (a10g steps are ~32 ms).
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::thread::sleep(Duration::from_millis(300));
    let r = req
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200);
    let m = parse_metrics(&p.pod().metrics_text());
    let late = get(&m, "model_sim:step_lateness_seconds_max", &[]).unwrap_or(0.0);
    let sum = get(&m, "model_sim:step_lateness_seconds_sum", &[]).unwrap_or(0.0);
    assert!(late > 0.2, "max lateness {late}");
    assert!(sum >= late);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_request_overhead_delays_every_answer() {
    // A profile whose steps are free and whose server work is 400 ms (at speed-up 10: 40 ms).
    let mut slow_server = Profile::h100();
    slow_server.request_overhead_s = 0.4;
    let p = pod(slow_server, |_| {}).await;
    let body = chat("hello", 1, false, false, MODEL);
    let started = std::time::Instant::now();
    let r = http(p.addr(), "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    // A lower bound only: the delay was applied (a loaded machine can only add to it).
    assert!(
        started.elapsed() >= Duration::from_millis(40),
        "{:?}",
        started.elapsed()
    );
    // The GPU profiles carry none; the CPU twins their measured one.
    assert_eq!(Profile::h100().request_overhead_s, 0.0);
    assert!(Profile::cpu_small().request_overhead_s > 0.0);
}
