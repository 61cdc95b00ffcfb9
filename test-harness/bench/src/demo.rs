//! `bench demo`: the mixed-GPU scenario under round robin, then under the filter, side by side;
//! `bench demo --serve [--router NAME]`: the same stack with the named router (default the
//! filter), left running so any client (inference-perf, guidellm, vllm bench) can compare
//! routers without this repository's load generator.

use crate::report::{check_targets, Machine, Report};
use crate::runner::{
    envoy_version, run_windowed, scenario_ratios, write_outputs, RunError, Windows,
};
use crate::scenarios::{scenario, Mode};
use crate::stack::{start_gateway, start_pods, wait_snapshot, Gateway, RouterKind, Stack, MODEL};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Something could not start.
    #[error("{0}")]
    Start(String),
    /// Results could not be written.
    #[error(transparent)]
    Write(#[from] RunError),
}

/// Side-by-side table of round robin and the filter.
pub fn side_by_side(rep: &Report) -> String {
    let mut out = String::new();
    let Some(rs) = rep.scenarios.get("mixed_gpu") else {
        return "no results\n".into();
    };
    let (Some(rr), Some(f)) = (rs.get("round_robin"), rs.get("filter")) else {
        return "missing a router's results\n".into();
    };
    let _ = writeln!(
        out,
        "| mixed_gpu (2 H100 + 2 A10G) | round robin | filter | filter / RR |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    let rows: [(&str, f64, f64); 7] = [
        ("TTFT p50 (ms)", rr.ttft_p50_ms, f.ttft_p50_ms),
        ("TTFT p95 (ms)", rr.ttft_p95_ms, f.ttft_p95_ms),
        ("TTFT p99 (ms)", rr.ttft_p99_ms, f.ttft_p99_ms),
        ("e2e p95 (ms)", rr.e2e_p95_ms, f.e2e_p95_ms),
        ("requests/s", rr.throughput_rps, f.throughput_rps),
        (
            "output tokens/s",
            rr.output_tokens_per_s,
            f.output_tokens_per_s,
        ),
        ("errors", rr.errors as f64, f.errors as f64),
    ];
    for (name, a, b) in rows {
        let ratio = if a > 0.0 {
            format!("{:.2}×", b / a)
        } else {
            "–".into()
        };
        let _ = writeln!(out, "| {name} | {a:.1} | {b:.1} | {ratio} |");
    }
    let share = |s: &crate::stats::Summary| {
        s.pod_share
            .iter()
            .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "\nPod share, round robin: {}", share(rr));
    let _ = writeln!(out, "Pod share, filter:      {}", share(f));
    let _ = writeln!(
        out,
        "(errors = requests still waiting when the run was cut, 30 s after the last arrival)"
    );
    out
}

/// Run the demo comparison (about a minute per router) and write `demo.*` into `out`.
pub async fn run_demo(out: &Path, seed: u64) -> Result<Report, DemoError> {
    let mode = Mode {
        quick: false,
        speedup: 1.0,
        seed,
    };
    let mut sc =
        scenario("mixed_gpu", mode).ok_or_else(|| DemoError::Start("no mixed_gpu".into()))?;
    sc.workload.horizon = Duration::from_secs(30);
    sc.drain = Duration::from_secs(30);
    let mut rep = Report {
        machine: Machine::detect(
            envoy_version(),
            "demo: mixed_gpu, 30 s of arrivals per router".into(),
        ),
        mode: "demo".into(),
        protocol: "Demo: one seed, no warm-up (cold pods), the whole 30 s of arrivals is the window; intervals are within-run only (paired request bootstrap) and understate run-to-run variance.".into(),
        seeds: vec![seed],
        ..Report::default()
    };
    let mut runs = std::collections::BTreeMap::new();
    for r in [RouterKind::RoundRobin, RouterKind::Filter] {
        eprintln!(
            "demo: mixed GPU fleet (2 H100 + 2 A10G) under {} for ~30 s ...",
            r.name()
        );
        let o = run_windowed(&sc, r, Windows::whole(&sc))
            .await
            .map_err(DemoError::Start)?;
        rep.scenarios
            .entry("mixed_gpu".into())
            .or_default()
            .insert(r.name().into(), o.summary.clone());
        runs.insert(r.name(), vec![o]);
    }
    // One seed: the intervals are within-run only (the report's protocol line says so).
    rep.ratios = scenario_ratios("mixed_gpu", &runs, 500, None);
    rep.targets = check_targets(&rep.scenarios, &rep.ratios);
    write_outputs(&rep, out, "demo")?;
    Ok(rep)
}

/// Start the demo stack with `router` and keep it until Ctrl-C or SIGTERM.
pub async fn serve(port: u16, router: RouterKind) -> Result<(), DemoError> {
    let mode = Mode {
        quick: false,
        speedup: 1.0,
        seed: 42,
    };
    let sc = scenario("mixed_gpu", mode).ok_or_else(|| DemoError::Start("no mixed_gpu".into()))?;
    let pods = start_pods(&sc.fleet, &sc.adapters)
        .await
        .map_err(|e| DemoError::Start(e.to_string()))?;
    let listen = if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
        port
    } else {
        0
    };
    let gateway = start_gateway(
        router,
        &sc.fleet,
        &pods.addrs,
        &sc.adapters,
        &sc.filter_config,
        Some(listen),
    )
    .await
    .map_err(|e| DemoError::Start(e.to_string()))?;
    let stack = Stack {
        router,
        pods,
        gateway,
        replicas: vec![],
        hub: None,
    };
    if router.uses_filter() {
        if let Err(e) = wait_snapshot(&stack, Duration::from_secs(15)).await {
            eprintln!(
                "demo: warning: {e} (the filter falls back until the first snapshot arrives)"
            );
        }
    }
    let l = stack.gateway.listen_addr();
    let what = match (&stack.gateway, router.peer()) {
        (Gateway::Peer(_), Some((kind, policy))) => format!(
            "{} {} (policy {policy}, its documented defaults; no Envoy, no sidecar)",
            kind.package(),
            kind.version()
        ),
        _ if router.uses_filter() => "Envoy (the filter, fed by the sidecar)".to_string(),
        _ => "Envoy (plain)".to_string(),
    };
    println!(
        "wasm-llm-router demo is running: router `{}`: {what} + 4 emulated pods.",
        router.name()
    );
    println!("  OpenAI base URL: http://{l}/v1");
    println!("  model:           {MODEL}");
    println!(
        "  pods:            {} (2 h100, 2 a10g)",
        stack
            .pods
            .addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    match &stack.gateway {
        Gateway::Envoy { envoy, .. } => {
            println!("  Envoy admin:     http://{}/", envoy.admin_addr);
            if router.uses_filter() {
                println!(
                    "  router state:    curl http://{}/__llm_router/state   (internal listener, loopback)",
                    envoy.push_addr()
                );
            }
        }
        Gateway::Peer(p) => {
            println!("  router metrics:  http://{}/metrics", p.prometheus_addr);
            println!("  router log:      {}", p.log_path().display());
        }
    }
    println!("  try: curl http://{l}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\"max_tokens\":16}}'");
    println!("Ctrl-C or SIGTERM stops everything.");
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    eprintln!("demo: stopping the gateway and the pods ...");
    stack.stop();
    Ok(())
}
