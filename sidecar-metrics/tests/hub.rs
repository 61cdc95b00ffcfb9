//! The hub and its subscribers in one process (fake pods, a fake proxy): a subscribed sidecar
//! pushes the hub's pod states with its own increasing generations and scrapes nothing; the hub
//! refuses a subscriber without the secret's token; a subscriber refuses a stream signed with
//! another secret (and drops it) and scrapes on its own; a stopped hub makes the sidecar scrape
//! on its own, a hub started again on the same address brings it back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{vllm_text, Answer, FakeFleet, FakeProxy, SECRET};
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
    let frame = hub::frame(secret.as_bytes(), &snap, &no_tallies);
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
