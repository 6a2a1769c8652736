"""Tiling search: pick, per kernel, the tile shapes the simulator says are fastest.

The default tilings come from a per-block roofline estimate (`cube_tile_candidates` ranks every
legal Cube tiling by it; FlashAttention takes the first block size of its ladder that fits
double-buffered). The estimate sees neither pipeline start-up, the epilogue, L2 behaviour nor
the online-softmax steps. So this pass simulates, for every Cube kernel, the default and the next
``candidates`` tilings by estimate (those estimated within ``within`` of the best) and the best
``candidates - 1`` of the pipe-level screen over the power-of-two tilings
(`pypto_lab.hw.tile_search`), skipping tilings that would issue more than twice the default's
instructions (to keep the search fast); and, for every fused attention, every legal
(block_q, block_k). It writes the fastest into the kernel's spec (``CubeKernel.tile``,
``AttentionKernel.block_q / block_k``) and never keeps a tiling slower than the default.
Identical kernels (ResNet's repeated bottlenecks, BERT's layers) are searched once: they share
one spec. Vector kernels keep their default tiles (one tile shape per UB budget).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..capture.graph import Graph
from ..hw.attention import attention_block_candidates
from ..hw.chip import Chip
from ..hw.tile_search import screen_space
from ..hw.tiling import CubeTile, cube_tile_candidates
from ..kernels.cost import cost
from ..kernels.ir import AttentionKernel, CubeKernel
from .base import Pass, PassContext, PassResult, register


def _instructions(tile: CubeTile, spec: CubeKernel, cores: int) -> float:
    """Cube instructions one core issues with ``tile`` (blocks per core x L0C sub-tiles x K steps)."""
    blocks = spec.batch * -(-spec.m // tile.m_l1) * -(-spec.n // tile.n_l1)
    subtiles = -(-tile.m_l1 // tile.m_l0) * -(-tile.n_l1 // tile.n_l0)
    return -(-blocks // cores) * subtiles * -(-spec.k // tile.k_l0)


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
        if isinstance(spec, CubeKernel):
            by_roofline = cube_tile_candidates(chip, spec.m, spec.k, spec.n, spec.dtype,
                                               within=self.within)[: self.candidates + 1]
            screen = screen_space(chip, spec.m, spec.k, spec.n, spec.dtype, batch=spec.batch, full=False)
            by_screen = [screen.tile(int(i)) for i in
                         np.argsort(screen.costs, kind="stable")[: max(1, self.candidates - 1)]]
            # simulating a tiling costs time in proportion to its instructions: the search skips
            # tilings that would issue more than twice the default's (their small tiles rarely win)
            limit = 2 * _instructions(by_roofline[0], spec, chip.cube_cores)
            return [t for t in dict.fromkeys(by_roofline + by_screen) if _instructions(t, spec, chip.cube_cores) <= limit]
        return attention_block_candidates(chip, spec.s_q, spec.s_k, spec.d, spec.dtype)

    @staticmethod
    def _with(spec, choice):
        if isinstance(spec, CubeKernel):
            return replace(spec, tile=choice)
        return replace(spec, block_q=choice[0] if choice else None, block_k=choice[1] if choice else None)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = ctx.chip
        decided: dict = {}  # spec with the default tiling -> (best choice or None, default us, best us)
        tuned = kept = 0
        gains: list[tuple[float, str]] = []
        for node in graph.nodes:
            spec = node.kernel
            if not (isinstance(spec, CubeKernel) or (isinstance(spec, AttentionKernel) and spec.flash)):
                continue
            base = self._with(spec, None)
            if base not in decided:
                default_us = best_us = cost(base, chip).time_us
                best = None
                for choice in self.choices(chip, base):
                    t = cost(self._with(base, choice), chip).time_us
                    if t < best_us * (1 - 1e-9):
                        best, best_us = choice, t
                decided[base] = (best, default_us, best_us)
                if best is not None:
                    gains.append((default_us - best_us, f"{node.module or node.name}: {default_us:.1f} -> "
                                  f"{best_us:.1f} us with {best}"))
            best = decided[base][0]
            node.kernel = self._with(base, best)
            tuned += best is not None
            kept += best is None
        notes = tuple(self.note("", g) for _, g in sorted(gains, reverse=True)[:3])
        summary = f"{tuned} kernels retiled, {kept} keep the default tiling ({len(decided)} distinct kernels searched)"
        return PassResult(graph, modified=tuned > 0, summary=summary, notes=notes)
