//! `--plot FILE.svg|FILE.png`: time and bus bandwidth against size, ours and the baseline's,
//! drawn by `plotters` (two panels; log-scaled sizes; log-scaled time, linear bandwidth).
//!
//! Text is drawn with `plotters`' `ab_glyph` feature from [`FONT`], a subset of DejaVu Sans
//! (printable ASCII, `µ`, `×`, `–`: 10 KiB) embedded in the binary, instead of its default
//! `ttf` feature, which needs the system's fontconfig and freetype and so a package that a
//! fresh machine lacks. `LICENSE-DejaVu.txt` beside the font is its licence and says how the
//! subset was made.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::BoxError;
use super::args::PlotFormat;
use super::report::{Row, RunInfo};

/// DejaVu Sans, printable ASCII and `µ×–` only (see `LICENSE-DejaVu.txt`).
pub const FONT: &[u8] = include_bytes!("DejaVuSans-subset.ttf");
/// The name the plot's text asks for.
pub(crate) const FAMILY: &str = "sans-serif";

const SIZE: (u32, u32) = (1000, 440);
const OURS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const BASE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);

/// Registers [`FONT`] with `plotters` once per process.
pub(crate) fn font() -> Result<(), BoxError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded plot font does not parse".into())
    }
}

/// `8B`, `4K`, `1M`, `1G`.
pub fn size_label(b: f64) -> String {
    let b = b.round() as u64;
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}B")
}

/// `500ns`, `20us`, `1.5ms`, `2s`.
fn time_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{}ms", us / 1e3)
    } else if us >= 1.0 {
        format!("{us}us")
    } else {
        format!("{}ns", us * 1e3)
    }
}

/// The smallest and largest of `values` that a log (`positive`) or linear axis can show, or
/// `None`.
fn bounds(values: impl Iterator<Item = f64>, positive: bool) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite() && (!positive || *v > 0.0))
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// `(lo, hi)` widened for a log axis: a little room around the points, and a range at all
/// when they are equal.
fn log_range((lo, hi): (f64, f64)) -> std::ops::Range<f64> {
    if hi > lo {
        lo / 1.2..hi * 1.2
    } else {
        lo / 2.0..hi * 2.0
    }
}

/// The title: what ran, where.
fn title(info: &RunInfo) -> String {
    format!(
        "{} {} {} ({}), {} ranks, {} {}{}",
        info.op,
        info.dtype,
        info.redop,
        if info.inplace {
            "in place"
        } else {
            "out of place"
        },
        info.nranks,
        info.backend,
        info.device,
        if info.graph_launches > 0 {
            ", CUDA graphs"
        } else {
            ""
        }
    )
}

/// One curve: its name, colour and (size, value) points.
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Ours and, if one ran, the baseline's, of the value `ours` / `theirs` picks from a row.
fn series(
    info: &RunInfo,
    rows: &[Row],
    ours: impl Fn(&Row) -> Option<f64>,
    theirs: impl Fn(&Row) -> Option<f64>,
) -> Vec<Series> {
    let points = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r.size as f64, f(r)?)))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let mut v = vec![Series {
        name: "mscclpp-rs".into(),
        color: OURS,
        points: points(&ours),
    }];
    if rows.iter().any(|r| r.base.is_some()) {
        v.push(Series {
            name: info.baseline.clone().unwrap_or_else(|| "baseline".into()),
            color: BASE,
            points: points(&theirs),
        });
    }
    v
}

/// Draws `series` as lines with dots and a legend on a chart already built.
fn draw_series<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    series: &[Series],
    keep: impl Fn(f64) -> bool,
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for s in series {
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| keep(p.1)).collect();
        if pts.is_empty() {
            continue;
        }
        let color = s.color;
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.5))
        .draw()?;
    Ok(())
}

/// The left panel: time per operation, log-log.
fn time_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    x: std::ops::Range<f64>,
    series: &[Series],
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
{
    let y = bounds(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    )
    .map_or(1.0..10.0, log_range);
    let mut chart = ChartBuilder::on(area)
        .caption("time per operation", (FAMILY, 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x.log_scale().base(2.0), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .x_labels(8)
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| time_label(*v))
        .label_style((FAMILY, 12))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    draw_series(&mut chart, series, |v| v > 0.0)
}

/// The right panel: bus bandwidth, log sizes and linear GB/s from 0.
fn bandwidth_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    x: std::ops::Range<f64>,
    series: &[Series],
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
{
    let hi = bounds(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        false,
    )
    .map_or(1.0, |(_, hi)| hi)
    .max(1e-9);
    let mut chart = ChartBuilder::on(area)
        .caption("bus bandwidth (GB/s)", (FAMILY, 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x.log_scale().base(2.0), 0.0..hi * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .x_labels(8)
        .x_label_formatter(&|v| size_label(*v))
        .label_style((FAMILY, 12))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    draw_series(&mut chart, series, f64::is_finite)
}

/// Draws the whole figure on `root`.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    info: &RunInfo,
    rows: &[Row],
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
{
    font()?;
    root.fill(&WHITE)?;
    let root = root.titled(&title(info), (FAMILY, 17))?;
    let Some(sizes) = bounds(rows.iter().map(|r| r.size as f64), true) else {
        root.draw(&Text::new(
            "no data",
            (SIZE.0 as i32 / 2 - 30, SIZE.1 as i32 / 2),
            (FAMILY, 16),
        ))?;
        root.present()?;
        return Ok(());
    };
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let times = series(
        info,
        rows,
        |r| Some(r.time_us),
        |r| r.base.as_ref().map(|b| b.time_us),
    );
    time_panel(&left, log_range(sizes), &times)?;
    let bws = series(
        info,
        rows,
        |r| Some(r.busbw),
        |r| r.base.as_ref().map(|b| b.busbw),
    );
    bandwidth_panel(&right, log_range(sizes), &bws)?;
    root.present()?;
    Ok(())
}

/// The SVG document for `rows`.
pub fn svg(info: &RunInfo, rows: &[Row]) -> Result<String, BoxError> {
    let mut out = String::new();
    draw(
        SVGBackend::with_string(&mut out, SIZE).into_drawing_area(),
        info,
        rows,
    )?;
    Ok(out)
}

/// Writes the plot of `rows` to `path` in `format`.
pub fn write(
    path: &Path,
    format: PlotFormat,
    info: &RunInfo,
    rows: &[Row],
) -> Result<(), BoxError> {
    match format {
        PlotFormat::Svg => std::fs::write(path, svg(info, rows)?)?,
        PlotFormat::Png => draw(
            BitMapBackend::new(path, SIZE).into_drawing_area(),
            info,
            rows,
        )?,
    }
    Ok(())
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::BaseRow;

    fn info() -> RunInfo {
        RunInfo {
            op: "allreduce",
            dtype: "f16",
            redop: "sum",
            inplace: true,
            nranks: 2,
            backend: "cuda",
            device: "H200 <x2>".into(),
            graph_launches: 1,
            baseline: Some("NCCL 2.28.3".into()),
        }
    }

    fn rows() -> Vec<Row> {
        (3..30)
            .map(|e| {
                let size = 1usize << e;
                let t = 10.0 + size as f64 / 3e5;
                Row {
                    size,
                    count: size / 2,
                    algo: "ll".into(),
                    iters: 20,
                    time_us: t,
                    algbw: size as f64 / t / 1e3,
                    busbw: size as f64 / t / 1e3,
                    wrong: None,
                    spread: Default::default(),
                    base: Some(BaseRow {
                        time_us: t * 1.2,
                        spread: Default::default(),
                        algbw: 1.0,
                        busbw: size as f64 / t / 1.2e3,
                        wrong: None,
                    }),
                }
            })
            .collect()
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(8.0), "8B");
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label((1u64 << 30) as f64), "1G");
        assert_eq!(size_label(1536.0), "1536B");
        assert_eq!(time_label(0.5), "500ns");
        assert_eq!(time_label(1500.0), "1.5ms");
        assert_eq!(log_range((4.0, 4.0)), 2.0..8.0);
        assert_eq!(
            bounds([f64::NAN, 3.0, -1.0, 0.0, 7.0].into_iter(), true),
            Some((3.0, 7.0))
        );
        assert_eq!(bounds([f64::INFINITY].into_iter(), false), None);
    }

    #[test]
    fn svg_has_both_series_and_their_names() {
        let s = svg(&info(), &rows()).expect("drawn");
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>"),
            "{s:.200}"
        );
        // Per library: a curve in each panel, and its legend line in each.
        for color in ["#1F77B4", "#FF7F0E"] {
            let lines = s
                .matches(&format!("stroke=\"{color}\" stroke-width=\"2\""))
                .count();
            assert_eq!(lines, 4, "{color}");
        }
        assert_eq!(s.matches("<circle").count(), 4 * rows().len());
        assert!(s.contains("NCCL 2.28.3") && s.contains("mscclpp-rs"));
        assert!(s.contains("H200 &lt;x2&gt;") && s.contains("time per operation"));
        for label in ["8B", "4K", "128M", "10us", "1ms", "300.0"] {
            assert!(
                s.contains(&format!(">\n{label}\n<")),
                "no axis label {label}"
            );
        }
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }

    #[test]
    fn a_run_without_baseline_or_rows_still_plots() {
        let mut rows = rows();
        for r in &mut rows {
            r.base = None;
        }
        let s = svg(
            &RunInfo {
                baseline: None,
                ..info()
            },
            &rows[..1],
        )
        .expect("one row");
        assert_eq!(
            s.matches("#1F77B4").count(),
            2 + 2 + 2,
            "curves, legends, dots: {s}"
        );
        assert!(!s.contains("NCCL") && !s.contains("#FF7F0E"));
        let s = svg(&info(), &[]).expect("no rows");
        assert!(s.contains("no data"));
    }

    #[test]
    fn png_is_written() {
        let path = std::env::temp_dir().join(format!("mscclpp-plot-{}.png", std::process::id()));
        write(&path, PlotFormat::Png, &info(), &rows()).expect("drawn");
        let bytes = std::fs::read(&path).expect("written");
        let _ = std::fs::remove_file(&path);
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian.
        let dim = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!((dim(16), dim(20)), SIZE);
    }
}
