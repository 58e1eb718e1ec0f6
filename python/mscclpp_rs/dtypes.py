"""Element types: the library's twelve (NCCL's), and how NumPy, PyTorch, CuPy and DLPack name them.

``DType`` numbers are the library's (``MSCCLPP_DTYPE_*`` in ``layout.h``). ``dtype_of`` accepts
a ``DType``, its number, a name (``"float32"``, ``"bf16"``), a NumPy dtype or a PyTorch dtype:

>>> from mscclpp_rs.dtypes import DType, dtype_of
>>> dtype_of("float16"), dtype_of("bfloat16").size
(<DType.F16: 1>, 2)
>>> import numpy as np
>>> dtype_of(np.dtype(np.int64)), dtype_of(np.float32)
(<DType.I64: 7>, <DType.F32: 0>)
"""

from __future__ import annotations

import enum
from typing import Any, Optional

from .errors import InvalidArgumentError

__all__ = ["DType", "dtype_of", "from_typestr", "from_dlpack_code", "numpy_dtype"]


class DType(enum.IntEnum):
    """One of the library's element types (NCCL's twelve)."""

    F32 = 0
    F16 = 1
    BF16 = 2
    I32 = 3
    U32 = 4
    I8 = 5
    U8 = 6
    I64 = 7
    U64 = 8
    F64 = 9
    F8E4M3 = 10
    F8E5M2 = 11

    @property
    def size(self) -> int:
        """Bytes per element."""
        return _SIZES[self]

    @property
    def numpy_name(self) -> str:
        """The NumPy (or ``ml_dtypes``) name of the type."""
        return _NUMPY_NAMES[self]


_SIZES = {
    DType.F32: 4,
    DType.F16: 2,
    DType.BF16: 2,
    DType.I32: 4,
    DType.U32: 4,
    DType.I8: 1,
    DType.U8: 1,
    DType.I64: 8,
    DType.U64: 8,
    DType.F64: 8,
    DType.F8E4M3: 1,
    DType.F8E5M2: 1,
}

_NUMPY_NAMES = {
    DType.F32: "float32",
    DType.F16: "float16",
    DType.BF16: "bfloat16",
    DType.I32: "int32",
    DType.U32: "uint32",
    DType.I8: "int8",
    DType.U8: "uint8",
    DType.I64: "int64",
    DType.U64: "uint64",
    DType.F64: "float64",
    DType.F8E4M3: "float8_e4m3fn",
    DType.F8E5M2: "float8_e5m2",
}

# Every spelling a framework uses (NumPy and ml_dtypes names, PyTorch's after "torch.").
_BY_NAME = {
    **{name: d for d, name in _NUMPY_NAMES.items()},
    **{d.name.lower(): d for d in DType},
    "float": DType.F32,
    "half": DType.F16,
    "double": DType.F64,
    "int": DType.I32,
    "long": DType.I64,
    "bf16": DType.BF16,
    "fp8_e4m3": DType.F8E4M3,
    "fp8_e5m2": DType.F8E5M2,
    "float8_e4m3": DType.F8E4M3,
}

# __array_interface__ / __cuda_array_interface__ type strings (little-endian or no order).
_BY_TYPESTR = {
    "f4": DType.F32,
    "f2": DType.F16,
    "i4": DType.I32,
    "u4": DType.U32,
    "i1": DType.I8,
    "u1": DType.U8,
    "i8": DType.I64,
    "u8": DType.U64,
    "f8": DType.F64,
}

# DLPack (dlpack.h, DLDataTypeCode, version 1.1): (code, bits) -> type.
_BY_DLPACK = {
    (0, 8): DType.I8,
    (0, 32): DType.I32,
    (0, 64): DType.I64,
    (1, 8): DType.U8,
    (1, 32): DType.U32,
    (1, 64): DType.U64,
    (2, 16): DType.F16,
    (2, 32): DType.F32,
    (2, 64): DType.F64,
    (4, 16): DType.BF16,
    (10, 8): DType.F8E4M3,  # kDLFloat8_e4m3fn
    (12, 8): DType.F8E5M2,  # kDLFloat8_e5m2
}


def dtype_of(x: Any) -> DType:
    """The ``DType`` that ``x`` names: a ``DType``, its number, a name, or a NumPy/PyTorch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return DType(x)
        except ValueError:
            raise InvalidArgumentError(f"{x} is not a data type number (0 to 11)") from None
    name: Optional[str] = None
    if isinstance(x, str):
        name = x
    elif isinstance(x, type):  # numpy scalar types (np.float32)
        name = getattr(x, "__name__", None)
    else:
        # NumPy dtypes have .name; PyTorch dtypes print as "torch.float32".
        name = getattr(x, "name", None)
        if not isinstance(name, str):
            name = str(x)
    key = (name or "").lower()
    key = key[len("torch.") :] if key.startswith("torch.") else key
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise InvalidArgumentError(
        f"{x!r} is not one of the library's element types "
        "(float32, float16, bfloat16, float64, int8, uint8, int32, uint32, int64, uint64, "
        "float8_e4m3fn, float8_e5m2)"
    )


def from_typestr(typestr: str) -> DType:
    """The type of an array-interface type string (``"<f4"``, ``"|u1"``)."""
    if len(typestr) == 3 and typestr[0] in "<|=" and typestr[1:] in _BY_TYPESTR:
        return _BY_TYPESTR[typestr[1:]]
    raise InvalidArgumentError(
        f"array interface type {typestr!r} is not a little-endian type the library takes"
        " (pass dtype= for bfloat16 and fp8 data)"
    )


def from_dlpack_code(code: int, bits: int, lanes: int) -> DType:
    """The type of a DLPack ``DLDataType``."""
    if lanes == 1 and (code, bits) in _BY_DLPACK:
        return _BY_DLPACK[(code, bits)]
    raise InvalidArgumentError(
        f"DLPack type (code {code}, {bits} bits, {lanes} lanes) is not one the library takes"
    )


def numpy_dtype(d: DType) -> Any:
    """The NumPy dtype of ``d`` (``ml_dtypes`` provides bfloat16 and fp8, when installed)."""
    import numpy as np

    try:
        return np.dtype(d.numpy_name)
    except TypeError:
        pass
    try:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, d.numpy_name))
    except (ImportError, AttributeError):
        raise InvalidArgumentError(
            f"NumPy has no {d.numpy_name} type without the ml_dtypes package"
        ) from None
