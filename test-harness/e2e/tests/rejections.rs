//! Every rejection a client can get from the filter in a real Envoy, with its status,
//! OpenAI-style body and headers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use testkit::{EchoConfig, HttpResponse};
use util::*;

fn assert_error(r: &HttpResponse, status: u16, code: &str, reason: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-llm-router-dropped-reason"), Some(reason));
    let v = r.json().unwrap();
    assert_eq!(v["error"]["code"], json!(code), "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(v["error"]["type"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_error_status_has_its_body_and_headers() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let envoy = envoy(
        &[&a],
        // Priority headers count only when trusted (as behind a filter that sets them).
        plugin_config(
            &[&a],
            // Placed or shed at once (the held path: flow.rs).
            json!({"max_body_bytes": 4096, "retry_after_s": 3, "priority": {"trust_headers": true},
                   "flow": {"enabled": false}}),
        ),
    )
    .await;
    let addr = envoy.listen_addr;
    let chat_path = "/v1/chat/completions";

    // 400: malformed JSON, missing model, wrong types.
    let r = testkit::request(
        "POST",
        addr,
        chat_path,
        &[("content-type", "application/json")],
        "{\"model\": ",
    )
    .await
    .unwrap();
    assert_error(&r, 400, "invalid_json", "rejected-invalid-request");
    assert!(r.json().unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("line 1"));
    let r = testkit::post_json(addr, chat_path, &[], &json!({"messages": []}))
        .await
        .unwrap();
    assert_error(&r, 400, "invalid_model", "rejected-invalid-request");
    let r = testkit::post_json(
        addr,
        chat_path,
        &[],
        &json!({"model": "llama-model", "stream": "yes"}),
    )
    .await
    .unwrap();
    assert_error(&r, 400, "invalid_json", "rejected-invalid-request");

    // 404: unknown model.
    let r = chat(&envoy, "gpt-9", "hi", &[]).await;
    assert_error(&r, 404, "model_not_found", "rejected-unknown-model");
    assert!(r.text().contains("gpt-9"));

    // 413: a body over the limit, declared or streamed.
    let big = "x".repeat(10_000);
    let r = chat(&envoy, "llama-model", &big, &[]).await;
    assert_error(&r, 413, "request_too_large", "rejected-too-large");

    // 429: every pod saturated; sheddable requests go first, with Retry-After.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 7, 0.85), pod(&a.addr(1), 6, 0.9)],
        )]),
    )
    .await;
    let r = chat(
        &envoy,
        "llama-model",
        "low priority",
        &[("x-llm-router-priority", "-1")],
    )
    .await;
    assert_error(&r, 429, "pool_saturated", "rejected-saturated");
    assert_eq!(r.header("retry-after"), Some("3"));
    // A standard request is still served at this level.
    let r = chat(&envoy, "llama-model", "normal", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Far past saturation, standard requests are shed too; critical ones never.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 80, 0.99), pod(&a.addr(1), 90, 0.99)],
        )]),
    )
    .await;
    let r = chat(&envoy, "llama-model", "normal", &[]).await;
    assert_error(&r, 429, "pool_saturated", "rejected-saturated");
    let r = chat(
        &envoy,
        "llama-model",
        "vip",
        &[("x-llm-router-priority", "5")],
    )
    .await;
    assert_eq!(r.status, 200);

    // 503: the pool has no usable pod.
    let mut snap = snapshot(vec![(
        &a,
        vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 0, 0.1)],
    )]);
    for p in &mut snap.pools[0].pods {
        p.health = llm_router_snapshot::Health::Failing;
        p.failures = 5;
    }
    push_ok(&envoy, &snap).await;
    let r = chat(&envoy, "llama-model", "anyone?", &[]).await;
    assert_error(&r, 503, "no_endpoints", "rejected-no-endpoints");
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_answers_503_before_any_snapshot() {
    let a = TestPool::start("llama", "llama-model", 1, EchoConfig::default()).await;
    let envoy = envoy(
        &[&a],
        plugin_config(
            &[&a],
            json!({"snapshot": {"secret": SECRET, "on_missing": "reject"}}),
        ),
    )
    .await;
    let r = chat(&envoy, "llama-model", "hi", &[]).await;
    assert_error(&r, 503, "no_endpoints", "rejected-no-endpoints");
    push_ok(&envoy, &snapshot(vec![(&a, vec![pod(&a.addr(0), 0, 0.1)])])).await;
    assert_eq!(chat(&envoy, "llama-model", "hi", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_plugin_configuration_fails_at_load_with_a_clear_log_line() {
    let a = TestPool::start("llama", "llama-model", 1, EchoConfig::default()).await;
    let mut spec = testkit::EnvoySpec::new(testkit::Router::Filter)
        .pool("llama", a.cluster, a.addrs())
        .plugin_config(json!({"pools": [{"name": "llama", "cluster": a.cluster, "models": ["m"], "preset": "warp-speed"}]}));
    spec.wasm_path = Some(testkit::filter_wasm().unwrap());
    spec.ready_timeout = std::time::Duration::from_secs(15);
    let err = match spec.start().await {
        Ok(_) => panic!("Envoy started with a bad filter configuration"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("pools[0].preset"),
        "the log should name the field: {err}"
    );
}
