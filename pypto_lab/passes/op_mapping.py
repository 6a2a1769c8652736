"""Op mapping: give every ATen node its NPU operator and unit from the catalogue
(`pypto_lab.capture.catalogue`) and the spec of the kernel it runs as on its own
(`pypto_lab.kernels.lower`): what an untuned, unfused framework would launch.

A node the catalogue does not know falls back to the CPU lane (unit "cpu", a `HostKernel` that
pays the host<->device copies): it is listed in the report and never stops the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.catalogue import CPU, lookup
from ..capture.graph import Graph
from ..lowering.lower import lower
from .base import Pass, PassContext, PassResult, register


@register
@dataclass(frozen=True)
class MapOps(Pass):
    name: ClassVar[str] = "map_ops"

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes = []
        for node in graph.nodes:
            entry = lookup(node.target)
            if entry is None:
                entry = CPU
                notes.append(self.note(node, f"{node.target} is not in the catalogue: it falls back to the CPU lane"))
            node.npu = entry
            node.kernel = lower(graph, node, ctx.chip, ctx.precision)
        mapped = sum(n.unit != "cpu" for n in graph.nodes)
        return PassResult(graph, True, f"{mapped} of {len(graph.nodes)} nodes mapped to NPU operators, "
                                       f"{len(notes)} on the CPU lane", tuple(notes))


def fallbacks(graph: Graph) -> list[str]:
    """Targets of the nodes that run on the CPU lane, in graph order."""
    return [n.target for n in graph.nodes if n.unit == "cpu"]


__all__ = ["MapOps", "fallbacks"]
