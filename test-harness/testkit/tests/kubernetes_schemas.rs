//! The core Kubernetes kinds in `envoy/` (Deployment, Service, ConfigMap, NetworkPolicy, RBAC, …)
//! against Kubernetes' own OpenAPI schemas, with `kubernetes-validate --strict` (PyPI, installed
//! into `.venv` by `./build.sh setup`): unknown fields, wrong types and missing required fields
//! fail. The strategic-merge patch for controller-made gateways is checked as the Deployment it
//! patches into. Custom resources are checked against their CRDs by `envoy_configs.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{json, Value};
use testkit::{testlog_dir, workspace_root};

/// The Kubernetes version whose schemas the manifests must satisfy (the oldest one the examples
/// target: Istio 1.28 and Envoy Gateway 1.5 support it).
const KUBERNETES_VERSION: &str = "1.33.0";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// `.venv/bin/kubernetes-validate`, else one on PATH; `None` (skip) outside CI when missing.
fn validator(test: &str) -> Option<PathBuf> {
    let venv = workspace_root().join(".venv/bin/kubernetes-validate");
    let found = if venv.is_file() {
        Some(venv)
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kubernetes-validate"))
                .find(|p| p.is_file())
        })
    };
    if found.is_none() {
        let reason = "kubernetes-validate is not installed (`./build.sh setup` puts it in .venv)";
        assert!(!ci(), "{test}: CI is set and {reason}");
        eprintln!("SKIPPED {test}: {reason} (set CI=1 to make this a failure)");
    }
    found
}

/// Built-in API groups (no dot, or a `*.k8s.io` group that is not Gateway API's).
fn is_core(api_version: &str) -> bool {
    match api_version.split_once('/') {
        None => !api_version.is_empty(),
        Some((group, _)) => {
            !group.contains('.') || (group.ends_with(".k8s.io") && !group.starts_with("gateway."))
        }
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// The core-kind documents of `envoy/` as (origin, manifest); kind-less patches become the
/// Deployment they patch into.
fn core_manifests() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&workspace_root().join("envoy"), &mut files);
    // Prometheus' configuration is not Kubernetes (promtool checks it: e2e/tests/prometheus.rs).
    files.retain(|f| !f.starts_with(workspace_root().join("envoy/observability")));
    // An Envoy filter-chain fragment (checked by `envoy --mode validate` in envoy_configs.rs).
    files.retain(|f| !f.starts_with(workspace_root().join("envoy/identity")));
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(workspace_root())
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: {e}"));
            if value.is_null() || value.get("static_resources").is_some() {
                continue;
            }
            let origin = format!("{rel}#{i}");
            match value["apiVersion"].as_str() {
                Some(v) if is_core(v) => out.push((origin, value)),
                Some(_) => {}
                None if value["spec"]["template"]["spec"].is_object() => {
                    out.push((origin, patched_deployment(&value)))
                }
                None => panic!("{origin}: neither a manifest nor a Deployment patch"),
            }
        }
    }
    out
}

/// A minimal Deployment with `patch` merged in: what a strategic-merge patch of a Deployment's
/// pod template must itself satisfy.
fn patched_deployment(patch: &Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "patched-gateway"},
        "spec": {
            "selector": {"matchLabels": {"app": "gateway"}},
            "template": {
                "metadata": {"labels": {"app": "gateway"}},
                "spec": patch["spec"]["template"]["spec"],
            },
        },
    })
}

/// Runs the validator on each manifest (one file each); returns the failures' output lines.
fn validate(validator: &Path, manifests: &[(String, Value)], dir: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, (origin, manifest)) in manifests.iter().enumerate() {
        let file = dir.join(format!("{i}.yaml"));
        std::fs::write(&file, serde_yaml::to_string(manifest).unwrap()).unwrap();
        let output = Command::new(validator)
            .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", validator.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // Success means a schema was found and passed (a missing schema is only a warning).
        if !output.status.success() || !text.contains("passed") {
            failures.push(format!("{origin}: {}", text.trim()));
        }
    }
    failures
}

#[test]
fn core_kubernetes_kinds_match_kubernetes_schemas() {
    let test = "core_kubernetes_kinds_match_kubernetes_schemas";
    let Some(validator) = validator(test) else {
        return;
    };
    let manifests = core_manifests();
    let kinds: Vec<&str> = manifests
        .iter()
        .filter_map(|(_, m)| m["kind"].as_str())
        .collect();
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "NetworkPolicy",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(&kind), "no {kind} among {kinds:?}");
    }
    let dir = testlog_dir("kubernetes-validate").unwrap();
    let failures = validate(&validator, &manifests, &dir);
    assert!(
        failures.is_empty(),
        "manifests in envoy/ fail Kubernetes {KUBERNETES_VERSION} schemas:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_kubernetes_schema_check_rejects_bad_manifests() {
    let test = "the_kubernetes_schema_check_rejects_bad_manifests";
    let Some(validator) = validator(test) else {
        return;
    };
    let (_, deployment) = core_manifests()
        .into_iter()
        .find(|(o, m)| m["kind"] == "Deployment" && !o.contains("patch"))
        .unwrap();
    let mut unknown_field = deployment.clone();
    unknown_field["spec"]["replica"] = json!(2);
    let mut wrong_type = deployment.clone();
    wrong_type["spec"]["replicas"] = json!("two");
    let mut missing_required = deployment.clone();
    missing_required["spec"]
        .as_object_mut()
        .unwrap()
        .remove("selector");
    let mut bad_container = deployment;
    bad_container["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!(7);
    let bad = vec![
        ("unknown field".to_string(), unknown_field),
        ("wrong type".to_string(), wrong_type),
        ("missing selector".to_string(), missing_required),
        ("bad container field".to_string(), bad_container),
    ];
    let dir = testlog_dir("kubernetes-validate-bad").unwrap();
    let failures = validate(&validator, &bad, &dir);
    assert_eq!(
        failures.len(),
        bad.len(),
        "some bad manifests passed: {failures:#?}"
    );
}
