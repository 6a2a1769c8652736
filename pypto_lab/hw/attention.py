"""Scaled-dot-product attention ``O = softmax(Q K^T / sqrt(d)) V`` as a tile program.

Two ways to run it, both returning a `KernelReport`:

* ``fused=True``, FlashAttention-style (online softmax). A block is one (head, q-block of
  ``block_q`` rows); blocks are dealt round-robin to the cube cores. Per block the Q tile is
  loaded GM -> L1 once; for every k-block of ``block_k`` keys the K and V tiles are loaded
  GM -> L1 (ping-pong), ``S = Q K^T`` runs on the Cube (MTE1 to L0A/L0B, MMADs into L0C), the
  Vector unit does the online-softmax update in fp32 (scale, row max, ``x - max``, exp, row sum,
  the rescale factor ``exp(m_old - m_new)`` of the running sum), casts P to the input dtype and
  hands it back to the Cube for ``P V``; the partial ``P V`` goes to the Vector unit, which
  rescales the running output and adds it (``O = O * alpha + P V``, O stays in UB in fp32).
  After the last k-block the Vector unit divides by the row sums, casts, and writes O (block_q x d)
  to GM once. The full s_q x s_k matrix never reaches GM.

  How S, P and the partial output move between Cube and Vector depends on the core version:

  - split cores (AIC-C-220, 910B): through a small per-core GM workspace (two slots, rewritten
    in place, so it stays in L2): FixPipe L0C -> GM, the paired AIV cores (template cores
    1..n_aiv, each taking its share of the block's rows) read it with MTE2 GM -> UB, write P with
    MTE3 UB -> GM, and the AIC reads P with MTE2 GM -> L1.
  - one core (AIC-C-100 / AIC-M-200, 910A, 310P): L0C -> UB through the Vector unit (path
    L0C_TO_UB) and P UB -> L1 on MTE3 (path UB_TO_L1).

  The program is software-pipelined one k-step deep when double buffering leaves two slots in
  every buffer that a step holds across its two halves: ``Q K^T`` and the softmax of step i+1 are
  issued before ``P V`` of step i, so the Cube computes while the Vector unit works on softmax.

* ``fused=False``: the unfused sequence a level-0 graph runs: a batched matmul ``S = Q K^T``
  written to GM (`simulate_matmul`, with the faster of its default tile and one whole-matrix
  block per head), a vector kernel for scale + softmax over s_q x s_k rows
  (`simulate_vector` with ``fuse_vector_ops(["mul", "softmax"], 1)``), and a batched matmul
  ``O = P V``. The report's cycles, time, flops, gm_bytes, min_gm_bytes, roofline_cycles and
  pipe_busy are the sums of the three kernels; buffer_peak is the per-buffer maximum; its
  ``instructions`` is the timeline of the slowest of the three (not a merged timeline).

GM traffic of the fused kernel (``gm_bytes``) counts the tensors: Q once, K and V once per
q-block, O once. The AIC <-> AIV workspace exchange of split-core chips is on-chip in effect (a
few tiles per core in L2): its transfers run in the timeline at the core's share of L2 bandwidth,
and its size per core is ``buffer_peak["GM workspace"]``, but it is not part of ``gm_bytes``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .chip import DEFAULT_CHIP, DTYPE_BYTES, Chip, get_chip
from .kernels import KernelReport, fuse_vector_ops, simulate_matmul, simulate_vector
from .programs import (
    dtypes_key,
    emit_repeats,
    emit_vector_ops,
    flush_writebacks,
    gm_rates,
    mmad_loop,
    move,
    place_on_cube_cores,
    split_blocks,
)
from .simulator import PingPong, Program
from .tiling import CubeTile, TilingError, ceil_align, ceil_div, cube_fractal

ATTENTION_DTYPES = ("fp16", "bf16", "fp32")
SOFTMAX_FLOPS = 6  # per score: scale, max, subtract, exp, sum, normalise

# preference order of the default (block_q, block_k)
_CANDIDATES = ((128, 256), (128, 128), (64, 256), (64, 128), (128, 64), (64, 64), (32, 64), (32, 32), (16, 32),
               (16, 16))


# ---- buffer plan ------------------------------------------------------------------------------

def _n_aiv(chip: Chip) -> int:
    return chip.vector_cores // max(1, chip.cube_cores) if chip.split_cores else 0


def _k_chunk(m: int, k: int, n: int, eb: float, slot_a: float, slot_b: float) -> int:
    """Largest contraction chunk (a multiple of 16) whose A (m x kc) and B (kc x n) tiles fit."""
    kc = ceil_align(k, 16)
    while kc > 16 and (m * kc * eb > slot_a or kc * n * eb > slot_b):
        kc = ceil_align(kc // 2, 16)
    return kc


def plan_attention(chip: str | Chip, d: int, block_q: int, block_k: int, dtype: str = "fp16",
                   double_buffer: bool = True) -> dict:
    """Check ``block_q x block_k`` blocks of a head dimension ``d`` against the chip's buffers.

    Returns the plan: slots and bytes per buffer, contraction chunks of both matmuls, whether
    the program can be software-pipelined. Raises `TilingError` naming the buffer, the bytes
    needed and its capacity when even single buffering does not fit.
    """
    chip = get_chip(chip)
    cube_fractal(chip, dtype)
    for label, v in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise TilingError(f"attention {label} = {v!r}: must be a positive integer")
        if v % 16:
            raise TilingError(
                f"attention {label} = {v}: blocks must be multiples of 16 rows (the Cube fractal); "
                f"try {label} = {ceil_align(v, 16)}"
            )
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    bq, bk, dd = block_q, block_k, ceil_align(d, 16)
    split = chip.split_cores
    n_aiv = _n_aiv(chip)
    rows = ceil_div(bq, n_aiv) if split else bq  # rows of a block one vector core works on
    hint = f"reduce block_q/block_k (e.g. {_fit_hint(chip, d, dtype, double_buffer)})"

    def fail(buf: str, what: str, need: float) -> TilingError:
        cap = chip.buffer(buf).size_bytes
        return TilingError(
            f"attention blocks block_q={bq}, block_k={bk} (d={d}, {dtype}) do not fit {buf} on {chip.name}: "
            f"{what} need {int(need)} bytes ({need / 1024:.1f} KB), {buf} holds {cap} bytes "
            f"({cap / 1024:.0f} KB); {hint}"
        )

    slots: dict[str, int] = {}
    peak: dict[str, int] = {}
    # L1: the Q tile, the K and V tiles of a k-block, the P tile
    l1_one = (bq * dd + 2 * bk * dd + bq * bk) * eb
    cap = chip.buffer("L1").size_bytes
    if l1_one > cap:
        raise fail("L1", "the Q, K, V and P tiles", l1_one)
    slots["L1"] = 2 if double_buffer and 2 * l1_one <= cap else 1
    peak["L1"] = int(slots["L1"] * l1_one)
    # L0A / L0B: A and B tiles of both matmuls, walking the contraction in chunks
    cap_a, cap_b = chip.buffer("L0A").size_bytes, chip.buffer("L0B").size_bytes
    if bq * 16 * eb > cap_a:
        raise fail("L0A", "16 columns of a block_q-row A tile", bq * 16 * eb)
    if 16 * max(bk, dd) * eb > cap_b:
        raise fail("L0B", "16 rows of a B tile", 16 * max(bk, dd) * eb)
    l0_slots = 2 if double_buffer and 2 * bq * 16 * eb <= cap_a and 2 * 16 * max(bk, dd) * eb <= cap_b else 1
    sa, sb = cap_a / l0_slots, cap_b / l0_slots
    kc_qk = _k_chunk(bq, dd, bk, eb, sa, sb)
    kc_pv = _k_chunk(bq, bk, dd, eb, sa, sb)
    slots["L0A"] = slots["L0B"] = l0_slots
    peak["L0A"] = int(l0_slots * bq * max(kc_qk, kc_pv) * eb)
    peak["L0B"] = int(l0_slots * max(kc_qk * bk, kc_pv * dd) * eb)
    # L0C: the S tile (block_q x block_k) and the partial output (block_q x d), fp32
    s_b, o_b = bq * bk * acc, bq * dd * acc
    cap = chip.buffer("L0C").size_bytes
    if s_b + o_b > cap:
        raise fail("L0C", "the fp32 S tile and partial-output tile", s_b + o_b)
    choices = ((2, 2), (1, 2), (2, 1), (1, 1)) if double_buffer else ((1, 1),)
    s_slots, o_slots = next(c for c in choices if c[0] * s_b + c[1] * o_b <= cap)
    slots["L0C_S"], slots["L0C_O"] = s_slots, o_slots
    peak["L0C"] = int(s_slots * s_b + o_slots * o_b)
    # UB of one vector core: S (fp32) + P, partial output (fp32) and the cast output per slot,
    # plus the running output (fp32) and the row statistics (m, l, alpha, broadcasts) of two blocks
    work = rows * bk * (4 + eb) + rows * dd * (4 + eb)
    fixed = rows * dd * 4 + 2 * 4 * ceil_align(rows, 8) * 4 + rows * 32
    cap = chip.buffer("UB").size_bytes
    if work + fixed > cap:
        raise fail("UB", f"the softmax work tiles of {rows} rows", work + fixed)
    slots["UB"] = 2 if double_buffer and 2 * work + fixed <= cap else 1
    peak["UB"] = int(slots["UB"] * work + fixed)
    if split:
        ws = bq * bk * (4 + eb) + bq * dd * 4
        slots["GM workspace"] = 2 if double_buffer else 1
        peak["GM workspace"] = int(slots["GM workspace"] * ws)
    full = all(slots[b] == 2 for b in ("L1", "L0A", "UB")) and max(s_slots, o_slots) == 2
    return {"block_q": bq, "block_k": bk, "rows_per_vector_core": rows, "slots": slots, "buffer_peak": peak,
            "k_chunk_qk": kc_qk, "k_chunk_pv": kc_pv, "pipelined": bool(double_buffer and slots["L1"] == 2),
            "fully_double_buffered": full}


def _fit_hint(chip: Chip, d: int, dtype: str, double_buffer: bool) -> str:
    for bq, bk in _CANDIDATES:
        try:
            _quick_fits(chip, d, bq, bk, dtype)
        except TilingError:
            continue
        return f"block_q={bq}, block_k={bk}"
    return "no block size fits: reduce d"


def _quick_fits(chip: Chip, d: int, bq: int, bk: int, dtype: str) -> None:
    """Single-buffered capacity check without a hint (so hints don't recurse)."""
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    dd = ceil_align(d, 16)
    rows = ceil_div(bq, _n_aiv(chip)) if chip.split_cores else bq
    need = {
        "L1": (bq * dd + 2 * bk * dd + bq * bk) * eb,
        "L0A": bq * 16 * eb,
        "L0B": 16 * max(bk, dd) * eb,
        "L0C": (bq * bk + bq * dd) * acc,
        "UB": rows * bk * (4 + eb) + rows * dd * (4 + eb) + rows * dd * 4 + 2 * 4 * ceil_align(rows, 8) * 4 + rows * 32,
    }
    for buf, nbytes in need.items():
        if nbytes > chip.buffer(buf).size_bytes:
            raise TilingError(buf)


def attention_block_candidates(chip: str | Chip, s_q: int, s_k: int, d: int, dtype: str = "fp16",
                               double_buffer: bool = True) -> list[tuple[int, int]]:
    """Every legal ``(block_q, block_k)`` of the standard ladder (clamped to the sequence lengths),
    in the ladder's order: what a tiling search tries."""
    chip = get_chip(chip)
    out = []
    for bq, bk in _CANDIDATES:
        bq, bk = min(bq, ceil_align(s_q, 16)), min(bk, ceil_align(s_k, 16))
        if (bq, bk) in out:
            continue
        try:
            plan_attention(chip, d, bq, bk, dtype, double_buffer)
        except TilingError:
            continue
        out.append((bq, bk))
    return out


def default_attention_blocks(chip: str | Chip, s_q: int, s_k: int, d: int, dtype: str = "fp16",
                             double_buffer: bool = True) -> tuple[int, int]:
    """Default ``(block_q, block_k)``: the first of 128x256, 128x128, 64x256, 64x128, 128x64, ...
    (clamped to the sequence lengths) that keeps every buffer double-buffered, else the first that
    fits. Long k-blocks pay the per-row steps of the online softmax (VCMAX, VCADD, VBRCB) fewer
    times, which matters because the softmax, not the Cube, bounds attention at d = 64."""
    chip = get_chip(chip)
    legal = None
    seen = set()
    for bq, bk in _CANDIDATES:
        bq, bk = min(bq, ceil_align(s_q, 16)), min(bk, ceil_align(s_k, 16))
        if (bq, bk) in seen:
            continue
        seen.add((bq, bk))
        try:
            plan = plan_attention(chip, d, bq, bk, dtype, double_buffer)
        except TilingError:
            continue
        if plan["fully_double_buffered"] or not double_buffer:
            return bq, bk
        legal = legal or (bq, bk)
    if legal is None:
        raise TilingError(f"no attention block size fits {chip.name}'s buffers for d={d} ({dtype}); reduce d")
    return legal


# ---- the fused tile program ---------------------------------------------------------------------

def _flat(*xs) -> tuple:
    out = []
    for x in xs:
        if isinstance(x, tuple):
            out.extend(x)
        elif x is not None:
            out.append(x)
    return tuple(out)


def _row_op(prog: Program, core: int, chip: Chip, instr: str, rows: int, deps=()) -> int:
    """A per-row instruction (cross-lane reduction, broadcast) of ``rows`` repeats."""
    t = chip.vector.timing(instr, "UINT32_UINT32" if instr == "VBRCB" else dtypes_key(instr, "fp32"))
    return emit_repeats(prog, core, chip, instr, t, rows, _flat(*deps))


def _softmax_step(prog: Program, core: int, chip: Chip, rows: int, bk: int, first: bool, cast: bool, deps) -> int:
    """Online-softmax update of one k-block on ``rows x bk`` fp32 scores; returns the last instruction."""
    e = rows * bk
    v = emit_vector_ops(prog, core, chip, (("VMULS", 1), ("VMAX", 1)), e, "fp32", _flat(*deps))
    v = _row_op(prog, core, chip, "VCMAX", rows, (v,))                     # row max of the block
    if not first:
        v = emit_vector_ops(prog, core, chip, (("VMAX", 1),), rows, "fp32", (v,))  # m_new = max(m_old, .)
    v = _row_op(prog, core, chip, "VBRCB", rows, (v,))
    v = emit_vector_ops(prog, core, chip, (("VSUB", 1), ("VEXP", 1), ("VADD", 1)), e, "fp32", (v,))
    v = _row_op(prog, core, chip, "VCADD", rows, (v,))                     # row sum of the block
    if not first:  # alpha = exp(m_old - m_new); l = l * alpha + rowsum
        v = emit_vector_ops(prog, core, chip, (("VSUB", 1), ("VEXP", 1), ("VMUL", 1), ("VADD", 1)), rows,
                             "fp32", (v,))
    if cast:
        v = emit_vector_ops(prog, core, chip, (("VCONV", 1),), e, "fp32", (v,))  # P to the Cube's dtype
    return v


def _attention_core_program(chip: Chip, blocks: tuple[int, ...], s_k: int, d: int, dtype: str, plan: dict,
                            rate_rd: float, rate_wr: float, hbm_share: float) -> Program:
    """The program of one cube core (template core 0; on split chips its AIV cores 1..n_aiv)."""
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    split = chip.split_cores
    n_aiv = _n_aiv(chip)
    bk_max = plan["block_k"]
    sl = plan["slots"]
    cast = dtype != "fp32"
    p_gm_l1 = chip.data_path("GM_TO_L1")
    prog = Program()
    l1_q, l1_kv, l1_p = PingPong(sl["L1"]), PingPong(sl["L1"]), PingPong(sl["L1"])
    l0a, l0b = PingPong(sl["L0A"]), PingPong(sl["L0B"])
    l0c_s, l0c_o = PingPong(sl["L0C_S"]), PingPong(sl["L0C_O"])
    vcores = list(range(1, n_aiv + 1)) if split else [0]
    ub_s = {c: PingPong(sl["UB"]) for c in vcores}
    ub_pv = {c: PingPong(sl["UB"]) for c in vcores}
    ub_o = {c: PingPong(sl["UB"]) for c in vcores}
    ws_sp = PingPong(sl.get("GM workspace", 1))
    ws_pv = PingPong(sl.get("GM workspace", 1))
    pending: list[float] = []  # O write-backs, accounted on the cube core's MTE2 lane
    n_k = ceil_div(s_k, bk_max)
    steps = [(b, j) for b in range(len(blocks)) for j in range(n_k)]
    state: dict = {}  # per block: Q tile; per step: what stage two needs

    def row_split(bm: int) -> list[tuple[int, int]]:
        if not split:
            return [(0, bm)]
        per = ceil_div(bm, n_aiv)
        out = []
        for i, c in enumerate(vcores):
            r = min(per, bm - i * per)
            if r > 0:
                out.append((c, r))
        return out

    def stage_one(b: int, j: int) -> None:
        bm = blocks[b]
        bk = min(bk_max, s_k - j * bk_max)
        if j == 0:
            q_slot, q_free = l1_q.acquire()
            q_ld = move(prog, 0, p_gm_l1, bm * d * eb, "load Q GM->L1", _flat(q_free), rate_rd)
            state[b] = {"q": (q_slot, q_ld)}
        q_slot, q_ld = state[b]["q"]
        kv_slot, kv_free = l1_kv.acquire()
        ld_k = move(prog, 0, p_gm_l1, bk * d * eb, "load K GM->L1", _flat(kv_free), rate_rd)
        ld_v = move(prog, 0, p_gm_l1, bk * d * eb, "load V GM->L1", _flat(kv_free), rate_rd)
        flush_writebacks(prog, 0, pending, hbm_share)
        s_slot, s_free = l0c_s.acquire()
        mv_q, _, mm = mmad_loop(prog, chip, dtype, bm, d, bk, plan["k_chunk_qk"], q_ld, ld_k, l0a, l0b, s_free,
                                 ("load Q L1->L0A", "load K L1->L0B", "mmad S=QK^T"))
        if j == n_k - 1:
            l1_q.release(q_slot, mv_q)
        step = {"kv": kv_slot, "ld_v": ld_v, "bk": bk}
        if split:
            ws_slot, ws_free = ws_sp.acquire()
            fix = move(prog, 0, chip.data_path("L0C_TO_GM"), bm * bk * acc, "fixpipe S L0C->GM",
                        _flat(mm, ws_free), rate_wr)
            l0c_s.release(s_slot, fix)
            stores = []
            for c, r in row_split(bm):
                u_slot, u_free = ub_s[c].acquire()
                ld = move(prog, c, chip.data_path("GM_TO_UB"), r * bk * acc, "load S GM->UB",
                           _flat(fix, u_free), rate_wr)
                v = _softmax_step(prog, c, chip, r, bk, j == 0, cast, (ld,))
                st = move(prog, c, chip.data_path("UB_TO_GM"), r * bk * eb, "store P UB->GM", (v,), rate_wr)
                ub_s[c].release(u_slot, st)
                stores.append((r, st))
            step.update(ws=ws_slot, p_stores=stores)
        else:
            u_slot, u_free = ub_s[0].acquire()
            drain = move(prog, 0, chip.data_path("L0C_TO_UB"), bm * bk * acc, "S L0C->UB", _flat(mm, u_free))
            l0c_s.release(s_slot, drain)
            v = _softmax_step(prog, 0, chip, bm, bk, j == 0, cast, (drain,))
            p_slot, p_free = l1_p.acquire()
            st = move(prog, 0, chip.data_path("UB_TO_L1"), bm * bk * eb, "store P UB->L1", _flat(v, p_free))
            ub_s[0].release(u_slot, st)
            step.update(p_slot=p_slot, p_ready=st)
        state[(b, j)] = step

    def stage_two(b: int, j: int) -> None:
        bm = blocks[b]
        step = state.pop((b, j))
        bk = step["bk"]
        if split:
            p_slot, p_free = l1_p.acquire()
            loads = tuple(move(prog, 0, p_gm_l1, r * bk * eb, "load P GM->L1", _flat(st, p_free), rate_wr)
                          for r, st in step["p_stores"])
            ws_sp.release(step["ws"], loads)
            # the loads run in order on one MTE2 pipe, so the last one ending means P is whole in
            # L1, however many vector cores wrote a share of it (two per AIC on the presets; four
            # on a chip derived with fewer Cube cores)
            p_ready = loads[-1]
        else:
            p_slot, p_ready = step["p_slot"], step["p_ready"]
        o_slot, o_free = l0c_o.acquire()
        mv_p, mv_v, mm = mmad_loop(prog, chip, dtype, bm, bk, d, plan["k_chunk_pv"], p_ready, step["ld_v"], l0a,
                                   l0b, o_free, ("load P L1->L0A", "load V L1->L0B", "mmad O'=PV"))
        l1_p.release(p_slot, mv_p)
        l1_kv.release(step["kv"], mv_v)
        last = j == n_k - 1
        if split:
            wv_slot, wv_free = ws_pv.acquire()
            fix = move(prog, 0, chip.data_path("L0C_TO_GM"), bm * d * acc, "fixpipe O' L0C->GM",
                        _flat(mm, wv_free), rate_wr)
            l0c_o.release(o_slot, fix)
            readers = []
            for c, r in row_split(bm):
                u_slot, u_free = ub_pv[c].acquire()
                ld = move(prog, c, chip.data_path("GM_TO_UB"), r * d * acc, "load O' GM->UB",
                           _flat(fix, u_free), rate_wr)
                readers.append(ld)
                v = _update(c, r, j, ld)
                ub_pv[c].release(u_slot, v)
                if last:
                    _finish(c, r, v)
            ws_pv.release(wv_slot, tuple(readers))
        else:
            u_slot, u_free = ub_pv[0].acquire()
            drain = move(prog, 0, chip.data_path("L0C_TO_UB"), bm * d * acc, "O' L0C->UB", _flat(mm, u_free))
            l0c_o.release(o_slot, drain)
            v = _update(0, bm, j, drain)
            ub_pv[0].release(u_slot, v)
            if last:
                _finish(0, bm, v)

    def _update(c: int, r: int, j: int, ready: int) -> int:
        """O = O * alpha + O' on the vector core (the first k-block: O = 0 + O')."""
        v = ready
        if j > 0:
            v = _row_op(prog, c, chip, "VBRCB", r, (v,))
            v = emit_vector_ops(prog, c, chip, (("VMUL", 1),), r * d, "fp32", (v,))
        return emit_vector_ops(prog, c, chip, (("VADD", 1),), r * d, "fp32", (v,))

    def _finish(c: int, r: int, ready: int) -> None:
        """O / l, cast, and the single write of the output rows to GM."""
        v = _row_op(prog, c, chip, "VBRCB", r, (ready,))
        ops = (("VDIV", 1), ("VCONV", 1)) if cast else (("VDIV", 1),)
        v = emit_vector_ops(prog, c, chip, ops, r * d, "fp32", (v,))
        o_slot, o_free = ub_o[c].acquire()
        st = move(prog, c, chip.data_path("UB_TO_GM"), r * d * eb, "store O UB->GM", _flat(v, o_free), rate_wr)
        ub_o[c].release(o_slot, st)
        pending.append(r * d * eb)

    if plan["pipelined"]:  # stage one of step i+1 is issued before stage two of step i
        for i, (b, j) in enumerate(steps):
            stage_one(b, j)
            if i:
                stage_two(*steps[i - 1])
        stage_two(*steps[-1])
    else:
        for b, j in steps:
            stage_one(b, j)
            stage_two(b, j)
    flush_writebacks(prog, 0, pending, hbm_share)
    return prog


# ---- the public entry point ------------------------------------------------------------------------

class QueryBlocks(NamedTuple):
    """A FlashAttention kernel's query blocks dealt to the cube cores, and the memory rates they
    run at (`query_blocks`)."""

    assign: list[tuple[int, ...]]   # per core: the rows of each of its query blocks
    active: int                     # cores with blocks
    reads: float                    # GM bytes all blocks read
    first: float                    # of which first touches (each tensor once)
    rate_rd: float
    rate_wr: float
    hbm_share: float


def query_blocks(chip: Chip, batch_heads: int, s_q: int, s_k: int, d: int, dtype: str, block_q: int,
                 q_tensors: int, writes: float) -> QueryBlocks:
    """The query blocks of ``block_q`` rows of every head, dealt round-robin to the cube cores.
    Each block reads its rows of ``q_tensors`` query-shaped tensors once (Q; the backward also dO
    and O) and all of K and V; ``writes`` bytes reach GM. The rates come from `gm_rates`, with the
    heads of two waves of blocks as the working set that L2 may keep."""
    eb = DTYPE_BYTES[dtype]
    n_qb = ceil_div(s_q, block_q)
    rows = [min(block_q, s_q - i * block_q) for i in range(n_qb)]
    n_blocks = batch_heads * n_qb
    per_core = split_blocks(n_blocks, chip.cube_cores)
    active = len(per_core)

    def tensor_reads(bs) -> float:
        return sum((q_tensors * rows[b % n_qb] + 2 * s_k) * d * eb for b in bs)

    reads = tensor_reads(range(n_blocks))
    first = batch_heads * (q_tensors * s_q + 2 * s_k) * d * eb
    busiest = max(tensor_reads(bs) for bs in per_core)
    heads_in_flight = min(batch_heads, ceil_div(2 * active, n_qb) + 1)
    working_set = heads_in_flight * (min(s_q, 2 * active * block_q) * q_tensors + 2 * s_k) * d * eb
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, first, busiest, active, working_set, hbm_writes=writes)
    assign = [tuple(rows[b % n_qb] for b in bs) for bs in per_core]
    return QueryBlocks(assign, active, reads, first, rate_rd, rate_wr, hbm_share)


def simulate_attention(batch_heads: int, s_q: int, s_k: int, d: int, dtype: str = "fp16",
                       chip: str | Chip = DEFAULT_CHIP, fused: bool = True, block_q: int | None = None,
                       block_k: int | None = None, double_buffer: bool = True,
                       name: str | None = None) -> KernelReport:
    """Simulate ``O = softmax(Q K^T / sqrt(d)) V`` for ``batch_heads`` independent heads
    (Q: s_q x d, K and V: s_k x d per head), fused (FlashAttention, one kernel) or unfused (three
    kernels); see the module docstring for the programs and what the report's fields hold.

    ``block_q`` / ``block_k`` (fused only) default to `default_attention_blocks`; blocks that do
    not fit the chip raise `TilingError` naming the buffer, the bytes and its capacity.
    """
    chip = get_chip(chip)
    for label, v in (("batch_heads", batch_heads), ("s_q", s_q), ("s_k", s_k), ("d", d)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"attention {label} = {v!r}: dimensions must be positive integers")
    if dtype not in ATTENTION_DTYPES:
        raise ValueError(f"attention dtype {dtype!r} is not supported; choose one of {', '.join(ATTENTION_DTYPES)}")
    cube_fractal(chip, dtype)
    label = name or f"attention {batch_heads}x{s_q}x{s_k}x{d}" + (" fused" if fused else " unfused")
    if not fused:
        return _unfused(chip, batch_heads, s_q, s_k, d, dtype, double_buffer, label)

    if block_q is None or block_k is None:
        dq, dk = default_attention_blocks(chip, s_q, s_k, d, dtype, double_buffer)
        block_q = dq if block_q is None else block_q
        block_k = dk if block_k is None else block_k
    plan = plan_attention(chip, d, block_q, block_k, dtype, double_buffer)
    writes = batch_heads * s_q * d * DTYPE_BYTES[dtype]
    qb = query_blocks(chip, batch_heads, s_q, s_k, d, dtype, block_q, 1, writes)
    tl = place_on_cube_cores(chip, qb.assign, lambda key: _attention_core_program(
        chip, key, s_k, d, dtype, plan, qb.rate_rd, qb.rate_wr, qb.hbm_share))
    reads, first, active = qb.reads, qb.first, qb.active

    cube_flops = 4.0 * batch_heads * s_q * s_k * d
    compute_cycles = cube_flops / 2 / (chip.cube.macs_per_cycle(dtype) * chip.cube_cores)
    min_bytes = first + writes
    mem_cycles = chip.hbm_cycles(first, writes)
    cycles = tl.total_cycles
    vec_cores = chip.vector_cores if chip.split_cores else chip.cube_cores
    return KernelReport(
        name=label, chip=chip, unit="cube", dtype=dtype,
        shape={"batch_heads": batch_heads, "s_q": s_q, "s_k": s_k, "d": d},
        tile={"block_q": block_q, "block_k": block_k}, double_buffer=double_buffer,
        cycles=cycles, time_us=chip.cycles_to_us(cycles),
        flops=cube_flops + SOFTMAX_FLOPS * batch_heads * s_q * s_k,
        gm_bytes=reads + writes, min_gm_bytes=min_bytes, cores_used=active,
        pipe_busy=tl.pipe_busy(int(np.argmax(tl.busy[:, 4]))), buffer_peak=dict(plan["buffer_peak"]),
        roofline_cycles=max(compute_cycles, mem_cycles),
        bound="compute" if compute_cycles >= mem_cycles else "memory",
        cube_utilization=compute_cycles / cycles if cycles else 0.0,
        vector_utilization=tl.busy[:, 5].sum() / (cycles * vec_cores) if cycles else 0.0,
        instructions=tl,
    )


def _batched_matmul(chip: Chip, m: int, k: int, n: int, dtype: str, db: bool, batch: int, name: str):
    """The faster of `simulate_matmul`'s default tile (chosen for one matrix, it spreads a small
    matrix thinly over the cores) and one whole-matrix block per batch entry (128 x 128 at most)."""
    best = simulate_matmul(m, k, n, dtype=dtype, chip=chip, double_buffer=db, out_dtype=dtype, batch=batch,
                           name=name)
    tm, tn = min(128, ceil_align(m, 16)), min(128, ceil_align(n, 16))
    kl0 = min(ceil_align(k, 16), 128)
    while kl0 > 16 and 2 * max(tm, tn) * kl0 * DTYPE_BYTES[dtype] > chip.buffer("L0A").size_bytes:
        kl0 //= 2
    kl1 = kl0 * max(1, min(4, ceil_div(k, kl0)))
    try:
        alt = simulate_matmul(m, k, n, dtype=dtype, chip=chip, double_buffer=db, out_dtype=dtype, batch=batch,
                              tile=CubeTile(tm, tm, kl0, kl1, tn, tn), name=name)
    except TilingError:
        return best
    return alt if alt.cycles < best.cycles else best


def _unfused(chip: Chip, bh: int, s_q: int, s_k: int, d: int, dtype: str, double_buffer: bool,
             label: str) -> KernelReport:
    """Three kernels in sequence: S = Q K^T to GM, scale + softmax, O = P V."""
    qk = _batched_matmul(chip, s_q, d, s_k, dtype, double_buffer, bh, "S = Q K^T")
    sm = simulate_vector(fuse_vector_ops(["mul", "softmax"], 1), bh * s_q * s_k, dtype=dtype, chip=chip,
                         double_buffer=double_buffer, row_len=s_k, name="scale + softmax")
    pv = _batched_matmul(chip, s_q, s_k, d, dtype, double_buffer, bh, "O = P V")
    parts = (qk, sm, pv)
    cycles = sum(r.cycles for r in parts)
    compute = sum(r.roofline_cycles for r in parts if r.bound == "compute")
    memory = sum(r.roofline_cycles for r in parts if r.bound == "memory")
    cube_compute = (qk.flops + pv.flops) / 2 / (chip.cube.macs_per_cycle(dtype) * chip.cube_cores)
    vec_busy = sum(float(r.instructions.busy[:, 5].sum()) for r in parts)
    peak: dict[str, int] = {}
    for r in parts:
        for buf, v in r.buffer_peak.items():
            peak[buf] = max(peak.get(buf, 0), v)
    tile = {f"qk.{k}": v for k, v in qk.tile.items()}
    tile.update({f"softmax.{k}": v for k, v in sm.tile.items()})
    tile.update({f"pv.{k}": v for k, v in pv.tile.items()})
    return KernelReport(
        name=label, chip=chip, unit="cube", dtype=dtype,
        shape={"batch_heads": bh, "s_q": s_q, "s_k": s_k, "d": d}, tile=tile, double_buffer=double_buffer,
        cycles=cycles, time_us=sum(r.time_us for r in parts), flops=sum(r.flops for r in parts),
        gm_bytes=sum(r.gm_bytes for r in parts), min_gm_bytes=sum(r.min_gm_bytes for r in parts),
        cores_used=max(r.cores_used for r in parts),
        pipe_busy={p: sum(r.pipe_busy[p] for r in parts) for p in qk.pipe_busy}, buffer_peak=peak,
        roofline_cycles=sum(r.roofline_cycles for r in parts),
        bound="compute" if compute >= memory else "memory",
        cube_utilization=cube_compute / cycles if cycles else 0.0,
        vector_utilization=vec_busy / (cycles * chip.vector_cores) if cycles else 0.0,
        instructions=max(parts, key=lambda r: r.cycles).instructions,
    )


__all__ = ["simulate_attention", "plan_attention", "default_attention_blocks"]
