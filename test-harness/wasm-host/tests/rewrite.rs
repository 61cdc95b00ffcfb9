//! Canary and weighted model rewrites at the Wasm level: a rule's chosen target becomes the
//! body's `model`, picks its pool's cluster, reaches the pod in the rewrite header, comes back
//! in `x-llm-router-served-model`, and is the `target` label of `llm_router_requests_total`;
//! a sticky rule keeps a conversation on one target.

mod util;

use proxy_wasm_host::{Host, Request, Response, Vm};
use util::*;

const QWEN: &str = "Qwen/Qwen2.5-7B-Instruct";
const SERVED_MODEL: &str = "x-llm-router-served-model";

fn rules(sticky: &str) -> String {
    format!(
        r#", "rewrites": [{{"model": "chat", "sticky": "{sticky}", "targets": [
            {{"model": "{LLAMA}", "weight": 90}}, {{"model": "{QWEN}", "weight": 10}}]}}]"#
    )
}

/// The two pools every test here routes over, one pod each.
fn two_pools() -> Vec<llm_router_snapshot::Pool> {
    vec![
        pool(
            "llama",
            "pool_llama",
            &[LLAMA],
            vec![pod("10.0.1.1:8000", 0, 1, 0.1)],
        ),
        pool(
            "qwen",
            "pool_qwen",
            &[QWEN],
            vec![pod("10.0.2.1:8000", 0, 1, 0.1)],
        ),
    ]
}

fn fleet(host: &Host, vm: &Vm) {
    push_ok(vm, &snapshot(host, 1, two_pools()));
}

/// Answers from the chosen pod and returns the served-model response header.
fn answer(r: &mut Request) -> Option<String> {
    let pod = endpoints(r).first().cloned().expect("routed");
    r.property("upstream.address", pod.as_str());
    r.respond_with(Response::new(200)).unwrap();
    let served = r.response_header(SERVED_MODEL);
    r.finish().unwrap();
    served
}

#[test]
fn a_rewrite_rule_sends_each_request_to_one_target_rewritten_labelled_and_reported() {
    let host = host();
    let vm = host.vm(&config_with(&rules("none"))).unwrap();
    fleet(&host, &vm);
    let n = 1_000;
    let mut to_qwen = 0;
    for i in 0..n {
        let mut r = chat(&vm, "chat", &format!("question {i}"));
        assert!(r.local_response().is_none(), "{}", r.explain());
        let body: serde_json::Value = serde_json::from_slice(&r.upstream_body()).unwrap();
        let model = body["model"].as_str().unwrap().to_string();
        let cluster = r.upstream_header(CLUSTER).unwrap();
        assert_eq!(
            r.upstream_header("content-length"),
            Some(r.upstream_body().len().to_string())
        );
        assert_eq!(r.upstream_header(REWRITE).as_deref(), Some(model.as_str()));
        match model.as_str() {
            QWEN => {
                to_qwen += 1;
                assert_eq!(cluster, "pool_qwen");
            }
            LLAMA => assert_eq!(cluster, "pool_llama"),
            other => panic!("rewritten to {other}"),
        }
        assert_eq!(answer(&mut r).as_deref(), Some(model.as_str()));
    }
    // 10 % of 1,000: the binomial's sd is 9.5; ±4 sd.
    assert!(
        (62..=138).contains(&to_qwen),
        "{to_qwen} of {n} to the 10% target"
    );
    // The metrics: the requested name as `model`, the served one as `target`.
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[
                ("pool", "qwen"),
                ("model", "chat"),
                ("target", QWEN),
                ("outcome", "routed")
            ]
        ),
        to_qwen
    );
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("pool", "llama"), ("model", "chat"), ("target", LLAMA)]
        ),
        n - to_qwen
    );
    // A name without a rule: no served-model header, an empty target.
    let mut r = chat(&vm, LLAMA, "plain");
    assert_eq!(r.upstream_header(REWRITE), None);
    assert_eq!(answer(&mut r), None);
    assert_eq!(
        metric_sum(
            &host,
            "llm_router_requests_total",
            &[("model", LLAMA), ("target", "")]
        ),
        1
    );
}

#[test]
fn a_sticky_rule_keeps_every_turn_of_a_conversation_on_one_target() {
    let host = host();
    let vm = host.vm(&config_with(&rules("conversation"))).unwrap();
    fleet(&host, &vm);
    let mut per_target = [0usize; 2];
    for c in 0..60 {
        let mut messages = vec![serde_json::json!({"role": "user", "content": format!("c{c}")})];
        let mut chosen: Option<String> = None;
        for turn in 0..4 {
            let body = serde_json::json!({"model": "chat", "messages": messages}).to_string();
            let mut r = post(&vm, "/v1/chat/completions", body.as_bytes());
            r.body(body.as_bytes());
            r.send().unwrap();
            let served = answer(&mut r).expect("served-model header");
            match &chosen {
                None => chosen = Some(served),
                Some(first) => assert_eq!(&served, first, "conversation {c} turn {turn}"),
            }
            messages.push(serde_json::json!({"role": "assistant", "content": "ok"}));
            messages.push(serde_json::json!({"role": "user", "content": format!("t{turn}")}));
        }
        per_target[usize::from(chosen.as_deref() == Some(QWEN))] += 1;
    }
    assert!(per_target[0] > 30, "{per_target:?}");
}

/// The snapshot's `chat` rule (`LLAMA` / `QWEN` at these weights) and a rule whose target no
/// configured pool serves, with the two-pool fleet, at `generation`.
fn snapshot_with_rules(host: &Host, generation: u64, llama: u32, qwen: u32) -> Vec<u8> {
    use llm_router_snapshot::{RewriteRule, RewriteSticky, RewriteTarget, Snapshot};
    let target = |model: &str, weight| RewriteTarget {
        model: model.into(),
        weight,
    };
    let mut snap = Snapshot::decode(&snapshot(host, generation, two_pools())).unwrap();
    snap.rewrites = Some(vec![
        RewriteRule {
            model: "chat".into(),
            sticky: RewriteSticky::None,
            targets: vec![target(LLAMA, llama), target(QWEN, qwen)],
        },
        RewriteRule {
            model: "typo".into(),
            sticky: RewriteSticky::None,
            targets: vec![target("no-such-model", 1)],
        },
    ]);
    snap.encode().unwrap()
}

/// The share of 200 `chat` requests served by `QWEN`.
fn qwen_share(vm: &Vm) -> f64 {
    let to_qwen = (0..200)
        .filter(|i| {
            let mut r = chat(vm, "chat", &format!("question {i}"));
            assert!(r.local_response().is_none(), "{}", r.explain());
            answer(&mut r).as_deref() == Some(QWEN)
        })
        .count();
    to_qwen as f64 / 200.0
}

/// Issue 43: the snapshot's rules replace the configured ones in the same VM, a weight change
/// is the next push (no new configuration), and a rule that does not resolve is logged once,
/// naming the rule and its target, while the others apply.
#[test]
fn the_snapshot_rules_replace_the_configured_ones_and_change_with_the_next_push() {
    let host = host();
    // Configured: 90/10. The snapshot's rules win over them.
    let vm = host.vm(&config_with(&rules("none"))).unwrap();
    push_ok(&vm, &snapshot_with_rules(&host, 1, 100, 0));
    assert_eq!(qwen_share(&vm), 0.0);
    push_ok(&vm, &snapshot_with_rules(&host, 2, 0, 100));
    assert_eq!(qwen_share(&vm), 1.0);
    // The same rules again: nothing new to log.
    push_ok(&vm, &snapshot_with_rules(&host, 3, 0, 100));
    assert_eq!(qwen_share(&vm), 1.0);
    let dropped: Vec<String> = vm
        .logs()
        .into_iter()
        .map(|l| l.message)
        .filter(|m| m.contains("snapshot rewrite rule for \"typo\" dropped"))
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(dropped[0].contains("\"no-such-model\""), "{}", dropped[0]);
    let r = chat(&vm, "typo", "hi");
    assert_eq!(r.local_response().map(|l| l.status), Some(404));
    // A snapshot without the section: the configured 90/10 rule again.
    push_ok(&vm, &snapshot(&host, 4, two_pools()));
    let share = qwen_share(&vm);
    assert!((0.02..=0.25).contains(&share), "{share}");
}

/// `llm_router_snapshot_rewrites_dropped`: the snapshot's rules that did not resolve, set with
/// the other gauges on the tick; back to 0 once a snapshot's rules all resolve, or it has none.
#[test]
fn the_dropped_snapshot_rules_are_a_gauge() {
    const GAUGE: &str = "llm_router_snapshot_rewrites_dropped";
    let host = host();
    let vm = host.vm(&config_with(&rules("none"))).unwrap();
    push_ok(&vm, &snapshot_with_rules(&host, 1, 90, 10));
    vm.advance(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(metric_sum(&host, GAUGE, &[]), 1, "the typo rule");
    push_ok(&vm, &snapshot(&host, 2, two_pools()));
    vm.advance(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(metric_sum(&host, GAUGE, &[]), 0, "no section");
}
