//! What can go wrong while a test drives a module, each case carrying what a reader needs to
//! see why (a trap keeps the Wasm backtrace, what the module printed and the last crossings).

use std::path::PathBuf;

/// Every failure of the host, as a test sees it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The release `.wasm` is not where it should be.
    #[error("filter .wasm not found at {path}: build it with `./build.sh` (or `cargo build --profile wasm --target wasm32-wasip1 -p llm-router-wasm`), or point LLM_ROUTER_WASM at it")]
    WasmMissing { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// wasmtime refused the bytes (not Wasm, failed validation, unsupported feature).
    #[error("cannot compile the module: {0}")]
    Compile(String),
    /// The module is not a proxy-wasm module this host can drive.
    #[error("not a usable proxy-wasm module: {0}")]
    Module(String),
    #[error("cannot instantiate the module: {0}")]
    Instantiate(String),
    /// The module trapped (a panic in Rust ends in `unreachable`). The VM is dead afterwards,
    /// as it is in Envoy.
    #[error("the module trapped in {callback}: {message}\n--- wasm backtrace ---\n{backtrace}\n--- module stderr/stdout ---\n{output}\n--- last crossings ---\n{trace}")]
    Trap {
        callback: String,
        message: String,
        backtrace: String,
        output: String,
        trace: String,
    },
    /// A callback on a VM that trapped earlier.
    #[error("the VM is dead since an earlier trap in {0}")]
    VmDead(String),
    /// `proxy_on_vm_start` returned false.
    #[error("proxy_on_vm_start returned false; logs:\n{logs}")]
    VmStartRejected { logs: String },
    /// `proxy_on_configure` returned false: Envoy would refuse the plugin configuration.
    #[error("proxy_on_configure rejected the plugin configuration; logs:\n{logs}")]
    ConfigureRejected { logs: String },
    /// The test asked for something that cannot happen in Envoy at this point of the stream.
    #[error("invalid use of the host: {0}")]
    Usage(String),
}
