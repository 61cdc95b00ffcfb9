//! A wasmtime host for the proxy-wasm ABI 0.2.1, so Rust tests can run the release filter
//! `.wasm` (the bytes Envoy loads) without Envoy and read what it did.
//!
//! ```no_run
//! use proxy_wasm_host::Host;
//! let host = Host::filter()?;                         // finds the release .wasm
//! let vm = host.vm(r#"{"pools": []}"#)?;              // _initialize, vm_start, configure
//! let mut req = vm.request();
//! req.headers(&[(":method", "POST"), (":path", "/v1/chat/completions")])
//!     .body_split(br#"{"model":"m","messages":[]}"#, 7)
//!     .send()?;
//! println!("{:?} {:?}", req.upstream_header("x-gateway-destination-endpoint"), req.local_response());
//! req.finish()?;
//! # Ok::<(), proxy_wasm_host::HostError>(())
//! ```
//!
//! One [`Module`] (compiled once), one [`Host`] per test (what Envoy shares between worker
//! threads: shared data with CAS, queues, metrics, the clock), one [`Vm`] per worker thread,
//! one [`Request`] per HTTP stream. All state lives in wasmtime store data or in the `Host`;
//! nothing is global, so tests run in parallel.

mod abi;
mod env;
mod error;
mod request;
mod state;
mod vm;
mod wasi;

pub use abi::{decode_pairs, encode_pairs, Action, LogLevel, MetricType, PairsError, Status};
pub use error::HostError;
pub use request::{Request, Response};
pub use state::{
    CallCount, ForeignCall, HttpCall, LocalResponse, LogEntry, Metric, ALLOCATE, DEFAULT_START_NS,
};
#[cfg(test)]
mod tests;

pub use vm::{
    filter_wasm_path, run_command, Host, Module, PropertyValue, Vm, VmBuilder,
    DEFAULT_BUFFER_LIMIT, WASM_ENV,
};
