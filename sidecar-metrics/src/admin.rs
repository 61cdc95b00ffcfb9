//! The sidecar's own HTTP face, its admin endpoints (README "Its own face"): `/metrics` (its
//! numbers in Prometheus text) and `/healthz` (200 while scrape rounds or hub snapshots keep
//! coming, 503 otherwise), with graceful shutdown.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::stats::Stats;

#[derive(Clone)]
struct AdminState {
    stats: Arc<Stats>,
    interval_ms: u64,
}

/// The routes, for `serve` and for tests.
pub fn router(stats: Arc<Stats>, interval_ms: u64) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(AdminState { stats, interval_ms })
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::stats::CONTENT_TYPE)],
        s.stats.render(now_ms()),
    )
}

async fn healthz(State(s): State<AdminState>) -> impl IntoResponse {
    let sum = s.stats.summary();
    // Alive when a round finished recently, or (subscribed to a hub) a hub snapshot was applied
    // recently: five intervals, and never less than two seconds.
    let limit = (s.interval_ms * 5).max(2000);
    let last = sum.last_round_ms.max(sum.hub.last_frame_ms);
    let ok = last > 0 && now_ms().saturating_sub(last) <= limit;
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
