//! What the artifact tests share: where `./build.sh package`'s inputs and outputs are, and the
//! skip-outside-CI / fail-in-CI rule for missing tools and build products.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use oci_package::{sidecar_image, wasm_image, Image};
use testkit::{filter_wasm, target_dir};

pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// `None` after printing why the test is skipped; panics instead when CI is set.
pub fn skip<T>(test: &str, reason: &str) -> Option<T> {
    if ci() {
        panic!("{test}: CI is set and {reason}");
    }
    eprintln!("SKIPPED {test}: {reason} (set CI=1 to make this a failure)");
    None
}

/// A program on PATH.
pub fn tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The static sidecar binary `./build.sh package` puts in the image.
pub fn sidecar_binary() -> PathBuf {
    target_dir().join("x86_64-unknown-linux-musl/oci/sidecar-metrics")
}

/// The layouts folder of `./build.sh package`.
pub fn package_dir() -> PathBuf {
    target_dir().join("package")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The two images as the current build products make them (filter .wasm, static sidecar), or a
/// reason they are missing.
pub fn images_from_build() -> Result<(Vec<u8>, Image, Vec<u8>, Image), String> {
    let wasm_path = filter_wasm().map_err(|e| e.to_string())?;
    let sidecar_path = sidecar_binary();
    if !sidecar_path.is_file() {
        return Err(format!(
            "the static sidecar {} is missing (run `./build.sh package`)",
            sidecar_path.display()
        ));
    }
    let wasm = read(&wasm_path);
    let sidecar = read(&sidecar_path);
    let filter_image = wasm_image(&wasm).unwrap();
    let sidecar_image = sidecar_image(&sidecar).unwrap();
    Ok((wasm, filter_image, sidecar, sidecar_image))
}
