//! Reading one rank's trace file (format `mscclpp-trace`, version 1; the format is documented
//! in `mscclpp_host::trace`).

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::BoxError;

/// The first line.
#[derive(Clone, Debug, Deserialize)]
pub struct Header {
    /// `mscclpp-trace`.
    pub format: String,
    /// The format's version.
    pub version: u32,
    /// The rank.
    pub rank: usize,
    /// Ranks of its communicator.
    pub nranks: usize,
    /// Its process.
    #[serde(default)]
    pub pid: u64,
    /// Its machine.
    #[serde(default)]
    pub host: String,
    /// The machine's boot id: files with the same one share `CLOCK_MONOTONIC`.
    #[serde(default)]
    pub boot_id: String,
    /// `cuda`, `cpu` or `none`.
    #[serde(default)]
    pub backend: String,
    /// The device's name.
    #[serde(default)]
    pub device: String,
    /// `host` (device times are trace-clock times) or `globaltimer`.
    #[serde(default)]
    pub device_clock: String,
    /// One reading of the trace clock …
    #[serde(default)]
    pub monotonic_ns: u64,
    /// … and of the wall clock at the same moment.
    #[serde(default)]
    pub realtime_ns: u64,
    /// Host events dropped by full rings.
    #[serde(default)]
    pub host_events_dropped: u64,
    /// Launches handed out.
    #[serde(default)]
    pub launches: u64,
    /// Launches whose block events were overwritten.
    #[serde(default)]
    pub launches_dropped: u64,
}

/// A host span or instant.
#[derive(Clone, Debug)]
pub struct HostRecord {
    /// The recording thread.
    pub tid: u64,
    /// `call`, `launch`, `proxy`, `setup`, `user`.
    pub cat: String,
    /// What it is.
    pub name: String,
    /// Start (trace clock, ns).
    pub start_ns: u64,
    /// End; `None` for an instant.
    pub end_ns: Option<u64>,
    /// Its arguments.
    pub args: Map<String, Value>,
}

/// One block event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    /// The launch.
    pub launch: u32,
    /// The block.
    pub block: u32,
    /// 0 start, 1 send, 2 recv, 3 end.
    pub kind: usize,
    /// Device clock, ns.
    pub device_ns: u64,
}

/// Block event kinds, in slot order.
pub const BLOCK_KINDS: [&str; 4] = ["start", "send", "recv", "end"];

/// One clock pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct ClockRecord {
    /// Host trace clock.
    pub host_ns: u64,
    /// Device clock.
    pub device_ns: u64,
    /// Half the round trip.
    pub error_ns: u64,
}

/// A whole rank's file.
#[derive(Clone, Debug)]
pub struct RankTrace {
    /// The header.
    pub header: Header,
    /// Thread names by tid.
    pub threads: Vec<(u64, String)>,
    /// Host events, in file order.
    pub host: Vec<HostRecord>,
    /// Clock pairs, in file order.
    pub clocks: Vec<ClockRecord>,
    /// Block events.
    pub blocks: Vec<BlockRecord>,
    /// Whether the `end` line was there (the file is complete).
    pub complete: bool,
}

fn field<'a>(v: &'a Value, key: &str, line: usize) -> Result<&'a Value, BoxError> {
    v.get(key)
        .ok_or_else(|| format!("line {line}: no `{key}`").into())
}

fn u64_of(v: &Value, key: &str, line: usize) -> Result<u64, BoxError> {
    field(v, key, line)?
        .as_u64()
        .ok_or_else(|| format!("line {line}: `{key}` is not an unsigned integer").into())
}

fn str_of(v: &Value, key: &str, line: usize) -> Result<String, BoxError> {
    Ok(field(v, key, line)?
        .as_str()
        .ok_or_else(|| format!("line {line}: `{key}` is not a string"))?
        .to_string())
}

impl RankTrace {
    /// Parses a file's text. Lines of an unknown `type` are skipped (a later version may add
    /// some); a wrong format or version, or a malformed known line, is an error naming the line.
    pub fn parse(text: &str) -> Result<Self, BoxError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let (_, first) = lines.next().ok_or("the file is empty")?;
        let header: Header =
            serde_json::from_str(first).map_err(|e| format!("line 1: not a header: {e}"))?;
        if header.format != "mscclpp-trace" {
            return Err(
                format!("line 1: format {:?}, not \"mscclpp-trace\"", header.format).into(),
            );
        }
        if header.version != 1 {
            return Err(format!(
                "line 1: format version {} (this tool reads version 1)",
                header.version
            )
            .into());
        }
        let mut t = RankTrace {
            header,
            threads: Vec::new(),
            host: Vec::new(),
            clocks: Vec::new(),
            blocks: Vec::new(),
            complete: false,
        };
        for (i, l) in lines {
            let n = i + 1;
            let v: Value = serde_json::from_str(l).map_err(|e| format!("line {n}: {e}"))?;
            match v.get("type").and_then(Value::as_str) {
                Some("thread") => t
                    .threads
                    .push((u64_of(&v, "tid", n)?, str_of(&v, "name", n)?)),
                Some(kind @ ("span" | "instant")) => {
                    let args = match v.get("args") {
                        Some(Value::Object(m)) => m.clone(),
                        None => Map::new(),
                        Some(_) => return Err(format!("line {n}: `args` is not an object").into()),
                    };
                    t.host.push(HostRecord {
                        tid: u64_of(&v, "tid", n)?,
                        cat: str_of(&v, "cat", n)?,
                        name: str_of(&v, "name", n)?,
                        start_ns: u64_of(&v, "start_ns", n)?,
                        end_ns: if kind == "span" {
                            Some(u64_of(&v, "end_ns", n)?)
                        } else {
                            None
                        },
                        args,
                    });
                }
                Some("clock") => t
                    .clocks
                    .push(serde_json::from_value(v).map_err(|e| format!("line {n}: {e}"))?),
                Some("block") => {
                    let kind = str_of(&v, "kind", n)?;
                    let kind = BLOCK_KINDS
                        .iter()
                        .position(|k| *k == kind)
                        .ok_or_else(|| format!("line {n}: unknown block event {kind:?}"))?;
                    let small = |key: &str| -> Result<u32, BoxError> {
                        u32::try_from(u64_of(&v, key, n)?)
                            .map_err(|_| format!("line {n}: `{key}` out of range").into())
                    };
                    t.blocks.push(BlockRecord {
                        launch: small("launch")?,
                        block: small("block")?,
                        kind,
                        device_ns: u64_of(&v, "device_ns", n)?,
                    });
                }
                Some("end") => t.complete = true,
                Some("header") => return Err(format!("line {n}: a second header").into()),
                _ => {}
            }
        }
        Ok(t)
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, BoxError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()).into())
    }

    /// A function from this rank's device clock to its trace clock: the identity when the
    /// device clock is the trace clock; else the line through the first and last clock pairs
    /// (one pair: an offset); with none, the wall-clock reading of the header (a GPU's
    /// `%globaltimer` counts from the Unix epoch), which is only approximate. The second value
    /// says how it was made.
    pub fn device_to_host(&self) -> (impl Fn(u64) -> f64 + use<>, &'static str) {
        let h = &self.header;
        let (slope, d0, h0, how) = if h.device_clock == "host" {
            (1.0, 0.0, 0.0, "same clock")
        } else {
            match (self.clocks.first(), self.clocks.last()) {
                (Some(a), Some(b)) if b.device_ns > a.device_ns + 1_000_000 => (
                    (b.host_ns as f64 - a.host_ns as f64)
                        / (b.device_ns as f64 - a.device_ns as f64),
                    a.device_ns as f64,
                    a.host_ns as f64,
                    "clock pairs",
                ),
                (Some(a), _) => (1.0, a.device_ns as f64, a.host_ns as f64, "one clock pair"),
                _ => (
                    1.0,
                    h.realtime_ns as f64,
                    h.monotonic_ns as f64,
                    "wall clock (approximate: no clock pair)",
                ),
            }
        };
        (move |d: u64| h0 + (d as f64 - d0) * slope, how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"type":"header","format":"mscclpp-trace","version":1,"rank":1,"nranks":2,"device_clock":"globaltimer","monotonic_ns":100,"realtime_ns":5000,"future_field":7}"#;

    #[test]
    fn a_file_parses_and_unknown_lines_and_fields_are_skipped() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            r#"{"type":"thread","tid":1,"name":"main"}"#,
            r#"{"type":"span","tid":1,"cat":"call","name":"all_reduce","start_ns":10,"end_ns":20,"args":{"bytes":8}}"#,
            r#"{"type":"clock","host_ns":1000,"device_ns":11000,"error_ns":5}"#,
            r#"{"type":"block","launch":3,"block":0,"kind":"recv","device_ns":11500}"#,
            r#"{"type":"something_new","x":1}"#,
            r#"{"type":"end"}"#
        );
        let t = RankTrace::parse(&text).unwrap();
        assert_eq!(t.header.rank, 1);
        assert_eq!(t.threads, vec![(1, "main".to_string())]);
        assert_eq!(t.host[0].end_ns, Some(20));
        assert_eq!(t.host[0].args["bytes"], 8);
        assert_eq!(t.blocks[0].kind, 2);
        assert!(t.complete);
        let (map, how) = t.device_to_host();
        assert_eq!(how, "one clock pair");
        assert_eq!(map(11500), 1500.0);
    }

    #[test]
    fn wrong_format_or_version_or_garbage_is_refused_with_its_line() {
        let bad_version = HEADER.replace("\"version\":1", "\"version\":2");
        assert!(
            RankTrace::parse(&bad_version)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
        assert!(RankTrace::parse("{\"format\":\"x\"}").is_err());
        let garbage = format!("{HEADER}\n{{\"type\":\"block\",\"launch\":1}}\n");
        let e = RankTrace::parse(&garbage).unwrap_err().to_string();
        assert!(e.starts_with("line 2:"), "{e}");
    }

    #[test]
    fn two_clock_pairs_correct_drift() {
        let text = format!(
            "{HEADER}\n{}\n{}\n",
            r#"{"type":"clock","host_ns":0,"device_ns":1000000000,"error_ns":1}"#,
            r#"{"type":"clock","host_ns":2000000000,"device_ns":3000000002,"error_ns":1}"#
        );
        let t = RankTrace::parse(&text).unwrap();
        let (map, how) = t.device_to_host();
        assert_eq!(how, "clock pairs");
        assert!((map(2000000001) - 1e9).abs() < 1.0);
    }
}
