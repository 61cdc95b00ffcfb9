//! Delivering an encoded snapshot to the proxy: `POST {push_path}` on the filter's internal
//! listener, `application/octet-stream`, signed with `x-llm-router-signature: sha256=<hex>`
//! (HMAC-SHA256 of the exact body under the shared secret, from `llm_router_snapshot::sign`;
//! the secret itself never travels). Answered with 200 (accepted), 400 (invalid), 403
//! (forbidden: not signed right, or refused before the signature was checked), 404 (the target
//! is not a listener with the snapshot endpoints) or 409 (stale generation).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub use llm_router_snapshot::SIGNATURE_HEADER;
/// Longest answer body we read (it is a short JSON document).
const MAX_ANSWER: usize = 64 * 1024;

/// Why the push target is unusable.
#[derive(Debug, thiserror::Error)]
pub enum PushSetupError {
    #[error("push target http://{address}{path} is not a valid URI: {reason}")]
    BadUri {
        address: String,
        path: String,
        reason: String,
    },
    #[error("push secret refused: {0}")]
    BadSecret(String),
}

/// How one push ended.
#[derive(Debug, Clone, PartialEq)]
pub enum PushResult {
    Accepted,
    /// 400: the filter could not decode or validate the snapshot.
    Invalid,
    /// 403: the filter refused the push before or at its signature check (details are in
    /// the proxy's log only).
    Forbidden,
    /// 404: the target is not a listener whose filter serves the snapshot endpoints (push to
    /// the internal listener, the one with `snapshot.endpoints: true`).
    NotFound,
    /// 409: the filter holds a newer generation (`newer` when its answer says which).
    Stale {
        newer: Option<u64>,
    },
    /// 413: the proxy's buffer for the push (the internal listener's
    /// `per_connection_buffer_limit_bytes`) is smaller than the snapshot.
    TooLarge,
    OtherStatus(u16),
    Transport(String),
}

impl PushResult {
    /// Label for the `result` of the push counter.
    pub fn label(&self) -> &'static str {
        match self {
            PushResult::Accepted => "accepted",
            PushResult::Invalid => "invalid",
            PushResult::Forbidden => "forbidden",
            PushResult::NotFound => "not_found",
            PushResult::Stale { .. } => "stale",
            PushResult::TooLarge => "too_large",
            PushResult::OtherStatus(_) => "http_error",
            PushResult::Transport(_) => "transport_error",
        }
    }
}

/// The answer, for the log.
#[derive(Debug, Clone)]
pub struct PushOutcome {
    pub result: PushResult,
    pub generation: u64,
    pub created_ms: u64,
    /// Size of the pushed body.
    pub bytes: usize,
    pub body: String,
}

/// Posts snapshots to one target.
#[derive(Clone)]
pub struct Pusher {
    client: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    secret: Vec<u8>,
    timeout: Duration,
}

impl Pusher {
    pub fn new(
        address: &str,
        path: &str,
        secret: &str,
        timeout: Duration,
    ) -> Result<Pusher, PushSetupError> {
        let uri: Uri = format!("http://{address}{path}").parse().map_err(
            |e: hyper::http::uri::InvalidUri| PushSetupError::BadUri {
                address: address.into(),
                path: path.into(),
                reason: e.to_string(),
            },
        )?;
        llm_router_snapshot::check_secret(secret).map_err(PushSetupError::BadSecret)?;
        let secret = secret.as_bytes().to_vec();
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(timeout));
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(conn);
        Ok(Pusher {
            client,
            uri,
            secret,
            timeout,
        })
    }

    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// POSTs `body` (already `Snapshot::encode`d) and classifies the answer.
    pub async fn push(&self, body: Bytes, generation: u64, created_ms: u64) -> PushOutcome {
        let bytes = body.len();
        let out = |result, body| PushOutcome {
            result,
            generation,
            created_ms,
            bytes,
            body,
        };
        let signature = llm_router_snapshot::sign(&self.secret, &body);
        let req = match hyper::Request::post(self.uri.clone())
            .header(SIGNATURE_HEADER, signature)
            .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
            .body(Full::new(body))
        {
            Ok(r) => r,
            Err(e) => return out(PushResult::Transport(e.to_string()), String::new()),
        };
        let work = async {
            let resp = self.client.request(req).await.map_err(|e| {
                let mut s = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(c) = src {
                    s.push_str(": ");
                    s.push_str(&c.to_string());
                    src = c.source();
                }
                s
            })?;
            let status = resp.status().as_u16();
            let limited = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER);
            let text = match limited.collect().await {
                Ok(c) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
                Err(e) => format!("<answer unreadable: {e}>"),
            };
            Ok::<_, String>((status, text))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => out(
                PushResult::Transport(format!("no answer within {:?}", self.timeout)),
                String::new(),
            ),
            Ok(Err(e)) => out(PushResult::Transport(e), String::new()),
            Ok(Ok((status, text))) => {
                let result = match status {
                    200 => PushResult::Accepted,
                    400 => PushResult::Invalid,
                    403 => PushResult::Forbidden,
                    404 => PushResult::NotFound,
                    409 => PushResult::Stale {
                        newer: stored_generation(&text),
                    },
                    413 => PushResult::TooLarge,
                    s => PushResult::OtherStatus(s),
                };
                out(result, text)
            }
        }
    }
}

/// The filter's stored generation from a 409 answer, under any of the names it may use.
fn stored_generation(body: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    [
        "stored_generation",
        "current_generation",
        "current",
        "generation",
    ]
    .iter()
    .find_map(|k| v.get(*k).and_then(|g| g.as_u64()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn stored_generation_from_409() {
        assert_eq!(
            stored_generation(
                r#"{"accepted":false,"reason":"stale generation","stored_generation":42}"#
            ),
            Some(42)
        );
        assert_eq!(
            stored_generation(r#"{"accepted":false,"generation":7}"#),
            Some(7)
        );
        assert_eq!(stored_generation("not json"), None);
    }

    #[test]
    fn bad_targets_are_refused() {
        const OK: &str = "0123456789abcdef0123456789abcdef";
        assert!(Pusher::new("127.0.0.1:1", "/p", OK, Duration::from_secs(1)).is_ok());
        for bad in ["", "s3cret", "change-me", &OK[1..]] {
            match Pusher::new("127.0.0.1:1", "/p", bad, Duration::from_secs(1)) {
                Err(e @ PushSetupError::BadSecret(_)) => {
                    assert!(e.to_string().contains("openssl rand"), "{e}")
                }
                Err(e) => panic!("{bad:?}: {e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
        }
        assert!(matches!(
            Pusher::new("127.0.0.1:1 x", "/p", OK, Duration::from_secs(1)),
            Err(PushSetupError::BadUri { .. })
        ));
    }
}
