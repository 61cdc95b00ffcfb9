//! Shared helpers of the model-sim integration tests: a tiny raw HTTP/1.1 client (so tests see
//! exactly what went over the wire, including cut connections) and a Prometheus text reader
//! built on a real parser (`openmetrics-parser`, which accepts `:` in metric names).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::PrometheusValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Whether the body ended properly (final chunk / full content-length).
    pub complete: bool,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|ev| ev.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn dechunk(raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let Some(pos) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size_txt = String::from_utf8_lossy(&rest[..pos]).to_string();
        let Ok(size) = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
        else {
            return (out, false);
        };
        rest = &rest[pos + 2..];
        if size == 0 {
            return (out, true);
        }
        if rest.len() < size + 2 {
            out.extend_from_slice(&rest[..rest.len().min(size)]);
            return (out, false);
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Sends one request with `Connection: close` and reads until the server closes.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Resp> {
    tokio::time::timeout(
        Duration::from_secs(30),
        http_inner(addr, method, path, body),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))?
}

async fn http_inner(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr).await?;
    let b = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    // A reset (cut connection) ends the read like EOF; `complete` tells the difference.
    let _ = s.read_to_end(&mut raw).await;
    parse_resp(&raw)
}

pub fn parse_resp(raw: &[u8]) -> std::io::Result<Resp> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status"))?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let (body, complete) = if chunked {
        dechunk(rest)
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        (rest[..rest.len().min(len)].to_vec(), rest.len() >= len)
    } else {
        (rest.to_vec(), true)
    };
    Ok(Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
        complete,
    })
}

/// Parsed metrics: (family name, sorted labels) → value; histograms give their `_count`.
pub type Metrics = BTreeMap<(String, Vec<(String, String)>), f64>;

/// Parses exposition text with a real Prometheus parser; panics with the parser's message.
pub fn parse_metrics(text: &str) -> Metrics {
    let expo =
        parse_prometheus(text).unwrap_or_else(|e| panic!("metrics do not parse: {e:?}\n{text}"));
    let mut out = Metrics::new();
    for (name, fam) in &expo.families {
        for s in fam.iter_samples() {
            let ls = s.get_labelset().unwrap_or_else(|e| panic!("labels: {e:?}"));
            let mut labels: Vec<(String, String)> = ls
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            labels.sort();
            let v = match &s.value {
                PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                PrometheusValue::Counter(c) => c.value.as_f64(),
                PrometheusValue::Histogram(h) => h.count.map(|c| c as f64).unwrap_or(f64::NAN),
                PrometheusValue::Summary(_) => f64::NAN,
            };
            out.insert((name.clone(), labels), v);
        }
    }
    out
}

/// Value of `name` whose labels include all of `want`.
pub fn get(m: &Metrics, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let alt = name.strip_suffix("_total").map(str::to_string);
    m.iter()
        .filter(|((n, _), _)| n == name || Some(n) == alt.as_ref())
        .find(|((_, l), _)| {
            want.iter()
                .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| *v)
}

/// All series of `name` as (labels, value).
pub fn series(m: &Metrics, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    m.iter()
        .filter(|((n, _), _)| n == name)
        .map(|((_, l), v)| (l.clone(), *v))
        .collect()
}

pub fn label<'a>(labels: &'a [(String, String)], k: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(lk, _)| lk == k)
        .map(|(_, v)| v.as_str())
}
