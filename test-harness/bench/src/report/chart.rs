//! The PNG charts of the report: TTFT p50/p95/p99 per router, one panel per scenario; and per
//! swept scenario the goodput curve (TTFT p95 vs offered rate, one line per router).
//!
//! Drawn with plotters' bitmap backend. Text uses DejaVu Sans loaded at run time (Debian
//! `fonts-dejavu-core`) through plotters' `ab_glyph` feature, so the build needs no fontconfig;
//! without the font the chart is drawn without text (bars and grid only) and says so.
//!
//! The scale bench's line charts (`scale-*.svg`, [`line_chart_svg`]) are plotters too, on
//! [`SvgBackend`]: SVG text, drawn by the viewer, so they keep their text without the font.

use crate::report::svg::SvgBackend;
use crate::report::{GoodputSweep, Report, ROUTERS};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

/// Fonts tried, in order.
pub const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Errors drawing the chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// Plotters failed (file not writable, ...).
    #[error("drawing chart {path}: {reason}")]
    Draw {
        /// Output file.
        path: String,
        /// Backend message.
        reason: String,
    },
}

/// Register the font once; true when text can be drawn.
pub(crate) fn fonts() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        for p in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(p) {
                // plotters keeps font data for the life of the process.
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

const COLORS: [RGBColor; ROUTERS.len()] = [
    RGBColor(214, 96, 77),   // round_robin
    RGBColor(244, 165, 60),  // least_request
    RGBColor(140, 86, 75),   // least_request_full
    RGBColor(150, 150, 150), // weighted_rr
    RGBColor(33, 102, 172),  // filter
    RGBColor(90, 174, 97),   // filter_gaie_weights
    RGBColor(103, 169, 207), // filter_x2
    RGBColor(67, 147, 195),  // filter_x4
    RGBColor(170, 200, 225), // filter_x2_nohub
    RGBColor(118, 42, 131),  // smg_cache_aware
    RGBColor(153, 112, 171), // smg_least_load
    RGBColor(194, 165, 207), // smg_power_of_two
    RGBColor(231, 212, 232), // smg_prefix_hash
    RGBColor(1, 102, 94),    // vllm_router_cache_aware
    RGBColor(128, 205, 193), // vllm_router_power_of_two
];

/// Short labels under the bars, in [`ROUTERS`] order.
const SHORT: [&str; ROUTERS.len()] = [
    "RR",
    "LR",
    "LR full",
    "WRR",
    "filter",
    "GAIE w",
    "filter ×2",
    "filter ×4",
    "×2 no hub",
    "SMG cache",
    "SMG least",
    "SMG P2",
    "SMG hash",
    "vLLM-R cache",
    "vLLM-R P2",
];

/// The routers with figures in some scenario of `rep`, as indices into [`ROUTERS`] (report
/// order): the legend and the bar groups of [`ttft_chart`].
pub fn routers_present(rep: &Report) -> Vec<usize> {
    (0..ROUTERS.len())
        .filter(|i| rep.scenarios.values().any(|s| s.contains_key(ROUTERS[*i])))
        .collect()
}

/// The legend of [`ttft_chart`]: the names of the routers that ran, in report order.
pub fn ttft_legend(rep: &Report) -> Vec<&'static str> {
    routers_present(rep)
        .into_iter()
        .map(|i| ROUTERS[i])
        .collect()
}

fn shade(c: RGBColor, k: usize) -> RGBColor {
    // p50 lightest, p99 full colour.
    let f = [0.45, 0.7, 1.0][k.min(2)];
    let mix = |x: u8| (255.0 - (255.0 - f64::from(x)) * f) as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

fn err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> ChartError + '_ {
    move |e| ChartError::Draw {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Draw the chart; returns whether text (labels) could be drawn.
pub fn ttft_chart(rep: &Report, path: &Path) -> Result<bool, ChartError> {
    let text = fonts();
    let scenarios: Vec<&str> = crate::scenario_names::all_scenarios()
        .filter(|s| rep.scenarios.contains_key(*s))
        .collect();
    let cols = 3usize;
    let rows = scenarios.len().div_ceil(cols).max(1);
    // Wide enough for every present router's legend entry and bar group.
    let present = routers_present(rep);
    let legend_w: usize = present.iter().map(|i| 40 + 9 * ROUTERS[*i].len()).sum();
    let w = (legend_w as u32 + 420)
        .max(1500)
        .max(cols as u32 * 110 * present.len() as u32);
    let h = 80 + 420 * rows as u32;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err(path))?;
    let (head, body) = root.split_vertically(80);
    if text {
        let title = format!(
            "TTFT p50 / p95 / p99 (ms, log scale) per router — {} mode, {}",
            rep.mode, rep.machine.date_utc
        );
        head.draw(&Text::new(title, (20, 12), ("sans-serif", 24).into_font()))
            .map_err(err(path))?;
        let mut x = 20;
        for i in routers_present(rep) {
            let r = ROUTERS[i];
            head.draw(&Rectangle::new([(x, 50), (x + 18, 68)], COLORS[i].filled()))
                .map_err(err(path))?;
            head.draw(&Text::new(r, (x + 24, 50), ("sans-serif", 16).into_font()))
                .map_err(err(path))?;
            x += 40 + 9 * r.len() as i32;
        }
        head.draw(&Text::new(
            "bars per router: p50 (light), p95, p99 (dark)",
            (x + 20, 50),
            ("sans-serif", 16).into_font(),
        ))
        .map_err(err(path))?;
    }
    let panels = body.split_evenly((rows, cols));
    for (panel, s) in panels.iter().zip(scenarios.iter()) {
        draw_panel(rep, s, panel, &present, text).map_err(err(path))?;
    }
    root.present().map_err(err(path))?;
    Ok(text)
}

fn draw_panel<DB: DrawingBackend>(
    rep: &Report,
    scenario: &str,
    panel: &DrawingArea<DB, plotters::coord::Shift>,
    present: &[usize],
    text: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (pw, ph) = panel.dim_in_pixel();
    let (pw, ph) = (pw as i32, ph as i32);
    let Some(rs) = rep.scenarios.get(scenario) else {
        return Ok(());
    };
    // (slot among the present routers, router index, p50/p95/p99).
    let vals: Vec<(usize, usize, [f64; 3])> = present
        .iter()
        .enumerate()
        .filter_map(|(slot, &i)| {
            rs.get(ROUTERS[i])
                .map(|s| (slot, i, [s.ttft_p50_ms, s.ttft_p95_ms, s.ttft_p99_ms]))
        })
        .collect();
    let finite: Vec<f64> = vals
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let (left, right, top, bottom) = (70, 15, 40, 50);
    let plot_h = ph - top - bottom;
    let plot_w = pw - left - right;
    panel.draw(&Rectangle::new(
        [(left, top), (left + plot_w, top + plot_h)],
        BLACK.stroke_width(1),
    ))?;
    if text {
        panel.draw(&Text::new(
            scenario,
            (left, 10),
            ("sans-serif", 20).into_font(),
        ))?;
    }
    if finite.is_empty() {
        return Ok(());
    }
    // Leave room below the smallest bar so it stays visible.
    let lo = (finite.iter().copied().fold(f64::INFINITY, f64::min) * 0.7)
        .log10()
        .floor();
    let hi = finite
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let y = |v: f64| -> i32 {
        let f = ((v.max(1e-9).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
        top + plot_h - (f * f64::from(plot_h)) as i32
    };
    let mut d = lo;
    while d <= hi {
        let yy = y(10f64.powf(d));
        panel.draw(&PathElement::new(
            vec![(left, yy), (left + plot_w, yy)],
            RGBColor(220, 220, 220).stroke_width(1),
        ))?;
        if text {
            let label = if d >= 3.0 {
                format!("{}s", 10f64.powf(d - 3.0))
            } else {
                format!("{}ms", 10f64.powf(d))
            };
            panel.draw(&Text::new(
                label,
                (5, yy - 8),
                ("sans-serif", 14).into_font(),
            ))?;
        }
        d += 1.0;
    }
    let groups = present.len().max(1) as i32;
    let gw = plot_w / groups;
    let bw = (gw - 20) / 3;
    for (slot, i, v) in &vals {
        let gx = left + gw * (*slot as i32) + 10;
        for (k, val) in v.iter().enumerate() {
            if !val.is_finite() || *val <= 0.0 {
                continue;
            }
            let x0 = gx + bw * k as i32;
            panel.draw(&Rectangle::new(
                [(x0, y(*val)), (x0 + bw - 2, top + plot_h)],
                shade(COLORS[*i], k).filled(),
            ))?;
        }
        if text {
            let label = format!("p99 {:.0}", v[2]);
            panel.draw(&Text::new(
                label,
                (gx, top + plot_h + 8),
                ("sans-serif", 13).into_font(),
            ))?;
            let short = SHORT[*i];
            panel.draw(&Text::new(
                short,
                (gx, top + plot_h + 26),
                ("sans-serif", 13).into_font(),
            ))?;
        }
    }
    Ok(())
}

/// Draw the goodput curve of one scenario: TTFT p95 (log scale) vs offered rate, one line per
/// router, the SLO as a dashed line; probes that failed outright (∞) sit on the top edge.
/// Returns whether text could be drawn.
pub fn goodput_chart(scenario: &str, g: &GoodputSweep, path: &Path) -> Result<bool, ChartError> {
    let text = fonts();
    let root = BitMapBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(err(path))?;
    let pts: Vec<(f64, f64)> = g
        .probes
        .values()
        .flatten()
        .map(|p| (p.rate_rps, p.ttft_p95_ms))
        .filter(|(r, _)| r.is_finite() && *r > 0.0)
        .collect();
    let finite: Vec<f64> = pts
        .iter()
        .map(|(_, y)| *y)
        .chain(std::iter::once(g.slo_ttft_ms))
        .filter(|y| y.is_finite() && *y > 0.0)
        .collect();
    let x_hi = pts.iter().map(|(x, _)| *x).fold(1.0, f64::max) * 1.1;
    let y_lo = finite
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(1e9)
        * 0.5;
    let y_hi = finite.iter().copied().fold(0.0, f64::max).max(y_lo * 10.0) * 3.0;
    let mut b = ChartBuilder::on(&root);
    b.margin(20);
    if text {
        b.caption(
            format!(
                "{scenario}: TTFT p95 vs offered rate (SLO {:.0} ms, dashed)",
                g.slo_ttft_ms
            ),
            ("sans-serif", 22).into_font(),
        )
        .x_label_area_size(45)
        .y_label_area_size(70);
    }
    let mut chart = b
        .build_cartesian_2d(0.0..x_hi, (y_lo.max(1e-3)..y_hi).log_scale())
        .map_err(err(path))?;
    if text {
        chart
            .configure_mesh()
            .x_desc("offered rate, req/s")
            .y_desc("TTFT p95, ms")
            .label_style(("sans-serif", 14).into_font())
            .draw()
            .map_err(err(path))?;
    }
    let slo = g.slo_ttft_ms;
    if slo.is_finite() {
        let mut x = 0.0;
        let step = x_hi / 60.0;
        while x < x_hi {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, slo), ((x + step / 2.0).min(x_hi), slo)],
                    BLACK.stroke_width(1),
                )))
                .map_err(err(path))?;
            x += step;
        }
    }
    for (i, r) in ROUTERS.iter().enumerate() {
        let Some(ps) = g.probes.get(*r) else {
            continue;
        };
        let mut line: Vec<(f64, f64)> = ps
            .iter()
            .filter(|p| p.rate_rps.is_finite() && !p.ttft_p95_ms.is_nan())
            .map(|p| (p.rate_rps, p.ttft_p95_ms.min(y_hi)))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = COLORS[i];
        chart
            .draw_series(std::iter::once(PathElement::new(
                line.clone(),
                c.stroke_width(2),
            )))
            .map_err(err(path))?;
        let legend = chart
            .draw_series(
                line.iter()
                    .map(|(x, y)| Circle::new((*x, *y), 4, c.filled())),
            )
            .map_err(err(path))?;
        if text {
            legend.label(*r).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14).into_font())
            .draw()
            .map_err(err(path))?;
    }
    root.present().map_err(err(path))?;
    Ok(text)
}

/// One line of [`line_chart_svg`]: a label and its (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, any order (drawn sorted by x).
    pub points: Vec<(f64, f64)>,
}

/// Line colours of [`line_chart_svg`], cycled.
const SVG_COLORS: [RGBColor; 6] = [
    RGBColor(0x21, 0x66, 0xac),
    RGBColor(0xd6, 0x60, 0x4d),
    RGBColor(0x5a, 0xae, 0x61),
    RGBColor(0x76, 0x2a, 0x83),
    RGBColor(0xf4, 0xa5, 0x3c),
    RGBColor(0x01, 0x66, 0x5e),
];

/// "4", "1,024", "0.25", "120", "12.5".
fn tick_label(v: f64) -> String {
    if v >= 1000.0 {
        let digits = format!("{:.0}", v.round());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 || v == v.round() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A line chart as SVG text: x on a log scale (ticks at the points' x values), y linear from 0
/// (about six round ticks), one line with markers per series and a legend on the right. Drawn by
/// plotters on [`SvgBackend`], so text needs no font at build time (the viewer draws it).
/// Points with a non-positive x or a non-finite y are left out.
pub fn line_chart_svg_text(title: &str, x_label: &str, series: &[Series]) -> String {
    let mut out = String::new();
    let root = SvgBackend::new(&mut out, (720, 420)).into_drawing_area();
    // The SVG backend cannot fail (its error type is `Infallible`).
    let _ = draw_line_chart(&root, title, x_label, series).and_then(|()| root.present());
    drop(root);
    out
}

/// The points of `s` that can be drawn on a log x axis, sorted by x.
fn drawable(s: &Series) -> Vec<(f64, f64)> {
    let mut p: Vec<(f64, f64)> = s
        .points
        .iter()
        .copied()
        .filter(|(x, y)| *x > 0.0 && y.is_finite())
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    p
}

fn draw_line_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    series: &[Series],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let lines: Vec<Vec<(f64, f64)>> = series.iter().map(drawable).collect();
    let mut ticks: Vec<f64> = lines.iter().flatten().map(|(x, _)| *x).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let (xmin, xmax) = match (ticks.first(), ticks.last()) {
        (Some(&lo), Some(&hi)) if hi > lo => (lo, hi),
        (Some(&lo), _) => (lo, lo * 2.0),
        _ => (1.0, 2.0),
    };
    let ymax = lines
        .iter()
        .flatten()
        .map(|(_, y)| *y)
        .fold(0.0_f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let (plot, legend) = root.split_horizontally(520);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin..xmax).log_scale().with_key_points(ticks), 0.0..ymax)?;
    chart
        .configure_mesh()
        .bold_line_style(RGBColor(221, 221, 221))
        .light_line_style(TRANSPARENT)
        .y_labels(6)
        .x_desc(x_label)
        .x_label_formatter(&|x| tick_label(*x))
        .y_label_formatter(&|y| tick_label(*y))
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, p) in lines.iter().enumerate() {
        let c = SVG_COLORS[i % SVG_COLORS.len()];
        chart.draw_series(std::iter::once(PathElement::new(
            p.clone(),
            c.stroke_width(2),
        )))?;
        chart.draw_series(p.iter().map(|&xy| Circle::new(xy, 3, c.filled())))?;
    }
    for (i, s) in series.iter().enumerate() {
        let c = SVG_COLORS[i % SVG_COLORS.len()];
        let y = 50 + 18 * i as i32;
        legend.draw(&PathElement::new(vec![(12, y), (32, y)], c.stroke_width(2)))?;
        legend.draw(&Text::new(
            s.label.as_str(),
            (38, y),
            TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// [`line_chart_svg_text`] written to `path`.
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    series: &[Series],
    path: &Path,
) -> Result<(), ChartError> {
    std::fs::write(path, line_chart_svg_text(title, x_label, series)).map_err(|e| {
        ChartError::Draw {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::stats::Summary;

    fn summary(p: f64) -> Summary {
        Summary {
            ttft_p50_ms: p,
            ttft_p95_ms: p * 3.0,
            ttft_p99_ms: p * 5.0,
            requests: 1,
            ..Summary::default()
        }
    }

    #[test]
    fn the_legend_lists_only_the_routers_that_ran() {
        let mut rep = Report::default();
        let mut m = crate::report::ScenarioResult::default();
        m.insert("round_robin".into(), summary(10.0));
        m.insert("filter".into(), summary(5.0));
        rep.scenarios.insert("mixed_gpu".into(), m);
        let mut u = crate::report::ScenarioResult::default();
        u.insert("smg_cache_aware".into(), summary(6.0));
        rep.scenarios.insert("uniform".into(), u);
        assert_eq!(
            ttft_legend(&rep),
            ["round_robin", "filter", "smg_cache_aware"]
        );
        assert!(ttft_legend(&Report::default()).is_empty());
        let dir = std::env::temp_dir().join(format!("bench-legend-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        ttft_chart(&rep, &path).unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_a_png() {
        let mut rep = Report::default();
        for s in ["mixed_gpu", "bursty", "uniform", "lora"] {
            let mut m = crate::report::ScenarioResult::default();
            for (i, r) in ROUTERS.iter().enumerate() {
                m.insert(r.to_string(), summary(10.0 * (i as f64 + 1.0)));
            }
            if s == "uniform" {
                m.insert("filter".into(), summary(f64::NAN));
            }
            rep.scenarios.insert(s.to_string(), m);
        }
        let dir = std::env::temp_dir().join(format!("bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        ttft_chart(&rep, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // The goodput curve, with an unbounded (∞) probe.
        let probe = |rate: f64, p95: f64| crate::report::Probe {
            rate_rps: rate,
            ttft_p95_ms: p95,
            error_rate: 0.0,
            passed: p95 <= 1000.0,
            invalid: None,
        };
        let mut g = GoodputSweep {
            slo_ttft_ms: 1000.0,
            ..GoodputSweep::default()
        };
        g.probes.insert(
            "round_robin".into(),
            vec![
                probe(4.0, 300.0),
                probe(8.0, f64::INFINITY),
                probe(5.6, 900.0),
            ],
        );
        g.probes
            .insert("filter".into(), vec![probe(4.0, 200.0), probe(8.0, 400.0)]);
        let gpath = dir.join("goodput.png");
        goodput_chart("mixed_gpu", &g, &gpath).unwrap();
        assert_eq!(&std::fs::read(&gpath).unwrap()[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn svg_line_chart_places_points_on_a_log_x_axis() {
        let s = vec![Series {
            label: "1 pool <a&b>".into(),
            points: vec![
                (4.0, 10.0),
                (64.0, 20.0),
                (4096.0, f64::NAN),
                (1024.0, 40.0),
            ],
        }];
        let svg = line_chart_svg_text("t", "pods", &s);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("1 pool &lt;a&amp;b&gt;"));
        // Three finite points: three markers; x ticks at 4, 64 and 1,024.
        assert_eq!(svg.matches("<circle").count(), 3);
        for t in [">4<", ">64<", ">1,024<"] {
            assert!(svg.contains(t), "{t}");
        }
        // Log x: 64 sits halfway from 4 to 1024 (log2: 2, 6, 10).
        let cx: Vec<f64> = svg
            .match_indices("<circle cx=\"")
            .map(|(i, m)| {
                let rest = &svg[i + m.len()..];
                rest[..rest.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        let frac = (cx[1] - cx[0]) / (cx[2] - cx[0]);
        assert!((frac - 0.5).abs() < 0.01, "{frac}");
    }
}
