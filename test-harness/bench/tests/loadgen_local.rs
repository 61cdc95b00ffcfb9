//! The SSE client and the open-loop generator against a tiny local streaming server.
//!
//! The server sends the role-only chunk at once and the first content chunk only after a pause,
//! so a client that took the role chunk for the first token would report a TTFT below the pause.

use bench::arrivals::Arrival;
use bench::client::{http_client, send};
use bench::loadgen::{run, RunOptions};
use bench::workload::{generate, Prompts, Range, WorkloadSpec};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PAUSE_MS: u64 = 150;

fn chunk(s: &str) -> Vec<u8> {
    format!("{:x}\r\n{s}\r\n", s.len()).into_bytes()
}

/// Reads one HTTP/1.1 request (headers + content-length body); false at EOF.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut tmp = [0u8; 65536];
                match sock.read(&mut tmp).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => buf.extend_from_slice(&tmp[..n]),
                }
            }
            buf.drain(..end + 4 + len);
            return true;
        }
        let mut tmp = [0u8; 65536];
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// Serves streamed chat completions on 127.0.0.1:0; every 5th request gets a 503.
async fn server(count: Arc<AtomicU64>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while read_request(&mut sock, &mut buf).await {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    if n % 5 == 4 {
                        let body = r#"{"error":{"message":"busy"}}"#;
                        let resp = format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-model-sim-pod: 127.0.0.1:7777\r\ntransfer-encoding: chunked\r\n\r\n";
                    let mut out = head.as_bytes().to_vec();
                    out.extend(chunk("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"));
                    if sock.write_all(&out).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(PAUSE_MS)).await;
                    for t in ["Hello", " there", " friend"] {
                        let ev = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n");
                        if sock.write_all(&chunk(&ev)).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let mut tail = chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"total_tokens\":6}}\n\n");
                    tail.extend(chunk("data: [DONE]\n\n"));
                    tail.extend_from_slice(b"0\r\n\r\n");
                    if sock.write_all(&tail).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn ttft_is_the_first_content_chunk_not_the_role_chunk() {
    let addr = server(Arc::new(AtomicU64::new(0))).await;
    let client = http_client();
    let uri: hyper::Uri = format!("http://{addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let o = send(&client, &uri, bytes::Bytes::from_static(b"{}"), &[]).await;
    assert!(o.ok(), "{o:?}");
    assert_eq!(o.status, 200);
    let ttft = o.ttft_ms.unwrap();
    // The role chunk came at once; the first content only after the pause.
    assert!(ttft >= PAUSE_MS as f64, "ttft {ttft}");
    assert!(o.e2e_ms >= ttft);
    assert_eq!(o.content_chunks, 3);
    assert_eq!(o.itl_ms.len(), 2);
    assert_eq!(o.output_tokens, Some(3));
    assert_eq!(o.pod.as_deref(), Some("127.0.0.1:7777"));
}

#[tokio::test]
async fn open_loop_sends_every_request_and_records_errors() {
    let count = Arc::new(AtomicU64::new(0));
    let addr = server(count.clone()).await;
    let spec = WorkloadSpec {
        seed: 1,
        arrival: Arrival::Poisson { rate: 50.0 },
        horizon: Duration::from_secs(1),
        max_requests: 40,
        model: "m".into(),
        prompts: Prompts::Independent {
            prompt_tokens: Range::new(10, 20),
            max_tokens: Range::new(3, 3),
        },
        tagging: None,
    };
    let reqs = generate(&spec);
    assert!(!reqs.is_empty());
    let opts = RunOptions {
        url: format!("http://{addr}/v1/chat/completions"),
        replica_urls: vec![],
        headers: vec![],
        drain: Duration::from_secs(20),
        request_timeout: Duration::from_secs(20),
        start: None,
    };
    let res = run(&reqs, &opts).await.unwrap();
    assert_eq!(res.samples.len(), reqs.len());
    assert_eq!(count.load(Ordering::SeqCst), reqs.len() as u64);
    let ok = res.samples.iter().filter(|s| s.outcome.ok()).count();
    let e503 = res
        .samples
        .iter()
        .filter(|s| s.outcome.status == 503)
        .count();
    assert_eq!(ok + e503, reqs.len());
    assert_eq!(e503, reqs.len() / 5);
    // Ids come back in workload order, each once.
    assert!(res
        .samples
        .iter()
        .enumerate()
        .all(|(i, s)| s.id == i as u64));
    let sum = bench::stats::summarize(&res);
    assert_eq!(sum.errors, e503 as u64);
    assert_eq!(sum.errors_by_status.get("503").copied(), Some(e503 as u64));
    assert_eq!(sum.pod_share.get("127.0.0.1:7777").copied(), Some(1.0));
}

#[tokio::test]
async fn unreachable_target_is_a_transport_error_not_a_hang() {
    // Bind then drop: nothing listens there any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = http_client();
    let uri: hyper::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
    let o = send(&client, &uri, bytes::Bytes::from_static(b"{}"), &[]).await;
    assert_eq!(o.status, 0);
    assert!(o.error.unwrap().starts_with("transport"));
}
