//! The sidecar's own HTTP face: `/metrics` (its numbers in Prometheus text) and `/healthz`
//! (200 while scrape rounds keep happening, 503 otherwise), with graceful shutdown.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;

use crate::sidecar::now_ms;
use crate::stats::Stats;

#[derive(Clone)]
struct FaceState {
    stats: Arc<Stats>,
    interval_ms: u64,
}

/// The routes, for `serve` and for tests.
pub fn router(stats: Arc<Stats>, interval_ms: u64) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(FaceState { stats, interval_ms })
}

async fn metrics(State(s): State<FaceState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::stats::CONTENT_TYPE)],
        s.stats.render(now_ms()),
    )
}

async fn healthz(State(s): State<FaceState>) -> impl IntoResponse {
    let sum = s.stats.summary();
    // Alive when a round finished recently: five intervals, and never less than two seconds.
    let limit = (s.interval_ms * 5).max(2000);
    let ok = sum.rounds > 0 && now_ms().saturating_sub(sum.last_round_ms) <= limit;
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(
            serde_json::json!({ "status": if ok { "ok" } else { "not scraping" }, "summary": sum }),
        ),
    )
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    stats: Arc<Stats>,
    interval_ms: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = router(stats, interval_ms);
    let stop = async move {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(error = %e, "the /metrics listener failed");
    }
}
