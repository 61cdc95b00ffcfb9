//! The filter's metrics at the Wasm level: each one moves as it should on each path — routed,
//! degraded, every rejection, prefix and adapter hits, token usage from JSON replies and from
//! SSE streams split anywhere, the gauges set by the tick — and the debug scores header appears
//! only when configured. Stat names are decoded the way Envoy's `stats_tags` decode them
//! (`util::decode_stat`), so the labels checked here are the labels Prometheus gets.

mod util;

use proxy_wasm_host::{Host, Request, Response, Vm};
use std::time::Duration;
use util::*;

const REQUESTS: &str = "llm_router_requests_total";
const TOKENS: &str = "llm_router_tokens_total";
const PODS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

fn three_pods(host: &Host, vm: &Vm, generation: u64, waiting: u32) {
    let pods = PODS.iter().map(|a| pod(a, waiting, 1, 0.1)).collect();
    push_ok(
        vm,
        &snapshot(
            host,
            generation,
            vec![pool("llama", "pool_llama", &[LLAMA], pods)],
        ),
    );
}

fn outcome(host: &Host, outcome: &str) -> i64 {
    metric_sum(host, REQUESTS, &[("outcome", outcome)])
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

/// Answers a routed request from its first endpoint with `response`, then ends the stream.
fn answer(r: &mut Request, response: Response) {
    let served = endpoints(r).first().cloned().expect("routed");
    r.property("upstream.address", served.as_str());
    r.respond_with(response).unwrap();
    r.finish().unwrap();
}

/// A chat request with this JSON body (model LLAMA unless the body says otherwise).
fn send(vm: &Vm, body: &serde_json::Value) -> Request {
    let bytes = body.to_string().into_bytes();
    let mut r = post(vm, "/v1/chat/completions", &bytes);
    r.body(&bytes);
    r.send().unwrap();
    r
}

#[test]
fn every_outcome_is_counted_with_its_pool_and_model() {
    let host = host();
    let vm = host
        .vm(&config_with(r#", "max_body_bytes": 2048"#))
        .unwrap();
    // No snapshot yet: fallback (Envoy's own policy picks, no pod is named).
    let r = chat(&vm, LLAMA, "before any snapshot");
    assert!(r.local_response().is_none(), "{}", r.explain());
    assert_eq!(
        series(&host, REQUESTS),
        vec![(
            labels(&[
                ("pool", "llama"),
                ("model", LLAMA),
                ("target", ""),
                ("outcome", "fallback")
            ]),
            1
        )]
    );
    assert!(series(&host, "llm_router_picks_total").is_empty());

    three_pods(&host, &vm, 1, 0);
    let mut r = chat(&vm, LLAMA, "routed");
    let first = endpoints(&r)[0].clone();
    answer(&mut r, Response::new(200));
    // An alias is counted under the name the client used.
    let alias = chat(&vm, "llama-8b", "routed by alias");
    assert!(alias.local_response().is_none());
    assert_eq!(
        metric_sum(
            &host,
            REQUESTS,
            &[("pool", "llama"), ("model", LLAMA), ("outcome", "routed")]
        ),
        1
    );
    assert_eq!(
        metric_sum(
            &host,
            REQUESTS,
            &[("model", "llama-8b"), ("outcome", "routed")]
        ),
        1
    );
    let alias_first = endpoints(&alias)[0].clone();
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_picks_total",
            &[("pool", "llama"), ("pod", &first)]
        ),
        1 + i64::from(alias_first == first)
    );
    assert_eq!(metric_sum(&host, "llm_router_picks_total", &[]), 2);
    // Every decision that ran is timed, in microseconds (the host clock does not move while
    // the module runs, so each sample is 0 here; Envoy's real clock is checked end to end).
    let decision = host
        .metric("llm_router_decision_duration_microseconds")
        .expect("decision histogram");
    assert_eq!(decision.samples.len(), 3, "{decision:?}");

    // Rejections: the client's model text never becomes a label.
    let unknown = chat(&vm, "gpt-7-ultra", "no such model");
    assert_eq!(unknown.local_response().map(|l| l.status), Some(404));
    assert_eq!(
        series(&host, REQUESTS)
            .into_iter()
            .filter(|(l, _)| l.contains(&("outcome".into(), "unknown_model".into())))
            .collect::<Vec<_>>(),
        vec![(
            labels(&[
                ("pool", ""),
                ("model", ""),
                ("target", ""),
                ("outcome", "unknown_model")
            ]),
            1
        )]
    );
    let bad = send(&vm, &serde_json::json!({"messages": []}));
    assert_eq!(bad.local_response().map(|l| l.status), Some(400));
    let big = chat_body(LLAMA, &"x".repeat(4000));
    let mut large = post(&vm, "/v1/chat/completions", &big);
    large.body(&big).send().unwrap();
    assert_eq!(large.local_response().map(|l| l.status), Some(413));
    assert_eq!(
        (outcome(&host, "bad_request"), outcome(&host, "too_large")),
        (1, 1)
    );

    // Shed: every pod 12x past saturation sheds even standard requests (critical_factor 10).
    three_pods(&host, &vm, 2, 60);
    let shed = chat(&vm, LLAMA, "too busy");
    assert_eq!(shed.local_response().map(|l| l.status), Some(429));
    assert_eq!(
        metric_sum(
            &host,
            REQUESTS,
            &[("pool", "llama"), ("model", LLAMA), ("outcome", "shed")]
        ),
        1
    );
    // No endpoints: every pod failing.
    let mut failing: Vec<_> = PODS.iter().map(|a| pod(a, 0, 0, 0.1)).collect();
    for p in &mut failing {
        p.health = llm_router_snapshot::Health::Failing;
    }
    push_ok(
        &vm,
        &snapshot(
            &host,
            3,
            vec![pool("llama", "pool_llama", &[LLAMA], failing)],
        ),
    );
    let none = chat(&vm, LLAMA, "nobody there");
    assert_eq!(none.local_response().map(|l| l.status), Some(503));
    assert_eq!(
        metric_sum(
            &host,
            REQUESTS,
            &[
                ("pool", "llama"),
                ("model", LLAMA),
                ("outcome", "no_endpoints")
            ]
        ),
        1
    );
    // Stale snapshot: least_inflight (degraded), still a pick.
    three_pods(&host, &vm, 4, 0);
    host.advance_clock(Duration::from_secs(10));
    let stale = chat(&vm, LLAMA, "old news");
    assert!(stale.local_response().is_none(), "{}", stale.explain());
    assert_eq!(
        metric_sum(
            &host,
            REQUESTS,
            &[
                ("pool", "llama"),
                ("model", LLAMA),
                ("outcome", "least_inflight")
            ]
        ),
        1
    );
    assert_eq!(metric_sum(&host, "llm_router_picks_total", &[]), 3);
    // Each request counted exactly once.
    // fallback, routed twice, unknown model, 400, 413, shed, no endpoints, least_inflight.
    assert_eq!(metric_sum(&host, REQUESTS, &[]), 9);
    assert_eq!(
        host.metric("llm_router_decision_duration_microseconds")
            .map(|m| m.samples.len()),
        Some(7),
        "the routed, shed, unknown-model and no-endpoint decisions are timed; 400 and 413 \
         never reach one"
    );
}

#[test]
fn prefix_and_adapter_hits_are_counted_per_pool() {
    let host = host();
    let vm = vm(&host);
    three_pods(&host, &vm, 1, 0);
    let prompt = "a long shared document ".repeat(40);
    let mut first = chat(&vm, LLAMA, &prompt);
    let pod = endpoints(&first)[0].clone();
    answer(&mut first, Response::new(200));
    assert_eq!(
        metric_sum(&host, "llm_router_prefix_hits_total", &[]),
        0,
        "a new prompt"
    );
    let mut again = chat(&vm, LLAMA, &prompt);
    assert_eq!(endpoints(&again)[0], pod, "{}", again.explain());
    answer(&mut again, Response::new(200));
    assert_eq!(
        metric_sum(&host, "llm_router_prefix_hits_total", &[("pool", "llama")]),
        1
    );
    assert_eq!(metric_sum(&host, "llm_router_lora_hits_total", &[]), 0);

    // An adapter request goes to its home or where it is loaded: a hit.
    let pods = vec![
        lora_pod("10.0.0.1:8000", &[], 2),
        lora_pod("10.0.0.2:8000", &["sql-lora"], 2),
    ];
    push_ok(
        &vm,
        &snapshot(&host, 2, vec![pool("llama", "pool_llama", &[LLAMA], pods)]),
    );
    let mut r = chat(&vm, "sql-lora", "select 1");
    answer(&mut r, Response::new(200));
    assert_eq!(
        metric_sum(&host, "llm_router_lora_hits_total", &[("pool", "llama")]),
        1
    );
}

fn json_reply(body: &str) -> Response {
    Response::new(200)
        .header("content-type", "application/json")
        .chunk(body)
}

#[test]
fn tokens_are_read_from_json_replies_only_when_they_can_carry_usage() {
    let host = host();
    let vm = vm(&host);
    three_pods(&host, &vm, 1, 0);
    let usage = r#"{"id":"c1","choices":[{"message":{"content":"the \"usage\":{\"prompt_tokens\":1000} in text"}}],"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}}"#;
    let mut r = chat(&vm, LLAMA, "count me");
    answer(&mut r, json_reply(usage));
    assert_eq!(
        series(&host, TOKENS),
        vec![
            (
                labels(&[("pool", "llama"), ("model", LLAMA), ("kind", "completion")]),
                9
            ),
            (
                labels(&[("pool", "llama"), ("model", LLAMA), ("kind", "prompt")]),
                21
            ),
        ]
    );
    // The same body split into 3-byte chunks counts the same.
    let mut r = chat(&vm, LLAMA, "count me in pieces");
    let chunks: Vec<&[u8]> = usage.as_bytes().chunks(3).collect();
    let mut resp = Response::new(200).header("content-type", "application/json; charset=utf-8");
    for c in chunks {
        resp = resp.chunk(c);
    }
    answer(&mut r, resp);
    assert_eq!(
        metric_sum(&host, TOKENS, &[("kind", "prompt")]),
        42,
        "{:?}",
        series(&host, TOKENS)
    );
    // Not a 200, not JSON: nothing is read.
    let mut r = chat(&vm, LLAMA, "an error");
    answer(
        &mut r,
        Response::new(500)
            .header("content-type", "application/json")
            .chunk(usage),
    );
    let mut r = chat(&vm, LLAMA, "plain text");
    answer(
        &mut r,
        Response::new(200)
            .header("content-type", "text/plain")
            .chunk(usage),
    );
    assert_eq!(metric_sum(&host, TOKENS, &[("kind", "prompt")]), 42);
    assert_eq!(metric_sum(&host, TOKENS, &[("kind", "completion")]), 18);
}

/// The last non-null `usage` of an SSE transcript, read with serde_json line by line (not
/// with the filter's scanner).
fn expected_usage(sse: &str) -> (i64, i64) {
    let mut out = (0, 0);
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            out = (
                u["prompt_tokens"].as_i64().unwrap(),
                u["completion_tokens"].as_i64().unwrap(),
            );
        }
    }
    out
}

fn streamed(vm: &Vm, include_usage: bool, tag: &str) -> Request {
    let mut body = serde_json::json!({"model": LLAMA, "stream": true,
        "messages": [{"role": "user", "content": tag}]});
    if include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    send(vm, &body)
}

#[test]
fn tokens_are_read_from_real_sse_streams_split_anywhere() {
    let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/sse"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sse"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let sse = std::fs::read_to_string(&file).unwrap();
        let (prompt, completion) = expected_usage(&sse);
        assert!(prompt > 0 && completion > 0, "{}", file.display());
        for size in [1, 7, 64, 1000] {
            let host = host();
            let vm = vm(&host);
            three_pods(&host, &vm, 1, 0);
            let mut r = streamed(&vm, true, "stream with usage");
            let mut resp = Response::new(200).header("content-type", "text/event-stream");
            for c in sse.as_bytes().chunks(size) {
                resp = resp.chunk(c);
            }
            answer(&mut r, resp);
            assert_eq!(
                (
                    metric_sum(&host, TOKENS, &[("pool", "llama"), ("kind", "prompt")]),
                    metric_sum(&host, TOKENS, &[("model", LLAMA), ("kind", "completion")])
                ),
                (prompt, completion),
                "{} in chunks of {size}",
                file.display()
            );
        }
    }
}

#[test]
fn a_stream_without_include_usage_is_not_read() {
    let host = host();
    let vm = vm(&host);
    three_pods(&host, &vm, 1, 0);
    let sse = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n";
    let mut r = streamed(&vm, false, "no usage asked");
    vm.count_calls(true);
    answer(
        &mut r,
        Response::new(200)
            .header("content-type", "text/event-stream")
            .chunk(sse)
            .chunk("data: [DONE]\n\n"),
    );
    let calls = vm.call_counts();
    vm.count_calls(false);
    assert!(
        !calls.contains_key("proxy_get_buffer_bytes"),
        "the stream's chunks were copied into the module: {calls:?}"
    );
    assert!(series(&host, TOKENS).is_empty());
}

#[test]
fn anthropic_messages_streams_report_usage_without_being_asked() {
    let host = host();
    let vm = vm(&host);
    three_pods(&host, &vm, 1, 0);
    let body = serde_json::json!({"model": LLAMA, "stream": true, "max_tokens": 10,
        "messages": [{"role": "user", "content": "hello"}]})
    .to_string();
    let mut r = post(&vm, "/v1/messages", body.as_bytes());
    r.body(body.as_bytes()).send().unwrap();
    let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n\
               event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
               event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n\
               event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let mut resp = Response::new(200).header("content-type", "text/event-stream");
    for c in sse.as_bytes().chunks(11) {
        resp = resp.chunk(c);
    }
    answer(&mut r, resp);
    assert_eq!(
        (
            metric_sum(&host, TOKENS, &[("kind", "prompt")]),
            metric_sum(&host, TOKENS, &[("kind", "completion")])
        ),
        (12, 7)
    );
}

#[test]
fn the_gauges_follow_the_tick() {
    let host = host();
    let vm = vm(&host);
    vm.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(
        host.metric("llm_router_snapshot_generation")
            .map(|m| m.value),
        Some(0)
    );
    three_pods(&host, &vm, 7, 0);
    let r = chat(&vm, LLAMA, "in flight");
    let pod = endpoints(&r)[0].clone();
    vm.advance(Duration::from_millis(2500)).unwrap();
    assert_eq!(
        host.metric("llm_router_snapshot_generation")
            .map(|m| m.value),
        Some(7)
    );
    assert_eq!(
        host.metric("llm_router_snapshot_age_seconds")
            .map(|m| m.value),
        Some(2)
    );
    let in_flight = series(&host, "llm_router_in_flight");
    assert_eq!(in_flight.len(), 3, "one gauge per pod: {in_flight:?}");
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_in_flight",
            &[("pool", "llama"), ("pod", &pod)]
        ),
        1
    );
    assert_eq!(metric_sum(&host, "llm_router_in_flight", &[]), 1);
    let mut r = r;
    answer(&mut r, Response::new(200));
    assert_eq!(
        metric_sum(&host, "llm_router_in_flight", &[]),
        1,
        "a gauge moves at the tick, not per request"
    );
    vm.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(metric_sum(&host, "llm_router_in_flight", &[]), 0);
    // A pod that leaves the snapshot goes to 0 instead of keeping its last value.
    let r = chat(&vm, LLAMA, "in flight again");
    let pod = endpoints(&r)[0].clone();
    vm.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(
        metric_sum(&host, "llm_router_in_flight", &[("pod", &pod)]),
        1
    );
    let others: Vec<_> = PODS
        .iter()
        .filter(|a| **a != pod)
        .map(|a| util::pod(a, 0, 1, 0.1))
        .collect();
    push_ok(
        &vm,
        &snapshot(
            &host,
            8,
            vec![pool("llama", "pool_llama", &[LLAMA], others)],
        ),
    );
    vm.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(
        metric_sum(&host, "llm_router_in_flight", &[("pod", &pod)]),
        0
    );
}

#[test]
fn the_scores_header_is_there_only_when_configured() {
    let host = host();
    let off = vm(&host);
    three_pods(&host, &off, 1, 0);
    let mut r = chat(&off, LLAMA, "no debug");
    answer(&mut r, Response::new(200));
    assert_eq!(r.response_header("x-llm-router-scores"), None);

    let host = util::host();
    let on = host.vm(&config_with(r#", "debug_scores": true"#)).unwrap();
    let five = (1..=5)
        .map(|i| pod(&format!("10.0.1.{i}:8000"), i % 3, 1, 0.1))
        .collect();
    push_ok(
        &on,
        &snapshot(&host, 1, vec![pool("llama", "pool_llama", &[LLAMA], five)]),
    );
    let mut r = chat(&on, LLAMA, "debug me");
    let chosen = endpoints(&r);
    assert_eq!(chosen.len(), 3, "top_k endpoints");
    answer(&mut r, Response::new(200));
    let header = r
        .response_header("x-llm-router-scores")
        .unwrap_or_else(|| panic!("no scores header\n{}", r.explain()));
    let (mode, list) = header.split_once(' ').expect("mode, then scores");
    assert_eq!(mode, "scored");
    let scores: Vec<(String, f64)> = list
        .split(',')
        .map(|e| {
            let (a, s) = e.rsplit_once('=').expect("addr=score");
            (a.to_string(), s.parse().expect("a number"))
        })
        .collect();
    // Every pod, not only the top_k endpoints, best first, the first being the chosen pod.
    assert_eq!(scores.len(), 5, "{header}");
    assert_eq!(scores[0].0, chosen[0], "{header}");
    assert!(
        scores.windows(2).all(|w| w[0].1 >= w[1].1),
        "best first: {header}"
    );
    assert!(scores.iter().all(|(_, s)| (0.0..=1.0).contains(s)));
}
