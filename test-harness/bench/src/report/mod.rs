//! The benchmark report: the JSON contract, the Markdown tables and the targets check.
//!
//! Figures come only from [`Summary`]s computed from measured samples. Ratios are
//! router / baseline for the same scenario and the same seeds, each with a Student-t 95 %
//! interval (see `confidence.rs`); a target counts as met only when the interval's worse end
//! meets it. The targets are the anchors' results from the issue, checked as they are, never
//! adjusted to the filter.
//!
//! [`verdicts`] holds the rules that decide met / missed; [`chart`] and [`dashboard_chart`] draw
//! (plotters, the one chart engine); [`overhead`] is the overhead bench's figures and table.

pub mod chart;
pub mod dashboard_chart;
pub mod flow;
pub mod load_chart;
pub mod overhead;
pub mod soak;
pub mod svg;
pub mod verdicts;

// The path `tests/smoke.rs` names.
pub use verdicts::check_targets;

use crate::analysis::stats::{percentile, Summary};
use crate::report::overhead::OverheadCase;
#[cfg(test)]
use crate::report::verdicts::targets;
use crate::report::verdicts::TargetResult;
use crate::scenario_names::all_scenarios;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::{Deref, DerefMut};

/// Router names, in the order of the tables.
pub const ROUTERS: [&str; 15] = [
    "round_robin",
    "least_request",
    "least_request_full",
    "weighted_rr",
    "filter",
    "filter_gaie_weights",
    "filter_x2",
    "filter_x4",
    "filter_x2_nohub",
    "smg_cache_aware",
    "smg_least_load",
    "smg_power_of_two",
    "smg_prefix_hash",
    "vllm_router_cache_aware",
    "vllm_router_power_of_two",
];
/// The field's routers (SMG, vllm-router), in report order.
pub const PEERS: [&str; 6] = [
    "smg_cache_aware",
    "smg_least_load",
    "smg_power_of_two",
    "smg_prefix_hash",
    "vllm_router_cache_aware",
    "vllm_router_power_of_two",
];
/// The routers whose results are checked against the targets.
pub const CHECKED_ROUTERS: [&str; 2] = ["filter", "filter_gaie_weights"];
/// Routers compared with the one-gateway filter (targets whose baseline is `filter`).
pub const REPLICA_ROUTERS: [&str; 3] = ["filter_x2", "filter_x4", "filter_x2_nohub"];
/// The baselines (Envoy's own balancers).
pub const BASELINES: [&str; 4] = [
    "round_robin",
    "least_request",
    "least_request_full",
    "weighted_rr",
];

/// One probe of a goodput sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// Offered rate, req/s of emulated time.
    pub rate_rps: f64,
    /// TTFT p95 in the window, ms (failures +∞, written as null).
    pub ttft_p95_ms: f64,
    /// Failed ÷ sent.
    pub error_rate: f64,
    /// TTFT p95 ≤ SLO and errors ≤ 1 % (and the run valid).
    pub passed: bool,
    /// Why the run was invalid, if it was (an invalid probe counts as not passed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
}

/// A scenario's goodput sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GoodputSweep {
    /// The TTFT p95 SLO, ms.
    pub slo_ttft_ms: f64,
    /// The seed the sweep used.
    pub seed: u64,
    /// Every probe per router, in probe order.
    pub probes: BTreeMap<String, Vec<Probe>>,
    /// filter ÷ round robin goodput.
    pub filter_vs_round_robin: Option<f64>,
    /// filter ÷ the best baseline's goodput.
    pub filter_vs_best_baseline: Option<f64>,
    /// The baseline with the highest goodput.
    pub best_baseline: Option<String>,
    /// filter ÷ the best other router's goodput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_vs_best_other: Option<f64>,
    /// The other router (Envoy's balancers and the field's routers) with the highest goodput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_other: Option<String>,
}

/// One scenario: router → figures (flattened, the original contract), plus the scenario's own
/// keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScenarioResult {
    /// router → figures.
    #[serde(flatten)]
    pub routers: BTreeMap<String, Summary>,
    /// What a perfect router could reach (TTFT p95, ms; null = not stated).
    pub floor_ms: f64,
    /// TTFT p95 SLO for goodput, ms.
    pub slo_ttft_ms: f64,
    /// The anchor condition checked.
    pub condition: String,
    /// Whether it occurred (null = could not be checked). When false the scenario is invalid:
    /// its targets are not judged.
    pub condition_met: Option<bool>,
    /// Share of the window's requests that are cold first reads of a long prefix.
    pub cold_read_fraction: Option<f64>,
    /// Offered rate of the fixed-load runs, req/s of emulated time.
    pub offered_rps: f64,
    /// Where that rate comes from.
    pub load_basis: String,
    /// That rate as a fraction of the fleet's measured capacity, when the run set it so
    /// (`bench run --load`): the x of a load sweep's chart (`bench load-chart`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_of_capacity: Option<f64>,
    /// The scenario's card (Markdown: fleet, rates, anchor, check, floor).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub card: String,
    /// The goodput sweep, if the scenario had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputSweep>,
    /// The other router with the lowest TTFT p95 in this scenario ([`best_other`]), named in
    /// the tables; each target against the best other router picks the best at its own metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_other: Option<String>,
}

/// The `router` of the [`RatioRow`]s that compare the scenario's floor (each request alone on an
/// idle pod of the fastest profile: no router can beat it) with the routers that ran.
pub const FLOOR: &str = "floor";

/// Whether `router` is one the filter is compared with: any router but the filter's own
/// (Envoy's balancers, weighted round robin and full-scan least request included, and the
/// field's routers).
pub fn is_other(router: &str) -> bool {
    !CHECKED_ROUTERS.contains(&router) && !REPLICA_ROUTERS.contains(&router)
}

/// Whether a higher value of `metric` is better (rates, hit rates), else lower is.
pub fn higher_is_better(metric: &str) -> bool {
    matches!(
        metric,
        "throughput_rps" | "output_tokens_per_s" | "prefix_hit_rate" | "goodput_rps"
    )
}

/// The other router ([`is_other`]) with the best pooled `metric` among those with figures in
/// `rs` (the first in report order on a tie); `None` when none ran.
pub fn best_other(rs: &ScenarioResult, metric: &str) -> Option<String> {
    let flip = if higher_is_better(metric) { -1.0 } else { 1.0 };
    ROUTERS
        .iter()
        .filter(|r| is_other(r))
        .filter_map(|r| Some((*r, flip * crate::report::metric(rs.get(*r)?, metric)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(r, _)| r.to_string())
}

impl Deref for ScenarioResult {
    type Target = BTreeMap<String, Summary>;
    fn deref(&self) -> &Self::Target {
        &self.routers
    }
}

impl DerefMut for ScenarioResult {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.routers
    }
}

/// How wide the intervals of one metric came out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CiWidth {
    /// Ratios with a finite interval.
    pub ratios: usize,
    /// Median relative width.
    pub median: f64,
    /// Widest relative width.
    pub widest: f64,
}

/// A ratio router ÷ baseline of one metric in one scenario, with its interval over the seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RatioRow {
    /// Scenario.
    pub scenario: String,
    /// Router.
    pub router: String,
    /// Baseline router.
    pub baseline: String,
    /// Metric (JSON name).
    pub metric: String,
    /// Point estimate (pooled over the seeds).
    pub ratio: Option<f64>,
    /// Bootstrap 95 % interval.
    pub ci95: Option<[f64; 2]>,
    /// Seeds both routers had valid runs for.
    pub seeds: usize,
    /// Each of those seeds with its own ratio (`null`: undefined or a failed percentile), so
    /// that runs on further seeds can be pooled with this one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_seed: Vec<SeedRatio>,
}

/// One seed's ratio in a [`RatioRow`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeedRatio {
    pub seed: u64,
    pub ratio: Option<f64>,
}

/// The machine the figures were measured on.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// What tells two hosts with one model name apart: family, model, stepping and the vector
    /// extensions the engines' kernels use (a virtual CPU may be named only "AMD EPYC").
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cpu_id: String,
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
        let cpu_id = cpu_id(&cpuinfo);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpu,
            cpu_id,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            envoy,
            date_utc: utc_now(),
            setup,
        }
    }
}

/// `family F model M stepping S, AVX-512 yes|no, AMX yes|no` from `/proc/cpuinfo`'s first
/// processor (empty when the file says none of it).
pub fn cpu_id(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    let (Some(family), Some(model)) = (field("cpu family"), field("model")) else {
        return String::new();
    };
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| {
        if flags.split_whitespace().any(|x| x == f) {
            "yes"
        } else {
            "no"
        }
    };
    format!(
        "family {family} model {model} stepping {}, AVX-512 {}, AMX {}",
        field("stepping").unwrap_or_else(|| "?".into()),
        has("avx512f"),
        has("amx_tile")
    )
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

/// The whole report (the JSON file is this, serialised).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// `quick` or `full`.
    pub mode: String,
    /// How runs were measured (warm-up, windows, speed-up, seeds, intervals).
    pub protocol: String,
    /// Workload seeds of the fixed-load runs.
    pub seeds: Vec<u64>,
    /// scenario → router → figures (and the scenario's own keys).
    pub scenarios: BTreeMap<String, ScenarioResult>,
    /// Every ratio with its interval.
    pub ratios: Vec<RatioRow>,
    /// Interval widths obtained, per metric: (hi − lo) ÷ ratio over every ratio of the run.
    pub ci_widths: BTreeMap<String, CiWidth>,
    /// Every target checked, met or not.
    pub targets: Vec<TargetResult>,
    /// The filter's own cost in front of an instant backend.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overhead: Vec<OverheadCase>,
    /// Every router arm of the overhead bench at every prompt size (added latency over direct,
    /// router CPU per 1,000 requests).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overhead_arms: Vec<crate::report::overhead::ArmFigures>,
    /// The sidecar's cost (as its benchmark reported it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<serde_json::Value>,
    /// Free-form notes (what was skipped and why, CPU budget...).
    pub notes: Vec<String>,
}

/// Look a metric up in a summary by its JSON name (contract fields or extras).
pub fn metric(s: &Summary, name: &str) -> Option<f64> {
    let v = match name {
        "ttft_p50_ms" => s.ttft_p50_ms,
        "ttft_p90_ms" => s.ttft_p90_ms,
        "ttft_p95_ms" => s.ttft_p95_ms,
        "ttft_p99_ms" => s.ttft_p99_ms,
        "e2e_p95_ms" => s.e2e_p95_ms,
        "throughput_rps" => s.throughput_rps,
        "output_tokens_per_s" => s.output_tokens_per_s,
        "itl_p50_ms" => s.itl_p50_ms,
        "error_rate" => s.error_rate,
        other => *s.extra.get(other)?,
    };
    // +∞ (failures in a percentile) is a value; NaN (nothing measured) is not.
    (!v.is_nan()).then_some(v)
}

/// router / baseline of a metric, when both are measured and the baseline is not zero.
pub fn ratio(
    scenarios: &BTreeMap<String, ScenarioResult>,
    scenario: &str,
    router: &str,
    baseline: &str,
    name: &str,
) -> Option<f64> {
    let rs = scenarios.get(scenario)?;
    let a = metric(rs.get(router)?, name)?;
    let b = metric(rs.get(baseline)?, name)?;
    // Both zero (e.g. no adapter loads at all) is "as good as"; b zero otherwise undefined.
    crate::analysis::confidence::safe_ratio(a, b)
}

/// The ratio row of (scenario, router, baseline, metric), if computed.
pub fn find_ratio<'a>(
    ratios: &'a [RatioRow],
    scenario: &str,
    router: &str,
    baseline: &str,
    metric: &str,
) -> Option<&'a RatioRow> {
    ratios.iter().find(|x| {
        x.scenario == scenario && x.router == router && x.baseline == baseline && x.metric == metric
    })
}

fn fmt_num(v: f64) -> String {
    if v == f64::INFINITY {
        "∞".into()
    } else if !v.is_finite() {
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
    match r {
        None => "–".into(),
        Some(r) if r.is_infinite() => "∞".into(),
        Some(r) => format!("{r:.2}×"),
    }
}

fn fmt_ci(ci: Option<[f64; 2]>) -> String {
    let f = |x: f64| {
        if x.is_infinite() {
            "∞".to_string()
        } else {
            format!("{x:.2}")
        }
    };
    ci.map_or_else(String::new, |[lo, hi]| format!(" [{}, {}]", f(lo), f(hi)))
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
    scenarios: &BTreeMap<String, ScenarioResult>,
) -> Vec<(&'static str, &'static str, &Summary)> {
    let mut rows = Vec::new();
    for s in all_scenarios() {
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

/// Ratios of every router (or only those in `only`) to `baseline`.
fn ratio_table(out: &mut String, rep: &Report, baseline: &str, only: Option<&[&str]>) {
    let metrics = [
        ("TTFT p50", "ttft_p50_ms"),
        ("TTFT p95", "ttft_p95_ms"),
        ("TTFT p99", "ttft_p99_ms"),
        ("e2e p95", "e2e_p95_ms"),
        ("req/s", "throughput_rps"),
        ("tok/s", "output_tokens_per_s"),
        ("adapter loads", "adapter_loads"),
        ("prefix hit rate", "prefix_hit_rate"),
    ];
    let _ = write!(out, "| scenario | router |");
    for (h, _) in metrics {
        let _ = write!(out, " {h} |");
    }
    let _ = writeln!(out, " errors |");
    let _ = writeln!(out, "|---|---|{}---|", "---|".repeat(metrics.len()));
    for (s, r, sum) in ordered(&rep.scenarios) {
        if r == baseline
            || only.is_some_and(|o| !o.contains(&r))
            || !rep
                .scenarios
                .get(s)
                .is_some_and(|x| x.contains_key(baseline))
        {
            continue;
        }
        let _ = write!(out, "| {s} | {r} |");
        for (_, m) in metrics {
            let (x, ci) = match find_ratio(&rep.ratios, s, r, baseline, m) {
                Some(row) => (row.ratio, row.ci95),
                None => (ratio(&rep.scenarios, s, r, baseline, m), None),
            };
            let _ = write!(
                out,
                " {}{}{} |",
                fmt_ratio(x),
                fmt_ci(ci),
                mark(&rep.targets, s, r, m, baseline)
            );
        }
        let _ = writeln!(out, " {} |", sum.errors);
    }
}

/// Per scenario, the filter routers against round robin and against the best other router at
/// each metric (every router but the filter's that ran), side by side; then the scenario's
/// floor against the same routers, where the run computed it.
fn best_other_table(out: &mut String, rep: &Report) {
    let has_floor = |s: &str| {
        rep.ratios
            .iter()
            .any(|r| r.scenario == s && r.router == FLOOR)
    };
    let rows: Vec<(&str, &ScenarioResult, &str)> = all_scenarios()
        .filter_map(|s| Some((s, rep.scenarios.get(s)?)))
        .filter(|(_, x)| x.best_other.is_some())
        .flat_map(|(s, x)| {
            CHECKED_ROUTERS
                .iter()
                .chain(&REPLICA_ROUTERS)
                .filter(|r| x.contains_key(**r))
                .copied()
                .chain(has_floor(s).then_some(FLOOR))
                .map(move |r| (s, x, r))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n### The filter vs round robin and vs the best other router (per metric, the best of every router but the filter's that ran)\n"
    );
    let metrics = [
        ("TTFT p50", "ttft_p50_ms"),
        ("TTFT p90", "ttft_p90_ms"),
        ("TTFT p95", "ttft_p95_ms"),
        ("TTFT p99", "ttft_p99_ms"),
        ("req/s", "throughput_rps"),
        ("prefix hit rate", "prefix_hit_rate"),
    ];
    let _ = write!(out, "| scenario | router |");
    for (h, _) in metrics {
        let _ = write!(out, " {h} ÷ RR | {h} ÷ best other |");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|---|{}", "---|---|".repeat(metrics.len()));
    for &(s, x, r) in &rows {
        let label = if r == FLOOR {
            "*floor: each request alone on an idle pod*"
        } else {
            r
        };
        let _ = write!(out, "| {s} | {label} |");
        for (_, m) in metrics {
            let best = best_other(x, m);
            for baseline in ["round_robin", best.as_deref().unwrap_or("–")] {
                let (v, ci) = match find_ratio(&rep.ratios, s, r, baseline, m) {
                    Some(row) => (row.ratio, row.ci95),
                    None => (ratio(&rep.scenarios, s, r, baseline, m), None),
                };
                let _ = write!(out, " {}{}", fmt_ratio(v), fmt_ci(ci));
                if baseline != "round_robin" && v.is_some() {
                    let _ = write!(out, " ({baseline})");
                }
                let _ = write!(out, " |");
            }
        }
        let _ = writeln!(out);
    }
    if rows.iter().any(|&(_, _, r)| r == FLOOR) {
        let _ = writeln!(
            out,
            "\nThe floor's row divides, seed by seed and on the same requests, each request's TTFT served alone on an idle pod of the fleet's fastest profile (every prefix cached, every adapter resident; nothing waits) by the router's: no router can show a lower ratio, so a target the floor's ratio (or its interval's worse end) misses is below what any router can reach with these seeds."
        );
    }
}

fn opt(v: Option<f64>, k: f64, digits: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "–".into(), |x| format!("{:.*}", digits, x * k))
}

fn scenario_table(out: &mut String, rep: &Report) {
    if rep.scenarios.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Scenarios\n");
    let _ = writeln!(
        out,
        "| scenario | offered req/s | load basis | TTFT SLO ms | floor ms | condition | condition met | cold reads |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for s in all_scenarios() {
        let Some(x) = rep.scenarios.get(s) else {
            continue;
        };
        let met = match x.condition_met {
            Some(true) => "yes",
            Some(false) => "**no: scenario invalid**",
            None => "not checked",
        };
        let _ = writeln!(
            out,
            "| {s} | {} | {} | {} | {} | {} | {met} | {} |",
            fmt_num(x.offered_rps),
            x.load_basis,
            fmt_num(x.slo_ttft_ms),
            fmt_num(x.floor_ms),
            x.condition,
            opt(x.cold_read_fraction, 100.0, 1) + "%"
        );
    }
    let _ = writeln!(out);
    for s in all_scenarios() {
        if let Some(x) = rep.scenarios.get(s).filter(|x| !x.card.trim().is_empty()) {
            let _ = writeln!(out, "**{s}**\n\n{}\n", x.card.trim());
        }
    }
}

fn goodput_table(out: &mut String, rep: &Report) {
    let swept: Vec<(&str, &GoodputSweep)> = all_scenarios()
        .filter_map(|s| Some((s, rep.scenarios.get(s)?.goodput.as_ref()?)))
        .collect();
    if swept.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Goodput (highest offered req/s with TTFT p95 ≤ SLO and errors ≤ 1 %; bisection, one seed)\n"
    );
    let _ = write!(out, "| scenario | SLO ms |");
    for r in ROUTERS {
        let _ = write!(out, " {r} |");
    }
    let _ = writeln!(
        out,
        " filter ÷ RR | filter ÷ best baseline | filter ÷ best other |"
    );
    let _ = writeln!(out, "|---|---|{}---|---|---|", "---|".repeat(ROUTERS.len()));
    for (s, g) in swept {
        let _ = write!(out, "| {s} | {} |", fmt_num(g.slo_ttft_ms));
        for r in ROUTERS {
            let v = rep
                .scenarios
                .get(s)
                .and_then(|x| x.get(r))
                .and_then(|x| x.goodput_rps);
            let _ = write!(out, " {} |", opt(v, 1.0, 2));
        }
        let _ = writeln!(
            out,
            " {} | {} ({}) | {} ({}) |",
            fmt_ratio(g.filter_vs_round_robin),
            fmt_ratio(g.filter_vs_best_baseline),
            g.best_baseline.as_deref().unwrap_or("–"),
            fmt_ratio(g.filter_vs_best_other),
            g.best_other.as_deref().unwrap_or("–")
        );
    }
    let _ = writeln!(out);
}

/// Relative widths (hi − lo) ÷ ratio of the intervals obtained, by metric.
pub fn ci_width_summary(rep: &Report) -> BTreeMap<String, CiWidth> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rep.ratios.iter().filter(|r| r.router != FLOOR) {
        if let (Some(x), Some([lo, hi])) = (r.ratio, r.ci95) {
            let w = (hi - lo) / x;
            if w.is_finite() && x > 0.0 {
                by.entry(r.metric.clone()).or_default().push(w);
            }
        }
    }
    by.into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            let median = percentile(&v, 50.0);
            let widest = v[v.len() - 1];
            (
                k,
                CiWidth {
                    ratios: v.len(),
                    median,
                    widest,
                },
            )
        })
        .collect()
}

fn ci_widths(out: &mut String, rep: &Report) {
    let w = ci_width_summary(rep);
    if w.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n### Interval widths obtained ((hi − lo) ÷ ratio, over every ratio of the run)\n"
    );
    let _ = writeln!(out, "| metric | ratios | median width | widest |");
    let _ = writeln!(out, "|---|---|---|---|");
    for (k, c) in w {
        let _ = writeln!(
            out,
            "| {k} | {} | {:.0} % | {:.0} % |",
            c.ratios,
            c.median * 100.0,
            c.widest * 100.0
        );
    }
}

fn diagnostics_table(out: &mut String, rep: &Report) {
    let rows: Vec<_> = ordered(&rep.scenarios)
        .into_iter()
        .filter_map(|(s, r, x)| Some((s, r, x.diagnostics.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n### Diagnostics (measurement window; per pod: share / KV peak / KV mean / queue peak / preemptions / adapter loads GPU (disk) / prefix hit / lateness ms)\n"
    );
    let _ = writeln!(
        out,
        "| scenario | router | seeds | window requests (p99 tail) | invalid runs | errors by cause | preemptions | adapter loads GPU (disk) | prefix hit | step lateness mean / max ms | pods |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, r, d) in rows {
        let seeds: Vec<String> = d.seeds.iter().map(u64::to_string).collect();
        let invalid: Vec<String> = d
            .invalid_runs
            .iter()
            .map(|i| format!("seed {}: {}", i.seed, i.reason))
            .collect();
        let errs: Vec<String> = d
            .errors_by_cause
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        let pods: Vec<String> = d
            .pods
            .iter()
            .map(|(k, p)| {
                let w = &p.window;
                format!(
                    "{k}: {:.0}% / {} / {} / {} / {} / {} ({}) / {} / {}",
                    p.share * 100.0,
                    opt(w.kv_peak, 1.0, 2),
                    opt(w.kv_mean, 1.0, 2),
                    opt(w.queue_peak, 1.0, 0),
                    opt(w.preemptions, 1.0, 0),
                    opt(w.adapter_loads_gpu, 1.0, 0),
                    opt(w.adapter_loads_disk, 1.0, 0),
                    opt(w.prefix_hit_rate, 1.0, 2),
                    opt(w.step_lateness_mean_ms, 1.0, 1),
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {s} | {r} | {} | {} ({}) | {} | {} ({:.2} %) | {} | {} ({}) | {} | {} / {} | {} |",
            seeds.join(" "),
            d.window_requests,
            d.p99_tail_samples,
            if invalid.is_empty() {
                "–".to_string()
            } else {
                invalid.join("; ")
            },
            if errs.is_empty() {
                "0".to_string()
            } else {
                errs.join(" ")
            },
            d.error_rate * 100.0,
            opt(d.preemptions, 1.0, 1),
            opt(d.adapter_loads_gpu, 1.0, 1),
            opt(d.adapter_loads_disk, 1.0, 1),
            opt(d.prefix_hit_rate, 1.0, 2),
            opt(d.step_lateness_ms, 1.0, 2),
            opt(d.step_lateness_max_ms, 1.0, 1),
            pods.join("<br>")
        );
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
        "Machine: {}{} ({} CPUs), kernel {}, Envoy {}, run {}.  \n{}\n",
        m.cpu,
        if m.cpu_id.is_empty() {
            String::new()
        } else {
            format!(" [{}]", m.cpu_id)
        },
        m.cpus,
        m.kernel,
        m.envoy,
        m.date_utc,
        m.setup
    );
    if !rep.protocol.is_empty() {
        let _ = writeln!(out, "{}\n", rep.protocol);
    }
    scenario_table(&mut out, rep);
    goodput_table(&mut out, rep);
    let _ = writeln!(
        out,
        "### Ratios vs round robin (router / round_robin [95 % interval: Student t on per-seed log-ratios]; latency < 1 is better, throughput > 1 is better)\n"
    );
    ratio_table(&mut out, rep, "round_robin", None);
    best_other_table(&mut out, rep);
    let _ = writeln!(
        out,
        "\n### Ratios vs least request (router / least_request)\n"
    );
    ratio_table(&mut out, rep, "least_request", None);
    if rep
        .scenarios
        .values()
        .any(|x| REPLICA_ROUTERS.iter().any(|r| x.contains_key(*r)))
    {
        let _ = writeln!(
            out,
            "\n### Gateway replicas vs one gateway (router / filter)\n"
        );
        ratio_table(&mut out, rep, "filter", Some(&REPLICA_ROUTERS));
    }
    ci_widths(&mut out, rep);
    let _ = writeln!(
        out,
        "\n### Absolute figures (failed requests count as ∞ in percentiles)\n"
    );
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
            "A target is met only when the interval's worse end meets it.\n"
        );
        let _ = writeln!(
            out,
            "| scenario | router | metric | vs | ratio [95 % CI] | target | result |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for t in &rep.targets {
            let res = match (t.met, &t.note) {
                (Some(true), _) => "met".to_string(),
                (Some(false), Some(n)) if n.starts_with("better") => format!("outside band: {n}"),
                (Some(false), Some(n)) => format!("**MISSED** ({n})"),
                (Some(false), None) => "**MISSED**".to_string(),
                (None, Some(n)) => format!("not judged: {n}"),
                (None, None) => "not measured".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {}{} | {} | {res} |",
                t.scenario,
                t.router,
                t.metric,
                t.baseline,
                fmt_ratio(t.ratio),
                fmt_ci(t.ci95),
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
            "| body | plain p50 ms | filter p50 ms | added p50 ms | plain p99 ms | filter p99 ms | added p99 ms | max req/s plain | max req/s filter | req/s ratio | Envoy CPU µs/req plain | filter | CPU ratio | target (added p50) |"
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
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
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.2}× | {:.1} | {:.1} | {:.2}× | {verdict} |",
                crate::report::overhead::size_label(c.body_bytes),
                c.plain_p50_ms,
                c.filter_p50_ms,
                c.added_p50_ms,
                c.plain_p99_ms,
                c.filter_p99_ms,
                c.added_p99_ms,
                c.plain_max_rps,
                c.filter_max_rps,
                c.rps_ratio,
                c.plain_cpu_us,
                c.filter_cpu_us,
                c.cpu_ratio
            );
        }
    }
    if !rep.overhead_arms.is_empty() {
        let _ = writeln!(
            out,
            "\n### Router overhead over direct (instant backend, every arm in one run)\n"
        );
        out.push_str(&crate::report::overhead::arms_table(&rep.overhead_arms));
    }
    diagnostics_table(&mut out, rep);
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
    use crate::analysis::stats::summarize;
    use crate::loadgen::client::Outcome;
    use crate::loadgen::{RunResult, Sample};

    /// A run whose TTFTs are `base * (1..=100)` ms and that served `ok` of 100 requests.
    fn run(base: f64, ok: usize, wall_s: f64) -> Summary {
        let samples = (0..100u64)
            .map(|i| Sample {
                id: i,
                model: "m".into(),
                at_ms: 0.0,
                lag_ms: 0.0,
                tag: None,
                group: None,
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
                    ..Outcome::default()
                },
            })
            .collect();
        summarize(&RunResult { samples, wall_s })
    }

    fn report() -> Report {
        let mut scenarios = BTreeMap::new();
        let mut mixed = ScenarioResult::default();
        mixed.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        mixed.insert("least_request".to_string(), run(2.0, 100, 10.0));
        mixed.insert("filter".to_string(), run(0.4, 100, 10.0)); // 0.04× RR, 0.2× LR
        mixed.insert("filter_gaie_weights".to_string(), run(1.5, 90, 10.0)); // p95 129 ms = 0.14× RR: miss
        scenarios.insert("mixed_gpu".to_string(), mixed);
        let mut uni = ScenarioResult::default();
        uni.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        uni.insert("filter".to_string(), run(10.3, 100, 11.1)); // TTFT within 5%, throughput 0.90×: miss
        scenarios.insert("uniform".to_string(), uni);
        // Tight intervals around each pooled ratio (as a many-seed run would give).
        let ratios = tight_ratios(&scenarios);
        let targets = check_targets(&scenarios, &ratios);
        Report {
            machine: Machine::default(),
            mode: "quick".into(),
            scenarios,
            ratios,
            targets,
            ..Report::default()
        }
    }

    fn tight_ratios(scenarios: &BTreeMap<String, ScenarioResult>) -> Vec<RatioRow> {
        let mut out = Vec::new();
        for t in targets() {
            for r in CHECKED_ROUTERS {
                if t.router.is_some_and(|only| only != r) {
                    continue;
                }
                if let Some(x) = ratio(scenarios, t.scenario, r, t.baseline, t.metric) {
                    out.push(RatioRow {
                        scenario: t.scenario.into(),
                        router: r.into(),
                        baseline: t.baseline.into(),
                        metric: t.metric.into(),
                        ratio: Some(x),
                        ci95: Some([x * 0.999, x * 1.001]),
                        seeds: 5,
                        per_seed: Vec::new(),
                    });
                }
            }
        }
        out
    }

    fn find<'a>(t: &'a [TargetResult], s: &str, r: &str, m: &str, b: &str) -> &'a TargetResult {
        t.iter()
            .find(|x| x.scenario == s && x.router == r && x.metric == m && x.baseline == b)
            .unwrap()
    }

    #[test]
    fn replicas_are_judged_against_one_gateway_on_the_prefix_hit_rate() {
        let mut scenarios = BTreeMap::new();
        let mut sp = ScenarioResult::default();
        let with_hits = |h: f64| {
            let mut x = run(1.0, 100, 10.0);
            x.extra.insert("prefix_hit_rate".into(), h);
            x
        };
        sp.insert("round_robin".to_string(), with_hits(0.4));
        sp.insert("filter".to_string(), with_hits(0.9));
        scenarios.insert("shared_prefix".to_string(), sp.clone());
        let row = |r: &str, h: f64| RatioRow {
            scenario: "shared_prefix".into(),
            router: r.into(),
            baseline: "filter".into(),
            metric: "prefix_hit_rate".into(),
            ratio: Some(h / 0.9),
            ci95: Some([h / 0.9 - 0.01, h / 0.9 + 0.01]),
            seeds: 5,
            per_seed: Vec::new(),
        };
        let judged = |h: f64| {
            let mut sc = scenarios.clone();
            if let Some(x) = sc.get_mut("shared_prefix") {
                x.insert("filter_x2".to_string(), with_hits(h));
            }
            let t = check_targets(&sc, &[row("filter_x2", h)]);
            // The one-gateway filter is never judged against itself.
            assert!(!t
                .iter()
                .any(|x| x.baseline == "filter" && x.router != "filter_x2"));
            find(
                &t,
                "shared_prefix",
                "filter_x2",
                "prefix_hit_rate",
                "filter",
            )
            .met
        };
        assert_eq!(judged(0.89), Some(true));
        assert_eq!(judged(0.86), Some(false));
        // Without a replica run there is nothing to judge.
        assert!(!check_targets(&scenarios, &[])
            .iter()
            .any(|x| x.baseline == "filter"));
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
        assert_eq!(f.ci95.unwrap()[1], 0.04 * 1.001);
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
        // 10 failed requests count as +∞: p95 is unbounded, written as null.
        assert!(g["ttft_p95_ms"].is_null());
        assert_eq!(g["ttft_p50_ms"], 1.5 * 50.0);
        assert!(g["goodput_rps"].is_null());
        assert!(v["scenarios"]["mixed_gpu"]["condition_met"].is_null());
        assert!(v["scenarios"]["mixed_gpu"].get("floor_ms").is_some());
        let r = &v["ratios"][0];
        assert!(r["ci95"].is_array() && r["ci95"][0].is_number(), "{r}");
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
        assert!(row.contains("1.00×"), "{row}");
        assert!(row.contains("0.04× [0.04, 0.04] ✅"), "{row}");
        let gaie = rr_table
            .lines()
            .find(|l| l.starts_with("| mixed_gpu | filter_gaie_weights |"))
            .unwrap();
        // 10 % errors: p95 is ∞ and misses.
        assert!(gaie.contains("∞ [∞, ∞] ❌ miss"), "{gaie}");
        assert!(!rr_table.contains("| mixed_gpu | round_robin |"));
        let abs = md
            .split("### Absolute figures")
            .nth(1)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("| mixed_gpu | filter_gaie_weights | "))
            .unwrap();
        // TTFT p50 over 100 requests (10 failed = ∞) = 1.5 × 50; p95 = ∞; errors by kind.
        assert!(abs.contains("| 75.0 | ∞ |"), "{abs}");
        assert!(abs.contains("| 10 (500:10) |"), "{abs}");
        assert!(md.contains("**MISSED**"));
    }

    #[test]
    fn interval_widths_are_summarised_per_metric() {
        let mut rep = report();
        rep.ratios.push(RatioRow {
            scenario: "uniform".into(),
            router: "filter".into(),
            baseline: "round_robin".into(),
            metric: "ttft_p95_ms".into(),
            ratio: Some(2.0),
            ci95: Some([1.0, 3.0]),
            seeds: 5,
            per_seed: Vec::new(),
        });
        let w = ci_width_summary(&rep);
        assert_eq!(w["ttft_p95_ms"].ratios, 4);
        // Three tight rows (width 0.002; the ∞ ratio has no finite width) and one of width 1.0.
        assert!((w["ttft_p95_ms"].median - 0.002).abs() < 1e-9);
        assert_eq!(w["ttft_p95_ms"].widest, 1.0);
        rep.ci_widths = w;
        let v = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["ci_widths"]["ttft_p95_ms"]["widest"], 1.0);
        assert!(markdown(&rep).contains("| ttft_p95_ms | 4 | 0 % | 100 % |"));
    }

    #[test]
    fn targets_need_the_worse_end_of_the_interval() {
        let mut scenarios = BTreeMap::new();
        let mut mixed = ScenarioResult::default();
        mixed.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        mixed.insert("least_request".to_string(), run(1.0, 100, 10.0));
        mixed.insert("filter".to_string(), run(0.4, 100, 10.0)); // 0.04× RR
        scenarios.insert("mixed_gpu".to_string(), mixed);
        let row = |lo: f64, hi: f64| RatioRow {
            scenario: "mixed_gpu".into(),
            router: "filter".into(),
            baseline: "round_robin".into(),
            metric: "ttft_p95_ms".into(),
            ratio: Some(0.04),
            ci95: Some([lo, hi]),
            seeds: 5,
            per_seed: Vec::new(),
        };
        let p95 = |ratios: &[RatioRow]| {
            find(
                &check_targets(&scenarios, ratios),
                "mixed_gpu",
                "filter",
                "ttft_p95_ms",
                "round_robin",
            )
            .clone()
        };
        // Point 0.04 meets ≤ 0.05, but the interval reaches 0.06: missed.
        assert_eq!(p95(&[row(0.03, 0.06)]).met, Some(false));
        assert_eq!(p95(&[row(0.03, 0.049)]).met, Some(true));
        // No interval: not judged, whatever the point estimate.
        let t = p95(&[]);
        assert_eq!((t.met, t.ratio), (None, Some(0.04)));
        assert!(t.note.unwrap().contains("no interval"));
        // Above 1 % errors: missed whatever the latency.
        let mut bad = scenarios.clone();
        bad.get_mut("mixed_gpu")
            .unwrap()
            .insert("filter".into(), run(0.4, 98, 10.0));
        let t = find(
            &check_targets(&bad, &[row(0.03, 0.049)]),
            "mixed_gpu",
            "filter",
            "ttft_p95_ms",
            "round_robin",
        )
        .clone();
        assert_eq!(t.met, Some(false));
        assert!(t.note.unwrap().contains("error rate 2.0 %"));
    }

    #[test]
    fn sweep_points_are_judged_by_their_load_band() {
        // The filter at 0.9× round robin (the best other here) at p50 and p95: it meets the
        // light-load bound (≤ 1.05×) and misses the ≤ 0.8× one; which is judged depends on the
        // run's load alone.
        let bounds_at = |load: Option<f64>| {
            let mut lora = ScenarioResult {
                load_of_capacity: load,
                ..ScenarioResult::default()
            };
            lora.insert("round_robin".to_string(), run(10.0, 100, 10.0));
            lora.insert("filter".to_string(), run(9.0, 100, 10.0));
            let scenarios = BTreeMap::from([("vllm_lora".to_string(), lora)]);
            let rows: Vec<RatioRow> = ["ttft_p50_ms", "ttft_p95_ms"]
                .iter()
                .map(|m| RatioRow {
                    scenario: "vllm_lora".into(),
                    router: "filter".into(),
                    baseline: "round_robin".into(),
                    metric: (*m).into(),
                    ratio: Some(0.9),
                    ci95: Some([0.89, 0.91]),
                    seeds: 10,
                    per_seed: Vec::new(),
                })
                .collect();
            let mut judged: Vec<(String, String, Option<bool>)> = check_targets(&scenarios, &rows)
                .into_iter()
                .filter(|t| t.baseline.starts_with("best other"))
                .map(|t| (t.metric, t.target, t.met))
                .collect();
            judged.sort();
            judged
        };
        let light = |m: &str| (m.to_string(), "≤ 1.05×".to_string(), Some(true));
        let busy = ("ttft_p95_ms".to_string(), "≤ 0.8×".to_string(), Some(false));
        assert_eq!(
            bounds_at(Some(0.3)),
            vec![light("ttft_p50_ms"), light("ttft_p95_ms")]
        );
        assert_eq!(bounds_at(Some(0.8)), vec![busy.clone()]);
        // The scenario's nominal rate is not a light load.
        assert_eq!(bounds_at(None), vec![busy.clone()]);
        // 50 % belongs to both bands.
        assert_eq!(
            bounds_at(Some(0.5)),
            vec![light("ttft_p50_ms"), busy, light("ttft_p95_ms")]
        );
    }

    #[test]
    fn a_scenario_whose_condition_failed_is_reported_invalid() {
        let mut scenarios = BTreeMap::new();
        let mut b = ScenarioResult {
            condition: "round_robin preempts".into(),
            condition_met: Some(false),
            ..ScenarioResult::default()
        };
        b.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        b.insert("filter".to_string(), run(0.5, 100, 10.0)); // 0.05×: would meet ≤ 0.1×
        scenarios.insert("bursty".to_string(), b);
        let row = RatioRow {
            scenario: "bursty".into(),
            router: "filter".into(),
            baseline: "round_robin".into(),
            metric: "ttft_p99_ms".into(),
            ratio: Some(0.05),
            ci95: Some([0.04, 0.06]),
            seeds: 5,
            per_seed: Vec::new(),
        };
        let t = check_targets(&scenarios, std::slice::from_ref(&row));
        let p99 = find(&t, "bursty", "filter", "ttft_p99_ms", "round_robin");
        assert_eq!(p99.met, None);
        assert!(p99.note.as_deref().unwrap().starts_with("scenario invalid"));
        let rep = Report {
            scenarios: scenarios.clone(),
            targets: t,
            ..Report::default()
        };
        let md = markdown(&rep);
        assert!(md.contains("**no: scenario invalid**"), "{md}");
        assert!(md.contains("not judged: scenario invalid"), "{md}");
        // The same figures with the condition met are judged.
        scenarios.get_mut("bursty").unwrap().condition_met = Some(true);
        let t = check_targets(&scenarios, &[row]);
        assert_eq!(
            find(&t, "bursty", "filter", "ttft_p99_ms", "round_robin").met,
            Some(true)
        );
    }

    #[test]
    fn better_than_a_band_is_noted_not_called_a_loss() {
        let mut scenarios = BTreeMap::new();
        let mut uni = ScenarioResult::default();
        uni.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        uni.insert("filter".to_string(), run(8.0, 100, 10.0)); // 0.8×: better than the band
        scenarios.insert("uniform".to_string(), uni);
        let ratios = tight_ratios(&scenarios);
        let t = check_targets(&scenarios, &ratios);
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
    fn the_best_other_router_is_the_best_at_each_metric_of_every_router_but_the_filters() {
        let mut sp = ScenarioResult::default();
        sp.insert("round_robin".to_string(), run(10.0, 100, 10.0));
        sp.insert("filter".to_string(), run(2.0, 100, 10.0));
        sp.insert("filter_x2".to_string(), run(0.1, 100, 10.0));
        // SMG's cache_aware has the lowest p50 but not the lowest p95.
        let mut smg = run(3.0, 100, 10.0);
        smg.ttft_p50_ms = 1.0;
        sp.insert("smg_cache_aware".to_string(), smg);
        sp.insert("vllm_router_cache_aware".to_string(), run(2.5, 100, 10.0));
        let mut nan = run(1.0, 100, 10.0);
        nan.ttft_p95_ms = f64::NAN;
        sp.insert("vllm_router_power_of_two".to_string(), nan);
        // Envoy's weighted round robin is an other router too, and the best at p99 here.
        let mut wrr = run(4.0, 100, 10.0);
        wrr.ttft_p99_ms = 0.5;
        sp.insert("weighted_rr".to_string(), wrr);
        assert_eq!(
            best_other(&sp, "ttft_p95_ms").as_deref(),
            Some("vllm_router_cache_aware")
        );
        assert_eq!(
            best_other(&sp, "ttft_p50_ms").as_deref(),
            Some("smg_cache_aware")
        );
        assert_eq!(
            best_other(&sp, "ttft_p99_ms").as_deref(),
            Some("weighted_rr")
        );
        assert_eq!(best_other(&ScenarioResult::default(), "ttft_p95_ms"), None);
        assert!(higher_is_better("prefix_hit_rate") && !higher_is_better("ttft_p90_ms"));
        sp.best_other = best_other(&sp, "ttft_p95_ms");
        let mut scenarios = BTreeMap::new();
        scenarios.insert("shared_prefix".to_string(), sp);
        let ratios = vec![RatioRow {
            scenario: "shared_prefix".into(),
            router: "filter".into(),
            baseline: "vllm_router_cache_aware".into(),
            metric: "ttft_p95_ms".into(),
            ratio: Some(0.8),
            ci95: Some([0.7, 0.95]),
            seeds: 10,
            per_seed: Vec::new(),
        }];
        // The floor's rows (the run adds one per other router and percentile).
        let floor = RatioRow {
            router: FLOOR.into(),
            ratio: Some(0.5),
            ci95: Some([0.4, 0.62]),
            ..ratios[0].clone()
        };
        let ratios = [ratios, vec![floor]].concat();
        let rep = Report {
            scenarios,
            ratios,
            ..Report::default()
        };
        let md = markdown(&rep);
        let table = md
            .split("### The filter vs round robin and vs the best other router")
            .nth(1)
            .and_then(|t| t.split("###").next())
            .unwrap();
        let row = table
            .lines()
            .find(|l| l.starts_with("| shared_prefix | filter |"))
            .unwrap();
        // p95 ÷ RR (0.2×) then ÷ the best other at p95, named.
        assert!(
            row.contains("| 0.20× | 0.80× [0.70, 0.95] (vllm_router_cache_aware) |"),
            "{row}"
        );
        // Only the filter routers are rows of it, and the floor, against the same best other.
        assert!(!table.contains("| smg_cache_aware |"));
        let floor_row = table
            .lines()
            .find(|l| l.starts_with("| shared_prefix | *floor"))
            .unwrap();
        assert!(
            floor_row.contains("| – | 0.50× [0.40, 0.62] (vllm_router_cache_aware) |"),
            "{floor_row}"
        );
        // The floor is no router: no target judges it, no interval width counts it.
        assert!(check_targets(&rep.scenarios, &rep.ratios)
            .iter()
            .all(|x| x.router != FLOOR));
        assert_eq!(ci_width_summary(&rep)["ttft_p95_ms"].ratios, 1);
        let v = serde_json::to_value(&rep).unwrap();
        assert_eq!(
            v["scenarios"]["shared_prefix"]["best_other"],
            "vllm_router_cache_aware"
        );
        // The p95 target (≤ 0.9×) is judged on that router's row: 0.95 > 0.9, missed.
        let t = check_targets(&rep.scenarios, &rep.ratios);
        let vs = t
            .iter()
            .find(|x| x.baseline == "best other (vllm_router_cache_aware)")
            .unwrap();
        assert_eq!(
            (vs.metric.as_str(), vs.ratio, vs.met, vs.router.as_str()),
            ("ttft_p95_ms", Some(0.8), Some(false), "filter")
        );
        // The p90 target's baseline is the best at p90 (no interval here: not judged).
        assert!(t
            .iter()
            .any(|x| x.metric == "ttft_p90_ms" && x.baseline.starts_with("best other (")));
        // Only the filter is judged against the others, never the replicas.
        assert!(t
            .iter()
            .filter(|x| x.baseline.starts_with("best other"))
            .all(|x| x.router == "filter"));
    }

    #[test]
    fn the_cpu_id_tells_hosts_of_one_model_name_apart() {
        let zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx avx2\n\nprocessor\t: 1\ncpu family\t: 99\n";
        assert_eq!(
            cpu_id(zen3),
            "family 25 model 1 stepping 1, AVX-512 no, AMX no"
        );
        let xeon = "cpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R)\nstepping\t: 8\nflags\t\t: avx2 avx512f amx_tile\n";
        assert_eq!(
            cpu_id(xeon),
            "family 6 model 143 stepping 8, AVX-512 yes, AMX yes"
        );
        assert_eq!(cpu_id(""), "");
    }

    #[test]
    fn utc_now_is_well_formed() {
        let s = utc_now();
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }
}
