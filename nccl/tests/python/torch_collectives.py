#!/usr/bin/env python3
"""PyTorch's NCCL backend on mscclpp-rs's libnccl.so.2, on any number of GPUs.

Every collective torch.distributed maps onto NCCL, eager and captured in a CUDA graph, each
result checked against a host reference: all_reduce (sum, max, min; float32, float16,
bfloat16, int32; int8, uint8, int64, float64 sums; float32 product, average and pre-multiplied
sum), all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, broadcast,
reduce, all_to_all, all_to_all_single (even and uneven splits), gather and scatter
(grouped sends and receives in PyTorch), send/recv, batch_isend_irecv, barrier, new_group;
then all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast and
all_to_all_single captured in one CUDA graph and replayed.

PyTorch wheels load the libnccl.so.2 of the nvidia-nccl-cu12 wheel through their run path;
``LD_PRELOAD`` loads ours first, and the dynamic linker then takes it for that name
(README, "Use from PyTorch and other NCCL programs"):

    LD_PRELOAD=$PWD/target/nccl/lib/libnccl.so.2 python3 nccl/tests/python/torch_collectives.py --expect mscclpp --out /tmp/ours
    python3 nccl/tests/python/torch_collectives.py --expect nvidia --out /tmp/nvidia
    python3 nccl/tests/python/torch_collectives.py --compare /tmp/ours /tmp/nvidia

One process per GPU (``--world-size``, default: every GPU), spawned here; or run it under
``torchrun --nproc-per-node N`` (it then uses torchrun's rank and rendezvous).
``--eager`` initialises the communicator at ``init_process_group`` (``device_id``), which
makes ``new_group`` use ``ncclCommSplit``.
"""

import argparse
import os
import socket
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, world, args):
    import torch
    import torch.distributed as dist

    dev = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    device = torch.device("cuda", dev)
    kw = {"device_id": device} if args.eager else {}
    dist.init_process_group("nccl", rank=rank, world_size=world, **kw)
    results = {}
    n = world

    def t(vals, dtype=torch.float32):
        return torch.tensor(vals, dtype=dtype, device=device)

    def vals(r, part, count):
        return common.values(r, part, count)

    def check(name, got, want):
        got = [float(x) for x in got.flatten().cpu().tolist()]
        want = [float(x) for x in want]
        if got != want:
            i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w) if len(got) == len(want) else -1
            raise AssertionError(f"rank {rank}: {name}: element {i} differs ({len(got)} vs {len(want)} elements)")
        results[name] = got

    # The first collective creates the communicator (lazily, unless --eager).
    x = t([1.0])
    dist.all_reduce(x)
    check("first_all_reduce", x, [float(n)])
    common.report_library(rank, args.expect)

    ops = {"sum": (dist.ReduceOp.SUM, sum), "max": (dist.ReduceOp.MAX, max), "min": (dist.ReduceOp.MIN, min)}
    types = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}
    count = args.count
    for tname, dtype in types.items():
        for oname, (op, ref) in ops.items():
            a = t(vals(rank, 1, count), dtype)
            dist.all_reduce(a, op=op)
            check(f"all_reduce/{tname}/{oname}", a, [ref(c) for c in zip(*[vals(r, 1, count) for r in range(n)])])

    # All-gather, list and tensor forms.
    outs = [t([0.0] * 100) for _ in range(n)]
    dist.all_gather(outs, t(vals(rank, 2, 100)))
    check("all_gather", torch.cat(outs), sum((vals(r, 2, 100) for r in range(n)), []))
    out = t([0.0] * (100 * n), torch.bfloat16)
    dist.all_gather_into_tensor(out, t(vals(rank, 3, 100), torch.bfloat16))
    check("all_gather_into_tensor", out, sum((vals(r, 3, 100) for r in range(n)), []))

    # Reduce-scatter, list and tensor forms.
    out = t([0.0] * 64)
    dist.reduce_scatter(out, [t(vals(rank, 10 + p, 64)) for p in range(n)])
    check("reduce_scatter", out, [sum(c) for c in zip(*[vals(r, 10 + rank, 64) for r in range(n)])])
    out = t([0.0] * 64, torch.float16)
    inp = t(sum((vals(rank, 20 + p, 64) for p in range(n)), []), torch.float16)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX)
    check("reduce_scatter_tensor", out, [max(c) for c in zip(*[vals(r, 20 + rank, 64) for r in range(n)])])

    # Broadcast from every rank.
    for root in range(n):
        b = t(vals(rank, 30, 333), torch.int32)
        dist.broadcast(b, src=root)
        check(f"broadcast/{root}", b, vals(root, 30, 333))

    # All-to-all: list form, single even, single uneven (rank q sends p + 1 elements to p).
    outs = [t([0.0] * 17) for _ in range(n)]
    dist.all_to_all(outs, [t(vals(rank, 40 + p, 17)) for p in range(n)])
    check("all_to_all", torch.cat(outs), sum((vals(q, 40 + rank, 17) for q in range(n)), []))
    out = t([0.0] * (8 * n))
    dist.all_to_all_single(out, t(sum((vals(rank, 50 + p, 8) for p in range(n)), [])))
    check("all_to_all_single", out, sum((vals(q, 50 + rank, 8) for q in range(n)), []))
    send_sizes = [p + 1 for p in range(n)]
    recv_sizes = [rank + 1] * n
    out = t([0.0] * sum(recv_sizes))
    inp = t(sum((vals(rank, 60 + p, p + 1) for p in range(n)), []))
    dist.all_to_all_single(out, inp, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
    check("all_to_all_single_uneven", out, sum((vals(q, 60 + rank, rank + 1) for q in range(n)), []))

    # Gather and scatter to and from the last rank (PyTorch groups sends and receives).
    root = n - 1
    g = [t([0.0] * 20) for _ in range(n)] if rank == root else None
    dist.gather(t(vals(rank, 70, 20)), gather_list=g, dst=root)
    if rank == root:
        check("gather", torch.cat(g), sum((vals(q, 70, 20) for q in range(n)), []))
    s = t([0.0] * 20)
    dist.scatter(s, scatter_list=[t(vals(root, 80 + p, 20)) for p in range(n)] if rank == root else None, src=root)
    check("scatter", s, vals(root, 80 + rank, 20))

    # Point to point: blocking along a chain, and a ring by batch_isend_irecv.
    c = t(vals(0, 90, 500) if rank == 0 else [0.0] * 500)
    if rank > 0:
        dist.recv(c, src=rank - 1)
        check("send_recv_chain", c, vals(0, 90, 500))
    if rank + 1 < n:
        dist.send(c, dst=rank + 1)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = t([0.0] * 300)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t(vals(rank, 91, 300)), nxt), dist.P2POp(dist.irecv, got, prv)])
    for r in reqs:
        r.wait()
    check("batch_isend_irecv_ring", got, vals(prv, 91, 300))

    dist.barrier(device_ids=[dev])

    # A group of the even ranks (at least rank 0).
    evens = list(range(0, n, 2))
    grp = dist.new_group(evens)
    if rank in evens:
        e = t(vals(rank, 95, 50))
        dist.all_reduce(e, group=grp)
        check("new_group_all_reduce", e, [sum(c) for c in zip(*[vals(r, 95, 50) for r in evens])])

    # CUDA graph: capture once, replay with fresh inputs.
    ar = t(vals(rank, 100, 1024))
    ag_in, ag_out = t(vals(rank, 101, 256), torch.float16), t([0.0] * (256 * n), torch.float16)
    rs_in, rs_out = t(sum((vals(rank, 110 + p, 128) for p in range(n)), [])), t([0.0] * 128)
    bc = t(vals(rank, 102, 300), torch.bfloat16)
    a2a_in, a2a_out = t(sum((vals(rank, 120 + p, 16) for p in range(n)), [])), t([0.0] * (16 * n))
    fresh_ar, fresh_bc = ar.clone(), bc.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture
        dist.all_reduce(ar.clone())
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(ar)
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.reduce_scatter_tensor(rs_out, rs_in)
        dist.broadcast(bc, src=0)
        dist.all_to_all_single(a2a_out, a2a_in)
    for replay in range(3):
        ar.copy_(fresh_ar)
        bc.copy_(fresh_bc)
        graph.replay()
        torch.cuda.synchronize()
        check(f"graph/{replay}/all_reduce", ar, [sum(c) for c in zip(*[vals(r, 100, 1024) for r in range(n)])])
        check(f"graph/{replay}/all_gather_into_tensor", ag_out, sum((vals(r, 101, 256) for r in range(n)), []))
        check(f"graph/{replay}/reduce_scatter_tensor", rs_out, [sum(c) for c in zip(*[vals(r, 110 + rank, 128) for r in range(n)])])
        check(f"graph/{replay}/broadcast", bc, vals(0, 102, 300))
        check(f"graph/{replay}/all_to_all_single", a2a_out, sum((vals(q, 120 + rank, 16) for q in range(n)), []))

    # Reduce to every root; the other types; product, average and pre-multiplied sums.
    for root in range(n):
        r_in = t(vals(rank, 130, 77))
        dist.reduce(r_in, dst=root)
        if rank == root:
            check(f"reduce/{root}", r_in, [sum(c) for c in zip(*[vals(r, 130, 77) for r in range(n)])])
    small = {"int8": torch.int8, "uint8": torch.uint8, "int64": torch.int64, "float64": torch.float64}
    for tname, dtype in small.items():
        # In [0, 3]: sums over 8 ranks fit in int8.
        a = t([v % 4 for v in vals(rank, 131, 100)], dtype)
        dist.all_reduce(a)
        check(f"all_reduce/{tname}/sum", a, [sum(c) for c in zip(*[[v % 4 for v in vals(r, 131, 100)] for r in range(n)])])
    twos = lambda r: [1 + v % 2 for v in vals(r, 132, 64)]  # noqa: E731 (products <= 2^8)
    a = t(twos(rank))
    dist.all_reduce(a, op=dist.ReduceOp.PRODUCT)
    want = [1.0] * 64
    for r in range(n):
        want = [w * x for w, x in zip(want, twos(r))]
    check("all_reduce/float32/prod", a, want)
    if n & (n - 1) == 0:  # 1/n and every partial sum exact
        a = t(vals(rank, 133, 64))
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        check("all_reduce/float32/avg", a, [sum(c) / n for c in zip(*[vals(r, 133, 64) for r in range(n)])])
    elif rank == 0:
        print(f"NOT RUN: all_reduce avg (exact only on a power-of-two world size, not {n})", flush=True)
    premul = getattr(dist, "_make_nccl_premul_sum", None)
    if premul is not None:
        a = t(vals(rank, 134, 64))
        dist.all_reduce(a, op=premul(2.0))
        check("all_reduce/float32/premul_sum", a, [2 * sum(c) for c in zip(*[vals(r, 134, 64) for r in range(n)])])
    elif rank == 0:
        print("NOT RUN: pre-multiplied sum (this PyTorch has no dist._make_nccl_premul_sum)", flush=True)

    torch.cuda.synchronize()
    dist.destroy_process_group()
    common.write_results(args.out, rank, results)
    print(f"rank {rank}: {len(results)} results checked", flush=True)


def spawned(rank, world, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        run(rank, world, args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=0, help="processes (default: every GPU)")
    ap.add_argument("--count", type=int, default=1000, help="elements per all-reduce")
    ap.add_argument("--out", help="write each rank's results to OUT/rank<r>.json")
    ap.add_argument("--expect", choices=["mscclpp", "nvidia"], help="fail unless this library answers")
    ap.add_argument("--eager", action="store_true", help="init_process_group(device_id=…): new_group splits")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare the results of two runs and exit")
    args = ap.parse_args()
    if args.compare:
        common.compare(*args.compare)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    import torch
    import torch.multiprocessing as mp

    world = args.world_size or torch.cuda.device_count()
    if world == 0:
        raise SystemExit("no CUDA device (PyTorch's NCCL backend needs GPUs)")
    mp.spawn(spawned, args=(world, args, free_port()), nprocs=world, join=True)
    print(f"torch_collectives: {world} rank(s) passed", flush=True)


if __name__ == "__main__":
    main()
