"""What the tests share: worlds of ranks as threads on the CPU backend, test data that cannot
collude with a bug (a hash of rank, part and index; outputs start as a marker), and host
references computed independently of the library.

Every test names its backend (``backend="cpu"`` here), so the suite means the same thing on a
GPU machine; tests that need a GPU or a package that is missing say ``NOT RUN`` and why.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, List, Sequence, TypeVar

import numpy as np

import mscclpp_rs

T = TypeVar("T")


MARKER = 0xA5
"""Outputs are filled with this byte first: what the call does not write must keep it."""

# The NumPy types the tests run every call on (bfloat16 and fp8 go through DeviceArray bytes).
NUMPY_TYPES = [
    np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.uint32, np.int64,
    np.uint64,
]


def world(n: int, fn: Callable[[mscclpp_rs.Communicator], T], **kw: Any) -> List[T]:
    """``fn`` on ``n`` ranks (threads) of the CPU backend, bounded in time."""
    kw.setdefault("backend", "cpu")
    kw.setdefault("timeout", 30.0)
    kw.setdefault("join_timeout", 240.0)
    return mscclpp_rs.run_ranks(n, fn, **kw)


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit mixing function (splitmix64's finalizer), elementwise."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def values(rank: int, part: int, count: int, dtype: Any, kind: str = "sum") -> np.ndarray:
    """``count`` elements for (rank, part): a hash of (rank, part, index), no period, no
    symmetry between ranks; small enough that sums (``kind="sum"``) and products
    (``kind="prod"``) of up to 8 ranks are exact in every type."""
    i = np.arange(count, dtype=np.uint64)
    seed = np.uint64((rank + 1) * 1_000_003 + (part + 1) * 7_919)
    with np.errstate(over="ignore"):
        h = _mix(i * np.uint64(0x9E3779B97F4A7C15) + seed)
    dt = np.dtype(dtype)
    if kind == "prod":
        v = (h % np.uint64(3)).astype(np.int64) + 1  # 1 … 3
    elif dt.kind == "u":
        v = (h % np.uint64(16)).astype(np.int64)  # 0 … 15
    else:
        v = (h % np.uint64(31)).astype(np.int64) - 15  # -15 … 15
    out: np.ndarray = v.astype(dt)
    return out


def marked(count: int, dtype: Any) -> np.ndarray:
    """An output of ``count`` elements filled with the marker byte."""
    out: np.ndarray = np.full(count * np.dtype(dtype).itemsize, MARKER, dtype=np.uint8)
    return out.view(dtype)


def reduce_ref(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of ``arrays`` by ``op`` in their own type (integers wrap, as in NCCL;
    averages as NCCL lowers them: floats ``Σ x·(1/n)``, integers ``(Σ x) / n`` truncated)."""
    stack = np.stack(arrays)
    dt = stack.dtype
    n = len(arrays)
    out: np.ndarray
    with np.errstate(over="ignore"):
        if op == "sum":
            out = np.add.reduce(stack, axis=0, dtype=dt)
        elif op == "prod":
            out = np.multiply.reduce(stack, axis=0, dtype=dt)
        elif op == "min":
            out = stack.min(axis=0)
        elif op == "max":
            out = stack.max(axis=0)
        elif op == "avg" and dt.kind == "f":
            out = np.add.reduce(stack * dt.type(1.0 / n), axis=0, dtype=dt)
        elif op == "avg":
            total = np.add.reduce(stack, axis=0, dtype=dt)
            if dt.kind == "u":
                out = (total // n).astype(dt)
            else:
                out = np.trunc(total.astype(np.float64) / n).astype(dt)
        else:
            raise ValueError(op)
    return out


def check(got: np.ndarray, want: np.ndarray, what: str, failures: List[str]) -> None:
    """Records a failure naming the first wrong element."""
    g = np.asarray(got).view(np.uint8)
    w = np.asarray(want).view(np.uint8)
    if g.shape != w.shape or not np.array_equal(g, w):
        gv, wv = np.asarray(got).ravel(), np.asarray(want).ravel()
        bad = int(np.argmax(gv != wv)) if gv.shape == wv.shape else -1
        detail = f"element {bad}: {gv[bad]!r} != {wv[bad]!r}" if bad >= 0 else "shape"
        failures.append(f"{what}: {detail}")


def no_failures(results: List[List[str]]) -> None:
    """Asserts that no rank recorded a failure."""
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures[:20])


class PortClash(Exception):
    """A port taken by another program between choosing it and binding it."""


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clashed(text: str) -> bool:
    """Whether an error text says that a port was taken."""
    return "address already in use" in text.lower()


def on_a_free_port(run: Callable[[int], T], tries: int = 4) -> T:
    """``run(port)`` with a port that was free a moment ago; again with another when something
    else took it in between (``run`` raises ``PortClash``, or an error saying so): other
    programs on this machine bind loopback ports too."""
    for attempt in range(tries):
        try:
            return run(free_port())
        except Exception as e:  # noqa: BLE001 - re-raised unless it is a clash
            if attempt == tries - 1 or not (isinstance(e, PortClash) or clashed(str(e))):
                raise
    raise AssertionError("unreachable")
