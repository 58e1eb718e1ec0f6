#!/usr/bin/env python3
"""Markdown tables from `mscclpp-bench --json` files (one row per size, ours and the baseline).

usage: scripts/bench-tables.py FILE.json [FILE.json ...]

Prints, per file, a table of size, algorithm, our time, the baseline's time, the speed-up and
both bus bandwidths (from 1 MiB up), as BENCHMARKS.md shows them.
"""
import json
import sys


def size(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        return
    r0 = rows[0]
    place = "in place" if r0.get("inplace") else "out of place"
    wrong = sum(r.get("wrong") or 0 for r in rows)
    base_wrong = sum(r.get("base_wrong") or 0 for r in rows)
    print(f"### {r0['op']}, {r0['type']}, {place} ({wrong} wrong elements, baseline {base_wrong})\n")
    print("| size | algo | ours (µs) | NCCL (µs) | speed-up | ours busbw | NCCL busbw |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        bw = r["size"] >= 1 << 20
        ours_bw = f"{r['busbw_gbps']:.1f}" if bw else ""
        # A run without a baseline has these fields as null (older files may lack them).
        base_bw = f"{r['base_busbw_gbps']:.1f}" if bw and r.get("base_busbw_gbps") is not None else ""
        base = f"{r['base_time_us']:.2f}" if r.get("base_time_us") is not None else ""
        speed = f"{r['speedup']:.2f}×" if r.get("speedup") is not None else ""
        print(
            f"| {size(r['size'])} | {r['algo']} | {r['time_us']:.2f} | {base} | {speed} "
            f"| {ours_bw} | {base_bw} |"
        )
    print()


for p in sys.argv[1:]:
    table(p)
