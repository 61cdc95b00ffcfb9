//! The artifacts users pull, through a real registry: starts Debian's `docker-registry` on
//! loopback (temporary config and storage, stopped by PID), pushes the two OCI layouts of
//! `./build.sh package` with `skopeo`, pulls them back by digest, and checks the bytes — the
//! pulled `plugin.wasm` is the built module and loads in Envoy (`envoy --mode validate` runs the
//! filter's `on_configure`), the pulled sidecar binary runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{images_from_build, package_dir, skip, tool};
use oci_package::{
    read_layout, sha256_digest, FILTER_IMAGE, SIDECAR_FILE, SIDECAR_IMAGE, WASM_FILE,
};
use testkit::{free_port, spawn_and_wait_http, testlog_dir, validate_config, EnvoySpec, Router};

const TEST: &str = "both_images_round_trip_through_a_registry_by_digest";

/// Runs skopeo with no system policy or credentials involved; panics with its output on failure.
fn skopeo(skopeo: &Path, args: &[&str]) -> Vec<u8> {
    let output = Command::new(skopeo)
        .arg("--insecure-policy")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", skopeo.display()));
    assert!(
        output.status.success(),
        "skopeo {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Envoy validates a bootstrap that loads `wasm` as the filter.
fn envoy_validates(wasm: &Path, dir: &Path, name: &str) -> Result<String, String> {
    let spec = EnvoySpec::new(Router::Filter).pool(
        "llama",
        "pool_llama",
        vec!["127.0.0.1:9".parse().unwrap()],
    );
    let bootstrap = spec.bootstrap(wasm, &dir.join("access.log")).unwrap();
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, serde_yaml::to_string(&bootstrap).unwrap()).unwrap();
    validate_config(&file).map_err(|e| e.to_string())
}

#[test]
fn both_images_round_trip_through_a_registry_by_digest() {
    let (Some(registry), Some(skopeo_bin)) = (tool("docker-registry"), tool("skopeo")) else {
        return skip(
            TEST,
            "docker-registry or skopeo is not installed (`./build.sh setup` installs both)",
        )
        .unwrap_or(());
    };
    let (wasm, filter_built, sidecar, sidecar_built) = match images_from_build() {
        Ok(v) => v,
        Err(reason) => return skip(TEST, &reason).unwrap_or(()),
    };
    let layouts = package_dir();
    if !layouts.join(FILTER_IMAGE).join("index.json").is_file() {
        return skip(
            TEST,
            &format!(
                "no OCI layouts in {} (run `./build.sh package`)",
                layouts.display()
            ),
        )
        .unwrap_or(());
    }
    // The layouts on disk are this build's.
    let filter_layout = read_layout(&layouts.join(FILTER_IMAGE)).unwrap();
    let sidecar_layout = read_layout(&layouts.join(SIDECAR_IMAGE)).unwrap();
    assert_eq!(
        (filter_layout.digest(), sidecar_layout.digest()),
        (filter_built.digest(), sidecar_built.digest()),
        "{} is older than the build: run `./build.sh package`",
        layouts.display()
    );

    let dir = testlog_dir("registry").unwrap();
    let storage = dir.join("storage");
    std::fs::create_dir_all(&storage).unwrap();
    let port = free_port().unwrap();
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        ),
    )
    .unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let _registry = spawn_and_wait_http(
        "docker-registry",
        &registry,
        &["serve".to_string(), config.display().to_string()],
        addr,
        "/v2/",
        Duration::from_secs(30),
    )
    .unwrap();

    let mut pulled = Vec::new();
    for (name, layout) in [
        (FILTER_IMAGE, &filter_layout),
        (SIDECAR_IMAGE, &sidecar_layout),
    ] {
        let digest = layout.digest();
        let repo = format!("127.0.0.1:{port}/llm-router/{name}");
        skopeo(
            &skopeo_bin,
            &[
                "copy",
                "--dest-tls-verify=false",
                &format!("oci:{}", layouts.join(name).display()),
                &format!("docker://{repo}:test"),
            ],
        );
        // The registry serves the very manifest bytes whose digest the manifests in envoy/ name.
        let raw = skopeo(
            &skopeo_bin,
            &[
                "inspect",
                "--raw",
                "--tls-verify=false",
                &format!("docker://{repo}@{digest}"),
            ],
        );
        assert_eq!(
            sha256_digest(&raw),
            digest,
            "{name}: manifest served by digest"
        );
        let out: PathBuf = dir.join(format!("pulled-{name}"));
        skopeo(
            &skopeo_bin,
            &[
                "copy",
                "--src-tls-verify=false",
                &format!("docker://{repo}@{digest}"),
                &format!("oci:{}", out.display()),
            ],
        );
        let image = read_layout(&out).unwrap();
        assert_eq!(image.digest(), digest, "{name}: pulled image digest");
        pulled.push(image);
    }

    // The filter: the module bytes are the build's, and Envoy loads them.
    let pulled_wasm = pulled[0].file(WASM_FILE).unwrap();
    assert!(
        pulled_wasm == wasm,
        "pulled plugin.wasm differs from the built module"
    );
    let wasm_file = dir.join(WASM_FILE);
    std::fs::write(&wasm_file, &pulled_wasm).unwrap();
    if let Err(e) = envoy_validates(&wasm_file, &dir, "pulled-wasm") {
        panic!("Envoy rejected the pulled plugin.wasm:\n{e}");
    }
    // ...and the same check rejects a module that is not the filter (it can fail).
    let broken = dir.join("truncated.wasm");
    std::fs::write(&broken, &pulled_wasm[..pulled_wasm.len() / 2]).unwrap();
    assert!(
        envoy_validates(&broken, &dir, "truncated-wasm").is_err(),
        "Envoy accepted a truncated module: the validation proves nothing"
    );

    // The sidecar: the binary is the build's and runs on its own (static, no base image).
    let pulled_sidecar = pulled[1].file(SIDECAR_FILE).unwrap();
    assert!(
        pulled_sidecar == sidecar,
        "pulled sidecar binary differs from the build"
    );
    let bin = dir.join(SIDECAR_FILE);
    std::fs::write(&bin, &pulled_sidecar).unwrap();
    let mut perms = std::fs::metadata(&bin).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&bin, perms).unwrap();
    let output = Command::new(&bin).arg("--version").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("sidecar-metrics "),
        "pulled sidecar --version: {} {stdout} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
