//! One lying pod among four, end to end: a real Envoy with the real filter `.wasm`, the real
//! `sidecar-metrics` scraping four model-sim pods, one of them started with `--lie-metrics`
//! (its `/metrics` reports `waiting 0, running 0, kv 0` whatever its state; it serves like the
//! others). A bounded mixed workload (short and long prompts, short and long answers) at about
//! the pool's capacity: the liar gets at most 1.5× its fair share (the pod that served each
//! request from model-sim's own `x-model-sim-pod` header). Then an overload of sheddable
//! requests: the pool sheds (429) although one pod says it is empty.
//!
//! Needs Envoy, the filter `.wasm`, `model-sim` and `sidecar-metrics` (`./build.sh`): skipped
//! with a message when missing, failed when `CI` is set.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bench::client::{http_client, send};
use serde_json::json;
use std::time::Duration;
use testkit::stack::fleet::{FleetSpec, PodSpec, MODEL};
use testkit::stack::{self, RouterKind};

const PODS: usize = 4;
const LIAR: usize = 3;

fn body(n: usize) -> String {
    // Mixed: prompts of ~100 to ~2,000 tokens, answers of 16 to 128 tokens; every prompt distinct.
    let words = 80 + (n * 7_919 % 20) * 80;
    let text: String = (0..words)
        .map(|i| format!("w{} ", (i * 31 + n) % 997))
        .collect();
    json!({"model": MODEL, "stream": true, "max_tokens": 16 + (n * 104_729 % 8) * 16,
           "messages": [{"role": "user", "content": format!("{n}: {text}")}]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lying_pod_gets_a_bounded_share_and_the_pool_still_sheds() {
    if !testkit::stack_ready("one_lying_pod", []) {
        return;
    }
    let mut pods = vec![PodSpec::new("h100"); PODS];
    pods[LIAR].lie_metrics = true;
    let fleet = FleetSpec {
        pods,
        speedup: 4.0,
        seed: 11,
        engine: Default::default(),
        admission: None,
    };
    let started = stack::start_pods(&fleet, &[]).await.unwrap();
    let mut spec = stack::envoy_spec(
        RouterKind::Filter,
        &fleet,
        &started.addrs,
        &[],
        &serde_json::Value::Null,
    );
    spec.name = "e2e-lying-pod".into();
    spec.plugin_config["priority"] = json!({"trust_headers": true});
    let envoy = spec.start().await.unwrap();
    let sidecar = stack::start_sidecar(envoy.push_addr(), &started.addrs)
        .await
        .unwrap();
    stack::wait_snapshot_at(
        envoy.push_addr(),
        PODS as u64,
        Duration::from_secs(15),
        &sidecar.log_path().display().to_string(),
    )
    .await
    .unwrap();
    let uri: hyper::Uri = envoy.url("/v1/chat/completions").parse().unwrap();
    let client = http_client();
    let liar = started.addrs[LIAR].to_string();

    // About the pool's capacity: 32 concurrent clients, 600 requests.
    let mut tasks = Vec::new();
    for c in 0..32 {
        let (client, uri) = (client.clone(), uri.clone());
        tasks.push(tokio::spawn(async move {
            let mut served = Vec::new();
            for k in 0..600 / 32 {
                let o = send(&client, &uri, body(c * 1000 + k).into(), &[]).await;
                served.push((o.status, o.pod));
            }
            served
        }));
    }
    let mut by_pod = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        for (status, pod) in t.await.unwrap() {
            assert_eq!(status, 200, "a standard request failed");
            *by_pod.entry(pod.unwrap_or_default()).or_default() += 1;
        }
    }
    let total: usize = by_pod.values().sum();
    let share = *by_pod.get(&liar).unwrap_or(&0) as f64 / total as f64;
    eprintln!("served per pod {by_pod:?}; liar {liar} share {share:.3}");
    assert!(
        share <= 1.5 / PODS as f64,
        "liar share {share:.3} > 1.5× fair: {by_pod:?}"
    );

    // Overload with sheddable requests: 128 concurrent clients, long answers.
    let mut tasks = Vec::new();
    for c in 0..128 {
        let (client, uri) = (client.clone(), uri.clone());
        tasks.push(tokio::spawn(async move {
            let mut codes = Vec::new();
            for k in 0..4 {
                let b = json!({"model": MODEL, "stream": true, "max_tokens": 512,
                               "messages": [{"role": "user", "content": format!("long {c} {k}")}]});
                let h = [("x-llm-router-priority".to_string(), "-1".to_string())];
                codes.push(send(&client, &uri, b.to_string().into(), &h).await.status);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            codes
        }));
    }
    let mut shed = 0;
    for t in tasks {
        shed += t.await.unwrap().iter().filter(|&&s| s == 429).count();
    }
    eprintln!("sheddable overload: {shed} of 512 shed");
    assert!(shed > 0, "the pool never shed with one pod reporting empty");
    drop(sidecar);
}
