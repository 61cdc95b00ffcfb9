//! Keeps the manifests in `envoy/` in step with the build: every `<image>@sha256:` reference
//! names the digest in `envoy/artifacts.lock` (and Envoy's `remote.sha256` beside an `oci://`
//! filter URI repeats it), and the lock names the images the current filter module and sidecar
//! binary make. The filter's digest changes with every change to filter code, so such a change
//! needs `./build.sh package` and a commit of `envoy/`; this test says so when it was forgotten.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{images_from_build, skip};
use oci_package::{parse_lock, references, FILTER_IMAGE, SIDECAR_IMAGE};
use serde_json::Value;
use testkit::workspace_root;

const FIX: &str = "run `./build.sh package` and commit envoy/ (artifacts.lock and the manifests)";

fn lock() -> BTreeMap<String, String> {
    let path = workspace_root().join("envoy/artifacts.lock");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} ({FIX})", path.display()));
    let entries: BTreeMap<String, String> = parse_lock(&text).unwrap().into_iter().collect();
    for name in [FILTER_IMAGE, SIDECAR_IMAGE] {
        assert!(
            entries.contains_key(name),
            "{}: no {name} ({FIX})",
            path.display()
        );
    }
    entries
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

/// Every `code.remote` block (Envoy's RemoteDataSource) in a YAML value.
fn remote_sources(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            if let Some(remote) = map.get("remote") {
                out.push(remote.clone());
            }
            map.values().for_each(|v| remote_sources(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| remote_sources(v, out)),
        Value::String(s) if s.contains("static_resources") => {
            // A bootstrap inside a ConfigMap.
            if let Ok(inner) = serde_yaml::from_str::<Value>(s) {
                remote_sources(&inner, out);
            }
        }
        _ => {}
    }
}

#[test]
fn manifests_reference_the_locked_digests() {
    let lock = lock();
    let mut files = Vec::new();
    yaml_files(&workspace_root().join("envoy"), &mut files);
    files.sort();
    let mut found: BTreeMap<&str, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(workspace_root()).unwrap().display();
        for (name, digest) in &lock {
            for reference in references(&text, name) {
                *found.entry(name.as_str()).or_default() += 1;
                if &reference != digest {
                    errors.push(format!("{rel}: {name}@{reference}, the lock has {digest}"));
                }
            }
        }
        if text.contains("sidecar-metrics:latest") {
            errors.push(format!(
                "{rel}: `sidecar-metrics:latest` instead of a digest"
            ));
        }
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).unwrap();
            let mut remotes = Vec::new();
            remote_sources(&value, &mut remotes);
            for remote in remotes {
                let uri = remote["http_uri"]["uri"].as_str().unwrap_or_default();
                let Some(reference) = references(uri, FILTER_IMAGE).pop() else {
                    continue;
                };
                let hex = reference.trim_start_matches("sha256:");
                if remote["sha256"].as_str() != Some(hex) {
                    errors.push(format!(
                        "{rel}: remote.sha256 {} is not the digest of {uri}",
                        remote["sha256"]
                    ));
                }
            }
        }
    }
    assert!(errors.is_empty(), "{}\n({FIX})", errors.join("\n"));
    // The filter is referenced (Istio's EnvoyFilter) and so is the sidecar image (Deployments).
    for name in [FILTER_IMAGE, SIDECAR_IMAGE] {
        assert!(
            found.get(name).is_some_and(|n| *n > 0),
            "no {name}@sha256: in envoy/: {found:?}"
        );
    }
}

#[test]
fn the_lock_names_the_images_of_this_build() {
    let lock = lock();
    let (_, filter, _, sidecar) = match images_from_build() {
        Ok(v) => v,
        Err(reason) => {
            return skip("the_lock_names_the_images_of_this_build", &reason).unwrap_or(())
        }
    };
    let built: BTreeMap<String, String> = [
        (FILTER_IMAGE.to_string(), filter.digest()),
        (SIDECAR_IMAGE.to_string(), sidecar.digest()),
    ]
    .into();
    assert_eq!(
        lock, built,
        "envoy/artifacts.lock (left) does not name the images this build makes (right): {FIX}"
    );
}

/// `./build.sh package` on a machine without `wasm-opt` (and without a way to install it) stops
/// before building, instead of packaging an unoptimised module and rewriting the lock to a digest
/// CI never builds. Runs build.sh with a PATH that holds only the few tools it needs to reach
/// that check (no cargo, no wasm-opt, no apt-get), so nothing is built.
#[test]
fn package_refuses_without_wasm_opt() {
    let root = workspace_root();
    let bin = std::env::temp_dir().join(format!("llmr-no-wasm-opt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "dirname", "id", "mktemp"] {
        let Some(found) = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
        else {
            continue;
        };
        std::os::unix::fs::symlink(found, bin.as_path().join(tool)).unwrap();
    }
    let lock_before = std::fs::read(root.join("envoy/artifacts.lock")).unwrap();
    let out = std::process::Command::new(bin.as_path().join("bash"))
        .arg(root.join("build.sh"))
        .arg("package")
        .env_clear()
        .env("PATH", bin.as_path())
        .env("HOME", bin.as_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "package succeeded without wasm-opt");
    assert!(
        stderr.contains("package: wasm-opt not found"),
        "expected the refusal, got: {stderr}"
    );
    assert_eq!(
        std::fs::read(root.join("envoy/artifacts.lock")).unwrap(),
        lock_before,
        "the lock changed"
    );
    let _ = std::fs::remove_dir_all(&bin);
}
