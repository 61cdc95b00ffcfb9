//! Small async HTTP/1.1 client helpers for tests (one connection per request, bounded by a
//! timeout so a hung proxy fails the test instead of hanging it), plus a blocking GET used for
//! Envoy's admin API, which must also work outside a tokio runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

use crate::error::{Error, Result};

/// Upper bound for one request made by [`request`] and friends.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A complete response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers in arrival order, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Bytes,
    /// The body as the data frames arrived (more than one for a streamed answer).
    pub chunks: Vec<Bytes>,
}

impl HttpResponse {
    /// The first value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Format {
            what: format!(
                "JSON response body ({} bytes, status {})",
                self.body.len(),
                self.status
            ),
            reason: e.to_string(),
        })
    }

    /// The `data:` payloads of a server-sent-events body, in order (including `[DONE]`).
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.trim_start().to_string())
            .collect()
    }
}

/// Sends one request to `http://{addr}{path}` and reads the whole answer, within
/// [`DEFAULT_TIMEOUT`].
pub async fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<HttpResponse> {
    request_with_timeout(method, addr, path, headers, body.into(), DEFAULT_TIMEOUT).await
}

/// [`request`] with an explicit time limit for the whole exchange.
pub async fn request_with_timeout(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    timeout: Duration,
) -> Result<HttpResponse> {
    let err = |reason: String| Error::Http {
        method: method.to_string(),
        addr,
        path: path.to_string(),
        reason,
    };
    match tokio::time::timeout(timeout, exchange(method, addr, path, headers, body)).await {
        Ok(result) => result.map_err(err),
        Err(_) => Err(err(format!(
            "no complete answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

async fn exchange(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> std::result::Result<HttpResponse, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let req = builder
        .body(Full::new(body))
        .map_err(|e| format!("build request: {e}"))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut body = resp.into_body();
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("read body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                chunks.push(data);
            }
        }
        let body = Bytes::from(chunks.concat());
        Ok(HttpResponse {
            status,
            headers,
            body,
            chunks,
        })
    }
    .await;
    driver.abort();
    result
}

/// `POST` a JSON body (`content-type: application/json` is added).
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Result<HttpResponse> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request("POST", addr, path, &all, body.to_string()).await
}

/// `POST` raw bytes (`content-type: application/octet-stream` is added), e.g. a snapshot push.
pub async fn post_bytes(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<HttpResponse> {
    let mut all = vec![("content-type", "application/octet-stream")];
    all.extend_from_slice(headers);
    request("POST", addr, path, &all, body).await
}

/// `GET` a path.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    request("GET", addr, path, headers, Bytes::new()).await
}

/// A blocking `GET` (for Envoy's admin API; usable with or without a runtime).
/// Returns the status and the body as text.
pub fn blocking_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let err = |reason: String| Error::Http {
        method: "GET".into(),
        addr,
        path: path.to_string(),
        reason,
    };
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| err(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| err(format!("set timeout: {e}")))?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| err(format!("write: {e}")))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| err(format!("read: {e}")))?;
    parse_http1_response(&raw).map_err(err)
}

/// Parses a complete HTTP/1.1 response read until close (identity or chunked body).
pub(crate) fn parse_http1_response(raw: &[u8]) -> std::result::Result<(u16, String), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {} bytes", raw.len()))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(n, v)| {
            n.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut data: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line not terminated")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| format!("bad chunk size {size_hex:?}: {e}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size {
            return Err(format!("chunk of {size} bytes truncated at {}", data.len()));
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_identity_and_chunked_bodies() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nLIVE";
        assert_eq!(
            parse_http1_response(plain).unwrap(),
            (200, "LIVE".to_string())
        );
        let chunked = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nPRE_\r\n9;x=y\r\nINITIALIZ\r\n3\r\nING\r\n0\r\n\r\n";
        assert_eq!(
            parse_http1_response(chunked).unwrap(),
            (503, "PRE_INITIALIZING".to_string())
        );
        assert!(parse_http1_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_http1_response(b"garbage\r\n\r\n").is_err());
        let truncated = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nff\r\nabc";
        assert!(parse_http1_response(truncated).is_err());
    }

    #[test]
    fn random_input_never_panics() {
        // Seeded xorshift: deterministic, no extra dependency.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let alphabet: &[u8] = b"HTTP/1.1 200\r\n:chunked0123456789abcdefTransfer-Encoding;";
        for _ in 0..20_000 {
            let len = (next() % 120) as usize;
            let mut raw: Vec<u8> =
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            if next() % 3 == 0 {
                raw.clear();
            }
            raw.extend((0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]));
            let _ = parse_http1_response(&raw);
        }
    }
}
