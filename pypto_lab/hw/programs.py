"""Tile-program building blocks, shared by the Cube and Vector kernels (`pypto_lab.hw.kernels`),
FlashAttention (`pypto_lab.hw.attention`) and the pto compiler's Execute Graph
(`pypto_lab.pto.schedule`).

* How cores see the memory system: `gm_rates` (the read, write and HBM rates of one core) and
  `flush_writebacks` (HBM write-backs of written bytes, accounted on the core's MTE2 lane).
* Emitting into a `Program`: `move` (a transfer on its data path's pipe), `emit_repeats` (a
  vector instruction split at ``repeatTimes <= 255``), `emit_vector_ops` (a list of vector
  instructions over a tile), `mmad_loop` (MTE1 loads L1 -> L0A/L0B and MMADs into one L0C tile).
* `CubeProgram`: the whole program of one cube core (GM -> L1 -> L0A/L0B -> Cube -> L0C, then the
  FixPipe or Vector epilogue, with ping-pong slots and write-backs), compiled with numba and
  built as plain arrays. `simulate_matmul` builds one per distinct block list and places it on
  the cores (`place_on_cube_cores`); the pto compiler appends it to its Execute Graph with a
  per-block bias load and a barrier. `mmad_loop` runs the same compiled MMAD loop.

Compiled code sees a program as arrays: per instruction its core, pipe, kind id, duration and
latency, and its dependencies (-1: none); a buffer's ping-pong slots as ``[next slot, last
reader of each slot]`` (`pypto_lab.hw.simulator.PingPong.state`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .capabilities import NO_EPILOGUE, Epilogue
from .chip import DTYPE_BYTES, PIPE_INDEX, Chip, DataPath
from .simulator import (
    KIND_DTYPE,
    InstructionLimitError,
    PingPong,
    Program,
    ProgramArrays,
    SimulatedProgram,
    Timeline,
    simulate_placed,
)
from .tiling import CubeTile, ceil_div, cube_fractal

# Instructions one simulate_matmul may simulate (its distinct per-core programs, before replication
# over the cores). Simulated as they are built, they take 8 bytes each (when each result is
# ready), so this bounds the simulation near 400 MB; a timeline's rows are laid out only on demand
# (`pypto_lab.hw.simulator.MAX_TIMELINE_ROWS`).
MAX_SIMULATED_INSTRUCTIONS = 50_000_000

_VECTOR = PIPE_INDEX["VECTOR"]
_MTE2 = PIPE_INDEX["MTE2"]
_CUBE = PIPE_INDEX["CUBE"]


# ---- the memory system as one core sees it ----------------------------------------------------

def gm_rates(chip: Chip, reads: float, first_reads: float, busiest_reads: float, active: int,
             working_set: float | None = None, l2_first: float = 0.0,
             hbm_writes: float = 0.0) -> tuple[float, float, float]:
    """How ``active`` cores share the chip's memory system: (read rate, write rate, HBM share),
    bytes per cycle of one core.

    * Reads: HBM carries the first touch of every input byte (``first_reads``), except the
      ``l2_first`` bytes of it an earlier kernel left in L2 (residency between operators,
      `pypto_lab.hw.l2_residency`), which come from L2; re-reads come from
      L2 when the data the cores reuse at one time (``working_set``, default ``first_reads``) fits
      in L2, else in proportion to the fraction that fits. The time the memory system needs for
      all ``reads`` is the time the busiest core needs for its ``busiest_reads``, so every core
      reads at that rate (lighter cores finish earlier).
    * Writes land in L2 at the core's share of L2 bandwidth, in bursts (one output tile at a time).
    * Written bytes still reach HBM: each write is followed by a write-back that holds the core's
      MTE2 lane (its read port) for ``bytes / HBM share`` (`flush_writebacks`). So reads and
      write-backs take turns on HBM, and no kernel moves its bytes faster than HBM and L2 allow.
    * HBM itself runs slower when the kernel's DRAM traffic mixes reads with the ``hbm_writes``
      bytes that reach it (`Chip.hbm_stream_efficiency`).
    """
    ws = first_reads if working_set is None else working_set
    hit = min(1.0, chip.l2_bytes / max(ws, 1.0))
    rereads = max(0.0, reads - first_reads)
    kept = min(max(l2_first, 0.0), first_reads)
    hbm = chip.hbm_bytes_per_cycle() * chip.hbm_stream_efficiency(first_reads - kept, hbm_writes)
    read_cycles = ((first_reads - kept) / hbm + kept / chip.l2_bytes_per_cycle()
                   + rereads * (hit / chip.l2_bytes_per_cycle() + (1 - hit) / hbm))
    return busiest_reads / max(read_cycles, 1e-9), chip.l2_bytes_per_cycle() / active, hbm / active


def split_blocks(n_blocks: int, n_cores: int) -> list[list[int]]:
    """Blocks dealt round-robin to cores, as a kernel's block_idx loop does."""
    cores = min(n_blocks, n_cores)
    return [list(range(c, n_blocks, n_cores)) for c in range(cores)]


# ---- emitting into a Program ------------------------------------------------------------------

def move(prog: Program, core: int, path: DataPath, nbytes: float, kind: str, deps, rate_cap: float | None = None) -> int:
    """Emit one transfer on its path's pipe: busy for startup + bytes/rate, ready after its latency."""
    return prog.emit(core, path.pipe, path.occupancy(nbytes, rate_cap), kind, deps, path.latency_cycles)


def flush_writebacks(prog: Program, core: int, pending: list, hbm_share: float) -> None:
    """Issue the HBM write-backs of finished output tiles on the core's MTE2 lane.

    Written bytes land in L2; L2 writes them back to HBM with the core's share of HBM bandwidth,
    which the core's reads cannot use meanwhile: the write-back holds the read port (MTE2) for
    ``bytes / HBM share`` cycles. It is an account of HBM time rather than a transfer of its own,
    so it waits for no flag; the tile programs issue it after the next loads, so it lands between
    reads, not ahead of the write it accounts for.
    """
    for nbytes in pending:
        prog.emit(core, "MTE2", nbytes / hbm_share, "HBM write-back")
    pending.clear()


def emit_repeats(prog: Program, core: int, chip: Chip, instr: str, timing, repeats: int, deps=()) -> int:
    """One vector instruction over ``repeats`` repeats, issued as several instructions of at most
    ``max_repeats`` each (Ascend C's repeatTimes <= 255); the first waits on ``deps``. Returns the
    last one's index."""
    last = None
    pending = tuple(deps)
    left = repeats
    while left > 0:
        r = min(left, chip.vector.max_repeats)
        last = prog.emit(core, "VECTOR", timing.cycles(r), instr, pending)
        pending = ()
        left -= r
    return last


def dtypes_key(instr: str, dtype: str) -> str:
    """The key of ``instr``'s timing for data of ``dtype`` (VCONV: the cast down to fp16, or fp16 -> fp32)."""
    d = dtype.upper()
    if instr in ("VCONV",):
        return f"{d}_FP16" if dtype != "fp16" else "FP16_FP32"
    return d


_TIMINGS: dict = {}  # (id(vector unit), instruction, dtype) -> (vector unit, its timing): lookups are hot


def emit_vector_ops(prog: Program, core: int, chip: Chip, ops, elems: int, dtype: str, deps) -> int:
    """Emit the vector instructions ``ops`` ((instruction, passes), ...) that process ``elems``
    elements of ``dtype``; the first waits on ``deps``. Returns the last index.

    Each instruction covers at most ``max_repeats`` repeats of ``repeat_bytes``; longer tiles are
    issued as several instructions, as Ascend C's repeatTimes <= 255 requires.
    """
    eb = DTYPE_BYTES[dtype]
    vector = chip.vector
    repeats_total = max(1, ceil_div(int(elems * eb), vector.repeat_bytes))
    last = None
    pending = tuple(deps)
    for instr, passes in ops:
        hit = _TIMINGS.get((id(vector), instr, dtype))
        if hit is None or hit[0] is not vector:
            hit = _TIMINGS[(id(vector), instr, dtype)] = (vector, vector.timing(instr, dtypes_key(instr, dtype)))
        timing = hit[1]
        for _ in range(int(passes)):
            last = emit_repeats(prog, core, chip, instr, timing, repeats_total, pending)
            pending = ()
    return last if last is not None else (deps[0] if deps else -1)


# ---- compiled building blocks ----------------------------------------------------------------------
# error_model="numpy": no division-by-zero checks (rates and tile sizes are positive; the checks
# would cost ten times the loop).
# buf = (core int32, pipe int8, kind int32, duration f8, latency f8, dep_ptr int64 [cap + 1], dep_idx int64,
#        lane_free f8 [lanes], busy f8 [lanes], ready f8 [cap], total f8 [1], first use int64 [kinds])
# Past the capacity of the first seven an instruction is only counted; within the capacity of
# ``ready`` it is also simulated as it is emitted (the event loop of `pypto_lab.hw.simulator._run`,
# step for step), so a program can be simulated without storing it.
# cnt = [instructions, dependencies, index of the first instruction in the program it extends]
# A path is a row (pipe, bytes per cycle, startup cycles, latency cycles).

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _put(buf, cnt, core, pipe, kind, dur, lat, d0, d1, d2, d3):
    """Append one instruction (store, simulate, or only count it); returns its index."""
    i = cnt[0]
    nd = cnt[1]
    if i < buf[0].shape[0]:
        buf[0][i] = core
        buf[1][i] = pipe
        buf[2][i] = kind
        buf[3][i] = dur
        buf[4][i] = lat
        idx = buf[6]
        if d0 >= 0:
            idx[nd] = d0
            nd += 1
        if d1 >= 0:
            idx[nd] = d1
            nd += 1
        if d2 >= 0:
            idx[nd] = d2
            nd += 1
        if d3 >= 0:
            idx[nd] = d3
            nd += 1
        buf[5][i + 1] = nd
    else:
        nd += (d0 >= 0) + (d1 >= 0) + (d2 >= 0) + (d3 >= 0)
    ready = buf[9]
    if i < ready.shape[0]:  # simulate: start when the pipe is free and every dependency is ready
        lane = core * 7 + pipe
        t = buf[7][lane]
        if d0 >= 0 and ready[d0] > t:
            t = ready[d0]
        if d1 >= 0 and ready[d1] > t:
            t = ready[d1]
        if d2 >= 0 and ready[d2] > t:
            t = ready[d2]
        if d3 >= 0 and ready[d3] > t:
            t = ready[d3]
        buf[7][lane] = t + dur
        buf[8][lane] += dur
        r = t + (dur if dur > lat else lat)
        ready[i] = r
        if r > buf[10][0]:
            buf[10][0] = r
        if buf[11][kind] < 0:
            buf[11][kind] = i
    cnt[0] = i + 1
    cnt[1] = nd
    return cnt[2] + i


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _move(buf, cnt, core, path, nbytes, kind, rate_cap, d0, d1, d2):
    """A transfer: busy startup + bytes / min(rate, cap), ready after the path's latency."""
    rate = path[1] if path[1] < rate_cap else rate_cap
    return _put(buf, cnt, core, int(path[0]), kind, path[2] + nbytes / rate, path[3], d0, d1, d2, -1)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _acquire(pp):
    """A ping-pong slot: (slot, the instruction that must end before it is overwritten, or -1)."""
    slot = pp[0]
    pp[0] = (slot + 1) % (pp.shape[0] - 1)
    return slot, pp[1 + slot]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _repeats(buf, cnt, core, op, repeats, max_repeats, d0, d1, d2):
    """A vector instruction over ``repeats`` repeats in pieces of at most ``max_repeats``; ``op`` is
    (cycles per repeat, startup, minimum, partial-block cycles, block repeats, kind)."""
    last = -1
    left = repeats
    while left > 0:
        r = left if left < max_repeats else max_repeats
        base = op[2]
        t = op[1] + r * op[0]
        if t > base:
            base = t
        cyc = base + (op[3] if r % int(op[4]) != 0 else 0.0)
        last = _put(buf, cnt, core, _VECTOR, int(op[5]), cyc, 0.0, d0, d1, d2, -1)
        d0 = d1 = d2 = -1
        left -= r
    return last


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _vector_ops(buf, cnt, core, ops, elems, eb, repeat_bytes, max_repeats, chain, d0, d1, d2):
    """The vector instructions ``ops`` (one row per pass) over ``elems`` elements of ``eb`` bytes;
    the first waits on d0..d2, the others only on the pipe (or, ``chain``, on the one before)."""
    nbytes = int(elems * eb)
    reps = max(1, -(-nbytes // repeat_bytes))
    last = -1
    for i in range(ops.shape[0]):
        if i == 0:
            last = _repeats(buf, cnt, core, ops[i], reps, max_repeats, d0, d1, d2)
        elif chain:
            last = _repeats(buf, cnt, core, ops[i], reps, max_repeats, last, -1, -1)
        else:
            last = _repeats(buf, cnt, core, ops[i], reps, max_repeats, -1, -1, -1)
    return last if ops.shape[0] else d0


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _mmad_loop(buf, cnt, core, m, k, n, kc, a_ready0, a_ready1, b_ready, l0a, l0b, first0, first1,
               kinds, frac, eb, cube_start, path_a, path_b):
    """MMADs of an ``m x k x n`` product into one L0C tile, the contraction in ``kc`` chunks: per
    chunk MTE1 moves A L1 -> L0A and B L1 -> L0B into ping-pong slots, then one MMAD (the Cube's
    start-up plus one cycle per fractal). The first MMAD also waits on ``first0``, ``first1`` (the
    L0C slot, a bias). ``kinds`` = (load A, load B, mmad). Returns (last A move, last B move,
    last MMAD)."""
    mv_a = mv_b = mm = -1
    inf = np.inf
    for kk in range(0, k, kc):
        kl = kc if kc < k - kk else k - kk
        a_slot, a_free = _acquire(l0a)
        b_slot, b_free = _acquire(l0b)
        mv_a = _move(buf, cnt, core, path_a, m * kl * eb, kinds[0], inf, a_ready0, a_ready1, a_free)
        mv_b = _move(buf, cnt, core, path_b, kl * n * eb, kinds[1], inf, b_ready, b_free, -1)
        fractals = (-(-m // frac[0])) * (-(-kl // frac[1])) * (-(-n // frac[2]))
        if kk == 0:
            mm = _put(buf, cnt, core, _CUBE, kinds[2], cube_start + fractals, 0.0, mv_a, mv_b, first0, first1)
        else:
            mm = _put(buf, cnt, core, _CUBE, kinds[2], cube_start + fractals, 0.0, mv_a, mv_b, -1, -1)
        l0a[1 + a_slot] = mm
        l0b[1 + b_slot] = mm
    return mv_a, mv_b, mm


# geometry (int64): what a cube core program depends on besides its blocks
_K, _M_L0, _N_L0, _K_L0, _K_L1, _SLOTS_L1, _SLOTS_L0A, _SLOTS_L0B, _SLOTS_L0C, _SPLIT, _ON_AIV, _RESIDUAL, \
    _BIAS_LOAD, _BIAS_BT, _BIAS_VECTOR, _CHAIN, _REPEAT_BYTES, _MAX_REPEATS, _COPY = range(19)
# numbers (float64)
_EB, _OB, _ACC_B, _CUBE_START, _RATE_RD, _RATE_WR, _HBM_SHARE, _BIAS_BYTES, _DRAIN_EB, _AIV_EB, _COPY_B, _A_GM = range(12)
# data paths (rows of `paths`)
_GM_L1, _L1_L0A, _L1_L0B, _L0C_GM, _GM_UB, _UB_GM, _L0C_UB, _L1_BT = range(8)
PATH_NAMES = ("GM_TO_L1", "L1_TO_L0A", "L1_TO_L0B", "L0C_TO_GM", "GM_TO_UB", "UB_TO_GM", "L0C_TO_UB", "L1_TO_BT")
# kinds (indices into the program's names)
KIND_ROLES = ("load A GM->L1", "load B GM->L1", "HBM write-back", "load A L1->L0A", "load B L1->L0B", "mmad",
              "fixpipe", "load C GM->UB", "load residual GM->UB", "store C UB->GM", "L0C->UB", "load bias GM->L1",
              "load bias L1->BT", "fixpipe L0C->GM int8 copy", "store int8 copy UB->GM")
_KA_GM, _KB_GM, _KWB, _KA_L0, _KB_L0, _KMM, _KFIX, _KC_UB, _KRES, _KST, _KDRAIN, _KBIAS, _KBT, _KFIX2, _KST2 = range(15)


@njit(cache=True, nogil=True, error_model="numpy")
def _cube_core(buf, cnt, cores, bm_arr, bn_arr, geo, num, frac, paths, kinds, ops, barrier):
    """The program of one cube core over its blocks (rows ``bm_arr``, columns ``bn_arr``), see
    `CubeProgram`. ``cores`` = (cube core, its vector cores); ``barrier`` (or -1): the instruction
    every GM load waits for."""
    inf = np.inf
    k = geo[_K]
    m_l0, n_l0, k_l0, k_l1 = geo[_M_L0], geo[_N_L0], geo[_K_L0], geo[_K_L1]
    eb, ob, acc_b = num[_EB], num[_OB], num[_ACC_B]
    rate_rd, rate_wr, hbm_share = num[_RATE_RD], num[_RATE_WR], num[_HBM_SHARE]
    split = geo[_SPLIT] != 0
    c0 = cores[0]
    l1 = np.full(geo[_SLOTS_L1] + 1, -1, np.int64)
    l0a = np.full(geo[_SLOTS_L0A] + 1, -1, np.int64)
    l0b = np.full(geo[_SLOTS_L0B] + 1, -1, np.int64)
    l0c = np.full(geo[_SLOTS_L0C] + 1, -1, np.int64)
    ub = np.full(3, -1, np.int64)
    l1[0] = l0a[0] = l0b[0] = l0c[0] = ub[0] = 0
    mma_kinds = np.array([kinds[_KA_L0], kinds[_KB_L0], kinds[_KMM]], np.int64)
    k_steps = -(-k // k_l1)
    max_subs = 1
    for b in range(bm_arr.shape[0]):
        s = (-(-bm_arr[b] // m_l0)) * (-(-bn_arr[b] // n_l0))
        if s > max_subs:
            max_subs = s
    pending = np.empty(2 * max_subs + 2, np.float64)  # write-backs of finished tiles, issued after the next loads
    n_pending = 0
    aiv_turn = 0
    for b in range(bm_arr.shape[0]):
        bm = bm_arr[b]
        bn = bn_arr[b]
        has_resident = False  # L1 panels stay for the whole block when one K panel covers K
        panel_ready = -1
        slot = 0
        bias_ready = -1
        if geo[_BIAS_LOAD] != 0:  # n_l1 bias values GM -> L1 (-> BiasTable), for each tile's first MMAD
            bias_ready = _move(buf, cnt, c0, paths[_GM_L1], bn * num[_BIAS_BYTES], kinds[_KBIAS], rate_rd,
                               barrier, -1, -1)
            if geo[_BIAS_BT] != 0:
                bias_ready = _move(buf, cnt, c0, paths[_L1_BT], bn * 4.0, kinds[_KBT], inf, bias_ready, -1, -1)
        for i in range(0, bm, m_l0):
            sm = m_l0 if m_l0 < bm - i else bm - i
            for j in range(0, bn, n_l0):
                sn = n_l0 if n_l0 < bn - j else bn - j
                c_slot, c_free = _acquire(l0c)
                last_mmad = -1
                for ks in range(k_steps):
                    kl1 = k_l1 if k_l1 < k - ks * k_l1 else k - ks * k_l1
                    if not (has_resident and k_steps == 1):
                        # one K panel covers K: the block's whole A rows and B columns load once and
                        # stay; several panels: each L0 sub-tile streams its own rows and columns
                        # through L1 (PyPTO's tile graph: an L1 A tile is m_l0 x k_l1, B k_l1 x n_l0)
                        pa = bm if k_steps == 1 else sm
                        pb = bn if k_steps == 1 else sn
                        slot, free = _acquire(l1)
                        # a convolution's A is its feature map: load3d builds the im2col rows from
                        # L1, so GM carries num[_A_GM] of the expanded panel's bytes
                        ld_a = _move(buf, cnt, c0, paths[_GM_L1], pa * kl1 * eb * num[_A_GM], kinds[_KA_GM],
                                     rate_rd, free, barrier, -1)
                        ld_b = _move(buf, cnt, c0, paths[_GM_L1], kl1 * pb * eb, kinds[_KB_GM], rate_rd,
                                     free, barrier, -1)
                        for p in range(n_pending):
                            _put(buf, cnt, c0, _MTE2, kinds[_KWB], pending[p] / hbm_share, 0.0, -1, -1, -1, -1)
                        n_pending = 0
                        panel_ready = ld_b if ld_b > ld_a else ld_a
                        has_resident = True
                    first0 = c_free if ks == 0 else -1
                    first1 = bias_ready if ks == 0 else -1
                    mv_a, mv_b, mm = _mmad_loop(buf, cnt, c0, sm, kl1, sn, k_l0, panel_ready, -1, panel_ready,
                                                l0a, l0b, first0, first1, mma_kinds, frac, eb, num[_CUBE_START],
                                                paths[_L1_L0A], paths[_L1_L0B])
                    last_mmad = mm
                    l1[1 + slot] = mv_b
                # epilogue: drain the L0C accumulator
                out_bytes = sm * sn * ob
                copy_bytes = sm * sn * num[_COPY_B]  # a second, requantised (int8) copy of C, if any
                if split:
                    fix = _move(buf, cnt, c0, paths[_L0C_GM], out_bytes, kinds[_KFIX], rate_wr, last_mmad, -1, -1)
                    pending[n_pending] = out_bytes
                    n_pending += 1
                    if geo[_COPY] != 0 and geo[_ON_AIV] == 0:  # FixPipe's second pass writes the int8 copy
                        fix = _move(buf, cnt, c0, paths[_L0C_GM], copy_bytes, kinds[_KFIX2], rate_wr, last_mmad,
                                    -1, -1)
                        pending[n_pending] = copy_bytes
                        n_pending += 1
                    l0c[1 + c_slot] = fix
                    if geo[_ON_AIV] != 0:  # a paired vector core reads C back, applies the stages, writes it
                        aiv = cores[1 + aiv_turn]
                        aiv_turn = 1 - aiv_turn
                        u_slot, u_free = _acquire(ub)
                        ld = _move(buf, cnt, aiv, paths[_GM_UB], out_bytes, kinds[_KC_UB], rate_rd, fix, u_free, -1)
                        if geo[_RESIDUAL] != 0:
                            ld = _move(buf, cnt, aiv, paths[_GM_UB], out_bytes, kinds[_KRES], rate_rd, ld, u_free, -1)
                        v = _vector_ops(buf, cnt, aiv, ops, sm * sn, num[_AIV_EB], geo[_REPEAT_BYTES],
                                        geo[_MAX_REPEATS], geo[_CHAIN] != 0, ld, -1, -1)
                        st = _move(buf, cnt, aiv, paths[_UB_GM], out_bytes, kinds[_KST], rate_wr, v, -1, -1)
                        _put(buf, cnt, aiv, _MTE2, kinds[_KWB], out_bytes / hbm_share, 0.0, -1, -1, -1, -1)
                        if geo[_COPY] != 0:
                            st = _move(buf, cnt, aiv, paths[_UB_GM], copy_bytes, kinds[_KST2], rate_wr, v, -1, -1)
                            _put(buf, cnt, aiv, _MTE2, kinds[_KWB], copy_bytes / hbm_share, 0.0, -1, -1, -1, -1)
                        ub[1 + u_slot] = st
                else:
                    u_slot, u_free = _acquire(ub)
                    drain = _move(buf, cnt, c0, paths[_L0C_UB], sm * sn * acc_b, kinds[_KDRAIN], inf,
                                  last_mmad, u_free, -1)
                    l0c[1 + c_slot] = drain
                    res = -1
                    if geo[_RESIDUAL] != 0:  # the residual tile comes GM -> UB beside the drained result
                        res = _move(buf, cnt, c0, paths[_GM_UB], out_bytes, kinds[_KRES], rate_rd, u_free, -1, -1)
                    v = drain
                    if ops.shape[0]:
                        v = _vector_ops(buf, cnt, c0, ops, sm * sn, num[_DRAIN_EB], geo[_REPEAT_BYTES],
                                        geo[_MAX_REPEATS], geo[_CHAIN] != 0, drain, res,
                                        bias_ready if geo[_BIAS_VECTOR] != 0 else -1)
                    st = _move(buf, cnt, c0, paths[_UB_GM], out_bytes, kinds[_KST], rate_wr, v, -1, -1)
                    pending[n_pending] = out_bytes
                    n_pending += 1
                    if geo[_COPY] != 0:
                        st = _move(buf, cnt, c0, paths[_UB_GM], copy_bytes, kinds[_KST2], rate_wr, v, -1, -1)
                        pending[n_pending] = copy_bytes
                        n_pending += 1
                    ub[1 + u_slot] = st
    for p in range(n_pending):
        _put(buf, cnt, c0, _MTE2, kinds[_KWB], pending[p] / hbm_share, 0.0, -1, -1, -1, -1)


@njit(cache=True, nogil=True, error_model="numpy")
def _simulate_cores(bm_all, bn_all, offsets, limit, geo, num, frac, paths, kinds, ops, n_kinds):
    """Count and simulate the programs over the block lists ``bm_all/bn_all[offsets[g]:offsets[g + 1]]``
    as they are built (one call for every distinct program of a kernel). Returns per program
    (instructions, dependencies), busy cycles of template cores 0..2, total cycles and the first
    use of every kind; when the instructions together exceed ``limit``, returns after counting."""
    g_count = offsets.shape[0] - 1
    sizes = np.zeros((g_count, 2), np.int64)
    busy = np.zeros((g_count, 21))
    total = np.zeros(g_count)
    first = np.full((g_count, n_kinds), -1, np.int64)
    cores = np.arange(3)
    nothing = (np.empty(0, np.int32), np.empty(0, np.int8), np.empty(0, np.int32), np.empty(0), np.empty(0),
               np.zeros(1, np.int64), np.empty(0, np.int64))
    cnt = np.zeros(3, np.int64)
    count_only = nothing + (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(1), np.zeros(0, np.int64))
    # an int64, not the literal -1: numba would compile _cube_core once more for Literal[int](-1),
    # apart from the int64 barrier the timeline builder (CubeProgram.emit) passes (30 s each)
    no_barrier = np.int64(-1)
    n_all = 0
    for g in range(g_count):
        cnt[0] = 0
        cnt[1] = 0
        bm = bm_all[offsets[g]:offsets[g + 1]]
        bn = bn_all[offsets[g]:offsets[g + 1]]
        _cube_core(count_only, cnt, cores, bm, bn, geo, num, frac, paths, kinds, ops, no_barrier)
        sizes[g, 0] = cnt[0]
        sizes[g, 1] = cnt[1]
        n_all += cnt[0]
    if n_all > limit:
        return sizes, busy, total, first, False
    for g in range(g_count):
        cnt[0] = 0
        cnt[1] = 0
        bm = bm_all[offsets[g]:offsets[g + 1]]
        bn = bn_all[offsets[g]:offsets[g + 1]]
        sim = nothing + (np.zeros(21), busy[g], np.empty(sizes[g, 0]), total[g:g + 1], first[g])
        _cube_core(sim, cnt, cores, bm, bn, geo, num, frac, paths, kinds, ops, no_barrier)
    return sizes, busy, total, first, True


_NO_SIMULATION = (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(1), np.zeros(0, np.int64))


def _buffers(n: int, n_deps: int) -> tuple:
    """Buffers that store ``n`` instructions with ``n_deps`` dependencies."""
    ptr = np.zeros(n + 1, np.int64)
    return (np.empty(n, np.int32), np.empty(n, np.int8), np.empty(n, KIND_DTYPE), np.empty(n), np.empty(n), ptr,
            np.empty(n_deps, np.int64)) + _NO_SIMULATION


def _simulation(n: int, n_cores: int, n_kinds: int) -> tuple:
    """Buffers that simulate ``n`` instructions on template cores 0..n_cores-1 without storing them."""
    return _buffers(0, 0)[:7] + (np.zeros(n_cores * 7), np.zeros(n_cores * 7), np.empty(n), np.zeros(1),
                                 np.full(n_kinds, -1, np.int64))


_COUNT_ONLY = _buffers(0, 0)


def _path_rows(chip: Chip, names) -> np.ndarray:
    rows = np.zeros((len(names), 4))
    rows[:, 1] = 1.0
    for i, name in enumerate(names):
        if name in chip.paths:
            p = chip.paths[name]
            rows[i] = (PIPE_INDEX[p.pipe], p.bytes_per_cycle, p.startup_cycles, p.latency_cycles)
    return rows


def _vector_rows(chip: Chip, ops, names: list[str]) -> np.ndarray:
    """((instruction, timing), ...) -> one row per instruction: timing constants and kind id."""
    rows = np.zeros((len(ops), 6))
    for i, (instr, t) in enumerate(ops):
        if instr not in names:
            names.append(instr)
        rows[i] = (t.cycles_per_repeat, t.startup_cycles, t.min_cycles, t.partial_block_cycles, t.block_repeats,
                   names.index(instr))
    return rows


@dataclass
class CubeProgram:
    """The compiled program of one cube core: for every block (``bm x bn`` of C) the K panels
    GM -MTE2-> L1 (kept for the whole block when one panel covers K), per L0C tile of
    ``m_l0 x n_l0`` the MMAD loop (`mmad_loop`), then the epilogue:

    * split cores (AIC-C-220): FixPipe L0C -> GM (``fix_kind`` names it, with the stages FixPipe
      applies); a Vector epilogue runs on the paired vector cores (template cores 1, 2, taking
      turns): C GM -> UB, the residual GM -> UB, ``vector_ops``, UB -> GM, its write-back;
    * one core (AIC-C-100, AIC-M-200): L0C -> UB, the residual GM -> UB, ``vector_ops`` on the
      Vector unit, MTE3 UB -> GM.

    Written bytes are written back to HBM on MTE2 after the next panel loads (`flush_writebacks`).
    ``copy_bytes`` > 0: the epilogue also writes a requantised copy of C (``copy_bytes`` per element:
    CANN's double-output quant fusion, for readers that want int8 beside those that want fp16):
    FixPipe's second pass, or a second store of the vector core that applied the stages.
    ``bias_bytes`` > 0 (the pto compiler's ``bias_tensor``) loads ``bn * bias_bytes`` per block
    GM -> L1 (and L1 -> BT where the chip has a BiasTable) for the first MMAD of every tile;
    ``bias_on_vector``: the first vector op also waits for it; ``chain``: each vector op waits
    for the one before (the pto compiler's dependencies; the pipe orders them anyway).
    """

    chip: Chip
    tile: CubeTile
    slots: dict
    dtype: str
    out_dtype: str
    rate_rd: float
    rate_wr: float
    hbm_share: float
    vector_ops: tuple = ()          # ((instruction, VectorTiming), ...), one per pass
    vector_on_aiv: bool = False
    residual: bool = False
    fix_kind: str = "fixpipe L0C->GM"
    bias_bytes: float = 0.0
    bias_on_vector: bool = False
    chain: bool = False
    copy_bytes: float = 0.0
    a_gm_scale: float = 1.0         # GM bytes of an A panel per byte the Cube reads (a convolution's load3d)

    def __post_init__(self):
        chip, tile = self.chip, self.tile
        self.names = list(KIND_ROLES)
        self.names[_KFIX] = self.fix_kind
        split = chip.split_cores
        eb, ob = DTYPE_BYTES[self.dtype], DTYPE_BYTES[self.out_dtype]
        acc_b = DTYPE_BYTES[chip.cube.accumulator[self.dtype]]
        self.geo = np.array([0, tile.m_l0, tile.n_l0, tile.k_l0, tile.k_l1, self.slots["L1"], self.slots["L0A"],
                             self.slots["L0B"], self.slots["L0C"], split, self.vector_on_aiv and split,
                             self.residual, self.bias_bytes > 0, "L1_TO_BT" in chip.paths, self.bias_on_vector,
                             self.chain, chip.vector.repeat_bytes, chip.vector.max_repeats, self.copy_bytes > 0],
                            np.int64)
        self.num = np.array([eb, ob, acc_b, chip.cube.startup_cycles, self.rate_rd, self.rate_wr, self.hbm_share,
                             self.bias_bytes, DTYPE_BYTES["fp32"], ob, self.copy_bytes, self.a_gm_scale], np.float64)
        self.frac = np.array(cube_fractal(chip, self.dtype), np.int64)
        self.paths = _path_rows(chip, PATH_NAMES)
        self.kinds = np.arange(len(KIND_ROLES), dtype=np.int64)
        self.ops = _vector_rows(chip, self.vector_ops, self.names)

    @classmethod
    def for_matmul(cls, chip: Chip, plan, dtype: str, out_dtype: str, rate_rd: float, rate_wr: float,
                   hbm_share: float, epilogue: Epilogue = NO_EPILOGUE, a_gm_scale: float = 1.0) -> CubeProgram:
        """`simulate_matmul`'s program: ``epilogue``'s Vector stages on the paired vector cores
        (910B) or after the drain to UB (910A/310P, plus the cast down when no stage casts); a
        quant stage with a result that is not int8 itself writes an int8 copy beside it."""
        ops = list(epilogue.vector_instructions())
        if chip.split_cores:
            key = out_dtype
        else:
            key = "fp32"
            if out_dtype != chip.cube.accumulator[dtype] and not epilogue.converts:
                ops.append(("VCONV", 1))
        timed = tuple((instr, chip.vector.timing(instr, dtypes_key(instr, key)))
                      for instr, passes in ops for _ in range(int(passes)))
        fix_label = "+".join(s if s != "activation" else epilogue.activation for s in epilogue.stages
                             if s in epilogue.fixpipe)
        return cls(chip, plan.tile, dict(plan.slots), dtype, out_dtype, rate_rd, rate_wr, hbm_share, timed,
                   vector_on_aiv=epilogue.on_vector, residual=epilogue.residual,
                   fix_kind="fixpipe L0C->GM" + (f" +{fix_label}" if fix_label else ""),
                   copy_bytes=requant_copy_bytes(epilogue, out_dtype), a_gm_scale=a_gm_scale)

    def _blocks(self, blocks) -> tuple[np.ndarray, np.ndarray]:
        arr = np.asarray(blocks, np.int64).reshape(-1, 2)
        return np.ascontiguousarray(arr[:, 0]), np.ascontiguousarray(arr[:, 1])

    def _run(self, buf, cnt, cores, bm, bn, k: int, barrier: int) -> None:
        self.geo[_K] = k
        _cube_core(buf, cnt, cores, bm, bn, self.geo, self.num, self.frac, self.paths, self.kinds, self.ops, barrier)

    def size(self, blocks, k: int) -> tuple[int, int]:
        """(instructions, dependencies) of the program over ``blocks``: counted, not stored."""
        bm, bn = self._blocks(blocks)
        cnt = np.zeros(3, np.int64)
        self._run(_COUNT_ONLY, cnt, np.arange(3, dtype=np.int64), bm, bn, k, -1)
        return int(cnt[0]), int(cnt[1])

    def _build(self, blocks, k: int, cores: np.ndarray, base: int, barrier: int, size=None) -> ProgramArrays:
        bm, bn = self._blocks(blocks)
        cnt = np.array([0, 0, base], np.int64)
        if size is None:
            self._run(_COUNT_ONLY, cnt, cores, bm, bn, k, barrier)
            size = (int(cnt[0]), int(cnt[1]))
            cnt[:2] = 0
        buf = _buffers(*size)
        self._run(buf, cnt, cores, bm, bn, k, barrier)
        core, pipe, kind, dur, lat, ptr, idx = buf[:7]
        return ProgramArrays(core, pipe, dur, lat, kind, ptr, idx, self.names)

    def simulate_all(self, block_lists: list[np.ndarray], k: int, what: str, fix: str) -> list[SimulatedProgram]:
        """Simulate the programs over each of ``block_lists`` as they are built (one compiled call),
        after refusing more than `MAX_SIMULATED_INSTRUCTIONS` together (`InstructionLimitError`
        naming ``what`` and ``fix``)."""
        arr = [np.asarray(b, np.int64).reshape(-1, 2) for b in block_lists]
        offsets = np.zeros(len(arr) + 1, np.int64)
        np.cumsum([a.shape[0] for a in arr], out=offsets[1:])
        both = np.concatenate(arr) if arr else np.zeros((0, 2), np.int64)
        self.geo[_K] = k
        sizes, busy, total, first, done = _simulate_cores(
            np.ascontiguousarray(both[:, 0]), np.ascontiguousarray(both[:, 1]), offsets, MAX_SIMULATED_INSTRUCTIONS,
            self.geo, self.num, self.frac, self.paths, self.kinds, self.ops, len(self.names))
        if not done:
            check_instruction_budget(sizes[:, 0].tolist(), what, fix)
        out = []
        for g, blocks in enumerate(arr):
            used = np.nonzero(first[g] >= 0)[0]
            used = used[np.argsort(first[g][used], kind="stable")]
            size = (int(sizes[g, 0]), int(sizes[g, 1]))
            out.append(SimulatedProgram(size[0], busy[g].reshape(3, 7), float(total[g]),
                                        [self.names[i] for i in used], _builder(self, blocks, k, size)))
        return out

    def simulate(self, blocks, k: int, size: tuple[int, int]) -> SimulatedProgram:
        """Simulate the program over ``blocks`` as it is built, storing only when each instruction's
        result is ready (8 bytes per instruction): its busy cycles per pipe of template cores 0..2,
        its total cycles and kinds; the rows are built again only if a timeline asks for them."""
        bm, bn = self._blocks(blocks)
        buf = _simulation(size[0], 3, len(self.names))
        self._run(buf, np.zeros(3, np.int64), np.arange(3, dtype=np.int64), bm, bn, k, -1)
        first = buf[11]
        used = np.nonzero(first >= 0)[0]
        used = used[np.argsort(first[used], kind="stable")]
        blocks = np.stack([bm, bn], axis=1)
        return SimulatedProgram(size[0], buf[8].reshape(3, 7), float(buf[10][0]), [self.names[i] for i in used],
                                lambda: self.build(blocks, k, size))

    def build(self, blocks, k: int, size: tuple[int, int] | None = None) -> ProgramArrays:
        """The program over ``blocks`` ([(rows, cols), ...]) with contraction ``k``, as a template:
        core 0 the cube core, 1 and 2 its vector cores; kinds listed in order of first use.
        ``size``: its `size`, when known (saves counting it again)."""
        a = self._build(blocks, k, np.arange(3, dtype=np.int64), 0, -1, size)
        return _first_use_kinds(a)

    def emit(self, prog: Program, core: int, blocks, k: int, barrier: int | None = None,
             vector_cores=(-1, -1)) -> None:
        """Append the program over ``blocks`` on chip core ``core`` to ``prog``; every GM load
        waits for ``barrier`` (an instruction of ``prog``) when given."""
        cores = np.array([core, *vector_cores], np.int64)
        prog.extend(self._build(blocks, k, cores, len(prog), -1 if barrier is None else int(barrier)))


def requant_copy_bytes(epilogue: Epilogue, out_dtype: str) -> float:
    """Bytes per element of the int8 copy a Cube kernel writes beside its result: 1 when its
    epilogue requantises (quant) but the result itself is not int8, else 0."""
    return float(DTYPE_BYTES["int8"]) if epilogue.quant and out_dtype != "int8" else 0.0


def _builder(program: CubeProgram, blocks: np.ndarray, k: int, size: tuple[int, int]):
    return lambda: program.build(blocks, k, size)


def _first_use_kinds(a: ProgramArrays) -> ProgramArrays:
    """The same program with its kinds renumbered in order of first use (unused names dropped)."""
    n = a.size
    if not n:
        return a._replace(kinds=[])
    first = np.full(len(a.kinds), n, np.int64)
    _first_index(a.kind, first)
    used = np.nonzero(first < n)[0]
    used = used[np.argsort(first[used], kind="stable")]
    remap = np.zeros(len(a.kinds), KIND_DTYPE)
    remap[used] = np.arange(len(used), dtype=KIND_DTYPE)
    return a._replace(kind=remap[a.kind], kinds=[a.kinds[k] for k in used])


@njit(cache=True, nogil=True, error_model="numpy")
def _first_index(kind, first):
    for i in range(kind.shape[0] - 1, -1, -1):
        first[kind[i]] = i


@njit(cache=True, nogil=True, error_model="numpy")
def _mmad_block(base, core, m, k, n, kc, a0, a1, b_ready, l0a, l0b, c_free, frac, eb, cube_start, path_a, path_b):
    """`_mmad_loop` into buffers of its own (a call from Python passes scalars and two slot states)."""
    steps = -(-k // kc)
    ptr = np.zeros(3 * steps + 1, np.int64)
    buf = (np.empty(3 * steps, np.int32), np.empty(3 * steps, np.int8), np.empty(3 * steps, np.int32),
           np.empty(3 * steps), np.empty(3 * steps), ptr, np.empty(9 * steps, np.int64),
           np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(1), np.zeros(0, np.int64))
    cnt = np.zeros(3, np.int64)
    cnt[2] = base
    kinds = np.arange(3)
    mv_a, mv_b, mm = _mmad_loop(buf, cnt, core, m, k, n, kc, a0, a1, b_ready, l0a, l0b, c_free, -1, kinds,
                                frac, eb, cube_start, path_a, path_b)
    return buf[1], buf[2], buf[3], buf[4], ptr, buf[6][:ptr[-1]], mv_a, mv_b, mm


_MMAD_CONSTANTS: dict = {}  # id(chip), dtype -> (chip, fractal, L1->L0A row, L1->L0B row)


def mmad_loop(prog: Program, chip: Chip, dtype: str, m: int, k: int, n: int, kc: int, a_ready, b_ready,
              l0a: PingPong, l0b: PingPong, c_free, kinds: tuple[str, str, str], core: int = 0):
    """MMADs of an ``m x k x n`` product into one L0C tile of ``prog``, the contraction in ``kc``
    chunks (the compiled loop of `CubeProgram`): A moves L1 -> L0A after ``a_ready`` (one
    instruction or a tuple of up to two), B L1 -> L0B after ``b_ready``, the first MMAD waits
    for ``c_free``. Returns (last move of A, last move of B, last MMAD)."""
    a = [x for x in (a_ready if isinstance(a_ready, tuple) else (a_ready,)) if x is not None]
    if len(a) > 2:
        raise ValueError(f"mmad_loop: A waits for at most two instructions, got {len(a)}")
    a += [-1] * (2 - len(a))
    const = _MMAD_CONSTANTS.get((id(chip), dtype))
    if const is None or const[0] is not chip:
        paths = _path_rows(chip, ("L1_TO_L0A", "L1_TO_L0B"))
        const = _MMAD_CONSTANTS[(id(chip), dtype)] = (chip, np.array(cube_fractal(chip, dtype), np.int64),
                                                      paths[0].copy(), paths[1].copy())
    _, frac, path_a, path_b = const
    sa, sb = l0a.state(), l0b.state()
    base = len(prog)
    pipe, kind, dur, lat, ptr, idx, mv_a, mv_b, mm = _mmad_block(
        base, core, m, k, n, kc, a[0], a[1], -1 if b_ready is None else b_ready, sa, sb,
        -1 if c_free is None else c_free, frac, float(DTYPE_BYTES[dtype]), float(chip.cube.startup_cycles),
        path_a, path_b)
    prog.extend(ProgramArrays(np.full(pipe.shape[0], core, np.int32), pipe, dur, lat, kind, ptr, idx, list(kinds)))
    l0a.load_state(sa)
    l0b.load_state(sb)
    return tuple(None if x < 0 else int(x) for x in (mv_a, mv_b, mm))


# ---- placing programs on the cores --------------------------------------------------------------------

def check_instruction_budget(counts: list[int], what: str, fix: str) -> None:
    """Refuse a simulation whose distinct programs hold more than `MAX_SIMULATED_INSTRUCTIONS`
    (before it builds them)."""
    total = sum(counts)
    if total > MAX_SIMULATED_INSTRUCTIONS:
        raise InstructionLimitError(
            f"{what} would simulate {total:,} instructions (its distinct per-core programs, before replication over "
            f"the cores), over the limit of {MAX_SIMULATED_INSTRUCTIONS:,} "
            f"(pypto_lab.hw.programs.MAX_SIMULATED_INSTRUCTIONS, 8 bytes each while it runs); {fix}")


def cube_placements(chip: Chip, cores: list[int]) -> np.ndarray:
    """Where a cube-core template runs: one row per copy, the cube core and, on split chips, its
    paired vector cores (template cores 1..n)."""
    cores = np.asarray(cores, np.int64)
    if not chip.split_cores:
        return cores[:, None]
    n_aiv = chip.vector_cores // max(1, chip.cube_cores)
    aiv = chip.cube_cores + cores[:, None] * n_aiv + np.arange(n_aiv, dtype=np.int64)[None, :]
    return np.concatenate([cores[:, None], aiv], axis=1)


def place_on_cube_cores(chip: Chip, assign: list, build) -> Timeline:
    """Simulate a Cube kernel whose core c runs the work ``assign[c]`` (a hashable key):
    ``build(key)`` makes the program of one cube core (template core 0, its vector cores 1..n on
    split chips); cores with the same key share one program, simulated once and placed on each
    cube core and its paired vector cores."""
    groups: dict = {}
    for core, key in enumerate(assign):
        groups.setdefault(key, []).append(core)
    parts = [(build(key), cube_placements(chip, cores)) for key, cores in groups.items()]
    return simulate_placed(parts, chip.cube_cores + (chip.vector_cores if chip.split_cores else 0))


def group_by_program(assign: list) -> dict:
    """{work: [cores that run it]}, in order of first appearance."""
    groups: dict = {}
    for core, key in enumerate(assign):
        groups.setdefault(key, []).append(core)
    return groups


__all__ = ["CubeProgram", "MAX_SIMULATED_INSTRUCTIONS", "check_instruction_budget", "cube_placements", "dtypes_key",
           "requant_copy_bytes",
           "emit_repeats", "emit_vector_ops", "flush_writebacks", "gm_rates", "group_by_program", "mmad_loop", "move",
           "place_on_cube_cores", "split_blocks"]
