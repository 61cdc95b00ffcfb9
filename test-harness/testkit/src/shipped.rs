//! The configurations the project ships under `envoy/`, read as the tests need them: every YAML
//! document (files and ConfigMap entries), the plain Envoy bootstraps among them, the Wasm filter
//! configs inside, and [`localize`] + [`start_shipped`] to run a shipped bootstrap for real on
//! loopback — its routes, listeners' settings and plugin configuration untouched, only addresses,
//! ports, the module path and the access log replaced.
//!
//! Test support: a shipped file that does not parse fails the calling test with its name (hence
//! the panics allowed here).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::envoy::{access_log_config, EnvoyProcess};
use crate::error::Result;
use crate::paths::{envoy_binary, testlog_dir, workspace_root};
use crate::process::ChildGuard;

/// The `@type` of the Wasm HTTP filter's config.
pub const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// Every YAML file under `dir`, sorted, recursively.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Every YAML document of a text, as JSON values (empty documents dropped).
pub fn documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            let yaml = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{origin}: YAML: {e}"));
            serde_json::to_value(yaml).unwrap_or_else(|e| panic!("{origin}: not JSON-like: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// One YAML document found under `envoy/`, with where it came from.
#[derive(Debug, Clone)]
pub struct Doc {
    /// `envoy/<file>#<index>`.
    pub origin: String,
    /// The document as JSON.
    pub value: Value,
}

/// The overlays under `envoy/deploy/overlays`, each rendered by `kubectl kustomize` from the one
/// values file `envoy/deploy/values/values.yaml`.
pub const OVERLAYS: [&str; 3] = ["istio", "envoy-gateway", "standalone"];

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// `kubectl` (its built-in kustomize renders `envoy/deploy`): `$KUBECTL`, else `kubectl` on the
/// `PATH`; `None` when neither runs.
pub fn kubectl() -> Option<PathBuf> {
    let bin = std::env::var_os("KUBECTL")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let ok = Command::new(&bin)
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(bin)
}

/// Why a test that needs `kubectl` cannot run.
pub const NO_KUBECTL: &str = "kubectl is not installed (or $KUBECTL does not run): the Kubernetes \
    manifests are rendered from envoy/deploy with `kubectl kustomize`";

/// `kubectl`, or `None` (the caller skips, with a message) when missing outside CI; in CI a
/// missing `kubectl` fails the test.
pub fn kubectl_or_skip(test: &str) -> Option<PathBuf> {
    match kubectl() {
        Some(bin) => Some(bin),
        None if ci() => panic!("{test}: CI is set and {NO_KUBECTL}"),
        None => {
            eprintln!("SKIPPED {test}: {NO_KUBECTL} (set CI=1 to make this a failure)");
            None
        }
    }
}

/// `kubectl kustomize <deploy>/overlays/<overlay>`: the rendered YAML, or kubectl's error.
pub fn render_overlay(
    kubectl: &Path,
    deploy: &Path,
    overlay: &str,
) -> std::result::Result<String, String> {
    let dir = deploy.join("overlays").join(overlay);
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .map_err(|e| format!("{}: {e}", kubectl.display()))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// The documents of every overlay of `<deploy>` as rendered, origin
/// `envoy/deploy/overlays/<overlay>#<index>`; a render that fails panics with kubectl's error.
pub fn rendered_docs(kubectl: &Path, deploy: &Path) -> Vec<Doc> {
    let mut docs = Vec::new();
    for overlay in OVERLAYS {
        let text = render_overlay(kubectl, deploy, overlay).unwrap_or_else(|e| panic!("{e}"));
        let rel = format!("envoy/deploy/overlays/{overlay}");
        for (i, value) in documents(&text, &rel).into_iter().enumerate() {
            docs.push(Doc {
                origin: format!("{rel}#{i}"),
                value,
            });
        }
    }
    docs
}

/// What the project ships for users to run: the plain Envoy files of `envoy/` (origin
/// `envoy/<file>#<index>`) and the Kubernetes manifests as the overlays of `envoy/deploy` render
/// them (origin `envoy/deploy/overlays/<overlay>#<index>`, see [`rendered_docs`]). `None` (the
/// caller skips, with a message) when `kubectl` is missing outside CI.
pub fn example_docs_or_skip(test: &str) -> Option<Vec<Doc>> {
    let kubectl = kubectl_or_skip(test)?;
    Some(example_docs_with(&kubectl))
}

/// [`example_docs_or_skip`], for callers that cannot run without them: panics when `kubectl`
/// is missing.
pub fn example_docs() -> Vec<Doc> {
    let kubectl = kubectl().unwrap_or_else(|| panic!("{NO_KUBECTL}"));
    example_docs_with(&kubectl)
}

fn example_docs_with(kubectl: &Path) -> Vec<Doc> {
    let root = workspace_root().join("envoy");
    let mut docs = Vec::new();
    // Prometheus' configuration is neither Envoy nor Kubernetes: `promtool check config` checks it
    // (test-harness/e2e/tests/prometheus.rs).
    let observability = root.join("observability");
    // The identity chain is a fragment to merge into a bootstrap, neither a bootstrap nor a
    // manifest: `testkit::Identity` loads it, testkit/tests/envoy_configs.rs validates it in a
    // bootstrap and test-harness/e2e/tests/identity.rs runs it.
    let identity = root.join("identity");
    // The kustomize sources: what ships from there is what the overlays render, below.
    let deploy = root.join("deploy");
    for file in yaml_files(&root) {
        if file.starts_with(&observability)
            || file.starts_with(&identity)
            || file.starts_with(&deploy)
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file
            .strip_prefix(workspace_root())
            .unwrap()
            .display()
            .to_string();
        for (i, value) in documents(&text, &rel).into_iter().enumerate() {
            docs.push(Doc {
                origin: format!("{rel}#{i}"),
                value,
            });
        }
    }
    docs.extend(rendered_docs(kubectl, &deploy));
    assert!(
        docs.len() >= 10,
        "expected the example manifests, found {} documents",
        docs.len()
    );
    docs
}

/// Plain Envoy bootstraps: whole files, and ConfigMap entries that are bootstraps.
pub fn envoy_bootstraps(docs: &[Doc]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for doc in docs {
        if doc.value.get("static_resources").is_some() {
            out.push((doc.origin.clone(), doc.value.clone()));
        }
        if doc.value["kind"] == "ConfigMap" {
            for (key, text) in doc.value["data"].as_object().into_iter().flatten() {
                let origin = format!("{} data.{key}", doc.origin);
                for inner in documents(text.as_str().unwrap_or_default(), &origin) {
                    if inner.get("static_resources").is_some() {
                        out.push((origin.clone(), inner));
                    }
                }
            }
        }
    }
    out
}

/// Replaces every string ending in `llm_router_filter.wasm` by the real module path, and every
/// Wasm `code` that pulls the filter image by `oci://` (Istio's agent turns that into a local file
/// before Envoy sees it) by a local file with the real module.
pub fn substitute_wasm(value: &mut Value, wasm: &Path) {
    let pulls_oci = value
        .get("remote")
        .and_then(|r| r["http_uri"]["uri"].as_str())
        .is_some_and(|uri| uri.starts_with("oci://"));
    if pulls_oci {
        *value = json!({"local": {"filename": wasm.display().to_string()}});
        return;
    }
    match value {
        Value::String(s) if s.ends_with("llm_router_filter.wasm") => {
            *s = wasm.display().to_string()
        }
        Value::Array(items) => items.iter_mut().for_each(|v| substitute_wasm(v, wasm)),
        Value::Object(map) => map.values_mut().for_each(|v| substitute_wasm(v, wasm)),
        _ => {}
    }
}

/// Every Wasm filter config (the `config` of a `...wasm.v3.Wasm` typed_config) in a value.
pub fn wasm_configs(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str) == Some(WASM_TYPE) {
                out.push(map.get("config").cloned().unwrap_or(Value::Null));
            }
            map.values().for_each(|v| wasm_configs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| wasm_configs(v, out)),
        _ => {}
    }
}

/// The plugin configuration (parsed) of a Wasm filter config.
pub fn plugin_of(config: &Value) -> Value {
    serde_json::from_str(config["configuration"]["value"].as_str().unwrap_or("{}"))
        .unwrap_or(Value::Null)
}

/// Whether this filter copy serves the snapshot push and state paths.
pub fn endpoints_on(config: &Value) -> bool {
    plugin_of(config)["snapshot"]["endpoints"] == json!(true)
}

/// Every Envoy listener (an object with `address` and `filter_chains`) inside a value.
pub fn listeners(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("address") && map.contains_key("filter_chains") {
                out.push(value.clone());
            }
            map.values().for_each(|v| listeners(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| listeners(v, out)),
        _ => {}
    }
}

/// Replaces the plugin configuration string of every Wasm filter config in a value.
pub fn set_plugin_config(value: &mut Value, text: &str) {
    match value {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str) == Some(WASM_TYPE) {
                if let Some(config) = map.get_mut("config") {
                    config["configuration"]["value"] = json!(text);
                }
            }
            map.values_mut().for_each(|v| set_plugin_config(v, text));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| set_plugin_config(v, text)),
        _ => {}
    }
}

/// The clusters that are model pools: those whose load-balancing policy is `override_host`.
pub fn pool_clusters(bootstrap: &Value) -> Vec<String> {
    bootstrap["static_resources"]["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"]
                == "envoy.load_balancing_policies.override_host"
        })
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

/// A shipped bootstrap made runnable here, every setting that decides what a request meets kept:
/// listeners and the admin API on 127.0.0.1 with ports Envoy picks (names kept); each pool
/// cluster (see [`pool_clusters`]) STATIC on `pods[cluster]`; other clusters (local ones, such
/// as the admin or the sidecar behind an ops listener) untouched; the module at `wasm`; and every
/// HTTP connection manager's access log replaced by testkit's JSON file log at `access_log`.
pub fn localize(
    mut bootstrap: Value,
    wasm: &Path,
    pods: &BTreeMap<String, Vec<SocketAddr>>,
    access_log: &Path,
) -> Value {
    substitute_wasm(&mut bootstrap, wasm);
    bootstrap["admin"]["address"] =
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}});
    let pools = pool_clusters(&bootstrap);
    for l in bootstrap["static_resources"]["listeners"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        l["address"] = json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}});
        for chain in l["filter_chains"].as_array_mut().into_iter().flatten() {
            for f in chain["filters"].as_array_mut().into_iter().flatten() {
                if f["typed_config"].get("route_config").is_some() {
                    f["typed_config"]["access_log"] = json!([access_log_config(access_log)]);
                }
            }
        }
    }
    for c in bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        if !pools.contains(&name) {
            continue;
        }
        let endpoints: Vec<Value> = pods
            .get(&name)
            .unwrap_or_else(|| panic!("no pods given for pool cluster {name}"))
            .iter()
            .map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}}}}))
            .collect();
        c["type"] = json!("STATIC");
        if let Some(obj) = c.as_object_mut() {
            obj.remove("dns_lookup_family");
        }
        c["load_assignment"] =
            json!({"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]});
    }
    bootstrap
}

/// Starts Envoy on a bootstrap (e.g. from [`localize`]) with `env` added to its environment, and
/// waits until it serves (as [`crate::EnvoySpec::start_blocking`] does). The listeners named
/// `llm_router` and `llm_router_internal` become the process' public and internal addresses.
pub fn start_shipped(
    name: &str,
    bootstrap: &Value,
    env: &[(&str, &str)],
    concurrency: u32,
) -> Result<EnvoyProcess> {
    let dir = testlog_dir(name)?;
    let config_path = dir.join("envoy.yaml");
    let yaml = serde_yaml::to_string(bootstrap).map_err(|e| crate::Error::Format {
        what: "shipped bootstrap YAML".into(),
        reason: e.to_string(),
    })?;
    std::fs::write(&config_path, yaml).map_err(|e| crate::Error::io("write", &config_path, e))?;
    let log_path = dir.join("envoy.log");
    let admin_address_path = dir.join("admin-address.txt");
    let mut cmd = Command::new(envoy_binary()?);
    cmd.arg("-c")
        .arg(&config_path)
        .arg("--concurrency")
        .arg(concurrency.max(1).to_string())
        .arg("--disable-hot-restart")
        .arg("--log-level")
        .arg("warning")
        .arg("--admin-address-path")
        .arg(&admin_address_path)
        .arg("--file-flush-interval-msec")
        .arg("50");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let guard = ChildGuard::spawn_logged(name, cmd, &log_path)?;
    let mut process = EnvoyProcess {
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        internal_addr: None,
        admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        guard,
        access_log_path: dir.join("access.log"),
        dir,
        config_path,
        log_path,
    };
    process.wait_ready(&admin_address_path, std::time::Duration::from_secs(30))?;
    Ok(process)
}

/// The address Envoy reports for the listener `name` of a running process.
pub fn listener_addr(envoy: &EnvoyProcess, name: &str) -> Option<SocketAddr> {
    let (_, text) = envoy.admin_get("/listeners?format=json").ok()?;
    crate::envoy::listener_address(&text, name)
}

/// Where the repository's `envoy/` folder is.
pub fn envoy_dir() -> PathBuf {
    workspace_root().join("envoy")
}
