//! What one worker (one VM) keeps between callbacks, shared by its root context and every HTTP
//! context it creates.

use crate::fleet::Cache;
use crate::host::{self, HostStore};
use crate::metrics::Metrics;
use crate::stream::{RouteState, WaitingRequest};
use llm_router_core::config::DroppedRewrite;
use llm_router_core::flow::{summary, Queue};
use llm_router_core::{inflight, Config, Fleet, Router};
use proxy_wasm::types::LogLevel;
use std::collections::HashMap;
use std::rc::Rc;

/// The root context's tick while a tally read is held (`tally.rs`).
pub const HELD_READ_TICK: std::time::Duration = std::time::Duration::from_millis(1);

/// A tally read held until the tally moves (`tally.rs`): its stream, the version its reader
/// saw, and when it is answered regardless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRead {
    pub context: u32,
    pub after: u64,
    pub until_ms: u64,
}

/// What one worker (one VM) keeps: the router, its decoded fleet and its metric ids.
pub struct Worker {
    pub router: Router,
    pub cache: Cache,
    pub metrics: Metrics,
    /// In-flight decrements that lost every compare-and-swap, paid on the tick.
    pub ledger: inflight::Ledger,
    pub requests: u64,
    /// Whether Envoy logs debug lines for this VM (asked once, when the VM is configured), so
    /// per-request debug lines are not even formatted otherwise.
    pub debug: bool,
    /// Paused streams waiting for their pool, per pool ([`llm_router_core::flow`]).
    pub waiting: HashMap<String, Queue<WaitingRequest>>,
    /// What a stream dispatched from the root context needs at its response and end, by
    /// context id (taken by the stream at its response headers or its end).
    pub dispatched: HashMap<u32, RouteState>,
    /// This worker's id in the pools' queue summaries.
    pub id: u64,
    /// Other workers' queue summaries per pool, as of this worker's last tick.
    pub others: HashMap<String, Vec<summary::Slot>>,
    /// Whether the fast tick (`flow.tick_ms`) is on.
    pub fast: bool,
    /// Sidecars' tally reads held here until the tally moves (`tally.rs`) …
    pub tally_held: Vec<HeldRead>,
    /// … and whether the tick is [`HELD_READ_TICK`] for them.
    pub tally_tick: bool,
    /// Whether the next tick was brought forward ([`crate::waiting::WAKE`]): a stream of this
    /// worker freed room while requests wait here, or another worker's did
    /// ([`crate::waiting::wake_others`]).
    pub soon: bool,
    /// The VM id the wake-up queues are registered under (`plugin_vm_id`).
    pub vm_id: String,
    /// Other workers' wake-up queues resolved so far, by worker id.
    pub wake_queues: HashMap<u64, u32>,
    /// Per pool, the other workers holding requests for it as last read (ms, ids): the summary
    /// is read again at most once per [`crate::waiting::WAITERS_READ`]
    /// ([`crate::waiting::wake_others`]).
    pub waiting_elsewhere: HashMap<String, (u64, Vec<u64>)>,
    /// When the gauges were last set (ms).
    pub gauges_ms: u64,
    /// The snapshot's rewrite rules that did not resolve, as last logged.
    pub dropped_rewrites: Vec<DroppedRewrite>,
    /// Where the configured pools and the snapshot's disagree, as last logged.
    pub pool_mismatches: Vec<String>,
}

impl Worker {
    /// A worker for `config`, with its id in the queue summaries and its wake-up queue
    /// registered.
    pub fn new(config: Config) -> Worker {
        let id = summary::worker_id(&HostStore, host::now_nanos());
        // Where the other workers wake this one when their streams free room.
        let _ = host::register_shared_queue(&summary::wake_queue(id));
        Worker {
            router: Router::new(config),
            cache: Cache::default(),
            metrics: Metrics::define(),
            ledger: inflight::Ledger::default(),
            requests: 0,
            debug: host::log_enabled(LogLevel::Debug),
            waiting: HashMap::new(),
            dispatched: HashMap::new(),
            id,
            others: HashMap::new(),
            fast: false,
            tally_held: Vec::new(),
            tally_tick: false,
            soon: false,
            vm_id: host::property(&["plugin_vm_id"]).unwrap_or_default(),
            wake_queues: HashMap::new(),
            waiting_elsewhere: HashMap::new(),
            gauges_ms: 0,
            dropped_rewrites: Vec::new(),
            pool_mismatches: Vec::new(),
        }
    }

    /// The newest fleet in shared data (decoded once per generation).
    pub fn fleet(&mut self) -> Option<Rc<Fleet>> {
        let Worker { cache, router, .. } = self;
        let fleet = cache.current(&HostStore, &router.config);
        if let Some(f) = &fleet {
            log_dropped_rewrites(&mut self.dropped_rewrites, &f.dropped_rewrites);
            if self.pool_mismatches != f.pool_mismatches {
                for m in &f.pool_mismatches {
                    host::log(LogLevel::Warn, &format!("llm-router: {m}"));
                }
                self.pool_mismatches.clone_from(&f.pool_mismatches);
            }
        }
        fleet
    }
}

/// Logs the snapshot's rewrite rules that did not resolve against this configuration (each
/// naming its rule and the target at fault) when they differ from the last ones logged: once
/// per change, not once per snapshot (the sidecar repeats its rules in every push).
fn log_dropped_rewrites(logged: &mut Vec<DroppedRewrite>, now: &[DroppedRewrite]) {
    if logged.as_slice() == now {
        return;
    }
    for d in now {
        host::log(
            LogLevel::Warn,
            &format!(
                "llm-router: snapshot rewrite rule for {:?} dropped: {}",
                d.model, d.reason
            ),
        );
    }
    *logged = now.to_vec();
}

/// Counts one more decision in `requests` and returns its tie-break entropy: the clock, the
/// count and the stream's key mixed.
pub fn tie(requests: &mut u64, now_ns: u64, key: u64) -> u64 {
    *requests = requests.wrapping_add(1);
    now_ns ^ requests.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key
}
