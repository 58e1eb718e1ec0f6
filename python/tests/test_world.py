"""Worlds: the ways to make one (unique id, address and secret, the environment, an exchange
such as a torch process group's), ranks as processes, the node layout, splits, the bootstrap's
small messages, and the GIL released while a call waits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

import numpy as np
import pytest

import mscclpp_rs
from helpers import PortClash, check, clashed, no_failures, on_a_free_port, reduce_ref, values, world
from mscclpp_rs.comm import _join_via


def test_unique_id_round_trip() -> None:
    uid = mscclpp_rs.UniqueId.create("127.0.0.1:0")
    assert uid.holds_listener and uid.authenticated
    again = mscclpp_rs.UniqueId.from_bytes(uid.to_bytes())
    assert again.root == uid.root and not again.holds_listener
    assert mscclpp_rs.UniqueId.from_hex(uid.hex()).to_bytes() == uid.to_bytes()
    assert len(uid.to_bytes()) == mscclpp_rs.UniqueId.BYTES == 72
    with pytest.raises(mscclpp_rs.InvalidArgumentError):
        mscclpp_rs.UniqueId.from_bytes(b"\x00" * 10)


def test_from_address_with_a_secret() -> None:
    def attempt(port: int) -> List[object]:
        addr = f"127.0.0.1:{port}"
        out: List[object] = [None, None]
        errors: List[Optional[BaseException]] = [None, None]

        def rank(r: int) -> None:
            try:
                c = mscclpp_rs.Communicator.from_address(
                    addr, r, 2, secret="a shared passphrase", backend="cpu", timeout=30,
                    collectives=False,
                )
                out[r] = (c.rank, c.size, c.all_gather_bytes(bytes([r]) * 3))
            except BaseException as e:  # noqa: BLE001 - raised below
                errors[r] = e

        ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        for e in errors:
            if e is not None:
                raise e
        return out

    assert on_a_free_port(attempt) == [(r, 2, [b"\x00" * 3, b"\x01" * 3]) for r in range(2)]


def test_join_via_an_exchange() -> None:
    """What ``from_torch`` does with the process group's broadcast, with a stand-in for it."""
    box: Dict[str, bytes] = {}
    ready = threading.Event()
    out: List[Optional[int]] = [None, None]

    def exchange(mine: Optional[bytes]) -> bytes:
        if mine is not None:
            box["id"] = mine
            ready.set()
        ready.wait(30)
        return box["id"]

    def rank(r: int) -> None:
        c = _join_via(exchange, r, 2, "127.0.0.1:0", backend="cpu", collectives=False)
        out[r] = c.broadcast_bytes(0, b"from rank 0" if r == 0 else b"")[-1]

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out == [ord("0"), ord("0")]


CHILD = r"""
import sys, numpy as np, mscclpp_rs
sys.path.insert(0, sys.argv[1])
from helpers import values, reduce_ref
comm = mscclpp_rs.Communicator.from_env()
n, r = comm.size, comm.rank
x = values(r, 0, 20000, np.float32)
comm.all_reduce(x)
ok = np.array_equal(x, reduce_ref([values(q, 0, 20000, np.float32) for q in range(n)], "sum"))
d = comm.from_numpy(values(r, 1, 5000, np.int64))
comm.all_reduce(d, "max")
ok2 = np.array_equal(d.numpy(), reduce_ref([values(q, 1, 5000, np.int64) for q in range(n)], "max"))
print(f"rank {r}/{n} local {comm.topology.local_rank} ok {ok} {ok2} {comm.last_algorithm}")
comm.barrier()
"""


@pytest.mark.parametrize("launcher", ["mscclpp", "torchrun"])
def test_ranks_as_processes_from_the_environment(launcher: str) -> None:
    """Ranks as processes, each joining from its environment as a launcher would set it; the
    zero-copy path maps the peers' memory across processes."""
    n = 2
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    def attempt(port: int) -> List[str]:
        procs = []
        for r in range(n):
            env = dict(os.environ, MSCCLPP_BACKEND="cpu", MSCCLPP_BOOTSTRAP_TIMEOUT_MS="30000")
            if launcher == "torchrun":
                env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           MSCCLPP_SECRET="the test world's passphrase")
            else:
                env.update(MSCCLPP_RANK=str(r), MSCCLPP_WORLD_SIZE=str(n),
                           MSCCLPP_BOOTSTRAP=f"127.0.0.1:{port}",
                           MSCCLPP_SECRET="the test world's passphrase")
            procs.append(subprocess.Popen(
                [sys.executable, "-c", CHILD, tests_dir], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            ))
        outs = [p.communicate(timeout=120) for p in procs]
        if any(clashed(err) for _, err in outs):
            raise PortClash(" / ".join(err for _, err in outs))
        for r, (p, (out, err)) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"rank {r}: {err}"
        return [out for out, _ in outs]

    for r, out in enumerate(on_a_free_port(attempt)):
        assert f"rank {r}/{n}" in out and "ok True True" in out, out


RANK0 = r"""
import mscclpp_rs
uid = mscclpp_rs.UniqueId.create("127.0.0.1:0")   # rank 0 makes the id (and holds its port)
print(uid.hex(), flush=True)                      # ... and hands it to the others
c = mscclpp_rs.Communicator(uid, 0, 2, backend="cpu", collectives=False)
print(c.rank, c.all_gather_bytes(bytes([c.rank]))[1])
"""


def test_ranks_as_processes_with_a_unique_id() -> None:
    """Rank 0's process makes the id; rank 1's joins from the environment
    (``MSCCLPP_UNIQUE_ID``), as a launcher would pass it."""
    env = dict(os.environ, MSCCLPP_BACKEND="cpu")
    rank0 = subprocess.Popen([sys.executable, "-c", RANK0], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert rank0.stdout is not None
    hex_id = rank0.stdout.readline().strip()
    code = (
        "import mscclpp_rs\n"
        "c = mscclpp_rs.Communicator.from_env(collectives=False)\n"
        "print(c.rank, c.all_gather_bytes(bytes([c.rank]))[0])\n"
    )
    rank1 = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env=dict(env, MSCCLPP_RANK="1", MSCCLPP_WORLD_SIZE="2", MSCCLPP_UNIQUE_ID=hex_id),
    )
    out0, err0 = rank0.communicate(timeout=60)
    assert rank0.returncode == 0 and rank1.returncode == 0, err0 + rank1.stderr
    assert (out0.split(), rank1.stdout.split()) == (["0", "b'\\x01'"], ["1", "b'\\x00'"])


def test_topology_and_split() -> None:
    """Four ranks on two emulated nodes; a split by node, ranked by descending rank."""
    hosts = ["node-a", "node-b", "node-a", "node-b"]

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        t = comm.topology
        if (t.nodes, t.node, t.local_ranks) != (2, r % 2, (r % 2, r % 2 + 2)):
            failures.append(f"topology {t}")
        if t.local_rank != r // 2:
            failures.append(f"local rank {t.local_rank}")
        sub = comm.split(r % 2, key=-r)
        if sub is None or sub.size != 2 or sub.rank != (1 if r < 2 else 0):
            failures.append(f"split gave {sub!r}")
        none = comm.split(None if r == 0 else 7)
        if (none is None) != (r == 0) or (none is not None and none.size != 3):
            failures.append(f"split with no color gave {none!r}")
        got = comm.all_gather_bytes(bytes([r]))
        if got != [bytes([q]) for q in range(4)]:
            failures.append(f"all_gather_bytes {got}")
        if r == 0:
            comm.send_bytes(3, b"hello", tag=9)
        if r == 3 and comm.recv_bytes(0, tag=9) != b"hello":
            failures.append("recv_bytes")
        return failures

    no_failures(world(4, rank, host_ids=hosts, collectives=False))


def test_split_has_collectives() -> None:
    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        sub = comm.split(r // 2, key=r)
        assert sub is not None
        x = values(r, 0, 100, np.int32)
        sub.all_reduce(x)
        group = [r // 2 * 2, r // 2 * 2 + 1]
        check(x, reduce_ref([values(q, 0, 100, np.int32) for q in group], "sum"),
              "all_reduce in the split", failures)
        sub.close()
        return failures

    no_failures(world(4, rank))


def test_gil_is_released_while_a_call_waits() -> None:
    """While rank 1 waits in a barrier for rank 0, which sleeps first, a pure-Python thread
    keeps counting: the waiting call does not hold the GIL."""
    counts: List[int] = []
    stop = threading.Event()

    def count() -> None:
        c = 0
        while not stop.is_set():
            c += 1
            if c % 1000 == 0:
                counts.append(c)

    def rank(comm: mscclpp_rs.Communicator) -> float:
        if comm.rank == 0:
            time.sleep(1.0)
            comm.barrier()
            return 0.0
        counter = threading.Thread(target=count)
        counter.start()
        before = len(counts)
        t0 = time.monotonic()
        comm.barrier()
        waited = time.monotonic() - t0
        stop.set()
        counter.join()
        return (len(counts) - before) / max(waited, 1e-3)

    rates = world(2, rank, collectives=False)
    assert rates[1] > 10, f"the counter advanced {rates[1]:.1f} thousand per second"
