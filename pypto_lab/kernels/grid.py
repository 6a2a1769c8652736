"""The grid strategy of costing: a spec whose sizes vary from step to step (an LLM's tokens per
step, its context length, the experts a batch touches) costed from exact costs at the points of a
geometric grid, linearly interpolated in between. ``cost(spec, chip, strategy="grid")`` calls it.

Kernel time is piecewise linear in a size once tiles are full, so a grid keeps the number of
distinct simulations small: a model is costed at every batch and context length in seconds.

* a Cube kernel: in M, four points per octave (exact up to 64, multiples of 16 above); beyond
  `LONG_M` rows linear in M (more waves of identical blocks); with more than four batch entries
  (a GroupedMatmul over the experts a step touches) also in the batch, two points per octave;
* a Vector kernel (and MoeGatingTopK): in its number of rows, four points per octave; linear
  beyond `LONG_VECTOR` elements (identical tiles dealt round-robin to the cores);
* fused attention: in (batch x heads, s_q, s_k), two points per octave each; at a grid point,
  many heads are costed from fewer (`waves`): the kernel deals its (head, query block) tiles
  round-robin to the cube cores and every tile of a shape costs the same, so beyond sixteen tiles
  per core the time grows with the tiles per core;
* causal FlashAttention (PromptFlashAttention) and IncreFlashAttention: their derivations
  (`attention.py`) over the grid cost of the fused attention they are built on.

Other kinds are costed exactly. Grid points are memoised with the chip's other costs.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools

from ..hw.attention import default_attention_blocks
from ..hw.chip import Chip
from .attention import causal_attention, incre_attention
from .cost import STRATEGIES, KernelCost, cost, memo_of
from .ir import (
    AttentionKernel,
    CubeKernel,
    IncreAttentionKernel,
    KernelSpec,
    MoeGatingKernel,
    VectorKernel,
)

LONG_M = 16384            # beyond this many rows a matmul's time is taken as linear in m (tests check it)
LONG_VECTOR = 1 << 22     # beyond this many elements a vector kernel's time is taken as linear (tests check it)


@functools.lru_cache(maxsize=64)
def _grid(per_octave: int, floor: int) -> tuple[int, ...]:
    """The grid above ``floor``: 2^(j / per_octave) rounded to a multiple of 16, up to 2^31."""
    pts = {floor}
    for j in range(per_octave * 31 + 1):
        v = 16 * round(2 ** (j / per_octave) / 16)
        if v > floor:
            pts.add(v)
    return tuple(sorted(pts))


def grid_points(x: int, per_octave: int = 4, floor: int = 64) -> tuple[int, int]:
    """The two grid points around ``x`` (equal when ``x`` is on the grid): exact up to ``floor``,
    then ``per_octave`` geometric points per doubling, rounded to multiples of 16. A grid point's
    own neighbours are itself, so interpolation never recurses."""
    if x <= floor:
        return x, x
    g = _grid(per_octave, floor)
    i = bisect.bisect_left(g, x)
    if i < len(g) and g[i] == x:
        return x, x
    return g[i - 1], g[min(i, len(g) - 1)]


def interpolated(fn, x: int, per_octave: int = 4, floor: int = 64) -> KernelCost:
    """``fn(x)`` from ``fn`` at the grid points around ``x``."""
    lo, hi = grid_points(int(x), per_octave, floor)
    if lo == hi:
        return fn(lo)
    return KernelCost.lerp(fn(lo), fn(hi), (x - lo) / (hi - lo))


def _cube(spec: CubeKernel, chip: Chip) -> KernelCost:
    if spec.batch > 4 and grid_points(spec.batch, 2, 4)[0] != spec.batch:
        return interpolated(lambda b: _cube(dataclasses.replace(spec, batch=b), chip), spec.batch, 2, 4)

    def at(m: int) -> KernelCost:
        return cost(dataclasses.replace(spec, m=m), chip)
    if spec.m > LONG_M:
        return at(LONG_M).scaled(spec.m / LONG_M)
    return interpolated(at, spec.m)


def _rows(numel: int, row_len: int | None) -> tuple[int, int]:
    rl = int(row_len or 1)
    return max(1, -(-int(numel) // rl)), rl


def _vector(spec: VectorKernel, chip: Chip) -> KernelCost:
    rows, rl = _rows(spec.numel, spec.row_len)

    def at(r: int) -> KernelCost:
        return cost(dataclasses.replace(spec, numel=r * rl), chip)
    long_rows = max(1, LONG_VECTOR // rl)
    if rows > long_rows:
        return at(long_rows).scaled(rows / long_rows)
    return interpolated(at, rows)


def _gating(spec: MoeGatingKernel, chip: Chip) -> KernelCost:
    def at(t: int) -> KernelCost:
        return cost(dataclasses.replace(spec, tokens=t), chip)
    long_rows = max(1, LONG_VECTOR // spec.experts)
    if spec.tokens > long_rows:
        return at(long_rows).scaled(spec.tokens / long_rows)
    return interpolated(at, spec.tokens)


def waves(spec: AttentionKernel, chip: Chip) -> KernelCost:
    """Fused attention over many heads from a cost of fewer (see the module docstring): a head
    count whose tiles fill the cores evenly (at least eight per core), scaled by the ratio of
    tiles per core (within 10 % of the full simulation on the LLM shapes of tests/test_llm_engine.py)."""
    bh = spec.batch_heads
    bq, _ = default_attention_blocks(chip, spec.s_q, spec.s_k, spec.d, spec.dtype)
    nq, cores = -(-spec.s_q // bq), chip.cube_cores
    if bh * nq <= 16 * cores:
        return cost(spec, chip)
    small = next(b for b in range(1, bh + 1) if b * nq >= 8 * cores and (b * nq) % cores == 0 or b == bh)
    if small == bh:
        return cost(spec, chip)
    memo = memo_of(chip)
    key = ("waves", spec)
    hit = memo.get(key)
    if hit is None:
        r = cost(dataclasses.replace(spec, batch_heads=small), chip)
        per_core = -(-bh * nq // cores) / (small * nq // cores)
        tiles = bh / small
        hit = memo[key] = KernelCost(r.cycles * per_core, r.time_us * per_core, r.gm_bytes * tiles, r.tile,
                                     r.reports, r.resources, r.flops * tiles, r.bound, r.hbm_bytes * tiles)
    return hit


def _attention(spec: AttentionKernel, chip: Chip) -> KernelCost:
    if not spec.flash or spec.block_q is not None:
        return cost(spec, chip)
    if spec.causal:
        return causal_attention(spec, chip, lambda a: _attention(a, chip))

    def at(b: int, q: int, k: int) -> KernelCost:
        return waves(dataclasses.replace(spec, batch_heads=b, s_q=q, s_k=k), chip)
    return interpolated(lambda b: interpolated(lambda q: interpolated(
        lambda k: at(b, q, k), spec.s_k, 2), spec.s_q, 2), spec.batch_heads, 2, 16)


def grid_cost(spec: KernelSpec, chip: Chip) -> KernelCost:
    """The cost of ``spec`` on ``chip`` under the grid strategy (see the module docstring)."""
    if isinstance(spec, CubeKernel):
        return _cube(spec, chip)
    if isinstance(spec, VectorKernel):
        return _vector(spec, chip)
    if isinstance(spec, MoeGatingKernel):
        return _gating(spec, chip)
    if isinstance(spec, AttentionKernel):
        return _attention(spec, chip)
    if isinstance(spec, IncreAttentionKernel):
        return incre_attention(spec, lambda a: _attention(a, chip))
    return cost(spec, chip)


STRATEGIES["grid"] = grid_cost

__all__ = ["LONG_M", "LONG_VECTOR", "grid_cost", "grid_points", "interpolated", "waves"]
