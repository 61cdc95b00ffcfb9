//! The metrics hub: one process scrapes the pods and streams every snapshot to the gateway
//! sidecars that subscribe, so N gateway replicas cost each pod one scraper's load, not N.
//!
//! Transport: one long HTTP/1.1 response per subscriber (`GET` [`STREAM_PATH`], chunked), whose
//! body is a sequence of length-delimited frames (`tokio_util::codec::LengthDelimitedCodec`: a
//! 4-byte big-endian length, then the frame). A frame is a signature as the push header carries
//! it (`sha256=<64 hex>`, [`SIGNATURE_LEN`] bytes) over the rest: the encoded snapshot's length
//! (u32, little-endian), the encoded snapshot, and the gateway replicas' tallies the hub holds
//! (`llm_router_snapshot::Tally::encode_all`; see `crate::share`). The hub writes a frame every
//! scrape round (changed or not: the frames are also its heartbeat); a slow subscriber gets the
//! newest frame, never a backlog (a `watch` channel feeds every stream). Replicas send their
//! tallies to [`crate::share::TALLY_PATH`] on the same listener, signed like a push.
//!
//! Authentication, both ways, with keys per role derived from the hub secret (`crate::keys`):
//! - a subscriber proves it holds the subscribe key with [`SIGNATURE_HEADER`] on its request: the
//!   HMAC of the fixed text [`SUBSCRIBE_CONTEXT`] ([`subscribe_token`]); the hub answers 403
//!   without it. It is a bearer (the key never travels); a sniffer who can read the token can
//!   read the stream anyway.
//! - the subscriber verifies every frame's signature (the frame key) before it decodes it, and
//!   drops the connection on the first frame that fails: a stranger cannot feed it.
//! - a replica's tally is signed with its own key, which the hub derives from the replica id the
//!   request names: no replica can speak for another.
//!
//! The subscriber side ([`subscribe`]) keeps reconnecting with a capped backoff and reports each
//! frame and each loss to the sidecar's loop (`crate::sidecar`), which decides between the hub and
//! its own scraping.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use llm_router_snapshot::{Snapshot, Tally, SIGNATURE_HEADER};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{Encoder, FramedRead, LengthDelimitedCodec};

use crate::keys::{Credential, HubKeys};
use crate::share::{TallyBoard, MAX_TALLY_BYTES, REPLICA_HEADER, TALLY_PATH};
use crate::stats::Stats;

/// Where a hub serves its stream.
pub const STREAM_PATH: &str = "/v1/snapshots";
/// Content type of the stream.
pub const CONTENT_TYPE: &str = "application/x-llm-router-snapshot-frames";
/// What a subscriber signs to subscribe. Version 2: frames carry the replicas' tallies (a
/// version 1 subscriber is refused with 403 and scrapes on its own).
/// Version 3: signed with the subscribe key derived from the hub secret (`crate::keys`), frames
/// with the frame key, tallies with each replica's own key and a sequence number.
pub const SUBSCRIBE_CONTEXT: &[u8] = b"llm-router hub subscribe v3";
/// Bytes of the signature that opens each frame (`sha256=` + 64 hex digits).
pub const SIGNATURE_LEN: usize = 7 + 64;
/// Largest frame accepted: the largest snapshot a filter accepts (its `snapshot.max_bytes`
/// ceiling) plus the signature.
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// The subscribe request's [`SIGNATURE_HEADER`] value, under the subscribe key.
pub fn subscribe_token(subscribe_key: &[u8]) -> String {
    llm_router_snapshot::sign(subscribe_key, SUBSCRIBE_CONTEXT)
}

/// How long a tally's body may take to arrive once its headers did.
const TALLY_BODY_TIMEOUT: Duration = Duration::from_secs(2);

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_codec()
}

/// One frame of the stream, length prefix included, for `snapshot` (encoded) and `tallies`
/// (encoded with `Tally::encode_all`) under the frame key; an error (never an empty frame) when
/// it would exceed [`MAX_FRAME`].
pub fn frame(frame_key: &[u8], snapshot: &[u8], tallies: &[u8]) -> Result<Bytes, String> {
    let too_large = || {
        format!(
            "a frame of {} bytes exceeds the stream's limit of {MAX_FRAME}",
            SIGNATURE_LEN + 4 + snapshot.len() + tallies.len()
        )
    };
    if SIGNATURE_LEN + 4 + snapshot.len() + tallies.len() > MAX_FRAME {
        return Err(too_large());
    }
    let len = u32::try_from(snapshot.len()).map_err(|_| too_large())?;
    let mut body = Vec::with_capacity(4 + snapshot.len() + tallies.len());
    body.extend_from_slice(&len.to_le_bytes());
    body.extend_from_slice(snapshot);
    body.extend_from_slice(tallies);
    let sig = llm_router_snapshot::sign(frame_key, &body);
    let mut payload = BytesMut::with_capacity(sig.len() + body.len());
    payload.extend_from_slice(sig.as_bytes());
    payload.extend_from_slice(&body);
    let mut out = BytesMut::with_capacity(payload.len() + 4);
    codec()
        .encode(payload.freeze(), &mut out)
        .map_err(|_| too_large())?;
    Ok(out.freeze())
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame shorter than its signature")]
    Short,
    #[error("frame signature refused: {0}")]
    Signature(llm_router_snapshot::SignatureError),
    #[error("frame is not a valid snapshot: {0}")]
    Snapshot(String),
}

impl FrameError {
    /// Label for the refused-frames counter.
    pub fn label(&self) -> &'static str {
        match self {
            FrameError::Short | FrameError::Signature(_) => "signature",
            FrameError::Snapshot(_) => "invalid",
        }
    }
}

/// A frame's contents.
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    pub snapshot: Snapshot,
    /// Every gateway replica's tally the hub held (the receiver's own among them).
    pub tallies: Vec<Tally>,
}

/// Verifies (under the frame key) and decodes one frame's payload (without its length prefix).
pub fn open(frame_key: &[u8], payload: &[u8]) -> Result<Opened, FrameError> {
    let (sig, body) = (payload.get(..SIGNATURE_LEN), payload.get(SIGNATURE_LEN..));
    let (Some(sig), Some(body)) = (sig, body) else {
        return Err(FrameError::Short);
    };
    let sig = std::str::from_utf8(sig)
        .map_err(|_| FrameError::Signature(llm_router_snapshot::SignatureError::Malformed))?;
    llm_router_snapshot::verify(frame_key, body, Some(sig)).map_err(FrameError::Signature)?;
    let bad = |m: String| FrameError::Snapshot(m);
    let len = body
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad("no snapshot length".into()))? as usize;
    let snap = body
        .get(4..)
        .and_then(|b| b.get(..len))
        .ok_or_else(|| bad("shorter than its snapshot length".into()))?;
    let rest = body.get(4 + len..).unwrap_or_default();
    Ok(Opened {
        snapshot: Snapshot::decode(snap).map_err(|e| bad(e.to_string()))?,
        tallies: Tally::decode_all(rest).map_err(|e| bad(format!("tallies: {e}")))?,
    })
}

// ---- the hub's side ----

#[derive(Clone)]
struct HubState {
    keys: Arc<HubKeys>,
    frames: watch::Receiver<Option<Bytes>>,
    board: Arc<TallyBoard>,
    stats: Arc<Stats>,
    shutdown: watch::Receiver<bool>,
}

/// Counts a subscriber while its stream lives.
struct Subscribed(Arc<Stats>);

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.0.hub_subscriber(-1);
    }
}

async fn stream(State(s): State<HubState>, headers: HeaderMap) -> Response {
    let given = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if llm_router_snapshot::verify(&s.keys.subscribe, SUBSCRIBE_CONTEXT, given).is_err() {
        s.stats.hub_subscribe_refused();
        tracing::warn!("refused a subscriber without a valid {SIGNATURE_HEADER}");
        return refuse(StatusCode::FORBIDDEN, "subscribe refused\n");
    }
    s.stats.hub_subscriber(1);
    let guard = Subscribed(s.stats.clone());
    let mut rx = s.frames.clone();
    // The newest frame at once (a subscriber that just connected is fed within the round),
    // then each new one; the stream ends with the hub's shutdown.
    rx.mark_changed();
    let state = (rx, s.shutdown.clone(), guard);
    let body = futures_util::stream::unfold(state, |(mut rx, mut stop, guard)| async move {
        loop {
            tokio::select! {
                biased;
                r = stop.changed() => {
                    if r.is_err() || *stop.borrow() {
                        return None;
                    }
                }
                r = rx.changed() => {
                    r.ok()?;
                    let f = rx.borrow_and_update().clone();
                    if let Some(f) = f {
                        return Some((Ok::<Bytes, Infallible>(f), (rx, stop, guard)));
                    }
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// A refusal that closes the connection (a stranger keeps no connection open by being refused).
fn refuse(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONNECTION, "close")], text).into_response()
}

/// A replica's tally: kept on the board when signed with the key of the replica it names
/// ([`REPLICA_HEADER`], and the tally's own `replica`), 204. What the headers can refuse is
/// refused before a byte of the body is read: no replica or no well-formed signature (403), a
/// declared length over [`MAX_TALLY_BYTES`] (413); the body is then read up to that bound within
/// [`TALLY_BODY_TIMEOUT`].
async fn take_tally(
    State(s): State<HubState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let forbidden = |s: &HubState| {
        s.stats.hub_tally("forbidden");
        refuse(StatusCode::FORBIDDEN, "tally refused\n")
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let replica = header(REPLICA_HEADER).and_then(|v| v.trim().parse::<u64>().ok());
    let given = header(SIGNATURE_HEADER);
    let (Some(replica), Some(given)) = (replica, given) else {
        return forbidden(&s);
    };
    if given.trim().len() != SIGNATURE_LEN {
        return forbidden(&s);
    }
    let declared = header(header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_TALLY_BYTES as u64) {
        s.stats.hub_tally("too_large");
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "tally too large\n");
    }
    let body = match tokio::time::timeout(
        TALLY_BODY_TIMEOUT,
        axum::body::to_bytes(body, MAX_TALLY_BYTES),
    )
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            s.stats.hub_tally("too_large");
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "tally too large\n");
        }
        Err(_) => {
            s.stats.hub_tally("invalid");
            return refuse(StatusCode::REQUEST_TIMEOUT, "tally body too slow\n");
        }
    };
    let key = llm_router_snapshot::auth::replica_key(&s.keys.tally_master, replica);
    if llm_router_snapshot::verify(&key, &body, Some(given)).is_err() {
        return forbidden(&s);
    }
    let t = match Tally::decode(&body) {
        Ok(t) if t.replica == replica => t,
        Ok(_) => return forbidden(&s),
        Err(e) => {
            s.stats.hub_tally("invalid");
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    match s
        .board
        .offer(t, std::time::Instant::now(), crate::clock::now_ms())
    {
        Ok(_) => {
            s.stats.hub_tally("accepted");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => {
            s.stats.hub_tally("refused");
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
    }
}

/// The hub's routes: the stream, and the replicas' tallies.
pub fn router(
    keys: HubKeys,
    frames: watch::Receiver<Option<Bytes>>,
    board: Arc<TallyBoard>,
    stats: Arc<Stats>,
    shutdown: watch::Receiver<bool>,
) -> Router {
    Router::new()
        .route(STREAM_PATH, get(stream))
        .route(TALLY_PATH, post(take_tally))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_TALLY_BYTES))
        .with_state(HubState {
            keys: Arc::new(keys),
            frames,
            board,
            stats,
            shutdown,
        })
}

/// Most connections a hub serves at once (subscribers and tallies; gateways hold one stream
/// each, plus a kept tally connection): more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// A connection must have sent its first request (head and body) and been answered within this
/// long of being accepted, or it is closed: a stranger cannot hold a connection by sending
/// nothing, or a head byte by byte.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The hub's listener: at most [`MAX_CONNECTIONS`] connections, each bounded by
/// [`FIRST_REQUEST_TIMEOUT`] until the hub first writes to it.
struct Capped {
    listener: tokio::net::TcpListener,
    slots: Arc<tokio::sync::Semaphore>,
}

/// One accepted connection, holding its slot.
struct CappedIo {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
    /// Until the first write: the time left to read the first request.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl axum::serve::Listener for Capped {
    type Io = CappedIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (CappedIo, std::net::SocketAddr) {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                std::future::pending::<()>().await;
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let deadline = Some(Box::pin(tokio::time::sleep(FIRST_REQUEST_TIMEOUT)));
                    return (
                        CappedIo {
                            stream,
                            _slot: slot,
                            deadline,
                        },
                        addr,
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

impl tokio::io::AsyncRead for CappedIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut this.stream).poll_read(cx, buf);
        if r.is_pending() {
            if let Some(d) = this.deadline.as_mut() {
                if std::future::Future::poll(d.as_mut(), cx).is_ready() {
                    return std::task::Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
                }
            }
        }
        r
    }
}

impl tokio::io::AsyncWrite for CappedIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.deadline = None;
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves the stream and takes tallies until `shutdown` turns true (every open stream ends then).
pub async fn serve(
    listener: tokio::net::TcpListener,
    keys: HubKeys,
    frames: watch::Receiver<Option<Bytes>>,
    board: Arc<TallyBoard>,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = router(keys, frames, board, stats, shutdown.clone());
    let stop = async move {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
    };
    let listener = Capped {
        listener,
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(error = %e, "the hub's stream listener failed");
    }
}

// ---- the subscriber's side ----

/// What a subscription reports to the sidecar's loop.
#[derive(Debug)]
pub enum HubEvent {
    /// A verified snapshot from hub number `hub` (its index in the configured list), with the
    /// replicas' tallies it carried.
    Frame {
        hub: usize,
        snapshot: Snapshot,
        tallies: Vec<Tally>,
    },
    /// The connection to hub `hub` ended or could not be made.
    Down { hub: usize, reason: String },
}

/// A configured hub address: `http://host:port[/path]` or `host:port`.
pub fn hub_uri(spec: &str) -> Result<Uri, String> {
    let rest = spec.strip_prefix("http://").unwrap_or(spec);
    if spec.starts_with("https://") || rest.is_empty() {
        return Err(format!(
            "{spec:?} is not http://host:port[/path] or host:port"
        ));
    }
    let with_path = if rest.contains('/') {
        format!("http://{rest}")
    } else {
        format!("http://{rest}{STREAM_PATH}")
    };
    let uri: Uri = with_path.parse().map_err(|e| format!("{spec:?}: {e}"))?;
    if uri.authority().is_none_or(|a| a.port_u16().is_none()) {
        return Err(format!("{spec:?} has no port"));
    }
    Ok(uri)
}

/// How a subscription behaves.
#[derive(Debug, Clone, Copy)]
pub struct SubscribeOptions {
    /// Connect and first-answer timeout; also the longest wait for a frame before the connection
    /// is dropped and made again (a hub that stopped writing).
    pub timeout: Duration,
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
}

/// Keeps a subscription to hub `hub` at `uri` open until `shutdown`, sending each verified frame
/// and each loss to `events`.
pub async fn subscribe(
    hub: usize,
    uri: Uri,
    cred: Credential,
    opts: SubscribeOptions,
    events: mpsc::Sender<HubEvent>,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let sub = Subscription::new(hub, uri, cred, opts, events, stats);
    let mut backoff = Duration::from_millis(50);
    let mut logged_down = false;
    loop {
        let mut delivered = false;
        let reason = tokio::select! {
            r = sub.session(&mut delivered) => r,
            _ = shutdown.changed() => return,
        };
        let reason = match reason {
            Ok(()) => return,
            Err(r) => r,
        };
        if delivered {
            // A loss after frames, not a refusal: log it, and retry soon.
            logged_down = false;
            backoff = Duration::from_millis(50);
        }
        if logged_down {
            tracing::debug!(hub = %sub.uri, reason = %reason, "hub still unavailable");
        } else {
            tracing::warn!(hub = %sub.uri, reason = %reason, "hub subscription lost");
            logged_down = true;
        }
        if sub
            .events
            .send(HubEvent::Down {
                hub,
                reason: reason.clone(),
            })
            .await
            .is_err()
        {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(opts.max_backoff);
    }
}

type SubscribeClient = hyper_util::client::legacy::Client<HttpConnector, Empty<Bytes>>;

/// What every connection of one subscription uses.
struct Subscription {
    hub: usize,
    uri: Uri,
    cred: Credential,
    opts: SubscribeOptions,
    events: mpsc::Sender<HubEvent>,
    stats: Arc<Stats>,
    client: SubscribeClient,
    /// The signed subscribe request's header value.
    token: String,
}

impl Subscription {
    fn new(
        hub: usize,
        uri: Uri,
        cred: Credential,
        opts: SubscribeOptions,
        events: mpsc::Sender<HubEvent>,
        stats: Arc<Stats>,
    ) -> Subscription {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(opts.timeout));
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(conn);
        let token = subscribe_token(&cred.subscribe);
        Subscription {
            hub,
            uri,
            cred,
            opts,
            events,
            stats,
            client,
            token,
        }
    }

    /// One connection, frames passed on until it ends: `Err` with why, `Ok` when the loop is
    /// gone. `delivered` turns true with the first verified frame.
    async fn session(&self, delivered: &mut bool) -> Result<(), String> {
        let timeout = self.opts.timeout;
        let body = self
            .connect()
            .await?
            .into_body()
            .into_data_stream()
            .map(|r| r.map_err(std::io::Error::other));
        let mut frames = FramedRead::new(tokio_util::io::StreamReader::new(body), codec());
        loop {
            let next = tokio::time::timeout(timeout, frames.next())
                .await
                .map_err(|_| format!("no frame within {timeout:?}"))?;
            let payload = match next {
                None => return Err("the hub closed the stream".to_string()),
                Some(Err(e)) => return Err(format!("stream broken: {e}")),
                Some(Ok(p)) => p,
            };
            if !self.pass_on(&payload, delivered).await? {
                return Ok(());
            }
        }
    }

    /// The signed subscribe request, answered 200 within the timeout.
    async fn connect(&self) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let req = hyper::Request::get(self.uri.clone())
            .header(SIGNATURE_HEADER, self.token.as_str())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(self.opts.timeout, self.client.request(req))
            .await
            .map_err(|_| format!("no answer within {:?}", self.opts.timeout))?
            .map_err(|e| error_chain(&e))?;
        if resp.status() != StatusCode::OK {
            return Err(format!("answered {}", resp.status()));
        }
        Ok(resp)
    }

    /// Verifies one frame and sends it to the loop: `Ok(false)` when the loop is gone, `Err`
    /// for a frame that does not verify (a stranger, or a hub with another secret: never fed
    /// from it).
    async fn pass_on(&self, payload: &[u8], delivered: &mut bool) -> Result<bool, String> {
        let Opened { snapshot, tallies } = open(&self.cred.frame, payload).map_err(|e| {
            self.stats.hub_frame_refused(e.label());
            e.to_string()
        })?;
        if !*delivered {
            *delivered = true;
            tracing::info!(hub = %self.uri, "subscribed to the hub");
        }
        self.stats.hub_frame_received();
        let frame = HubEvent::Frame {
            hub: self.hub,
            snapshot,
            tallies,
        };
        Ok(self.events.send(frame).await.is_ok())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio_util::codec::Decoder;

    const SECRET: &[u8] = b"hub-test-secret-0123456789abcdef0123";

    fn snap(generation: u64) -> Vec<u8> {
        Snapshot {
            rewrites: None,
            objectives: None,
            generation,
            created_ms: 5,
            pools: vec![],
        }
        .encode()
        .unwrap()
    }

    #[test]
    fn frames_round_trip_and_refuse_other_secrets() {
        let tallies = vec![Tally {
            replica: 3,
            seq: 9,
            taken_ms: 9,
            pools: vec![],
        }];
        let f = frame(SECRET, &snap(7), &Tally::encode_all(&tallies).unwrap()).unwrap();
        let mut buf = BytesMut::from(&f[..]);
        let payload = codec().decode(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty());
        let opened = open(SECRET, &payload).unwrap();
        assert_eq!(opened.snapshot.generation, 7);
        assert_eq!(opened.tallies, tallies);
        assert!(matches!(
            open(b"another-secret-0123456789abcdef0123", &payload),
            Err(FrameError::Signature(_))
        ));
        // A frame whose snapshot was changed after signing.
        let mut bent = payload.to_vec();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert!(matches!(open(SECRET, &bent), Err(FrameError::Signature(_))));
        assert_eq!(open(SECRET, b"sha256="), Err(FrameError::Short));
    }

    /// A frame over the stream's limit is an error to report, never an empty frame sent.
    #[test]
    fn a_frame_over_the_limit_is_an_error() {
        let big = vec![0u8; MAX_FRAME];
        let e = frame(SECRET, &snap(1), &big).unwrap_err();
        assert!(e.contains("exceeds"), "{e}");
    }

    #[test]
    fn hub_addresses() {
        assert_eq!(
            hub_uri("http://hub:9465").unwrap().to_string(),
            "http://hub:9465/v1/snapshots"
        );
        assert_eq!(
            hub_uri("10.0.0.1:9465").unwrap().to_string(),
            "http://10.0.0.1:9465/v1/snapshots"
        );
        assert_eq!(
            hub_uri("http://hub:1/x").unwrap().to_string(),
            "http://hub:1/x"
        );
        for bad in ["", "https://hub:1", "hub", "http://hub"] {
            assert!(hub_uri(bad).is_err(), "{bad:?}");
        }
    }
}
