//! The field's routers for real: each peer (`cache_aware`, the default of both) in front of two
//! model-sim pods becomes ready only with both workers healthy, and proxies a streaming and a
//! non-streaming chat completion and a completion to one of the pods, answers unchanged in
//! substance. Skipped when the peer venvs are not installed (`./build.sh setup`), failing
//! under `CI`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use serde_json::{json, Value};
use testkit::peers::{self, PeerRouter};
use testkit::{blocking_get, post_json, start_model_sim, HttpResponse};

const MODEL: &str = "peer-test-model";
const MAX_TOKENS: u64 = 6;

/// model-sim's synthetic answer: `tokens` plain ASCII words, each with a leading space.
fn is_pod_text(text: &str, tokens: u64) -> bool {
    text.starts_with(' ')
        && text.split(' ').skip(1).count() as u64 == tokens
        && text
            .split(' ')
            .skip(1)
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric()))
}

fn served_by(r: &HttpResponse, pods: &[SocketAddr]) -> SocketAddr {
    let pod: SocketAddr = r
        .header("x-model-sim-pod")
        .unwrap_or_else(|| panic!("no x-model-sim-pod header in {:?}", r.headers))
        .parse()
        .unwrap();
    assert!(pods.contains(&pod), "{pod} is not one of {pods:?}");
    pod
}

async fn proxies_the_openai_api(kind: PeerRouter) {
    let test = format!("peer_{}_proxies_chat_and_completions", kind.package());
    if !peers::peers_ready(&test, &[kind]) {
        return;
    }
    let a = start_model_sim(&["--model", MODEL, "--speedup", "20"])
        .await
        .unwrap();
    let b = start_model_sim(&["--model", MODEL, "--speedup", "20", "--seed", "1"])
        .await
        .unwrap();
    let pods = [a.addr, b.addr];
    let router = peers::start(kind, "cache_aware", &pods).await.unwrap();
    let addr = router.addr;
    assert_eq!(router.url("/v1/models"), format!("http://{addr}/v1/models"));

    // Ready means both workers are registered and healthy.
    let (status, body) =
        blocking_get(addr, "/readiness", std::time::Duration::from_secs(5)).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (v["healthy_workers"].as_u64(), v["total_workers"].as_u64()),
        (Some(2), Some(2))
    );

    let messages = json!([{"role": "user", "content": "Say something about GPUs."}]);

    // Streaming chat: several SSE chunks, the pod's words, ending with [DONE].
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &[],
        &json!({"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "stream": true}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    served_by(&r, &pods);
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.len() >= MAX_TOKENS as usize, "{data:?}");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == MODEL));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(is_pod_text(&streamed, MAX_TOKENS), "{streamed:?}");
    assert!(r.chunks.len() > 1, "the stream arrived in one piece");

    // Non-streaming chat: the pod's JSON answer.
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &[],
        &json!({"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    served_by(&r, &pods);
    let v = r.json().unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["usage"]["completion_tokens"], MAX_TOKENS);
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(is_pod_text(text, MAX_TOKENS), "{text:?}");

    // Completions.
    let r = post_json(
        addr,
        "/v1/completions",
        &[],
        &json!({"model": MODEL, "prompt": "GPUs are", "max_tokens": MAX_TOKENS}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    served_by(&r, &pods);
    let v = r.json().unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], MAX_TOKENS);
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(is_pod_text(text, MAX_TOKENS), "{text:?}");

    // Stopped by PID on drop.
    let pid = router.pid();
    drop(router);
    assert!(!testkit::pid_alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_proxies_chat_and_completions() {
    proxies_the_openai_api(PeerRouter::Smg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_router_proxies_chat_and_completions() {
    proxies_the_openai_api(PeerRouter::VllmRouter).await;
}
