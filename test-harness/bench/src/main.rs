//! `bench`: the benchmark (`bench run [--quick]`) and the demo (`bench demo [--serve]`).
//!
//! `./build.sh bench [--quick]` and `./build.sh demo [--serve]` call this binary.

use bench::report::markdown;
use bench::runner::{run_bench, BenchConfig};
use bench::scenarios::Mode;
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
    Run {
        /// CI-sized: every scenario in a few minutes.
        #[arg(long)]
        quick: bool,
        /// Only these scenarios (repeatable): mixed_gpu bursty shared_prefix lora uniform long_prompt.
        #[arg(long = "scenario")]
        scenarios: Vec<String>,
        /// Only these routers (repeatable): round_robin least_request filter filter_gaie_weights.
        #[arg(long = "router")]
        routers: Vec<String>,
        /// Emulator speed-up (rates scale with it).
        #[arg(long, default_value_t = 1.0)]
        speedup: f64,
        /// Workload seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Skip the overhead bench.
        #[arg(long)]
        no_overhead: bool,
    },
    /// Saturation throughput of one pod (closed loop, no Envoy), to set scenario load levels.
    Calibrate {
        /// GPU profile: h100 or a10g.
        #[arg(long, default_value = "a10g")]
        profile: String,
        /// Prompt tokens, min and max.
        #[arg(long, num_args = 2, default_values_t = [200u32, 1000])]
        prompt: Vec<u32>,
        /// max_tokens, min and max.
        #[arg(long, num_args = 2, default_values_t = [50u32, 200])]
        max_tokens: Vec<u32>,
        /// Concurrent clients (repeatable).
        #[arg(long, default_values_t = [8usize, 32, 128])]
        concurrency: Vec<usize>,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 20)]
        secs: u64,
        /// Measure one pod of each profile of this scenario on its own requests instead.
        #[arg(long)]
        scenario: Option<String>,
    },
    /// Only the overhead bench (same Envoy with and without the filter, instant backend).
    Overhead {
        /// Sequential requests per arm (2 KB; the 200 KB case uses a quarter).
        #[arg(long, default_value_t = 1000)]
        requests: usize,
    },
    /// Measure the sidecar's CPU scraping 100 metrics-only pods every 50 ms.
    SidecarCost {
        /// Pods.
        #[arg(long, default_value_t = 100)]
        pods: usize,
        /// Window, seconds.
        #[arg(long, default_value_t = 10)]
        secs: u64,
    },
    /// Mixed-GPU fleet under round robin, then under the filter, side by side.
    Demo {
        /// Start the stack with the filter and keep it running until Ctrl-C / SIGTERM.
        #[arg(long)]
        serve: bool,
        /// Listener port for --serve (a free one if taken).
        #[arg(long, default_value_t = 10000)]
        port: u16,
    },
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
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Run {
                quick,
                scenarios,
                routers,
                speedup,
                seed,
                no_overhead,
            } => {
                let partial = !scenarios.is_empty() || !routers.is_empty();
                let cfg = BenchConfig {
                    mode: Mode {
                        quick,
                        speedup,
                        seed,
                    },
                    scenarios,
                    routers,
                    overhead: !no_overhead && !partial,
                    out_dir: out_dir.clone(),
                };
                let stem = match (quick, partial) {
                    (true, false) => "quick",
                    (false, false) => "latest",
                    (true, true) => "quick-partial",
                    (false, true) => "latest-partial",
                };
                match run_bench(&cfg, stem).await {
                    Ok(rep) => {
                        println!("{}", markdown(&rep));
                        println!(
                            "Results: {0}/{stem}.json, {0}/{stem}.md, chart {0}/{stem}-ttft.png",
                            out_dir.display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Calibrate {
                profile,
                prompt,
                max_tokens,
                concurrency,
                secs,
                scenario,
            } => {
                if let Some(name) = scenario {
                    for c in concurrency {
                        match bench::calibrate::scenario_capacity(&name, c, secs).await {
                            Ok(caps) => {
                                for cap in caps {
                                    println!("{}", serde_json::to_string(&cap).unwrap_or_default())
                                }
                            }
                            Err(e) => {
                                eprintln!("calibrate: {e}");
                                return ExitCode::FAILURE;
                            }
                        }
                    }
                    return ExitCode::SUCCESS;
                }
                let profile: &'static str = if profile == "h100" { "h100" } else { "a10g" };
                let r = |v: &[u32]| bench::workload::Range::new(v[0], v[v.len() - 1]);
                for c in concurrency {
                    match bench::calibrate::capacity(profile, r(&prompt), r(&max_tokens), c, secs)
                        .await
                    {
                        Ok(cap) => println!("{}", serde_json::to_string(&cap).unwrap_or_default()),
                        Err(e) => {
                            eprintln!("calibrate: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
                ExitCode::SUCCESS
            }
            Cmd::Overhead { requests } => {
                let opts = bench::overhead::OverheadOptions {
                    latency_requests: requests,
                    rps_duration: std::time::Duration::from_secs(3),
                    concurrency: 16,
                };
                match bench::overhead::run(opts).await {
                    Ok((cases, snapshot)) => {
                        println!("filter had a snapshot: {snapshot}");
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&cases).unwrap_or_default()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::SidecarCost { pods, secs } => {
                match bench::sidecar_cost::measure(pods, std::time::Duration::from_secs(secs)).await
                {
                    Ok(c) => {
                        println!("{}", serde_json::to_string_pretty(&c).unwrap_or_default());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Demo { serve, port } => {
                if serve {
                    match bench::demo::serve(port).await {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => {
                            eprintln!("demo: {e}");
                            ExitCode::FAILURE
                        }
                    }
                } else {
                    match bench::demo::run_demo(&out_dir, 42).await {
                        Ok(rep) => {
                            println!("{}", bench::demo::side_by_side(&rep));
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
        }
    })
}
