//! One streaming request over HTTP/1.1 and what it measured (TTFT, inter-token gaps, e2e).
//!
//! Uses hyper-util's pooled client (keep-alive, no cap on connections per host) so the open loop
//! can have as many requests in flight as the arrivals demand.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::time::{Duration, Instant};

use crate::loadgen::sse::{classify, SseParser};

/// The pooled HTTP/1.1 client every request of a run shares.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with keep-alive and no bound on pooled connections.
pub fn http_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(60))
        .build(conn)
}

/// Response headers that name the pod which served a request, in order of preference. Every
/// model-sim pod sets the first; the filter sets the second only with `disclose.served_pod`.
pub const POD_HEADERS: [&str; 2] = ["x-model-sim-pod", "x-gateway-destination-endpoint-served"];

/// The response header naming the model a canary or weighted rewrite chose (the filter's
/// default `served_model_header`).
pub const SERVED_MODEL_HEADER: &str = "x-llm-router-served-model";

/// What one request measured.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Outcome {
    /// HTTP status; 0 when no response arrived (connect error, reset, timeout).
    pub status: u16,
    /// Why the request failed, if it did (non-2xx, transport error, stream error, timeout).
    pub error: Option<String>,
    /// Time to the first chunk with content (not the role-only chunk), ms.
    pub ttft_ms: Option<f64>,
    /// Time to the end of the response, ms.
    pub e2e_ms: f64,
    /// Gaps between consecutive content chunks, ms.
    pub itl_ms: Vec<f64>,
    /// `usage.completion_tokens`, if the stream had a usage chunk.
    pub output_tokens: Option<u64>,
    /// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, if reported: how
    /// much of the prompt the serving pod had to prefill.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Number of content chunks seen.
    pub content_chunks: u32,
    /// The pod that served it (from [`POD_HEADERS`]).
    pub pod: Option<String>,
    /// The model name a rewrite rule chose ([`SERVED_MODEL_HEADER`]), if the filter set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    /// Why the gateway refused it (`x-llm-router-dropped-reason` of a 429), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_reason: Option<String>,
}

impl Outcome {
    /// 2xx, no transport or stream error.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status) && self.error.is_none()
    }
}

/// Send one POST with a JSON body and measure the streamed answer.
///
/// `started` is when the request counts as sent (TTFT and e2e are measured from it). Errors are
/// recorded in the outcome, never returned: a failed request is a measurement too.
pub async fn send(
    client: &HttpClient,
    uri: &hyper::Uri,
    body: Bytes,
    headers: &[(String, String)],
) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome::default();
    let mut req = Request::post(uri.clone()).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = match req.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("building request: {e}"));
            return out;
        }
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("transport: {e}"));
            out.e2e_ms = ms(started.elapsed());
            return out;
        }
    };
    out.status = resp.status().as_u16();
    out.pod = POD_HEADERS.iter().find_map(|h| {
        resp.headers()
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    out.served_model = header(SERVED_MODEL_HEADER);
    out.dropped_reason = header("x-llm-router-dropped-reason");
    let ok_status = resp.status().is_success();
    let mut body = resp.into_body();
    let mut parser = SseParser::new(4 << 20);
    let mut last_content: Option<Instant> = None;
    let mut error_body = Vec::new();
    let mut saw_done = false;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => {
                out.error = Some(format!("body: {e}"));
                break;
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers
                };
                if !ok_status {
                    if error_body.len() < 4096 {
                        error_body.extend_from_slice(&data);
                    }
                    continue;
                }
                let now = Instant::now();
                for ev in parser.feed(&data) {
                    let info = classify(&ev);
                    if info.content {
                        out.content_chunks += 1;
                        match last_content {
                            None => out.ttft_ms = Some(ms(now - started)),
                            Some(prev) => out.itl_ms.push(ms(now - prev)),
                        }
                        last_content = Some(now);
                    }
                    if info.prompt_tokens.is_some() {
                        out.prompt_tokens = info.prompt_tokens;
                        out.cached_tokens = info.cached_tokens;
                    }
                    if let Some(n) = info.completion_tokens {
                        out.output_tokens = Some(n);
                    }
                    if info.error && out.error.is_none() {
                        out.error = Some(format!("stream error event: {}", truncate(&ev, 200)));
                    }
                    saw_done |= info.done;
                }
            }
        }
    }
    out.e2e_ms = ms(started.elapsed());
    if !ok_status {
        out.error = Some(format!(
            "status {}: {}",
            out.status,
            truncate(&String::from_utf8_lossy(&error_body), 200)
        ));
    } else if out.error.is_none() && !saw_done {
        out.error = Some("stream ended without [DONE]".to_string());
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Milliseconds of a duration, as f64.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
