"""Every kernel of an optimised graph with its cost on a chip: the rows of a `Report`.

`cost_kernels(graph, chip)` lowers the graph's annotated nodes to `Kernel`s (`lower.kernels_of`)
and costs each spec with the coster registered for its kind (`pypto_lab.kernels.cost`).
"""

from __future__ import annotations

from ..capture.graph import Graph
from ..hw.chip import Chip
from ..kernels.cost import CostedKernel, cost
from .lower import kernels_of


def cost_kernels(graph: Graph, chip: Chip) -> list[CostedKernel]:
    """Every kernel of a graph (after `map_ops`) with its simulated cost, in execution order."""
    return [CostedKernel(k, cost(k.spec, chip)) for k in kernels_of(graph)]


__all__ = ["CostedKernel", "cost_kernels"]
