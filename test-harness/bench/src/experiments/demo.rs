//! `bench demo`: the mixed-GPU scenario under round robin, then under the field's router (SMG,
//! SGLang's gateway, with its default policy) and then under the filter, side by side;
//! `bench demo --serve [--router NAME]`: the same stack with the named router (default the
//! filter), left running so any client (inference-perf, guidellm, vllm bench) can compare
//! routers without this repository's load generator.

use crate::analysis::stats::Summary;
use crate::experiments::runner::{
    envoy_version, run_windowed, scenario_ratios, write_outputs, RunError, Windows,
};
use crate::experiments::scenarios::{scenario, Mode};
use crate::report::verdicts::check_targets;
use crate::report::{Machine, Report};
use crate::stack::fleet::MODEL;
use crate::stack::{start_gateway, start_pods, wait_snapshot, Gateway, RouterKind, Stack};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// The field's router the demo shows beside round robin and the filter: SMG 1.13's
/// `cache_aware`, its default policy, and the best of SMG's four policies on the mixed fleet in
/// `test-harness/bench/results/field-v1.md`.
pub const DEMO_PEER: RouterKind = RouterKind::SmgCacheAware;

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

/// Side-by-side table of round robin, the field's router (when it ran) and the filter.
pub fn side_by_side(rep: &Report) -> String {
    let mut out = String::new();
    let Some(rs) = rep.scenarios.get("mixed_gpu") else {
        return "no results\n".into();
    };
    let (Some(rr), Some(f)) = (rs.get("round_robin"), rs.get("filter")) else {
        return "missing a router's results\n".into();
    };
    let peer = rs.get(DEMO_PEER.name());
    let cols: Vec<(&str, &Summary)> = std::iter::once(("round robin", rr))
        .chain(peer.map(|p| (DEMO_PEER.name(), p)))
        .chain(std::iter::once(("filter", f)))
        .collect();
    let _ = write!(out, "| mixed_gpu (2 H100 + 2 A10G) |");
    for (name, _) in &cols {
        let _ = write!(out, " {name} |");
    }
    let _ = write!(out, " filter / RR |");
    if peer.is_some() {
        let _ = write!(out, " filter / {} |", DEMO_PEER.name());
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "|---|{}",
        "---|".repeat(cols.len() + 1 + usize::from(peer.is_some()))
    );
    type Row = (&'static str, fn(&Summary) -> f64);
    let rows: [Row; 7] = [
        ("TTFT p50 (ms)", |s| s.ttft_p50_ms),
        ("TTFT p95 (ms)", |s| s.ttft_p95_ms),
        ("TTFT p99 (ms)", |s| s.ttft_p99_ms),
        ("e2e p95 (ms)", |s| s.e2e_p95_ms),
        ("requests/s", |s| s.throughput_rps),
        ("output tokens/s", |s| s.output_tokens_per_s),
        ("errors", |s| s.errors as f64),
    ];
    let ratio = |a: f64, b: f64| {
        if a > 0.0 {
            format!("{:.2}×", b / a)
        } else {
            "–".into()
        }
    };
    for (name, get) in rows {
        let _ = write!(out, "| {name} |");
        for (_, s) in &cols {
            let _ = write!(out, " {:.1} |", get(s));
        }
        let _ = write!(out, " {} |", ratio(get(rr), get(f)));
        if let Some(p) = peer {
            let _ = write!(out, " {} |", ratio(get(p), get(f)));
        }
        let _ = writeln!(out);
    }
    let share = |s: &Summary| {
        s.pod_share
            .iter()
            .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out);
    for (name, s) in &cols {
        let _ = writeln!(out, "Pod share, {name:<16} {}", share(s));
    }
    let _ = writeln!(
        out,
        "(errors = requests still waiting when the run was cut, 30 s after the last arrival)"
    );
    out
}

/// Run the demo comparison (about a minute per router) and write `demo.*` into `out`. The
/// field's router is skipped with a note when it is not installed (`./build.sh setup`).
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
        protocol: "Demo: one seed, no warm-up (cold pods), the whole 30 s of arrivals is the window; one seed gives no interval: the ratios are a direction, not a verdict (the bench's results are).".into(),
        seeds: vec![seed],
        ..Report::default()
    };
    let mut runs = std::collections::BTreeMap::new();
    for r in [RouterKind::RoundRobin, DEMO_PEER, RouterKind::Filter] {
        if let Some((kind, _)) = r.peer() {
            if let Err(e) = kind.program() {
                eprintln!("demo: skipping {}: {e}", r.name());
                continue;
            }
        }
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
    if let Some(x) = rep.scenarios.get_mut("mixed_gpu") {
        x.best_other = crate::report::best_other(x, "ttft_p95_ms");
    }
    rep.ratios = scenario_ratios("mixed_gpu", &runs);
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

/// `bench demo`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// Start the stack with the filter and keep it running until Ctrl-C / SIGTERM.
    #[arg(long)]
    serve: bool,
    /// Listener port for --serve (a free one if taken).
    #[arg(long, default_value_t = 10000)]
    port: u16,
    /// Router for --serve: round_robin, least_request, least_request_full, weighted_rr,
    /// filter (default), filter_gaie_weights, or a peer: smg_cache_aware, smg_least_load,
    /// smg_power_of_two, smg_prefix_hash, vllm_router_cache_aware, vllm_router_power_of_two.
    #[arg(long, default_value = "filter")]
    router: String,
}

/// `bench demo`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        serve,
        port,
        router,
    } = args;
    if serve {
        let Some(router) = crate::stack::RouterKind::from_name(&router) else {
            eprintln!(
                "demo: unknown router {router:?} (known: {})",
                crate::stack::RouterKind::names().join(", ")
            );
            return ExitCode::FAILURE;
        };
        if router.replicas() > 1 {
            eprintln!(
                "demo: {} runs several gateways; --serve starts one",
                router.name()
            );
            return ExitCode::FAILURE;
        }
        match self::serve(port, router).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo: {e}");
                ExitCode::FAILURE
            }
        }
    } else {
        match run_demo(out_dir, 42).await {
            Ok(rep) => {
                println!("{}", side_by_side(&rep));
                println!(
                    "Chart: {0}/demo-ttft.png   Full report: {0}/demo.md",
                    out_dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("demo: {e}");
                ExitCode::FAILURE
            }
        }
    }
}
