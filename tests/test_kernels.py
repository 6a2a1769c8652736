"""Cube and Vector kernels on the chip model: roofline, monotonicity, double buffering, tiling rules."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pypto_lab
from pypto_lab import CubeTile, TilingError, VecTile, simulate_matmul, simulate_vector
from pypto_lab.hw import get_chip

CHIPS = ["Ascend910A", "Ascend910B1", "Ascend910B3", "Ascend310P3"]
FIXED = CubeTile(64, 64, 64, 128, 64, 64)  # legal on every chip


def test_report_fields_and_json():
    r = simulate_matmul(1024, 1024, 1024, chip="Ascend910B1")
    d = r.to_dict(timeline_limit=5)
    for key in ("cycles", "time_us", "tflops", "pipe_busy", "buffer_peak", "instructions"):
        assert key in d
    assert set(d["pipe_busy"]) == {"MTE1", "MTE2", "MTE3", "FIXP", "CUBE", "VECTOR", "SCALAR"}
    assert len(d["instructions"]) == 5 and d["instructions"][0]["pipe"] == "MTE2"
    json.dumps(d)
    assert r.time_us == pytest.approx(r.cycles / 1850)
    assert r.tflops == pytest.approx(2 * 1024**3 / (r.time_us * 1e-6) / 1e12)
    assert r.pipe_busy["CUBE"] > 0 and r.pipe_busy["FIXP"] > 0 and r.pipe_busy["VECTOR"] == 0


@pytest.mark.parametrize("chip", CHIPS)
def test_large_gemm_is_fast_but_never_beats_peak(chip):
    r = simulate_matmul(4096, 4096, 4096, chip=chip)
    peak = get_chip(chip).peak_tflops("fp16")
    assert r.tflops <= peak
    assert r.cycles >= r.roofline_cycles
    if chip == "Ascend910A":
        assert r.tflops >= 0.6 * peak, f"{r.tflops:.1f} of {peak:.1f} TFLOPS"


def test_data_paths_differ_by_core_version():
    b = simulate_matmul(512, 512, 512, chip="Ascend910B1")
    a = simulate_matmul(512, 512, 512, chip="Ascend910A")
    assert b.pipe_busy["FIXP"] > 0 and b.pipe_busy["VECTOR"] == 0        # FixPipe drains L0C
    assert a.pipe_busy["FIXP"] == 0 and a.pipe_busy["VECTOR"] > 0        # L0C -> UB via Vector
    assert "L0C->UB" in a.instructions.kinds and "fixpipe L0C->GM" in b.instructions.kinds


def test_vector_epilogue_on_910b_runs_on_the_vector_cores():
    r = simulate_matmul(1024, 1024, 1024, chip="Ascend910B1", epilogue="gelu")
    tl = r.instructions
    vec_cores = {int(c) for c, p in zip(tl.core, tl.pipe) if p == 5}
    assert vec_cores and min(vec_cores) >= get_chip("Ascend910B1").cube_cores
    plain = simulate_matmul(1024, 1024, 1024, chip="Ascend910B1")
    assert r.cycles > plain.cycles and r.gm_bytes > plain.gm_bytes


def test_int8_doubles_the_cube_rate():
    f = simulate_matmul(4096, 4096, 4096, chip="Ascend910B1", dtype="fp16")
    q = simulate_matmul(4096, 4096, 4096, chip="Ascend910B1", dtype="int8")
    assert q.pipe_busy["CUBE"] < 0.6 * f.pipe_busy["CUBE"]


def test_dtype_the_cube_lacks_is_a_clear_error():
    with pytest.raises(TilingError, match=r"Ascend910A's Cube has no fp32 fractal.*fp16"):
        simulate_matmul(64, 64, 64, chip="Ascend910A", dtype="fp32")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 1500), st.integers(1, 1500), st.integers(1, 1500), st.sampled_from(CHIPS),
       st.booleans())
def test_cycles_never_beat_the_roofline(m, k, n, chip, db):
    r = simulate_matmul(m, k, n, chip=chip, double_buffer=db)
    c = get_chip(chip)
    compute = 2 * m * k * n / (2 * c.cube.macs_per_cycle("fp16") * c.cube_cores)
    memory = (m * k + k * n + m * n) * 2 / c.hbm_bytes_per_cycle()
    assert r.cycles >= max(compute, memory) * (1 - 1e-9)
    assert not r.instructions.overlapping()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 1024), st.integers(1, 1024), st.integers(1, 1024), st.integers(0, 300),
       st.integers(0, 600), st.integers(0, 300), st.integers(0, 2), st.sampled_from(CHIPS))
def test_more_work_never_takes_fewer_cycles(m, k, n, dm, dk, dn, extra_batch, chip):
    small = simulate_matmul(m, k, n, chip=chip, tile=FIXED)
    big = simulate_matmul(m + dm, k + dk, n + dn, chip=chip, tile=FIXED, batch=1 + extra_batch)
    assert big.cycles >= small.cycles


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["add", "mul", "exp", "relu", "gelu", "cast"]), st.integers(1, 1 << 22),
       st.integers(0, 1 << 20), st.sampled_from(CHIPS))
def test_vector_kernels_respect_the_roofline_and_grow_with_work(op, numel, extra, chip):
    r = simulate_vector(op, numel, chip=chip)
    c = get_chip(chip)
    moved = numel * 2 * (pypto_lab.hw.kernels.VECTOR_OPS[op].inputs + 1)
    assert r.cycles >= moved / c.hbm_bytes_per_cycle() * (1 - 1e-9)
    bigger = simulate_vector(op, numel + extra, chip=chip, tile=VecTile(**r.tile))
    assert bigger.cycles >= r.cycles
    serial = simulate_vector(op, numel, chip=chip, tile=VecTile(**r.tile), double_buffer=False)
    assert r.cycles <= serial.cycles


@settings(max_examples=25, deadline=None)
@given(st.integers(16, 2048), st.integers(16, 2048), st.integers(16, 2048), st.sampled_from(CHIPS))
def test_double_buffering_is_never_slower(m, k, n, chip):
    tile = pypto_lab.hw.tiling.default_cube_tile(get_chip(chip), m, k, n)
    on = simulate_matmul(m, k, n, chip=chip, tile=tile, double_buffer=True)
    off = simulate_matmul(m, k, n, chip=chip, tile=tile, double_buffer=False)
    assert on.cycles <= off.cycles + 1e-6


def test_double_buffering_overlaps_loads_with_compute():
    on = simulate_matmul(2048, 2048, 2048, chip="Ascend910B1")
    off = simulate_matmul(2048, 2048, 2048, chip="Ascend910B1", tile=CubeTile(**on.tile), double_buffer=False)
    assert on.cycles < 0.8 * off.cycles
    assert on.buffer_peak["L1"] == 2 * off.buffer_peak["L1"]


def test_bigger_tiles_cut_gm_traffic():
    small = simulate_matmul(2048, 2048, 2048, chip="Ascend910B1", tile=CubeTile(32, 32, 32, 64, 32, 32))
    big = simulate_matmul(2048, 2048, 2048, chip="Ascend910B1", tile=CubeTile(128, 128, 64, 256, 256, 256))
    assert big.gm_bytes < small.gm_bytes / 3
    assert big.cycles < small.cycles


def test_an_l1_block_is_reused_only_while_one_k_panel_covers_k():
    """K in one L1 panel: a 128 x 128 block loads its A rows and B columns once for its four
    64 x 64 sub-tiles (half the reads of 64 x 64 blocks). K over several panels: each sub-tile
    streams its own rows and columns through L1, so the reads equal those of 64 x 64 blocks."""
    def reads(k, tile):
        r = simulate_matmul(1024, k, 1024, chip="Ascend910B1", tile=tile)
        return r.gm_bytes - 1024 * 1024 * 2  # less the fp16 result, written once
    big, small = CubeTile(64, 128, 64, 256, 64, 128), CubeTile(64, 64, 64, 256, 64, 64)
    assert reads(256, big) == 64 * (128 + 128) * 256 * 2 == reads(256, small) / 2
    assert reads(1024, big) == 64 * (2 * 128 + 2 * 128) * 1024 * 2 == reads(1024, small)


def test_illegal_tiling_names_buffer_bytes_capacity_and_a_fix():
    with pytest.raises(TilingError) as exc:
        simulate_matmul(1024, 1024, 1024, chip="Ascend910B1", tile=CubeTile(256, 256, 64, 256, 256, 256))
    msg = str(exc.value)
    assert "L0C" in msg and "262144 bytes" in msg and "131072 bytes" in msg and "a tiling that fits: m[" in msg
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("tile, pattern", [
    (CubeTile(24, 24, 64, 64, 64, 64), r"m_l0 = 24.*multiples of 16.*try m_l0 = 32"),
    (CubeTile(64, 96, 64, 64, 64, 64), r"m_l1 = 96 must be a multiple of m_l0 = 64"),
    (CubeTile(64, 64, 64, 4096, 64, 64), r"does not fit L1"),
    (CubeTile(0, 64, 64, 64, 64, 64), r"positive integer"),
])
def test_tiling_rules(tile, pattern):
    with pytest.raises(TilingError, match=pattern):
        simulate_matmul(512, 512, 512, chip="Ascend910B1", tile=tile)


def test_fixpipe_side_buffers_limit_n_l0():
    wide = CubeTile(16, 16, 16, 16, 512, 512)        # legal in L0A/L0B/L0C and L1
    simulate_matmul(64, 64, 1024, chip="Ascend910B1", tile=wide)
    with pytest.raises(TilingError, match=r"does not fit BT.*2048 bytes; BT holds 1024 bytes; use n_l0 <= 256"):
        simulate_matmul(64, 64, 1024, chip="Ascend910B1", tile=wide, epilogue="bias")
    with pytest.raises(TilingError, match=r"does not fit FB.*4096 bytes; FB holds 2048 bytes; use n_l0 <= 256"):
        simulate_matmul(64, 64, 1024, chip="Ascend910B1", tile=wide, epilogue="quant")
    r = simulate_matmul(64, 64, 1024, chip="Ascend910B1", tile=CubeTile(16, 16, 16, 16, 256, 256), epilogue="bias")
    assert r.buffer_peak["BT"] == 1024


def test_bad_shapes_and_options():
    with pytest.raises(ValueError, match="m = 0"):
        simulate_matmul(0, 16, 16)
    with pytest.raises(ValueError, match="epilogue 'softmax' is not known"):
        simulate_matmul(16, 16, 16, epilogue="softmax")
    with pytest.raises(ValueError, match="vector op 'tanhh' is not known"):
        simulate_vector("tanhh", 1024)


def test_conv_as_implicit_gemm():
    r = pypto_lab.simulate_conv2d(1, 64, 56, 56, 64, kernel=3, padding=1, chip="Ascend910A")
    assert r.shape["gemm_m"] == 56 * 56 and r.shape["gemm_k"] == 64 * 9 and r.shape["gemm_n"] == 64
    assert r.flops == 2 * 56 * 56 * 64 * 9 * 64
    with pytest.raises(ValueError, match="does not fit"):
        pypto_lab.simulate_conv2d(1, 3, 2, 2, 8, kernel=5)


@pytest.mark.parametrize("kwargs, rule", [
    ({"padding": -1}, r"padding = -1: padding must be a non-negative integer.*padding=0"),
    ({"kernel": -1}, r"kernel = -1: the kernel size must be a positive integer.*kernel=3"),
    ({"kernel": (3, 0)}, r"kernel = \(3, 0\)"),
    ({"stride": 0}, r"stride = 0: the stride must be a positive integer.*stride=1"),
    ({"stride": 1.5}, r"stride = 1.5"),
])
def test_conv_rejects_impossible_geometry_naming_the_rule(kwargs, rule):
    args = {"kernel": 3, "stride": 1, "padding": 1, **kwargs}
    with pytest.raises(ValueError, match=rule):
        pypto_lab.simulate_conv2d(1, 64, 56, 56, 64, **args)


def test_conv_accepts_a_kernel_pair():
    r = pypto_lab.simulate_conv2d(1, 64, 28, 28, 64, kernel=(1, 7), padding=0, chip="Ascend910A")
    assert (r.shape["kh"], r.shape["kw"]) == (1, 7) and r.shape["gemm_k"] == 64 * 7


# ---- vector kernels -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, rule", [
    ({"dtype": "int64"}, r"vector dtype 'int64' is not supported: the Vector unit computes fp16, bf16, fp32, int8, "
                         r"int16, int32.*int64 -> int32"),
    ({"dtype": "int4"}, r"vector dtype 'int4' is not supported.*int4 -> int8"),
    ({"compute_dtype": "int8"}, r"compute_dtype 'int8' is not supported: a widened computation runs in fp16, bf16, "
                                r"fp32; pass compute_dtype='fp32'"),
    ({"row_len": -1}, r"row_len = -1: a row must hold a positive integer number of elements"),
])
def test_vector_rejects_what_the_vector_unit_cannot_do(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        simulate_vector("softmax", 4096, **{"row_len": 1024, **kwargs})


def test_vector_integer_tensors_and_widened_compute_still_run():
    assert simulate_vector("add", 4096, dtype="int16").cycles > 0
    assert simulate_vector("softmax", 4096, dtype="bf16", compute_dtype="fp32", row_len=1024).cycles > 0

@pytest.mark.parametrize("chip", CHIPS)
def test_vector_add_is_memory_bound_and_respects_roofline(chip):
    r = simulate_vector("add", 16 * 2**20, dtype="fp16", chip=chip)
    assert r.bound == "memory" and r.cycles >= r.roofline_cycles
    assert r.pipe_busy["MTE2"] > 0 and r.pipe_busy["VECTOR"] > 0 and r.pipe_busy["MTE3"] > 0


def test_exp_div_sqrt_cost_more_than_add():
    n = 1 << 20
    add = simulate_vector("add", n, chip="Ascend910B1").pipe_busy["VECTOR"]
    for op in ("exp", "div", "sqrt"):
        assert simulate_vector(op, n, chip="Ascend910B1").pipe_busy["VECTOR"] > 1.5 * add


def test_vector_double_buffering_overlaps():
    # GELU's vector work is comparable to its data movement: ping-pong hides one behind the other
    tile = VecTile(1, 4096)
    on = simulate_vector("gelu", 1 << 22, chip="Ascend910B1", tile=tile, double_buffer=True)
    off = simulate_vector("gelu", 1 << 22, chip="Ascend910B1", tile=tile, double_buffer=False)
    assert on.cycles < 0.8 * off.cycles
    # a kernel bound by HBM gains nothing: the memory system is busy either way
    exp_on = simulate_vector("exp", 1 << 22, chip="Ascend910B1", tile=tile, double_buffer=True)
    exp_off = simulate_vector("exp", 1 << 22, chip="Ascend910B1", tile=tile, double_buffer=False)
    assert exp_on.bound == "memory" and exp_on.cycles == pytest.approx(exp_off.cycles, rel=0.02)


@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm", "sum", "max", "gelu", "relu", "cast"])
def test_every_vector_op_runs(op):
    r = simulate_vector(op, 64 * 1024, dtype="fp16", chip="Ascend910B1", row_len=1024)
    assert r.cycles > 0 and r.cycles >= r.roofline_cycles


def test_vector_tile_rules():
    with pytest.raises(TilingError, match=r"cols = 100 .*multiple of 32 bytes.*try cols = 112"):
        simulate_vector("add", 4096, tile=VecTile(1, 100))
    with pytest.raises(TilingError, match=r"does not fit UB.*196608 bytes.*a tiling that fits: vec\["):
        simulate_vector("add", 1 << 22, tile=VecTile(64, 4096))
    # one row too wide: the hint shrinks the columns, never repeats the tile it refuses
    with pytest.raises(TilingError, match=r"does not fit UB.*a tiling that fits: vec\[1,16384\]") as exc:
        simulate_vector("add", 1 << 22, tile=VecTile(1, 65536))
    hint = str(exc.value).rsplit("fits: ", 1)[1]
    rows, cols = (int(x) for x in hint.strip("vec[]").split(","))
    assert simulate_vector("add", 1 << 22, tile=VecTile(rows, cols)).cycles > 0
    with pytest.raises(TilingError, match=r"shorter than the row"):
        simulate_vector("softmax", 8192, row_len=2048, tile=VecTile(1, 1024))


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend910B1"])
def test_a_requantising_epilogue_writes_an_int8_copy_beside_a_wider_result(chip):
    """CANN's double-output quant fusion: quant on a result that stays fp16 writes an int8 copy too
    (one more byte per element, FixPipe's second pass or a second store); an int8 result alone
    writes one byte per element instead of two."""
    from pypto_lab.hw.capabilities import place_epilogue

    c = pypto_lab.get_chip(chip)
    deq = place_epilogue(c, dequant=True, activation="relu")
    req = place_epilogue(c, dequant=True, activation="relu", quant=True)
    m = k = n = 512
    plain = simulate_matmul(m, k, n, dtype="int8", out_dtype="fp16", chip=c, epilogue=deq)
    dual = simulate_matmul(m, k, n, dtype="int8", out_dtype="fp16", chip=c, epilogue=req)
    alone = simulate_matmul(m, k, n, dtype="int8", out_dtype="int8", chip=c, epilogue=req)
    assert dual.gm_bytes == plain.gm_bytes + m * n and alone.gm_bytes == plain.gm_bytes - m * n
    assert dual.cycles >= plain.cycles and any("int8 copy" in kind for kind in dual.instructions.kinds)
    assert not any("int8 copy" in kind for kind in alone.instructions.kinds)
