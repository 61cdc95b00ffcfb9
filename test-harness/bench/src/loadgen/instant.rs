//! An instant backend for the overhead bench: answers every request at once with a tiny JSON
//! body (after reading the whole request body), so only the proxy's own cost is left to measure.
//! `GET /metrics` answers a vLLM pod's metrics with the requests it is serving as they are
//! (`num_requests_running`, as a real engine's gauge; nothing waits), so the sidecar can put it
//! in a snapshot and the filter takes its full scoring path. `GET /v1/models` lists the bench's
//! model, as a vLLM server does: SMG registers a worker under the first model it lists and
//! answers 404 for any other. A request lives a fraction of a
//! millisecond, so scrapes rarely see one running: the filter's flow control still takes the
//! requests sent since the last scrape as queued, which is why the benches that use this backend
//! set a queue bound nothing reaches (`overhead::instant_saturation`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use testkit::stack::fleet::MODEL;
use tokio::task::JoinHandle;

/// A running instant backend on 127.0.0.1:<free port>; stops on drop.
pub struct InstantBackend {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

/// A vLLM pod's metrics with `running` requests running and none waiting.
pub fn metrics(running: u64) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name=\"m\"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name=\"m\"}} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.1
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"28000\"}} 1
"
    )
}

/// `GET /v1/models`: the bench's model, in vLLM's shape.
pub fn models() -> String {
    serde_json::json!({
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL}],
    })
    .to_string()
}

/// Counts a request in `running` for as long as it lives.
struct Serving(Arc<AtomicU64>);

impl Serving {
    fn start(running: &Arc<AtomicU64>) -> Serving {
        running.fetch_add(1, Ordering::Relaxed);
        Serving(Arc::clone(running))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn answer(
    addr: SocketAddr,
    running: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() == hyper::Method::GET && req.uri().path() == "/metrics" {
        let body = metrics(running.load(Ordering::Relaxed));
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        resp.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        return Ok(resp);
    }
    if req.method() == hyper::Method::GET && req.uri().path() == "/v1/models" {
        let mut resp = Response::new(Full::new(Bytes::from(models())));
        resp.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("application/json"),
        );
        return Ok(resp);
    }
    let _serving = Serving::start(&running);
    // Read (and drop) the whole body, as a model server would.
    let _ = req.into_body().collect().await;
    let mut resp = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
    resp.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&addr.to_string()) {
        resp.headers_mut().insert("x-model-sim-pod", v);
    }
    Ok(resp)
}

impl InstantBackend {
    /// Bind 127.0.0.1:0 and serve. Needs a tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let running = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let running = Arc::clone(&running);
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        answer(addr, Arc::clone(&running), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(InstantBackend { addr, task })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for InstantBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_the_bench_model_and_answers_chat_elsewhere() {
        let b = InstantBackend::start().await.unwrap();
        let addr = b.addr();
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
        };
        let listed: serde_json::Value = serde_json::from_str(&get("/v1/models").await).unwrap();
        assert_eq!(listed["data"][0]["id"], MODEL);
        assert!(get("/v1/chat/completions")
            .await
            .contains("chat.completion"));
        assert!(get("/metrics").await.contains("vllm:num_requests_running"));
    }
}
