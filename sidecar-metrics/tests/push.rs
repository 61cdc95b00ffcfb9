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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");

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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
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

    // The proxy holds a generation ahead (e.g. written by another sidecar whose clock is a
    // minute fast, within MAX_GENERATION_LEAD_MS): 409, then overtake.
    let ahead = now_ms() + 60_000;
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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    proxy
        .wait_for("all 7 pods ok", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.len() == 7 && p.pods.iter().all(|p| p.health == Health::Ok))
        })
        .await;
    running.stop().await;
}

/// Scrapes the sidecar counted of `pod`, from its own face.
async fn scrapes_of(face: std::net::SocketAddr, pod: &str) -> u64 {
    let (_, body) = http_get(face, "/metrics").await;
    let key = format!(
        "llm_router_sidecar_scrape_duration_seconds_count{{pool=\"llama\",pod=\"{pod}\"}} "
    );
    body.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `scrape.max_duty`: a pod that takes 30 ms to answer `/metrics` is scraped at most once per
/// 300 ms at a 10 % duty (and stays `ok`), while a quick pod beside it is scraped every round;
/// without the bound the slow one is scraped every round too.
#[tokio::test]
async fn a_slow_pod_is_scraped_no_more_than_its_duty_allows() {
    for (duty, bounded) in [(0.1, true), (0.0, false)] {
        let fleet = FakeFleet::start(2, Answer::Text(vllm_text(1, 1, 0.5))).await;
        let (slow, quick) = (fleet.addrs[0], fleet.addrs[1]);
        let text = vllm_text(0, 2, 0.2);
        fleet.set(slow, Answer::Slow(Duration::from_millis(30), text));
        let proxy = FakeProxy::start().await;
        let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
        cfg.scrape.max_duty = duty;
        let running = sidecar::start(cfg, common::SECRET.into())
            .await
            .expect("start");
        let secs = 1.5;
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let (n_slow, n_quick) = (
            scrapes_of(running.face_addr, &slow.to_string()).await,
            scrapes_of(running.face_addr, &quick.to_string()).await,
        );
        let snaps = proxy.wait_for("a snapshot", LIMIT, |s| !s.is_empty()).await;
        let last = snaps.last().expect("a snapshot");
        let healths: Vec<Health> = last
            .pool("llama")
            .unwrap()
            .pods
            .iter()
            .map(|p| p.health)
            .collect();
        running.stop().await;
        assert_eq!(healths, vec![Health::Ok, Health::Ok], "duty {duty}");
        let most = (secs / 0.3).ceil() as u64 + 1;
        if bounded {
            assert!(
                n_slow >= 2 && n_slow <= most,
                "duty {duty}: {n_slow} scrapes of the slow pod"
            );
            assert!(
                n_quick >= 3 * n_slow,
                "duty {duty}: {n_quick} of the quick one"
            );
        } else {
            assert!(
                n_slow > 2 * most,
                "duty {duty}: {n_slow} scrapes of the slow pod"
            );
        }
    }
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
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
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

/// A proxy holding a generation from the far future (a forged `u64::MAX - 1`, as an old filter
/// would store it): the sidecar does not jump past it — that would put its counter at the end of
/// `u64` (and wrap) — but keeps pushing generations from its clock, counted as stale.
#[tokio::test]
async fn a_generation_from_the_future_is_not_followed() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.2))).await;
    let proxy = FakeProxy::start().await;
    *proxy.stored.lock().expect("lock") = u64::MAX - 1;
    let started = now_ms();
    let cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 5000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let start = std::time::Instant::now();
    while proxy.received().len() < 6 {
        assert!(start.elapsed() < LIMIT, "pushes were not retried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = running.stats.clone();
    running.stop().await;
    let bound = now_ms() + llm_router_snapshot::MAX_GENERATION_LEAD_MS;
    let gens: Vec<u64> = proxy
        .received()
        .into_iter()
        .map(|r| r.snapshot.expect("decodes").generation)
        .collect();
    assert!(
        gens.iter().all(|g| (started..=bound).contains(g)),
        "generations left the clock: {gens:?}"
    );
    assert!(gens.windows(2).all(|w| w[0] < w[1]), "{gens:?}");
    let sum = stats.summary();
    assert_eq!(
        sum.pushes.get("stale").copied(),
        Some(gens.len() as u64),
        "{sum:?}"
    );
}

/// A proxy whose buffer is smaller than the budget answers 413: the sidecar counts and logs it,
/// lowers its budget and trims adapter lists until its pushes fit, instead of repeating the
/// refused push forever.
#[tokio::test]
async fn a_413_lowers_the_budget_until_pushes_fit() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(0, 1, 0.2))).await;
    for (i, a) in fleet.addrs.iter().enumerate() {
        let tag = format!("p{i}");
        let text = vllm_lora_text(
            &adapter_names(&format!("{tag}r"), 600, 30),
            &adapter_names(&format!("{tag}w"), 400, 30),
        );
        fleet.set(*a, Answer::Text(text));
    }
    let proxy = FakeProxy::start().await;
    let limit = 20_000;
    *proxy.max_body.lock().expect("lock") = limit;
    let cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 5000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let snaps = proxy
        .wait_for("an accepted push with adapters", LIMIT, |_| {
            running.stats.summary().pushes.contains_key("accepted")
        })
        .await;
    let accepted = snaps.last().expect("one");
    let adapters: usize = accepted
        .pool("llama")
        .expect("pool")
        .pods
        .iter()
        .filter_map(|p| p.lora.as_ref())
        .map(|l| l.running.len() + l.waiting.len())
        .sum();
    assert!(adapters > 0 && adapters < 2000, "{adapters} adapters");
    assert!(accepted.encode().expect("encodes").len() <= limit);
    let sum = running.stats.summary();
    let refused = sum.pushes.get("too_large").copied().unwrap_or(0);
    // 62 KB → 31 KB → 15.5 KB: two refusals, not a loop.
    assert!((1..=3).contains(&refused), "{sum:?}");
    let (status, text) = http_get(running.face_addr, "/metrics").await;
    assert_eq!(status, 200);
    let (samples, errors) = sidecar_metrics::prom::parse_all(&text);
    assert!(errors.is_empty(), "{errors:?}");
    let get = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.label(k).as_deref() == Some(*v))
            })
            .map(|s| s.value)
    };
    let budget = get("llm_router_sidecar_snapshot_budget_bytes", &[]).expect("budget");
    assert!(budget <= limit as f64, "{budget}");
    assert_eq!(
        get(
            "llm_router_sidecar_pushes_total",
            &[("result", "too_large")]
        ),
        Some(refused as f64)
    );
    let dropped = get(
        "llm_router_sidecar_snapshot_adapters_dropped_total",
        &[("budget", "total"), ("list", "waiting")],
    )
    .expect("dropped");
    assert!(dropped >= 800.0, "{dropped}");
    assert_eq!(
        get(
            "llm_router_sidecar_snapshot_adapters_trimmed",
            &[("budget", "total"), ("list", "waiting")]
        ),
        Some(800.0),
        "all waiting adapters go before running ones"
    );
    running.stop().await;
}

/// A configuration file pushing to `proxy` from the pods of `fleet`, with `rewrites` (YAML, the
/// whole `rewrites:` section or nothing) appended.
fn config_file(proxy: &FakeProxy, fleet: &FakeFleet, rewrites: &str) -> String {
    let pods: Vec<String> = fleet.endpoints().iter().map(|e| format!("{e:?}")).collect();
    format!(
        "push:\n  address: \"{}\"\n  secret: {SECRET}\nscrape:\n  interval_ms: 20\n\
         heartbeat_ms: 1000\nlisten: \"127.0.0.1:0\"\npools:\n  - name: llama\n    \
         cluster: pool_llama\n    models: [m1]\n    discovery:\n      static: [{}]\n{rewrites}",
        proxy.addr,
        pods.join(", ")
    )
}

/// Writes `text` to `path` whole (a rename), so the sidecar never reads half a file.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The rewrites section of the last snapshot: `None` when it has none, else the rules' models.
fn last_rewrites(s: &[llm_router_snapshot::Snapshot]) -> Option<Option<Vec<String>>> {
    let last = s.last()?;
    Some(
        last.rewrites
            .as_ref()
            .map(|rules| rules.iter().map(|r| r.model.clone()).collect()),
    )
}

/// Issue 43: a snapshot carries a rewrites section only when a source gives rules, so the
/// filter's configured rules apply otherwise. The file is re-read while the sidecar runs: its
/// rules reach the snapshot; the section deleted sends no section (not an empty one, which
/// would turn the filter's rules off); `rules: []` sends an empty section (turns them off on
/// purpose); a section without `rules` sends none again.
#[tokio::test]
async fn a_deleted_rewrites_section_sends_no_section_and_an_empty_list_an_empty_one() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.1))).await;
    let proxy = FakeProxy::start().await;
    let path = std::env::temp_dir().join(format!("sidecar-rewrites-{}.yaml", std::process::id()));
    let rules =
        "rewrites:\n  reload_ms: 20\n  rules:\n    - matches: [{model: {value: chat}}]\n      \
                 targets: [{modelRewrite: m1}]\n";
    replace_file(&path, &config_file(&proxy, &fleet, rules));
    let cfg = sidecar_metrics::config::Config::load(&path).expect("the file loads");
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let chat = Some(Some(vec!["chat".to_owned()]));
    proxy
        .wait_for("the file's rule", LIMIT, |s| last_rewrites(s) == chat)
        .await;
    for (what, section, want) in [
        ("no section once the file has none", "", Some(None)),
        (
            "an empty section for `rules: []`",
            "rewrites:\n  rules: []\n",
            Some(Some(vec![])),
        ),
        (
            "no section for a section without rules",
            "rewrites:\n  reload_ms: 20\n",
            Some(None),
        ),
        ("the rule again", rules, chat.clone()),
    ] {
        replace_file(&path, &config_file(&proxy, &fleet, section));
        proxy
            .wait_for(what, LIMIT, |s| last_rewrites(s) == want)
            .await;
    }
    running.stop().await;
    let _ = std::fs::remove_file(&path);
}

/// Issue 43: the targets of the sidecar's rewrite rules that no pool serves (no pool lists them
/// in `models`, no pod reports them as an adapter) are counted, each name once, in
/// `llm_router_sidecar_rewrite_targets_unknown` (and logged); the rules are still sent, the
/// filter decides (its configuration may know the name).
#[tokio::test]
async fn rewrite_targets_in_no_known_pool_are_counted() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.1))).await;
    let proxy = FakeProxy::start().await;
    let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    cfg.rewrites = Some(
        serde_yaml::from_str(
            "reload_ms: 0\nrules:\n\
             - matches: [{model: {value: chat}}]\n  targets: [{modelRewrite: m1}, {modelRewrite: typo}]\n\
             - matches: [{model: {value: chat-2}}]\n  targets: [{modelRewrite: typo}, {modelRewrite: elsewhere}]\n",
        )
        .expect("the rules parse"),
    );
    cfg.validate().expect("valid");
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let snaps = proxy
        .wait_for("the two rules", LIMIT, |s| {
            last_rewrites(s) == Some(Some(vec!["chat".into(), "chat-2".into()]))
        })
        .await;
    let rules = snaps
        .last()
        .and_then(|s| s.rewrites.clone())
        .expect("rules");
    assert_eq!(rules[0].targets[1].model, "typo", "sent as configured");
    let (status, text) = http_get(running.face_addr, "/metrics").await;
    assert_eq!(status, 200);
    let (samples, errors) = sidecar_metrics::prom::parse_all(&text);
    assert!(errors.is_empty(), "{errors:?}");
    let unknown = samples
        .iter()
        .find(|s| s.name == "llm_router_sidecar_rewrite_targets_unknown")
        .map(|s| s.value);
    assert_eq!(
        unknown,
        Some(2.0),
        "typo and elsewhere; m1 is the pool's model"
    );
    running.stop().await;
}
