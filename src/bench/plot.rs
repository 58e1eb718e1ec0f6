//! `--plot FILE.svg`: time and bus bandwidth against size, ours and the baseline's, as a
//! hand-written SVG (two panels; log-scaled sizes; log-scaled time, linear bandwidth).

use std::fmt::Write as _;

use super::report::{Row, RunInfo};

const W: f64 = 1000.0;
const H: f64 = 440.0;
const PANEL_W: f64 = 400.0;
const PANEL_H: f64 = 300.0;
const TOP: f64 = 70.0;
const LEFT: [f64; 2] = [80.0, 580.0];
const OURS: &str = "#1f77b4";
const BASE: &str = "#ff7f0e";

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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A mapping of data to pixels along one axis.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    px0: f64,
    px1: f64,
}

impl Axis {
    fn new(lo: f64, hi: f64, log: bool, px0: f64, px1: f64) -> Self {
        let (mut lo, mut hi) = if log {
            (lo.log10(), hi.log10())
        } else {
            (lo, hi)
        };
        // A single value (or none finite): a unit range around it.
        if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
            lo -= 0.5;
            hi += 0.5;
        }
        Self {
            lo,
            hi,
            log,
            px0,
            px1,
        }
    }

    fn px(&self, v: f64) -> f64 {
        let v = if self.log { v.log10() } else { v };
        self.px0 + (v - self.lo) / (self.hi - self.lo) * (self.px1 - self.px0)
    }
}

/// Up to `max` powers of two from `lo` to `hi` (inclusive), evenly thinned.
fn size_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let (a, b) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    if b < a {
        return vec![lo];
    }
    let n = (b - a + 1) as usize;
    let step = n.div_ceil(max).max(1);
    (a..=b).step_by(step).map(|e| 2f64.powi(e)).collect()
}

fn time_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (a..=b).map(|e| 10f64.powi(e)).collect()
}

fn lin_ticks(hi: f64) -> Vec<f64> {
    let hi = if hi > 0.0 { hi } else { 1.0 };
    let raw = hi / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (0..=((hi / step).ceil() as usize))
        .map(|k| k as f64 * step)
        .collect()
}

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

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

#[allow(clippy::too_many_arguments)]
fn panel(
    s: &mut String,
    left: f64,
    title: &str,
    x: &Axis,
    y: &Axis,
    xticks: &[f64],
    yticks: &[(f64, String)],
    series: &[Series],
) {
    let (top, bottom, right) = (TOP, TOP + PANEL_H, left + PANEL_W);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
        left + PANEL_W / 2.0,
        top - 10.0,
        esc(title)
    );
    for &t in xticks {
        let px = x.px(t);
        let _ = writeln!(
            s,
            "<line x1=\"{px:.1}\" y1=\"{top:.1}\" x2=\"{px:.1}\" y2=\"{bottom:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            bottom + 16.0,
            size_label(t)
        );
    }
    for (t, label) in yticks {
        let py = y.px(*t);
        if py < top - 0.5 || py > bottom + 0.5 {
            continue;
        }
        let _ = writeln!(
            s,
            "<line x1=\"{left:.1}\" y1=\"{py:.1}\" x2=\"{right:.1}\" y2=\"{py:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            left - 6.0,
            py + 4.0,
            esc(label)
        );
    }
    let _ = writeln!(
        s,
        "<rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{PANEL_W}\" height=\"{PANEL_H}\" fill=\"none\" stroke=\"#444\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">message size</text>",
        left + PANEL_W / 2.0,
        bottom + 36.0
    );
    for (k, se) in series.iter().enumerate() {
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(|(a, b)| a.is_finite() && b.is_finite() && (!y.log || *b > 0.0))
            .map(|&(a, b)| format!("{:.1},{:.1}", x.px(a), y.px(b)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            se.color,
            pts.join(" ")
        );
        for p in &pts {
            let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                s,
                "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"2.5\" fill=\"{}\"/>",
                se.color
            );
        }
        let ly = top + 16.0 + 18.0 * k as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{}\" stroke-width=\"2\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>",
            left + 10.0,
            left + 30.0,
            se.color,
            left + 36.0,
            ly + 4.0,
            esc(se.name)
        );
    }
}

/// The SVG document for `rows`.
pub fn svg(info: &RunInfo, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let title = format!(
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
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{}</text>",
        W / 2.0,
        esc(&title)
    );
    if rows.is_empty() {
        s.push_str("<text x=\"500\" y=\"200\" text-anchor=\"middle\">no data</text>\n</svg>\n");
        return s;
    }
    let sizes: Vec<f64> = rows.iter().map(|r| r.size as f64).collect();
    let (xlo, xhi) = (
        sizes.iter().cloned().fold(f64::INFINITY, f64::min),
        sizes.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    );
    let base_name = info.baseline.clone().unwrap_or_else(|| "baseline".into());
    let series = |f: &dyn Fn(&Row) -> Option<f64>, g: &dyn Fn(&Row) -> Option<f64>| {
        let mut v = vec![Series {
            name: "mscclpp-rs",
            color: OURS,
            points: rows
                .iter()
                .filter_map(|r| Some((r.size as f64, f(r)?)))
                .collect(),
        }];
        if rows.iter().any(|r| r.base.is_some()) {
            v.push(Series {
                name: &base_name,
                color: BASE,
                points: rows
                    .iter()
                    .filter_map(|r| Some((r.size as f64, g(r)?)))
                    .collect(),
            });
        }
        v
    };
    let xticks = size_ticks(xlo, xhi, 8);
    for (k, left) in LEFT.iter().enumerate() {
        let x = Axis::new(xlo, xhi, true, left + 10.0, left + PANEL_W - 10.0);
        let (title, se, log) = if k == 0 {
            (
                "time per operation",
                series(&|r| Some(r.time_us), &|r| {
                    r.base.as_ref().map(|b| b.time_us)
                }),
                true,
            )
        } else {
            (
                "bus bandwidth (GB/s)",
                series(&|r| Some(r.busbw), &|r| r.base.as_ref().map(|b| b.busbw)),
                false,
            )
        };
        let ys: Vec<f64> = se
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .collect();
        let ylo = ys.iter().cloned().fold(f64::INFINITY, f64::min);
        let yhi = ys.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let (y, yticks): (Axis, Vec<(f64, String)>) = if log {
            let t = if ys.is_empty() {
                vec![1.0, 10.0]
            } else {
                time_ticks(ylo, yhi)
            };
            let (lo, hi) = (t[0], t[t.len() - 1]);
            (
                Axis::new(lo, hi, true, TOP + PANEL_H, TOP),
                t.iter().map(|&v| (v, time_label(v))).collect(),
            )
        } else {
            let t = lin_ticks(if ys.is_empty() { 1.0 } else { yhi });
            let hi = t[t.len() - 1];
            (
                Axis::new(0.0, hi, false, TOP + PANEL_H, TOP),
                t.iter().map(|&v| (v, format!("{v}"))).collect(),
            )
        };
        panel(&mut s, *left, title, &x, &y, &xticks, &yticks, &se);
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::BaseRow;

    #[test]
    fn labels_and_ticks() {
        assert_eq!(size_label(8.0), "8B");
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label((1u64 << 30) as f64), "1G");
        assert_eq!(size_label(1536.0), "1536B");
        assert_eq!(size_ticks(8.0, (1u64 << 30) as f64, 8).len(), 7);
        assert_eq!(
            time_ticks(3.0, 4000.0),
            vec![1.0, 10.0, 100.0, 1000.0, 10000.0]
        );
        assert_eq!(lin_ticks(370.0).last(), Some(&400.0));
    }

    #[test]
    fn svg_has_both_series() {
        let info = RunInfo {
            op: "allreduce",
            dtype: "f16",
            redop: "sum",
            inplace: true,
            nranks: 2,
            backend: "cuda",
            device: "H200 <x2>".into(),
            graph_launches: 1,
            baseline: Some("NCCL 2.28.3".into()),
        };
        let rows: Vec<Row> = (3..30)
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
            .collect();
        let s = svg(&info, &rows);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("NCCL 2.28.3") && s.contains("H200 &lt;x2&gt;"));
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }
}
