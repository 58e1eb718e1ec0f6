#!/usr/bin/env python3
"""NCCL through ctypes, as vLLM's pynccl uses it, on any number of ranks (one process each).

vLLM loads libnccl.so.2 by path (``VLLM_NCCL_SO_PATH``), asks ``ncclGetVersion``, makes a
unique id on rank 0 and hands it to the others, ``ncclCommInitRank``s, warms up with a
one-element all-reduce, and then calls all-reduce, all-gather, reduce-scatter, broadcast,
lone sends and receives along the pipeline, and all-reduces captured in a CUDA graph. This
script does the same and checks every result against a host reference.

On GPUs (needs PyTorch with CUDA; one rank per GPU by default):

    VLLM_NCCL_SO_PATH=$PWD/target/nccl/lib/libnccl.so.2 python3 nccl/tests/python/vllm_style.py
    # the same with NVIDIA's library, to compare (the results must be equal):
    VLLM_NCCL_SO_PATH=/path/to/nvidia/nccl/lib/libnccl.so.2 python3 nccl/tests/python/vllm_style.py --out /tmp/nv
    python3 nccl/tests/python/vllm_style.py --compare /tmp/ours /tmp/nv

On mscclpp-rs's CPU backend (no GPU, no PyTorch: buffers from ncclMemAlloc; what CI runs):

    MSCCLPP_BACKEND=cpu VLLM_NCCL_SO_PATH=… python3 nccl/tests/python/vllm_style.py --cpu --world-size 3
"""

import argparse
import ctypes
import multiprocessing as mp
import os
import struct
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
ncclComm_t = c_void_p
cudaStream_t = c_void_p

# ncclDataType_t / ncclRedOp_t values (NCCL's).
TYPES = {"int32": 2, "float16": 6, "float32": 7, "bfloat16": 9}
SIZES = {"int32": 4, "float16": 2, "float32": 4, "bfloat16": 2}
SUM, MAX, MIN = 0, 2, 3


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


FUNCTIONS = [
    ("ncclGetErrorString", c_char_p, [c_int]),
    ("ncclGetLastError", c_char_p, [ncclComm_t]),
    ("ncclGetVersion", c_int, [ctypes.POINTER(c_int)]),
    ("ncclGetUniqueId", c_int, [ctypes.POINTER(ncclUniqueId)]),
    ("ncclCommInitRank", c_int, [ctypes.POINTER(ncclComm_t), c_int, ncclUniqueId, c_int]),
    ("ncclCommDestroy", c_int, [ncclComm_t]),
    ("ncclAllReduce", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclAllGather", c_int, [c_void_p, c_void_p, c_size_t, c_int, ncclComm_t, cudaStream_t]),
    ("ncclReduceScatter", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclBroadcast", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclSend", c_int, [c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclRecv", c_int, [c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclGroupStart", c_int, []),
    ("ncclGroupEnd", c_int, []),
    ("ncclMemAlloc", c_int, [ctypes.POINTER(c_void_p), c_size_t]),
    ("ncclMemFree", c_int, [c_void_p]),
]


class Nccl:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name, res, args in FUNCTIONS:
            f = getattr(self.lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name, f)

    def check(self, result, what):
        if result != 0:
            text = self.ncclGetErrorString(result).decode()
            last = self.ncclGetLastError(None).decode()
            raise RuntimeError(f"{what}: NCCL error {result}: {text}: {last}")


def encode(dtype, vals):
    if dtype == "int32":
        return struct.pack(f"<{len(vals)}i", *vals)
    if dtype == "float32":
        return struct.pack(f"<{len(vals)}f", *vals)
    if dtype == "float16":
        return struct.pack(f"<{len(vals)}e", *vals)
    # bfloat16: the upper half of the float32 (exact for these small integers).
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def decode(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "int32":
        return list(struct.unpack(f"<{n}i", raw))
    if dtype == "float32":
        return [float(x) for x in struct.unpack(f"<{n}f", raw)]
    if dtype == "float16":
        return [float(x) for x in struct.unpack(f"<{n}e", raw)]
    return [struct.unpack("<f", b"\0\0" + raw[2 * i : 2 * i + 2])[0] for i in range(n)]


class CpuBuffers:
    """Buffers from ncclMemAlloc (mscclpp-rs's CPU backend: device memory is host memory)."""

    def __init__(self, nccl):
        self.nccl, self.bufs = nccl, []

    def make(self, dtype, vals):
        raw = encode(dtype, vals)
        p = c_void_p()
        self.nccl.check(self.nccl.ncclMemAlloc(ctypes.byref(p), max(len(raw), 1)), "ncclMemAlloc")
        ctypes.memmove(p, raw, len(raw))
        self.bufs.append(p)
        return (p.value, dtype, len(vals))

    def read(self, buf):
        p, dtype, n = buf
        return decode(dtype, ctypes.string_at(p, n * SIZES[dtype]))

    def stream(self):
        return None

    def sync(self):
        pass

    def free(self):
        for p in self.bufs:
            self.nccl.check(self.nccl.ncclMemFree(p), "ncclMemFree")


class TorchBuffers:
    """CUDA tensors on the rank's device, the work on PyTorch's current stream."""

    def __init__(self, device):
        import torch

        self.torch, self.device, self.keep = torch, device, []
        self.dtypes = {"int32": torch.int32, "float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}

    def make(self, dtype, vals):
        t = self.torch.tensor(vals, dtype=self.dtypes[dtype], device=self.device)
        self.keep.append(t)
        return (t.data_ptr(), dtype, len(vals), t)

    def read(self, buf):
        self.sync()
        return [float(x) if buf[1] != "int32" else int(x) for x in buf[3].cpu().tolist()]

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream

    def sync(self):
        self.torch.cuda.synchronize()

    def free(self):
        self.keep.clear()


def reduce_ref(op, cols):
    return [{SUM: sum, MAX: max, MIN: min}[op](c) for c in zip(*cols)]


def expect(results, name, got, want):
    if [float(x) for x in got] != [float(x) for x in want]:
        bad = next(i for i, (g, w) in enumerate(zip(got, want)) if float(g) != float(w))
        raise AssertionError(f"{name}: element {bad}: {got[bad]} != {want[bad]}")
    results[name] = [float(x) for x in got]


def rank_main(rank, world, args, id_queue):
    path = args.lib or os.environ.get("VLLM_NCCL_SO_PATH")
    if not path:
        raise SystemExit("set VLLM_NCCL_SO_PATH (or --lib) to the libnccl.so.2 to load")
    if not args.cpu:
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())
    nccl = Nccl(path)
    common.report_library(rank, args.expect)
    v = c_int()
    nccl.check(nccl.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    if rank == 0:
        print(f"NCCL version {v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}", flush=True)
    uid = ncclUniqueId()
    if rank == 0:
        nccl.check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        for _ in range(world - 1):
            id_queue.put(bytes(bytearray(uid.internal)))
    else:
        raw = id_queue.get(timeout=60)
        ctypes.memmove(ctypes.addressof(uid), raw, 128)
    comm = ncclComm_t()
    nccl.check(nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
    bufs = CpuBuffers(nccl) if args.cpu else TorchBuffers(f"cuda:{rank % __import__('torch').cuda.device_count()}")
    s = bufs.stream()
    results = {}
    n = world

    # Warm-up: one element (vLLM all-reduces a zero).
    w = bufs.make("float32", [0.0])
    nccl.check(nccl.ncclAllReduce(w[0], w[0], 1, TYPES["float32"], SUM, comm, s), "warm-up")
    expect(results, "warmup", bufs.read(w), [0.0])

    # All-reduce: every type and operator, out of place and in place.
    count = args.count
    for dtype in TYPES:
        for op in (SUM, MAX, MIN):
            src = bufs.make(dtype, common.values(rank, op, count))
            dst = bufs.make(dtype, [0] * count)
            nccl.check(nccl.ncclAllReduce(src[0], dst[0], count, TYPES[dtype], op, comm, s), "ncclAllReduce")
            want = reduce_ref(op, [common.values(r, op, count) for r in range(n)])
            expect(results, f"all_reduce/{dtype}/{op}", bufs.read(dst), want)
            nccl.check(nccl.ncclAllReduce(src[0], src[0], count, TYPES[dtype], op, comm, s), "in place")
            expect(results, f"all_reduce_in_place/{dtype}/{op}", bufs.read(src), want)

    # All-gather (fp16), reduce-scatter (bf16), broadcast from the last rank (int32).
    src = bufs.make("float16", common.values(rank, 5, 100))
    dst = bufs.make("float16", [0] * (100 * n))
    nccl.check(nccl.ncclAllGather(src[0], dst[0], 100, TYPES["float16"], comm, s), "ncclAllGather")
    expect(results, "all_gather", bufs.read(dst), sum((common.values(r, 5, 100) for r in range(n)), []))
    src = bufs.make("bfloat16", sum((common.values(rank, 10 + p, 64) for p in range(n)), []))
    dst = bufs.make("bfloat16", [0] * 64)
    nccl.check(nccl.ncclReduceScatter(src[0], dst[0], 64, TYPES["bfloat16"], SUM, comm, s), "ncclReduceScatter")
    expect(results, "reduce_scatter", bufs.read(dst), reduce_ref(SUM, [common.values(r, 10 + rank, 64) for r in range(n)]))
    b = bufs.make("int32", common.values(rank, 6, 333))
    nccl.check(nccl.ncclBroadcast(b[0], b[0], 333, TYPES["int32"], n - 1, comm, s), "ncclBroadcast")
    expect(results, "broadcast", bufs.read(b), common.values(n - 1, 6, 333))

    # Pipeline parallelism: lone sends and receives along 0 -> 1 -> ... -> n-1.
    stage = bufs.make("float32", common.values(0, 7, 500) if rank == 0 else [0] * 500)
    if rank > 0:
        nccl.check(nccl.ncclRecv(stage[0], 500, TYPES["float32"], rank - 1, comm, s), "ncclRecv")
        expect(results, "pipeline", bufs.read(stage), common.values(0, 7, 500))
    if rank + 1 < n:
        nccl.check(nccl.ncclSend(stage[0], 500, TYPES["float32"], rank + 1, comm, s), "ncclSend")

    # All-to-all by grouped sends and receives (every peer and itself).
    parts = [bufs.make("float32", common.values(rank, 20 + p, 40)) for p in range(n)]
    got = [bufs.make("float32", [0] * 40) for _ in range(n)]
    nccl.check(nccl.ncclGroupStart(), "ncclGroupStart")
    for p in range(n):
        nccl.check(nccl.ncclSend(parts[p][0], 40, TYPES["float32"], p, comm, s), "ncclSend")
        nccl.check(nccl.ncclRecv(got[p][0], 40, TYPES["float32"], p, comm, s), "ncclRecv")
    nccl.check(nccl.ncclGroupEnd(), "ncclGroupEnd")
    for q in range(n):
        expect(results, f"all_to_all/{q}", bufs.read(got[q]), common.values(q, 20 + rank, 40))

    # CUDA graphs: all-reduces captured once, replayed (GPU only).
    if not args.cpu:
        torch = bufs.torch
        static = bufs.make("float16", common.values(rank, 30, 2048))
        fresh = bufs.make("float16", common.values(rank, 30, 2048))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            cs = torch.cuda.current_stream().cuda_stream
            nccl.check(nccl.ncclAllReduce(static[0], static[0], 2048, TYPES["float16"], SUM, comm, cs), "captured all-reduce")
        want = reduce_ref(SUM, [common.values(r, 30, 2048) for r in range(n)])
        for replay in range(3):
            static[3].copy_(fresh[3])
            graph.replay()
            expect(results, f"graph_all_reduce/{replay}", bufs.read(static), want)
    bufs.sync()
    nccl.check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    bufs.free()
    common.write_results(args.out, rank, results)
    print(f"rank {rank}: {len(results)} results checked", flush=True)


def run_rank(rank, world, args, id_queue, status):
    try:
        rank_main(rank, world, args, id_queue)
        status.put((rank, None))
    except BaseException:
        status.put((rank, traceback.format_exc()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=0, help="ranks (default: every GPU; 2 with --cpu)")
    ap.add_argument("--cpu", action="store_true", help="mscclpp-rs's CPU backend, buffers from ncclMemAlloc, no PyTorch")
    ap.add_argument("--lib", help="the libnccl.so.2 to load (default: VLLM_NCCL_SO_PATH)")
    ap.add_argument("--count", type=int, default=1000, help="elements per all-reduce")
    ap.add_argument("--out", help="write each rank's results to OUT/rank<r>.json")
    ap.add_argument("--expect", choices=["mscclpp", "nvidia"], help="fail unless this library answers")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare the results of two runs and exit")
    args = ap.parse_args()
    if args.compare:
        common.compare(*args.compare)
    world = args.world_size
    if world <= 0:
        if args.cpu:
            world = 2
        else:
            import torch

            world = torch.cuda.device_count()
            if world == 0:
                raise SystemExit("no CUDA device: use --cpu (with MSCCLPP_BACKEND=cpu)")
    ctx = mp.get_context("spawn")
    id_queue, status = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(r, world, args, id_queue, status)) for r in range(world)]
    for p in procs:
        p.start()
    failed = []
    for _ in procs:
        rank, err = status.get(timeout=600)
        if err:
            failed.append(rank)
            print(f"rank {rank} failed:\n{err}", file=sys.stderr, flush=True)
            for p in procs:
                if p.is_alive():
                    p.kill()
            break
    for p in procs:
        p.join(timeout=60)
    if failed or any(p.exitcode not in (0, None) for p in procs if not failed):
        sys.exit(1)
    print(f"vllm_style: {world} rank(s) passed", flush=True)


if __name__ == "__main__":
    main()
