//! `oci-package`: the tool behind `./build.sh package`. Writes the filter's Wasm image and the
//! sidecar's image as OCI image layouts, prints their digests and writes them to
//! `<out>/digests.txt`; with `--lock`, also rewrites `envoy/artifacts.lock` and every
//! `<image>@sha256:` reference in the manifests so they name the images just built.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Parser;
use oci_package::{
    parse_lock, render_lock, rewrite_references, sidecar_image, wasm_image, write_layout,
    FILTER_IMAGE, SIDECAR_IMAGE,
};

#[derive(Parser, Debug)]
#[command(version, about = "Build the filter and sidecar OCI image layouts")]
struct Args {
    /// The filter module (target/wasm32-wasip1/wasm/llm_router_filter.wasm).
    #[arg(long)]
    wasm: PathBuf,
    /// The static sidecar binary (target/x86_64-unknown-linux-musl/oci/sidecar-metrics).
    #[arg(long)]
    sidecar: PathBuf,
    /// Folder receiving `llm-router-filter/`, `sidecar-metrics/` and `digests.txt`.
    #[arg(long)]
    out: PathBuf,
    /// Tag recorded in each layout's index (`org.opencontainers.image.ref.name`).
    #[arg(long, default_value = "dev")]
    tag: String,
    /// Lock file to rewrite (envoy/artifacts.lock).
    #[arg(long)]
    lock: Option<PathBuf>,
    /// Folder whose YAML files get their `<image>@sha256:` references rewritten (envoy/).
    #[arg(long, requires = "lock")]
    manifests: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("read {}", path.display()))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let filter = wasm_image(&read(&args.wasm)?).context("filter image")?;
    let sidecar = sidecar_image(&read(&args.sidecar)?).context("sidecar image")?;
    let entries = [
        (FILTER_IMAGE, filter.digest()),
        (SIDECAR_IMAGE, sidecar.digest()),
    ];
    write_layout(&filter, &args.out.join(FILTER_IMAGE), &args.tag)?;
    write_layout(&sidecar, &args.out.join(SIDECAR_IMAGE), &args.tag)?;
    let digests = render_lock(&entries);
    std::fs::write(args.out.join("digests.txt"), &digests).context("write digests.txt")?;
    for (name, digest) in &entries {
        println!("{name}@{digest}  ({})", args.out.join(name).display());
    }
    if let Some(lock) = &args.lock {
        let old = std::fs::read_to_string(lock).unwrap_or_default();
        let wanted: Vec<(String, String)> = entries
            .iter()
            .map(|(n, d)| (n.to_string(), d.clone()))
            .collect();
        if parse_lock(&old).ok() != Some(wanted) {
            std::fs::write(lock, &digests).with_context(|| format!("write {}", lock.display()))?;
            println!("wrote {}", lock.display());
        }
    }
    if let Some(dir) = &args.manifests {
        let mut files = Vec::new();
        yaml_files(dir, &mut files)?;
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            let mut new = text.clone();
            for (name, digest) in &entries {
                new = rewrite_references(&new, name, digest);
            }
            if new != text {
                std::fs::write(&file, new).with_context(|| format!("write {}", file.display()))?;
                println!("updated {}", file.display());
            }
        }
    }
    Ok(())
}
