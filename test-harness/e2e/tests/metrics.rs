//! The filter's metrics in a real Envoy, read from `/stats/prometheus` with a real Prometheus
//! text parser: a scripted run — 7 requests routed to one model-sim pod (chat JSON and SSE with
//! and without `include_usage`, `/v1/messages` streamed, `/v1/responses`), 3 shed, 2 unknown
//! models — leaves exactly those counts, labelled as the README says, and token counters equal
//! to the `usage` the emulator sent the clients.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::PrometheusValue;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testkit::{EnvoyProcess, EnvoySpec, HttpResponse, Router};
use util::*;

const MODEL: &str = "llama-model";

/// Parsed metrics: (family name, sorted labels) → value; a histogram gives its `_count`.
type Metrics = BTreeMap<(String, Vec<(String, String)>), f64>;

fn prometheus(envoy: &EnvoyProcess) -> Metrics {
    let (status, text) = envoy.admin_get("/stats/prometheus").unwrap();
    assert_eq!(status, 200, "{text}");
    let expo = parse_prometheus(&text)
        .unwrap_or_else(|e| panic!("/stats/prometheus does not parse: {e:?}\n{text}"));
    let mut out = Metrics::new();
    for (name, fam) in &expo.families {
        for s in fam.iter_samples() {
            let mut labels: Vec<(String, String)> = s
                .get_labelset()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            labels.sort();
            let v = match &s.value {
                PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                PrometheusValue::Counter(c) => c.value.as_f64(),
                PrometheusValue::Histogram(h) => h.count.map(|c| c as f64).unwrap_or(f64::NAN),
                PrometheusValue::Summary(_) => f64::NAN,
            };
            // The parser may drop a counter's `_total`; keep the exposed name.
            let name = match &s.value {
                PrometheusValue::Counter(_) if !name.ends_with("_total") => format!("{name}_total"),
                _ => name.clone(),
            };
            out.insert((name, labels), v);
        }
    }
    out
}

/// Every series of `name`: sorted labels → value.
fn series(m: &Metrics, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    m.iter()
        .filter(|((n, _), _)| n == name)
        .map(|((_, l), v)| (l.clone(), *v))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn value(m: &Metrics, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
    m.get(&(name.to_string(), labels(pairs))).copied()
}

/// The last non-null `usage` of a JSON or SSE body as the client got it: (prompt, completion).
fn client_usage(r: &HttpResponse) -> (u64, u64) {
    let docs: Vec<Value> = if r
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"))
    {
        r.sse_data()
            .iter()
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    } else {
        vec![r.json().unwrap()]
    };
    let (mut prompt, mut completion) = (0, 0);
    for d in docs {
        // Anthropic puts the first usage inside `message`; the Responses API inside `response`.
        for u in [&d["usage"], &d["message"]["usage"], &d["response"]["usage"]] {
            if let Some(p) = u["prompt_tokens"].as_u64().or(u["input_tokens"].as_u64()) {
                prompt = p;
            }
            if let Some(c) = u["completion_tokens"]
                .as_u64()
                .or(u["output_tokens"].as_u64())
            {
                completion = c;
            }
        }
    }
    (prompt, completion)
}

async fn post(envoy: &EnvoyProcess, path: &str, body: Value) -> HttpResponse {
    testkit::post_json(envoy.listen_addr, path, &[], &body)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_leaves_exactly_its_counts_in_stats_prometheus() {
    let args = [
        "--profile",
        "h100",
        "--speedup",
        "20",
        "--model",
        MODEL,
        "--default-max-tokens",
        "6",
    ];
    let a = testkit::start_model_sim(&args).await.unwrap();
    let b = testkit::start_model_sim(&args).await.unwrap();
    let (pod_a, pod_b) = (a.addr.to_string(), b.addr.to_string());
    let pool = TestPool {
        name: "llama",
        cluster: "pool_llama",
        model: MODEL,
        pods: Vec::new(),
    };
    let mut spec = EnvoySpec::new(Router::Filter)
        .concurrency(2)
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": [MODEL]}],
            "snapshot": {"secret": SECRET},
            // Which pod served is read from the served-pod header below (off by default).
            "disclose": {"served_pod": true},
        }))
        .pool("llama", "pool_llama", vec![a.addr, b.addr]);
    spec.wasm_path = Some(testkit::filter_wasm().unwrap_or_else(|e| panic!("{e}")));
    let envoy = spec.start().await.unwrap_or_else(|e| panic!("{e}"));

    // Pod A idle, pod B busy (below saturation): every request goes to A.
    let first = snapshot(vec![(
        &pool,
        vec![pod(&pod_a, 0, 0.05), pod(&pod_b, 4, 0.7)],
    )]);
    push_ok(&envoy, &first).await;
    let chat = |text: &str| json!({"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": text}]});
    let mut routed = Vec::new();
    for i in 0..2 {
        routed.push(post(&envoy, "/v1/chat/completions", chat(&format!("json {i}"))).await);
    }
    for i in 0..2 {
        let mut body = chat(&format!("stream with usage {i}"));
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        routed.push(post(&envoy, "/v1/chat/completions", body).await);
    }
    let mut no_usage = chat("stream without usage");
    no_usage["stream"] = json!(true);
    let silent = post(&envoy, "/v1/chat/completions", no_usage).await;
    routed.push(
        post(
            &envoy,
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 6, "stream": true,
                   "messages": [{"role": "user", "content": "anthropic style"}]}),
        )
        .await,
    );
    routed.push(
        post(
            &envoy,
            "/v1/responses",
            json!({"model": MODEL, "max_output_tokens": 6, "input": "responses api"}),
        )
        .await,
    );
    let mut expected = (0, 0);
    for r in &routed {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("x-gateway-destination-endpoint-served"),
            Some(pod_a.as_str())
        );
        let (p, c) = client_usage(r);
        assert!(p > 0 && c > 0, "no usage in {}", r.text());
        expected = (expected.0 + p, expected.1 + c);
    }
    assert_eq!(silent.status, 200);
    assert_eq!(client_usage(&silent), (0, 0), "{}", silent.text());

    // Both pods far past saturation: standard requests are shed.
    let busy = snapshot(vec![(
        &pool,
        vec![pod(&pod_a, 80, 0.99), pod(&pod_b, 90, 0.99)],
    )]);
    push_ok(&envoy, &busy).await;
    let pushed = Instant::now();
    for i in 0..3 {
        let r = post(&envoy, "/v1/chat/completions", chat(&format!("shed {i}"))).await;
        assert_eq!(r.status, 429, "{}", r.text());
    }
    for model in ["gpt-9", "claude-17"] {
        let r = post(
            &envoy,
            "/v1/chat/completions",
            json!({"model": model, "messages": []}),
        )
        .await;
        assert_eq!(r.status, 404, "{}", r.text());
    }

    // Tokens are counted when a stream ends, the gauges move at the next tick (1 s) and Envoy
    // merges its workers' histograms at its stats flush (every 5 s): wait for all, bounded.
    let deadline = Instant::now() + Duration::from_secs(15);
    let generation = busy.generation as f64;
    let m = loop {
        let m = prometheus(&envoy);
        let tokens = (
            value(
                &m,
                "llm_router_tokens_total",
                &[("pool", "llama"), ("model", MODEL), ("kind", "prompt")],
            ),
            value(
                &m,
                "llm_router_tokens_total",
                &[("pool", "llama"), ("model", MODEL), ("kind", "completion")],
            ),
        );
        let done = tokens == (Some(expected.0 as f64), Some(expected.1 as f64))
            && value(&m, "llm_router_snapshot_generation", &[]) == Some(generation)
            && value(&m, "llm_router_decision_duration_microseconds", &[]) == Some(12.0);
        if done || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let requests = series(&m, "llm_router_requests_total");
    assert_eq!(
        requests,
        {
            let mut want = vec![
                (
                    labels(&[
                        ("pool", ""),
                        ("model", ""),
                        ("target", ""),
                        ("outcome", "unknown_model"),
                    ]),
                    2.0,
                ),
                (
                    labels(&[
                        ("pool", "llama"),
                        ("model", MODEL),
                        ("target", ""),
                        ("outcome", "routed"),
                    ]),
                    7.0,
                ),
                (
                    labels(&[
                        ("pool", "llama"),
                        ("model", MODEL),
                        ("target", ""),
                        ("outcome", "shed"),
                    ]),
                    3.0,
                ),
            ];
            want.sort_by(|x, y| x.0.cmp(&y.0));
            want
        },
        "7 routed (6 with usage), 3 shed, 2 unknown models"
    );
    assert_eq!(
        series(&m, "llm_router_picks_total"),
        vec![(labels(&[("pool", "llama"), ("pod", &pod_a)]), 7.0)]
    );
    assert_eq!(
        series(&m, "llm_router_tokens_total"),
        vec![
            (
                labels(&[("pool", "llama"), ("model", MODEL), ("kind", "completion")]),
                expected.1 as f64
            ),
            (
                labels(&[("pool", "llama"), ("model", MODEL), ("kind", "prompt")]),
                expected.0 as f64
            ),
        ],
        "the emulator's usage, summed over the replies that carried one"
    );
    assert_eq!(
        value(&m, "llm_router_decision_duration_microseconds", &[]),
        Some(12.0),
        "every request that reached a decision (7 routed, 3 shed, 2 unknown) is timed"
    );
    assert_eq!(
        value(
            &m,
            "llm_router_snapshot_pushes_total",
            &[("result", "accepted")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(&m, "llm_router_snapshot_generation", &[]),
        Some(generation)
    );
    // Whole seconds since the push, as of the last tick (at most a second old).
    let age = value(&m, "llm_router_snapshot_age_seconds", &[]).unwrap();
    let since = pushed.elapsed().as_secs_f64();
    assert!(
        age <= since && age >= since - 2.0,
        "snapshot age {age} s, pushed {since:.1} s ago"
    );
    assert_eq!(
        value(
            &m,
            "llm_router_in_flight",
            &[("pool", "llama"), ("pod", &pod_a)]
        ),
        Some(0.0),
        "{:?}",
        series(&m, "llm_router_in_flight")
    );
    assert_eq!(
        value(
            &m,
            "llm_router_in_flight",
            &[("pool", "llama"), ("pod", &pod_b)]
        ),
        Some(0.0)
    );
    drop(envoy);
    drop((a, b));
}
