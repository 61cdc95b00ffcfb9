//! Fetching one pod's `/metrics` over a shared keep-alive HTTP/1 client, within a time and size
//! bound, and reading it with the engine normaliser.
//!
//! One client serves every pod so connections are reused round after round (a new TCP connection
//! per scrape would cost more CPU than the parse). Each pod's receive buffer is handed back after
//! every scrape and reused, so a steady fleet allocates almost nothing per round.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use llm_router_snapshot::Engine;

use crate::engines::{normalise, NormaliseError, Options, PodMetrics};

/// The scrape client (plain HTTP/1; model servers serve `/metrics` in clear on the pod network).
pub type ScrapeClient = hyper_util::client::legacy::Client<HttpConnector, Empty<Bytes>>;

/// A keep-alive client; idle connections live long enough to span many rounds.
pub fn client() -> ScrapeClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(2)));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(2)
        .build(conn)
}

/// Why a scrape gave no usable pod state.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScrapeError {
    #[error("request failed: {0}")]
    Request(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the body failed: {0}")]
    Body(String),
    #[error("response is not UTF-8 text")]
    NotUtf8,
    #[error("{0}")]
    Unusable(#[from] NormaliseError),
}

impl ScrapeError {
    /// Short label for the `kind` of the error counter.
    pub fn kind(&self) -> &'static str {
        match self {
            ScrapeError::Request(_) => "request",
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Status(_) => "status",
            ScrapeError::TooLarge(_) => "too_large",
            ScrapeError::Body(_) => "body",
            ScrapeError::NotUtf8 => "not_utf8",
            ScrapeError::Unusable(_) => "unusable",
        }
    }
}

/// Fetches `uri` into `buf` (cleared first) within `timeout` and `max_bytes`.
pub async fn fetch(
    client: &ScrapeClient,
    uri: Uri,
    timeout: Duration,
    max_bytes: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ScrapeError> {
    buf.clear();
    let work = async {
        let req = hyper::Request::get(uri)
            .header("accept", "text/plain;version=0.0.4")
            .body(Empty::<Bytes>::new())
            .map_err(|e| ScrapeError::Request(e.to_string()))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| ScrapeError::Request(error_chain(&e)))?;
        let status = resp.status();
        if let Some(len) = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
        {
            if len > max_bytes {
                return Err(ScrapeError::TooLarge(max_bytes));
            }
        }
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ScrapeError::Body(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if buf.len() + data.len() > max_bytes {
                    return Err(ScrapeError::TooLarge(max_bytes));
                }
                buf.extend_from_slice(data);
            }
        }
        if !status.is_success() {
            return Err(ScrapeError::Status(status.as_u16()));
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout(timeout)),
    }
}

/// The full error text including causes (hyper's top-level message is just "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Fetch and read one pod.
pub async fn scrape(
    client: &ScrapeClient,
    uri: Uri,
    engine: Option<Engine>,
    timeout: Duration,
    max_bytes: usize,
    buf: &mut Vec<u8>,
) -> Result<PodMetrics, ScrapeError> {
    fetch(client, uri, timeout, max_bytes, buf).await?;
    let text = std::str::from_utf8(buf).map_err(|_| ScrapeError::NotUtf8)?;
    Ok(normalise(
        text,
        Options {
            engine,
            detailed: false,
        },
    )?)
}
