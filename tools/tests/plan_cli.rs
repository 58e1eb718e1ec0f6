//! `mscclpp-plan` and `mscclpp-bench --plan` as a user runs them, on the CPU backend: a plan
//! written, checked and run with its data checked; a broken plan refused with its field and a
//! non-zero exit; MSCCL++'s conformance plans checked (six pass, the two NVLS ones are
//! refused); a plan that does not fit the run refused with the flag to add; the one-rank copy
//! plan against the plain copy kernel (`--baseline copy-kernel`).

use std::path::PathBuf;
use std::process::{Command, Output};

use mscclpp_test_support as harness;

fn tool(cargo_path: &str) -> Option<PathBuf> {
    let p = PathBuf::from(cargo_path);
    p.exists().then_some(p)
}

fn plan_tool() -> Option<PathBuf> {
    tool(env!("CARGO_BIN_EXE_mscclpp-plan"))
}

fn bench_tool() -> Option<PathBuf> {
    tool(env!("CARGO_BIN_EXE_mscclpp-bench"))
}

fn run(program: &PathBuf, args: &[&str]) -> (Output, String) {
    let o = Command::new(program)
        .args(args)
        .env("MSCCLPP_BACKEND", "cpu")
        .env_remove("MSCCLPP_RANK")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run the tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o, text)
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mscclpp-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn a_plan_written_checked_and_run() {
    let (Some(plan), Some(bench)) = (plan_tool(), bench_tool()) else {
        println!("NOT RUN: the tools are not built");
        return;
    };
    let file = temp("allgather_packets.json");
    let f = file.to_str().unwrap();
    let (o, t) = run(
        &plan,
        &["write", "allgather_packets", "--ranks", "2", "-o", f],
    );
    assert!(o.status.success(), "{t}");
    let (o, t) = run(&plan, &["check", f]);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(": ok: plan \"allgather_packets\", allgather, LL protocol"),
        "{t}"
    );
    assert!(t.contains("rank 1: 3 blocks"), "{t}");
    // Checked at a size of the caller's choosing; refused at one the plan cannot cut.
    let (o, t) = run(&plan, &["check", f, "--bytes", "4096"]);
    assert!(o.status.success(), "{t}");
    let (o, t) = run(&plan, &["check", f, "--bytes", "4100"]);
    assert!(!o.status.success() && t.contains("refused"), "{t}");
    // Run, data checked: every row's #wrong is 0.
    let (o, t) = run(
        &bench,
        &[
            "allgather",
            "--plan",
            f,
            "--outofplace",
            "-c",
            "-b",
            "1K",
            "-e",
            "16K",
            "-n",
            "2",
            "-w",
            "1",
            "-d",
            "i32",
        ],
    );
    assert!(o.status.success(), "{t}");
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some("plan"))
        .collect();
    assert_eq!(rows.len(), 5, "{t}");
    for r in rows {
        assert_eq!(r.split_whitespace().last(), Some("0"), "{t}");
    }
    // A run the plan does not fit: the flag to add.
    let (o, t) = run(
        &bench,
        &["allgather", "--plan", f, "-c", "-b", "1K", "-e", "1K"],
    );
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("add --outofplace"), "{t}");
}

#[test]
fn a_copy_plan_against_the_copy_kernel() {
    let (Some(plan), Some(bench)) = (plan_tool(), bench_tool()) else {
        println!("NOT RUN: the tools are not built");
        return;
    };
    let file = temp("copy.json");
    let f = file.to_str().unwrap();
    let (o, t) = run(&plan, &["write", "copy", "--ranks", "2", "-o", f]);
    assert!(!o.status.success() && t.contains("--ranks 1"), "{t}");
    let (o, t) = run(
        &plan,
        &["write", "copy", "--ranks", "1", "--blocks", "4", "-o", f],
    );
    assert!(o.status.success(), "{t}");
    let args = ["allgather", "-g", "1", "--outofplace", "--plan", f];
    let (o, t) = run(
        &bench,
        &[
            &args[..],
            &[
                "--baseline",
                "copy-kernel",
                "-c",
                "-b",
                "4K",
                "-e",
                "16K",
                "-n",
                "2",
            ],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{t}");
    assert!(t.contains("baseline: copy kernel (4 blocks of"), "{t}");
    assert!(t.contains("copy(us)"), "{t}");
    assert!(
        t.contains("Wrong elements       : 0 (baseline 0) OK"),
        "{t}"
    );
    // Two ranks: refused, naming what it needs.
    let (o, t) = run(
        &bench,
        &[
            "allgather",
            "-g",
            "2",
            "--baseline",
            "copy-kernel",
            "-b",
            "4K",
            "-e",
            "4K",
        ],
    );
    assert!(!o.status.success() && t.contains("one rank (-g 1)"), "{t}");
}

#[test]
fn a_broken_plan_is_refused_with_its_field() {
    let Some(plan) = plan_tool() else {
        println!("NOT RUN: the tools are not built");
        return;
    };
    let file = temp("broken.json");
    let f = file.to_str().unwrap();
    let (o, t) = run(&plan, &["write", "allreduce_read", "--ranks", "3", "-o", f]);
    assert!(o.status.success(), "{t}");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replacen("\"rres\"", "\"teleport\"", 1);
    std::fs::write(&file, text).unwrap();
    let (o, t) = run(&plan, &["check", f]);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("refused"), "{t}");
    assert!(t.contains(".name: \"teleport\" is not an op"), "{t}");
}

#[test]
fn conformance_plans_are_checked() {
    let Some(plan) = plan_tool() else {
        println!("NOT RUN: the tools are not built");
        return;
    };
    let dir = harness::package_dir(env!("CARGO_MANIFEST_DIR")).join("../../shared/mscclpp-plans");
    if !dir.is_dir() {
        println!("NOT RUN: ../shared/mscclpp-plans (MSCCL++'s conformance plans) is absent");
        return;
    }
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 8);
    let args: Vec<&str> = std::iter::once("check")
        .chain(files.iter().map(String::as_str))
        .collect();
    let (o, t) = run(&plan, &args);
    assert_eq!(o.status.code(), Some(1), "the NVLS plans are refused: {t}");
    assert_eq!(t.matches(": ok: plan").count(), 6, "{t}");
    assert_eq!(t.matches(": refused:").count(), 2, "{t}");
    assert_eq!(t.matches("NVLink multicast").count(), 2, "{t}");
}
