"""pypto_lab.pto's teaching errors: each names the value, the rule and a fix (the real framework's FAQ)."""

import pytest
import torch

import pypto_lab.pto as pypto


def _run(body, *tensors, **jit_opts):
    kernel = pypto.jit(body, **jit_opts)
    return kernel(*tensors)


def _xy(shape=(64, 64), dtype=torch.float32):
    return torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype), torch.empty(shape, dtype=dtype)


def test_npu_mode_says_no_npu():
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x + y
    with pytest.raises(pypto.NoNPUError, match="no NPU here: use RunMode.SIM"):
        _run(k, *_xy(), runtime_options={"run_mode": pypto.RunMode.NPU})


def test_tile_rank_mismatch():
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(64)
        out[:] = x + y
    with pytest.raises(pypto.TileRankError) as e:
        _run(k, *_xy())
    msg = str(e.value)
    assert "(64,)" in msg and "rank 1" in msg and "rank 2" in msg and "Rule" in msg and "set_vec_tile_shapes(" in msg


def test_innermost_tile_not_32_byte_aligned():
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 12)
        out[:] = x + y
    with pytest.raises(pypto.TileAlignmentError) as e:
        _run(k, *_xy(dtype=torch.float16))
    msg = str(e.value)
    assert "12 x 2 bytes" in msg and "24 bytes" in msg and "32 bytes" in msg and "use 16" in msg


def test_vector_tiles_overflow_ub():
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(256, 512)
        out[:] = x + y
    with pytest.raises(pypto.TileCapacityError) as e:
        _run(k, *_xy((512, 1024), torch.float16))
    msg = str(e.value)
    assert "524288 bytes of UB" in msg and "196608" in msg and "set_vec_tile_shapes(64, 512)" in msg
    # the suggested tile works
    def ok(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(64, 512)
        out[:] = x + y
    _run(ok, *_xy((512, 1024), torch.float16))


def test_reduction_row_block_overflows_ub_with_fix():
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(64, 256)
        e = pypto.exp(x - pypto.amax(x, -1, True))
        out[:] = e / pypto.sum(e, -1, True)
    x = torch.randn(128, 4096)
    with pytest.raises(pypto.TileCapacityError, match=r"whole reduced axis \[1\].*set_vec_tile_shapes\(\d+, 256\)"):
        _run(k, x, torch.empty_like(x))


@pytest.mark.parametrize("tiles,buf", [
    (([256, 256], [256, 256], [64, 64]), "L0A"),
    (([256, 256], [32, 32], [256, 256]), "L0C"),
    (([128, 512], [64, 512], [128, 512]), "L1"),
])
def test_cube_tiles_overflow_l0_and_l1(tiles, buf):
    def k(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes(*tiles)
        return pypto.matmul(a, b, pypto.DT_FP16)
    a, b = torch.randn(512, 512, dtype=torch.float16), torch.randn(512, 512, dtype=torch.float16)
    with pytest.raises(pypto.TileCapacityError) as e:
        pypto.frontend.jit(k)(a, b)
    msg = str(e.value)
    assert f"bytes of {buf}" in msg and "holds" in msg and "set_cube_tile_shapes(" in msg


def test_cube_tile_alignment():
    def k(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([24, 24], [64, 64], [64, 64])
        return pypto.matmul(a, b, pypto.DT_FP16)
    a = torch.randn(64, 64, dtype=torch.float16)
    with pytest.raises(pypto.TileAlignmentError, match="m_l0 = 24.*m_l0 = 32"):
        pypto.frontend.jit(k)(a, a)


def test_operation_before_any_tile_shape():
    pypto.reset_options()

    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        out[:] = x + y
    with pytest.raises(pypto.NoTileShapeError, match=r"add .* before any vector tile shape.*set_vec_tile_shapes\("):
        _run(k, *_xy())

    def mm(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        return pypto.matmul(a, b, pypto.DT_FP16)
    a = torch.randn(64, 64, dtype=torch.float16)
    with pytest.raises(pypto.NoTileShapeError, match="set_cube_tile_shapes"):
        pypto.frontend.jit(mm)(a, a)


def test_reading_an_output_before_it_is_written():
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = out + x
    x, _, out = _xy()
    with pytest.raises(pypto.UnwrittenOutputError) as e:
        _run(k, x, out)
    assert "out" in str(e.value) and "before that region is written" in str(e.value) and "Fix" in str(e.value)

    def alloc(x: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        t = pypto.tensor([64, 64], pypto.DT_FP32, "t")
        t[:32, :] = x[:32, :]
        return t[32:, :] * 2.0
    with pytest.raises(pypto.UnwrittenOutputError, match=r"offsets \[32, 0\]"):
        pypto.frontend.jit(alloc)(x)


def test_shapes_that_do_not_broadcast():
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x + y
    with pytest.raises(pypto.BroadcastError, match=r"\[64, 64\] and \[64, 32\] do not broadcast.*dimension 1"):
        _run(k, torch.randn(64, 64), torch.randn(64, 32), torch.empty(64, 64))


def test_argument_against_annotation_and_errors_are_value_errors():
    @pypto.jit
    def k(x: pypto.Tensor([64, pypto.DYNAMIC], pypto.DT_FP16), out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x * 2
    with pytest.raises(pypto.ShapeError, match="size 32 on dimension 0, annotated 64"):
        k(torch.randn(32, 64, dtype=torch.float16), torch.empty(32, 64, dtype=torch.float16))
    with pytest.raises(ValueError):
        k(torch.randn(64, 64), torch.empty(64, 64))
    with pytest.raises(pypto.OptionError, match="double_buffer"):
        pypto.options(pass_options={"no_such_option": 1})
