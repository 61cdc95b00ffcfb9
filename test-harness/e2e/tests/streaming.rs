//! Server-sent-event streams pass through the filter unchanged, and their in-flight count is
//! released when the stream ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use std::time::Duration;
use testkit::EchoConfig;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_responses_pass_through_unchanged() {
    let cfg = EchoConfig {
        sse_events: 5,
        sse_interval: Duration::from_millis(20),
        ..EchoConfig::default()
    };
    let a = TestPool::start("llama", "llama-model", 2, cfg).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 3, 0.5)],
        )]),
    )
    .await;
    let body = json!({"model": "llama-model", "stream": true, "messages": [{"role": "user", "content": "stream please"}]});
    let direct = testkit::post_json(a.pods[0].addr(), "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    let via = testkit::post_json(envoy.listen_addr, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert_eq!(via.status, 200);
    assert_eq!(via.header("content-type"), Some("text/event-stream"));
    assert_eq!(backend(&via), a.addr(0));
    assert_eq!(via.sse_data(), direct.sse_data());
    assert_eq!(via.sse_data().last().map(String::as_str), Some("[DONE]"));
    assert!(
        via.chunks.len() > 1,
        "the stream arrived in one piece: it was buffered"
    );
    // The stream is over: nothing is left in flight.
    assert_eq!(wait_in_flight(&envoy, 0).await, 0);
}
