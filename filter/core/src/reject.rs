//! Rejections: the HTTP status, OpenAI-style JSON error body and headers a client gets when a
//! request cannot be routed.

use serde::Serialize;

/// Why a request was not routed, ready to be sent as a local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    /// OpenAI `error.type`.
    pub kind: &'static str,
    /// OpenAI `error.code`.
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After` (429 and 503 when retrying may help).
    pub retry_after_s: Option<u32>,
    /// Value of the reason header (`rejected-saturated`, `rejected-no-endpoints`, …).
    pub reason: &'static str,
    /// The pool the request was for, when it was resolved (shed, no endpoints); else empty.
    pub pool: String,
    /// The `allow` header (405 only).
    pub allow: Option<Allow>,
}

/// The one method an endpoint serves, for a 405's `allow` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    Post,
    Get,
}

impl Allow {
    pub fn as_str(self) -> &'static str {
        match self {
            Allow::Post => "POST",
            Allow::Get => "GET",
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

/// Longest piece of client text an error message repeats (bytes). serde's messages quote the
/// offending value and the 404 names the model: without a bound a 900 KB string in `stream` or
/// `model` would come back whole in the reply (and in any log of it).
pub const MAX_ECHO_BYTES: usize = 256;

/// `s` cut to [`MAX_ECHO_BYTES`] at a character boundary, with `…` when cut.
fn clip(mut s: String) -> String {
    if s.len() > MAX_ECHO_BYTES {
        let mut end = MAX_ECHO_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

impl Rejection {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status: 400,
            kind: "invalid_request_error",
            code,
            message: clip(message.into()),
            retry_after_s: None,
            reason: "rejected-invalid-request",
            pool: String::new(),
            allow: None,
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Rejection {
            status: 404,
            kind: "invalid_request_error",
            code: "model_not_found",
            message: format!(
                "The model `{}` does not exist or is not served by this gateway.",
                clip(model.to_owned())
            ),
            retry_after_s: None,
            reason: "rejected-unknown-model",
            pool: String::new(),
            allow: None,
        }
    }

    pub fn too_large(limit: usize) -> Self {
        Rejection {
            status: 413,
            kind: "invalid_request_error",
            code: "request_too_large",
            message: format!("Request body is larger than the gateway limit of {limit} bytes."),
            retry_after_s: None,
            reason: "rejected-too-large",
            pool: String::new(),
            allow: None,
        }
    }

    pub fn saturated(pool: &str, retry_after_s: u32) -> Self {
        Rejection {
            status: 429,
            kind: "rate_limit_error",
            code: "pool_saturated",
            message: format!(
                "Every server of pool `{pool}` is saturated; retry after {retry_after_s} s."
            ),
            retry_after_s: Some(retry_after_s),
            reason: "rejected-saturated",
            pool: pool.to_string(),
            allow: None,
        }
    }

    /// A request that could not wait for its pool (its class's queue is full, it waited past
    /// its time to live, or a request of a higher class took its place): 429 with `reason`
    /// (`rejected-queue-full`, `rejected-queue-bytes`, `rejected-queue-timeout`,
    /// `rejected-displaced`).
    pub fn not_queued(pool: &str, reason: &'static str, retry_after_s: u32) -> Self {
        let why = match reason {
            "rejected-queue-timeout" => "waited too long for a free server",
            "rejected-displaced" => "a request of a higher priority took its place in the queue",
            "rejected-deadline" => "could not start within its `x-slo-ttft-ms` objective",
            _ => "the queue for its servers is full",
        };
        Rejection {
            status: 429,
            kind: "rate_limit_error",
            code: "pool_saturated",
            message: format!(
                "Every server of pool `{pool}` is busy and the request {why}; retry after \
                 {retry_after_s} s."
            ),
            retry_after_s: Some(retry_after_s),
            reason,
            pool: pool.to_string(),
            allow: None,
        }
    }

    pub fn no_endpoints(pool: &str, why: &str) -> Self {
        Rejection {
            status: 503,
            kind: "service_unavailable_error",
            code: "no_endpoints",
            message: format!("No usable server in pool `{pool}`: {why}."),
            retry_after_s: Some(1),
            reason: "rejected-no-endpoints",
            pool: pool.to_string(),
            allow: None,
        }
    }

    /// No snapshot has arrived yet and the configuration names no pool: the gateway learns
    /// its pools and models from the snapshot, so it cannot yet tell an unknown model from one
    /// a pod will serve (not a 404, which a client would not retry).
    pub fn no_snapshot_yet() -> Self {
        Rejection {
            status: 503,
            kind: "service_unavailable_error",
            code: "no_endpoints",
            message: "No fleet snapshot has arrived yet: this gateway learns its pools and \
                      models from it."
                .to_string(),
            retry_after_s: Some(1),
            reason: "rejected-no-endpoints",
            pool: String::new(),
            allow: None,
        }
    }

    /// A request on a path the filter does not serve, with `unknown_paths: reject`. The path is
    /// not repeated.
    pub fn path_not_found() -> Self {
        Rejection {
            status: 404,
            kind: "invalid_request_error",
            code: "not_found",
            message: "No such endpoint on this gateway.".into(),
            retry_after_s: None,
            reason: "rejected-unknown-path",
            pool: String::new(),
            allow: None,
        }
    }

    /// An API path with a method it does not serve (`allow` lists the one it does).
    pub fn method_not_allowed(method: &str, allow: Allow) -> Self {
        Rejection {
            status: 405,
            kind: "invalid_request_error",
            code: "method_not_allowed",
            message: format!(
                "Method {} is not allowed on this endpoint; use {}.",
                clip(method.to_owned()),
                allow.as_str()
            ),
            retry_after_s: None,
            reason: "rejected-method-not-allowed",
            pool: String::new(),
            allow: Some(allow),
        }
    }

    /// A `POST` on an API path without a body: there is no model to route on.
    pub fn missing_body() -> Self {
        Rejection::bad_request(
            "missing_body",
            "The request has no body; send a JSON object with `model`.",
        )
    }

    /// This rejection as told to a client that should not learn about the fleet
    /// (`disclose.pool_detail` off): 429 and 503 say that no endpoint is available for the
    /// model, without the pool's name or why its pods are unusable. Everything else (status,
    /// code, reason header, `Retry-After`, the pool for metrics) is kept; other rejections
    /// name no pool and are returned as they are.
    pub fn without_pool_detail(mut self) -> Self {
        self.message = match self.status {
            429 => match self.retry_after_s {
                Some(s) => format!(
                    "No endpoint available for this model: every server is busy; retry after {s} s."
                ),
                None => "No endpoint available for this model: every server is busy.".into(),
            },
            503 => "No endpoint available for this model; retry later.".into(),
            _ => return self,
        };
        self
    }

    /// The `outcome` label of `llm_router_requests_total` for this rejection: `shed` (429),
    /// `no_endpoints` (503), `unknown_model` (404), `too_large` (413), `bad_request` (400).
    pub fn outcome(&self) -> &'static str {
        match self.status {
            429 => "shed",
            503 => "no_endpoints",
            404 => "unknown_model",
            413 => "too_large",
            _ => "bad_request",
        }
    }

    /// The JSON body `{"error":{"message","type","param","code"}}`.
    pub fn body(&self) -> String {
        let b = Body {
            error: ErrorBody {
                message: &self.message,
                kind: self.kind,
                param: None,
                code: self.code,
            },
        };
        serde_json::to_string(&b).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn client_text_is_echoed_at_most_max_echo_bytes() {
        let huge = "é".repeat(100_000);
        let r = Rejection::model_not_found(&huge);
        assert!(
            r.message.len() < MAX_ECHO_BYTES + 100,
            "{}",
            r.message.len()
        );
        assert!(r.message.contains("…` does not exist"));
        let r = Rejection::bad_request("invalid_json", format!("invalid type: {huge}"));
        assert!(r.message.len() <= MAX_ECHO_BYTES + '…'.len_utf8());
        assert!(r.message.ends_with('…'));
        let v: serde_json::Value = serde_json::from_str(&r.body()).unwrap();
        assert_eq!(v["error"]["message"], r.message.as_str());
        // Short messages are left alone.
        let r = Rejection::model_not_found("gpt-9");
        assert_eq!(
            r.message,
            "The model `gpt-9` does not exist or is not served by this gateway."
        );
    }

    #[test]
    fn without_pool_detail_names_no_pool_and_no_health() {
        let r =
            Rejection::no_endpoints("secret-pool", "every pod is failing").without_pool_detail();
        assert_eq!(r.status, 503);
        assert_eq!(r.code, "no_endpoints");
        assert_eq!(r.pool, "secret-pool", "kept for the metrics");
        assert_eq!(r.retry_after_s, Some(1));
        for text in [r.message.as_str(), &r.body()] {
            assert!(
                !text.contains("secret-pool") && !text.contains("failing"),
                "{text}"
            );
        }
        assert!(r.message.contains("No endpoint available for this model"));
        let r = Rejection::saturated("secret-pool", 7).without_pool_detail();
        assert_eq!(
            (r.status, r.code, r.retry_after_s),
            (429, "pool_saturated", Some(7))
        );
        assert!(!r.body().contains("secret-pool"), "{}", r.body());
        assert!(r.message.contains("retry after 7 s"), "{}", r.message);
        // Nothing else changes.
        let m = Rejection::model_not_found("x");
        assert_eq!(m.clone().without_pool_detail(), m);
    }
}
