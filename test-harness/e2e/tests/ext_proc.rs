//! The endpoint-picker architecture's floor, end to end: a real Envoy with an
//! `envoy.filters.http.ext_proc` filter (request headers sent, body `BUFFERED`, responses
//! skipped, `failure_mode_allow: false`; [`testkit::EnvoySpec::ext_proc`]) talking gRPC to the
//! real `extproc-noop` binary, in front of an echo backend. The overhead bench's
//! `envoy_ext_proc` arm is this setup.
//!
//! - Every request goes through the processor: its stream, header and body counts go up by one
//!   per request, it receives the whole body in one message, and the backend gets the body
//!   unchanged.
//! - With the processor gone, requests fail (fail closed) instead of bypassing it.
//!
//! Needs Envoy and `extproc-noop` (`./build.sh`): skipped with a message when missing, failed
//! when `CI` is set.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use testkit::{EchoBackend, EnvoySpec, HttpResponse, Router};

/// Status and the start of the body, for assertion messages.
fn brief(r: &HttpResponse) -> String {
    let body = String::from_utf8_lossy(&r.body[..r.body.len().min(200)]).into_owned();
    format!("status {}: {body}", r.status)
}

fn ready(test: &str) -> bool {
    testkit::prerequisites_ready(
        test,
        [
            testkit::envoy_binary().err().map(|e| e.to_string()),
            testkit::bin("extproc-noop").err().map(|e| e.to_string()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pass_through_the_ext_proc_server_and_fail_without_it() {
    if !ready("ext_proc") {
        return;
    }
    let backend = EchoBackend::start().await.unwrap();
    let mut picker = testkit::start_extproc_noop().await.unwrap();
    let mut spec = EnvoySpec::new(Router::RoundRobin)
        .pool("p", "pool_p", vec![backend.addr()])
        .ext_proc(picker.addr);
    spec.name = "e2e-ext-proc".into();
    let envoy = spec.start().await.unwrap();

    let before = testkit::extproc_stats(picker.addr).unwrap();
    assert_eq!(before["streams"], 0, "{before}");
    let prompt = "x".repeat(20_000);
    let body = json!({"model": "p", "messages": [{"role": "user", "content": prompt}]});
    let sent = body.to_string();
    const N: u64 = 5;
    for _ in 0..N {
        let r = testkit::post_json(envoy.listen_addr, "/v1/chat/completions", &[], &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", brief(&r));
    }
    let after = testkit::extproc_stats(picker.addr).unwrap();
    assert_eq!(after["streams"], N, "{after}");
    assert_eq!(after["request_headers"], N, "{after}");
    // BUFFERED: the whole body in one message per request; nothing of the responses.
    assert_eq!(after["request_body"], N, "{after}");
    assert_eq!(after["body_bytes"], N * sent.len() as u64, "{after}");
    assert_eq!(after["response_headers"], 0, "{after}");
    assert_eq!(after["response_body"], 0, "{after}");
    let seen = backend.requests();
    assert_eq!(seen.len() as u64, N);
    assert!(seen.iter().all(|r| r.body == sent.as_bytes()));

    // The processor gone: fail closed, the backend sees nothing more.
    picker.guard.stop();
    let r = testkit::post_json(envoy.listen_addr, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert!(r.status >= 500, "without the processor: {}", brief(&r));
    assert_eq!(backend.request_count(), N);
}
