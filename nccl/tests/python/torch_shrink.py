#!/usr/bin/env python3
"""PyTorch goes on after a rank dies, on mscclpp-rs's libnccl.so.2 (GPUs only).

One process per GPU (``--world-size``, default every GPU, at least 3). Every rank makes its
communicator eagerly (``init_process_group(device_id=…)``) and checks a few all-reduces; then
the last rank kills itself (SIGKILL) while the others are inside an all-reduce that needs it.
The survivors see the failure (the work's ``wait`` raises; PyTorch's tear-down on errors is
off: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``), call
``torch.distributed.distributed_c10d.shrink_group([victim], shrink_flags=SHRINK_ABORT)``
(``ncclCommShrink`` with ``NCCL_SHRINK_ABORT``), and check ``--calls`` all-reduces of the
shrunk group against a host reference. Each survivor prints the time from the kill to its
first good all-reduce; the run fails if any check fails or a survivor does not finish.

    LD_PRELOAD=$PWD/target/nccl/lib/libnccl.so.2 python3 nccl/tests/python/torch_shrink.py --expect mscclpp

A PyTorch without ``shrink_group``, or fewer than 3 ranks, prints ``NOT RUN`` and why, and
exits 2.
"""

import argparse
import datetime
import os
import signal
import socket
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, world, args, port, stamp):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    device = torch.device("cuda", dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device,
                            timeout=datetime.timedelta(seconds=60))
    common.report_library(rank, args.expect)
    victim = world - 1

    def checked(group, members, part, count=4096):
        x = torch.tensor(common.values(rank, part, count), dtype=torch.float32, device=device)
        dist.all_reduce(x, group=group)
        want = [float(sum(c)) for c in zip(*[common.values(r, part, count) for r in members])]
        got = [float(v) for v in x.cpu().tolist()]
        if got != want:
            raise AssertionError(f"rank {rank}: all-reduce {part} of {members}: wrong result")

    for part in range(3):
        checked(None, list(range(world)), part)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == victim:
        time.sleep(0.5)  # the others are inside the next all-reduce by now
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.ones(1 << 20, device=device)
    work = dist.all_reduce(x, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=60))
        torch.cuda.synchronize()
        raise AssertionError(f"rank {rank}: an all-reduce that needs the killed rank succeeded")
    except AssertionError:
        raise
    except Exception as e:  # the library's error, as PyTorch reports it
        print(f"rank {rank}: the all-reduce failed: {str(e).splitlines()[0][:200]}", flush=True)
    shrunk = c10d.shrink_group([victim], shrink_flags=c10d.SHRINK_ABORT)
    survivors = [r for r in range(world) if r != victim]
    checked(shrunk, survivors, 100)
    torch.cuda.synchronize()
    first_good = time.time()
    for part in range(args.calls):
        checked(shrunk, survivors, 101 + part % 50)
    torch.cuda.synchronize()
    with open(stamp) as f:
        killed = float(f.read())
    print(f"rank {rank}: kill -> first good all-reduce of the shrunk group {1000 * (first_good - killed):.0f} ms; "
          f"{args.calls} more checked", flush=True)
    dist.destroy_process_group(shrunk)
    print(f"rank {rank}: DONE", flush=True)


def spawned(rank, world, args, port, stamp):
    try:
        run(rank, world, args, port, stamp)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=0, help="processes (default: every GPU, at least 3)")
    ap.add_argument("--calls", type=int, default=1000, help="checked all-reduces of the shrunk group")
    ap.add_argument("--expect", choices=["mscclpp", "nvidia"], help="fail unless this library answers")
    args = ap.parse_args()
    import multiprocessing as mp

    import torch
    from torch.distributed import distributed_c10d as c10d

    if not hasattr(c10d, "shrink_group") or not hasattr(c10d, "SHRINK_ABORT"):
        print(f"NOT RUN: torch_shrink: PyTorch {torch.__version__} has no distributed_c10d.shrink_group", flush=True)
        sys.exit(2)
    world = args.world_size or torch.cuda.device_count()
    if world < 3:
        print(f"NOT RUN: torch_shrink needs at least 3 ranks (a victim and two survivors), not {world} "
              "(--world-size 4 on 2 GPUs with MSCCLPP_RANKS_PER_GPU=2)", flush=True)
        sys.exit(2)
    stamp = os.path.join(tempfile.mkdtemp(prefix="torch_shrink-"), "killed_at")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=spawned, args=(r, world, args, port, stamp)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.time() + 600
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
    bad = []
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
            bad.append(f"rank {r} still ran after 600 s")
        elif r == world - 1 and p.exitcode != -signal.SIGKILL:
            bad.append(f"the victim (rank {r}) ended with {p.exitcode}, not SIGKILL")
        elif r != world - 1 and p.exitcode != 0:
            bad.append(f"survivor rank {r} failed ({p.exitcode})")
    if bad:
        raise SystemExit("torch_shrink: " + "; ".join(bad))
    print(f"torch_shrink: {world - 1} survivor(s) of {world} passed", flush=True)


if __name__ == "__main__":
    main()
