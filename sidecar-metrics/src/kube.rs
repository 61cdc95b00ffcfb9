//! Kubernetes discovery: list and watch `discovery.k8s.io/v1` EndpointSlices over plain hyper.
//!
//! Why hand-rolled rather than `kube` + `k8s-openapi`: the sidecar needs one resource, read-only,
//! and those crates add a few hundred thousand lines to compile on a 2-core machine where every
//! helper builds at once. This module is the classic list-then-watch loop: list (remember the
//! `resourceVersion`), watch from it with bookmarks, apply ADDED / MODIFIED / DELETED to a map of
//! slices, relist on `410 Gone` or any error (with backoff), keep the last set meanwhile.
//! Credentials: in-cluster service account by default, or `{server, token|token_file, ca_file}`.
//! RBAC needed: `get`, `list`, `watch` on `endpointslices` in group `discovery.k8s.io` (see
//! README.md).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::watch;

use crate::config::{KubeConfig, PortRef};
use crate::discovery::{normalise_set, Endpoints};

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// A single watch event line larger than this is refused (a slice holds at most 1000 endpoints).
const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;
/// A watch that sends nothing for this long is taken for dead.
const WATCH_SILENCE: Duration = Duration::from_secs(330);

/// Why the API server cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "not running in a cluster (KUBERNETES_SERVICE_HOST unset) and no `api.server` configured"
    )]
    NotInCluster,
    #[error("cannot read {what} {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("CA file {path} holds no usable PEM certificate")]
    BadCa { path: String },
    #[error("`api.ca_file` is required for an https server")]
    NoCa,
    #[error("TLS setup failed: {0}")]
    Tls(String),
    #[error("request to {url} failed: {reason}")]
    Http { url: String, reason: String },
    #[error("{url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("bad JSON from {url}: {reason}")]
    Json { url: String, reason: String },
}

enum Token {
    None,
    Inline(String),
    File(PathBuf),
}

/// What is needed to list and watch one pool's slices.
pub struct Client {
    http: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    server: String,
    token: Token,
    namespace: String,
    selector: String,
    port: Option<PortRef>,
}

fn read(what: &'static str, path: &str) -> Result<String, KubeError> {
    std::fs::read_to_string(path).map_err(|source| KubeError::ReadFile {
        what,
        path: path.into(),
        source,
    })
}

/// The error text with its causes (hyper's own message is only "client error (Connect)"; the
/// TLS or connect reason is in the sources).
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

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    pub fn from_config(k: &KubeConfig) -> Result<Client, KubeError> {
        let (server, token, ca) = match &k.api {
            Some(api) => {
                let token = match (&api.token, &api.token_file) {
                    (Some(t), _) => Token::Inline(t.clone()),
                    (None, Some(f)) => Token::File(f.into()),
                    (None, None) => Token::None,
                };
                (
                    api.server.trim_end_matches('/').to_owned(),
                    token,
                    api.ca_file.clone(),
                )
            }
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .map_err(|_| KubeError::NotInCluster)?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                (
                    format!("https://{host}:{port}"),
                    Token::File(format!("{SA_DIR}/token").into()),
                    Some(format!("{SA_DIR}/ca.crt")),
                )
            }
        };
        let namespace = match &k.namespace {
            Some(ns) => ns.clone(),
            None => std::fs::read_to_string(format!("{SA_DIR}/namespace"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "default".into()),
        };
        let mut roots = rustls::RootCertStore::empty();
        match &ca {
            Some(path) => {
                let pem = read("CA file", path)?;
                use rustls_pki_types::pem::PemObject;
                for cert in
                    rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).flatten()
                {
                    roots.add(cert).map_err(|e| KubeError::Tls(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(KubeError::BadCa { path: path.clone() });
                }
            }
            None if server.starts_with("https://") => return Err(KubeError::NoCa),
            None => {}
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http =
            hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
        let selector = match (&k.service, &k.label_selector) {
            (Some(svc), _) => format!("kubernetes.io/service-name={svc}"),
            (None, Some(sel)) => sel.clone(),
            (None, None) => String::new(),
        };
        Ok(Client {
            http,
            server,
            token,
            namespace,
            selector,
            port: k.port.clone(),
        })
    }

    fn url(&self, watch_from: Option<&str>) -> String {
        let mut u = format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector={}",
            self.server,
            query_escape(&self.namespace),
            query_escape(&self.selector)
        );
        if let Some(rv) = watch_from {
            u.push_str("&watch=true&allowWatchBookmarks=true&timeoutSeconds=290&resourceVersion=");
            u.push_str(&query_escape(rv));
        }
        u
    }

    async fn get(&self, url: &str) -> Result<hyper::Response<hyper::body::Incoming>, KubeError> {
        let http_err = |reason: String| KubeError::Http {
            url: url.into(),
            reason,
        };
        let mut req = hyper::Request::get(url).header("accept", "application/json");
        match &self.token {
            Token::None => {}
            Token::Inline(t) => req = req.header("authorization", format!("Bearer {t}")),
            Token::File(p) => {
                let t = read("token file", &p.display().to_string())?;
                req = req.header("authorization", format!("Bearer {}", t.trim()));
            }
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| http_err(e.to_string()))?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| http_err(error_chain(&e)))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let body = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
                .await
                .ok()
                .and_then(|r| r.ok())
                .map(|c| {
                    String::from_utf8_lossy(&c.to_bytes())
                        .chars()
                        .take(512)
                        .collect()
                })
                .unwrap_or_default();
            return Err(KubeError::Status {
                url: url.into(),
                status,
                body,
            });
        }
        Ok(resp)
    }

    /// Lists the slices: their endpoints by slice name, and the list's `resourceVersion`.
    pub async fn list(&self) -> Result<(String, BTreeMap<String, Vec<SocketAddr>>), KubeError> {
        let url = self.url(None);
        let resp = self.get(&url).await?;
        let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
            .await
            .map_err(|_| KubeError::Http {
                url: url.clone(),
                reason: "list timed out".into(),
            })?
            .map_err(|e| KubeError::Http {
                url: url.clone(),
                reason: e.to_string(),
            })?
            .to_bytes();
        let list: SliceList = serde_json::from_slice(&body).map_err(|e| KubeError::Json {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let mut map = BTreeMap::new();
        for s in &list.items {
            map.insert(
                s.metadata.name.clone(),
                slice_endpoints(s, self.port.as_ref()),
            );
        }
        Ok((list.metadata.resource_version, map))
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Deserialize)]
struct SliceList {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    items: Vec<EndpointSlice>,
}

/// The fields of `discovery.k8s.io/v1` EndpointSlice that matter here.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct EndpointSlice {
    metadata: Meta,
    #[serde(rename = "addressType")]
    address_type: String,
    endpoints: Option<Vec<Endpoint>>,
    ports: Option<Vec<EndpointPort>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Endpoint {
    addresses: Vec<String>,
    conditions: Option<Conditions>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Conditions {
    ready: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct EndpointPort {
    name: Option<String>,
    port: Option<i32>,
}

#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

/// Ready endpoints of one slice on the configured port (absent `ready` counts as ready, as the
/// API documents). FQDN slices and slices without the wanted port give nothing.
fn slice_endpoints(s: &EndpointSlice, want: Option<&PortRef>) -> Vec<SocketAddr> {
    if s.address_type == "FQDN" {
        return Vec::new();
    }
    let ports = s.ports.as_deref().unwrap_or(&[]);
    let port = match want {
        Some(PortRef::Number(n)) => Some(*n),
        Some(PortRef::Name(name)) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok()),
        None => ports
            .first()
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok()),
    };
    let Some(port) = port else { return Vec::new() };
    let mut out = Vec::new();
    for ep in s.endpoints.as_deref().unwrap_or(&[]) {
        if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
            continue;
        }
        for a in &ep.addresses {
            if let Ok(ip) = a.parse::<IpAddr>() {
                out.push(SocketAddr::new(ip, port));
            }
        }
    }
    out
}

fn union(map: &BTreeMap<String, Vec<SocketAddr>>) -> Vec<SocketAddr> {
    normalise_set(map.values().flatten().copied().collect())
}

fn publish(pool: &str, tx: &watch::Sender<Endpoints>, map: &BTreeMap<String, Vec<SocketAddr>>) {
    let set = union(map);
    if **tx.borrow() != set {
        tracing::info!(pool = %pool, pods = set.len(), "EndpointSlice endpoints changed");
        let _ = tx.send(Arc::new(set));
    }
}

enum WatchEnd {
    /// The server closed the watch normally: watch again from the last version.
    Expired,
    /// 410 Gone or an error event: list again.
    Relist,
    Shutdown,
}

/// List, then watch, forever (until shutdown).
pub async fn watch_loop(
    pool: String,
    client: Client,
    tx: watch::Sender<Endpoints>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(250);
    loop {
        if *shutdown.borrow() {
            return;
        }
        match client.list().await {
            Ok((mut rv, mut map)) => {
                backoff = Duration::from_millis(250);
                publish(&pool, &tx, &map);
                loop {
                    let began = std::time::Instant::now();
                    match watch_once(&pool, &client, &mut rv, &mut map, &tx, &mut shutdown).await {
                        Ok(WatchEnd::Expired) => {
                            // A server that closes watches at once must not make us spin.
                            if began.elapsed() < Duration::from_secs(1) {
                                tokio::select! {
                                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                                    _ = shutdown.changed() => return,
                                }
                            }
                            continue;
                        }
                        Ok(WatchEnd::Relist) => break,
                        Ok(WatchEnd::Shutdown) => return,
                        Err(e) => {
                            tracing::warn!(pool = %pool, error = %e, "EndpointSlice watch failed; relisting");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(pool = %pool, error = %e, "EndpointSlice list failed; keeping the last set")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn watch_once(
    pool: &str,
    client: &Client,
    rv: &mut String,
    map: &mut BTreeMap<String, Vec<SocketAddr>>,
    tx: &watch::Sender<Endpoints>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<WatchEnd, KubeError> {
    let url = client.url(Some(rv));
    let resp = tokio::select! {
        r = client.get(&url) => r?,
        _ = shutdown.changed() => return Ok(WatchEnd::Shutdown),
    };
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // The server ends a watch after `timeoutSeconds` (290) and sends bookmarks meanwhile;
        // silence well past that means a dead connection: relist.
        let frame = tokio::select! {
            f = tokio::time::timeout(WATCH_SILENCE, body.frame()) => match f {
                Ok(f) => f,
                Err(_) => return Err(KubeError::Http { url, reason: format!("no data for {WATCH_SILENCE:?}") }),
            },
            _ = shutdown.changed() => return Ok(WatchEnd::Shutdown),
        };
        let frame = match frame {
            None => return Ok(WatchEnd::Expired),
            Some(Err(e)) => {
                return Err(KubeError::Http {
                    url,
                    reason: e.to_string(),
                })
            }
            Some(Ok(f)) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = memchr::memchr(b'\n', &buf) {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let ev: WatchEvent = serde_json::from_slice(line).map_err(|e| KubeError::Json {
                url: url.clone(),
                reason: e.to_string(),
            })?;
            if let Some(end) = apply_event(pool, ev, client.port.as_ref(), rv, map) {
                return Ok(end);
            }
            publish(pool, tx, map);
        }
        if buf.len() > MAX_EVENT_BYTES {
            return Err(KubeError::Http {
                url,
                reason: format!("watch event larger than {MAX_EVENT_BYTES} bytes"),
            });
        }
    }
}

fn apply_event(
    pool: &str,
    ev: WatchEvent,
    port: Option<&PortRef>,
    rv: &mut String,
    map: &mut BTreeMap<String, Vec<SocketAddr>>,
) -> Option<WatchEnd> {
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => {
            let slice: EndpointSlice = match serde_json::from_value(ev.object) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(pool = %pool, error = %e, "unreadable EndpointSlice in watch event; relisting");
                    return Some(WatchEnd::Relist);
                }
            };
            if !slice.metadata.resource_version.is_empty() {
                rv.clone_from(&slice.metadata.resource_version);
            }
            if ev.kind == "DELETED" {
                map.remove(&slice.metadata.name);
            } else {
                let eps = slice_endpoints(&slice, port);
                map.insert(slice.metadata.name, eps);
            }
            None
        }
        "BOOKMARK" => {
            if let Some(v) = ev
                .object
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
            {
                *rv = v.to_owned();
            }
            None
        }
        _ => {
            // ERROR: usually 410 Gone (our version is too old). Relist.
            let code = ev.object.get("code").and_then(|c| c.as_u64()).unwrap_or(0);
            tracing::info!(pool = %pool, code, "EndpointSlice watch error event; relisting");
            Some(WatchEnd::Relist)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn slice(json: &str) -> EndpointSlice {
        serde_json::from_str(json).expect("slice json")
    }

    const SLICE: &str = r#"{
      "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
      "metadata": {"name": "vllm-abc12", "namespace": "llm", "resourceVersion": "4711",
                   "labels": {"kubernetes.io/service-name": "vllm"}},
      "addressType": "IPv4",
      "endpoints": [
        {"addresses": ["10.1.0.5"], "conditions": {"ready": true, "serving": true, "terminating": false},
         "nodeName": "n1", "targetRef": {"kind": "Pod", "name": "vllm-0", "namespace": "llm"}},
        {"addresses": ["10.1.0.6"], "conditions": {"ready": false, "serving": true, "terminating": true}},
        {"addresses": ["10.1.0.7"], "conditions": {}}
      ],
      "ports": [{"name": "metrics", "protocol": "TCP", "port": 9100}, {"name": "http", "protocol": "TCP", "port": 8000}]
    }"#;

    #[test]
    fn ready_endpoints_on_the_named_port() {
        let s = slice(SLICE);
        let got = slice_endpoints(&s, Some(&PortRef::Name("http".into())));
        let want: Vec<SocketAddr> = vec![
            "10.1.0.5:8000".parse().expect("sa"),
            "10.1.0.7:8000".parse().expect("sa"),
        ];
        assert_eq!(got, want);
        let first = slice_endpoints(&s, None);
        assert_eq!(first.first().map(|a| a.port()), Some(9100));
        assert_eq!(slice_endpoints(&s, Some(&PortRef::Number(1234))).len(), 2);
        assert!(slice_endpoints(&s, Some(&PortRef::Name("nope".into()))).is_empty());
    }

    #[test]
    fn null_endpoints_and_fqdn_slices_give_nothing() {
        let s = slice(
            r#"{"metadata":{"name":"a"},"addressType":"IPv4","endpoints":null,"ports":null}"#,
        );
        assert!(slice_endpoints(&s, Some(&PortRef::Number(1))).is_empty());
        let s = slice(
            r#"{"metadata":{"name":"a"},"addressType":"FQDN","endpoints":[{"addresses":["x.y"]}],"ports":[{"port":1}]}"#,
        );
        assert!(slice_endpoints(&s, None).is_empty());
    }

    #[test]
    fn events_update_the_map_and_version() {
        let mut map = BTreeMap::new();
        let mut rv = "1".to_owned();
        let ev = |kind: &str, obj: &str| WatchEvent {
            kind: kind.into(),
            object: serde_json::from_str(obj).expect("json"),
        };
        assert!(apply_event(
            "p",
            ev("ADDED", SLICE),
            Some(&PortRef::Number(8000)),
            &mut rv,
            &mut map
        )
        .is_none());
        assert_eq!((rv.as_str(), union(&map).len()), ("4711", 2));
        let bm = r#"{"kind":"EndpointSlice","metadata":{"resourceVersion":"5000"}}"#;
        assert!(apply_event("p", ev("BOOKMARK", bm), None, &mut rv, &mut map).is_none());
        assert_eq!(rv, "5000");
        let del = r#"{"metadata":{"name":"vllm-abc12","resourceVersion":"5001"}}"#;
        assert!(apply_event("p", ev("DELETED", del), None, &mut rv, &mut map).is_none());
        assert!(union(&map).is_empty());
        let gone = r#"{"kind":"Status","code":410,"reason":"Expired"}"#;
        assert!(matches!(
            apply_event("p", ev("ERROR", gone), None, &mut rv, &mut map),
            Some(WatchEnd::Relist)
        ));
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(
            query_escape("kubernetes.io/service-name=vllm"),
            "kubernetes.io%2Fservice-name%3Dvllm"
        );
        assert_eq!(query_escape("a in (x,y)"), "a%20in%20%28x%2Cy%29");
    }
}
