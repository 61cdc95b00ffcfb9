//! `sidecar-metrics`: scrapes every model-server pod's Prometheus `/metrics`, normalises each
//! engine's names into the fleet [`llm_router_snapshot::Snapshot`], and pushes it into the proxy
//! whenever the fleet changed or a heartbeat is due. The binary (`src/main.rs`) is a thin shell
//! around these modules so tests and benchmarks can drive the same code.

pub mod admin;
pub mod budget;
pub mod clock;
pub mod config;
pub mod discovery;
pub mod endpoints;
pub mod engines;
pub mod http1;
pub mod hub;
pub mod keys;
pub mod kube;
pub mod prom;
pub mod push;
pub mod rewrites;
pub mod scrape;
pub mod share;
pub mod sidecar;
pub mod stats;
