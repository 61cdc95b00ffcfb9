//! Fetching one pod's `/metrics` over its own keep-alive HTTP/1 connection ([`crate::http1`]),
//! within a time and size bound, and reading it with the engine normaliser.
//!
//! Each pod keeps its connection and its receive buffers between scrapes, so a steady fleet
//! opens no connections and allocates almost nothing per round.

use std::time::Duration;

use llm_router_snapshot::Engine;

use crate::engines::{normalise, NormaliseError, Options, PodMetrics};
use crate::http1::{self, Conn, HttpError, Target};

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

/// What a pod keeps between scrapes: its connection and buffers.
#[derive(Default)]
pub struct PodIo {
    pub conn: Conn,
    raw: Vec<u8>,
    body: Vec<u8>,
}

/// Fetch and read one pod. The whole exchange is bounded by `timeout`; on a timeout the
/// connection is dropped (a fresh one is opened next time).
pub async fn scrape(
    target: &Target,
    io: &mut PodIo,
    engine: Option<Engine>,
    timeout: Duration,
    max_bytes: usize,
) -> Result<PodMetrics, ScrapeError> {
    let connect_timeout = timeout.min(Duration::from_secs(2));
    let mut conn = std::mem::take(&mut io.conn);
    let got = tokio::time::timeout(
        timeout,
        http1::get(
            &mut conn,
            target,
            &mut io.raw,
            &mut io.body,
            max_bytes,
            connect_timeout,
        ),
    )
    .await;
    let answer = match got {
        Err(_) => return Err(ScrapeError::Timeout(timeout)),
        Ok(Err(HttpError::TooLarge(n))) => return Err(ScrapeError::TooLarge(n.min(max_bytes))),
        Ok(Err(e)) => return Err(ScrapeError::Request(e.to_string())),
        Ok(Ok(a)) => a,
    };
    io.conn = conn;
    if !(200..300).contains(&answer.status) {
        return Err(ScrapeError::Status(answer.status));
    }
    // The body is read in place from the receive buffer (or the chunk-decoded one): no copy.
    let text =
        std::str::from_utf8(answer.body(&io.raw, &io.body)).map_err(|_| ScrapeError::NotUtf8)?;
    Ok(normalise(
        text,
        Options {
            engine,
            detailed: false,
        },
    )?)
}
