//! What scraping 100 pods every 50 ms costs the sidecar, in CPU cores (goal ≤ 0.05 core; the
//! GAIE EPP anchor is ≈ 7.5 cores). Not a test: run `cargo bench -p sidecar-metrics --bench
//! scrape_cost` (env `BENCH_SECS`, default 10; `BENCH_PODS`, default 100).
//!
//! The fake fleet (100 listeners serving realistic vLLM V1 `/metrics` text, ~25 KB each, whose
//! load figures move every 100 ms so the snapshot changes and is pushed almost every round) and
//! the fake proxy run in a child process (this same binary with `--serve`), so the CPU measured
//! for this process is the sidecar's alone: one single-threaded runtime scraping, parsing,
//! building and pushing, exactly as `sidecar-metrics run` does. The baseline measured in the same
//! run is the parse-only cost of the same texts, to show where the time goes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sidecar_metrics::config::{Config, Discovery, PoolConfig, PushConfig, ScrapeConfig};
use sidecar_metrics::engines::{normalise, Options};

/// A realistic vLLM V1 exposition (names, labels and families as vLLM 0.9+ prints them).
fn vllm_text(model: &str, waiting: u32, running: u32, kv: f64, seq: u64) -> String {
    let l = format!("engine=\"0\",model_name=\"{model}\"");
    let mut o = String::with_capacity(32 * 1024);
    process_families(&mut o);
    vllm_load(&mut o, &l, waiting, running, kv);
    vllm_counters(&mut o, &l, seq);
    vllm_histograms(&mut o, &l, seq);
    vllm_info(&mut o);
    o
}

/// The Python process families every prometheus_client server prints first.
fn process_families(o: &mut String) {
    for (name, kind, v) in [
        ("python_gc_objects_collected_total{generation=\"0\"}", "counter", 12345.0),
        ("python_gc_objects_collected_total{generation=\"1\"}", "counter", 2345.0),
        ("python_gc_objects_collected_total{generation=\"2\"}", "counter", 345.0),
        ("python_info{implementation=\"CPython\",major=\"3\",minor=\"12\",patchlevel=\"3\",version=\"3.12.3\"}", "gauge", 1.0),
        ("process_virtual_memory_bytes", "gauge", 6.1e10),
        ("process_resident_memory_bytes", "gauge", 4.2e9),
        ("process_start_time_seconds", "gauge", 1.7769e9),
        ("process_cpu_seconds_total", "counter", 5123.4),
        ("process_open_fds", "gauge", 123.0),
        ("process_max_fds", "gauge", 1048576.0),
    ] {
        let base = name.split('{').next().unwrap_or(name);
        let _ = writeln!(o, "# HELP {base} Process metric.\n# TYPE {base} {kind}\n{name} {v:?}");
    }
}

/// One family of one series labelled `l`, with its HELP and TYPE lines.
fn family(o: &mut String, l: &str, name: &str, help: &str, kind: &str, v: f64) {
    let _ = writeln!(
        o,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{l}}} {v:?}"
    );
}

/// The load gauges the sidecar reads.
fn vllm_load(o: &mut String, l: &str, waiting: u32, running: u32, kv: f64) {
    family(
        o,
        l,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        "gauge",
        f64::from(running),
    );
    family(
        o,
        l,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        "gauge",
        f64::from(waiting),
    );
    family(
        o,
        l,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        "gauge",
        kv,
    );
}

/// Counters the sidecar skips, moving with `seq`.
fn vllm_counters(o: &mut String, l: &str, seq: u64) {
    for c in [
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
    ] {
        family(
            o,
            l,
            &format!("vllm:{c}_total"),
            "Counter.",
            "counter",
            (seq * 37) as f64,
        );
        family(
            o,
            l,
            &format!("vllm:{c}_created"),
            "Counter.",
            "gauge",
            1.7769301736864316e9,
        );
    }
    let _ = writeln!(o, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter");
    for r in ["stop", "length", "abort"] {
        let _ = writeln!(
            o,
            "vllm:request_success_total{{{l},finished_reason=\"{r}\"}} {:?}",
            (seq * 3) as f64
        );
    }
}

/// The latency and token histograms (most of the text's lines), skipped by the sidecar.
fn vllm_histograms(o: &mut String, l: &str, seq: u64) {
    let hist = |o: &mut String, name: &str, bounds: &[f64]| {
        let _ = writeln!(o, "# HELP {name} Histogram.\n# TYPE {name} histogram");
        let mut n = 0u64;
        for b in bounds {
            n += seq % 17 + 1;
            let _ = writeln!(o, "{name}_bucket{{{l},le=\"{b:?}\"}} {:?}", n as f64);
        }
        let _ = writeln!(o, "{name}_bucket{{{l},le=\"+Inf\"}} {:?}", n as f64);
        let _ = writeln!(o, "{name}_count{{{l}}} {:?}", n as f64);
        let _ = writeln!(o, "{name}_sum{{{l}}} {:?}", n as f64 * 0.123);
    };
    let secs = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    let toks = [
        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
    ];
    for h in [
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ] {
        hist(o, h, &secs);
    }
    for h in [
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_max_num_generation_tokens",
    ] {
        hist(o, h, &toks);
    }
}

/// The cache geometry and LoRA info families the sidecar reads last.
fn vllm_info(o: &mut String) {
    let _ = writeln!(o, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge");
    let _ = writeln!(o, "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27000\",num_gpu_blocks_override=\"None\"}} 1.0");
    let _ = writeln!(o, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge");
    let _ = writeln!(o, "vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"sql-lora\",waiting_lora_adapters=\"\"}} 1.7769301736864316e9");
}

/// What prometheus_client does with `?name[]=a&name[]=b`: only those families (by sample name).
fn restrict(text: &str, query: &str) -> String {
    let names: Vec<String> = query
        .split('&')
        .filter_map(|kv| {
            kv.strip_prefix("name%5B%5D=")
                .or_else(|| kv.strip_prefix("name[]="))
        })
        .map(|v| v.replace("%3A", ":"))
        .collect();
    if names.is_empty() {
        return text.to_owned();
    }
    let mut out = String::new();
    for line in text.lines() {
        let name = match line.strip_prefix("# ") {
            Some(c) => c.split_whitespace().nth(1).unwrap_or(""),
            None => line.split(['{', ' ']).next().unwrap_or(""),
        };
        if names.iter().any(|n| n == name) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Child mode: serve `n` pods and a push endpoint; print the ports, then run until killed.
fn serve(n: usize) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            std::process::exit(2)
        }
    };
    rt.block_on(async move {
        let mut ports = Vec::new();
        for i in 0..n {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            ports.push(l.local_addr().expect("addr").port());
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move |uri: axum::http::Uri| async move {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0);
                    // BENCH_STATIC=1: figures never move (an idle fleet: heartbeat pushes only).
                    let tick = if std::env::var_os("BENCH_STATIC").is_some() {
                        i as u64
                    } else {
                        t / 100 + i as u64
                    };
                    let text = vllm_text(
                        "meta-llama/Llama-3.1-8B-Instruct",
                        (tick % 7) as u32,
                        (tick % 11) as u32,
                        (tick % 100) as f64 / 100.0,
                        tick,
                    );
                    restrict(&text, uri.query().unwrap_or(""))
                }),
            );
            tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            });
        }
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let push_port = l.local_addr().expect("addr").port();
        let app = axum::Router::new().route(
            "/__llm_router/snapshot",
            axum::routing::post(|body: axum::body::Bytes| async move {
                match llm_router_snapshot::Snapshot::decode(&body) {
                    Ok(s) => (
                        axum::http::StatusCode::OK,
                        format!("{{\"accepted\":true,\"generation\":{}}}", s.generation),
                    ),
                    Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()),
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        let list: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
        println!("{push_port} {}", list.join(","));
        std::future::pending::<()>().await;
    });
}

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the ")" of the command name: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime is field 14 → index 11 after the state field (index 0 = field 3).
    (ticks(11) + ticks(12)) / clk_tck()
}

/// Context switches (voluntary + involuntary) of this process so far (all threads).
fn ctx_switches() -> u64 {
    let mut total = 0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            for line in status.lines() {
                if let Some(v) = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    total += v.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    total
}

fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Phase {
    cpu: f64,
    wall: f64,
    rounds: u64,
    pushes: u64,
    pods_ok: usize,
    last_push: &'static str,
    switches: u64,
}

/// Runs the sidecar against the fleet for `secs` (after a 2 s warm-up) and measures its CPU.
fn phase(endpoints: &[String], push: SocketAddr, secs: u64, name_filter: bool) -> Phase {
    let cfg = Config {
        push: PushConfig {
            address: push.to_string(),
            path: "/__llm_router/snapshot".into(),
            tally_path: "/__llm_router/tally".into(),
            secret: Some("bench-secret-0123456789abcdef-0123456789".into()),
            secret_env: None,
            secret_file: None,
            timeout_ms: 1000,
        },
        scrape: ScrapeConfig {
            interval_ms: 50,
            name_filter,
            ..Default::default()
        },
        heartbeat_ms: 1000,
        pod_stale_after_ms: 1000,
        mode: Default::default(),
        hub: Default::default(),
        listen: "127.0.0.1:0".into(),
        log: Default::default(),
        snapshot: Default::default(),
        rewrites: None,
        objectives: None,
        path: None,
        pools: vec![PoolConfig {
            name: "llama".into(),
            cluster: "pool_llama".into(),
            models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
            engine: Some("vllm".into()),
            metrics_path: None,
            discovery: Discovery::Static(endpoints.to_vec()),
        }],
    };
    cfg.validate().expect("valid config");
    // The sidecar's own runtime: single-threaded, as in `sidecar-metrics run`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let running = sidecar_metrics::sidecar::start(cfg, "bench".into())
            .await
            .expect("start");
        tokio::time::sleep(Duration::from_secs(2)).await; // warm-up: connections open
        let s0 = running.stats.summary();
        let c0 = cpu_seconds();
        let x0 = ctx_switches();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let cpu = cpu_seconds() - c0;
        let switches = ctx_switches() - x0;
        let wall = t0.elapsed().as_secs_f64();
        let s1 = running.stats.summary();
        running.stop().await;
        Phase {
            cpu,
            wall,
            rounds: s1.rounds - s0.rounds,
            pushes: s1.pushes.values().sum::<u64>() - s0.pushes.values().sum::<u64>(),
            pods_ok: s1.pods_ok,
            last_push: s1.last_push_result,
            switches,
        }
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        let n = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(100);
        serve(n);
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let secs: u64 = env_or("BENCH_SECS", 10);
    let pods: usize = env_or("BENCH_PODS", 100);
    let (_child, endpoints, push) = start_fleet(pods);

    let text = vllm_text("meta-llama/Llama-3.1-8B-Instruct", 3, 5, 0.5, 7);
    let small = restrict(
        &text,
        &sidecar_metrics::engines::name_filter_query(Some(llm_router_snapshot::Engine::Vllm)),
    );
    println!("scrape_cost: {pods} pods, interval 50 ms (jitter 10%), {secs} s per phase after 2 s warm-up");
    println!(
        "  /metrics text per pod: {} bytes full, {} bytes with name[] filter",
        text.len(),
        small.len()
    );
    let mut json = Vec::new();
    // BENCH_PHASES=full|filter runs one phase only (e.g. under a profiler).
    let only = std::env::var("BENCH_PHASES").unwrap_or_default();
    for (label, filter, body) in [
        ("full text (server ignores name[])", false, &text),
        ("name[] filter (prometheus_client servers)", true, &small),
    ] {
        if (only == "full" && filter) || (only == "filter" && !filter) {
            continue;
        }
        let p = phase(&endpoints, push, secs, filter);
        let scrapes = p.rounds as f64 * pods as f64;
        // Baseline in the same run: reading the same text alone, as many times.
        let base = baseline(body, (scrapes as usize).clamp(1, 20_000));
        json.push(report(label, filter, scrapes, &p, &base));
    }
    println!(
        "{{\"bench\":\"scrape_cost\",\"pods\":{pods},\"interval_ms\":50,\"phases\":[{}]}}",
        json.join(",")
    );
}

/// The number in environment variable `name`, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fake fleet of `pods` and the fake proxy, in a child process (`--serve`): the child
/// (killed when dropped), the pods' addresses and the push address.
fn start_fleet(pods: usize) -> (KillOnDrop, Vec<String>, SocketAddr) {
    let exe = std::env::current_exe().expect("current exe");
    let mut child = KillOnDrop(
        Command::new(exe)
            .args(["--serve", &pods.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn server"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ports");
    let (push_port, ports) = line.trim().split_once(' ').expect("ports line");
    let endpoints: Vec<String> = ports.split(',').map(|p| format!("127.0.0.1:{p}")).collect();
    let push: SocketAddr = format!("127.0.0.1:{push_port}").parse().expect("push addr");
    (child, endpoints, push)
}

/// Reading one text alone, `n` times.
struct Baseline {
    /// Wall and CPU µs per text.
    parse_us: f64,
    parse_cpu_us: f64,
    /// Keeps the reads from being optimised away.
    sink: u64,
}

fn baseline(body: &str, n: usize) -> Baseline {
    let c0 = cpu_seconds();
    let t = Instant::now();
    let mut sink = 0u64;
    for _ in 0..n {
        let m = normalise(
            body,
            Options {
                engine: None,
                detailed: false,
            },
        )
        .expect("parse");
        sink = sink.wrapping_add(u64::from(m.waiting));
    }
    Baseline {
        parse_us: t.elapsed().as_secs_f64() * 1e6 / n as f64,
        parse_cpu_us: (cpu_seconds() - c0) * 1e6 / n as f64,
        sink,
    }
}

/// Prints one phase's figures; its JSON object.
fn report(label: &str, filter: bool, scrapes: f64, p: &Phase, b: &Baseline) -> String {
    let cores = p.cpu / p.wall;
    let scrape_us = p.cpu * 1e6 / scrapes.max(1.0);
    let (parse_us, parse_cpu_us, sink) = (b.parse_us, b.parse_cpu_us, b.sink);
    println!("  [{label}]");
    println!(
        "    rounds {} ({:.1}/s), pushes {} ({:.1}/s), pods ok at end {}, last push {}, context switches {:.0}/s",
        p.rounds,
        p.rounds as f64 / p.wall,
        p.pushes,
        p.pushes as f64 / p.wall,
        p.pods_ok,
        p.last_push,
        p.switches as f64 / p.wall
    );
    println!(
        "    sidecar CPU {:.3} s in {:.1} s = {cores:.4} cores ({:.2}x the 0.05 goal; {:.0}x below the 7.5-core anchor)",
        p.cpu,
        p.wall,
        cores / 0.05,
        7.5 / cores.max(1e-9)
    );
    println!("    CPU per pod scrape {scrape_us:.1} µs all-in (HTTP, read, snapshot, push)");
    println!(
        "    baseline, reading the text alone: {parse_us:.1} µs wall / {parse_cpu_us:.1} µs CPU per text = {:.0}% of all-in (sink {sink})",
        100.0 * parse_us / scrape_us.max(1e-9)
    );
    format!(
        "{{\"name_filter\":{filter},\"cores\":{cores:.5},\"cpu_seconds\":{:.4},\"seconds\":{:.2},\"scrape_cpu_us\":{scrape_us:.2},\"parse_only_us\":{parse_us:.2},\"rounds\":{},\"pushes\":{}}}",
        p.cpu, p.wall, p.rounds, p.pushes
    )
}
