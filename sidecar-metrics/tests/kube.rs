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
use sidecar_metrics::config::{Discovery, KubeApi, KubeConfig, PortRef};
use sidecar_metrics::sidecar;
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(10);

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
        api: Some(KubeApi {
            server: format!("http://{api_addr}"),
            token: Some("test-token".into()),
            token_file: None,
            ca_file: None,
        }),
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
