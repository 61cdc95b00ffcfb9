//! Applying the core's decision to a stream, from the HTTP context (a request routed at once)
//! or from the root context (a request dispatched from the waiting room): the routing headers,
//! the model rewrite, the route cache and the metrics, or the rejection's local reply. What a
//! routed stream carries from its decision to its response and end is a
//! [`crate::stream::RouteState`].

use crate::host;
use crate::metrics::Metrics;
use crate::stream::{InFlight, RouteState, UsageTrack};
use crate::worker::Worker;
use llm_router_core::request::{ApiKind, ParsedRequest};
use llm_router_core::usage::Scanner;
use llm_router_core::{Config, Rejection, RouteMode};
use proxy_wasm::types::LogLevel;
use std::borrow::Cow;

/// Longest `x-llm-router-scores` value (bytes).
const SCORES_HEADER_MAX: usize = 512;

/// The request a decision is applied to: the effective stream's parsed body and where its bytes
/// sit in the host.
pub struct Request<'a> {
    /// The stream's context id (for log lines).
    pub id: u32,
    pub kind: ApiKind,
    pub parsed: &'a ParsedRequest<'a>,
    pub body: &'a [u8],
    /// The body's size in the host's buffer.
    pub size: usize,
    /// Whether the request declared a `content-length` (a rewritten body gets its new one).
    pub content_length: bool,
}

/// Applies a routing decision to the effective stream: the cluster and endpoint headers, the
/// body's model rewrite, the route cache, the metrics; returns the stream's per-request state.
pub fn apply(
    w: &mut Worker,
    req: &Request<'_>,
    routed: llm_router_core::Route,
    now_ns: u64,
) -> RouteState {
    let mut out = RouteState::default();
    set_route(&w.router.config, req, &routed);
    if w.router.config.debug_scores {
        out.scores = Some(llm_router_core::metrics::scores_header(
            routed.mode.name(),
            &routed.scores,
            SCORES_HEADER_MAX,
        ));
    }
    count_routed(&mut w.metrics, req.parsed, &routed, now_ns);
    // The name a rewrite rule chose, for the response.
    out.served_model = routed.served_model.clone();
    // Usage is only looked for where the response carries it: unstreamed replies, streams
    // asked for it, and the APIs whose streams always report it.
    let parsed = req.parsed;
    let reports_usage = !parsed.stream
        || parsed.include_usage
        || matches!(req.kind, ApiKind::Messages | ApiKind::Responses);
    if reports_usage {
        out.usage = Some(UsageTrack {
            pool: routed.pool.clone(),
            model: parsed.model.to_string(),
            reading: false,
            scanner: Scanner::default(),
        });
    }
    if w.debug {
        host::log(
            LogLevel::Debug,
            &format!(
                "llm-router[{}]: model {} → pool {} [{}] {:?}",
                req.id,
                parsed.model,
                routed.pool,
                routed.mode.name(),
                routed.scores
            ),
        );
    }
    out.in_flight = in_flight(req, routed, now_ns);
    out
}

/// Tells Envoy where the effective stream goes: the cluster and endpoint headers, the model
/// rewrite, then a new route.
fn set_route(cfg: &Config, req: &Request<'_>, routed: &llm_router_core::Route) {
    host::set_request_header(&cfg.cluster_header, &routed.cluster);
    if !routed.endpoints.is_empty() {
        host::set_request_header(&cfg.endpoint_header, &routed.endpoints.join(","));
    }
    if let Some(new_model) = &routed.rewrite {
        rewrite_model(cfg, req, new_model);
    }
    if !host::clear_route_cache() {
        host::log(
            LogLevel::Warn,
            "llm-router: clear_route_cache is not available in this host",
        );
    }
}

/// Replaces the model name in the effective stream's body with `new_model` (and says so in
/// the rewrite header).
fn rewrite_model(cfg: &Config, req: &Request<'_>, new_model: &str) {
    let body = req.body;
    let (start, end) = req.parsed.model_span;
    let quoted = serde_json::Value::String(new_model.to_string()).to_string();
    if let (Some(head), Some(tail)) = (body.get(..start), body.get(end..)) {
        let mut new_body = Vec::with_capacity(body.len() + quoted.len());
        new_body.extend_from_slice(head);
        new_body.extend_from_slice(quoted.as_bytes());
        new_body.extend_from_slice(tail);
        if host::replace_request_body(req.size, &new_body) {
            // A chunked request stays chunked; a sized one gets its new size.
            if req.content_length {
                host::set_request_header("content-length", &new_body.len().to_string());
            }
            host::set_request_header(&cfg.rewrite_header, new_model);
        }
    }
}

/// The decision's time, the routed request and its first choice, in the metrics.
fn count_routed(
    m: &mut Metrics,
    parsed: &ParsedRequest<'_>,
    routed: &llm_router_core::Route,
    now_ns: u64,
) {
    let outcome = match routed.mode {
        RouteMode::Scored => llm_router_core::metrics::ROUTED,
        RouteMode::LeastInflight | RouteMode::Fallback => routed.mode.name(),
    };
    m.decision_us(host::now_nanos().saturating_sub(now_ns) / 1000);
    m.request(
        &routed.pool,
        &parsed.model,
        routed.served_model.as_deref().unwrap_or_default(),
        outcome,
    );
    if let Some(first) = routed.endpoints.first() {
        m.picked(&routed.pool, first, routed.prefix_hit, routed.lora_hit);
    }
}

/// What the routed request's response and end need of its in-flight count.
fn in_flight(req: &Request<'_>, routed: llm_router_core::Route, now_ns: u64) -> Option<InFlight> {
    let pod = routed.inflight_pod?;
    let lora = routed.adapter.map(|a| (pod.clone(), a));
    Some(InFlight {
        pool: routed.pool,
        pod,
        pending: routed.pending_tokens,
        work: routed.work_tokens,
        sent_ns: now_ns,
        observe: req.parsed.stream || req.kind == ApiKind::Embeddings,
        streamed: req.parsed.stream,
        status: 0,
        lora,
    })
}

/// `content-type: application/json` and `extra`.
pub fn json_headers<'a>(extra: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(extra);
    h
}

/// `r` as clients may see it: pool names and health stay out of the body unless
/// `disclose.pool_detail` is on.
pub fn disclosed<'r>(cfg: &Config, r: &'r Rejection) -> Cow<'r, Rejection> {
    if !cfg.disclose.pool_detail && !r.pool.is_empty() {
        Cow::Owned(r.clone().without_pool_detail())
    } else {
        Cow::Borrowed(r)
    }
}

/// Counts the API request `r` refused; `model` is its model when it resolved to `r.pool`.
pub fn count_rejection(m: &mut Metrics, r: &Rejection, model: &str) {
    // Only a resolved model is a label value: client text never becomes a stat name.
    let model = if r.pool.is_empty() { "" } else { model };
    m.request(&r.pool, model, "", r.outcome());
}

/// Sends `r` as the effective stream's local reply (uncounted).
pub fn send_rejection(cfg: &Config, r: &Rejection) {
    let retry = r.retry_after_s.map(|s| s.to_string());
    let mut headers = vec![(cfg.reason_header.as_str(), r.reason)];
    if let Some(s) = &retry {
        headers.push(("retry-after", s.as_str()));
    }
    if let Some(allow) = r.allow {
        headers.push(("allow", allow.as_str()));
    }
    host::send_response(r.status, &json_headers(&headers), r.body().as_bytes());
}

/// Answers the effective stream with `r` (redacted unless `disclose.pool_detail`), counted:
/// a request the root context refuses from the waiting room.
pub fn send_reply(w: &mut Worker, r: &Rejection, model: &str) {
    let r = disclosed(&w.router.config, r);
    send_rejection(&w.router.config, &r);
    count_rejection(&mut w.metrics, &r, model);
}
