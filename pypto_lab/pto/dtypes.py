"""Data types, run modes and dynamic dimensions of the PyPTO API (``pypto.DT_FP16``,
``pypto.RunMode.SIM``, ``pypto.DYNAMIC``, ``pypto.frontend.dynamic``), mapped to torch dtypes and
to the dtype names of the chip model (``"fp16"``, ...)."""

from __future__ import annotations

import enum
import threading

import torch

from .errors import DTypeError, ShapeError


class DataType:
    """A PyPTO data type: ``DT_FP16`` etc. ``lab`` is the chip model's name, ``torch`` its torch dtype."""

    __slots__ = ("name", "lab", "torch", "bytes")

    def __init__(self, name: str, lab: str, tdtype: torch.dtype, nbytes: int):
        self.name, self.lab, self.torch, self.bytes = name, lab, tdtype, nbytes

    def __repr__(self) -> str:
        return f"pypto.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


DT_FP16 = DataType("DT_FP16", "fp16", torch.float16, 2)
DT_BF16 = DataType("DT_BF16", "bf16", torch.bfloat16, 2)
DT_FP32 = DataType("DT_FP32", "fp32", torch.float32, 4)
DT_INT8 = DataType("DT_INT8", "int8", torch.int8, 1)
DT_INT16 = DataType("DT_INT16", "int16", torch.int16, 2)
DT_INT32 = DataType("DT_INT32", "int32", torch.int32, 4)
# storage-only dtypes: the Vector unit of the modelled chips has no arithmetic on them; kernels may
# load, store, move, cast, compare into (DT_BOOL) and select with them (pypto.where)
DT_INT64 = DataType("DT_INT64", "int64", torch.int64, 8)
DT_UINT8 = DataType("DT_UINT8", "uint8", torch.uint8, 1)
DT_BOOL = DataType("DT_BOOL", "bool", torch.bool, 1)
ALL = (DT_FP16, DT_BF16, DT_FP32, DT_INT8, DT_INT16, DT_INT32, DT_INT64, DT_UINT8, DT_BOOL)
STORAGE_ONLY = ("int64", "uint8", "bool")
_BY_TORCH = {d.torch: d for d in ALL}
_BY_NAME = {d.name: d for d in ALL}


def _by_name(name: str) -> DataType:
    return _BY_NAME[name]


def from_torch(dt: torch.dtype, what: str = "tensor") -> DataType:
    try:
        return _BY_TORCH[dt]
    except KeyError:
        known = ", ".join(str(d.torch) for d in ALL)
        raise DTypeError(f"{what} has dtype {dt}: PyPTO kernels take {known}; convert it with .to(torch.float16) "
                         "or another of them") from None


def as_dtype(dt, what: str = "dtype") -> DataType:
    """A DataType from a DataType, a torch dtype or a name such as "fp16" / "DT_FP16"."""
    if isinstance(dt, DataType):
        return dt
    if isinstance(dt, torch.dtype):
        return from_torch(dt, what)
    if isinstance(dt, str):
        for d in ALL:
            if dt in (d.name, d.lab):
                return d
    raise DTypeError(f"{what} = {dt!r} is not a PyPTO data type; use one of "
                     + ", ".join(f"pypto.{d.name}" for d in ALL))


def bytes_of(dt) -> int:
    """Bytes of one element (``pypto.bytes_of(pypto.DT_FP16) == 2``)."""
    return as_dtype(dt).bytes


class RunMode(enum.IntEnum):
    """Where a kernel runs: ``NPU`` (0, the device; not available here) or ``SIM`` (1, the simulator)."""

    NPU = 0
    SIM = 1


class _Dynamic:
    """``pypto.DYNAMIC``: a dimension of any size in a ``pypto.Tensor`` annotation."""

    def __repr__(self) -> str:
        return "pypto.DYNAMIC"


DYNAMIC = _Dynamic()
DYN = DYNAMIC

_BINDINGS = threading.local()


class SymbolicDim:
    """A named dynamic dimension (``pypto.frontend.dynamic("bs")``).

    While a kernel is traced it stands for the size the call binds it to (every compiled kernel
    is specialised to the call's shapes, as the compile cache is keyed by them); outside a call
    it has no value.
    """

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"pypto.frontend.dynamic({self.name!r})"

    @property
    def value(self) -> int:
        b = getattr(_BINDINGS, "values", None)
        if not b or self.name not in b:
            raise ShapeError(f"dynamic dimension {self.name!r} has no value here: it takes the size of the "
                             "tensor it annotates when the kernel is called; use it inside the kernel only")
        return b[self.name]

    def __index__(self) -> int:
        return self.value

    __int__ = __index__

    def _v(self, other):
        return other.value if isinstance(other, SymbolicDim) else other

    def __add__(self, o): return self.value + self._v(o)
    def __radd__(self, o): return self._v(o) + self.value
    def __sub__(self, o): return self.value - self._v(o)
    def __rsub__(self, o): return self._v(o) - self.value
    def __mul__(self, o): return self.value * self._v(o)
    def __rmul__(self, o): return self._v(o) * self.value
    def __floordiv__(self, o): return self.value // self._v(o)
    def __rfloordiv__(self, o): return self._v(o) // self.value
    def __mod__(self, o): return self.value % self._v(o)
    def __truediv__(self, o): return self.value / self._v(o)
    def __eq__(self, o): return isinstance(o, SymbolicDim) and o.name == self.name
    def __hash__(self): return hash(("SymbolicDim", self.name))
    def __lt__(self, o): return self.value < self._v(o)
    def __le__(self, o): return self.value <= self._v(o)
    def __gt__(self, o): return self.value > self._v(o)
    def __ge__(self, o): return self.value >= self._v(o)


class bind_dims:
    """Context manager binding symbolic dimension names to sizes while a kernel is traced."""

    def __init__(self, values: dict[str, int]):
        self.values = values

    def __enter__(self):
        self.old = getattr(_BINDINGS, "values", None)
        _BINDINGS.values = dict(self.values)

    def __exit__(self, *exc):
        _BINDINGS.values = self.old


def dim_value(d):
    """An int from an int, a SymbolicDim (bound) or DYNAMIC (None)."""
    if d is DYNAMIC:
        return None
    if isinstance(d, SymbolicDim):
        b = getattr(_BINDINGS, "values", None)
        return b.get(d.name) if b else None
    return int(d)
