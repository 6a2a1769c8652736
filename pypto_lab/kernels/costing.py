"""Every kernel of an optimised graph with its cost on a chip: the rows of a `Report`.

`cost_kernels(graph, chip)` lowers the graph's annotated nodes to `Kernel`s (`lower.kernels_of`)
and costs each spec with the coster registered for its kind (`cost.cost`). Importing this module
registers the built-in costers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..capture.graph import Graph
from ..hw.chip import Chip
from . import attention, cube, custom, host, pto_bridge, vector  # noqa: F401  (register the built-in costers)
from .cost import KernelCost, cost
from .ir import Kernel, KernelSpec
from .lower import kernels_of


@dataclass(frozen=True)
class CostedKernel:
    """One kernel of a model and what the chip model says it costs."""

    kernel: Kernel
    cost: KernelCost

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def spec(self) -> KernelSpec:
        return self.kernel.spec

    @property
    def unit(self) -> str:
        return self.kernel.unit

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.kernel.nodes

    @property
    def fused_ops(self) -> tuple[str, ...]:
        return self.kernel.fused_ops

    @property
    def cycles(self) -> float:
        return self.cost.cycles

    @property
    def time_us(self) -> float:
        return self.cost.time_us

    @property
    def gm_bytes(self) -> float:
        return self.cost.gm_bytes

    @property
    def tile(self) -> dict[str, Any]:
        return dict(self.cost.tile)

    @property
    def reports(self) -> tuple:
        return self.cost.reports

    @property
    def resources(self) -> tuple[str, ...]:
        return self.cost.resources

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "kind": self.spec.kind, "fused_ops": list(self.fused_ops),
                "cycles": self.cycles, "time_us": self.time_us, "gm_bytes": self.gm_bytes, "tile": self.tile}


def cost_kernels(graph: Graph, chip: Chip) -> list[CostedKernel]:
    """Every kernel of a graph (after `map_ops`) with its simulated cost, in execution order."""
    return [CostedKernel(k, cost(k.spec, chip)) for k in kernels_of(graph)]


__all__ = ["CostedKernel", "cost_kernels"]
