//! The proxy-wasm HTTP filter that Envoy loads: thin glue between Envoy and `llm-router-core`.
//!
//! Per request: hold the headers, read the whole body, let the core decide, then either set the
//! cluster header (and ask Envoy to re-route) plus `x-gateway-destination-endpoint` with the
//! ranked pods for the cluster's `override_host` policy, answer with the core's rejection, or
//! (flow control) hold the request until a pod can take it. On the response: report the pod
//! that served it; when the stream ends (completion, reset or abort) release its in-flight
//! count. The instance configured with `snapshot.endpoints` (on a loopback-bound internal
//! listener) also accepts the sidecar's signed snapshot pushes; every other instance answers
//! 404 on those paths.
//!
//! Envoy settings this relies on (see `envoy/envoy.yaml`): the Wasm plugin config has
//! `allow_on_headers_stop_iteration: true`; each pool's cluster uses the `override_host` LB
//! policy reading the endpoint header; the route table routes on the cluster header.
//!
//! | file | its job |
//! |---|---|
//! | `root.rs` | the root context (one per worker): configuration, the tick (dispatch, gauges), wake-ups from other workers |
//! | `http.rs` | the HTTP context (one per stream): request headers and body, the decision, the response, the stream's end |
//! | `route.rs` | applies a decision to a stream (routing headers, model rewrite, metrics) or sends its rejection |
//! | `waiting.rs` | the waiting room: requests flow control holds, their dispatch from the root context, waking other workers |
//! | `push.rs` | the snapshot endpoints on the internal listener: signed push, state, tally |
//! | `tally.rs` | the tally's long poll: a sidecar's read held until the tally moves |
//! | `worker.rs` | what one worker (VM) keeps between callbacks |
//! | `stream.rs` | what a stream carries between callbacks: its route state, or its request while it waits |
//! | `fleet.rs` | the snapshot in shared data: accepting a push, the decoded fleet per worker, the state JSON |
//! | `metrics.rs` | the filter's metrics and their label-encoded names |
//! | `host.rs` | every call to the host, wrapped: failures are `None` / `false`, never a trap |

mod fleet;
mod host;
mod http;
mod metrics;
mod push;
mod root;
mod route;
mod stream;
mod tally;
mod waiting;
mod worker;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new(id))
    });
}}
