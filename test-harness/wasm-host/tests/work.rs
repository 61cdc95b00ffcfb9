//! The filter's per-pod work and timing counters at the Wasm level: pending prefill tokens and
//! learned prefill rates live in shared data, so every worker VM sees and feeds the same ones;
//! they return to zero when streams end, are aborted or are retried elsewhere; and what the
//! filter learns from its own traffic steers later requests.

mod util;

use proxy_wasm_host::{Request, Response};
use std::time::Duration;
use util::*;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

/// A streamed chat request of about `tokens` prompt tokens (4 characters each).
fn stream(vm: &proxy_wasm_host::Vm, tokens: usize, tag: &str) -> Request {
    let prompt = format!("{tag} {}", "word ".repeat(tokens * 4 / 5));
    let body = serde_json::json!({"model": LLAMA, "stream": true,
        "messages": [{"role": "user", "content": prompt}]})
    .to_string();
    let mut r = post(vm, "/v1/chat/completions", body.as_bytes());
    r.body(body.as_bytes());
    r.send().unwrap_or_else(|e| panic!("{e}"));
    r
}

fn two_idle_pods(host: &proxy_wasm_host::Host, vm: &proxy_wasm_host::Vm) {
    push_ok(
        vm,
        &snapshot(
            host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod(A, 0, 0, 0.1), pod(B, 0, 0, 0.1)],
            )],
        ),
    );
}

fn first_chunk(r: &mut Request, served: &str, status: u16) {
    r.property("upstream.address", served);
    r.respond_with(
        Response::new(status)
            .header("content-type", "text/event-stream")
            .chunk("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"),
    )
    .unwrap();
}

#[test]
fn pending_work_is_shared_by_workers_and_released_at_the_first_byte() {
    let host = host();
    let (vm1, vm2) = (vm(&host), vm(&host));
    two_idle_pods(&host, &vm1);

    let mut long = stream(&vm1, 2_000, "long");
    let first = endpoints(&long)[0].clone();
    let other = if first == A { B } else { A };
    let l = pod_load(&host, "llama", &first);
    assert_eq!(l.in_flight, 1);
    assert!((1_900..=2_100).contains(&l.pending_tokens), "{l:?}");
    // Worker 2 sees worker 1's pending prefill and sends its request to the other pod.
    let mut short = stream(&vm2, 100, "short");
    assert_eq!(endpoints(&short)[0], other, "{}", short.explain());

    host.advance_clock(Duration::from_millis(250));
    first_chunk(&mut long, &first, 200);
    let l = pod_load(&host, "llama", &first);
    assert_eq!((l.in_flight, l.pending_tokens), (1, 0), "{l:?}");
    assert!((l.fit.n - 1.0).abs() < 1e-9, "one observation: {l:?}");
    assert!((l.fit.st - 250.0).abs() < 1.0, "ttft 250 ms: {l:?}");
    long.finish().unwrap();
    assert_eq!(pod_load(&host, "llama", &first).in_flight, 0);

    // Aborted before any response byte: its pending tokens are released with the count.
    short.finish().unwrap();
    let l = pod_load(&host, "llama", other);
    assert_eq!((l.in_flight, l.pending_tokens), (0, 0), "{l:?}");
    assert_eq!(inflight(&host, "llama"), vec![]);
    assert_eq!(l.fit.n, 0.0, "an aborted request teaches nothing");
}

#[test]
fn a_retry_moves_the_pending_work_and_teaches_nothing() {
    let host = host();
    let vm = vm(&host);
    two_idle_pods(&host, &vm);
    let mut r = stream(&vm, 1_000, "retried");
    let chosen = endpoints(&r)[0].clone();
    let served = if chosen == A { B } else { A };
    host.advance_clock(Duration::from_millis(400));
    // Envoy's retry went to the fallback; the headers arrive first, then the first chunk.
    r.property("upstream.address", served);
    r.respond_with(
        Response::new(200)
            .header("content-type", "text/event-stream")
            .chunk("data: {}\n\n")
            .chunk("data: [DONE]\n\n"),
    )
    .unwrap();
    let (c, s) = (
        pod_load(&host, "llama", &chosen),
        pod_load(&host, "llama", served),
    );
    assert_eq!((c.in_flight, c.pending_tokens), (0, 0), "{c:?}");
    assert_eq!((s.in_flight, s.pending_tokens), (1, 0), "{s:?}");
    assert_eq!(
        s.fit.n + c.fit.n,
        0.0,
        "work measured on one pod, served by another"
    );
    r.finish().unwrap();
    assert_eq!(inflight(&host, "llama"), vec![]);
}

#[test]
fn errors_and_unstreamed_replies_release_work_without_teaching_a_rate() {
    let host = host();
    let vm = vm(&host);
    two_idle_pods(&host, &vm);
    // A 500 from the pod.
    let mut r = stream(&vm, 500, "error");
    let pod = endpoints(&r)[0].clone();
    host.advance_clock(Duration::from_millis(30));
    first_chunk(&mut r, &pod, 500);
    assert_eq!(pod_load(&host, "llama", &pod).pending_tokens, 0);
    r.finish().unwrap();
    // A non-streamed chat reply: its first byte comes after the whole generation.
    let mut r = chat(&vm, LLAMA, &"words ".repeat(300));
    let pod2 = endpoints(&r)[0].clone();
    host.advance_clock(Duration::from_millis(3_000));
    r.property("upstream.address", pod2.as_str());
    r.respond(&[(":status", "200")], &[b"{\"choices\":[]}"])
        .unwrap();
    r.finish().unwrap();
    for p in [A, B] {
        let l = pod_load(&host, "llama", p);
        assert_eq!((l.in_flight, l.pending_tokens), (0, 0), "{p}: {l:?}");
        assert_eq!(l.fit.n, 0.0, "{p}: {l:?}");
    }
}

/// Two pods that look identical in the snapshot; one answers ten times slower. After a few
/// observed requests the filter sends new work to the fast one.
#[test]
fn learned_rates_steer_requests_to_the_faster_pod() {
    let host = host();
    // The burst below is placed at once (flow control would hold its tail: tests/flow.rs).
    let cfg = config_with(r#", "flow": {"enabled": false}"#);
    let (vm1, vm2) = (host.vm(&cfg).unwrap(), host.vm(&cfg).unwrap());
    two_idle_pods(&host, &vm1);
    let (fast, slow) = (A, B);
    let ms_per_token = |pod: &str| if pod == fast { 0.02 } else { 0.2 };
    // Requests one at a time, answered in the time each pod would take for its work.
    for i in 0..12 {
        let vm = if i % 2 == 0 { &vm1 } else { &vm2 };
        let tokens = 400 + 150 * (i % 5);
        let mut r = stream(vm, tokens, &format!("warm {i}"));
        let pod = endpoints(&r)[0].clone();
        let ms = 20.0 + ms_per_token(&pod) * tokens as f64;
        host.advance_clock(Duration::from_micros((ms * 1000.0) as u64));
        first_chunk(&mut r, &pod, 200);
        r.finish().unwrap();
    }
    let (f, s) = (
        pod_load(&host, "llama", fast),
        pod_load(&host, "llama", slow),
    );
    // Both pods were tried while nothing was known …
    assert!(f.fit.n > 0.0 && s.fit.n > 0.0, "{f:?} {s:?}");
    // … and now 20 concurrent requests (none answered yet) go mostly to the fast pod: about
    // ten times its share while its queue is short.
    let mut open = Vec::new();
    let mut to_fast = 0;
    for i in 0..20 {
        let r = stream(&vm1, 500, &format!("burst {i}"));
        if endpoints(&r)[0] == fast {
            to_fast += 1;
        }
        open.push(r);
    }
    assert!(
        to_fast >= 15,
        "{to_fast} of 20 to the fast pod; {f:?} {s:?}"
    );
    for mut r in open {
        r.finish().unwrap();
    }
    assert_eq!(inflight(&host, "llama"), vec![]);
}
