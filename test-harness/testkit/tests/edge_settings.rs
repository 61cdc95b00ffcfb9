//! The gateway's edges, read off every configuration the project ships under `envoy/` (plain
//! Envoy, Kubernetes, Istio, Envoy Gateway): only the API paths the filter routes can reach a
//! pool; the public connection managers normalise paths and bound what a client may hold; every
//! Envoy has an overload manager, every Wasm filter a failure policy, every pool outlier
//! detection; the snapshot budgets agree from sidecar to listener; the secret comes from a
//! Kubernetes Secret, never from a file; every probe targets a port the kubelet can reach; and
//! NetworkPolicies keep clients off the model servers and off the pod's private ports.
//! `test-harness/e2e/tests/edges.rs` sends the requests; this file checks the settings behind
//! them, on every file, so a new or edited one cannot drop one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use llm_router_core::request::{ApiKind, API_PATH_REGEX};
use serde_json::{json, Value};
use testkit::shipped::{
    documents, endpoints_on, envoy_bootstraps, example_docs_or_skip, plugin_of, pool_clusters,
    wasm_configs, Doc,
};

const CLUSTER_HEADER: &str = "x-llm-router-cluster";
const SECRET_ENV_KEY: &str = "secret_env";

fn of_kind<'a>(docs: &'a [Doc], kind: &str) -> Vec<&'a Doc> {
    docs.iter().filter(|d| d.value["kind"] == kind).collect()
}

fn is_loopback(address: &str) -> bool {
    address.starts_with("127.") || address == "::1" || address == "localhost"
}

fn listener_address(l: &Value) -> (&str, u64) {
    let s = &l["address"]["socket_address"];
    (
        s["address"].as_str().unwrap_or_default(),
        s["port_value"].as_u64().unwrap_or_default(),
    )
}

/// The HTTP connection managers' typed configs of a listener.
fn hcms(l: &Value) -> Vec<&Value> {
    l["filter_chains"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["filters"].as_array().into_iter().flatten())
        .map(|f| &f["typed_config"])
        .filter(|t| t.get("route_config").is_some())
        .collect()
}

fn routes(hcm: &Value) -> Vec<&Value> {
    hcm["route_config"]["virtual_hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| v["routes"].as_array().into_iter().flatten())
        .collect()
}

fn has_filter(hcm: &Value) -> bool {
    let mut configs = Vec::new();
    wasm_configs(hcm, &mut configs);
    !configs.is_empty()
}

/// Every plain Envoy bootstrap's public listeners (bound beyond loopback, with the filter).
fn public_listeners(bootstrap: &Value) -> Vec<&Value> {
    bootstrap["static_resources"]["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| !is_loopback(listener_address(l).0))
        .filter(|l| hcms(l).iter().any(|h| has_filter(h)))
        .collect()
}

#[test]
fn only_the_api_paths_the_filter_routed_reach_a_pool() {
    // The regex the routes use accepts exactly what the filter routes, on these samples.
    for p in [
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/completions",
        "/v1/embeddings",
        "/embeddings",
        "/v1/responses",
        "/responses",
        "/v1/messages",
        "/v1/chat/completions/",
    ] {
        assert!(ApiKind::from_path(p).is_some(), "{p}");
    }
    assert!(API_PATH_REGEX.contains("chat/completions") && API_PATH_REGEX.contains("messages"));
    let Some(docs) = example_docs_or_skip("only_the_api_paths_the_filter_routed_reach_a_pool")
    else {
        return;
    };
    let bootstraps = envoy_bootstraps(&docs);
    assert!(bootstraps.len() >= 2);
    for (origin, bootstrap) in &bootstraps {
        let pools: BTreeSet<String> = pool_clusters(bootstrap).into_iter().collect();
        assert!(!pools.is_empty(), "{origin}");
        let public = public_listeners(bootstrap);
        assert_eq!(public.len(), 1, "{origin}: one public listener");
        for l in bootstrap["static_resources"]["listeners"]
            .as_array()
            .unwrap()
        {
            let (address, port) = listener_address(l);
            for hcm in hcms(l) {
                let rs = routes(hcm);
                for r in &rs {
                    let to_pool = r["route"]["cluster_header"].is_string()
                        || r["route"]["cluster"]
                            .as_str()
                            .is_some_and(|c| pools.contains(c));
                    if to_pool {
                        assert_eq!(
                            r["match"]["safe_regex"]["regex"],
                            json!(API_PATH_REGEX),
                            "{origin} :{port}: a route to a pool must match only the API paths: {r}"
                        );
                        let headers = r["match"]["headers"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        assert!(
                            headers.iter().any(|h| h["name"] == CLUSTER_HEADER
                                && h["present_match"] == json!(true)),
                            "{origin} :{port}: a route to a pool must need the filter's {CLUSTER_HEADER}: {r}"
                        );
                    } else if let Some(cluster) = r["route"]["cluster"].as_str() {
                        // Routes to local clusters (the ops listener): exact GET paths only.
                        assert!(
                            r["match"]["path"].is_string(),
                            "{origin} :{port}: {cluster} reached by a non-exact path: {r}"
                        );
                        let method = &r["match"]["headers"][0];
                        assert_eq!(method["name"], ":method", "{origin}: {r}");
                        assert_eq!(method["string_match"]["exact"], "GET", "{origin}: {r}");
                    }
                }
                if !is_loopback(address) {
                    let last = rs.last().expect("routes");
                    assert_eq!(
                        last["direct_response"]["status"],
                        json!(404),
                        "{origin} :{port}: the last route must be the gateway's 404, not a catch-all: {last}"
                    );
                    assert_eq!(last["match"]["prefix"], "/", "{origin}: {last}");
                }
            }
        }
    }
    // Gateway API routes (Istio, Envoy Gateway): every match names an API path exactly and needs
    // the filter's header; no rule without them (a catch-all).
    let routes = of_kind(&docs, "HTTPRoute");
    assert_eq!(routes.len(), 2, "Istio's and Envoy Gateway's HTTPRoute");
    for d in routes {
        for rule in d.value["spec"]["rules"].as_array().unwrap() {
            let matches = rule["matches"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: a rule without matches is a catch-all", d.origin));
            assert!(!matches.is_empty(), "{}", d.origin);
            for m in matches {
                assert_eq!(m["path"]["type"], "Exact", "{}: {m}", d.origin);
                let path = m["path"]["value"].as_str().unwrap();
                assert!(
                    ApiKind::from_path(path).is_some(),
                    "{}: {path} is not a path the filter routes",
                    d.origin
                );
                assert!(
                    m["headers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|h| h["name"] == CLUSTER_HEADER),
                    "{}: a match without the filter's {CLUSTER_HEADER}: {m}",
                    d.origin
                );
            }
        }
    }
    // And the filter itself refuses unknown paths wherever it is the last word.
    for d in &docs {
        for v in with_embedded(d) {
            let mut configs = Vec::new();
            wasm_configs(&v, &mut configs);
            for c in configs.iter().filter(|c| !endpoints_on(c)) {
                assert_eq!(
                    plugin_of(c)["unknown_paths"],
                    json!("reject"),
                    "{}: the public filter must refuse paths it does not route",
                    d.origin
                );
            }
        }
    }
}

/// The settings of ../envoy.yaml's public connection manager that every public HCM must have.
fn assert_edge_hcm(origin: &str, hcm: &Value) {
    for (key, want) in [
        ("normalize_path", json!(true)),
        ("merge_slashes", json!(true)),
        ("path_with_escaped_slashes_action", json!("REJECT_REQUEST")),
    ] {
        assert_eq!(hcm[key], want, "{origin}: {key}");
    }
    for key in [
        "request_headers_timeout",
        "request_timeout",
        "stream_idle_timeout",
    ] {
        assert!(hcm[key].is_string(), "{origin}: {key} not set");
    }
    assert_above_flow_ttl(origin, &hcm["request_timeout"]);
    assert!(
        hcm["http2_protocol_options"]["max_concurrent_streams"]
            .as_u64()
            .is_some_and(|n| n <= 1000),
        "{origin}: http2 max_concurrent_streams"
    );
    assert_eq!(
        hcm["common_http_protocol_options"]["headers_with_underscores_action"], "REJECT_REQUEST",
        "{origin}"
    );
}

/// The longest time to live of a flow-control band (the filter's default and the shipped
/// examples' longest, 60 s): a held request must meet the filter's 429 with `retry-after`, not
/// Envoy's 408, whose timer (`request_timeout`) runs until the request is sent upstream.
const LONGEST_FLOW_TTL_S: u64 = 60;

fn assert_above_flow_ttl(origin: &str, timeout: &Value) {
    let secs = timeout
        .as_str()
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{origin}: request timeout {timeout} is not whole seconds"));
    assert!(
        secs > LONGEST_FLOW_TTL_S,
        "{origin}: the request timeout ({secs} s) must exceed flow control's longest time to live ({LONGEST_FLOW_TTL_S} s)"
    );
}

/// The filter's body limit from its plugin configuration (default 1,000,000).
fn max_body_bytes(config: &Value) -> u64 {
    plugin_of(config)["max_body_bytes"]
        .as_u64()
        .unwrap_or(1_000_000)
}

#[test]
fn public_connection_managers_have_the_edge_settings() {
    let Some(docs) = example_docs_or_skip("public_connection_managers_have_the_edge_settings")
    else {
        return;
    };
    for (origin, bootstrap) in envoy_bootstraps(&docs) {
        for l in public_listeners(&bootstrap) {
            let hcm = hcms(l)[0];
            assert_edge_hcm(&origin, hcm);
            assert_eq!(hcm["use_remote_address"], json!(true), "{origin}");
            // Envoy buffers a whole body for the filter: at least max_body_bytes.
            let mut configs = Vec::new();
            wasm_configs(hcm, &mut configs);
            let limit = l["per_connection_buffer_limit_bytes"].as_u64().unwrap_or(0);
            assert!(
                limit >= max_body_bytes(&configs[0]),
                "{origin}: per_connection_buffer_limit_bytes {limit} below the filter's max_body_bytes"
            );
        }
    }
    let ef = &of_kind(&docs, "EnvoyFilter")[0].value;
    let patches = ef["spec"]["configPatches"].as_array().unwrap();
    let hcm_patch = patches
        .iter()
        .find(|p| p["applyTo"] == "NETWORK_FILTER" && p["patch"]["operation"] == "MERGE")
        .expect("istio: a MERGE into the gateway's HCMs");
    assert_edge_hcm(
        "istio EnvoyFilter",
        &hcm_patch["patch"]["value"]["typed_config"],
    );
    let buffer = patches
        .iter()
        .find(|p| p["applyTo"] == "LISTENER" && p["patch"]["operation"] == "MERGE")
        .expect("istio: the gateway listener's buffer");
    assert!(
        buffer["patch"]["value"]["per_connection_buffer_limit_bytes"].as_u64() >= Some(1_000_000)
    );
    let ctp = &of_kind(&docs, "ClientTrafficPolicy")
        .first()
        .expect("envoy-gateway: a ClientTrafficPolicy")
        .value["spec"];
    assert_eq!(ctp["targetRefs"][0]["kind"], "Gateway");
    assert_eq!(ctp["path"]["escapedSlashesAction"], "RejectRequest");
    assert_ne!(ctp["path"]["disableMergeSlashes"], json!(true));
    assert_eq!(ctp["headers"]["withUnderscoresAction"], "RejectRequest");
    for key in ["requestHeadersReceivedTimeout", "requestReceivedTimeout"] {
        assert!(
            ctp["timeout"]["http"][key].is_string(),
            "envoy-gateway: {key}"
        );
    }
    assert_above_flow_ttl(
        "envoy-gateway",
        &ctp["timeout"]["http"]["requestReceivedTimeout"],
    );
    assert!(ctp["connection"]["connectionLimit"]["value"].is_u64());
    assert!(ctp["connection"]["bufferLimit"].is_string());
    assert!(ctp["http2"]["maxConcurrentStreams"].is_u64());
}

fn assert_overload_manager(origin: &str, om: &Value) {
    let monitors: Vec<&str> = om["resource_monitors"]
        .as_array()
        .unwrap_or_else(|| panic!("{origin}: no overload manager"))
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    for m in [
        "envoy.resource_monitors.fixed_heap",
        "envoy.resource_monitors.global_downstream_max_connections",
    ] {
        assert!(
            monitors.contains(&m),
            "{origin}: {m} missing from {monitors:?}"
        );
    }
    let actions: Vec<&str> = om["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(
        actions.contains(&"envoy.overload_actions.stop_accepting_requests"),
        "{origin}: {actions:?}"
    );
    // Resetting the streams that buffer the most reaches only streams whose buffers are
    // tracked (2^N bytes and more): the request bodies the filter holds (up to its default
    // max_body_bytes, 1,000,000) must be among them.
    if actions.contains(&"envoy.overload_actions.reset_high_memory_stream") {
        let n = om["buffer_factory_config"]["minimum_account_to_track_power_of_two"]
            .as_u64()
            .unwrap_or_else(|| panic!("{origin}: reset_high_memory_stream without tracking"));
        assert!(
            1u64 << n <= 1_000_000 / 4,
            "{origin}: tracking starts at 2^{n} bytes, above the bodies the filter holds"
        );
    }
}

#[test]
fn every_shipped_envoy_has_an_overload_manager_and_reloads_a_failed_vm() {
    let Some(docs) =
        example_docs_or_skip("every_shipped_envoy_has_an_overload_manager_and_reloads_a_failed_vm")
    else {
        return;
    };
    for (origin, bootstrap) in envoy_bootstraps(&docs) {
        assert_overload_manager(&origin, &bootstrap["overload_manager"]);
    }
    let ef = &of_kind(&docs, "EnvoyFilter")[0].value;
    let boot = ef["spec"]["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["applyTo"] == "BOOTSTRAP")
        .expect("istio: a BOOTSTRAP patch");
    assert_overload_manager("istio", &boot["patch"]["value"]["overload_manager"]);
    let proxy = &of_kind(&docs, "EnvoyProxy")
        .first()
        .expect("envoy-gateway: an EnvoyProxy")
        .value;
    let merged = documents(
        proxy["spec"]["bootstrap"]["value"].as_str().unwrap(),
        "EnvoyProxy",
    );
    assert_overload_manager("envoy-gateway", &merged[0]["overload_manager"]);
    let gateway = docs
        .iter()
        .find(|d| {
            d.origin.starts_with("envoy/deploy/overlays/envoy-gateway")
                && d.value["kind"] == "Gateway"
        })
        .unwrap();
    assert_eq!(
        gateway.value["spec"]["infrastructure"]["parametersRef"]["name"], proxy["metadata"]["name"],
        "the Envoy Gateway Gateway must use the EnvoyProxy"
    );
    // Every copy of the filter: a trapped VM is reloaded, not left answering 503.
    let mut n = 0;
    for d in &docs {
        for v in with_embedded(d) {
            let mut configs = Vec::new();
            wasm_configs(&v, &mut configs);
            for c in configs {
                n += 1;
                assert_eq!(c["failure_policy"], "FAIL_RELOAD", "{}", d.origin);
            }
        }
    }
    assert!(n >= 8, "{n} filter copies");
}

#[test]
fn pools_have_outlier_detection() {
    let Some(docs) = example_docs_or_skip("pools_have_outlier_detection") else {
        return;
    };
    for (origin, bootstrap) in envoy_bootstraps(&docs) {
        for c in bootstrap["static_resources"]["clusters"]
            .as_array()
            .unwrap()
        {
            if pool_clusters(&bootstrap).contains(&c["name"].as_str().unwrap().to_string()) {
                let od = &c["outlier_detection"];
                assert!(od["consecutive_5xx"].is_u64(), "{origin}: {}", c["name"]);
                assert!(
                    od["max_ejection_percent"].as_u64().is_some_and(|p| p <= 50),
                    "{origin}: a pool must keep half its pods: {}",
                    c["name"]
                );
            }
        }
    }
    // The pools' Services under Istio (selecting the pods labelled `llm-router-pool`).
    let services: BTreeSet<String> = of_kind(&docs, "Service")
        .iter()
        .filter(|d| d.origin.starts_with("envoy/deploy/overlays/istio#"))
        .filter(|d| d.value["spec"]["selector"]["llm-router-pool"].is_string())
        .map(|d| {
            format!(
                "{}.{}.svc.cluster.local",
                d.value["metadata"]["name"].as_str().unwrap(),
                d.value["metadata"]["namespace"].as_str().unwrap()
            )
        })
        .collect();
    assert!(!services.is_empty(), "istio: the pool's Service");
    let with_od: BTreeSet<String> = of_kind(&docs, "DestinationRule")
        .iter()
        .filter(|d| d.value["spec"]["trafficPolicy"]["outlierDetection"].is_object())
        .map(|d| d.value["spec"]["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        services, with_od,
        "istio: a DestinationRule with outlierDetection per pool"
    );
    let btp = &of_kind(&docs, "BackendTrafficPolicy")[0].value;
    assert!(btp["spec"]["healthCheck"]["passive"]["consecutive5XxErrors"].is_u64());
}

/// The internal listeners' buffer, the filter's snapshot.max_bytes there and the sidecar's
/// budget are one number: a snapshot the sidecar builds is never refused with 413.
#[test]
fn snapshot_budgets_agree_from_sidecar_to_listener() {
    let Some(docs) = example_docs_or_skip("snapshot_budgets_agree_from_sidecar_to_listener") else {
        return;
    };
    let mut limits = BTreeSet::new();
    for d in &docs {
        for v in with_embedded(d) {
            let mut found = Vec::new();
            testkit::shipped::listeners(&v, &mut found);
            for l in found {
                let mut configs = Vec::new();
                wasm_configs(&l, &mut configs);
                for c in configs.iter().filter(|c| endpoints_on(c)) {
                    let buffer = l["per_connection_buffer_limit_bytes"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("{}: internal listener without a buffer limit (Envoy's 1 MiB default)", d.origin));
                    let max = plugin_of(c)["snapshot"]["max_bytes"]
                        .as_u64()
                        .unwrap_or(4 * 1024 * 1024);
                    assert_eq!(
                        buffer, max,
                        "{}: listener buffer vs snapshot.max_bytes",
                        d.origin
                    );
                    limits.insert(buffer);
                }
            }
        }
    }
    assert_eq!(limits.len(), 1, "one budget everywhere: {limits:?}");
    assert_eq!(
        limits.first().copied(),
        Some(u64::from(testkit::INTERNAL_BUFFER_LIMIT_BYTES)),
        "the tests' internal listener buffers what the shipped ones do"
    );
}

/// The env var names the filter copies read their secret from, and the names each vm_config
/// passes into the VM.
#[test]
fn the_secret_comes_from_a_kubernetes_secret_never_a_file() {
    let Some(docs) = example_docs_or_skip("the_secret_comes_from_a_kubernetes_secret_never_a_file")
    else {
        return;
    };
    let mut env_names = BTreeSet::new();
    for d in &docs {
        assert_ne!(
            d.value["kind"], "Secret",
            "{}: a shipped Secret's value is known to every reader; document how to make one",
            d.origin
        );
        for v in with_embedded(d) {
            let mut configs = Vec::new();
            wasm_configs(&v, &mut configs);
            for c in configs {
                let plugin = plugin_of(&c);
                assert!(
                    plugin["snapshot"].get("secret").is_none(),
                    "{}: a literal secret in a configuration file",
                    d.origin
                );
                let keys: Vec<&str> = c["vm_config"]["environment_variables"]["host_env_keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                if endpoints_on(&c) {
                    let name = plugin["snapshot"][SECRET_ENV_KEY]
                        .as_str()
                        .unwrap_or_else(|| {
                            panic!("{}: endpoints without snapshot.secret_env", d.origin)
                        });
                    assert!(
                        keys.contains(&name),
                        "{}: {name} not passed into the VM",
                        d.origin
                    );
                    env_names.insert(name.to_string());
                }
            }
        }
    }
    assert_eq!(env_names.len(), 1, "{env_names:?}");
    let name = env_names.first().unwrap();
    // Every container that runs Envoy with the filter gets it from a secretKeyRef.
    // (Istio's: in the Deployment patch of the ConfigMap its Gateway names.)
    let mut filled = 0;
    for d in &docs {
        for v in with_embedded(d) {
            for c in containers(&v) {
                for e in c["env"].as_array().into_iter().flatten() {
                    if e["name"] == json!(name) {
                        assert!(
                            e["valueFrom"]["secretKeyRef"]["name"].is_string(),
                            "{}: {name} must come from a Secret: {e}",
                            d.origin
                        );
                        assert!(e.get("value").is_none(), "{}: a literal {name}", d.origin);
                        filled += 1;
                    }
                }
            }
        }
    }
    assert!(
        filled >= 3,
        "plain Kubernetes, the Istio patch and the EnvoyProxy fill {name}: {filled}"
    );
}

/// Containers of a Deployment, a strategic patch of one, or an EnvoyProxy's envoy container.
fn containers(v: &Value) -> Vec<&Value> {
    let mut out: Vec<&Value> = v["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let ep = &v["spec"]["provider"]["kubernetes"]["envoyDeployment"]["container"];
    if ep.is_object() {
        out.push(ep);
    }
    out
}

/// A document and every document embedded in its `data` (a ConfigMap's Envoy bootstrap or
/// sidecar configuration).
fn with_embedded(d: &Doc) -> Vec<Value> {
    let mut values = vec![d.value.clone()];
    for (_, text) in d.value["data"].as_object().into_iter().flatten() {
        values.extend(documents(text.as_str().unwrap_or_default(), &d.origin));
    }
    values
}

/// The shipped ConfigMaps by name.
fn configmaps(docs: &[Doc]) -> BTreeMap<String, &Value> {
    of_kind(docs, "ConfigMap")
        .iter()
        .map(|d| {
            (
                d.value["metadata"]["name"].as_str().unwrap().to_string(),
                &d.value,
            )
        })
        .collect()
}

/// The sockets the processes of a Deployment's pod bind, from the configurations its containers
/// mount: Envoy bootstraps (listeners and the admin API) and sidecar configurations (`listen`).
fn pod_sockets(
    deployment: &Value,
    configmaps: &BTreeMap<String, &Value>,
) -> Vec<(String, u64, String)> {
    let mut out = Vec::new();
    let spec = &deployment["spec"]["template"]["spec"];
    for vol in spec["volumes"].as_array().into_iter().flatten() {
        let Some(cm) = vol["configMap"]["name"].as_str() else {
            continue;
        };
        let Some(cm) = configmaps.get(cm) else {
            continue;
        };
        for (key, text) in cm["data"].as_object().into_iter().flatten() {
            for doc in documents(text.as_str().unwrap_or_default(), key) {
                if doc.get("static_resources").is_some() {
                    let mut all = vec![doc["admin"].clone()];
                    all.extend(
                        doc["static_resources"]["listeners"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default(),
                    );
                    for l in all {
                        let (a, p) = listener_address(&l);
                        let name = l["name"].as_str().unwrap_or("admin").to_string();
                        out.push((a.to_string(), p, name));
                    }
                }
                if let Some(listen) = doc.get("listen").and_then(Value::as_str) {
                    let (a, p) = listen.rsplit_once(':').unwrap();
                    out.push((a.to_string(), p.parse().unwrap(), "sidecar".into()));
                }
            }
        }
    }
    out
}

fn probe_port(container: &Value, probe: &Value) -> Option<u64> {
    let port = &probe
        .get("httpGet")
        .or_else(|| probe.get("tcpSocket"))
        .or_else(|| probe.get("grpc"))?["port"];
    if let Some(n) = port.as_u64() {
        return Some(n);
    }
    let name = port.as_str()?;
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .or_else(|| panic!("probe port {name} names no port of its container"))
}

/// Every probe of every shipped Deployment targets a port some process of the pod binds beyond
/// loopback: the kubelet probes the pod IP, so a probe of a 127.0.0.1 port never succeeds and
/// the pod never becomes Ready.
#[test]
fn every_probe_targets_a_port_the_kubelet_can_reach() {
    let Some(docs) = example_docs_or_skip("every_probe_targets_a_port_the_kubelet_can_reach")
    else {
        return;
    };
    let configmaps = configmaps(&docs);
    let mut probes = 0;
    for d in of_kind(&docs, "Deployment") {
        let sockets = pod_sockets(&d.value, &configmaps);
        for c in containers(&d.value) {
            for kind in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let Some(probe) = c.get(kind) else { continue };
                let port = probe_port(c, probe)
                    .unwrap_or_else(|| panic!("{}: {kind} without a port", d.origin));
                probes += 1;
                let bound: Vec<&(String, u64, String)> =
                    sockets.iter().filter(|(_, p, _)| *p == port).collect();
                assert!(
                    !bound.is_empty(),
                    "{}: {} {kind} targets port {port}, which no process of the pod binds ({sockets:?})",
                    d.origin,
                    c["name"]
                );
                assert!(
                    bound.iter().any(|(a, _, _)| !is_loopback(a)),
                    "{}: {} {kind} targets port {port}, bound to loopback only ({bound:?}): the kubelet cannot reach it",
                    d.origin,
                    c["name"]
                );
            }
        }
    }
    assert!(probes >= 3, "{probes} probes");
}

/// NetworkPolicies: the model servers take connections from the gateways only; the gateway pod
/// accepts only its public and ops ports, none of its private ones.
#[test]
fn network_policies_keep_clients_off_the_model_servers_and_private_ports() {
    let Some(docs) = example_docs_or_skip(
        "network_policies_keep_clients_off_the_model_servers_and_private_ports",
    ) else {
        return;
    };
    let policies = of_kind(&docs, "NetworkPolicy");
    assert!(policies.len() >= 2, "{}", policies.len());
    let selects = |p: &Value, app: &str| {
        let sel = &p["spec"]["podSelector"];
        sel["matchLabels"]["app"] == app
            || sel["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| {
                    e["key"] == "app"
                        && e["operator"] == "In"
                        && e["values"]
                            .as_array()
                            .is_some_and(|v| v.contains(&json!(app)))
                })
    };
    // Every pool's pods: a Service selects them by the label `llm-router-pool`.
    let selects_pool = |p: &Value, pool: &str| {
        let sel = &p["spec"]["podSelector"];
        sel["matchLabels"]["llm-router-pool"] == pool
            || sel["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| {
                    e["key"] == "llm-router-pool"
                        && (e["operator"] == "Exists"
                            || (e["operator"] == "In"
                                && e["values"]
                                    .as_array()
                                    .is_some_and(|v| v.contains(&json!(pool)))))
                })
    };
    let mut pools = 0;
    for svc in of_kind(&docs, "Service") {
        let Some(app) = svc.value["spec"]["selector"]["llm-router-pool"].as_str() else {
            continue;
        };
        pools += 1;
        let p = policies
            .iter()
            .find(|p| selects_pool(&p.value, app))
            .unwrap_or_else(|| panic!("no NetworkPolicy selects the {app} pods"));
        let ingress = p.value["spec"]["ingress"].as_array().unwrap();
        for rule in ingress {
            let from = rule["from"].as_array().expect("a rule with sources");
            assert!(!from.is_empty());
            for f in from {
                let labels = &f["podSelector"]["matchLabels"];
                // The gateway, and the metrics hub that scrapes the pods for every gateway
                // replica (envoy/deploy/components/metrics-hub): both are the router's own parts.
                assert!(
                    labels["app"] == "llm-gateway"
                        || labels["app"] == "llm-router-hub"
                        || labels["gateway.networking.k8s.io/gateway-name"] == "llm-gateway"
                        || labels["gateway.envoyproxy.io/owning-gateway-name"] == "llm-gateway",
                    "{}: {app} reachable from {f}",
                    p.origin
                );
            }
        }
    }
    assert!(pools >= 3, "a pool Service in each overlay: {pools}");
    // The gateway pod: only the Service's ports and the probe ports.
    let configmaps = configmaps(&docs);
    let gw = of_kind(&docs, "Deployment")
        .into_iter()
        .find(|d| d.value["metadata"]["name"] == "llm-gateway")
        .unwrap();
    let p = policies
        .iter()
        .find(|p| selects(&p.value, "llm-gateway"))
        .expect("a NetworkPolicy for the gateway pods");
    let allowed: BTreeSet<u64> = p.value["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().expect("ports listed").clone())
        .filter_map(|port| port["port"].as_u64())
        .collect();
    let mut wanted = BTreeSet::new();
    for c in containers(&gw.value) {
        for port in c["ports"].as_array().into_iter().flatten() {
            wanted.insert(port["containerPort"].as_u64().unwrap());
        }
        for kind in ["readinessProbe", "livenessProbe"] {
            if let Some(probe) = c.get(kind) {
                wanted.insert(probe_port(c, probe).unwrap());
            }
        }
    }
    assert_eq!(allowed, wanted, "the gateway pod's open ports");
    for (address, port, name) in pod_sockets(&gw.value, &configmaps) {
        if is_loopback(&address) {
            assert!(
                !allowed.contains(&port),
                "{name} ({address}:{port}) is private"
            );
        }
    }
}

/// The metrics hubs: the stream and the tallies (9465) from the gateway pods only, their own
/// /metrics (9464) from the monitoring namespace only; no other port, no other source.
#[test]
fn network_policies_wall_the_metrics_hub() {
    let Some(docs) = example_docs_or_skip("network_policies_wall_the_metrics_hub") else {
        return;
    };
    let p = of_kind(&docs, "NetworkPolicy")
        .into_iter()
        .find(|p| p.value["spec"]["podSelector"]["matchLabels"]["app"] == "llm-router-hub")
        .expect("a NetworkPolicy selecting the hub pods (app: llm-router-hub)");
    let rules = p.value["spec"]["ingress"].as_array().unwrap();
    let mut ports = BTreeSet::new();
    for rule in rules {
        let rule_ports: Vec<u64> = rule["ports"]
            .as_array()
            .expect("ports listed")
            .iter()
            .filter_map(|p| p["port"].as_u64())
            .collect();
        let from = rule["from"].as_array().expect("a rule with sources");
        assert!(!from.is_empty());
        for f in from {
            let labels = &f["podSelector"]["matchLabels"];
            let gateway = labels["app"] == "llm-gateway"
                || labels["gateway.networking.k8s.io/gateway-name"] == "llm-gateway"
                || labels["gateway.envoyproxy.io/owning-gateway-name"] == "llm-gateway";
            let monitoring = f["podSelector"].is_null()
                && f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    == "monitoring";
            match rule_ports.as_slice() {
                [9465] => assert!(gateway, "{}: the stream open to {f}", p.origin),
                [9464] => assert!(monitoring, "{}: /metrics open to {f}", p.origin),
                other => panic!("{}: hub ports {other:?} opened", p.origin),
            }
        }
        ports.extend(rule_ports);
    }
    assert_eq!(ports, BTreeSet::from([9464, 9465]));
}

/// Every way the manifests run a gateway pod — the standalone Deployment, the Deployment patch
/// Istio merges into its gateway, the Deployment patch of Envoy Gateway's `EnvoyProxy` — puts
/// the sidecar beside Envoy (`sidecar-metrics run --config …`), the hub-credential init
/// container before it, and the filter's module at `/var/lib/llm-router` in the Envoy
/// container; and every volume a container mounts is declared in the same pod.
#[test]
fn every_gateway_pod_runs_the_sidecar_and_declares_what_it_mounts() {
    let Some(docs) = example_docs_or_skip("every_gateway_pod_runs_the_sidecar") else {
        return;
    };
    let mut pods: Vec<(String, Value)> = Vec::new();
    for d in &docs {
        for v in with_embedded(d) {
            let spec = &v["spec"]["template"]["spec"];
            if spec["containers"].is_array() && spec["containers"][0]["name"] != "metrics-hub" {
                pods.push((d.origin.clone(), spec.clone()));
            }
        }
        let patch = &d.value["spec"]["provider"]["kubernetes"]["envoyDeployment"]["patch"]["value"];
        if patch.is_object() {
            pods.push((d.origin.clone(), patch["spec"]["template"]["spec"].clone()));
        }
    }
    let origins: BTreeSet<&str> = pods
        .iter()
        .map(|(o, _)| o.split('#').next().unwrap_or_default())
        .collect();
    assert_eq!(
        origins,
        BTreeSet::from([
            "envoy/deploy/overlays/envoy-gateway",
            "envoy/deploy/overlays/istio",
            "envoy/deploy/overlays/standalone",
        ]),
        "a gateway pod in each overlay"
    );
    for (origin, spec) in &pods {
        let list = |key: &str| -> Vec<Value> { spec[key].as_array().cloned().unwrap_or_default() };
        let containers = list("containers");
        let sidecar = containers
            .iter()
            .find(|c| c["name"] == "sidecar-metrics")
            .unwrap_or_else(|| panic!("{origin}: no sidecar-metrics container"));
        assert_eq!(sidecar["args"][0], "run", "{origin}");
        assert!(
            list("initContainers")
                .iter()
                .any(|c| c["name"] == "hub-credential" && c["args"][0] == "credential"),
            "{origin}: no hub-credential init container"
        );
        let mounts_filter = containers.iter().any(|c| {
            c["name"] != "sidecar-metrics"
                && c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["mountPath"] == "/var/lib/llm-router")
        });
        assert!(
            mounts_filter,
            "{origin}: no Envoy container mounts the module"
        );
        let volumes: BTreeSet<String> = list("volumes")
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        for c in containers.iter().chain(&list("initContainers")) {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap_or_default();
                assert!(
                    volumes.contains(name),
                    "{origin}: {} mounts {name}, which the pod does not declare",
                    c["name"]
                );
            }
        }
    }
}
