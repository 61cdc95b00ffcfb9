//! The CustomResourceDefinitions kept in `test-harness/fixtures/crds/` and a structural check of
//! objects against their `openAPIV3Schema`: the shipped manifests (`tests/envoy_configs.rs`) and
//! the objects the sidecar's stand-in API server serves (`sidecar-metrics/tests/kube.rs`) are
//! both held to the real schemas.
//!
//! Test support: a fixture that does not parse fails the calling test with its name (hence the
//! panics allowed here).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::shipped::{documents, yaml_files};

/// (apiVersion, kind) of built-in resources the examples may use.
pub const BUILTIN: &[(&str, &str)] = &[
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "Namespace"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
];

/// (group, kind) → version name → (served, openAPIV3Schema).
pub type Crds = BTreeMap<(String, String), BTreeMap<String, (bool, Value)>>;

/// The CRD schemas kept in the repository (`test-harness/fixtures/crds`); a missing folder fails
/// the calling test and names the path.
pub fn crds_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/crds"));
    assert!(
        dir.is_dir(),
        "CRD fixtures missing: {} (part of the repository; is the checkout complete?)",
        dir.display()
    );
    dir
}

/// Every CRD in the YAML files under `dir`.
pub fn load_crds(dir: &Path) -> Crds {
    let mut crds = Crds::new();
    for file in yaml_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in documents(&text, &file.display().to_string()) {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = doc["spec"]["group"].as_str().unwrap().to_string();
            let kind = doc["spec"]["names"]["kind"].as_str().unwrap().to_string();
            let versions = crds.entry((group, kind)).or_default();
            for v in doc["spec"]["versions"].as_array().unwrap() {
                versions.insert(
                    v["name"].as_str().unwrap().to_string(),
                    (v["served"] == true, v["schema"]["openAPIV3Schema"].clone()),
                );
            }
        }
    }
    crds
}

/// Structural check of `value` against an OpenAPI v3 schema as CRDs use it: unknown fields,
/// types, enums, required fields, item, property and length counts, integer bounds (no CEL
/// rules, no patterns).
pub fn check_schema(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            errors.push(format!("{path}: expected int or string, got {value}"));
        }
        return;
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(value) {
            errors.push(format!("{path}: {value} is not one of {options:?}"));
        }
    }
    // An object schema without `properties` (e.g. `metadata`) constrains nothing inside.
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true
        || schema.get("properties").is_none();
    let count = |n: usize, what: &str, noun: &str, errors: &mut Vec<String>| {
        if let Some(max) = schema[format!("max{what}")].as_u64() {
            if n as u64 > max {
                errors.push(format!("{path}: more than {max} {noun}"));
            }
        }
        if let Some(min) = schema[format!("min{what}")].as_u64() {
            if (n as u64) < min {
                errors.push(format!("{path}: fewer than {min} {noun}"));
            }
        }
    };
    match schema["type"].as_str() {
        Some("object") => {
            let Some(map) = value.as_object() else {
                errors.push(format!("{path}: expected an object, got {value}"));
                return;
            };
            count(map.len(), "Properties", "properties", errors);
            for required in schema["required"].as_array().into_iter().flatten() {
                let key = required.as_str().unwrap_or_default();
                if !map.contains_key(key) {
                    errors.push(format!("{path}: required field `{key}` missing"));
                }
            }
            for (key, child) in map {
                let child_path = format!("{path}.{key}");
                if let Some(prop) = schema["properties"].get(key) {
                    check_schema(child, prop, &child_path, errors);
                } else if schema["additionalProperties"].is_object() {
                    check_schema(child, &schema["additionalProperties"], &child_path, errors);
                } else if !(preserve || schema["additionalProperties"] == true) {
                    errors.push(format!("{child_path}: unknown field"));
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                errors.push(format!("{path}: expected an array, got {value}"));
                return;
            };
            count(items.len(), "Items", "items", errors);
            for (i, item) in items.iter().enumerate() {
                check_schema(item, &schema["items"], &format!("{path}[{i}]"), errors);
            }
        }
        Some("string") => match value.as_str() {
            Some(s) => count(s.chars().count(), "Length", "characters", errors),
            None => errors.push(format!("{path}: expected a string, got {value}")),
        },
        Some("integer") => match value.as_i64() {
            Some(n) => {
                if let Some(max) = schema["maximum"].as_i64() {
                    if n > max {
                        errors.push(format!("{path}: {n} is above the maximum {max}"));
                    }
                }
                if let Some(min) = schema["minimum"].as_i64() {
                    if n < min {
                        errors.push(format!("{path}: {n} is below the minimum {min}"));
                    }
                }
            }
            None if value.is_u64() => {}
            None => errors.push(format!("{path}: expected an integer, got {value}")),
        },
        Some("number") if !value.is_number() => {
            errors.push(format!("{path}: expected a number, got {value}"))
        }
        Some("boolean") if !value.is_boolean() => {
            errors.push(format!("{path}: expected a boolean, got {value}"))
        }
        _ => {}
    }
}

/// Errors of one manifest: unknown kind/apiVersion, or schema violations.
pub fn check_manifest(doc: &Value, crds: &Crds) -> Vec<String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let mut errors = Vec::new();
    if doc["metadata"]["name"].as_str().is_none_or(str::is_empty) {
        errors.push("metadata.name missing".to_string());
    }
    if BUILTIN.contains(&(api_version, kind)) {
        return errors;
    }
    let Some((group, version)) = api_version.split_once('/') else {
        errors.push(format!("{api_version} {kind}: not a known built-in kind"));
        return errors;
    };
    let Some(versions) = crds.get(&(group.to_string(), kind.to_string())) else {
        errors.push(format!(
            "{kind} in group {group}: no such CRD in the fixtures"
        ));
        return errors;
    };
    match versions.get(version) {
        Some((true, schema)) => {
            // apiVersion, kind and metadata are implicit in every CRD (Istio's schemas omit them).
            let mut body = doc.clone();
            if let Some(map) = body.as_object_mut() {
                for key in ["apiVersion", "kind", "metadata"] {
                    map.remove(key);
                }
            }
            check_schema(&body, schema, kind, &mut errors)
        }
        Some((false, _)) => errors.push(format!("{api_version} {kind}: version not served")),
        None => errors.push(format!(
            "{api_version} {kind}: no version {version} (have {:?})",
            versions.keys().collect::<Vec<_>>()
        )),
    }
    errors
}
