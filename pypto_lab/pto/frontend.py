"""``pypto.frontend``: the newer entry points of the real API, ``frontend.jit`` (same kernel
object as ``pypto.jit``; kernels may also return the tensors they create with ``pypto.tensor``
or compute) and ``frontend.dynamic(name)`` (a named dynamic dimension)."""

from __future__ import annotations

from .dtypes import SymbolicDim
from .jit import jit


def dynamic(name: str) -> SymbolicDim:
    return SymbolicDim(name)


__all__ = ["jit", "dynamic"]
