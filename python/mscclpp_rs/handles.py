"""Device handles as bytes, and their layouts as ``layout.h`` writes them down.

``MemoryChannel.handle()``, ``MemorySemaphore.handle()`` and ``PortChannelService.port_channel()``
return the C structs of ``shared/include/mscclpp/layout.h`` as ``bytes`` (little-endian, every
pointer a 64-bit device address, 0 for null). A kernel takes them by pointer (copy the bytes
into device memory) or by value, and drives them with the device API of
``mscclpp/device.cuh`` (``cuda_include_dirs()`` in ``mscclpp_rs.kernels``).

=============================================  =====  ===========================================
struct                                         bytes  fields (offset)
=============================================  =====  ===========================================
``MemoryDevice2DeviceSemaphoreDeviceHandle``   32     inbound 0, remote_inbound 8, expected 16,
                                                      status 24 (all addresses)
``Host2DeviceSemaphoreDeviceHandle``           24     inbound 0, expected 8, status 16
``FifoDeviceHandle``                           56     triggers 0, tail 8, head 16, tail_cache 24,
                                                      flush_done_pos 32, status 40, size 48 (u32),
                                                      log2_size 52 (u32)
``MemoryChannelDeviceHandle``                  56     semaphore 0 (the 32 above), dst 32 (the
                                                      peer's memory, mapped here), src 40,
                                                      packet_buffer 48
``PortChannelDeviceHandle``                    96     semaphore_id 0, dst 4, src 8, reserved 12
                                                      (u32 each), semaphore 16 (24 bytes), fifo 40
                                                      (56 bytes)
``DeviceStatus``                               32     abort 0 (u32), error_code 4 (u32),
                                                      error_detail 8, spin_limit 16, reserved 24
``ProxyTrigger``                               16     fst 0, snd 8 (aligned to 16)
=============================================  =====  ===========================================

``decode`` reads one into a dictionary (nested structs as nested dictionaries); ``encode``
writes one. These tables are checked against Rust's own (``mscclpp_shared::layout``, the
source of truth that ``layout.h`` is checked against too) by ``tests/test_handles.py``:

>>> from mscclpp_rs import handles
>>> h = handles.encode("MemoryChannelDeviceHandle", {"dst": 0x1000, "src": 0x2000,
...     "semaphore": {"inbound": 8, "status": 16}})
>>> len(h), handles.decode("MemoryChannelDeviceHandle", h)["dst"]
(56, 4096)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple, Union

from .errors import InvalidArgumentError

__all__ = ["LAYOUTS", "Layout", "decode", "encode"]


@dataclass(frozen=True)
class Layout:
    """One struct: its size, alignment and fields ``(name, offset, type)``, where the type is
    ``"u32"``, ``"u64"`` or the name of another struct of ``LAYOUTS``."""

    name: str
    size: int
    align: int
    fields: Tuple[Tuple[str, int, str], ...]


_SCALARS = {"u32": ("<I", 4), "u64": ("<Q", 8)}


def _layout(name: str, size: int, align: int, *fields: Tuple[str, int, str]) -> Layout:
    return Layout(name, size, align, tuple(fields))


LAYOUTS: Dict[str, Layout] = {
    lay.name: lay
    for lay in (
        _layout("ProxyTrigger", 16, 16, ("fst", 0, "u64"), ("snd", 8, "u64")),
        _layout(
            "DeviceStatus", 32, 8,
            ("abort", 0, "u32"), ("error_code", 4, "u32"), ("error_detail", 8, "u64"),
            ("spin_limit", 16, "u64"), ("reserved", 24, "u64"),
        ),
        _layout(
            "FifoDeviceHandle", 56, 8,
            ("triggers", 0, "u64"), ("tail", 8, "u64"), ("head", 16, "u64"),
            ("tail_cache", 24, "u64"), ("flush_done_pos", 32, "u64"), ("status", 40, "u64"),
            ("size", 48, "u32"), ("log2_size", 52, "u32"),
        ),
        _layout(
            "MemoryDevice2DeviceSemaphoreDeviceHandle", 32, 8,
            ("inbound", 0, "u64"), ("remote_inbound", 8, "u64"), ("expected", 16, "u64"),
            ("status", 24, "u64"),
        ),
        _layout(
            "Host2DeviceSemaphoreDeviceHandle", 24, 8,
            ("inbound", 0, "u64"), ("expected", 8, "u64"), ("status", 16, "u64"),
        ),
        _layout(
            "PortChannelDeviceHandle", 96, 8,
            ("semaphore_id", 0, "u32"), ("dst", 4, "u32"), ("src", 8, "u32"),
            ("reserved", 12, "u32"), ("semaphore", 16, "Host2DeviceSemaphoreDeviceHandle"),
            ("fifo", 40, "FifoDeviceHandle"),
        ),
        _layout(
            "MemoryChannelDeviceHandle", 56, 8,
            ("semaphore", 0, "MemoryDevice2DeviceSemaphoreDeviceHandle"), ("dst", 32, "u64"),
            ("src", 40, "u64"), ("packet_buffer", 48, "u64"),
        ),
    )
}

Value = Union[int, Dict[str, Any]]


def field_size(kind: str) -> int:
    """Bytes of a field type (``"u32"``, ``"u64"`` or a struct's name)."""
    if kind in _SCALARS:
        return _SCALARS[kind][1]
    return LAYOUTS[kind].size


def _layout_of(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"{name!r} is not a handle layout (one of {', '.join(LAYOUTS)})"
        ) from None


def decode(name: str, data: bytes, offset: int = 0) -> Dict[str, Value]:
    """The fields of struct ``name`` stored in ``data`` at ``offset``."""
    lay = _layout_of(name)
    if len(data) - offset < lay.size:
        raise InvalidArgumentError(
            f"{name} needs {lay.size} bytes; {len(data) - offset} given"
        )
    out: Dict[str, Value] = {}
    for field, at, kind in lay.fields:
        if kind in _SCALARS:
            out[field] = struct.unpack_from(_SCALARS[kind][0], data, offset + at)[0]
        else:
            out[field] = decode(kind, data, offset + at)
    return out


def encode(name: str, values: Mapping[str, Any]) -> bytes:
    """Struct ``name`` with the given fields (missing ones are 0; nested structs as
    dictionaries)."""
    lay = _layout_of(name)
    known = {f for f, _, _ in lay.fields}
    unknown = set(values) - known
    if unknown:
        raise InvalidArgumentError(f"{name} has no field {sorted(unknown)}")
    out = bytearray(lay.size)
    for field, at, kind in lay.fields:
        v = values.get(field, 0)
        if kind in _SCALARS:
            struct.pack_into(_SCALARS[kind][0], out, at, int(v))
        else:
            out[at : at + LAYOUTS[kind].size] = encode(kind, v or {})
    return bytes(out)
