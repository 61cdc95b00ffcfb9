//! The core Kubernetes kinds the overlays of `envoy/deploy` render (Deployment, Service,
//! ConfigMap, NetworkPolicy, RBAC, …)
//! against Kubernetes' own OpenAPI schemas, with `kubernetes-validate --strict` (PyPI, installed
//! into `.venv` by `./build.sh setup`): unknown fields, wrong types and missing required fields
//! fail. The strategic-merge patch for Istio's gateway Deployment is checked as the Deployment
//! it patches into. Custom resources are checked against their CRDs by `envoy_configs.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use testkit::shipped::example_docs_or_skip;
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

/// The core-kind documents the project ships as (origin, manifest): the overlays of
/// `envoy/deploy` as `kubectl kustomize` renders them (`testkit::shipped::example_docs_or_skip`;
/// `None` skips). The Deployment patch that Istio merges into the gateway it creates (the
/// `deployment` entry of a ConfigMap a Gateway names in `infrastructure.parametersRef`) becomes
/// the Deployment it patches into.
fn core_manifests(test: &str) -> Option<Vec<(String, Value)>> {
    let docs = example_docs_or_skip(test)?;
    let mut out = Vec::new();
    for doc in docs {
        let (origin, value) = (doc.origin, doc.value);
        if value.get("static_resources").is_some() {
            continue;
        }
        match value["apiVersion"].as_str() {
            Some(v) if is_core(v) => {
                if value["kind"] == "ConfigMap" {
                    if let Some(text) = value["data"]["deployment"].as_str() {
                        let patch: Value = serde_yaml::from_str(text)
                            .unwrap_or_else(|e| panic!("{origin} data.deployment: {e}"));
                        out.push((
                            format!("{origin} data.deployment"),
                            patched_deployment(&patch),
                        ));
                    }
                }
                out.push((origin, value));
            }
            Some(_) => {}
            None => panic!("{origin}: not a manifest"),
        }
    }
    Some(out)
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
    let Some(manifests) = core_manifests(test) else {
        return;
    };
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
    let Some(manifests) = core_manifests(test) else {
        return;
    };
    let (_, deployment) = manifests
        .into_iter()
        .find(|(o, m)| m["kind"] == "Deployment" && !o.contains("data.deployment"))
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
