//! Keeps the example configurations in `envoy/` honest: every plain Envoy bootstrap (files and
//! ConfigMap entries) passes the real `envoy --mode validate` with the filter module substituted;
//! the Envoy fragments inside Istio's EnvoyFilter and Envoy Gateway's EnvoyPatchPolicy are put
//! into a bootstrap and validated too; every Kubernetes manifest has a known kind/apiVersion and,
//! for custom resources, only fields that exist in the CRD schemas of
//! `test-harness/fixtures/crds/` (types, enums, required fields); the pools named by the filter,
//! the routes and the sidecar agree; and the snapshot endpoints are switched on only in filter
//! copies on loopback-bound listeners, where the sidecar pushes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use testkit::crds::{check_manifest, crds_dir, load_crds};
use testkit::shipped::{
    documents, endpoints_on, envoy_bootstraps, example_docs_or_skip, listeners, plugin_of,
    pool_clusters, set_plugin_config, substitute_wasm, wasm_configs, Doc, OVERLAYS, WASM_TYPE,
};
use testkit::{filter_wasm, stats_config, testlog_dir, validate_config_env, EnvoySpec, Router};

/// The environment variable the shipped configurations read the snapshot secret from, and a
/// value for it in these runs.
const SECRET_ENV: &str = "LLM_ROUTER_SNAPSHOT_SECRET";
const TEST_ENV_SECRET: &str = "envoy-configs-test-secret-0123456789abcdef";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// The filter module, or `None` (skipped with a message) when missing outside CI.
fn wasm_or_skip(test: &str) -> Option<PathBuf> {
    match filter_wasm() {
        Ok(path) => Some(path),
        Err(e) if ci() => panic!("{test}: CI is set and the filter module is missing: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e} (set CI=1 to make this a failure)");
            None
        }
    }
}

fn validate_with_envoy(name: &str, mut bootstrap: Value, wasm: &Path, dir: &Path) {
    substitute_wasm(&mut bootstrap, wasm);
    let file = dir.join(format!("{}.yaml", name.replace(['/', '#', ' ', '.'], "_")));
    std::fs::write(&file, serde_yaml::to_string(&bootstrap).unwrap()).unwrap();
    if let Err(e) = validate_config_env(&file, &[(SECRET_ENV, TEST_ENV_SECRET)]) {
        panic!("{name}: envoy --mode validate failed:\n{e}");
    }
}

#[test]
fn plain_envoy_examples_pass_envoy_validate() {
    let Some(docs) = example_docs_or_skip("plain_envoy_examples_pass_envoy_validate") else {
        return;
    };
    let bootstraps = envoy_bootstraps(&docs);
    let origins: Vec<&str> = bootstraps.iter().map(|(o, _)| o.as_str()).collect();
    assert!(
        origins.iter().any(|o| o.starts_with("envoy/envoy.yaml")),
        "{origins:?}"
    );
    assert!(
        origins
            .iter()
            .any(|o| o.starts_with("envoy/deploy/overlays/standalone")),
        "{origins:?}"
    );
    // The two required settings, in every bootstrap that loads the filter; one public and one
    // internal copy of the filter in the same VM.
    for (origin, bootstrap) in &bootstraps {
        let mut configs = Vec::new();
        wasm_configs(bootstrap, &mut configs);
        assert_eq!(
            configs.len(),
            2,
            "{origin}: a public and an internal llm-router filter expected"
        );
        let internal = configs.iter().filter(|c| endpoints_on(c)).count();
        assert_eq!(
            internal, 1,
            "{origin}: exactly one copy serves the endpoints"
        );
        assert_eq!(configs[0]["vm_config"], configs[1]["vm_config"], "{origin}");
        for c in &configs {
            assert_eq!(
                c["allow_on_headers_stop_iteration"],
                json!(true),
                "{origin}"
            );
        }
        // The filter's metric labels become Prometheus labels (filter/README.md, "Metrics").
        let tags = bootstrap["stats_config"]["stats_tags"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for tag in stats_config()["stats_tags"].as_array().unwrap() {
            assert!(
                tags.contains(tag),
                "{origin}: stats_config.stats_tags lacks {tag}"
            );
        }
        // Every pool's cluster (the ones the plugin configuration names; local clusters such
        // as the ops listener's admin and sidecar ones are not pools).
        let pool_clusters: BTreeSet<String> = configs
            .iter()
            .flat_map(|c| {
                plugin_of(c)["pools"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| p["cluster"].as_str().map(str::to_string))
            .collect();
        assert!(!pool_clusters.is_empty(), "{origin}");
        for cluster in bootstrap["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| pool_clusters.contains(c["name"].as_str().unwrap_or_default()))
        {
            let policy = &cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"];
            assert_eq!(
                policy["name"], "envoy.load_balancing_policies.override_host",
                "{origin}: cluster {} lacks override_host",
                cluster["name"]
            );
        }
    }
    let Some(wasm) = wasm_or_skip("plain_envoy_examples_pass_envoy_validate") else {
        return;
    };
    let dir = testlog_dir("envoy-examples").unwrap();
    // Validation loads the module and runs its on_configure, so the plugin configuration is
    // checked by the filter itself: a broken one must fail.
    let (_, mut broken) = bootstraps[0].clone();
    let mut configs = Vec::new();
    wasm_configs(&broken, &mut configs);
    let mut plugin: Value =
        serde_json::from_str(configs[0]["configuration"]["value"].as_str().unwrap()).unwrap();
    plugin["pools"] = json!("not a list");
    set_plugin_config(&mut broken, &plugin.to_string());
    substitute_wasm(&mut broken, &wasm);
    let file = dir.join("broken-plugin-config.yaml");
    std::fs::write(&file, serde_yaml::to_string(&broken).unwrap()).unwrap();
    assert!(
        validate_config_env(&file, &[(SECRET_ENV, TEST_ENV_SECRET)]).is_err(),
        "a broken plugin configuration passed validation"
    );
    // The shipped configurations read the snapshot secret from Envoy's environment: without it,
    // or with a placeholder there, the filter refuses its configuration.
    let (_, mut unset) = bootstraps[0].clone();
    substitute_wasm(&mut unset, &wasm);
    let file = dir.join("secret-env.yaml");
    std::fs::write(&file, serde_yaml::to_string(&unset).unwrap()).unwrap();
    assert!(
        validate_config_env(&file, &[(SECRET_ENV, "")]).is_err(),
        "an empty {SECRET_ENV} passed validation"
    );
    assert!(
        validate_config_env(&file, &[(SECRET_ENV, "change-me")]).is_err(),
        "the placeholder secret passed validation"
    );
    for (origin, bootstrap) in bootstraps {
        validate_with_envoy(&origin, bootstrap, &wasm, &dir);
    }
}

fn retry_policies(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "retry_policy" {
                    out.push(v.clone());
                } else {
                    retry_policies(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| retry_policies(v, out)),
        _ => {}
    }
}

/// The fault handling the end-to-end tests exercise (testkit renders the same policy) is the
/// one every shipped plain Envoy route has: retried on connection failures and 503, with a
/// per-try idle timeout; no route timeout that would cut long streams.
#[test]
fn every_shipped_route_has_the_tested_retry_policy() {
    let Some(docs) = example_docs_or_skip("every_shipped_route_has_the_tested_retry_policy") else {
        return;
    };
    let mut routes = 0;
    for (origin, bootstrap) in envoy_bootstraps(&docs) {
        let mut policies = Vec::new();
        retry_policies(&bootstrap, &mut policies);
        assert!(!policies.is_empty(), "{origin}: {policies:?}");
        for p in policies {
            routes += 1;
            assert_eq!(p["retry_on"], json!(testkit::RETRY_ON), "{origin}");
            assert_eq!(p["retriable_status_codes"], json!([503]), "{origin}");
            assert_eq!(p["num_retries"], json!(2), "{origin}");
            assert_eq!(
                p["per_try_idle_timeout"],
                json!(format!("{}s", testkit::PER_TRY_IDLE_TIMEOUT.as_secs())),
                "{origin}"
            );
        }
    }
    assert!(routes >= 2, "{routes} routes");
    // Envoy Gateway: the same triggers and codes, and the idle bound as a stream idle timeout.
    let btp = docs
        .iter()
        .find(|d| d.value["kind"] == "BackendTrafficPolicy")
        .expect("envoy-gateway: a BackendTrafficPolicy");
    let on = &btp.value["spec"]["retry"]["retryOn"];
    let triggers: Vec<&str> = on["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(triggers.join(","), testkit::RETRY_ON);
    assert_eq!(on["httpStatusCodes"], json!([503]));
    assert_eq!(
        btp.value["spec"]["timeout"]["http"]["streamIdleTimeout"],
        json!(format!("{}s", testkit::PER_TRY_IDLE_TIMEOUT.as_secs()))
    );
}

#[test]
fn snapshot_endpoints_are_served_only_on_loopback_listeners() {
    let Some(docs) =
        example_docs_or_skip("snapshot_endpoints_are_served_only_on_loopback_listeners")
    else {
        return;
    };
    let mut all = Vec::new(); // (origin, listener)
    let mut public_filters = Vec::new(); // (origin, wasm config) outside any listener object
    for doc in &docs {
        let mut values = vec![doc.value.clone()];
        for (_, text) in doc.value["data"].as_object().into_iter().flatten() {
            values.extend(documents(text.as_str().unwrap_or_default(), &doc.origin));
        }
        for v in values {
            let mut found = Vec::new();
            listeners(&v, &mut found);
            let mut inside = 0;
            for l in found {
                let mut configs = Vec::new();
                wasm_configs(&l, &mut configs);
                inside += configs.len();
                all.push((doc.origin.clone(), l));
            }
            let mut configs = Vec::new();
            wasm_configs(&v, &mut configs);
            if configs.len() > inside {
                // Filters patched into listeners the controller generates (public ones).
                for c in configs.into_iter().filter(|c| !endpoints_on(c)) {
                    public_filters.push((doc.origin.clone(), c));
                }
            }
        }
    }
    let mut internal_ports = BTreeSet::new();
    let mut internal_folders = BTreeSet::new();
    for (origin, l) in &all {
        let mut configs = Vec::new();
        wasm_configs(l, &mut configs);
        let address = l["address"]["socket_address"]["address"]
            .as_str()
            .unwrap_or_default();
        for c in &configs {
            if endpoints_on(c) {
                assert!(
                    address == "127.0.0.1" || address == "::1",
                    "{origin}: snapshot endpoints on a listener bound to {address}"
                );
                let plugin = plugin_of(c);
                assert!(
                    plugin["snapshot"]["secret_env"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{origin}: endpoints without a secret (from the environment)"
                );
                internal_ports.insert(
                    l["address"]["socket_address"]["port_value"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("{origin}: internal listener without a port")),
                );
                internal_folders.insert(origin.split('#').next().map(str::to_string));
            }
        }
    }
    assert_eq!(
        internal_folders.len(),
        4,
        "an internal listener in envoy/envoy.yaml and each overlay: {internal_folders:?}"
    );
    assert_eq!(
        internal_ports.len(),
        1,
        "one internal port everywhere: {internal_ports:?}"
    );
    assert!(public_filters.len() >= 2, "{public_filters:?}");
    // The sidecar pushes to that port on loopback.
    let port = internal_ports.iter().next().unwrap();
    let sidecar = docs
        .iter()
        .filter(|d| d.value["kind"] == "ConfigMap")
        .flat_map(|d| d.value["data"].as_object().cloned().unwrap_or_default())
        .filter_map(|(_, text)| {
            documents(text.as_str().unwrap_or_default(), "ConfigMap data")
                .into_iter()
                .next()
        })
        .find(|v| v.get("push").is_some() && v["mode"] != "hub")
        .expect("the sidecar configuration");
    assert_eq!(
        sidecar["push"]["address"],
        json!(format!("127.0.0.1:{port}"))
    );
}

#[test]
fn envoy_fragments_in_istio_and_envoy_gateway_manifests_pass_envoy_validate() {
    let Some(docs) = example_docs_or_skip(
        "envoy_fragments_in_istio_and_envoy_gateway_manifests_pass_envoy_validate",
    ) else {
        return;
    };
    let mut filters = Vec::new(); // (origin, http filter entry)
    let mut lb_policies = Vec::new(); // (origin, load_balancing_policy)
    let mut added_listeners = Vec::new(); // (origin, whole listener)
    for doc in &docs {
        let v = &doc.value;
        match v["kind"].as_str() {
            Some("EnvoyFilter") => {
                for patch in v["spec"]["configPatches"].as_array().unwrap() {
                    let value = &patch["patch"]["value"];
                    match patch["applyTo"].as_str() {
                        Some("EXTENSION_CONFIG") => {
                            filters.push((doc.origin.clone(), value.clone()))
                        }
                        Some("CLUSTER") => lb_policies
                            .push((doc.origin.clone(), value["load_balancing_policy"].clone())),
                        Some("LISTENER") if patch["patch"]["operation"] == "ADD" => {
                            added_listeners.push((doc.origin.clone(), value.clone()))
                        }
                        _ => {}
                    }
                }
            }
            Some("EnvoyPatchPolicy") => {
                for patch in v["spec"]["jsonPatches"].as_array().unwrap() {
                    let value = &patch["operation"]["value"];
                    if value["typed_config"]["@type"] == WASM_TYPE {
                        filters.push((doc.origin.clone(), value.clone()));
                    }
                    if patch["operation"]["op"] == "add"
                        && patch["operation"]["path"] == ""
                        && patch["type"] == "type.googleapis.com/envoy.config.listener.v3.Listener"
                    {
                        added_listeners.push((doc.origin.clone(), value.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    let origins: BTreeSet<&str> = filters
        .iter()
        .map(|(o, _)| o.split('#').next().unwrap())
        .collect();
    assert_eq!(
        origins.len(),
        2,
        "expected the Istio and Envoy Gateway filters: {origins:?}"
    );
    assert!(
        !lb_policies.is_empty(),
        "istio: override_host on the pool's cluster"
    );
    assert_eq!(
        added_listeners.len(),
        2,
        "the internal listener in the Istio and Envoy Gateway manifests"
    );
    for (origin, filter) in &filters {
        assert_eq!(
            filter["typed_config"]["config"]["allow_on_headers_stop_iteration"],
            json!(true),
            "{origin}"
        );
    }
    let Some(wasm) = wasm_or_skip("envoy_fragments_pass_envoy_validate") else {
        return;
    };
    let dir = testlog_dir("envoy-fragments").unwrap();
    let spec = EnvoySpec::new(Router::Filter).pool(
        "llama",
        "pool_llama",
        vec!["127.0.0.1:9".parse().unwrap()],
    );
    for (origin, filter) in filters {
        let mut bootstrap = spec.bootstrap(&wasm, &dir.join("access.log")).unwrap();
        bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["http_filters"][0] = filter;
        validate_with_envoy(&format!("{origin} filter"), bootstrap, &wasm, &dir);
    }
    for (origin, listener) in added_listeners {
        // In place of the generated internal listener: same VM as the public filter.
        let mut bootstrap = spec.bootstrap(&wasm, &dir.join("access.log")).unwrap();
        bootstrap["static_resources"]["listeners"][1] = listener;
        validate_with_envoy(&format!("{origin} listener"), bootstrap, &wasm, &dir);
    }
    for (origin, policy) in lb_policies {
        let mut bootstrap = spec.bootstrap(&wasm, &dir.join("access.log")).unwrap();
        let cluster = &mut bootstrap["static_resources"]["clusters"][0];
        // As Istio generates it (least request), with the MERGE applied on top.
        cluster["lb_policy"] = json!("LEAST_REQUEST");
        cluster["load_balancing_policy"] = policy;
        validate_with_envoy(&format!("{origin} cluster"), bootstrap, &wasm, &dir);
    }
}

/// The pools (name → cluster) of every filter configuration in the examples, per folder.
fn plugin_pools(docs: &[Doc]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut add = |origin: &str, value: &Value| {
        let mut configs = Vec::new();
        wasm_configs(value, &mut configs);
        for config in configs {
            let text = config["configuration"]["value"]
                .as_str()
                .unwrap_or_else(|| panic!("{origin}: no configuration"));
            let plugin: Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{origin}: plugin JSON: {e}"));
            assert_eq!(
                config["configuration"]["@type"],
                "type.googleapis.com/google.protobuf.StringValue"
            );
            assert_eq!(
                config["vm_config"]["runtime"], "envoy.wasm.runtime.v8",
                "{origin}"
            );
            assert_eq!(config["vm_config"]["vm_id"], "llm-router", "{origin}");
            assert_eq!(config["root_id"], "llm-router", "{origin}");
            if plugin["snapshot"]["endpoints"] == json!(true) {
                // The internal copy: snapshot endpoints only (checked by its own test).
                continue;
            }
            // `envoy/<file>`, or the overlay: `envoy/deploy/overlays/<overlay>`.
            let folder = origin.split('#').next().unwrap_or_default().to_string();
            for pool in plugin["pools"]
                .as_array()
                .unwrap_or_else(|| panic!("{origin}: no pools"))
            {
                let name = pool["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{origin}: pool without name"));
                let cluster = pool["cluster"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{origin}: {name} without cluster"));
                assert!(
                    pool["models"].as_array().is_some_and(|m| !m.is_empty()),
                    "{origin}: pool {name} has no models"
                );
                out.entry(folder.clone())
                    .or_default()
                    .insert(name.into(), cluster.into());
            }
            assert!(
                plugin["snapshot"].get("secret").is_none(),
                "{origin}: the public copy needs no secret (it has no snapshot endpoints)"
            );
        }
    };
    for doc in docs {
        add(&doc.origin, &doc.value);
        for (key, text) in doc.value["data"].as_object().into_iter().flatten() {
            let origin = format!("{} data.{key}", doc.origin);
            for inner in documents(text.as_str().unwrap_or_default(), &origin) {
                add(&doc.origin, &inner);
            }
        }
    }
    out
}

#[test]
fn filter_pools_routes_and_sidecar_agree() {
    let Some(docs) = example_docs_or_skip("filter_pools_routes_and_sidecar_agree") else {
        return;
    };
    let pools = plugin_pools(&docs);
    assert_eq!(
        pools.len(),
        4,
        "filter configs in envoy/envoy.yaml and the three overlays: {pools:?}"
    );
    // Per overlay: the filter's pools, the routes, the gateway sidecar's and the hub's pools agree.
    let mut sidecars: Vec<Value> = Vec::new();
    for overlay in OVERLAYS {
        let folder = format!("envoy/deploy/overlays/{overlay}");
        let reference = pools
            .get(&folder)
            .unwrap_or_else(|| panic!("{folder}: no filter configuration"));
        let clusters: BTreeSet<&String> = reference.values().collect();
        let ours: Vec<&Doc> = docs
            .iter()
            .filter(|d| d.origin.starts_with(&format!("{folder}#")))
            .collect();
        // HTTPRoutes send each pool's header value to a backend; the standalone bootstrap routes
        // by the header to the cluster of that name.
        let mut routed = BTreeSet::new();
        for doc in ours.iter().filter(|d| d.value["kind"] == "HTTPRoute") {
            for rule in doc.value["spec"]["rules"].as_array().unwrap() {
                for m in rule["matches"].as_array().into_iter().flatten() {
                    for h in m["headers"].as_array().into_iter().flatten() {
                        if h["name"] == "x-llm-router-cluster" {
                            let value = h["value"].as_str().unwrap().to_string();
                            assert!(
                                clusters.contains(&value),
                                "{}: routes unknown pool cluster {value}",
                                doc.origin
                            );
                            routed.insert(value);
                        }
                    }
                }
            }
        }
        let owned: Vec<Doc> = ours.iter().map(|d| (*d).clone()).collect();
        for (_, bootstrap) in envoy_bootstraps(&owned) {
            routed.extend(pool_clusters(&bootstrap));
        }
        assert_eq!(
            routed.iter().collect::<BTreeSet<_>>(),
            clusters,
            "{folder}: every pool cluster needs a route, and only those"
        );
        // The sidecar pushes the same pools, and the metrics hub scrapes them.
        let found: Vec<Value> = ours
            .iter()
            .filter(|d| d.value["kind"] == "ConfigMap")
            .flat_map(|d| d.value["data"].as_object().cloned().unwrap_or_default())
            .filter_map(|(_, text)| {
                documents(text.as_str().unwrap_or_default(), "ConfigMap data")
                    .into_iter()
                    .next()
            })
            .filter(|v| v.get("push").is_some() && v.get("pools").is_some())
            .collect();
        assert_eq!(
            found.iter().filter(|v| v["mode"] == "hub").count(),
            1,
            "{folder}: one metrics hub configuration"
        );
        assert_eq!(
            found.len(),
            2,
            "{folder}: the sidecar's and the hub's configurations"
        );
        for sidecar in &found {
            let sidecar_pools: BTreeMap<String, String> = sidecar["pools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().into(),
                        p["cluster"].as_str().unwrap().into(),
                    )
                })
                .collect();
            assert_eq!(
                &sidecar_pools, reference,
                "{folder}: sidecar pools differ from the filter's"
            );
            for p in sidecar["pools"].as_array().unwrap() {
                let d = p["discovery"].as_object().unwrap();
                assert_eq!(d.len(), 1, "exactly one discovery kind per pool: {d:?}");
            }
        }
        sidecars.extend(found);
    }
    // The gateway sidecar follows the hub's Service, on the port the hub listens on.
    let gateway = sidecars.iter().find(|v| v["mode"] != "hub").unwrap();
    let hub = sidecars.iter().find(|v| v["mode"] == "hub").unwrap();
    let port = hub["hub"]["listen"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    let service = docs
        .iter()
        .find(|d| d.value["kind"] == "Service" && d.value["metadata"]["name"] == "llm-router-hub")
        .expect("the hub's Service");
    assert_eq!(service.value["spec"]["ports"][0]["port"].to_string(), port);
    // Headless, so the name resolves to every hub and each gateway's tally reaches them all.
    assert_eq!(service.value["spec"]["clusterIP"], "None");
    assert!(
        gateway["hub"]["share_ms"].as_u64().is_some_and(|ms| ms > 0),
        "the gateway sidecar shares its replica's work with the hubs"
    );
    assert_eq!(
        gateway["hub"]["upstreams"][0],
        // The Service's short name: the sidecar resolves it in its own namespace.
        json!(format!("http://llm-router-hub:{port}"))
    );
    let pdb = docs
        .iter()
        .find(|d| d.value["kind"] == "PodDisruptionBudget")
        .expect("the hub's PodDisruptionBudget");
    assert_eq!(
        pdb.value["spec"]["selector"],
        service.value["spec"]["selector"]
            .as_object()
            .map(|m| json!({"matchLabels": m}))
            .unwrap()
    );
    let deployment = docs
        .iter()
        .find(|d| {
            d.value["kind"] == "Deployment" && d.value["metadata"]["name"] == "llm-router-hub"
        })
        .expect("the hub's Deployment");
    assert!(
        deployment.value["spec"]["replicas"].as_u64().unwrap() >= 2,
        "one hub is a single point of cost"
    );
}

// ---- Kubernetes manifests against the CRD schemas ----

#[test]
fn kubernetes_manifests_match_kinds_and_crd_schemas() {
    let crds = load_crds(&crds_dir());
    assert!(crds.contains_key(&("networking.istio.io".into(), "EnvoyFilter".into())));
    let mut checked = BTreeSet::new();
    let mut errors = Vec::new();
    let Some(docs) = example_docs_or_skip("kubernetes_manifests_match_kinds_and_crd_schemas")
    else {
        return;
    };
    for doc in docs {
        let file = doc.origin.split('#').next().unwrap_or_default().to_string();
        if doc.value.get("static_resources").is_some() {
            continue; // a plain Envoy bootstrap, validated by Envoy itself
        }
        if doc.value.get("kind").is_none() {
            assert!(
                file.contains("patch"),
                "{}: no kind (only *patch* files may be partial)",
                doc.origin
            );
            continue;
        }
        for e in check_manifest(&doc.value, &crds) {
            errors.push(format!("{}: {e}", doc.origin));
        }
        checked.insert(doc.value["kind"].as_str().unwrap_or_default().to_string());
    }
    assert!(errors.is_empty(), "manifest errors:\n{}", errors.join("\n"));
    for kind in [
        "EnvoyFilter",
        "HTTPRoute",
        "Gateway",
        "EnvoyPatchPolicy",
        "BackendTrafficPolicy",
        "Deployment",
        "Role",
        "ConfigMap",
    ] {
        assert!(
            checked.contains(kind),
            "no {kind} among the examples: {checked:?}"
        );
    }
}

#[test]
fn the_schema_check_rejects_bad_manifests() {
    let crds = load_crds(&crds_dir());
    let good = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": "x"},
        "spec": {"loadBalancer": {"type": "RoundRobin",
                 "endpointOverride": {"extractFrom": [{"header": "x-gateway-destination-endpoint"}]}}},
    });
    assert_eq!(check_manifest(&good, &crds), Vec::<String>::new());
    let mut unknown_field = good.clone();
    unknown_field["spec"]["loadBalancer"]["endpointOverride"]["fromHeader"] = json!("x");
    assert!(check_manifest(&unknown_field, &crds)
        .iter()
        .any(|e| e.contains("fromHeader")));
    let mut bad_enum = good.clone();
    bad_enum["spec"]["loadBalancer"]["type"] = json!("Fastest");
    assert!(check_manifest(&bad_enum, &crds)
        .iter()
        .any(|e| e.contains("Fastest")));
    let mut missing = good.clone();
    missing["spec"]["loadBalancer"]
        .as_object_mut()
        .unwrap()
        .remove("type");
    assert!(check_manifest(&missing, &crds)
        .iter()
        .any(|e| e.contains("`type`")));
    let mut wrong_version = good.clone();
    wrong_version["apiVersion"] = json!("gateway.envoyproxy.io/v9");
    assert!(!check_manifest(&wrong_version, &crds).is_empty());
    let unknown_kind = json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "WasmFilter", "metadata": {"name": "x"}});
    assert!(!check_manifest(&unknown_kind, &crds).is_empty());
    let mut bad_type = good;
    bad_type["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"] = json!({"header": "x"});
    assert!(check_manifest(&bad_type, &crds)
        .iter()
        .any(|e| e.contains("expected an array")));
    // Counts, lengths and integer bounds (InferencePool: 1–8 target ports in 1..=65535, 1–64
    // labels of at most 63 characters).
    let pool = json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]},
    });
    assert_eq!(check_manifest(&pool, &crds), Vec::<String>::new());
    let mut bad = pool.clone();
    bad["spec"]["targetPorts"] = json!([{"number": 0}]);
    assert!(check_manifest(&bad, &crds)
        .iter()
        .any(|e| e.contains("below the minimum 1")));
    bad["spec"]["targetPorts"] = json!([{"number": 65536}]);
    assert!(check_manifest(&bad, &crds)
        .iter()
        .any(|e| e.contains("above the maximum 65535")));
    bad["spec"]["targetPorts"] = json!([]);
    assert!(check_manifest(&bad, &crds)
        .iter()
        .any(|e| e.contains("fewer than 1 items")));
    let mut bad = pool.clone();
    bad["spec"]["selector"]["matchLabels"] = json!({});
    assert!(check_manifest(&bad, &crds)
        .iter()
        .any(|e| e.contains("fewer than 1 properties")));
    bad["spec"]["selector"]["matchLabels"] = json!({"app": "x".repeat(64)});
    assert!(check_manifest(&bad, &crds)
        .iter()
        .any(|e| e.contains("more than 63 characters")));
}

#[test]
fn sidecar_config_in_the_configmap_passes_sidecar_metrics_check() {
    let Some(docs) =
        example_docs_or_skip("sidecar_config_in_the_configmap_passes_sidecar_metrics_check")
    else {
        return;
    };
    let mut found = Vec::new();
    for doc in docs.iter().filter(|d| d.value["kind"] == "ConfigMap") {
        for (key, text) in doc.value["data"].as_object().into_iter().flatten() {
            let text = text.as_str().unwrap_or_default();
            let parsed = documents(text, &doc.origin);
            if parsed
                .first()
                .is_some_and(|v| v.get("push").is_some() && v.get("pools").is_some())
            {
                found.push((format!("{} data.{key}", doc.origin), text.to_string()));
            }
        }
    }
    assert_eq!(
        found.len(),
        2 * OVERLAYS.len(),
        "the sidecar's and the metrics hub's configurations of each overlay expected: {:?}",
        found.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The manifests start the sidecar as `sidecar-metrics run --config FILE`.
    for doc in docs.iter().filter(|d| d.value["kind"] == "Deployment") {
        for c in doc.value["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            if c["name"] == "sidecar-metrics" || c["name"] == "metrics-hub" {
                assert_eq!(c["args"][0], "run", "{}", doc.origin);
                assert_eq!(c["args"][1], "--config", "{}", doc.origin);
            }
        }
    }
    let sidecar = match testkit::bin("sidecar-metrics") {
        Ok(path) => path,
        Err(e) if ci() => panic!("CI is set and sidecar-metrics is not built: {e}"),
        Err(e) => {
            eprintln!("SKIPPED sidecar_config_in_the_configmap_passes_sidecar_metrics_check: {e}");
            return;
        }
    };
    let dir = testlog_dir("sidecar-config").unwrap();
    for (origin, text) in found {
        let file = dir.join("sidecar.yaml");
        std::fs::write(&file, &text).unwrap();
        let out = std::process::Command::new(&sidecar)
            .arg("check")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{origin}: sidecar-metrics check failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // And a broken copy must fail (the check has teeth).
        let broken = dir.join("broken.yaml");
        std::fs::write(&broken, text.replace("push:", "pushh:")).unwrap();
        let out = std::process::Command::new(&sidecar)
            .arg("check")
            .arg(&broken)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{origin}: a broken sidecar config passed the check"
        );
    }
}

/// The shipped identity chain (`envoy/identity/jwt-authn.yaml`) in front of the filter passes
/// the real `envoy --mode validate`, as shipped (JWKS fetched from the issuer cluster) and as
/// the end-to-end test runs it (JWKS inline); it removes every identity header the filter reads
/// before jwt_authn writes them.
#[test]
fn the_shipped_identity_chain_passes_envoy_validate() {
    let shipped = testkit::Identity::shipped_jwt_authn().unwrap();
    let names: Vec<&str> = shipped
        .http_filters
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.header_mutation",
            "envoy.filters.http.jwt_authn"
        ]
    );
    let removed: BTreeSet<&str> = shipped.http_filters[0]["typed_config"]["mutations"]
        ["request_mutations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["remove"].as_str())
        .collect();
    let defaults = llm_router_core::Config::default();
    for h in [
        "x-llm-d-inference-fairness-id",
        "x-llm-d-inference-objective",
        "x-gateway-inference-fairness-id",
        "x-gateway-inference-objective",
        defaults.priority_header.as_str(),
        defaults.objective_header.as_str(),
    ] {
        assert!(removed.contains(h), "{h} is not removed: {removed:?}");
    }
    let written: BTreeSet<&str> = shipped.http_filters[1]["typed_config"]["providers"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| {
            p["claim_to_headers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| {
            let h = c["header_name"].as_str()?;
            removed.get(h).copied()
        })
        .collect();
    assert_eq!(written.len(), 2, "both claim headers are removed first");
    // The filter accepts the configuration the chain needs.
    let plugin = EnvoySpec::new(Router::Filter)
        .pool("llama", "pool_llama", vec!["127.0.0.1:9".parse().unwrap()])
        .identity(shipped.clone())
        .effective_plugin_config();
    let config = llm_router_core::Config::parse(plugin.to_string().as_bytes()).unwrap();
    assert!(config.priority.trust_headers);
    assert_eq!(config.objective_header, "x-llm-d-inference-objective");

    let Some(wasm) = wasm_or_skip("the_shipped_identity_chain_passes_envoy_validate") else {
        return;
    };
    let dir = testlog_dir("envoy-identity").unwrap();
    let jwks = r#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"k","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
    for (label, identity) in [
        ("shipped", shipped.clone()),
        ("local-jwks", shipped.with_local_jwks(jwks)),
    ] {
        let spec = EnvoySpec::new(Router::Filter)
            .pool("llama", "pool_llama", vec!["127.0.0.1:9".parse().unwrap()])
            .identity(identity);
        let bootstrap = spec.bootstrap(&wasm, &dir.join("access.log")).unwrap();
        validate_with_envoy(&format!("identity {label}"), bootstrap, &wasm, &dir);
    }
}

// ---- envoy/deploy: the overlays, rendered from the one values file ----

fn deploy_dir() -> PathBuf {
    testkit::workspace_root().join("envoy/deploy")
}

/// `envoy/deploy` copied (kustomization files, components, overlays, values) to a fresh folder.
fn copy_deploy(label: &str) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let target = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy(&path, &target);
            } else {
                std::fs::copy(&path, &target).unwrap();
            }
        }
    }
    let dir = testlog_dir(label).unwrap().join("deploy");
    copy(&deploy_dir(), &dir);
    dir
}

/// The `data` of `values/values.yaml` under `deploy`.
fn values_of(deploy: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(deploy.join("values/values.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    doc["data"]
        .as_object()
        .expect("values.yaml: a data map")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().expect("values are strings").to_string(),
            )
        })
        .collect()
}

/// Every overlay renders with `kubectl kustomize` from the shipped values; the values
/// ConfigMap itself stays out of the output (it is kustomize's input, not a resource); every
/// object lands in the values' namespace and carries the part-of label; and each overlay has
/// its gateway's kinds. The objects themselves are validated by the tests that read
/// `example_docs_or_skip` (CRD schemas above, Kubernetes schemas in kubernetes_schemas.rs,
/// `envoy --mode validate` for the bootstrap and the Envoy fragments).
#[test]
fn every_overlay_renders_from_the_values_file() {
    let test = "every_overlay_renders_from_the_values_file";
    let Some(kubectl) = testkit::shipped::kubectl_or_skip(test) else {
        return;
    };
    let values = values_of(&deploy_dir());
    let wanted: [(&str, &[&str]); 3] = [
        (
            "istio",
            &[
                "EnvoyFilter",
                "Gateway",
                "HTTPRoute",
                "DestinationRule",
                "Service",
            ],
        ),
        (
            "envoy-gateway",
            &[
                "EnvoyPatchPolicy",
                "BackendTrafficPolicy",
                "ClientTrafficPolicy",
                "EnvoyProxy",
                "Gateway",
                "HTTPRoute",
            ],
        ),
        ("standalone", &["Deployment", "Service", "ConfigMap"]),
    ];
    for (overlay, kinds) in wanted {
        let text = testkit::shipped::render_overlay(&kubectl, &deploy_dir(), overlay)
            .unwrap_or_else(|e| panic!("{e}"));
        let docs = documents(&text, overlay);
        let found: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for kind in kinds
            .iter()
            .chain(&["NetworkPolicy", "RoleBinding", "PodDisruptionBudget"])
        {
            assert!(found.contains(kind), "{overlay}: no {kind} in {found:?}");
        }
        for d in &docs {
            let what = format!("{overlay}: {} {}", d["kind"], d["metadata"]["name"]);
            assert_ne!(
                d["metadata"]["name"], "llm-router-values",
                "{what}: the values are kustomize's input, not a resource"
            );
            assert_eq!(
                d["metadata"]["namespace"].as_str(),
                Some(values["namespace"].as_str()),
                "{what}"
            );
            assert_eq!(
                d["metadata"]["labels"]["app.kubernetes.io/part-of"], "llm-router",
                "{what}"
            );
        }
    }
}

/// Replaces each `old` in `s` that stands alone: not inside a longer name (a neighbour that is
/// a letter, a digit, `-` or `_`).
fn replace_token(s: &str, old: &str, new: &str) -> String {
    let word =
        |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(old) {
        let before = if at > 0 {
            rest[..at].chars().last()
        } else {
            out.chars().last()
        };
        let after = rest[at + old.len()..].chars().next();
        out.push_str(&rest[..at]);
        if word(before) || word(after) {
            out.push_str(old);
        } else {
            out.push_str(new);
        }
        rest = &rest[at + old.len()..];
    }
    out.push_str(rest);
    out
}

/// What a shipped leaf must become when the values change from `old` to `new`: every
/// occurrence of an old value, in any string (the Envoy bootstrap, the plugin JSON, the
/// sidecar's YAML, a host name), replaced by the new one. Whole values first (images, the model,
/// which contains the pool's name), then the digest alone, then the short tokens.
fn expected_leaf(
    leaf: &Value,
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Value {
    match leaf {
        Value::String(s) => {
            let mut s = s.clone();
            for key in ["sidecarImage", "filterImage", "model"] {
                s = s.replace(&old[key], &new[key]);
            }
            let digest = |v: &BTreeMap<String, String>| {
                v["filterImage"]
                    .rsplit_once("@sha256:")
                    .unwrap()
                    .1
                    .to_string()
            };
            s = s.replace(&digest(old), &digest(new));
            for key in ["pool", "namespace", "port", "engine"] {
                s = replace_token(&s, &old[key], &new[key]);
            }
            Value::String(s)
        }
        Value::Number(n) if n.to_string() == old["port"] => {
            json!(new["port"].parse::<u64>().unwrap())
        }
        other => other.clone(),
    }
}

/// Compares two renders leaf by leaf (documents paired by kind and name, the pool's Service and
/// DestinationRule renamed): each leaf of `changed` must be the `expected_leaf` of the same leaf
/// of `shipped`. Returns the mismatches, and counts the leaves a value reached in `changed`.
fn compare_renders(
    shipped: &[Value],
    changed: &[Value],
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    reached: &mut usize,
) -> Vec<String> {
    fn walk(
        path: &str,
        a: &Value,
        b: &Value,
        old: &BTreeMap<String, String>,
        new: &BTreeMap<String, String>,
        out: &mut Vec<String>,
        reached: &mut usize,
    ) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    walk(
                        &format!("{path}.{k}"),
                        &x[k],
                        y.get(k).unwrap_or(&Value::Null),
                        old,
                        new,
                        out,
                        reached,
                    );
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}[{i}]"), p, q, old, new, out, reached);
                }
            }
            _ => {
                let want = expected_leaf(a, old, new);
                if &want != b {
                    out.push(format!("{path}: {b} where {want} was expected"));
                } else if &want != a {
                    *reached += 1;
                }
            }
        }
    }
    let key = |d: &Value, rename: bool| {
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let name = if rename {
            replace_token(name, &old["pool"], &new["pool"])
        } else {
            name.to_string()
        };
        (d["kind"].as_str().unwrap_or_default().to_string(), name)
    };
    let by_key: BTreeMap<_, &Value> = changed.iter().map(|d| (key(d, false), d)).collect();
    let mut out = Vec::new();
    assert_eq!(shipped.len(), changed.len(), "the same objects");
    for d in shipped {
        let k = key(d, true);
        let Some(other) = by_key.get(&k) else {
            out.push(format!("{k:?}: missing after the change"));
            continue;
        };
        walk(
            &format!("{} {}", k.0, k.1),
            d,
            other,
            old,
            new,
            &mut out,
            reached,
        );
    }
    out
}

/// Values for the one-declaration test: every value of the shipped file changed.
fn changed_values(shipped: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut new = shipped.clone();
    new.insert("namespace".into(), "inference-prod".into());
    new.insert("pool".into(), "zeta".into());
    new.insert("model".into(), "acme/Zeta-2.5-70B-Instruct".into());
    new.insert("port".into(), "8123".into());
    new.insert("engine".into(), "sglang".into());
    let swap = |image: &str, digest: &str| {
        let (repo, _) = image.rsplit_once("@sha256:").unwrap();
        let name = repo.rsplit('/').next().unwrap();
        format!("ghcr.io/acme/{name}@sha256:{digest}")
    };
    new.insert(
        "sidecarImage".into(),
        swap(&shipped["sidecarImage"], &"a1".repeat(32)),
    );
    new.insert(
        "filterImage".into(),
        swap(&shipped["filterImage"], &"b2".repeat(32)),
    );
    new
}

/// Writes `new` into the copy's values file (each `key: value` line of the data map).
fn write_values(deploy: &Path, old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) {
    let file = deploy.join("values/values.yaml");
    let mut text = std::fs::read_to_string(&file).unwrap();
    for (key, value) in new {
        let quoted = |v: &str| {
            if key == "port" {
                format!("\"{v}\"")
            } else {
                v.to_string()
            }
        };
        let from = format!("\n  {key}: {}\n", quoted(&old[key]));
        assert!(text.contains(&from), "values.yaml: no line {from:?}");
        text = text.replace(&from, &format!("\n  {key}: {}\n", quoted(value)));
    }
    std::fs::write(&file, text).unwrap();
}

/// Renders every overlay of `deploy` with the shipped values and with `changed_values`, and
/// compares them (see `compare_renders`): the mismatches, and how many leaves a value reached.
fn one_declaration_mismatches(kubectl: &Path, deploy: &Path) -> (Vec<String>, usize) {
    let old = values_of(deploy);
    let shipped: Vec<(String, Vec<Value>)> = OVERLAYS
        .iter()
        .map(|o| {
            let text = testkit::shipped::render_overlay(kubectl, deploy, o)
                .unwrap_or_else(|e| panic!("{e}"));
            (o.to_string(), documents(&text, o))
        })
        .collect();
    let new = changed_values(&old);
    write_values(deploy, &old, &new);
    let mut mismatches = Vec::new();
    let mut reached = 0;
    for (overlay, docs) in shipped {
        let text = testkit::shipped::render_overlay(kubectl, deploy, &overlay)
            .unwrap_or_else(|e| panic!("{e}"));
        let changed = documents(&text, &overlay);
        for m in compare_renders(&docs, &changed, &old, &new, &mut reached) {
            mismatches.push(format!("{overlay}: {m}"));
        }
    }
    (mismatches, reached)
}

/// One declaration drives every place: with every value of values/values.yaml changed (pool
/// name, model, namespace, port, engine, both images), each overlay renders the same objects
/// with every place that named an old value — a field, a host name, a listener name, a word
/// inside the Envoy bootstrap, the plugin JSON or the sidecar's YAML — naming the new one, and
/// nothing else changed. A place kustomize does not reach still names the old value and fails.
#[test]
fn one_declaration_in_the_values_file_drives_every_rendered_place() {
    let test = "one_declaration_in_the_values_file_drives_every_rendered_place";
    let Some(kubectl) = testkit::shipped::kubectl_or_skip(test) else {
        return;
    };
    let deploy = copy_deploy("deploy-values");
    let (mismatches, reached) = one_declaration_mismatches(&kubectl, &deploy);
    assert!(
        mismatches.is_empty(),
        "places the values file does not reach:\n{}",
        mismatches.join("\n")
    );
    // Each overlay: namespaces (~15 objects), the pool in the filter, routes, sidecar, hub.
    assert!(reached >= 60, "only {reached} places changed");
    // The standalone bootstrap with the changed values is still a configuration Envoy takes
    // (a port written as a string, the new names): `envoy --mode validate`, the filter loaded.
    let Some(wasm) = wasm_or_skip(test) else {
        return;
    };
    let text = testkit::shipped::render_overlay(&kubectl, &deploy, "standalone")
        .unwrap_or_else(|e| panic!("{e}"));
    let docs: Vec<Doc> = documents(&text, "standalone")
        .into_iter()
        .map(|value| Doc {
            origin: "standalone (changed values)".into(),
            value,
        })
        .collect();
    let bootstraps = envoy_bootstraps(&docs);
    assert_eq!(bootstraps.len(), 1, "the standalone bootstrap");
    let dir = testlog_dir("deploy-values-envoy").unwrap();
    for (origin, bootstrap) in bootstraps {
        assert_eq!(
            pool_clusters(&bootstrap),
            vec!["zeta".to_string()],
            "{origin}"
        );
        validate_with_envoy(&origin, bootstrap, &wasm, &dir);
    }
}

/// The check above has teeth: drop one replacement target (the Istio route's backend) from a
/// copy and the changed pool name no longer reaches that place.
#[test]
fn the_one_declaration_check_finds_a_place_left_behind() {
    let test = "the_one_declaration_check_finds_a_place_left_behind";
    let Some(kubectl) = testkit::shipped::kubectl_or_skip(test) else {
        return;
    };
    let deploy = copy_deploy("deploy-values-broken");
    let file = deploy.join("overlays/istio/kustomization.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let target =
        "fieldPaths: [spec.rules.0.matches.*.headers.0.value, spec.rules.0.backendRefs.0.name]";
    assert!(
        text.contains(target),
        "istio/kustomization.yaml changed: update this test"
    );
    std::fs::write(
        &file,
        text.replacen(
            target,
            "fieldPaths: [spec.rules.0.matches.*.headers.0.value]",
            1,
        ),
    )
    .unwrap();
    let (mismatches, _) = one_declaration_mismatches(&kubectl, &deploy);
    assert!(
        mismatches
            .iter()
            .any(|m| m.contains("istio") && m.contains("backendRefs")),
        "{mismatches:?}"
    );
}

/// The Istio quick start: the values file a user edits stays short (non-comment, non-blank lines).
#[test]
fn the_istio_quick_start_values_file_is_at_most_30_lines() {
    let text = std::fs::read_to_string(deploy_dir().join("values/values.yaml")).unwrap();
    let lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .count();
    assert!(lines <= 30, "values/values.yaml: {lines} lines to write");
    // The overlay itself is not the user's to edit: it names no pool.
    let overlay =
        std::fs::read_to_string(deploy_dir().join("overlays/istio/kustomization.yaml")).unwrap();
    assert!(overlay.contains("../../base") && overlay.contains("../../components/values"));
}
