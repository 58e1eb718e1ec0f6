//! `mscclpp-trace plot`: a merged trace drawn as a timeline (PNG or SVG) by `plotters`, for
//! machines without a browser: one row per track (each rank's host threads, its `GPU calls`
//! and its GPU blocks), a bar per span (nested spans narrower, over their parents), colours by
//! category.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use crate::BoxError;
use crate::bench::plot::{FAMILY, font};

/// One drawn span.
#[derive(Clone, Debug)]
struct Bar {
    track: usize,
    depth: usize,
    start: f64,
    end: f64,
    cat: String,
}

/// A track: (pid, tid) and its label.
#[derive(Clone, Debug)]
struct Track {
    key: (u64, u64),
    label: String,
}

/// The colour of a category.
fn colour(cat: &str, depth: usize) -> RGBColor {
    let c = match cat {
        "call" => RGBColor(0x1f, 0x77, 0xb4),
        "gpu call" => RGBColor(0x2c, 0xa0, 0x2c),
        "kernel" => RGBColor(0xff, 0x7f, 0x0e),
        "proxy" => RGBColor(0x94, 0x67, 0xbd),
        "setup" => RGBColor(0x7f, 0x7f, 0x7f),
        "user" => RGBColor(0x17, 0xbe, 0xcf),
        _ => RGBColor(0x8c, 0x56, 0x4b),
    };
    if depth == 0 {
        c
    } else {
        // Darker inside.
        RGBColor(c.0 / 5 * 3, c.1 / 5 * 3, c.2 / 5 * 3)
    }
}

/// A thread of a merged trace: (pid, tid).
type ThreadKey = (u64, u64);
/// A span as drawn: start and end (µs) and its category.
type SpanRec = (f64, f64, String);
/// What [`layout`] returns: the tracks, the bars and the time window (µs).
type Layout = (Vec<Track>, Vec<Bar>, Range<f64>);

/// The tracks and bars of a merged trace, and the time window to show (µs).
fn layout(trace: &Value, window: Option<Range<f64>>) -> Result<Layout, BoxError> {
    let events = trace
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("not a merged trace: no traceEvents array")?;
    let mut names: BTreeMap<ThreadKey, String> = BTreeMap::new();
    let mut spans: BTreeMap<ThreadKey, Vec<SpanRec>> = BTreeMap::new();
    for e in events {
        let pid = e.get("pid").and_then(Value::as_u64).unwrap_or(0);
        let tid = e.get("tid").and_then(Value::as_u64).unwrap_or(0);
        let name = |k: &str| e.pointer(k).and_then(Value::as_str).map(str::to_string);
        match e.get("ph").and_then(Value::as_str) {
            Some("M") => {
                if e.get("name").and_then(Value::as_str) == Some("thread_name")
                    && let Some(n) = name("/args/name")
                {
                    names.insert((pid, tid), n);
                }
            }
            Some("X") => {
                let ts = e
                    .get("ts")
                    .and_then(Value::as_f64)
                    .ok_or("an X event without ts")?;
                let dur = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0);
                let cat = name("/cat").unwrap_or_default();
                spans
                    .entry((pid, tid))
                    .or_default()
                    .push((ts, ts + dur, cat));
            }
            _ => {}
        }
    }
    // The window: what was asked, else the calls and kernels (set-up takes far longer).
    let busy = |keep: &dyn Fn(&str) -> bool| {
        spans.values().flatten().filter(|(_, _, c)| keep(c)).fold(
            None,
            |acc: Option<(f64, f64)>, (s, e, _)| match acc {
                None => Some((*s, *e)),
                Some((a, b)) => Some((a.min(*s), b.max(*e))),
            },
        )
    };
    let window = match window {
        Some(w) => w,
        None => {
            let (a, b) = busy(&|c| c != "setup")
                .or_else(|| busy(&|_| true))
                .ok_or("the trace has no spans to draw")?;
            let pad = ((b - a) * 0.02).max(1.0);
            (a - pad)..(b + pad)
        }
    };
    let mut tracks = Vec::new();
    let mut bars = Vec::new();
    for (key, mut list) in spans {
        let visible: Vec<_> = list
            .iter()
            .filter(|(s, e, _)| *e >= window.start && *s <= window.end)
            .collect();
        if visible.is_empty() {
            continue;
        }
        let track = tracks.len();
        let thread = names
            .get(&key)
            .cloned()
            .unwrap_or_else(|| format!("tid {}", key.1));
        tracks.push(Track {
            key,
            label: format!("r{} {thread}", key.0),
        });
        // Depth: how many earlier spans of the track still run at this one's start.
        list.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (s, e, cat) in list {
            open.retain(|&end| end > s);
            let depth = open.len();
            open.push(e);
            if e >= window.start && s <= window.end {
                bars.push(Bar {
                    track,
                    depth,
                    start: s.max(window.start),
                    end: e.min(window.end),
                    cat,
                });
            }
        }
    }
    Ok((tracks, bars, window))
}

/// The categories the legend names, with their words.
const LEGEND: [(&str, &str); 6] = [
    ("call", "host call"),
    ("gpu call", "GPU call"),
    ("kernel", "GPU block (darker: send to recv)"),
    ("proxy", "proxy (darker: copy, signal, flush)"),
    ("setup", "set-up"),
    ("user", "program's span"),
];

/// `0.5 ms`, `20 µs`: an axis label for `us` microseconds into the window.
fn axis_label(us: f64) -> String {
    if us.abs() >= 1e3 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    tracks: &[Track],
    bars: &[Bar],
    window: Range<f64>,
    title: &str,
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (width, height) = root.dim_in_pixel();
    let (body, legend) = root.split_vertically(height.saturating_sub(28));
    let n = tracks.len().max(1) as f64;
    let len = window.end - window.start;
    let mut chart = ChartBuilder::on(&body)
        .caption(title, (FAMILY, 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(230)
        .build_cartesian_2d(0.0..len, n..0.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_labels(10)
        .x_label_formatter(&|x: &f64| axis_label(*x))
        .label_style((FAMILY, 12))
        .draw()
        .map_err(|e| err(&e))?;
    let mut sorted: Vec<&Bar> = bars.iter().collect();
    sorted.sort_by_key(|b| b.depth);
    // At least a hair wide, so that short spans show.
    let min_w = len / 1500.0;
    chart
        .draw_series(sorted.iter().map(|b| {
            let shrink = 0.1 + 0.12 * b.depth.min(3) as f64;
            let top = b.track as f64 + shrink;
            let bottom = b.track as f64 + 1.0 - shrink;
            let (s, e) = (b.start - window.start, b.end - window.start);
            Rectangle::new(
                [(s, top), (e.max(s + min_w), bottom)],
                colour(&b.cat, b.depth).filled(),
            )
        }))
        .map_err(|e| err(&e))?;
    // Track names, right-aligned left of the plot.
    for (i, t) in tracks.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(0.0, i as f64 + 0.5));
        let style =
            TextStyle::from((FAMILY, 12).into_font()).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Right,
                plotters::style::text_anchor::VPos::Center,
            ));
        body.draw_text(&t.label, &style, (x - 6, y))
            .map_err(|e| err(&e))?;
    }
    // The legend: a box and the words of each category.
    let mut x = 240i32;
    for (cat, words) in LEGEND {
        legend
            .draw(&Rectangle::new(
                [(x, 8), (x + 14, 20)],
                colour(cat, 0).filled(),
            ))
            .map_err(|e| err(&e))?;
        legend
            .draw_text(
                words,
                &TextStyle::from((FAMILY, 12).into_font()),
                (x + 20, 8),
            )
            .map_err(|e| err(&e))?;
        x += 40 + 7 * words.len() as i32;
        if x as u32 > width {
            break;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Draws the merged trace `trace` into `out` (`.png` or `.svg`), showing `window` (µs; by
/// default the span of its calls and kernels).
pub fn plot(trace: &Value, out: &Path, window: Option<Range<f64>>) -> Result<(), BoxError> {
    font()?;
    let (tracks, bars, window) = layout(trace, window)?;
    let ranks = tracks
        .iter()
        .map(|t| t.key.0)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let title = format!(
        "mscclpp trace: {ranks} rank(s), {} from {} into the trace",
        axis_label(window.end - window.start),
        axis_label(window.start)
    );
    let size = (1600u32, 110 + 26 * tracks.len().max(1) as u32);
    match out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("png") => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            draw(&root, &tracks, &bars, window, &title)
        }
        Some("svg") => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            draw(&root, &tracks, &bars, window, &title)
        }
        _ => Err(format!("{}: the file name ends in .png or .svg", out.display()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trace() -> Value {
        json!({"traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "main"}},
            {"ph": "X", "name": "collectives", "cat": "setup", "pid": 0, "tid": 1, "ts": 0.0, "dur": 5000.0},
            {"ph": "X", "name": "all_reduce", "cat": "call", "pid": 0, "tid": 1, "ts": 6000.0, "dur": 10.0},
            {"ph": "X", "name": "all_reduce ll", "cat": "kernel", "pid": 0, "tid": 100000, "ts": 6005.0, "dur": 20.0},
            {"ph": "X", "name": "comm", "cat": "kernel", "pid": 0, "tid": 100000, "ts": 6008.0, "dur": 10.0},
        ]})
    }

    #[test]
    fn the_default_window_is_the_calls_and_nested_spans_go_deeper() {
        let (tracks, bars, w) = layout(&trace(), None).unwrap();
        assert!(
            w.start > 5000.0 && w.start < 6000.0 && w.end > 6025.0 && w.end < 6100.0,
            "{w:?}"
        );
        assert_eq!(tracks.len(), 2);
        assert_eq!(tracks[0].label, "r0 main");
        let comm = bars
            .iter()
            .find(|b| b.cat == "kernel" && b.depth == 1)
            .unwrap();
        assert_eq!((comm.start, comm.end), (6008.0, 6018.0));
        // The set-up span ends before the window.
        assert!(!bars.iter().any(|b| b.cat == "setup"));
    }

    #[test]
    fn a_png_is_drawn() {
        let out = std::env::temp_dir().join(format!("mscclpp-timeline-{}.png", std::process::id()));
        plot(&trace(), &out, None).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        assert!(plot(&trace(), Path::new("x.jpg"), None).is_err());
    }
}
