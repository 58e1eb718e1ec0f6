"""Your own CUDA kernel over mscclpp-rs channels, from Python: a CuPy ``RawModule`` ping-pong.

Two ranks run as threads of this process on ONE GPU (the several-ranks-per-GPU mode,
``MSCCLPP_RANKS_PER_GPU=2``). Each rank allocates a buffer, trades it with the other, and
builds two channels to it:

- a MemoryChannel: the kernel's threads store straight into the peer's buffer
  (``mscclpp::memory_put``) and signal its semaphore (``memory_signal`` / ``memory_wait``);
- a PortChannel: one GPU thread pushes triggers into a FIFO (``port_put_with_signal``), and this
  rank's proxy thread (``PortChannelService``) moves the data and signals the peer.

The handles are the ``bytes`` the library returns (``MemoryChannel.handle()``,
``PortChannelService.port_channel()``), copied into device memory; the kernels take a pointer
to them and use the device API of ``<mscclpp/device.cuh>``, compiled by NVRTC through CuPy with
the headers ``mscclpp_rs.kernels.cuda_include_dirs(nvrtc=True)`` writes out.

Rank 0 starts with words 0, 1, 2, …; in every round it sends its buffer, rank 1 adds one to
every word and sends it back. After ``ROUNDS`` rounds both buffers hold ``i + ROUNDS``: checked.

Needs a GPU and CuPy (``pip install cupy-cuda12x``); prints NOT RUN and exits 0 otherwise::

    python python/examples/cupy_ping_pong.py
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, List

import numpy as np

WORDS = 4096
ROUNDS = 50
THREADS = 256
TIMEOUT_S = 60.0

KERNELS = r"""
#include <mscclpp/device.cuh>

// Thread 0 waits for the peer's token; the block learns whether it came.
__device__ __forceinline__ bool block_wait(const MemoryChannelDeviceHandle& ch) {
  __shared__ unsigned int ok;
  if (threadIdx.x == 0) {
    ok = mscclpp::memory_wait(ch) == MSCCLPP_DEVICE_ERROR_NONE ? 1u : 0u;
  }
  __syncthreads();
  const bool result = ok != 0u;
  __syncthreads();
  return result;
}

// Every thread copies its share into the peer's buffer; after the barrier, thread 0 signals.
__device__ __forceinline__ void block_send(const MemoryChannelDeviceHandle& ch,
                                           unsigned long long bytes) {
  mscclpp::memory_put(ch, 0, 0, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    mscclpp::memory_signal(ch);
  }
}

extern "C" __global__ void memory_ping_pong(const MemoryChannelDeviceHandle* handle,
                                            unsigned int* buf, unsigned long long words,
                                            unsigned int rounds, unsigned int rank) {
  const MemoryChannelDeviceHandle ch = *handle;
  for (unsigned int r = 0; r < rounds; ++r) {
    if (rank == 0) {
      block_send(ch, words * 4);
      if (!block_wait(ch)) return;
    } else {
      if (!block_wait(ch)) return;
      for (unsigned long long i = threadIdx.x; i < words; i += blockDim.x) buf[i] += 1u;
      __syncthreads();
      block_send(ch, words * 4);
    }
  }
}

// One thread: the proxy moves the data (launch 1 block of 1 thread).
extern "C" __global__ void port_ping_pong(const PortChannelDeviceHandle* handle,
                                          unsigned int* buf, unsigned long long words,
                                          unsigned int rounds, unsigned int rank) {
  const PortChannelDeviceHandle ch = *handle;
  for (unsigned int r = 0; r < rounds; ++r) {
    if (rank != 0) {
      if (mscclpp::port_wait(ch) != MSCCLPP_DEVICE_ERROR_NONE) return;
      for (unsigned long long i = 0; i < words; ++i) buf[i] += 1u;
    }
    if (mscclpp::port_put_with_signal(ch, 0, 0, words * 4) != MSCCLPP_DEVICE_ERROR_NONE) return;
    if (rank == 0 && mscclpp::port_wait(ch) != MSCCLPP_DEVICE_ERROR_NONE) return;
  }
  (void)mscclpp::port_flush(ch);
}
"""


def not_run(why: str) -> None:
    print(f"NOT RUN: {why}")
    sys.exit(0)


def wait_stream(stream: Any, comm: Any, what: str) -> None:
    """Polls the stream (bounded, and without holding the GIL for long: the other rank is a
    thread of this process), then reports a device wait that gave up."""
    deadline = time.monotonic() + TIMEOUT_S
    while not stream.done:
        if time.monotonic() > deadline:
            comm.abort()  # releases every device wait of this rank's channels
            raise TimeoutError(f"rank {comm.rank}: {what} did not finish in {TIMEOUT_S} s")
        time.sleep(0.001)
    comm.check()


def rank_main(comm: Any) -> List[str]:
    import cupy

    from mscclpp_rs.channels import MemoryChannel
    from mscclpp_rs.kernels import cuda_include_dirs

    rank, peer = comm.rank, 1 - comm.rank
    cupy.cuda.Device(comm.device).use()
    module = cupy.RawModule(
        code=KERNELS,
        options=("-std=c++17", *(f"-I{d}" for d in cuda_include_dirs(nvrtc=True))),
    )
    memory_kernel = module.get_function("memory_ping_pong")
    port_kernel = module.get_function("port_ping_pong")
    stream = cupy.cuda.Stream(non_blocking=True)
    report = []

    for name in ("memory", "port"):
        buf = comm.zeros(WORDS, np.uint32)  # library memory: exportable, registrable
        initial = np.arange(WORDS, dtype=np.uint32)
        if rank == 0:
            buf.copy_from(initial)
        comm.send_memory(comm.register_memory(buf), peer)
        theirs = comm.recv_memory(peer)
        conn = comm.connect(peer)
        view = cupy.asarray(buf)  # the same device memory (__cuda_array_interface__)
        service = channel = None  # both kept until the kernel is done: the handle points in
        if name == "memory":
            channel = MemoryChannel(conn, theirs, buf.buffer)
            handle = channel.handle()
            kernel, grid, block = memory_kernel, (1,), (THREADS,)
        else:
            service = comm.port_channel_service()
            sem = service.add_semaphore(conn)
            dst = service.add_memory(theirs)
            src = service.add_memory(comm.register_memory(buf))
            handle = service.port_channel(sem, dst, src)
            service.start()
            kernel, grid, block = port_kernel, (1,), (1,)
        device_handle = cupy.asarray(np.frombuffer(handle, dtype=np.uint8))
        comm.barrier()
        started = time.perf_counter()
        with stream:
            kernel(grid, block, (device_handle, view, np.uint64(WORDS), np.uint32(ROUNDS),
                                 np.uint32(rank)))
        wait_stream(stream, comm, f"the {name} kernel")
        elapsed = time.perf_counter() - started
        got = buf.to_numpy()
        want = initial + ROUNDS
        if not np.array_equal(got, want):
            bad = int(np.argmax(got != want))
            raise AssertionError(
                f"rank {rank}, {name} channel: word {bad} is {got[bad]}, expected {want[bad]}"
            )
        comm.barrier()  # the peer's kernel and proxy are done with our buffer
        if service is not None:
            service.stop()
        del channel
        report.append(
            f"rank {rank}: {name} channel, {ROUNDS} round trips of {WORDS * 4} bytes, "
            f"{elapsed * 1e6 / ROUNDS:.1f} us each, data ok"
        )
    return report


def main() -> None:
    try:
        import cupy
    except ImportError:
        not_run("CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for CUDA 12)")
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        not_run(f"no CUDA device ({e})")
    if gpus < 1:
        not_run("no CUDA device")
    os.environ.setdefault("MSCCLPP_RANKS_PER_GPU", "2")
    from mscclpp_rs import run_ranks

    reports = run_ranks(2, rank_main, backend="cuda", devices=[0, 0], collectives=False)
    for lines in reports:
        for line in lines:
            print(line)


if __name__ == "__main__":
    main()
