"""Op mapping: give every ATen node its NPU operator and unit from the catalogue (`pypto_lab.ops`).

A node the catalogue does not know falls back to the CPU lane (unit "cpu"): it is listed in the
graph's fallbacks and costs host<->device copies; it never stops the pipeline.
"""

from __future__ import annotations

from ..capture.graph import Graph
from ..capture.catalogue import lookup
from .base import Pass, PassContext, PassResult, register


@register
class MapOps(Pass):
    name = "map_ops"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        notes = []
        for node in graph.nodes:
            entry = lookup(node.target)
            if entry is None:
                node.attrs.update(npu_op="", unit="cpu")
                notes.append(f"{node.name} ({node.target}, from {node.module or 'the model'}): not in the "
                             "catalogue, falls back to the CPU lane")
            else:
                node.attrs.update(npu_op=entry.name, unit=entry.unit, vector_op=entry.vector_op)
        return PassResult(graph, modified=True, notes=notes)


def fallbacks(graph: Graph) -> list[str]:
    """Targets of the nodes that run on the CPU lane, in graph order."""
    return [n.target for n in graph.nodes if n.attrs.get("unit") == "cpu"]
