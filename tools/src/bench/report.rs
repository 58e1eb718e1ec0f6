//! Rows of a collective sweep: the table on standard output (nccl-tests' columns), JSON lines,
//! and the closing summary.

use std::fmt::Write as _;

/// The baseline's numbers for one size.
#[derive(Clone, Debug)]
pub struct BaseRow {
    /// Mean over ranks of the time per operation, µs.
    pub time_us: f64,
    /// How the ranks' times differ, and why they may.
    pub spread: Spread,
    /// Bytes / time, GB/s.
    pub algbw: f64,
    /// `algbw` × the op's factor, GB/s.
    pub busbw: f64,
    /// Wrong elements over all ranks (with `-c`).
    pub wrong: Option<u64>,
}

/// One size of a sweep.
#[derive(Clone, Debug)]
pub struct Row {
    /// Bytes (nccl-tests' `size`).
    pub size: usize,
    /// Elements in `size`.
    pub count: usize,
    /// Our algorithm at this size.
    pub algo: String,
    /// Timed iterations per graph replay (or eager run).
    pub iters: u32,
    /// Mean over ranks of the time per operation, µs.
    pub time_us: f64,
    /// Bytes / time, GB/s.
    pub algbw: f64,
    /// `algbw` × the op's factor, GB/s.
    pub busbw: f64,
    /// Wrong elements over all ranks (with `-c`).
    pub wrong: Option<u64>,
    /// How the ranks' times differ, and why they may.
    pub spread: Spread,
    /// The baseline, if one ran.
    pub base: Option<BaseRow>,
}

/// The ranks' times of one measurement and how far apart their hosts launched the timed work.
/// Each rank times its own stream from just before its launch, so a rank that launches late
/// makes the others' kernels wait for it inside their timed interval: a slowest rank far above
/// the fastest, with a launch skew to match, is host skew, not the collective.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    /// The slowest rank's time per operation, µs.
    pub slowest_us: f64,
    /// The fastest rank's, µs.
    pub fastest_us: f64,
    /// Latest minus earliest host wall-clock time of the timed launch, µs.
    pub launch_skew_us: f64,
}

impl Spread {
    /// From every rank's (time per operation, launch wall-clock time), µs.
    pub fn of(ranks: &[(f64, f64)]) -> Self {
        let (mut s, mut launches) = (Self::default(), (f64::NAN, f64::NAN));
        (s.slowest_us, s.fastest_us) = (f64::NAN, f64::NAN);
        for &(time, launch) in ranks {
            (s.slowest_us, s.fastest_us) = (s.slowest_us.max(time), s.fastest_us.min(time));
            launches = (launches.0.min(launch), launches.1.max(launch));
        }
        s.launch_skew_us = launches.1 - launches.0;
        s
    }

    /// Whether the slowest rank took more than twice the fastest's time.
    pub fn uneven(&self) -> bool {
        self.slowest_us > 2.0 * self.fastest_us
    }
}

impl Row {
    /// Baseline time / our time.
    pub fn speedup(&self) -> Option<f64> {
        self.base.as_ref().map(|b| b.time_us / self.time_us)
    }
}

/// What every row shares (for JSON and the plot).
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// `allreduce`, …
    pub op: &'static str,
    /// `f16`, …
    pub dtype: &'static str,
    /// `sum`, …
    pub redop: &'static str,
    /// In place.
    pub inplace: bool,
    /// Ranks.
    pub nranks: usize,
    /// `cuda` or `cpu`.
    pub backend: &'static str,
    /// Device name of rank 0.
    pub device: String,
    /// Graph replays per timing (0: eager).
    pub graph_launches: u32,
    /// The baseline's name and version (`NCCL 2.28.3`).
    pub baseline: Option<String>,
}

/// The column header (two lines).
pub fn header(with_base: bool) -> String {
    let mut s = format!(
        "#{:>12} {:>12} {:>5} {:>7} {:>6} {:>11} {:>11} {:>11} {:>7}",
        "size(B)",
        "count",
        "type",
        "algo",
        "iters",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "#wrong"
    );
    if with_base {
        let _ = write!(
            s,
            " {:>11} {:>11} {:>8}",
            "nccl(us)", "nccl_busbw", "speedup"
        );
    }
    s
}

fn wrong_cell(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".to_string(), |w| w.to_string())
}

/// One table line.
pub fn line(r: &Row, dtype: &str) -> String {
    let mut s = format!(
        " {:>12} {:>12} {:>5} {:>7} {:>6} {:>11.2} {:>11.2} {:>11.2} {:>7}",
        r.size,
        r.count,
        dtype,
        r.algo,
        r.iters,
        r.time_us,
        r.algbw,
        r.busbw,
        wrong_cell(r.wrong)
    );
    if let (Some(b), Some(x)) = (&r.base, r.speedup()) {
        let _ = write!(s, " {:>11.2} {:>11.2} {:>7.2}x", b.time_us, b.busbw, x);
    }
    s
}

/// The closing lines: mean bus bandwidth, geometric-mean speed-up, wrong elements.
pub fn summary(rows: &[Row], checked: bool) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return "# no sizes ran\n".into();
    }
    let mean = |f: &dyn Fn(&Row) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    if let Some(m) = mean(&|r| Some(r.busbw)) {
        let _ = write!(s, "# Avg bus bandwidth    : {m:.3} GB/s");
    }
    if let Some(m) = mean(&|r| r.base.as_ref().map(|b| b.busbw)) {
        let _ = write!(s, " (baseline {m:.3} GB/s)");
    }
    s.push('\n');
    let ups: Vec<f64> = rows.iter().filter_map(Row::speedup).collect();
    if !ups.is_empty() {
        let geo = (ups.iter().map(|x| x.ln()).sum::<f64>() / ups.len() as f64).exp();
        let lo = ups.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = ups.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            s,
            "# Speed-up over baseline: geometric mean {geo:.2}x (min {lo:.2}x, max {hi:.2}x)"
        );
    }
    if checked {
        let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
        let base: Vec<u64> = rows
            .iter()
            .filter_map(|r| r.base.as_ref().and_then(|b| b.wrong))
            .collect();
        let _ = write!(s, "# Wrong elements       : {wrong}");
        if !base.is_empty() {
            let _ = write!(s, " (baseline {})", base.iter().sum::<u64>());
        }
        s.push_str(if wrong == 0 { " OK\n" } else { " FAILED\n" });
    }
    s
}

/// `x` rounded to 4 decimals (as the committed `benchmarks/**/*.json` hold them); `null` when
/// not finite (a baseline that did not run).
fn four_decimals<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64((x * 1e4).round() / 1e4)
    } else {
        s.serialize_none()
    }
}

/// [`four_decimals`] of a value that may be absent.
fn opt_four_decimals<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => four_decimals(x, s),
        None => s.serialize_none(),
    }
}

/// One line of `--json`: the row and what the run shares. The field names are the format:
/// `scripts/bench-tables.py` and the committed `benchmarks/**/*.json` use them. A field that
/// was not measured (no baseline, no `-c`) is `null`.
#[derive(Debug, serde::Serialize)]
pub struct JsonRow<'a> {
    op: &'a str,
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    dtype: &'a str,
    redop: &'a str,
    inplace: bool,
    algo: &'a str,
    nranks: usize,
    backend: &'a str,
    device: &'a str,
    graph_launches: u32,
    iters: u32,
    #[serde(serialize_with = "four_decimals")]
    time_us: f64,
    #[serde(serialize_with = "four_decimals")]
    algbw_gbps: f64,
    #[serde(serialize_with = "four_decimals")]
    busbw_gbps: f64,
    wrong: Option<u64>,
    baseline: Option<&'a str>,
    #[serde(serialize_with = "opt_four_decimals")]
    base_time_us: Option<f64>,
    #[serde(serialize_with = "opt_four_decimals")]
    base_algbw_gbps: Option<f64>,
    #[serde(serialize_with = "opt_four_decimals")]
    base_busbw_gbps: Option<f64>,
    base_wrong: Option<u64>,
    #[serde(serialize_with = "opt_four_decimals")]
    speedup: Option<f64>,
    #[serde(serialize_with = "four_decimals")]
    slowest_rank_us: f64,
    #[serde(serialize_with = "four_decimals")]
    fastest_rank_us: f64,
    #[serde(serialize_with = "four_decimals")]
    launch_skew_us: f64,
    #[serde(serialize_with = "opt_four_decimals")]
    base_slowest_rank_us: Option<f64>,
    #[serde(serialize_with = "opt_four_decimals")]
    base_fastest_rank_us: Option<f64>,
    #[serde(serialize_with = "opt_four_decimals")]
    base_launch_skew_us: Option<f64>,
}

impl<'a> JsonRow<'a> {
    /// The JSON line of `r`.
    pub fn new(info: &'a RunInfo, r: &'a Row) -> Self {
        let b = r.base.as_ref();
        Self {
            op: info.op,
            size: r.size,
            count: r.count,
            dtype: info.dtype,
            redop: info.redop,
            inplace: info.inplace,
            algo: &r.algo,
            nranks: info.nranks,
            backend: info.backend,
            device: &info.device,
            graph_launches: info.graph_launches,
            iters: r.iters,
            time_us: r.time_us,
            algbw_gbps: r.algbw,
            busbw_gbps: r.busbw,
            wrong: r.wrong,
            baseline: info.baseline.as_deref(),
            base_time_us: b.map(|b| b.time_us),
            base_algbw_gbps: b.map(|b| b.algbw),
            base_busbw_gbps: b.map(|b| b.busbw),
            base_wrong: b.and_then(|b| b.wrong),
            speedup: r.speedup(),
            slowest_rank_us: r.spread.slowest_us,
            fastest_rank_us: r.spread.fastest_us,
            launch_skew_us: r.spread.launch_skew_us,
            base_slowest_rank_us: b.map(|b| b.spread.slowest_us),
            base_fastest_rank_us: b.map(|b| b.spread.fastest_us),
            base_launch_skew_us: b.map(|b| b.spread.launch_skew_us),
        }
    }
}

/// One JSON object per row, one per line.
pub fn json_lines(info: &RunInfo, rows: &[Row]) -> Result<String, serde_json::Error> {
    let mut s = String::new();
    for r in rows {
        s.push_str(&serde_json::to_string(&JsonRow::new(info, r))?);
        s.push('\n');
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: usize, t: f64, base: Option<f64>) -> Row {
        Row {
            size,
            count: size / 2,
            algo: "ll".into(),
            iters: 20,
            time_us: t,
            algbw: size as f64 / t / 1e3,
            busbw: size as f64 / t / 1e3,
            wrong: Some(0),
            spread: Spread::default(),
            base: base.map(|b| BaseRow {
                time_us: b,
                spread: Spread::default(),
                algbw: 1.0,
                busbw: 1.0,
                wrong: None,
            }),
        }
    }

    #[test]
    fn spread_of_ranks() {
        let s = Spread::of(&[(10.0, 1_000.0), (2.5, 1_400.0)]);
        assert_eq!(
            (s.slowest_us, s.fastest_us, s.launch_skew_us),
            (10.0, 2.5, 400.0)
        );
        assert!(s.uneven());
        assert!(!Spread::of(&[(3.0, 5.0), (2.0, 5.0)]).uneven());
    }

    #[test]
    fn table_and_json() {
        let info = RunInfo {
            op: "allreduce",
            dtype: "f16",
            redop: "sum",
            inplace: true,
            nranks: 2,
            backend: "cuda",
            device: "NVIDIA \"H200\"".into(),
            graph_launches: 1,
            baseline: Some("NCCL 2.28.3".into()),
        };
        let rows = [row(8, 10.0, Some(20.0)), row(1 << 20, 100.0, Some(50.0))];
        assert!(line(&rows[0], "f16").contains("2.00x"));
        assert!(header(true).contains("#wrong") && header(true).contains("speedup"));
        let j = json_lines(&info, &rows).expect("serialised");
        assert_eq!(j.lines().count(), 2);
        let first: serde_json::Value = serde_json::from_str(j.lines().next().unwrap()).unwrap();
        assert_eq!(first["device"], "NVIDIA \"H200\"");
        assert_eq!(first["type"], "f16");
        assert_eq!(first["speedup"], 2.0);
        assert_eq!(first["algbw_gbps"], 0.0008, "rounded to 4 decimals: {j}");
        assert!(first["base_wrong"].is_null() && first["base_time_us"] == 20.0);
        // Not measured: null, as before.
        let mut lone = rows[0].clone();
        lone.base = None;
        lone.spread.launch_skew_us = f64::NAN;
        let v: serde_json::Value =
            serde_json::from_str(json_lines(&info, &[lone]).unwrap().trim()).unwrap();
        assert!(v["speedup"].is_null() && v["base_busbw_gbps"].is_null());
        assert!(v["launch_skew_us"].is_null());
        let s = summary(&rows, true);
        assert!(
            s.contains("geometric mean 1.00x") && s.contains("Wrong elements       : 0 OK"),
            "{s}"
        );
    }

    /// Our lines have exactly the fields of the committed benchmark files (the newest format),
    /// so `scripts/bench-tables.py` and older tooling read both.
    #[test]
    fn json_fields_match_the_committed_benchmarks() {
        // The run-time package directory: the GPU bundle runs from a copy of the repository.
        let committed = mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("../benchmarks/2xh200-2026-11-30-session6/ar.json");
        let text = std::fs::read_to_string(committed).expect("the committed benchmark file");
        let keys = |line: &str| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            v.as_object().expect("an object").keys().cloned().collect()
        };
        let info = RunInfo {
            op: "allreduce",
            dtype: "f16",
            redop: "sum",
            inplace: true,
            nranks: 2,
            backend: "cuda",
            device: "H200".into(),
            graph_launches: 1,
            baseline: None,
        };
        let ours = json_lines(&info, &[row(64, 2.0, Some(3.0))]).expect("serialised");
        assert_eq!(
            keys(ours.trim()),
            keys(text.lines().next().expect("a line"))
        );
    }
}
