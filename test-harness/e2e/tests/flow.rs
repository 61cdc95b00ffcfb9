//! Flow control in a real Envoy with the filter's defaults: a burst at a pod that can take one
//! more request waits in the proxy and drains as responses free the pod, one at a time, every
//! request served; a request held on one Envoy worker goes as soon as the other worker's
//! traffic frees the pod; a client that hangs up while waiting is never sent upstream, leaves
//! no count behind, and the queue goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use std::time::Duration;
use testkit::EchoConfig;
use tokio::io::AsyncWriteExt;
use util::*;

/// One echo pod answering after `delay`, behind a one-worker Envoy (one worker: "one at a
/// time" is then exact), with a snapshot saying the pod has 4 requests waiting: room for one
/// more.
async fn nearly_full(delay: Duration) -> (TestPool, testkit::EnvoyProcess) {
    nearly_full_on(delay, 1, json!({})).await
}

/// [`nearly_full`] behind an Envoy of `workers` workers, with `extra` filter configuration.
async fn nearly_full_on(
    delay: Duration,
    workers: u32,
    extra: serde_json::Value,
) -> (TestPool, testkit::EnvoyProcess) {
    let config = EchoConfig {
        delay,
        ..EchoConfig::default()
    };
    let pool = TestPool::start("llama", "llama-model", 1, config).await;
    let envoy = envoy_with_workers(&[&pool], plugin_config(&[&pool], extra), workers).await;
    push_ok(
        &envoy,
        &snapshot(vec![(&pool, vec![pod(&pool.addr(0), 4, 0.1)])]),
    )
    .await;
    (pool, envoy)
}

/// Requests of one size: each is as large as the pool's mean, so the bound is exact.
fn text(i: usize) -> String {
    format!("burst request {i:02} {}", "word ".repeat(40))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_at_a_full_pod_is_held_and_drained_one_at_a_time() {
    let (pool, envoy) = nearly_full(Duration::from_millis(150)).await;
    let envoy = std::sync::Arc::new(envoy);
    let n = 6;
    let mut clients = Vec::new();
    for i in 0..n {
        let envoy = envoy.clone();
        clients.push(tokio::spawn(async move {
            chat(&envoy, "llama-model", &text(i), &[]).await
        }));
    }
    // While the burst is out, the filter never has more than one request on the pod.
    let mut max_in_flight = 0;
    let mut saw_one = false;
    for _ in 0..400 {
        let now = total_in_flight(&envoy).await;
        max_in_flight = max_in_flight.max(now);
        saw_one |= now == 1;
        if clients.iter().all(|c| c.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for c in clients {
        let r = c.await.unwrap();
        assert_eq!(r.status, 200, "{}\n{}", r.text(), envoy.log_tail(30));
        assert_eq!(backend(&r), pool.addr(0));
    }
    assert!(saw_one, "the burst was never seen on the pod");
    assert_eq!(max_in_flight, 1, "requests went to a full pod");
    assert_eq!(pool.pods[0].requests().len(), n);
    assert_eq!(wait_in_flight(&envoy, 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_held_on_one_worker_goes_when_the_other_workers_traffic_frees_the_pod() {
    // Two workers and the longest dispatch tick (1 s): a held request goes sooner only when
    // the stream that frees the pod wakes its worker — its own worker's stream, or the other
    // worker's through that worker's shared queue.
    let flow = json!({"flow": {"tick_ms": 1000}});
    let (pool, envoy) = nearly_full_on(Duration::from_millis(100), 2, flow).await;
    let envoy = std::sync::Arc::new(envoy);
    // Each pair on new connections, which the kernel spreads over Envoy's two workers. Woken,
    // a held request takes the first one's rest and its own 100 ms; at its worker's tick, up
    // to a second more.
    let mut held_pairs = 0;
    for i in 0..16 {
        let first = {
            let envoy = envoy.clone();
            tokio::spawn(async move { chat(&envoy, "llama-model", &text(2 * i), &[]).await })
        };
        assert_eq!(wait_in_flight(&envoy, 1).await, 1);
        let before = dispatched(&envoy);
        let started = std::time::Instant::now();
        let second = chat(&envoy, "llama-model", &text(2 * i + 1), &[]).await;
        let took = started.elapsed();
        assert_eq!(
            second.status,
            200,
            "{}\n{}",
            second.text(),
            envoy.log_tail(30)
        );
        assert_eq!(first.await.unwrap().status, 200);
        // The first may have ended before the second arrived: then it was not held.
        if dispatched(&envoy) > before {
            held_pairs += 1;
            assert!(
                took < Duration::from_millis(600),
                "pair {i}: the held request took {took:?}: its worker was not woken"
            );
        }
        assert_eq!(wait_in_flight(&envoy, 0).await, 0);
    }
    // In 12 or more held pairs, both requests share a worker every time with odds below 1 in
    // 4,000: the other worker's wake-up was exercised.
    assert!(held_pairs >= 12, "only {held_pairs} of 16 pairs were held");
    assert_eq!(pool.pods[0].requests().len(), 32);
}

/// Held requests the filter has dispatched so far (every pool and band).
fn dispatched(envoy: &testkit::EnvoyProcess) -> u64 {
    envoy
        .filter_stat_sum("llm_router_flow_requests_total", "outcome", "dispatched")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_while_waiting_is_never_sent_upstream() {
    let (pool, envoy) = nearly_full(Duration::from_millis(600)).await;
    let envoy = std::sync::Arc::new(envoy);
    let first = {
        let envoy = envoy.clone();
        tokio::spawn(async move { chat(&envoy, "llama-model", &text(0), &[]).await })
    };
    assert_eq!(wait_in_flight(&envoy, 1).await, 1);
    // A second request waits; its client hangs up before the pod frees.
    let body = json!({"model": "llama-model", "messages": [{"role": "user", "content": text(1)}]})
        .to_string();
    let mut s = tokio::net::TcpStream::connect(envoy.listen_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway.local\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(s);
    let r = first.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The queue goes on: a later request is served, and the one that hung up never was.
    let later = chat(&envoy, "llama-model", &text(2), &[]).await;
    assert_eq!(
        later.status,
        200,
        "{}\n{}",
        later.text(),
        envoy.log_tail(30)
    );
    let seen: Vec<String> = pool.pods[0]
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|b| !b.contains("request 01")), "{seen:?}");
    assert_eq!(wait_in_flight(&envoy, 0).await, 0);
}
