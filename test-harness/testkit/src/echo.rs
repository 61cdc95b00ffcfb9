//! A tiny in-process HTTP backend for tests that need an upstream before (or instead of)
//! model-sim: it answers every request with JSON naming its own address and echoing what it got,
//! can stream a server-sent-events body, and can be told to answer with another status.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result};

/// How many requests [`EchoBackend::requests`] keeps (the oldest are dropped first).
pub const RECORDED_REQUESTS: usize = 1000;

/// How an [`EchoBackend`] answers.
#[derive(Debug, Clone)]
pub struct EchoConfig {
    /// Status of every answer (default 200); can be changed later with
    /// [`EchoBackend::set_status`].
    pub status: u16,
    /// Wait this long before answering (default none).
    pub delay: Duration,
    /// Number of `data:` events before `data: [DONE]` in a streamed answer (default 3).
    pub sse_events: usize,
    /// Pause between streamed events (default 10 ms).
    pub sse_interval: Duration,
    /// Stream every answer, not only those whose JSON body has `"stream": true`.
    pub always_stream: bool,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            status: 200,
            delay: Duration::ZERO,
            sse_events: 3,
            sse_interval: Duration::from_millis(10),
            always_stream: false,
        }
    }
}

/// One request as the backend saw it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower-case.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct State {
    addr: SocketAddr,
    config: EchoConfig,
    status: AtomicU16,
    count: AtomicU64,
    recorded: Mutex<Vec<RecordedRequest>>,
}

/// A running echo server on `127.0.0.1:<free port>`; stops (with its connections) on drop.
///
/// Every answer carries `x-echo-backend: 127.0.0.1:PORT` and, like model-sim,
/// `x-model-sim-pod: 127.0.0.1:PORT`. A plain answer is JSON
/// `{"backend", "method", "path", "headers": {..}, "body": <JSON or text>}`; a streamed one
/// (`text/event-stream`) is `sse_events` events `data: {"backend":..,"index":i}` then
/// `data: [DONE]`.
pub struct EchoBackend {
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for EchoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoBackend")
            .field("addr", &self.state.addr)
            .finish()
    }
}

impl EchoBackend {
    /// Starts a backend with the default [`EchoConfig`]. Needs a tokio runtime.
    pub async fn start() -> Result<Self> {
        Self::start_with(EchoConfig::default()).await
    }

    /// Starts a backend answering as `config` says. Needs a tokio runtime.
    pub async fn start_with(config: EchoConfig) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Error::io("bind", "127.0.0.1:0", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr of", "127.0.0.1:0", e))?;
        let state = Arc::new(State {
            addr,
            status: AtomicU16::new(config.status),
            config,
            count: AtomicU64::new(0),
            recorded: Mutex::new(Vec::new()),
        });
        let serving = state.clone();
        let task = tokio::spawn(async move {
            // Owned here: aborting this task drops the set, which aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let state = serving.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(EchoBackend { state, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// Requests answered (or being answered) so far.
    pub fn request_count(&self) -> u64 {
        self.state.count.load(Ordering::SeqCst)
    }

    /// The last [`RECORDED_REQUESTS`] requests, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        match self.state.recorded.lock() {
            Ok(list) => list.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Answers with `status` from now on.
    pub fn set_status(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
    }
}

impl Drop for EchoBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type EchoBody = BoxBody<Bytes, Infallible>;

async fn answer(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<EchoBody>, Infallible> {
    state.count.fetch_add(1, Ordering::SeqCst);
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json_body: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    {
        let mut list = match state.recorded.lock() {
            Ok(list) => list,
            Err(poisoned) => poisoned.into_inner(),
        };
        if list.len() >= RECORDED_REQUESTS {
            list.remove(0);
        }
        list.push(RecordedRequest {
            method: method.clone(),
            path: path.clone(),
            headers: headers.clone(),
            body: body.clone(),
        });
    }
    if !state.config.delay.is_zero() {
        tokio::time::sleep(state.config.delay).await;
    }
    let status = state.status.load(Ordering::SeqCst);
    let backend = state.addr.to_string();
    let stream = state.config.always_stream
        || json_body
            .as_ref()
            .and_then(|b| b.get("stream"))
            .and_then(|s| s.as_bool())
            .unwrap_or(false);
    let builder = Response::builder()
        .status(status)
        .header("x-echo-backend", &backend)
        .header("x-model-sim-pod", &backend);
    let response = if stream {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let events = state.config.sse_events;
        let interval = state.config.sse_interval;
        let name = backend.clone();
        tokio::spawn(async move {
            for index in 0..events {
                let event = serde_json::json!({"backend": name, "index": index});
                if tx
                    .send(Bytes::from(format!("data: {event}\n\n")))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(interval).await;
            }
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        });
        builder
            .header("content-type", "text/event-stream")
            .body(ChannelBody(rx).boxed())
    } else {
        let headers_json: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let echoed = json_body.unwrap_or_else(|| {
            serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
        });
        let doc = serde_json::json!({
            "backend": backend,
            "method": method,
            "path": path,
            "headers": headers_json,
            "body": echoed,
        });
        builder
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(doc.to_string())).boxed())
    };
    Ok(response.unwrap_or_else(|_| {
        let mut fallback = Response::new(Full::new(Bytes::from_static(b"bad status")).boxed());
        *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    }))
}

/// A response body fed by a channel: each message is one data frame.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|data| Ok(Frame::data(data))))
    }
}
