"""The kernel IR between the front ends and the chip, and one coster per kind of kernel.

`ir.py` holds the specs (frozen values: what a kernel computes, in which dtypes and layouts, with
which tiling); `cost.py` the registry (`coster`), the memo and `KernelCost`. Importing this
package registers every built-in coster, so `cost(spec, chip)` knows every kind of `ir.py`, and
the grid strategy (`grid.py`).
"""

from . import attention, collective, cube, custom, grid, host, moe, pto_bridge, vector  # noqa: F401  (the costers)
from .cost import COSTERS, KernelCost, clear_memo, cost, coster
from .ir import Kernel, KernelSpec

__all__ = ["COSTERS", "Kernel", "KernelCost", "KernelSpec", "clear_memo", "cost", "coster"]
