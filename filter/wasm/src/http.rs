//! The HTTP context: one per stream. It strips the routing headers clients may not set, sorts
//! the request by its path (an API request, the model list, a snapshot endpoint
//! ([`crate::push`]) or someone else's), reads the whole body of an API request, lets the core
//! decide, then routes it ([`route::apply`]), answers it, or leaves it in the waiting room
//! ([`crate::waiting`]). On the response it notes the pod that served, learns from the first
//! byte and reads `usage`; at the end it releases the in-flight count.

use crate::host::{self, HeaderMap, HostStore};
use crate::route;
use crate::stream::{RouteState, WaitingRequest};
use crate::waiting;
use crate::worker::{self, Worker};
use llm_router_core::config::{
    slo_ttft_ms, UnknownPaths, FAIRNESS_HEADERS, LLMD_OBJECTIVE_HEADER, SLO_TTFT_HEADER,
};
use llm_router_core::flow as flowctl;
use llm_router_core::priority::Class;
use llm_router_core::request::{self, ApiKind, Entry, ParsedRequest, RequestError};
use llm_router_core::router::{Answer, Decision, Fleet};
use llm_router_core::{Config, Context as RouteContext, Rejection};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Not ours: headers pass untouched (but for the stripped routing headers).
    Pass,
    Api(ApiKind),
    Push,
    /// Already answered locally.
    Done,
}

/// Which snapshot endpoint a request's path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Push,
    State,
    Tally,
}

impl Endpoint {
    /// The endpoint at `path` (without its query), if any.
    pub fn of(path: &str, c: &Config) -> Option<Endpoint> {
        // In this order should two paths be the same.
        if path == c.snapshot.state_path {
            Some(Endpoint::State)
        } else if path == c.snapshot.tally_path {
            Some(Endpoint::Tally)
        } else if path == c.snapshot.push_path {
            Some(Endpoint::Push)
        } else {
            None
        }
    }
}

pub struct Http {
    pub id: u32,
    pub worker: Rc<RefCell<Worker>>,
    pub kind: Kind,
    /// Bytes of request body buffered so far.
    body_size: usize,
    /// What a routed request carries to its response and end.
    route: RouteState,
    /// A push's signature header, kept from the request headers for the body.
    pub signature: Option<String>,
    /// A tally read held until the tally moves ([`crate::tally`]).
    pub tally_held: bool,
    /// What the body's decision needs from the request headers (read once, with all the
    /// others, at the headers).
    saved: SavedHeaders,
    /// The pool whose queue this stream waits in (removed from it when the stream ends).
    waiting_in: Option<String>,
}

/// Request header values kept from the headers to the body, so the body costs no header read
/// (and the whole header map is not held while the body arrives).
#[derive(Default)]
struct SavedHeaders {
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

impl SavedHeaders {
    fn read(headers: &HeaderMap, c: &Config) -> SavedHeaders {
        // Client-set priority is kept only where the configuration trusts it.
        let trusted = |name: &str| {
            c.priority
                .trust_headers
                .then(|| headers.get(name).map(str::to_string))
                .flatten()
        };
        SavedHeaders {
            priority: trusted(&c.priority_header),
            objective: trusted(LLMD_OBJECTIVE_HEADER).or_else(|| trusted(&c.objective_header)),
            fairness: FAIRNESS_HEADERS.iter().find_map(|h| trusted(h)),
            content_length: headers.contains("content-length"),
            slo_ttft_ms: headers.get(SLO_TTFT_HEADER).and_then(slo_ttft_ms),
        }
    }
}

impl Http {
    pub fn new(id: u32, worker: Rc<RefCell<Worker>>) -> Http {
        Http {
            id,
            worker,
            kind: Kind::Pass,
            body_size: 0,
            route: RouteState::default(),
            signature: None,
            tally_held: false,
            saved: SavedHeaders::default(),
            waiting_in: None,
        }
    }

    pub fn log(&self, level: LogLevel, msg: &str) {
        host::log(level, &format!("llm-router[{}]: {msg}", self.id));
    }

    /// Whether debug lines are wanted (see [`Worker::debug`]).
    fn debug(&self) -> bool {
        self.worker.borrow().debug
    }

    /// Answers with `r`; `model` is the request's model when it resolved to `r.pool`. Pool
    /// names and health stay out of the body unless `disclose.pool_detail` is on.
    fn reject(&mut self, r: &Rejection, model: &str) -> Action {
        let r = route::disclosed(&self.worker.borrow().router.config, r);
        route::count_rejection(&mut self.worker.borrow_mut().metrics, &r, model);
        self.send(&r)
    }

    /// Sends `r` as the local reply (uncounted: [`Http::reject`] counts API requests).
    fn send(&mut self, r: &Rejection) -> Action {
        if self.debug() {
            self.log(
                LogLevel::Debug,
                &format!("rejected {}: {}", r.status, r.message),
            );
        }
        route::send_rejection(&self.worker.borrow().router.config, r);
        self.kind = Kind::Done;
        Action::Pause
    }

    /// Answers with `status` and the JSON `body`.
    pub fn answer(&mut self, status: u16, body: &str) -> Action {
        host::send_response(status, &route::json_headers(&[]), body.as_bytes());
        self.kind = Kind::Done;
        Action::Pause
    }

    /// `GET /v1/models`: the configured model names (with aliases and adapters) and those of
    /// the current snapshot's pools, in OpenAI's list shape.
    fn model_list(&self) -> String {
        let mut w = self.worker.borrow_mut();
        let fleet = w.fleet();
        let configured = w.router.config.models.keys().map(String::as_str);
        let reported = fleet
            .iter()
            .flat_map(|f| f.snapshot.pools.iter())
            .flat_map(|p| p.models.iter().map(String::as_str));
        request::model_list_json(configured.chain(reported))
    }

    /// The request headers of an API path the filter owns: it never passes unrouted (a wrong
    /// method is 405, a POST without a body 400); the model list is answered here; other paths
    /// pass, or are 404 with `unknown_paths: reject`. `Err` holds the answer already given.
    fn api_entry(
        &mut self,
        method: &str,
        path: &str,
        end_of_stream: bool,
    ) -> Result<ApiKind, Action> {
        match Entry::of(method, path, end_of_stream) {
            Entry::Api(kind) => Ok(kind),
            Entry::Models => {
                let json = self.model_list();
                Err(self.answer(200, &json))
            }
            Entry::WrongMethod { allow } => {
                Err(self.reject(&Rejection::method_not_allowed(method, allow), ""))
            }
            Entry::NoBody => Err(self.reject(&Rejection::missing_body(), "")),
            Entry::Unknown => {
                let reject =
                    self.worker.borrow().router.config.unknown_paths == UnknownPaths::Reject;
                if reject {
                    return Err(self.send(&Rejection::path_not_found()));
                }
                Err(Action::Continue)
            }
        }
    }

    /// The whole body of an API request: parse it, decide, then route, answer or wait.
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
        let saved = std::mem::take(&mut self.saved);
        let (decision, ctx) = self.decide(&parsed, &saved, now_ns);
        match decision {
            Ok(Decision::Routed(routed)) => {
                let req = route::Request {
                    id: self.id,
                    kind,
                    parsed: &parsed,
                    body: &body,
                    size,
                    content_length: saved.content_length,
                };
                self.route = route::apply(&mut self.worker.borrow_mut(), &req, routed, now_ns);
                Action::Continue
            }
            Ok(Decision::Wait { pool }) => {
                let waiting = WaitingRequest {
                    kind,
                    body,
                    size,
                    content_length: saved.content_length,
                    priority: ctx.priority,
                };
                let fairness = saved.fairness.unwrap_or_default();
                self.wait(&pool, &fairness, ctx, waiting)
            }
            Err(rej) => self.refused(&rej, ctx.priority, now_ns, &parsed.model),
        }
    }

    /// The core's decision for `parsed`, and the context it was made in.
    fn decide(
        &mut self,
        parsed: &ParsedRequest<'_>,
        saved: &SavedHeaders,
        now_ns: u64,
    ) -> (Result<Decision, Rejection>, RouteContext) {
        let mut w = self.worker.borrow_mut();
        let fleet = w.fleet();
        let ctx = route_context(&mut w, fleet.as_deref(), saved, self.id, now_ns);
        let hold = waiting::hold(&w, parsed, ctx, fleet.as_deref());
        let decision = w
            .router
            .decide(&HostStore, fleet.as_deref(), parsed, ctx, hold);
        (decision, ctx)
    }

    /// No pod of `pool` can take the request now: it waits in the waiting room, or is
    /// answered 429 when it cannot.
    fn wait(
        &mut self,
        pool: &str,
        fairness: &str,
        ctx: RouteContext,
        waiting: WaitingRequest,
    ) -> Action {
        let queued = waiting::enqueue(
            &mut self.worker.borrow_mut(),
            self.id,
            (pool, fairness),
            ctx.now_ms,
            ctx.deadline_ms,
            waiting,
        );
        if queued {
            self.waiting_in = Some(pool.to_string());
        } else {
            self.kind = Kind::Done;
        }
        Action::Pause
    }

    /// The core refused the request (`model` is its model): counted, answered.
    fn refused(&mut self, rej: &Rejection, priority: i32, now_ns: u64, model: &str) -> Action {
        let mut w = self.worker.borrow_mut();
        w.metrics
            .decision_us(host::now_nanos().saturating_sub(now_ns) / 1000);
        if rej.reason == flowctl::Refusal::Late.reason() {
            w.metrics
                .flow_outcome(&rej.pool, Class::of(priority), "deadline", None);
        }
        drop(w);
        self.reject(rej, model)
    }

    /// Takes what the root context left when it dispatched this stream from the waiting room.
    fn take_dispatched(&mut self) {
        if self.waiting_in.is_none() {
            return;
        }
        let state = self.worker.borrow_mut().dispatched.remove(&self.id);
        if let Some(state) = state {
            self.waiting_in = None;
            self.route = state;
        }
    }

    /// The response came from `served` (Envoy's `upstream.address`): a retry that went to
    /// another pod than the chosen one moves the count there.
    fn served_by(&mut self, served: String) {
        let Some(r) = &mut self.route.in_flight else {
            return;
        };
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
                // The chosen pod's count and pending work come down at the next settle. The
                // served one was not raised: its count is one low until this request ends (and
                // its end, saturating at zero, heals it), never one high for good.
                w.ledger.defer_decrement(&r.pool, &r.pod, 1, r.pending);
                r.pending = 0;
            }
            r.pod = served;
            r.observe = false;
        }
    }

    /// The first response byte arrived: the request's prefill is done; learn from its timing.
    fn first_byte(&mut self) {
        let Some(r) = &mut self.route.in_flight else {
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
            w.ledger.defer_decrement(&r.pool, &r.pod, 0, r.pending);
        }
        if r.pending > 0 {
            waiting::wake_soon(&mut w);
            waiting::wake_others(&mut w, &r.pool, None);
        }
        drop(w);
        r.pending = 0;
        r.observe = false;
    }

    /// The stream ended (completion, reset or abort): out of the waiting room, its in-flight
    /// count released, its token usage counted.
    fn release(&mut self) {
        self.take_dispatched();
        if std::mem::take(&mut self.tally_held) {
            crate::tally::forget(&mut self.worker.borrow_mut(), self.id);
        }
        if let Some(pool) = self.waiting_in.take() {
            // Hung up while waiting: nothing of it stays in the queue.
            waiting::leave(&mut self.worker.borrow_mut(), &pool, self.id);
        }
        if let Some(r) = self.route.in_flight.take() {
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
                w.ledger.defer_decrement(&r.pool, &r.pod, 1, r.pending);
            }
            if let Some((pod, adapter)) = &r.lora {
                w.router.adapter_ended(&HostStore, &r.pool, pod, adapter);
            }
            waiting::wake_soon(&mut w);
            waiting::wake_others(&mut w, &r.pool, now_ms);
        }
        if let Some(u) = self.route.usage.take() {
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

/// The decision's context for stream `id`: its priority (client-set only where the
/// configuration trusts it; an objective's from `fleet`'s objectives when the snapshot carries
/// them), the clock, the tie-break and its deadline.
fn route_context(
    w: &mut Worker,
    fleet: Option<&Fleet>,
    saved: &SavedHeaders,
    id: u32,
    now_ns: u64,
) -> RouteContext {
    let tie = worker::tie(&mut w.requests, now_ns, u64::from(id));
    let priority = if w.router.config.priority.trust_headers {
        w.router
            .request_priority(fleet, saved.priority.as_deref(), saved.objective.as_deref())
    } else {
        0
    };
    let now_ms = now_ns / 1_000_000;
    RouteContext {
        priority,
        now_ms,
        tie,
        // Counted from now: the whole body has arrived, nothing was sent yet.
        deadline_ms: saved.slo_ttft_ms.map(|slo| now_ms.saturating_add(slo)),
    }
}

/// Whether a response with these headers is read for its `usage`: a 200 with a JSON or SSE
/// body.
fn carries_usage(h: &HeaderMap, end_of_stream: bool) -> bool {
    h.get(":status") == Some("200")
        && !end_of_stream
        && h.get("content-type").is_some_and(|t| {
            let t = t.to_ascii_lowercase();
            t.contains("json") || t.starts_with("text/event-stream")
        })
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
        let endpoint = Endpoint::of(path, c);
        let max_body = c.max_body_bytes;
        drop(w);
        let method = headers.get(":method").unwrap_or_default();
        if let Some(endpoint) = endpoint {
            return self.on_endpoint_headers(endpoint, method, query, &headers, end_of_stream);
        }
        let kind = match self.api_entry(method, path, end_of_stream) {
            Ok(kind) => kind,
            Err(action) => return action,
        };
        let length = headers.get("content-length");
        if length
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_some_and(|n| n > max_body)
        {
            return self.reject(&Rejection::too_large(max_body), "");
        }
        self.saved = SavedHeaders::read(&headers, &worker.borrow().router.config);
        self.kind = Kind::Api(kind);
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_size = body_size;
        match self.kind {
            Kind::Pass => Action::Continue,
            Kind::Done => Action::Pause,
            Kind::Push => self.on_push_body_chunk(body_size, end_of_stream),
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
        self.take_dispatched();
        if let Some(scores) = self.route.scores.take() {
            let w = self.worker.borrow();
            host::set_response_header(&w.router.config.scores_header, &scores);
        }
        if let Some(name) = self.route.served_model.take() {
            let w = self.worker.borrow();
            host::set_response_header(&w.router.config.served_model_header, &name);
        }
        // The response headers, read at most once (one host call for all of them).
        let mut headers: Option<HeaderMap> = None;
        if self.route.in_flight.is_some() {
            // Only a real upstream served the request (not, say, Envoy's own 503).
            if let Some(served) = host::property(&["upstream", "address"]).filter(|a| !a.is_empty())
            {
                self.served_by(served);
                let h = headers.get_or_insert_with(host::response_headers);
                if let Some(r) = &mut self.route.in_flight {
                    r.status = h.get(":status").and_then(|v| v.parse().ok()).unwrap_or(0);
                    if r.status != 200 {
                        r.observe = false;
                    }
                }
                if end_of_stream {
                    self.first_byte();
                }
            }
        }
        if let Some(u) = &mut self.route.usage {
            let h = headers.get_or_insert_with(host::response_headers);
            if carries_usage(h, end_of_stream) {
                u.reading = true;
            } else {
                self.route.usage = None;
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if body_size > 0 {
            self.first_byte();
            // Each chunk is read as it passes (the stream is never held) for its `usage`.
            if let Some(u) = self.route.usage.as_mut().filter(|u| u.reading) {
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
