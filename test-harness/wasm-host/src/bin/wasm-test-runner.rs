//! A cargo runner for `wasm32-wasip1` test binaries on this crate's wasmtime host, so pure-logic
//! unit tests (e.g. `llm-router-core`'s) run compiled to Wasm without a browser or a WASI
//! runtime install:
//!
//! ```sh
//! cargo build --release -p proxy-wasm-host --bin wasm-test-runner
//! CARGO_TARGET_WASM32_WASIP1_RUNNER=$PWD/target/release/wasm-test-runner \
//!     cargo test -p llm-router-core --target wasm32-wasip1 -- --skip fixture
//! ```
//!
//! No file system is offered: tests that read files fail (skip them). A failing test aborts
//! the module (Wasm has `panic = abort`), so the first failure ends the run with code 101.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: wasm-test-runner FILE.wasm [ARGS...]");
        return ExitCode::from(2);
    };
    let module = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| proxy_wasm_host::Module::compile_command(&b).map_err(|e| e.to_string()))
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("wasm-test-runner: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    match proxy_wasm_host::run_command(&module, &args) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("wasm-test-runner: {e}");
            ExitCode::from(101)
        }
    }
}
