//! The release filter `.wasm`, run under the wasmtime host as Envoy would run it: every path of
//! the filter at the Wasm level — routing from a pushed snapshot, model → pool, adapters, each
//! rejection with its status, body and headers, bodies in many chunks, snapshot pushes accepted
//! and refused, in-flight counts shared by two worker VMs, configuration errors.

mod util;

use proxy_wasm_host::{Action, Host, HostError, LogLevel, Response};
use util::*;

fn assert_routed(r: &proxy_wasm_host::Request) {
    assert!(
        r.local_response().is_none(),
        "unexpected local reply\n{}",
        r.explain()
    );
    assert!(
        r.forwarded_complete(),
        "request not forwarded\n{}",
        r.explain()
    );
    assert!(r.violations().is_empty(), "{:?}", r.violations());
}

#[test]
fn every_import_of_the_filter_is_implemented() {
    let host = host();
    let m = host.module();
    assert!(
        m.unimplemented_imports().is_empty(),
        "host lacks {:?}",
        m.unimplemented_imports()
    );
    assert!(m.exports().iter().any(|e| e == "proxy_abi_version_0_2_1"));
    assert!(m.imports().iter().any(|i| i == "env.proxy_get_shared_data"));
}

#[test]
fn routes_to_the_pod_the_snapshot_favours_with_fallbacks_in_order() {
    let host = host();
    let vm = vm(&host);
    let pods = vec![
        pod("10.0.0.1:8000", 4, 10, 0.9),
        pod("10.0.0.2:8000", 0, 2, 0.1),
        pod("10.0.0.3:8000", 2, 5, 0.5),
    ];
    push_ok(
        &vm,
        &snapshot(&host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );

    let mut r = chat(&vm, LLAMA, "hi");
    assert_routed(&r);
    assert_eq!(
        endpoints(&r),
        ["10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.1:8000"],
        "{}",
        r.explain()
    );
    assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
    assert!(
        r.cleared_route_cache(),
        "the route must be recomputed after the cluster header is set"
    );
    // Headers were held until the body was read, then released with the routing headers.
    let actions = r.actions();
    assert_eq!(
        actions.first(),
        Some(&("request headers".to_string(), Action::Pause))
    );
    assert_eq!(
        actions.last(),
        Some(&("request body".to_string(), Action::Continue))
    );
    assert_eq!(r.upstream_body(), chat_body(LLAMA, "hi"));
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("pool", "llama"), ("model", LLAMA), ("outcome", "routed")]
        ),
        1
    );
    assert_eq!(inflight_of(&host, "llama", "10.0.0.2:8000"), 1);

    r.property("upstream.address", "10.0.0.2:8000");
    r.respond(
        &[(":status", "200"), ("content-type", "application/json")],
        &[b"{}"],
    )
    .unwrap();
    assert_eq!(
        r.response_header(SERVED),
        None,
        "the served pod is not disclosed by default"
    );
    r.finish().unwrap();
    assert_eq!(inflight_of(&host, "llama", "10.0.0.2:8000"), 0);
    assert!(r.violations().is_empty(), "{:?}", r.violations());
}

/// `disclose.served_pod` (off by default) puts the serving pod's `ip:port` on the response.
#[test]
fn the_served_pod_header_is_set_only_when_disclosed() {
    let host = host();
    let vm = host
        .vm(&config_with(r#", "disclose": {"served_pod": true}"#))
        .unwrap();
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.2:8000", 0, 2, 0.1)],
            )],
        ),
    );
    let mut r = chat(&vm, LLAMA, "hi");
    assert_routed(&r);
    r.property("upstream.address", "10.0.0.2:8000");
    r.respond(
        &[(":status", "200"), ("content-type", "application/json")],
        &[b"{}"],
    )
    .unwrap();
    assert_eq!(r.response_header(SERVED).as_deref(), Some("10.0.0.2:8000"));
    r.finish().unwrap();
}

#[test]
fn each_model_goes_to_its_pool_and_aliases_are_rewritten() {
    let host = host();
    let vm = vm(&host);
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![
                pool(
                    "llama",
                    "pool_llama",
                    &[LLAMA],
                    vec![pod("10.0.1.1:8000", 0, 0, 0.1)],
                ),
                pool(
                    "qwen",
                    "pool_qwen",
                    &["Qwen/Qwen2.5-7B-Instruct"],
                    vec![
                        pod("10.0.2.1:8000", 0, 0, 0.1),
                        pod("10.0.2.2:8000", 1, 0, 0.1),
                    ],
                ),
            ],
        ),
    );
    let q = chat(&vm, "Qwen/Qwen2.5-7B-Instruct", "hello");
    assert_routed(&q);
    assert_eq!(q.upstream_header(CLUSTER).as_deref(), Some("pool_qwen"));
    assert_eq!(endpoints(&q), ["10.0.2.1:8000", "10.0.2.2:8000"]);

    let l = chat(&vm, LLAMA, "hello");
    assert_eq!(l.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
    assert_eq!(endpoints(&l), ["10.0.1.1:8000"]);

    // The alias is rewritten in the body (Envoy buffer semantics: replace from 0) and the
    // content-length follows.
    let a = chat(&vm, "llama-8b", "hello");
    assert_routed(&a);
    assert_eq!(a.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
    let body: serde_json::Value = serde_json::from_slice(&a.upstream_body()).unwrap();
    assert_eq!(body["model"], LLAMA);
    assert_eq!(body["messages"][0]["content"], "hello");
    assert_eq!(
        a.upstream_header("content-length"),
        Some(a.upstream_body().len().to_string())
    );
    assert_eq!(
        a.upstream_header("x-gateway-model-name-rewrite").as_deref(),
        Some(LLAMA)
    );
}

#[test]
fn a_lora_adapter_goes_to_the_pod_that_has_it_loaded() {
    let host = host();
    let vm = vm(&host);
    let pods = vec![
        lora_pod("10.0.0.1:8000", &["chat-lora"], 1),
        lora_pod("10.0.0.2:8000", &["sql-lora"], 1),
        lora_pod("10.0.0.3:8000", &["chat-lora"], 1),
    ];
    push_ok(
        &vm,
        &snapshot(&host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );
    for i in 0..3 {
        let mut r = chat(&vm, "sql-lora", &format!("select {i}"));
        assert_routed(&r);
        assert_eq!(
            endpoints(&r).first().map(String::as_str),
            Some("10.0.0.2:8000"),
            "{}",
            r.explain()
        );
        assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
        // Counted in flight there for the adapter while it runs (what a blocked pod's slot
        // wait is priced from), uncounted when it ends.
        assert_eq!(adapter_in_flight(&host, "10.0.0.2:8000", "sql-lora"), 1);
        r.finish().unwrap();
        assert_eq!(adapter_in_flight(&host, "10.0.0.2:8000", "sql-lora"), 0);
    }
}

/// This proxy's requests in flight on `addr` for `adapter` (the recent-adapter table).
fn adapter_in_flight(host: &Host, addr: &str, adapter: &str) -> u16 {
    let recent = host
        .shared_data(&llm_router_core::lora::key("llama"))
        .map(|(v, _)| llm_router_core::lora::Recent::decode(&v))
        .unwrap_or_default();
    recent
        .of(addr)
        .iter()
        .find(|r| r.adapter == adapter)
        .map_or(0, |r| r.in_flight)
}

#[test]
fn client_routing_headers_are_never_trusted() {
    let host = host();
    let vm = vm(&host);
    // No snapshot yet: the default is to keep serving through Envoy's fallback policy.
    let body = chat_body(LLAMA, "x");
    let mut r = post(&vm, "/v1/chat/completions", &body);
    r.headers(&[
        (ENDPOINT, "6.6.6.6:1"),
        (CLUSTER, "evil_cluster"),
        (REWRITE, "someone-else/model"),
    ])
    .body(&body)
    .send()
    .unwrap();
    assert_routed(&r);
    assert_eq!(
        r.upstream_header(ENDPOINT),
        None,
        "a spoofed endpoint must be removed"
    );
    assert_eq!(
        r.upstream_header(REWRITE),
        None,
        "a client's rewrite header must not reach the pod as if the filter had set it"
    );
    assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("pool", "llama"), ("outcome", "fallback")]
        ),
        1
    );

    // Paths the filter does not route are stripped of the headers too, and pass untouched.
    let mut g = vm.request();
    g.headers(&[
        (":method", "GET"),
        (":path", "/healthz"),
        (ENDPOINT, "6.6.6.6:1"),
        (REWRITE, "x"),
    ])
    .send()
    .unwrap();
    assert_eq!(
        g.actions(),
        vec![("request headers".to_string(), Action::Continue)]
    );
    assert!(g.forwarded_complete());
    assert_eq!(g.upstream_header(ENDPOINT), None);
    assert_eq!(g.upstream_header(REWRITE), None);
}

#[test]
fn other_paths_and_methods_pass_through_untouched() {
    let host = host();
    let vm = vm(&host);
    let mut r = post(&vm, "/healthz", b"ping");
    r.body_chunks([&b"pi"[..], b"ng"]).send().unwrap();
    assert!(
        r.actions().iter().all(|(_, a)| *a == Action::Continue),
        "{:?}",
        r.actions()
    );
    assert_eq!(r.upstream_body(), b"ping");
    assert_eq!(r.upstream_header(CLUSTER), None);
}

/// An API path the filter owns never reaches the pool unrouted: before, a `GET` or a bodiless
/// `POST` on `/v1/chat/completions` passed untouched to the catch-all route.
#[test]
fn an_api_path_with_another_method_or_no_body_is_refused_not_passed() {
    let host = host();
    let vm = vm(&host);
    for method in ["GET", "PUT", "DELETE", "OPTIONS"] {
        let mut g = vm.request();
        g.headers(&[(":method", method), (":path", "/v1/chat/completions")])
            .send()
            .unwrap();
        let lr = g
            .local_response()
            .unwrap_or_else(|| panic!("{method} passed unrouted\n{}", g.explain()));
        assert_eq!(lr.status, 405, "{method}");
        assert_eq!(lr.header("allow"), Some("POST"));
        assert_eq!(lr.header("content-type"), Some("application/json"));
        let j = json_of(&g);
        assert_eq!(j["error"]["type"], "invalid_request_error");
        assert_eq!(j["error"]["code"], "method_not_allowed");
        assert!(!g.forwarded(), "{method}");
    }
    let mut e = vm.request();
    e.headers(&[(":method", "POST"), (":path", "/v1/embeddings")])
        .send()
        .unwrap();
    assert_eq!(
        e.local_response().map(|l| l.status),
        Some(400),
        "{}",
        e.explain()
    );
    assert_eq!(json_of(&e)["error"]["code"], "missing_body");
    assert!(!e.forwarded());
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("outcome", "bad_request")]
        ),
        5
    );
}

/// `GET /v1/models` is answered by the filter in OpenAI's list shape: every configured name,
/// alias and adapter, and the models of the snapshot's pools.
#[test]
fn the_model_list_is_answered_by_the_filter() {
    let host = host();
    let vm = vm(&host);
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "extra",
                "pool_extra",
                &["snapshot-only-model"],
                vec![pod("10.0.9.1:8000", 0, 0, 0.1)],
            )],
        ),
    );
    for path in ["/v1/models", "/models"] {
        let mut g = vm.request();
        g.headers(&[(":method", "GET"), (":path", path)])
            .send()
            .unwrap();
        let lr = g
            .local_response()
            .unwrap_or_else(|| panic!("{path} passed\n{}", g.explain()));
        assert_eq!(lr.status, 200);
        assert!(!g.forwarded());
        let j = json_of(&g);
        assert_eq!(j["object"], "list");
        let ids: Vec<&str> = j["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        let mut want = vec![
            LLAMA,
            "llama-8b",
            "sql-lora",
            "chat-lora",
            "Qwen/Qwen2.5-7B-Instruct",
            "snapshot-only-model",
        ];
        want.sort();
        assert_eq!(ids, want);
    }
    let mut p = post(&vm, "/v1/models", b"{}");
    p.body(b"{}").send().unwrap();
    assert_eq!(p.local_response().map(|l| l.status), Some(405));
    assert_eq!(p.local_response().unwrap().header("allow"), Some("GET"));
}

/// `unknown_paths: reject`: every path the filter neither routes nor serves is 404 with an
/// OpenAI-style body, never passed to the pool; `pass` (the default) lets them through.
#[test]
fn unknown_paths_are_404_when_configured_to_reject() {
    let host = host();
    let vm = host
        .vm(&config_with(r#", "unknown_paths": "reject""#))
        .unwrap();
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.1:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let body = chat_body(LLAMA, "hi");
    for (method, path) in [
        ("GET", "/metrics"),
        ("POST", "//v1/chat/completions"),
        ("POST", "/v1//chat/completions"),
        ("POST", "/V1/chat/completions"),
        ("POST", "/v1/%63hat/completions"),
        ("POST", "/invocations"),
        ("POST", "/tokenize"),
        ("POST", "/v1/load_lora_adapter"),
        ("GET", "/healthz"),
    ] {
        let mut r = vm.request();
        r.headers(&[
            (":method", method),
            (":path", path),
            ("content-length", &body.len().to_string()),
        ])
        .body(&body)
        .send()
        .unwrap();
        let lr = r
            .local_response()
            .unwrap_or_else(|| panic!("{method} {path} passed\n{}", r.explain()));
        assert_eq!(lr.status, 404, "{method} {path}");
        assert_eq!(lr.header(REASON), Some("rejected-unknown-path"));
        let j = json_of(&r);
        assert_eq!(j["error"]["type"], "invalid_request_error");
        assert_eq!(j["error"]["code"], "not_found");
        assert!(!lr.body_text().contains(path), "the path is not echoed");
        assert!(!r.forwarded(), "{method} {path}");
    }
    // The API paths still route, with a query string or a trailing slash too.
    for path in [
        "/v1/chat/completions",
        "/v1/chat/completions?x=1",
        "/v1/chat/completions/",
    ] {
        let mut r = post(&vm, path, &body);
        r.body(&body).send().unwrap();
        assert_routed(&r);
        assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
        r.finish().unwrap();
    }
    // The default passes them.
    let open = proxy_wasm_host::Host::new(host.module())
        .vm(&config())
        .unwrap();
    let mut r = post(&open, "/invocations", &body);
    r.body(&body).send().unwrap();
    assert!(r.local_response().is_none() && r.forwarded_complete());
}

#[test]
fn a_body_in_many_chunks_is_decided_once_at_the_end() {
    let host = host();
    let vm = vm(&host);
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![
                    pod("10.0.0.1:8000", 0, 0, 0.1),
                    pod("10.0.0.2:8000", 3, 3, 0.7),
                ],
            )],
        ),
    );
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(4500); // ~200 KB
    let body = chat_body(LLAMA, &prompt);
    assert!(body.len() > 200_000);
    for chunk in [65_536, 1000, 7] {
        let mut r = post(&vm, "/v1/chat/completions", &body);
        r.body_split(&body, chunk).send().unwrap();
        assert_routed(&r);
        let actions = r.actions();
        let bodies: Vec<_> = actions
            .iter()
            .filter(|(s, _)| s == "request body")
            .collect();
        assert_eq!(bodies.len(), body.len().div_ceil(chunk));
        assert!(
            bodies[..bodies.len() - 1]
                .iter()
                .all(|(_, a)| *a == Action::Pause),
            "chunk {chunk}"
        );
        assert_eq!(
            endpoints(&r).first().map(String::as_str),
            Some("10.0.0.1:8000"),
            "chunk {chunk}"
        );
        assert!(
            r.upstream_body() == body,
            "the body must reach upstream unchanged (chunk {chunk})"
        );
        r.finish().unwrap();
    }
    // HTTP/2 often ends a body with an empty DATA frame carrying END_STREAM.
    let small = chat_body(LLAMA, "h2 client");
    let mut r = post(&vm, "/v1/chat/completions", &small);
    r.body_chunks([&small[..], b""]).send().unwrap();
    assert_routed(&r);
    assert_eq!(r.upstream_body(), small);
    // A small body byte by byte.
    let small = chat_body(LLAMA, "hi there");
    let mut r = post(&vm, "/v1/chat/completions", &small);
    r.body_split(&small, 1).send().unwrap();
    assert_routed(&r);
    assert_eq!(r.upstream_body(), small);
}

#[test]
fn malformed_json_and_missing_model_are_400_with_openai_errors() {
    let host = host();
    let vm = vm(&host);
    for (body, code) in [
        (&br#"{"model": "x", "messages": ["#[..], "invalid_json"),
        (br#"not json at all"#, "invalid_json"),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            "invalid_model",
        ),
        (br#"{"model": 42, "messages": []}"#, "invalid_model"),
        (br#"{"model": "", "messages": []}"#, "invalid_model"),
    ] {
        let mut r = post(&vm, "/v1/chat/completions", body);
        r.body_split(body, 5).send().unwrap();
        let lr = r.local_response().unwrap_or_else(|| {
            panic!(
                "no reply for {:?}\n{}",
                String::from_utf8_lossy(body),
                r.explain()
            )
        });
        assert_eq!(lr.status, 400, "{}", lr.body_text());
        assert_eq!(lr.header("content-type"), Some("application/json"));
        assert_eq!(lr.header(REASON), Some("rejected-invalid-request"));
        let j = json_of(&r);
        assert_eq!(j["error"]["type"], "invalid_request_error");
        assert_eq!(j["error"]["code"], code, "{j}");
        assert!(j["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(!r.forwarded(), "a rejected request must not go upstream");
        assert_eq!(r.response_status(), Some(400));
        r.finish().unwrap();
    }
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("outcome", "bad_request")]
        ),
        5
    );
}

#[test]
fn an_unknown_model_is_404() {
    let host = host();
    let vm = vm(&host);
    let mut r = chat(&vm, "gpt-7-ultra", "hi");
    let lr = r.local_response().expect("404");
    assert_eq!(lr.status, 404);
    assert_eq!(lr.header(REASON), Some("rejected-unknown-model"));
    let j = json_of(&r);
    assert_eq!(j["error"]["code"], "model_not_found");
    assert!(j["error"]["message"]
        .as_str()
        .unwrap()
        .contains("gpt-7-ultra"));
    assert!(!r.forwarded());
    r.finish().unwrap();
}

#[test]
fn a_body_over_the_limit_is_413_by_content_length_or_while_streaming() {
    let host = host();
    let vm = host
        .vm(&config_with(r#", "max_body_bytes": 1024"#))
        .unwrap();
    let big = chat_body(LLAMA, &"x".repeat(3000));
    // Declared too large: refused at the headers, the body is never read.
    let mut r = post(&vm, "/v1/chat/completions", &big);
    r.body(&big).send().unwrap();
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(413),
        "{}",
        r.explain()
    );
    assert_eq!(
        r.actions().len(),
        1 + 2,
        "headers, then the local reply's response callbacks: {:?}",
        r.actions()
    );
    assert_eq!(json_of(&r)["error"]["code"], "request_too_large");
    assert_eq!(
        r.local_response().unwrap().header(REASON),
        Some("rejected-too-large")
    );
    // No content-length (chunked): refused as soon as the buffered body passes the limit.
    let mut r = vm.request();
    r.headers(&[(":method", "POST"), (":path", "/v1/chat/completions")])
        .body_split(&big, 300)
        .send()
        .unwrap();
    assert_eq!(r.local_response().map(|l| l.status), Some(413));
    let body_calls = r
        .actions()
        .iter()
        .filter(|(s, _)| s == "request body")
        .count();
    assert_eq!(
        body_calls,
        4,
        "stops at the chunk that crosses 1024 bytes: {:?}",
        r.actions()
    );
    assert!(!r.forwarded());
}

fn saturated_fleet(host: &proxy_wasm_host::Host, waiting: u32) -> Vec<u8> {
    let pods = (1..=3)
        .map(|i| pod(&format!("10.0.0.{i}:8000"), waiting, 8, 0.5))
        .collect();
    snapshot(host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)])
}

#[test]
fn a_saturated_pool_sheds_sheddable_requests_first_with_429() {
    let host = host();
    // Priority headers count only when trusted (a filter before this one sets them). Without
    // flow control every request is placed or shed at once (held work: tests/flow.rs).
    let vm = host
        .vm(&config_with(
            r#", "priority": {"trust_headers": true}, "flow": {"enabled": false}"#,
        ))
        .unwrap();
    push_ok(&vm, &saturated_fleet(&host, 6)); // every pod past the queue threshold of 5
    let body = chat_body(LLAMA, "batch job");
    let mut shed = post(&vm, "/v1/chat/completions", &body);
    shed.header("x-llm-router-priority", "-1")
        .body(&body)
        .send()
        .unwrap();
    let lr = shed
        .local_response()
        .unwrap_or_else(|| panic!("{}", shed.explain()));
    assert_eq!(lr.status, 429);
    assert_eq!(lr.header("retry-after"), Some("1"));
    assert_eq!(lr.header(REASON), Some("rejected-saturated"));
    assert_eq!(json_of(&shed)["error"]["type"], "rate_limit_error");
    assert_eq!(
        shed.response_header("retry-after").as_deref(),
        Some("1"),
        "the client gets Retry-After"
    );
    // A standard request still goes through at 1.2x saturation...
    let standard = chat(&vm, LLAMA, "interactive");
    assert_routed(&standard);
    // ...but not at 12x (critical_factor 10).
    let vm2 = vm.clone();
    push_ok(&vm2, &{
        let mut b = saturated_fleet(&host, 60);
        b[8] = 2; // generation 2 (u64 LE at byte 8)
        b
    });
    let r = chat(&vm, LLAMA, "interactive");
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(429),
        "{}",
        r.explain()
    );
    // A critical request is never shed.
    let mut c = post(&vm, "/v1/chat/completions", &body);
    c.header("x-llm-router-priority", "5")
        .body(&body)
        .send()
        .unwrap();
    assert_routed(&c);
}

#[test]
fn client_priority_headers_are_ignored_unless_trusted() {
    let host = host();
    let vm = host
        .vm(&config_with(
            r#", "objectives": {"batch": -1, "vip": 1}, "flow": {"enabled": false}"#,
        ))
        .unwrap();
    push_ok(&vm, &saturated_fleet(&host, 6)); // 1.2x saturated
    let body = chat_body(LLAMA, "cheap");
    // Declaring itself sheddable changes nothing either: every request is standard.
    for (name, value) in [
        ("x-llm-router-priority", "-1"),
        ("x-gateway-inference-objective", "batch"),
    ] {
        let mut r = post(&vm, "/v1/chat/completions", &body);
        r.header(name, value).body(&body).send().unwrap();
        assert_routed(&r);
        r.finish().unwrap();
    }
    push_ok(&vm, &{
        let mut b = saturated_fleet(&host, 60); // 12x: standard requests are shed
        b[8] = 2;
        b
    });
    for (name, value) in [
        ("x-llm-router-priority", "5"),
        ("x-gateway-inference-objective", "vip"),
    ] {
        let mut r = post(&vm, "/v1/chat/completions", &body);
        r.header(name, value).body(&body).send().unwrap();
        assert_eq!(
            r.local_response().map(|l| l.status),
            Some(429),
            "a client exempted itself with {name}: {value}\n{}",
            r.explain()
        );
    }
}

#[test]
fn a_pool_without_usable_pods_is_503() {
    let host = host();
    let vm = vm(&host);
    let mut pods = vec![
        pod("10.0.0.1:8000", 0, 0, 0.1),
        pod("10.0.0.2:8000", 0, 0, 0.1),
    ];
    for p in &mut pods {
        p.health = llm_router_snapshot::Health::Failing;
        p.failures = 3;
    }
    push_ok(
        &vm,
        &snapshot(&host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );
    let r = chat(&vm, LLAMA, "hi");
    let lr = r
        .local_response()
        .unwrap_or_else(|| panic!("{}", r.explain()));
    assert_eq!(lr.status, 503);
    assert_eq!(lr.header(REASON), Some("rejected-no-endpoints"));
    assert_eq!(lr.header("retry-after"), Some("1"));
    let j = json_of(&r);
    assert_eq!(j["error"]["code"], "no_endpoints");
    // Strangers learn neither the pool's name nor its health (`disclose.pool_detail` off).
    let body = lr.body_text();
    assert!(
        !body.contains("llama") && !body.contains("pool") && !body.contains("fail"),
        "{body}"
    );
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("No endpoint available for this model"),
        "{j}"
    );
    // With `disclose.pool_detail` the body names the pool and why.
    let open = proxy_wasm_host::Host::new(host.module())
        .vm(&config_with(r#", "disclose": {"pool_detail": true}"#))
        .unwrap();
    let mut failing = vec![pod("10.0.0.1:8000", 0, 0, 0.1)];
    failing[0].health = llm_router_snapshot::Health::Failing;
    failing[0].failures = 3;
    let open_host_snapshot = snapshot(
        &host,
        1,
        vec![pool("llama", "pool_llama", &[LLAMA], failing)],
    );
    push_ok(&open, &open_host_snapshot);
    let d = chat(&open, LLAMA, "hi");
    let text = d
        .local_response()
        .map(|l| l.body_text())
        .unwrap_or_default();
    assert!(text.contains("`llama`"), "{text}");

    // on_missing = reject: 503 before any snapshot.
    let strict = config().replace(
        r#""stale_after_ms": 3000"#,
        r#""stale_after_ms": 3000, "on_missing": "reject""#,
    );
    let vm2 = proxy_wasm_host::Host::new(host.module())
        .vm(&strict)
        .unwrap();
    let r = chat(&vm2, LLAMA, "hi");
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(503),
        "{}",
        r.explain()
    );
}

#[test]
fn a_stale_snapshot_routes_by_in_flight_counts() {
    let host = host();
    let vm = vm(&host);
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![
                    pod("10.0.0.1:8000", 0, 0, 0.1),
                    pod("10.0.0.2:8000", 50, 50, 0.95),
                ],
            )],
        ),
    );
    let fresh = chat(&vm, LLAMA, "a");
    assert_eq!(endpoints(&fresh)[0], "10.0.0.1:8000");
    host.advance_clock(std::time::Duration::from_secs(10));
    // Metrics are ignored now: 10.0.0.1 has one request in flight, 10.0.0.2 none.
    let stale = chat(&vm, LLAMA, "b");
    assert_routed(&stale);
    assert_eq!(endpoints(&stale)[0], "10.0.0.2:8000", "{}", stale.explain());
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("outcome", "least_inflight")]
        ),
        1
    );
}

#[test]
fn in_flight_counts_are_shared_by_worker_vms_and_released_once_in_either_end_order() {
    for log_first in [false, true] {
        let host = host();
        let vm1 = host
            .builder()
            .plugin_config(config())
            .log_before_done(log_first)
            .start()
            .unwrap();
        let vm2 = host
            .builder()
            .plugin_config(config())
            .log_before_done(log_first)
            .start()
            .unwrap();
        let (a, b) = ("10.0.0.1:8000", "10.0.0.2:8000");
        push_ok(
            &vm1,
            &snapshot(
                &host,
                1,
                vec![pool(
                    "llama",
                    "pool_llama",
                    &[LLAMA],
                    vec![pod(a, 0, 0, 0.2), pod(b, 0, 0, 0.2)],
                )],
            ),
        );

        let mut r1 = chat(&vm1, LLAMA, "one");
        let first = endpoints(&r1)[0].clone();
        let other = if first == a { b } else { a };
        assert_eq!(inflight_of(&host, "llama", &first), 1);
        // The second worker sees the first worker's request and picks the other pod.
        let mut r2 = chat(&vm2, LLAMA, "two");
        assert_eq!(
            endpoints(&r2)[0],
            other,
            "worker 2 ignored worker 1's in-flight request\n{}",
            r2.explain()
        );
        assert_eq!(inflight(&host, "llama"), {
            let mut v = vec![(a.to_string(), 1), (b.to_string(), 1)];
            v.sort();
            v
        });
        r1.respond(
            &[(":status", "200")],
            &[b"data: x\n\n", b"data: [DONE]\n\n"],
        )
        .unwrap();
        r1.finish().unwrap();
        assert_eq!(
            inflight_of(&host, "llama", &first),
            0,
            "log_before_done={log_first}"
        );
        // Aborted by the client before any response: released too.
        r2.finish().unwrap();
        assert_eq!(
            inflight(&host, "llama"),
            vec![],
            "log_before_done={log_first}"
        );
        // Finishing twice changes nothing.
        r2.finish().unwrap();
        assert_eq!(inflight(&host, "llama"), vec![]);
    }
}

#[test]
fn a_retry_to_a_fallback_endpoint_moves_the_in_flight_count() {
    let host = host();
    let vm = vm(&host);
    let (a, b) = ("10.0.0.1:8000", "10.0.0.2:8000");
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod(a, 0, 0, 0.1), pod(b, 2, 2, 0.5)],
            )],
        ),
    );
    let mut r = chat(&vm, LLAMA, "hi");
    assert_eq!(endpoints(&r), [a, b]);
    r.property("upstream.address", b);
    r.respond_with(
        Response::new(200)
            .header("content-type", "text/event-stream")
            .chunk("data: 1\n\n"),
    )
    .unwrap();
    assert_eq!(r.response_header(SERVED), None, "not disclosed by default");
    assert_eq!(inflight(&host, "llama"), vec![(b.to_string(), 1)]);
    r.finish().unwrap();
    assert_eq!(inflight(&host, "llama"), vec![]);
}

#[test]
fn a_conversation_keeps_its_pod_across_workers_by_prefix_affinity() {
    let host = host();
    let vm1 = vm(&host);
    let vm2 = vm(&host);
    let pods = (1..=4)
        .map(|i| pod(&format!("10.0.0.{i}:8000"), 0, 0, 0.2))
        .collect();
    push_ok(
        &vm1,
        &snapshot(&host, 1, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );
    let system = "You are a meticulous assistant. ".repeat(40);
    let turn1 = serde_json::json!({"model": LLAMA, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "first question"}]});
    let turn2 = serde_json::json!({"model": LLAMA, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "second question"}]});
    let b1 = turn1.to_string();
    let mut r1 = post(&vm1, "/v1/chat/completions", b1.as_bytes());
    r1.body(&b1).send().unwrap();
    let chosen = endpoints(&r1)[0].clone();
    r1.finish().unwrap();
    let b2 = turn2.to_string();
    let mut r2 = post(&vm2, "/v1/chat/completions", b2.as_bytes());
    r2.body(&b2).send().unwrap();
    assert_eq!(
        endpoints(&r2)[0],
        chosen,
        "next turn on another worker lost its prefix pod\n{}",
        r2.explain()
    );
}

#[test]
fn every_fixture_body_is_routed_on_its_endpoint() {
    let dir = bodies_fixtures_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "fixtures missing in {}", dir.display());
    let mut models: Vec<String> = files
        .iter()
        .map(|f| {
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(f).unwrap()).unwrap()
                ["model"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    models.sort();
    models.dedup();
    let model_refs: Vec<&str> = models.iter().map(String::as_str).collect();
    let cfg = format!(
        r#"{{"pools": [{{"name": "fx", "cluster": "pool_fx", "models": {}}}], "snapshot": {{"secret": "{SECRET}", "endpoints": true}}}}"#,
        serde_json::to_string(&models).unwrap()
    );
    let host = host();
    let vm = host.vm(&cfg).unwrap();
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "fx",
                "pool_fx",
                &model_refs,
                vec![
                    pod("10.9.0.1:8000", 0, 0, 0.1),
                    pod("10.9.0.2:8000", 1, 1, 0.3),
                ],
            )],
        ),
    );
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let path = if name.starts_with("chat-completions") {
            "/v1/chat/completions"
        } else if name.starts_with("completions") {
            "/v1/completions"
        } else if name.starts_with("embeddings") {
            "/v1/embeddings"
        } else if name.starts_with("messages") {
            "/v1/messages"
        } else {
            "/v1/responses"
        };
        let body = std::fs::read(&f).unwrap();
        let mut r = post(&vm, path, &body);
        r.body_split(&body, 100).send().unwrap();
        assert!(r.local_response().is_none(), "{name}: {}", r.explain());
        assert_eq!(
            r.upstream_header(CLUSTER).as_deref(),
            Some("pool_fx"),
            "{name}"
        );
        assert_eq!(endpoints(&r).len(), 2, "{name}");
        assert_eq!(r.upstream_body(), body, "{name}");
        r.finish().unwrap();
    }
    assert_eq!(inflight(&host, "fx"), vec![]);
}

#[test]
fn a_header_that_is_not_utf8_does_not_break_the_worker() {
    let host = host();
    let vm = vm(&host);
    let body = chat_body(LLAMA, "hi");
    let mut r = post(&vm, "/v1/chat/completions", &body);
    r.header_bytes("x-llm-router-priority", &[0xff, 0xfe])
        .body(&body)
        .send()
        .unwrap();
    assert_routed(&r);
    assert!(!vm.is_dead());
}

// ---------- snapshot push ----------

#[test]
fn a_snapshot_push_is_accepted_and_answered_with_its_summary() {
    let host = host();
    let vm = vm(&host);
    let bytes = snapshot(
        &host,
        7,
        vec![
            pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![
                    pod("10.0.0.1:8000", 0, 0, 0.1),
                    pod("10.0.0.2:8000", 0, 0, 0.1),
                ],
            ),
            pool(
                "qwen",
                "pool_qwen",
                &["Qwen/Qwen2.5-7B-Instruct"],
                vec![pod("10.0.2.1:8000", 0, 0, 0.1)],
            ),
        ],
    );
    let mut r = push_request(&vm, &bytes);
    r.send().unwrap();
    let lr = r
        .local_response()
        .unwrap_or_else(|| panic!("{}", r.explain()));
    assert_eq!(lr.status, 200);
    assert_eq!(lr.header("content-type"), Some("application/json"));
    let j = json_of(&r);
    assert_eq!(
        j,
        serde_json::json!({"accepted": true, "generation": 7, "pools": 2, "pods": 3})
    );
    assert_eq!(
        host.shared_data("llmr/snapshot").map(|(v, _)| v),
        Some(bytes.clone())
    );
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_snapshot_pushes_total",
            &[("result", "accepted")]
        ),
        1
    );
    assert!(
        !r.forwarded(),
        "a push is answered by the filter, never forwarded"
    );

    // The same generation again is stale: 409.
    let mut again = push_request(&vm, &bytes);
    again.send().unwrap();
    assert_eq!(again.local_response().map(|l| l.status), Some(409));
    let j = json_of(&again);
    assert_eq!(j["accepted"], false);
    assert_eq!(j["reason"], "stale generation");

    // State shows it (on the instance with the snapshot endpoints).
    let mut s = state_request(&vm);
    s.send().unwrap();
    assert_eq!(
        s.local_response().map(|l| l.status),
        Some(200),
        "{}",
        s.explain()
    );
    let state = json_of(&s);
    assert_eq!(state["generation"], 7);
    assert_eq!(state["pools"].as_array().map(Vec::len), Some(2));
}

fn one_pod_snapshot(host: &proxy_wasm_host::Host, generation: u64, addr: &str) -> Vec<u8> {
    snapshot(
        host,
        generation,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod(addr, 0, 0, 0.1)],
        )],
    )
}

#[test]
fn a_push_without_the_right_hmac_is_403_forbidden_and_changes_nothing() {
    let host = host();
    let vm = host
        .builder()
        .plugin_config(config())
        .log_level(LogLevel::Debug)
        .start()
        .unwrap();
    let bytes = one_pod_snapshot(&host, 5, "10.0.0.1:8000");
    let right = signature(&bytes);
    let other_bytes = one_pod_snapshot(&host, 6, "10.0.0.1:8000");
    let wrong_key = llm_router_snapshot::sign(b"not-the-secret", &bytes);
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("wrong key", Some(wrong_key)),
        ("signature of other bytes", Some(signature(&other_bytes))),
        (
            "truncated by one digit",
            Some(right[..right.len() - 1].to_string()),
        ),
        ("truncated to half", Some(right[..7 + 32].to_string())),
        (
            "no sha256= prefix",
            Some(right["sha256=".len()..].to_string()),
        ),
        ("empty", Some(String::new())),
        ("the secret itself", Some(SECRET.to_string())),
    ];
    let mut bodies = Vec::new();
    for (what, sig) in &cases {
        let mut r = push_signed(&vm, &bytes, sig.as_deref());
        r.send().unwrap();
        assert_eq!(
            r.local_response().map(|l| l.status),
            Some(403),
            "{what}\n{}",
            r.explain()
        );
        assert!(!r.forwarded(), "{what}");
        assert_eq!(
            host.shared_data("llmr/snapshot"),
            None,
            "{what}: a refused push must not be stored"
        );
        bodies.push(json_of(&r));
    }
    // The old clear-text secret header is not enough.
    let mut r = push_signed(&vm, &bytes, None);
    r.header("x-llm-router-secret", SECRET);
    r.send().unwrap();
    assert_eq!(r.local_response().map(|l| l.status), Some(403));
    bodies.push(json_of(&r));
    // One answer for every refusal; what failed is in the proxy's log only.
    for b in &bodies {
        assert_eq!(b, &bodies[0]);
    }
    assert_eq!(bodies[0]["error"]["message"], "forbidden");
    assert_eq!(bodies[0]["accepted"], false);
    for detail in [
        "no signature header",
        "does not match",
        "not sha256=<64 hex digits>",
    ] {
        assert!(
            vm.logged(detail),
            "log lacks {detail:?}:\n{}",
            vm.log_text()
        );
    }
    // The right signature is accepted from any source: the listener decides who can reach
    // the endpoint, not source.address (which X-Forwarded-For can set).
    let mut r = push_request(&vm, &bytes);
    r.property("source.address", "10.1.2.3:4000");
    r.send().unwrap();
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(200),
        "{}",
        r.explain()
    );
    assert_eq!(
        host.shared_data("llmr/snapshot").map(|(v, _)| v),
        Some(bytes.clone())
    );
    // Replays are refused: the same signed push again, and an older generation signed right.
    let newer = one_pod_snapshot(&host, 9, "10.0.0.9:8000");
    push_ok(&vm, &newer);
    for (what, old) in [
        ("replay of generation 5", bytes.clone()),
        ("generation 8", one_pod_snapshot(&host, 8, "10.0.0.8:8000")),
    ] {
        let mut r = push_request(&vm, &old);
        r.send().unwrap();
        assert_eq!(r.local_response().map(|l| l.status), Some(409), "{what}");
        assert_eq!(
            host.shared_data("llmr/snapshot").map(|(v, _)| v),
            Some(newer.clone()),
            "{what} replaced the snapshot"
        );
    }
    // A signature over generation 5 does not carry over to the same bytes with a newer
    // generation: the generation is signed.
    let mut bumped = bytes.clone();
    bumped[8] = 10;
    let mut r = push_signed(&vm, &bumped, Some(&right));
    r.send().unwrap();
    assert_eq!(r.local_response().map(|l| l.status), Some(403));
    assert_eq!(
        host.shared_data("llmr/snapshot").map(|(v, _)| v),
        Some(newer)
    );
}

#[test]
fn without_snapshot_endpoints_the_paths_are_404_and_instances_share_the_snapshot() {
    let host = host();
    let public = host.vm(&public_config()).unwrap();
    let internal = host.vm(&internal_config()).unwrap();
    let bytes = one_pod_snapshot(&host, 3, "10.0.0.7:8000");
    // The public instance answers 404 for both paths, even to a correctly signed push.
    let mut r = push_request(&public, &bytes);
    r.send().unwrap();
    assert_eq!(
        r.local_response().map(|l| l.status),
        Some(404),
        "{}",
        r.explain()
    );
    assert!(!r.forwarded());
    let mut s = state_request(&public);
    s.send().unwrap();
    assert_eq!(s.local_response().map(|l| l.status), Some(404));
    assert!(!s.forwarded());
    assert_eq!(host.shared_data("llmr/snapshot"), None);
    // Pushed to the internal instance, the snapshot routes the public one's requests.
    push_ok(&internal, &bytes);
    let r = chat(&public, LLAMA, "hello");
    assert_routed(&r);
    assert_eq!(endpoints(&r), ["10.0.0.7:8000"]);
    let mut s = state_request(&internal);
    s.send().unwrap();
    assert_eq!(json_of(&s)["generation"], 3);
}

#[test]
fn the_tally_serves_this_proxys_work_and_the_state_shows_the_other_replicas() {
    let host = host();
    let public = host.vm(&public_config()).unwrap();
    let internal = host.vm(&internal_config()).unwrap();
    let mut busy = pod("10.0.0.7:8000", 0, 0, 0.1);
    busy.peers = llm_router_snapshot::PeerWork {
        in_flight: 3,
        pending_tokens: 2_500,
    };
    let bytes = snapshot(
        &host,
        5,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![busy, pod("10.0.0.8:8000", 0, 0, 0.1)],
        )],
    );
    push_ok(&internal, &bytes);
    // Two requests in flight on this proxy (the public instance's streams, unfinished).
    let a = chat(&public, LLAMA, &"a long question ".repeat(40));
    let b = chat(&public, LLAMA, "hello");
    assert_routed(&a);
    assert_routed(&b);
    let mut t = tally_request(&internal);
    t.send().unwrap();
    let lr = t
        .local_response()
        .expect("the tally is answered by the filter");
    assert_eq!(lr.status, 200, "{}", t.explain());
    let tally = llm_router_snapshot::Tally::decode(&lr.body).expect("a tally");
    assert_eq!(tally.replica, 0, "the sidecar stamps its own id");
    let mut listed: Vec<(String, u32)> = tally
        .pools
        .iter()
        .flat_map(|p| p.pods.iter().map(|q| (q.address.clone(), q.in_flight)))
        .collect();
    listed.sort();
    let mut expected = inflight(&host, "llama");
    expected.retain(|(_, n)| *n > 0);
    expected.sort();
    assert_eq!(listed, expected, "the tally is the shared in-flight table");
    assert_eq!(listed.iter().map(|(_, n)| n).sum::<u32>(), 2);
    assert!(tally.pools[0].pods.iter().any(|p| p.pending_tokens > 0));
    // The other replicas' work, as the hub merged it, is on the state page.
    let mut s = state_request(&internal);
    s.send().unwrap();
    let state = json_of(&s);
    let pods = state["pools"][0]["pods"].as_array().cloned().unwrap();
    let busy = pods
        .iter()
        .find(|p| p["address"] == "10.0.0.7:8000")
        .unwrap();
    assert_eq!(busy["peer_in_flight"], 3);
    assert_eq!(busy["peer_pending_tokens"], 2_500);
    // `?summary`: the generation and its age, without the pools (no snapshot decode).
    let mut s = internal.request();
    s.headers(&[
        (":method", "GET"),
        (":path", &format!("{STATE_PATH}?summary")),
    ])
    .property("source.address", "127.0.0.1:5000");
    s.send().unwrap();
    let summary = json_of(&s);
    assert_eq!(summary["generation"], state["generation"]);
    assert_eq!(summary["generation"], 5);
    assert!(summary["age_ms"].is_u64(), "{summary}");
    assert!(summary.get("pools").is_none(), "{summary}");
    // The public instance keeps the path closed.
    let mut closed = tally_request(&public);
    closed.send().unwrap();
    assert_eq!(closed.local_response().map(|l| l.status), Some(404));
}

/// A tally read with the version its reader saw is held until the tally moves (a request
/// routed on another VM of the same proxy) or its wait ends, and the root context ticks every
/// millisecond only while a read is held.
#[test]
fn a_tally_read_is_held_until_the_tally_moves_or_its_wait_ends() {
    use llm_router_snapshot::tally::TALLY_VERSION_HEADER;
    use std::time::Duration;
    let host = host();
    let public = host.vm(&public_config()).unwrap();
    let internal = host.vm(&internal_config()).unwrap();
    // One pod, at snapshot generation `g`.
    let one_pod = |g| {
        let pods = vec![pod("10.0.0.7:8000", 0, 0, 0.1)];
        snapshot(&host, g, vec![pool("llama", "pool_llama", &[LLAMA], pods)])
    };
    push_ok(&internal, &one_pod(5));
    let version = |r: &proxy_wasm_host::Request| -> u64 {
        let lr = r.local_response().expect("answered");
        assert_eq!(lr.status, 200, "{}", r.explain());
        lr.headers
            .iter()
            .find(|(k, _)| k == TALLY_VERSION_HEADER)
            .and_then(|(_, v)| v.parse().ok())
            .expect("a version header")
    };
    let in_flight = |r: &proxy_wasm_host::Request| -> u32 {
        let body = r.local_response().expect("answered").body;
        let t = llm_router_snapshot::Tally::decode(&body).expect("a tally");
        t.pools
            .iter()
            .flat_map(|p| &p.pods)
            .map(|p| p.in_flight)
            .sum()
    };
    let held = |after: u64, wait_ms: u64| {
        let mut r = internal.request();
        r.headers(&[
            (":method", "GET"),
            (
                ":path",
                &format!("{TALLY_PATH}?after={after}&wait_ms={wait_ms}"),
            ),
        ])
        .property("source.address", "127.0.0.1:5000");
        r.send().unwrap();
        r
    };
    // A plain read is answered at once, with the version.
    let mut first = tally_request(&internal);
    first.send().unwrap();
    let v0 = version(&first);
    assert_eq!(in_flight(&first), 0);
    // A stale version: answered at once.
    let stale = held(v0.wrapping_add(1), 200);
    assert_eq!(version(&stale), v0);
    // The current one: held while nothing changes, the tick at a millisecond.
    let waiting = held(v0, 200);
    assert!(waiting.local_response().is_none(), "{}", waiting.explain());
    assert_eq!(internal.tick_period(), Some(Duration::from_millis(1)));
    internal.advance(Duration::from_millis(50)).unwrap();
    assert!(waiting.local_response().is_none(), "nothing changed");
    // A new snapshot of the same pools (one per hub frame) is no change to the tally.
    push_ok(&internal, &one_pod(6));
    internal.advance(Duration::from_millis(5)).unwrap();
    assert!(waiting.local_response().is_none(), "a push is no change");
    // A request routed by the other VM moves the tally: answered on the next tick.
    let routed = chat(&public, LLAMA, "hello");
    assert_routed(&routed);
    internal.advance(Duration::from_millis(2)).unwrap();
    let v1 = version(&waiting);
    assert_ne!(v1, v0);
    assert_eq!(in_flight(&waiting), 1, "the answer carries the change");
    assert_eq!(internal.tick_period(), Some(Duration::from_secs(1)));
    // Nothing moves: answered when the wait ends, with the same version.
    let idle = held(v1, 100);
    internal.advance(Duration::from_millis(60)).unwrap();
    assert!(idle.local_response().is_none());
    internal.advance(Duration::from_millis(60)).unwrap();
    assert_eq!(version(&idle), v1);
    // A reader that hangs up is forgotten: the tick slows down again.
    let mut gone = held(v1, 500);
    assert_eq!(internal.tick_period(), Some(Duration::from_millis(1)));
    gone.finish().unwrap();
    assert_eq!(internal.tick_period(), Some(Duration::from_secs(1)));
    assert!(
        internal.violations().is_empty(),
        "{:?}",
        internal.violations()
    );
}

#[test]
fn a_push_of_bad_bytes_is_400_with_the_decode_error_and_keeps_the_old_snapshot() {
    let host = host();
    let vm = vm(&host);
    let good = snapshot(
        &host,
        3,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod("10.0.0.1:8000", 0, 0, 0.1)],
        )],
    );
    push_ok(&vm, &good);
    let mut truncated = snapshot(
        &host,
        4,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod("10.0.0.2:8000", 0, 0, 0.1)],
        )],
    );
    truncated.truncate(truncated.len() - 3);
    for (bad, needle) in [(b"GARBAGE!".to_vec(), "magic"), (truncated, "truncated")] {
        let mut r = push_request(&vm, &bad);
        r.send().unwrap();
        assert_eq!(
            r.local_response().map(|l| l.status),
            Some(400),
            "{}",
            r.explain()
        );
        let j = json_of(&r);
        assert_eq!(j["error"]["code"], "invalid_snapshot");
        assert!(
            j["error"]["message"].as_str().unwrap().contains(needle),
            "{j}"
        );
    }
    assert_eq!(
        host.shared_data("llmr/snapshot").map(|(v, _)| v),
        Some(good)
    );
    // GET on the push path and an empty POST are refused like any unsigned push.
    let mut g = vm.request();
    g.headers(&[(":method", "GET"), (":path", PUSH_PATH)])
        .send()
        .unwrap();
    assert_eq!(g.local_response().map(|l| l.status), Some(403));
    let mut e = vm.request();
    e.headers(&[(":method", "POST"), (":path", PUSH_PATH)])
        .send()
        .unwrap();
    assert_eq!(e.local_response().map(|l| l.status), Some(403));
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_snapshot_pushes_total",
            &[("result", "refused")]
        ),
        4
    );
}

/// A signed push whose generation is far ahead of the proxy's clock (`u64::MAX`) would make
/// every later push stale until Envoy restarts: it is refused with 400, counted as refused, and
/// the sidecar's next honest push is still accepted.
#[test]
fn a_signed_push_far_ahead_of_the_clock_is_refused_and_does_not_freeze_the_snapshot() {
    let host = host();
    let vm = vm(&host);
    let pods = || vec![pod("10.0.0.1:8000", 0, 0, 0.1)];
    let now = host.now_ms();
    push_ok(
        &vm,
        &snapshot(
            &host,
            now,
            vec![pool("llama", "pool_llama", &[LLAMA], pods())],
        ),
    );
    let ahead = now + llm_router_snapshot::MAX_GENERATION_LEAD_MS + 1;
    for far in [u64::MAX, ahead] {
        let bytes = snapshot(
            &host,
            far,
            vec![pool("llama", "pool_llama", &[LLAMA], pods())],
        );
        let mut r = push_request(&vm, &bytes);
        r.send().unwrap();
        assert_eq!(
            r.local_response().map(|l| l.status),
            Some(400),
            "{}",
            r.explain()
        );
        let j = json_of(&r);
        assert_eq!(j["accepted"], false);
        assert_eq!(j["error"]["code"], "generation_ahead", "{j}");
        assert!(
            j["error"]["message"].as_str().unwrap().contains("ahead"),
            "{j}"
        );
    }
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_snapshot_pushes_total",
            &[("result", "refused")]
        ),
        2
    );
    // The next honest push (a generation later) is accepted: nothing froze.
    push_ok(
        &vm,
        &snapshot(
            &host,
            now + 1,
            vec![pool("llama", "pool_llama", &[LLAMA], pods())],
        ),
    );
}

#[test]
fn a_snapshot_pushed_through_one_worker_is_used_by_the_other() {
    let host = host();
    let vm1 = vm(&host);
    let vm2 = vm(&host);
    let r0 = chat(&vm2, LLAMA, "before");
    assert_eq!(
        r0.upstream_header(ENDPOINT),
        None,
        "no snapshot yet: fallback"
    );
    push_ok(
        &vm1,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.5:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let r = chat(&vm2, LLAMA, "after");
    assert_eq!(endpoints(&r), ["10.0.0.5:8000"]);
    // A newer generation replaces it everywhere.
    push_ok(
        &vm2,
        &snapshot(
            &host,
            2,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.6:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let r = chat(&vm1, LLAMA, "newer");
    assert_eq!(endpoints(&r), ["10.0.0.6:8000"]);
}

// ---------- configuration and lifecycle ----------

#[test]
fn a_bad_configuration_fails_at_load_with_a_log_line_that_says_why() {
    let host = host();
    for (cfg, needle) in [
        ("{not json", "not valid configuration JSON"),
        (r#"{"poolz": []}"#, "poolz"),
        (
            r#"{"pools": [{"name": "p", "models": ["m"], "preset": "fastest"}]}"#,
            "pools[0].preset",
        ),
        (
            r#"{"pools": [{"name": "p", "models": ["m"]}, {"name": "p", "models": ["n"]}]}"#,
            "defined twice",
        ),
    ] {
        match host.vm(cfg) {
            Err(HostError::ConfigureRejected { logs }) => {
                assert!(
                    logs.contains(needle),
                    "{cfg}: log does not say {needle:?}:\n{logs}"
                );
                assert!(logs.contains("Critical"), "{logs}");
            }
            Err(e) => panic!("{cfg}: unexpected error {e}"),
            Ok(_) => panic!("{cfg}: accepted"),
        }
    }
    // Snapshot endpoints need a secret.
    match host.vm(r#"{"snapshot": {"endpoints": true}}"#) {
        Err(HostError::ConfigureRejected { logs }) => {
            assert!(logs.contains("snapshot.secret"), "{logs}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("endpoints without a secret accepted"),
    }
    // No configuration at all is valid (pools come from the snapshot; no endpoints).
    let vm = host.builder().log_level(LogLevel::Debug).start().unwrap();
    assert!(vm.logged("snapshot endpoints off"), "{}", vm.log_text());
}

/// The filter refuses the examples' placeholder and short secrets at load, and takes the secret
/// from an environment variable Envoy passes into the VM (`snapshot.secret_env`): a push signed
/// with that secret is accepted, one signed with another refused.
#[test]
fn the_secret_comes_from_the_environment_and_placeholders_are_refused() {
    let host = host();
    for bad in ["change-me", "short-secret"] {
        match host.vm(&format!(
            r#"{{"snapshot": {{"secret": "{bad}", "endpoints": true}}}}"#
        )) {
            Err(HostError::ConfigureRejected { logs }) => {
                assert!(
                    logs.contains("snapshot.secret:") && logs.contains("openssl rand"),
                    "{logs}"
                )
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("secret {bad:?} accepted"),
        }
    }
    let from_env =
        r#"{"snapshot": {"secret_env": "LLM_ROUTER_SNAPSHOT_SECRET", "endpoints": true}}"#;
    // The variable is missing in the VM (not listed in host_env_keys): a configuration error
    // naming it.
    match host.vm(from_env) {
        Err(HostError::ConfigureRejected { logs }) => assert!(
            logs.contains("LLM_ROUTER_SNAPSHOT_SECRET is not set or empty"),
            "{logs}"
        ),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a missing secret_env variable was accepted"),
    }
    match host
        .builder()
        .plugin_config(from_env)
        .env("LLM_ROUTER_SNAPSHOT_SECRET", "change-me")
        .start()
    {
        Err(HostError::ConfigureRejected { logs }) => {
            assert!(logs.contains("placeholder"), "{logs}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a placeholder from the environment was accepted"),
    }
    let env_secret = "secret-from-a-kubernetes-secret-0123456789";
    let vm = host
        .builder()
        .plugin_config(from_env)
        .env("OTHER", "x")
        .env("LLM_ROUTER_SNAPSHOT_SECRET", env_secret)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = snapshot(
        &host,
        1,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod("10.0.0.1:8000", 0, 0, 0.1)],
        )],
    );
    let mut wrong = push_signed(&vm, &bytes, Some(&signature(&bytes)));
    wrong.send().unwrap();
    assert_eq!(wrong.local_response().map(|l| l.status), Some(403));
    let good = llm_router_snapshot::sign(env_secret.as_bytes(), &bytes);
    let mut right = push_signed(&vm, &bytes, Some(&good));
    right.send().unwrap();
    assert_eq!(
        right.local_response().map(|l| l.status),
        Some(200),
        "{}",
        right.explain()
    );
}

/// A filter whose configuration names no pool learns them from the snapshot: before the first
/// one a request is 503 with `retry-after` (the model may be one the snapshot will bring), then
/// the snapshot's models route and an unknown one is 404.
#[test]
fn pools_may_come_from_the_snapshot_alone() {
    let host = host();
    let vm = host
        .vm(&format!(
            r#"{{"snapshot": {{"secret": "{SECRET}", "endpoints": true}}}}"#
        ))
        .unwrap();
    let before = chat(&vm, "mistral-7b", "bonjour");
    let lr = before.local_response().expect("answered by the filter");
    assert_eq!(lr.status, 503, "{}", before.explain());
    assert!(
        lr.body_text().contains("no_endpoints"),
        "{}",
        lr.body_text()
    );
    assert!(
        lr.headers
            .iter()
            .any(|(k, v)| k == "retry-after" && v == "1"),
        "{:?}",
        lr.headers
    );
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "mistral",
                "pool_mistral",
                &["mistral-7b"],
                vec![pod("10.0.3.1:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let r = chat(&vm, "mistral-7b", "bonjour");
    assert_routed(&r);
    assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_mistral"));
    assert_eq!(endpoints(&r), ["10.0.3.1:8000"]);
    assert_eq!(
        chat(&vm, "unknown", "x").local_response().map(|l| l.status),
        Some(404)
    );
}

#[test]
fn the_filter_ticks_only_for_its_gauges_and_reads_time_only_from_the_host() {
    let host = host();
    let vm = vm(&host);
    // One tick a second sets the gauges (snapshot age and generation, in flight per pod);
    // routing never waits for it.
    assert_eq!(vm.tick_period(), Some(std::time::Duration::from_secs(1)));
    let keys = host.shared_keys();
    assert_eq!(vm.advance(std::time::Duration::from_secs(60)).unwrap(), 60);
    assert_eq!(host.shared_keys(), keys, "a tick writes no shared data");
    // Time comes from the host clock: a snapshot accepted "now" is fresh, 10 s later stale.
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.1:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let mut s = state_request(&vm);
    s.send().unwrap();
    assert_eq!(json_of(&s)["age_ms"], 0);
    vm.advance(std::time::Duration::from_millis(1234)).unwrap();
    let mut s = state_request(&vm);
    s.send().unwrap();
    assert_eq!(json_of(&s)["age_ms"], 1234);
    assert!(vm.shutdown().unwrap());
}

/// A request whose body ends with trailers (HTTP/2, or HTTP/1.1 chunked with trailers) never
/// sees `end_of_stream` on a body callback; the filter decides in its trailers callback, so it
/// is routed like any other (and a snapshot push with trailers never reaches an upstream).
#[test]
fn a_request_with_trailers_is_routed_too() {
    let host = host();
    let vm = vm(&host);
    push_ok(
        &vm,
        &snapshot(
            &host,
            1,
            vec![pool(
                "llama",
                "pool_llama",
                &[LLAMA],
                vec![pod("10.0.0.1:8000", 0, 0, 0.1)],
            )],
        ),
    );
    let body = chat_body(LLAMA, "hi");
    let mut r = post(&vm, "/v1/chat/completions", &body);
    r.body(&body)
        .trailers(&[("x-checksum", "abc")])
        .send()
        .unwrap();
    assert_eq!(endpoints(&r), ["10.0.0.1:8000"], "{}", r.explain());
    assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
    let bytes = snapshot(
        &host,
        2,
        vec![pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod("10.0.0.2:8000", 0, 0, 0.1)],
        )],
    );
    let mut p = push_request(&vm, &bytes);
    p.trailers(&[("x-checksum", "abc")]).send().unwrap();
    assert!(
        !p.forwarded(),
        "a snapshot push must never reach an upstream"
    );
}

/// Envoy buffers the body while the filter reads it, up to the listener's
/// `per_connection_buffer_limit_bytes` (1 MiB by default). The filter's default `max_body_bytes`
/// sits just below, so an oversized body gets the filter's OpenAI-style 413; a filter limit
/// raised alone lets Envoy's plain-text 413 win; both raised, the body is routed.
#[test]
fn body_limits_of_the_filter_and_of_envoy_fit_together() {
    let host = host();
    let body = chat_body(LLAMA, &"y".repeat(2 * 1024 * 1024));
    let vm = vm(&host);
    let mut r = post(&vm, "/v1/chat/completions", &body);
    r.body_split(&body, 64 * 1024).send().unwrap();
    assert_eq!(r.response_status(), Some(413), "{}", r.explain());
    let local = r.local_response().expect("the filter's own 413");
    assert!(
        local.body_text().contains("request_too_large"),
        "{}",
        local.body_text()
    );
    assert!(!r.forwarded());
    // Only the filter's limit raised: Envoy's own buffer limit answers first.
    let big = config_with(r#", "max_body_bytes": 16777216"#);
    let vm1 = host.vm(&big).unwrap();
    let mut r = post(&vm1, "/v1/chat/completions", &body);
    r.body_split(&body, 64 * 1024).send().unwrap();
    assert_eq!(r.response_status(), Some(413), "{}", r.explain());
    assert!(
        r.local_response().is_none(),
        "this 413 is Envoy's, not the filter's"
    );
    assert_eq!(
        r.envoy_reply().map(|l| l.body_text()).as_deref(),
        Some("Payload Too Large")
    );
    // Both raised: the filter reads and routes it.
    let vm2 = host
        .builder()
        .plugin_config(big)
        .buffer_limit(Some(16 << 20))
        .start()
        .unwrap();
    let mut r = post(&vm2, "/v1/chat/completions", &body);
    r.body_split(&body, 64 * 1024).send().unwrap();
    assert_routed(&r);
    assert_eq!(r.upstream_header(CLUSTER).as_deref(), Some("pool_llama"));
}

/// A trap inside the real filter (here: the SDK's panic on a context id Envoy never created)
/// fails with the Rust panic message and a symbolicated Wasm backtrace, and the VM is dead.
#[test]
fn a_trap_in_the_real_filter_is_reported_with_its_backtrace() {
    let host = host();
    let vm = vm(&host);
    let err = vm
        .call_export("proxy_on_request_headers", &[999, 0, 0])
        .expect_err("must trap");
    let HostError::Trap {
        backtrace, output, ..
    } = &err
    else {
        panic!("not a trap: {err}")
    };
    assert!(
        backtrace.contains("llm_router_filter.wasm!proxy_on_request_headers"),
        "{backtrace}"
    );
    assert!(backtrace.contains("begin_panic"), "{backtrace}");
    assert!(
        output.contains("invalid context_id"),
        "the panic message is shown: {output}"
    );
    assert!(vm.is_dead());
}

#[test]
fn an_inference_objective_header_maps_to_a_priority() {
    let host = host();
    let vm = host
        .vm(&config_with(
            r#", "objectives": {"batch": -1, "chat": 0}, "priority": {"trust_headers": true},
               "flow": {"enabled": false}"#,
        ))
        .unwrap();
    push_ok(&vm, &saturated_fleet(&host, 6));
    let body = chat_body(LLAMA, "nightly batch");
    let expect = |cases: [(&str, Option<u32>); 3]| {
        for (objective, status) in cases {
            let mut r = post(&vm, "/v1/chat/completions", &body);
            r.header("x-gateway-inference-objective", objective)
                .body(&body)
                .send()
                .unwrap();
            assert_eq!(
                r.local_response().map(|l| l.status),
                status,
                "{objective}\n{}",
                r.explain()
            );
            r.finish().unwrap();
        }
    };
    expect([("batch", Some(429)), ("chat", None), ("unknown", None)]);
    // A snapshot's objectives section (the sidecar follows InferenceObjective objects)
    // replaces the configured map with the next push: "chat" is sheddable now and "batch",
    // which the section does not list, standard.
    let mut snap = llm_router_snapshot::Snapshot::decode(&saturated_fleet(&host, 6)).unwrap();
    snap.generation = 2;
    snap.objectives = Some(vec![llm_router_snapshot::Objective {
        name: "chat".into(),
        priority: -1,
    }]);
    push_ok(&vm, &snap.encode().unwrap());
    expect([("batch", None), ("chat", Some(429)), ("unknown", None)]);
    // The section gone again: the configured map is back.
    snap.generation = 3;
    snap.objectives = None;
    push_ok(&vm, &snap.encode().unwrap());
    expect([("batch", Some(429)), ("chat", None), ("unknown", None)]);
    // An explicit priority header wins over the objective.
    let mut r = post(&vm, "/v1/chat/completions", &body);
    r.headers(&[
        ("x-gateway-inference-objective", "batch"),
        ("x-llm-router-priority", "0"),
    ])
    .body(&body)
    .send()
    .unwrap();
    assert_routed(&r);
}

/// A configured pool the snapshot does not list, or lists under another cluster, is logged
/// once with the names involved when the first such snapshot arrives (not per request), and
/// again only when the disagreement changes.
#[test]
fn pools_the_snapshot_and_the_configuration_disagree_on_are_logged_once() {
    let host = host();
    let vm = host.vm(&config()).unwrap();
    let llama_only = |generation, cluster: &str| {
        let pods = vec![pod("10.0.0.1:8000", 0, 1, 0.1)];
        snapshot(
            &host,
            generation,
            vec![pool("llama", cluster, &[LLAMA], pods)],
        )
    };
    let warnings = |vm: &proxy_wasm_host::Vm| -> Vec<String> {
        vm.logs()
            .into_iter()
            .filter(|l| l.level == LogLevel::Warn && l.message.contains("llm-router: pool"))
            .map(|l| l.message)
            .collect()
    };
    // `n` routed requests (the filter reads the newest snapshot on each).
    let send = |n: usize| {
        for _ in 0..n {
            let body = chat_body(LLAMA, "hi");
            let mut r = post(&vm, "/v1/chat/completions", &body);
            r.body(&body).send().unwrap();
            assert_routed(&r);
            r.finish().unwrap();
        }
    };
    push_ok(&vm, &llama_only(1, "pool_llama"));
    send(3);
    let w = warnings(&vm);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("\"qwen\"") && w[0].contains("\"pool_qwen\""),
        "{}",
        w[0]
    );
    // The same disagreement in the next snapshot: nothing new.
    push_ok(&vm, &llama_only(2, "pool_llama"));
    send(1);
    assert_eq!(warnings(&vm).len(), 1);
    // Another one: the llama pool under another cluster too.
    push_ok(&vm, &llama_only(3, "llama_v2"));
    send(1);
    let w = warnings(&vm);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[1..].iter().any(|m| m.contains("\"llama_v2\"")), "{w:?}");
}
