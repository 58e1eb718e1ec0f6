//! `mscclpp-bench` and `mscclpp-run` as a user runs them, on the CPU backend: every collective
//! checked with `-c` (every row's `#wrong` is 0), the CPU notice, JSON and SVG output, ranks as
//! processes under `mscclpp-run`, the primitives, and clear errors for bad command lines.
//!
//! The binaries are found through `CARGO_BIN_EXE_*`; where they are not there (a test binary
//! copied to another machine) the tests say so and pass.

use std::path::Path;
use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_mscclpp-bench");
const RUN: &str = env!("CARGO_BIN_EXE_mscclpp-run");

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
    let ok = Path::new(BENCH).exists() && Path::new(RUN).exists();
    if !ok {
        eprintln!("skipped: {BENCH} or {RUN} is not on this machine");
    }
    ok
}

/// Runs `program args` on the CPU backend, outside any launcher.
fn run(program: &str, args: &str) -> Output {
    let mut c = Command::new(program);
    c.args(args.split_whitespace())
        .env("MSCCLPP_BACKEND", "cpu");
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.output().expect("start the binary")
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
    let o = run(BENCH, "allreduce -b 8 -e 64K -f 4 -c -n 2 -w 1");
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
            let o = run(BENCH, &args);
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
    ] {
        for place in ["--inplace", "--outofplace"] {
            let args = format!("{op} -b 96 -e 96K -f 32 -c -n 1 -w 1 -g 3 -r 2 -d bf16 {place}");
            assert_all_correct(&run(BENCH, &args), 3, &args);
        }
    }
}

#[test]
fn json_lines_and_plot() {
    if !have_binaries() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mscclpp-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, svg) = (dir.join("ar.json"), dir.join("ar.svg"));
    let args = format!(
        "allreduce -b 1K -e 16K -f 2 -c -n 2 -w 1 --json {} --plot {}",
        json.display(),
        svg.display()
    );
    assert_all_correct(&run(BENCH, &args), 5, &args);
    let j = std::fs::read_to_string(&json).expect("json written");
    assert_eq!(j.lines().count(), 5, "{j}");
    for l in j.lines() {
        assert!(
            l.starts_with("{\"op\":\"allreduce\"") && l.ends_with('}'),
            "{l}"
        );
        assert!(
            l.contains("\"wrong\":0") && l.contains("\"backend\":\"cpu\""),
            "{l}"
        );
    }
    let s = std::fs::read_to_string(&svg).expect("svg written");
    assert!(s.starts_with("<svg") && s.contains("<polyline"), "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_as_processes_under_mscclpp_run() {
    if !have_binaries() {
        return;
    }
    let o = run(
        RUN,
        &format!("-n 2 -- {BENCH} allreduce -b 8 -e 4K -f 8 -c -n 2 -w 1"),
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
        RUN,
        &format!("-n 3 -- {BENCH} reducescatter -b 96 -e 96K -f 32 -c -n 1 -w 1"),
    );
    assert_all_correct(&o, 3, "mscclpp-run reducescatter");
    // A failing rank fails the job with its status. Whichever rank fails first stops the
    // other, so only one of them is sure to have printed its message.
    let o = run(RUN, &format!("-n 2 -- {BENCH} allreduce -d f64"));
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    let err = text(&o).1;
    assert!(
        err.contains("[0] mscclpp-bench: -d \"f64\"")
            || err.contains("[1] mscclpp-bench: -d \"f64\""),
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
        let o = run(BENCH, args);
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
        ("", 2, "no op given"),
        ("allreduc", 2, "unknown op \"allreduc\""),
        (
            "allreduce -d f64",
            2,
            "the data types are f32, f16, bf16, i32 and u32",
        ),
        (
            "allreduce -o prod",
            2,
            "the reductions are sum, min and max",
        ),
        ("allreduce --bogus", 2, "unknown option \"--bogus\""),
        ("allreduce -b", 2, "-b needs a value"),
        ("allreduce -b 1M -e 1K", 2, "is below -b"),
        ("broadcast -a put", 2, "not an algorithm of broadcast"),
        ("signal -c", 2, "applies to collectives"),
        ("allreduce -G 1", 1, "CUDA graphs need the CUDA backend"),
        ("allreduce --baseline nccl", 1, "needs the CUDA backend"),
        ("broadcast -r 5", 1, "the root must be below the 2 ranks"),
        ("sendrecv -g 1", 1, "sendrecv needs at least 2 ranks"),
    ] {
        let o = run(BENCH, args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {out}\n{err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in\n{err}"
        );
    }
    let o = run(RUN, "-n 2");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("no command given"), "{:?}", text(&o));
    let o = run(RUN, "-- true");
    assert!(
        text(&o)
            .1
            .contains("-n N (the number of ranks) is required")
    );
}
