"""What the GPU scripts of the drop-in NCCL library share (standard library only).

- which NCCL the process has loaded (``loaded_nccl``): the files mapped in
  ``/proc/self/maps`` whose name says NCCL, and whether one is mscclpp-rs's (it alone exports
  ``ncclAllToAll``, a second spelling of NVIDIA's ``ncclAlltoAll``);
- deterministic test data (``value``): a function of (rank, part, index) with no symmetry,
  small integers that every tested type holds exactly, also when summed over 8 ranks;
- results: each rank writes ``{name: [numbers]}`` to ``OUT/rank<r>.json``; ``compare`` says
  whether two runs (ours and NVIDIA's) got the same numbers.
"""

import ctypes
import json
import os
import sys


def loaded_nccl():
    """(paths of the mapped files that look like NCCL, whether one of them is mscclpp-rs's)."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    p = parts[5]
                    name = os.path.basename(p)
                    if ("nccl" in name) and p not in paths:
                        paths.append(p)
    except OSError:
        pass
    ours = False
    for p in paths:
        try:
            lib = ctypes.CDLL(p, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
            ours = ours or hasattr(lib, "ncclAllToAll")
        except OSError:
            pass
    return paths, ours


def report_library(rank, expect):
    """Prints which NCCL is loaded; with ``expect`` = "mscclpp" or "nvidia", fails otherwise."""
    paths, ours = loaded_nccl()
    if rank == 0:
        who = "mscclpp-rs" if ours else "NVIDIA's NCCL (or none)"
        print(f"rank 0: NCCL libraries mapped: {paths or 'none'}; answering: {who}", flush=True)
    if expect == "mscclpp" and not ours:
        raise SystemExit(f"rank {rank}: mscclpp-rs's libnccl.so.2 is not loaded ({paths})")
    if expect == "nvidia" and ours:
        raise SystemExit(f"rank {rank}: mscclpp-rs's libnccl.so.2 is loaded ({paths})")


def value(rank, part, i):
    """Element i of part `part` of rank `rank`: an integer in [-9, 26]."""
    h = (rank * 7919 + part * 104729 + i * 31 + (i * i) % 17) % 31
    return h - (9 if (rank + i) % 3 == 0 else 0)


def values(rank, part, count):
    return [value(rank, part, i) for i in range(count)]


def write_results(out_dir, rank, results):
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, sort_keys=True)


def compare(a, b):
    """Compares the results of two runs (directories of rank<r>.json); exits 1 if they differ."""
    names = sorted(n for n in os.listdir(a) if n.endswith(".json"))
    if not names or names != sorted(n for n in os.listdir(b) if n.endswith(".json")):
        print(f"the runs have different ranks: {a}, {b}")
        sys.exit(1)
    bad = 0
    total = 0
    for n in names:
        with open(os.path.join(a, n)) as f:
            ra = json.load(f)
        with open(os.path.join(b, n)) as f:
            rb = json.load(f)
        for key in sorted(set(ra) | set(rb)):
            total += 1
            if ra.get(key) != rb.get(key):
                bad += 1
                print(f"{n} {key}: differ")
    print(f"{total - bad} of {total} results equal ({a} vs {b})")
    sys.exit(1 if bad else 0)
