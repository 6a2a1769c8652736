"""Tiling search: pick, per kernel, the tile shapes the simulator says are fastest.

The default tilings come from a per-block roofline estimate (`cube_tile_candidates` ranks every
legal Cube tiling by it; FlashAttention takes the first block size of its ladder that fits
double-buffered). The estimate sees neither pipeline start-up, the epilogue, L2 behaviour nor
the online-softmax steps. So this pass simulates, for every Cube kernel, the default and the next
``candidates`` tilings by estimate (those estimated within 25 % of the best) and the best two of
`pypto_lab.tuning`'s pipe-level screen over the power-of-two tilings (skipping tilings that would
issue more than twice the default's instructions, to keep the search fast); and, for every
fused attention, every legal (block_q, block_k). It keeps the fastest in ``attrs["tile"]`` /
``attrs["attention_blocks"]``. It never keeps a
tiling slower than the default. Identical kernels (ResNet's repeated bottlenecks, BERT's layers)
are searched once. Vector kernels keep their default tiles (one tile shape per UB budget).
"""

from __future__ import annotations

import numpy as np

from ..capture.graph import Graph
from ..hw.attention import attention_block_candidates
from ..hw.chip import get_chip
from ..hw.tiling import cube_tile_candidates
from ..kernels.cost import _shape, attention_dtype, cost_kernel, gemm_of, kernels_of
from ..hw.tile_search import screen_space
from .base import Pass, PassContext, PassResult, register


def _instructions(tile, m: int, k: int, n: int, batch: int, cores: int) -> float:
    """Cube instructions one core issues with ``tile`` (blocks per core x L0C sub-tiles x K steps)."""
    blocks = batch * -(-m // tile.m_l1) * -(-n // tile.n_l1)
    subtiles = -(-tile.m_l1 // tile.m_l0) * -(-tile.n_l1 // tile.n_l0)
    return -(-blocks // cores) * subtiles * -(-k // tile.k_l0)


@register
class TuneTiling(Pass):
    name = "tune_tiling"
    requires = ("map_ops",)

    def __init__(self, candidates: int = 3, within: float = 1.25):
        if not isinstance(candidates, int) or candidates < 0:
            raise ValueError(f"tune_tiling candidates = {candidates!r}: must be a non-negative integer (default 3)")
        if not within >= 1.0:
            raise ValueError(f"tune_tiling within = {within!r}: must be >= 1 (1.25 tries tilings estimated "
                             "at most 25 % slower than the estimate's best)")
        self.candidates = candidates
        self.within = within

    def _choices(self, chip, sig: tuple) -> list:
        """The tilings to simulate for a kernel signature (see `run`)."""
        if sig[0] == "cube":
            _, batch, m, k, n, dtype = sig[:6]
            by_roofline = cube_tile_candidates(chip, m, k, n, dtype, within=self.within)[: self.candidates + 1]
            # plus the best of auto_tune's pipe-level screen over the power-of-two tilings
            screen = screen_space(chip, m, k, n, dtype, batch=batch, full=False)
            by_screen = [screen.tile(int(i)) for i in np.argsort(screen.costs, kind="stable")[: max(1, self.candidates - 1)]]
            # simulating a tiling costs time in proportion to its instructions: the search skips
            # tilings that would issue more than twice the default's (their small tiles rarely win)
            limit = 2 * _instructions(by_roofline[0], m, k, n, batch, chip.cube_cores)
            return [t for t in dict.fromkeys(by_roofline + by_screen) if _instructions(t, m, k, n, batch,
                                                                                       chip.cube_cores) <= limit]
        _, q, kk, dtype = sig
        return attention_block_candidates(chip, q[-2], kk[-2], q[-1], dtype)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = get_chip(ctx.chip or "Ascend910B1")
        decided: dict[tuple, tuple] = {}  # kernel signature -> (choice, default us, best us)
        tuned = kept = 0
        gains: list[tuple[float, str]] = []
        for nodes in kernels_of(graph):
            cube = [n for n in nodes if n.attrs.get("unit") == "cube"]
            flash = [n for n in nodes if n.attrs.get("unit") == "composite" and n.attrs.get("flash")]
            if cube:
                anchor, attr = cube[0], "tile"
                batch, m, k, n, dtype = gemm_of(graph, anchor, chip, ctx.precision)
                sig = ("cube", batch, m, k, n, dtype, tuple(x.op for x in nodes), anchor.attrs.get("quantize_input"))
            elif flash:
                anchor, attr = flash[0], "attention_blocks"
                q, kk = _shape(graph, anchor.inputs[0]), _shape(graph, anchor.inputs[1])
                dtype = attention_dtype(anchor, chip, ctx.precision)
                sig = ("attention", q, kk, dtype)
            else:
                continue
            if sig not in decided:
                anchor.attrs.pop(attr, None)
                default_us = best_us = cost_kernel(graph, nodes, chip, ctx.precision).time_us
                best = None
                for choice in self._choices(chip, sig):
                    anchor.attrs[attr] = choice
                    t = cost_kernel(graph, nodes, chip, ctx.precision).time_us
                    if t < best_us * (1 - 1e-9):
                        best, best_us = choice, t
                decided[sig] = (best, default_us, best_us)
                if best is not None:
                    gains.append((default_us - best_us, f"{anchor.module or anchor.name}: {default_us:.1f} -> "
                                  f"{best_us:.1f} us with {best}"))
            best, default_us, best_us = decided[sig]
            if best is None:
                anchor.attrs.pop(attr, None)
                kept += 1
            else:
                anchor.attrs[attr] = best
                tuned += 1
        notes = [f"{tuned} kernels retiled, {kept} keep the default tiling ({len(decided)} distinct kernels searched)"]
        notes += [g for _, g in sorted(gains, reverse=True)[:3]]
        return PassResult(graph, modified=tuned > 0, notes=notes)
