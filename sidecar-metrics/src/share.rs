//! Gateway replicas' work, shared through the hubs so that every replica counts the others'.
//!
//! Each gateway sidecar that follows hubs reads its proxy's tally — a long poll the proxy
//! answers when the tally moves, reads starting at most every `hub.share_ms` ([`share`])
//! (`GET {push.tally_path}` on the internal listener: the requests in flight and the prompt
//! tokens still to prefill per pod, [`llm_router_snapshot::Tally`]), stamps it with its replica
//! id (random per process) and POSTs it, signed like a push, to every hub address its upstreams
//! resolve to ([`share`]). Each hub keeps the latest tally per replica on its [`TallyBoard`]
//! and drops one that has not been renewed for `hub.tally_ttl_ms` (a replica gone); every frame
//! it streams carries the board, and each subscriber sums the tallies of the *other* replicas
//! into the snapshot it pushes (`llm_router_snapshot::tally::merge_peers`), never its own.
//!
//! How old the others' work is when a proxy sees it: the read (about a millisecond after the
//! change, or up to one `share_ms` when the last read started less than that before; a whole
//! `share_ms` with a proxy that predates the long poll) plus the wait for the hub's next frame
//! (`hub.tally_frame_ms`) plus the push; the subscriber measures it
//! per frame from the oldest tally it merged (`llm_router_sidecar_peer_work_age_seconds`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use llm_router_snapshot::tally::{
    MAX_CLOCK_SKEW_MS, MAX_TALLIES, TALLY_AFTER_PARAM, TALLY_VERSION_HEADER, TALLY_WAIT_PARAM,
};
use llm_router_snapshot::{Tally, SIGNATURE_HEADER};
use tokio::sync::watch;

use crate::stats::Stats;

/// Where a hub takes tallies.
pub const TALLY_PATH: &str = "/v1/tallies";
/// Largest tally a hub reads, and a replica sends: a tally lists only the pods with the
/// replica's work (≈ 30 bytes each) and ≤ 128 placed contexts per pool (16 bytes each), so
/// thousands of busy pods fit. A larger declared body is refused unread.
pub const MAX_TALLY_BYTES: usize = 256 * 1024;
/// The request header naming the replica whose key signed the tally (decimal id).
pub const REPLICA_HEADER: &str = "x-llm-router-replica";
/// A tally whose `taken_ms` is older than this by the hub's clock is refused (a replay of an
/// old capture, or a replica whose clock is far behind). Above any `tally_ttl_ms` worth using.
pub const MAX_TALLY_AGE_MS: u64 = 5_000;
/// How often the hubs' addresses are resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// The latest tally of each replica, as a hub holds them, and the last sequence number taken
/// from each (kept after the tally expires, until a replay of it would be refused as too old).
#[derive(Debug)]
pub struct TallyBoard {
    ttl: Duration,
    inner: Mutex<Board>,
    /// Woken when a tally changes what the board says (see [`TallyBoard::changed`]).
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Board {
    live: HashMap<u64, (Tally, Instant)>,
    /// Per replica: the last `seq` taken, and that tally's `taken_ms`.
    seen: HashMap<u64, (u64, u64)>,
}

/// Why a hub refused a tally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("replica id 0 is reserved")]
    NoReplica,
    #[error(
        "its seq is not above the last one taken from this replica (a replay, or out of order)"
    )]
    Old,
    #[error("taken_ms is more than {MAX_CLOCK_SKEW_MS} ms ahead of the hub's clock")]
    Future,
    #[error("taken_ms is more than {MAX_TALLY_AGE_MS} ms behind the hub's clock")]
    Expired,
    #[error("the board holds {MAX_TALLIES} replicas")]
    Full,
}

impl TallyBoard {
    pub fn new(ttl: Duration) -> TallyBoard {
        TallyBoard {
            ttl,
            inner: Mutex::new(Board::default()),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Resolves after a tally changed what the board says: a new replica, or a replica's work
    /// per pod or placed contexts differing from its last tally (a renewal with the same work
    /// does not count). One waiter (the hub's loop); a change before it waits is kept for it.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `t` (its signature already checked against its replica's key) as its replica's
    /// latest when its `seq` is above the last one taken from that replica — so a captured
    /// tally, replayed, never renews or replaces anything, even after its replica's tally
    /// expired — and its `taken_ms` is within [`MAX_CLOCK_SKEW_MS`] ahead of and
    /// [`MAX_TALLY_AGE_MS`] behind the hub's clock `now_ms`. A new replica finds room only
    /// below [`MAX_TALLIES`] live ones. `Ok(true)` when the tally changed what the board says
    /// (then [`TallyBoard::changed`] wakes).
    pub fn offer(&self, t: Tally, now: Instant, now_ms: u64) -> Result<bool, Refused> {
        if t.replica == 0 {
            return Err(Refused::NoReplica);
        }
        if t.taken_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(Refused::Future);
        }
        let too_old = |taken_ms: u64| taken_ms.saturating_add(MAX_TALLY_AGE_MS) < now_ms;
        if too_old(t.taken_ms) {
            return Err(Refused::Expired);
        }
        let mut b = self.lock();
        let ttl = self.ttl;
        b.live
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
        b.seen.retain(|_, (_, taken)| !too_old(*taken));
        if b.seen.get(&t.replica).is_some_and(|(seq, _)| t.seq <= *seq) {
            return Err(Refused::Old);
        }
        let changed = match b.live.get(&t.replica) {
            None if b.live.len() >= MAX_TALLIES
                || (!b.seen.contains_key(&t.replica) && b.seen.len() >= 4 * MAX_TALLIES) =>
            {
                return Err(Refused::Full)
            }
            Some((held, _)) => held.pools != t.pools,
            None => true,
        };
        b.seen.insert(t.replica, (t.seq, t.taken_ms));
        b.live.insert(t.replica, (t, now));
        drop(b);
        if changed {
            self.changed.notify_one();
        }
        Ok(changed)
    }

    /// Every live tally (renewed within the TTL), by replica id; expired ones are dropped.
    pub fn current(&self, now: Instant) -> Vec<Tally> {
        let mut b = self.lock();
        let ttl = self.ttl;
        b.live
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
        let mut v: Vec<Tally> = b.live.values().map(|(t, _)| t.clone()).collect();
        v.sort_by_key(|t| t.replica);
        v
    }
}

/// The sequence number of a replica's next tally: one past the last and never behind the clock
/// in µs, so a restarted replica (the same id from its credential) starts above its previous
/// life's.
pub fn next_seq(last: u64, now_ms: u64) -> u64 {
    last.saturating_add(1).max(now_ms.saturating_mul(1_000))
}

/// A random replica id, never 0.
pub fn replica_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

/// Where and how a replica shares its tally.
#[derive(Debug, Clone)]
pub struct ShareOptions {
    pub interval: Duration,
    /// The proxy's tally URI (`http://{push.address}{push.tally_path}`).
    pub tally_uri: Uri,
    /// The hubs' stream URIs as configured (their host and port are resolved; the path is
    /// replaced by [`TALLY_PATH`]).
    pub hubs: Vec<Uri>,
    pub timeout: Duration,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client(timeout: Duration) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(timeout));
    Client::builder(TokioExecutor::new()).build(conn)
}

/// Every address the hubs' names resolve to now (a headless Service lists every hub).
async fn resolve(hubs: &[Uri]) -> Vec<(SocketAddr, String)> {
    let mut out = Vec::new();
    for u in hubs {
        let (Some(host), Some(port)) = (u.host(), u.port_u16()) else {
            continue;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match tokio::net::lookup_host((host, port)).await {
            Ok(addrs) => {
                for a in addrs {
                    if !out.iter().any(|(b, _)| *b == a) {
                        out.push((a, format!("{}:{port}", u.host().unwrap_or(host))));
                    }
                }
            }
            Err(e) => tracing::debug!(hub = %u, error = %e, "cannot resolve the hub"),
        }
    }
    out
}

/// How long a read of the tally is held at most while nothing changes: renewals of a busy
/// replica's unchanged tally come this often, a fifth of the hubs' default `hub.tally_ttl_ms`
/// (500), so a loaded machine that delays a renewal or two does not let the hubs drop a
/// replica that still has work.
pub const HOLD: Duration = Duration::from_millis(100);

/// The proxy's tally and the version it named (none from a filter without the long poll); held
/// until the tally moves past `after`, when given.
async fn read_tally(
    c: &HttpClient,
    uri: &Uri,
    timeout: Duration,
    after: Option<u64>,
) -> Result<(Tally, Option<u64>), String> {
    let (uri, timeout) = match after {
        Some(v) => {
            let held = format!(
                "{uri}?{TALLY_AFTER_PARAM}={v}&{TALLY_WAIT_PARAM}={}",
                HOLD.as_millis()
            );
            (
                held.parse::<Uri>().map_err(|e| e.to_string())?,
                timeout + HOLD,
            )
        }
        None => (uri.clone(), timeout),
    };
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, c.request(req))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let version = resp
        .headers()
        .get(TALLY_VERSION_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = tokio::time::timeout(timeout, resp.into_body().collect())
        .await
        .map_err(|_| "body timed out".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("answered {status}"));
    }
    Ok((Tally::decode(&body).map_err(|e| e.to_string())?, version))
}

async fn send(
    c: &HttpClient,
    addr: SocketAddr,
    authority: &str,
    body: Bytes,
    replica: u64,
    signature: &str,
    timeout: Duration,
) -> Result<(), String> {
    let uri = format!("http://{addr}{TALLY_PATH}");
    let req = hyper::Request::post(uri)
        .header(hyper::header::HOST, authority)
        .header(
            hyper::header::CONTENT_TYPE,
            "application/x-llm-router-tally",
        )
        .header(REPLICA_HEADER, replica)
        .header(SIGNATURE_HEADER, signature)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, c.request(req))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    // Drain the (short) answer so the connection is reused.
    let _ = tokio::time::timeout(timeout, resp.into_body().collect()).await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

/// Reads the proxy's tally and sends it, stamped with the credential's replica id and the next
/// sequence number and signed with its own tally key, to every hub until `shutdown`. Reads
/// start at most once per interval; a proxy that names its tally's version
/// ([`TALLY_VERSION_HEADER`]) is asked to hold each read until the tally moves past the
/// version last read, or [`HOLD`] passes (a long poll: a change goes out about a millisecond
/// after it happens, unless the last read started less than an interval ago). An empty
/// tally is sent once after work ends (so the hubs clear it at once), then not again until
/// there is work: a replica without work needs no heartbeat, its last tally expiring means the
/// same.
pub async fn share(
    opts: ShareOptions,
    cred: crate::keys::Credential,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let c = client(opts.timeout);
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hubs: Vec<(SocketAddr, String)> = Vec::new();
    let mut resolved_at: Option<Instant> = None;
    let mut last_empty = true;
    let mut logged = false;
    let mut seq = 0u64;
    let mut version: Option<u64> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if resolved_at.is_none_or(|t| t.elapsed() >= RESOLVE_EVERY) || hubs.is_empty() {
            hubs = resolve(&opts.hubs).await;
            resolved_at = Some(Instant::now());
        }
        let read = tokio::select! {
            r = read_tally(&c, &opts.tally_uri, opts.timeout, version) => r,
            _ = shutdown.changed() => return,
        };
        let mut t = match read {
            Ok((t, v)) => {
                version = v;
                t
            }
            Err(e) => {
                version = None;
                stats.tally_shared("proxy_error");
                if !logged {
                    tracing::warn!(proxy = %opts.tally_uri, error = %e, "cannot read the proxy's tally; other replicas will not count this one's work");
                    logged = true;
                }
                continue;
            }
        };
        let empty = t.pools.is_empty();
        if empty && last_empty {
            continue;
        }
        last_empty = empty;
        t.replica = cred.replica;
        seq = next_seq(seq, crate::clock::now_ms());
        t.seq = seq;
        let Some(bytes) = encode_tally(&t) else {
            continue;
        };
        let signature = llm_router_snapshot::sign(&cred.tally, &bytes);
        let bytes = Bytes::from(bytes);
        let sends = hubs.iter().map(|(addr, authority)| {
            send(
                &c,
                *addr,
                authority,
                bytes.clone(),
                cred.replica,
                &signature,
                opts.timeout,
            )
        });
        let results = join_all(sends).await;
        count_sends(&results, &stats, &mut logged, hubs.len());
    }
}

/// The stamped tally's bytes, `None` when it cannot be encoded or is larger than a hub reads.
fn encode_tally(t: &Tally) -> Option<Vec<u8>> {
    match t.encode() {
        Ok(b) if b.len() <= MAX_TALLY_BYTES => Some(b),
        Ok(b) => {
            tracing::error!(
                bytes = b.len(),
                max = MAX_TALLY_BYTES,
                "this replica's tally is larger than a hub reads; not sent"
            );
            None
        }
        Err(_) => None,
    }
}

/// Counts each hub's answer to one tally and logs the first failure after a success (`logged`
/// holds whether a failure is already logged; a tally every hub took clears it).
fn count_sends(results: &[Result<(), String>], stats: &Stats, logged: &mut bool, hubs: usize) {
    let failed = results.iter().filter(|r| r.is_err()).count();
    for r in results {
        stats.tally_shared(if r.is_ok() { "sent" } else { "hub_error" });
    }
    if failed > 0 && !*logged {
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            tracing::warn!(error = %e, failed, hubs, "a tally did not reach every hub");
        }
        *logged = true;
    } else if failed == 0 {
        *logged = false;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use llm_router_snapshot::{TallyPod, TallyPool};

    /// `seq` follows `taken_ms` as a sender's does.
    fn tally(replica: u64, taken_ms: u64, n: u32) -> Tally {
        Tally {
            replica,
            seq: taken_ms,
            taken_ms,
            pools: vec![TallyPool {
                name: "p".into(),
                pods: vec![TallyPod {
                    address: "10.0.0.1:8000".into(),
                    in_flight: n,
                    pending_tokens: 10 * n,
                }],
                contexts: Vec::new(),
            }],
        }
    }

    impl TallyBoard {
        /// With the hub's clock at 2,000 ms: every test tally is recent.
        fn offer_at(&self, t: Tally, now: Instant) -> Result<bool, Refused> {
            self.offer(t, now, 2_000)
        }
    }

    #[test]
    fn a_replayed_future_or_old_tally_is_refused_and_an_equal_one_does_not_renew() {
        let b = TallyBoard::new(Duration::from_millis(500));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let now_ms = 1_700_000_000_000;
        let t = tally(1, now_ms, 3);
        assert_eq!(b.offer(t.clone(), t0, now_ms), Ok(true));
        // The same bytes again (a replay, or an equal renewal): refused, nothing renewed.
        assert_eq!(
            b.offer(t.clone(), t0 + ms(400), now_ms + 400),
            Err(Refused::Old)
        );
        assert_eq!(b.current(t0 + ms(520)), vec![], "expired, not renewed");
        // After the TTL the same bytes are still a replay.
        assert_eq!(
            b.offer(t.clone(), t0 + ms(600), now_ms + 600),
            Err(Refused::Old)
        );
        // Dated in the future beyond the skew, or too old: refused whatever the seq.
        let mut future = tally(2, now_ms + MAX_CLOCK_SKEW_MS + 1, 9);
        assert_eq!(b.offer(future.clone(), t0, now_ms), Err(Refused::Future));
        future.taken_ms = u64::MAX;
        assert_eq!(b.offer(future, t0, now_ms), Err(Refused::Future));
        let old = tally(3, now_ms - MAX_TALLY_AGE_MS - 1, 9);
        assert_eq!(b.offer(old, t0, now_ms), Err(Refused::Expired));
        // Within the skew, a newer seq: taken.
        let mut next = tally(1, now_ms + 1_000, 4);
        next.seq = t.seq + 1;
        assert_eq!(b.offer(next, t0 + ms(700), now_ms + 700), Ok(true));
        // A sender's sequence never repeats and starts above a previous life's.
        assert_eq!(next_seq(0, 5), 5_000);
        assert_eq!(next_seq(5_000, 5), 5_001);
        assert!(next_seq(0, 6) > next_seq(5_000, 5));
    }

    #[test]
    fn a_replicas_latest_tally_is_kept_and_expires_when_not_renewed() {
        let b = TallyBoard::new(Duration::from_millis(500));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(b.offer_at(tally(1, 1_000, 3), t0), Ok(true));
        assert_eq!(b.offer_at(tally(2, 1_005, 1), t0), Ok(true));
        assert_eq!(b.offer_at(tally(1, 1_025, 4), t0 + ms(25)), Ok(true));
        // A renewal (a newer seq) with the same work keeps the replica alive without being news.
        assert_eq!(b.offer_at(tally(2, 1_010, 1), t0 + ms(10)), Ok(false));
        // Out of order: an older tally never replaces a newer one.
        assert_eq!(
            b.offer_at(tally(1, 1_010, 9), t0 + ms(30)),
            Err(Refused::Old)
        );
        let now = b.current(t0 + ms(40));
        assert_eq!(
            now.iter()
                .map(|t| (t.replica, t.pools[0].pods[0].in_flight))
                .collect::<Vec<_>>(),
            vec![(1, 4), (2, 1)]
        );
        // Replica 2 stops sending (gone): its tally is dropped after the TTL, replica 1's kept.
        let later = b.current(t0 + ms(515));
        assert_eq!(later.iter().map(|t| t.replica).collect::<Vec<_>>(), vec![1]);
        assert_eq!(b.current(t0 + ms(600)), vec![]);
        // A replica coming back is news again.
        assert_eq!(b.offer_at(tally(2, 1_700, 1), t0 + ms(700)), Ok(true));
        // A restarted replica (new id) starts afresh; id 0 is nobody.
        assert_eq!(b.offer_at(tally(0, 1, 1), t0), Err(Refused::NoReplica));
    }

    #[tokio::test]
    async fn a_tally_that_changes_the_board_wakes_its_waiter_and_a_renewal_does_not() {
        let b = Arc::new(TallyBoard::new(Duration::from_millis(500)));
        let t0 = Instant::now();
        let woken = |b: &Arc<TallyBoard>| {
            let b = b.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(50), b.changed())
                    .await
                    .is_ok()
            }
        };
        // A change made before anyone waits is kept for the waiter.
        b.offer_at(tally(1, 1_000, 3), t0).unwrap();
        assert!(woken(&b).await);
        // Nothing new since: no wake-up.
        assert!(!woken(&b).await);
        b.offer_at(tally(1, 1_025, 3), t0).unwrap();
        assert!(!woken(&b).await, "a renewal with the same work is not news");
        b.offer_at(tally(1, 1_050, 4), t0).unwrap();
        assert!(woken(&b).await);
    }

    #[test]
    fn the_board_is_bounded() {
        let b = TallyBoard::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for r in 1..=MAX_TALLIES as u64 {
            b.offer_at(tally(r, 1, 1), t0).unwrap();
        }
        assert_eq!(b.offer_at(tally(9_999, 1, 1), t0), Err(Refused::Full));
        // A known replica still renews its own.
        b.offer_at(tally(1, 2, 2), t0).unwrap();
        assert_eq!(b.current(t0).len(), MAX_TALLIES);
    }
}
