//! Four gateways (real Envoy + the real filter `.wasm`, each with its `sidecar-metrics`) follow
//! two hubs (`sidecar-metrics run --mode hub`) that scrape two model-sim pods, under a steady
//! load of chat requests through all four Envoys:
//! - each pod is scraped by the hubs only: its `/metrics` count grows by the hubs' scrape
//!   rounds, with one, two, three and four gateway sidecars subscribed, and no sidecar scrapes;
//! - killing one hub (SIGKILL) keeps every sidecar on the other, without a fallback;
//! - killing the second makes every sidecar scrape on its own (fallback reason `closed`);
//! - a hub started again on its address brings them back, and they stop scraping;
//! - a restarted sidecar resubscribes and its proxy accepts its pushes;
//! - no request fails, and no push is ever refused as stale (409).
//!
//! Needs Envoy, the filter `.wasm` and `target/release/model-sim` (`./build.sh`): skipped with a
//! message when missing, failed when `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::{ChildGuard, EnvoyProcess, EnvoySpec, Router};

const BIN: &str = env!("CARGO_BIN_EXE_sidecar-metrics");
const SECRET: &str = "e2e-hub-secret-0123456789abcdef-0123";
const MODEL: &str = "llama-model";
const LIMIT: Duration = Duration::from_secs(20);

fn addr() -> SocketAddr {
    format!("127.0.0.1:{}", testkit::free_port().unwrap())
        .parse()
        .unwrap()
}

fn pool_arg(pods: &[SocketAddr]) -> String {
    let eps: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
    format!(
        "name=llama,cluster=pool_llama,models={MODEL},endpoints={}",
        eps.join("+")
    )
}

fn start_hub(pods: &[SocketAddr], listen: SocketAddr, face: SocketAddr) -> ChildGuard {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--mode", "hub", "--secret", SECRET])
        .args(["--pool", &pool_arg(pods)])
        // Every round scrapes every pod (the count below follows the rounds): no duty bound.
        .args(["--interval-ms", "50", "--max-duty", "0"])
        .args(["--hub-listen", &listen.to_string()])
        .args(["--listen", &face.to_string()]);
    ChildGuard::spawn("sidecar-metrics-hub", cmd).unwrap()
}

struct Gateway {
    envoy: EnvoyProcess,
    face: SocketAddr,
    sidecar: ChildGuard,
}

fn start_sidecar(
    envoy: &EnvoyProcess,
    pods: &[SocketAddr],
    hubs: &[SocketAddr],
    face: SocketAddr,
) -> ChildGuard {
    let hubs: Vec<String> = hubs.iter().map(|h| format!("http://{h}")).collect();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--push", &format!("http://{}", envoy.push_addr())])
        .args(["--secret", SECRET, "--pool", &pool_arg(pods)])
        .args(["--interval-ms", "50", "--hub", &hubs.join(",")])
        .args(["--listen", &face.to_string()]);
    ChildGuard::spawn("sidecar-metrics", cmd).unwrap()
}

async fn start_gateway(pods: &[SocketAddr], hubs: &[SocketAddr]) -> Gateway {
    let envoy = EnvoySpec::new(Router::Filter)
        .pool("llama", "pool_llama", pods.to_vec())
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": [MODEL]}],
            "snapshot": {"secret": SECRET, "stale_after_ms": 3000}
        }))
        .start()
        .await
        .unwrap();
    let face = addr();
    let sidecar = start_sidecar(&envoy, pods, hubs, face);
    Gateway {
        envoy,
        face,
        sidecar,
    }
}

/// The value of one exposition line (`name{labels}` exactly), 0 when absent.
async fn metric(face: SocketAddr, series: &str) -> u64 {
    let r = testkit::get(face, "/metrics", &[]).await;
    let Ok(r) = r else { return 0 };
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn rounds(face: SocketAddr) -> u64 {
    metric(face, "llm_router_sidecar_scrape_rounds_total").await
}
async fn frames(face: SocketAddr) -> u64 {
    metric(face, "llm_router_sidecar_hub_frames_received_total").await
}
async fn on_hub(face: SocketAddr) -> bool {
    metric(face, "llm_router_sidecar_hub_source{source=\"hub\"}").await == 1
}

async fn scrapes_at(pod: SocketAddr) -> u64 {
    let r = testkit::get(pod, "/admin/state", &[]).await.unwrap();
    r.json().unwrap()["metrics_requests"].as_u64().unwrap()
}

async fn generation(envoy: &EnvoyProcess) -> u64 {
    let r = testkit::get(envoy.push_addr(), "/__llm_router/state", &[])
        .await
        .unwrap();
    let v: Value = r.json().unwrap();
    v["generation"].as_u64().unwrap_or(0)
}

async fn until(what: &str, mut pred: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !pred().await {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn kill9(g: &ChildGuard) {
    let ok = Command::new("kill")
        .args(["-9", &g.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Over about a second: each pod's scrapes grew by the hubs' rounds (give or take the rounds in
/// flight at both reads), and no sidecar scraped.
async fn scrapes_follow_the_hubs(
    pods: &[SocketAddr],
    hub_faces: &[SocketAddr],
    gws: &[Gateway],
) -> f64 {
    let hub_rounds = async || {
        let mut n = 0;
        for f in hub_faces {
            n += rounds(*f).await;
        }
        n
    };
    let side: Vec<u64> = futures_util::future::join_all(gws.iter().map(|g| rounds(g.face))).await;
    let (h0, t0) = (hub_rounds().await, Instant::now());
    let mut p0 = Vec::new();
    for p in pods {
        p0.push(scrapes_at(*p).await);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let h1 = hub_rounds().await;
    let secs = t0.elapsed().as_secs_f64();
    let mut rate = 0.0;
    for (p, before) in pods.iter().zip(p0) {
        let d = scrapes_at(*p).await - before;
        let dh = h1 - h0;
        assert!(
            d.abs_diff(dh) <= 4,
            "pod {p} was scraped {d} times while the hubs made {dh} rounds ({} sidecars)",
            gws.len()
        );
        rate = d as f64 / secs;
    }
    let side_after: Vec<u64> =
        futures_util::future::join_all(gws.iter().map(|g| rounds(g.face))).await;
    assert_eq!(side, side_after, "a sidecar following a live hub scraped");
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_follow_two_hubs_and_survive_losing_them() {
    if !testkit::prerequisites_ready(
        "e2e_hub",
        [
            testkit::envoy_binary().err().map(|e| e.to_string()),
            testkit::filter_wasm().err().map(|e| e.to_string()),
            testkit::bin("model-sim").err().map(|e| e.to_string()),
        ],
    ) {
        return;
    }
    let sim = ["--profile", "h100", "--speedup", "50", "--model", MODEL];
    let a = testkit::start_model_sim(&sim).await.unwrap();
    let b = testkit::start_model_sim(&sim).await.unwrap();
    let pods = [a.addr, b.addr];
    let (hub_addrs, hub_faces) = ([addr(), addr()], [addr(), addr()]);
    let mut hub_a = start_hub(&pods, hub_addrs[0], hub_faces[0]);
    let hub_b = start_hub(&pods, hub_addrs[1], hub_faces[1]);

    // One to four gateways: the pods see the same scrapes (the hubs').
    let mut gws = Vec::new();
    let mut rates = Vec::new();
    for _ in 0..4 {
        gws.push(start_gateway(&pods, &hub_addrs).await);
        for g in &gws {
            until("the gateway on a hub", async || frames(g.face).await >= 3).await;
        }
        rates.push(scrapes_follow_the_hubs(&pods, &hub_faces, &gws).await);
    }
    eprintln!("scrapes per pod per second with 1, 2, 3, 4 gateways: {rates:.1?}");

    // Steady load through all four Envoys from here on.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for (i, g) in gws.iter().enumerate() {
        let (stop, ok, failed, listen) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            g.envoy.listen_addr,
        );
        load.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let body = json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": format!("gw {i} req {n}")}]});
                match testkit::post_json(listen, "/v1/chat/completions", &[], &body).await {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }

    // Hub A killed: every sidecar stays on hub B, none falls back.
    kill9(&hub_a);
    let _ = hub_a.try_wait();
    for g in &gws {
        let f = frames(g.face).await;
        until("frames from hub B", async || frames(g.face).await >= f + 10).await;
        assert!(on_hub(g.face).await);
    }
    for g in &gws {
        for r in ["closed", "silent"] {
            let s = format!("llm_router_sidecar_hub_fallbacks_total{{reason=\"{r}\"}}");
            assert_eq!(
                metric(g.face, &s).await,
                0,
                "a sidecar fell back with hub B alive"
            );
        }
    }

    // Hub B killed too: every sidecar scrapes on its own, and its proxy keeps getting news.
    let killed = Instant::now();
    kill9(&hub_b);
    for g in &gws {
        until("own scraping", async || rounds(g.face).await >= 1).await;
    }
    eprintln!(
        "all four sidecars scraping on their own {:?} after the last hub died",
        killed.elapsed()
    );
    for g in &gws {
        assert_eq!(
            metric(
                g.face,
                "llm_router_sidecar_hub_fallbacks_total{reason=\"closed\"}"
            )
            .await,
            1
        );
        let gen = generation(&g.envoy).await;
        until("pushes from own scraping", async || {
            generation(&g.envoy).await > gen
        })
        .await;
    }

    // Hub A back on its address: they resubscribe and stop scraping.
    hub_a = start_hub(&pods, hub_addrs[0], hub_faces[0]);
    for g in &gws {
        until("back on the hub", async || on_hub(g.face).await).await;
    }
    for g in &gws {
        let (r, f) = (rounds(g.face).await, frames(g.face).await);
        until("frames from the new hub A", async || {
            frames(g.face).await >= f + 10
        })
        .await;
        assert!(
            rounds(g.face).await <= r + 1,
            "still scraping with a hub back"
        );
    }

    // A sidecar restarted: it resubscribes, scrapes nothing, and its proxy takes its pushes.
    let g0 = &mut gws[0];
    g0.sidecar.stop();
    let gen = generation(&g0.envoy).await;
    let face = addr();
    g0.sidecar = start_sidecar(&g0.envoy, &pods, &hub_addrs, face);
    g0.face = face;
    let g0 = &gws[0];
    until("restarted sidecar on the hub", async || {
        frames(g0.face).await >= 5
    })
    .await;
    until("its pushes accepted", async || {
        generation(&g0.envoy).await > gen
    })
    .await;
    assert_eq!(
        rounds(g0.face).await,
        0,
        "a restarted sidecar with a live hub scraped"
    );

    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("requests through the four Envoys: {ok} ok, {failed} failed");
    assert!(ok > 0);
    assert_eq!(failed, 0, "requests failed while hubs came and went");
    for g in &gws {
        assert_eq!(
            metric(g.face, "llm_router_sidecar_pushes_total{result=\"stale\"}").await,
            0,
            "a push was refused as stale"
        );
    }
    drop(hub_a);
}

/// The pods' in-flight and pending work as gateway `envoy`'s filter sees it from the other
/// replicas (its state page): `(peer_in_flight, peer_pending_tokens)` per pod address.
async fn peer_work(envoy: &EnvoyProcess) -> Vec<(String, u64, u64)> {
    let r = testkit::get(envoy.push_addr(), "/__llm_router/state", &[])
        .await
        .unwrap();
    let v: Value = r.json().unwrap();
    v["pools"][0]["pods"]
        .as_array()
        .map(|pods| {
            pods.iter()
                .map(|p| {
                    (
                        p["address"].as_str().unwrap_or_default().to_string(),
                        p["peer_in_flight"].as_u64().unwrap_or(0),
                        p["peer_pending_tokens"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Three gateways on one hub: requests held open through gateway 0 show up, within tens of ms,
/// as other replicas' work on every other gateway's filter, and never on gateway 0's own; when
/// they end, the others stop counting them. The age of what the others see is measured. A long
/// document gateway 0 places reaches the others' snapshots as a placed context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_counts_the_others_work_through_the_hub() {
    if !testkit::prerequisites_ready(
        "e2e_hub",
        [
            testkit::envoy_binary().err().map(|e| e.to_string()),
            testkit::filter_wasm().err().map(|e| e.to_string()),
            testkit::bin("model-sim").err().map(|e| e.to_string()),
        ],
    ) {
        return;
    }
    // Slow pods (real-time speed), so requests stay in flight for a few seconds.
    let sim = ["--profile", "a10g", "--speedup", "1", "--model", MODEL];
    let a = testkit::start_model_sim(&sim).await.unwrap();
    let b = testkit::start_model_sim(&sim).await.unwrap();
    let pods = [a.addr, b.addr];
    let (hub_addr, hub_face) = (addr(), addr());
    let hub = start_hub(&pods, hub_addr, hub_face);
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(start_gateway(&pods, &[hub_addr]).await);
    }
    for g in &gws {
        until("the gateway on the hub", async || frames(g.face).await >= 3).await;
    }
    // Three long requests through gateway 0, held open.
    let listen = gws[0].envoy.listen_addr;
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(tokio::spawn(async move {
            let body = json!({"model": MODEL, "max_tokens": 150, "messages": [{"role": "user", "content": format!("held {i} {}", "long context ".repeat(200))}]});
            testkit::post_json(listen, "/v1/chat/completions", &[], &body).await
        }));
    }
    let total = |w: &[(String, u64, u64)]| w.iter().map(|(_, n, _)| n).sum::<u64>();
    for g in &gws[1..] {
        until(
            "the other gateways count gateway 0's requests",
            async || total(&peer_work(&g.envoy).await) == 3,
        )
        .await;
    }
    assert_eq!(
        total(&peer_work(&gws[0].envoy).await),
        0,
        "gateway 0 counts its own requests as another replica's"
    );
    for r in held {
        let r = r.await.unwrap().unwrap();
        assert_eq!(r.status, 200);
    }
    for g in &gws[1..] {
        until("the ended requests no longer counted", async || {
            total(&peer_work(&g.envoy).await) == 0
        })
        .await;
    }
    // How old the others' work was when it reached a gateway's sidecar (hub frames applied).
    let text = testkit::get(gws[1].face, "/metrics", &[])
        .await
        .unwrap()
        .text();
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("llm_router_sidecar_peer_work_age_seconds_count "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let le_100ms = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("llm_router_sidecar_peer_work_age_seconds_bucket{le=\"0.1\"} ")
        })
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    eprintln!("frames with the others' work: {count}, of them ≤ 100 ms old: {le_100ms}");
    assert!(count > 0.0, "no frame carried the others' work:\n{text}");

    // Where a long context went: a document routed through gateway 0 while gateway 1 has a
    // request in flight (so gateway 0 sees other replicas at work) is noted in gateway 0's
    // ring, travels in its tally, and reaches the others' snapshots — never gateway 0's own.
    let busy = gws[1].envoy.listen_addr;
    let holder = tokio::spawn(async move {
        let body = json!({"model": MODEL, "max_tokens": 150, "messages": [{"role": "user", "content": "hold this one"}]});
        testkit::post_json(busy, "/v1/chat/completions", &[], &body).await
    });
    until("gateway 0 sees gateway 1's request", async || {
        total(&peer_work(&gws[0].envoy).await) >= 1
    })
    .await;
    let document = "A long document about the logistics of warehouses. ".repeat(120);
    let body = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": format!("{document}\n\nWhat does it say?")}]});
    let r = testkit::post_json(listen, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    until("gateway 0 notes where the document went", async || {
        contexts(&gws[0].envoy).await.1 >= 1
    })
    .await;
    for g in &gws[1..] {
        until(
            "the other gateways find it in their snapshots",
            async || contexts(&g.envoy).await.0 >= 1,
        )
        .await;
    }
    assert_eq!(
        contexts(&gws[0].envoy).await.0,
        0,
        "gateway 0 takes its own placement for another replica's"
    );
    assert_eq!(holder.await.unwrap().unwrap().status, 200);
    drop(hub);
}

/// `(peer_contexts, placed_contexts)` of the first pool in a filter's state: the contexts
/// other replicas placed (in its snapshot) and the ones it placed (its ring).
async fn contexts(envoy: &EnvoyProcess) -> (u64, u64) {
    let r = testkit::get(envoy.push_addr(), "/__llm_router/state", &[])
        .await
        .unwrap();
    let v: Value = r.json().unwrap();
    let pool = &v["pools"][0];
    (
        pool["peer_contexts"].as_u64().unwrap_or(0),
        pool["placed_contexts"].as_u64().unwrap_or(0),
    )
}
