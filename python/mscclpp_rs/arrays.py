"""Arrays: what the calls accept, and ``DeviceArray``, memory the library allocates.

The calls take any of:

- a PyTorch tensor (CUDA tensors on the CUDA backend; CPU tensors on the CPU backend);
- a CuPy array, or anything with ``__cuda_array_interface__`` (Numba, …);
- anything with DLPack (``__dlpack__`` and ``__dlpack_device__``);
- a NumPy array (the CPU backend only);
- a ``DeviceArray``.

Each must be C-contiguous; outputs must be writable. Nothing is copied: the call uses the
array's own memory. ``resolve`` turns an argument into a ``BufferInfo`` (address, bytes, element
type, device, and the framework's current stream for CUDA data).

**NumPy and the CPU backend.** The CPU backend's device memory is ordinary memory of the
process: a ``memfd`` mapped shared, so peers in other processes can map it too. Collectives
also work on plain host memory there (a NumPy array), but only the library's memory can be
registered or reached by a peer's kernel directly (the zero-copy paths): allocate it as a
``DeviceArray`` (``comm.zeros(shape, dtype)``), whose ``numpy()`` is a view of the same bytes
on the CPU backend (no copy; a host copy on CUDA):

>>> import numpy as np
>>> from mscclpp_rs import run_ranks
>>> def rank(comm):
...     x = comm.zeros(4, np.float32)
...     x.numpy()[:] = comm.rank + 1          # writes the library's memory in place
...     comm.all_reduce(x)
...     return x.to_numpy().tolist()
>>> run_ranks(2, rank)
[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

from . import _native
from .dtypes import DType, dtype_of, from_dlpack_code, from_typestr, numpy_dtype
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BufferInfo", "DeviceArray", "resolve"]

Shape = Union[int, Sequence[int]]


@dataclass(frozen=True)
class BufferInfo:
    """Where an array's elements are, as a call sees them."""

    ptr: int
    """Address of the first element (a device address; a host one for CPU memory)."""
    nbytes: int
    dtype: DType
    device: str
    """``"cpu"`` (host memory, or the CPU backend's) or ``"cuda"``."""
    device_id: int
    readonly: bool
    stream: Optional[int]
    """The framework's current stream for CUDA data (PyTorch, CuPy), else ``None``."""
    owner: Any
    """The array itself (kept referenced while a call uses it)."""

    @property
    def count(self) -> int:
        """Elements."""
        return self.nbytes // self.dtype.size


def _shape_tuple(shape: Shape) -> Tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"shape {dims} has a negative dimension")
    return dims


class DeviceArray:
    """An array in memory the library allocated on a communicator's device.

    Make one with ``Communicator.zeros`` / ``empty`` / ``from_numpy``. On the CPU backend
    ``numpy()`` is a view of its bytes (no copy); on CUDA it is a PyTorch/CuPy-ready device
    array (``__cuda_array_interface__``) and ``to_numpy()`` / ``copy_from()`` copy.
    """

    def __init__(self, buffer: _native.Buffer, shape: Shape, dtype: Any) -> None:
        self._buffer = buffer
        self.shape = _shape_tuple(shape)
        self.dtype = dtype_of(dtype)
        need = math.prod(self.shape) * self.dtype.size
        if need > buffer.nbytes:
            raise InvalidArgumentError(
                f"shape {self.shape} of {self.dtype.name} needs {need} bytes; "
                f"the buffer has {buffer.nbytes}"
            )

    @property
    def buffer(self) -> _native.Buffer:
        """The memory."""
        return self._buffer

    @property
    def ptr(self) -> int:
        """Device address of the first element."""
        return self._buffer.ptr

    @property
    def size(self) -> int:
        """Elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
        return self.size * self.dtype.size

    @property
    def backend(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self._buffer.backend

    def _interface(self) -> dict[str, Any]:
        return {
            "data": (self.ptr, False),
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """Its bytes as host memory (the CPU backend only): NumPy's zero-copy protocol."""
        if self.backend != "cpu":
            raise AttributeError("__array_interface__: a CUDA DeviceArray is device memory")
        return self._interface()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Its elements as CUDA device memory (the CUDA backend only)."""
        if self.backend != "cuda":
            raise AttributeError("__cuda_array_interface__: not device memory of a GPU")
        iface = self._interface()
        iface["shape"] = self.shape
        # bfloat16 and fp8 have no array-interface letter: raw elements of their size.
        named = self.dtype not in (DType.BF16, DType.F8E4M3, DType.F8E5M2)
        iface["typestr"] = numpy_typestr(self.dtype) if named else f"|V{self.dtype.size}"
        iface["stream"] = None
        return iface

    def numpy(self) -> np.ndarray:
        """A NumPy view of the elements (CPU backend: the same memory; CUDA: refused, use
        ``to_numpy``). The view keeps the memory alive."""
        import numpy as np

        if self.backend != "cpu":
            raise InvalidArgumentError(
                "a CUDA DeviceArray has no NumPy view; to_numpy() copies it to the host"
            )
        raw: np.ndarray = np.asarray(self)
        view: np.ndarray = raw.view(numpy_dtype(self.dtype)).reshape(self.shape)
        return view

    def to_numpy(self) -> np.ndarray:
        """A host copy of the elements."""
        import numpy as np

        data = self._buffer.copy_to(0, self.nbytes)
        view: np.ndarray = np.frombuffer(data, dtype=numpy_dtype(self.dtype)).reshape(self.shape)
        out: np.ndarray = view.copy()
        return out

    def copy_from(self, data: Any) -> None:
        """Overwrites the elements with ``data`` (a NumPy array or anything ``numpy.asarray``
        takes, of as many elements; converted to this array's type)."""
        import numpy as np

        src = np.ascontiguousarray(np.asarray(data), dtype=numpy_dtype(self.dtype))
        if src.size != self.size:
            raise InvalidArgumentError(
                f"copy_from: {src.size} elements given, the array holds {self.size}"
            )
        self._buffer.copy_from(0, src.tobytes())

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype.numpy_name}, {self.backend})"


def numpy_typestr(d: DType) -> str:
    """The array-interface type string of a type NumPy has (``"<f4"``)."""
    for key, value in (
        ("<f4", DType.F32),
        ("<f2", DType.F16),
        ("<i4", DType.I32),
        ("<u4", DType.U32),
        ("|i1", DType.I8),
        ("|u1", DType.U8),
        ("<i8", DType.I64),
        ("<u8", DType.U64),
        ("<f8", DType.F64),
    ):
        if value == d:
            return key
    raise InvalidArgumentError(f"{d.numpy_name} has no array-interface type string")


def _c_contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], itemsize: int) -> bool:
    """Whether `strides` (bytes; None: C order) describe a C-contiguous array of `shape`."""
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(list(shape)), reversed(list(strides))):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _from_torch(t: Any, dtype: Optional[DType]) -> BufferInfo:
    if not t.is_contiguous():
        raise InvalidArgumentError("the tensor is not contiguous (call .contiguous() first)")
    d = dtype if dtype is not None else dtype_of(t.dtype)  # (DType.F32 is 0: falsy)
    device = t.device.type
    stream = None
    if device == "cuda":
        import torch

        stream = int(torch.cuda.current_stream(t.device).cuda_stream)
    elif device != "cpu":
        raise InvalidArgumentError(f"tensors on {device!r} are not served (cpu or cuda)")
    return BufferInfo(
        ptr=int(t.data_ptr()),
        nbytes=t.numel() * t.element_size(),
        dtype=d,
        device=device,
        device_id=t.device.index or 0,
        readonly=False,
        stream=stream,
        owner=t,
    )


def _interface_dtype(obj: Any, typestr: str) -> DType:
    """The type of an array-interface array: its own ``dtype`` when it has one the library
    takes (NumPy's, with ml_dtypes' bfloat16 and fp8), else its type string's."""
    own = getattr(obj, "dtype", None)  # (a NumPy dtype is falsy: compare with None)
    if own is not None:
        try:
            return dtype_of(own)
        except InvalidArgumentError:
            pass
    return from_typestr(typestr)


def _from_interface(
    obj: Any, iface: Any, dtype: Optional[DType], device: str, device_id: int,
    stream: Optional[int],
) -> BufferInfo:
    """An ``__array_interface__`` or ``__cuda_array_interface__`` dictionary (version 3)."""
    shape = tuple(iface["shape"])
    typestr = iface["typestr"]
    itemsize = int(typestr[2:])  # "<f4", "|V2": the element's bytes after the kind letter
    d = dtype if dtype is not None else _interface_dtype(obj, typestr)
    if not _c_contiguous(shape, iface.get("strides"), itemsize):
        raise InvalidArgumentError("the array is not C-contiguous (make a contiguous copy)")
    ptr, readonly = iface["data"]
    return BufferInfo(
        ptr=int(ptr or 0),
        nbytes=math.prod(shape) * itemsize,
        dtype=d,
        device=device,
        device_id=device_id,
        readonly=bool(readonly),
        stream=stream,
        owner=obj,
    )


def _from_cai(obj: Any, dtype: Optional[DType]) -> BufferInfo:
    iface = obj.__cuda_array_interface__
    stream = None
    if type(obj).__module__.split(".")[0] == "cupy":
        import cupy

        stream = int(cupy.cuda.get_current_stream().ptr)
    elif isinstance(iface.get("stream"), int):
        stream = int(iface["stream"])
    dev = getattr(obj, "device", None)
    device_id = int(dev.id) if dev is not None and hasattr(dev, "id") else 0
    return _from_interface(obj, iface, dtype, "cuda", device_id, stream)


def _from_array_interface(obj: Any, dtype: Optional[DType]) -> BufferInfo:
    return _from_interface(obj, obj.__array_interface__, dtype, "cpu", 0, None)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLPack device types (dlpack.h, DLDeviceType).
_DL_CPU, _DL_CUDA = 1, 2


def _from_dlpack(obj: Any, dtype: Optional[DType], stream: Optional[int]) -> BufferInfo:
    """Reads a legacy ``dltensor`` capsule without consuming it: the capsule's destructor
    releases the producer's view when it goes; the memory stays the array's."""
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) == _DL_CPU:
        import numpy as np

        return _from_array_interface(np.from_dlpack(obj), dtype)
    if int(dev_type) != _DL_CUDA:
        raise InvalidArgumentError(
            f"DLPack device type {int(dev_type)} is not served (CPU or CUDA memory)"
        )
    capsule = obj.__dlpack__(stream=stream)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    addr = get(capsule, b"dltensor")
    t = _DLTensor.from_address(addr)
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None
    d = dtype if dtype is not None else from_dlpack_code(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    if strides is not None and not _c_contiguous(shape, [s * itemsize for s in strides], itemsize):
        raise InvalidArgumentError("the DLPack tensor is not C-contiguous")
    return BufferInfo(
        ptr=int(t.data or 0) + int(t.byte_offset),
        nbytes=math.prod(shape) * itemsize,
        dtype=d,
        device="cuda",
        device_id=int(dev_id),
        readonly=False,
        stream=stream,
        owner=(obj, capsule),
    )


def resolve(obj: Any, dtype: Any = None, stream: Optional[int] = None) -> BufferInfo:
    """Where ``obj``'s elements are (module docs for what it may be). ``dtype`` overrides the
    element type (for raw bytes, or types a framework cannot name); ``stream`` is passed to a
    DLPack producer."""
    d = None if dtype is None else dtype_of(dtype)
    if isinstance(obj, DeviceArray):
        return BufferInfo(
            ptr=obj.ptr,
            nbytes=obj.nbytes,
            dtype=d if d is not None else obj.dtype,
            device=obj.backend,
            device_id=obj.buffer.device,
            readonly=False,
            stream=None,
            owner=obj,
        )
    if type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr"):
        return _from_torch(obj, d)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, d)
    if hasattr(obj, "__array_interface__"):
        return _from_array_interface(obj, d)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, d, stream)
    raise InvalidArgumentError(
        f"{type(obj).__name__} is not an array the library takes (a PyTorch tensor, a CuPy "
        "array, anything with DLPack or __cuda_array_interface__, a NumPy array on the CPU "
        "backend, or a DeviceArray)"
    )
