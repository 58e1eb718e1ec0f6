//! `mscclpp-bench` and `mscclpp-run` as a user runs them, on the CPU backend: every collective
//! checked with `-c` (every row's `#wrong` is 0), the CPU notice, JSON, SVG and PNG output,
//! ranks as processes under `mscclpp-run`, the primitives, `MSCCLPP_LOG`, and clear errors
//! for bad command lines.
//!
//! The binaries are found through `CARGO_BIN_EXE_*`, or, in a GPU bundle
//! (`scripts/gpu-bundle.sh`: this test in `gpu-bundle/tests/`, the tools in
//! `gpu-bundle/bin/`), beside it; where neither is there the tests print NOT RUN and pass.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Where the tool `name` is: cargo's path, else the bundle's `bin/` beside our folder.
fn tool(name: &str, cargo_path: &str) -> Option<PathBuf> {
    let cargo = PathBuf::from(cargo_path);
    if cargo.exists() {
        return Some(cargo);
    }
    let exe = std::env::current_exe().ok()?;
    let bundled = exe.parent()?.parent()?.join("bin").join(name);
    bundled.exists().then_some(bundled)
}

fn bench_path() -> &'static Option<PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| tool("mscclpp-bench", env!("CARGO_BIN_EXE_mscclpp-bench")))
}

fn run_path() -> &'static Option<PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| tool("mscclpp-run", env!("CARGO_BIN_EXE_mscclpp-run")))
}

/// `mscclpp-bench`'s path (checked by [`have_binaries`] first).
fn bench() -> String {
    bench_path()
        .as_ref()
        .map_or_else(String::new, |p| p.display().to_string())
}

/// `mscclpp-run`'s path.
fn run_tool() -> String {
    run_path()
        .as_ref()
        .map_or_else(String::new, |p| p.display().to_string())
}

/// Launcher variables that would turn the bench into one rank of a job.
const LAUNCHER_VARS: [&str; 8] = [
    "MSCCLPP_RANK",
    "MSCCLPP_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

fn have_binaries() -> bool {
    let ok = bench_path().is_some() && run_path().is_some();
    if !ok {
        eprintln!(
            "NOT RUN: mscclpp-bench or mscclpp-run is neither at cargo's path nor in the bundle's bin/"
        );
    }
    ok
}

/// Runs `program args` on the CPU backend, outside any launcher, with `env` set.
fn run_with(program: &str, args: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(program);
    c.args(args.split_whitespace())
        .env("MSCCLPP_BACKEND", "cpu")
        .env_remove("MSCCLPP_LOG");
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    c.output().expect("start the binary")
}

/// Runs `program args` on the CPU backend, outside any launcher.
fn run(program: &str, args: &str) -> Output {
    run_with(program, args, &[])
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The table rows (lines that are not comments), split into columns, without a rank prefix.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .map(|l| l.strip_prefix("[0] ").unwrap_or(l))
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Asserts success, `n` rows, and `#wrong` (column 9) 0 on each.
fn assert_all_correct(o: &Output, n: usize, what: &str) {
    let (out, err) = text(o);
    assert!(o.status.success(), "{what}: {:?}\n{out}\n{err}", o.status);
    let rows = rows(&out);
    assert_eq!(rows.len(), n, "{what}: rows\n{out}");
    for r in &rows {
        assert!(r.len() >= 9, "{what}: short row {r:?}");
        assert_eq!(r[8], "0", "{what}: #wrong in {r:?}\n{out}");
    }
    assert!(out.contains("Wrong elements       : 0 OK"), "{what}\n{out}");
}

#[test]
fn allreduce_checked_on_the_cpu_backend() {
    if !have_binaries() {
        return;
    }
    let o = run(&bench(), "allreduce -b 8 -e 64K -f 4 -c -n 2 -w 1");
    assert_all_correct(&o, 7, "allreduce");
    let (out, _) = text(&o);
    assert!(out.contains("# CPU backend"), "no CPU notice:\n{out}");
    assert!(out.contains("2 ranks as threads"), "{out}");
    // Both algorithms, forced, out of place, every type and reduction.
    for (algo, sizes) in [("ll", "-b 4 -e 4K -f 32"), ("staged", "-b 4 -e 200K -f 50")] {
        for (d, op) in [
            ("f32", "min"),
            ("bf16", "sum"),
            ("i32", "max"),
            ("u32", "sum"),
            ("f16", "max"),
        ] {
            let args = format!(
                "allreduce {sizes} -c -n 1 -w 0 -a {algo} -d {d} -o {op} --outofplace -g 3"
            );
            let o = run(&bench(), &args);
            assert_all_correct(&o, 3, &args);
        }
    }
}

#[test]
fn every_collective_checked_on_the_cpu_backend() {
    if !have_binaries() {
        return;
    }
    for op in [
        "allgather",
        "reducescatter",
        "broadcast",
        "alltoall",
        "sendrecv",
        "reduce",
        "gather",
        "scatter",
        "alltoallv",
    ] {
        for place in ["--inplace", "--outofplace"] {
            let args = format!("{op} -b 96 -e 96K -f 32 -c -n 1 -w 1 -g 3 -r 2 -d bf16 {place}");
            assert_all_correct(&run(&bench(), &args), 3, &args);
        }
    }
}

/// The reduce by every reduction, and every type through the collectives added with it (on
/// three ranks, so that the averages of floats are inexact and checked within their bound).
#[test]
fn every_type_and_reduction_checked_on_the_cpu_backend() {
    if !have_binaries() {
        return;
    }
    for op in ["sum", "prod", "min", "max", "avg", "premulsum"] {
        for d in ["f32", "i8", "e4m3"] {
            let args = format!("reduce -b 40 -e 40K -f 1000 -c -n 1 -w 0 -g 3 -r 1 -d {d} -o {op}");
            assert_all_correct(&run(&bench(), &args), 2, &args);
        }
    }
    for d in [
        "f32", "f16", "bf16", "i32", "u32", "i8", "u8", "i64", "u64", "f64", "e4m3", "e5m2",
    ] {
        for op in ["allreduce -o avg", "alltoallv", "gather"] {
            let args = format!("{op} -b 96 -e 96 -c -n 1 -w 0 -g 3 -d {d}");
            assert_all_correct(&run(&bench(), &args), 1, &args);
        }
    }
}

#[test]
fn json_lines_and_plots() {
    if !have_binaries() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mscclpp-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, svg, png) = (dir.join("ar.json"), dir.join("ar.svg"), dir.join("ar.png"));
    let args = format!(
        "allreduce -b 1K -e 16K -f 2 -c -n 2 -w 1 --json {} --plot {}",
        json.display(),
        svg.display()
    );
    assert_all_correct(&run(&bench(), &args), 5, &args);
    let j = std::fs::read_to_string(&json).expect("json written");
    assert_eq!(j.lines().count(), 5, "{j}");
    for (l, size) in j.lines().zip([1024, 2048, 4096, 8192, 16384]) {
        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object per line");
        assert_eq!(v["op"], "allreduce", "{l}");
        assert_eq!(
            (v["size"].as_u64(), v["count"].as_u64()),
            (Some(size), Some(size / 2))
        );
        assert_eq!(
            (&v["wrong"], &v["backend"], &v["nranks"]),
            (&0.into(), &"cpu".into(), &2.into())
        );
        assert!(v["time_us"].as_f64().is_some_and(|t| t > 0.0), "{l}");
        assert!(v["baseline"].is_null() && v["speedup"].is_null(), "{l}");
    }
    assert!(
        j.starts_with("{\"op\":\"allreduce\",\"size\":1024,"),
        "field order: {j}"
    );
    let s = std::fs::read_to_string(&svg).expect("svg written");
    assert!(s.starts_with("<svg") && s.contains("<polyline"), "{s}");
    assert!(
        s.contains("allreduce f16 sum (in place), 2 ranks, cpu"),
        "title: {s}"
    );
    let args = format!(
        "allgather -b 1K -e 4K -f 4 -n 1 -w 0 --plot {}",
        png.display()
    );
    let o = run(&bench(), &args);
    assert!(o.status.success(), "{args}: {:?}", text(&o));
    let p = std::fs::read(&png).expect("png written");
    assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `MSCCLPP_LOG` shows the library's events on standard error; without it, none below
/// warnings; a bad one is reported and the run goes on.
#[test]
fn mscclpp_log_shows_the_library_events() {
    if !have_binaries() {
        return;
    }
    let args = "allreduce -b 8 -e 8 -c -n 1 -w 0";
    let quiet = run(&bench(), args);
    assert_all_correct(&quiet, 1, "no MSCCLPP_LOG");
    assert!(!text(&quiet).1.contains("DEBUG"), "{}", text(&quiet).1);
    let loud = run_with(&bench(), args, &[("MSCCLPP_LOG", "mscclpp_host=debug")]);
    assert_all_correct(&loud, 1, "MSCCLPP_LOG=mscclpp_host=debug");
    let err = text(&loud).1;
    assert!(
        err.lines()
            .any(|l| l.contains("DEBUG") && l.contains("mscclpp_host")),
        "{err}"
    );
    let bad = run_with(&bench(), args, &[("MSCCLPP_LOG", "mscclpp_host=loud")]);
    assert_all_correct(&bad, 1, "MSCCLPP_LOG=mscclpp_host=loud");
    let err = text(&bad).1;
    assert!(
        err.contains("mscclpp-bench: MSCCLPP_LOG=\"mscclpp_host=loud\" is not a log filter"),
        "{err}"
    );
}

#[test]
fn ranks_as_processes_under_mscclpp_run() {
    if !have_binaries() {
        return;
    }
    let o = run(
        &run_tool(),
        &format!("-n 2 -- {} allreduce -b 8 -e 4K -f 8 -c -n 2 -w 1", bench()),
    );
    assert_all_correct(&o, 4, "mscclpp-run allreduce");
    let (out, _) = text(&o);
    assert!(out.contains("[0] # CPU backend"), "{out}");
    assert!(
        out.contains("2 ranks as processes (MSCCLPP_RANK set)"),
        "{out}"
    );
    // Three processes, a collective with parts.
    let o = run(
        &run_tool(),
        &format!(
            "-n 3 -- {} reducescatter -b 96 -e 96K -f 32 -c -n 1 -w 1",
            bench()
        ),
    );
    assert_all_correct(&o, 3, "mscclpp-run reducescatter");
    // A failing rank fails the job with its status. Whichever rank fails first stops the
    // other, so only one of them is sure to have printed its message.
    let o = run(
        &run_tool(),
        &format!("-n 2 -- {} allreduce -d f128", bench()),
    );
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    let err = text(&o).1;
    assert!(
        err.contains("[0] error: invalid value 'f128' for '--datatype <T>'")
            || err.contains("[1] error: invalid value 'f128' for '--datatype <T>'"),
        "{err:?}"
    );
}

#[test]
fn primitives_still_run() {
    if !have_binaries() {
        return;
    }
    for args in [
        "signal -n 5 -w 1",
        "packet -b 8 -e 64 -f 8 -n 5 -w 1",
        "memory-put -b 1K -e 4K -f 4 -n 2 -w 1",
    ] {
        let o = run(&bench(), args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args}: {out}\n{err}");
        assert!(
            out.contains("size(B)") && out.contains("CPU backend"),
            "{args}: {out}"
        );
    }
}

#[test]
fn bad_command_lines_say_why() {
    if !have_binaries() {
        return;
    }
    for (args, code, needle) in [
        ("", 2, "Usage: mscclpp-bench <COMMAND>"),
        ("allreduc", 2, "unrecognized subcommand 'allreduc'"),
        (
            "allreduce -d f128",
            2,
            "invalid value 'f128' for '--datatype <T>'\n  [possible values: f32, f16, bf16, i32, u32, i8, u8, i64, u64, f64, e4m3, e5m2]",
        ),
        (
            "allreduce -o xor",
            2,
            "[possible values: sum, prod, min, max, avg, premulsum]",
        ),
        ("allreduce --bogus", 2, "unexpected argument '--bogus'"),
        (
            "allreduce -b",
            2,
            "a value is required for '--minbytes <SIZE>'",
        ),
        ("allreduce -b 1M -e 1K", 2, "is below -b"),
        ("broadcast -a put", 2, "not an algorithm of broadcast"),
        ("signal -c", 2, "unexpected argument '-c'"),
        ("allreduce --plot a.pdf", 2, "ends in .svg or .png"),
        ("allreduce -G 1", 1, "CUDA graphs need the CUDA backend"),
        ("allreduce --baseline nccl", 1, "needs the CUDA backend"),
        ("broadcast -r 5", 1, "the root must be below the 2 ranks"),
        ("gather -r 2", 1, "the root must be below the 2 ranks"),
        ("reduce -a ce", 2, "not an algorithm of reduce"),
        ("sendrecv -g 1", 1, "sendrecv needs at least 2 ranks"),
    ] {
        let o = run(&bench(), args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {out}\n{err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in\n{err}"
        );
    }
    let o = run(&run_tool(), "-n 2");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("<COMMAND>"), "{:?}", text(&o));
    let o = run(&run_tool(), "-- true");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--np <N>"), "{:?}", text(&o));
    // Help is not an error.
    for (tool, args) in [
        (bench(), "--help"),
        (bench(), "allreduce --help"),
        (run_tool(), "--help"),
    ] {
        let o = run(&tool, args);
        assert_eq!(o.status.code(), Some(0), "{tool} {args}");
        assert!(
            text(&o).0.contains("Usage:"),
            "{tool} {args}: {:?}",
            text(&o)
        );
    }
}
