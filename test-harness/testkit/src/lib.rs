//! Helpers to run real Envoy, model-sim and the sidecar in tests, benchmarks and the demo.
//!
//! - Paths: [`workspace_root`], [`target_dir`], [`envoy_binary`], [`filter_wasm`], [`bin`],
//!   [`free_port`].
//! - Processes: [`ChildGuard`] (killed by PID on drop, output in `<target>/testlogs/`),
//!   [`start_model_sim`] and [`spawn_and_wait_http`] for our own servers,
//!   [`start_extproc_noop`] for the no-op ext_proc server ([`EnvoySpec::ext_proc`]).
//! - Envoy: [`EnvoySpec`] → [`EnvoyProcess`] (config generation, start, readiness, stats,
//!   access log), [`validate_config`].
//! - HTTP: [`post_json`], [`post_bytes`], [`get`], [`request`] and the in-process
//!   [`EchoBackend`].
//! - Identity: [`Identity`] (the shipped `envoy/identity/jwt-authn.yaml` chain, for
//!   [`EnvoySpec::identity`]).
//! - CRD schemas (`test-harness/fixtures/crds`) and a structural check against them: [`crds`].
//! - The shipped configurations under `envoy/`: [`shipped`] (documents, bootstraps, Wasm
//!   configs, and running a shipped bootstrap for real on loopback).
//! - The field's routers: [`peers`] (SMG and vllm-router from their venvs, ready when
//!   every worker is healthy).
//! - Whole stacks: [`stack`] (a fleet of pods, emulated or real vLLM, and the gateway in front
//!   of them: Envoy with a router, the sidecar, or a peer router), as the benchmark and the
//!   `e2e` fault tests start them; [`podmetrics`] reads the pods' `/metrics`.

pub mod crds;
mod echo;
mod envoy;
mod error;
mod extproc;
mod http;
pub mod identity;
mod paths;
pub mod peers;
pub mod podmetrics;
mod process;
mod server;
pub mod shipped;
pub mod stack;
pub mod vllm;

pub use echo::{EchoBackend, EchoConfig, RecordedRequest, RECORDED_REQUESTS};
pub use envoy::{
    ext_proc_cluster, ext_proc_http_filter, filter_stat_label, least_request_full_scan_policy,
    overflow_as_429, override_host_policy, parse_host_rq_totals, parse_stats, stats_config,
    validate_config, validate_config_env, wasm_http_filter, wasm_http_filter_with_env,
    AccessLogEntry, Admission, EnvoyProcess, EnvoySpec, PoolSpec, Router, CLUSTER_HEADER,
    DEFAULT_SECRET, ENDPOINT_HEADER, EXT_PROC_CLUSTER, INTERNAL_BUFFER_LIMIT_BYTES,
    PER_TRY_IDLE_TIMEOUT, RETRY_ON,
};
pub use error::{Error, Result};
pub use extproc::{extproc_stats, start_extproc_noop, start_extproc_noop_blocking};
pub use http::{
    blocking_get, get, post_bytes, post_json, request, request_with_timeout, HttpResponse,
    DEFAULT_TIMEOUT,
};
pub use identity::Identity;
pub use paths::{
    bin, envoy_binary, file_tail, filter_wasm, free_port, prerequisites_ready, stack_ready,
    target_dir, testlog_dir, workspace_root,
};
pub use process::{pid_alive, ChildGuard, DEFAULT_GRACE};
pub use server::{
    spawn_and_wait_http, start_model_sim, start_model_sim_blocking, ServerProcess,
    SERVER_READY_TIMEOUT,
};
