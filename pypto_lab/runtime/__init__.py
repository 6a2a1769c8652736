"""Running an optimised model: real outputs computed on the CPU with the NPU's numerics.

`interpreter` runs the captured program node by node with the numerics the optimised graph
gives each node; `compare` measures how far two tensors are apart.
"""

from .compare import CompareError, Comparison, compare_tensors
from .interpreter import Runtime, RuntimeInputError

__all__ = ["CompareError", "Comparison", "Runtime", "RuntimeInputError", "compare_tensors"]
