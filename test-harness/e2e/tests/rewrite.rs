//! Canary model rewrite in a real Envoy: a rule splitting `chat` 90/10 between two pools'
//! models rewrites each request's body to its target, sends it to that pool, names the served
//! model in `x-llm-router-served-model` and counts it under `target` in `/stats/prometheus`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use testkit::EchoConfig;
use util::*;

const SERVED_MODEL: &str = "x-llm-router-served-model";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_90_10_canary_splits_requests_between_two_served_models() {
    let stable = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let canary = TestPool::start("qwen", "qwen-model", 1, EchoConfig::default()).await;
    let envoy = envoy(
        &[&stable, &canary],
        plugin_config(
            &[&stable, &canary],
            json!({"rewrites": [{"model": "chat", "targets": [
                {"model": "llama-model", "weight": 90},
                {"model": "qwen-model", "weight": 10}]}]}),
        ),
    )
    .await;
    push_ok(
        &envoy,
        &snapshot(vec![
            (
                &stable,
                vec![pod(&stable.addr(0), 0, 0.1), pod(&stable.addr(1), 0, 0.1)],
            ),
            (&canary, vec![pod(&canary.addr(0), 0, 0.1)]),
        ]),
    )
    .await;
    let n = 300;
    let mut to_canary = 0;
    for i in 0..n {
        let r = chat(&envoy, "chat", &format!("request {i}"), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let served = r.header(SERVED_MODEL).unwrap_or_default().to_string();
        let echoed = r.json().unwrap();
        let pod = backend(&r);
        match served.as_str() {
            "qwen-model" => {
                to_canary += 1;
                assert_eq!(pod, canary.addr(0));
            }
            "llama-model" => assert!(stable.addrs().iter().any(|a| a.to_string() == pod)),
            other => panic!("served {other:?}: {echoed}"),
        }
    }
    // The pods saw the rewritten bodies.
    let seen_by = |p: &TestPool, model: &str| -> usize {
        p.pods
            .iter()
            .flat_map(|b| b.requests())
            .filter(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["model"] == model
                    && r.header("x-gateway-model-name-rewrite") == Some(model)
            })
            .count()
    };
    assert_eq!(seen_by(&canary, "qwen-model"), to_canary);
    assert_eq!(seen_by(&stable, "llama-model"), n - to_canary);
    // 10 % of 300: the binomial's sd is 5.2; a loose ±4 sd (the exact split over 10,000 draws
    // is the core's test, on deterministic entropy).
    assert!(
        (10..=52).contains(&to_canary),
        "{to_canary} of {n} to the 10 % target"
    );
    let (status, text) = envoy.admin_get("/stats/prometheus").unwrap();
    assert_eq!(status, 200);
    let count = |pool: &str, target: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with("llm_router_requests_total{"))
            .filter(|l| {
                l.contains(&format!("pool=\"{pool}\""))
                    && l.contains("model=\"chat\"")
                    && l.contains(&format!("target=\"{target}\""))
                    && l.contains("outcome=\"routed\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(count("qwen", "qwen-model"), to_canary as u64, "{text}");
    assert_eq!(count("llama", "llama-model"), (n - to_canary) as u64);
}
