"""mscclpp_rs: mscclpp-rs from Python.

GPU-driven communication (MSCCL++'s model, in Rust): communicators, every NCCL collective and
point-to-point call with groups and splits, on PyTorch tensors, CuPy arrays, anything with
DLPack or ``__cuda_array_interface__``, and NumPy arrays on the CPU backend; registered buffers
and windows; channel device handles for your own kernels. Without a GPU everything runs on the
CPU backend (the same kernels on threads), as here:

>>> import numpy as np
>>> import mscclpp_rs
>>> def rank(comm):
...     data = np.full(8, comm.rank + 1, dtype=np.int32)
...     comm.all_reduce(data, mscclpp_rs.ReduceOp.MAX)
...     return int(data[0])
>>> mscclpp_rs.run_ranks(4, rank)
[4, 4, 4, 4]

The package is named ``mscclpp_rs`` (MSCCL++'s own Python package is ``mscclpp``; both can be
installed side by side). Modules: ``comm`` (``Communicator``, ``Group``), ``arrays``
(``DeviceArray``, what calls accept), ``ops`` (reductions), ``dtypes``, ``errors``,
``channels`` and ``handles`` (your own kernels), ``kernels`` (headers for them), ``threads``
(``run_ranks``).
"""

from __future__ import annotations

from . import _native
from .arrays import BufferInfo, DeviceArray, resolve
from .comm import Communicator, Group, Registration, Stream, Topology, UniqueId
from .dtypes import DType, dtype_of
from .errors import (
    AbortedError,
    BootstrapError,
    CommTimeoutError,
    CountMismatchError,
    DeviceError,
    InvalidArgumentError,
    InvalidUsageError,
    MscclppError,
    RemoteError,
    UnsupportedError,
)
from .ops import PreMulSum, ReduceOp
from .threads import run_ranks

__version__: str = _native.VERSION

__all__ = [
    "AbortedError",
    "BootstrapError",
    "BufferInfo",
    "CommTimeoutError",
    "Communicator",
    "CountMismatchError",
    "DType",
    "DeviceArray",
    "DeviceError",
    "Group",
    "InvalidArgumentError",
    "InvalidUsageError",
    "MscclppError",
    "PreMulSum",
    "ReduceOp",
    "Registration",
    "RemoteError",
    "Stream",
    "Topology",
    "UniqueId",
    "UnsupportedError",
    "device_count",
    "dtype_of",
    "resolve",
    "run_ranks",
]


def device_count(backend: str | None = None) -> int:
    """Devices of ``backend`` (``"cpu"``, ``"cuda"``; ``None``: ``MSCCLPP_BACKEND``, else CUDA
    when a GPU is present, else the CPU backend, whose count is ``MSCCLPP_CPU_DEVICES``, 8)."""
    return _native.device_count(backend)
