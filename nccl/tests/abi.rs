//! The ABI against NVIDIA's NCCL 2.32.3:
//!
//! - every `nccl*` / `pnccl*` symbol NVIDIA's `libnccl.so.2` exports is exported by ours (a
//!   subset check; the ones ours stubs are listed in the crate docs);
//! - `tests/abi/abi_check.c`, compiled once against NVIDIA's `nccl.h` and once against ours
//!   (`cc`, C11), links with our library under its SONAME `libnccl.so.2` (a directory holding
//!   only that name, first on the run path), prints every constant, size and field offset of
//!   the header (the two builds must print the same), and calls every function of the header
//!   on the CPU backend, each checked (a run of the NVIDIA-header build succeeds only against
//!   our library: it expects our refusals of what is not served);
//! - our header also compiles as C++11.
//!
//! NVIDIA's header and symbol list come from `scripts/fetch-nvidia-nccl.sh` (CI runs it before
//! the tests) in `target/nvidia-nccl/`, or `MSCCLPP_NVIDIA_NCCL_DIR`; without them the
//! comparisons with NVIDIA print NOT RUN and our header's build still runs. A C compiler is
//! required: without one these tests fail, never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::ffi::{lib_path, symbol};
use common::nccl;

/// This package's directory (the run-time `CARGO_MANIFEST_DIR`: the GPU bundle runs from a
/// copy of the repository).
fn manifest() -> PathBuf {
    mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR"))
}

/// NVIDIA's header and symbols, if fetched.
fn nvidia_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MSCCLPP_NVIDIA_NCCL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest().join("../target/nvidia-nccl"));
    (dir.join("include/nccl.h").exists() && dir.join("symbols.txt").exists()).then_some(dir)
}

fn not_run(what: &str) {
    eprintln!(
        "NOT RUN: {what}: NVIDIA's nccl.h and symbol list are not in target/nvidia-nccl (run scripts/fetch-nvidia-nccl.sh, as CI does, or set MSCCLPP_NVIDIA_NCCL_DIR)"
    );
}

/// A fresh scratch directory under the target directory.
fn scratch(name: &str) -> PathBuf {
    let d = manifest()
        .join("../target/nccl-abi-test")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a scratch directory");
    d
}

#[test]
fn nvidia_symbols_are_a_subset_of_ours() {
    let Some(dir) = nvidia_dir() else {
        return not_run("the symbol subset check");
    };
    let list = std::fs::read_to_string(dir.join("symbols.txt")).expect("symbols.txt");
    let names: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        names.len() > 100,
        "only {} NVIDIA symbols listed",
        names.len()
    );
    let h = nccl().handle as *mut std::ffi::c_void;
    // `symbol` panics naming the first one missing.
    for name in &names {
        symbol(h, name);
    }
    // NVIDIA spells all-to-all `ncclAlltoAll`; ours also answers to `ncclAllToAll`.
    assert!(names.contains(&"ncclAlltoAll"));
    symbol(h, "ncclAllToAll");
    eprintln!(
        "all {} of NVIDIA's nccl/pnccl symbols are exported",
        names.len()
    );
}

/// Compiles `abi_check.c` against the header in `include` (plus `extra` include dirs) into
/// `dir/abi_check`, linked with our library as `libnccl.so.2` in `dir/lib`; runs it; returns
/// its output.
fn build_and_run(dir: &Path, include: &Path, extra: &[PathBuf]) -> String {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    let soname = lib.join("libnccl.so.2");
    let _ = std::fs::remove_file(&soname);
    std::os::unix::fs::symlink(lib_path(), &soname).expect("a libnccl.so.2 link");
    let exe = dir.join("abi_check");
    let mut cc = Command::new("cc");
    cc.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-deprecated-declarations",
    ])
    .arg("-I")
    .arg(include);
    for e in extra {
        cc.arg("-I").arg(e);
    }
    cc.arg(manifest().join("tests/abi/abi_check.c"))
        .arg("-o")
        .arg(&exe)
        .arg(&soname)
        .arg(format!("-Wl,-rpath,{}", lib.display()));
    let out = cc.output().expect("running cc (a C compiler is required)");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The program needs libnccl.so.2 and finds ours there.
    let ldd = Command::new(&exe)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .expect("listing the program's libraries");
    let ldd = String::from_utf8_lossy(&ldd.stdout).to_string();
    assert!(
        ldd.lines()
            .any(|l| l.contains("libnccl.so.2 =>") && l.contains(&*lib.to_string_lossy())),
        "the program does not load libnccl.so.2 from {}:\n{ldd}",
        lib.display()
    );
    let run = Command::new(&exe)
        .env("MSCCLPP_BACKEND", "cpu")
        .env("MSCCLPP_SOCKET_IFNAME", "lo")
        .output()
        .expect("running abi_check");
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "abi_check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("failures 0"), "{stdout}");
    stdout
}

/// The `value`, `size` and `offset` lines.
fn layout_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("value ") || l.starts_with("size ") || l.starts_with("offset "))
        .map(str::to_string)
        .collect()
}

#[test]
fn c_programs_against_both_headers_agree_and_run() {
    let ours = scratch("ours");
    let out_ours = build_and_run(&ours, &manifest().join("include"), &[]);
    let lines_ours = layout_lines(&out_ours);
    assert!(lines_ours.len() > 150, "{} layout lines", lines_ours.len());
    for want in [
        "value NCCL_VERSION_CODE 23203",
        "size ncclUniqueId 128",
        "size ncclConfig_t 120",
        "size ncclCollConfig_t 72",
        "value ncclFloat8e5m2 11",
        "value ncclMaxRedOp 2147483647",
    ] {
        assert!(lines_ours.iter().any(|l| l == want), "{want} missing");
    }
    let calls = out_ours.lines().filter(|l| l.starts_with("ok ")).count();
    eprintln!(
        "our header: {} layout facts, {calls} calls checked",
        lines_ours.len()
    );
    let _ = std::fs::remove_dir_all(&ours);

    let Some(dir) = nvidia_dir() else {
        return not_run("the comparison with NVIDIA's nccl.h");
    };
    let theirs = scratch("nvidia");
    let stub = manifest().join("tests/abi/cuda-stub");
    let out_theirs = build_and_run(&theirs, &dir.join("include"), &[stub]);
    let lines_theirs = layout_lines(&out_theirs);
    let differ: Vec<String> = lines_ours
        .iter()
        .zip(&lines_theirs)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("ours: {a}, NVIDIA's: {b}"))
        .collect();
    assert!(
        differ.is_empty() && lines_ours.len() == lines_theirs.len(),
        "the headers differ:\n{}",
        differ.join("\n")
    );
    eprintln!(
        "NVIDIA's header: the same {} layout facts; its build ran against our library",
        lines_theirs.len()
    );
    let _ = std::fs::remove_dir_all(&theirs);
}

#[test]
fn our_header_compiles_as_cpp() {
    let dir = scratch("cpp");
    let src = dir.join("use.cpp");
    std::fs::write(
        &src,
        "#include <nccl.h>\nint main() { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER; return (int)c.size - (int)sizeof(ncclConfig_t) + (int)cc.size - (int)sizeof(ncclCollConfig_t) + (int)ncclSuccess; }\n",
    )
    .expect("write");
    let out = Command::new("c++")
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(manifest().join("include"))
        .arg(&src)
        .output()
        .expect("running c++ (a C++ compiler is required)");
    assert!(
        out.status.success(),
        "c++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
