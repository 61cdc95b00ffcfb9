//! A minimal HTTP/1.1 keep-alive GET client for scraping, one connection per pod.
//!
//! Why not hyper's pooled client here: scraping 100 pods every 50 ms is 2000 requests a second,
//! and with hyper each one crosses a pool checkout, a dispatch channel and a second task (the
//! connection driver). This client keeps one `TcpStream` per pod in the pod's own state, writes a
//! request prepared once, and reads the answer into the pod's reused buffer in the same task:
//! about the floor of what a request costs (one write, one or a few reads). The response head is
//! parsed by `httparse` (hyper's own parser); bodies may have a `Content-Length`, be chunked, or
//! run to the end of the connection. A pooled connection the server closed while idle is retried
//! once on a fresh one. Push and the Kubernetes watch still use hyper.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Why a GET failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HttpError {
    #[error("connect: {0}")]
    Connect(String),
    #[error("i/o: {0}")]
    Io(String),
    #[error("connection closed before the answer was complete")]
    Closed,
    #[error("bad HTTP answer: {0}")]
    Protocol(String),
    #[error("answer larger than {0} bytes")]
    TooLarge(usize),
}

/// A prepared GET for one pod.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// Shared, so cloning a target for each scrape costs no copy.
    request: std::sync::Arc<[u8]>,
}

impl Target {
    /// `path_and_query` must start with '/' and contain no spaces or line breaks.
    pub fn new(addr: SocketAddr, path_and_query: &str) -> Option<Target> {
        if !path_and_query.starts_with('/')
            || path_and_query.bytes().any(|b| b <= b' ' || b == 0x7f)
        {
            return None;
        }
        let request = format!(
            "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain;version=0.0.4\r\n\
             User-Agent: llm-router-sidecar\r\n\r\n"
        )
        .into_bytes()
        .into();
        Some(Target { addr, request })
    }
}

/// The connection of one pod, kept between scrapes.
#[derive(Default)]
pub struct Conn {
    stream: Option<TcpStream>,
}

impl Conn {
    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }
}

/// How the body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// The answer head: status, framing, and whether the connection may be reused.
struct Head {
    status: u16,
    framing: Framing,
    keep_alive: bool,
    len: usize,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HttpError::Protocol(e.to_string())),
    };
    let status = resp.code.unwrap_or(0);
    let mut keep_alive = resp.version == Some(1);
    let mut length = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            match (v, length) {
                (Some(v), None) => length = Some(v),
                (Some(v), Some(old)) if v == old => {}
                _ => {
                    return Err(HttpError::Protocol(
                        "bad or conflicting Content-Length".into(),
                    ))
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            chunked = v.split(',').next_back().map(str::trim) == Some("chunked");
            if !chunked {
                return Err(HttpError::Protocol(format!(
                    "unsupported Transfer-Encoding {v:?}"
                )));
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            if v.contains("close") {
                keep_alive = false;
            } else if v.contains("keep-alive") {
                keep_alive = true;
            }
        }
    }
    let framing = if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::Length(0)
    } else {
        keep_alive = false;
        Framing::UntilClose
    };
    Ok(Some(Head {
        status,
        framing,
        keep_alive,
        len,
    }))
}

/// Decodes a chunked body from `src` into `out` (cleared first). `Ok(None)` = incomplete.
/// Returns the bytes of `src` consumed (including the trailer section).
pub fn decode_chunked(
    src: &[u8],
    out: &mut Vec<u8>,
    max: usize,
) -> Result<Option<usize>, HttpError> {
    out.clear();
    let mut pos = 0usize;
    loop {
        let Some(nl) = src.get(pos..).and_then(|s| memchr::memchr(b'\n', s)) else {
            return Ok(None);
        };
        let line = src.get(pos..pos + nl).unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let hex = line.split(|&b| b == b';').next().unwrap_or(&[]);
        let hex = std::str::from_utf8(hex)
            .map_err(|_| HttpError::Protocol("bad chunk size".into()))?
            .trim();
        if hex.is_empty() || hex.len() > 15 {
            return Err(HttpError::Protocol("bad chunk size".into()));
        }
        let size = usize::from_str_radix(hex, 16)
            .map_err(|_| HttpError::Protocol("bad chunk size".into()))?;
        pos += nl + 1;
        if size == 0 {
            // Trailers: lines until an empty one.
            loop {
                let Some(nl) = src.get(pos..).and_then(|s| memchr::memchr(b'\n', s)) else {
                    return Ok(None);
                };
                let line = src.get(pos..pos + nl).unwrap_or(&[]);
                pos += nl + 1;
                if line.is_empty() || line == b"\r" {
                    return Ok(Some(pos));
                }
            }
        }
        if out.len() + size > max {
            return Err(HttpError::TooLarge(max));
        }
        let Some(data) = src.get(pos..pos + size) else {
            return Ok(None);
        };
        out.extend_from_slice(data);
        pos += size;
        match src.get(pos..pos + 2) {
            None => return Ok(None),
            Some(b"\r\n") => pos += 2,
            Some([b'\n', _]) => pos += 1,
            Some(_) => return Err(HttpError::Protocol("chunk not followed by CRLF".into())),
        }
    }
}

/// Reads more into `buf`; `Ok(0)` at end of stream.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, max: usize) -> Result<usize, HttpError> {
    if buf.len() >= max {
        return Err(HttpError::TooLarge(max));
    }
    let want = (max - buf.len()).min(64 * 1024);
    buf.reserve(want.min(16 * 1024));
    let n = (&mut *stream)
        .take(want as u64)
        .read_buf(buf)
        .await
        .map_err(|e| HttpError::Io(e.to_string()))?;
    Ok(n)
}

/// A complete answer: its status, and where its body is — a range of the raw buffer (no copy),
/// or the decoded-body buffer (chunked answers).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    in_raw: Option<std::ops::Range<usize>>,
}

impl Answer {
    /// The body, given the two buffers passed to [`get`].
    pub fn body<'a>(&self, raw: &'a [u8], decoded: &'a [u8]) -> &'a [u8] {
        match &self.in_raw {
            Some(r) => raw.get(r.clone()).unwrap_or(&[]),
            None => decoded,
        }
    }
}

/// One exchange on an open stream. `Err((e, fresh_retry_ok))`: whether nothing was received.
async fn exchange(
    stream: &mut TcpStream,
    target: &Target,
    raw: &mut Vec<u8>,
    body: &mut Vec<u8>,
    max: usize,
) -> Result<(Answer, bool), (HttpError, bool)> {
    raw.clear();
    body.clear();
    stream
        .write_all(&target.request)
        .await
        .map_err(|e| (HttpError::Io(e.to_string()), true))?;
    let limit = max.saturating_add(MAX_HEAD);
    let head = loop {
        if let Some(h) = parse_head(raw).map_err(|e| (e, false))? {
            break h;
        }
        if raw.len() > MAX_HEAD {
            return Err((HttpError::Protocol("response head too large".into()), false));
        }
        let n = fill(stream, raw, limit)
            .await
            .map_err(|e| (e, raw.is_empty()))?;
        if n == 0 {
            return Err((HttpError::Closed, raw.is_empty()));
        }
    };
    match head.framing {
        Framing::Length(n) => {
            if n > max {
                return Err((HttpError::TooLarge(max), false));
            }
            while raw.len() < head.len + n {
                if fill(stream, raw, head.len + n)
                    .await
                    .map_err(|e| (e, false))?
                    == 0
                {
                    return Err((HttpError::Closed, false));
                }
            }
            let answer = Answer {
                status: head.status,
                in_raw: Some(head.len..head.len + n),
            };
            // Extra bytes after the body would be a protocol error on a keep-alive connection.
            Ok((answer, head.keep_alive && raw.len() == head.len + n))
        }
        Framing::Chunked => loop {
            let src = raw.get(head.len..).unwrap_or(&[]);
            if let Some(used) = decode_chunked(src, body, max).map_err(|e| (e, false))? {
                let answer = Answer {
                    status: head.status,
                    in_raw: None,
                };
                return Ok((answer, head.keep_alive && head.len + used == raw.len()));
            }
            if fill(stream, raw, limit).await.map_err(|e| (e, false))? == 0 {
                return Err((HttpError::Closed, false));
            }
        },
        Framing::UntilClose => loop {
            if fill(stream, raw, limit).await.map_err(|e| (e, false))? == 0 {
                if raw.len() - head.len > max {
                    return Err((HttpError::TooLarge(max), false));
                }
                return Ok((
                    Answer {
                        status: head.status,
                        in_raw: Some(head.len..raw.len()),
                    },
                    false,
                ));
            }
        },
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, HttpError> {
    let s = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| HttpError::Connect(format!("{addr}: connect timed out")))?
        .map_err(|e| HttpError::Connect(format!("{addr}: {e}")))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// GETs `target` on `conn` (opening it if needed), reading into `raw` (and decoding chunked
/// bodies into `body`); [`Answer::body`] gives the body. The caller bounds the whole call with a timeout; a timed-out call drops
/// the future, and the connection, which was taken out of `conn`, is not reused.
pub async fn get(
    conn: &mut Conn,
    target: &Target,
    raw: &mut Vec<u8>,
    body: &mut Vec<u8>,
    max: usize,
    connect_timeout: Duration,
) -> Result<Answer, HttpError> {
    let reused = conn.stream.is_some();
    let mut stream = match conn.stream.take() {
        Some(s) => s,
        None => connect(target.addr, connect_timeout).await?,
    };
    let result = match exchange(&mut stream, target, raw, body, max).await {
        Err((_, true)) if reused => {
            // The server closed the idle connection: one retry on a fresh one.
            stream = connect(target.addr, connect_timeout).await?;
            exchange(&mut stream, target, raw, body, max).await
        }
        r => r,
    };
    match result {
        Ok((answer, keep)) => {
            if keep {
                conn.stream = Some(stream);
            }
            Ok(answer)
        }
        Err((e, _)) => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn chunked_bodies_decode() {
        let mut out = Vec::new();
        let src = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n";
        assert_eq!(decode_chunked(src, &mut out, 1000), Ok(Some(src.len())));
        assert_eq!(out, b"Wikipedia in\r\n\r\nchunks.");
        // Every prefix is "incomplete", never an error or a wrong answer.
        for cut in 0..src.len() {
            assert_eq!(
                decode_chunked(&src[..cut], &mut out, 1000),
                Ok(None),
                "cut at {cut}"
            );
        }
        assert_eq!(
            decode_chunked(b"zz\r\n", &mut out, 1000),
            Err(HttpError::Protocol("bad chunk size".into()))
        );
        assert_eq!(
            decode_chunked(b"3\r\nabcX\r\n", &mut out, 1000).map(|_| ()),
            Err(HttpError::Protocol("chunk not followed by CRLF".into()))
        );
        assert_eq!(
            decode_chunked(b"10\r\n", &mut out, 8),
            Err(HttpError::TooLarge(8))
        );
        assert_eq!(
            decode_chunked(b"ffffffffffffffffff\r\n", &mut out, 8).map(|_| ()),
            Err(HttpError::Protocol("bad chunk size".into()))
        );
    }

    const ALPHA: &[u8] = b"0123456789abcdefxz;\r\n ";

    #[test]
    fn seeded_fuzz_of_the_chunk_decoder() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut out = Vec::new();
        for _ in 0..20_000 {
            let len = rng.random_range(0..64);
            let mut v: Vec<u8> = (0..len)
                .map(|_| ALPHA[rng.random_range(0..ALPHA.len())])
                .collect();
            if rng.random_bool(0.3) {
                v = b"5\r\nhello\r\n0\r\n\r\n".to_vec();
                let i = rng.random_range(0..v.len());
                v[i] = rng.random();
            }
            let _ = decode_chunked(&v, &mut out, 32);
            assert!(out.len() <= 32);
        }
    }

    #[test]
    fn heads_and_framing() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert!(matches!(
            (h.status, h.framing, h.keep_alive),
            (200, Framing::Length(5), true)
        ));
        let h = parse_head(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(matches!(
            (h.framing, h.keep_alive),
            (Framing::Chunked, false)
        ));
        let h = parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert!(matches!(
            (h.framing, h.keep_alive),
            (Framing::UntilClose, false)
        ));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
                .is_err()
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(Target::new("127.0.0.1:1".parse().unwrap(), "/metrics?a b").is_none());
        assert!(Target::new("127.0.0.1:1".parse().unwrap(), "metrics").is_none());
    }

    /// A raw server that answers each request with the next canned reply (then closes if asked).
    async fn canned(replies: Vec<(Vec<u8>, bool)>) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut replies = replies.into_iter();
            'conns: while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 4096];
                loop {
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => continue 'conns,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let Some((reply, close)) = replies.next() else {
                        return;
                    };
                    // Send in small pieces to exercise partial reads.
                    for piece in reply.chunks(7) {
                        let _ = s.write_all(piece).await;
                    }
                    if close {
                        continue 'conns;
                    }
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn keep_alive_chunked_close_and_stale_reuse() {
        let addr = canned(vec![
            (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc".to_vec(), false),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n".to_vec(), true),
            (b"HTTP/1.1 503 Unavailable\r\nContent-Length: 2\r\n\r\nno".to_vec(), false),
            (b"HTTP/1.0 200 OK\r\n\r\nuntil close".to_vec(), true),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec(), false),
        ])
        .await;
        let t = Target::new(addr, "/metrics").unwrap();
        let (mut conn, mut raw, mut body) = (Conn::default(), Vec::new(), Vec::new());
        let to = Duration::from_secs(2);
        async fn fetch(
            conn: &mut Conn,
            t: &Target,
            raw: &mut Vec<u8>,
            body: &mut Vec<u8>,
            max: usize,
        ) -> Result<(u16, Vec<u8>), HttpError> {
            let a = get(conn, t, raw, body, max, Duration::from_secs(2)).await?;
            Ok((a.status, a.body(raw, body).to_vec()))
        }
        assert_eq!(
            fetch(&mut conn, &t, &mut raw, &mut body, 1000).await,
            Ok((200, b"abc".to_vec()))
        );
        assert!(conn.is_open());
        // Same connection, chunked, then the server closes it.
        assert_eq!(
            fetch(&mut conn, &t, &mut raw, &mut body, 1000).await,
            Ok((200, b"def".to_vec()))
        );
        // The kept connection is dead: one retry on a new one succeeds.
        assert_eq!(
            fetch(&mut conn, &t, &mut raw, &mut body, 1000).await,
            Ok((503, b"no".to_vec()))
        );
        assert_eq!(
            fetch(&mut conn, &t, &mut raw, &mut body, 1000).await,
            Ok((200, b"until close".to_vec()))
        );
        assert!(!conn.is_open());
        // A declared length over the bound is refused without reading it.
        assert_eq!(
            get(&mut conn, &t, &mut raw, &mut body, 50, to)
                .await
                .map(|a| a.status),
            Err(HttpError::TooLarge(50))
        );
        // Nothing listens any more after the replies ran out: a connect or close error.
        let e = get(&mut conn, &t, &mut raw, &mut body, 1000, to).await;
        assert!(e.is_err());
    }

    #[tokio::test]
    async fn connect_errors_name_the_address() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let t = Target::new(addr, "/metrics").unwrap();
        let e = get(
            &mut Conn::default(),
            &t,
            &mut Vec::new(),
            &mut Vec::new(),
            100,
            Duration::from_secs(1),
        )
        .await;
        assert!(
            matches!(&e, Err(HttpError::Connect(m)) if m.contains(&addr.to_string())),
            "{e:?}"
        );
    }
}
