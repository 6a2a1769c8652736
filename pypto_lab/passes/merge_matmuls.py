"""Matmuls that read the same input become one wider matmul: an attention's q, k and v projections,
a gated MLP's gate and up projections.

Three matmuls of ``x [M, K]`` by ``[K, N_i]`` read ``x`` three times and run three kernels; one
matmul by ``[K, N_q + N_k + N_v]`` reads it once and fills the Cube with one wider N. vLLM-Ascend
and MindIE build their models this way (QKVParallelLinear, MergedColumnParallelLinear), so the
LLM engine costs one MatMul_qkv and one MatMul_gate_up; a graph compiler merges parallel matmuls
of a captured model the same way. Members keep their own outputs (slices of the wide one); their
kernel is the anchor's (the first), with N the sum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..kernels.ir import CubeKernel
from .base import Pass, PassContext, PassResult, register
from .patterns import Walker, in_order, make_kernel


@register
@dataclass(frozen=True)
class MergeMatmuls(Pass):
    name: ClassVar[str] = "merge_matmuls"
    fusion: ClassVar[str] = "parallel_matmuls"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        w = Walker(graph)
        by_input: dict[tuple, list[Node]] = {}
        for node in graph.nodes:
            spec = node.kernel
            if w.op(node) != "linear" or not isinstance(spec, CubeKernel) or node.group is not None \
                    or spec.batch != 1 or spec.quantize_input is not None:
                continue
            key = (w.source(node.inputs[0]), spec.m, spec.k, spec.dtype, spec.out_dtype, spec.epilogue)
            by_input.setdefault(key, []).append(node)
        merged = nodes = 0
        for group in by_input.values():
            if len(group) < 2:
                continue
            group = in_order(graph, group)
            first = group[0].kernel
            spec = replace(first, n=sum(n.kernel.n for n in group))
            make_kernel(group, spec, first.op, self.name)
            merged += 1
            nodes += len(group)
        return PassResult(graph, modified=bool(merged),
                          summary=f"merged {nodes} matmuls reading the same input into {merged} wider ones")


__all__ = ["MergeMatmuls"]
