//! The worker's metrics: each label set is defined once per worker VM (a define copies the
//! name into Envoy and takes its symbol-table lock) and its id cached here, so a request costs
//! only increments and one histogram record. Names and label encoding live in
//! `llm_router_core::metrics`; gauges are set from the root context's tick, not per request.

use crate::host::{Counter, Gauge, Histogram};
use llm_router_core::metrics::{self as names, stat_name};
use llm_router_core::priority::Class;
use std::collections::HashMap;

/// `outcome` values of `llm_router_requests_total`, in slot order.
const OUTCOMES: [&str; 8] = [
    names::ROUTED,
    "least_inflight",
    "fallback",
    "shed",
    "no_endpoints",
    "unknown_model",
    "bad_request",
    "too_large",
];

/// Slot of an outcome in [`OUTCOMES`] (the last slot for an unknown one).
fn outcome_slot(outcome: &str) -> usize {
    OUTCOMES
        .iter()
        .position(|o| *o == outcome)
        .unwrap_or(OUTCOMES.len() - 1)
}

/// Counters of one (pool, model).
#[derive(Default)]
struct ModelCounters {
    outcomes: [Option<Counter>; OUTCOMES.len()],
    /// Outcomes of requests a rewrite rule sent to a served name (`target`), per name.
    targets: HashMap<String, [Option<Counter>; OUTCOMES.len()]>,
    /// Prompt and completion tokens.
    tokens: [Option<Counter>; 2],
}

/// Counters and gauges of one pool.
#[derive(Default)]
struct PoolMetrics {
    models: HashMap<String, ModelCounters>,
    picks: HashMap<String, Counter>,
    prefix_hits: Option<Counter>,
    lora_hits: Option<Counter>,
    /// In-flight gauge per pod, with the tick that last set it.
    in_flight: HashMap<String, (Gauge, u64)>,
    traffic_share: Option<Gauge>,
}

/// Flow control's metrics of one pool, per band (`[sheddable, standard, critical]`).
#[derive(Default)]
struct FlowMetrics {
    waiting: [Option<Gauge>; 3],
    /// What this worker last added to each `waiting` gauge (the gauge sums the workers).
    published: [u64; 3],
    outcomes: [[Option<Counter>; names::FLOW_OUTCOME_NAMES.len()]; 3],
    wait: [Option<Histogram>; 3],
}

/// Every metric of one worker, defined on first use.
pub struct Metrics {
    pools: HashMap<String, PoolMetrics>,
    flow: HashMap<String, FlowMetrics>,
    decision: Histogram,
    snapshot_age: Gauge,
    snapshot_generation: Gauge,
    snapshot_rewrites_dropped: Gauge,
    pushes_accepted: Counter,
    pushes_refused: Counter,
    ticks: u64,
}

impl Metrics {
    /// Defines the metrics without labels (the per-label ones come on first use).
    pub fn define() -> Metrics {
        Metrics {
            pools: HashMap::new(),
            flow: HashMap::new(),
            decision: Histogram::define(names::DECISION_DURATION),
            snapshot_age: Gauge::define(names::SNAPSHOT_AGE),
            snapshot_generation: Gauge::define(names::SNAPSHOT_GENERATION),
            snapshot_rewrites_dropped: Gauge::define(names::SNAPSHOT_REWRITES_DROPPED),
            pushes_accepted: Counter::define(&stat_name(
                names::SNAPSHOT_PUSHES,
                &[("result", "accepted")],
            )),
            pushes_refused: Counter::define(&stat_name(
                names::SNAPSHOT_PUSHES,
                &[("result", "refused")],
            )),
            ticks: 0,
        }
    }

    /// A pool's metrics, created on first use (no allocation once it exists).
    fn pool(&mut self, pool: &str) -> Option<&mut PoolMetrics> {
        if !self.pools.contains_key(pool) {
            self.pools.insert(pool.to_string(), PoolMetrics::default());
        }
        self.pools.get_mut(pool)
    }

    fn model(&mut self, pool: &str, model: &str) -> Option<&mut ModelCounters> {
        let p = self.pool(pool)?;
        if !p.models.contains_key(model) {
            p.models.insert(model.to_string(), ModelCounters::default());
        }
        p.models.get_mut(model)
    }

    /// One request with this outcome (`model` empty when it is not known or not served;
    /// `target` the served name a rewrite rule chose, empty when none did).
    pub fn request(&mut self, pool: &str, model: &str, target: &str, outcome: &str) {
        let slot = outcome_slot(outcome);
        let Some(m) = self.model(pool, model) else {
            return;
        };
        let slots = if target.is_empty() {
            &mut m.outcomes
        } else {
            if !m.targets.contains_key(target) {
                m.targets.insert(target.to_string(), Default::default());
            }
            let Some(slots) = m.targets.get_mut(target) else {
                return;
            };
            slots
        };
        if let Some(c) = slots.get_mut(slot) {
            c.get_or_insert_with(|| {
                Counter::define(&stat_name(
                    names::REQUESTS,
                    &[
                        ("pool", pool),
                        ("model", model),
                        ("target", target),
                        ("outcome", outcome),
                    ],
                ))
            })
            .inc();
        }
    }

    /// A routed request's first choice, and whether it was a prefix / adapter hit.
    pub fn picked(&mut self, pool: &str, pod: &str, prefix_hit: bool, lora_hit: bool) {
        let Some(p) = self.pool(pool) else {
            return;
        };
        if let Some(c) = p.picks.get(pod) {
            c.inc();
        } else {
            let c = Counter::define(&stat_name(names::PICKS, &[("pool", pool), ("pod", pod)]));
            c.inc();
            p.picks.insert(pod.to_string(), c);
        }
        if prefix_hit {
            p.prefix_hits
                .get_or_insert_with(|| {
                    Counter::define(&stat_name(names::PREFIX_HITS, &[("pool", pool)]))
                })
                .inc();
        }
        if lora_hit {
            p.lora_hits
                .get_or_insert_with(|| {
                    Counter::define(&stat_name(names::LORA_HITS, &[("pool", pool)]))
                })
                .inc();
        }
    }

    /// The time one decision took (µs).
    pub fn decision_us(&self, us: u64) {
        self.decision.record(us);
    }

    /// Tokens of one response.
    pub fn tokens(&mut self, pool: &str, model: &str, prompt: u64, completion: u64) {
        let Some(m) = self.model(pool, model) else {
            return;
        };
        for (slot, (kind, n)) in m
            .tokens
            .iter_mut()
            .zip([("prompt", prompt), ("completion", completion)])
        {
            if n == 0 {
                continue;
            }
            slot.get_or_insert_with(|| {
                Counter::define(&stat_name(
                    names::TOKENS,
                    &[("pool", pool), ("model", model), ("kind", kind)],
                ))
            })
            .add(n);
        }
    }

    pub fn push(&self, accepted: bool) {
        if accepted {
            self.pushes_accepted.inc();
        } else {
            self.pushes_refused.inc();
        }
    }

    /// Starts a tick: gauges set before [`Metrics::end_tick`] are current, the others go to 0.
    pub fn begin_tick(&mut self) {
        self.ticks = self.ticks.wrapping_add(1);
    }

    pub fn snapshot(&self, generation: u64, age_s: Option<u64>) {
        self.snapshot_generation.set(generation);
        if let Some(a) = age_s {
            self.snapshot_age.set(a);
        }
    }

    /// The current snapshot's rewrite rules that did not resolve (0 without a snapshot).
    pub fn snapshot_rewrites_dropped(&self, n: usize) {
        self.snapshot_rewrites_dropped.set(n as u64);
    }

    pub fn in_flight(&mut self, pool: &str, pod: &str, n: u32) {
        let tick = self.ticks;
        let Some(p) = self.pool(pool) else {
            return;
        };
        if !p.in_flight.contains_key(pod) {
            let g = Gauge::define(&stat_name(
                names::IN_FLIGHT,
                &[("pool", pool), ("pod", pod)],
            ));
            p.in_flight.insert(pod.to_string(), (g, tick));
        }
        if let Some((g, t)) = p.in_flight.get_mut(pod) {
            g.set(u64::from(n));
            *t = tick;
        }
    }

    /// This proxy's share of the pool's requests, in percent.
    pub fn traffic_share(&mut self, pool: &str, share: f64) {
        let Some(p) = self.pool(pool) else {
            return;
        };
        let percent = (share.clamp(0.0, 1.0) * 100.0).round() as u64;
        p.traffic_share
            .get_or_insert_with(|| {
                Gauge::define(&stat_name(names::TRAFFIC_SHARE, &[("pool", pool)]))
            })
            .set(percent);
    }

    fn flow_pool(&mut self, pool: &str) -> Option<&mut FlowMetrics> {
        if !self.flow.contains_key(pool) {
            self.flow.insert(pool.to_string(), FlowMetrics::default());
        }
        self.flow.get_mut(pool)
    }

    /// Defines a pool's waiting gauges and dispatch counters (at 0) before anything waits, so
    /// dashboards and alerts see the series from the start.
    pub fn flow_defined(&mut self, pool: &str) {
        let Some(f) = self.flow_pool(pool) else {
            return;
        };
        if f.waiting.iter().all(Option::is_some) {
            return;
        }
        for class in Class::ALL {
            let band = class.index();
            if let Some(g) = f.waiting.get_mut(band) {
                g.get_or_insert_with(|| {
                    Gauge::define(&stat_name(
                        names::FLOW_WAITING,
                        &[("pool", pool), ("band", class.name())],
                    ))
                });
            }
            if let Some(c) = f.outcomes.get_mut(band).and_then(|b| b.first_mut()) {
                c.get_or_insert_with(|| {
                    Counter::define(&stat_name(
                        names::FLOW_OUTCOMES,
                        &[
                            ("pool", pool),
                            ("band", class.name()),
                            ("outcome", "dispatched"),
                        ],
                    ))
                });
            }
        }
    }

    /// How flow control ended one request of `class`; `waited_ms` for a dispatched one.
    pub fn flow_outcome(
        &mut self,
        pool: &str,
        class: Class,
        outcome: &str,
        waited_ms: Option<u64>,
    ) {
        let (band, band_name) = (class.index(), class.name());
        let Some(f) = self.flow_pool(pool) else {
            return;
        };
        let slot = names::FLOW_OUTCOME_NAMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(names::FLOW_OUTCOME_NAMES.len() - 1);
        if let Some(c) = f.outcomes.get_mut(band).and_then(|b| b.get_mut(slot)) {
            c.get_or_insert_with(|| {
                Counter::define(&stat_name(
                    names::FLOW_OUTCOMES,
                    &[("pool", pool), ("band", band_name), ("outcome", outcome)],
                ))
            })
            .inc();
        }
        if let (Some(ms), Some(h)) = (waited_ms, f.wait.get_mut(band)) {
            h.get_or_insert_with(|| {
                Histogram::define(&stat_name(
                    names::FLOW_WAIT,
                    &[("pool", pool), ("band", band_name)],
                ))
            })
            .record(ms);
        }
    }

    /// This worker's waiting requests of `pool` per band now: the summed gauges move by the
    /// difference to what this worker published last.
    pub fn flow_waiting(&mut self, pool: &str, counts: [u64; 3]) {
        let Some(f) = self.flow_pool(pool) else {
            return;
        };
        for (class, &n) in Class::ALL.iter().zip(&counts) {
            let band = class.index();
            let (Some(last), Some(g)) = (f.published.get_mut(band), f.waiting.get_mut(band)) else {
                continue;
            };
            if n == *last {
                continue;
            }
            let gauge = g.get_or_insert_with(|| {
                Gauge::define(&stat_name(
                    names::FLOW_WAITING,
                    &[("pool", pool), ("band", class.name())],
                ))
            });
            let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            gauge.add(signed(n).saturating_sub(signed(*last)));
            *last = n;
        }
    }

    /// Pools whose waiting gauges this worker has moved (to bring back to 0 once empty).
    pub fn flow_pools(&self) -> Vec<String> {
        self.flow
            .iter()
            .filter(|(_, f)| f.published.iter().any(|&n| n > 0))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Pods set in an earlier tick but not in this one (gone from the snapshot) go to 0, once.
    pub fn end_tick(&mut self) {
        let tick = self.ticks;
        for p in self.pools.values_mut() {
            p.in_flight.retain(|_, (g, t)| {
                if *t != tick {
                    g.set(0);
                    return false;
                }
                true
            });
        }
    }
}
