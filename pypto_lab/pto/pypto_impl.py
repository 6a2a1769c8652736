"""``pypto.pypto_impl``: the names of the real framework's C++ binding that model files call
directly (``from pypto import pypto_impl``), each mapped onto pypto_lab's implementation.

* ``Element(dtype, value)``: a scalar of a dtype (`element.Element`).
* ``ScalarDivS(tensor, element, reverse)``: ``tensor / value``, or ``value / tensor`` when
  ``reverse`` is true (framework/src/interface/operation/vector/binary.cpp, as the real quant
  operator uses it: ``ScalarDivS(max, Element(DT_FP32, 127), true)`` is ``127 / max``).
* ``GetCompilerMonitorTotalElapsed()``: seconds spent compiling pto kernels in this process
  (trace and the four stages, summed over every compiled signature; `jit.COMPILE_SECONDS`), which
  the GLM MoE files check against their own 30 s budget.
* The enums and ``DataType`` the binding exports.
"""

from __future__ import annotations

from .dtypes import DataType, TileOpFormat
from .element import Element
from .enums import (
    AtomicRMWMode,
    CachePolicy,
    CastMode,
    DequantScaleRoundingMode,
    LogBaseType,
    OpType,
    OutType,
    ReduceMode,
    ReLuType,
    SaturationMode,
    ScatterMode,
    TransMode,
)
from .extras import TileL0Info, TileL1Info
from .precision import PrecisionType


def ScalarDivS(tensor, value, reverse: bool = False):  # noqa: N802 - the binding's name
    from .ops import div

    v = value.value if isinstance(value, Element) else value
    return div(v, tensor) if reverse else div(tensor, v)


def GetCompilerMonitorTotalElapsed() -> float:  # noqa: N802 - the binding's name
    from .jit import COMPILE_SECONDS

    return float(COMPILE_SECONDS[0])


__all__ = ["TileL1Info", "TileL0Info", "Element", "ScalarDivS", "GetCompilerMonitorTotalElapsed", "DataType", "TileOpFormat", "CastMode",
           "SaturationMode", "ReLuType", "CachePolicy", "ReduceMode", "OpType", "OutType", "TransMode",
           "ScatterMode", "LogBaseType", "AtomicRMWMode", "DequantScaleRoundingMode", "PrecisionType"]
