//! The README's picture of the Grafana dashboard: its main panels drawn as line charts from the
//! series a real Prometheus stored during `test-harness/e2e/tests/prometheus.rs`, which writes
//! them to `<target>/observability/dashboard-run.json` (`bench dashboard-chart` reads that file).
//!
//! Same plotters bitmap backend and font handling as [`crate::report::chart`].

use crate::report::chart::{fonts, ChartError};
use plotters::prelude::*;
use serde::Deserialize;
use std::path::Path;

/// One line of a panel.
#[derive(Debug, Deserialize)]
pub struct Series {
    /// Legend text (the dashboard's legend format, filled in).
    pub label: String,
    /// (seconds since the traffic started, value).
    pub points: Vec<(f64, f64)>,
}

/// One dashboard panel.
#[derive(Debug, Deserialize)]
pub struct Panel {
    /// The panel's title in the dashboard.
    pub title: String,
    /// Grafana unit of the values (`reqps`, `µs`, `s`, `short`, ...).
    #[serde(default)]
    pub unit: Option<String>,
    /// Its lines.
    pub series: Vec<Series>,
}

/// What the end-to-end test wrote.
#[derive(Debug, Deserialize)]
pub struct DashboardRun {
    /// Seconds of traffic.
    pub traffic_s: u64,
    /// Concurrent clients.
    pub clients: u64,
    /// The window of the `rate()`s.
    pub rate_window: String,
    /// The panels, in dashboard order.
    pub panels: Vec<Panel>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(33, 102, 172),
    RGBColor(214, 96, 77),
    RGBColor(90, 174, 97),
    RGBColor(244, 165, 60),
    RGBColor(140, 86, 75),
    RGBColor(118, 42, 131),
    RGBColor(150, 150, 150),
    RGBColor(27, 158, 119),
];

/// Reads `input` (the e2e test's JSON) and draws its panels into `out` (PNG); returns whether
/// text could be drawn.
pub fn draw_file(input: &Path, out: &Path) -> Result<bool, ChartError> {
    let fail = |reason: String| ChartError::Draw {
        path: out.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(input)
        .map_err(|e| fail(format!("reading {}: {e}", input.display())))?;
    let run: DashboardRun = serde_json::from_str(&text)
        .map_err(|e| fail(format!("parsing {}: {e}", input.display())))?;
    draw(&run, out)
}

/// Draws the panels of `run`, two per row.
pub fn draw(run: &DashboardRun, out: &Path) -> Result<bool, ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError::Draw {
        path: out.display().to_string(),
        reason: e.to_string(),
    };
    let text = fonts();
    let cols = 2usize;
    let rows = run.panels.len().div_ceil(cols).max(1);
    let (w, h) = (1400u32, 60 + 330 * rows as u32);
    let root = BitMapBackend::new(out, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (head, body) = root.split_vertically(60);
    if text {
        let title = format!(
            "wasm-llm-router dashboard, one end-to-end run: {} s of traffic from {} clients, \
             real Envoy + filter + sidecar, scraped by Prometheus (rates over {})",
            run.traffic_s, run.clients, run.rate_window
        );
        head.draw(&Text::new(title, (20, 18), ("sans-serif", 20).into_font()))
            .map_err(|e| fail(&e))?;
    }
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(&run.panels) {
        draw_panel(area, panel, text).map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(text)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    text: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let points = panel.series.iter().flat_map(|s| s.points.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points.map(|p| p.1).fold(0.0, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
    let unit = panel.unit.as_deref().unwrap_or("");
    let caption = if unit.is_empty() || unit == "short" {
        panel.title.clone()
    } else {
        format!("{} ({unit})", panel.title)
    };
    let mut b = ChartBuilder::on(area);
    b.margin(12);
    if text {
        b.caption(caption, ("sans-serif", 18))
            .x_label_area_size(30)
            .y_label_area_size(60);
    }
    let mut chart = b.build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(WHITE.mix(0.0));
    if text {
        mesh.x_desc("seconds").label_style(("sans-serif", 13));
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    for (i, s) in panel.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        // A path element: plotters' LineSeries needs a feature the bench does not build.
        let line = chart.draw_series(std::iter::once(PathElement::new(
            s.points.clone(),
            color.stroke_width(2),
        )))?;
        if text {
            line.label(s.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    if text && !panel.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    Ok(())
}

/// `bench dashboard-chart`'s arguments (the help text is the fields' docs).
#[derive(clap::Args)]
pub struct Args {
    /// The e2e test's output (default: <target>/observability/dashboard-run.json).
    #[arg(long)]
    input: Option<std::path::PathBuf>,
    /// The PNG to write (default: test-harness/bench/results/dashboard.png in the repository).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// `bench dashboard-chart`: runs it with `args`, results under `out_dir` (`<target>/bench`).
pub async fn run_cli(args: Args, _out_dir: &std::path::Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let Args { input, out } = args;
    let input = input.unwrap_or_else(|| {
        testkit::target_dir()
            .join("observability")
            .join("dashboard-run.json")
    });
    let out = out.unwrap_or_else(|| {
        testkit::workspace_root().join("test-harness/bench/results/dashboard.png")
    });
    match draw_file(&input, &out) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png_from_the_e2e_json() {
        let json = r#"{"traffic_s": 20, "clients": 4, "rate_window": "5s", "panels": [
            {"title": "Requests by outcome", "unit": "reqps",
             "series": [{"label": "routed", "points": [[0, 1.0], [1, 2.5], [2, 3.0]]},
                        {"label": "shed", "points": [[0, 0.0], [2, 0.5]]}]},
            {"title": "Decision time", "unit": "µs", "series": []}]}"#;
        let run: DashboardRun = serde_json::from_str(json).unwrap();
        let dir = testkit::testlog_dir("dashboard-chart").unwrap();
        let out = dir.join("dashboard.png");
        draw(&run, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
