"""Tile programs of the two kernel families, run on the event simulator.

* Cube kernel (matmul; convolution as implicit GEMM): GM -MTE2-> L1 -MTE1-> L0A/L0B -CUBE-> L0C,
  then the epilogue: on AIC-C-220 (910B) FixPipe drains L0C to GM (bias/ReLU/cast on the way) and
  a Vector epilogue runs on the paired vector core after a trip through GM; on AIC-C-100/M-200
  (910A, 310P) L0C drains to UB through the Vector unit and MTE3 writes UB to GM.
* Vector kernel (element-wise, reductions, softmax, norms): GM -MTE2-> UB -VECTOR-> UB -MTE3-> GM.

Each kernel splits its blocks over the chip's cores. Cores share HBM and L2: every GM transfer of
a core runs at most at its share of the chip's bandwidth (HBM for first touches, L2 for re-reads
of data that fits in L2). Double buffering gives buffers two slots (ping-pong), so loads of tile
i+1 overlap compute on tile i; the dependencies are the set_flag/wait_flag pairs of Ascend C.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .capabilities import EPILOGUE_NAMES, VECTOR_ACTIVATIONS, Epilogue, as_epilogue
from .chip import DTYPE_BYTES, Chip, get_chip
from .simulator import PingPong, Program, Timeline, simulate_chip
from .tiling import (
    CubeTile,
    TilingError,
    VecTile,
    ceil_div,
    check_vec_tile,
    cube_fractal,
    default_cube_tile,
    default_vec_tile,
    plan_cube,
)


@dataclass
class KernelReport:
    """The simulated cost of one kernel on one chip."""

    name: str
    chip: Chip                      # the chip it ran on (str(chip) is its name)
    unit: str                       # "cube" or "vector"
    dtype: str
    shape: dict[str, int]
    tile: dict[str, int]
    double_buffer: bool
    cycles: float
    time_us: float
    flops: float
    gm_bytes: float                 # bytes the kernel moves between GM and the cores
    min_gm_bytes: float             # bytes it must move at least (each operand once)
    cores_used: int
    pipe_busy: dict[str, float]     # busy cycles per pipe on the busiest core
    buffer_peak: dict[str, int]     # bytes in use per buffer, per core
    roofline_cycles: float          # max(compute at peak, min bytes at HBM bandwidth)
    bound: str                      # "compute" or "memory", by the roofline
    cube_utilization: float
    vector_utilization: float
    instructions: Timeline = field(repr=False)
    epilogue: Epilogue | None = None  # a Cube kernel's epilogue (stages and the unit of each)

    @property
    def tflops(self) -> float:
        return self.flops / (self.time_us * 1e-6) / 1e12 if self.time_us > 0 else 0.0

    @property
    def instruction_count(self) -> int:
        return len(self.instructions)

    def to_dict(self, timeline_limit: int = 0) -> dict[str, Any]:
        d = {
            "name": self.name, "chip": self.chip.name, "unit": self.unit, "dtype": self.dtype,
            "shape": dict(self.shape), "tile": dict(self.tile), "double_buffer": self.double_buffer,
            "cycles": self.cycles, "time_us": self.time_us, "tflops": self.tflops, "flops": self.flops,
            "gm_bytes": self.gm_bytes, "min_gm_bytes": self.min_gm_bytes, "cores_used": self.cores_used,
            "pipe_busy": dict(self.pipe_busy), "buffer_peak": dict(self.buffer_peak),
            "roofline_cycles": self.roofline_cycles, "bound": self.bound,
            "cube_utilization": self.cube_utilization, "vector_utilization": self.vector_utilization,
            "instruction_count": self.instruction_count,
        }
        if timeline_limit:
            d["instructions"] = self.instructions.records(timeline_limit)
        return d


# ---- shared memory system ----------------------------------------------------------------

def gm_rates(chip: Chip, reads: float, first_reads: float, busiest_reads: float, active: int,
             working_set: float | None = None) -> tuple[float, float, float]:
    """How ``active`` cores share the chip's memory system: (read rate, write rate, HBM share),
    bytes per cycle of one core.

    * Reads: HBM carries the first touch of every input byte (``first_reads``); re-reads come from
      L2 when the data the cores reuse at one time (``working_set``, default ``first_reads``) fits
      in L2, else in proportion to the fraction that fits. The time the memory system needs for
      all ``reads`` is the time the busiest core needs for its ``busiest_reads``, so every core
      reads at that rate (lighter cores finish earlier).
    * Writes land in L2 at the core's share of L2 bandwidth, in bursts (one output tile at a time).
    * Written bytes still reach HBM: each write is followed by a write-back that holds the core's
      MTE2 lane (its read port) for ``bytes / HBM share`` (`_flush_writebacks`). So reads and
      write-backs take turns on HBM, and no kernel moves its bytes faster than HBM and L2 allow.
    """
    hbm = chip.hbm_bytes_per_cycle()
    ws = first_reads if working_set is None else working_set
    hit = min(1.0, chip.l2_bytes / max(ws, 1.0))
    rereads = max(0.0, reads - first_reads)
    read_cycles = first_reads / hbm + rereads * (hit / chip.l2_bytes_per_cycle() + (1 - hit) / hbm)
    return busiest_reads / max(read_cycles, 1e-9), chip.l2_bytes_per_cycle() / active, hbm / active


def _move(prog: Program, core: int, path, nbytes: float, kind: str, deps, rate_cap: float | None = None) -> int:
    """Emit one transfer on its path's pipe: busy for startup + bytes/rate, ready after its latency."""
    return prog.emit(core, path.pipe, path.occupancy(nbytes, rate_cap), kind, deps, path.latency_cycles)


def _flush_writebacks(prog: Program, core: int, pending: list, hbm_share: float) -> None:
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


def _split_blocks(n_blocks: int, n_cores: int) -> list[list[int]]:
    """Blocks dealt round-robin to cores, as a kernel's block_idx loop does."""
    cores = min(n_blocks, n_cores)
    return [list(range(c, n_blocks, n_cores)) for c in range(cores)]


def simulate_cube_cores(chip: Chip, assign: list[tuple], build) -> Timeline:
    """Simulate a Cube kernel whose core c runs the work ``assign[c]``: ``build(work)`` makes the
    program of one cube core (template core 0, its vector cores 1..n on split chips); cores with
    the same work share one program, placed on each cube core and its paired vector cores."""
    n_aiv = chip.vector_cores // max(1, chip.cube_cores) if chip.split_cores else 0
    parts = []
    for key, cores in _group_by_program(assign).items():
        if chip.split_cores:
            placements = [tuple([c] + [chip.cube_cores + c * n_aiv + j for j in range(n_aiv)]) for c in cores]
        else:
            placements = cores
        parts.append((build(key), placements))
    return simulate_chip(parts, chip.cube_cores + (chip.vector_cores if chip.split_cores else 0))


def _group_by_program(assign: list[tuple]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for core, key in enumerate(assign):
        groups.setdefault(key, []).append(core)
    return groups


# ---- Cube kernel ----------------------------------------------------------------------------

EPILOGUES = tuple(EPILOGUE_NAMES)  # the string forms simulate_matmul takes (or an Epilogue)


def _cube_core_program(chip: Chip, blocks: list[tuple[int, int]], k: int, dtype: str, out_dtype: str,
                       plan, rate_rd: float, rate_wr: float, hbm_share: float, epilogue: Epilogue) -> Program:
    """The program of one cube core (template core 0; its vector cores 1, 2 on split chips)."""
    tile = plan.tile
    eb = DTYPE_BYTES[dtype]
    ob = DTYPE_BYTES[out_dtype]
    acc_b = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    m0, k0, n0 = cube_fractal(chip, dtype)
    p_gm_l1 = chip.data_path("GM_TO_L1")
    p_l0a = chip.data_path("L1_TO_L0A")
    p_l0b = chip.data_path("L1_TO_L0B")
    cube_start = chip.cube.startup_cycles
    split = chip.split_cores
    vector_epilogue = epilogue.on_vector
    vector_ops = epilogue.vector_instructions()
    fix_label = "+".join(s if s != "activation" else epilogue.activation for s in epilogue.stages
                         if s in epilogue.fixpipe)
    prog = Program()
    l1 = PingPong(plan.slots["L1"])
    l0a = PingPong(plan.slots["L0A"])
    l0b = PingPong(plan.slots["L0B"])
    l0c = PingPong(plan.slots["L0C"])
    ub = PingPong(2)
    k_steps = ceil_div(k, tile.k_l1)
    aiv_turn = 0
    pending = []  # write-backs of finished tiles, issued on MTE2 after the next panel loads
    for bm, bn in blocks:
        subs = [(min(tile.m_l0, bm - i), min(tile.n_l0, bn - j))
                for i in range(0, bm, tile.m_l0) for j in range(0, bn, tile.n_l0)]
        resident = None  # L1 panels stay for the whole block when one K panel covers K
        for sm, sn in subs:
            c_slot, c_free = l0c.acquire()
            last_mmad = None
            first = True
            for ks in range(k_steps):
                kl1 = min(tile.k_l1, k - ks * tile.k_l1)
                if resident is not None and k_steps == 1:
                    panel_ready, slot = resident
                else:
                    slot, free = l1.acquire()
                    a_bytes = bm * kl1 * eb
                    b_bytes = kl1 * bn * eb
                    ld_a = _move(prog, 0, p_gm_l1, a_bytes, "load A GM->L1", (free,), rate_rd)
                    ld_b = _move(prog, 0, p_gm_l1, b_bytes, "load B GM->L1", (free,), rate_rd)
                    _flush_writebacks(prog, 0, pending, hbm_share)
                    panel_ready = ld_b if ld_b > ld_a else ld_a
                    resident = (panel_ready, slot)
                last_reader = None
                for kk in range(0, kl1, tile.k_l0):
                    kl0 = min(tile.k_l0, kl1 - kk)
                    a_slot, a_free = l0a.acquire()
                    b_slot, b_free = l0b.acquire()
                    mv_a = _move(prog, 0, p_l0a, sm * kl0 * eb, "load A L1->L0A", (panel_ready, a_free))
                    mv_b = _move(prog, 0, p_l0b, kl0 * sn * eb, "load B L1->L0B", (panel_ready, b_free))
                    fractals = ceil_div(sm, m0) * ceil_div(kl0, k0) * ceil_div(sn, n0)
                    mm = prog.emit(0, "CUBE", cube_start + fractals, "mmad", (mv_a, mv_b, c_free if first else None))
                    first = False
                    l0a.release(a_slot, mm)
                    l0b.release(b_slot, mm)
                    last_reader = mv_b
                    last_mmad = mm
                l1.release(slot, last_reader)
            # epilogue: drain the L0C accumulator
            out_bytes = sm * sn * ob
            if split:
                fix = _move(prog, 0, chip.data_path("L0C_TO_GM"), out_bytes,
                            "fixpipe L0C->GM" + (f" +{fix_label}" if fix_label else ""), (last_mmad,), rate_wr)
                pending.append(out_bytes)
                l0c.release(c_slot, fix)
                if vector_epilogue:  # a paired vector core reads C back, applies the stages, writes it again
                    aiv = 1 + aiv_turn
                    aiv_turn = 1 - aiv_turn
                    u_slot, u_free = ub.acquire()
                    ld = _move(prog, aiv, chip.data_path("GM_TO_UB"), out_bytes, "load C GM->UB", (fix, u_free),
                               rate_rd)
                    if epilogue.residual:
                        ld = _move(prog, aiv, chip.data_path("GM_TO_UB"), out_bytes, "load residual GM->UB",
                                   (ld, u_free), rate_rd)
                    v = _emit_vector_ops(prog, aiv, chip, vector_ops, sm * sn, out_dtype, (ld,))
                    st = _move(prog, aiv, chip.data_path("UB_TO_GM"), out_bytes, "store C UB->GM", (v,), rate_wr)
                    _flush_writebacks(prog, aiv, [out_bytes], hbm_share)
                    ub.release(u_slot, st)
            else:
                u_slot, u_free = ub.acquire()
                drain = _move(prog, 0, chip.data_path("L0C_TO_UB"), sm * sn * acc_b, "L0C->UB", (last_mmad, u_free))
                l0c.release(c_slot, drain)
                ready = (drain,)
                if epilogue.residual:  # the residual tile comes GM -> UB beside the drained result
                    ready = (drain, _move(prog, 0, chip.data_path("GM_TO_UB"), out_bytes, "load residual GM->UB",
                                          (u_free,), rate_rd))
                ops = list(vector_ops)
                if out_dtype != chip.cube.accumulator[dtype] and not epilogue.converts:
                    ops.append(("VCONV", 1))
                v = _emit_vector_ops(prog, 0, chip, ops, sm * sn, "fp32", ready) if ops else drain
                st = _move(prog, 0, chip.data_path("UB_TO_GM"), out_bytes, "store C UB->GM", (v,), rate_wr)
                pending.append(out_bytes)
                ub.release(u_slot, st)
    _flush_writebacks(prog, 0, pending, hbm_share)
    return prog




def _dtypes_key(instr: str, dtype: str) -> str:
    d = dtype.upper()
    if instr in ("VCONV",):
        return f"{d}_FP16" if dtype != "fp16" else "FP16_FP32"
    return d


def _emit_vector_ops(prog: Program, core: int, chip: Chip, ops, elems: int, dtype: str, deps) -> int:
    """Emit the vector instructions that process ``elems`` elements; return the last index.

    Each instruction covers at most ``max_repeats`` repeats of ``repeat_bytes``; longer tiles are
    issued as several instructions, as Ascend C's repeatTimes <= 255 requires.
    """
    eb = DTYPE_BYTES[dtype]
    repeats_total = max(1, ceil_div(int(elems * eb), chip.vector.repeat_bytes))
    last = None
    pending = tuple(deps)
    for instr, passes in ops:
        timing = chip.vector.timing(instr, _dtypes_key(instr, dtype))
        for _ in range(int(passes)):
            last = emit_repeats(prog, core, chip, instr, timing, repeats_total, pending)
            pending = ()
    return last if last is not None else (deps[0] if deps else -1)


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


def simulate_matmul(m: int, k: int, n: int, dtype: str = "fp16", chip: str | Chip = "Ascend910B1",
                    tile: CubeTile | dict | None = None, double_buffer: bool = True,
                    out_dtype: str | None = None, epilogue: Epilogue | str = "none", batch: int = 1,
                    name: str | None = None) -> KernelReport:
    """Simulate ``C[m, n] = A[m, k] @ B[k, n]`` (``batch`` independent copies) on a Cube kernel.

    ``epilogue`` is what happens to C between L0C and GM: an `Epilogue` (stages and the unit of
    each, `pypto_lab.hw.capabilities.place_epilogue`) or one of the names in `EPILOGUES`, placed
    for the chip. A residual epilogue reads one more tensor of C's shape from GM."""
    chip = get_chip(chip)
    for label, v in (("m", m), ("k", k), ("n", n), ("batch", batch)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"matmul {label} = {v!r}: dimensions must be positive integers")
    epilogue = as_epilogue(chip, epilogue)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not known; choose one of {', '.join(chip.cube.fractals)}")
    cube_fractal(chip, dtype)
    if out_dtype is None:
        out_dtype = "int32" if dtype == "int8" else ("fp32" if dtype == "fp32" else dtype)
    if isinstance(tile, dict):
        tile = CubeTile(**tile)
    if tile is None:
        tile = default_cube_tile(chip, m, k, n, dtype)
    plan = plan_cube(chip, tile, dtype, m, k, n, double_buffer, epilogue)

    eb = DTYPE_BYTES[dtype]
    ob = DTYPE_BYTES[out_dtype]
    bm_count = ceil_div(m, tile.m_l1)
    bn_count = ceil_div(n, tile.n_l1)
    n_blocks = batch * bm_count * bn_count
    blocks = []  # (rows, cols, first touch of its A panel, first touch of its B panel)
    for b in range(n_blocks):
        r = b % (bm_count * bn_count)
        i, j = divmod(r, bn_count)
        blocks.append((min(tile.m_l1, m - i * tile.m_l1), min(tile.n_l1, n - j * tile.n_l1), j == 0, i == 0))
    per_core = _split_blocks(n_blocks, chip.cube_cores)
    active = len(per_core)
    k_steps = ceil_div(k, tile.k_l1)
    vector_epilogue = epilogue.on_vector and chip.split_cores

    def traffic(core_blocks) -> tuple[float, float, float]:
        """GM bytes read, written, and touched for the first time (from HBM) by these blocks.

        Every block reads its A rows and B columns over K (once per sub-tile when K needs more
        than one L1 panel) and writes C once; the first block of a row (column) of C is the first
        to touch its A (B) panel. A vector epilogue reads C back and writes it again.
        """
        rd = wr = first = 0.0
        for bm, bn, first_a, first_b in core_blocks:
            subs = ceil_div(bm, tile.m_l0) * ceil_div(bn, tile.n_l0)
            rd += (subs if k_steps > 1 else 1) * (bm + bn) * k * eb
            out = bm * bn * ob
            wr += out
            first += (bm * k * eb if first_a else 0) + (bn * k * eb if first_b else 0) + out
            if vector_epilogue:
                rd += out
                wr += out
            if epilogue.residual:
                rd += out
                first += out
        return rd, wr, first

    reads, writes, unique = traffic(blocks)
    gm_bytes = reads + writes
    # what the cores reuse at one time: the A row panels and B column panels of two waves of blocks
    wave_rows = min(bm_count, ceil_div(2 * active, bn_count) + 1)
    wave_cols = min(bn_count, 2 * active)
    working_set = (wave_rows * tile.m_l1 + wave_cols * tile.n_l1) * k * eb

    assign = [tuple(blocks[b] for b in core_blocks) for core_blocks in per_core]
    busiest_rd = max(traffic([blocks[b] for b in core_blocks])[0] for core_blocks in per_core)
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, unique - writes, busiest_rd, active, working_set)
    tl = simulate_cube_cores(chip, assign, lambda key: _cube_core_program(
        chip, [b[:2] for b in key], k, dtype, out_dtype, plan, rate_rd, rate_wr, hbm_share, epilogue))

    flops = 2.0 * batch * m * n * k
    macs_cycle = chip.cube.macs_per_cycle(dtype)
    compute_cycles = flops / 2 / (macs_cycle * chip.cube_cores)
    mem_cycles = unique / chip.hbm_bytes_per_cycle()
    roof = max(compute_cycles, mem_cycles)
    cycles = tl.total_cycles
    busy_core = int(np.argmax(tl.busy[:, 4]))  # the core whose Cube is busiest
    cube_util = compute_cycles / cycles if cycles else 0.0
    vec_busy = tl.busy[:, 5].sum()
    vec_cores = chip.vector_cores if chip.split_cores else chip.cube_cores
    peak = plan.buffer_peak()
    if not chip.split_cores or vector_epilogue:
        peak["UB"] = 2 * tile.m_l0 * tile.n_l0 * DTYPE_BYTES[chip.cube.accumulator[dtype]]
    return KernelReport(
        name=name or f"matmul {m}x{k}x{n}" + (f" x{batch}" if batch > 1 else ""),
        chip=chip, unit="cube", dtype=dtype,
        shape={"m": m, "k": k, "n": n, "batch": batch, "epilogue": epilogue.label()}, tile=tile.to_dict(),
        double_buffer=double_buffer,
        cycles=cycles, time_us=chip.cycles_to_us(cycles), flops=flops,
        gm_bytes=gm_bytes, min_gm_bytes=unique, cores_used=active,
        pipe_busy=tl.pipe_busy(busy_core), buffer_peak=peak,
        roofline_cycles=roof, bound="compute" if compute_cycles >= mem_cycles else "memory",
        cube_utilization=cube_util, vector_utilization=vec_busy / (cycles * vec_cores) if cycles else 0.0,
        instructions=tl, epilogue=epilogue,
    )


def simulate_conv2d(n: int, c_in: int, h: int, w: int, c_out: int, kernel: int | tuple = 3,
                    stride: int = 1, padding: int = 0, dtype: str = "fp16", chip: str | Chip = "Ascend910B1",
                    tile: CubeTile | dict | None = None, double_buffer: bool = True,
                    epilogue: Epilogue | str = "none") -> KernelReport:
    """Convolution as implicit GEMM: M = N*Ho*Wo, K = C_in*kh*kw, N = C_out (img2col in L1)."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (w + 2 * padding - kw) // stride + 1
    if ho <= 0 or wo <= 0:
        raise ValueError(
            f"conv2d: kernel {kh}x{kw} with padding {padding} does not fit the {h}x{w} input; "
            "increase padding or the input size"
        )
    rep = simulate_matmul(n * ho * wo, c_in * kh * kw, c_out, dtype=dtype, chip=chip, tile=tile,
                          double_buffer=double_buffer, epilogue=epilogue,
                          name=f"conv2d {n}x{c_in}x{h}x{w} -> {c_out} k{kh}x{kw} s{stride}")
    rep.shape = {"n": n, "c_in": c_in, "h": h, "w": w, "c_out": c_out, "kh": kh, "kw": kw,
                 "stride": stride, "padding": padding, "gemm_m": n * ho * wo, "gemm_k": c_in * kh * kw,
                 "gemm_n": c_out}
    return rep


# ---- Vector kernel --------------------------------------------------------------------------

@dataclass(frozen=True)
class VectorOp:
    """A vector operator: its inputs, the UB tiles it keeps live, and its instructions per tile.

    ``per_tile`` lists (instruction, passes over the tile); ``per_row`` lists instructions issued
    once per row on one repeat (the cross-lane step of a row reduction, e.g. VCMAX)."""

    inputs: int
    live_buffers: int
    per_tile: tuple
    per_row: tuple = ()
    row_wise: bool = False
    flops_per_elem: float = 1.0


VECTOR_OPS: dict[str, VectorOp] = {
    "add": VectorOp(2, 3, (("VADD", 1),)),
    "sub": VectorOp(2, 3, (("VSUB", 1),)),
    "mul": VectorOp(2, 3, (("VMUL", 1),)),
    "div": VectorOp(2, 3, (("VDIV", 1),)),
    "relu": VectorOp(1, 2, (("VRELU", 1),)),
    "exp": VectorOp(1, 2, (("VEXP", 1),)),
    "sqrt": VectorOp(1, 2, (("VSQRT", 1),)),
    "rsqrt": VectorOp(1, 2, (("VRSQRT", 1),)),
    "cast": VectorOp(1, 2, (("VCONV", 1),)),
    "copy": VectorOp(1, 1, (), flops_per_elem=0.0),  # data movement only: GM -> UB -> GM
    # inference BatchNorm: a per-channel scale and shift
    "batchnorm": VectorOp(1, 2, (("VMUL", 1), ("VADD", 1)), flops_per_elem=2),
    "gelu": VectorOp(1, 3, VECTOR_ACTIVATIONS["gelu"], flops_per_elem=8),
    "add_relu": VectorOp(2, 3, (("VADDRELU", 1),), flops_per_elem=2),
    # row reductions: a tree of element-wise max/add over the row, then one cross-lane step per row
    "sum": VectorOp(1, 2, (("VADD", 1),), (("VCADD", 1),), row_wise=True),
    "max": VectorOp(1, 2, (("VMAX", 1),), (("VCMAX", 1),), row_wise=True),
    # softmax: max, x - max, exp, sum, divide
    "softmax": VectorOp(1, 3, (("VMAX", 1), ("VSUB", 1), ("VEXP", 1), ("VADD", 1), ("VDIV", 1)),
                        (("VCMAX", 1), ("VCADD", 1), ("VBRCB", 2)), row_wise=True, flops_per_elem=5),
    # layer norm: mean, x - mean, square, variance, rsqrt, scale, gamma, beta
    "layernorm": VectorOp(3, 4, (("VADD", 1), ("VSUB", 1), ("VMUL", 1), ("VADD", 1), ("VMUL", 1),
                                 ("VMUL", 1), ("VADD", 1)),
                          (("VCADD", 2), ("VRSQRT", 1), ("VBRCB", 2)), row_wise=True, flops_per_elem=8),
    # RMS norm: square, sum, rsqrt, scale, gamma
    "rmsnorm": VectorOp(2, 3, (("VMUL", 1), ("VADD", 1), ("VMUL", 1), ("VMUL", 1)),
                        (("VCADD", 1), ("VRSQRT", 1), ("VBRCB", 1)), row_wise=True, flops_per_elem=4),
}


def fuse_vector_ops(ops: list[str], inputs: int) -> VectorOp:
    """One vector kernel doing the work of ``ops`` (names in `VECTOR_OPS`) on each tile, reading
    ``inputs`` tensors from GM and writing one: what element-wise fusion saves is the GM round
    trip between the ops."""
    specs = [VECTOR_OPS[o] for o in ops]
    return VectorOp(
        inputs=max(1, inputs),
        live_buffers=max(1, inputs) + 2,
        per_tile=tuple(i for s in specs for i in s.per_tile),
        per_row=tuple(i for s in specs for i in s.per_row),
        row_wise=any(s.row_wise for s in specs),
        flops_per_elem=sum(s.flops_per_elem for s in specs),
    )


def simulate_vector(op: str | VectorOp, numel: int, dtype: str = "fp16", chip: str | Chip = "Ascend910B1",
                    tile: VecTile | dict | None = None, double_buffer: bool = True,
                    row_len: int | None = None, name: str | None = None,
                    compute_dtype: str | None = None) -> KernelReport:
    """Simulate a Vector kernel applying ``op`` (a name in `VECTOR_OPS`, or a `VectorOp` such as
    a fused chain from `fuse_vector_ops`) to ``numel`` elements (rows of ``row_len`` for row-wise
    ops; default 1024 or numel if smaller).

    ``dtype`` is what GM holds; ``compute_dtype`` (default: the same) is what the Vector unit
    computes in. A wider compute dtype (fp32 kept for softmax or a norm under mixed precision)
    costs a VCONV up after each load and one down before each store, and UB tiles of the wider
    type; GM traffic stays in ``dtype``."""
    chip = get_chip(chip)
    if isinstance(op, str) and op not in VECTOR_OPS:
        raise ValueError(f"vector op {op!r} is not known; choose one of {', '.join(VECTOR_OPS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not known; choose one of fp16, bf16, fp32, int8, int16, int32")
    if not isinstance(numel, (int, np.integer)) or numel <= 0:
        raise ValueError(f"numel = {numel!r}: must be a positive integer")
    spec = VECTOR_OPS[op] if isinstance(op, str) else op
    op_name = op if isinstance(op, str) else (name or "fused vector op")
    if spec.row_wise:
        row_len = row_len or min(numel, 1024)
        if numel % row_len:
            raise ValueError(f"numel = {numel} is not a whole number of rows of {row_len}; pass row_len that divides it")
    else:
        row_len = None
    cdt = compute_dtype or dtype
    if cdt not in DTYPE_BYTES:
        raise ValueError(f"compute_dtype {cdt!r} is not known; choose one of fp16, bf16, fp32")
    eb = DTYPE_BYTES[dtype]
    if isinstance(tile, dict):
        tile = VecTile(**tile)
    if tile is None:
        tile = default_vec_tile(chip, numel, cdt, spec.live_buffers, row_len)
    slots = check_vec_tile(chip, tile, cdt, spec.live_buffers, row_len, double_buffer)
    widen = narrow = None
    if cdt != dtype:
        widen = chip.vector.timing("VCONV", f"{dtype.upper()}_{cdt.upper()}")
        narrow = chip.vector.timing("VCONV", f"{cdt.upper()}_{dtype.upper()}")
    ceb = DTYPE_BYTES[cdt]

    # tiles: rows x cols elements (row-wise: whole rows)
    if row_len:
        n_rows = numel // row_len
        tiles = [min(tile.rows, n_rows - r) * row_len for r in range(0, n_rows, tile.rows)]
    else:
        tiles = [min(tile.elems, numel - s) for s in range(0, numel, tile.elems)]
    cores = chip.vector_cores
    per_core = _split_blocks(len(tiles), cores)
    active = len(per_core)
    gm_bytes = numel * eb * (spec.inputs + 1)
    reads = numel * eb * spec.inputs
    busiest_rd = max(sum(tiles[t] for t in core_tiles) for core_tiles in per_core) * eb * spec.inputs
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, reads, busiest_rd, active)
    p_in = chip.data_path("GM_TO_UB")
    p_out = chip.data_path("UB_TO_GM")

    def program(sizes: tuple[int, ...]) -> Program:
        prog = Program()
        ub = PingPong(slots)
        pending = []
        for elems in sizes:
            slot, free = ub.acquire()
            loads = [_move(prog, 0, p_in, elems * eb, f"load x{i} GM->UB", (free,), rate_rd)
                     for i in range(spec.inputs)]
            _flush_writebacks(prog, 0, pending, hbm_share)
            if widen is not None:
                reps = max(1, ceil_div(int(elems * eb), chip.vector.repeat_bytes))
                loads = [emit_repeats(prog, 0, chip, "VCONV", widen, reps, (ld,)) for ld in loads]
            v = _emit_vector_ops(prog, 0, chip, spec.per_tile, elems, cdt, loads)
            if spec.per_row:
                rows = elems // row_len
                for instr, passes in spec.per_row:
                    timing = chip.vector.timing(instr, _dtypes_key(instr, cdt))
                    for _ in range(passes):
                        v = prog.emit(0, "VECTOR", timing.cycles(rows), instr, (v,))
            if narrow is not None:
                reps = max(1, ceil_div(int(elems * ceb), chip.vector.repeat_bytes))
                v = emit_repeats(prog, 0, chip, "VCONV", narrow, reps, (v,))
            st = _move(prog, 0, p_out, elems * eb, "store y UB->GM", (v,), rate_wr)
            pending.append(elems * eb)
            ub.release(slot, st)
        _flush_writebacks(prog, 0, pending, hbm_share)
        return prog

    assign = [tuple(tiles[t] for t in core_tiles) for core_tiles in per_core]
    parts = [(program(key), cs) for key, cs in _group_by_program(assign).items()]
    tl = simulate_chip(parts, cores)

    cycles = tl.total_cycles
    vec_cycles_min = 0.0  # the vector work at the plateau rate, as the compute roof
    for instr, passes in spec.per_tile:
        t = chip.vector.timing(instr, _dtypes_key(instr, cdt))
        vec_cycles_min += passes * t.cycles_per_repeat * numel * ceb / chip.vector.repeat_bytes
    compute_cycles = vec_cycles_min / cores
    mem_cycles = gm_bytes / chip.hbm_bytes_per_cycle()
    busy_core = int(np.argmax(tl.busy[:, 5]))
    return KernelReport(
        name=name or f"{op_name} {numel} {dtype}" + (f" (computed in {cdt})" if cdt != dtype else ""),
        chip=chip, unit="vector", dtype=dtype,
        shape={"numel": numel, "row_len": row_len or 0}, tile=tile.to_dict(), double_buffer=double_buffer,
        cycles=cycles, time_us=chip.cycles_to_us(cycles), flops=spec.flops_per_elem * numel,
        gm_bytes=gm_bytes, min_gm_bytes=gm_bytes, cores_used=active,
        pipe_busy=tl.pipe_busy(busy_core), buffer_peak={"UB": int(slots * tile.elems * ceb * spec.live_buffers)},
        roofline_cycles=max(compute_cycles, mem_cycles),
        bound="compute" if compute_cycles >= mem_cycles else "memory",
        cube_utilization=0.0,
        vector_utilization=tl.busy[:, 5].sum() / (cycles * cores) if cycles else 0.0,
        instructions=tl,
    )


__all__ = [
    "KernelReport", "simulate_matmul", "simulate_conv2d", "simulate_vector", "VECTOR_OPS", "EPILOGUES",
    "VectorOp", "fuse_vector_ops",
    "TilingError", "gm_rates",
]
