//! The benchmark report: the JSON contract, the Markdown tables and the targets check.
//!
//! Figures come only from [`Summary`]s computed from measured samples. Ratios are
//! router / baseline for the same scenario in the same run; the targets are the anchors' results
//! from the issue, checked as they are, never adjusted to the filter.

use crate::stats::Summary;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Scenario names, in the order of the tables.
pub const SCENARIOS: [&str; 6] = [
    "mixed_gpu",
    "bursty",
    "shared_prefix",
    "lora",
    "uniform",
    "long_prompt",
];
/// Router names, in the order of the tables.
pub const ROUTERS: [&str; 4] = [
    "round_robin",
    "least_request",
    "filter",
    "filter_gaie_weights",
];
/// The routers whose results are checked against the targets.
pub const CHECKED_ROUTERS: [&str; 2] = ["filter", "filter_gaie_weights"];

/// The machine the figures were measured on.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// Logical CPUs available to the process.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// Envoy version string, if known.
    pub envoy: String,
    /// UTC time of the run (RFC 3339-ish), from the system clock.
    pub date_utc: String,
    /// How the work shares the CPU (Envoy workers, emulator speed-up...).
    pub setup: String,
}

impl Machine {
    /// Read what the OS tells about this machine.
    pub fn detect(envoy: String, setup: String) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            envoy,
            date_utc: utc_now(),
            setup,
        }
    }
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, no extra crate).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// One body size of the overhead bench: plain Envoy vs Envoy with the filter, same run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OverheadCase {
    /// Request body size, bytes.
    pub body_bytes: usize,
    /// Latency without the filter, p50 / p99, ms (sequential requests).
    pub plain_p50_ms: f64,
    /// See `plain_p50_ms`.
    pub plain_p99_ms: f64,
    /// Latency with the filter, p50 / p99, ms.
    pub filter_p50_ms: f64,
    /// See `filter_p50_ms`.
    pub filter_p99_ms: f64,
    /// filter − plain at p50, ms.
    pub added_p50_ms: f64,
    /// filter − plain at p99, ms.
    pub added_p99_ms: f64,
    /// filter / plain at p50.
    pub p50_ratio: f64,
    /// filter / plain at p99.
    pub p99_ratio: f64,
    /// Closed-loop maximum requests/s without the filter.
    pub plain_max_rps: f64,
    /// Closed-loop maximum requests/s with the filter.
    pub filter_max_rps: f64,
    /// filter / plain max requests/s.
    pub rps_ratio: f64,
    /// Errors seen in either arm.
    pub errors: u64,
}

/// The whole report (the JSON file is this, serialised).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// `quick` or `full`.
    pub mode: String,
    /// scenario → router → figures.
    pub scenarios: BTreeMap<String, BTreeMap<String, Summary>>,
    /// Every target checked, met or not.
    pub targets: Vec<TargetResult>,
    /// The filter's own cost in front of an instant backend.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overhead: Vec<OverheadCase>,
    /// The sidecar's cost (as its benchmark reported it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<serde_json::Value>,
    /// Free-form notes (what was skipped and why, CPU budget...).
    pub notes: Vec<String>,
}

/// How a ratio is judged.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", content = "bound", rename_all = "snake_case")]
pub enum Bound {
    /// ratio ≤ bound.
    AtMost(f64),
    /// ratio ≥ bound.
    AtLeast(f64),
    /// |ratio − 1| ≤ bound.
    Within(f64),
}

impl Bound {
    fn holds(&self, r: f64) -> bool {
        match *self {
            Bound::AtMost(b) => r <= b,
            Bound::AtLeast(b) => r >= b,
            Bound::Within(b) => (r - 1.0).abs() <= b,
        }
    }
    fn text(&self) -> String {
        match *self {
            Bound::AtMost(b) => format!("≤ {b}×"),
            Bound::AtLeast(b) => format!("≥ {b}×"),
            Bound::Within(b) => format!("1 ± {b}"),
        }
    }
}

/// A target from the issue: `metric` of a checked router / of `baseline` must satisfy `bound`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Scenario name.
    pub scenario: &'static str,
    /// Summary field (or extra) compared.
    pub metric: &'static str,
    /// The router it is compared to.
    pub baseline: &'static str,
    /// The bound.
    pub bound: Bound,
}

/// The targets of the issue (anchors' results on real GPUs). Throughput "never below round robin"
/// is checked per scenario with a 2% allowance for run-to-run noise of an open loop.
pub fn targets() -> Vec<Target> {
    let mut t = vec![
        Target {
            scenario: "mixed_gpu",
            metric: "ttft_p95_ms",
            baseline: "round_robin",
            bound: Bound::AtMost(0.05),
        },
        Target {
            scenario: "mixed_gpu",
            metric: "ttft_p95_ms",
            baseline: "least_request",
            bound: Bound::AtMost(0.5),
        },
        Target {
            scenario: "bursty",
            metric: "ttft_p99_ms",
            baseline: "round_robin",
            bound: Bound::AtMost(0.1),
        },
        Target {
            scenario: "shared_prefix",
            metric: "ttft_p95_ms",
            baseline: "round_robin",
            bound: Bound::AtMost(0.5),
        },
        Target {
            scenario: "shared_prefix",
            metric: "ttft_p99_ms",
            baseline: "round_robin",
            bound: Bound::AtMost(0.4),
        },
        Target {
            scenario: "lora",
            metric: "adapter_loads",
            baseline: "round_robin",
            bound: Bound::AtMost(0.2),
        },
        Target {
            scenario: "uniform",
            metric: "ttft_p50_ms",
            baseline: "round_robin",
            bound: Bound::Within(0.05),
        },
        Target {
            scenario: "uniform",
            metric: "ttft_p95_ms",
            baseline: "round_robin",
            bound: Bound::Within(0.05),
        },
    ];
    for s in SCENARIOS {
        t.push(Target {
            scenario: s,
            metric: "throughput_rps",
            baseline: "round_robin",
            bound: Bound::AtLeast(0.98),
        });
    }
    t
}

/// The outcome of one target for one router.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetResult {
    /// Scenario name.
    pub scenario: String,
    /// Router checked.
    pub router: String,
    /// Metric compared.
    pub metric: String,
    /// Baseline router.
    pub baseline: String,
    /// router / baseline (None when either side is missing, zero or NaN).
    pub ratio: Option<f64>,
    /// The bound as text.
    pub target: String,
    /// Met, missed, or not measured (None).
    pub met: Option<bool>,
    /// A remark, e.g. a latency better than round robin beyond a "±" band (a literal miss of
    /// the band, not a loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Look a metric up in a summary by its JSON name (contract fields or extras).
pub fn metric(s: &Summary, name: &str) -> Option<f64> {
    let v = match name {
        "ttft_p50_ms" => s.ttft_p50_ms,
        "ttft_p95_ms" => s.ttft_p95_ms,
        "ttft_p99_ms" => s.ttft_p99_ms,
        "e2e_p95_ms" => s.e2e_p95_ms,
        "throughput_rps" => s.throughput_rps,
        "output_tokens_per_s" => s.output_tokens_per_s,
        "itl_p50_ms" => s.itl_p50_ms,
        other => *s.extra.get(other)?,
    };
    v.is_finite().then_some(v)
}

/// router / baseline of a metric, when both are measured and the baseline is not zero.
pub fn ratio(
    scenarios: &BTreeMap<String, BTreeMap<String, Summary>>,
    scenario: &str,
    router: &str,
    baseline: &str,
    name: &str,
) -> Option<f64> {
    let rs = scenarios.get(scenario)?;
    let a = metric(rs.get(router)?, name)?;
    let b = metric(rs.get(baseline)?, name)?;
    if b == 0.0 {
        // Both zero (e.g. no adapter loads at all) is "as good as"; otherwise undefined.
        return (a == 0.0).then_some(1.0);
    }
    Some(a / b)
}

/// Check every target for every checked router present in the results.
pub fn check_targets(scenarios: &BTreeMap<String, BTreeMap<String, Summary>>) -> Vec<TargetResult> {
    let mut out = Vec::new();
    for t in targets() {
        let Some(rs) = scenarios.get(t.scenario) else {
            continue;
        };
        for router in CHECKED_ROUTERS {
            if !rs.contains_key(router) {
                continue;
            }
            let r = ratio(scenarios, t.scenario, router, t.baseline, t.metric);
            let note = match (t.bound, r) {
                (Bound::Within(b), Some(x)) if x < 1.0 - b => {
                    Some(format!("better than {} beyond the band", t.baseline))
                }
                _ => None,
            };
            out.push(TargetResult {
                note,
                scenario: t.scenario.into(),
                router: router.into(),
                metric: t.metric.into(),
                baseline: t.baseline.into(),
                ratio: r,
                target: t.bound.text(),
                met: r.map(|r| t.bound.holds(r)),
            });
        }
    }
    out
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}×"))
}

fn mark(
    targets: &[TargetResult],
    s: &str,
    router: &str,
    metric: &str,
    baseline: &str,
) -> &'static str {
    match targets
        .iter()
        .find(|t| {
            t.scenario == s && t.router == router && t.metric == metric && t.baseline == baseline
        })
        .and_then(|t| t.met)
    {
        Some(true) => " ✅",
        Some(false) => " ❌ miss",
        None => "",
    }
}

fn ordered(
    scenarios: &BTreeMap<String, BTreeMap<String, Summary>>,
) -> Vec<(&'static str, &'static str, &Summary)> {
    let mut rows = Vec::new();
    for s in SCENARIOS {
        if let Some(rs) = scenarios.get(s) {
            for r in ROUTERS {
                if let Some(sum) = rs.get(r) {
                    rows.push((s, r, sum));
                }
            }
        }
    }
    rows
}

fn ratio_table(out: &mut String, rep: &Report, baseline: &str) {
    let metrics = [
        ("TTFT p50", "ttft_p50_ms"),
        ("TTFT p95", "ttft_p95_ms"),
        ("TTFT p99", "ttft_p99_ms"),
        ("e2e p95", "e2e_p95_ms"),
        ("req/s", "throughput_rps"),
        ("tok/s", "output_tokens_per_s"),
        ("adapter loads", "adapter_loads"),
    ];
    let _ = write!(out, "| scenario | router |");
    for (h, _) in metrics {
        let _ = write!(out, " {h} |");
    }
    let _ = writeln!(out, " errors |");
    let _ = writeln!(out, "|---|---|{}---|", "---|".repeat(metrics.len()));
    for (s, r, sum) in ordered(&rep.scenarios) {
        if r == baseline {
            continue;
        }
        let _ = write!(out, "| {s} | {r} |");
        for (_, m) in metrics {
            let x = ratio(&rep.scenarios, s, r, baseline, m);
            let _ = write!(
                out,
                " {}{} |",
                fmt_ratio(x),
                mark(&rep.targets, s, r, m, baseline)
            );
        }
        let _ = writeln!(out, " {} |", sum.errors);
    }
}

/// The Markdown report: ratios vs round robin first, then vs least request, absolute figures,
/// targets, overhead and sidecar cost.
pub fn markdown(rep: &Report) -> String {
    let mut out = String::new();
    let m = &rep.machine;
    let _ = writeln!(out, "## Benchmark results ({} mode)\n", rep.mode);
    let _ = writeln!(
        out,
        "Machine: {} ({} CPUs), kernel {}, Envoy {}, run {}.  \n{}\n",
        m.cpu, m.cpus, m.kernel, m.envoy, m.date_utc, m.setup
    );
    let _ = writeln!(
        out,
        "### Ratios vs round robin (router / round_robin; latency < 1 is better, throughput > 1 is better)\n"
    );
    ratio_table(&mut out, rep, "round_robin");
    let _ = writeln!(
        out,
        "\n### Ratios vs least request (router / least_request)\n"
    );
    ratio_table(&mut out, rep, "least_request");
    let _ = writeln!(out, "\n### Absolute figures\n");
    let _ = writeln!(
        out,
        "| scenario | router | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | e2e p95 ms | ITL p50 ms | req/s | out tok/s | requests | errors | extras | pod share |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, r, x) in ordered(&rep.scenarios) {
        let extras: Vec<String> = x
            .extra
            .iter()
            .map(|(k, v)| format!("{k}={}", fmt_num(*v)))
            .collect();
        let shares: Vec<String> = x
            .pod_share
            .iter()
            .map(|(k, v)| format!("{}:{:.0}%", k.rsplit(':').next().unwrap_or(k), v * 100.0))
            .map(|s| s.replace(" (", "("))
            .collect();
        let errs = if x.errors_by_status.is_empty() {
            x.errors.to_string()
        } else {
            let kinds: Vec<String> = x
                .errors_by_status
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            format!("{} ({})", x.errors, kinds.join(" "))
        };
        let _ = writeln!(
            out,
            "| {s} | {r} | {} | {} | {} | {} | {} | {} | {} | {} | {errs} | {} | {} |",
            fmt_num(x.ttft_p50_ms),
            fmt_num(x.ttft_p95_ms),
            fmt_num(x.ttft_p99_ms),
            fmt_num(x.e2e_p95_ms),
            fmt_num(x.itl_p50_ms),
            fmt_num(x.throughput_rps),
            fmt_num(x.output_tokens_per_s),
            x.requests,
            extras.join(" "),
            shares.join(" ")
        );
    }
    if !rep.targets.is_empty() {
        let _ = writeln!(
            out,
            "\n### Targets (from the issue; never tuned to the filter)\n"
        );
        let _ = writeln!(
            out,
            "| scenario | router | metric | vs | ratio | target | result |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for t in &rep.targets {
            let res = match (t.met, &t.note) {
                (Some(true), _) => "met".to_string(),
                (Some(false), Some(n)) => format!("outside band: {n}"),
                (Some(false), None) => "**MISSED**".to_string(),
                (None, _) => "not measured".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {res} |",
                t.scenario,
                t.router,
                t.metric,
                t.baseline,
                fmt_ratio(t.ratio),
                t.target
            );
        }
    }
    if !rep.overhead.is_empty() {
        let _ = writeln!(
            out,
            "\n### Filter overhead (same Envoy, instant backend, measured in one run)\n"
        );
        let _ = writeln!(
            out,
            "| body | plain p50 ms | filter p50 ms | added p50 ms | plain p99 ms | filter p99 ms | added p99 ms | max req/s plain | max req/s filter | req/s ratio | target (added p50) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
        for c in &rep.overhead {
            let limit = if c.body_bytes <= 4096 { 0.1 } else { 1.0 };
            let verdict = if !c.added_p50_ms.is_finite() {
                "not measured".to_string()
            } else if c.added_p50_ms <= limit {
                format!("≤ {limit} ms: met")
            } else {
                format!("≤ {limit} ms: **MISSED**")
            };
            let _ = writeln!(
                out,
                "| {} KB | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.2}× | {verdict} |",
                (c.body_bytes + 500) / 1000,
                c.plain_p50_ms,
                c.filter_p50_ms,
                c.added_p50_ms,
                c.plain_p99_ms,
                c.filter_p99_ms,
                c.added_p99_ms,
                c.plain_max_rps,
                c.filter_max_rps,
                c.rps_ratio
            );
        }
    }
    if let Some(s) = &rep.sidecar {
        let _ = writeln!(out, "\n### Sidecar cost\n\n```json\n{s:#}\n```");
    }
    if !rep.notes.is_empty() {
        let _ = writeln!(out, "\n### Notes\n");
        for n in &rep.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Outcome;
    use crate::loadgen::{RunResult, Sample};
    use crate::stats::summarize;

    /// A run whose TTFTs are `base * (1..=100)` ms and that served `ok` of 100 requests.
    fn run(base: f64, ok: usize, wall_s: f64) -> Summary {
        let samples = (0..100u64)
            .map(|i| Sample {
                id: i,
                model: "m".into(),
                at_ms: 0.0,
                lag_ms: 0.0,
                outcome: Outcome {
                    status: if (i as usize) < ok { 200 } else { 500 },
                    error: if (i as usize) < ok {
                        None
                    } else {
                        Some("x".into())
                    },
                    ttft_ms: Some(base * (i + 1) as f64),
                    e2e_ms: 2.0 * base * (i + 1) as f64,
                    itl_ms: vec![],
                    output_tokens: Some(10),
                    content_chunks: 10,
                    pod: Some("127.0.0.1:1".into()),
                },
            })
            .collect();
        summarize(&RunResult { samples, wall_s })
    }

    fn report() -> Report {
        let mut scenarios = BTreeMap::new();
        let mut mixed = BTreeMap::new();
        mixed.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        mixed.insert("least_request".to_string(), run(2.0, 100, 10.0));
        mixed.insert("filter".to_string(), run(0.4, 100, 10.0)); // 0.04× RR, 0.2× LR
        mixed.insert("filter_gaie_weights".to_string(), run(1.5, 90, 10.0)); // p95 129 ms = 0.14× RR: miss
        scenarios.insert("mixed_gpu".to_string(), mixed);
        let mut uni = BTreeMap::new();
        uni.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        uni.insert("filter".to_string(), run(10.3, 100, 11.1)); // TTFT within 5%, throughput 0.90×: miss
        scenarios.insert("uniform".to_string(), uni);
        let targets = check_targets(&scenarios);
        Report {
            machine: Machine::default(),
            mode: "quick".into(),
            scenarios,
            targets,
            ..Report::default()
        }
    }

    fn find<'a>(t: &'a [TargetResult], s: &str, r: &str, m: &str, b: &str) -> &'a TargetResult {
        t.iter()
            .find(|x| x.scenario == s && x.router == r && x.metric == m && x.baseline == b)
            .unwrap()
    }

    #[test]
    fn targets_are_judged_on_measured_ratios() {
        let rep = report();
        let t = &rep.targets;
        let f = find(t, "mixed_gpu", "filter", "ttft_p95_ms", "round_robin");
        assert!((f.ratio.unwrap() - 0.04).abs() < 1e-9);
        assert_eq!(f.met, Some(true));
        assert_eq!(
            find(t, "mixed_gpu", "filter", "ttft_p95_ms", "least_request").met,
            Some(true)
        );
        let g = find(
            t,
            "mixed_gpu",
            "filter_gaie_weights",
            "ttft_p95_ms",
            "round_robin",
        );
        assert_eq!(g.met, Some(false));
        assert_eq!(
            find(t, "uniform", "filter", "ttft_p95_ms", "round_robin").met,
            Some(true)
        );
        let th = find(t, "uniform", "filter", "throughput_rps", "round_robin");
        assert!((th.ratio.unwrap() - 10.0 / 11.1).abs() < 1e-9);
        assert_eq!(th.met, Some(false));
        // Scenarios not run produce no target rows.
        assert!(t
            .iter()
            .all(|x| x.scenario == "mixed_gpu" || x.scenario == "uniform"));
    }

    #[test]
    fn json_has_the_contract_keys() {
        let rep = report();
        let v = serde_json::to_value(&rep).unwrap();
        assert!(v["machine"].is_object());
        let f = &v["scenarios"]["mixed_gpu"]["filter"];
        for k in [
            "ttft_p50_ms",
            "ttft_p95_ms",
            "ttft_p99_ms",
            "e2e_p95_ms",
            "throughput_rps",
            "output_tokens_per_s",
            "requests",
            "errors",
        ] {
            assert!(f[k].is_number(), "{k} missing: {f}");
        }
        assert_eq!(f["ttft_p95_ms"], 0.4 * 95.0);
        assert_eq!(f["requests"], 100);
        let g = &v["scenarios"]["mixed_gpu"]["filter_gaie_weights"];
        assert_eq!(g["errors"], 10);
        assert_eq!(g["throughput_rps"], 9.0);
        assert_eq!(g["ttft_p95_ms"], 1.5 * 86.0);
    }

    #[test]
    fn markdown_rows_carry_the_ratios_and_misses() {
        let md = markdown(&report());
        let rr_table = md.split("### Ratios vs least request").next().unwrap();
        let row = rr_table
            .lines()
            .find(|l| l.starts_with("| mixed_gpu | filter |"))
            .unwrap();
        // p50 0.04×, p95 0.04× with a tick, throughput 1.00×.
        assert!(row.contains("0.04× ✅"), "{row}");
        assert!(row.contains("1.00×"), "{row}");
        let gaie = rr_table
            .lines()
            .find(|l| l.starts_with("| mixed_gpu | filter_gaie_weights |"))
            .unwrap();
        assert!(gaie.contains("0.14× ❌ miss"), "{gaie}");
        assert!(!rr_table.contains("| mixed_gpu | round_robin |"));
        let abs = md
            .split("### Absolute figures")
            .nth(1)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("| mixed_gpu | filter_gaie_weights | "))
            .unwrap();
        // TTFT p50 of the 90 served = 1.5 × 45; p95 = 1.5 × 86; errors by kind.
        assert!(abs.contains("| 67.5 | 129 |"), "{abs}");
        assert!(abs.contains("| 10 (500:10) |"), "{abs}");
        assert!(md.contains("**MISSED**"));
    }

    #[test]
    fn better_than_a_band_is_noted_not_called_a_loss() {
        let mut scenarios = BTreeMap::new();
        let mut uni = BTreeMap::new();
        uni.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        uni.insert("filter".to_string(), run(8.0, 100, 10.0)); // 0.8×: better than the band
        scenarios.insert("uniform".to_string(), uni);
        let t = check_targets(&scenarios);
        let p95 = find(&t, "uniform", "filter", "ttft_p95_ms", "round_robin");
        assert_eq!(p95.met, Some(false));
        assert!(p95.note.as_deref().unwrap().starts_with("better"));
        let rep = Report {
            scenarios,
            targets: t,
            ..Report::default()
        };
        assert!(markdown(&rep).contains("outside band: better than round_robin"));
    }

    #[test]
    fn utc_now_is_well_formed() {
        let s = utc_now();
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }
}
