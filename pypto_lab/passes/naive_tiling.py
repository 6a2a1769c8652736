"""Naive tiling: every Cube kernel gets the textbook tile (`naive_cube_tile`: 128 x 128 output
blocks, K in panels of 64), as an untuned operator would. Level 0 runs it; the other levels keep
the roofline-estimate default, and level 3 searches (`tune_tiling`)."""

from __future__ import annotations

from ..capture.graph import Graph
from ..hw.chip import get_chip
from ..hw.tiling import TilingError, naive_cube_tile
from ..kernels.cost import gemm_of, kernels_of
from .base import Pass, PassContext, PassResult, register


@register
class NaiveTiling(Pass):
    name = "naive_tiling"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = get_chip(ctx.chip or "Ascend910B1")
        count, refused = 0, []
        for nodes in kernels_of(graph):
            cube = [n for n in nodes if n.attrs.get("unit") == "cube"]
            if not cube:
                continue
            _, m, k, n, dtype = gemm_of(graph, cube[0], chip, ctx.precision)
            try:
                cube[0].attrs["tile"] = naive_cube_tile(chip, m, k, n, dtype)
                count += 1
            except TilingError as exc:
                refused.append(f"{cube[0].module or cube[0].name}: keeps the default tiling ({exc})")
        return PassResult(graph, modified=count > 0,
                          notes=[f"{count} Cube kernels with the naive 128x128, K-by-64 tiling"] + refused[:3])
