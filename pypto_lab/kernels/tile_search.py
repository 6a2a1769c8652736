"""The tile search of a kernel spec: simulate candidate tilings with the spec's coster and keep the
fastest, never one slower than the tiling the spec already has.

One search for every caller: the ``tune_tiling`` pass (level 3), ``auto_tune`` and a training
step's kernels. What differs is only the list of candidates:

* `candidate_tilings` (the ``tune_tiling`` pass and training): for a Cube kernel, the default and
  the next ``candidates`` tilings by the roofline estimate (those estimated within ``within`` of
  the best, `pypto_lab.hw.tiling.cube_tile_candidates`) and the best ``candidates - 1`` of the
  pipe-level screen over the power-of-two tilings (`pypto_lab.hw.tile_search.screen_space`),
  skipping tilings that would issue more than twice the default's instructions (to keep the
  search fast); for a fused attention, every legal (block_q, block_k);
* ``auto_tune``'s screened and seeded order over the whole space (`pypto_lab.tools.tuning`),
  searched with early stopping.

`search_tiling` simulates them in order: a candidate equal to the spec's own tiling or illegal
for it (`pypto_lab.hw.tiling.plan_cube`) is skipped; one is kept only when the simulator says it
beats the best so far by more than a relative 1e-9.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ..hw.attention import attention_block_candidates
from ..hw.chip import Chip
from ..hw.tile_search import screen_space
from ..hw.tiling import CubeTile, TilingError, cube_tile_candidates, plan_cube
from .cost import KernelCost, cost
from .ir import AttentionKernel, CubeKernel, KernelSpec


def _instructions(tile: CubeTile, spec: CubeKernel, cores: int) -> float:
    """Cube instructions one core issues with ``tile`` (blocks per core x L0C sub-tiles x K steps)."""
    blocks = spec.batch * -(-spec.m // tile.m_l1) * -(-spec.n // tile.n_l1)
    subtiles = -(-tile.m_l1 // tile.m_l0) * -(-tile.n_l1 // tile.n_l0)
    return -(-blocks // cores) * subtiles * -(-spec.k // tile.k_l0)


def candidate_tilings(chip: Chip, spec: KernelSpec, candidates: int = 3, within: float = 1.25) -> list:
    """The tilings (Cube: `CubeTile`s; fused attention: (block_q, block_k) pairs) worth simulating
    for ``spec`` (see the module docstring); [] for a kernel kind with no tiling to choose."""
    if isinstance(spec, CubeKernel):
        by_roofline = cube_tile_candidates(chip, spec.m, spec.k, spec.n, spec.dtype, within=within)[: candidates + 1]
        screen = screen_space(chip, spec.m, spec.k, spec.n, spec.dtype, batch=spec.batch, full=False)
        by_screen = [screen.tile(int(i)) for i in np.argsort(screen.costs, kind="stable")[: max(1, candidates - 1)]]
        # simulating a tiling costs time in proportion to its instructions: the search skips
        # tilings that would issue more than twice the default's (their small tiles rarely win)
        limit = 2 * _instructions(by_roofline[0], spec, chip.cube_cores)
        return [t for t in dict.fromkeys(by_roofline + by_screen) if _instructions(t, spec, chip.cube_cores) <= limit]
    if isinstance(spec, AttentionKernel) and spec.flash and not spec.backward:   # the backward: CANN's fixed block
        return attention_block_candidates(chip, spec.s_q, spec.s_k, spec.d, spec.dtype)
    return []


def tiling_of(spec: KernelSpec):
    """The tiling a spec carries (None: the chip's default)."""
    if isinstance(spec, CubeKernel):
        return spec.tile
    if isinstance(spec, AttentionKernel):
        return (spec.block_q, spec.block_k) if spec.block_q is not None else None
    return None


def with_tiling(spec: KernelSpec, choice) -> KernelSpec:
    """``spec`` with tiling ``choice`` (None: the chip's default)."""
    if isinstance(spec, CubeKernel):
        return replace(spec, tile=choice)
    return replace(spec, block_q=choice[0] if choice else None, block_k=choice[1] if choice else None)


@dataclass(frozen=True)
class TileChoice:
    """What a search found: the tiling to keep (None: the spec's own stays), the spec's own cost
    and the kept one's (the same object when nothing beat it), and how many candidates were
    simulated."""

    tile: object
    default: KernelCost
    best: KernelCost
    trials: int


def search_tiling(spec: KernelSpec, chip: Chip, candidates: Iterable, patience: int | None = None) -> TileChoice:
    """Simulate ``spec`` with each of ``candidates`` in order and keep the fastest that beats the
    spec's own tiling; ``patience``: stop after that many simulations in a row without a gain."""
    default = best = cost(spec, chip)
    current = tiling_of(spec)
    kept = None
    trials = stale = 0
    for choice in candidates:
        if choice == current:
            continue
        if isinstance(spec, CubeKernel):
            try:
                plan_cube(chip, choice, spec.dtype, spec.m, spec.k, spec.n, True, spec.epilogue)
            except TilingError:
                continue
        c = cost(with_tiling(spec, choice), chip)
        trials += 1
        if c.time_us < best.time_us * (1 - 1e-9):
            kept, best, stale = choice, c, 0
        else:
            stale += 1
        if patience is not None and stale >= patience:
            break
    return TileChoice(kept, default, best, trials)


__all__ = ["TileChoice", "candidate_tilings", "search_tiling", "tiling_of", "with_tiling"]
