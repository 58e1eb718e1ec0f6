"""What the calls accept: NumPy arrays, DLPack producers, anything shaped like a PyTorch tensor or
a ``__cuda_array_interface__`` array, ``DeviceArray``; element types by every framework's name."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

import mscclpp_rs
from helpers import check, no_failures, reduce_ref, values, world
from mscclpp_rs.arrays import resolve
from mscclpp_rs.dtypes import DType, dtype_of, from_dlpack_code, from_typestr


class _Device:
    def __init__(self, kind: str) -> None:
        self.type, self.index = kind, None


class TorchLike:
    """The parts of a ``torch.Tensor`` the package reads, over a NumPy array (its module says
    ``torch``, which is how the package recognises a tensor)."""

    __module__ = "torch"

    def __init__(self, a: np.ndarray, contiguous: bool = True) -> None:
        self.a, self.contiguous = a, contiguous
        self.dtype = f"torch.{a.dtype.name}"
        self.device = _Device("cpu")

    def data_ptr(self) -> int:
        return int(self.a.ctypes.data)

    def is_contiguous(self) -> bool:
        return self.contiguous

    def numel(self) -> int:
        return int(self.a.size)

    def element_size(self) -> int:
        return int(self.a.itemsize)


def test_element_types() -> None:
    assert dtype_of("float32") == dtype_of(np.float32) == dtype_of(np.dtype("f4")) == DType.F32
    assert dtype_of("torch.bfloat16") == DType.BF16 and dtype_of("half") == DType.F16
    assert dtype_of(DType.U64) == DType.U64 and dtype_of(8) == DType.U64
    assert from_typestr("<i8") == DType.I64 and from_typestr("|u1") == DType.U8
    assert from_dlpack_code(4, 16, 1) == DType.BF16 and from_dlpack_code(10, 8, 1) == DType.F8E4M3
    assert [d.size for d in DType] == [4, 2, 2, 4, 4, 1, 1, 8, 8, 8, 1, 1]
    for bad in ("complex64", 12, True):
        with pytest.raises(mscclpp_rs.InvalidArgumentError):
            dtype_of(bad)
    with pytest.raises(mscclpp_rs.InvalidArgumentError):
        from_typestr(">f4")  # big-endian


def test_resolve() -> None:
    a = np.arange(10, dtype=np.int16)
    with pytest.raises(mscclpp_rs.InvalidArgumentError):
        resolve(a)  # int16 is not one of NCCL's types
    b = np.arange(10, dtype=np.uint32)
    info = resolve(b)
    assert (info.ptr, info.nbytes, info.dtype, info.device, info.count) == (
        b.ctypes.data, 40, DType.U32, "cpu", 10)
    assert resolve(b, dtype="float32").dtype == DType.F32  # an explicit type wins
    d = resolve(np.arange(6, dtype=np.float64))  # DLPack's CPU path goes through NumPy too
    assert d.dtype == DType.F64
    t = TorchLike(np.arange(5, dtype=np.float32))
    ti = resolve(t)
    assert (ti.ptr, ti.count, ti.dtype, ti.stream) == (t.data_ptr(), 5, DType.F32, None)
    with pytest.raises(mscclpp_rs.InvalidArgumentError, match="contiguous"):
        resolve(TorchLike(np.arange(5, dtype=np.float32), contiguous=False))

    class Dl:
        """A DLPack producer (its CPU data, through NumPy's own DLPack)."""

        def __init__(self, a: np.ndarray) -> None:
            self.a = a

        def __dlpack__(self, stream: Any = None) -> Any:
            return self.a.__dlpack__()

        def __dlpack_device__(self) -> Any:
            return self.a.__dlpack_device__()

    src = np.arange(7, dtype=np.int8)
    di = resolve(Dl(src))
    assert (di.ptr, di.count, di.dtype) == (src.ctypes.data, 7, DType.I8)


def test_dlpack_and_torch_like_inputs_in_calls() -> None:
    n = 2

    def rank(comm: mscclpp_rs.Communicator) -> List[str]:
        r, f = comm.rank, list[str]()
        t = TorchLike(values(r, 0, 300, np.float32))
        comm.all_reduce(t)
        check(t.a, reduce_ref([values(q, 0, 300, np.float32) for q in range(n)], "sum"),
              "a tensor-like input", f)
        return f

    no_failures(world(n, rank))
