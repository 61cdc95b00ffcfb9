//! The scrape → snapshot → push loop against local fake pods and a fake proxy: the push
//! contract (headers, body that `Snapshot::decode` accepts), change-only pushes with a heartbeat,
//! generation order, failing / stale pods, retries, 409 recovery, and the sidecar's own face.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use llm_router_snapshot::{Engine, Health};
use sidecar_metrics::config::Discovery;
use sidecar_metrics::sidecar::{self, now_ms};

const LIMIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn pushes_follow_the_contract_only_on_change_or_heartbeat() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(0, 0, 0.1))).await;
    let proxy = FakeProxy::start().await;
    let started_ms = now_ms();
    let heartbeat = 400;
    let cfg = config(
        proxy.addr,
        Discovery::Static(fleet.endpoints()),
        20,
        heartbeat,
    );
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");

    let all_ok = |s: &llm_router_snapshot::Snapshot| {
        s.pool("llama")
            .is_some_and(|p| p.pods.len() == 2 && p.pods.iter().all(|p| p.health == Health::Ok))
    };
    let snaps = proxy
        .wait_for("both pods ok", LIMIT, |s| s.iter().any(all_ok))
        .await;
    let first_ok = snaps.iter().find(|s| all_ok(s)).expect("found");
    let pool = first_ok.pool("llama").expect("pool");
    assert_eq!(pool.cluster, "pool_llama");
    assert_eq!(pool.models, vec!["m1"]);
    assert_eq!(pod_addrs(first_ok), fleet.endpoints());
    for p in &pool.pods {
        assert_eq!(p.engine, Engine::Vllm);
        assert_eq!((p.waiting, p.running, p.kv_usage), (0, 0, Some(0.1)));
        assert_eq!((p.block_size, p.num_blocks), (16, 1000));
        assert!(p.scraped_at_ms >= started_ms);
    }

    // A pod's load changes: the next push carries it.
    let busy = fleet.addrs[0];
    fleet.set(busy, Answer::Text(vllm_text(5, 3, 0.7)));
    let snaps = proxy
        .wait_for("the busy pod", LIMIT, |s| {
            s.iter().any(|s| {
                s.pool("llama").is_some_and(|p| {
                    p.pods
                        .iter()
                        .any(|p| p.address == busy.to_string() && p.waiting == 5 && p.running == 3)
                })
            })
        })
        .await;
    let changed_at = snaps.len();
    // Nothing changes any more: the next push must be a heartbeat, no sooner than heartbeat_ms.
    let snaps = proxy
        .wait_for("a heartbeat", LIMIT, |s| s.len() > changed_at + 1)
        .await;
    running.stop().await;

    let received = proxy.received();
    assert!(received.len() >= 3);
    for r in &received {
        assert!(r.signed, "push without a valid signature");
        assert_eq!(r.plain_secret, None, "the secret must not travel");
        assert_eq!(r.content_type.as_deref(), Some("application/octet-stream"));
        assert!(r.snapshot.is_ok(), "{:?}", r.snapshot);
    }
    for w in snaps.windows(2) {
        assert!(
            w[1].generation > w[0].generation,
            "generations must increase"
        );
        if w[1].same_state(&w[0]) {
            assert!(
                w[1].created_ms - w[0].created_ms >= heartbeat,
                "an unchanged snapshot was pushed {} ms after the previous one (heartbeat {heartbeat})",
                w[1].created_ms - w[0].created_ms
            );
        }
    }
    assert!(
        snaps[0].generation >= started_ms,
        "generation starts from the clock"
    );
    let heartbeat_snap = &snaps[changed_at];
    assert!(
        heartbeat_snap.same_state(&snaps[changed_at - 1]),
        "the push after the change was not a heartbeat"
    );
}

/// "The last snapshot has pod `addr` and it satisfies `f`."
fn pod_is(
    addr: &str,
    f: fn(&llm_router_snapshot::Pod) -> bool,
) -> impl Fn(&[llm_router_snapshot::Snapshot]) -> bool {
    let addr = addr.to_owned();
    move |s| {
        s.last()
            .and_then(|s| s.pool("llama"))
            .is_some_and(|p| p.pods.iter().any(|p| p.address == addr && f(p)))
    }
}

#[tokio::test]
async fn failing_and_stale_pods_are_marked_and_recover() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(1, 2, 0.3))).await;
    let proxy = FakeProxy::start().await;
    let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    cfg.pod_stale_after_ms = 150;
    cfg.scrape.timeout_ms = 600;
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");
    let (a, b) = (fleet.addrs[0].to_string(), fleet.addrs[1].to_string());
    proxy
        .wait_for(
            "pod a ok",
            LIMIT,
            pod_is(&a, |p| p.health == Health::Ok && p.waiting == 1),
        )
        .await;

    // Errors: failing, with a count, and the last good figures kept.
    fleet.set(fleet.addrs[0], Answer::Status(500));
    let snaps = proxy
        .wait_for(
            "pod a failing",
            LIMIT,
            pod_is(&a, |p| p.health == Health::Failing),
        )
        .await;
    let p = snaps
        .last()
        .and_then(|s| s.pool("llama"))
        .and_then(|p| p.pods.iter().find(|p| p.address == a))
        .cloned();
    let p = p.expect("pod a");
    assert!(p.failures >= 1);
    assert_eq!((p.waiting, p.running, p.kv_usage), (1, 2, Some(0.3)));
    // Failures are reported up to the cap, then the snapshot stops changing.
    proxy
        .wait_for(
            "failures at the cap",
            LIMIT,
            pod_is(&a, |p| {
                u32::from(p.failures) == sidecar::MAX_REPORTED_FAILURES
            }),
        )
        .await;

    // Hanging: stale first (no fresh scrape), failing once the timeout fires.
    fleet.set(fleet.addrs[1], Answer::Hang);
    proxy
        .wait_for(
            "pod b stale",
            LIMIT,
            pod_is(&b, |p| p.health == Health::Stale),
        )
        .await;
    proxy
        .wait_for(
            "pod b failing",
            LIMIT,
            pod_is(&b, |p| p.health == Health::Failing),
        )
        .await;

    // Both answer again.
    fleet.set(fleet.addrs[0], Answer::Text(vllm_text(0, 0, 0.0)));
    fleet.set(fleet.addrs[1], Answer::Text(vllm_text(0, 0, 0.0)));
    proxy
        .wait_for("both ok again", LIMIT, |s| {
            s.last().and_then(|s| s.pool("llama")).is_some_and(|p| {
                p.pods
                    .iter()
                    .all(|p| p.health == Health::Ok && p.failures == 0)
            })
        })
        .await;
    let (status, body) = http_get(running.face_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!(
            "llm_router_sidecar_scrape_failures_total{{pool=\"llama\",pod=\"{a}\",kind=\"status\"}}"
        )),
        "{body}"
    );
    assert!(
        body.contains(&format!(
            "llm_router_sidecar_scrape_failures_total{{pool=\"llama\",pod=\"{b}\",kind=\"timeout\"}}"
        )),
        "{body}"
    );
    running.stop().await;
}

#[tokio::test]
async fn failed_pushes_are_retried_and_a_newer_proxy_generation_is_overtaken() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.2))).await;
    let proxy = FakeProxy::start().await;
    *proxy.status.lock().expect("lock") = 503;
    let cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 5000);
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");
    // Unchanged state, heartbeat far away: only the retry rule makes these pushes happen.
    let start = std::time::Instant::now();
    while proxy.received().len() < 4 {
        assert!(start.elapsed() < LIMIT, "failed pushes were not retried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failed = running
        .stats
        .summary()
        .pushes
        .get("http_error")
        .copied()
        .unwrap_or(0);
    assert!(failed >= 3, "{failed} failed pushes counted");

    // The proxy holds a generation far ahead (e.g. written by another sidecar): 409, then overtake.
    let ahead = now_ms() + 1_000_000_000;
    *proxy.stored.lock().expect("lock") = ahead;
    *proxy.status.lock().expect("lock") = 200;
    let snaps = proxy
        .wait_for("an accepted push", LIMIT, |_| {
            running.stats.summary().pushes.contains_key("accepted")
        })
        .await;
    assert!(
        snaps.iter().any(|s| s.generation <= ahead),
        "a stale push was expected first"
    );
    let sum = running.stats.summary();
    assert!(
        sum.pushes.get("stale").copied().unwrap_or(0) >= 1,
        "{sum:?}"
    );
    assert!(sum.last_accepted_generation > ahead);
    running.stop().await;
}

#[tokio::test]
async fn face_serves_metrics_and_health_and_stops() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 0, 0.0))).await;
    let proxy = FakeProxy::start().await;
    let cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");
    proxy.wait_for("a push", LIMIT, |s| !s.is_empty()).await;
    let face = running.face_addr;
    // The accepted-push counter is updated when the answer arrives; wait for it.
    let start = std::time::Instant::now();
    let body = loop {
        let (status, body) = http_get(face, "/metrics").await;
        assert_eq!(status, 200);
        if body.contains("llm_router_sidecar_pushes_total{result=\"accepted\"} 1")
            || body.contains("llm_router_sidecar_pushes_total{result=\"accepted\"} 2")
        {
            break body;
        }
        assert!(start.elapsed() < LIMIT, "{body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (samples, errors) = sidecar_metrics::prom::parse_all(&body);
    assert!(errors.is_empty(), "{errors:?}");
    let pod = fleet.addrs[0].to_string();
    assert!(samples.iter().any(
        |s| s.name == "llm_router_sidecar_scrape_duration_seconds_count"
            && s.label("pod").as_deref() == Some(pod.as_str())
            && s.value >= 1.0
    ));
    let age = samples
        .iter()
        .find(|s| s.name == "llm_router_sidecar_snapshot_age_seconds")
        .map(|s| s.value);
    assert!(age.is_some_and(|a| a >= 0.0), "{age:?}");
    let (status, body) = http_get(face, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    running.stop().await;
    assert!(
        tokio::net::TcpStream::connect(face).await.is_err(),
        "face still listening after stop"
    );
}

#[tokio::test]
async fn more_pods_than_the_concurrency_bound_all_get_scraped() {
    let fleet = FakeFleet::start(7, Answer::Text(vllm_text(1, 1, 0.5))).await;
    let proxy = FakeProxy::start().await;
    let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    cfg.scrape.concurrency = 2;
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");
    proxy
        .wait_for("all 7 pods ok", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.len() == 7 && p.pods.iter().all(|p| p.health == Health::Ok))
        })
        .await;
    running.stop().await;
}

#[tokio::test]
async fn a_pod_that_refuses_the_name_filter_is_scraped_plain() {
    // Answers 400 to any query string, like a strict server would.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let queries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let q = queries.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(
            move |axum::extract::RawQuery(query): axum::extract::RawQuery| {
                let q = q.clone();
                async move {
                    if query.is_some() {
                        q.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        (axum::http::StatusCode::BAD_REQUEST, String::new())
                    } else {
                        (axum::http::StatusCode::OK, vllm_text(3, 4, 0.5))
                    }
                }
            },
        ),
    );
    let server = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let proxy = FakeProxy::start().await;
    let cfg = config(
        proxy.addr,
        Discovery::Static(vec![addr.to_string()]),
        20,
        1000,
    );
    assert!(cfg.scrape.name_filter);
    let running = sidecar::start(cfg, "s3cret".into()).await.expect("start");
    proxy
        .wait_for("the pod scraped without the query", LIMIT, |s| {
            s.last().and_then(|s| s.pool("llama")).is_some_and(|p| {
                p.pods
                    .iter()
                    .all(|p| p.health == Health::Ok && p.waiting == 3)
            })
        })
        .await;
    running.stop().await;
    assert_eq!(
        queries.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the filtered path was tried once"
    );
    server.abort();
}
