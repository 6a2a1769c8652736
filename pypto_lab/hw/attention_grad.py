"""FlashAttention's backward (CANN's FlashAttentionScoreGrad) as a tile program.

The kernel as CANN's operator documentation describes it (hicann/ops-transformer
attention/flash_attention_score_grad/docs/FAG算子设计介绍.md@36c13d05, section 1 and 3.1):

1. recompute ``P = softmax(Q K^T * scale)`` from the forward's saved row statistics (the scores
   are never kept): a Cube GEMM and Vector work;
2. ``dP = dO V^T``: a Cube GEMM;
3. ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)`` (FlashSoftmaxGrad, from the output gradient
   and the forward's output): Vector work;
4. - 6. ``dQ = dS K * scale``, ``dK = dS^T Q * scale``, ``dV = P^T dO``: three Cube GEMMs.

Five GEMMs per (query block, key block) to the forward's two. On Atlas A2 (split AIC / AIV cores)
S and dP go from the Cube to the Vector cores and P and dS come back through a small GM
workspace (L2), as in the forward; the Cube's basic block is 128 x 128 (section 3.1). The
gradients of blocks computed on different cores are added in fp32 GM workspaces (atomic adds),
which a pre-pass zeroes and a post-pass casts to the input dtype and scales (section 5.1, the
templates that "省去前置GM清零和后置cast和muls" where no core shares an address).

One block of work is a (head, query block); its program walks the key blocks:

* once per block: Q and dO into L1; on the Vector cores ``D`` from the block's dO and O rows;
* per key block: K and V into L1; ``S = Q K^T`` and ``dP = dO V^T`` on the Cube; on the Vector
  unit ``P = exp(S * scale - max) / sum`` from the forward's saved row max and sum (VMULS, VSUB,
  VEXP, VDIV after row broadcasts), ``dS = P (dP - D)`` (VSUB, VMUL after a row broadcast), both
  cast to the Cube's dtype; back on the Cube
  ``dV' = P^T dO``, ``dK' = dS^T Q`` and ``dQ' = dS K``, each written out and added into its fp32
  gradient. The adds land in L2 (the fp32 workspaces of the heads in flight fit it): HBM sees each
  gradient once, charged on the core's read port as the forward's output is.

Returns a `KernelReport` of the main kernel plus the two passes (`simulate_vector`).
"""

from __future__ import annotations

import numpy as np

from .attention import _flat, _k_chunk, _n_aiv, _row_op, query_blocks
from .chip import DEFAULT_CHIP, DTYPE_BYTES, Chip, get_chip
from .kernels import KernelReport, simulate_vector
from .programs import (
    emit_vector_ops,
    flush_writebacks,
    mmad_loop,
    move,
    place_on_cube_cores,
)
from .simulator import PingPong, Program
from .tiling import TilingError, ceil_align, ceil_div, cube_fractal

BASIC_BLOCK = 128   # the Cube's basic block on Atlas A2 (FAG算子设计介绍.md section 3.1: 128 x 128)
GRAD_GEMMS = 5      # S, dP, dV, dK, dQ per (query block, key block)


def backward_blocks(s_q: int, s_k: int) -> tuple[int, int]:
    """The default (block_q, block_k): the Cube's 128 x 128 basic block, clamped to the sequences."""
    return min(BASIC_BLOCK, ceil_align(s_q, 16)), min(BASIC_BLOCK, ceil_align(s_k, 16))


def plan_attention_backward(chip: Chip, d: int, block_q: int, block_k: int, dtype: str) -> dict:
    """Buffer slots of the backward's blocks: L1 holds Q, dO (the block's), K, V and P, dS (the key
    block's); L0C the S and dP tiles and one gradient tile; one Vector core's UB S and dP (fp32)
    with P and dS. Raises `TilingError` when even single buffering does not fit."""
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    dd = ceil_align(d, 16)
    rows = ceil_div(block_q, _n_aiv(chip)) if chip.split_cores else block_q
    fixed_l1 = 2 * block_q * dd * eb
    kv_l1 = (2 * block_k * dd + 2 * block_q * block_k) * eb
    need = {"L1": fixed_l1 + kv_l1, "UB": rows * block_k * 2 * (acc + eb) + rows * dd * 2 * acc}
    slots = {}
    for buf, one in (("L1", kv_l1), ("UB", need["UB"])):
        cap = chip.buffer(buf).size_bytes
        if need[buf] > cap:
            raise TilingError(f"attention backward blocks {block_q} x {block_k} (d={d}) need {need[buf]} bytes of "
                              f"{buf}, which holds {cap}: use smaller blocks")
        slots[buf] = 2 if need[buf] + one <= cap else 1
    tile_c = max(block_q * block_k, max(block_q, block_k) * dd) * acc   # the largest L0C tile
    if tile_c > chip.buffer("L0C").size_bytes:
        raise TilingError(f"attention backward blocks {block_q} x {block_k} (d={d}): an fp32 tile of {tile_c} bytes "
                          f"does not fit L0C ({chip.buffer('L0C').size_bytes}): use smaller blocks")
    slots["L0C"] = min(2, chip.buffer("L0C").size_bytes // tile_c)
    cap_a, cap_b = chip.buffer("L0A").size_bytes, chip.buffer("L0B").size_bytes
    sa, sb = cap_a / 2, cap_b / 2
    return {"slots": slots, "kc_s": _k_chunk(block_q, dd, block_k, eb, sa, sb),
            "kc_grad": _k_chunk(max(block_q, block_k), max(block_q, block_k), dd, eb, sa, sb)}


def _program(chip: Chip, blocks: tuple[int, ...], s_q: int, s_k: int, d: int, dtype: str, bk_max: int, plan: dict,
             rate_rd: float, rate_wr: float, hbm_share: float) -> Program:
    """One cube core's program (template core 0; on split chips its vector cores 1..n_aiv)."""
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    split = chip.split_cores
    n_aiv = _n_aiv(chip)
    cast = dtype != "fp32"
    sl = plan["slots"]
    gm_l1 = chip.data_path("GM_TO_L1")
    prog = Program()
    l1_kv, l1_p = PingPong(sl["L1"]), PingPong(sl["L1"])
    l0a, l0b = PingPong(2), PingPong(2)
    l0c = PingPong(sl["L0C"])
    vcores = list(range(1, n_aiv + 1)) if split else [0]
    ub = {c: PingPong(sl["UB"]) for c in vcores}
    pending: list[float] = []
    n_k = ceil_div(s_k, bk_max)
    cast_ops = (("VCONV", 2),) if cast else ()

    def rows_of(bm: int) -> list[tuple[int, int]]:
        if not split:
            return [(0, bm)]
        per = ceil_div(bm, n_aiv)
        return [(c, min(per, bm - i * per)) for i, c in enumerate(vcores) if bm - i * per > 0]

    def write_out(nbytes: float, mm: int, slot: int) -> None:
        """A gradient tile from L0C added into its fp32 GM workspace (atomic add, in L2: HBM sees each
        gradient once, `hbm_once`)."""
        if split:
            out = move(prog, 0, chip.data_path("L0C_TO_GM"), nbytes, "fixpipe grad L0C->GM (atomic add)", (mm,),
                       rate_wr)
        else:
            out = move(prog, 0, chip.data_path("L0C_TO_UB"), nbytes, "grad L0C->UB", (mm,))
            out = move(prog, 0, chip.data_path("UB_TO_GM"), nbytes, "grad UB->GM (atomic add)", (out,), rate_wr)
        l0c.release(slot, out)

    state: dict = {}

    def stage_one(b: int, j: int) -> None:
        """Q, dO (first key block), K, V; S and dP on the Cube; P and dS on the Vector unit."""
        bm = blocks[b]
        if j == 0:
            q_ld = move(prog, 0, gm_l1, bm * d * eb, "load Q GM->L1", ())
            do_ld = move(prog, 0, gm_l1, bm * d * eb, "load dO GM->L1", ())
            for c, r in rows_of(bm):   # D = rowsum(dO * O) of the block's rows (FlashSoftmaxGrad)
                ld = move(prog, c, chip.data_path("GM_TO_UB"), 2 * r * d * eb, "load dO, O GM->UB", ())
                v = emit_vector_ops(prog, c, chip, cast_ops + (("VMUL", 1),), r * d, "fp32", (ld,))
                _row_op(prog, c, chip, "VCADD", r, (v,))
            state[b] = (q_ld, do_ld)
        q_ld, do_ld = state[b]
        bk = min(bk_max, s_k - j * bk_max)
        kv_slot, kv_free = l1_kv.acquire()
        ld_k = move(prog, 0, gm_l1, bk * d * eb, "load K GM->L1", _flat(kv_free), rate_rd)
        ld_v = move(prog, 0, gm_l1, bk * d * eb, "load V GM->L1", _flat(kv_free), rate_rd)
        flush_writebacks(prog, 0, pending, hbm_share)
        s_slot, s_free = l0c.acquire()
        _, _, mm_s = mmad_loop(prog, chip, dtype, bm, d, bk, plan["kc_s"], q_ld, ld_k, l0a, l0b, s_free,
                               ("load Q L1->L0A", "load K L1->L0B", "mmad S=QK^T"))
        if split:
            fix_s = move(prog, 0, chip.data_path("L0C_TO_GM"), bm * bk * acc, "fixpipe S L0C->GM", (mm_s,), rate_wr)
            l0c.release(s_slot, fix_s)
        p_slot, p_free = l0c.acquire()
        _, _, mm_dp = mmad_loop(prog, chip, dtype, bm, d, bk, plan["kc_s"], do_ld, ld_v, l0a, l0b, p_free,
                                ("load dO L1->L0A", "load V L1->L0B", "mmad dP=dO V^T"))
        lp_slot, lp_free = l1_p.acquire()
        if split:
            fix_p = move(prog, 0, chip.data_path("L0C_TO_GM"), bm * bk * acc, "fixpipe dP L0C->GM", (mm_dp,),
                         rate_wr)
            l0c.release(p_slot, fix_p)
            stores = []
            for c, r in rows_of(bm):
                u_slot, u_free = ub[c].acquire()
                ld = move(prog, c, chip.data_path("GM_TO_UB"), 2 * r * bk * acc, "load S, dP GM->UB",
                          _flat(fix_s, fix_p, u_free), rate_wr)
                v = _vector_step(prog, c, chip, r, bk, cast_ops, ld)
                st = move(prog, c, chip.data_path("UB_TO_GM"), 2 * r * bk * eb, "store P, dS UB->GM", (v,), rate_wr)
                ub[c].release(u_slot, st)
                stores.append((r, st))
            state[(b, j)] = (bm, bk, kv_slot, lp_slot, lp_free, stores, ld_k, q_ld, do_ld)
        else:
            u_slot, u_free = ub[0].acquire()
            dr_s = move(prog, 0, chip.data_path("L0C_TO_UB"), bm * bk * acc, "S L0C->UB", _flat(mm_s, u_free))
            l0c.release(s_slot, dr_s)
            dr_p = move(prog, 0, chip.data_path("L0C_TO_UB"), bm * bk * acc, "dP L0C->UB", (mm_dp,))
            l0c.release(p_slot, dr_p)
            v = _vector_step(prog, 0, chip, bm, bk, cast_ops, dr_p)
            ready = move(prog, 0, chip.data_path("UB_TO_L1"), 2 * bm * bk * eb, "store P, dS UB->L1",
                         _flat(v, lp_free))
            ub[0].release(u_slot, ready)
            state[(b, j)] = (bm, bk, kv_slot, lp_slot, None, ready, ld_k, q_ld, do_ld)

    def stage_two(b: int, j: int) -> None:
        """dV' = P^T dO, dK' = dS^T Q, dQ' = dS K on the Cube, each added into its fp32 gradient."""
        bm, bk, kv_slot, lp_slot, lp_free, stores, ld_k, q_ld, do_ld = state.pop((b, j))
        if split:
            loads = tuple(move(prog, 0, gm_l1, 2 * r * bk * eb, "load P, dS GM->L1", _flat(st, lp_free), rate_wr)
                          for r, st in stores)
            ready = loads[-1]
        else:
            ready = stores
        last_a = ready
        for label, m, k, b_ready in (("dV'=P^T dO", bk, bm, do_ld), ("dK'=dS^T Q", bk, bm, q_ld),
                                     ("dQ'=dS K", bm, bk, ld_k)):
            g_slot, g_free = l0c.acquire()
            last_a, _, mm = mmad_loop(prog, chip, dtype, m, k, d, plan["kc_grad"], ready, b_ready, l0a, l0b, g_free,
                                      (f"load A L1->L0A ({label})", f"load B L1->L0B ({label})", f"mmad {label}"))
            write_out(m * d * acc, mm, g_slot)
        l1_p.release(lp_slot, last_a)
        l1_kv.release(kv_slot, last_a)
        if j == n_k - 1:   # the block's share of the gradients reaches HBM once
            pending.append((bm + 2 * bm * s_k / max(1, s_q)) * d * acc)

    steps = [(b, j) for b in range(len(blocks)) for j in range(n_k)]
    for i, (b, j) in enumerate(steps):   # the Cube issues the next key block's S and dP first (CV preload)
        stage_one(b, j)
        if i:
            stage_two(*steps[i - 1])
    stage_two(*steps[-1])
    flush_writebacks(prog, 0, pending, hbm_share)
    return prog


def _vector_step(prog: Program, c: int, chip: Chip, rows: int, bk: int, cast_ops, ready: int) -> int:
    """P = exp(S * scale - max) / sum from the forward's saved row max and row sum (the operator's
    softmax_max and softmax_sum inputs), dS = P * (dP - D), both cast to the Cube's dtype."""
    e = rows * bk
    v = _row_op(prog, c, chip, "VBRCB", rows, (ready,))
    v = emit_vector_ops(prog, c, chip, (("VMULS", 1), ("VSUB", 1), ("VEXP", 1)), e, "fp32", (v,))
    v = _row_op(prog, c, chip, "VBRCB", rows, (v,))
    v = emit_vector_ops(prog, c, chip, (("VDIV", 1),), e, "fp32", (v,))
    v = _row_op(prog, c, chip, "VBRCB", rows, (v,))
    v = emit_vector_ops(prog, c, chip, (("VSUB", 1), ("VMUL", 1)), e, "fp32", (v,))
    if cast_ops:
        v = emit_vector_ops(prog, c, chip, cast_ops, e, "fp32", (v,))
    return v


def simulate_attention_backward(batch_heads: int, s_q: int, s_k: int, d: int, dtype: str = "fp16",
                                chip: str | Chip = DEFAULT_CHIP, block_q: int | None = None,
                                block_k: int | None = None, name: str | None = None) -> KernelReport:
    """Simulate FlashAttentionScoreGrad for ``batch_heads`` heads (see the module docstring):
    blocks of ``block_q`` queries x ``block_k`` keys (default: the Cube's 128 x 128 basic block,
    clamped to the sequences and halved until the buffers hold them)."""
    chip = get_chip(chip)
    cube_fractal(chip, dtype)
    for label, v in (("batch_heads", batch_heads), ("s_q", s_q), ("s_k", s_k), ("d", d)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"attention backward {label} = {v!r}: dimensions must be positive integers")
    bq, bk = backward_blocks(s_q, s_k)
    bq, bk = block_q or bq, block_k or bk
    while True:
        try:
            plan = plan_attention_backward(chip, d, bq, bk, dtype)
            break
        except TilingError:
            if block_q or block_k or (bq <= 16 and bk <= 16):
                raise
            bq, bk = max(16, bq // 2), max(16, bk // 2)
    eb = DTYPE_BYTES[dtype]
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    n_blocks = batch_heads * ceil_div(s_q, bq)
    writes = n_blocks * ceil_div(s_k, bk) * (2 * bk + bq) * d * acc   # the gradient tiles, added in GM
    # each block reads its rows of Q, dO and O once, and K and V whole
    qb = query_blocks(chip, batch_heads, s_q, s_k, d, dtype, bq, 3, writes)
    tl = place_on_cube_cores(chip, qb.assign, lambda key: _program(chip, key, s_q, s_k, d, dtype, bk, plan, qb.rate_rd,
                                                                     qb.rate_wr, qb.hbm_share))
    reads, first, active = qb.reads, qb.first, qb.active
    grads = batch_heads * (s_q + 2 * s_k) * d
    # the fp32 gradient workspaces: zeroed before, cast to the input dtype and scaled after
    pre = simulate_vector("mul", grads, dtype="fp32", chip=chip, name="FlashAttentionScoreGrad pre: zero dQ/dK/dV")
    post = simulate_vector("mul", grads, dtype=dtype, compute_dtype="fp32", chip=chip,
                           name="FlashAttentionScoreGrad post: cast and scale dQ/dK/dV")
    cycles = tl.total_cycles + pre.cycles + post.cycles
    cube_flops = 2.0 * GRAD_GEMMS * batch_heads * s_q * s_k * d
    compute_cycles = cube_flops / 2 / (chip.cube.macs_per_cycle(dtype) * chip.cube_cores)
    min_bytes = first + grads * (acc + eb)
    mem_cycles = chip.hbm_cycles(first, grads * (acc + eb))
    vec_cores = chip.vector_cores if chip.split_cores else chip.cube_cores
    label = name or f"attention backward {batch_heads}x{s_q}x{s_k}x{d}"
    return KernelReport(
        name=label, chip=chip, unit="cube", dtype=dtype,
        shape={"batch_heads": batch_heads, "s_q": s_q, "s_k": s_k, "d": d},
        tile={"block_q": bq, "block_k": bk}, double_buffer=plan["slots"]["L1"] == 2,
        cycles=cycles, time_us=chip.cycles_to_us(cycles),
        flops=cube_flops + 10 * batch_heads * s_q * s_k,
        gm_bytes=reads + writes + pre.gm_bytes + post.gm_bytes, min_gm_bytes=min_bytes, cores_used=active,
        pipe_busy=tl.pipe_busy(int(np.argmax(tl.busy[:, 4]))), buffer_peak={},
        roofline_cycles=max(compute_cycles, mem_cycles),
        bound="compute" if compute_cycles >= mem_cycles else "memory",
        cube_utilization=compute_cycles / cycles if cycles else 0.0,
        vector_utilization=tl.busy[:, 5].sum() / (cycles * vec_cores) if cycles else 0.0,
        instructions=tl,
    )


__all__ = ["BASIC_BLOCK", "GRAD_GEMMS", "backward_blocks", "plan_attention_backward", "simulate_attention_backward"]
