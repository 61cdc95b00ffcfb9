//! Kubernetes discovery over plain hyper: `discovery.k8s.io/v1` EndpointSlices of a Service (or
//! label selector), or the Pods a Gateway API Inference Extension `InferencePool`
//! (`inference.networking.k8s.io/v1`) selects.
//!
//! Why hand-rolled rather than `kube` + `k8s-openapi`: the sidecar needs a few resources,
//! read-only, and those crates add a few hundred thousand lines to compile on a 2-core machine
//! where every helper builds at once. One generic loop ([`Collection`], `informer`) serves every
//! resource: list (remember the `resourceVersion`), watch from it with bookmarks, apply ADDED /
//! MODIFIED / DELETED to a map of objects by name, relist on `410 Gone` or any error (with
//! backoff), keep the last set meanwhile.
//!
//! An InferencePool runs two of them: one watches the pool object itself (by name, so a changed
//! selector or target port applies live), the other the Pods matching the pool's
//! `spec.selector.matchLabels` in its namespace, restarted whenever the pool changes. Each Ready
//! pod's `status.podIP` (not terminating) on every `spec.targetPorts[].number` (or only the
//! configured `port`) is an endpoint; `spec.endpointPickerRef` is ignored (the filter picks).
//! A pool that does not exist gives no endpoints.
//!
//! `InferenceModelRewrite` objects (`llm-d.ai/v1alpha2`, `rewrites.kubernetes`) are a third
//! collection: every object of the namespace, kept for the sidecar's pools
//! (`spec.poolRef.name`), their rules oldest object first (`crate::rewrites`).
//! `InferenceObjective` objects (`llm-d.ai/v1alpha2`, `objectives.kubernetes`) a fourth, the
//! same way: each object of the sidecar's pools is an objective named as the object, with its
//! `spec.priority` (unset: 0), in the snapshot's objectives section.
//!
//! Credentials: in-cluster service account by default, or `{server, token|token_file, ca_file}`.
//! RBAC needed: `get`, `list`, `watch` on `endpointslices` in group `discovery.k8s.io`, or on
//! `pods` (core group) and `inferencepools` in group `inference.networking.k8s.io`, and on
//! `inferencemodelrewrites` in group `llm-d.ai` with `rewrites.kubernetes`, and on
//! `inferenceobjectives` in that group with `objectives.kubernetes` (see README.md).

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
use serde_json::Value;
use tokio::sync::watch;

use crate::config::{InferencePoolConfig, KubeApi, KubeConfig, ObjectWatchConfig, PortRef};
use crate::endpoints::{normalise_set, Endpoints};
use crate::rewrites::{check_rules, RuleSpec};

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

/// Access to the API server: the HTTP client, its base URL and the credentials.
struct Api {
    http: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    server: String,
    token: Token,
}

/// What is needed to list and watch one pool's EndpointSlices.
pub struct Client {
    api: Api,
    slices: Slices,
}

/// What is needed to watch one pool's InferencePool and the Pods it selects.
pub struct PoolClient {
    api: Api,
    pool: NamedPool,
    /// Use only this one of the pool's target ports.
    port: Option<u16>,
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

/// The configured namespace, else the pod's own (in-cluster), else `default`.
fn namespace_or_own(ns: Option<&String>) -> String {
    match ns {
        Some(ns) => ns.clone(),
        None => std::fs::read_to_string(format!("{SA_DIR}/namespace"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "default".into()),
    }
}

impl Api {
    fn connect(api: Option<&KubeApi>) -> Result<Api, KubeError> {
        let (server, token, ca) = match api {
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
        Ok(Api {
            http,
            server,
            token,
        })
    }

    /// The collection's URL, or its watch from version `rv`.
    fn url<C: Collection>(&self, c: &C, watch_from: Option<&str>) -> String {
        let mut u = format!("{}{}", self.server, c.path());
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

    /// Lists the collection: what is kept of each object by name, and the list's
    /// `resourceVersion`.
    async fn list<C: Collection>(
        &self,
        c: &C,
    ) -> Result<(String, BTreeMap<String, C::Item>), KubeError> {
        let url = self.url(c, None);
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
        let json_err = |e: serde_json::Error| KubeError::Json {
            url: url.clone(),
            reason: e.to_string(),
        };
        let list: List = serde_json::from_slice(&body).map_err(json_err)?;
        let mut map = BTreeMap::new();
        for obj in list.items.unwrap_or_default() {
            let meta = Meta::deserialize(&obj["metadata"]).map_err(json_err)?;
            map.insert(meta.name, c.item(&obj).map_err(json_err)?);
        }
        Ok((list.metadata.resource_version, map))
    }
}

impl Client {
    pub fn from_config(k: &KubeConfig) -> Result<Client, KubeError> {
        let api = Api::connect(k.api.as_ref())?;
        let selector = match (&k.service, &k.label_selector) {
            (Some(svc), _) => format!("kubernetes.io/service-name={svc}"),
            (None, Some(sel)) => sel.clone(),
            (None, None) => String::new(),
        };
        Ok(Client {
            api,
            slices: Slices {
                namespace: namespace_or_own(k.namespace.as_ref()),
                selector,
                port: k.port.clone(),
            },
        })
    }

    /// Lists the slices: their endpoints by slice name, and the list's `resourceVersion`.
    pub async fn list(&self) -> Result<(String, BTreeMap<String, Vec<SocketAddr>>), KubeError> {
        self.api.list(&self.slices).await
    }
}

impl PoolClient {
    pub fn from_config(p: &InferencePoolConfig) -> Result<PoolClient, KubeError> {
        Ok(PoolClient {
            api: Api::connect(p.api.as_ref())?,
            pool: NamedPool {
                namespace: namespace_or_own(p.namespace.as_ref()),
                name: p.name.clone(),
            },
            port: p.port,
        })
    }
}

/// A collection of objects to list and watch, and what to keep of each one.
trait Collection {
    type Item: PartialEq;
    /// What the logs call one object.
    const KIND: &'static str;
    /// The collection's path and query (with a selector, so the watch parameters follow `&`).
    fn path(&self) -> String;
    /// What to keep of one object.
    fn item(&self, obj: &Value) -> Result<Self::Item, serde_json::Error>;
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    items: Option<Vec<Value>>,
}

#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: Value,
}

// ---- EndpointSlices ----

/// The EndpointSlices matching a label selector; each kept as its ready endpoints.
struct Slices {
    namespace: String,
    selector: String,
    port: Option<PortRef>,
}

impl Collection for Slices {
    type Item = Vec<SocketAddr>;
    const KIND: &'static str = "EndpointSlice";

    fn path(&self) -> String {
        format!(
            "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector={}",
            query_escape(&self.namespace),
            query_escape(&self.selector)
        )
    }

    fn item(&self, obj: &Value) -> Result<Vec<SocketAddr>, serde_json::Error> {
        Ok(slice_endpoints(
            &EndpointSlice::deserialize(obj)?,
            self.port.as_ref(),
        ))
    }
}

/// The fields of `discovery.k8s.io/v1` EndpointSlice that matter here.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct EndpointSlice {
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

// ---- InferencePool and its Pods ----

/// One InferencePool, watched by name.
struct NamedPool {
    namespace: String,
    name: String,
}

/// What matters of an InferencePool: the pod labels it selects and its target ports.
#[derive(Debug, Clone, PartialEq)]
struct PoolSpec {
    match_labels: BTreeMap<String, String>,
    /// Sorted, without duplicates or numbers outside 1..=65535.
    target_ports: Vec<u16>,
}

#[derive(Deserialize)]
struct InferencePool {
    spec: InferencePoolSpec,
}

#[derive(Deserialize)]
struct InferencePoolSpec {
    selector: LabelSelector,
    #[serde(rename = "targetPorts")]
    target_ports: Vec<TargetPort>,
}

#[derive(Deserialize)]
struct LabelSelector {
    #[serde(rename = "matchLabels", default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct TargetPort {
    number: i64,
}

impl Collection for NamedPool {
    type Item = PoolSpec;
    const KIND: &'static str = "InferencePool";

    fn path(&self) -> String {
        format!(
            "/apis/inference.networking.k8s.io/v1/namespaces/{}/inferencepools?fieldSelector={}",
            query_escape(&self.namespace),
            query_escape(&format!("metadata.name={}", self.name))
        )
    }

    fn item(&self, obj: &Value) -> Result<PoolSpec, serde_json::Error> {
        let p = InferencePool::deserialize(obj)?;
        let mut target_ports: Vec<u16> = p
            .spec
            .target_ports
            .iter()
            .filter_map(|t| u16::try_from(t.number).ok().filter(|n| *n != 0))
            .collect();
        target_ports.sort_unstable();
        target_ports.dedup();
        Ok(PoolSpec {
            match_labels: p.spec.selector.match_labels,
            target_ports,
        })
    }
}

/// `k1=v1,k2=v2` for the `labelSelector` query (equality on every label).
pub fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Pods matching a label selector; each kept as its IP when it serves.
struct Pods {
    namespace: String,
    selector: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Pod {
    metadata: PodMeta,
    status: PodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodMeta {
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    conditions: Option<Vec<PodCondition>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodCondition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

impl Collection for Pods {
    type Item = Option<IpAddr>;
    const KIND: &'static str = "Pod";

    fn path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            query_escape(&self.namespace),
            query_escape(&self.selector)
        )
    }

    fn item(&self, obj: &Value) -> Result<Option<IpAddr>, serde_json::Error> {
        Ok(serving_ip(&Pod::deserialize(obj)?))
    }
}

/// The pod's IP when it is Ready (condition `Ready` is `"True"`), not terminating
/// (`metadata.deletionTimestamp` unset) and has one.
fn serving_ip(p: &Pod) -> Option<IpAddr> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ready = p
        .status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.kind == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    p.status.pod_ip.as_deref()?.parse().ok()
}

/// Every serving pod on every port.
fn pod_endpoints(pods: &BTreeMap<String, Option<IpAddr>>, ports: &[u16]) -> Vec<SocketAddr> {
    normalise_set(
        pods.values()
            .flatten()
            .flat_map(|ip| ports.iter().map(|p| SocketAddr::new(*ip, *p)))
            .collect(),
    )
}

/// The ports to use of a pool's target ports: all of them, or only the configured one when the
/// pool lists it (none when it does not).
fn chosen_ports(target_ports: &[u16], want: Option<u16>) -> Vec<u16> {
    match want {
        Some(p) => target_ports.iter().copied().filter(|t| *t == p).collect(),
        None => target_ports.to_vec(),
    }
}

/// What is known of the InferencePool.
#[derive(Debug, Clone, PartialEq)]
enum PoolState {
    /// Not listed yet (or the list keeps failing): keep the last set.
    Unknown,
    /// The API server says it does not exist: no endpoints.
    Missing,
    Found(PoolSpec),
}

// ---- The list/watch loop, for any collection ----

fn publish(pool: &str, source: &str, tx: &watch::Sender<Endpoints>, set: Vec<SocketAddr>) {
    if **tx.borrow() != set {
        tracing::info!(pool = %pool, pods = set.len(), "{source} endpoints changed");
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

/// The `InferenceModelRewrite` objects (`llm-d.ai/v1alpha2`) of a namespace.
struct ModelRewrites {
    namespace: String,
}

/// What matters of one `InferenceModelRewrite`: the pool it applies to, when it was created
/// (of two objects ruling one model the older wins, as in llm-d) and its rules.
#[derive(Debug, Clone, PartialEq)]
struct RewriteObject {
    pool: String,
    created: String,
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
struct ModelRewrite {
    #[serde(default)]
    metadata: ObjectMeta,
    spec: ModelRewriteSpec,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ObjectMeta {
    #[serde(rename = "creationTimestamp")]
    creation_timestamp: String,
}

#[derive(Deserialize)]
struct ModelRewriteSpec {
    #[serde(rename = "poolRef")]
    pool_ref: PoolRef,
    #[serde(default)]
    rules: Vec<Value>,
}

#[derive(Deserialize)]
struct PoolRef {
    name: String,
}

impl Collection for ModelRewrites {
    type Item = RewriteObject;
    const KIND: &'static str = "InferenceModelRewrite";

    fn path(&self) -> String {
        format!(
            "/apis/llm-d.ai/v1alpha2/namespaces/{}/inferencemodelrewrites?",
            query_escape(&self.namespace)
        )
    }

    /// Rules this build cannot use (another match type, a rule for every model) are left out,
    /// logged, rather than failing the object: the others still apply.
    fn item(&self, obj: &Value) -> Result<RewriteObject, serde_json::Error> {
        let o = ModelRewrite::deserialize(obj)?;
        let name = obj.pointer("/metadata/name").and_then(Value::as_str);
        let mut rules = Vec::with_capacity(o.spec.rules.len());
        for (i, raw) in o.spec.rules.iter().enumerate() {
            let rule = RuleSpec::deserialize(raw)
                .map_err(|e| e.to_string())
                .and_then(|r| check_rules("spec.rules", std::slice::from_ref(&r)).map(|()| r));
            match rule {
                Ok(r) => rules.push(r),
                Err(e) => {
                    tracing::warn!(object = ?name, rule = i, error = %e, "InferenceModelRewrite rule not used")
                }
            }
        }
        Ok(RewriteObject {
            pool: o.spec.pool_ref.name,
            created: o.metadata.creation_timestamp,
            rules,
        })
    }
}

/// The rules of the objects that name one of `pools`, oldest object first (RFC 3339 times in
/// UTC sort as text; ties by name, the map's order); `None` when no object names one (not an
/// empty list: that would turn the filter's configured rules off).
fn rules_of(objects: &BTreeMap<String, RewriteObject>, pools: &[String]) -> Option<Vec<RuleSpec>> {
    let mut mine: Vec<&RewriteObject> = objects
        .values()
        .filter(|o| pools.contains(&o.pool))
        .collect();
    if mine.is_empty() {
        return None;
    }
    mine.sort_by(|a, b| a.created.cmp(&b.created));
    Some(
        mine.into_iter()
            .flat_map(|o| o.rules.iter().cloned())
            .collect(),
    )
}

/// Follows the `InferenceModelRewrite` objects of `pools` (`rewrites.kubernetes`); the
/// receiver sees their rules, oldest object first, after every change (`None` while no object
/// names one of the pools, and before the first list).
pub fn start_rewrite_watch(
    k: &ObjectWatchConfig,
    pools: Vec<String>,
    shutdown: watch::Receiver<bool>,
) -> Result<watch::Receiver<Option<Vec<RuleSpec>>>, KubeError> {
    follow_pool_objects(
        k,
        |namespace| ModelRewrites { namespace },
        pools,
        rules_of,
        shutdown,
    )
}

/// The `InferenceObjective` objects (`llm-d.ai/v1alpha2`) of a namespace.
struct Objectives {
    namespace: String,
}

/// What matters of one `InferenceObjective`: the pool it applies to and its priority.
#[derive(Debug, Clone, PartialEq)]
struct ObjectiveObject {
    pool: String,
    priority: i32,
}

#[derive(Deserialize)]
struct InferenceObjective {
    spec: InferenceObjectiveSpec,
}

#[derive(Deserialize)]
struct InferenceObjectiveSpec {
    #[serde(rename = "poolRef")]
    pool_ref: PoolRef,
    /// Unset is 0 (standard), as llm-d reads it.
    #[serde(default)]
    priority: Option<i32>,
}

impl Collection for Objectives {
    type Item = ObjectiveObject;
    const KIND: &'static str = "InferenceObjective";

    fn path(&self) -> String {
        format!(
            "/apis/llm-d.ai/v1alpha2/namespaces/{}/inferenceobjectives?",
            query_escape(&self.namespace)
        )
    }

    fn item(&self, obj: &Value) -> Result<ObjectiveObject, serde_json::Error> {
        let o = InferenceObjective::deserialize(obj)?;
        Ok(ObjectiveObject {
            pool: o.spec.pool_ref.name,
            priority: o.spec.priority.unwrap_or(0),
        })
    }
}

/// The objectives of the objects that name one of `pools`, by object name (the map's order);
/// `None` when no object names one (not an empty list: that would turn the filter's configured
/// objectives off). Names the snapshot cannot carry (over 255 bytes; past
/// [`llm_router_snapshot::MAX_OBJECTIVES`]) are left out, logged.
fn objectives_of(
    objects: &BTreeMap<String, ObjectiveObject>,
    pools: &[String],
) -> Option<Vec<llm_router_snapshot::Objective>> {
    let mut out = Vec::new();
    let mut any = false;
    for (name, o) in objects.iter().filter(|(_, o)| pools.contains(&o.pool)) {
        any = true;
        if name.is_empty() || name.len() > 255 || out.len() == llm_router_snapshot::MAX_OBJECTIVES {
            tracing::warn!(object = %name, "InferenceObjective not sent: its name is over 255 bytes or the snapshot holds no more");
            continue;
        }
        out.push(llm_router_snapshot::Objective {
            name: name.clone(),
            priority: o.priority,
        });
    }
    any.then_some(out)
}

/// Follows the `InferenceObjective` objects of `pools` (`objectives.kubernetes`); the receiver
/// sees their priorities after every change (`None` while no object names one of the pools,
/// and before the first list).
pub fn start_objective_watch(
    k: &ObjectWatchConfig,
    pools: Vec<String>,
    shutdown: watch::Receiver<bool>,
) -> Result<watch::Receiver<Option<Vec<llm_router_snapshot::Objective>>>, KubeError> {
    follow_pool_objects(
        k,
        |namespace| Objectives { namespace },
        pools,
        objectives_of,
        shutdown,
    )
}

/// What a followed kind of object gives the snapshot, from the objects by name and the
/// sidecar's pools ([`rules_of`], [`objectives_of`]).
type Derive<I, T> = fn(&BTreeMap<String, I>, &[String]) -> Option<Vec<T>>;

/// Follows one kind of object that names the sidecar's `pools` (collection `C` in `k`'s
/// namespace, made by `collection`): the receiver sees what `of` makes of them after every
/// change, `None` before the first list.
fn follow_pool_objects<C, T>(
    k: &ObjectWatchConfig,
    collection: impl FnOnce(String) -> C,
    pools: Vec<String>,
    of: Derive<C::Item, T>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<watch::Receiver<Option<Vec<T>>>, KubeError>
where
    C: Collection + Send + Sync + 'static,
    C::Item: Send + Sync,
    T: Clone + PartialEq + Send + Sync + 'static,
{
    let api = Api::connect(k.api.as_ref())?;
    let c = collection(namespace_or_own(k.namespace.as_ref()));
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let label = pools.join(",");
        informer(
            &label,
            &api,
            &c,
            |map| {
                let now = of(map, &pools);
                tx.send_if_modified(|old| {
                    let changed = *old != now;
                    if changed {
                        match &now {
                            Some(v) => {
                                tracing::info!(entries = v.len(), "{} objects changed", C::KIND)
                            }
                            None => {
                                tracing::info!("no {} names the sidecar's pools any more", C::KIND)
                            }
                        }
                        old.clone_from(&now);
                    }
                    changed
                });
            },
            &mut shutdown,
        )
        .await;
    });
    Ok(rx)
}

/// List, then watch, forever (until shutdown): the EndpointSlices of one pool.
pub async fn watch_loop(
    pool: String,
    client: Client,
    tx: watch::Sender<Endpoints>,
    mut shutdown: watch::Receiver<bool>,
) {
    informer(
        &pool,
        &client.api,
        &client.slices,
        |map| publish(&pool, "EndpointSlice", &tx, union(map)),
        &mut shutdown,
    )
    .await;
}

/// Watches one InferencePool and the Pods it selects, forever (until shutdown).
pub async fn inference_pool_loop(
    pool: String,
    client: PoolClient,
    tx: watch::Sender<Endpoints>,
    shutdown: watch::Receiver<bool>,
) {
    let (state_tx, state_rx) = watch::channel(PoolState::Unknown);
    let mut pool_shutdown = shutdown.clone();
    let watch_pool = async {
        informer(
            &pool,
            &client.api,
            &client.pool,
            |map| {
                let state = match map.values().next() {
                    Some(spec) => PoolState::Found(spec.clone()),
                    None => PoolState::Missing,
                };
                state_tx.send_if_modified(|s| {
                    let changed = *s != state;
                    *s = state;
                    changed
                });
            },
            &mut pool_shutdown,
        )
        .await;
        drop(state_tx);
    };
    tokio::join!(
        watch_pool,
        watch_pods(&pool, &client, state_rx, &tx, shutdown)
    );
}

/// Follows the pool's state: lists and watches the Pods of its current selector (restarted on
/// every change of the pool), or publishes an empty set while the pool does not exist.
async fn watch_pods(
    pool: &str,
    client: &PoolClient,
    mut state_rx: watch::Receiver<PoolState>,
    tx: &watch::Sender<Endpoints>,
    mut shutdown: watch::Receiver<bool>,
) {
    let NamedPool { namespace, name } = &client.pool;
    loop {
        let state = state_rx.borrow_and_update().clone();
        let pods = match state {
            PoolState::Unknown => None,
            PoolState::Missing => {
                tracing::warn!(pool = %pool, inference_pool = %format!("{namespace}/{name}"),
                    "InferencePool not found: the pool has no endpoints until it exists");
                publish(pool, "InferencePool", tx, Vec::new());
                None
            }
            PoolState::Found(spec) => {
                let ports = chosen_ports(&spec.target_ports, client.port);
                let selector = label_selector(&spec.match_labels);
                tracing::info!(pool = %pool, inference_pool = %format!("{namespace}/{name}"),
                    selector = %selector, ports = ?ports, "InferencePool read");
                if spec.match_labels.is_empty() {
                    // An empty selector would take every pod of the namespace.
                    tracing::warn!(pool = %pool, inference_pool = %format!("{namespace}/{name}"),
                        "InferencePool selects no labels: the pool has no endpoints");
                    publish(pool, "InferencePool", tx, Vec::new());
                    None
                } else if ports.is_empty() {
                    tracing::warn!(pool = %pool, inference_pool = %format!("{namespace}/{name}"),
                        target_ports = ?spec.target_ports, configured = ?client.port,
                        "the configured port is not among the InferencePool's target ports: the pool has no endpoints");
                    publish(pool, "InferencePool", tx, Vec::new());
                    None
                } else {
                    Some((
                        Pods {
                            namespace: namespace.clone(),
                            selector,
                        },
                        ports,
                    ))
                }
            }
        };
        match pods {
            Some((pods, ports)) => {
                tokio::select! {
                    _ = informer(pool, &client.api, &pods,
                            |map| publish(pool, "Pod", tx, pod_endpoints(map, &ports)),
                            &mut shutdown) => return,
                    r = state_rx.changed() => if r.is_err() { return },
                }
            }
            None => {
                tokio::select! {
                    r = state_rx.changed() => if r.is_err() { return },
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

/// List, then watch, forever (until shutdown); `changed` sees the objects by name after the list
/// and after every event.
async fn informer<C: Collection>(
    pool: &str,
    api: &Api,
    c: &C,
    mut changed: impl FnMut(&BTreeMap<String, C::Item>),
    shutdown: &mut watch::Receiver<bool>,
) {
    let kind = C::KIND;
    let mut backoff = Duration::from_millis(250);
    loop {
        if *shutdown.borrow() {
            return;
        }
        match api.list(c).await {
            Ok((mut rv, mut map)) => {
                backoff = Duration::from_millis(250);
                changed(&map);
                loop {
                    let began = std::time::Instant::now();
                    match watch_once(pool, api, c, &mut rv, &mut map, &mut changed, shutdown).await
                    {
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
                            tracing::warn!(pool = %pool, error = %e, "{kind} watch failed; relisting");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(pool = %pool, error = %e, "{kind} list failed; keeping the last set")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn watch_once<C: Collection>(
    pool: &str,
    api: &Api,
    c: &C,
    rv: &mut String,
    map: &mut BTreeMap<String, C::Item>,
    changed: &mut impl FnMut(&BTreeMap<String, C::Item>),
    shutdown: &mut watch::Receiver<bool>,
) -> Result<WatchEnd, KubeError> {
    let url = api.url(c, Some(rv));
    let resp = tokio::select! {
        r = api.get(&url) => r?,
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
            if let Some(end) = apply_event(pool, c, ev, rv, map) {
                return Ok(end);
            }
            changed(map);
        }
        if buf.len() > MAX_EVENT_BYTES {
            return Err(KubeError::Http {
                url,
                reason: format!("watch event larger than {MAX_EVENT_BYTES} bytes"),
            });
        }
    }
}

fn apply_event<C: Collection>(
    pool: &str,
    c: &C,
    ev: WatchEvent,
    rv: &mut String,
    map: &mut BTreeMap<String, C::Item>,
) -> Option<WatchEnd> {
    let kind = C::KIND;
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => {
            let deleted = ev.kind == "DELETED";
            let read = Meta::deserialize(&ev.object["metadata"]).and_then(|meta| {
                let item = if deleted {
                    None
                } else {
                    Some(c.item(&ev.object)?)
                };
                Ok((meta, item))
            });
            let (meta, item) = match read {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(pool = %pool, error = %e, "unreadable {kind} in watch event; relisting");
                    return Some(WatchEnd::Relist);
                }
            };
            if !meta.resource_version.is_empty() {
                rv.clone_from(&meta.resource_version);
            }
            match item {
                Some(item) => map.insert(meta.name, item),
                None => map.remove(&meta.name),
            };
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
            tracing::info!(pool = %pool, code, "{kind} watch error event; relisting");
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

    fn slices(port: Option<PortRef>) -> Slices {
        Slices {
            namespace: "llm".into(),
            selector: "kubernetes.io/service-name=vllm".into(),
            port,
        }
    }

    fn ev(kind: &str, obj: &str) -> WatchEvent {
        WatchEvent {
            kind: kind.into(),
            object: serde_json::from_str(obj).expect("json"),
        }
    }

    #[test]
    fn events_update_the_map_and_version() {
        let mut map = BTreeMap::new();
        let mut rv = "1".to_owned();
        let c = slices(Some(PortRef::Number(8000)));
        assert!(apply_event("p", &c, ev("ADDED", SLICE), &mut rv, &mut map).is_none());
        assert_eq!((rv.as_str(), union(&map).len()), ("4711", 2));
        let bm = r#"{"kind":"EndpointSlice","metadata":{"resourceVersion":"5000"}}"#;
        assert!(apply_event("p", &c, ev("BOOKMARK", bm), &mut rv, &mut map).is_none());
        assert_eq!(rv, "5000");
        let del = r#"{"metadata":{"name":"vllm-abc12","resourceVersion":"5001"}}"#;
        assert!(apply_event("p", &c, ev("DELETED", del), &mut rv, &mut map).is_none());
        assert!(union(&map).is_empty());
        let gone = r#"{"kind":"Status","code":410,"reason":"Expired"}"#;
        assert!(matches!(
            apply_event("p", &c, ev("ERROR", gone), &mut rv, &mut map),
            Some(WatchEnd::Relist)
        ));
    }

    /// A real-shaped Pod (as `kubectl get pod -o json` shows one), with its phase, Ready
    /// condition, IP and deletion time given.
    fn pod(name: &str, ip: Option<&str>, ready: &str, deleting: bool) -> String {
        let mut p = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "llm", "resourceVersion": "77",
                         "labels": {"app": "vllm-llama", "pod-template-hash": "5d8f7"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "ports": [{"containerPort": 8000, "name": "http"}]}]},
            "status": {"phase": "Running", "hostIP": "10.0.0.2",
                       "conditions": [
                           {"type": "PodScheduled", "status": "True"},
                           {"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": ready},
                           {"type": "Ready", "status": ready}]}
        });
        if let Some(ip) = ip {
            p["status"]["podIP"] = serde_json::json!(ip);
            p["status"]["podIPs"] = serde_json::json!([{"ip": ip}]);
        }
        if deleting {
            p["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-05T10:00:00Z");
            p["metadata"]["deletionGracePeriodSeconds"] = serde_json::json!(30);
        }
        p.to_string()
    }

    fn pods() -> Pods {
        Pods {
            namespace: "llm".into(),
            selector: "app=vllm-llama".into(),
        }
    }

    #[test]
    fn only_ready_live_pods_with_an_ip_serve() {
        let ip = |json: &str| {
            pods()
                .item(&serde_json::from_str(json).expect("json"))
                .expect("pod")
        };
        let want: IpAddr = "10.1.0.5".parse().expect("ip");
        assert_eq!(ip(&pod("a", Some("10.1.0.5"), "True", false)), Some(want));
        assert_eq!(ip(&pod("a", Some("10.1.0.5"), "False", false)), None);
        assert_eq!(ip(&pod("a", Some("10.1.0.5"), "True", true)), None);
        assert_eq!(ip(&pod("a", None, "True", false)), None);
        // Pending: no conditions, no IP yet.
        assert_eq!(
            ip(r#"{"metadata":{"name":"a"},"status":{"phase":"Pending"}}"#),
            None
        );
        assert_eq!(
            ip(&pod("a", Some("fd00::5"), "True", false)),
            "fd00::5".parse().ok()
        );
    }

    #[test]
    fn pod_events_give_every_ready_pod_on_every_port() {
        let mut map = BTreeMap::new();
        let mut rv = String::new();
        let c = pods();
        for (kind, p) in [
            ("ADDED", pod("a", Some("10.1.0.5"), "True", false)),
            ("ADDED", pod("b", Some("10.1.0.6"), "False", false)),
            ("ADDED", pod("c", None, "False", false)),
        ] {
            assert!(apply_event("p", &c, ev(kind, &p), &mut rv, &mut map).is_none());
        }
        assert_eq!(rv, "77");
        let addrs = |map: &BTreeMap<String, Option<IpAddr>>, ports: &[u16]| {
            pod_endpoints(map, ports)
                .iter()
                .map(SocketAddr::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(addrs(&map, &[8000]), ["10.1.0.5:8000"]);
        assert_eq!(
            addrs(&map, &[8000, 8001]),
            ["10.1.0.5:8000", "10.1.0.5:8001"]
        );
        let b_ready = pod("b", Some("10.1.0.6"), "True", false);
        assert!(apply_event("p", &c, ev("MODIFIED", &b_ready), &mut rv, &mut map).is_none());
        assert_eq!(addrs(&map, &[8000]), ["10.1.0.5:8000", "10.1.0.6:8000"]);
        let a_deleting = pod("a", Some("10.1.0.5"), "True", true);
        assert!(apply_event("p", &c, ev("MODIFIED", &a_deleting), &mut rv, &mut map).is_none());
        assert_eq!(addrs(&map, &[8000]), ["10.1.0.6:8000"]);
        assert!(apply_event("p", &c, ev("DELETED", &b_ready), &mut rv, &mut map).is_none());
        assert!(addrs(&map, &[8000]).is_empty());
    }

    const POOL: &str = r#"{
      "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
      "metadata": {"name": "llama", "namespace": "llm", "resourceVersion": "9"},
      "spec": {"selector": {"matchLabels": {"app": "vllm-llama", "tier": "gpu"}},
               "targetPorts": [{"number": 8001}, {"number": 8000}],
               "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}}}
    }"#;

    #[test]
    fn the_pool_gives_its_selector_and_ports() {
        let c = NamedPool {
            namespace: "llm".into(),
            name: "llama".into(),
        };
        assert_eq!(
            c.path(),
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools?fieldSelector=metadata.name%3Dllama"
        );
        let spec = c
            .item(&serde_json::from_str(POOL).expect("json"))
            .expect("pool");
        assert_eq!(spec.target_ports, [8000, 8001]);
        assert_eq!(
            label_selector(&spec.match_labels),
            "app=vllm-llama,tier=gpu"
        );
        assert_eq!(
            Pods {
                namespace: "llm".into(),
                selector: label_selector(&spec.match_labels)
            }
            .path(),
            "/api/v1/namespaces/llm/pods?labelSelector=app%3Dvllm-llama%2Ctier%3Dgpu"
        );
        assert_eq!(chosen_ports(&spec.target_ports, None), [8000, 8001]);
        assert_eq!(chosen_ports(&spec.target_ports, Some(8001)), [8001]);
        assert!(chosen_ports(&spec.target_ports, Some(9000)).is_empty());
        // Without targetPorts it is not an InferencePool: the event is refused (relist).
        let mut map = BTreeMap::new();
        let bad = r#"{"metadata":{"name":"llama"},"spec":{"selector":{"matchLabels":{"a":"b"}}}}"#;
        assert!(matches!(
            apply_event("p", &c, ev("ADDED", bad), &mut String::new(), &mut map),
            Some(WatchEnd::Relist)
        ));
        assert!(map.is_empty());
    }

    /// Only the sidecar's pools' objects, by name; an unset priority is 0; a name the snapshot
    /// cannot carry is left out; no object of the pools is no section, not an empty one.
    #[test]
    fn objectives_of_the_pools_by_name() {
        let c = Objectives {
            namespace: "llm".into(),
        };
        let obj = |pool: &str, priority: Option<i32>| {
            let mut spec = serde_json::json!({"poolRef": {"name": pool}});
            if let Some(p) = priority {
                spec["priority"] = p.into();
            }
            c.item(&serde_json::json!({"spec": spec}))
                .expect("an objective")
        };
        let mut map = BTreeMap::new();
        map.insert("vip".to_string(), obj("llama", Some(10)));
        map.insert("plain".to_string(), obj("llama", None));
        map.insert("theirs".to_string(), obj("qwen", Some(-1)));
        map.insert("x".repeat(256), obj("llama", Some(1)));
        let got: Vec<(String, i32)> = objectives_of(&map, &["llama".to_string()])
            .expect("a section")
            .into_iter()
            .map(|o| (o.name, o.priority))
            .collect();
        assert_eq!(got, vec![("plain".into(), 0), ("vip".into(), 10)]);
        assert_eq!(objectives_of(&map, &["other".to_string()]), None);
        assert!(c
            .item(&serde_json::json!({"spec": {"priority": 1}}))
            .is_err());
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
