"""Device handles as bytes: the package's layout tables against Rust's, and the handles of real
channels on the CPU backend, whose device addresses are addresses of this process. There a
"kernel" written in Python (plain loads and stores through ctypes; x86 orders stores as they
are made) drives them exactly as ``device.cuh`` does: puts into the peer's memory through a
MemoryChannel handle and signals its semaphore; pushes triggers into a PortChannel's FIFO, which
the rank's proxy thread serves (copy, signal, flush)."""

from __future__ import annotations

import ctypes
import platform
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import mscclpp_rs
from helpers import check, no_failures, values, world
from mscclpp_rs import _native, handles
from mscclpp_rs.channels import MemoryChannel, MemorySemaphore
from mscclpp_rs.dtypes import DType


def test_layouts_match_rust() -> None:
    """Every struct the package describes has Rust's size, alignment and field offsets, and
    its fields tile it without overlapping."""
    rust = {name: (size, align, dict(fields)) for name, size, align, fields in _native.layouts()}
    for name, lay in handles.LAYOUTS.items():
        assert name in rust, f"{name} is not a Rust layout"
        size, align, offsets = rust[name]
        assert (lay.size, lay.align) == (size, align), name
        assert {f: at for f, at, _ in lay.fields} == offsets, name
        end = 0
        for field, at, kind in sorted(lay.fields, key=lambda f: f[1]):
            assert at >= end, f"{name}.{field} overlaps the field before it"
            end = at + handles.field_size(kind)
        assert end <= lay.size, name


def test_constants_match_rust() -> None:
    consts = dict(_native.constants())
    for d in DType:
        name = {"F8E4M3": "F8E4M3", "F8E5M2": "F8E5M2"}.get(d.name, d.name)
        assert consts[f"MSCCLPP_DTYPE_{name}"] == int(d), d
    assert (consts["MSCCLPP_TRIGGER_TYPE_SHIFT"], consts["MSCCLPP_TRIGGER_COMMIT_SHIFT"]) == (50, 63)
    headers = dict(_native.headers())
    assert "typedef struct MemoryChannelDeviceHandle" in headers["layout.h"]
    assert "memory_put" in headers["device.cuh"]


def test_encode_decode_round_trip() -> None:
    raw = bytes(range(96))
    decoded = handles.decode("PortChannelDeviceHandle", raw)
    assert handles.encode("PortChannelDeviceHandle", decoded) == raw
    assert decoded["fifo"]["size"] == int.from_bytes(raw[88:92], "little")  # type: ignore[index]
    with pytest.raises(mscclpp_rs.InvalidArgumentError):
        handles.decode("MemoryChannelDeviceHandle", b"\x00" * 55)
    with pytest.raises(mscclpp_rs.InvalidArgumentError):
        handles.encode("MemoryChannelDeviceHandle", {"nope": 1})


x86 = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"),
    reason="NOT RUN: the Python 'kernel' relies on x86's store order",
)


def u64(addr: int) -> Any:
    return ctypes.c_uint64.from_address(addr)


def wait_at_least(addr: int, value: int, what: str) -> None:
    deadline = time.monotonic() + 20
    while u64(addr).value < value:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {u64(addr).value} < {value}")
        time.sleep(0.0005)


@x86
def test_memory_channel_handle_drives_the_peer() -> None:
    n, words, rounds = 2, 1024, 3

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, peer, f = comm.rank, 1 - comm.rank, []
        buf = comm.zeros(words, np.uint32)
        comm.send_memory(comm.register_memory(buf), peer)
        theirs = comm.recv_memory(peer)
        conn = comm.connect(peer)
        ch = MemoryChannel(conn, theirs, buf.buffer)  # kept: the handle points into it
        h: Dict[str, Any] = handles.decode("MemoryChannelDeviceHandle", ch.handle())
        sem = h["semaphore"]
        if (h["src"], h["packet_buffer"], sem["status"]) != (buf.ptr, 0, comm.native.status_ptr):
            f.append(f"handle {h}")
        if h["dst"] != theirs.ptr:
            f.append(f"dst {h['dst']:#x} is not the peer's memory mapped here {theirs.ptr:#x}")
        # A separate semaphore has words of its own.
        other = handles.decode("MemoryDevice2DeviceSemaphoreDeviceHandle",
                               MemorySemaphore(conn, tag=5).handle())
        if other["inbound"] in (sem["inbound"], 0) or other["status"] != sem["status"]:
            f.append(f"second semaphore {other}")
        expected = 0
        for k in range(rounds):
            if r == k % 2:  # the sender of this round: put, then signal (device.cuh's order)
                data = values(r, k, words, np.uint32)
                ctypes.memmove(h["dst"], data.ctypes.data, data.nbytes)
                u64(sem["remote_inbound"]).value += 1  # the one writer of the peer's word
            else:  # the receiver: wait for the token, then read
                expected += 1
                u64(sem["expected"]).value = expected
                wait_at_least(sem["inbound"], expected, f"rank {r} round {k}")
                check(buf.numpy(), values(peer, k, words, np.uint32), f"round {k}", f)
            comm.barrier()
        return f

    no_failures(world(n, rank, collectives=False))


TRIGGER_DATA, TRIGGER_FLAG, TRIGGER_SYNC = 1, 2, 4


def push(fifo: Dict[str, Any], fst: int, snd: int) -> int:
    """The FIFO push of ``device.cuh`` (one pusher): take a position, wait for room, write the
    slot with its lap's commit bit last. Returns the position."""
    pos: int = u64(fifo["head"]).value
    u64(fifo["head"]).value = pos + 1
    n = fifo["size"]
    deadline = time.monotonic() + 20
    while pos >= n + u64(fifo["tail"]).value:
        if time.monotonic() > deadline:
            raise TimeoutError("no room in the FIFO")
        time.sleep(0.0005)
    commit = ((pos >> fifo["log2_size"]) & 1) ^ 1
    slot = fifo["triggers"] + 16 * (pos & (n - 1))
    u64(slot).value = fst
    u64(slot + 8).value = snd | (commit << 63)
    return pos


def trigger(ch: Dict[str, Any], kind: int, dst_off: int = 0, src_off: int = 0,
            size: int = 0) -> tuple[int, int]:
    fst = size | (src_off << 32)
    snd = (dst_off | (ch["src"] << 32) | (ch["dst"] << 41) | (kind << 50)
           | (ch["semaphore_id"] << 53))
    return fst, snd


@x86
def test_port_channel_handle_and_the_proxy() -> None:
    """Both ranks push put-with-signal triggers at once; each proxy copies into the peer's
    memory and signals it; a flush completes; the handle's fields are the service's."""
    words = 2048

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, peer, f = comm.rank, 1 - comm.rank, []
        buf = comm.zeros(words, np.uint32)
        buf.copy_from(values(r, 0, words, np.uint32))
        inbox = comm.zeros(words, np.uint32)
        comm.send_memory(comm.register_memory(inbox), peer)
        conn = comm.connect(peer)
        service = comm.port_channel_service(fifo_size=8)
        sem_id = service.add_semaphore(conn)
        dst = service.add_memory(comm.recv_memory(peer))
        src = service.add_memory(comm.register_memory(buf))
        h: Dict[str, Any] = handles.decode("PortChannelDeviceHandle",
                                           service.port_channel(sem_id, dst, src))
        fifo = h["fifo"]
        if (h["semaphore_id"], h["dst"], h["src"]) != (sem_id, dst, src):
            f.append(f"ids {h}")
        if (fifo["size"], fifo["log2_size"]) != (8, 3) or h["semaphore"]["status"] != comm.native.status_ptr:
            f.append(f"fifo {fifo}, semaphore {h['semaphore']}")
        service.start()
        comm.barrier()
        # 12 triggers through an 8-slot FIFO: the second lap's commit bit is used too.
        chunk = words * 4 // 12
        for i in range(12):
            kind = TRIGGER_DATA | (TRIGGER_FLAG if i == 11 else 0)
            rest = words * 4 - 11 * chunk if i == 11 else chunk
            push(fifo, *trigger(h, kind, i * chunk, i * chunk, rest))
        flush_at = push(fifo, *trigger(h, TRIGGER_SYNC))
        wait_at_least(fifo["flush_done_pos"], flush_at + 1, "flush")
        u64(h["semaphore"]["expected"]).value = 1
        wait_at_least(h["semaphore"]["inbound"], 1, "the peer proxy's signal")
        check(inbox.numpy(), values(peer, 0, words, np.uint32), "inbox", f)
        comm.barrier()
        if service.error() is not None:
            f.append(f"proxy error {service.error()}")
        service.stop()
        if service.running:
            f.append("still running after stop")
        return f

    no_failures(world(2, rank, collectives=False))
