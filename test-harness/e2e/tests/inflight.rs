//! In-flight counts are shared by Envoy's worker threads: a burst of slow requests between two
//! snapshots spreads over the pods instead of herding onto the one the snapshot favoured, and
//! every count is released when the requests end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;
use testkit::EchoConfig;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_spreads_over_pods_and_counts_are_released() {
    let slow = EchoConfig {
        delay: Duration::from_millis(3000),
        ..EchoConfig::default()
    };
    let a = TestPool::start("llama", "llama-model", 3, slow).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    // Identical, idle pods by the snapshot.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            (0..3).map(|i| pod(&a.addr(i), 0, 0.1)).collect(),
        )]),
    )
    .await;
    // 12 concurrent requests on separate connections (so both Envoy workers take some).
    let mut tasks = Vec::new();
    for i in 0..12 {
        let addr = envoy.listen_addr;
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "llama-model", "messages": [{"role": "user", "content": format!("burst {i}")}]});
            testkit::post_json(addr, "/v1/chat/completions", &[], &body).await.unwrap()
        }));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    // While they are held by the backends, the filter counts all of them, whichever worker.
    assert_eq!(wait_in_flight(&envoy, 12).await, 12);
    let mut per_pod: HashMap<String, u32> = HashMap::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        *per_pod.entry(backend(&r)).or_default() += 1;
    }
    assert_eq!(per_pod.len(), 3, "{per_pod:?}");
    // Two workers may read the table at the same instant, so allow one off; herding onto
    // the snapshot's favourite would put all 12 on one pod.
    assert!(
        per_pod.values().all(|&n| (3..=5).contains(&n)),
        "not spread: {per_pod:?}"
    );
    assert_eq!(wait_in_flight(&envoy, 0).await, 0);
}
