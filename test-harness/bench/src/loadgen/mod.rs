//! The open-loop load generator: fires every request of a workload at its own time.
//!
//! One dispatcher task sleeps until each arrival and spawns the request; it never waits on a
//! response, so a slow router cannot slow the arrivals down. The run is bounded: requests still
//! open `drain` after the last arrival are cut and counted as timeouts.
//!
//! The folder is what is sent and how: [`arrivals`] (when), [`workload`] (what), [`client`] and
//! [`sse`] (one request and its stream), this file (the open loop), [`instant`] (a backend that
//! answers at once, for the overhead bench).

pub mod arrivals;
pub mod client;
pub mod instant;
pub mod sse;
pub mod workload;

use crate::loadgen::client::{http_client, ms, send, Outcome};
use crate::loadgen::workload::RequestSpec;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How to run a workload.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Full URL of the endpoint, e.g. `http://127.0.0.1:10000/v1/chat/completions`.
    pub url: String,
    /// The same endpoint on further gateway replicas: request `id` goes to the
    /// `id % (1 + len)`-th of `url` and these (a front load balancer spreading requests, so the
    /// turns of one conversation reach different replicas). Empty for one gateway.
    pub replica_urls: Vec<String>,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// How long to wait for open requests after the last arrival.
    pub drain: Duration,
    /// Upper bound on any single request.
    pub request_timeout: Duration,
    /// When arrival offset 0 is (so a caller can schedule work at fixed offsets, e.g. the
    /// measurement window's start); `None` = 50 ms from now.
    pub start: Option<Instant>,
}

/// One request's measurement plus what was asked.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Index in the workload.
    pub id: u64,
    /// Model or adapter asked for.
    pub model: String,
    /// Scheduled send time, ms from the start.
    pub at_ms: f64,
    /// How late the dispatcher actually sent it, ms (load-generator health).
    pub lag_ms: f64,
    /// The value of the request's tagging header (its objective, its tenant), if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The shared prefix (document or system prompt) the request read, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub group: Option<u32>,
    /// What came back.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// All samples of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// One per request of the workload, in workload order.
    pub samples: Vec<Sample>,
    /// From the start to the last completion (or cut), seconds.
    pub wall_s: f64,
}

/// Errors building a run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The URL did not parse.
    #[error("invalid URL {url}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// Parser message.
        reason: String,
    },
}

/// Run a workload against `opts.url` and collect every sample.
pub async fn run(reqs: &[RequestSpec], opts: &RunOptions) -> Result<RunResult, LoadError> {
    let uris = std::iter::once(&opts.url)
        .chain(&opts.replica_urls)
        .map(|u| {
            u.parse::<hyper::Uri>().map_err(|e| LoadError::Url {
                url: u.clone(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let client = http_client();
    let headers = Arc::new(opts.headers.clone());
    let start = opts
        .start
        .unwrap_or_else(|| Instant::now() + Duration::from_millis(50));
    let last_at = reqs.iter().map(|r| r.at).max().unwrap_or_default();
    let cut = start + last_at + opts.drain;
    let mut set = JoinSet::new();
    for r in reqs {
        let when = start + r.at;
        tokio::time::sleep_until(when.into()).await;
        let lag = Instant::now().saturating_duration_since(when);
        let uri = uris[(r.id % uris.len() as u64) as usize].clone();
        let (client, mut headers) = (client.clone(), headers.clone());
        if let Some(h) = &r.header {
            Arc::make_mut(&mut headers).push(h.clone());
        }
        let tag = r.header.as_ref().map(|(_, v)| v.clone());
        let body = r.body.clone();
        let (id, model, at, group) = (r.id, r.model.clone(), r.at, r.prefix_group);
        let deadline = (Instant::now() + opts.request_timeout).min(cut);
        set.spawn(async move {
            let sent = Instant::now();
            let outcome =
                match tokio::time::timeout_at(deadline.into(), send(&client, &uri, body, &headers))
                    .await
                {
                    Ok(o) => o,
                    Err(_) => Outcome {
                        error: Some("timeout".to_string()),
                        e2e_ms: ms(sent.elapsed()),
                        ..Outcome::default()
                    },
                };
            Sample {
                id,
                model,
                at_ms: ms(at),
                lag_ms: ms(lag),
                tag,
                group,
                outcome,
            }
        });
    }
    let mut samples = Vec::with_capacity(reqs.len());
    while let Some(res) = set.join_next().await {
        match res {
            Ok(s) => samples.push(s),
            Err(e) => samples.push(Sample {
                id: u64::MAX,
                model: String::new(),
                at_ms: 0.0,
                lag_ms: 0.0,
                tag: None,
                group: None,
                outcome: Outcome {
                    error: Some(format!("task failed: {e}")),
                    ..Outcome::default()
                },
            }),
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    samples.sort_by_key(|s| s.id);
    Ok(RunResult { samples, wall_s })
}
