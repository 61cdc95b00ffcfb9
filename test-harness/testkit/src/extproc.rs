//! The no-op external processor (`test-harness/extproc-noop`) as a child process: the far end of
//! [`crate::EnvoySpec::ext_proc`], for the endpoint-picker floor of the overhead bench and its
//! end-to-end test.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::http::blocking_get;
use crate::server::{start_on_free_port, ServerProcess};

/// Starts `target/release/extproc-noop --listen 127.0.0.1:<free port>` and waits for its
/// HTTP/1.1 `/health` (blocking; [`start_on_free_port`]).
pub fn start_extproc_noop_blocking() -> Result<ServerProcess> {
    start_on_free_port("extproc-noop", |addr| {
        vec!["--listen".to_string(), addr.to_string()]
    })
}

/// [`start_extproc_noop_blocking`] without blocking the async runtime.
pub async fn start_extproc_noop() -> Result<ServerProcess> {
    tokio::task::spawn_blocking(start_extproc_noop_blocking)
        .await
        .map_err(|e| Error::Format {
            what: "extproc-noop start task".into(),
            reason: e.to_string(),
        })?
}

/// The counts of the extproc-noop at `addr` (its `GET /stats`): `streams` (gRPC streams, one
/// per HTTP request Envoy processed), `request_headers`, `request_body`, … (messages answered),
/// `body_bytes`.
pub fn extproc_stats(addr: SocketAddr) -> Result<Value> {
    let (status, body) = blocking_get(addr, "/stats", Duration::from_secs(5))?;
    if status != 200 {
        return Err(Error::Format {
            what: format!("extproc-noop {addr} /stats"),
            reason: format!("status {status}: {}", body.trim()),
        });
    }
    serde_json::from_str(&body).map_err(|e| Error::Format {
        what: format!("extproc-noop {addr} /stats"),
        reason: e.to_string(),
    })
}
