//! The root context: one per worker (VM). It reads the configuration and makes the
//! [`Worker`], creates an HTTP context per stream, and on its tick dispatches the waiting room
//! and sets the gauges; other workers wake it through its shared queue.

use crate::host::{self, HostStore};
use crate::http::Http;
use crate::tally;
use crate::waiting::{self, TICK};
use crate::worker::Worker;
use llm_router_core::{inflight, Config};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use std::cell::RefCell;
use std::rc::Rc;

pub struct Root {
    id: u32,
    worker: Option<Rc<RefCell<Worker>>>,
}

impl Root {
    pub fn new(id: u32) -> Root {
        Root { id, worker: None }
    }
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = host::plugin_configuration(size).unwrap_or_default();
        match Config::parse(&bytes) {
            Ok(config) => {
                host::log(
                    LogLevel::Info,
                    &format!(
                        "llm-router: configured {} pool(s), {} model name(s); snapshot endpoints {}",
                        config.pools.len(),
                        config.models.len(),
                        if config.snapshot.endpoints { "on" } else { "off" }
                    ),
                );
                self.worker = Some(Rc::new(RefCell::new(Worker::new(config))));
                host::set_tick_period(TICK);
                true
            }
            Err(e) => {
                host::log(LogLevel::Critical, &format!("llm-router: {e}"));
                false
            }
        }
    }

    /// Another worker's stream freed room in a pool this worker holds requests for
    /// ([`waiting::wake_others`]): the next dispatch comes now, as for room freed here.
    fn on_queue_ready(&mut self, queue_id: u32) {
        while host::dequeue_shared_queue(queue_id).is_some() {}
        if let Some(worker) = &self.worker {
            waiting::wake_soon(&mut worker.borrow_mut());
        }
    }

    /// Answers the tally reads due, dispatches what waits, then sets the gauges (at most once a
    /// second while a faster tick is on).
    fn on_tick(&mut self) {
        let Some(worker) = &self.worker else {
            return;
        };
        let mut w = worker.borrow_mut();
        let now_ms = host::now_ms();
        tally::on_tick(&mut w, self.id);
        if w.fast || w.soon || !w.waiting.is_empty() {
            waiting::dispatch(&mut w, self.id);
        }
        if (w.fast || w.tally_tick) && now_ms.saturating_sub(w.gauges_ms) < 1000 {
            return;
        }
        w.gauges_ms = now_ms;
        set_gauges(&mut w);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone()?;
        Some(Box::new(Http::new(context_id, worker)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Pays the ledger and sets the gauges from shared data: every worker sees the same values, so
/// whichever ticks last is right.
fn set_gauges(w: &mut Worker) {
    // Decrements lost to contention since the last tick are paid now (one update per pool).
    w.ledger.settle(&HostStore);
    let fleet = w.fleet();
    let Worker {
        router, metrics, ..
    } = w;
    metrics.begin_tick();
    match &fleet {
        Some(f) => {
            let age_ms = host::now_ms().saturating_sub(f.accepted_ms);
            metrics.snapshot(f.snapshot.generation, Some(age_ms / 1000));
            metrics.snapshot_rewrites_dropped(f.dropped_rewrites.len());
            let flow = router.config.flow.enabled;
            for pool in &f.snapshot.pools {
                if flow {
                    metrics.flow_defined(&pool.name);
                }
                if let Some(share) = f.own_share(&pool.name) {
                    metrics.traffic_share(&pool.name, share);
                }
                let live = inflight::read(&HostStore, &pool.name);
                for pod in &pool.pods {
                    metrics.in_flight(&pool.name, &pod.address, live.in_flight(&pod.address));
                }
            }
        }
        None => {
            metrics.snapshot(0, None);
            metrics.snapshot_rewrites_dropped(0);
        }
    }
    metrics.end_tick();
}
