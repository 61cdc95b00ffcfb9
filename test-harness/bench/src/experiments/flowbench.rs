//! `bench flow`: the flow-control scenarios (issue 21) under the routers they compare, with
//! the per-band and per-tenant figures the standard report does not have, judged against the
//! issue's targets.
//!
//! Every run is the Benchmark v2 protocol ([`run_windowed`]: fresh pods and gateway, the
//! warm-up excluded, failed requests +∞ in every percentile, so no router gains by refusing):
//!
//! - **bands** (`flow_bands`): critical TTFT p99 ≤ 0.05× round robin's; sheddable requests
//!   refused before standard ones (a larger share of them, and standard ones only if
//!   sheddable ones too). The whole traffic's p99 and preemptions are shown beside.
//! - **tenants** (`flow_tenants`, `flow_tenants_alone`): the light tenant's TTFT p95 in the
//!   saturated pool ≤ 1.2× its p95 alone — the same requests at the same times, the same router.
//! - **overload** (`flow_overload`): 60 emulated seconds at 1.5× capacity from an idle fleet;
//!   goodput (requests served with TTFT within the SLO, per emulated second) ≥ round robin's and
//!   the best peer's; nothing lost (each request served or refused with 429).
//! - **canary** (`flow_canary`): the share served by the canary within ±1 percentage point of
//!   its weight.
//!
//! Ratios come with per-seed log-ratio t intervals over the seeds ([`crate::analysis::confidence::ratio_cis`]).

use crate::analysis::confidence::{pooled, RunData, Stat};
use crate::analysis::stats::error_kind;
use crate::experiments::runner::{run_windowed, RunOutcome, Windows};
use crate::experiments::scenarios::{floor_percentile_ms, flow_scenario, Mode, Scenario};
use crate::loadgen::workload::generate;
use crate::loadgen::Sample;
#[cfg(test)]
use crate::report::flow::Check;
use crate::report::flow::{markdown, select, ArmResult, Experiment, Figures, FlowReport};
use crate::report::verdicts::checks;
#[cfg(test)]
use crate::scenario_names::CANARY_TARGET;
use crate::stack::RouterKind;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The experiments, in run order (`overload_vllm` on real vLLM pods: only when named).
pub const EXPERIMENTS: [&str; 4] = ["bands", "tenants", "overload", "canary"];

/// Experiments run only when named: they need `./build.sh setup-vllm`.
pub const REAL_EXPERIMENTS: [&str; 1] = ["overload_vllm"];

/// What `bench flow` runs.
#[derive(Debug, Clone)]
pub struct FlowBenchConfig {
    /// Quick or full, speed-up; `seed` is the first seed.
    pub mode: Mode,
    /// Seeds per arm.
    pub seeds: usize,
    /// Experiments to run (empty: all).
    pub experiments: Vec<String>,
    /// Include SMG's `cache_aware` (SGLang's gateway, its default policy).
    pub peers: bool,
    /// Only the arms of these routers (empty: every arm), e.g. the filter alone while its
    /// overload behaviour is studied.
    pub routers: Vec<String>,
    /// In the overload experiments every client states the SLO it is judged by in llm-d's
    /// `x-slo-ttft-ms` header (every router gets the same requests; only the filter reads it).
    pub slo_header: bool,
    /// Where `flow.{json,md}` go.
    pub out_dir: PathBuf,
}

/// One router on one scenario variant.
#[derive(Debug, Clone, Copy)]
struct Arm {
    router: RouterKind,
    scenario: &'static str,
}

fn arms(exp: &str, peers: bool) -> Vec<Arm> {
    let arm = |router, scenario| Arm { router, scenario };
    let peer = RouterKind::SmgCacheAware;
    let mut v = match exp {
        "bands" => vec![
            arm(RouterKind::RoundRobin, "flow_bands"),
            arm(RouterKind::Filter, "flow_bands"),
        ],
        "tenants" => vec![
            arm(RouterKind::RoundRobin, "flow_tenants"),
            arm(RouterKind::RoundRobin, "flow_tenants_alone"),
            arm(RouterKind::Filter, "flow_tenants"),
            arm(RouterKind::Filter, "flow_tenants_alone"),
        ],
        // Beside the unbounded routers, round robin with Envoy's admission (circuit breakers,
        // overflow answered 429) at the scenario's bound ([`crate::experiments::scenarios::admission_for`]).
        "overload" => vec![
            arm(RouterKind::RoundRobin, "flow_overload"),
            arm(RouterKind::LeastRequest, "flow_overload"),
            arm(RouterKind::RoundRobinAdmission, "flow_overload"),
            arm(RouterKind::Filter, "flow_overload"),
        ],
        "canary" => vec![arm(RouterKind::Filter, "flow_canary")],
        // On real vLLM both peers' default policy: SMG's and vllm-router's own.
        "overload_vllm" => vec![
            arm(RouterKind::RoundRobin, "flow_overload_vllm"),
            arm(RouterKind::LeastRequest, "flow_overload_vllm"),
            arm(RouterKind::RoundRobinAdmission, "flow_overload_vllm"),
            arm(RouterKind::Filter, "flow_overload_vllm"),
            arm(RouterKind::VllmRouterCacheAware, "flow_overload_vllm"),
        ],
        _ => vec![],
    };
    if peers && matches!(exp, "bands" | "overload" | "overload_vllm") {
        let scenario = match exp {
            "bands" => "flow_bands",
            "overload" => "flow_overload",
            _ => "flow_overload_vllm",
        };
        v.push(arm(peer, scenario));
        // And the peer with its own admission on, sized as Envoy's.
        if exp != "bands" {
            v.push(arm(RouterKind::SmgCacheAwareAdmission, scenario));
        }
    }
    v
}

/// The figures of the requests tagged `tag` (`None`: all) over every run of an arm.
fn figures(
    runs: &[(RunData, BTreeMap<u64, String>)],
    samples: &[Vec<Sample>],
    slo_ms: f64,
    tag: Option<&str>,
) -> Figures {
    let data = select(runs, tag);
    let keep = |s: &Sample| tag.is_none() || s.tag.as_deref() == tag;
    let mut f = Figures::default();
    for s in samples.iter().flatten().filter(|s| keep(s)) {
        f.requests += 1;
        if s.outcome.ok() {
            f.served += 1;
        } else if s.outcome.status == 429 {
            f.refused += 1;
            f.refused_late += usize::from(s.outcome.e2e_ms > slo_ms);
        } else {
            f.lost += 1;
        }
    }
    f.ttft_p50_ms = pooled(Stat::Ttft(50.0), &data);
    f.ttft_p95_ms = pooled(Stat::Ttft(95.0), &data);
    f.ttft_p99_ms = pooled(Stat::Ttft(99.0), &data);
    f.throughput_rps = pooled(Stat::Throughput, &data);
    f.goodput_rps = pooled(Stat::WithinSlo(slo_ms), &data);
    f.e2e_p95_ms = pooled(Stat::E2e(95.0), &data);
    f.output_tokens_per_s = pooled(Stat::TokensPerS, &data);
    f
}

fn arm_result(arm: Arm, outcomes: &[RunOutcome], slo_ms: f64) -> ArmResult {
    let pre: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| o.summary.extra.get("preemptions").copied())
        .collect();
    let mut a = arm_from(
        arm.router.name(),
        arm.scenario,
        outcomes
            .iter()
            .map(|o| (o.data.clone(), o.window.clone()))
            .collect(),
        slo_ms,
    );
    a.seeds = outcomes.iter().map(|o| o.seed).collect();
    a.invalid = outcomes.iter().filter_map(|o| o.invalid.clone()).collect();
    a.preemptions = (!pre.is_empty()).then(|| pre.iter().sum::<f64>() / pre.len() as f64);
    for o in outcomes {
        for (k, v) in &o.summary.extra {
            if let Some(name) = k.strip_prefix("gateway_") {
                *a.gateway.entry(name.to_string()).or_default() += v;
            }
        }
    }
    // A mean is not a sum: the sidecar's mean scrape time over the seeds.
    if let Some(m) = a.gateway.get_mut("sidecar_scrape_mean_ms") {
        *m /= outcomes.len().max(1) as f64;
    }
    a
}

/// An arm's figures from its runs: each run's window observations and samples (tags, statuses,
/// refusal reasons, served models).
fn arm_from(
    router: &str,
    scenario: &str,
    runs: Vec<(RunData, Vec<Sample>)>,
    slo_ms: f64,
) -> ArmResult {
    let (data, samples): (Vec<RunData>, Vec<Vec<Sample>>) = runs.into_iter().unzip();
    let runs: Vec<(RunData, BTreeMap<u64, String>)> = data
        .into_iter()
        .zip(&samples)
        .map(|(d, ss)| {
            let tags = ss
                .iter()
                .filter_map(|s| s.tag.clone().map(|t| (s.id, t)))
                .collect();
            (d, tags)
        })
        .collect();
    let all = figures(&runs, &samples, slo_ms, None);
    let mut tags: Vec<String> = samples
        .iter()
        .flatten()
        .filter_map(|s| s.tag.clone())
        .collect();
    tags.sort();
    tags.dedup();
    let by_tag = tags
        .into_iter()
        .map(|t| {
            let f = figures(&runs, &samples, slo_ms, Some(&t));
            (t, f)
        })
        .collect();
    let mut refusals = BTreeMap::new();
    let mut lost_by_cause = BTreeMap::new();
    let mut served_models = BTreeMap::new();
    let mut served_models_by_run = Vec::new();
    for run in &samples {
        let mut models = BTreeMap::new();
        for s in run {
            if s.outcome.status == 429 {
                let r = s.outcome.dropped_reason.clone().unwrap_or_default();
                *refusals.entry(r).or_insert(0) += 1;
            } else if !s.outcome.ok() {
                let cause = error_kind(s.outcome.status, s.outcome.error.as_deref().unwrap_or(""));
                *lost_by_cause.entry(cause).or_insert(0) += 1;
            }
            if s.outcome.ok() {
                if let Some(m) = &s.outcome.served_model {
                    *served_models.entry(m.clone()).or_insert(0) += 1;
                    *models.entry(m.clone()).or_insert(0) += 1;
                }
            }
        }
        served_models_by_run.push(models);
    }
    ArmResult {
        router: router.to_string(),
        scenario: scenario.to_string(),
        seeds: runs.iter().map(|(d, _)| d.seed).collect(),
        invalid: Vec::new(),
        all,
        by_tag,
        preemptions: None,
        refusals,
        lost_by_cause,
        gateway: BTreeMap::new(),
        served_models,
        served_models_by_run,
        runs,
    }
}

/// The windows of an experiment's runs: the protocol's for the scenario (the mixed workload's
/// for both tenant variants, so the light tenant alone is measured on the same requests); the
/// whole 60 s for overload and the whole run for the canary.
fn windows(exp: &str, sc: &Scenario, mode: &Mode, seeds: usize) -> Windows {
    match exp {
        "overload" | "overload_vllm" | "canary" => Windows::whole(sc),
        "tenants" => {
            let mix = flow_scenario(
                "flow_tenants",
                Mode {
                    seed: sc.workload.seed,
                    ..*mode
                },
            );
            Windows::for_scenario(mix.as_ref().unwrap_or(sc), mode, seeds, false)
        }
        _ => Windows::for_scenario(sc, mode, seeds, false),
    }
}

/// The TTFT p99 of the window's critical requests, each alone on an idle pod (emulated ms).
fn critical_floor_ms(sc: &Scenario, w: &Windows) -> f64 {
    let mut wl = sc.workload.clone();
    wl.horizon = w.warmup + w.window;
    let crit: Vec<_> = generate(&wl)
        .into_iter()
        .filter(|r| r.header.as_ref().is_some_and(|h| h.1 == "critical"))
        .collect();
    floor_percentile_ms(&sc.fleet, &crit, w.warmup, 99.0) * sc.fleet.speedup
}

/// Run one experiment: every arm, every seed.
pub async fn run_experiment(exp: &str, cfg: &FlowBenchConfig) -> Result<Experiment, String> {
    let all = arms(exp, cfg.peers);
    let known = !all.is_empty();
    let list: Vec<Arm> = all
        .into_iter()
        .filter(|a| cfg.routers.is_empty() || cfg.routers.iter().any(|r| r == a.router.name()))
        .collect();
    if known && list.is_empty() {
        return Err(format!(
            "experiment {exp} has no arm for routers {}",
            cfg.routers.join(", ")
        ));
    }
    if list.is_empty() {
        return Err(format!(
            "unknown experiment {exp} (known: {})",
            EXPERIMENTS
                .iter()
                .chain(&REAL_EXPERIMENTS)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut results = Vec::new();
    let (mut about, mut slo_ms) = (String::new(), f64::NAN);
    let mut floor = None;
    for arm in list {
        let mut outcomes = Vec::new();
        for i in 0..cfg.seeds.max(1) {
            let mode = Mode {
                seed: cfg.mode.seed + i as u64,
                ..cfg.mode
            };
            let mut sc = flow_scenario(arm.scenario, mode)
                .ok_or_else(|| format!("no scenario {}", arm.scenario))?;
            if cfg.slo_header && exp.starts_with("overload") {
                sc.client_headers.push((
                    crate::experiments::scenarios::SLO_HEADER.to_string(),
                    format!("{:.0}", sc.slo_ttft_ms),
                ));
            }
            if about.is_empty() {
                about = sc.about.to_string();
            }
            // Goodput's SLO in emulated ms (the samples are emulated).
            slo_ms = sc.slo_ttft_ms * sc.fleet.speedup;
            let w = windows(exp, &sc, &cfg.mode, cfg.seeds);
            if exp == "bands" && floor.is_none() {
                floor = Some(critical_floor_ms(&sc, &w));
            }
            eprintln!(
                "bench flow: {exp}: {} on {} seed {} ({:.0} s of arrivals)",
                arm.router.name(),
                arm.scenario,
                mode.seed,
                (w.warmup + w.window + w.tail).as_secs_f64()
            );
            let o = run_windowed(&sc, arm.router, w).await?;
            outcomes.push(o);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        results.push(arm_result(arm, &outcomes, slo_ms));
    }
    let checks = checks(exp, &results, slo_ms, floor);
    Ok(Experiment {
        name: exp.to_string(),
        about,
        slo_ms,
        slo_header: cfg.slo_header && exp.starts_with("overload"),
        critical_floor_p99_ms: floor,
        arms: results,
        checks,
    })
}

/// Run the configured experiments, writing `flow.{json,md}` after each.
pub async fn run_flow(cfg: &FlowBenchConfig) -> Result<FlowReport, String> {
    let names: Vec<String> = if cfg.experiments.is_empty() {
        EXPERIMENTS.iter().map(|s| s.to_string()).collect()
    } else {
        cfg.experiments.clone()
    };
    let mut rep = FlowReport {
        mode: if cfg.mode.quick { "quick" } else { "full" }.to_string(),
        speedup: cfg.mode.speedup,
        seeds: cfg.seeds,
        experiments: Vec::new(),
    };
    for n in &names {
        rep.experiments.push(run_experiment(n, cfg).await?);
        write(cfg, &rep)?;
    }
    Ok(rep)
}

fn write(cfg: &FlowBenchConfig, rep: &FlowReport) -> Result<(), String> {
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(rep).map_err(|e| e.to_string())?;
    std::fs::write(cfg.out_dir.join("flow.json"), json).map_err(|e| e.to_string())?;
    std::fs::write(cfg.out_dir.join("flow.md"), markdown(rep)).map_err(|e| e.to_string())
}

/// `bench flow`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
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
}

/// `bench flow`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args {
        quick,
        experiments,
        seed,
        seeds,
        no_peers,
        routers,
        slo_header,
    } = args;
    let mode = if quick {
        Mode::quick(seed)
    } else {
        Mode::full(seed)
    };
    if experiments.iter().any(|e| e == "overload_vllm") {
        // Offered 1.5× vllm_uneven's capacity: this machine's.
        if let Err(e) =
            crate::experiments::calibrate::ensure_real_capacities(&["vllm_uneven"]).await
        {
            eprintln!("bench flow: measuring real-pod capacities: {e}");
            return ExitCode::FAILURE;
        }
    }
    let cfg = FlowBenchConfig {
        mode,
        seeds: seeds.unwrap_or(if quick { 1 } else { 3 }),
        experiments,
        peers: !no_peers,
        routers,
        slo_header,
        out_dir: out_dir.to_path_buf(),
    };
    match run_flow(&cfg).await {
        Ok(rep) => {
            println!("{}", markdown(&rep));
            eprintln!("bench flow: wrote {}/flow.{{json,md}}", out_dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench flow: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::confidence::Obs;
    use crate::loadgen::client::Outcome;

    /// One synthetic run: requests `(tag, ttft ms or None = failed, status)`.
    fn run(seed: u64, reqs: &[(&str, Option<f64>, u16)]) -> (RunData, Vec<Sample>) {
        let mut d = RunData {
            seed,
            window_s: 100.0,
            ..RunData::default()
        };
        let mut samples = Vec::new();
        for (i, (tag, ttft, status)) in reqs.iter().enumerate() {
            let ok = ttft.is_some() && *status == 200;
            d.obs.insert(
                i as u64,
                if ok {
                    Obs {
                        ttft_ms: ttft.unwrap_or_default(),
                        e2e_ms: 2.0 * ttft.unwrap_or_default(),
                        ok,
                        tokens: 10.0,
                    }
                } else {
                    Obs::failed()
                },
            );
            samples.push(Sample {
                id: i as u64,
                model: "m".into(),
                at_ms: i as f64,
                lag_ms: 0.0,
                tag: (!tag.is_empty()).then(|| tag.to_string()),
                group: None,
                outcome: Outcome {
                    status: *status,
                    error: (!ok).then(|| "failed".to_string()),
                    ttft_ms: *ttft,
                    served_model: ok
                        .then(|| if i % 10 == 0 { CANARY_TARGET } else { "base" }.into()),
                    ..Outcome::default()
                },
            });
        }
        (d, samples)
    }

    /// `n` requests per band: critical at `crit` ms, standard at 100 ms, sheddable at 100 ms
    /// with `shed_refused` / `std_refused` of them 429.
    fn bands(
        crit: f64,
        shed_refused: usize,
        std_refused: usize,
    ) -> Vec<(&'static str, Option<f64>, u16)> {
        let mut v = Vec::new();
        for i in 0..100 {
            v.push(("critical", Some(crit + i as f64 / 100.0), 200));
            let std = if i < std_refused {
                (None, 429)
            } else {
                (Some(100.0), 200)
            };
            v.push(("standard", std.0, std.1));
            let shed = if i < shed_refused {
                (None, 429)
            } else {
                (Some(100.0), 200)
            };
            v.push(("sheddable", shed.0, shed.1));
        }
        v
    }

    fn met(cs: &[Check], what: &str) -> Option<bool> {
        cs.iter()
            .find(|c| c.what.starts_with(what))
            .and_then(|c| c.met)
    }

    #[test]
    fn bands_judge_the_critical_tail_and_who_is_refused_first() {
        let rr = arm_from(
            "round_robin",
            "flow_bands",
            vec![run(1, &bands(5000.0, 0, 0)), run(2, &bands(5000.0, 0, 0))],
            3000.0,
        );
        let good = arm_from(
            "filter",
            "flow_bands",
            vec![run(1, &bands(100.0, 20, 0)), run(2, &bands(100.0, 20, 0))],
            3000.0,
        );
        let cs = checks("bands", &[rr.clone(), good], 3000.0, Some(900.0));
        assert_eq!(met(&cs, "critical TTFT p99"), Some(true), "{cs:?}");
        assert_eq!(met(&cs, "filter: share of sheddable"), Some(true));
        assert_eq!(met(&cs, "filter: share of critical"), Some(true));
        // Round robin's critical p99 is ~5,000 ms: a 900 ms floor puts 0.05x out of reach.
        assert_eq!(met(&cs, "critical TTFT p99 floor"), Some(false));
        // Critical as slow as round robin's: missed. Standard refused while sheddable is not:
        // the wrong order.
        let bad = arm_from(
            "filter",
            "flow_bands",
            vec![run(1, &bands(4000.0, 0, 10)), run(2, &bands(4000.0, 0, 10))],
            3000.0,
        );
        let cs = checks("bands", &[rr, bad.clone()], 3000.0, Some(900.0));
        assert_eq!(met(&cs, "critical TTFT p99"), Some(false));
        assert_eq!(met(&cs, "filter: share of sheddable"), Some(false));
        assert_eq!(bad.by_tag["standard"].refused, 20);
        assert_eq!(bad.by_tag["critical"].requests, 200);
    }

    #[test]
    fn the_light_tenant_is_compared_with_itself_alone_on_the_same_requests() {
        let mix = |light_ms: f64| -> Vec<(&'static str, Option<f64>, u16)> {
            (0..200)
                .map(|i| {
                    if i % 2 == 0 {
                        ("light", Some(light_ms + i as f64), 200)
                    } else {
                        ("heavy", Some(9000.0), 200)
                    }
                })
                .collect()
        };
        // Alone: the same ids, only the light ones.
        let alone_reqs: Vec<(&'static str, Option<f64>, u16)> = (0..200)
            .map(|i| {
                if i % 2 == 0 {
                    ("light", Some(100.0 + i as f64), 200)
                } else {
                    ("", None, 0)
                }
            })
            .collect();
        let strip = |(mut d, s): (RunData, Vec<Sample>)| {
            d.obs.retain(|id, _| id % 2 == 0);
            (
                d,
                s.into_iter().filter(|x| x.id % 2 == 0).collect::<Vec<_>>(),
            )
        };
        let alone = arm_from(
            "filter",
            "flow_tenants_alone",
            vec![strip(run(1, &alone_reqs))],
            3000.0,
        );
        let fair = arm_from("filter", "flow_tenants", vec![run(1, &mix(110.0))], 3000.0);
        let cs = checks("tenants", &[fair, alone.clone()], 3000.0, None);
        let c = &cs[0];
        assert!(c.value.is_some_and(|v| (v - 1.034).abs() < 0.02), "{c:?}");
        assert_eq!(c.met, Some(true));
        let unfair = arm_from("filter", "flow_tenants", vec![run(1, &mix(400.0))], 3000.0);
        let cs = checks("tenants", &[unfair, alone], 3000.0, None);
        assert_eq!(cs[0].met, Some(false), "{cs:?}");
    }

    #[test]
    fn overload_counts_goodput_within_the_slo_and_losses() {
        let reqs = |fast: usize, lost: usize| -> Vec<(&'static str, Option<f64>, u16)> {
            (0..100)
                .map(|i| match i {
                    i if i < fast => ("", Some(500.0), 200),
                    i if i < fast + lost => ("", None, 0),
                    _ => ("", Some(9000.0), 200),
                })
                .collect()
        };
        let rr = arm_from(
            "round_robin",
            "flow_overload",
            vec![run(1, &reqs(50, 0))],
            3000.0,
        );
        let f = arm_from(
            "filter",
            "flow_overload",
            vec![run(1, &reqs(60, 0))],
            3000.0,
        );
        assert!((f.all.goodput_rps - 0.6).abs() < 1e-9);
        let cs = checks("overload", &[rr.clone(), f], 3000.0, None);
        assert_eq!(met(&cs, "goodput"), Some(true), "{cs:?}");
        assert_eq!(met(&cs, "filter: requests lost"), Some(true));
        let worse = arm_from(
            "filter",
            "flow_overload",
            vec![run(1, &reqs(40, 1))],
            3000.0,
        );
        // A request that got no answer is lost by transport (the loader's own cause names).
        assert_eq!(worse.lost_by_cause.get("transport"), Some(&1));
        assert_eq!(worse.lost_by_cause.values().sum::<usize>(), worse.all.lost);
        let cs = checks("overload", &[rr, worse], 3000.0, None);
        assert_eq!(met(&cs, "goodput"), Some(false));
        assert_eq!(met(&cs, "filter: requests lost"), Some(false));
    }

    /// Overload like with like: the filter is judged against the best router with admission
    /// (goodput ≥ 1.2×, served ≥ 0.95×, on the worse end), and a 429 after the SLO is a loss.
    #[test]
    fn overload_is_judged_against_the_best_router_with_admission() {
        // `ok` within the SLO, `slow` served late, `refused` answered 429 at `refused_at` ms.
        let arm = |router: &str, seeds: &[u64], ok: usize, refused: usize, refused_at: f64| {
            let runs = seeds
                .iter()
                .map(|&seed| {
                    let reqs: Vec<(&'static str, Option<f64>, u16)> = (0..100)
                        .map(|i| match i {
                            i if i < ok => ("", Some(500.0 + seed as f64), 200),
                            i if i < ok + refused => ("", None, 429),
                            _ => ("", Some(9000.0), 200),
                        })
                        .collect();
                    let (d, mut samples) = run(seed, &reqs);
                    for s in samples.iter_mut().filter(|s| s.outcome.status == 429) {
                        s.outcome.e2e_ms = refused_at;
                    }
                    (d, samples)
                })
                .collect();
            arm_from(router, "flow_overload", runs, 3000.0)
        };
        let seeds = [1, 2, 3];
        let rr = arm("round_robin", &seeds, 30, 0, 0.0);
        let rr_adm = arm("round_robin_admission", &seeds, 40, 30, 5.0);
        let smg_adm = arm("smg_cache_aware_admission", &seeds, 45, 30, 5.0);
        // The filter: 60 within the SLO, 30 refused at once, 10 served late.
        let f = arm("filter", &seeds, 60, 30, 5.0);
        let cs = checks(
            "overload",
            &[rr.clone(), rr_adm.clone(), smg_adm.clone(), f],
            3000.0,
            None,
        );
        let c = cs
            .iter()
            .find(|c| c.what.contains("best router with admission"))
            .unwrap();
        assert!(c.what.contains("smg_cache_aware_admission"), "{c:?}");
        assert!((c.value.unwrap() - 60.0 / 45.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.met, Some(true));
        // Served: 70 of 100 against its 70: 1.
        assert_eq!(met(&cs, "requests served, filter"), Some(true), "{cs:?}");
        assert_eq!(met(&cs, "filter: requests lost"), Some(true));
        // Goodput only 1.1x the best with admission: missed; refusals after the SLO: lost.
        let late = arm("filter", &seeds, 50, 30, 4000.0);
        assert_eq!(late.all.refused_late, 90);
        let cs = checks("overload", &[rr, rr_adm, smg_adm, late], 3000.0, None);
        assert_eq!(
            met(&cs, "goodput, filter ÷ the best"),
            Some(false),
            "{cs:?}"
        );
        assert_eq!(met(&cs, "filter: requests lost"), Some(false));
    }

    #[test]
    fn the_canary_share_is_judged_within_one_point() {
        // Every tenth served request names the canary: 10 %.
        let ok: Vec<(&'static str, Option<f64>, u16)> =
            (0..1000).map(|_| ("", Some(10.0), 200)).collect();
        let f = arm_from("filter", "flow_canary", vec![run(1, &ok)], 1000.0);
        assert_eq!(f.served_models[CANARY_TARGET], 100);
        assert_eq!(checks("canary", &[f], 1000.0, None)[0].met, Some(true));
        // Every tenth request fails and those are the canary's: 0 % served by it.
        let mut bad = ok.clone();
        for (i, r) in bad.iter_mut().enumerate() {
            if i % 10 == 0 {
                *r = ("", None, 503);
            }
        }
        let f = arm_from("filter", "flow_canary", vec![run(1, &bad)], 1000.0);
        let cs = checks("canary", &[f], 1000.0, None);
        assert_eq!(cs[0].met, Some(false), "{cs:?}");
        assert_eq!(cs[1].met, Some(false), "100 lost");
    }

    #[test]
    fn every_experiment_has_its_arms_and_scenarios() {
        for e in EXPERIMENTS.iter().chain(&REAL_EXPERIMENTS).copied() {
            let a = arms(e, true);
            assert!(a.iter().any(|x| x.router == RouterKind::Filter), "{e}");
            for x in &a {
                assert!(
                    flow_scenario(x.scenario, Mode::quick(1)).is_some(),
                    "{}",
                    x.scenario
                );
            }
        }
        assert!(arms("nope", true).is_empty());
    }
}
