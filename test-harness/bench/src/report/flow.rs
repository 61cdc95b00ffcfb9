//! What `bench flow` measured and its Markdown: per experiment, every arm's figures (all
//! requests, per band or tenant) and the checks ([`crate::report::verdicts::checks`]'s).

use crate::analysis::confidence::{ratio_cis, RunData, Stat};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Figures of one group of requests (a band, a tenant, or all) of one arm, pooled over seeds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Figures {
    /// Requests that arrived in the window.
    pub requests: usize,
    /// Served (2xx, complete stream).
    pub served: usize,
    /// Refused with 429.
    pub refused: usize,
    /// Of those, refused only after the TTFT SLO had passed: the client waited as long as a
    /// failure costs it, so the overload checks count these as failures.
    pub refused_late: usize,
    /// Neither: an error other than 429, a cut stream, a timeout.
    pub lost: usize,
    /// TTFT percentiles, emulated ms, failures (refusals included) +∞.
    pub ttft_p50_ms: f64,
    /// p95.
    pub ttft_p95_ms: f64,
    /// p99.
    pub ttft_p99_ms: f64,
    /// Served requests per emulated second of window.
    pub throughput_rps: f64,
    /// Served requests with TTFT within the scenario's SLO per emulated second (goodput).
    pub goodput_rps: f64,
    /// End-to-end p95, emulated ms, failures +∞ (what over-admitting costs after the first token).
    pub e2e_p95_ms: f64,
    /// Output tokens of served requests per emulated second.
    pub output_tokens_per_s: f64,
}

/// One arm's results.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    /// Router name.
    pub router: String,
    /// Scenario variant.
    pub scenario: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Runs the protocol's checks invalidated (step lateness), with the reason.
    pub invalid: Vec<String>,
    /// All window requests.
    pub all: Figures,
    /// By the request's tag (band or tenant), when it had one.
    pub by_tag: BTreeMap<String, Figures>,
    /// Preemptions per run (`vllm:num_preemptions_total` over the window, mean over seeds).
    pub preemptions: Option<f64>,
    /// 429s by `x-llm-router-dropped-reason`.
    pub refusals: BTreeMap<String, usize>,
    /// Lost requests by cause (HTTP status, `timeout` — still open when the run's drain ended —,
    /// `transport`, `stream`).
    pub lost_by_cause: BTreeMap<String, usize>,
    /// What the gateway counted over whole runs (warm-up and tail included), summed over seeds:
    /// the filter's decisions and flow outcomes, the sidecar's scrapes
    /// ([`crate::stack::Gateway::counts`]); empty for a peer.
    pub gateway: BTreeMap<String, f64>,
    /// Served requests by the model name the rewrite chose (`x-llm-router-served-model`).
    pub served_models: BTreeMap<String, usize>,
    /// The same, per run (seed).
    pub served_models_by_run: Vec<BTreeMap<String, usize>>,
    #[serde(skip)]
    pub(crate) runs: Vec<(RunData, BTreeMap<u64, String>)>,
}

/// One judged target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Check {
    /// What is measured.
    pub what: String,
    /// The measured value (a ratio, a share, a count).
    pub value: Option<f64>,
    /// Its 95 % interval, for ratios.
    pub ci95: Option<[f64; 2]>,
    /// The target, as the issue states it.
    pub target: String,
    /// Whether the point estimate meets it (`None`: not measurable in this run).
    pub met: Option<bool>,
}

/// One experiment's arms and checks.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    /// `bands`, `tenants`, `overload`, `canary`.
    pub name: String,
    /// What the scenario is.
    pub about: String,
    /// The TTFT SLO of goodput, emulated ms.
    pub slo_ms: f64,
    /// Every client request stated it in `x-slo-ttft-ms` (`--slo-header`).
    pub slo_header: bool,
    /// Bands: the critical requests' TTFT p99 with each alone on an idle pod of the fleet
    /// (the first seed's window), emulated ms.
    pub critical_floor_p99_ms: Option<f64>,
    /// Every arm.
    pub arms: Vec<ArmResult>,
    /// The targets.
    pub checks: Vec<Check>,
}

/// Everything `bench flow` measured.
#[derive(Debug, Clone, Serialize)]
pub struct FlowReport {
    /// `quick` or `full`.
    pub mode: String,
    /// Emulator speed-up.
    pub speedup: f64,
    /// Seeds per arm.
    pub seeds: usize,
    /// The experiments run.
    pub experiments: Vec<Experiment>,
}

/// Keep the observations of the ids `keep` accepts.
pub(crate) fn subset(d: &RunData, keep: impl Fn(u64) -> bool) -> RunData {
    RunData {
        obs: d
            .obs
            .iter()
            .filter(|(id, _)| keep(**id))
            .map(|(k, v)| (*k, *v))
            .collect(),
        ..d.clone()
    }
}

/// Each run's observations of the requests tagged `tag` (`None`: every request).
pub(crate) fn select(runs: &[(RunData, BTreeMap<u64, String>)], tag: Option<&str>) -> Vec<RunData> {
    runs.iter()
        .map(|(d, tags)| match tag {
            None => d.clone(),
            Some(t) => subset(d, |id| tags.get(&id).map(String::as_str) == Some(t)),
        })
        .collect()
}

/// `stat(a's requests tagged tag_a) ÷ stat(b's tagged tag_b)`, paired by seed and request id
/// (`None` tag: every request).
pub(crate) fn ratio(
    a: &ArmResult,
    b: &ArmResult,
    tag: Option<&str>,
    stat: Stat,
) -> (Option<f64>, Option<[f64; 2]>) {
    let r = ratio_cis(&select(&a.runs, tag), &select(&b.runs, tag), &[stat]);
    r.first().map_or((None, None), |r| (r.ratio, r.ci95))
}

fn num(x: f64) -> String {
    if x.is_nan() {
        "–".into()
    } else if x.is_infinite() {
        "∞".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// The report: per experiment, a table of every arm and group, then the checks.
pub fn markdown(rep: &FlowReport) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Flow control: bands, tenants, overload, canary ({} mode, speed-up {}, {} seed(s) per arm)\n",
        rep.mode, rep.speedup, rep.seeds
    );
    md.push_str(
        "TTFT in emulated ms, failures and refusals +∞ (Benchmark v2). Goodput: requests served \
         with TTFT within the SLO per emulated second. Produced by `bench flow`.\n",
    );
    for e in &rep.experiments {
        let _ = writeln!(md, "\n## {} — {}\n", e.name, e.about);
        let _ = writeln!(md, "SLO (goodput): TTFT ≤ {} ms.\n", num(e.slo_ms));
        if e.slo_header {
            md.push_str(
                "Every client request states that SLO in `x-slo-ttft-ms` (llm-d's header; the \
                 same requests for every router, only the filter reads it).\n\n",
            );
        }
        md.push_str(
            "| router | scenario | group | requests | served | 429 (late) | lost | TTFT p50 | p95 | p99 | goodput/s | e2e p95 | tokens/s | preemptions |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for a in &e.arms {
            let pre = a.preemptions.map_or("–".to_string(), num);
            let groups = std::iter::once(("all", &a.all))
                .chain(a.by_tag.iter().map(|(k, v)| (k.as_str(), v)));
            for (g, f) in groups {
                let _ = writeln!(
                    md,
                    "| {} | {} | {g} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} |",
                    a.router,
                    a.scenario,
                    f.requests,
                    f.served,
                    f.refused,
                    f.refused_late,
                    f.lost,
                    num(f.ttft_p50_ms),
                    num(f.ttft_p95_ms),
                    num(f.ttft_p99_ms),
                    num(f.goodput_rps),
                    num(f.e2e_p95_ms),
                    num(f.output_tokens_per_s),
                    if g == "all" { pre.as_str() } else { "" },
                );
            }
            let counted = |m: &BTreeMap<String, usize>| -> Vec<String> {
                m.iter().map(|(k, v)| format!("{k} {v}")).collect()
            };
            let gateway: Vec<String> = a
                .gateway
                .iter()
                .map(|(k, v)| format!("{k} {}", num(*v)))
                .collect();
            for (label, items) in [
                ("429 by reason", counted(&a.refusals)),
                ("lost by cause", counted(&a.lost_by_cause)),
                ("gateway (whole runs)", gateway),
                ("invalid runs", a.invalid.clone()),
            ] {
                if !items.is_empty() {
                    let sep = if label == "invalid runs" { "; " } else { ", " };
                    let _ = writeln!(
                        md,
                        "| | | {label}: {} | | | | | | | | | | | |",
                        items.join(sep)
                    );
                }
            }
        }
        md.push_str("\n| target | measured | 95 % CI | wanted | met |\n|---|---|---|---|---|\n");
        for c in &e.checks {
            let ci = c.ci95.map_or("–".to_string(), |c| {
                format!("[{}, {}]", num(c[0]), num(c[1]))
            });
            let met = match c.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            };
            let _ = writeln!(
                md,
                "| {} | {} | {ci} | {} | {met} |",
                c.what,
                c.value.map_or("–".to_string(), num),
                c.target
            );
        }
    }
    md
}
