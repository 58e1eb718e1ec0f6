"""``DeviceArray`` (the library's memory) and what only it can do on the CPU backend: a NumPy
view of the same bytes, the zero-copy collective paths (direct, copy engines), registration,
windows, ``mem_alloc``; bfloat16 and fp8 as raw bytes; calls queued on a stream."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import mscclpp_rs
from helpers import check, marked, no_failures, reduce_ref, values, world
from mscclpp_rs.dtypes import DType


def test_numpy_view_is_the_same_memory() -> None:
    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        failures: List[str] = []
        a = comm.zeros((3, 5), np.int32)
        view = a.numpy()
        if view.shape != (3, 5) or view.dtype != np.int32 or view.sum() != 0:
            failures.append(f"fresh view {view.shape} {view.dtype} sum {view.sum()}")
        view[1, 2] = 42  # writes the device memory itself
        check(a.to_numpy()[1], np.array([0, 0, 42, 0, 0], np.int32), "write through view",
              failures)
        if view.__array_interface__["data"][0] != a.ptr:
            failures.append("the view is not at the array's address")
        b = comm.from_numpy(np.arange(7, dtype=np.float64))
        check(b.to_numpy(), np.arange(7, dtype=np.float64), "from_numpy", failures)
        return failures

    no_failures(world(1, rank))


@pytest.mark.parametrize("n", [2, 4])
def test_zero_copy_paths_and_registration(n: int) -> None:
    """DeviceArrays take the direct kernel and the copy engines, unregistered (a per-call
    exchange) and registered (none); results checked either way."""

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        count = 3000  # 12 KiB of f32: above direct_min_bytes (4 KiB) on the CPU backend
        x = comm.from_numpy(values(r, 0, count, np.float32))
        want = reduce_ref([values(q, 0, count, np.float32) for q in range(n)], "sum")
        comm.all_reduce(x, algorithm="direct")
        check(x.numpy(), want, "direct all_reduce", failures)
        src = comm.from_numpy(values(r, 1, count, np.int32))
        out = comm.zeros(n * count, np.int32)
        comm.all_gather(out, src)
        check(out.numpy(), np.concatenate([values(q, 1, count, np.int32) for q in range(n)]),
              f"all_gather ({comm.last_algorithm})", failures)
        # Registered: every rank registers its buffers, calls exchange nothing per call. 80 KiB:
        # beyond the LL algorithms' sizes on the CPU backend, so the table picks direct.
        big = 20000
        y = comm.from_numpy(values(r, 2, big, np.float32))
        before = comm.registrations()
        with comm.register_buffer(y) as reg:
            if reg.ptr != y.ptr or reg.nbytes != y.nbytes or reg.is_window:
                failures.append(f"registration {reg!r}")
            if comm.registrations()[0] != before[0] + 1:
                failures.append(f"registrations {before} -> {comm.registrations()}")
            comm.all_reduce(y, "max")
            if comm.last_algorithm != "direct":
                failures.append(f"registered all_reduce took {comm.last_algorithm}")
            check(y.numpy(), reduce_ref([values(q, 2, big, np.float32) for q in range(n)], "max"),
                  "registered all_reduce", failures)
        if comm.registrations()[0] != before[0]:
            failures.append("deregister did not take the registration back")
        # A window (collective), and memory of mem_alloc.
        w_out = comm.zeros(n * 256, np.uint8)
        win = comm.register_window(w_out)
        if not win.is_window:
            failures.append("register_window made no window")
        w_in = comm.mem_alloc(256, np.uint8)
        w_in.copy_from(values(r, 3, 256, np.uint8))
        comm.all_gather(w_out, w_in)
        check(w_out.numpy(), np.concatenate([values(q, 3, 256, np.uint8) for q in range(n)]),
              "all_gather into a window", failures)
        comm.mem_free(w_in)
        win.deregister()
        return failures

    no_failures(world(n, rank))


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (round to nearest even; the test values are exact)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_bfloat16_and_fp8_as_bytes() -> None:
    """Types NumPy lacks (without ml_dtypes) still run: DeviceArrays of them, written and read
    as raw bits."""
    n = 2

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        count = 300
        mine = values(r, 0, count, np.float32)  # small integers: exact in bfloat16
        a = comm.zeros(count, "bfloat16")
        a.buffer.copy_from(0, _bf16_bits(mine).tobytes())
        comm.all_reduce(a)
        got = np.frombuffer(a.buffer.copy_to(0, 2 * count), np.uint16)
        want = _bf16_bits(reduce_ref([values(q, 0, count, np.float32) for q in range(n)], "sum"))
        check(got, want, "bfloat16 all_reduce", failures)
        # fp8 e4m3: max of bit patterns of small positive numbers orders like the numbers.
        f8 = comm.zeros(count, DType.F8E4M3)
        bits = (values(r, 1, count, np.uint8) % 16 + 0x30).astype(np.uint8)  # 0.5 … < 1
        f8.buffer.copy_from(0, bits.tobytes())
        comm.all_reduce(f8, "max")
        got8 = np.frombuffer(f8.buffer.copy_to(0, count), np.uint8)
        want8 = np.maximum.reduce(
            [(values(q, 1, count, np.uint8) % 16 + 0x30).astype(np.uint8) for q in range(n)]
        )
        check(got8, want8, "fp8 e4m3 all_reduce max", failures)
        return failures

    no_failures(world(n, rank))


def test_calls_on_a_stream() -> None:
    """With a stream, calls are queued and return at once; the stream's synchronize waits."""
    n = 2

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        s = comm.stream()
        xs = [values(r, k, 500, np.float64) for k in range(4)]
        for x in xs:
            comm.all_reduce(x, stream=s)
        comm.all_reduce(xs[0], stream=s.handle)  # a raw handle works the same
        s.synchronize()
        comm.check()
        for k, x in enumerate(xs):
            want = reduce_ref([values(q, k, 500, np.float64) for q in range(n)], "sum")
            if k == 0:
                want = want * n
            check(x, want, f"queued all_reduce {k}", failures)
        return failures

    no_failures(world(n, rank))


def test_marker_survives_outside_outputs() -> None:
    """A call writes its output and nothing around it."""

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, failures = comm.rank, list[str]()
        buf = marked(1000, np.float32)
        comm.all_reduce(values(r, 0, 800, np.float32), output=buf[100:900])
        check(buf[:100], marked(100, np.float32), "before the output", failures)
        check(buf[900:], marked(100, np.float32), "after the output", failures)
        check(buf[100:900], reduce_ref([values(q, 0, 800, np.float32) for q in range(2)], "sum"),
              "the output", failures)
        return failures

    no_failures(world(2, rank))
