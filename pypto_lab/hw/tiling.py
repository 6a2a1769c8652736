"""Tile shapes and their legality on a chip, and the default tilings.

`CubeTile` mirrors PyPTO's ``set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])``;
`VecTile` mirrors ``set_vec_tile_shapes(...)`` for a flat or row-wise vector kernel.
The capacity rules are PyPTO's (docs/api/config/pypto-set_cube_tile_shapes.md): per operand
``CeilAlign(rows, 16) x CeilAlign(cols, 16) x sizeof(dtype)`` (32 for int8) in L0A, L0B, L0C and
both L1 panels; with double buffering a level holds two tiles when two fit (ping-pong), and is
single-buffered otherwise. An illegal tiling raises `TilingError` naming the buffer, the bytes
needed, the capacity and a tiling that fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .capabilities import Epilogue, as_epilogue
from .chip import DTYPE_BYTES, Chip


class TilingError(ValueError):
    """A tile shape breaks a rule of the chip (capacity, alignment, fractal multiple)."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ceil_align(value: int, align: int) -> int:
    return ceil_div(value, align) * align


@dataclass(frozen=True)
class CubeTile:
    """Tile shapes of a Cube kernel, as in ``set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])``.

    One core task computes an ``m_l1 x n_l1`` block of C. For each ``m_l0 x n_l0`` sub-tile (one
    L0C accumulator) it walks K in ``k_l1`` panels (A ``m_l1 x k_l1`` and B ``k_l1 x n_l1`` in L1)
    and ``k_l0`` steps (A ``m_l0 x k_l0`` in L0A, B ``k_l0 x n_l0`` in L0B).
    """

    m_l0: int
    m_l1: int
    k_l0: int
    k_l1: int
    n_l0: int
    n_l1: int

    @classmethod
    def from_pypto(cls, m: list[int], k: list[int], n: list[int]) -> CubeTile:
        return cls(m[0], m[1], k[0], k[1], n[0], n[1])

    def as_pypto(self) -> tuple[list[int], list[int], list[int]]:
        return [self.m_l0, self.m_l1], [self.k_l0, self.k_l1], [self.n_l0, self.n_l1]

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"m[{self.m_l0},{self.m_l1}] k[{self.k_l0},{self.k_l1}] n[{self.n_l0},{self.n_l1}]"


@dataclass(frozen=True)
class CubePlan:
    """A legal Cube tiling with the buffer use it implies."""

    tile: CubeTile
    slots: dict[str, int]          # ping-pong slots per buffer (1 or 2)
    bytes_per_slot: dict[str, int]  # bytes of one tile in each buffer

    def buffer_peak(self) -> dict[str, int]:
        return {b: self.slots[b] * self.bytes_per_slot[b] for b in self.bytes_per_slot}


def cube_fractal(chip: Chip, dtype: str) -> tuple[int, int, int]:
    if not chip.cube.supports(dtype):
        known = ", ".join(chip.cube.fractals)
        hint = " (CANN computes fp32 matmuls on this chip in fp16)" if dtype == "fp32" else ""
        raise TilingError(
            f"{chip.name}'s Cube has no {dtype} fractal{hint}; supported dtypes: {known}. "
            f"Pick one of them, e.g. dtype='fp16'"
        )
    return chip.cube.fractals[dtype]


def _operand_align(dtype: str) -> int:
    # PyPTO: CeilAlign(., 16) for fp16/bf16/fp32, CeilAlign(., 32) for int8
    return 32 if DTYPE_BYTES[dtype] == 1 else 16


def cube_tile_bytes(tile: CubeTile, dtype: str, chip: Chip) -> dict[str, int]:
    """Bytes of one tile in each buffer."""
    a = _operand_align(dtype)
    eb = DTYPE_BYTES[dtype]
    acc_bytes = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    return {
        "L0A": ceil_align(tile.m_l0, a) * ceil_align(tile.k_l0, a) * eb,
        "L0B": ceil_align(tile.n_l0, a) * ceil_align(tile.k_l0, a) * eb,
        "L0C": ceil_align(tile.m_l0, a) * ceil_align(tile.n_l0, a) * acc_bytes,
        "L1": int((ceil_align(tile.m_l1, a) + ceil_align(tile.n_l1, a)) * ceil_align(tile.k_l1, a) * eb),
    }


def _fit_hint(chip: Chip, dtype: str, m: int, k: int, n: int) -> str:
    try:
        return f"a tiling that fits: {default_cube_tile(chip, m, k, n, dtype)}"
    except TilingError:
        return "reduce every tile dimension"


def plan_cube(chip: Chip, tile: CubeTile, dtype: str, m: int, k: int, n: int, double_buffer: bool = True,
              epilogue: Epilogue | str = "none") -> CubePlan:
    """Check a Cube tiling against the chip's rules and return its buffer plan.

    On chips with a BiasTable and a FixPipe buffer (AIC-C-220), a FixPipe bias needs ``n_l0``
    fp32 values in BT and a FixPipe (de)quantisation ``n_l0`` 8-byte scales in FB (PyPTO's rules).
    """
    epilogue = as_epilogue(chip, epilogue)
    cube_fractal(chip, dtype)
    eb = DTYPE_BYTES[dtype]
    align_elems = 16 if dtype == "fp32" else 32 // eb
    fields = tile.to_dict()
    for name, value in fields.items():
        if not isinstance(value, int) or value <= 0:
            raise TilingError(f"tile {name} = {value!r}: every tile size must be a positive integer")
        if value % align_elems:
            raise TilingError(
                f"tile {name} = {value}: tile sizes must be multiples of {align_elems} elements "
                f"({'16-element' if dtype == 'fp32' else '32-byte'} alignment for {dtype}); "
                f"try {name} = {ceil_align(value, align_elems)}"
            )
    for dim in ("m", "k", "n"):
        l0, l1 = fields[f"{dim}_l0"], fields[f"{dim}_l1"]
        if l0 > l1 or l1 % l0:
            raise TilingError(
                f"tile {dim}_l1 = {l1} must be a multiple of {dim}_l0 = {l0} (and {dim}_l0 <= {dim}_l1); "
                f"try {dim}_l1 = {ceil_align(l1, l0) if l1 >= l0 else l0}"
            )
    need = cube_tile_bytes(tile, dtype, chip)
    slots = {}
    for buf, nbytes in need.items():
        cap = chip.buffer(buf).size_bytes
        if nbytes > cap:
            raise TilingError(
                f"tile {tile} does not fit {buf} on {chip.name}: it needs {nbytes} bytes "
                f"({nbytes / 1024:.1f} KB), {buf} holds {cap} bytes ({cap / 1024:.0f} KB); "
                + _fit_hint(chip, dtype, m, k, n)
            )
        slots[buf] = 2 if (double_buffer and 2 * nbytes <= cap) else 1
    side = {}
    if "BT" in chip.buffers and "bias" in epilogue.fixpipe:
        side["BT"] = (tile.n_l0 * 4, "a FixPipe bias keeps n_l0 fp32 values in the BiasTable")
    if "FB" in chip.buffers and ({"dequant", "quant"} & epilogue.fixpipe):
        side["FB"] = (tile.n_l0 * 8, "FixPipe quantisation keeps n_l0 8-byte scales in the FixPipe buffer")
    for buf, (nbytes, why) in side.items():
        cap = chip.buffer(buf).size_bytes
        if nbytes > cap:
            per = 4 if buf == "BT" else 8
            raise TilingError(
                f"tile {tile} does not fit {buf} on {chip.name}: {why}, {nbytes} bytes; {buf} holds {cap} "
                f"bytes; use n_l0 <= {cap // per}"
            )
        need[buf] = nbytes
        slots[buf] = 1
    return CubePlan(tile, slots, need)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def cube_tile_candidates(chip: Chip, m: int, k: int, n: int, dtype: str = "fp16",
                         within: float | None = None) -> list[CubeTile]:
    """Legal tilings of an ``m x k x n`` matmul, best first by a per-block roofline estimate
    (with ``within``: only those estimated at most ``within`` times the best).

    Candidates: L0C tiles of 16..256 per side; ``k_l0`` as long as two tiles fit L0A and L0B;
    ``k_l1`` as long as two K panels fit L1. Each candidate is scored by
    ``waves x max(Cube cycles, GM cycles) per block``, where waves = blocks / cores (rounded up),
    so the order weighs tile efficiency against load balance over the cores. The estimate sees
    neither pipeline start-up nor the epilogue: a tiling search simulates the first few.
    """
    m0, k0, n0 = cube_fractal(chip, dtype)
    eb = DTYPE_BYTES[dtype]
    a = _operand_align(dtype)
    acc = DTYPE_BYTES[chip.cube.accumulator[dtype]]
    l0c = chip.buffer("L0C").size_bytes
    l0a = chip.buffer("L0A").size_bytes
    l0b = chip.buffer("L0B").size_bytes
    l1 = chip.buffer("L1").size_bytes
    cores = chip.cube_cores
    rate = min(chip.data_path("GM_TO_L1").bytes_per_cycle, chip.l2_bytes_per_cycle() / cores)
    mm = ceil_align(max(m, 1), a)
    nn = ceil_align(max(n, 1), a)
    kk = ceil_align(max(k, 1), a)
    scored = {}
    for tm in (256, 128, 64, 32, 16):
        for tn in (256, 128, 64, 32, 16):
            if tm % a or tn % a or tm > max(mm, a) * 2 or tn > max(nn, a) * 2:
                continue
            tm_, tn_ = min(tm, mm), min(tn, nn)
            if tm_ * tn_ * acc > l0c:
                continue
            kl0 = 512
            while kl0 > a and (2 * tm_ * kl0 * eb > l0a or 2 * tn_ * kl0 * eb > l0b):
                kl0 //= 2
            kl0 = min(kl0, max(a, _pow2_floor(kk)))
            if tm_ * kl0 * eb > l0a or tn_ * kl0 * eb > l0b:
                continue
            kl1 = kl0
            while kl1 * 2 <= ceil_align(kk, kl0) and 2 * (tm_ + tn_) * (kl1 * 2) * eb <= l1:
                kl1 *= 2
            blocks = ceil_div(mm, tm_) * ceil_div(nn, tn_)
            waves = ceil_div(blocks, cores)
            cube = ceil_div(tm_, m0) * ceil_div(kk, k0) * ceil_div(tn_, n0)
            gm = (tm_ + tn_) * kk * eb / rate
            est = waves * max(cube, gm)
            tile = CubeTile(tm_, tm_, kl0, kl1, tn_, tn_)
            scored.setdefault(tile, (est, -kl1, -(tm_ * tn_)))
    if not scored:
        raise TilingError(f"no legal Cube tiling on {chip.name} for {dtype}: the buffers are too small")
    ranked = sorted(scored, key=lambda t: scored[t])
    if within is not None:
        limit = scored[ranked[0]][0] * within
        ranked = [t for t in ranked if scored[t][0] <= limit]
    return ranked


def default_cube_tile(chip: Chip, m: int, k: int, n: int, dtype: str = "fp16") -> CubeTile:
    """A good legal tiling: the first of `cube_tile_candidates`."""
    return cube_tile_candidates(chip, m, k, n, dtype)[0]


@dataclass(frozen=True)
class VecTile:
    """Tile of a Vector kernel, as in ``set_vec_tile_shapes(rows, cols)``: ``rows x cols`` elements
    per UB tile; row-wise ops (softmax, norms) need ``cols`` to cover the whole row."""

    rows: int
    cols: int

    @property
    def elems(self) -> int:
        return self.rows * self.cols

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"vec[{self.rows},{self.cols}]"


def _vec_fit_hint(tile: VecTile, eb: float, n_buffers: int, cap: int, row_len: int | None,
                  double_buffer: bool) -> str:
    """A smaller tile than ``tile`` that fits UB: fewer rows, else (element-wise ops) fewer columns."""
    row_bytes = tile.cols * eb * n_buffers
    for slots in ((2, 1) if double_buffer else (1,)):
        rows = int(cap // (row_bytes * slots))
        if rows >= 1:
            extra = "" if slots == 2 or not double_buffer else " (one slot: no room for double buffering)"
            return f"a tiling that fits: vec[{rows},{tile.cols}]{extra}"
    if row_len is not None:
        return (f"one row of {tile.cols} elements does not fit {n_buffers} times: split the row (a two-pass "
                "reduction) or use a smaller dtype")
    align = max(1, int(32 // eb))
    cols = int(cap // (n_buffers * eb * (2 if double_buffer else 1))) // align * align
    return f"a tiling that fits: vec[1,{cols}]"


def check_vec_tile(chip: Chip, tile: VecTile, dtype: str, n_buffers: int, row_len: int | None,
                   double_buffer: bool = True) -> int:
    """Validate a vector tile; return its UB slots (1 or 2). ``n_buffers`` tiles live in UB at once."""
    eb = DTYPE_BYTES[dtype]
    for name, value in (("rows", tile.rows), ("cols", tile.cols)):
        if not isinstance(value, int) or value <= 0:
            raise TilingError(f"vector tile {name} = {value!r}: must be a positive integer")
    if (tile.cols * eb) % 32:
        fix = ceil_align(tile.cols, max(1, int(32 // eb)))
        raise TilingError(
            f"vector tile cols = {tile.cols} ({tile.cols * eb:g} bytes of {dtype}): the innermost tile "
            f"dimension must be a multiple of 32 bytes (UB alignment); try cols = {fix}"
        )
    if row_len is not None and tile.cols < row_len:
        raise TilingError(
            f"vector tile cols = {tile.cols} is shorter than the row ({row_len} elements): a row-wise op "
            f"(softmax, norm, reduction) needs the whole row in UB; try cols = {ceil_align(row_len, int(32 // eb) or 1)}"
        )
    need = int(tile.elems * eb * n_buffers)
    cap = chip.buffer("UB").size_bytes
    if need > cap:
        raise TilingError(
            f"vector tile {tile} does not fit UB on {chip.name}: {n_buffers} live tiles of {dtype} need "
            f"{need} bytes ({need / 1024:.1f} KB), UB holds {cap} bytes ({cap / 1024:.0f} KB); "
            + _vec_fit_hint(tile, eb, n_buffers, cap, row_len, double_buffer)
        )
    return 2 if (double_buffer and 2 * need <= cap) else 1


def default_vec_tile(chip: Chip, numel: int, dtype: str, n_buffers: int, row_len: int | None) -> VecTile:
    """Largest tile that leaves room for ping-pong in UB (16 KB per operand at most, a common
    Ascend C choice that keeps several tiles in flight)."""
    eb = DTYPE_BYTES[dtype]
    cap = chip.buffer("UB").size_bytes
    per_buf = min(16384, cap // (2 * n_buffers))
    if row_len is not None:
        cols = ceil_align(row_len, max(1, int(32 // eb)))
        if cols * eb * n_buffers > cap:
            raise TilingError(
                f"a row of {row_len} {dtype} elements needs {cols * eb * n_buffers:.0f} bytes in UB for "
                f"{n_buffers} live buffers; UB holds {cap} bytes: split the row (two-pass reduction) or use a "
                "smaller dtype"
            )
        rows = max(1, int(per_buf // (cols * eb)))
        rows = min(rows, max(1, ceil_div(numel, row_len)))
        return VecTile(rows, cols)
    cols = max(int(32 // eb), _pow2_floor(int(per_buf // eb)))
    cols = min(cols, ceil_align(max(numel, 1), max(1, int(32 // eb))))
    return VecTile(1, cols)


def naive_cube_tile(chip: Chip, m: int, k: int, n: int, dtype: str = "fp16") -> CubeTile:
    """The textbook tiling an untuned kernel uses: 128 x 128 output blocks, K in steps of 64
    elements (one L1 panel per L0 step, so no reuse of a panel across steps), clamped to the
    matrix. Level 0 of `optimize` runs every Cube kernel with it."""
    a = _operand_align(dtype)
    tile = CubeTile(min(128, ceil_align(m, a)), min(128, ceil_align(m, a)), min(64, ceil_align(k, a)),
                    min(64, ceil_align(k, a)), min(128, ceil_align(n, a)), min(128, ceil_align(n, a)))
    plan_cube(chip, tile, dtype, m, k, n)  # legal on every shipped chip; a custom chip may refuse it
    return tile
