"""Errors reach Python as typed exceptions carrying the library's text and the Rust variant:
arguments the package refuses itself, the library's refusals, a receive of the wrong count, a
missing rank, a wrong secret, an aborted communicator, a peer that dies."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Type

import numpy as np
import pytest

import mscclpp_rs
from helpers import PortClash, check, clashed, no_failures, on_a_free_port, values, world


def expect(
    failures: List[str], cls: Type[BaseException], what: str, call: Callable[[], Any],
    variant: Optional[str] = None, text: Optional[str] = None,
) -> None:
    """Records a failure unless ``call`` raises ``cls`` (with ``variant`` and ``text``)."""
    try:
        call()
    except cls as e:
        if variant is not None and getattr(e, "variant", None) != variant:
            failures.append(f"{what}: variant {getattr(e, 'variant', None)!r}, not {variant!r}")
        if text is not None and text not in str(e):
            failures.append(f"{what}: {str(e)!r} does not say {text!r}")
        return
    except BaseException as e:  # noqa: BLE001 - the wrong class is the failure reported
        failures.append(f"{what}: raised {type(e).__name__}: {e}")
        return
    failures.append(f"{what}: raised nothing")


class FakeCudaArray:
    """Claims to be CUDA memory (on a machine of the CPU backend it is not reachable)."""

    __cuda_array_interface__ = {"data": (0x1000, False), "shape": (4,), "typestr": "<f4",
                                "version": 3}


def test_arguments() -> None:
    bad = mscclpp_rs.InvalidArgumentError

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        f: List[str] = []
        x = np.zeros(16, np.float32)
        expect(f, bad, "peer out of range", lambda: comm.send(x, 5), text="peer 5")
        expect(f, bad, "send to self", lambda: comm.send(x, comm.rank))
        expect(f, bad, "root out of range", lambda: comm.broadcast(x, 9), "NoSuchRank", "9")
        expect(f, bad, "small output", lambda: comm.all_gather(np.zeros(16, np.float32), x),
               text="needs 32")
        expect(f, bad, "type mismatch",
               lambda: comm.all_reduce(x, output=np.zeros(16, np.float64)), text="float64")
        ro = np.zeros(16, np.float32)
        ro.flags.writeable = False
        expect(f, bad, "read-only", lambda: comm.all_reduce(ro), text="read-only")
        expect(f, bad, "not contiguous", lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1]),
               text="contiguous")
        expect(f, bad, "unknown algorithm", lambda: comm.all_reduce(x, algorithm="warp-drive"),
               text="warp-drive")
        expect(f, bad, "unknown reduction", lambda: comm.all_reduce(x, "median"))
        expect(f, bad, "unknown type", lambda: comm.all_reduce(np.zeros(4, np.complex64)))
        expect(f, bad, "CUDA memory on the CPU backend", lambda: comm.all_reduce(FakeCudaArray()),
               text="CPU backend")
        expect(f, bad, "not an array", lambda: comm.all_reduce([1.0, 2.0]), text="list")
        expect(f, bad, "uneven parts", lambda: comm.all_to_all(np.zeros(5, np.int8),
                                                                 np.zeros(5, np.int8)))
        expect(f, bad, "all_to_allv counts", lambda: comm.all_to_allv(x, x, [1], [1]))
        # Memory no peer can map (host memory on the CPU backend) is not an error: the
        # registration is declined (a hint that does nothing; calls on the array stage).
        try:
            comm.register_buffer(np.zeros(4096, np.uint8))
        except BaseException as e:  # noqa: BLE001 - any exception is the failure reported
            f.append(f"host memory registration raised {type(e).__name__}: {e}")
        expect(f, bad, "tag too large", lambda: comm.send_bytes(1 - comm.rank, b"", tag=1 << 40))
        expect(f, bad, "unknown setting", lambda: mscclpp_rs._native.Collectives(
            comm.native, {"MSCCLPP_NO_SUCH_SETTING": 1}), text="MSCCLPP_NO_SUCH_SETTING")
        expect(f, mscclpp_rs.InvalidUsageError, "group used after its end",
               lambda: _ended_group(comm).send(x, 0))
        return f

    no_failures(world(2, rank))


def _ended_group(comm: mscclpp_rs.Communicator) -> mscclpp_rs.Group:
    g = comm.group()
    g.end()
    return g


def test_count_mismatch_then_go_on() -> None:
    """A receive of another count than its send: the receiving rank gets CountMismatchError
    naming the sender's count, nothing is written, and after reset_status both go on."""

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        f: List[str] = []
        if comm.rank == 0:
            comm.send(values(0, 0, 100, np.int32), 1)
        else:
            got = np.full(50, 7, np.int32)
            expect(f, mscclpp_rs.CountMismatchError, "short receive", lambda: comm.recv(got, 0),
                   "CountMismatch", "400")
            check(got, np.full(50, 7, np.int32), "nothing written", f)
            comm.reset_status()
        comm.barrier()
        x = values(comm.rank, 1, 10, np.int32)
        comm.all_reduce(x)
        check(x, values(0, 1, 10, np.int32) + values(1, 1, 10, np.int32), "after reset", f)
        return f

    no_failures(world(2, rank))


def test_missing_rank_times_out() -> None:
    uid = mscclpp_rs.UniqueId.create("127.0.0.1:0")
    t0 = time.monotonic()
    with pytest.raises(mscclpp_rs.CommTimeoutError) as info:
        mscclpp_rs.Communicator(uid, 0, 2, backend="cpu", timeout=1.0)
    assert time.monotonic() - t0 < 20
    assert isinstance(info.value, TimeoutError) and info.value.variant.startswith("Bootstrap")
    assert "1" in str(info.value)


def test_wrong_secret_is_refused() -> None:
    def attempt(port: int) -> List[Optional[BaseException]]:
        addr = f"127.0.0.1:{port}"
        errors: List[Optional[BaseException]] = [None, None]

        def rank(r: int, secret: str) -> None:
            try:
                mscclpp_rs.Communicator.from_address(addr, r, 2, secret=secret, backend="cpu",
                                                     timeout=3.0, collectives=False)
            except BaseException as e:  # noqa: BLE001 - checked below
                errors[r] = e

        ts = [threading.Thread(target=rank, args=(0, "the right passphrase!")),
              threading.Thread(target=rank, args=(1, "a wrong passphrase!!!"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        if any(e is not None and clashed(str(e)) for e in errors):
            raise PortClash(str(errors))
        return errors

    errors = on_a_free_port(attempt)
    assert isinstance(errors[1], mscclpp_rs.BootstrapError), repr(errors[1])
    assert errors[1].variant == "BootstrapAuth", errors[1].variant
    assert isinstance(errors[0], mscclpp_rs.MscclppError), repr(errors[0])


def test_abort() -> None:
    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        f: List[str] = []
        comm.barrier()
        comm.abort()
        expect(f, mscclpp_rs.AbortedError, "a call after abort",
               lambda: comm.all_reduce(np.zeros(4, np.float32)), "Aborted")
        expect(f, mscclpp_rs.AbortedError, "check after abort", comm.check)
        return f

    no_failures(world(2, rank))


PEER = r"""
import os, mscclpp_rs
c = mscclpp_rs.Communicator.from_address(os.environ["ADDR"], 1, 2, secret="passphrase of the test",
                                         backend="cpu", collectives=False)
c.barrier()
os._exit(3)  # dies without a goodbye
"""


def test_dead_peer_is_a_remote_error() -> None:
    def attempt(port: int) -> None:
        addr = f"127.0.0.1:{port}"
        peer = subprocess.Popen([sys.executable, "-c", PEER], env=dict(os.environ, ADDR=addr),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            comm = mscclpp_rs.Communicator.from_address(
                addr, 0, 2, secret="passphrase of the test", backend="cpu", timeout=30,
                collectives=False,
            )
            comm.barrier()
            peer.wait(30)
            with pytest.raises(mscclpp_rs.RemoteError) as info:
                for _ in range(100):  # each waits at most the deadline; the death ends it
                    comm.barrier()
            assert isinstance(info.value, ConnectionError)
            assert "1" in str(info.value)
        finally:
            peer.kill()
            peer.communicate()

    on_a_free_port(attempt)


def test_no_cuda_is_unsupported() -> None:
    try:
        count = mscclpp_rs.device_count("cuda")
    except mscclpp_rs.UnsupportedError as e:
        assert e.variant == "NoLibcuda"
        return
    except mscclpp_rs.DeviceError:
        pytest.skip("NOT RUN: libcuda is present but reports an error (a driver without GPU)")
    pytest.skip(f"NOT RUN: this machine has CUDA ({count} devices); the test needs none")
