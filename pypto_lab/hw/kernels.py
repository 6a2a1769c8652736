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

The Cube kernel's per-core program is the compiled `pypto_lab.hw.programs.CubeProgram`. A
core's program depends only on the (rows, cols) of its blocks, so cores with the same blocks
share one program, simulated once (as it is built, without storing it) and replicated over those
cores: ``len(report.instructions)`` counts the whole chip's instructions,
``report.instructions.simulated`` those the event loop stepped (`pypto_lab.hw.simulator`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .capabilities import EPILOGUE_NAMES, VECTOR_ACTIVATIONS, Epilogue, as_epilogue, capabilities
from .chip import DEFAULT_CHIP, DTYPE_BYTES, Chip, get_chip
from .programs import (
    CubeProgram,
    cube_placements,
    dtypes_key,
    emit_repeats,
    emit_vector_ops,
    flush_writebacks,
    gm_rates,
    group_by_program,
    move,
    requant_copy_bytes,
    split_blocks,
)
from .simulator import PingPong, Program, Timeline, simulate_placed
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
    roofline_cycles: float          # max(compute at peak, min bytes at the HBM bandwidth their read/write mix reaches)
    bound: str                      # "compute" or "memory", by the roofline
    cube_utilization: float
    vector_utilization: float
    instructions: Timeline = field(repr=False)
    epilogue: Epilogue | None = None  # a Cube kernel's epilogue (stages and the unit of each)
    l2_kept_bytes: float = 0.0      # of min_gm_bytes, what stayed in L2 between operators (no DRAM)

    @property
    def dram_bytes(self) -> float:
        """Bytes that cross DRAM: the first touches and write-backs, less what L2 kept between
        operators (`pypto_lab.hw.l2_residency`)."""
        return max(0.0, self.min_gm_bytes - self.l2_kept_bytes)

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
            "instruction_count": self.instruction_count, "l2_kept_bytes": self.l2_kept_bytes,
            "dram_bytes": self.dram_bytes,
        }
        if timeline_limit:
            d["instructions"] = self.instructions.records(timeline_limit)
        return d


# ---- Cube kernel ----------------------------------------------------------------------------

EPILOGUES = tuple(EPILOGUE_NAMES)  # the string forms simulate_matmul takes (or an Epilogue)


@dataclass(frozen=True)
class Im2col:
    """A convolution's geometry, for the bytes of its A operand: input width ``w``, output width
    ``wo``, kernel ``kh`` x ``kw``, vertical ``stride``. ``along_k``: A is the im2col matrix
    transposed, its output positions along K (a weight gradient, Conv2DBackpropFilter, whose
    reduction runs over the output positions: A = im2col(x)^T, C_in*kh*kw x N*Ho*Wo), so a panel
    spans all of its K positions."""

    w: int
    wo: int
    kh: int
    kw: int
    stride: int = 1
    along_k: bool = False

    def gm_fraction(self, rows: int) -> float:
        """GM bytes per im2col byte for a panel of ``rows`` output positions (consecutive in
        N*Ho*Wo order): the panel spans ceil(rows / wo) + 1 output rows (it rarely starts at a row
        boundary), which need (that - 1) * stride + kh input rows of ``w`` positions, against
        ``rows * kh * kw`` im2col positions. At most 1: a 1x1 convolution reads what it uses
        (Ascend C's load3d, Img2Col from L1 to L0A, the CANN convolution's data path)."""
        out_rows = -(-rows // self.wo) + (1 if rows % self.wo else 0)
        in_rows = (out_rows - 1) * self.stride + self.kh
        return min(1.0, in_rows * self.w / (rows * self.kh * self.kw))


L2_OPERANDS = ("a", "b", "residual")  # what a Cube kernel reads: A, B, the residual its epilogue adds


def check_l2_bytes(l2_reads: float, l2_writes: float) -> None:
    """Bytes kept in L2 between operators must be finite and >= 0."""
    for label, v in (("l2_reads", l2_reads), ("l2_writes", l2_writes)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < float("inf"):
            raise ValueError(f"{label} = {v!r}: bytes an earlier or later kernel finds in L2, a finite number >= 0. "
                             f"Fix: pass 0 (everything crosses DRAM) or the bytes of the tensors kept in L2")


def write_back_share(hbm_share: float, writes: float, kept: float) -> float:
    """The HBM share a core's write-backs run at when ``kept`` of its ``writes`` bytes stay in L2:
    the write-back of each tile shrinks to its share that reaches DRAM (none when all stay)."""
    if kept <= 0 or writes <= 0:
        return hbm_share
    reaching = 1.0 - kept / writes
    return float("inf") if reaching <= 1e-12 else hbm_share / reaching


def simulate_matmul(m: int, k: int, n: int, dtype: str = "fp16", chip: str | Chip = DEFAULT_CHIP,
                    tile: CubeTile | dict | None = None, double_buffer: bool = True,
                    out_dtype: str | None = None, epilogue: Epilogue | str = "none", batch: int = 1,
                    name: str | None = None, im2col: Im2col | None = None, l2_operands: tuple[str, ...] = (),
                    l2_writes: float = 0.0, useful_macs: float | None = None) -> KernelReport:
    """Simulate ``C[m, n] = A[m, k] @ B[k, n]`` (``batch`` independent copies) on a Cube kernel.

    ``im2col``: A is a convolution's im2col matrix, which the Cube never reads from GM: each A
    panel's feature-map rows (with their halo) load into L1 and load3d expands them on the way to
    L0A (MTE1). GM then carries `Im2col.gm_fraction` of the expanded panel's bytes.

    ``epilogue`` is what happens to C between L0C and GM: an `Epilogue` (stages and the unit of
    each, `pypto_lab.hw.capabilities.place_epilogue`) or one of the names in `EPILOGUES`, placed
    for the chip. A residual epilogue reads one more tensor of C's shape from GM; a quant stage on a
    result that is not int8 itself writes an int8 copy beside it (double-output quant fusion).

    ``l2_operands``: the operands ("a", "b", "residual") an earlier kernel left in L2, whose every
    read (a convolution's overlapping feature-map rows too) is served by L2; ``l2_writes``: bytes
    of its results that stay in L2 for the kernels that read them and never reach DRAM, at most what
    it writes (residency between operators, ATC's l2_optimize: `pypto_lab.hw.l2_residency`).

    ``useful_macs``: of the ``batch x m x k x n`` MACs the Cube runs, those the computation needs (a
    grouped convolution's groups packed into block-diagonal weights; None: all). The time is the
    Cube's; ``flops`` and ``cube_utilization`` count the useful work."""
    chip = get_chip(chip)
    for label, v in (("m", m), ("k", k), ("n", n), ("batch", batch)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"matmul {label} = {v!r}: dimensions must be positive integers")
    check_l2_bytes(0.0, l2_writes)
    l2_operands = tuple(l2_operands)
    stray = sorted(set(l2_operands) - set(L2_OPERANDS))
    if stray:
        raise ValueError(f"l2_operands {stray}: the operands of a Cube kernel are {', '.join(L2_OPERANDS)}. Fix: name "
                         "the ones an earlier kernel left in L2, e.g. l2_operands=('a',)")
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
    # blocks of C, dealt round-robin to the cube cores: rows, columns, and whether the block is
    # the first to touch its A row panel (first column) and its B column panel (first row)
    pos = np.arange(n_blocks, dtype=np.int64) % (bm_count * bn_count)
    bi, bj = pos // bn_count, pos % bn_count
    rows = np.minimum(tile.m_l1, m - bi * tile.m_l1)
    cols = np.minimum(tile.n_l1, n - bj * tile.n_l1)
    active = min(n_blocks, chip.cube_cores)
    k_steps = ceil_div(k, tile.k_l1)
    vector_epilogue = epilogue.on_vector and chip.split_cores

    # GM bytes each block reads, writes, and touches for the first time (from HBM). Every block
    # reads its A rows and B columns over K (when K needs more than one L1 panel, each L0 sub-tile
    # reads its own rows and columns: A again for every column of sub-tiles, B for every row) and
    # writes C once; a vector epilogue reads C back and writes it again; a residual
    # epilogue reads one more C-shaped tile. (Whole numbers below 2**53: every sum is exact.)
    rf, cf = rows.astype(np.float64), cols.astype(np.float64)
    subs_m, subs_n = -(-rows // tile.m_l0), -(-cols // tile.n_l0)
    out = rf * cf * ob
    if k_steps > 1:  # each L0 sub-tile streams its own A rows and B columns over K
        rd = (subs_n * rf + subs_m * cf) * k * eb
    else:
        rd = (rf + cf) * k * eb
    wr = out.copy()
    a_first = np.where(bj == 0, rf * k * eb, 0.0)
    b_first = np.where(bi == 0, cf * k * eb, 0.0)
    first = a_first + b_first + out
    if vector_epilogue:
        rd += out
        wr += out
    if epilogue.residual:
        rd += out
        first += out
    copy_b = requant_copy_bytes(epilogue, out_dtype)
    if copy_b:  # the int8 copy written beside the result (double-output quant fusion)
        wr += rf * cf * copy_b
        first += rf * cf * copy_b
    if im2col is not None:  # A's GM bytes: the feature-map rows each panel needs, not their im2col
        a_scale = im2col.gm_fraction(k if im2col.along_k else (tile.m_l1 if k_steps == 1 else tile.m_l0))
        a_rd = (subs_n * rf if k_steps > 1 else rf) * k * eb
        rd -= a_rd * (1.0 - a_scale)
        first -= a_first * (1.0 - a_scale)
        a_first = a_first * a_scale
    else:
        a_scale = 1.0
    kept_rd = (float(a_first.sum()) if "a" in l2_operands else 0.0) + \
        (float(b_first.sum()) if "b" in l2_operands else 0.0) + \
        (float(out.sum()) if "residual" in l2_operands and epilogue.residual else 0.0)
    reads, writes, unique = float(rd.sum()), float(wr.sum()), float(first.sum())
    gm_bytes = reads + writes
    # what the cores reuse at one time: the A row panels and B column panels of two waves of blocks
    wave_rows = min(bm_count, ceil_div(2 * active, bn_count) + 1)
    wave_cols = min(bn_count, 2 * active)
    working_set = (wave_rows * tile.m_l1 + wave_cols * tile.n_l1) * k * eb
    busiest_rd = float(np.bincount(np.arange(n_blocks) % chip.cube_cores, weights=rd, minlength=active).max())
    kept_rd = min(kept_rd, unique - writes)
    kept_wr = min(float(l2_writes), writes)
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, unique - writes, busiest_rd, active, working_set, kept_rd,
                                           writes - kept_wr)
    hbm_share = write_back_share(hbm_share, writes, kept_wr)

    # one program per distinct list of (rows, cols) blocks: it is all a core's program depends on
    program = CubeProgram.for_matmul(chip, plan, dtype, out_dtype, rate_rd, rate_wr, hbm_share, epilogue, a_scale)
    shapes = np.stack([rows, cols], axis=1)
    groups: dict[bytes, tuple[np.ndarray, list[int]]] = {}
    for core in range(active):
        mine = shapes[core::chip.cube_cores]
        groups.setdefault(mine.tobytes(), (mine, []))[1].append(core)
    simulated = program.simulate_all([mine for mine, _ in groups.values()], k,
                                     f"simulate_matmul({m}, {k}, {n}, batch={batch}) with tile {tile}",
                                     "use larger tiles (m_l1, n_l1, k_l0) or simulate a smaller problem")
    parts = [(sim, cube_placements(chip, cores)) for sim, (_, cores) in zip(simulated, groups.values())]
    tl = simulate_placed(parts, chip.cube_cores + (chip.vector_cores if chip.split_cores else 0))

    run_macs = float(batch) * m * n * k
    if useful_macs is not None and not 0 < useful_macs <= run_macs:
        raise ValueError(f"useful_macs = {useful_macs!r}: the MACs the computation needs, more than 0 and at most the "
                         f"{run_macs:,.0f} the Cube runs. Fix: pass None when every MAC is useful")
    flops = 2.0 * (run_macs if useful_macs is None else useful_macs)
    macs_cycle = chip.cube.macs_per_cycle(dtype)
    compute_cycles = run_macs / (macs_cycle * chip.cube_cores)   # the Cube's busy time, useful or not
    useful_cycles = flops / 2 / (macs_cycle * chip.cube_cores)
    mem_cycles = chip.hbm_cycles(unique - writes - kept_rd, writes - kept_wr)
    roof = max(compute_cycles, mem_cycles)
    cycles = tl.total_cycles
    busy_core = int(np.argmax(tl.busy[:, 4]))  # the core whose Cube is busiest
    cube_util = useful_cycles / cycles if cycles else 0.0
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
        instructions=tl, epilogue=epilogue, l2_kept_bytes=kept_rd + kept_wr,
    )


def simulate_conv2d(n: int, c_in: int, h: int, w: int, c_out: int, kernel: int | tuple = 3,
                    stride: int = 1, padding: int = 0, dtype: str = "fp16", chip: str | Chip = DEFAULT_CHIP,
                    tile: CubeTile | dict | None = None, double_buffer: bool = True,
                    epilogue: Epilogue | str = "none") -> KernelReport:
    """Convolution as implicit GEMM: M = N*Ho*Wo, K = C_in*kh*kw, N = C_out, with img2col in L1
    (load3d): GM carries the feature map's rows, not the expanded matrix (`Im2col`)."""
    for label, v in (("n", n), ("c_in", c_in), ("h", h), ("w", w), ("c_out", c_out)):
        if not _is_int(v) or v <= 0:
            raise ValueError(f"conv2d {label} = {v!r}: tensor dimensions must be positive integers; "
                             f"e.g. simulate_conv2d(1, 64, 56, 56, 64)")
    pair = isinstance(kernel, (tuple, list)) and len(kernel) == 2 and all(map(_is_int, kernel))
    if not (_is_int(kernel) or pair) or min(kernel if pair else (kernel,)) <= 0:
        raise ValueError(f"conv2d kernel = {kernel!r}: the kernel size must be a positive integer or a pair of them "
                         "(kh, kw); e.g. kernel=3 or kernel=(1, 7)")
    if not _is_int(stride) or stride <= 0:
        raise ValueError(f"conv2d stride = {stride!r}: the stride must be a positive integer (1 visits every "
                         "position); e.g. stride=1 or stride=2")
    if not _is_int(padding) or padding < 0:
        raise ValueError(f"conv2d padding = {padding!r}: padding must be a non-negative integer (zeros added on "
                         "each side); use padding=0 for none")
    kh, kw = (kernel, kernel) if _is_int(kernel) else kernel
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (w + 2 * padding - kw) // stride + 1
    if ho <= 0 or wo <= 0:
        raise ValueError(
            f"conv2d: kernel {kh}x{kw} with padding {padding} does not fit the {h}x{w} input; "
            "increase padding or the input size"
        )
    rep = simulate_matmul(n * ho * wo, c_in * kh * kw, c_out, dtype=dtype, chip=chip, tile=tile,
                          double_buffer=double_buffer, epilogue=epilogue, im2col=Im2col(w, wo, kh, kw, stride),
                          name=f"conv2d {n}x{c_in}x{h}x{w} -> {c_out} k{kh}x{kw} s{stride}")
    rep.shape = {"n": n, "c_in": c_in, "h": h, "w": w, "c_out": c_out, "kh": kh, "kw": kw,
                 "stride": stride, "padding": padding, "gemm_m": n * ho * wo, "gemm_k": c_in * kh * kw,
                 "gemm_n": c_out}
    return rep


# ---- Vector kernel --------------------------------------------------------------------------

VECTOR_DTYPES = ("fp16", "bf16", "fp32", "int8", "int16", "int32")  # what a vector kernel's tensors may hold
VECTOR_COMPUTE_DTYPES = ("fp16", "bf16", "fp32")                     # what a widened computation runs in


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


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
    # element-wise max / min of two tensors (clamping: int8 fake quantisation's range)
    "maximum": VectorOp(2, 3, (("VMAX", 1),)),
    "minimum": VectorOp(2, 3, (("VMIN", 1),)),
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
    # an LLM layer's Vector kernels (CANN's fused operators), from the instructions they issue per tile:
    # RotaryPositionEmbedding: x * cos + rotate(x) * sin, the cos and sin tables streamed in
    "rope": VectorOp(3, 4, (("VMUL", 2), ("VGATHER", 1), ("VADD", 1)), flops_per_elem=3),
    # SwiGlu: silu(gate) * up, silu(g) = g / (1 + exp(-g))
    "swiglu": VectorOp(2, 4, (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VDIV", 1), ("VMUL", 1)), flops_per_elem=5),
    # MoeFinalizeRouting: each token's experts' outputs weighted by their gate and summed
    "weighted_sum": VectorOp(2, 3, (("VMUL", 1), ("VADD", 1)), flops_per_elem=2),
}


def gating_topk_op(k: int, router: str) -> VectorOp:
    """MoeGatingTopK over one token's expert scores: the score function (softmax or sigmoid), then
    ``k`` rounds of row max + mask (VCMAX finds the best expert, VSEL removes it), then the
    renormalisation of the kept weights."""
    score = (("VMAX", 1), ("VSUB", 1), ("VEXP", 1), ("VADD", 1), ("VDIV", 1)) if router == "softmax" else \
        (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VDIV", 1))
    return VectorOp(1, 3, score + (("VSEL", k), ("VMAX", k)), (("VCMAX", k), ("VCADD", 1), ("VBRCB", 1)),
                    row_wise=True, flops_per_elem=5 + 2 * k)


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


def _emit_by_row(prog: Program, chip: Chip, ops, rows: int, row_elems: int, dtype: str, deps) -> int:
    """The vector instructions ``ops`` issued once per row of ``row_elems`` (padded) elements, for
    ``rows`` rows: one event per instruction and pass, as long as the rows' instructions together."""
    reps = max(1, ceil_div(int(row_elems * DTYPE_BYTES[dtype]), chip.vector.repeat_bytes))
    last = None
    pending = tuple(deps)
    for instr, passes in ops:
        timing = chip.vector.timing(instr, dtypes_key(instr, dtype))
        for _ in range(int(passes)):
            last = prog.emit(0, "VECTOR", rows * timing.cycles(reps), f"{instr} by row", pending)
            pending = ()
    return last if last is not None else (deps[0] if deps else -1)


def simulate_vector(op: str | VectorOp, numel: int, dtype: str = "fp16", chip: str | Chip = DEFAULT_CHIP,
                    tile: VecTile | dict | None = None, double_buffer: bool = True,
                    row_len: int | None = None, name: str | None = None,
                    compute_dtype: str | None = None, l2_reads: float = 0.0, l2_writes: float = 0.0,
                    by_row: bool = False) -> KernelReport:
    """Simulate a Vector kernel applying ``op`` (a name in `VECTOR_OPS`, or a `VectorOp` such as
    a fused chain from `fuse_vector_ops`) to ``numel`` elements (rows of ``row_len`` for row-wise
    ops; default 1024 or numel if smaller).

    ``dtype`` is what GM holds; ``compute_dtype`` (default: the same) is what the Vector unit
    computes in. A wider compute dtype (fp32 kept for softmax or a norm under mixed precision)
    costs a VCONV up after each load and one down before each store, and UB tiles of the wider
    type; GM traffic stays in ``dtype``.

    ``l2_reads`` / ``l2_writes``: bytes of its inputs an earlier kernel left in L2 and of its
    result that stays in L2 (residency between operators, as in `simulate_matmul`).

    ``by_row``: the rows are the last axis of an ND tensor; when they are not whole 32-byte blocks
    and the core has no DataCopyPad, each row moves and is computed on its own (below)."""
    chip = get_chip(chip)
    check_l2_bytes(l2_reads, l2_writes)
    if isinstance(op, str) and op not in VECTOR_OPS:
        raise ValueError(f"vector op {op!r} is not known; choose one of {', '.join(VECTOR_OPS)}")
    if dtype not in VECTOR_DTYPES:
        raise ValueError(f"vector dtype {dtype!r} is not supported: the Vector unit computes "
                         f"{', '.join(VECTOR_DTYPES)} (the chip presets time no other arithmetic); cast the tensor "
                         "to one of them first (e.g. int64 -> int32, int4 -> int8)")
    if compute_dtype is not None and compute_dtype not in VECTOR_COMPUTE_DTYPES:
        what = "is not supported:" if compute_dtype in DTYPE_BYTES else "is not known;"
        raise ValueError(f"compute_dtype {compute_dtype!r} {what} a widened computation runs in "
                         f"{', '.join(VECTOR_COMPUTE_DTYPES)}; pass compute_dtype='fp32' (or None to compute in "
                         f"dtype {dtype!r})")
    if not _is_int(numel) or numel <= 0:
        raise ValueError(f"numel = {numel!r}: must be a positive integer")
    if row_len is not None and (not _is_int(row_len) or row_len <= 0):
        raise ValueError(f"row_len = {row_len!r}: a row must hold a positive integer number of elements; pass a "
                         f"divisor of numel = {numel} (e.g. the last dimension), or None for the default")
    spec = VECTOR_OPS[op] if isinstance(op, str) else op
    op_name = op if isinstance(op, str) else (name or "fused vector op")
    if spec.row_wise:
        row_len = row_len or min(numel, 1024)
        if numel % row_len:
            raise ValueError(f"numel = {numel} is not a whole number of rows of {row_len}; pass row_len that divides it")
    else:
        row_len = None
    cdt = compute_dtype or dtype
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
    # A row-wise op over rows that are not whole 32-byte blocks, on a core without DataCopyPad
    # (Atlas inference and training series): each row is moved GM <-> UB on its own, rounded up to
    # whole blocks, and the vector instructions run row by row (a row's padding cannot share a
    # repeat with the next row), as CANN's guide to unaligned data on these products does it
    # (Ascend C development guide, "non-aligned data" for Atlas inference products,
    # atlas_ascendc_10_0038: no DataCopyPad; rows padded in UB, masked per row).
    row_pad = 0
    if by_row and row_len and (row_len * eb) % 32 and not capabilities(chip).data_copy_pad:
        row_pad = ceil_div(row_len * eb, 32) * 32 // eb

    # tiles: rows x cols elements (row-wise: whole rows)
    if row_len:
        n_rows = numel // row_len
        tiles = [min(tile.rows, n_rows - r) * row_len for r in range(0, n_rows, tile.rows)]
    else:
        tiles = [min(tile.elems, numel - s) for s in range(0, numel, tile.elems)]
    cores = chip.vector_cores
    per_core = split_blocks(len(tiles), cores)
    active = len(per_core)
    gm_bytes = numel * eb * (spec.inputs + 1)
    reads = numel * eb * spec.inputs
    busiest_rd = max(sum(tiles[t] for t in core_tiles) for core_tiles in per_core) * eb * spec.inputs
    kept_rd = min(float(l2_reads), reads)
    writes = numel * eb
    kept_wr = min(float(l2_writes), writes)
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, reads, busiest_rd, active, None, kept_rd, writes - kept_wr)
    hbm_share = write_back_share(hbm_share, writes, kept_wr)
    p_in = chip.data_path("GM_TO_UB")
    p_out = chip.data_path("UB_TO_GM")

    def program(sizes: tuple[int, ...]) -> Program:
        prog = Program()
        ub = PingPong(slots)
        pending = []
        for elems in sizes:
            slot, free = ub.acquire()
            if row_pad:
                rows = elems // row_len
                loads = [prog.emit(0, p_in.pipe, rows * p_in.occupancy(row_pad * eb, rate_rd), f"load x{i} GM->UB by row",
                                   (free,), p_in.latency_cycles) for i in range(spec.inputs)]
            else:
                loads = [move(prog, 0, p_in, elems * eb, f"load x{i} GM->UB", (free,), rate_rd)
                         for i in range(spec.inputs)]
            flush_writebacks(prog, 0, pending, hbm_share)
            if widen is not None:
                reps = max(1, ceil_div(int(elems * eb), chip.vector.repeat_bytes))
                loads = [emit_repeats(prog, 0, chip, "VCONV", widen, reps, (ld,)) for ld in loads]
            if row_pad:
                v = _emit_by_row(prog, chip, spec.per_tile, elems // row_len, row_pad, cdt, loads)
            else:
                v = emit_vector_ops(prog, 0, chip, spec.per_tile, elems, cdt, loads)
            if spec.per_row:
                rows = elems // row_len
                for instr, passes in spec.per_row:
                    timing = chip.vector.timing(instr, dtypes_key(instr, cdt))
                    for _ in range(passes):
                        v = prog.emit(0, "VECTOR", timing.cycles(rows), instr, (v,))
            if narrow is not None:
                reps = max(1, ceil_div(int(elems * ceb), chip.vector.repeat_bytes))
                v = emit_repeats(prog, 0, chip, "VCONV", narrow, reps, (v,))
            if row_pad:
                st = prog.emit(0, p_out.pipe, (elems // row_len) * p_out.occupancy(row_pad * eb, rate_wr),
                               "store y UB->GM by row", (v,), p_out.latency_cycles)
            else:
                st = move(prog, 0, p_out, elems * eb, "store y UB->GM", (v,), rate_wr)
            pending.append(elems * eb)
            ub.release(slot, st)
        flush_writebacks(prog, 0, pending, hbm_share)
        return prog

    assign = [tuple(tiles[t] for t in core_tiles) for core_tiles in per_core]
    parts = [(program(key), cs) for key, cs in group_by_program(assign).items()]
    tl = simulate_placed(parts, cores)

    cycles = tl.total_cycles
    vec_cycles_min = 0.0  # the vector work at the plateau rate, as the compute roof
    for instr, passes in spec.per_tile:
        t = chip.vector.timing(instr, dtypes_key(instr, cdt))
        vec_cycles_min += passes * t.cycles_per_repeat * numel * ceb / chip.vector.repeat_bytes
    compute_cycles = vec_cycles_min / cores
    mem_cycles = chip.hbm_cycles(reads - kept_rd, writes - kept_wr)
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
        instructions=tl, l2_kept_bytes=kept_rd + kept_wr,
    )


__all__ = [
    "KernelReport", "simulate_matmul", "simulate_conv2d", "simulate_vector", "VECTOR_OPS", "EPILOGUES", "gating_topk_op",
    "VectorOp", "fuse_vector_ops",
    "TilingError", "gm_rates",
]
