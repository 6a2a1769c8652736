"""``pypto.Element``: a scalar with a dtype (docs/zh/api/element: ``Element(dtype, value)``,
``.dtype``, ``.value``). Ops that take a scalar take an Element as its value; the value is
converted to the dtype as the real constructor does (an integer dtype truncates a float)."""

from __future__ import annotations

from .dtypes import as_dtype
from .errors import DTypeError


class Element:
    __slots__ = ("dtype", "value")

    def __init__(self, dtype, value):
        self.dtype = as_dtype(dtype, "pypto.Element dtype")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DTypeError(f"pypto.Element({self.dtype!r}, {value!r}): the value is a {type(value).__name__}. "
                             "Rule: an Element holds an int or a float. Fix: e.g. pypto.Element(pypto.DT_FP32, 3.0)")
        t = self.dtype.torch
        self.value = float(value) if t.is_floating_point else int(value)

    def __repr__(self) -> str:
        return f"Element({self.dtype!r}, {self.value!r})"

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)


__all__ = ["Element"]
