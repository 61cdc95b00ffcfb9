//! Runs scenarios × routers and writes the report (JSON, Markdown, PNG) under `target/bench/`.
//!
//! For every router the same seeded workload is sent to fresh pods through a fresh Envoy; the
//! CPU time of every process (Envoy, pods, sidecar, this load generator) is recorded so the
//! report can show that neither Envoy nor the load generator was the bottleneck.

use crate::loadgen::{run, RunOptions, RunResult};
use crate::podmetrics;
use crate::report::{check_targets, markdown, Machine, Report};
use crate::scenarios::{scenario, Mode, Scenario};
use crate::stack::{start_stack, RouterKind, MODEL};
use crate::stats::{summarize, Summary};
use crate::workload::generate;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Errors of a benchmark run that stop it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Unknown scenario or router name.
    #[error("unknown {what} {name:?} (known: {known})")]
    Unknown {
        /// `scenario` or `router`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The names accepted.
        known: String,
    },
    /// Writing results failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// CPU seconds (user + system) a process has used so far, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(0) ... utime is field 14 overall = index 11 here, stime 12.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / 100.0) // USER_HZ is 100 on Linux.
}

/// The Envoy version string (`envoy --version`), or "unknown".
pub fn envoy_version() -> String {
    let Ok(bin) = testkit::envoy_binary() else {
        return "not found".into();
    };
    match std::process::Command::new(bin).arg("--version").output() {
        Ok(o) => {
            let s = String::from_utf8_lossy(&o.stdout);
            s.split("version:")
                .nth(1)
                .map(|v| v.trim().split('/').nth(1).unwrap_or(v.trim()).to_string())
                .unwrap_or_else(|| s.trim().to_string())
        }
        Err(_) => "unknown".into(),
    }
}

/// One scenario under one router: start the stack, send the workload, summarise, stop.
pub async fn run_one(sc: &Scenario, router: RouterKind) -> Result<(Summary, RunResult), String> {
    let reqs = generate(&sc.workload);
    let stack = start_stack(&sc.fleet, router, &sc.adapters)
        .await
        .map_err(|e| e.to_string())?;
    let pids: Vec<(String, String)> =
        std::iter::once(("envoy".to_string(), stack.envoy.pid().to_string()))
            .chain(
                stack
                    .pods
                    .guards
                    .iter()
                    .map(|g| ("pods".to_string(), g.pid().to_string())),
            )
            .chain(
                stack
                    .sidecar
                    .iter()
                    .map(|g| ("sidecar".to_string(), g.pid().to_string())),
            )
            .chain(std::iter::once(("loadgen".to_string(), "self".to_string())))
            .collect();
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|(_, p)| cpu_seconds(p).unwrap_or(0.0))
        .collect();
    let opts = RunOptions {
        url: stack.chat_url(),
        headers: vec![],
        drain: sc.drain,
        request_timeout: sc.workload.horizon + sc.drain + Duration::from_secs(5),
    };
    let result = run(&reqs, &opts).await.map_err(|e| e.to_string());
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            stack.stop();
            return Err(e);
        }
    };
    let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
    for ((k, p), c0) in pids.iter().zip(cpu0) {
        *cpu.entry(k.clone()).or_default() += cpu_seconds(p).unwrap_or(c0) - c0;
    }
    let metrics = podmetrics::scrape(&stack.pods.addrs).await;
    let profiles: BTreeMap<String, &str> = stack
        .pods
        .addrs
        .iter()
        .zip(&sc.fleet.pods)
        .map(|(a, p)| (a.to_string(), p.profile))
        .collect();
    stack.stop();
    let mut summary = summarize(&result);
    // Name each pod's GPU profile next to its address.
    summary.pod_share = std::mem::take(&mut summary.pod_share)
        .into_iter()
        .map(|(k, v)| match profiles.get(&k) {
            Some(p) => (format!("{k} ({p})"), v),
            None => (k, v),
        })
        .collect();
    let max_loras = sc
        .fleet
        .pods
        .first()
        .and_then(|p| p.max_loras)
        .map(|n| n as usize)
        .filter(|_| !sc.adapters.is_empty());
    summary.extra = podmetrics::extras(&metrics, &result.samples, MODEL, max_loras);
    for (k, v) in cpu {
        summary
            .extra
            .insert(format!("cpu_cores_{k}"), v / result.wall_s.max(1e-9));
    }
    Ok((summary, result))
}

/// What `bench run` does.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Quick or full, speed-up, seed.
    pub mode: Mode,
    /// Scenario names (empty = all).
    pub scenarios: Vec<String>,
    /// Routers (empty = all).
    pub routers: Vec<String>,
    /// Run the overhead bench too.
    pub overhead: bool,
    /// Output folder (`target/bench`).
    pub out_dir: PathBuf,
}

fn write(path: &Path, data: &[u8]) -> Result<(), RunError> {
    std::fs::write(path, data).map_err(|source| RunError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn samples_csv(r: &RunResult) -> String {
    let mut s =
        String::from("id,model,at_ms,lag_ms,status,ttft_ms,e2e_ms,output_tokens,pod,error\n");
    for x in &r.samples {
        let o = &x.outcome;
        let _ = writeln!(
            s,
            "{},{},{:.1},{:.1},{},{},{:.1},{},{},{}",
            x.id,
            x.model,
            x.at_ms,
            x.lag_ms,
            o.status,
            o.ttft_ms.map_or(String::new(), |t| format!("{t:.1}")),
            o.e2e_ms,
            o.output_tokens.map_or(String::new(), |t| t.to_string()),
            o.pod.as_deref().unwrap_or(""),
            o.error.as_deref().unwrap_or("").replace([',', '\n'], " ")
        );
    }
    s
}

/// Resolve names to scenarios and routers (all when empty).
pub fn select(cfg: &BenchConfig) -> Result<(Vec<Scenario>, Vec<RouterKind>), RunError> {
    let names: Vec<String> = if cfg.scenarios.is_empty() {
        crate::scenarios::NAMES
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        cfg.scenarios.clone()
    };
    let mut scs = Vec::new();
    for n in names {
        scs.push(scenario(&n, cfg.mode).ok_or_else(|| RunError::Unknown {
            what: "scenario",
            name: n.clone(),
            known: crate::scenarios::NAMES.join(", "),
        })?);
    }
    let mut routers = Vec::new();
    if cfg.routers.is_empty() {
        routers.extend(RouterKind::ALL);
    }
    for r in &cfg.routers {
        routers.push(RouterKind::from_name(r).ok_or_else(|| RunError::Unknown {
            what: "router",
            name: r.clone(),
            known: RouterKind::ALL.map(|r| r.name()).join(", "),
        })?);
    }
    Ok((scs, routers))
}

/// Run the benchmark and write `<out>/<stem>.json`, `.md` and `-ttft.png`; returns the report.
pub async fn run_bench(cfg: &BenchConfig, stem: &str) -> Result<Report, RunError> {
    let (scs, routers) = select(cfg)?;
    let runs_dir = cfg.out_dir.join("runs").join(stem);
    std::fs::create_dir_all(&runs_dir).map_err(|source| RunError::Io {
        path: runs_dir.display().to_string(),
        source,
    })?;
    let mode_name = if cfg.mode.quick { "quick" } else { "full" };
    let setup = format!(
        "One machine runs everything: Envoy ({} workers), {} model-sim pods per scenario (one process each, speed-up {}), the sidecar (filter runs) and this load generator. Per-process CPU use is in the JSON (`cpu_cores_*`); seed {}.",
        2,
        4,
        cfg.mode.speedup,
        cfg.mode.seed
    );
    let mut rep = Report {
        machine: Machine::detect(envoy_version(), setup),
        mode: mode_name.into(),
        ..Report::default()
    };
    for sc in &scs {
        eprintln!(
            "bench: scenario {} — {} ({} requests)",
            sc.name,
            sc.about,
            generate(&sc.workload).len()
        );
        for r in &routers {
            eprintln!("bench:   router {} ...", r.name());
            match run_one(sc, *r).await {
                Ok((sum, result)) => {
                    eprintln!(
                        "bench:   {:<20} TTFT p50 {:>8.1} p95 {:>8.1} p99 {:>8.1} ms, {:.2} req/s, {} errors",
                        r.name(),
                        sum.ttft_p50_ms,
                        sum.ttft_p95_ms,
                        sum.ttft_p99_ms,
                        sum.throughput_rps,
                        sum.errors
                    );
                    write(
                        &runs_dir.join(format!("{}-{}.csv", sc.name, r.name())),
                        samples_csv(&result).as_bytes(),
                    )?;
                    rep.scenarios
                        .entry(sc.name.to_string())
                        .or_default()
                        .insert(r.name().to_string(), sum);
                }
                Err(e) => {
                    eprintln!("bench:   {} failed: {e}", r.name());
                    rep.notes
                        .push(format!("{} / {}: not measured: {e}", sc.name, r.name()));
                }
            }
        }
    }
    rep.targets = check_targets(&rep.scenarios);
    if cfg.overhead {
        eprintln!("bench: overhead (same Envoy with and without the filter, instant backend)");
        let opts = crate::overhead::OverheadOptions {
            latency_requests: if cfg.mode.quick { 400 } else { 2000 },
            rps_duration: Duration::from_secs(if cfg.mode.quick { 2 } else { 5 }),
            concurrency: 16,
        };
        match crate::overhead::run(opts).await {
            Ok((c, snapshot)) => {
                rep.overhead = c;
                if !snapshot {
                    rep.notes.push("overhead: the filter had no snapshot (sidecar push did not arrive); its arm measured the fallback path".into());
                }
            }
            Err(e) => rep.notes.push(format!("overhead not measured: {e}")),
        }
    }
    if cfg.overhead {
        eprintln!("bench: sidecar cost (100 metrics-only pods, 50 ms interval)");
        let window = Duration::from_secs(if cfg.mode.quick { 5 } else { 15 });
        match crate::sidecar_cost::measure(100, window).await {
            Ok(c) => rep.sidecar = serde_json::to_value(&c).ok(),
            Err(e) => rep.notes.push(format!("sidecar cost not measured: {e}")),
        }
    }
    write_outputs(&rep, &cfg.out_dir, stem)?;
    Ok(rep)
}

/// Write `<stem>.json`, `<stem>.md` and `<stem>-ttft.png` into `out`.
pub fn write_outputs(rep: &Report, out: &Path, stem: &str) -> Result<(), RunError> {
    std::fs::create_dir_all(out).map_err(|source| RunError::Io {
        path: out.display().to_string(),
        source,
    })?;
    let json = serde_json::to_vec_pretty(rep).unwrap_or_default();
    write(&out.join(format!("{stem}.json")), &json)?;
    let png = out.join(format!("{stem}-ttft.png"));
    let mut md = markdown(rep);
    match crate::chart::ttft_chart(rep, &png) {
        Ok(text) => {
            let _ = writeln!(
                md,
                "\nChart: `{}`{}",
                png.display(),
                if text {
                    ""
                } else {
                    " (no font found: drawn without labels)"
                }
            );
        }
        Err(e) => {
            let _ = writeln!(md, "\nChart not drawn: {e}");
        }
    }
    write(&out.join(format!("{stem}.md")), md.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Outcome;
    use crate::loadgen::Sample;

    #[test]
    fn reads_own_cpu_time() {
        let a = cpu_seconds("self").unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let b = cpu_seconds("self").unwrap();
        assert!(b >= a);
        assert!(cpu_seconds("no-such-pid").is_none());
    }

    #[test]
    fn csv_has_one_row_per_sample() {
        let r = RunResult {
            samples: vec![Sample {
                id: 3,
                model: "m".into(),
                at_ms: 1.0,
                lag_ms: 0.0,
                outcome: Outcome {
                    status: 503,
                    error: Some("status 503: a, b\nc".into()),
                    ..Outcome::default()
                },
            }],
            wall_s: 1.0,
        };
        let csv = samples_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[1].starts_with("3,m,1.0,0.0,503,"));
    }

    #[test]
    fn selection_rejects_unknown_names() {
        let mut cfg = BenchConfig {
            mode: Mode {
                quick: true,
                speedup: 1.0,
                seed: 1,
            },
            scenarios: vec![],
            routers: vec![],
            overhead: false,
            out_dir: PathBuf::from("/nonexistent"),
        };
        let (s, r) = select(&cfg).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(r.len(), 4);
        cfg.scenarios = vec!["lora".into()];
        cfg.routers = vec!["filter".into()];
        let (s, r) = select(&cfg).unwrap();
        assert_eq!((s[0].name, r[0]), ("lora", RouterKind::Filter));
        cfg.routers = vec!["magic".into()];
        assert!(matches!(
            select(&cfg),
            Err(RunError::Unknown { what: "router", .. })
        ));
    }
}
