//! Kubernetes discovery against a local stand-in API server (axum) that serves real-shaped
//! `discovery.k8s.io/v1` EndpointSlice list and watch JSON: slices added, made unready, deleted,
//! and a `410 Gone` that forces a relist all reach the next snapshot. Also checks the request the
//! sidecar makes (path, label selector, bearer token).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use common::*;
use serde_json::json;
use sidecar_metrics::config::{Discovery, InferencePoolConfig, KubeApi, KubeConfig, PortRef};
use sidecar_metrics::sidecar;
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(10);

/// The credentials every test gives the sidecar for a stand-in API server at `addr`.
fn stand_in_api(addr: SocketAddr) -> KubeApi {
    KubeApi {
        server: format!("http://{addr}"),
        token: Some("test-token".into()),
        token_file: None,
        ca_file: None,
    }
}

/// A real-shaped EndpointSlice for one pod on loopback.
fn slice(name: &str, rv: u64, pod: SocketAddr, ready: bool) -> serde_json::Value {
    json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "generateName": "vllm-",
            "namespace": "llm",
            "uid": format!("uid-{name}"),
            "resourceVersion": rv.to_string(),
            "generation": 1,
            "creationTimestamp": "2026-11-30T05:00:00Z",
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": "vllm"
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "vllm", "uid": "svc-uid",
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": [pod.ip().to_string()],
            "conditions": {"ready": ready, "serving": ready, "terminating": !ready},
            "targetRef": {"kind": "Pod", "namespace": "llm", "name": format!("{name}-pod"), "uid": "pod-uid"},
            "nodeName": "node-1",
            "zone": "zone-a"
        }],
        "ports": [
            {"name": "grpc", "protocol": "TCP", "port": 9},
            {"name": "http", "protocol": "TCP", "port": pod.port(), "appProtocol": "http"}
        ]
    })
}

/// Namespace, query parameters and `authorization` header of one request.
type Request = (String, BTreeMap<String, String>, Option<String>);

#[derive(Clone, Default)]
struct Api {
    slices: Arc<Mutex<BTreeMap<String, serde_json::Value>>>,
    rv: Arc<Mutex<u64>>,
    events: Arc<Mutex<Option<broadcast::Sender<String>>>>,
    requests: Arc<Mutex<Vec<Request>>>,
}

async fn endpointslices(
    State(api): State<Api>,
    Path(ns): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    api.requests
        .lock()
        .expect("lock")
        .push((ns.clone(), q.clone(), auth.clone()));
    if auth.as_deref() != Some("Bearer test-token") {
        return (
            StatusCode::UNAUTHORIZED,
            "{\"kind\":\"Status\",\"code\":401}",
        )
            .into_response();
    }
    if ns != "llm"
        || q.get("labelSelector").map(String::as_str) != Some("kubernetes.io/service-name=vllm")
    {
        let list = json!({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                          "metadata": {"resourceVersion": "1"}, "items": []});
        return (StatusCode::OK, list.to_string()).into_response();
    }
    if q.get("watch").map(String::as_str) == Some("true") {
        let rx = {
            let mut ev = api.events.lock().expect("lock");
            ev.get_or_insert_with(|| broadcast::channel(64).0)
                .subscribe()
        };
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(line) => Some((Ok::<Bytes, Infallible>(Bytes::from(line + "\n")), rx)),
                Err(_) => None,
            }
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let items: Vec<serde_json::Value> =
        api.slices.lock().expect("lock").values().cloned().collect();
    let rv = *api.rv.lock().expect("lock");
    let list = json!({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                      "metadata": {"resourceVersion": rv.to_string()}, "items": items});
    (StatusCode::OK, list.to_string()).into_response()
}

impl Api {
    fn watchers(&self) -> usize {
        self.requests
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, q, _)| q.get("watch").is_some())
            .count()
    }

    /// Changes the stored slice and sends the event to open watches.
    fn event(&self, kind: &str, name: &str, obj: Option<serde_json::Value>) {
        let mut rv = self.rv.lock().expect("lock");
        *rv += 1;
        let obj = match obj {
            Some(mut o) => {
                o["metadata"]["resourceVersion"] = json!(rv.to_string());
                self.slices
                    .lock()
                    .expect("lock")
                    .insert(name.into(), o.clone());
                o
            }
            None => {
                let o = self
                    .slices
                    .lock()
                    .expect("lock")
                    .remove(name)
                    .expect("slice exists");
                o
            }
        };
        let line = json!({"type": kind, "object": obj}).to_string();
        if let Some(tx) = self.events.lock().expect("lock").as_ref() {
            let _ = tx.send(line);
        }
    }

    fn raw(&self, line: serde_json::Value) {
        if let Some(tx) = self.events.lock().expect("lock").as_ref() {
            let _ = tx.send(line.to_string());
        }
    }
}

async fn wait_watchers(api: &Api, n: usize) {
    let start = std::time::Instant::now();
    while api.watchers() < n {
        assert!(
            start.elapsed() < LIMIT,
            "the sidecar never opened watch #{n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The watch request is recorded just before the handler subscribes; give it a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn endpointslice_changes_reach_the_snapshot() {
    let fleet = FakeFleet::start(3, Answer::Text(vllm_text(1, 1, 0.25))).await;
    let [a, b, c] = [fleet.addrs[0], fleet.addrs[1], fleet.addrs[2]];
    let api = Api::default();
    *api.rv.lock().expect("lock") = 100;
    api.slices
        .lock()
        .expect("lock")
        .insert("vllm-a".into(), slice("vllm-a", 100, a, true));
    let app = Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            get(endpointslices),
        )
        .with_state(api.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api_addr = l.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });

    let proxy = FakeProxy::start().await;
    let discovery = Discovery::Kubernetes(KubeConfig {
        namespace: Some("llm".into()),
        service: Some("vllm".into()),
        label_selector: None,
        port: Some(PortRef::Name("http".into())),
        api: Some(stand_in_api(api_addr)),
    });
    let cfg = config(proxy.addr, discovery, 20, 1000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let has = |want: Vec<SocketAddr>| {
        let want: Vec<String> = want.iter().map(|a| a.to_string()).collect();
        move |s: &[llm_router_snapshot::Snapshot]| s.last().is_some_and(|s| pod_addrs(s) == want)
    };
    proxy
        .wait_for("pod a from the list", LIMIT, has(vec![a]))
        .await;
    proxy
        .wait_for("pod a scraped", LIMIT, |s| {
            s.last().and_then(|s| s.pool("llama")).is_some_and(|p| {
                p.pods
                    .iter()
                    .all(|p| p.waiting == 1 && p.kv_usage == Some(0.25))
            })
        })
        .await;
    wait_watchers(&api, 1).await;
    {
        let reqs = api.requests.lock().expect("lock");
        let (ns, q, auth) = reqs.last().expect("a request");
        assert_eq!(ns, "llm");
        assert_eq!(
            q.get("labelSelector").map(String::as_str),
            Some("kubernetes.io/service-name=vllm")
        );
        assert_eq!(q.get("resourceVersion").map(String::as_str), Some("100"));
        assert_eq!(
            q.get("allowWatchBookmarks").map(String::as_str),
            Some("true")
        );
        assert_eq!(auth.as_deref(), Some("Bearer test-token"));
    }

    api.event("ADDED", "vllm-b", Some(slice("vllm-b", 0, b, true)));
    proxy.wait_for("pods a and b", LIMIT, has(vec![a, b])).await;
    api.event("MODIFIED", "vllm-a", Some(slice("vllm-a", 0, a, false)));
    proxy.wait_for("a not ready", LIMIT, has(vec![b])).await;
    api.raw(json!({"type": "BOOKMARK", "object": {"kind": "EndpointSlice", "metadata": {"resourceVersion": "500"}}}));
    api.event("DELETED", "vllm-b", None);
    proxy.wait_for("no pods", LIMIT, has(vec![])).await;

    // The server forgets old versions: 410 Gone, the sidecar lists again and sees the new slice.
    api.slices
        .lock()
        .expect("lock")
        .insert("vllm-c".into(), slice("vllm-c", 0, c, true));
    api.raw(json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "too old resource version", "reason": "Expired", "code": 410}}));
    proxy
        .wait_for("pod c after relist", LIMIT, has(vec![c]))
        .await;
    wait_watchers(&api, 2).await;
    running.stop().await;
    server.abort();
}

#[tokio::test]
async fn a_wrong_token_keeps_the_fleet_empty_and_says_why() {
    let api = Api::default();
    let app = Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            get(endpointslices),
        )
        .with_state(api.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api_addr = l.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let cfg = KubeConfig {
        namespace: Some("llm".into()),
        service: Some("vllm".into()),
        label_selector: None,
        port: None,
        api: Some(KubeApi {
            server: format!("http://{api_addr}"),
            token: Some("wrong".into()),
            token_file: None,
            ca_file: None,
        }),
    };
    let client = sidecar_metrics::kube::Client::from_config(&cfg).expect("client");
    let e = client.list().await.expect_err("401");
    assert!(
        matches!(
            e,
            sidecar_metrics::kube::KubeError::Status { status: 401, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("401"));
    server.abort();
}

#[test]
fn https_without_a_ca_is_refused_at_start() {
    let cfg = KubeConfig {
        namespace: None,
        service: Some("vllm".into()),
        label_selector: None,
        port: None,
        api: Some(KubeApi {
            server: "https://127.0.0.1:6443".into(),
            token: None,
            token_file: None,
            ca_file: None,
        }),
    };
    assert!(matches!(
        sidecar_metrics::kube::Client::from_config(&cfg),
        Err(sidecar_metrics::kube::KubeError::NoCa)
    ));
}

/// Makes a CA and a server certificate for 127.0.0.1 with the openssl command; returns
/// (dir, ca.crt, server.crt, server.key).
fn certs() -> (std::path::PathBuf, String, String, String) {
    let dir = std::env::temp_dir().join(format!(
        "sidecar-kube-tls-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |n: &str| dir.join(n).display().to_string();
    std::fs::write(
        p("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.crt"),
        "-subj",
        "/CN=test-ca",
        "-days",
        "1",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &p("srv.key"),
        "-out",
        &p("srv.csr"),
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p("srv.csr"),
        "-CA",
        &p("ca.crt"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-out",
        &p("srv.crt"),
        "-days",
        "1",
        "-extfile",
        &p("ext.cnf"),
    ]);
    (dir.clone(), p("ca.crt"), p("srv.crt"), p("srv.key"))
}

/// An https API server stand-in answering every request with one EndpointSlice list.
async fn tls_api(cert: &str, key: &str, list: String) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            let list = list.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let list = list.clone();
                        async move {
                            let ok = req
                                .headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                == Some("Bearer tls-token");
                            let (code, body) = if ok {
                                (200, list)
                            } else {
                                (401, "{}".to_owned())
                            };
                            Ok::<_, Infallible>(
                                hyper::Response::builder()
                                    .status(code)
                                    .body(http_body_util::Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn https_api_server_with_a_ca_file_and_a_token_file() {
    let (dir, ca, cert, key) = certs();
    let pod: SocketAddr = "10.0.0.9:8000".parse().unwrap();
    let list = json!({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                      "metadata": {"resourceVersion": "7"}, "items": [slice("vllm-x", 7, pod, true)]})
    .to_string();
    let (addr, task) = tls_api(&cert, &key, list).await;
    let token_file = dir.join("token");
    std::fs::write(&token_file, "tls-token\n").unwrap();
    let cfg = |ca_file: &str| KubeConfig {
        namespace: Some("llm".into()),
        service: Some("vllm".into()),
        label_selector: None,
        port: Some(PortRef::Name("http".into())),
        api: Some(KubeApi {
            server: format!("https://{addr}"),
            token: None,
            token_file: Some(token_file.display().to_string()),
            ca_file: Some(ca_file.into()),
        }),
    };
    let client = sidecar_metrics::kube::Client::from_config(&cfg(&ca)).expect("client");
    let (rv, map) = client.list().await.expect("list over https");
    assert_eq!(rv, "7");
    assert_eq!(map.get("vllm-x"), Some(&vec![pod]));

    // A server certificate from another CA is refused.
    let (dir2, other_ca, _, _) = certs();
    let client = sidecar_metrics::kube::Client::from_config(&cfg(&other_ca)).expect("client");
    let e = client.list().await.expect_err("untrusted server");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // A CA file without a certificate is refused at start.
    std::fs::write(dir.join("empty.pem"), "not a pem\n").unwrap();
    let e = sidecar_metrics::kube::Client::from_config(&cfg(&dir
        .join("empty.pem")
        .display()
        .to_string()));
    assert!(matches!(
        e,
        Err(sidecar_metrics::kube::KubeError::BadCa { .. })
    ));
    task.abort();
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}

// ---- InferencePool discovery: the pool object and the Pods it selects ----

/// The query parameters of one request.
type Params = BTreeMap<String, String>;

/// A stand-in API server holding InferencePools and Pods, serving list and watch for both with
/// the API server's filtering (`fieldSelector=metadata.name=...`, equality `labelSelector`).
/// Every InferencePool it is given is first checked against the real CRD schema
/// (`test-harness/fixtures/crds/gaie-inferencepools.yaml`).
#[derive(Clone)]
struct PoolApi {
    /// (resource, name) → object.
    objects: Arc<Mutex<BTreeMap<(&'static str, String), serde_json::Value>>>,
    rv: Arc<Mutex<u64>>,
    /// (resource, event line) to every open watch.
    events: broadcast::Sender<(&'static str, serde_json::Value)>,
    /// Resource and query of every request.
    requests: Arc<Mutex<Vec<(&'static str, Params)>>>,
    crds: Arc<testkit::crds::Crds>,
}

const POOLS: &str = "inferencepools";
const PODS: &str = "pods";
const REWRITES: &str = "inferencemodelrewrites";
const OBJECTIVES: &str = "inferenceobjectives";

/// A real-shaped InferencePool (GAIE v1), with an endpoint picker the sidecar ignores.
fn inference_pool(labels: serde_json::Value, ports: &[u16]) -> serde_json::Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "llama-pool", "namespace": "llm", "uid": "pool-uid", "generation": 1,
                     "creationTimestamp": "2026-12-01T08:00:00Z"},
        "spec": {
            "selector": {"matchLabels": labels},
            "targetPorts": ports.iter().map(|p| json!({"number": p})).collect::<Vec<_>>(),
            "appProtocol": "http",
            "endpointPickerRef": {"name": "llama-epp", "kind": "Service", "port": {"number": 9002},
                                  "failureMode": "FailClose"}
        },
        "status": {"parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llm-gateway"},
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                            "lastTransitionTime": "2026-12-01T08:00:01Z", "observedGeneration": 1}]
        }]}
    })
}

/// A real-shaped Pod at `ip` with labels `app=<app>`, Ready or not, terminating or not.
fn k8s_pod(name: &str, app: &str, ip: &str, ready: bool, terminating: bool) -> serde_json::Value {
    let status = if ready { "True" } else { "False" };
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T08:00:00Z",
                     "labels": {"app": app, "pod-template-hash": "6c9d8b7f5"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": format!("{app}-6c9d8b7f5"), "uid": "rs-uid",
                                          "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": "node-1",
                 "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                 "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.2", "podIP": ip, "podIPs": [{"ip": ip}],
                   "startTime": "2026-12-01T08:00:02Z",
                   "conditions": [
                       {"type": "PodReadyToStartContainers", "status": "True"},
                       {"type": "Initialized", "status": "True"},
                       {"type": "Ready", "status": status},
                       {"type": "ContainersReady", "status": status},
                       {"type": "PodScheduled", "status": "True"}]}
    });
    if terminating {
        p["metadata"]["deletionTimestamp"] = json!("2026-12-01T09:00:00Z");
        p["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    }
    p
}

/// Does `obj` pass the query's `fieldSelector` (metadata.name=) and equality `labelSelector`?
fn selected(obj: &serde_json::Value, q: &BTreeMap<String, String>) -> bool {
    if let Some(fs) = q.get("fieldSelector") {
        let (k, v) = fs.split_once('=').expect("field selector k=v");
        assert_eq!(k, "metadata.name", "only metadata.name is supported here");
        if obj["metadata"]["name"] != v {
            return false;
        }
    }
    if let Some(ls) = q.get("labelSelector") {
        assert!(
            !ls.is_empty(),
            "an empty label selector would select the whole namespace"
        );
        for term in ls.split(',') {
            let (k, v) = term.split_once('=').expect("equality selector");
            if obj["metadata"]["labels"][k] != v {
                return false;
            }
        }
    }
    true
}

impl PoolApi {
    fn new() -> PoolApi {
        PoolApi {
            objects: Default::default(),
            rv: Arc::new(Mutex::new(100)),
            events: broadcast::channel(256).0,
            requests: Default::default(),
            crds: Arc::new(testkit::crds::load_crds(&testkit::crds::crds_dir())),
        }
    }

    /// Stores `obj` (or removes it: `None`) and sends the event to open watches.
    fn event(
        &self,
        resource: &'static str,
        kind: &str,
        name: &str,
        obj: Option<serde_json::Value>,
    ) {
        let mut rv = self.rv.lock().expect("lock");
        *rv += 1;
        let mut objects = self.objects.lock().expect("lock");
        let mut obj = match obj {
            Some(o) => o,
            None => objects
                .remove(&(resource, name.to_owned()))
                .expect("object exists"),
        };
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if [POOLS, REWRITES, OBJECTIVES].contains(&resource) {
            let errors = testkit::crds::check_manifest(&obj, &self.crds);
            assert!(errors.is_empty(), "not a valid {resource}: {errors:?}");
        }
        if kind != "DELETED" {
            objects.insert((resource, name.to_owned()), obj.clone());
        }
        let _ = self
            .events
            .send((resource, json!({"type": kind, "object": obj})));
    }

    fn put(&self, resource: &'static str, name: &str, obj: serde_json::Value) {
        self.event(resource, "ADDED", name, Some(obj));
    }

    /// Sends a raw event line to the open watches of `resource`.
    fn raw(&self, resource: &'static str, line: serde_json::Value) {
        let _ = self.events.send((resource, line));
    }

    fn requests(&self, resource: &str) -> Vec<BTreeMap<String, String>> {
        self.requests
            .lock()
            .expect("lock")
            .iter()
            .filter(|(r, _)| *r == resource)
            .map(|(_, q)| q.clone())
            .collect()
    }

    fn watches(&self, resource: &str) -> usize {
        self.requests(resource)
            .iter()
            .filter(|q| q.contains_key("watch"))
            .count()
    }

    async fn wait_watches(&self, resource: &str, n: usize) {
        let start = std::time::Instant::now();
        while self.watches(resource) < n {
            assert!(
                start.elapsed() < LIMIT,
                "the sidecar never opened {resource} watch #{n}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    fn answer(&self, resource: &'static str, ns: &str, q: BTreeMap<String, String>) -> Response {
        self.requests
            .lock()
            .expect("lock")
            .push((resource, q.clone()));
        let list_kind = match resource {
            POOLS => ("inference.networking.k8s.io/v1", "InferencePoolList"),
            REWRITES => ("llm-d.ai/v1alpha2", "InferenceModelRewriteList"),
            OBJECTIVES => ("llm-d.ai/v1alpha2", "InferenceObjectiveList"),
            _ => ("v1", "PodList"),
        };
        if ns != "llm" {
            return (StatusCode::NOT_FOUND, "{\"kind\":\"Status\",\"code\":404}").into_response();
        }
        if q.get("watch").map(String::as_str) == Some("true") {
            let rx = self.events.subscribe();
            let stream = futures_util::stream::unfold((rx, q), move |(mut rx, q)| async move {
                loop {
                    match rx.recv().await {
                        Ok((r, line)) if r == resource => {
                            let obj = &line["object"];
                            if line["type"] == "ERROR"
                                || line["type"] == "BOOKMARK"
                                || selected(obj, &q)
                            {
                                let bytes = Bytes::from(line.to_string() + "\n");
                                return Some((Ok::<Bytes, Infallible>(bytes), (rx, q)));
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return None,
                    }
                }
            });
            return Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        let items: Vec<serde_json::Value> = self
            .objects
            .lock()
            .expect("lock")
            .iter()
            .filter(|((r, _), o)| *r == resource && selected(o, &q))
            .map(|(_, o)| o.clone())
            .collect();
        let rv = *self.rv.lock().expect("lock");
        let list = json!({"kind": list_kind.1, "apiVersion": list_kind.0,
                          "metadata": {"resourceVersion": rv.to_string()}, "items": items});
        (StatusCode::OK, list.to_string()).into_response()
    }

    async fn serve(&self) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        async fn pools(
            State(api): State<PoolApi>,
            Path(ns): Path<String>,
            Query(q): Query<BTreeMap<String, String>>,
        ) -> Response {
            api.answer(POOLS, &ns, q)
        }
        async fn pods(
            State(api): State<PoolApi>,
            Path(ns): Path<String>,
            Query(q): Query<BTreeMap<String, String>>,
        ) -> Response {
            api.answer(PODS, &ns, q)
        }
        async fn rewrites(
            State(api): State<PoolApi>,
            Path(ns): Path<String>,
            Query(q): Query<BTreeMap<String, String>>,
        ) -> Response {
            api.answer(REWRITES, &ns, q)
        }
        async fn objectives(
            State(api): State<PoolApi>,
            Path(ns): Path<String>,
            Query(q): Query<BTreeMap<String, String>>,
        ) -> Response {
            api.answer(OBJECTIVES, &ns, q)
        }
        let app = Router::new()
            .route(
                "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
                get(pools),
            )
            .route(
                "/apis/llm-d.ai/v1alpha2/namespaces/{ns}/inferencemodelrewrites",
                get(rewrites),
            )
            .route(
                "/apis/llm-d.ai/v1alpha2/namespaces/{ns}/inferenceobjectives",
                get(objectives),
            )
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .with_state(self.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        (addr, task)
    }
}

/// Fake vLLM pods at 127.0.0.2..=127.0.0.5, each on the same two ports (pods of one pool share
/// their target ports).
async fn pods_on_two_ports() -> (Vec<tokio::task::JoinHandle<()>>, [u16; 2]) {
    'again: for _ in 0..50 {
        let mut listeners = Vec::new();
        let mut ports = [0u16; 2];
        for (i, port) in ports.iter_mut().enumerate() {
            let first = tokio::net::TcpListener::bind("127.0.0.2:0")
                .await
                .expect("bind");
            *port = first.local_addr().expect("addr").port();
            listeners.push((first, i));
            for ip in ["127.0.0.3", "127.0.0.4", "127.0.0.5"] {
                let Ok(l) = tokio::net::TcpListener::bind((ip, *port)).await else {
                    continue 'again;
                };
                listeners.push((l, i));
            }
        }
        let mut tasks = Vec::new();
        for (l, i) in listeners {
            // Port 1 answers 3 waiting, port 2 answers 7: the snapshot shows which one was read.
            let waiting = if i == 0 { 3 } else { 7 };
            let app = axum::Router::new().route(
                "/metrics",
                get(move || async move { vllm_text(waiting, 1, 0.5) }),
            );
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            }));
        }
        return (tasks, ports);
    }
    panic!("no two ports free on all of 127.0.0.2-5");
}

fn pool_discovery(api_addr: SocketAddr, port: Option<u16>) -> Discovery {
    Discovery::InferencePool(InferencePoolConfig {
        name: "llama-pool".into(),
        namespace: Some("llm".into()),
        port,
        api: Some(stand_in_api(api_addr)),
    })
}

/// The last snapshot lists exactly these pods (in any order).
fn has_pods(want: &[String]) -> impl Fn(&[llm_router_snapshot::Snapshot]) -> bool {
    let sorted = |v: Vec<String>| {
        let mut v: Vec<SocketAddr> = v.iter().map(|a| a.parse().expect("ip:port")).collect();
        v.sort();
        v
    };
    let want = sorted(want.to_vec());
    move |s: &[llm_router_snapshot::Snapshot]| {
        s.last().is_some_and(|s| sorted(pod_addrs(s)) == want)
    }
}

#[test]
fn the_test_pools_are_valid_inference_pools_and_the_check_has_teeth() {
    let crds = testkit::crds::load_crds(&testkit::crds::crds_dir());
    for pool in [
        inference_pool(json!({"app": "vllm-llama"}), &[8000]),
        inference_pool(json!({"app": "vllm-llama", "tier": "gpu"}), &[8000, 8001]),
    ] {
        assert_eq!(
            testkit::crds::check_manifest(&pool, &crds),
            Vec::<String>::new()
        );
    }
    let mut no_ports = inference_pool(json!({"app": "a"}), &[]);
    no_ports["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("targetPorts");
    assert!(testkit::crds::check_manifest(&no_ports, &crds)
        .iter()
        .any(|e| e.contains("`targetPorts`")));
    let mut bad = inference_pool(json!({"app": "a"}), &[8000]);
    bad["spec"]["selector"] = json!({"app": "a"});
    assert!(!testkit::crds::check_manifest(&bad, &crds).is_empty());
    assert!(!testkit::crds::check_manifest(&inference_pool(json!({}), &[8000]), &crds).is_empty());
}

#[tokio::test]
async fn inference_pool_pods_reach_the_snapshot_and_follow_the_pool() {
    let (tasks, [p1, p2]) = pods_on_two_ports().await;
    let at = |ip: &str, port: u16| format!("{ip}:{port}");
    let api = PoolApi::new();
    api.put(
        POOLS,
        "llama-pool",
        inference_pool(json!({"app": "vllm-llama"}), &[p1]),
    );
    api.put(
        PODS,
        "a",
        k8s_pod("a", "vllm-llama", "127.0.0.2", true, false),
    );
    api.put(PODS, "x", k8s_pod("x", "other", "127.0.0.3", true, false));
    api.put(
        PODS,
        "n",
        k8s_pod("n", "vllm-llama", "127.0.0.4", false, false),
    );
    api.put(
        PODS,
        "t",
        k8s_pod("t", "vllm-llama", "127.0.0.5", true, true),
    );
    let (api_addr, server) = api.serve().await;

    let proxy = FakeProxy::start().await;
    let cfg = config(proxy.addr, pool_discovery(api_addr, None), 20, 1000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    // Only the Ready, matching, live pod, on the pool's target port.
    let want = [at("127.0.0.2", p1)];
    proxy
        .wait_for("pod a on port 1", LIMIT, has_pods(&want))
        .await;
    proxy
        .wait_for("pod a scraped on port 1", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.iter().all(|p| p.waiting == 3))
        })
        .await;
    api.wait_watches(POOLS, 1).await;
    api.wait_watches(PODS, 1).await;
    let pool_q = api.requests(POOLS);
    assert_eq!(
        pool_q[0].get("fieldSelector").map(String::as_str),
        Some("metadata.name=llama-pool")
    );
    let pod_q = api.requests(PODS);
    assert_eq!(
        pod_q[0].get("labelSelector").map(String::as_str),
        Some("app=vllm-llama")
    );
    assert!(pod_q
        .last()
        .is_some_and(|q| q.get("allowWatchBookmarks").map(String::as_str) == Some("true")));

    // A pod becoming Ready appears; a deleted one goes; the terminating one never comes.
    api.event(
        PODS,
        "MODIFIED",
        "n",
        Some(k8s_pod("n", "vllm-llama", "127.0.0.4", true, false)),
    );
    let want = [at("127.0.0.2", p1), at("127.0.0.4", p1)];
    proxy.wait_for("pod n ready", LIMIT, has_pods(&want)).await;
    api.event(PODS, "DELETED", "a", None);
    let want = [at("127.0.0.4", p1)];
    proxy
        .wait_for("pod a deleted", LIMIT, has_pods(&want))
        .await;
    // A Ready pod that starts terminating goes at once.
    api.event(
        PODS,
        "MODIFIED",
        "n",
        Some(k8s_pod("n", "vllm-llama", "127.0.0.4", true, true)),
    );
    proxy
        .wait_for("pod n terminating", LIMIT, has_pods(&[]))
        .await;
    api.put(
        PODS,
        "b",
        k8s_pod("b", "vllm-llama", "127.0.0.2", true, false),
    );
    let want = [at("127.0.0.2", p1)];
    proxy.wait_for("pod b added", LIMIT, has_pods(&want)).await;

    // The pool gains a second target port: every pod on both, live.
    api.event(
        POOLS,
        "MODIFIED",
        "llama-pool",
        Some(inference_pool(json!({"app": "vllm-llama"}), &[p1, p2])),
    );
    let want = [at("127.0.0.2", p1), at("127.0.0.2", p2)];
    proxy
        .wait_for("both target ports", LIMIT, has_pods(&want))
        .await;
    proxy
        .wait_for("pod b scraped on port 2", LIMIT, |s| {
            s.last().and_then(|s| s.pool("llama")).is_some_and(|p| {
                p.pods
                    .iter()
                    .any(|p| p.address == at("127.0.0.2", p2) && p.waiting == 7)
            })
        })
        .await;
    // The pool selects other pods on one port: re-targeted without a restart.
    api.event(
        POOLS,
        "MODIFIED",
        "llama-pool",
        Some(inference_pool(json!({"app": "other"}), &[p2])),
    );
    let want = [at("127.0.0.3", p2)];
    proxy
        .wait_for("selector changed", LIMIT, has_pods(&want))
        .await;
    assert_eq!(
        api.requests(PODS)
            .iter()
            .filter_map(|q| q.get("labelSelector").cloned())
            .next_back()
            .as_deref(),
        Some("app=other")
    );

    // 410 Gone on the pod watch: the sidecar lists again and sees a pod it missed. (The pod
    // watch was opened anew for each of the two pool changes.)
    api.wait_watches(PODS, 3).await;
    let watches = api.watches(PODS);
    api.objects.lock().expect("lock").insert(
        (PODS, "y".into()),
        k8s_pod("y", "other", "127.0.0.5", true, false),
    );
    api.raw(PODS, json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
        "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}}));
    let want = [at("127.0.0.3", p2), at("127.0.0.5", p2)];
    proxy
        .wait_for("pod y after relist", LIMIT, has_pods(&want))
        .await;
    api.wait_watches(PODS, watches + 1).await;

    // The pool is deleted: no endpoints; created again: back.
    api.event(POOLS, "DELETED", "llama-pool", None);
    proxy.wait_for("pool deleted", LIMIT, has_pods(&[])).await;
    api.put(
        POOLS,
        "llama-pool",
        inference_pool(json!({"app": "vllm-llama"}), &[p2]),
    );
    let want = [at("127.0.0.2", p2)];
    proxy
        .wait_for("pool created again", LIMIT, has_pods(&want))
        .await;

    running.stop().await;
    server.abort();
    for t in tasks {
        t.abort();
    }
}

#[tokio::test]
async fn a_configured_port_picks_one_of_the_target_ports() {
    let (tasks, [p1, p2]) = pods_on_two_ports().await;
    let api = PoolApi::new();
    api.put(
        POOLS,
        "llama-pool",
        inference_pool(json!({"app": "vllm-llama"}), &[p1, p2]),
    );
    api.put(
        PODS,
        "a",
        k8s_pod("a", "vllm-llama", "127.0.0.2", true, false),
    );
    let (api_addr, server) = api.serve().await;
    let proxy = FakeProxy::start().await;
    let cfg = config(proxy.addr, pool_discovery(api_addr, Some(p2)), 20, 1000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let want = [format!("127.0.0.2:{p2}")];
    proxy
        .wait_for("pod a on port 2 only", LIMIT, has_pods(&want))
        .await;
    api.wait_watches(POOLS, 1).await;
    // The pool drops that port: nothing rather than a port the pool does not serve.
    api.event(
        POOLS,
        "MODIFIED",
        "llama-pool",
        Some(inference_pool(json!({"app": "vllm-llama"}), &[p1])),
    );
    proxy
        .wait_for("port 2 gone from the pool", LIMIT, has_pods(&[]))
        .await;
    running.stop().await;
    server.abort();
    for t in tasks {
        t.abort();
    }
}

/// The sidecar's log lines, captured (a current-thread runtime keeps every task on this thread).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_inference_pool_gives_no_pods_and_says_so() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (tasks, [p1, _]) = pods_on_two_ports().await;
    let api = PoolApi::new();
    api.put(
        PODS,
        "a",
        k8s_pod("a", "vllm-llama", "127.0.0.2", true, false),
    );
    let (api_addr, server) = api.serve().await;
    let proxy = FakeProxy::start().await;
    let cfg = config(proxy.addr, pool_discovery(api_addr, None), 20, 1000);
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let start = std::time::Instant::now();
    while !logs.text().contains("InferencePool not found") {
        assert!(
            start.elapsed() < LIMIT,
            "no log about the missing pool:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let line = logs
        .text()
        .lines()
        .find(|l| l.contains("InferencePool not found"))
        .map(str::to_owned)
        .expect("line");
    assert!(
        line.contains("WARN") && line.contains("llm/llama-pool"),
        "{line}"
    );
    // Snapshots keep coming (heartbeats), with no pods; the pods are not even listed.
    proxy
        .wait_for("two snapshots", LIMIT, |s| {
            s.len() >= 2 && s.iter().all(|s| pod_addrs(s).is_empty())
        })
        .await;
    assert!(api.requests(PODS).is_empty());
    // The pool appears: its pods follow, so the sidecar was waiting, not dead.
    api.wait_watches(POOLS, 1).await;
    api.put(
        POOLS,
        "llama-pool",
        inference_pool(json!({"app": "vllm-llama"}), &[p1]),
    );
    let want = [format!("127.0.0.2:{p1}")];
    proxy
        .wait_for("the pool's pod", LIMIT, has_pods(&want))
        .await;
    running.stop().await;
    server.abort();
    for t in tasks {
        t.abort();
    }
}

/// A real-shaped `InferenceModelRewrite` (llm-d.ai/v1alpha2) for pool `pool`, created at
/// `created`: `chat` → the `(model, weight)` targets.
fn model_rewrite(
    name: &str,
    pool: &str,
    created: &str,
    targets: &[(&str, u32)],
) -> serde_json::Value {
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-{name}"),
                     "generation": 1, "creationTimestamp": created},
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool},
            "rules": [{
                "matches": [{"model": {"type": "Exact", "value": "chat"}}],
                "targets": targets.iter().map(|(m, w)| json!({"modelRewrite": m, "weight": w}))
                    .collect::<Vec<_>>()
            }]
        },
        "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "", "lastTransitionTime": "2026-12-01T08:00:01Z", "observedGeneration": 1}]}
    })
}

#[test]
fn the_test_rewrites_are_valid_inference_model_rewrites_and_the_check_has_teeth() {
    let crds = testkit::crds::load_crds(&testkit::crds::crds_dir());
    let ok = model_rewrite("a", "llama", "2026-12-01T08:00:00Z", &[("s", 9), ("c", 1)]);
    assert_eq!(
        testkit::crds::check_manifest(&ok, &crds),
        Vec::<String>::new()
    );
    // The CRD's weights start at 1; a rule needs a target.
    let zero = model_rewrite("a", "llama", "2026-12-01T08:00:00Z", &[("s", 0)]);
    assert!(!testkit::crds::check_manifest(&zero, &crds).is_empty());
    let none = model_rewrite("a", "llama", "2026-12-01T08:00:00Z", &[]);
    assert!(!testkit::crds::check_manifest(&none, &crds).is_empty());
}

/// The chat rule's targets in the last snapshot, as `(model, weight)`.
fn chat_rule(s: &[llm_router_snapshot::Snapshot]) -> Option<Vec<(String, u32)>> {
    let rules = s.last()?.rewrites.as_ref()?;
    let chat = rules.iter().find(|r| r.model == "chat")?;
    Some(
        chat.targets
            .iter()
            .map(|t| (t.model.clone(), t.weight))
            .collect(),
    )
}

fn targets(t: &[(&str, u32)]) -> Vec<(String, u32)> {
    t.iter().map(|(m, w)| ((*m).to_owned(), *w)).collect()
}

/// InferenceModelRewrites of the sidecar's pool reach every snapshot and follow the objects
/// live: the oldest object ruling a model wins, another pool's objects are ignored, a weight
/// change and a deletion apply with the next push, and with the pool's last object deleted the
/// snapshot carries no section again.
#[tokio::test]
async fn inference_model_rewrites_of_the_pool_reach_the_snapshot_live() {
    use sidecar_metrics::config::{ObjectWatchConfig, RewritesConfig};
    let api = PoolApi::new();
    let older = model_rewrite(
        "canary",
        "llama",
        "2026-12-01T08:00:00Z",
        &[("stable", 9), ("canary", 1)],
    );
    api.put(REWRITES, "canary", older);
    api.put(
        REWRITES,
        "newer",
        model_rewrite("newer", "llama", "2026-12-02T08:00:00Z", &[("newer", 1)]),
    );
    api.put(
        REWRITES,
        "other",
        model_rewrite("other", "other-pool", "2026-11-01T08:00:00Z", &[("x", 1)]),
    );
    let (api_addr, server) = api.serve().await;
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.1))).await;
    let proxy = FakeProxy::start().await;
    let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    cfg.rewrites = Some(RewritesConfig {
        rules: None,
        reload_ms: 0,
        kubernetes: Some(ObjectWatchConfig {
            namespace: Some("llm".into()),
            api: Some(stand_in_api(api_addr)),
        }),
    });
    cfg.validate().unwrap();
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let first = targets(&[("stable", 9), ("canary", 1)]);
    proxy
        .wait_for("the older object's rule", LIMIT, |s| {
            chat_rule(s) == Some(first.clone())
        })
        .await;
    api.wait_watches(REWRITES, 1).await;
    let shifted = targets(&[("stable", 1), ("canary", 9)]);
    api.event(
        REWRITES,
        "MODIFIED",
        "canary",
        Some(model_rewrite(
            "canary",
            "llama",
            "2026-12-01T08:00:00Z",
            &[("stable", 1), ("canary", 9)],
        )),
    );
    proxy
        .wait_for("the weight change", LIMIT, |s| {
            chat_rule(s) == Some(shifted.clone())
        })
        .await;
    api.event(REWRITES, "DELETED", "canary", None);
    let next = targets(&[("newer", 1)]);
    proxy
        .wait_for(
            "the newer object's rule once the older is gone",
            LIMIT,
            |s| chat_rule(s) == Some(next.clone()),
        )
        .await;
    // The pool's last object gone (another pool's is left): no section at all, so the
    // filter's configured rules apply again (an empty section would turn them off).
    api.event(REWRITES, "DELETED", "newer", None);
    proxy
        .wait_for(
            "no rewrites section once the pool has no object",
            LIMIT,
            |s| s.last().is_some_and(|s| s.rewrites.is_none()),
        )
        .await;
    running.stop().await;
    server.abort();
}

/// A real-shaped `InferenceObjective` (llm-d.ai/v1alpha2) named `name` for pool `pool`, with
/// `priority` (`None`: the field unset).
fn objective(name: &str, pool: &str, priority: Option<i32>) -> serde_json::Value {
    let mut spec = json!({"poolRef": {"group": "inference.networking.k8s.io",
                                      "kind": "InferencePool", "name": pool}});
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-{name}"),
                     "generation": 1, "creationTimestamp": "2026-12-01T08:00:00Z"},
        "spec": spec,
        "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "", "lastTransitionTime": "2026-12-01T08:00:01Z", "observedGeneration": 1}]}
    })
}

#[test]
fn the_test_objectives_are_valid_inference_objectives_and_the_check_has_teeth() {
    let crds = testkit::crds::load_crds(&testkit::crds::crds_dir());
    for ok in [
        objective("vip", "llama", Some(10)),
        objective("bulk", "llama", Some(-5)),
        objective("plain", "llama", None),
    ] {
        assert_eq!(
            testkit::crds::check_manifest(&ok, &crds),
            Vec::<String>::new()
        );
    }
    // The pool reference is required, and a priority is an integer.
    let mut no_pool = objective("vip", "llama", Some(1));
    no_pool["spec"].as_object_mut().unwrap().remove("poolRef");
    assert!(!testkit::crds::check_manifest(&no_pool, &crds).is_empty());
    let mut text = objective("vip", "llama", Some(1));
    text["spec"]["priority"] = json!("high");
    assert!(!testkit::crds::check_manifest(&text, &crds).is_empty());
}

/// The priorities of the objectives in the last snapshot, by name; `None` without the section.
fn objectives_in(s: &[llm_router_snapshot::Snapshot]) -> Option<Vec<(String, i32)>> {
    let list = s.last()?.objectives.as_ref()?;
    Some(list.iter().map(|o| (o.name.clone(), o.priority)).collect())
}

/// InferenceObjectives of the sidecar's pool reach every snapshot and follow the objects live:
/// an unset priority is 0, another pool's objects are ignored, a new object, a changed
/// priority and a deletion apply with the next push, and with the pool's last object deleted
/// the snapshot carries no section again (the filter's configured objectives apply).
#[tokio::test]
async fn inference_objectives_of_the_pool_reach_the_snapshot_live() {
    use sidecar_metrics::config::{ObjectWatchConfig, ObjectivesConfig};
    let api = PoolApi::new();
    api.put(OBJECTIVES, "vip", objective("vip", "llama", Some(10)));
    api.put(OBJECTIVES, "plain", objective("plain", "llama", None));
    api.put(
        OBJECTIVES,
        "theirs",
        objective("theirs", "other-pool", Some(7)),
    );
    let (api_addr, server) = api.serve().await;
    let fleet = FakeFleet::start(1, Answer::Text(vllm_text(0, 1, 0.1))).await;
    let proxy = FakeProxy::start().await;
    let mut cfg = config(proxy.addr, Discovery::Static(fleet.endpoints()), 20, 1000);
    cfg.objectives = Some(ObjectivesConfig {
        kubernetes: ObjectWatchConfig {
            namespace: Some("llm".into()),
            api: Some(stand_in_api(api_addr)),
        },
    });
    cfg.validate().unwrap();
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let want = |v: &[(&str, i32)]| -> Vec<(String, i32)> {
        v.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect()
    };
    let first = want(&[("plain", 0), ("vip", 10)]);
    proxy
        .wait_for("the pool's objectives", LIMIT, |s| {
            objectives_in(s) == Some(first.clone())
        })
        .await;
    api.wait_watches(OBJECTIVES, 1).await;
    api.put(OBJECTIVES, "bulk", objective("bulk", "llama", Some(-1)));
    api.event(
        OBJECTIVES,
        "MODIFIED",
        "vip",
        Some(objective("vip", "llama", Some(2))),
    );
    let second = want(&[("bulk", -1), ("plain", 0), ("vip", 2)]);
    proxy
        .wait_for("a new objective and a changed priority", LIMIT, |s| {
            objectives_in(s) == Some(second.clone())
        })
        .await;
    for name in ["bulk", "plain"] {
        api.event(OBJECTIVES, "DELETED", name, None);
    }
    let third = want(&[("vip", 2)]);
    proxy
        .wait_for("the deletions", LIMIT, |s| {
            objectives_in(s) == Some(third.clone())
        })
        .await;
    api.event(OBJECTIVES, "DELETED", "vip", None);
    proxy
        .wait_for(
            "no objectives section once the pool has no object",
            LIMIT,
            |s| s.last().is_some_and(|s| s.objectives.is_none()),
        )
        .await;
    running.stop().await;
    server.abort();
}
