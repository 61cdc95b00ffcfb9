//! Routing in a real Envoy: the pod the snapshot favours, two models on two clusters, a LoRA
//! adapter to the pod that holds it, client-sent routing headers ignored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use testkit::EchoConfig;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_pod_the_snapshot_favours() {
    let a = TestPool::start(
        "llama",
        "meta-llama/Llama-3.1-8B-Instruct",
        3,
        EchoConfig::default(),
    )
    .await;
    // The served-pod header is off by default (it tells clients pod addresses); this test
    // checks that it reports the pod that served, through a real Envoy.
    let envoy = envoy(
        &[&a],
        plugin_config(&[&a], json!({"disclose": {"served_pod": true}})),
    )
    .await;
    // Pod 0 and 1 are busy; pod 2 is idle.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![
                pod(&a.addr(0), 9, 0.9),
                pod(&a.addr(1), 6, 0.7),
                pod(&a.addr(2), 0, 0.1),
            ],
        )]),
    )
    .await;
    for i in 0..6 {
        let r = chat(&envoy, a.model, &format!("hello {i}"), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(backend(&r), a.addr(2));
        assert_eq!(
            r.header("x-gateway-destination-endpoint-served"),
            Some(a.addr(2).as_str())
        );
        let seen = r.json().unwrap();
        // The ordered fallback list reached Envoy: best first.
        let sent = seen["headers"]["x-gateway-destination-endpoint"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(sent.is_empty() || sent.starts_with(&a.addr(2)), "{sent}");
    }
    // The fleet changes: pod 0 becomes the idle one.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![
                pod(&a.addr(0), 0, 0.05),
                pod(&a.addr(1), 6, 0.7),
                pod(&a.addr(2), 8, 0.9),
            ],
        )]),
    )
    .await;
    let r = chat(&envoy, a.model, "after the change", &[]).await;
    assert_eq!(backend(&r), a.addr(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_route_to_two_clusters() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let b = TestPool::start("qwen", "qwen-model", 2, EchoConfig::default()).await;
    let envoy = envoy(&[&a, &b], plugin_config(&[&a, &b], json!({}))).await;
    push_ok(
        &envoy,
        &snapshot(vec![
            (&a, vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 4, 0.5)]),
            (&b, vec![pod(&b.addr(0), 4, 0.5), pod(&b.addr(1), 0, 0.1)]),
        ]),
    )
    .await;
    for _ in 0..3 {
        assert_eq!(
            backend(&chat(&envoy, "llama-model", "hi", &[]).await),
            a.addr(0)
        );
        assert_eq!(
            backend(&chat(&envoy, "qwen-model", "hi", &[]).await),
            b.addr(1)
        );
    }
    // Completions and embeddings are routed by their body too.
    let r = testkit::post_json(
        envoy.listen_addr,
        "/v1/completions",
        &[],
        &json!({"model": "qwen-model", "prompt": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(backend(&r), b.addr(1));
    let r = testkit::post_json(
        envoy.listen_addr,
        "/v1/embeddings",
        &[],
        &json!({"model": "llama-model", "input": ["x"]}),
    )
    .await
    .unwrap();
    assert_eq!(backend(&r), a.addr(0));
    let r = testkit::post_json(envoy.listen_addr, "/v1/messages", &[], &json!({"model": "qwen-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})).await.unwrap();
    assert_eq!(backend(&r), b.addr(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_adapter_stays_on_its_home_pod() {
    let a = TestPool::start("llama", "llama-model", 3, EchoConfig::default()).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let addrs: Vec<String> = (0..3).map(|i| a.addr(i)).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let home =
        llm_router_core::lora::homes(&["llama-lora".to_string()], &refs, &[2, 2, 2])["llama-lora"];
    let elsewhere = (home + 1) % 3;
    // The adapter was loaded on another pod (it strayed there once); its home's slots hold
    // other adapters. Its requests go home, so adapters partition over the pods' slots
    // instead of following each other around.
    let pods = (0..3)
        .map(|i| {
            let loaded: &[&str] = if i == elsewhere {
                &["llama-lora", "y"]
            } else {
                &["x", "z"]
            };
            with_lora(pod(&a.addr(i), 0, 0.1), loaded, 2)
        })
        .collect();
    push_ok(&envoy, &snapshot(vec![(&a, pods)])).await;
    for i in 0..4 {
        let r = chat(&envoy, "llama-lora", &format!("adapter request {i}"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(backend(&r), a.addr(home), "request {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sent_routing_headers_are_ignored() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let b = TestPool::start("qwen", "qwen-model", 1, EchoConfig::default()).await;
    let envoy = envoy(&[&a, &b], plugin_config(&[&a, &b], json!({}))).await;
    push_ok(
        &envoy,
        &snapshot(vec![
            (&a, vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 9, 0.9)]),
            (&b, vec![pod(&b.addr(0), 0, 0.1)]),
        ]),
    )
    .await;
    let spoof = a.addr(1);
    for _ in 0..4 {
        let r = chat(
            &envoy,
            "llama-model",
            "hi",
            &[
                ("x-gateway-destination-endpoint", spoof.as_str()),
                ("x-llm-router-cluster", "pool_qwen"),
            ],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            backend(&r),
            a.addr(0),
            "spoofed endpoint or cluster was honoured"
        );
    }
    // Paths the filter does not route keep their body but lose the spoofed header too.
    let r = testkit::get(
        envoy.listen_addr,
        "/v1/models",
        &[("x-gateway-destination-endpoint", spoof.as_str())],
    )
    .await
    .unwrap();
    let seen = r.json().unwrap();
    assert!(
        seen["headers"]
            .get("x-gateway-destination-endpoint")
            .is_none(),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_rewrite_changes_the_body_the_pod_sees() {
    let a = TestPool::start("llama", "llama-model", 1, EchoConfig::default()).await;
    let cfg = json!({"pools": [{"name": "llama", "cluster": a.cluster,
        "models": [{"name": "short", "rewrite": "meta-llama/Llama-3.1-8B-Instruct"}]}],
        "snapshot": {"secret": SECRET}});
    let envoy = envoy(&[&a], cfg).await;
    push_ok(&envoy, &snapshot(vec![(&a, vec![pod(&a.addr(0), 0, 0.1)])])).await;
    let r = chat(&envoy, "short", "rewrite me", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.json().unwrap();
    let body = &seen["body"];
    assert_eq!(body["model"], json!("meta-llama/Llama-3.1-8B-Instruct"));
    assert_eq!(body["messages"][0]["content"], json!("rewrite me"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_snapshot_envoys_fallback_policy_serves() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let mut seen = std::collections::HashSet::new();
    for i in 0..6 {
        let r = chat(&envoy, "llama-model", &format!("{i}"), &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        seen.insert(backend(&r));
    }
    assert_eq!(
        seen.len(),
        2,
        "round robin fallback should use both pods: {seen:?}"
    );
}
