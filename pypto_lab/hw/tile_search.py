"""The screening estimate of Cube tilings: every legal tiling of a matmul scored by an analytic
cost compiled with numba, so a search can simulate only the most promising few.

For one Cube kernel (chip, batch, M x K x N, dtype, epilogue) `screen_space`

1. enumerates the legal tilings ``m[m_l0, m_l1] k[k_l0, k_l1] n[n_l0, n_l1]`` under PyPTO's rules
   (`pypto_lab.hw.tiling.plan_cube`): multiples of the 32-byte alignment (16 elements for fp16,
   bf16 and fp32, 32 for int8), ``l1`` a multiple of ``l0``, the L0A / L0B / L0C tiles and both
   L1 panels within capacity, BiasTable / FixPipe-buffer limits for a FixPipe bias or
   quantisation on 910B. L0 sizes are the multiples of the alignment up to 16 of them, then powers
   of two; L1 sizes are 1-8, 12, 16, 24, 32, ... times the L0 size up to the first that covers
   the dimension (``full=False``: powers of two only);
2. scores every candidate: per block, the busy cycles of each pipe as the tile program issues
   them (MTE2 panel loads, re-loaded per sub-tile when K takes several panels, and HBM
   write-backs; MTE1 L0 loads; Cube MMADs with their start-up and fractal count; the L0C drain
   through FixPipe or UB and MTE3), overlapped when the buffers are double-buffered and summed
   when they are not, times the waves of blocks over the cores, bounded below by the memory
   system (HBM first touches, L2 re-reads).

It is a hardware cost estimate (it reads the chip and nothing of the compiler):
`pypto_lab.tuning.auto_tune` and the ``tune_tiling`` pass verify its best candidates with the
event simulator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from .chip import DTYPE_BYTES, PIPE_INDEX, Chip, get_chip
from .tiling import CubeTile, _operand_align, cube_fractal

# ---- the space of tilings -------------------------------------------------------------------

def _l0_values(dim: int, al: int, cap: int, pow2_only: bool) -> np.ndarray:
    top = max(al, min(cap, -(-dim // al) * al))
    vals = set()
    v = al
    while v <= top:
        vals.add(v)
        v *= 2
    if not pow2_only:
        vals.update(al * j for j in range(1, 17) if al * j <= top)
    vals.add(top)
    return np.array(sorted(vals), dtype=np.int64)


def _ratios(pow2_only: bool) -> np.ndarray:
    if pow2_only:
        return np.array([1 << i for i in range(16)], dtype=np.int64)
    r = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    while r[-1] < 1 << 16:
        r += [r[-1] * 3 // 2, r[-1] * 2]
    return np.array(r, dtype=np.int64)


@dataclass(frozen=True)
class Problem:
    """One Cube kernel's numbers for the screening cost."""

    m: int
    k: int
    n: int
    batch: int
    dtype: str
    out_dtype: str
    epilogue: str


def _chip_params(chip: Chip, p: Problem, double_buffer: bool = True) -> np.ndarray:
    """The chip constants the screening cost needs, as one float array."""
    eb = DTYPE_BYTES[p.dtype]
    ob = DTYPE_BYTES[p.out_dtype]
    acc_b = DTYPE_BYTES[chip.cube.accumulator[p.dtype]]
    m0, k0, n0 = cube_fractal(chip, p.dtype)
    gm = chip.data_path("GM_TO_L1")
    la, lb = chip.data_path("L1_TO_L0A"), chip.data_path("L1_TO_L0B")
    split = chip.split_cores
    if split:
        d1 = chip.data_path("L0C_TO_GM")
        d2 = d1
        d2_rate = 1e30
    else:
        d1 = chip.data_path("L0C_TO_UB")
        d2 = chip.data_path("UB_TO_GM")
        d2_rate = d2.bytes_per_cycle
    l2_rate = chip.l2_bytes_per_cycle()
    side = 0.0
    if "BT" in chip.buffers and p.epilogue in ("bias", "bias_relu"):
        side = chip.buffer("BT").size_bytes / 4
    if "FB" in chip.buffers and p.epilogue == "quant":
        side = chip.buffer("FB").size_bytes / 8
    return np.array([
        p.m, p.k, p.n, p.batch, eb, ob, acc_b, m0, k0, n0, chip.cube_cores, chip.cube.startup_cycles,
        gm.bytes_per_cycle, gm.startup_cycles, gm.latency_cycles,
        la.bytes_per_cycle, la.startup_cycles, lb.bytes_per_cycle, lb.startup_cycles,
        d1.bytes_per_cycle, d1.startup_cycles, d1.latency_cycles, PIPE_INDEX[d1.pipe],
        d2_rate, d2.startup_cycles, 0.0 if split else 1.0,
        l2_rate, chip.hbm_bytes_per_cycle(), chip.l2_bytes,
        chip.buffer("L1").size_bytes, chip.buffer("L0A").size_bytes, chip.buffer("L0B").size_bytes,
        chip.buffer("L0C").size_bytes, side, 1.0 if double_buffer else 0.0,
    ], dtype=np.float64)


@njit(cache=True, nogil=True, error_model="numpy")
def _cdiv(a, b):
    return -(-a // b)


@njit(cache=True, nogil=True, error_model="numpy")
def _block_pipes(bm, bn, m_l0, n_l0, k_l0, k_l1, prm):
    """Busy cycles per pipe of one bm x bn block: (MTE2 bytes read, MTE2 transfers, MTE1, CUBE,
    drain 1 (FixPipe or L0C->UB), drain 2 (MTE3), bytes written). ``prm`` is `_chip_params` as a
    tuple (no arrays in the hot loop: each one passed costs reference counting)."""
    K = int(prm[1])
    eb, ob, acc_b = prm[4], prm[5], prm[6]
    m0, k0, n0 = int(prm[7]), int(prm[8]), int(prm[9])
    cube_start = prm[11]
    subs_m = _cdiv(bm, m_l0)
    subs_n = _cdiv(bn, n_l0)
    subs = subs_m * subs_n
    k_steps = _cdiv(K, k_l1)
    loads = subs if k_steps > 1 else 1
    if k_steps > 1:  # each sub-tile streams its own rows and columns (see programs._cube_core)
        o0 = (subs_n * bm + subs_m * bn) * K * eb
    else:
        o0 = (bm + bn) * K * eb
    o1 = loads * k_steps * 2.0
    # k_l0 steps and fractals along K: full panels, then the last one
    full = K // k_l1
    rem = K - full * k_l1
    steps = full * _cdiv(k_l1, k_l0)
    kfrac = full * ((k_l1 // k_l0) * _cdiv(k_l0, k0) + _cdiv(k_l1 % k_l0, k0))
    if rem > 0:
        steps += _cdiv(rem, k_l0)
        kfrac += (rem // k_l0) * _cdiv(k_l0, k0) + _cdiv(rem % k_l0, k0)
    o2 = subs * steps * (prm[16] + prm[18]) + bm * subs_n * K * eb / prm[15] + bn * subs_m * K * eb / prm[17]
    mfrac = (bm // m_l0) * _cdiv(m_l0, m0) + _cdiv(bm % m_l0, m0)
    nfrac = (bn // n_l0) * _cdiv(n_l0, n0) + _cdiv(bn % n_l0, n0)
    o3 = subs * steps * cube_start + mfrac * nfrac * kfrac
    if prm[25] > 0:  # L0C -> UB (acc dtype), then UB -> GM on MTE3
        o4 = subs * prm[20] + bm * bn * acc_b / prm[19]
        o5 = subs * prm[24] + bm * bn * ob / prm[23]
    else:
        o4 = subs * prm[20] + bm * bn * ob / prm[19]
        o5 = 0.0
    return o0, o1, o2, o3, o4, o5, bm * bn * ob


@njit(cache=True, nogil=True, error_model="numpy")
def _tile_cost(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm):
    """Screening estimate (cycles) of one legal tiling."""
    M, K, N, B = int(prm[0]), int(prm[1]), int(prm[2]), int(prm[3])
    eb, ob, acc_b = prm[4], prm[5], prm[6]
    cores = int(prm[10])
    bmc = _cdiv(M, m_l1)
    bnc = _cdiv(N, n_l1)
    nb = B * bmc * bnc
    active = min(nb, cores)
    waves = _cdiv(nb, cores)
    em = M - (bmc - 1) * m_l1
    en = N - (bnc - 1) * n_l1
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = 0.0
    # the four kinds of block: full, last row, last column, corner
    for t in range(4):
        bm = m_l1 if t % 2 == 0 else em
        bn = n_l1 if t < 2 else en
        cnt_m = (bmc - 1) if t % 2 == 0 else 1
        cnt_n = (bnc - 1) if t < 2 else 1
        cnt = cnt_m * cnt_n
        if cnt <= 0:
            continue
        b0, b1, b2, b3, b4, b5, b6 = _block_pipes(bm, bn, m_l0, n_l0, k_l0, k_l1, prm)
        t0 += cnt * b0
        t1 += cnt * b1
        t2 += cnt * b2
        t3 += cnt * b3
        t4 += cnt * b4
        t5 += cnt * b5
        t6 += cnt * b6
    tot = (t0 * B, t1 * B, t2 * B, t3 * B, t4 * B, t5 * B, t6 * B)
    share = waves / nb  # the busiest core's part of the work
    gm_rate, gm_su, gm_lat = prm[12], prm[13], prm[14]
    l2_rate, hbm, l2_bytes = prm[26], prm[27], prm[28]
    reads = tot[0]
    first = B * (M * K + K * N) * eb
    wave_rows = min(bmc, _cdiv(2 * active, bnc) + 1)
    wave_cols = min(bnc, 2 * active)
    ws = (wave_rows * m_l1 + wave_cols * n_l1) * K * eb
    hit = min(1.0, l2_bytes / max(ws, 1.0))
    read_cycles = first / hbm + max(0.0, reads - first) * (hit / l2_rate + (1.0 - hit) / hbm)
    hbm_share = hbm / active
    mte2 = max(reads * share / gm_rate, read_cycles) + tot[1] * share * gm_su + tot[6] * share / hbm_share
    mte1 = tot[2] * share
    cube = tot[3] * share
    d1 = tot[4] * share
    d2 = tot[5] * share
    # buffers: slots per level (double buffering when two tiles fit)
    db = prm[34] > 0
    l1_two = db and 2 * (m_l1 + n_l1) * k_l1 * eb <= prm[29]
    l0_two = db and 2 * m_l0 * k_l0 * eb <= prm[30] and 2 * n_l0 * k_l0 * eb <= prm[31]
    c_two = db and 2 * m_l0 * n_l0 * acc_b <= prm[32]
    core = cube
    core = core + mte1 if not l0_two else max(core, mte1)
    core = core + d1 if not c_two else max(core, d1)
    core = max(core, d2)
    core = core + mte2 if not l1_two else max(core, mte2)
    # pipeline fill: the first panel's load and the last sub-tile's drain
    fill = gm_lat + (min(m_l1, M) + min(n_l1, N)) * min(k_l1, K) * eb / gm_rate + prm[21] \
        + min(m_l0, M) * min(n_l0, N) * ob / prm[19]
    return core + fill


@njit(cache=True, nogil=True, error_model="numpy")
def _legal(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm):
    eb, acc_b = prm[4], prm[6]
    if m_l0 * k_l0 * eb > prm[30] or n_l0 * k_l0 * eb > prm[31] or m_l0 * n_l0 * acc_b > prm[32]:
        return False
    if (m_l1 + n_l1) * k_l1 * eb > prm[29]:
        return False
    if prm[33] > 0 and n_l0 > prm[33]:
        return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _screen(vm, vk, vn, ratios, prm, dims, count_only, tiles, costs):
    """Walk the space; count legal tilings, or fill ``tiles`` / ``costs`` with them."""
    M, K, N = dims[0], dims[1], dims[2]
    c = 0
    for a in range(vm.shape[0]):
        m_l0 = vm[a]
        for b in range(vn.shape[0]):
            n_l0 = vn[b]
            if m_l0 * n_l0 * prm[6] > prm[32]:
                continue
            for d in range(vk.shape[0]):
                k_l0 = vk[d]
                if m_l0 * k_l0 * prm[4] > prm[30] or n_l0 * k_l0 * prm[4] > prm[31]:
                    break
                for rm in range(ratios.shape[0]):
                    m_l1 = m_l0 * ratios[rm]
                    if rm > 0 and m_l0 * ratios[rm - 1] >= M:
                        break
                    for rn in range(ratios.shape[0]):
                        n_l1 = n_l0 * ratios[rn]
                        if rn > 0 and n_l0 * ratios[rn - 1] >= N:
                            break
                        for rk in range(ratios.shape[0]):
                            k_l1 = k_l0 * ratios[rk]
                            if rk > 0 and k_l0 * ratios[rk - 1] >= K:
                                break
                            if not _legal(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm):
                                break  # larger k_l1 only needs more L1
                            if not count_only:
                                tiles[c, 0] = m_l0
                                tiles[c, 1] = m_l1
                                tiles[c, 2] = k_l0
                                tiles[c, 3] = k_l1
                                tiles[c, 4] = n_l0
                                tiles[c, 5] = n_l1
                                costs[c] = _tile_cost(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm)
                            c += 1
    return c


@dataclass
class Screen:
    """Every legal tiling of one kernel with its screening estimate (cycles)."""

    tiles: np.ndarray   # int64 [n, 6]: m_l0, m_l1, k_l0, k_l1, n_l0, n_l1
    costs: np.ndarray   # float64 [n]
    seconds: float

    @property
    def count(self) -> int:
        return len(self.costs)

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    def tile(self, i: int) -> CubeTile:
        return CubeTile(*(int(x) for x in self.tiles[i]))


def screen_space(chip: str | Chip, m: int, k: int, n: int, dtype: str = "fp16", batch: int = 1,
                 epilogue: str = "none", out_dtype: str | None = None, full: bool = True) -> Screen:
    """Enumerate and score every legal tiling of an ``m x k x n`` Cube kernel (``full=False``:
    powers of two only). The time covers enumeration and scoring, not numba's first compile."""
    chip = get_chip(chip)
    if out_dtype is None:
        out_dtype = "int32" if dtype == "int8" else dtype
    p = Problem(m, k, n, batch, dtype, out_dtype, epilogue)
    prm = tuple(_chip_params(chip, p).tolist())
    al = _operand_align(dtype)
    eb = DTYPE_BYTES[dtype]
    vm = _l0_values(m, al, 4096, not full)
    vn = _l0_values(n, al, 4096, not full)
    vk = _l0_values(k, al, int(chip.buffer("L0A").size_bytes // (al * eb)), not full)
    ratios = _ratios(not full)
    dims = np.array([-(-m // al) * al, -(-k // al) * al, -(-n // al) * al], dtype=np.int64)
    t0 = time.perf_counter()
    count = _screen(vm, vk, vn, ratios, prm, dims, True, np.zeros((1, 6), np.int64), np.zeros(1))
    tiles = np.zeros((count, 6), np.int64)
    costs = np.zeros(count)
    _screen(vm, vk, vn, ratios, prm, dims, False, tiles, costs)
    return Screen(tiles, costs, time.perf_counter() - t0)


def best_screened(chip: str | Chip, m: int, k: int, n: int, dtype: str = "fp16", top: int = 5) -> list[CubeTile]:
    """The ``top`` tilings by the screening estimate (no simulation)."""
    scr = screen_space(chip, m, k, n, dtype)
    return [scr.tile(int(i)) for i in np.argsort(scr.costs, kind="stable")[:top]]


__all__ = ["Problem", "Screen", "best_screened", "screen_space"]
