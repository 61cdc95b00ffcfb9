//! Two gateway replicas — separate Envoy processes, no shared memory — in front of the same
//! pods agree on where a conversation lives: each turn may reach either replica, and turn 2 goes
//! to the pod that served turn 1 through the other replica, because both derive the same home
//! from the conversation's start (system prompt and first user message) by rendezvous hashing.
//! (Without it, a replica that has not seen the conversation picks one of four alike pods at
//! random, and twelve conversations would agree by chance with probability 4^-12.)
//!
//! They also agree on where a long shared context lives (documents asked about through either
//! replica): the engines count requests neither replica sent, so each expects part of the
//! traffic to come from elsewhere and credits the rendezvous home of the prompt's anchor block
//! with the cache other replicas would have built there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use std::collections::HashMap;
use testkit::EchoConfig;
use util::*;

fn turn(system: &str, first: &str, history: &[&str]) -> serde_json::Value {
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": first}),
    ];
    for (i, m) in history.iter().enumerate() {
        let role = if i % 2 == 0 { "assistant" } else { "user" };
        messages.push(json!({"role": role, "content": m}));
    }
    json!({"model": "llama-model", "messages": messages})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_a_conversation_to_the_same_pod() {
    let a = TestPool::start("llama", "llama-model", 4, EchoConfig::default()).await;
    let one = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let two = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let idle = snapshot(vec![(
        &a,
        (0..4).map(|i| pod(&a.addr(i), 0, 0.1)).collect(),
    )]);
    // Each replica has its own sidecar; both see the same idle fleet.
    push_ok(&one, &idle).await;
    push_ok(&two, &idle).await;
    let mut pods_used = HashMap::new();
    for c in 0..12 {
        // Each conversation its own system prompt: nothing cached anywhere says where it
        // belongs, the pods are idle and alike — only the shared home can make them agree.
        let system = format!("You are support assistant {c} of a hardware shop. ").repeat(30);
        let first = format!("conversation {c}: my order has not arrived, what can I do?");
        // Turn 1 through replica one …
        let r1 = testkit::post_json(
            one.listen_addr,
            "/v1/chat/completions",
            &[],
            &turn(&system, &first, &[]),
        )
        .await
        .unwrap();
        assert_eq!(r1.status, 200);
        // … turn 2 through replica two, which has never seen this conversation.
        let r2 = testkit::post_json(
            two.listen_addr,
            "/v1/chat/completions",
            &[],
            &turn(&system, &first, &["Let me check.", "It was order 42."]),
        )
        .await
        .unwrap();
        assert_eq!(r2.status, 200);
        assert_eq!(backend(&r2), backend(&r1), "conversation {c}");
        *pods_used.entry(backend(&r1)).or_insert(0) += 1;
    }
    // Different conversations still spread over the pods.
    assert!(pods_used.len() >= 3, "{pods_used:?}");
}

/// A system prompt every document question shares, a long document, then the question.
fn doc_question(doc: usize, question: usize) -> serde_json::Value {
    let system = "You answer questions about the documents you are given. ".repeat(107);
    let document = format!("Document {doc}, paragraph on warehouse logistics. ").repeat(340);
    json!({"model": "llama-model", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("{document}\n\nQuestion {question}: what does it say?")},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_a_document_neither_has_seen_to_the_same_pod() {
    let a = TestPool::start("llama", "llama-model", 4, EchoConfig::default()).await;
    let one = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let two = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    // Each replica's sidecar scraped at a different moment: replica one saw the first two pods'
    // KV caches fuller, replica two the last two. Left to what each sees, they would put
    // every new document on different pods. The engines run requests neither replica has in
    // flight (two per pod): both see other gateways' traffic.
    let view = |full: [bool; 4]| {
        snapshot(vec![(
            &a,
            (0..4)
                .map(|i| pod(&a.addr(i), 0, if full[i] { 0.7 } else { 0.1 }))
                .collect(),
        )])
    };
    push_ok(&one, &view([true, true, false, false])).await;
    push_ok(&two, &view([false, false, true, true])).await;
    let ask = |envoy: &testkit::EnvoyProcess, body: serde_json::Value| {
        let addr = envoy.listen_addr;
        async move {
            let r = testkit::post_json(addr, "/v1/chat/completions", &[], &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            backend(&r)
        }
    };
    // Both have served the shared system prompt before: the only thing they know.
    ask(&one, doc_question(99, 0)).await;
    ask(&two, doc_question(99, 1)).await;
    let mut pods_used = HashMap::new();
    for doc in 0..8 {
        let first = ask(&one, doc_question(doc, 1)).await;
        let second = ask(&two, doc_question(doc, 2)).await;
        assert_eq!(second, first, "document {doc}");
        *pods_used.entry(first).or_insert(0) += 1;
    }
    // Different documents still spread over the pods.
    assert!(pods_used.len() >= 2, "{pods_used:?}");
}
