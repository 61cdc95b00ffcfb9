//! The proxy-wasm HTTP filter that Envoy loads: thin glue between Envoy and `llm-router-core`.
//!
//! Per request: hold the headers, read the whole body, let the core decide, then either set the
//! cluster header (and ask Envoy to re-route) plus `x-gateway-destination-endpoint` with the
//! ranked pods for the cluster's `override_host` policy, or answer with the core's rejection.
//! On the response: report the pod that served it; when the stream ends (completion, reset or
//! abort) release its in-flight count. The instance configured with `snapshot.endpoints`
//! (on a loopback-bound internal listener) also accepts the sidecar's signed snapshot pushes;
//! every other instance answers 404 on those paths.
//!
//! Envoy settings this relies on (see `envoy/envoy.yaml`): the Wasm plugin config has
//! `allow_on_headers_stop_iteration: true`; each pool's cluster uses the `override_host` LB
//! policy reading the endpoint header; the route table routes on the cluster header.

mod fleet;
mod host;
mod metrics;

use fleet::{Cache, PushOutcome};
use host::HostStore;
use llm_router_core::config::{
    slo_ttft_ms, UnknownPaths, FAIRNESS_HEADERS, LLMD_OBJECTIVE_HEADER, SLO_TTFT_HEADER,
};
use llm_router_core::flow::{self as flowctl, summary, Class, Pushed, Queue};
use llm_router_core::request::{self, ApiKind, Entry, RequestError};
use llm_router_core::router::{Answer, Decision, Hold};
use llm_router_core::usage::Scanner;
use llm_router_core::{inflight, Config, Context as RouteContext, Rejection, RouteMode, Router};
use metrics::Metrics;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(Root { id, worker: None })
    });
}}

/// How often the root context sets the gauges (snapshot age and generation, in flight per pod).
const TICK: Duration = Duration::from_secs(1);
/// The tick a worker with waiting requests asks for when one of its streams frees room (its
/// first byte or its end): the dispatch runs in the root context about now instead of up to
/// `flow.tick_ms` later (proxy-wasm wakes a paused stream only from a callback; the root
/// context's tick is the one that belongs to no stream).
const WAKE: Duration = Duration::from_millis(1);
/// How long a worker trusts its last read of who waits elsewhere ([`wake_others`]): a read
/// costs one shared-data get, so at most 200 a second per pool on a busy worker instead of two
/// per request; a worker that started waiting since is woken this much later at most (its own
/// tick, `flow.tick_ms`, still comes too).
const WAITERS_READ: Duration = Duration::from_millis(5);
/// Longest `x-llm-router-scores` value (bytes).
const SCORES_HEADER_MAX: usize = 512;

/// What one worker (one VM) keeps: the router, its decoded fleet and its metric ids.
struct Worker {
    router: Router,
    cache: Cache,
    metrics: Metrics,
    /// In-flight decrements that lost every compare-and-swap, paid on the tick.
    ledger: inflight::Ledger,
    requests: u64,
    /// Whether Envoy logs debug lines for this VM (asked once, when the VM is configured), so
    /// per-request debug lines are not even formatted otherwise.
    debug: bool,
    /// Paused streams waiting for their pool, per pool ([`llm_router_core::flow`]).
    waiting: HashMap<String, Queue<Waiting>>,
    /// What a stream dispatched from the root context needs at its response and end, by
    /// context id (taken by the stream at its response headers or its end).
    handoff: HashMap<u32, Handoff>,
    /// This worker's id in the pools' queue summaries.
    id: u64,
    /// Other workers' queue summaries per pool, as of this worker's last tick.
    others: HashMap<String, Vec<summary::Slot>>,
    /// Whether the fast tick (`flow.tick_ms`) is on.
    fast: bool,
    /// Whether the next tick was brought forward ([`WAKE`]): a stream of this worker freed room
    /// while requests wait here, or another worker's did ([`wake_others`]).
    soon: bool,
    /// The VM id the wake-up queues are registered under (`plugin_vm_id`).
    vm_id: String,
    /// Other workers' wake-up queues resolved so far, by worker id.
    wake_queues: HashMap<u64, u32>,
    /// Per pool, the other workers holding requests for it as last read (ms, ids): the summary
    /// is read again at most once per [`WAITERS_READ`] ([`wake_others`]).
    waiting_elsewhere: HashMap<String, (u64, Vec<u64>)>,
    /// When the gauges were last set (ms).
    gauges_ms: u64,
}

/// A paused stream waiting for its pool: what dispatching it needs.
struct Waiting {
    kind: ApiKind,
    body: Vec<u8>,
    /// The body's size in the host's buffer.
    size: usize,
    content_length: bool,
    priority: i32,
}

/// A dispatched stream's per-request state, made in the root context.
#[derive(Default)]
struct Handoff {
    routed: Option<Routed>,
    usage: Option<UsageTrack>,
    scores: Option<String>,
    /// The served name a rewrite rule chose (`served_model_header`).
    served_model: Option<String>,
}

struct Root {
    id: u32,
    worker: Option<Rc<RefCell<Worker>>>,
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
                let id = summary::worker_id(&HostStore, host::now_nanos());
                // Where the other workers wake this one when their streams free room.
                let _ = proxy_wasm::hostcalls::register_shared_queue(&summary::wake_queue(id));
                self.worker = Some(Rc::new(RefCell::new(Worker {
                    router: Router::new(config),
                    cache: Cache::default(),
                    metrics: Metrics::define(),
                    ledger: inflight::Ledger::default(),
                    requests: 0,
                    debug: host::log_enabled(LogLevel::Debug),
                    waiting: HashMap::new(),
                    handoff: HashMap::new(),
                    id,
                    others: HashMap::new(),
                    fast: false,
                    soon: false,
                    vm_id: host::property(&["plugin_vm_id"]).unwrap_or_default(),
                    wake_queues: HashMap::new(),
                    waiting_elsewhere: HashMap::new(),
                    gauges_ms: 0,
                })));
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
    /// ([`wake_others`]): the next dispatch comes now, as for room freed here.
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = proxy_wasm::hostcalls::dequeue_shared_queue(queue_id) {}
        if let Some(worker) = &self.worker {
            wake_soon(&mut worker.borrow_mut());
        }
    }

    /// Sets the gauges from shared data: every worker sees the same values, so whichever
    /// ticks last is right.
    fn on_tick(&mut self) {
        let Some(worker) = &self.worker else {
            return;
        };
        let mut w = worker.borrow_mut();
        let now_ms = host::now_ms();
        if w.fast || w.soon || !w.waiting.is_empty() {
            dispatch(&mut w, self.id);
        }
        if w.fast && now_ms.saturating_sub(w.gauges_ms) < 1000 {
            return;
        }
        w.gauges_ms = now_ms;
        let Worker {
            router,
            cache,
            metrics,
            ledger,
            ..
        } = &mut *w;
        // Decrements lost to contention since the last tick are paid now (one update per pool).
        ledger.settle(&HostStore);
        let fleet = cache.current(&HostStore, &router.config);
        metrics.begin_tick();
        match &fleet {
            Some(f) => {
                let age_ms = host::now_ms().saturating_sub(f.accepted_ms);
                metrics.snapshot(f.snapshot.generation, Some(age_ms / 1000));
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
            None => metrics.snapshot(0, None),
        }
        metrics.end_tick();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone()?;
        Some(Box::new(Http {
            id: context_id,
            worker,
            kind: Kind::Pass,
            body_size: 0,
            routed: None,
            usage: None,
            scores: None,
            served_model: None,
            signature: None,
            held: Held::default(),
            waiting_in: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not ours: headers pass untouched (but for the stripped routing headers).
    Pass,
    Api(ApiKind),
    Push,
    /// Already answered locally.
    Done,
}

/// A routed request's pool and counted pod, and what its first response byte will teach.
struct Routed {
    pool: String,
    pod: String,
    /// Prefill tokens still counted as pending on `pod` (0 once the first byte arrived).
    pending: u32,
    /// Prefill work ahead of and including this request on `pod` when it was routed.
    work: f64,
    /// Host time when it was routed (ns).
    sent_ns: u64,
    /// Whether the time to the first byte measures prefill: a streamed response or an
    /// embedding, answered by the pod that was chosen, with status 200.
    observe: bool,
    /// Whether the response is streamed. An unstreamed reply's first byte comes when the
    /// generation is done, just before its end: its pending tokens are released with the
    /// in-flight count at the end (one load-table update instead of two) unless its timing
    /// teaches a rate.
    streamed: bool,
    /// The status the serving pod answered with (0 until its response headers come): a run of
    /// server errors puts the pod behind the others.
    status: u16,
    /// `(pod, adapter)`: the LoRA adapter counted in flight on the pod chosen for it (where it
    /// stays counted if an Envoy retry served it elsewhere), uncounted at the end.
    lora: Option<(String, String)>,
}

/// Where a routed request's token usage is counted, and the reader of its response body.
struct UsageTrack {
    pool: String,
    model: String,
    /// Set at the response headers: a 200 with a JSON or SSE body is read.
    reading: bool,
    scanner: Scanner,
}

struct Http {
    id: u32,
    worker: Rc<RefCell<Worker>>,
    kind: Kind,
    /// Bytes of request body buffered so far.
    body_size: usize,
    routed: Option<Routed>,
    /// Set for routed requests whose response should carry `usage`.
    usage: Option<UsageTrack>,
    /// The debug scores header for the response (`debug_scores`).
    scores: Option<String>,
    /// The served name a rewrite rule chose, for `served_model_header` on the response.
    served_model: Option<String>,
    /// A push's signature header, kept from the request headers for the body.
    signature: Option<String>,
    /// What the body's decision needs from the request headers (read once, with all the
    /// others, at the headers).
    held: Held,
    /// The pool whose queue this stream waits in (removed from it when the stream ends).
    waiting_in: Option<String>,
}

/// Request header values kept from the headers to the body, so the body costs no header read
/// (and the whole header map is not held while the body arrives).
#[derive(Default)]
struct Held {
    /// The priority and objective headers, when the configuration trusts them.
    priority: Option<String>,
    objective: Option<String>,
    /// The fairness id (tenant), when the configuration trusts it.
    fairness: Option<String>,
    /// Whether the request declared a `content-length` (a rewritten body gets its new one).
    content_length: bool,
    /// Its time-to-first-token objective (`x-slo-ttft-ms`), bounding its wait in the queue.
    slo_ttft_ms: Option<u64>,
}

fn json_headers<'a>(extra: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(extra);
    h
}

/// The one answer to every push refused before its signature was verified: which check
/// failed is in the proxy's log only.
const FORBIDDEN: &str = r#"{"accepted":false,"error":{"message":"forbidden","type":"invalid_request_error","param":null,"code":"forbidden"}}"#;
/// The answer on the snapshot paths of an instance without `snapshot.endpoints`.
const NOT_FOUND: &str = r#"{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":"not_found"}}"#;

impl Http {
    fn log(&self, level: LogLevel, msg: &str) {
        host::log(level, &format!("llm-router[{}]: {msg}", self.id));
    }

    /// Whether debug lines are wanted (see [`Worker::debug`]).
    fn debug(&self) -> bool {
        self.worker.borrow().debug
    }

    /// Answers with `r`; `model` is the request's model when it resolved to `r.pool`. Pool
    /// names and health stay out of the body unless `disclose.pool_detail` is on.
    fn reject(&mut self, r: &Rejection, model: &str) -> Action {
        if !self.worker.borrow().router.config.disclose.pool_detail && !r.pool.is_empty() {
            let redacted = r.clone().without_pool_detail();
            return self.send_rejection(&redacted, model);
        }
        self.send_rejection(r, model)
    }

    fn send_rejection(&mut self, r: &Rejection, model: &str) -> Action {
        // Only a resolved model is a label value: client text never becomes a stat name.
        let model = if r.pool.is_empty() { "" } else { model };
        self.worker
            .borrow_mut()
            .metrics
            .request(&r.pool, model, "", r.outcome());
        self.send(r)
    }

    /// Sends `r` as the local reply (uncounted: [`Http::reject`] counts API requests).
    fn send(&mut self, r: &Rejection) -> Action {
        if self.debug() {
            self.log(
                LogLevel::Debug,
                &format!("rejected {}: {}", r.status, r.message),
            );
        }
        let w = self.worker.borrow();
        let retry = r.retry_after_s.map(|s| s.to_string());
        let mut headers = vec![(w.router.config.reason_header.as_str(), r.reason)];
        if let Some(s) = &retry {
            headers.push(("retry-after", s.as_str()));
        }
        if let Some(allow) = r.allow {
            headers.push(("allow", allow.as_str()));
        }
        host::send_response(r.status, &json_headers(&headers), r.body().as_bytes());
        drop(w);
        self.kind = Kind::Done;
        Action::Pause
    }

    /// `GET /v1/models`: the configured model names (with aliases and adapters) and those of
    /// the current snapshot's pools, in OpenAI's list shape.
    fn model_list(&self) -> String {
        let mut w = self.worker.borrow_mut();
        let Worker { cache, router, .. } = &mut *w;
        let fleet = cache.current(&HostStore, &router.config);
        let configured = router.config.models.keys().map(String::as_str);
        let reported = fleet
            .iter()
            .flat_map(|f| f.snapshot.pools.iter())
            .flat_map(|p| p.models.iter().map(String::as_str));
        request::model_list_json(configured.chain(reported))
    }

    /// Refuses a push that has not proven it holds the secret: 403 `forbidden`, always the
    /// same answer; `why` goes to the proxy's log only.
    fn forbid_push(&mut self, why: &str) -> Action {
        self.worker.borrow().metrics.push(false);
        let source = host::property(&["source", "address"]).unwrap_or_default();
        self.log(
            LogLevel::Warn,
            &format!("snapshot push refused (403, from {source}): {why}"),
        );
        self.answer(403, FORBIDDEN)
    }

    fn answer(&mut self, status: u16, body: &str) -> Action {
        host::send_response(status, &json_headers(&[]), body.as_bytes());
        self.kind = Kind::Done;
        Action::Pause
    }

    fn refuse_push(&mut self, status: u16, message: &str, code: &'static str) -> Action {
        self.worker.borrow().metrics.push(false);
        self.log(
            LogLevel::Warn,
            &format!("snapshot push refused ({status}): {message}"),
        );
        let body = serde_json::json!({
            "accepted": false,
            "error": {"message": message, "type": "invalid_request_error", "param": null, "code": code},
        });
        self.answer(status, &body.to_string())
    }

    fn on_push_body(&mut self, size: usize) -> Action {
        let Some(bytes) = host::request_body(size) else {
            return self.forbid_push("the request body could not be read");
        };
        let verified = {
            let w = self.worker.borrow();
            llm_router_snapshot::verify(
                w.router.config.snapshot.secret.as_bytes(),
                &bytes,
                self.signature.as_deref(),
            )
        };
        if let Err(e) = verified {
            return self.forbid_push(&e.to_string());
        }
        // Signed by the secret holder: from here on the answers may say what is wrong.
        let outcome = fleet::accept(&HostStore, &bytes, host::now_ms());
        match outcome {
            PushOutcome::Accepted {
                generation,
                pools,
                pods,
            } => {
                self.worker.borrow().metrics.push(true);
                let body = serde_json::json!({"accepted": true, "generation": generation, "pools": pools, "pods": pods});
                self.answer(200, &body.to_string())
            }
            PushOutcome::Invalid(msg) => self.refuse_push(400, &msg, "invalid_snapshot"),
            PushOutcome::StaleGeneration {
                generation,
                current,
            } => {
                self.worker.borrow().metrics.push(false);
                let body = serde_json::json!({
                    "accepted": false, "reason": "stale generation",
                    "generation": generation, "current": current,
                });
                self.answer(409, &body.to_string())
            }
            PushOutcome::GenerationAhead { generation, limit } => self.refuse_push(
                400,
                &format!(
                    "generation {generation} is more than {} ms ahead of this proxy's clock \
                     (at most {limit}); the sidecar's generations follow its clock in ms",
                    llm_router_snapshot::MAX_GENERATION_LEAD_MS
                ),
                "generation_ahead",
            ),
            PushOutcome::StoreFailed => {
                self.refuse_push(500, "shared data write failed", "internal_error")
            }
        }
    }

    fn on_api_body(&mut self, kind: ApiKind, size: usize) -> Action {
        let max = self.worker.borrow().router.config.max_body_bytes;
        if size > max {
            return self.reject(&Rejection::too_large(max), "");
        }
        // One clock read before the decision: the decision time, the tie-break entropy and the
        // send time the first byte is measured from; one after it, for its duration.
        let now_ns = host::now_nanos();
        let Some(body) = host::request_body(size) else {
            return self.reject(
                &Rejection::bad_request("invalid_request", "request body could not be read"),
                "",
            );
        };
        let parsed = match request::parse(kind, &body) {
            Ok(p) => p,
            Err(e) => {
                let code = match e {
                    RequestError::MissingModel | RequestError::BadModel => "invalid_model",
                    RequestError::Malformed(_) => "invalid_json",
                };
                return self.reject(&Rejection::bad_request(code, e.to_string()), "");
            }
        };
        let held = std::mem::take(&mut self.held);
        let mut w = self.worker.borrow_mut();
        w.requests = w.requests.wrapping_add(1);
        let cfg = &w.router.config;
        // Client-set priority counts only where the configuration trusts it.
        let priority = if cfg.priority.trust_headers {
            cfg.request_priority(held.priority.as_deref(), held.objective.as_deref())
        } else {
            0
        };
        let now_ms = now_ns / 1_000_000;
        let ctx = RouteContext {
            priority,
            now_ms,
            tie: now_ns ^ w.requests.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(self.id),
            // Counted from now: the whole body has arrived, nothing was sent yet.
            deadline_ms: held.slo_ttft_ms.map(|slo| now_ms.saturating_add(slo)),
        };
        let fleet = {
            let Worker { cache, router, .. } = &mut *w;
            cache.current(&HostStore, &router.config)
        };
        let flow = w.router.config.flow.enabled;
        // Work already waiting for the pool goes first: a new request joins the queue.
        let behind = flow
            .then(|| w.router.pool_of(&parsed, ctx, fleet.as_deref()))
            .flatten()
            .filter(|pool| {
                w.waiting
                    .get(pool)
                    .is_some_and(|q| q.goes_before(priority, ctx.now_ms))
                    || w.others.get(pool).is_some_and(|o| {
                        let standing = w.router.config.flow.standing_before(ctx.now_ms);
                        let class = Class::of(priority).index();
                        summary::ahead(o, w.id, class, ctx.now_ms, standing)
                    })
            });
        let hold = match (flow, behind) {
            (false, _) => Hold::Never,
            (true, None) => Hold::IfFull,
            (true, Some(_)) => Hold::Behind,
        };
        let decision = w
            .router
            .decide(&HostStore, fleet.as_deref(), &parsed, ctx, hold);
        let routed = match decision {
            Ok(Decision::Routed(r)) => r,
            Ok(Decision::Wait { pool }) => {
                let fairness = held.fairness.unwrap_or_default();
                let waiting = Waiting {
                    kind,
                    body,
                    size,
                    content_length: held.content_length,
                    priority,
                };
                let queued = enqueue(
                    &mut w,
                    self.id,
                    (&pool, &fairness),
                    ctx.now_ms,
                    ctx.deadline_ms,
                    waiting,
                );
                drop(w);
                if queued {
                    self.waiting_in = Some(pool);
                } else {
                    self.kind = Kind::Done;
                }
                return Action::Pause;
            }
            Err(rej) => {
                w.metrics
                    .decision_us(host::now_nanos().saturating_sub(now_ns) / 1000);
                if rej.reason == flowctl::Refusal::Late.reason() {
                    w.metrics
                        .flow_outcome(&rej.pool, Class::of(priority), "deadline", None);
                }
                drop(w);
                return self.reject(&rej, &parsed.model);
            }
        };
        let h = apply(
            &mut w,
            self.id,
            kind,
            &parsed,
            &body,
            size,
            held.content_length,
            routed,
            now_ns,
        );
        drop(w);
        self.routed = h.routed;
        self.usage = h.usage;
        self.scores = h.scores;
        self.served_model = h.served_model;
        Action::Continue
    }

    /// Takes what the root context left when it dispatched this stream.
    fn take_handoff(&mut self) {
        if self.waiting_in.is_none() {
            return;
        }
        let h = self.worker.borrow_mut().handoff.remove(&self.id);
        if let Some(h) = h {
            self.waiting_in = None;
            self.routed = h.routed;
            self.usage = h.usage;
            self.scores = h.scores;
            self.served_model = h.served_model;
        }
    }

    /// The first response byte arrived: the request's prefill is done; learn from its timing.
    fn first_byte(&mut self) {
        let Some(r) = &mut self.routed else {
            return;
        };
        if (r.pending == 0 || !r.streamed) && !r.observe {
            return;
        }
        // The clock is read only when the timing teaches something.
        let observed = r.observe.then(|| {
            let ttft_ms = host::now_nanos().saturating_sub(r.sent_ns) as f64 / 1e6;
            (r.work, ttft_ms)
        });
        let mut w = self.worker.borrow_mut();
        if !w
            .router
            .first_byte(&HostStore, &r.pool, &r.pod, r.pending, observed)
        {
            w.ledger.owe(&r.pool, &r.pod, 0, r.pending);
        }
        if r.pending > 0 {
            wake_soon(&mut w);
            wake_others(&mut w, &r.pool, None);
        }
        drop(w);
        r.pending = 0;
        r.observe = false;
    }

    fn release(&mut self) {
        self.take_handoff();
        if let Some(pool) = self.waiting_in.take() {
            // Hung up while waiting: nothing of it stays in the queue.
            let mut w = self.worker.borrow_mut();
            // An emptied queue stays until the next tick publishes that it is empty.
            let gone = w
                .waiting
                .get_mut(&pool)
                .and_then(|q| q.remove(u64::from(self.id)));
            if let Some(e) = gone {
                w.metrics
                    .flow_outcome(&pool, Class::of(e.priority), "abandoned", None);
            }
        }
        if let Some(r) = self.routed.take() {
            let mut w = self.worker.borrow_mut();
            // The clock is read for an error run's window (server errors) and an answer's life
            // (the pod's mean request life, what a request waiting for an adapter slot waits).
            let now_ns = (r.status != 0).then(host::now_nanos);
            let now_ms = now_ns.map(|ns| ns / 1_000_000);
            let answer = match (r.status, now_ns) {
                (500.., Some(ns)) => Answer::status(r.status, ns / 1_000_000),
                (1..=499, Some(ns)) => Answer {
                    status: r.status,
                    now_ms: 0,
                    life_ms: Some(ns.saturating_sub(r.sent_ns) as f64 / 1e6),
                },
                _ => Answer::status(0, 0),
            };
            if !w
                .router
                .finished_with_status(&HostStore, &r.pool, &r.pod, r.pending, answer)
            {
                // Lost to contention: paid on the next tick rather than leaked.
                w.ledger.owe(&r.pool, &r.pod, 1, r.pending);
            }
            if let Some((pod, adapter)) = &r.lora {
                w.router.adapter_ended(&HostStore, &r.pool, pod, adapter);
            }
            wake_soon(&mut w);
            wake_others(&mut w, &r.pool, now_ms);
        }
        if let Some(u) = self.usage.take() {
            let usage = u.scanner.usage();
            if usage.prompt.is_some() || usage.completion.is_some() {
                self.worker.borrow_mut().metrics.tokens(
                    &u.pool,
                    &u.model,
                    usage.prompt.unwrap_or(0),
                    usage.completion.unwrap_or(0),
                );
            }
        }
    }
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Borrowed, not cloned: no configuration string is copied per request.
        let worker = Rc::clone(&self.worker);
        let w = worker.borrow();
        let c = &w.router.config;
        // Every header in one call; the ones read below are looked up in this copy.
        let headers = host::request_headers();
        // Routing headers come from this filter only, never from clients (removed only when
        // present: a removal is a host call too). The rewrite header tells the pod which model
        // name the filter substituted; a client's own would pass for the filter's.
        for name in [&c.endpoint_header, &c.cluster_header, &c.rewrite_header] {
            if headers.contains(name) {
                host::remove_request_header(name);
            }
        }
        let full_path = headers.get(":path").unwrap_or_default();
        let (path, query) = full_path.split_once('?').unwrap_or((full_path, ""));
        let (is_push, is_state) = (path == c.snapshot.push_path, path == c.snapshot.state_path);
        let is_tally = path == c.snapshot.tally_path;
        let (endpoints, max_body) = (c.snapshot.endpoints, c.max_body_bytes);
        drop(w);
        let method = headers.get(":method").unwrap_or_default();
        if is_push || is_state || is_tally {
            if !endpoints {
                // Not this listener's business: the endpoints live on the internal listener.
                return self.answer(404, NOT_FOUND);
            }
            if is_state {
                let json = if query.split('&').any(|q| q == "summary") {
                    fleet::state_summary_json(&HostStore, host::now_ms())
                } else {
                    fleet::state_json(&HostStore, host::now_ms())
                };
                return self.answer(200, &json);
            }
            if is_tally {
                let bytes = fleet::tally_bytes(&HostStore, host::now_ms());
                host::send_response(
                    200,
                    &[
                        ("content-type", "application/x-llm-router-tally"),
                        ("cache-control", "no-store"),
                    ],
                    &bytes,
                );
                self.kind = Kind::Done;
                return Action::Pause;
            }
            if method != "POST" {
                return self.forbid_push(&format!("method {method}, not POST"));
            }
            if end_of_stream {
                return self.forbid_push("empty body");
            }
            self.signature = headers
                .get(llm_router_snapshot::SIGNATURE_HEADER)
                .map(str::to_string);
            self.kind = Kind::Push;
            return Action::Pause;
        }
        // An API path the filter owns never passes unrouted: a wrong method is 405, a POST
        // without a body 400; the model list is answered here; other paths pass, or are 404
        // with `unknown_paths: reject`.
        let kind = match Entry::of(method, path, end_of_stream) {
            Entry::Api(kind) => kind,
            Entry::Models => {
                let json = self.model_list();
                return self.answer(200, &json);
            }
            Entry::WrongMethod { allow } => {
                return self.reject(&Rejection::method_not_allowed(method, allow), "");
            }
            Entry::NoBody => return self.reject(&Rejection::missing_body(), ""),
            Entry::Unknown => {
                let reject = worker.borrow().router.config.unknown_paths == UnknownPaths::Reject;
                if reject {
                    return self.send(&Rejection::path_not_found());
                }
                return Action::Continue;
            }
        };
        let length = headers.get("content-length");
        if length
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_some_and(|n| n > max_body)
        {
            return self.reject(&Rejection::too_large(max_body), "");
        }
        let w = worker.borrow();
        let c = &w.router.config;
        // Client-set priority is kept only where the configuration trusts it.
        let trusted = |name: &str| {
            c.priority
                .trust_headers
                .then(|| headers.get(name).map(str::to_string))
                .flatten()
        };
        self.held = Held {
            priority: trusted(&c.priority_header),
            objective: trusted(LLMD_OBJECTIVE_HEADER).or_else(|| trusted(&c.objective_header)),
            fairness: FAIRNESS_HEADERS.iter().find_map(|h| trusted(h)),
            content_length: headers.contains("content-length"),
            slo_ttft_ms: headers.get(SLO_TTFT_HEADER).and_then(slo_ttft_ms),
        };
        drop(w);
        self.kind = Kind::Api(kind);
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_size = body_size;
        match self.kind {
            Kind::Pass => Action::Continue,
            Kind::Done => Action::Pause,
            Kind::Push => {
                let max = self.worker.borrow().router.config.snapshot.max_bytes;
                if body_size > max {
                    return self
                        .forbid_push(&format!("body over snapshot.max_bytes ({max}), not read"));
                }
                if !end_of_stream {
                    return Action::Pause;
                }
                self.on_push_body(body_size)
            }
            Kind::Api(kind) => {
                let max = self.worker.borrow().router.config.max_body_bytes;
                if body_size > max {
                    return self.reject(&Rejection::too_large(max), "");
                }
                if !end_of_stream {
                    return Action::Pause;
                }
                self.kind = Kind::Pass;
                self.on_api_body(kind, body_size)
            }
        }
    }

    /// Trailers end a request whose last body chunk did not say end-of-stream: the body is
    /// complete now, so decide here (otherwise the request would pass unrouted).
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let size = self.body_size;
        match self.kind {
            Kind::Pass => Action::Continue,
            Kind::Done => Action::Pause,
            Kind::Push => self.on_push_body(size),
            Kind::Api(kind) => {
                self.kind = Kind::Pass;
                self.on_api_body(kind, size)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.take_handoff();
        if let Some(scores) = self.scores.take() {
            let w = self.worker.borrow();
            host::set_response_header(&w.router.config.scores_header, &scores);
        }
        if let Some(name) = self.served_model.take() {
            let w = self.worker.borrow();
            host::set_response_header(&w.router.config.served_model_header, &name);
        }
        // The response headers, read at most once (one host call for all of them).
        let mut headers: Option<host::HeaderMap> = None;
        if let Some(r) = &mut self.routed {
            // Only a real upstream served the request (not, say, Envoy's own 503).
            if let Some(served) = host::property(&["upstream", "address"]).filter(|a| !a.is_empty())
            {
                let mut w = self.worker.borrow_mut();
                if w.router.config.disclose.served_pod {
                    host::set_response_header(&w.router.config.served_header, &served);
                }
                if served != r.pod {
                    // A retry went elsewhere: the work measured was another pod's, learn nothing.
                    if !w
                        .router
                        .moved(&HostStore, &r.pool, &r.pod, &served, r.pending)
                    {
                        // The chosen pod is owed its count and pending work. The served one was
                        // not raised: its count is one low until this request ends (and its end,
                        // saturating at zero, heals it), never one high for good.
                        w.ledger.owe(&r.pool, &r.pod, 1, r.pending);
                        r.pending = 0;
                    }
                    r.pod = served;
                    r.observe = false;
                }
                drop(w);
                let h = headers.get_or_insert_with(host::response_headers);
                r.status = h.get(":status").and_then(|v| v.parse().ok()).unwrap_or(0);
                if r.status != 200 {
                    r.observe = false;
                }
                if end_of_stream {
                    self.first_byte();
                }
            }
        }
        if let Some(u) = &mut self.usage {
            let h = headers.get_or_insert_with(host::response_headers);
            let readable = h.get(":status") == Some("200")
                && !end_of_stream
                && h.get("content-type").is_some_and(|t| {
                    let t = t.to_ascii_lowercase();
                    t.contains("json") || t.starts_with("text/event-stream")
                });
            if readable {
                u.reading = true;
            } else {
                self.usage = None;
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if body_size > 0 {
            self.first_byte();
            // Each chunk is read as it passes (the stream is never held) for its `usage`.
            if let Some(u) = self.usage.as_mut().filter(|u| u.reading) {
                if let Some(chunk) = host::response_body(body_size) {
                    u.scanner.feed(&chunk);
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}

impl Drop for Http {
    /// A stream torn down without a log callback still releases its count.
    fn drop(&mut self) {
        self.release();
    }
}

/// Applies a routing decision to the effective stream (context `id`): the cluster and endpoint
/// headers, the body's model rewrite, the route cache, the metrics; returns the stream's
/// per-request state.
#[allow(clippy::too_many_arguments)]
fn apply(
    w: &mut Worker,
    id: u32,
    kind: ApiKind,
    parsed: &request::ParsedRequest<'_>,
    body: &[u8],
    size: usize,
    content_length: bool,
    routed: llm_router_core::Routed,
    now_ns: u64,
) -> Handoff {
    let mut out = Handoff::default();
    let cfg = &w.router.config;
    host::set_request_header(&cfg.cluster_header, &routed.cluster);
    if !routed.endpoints.is_empty() {
        host::set_request_header(&cfg.endpoint_header, &routed.endpoints.join(","));
    }
    if let Some(new_model) = &routed.rewrite {
        let (start, end) = parsed.model_span;
        let quoted = serde_json::Value::String(new_model.clone()).to_string();
        if let (Some(head), Some(tail)) = (body.get(..start), body.get(end..)) {
            let mut new_body = Vec::with_capacity(body.len() + quoted.len());
            new_body.extend_from_slice(head);
            new_body.extend_from_slice(quoted.as_bytes());
            new_body.extend_from_slice(tail);
            if host::replace_request_body(size, &new_body) {
                // A chunked request stays chunked; a sized one gets its new size.
                if content_length {
                    host::set_request_header("content-length", &new_body.len().to_string());
                }
                host::set_request_header(&cfg.rewrite_header, new_model);
            }
        }
    }
    if !host::clear_route_cache() {
        host::log(
            LogLevel::Warn,
            "llm-router: clear_route_cache is not available in this host",
        );
    }
    if w.router.config.debug_scores {
        out.scores = Some(llm_router_core::metrics::scores_header(
            routed.mode.name(),
            &routed.scores,
            SCORES_HEADER_MAX,
        ));
    }
    let outcome = match routed.mode {
        RouteMode::Scored => llm_router_core::metrics::ROUTED,
        RouteMode::LeastInflight | RouteMode::Fallback => routed.mode.name(),
    };
    let m = &mut w.metrics;
    m.decision_us(host::now_nanos().saturating_sub(now_ns) / 1000);
    m.request(
        &routed.pool,
        &parsed.model,
        routed.served_model.as_deref().unwrap_or_default(),
        outcome,
    );
    // The name a rewrite rule chose, for the response.
    out.served_model = routed.served_model.clone();
    if let Some(first) = routed.endpoints.first() {
        m.picked(&routed.pool, first, routed.prefix_hit, routed.lora_hit);
    }
    // Usage is only looked for where the response carries it: unstreamed replies, streams
    // asked for it, and the APIs whose streams always report it.
    let reports_usage = !parsed.stream
        || parsed.include_usage
        || matches!(kind, ApiKind::Messages | ApiKind::Responses);
    if reports_usage {
        out.usage = Some(UsageTrack {
            pool: routed.pool.clone(),
            model: parsed.model.to_string(),
            reading: false,
            scanner: Scanner::default(),
        });
    }
    if w.debug {
        host::log(
            LogLevel::Debug,
            &format!(
                "llm-router[{id}]: model {} → pool {} [{}] {:?}",
                parsed.model,
                routed.pool,
                routed.mode.name(),
                routed.scores
            ),
        );
    }
    if let Some(pod) = routed.inflight_pod {
        let lora = routed.adapter.map(|a| (pod.clone(), a));
        out.routed = Some(Routed {
            pool: routed.pool,
            pod,
            pending: routed.pending_tokens,
            work: routed.work_tokens,
            sent_ns: now_ns,
            observe: parsed.stream || kind == ApiKind::Embeddings,
            streamed: parsed.stream,
            status: 0,
            lora,
        });
    }
    out
}

/// Answers the effective stream with `r` (redacted unless `disclose.pool_detail`), counted.
fn send_reply(w: &mut Worker, r: &Rejection, model: &str) {
    let cfg = &w.router.config;
    let r = if !cfg.disclose.pool_detail && !r.pool.is_empty() {
        r.clone().without_pool_detail()
    } else {
        r.clone()
    };
    let model = if r.pool.is_empty() { "" } else { model };
    let retry = r.retry_after_s.map(|s| s.to_string());
    let mut headers = vec![(cfg.reason_header.as_str(), r.reason)];
    if let Some(s) = &retry {
        headers.push(("retry-after", s.as_str()));
    }
    host::send_response(r.status, &json_headers(&headers), r.body().as_bytes());
    w.metrics.request(&r.pool, model, "", r.outcome());
}

/// Answers waiting stream `key` of `class` (not the current one) with a 429 for `refusal`,
/// counts it, then makes `back` the effective context again.
fn refuse_waiting(
    w: &mut Worker,
    (key, class): (u64, Class),
    pool: &str,
    refusal: flowctl::Refusal,
    back: u32,
) {
    w.metrics.flow_outcome(pool, class, refusal.outcome(), None);
    let Ok(ctx) = u32::try_from(key) else {
        return;
    };
    if proxy_wasm::hostcalls::set_effective_context(ctx).is_ok() {
        let r = Rejection::not_queued(pool, refusal.reason(), w.router.config.retry_after_s);
        send_reply(w, &r, "");
    }
    let _ = proxy_wasm::hostcalls::set_effective_context(back);
}

/// Queues the current stream (context `id`) for `pool`; false when it was refused (answered
/// with a 429 already). Turns the fast tick on.
fn enqueue(
    w: &mut Worker,
    id: u32,
    (pool, fairness): (&str, &str),
    now_ms: u64,
    deadline_ms: Option<u64>,
    waiting: Waiting,
) -> bool {
    let cfg = w.router.config.flow.clone();
    let (priority, bytes) = (waiting.priority, waiting.body.len());
    let q = w.waiting.entry(pool.to_string()).or_default();
    let first_of_class = q.count(Class::of(priority)) == 0;
    match q.push_until(
        &cfg,
        u64::from(id),
        priority,
        fairness,
        bytes,
        now_ms,
        deadline_ms,
        waiting,
    ) {
        Pushed::Queued { displaced } => {
            if let Some(d) = displaced {
                let d = (d.key, Class::of(d.priority));
                refuse_waiting(w, d, pool, flowctl::Refusal::Displaced, id);
            }
            if !w.fast {
                w.fast = host::set_tick_period(Duration::from_millis(cfg.tick_ms));
            }
            // The class's oldest changed: the other workers see it now (they order behind it
            // and wake this worker when their traffic frees room), not at this worker's tick.
            if first_of_class {
                let oldest = w.waiting.get(pool).map(Queue::oldest).unwrap_or([None; 3]);
                summary::publish(&HostStore, pool, w.id, oldest, now_ms, cfg.summary_stale_ms);
            }
            true
        }
        Pushed::Refused(why, _) => {
            w.metrics
                .flow_outcome(pool, Class::of(priority), why.outcome(), None);
            if w.waiting.get(pool).is_some_and(Queue::is_empty) {
                w.waiting.remove(pool);
            }
            let r = Rejection::not_queued(pool, why.reason(), w.router.config.retry_after_s);
            send_reply(w, &r, "");
            false
        }
    }
}

/// The root context's dispatch: per pool, refuses what waited past its TTL, publishes this
/// worker's queue summary, then dispatches heads in order while a pod can take them and no
/// other worker holds work that goes first. The tick goes back to [`TICK`] once nothing waits.
fn dispatch(w: &mut Worker, root: u32) {
    let now_ns = host::now_nanos();
    let now_ms = now_ns / 1_000_000;
    let cfg = w.router.config.flow.clone();
    let fleet = {
        let Worker { cache, router, .. } = &mut *w;
        cache.current(&HostStore, &router.config)
    };
    let pools: Vec<String> = w.waiting.keys().cloned().collect();
    let known: Vec<String> = w.others.keys().cloned().collect();
    for pool in pools
        .iter()
        .chain(known.iter().filter(|p| !pools.contains(p)))
    {
        let expired = w
            .waiting
            .get_mut(pool)
            .map(|q| q.expire(&cfg, now_ms))
            .unwrap_or_default();
        for (e, why) in expired {
            let e = (e.key, Class::of(e.priority));
            refuse_waiting(w, e, pool, why, root);
        }
        let oldest = w.waiting.get(pool).map(Queue::oldest).unwrap_or([None; 3]);
        let others = summary::publish(&HostStore, pool, w.id, oldest, now_ms, cfg.summary_stale_ms);
        while let Some(head) = w.waiting.get(pool).and_then(|q| q.peek(now_ms)) {
            if w.waiting
                .get(pool)
                .is_some_and(|q| summary::ahead_of(&others, w.id, q, now_ms))
            {
                break;
            }
            let (key, item) = (head.key, &head.item);
            let Ok(parsed) = request::parse(item.kind, &item.body) else {
                // Parsed once already: cannot happen; never leave it waiting.
                if let Some(e) = w.waiting.get_mut(pool).and_then(|q| q.pop(now_ms)) {
                    let e = (e.key, Class::of(e.priority));
                    refuse_waiting(w, e, pool, flowctl::Refusal::Expired, root);
                }
                continue;
            };
            w.requests = w.requests.wrapping_add(1);
            let ctx = RouteContext {
                priority: item.priority,
                now_ms,
                tie: now_ns ^ w.requests.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key,
                deadline_ms: head.deadline_ms,
            };
            let decision =
                w.router
                    .decide(&HostStore, fleet.as_deref(), &parsed, ctx, Hold::IfFull);
            let model = parsed.model.to_string();
            match decision {
                Ok(Decision::Wait { .. }) => break,
                Ok(Decision::Routed(routed)) => {
                    let Some(e) = w.waiting.get_mut(pool).and_then(|q| {
                        let e = q.pop(now_ms);
                        q.dispatched(now_ms);
                        e
                    }) else {
                        break;
                    };
                    let class = Class::of(e.priority);
                    let Ok(stream) = u32::try_from(e.key) else {
                        continue;
                    };
                    let parsed = match request::parse(e.item.kind, &e.item.body) {
                        Ok(p) => p,
                        Err(_) => continue,
                    };
                    if proxy_wasm::hostcalls::set_effective_context(stream).is_ok() {
                        let waited = now_ms.saturating_sub(e.enqueued_ms);
                        w.metrics
                            .flow_outcome(pool, class, "dispatched", Some(waited));
                        let h = apply(
                            w,
                            stream,
                            e.item.kind,
                            &parsed,
                            &e.item.body,
                            e.item.size,
                            e.item.content_length,
                            routed,
                            now_ns,
                        );
                        w.handoff.insert(stream, h);
                        let _ = proxy_wasm::hostcalls::resume_http_request();
                    } else {
                        w.metrics.flow_outcome(pool, class, "abandoned", None);
                        // The stream is gone: its count comes back at once.
                        if let Some(pod) = &routed.inflight_pod {
                            if !w.router.finished(
                                &HostStore,
                                &routed.pool,
                                pod,
                                routed.pending_tokens,
                            ) {
                                w.ledger.owe(&routed.pool, pod, 1, routed.pending_tokens);
                            }
                            if let Some(adapter) = &routed.adapter {
                                w.router
                                    .adapter_ended(&HostStore, &routed.pool, pod, adapter);
                            }
                        }
                    }
                    let _ = proxy_wasm::hostcalls::set_effective_context(root);
                }
                Err(rej) => {
                    if let Some(e) = w.waiting.get_mut(pool).and_then(|q| q.pop(now_ms)) {
                        let late = flowctl::Refusal::Late;
                        let outcome = if rej.reason == late.reason() {
                            late.outcome()
                        } else {
                            "shed"
                        };
                        w.metrics
                            .flow_outcome(pool, Class::of(e.priority), outcome, None);
                        if let Ok(stream) = u32::try_from(e.key) {
                            if proxy_wasm::hostcalls::set_effective_context(stream).is_ok() {
                                send_reply(w, &rej, &model);
                            }
                        }
                        let _ = proxy_wasm::hostcalls::set_effective_context(root);
                    }
                }
            }
        }
        if w.waiting.get(pool).is_some_and(Queue::is_empty) {
            w.waiting.remove(pool);
            summary::publish(
                &HostStore,
                pool,
                w.id,
                [None; 3],
                now_ms,
                cfg.summary_stale_ms,
            );
        }
        // Other workers' waiting work is remembered so new requests here queue behind it.
        if others.iter().any(|s| s.oldest.iter().any(|&o| o > 0)) {
            w.others.insert(pool.clone(), others);
        } else {
            w.others.remove(pool);
        }
    }
    // The waiting gauges: this worker's counts per pool and band (0 for pools it emptied).
    let mut counted = w.metrics.flow_pools();
    for pool in w.waiting.keys() {
        if !counted.contains(pool) {
            counted.push(pool.clone());
        }
    }
    for pool in &counted {
        let counts = w.waiting.get(pool).map_or([0; 3], |q| {
            Class::ALL.map(|c| u64::try_from(q.count(c)).unwrap_or(u64::MAX))
        });
        w.metrics.flow_waiting(pool, counts);
    }
    let want_fast = !w.waiting.is_empty();
    if want_fast != w.fast || w.soon {
        let period = if want_fast {
            Duration::from_millis(cfg.tick_ms)
        } else {
            TICK
        };
        if host::set_tick_period(period) {
            w.fast = want_fast;
            w.soon = false;
        }
    }
}

/// Brings this worker's next dispatch forward ([`WAKE`]) when requests wait here: one of its
/// streams just freed room on its pod (its prefill ended or it ended). Once per dispatch: a
/// burst of endings asks once.
fn wake_soon(w: &mut Worker) {
    if !w.soon && !w.waiting.is_empty() && host::set_tick_period(WAKE) {
        w.soon = true;
    }
}

/// One of this worker's streams freed room on a pod of `pool`: the other workers holding
/// requests for it are woken through their queues ([`summary::wake_queue`]), so a request
/// waiting on one worker goes when a pod frees on another's traffic without waiting for its
/// tick. Who waits is read from the pool's queue summary at most once per [`WAITERS_READ`],
/// and only with the clock the caller already read (`now_ms`; a stream's end): between reads,
/// and at a first byte, the last read answers. A worker that stopped waiting ignores the wake.
/// No host call at all while the last read found nobody and is fresh.
fn wake_others(w: &mut Worker, pool: &str, now_ms: Option<u64>) {
    let cfg = &w.router.config.flow;
    if !cfg.enabled {
        return;
    }
    let stale_ms = cfg.summary_stale_ms;
    let every_ms = WAITERS_READ.as_millis() as u64;
    if let Some(now) = now_ms {
        let due = w
            .waiting_elsewhere
            .get(pool)
            .is_none_or(|(read_ms, _)| now.saturating_sub(*read_ms) >= every_ms);
        if due {
            let ids = summary::to_wake(&HostStore, pool, w.id, || now, stale_ms);
            // Bounded by the configured pools (a pool's name comes from the routed request).
            w.waiting_elsewhere.insert(pool.to_string(), (now, ids));
        }
    }
    let others = match w.waiting_elsewhere.get(pool) {
        Some((_, ids)) if !ids.is_empty() => ids.clone(),
        _ => return,
    };
    for other in others {
        let queue = match w.wake_queues.get(&other) {
            Some(q) => Some(*q),
            None => {
                let name = summary::wake_queue(other);
                let q = proxy_wasm::hostcalls::resolve_shared_queue(&w.vm_id, &name)
                    .ok()
                    .flatten();
                if let Some(q) = q {
                    // Bounded: a proxy runs a handful of workers; ids of workers gone are
                    // forgotten with the rest when the map grows past them.
                    if w.wake_queues.len() >= summary::MAX_SLOTS {
                        w.wake_queues.clear();
                    }
                    w.wake_queues.insert(other, q);
                }
                q
            }
        };
        if let Some(q) = queue {
            let _ = proxy_wasm::hostcalls::enqueue_shared_queue(q, Some(pool.as_bytes()));
        }
    }
}
