//! The GPU scripts under `nccl/tests/python/` (run by hand on GPUs: `run_gpu.sh`), checked
//! where CI can: the vLLM-style ctypes script runs on the CPU backend (buffers from
//! `ncclMemAlloc`, no PyTorch) on 1 to 3 ranks, loading the library by path as vLLM does
//! (`VLLM_NCCL_SO_PATH`, the file named `libnccl.so.2`), and must find mscclpp-rs's library
//! answering; the PyTorch script, which needs GPUs, is compiled (in memory) so that a
//! syntax error fails here. `python3` is required: without it these tests fail, never skip.

mod common;

use std::path::PathBuf;
use std::process::Command;

/// This package's directory (the run-time `CARGO_MANIFEST_DIR`: the GPU bundle runs from a
/// copy of the repository).
fn manifest() -> PathBuf {
    mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR"))
}

fn scripts() -> PathBuf {
    manifest().join("tests/python")
}

/// A directory holding the library as `libnccl.so.2`.
fn lib_dir() -> PathBuf {
    let d = manifest()
        .join("../target/nccl-python-test")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&d).expect("a scratch directory");
    let so = d.join("libnccl.so.2");
    let _ = std::fs::remove_file(&so);
    std::os::unix::fs::symlink(common::ffi::lib_path(), &so).expect("a libnccl.so.2 link");
    d
}

#[test]
fn vllm_style_script_runs_on_the_cpu_backend() {
    let dir = lib_dir();
    for world in ["1", "3"] {
        let out = dir.join(format!("results-{world}"));
        let run = Command::new("python3")
            .arg(scripts().join("vllm_style.py"))
            .args([
                "--cpu",
                "--world-size",
                world,
                "--expect",
                "mscclpp",
                "--count",
                "300",
                "--out",
            ])
            .arg(&out)
            .env("VLLM_NCCL_SO_PATH", dir.join("libnccl.so.2"))
            .env("MSCCLPP_BACKEND", "cpu")
            .env("MSCCLPP_SOCKET_IFNAME", "lo")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("running python3 (required)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(
            run.status.success(),
            "vllm_style.py on {world} rank(s):\n{text}"
        );
        assert!(text.contains("answering: mscclpp-rs"), "{text}");
        assert!(text.contains("NCCL version 2.32.3"), "{text}");
        assert!(
            text.contains(&format!("vllm_style: {world} rank(s) passed")),
            "{text}"
        );
        // Its results compare equal with themselves and not with another run's.
        let same = Command::new("python3")
            .arg(scripts().join("vllm_style.py"))
            .arg("--compare")
            .arg(&out)
            .arg(&out)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .status()
            .expect("python3");
        assert!(same.success());
    }
    let a = dir.join("results-1");
    let b = dir.join("results-3");
    let differ = Command::new("python3")
        .arg(scripts().join("vllm_style.py"))
        .arg("--compare")
        .arg(&a)
        .arg(&b)
        .output()
        .expect("python3");
    assert!(
        !differ.status.success(),
        "runs of 1 and 3 ranks compared equal"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_scripts_compile() {
    for f in ["torch_collectives.py", "vllm_style.py", "common.py"] {
        // Compiled in memory (py_compile would write a __pycache__ into the tree).
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')",
            ])
            .arg(scripts().join(f))
            .output()
            .expect("running python3 (required)");
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sh = Command::new("bash")
        .arg("-n")
        .arg(scripts().join("run_gpu.sh"))
        .output()
        .expect("bash");
    assert!(
        sh.status.success(),
        "{}",
        String::from_utf8_lossy(&sh.stderr)
    );
}
