//! The hub and its subscribers in one process (fake pods, a fake proxy): a subscribed sidecar
//! pushes the hub's pod states with its own increasing generations and scrapes nothing; the hub
//! refuses a subscriber without the secret's token; a subscriber refuses a stream signed with
//! another secret (and drops it) and scrapes on its own; a stopped hub makes the sidecar scrape
//! on its own, a hub started again on the same address brings it back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{post_tally, vllm_text, Answer, FakeFleet, FakeProxy, SECRET};
use sidecar_metrics::config::{Config, Discovery, Mode};
use sidecar_metrics::hub;
use sidecar_metrics::sidecar::{self, Running};
use sidecar_metrics::stats::Summary;

const LIMIT: Duration = Duration::from_secs(10);

fn hub_config(fleet: &FakeFleet, listen: &str) -> Config {
    let mut c = common::config(
        "127.0.0.1:1".parse().unwrap(),
        Discovery::Static(fleet.endpoints()),
        20,
        1000,
    );
    c.mode = Mode::Hub;
    c.push.address = String::new();
    c.hub.listen = listen.into();
    c.validate().unwrap();
    c
}

fn follower_config(fleet: &FakeFleet, proxy: SocketAddr, hubs: &[SocketAddr]) -> Config {
    let mut c = common::config(proxy, Discovery::Static(fleet.endpoints()), 20, 1000);
    c.hub.upstreams = hubs.iter().map(|h| format!("http://{h}")).collect();
    c.hub.fallback_after_ms = Some(100);
    c.validate().unwrap();
    c
}

async fn wait(what: &str, running: &Running, pred: impl Fn(&Summary) -> bool) -> Summary {
    let start = Instant::now();
    loop {
        let s = running.stats.summary();
        if pred(&s) {
            return s;
        }
        assert!(
            start.elapsed() < LIMIT,
            "timed out waiting for {what}: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_pushes_the_hubs_view_and_falls_back_when_it_is_gone() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(3, 1, 0.25))).await;
    let proxy = FakeProxy::start().await;
    let h = sidecar::start(hub_config(&fleet, "127.0.0.1:0"), SECRET.into())
        .await
        .unwrap();
    let hub_addr = h.hub_addr.unwrap();
    let f = sidecar::start(
        follower_config(&fleet, proxy.addr, &[hub_addr]),
        SECRET.into(),
    )
    .await
    .unwrap();

    // The hub's view reaches the proxy through the follower, which scrapes nothing itself.
    fleet.set(fleet.addrs[0], Answer::Text(vllm_text(17, 2, 0.5)));
    proxy
        .wait_for("the hub's view of pod 0", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.iter().any(|p| p.waiting == 17))
        })
        .await;
    let s = wait("hub frames", &f, |s| s.hub.frames_received >= 5).await;
    assert_eq!(
        s.rounds, 0,
        "a follower with a live hub scrapes nothing: {s:#?}"
    );
    assert_eq!(s.hub.source, "hub");
    assert!(h.stats.summary().hub.subscribers >= 1);
    let got = proxy.received();
    assert!(got.iter().all(|r| r.signed), "every push is signed");
    let gens: Vec<u64> = got
        .iter()
        .filter_map(|r| r.snapshot.as_ref().ok().map(|s| s.generation))
        .collect();
    assert!(gens.windows(2).all(|w| w[0] < w[1]), "{gens:?}");

    // The hub goes away: the follower scrapes on its own, and the proxy keeps getting news.
    h.stop().await;
    let s = wait("fallback", &f, |s| s.rounds >= 3).await;
    assert_eq!(s.hub.source, "scrape");
    assert_eq!(s.hub.fallbacks.get("closed"), Some(&1), "{s:#?}");
    fleet.set(fleet.addrs[1], Answer::Text(vllm_text(23, 2, 0.5)));
    proxy
        .wait_for("pod 1 scraped by the follower", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.iter().any(|p| p.waiting == 23))
        })
        .await;

    // A hub on the same address again: the follower returns to it and stops scraping.
    let h2 = sidecar::start(hub_config(&fleet, &hub_addr.to_string()), SECRET.into())
        .await
        .unwrap();
    let back = wait("back on the hub", &f, |s| s.hub.source == "hub").await;
    let later = wait("frames from the new hub", &f, |s| {
        s.hub.frames_received >= back.hub.frames_received + 5
    })
    .await;
    assert!(
        later.rounds <= back.rounds + 1,
        "still scraping on its own after the hub came back: {back:#?} then {later:#?}"
    );
    // The proxy never saw a generation go back (and never answered 409).
    let gens: Vec<u64> = proxy
        .received()
        .iter()
        .filter_map(|r| r.snapshot.as_ref().ok().map(|s| s.generation))
        .collect();
    assert!(gens.windows(2).all(|w| w[0] < w[1]), "{gens:?}");
    assert_eq!(later.pushes.get("stale"), None, "{later:#?}");
    f.stop().await;
    h2.stop().await;
}

/// The peer work a proxy's latest accepted snapshot shows on `pod` of pool `llama`.
fn peers_seen(proxy: &FakeProxy, pod: SocketAddr) -> Option<(u32, u32)> {
    let got = proxy.received();
    let snap = got.iter().rev().find_map(|r| r.snapshot.as_ref().ok())?;
    let p = snap
        .pool("llama")?
        .pods
        .iter()
        .find(|p| p.address == pod.to_string())?;
    Some((p.peers.in_flight, p.peers.pending_tokens))
}

async fn wait_peers(what: &str, proxy: &FakeProxy, pod: SocketAddr, want: (u32, u32)) {
    let start = Instant::now();
    loop {
        if peers_seen(proxy, pod) == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "timed out waiting for {what}: {:?} on {pod}",
            peers_seen(proxy, pod)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_sees_the_others_work_through_the_hub_and_never_its_own() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(0, 0, 0.1))).await;
    let (pod0, pod1) = (fleet.addrs[0], fleet.addrs[1]);
    let h = sidecar::start(hub_config(&fleet, "127.0.0.1:0"), SECRET.into())
        .await
        .unwrap();
    let hub_addr = h.hub_addr.unwrap();
    let (pa, pb) = (FakeProxy::start().await, FakeProxy::start().await);
    pa.set_tally(&[("llama", &pod0.to_string(), 3, 900)]);
    pb.set_tally(&[("llama", &pod1.to_string(), 1, 100)]);
    let fa = sidecar::start(follower_config(&fleet, pa.addr, &[hub_addr]), SECRET.into())
        .await
        .unwrap();
    let fb = sidecar::start(follower_config(&fleet, pb.addr, &[hub_addr]), SECRET.into())
        .await
        .unwrap();

    // A sees B's work and not its own; B sees A's and not its own.
    wait_peers("A sees B's request", &pa, pod1, (1, 100)).await;
    assert_eq!(
        peers_seen(&pa, pod0),
        Some((0, 0)),
        "A's own work is not a peer's"
    );
    wait_peers("B sees A's requests", &pb, pod0, (3, 900)).await;
    assert_eq!(
        peers_seen(&pb, pod1),
        Some((0, 0)),
        "B's own work is not a peer's"
    );
    let hs = h.stats.summary();
    assert_eq!(hs.hub.replicas, 2, "{hs:#?}");
    assert!(hs.hub.tallies.get("accepted").copied().unwrap_or(0) >= 2);
    let a = fa.stats.summary();
    assert!(
        a.hub.shared.get("sent").copied().unwrap_or(0) >= 1,
        "{a:#?}"
    );
    assert!(
        a.hub.peer_age_ms > 0 && a.hub.peer_age_ms < 1_000,
        "the others' work is fresh: {a:#?}"
    );

    // B's request ends: A stops counting it.
    pb.set_tally(&[]);
    wait_peers("B's work ended", &pa, pod1, (0, 0)).await;
    // B has work again, then its sidecar goes away: its tally expires at the hub.
    pb.set_tally(&[("llama", &pod1.to_string(), 2, 40)]);
    wait_peers("B's new work", &pa, pod1, (2, 40)).await;
    fb.stop().await;
    wait_peers("B gone", &pa, pod1, (0, 0)).await;
    assert_eq!(h.stats.summary().hub.replicas, 1);
    fa.stop().await;
    h.stop().await;
}

/// A hub that scrapes once a minute still streams a replica's new work at once: a tally that
/// changes the board is a frame of its own (`hub.tally_frame_ms`), not news for the next round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_new_work_reaches_the_others_without_waiting_for_a_scrape_round() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(0, 0, 0.1))).await;
    let pod1 = fleet.addrs[1];
    let mut hc = hub_config(&fleet, "127.0.0.1:0");
    hc.scrape.interval_ms = 60_000;
    hc.validate().unwrap();
    let h = sidecar::start(hc, SECRET.into()).await.unwrap();
    let hub_addr = h.hub_addr.unwrap();
    let follower = |proxy: SocketAddr| {
        let mut c = follower_config(&fleet, proxy, &[hub_addr]);
        // The hub is silent between its rounds: follow it anyway.
        c.hub.fallback_after_ms = Some(60_000);
        c.hub.timeout_ms = 60_000;
        c.validate().unwrap();
        c
    };
    let (pa, pb) = (FakeProxy::start().await, FakeProxy::start().await);
    let fa = sidecar::start(follower(pa.addr), SECRET.into())
        .await
        .unwrap();
    let fb = sidecar::start(follower(pb.addr), SECRET.into())
        .await
        .unwrap();
    wait("the hub's first round", &h, |s| s.hub.published >= 1).await;
    let rounds = h.stats.summary().rounds;

    for (n, tokens) in [(1, 500), (4, 2_000), (0, 0)] {
        let work: Vec<(&str, String, u32, u32)> = if n == 0 {
            Vec::new()
        } else {
            vec![("llama", pod1.to_string(), n, tokens)]
        };
        let work: Vec<(&str, &str, u32, u32)> = work
            .iter()
            .map(|(p, a, n, t)| (*p, a.as_str(), *n, *t))
            .collect();
        pb.set_tally(&work);
        wait_peers("A sees B's work between rounds", &pa, pod1, (n, tokens)).await;
    }
    let hs = h.stats.summary();
    assert_eq!(hs.rounds, rounds, "no scrape round ran meanwhile: {hs:#?}");
    assert!(hs.hub.tally_frames >= 3, "{hs:#?}");
    fa.stop().await;
    fb.stop().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_neither_served_nor_followed() {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(3, 1, 0.25))).await;
    let h = sidecar::start(hub_config(&fleet, "127.0.0.1:0"), SECRET.into())
        .await
        .unwrap();
    let hub_addr = h.hub_addr.unwrap();
    // No token, or one made from another secret: 403.
    let (status, _) = common::http_get(hub_addr, hub::STREAM_PATH).await;
    assert_eq!(status, 403);
    let other = "another-secret-0123456789abcdef-0123";
    let r = testkit::get(
        hub_addr,
        hub::STREAM_PATH,
        &[(
            llm_router_snapshot::SIGNATURE_HEADER,
            &hub::subscribe_token(other.as_bytes()),
        )],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(h.stats.summary().hub.subscribes_refused, 2);

    // A hub with another secret refuses our follower (403); a stranger that serves anyone a
    // stream signed with another secret is refused frame by frame (and dropped). Either way the
    // follower scrapes on its own and nothing of the intruders reaches the proxy.
    let mut stranger_cfg = hub_config(&fleet, "127.0.0.1:0");
    stranger_cfg.pools[0].name = "intruder".into();
    let stranger = sidecar::start(stranger_cfg, other.into()).await.unwrap();
    let open_door = open_stranger(other).await;
    let proxy = FakeProxy::start().await;
    let f = sidecar::start(
        follower_config(&fleet, proxy.addr, &[stranger.hub_addr.unwrap(), open_door]),
        SECRET.into(),
    )
    .await
    .unwrap();
    let s = wait("fallback from the strangers", &f, |s| {
        s.rounds >= 3 && s.hub.frames_refused.get("signature").copied().unwrap_or(0) >= 2
    })
    .await;
    assert_eq!(s.hub.frames_received, 0, "{s:#?}");
    assert_eq!(s.hub.source, "scrape");
    assert!(stranger.stats.summary().hub.subscribes_refused >= 1);
    assert!(proxy
        .received()
        .iter()
        .filter_map(|r| r.snapshot.as_ref().ok())
        .all(|s| s.pool("intruder").is_none() && s.generation < u64::MAX / 2));
    f.stop().await;
    stranger.stop().await;
    h.stop().await;
}

/// A server that streams, to anyone, frames signed with `secret` (a snapshot with pool
/// `intruder` and a generation from the far future).
async fn open_stranger(secret: &str) -> SocketAddr {
    let snap = llm_router_snapshot::Snapshot {
        rewrites: None,
        objectives: None,
        generation: u64::MAX - 1,
        created_ms: u64::MAX - 1,
        pools: vec![llm_router_snapshot::Pool {
            name: "intruder".into(),
            cluster: "pool_llama".into(),
            models: vec!["m1".into()],
            pods: vec![],
            peer_contexts: Vec::new(),
        }],
    }
    .encode()
    .unwrap();
    let no_tallies = llm_router_snapshot::Tally::encode_all(&[]).unwrap();
    let frame = hub::frame(secret.as_bytes(), &snap, &no_tallies).unwrap();
    let app = axum::Router::new().route(
        hub::STREAM_PATH,
        axum::routing::get(move || {
            let frame = frame.clone();
            async move {
                let frames = futures_util::stream::unfold(frame, |f| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((Ok::<_, std::convert::Infallible>(f.clone()), f))
                });
                axum::body::Body::from_stream(frames)
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    addr
}

const HUB_SECRET: &str = "hub-only-secret-0123456789abcdef-0123";

/// One fake pod and a hub scraping it (the push secret serving as the hub secret).
async fn one_pod_hub() -> (FakeFleet, Running, SocketAddr) {
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(3, 1, 0.25))).await;
    let h = sidecar::start(hub_config(&fleet, "127.0.0.1:0"), SECRET.into())
        .await
        .unwrap();
    let addr = h.hub_addr.unwrap();
    (fleet, h, addr)
}

/// Keys per role: a hub given its own secret refuses whoever holds only the push secret (the
/// proxy's), and a replica's tally verifies only under the key of the replica it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_secret_does_not_open_the_hub_and_no_replica_speaks_for_another() {
    use sidecar_metrics::keys::HubKeys;
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(3, 1, 0.25))).await;
    let mut hc = hub_config(&fleet, "127.0.0.1:0");
    hc.hub.secret = Some(HUB_SECRET.into());
    hc.validate().unwrap();
    let h = sidecar::start(hc, SECRET.into()).await.unwrap();
    let hub_addr = h.hub_addr.unwrap();
    // The push secret, directly or through the derivation the hub uses: 403.
    for token in [
        hub::subscribe_token(SECRET.as_bytes()),
        hub::subscribe_token(&HubKeys::from_secret(SECRET.as_bytes()).subscribe),
    ] {
        let r = testkit::get(
            hub_addr,
            hub::STREAM_PATH,
            &[(llm_router_snapshot::SIGNATURE_HEADER, &token)],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 403);
    }
    let keys = HubKeys::from_secret(HUB_SECRET.as_bytes());
    let now = sidecar_metrics::sidecar::now_ms();
    let tally = |replica: u64, seq: u64| {
        llm_router_snapshot::Tally {
            replica,
            seq,
            taken_ms: now,
            pools: vec![],
        }
        .encode()
        .unwrap()
    };
    let five = keys.credential(5);
    let sign = |key: &[u8], body: &[u8]| llm_router_snapshot::sign(key, body);
    // Signed with the push secret: refused. Replica 5 speaking as 6 (its key, 6's id in the
    // header, or 6's id in the tally): refused.
    let b = tally(5, 1);
    assert_eq!(
        post_tally(hub_addr, "5", &sign(SECRET.as_bytes(), &b), &b).await,
        403
    );
    let b6 = tally(6, 1);
    assert_eq!(
        post_tally(hub_addr, "6", &sign(&five.tally, &b6), &b6).await,
        403
    );
    assert_eq!(
        post_tally(hub_addr, "5", &sign(&five.tally, &b6), &b6).await,
        403
    );
    // Replica 5 as itself: taken; the same bytes again (a replay): refused.
    assert_eq!(
        post_tally(hub_addr, "5", &sign(&five.tally, &b), &b).await,
        204
    );
    assert_eq!(
        post_tally(hub_addr, "5", &sign(&five.tally, &b), &b).await,
        409
    );
    // A follower with replica 7's credential file subscribes (the hub secret never given).
    let dir = std::env::temp_dir().join(format!("llmr-cred-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("credential");
    std::fs::write(&file, keys.credential(7).to_line()).unwrap();
    let proxy = FakeProxy::start().await;
    let mut fc = follower_config(&fleet, proxy.addr, &[hub_addr]);
    fc.hub.credential_file = Some(file.display().to_string());
    fc.validate().unwrap();
    let f = sidecar::start(fc, SECRET.into()).await.unwrap();
    wait("frames with a credential", &f, |s| {
        s.hub.frames_received >= 3
    })
    .await;
    f.stop().await;
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forty slow 4 MiB POSTs without any key: refused unread (declared too large) or cut at the
/// tally limit (chunked), the hub's memory stays bounded and its subscriber keeps the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_slow_large_posts_without_the_secret_neither_grow_the_hub_nor_stop_its_stream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
    let (fleet, h, hub_addr) = one_pod_hub().await;
    let proxy = FakeProxy::start().await;
    let f = sidecar::start(
        follower_config(&fleet, proxy.addr, &[hub_addr]),
        SECRET.into(),
    )
    .await
    .unwrap();
    wait("subscribed", &f, |s| s.hub.frames_received >= 3).await;
    let before_rss = rss_kib();
    let before = f.stats.summary().hub.frames_received;
    let attackers: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(hub_addr).await.unwrap();
                let length = if i % 2 == 0 {
                    "content-length: 4194304\r\n"
                } else {
                    "transfer-encoding: chunked\r\n"
                };
                let head = format!(
                    "POST {} HTTP/1.1\r\nhost: hub\r\n{length}x-llm-router-replica: {i}\r\nx-llm-router-signature: sha256={}\r\n\r\n",
                    sidecar_metrics::share::TALLY_PATH,
                    "0".repeat(64)
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                // 4 MiB in 64 KiB pieces, slowly (≤ 3 s), until the hub answers or closes.
                let piece = vec![b'x'; 64 * 1024];
                let chunk_head = format!("{:x}\r\n", piece.len());
                for _ in 0..64 {
                    let sent = if i % 2 == 0 {
                        s.write_all(&piece).await
                    } else {
                        let mut c = chunk_head.clone().into_bytes();
                        c.extend_from_slice(&piece);
                        c.extend_from_slice(b"\r\n");
                        s.write_all(&c).await
                    };
                    if sent.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(45)).await;
                }
                let mut buf = [0u8; 256];
                let _ = tokio::time::timeout(LIMIT, s.read(&mut buf)).await;
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut peak = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        peak = peak.max(rss_kib());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for a in attackers {
        let _ = tokio::time::timeout(LIMIT, a).await;
    }
    let s = f.stats.summary();
    assert!(
        s.hub.frames_received >= before + 30,
        "the stream kept flowing: {} frames in 3 s at 20 ms rounds",
        s.hub.frames_received - before
    );
    assert_eq!(s.hub.fallbacks.values().sum::<u64>(), 0, "{s:#?}");
    let hub_s = h.stats.summary();
    let refused: u64 = ["forbidden", "too_large", "invalid"]
        .iter()
        .map(|r| hub_s.hub.tallies.get(*r).copied().unwrap_or(0))
        .sum();
    assert_eq!(refused, 40, "{:?}", hub_s.hub.tallies);
    assert_eq!(hub_s.hub.tallies.get("accepted"), None);
    // 40 × 4 MiB read whole would be 160 MiB; at most 40 × the tally limit (10 MiB) is held.
    assert!(
        peak.saturating_sub(before_rss) < 48 * 1024,
        "RSS grew by {} KiB",
        peak.saturating_sub(before_rss)
    );
    f.stop().await;
    h.stop().await;
}

/// A connection that sends nothing (or a head byte by byte) is closed once
/// `FIRST_REQUEST_TIMEOUT` has passed; a refused one is closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_refused_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_fleet, h, hub_addr) = one_pod_hub().await;
    let t0 = Instant::now();
    let mut idle = tokio::net::TcpStream::connect(hub_addr).await.unwrap();
    let mut dripping = tokio::net::TcpStream::connect(hub_addr).await.unwrap();
    let drip = tokio::spawn(async move {
        for b in b"GET /v1/snapshots HTTP/1.1\r\nhost: hub\r\nx-pad: "
            .iter()
            .cycle()
            .take(20)
        {
            if dripping.write_all(&[*b]).await.is_err() {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(LIMIT, dripping.read(&mut buf)).await;
        Instant::now()
    });
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(LIMIT, idle.read(&mut buf))
        .await
        .expect("closed within the limit")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    let closed = t0.elapsed();
    assert!(
        closed >= hub::FIRST_REQUEST_TIMEOUT - Duration::from_millis(100)
            && closed < hub::FIRST_REQUEST_TIMEOUT + Duration::from_secs(2),
        "{closed:?}"
    );
    let dripped = drip.await.unwrap().duration_since(t0);
    assert!(
        dripped < hub::FIRST_REQUEST_TIMEOUT + Duration::from_secs(3),
        "{dripped:?}"
    );
    // Refused (no token): answered, then closed, not kept alive.
    let mut s = tokio::net::TcpStream::connect(hub_addr).await.unwrap();
    s.write_all(b"GET /v1/snapshots HTTP/1.1\r\nhost: hub\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut answer))
        .await
        .expect("closed after the refusal")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 403"));
    h.stop().await;
}
