//! Hostile request bodies (issue 12) through a real Envoy with the real `.wasm`: deeply nested
//! JSON, huge strings, wrong types, duplicate keys, invalid UTF-8, bodies sent in 1-byte chunks
//! and bodies over the size limit with and without `content-length`. Each gets the status and
//! OpenAI-style JSON error of `filter/README.md` ("Errors clients can get") from the filter —
//! not a plain-text reply of Envoy's, not a backend answer — and after each one the gateway
//! serves an ordinary request normally; nothing is left counted in flight at the end.
//!
//! Requests go over a raw TCP connection so the test decides the framing: a truthful
//! `content-length`, or `transfer-encoding: chunked` with chunks of a chosen size, each written
//! on its own (Envoy hands the filter what it has read, so small writes become small body
//! callbacks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use std::net::SocketAddr;
use std::time::Duration;
use testkit::EchoConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use util::*;

const MODEL: &str = "llama-model";
const CHAT: &str = "/v1/chat/completions";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// `content-length` with the body's true size, written in one go.
    Length,
    /// `transfer-encoding: chunked`, chunks of this many bytes, each written separately.
    Chunked(usize),
}

/// Status, headers (lower-case names) and body of a raw HTTP/1.1 answer.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `body` to the chat path with `framing` and reads the answer until Envoy closes the
/// connection. With `declared`, only the head goes out, with that `content-length` (the filter
/// answers from it). The answer is read while the body is still being written: a local reply
/// may come before the body is done.
async fn send(addr: SocketAddr, body: &[u8], framing: Framing, declared: Option<usize>) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let reader = tokio::spawn(async move {
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw)).await;
        raw
    });
    let mut head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway.local\r\ncontent-type: application/json\r\nconnection: close\r\n"
    );
    match (framing, declared) {
        (_, Some(n)) => head.push_str(&format!("content-length: {n}\r\n")),
        (Framing::Length, None) => head.push_str(&format!("content-length: {}\r\n", body.len())),
        (Framing::Chunked(_), None) => head.push_str("transfer-encoding: chunked\r\n"),
    }
    head.push_str("\r\n");
    // Write errors are expected once Envoy has answered and closed: the answer is what counts.
    let write = async {
        wr.write_all(head.as_bytes()).await?;
        if declared.is_some() {
            return Ok(()); // only the head: the filter answers from the declared size
        }
        match framing {
            Framing::Length => wr.write_all(body).await?,
            Framing::Chunked(size) => {
                for chunk in body.chunks(size) {
                    let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
                    frame.extend_from_slice(chunk);
                    frame.extend_from_slice(b"\r\n");
                    wr.write_all(&frame).await?;
                }
                wr.write_all(b"0\r\n\r\n").await?;
            }
        }
        wr.flush().await
    };
    let _: std::io::Result<()> = write.await;
    let raw = reader.await.unwrap();
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let text_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..text_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[text_end + 4..].to_vec();
    if let Some(n) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.truncate(n);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// `(name, body, expected status, expected error code)`; status 200 = routed to a backend.
fn cases() -> Vec<(&'static str, Vec<u8>, u16, &'static str)> {
    let user = r#"[{"role":"user","content":"hello"}]"#;
    let chat = |model: &str, text: &str| {
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": text}]})
            .to_string()
            .into_bytes()
    };
    vec![
        (
            "content nested 100,000 deep",
            format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":{}}}]}}"#,
                nested(100_000, r#""x""#)
            )
            .into_bytes(),
            400,
            "invalid_json",
        ),
        (
            "900 KB prompt",
            chat(MODEL, &"All work and no play. ".repeat(41_000)),
            200,
            "",
        ),
        (
            "500 KB model name",
            chat(&"m".repeat(500_000), "hi"),
            404,
            "model_not_found",
        ),
        (
            "model is a number",
            br#"{"model":42,"messages":[]}"#.to_vec(),
            400,
            "invalid_model",
        ),
        (
            "stream is a string",
            format!(r#"{{"model":"{MODEL}","stream":"yes","messages":{user}}}"#).into_bytes(),
            400,
            "invalid_json",
        ),
        (
            "messages is a string",
            format!(r#"{{"model":"{MODEL}","messages":"hello"}}"#).into_bytes(),
            400,
            "invalid_json",
        ),
        (
            "body is an array",
            format!(r#"["{MODEL}"]"#).into_bytes(),
            400,
            "invalid_json",
        ),
        (
            "model twice",
            format!(r#"{{"model":"{MODEL}","model":"other","messages":{user}}}"#).into_bytes(),
            400,
            "invalid_json",
        ),
        (
            "invalid UTF-8 in a skipped field",
            [
                format!(r#"{{"model":"{MODEL}","messages":{user},"user":""#).as_bytes(),
                b"\xc3\x28\xff\"}",
            ]
            .concat(),
            400,
            "invalid_json",
        ),
        (
            "an ordinary body",
            chat(MODEL, "in one-byte chunks too"),
            200,
            "",
        ),
    ]
}

fn assert_answer(a: &Answer, what: &str, status: u16, code: &str, favoured: &str) {
    assert_eq!(
        a.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&a.body)
    );
    if status == 200 {
        assert_eq!(
            a.header("x-echo-backend"),
            Some(favoured),
            "{what}: not routed to the favoured pod"
        );
        return;
    }
    assert_eq!(
        a.header("content-type"),
        Some("application/json"),
        "{what}: not the filter's reply: {}",
        String::from_utf8_lossy(&a.body)
    );
    assert!(a.header("x-llm-router-dropped-reason").is_some(), "{what}");
    assert!(
        a.body.len() < 1024,
        "{what}: reply of {} bytes",
        a.body.len()
    );
    let v: serde_json::Value = serde_json::from_slice(&a.body)
        .unwrap_or_else(|e| panic!("{what}: reply is not JSON ({e})"));
    assert_eq!(v["error"]["code"], code, "{what}: {v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_their_documented_answers_and_the_gateway_keeps_serving() {
    let a = TestPool::start("llama", MODEL, 2, EchoConfig::default()).await;
    // The default max_body_bytes (1,000,000), just under Envoy's 1 MiB buffer.
    let envoy = envoy(&[&a], plugin_config(&[&a], serde_json::json!({}))).await;
    // Pushed again before each case, as the sidecar's heartbeat would: the test runs longer than
    // `stale_after_ms`, and a stale snapshot no longer favours pod 0.
    let fresh = || {
        snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 6, 0.8)],
        )])
    };
    let favoured = a.addr(0);
    let addr = envoy.listen_addr;
    let ordinary = |after: String| {
        let envoy = &envoy;
        let favoured = favoured.clone();
        async move {
            let r = chat(envoy, MODEL, "an ordinary question", &[]).await;
            assert_eq!(r.status, 200, "after {after}: {}", r.text());
            assert_eq!(backend(&r), favoured, "after {after}");
        }
    };

    for (name, body, status, code) in cases() {
        push_ok(&envoy, &fresh()).await;
        let small = body.len() <= 4096;
        let chunked = Framing::Chunked(if small { 1 } else { 65_536 });
        for framing in [Framing::Length, chunked] {
            let what = format!("{name} ({framing:?})");
            let answer = send(addr, &body, framing, None).await;
            assert_answer(&answer, &what, status, code, &favoured);
            ordinary(what).await;
        }
    }

    // Over the limit: declared (answered at the headers) and undeclared (chunked, answered
    // when the buffered body passes the limit), both the filter's JSON 413.
    let big = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "z".repeat(1_000_100)
    )
    .into_bytes();
    push_ok(&envoy, &fresh()).await;
    let answer = send(addr, &big, Framing::Length, Some(big.len())).await;
    assert_answer(
        &answer,
        "declared over the limit",
        413,
        "request_too_large",
        "",
    );
    ordinary("declared over the limit".into()).await;
    let answer = send(addr, &big, Framing::Chunked(65_536), None).await;
    assert_answer(
        &answer,
        "chunked over the limit",
        413,
        "request_too_large",
        "",
    );
    ordinary("chunked over the limit".into()).await;

    assert_eq!(wait_in_flight(&envoy, 0).await, 0, "in-flight counts left");
    // Every hostile body the filter refused was counted as such, and none reached a backend
    // (only the routed cases and the ordinary requests did).
    let served: u64 = a.pods.iter().map(|p| p.request_count()).sum();
    let routed_cases = cases().iter().filter(|c| c.2 == 200).count() as u64;
    let ordinary_requests = 2 * cases().len() as u64 + 2;
    assert_eq!(served, 2 * routed_cases + ordinary_requests);
}
