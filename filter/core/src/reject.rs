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

impl Rejection {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status: 400,
            kind: "invalid_request_error",
            code,
            message: message.into(),
            retry_after_s: None,
            reason: "rejected-invalid-request",
            pool: String::new(),
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Rejection {
            status: 404,
            kind: "invalid_request_error",
            code: "model_not_found",
            message: format!(
                "The model `{model}` does not exist or is not served by this gateway."
            ),
            retry_after_s: None,
            reason: "rejected-unknown-model",
            pool: String::new(),
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
        }
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
