//! The per-call harness (`nccl/bench/percall.c`, issue 30 item 11) builds with the system C
//! compiler and runs against this drop-in on the CPU backend: one JSON line per collective ×
//! type × size × mode, a positive time for every eager measurement, the graph mode skipped
//! with its reason (no CUDA graphs there), and a usage error refused with exit status 2. The
//! GPU runs (ours against NVIDIA's `libnccl.so.2`) are `gpu-bundle/run-percall.sh`'s.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::ffi::lib_path;

const OPS: [&str; 10] = [
    "all_reduce",
    "all_reduce_avg",
    "all_reduce_premulsum",
    "all_gather",
    "reduce_scatter",
    "reduce_scatter_avg",
    "reduce_scatter_premulsum",
    "all_to_all",
    "broadcast",
    "reduce",
];
/// 8 B to 64 KiB by 8, the last size the maximum itself.
const SIZES: [u64; 6] = [8, 64, 512, 4096, 32768, 65536];
const DTYPES: [&str; 2] = ["float32", "bfloat16"];

/// A fresh directory of this test process for `what`.
fn scratch(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mscclpp-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("creating a temporary directory");
    d
}

/// Compiles the harness into `dir` (C11, `cc`).
fn build(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/percall.c");
    let exe = dir.join("nccl-percall");
    let out = Command::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("running cc (a C compiler is required)");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs the harness with `args` on the CPU backend, killed after `limit`.
fn run(exe: &Path, args: &[&str], limit: Duration) -> Output {
    Command::new("timeout")
        .arg(format!("{}", limit.as_secs()))
        .arg(exe)
        .args(args)
        .env("MSCCLPP_BACKEND", "cpu")
        .env("MSCCLPP_SOCKET_IFNAME", "lo")
        .env_remove("NCCL_DEBUG")
        .env_remove("MSCCLPP_LOG")
        .output()
        .expect("running the harness")
}

/// A string field of one JSON line (the harness writes no escapes in these).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}'])?;
    Some(&rest[..end])
}

#[test]
fn the_harness_times_every_collective_on_the_cpu_backend() {
    let dir = scratch("percall");
    let exe = build(&dir);
    let lib = format!("ours={}", lib_path().display());
    let out = run(
        &exe,
        &[
            "--cpu",
            "--lib",
            &lib,
            "--min",
            "8",
            "--max",
            "64K",
            "--step",
            "8",
            "--iters",
            "2",
            "--reps",
            "3",
            "--warmup",
            "1",
            "--dtypes",
            &DTYPES.join(","),
        ],
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the harness failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut eager = BTreeSet::new();
    let mut skipped = BTreeSet::new();
    for line in stdout.lines() {
        assert!(
            line.starts_with('{') && line.ends_with('}'),
            "not a JSON line: {line}"
        );
        assert_eq!(field(line, "lib"), Some("ours"), "{line}");
        let key = (
            field(line, "op").unwrap_or_default().to_owned(),
            field(line, "dtype").unwrap_or_default().to_owned(),
            field(line, "bytes")
                .and_then(|b| b.parse::<u64>().ok())
                .unwrap_or(0),
        );
        match field(line, "mode") {
            Some("eager") => {
                let us: f64 = field(line, "us_per_call")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no time in {line}"));
                let (lo, hi): (f64, f64) = (
                    field(line, "min_us").and_then(|v| v.parse().ok()).unwrap(),
                    field(line, "max_us").and_then(|v| v.parse().ok()).unwrap(),
                );
                assert!(
                    us > 0.0 && lo <= us && us <= hi,
                    "median outside its range: {line}"
                );
                assert!(eager.insert(key), "measured twice: {line}");
            }
            Some("graph") => {
                assert!(
                    field(line, "skipped").is_some_and(|r| r.contains("no CUDA graphs")),
                    "a graph line on the CPU backend that is not skipped: {line}"
                );
                skipped.insert(key);
            }
            _ => panic!("a line without a mode: {line}"),
        }
    }
    let want: BTreeSet<_> = OPS
        .iter()
        .flat_map(|op| {
            DTYPES.iter().flat_map(move |t| {
                SIZES
                    .iter()
                    .map(move |&b| (op.to_string(), t.to_string(), b))
            })
        })
        .collect();
    assert_eq!(eager, want, "eager measurements");
    assert_eq!(skipped, want, "graph lines skipped");
}

#[test]
fn the_harness_refuses_a_bad_command_line() {
    let dir = scratch("percall-usage");
    let exe = build(&dir);
    let out = run(&exe, &["--iters", "3"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "no --lib is a usage error");
    let out = run(
        &exe,
        &["--cpu", "--lib", "x=/nonexistent/libnccl.so.2"],
        Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "a library that cannot load fails"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot load"));
}
