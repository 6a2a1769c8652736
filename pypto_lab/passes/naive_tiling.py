"""Naive tiling: every Cube kernel gets the textbook tile (`naive_cube_tile`: 128 x 128 output
blocks, K in panels of 64), as an untuned operator would. Level 0 runs it; the other levels keep
the roofline-estimate default, and level 3 searches (`tune_tiling`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph
from ..hw.tiling import TilingError, naive_cube_tile
from ..kernels.ir import CubeKernel
from .base import Pass, PassContext, PassResult, register


@register
@dataclass(frozen=True)
class NaiveTiling(Pass):
    name: ClassVar[str] = "naive_tiling"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        count, refused = 0, []
        for node in graph.nodes:
            spec = node.kernel
            if not isinstance(spec, CubeKernel):
                continue
            try:
                node.kernel = replace(spec, tile=naive_cube_tile(ctx.chip, spec.m, spec.k, spec.n, spec.dtype))
                count += 1
            except TilingError as exc:
                refused.append(self.note(node, f"keeps the default tiling ({exc})"))
        return PassResult(graph, modified=count > 0, summary=f"{count} Cube kernels with the naive 128x128, K-by-64 "
                                                             "tiling", notes=tuple(refused))
