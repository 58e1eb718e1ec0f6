"""Reductions: by name, as an enum, or a pre-multiplied sum with its scalar.

>>> from mscclpp_rs import ReduceOp, PreMulSum
>>> from mscclpp_rs.ops import reduction
>>> reduction("sum"), reduction(ReduceOp.MAX), reduction(PreMulSum(0.5))
(('sum', None), ('max', None), ('premul_sum', 0.5))
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from .errors import InvalidArgumentError

__all__ = ["PreMulSum", "ReduceOp", "Reduction", "reduction"]


class ReduceOp(str, enum.Enum):
    """NCCL's operators (``ncclSum`` … ``ncclAvg``)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


@dataclass(frozen=True)
class PreMulSum:
    """``Σ scalar · x_r`` (NCCL's ``ncclRedOpCreatePreMulSum``): every rank passes the same
    scalar. ``scalar`` is a number (converted to one element of the call's type), or an array
    holding one element of the call's type in device memory, read when the kernel runs."""

    scalar: Any


Reduction = Union[str, ReduceOp, PreMulSum, Any]
"""What a reducing call takes as ``op``: a name, a ``ReduceOp``, a ``PreMulSum``, or an object
with a ``name`` attribute such as ``torch.distributed.ReduceOp.SUM``."""

_NAMES = {op.value for op in ReduceOp} | {"premul_sum"}


def reduction(op: Reduction) -> Tuple[str, Optional[Any]]:
    """``(name, scalar)`` of ``op``; the scalar is ``None`` but for a ``PreMulSum``."""
    if isinstance(op, PreMulSum):
        return "premul_sum", op.scalar
    if isinstance(op, ReduceOp):
        return op.value, None
    name = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(name, str):
        key = name.lower()
        key = {"product": "prod", "average": "avg"}.get(key, key)
        if key in _NAMES and key != "premul_sum":
            return key, None
    raise InvalidArgumentError(
        f"{op!r} is not a reduction (sum, prod, min, max, avg, or PreMulSum(scalar))"
    )
