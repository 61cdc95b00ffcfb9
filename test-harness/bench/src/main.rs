//! `bench`: the benchmark (`bench run [--quick]`), the demo (`bench demo [--serve]`), the
//! soak (`bench soak [--full]`) and the scale bench (`bench scale`).
//!
//! `./build.sh bench [--quick]`, `./build.sh demo [--serve]` and `./build.sh soak [--full]` call
//! this binary.

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
        /// Only these routers (repeatable): round_robin least_request least_request_full
        /// weighted_rr filter (default set), filter_gaie_weights, filter_x2, filter_x4 and filter_x2_nohub (extras: gateway replicas with a metrics hub, and two without), and
        /// the field's routers smg_cache_aware smg_least_load smg_power_of_two smg_prefix_hash
        /// vllm_router_cache_aware vllm_router_power_of_two (run by default; `./build.sh setup`
        /// installs them).
        #[arg(long = "router")]
        routers: Vec<String>,
        /// Emulator speed-up (rates and windows scale with it). Default: the scenarios'
        /// QUICK_SPEEDUP / FULL_SPEEDUP.
        #[arg(long)]
        speedup: Option<f64>,
        /// First workload seed (seeds are SEED, SEED+1, ...).
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Seeds per (scenario, router). Default: 1 quick, 10 full (a verdict needs ten: confidence.rs).
        #[arg(long)]
        seeds: Option<usize>,
        /// Goodput sweep for these scenarios (repeatable). Default: none quick; mixed_gpu full.
        #[arg(long = "sweep")]
        sweep: Vec<String>,
        /// No goodput sweep at all.
        #[arg(long, conflicts_with = "sweep")]
        no_sweep: bool,
        /// Print the run plan and its estimated duration, run nothing.
        #[arg(long)]
        plan: bool,
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
        /// Fit model-sim's step-time terms to one pod of this profile instead (`cpu-small`,
        /// `cpu-large`; prefill and decode probes, least squares; CALIBRATION.md): prints the
        /// fit as JSON and writes it to <target>/bench/fit-<profile>-<engine>.json.
        #[arg(long)]
        fit: Option<String>,
        /// The pod `--fit` probes: `vllm` (the real engine, `./build.sh setup-vllm`) or
        /// `model-sim` (the emulator's profile of that name, to check the fit); with
        /// `--scenario` on a real scenario, `model-sim` measures its pods' twins.
        #[arg(long, default_value = "vllm")]
        engine: String,
        /// Rounds of `--fit`'s probes (each probe's median over the rounds is fitted).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Run this real-vLLM scenario's workload under round robin on its real pods and on
        /// their model-sim twins at each `--loads` fraction of its capacity, and compare TTFT
        /// p50/p95 (CALIBRATION.md); writes <target>/bench/twin-<scenario>.json.
        #[arg(long)]
        compare: Option<String>,
        /// Loads of `--compare`, fractions of the fleet's measured capacity.
        #[arg(long, value_delimiter = ',', default_values_t = [0.3, 0.6, 0.9])]
        loads: Vec<f64>,
    },
    /// Only the overhead bench: direct, Envoy, Envoy + filter, Envoy + a no-op ext_proc (the
    /// picker floor) in front of an instant backend; prints the per-arm table (stderr), whether
    /// the filter had a snapshot and the plain-vs-filter cases (JSON, stdout).
    Overhead {
        /// Sequential requests per arm (prompts up to 16 KiB; larger ones use a quarter).
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// Arms to run, comma-separated (direct, envoy, envoy_filter, envoy_ext_proc, smg,
        /// vllm_router);
        /// default all. direct always runs (the baseline).
        #[arg(long, value_delimiter = ',')]
        arms: Vec<String>,
        /// Prompt sizes, bytes, comma-separated; default 200,2048,16384,204800.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Also write everything measured (cases, every arm, notes) to this JSON file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Closed-loop (maximum req/s) seconds per arm and size; 0 skips the closed loop, so
        /// only the sequential phase (latency, CPU per request) runs and nothing saturates.
        #[arg(long, default_value_t = 3.0)]
        rps_secs: f64,
        /// Send the requests to a path the filter does not route: its arm then measures the
        /// Wasm mechanism's floor (callbacks only, no buffering, no decision).
        #[arg(long)]
        pass_through: bool,
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
    /// The scale bench: synthetic fleets of 4 to 4,096 pods over 1 to 200 pools with 0 or 1,000
    /// adapters; per size the decision time under wasmtime (and, with the Envoy part, in Envoy),
    /// Envoy CPU per request and req/s against plain Envoy, snapshot bytes, push-to-visible,
    /// filter memory, the prefix index, the sidecar's CPU and memory. Writes scale.json,
    /// scale.md and one SVG chart per measure (`./build.sh bench scale`).
    Scale {
        /// Pod counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = bench::scale::PODS)]
        pods: Vec<usize>,
        /// Pool counts (pods spread over them; sizes with fewer pods than pools are skipped).
        #[arg(long, value_delimiter = ',', default_values_t = bench::scale::POOLS)]
        pools: Vec<usize>,
        /// Adapter counts (spread over the pools).
        #[arg(long, value_delimiter = ',', default_values_t = bench::scale::ADAPTERS)]
        adapters: Vec<usize>,
        /// Timed wasmtime requests per body size (2 KB, 20 KB).
        #[arg(long, default_value_t = 1000)]
        wasm_requests: usize,
        /// Distinct prompts sent before the prefix index's size is read.
        #[arg(long, default_value_t = 2000)]
        prefix_prompts: usize,
        /// Only the wasmtime part (no Envoy, no sidecar).
        #[arg(long)]
        wasm_only: bool,
        /// Skip the sidecar part.
        #[arg(long)]
        no_sidecar: bool,
        /// Sequential Envoy requests per arm (a quarter above 1,000 pods).
        #[arg(long, default_value_t = 400)]
        envoy_requests: usize,
        /// Closed-loop seconds per arm (0: no req/s, no closed-loop CPU).
        #[arg(long, default_value_t = 2.0)]
        rps_secs: f64,
        /// Pushes timed per fleet (push to visible).
        #[arg(long, default_value_t = 5)]
        pushes: usize,
        /// Sidecar window, seconds.
        #[arg(long, default_value_t = 10)]
        sidecar_secs: u64,
        /// Output directory (default: test-harness/bench/results in the repository).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Draw the dashboard's main panels from the series the Prometheus end-to-end test wrote.
    DashboardChart {
        /// The e2e test's output (default: <target>/observability/dashboard-run.json).
        #[arg(long)]
        input: Option<std::path::PathBuf>,
        /// The PNG to write (default: test-harness/bench/results/dashboard.png in the repository).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Soak: mixed requests through the full stack while a pod is killed and the sidecar
    /// restarted; exits non-zero unless nothing was lost, nothing hung and memory held.
    Soak {
        /// The full size (10,000 requests) instead of the CI size (1,500).
        #[arg(long)]
        full: bool,
        /// Requests (overrides the size).
        #[arg(long)]
        requests: Option<usize>,
        /// Workload seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The flow-control scenarios (priority bands, two tenants, 1.5x overload, a 90/10
    /// canary) under round robin, the filter and the best peer; writes
    /// target/bench/flow.{json,md} and exits non-zero when a run failed (not when a target is
    /// missed: the report says which).
    Flow {
        /// CI-sized windows (speed-up 4) instead of the full protocol (speed-up 3).
        #[arg(long)]
        quick: bool,
        /// Only these experiments (repeatable): bands tenants overload canary; overload_vllm
        /// (real vLLM pods, `./build.sh setup-vllm`) runs only when named.
        #[arg(long = "experiment")]
        experiments: Vec<String>,
        /// First workload seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Seeds per arm. Default: 1 quick, 3 full.
        #[arg(long)]
        seeds: Option<usize>,
        /// Leave out the peer router (SMG cache_aware).
        #[arg(long)]
        no_peers: bool,
        /// Only these routers' arms (repeatable), e.g. `--router filter`; a target that
        /// compares with a router left out is not judged.
        #[arg(long = "router")]
        routers: Vec<String>,
        /// In the overload experiments, every client request states the TTFT SLO it is judged
        /// by (`x-slo-ttft-ms`, llm-d's header; only the filter reads it).
        #[arg(long)]
        slo_header: bool,
    },
    /// Mixed-GPU fleet under round robin, SMG (cache_aware) and the filter, side by side.
    Demo {
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
    let code = rt.block_on(async move {
        match cli.cmd {
            Cmd::Run {
                quick,
                scenarios,
                routers,
                speedup,
                seed,
                seeds,
                sweep,
                no_sweep,
                plan,
                no_overhead,
            } => {
                let partial = !scenarios.is_empty() || !routers.is_empty();
                let mode = Mode {
                    quick,
                    speedup: speedup.unwrap_or(if quick {
                        bench::scenarios::QUICK_SPEEDUP
                    } else {
                        bench::scenarios::FULL_SPEEDUP
                    }),
                    seed,
                };
                let mut cfg = BenchConfig::defaults(mode, out_dir.clone());
                cfg.seeds = seeds.unwrap_or(cfg.seeds);
                if no_sweep {
                    cfg.sweep.clear();
                } else if !sweep.is_empty() {
                    cfg.sweep = sweep;
                }
                if !scenarios.is_empty() {
                    cfg.sweep.retain(|s| scenarios.contains(s));
                }
                cfg.scenarios = scenarios;
                cfg.routers = routers;
                cfg.overhead = !no_overhead && !partial;
                if plan {
                    return match bench::runner::select(&cfg) {
                        Ok((scs, routers)) => {
                            println!(
                                "{}",
                                bench::runner::plan(&cfg, &scs, &routers, cfg.seeds.max(1))
                            );
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("bench: {e}");
                            ExitCode::FAILURE
                        }
                    };
                }
                // A real pod's speed is this machine's: measure it first where not yet done.
                let names: Vec<&str> = cfg.scenarios.iter().map(String::as_str).collect();
                if let Err(e) = bench::calibrate::ensure_real_capacities(&names).await {
                    eprintln!("bench: measuring real-pod capacities: {e}");
                    return ExitCode::FAILURE;
                }
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
                fit,
                engine,
                rounds,
                compare,
                loads,
            } => {
                if let Some(name) = compare {
                    return match bench::calibrate::compare_twin(&name, &loads, 42).await {
                        Ok(points) => {
                            let json = serde_json::to_string_pretty(&points).unwrap_or_default();
                            println!("{json}");
                            let path = out_dir.join(format!("twin-{name}.json"));
                            let _ = std::fs::create_dir_all(&out_dir);
                            if let Err(e) = std::fs::write(&path, json) {
                                eprintln!("calibrate: writing {}: {e}", path.display());
                            }
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("calibrate: {e}");
                            ExitCode::FAILURE
                        }
                    };
                }
                if let Some(profile) = fit {
                    let engine = match engine.as_str() {
                        "vllm" => bench::fleet::PodEngine::Vllm,
                        "model-sim" => bench::fleet::PodEngine::ModelSim,
                        other => {
                            eprintln!("calibrate: --engine {other}: vllm or model-sim");
                            return ExitCode::FAILURE;
                        }
                    };
                    let Some(profile) = bench::realpods::TWIN_PROFILES
                        .iter()
                        .copied()
                        .find(|p| *p == profile)
                    else {
                        eprintln!(
                            "calibrate: --fit {profile}: one of {:?}",
                            bench::realpods::TWIN_PROFILES
                        );
                        return ExitCode::FAILURE;
                    };
                    let r = bench::calibrate::fit(profile, engine, rounds).await;
                    bench::realpods::release();
                    return match r {
                        Ok(f) => {
                            let json = serde_json::to_string_pretty(&f).unwrap_or_default();
                            println!("{json}");
                            let path = out_dir.join(format!("fit-{profile}-{}.json", f.engine));
                            let _ = std::fs::create_dir_all(&out_dir);
                            if let Err(e) = std::fs::write(&path, json) {
                                eprintln!("calibrate: writing {}: {e}", path.display());
                            }
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("calibrate: {e}");
                            ExitCode::FAILURE
                        }
                    };
                }
                if let Some(name) = scenario {
                    for c in concurrency {
                        match bench::calibrate::scenario_capacity(
                            &name,
                            c,
                            secs,
                            engine == "model-sim",
                        )
                        .await
                        {
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
            Cmd::Overhead {
                requests,
                rps_secs,
                pass_through,
                arms,
                sizes,
                json,
            } => {
                let opts = bench::overhead::OverheadOptions {
                    latency_requests: requests,
                    rps_duration: std::time::Duration::from_secs_f64(rps_secs.clamp(0.0, 600.0)),
                    concurrency: 16,
                    pass_through,
                    arms,
                    sizes,
                };
                match bench::overhead::run(opts).await {
                    Ok(o) => {
                        eprint!("{}", bench::overhead::arms_table(&o.arms));
                        for n in &o.notes {
                            eprintln!("bench: overhead: {n}");
                        }
                        if let Some(path) = json {
                            let text = serde_json::to_string_pretty(&o).unwrap_or_default();
                            if let Err(e) = std::fs::write(&path, text) {
                                eprintln!("bench: cannot write {}: {e}", path.display());
                                return ExitCode::FAILURE;
                            }
                        }
                        // Stdout as before (ablation/run.sh parses the JSON after the first '[').
                        println!("filter had a snapshot: {}", o.snapshot);
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&o.cases).unwrap_or_default()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::DashboardChart { input, out } => {
                let input = input.unwrap_or_else(|| {
                    testkit::target_dir()
                        .join("observability")
                        .join("dashboard-run.json")
                });
                let out = out.unwrap_or_else(|| {
                    testkit::workspace_root().join("test-harness/bench/results/dashboard.png")
                });
                match bench::dashboard_chart::draw_file(&input, &out) {
                    Ok(text) => {
                        if !text {
                            eprintln!("bench: no DejaVu Sans font; the chart has no text");
                        }
                        println!("Chart: {}", out.display());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Scale {
                pods,
                pools,
                adapters,
                wasm_requests,
                prefix_prompts,
                wasm_only,
                no_sidecar,
                envoy_requests,
                rps_secs,
                pushes,
                sidecar_secs,
                out,
            } => {
                let defaults = bench::scale::ScaleOptions::default();
                let opts = bench::scale::ScaleOptions {
                    pods,
                    pools,
                    adapters,
                    wasm_requests,
                    prefix_prompts,
                    envoy: !wasm_only,
                    envoy_requests,
                    rps_secs,
                    pushes,
                    sidecar: !wasm_only && !no_sidecar,
                    sidecar_secs: sidecar_secs.clamp(1, 600),
                    out_dir: out.unwrap_or(defaults.out_dir),
                    seed: defaults.seed,
                };
                match bench::scale::run(&opts).await {
                    Ok(rep) => {
                        println!("{}", bench::scale::markdown(&rep));
                        println!(
                            "Results: {0}/scale.json, {0}/scale.md, charts {0}/scale-*.svg",
                            opts.out_dir.display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench: scale: {e}");
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
            Cmd::Flow {
                quick,
                experiments,
                seed,
                seeds,
                no_peers,
                routers,
                slo_header,
            } => {
                let mode = if quick {
                    Mode::quick(seed)
                } else {
                    Mode::full(seed)
                };
                if experiments.iter().any(|e| e == "overload_vllm") {
                    // Offered 1.5× vllm_uneven's capacity: this machine's.
                    if let Err(e) = bench::calibrate::ensure_real_capacities(&["vllm_uneven"]).await
                    {
                        eprintln!("bench flow: measuring real-pod capacities: {e}");
                        return ExitCode::FAILURE;
                    }
                }
                let cfg = bench::flowbench::FlowBenchConfig {
                    mode,
                    seeds: seeds.unwrap_or(if quick { 1 } else { 3 }),
                    experiments,
                    peers: !no_peers,
                    routers,
                    slo_header,
                    out_dir: out_dir.clone(),
                };
                match bench::flowbench::run_flow(&cfg).await {
                    Ok(rep) => {
                        println!("{}", bench::flowbench::markdown(&rep));
                        eprintln!("bench flow: wrote {}/flow.{{json,md}}", out_dir.display());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("bench flow: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Soak {
                full,
                requests,
                seed,
            } => {
                let mut cfg = if full {
                    bench::soak::SoakConfig::full()
                } else {
                    bench::soak::SoakConfig::ci()
                };
                cfg.requests = requests.unwrap_or(cfg.requests);
                cfg.seed = seed;
                match bench::soak::run(&cfg).await {
                    Ok(rep) => {
                        let v = bench::soak::verdict(&rep);
                        let md = bench::soak::markdown(&rep, &v);
                        println!("{md}");
                        let _ = std::fs::create_dir_all(&out_dir);
                        let json = serde_json::to_string_pretty(&rep).unwrap_or_default();
                        let _ = std::fs::write(out_dir.join("soak.json"), json);
                        let _ = std::fs::write(out_dir.join("soak.md"), md);
                        if v.passed() {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::FAILURE
                        }
                    }
                    Err(e) => {
                        eprintln!("soak: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Demo {
                serve,
                port,
                router,
            } => {
                if serve {
                    let Some(router) = bench::stack::RouterKind::from_name(&router) else {
                        eprintln!(
                            "demo: unknown router {router:?} (known: {})",
                            bench::stack::RouterKind::names().join(", ")
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
                    match bench::demo::serve(port, router).await {
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
    });
    // Real vLLM pods outlive the runs that share them; stop them before exiting.
    bench::realpods::release();
    code
}
