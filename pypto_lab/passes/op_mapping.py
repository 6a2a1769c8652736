"""Op mapping: give every ATen node its entry of the lowering table (`pypto_lab.lowering.table`:
NPU operator, unit, sizing rule) and the spec of the kernel it runs as on its own
(`pypto_lab.lowering.lower`): what an untuned, unfused framework would launch.

A node the table does not know falls back to the host (unit "cpu", a `HostKernel` that pays the
host<->device copies: the table's one fallback rule): it is listed in the report and never
stops the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph
from ..lowering.lower import lower
from ..lowering.table import entry_of
from .base import Pass, PassContext, PassResult, register


@register
@dataclass(frozen=True)
class MapOps(Pass):
    name: ClassVar[str] = "map_ops"

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes = []
        for node in graph.nodes:
            node.npu, known = entry_of(graph, node)
            if not known:
                notes.append(self.note(node, f"{node.target} is not in the lowering table: it falls back to the "
                                             "CPU lane (the host, paying the copies)"))
            node.kernel = lower(graph, node, ctx.chip, ctx.precision)
        mapped = sum(n.unit != "cpu" for n in graph.nodes)
        return PassResult(graph, True, f"{mapped} of {len(graph.nodes)} nodes mapped to NPU operators, "
                                       f"{len(notes)} on the CPU lane", tuple(notes))


def fallbacks(graph: Graph) -> list[str]:
    """Targets of the nodes that run on the CPU lane, in graph order."""
    return [n.target for n in graph.nodes if n.unit == "cpu"]


__all__ = ["MapOps", "fallbacks"]
