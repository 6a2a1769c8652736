"""Tiling search: pick, per kernel, the tile shapes the simulator says are fastest.

The default tilings come from a per-block roofline estimate (`cube_tile_candidates` ranks every
legal Cube tiling by it; FlashAttention takes the first block size of its ladder that fits
double-buffered). The estimate sees neither pipeline start-up, the epilogue, L2 behaviour nor
the online-softmax steps. So this pass runs the tile search (`pypto_lab.kernels.tile_search`,
the one auto_tune and training use too) over its level-3 candidates for every Cube kernel and
every fused attention: the default and the next ``candidates`` tilings by estimate (those
estimated within ``within`` of the best) and the best ``candidates - 1`` of the pipe-level screen,
or every legal (block_q, block_k). It writes the fastest into the kernel's spec
(``CubeKernel.tile``, ``AttentionKernel.block_q / block_k``) and never keeps a tiling slower than
the default. Identical kernels (ResNet's repeated bottlenecks, BERT's layers) are searched once:
they share one spec; kernels that differ only in what L2 kept between operators (`l2_residency`)
share the search too, and keep its tiling only if it still beats the default with their residency. Vector kernels keep their default tiles (one tile shape per UB budget).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph
from ..hw.chip import Chip
from ..kernels.cost import cost
from ..kernels.ir import AttentionKernel, CubeKernel
from ..kernels.tile_search import candidate_tilings, search_tiling, with_tiling
from .base import Pass, PassContext, PassResult, register


def without_l2(spec):
    """``spec`` as if L2 kept nothing between operators (the tiling search runs on it once)."""
    if isinstance(spec, CubeKernel) and (spec.l2_operands or spec.l2_writes):
        return replace(spec, l2_operands=(), l2_writes=0)
    return spec


@register
@dataclass(frozen=True)
class TuneTiling(Pass):
    name: ClassVar[str] = "tune_tiling"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)
    candidates: int = 3
    within: float = 1.25

    def __post_init__(self):
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 0:
            raise ValueError(f"tune_tiling candidates = {self.candidates!r}: must be a non-negative integer "
                             "(default 3)")
        if not isinstance(self.within, (int, float)) or not self.within >= 1.0:
            raise ValueError(f"tune_tiling within = {self.within!r}: must be >= 1 (1.25 tries tilings estimated "
                             "at most 25 % slower than the estimate's best)")

    def choices(self, chip: Chip, spec) -> list:
        """The tilings (or attention blocks) to simulate for a kernel spec."""
        return candidate_tilings(chip, spec, self.candidates, self.within)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = ctx.chip
        decided: dict = {}  # spec with the default tiling -> (best choice or None, default us, best us)
        tuned = kept = 0
        gains: list[tuple[float, str]] = []
        for node in graph.nodes:
            spec = node.kernel
            if not (isinstance(spec, CubeKernel) or (isinstance(spec, AttentionKernel) and spec.flash)):
                continue
            base = with_tiling(spec, None)
            if base not in decided:
                plain = without_l2(base)
                if plain not in decided:  # kernels differing only in what L2 kept share one search
                    found = search_tiling(plain, chip, self.choices(chip, plain))
                    decided[plain] = (found.tile, found.default.time_us, found.best.time_us)
                best, default_us, best_us = decided[plain]
                if plain != base and best is not None:
                    # keep the tiling only if it still beats the default with this kernel's L2 residency
                    default_us = cost(base, chip).time_us
                    best_us = cost(with_tiling(base, best), chip).time_us
                    best = best if best_us < default_us else None
                decided[base] = (best, default_us, best_us)
                if best is not None:
                    gains.append((default_us - best_us, f"{node.module or node.name}: {default_us:.1f} -> "
                                  f"{best_us:.1f} us with {best}"))
            best = decided[base][0]
            node.kernel = with_tiling(base, best)
            tuned += best is not None
            kept += best is None
        notes = tuple(self.note("", g) for _, g in sorted(gains, reverse=True)[:3])
        searched = sum(1 for k in decided if k == without_l2(k))
        summary = f"{tuned} kernels retiled, {kept} keep the default tiling ({searched} distinct kernels searched)"
        return PassResult(graph, modified=tuned > 0, summary=summary, notes=notes)
