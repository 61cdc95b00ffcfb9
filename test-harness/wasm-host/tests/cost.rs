//! The filter's host-call cost per routed request, counted at the Wasm boundary: how many
//! calls of each kind (shared-data gets and sets, header reads and writes, properties, logs,
//! …) and how many bytes they copy, and how often the host calls back into the module's
//! allocator to hand it data (every call that returns bytes does). Each kind has a budget
//! justified in `filter/README.md` ("Cost"): a change that adds calls on the request path fails
//! here and has to say why.

mod util;

use proxy_wasm_host::{CallCount, Response, Vm};
use std::collections::BTreeMap;
use util::*;

/// A pool of four idle pods, the pool of most tests.
fn four_pods(host: &proxy_wasm_host::Host, vm: &Vm) {
    let pods = (1..=4)
        .map(|i| pod(&format!("10.0.0.{i}:8000"), 0, 0, 0.1))
        .collect();
    push_ok(
        vm,
        &snapshot(host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );
}

/// One full routed request of a ~2 KB chat prompt: headers, body, decision, response headers,
/// the response body (streamed: two chunks; else one), end of stream; returns the per-kind
/// counts of that request.
fn routed_request(vm: &Vm, stream: bool, tag: &str) -> BTreeMap<String, CallCount> {
    let prompt = format!("{tag} {}", "the quick brown fox jumps over ".repeat(64));
    let body = serde_json::json!({"model": LLAMA, "stream": stream,
        "messages": [{"role": "system", "content": "You are brief."},
                     {"role": "user", "content": prompt}]})
    .to_string();
    assert!(body.len() > 1900 && body.len() < 2200, "{}", body.len());
    vm.count_calls(true);
    let mut r = post(vm, "/v1/chat/completions", body.as_bytes());
    r.body(body.as_bytes());
    r.send().unwrap_or_else(|e| panic!("{e}"));
    let served = endpoints(&r).first().cloned().expect("routed");
    r.property("upstream.address", served.as_str());
    let response = if stream {
        Response::new(200)
            .header("content-type", "text/event-stream")
            .chunk("data: {\"choices\":[]}\n\n")
            .chunk("data: [DONE]\n\n")
    } else {
        Response::new(200)
            .header("content-type", "application/json")
            .chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":500,\"completion_tokens\":20}}")
    };
    r.respond_with(response).unwrap();
    r.finish().unwrap();
    let counts = vm.call_counts();
    if std::env::var_os("COST_TRACE").is_some() {
        println!("{}", vm.trace_tail(60));
    }
    vm.count_calls(false);
    counts
}

fn calls(counts: &BTreeMap<String, CallCount>, kind: &str) -> u64 {
    counts.get(kind).map_or(0, |c| c.calls)
}

/// The table printed by the test (`--nocapture`) and kept in the README's "Cost" section.
fn table(counts: &BTreeMap<String, CallCount>) -> String {
    let mut out = format!(
        "{:<40} {:>5} {:>9} {:>9}\n",
        "host call", "calls", "bytes in", "bytes out"
    );
    for (k, c) in counts {
        out += &format!(
            "{k:<40} {:>5} {:>9} {:>9}\n",
            c.calls, c.bytes_in, c.bytes_out
        );
    }
    out
}

/// Budgets per kind for one routed request (4 pods, a new 2 KB prompt = 2 prefix-index pages,
/// no adapter), set to what the filter needs today: the larger of a streamed request (without
/// `include_usage`) and an unstreamed one whose JSON reply carries `usage`. Every call is
/// accounted for in filter/README.md, "Cost".
const BUDGET: &[(&str, u64)] = &[
    // The snapshot meta key (generation); the pool's load table at the decision, at the first
    // byte of a stream and at the end (each a read-modify-CAS-write); the 2 prefix-index pages.
    ("proxy_get_shared_data", 6),
    // The load table at the decision (no re-read: the CAS token of the decision's read),
    // at a stream's first byte and at the end; the 2 prefix-index pages the new prompt is
    // recorded in.
    ("proxy_set_shared_data", 5),
    // Every request header at once (:path, :method, content-length, the routing headers to
    // strip, the priority headers), and every response header at once (:status and, when
    // the reply can carry `usage`, its content-type): no per-header reads.
    ("proxy_get_header_map_pairs", 2),
    // The cluster and endpoint headers; the served header on the response (only with
    // `disclose.served_pod`, off in this configuration: one call fewer).
    ("proxy_replace_header_map_value", 3),
    // The request body, once; the reply's body chunk (one here) when it can carry `usage`,
    // scanned as it passes.
    ("proxy_get_buffer_bytes", 2),
    // upstream.address on the response.
    ("proxy_get_property", 1),
    // One before the decision (time, tie-break, send time), one after it (its duration for
    // llm_router_decision_duration_microseconds), one at the first byte of a stream, one at
    // the end of the answer (its life: the pod's mean request life).
    ("proxy_get_current_time_nanoseconds", 4),
    // clear_route_cache, so Envoy routes on the cluster header.
    ("proxy_call_foreign_function", 1),
    // llm_router_requests_total and llm_router_picks_total; the prompt and completion tokens
    // of a reply with `usage` (prefix and LoRA hits add one each when they happen).
    ("proxy_increment_metric", 4),
    // The decision time histogram.
    ("proxy_record_metric", 1),
    // A label set this worker meets for the first time is defined once, then its id is cached
    // (here the steady request may pick a pod the warm-up did not).
    ("proxy_define_metric", 1),
    // Nothing is logged (or formatted) for a routed request unless debug is on.
    ("proxy_log", 0),
    // The host's calls into the module to allocate what it hands over: the two header maps,
    // the body (and the reply chunk when read), upstream.address, and each shared-data value
    // found (the meta key and the load table at each of its reads; prefix pages a new prompt
    // does not find hand nothing over).
    (proxy_wasm_host::ALLOCATE, 8),
];

/// An unstreamed response teaches no prefill rate and its first byte comes just before its end:
/// no clock read and no load-table update at its first byte (its pending tokens are released
/// with the in-flight count at the end).
const UNSTREAMED_FEWER: &[(&str, u64)] = &[
    ("proxy_get_current_time_nanoseconds", 1),
    ("proxy_get_shared_data", 1),
    ("proxy_set_shared_data", 1),
];
/// A stream that did not ask for `include_usage` is not read: no body chunks, no token
/// counters (its extra load-table read at the first byte takes the chunk's allocation).
const STREAMED_FEWER: &[(&str, u64)] =
    &[("proxy_get_buffer_bytes", 1), ("proxy_increment_metric", 2)];

/// Fails unless every kind has a budget and stays within it (less `fewer`).
fn check_budget(counts: &BTreeMap<String, CallCount>, fewer: &[(&str, u64)]) {
    for kind in counts.keys() {
        assert!(
            BUDGET.iter().any(|(k, _)| k == kind),
            "a routed request makes {kind} calls, which have no budget here and no line in \
             filter/README.md's Cost section\n{}",
            table(counts)
        );
    }
    for &(kind, max) in BUDGET {
        let less = fewer
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n);
        let max = max - less;
        assert!(
            calls(counts, kind) <= max,
            "{kind}: {} calls per routed request, budget {max}\n{}",
            calls(counts, kind),
            table(counts)
        );
    }
}

#[test]
fn an_unstreamed_request_stays_within_its_host_call_budget() {
    let host = host();
    let vm = vm(&host);
    four_pods(&host, &vm);
    routed_request(&vm, false, "warm-up");
    let counts = routed_request(&vm, false, "steady");
    println!(
        "steady state, one unstreamed routed request (4 pods, 2 KB):\n{}",
        table(&counts)
    );
    check_budget(&counts, UNSTREAMED_FEWER);
    // And it was released: nothing in flight, nothing pending.
    for i in 1..=4 {
        let l = pod_load(&host, "llama", &format!("10.0.0.{i}:8000"));
        assert_eq!((l.in_flight, l.pending_tokens), (0, 0), "pod {i}");
    }
}

#[test]
fn a_routed_request_stays_within_its_host_call_budget() {
    let host = host();
    let vm = vm(&host);
    four_pods(&host, &vm);
    // The first request after a push decodes the snapshot (once per generation); the steady
    // state is the second and later requests.
    let first = routed_request(&vm, true, "warm-up");
    let counts = routed_request(&vm, true, "steady");
    println!("first request after a push:\n{}", table(&first));
    println!(
        "steady state, one streamed routed request (4 pods, 2 KB):\n{}",
        table(&counts)
    );
    check_budget(&counts, STREAMED_FEWER);
    let body_in: u64 = counts.values().map(|c| c.bytes_out).sum();
    let crossings: u64 = counts.values().map(|c| c.calls).sum();
    let allocations = calls(&counts, proxy_wasm_host::ALLOCATE);
    println!(
        "total: {} host calls + {allocations} allocation calls into the module, {body_in} bytes \
         into the module",
        crossings - allocations
    );
    // The body crosses once, plus small keys, values and headers.
    let body = counts
        .get("proxy_get_buffer_bytes")
        .map_or(0, |c| c.bytes_out);
    assert!(body > 1900, "the body was read: {body} bytes");
    assert!(
        body_in < body + 4096,
        "beyond the body, at most 4 KB cross into the module per request: {body_in}\n{}",
        table(&counts)
    );
}

#[test]
fn the_snapshot_is_read_once_per_generation_not_per_request() {
    let host = host();
    let vm = vm(&host);
    four_pods(&host, &vm);
    let first = routed_request(&vm, true, "warm-up");
    let second = routed_request(&vm, true, "steady");
    let gets = |c: &BTreeMap<String, CallCount>| {
        c.get("proxy_get_shared_data")
            .map_or((0, 0), |c| (c.calls, c.bytes_out))
    };
    let third = routed_request(&vm, true, "steady again");
    let (g1, _) = gets(&first);
    let (g2, _) = gets(&second);
    let (g3, _) = gets(&third);
    // The first request reads the encoded snapshot (and its baselines) too; later ones do not.
    // (Bytes are no measure: the load table and the prefix pages grow with the requests, and
    // four pods' snapshot is smaller than either.)
    assert!(g1 > g2, "first {g1} gets, then {g2}");
    // Steady state: the same number of reads, request after request.
    assert_eq!(g3, g2, "steady requests read the same keys");
}
