//! The two artifacts users pull, as OCI image layouts written byte for byte reproducibly, so the
//! digests committed in `envoy/artifacts.lock` (and referenced by the manifests in `envoy/`) are
//! a function of the built `.wasm` and sidecar binary only:
//!
//! - the filter: a Wasm image in the "compat" variant of the Wasm OCI image format — a plain OCI
//!   image (config `application/vnd.oci.image.config.v1+json`) with exactly one
//!   `application/vnd.oci.image.layer.v1.tar+gzip` layer holding `plugin.wasm`. Istio's
//!   `WasmPlugin`/ECDS fetcher and Envoy Gateway's `EnvoyExtensionPolicy` (which reuses Istio's
//!   fetcher) both accept it, and every registry and client handles it because it is an ordinary
//!   image (the `application/vnd.module.wasm.*` media types of the other variant are not stored
//!   by every registry, nor copied by every client);
//! - the sidecar: a container image with no base, one layer holding the static `sidecar-metrics`
//!   binary, entrypoint `/sidecar-metrics`, run as a non-root user.
//!
//! Reproducible: tar entries in a fixed order with mtime 0, uid/gid 0 and fixed modes; gzip with
//! mtime 0, no file name and a fixed level; JSON with sorted keys and no timestamps.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::Path;

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// Repository name of the filter image (and its key in `envoy/artifacts.lock`).
pub const FILTER_IMAGE: &str = "llm-router-filter";
/// Repository name of the sidecar image (and its key in `envoy/artifacts.lock`).
pub const SIDECAR_IMAGE: &str = "sidecar-metrics";
/// The file name Istio and Envoy Gateway look for in a compat-variant Wasm image.
pub const WASM_FILE: &str = "plugin.wasm";
/// The sidecar binary inside its image (at the root).
pub const SIDECAR_FILE: &str = "sidecar-metrics";

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation that marks a Wasm image of the compat variant.
pub const WASM_VARIANT_ANNOTATION: &str = "module.wasm.image/variant";
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// One content-addressed blob (manifest, config or layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub media_type: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    fn new(media_type: &str, bytes: Vec<u8>) -> Self {
        Blob {
            media_type: media_type.to_string(),
            bytes,
        }
    }

    pub fn digest(&self) -> String {
        sha256_digest(&self.bytes)
    }

    /// The OCI descriptor pointing at this blob.
    pub fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest(), "size": self.bytes.len()})
    }
}

/// One image: its manifest, config and layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub manifest: Blob,
    pub config: Blob,
    pub layers: Vec<Blob>,
}

impl Image {
    /// The image's digest: the digest of its manifest (what `@sha256:...` references name).
    pub fn digest(&self) -> String {
        self.manifest.digest()
    }

    /// The content of the file `name` in the image's layers (the last layer holding it wins).
    pub fn file(&self, name: &str) -> Result<Vec<u8>> {
        let mut found = None;
        for layer in &self.layers {
            if let Some(bytes) = file_in_layer(&layer.bytes, name)? {
                found = Some(bytes);
            }
        }
        found.ok_or_else(|| anyhow!("no file `{name}` in the image's layers"))
    }
}

/// A gzip-compressed tar of `files` (path, content, mode), and the digest of the uncompressed
/// tar (the layer's `diff_id`).
fn layer(files: &[(&str, &[u8], u32)]) -> Result<(Vec<u8>, String)> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder
            .append_data(&mut header, path, *data)
            .with_context(|| format!("tar entry {path}"))?;
    }
    let tar = builder.into_inner().context("finish tar")?;
    let diff_id = sha256_digest(&tar);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::new(9));
    gz.write_all(&tar).context("gzip")?;
    Ok((gz.finish().context("gzip")?, diff_id))
}

fn to_json_bytes(value: &Value) -> Result<Vec<u8>> {
    // serde_json's default map keeps keys sorted, so the bytes depend on the content only.
    serde_json::to_vec(value).context("serialize JSON")
}

fn image(config: Value, layer_files: &[(&str, &[u8], u32)], annotations: Value) -> Result<Image> {
    let (layer_bytes, diff_id) = layer(layer_files)?;
    let mut config = config;
    config["rootfs"] = json!({"type": "layers", "diff_ids": [diff_id]});
    let config = Blob::new(CONFIG_MEDIA_TYPE, to_json_bytes(&config)?);
    let layer = Blob::new(LAYER_MEDIA_TYPE, layer_bytes);
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config.descriptor(),
        "layers": [layer.descriptor()],
    });
    if annotations.as_object().is_some_and(|m| !m.is_empty()) {
        manifest["annotations"] = annotations;
    }
    Ok(Image {
        manifest: Blob::new(MANIFEST_MEDIA_TYPE, to_json_bytes(&manifest)?),
        config,
        layers: vec![layer],
    })
}

/// The filter as a compat-variant Wasm image: one layer, `plugin.wasm` at its root.
pub fn wasm_image(wasm: &[u8]) -> Result<Image> {
    if !wasm.starts_with(b"\0asm") {
        bail!("not a WebAssembly module (no \\0asm magic)");
    }
    image(
        json!({"architecture": "wasm", "os": "wasip1", "config": {}}),
        &[(WASM_FILE, wasm, 0o444)],
        json!({WASM_VARIANT_ANNOTATION: "compat"}),
    )
}

/// The sidecar as a container image with no base: one layer, the static binary at the root.
pub fn sidecar_image(binary: &[u8]) -> Result<Image> {
    if !binary.starts_with(b"\x7fELF") {
        bail!("the sidecar binary is not an ELF executable");
    }
    image(
        json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": [format!("/{SIDECAR_FILE}")],
                "User": "65532:65532",
                "WorkingDir": "/",
            },
        }),
        &[(SIDECAR_FILE, binary, 0o555)],
        json!({}),
    )
}

/// Writes `image` as an OCI image layout in `dir` (replaced if it exists), tagged `tag`.
pub fn write_layout(image: &Image, dir: &Path, tag: &str) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    let blobs = dir.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).with_context(|| format!("create {}", blobs.display()))?;
    for blob in std::iter::once(&image.manifest)
        .chain(std::iter::once(&image.config))
        .chain(&image.layers)
    {
        let digest = blob.digest();
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(blobs.join(hex), &blob.bytes).context("write blob")?;
    }
    let mut descriptor = image.manifest.descriptor();
    descriptor["annotations"] = json!({REF_NAME_ANNOTATION: tag});
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [descriptor],
    });
    std::fs::write(dir.join("index.json"), to_json_bytes(&index)?).context("write index.json")?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .context("write oci-layout")?;
    Ok(())
}

fn read_blob(dir: &Path, descriptor: &Value) -> Result<Blob> {
    let digest = descriptor["digest"]
        .as_str()
        .ok_or_else(|| anyhow!("descriptor without digest: {descriptor}"))?;
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| anyhow!("not a sha256 digest: {digest}"))?;
    let path = dir.join("blobs").join("sha256").join(hex);
    let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    let actual = sha256_digest(&bytes);
    if actual != digest {
        bail!("blob {} has digest {actual}", path.display());
    }
    let media_type = descriptor["mediaType"].as_str().unwrap_or_default();
    Ok(Blob::new(media_type, bytes))
}

/// Reads the single image of an OCI image layout, checking every blob against its digest.
pub fn read_layout(dir: &Path) -> Result<Image> {
    let index_path = dir.join("index.json");
    let index: Value = serde_json::from_slice(
        &std::fs::read(&index_path).with_context(|| format!("read {}", index_path.display()))?,
    )
    .context("parse index.json")?;
    let manifests = index["manifests"]
        .as_array()
        .ok_or_else(|| anyhow!("index.json has no manifests"))?;
    let [descriptor] = manifests.as_slice() else {
        bail!(
            "expected one image in {}, found {}",
            dir.display(),
            manifests.len()
        );
    };
    let manifest = read_blob(dir, descriptor)?;
    let parsed: Value = serde_json::from_slice(&manifest.bytes).context("parse manifest")?;
    let config = read_blob(dir, &parsed["config"])?;
    let layers = parsed["layers"]
        .as_array()
        .ok_or_else(|| anyhow!("manifest has no layers"))?
        .iter()
        .map(|d| read_blob(dir, d))
        .collect::<Result<Vec<_>>>()?;
    Ok(Image {
        manifest,
        config,
        layers,
    })
}

fn file_in_layer(layer_gz: &[u8], name: &str) -> Result<Option<Vec<u8>>> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer_gz));
    for entry in archive.entries().context("read layer")? {
        let mut entry = entry.context("read layer entry")?;
        let path = entry.path().context("entry path")?.into_owned();
        if path.to_string_lossy().trim_start_matches("./") == name {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).context("read entry")?;
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// `envoy/artifacts.lock`: image name → digest, one `NAME sha256:HEX` line each.
pub fn render_lock(entries: &[(&str, String)]) -> String {
    let mut out = String::from(
        "# envoy/artifacts.lock — the digests of the images `./build.sh package` builds from this\n\
         # commit; every `<image>@sha256:` reference in envoy/ names them. Written by\n\
         # `./build.sh package`; checked by `./build.sh test` (test-harness/oci-package).\n",
    );
    for (name, digest) in entries {
        let _ = writeln!(out, "{name} {digest}");
    }
    out
}

/// Parses [`render_lock`]'s format.
pub fn parse_lock(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, digest) = line
            .split_once(' ')
            .ok_or_else(|| anyhow!("bad lock line: {line}"))?;
        if !is_digest(digest) {
            bail!("bad digest in lock line: {line}");
        }
        out.push((name.to_string(), digest.to_string()));
    }
    Ok(out)
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Every digest referenced as `<image>@sha256:HEX` in `text`.
pub fn references(text: &str, image: &str) -> Vec<String> {
    let needle = format!("{image}@");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c.is_ascii_alphanumeric()))
            .unwrap_or(rest.len());
        out.push(rest[..end].to_string());
    }
    out
}

/// `text` with every `<image>@sha256:HEX` pointing at `digest`, and every other occurrence of
/// an old reference's bare hex (e.g. Envoy's `remote.sha256`) replaced by the new hex.
pub fn rewrite_references(text: &str, image: &str, digest: &str) -> String {
    let new_hex = digest.trim_start_matches("sha256:");
    let mut out = text.to_string();
    for old in references(text, image) {
        if old != digest && is_digest(&old) {
            out = out.replace(old.trim_start_matches("sha256:"), new_hex);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const WASM: &[u8] = b"\0asm\x01\0\0\0 pretend module";

    #[test]
    fn same_input_same_digest_and_one_byte_changes_it() {
        let a = wasm_image(WASM).unwrap();
        let b = wasm_image(WASM).unwrap();
        assert_eq!(a.digest(), b.digest());
        let mut other = WASM.to_vec();
        other.push(b'!');
        assert_ne!(a.digest(), wasm_image(&other).unwrap().digest());
    }

    #[test]
    fn compat_wasm_image_has_one_tar_gzip_layer_with_plugin_wasm() {
        let image = wasm_image(WASM).unwrap();
        let manifest: Value = serde_json::from_slice(&image.manifest.bytes).unwrap();
        assert_eq!(manifest["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest["config"]["mediaType"], CONFIG_MEDIA_TYPE);
        assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
        assert_eq!(manifest["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(manifest["annotations"][WASM_VARIANT_ANNOTATION], "compat");
        assert_eq!(image.file(WASM_FILE).unwrap(), WASM);
        // The config's diff_id is the digest of the uncompressed layer.
        let config: Value = serde_json::from_slice(&image.config.bytes).unwrap();
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(image.layers[0].bytes.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256_digest(&tar));
        assert!(wasm_image(b"not wasm").is_err());
    }

    #[test]
    fn layout_round_trips_and_detects_a_corrupt_blob() {
        let dir = std::env::temp_dir().join(format!("oci-package-test-{}", std::process::id()));
        let image = sidecar_image(b"\x7fELF pretend binary").unwrap();
        write_layout(&image, &dir, "test").unwrap();
        let read = read_layout(&dir).unwrap();
        assert_eq!(read, image);
        assert_eq!(read.file(SIDECAR_FILE).unwrap(), b"\x7fELF pretend binary");
        let hex = image.layers[0].digest().replace("sha256:", "");
        std::fs::write(dir.join("blobs/sha256").join(hex), b"tampered").unwrap();
        assert!(read_layout(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lock_and_reference_rewriting() {
        let old = format!("sha256:{}", "a".repeat(64));
        let new = format!("sha256:{}", "b".repeat(64));
        let lock = render_lock(&[(FILTER_IMAGE, old.clone())]);
        assert_eq!(
            parse_lock(&lock).unwrap(),
            vec![(FILTER_IMAGE.to_string(), old.clone())]
        );
        let text = format!(
            "uri: oci://r.example/x/{FILTER_IMAGE}@{old}\nsha256: {}\n",
            old.trim_start_matches("sha256:")
        );
        assert_eq!(references(&text, FILTER_IMAGE), vec![old.clone()]);
        let rewritten = rewrite_references(&text, FILTER_IMAGE, &new);
        assert_eq!(references(&rewritten, FILTER_IMAGE), vec![new.clone()]);
        assert!(rewritten.contains(&format!("sha256: {}", "b".repeat(64))));
        assert!(parse_lock("llm-router-filter sha256:xyz").is_err());
    }
}
