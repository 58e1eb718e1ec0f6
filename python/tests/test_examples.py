"""The examples: the CuPy kernel ping-pong runs where there is a GPU and CuPy (NOT RUN otherwise),
and its kernels compile with NVRTC against the headers the package writes out wherever
NVIDIA's NVRTC library is installed (the ``nvidia-cuda-nvrtc`` wheel runs without a GPU), so
a mistake in the kernel source or the NVRTC stand-in headers shows without a GPU."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import subprocess
import sys
from typing import Optional

import pytest

from mscclpp_rs.kernels import cuda_include_dirs

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _example_module() -> object:
    spec = importlib.util.spec_from_file_location("cupy_ping_pong",
                                                  os.path.join(EXAMPLES, "cupy_ping_pong.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cupy_ping_pong() -> None:
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "cupy_ping_pong.py")],
                         capture_output=True, text=True, timeout=300)
    if run.returncode == 0 and run.stdout.startswith("NOT RUN"):
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for rank in (0, 1):
        for channel in ("memory", "port"):
            assert any(line.startswith(f"rank {rank}: {channel} channel") and "data ok" in line
                       for line in lines), run.stdout


def _nvrtc() -> Optional[ctypes.CDLL]:
    """NVIDIA's NVRTC library: from the nvidia-cuda-nvrtc wheel, else the system's."""
    names = []
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so.*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")))
    names += ["libnvrtc.so"]
    for name in names:
        if ".alt." in name:
            continue
        try:
            # NVRTC opens its builtins library by name: load the one beside it first.
            for builtins in glob.glob(os.path.join(os.path.dirname(name), "libnvrtc-builtins.so.*")):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def test_example_kernels_compile_with_nvrtc() -> None:
    lib = _nvrtc()
    if lib is None:
        pytest.skip("NOT RUN: no NVRTC library (pip install nvidia-cuda-nvrtc)")
    source = getattr(_example_module(), "KERNELS")
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"ping_pong.cu", 0,
                                  None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17"]
    opts += [f"-I{d}".encode() for d in cuda_include_dirs(nvrtc=True)]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert rc == 0, log.value.decode(errors="replace")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = ptx.value.decode()
    for entry in ("memory_ping_pong", "port_ping_pong"):
        assert f".entry {entry}" in text, f"no entry point {entry}"
    # The device API's ordering instructions made it into the PTX.
    assert "red.release.sys" in text and "ld.acquire.sys" in text
