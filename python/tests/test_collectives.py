"""Every collective on NumPy data (the CPU backend), on 2, 3 and 4 ranks, checked element by
element against a host reference: every NumPy type the library takes, every reduction, in
place and out of place, sizes that take each algorithm the selection table picks for host
memory (LL, LL128 / LL2, staging), outputs that start as a marker."""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pytest

import mscclpp_rs
from helpers import NUMPY_TYPES, check, marked, no_failures, reduce_ref, values, world

SIZES = [1, 37, 1000]
"""Elements: one, an odd count, LL128 / LL2 sizes for 4-byte types."""

LARGE = 20000
"""Beyond LL's reach on the CPU backend for 4- and 8-byte types (64 KiB for all-reduce):
staging (host memory cannot take the zero-copy paths)."""

OPS = ["sum", "prod", "min", "max", "avg"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce(n: int) -> None:
    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        algorithms: set[Optional[str]] = set()
        for dt in NUMPY_TYPES:
            for op in OPS:
                if op == "avg" and np.dtype(dt).kind == "f" and n == 3:
                    continue  # 1/3 rounds: the kernels' order of summation is theirs
                kind = "prod" if op == "prod" else "sum"
                large = op in ("sum", "max") and np.dtype(dt).itemsize >= 4
                for count in SIZES + ([LARGE] if large else []):
                    mine = values(r, 0, count, dt, kind)
                    want = reduce_ref([values(q, 0, count, dt, kind) for q in range(n)], op)
                    x = mine.copy()
                    comm.all_reduce(x, op)
                    algorithms.add(comm.last_algorithm)
                    check(x, want, f"all_reduce {op} {np.dtype(dt)} x{count} in place", failures)
                    out = marked(count, dt)
                    comm.all_reduce(mine, op, output=out)
                    check(out, want, f"all_reduce {op} {np.dtype(dt)} x{count}", failures)
                    check(mine, values(r, 0, count, dt, kind), "all_reduce input kept", failures)
        # A pre-multiplied sum, by value and by a scalar in device memory.
        for scalar in (2.0, 0.5):
            x = values(r, 1, 500, np.float32)
            want = reduce_ref([values(q, 1, 500, np.float32) * np.float32(scalar)
                               for q in range(n)], "sum")
            comm.all_reduce(x, mscclpp_rs.PreMulSum(scalar))
            check(x, want, f"premul_sum {scalar}", failures)
            s = comm.from_numpy(np.array([scalar], np.float32))
            y = values(r, 1, 500, np.float32)
            comm.all_reduce(y, mscclpp_rs.PreMulSum(s))
            check(y, want, f"premul_sum device scalar {scalar}", failures)
        # Zero elements: touches nothing.
        empty = np.zeros(0, np.float32)
        comm.all_reduce(empty)
        # The largest sizes take the direct kernel, which hands a call on unshareable memory to
        # staging on the device: the record then says "direct" (``last_call_declined``).
        if not {"ll", "ll128" if n < 4 else "ll2"} <= algorithms or not {"staged", "direct"} & algorithms:
            failures.append(f"algorithms taken: {sorted(map(str, algorithms))}")
        return failures

    no_failures(world(n, rank))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_gather_family(n: int) -> None:
    """all_gather, gather, broadcast, reduce and scatter, from every root."""

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        for dt in (np.float32, np.int8, np.uint64, np.float16):
            for count in (1, 333, 5000):
                mine = values(r, 2, count, dt)
                out = marked(n * count, dt)
                comm.all_gather(out, mine)
                want = np.concatenate([values(q, 2, count, dt) for q in range(n)])
                check(out, want, f"all_gather {np.dtype(dt)} x{count}", failures)
                # In place: this rank's part already in place in the output.
                inplace = marked(n * count, dt)
                inplace[r * count:(r + 1) * count] = mine
                comm.all_gather(inplace, inplace[r * count:(r + 1) * count])
                check(inplace, want, f"all_gather in place x{count}", failures)
                for root in range(n):
                    b = values(r, 3 + root, count, dt)
                    comm.broadcast(b, root)
                    check(b, values(root, 3 + root, count, dt), f"broadcast root {root}", failures)
                    red = values(r, 4, count, dt)
                    comm.reduce(red, root, "max")
                    want_red = (reduce_ref([values(q, 4, count, dt) for q in range(n)], "max")
                                if r == root else values(r, 4, count, dt))
                    check(red, want_red, f"reduce max root {root} x{count}", failures)
                    g_out = marked(n * count, dt) if r == root else None
                    comm.gather(values(r, 5, count, dt), g_out, root)
                    if g_out is not None:
                        check(g_out, np.concatenate([values(q, 5, count, dt) for q in range(n)]),
                              f"gather root {root} x{count}", failures)
                    s_in = (np.concatenate([values(root, 6 + q, count, dt) for q in range(n)])
                            if r == root else None)
                    s_out = marked(count, dt)
                    comm.scatter(s_out, s_in, root)
                    check(s_out, values(root, 6 + r, count, dt), f"scatter root {root}", failures)
        return failures

    no_failures(world(n, rank))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_reduce_scatter_and_all_to_all(n: int) -> None:
    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        for dt in (np.float32, np.int32, np.uint8, np.float64):
            for count in (1, 250, 4500):
                for op in ("sum", "min"):
                    src = np.concatenate([values(r, p, count, dt) for p in range(n)])
                    out = marked(count, dt)
                    comm.reduce_scatter(out, src, op)
                    want = reduce_ref([values(q, r, count, dt) for q in range(n)], op)
                    check(out, want, f"reduce_scatter {op} {np.dtype(dt)} x{count}", failures)
                a_in = np.concatenate([values(r, 10 + p, count, dt) for p in range(n)])
                a_out = marked(n * count, dt)
                comm.all_to_all(a_out, a_in)
                want_a = np.concatenate([values(q, 10 + r, count, dt) for q in range(n)])
                check(a_out, want_a, f"all_to_all {np.dtype(dt)} x{count}", failures)
        # all_to_allv: rank r sends (r + q + 1) * 7 elements to rank q, packed.
        dt = np.int64
        send_counts = [(r + q + 1) * 7 for q in range(n)]
        recv_counts = [(q + r + 1) * 7 for q in range(n)]
        send = np.concatenate([values(r, 20 + q, send_counts[q], dt) for q in range(n)])
        recv = marked(sum(recv_counts) + 5, dt)  # room beyond the parts keeps the marker
        comm.all_to_allv(recv, send, send_counts, recv_counts)
        want = np.concatenate([values(q, 20 + r, recv_counts[q], dt) for q in range(n)]
                              + [marked(5, dt)])
        check(recv, want, "all_to_allv", failures)
        return failures

    no_failures(world(n, rank))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_point_to_point(n: int) -> None:
    """send / recv around a ring (even ranks send first), send_recv both ways, and a group
    that sends to every rank and receives from every rank (this one included)."""

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        nxt, prv = (r + 1) % n, (r - 1) % n
        for count in (1, 100, 3000):
            dt = np.uint32
            got = marked(count, dt)
            if r % 2 == 0:
                comm.send(values(r, 30, count, dt), nxt)
                comm.recv(got, prv)
            else:
                comm.recv(got, prv)
                comm.send(values(r, 30, count, dt), nxt)
            check(got, values(prv, 30, count, dt), f"ring send/recv x{count}", failures)
            sr = marked(count, np.float32)
            comm.send_recv(values(r, 31, count, np.float32), nxt, sr, prv)
            check(sr, values(prv, 31, count, np.float32), f"send_recv x{count}", failures)
        outs = [marked(64 + q, np.int32) for q in range(n)]
        with comm.group() as g:
            for q in range(n):
                g.send(values(r, 40 + q, 64 + r, np.int32), q)
            for q in range(n):
                g.recv(outs[q], q)
        # outs[q] was sized 64 + q: rank q sent 64 + q elements to every rank.
        for q in range(n):
            check(outs[q], values(q, 40 + r, 64 + q, np.int32), f"group from {q}", failures)
        # A group that mixes a collective with point-to-point calls.
        x = values(r, 50, 99, np.float64)
        ring = marked(10, np.float64)
        with comm.group() as g:
            g.all_reduce(x)
            g.send(values(r, 51, 10, np.float64), nxt)
            g.recv(ring, prv)
        check(x, reduce_ref([values(q, 50, 99, np.float64) for q in range(n)], "sum"),
              "group all_reduce", failures)
        check(ring, values(prv, 51, 10, np.float64), "group ring", failures)
        return failures

    no_failures(world(n, rank))
