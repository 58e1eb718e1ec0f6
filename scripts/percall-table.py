#!/usr/bin/env python3
"""A Markdown table from nccl-percall's JSON lines (nccl/bench/percall.c): for every
collective x type x size, the microseconds per call of `ours` and of `nccl` (NVIDIA's), eager
and graph-captured, and ours/NCCL (below 1: ours is cheaper). Lines that were skipped or
failed are listed after the table.

    python3 scripts/percall-table.py percall.jsonl [--ours NAME] [--nccl NAME]
"""
import argparse
import json


def size(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--ours", default="ours")
    ap.add_argument("--nccl", default="nccl")
    a = ap.parse_args()
    t, other = {}, []
    with open(a.jsonl) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "us_per_call" not in r:
                other.append(r)
                continue
            t[(r["op"], r["dtype"], r["bytes"], r["mode"], r["lib"])] = r["us_per_call"]
    keys = sorted({(o, d, b) for (o, d, b, _, _) in t}, key=lambda k: (k[0], k[1], k[2]))
    print("| op | type | size | eager ours | eager NCCL | ratio | graph ours | graph NCCL | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for o, d, b in keys:
        cells = []
        for mode in ("eager", "graph"):
            x, y = t.get((o, d, b, mode, a.ours)), t.get((o, d, b, mode, a.nccl))
            cells += [
                "" if x is None else f"{x:.2f}",
                "" if y is None else f"{y:.2f}",
                "" if x is None or not y else f"{x / y:.2f}",
            ]
        print(f"| {o} | {d} | {size(b)} | " + " | ".join(cells) + " |")
    for r in other:
        print(f"- {r.get('lib')} {r.get('op')} {r.get('dtype', '')} {r.get('bytes', '')} "
              f"{r.get('mode', '')}: {r.get('skipped') or r.get('error')}")


if __name__ == "__main__":
    main()
