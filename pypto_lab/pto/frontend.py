"""``pypto.frontend``: the newer entry points of the real API, ``frontend.jit`` (same kernel
object as ``pypto.jit``; kernels may also return the tensors they create with ``pypto.tensor``
or compute), ``frontend.dynamic(name)`` (a named dynamic dimension) and ``frontend.function`` (a
function kernels call, traced inline)."""

from __future__ import annotations

from .dtypes import SymbolicDim
from .extras import frontend_function as function
from .jit import jit


def dynamic(name: str) -> SymbolicDim:
    return SymbolicDim(name)


__all__ = ["jit", "dynamic", "function"]
