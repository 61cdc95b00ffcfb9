//! `bench`: the benchmark (`bench run [--quick]`), the demo (`bench demo [--serve]`), the
//! soak (`bench soak [--full]`) and the scale bench (`bench scale`).
//!
//! `./build.sh bench [--quick]`, `./build.sh demo [--serve]` and `./build.sh soak [--full]` call
//! this binary. Each subcommand's arguments and what it does live with its experiment
//! (`experiments/<name>.rs`: `Args`, `run_cli`); this file only dispatches.

use bench::{experiments, report};
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "bench", about = "wasm-llm-router benchmark and demo")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the scenarios under every router and write target/bench/{quick,latest}.{json,md} and a chart.
    #[command(alias = "bench")]
    Run(experiments::runner::Args),
    /// Saturation throughput of one pod (closed loop, no Envoy), to set scenario load levels.
    Calibrate(experiments::calibrate::Args),
    /// Only the overhead bench: direct, Envoy, Envoy + filter, Envoy + a no-op ext_proc (the
    /// picker floor) in front of an instant backend; prints the per-arm table (stderr), whether
    /// the filter had a snapshot and the plain-vs-filter cases (JSON, stdout).
    Overhead(experiments::overhead::Args),
    /// Measure the sidecar's CPU scraping 100 metrics-only pods every 50 ms.
    SidecarCost(experiments::sidecar_cost::Args),
    /// The scale bench: synthetic fleets of 4 to 4,096 pods over 1 to 200 pools with 0 or 1,000
    /// adapters; per size the decision time under wasmtime (and, with the Envoy part, in Envoy),
    /// Envoy CPU per request and req/s against plain Envoy, snapshot bytes, push-to-visible,
    /// filter memory, the prefix index, the sidecar's CPU and memory. Writes scale.json,
    /// scale.md and one SVG chart per measure (`./build.sh bench scale`).
    Scale(experiments::scale::Args),
    /// Draw the dashboard's main panels from the series the Prometheus end-to-end test wrote.
    DashboardChart(report::dashboard_chart::Args),
    /// Soak: mixed requests through the full stack while a pod is killed and the sidecar
    /// restarted; exits non-zero unless nothing was lost, nothing hung and memory held.
    Soak(experiments::soak::Args),
    /// The flow-control scenarios (priority bands, two tenants, 1.5x overload, a 90/10
    /// canary) under round robin, the filter and the best peer; writes
    /// target/bench/flow.{json,md} and exits non-zero when a run failed (not when a target is
    /// missed: the report says which).
    Flow(experiments::flowbench::Args),
    /// Mixed-GPU fleet under round robin, SMG (cache_aware) and the filter, side by side.
    Demo(experiments::demo::Args),
    /// A load sweep from the reports of `bench run --load F`: TTFT p50 and p95 against the
    /// load, one line per router, per scenario (SVG), and the table (Markdown).
    LoadChart(report::load_chart::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out_dir = testkit::target_dir().join("bench");
    let code = rt.block_on(async move {
        match cli.cmd {
            Cmd::Run(a) => experiments::runner::run_cli(a, &out_dir).await,
            Cmd::Calibrate(a) => experiments::calibrate::run_cli(a, &out_dir).await,
            Cmd::Overhead(a) => experiments::overhead::run_cli(a, &out_dir).await,
            Cmd::SidecarCost(a) => experiments::sidecar_cost::run_cli(a, &out_dir).await,
            Cmd::Scale(a) => experiments::scale::run_cli(a, &out_dir).await,
            Cmd::DashboardChart(a) => report::dashboard_chart::run_cli(a, &out_dir).await,
            Cmd::Soak(a) => experiments::soak::run_cli(a, &out_dir).await,
            Cmd::Flow(a) => experiments::flowbench::run_cli(a, &out_dir).await,
            Cmd::Demo(a) => experiments::demo::run_cli(a, &out_dir).await,
            Cmd::LoadChart(a) => report::load_chart::run_cli(a, &out_dir).await,
        }
    });
    // Real vLLM pods outlive the runs that share them; stop them before exiting.
    bench::stack::realpods::release();
    code
}
