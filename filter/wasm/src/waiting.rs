//! The waiting room: requests flow control holds in this worker until a pod of their pool can
//! take them ([`llm_router_core::flow`] decides; this file keeps the paused streams).
//!
//! A request no pod can take now is paused and queued here ([`enqueue`]). The root context's
//! tick ([`dispatch`]: every `flow.tick_ms` while anything waits) refuses what waited too long,
//! publishes this worker's queue summary (so the other workers order their requests behind
//! older ones here), and resumes queue heads while a pod can take them, applying their decision
//! from the root context (the stream picks its [`crate::stream::RouteState`] up at its response). A stream that
//! frees room on a pod brings the tick forward ([`wake_soon`]) and wakes the other workers
//! holding requests for that pool through their shared queues ([`wake_others`]).

use crate::host::{self, HostStore};
use crate::route;
use crate::stream::{RouteState, WaitingRequest};
use crate::worker::{self, Worker, HELD_READ_TICK};
use llm_router_core::flow::queue::Entry;
use llm_router_core::flow::{self as flowctl, summary, FlowConfig, Pushed, Queue};
use llm_router_core::priority::Class;
use llm_router_core::request::{self, ParsedRequest};
use llm_router_core::router::{Decision, Hold};
use llm_router_core::{Context as RouteContext, Fleet, Rejection};
use std::time::Duration;

/// How often the root context ticks while nothing waits (the gauges: snapshot age and
/// generation, in flight per pod).
pub const TICK: Duration = Duration::from_secs(1);
/// The tick a worker with waiting requests asks for when one of its streams frees room (its
/// first byte or its end): the dispatch runs in the root context about now instead of up to
/// `flow.tick_ms` later (proxy-wasm wakes a paused stream only from a callback; the root
/// context's tick is the one that belongs to no stream).
pub const WAKE: Duration = Duration::from_millis(1);
/// How long a worker trusts its last read of who waits elsewhere ([`wake_others`]): a read
/// costs one shared-data get, so at most 200 a second per pool on a busy worker instead of two
/// per request; a worker that started waiting since is woken this much later at most (its own
/// tick, `flow.tick_ms`, still comes too).
pub const WAITERS_READ: Duration = Duration::from_millis(5);

/// Whether the request may wait here: never with flow control off; behind the work already
/// waiting for its pool (here or on another worker) when that goes first; else if its pool is
/// full.
pub fn hold(
    w: &Worker,
    parsed: &ParsedRequest<'_>,
    ctx: RouteContext,
    fleet: Option<&Fleet>,
) -> Hold {
    let priority = ctx.priority;
    let flow = w.router.config.flow.enabled;
    // Work already waiting for the pool goes first: a new request joins the queue.
    let behind = flow
        .then(|| w.router.pool_of(parsed, ctx, fleet))
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
    match (flow, behind) {
        (false, _) => Hold::Never,
        (true, None) => Hold::IfFull,
        (true, Some(_)) => Hold::Behind,
    }
}

/// Queues the current stream (context `id`) for `pool`; false when it was refused (answered
/// with a 429 already). Turns the fast tick on.
pub fn enqueue(
    w: &mut Worker,
    id: u32,
    (pool, fairness): (&str, &str),
    now_ms: u64,
    deadline_ms: Option<u64>,
    waiting: WaitingRequest,
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
            route::send_reply(w, &r, "");
            false
        }
    }
}

/// Stream `id` hung up while waiting in `pool`'s queue: nothing of it stays there.
pub fn leave(w: &mut Worker, pool: &str, id: u32) {
    // An emptied queue stays until the next tick publishes that it is empty.
    let gone = w
        .waiting
        .get_mut(pool)
        .and_then(|q| q.remove(u64::from(id)));
    if let Some(e) = gone {
        w.metrics
            .flow_outcome(pool, Class::of(e.priority), "abandoned", None);
    }
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
    if host::set_effective_context(ctx) {
        let r = Rejection::not_queued(pool, refusal.reason(), w.router.config.retry_after_s);
        route::send_reply(w, &r, "");
    }
    host::set_effective_context(back);
}

/// The root context's dispatch: per pool, refuses what waited past its TTL, publishes this
/// worker's queue summary, then dispatches heads in order while a pod can take them and no
/// other worker holds work that goes first. The tick goes back to [`TICK`] once nothing waits.
pub fn dispatch(w: &mut Worker, root: u32) {
    let now_ns = host::now_nanos();
    let cfg = w.router.config.flow.clone();
    let fleet = w.fleet();
    let pools: Vec<String> = w.waiting.keys().cloned().collect();
    let known: Vec<String> = w.others.keys().cloned().collect();
    for pool in pools
        .iter()
        .chain(known.iter().filter(|p| !pools.contains(p)))
    {
        dispatch_pool(w, root, pool, fleet.as_deref(), &cfg, now_ns);
    }
    set_waiting_gauges(w);
    retick(w);
}

/// [`dispatch`] for one pool: the requests here, and the other workers' as published.
fn dispatch_pool(
    w: &mut Worker,
    root: u32,
    pool: &str,
    fleet: Option<&Fleet>,
    cfg: &FlowConfig,
    now_ns: u64,
) {
    let now_ms = now_ns / 1_000_000;
    let expired = w
        .waiting
        .get_mut(pool)
        .map(|q| q.expire(cfg, now_ms))
        .unwrap_or_default();
    for (e, why) in expired {
        let e = (e.key, Class::of(e.priority));
        refuse_waiting(w, e, pool, why, root);
    }
    let oldest = w.waiting.get(pool).map(Queue::oldest).unwrap_or([None; 3]);
    let others = summary::publish(&HostStore, pool, w.id, oldest, now_ms, cfg.summary_stale_ms);
    while dispatch_head(w, root, pool, fleet, &others, now_ns) {}
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
        w.others.insert(pool.to_string(), others);
    } else {
        w.others.remove(pool);
    }
}

/// Decides for the head of `pool`'s queue and dispatches it, answers it or leaves it waiting;
/// true when the next head may be tried.
fn dispatch_head(
    w: &mut Worker,
    root: u32,
    pool: &str,
    fleet: Option<&Fleet>,
    others: &[summary::Slot],
    now_ns: u64,
) -> bool {
    let now_ms = now_ns / 1_000_000;
    let Some(head) = w.waiting.get(pool).and_then(|q| q.peek(now_ms)) else {
        return false;
    };
    if w.waiting
        .get(pool)
        .is_some_and(|q| summary::ahead_of(others, w.id, q, now_ms))
    {
        return false;
    }
    let (key, item) = (head.key, &head.item);
    let Ok(parsed) = request::parse(item.kind, &item.body) else {
        // Parsed once already: cannot happen; never leave it waiting.
        if let Some(e) = w.waiting.get_mut(pool).and_then(|q| q.pop(now_ms)) {
            let e = (e.key, Class::of(e.priority));
            refuse_waiting(w, e, pool, flowctl::Refusal::Expired, root);
        }
        return true;
    };
    let ctx = RouteContext {
        priority: item.priority,
        now_ms,
        tie: worker::tie(&mut w.requests, now_ns, key),
        deadline_ms: head.deadline_ms,
    };
    let decision = w
        .router
        .decide(&HostStore, fleet, &parsed, ctx, Hold::IfFull);
    let model = parsed.model.to_string();
    match decision {
        Ok(Decision::Wait { .. }) => false,
        Ok(Decision::Routed(routed)) => resume_head(w, root, pool, routed, now_ns),
        Err(rej) => {
            refuse_head(w, root, pool, &rej, &model, now_ms);
            true
        }
    }
}

/// Takes the head of `pool`'s queue off and resumes its stream routed as `routed`; false when
/// the queue had no head after all.
fn resume_head(
    w: &mut Worker,
    root: u32,
    pool: &str,
    routed: llm_router_core::Route,
    now_ns: u64,
) -> bool {
    let now_ms = now_ns / 1_000_000;
    let Some(e) = w.waiting.get_mut(pool).and_then(|q| {
        let e = q.pop(now_ms);
        q.dispatched(now_ms);
        e
    }) else {
        return false;
    };
    let class = Class::of(e.priority);
    let Ok(stream) = u32::try_from(e.key) else {
        return true;
    };
    let Ok(parsed) = request::parse(e.item.kind, &e.item.body) else {
        return true;
    };
    if host::set_effective_context(stream) {
        let waited = now_ms.saturating_sub(e.enqueued_ms);
        w.metrics
            .flow_outcome(pool, class, "dispatched", Some(waited));
        let state = apply_to(w, stream, &e, &parsed, routed, now_ns);
        w.dispatched.insert(stream, state);
        host::resume_request();
    } else {
        w.metrics.flow_outcome(pool, class, "abandoned", None);
        abandoned(w, &routed);
    }
    host::set_effective_context(root);
    true
}

/// Applies `routed` to waiting stream `id` (the effective context).
fn apply_to(
    w: &mut Worker,
    id: u32,
    e: &Entry<WaitingRequest>,
    parsed: &ParsedRequest<'_>,
    routed: llm_router_core::Route,
    now_ns: u64,
) -> RouteState {
    let req = route::Request {
        id,
        kind: e.item.kind,
        parsed,
        body: &e.item.body,
        size: e.item.size,
        content_length: e.item.content_length,
    };
    route::apply(w, &req, routed, now_ns)
}

/// A stream routed as `routed` from the waiting room is gone: its count comes back at once.
fn abandoned(w: &mut Worker, routed: &llm_router_core::Route) {
    let Some(pod) = &routed.inflight_pod else {
        return;
    };
    if !w
        .router
        .finished(&HostStore, &routed.pool, pod, routed.pending_tokens)
    {
        w.ledger
            .defer_decrement(&routed.pool, pod, 1, routed.pending_tokens);
    }
    if let Some(adapter) = &routed.adapter {
        w.router
            .adapter_ended(&HostStore, &routed.pool, pod, adapter);
    }
}

/// Takes the head of `pool`'s queue off and answers it with `rej` (its deadline passed, or the
/// pool sheds it).
fn refuse_head(w: &mut Worker, root: u32, pool: &str, rej: &Rejection, model: &str, now_ms: u64) {
    let Some(e) = w.waiting.get_mut(pool).and_then(|q| q.pop(now_ms)) else {
        return;
    };
    let late = flowctl::Refusal::Late;
    let outcome = if rej.reason == late.reason() {
        late.outcome()
    } else {
        "shed"
    };
    w.metrics
        .flow_outcome(pool, Class::of(e.priority), outcome, None);
    if let Ok(stream) = u32::try_from(e.key) {
        if host::set_effective_context(stream) {
            route::send_reply(w, rej, model);
        }
    }
    host::set_effective_context(root);
}

/// The waiting gauges: this worker's counts per pool and band (0 for pools it emptied).
fn set_waiting_gauges(w: &mut Worker) {
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
}

/// The fast tick (`flow.tick_ms`) while anything waits, [`TICK`] once nothing does (and after a
/// [`WAKE`]); never slower than [`HELD_READ_TICK`] while a tally read is held here
/// (`tally.rs`, which calls it when it holds or answers one).
pub fn retick(w: &mut Worker) {
    let tick_ms = w.router.config.flow.tick_ms;
    let want_fast = !w.waiting.is_empty();
    let want_tally = !w.tally_held.is_empty();
    if want_fast != w.fast || want_tally != w.tally_tick || w.soon {
        let mut period = if want_fast {
            Duration::from_millis(tick_ms)
        } else {
            TICK
        };
        if want_tally {
            period = period.min(HELD_READ_TICK);
        }
        if host::set_tick_period(period) {
            w.fast = want_fast;
            w.tally_tick = want_tally;
            w.soon = false;
        }
    }
}

/// Brings this worker's next dispatch forward ([`WAKE`]) when requests wait here: one of its
/// streams just freed room on its pod (its prefill ended or it ended), or another worker's did.
/// Once per dispatch: a burst of endings asks once.
pub fn wake_soon(w: &mut Worker) {
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
pub fn wake_others(w: &mut Worker, pool: &str, now_ms: Option<u64>) {
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
        if let Some(q) = wake_queue(w, other) {
            host::enqueue_shared_queue(q, pool.as_bytes());
        }
    }
}

/// Worker `other`'s wake-up queue, resolved once and remembered.
fn wake_queue(w: &mut Worker, other: u64) -> Option<u32> {
    if let Some(q) = w.wake_queues.get(&other) {
        return Some(*q);
    }
    let q = host::resolve_shared_queue(&w.vm_id, &summary::wake_queue(other))?;
    // Bounded: a proxy runs a handful of workers; ids of workers gone are forgotten with the
    // rest when the map grows past them.
    if w.wake_queues.len() >= summary::MAX_SLOTS {
        w.wake_queues.clear();
    }
    w.wake_queues.insert(other, q);
    Some(q)
}
