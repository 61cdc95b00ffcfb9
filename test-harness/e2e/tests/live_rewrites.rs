//! Issue 43: a canary's weight change reaches every gateway replica within 2 s, with no Envoy
//! reload and no request lost; so does the rule's deletion. Two real Envoys with the real
//! filter `.wasm`, each fed by its real `sidecar-metrics`, in front of model-sim pods serving
//! the base model and a LoRA adapter (the canary). The rule `chat -> {stable: 100, canary: 0}`
//! lives in the sidecars' configuration files (`rewrites:`, re-read while they run); it
//! reaches the filters in the signed snapshot. The filters' own configuration has only
//! `chat -> stable` (what a gateway falls back to), so the canary is reachable only through
//! the snapshot. A client loop per replica sends requests all along; both files are rewritten
//! to `{stable: 0, canary: 100}`, then the section is deleted from both, and the test asserts:
//!
//! - every replica serves the canary (the `x-llm-router-served-model` header and the model the
//!   pod echoes) for every request sent 2 s after the change, and the stable model again (its
//!   configured rule: a deleted section is no section) for every request sent 2 s after the
//!   deletion;
//! - the same Envoy processes (PIDs) and the same Wasm VMs (Envoy's
//!   `wasm.envoy.wasm.runtime.v8.created` counter, which a plugin reload raises) served it all;
//! - every response was a 200.
//!
//! `LLMR_E2E_SIDECAR_WITHOUT_REWRITES=1` leaves the section out of the sidecars' files (what a
//! sidecar that does not send rules does): the filters then keep their configured rule, never
//! serve the canary, and the test fails, which shows it can.
//!
//! Needs Envoy, the filter `.wasm`, `model-sim` and `sidecar-metrics` (`./build.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::stack::fleet::{FleetSpec, PodSpec, MODEL};
use testkit::stack::{self, RouterKind};
use testkit::{ChildGuard, EnvoyProcess};

const SERVED_MODEL: &str = "x-llm-router-served-model";
const STATE: &str = "/__llm_router/state";
/// The canary: a LoRA adapter on the pool's base model (the stable target).
const CANARY: &str = "canary-lora";
/// The bound from the change to every replica serving the new weights.
const BOUND: Duration = Duration::from_secs(2);

/// The sidecar's `rewrites:` section for `chat -> {MODEL: stable, CANARY: canary}`, re-read
/// every 100 ms.
fn rewrites_yaml(stable: u32, canary: u32) -> String {
    format!(
        "rewrites:\n  reload_ms: 100\n  rules:\n    - matches: [{{model: {{type: Exact, value: chat}}}}]\n      targets:\n        - {{modelRewrite: \"{MODEL}\", weight: {stable}}}\n        - {{modelRewrite: {CANARY}, weight: {canary}}}\n"
    )
}

/// One sidecar's whole configuration file: with the rule at `weights`, or without a
/// `rewrites:` section (`None`).
fn sidecar_yaml(base: &str, weights: Option<(u32, u32)>) -> String {
    match weights {
        Some(_) if std::env::var_os("LLMR_E2E_SIDECAR_WITHOUT_REWRITES").is_some() => {
            base.to_owned()
        }
        Some((stable, canary)) => format!("{base}{}", rewrites_yaml(stable, canary)),
        None => base.to_owned(),
    }
}

/// The filters' own rule for `chat`: the stable model only.
fn configured_rule() -> Value {
    json!({"rewrites": [{"model": "chat", "targets": [{"model": MODEL}]}]})
}

/// Replaces `path` whole (write, then rename), so the sidecar never reads half a file.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A real sidecar pushing into `envoy`, its configuration at the returned path.
async fn start_sidecar(
    i: usize,
    envoy: &EnvoyProcess,
    pods: &[SocketAddr],
) -> (ChildGuard, PathBuf, String) {
    let dir = testkit::testlog_dir(&format!("e2e-live-rewrites-sidecar-{i}")).unwrap();
    let port = stack::free_ports(1).unwrap()[0];
    let base = stack::sidecar_config(envoy.push_addr(), pods, ([127, 0, 0, 1], port).into());
    let path = dir.join("sidecar.yaml");
    write_atomically(&path, &sidecar_yaml(&base, Some((100, 0))));
    let mut cmd = std::process::Command::new(testkit::bin("sidecar-metrics").unwrap());
    cmd.arg("run").arg("--config").arg(&path);
    let guard = ChildGuard::spawn_logged("sidecar-metrics", cmd, &dir.join("sidecar.log")).unwrap();
    (guard, path, base)
}

async fn state(envoy: &EnvoyProcess) -> Value {
    let r = testkit::get(envoy.push_addr(), STATE, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

/// The weights of the snapshot's `chat` rule in the filter's state, if it has one.
fn chat_weights(s: &Value) -> Option<Vec<u64>> {
    let rules = s["rewrites"].as_array()?;
    let chat = rules.iter().find(|r| r["model"] == "chat")?;
    chat["targets"]
        .as_array()?
        .iter()
        .map(|t| t["weight"].as_u64())
        .collect()
}

/// Waits until every replica's filter holds a snapshot with pods (and, when the sidecars send
/// rules, the first weights), naming the sidecar's log when it does not.
async fn wait_ready(envoys: &[EnvoyProcess], sidecars: &[ChildGuard]) {
    let start = Instant::now();
    for (e, s) in envoys.iter().zip(sidecars) {
        loop {
            let st = state(e).await;
            let pods = stack::count_pods(&st);
            let rules_ok = std::env::var_os("LLMR_E2E_SIDECAR_WITHOUT_REWRITES").is_some()
                || chat_weights(&st) == Some(vec![100, 0]);
            if pods == 2 && rules_ok {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no snapshot with the rule: {st}\n{}",
                s.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One answered request: when it was sent, its status, the served model (header) and the
/// model the pod echoed.
#[derive(Debug, Clone)]
struct Answer {
    sent: Instant,
    status: u16,
    served: String,
    echoed: String,
}

/// Sends chat requests for `chat` to `addr` one after another until `stop`.
async fn client_loop(addr: SocketAddr, replica: usize, stop: Arc<AtomicBool>) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let body = json!({"model": "chat", "max_tokens": 4,
            "messages": [{"role": "user", "content": format!("replica {replica} request {n}")}]});
        let sent = Instant::now();
        let (status, served, echoed) =
            match testkit::post_json(addr, "/v1/chat/completions", &[], &body).await {
                Ok(r) => (
                    r.status,
                    r.header(SERVED_MODEL).unwrap_or_default().to_owned(),
                    r.json()
                        .ok()
                        .and_then(|v| v["model"].as_str().map(str::to_owned))
                        .unwrap_or_default(),
                ),
                Err(e) => (0, String::new(), format!("no answer: {e}")),
            };
        out.push(Answer {
            sent,
            status,
            served,
            echoed,
        });
    }
    out
}

/// Envoy's Wasm runtime counters (`wasm.envoy.wasm.runtime.*`): a reload of the plugin creates
/// new VMs and raises `created`.
fn wasm_runtime_stats(envoy: &EnvoyProcess) -> Vec<(String, u64)> {
    envoy
        .stats()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.starts_with("wasm.envoy.wasm.runtime.") && k.ends_with(".created"))
        .collect()
}

/// When the replica's answers sent from `change` until `until` turned to `model` for good: the
/// send time of the first request after which every answer in that span served it (header and
/// echo), measured from `change`; `None` when the last one did not.
fn applied_after(
    answers: &[Answer],
    change: Instant,
    until: Instant,
    model: &str,
) -> Option<Duration> {
    let span: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.sent >= change && a.sent < until)
        .collect();
    let served = |a: &Answer| a.served == model && a.echoed == model;
    let first_for_good = match span.iter().rposition(|a| !served(a)) {
        Some(i) => span.get(i + 1)?,
        None => span.first()?,
    };
    Some(first_for_good.sent.saturating_duration_since(change))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_weight_change_reaches_every_replica_within_2s_without_a_reload() {
    if !testkit::stack_ready("a_canary_weight_change_reaches_every_replica", []) {
        return;
    }
    let fleet = FleetSpec {
        pods: vec![PodSpec::new("h100"); 2],
        speedup: 20.0,
        seed: 43,
        engine: Default::default(),
        admission: None,
    };
    let adapters = vec![CANARY.to_owned()];
    let pods = stack::start_pods(&fleet, &adapters).await.unwrap();
    let mut envoys = Vec::new();
    for i in 0..2 {
        let mut spec = stack::envoy_spec(
            RouterKind::Filter,
            &fleet,
            &pods.addrs,
            &adapters,
            &configured_rule(),
        );
        spec.name = format!("e2e-live-rewrites-{i}");
        // The filter's own rule knows only the stable model: the canary comes from the snapshot.
        assert_eq!(
            spec.effective_plugin_config()["rewrites"],
            configured_rule()["rewrites"]
        );
        envoys.push(spec.start().await.unwrap());
    }
    let mut sidecars = Vec::new();
    let mut files = Vec::new();
    for (i, e) in envoys.iter().enumerate() {
        let (guard, path, base) = start_sidecar(i, e, &pods.addrs).await;
        sidecars.push(guard);
        files.push((path, base));
    }
    wait_ready(&envoys, &sidecars).await;

    let pids: Vec<u32> = envoys.iter().map(EnvoyProcess::pid).collect();
    let vms: Vec<Vec<(String, u64)>> = envoys.iter().map(wasm_runtime_stats).collect();
    assert!(
        vms.iter().all(|v| v.iter().any(|(_, n)| *n > 0)),
        "no Wasm runtime counter to tell a reload by: {vms:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = envoys
        .iter()
        .enumerate()
        .map(|(i, e)| tokio::spawn(client_loop(e.listen_addr, i, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let change = Instant::now();
    for (path, base) in &files {
        write_atomically(path, &sidecar_yaml(base, Some((0, 100))));
    }
    tokio::time::sleep(BOUND + Duration::from_secs(2)).await;
    let deletion = Instant::now();
    for (path, base) in &files {
        write_atomically(path, &sidecar_yaml(base, None));
    }
    tokio::time::sleep(BOUND + Duration::from_secs(2)).await;
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for l in loops {
        answers.push(l.await.unwrap());
    }

    let mut slowest = Duration::ZERO;
    for (i, a) in answers.iter().enumerate() {
        let failed: Vec<&Answer> = a.iter().filter(|x| x.status != 200).collect();
        assert!(
            failed.is_empty(),
            "replica {i}: {} of {} requests failed, first {:?}\n{}",
            failed.len(),
            a.len(),
            failed.first(),
            sidecars[i].log_tail(20)
        );
        let before: Vec<&Answer> = a.iter().filter(|x| x.sent < change).collect();
        assert!(before.len() >= 5, "replica {i}: too few requests before");
        assert!(
            before
                .iter()
                .all(|x| x.served == MODEL && x.echoed == MODEL),
            "replica {i}: before the change, not all to the stable model"
        );
        for (what, from, until, model) in [
            ("the change", change, deletion, CANARY),
            ("the deletion", deletion, end, MODEL),
        ] {
            let after = applied_after(a, from, until, model).unwrap_or_else(|| {
                panic!("replica {i} never served {model} for good after {what}")
            });
            let late = a
                .iter()
                .filter(|x| x.sent >= from + after && x.sent < until)
                .count();
            assert!(late >= 5, "replica {i}: too few requests after {what}");
            println!(
                "replica {i}: {} requests, every one sent {after:?} after {what} served {model}",
                a.len()
            );
            assert!(
                after <= BOUND,
                "replica {i} served another model {after:?} after {what}"
            );
            slowest = slowest.max(after);
        }
    }
    println!("change or deletion to every replica applying it: {slowest:?}");
    for (i, e) in envoys.iter().enumerate() {
        assert_eq!(e.pid(), pids[i], "replica {i}: Envoy restarted");
        assert!(testkit::pid_alive(e.pid()), "replica {i}: Envoy exited");
        assert_eq!(
            wasm_runtime_stats(e),
            vms[i],
            "replica {i}: its Wasm VMs were recreated"
        );
    }
    drop(sidecars);
    drop(pods);
}
