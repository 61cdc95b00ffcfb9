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
//! Three gateways also show each other's work through one hub, and three more, whose sidecars
//! hold only their replica credentials, route exactly as before while tallies forged with the
//! wrong keys, dated in the future or replayed are sent to their two hubs (after a positive
//! control that a genuine tally does move their conversations).
//!
//! Needs Envoy, the filter `.wasm` and `target/release/model-sim` (`./build.sh`): skipped with a
//! message when missing, failed when `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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

/// Envoy, the filter's `.wasm` and model-sim are built (else the test is skipped, or fails
/// under CI, as the test kit decides).
fn prerequisites_ready() -> bool {
    testkit::prerequisites_ready(
        "e2e_hub",
        [
            testkit::envoy_binary().err().map(|e| e.to_string()),
            testkit::filter_wasm().err().map(|e| e.to_string()),
            testkit::bin("model-sim").err().map(|e| e.to_string()),
        ],
    )
}

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

/// Envoy with the real filter in front of `pods`, taking snapshots signed with the push secret.
async fn start_envoy(pods: &[SocketAddr]) -> EnvoyProcess {
    EnvoySpec::new(Router::Filter)
        .pool("llama", "pool_llama", pods.to_vec())
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": [MODEL]}],
            "snapshot": {"secret": SECRET, "stale_after_ms": 3000}
        }))
        .start()
        .await
        .unwrap()
}

async fn start_gateway(pods: &[SocketAddr], hubs: &[SocketAddr]) -> Gateway {
    let envoy = start_envoy(pods).await;
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
    if !prerequisites_ready() {
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
/// A read of the proxy's tally, held with `(after, wait_ms)`: the version it names and the
/// requests in flight it lists.
async fn tally_read(internal: SocketAddr, held: Option<(u64, u64)>) -> (u64, u32) {
    use llm_router_snapshot::tally::TALLY_VERSION_HEADER;
    let path = match held {
        Some((v, ms)) => format!("/__llm_router/tally?after={v}&wait_ms={ms}"),
        None => "/__llm_router/tally".to_string(),
    };
    let r = testkit::get(internal, &path, &[]).await.unwrap();
    assert_eq!(r.status, 200);
    let version = r
        .headers
        .iter()
        .find(|(k, _)| k == TALLY_VERSION_HEADER)
        .and_then(|(_, v)| v.parse().ok())
        .expect("the tally names its version");
    let t = llm_router_snapshot::Tally::decode(&r.body).unwrap();
    let n = t
        .pools
        .iter()
        .flat_map(|p| &p.pods)
        .map(|p| p.in_flight)
        .sum();
    (version, n)
}

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
    if !prerequisites_ready() {
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
    // The tally's long poll in a real Envoy (what each gateway's sidecar reads): before any
    // traffic a read naming the current version is answered only when its wait ends, with the
    // same version; one held while requests start is answered with a newer version that
    // counts them, before its wait ends.
    let internal = gws[0].envoy.push_addr();
    let (v0, _) = tally_read(internal, None).await;
    assert_eq!(
        tally_read(internal, Some((v0, 100))).await.0,
        v0,
        "nothing moved"
    );
    let poll = tokio::spawn(async move { tally_read(internal, Some((v0, 1_000))).await });
    // Three long requests through gateway 0, held open.
    let listen = gws[0].envoy.listen_addr;
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(tokio::spawn(async move {
            let body = json!({"model": MODEL, "max_tokens": 150, "messages": [{"role": "user", "content": format!("held {i} {}", "long context ".repeat(200))}]});
            testkit::post_json(listen, "/v1/chat/completions", &[], &body).await
        }));
    }
    let (v1, counted) = poll.await.unwrap();
    assert_ne!(
        v1, v0,
        "the held read was answered by a change, not by its wait's end"
    );
    assert!(
        counted >= 1,
        "the answer carries the requests that moved it"
    );
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

// ---- Forged, replayed and future-dated tallies ----

/// The hubs' own secret in the test below: the push secret (in every Envoy's configuration)
/// opens nothing on them, and the gateway sidecars hold only their credentials.
const HUB_SECRET: &str = "e2e-hub-only-secret-0123456789abcdef";
/// Another deployment's hub secret.
const OTHER_HUB_SECRET: &str = "e2e-other-hubs-secret-0123456789abcdef";
/// The hubs' `hub.tally_ttl_ms` in the test below (500 by default): one genuine tally, never
/// renewed, stays live while the positive control routes its conversations.
const TALLY_TTL_MS: u64 = 2_000;
/// The replica the test's own genuine tally speaks for (the gateways are replicas 1, 2 and 3).
const TEST_REPLICA: u64 = 4;
/// Conversations routed in each round, conversation `i` through gateway `i % 3`.
const CONVERSATIONS: usize = 12;
/// How many times each attack is sent to each hub.
const REPEATS: usize = 8;

/// Writes `text` to `dir/name`; the path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The pool as a configuration file writes it (static discovery).
fn pool_json(pods: &[SocketAddr]) -> Value {
    let eps: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
    json!({"name": "llama", "cluster": "pool_llama", "models": [MODEL], "discovery": {"static": eps}})
}

/// A hub holding the hub secret (`hub.secret_file`), keeping tallies for [`TALLY_TTL_MS`]. The
/// configuration is written as JSON, which is YAML.
fn start_keyed_hub(
    dir: &Path,
    name: &str,
    pods: &[SocketAddr],
    listen: SocketAddr,
    face: SocketAddr,
    hub_secret: &Path,
) -> ChildGuard {
    let cfg = json!({
        "mode": "hub",
        "listen": face.to_string(),
        "push": {"secret": SECRET},
        "hub": {
            "listen": listen.to_string(),
            "secret_file": hub_secret,
            "tally_ttl_ms": TALLY_TTL_MS,
        },
        "pools": [pool_json(pods)],
    });
    let file = write(dir, &format!("{name}.yaml"), &cfg.to_string());
    let mut cmd = Command::new(BIN);
    cmd.arg("run").arg("--config").arg(file);
    ChildGuard::spawn("sidecar-metrics-hub", cmd).unwrap()
}

/// Replica `replica`'s sidecar for `envoy`, following `hubs` with the credential that
/// `sidecar-metrics credential` writes from the hub secret (which the sidecar never sees).
fn start_credentialed_sidecar(
    dir: &Path,
    replica: u64,
    hub_secret: &Path,
    envoy: &EnvoyProcess,
    pods: &[SocketAddr],
    hubs: &[SocketAddr],
    face: SocketAddr,
) -> ChildGuard {
    let credential = dir.join(format!("replica-{replica}.credential"));
    let made = Command::new(BIN)
        .arg("credential")
        .arg("--hub-secret-file")
        .arg(hub_secret)
        .args(["--replica", &replica.to_string()])
        .arg("--out")
        .arg(&credential)
        .status()
        .unwrap();
    assert!(made.success(), "`sidecar-metrics credential` failed");
    let hubs: Vec<String> = hubs.iter().map(|h| format!("http://{h}")).collect();
    let cfg = json!({
        "listen": face.to_string(),
        "push": {"address": envoy.push_addr().to_string(), "secret": SECRET},
        "hub": {
            "upstreams": hubs,
            "credential_file": credential,
            // A loaded test machine may delay a frame: stay on the hubs.
            "fallback_after_ms": 1000,
        },
        "pools": [pool_json(pods)],
    });
    let file = write(dir, &format!("replica-{replica}.yaml"), &cfg.to_string());
    let mut cmd = Command::new(BIN);
    cmd.arg("run").arg("--config").arg(file);
    ChildGuard::spawn("sidecar-metrics", cmd).unwrap()
}

/// Pods of the first pool whose health is `ok` in gateway `envoy`'s filter.
async fn healthy_pods(envoy: &EnvoyProcess) -> usize {
    let Ok(r) = testkit::get(envoy.push_addr(), "/__llm_router/state", &[]).await else {
        return 0;
    };
    let Ok(v) = r.json() else { return 0 };
    v["pools"][0]["pods"].as_array().map_or(0, |p| {
        p.iter().filter(|p| p["health"] == json!("ok")).count()
    })
}

/// `(peer_in_flight, peer_pending_tokens)` of `pod` in a [`peer_work`] list.
fn work_on(work: &[(String, u64, u64)], pod: SocketAddr) -> (u64, u64) {
    work.iter()
        .find(|(a, _, _)| *a == pod.to_string())
        .map_or((0, 0), |&(_, n, t)| (n, t))
}

fn no_peer_work(work: &[(String, u64, u64)]) -> bool {
    work.iter().all(|&(_, n, t)| n == 0 && t == 0)
}

/// Asserts that no gateway's filter shows other replicas' work, looking every 20 ms for `span`.
async fn no_peer_work_for(gws: &[Gateway], span: Duration, after: &str) {
    let start = Instant::now();
    loop {
        for (i, g) in gws.iter().enumerate() {
            let w = peer_work(&g.envoy).await;
            assert!(
                no_peer_work(&w),
                "gateway {i}'s filter shows peer work after {after}: {w:?}"
            );
        }
        if start.elapsed() >= span {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tally claiming a thousand requests and four million pending prompt tokens on each of
/// `busy` (far over what the filters accept from other replicas).
fn claim(replica: u64, seq: u64, taken_ms: u64, busy: &[SocketAddr]) -> Vec<u8> {
    llm_router_snapshot::Tally {
        replica,
        seq,
        taken_ms,
        pools: vec![llm_router_snapshot::TallyPool {
            name: "llama".into(),
            pods: busy
                .iter()
                .map(|p| llm_router_snapshot::TallyPod {
                    address: p.to_string(),
                    in_flight: 1_000,
                    pending_tokens: 4_000_000,
                })
                .collect(),
            contexts: Vec::new(),
        }],
    }
    .encode()
    .unwrap()
}

/// POSTs one tally to every hub: their answers.
async fn to_hubs(hubs: &[SocketAddr], replica: u64, signature: &str, body: &[u8]) -> Vec<u16> {
    let mut answers = Vec::new();
    for h in hubs {
        answers.push(common::post_tally(*h, &replica.to_string(), signature, body).await);
    }
    answers
}

/// Conversation `i` of a round: a distinct opening (so no two share a cached prefix), a few
/// prefix blocks long.
fn conversation(tag: &str, i: usize) -> Value {
    let text = format!(
        "{tag} {i:02}: {}",
        "Tell me about the tides, the moon and the old harbour wall. ".repeat(8)
    );
    json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]})
}

/// Routes the round's conversations, conversation `i` through gateway `i % 3`: the pod that
/// served each.
async fn route_all(gws: &[Gateway], tag: &str) -> Vec<String> {
    let mut served = Vec::new();
    for i in 0..CONVERSATIONS {
        let listen = gws[i % gws.len()].envoy.listen_addr;
        served.push(common::served_by(listen, &conversation(tag, i)).await);
    }
    served
}

/// The ways a tally is forged or replayed below, each refused by the hubs with its status.
#[derive(Debug, Clone, Copy)]
enum Attack {
    /// Replica 4's tally signed with replica 4's key derived from another hub's secret.
    OtherHubSecret,
    /// Replica 1's own key (its credential) on a tally naming replica 2.
    ReplicaOneAsTwo,
    /// Signed with the push secret itself (what every Envoy's environment holds).
    PushSecret,
    /// Replica 4's key as derived from the push secret (the configuration from before the hub
    /// secret was split from it).
    PushDerivedKey,
    /// Replica 4's genuine key, a fresh seq, `taken_ms` one minute ahead of the hubs' clock.
    Future,
    /// The positive control's genuine tally again, byte for byte.
    Replay,
}

impl Attack {
    const ALL: [Attack; 6] = [
        Attack::OtherHubSecret,
        Attack::ReplicaOneAsTwo,
        Attack::PushSecret,
        Attack::PushDerivedKey,
        Attack::Future,
        Attack::Replay,
    ];

    /// The hub's answer: 403 for a signature that is not the named replica's, 409 for a
    /// genuinely signed tally it will not take.
    fn refusal(self) -> u16 {
        match self {
            Attack::Future | Attack::Replay => 409,
            _ => 403,
        }
    }
}

/// What an attacker holds, and what the test recorded of the genuine tally.
struct Forger {
    genuine: Vec<u8>,
    genuine_signature: String,
    /// Replica 4's key under the real hub secret (the positive control's).
    replica_key: sidecar_metrics::keys::Key,
    replica_one_key: sidecar_metrics::keys::Key,
    other_hub_key: sidecar_metrics::keys::Key,
    push_derived_key: sidecar_metrics::keys::Key,
    /// Where the forged tallies claim work.
    busy: Vec<SocketAddr>,
    /// The last seq used (each forged tally takes a fresh one above the genuine tally's).
    seq: u64,
}

impl Forger {
    /// `(replica header, signature, body)` of one attempt.
    fn forge(&mut self, attack: Attack) -> (u64, String, Vec<u8>) {
        let now = sidecar_metrics::clock::now_ms();
        self.seq = sidecar_metrics::share::next_seq(self.seq, now);
        let sign = llm_router_snapshot::sign;
        let forged = |replica: u64, taken_ms: u64| claim(replica, self.seq, taken_ms, &self.busy);
        match attack {
            Attack::OtherHubSecret => {
                let b = forged(TEST_REPLICA, now);
                (TEST_REPLICA, sign(&self.other_hub_key, &b), b)
            }
            Attack::ReplicaOneAsTwo => {
                let b = forged(2, now);
                (2, sign(&self.replica_one_key, &b), b)
            }
            Attack::PushSecret => {
                let b = forged(TEST_REPLICA, now);
                (TEST_REPLICA, sign(SECRET.as_bytes(), &b), b)
            }
            Attack::PushDerivedKey => {
                let b = forged(TEST_REPLICA, now);
                (TEST_REPLICA, sign(&self.push_derived_key, &b), b)
            }
            Attack::Future => {
                let b = forged(TEST_REPLICA, now + 60_000);
                (TEST_REPLICA, sign(&self.replica_key, &b), b)
            }
            Attack::Replay => (
                TEST_REPLICA,
                self.genuine_signature.clone(),
                self.genuine.clone(),
            ),
        }
    }
}

/// Three gateways (real Envoy + the real filter `.wasm`, each with its sidecar holding only its
/// own replica credential) follow two hubs that hold their own hub secret, in front of four idle
/// model-sim pods.
/// - Positive control: a genuine tally from replica 4 (signed with its real key) claiming far
///   too much work on three pods reaches every filter capped (8 requests, 8 × 32,768 tokens a
///   pod) and the conversations go to the fourth pod. Replayed after the hubs' TTL, it is
///   refused (409) and the claim stays gone.
/// - Baseline: twelve conversations routed through the three gateways.
/// - Attacks, each sent repeatedly to both hubs, claiming work on the three pods the baseline
///   used most: signed with another hub's secret, replica 1's key posing as replica 2, the push
///   secret, a key derived from the push secret (403 each); replica 4's real key dated a
///   minute ahead, and an exact replay of the control (409 each). No filter shows peer work
///   meanwhile, and the same twelve conversations are routed again exactly as in the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_future_tallies_change_no_routing_decision() {
    use sidecar_metrics::keys::HubKeys;
    if !prerequisites_ready() {
        return;
    }
    let started = Instant::now();
    let sim = ["--profile", "h100", "--speedup", "50", "--model", MODEL];
    let mut sims = Vec::new();
    for _ in 0..4 {
        sims.push(testkit::start_model_sim(&sim).await.unwrap());
    }
    let pods: Vec<SocketAddr> = sims.iter().map(|s| s.addr).collect();
    // The secret, credential and configuration files, kept with the processes' logs.
    let dir = testkit::testlog_dir("e2e-hub-tallies").unwrap();
    let hub_secret = write(&dir, "hub-secret", &format!("{HUB_SECRET}\n"));
    let (hub_addrs, hub_faces) = ([addr(), addr()], [addr(), addr()]);
    let _hubs: Vec<ChildGuard> = (0..2)
        .map(|i| {
            let name = format!("hub-{i}");
            start_keyed_hub(&dir, &name, &pods, hub_addrs[i], hub_faces[i], &hub_secret)
        })
        .collect();
    let mut gws = Vec::new();
    for replica in 1..=3 {
        let envoy = start_envoy(&pods).await;
        let face = addr();
        let sidecar =
            start_credentialed_sidecar(&dir, replica, &hub_secret, &envoy, &pods, &hub_addrs, face);
        gws.push(Gateway {
            envoy,
            face,
            sidecar,
        });
    }
    for g in &gws {
        until("the gateway on a hub", async || {
            frames(g.face).await >= 3 && on_hub(g.face).await
        })
        .await;
        until("the four pods healthy in its filter", async || {
            healthy_pods(&g.envoy).await == 4
        })
        .await;
    }
    let setup = started.elapsed();

    // Positive control: replica 4's genuine tally claims work on pods 0-2.
    let keys = HubKeys::from_secret(HUB_SECRET.as_bytes());
    let replica_key = keys.credential(TEST_REPLICA).tally;
    let (spared, busy) = (pods[3], &pods[..3]);
    let seq = sidecar_metrics::share::next_seq(0, sidecar_metrics::clock::now_ms());
    let genuine = claim(TEST_REPLICA, seq, sidecar_metrics::clock::now_ms(), busy);
    let genuine_signature = llm_router_snapshot::sign(&replica_key, &genuine);
    let posted = Instant::now();
    let answers = to_hubs(&hub_addrs, TEST_REPLICA, &genuine_signature, &genuine).await;
    assert_eq!(answers, [204, 204], "the genuine tally was not taken");
    let slack = u64::from(llm_router_snapshot::tally::PEER_SLACK);
    let capped = (
        slack,
        slack * u64::from(llm_router_snapshot::tally::PEER_MAX_TOKENS_PER_REQUEST),
    );
    for g in &gws {
        until("the genuine claim, capped, in the filter", async || {
            let w = peer_work(&g.envoy).await;
            busy.iter().all(|p| work_on(&w, *p) == capped) && work_on(&w, spared) == (0, 0)
        })
        .await;
    }
    let seen_after = posted.elapsed();
    let control = route_all(&gws, "control").await;
    let routed_by = posted.elapsed();
    let to_spared = control.iter().filter(|p| **p == spared.to_string()).count();
    eprintln!(
        "positive control: the claim reached all three filters {seen_after:?} after the POST \
         (capped at {capped:?} a pod); {to_spared} of {CONVERSATIONS} conversations went to the \
         spared pod, all routed {routed_by:?} after the POST; served: {control:?}"
    );
    assert!(
        routed_by < Duration::from_millis(TALLY_TTL_MS),
        "the control's conversations took longer than the tally lives ({routed_by:?})"
    );
    assert!(
        to_spared >= CONVERSATIONS - 2,
        "only {to_spared} of {CONVERSATIONS} conversations avoided the claimed pods: {control:?}"
    );

    // The claim expires with the hubs' TTL; the same tally sent again is a replay.
    for g in &gws {
        until("the genuine claim expired", async || {
            no_peer_work(&peer_work(&g.envoy).await)
        })
        .await;
    }
    let gone_after = posted.elapsed();
    let answers = to_hubs(&hub_addrs, TEST_REPLICA, &genuine_signature, &genuine).await;
    let replayed_at = posted.elapsed();
    assert_eq!(
        answers,
        [409, 409],
        "the genuine tally replayed after its TTL was not refused"
    );
    // Still younger than the hubs' age bound: the seq, not the age, refused it.
    assert!(
        replayed_at < Duration::from_millis(sidecar_metrics::share::MAX_TALLY_AGE_MS),
        "the replay came {replayed_at:?} after the tally; too late to test the seq"
    );
    no_peer_work_for(&gws, Duration::from_millis(300), "the replay").await;
    eprintln!(
        "the claim was gone from every filter {gone_after:?} after the POST (TTL {TALLY_TTL_MS} ms); \
         its replay {replayed_at:?} after it: {answers:?}"
    );

    // Baseline: where the conversations go with no other replica's work claimed.
    let baseline = route_all(&gws, "conversation").await;
    for g in &gws {
        until("no peer work after the baseline", async || {
            no_peer_work(&peer_work(&g.envoy).await)
        })
        .await;
    }
    // The attacks claim work on the three pods the baseline used most: any one taken moves
    // every conversation on them (at least 9 of the 12) to the fourth.
    let used = |p: &SocketAddr| baseline.iter().filter(|b| **b == p.to_string()).count();
    let spared = *pods.iter().min_by_key(|p| used(p)).unwrap();
    let busy: Vec<SocketAddr> = pods.iter().copied().filter(|p| *p != spared).collect();
    let exposed = CONVERSATIONS - used(&spared);
    let mut forger = Forger {
        genuine,
        genuine_signature,
        replica_key,
        replica_one_key: keys.credential(1).tally,
        other_hub_key: HubKeys::from_secret(OTHER_HUB_SECRET.as_bytes())
            .credential(TEST_REPLICA)
            .tally,
        push_derived_key: HubKeys::from_secret(SECRET.as_bytes())
            .credential(TEST_REPLICA)
            .tally,
        busy,
        seq,
    };
    let frames_before: Vec<u64> =
        futures_util::future::join_all(gws.iter().map(|g| frames(g.face))).await;
    let attacks_started = Instant::now();
    let mut posts = 2 * hub_addrs.len();
    for round in 0..REPEATS {
        for attack in Attack::ALL {
            let (replica, signature, body) = forger.forge(attack);
            let answers = to_hubs(&hub_addrs, replica, &signature, &body).await;
            posts += answers.len();
            assert!(
                answers.iter().all(|a| *a == attack.refusal()),
                "{attack:?} (round {round}) answered {answers:?}, not {}",
                attack.refusal()
            );
        }
        no_peer_work_for(&gws, Duration::ZERO, "the attacks").await;
    }
    let attacks_took = attacks_started.elapsed();
    no_peer_work_for(&gws, Duration::from_millis(300), "the attacks").await;
    // The filters were fed all along (so "no peer work" is what the hubs streamed).
    for (g, before) in gws.iter().zip(frames_before) {
        assert!(on_hub(g.face).await, "a gateway left the hubs");
        assert!(
            frames(g.face).await >= before + 5,
            "a gateway got no frames during the attacks"
        );
    }

    // The same conversations again: every decision is the baseline's.
    let after = route_all(&gws, "conversation").await;
    let changed: Vec<(usize, &String, &String)> = (0..CONVERSATIONS)
        .filter(|&i| after[i] != baseline[i])
        .map(|i| (i, &baseline[i], &after[i]))
        .collect();
    assert!(
        changed.is_empty(),
        "routing decisions changed after the attacks (conversation, before, after): {changed:?}"
    );
    // Each hub refused every attempt and counted it (the control's replay among the refused).
    for face in hub_faces {
        let tallies =
            |result: &str| format!("llm_router_sidecar_hub_tallies_total{{result=\"{result}\"}}");
        let forbidden = 4 * REPEATS as u64;
        let refused = 2 * REPEATS as u64 + 1;
        assert_eq!(metric(face, &tallies("forbidden")).await, forbidden);
        assert_eq!(metric(face, &tallies("refused")).await, refused);
        assert!(metric(face, &tallies("accepted")).await >= 1);
    }
    for g in &gws {
        assert_eq!(
            metric(
                g.face,
                "llm_router_sidecar_tallies_shared_total{result=\"hub_error\"}"
            )
            .await,
            0,
            "a gateway's own tally was refused by a hub"
        );
    }
    eprintln!(
        "{posts} tally POSTs ({} forged or replayed, {REPEATS} of each of {} attacks to each of \
         the two hubs, in {attacks_took:?}), all refused; {exposed} of {CONVERSATIONS} baseline \
         decisions were on the attacked pods, none changed; setup {setup:?}, whole test {:?}",
        posts - 2 * hub_addrs.len(),
        Attack::ALL.len(),
        started.elapsed()
    );
}
