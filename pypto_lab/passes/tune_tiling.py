"""Tiling search: pick, per kernel, the tile shapes the simulator says are fastest.

The default tilings come from a per-block roofline estimate (`cube_tile_candidates` ranks every
legal Cube tiling by it; FlashAttention takes the first block size of its ladder that fits
double-buffered). The estimate sees neither pipeline start-up, the epilogue, L2 behaviour nor
the online-softmax steps, so this pass simulates the default and the next ``candidates`` tilings
by estimate of every Cube kernel (those estimated within 25 % of the best), and every legal (block_q, block_k) of every fused attention,
and keeps the fastest in ``attrs["tile"]`` / ``attrs["attention_blocks"]``. It never keeps a
tiling slower than the default. Identical kernels (ResNet's repeated bottlenecks, BERT's layers)
are searched once. Vector kernels keep their default tiles (one tile shape per UB budget).
"""

from __future__ import annotations

from ..graph import Graph
from ..hw.attention import attention_block_candidates
from ..hw.chip import get_chip
from ..hw.tiling import cube_tile_candidates
from ..model_cost import _shape, attention_dtype, cost_kernel, gemm_of, kernels_of
from .base import Pass, PassContext, PassResult, register


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
            _, _, m, k, n, dtype = sig[:6]
            return cube_tile_candidates(chip, m, k, n, dtype, within=self.within)[: self.candidates + 1]
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
