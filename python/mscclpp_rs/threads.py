"""Ranks as threads of one Python process.

Every call that waits releases the GIL, so each rank can be a thread: ``run_ranks(n, fn)`` makes
a world of ``n`` ranks on loopback, runs ``fn(comm)`` on each in a thread of its own, and
returns the results in rank order. When a rank raises, the others' communicators are aborted
(their device waits return at once) and the first exception is raised again, naming its rank.

>>> from mscclpp_rs import run_ranks
>>> run_ranks(3, lambda comm: (comm.rank, comm.size))
[(0, 3), (1, 3), (2, 3)]
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence, TypeVar

from .comm import Communicator, UniqueId
from .errors import CommTimeoutError

__all__ = ["run_ranks"]

T = TypeVar("T")


def run_ranks(
    n: int,
    fn: Callable[[Communicator], T],
    *,
    backend: Optional[str] = None,
    timeout: float = 60.0,
    join_timeout: float = 600.0,
    host_ids: Optional[Sequence[str]] = None,
    devices: Optional[Sequence[int]] = None,
    collectives: bool = True,
    settings: Optional[Mapping[str, int]] = None,
    addr: str = "127.0.0.1:0",
) -> List[T]:
    """Runs ``fn`` on ``n`` ranks, each a thread with its ``Communicator`` (module docs).

    ``timeout`` bounds the bootstrap's waits (seconds), ``join_timeout`` the whole run (then
    every rank is aborted and ``CommTimeoutError`` raised). ``host_ids`` emulates nodes (ranks
    with the same id share a node); ``devices`` picks each rank's device (default: its index on
    its node, modulo the devices).
    """
    if n < 1:
        raise ValueError("run_ranks needs at least one rank")
    uid = UniqueId.create(addr)
    results: List[Any] = [None] * n
    comms: List[Optional[Communicator]] = [None] * n
    failures: List[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def abort_all() -> None:
        for c in list(comms):
            if c is not None:
                try:
                    c.abort()
                except Exception:  # a closed communicator: nothing to release
                    pass

    def body(r: int) -> None:
        try:
            comm = Communicator(
                uid, r, n, backend=backend, timeout=timeout,
                host_id=host_ids[r] if host_ids else None,
                device=devices[r] if devices else None,
                collectives=collectives, settings=settings,
            )
            comms[r] = comm
            results[r] = fn(comm)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            with lock:
                failures.append((r, e))
            abort_all()

    threads = [
        threading.Thread(target=body, args=(r,), name=f"mscclpp-rank{r}", daemon=True)
        for r in range(n)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        abort_all()
        for t in threads:
            t.join(10.0)
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        raise CommTimeoutError(f"run_ranks: ranks {stuck} did not finish in {join_timeout} s")
    for c in comms:
        if c is not None:
            c.close()
    if failures:
        rank, first = failures[0]
        if hasattr(first, "add_note"):
            first.add_note(f"(raised on rank {rank} of {n})")
        raise first
    return results
