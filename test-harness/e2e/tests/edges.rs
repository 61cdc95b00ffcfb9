//! No path around the filter, on the configurations users copy: every plain Envoy bootstrap the
//! project ships (`envoy/envoy.yaml`, the Kubernetes gateway's ConfigMap) runs for real here —
//! its routes, its HTTP connection manager's settings and its plugin configuration exactly as
//! shipped, only addresses, ports, the module path and the access log replaced
//! (`testkit::shipped::localize`) — in front of echo pods that record what reaches them. The
//! routes Istio and Envoy Gateway build from the shipped HTTPRoutes run the same way, translated
//! as their controllers translate Gateway API matches, with the shipped Wasm filter fragments and
//! the edge settings each ships (the EnvoyFilter's HCM patch; the ClientTrafficPolicy's path
//! settings).
//!
//! More than twenty variants of the API paths (merged and doubled slashes, case, percent-encoded
//! letters, dots and slashes, trailing slash, query strings, path parameters, engine endpoints,
//! spoofed routing headers, methods) are sent raw over TCP, byte for byte. Each must be either
//! routed by the filter (the pod sees the filter's `x-llm-router-cluster`) or refused by the
//! gateway (no pod sees it) — never answered by a pod unrouted; `GET /metrics` is 404.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::shipped::{
    envoy_bootstraps, example_docs_or_skip, listener_addr, localize, plugin_of, pool_clusters,
    start_shipped, wasm_configs, Doc,
};
use testkit::{EchoBackend, EnvoyProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The secret the shipped configurations read from Envoy's environment, for these runs.
const ENV_SECRET: &str = "edges-test-secret-0123456789abcdef0123456789abcdef";
const SECRET_ENV: &str = "LLM_ROUTER_SNAPSHOT_SECRET";

/// What a variant may end as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// The filter routes it: a pod receives it with the filter's cluster header.
    Routed,
    /// The gateway refuses it: no pod receives it (status 4xx).
    Refused,
    /// Either routed by the filter or refused by the gateway (normalisation decides).
    RoutedOrRefused,
    /// Answered by the gateway itself (the filter's model list): 200, no pod receives it.
    Answered,
}

struct Variant {
    method: &'static str,
    path: &'static str,
    /// `None`: no body; `Some("")`: the chat body for the shipped model.
    body: Option<&'static str>,
    headers: &'static [(&'static str, &'static str)],
    expect: Expect,
}

const CHAT: Option<&str> = Some("");

fn variants() -> Vec<Variant> {
    use Expect::*;
    let v = |method, path, body, expect| Variant {
        method,
        path,
        body,
        headers: &[],
        expect,
    };
    let spoof: &'static [(&'static str, &'static str)] = &[
        ("x-llm-router-cluster", "pool_llama"),
        ("x-gateway-destination-endpoint", "127.0.0.1:1"),
    ];
    vec![
        v("POST", "/v1/chat/completions", CHAT, Routed),
        v("POST", "/chat/completions", CHAT, Routed),
        v("POST", "/v1/chat/completions?api-version=1", CHAT, Routed),
        v("POST", "/v1/chat/completions/", CHAT, RoutedOrRefused),
        v("POST", "//v1/chat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1//chat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1/chat//completions", CHAT, RoutedOrRefused),
        v("POST", "/V1/chat/completions", CHAT, Refused),
        v("POST", "/v1/CHAT/completions", CHAT, Refused),
        v("POST", "/v1/%63hat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1/chat/%63ompletions", CHAT, RoutedOrRefused),
        v("POST", "/%761/chat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1/chat%2Fcompletions", CHAT, Refused),
        v("POST", "/v1/chat%2fcompletions", CHAT, Refused),
        v("POST", "/v1%5Cchat%5Ccompletions", CHAT, Refused),
        v("POST", "/v1/./chat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1/x/../chat/completions", CHAT, RoutedOrRefused),
        v("POST", "/v1/%2e/chat/completions", CHAT, RoutedOrRefused),
        v(
            "POST",
            "/v1/x/%2e%2e/chat/completions",
            CHAT,
            RoutedOrRefused,
        ),
        v("POST", "/v1/chat/completions;x=1", CHAT, RoutedOrRefused),
        v("POST", "/v1/chat/completions.json", CHAT, Refused),
        v("POST", "/v1/chat/completionsx", CHAT, Refused),
        v("POST", "/invocations", CHAT, Refused),
        v(
            "POST",
            "/v1/load_lora_adapter",
            Some(r#"{"lora_name":"x","lora_path":"/tmp"}"#),
            Refused,
        ),
        v("POST", "/tokenize", Some(r#"{"prompt":"hi"}"#), Refused),
        v("GET", "/metrics", None, Refused),
        v("GET", "/health", None, Refused),
        v("GET", "/v1/models", None, Answered),
        v("POST", "/v1/models", Some("{}"), Refused),
        v("GET", "/v1/chat/completions", None, Refused),
        v("POST", "/v1/chat/completions", None, Refused),
        v(
            "POST",
            "/v1/chat/completions",
            Some(r#"{"model":"no-such-model","messages":[]}"#),
            Refused,
        ),
        v("PUT", "/v1/chat/completions", CHAT, Refused),
        Variant {
            method: "GET",
            path: "/metrics",
            body: None,
            headers: spoof,
            expect: Refused,
        },
        Variant {
            method: "POST",
            path: "/tokenize",
            body: Some(r#"{"prompt":"hi"}"#),
            headers: spoof,
            expect: Refused,
        },
        Variant {
            method: "GET",
            path: "/v1/chat/completions",
            body: None,
            headers: spoof,
            expect: Refused,
        },
    ]
}

/// One request written byte for byte (no client library normalises the path), `connection:
/// close`; returns the status and the body.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
            b.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10 s"));
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Sends every variant to `envoy`'s public listener; fails on the first that reached a pod
/// without the filter's cluster header, or that ended otherwise than expected. `model` is a
/// model the shipped plugin configuration routes.
async fn check_variants(label: &str, envoy: &EnvoyProcess, pods: &[EchoBackend], model: &str) {
    let chat = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let all = variants();
    assert!(all.len() >= 20);
    for v in &all {
        let before: Vec<usize> = pods.iter().map(|p| p.requests().len()).collect();
        let before_count: u64 = pods.iter().map(EchoBackend::request_count).sum();
        let body = v.body.map(|b| if b.is_empty() { chat.as_str() } else { b });
        let (status, answer) = raw(envoy.listen_addr, v.method, v.path, v.headers, body).await;
        let reached: Vec<testkit::RecordedRequest> = pods
            .iter()
            .zip(&before)
            .flat_map(|(p, &n)| p.requests().into_iter().skip(n))
            .collect();
        let count_now: u64 = pods.iter().map(EchoBackend::request_count).sum();
        let routed = !reached.is_empty()
            && reached
                .iter()
                .all(|r| r.header("x-llm-router-cluster").is_some());
        let outcome = if count_now == before_count {
            "no pod"
        } else if routed {
            "routed"
        } else {
            "UNROUTED AT A POD"
        };
        report.push(format!(
            "{:6} {:40} -> {status} {outcome}",
            v.method, v.path
        ));
        let ok = match (v.expect, outcome) {
            (_, "UNROUTED AT A POD") => false,
            (Expect::Routed, o) => o == "routed" && status == 200,
            (Expect::Refused, o) => o == "no pod" && (400..500).contains(&status),
            (Expect::Answered, o) => o == "no pod" && status == 200,
            (Expect::RoutedOrRefused, "routed") => status == 200,
            (Expect::RoutedOrRefused, _) => (400..500).contains(&status),
        };
        if !ok {
            failures.push(format!(
                "{} {} (expected {:?}): {status} {outcome}: {}",
                v.method,
                v.path,
                v.expect,
                answer.chars().take(200).collect::<String>()
            ));
        }
        if v.method == "GET" && v.path == "/metrics" {
            assert_eq!(status, 404, "{label}: GET /metrics on the public listener");
        }
    }
    eprintln!("{label}:\n  {}", report.join("\n  "));
    assert!(
        failures.is_empty(),
        "{label}: {} of {} variants ended wrong:\n  {}\nall:\n  {}",
        failures.len(),
        all.len(),
        failures.join("\n  "),
        report.join("\n  ")
    );
}

/// The first model of the first pool a Wasm filter config's plugin configuration has.
fn model_of(config: &Value) -> Option<String> {
    let m = &plugin_of(config)["pools"][0]["models"][0];
    m.as_str()
        .or_else(|| m["name"].as_str())
        .map(str::to_string)
}

/// The first model the public filter of a bootstrap routes.
fn first_model(bootstrap: &Value) -> String {
    let mut configs = Vec::new();
    wasm_configs(bootstrap, &mut configs);
    configs
        .iter()
        .find_map(model_of)
        .expect("a pool with a model")
}

/// Echo pods for every pool cluster of a bootstrap (two per pool).
async fn pods_for(clusters: &[String]) -> (Vec<EchoBackend>, BTreeMap<String, Vec<SocketAddr>>) {
    pods_n(clusters, 2).await
}

/// `n` echo pods for every pool cluster of a bootstrap.
async fn pods_n(
    clusters: &[String],
    n: usize,
) -> (Vec<EchoBackend>, BTreeMap<String, Vec<SocketAddr>>) {
    let mut pods = Vec::new();
    let mut map = BTreeMap::new();
    for c in clusters {
        let mut addrs = Vec::new();
        for _ in 0..n {
            let p = EchoBackend::start().await.unwrap();
            addrs.push(p.addr());
            pods.push(p);
        }
        map.insert(c.clone(), addrs);
    }
    (pods, map)
}

/// Starts a shipped bootstrap (from `localize`) with the secret in Envoy's environment.
async fn run_shipped(name: String, bootstrap: Value) -> EnvoyProcess {
    tokio::task::spawn_blocking(move || {
        start_shipped(&name, &bootstrap, &[(SECRET_ENV, ENV_SECRET)], 2)
            .map_err(|e| format!("{name}: Envoy did not start: {e}"))
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A push signed with the secret from Envoy's environment is accepted on the internal listener
/// (the shipped configuration reads its secret there), one signed with another is refused.
async fn env_secret_signs_pushes(label: &str, envoy: &EnvoyProcess) {
    let internal = listener_addr(envoy, "llm_router_internal").expect("internal listener");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let snap = llm_router_snapshot::Snapshot {
        rewrites: None,
        objectives: None,
        generation: now,
        created_ms: now,
        pools: vec![],
    };
    let bytes = snap.encode().unwrap();
    for (secret, want) in [
        ("another-secret-0123456789abcdef0123456789", 403),
        (ENV_SECRET, 200),
    ] {
        let sig = llm_router_snapshot::sign(secret.as_bytes(), &bytes);
        let r = testkit::post_bytes(
            internal,
            "/__llm_router/snapshot",
            &[(llm_router_snapshot::SIGNATURE_HEADER, &sig)],
            bytes.clone(),
        )
        .await
        .unwrap();
        assert_eq!(
            r.status,
            want,
            "{label}: push signed with {secret}: {}",
            r.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_plain_envoy_configs_leave_no_path_around_the_filter() {
    if !testkit::stack_ready(
        "shipped_plain_envoy_configs_leave_no_path_around_the_filter",
        [],
    ) {
        return;
    }
    let wasm = testkit::filter_wasm().unwrap();
    let Some(docs) =
        example_docs_or_skip("shipped_plain_envoy_configs_leave_no_path_around_the_filter")
    else {
        return;
    };
    let bootstraps = envoy_bootstraps(&docs);
    assert!(bootstraps.len() >= 2, "{}", bootstraps.len());
    for (origin, bootstrap) in bootstraps {
        let label = origin.replace(['/', '#', ' ', '.'], "_");
        let clusters = pool_clusters(&bootstrap);
        let (pods, map) = pods_for(&clusters).await;
        let model = first_model(&bootstrap);
        let dir = testkit::testlog_dir(&format!("edges-{label}")).unwrap();
        let local = localize(bootstrap, &wasm, &map, &dir.join("access.log"));
        let envoy = run_shipped(format!("edges-{label}"), local).await;
        env_secret_signs_pushes(&origin, &envoy).await;
        check_variants(&origin, &envoy, &pods, &model).await;
    }
}

/// Gateway API `HTTPRoute` rules as Istio and Envoy Gateway turn them into Envoy routes: each
/// match becomes a route (path `Exact` → `path`, `PathPrefix` → `path_separated_prefix` or `/`
/// → `prefix`, headers `Exact` → exact string matches), in order, to the rule's backend; a
/// request no rule matches gets the controller's 404.
fn httproute_to_envoy_routes(route: &Value, cluster_of: &dyn Fn(&str) -> String) -> Vec<Value> {
    let mut out = Vec::new();
    for rule in route["spec"]["rules"].as_array().into_iter().flatten() {
        let backend = rule["backendRefs"][0]["name"].as_str().unwrap();
        let matches = rule["matches"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![json!({})]);
        for m in matches {
            let mut em = json!({});
            let value = m["path"]["value"].as_str().unwrap_or("/");
            match m["path"]["type"].as_str().unwrap_or("PathPrefix") {
                "Exact" => em["path"] = json!(value),
                "PathPrefix" if value == "/" => em["prefix"] = json!("/"),
                "PathPrefix" => em["path_separated_prefix"] = json!(value.trim_end_matches('/')),
                other => panic!("path match type {other} not translated here"),
            }
            let headers: Vec<Value> = m["headers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| json!({"name": h["name"], "string_match": {"exact": h["value"]}}))
                .collect();
            if !headers.is_empty() {
                em["headers"] = json!(headers);
            }
            out.push(
                json!({"match": em, "route": {"cluster": cluster_of(backend), "timeout": "0s"}}),
            );
        }
    }
    out.push(json!({"match": {"prefix": "/"}, "direct_response": {"status": 404}}));
    out
}

/// The kind of a document.
fn of_kind<'a>(docs: &'a [Doc], folder: &str, kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d.origin.starts_with(folder) && d.value["kind"] == kind)
        .map(|d| &d.value)
        .collect()
}

/// Istio's and Envoy Gateway's gateways, built from what the project ships for each: the
/// HTTPRoute's rules (translated as the controllers do), the public Wasm filter fragment and
/// the edge settings of the HTTP connection manager, in front of echo pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_gateway_api_routes_leave_no_path_around_the_filter() {
    if !testkit::stack_ready(
        "shipped_gateway_api_routes_leave_no_path_around_the_filter",
        [],
    ) {
        return;
    }
    let wasm = testkit::filter_wasm().unwrap();
    let Some(docs) =
        example_docs_or_skip("shipped_gateway_api_routes_leave_no_path_around_the_filter")
    else {
        return;
    };
    for folder in [
        "envoy/deploy/overlays/istio",
        "envoy/deploy/overlays/envoy-gateway",
    ] {
        let routes = of_kind(&docs, folder, "HTTPRoute");
        assert_eq!(routes.len(), 1, "{folder}: one HTTPRoute");
        let cluster_of = |svc: &str| format!("outbound|8000||{svc}.llm.svc.cluster.local");
        let envoy_routes = httproute_to_envoy_routes(routes[0], &cluster_of);
        // The public filter: the one Wasm config of the folder without the snapshot endpoints.
        let mut configs = Vec::new();
        for d in docs.iter().filter(|d| d.origin.starts_with(folder)) {
            wasm_configs(&d.value, &mut configs);
        }
        let public = configs
            .iter()
            .find(|c| plugin_of(c)["snapshot"]["endpoints"] != json!(true))
            .unwrap_or_else(|| panic!("{folder}: a public filter"))
            .clone();
        let mut hcm = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "gateway",
            "route_config": {"name": "gateway", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": envoy_routes}]},
            "http_filters": [
                {"name": "llm-router", "typed_config": {"@type": testkit::shipped::WASM_TYPE, "config": public}},
                {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
            ],
        });
        if folder == "envoy/deploy/overlays/istio" {
            // The EnvoyFilter's MERGE into the gateway's HTTP connection managers.
            let ef = of_kind(&docs, folder, "EnvoyFilter")[0];
            let patch = ef["spec"]["configPatches"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["applyTo"] == "NETWORK_FILTER")
                .expect("istio: an HCM patch with the edge settings");
            for (k, v) in patch["patch"]["value"]["typed_config"].as_object().unwrap() {
                if k != "@type" {
                    hcm[k] = v.clone();
                }
            }
        } else {
            // Envoy Gateway normalises paths by default; its ClientTrafficPolicy decides slashes.
            let ctp = of_kind(&docs, folder, "ClientTrafficPolicy");
            let path = &ctp.first().expect("envoy-gateway: a ClientTrafficPolicy")["spec"]["path"];
            hcm["normalize_path"] = json!(true);
            hcm["merge_slashes"] = json!(path["disableMergeSlashes"] != json!(true));
            hcm["path_with_escaped_slashes_action"] = match path["escapedSlashesAction"].as_str() {
                Some("RejectRequest") => json!("REJECT_REQUEST"),
                Some("UnescapeAndRedirect") | None => json!("UNESCAPE_AND_REDIRECT"),
                Some("UnescapeAndForward") => json!("UNESCAPE_AND_FORWARD"),
                Some(other) => json!(other.to_uppercase()),
            };
        }
        let services: Vec<String> = routes[0]["spec"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["backendRefs"][0]["name"].as_str().map(&cluster_of))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let (pods, map) = pods_for(&services).await;
        let clusters: Vec<Value> = services
            .iter()
            .map(|c| json!({"name": c, "connect_timeout": "1s",
                "load_balancing_policy": testkit::override_host_policy("x-gateway-destination-endpoint"),
                "load_assignment": {"cluster_name": c, "endpoints": [{"lb_endpoints": []}]}}))
            .collect();
        let bootstrap = json!({
            "static_resources": {
                "listeners": [{"name": "llm_router", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
                    "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
                "clusters": clusters,
            },
        });
        let dir = testkit::testlog_dir(&format!("edges-{}", folder.replace('/', "-"))).unwrap();
        let local = localize(bootstrap, &wasm, &map, &dir.join("access.log"));
        let name = format!("edges-{}", folder.replace('/', "-"));
        let envoy = run_shipped(name, local).await;
        let model = model_of(&public).expect("a pool with a model");
        check_variants(folder, &envoy, &pods, &model).await;
    }
}

/// One broken pod among four, on the shipped `envoy/envoy.yaml`: it reports an empty engine
/// (waiting 0, KV 0, the best state in the pool) and answers every request at once with a 500.
/// The filter ranks it first on what it reports. The shipped clusters' outlier detection does
/// eject it (`health_flags: failed_outlier_check` in `/clusters`), but Envoy 1.40's
/// `override_host` policy still sends each request to the pod the filter names: it is the
/// filter's own error run (`inflight::EJECT_AFTER_ERRORS`) that puts the pod behind the others,
/// so it serves no more than 1.5× its fair share of a mixed run (before that: all 120).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_pod_that_reports_itself_idle_cannot_draw_the_pool() {
    if !testkit::stack_ready(
        "a_broken_pod_that_reports_itself_idle_cannot_draw_the_pool",
        [],
    ) {
        return;
    }
    let wasm = testkit::filter_wasm().unwrap();
    let Some(docs) =
        example_docs_or_skip("a_broken_pod_that_reports_itself_idle_cannot_draw_the_pool")
    else {
        return;
    };
    let (_, bootstrap) = envoy_bootstraps(&docs)
        .into_iter()
        .find(|(o, _)| o.starts_with("envoy/envoy.yaml"))
        .unwrap();
    let clusters = pool_clusters(&bootstrap);
    let (pods, map) = pods_n(&clusters, 4).await;
    let model = first_model(&bootstrap);
    let mut configs = Vec::new();
    wasm_configs(&bootstrap, &mut configs);
    let plugin = plugin_of(&configs[0]);
    let pool = &plugin["pools"][0];
    let (pool_name, cluster) = (
        pool["name"].as_str().unwrap().to_string(),
        pool["cluster"].as_str().unwrap().to_string(),
    );
    let addrs = map[&cluster].clone();
    let liar = addrs[0];
    let liar_pod = pods.iter().find(|p| p.addr() == liar).unwrap();
    liar_pod.set_status(500);
    let dir = testkit::testlog_dir("edges-broken-pod").unwrap();
    let local = localize(bootstrap, &wasm, &map, &dir.join("access.log"));
    let envoy = run_shipped("edges-broken-pod".into(), local).await;
    let internal = listener_addr(&envoy, "llm_router_internal").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let report = |a: &SocketAddr, waiting: u32, kv: f32| llm_router_snapshot::Pod {
        address: a.to_string(),
        engine: llm_router_snapshot::Engine::Vllm,
        health: llm_router_snapshot::Health::Ok,
        scraped_at_ms: now,
        waiting,
        running: if waiting == 0 { 0 } else { 4 },
        kv_usage: Some(kv),
        block_size: 16,
        num_blocks: 2000,
        ..llm_router_snapshot::Pod::default()
    };
    let snap = llm_router_snapshot::Snapshot {
        rewrites: None,
        objectives: None,
        generation: now,
        created_ms: now,
        pools: vec![llm_router_snapshot::Pool {
            name: pool_name,
            cluster: cluster.clone(),
            models: vec![model.clone()],
            pods: addrs
                .iter()
                .map(|a| {
                    if *a == liar {
                        report(a, 0, 0.0)
                    } else {
                        report(a, 3, 0.5)
                    }
                })
                .collect(),
            peer_contexts: Vec::new(),
        }],
    };
    let bytes = snap.encode().unwrap();
    let sig = llm_router_snapshot::sign(ENV_SECRET.as_bytes(), &bytes);
    let r = testkit::post_bytes(
        internal,
        "/__llm_router/snapshot",
        &[(llm_router_snapshot::SIGNATURE_HEADER, &sig)],
        bytes,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let n = 120;
    for i in 0..n {
        // Mixed: short and long prompts, streamed and not.
        let text = "word ".repeat(1 + (i * 37) % 400);
        let body = json!({"model": model, "stream": i % 3 == 0,
            "messages": [{"role": "user", "content": format!("{i} {text}")}]});
        let _ = testkit::post_json(envoy.listen_addr, "/v1/chat/completions", &[], &body).await;
    }
    let served: Vec<u64> = addrs
        .iter()
        .map(|a| {
            pods.iter()
                .find(|p| p.addr() == *a)
                .unwrap()
                .request_count()
        })
        .collect();
    let total: u64 = served.iter().sum();
    let share = served[0] as f64 / total as f64;
    let fair = 1.0 / addrs.len() as f64;
    eprintln!("requests per pod (broken first): {served:?}, share {share:.3}");
    eprintln!(
        "DEBUG {:?}",
        envoy.admin_get("/stats?filter=outlier|ejections|health")
    );
    assert!(total >= n as u64, "{served:?}");
    assert!(
        share <= 1.5 * fair,
        "the broken pod drew {share:.2} of the pool's requests (fair {fair:.2}): {served:?}"
    );
}
