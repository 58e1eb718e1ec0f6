//! `mscclpp-trace merge`: every rank's file of a directory into one Chrome trace-event JSON
//! (what `chrome://tracing` and Perfetto open).
//!
//! | Chrome | what |
//! |---|---|
//! | process (`pid`) | a rank (`rank R: host, backend device`) |
//! | threads `1…` | the rank's recording host threads (the caller's, `mscclpp-proxy`, …), named as they were |
//! | thread 99999 `GPU calls` | one span per collective call, from its first block's start to its last block's end: bytes and GB/s (the call's bytes over that time) |
//! | threads 100000 + b `GPU block b` | one span per launch of block `b` (start to end), named after its call (`all_reduce ll`), with a `comm` span inside from its `send` to its `recv` event (an instant for either alone: LL, staged and p2p kernels record one of them) |
//!
//! Every event is a complete event (`ph: X`, a start and a duration) or an instant (`ph: i`),
//! in microseconds from the earliest event of the run. Device times are mapped to the host's
//! clock per rank ([`RankTrace::device_to_host`]); ranks of one machine (the same boot id)
//! share the trace clock, ranks of different machines are lined up by their wall clocks.
//! A block whose `end` is missing (its launch stopped early, or was still running at the dump)
//! gets a span up to its last event with `"incomplete": true`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::file::RankTrace;
use crate::BoxError;

/// The thread id of a rank's `GPU calls` track.
pub const CALLS_TID: u64 = 99_999;
/// The thread id of block 0's track (block `b`: `BLOCK_TID + b`).
pub const BLOCK_TID: u64 = 100_000;

/// The merged trace, and what the merge noticed (incomplete files, approximate clocks, dropped
/// events).
#[derive(Debug)]
pub struct Merged {
    /// The Chrome trace-event JSON object.
    pub json: Value,
    /// Remarks for the user.
    pub notes: Vec<String>,
}

/// The per-rank files (`*.jsonl`) of `dir`, in name order.
pub fn rank_files(dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no trace files (*.jsonl)", dir.display()).into());
    }
    Ok(files)
}

/// Merges every rank file of `dir`.
pub fn merge_dir(dir: &Path) -> Result<Merged, BoxError> {
    let ranks = rank_files(dir)?
        .iter()
        .map(|p| RankTrace::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    merge(ranks)
}

/// What one call looks like on the device.
struct CallInfo {
    label: String,
    bytes: Option<u64>,
    algorithm: Option<String>,
    start: f64,
    end: f64,
}

/// Merges rank traces (module docs).
pub fn merge(mut ranks: Vec<RankTrace>) -> Result<Merged, BoxError> {
    ranks.sort_by_key(|r| r.header.rank);
    let mut notes = Vec::new();
    if let Some(w) = ranks
        .windows(2)
        .find(|w| w[0].header.rank == w[1].header.rank)
    {
        return Err(format!(
            "rank {} appears twice (two runs in one directory?)",
            w[0].header.rank
        )
        .into());
    }
    let boots: BTreeSet<&str> = ranks.iter().map(|r| r.header.boot_id.as_str()).collect();
    let one_machine = boots.len() <= 1 && !boots.contains("");
    if !one_machine && ranks.len() > 1 {
        notes.push(
            "ranks of several machines (or of unknown boots): lined up by their wall clocks".into(),
        );
    }
    // Every time, in ns on one axis; the origin is subtracted at the end.
    let mut events: Vec<(f64, Value)> = Vec::new();
    let mut meta = Vec::new();
    let mut rank_info = Vec::new();
    for r in &ranks {
        let h = &r.header;
        let pid = h.rank as u64;
        let shift = if one_machine {
            0.0
        } else {
            h.realtime_ns as f64 - h.monotonic_ns as f64
        };
        let (to_host, how) = r.device_to_host();
        let dev = |d: u64| to_host(d) + shift;
        let host = |t: u64| t as f64 + shift;
        if !r.complete {
            notes.push(format!(
                "rank {}: the file has no end line (cut short?)",
                h.rank
            ));
        }
        if how.starts_with("wall") && !r.blocks.is_empty() {
            notes.push(format!("rank {}: device times by {how}", h.rank));
        }
        if h.host_events_dropped > 0 || h.launches_dropped > 0 {
            notes.push(format!(
                "rank {}: {} host events and {} launches' block events were dropped (full rings)",
                h.rank, h.host_events_dropped, h.launches_dropped
            ));
        }
        rank_info.push(json!({
            "rank": h.rank, "host": h.host, "pid": h.pid, "backend": h.backend,
            "device": h.device, "device_clock": how, "clock_pairs": r.clocks.len(),
            "host_events_dropped": h.host_events_dropped, "launches": h.launches,
            "launches_dropped": h.launches_dropped,
        }));
        let name = format!("rank {}: {}, {} {}", h.rank, h.host, h.backend, h.device);
        meta.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}));
        meta.push(
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}),
        );
        for (tid, tname) in &r.threads {
            meta.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}}));
            meta.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}));
        }
        // Host events; the calls and launches they describe.
        let mut calls: BTreeMap<u64, CallInfo> = BTreeMap::new();
        let mut launch_call: BTreeMap<u64, u64> = BTreeMap::new();
        for e in &r.host {
            let mut ev = Map::new();
            ev.insert("name".into(), e.name.clone().into());
            ev.insert("cat".into(), e.cat.clone().into());
            ev.insert("pid".into(), pid.into());
            ev.insert("tid".into(), e.tid.into());
            ev.insert("args".into(), Value::Object(e.args.clone()));
            let start = host(e.start_ns);
            match e.end_ns {
                Some(end) => {
                    ev.insert("ph".into(), "X".into());
                    ev.insert(
                        "dur".into(),
                        ((end.saturating_sub(e.start_ns)) as f64 / 1e3).into(),
                    );
                }
                None => {
                    ev.insert("ph".into(), "i".into());
                    ev.insert("s".into(), "t".into());
                }
            }
            events.push((start, Value::Object(ev)));
            let arg = |k: &str| e.args.get(k).and_then(Value::as_u64);
            if e.cat == "call"
                && let Some(id) = arg("call")
            {
                let algorithm = e
                    .args
                    .get("algorithm")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let label = match &algorithm {
                    Some(a) => format!("{} {a}", e.name),
                    None => e.name.clone(),
                };
                calls.insert(
                    id,
                    CallInfo {
                        label,
                        bytes: arg("bytes"),
                        algorithm,
                        start: f64::INFINITY,
                        end: f64::NEG_INFINITY,
                    },
                );
            }
            if e.cat == "launch"
                && let (Some(l), Some(c)) = (arg("launch"), arg("call"))
            {
                launch_call.insert(l, c);
            }
        }
        // Block events, by (launch, block).
        let mut blocks: BTreeMap<(u32, u32), [Option<f64>; 4]> = BTreeMap::new();
        for b in &r.blocks {
            blocks.entry((b.launch, b.block)).or_default()[b.kind] = Some(dev(b.device_ns));
        }
        let mut used_blocks = BTreeSet::new();
        for (&(launch, block), times) in &blocks {
            let seen: Vec<f64> = times.iter().flatten().copied().collect();
            let Some(first) = seen.iter().copied().reduce(f64::min) else {
                continue;
            };
            let last = seen.iter().copied().fold(first, f64::max);
            let start = times[0].unwrap_or(first);
            let end = times[3].unwrap_or(last);
            let call = launch_call.get(&u64::from(launch)).copied();
            let info = call.and_then(|c| calls.get_mut(&c));
            let label = info
                .as_ref()
                .map_or_else(|| format!("launch {launch}"), |i| i.label.clone());
            if let Some(i) = info {
                i.start = i.start.min(start);
                i.end = i.end.max(end);
            }
            let tid = BLOCK_TID + u64::from(block);
            used_blocks.insert(block);
            let mut args = json!({"launch": launch, "block": block});
            if let Some(c) = call {
                args["call"] = c.into();
            }
            if times[0].is_none() || times[3].is_none() {
                args["incomplete"] = true.into();
            }
            events.push((
                start,
                json!({"ph": "X", "name": label, "cat": "kernel", "pid": pid, "tid": tid,
                       "dur": (end - start).max(0.0) / 1e3, "args": args}),
            ));
            match (times[1], times[2]) {
                (Some(s), Some(v)) => events.push((
                    s,
                    json!({"ph": "X", "name": "comm", "cat": "kernel", "pid": pid, "tid": tid,
                           "dur": (v - s).max(0.0) / 1e3,
                           "args": {"launch": launch, "block": block}}),
                )),
                (s, v) => {
                    for (t, n) in [(s, "send"), (v, "recv")] {
                        if let Some(t) = t {
                            events.push((
                                t,
                                json!({"ph": "i", "s": "t", "name": n, "cat": "kernel",
                                       "pid": pid, "tid": tid, "args": {"launch": launch}}),
                            ));
                        }
                    }
                }
            }
        }
        for b in &used_blocks {
            let tid = BLOCK_TID + u64::from(*b);
            meta.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                             "args": {"name": format!("GPU block {b}")}}),
            );
            meta.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                             "args": {"sort_index": tid}}),
            );
        }
        let mut any_call = false;
        for (id, c) in &calls {
            if c.end < c.start {
                continue;
            }
            any_call = true;
            let dur_ns = c.end - c.start;
            let mut args = json!({"call": id});
            if let Some(b) = c.bytes {
                args["bytes"] = b.into();
                if dur_ns > 0.0 {
                    args["GB/s"] = (b as f64 / dur_ns).into();
                }
            }
            if let Some(a) = &c.algorithm {
                args["algorithm"] = a.clone().into();
            }
            events.push((
                c.start,
                json!({"ph": "X", "name": c.label, "cat": "gpu call", "pid": pid,
                       "tid": CALLS_TID, "dur": dur_ns / 1e3, "args": args}),
            ));
        }
        if any_call {
            meta.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": CALLS_TID,
                             "args": {"name": "GPU calls"}}),
            );
            meta.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid,
                             "tid": CALLS_TID, "args": {"sort_index": CALLS_TID}}));
        }
    }
    let origin = events.iter().map(|(t, _)| *t).fold(f64::INFINITY, f64::min);
    let origin = if origin.is_finite() { origin } else { 0.0 };
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut trace_events = meta;
    for (t, mut e) in events {
        e["ts"] = ((t - origin) / 1e3).into();
        trace_events.push(e);
    }
    let json = json!({
        "traceEvents": trace_events,
        "displayTimeUnit": "ns",
        "otherData": {
            "format": "mscclpp-trace merge",
            "origin_ns": origin,
            "ranks": rank_info,
            "notes": notes,
        },
    });
    Ok(Merged { json, notes })
}
