//! A load sweep drawn from the reports of `bench run --load F` (one run per load): per scenario,
//! TTFT p50 and p95 against the offered load, one line per router, and the same figures as a
//! Markdown table (`bench load-chart`).

use crate::report::chart::{line_chart_svg, ChartError, Series};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `bench load-chart`: draw a load sweep.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Reports (`<stem>.json`) of `bench run --load F` runs, one per load; other reports'
    /// scenarios are left out (they name no load).
    #[arg(required = true)]
    reports: Vec<PathBuf>,
    /// Folder for `<prefix><scenario>-load-p50.svg`, `-p95.svg` and `<prefix>load.md`.
    #[arg(long)]
    out: PathBuf,
    /// Prefix of the files written.
    #[arg(long, default_value = "")]
    prefix: String,
}

/// One measured point: (load as a fraction of capacity, TTFT p50 ms, TTFT p95 ms, seeds).
type Point = (f64, f64, f64, u64);

/// scenario → router → points, from the reports' JSON.
pub type Sweep = BTreeMap<String, BTreeMap<String, Vec<Point>>>;

/// The keys of a scenario's entry that are not routers ([`super::ScenarioResult`]'s own).
fn is_router_entry(v: &Value) -> bool {
    v.get("ttft_p50_ms").is_some() && v.get("ttft_p95_ms").is_some()
}

/// Adds one report's scenarios that name their load to `sweep`.
pub fn add_report(sweep: &mut Sweep, report: &Value) {
    let seeds = report
        .get("seeds")
        .and_then(Value::as_array)
        .map_or(0, |s| s.len() as u64);
    let Some(scenarios) = report.get("scenarios").and_then(Value::as_object) else {
        return;
    };
    for (name, sc) in scenarios {
        let Some(load) = sc.get("load_of_capacity").and_then(Value::as_f64) else {
            continue;
        };
        let Some(entries) = sc.as_object() else {
            continue;
        };
        for (router, fig) in entries.iter().filter(|(_, v)| is_router_entry(v)) {
            let get = |k: &str| fig.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            sweep
                .entry(name.clone())
                .or_default()
                .entry(router.clone())
                .or_default()
                .push((load, get("ttft_p50_ms"), get("ttft_p95_ms"), seeds));
        }
    }
}

/// The sweep as Markdown: per scenario, one row per (router, load).
pub fn markdown(sweep: &Sweep) -> String {
    let mut out = String::new();
    for (scenario, routers) in sweep {
        let _ = writeln!(
            out,
            "**{scenario}**\n\n| router | load (of capacity) | seeds | TTFT p50 ms | TTFT p95 ms |\n|---|---|---|---|---|"
        );
        for (router, points) in routers {
            let mut points = points.clone();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (load, p50, p95, seeds) in points {
                let _ = writeln!(
                    out,
                    "| {router} | {:.0} % | {seeds} | {p50:.1} | {p95:.1} |",
                    load * 100.0
                );
            }
        }
        out.push('\n');
    }
    out
}

/// One chart's lines: per router, (load in %, the figure `pick` takes from a point).
fn series(routers: &BTreeMap<String, Vec<Point>>, pick: fn(&Point) -> f64) -> Vec<Series> {
    routers
        .iter()
        .map(|(router, points)| Series {
            label: router.clone(),
            points: points.iter().map(|p| (p.0 * 100.0, pick(p))).collect(),
        })
        .collect()
}

/// Writes the charts and the table of `sweep` into `out`; returns the files written.
pub fn write(sweep: &Sweep, out: &Path, prefix: &str) -> Result<Vec<PathBuf>, ChartError> {
    std::fs::create_dir_all(out).map_err(|e| ChartError::Draw {
        path: out.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut written = Vec::new();
    for (scenario, routers) in sweep {
        for (what, pick) in [
            ("p50", (|p: &Point| p.1) as fn(&Point) -> f64),
            ("p95", |p: &Point| p.2),
        ] {
            let path = out.join(format!("{prefix}{scenario}-load-{what}.svg"));
            line_chart_svg(
                &format!("{scenario}: TTFT {what} (ms) against the offered load"),
                "offered load, % of the fleet's measured capacity",
                &series(routers, pick),
                &path,
            )?;
            written.push(path);
        }
    }
    let md = out.join(format!("{prefix}load.md"));
    std::fs::write(&md, markdown(sweep)).map_err(|e| ChartError::Draw {
        path: md.display().to_string(),
        reason: e.to_string(),
    })?;
    written.push(md);
    Ok(written)
}

/// `bench load-chart`: reads the reports, writes the charts and the table, prints the table.
pub async fn run_cli(args: Args, _out_dir: &Path) -> std::process::ExitCode {
    let mut sweep = Sweep::new();
    for path in &args.reports {
        let parsed = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(v) => add_report(&mut sweep, &v),
            Err(e) => {
                eprintln!("bench load-chart: {}: {e}", path.display());
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    if sweep.is_empty() {
        eprintln!("bench load-chart: no scenario in these reports names its load (run `bench run --load F`)");
        return std::process::ExitCode::FAILURE;
    }
    match write(&sweep, &args.out, &args.prefix) {
        Ok(files) => {
            print!("{}", markdown(&sweep));
            for f in files {
                println!("wrote {}", f.display());
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench load-chart: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(load: Option<f64>, filter_p50: f64) -> Value {
        let mut sc = json!({
            "offered_rps": 3.0,
            "floor_ms": 10.0,
            "filter": {"ttft_p50_ms": filter_p50, "ttft_p95_ms": 2.0 * filter_p50},
            "round_robin": {"ttft_p50_ms": 20.0, "ttft_p95_ms": 40.0},
        });
        if let Some(l) = load {
            sc["load_of_capacity"] = json!(l);
        }
        json!({"seeds": [1, 2, 3], "scenarios": {"vllm_limited": sc}})
    }

    #[test]
    fn points_come_from_reports_that_name_their_load_and_routers_only() {
        let mut sweep = Sweep::new();
        add_report(&mut sweep, &report(Some(0.8), 30.0));
        add_report(&mut sweep, &report(Some(0.3), 10.0));
        add_report(&mut sweep, &report(None, 99.0));
        let routers = &sweep["vllm_limited"];
        assert_eq!(
            routers.keys().collect::<Vec<_>>(),
            ["filter", "round_robin"]
        );
        assert_eq!(
            routers["filter"],
            vec![(0.8, 30.0, 60.0, 3), (0.3, 10.0, 20.0, 3)]
        );
        let md = markdown(&sweep);
        let at30 = md
            .find("| filter | 30 % | 3 | 10.0 | 20.0 |")
            .expect("30 % row");
        let at80 = md
            .find("| filter | 80 % | 3 | 30.0 | 60.0 |")
            .expect("80 % row");
        assert!(at30 < at80, "rows by load: {md}");
        assert!(
            !md.contains("99.0"),
            "a report without a load is left out: {md}"
        );
    }

    #[test]
    fn a_chart_per_scenario_and_percentile() {
        let mut sweep = Sweep::new();
        add_report(&mut sweep, &report(Some(0.5), 12.0));
        add_report(&mut sweep, &report(Some(1.1), 80.0));
        // A folder that does not exist yet: written makes it.
        let dir = std::env::temp_dir()
            .join(format!("load-chart-{}", std::process::id()))
            .join("new");
        let _ = std::fs::remove_dir_all(&dir);
        let files = write(&sweep, &dir, "t-").unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "t-vllm_limited-load-p50.svg",
                "t-vllm_limited-load-p95.svg",
                "t-load.md"
            ]
        );
        let svg = std::fs::read_to_string(&files[1]).unwrap();
        assert!(
            svg.contains("TTFT p95") && svg.contains("round_robin"),
            "{svg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
