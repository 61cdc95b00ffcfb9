//! Flow control at the Wasm level: a request no pod can take waits with its stream paused, is
//! dispatched on the root context's tick once load frees (also when the load freed on another
//! worker VM, which wakes it through its shared queue), and a client that hangs up while
//! waiting leaves nothing behind.

mod util;

use proxy_wasm_host::{Host, Request, Response, Vm};
use std::time::Duration;
use util::*;

const A: &str = "10.0.0.1:8000";

/// A VM with flow control on.
fn flow_vm(host: &Host) -> Vm {
    host.vm(&config_with(r#", "flow": {"enabled": true}"#))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A streamed chat request of about 100 prompt tokens.
fn stream(vm: &Vm, tag: &str) -> Request {
    stream_at(vm, tag, None)
}

/// The same with an `x-llm-router-priority` header.
fn stream_at(vm: &Vm, tag: &str, priority: Option<&str>) -> Request {
    stream_with(vm, tag, priority.map(|p| ("x-llm-router-priority", p)))
}

/// The same with one more request header.
fn stream_with(vm: &Vm, tag: &str, header: Option<(&str, &str)>) -> Request {
    let prompt = format!("{tag} {}", "word ".repeat(80));
    let body = serde_json::json!({"model": LLAMA, "stream": true,
        "messages": [{"role": "user", "content": prompt}]})
    .to_string();
    let mut r = post(vm, "/v1/chat/completions", body.as_bytes());
    if let Some((name, value)) = header {
        r.header(name, value);
    }
    r.body(body.as_bytes());
    r.send().unwrap_or_else(|e| panic!("{e}"));
    r
}

/// One pod with 4 requests waiting in its engine: it takes one more, then is full.
fn nearly_full_pod(host: &Host, vm: &Vm) {
    one_pod(host, vm, 4);
}

/// One pod with `waiting` requests waiting in its engine (8 running, KV 10 %).
fn one_pod(host: &Host, vm: &Vm, waiting: u32) {
    push_ok(
        vm,
        &snapshot(
            host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod(A, waiting, 8, 0.1)],
            )],
        ),
    );
}

/// [`nearly_full_pod`] and one request sent there (forwarded), after which the pod is full.
fn one_in_flight_on_a_full_pod(host: &Host, vm: &Vm) -> Request {
    nearly_full_pod(host, vm);
    let first = stream(vm, "one");
    assert!(first.forwarded(), "{}", first.explain());
    first
}

fn served(r: &mut Request) {
    r.property("upstream.address", A);
    r.respond_with(
        Response::new(200)
            .header("content-type", "text/event-stream")
            .chunk("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"),
    )
    .unwrap();
    r.finish().unwrap();
}

/// Serves `first` (on the full pod), then checks the waiting requests go one at a time in
/// `order`: after `step_ms`, the next is forwarded while the later ones still wait, and is
/// served in turn.
fn go_one_at_a_time(vm: &Vm, first: &mut Request, order: &mut [&mut Request], step_ms: u64) {
    served(first);
    for i in 0..order.len() {
        vm.advance(Duration::from_millis(step_ms)).unwrap();
        let (done, later) = order.split_at_mut(i + 1);
        let Some(now) = done.last_mut() else {
            return;
        };
        assert!(now.forwarded(), "{}", now.explain());
        later.iter().for_each(|r| waits(r));
        served(now);
    }
}

fn waits(r: &Request) {
    assert!(
        !r.forwarded() && r.local_response().is_none(),
        "should wait\n{}",
        r.explain()
    );
}

#[test]
fn a_request_waits_while_the_pool_is_full_and_goes_when_load_frees() {
    let host = host();
    let vm = flow_vm(&host);
    let mut first = one_in_flight_on_a_full_pod(&host, &vm);
    let mut second = stream(&vm, "two");
    waits(&second);
    assert_eq!(vm.tick_period(), Some(Duration::from_millis(20)));
    // Still full: a tick does not dispatch it.
    vm.advance(Duration::from_millis(50)).unwrap();
    waits(&second);
    assert_eq!(inflight_of(&host, "llama", A), 1);
    served(&mut first);
    vm.advance(Duration::from_millis(25)).unwrap();
    assert!(second.forwarded(), "{}", second.explain());
    assert_eq!(endpoints(&second).first().map(String::as_str), Some(A));
    assert_eq!(
        second.upstream_header(CLUSTER).as_deref(),
        Some("pool_llama")
    );
    assert_eq!(inflight_of(&host, "llama", A), 1);
    served(&mut second);
    assert_eq!(
        inflight_of(&host, "llama", A),
        0,
        "the dispatched stream released"
    );
    vm.advance(Duration::from_millis(25)).unwrap();
    assert_eq!(vm.tick_period(), Some(Duration::from_secs(1)));
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

#[test]
fn a_stream_that_frees_its_pod_brings_its_workers_dispatch_forward() {
    let host = host();
    let vm = flow_vm(&host);
    let mut first = one_in_flight_on_a_full_pod(&host, &vm);
    // Prompts of one size: each fills the pod's one free place exactly.
    let mut second = stream(&vm, "two");
    let third = stream(&vm, "six");
    waits(&second);
    waits(&third);
    assert_eq!(vm.tick_period(), Some(Duration::from_millis(20)));
    // The first ends: the next tick comes in a millisecond, not at the 20 ms period.
    served(&mut first);
    assert_eq!(vm.tick_period(), Some(Duration::from_millis(1)));
    vm.advance(Duration::from_millis(2)).unwrap();
    assert!(second.forwarded(), "{}", second.explain());
    waits(&third);
    // Back to the period while the third waits: nothing spins.
    assert_eq!(vm.tick_period(), Some(Duration::from_millis(20)));
    vm.advance(Duration::from_millis(10)).unwrap();
    waits(&third);
    served(&mut second);
    vm.advance(Duration::from_millis(2)).unwrap();
    assert!(third.forwarded(), "{}", third.explain());
    assert_eq!(vm.tick_period(), Some(Duration::from_secs(1)));
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

#[test]
fn a_queue_that_has_stood_past_the_bound_serves_its_newest_request_first() {
    let host = host();
    let vm = host
        .vm(&config_with(
            r#", "flow": {"enabled": true, "newest_first_after_ms": 1000}"#,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = one_in_flight_on_a_full_pod(&host, &vm);
    let mut second = stream(&vm, "two");
    waits(&second);
    // The second has waited past the bound: the queue stands. A third arrives and waits too.
    vm.advance(Duration::from_millis(1_100)).unwrap();
    let mut third = stream(&vm, "six");
    waits(&third);
    // Room for one at a time: the newest goes, the stale one waits on.
    go_one_at_a_time(&vm, &mut first, &mut [&mut third, &mut second], 2);
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

#[test]
fn by_default_a_full_pool_holds_standard_work_refuses_sheddable_and_lets_critical_go_first() {
    let host = host();
    // No `flow` section: the defaults hold.
    let vm = host
        .vm(&config_with(r#", "priority": {"trust_headers": true}"#))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = one_in_flight_on_a_full_pod(&host, &vm);
    let mut standard = stream(&vm, "two");
    waits(&standard);
    // Tags of one length: every request is as large as the pool's mean (the bound is exact).
    let shed = stream_at(&vm, "shd", Some("-1"));
    let lr = shed
        .local_response()
        .unwrap_or_else(|| panic!("{}", shed.explain()));
    assert_eq!(lr.status, 429);
    assert_eq!(lr.header(REASON), Some("rejected-saturated"));
    let mut critical = stream_at(&vm, "crt", Some("5"));
    waits(&critical);
    let flow = |name: &str, band: &str, outcome: Option<&str>| {
        let mut labels = vec![("pool", "llama"), ("band", band)];
        labels.extend(outcome.map(|o| ("outcome", o)));
        metric_sum(&host, name, &labels)
    };
    vm.advance(Duration::from_millis(25)).unwrap();
    let waiting = |band| flow("llm_router_flow_waiting", band, None);
    assert_eq!((waiting("standard"), waiting("critical")), (1, 1));
    // One slot frees: the critical request, though it came last, takes it.
    go_one_at_a_time(&vm, &mut first, &mut [&mut critical, &mut standard], 25);
    assert_eq!(inflight_of(&host, "llama", A), 0);
    let dispatched = |band| flow("llm_router_flow_requests_total", band, Some("dispatched"));
    assert_eq!((dispatched("standard"), dispatched("critical")), (1, 1));
    assert_eq!((waiting("standard"), waiting("critical")), (0, 0));
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

/// A held request that states its TTFT objective (`x-slo-ttft-ms`) is answered 429 once it can
/// no longer meet it, long before the class's 60 s time to live; one without waits on.
#[test]
fn a_held_request_is_refused_once_its_own_ttft_objective_has_passed() {
    let host = host();
    let vm = flow_vm(&host);
    let mut first = one_in_flight_on_a_full_pod(&host, &vm);
    let mut patient = stream(&vm, "two");
    let hurried = stream_with(&vm, "thr", Some(("x-slo-ttft-ms", "300")));
    let nonsense = stream_with(&vm, "fou", Some(("x-slo-ttft-ms", "soon")));
    waits(&patient);
    waits(&hurried);
    vm.advance(Duration::from_millis(250)).unwrap();
    waits(&hurried);
    vm.advance(Duration::from_millis(100)).unwrap();
    let lr = hurried
        .local_response()
        .unwrap_or_else(|| panic!("{}", hurried.explain()));
    assert_eq!(lr.status, 429);
    assert_eq!(lr.header(REASON), Some("rejected-deadline"));
    assert!(lr.header("retry-after").is_some());
    waits(&patient);
    waits(&nonsense);
    let refused = metric_sum(
        &host,
        "llm_router_flow_requests_total",
        &[
            ("pool", "llama"),
            ("band", "standard"),
            ("outcome", "deadline"),
        ],
    );
    assert_eq!(refused, 1);
    served(&mut first);
    vm.advance(Duration::from_millis(25)).unwrap();
    assert!(patient.forwarded(), "{}", patient.explain());
    served(&mut patient);
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

/// A request stating an objective that no pod with room is predicted to meet is refused at once
/// (429 `rejected-deadline`), not sent to join a queue it would leave too late; with an
/// objective the pod can meet, or none, it goes.
#[test]
fn a_request_no_pod_is_predicted_to_answer_within_its_objective_is_refused_at_once() {
    let host = host();
    let vm = flow_vm(&host);
    // Two requests wait in the engine: room for more, but not for a first token within 1 ms.
    one_pod(&host, &vm, 2);
    let mut first = stream(&vm, "one");
    assert!(first.forwarded(), "{}", first.explain());
    let hurried = stream_with(&vm, "two", Some(("x-slo-ttft-ms", "1")));
    let lr = hurried
        .local_response()
        .unwrap_or_else(|| panic!("{}", hurried.explain()));
    assert_eq!(lr.status, 429);
    assert_eq!(lr.header(REASON), Some("rejected-deadline"));
    let refused = metric_sum(
        &host,
        "llm_router_flow_requests_total",
        &[("pool", "llama"), ("outcome", "deadline")],
    );
    assert_eq!(refused, 1);
    let mut patient = stream_with(&vm, "thr", Some(("x-slo-ttft-ms", "60000")));
    assert!(patient.forwarded(), "{}", patient.explain());
    served(&mut first);
    served(&mut patient);
    assert_eq!(inflight_of(&host, "llama", A), 0);
    assert!(vm.violations().is_empty(), "{:?}", vm.violations());
}

/// Two worker VMs: B's request fills the pod, A's waits; A has ticked `ticked_ms` since.
fn held_on_a_behind_b(host: &Host, ticked_ms: u64) -> (Vm, Vm, Request, Request) {
    let (a, b) = (flow_vm(host), flow_vm(host));
    nearly_full_pod(host, &a);
    let on_b = stream(&b, "one");
    assert!(on_b.forwarded(), "{}", on_b.explain());
    let waiting = stream(&a, "two");
    waits(&waiting);
    a.advance(Duration::from_millis(ticked_ms)).unwrap();
    waits(&waiting);
    (a, b, on_b, waiting)
}

#[test]
fn a_request_waiting_on_one_worker_goes_when_another_worker_frees_the_pod() {
    let host = host();
    let (a, _b, mut on_b, waiting) = held_on_a_behind_b(&host, 40);
    served(&mut on_b);
    a.advance(Duration::from_millis(25)).unwrap();
    assert!(waiting.forwarded(), "{}", waiting.explain());
    assert_eq!(inflight_of(&host, "llama", A), 1);
}

#[test]
fn another_workers_stream_freeing_the_pod_wakes_the_waiting_worker_without_its_tick() {
    let host = host();
    // A's tick publishes that it holds a request; its next tick is 20 ms away.
    let (a, b, mut on_b, waiting) = held_on_a_behind_b(&host, 25);
    assert_eq!(a.tick_period(), Some(Duration::from_millis(20)));
    // B's stream frees the pod: B wakes A through A's own queue (its first byte and its end
    // each free room), and A's next dispatch comes in a millisecond.
    served(&mut on_b);
    assert!(a.deliver_queue_events().unwrap() >= 1);
    assert_eq!(a.tick_period(), Some(Duration::from_millis(1)));
    a.advance(Duration::from_millis(2)).unwrap();
    assert!(waiting.forwarded(), "{}", waiting.explain());
    // B holds nothing: nobody wakes it.
    assert_eq!(b.deliver_queue_events().unwrap(), 0);
    assert!(a.violations().is_empty(), "{:?}", a.violations());
    assert!(b.violations().is_empty(), "{:?}", b.violations());
}

#[test]
fn a_client_hanging_up_while_waiting_leaves_nothing_behind() {
    let host = host();
    let vm = flow_vm(&host);
    nearly_full_pod(&host, &vm);
    let mut first = stream(&vm, "one");
    let mut second = stream(&vm, "two");
    waits(&second);
    vm.advance(Duration::from_millis(25)).unwrap();
    second.finish().unwrap();
    // Nothing waits: the tick slows down, and the queue summary holds no entry.
    vm.advance(Duration::from_millis(25)).unwrap();
    assert_eq!(vm.tick_period(), Some(Duration::from_secs(1)));
    let summary = host
        .shared_data(&llm_router_core::flow::summary::key("llama"))
        .map(|(v, _)| llm_router_core::flow::summary::decode(&v))
        .unwrap_or_default();
    assert!(summary.is_empty(), "{summary:?}");
    assert_eq!(inflight_of(&host, "llama", A), 1, "only the first");
    served(&mut first);
    vm.advance(Duration::from_millis(1000)).unwrap();
    assert!(inflight(&host, "llama").is_empty());
    assert!(!second.forwarded());
}

/// A streamed chat request of tenant `tenant` (trusted fairness header).
fn stream_as(vm: &Vm, tag: &str, tenant: &str) -> Request {
    stream_with(vm, tag, Some(("x-llm-d-inference-fairness-id", tenant)))
}

#[test]
fn two_workers_each_holding_two_tenants_keep_dispatching() {
    // Each worker's head is its round robin's choice between tenants, which can be newer than
    // its oldest request. Judged on heads, worker A (head: light, newer than B's oldest) and
    // worker B (head: its oldest, newer than A's oldest) each deferred to the other until the
    // time to live: the pool stopped serving (seen in the tenants benchmark). Two VMs started
    // at the same instant also need distinct worker ids, or each overwrites the other's entry.
    let host = host();
    let cfg = config_with(r#", "flow": {"enabled": true}, "priority": {"trust_headers": true}"#);
    let vm = || host.vm(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (vm(), vm());
    nearly_full_pod(&host, &a);
    let step = Duration::from_millis(10);
    let mut x = stream_as(&a, "x", "heavy");
    assert!(x.forwarded(), "{}", x.explain());
    let mut h0 = stream_as(&a, "h0", "heavy");
    a.advance(step).unwrap();
    let h1 = stream_as(&a, "h1", "heavy");
    b.advance(step).unwrap();
    let g0 = stream_as(&b, "g0", "heavy");
    b.advance(step).unwrap();
    let g1 = stream_as(&b, "g1", "heavy");
    b.advance(step).unwrap();
    let m = stream_as(&b, "m", "light");
    a.advance(step).unwrap();
    let l = stream_as(&a, "l", "light");
    for r in [&h0, &h1, &g0, &g1, &m, &l] {
        waits(r);
    }
    // The oldest (h0, on A) goes first; A's round robin then puts its light request in front.
    served(&mut x);
    for _ in 0..4 {
        a.advance(step).unwrap();
        b.advance(step).unwrap();
    }
    assert!(h0.forwarded(), "{}", h0.explain());
    served(&mut h0);
    for _ in 0..6 {
        a.advance(step).unwrap();
        b.advance(step).unwrap();
    }
    // A holds the oldest work (h1) and sends its head, the light tenant's request.
    assert!(l.forwarded(), "nothing dispatched: {}", l.explain());
    for r in [&h1, &g0, &g1, &m] {
        waits(r);
    }
}
