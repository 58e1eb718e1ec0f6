"""PyTorch: tensors on the CPU backend (CPU tensors) and on CUDA (CUDA tensors, the current
stream or a given one, no copies), and worlds made from a ``torch.distributed`` process group.
NOT RUN where PyTorch (or a GPU) is missing.

On CUDA with one GPU, worlds of two ranks need the several-ranks-per-GPU mode
(``MSCCLPP_RANKS_PER_GPU=2``, both ranks on device 0); with two GPUs or more each rank has its
own."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, List

import numpy as np
import pytest

import mscclpp_rs
from helpers import PortClash, clashed, no_failures, on_a_free_port, reduce_ref, values, world

torch: Any = pytest.importorskip("torch", reason="NOT RUN: PyTorch is not installed")


def _t(a: np.ndarray, device: str = "cpu") -> Any:
    return torch.from_numpy(a.copy()).to(device)


def _check(got: Any, want: np.ndarray, what: str, failures: List[str]) -> None:
    g = got.detach().cpu().numpy()
    if g.shape != want.shape or not np.array_equal(g, want):
        failures.append(f"{what}: {g[:4]} … != {want[:4]} …")


def test_cpu_tensors_on_the_cpu_backend() -> None:
    n = 2

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, f = comm.rank, list[str]()
        x = _t(values(r, 0, 1000, np.float32))
        ptr = x.data_ptr()
        comm.all_reduce(x)
        _check(x, reduce_ref([values(q, 0, 1000, np.float32) for q in range(n)], "sum"),
               "all_reduce", f)
        if x.data_ptr() != ptr:
            f.append("the tensor moved")
        out = torch.zeros(n * 100, dtype=torch.int64)
        comm.all_gather(out, _t(values(r, 1, 100, np.int64)))
        _check(out, np.concatenate([values(q, 1, 100, np.int64) for q in range(n)]),
               "all_gather", f)
        bf = torch.arange(64, dtype=torch.bfloat16) + r
        comm.all_reduce(bf, "max")
        _check(bf.float(), (np.arange(64) + n - 1).astype(np.float32), "bfloat16 max", f)
        return f

    no_failures(world(n, rank))


def _cuda_ranks() -> int:
    if not torch.cuda.is_available():
        pytest.skip("NOT RUN: no CUDA device for PyTorch")
    gpus = torch.cuda.device_count()
    shared = int(os.environ.get("MSCCLPP_RANKS_PER_GPU", "1"))
    return 2 if gpus >= 2 or shared >= 2 else 1


def test_cuda_tensors() -> None:
    """Every collective on CUDA tensors of the rank's device, on PyTorch's current stream (the
    call returns at once), and on a given stream; results checked on the host."""
    n = _cuda_ranks()
    gpus = torch.cuda.device_count()

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, f = comm.rank, list[str]()
        dev = f"cuda:{comm.device}"
        torch.cuda.set_device(comm.device)
        for dt in (np.float32, np.int32, np.float16):
            for count in (1, 1000, 300_000):
                x = _t(values(r, 0, count, dt), dev)
                ptr = x.data_ptr()
                comm.all_reduce(x)  # on torch.cuda.current_stream()
                torch.cuda.current_stream().synchronize()
                comm.check()
                _check(x, reduce_ref([values(q, 0, count, dt) for q in range(n)], "sum"),
                       f"all_reduce {np.dtype(dt)} x{count}", f)
                if x.data_ptr() != ptr:
                    f.append("the tensor moved")
                out = torch.empty(n * count, dtype=x.dtype, device=dev)
                comm.all_gather(out, _t(values(r, 1, count, dt), dev))
                torch.cuda.synchronize()
                _check(out, np.concatenate([values(q, 1, count, dt) for q in range(n)]),
                       f"all_gather x{count}", f)
        s = torch.cuda.Stream()
        y = _t(values(r, 2, 4096, np.float32), dev)
        with torch.cuda.stream(s):
            comm.all_reduce(y, "max")  # PyTorch's current stream is `s` here
        comm.broadcast(y, 0, stream=s)  # given explicitly
        s.synchronize()
        comm.check()
        want = reduce_ref([values(q, 2, 4096, np.float32) for q in range(n)], "max")
        _check(y, want, "all_reduce + broadcast on a side stream", f)
        if n > 1:
            rs_out = torch.empty(512, dtype=torch.float32, device=dev)
            src = _t(np.concatenate([values(r, 10 + p, 512, np.float32) for p in range(n)]), dev)
            comm.reduce_scatter(rs_out, src, "sum")
            a_out = torch.empty(n * 512, dtype=torch.float32, device=dev)
            comm.all_to_all(a_out, src)
            peer = 1 - r if n == 2 else (r + 1) % n
            got = torch.empty(777, dtype=torch.int64, device=dev)
            with comm.group() as g:
                g.send(_t(values(r, 20, 777, np.int64), dev), peer)
                g.recv(got, peer)
            torch.cuda.synchronize()
            _check(rs_out, reduce_ref([values(q, 10 + r, 512, np.float32) for q in range(n)],
                                      "sum"), "reduce_scatter", f)
            _check(a_out, np.concatenate([values(q, 10 + r, 512, np.float32) for q in range(n)]),
                   "all_to_all", f)
            _check(got, values(peer, 20, 777, np.int64), "group send/recv", f)
            # Registered (PyTorch's caching allocator is cuMemAlloc: exportable).
            z = _t(values(r, 30, 1 << 20, np.float32), dev)
            with comm.register_buffer(z):
                comm.all_reduce(z)
                torch.cuda.synchronize()
                algorithm = comm.last_algorithm
            _check(z, reduce_ref([values(q, 30, 1 << 20, np.float32) for q in range(n)], "sum"),
                   f"registered all_reduce ({algorithm})", f)
        return f

    devices = [r % gpus for r in range(n)]
    no_failures(world(n, rank, backend="cuda", devices=devices))


def test_cuda_graph_capture() -> None:
    """Calls captured in a CUDA graph by PyTorch (``torch.cuda.graph``, CUDA's global capture
    mode) replay with the data of each replay: registered buffers and ``prepare()`` first, one
    eager call, then the capture."""
    n = _cuda_ranks()
    gpus = torch.cuda.device_count()

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, f = comm.rank, list[str]()
        dev = f"cuda:{comm.device}"
        torch.cuda.set_device(comm.device)
        x = torch.zeros(1 << 16, dtype=torch.float32, device=dev)
        y = torch.zeros_like(x)
        regs = [comm.register_buffer(x), comm.register_buffer(y)] if n > 1 else []
        comm.prepare()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            comm.all_reduce(x, output=y)  # eager, once, before the capture
        side.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_reduce(x, output=y)
        for k in range(3):
            x.copy_(_t(values(r, k, 1 << 16, np.float32), dev))
            graph.replay()
            torch.cuda.synchronize()
            comm.check()
            _check(y, reduce_ref([values(q, k, 1 << 16, np.float32) for q in range(n)], "sum"),
                   f"replay {k}", f)
        for reg in regs:
            reg.deregister()
        return f

    no_failures(world(n, rank, backend="cuda", devices=[r % gpus for r in range(n)]))


TORCH_CHILD = r"""
import os, sys, numpy as np, torch, torch.distributed as dist, mscclpp_rs
sys.path.insert(0, sys.argv[1])
from helpers import values, reduce_ref
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2,
                        init_method="tcp://127.0.0.1:" + os.environ["PORT"])
comm = mscclpp_rs.Communicator.from_torch(addr="127.0.0.1:0", backend="cpu")
x = torch.from_numpy(values(comm.rank, 0, 500, np.float64))
comm.all_reduce(x)
want = reduce_ref([values(q, 0, 500, np.float64) for q in range(2)], "sum")
print("rank", comm.rank, dist.get_rank(), comm.size, np.array_equal(x.numpy(), want))
comm.close()
dist.destroy_process_group()
"""


def test_from_a_torch_process_group() -> None:
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    def attempt(port: int) -> None:
        procs = [
            subprocess.Popen([sys.executable, "-c", TORCH_CHILD, tests_dir],
                             env=dict(os.environ, RANK=str(r), PORT=str(port),
                                      MSCCLPP_BACKEND="cpu"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(2)
        ]
        outs = [p.communicate(timeout=180) for p in procs]
        if any(clashed(err) for _, err in outs):
            raise PortClash(" / ".join(err for _, err in outs))
        for r, (p, (out, err)) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, err
            assert f"rank {r} {r} 2 True" in out, out + err

    on_a_free_port(attempt)
