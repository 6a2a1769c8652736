"""Simulated kernel times for LLM shapes, memoised and interpolated so that one model can be costed
at every batch and context length in a few seconds.

Each function here runs the chip model (`hw.kernels.simulate_matmul`, `simulate_vector`,
`hw.attention.simulate_attention`) at a shape and keeps the `KernelReport`. A size that varies
from step to step (tokens in a batch, context length) is simulated only at the points of a
geometric grid (four points per octave for matmuls and vector kernels, two for attention;
multiples of 16 above 64) and linearly interpolated in between: kernel time is piecewise linear in M and in context length once tiles are full, and the
grid keeps the number of distinct simulations small. Exact sizes are simulated when they are on
the grid or at most 64.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from ..hw.attention import default_attention_blocks, simulate_attention
from ..hw.chip import Chip
from ..hw.kernels import VectorOp, simulate_matmul, simulate_vector

_CACHE: dict[tuple, Cost] = {}
_FINGERPRINTS: dict[int, tuple[Chip, str]] = {}


def _fp(chip: Chip) -> str:
    """The chip's fingerprint, computed once per chip object (it hashes every constant)."""
    hit = _FINGERPRINTS.get(id(chip))
    if hit is None or hit[0] is not chip:
        hit = _FINGERPRINTS[id(chip)] = (chip, chip.fingerprint)
    return hit[1]


@dataclass(frozen=True)
class Cost:
    """What one kernel costs: time, bytes moved between HBM and the cores, flops, and its bound."""

    time_us: float
    gm_bytes: float
    flops: float
    bound: str
    unit: str
    hbm_bytes: float = 0.0      # the bytes that must cross HBM at least (each operand once)

    def scaled(self, f: float) -> Cost:
        return Cost(self.time_us * f, self.gm_bytes * f, self.flops * f, self.bound, self.unit, self.hbm_bytes * f)

    @staticmethod
    def lerp(a: Cost, b: Cost, t: float) -> Cost:
        return Cost(a.time_us + (b.time_us - a.time_us) * t, a.gm_bytes + (b.gm_bytes - a.gm_bytes) * t,
                    a.flops + (b.flops - a.flops) * t, b.bound if t >= 0.5 else a.bound, a.unit,
                    a.hbm_bytes + (b.hbm_bytes - a.hbm_bytes) * t)


def _of(r) -> Cost:
    return Cost(float(r.time_us), float(r.gm_bytes), float(r.flops), str(r.bound), str(r.unit),
                float(getattr(r, "min_gm_bytes", 0.0) or r.gm_bytes))


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


def interpolated(fn, x: int, per_octave: int = 4, floor: int = 64) -> Cost:
    """``fn(x)`` from ``fn`` at the grid points around ``x``."""
    lo, hi = grid_points(int(x), per_octave, floor)
    if lo == hi:
        return fn(lo)
    a, b = fn(lo), fn(hi)
    return Cost.lerp(a, b, (x - lo) / (hi - lo))


def _memo(key: tuple, make) -> Cost:
    c = _CACHE.get(key)
    if c is None:
        c = _CACHE[key] = make()
    return c


LONG_M = 16384            # beyond this many rows a matmul's time is taken as linear in m (tests check it)
LONG_VECTOR = 1 << 22     # beyond this many elements a vector kernel's time is taken as linear (tests check it)


def matmul(chip: Chip, m: int, k: int, n: int, dtype: str, batch: int = 1, epilogue: str = "none") -> Cost:
    """A Cube matmul ``[batch x] m x k @ k x n``, interpolated in m."""
    def at(mm: int) -> Cost:
        return _memo(("mm", _fp(chip), mm, k, n, dtype, batch, epilogue),
                     lambda: _of(simulate_matmul(mm, k, n, dtype, chip, batch=batch, epilogue=epilogue)))
    if batch > 4 and grid_points(batch, 2, 4)[0] != batch:
        # GroupedMatmul over a varying number of experts: interpolated between expert counts
        return interpolated(lambda b: matmul(chip, m, k, n, dtype, b, epilogue), batch, 2, 4)
    if m > LONG_M:
        # rows beyond LONG_M add whole waves of identical blocks over the cores: linear in m
        return at(LONG_M).scaled(m / LONG_M)
    return interpolated(at, m)


def matmul_w8a16(chip: Chip, m: int, k: int, n: int, batch: int = 1) -> Cost:
    """Weight-only int8 (WeightQuantBatchMatmul): int8 weights cross HBM and are dequantised on the
    way into the Cube, which then runs at its fp16 rate. Its time is the larger of the int8 kernel
    (the bytes) and the fp16 flops at the Cube's fp16 peak (the compute)."""
    i8 = matmul(chip, m, k, n, "int8", batch)
    compute_us = 2.0 * m * k * n * batch / (chip.peak_tflops("fp16") * 1e6)
    if compute_us <= i8.time_us:
        return i8
    return Cost(compute_us, i8.gm_bytes, i8.flops, "compute", "cube", i8.hbm_bytes)


def vector(chip: Chip, op: str | VectorOp, numel: int, dtype: str, row_len: int | None = None,
           key: str | None = None) -> Cost:
    """A Vector kernel over ``numel`` elements (rows of ``row_len`` for row-wise ops), interpolated
    in the number of rows."""
    rl = int(row_len or 1)
    rows = max(1, -(-int(numel) // rl))
    name = key or (op if isinstance(op, str) else repr(op))

    def at(r: int) -> Cost:
        return _memo(("vec", _fp(chip), name, r, rl, dtype),
                     lambda: _of(simulate_vector(op, r * rl, dtype, chip, row_len=row_len)))
    long_rows = max(1, LONG_VECTOR // rl)
    if rows > long_rows:
        # a vector kernel streams identical tiles round-robin over the cores: linear beyond this
        return at(long_rows).scaled(rows / long_rows)
    return interpolated(at, rows)


def _waves(chip: Chip, bh: int, s_q: int, s_k: int, d: int, dtype: str) -> Cost:
    """Fused attention over many heads from a simulation of fewer: the kernel deals its
    (head, query block) tiles round-robin to the cube cores, each core runs its tiles one after
    another, and every tile of a shape costs the same. So beyond sixteen tiles per core the time
    grows with the tiles per core: simulate a head count whose tiles fill the cores evenly (at
    least eight per core) and scale by the ratio of tiles per core (within 10% of the full
    simulation on the LLM shapes checked in tests/test_llm_engine.py)."""
    bq, _ = default_attention_blocks(chip, s_q, s_k, d, dtype)
    nq, cores = -(-s_q // bq), chip.cube_cores
    if bh * nq <= 16 * cores:
        return _of(simulate_attention(bh, s_q, s_k, d, dtype, chip))
    small = next(b for b in range(1, bh + 1) if b * nq >= 8 * cores and (b * nq) % cores == 0 or b == bh)
    if small == bh:
        return _of(simulate_attention(bh, s_q, s_k, d, dtype, chip))
    r = _of(simulate_attention(small, s_q, s_k, d, dtype, chip))
    waves = -(-bh * nq // cores) / (small * nq // cores)
    tiles = bh / small
    return Cost(r.time_us * waves, r.gm_bytes * tiles, r.flops * tiles, r.bound, r.unit, r.hbm_bytes * tiles)


def _attention(chip: Chip, bh: int, s_q: int, s_k: int, d: int, dtype: str) -> Cost:
    """Fused attention, interpolated in (batch x heads, s_q, s_k) on a grid of two points per
    octave (attention simulations are the engine's slowest; time is near linear in each)."""
    def at(b: int, q: int, k: int) -> Cost:
        return _memo(("attn", _fp(chip), b, q, k, d, dtype), lambda: _waves(chip, b, q, k, d, dtype))
    return interpolated(lambda b: interpolated(lambda q: interpolated(
        lambda k: at(b, q, k), s_k, 2), s_q, 2), bh, 2, 16)


def prompt_flash_attention(chip: Chip, seqs: int, heads: int, s_q: int, past: int, d: int, dtype: str) -> Cost:
    """PromptFlashAttention: causal attention of ``s_q`` new tokens over ``past + s_q`` keys, for
    ``seqs`` sequences of ``heads`` heads. The fused kernel is simulated without a mask; causal
    block skipping then keeps the (query block, key block) pairs at or below the diagonal, which
    the chip's default block sizes give."""
    s_k = past + s_q
    full = _attention(chip, seqs * heads, s_q, s_k, d, dtype)
    bq, bk = default_attention_blocks(chip, s_q, s_k, d, dtype)[:2]
    nq, nk = -(-s_q // bq), -(-s_k // bk)
    kept = sum(min(nk, -(-(past + (i + 1) * bq) // bk)) for i in range(nq))
    return full.scaled(kept / (nq * nk))


def incre_flash_attention(chip: Chip, seqs: int, kv_heads: int, group: int, context: int, d: int, dtype: str,
                          kv_dtype: str = "fp16") -> Cost:
    """IncreFlashAttention / PagedAttention for one decode step: each sequence's ``group`` query
    heads that share a KV head attend over its ``context`` cached tokens (GQA packs them as the
    rows of one block, so the KV cache is read once per KV head). With an int8 KV cache a
    memory-bound kernel reads half the bytes (its dequantisation is not charged)."""
    c = _attention(chip, seqs * kv_heads, group, max(1, context), d, dtype)
    if kv_dtype == "int8" and c.bound == "memory":
        return Cost(c.time_us / 2, c.gm_bytes / 2, c.flops, c.bound, c.unit, c.hbm_bytes / 2)
    return c


def cache_size() -> int:
    return len(_CACHE)


def clear_cache() -> None:
    _CACHE.clear()


__all__ = ["Cost", "cache_size", "clear_cache", "grid_points", "incre_flash_attention", "interpolated", "matmul",
           "matmul_w8a16", "prompt_flash_attention", "vector"]
