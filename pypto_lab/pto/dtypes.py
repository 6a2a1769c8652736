"""Data types, run modes and dynamic dimensions of the PyPTO API (``pypto.DT_FP16``,
``pypto.RunMode.SIM``, ``pypto.DYNAMIC``, ``pypto.frontend.dynamic``), mapped to torch dtypes and
to the dtype names of the chip model (``"fp16"``, ...)."""

from __future__ import annotations

import enum
import threading

import torch

from .errors import DTypeError, ShapeError


class DataType:
    """A PyPTO data type: ``DT_FP16`` etc. ``lab`` is the chip model's name, ``torch`` its torch
    dtype (None where torch has none), ``bits`` its width, ``bytes`` the bytes one element takes
    in a buffer (1 for the sub-byte types: the lab stores them one per byte), ``value`` its number
    in the real enum."""

    __slots__ = ("name", "lab", "torch", "bytes", "bits", "value")

    def __init__(self, name: str, lab: str, tdtype, nbytes: int, bits: int | None = None, value: int = -1):
        self.name, self.lab, self.torch, self.bytes = name, lab, tdtype, nbytes
        self.bits = bits if bits is not None else 8 * nbytes
        self.value = value

    def __repr__(self) -> str:
        return f"pypto.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


def _t(name: str):
    return getattr(torch, name, None)


# the real DataType enum, in its order (framework/src/interface/configs/tile_fwk_types.json and
# python/pypto/enum.py at 883e7df; sizes from docs/zh/api/datatype/DataType.md)
DT_INT4 = DataType("DT_INT4", "int4", None, 1, 4, 0)
DT_INT8 = DataType("DT_INT8", "int8", torch.int8, 1, 8, 1)
DT_INT16 = DataType("DT_INT16", "int16", torch.int16, 2, 16, 2)
DT_INT32 = DataType("DT_INT32", "int32", torch.int32, 4, 32, 3)
DT_INT64 = DataType("DT_INT64", "int64", torch.int64, 8, 64, 4)
DT_FP8 = DataType("DT_FP8", "fp8", None, 1, 8, 5)  # the generic 8-bit float: no single torch format
DT_FP16 = DataType("DT_FP16", "fp16", torch.float16, 2, 16, 6)
DT_FP32 = DataType("DT_FP32", "fp32", torch.float32, 4, 32, 7)
DT_BF16 = DataType("DT_BF16", "bf16", torch.bfloat16, 2, 16, 8)
DT_HF4 = DataType("DT_HF4", "hf4", None, 1, 4, 9)     # HiFloat4: Ascend's own format, not in torch
DT_HF8 = DataType("DT_HF8", "hf8", None, 1, 8, 10)    # HiFloat8: Ascend's own format, not in torch
DT_UINT8 = DataType("DT_UINT8", "uint8", torch.uint8, 1, 8, 11)
DT_UINT16 = DataType("DT_UINT16", "uint16", _t("uint16"), 2, 16, 12)
DT_UINT32 = DataType("DT_UINT32", "uint32", _t("uint32"), 4, 32, 13)
DT_UINT64 = DataType("DT_UINT64", "uint64", _t("uint64"), 8, 64, 14)
DT_BOOL = DataType("DT_BOOL", "bool", torch.bool, 1, 8, 15)
DT_DOUBLE = DataType("DT_DOUBLE", "fp64", torch.float64, 8, 64, 16)
DT_FP8E5M2 = DataType("DT_FP8E5M2", "fp8e5m2", _t("float8_e5m2"), 1, 8, 17)
DT_FP8E4M3 = DataType("DT_FP8E4M3", "fp8e4m3", _t("float8_e4m3fn"), 1, 8, 18)
DT_FP8E8M0 = DataType("DT_FP8E8M0", "fp8e8m0", _t("float8_e8m0fnu"), 1, 8, 19)
# MXFP4, two elements packed in a byte; torch's float4_e2m1fn_x2 holds such pairs but cannot convert
DT_FP4_E2M1X2 = DataType("DT_FP4_E2M1X2", "fp4e2m1x2", _t("float4_e2m1fn_x2"), 1, 8, 20)
DT_FP4_E1M2X2 = DataType("DT_FP4_E1M2X2", "fp4e1m2x2", None, 1, 8, 21)
DT_FP4_E2M1 = DataType("DT_FP4_E2M1", "fp4e2m1", None, 1, 4, 22)
DT_FP4_E1M2 = DataType("DT_FP4_E1M2", "fp4e1m2", None, 1, 4, 23)
ALL = (DT_INT4, DT_INT8, DT_INT16, DT_INT32, DT_INT64, DT_FP8, DT_FP16, DT_FP32, DT_BF16, DT_HF4, DT_HF8, DT_UINT8,
       DT_UINT16, DT_UINT32, DT_UINT64, DT_BOOL, DT_DOUBLE, DT_FP8E5M2, DT_FP8E4M3, DT_FP8E8M0, DT_FP4_E2M1X2,
       DT_FP4_E1M2X2, DT_FP4_E2M1, DT_FP4_E1M2)
# the Vector unit of the modelled chips computes in these; every other dtype is storage only:
# kernels may load, store, move, cast, compare into (DT_BOOL) and select with it (pypto.where)
ARITH = ("fp16", "bf16", "fp32", "int8", "int16", "int32")
STORAGE_ONLY = tuple(d.lab for d in ALL if d.lab not in ARITH)
# dtypes whose values pypto_lab can hold and convert (torch has the format and can cast to it)
CONVERTIBLE = tuple(d for d in ALL if d.torch is not None and d is not DT_FP4_E2M1X2)
CONVERTIBLE_SET = frozenset(CONVERTIBLE)  # for the tracer's per-op check
for _d in ALL:  # pypto.DataType.DT_FP16 as in the real enum
    setattr(DataType, _d.name, _d)
_BY_TORCH = {d.torch: d for d in ALL if d.torch is not None}
_BY_NAME = {d.name: d for d in ALL}


def check_representable(dt: DataType, what: str) -> None:
    """DTypeError unless pypto_lab can hold values of ``dt`` (a torch dtype that converts)."""
    if dt not in CONVERTIBLE:
        raise DTypeError(
            f"{what} has dtype {dt!r}: pypto_lab computes values with torch, which has no {dt.name} format that it "
            f"can convert to ({'a packed pair, not convertible' if dt.torch is not None else 'no torch dtype'}). "
            "Rule: tensors of a kernel hold one of " + ", ".join(d.name for d in CONVERTIBLE)
            + ". Fix: keep the tensor in DT_FP16 / DT_BF16 (or DT_FP8E4M3 / DT_FP8E5M2 for 8-bit floats, DT_INT8 "
            "for 4-bit integers)")


def _by_name(name: str) -> DataType:
    return _BY_NAME[name]


def from_torch(dt: torch.dtype, what: str = "tensor") -> DataType:
    try:
        return _BY_TORCH[dt]
    except KeyError:
        known = ", ".join(str(d.torch) for d in ALL if d.torch is not None)
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
        td = getattr(torch, dt, None)  # "float32", "bfloat16", ... (the real frontend's spelling)
        if isinstance(td, torch.dtype) and td in _BY_TORCH:
            return _BY_TORCH[td]
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
    """``pypto.DYNAMIC`` (``pypto.DYN``): a dimension of any size in a ``pypto.Tensor`` annotation."""

    def __repr__(self) -> str:
        return "pypto.DYNAMIC"


class _Static:
    """``pypto.STATIC``: a dimension whose size the real framework takes from the first call and
    fixes at compile time (a new size compiles anew). In pypto_lab every size compiles its own
    kernel (the compile cache is keyed by the argument shapes), so STATIC and DYNAMIC both accept
    any size; the rank is checked."""

    def __repr__(self) -> str:
        return "pypto.STATIC"


class TileOpFormat(enum.IntEnum):
    """``pypto.TileOpFormat``: a tensor's layout in GM, ND (row-major) or NZ (the Cube's fractal
    layout). Accepted in annotations and ``pypto.tensor(..., format=)`` and kept on the annotation;
    pypto_lab holds every tensor as ND (recorded, not modelled)."""

    TILEOP_ND = 0
    TILEOP_NZ = 1


class StatusType(enum.Enum):
    """``pypto.StatusType``: the dimension markers of an annotation (DYN, DYNAMIC, STATIC)."""

    DYN = "DYN"
    DYNAMIC = "DYNAMIC"
    STATIC = "STATIC"


DYNAMIC = _Dynamic()
DYN = DYNAMIC
STATIC = _Static()

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
    if d is DYNAMIC or d is STATIC or d is Ellipsis:
        return None
    if isinstance(d, SymbolicDim):
        b = getattr(_BINDINGS, "values", None)
        return b.get(d.name) if b else None
    return int(d)
