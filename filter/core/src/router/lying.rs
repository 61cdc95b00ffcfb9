//! One lying pod among four honest ones, over many simulated requests: the real router, the
//! real shared store, a snapshot every scrape interval, and pods simulated as engines (a fixed
//! number of running slots, a FIFO queue, prefill time proportional to the prompt, then a
//! decode). The liar serves exactly as fast as the others but reports `waiting 0, running 0,
//! kv 0` (and, in one variant, sends its first byte at once, before any prefill).
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use super::*;
use crate::request::{parse, ApiKind};
use crate::store::MemoryStore;
use llm_router_snapshot::{Engine, Pod, Pool, Snapshot};
use std::collections::VecDeque;

const POOL: &str = "llama";
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const CONFIG: &str = r#"{"pools": [{"name": "llama", "cluster": "pool_llama",
  "models": ["meta-llama/Llama-3.1-8B-Instruct"]}], "snapshot": {"secret": "router-test-secret-0123456789abcdef"}}"#;
const PODS: usize = 4;
const LIAR: usize = 3;
/// Simulation step and scrape interval (ms).
const TICK_MS: u64 = 5;
const SCRAPE_MS: u64 = 100;
/// Engine: concurrent sequences, prefill cost, fixed latency.
const SLOTS: usize = 8;
const PREFILL_MS_PER_TOKEN: f64 = 0.1;
const BASE_MS: f64 = 20.0;

#[derive(Clone, Copy, PartialEq)]
enum Liar {
    /// Reports an empty engine, serves like the others.
    Metrics,
    /// Also sends its first response byte at once (teaching a near-zero cost).
    MetricsAndEarlyByte,
}

struct Req {
    pod: usize,
    pending: u32,
    work: f64,
    prompt_tokens: f64,
    decode_ms: f64,
    sent: u64,
    /// When its first byte reaches the filter / when it ends (once started).
    first_byte: Option<u64>,
    done: Option<u64>,
    byte_seen: bool,
}

struct Sim {
    router: Router,
    store: MemoryStore,
    fleet: Option<Fleet>,
    reqs: Vec<Req>,
    /// Per pod: indexes of running requests and of queued ones.
    running: Vec<Vec<usize>>,
    queued: Vec<VecDeque<usize>>,
    liar: Liar,
    now: u64,
}

impl Sim {
    fn new(liar: Liar) -> Sim {
        Sim {
            router: Router::new(Config::parse(CONFIG.as_bytes()).unwrap()),
            store: MemoryStore::new(),
            fleet: None,
            reqs: Vec::new(),
            running: vec![Vec::new(); PODS],
            queued: vec![VecDeque::new(); PODS],
            liar,
            now: 0,
        }
    }

    fn addr(i: usize) -> String {
        format!("10.0.0.{}:8000", i + 1)
    }

    fn scrape(&mut self) {
        let pods = (0..PODS)
            .map(|i| {
                let (waiting, running) =
                    (self.queued[i].len() as u32, self.running[i].len() as u32);
                let lie = i == LIAR;
                Pod {
                    address: Sim::addr(i),
                    engine: Engine::Vllm,
                    waiting: if lie { 0 } else { waiting },
                    running: if lie { 0 } else { running },
                    kv_usage: Some(if lie {
                        0.0
                    } else {
                        ((waiting + running) as f32 / (2.0 * SLOTS as f32)).min(1.0)
                    }),
                    block_size: 16,
                    num_blocks: 1000,
                    ..Pod::default()
                }
            })
            .collect();
        let snap = Snapshot {
            rewrites: None,
            objectives: None,
            generation: self.now + 1,
            created_ms: self.now,
            pools: vec![Pool {
                name: POOL.into(),
                cluster: "pool_llama".into(),
                models: vec![MODEL.into()],
                pods,
                peer_contexts: Vec::new(),
            }],
        };
        inflight::snapshot_baseline(&self.store, POOL);
        self.fleet = Some(Fleet::load(
            &self.store,
            snap,
            self.now,
            &self.router.config,
        ));
    }

    /// Routes request `n`; `Err(status)` when rejected.
    fn arrive(&mut self, n: usize, priority: i32) -> Result<usize, u16> {
        // Mixed workload: prompts of 100 to 2,500 tokens, answers of 0.2 to 2 s, every
        // prompt distinct (no prefix effects).
        let chars = 400 + (n * 7_919 % 25) * 400;
        let text: String = format!("{n} ")
            .chars()
            .cycle()
            .take(chars)
            .collect::<String>()
            + &format!(" question {n}");
        let body =
            serde_json::json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": text}]})
                .to_string();
        let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
        let ctx = Context {
            priority,
            now_ms: self.now,
            tie: n as u64,
            deadline_ms: None,
        };
        let out = self
            .router
            .route(&self.store, self.fleet.as_ref(), &req, ctx)
            .map_err(|e| e.status)?;
        let pod_addr = out.inflight_pod.unwrap();
        let pod = (0..PODS).find(|&i| Sim::addr(i) == pod_addr).unwrap();
        let id = self.reqs.len();
        self.reqs.push(Req {
            pod,
            pending: out.pending_tokens,
            work: out.work_tokens,
            prompt_tokens: chars as f64 / 4.0,
            decode_ms: 200.0 + (n * 104_729 % 10) as f64 * 200.0,
            sent: self.now,
            first_byte: None,
            done: None,
            byte_seen: false,
        });
        if pod == LIAR && self.liar == Liar::MetricsAndEarlyByte {
            self.reqs[id].first_byte = Some(self.now + 1);
        }
        self.queued[pod].push_back(id);
        Ok(pod)
    }

    fn step(&mut self) {
        self.now += TICK_MS;
        for pod in 0..PODS {
            // Finish, then start queued requests in free slots.
            let now = self.now;
            let reqs = &self.reqs;
            let (done, still): (Vec<usize>, Vec<usize>) = self.running[pod]
                .iter()
                .partition(|&&id| reqs[id].done.is_some_and(|d| d <= now));
            self.running[pod] = still;
            for id in done {
                self.deliver_first_byte(id);
                let r = &self.reqs[id];
                let pending = if r.byte_seen { 0 } else { r.pending };
                self.router
                    .finished(&self.store, POOL, &Sim::addr(pod), pending);
            }
            while self.running[pod].len() < SLOTS {
                let Some(id) = self.queued[pod].pop_front() else {
                    break;
                };
                let r = &mut self.reqs[id];
                let fb = now + (BASE_MS + r.prompt_tokens * PREFILL_MS_PER_TOKEN) as u64;
                r.first_byte = Some(r.first_byte.unwrap_or(fb).min(fb));
                r.done = Some(fb + r.decode_ms as u64);
                self.running[pod].push(id);
            }
        }
        for id in 0..self.reqs.len() {
            if self.reqs[id].first_byte.is_some_and(|t| t <= self.now) {
                self.deliver_first_byte(id);
            }
        }
    }

    fn deliver_first_byte(&mut self, id: usize) {
        let r = &mut self.reqs[id];
        if r.byte_seen || r.first_byte.is_none() {
            return;
        }
        r.byte_seen = true;
        let ttft = (r.first_byte.unwrap_or(self.now) - r.sent) as f64;
        let (pod, pending, work) = (r.pod, r.pending, r.work);
        self.router.first_byte(
            &self.store,
            POOL,
            &Sim::addr(pod),
            pending,
            Some((work, ttft)),
        );
    }

    /// Runs `n` arrivals, one every `every_ms`; returns requests routed per pod and rejected.
    fn run(&mut self, n: usize, every_ms: u64, priority: i32) -> ([usize; PODS], usize) {
        let mut routed = [0; PODS];
        let mut rejected = 0;
        let mut next_scrape = 0;
        let mut next_arrival = 0;
        let mut sent = 0;
        while sent < n {
            if self.now >= next_scrape {
                self.scrape();
                next_scrape += SCRAPE_MS;
            }
            while self.now >= next_arrival && sent < n {
                match self.arrive(sent, priority) {
                    Ok(pod) => routed[pod] += 1,
                    Err(_) => rejected += 1,
                }
                sent += 1;
                next_arrival += every_ms;
            }
            self.step();
        }
        (routed, rejected)
    }
}

fn liar_share(routed: [usize; PODS]) -> f64 {
    routed[LIAR] as f64 / routed.iter().sum::<usize>().max(1) as f64
}

/// Fair share ×1.5, the issue's bound.
const MAX_SHARE: f64 = 1.5 / PODS as f64;

#[test]
fn a_pod_reporting_an_empty_engine_gets_no_more_than_its_fair_share() {
    // About 80 % of the pool's capacity (4 × 8 slots, ~1.3 s per request: ~24 req/s offered
    // 20 req/s), and at capacity.
    for every_ms in [50, 40] {
        let mut sim = Sim::new(Liar::Metrics);
        let (routed, _) = sim.run(3_000, every_ms, 0);
        let share = liar_share(routed);
        assert!(
            share <= MAX_SHARE,
            "every {every_ms} ms: {routed:?}, liar share {share:.3}"
        );
    }
}

#[test]
fn a_pod_answering_before_it_works_gets_no_more_than_its_fair_share() {
    for every_ms in [50, 40] {
        let mut sim = Sim::new(Liar::MetricsAndEarlyByte);
        let (routed, _) = sim.run(3_000, every_ms, 0);
        let share = liar_share(routed);
        assert!(
            share <= MAX_SHARE,
            "every {every_ms} ms: {routed:?}, liar share {share:.3}"
        );
    }
}

#[test]
fn a_saturated_pool_with_one_lying_pod_still_sheds() {
    // Twice the pool's capacity, every request sheddable: once queues pass the threshold on
    // the honest pods, most are refused with 429 although one pod says it is empty.
    let mut sim = Sim::new(Liar::Metrics);
    let (_, rejected) = sim.run(4_000, 20, -1);
    assert!(rejected > 1_000, "{rejected} of 4000 shed");
}

#[test]
fn a_healthy_pool_with_one_idle_pod_does_not_shed() {
    let r = Router::new(Config::parse(CONFIG.as_bytes()).unwrap());
    let s = MemoryStore::new();
    let pod = |i: usize, waiting: u32| Pod {
        address: Sim::addr(i),
        engine: Engine::Vllm,
        waiting,
        running: 4,
        kv_usage: Some(0.3),
        block_size: 16,
        num_blocks: 1000,
        ..Pod::default()
    };
    let snap = |waits: [u32; 4]| Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 0,
        pools: vec![Pool {
            name: POOL.into(),
            cluster: "pool_llama".into(),
            models: vec![MODEL.into()],
            pods: (0..PODS).map(|i| pod(i, waits[i])).collect(),
            peer_contexts: Vec::new(),
        }],
    };
    let body = serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    let ctx = Context {
        priority: -1,
        now_ms: 10,
        tie: 1,
        deadline_ms: None,
    };
    for waits in [[2, 0, 3, 1], [0, 0, 9, 9]] {
        let fleet = Fleet::new(snap(waits), 0, vec![], &r.config);
        assert!(r.route(&s, Some(&fleet), &req, ctx).is_ok(), "{waits:?}");
    }
    // Three of four saturated: the pool is, whatever the fourth says.
    let fleet = Fleet::new(snap([9, 0, 9, 9]), 0, vec![], &r.config);
    assert_eq!(
        r.route(&s, Some(&fleet), &req, ctx).unwrap_err().status,
        429
    );
}

#[test]
fn a_learned_cost_stays_above_a_sixteenth_of_the_pools_median() {
    let r = Router::new(Config::parse(CONFIG.as_bytes()).unwrap());
    let s = MemoryStore::new();
    // Three pods learn 0.2 ms per token; the fourth answers at once (cost → the absolute floor).
    for i in 0..PODS {
        for k in 1..=6u32 {
            let w = f64::from(200 * k);
            let ttft = if i == LIAR { 0.0 } else { 30.0 + 0.2 * w };
            inflight::first_byte(&s, POOL, &Sim::addr(i), 0, Some((w, ttft)));
        }
    }
    // The fast one has 20,000 tokens of this proxy's prompts without a first byte: at the
    // floor (0.0125 ms/token) that is 250 ms of work, more than an idle pod's ~130 ms.
    inflight::routed(&s, POOL, &Sim::addr(LIAR), 20_000);
    let pods = (0..PODS)
        .map(|i| Pod {
            address: Sim::addr(i),
            engine: Engine::Vllm,
            running: 1,
            kv_usage: Some(0.1),
            ..Pod::default()
        })
        .collect();
    let snap = Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 0,
        pools: vec![Pool {
            name: POOL.into(),
            cluster: "pool_llama".into(),
            models: vec![MODEL.into()],
            pods,
            peer_contexts: Vec::new(),
        }],
    };
    let fleet = Fleet::new(snap, 0, vec![], &r.config);
    let body = serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(2_000)}]})
        .to_string();
    let req = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    let ctx = Context {
        priority: 0,
        now_ms: 10,
        tie: 1,
        deadline_ms: None,
    };
    let out = r.route(&s, Some(&fleet), &req, ctx).unwrap();
    assert_ne!(
        out.inflight_pod.as_deref(),
        Some(Sim::addr(LIAR).as_str()),
        "{out:?}"
    );
}
