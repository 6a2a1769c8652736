"""The enumerations of the real API's ``docs/zh/api/datatype`` (hicann/pypto at 883e7df) that are not
dtypes: ``CastMode``, ``SaturationMode``, ``ReLuType``, ``CachePolicy``, ``ReduceMode``, ``OpType``,
``OutType``, ``TransMode``, ``ScatterMode``, ``LogBaseType``, ``AtomicRMWMode`` and
``DequantScaleRoundingMode`` (with ``ROUND_UP`` / ``ROUND_DOWN``), named and ordered as
python/pypto/pypto_impl/__init__.pyi declares them.

What each does here: ``CastMode`` and ``SaturationMode`` select the rounding and the overflow rule
of ``pypto.cast`` (`cast_rules`); ``ReLuType`` switches the ReLU of matmul's quantising epilogue;
``CachePolicy`` is recorded on a tensor (``set_cache_policy``: the L2 is not modelled per tensor);
``OpType`` / ``OutType`` / ``LogBaseType`` / ``ScatterMode`` / ``TransMode`` / ``ReduceMode`` are
accepted where their ops take them.
"""

from __future__ import annotations

import enum


class CastMode(enum.Enum):
    """The rounding of ``pypto.cast`` (docs/zh/api/datatype/CastMode.md)."""

    CAST_NONE = 0    # the framework's default for the conversion (float -> int: TRUNC; else RINT)
    CAST_RINT = 1    # to nearest, ties to even
    CAST_ROUND = 2   # to nearest, ties away from zero
    CAST_FLOOR = 3
    CAST_CEIL = 4
    CAST_TRUNC = 5   # toward zero
    CAST_ODD = 6     # von Neumann: inexact results get an odd last mantissa bit (fp32 -> fp16 only)


class SaturationMode(enum.Enum):
    """Overflow of a float -> integer cast (docs/zh/api/datatype/SaturationMode.md)."""

    OFF = 0   # binary truncation: the low bits of the integer (wraps around)
    ON = 1    # saturation: clamped to the target type's minimum / maximum


class ReLuType(enum.Enum):
    NO_RELU = 0
    RELU = 1


class CachePolicy(enum.Enum):
    NONE_CACHEABLE = 0


class ReduceMode(enum.Enum):
    ATOMIC_ADD = 0


class OpType(enum.Enum):
    EQ = 0
    NE = 1
    LT = 2
    LE = 3
    GT = 4
    GE = 5


class OutType(enum.Enum):
    BOOL = 0
    BIT = 1


class TransMode(enum.Enum):
    CAST_NONE = 0
    CAST_RINT = 1
    CAST_ROUND = 2


class ScatterMode(enum.Enum):
    NONE = 0
    ADD = 1
    MULTIPLY = 2


class LogBaseType(enum.Enum):
    LOG_E = 0
    LOG_2 = 1
    LOG_10 = 2


class AtomicRMWMode(enum.Enum):
    ADD = 0
    MIN = 1
    MAX = 2


class DequantScaleRoundingMode(enum.Enum):
    ROUND_UP = 0
    ROUND_DOWN = 1


ROUND_UP = DequantScaleRoundingMode.ROUND_UP
ROUND_DOWN = DequantScaleRoundingMode.ROUND_DOWN

__all__ = ["CastMode", "SaturationMode", "ReLuType", "CachePolicy", "ReduceMode", "OpType", "OutType", "TransMode",
           "ScatterMode", "LogBaseType", "AtomicRMWMode", "DequantScaleRoundingMode", "ROUND_UP", "ROUND_DOWN"]
