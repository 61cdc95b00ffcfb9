//! Hostile request bodies (issue 12) against the release `.wasm` under the wasmtime host:
//! deeply nested JSON, huge strings, wrong types, duplicate keys, invalid UTF-8, bodies over the
//! size limit with and without a (truthful) `content-length`, each delivered whole and in small
//! chunks (1 byte where the body is small). Each gets the status and OpenAI-style error that
//! `filter/README.md` ("Errors clients can get") documents, the reply repeats only a bounded
//! part of the client's text, nothing refused goes upstream, and the same worker then routes an
//! ordinary request normally with nothing left counted in flight.

mod util;

use util::*;

const CHAT: &str = "/v1/chat/completions";

/// What a body must get: a status and error code, or routed upstream unchanged.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Routed,
    Refused(u32, &'static str),
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    expect: Expect,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        name,
        body: body.into(),
        expect,
    }
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

fn cases() -> Vec<Case> {
    use Expect::{Refused, Routed};
    let bad_json = Refused(400, "invalid_json");
    let bad_model = Refused(400, "invalid_model");
    let user = r#"[{"role":"user","content":"hello"}]"#;
    vec![
        // Nesting: serde_json's depth limit (128) in every field the filter reads…
        case(
            "content nested 100,000 deep",
            format!(
                r#"{{"model":"{LLAMA}","messages":[{{"role":"user","content":{}}}]}}"#,
                nested(100_000, r#""x""#)
            ),
            bad_json,
        ),
        case(
            "messages nested 10,000 deep",
            format!(r#"{{"model":"{LLAMA}","messages":{}}}"#, nested(10_000, "")),
            bad_json,
        ),
        // …while a field it skips is skipped without recursion and goes upstream unchanged.
        case(
            "skipped field nested 100,000 deep",
            format!(
                r#"{{"model":"{LLAMA}","messages":{user},"metadata":{}}}"#,
                nested(100_000, "1")
            ),
            Routed,
        ),
        // Huge strings: a prompt just under the limit routes; a huge model or wrong-typed value
        // is refused with its text cut short in the reply.
        case(
            "900 KB prompt",
            chat_body(LLAMA, &"All work and no play. ".repeat(41_000)),
            Routed,
        ),
        case(
            "500 KB model name",
            chat_body(&"m".repeat(500_000), "hi"),
            Refused(404, "model_not_found"),
        ),
        case(
            "500 KB string as stream",
            format!(
                r#"{{"model":"{LLAMA}","stream":"{}","messages":{user}}}"#,
                "y".repeat(500_000)
            ),
            bad_json,
        ),
        // Wrong types.
        case(
            "model is a number",
            r#"{"model":42,"messages":[]}"#,
            bad_model,
        ),
        case(
            "model is null",
            r#"{"model":null,"messages":[]}"#,
            bad_model,
        ),
        case(
            "model is an array",
            format!(r#"{{"model":["{LLAMA}"]}}"#),
            bad_model,
        ),
        case("model is an object", r#"{"model":{"name":"x"}}"#, bad_model),
        case(
            "stream is a string",
            format!(r#"{{"model":"{LLAMA}","stream":"yes","messages":{user}}}"#),
            bad_json,
        ),
        case(
            "stream is a number",
            format!(r#"{{"model":"{LLAMA}","stream":1,"messages":{user}}}"#),
            bad_json,
        ),
        case(
            "messages is a string",
            format!(r#"{{"model":"{LLAMA}","messages":"hello"}}"#),
            bad_json,
        ),
        case(
            "messages is an object",
            format!(r#"{{"model":"{LLAMA}","messages":{{"role":"user"}}}}"#),
            bad_json,
        ),
        case(
            "a message is a number",
            format!(r#"{{"model":"{LLAMA}","messages":[1]}}"#),
            bad_json,
        ),
        case("body is an array", format!(r#"["{LLAMA}"]"#), bad_json),
        // Duplicate keys: refused, so the filter and the model server cannot disagree on them.
        case(
            "model twice",
            format!(
                r#"{{"model":"{LLAMA}","model":"Qwen/Qwen2.5-7B-Instruct","messages":{user}}}"#
            ),
            bad_json,
        ),
        case(
            "stream twice",
            format!(r#"{{"model":"{LLAMA}","stream":false,"stream":true,"messages":{user}}}"#),
            bad_json,
        ),
        case(
            "role twice in a message",
            format!(
                r#"{{"model":"{LLAMA}","messages":[{{"role":"user","role":"system","content":"x"}}]}}"#
            ),
            bad_json,
        ),
        // Invalid UTF-8, also where the filter does not look.
        case(
            "invalid UTF-8 in the prompt",
            [
                format!(r#"{{"model":"{LLAMA}","messages":[{{"role":"user","content":"caf"#)
                    .as_bytes(),
                b"\xe9\"}]}",
            ]
            .concat(),
            bad_json,
        ),
        case(
            "invalid UTF-8 in a skipped field",
            [
                format!(r#"{{"model":"{LLAMA}","messages":{user},"user":""#).as_bytes(),
                b"\xc3\x28\xff\"}",
            ]
            .concat(),
            bad_json,
        ),
        case(
            "invalid UTF-8 in the model",
            [&b"{\"model\":\"\xff\xfe\",\"messages\":[]}"[..]].concat(),
            bad_json,
        ),
        // Not JSON at all.
        case(
            "truncated",
            format!(r#"{{"model":"{LLAMA}","messages":["#),
            bad_json,
        ),
        case(
            "binary",
            (0..=255u8).cycle().take(3000).collect::<Vec<u8>>(),
            bad_json,
        ),
    ]
}

/// The ordinary request after each hostile one: routed to the idle pod.
fn assert_serves_normally(host: &proxy_wasm_host::Host, vm: &proxy_wasm_host::Vm, after: &str) {
    let mut r = chat(vm, LLAMA, "an ordinary question");
    assert!(
        r.local_response().is_none() && r.forwarded_complete(),
        "after {after}: the next request was not routed\n{}",
        r.explain()
    );
    assert_eq!(
        endpoints(&r).first().map(String::as_str),
        Some("10.0.0.1:8000"),
        "after {after}"
    );
    r.respond(
        &[(":status", "200"), ("content-type", "application/json")],
        &[&b"{}"[..]],
    )
    .unwrap();
    r.finish().unwrap();
    assert_eq!(inflight(host, "llama"), vec![], "after {after}");
}

fn check(
    host: &proxy_wasm_host::Host,
    vm: &proxy_wasm_host::Vm,
    c: &Case,
    how: &str,
    r: &mut proxy_wasm_host::Request,
) {
    let what = format!("{} ({how})", c.name);
    match c.expect {
        Expect::Routed => {
            assert!(
                r.local_response().is_none() && r.forwarded_complete(),
                "{what}: not routed\n{}",
                r.explain()
            );
            assert!(r.upstream_body() == c.body, "{what}: body changed");
            assert!(!endpoints(r).is_empty(), "{what}: no endpoint");
            r.respond(
                &[(":status", "200"), ("content-type", "application/json")],
                &[&b"{}"[..]],
            )
            .unwrap();
        }
        Expect::Refused(status, code) => {
            let lr = r
                .local_response()
                .unwrap_or_else(|| panic!("{what}: no local reply\n{}", r.explain()));
            assert_eq!(lr.status, status, "{what}: {}", lr.body_text());
            assert_eq!(
                lr.header("content-type"),
                Some("application/json"),
                "{what}"
            );
            assert!(lr.header(REASON).is_some(), "{what}: no reason header");
            assert!(
                lr.body.len() < 1024,
                "{what}: the reply repeats {} bytes",
                lr.body.len()
            );
            let j = json_of(r);
            assert_eq!(j["error"]["code"], code, "{what}: {j}");
            assert_eq!(j["error"]["type"], "invalid_request_error", "{what}");
            assert!(
                j["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{what}"
            );
            assert!(!r.forwarded(), "{what}: a refused body went upstream");
        }
    }
    assert!(r.violations().is_empty(), "{what}: {:?}", r.violations());
    r.finish().unwrap();
    assert_serves_normally(host, vm, &what);
}

fn started() -> (proxy_wasm_host::Host, proxy_wasm_host::Vm) {
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
                    pod("10.0.0.2:8000", 4, 6, 0.7),
                ],
            )],
        ),
    );
    (host, vm)
}

#[test]
fn each_hostile_body_gets_its_documented_answer_whole_and_in_chunks() {
    let (host, vm) = started();
    let cases = cases();
    let refused = cases.iter().filter(|c| c.expect != Expect::Routed).count();
    for c in &cases {
        // Whole, with a truthful content-length.
        let mut r = post(&vm, CHAT, &c.body);
        r.body(&c.body)
            .send()
            .unwrap_or_else(|e| panic!("{}: the filter failed: {e}", c.name));
        check(&host, &vm, c, "whole", &mut r);
        // In chunks, without a content-length (as chunked transfer encoding): 1 byte each for
        // small bodies, 64 KiB for big ones (the host copies the buffer on every chunk).
        let size = if c.body.len() <= 4096 { 1 } else { 65_536 };
        let mut r = vm.request();
        r.headers(&[
            (":method", "POST"),
            (":path", CHAT),
            (":authority", "gateway.local"),
            ("content-type", "application/json"),
        ])
        .property("source.address", "10.0.0.99:50000")
        .body_split(&c.body, size)
        .send()
        .unwrap_or_else(|e| panic!("{}: the filter failed in chunks: {e}", c.name));
        check(&host, &vm, c, &format!("{size}-byte chunks"), &mut r);
    }
    // Every refusal is counted once, under its rejection outcome.
    let rejected: i64 = series(&host, "llm_router_requests_total")
        .iter()
        .filter(|(labels, _)| {
            labels.iter().any(|(k, v)| {
                k == "outcome" && !matches!(v.as_str(), "routed" | "least_inflight" | "fallback")
            })
        })
        .map(|(_, v)| *v)
        .sum();
    assert_eq!(rejected, 2 * refused as i64);
}

#[test]
fn bodies_over_the_limit_are_413_declared_or_not() {
    let (host, vm) = started();
    let limit = 1_000_000; // the default max_body_bytes
    let big = chat_body(LLAMA, &"z".repeat(limit + 10));
    let too_large = Case {
        name: "over max_body_bytes",
        body: big.clone(),
        expect: Expect::Refused(413, "request_too_large"),
    };
    // Declared: refused at the headers.
    let mut r = post(&vm, CHAT, &big);
    r.body(&big).send().unwrap();
    check(&host, &vm, &too_large, "declared", &mut r);
    // Not declared (chunked): refused once the buffered body passes the limit.
    let mut r = vm.request();
    r.headers(&[(":method", "POST"), (":path", CHAT)])
        .body_split(&big, 65_536)
        .send()
        .unwrap();
    check(&host, &vm, &too_large, "chunked", &mut r);
    // A content-length that understates the body (Envoy's codec would refuse it first; the
    // filter still counts what it buffers).
    let mut r = vm.request();
    r.headers(&[
        (":method", "POST"),
        (":path", CHAT),
        ("content-length", "100"),
    ])
    .body_split(&big, 65_536)
    .send()
    .unwrap();
    check(&host, &vm, &too_large, "understated content-length", &mut r);
}
