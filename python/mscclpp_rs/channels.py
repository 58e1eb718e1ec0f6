"""Channels for your own kernels (MSCCL++'s connections, memories, semaphores and channels).

Both ranks of a pair make the same set-up calls in the same order, with the same tags (each
call sends this rank's half and waits for the peer's):

>>> import numpy as np
>>> from mscclpp_rs import run_ranks, handles
>>> from mscclpp_rs.channels import MemoryChannel
>>> def rank(comm):
...     peer = 1 - comm.rank
...     buf = comm.zeros(256, np.uint32)
...     comm.send_memory(comm.register_memory(buf), peer)
...     theirs = comm.recv_memory(peer)
...     conn = comm.connect(peer)
...     ch = MemoryChannel(conn, theirs, buf.buffer)
...     h = handles.decode("MemoryChannelDeviceHandle", ch.handle())
...     return h["src"] == buf.ptr, h["semaphore"]["status"] == comm.native.status_ptr
>>> run_ranks(2, rank, collectives=False)
[(True, True), (True, True)]

========================  ======================================================================
class                     what
========================  ======================================================================
``Connection``            a connection to a peer (``comm.connect``; ``transport``: ``None`` for
                          the same-node one)
``Memory``                a ``DeviceArray`` registered (``comm.register_memory``), sent
                          (``comm.send_memory``), or a peer's received (``comm.recv_memory``),
                          mapped here
``MemorySemaphore``       a GPU↔GPU semaphore; ``handle()`` is its 32 bytes
``MemoryChannel``         ``handle()``: ``MemoryChannelDeviceHandle`` (56 bytes)
``PortChannelService``    the proxy (``comm.port_channel_service()``): ``add_semaphore``,
                          ``add_memory``, ``port_channel`` (96-byte handles), ``start``, ``stop``
========================  ======================================================================

Tags are below 2^32, apart from the collectives' own set-up. A channel keeps what its handle
points at alive; kernels that use a handle must finish before the channel goes.
"""

from __future__ import annotations

from ._native import Connection, Memory, MemoryChannel, MemorySemaphore, PortChannelService

__all__ = ["Connection", "Memory", "MemoryChannel", "MemorySemaphore", "PortChannelService"]
