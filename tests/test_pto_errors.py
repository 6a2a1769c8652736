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


def test_tile_shorter_than_the_tensor_rank_is_refused():
    # the real rule: TileShapeVerifier::VerifyTileShapeSize (framework/src/interface/operation/
    # tile_shape_verifier.h) refuses a vector tile with fewer sizes than the output has dimensions
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(64)
        out[:] = x + y
    with pytest.raises(pypto.TileRankError) as e:
        _run(k, *_xy())
    msg = str(e.value)
    assert "(64,)" in msg and "rank 1" in msg and "rank 2" in msg and "Rule" in msg and "set_vec_tile_shapes(" in msg
    assert "at least one size per tensor dimension" in msg


def test_tile_longer_than_the_tensor_rank_tiles_axis_i_by_size_i():
    # the real rule: ElementwiseInputVecTile (framework/src/interface/operation/tile_shape_resolver.cpp)
    # and the Tiled*Operation functions tile tensor axis i by vecTile[i]; sizes past the rank are ignored
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 8)
        out[:] = x + x
    x, out = torch.randn(40), torch.empty(40)
    kernel = pypto.jit(k)
    kernel(x, out)
    assert torch.equal(out, x + x)
    (g,) = [g for g in kernel.last_compiled.tile_graph.groups if g.kind == "vector"]
    assert g.tile == (16,) and g.n_tasks == 3  # 40 elements in tiles of 16, 16, 8


def test_innermost_tile_not_32_byte_aligned_is_padded_in_ub():
    # the real rule: the PadLocalBuffer pass (framework/src/passes/tile_graph_pass/graph_constraint/
    # pad_local_buffer.cpp) pads the last axis of a UB tile to 32 bytes instead of refusing it
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 12)
        out[:] = x + y
    x, y, out = _xy(dtype=torch.float16)
    kernel = pypto.jit(k)
    kernel(x, y, out)
    assert torch.equal(out, x + y)
    (g,) = [g for g in kernel.last_compiled.tile_graph.groups if g.kind == "vector"]
    assert g.tile == (16, 12) and g.n_tasks == 4 * 6  # 64 columns in tiles of 12 (the last one 4)
    # x and y are live at once and out takes x's buffer (SrcDstBufferMerge); each row of 12 fp16
    # (24 bytes) occupies a 32-byte block
    assert g.ub_bytes == 2 * 16 * 32
    # the transfers move the real bytes: x and y read, out written, once each
    assert kernel.last_run.gm_bytes == 3 * 64 * 64 * 2


def test_a_reduced_row_occupies_a_whole_32_byte_block_of_ub():
    # the same PadLocalBuffer rule: amax(keepdim=True) leaves one fp32 per row (4 bytes), padded to 32
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 64)
        out[:] = pypto.amax(x, dim=-1, keepdim=True)
    x, out = torch.randn(64, 64), torch.empty(64, 1)
    kernel = pypto.jit(k)
    kernel(x, out)
    assert torch.equal(out, x.amax(-1, keepdim=True))
    (g,) = kernel.last_compiled.tile_graph.groups
    assert g.ub_bytes == 16 * 64 * 4 + 16 * 32  # the input tile, then 16 padded one-element rows


def test_cast_to_fp16_with_an_8_element_tile_runs():
    # the case of examples/01_beginner/transform/transform_ops.py (cast_kernel): 8 fp16 = 16 bytes, padded to 32
    def k(x: pypto.Tensor([], pypto.DT_FP32), out: pypto.Tensor([], pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8)
        out[:] = pypto.cast(x, pypto.DT_FP16)
    x, out = torch.randn(20), torch.empty(20, dtype=torch.float16)
    kernel = pypto.jit(k)
    kernel(x, out)
    assert torch.equal(out, x.half())
    (g,) = kernel.last_compiled.tile_graph.groups
    assert g.n_tasks == 3 and g.ub_bytes == 8 * 4 + 32  # 32 bytes of fp32 in, 16 bytes of fp16 out padded to 32
    assert kernel.last_run.gm_bytes == 20 * 4 + 20 * 2


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


def test_reduction_row_block_larger_than_ub_spills_through_gm():
    """A softmax task spanning 64 x 4096 fp32 rows does not fit UB: as the real compiler does, its
    row-spanning results go through a GM workspace (stored and loaded back, tile by tile) instead of
    being refused; the values are the same and the spill is costed."""
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(64, 256)
        e = pypto.exp(x - pypto.amax(x, -1, True))
        out[:] = e / pypto.sum(e, -1, True)
    x = torch.randn(128, 4096)
    out = torch.empty_like(x)
    kern = pypto.jit(k)
    kern(x, out)
    assert torch.allclose(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    assert any(g.spill for g in kern.last_compiled.tile_graph.groups)
    assert kern.last_run.gm_bytes > 2 * x.numel() * 4   # the input and output, plus the spilled workspace


def test_reduction_whose_single_tile_overflows_ub_is_refused_with_fix():
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(128, 4096)
        e = pypto.exp(x - pypto.amax(x, -1, True))
        out[:] = e / pypto.sum(e, -1, True)
    x = torch.randn(128, 4096)
    with pytest.raises(pypto.TileCapacityError, match=r"whole reduced axis \[1\].*set_vec_tile_shapes\("):
        _run(k, x, torch.empty_like(x))


@pytest.mark.parametrize("tiles,buf", [
    (([256, 256], [256, 256], [64, 64]), "L0A"),
    (([256, 256], [32, 32], [256, 256]), "L0C"),
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
    """The real CheckCubeTiling's rules: k_l0 and n_l0 multiples of 16 elements; m_l0 free unless A
    is transposed (then 32 bytes)."""
    def k(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([16, 16], [24, 24], [64, 64])
        return pypto.matmul(a, b, pypto.DT_FP16)
    a = torch.randn(64, 64, dtype=torch.float16)
    with pytest.raises(pypto.TileAlignmentError, match="k_l0 = 24.*k_l0 = 32"):
        pypto.frontend.jit(k)(a, a)

    def m8(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([8, 8], [64, 64], [64, 64])
        return pypto.matmul(a, b, pypto.DT_FP16)
    assert torch.allclose(pypto.frontend.jit(m8)(a, a).float(), (a.float() @ a.float()), rtol=1e-2, atol=1e-1)

    def m8t(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([8, 8], [64, 64], [64, 64])
        return pypto.matmul(a, b, pypto.DT_FP16, a_trans=True)
    with pytest.raises(pypto.TileAlignmentError, match="m_l0 = 8.*A is transposed"):
        pypto.frontend.jit(m8t)(a, a)


def test_l1_panels_that_do_not_fit_are_streamed_not_refused():
    """The real framework takes L1 sizes without a capacity check (the DeepSeek-V4 indexer asks for
    (64 + 16) x 4096 bf16 = 640 KB of a 512 KB L1): the cost model holds the longest K panel that fits."""
    def k(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([128, 512], [64, 512], [128, 512])
        return pypto.matmul(a, b, pypto.DT_FP16)
    a = torch.randn(512, 512, dtype=torch.float16)
    kern = pypto.frontend.jit(k)
    out = kern(a, a)
    assert torch.allclose(out.float(), a.float() @ a.float(), rtol=1e-2, atol=0.5)
    cube = [g for g in kern.last_compiled.tile_graph.groups if g.kind == "cube"][0]
    assert cube.cube_tile.k_l1 < 512 and (cube.cube_tile.m_l1 + cube.cube_tile.n_l1) * cube.cube_tile.k_l1 * 2 <= 512 * 1024


def test_cube_tile_capacity_counts_the_part_the_matmul_uses():
    """A tile larger than the matrix uses only the matrix's size (the real framework's
    min(tile, view)): n_l0 = 128 against n = 24 needs 512 x 32 fp32 of L0B, which fits 64 KB."""
    def k(a: pypto.Tensor[...], b: pypto.Tensor[...]):
        pypto.set_cube_tile_shapes([16, 16], [512, 1024], [128, 128])
        return pypto.matmul(a, b, pypto.DT_FP32, b_trans=True)
    a, b = torch.randn(16, 1024), torch.randn(24, 1024)
    assert torch.allclose(pypto.frontend.jit(k)(a, b), a @ b.T, rtol=1e-4, atol=1e-3)


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
    """A kernel argument read before it is written is an in-place update (the real models update KV
    caches and recurrent states so): it runs, on the values the tensor held, with a warning; a
    pypto.tensor buffer read before it is written holds nothing: an error."""
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = out + x
    x, _, out = _xy()
    out = torch.ones_like(out)
    with pytest.warns(pypto.errors.InPlaceUpdateWarning, match="in-place update"):
        _run(k, x, out)
    assert torch.allclose(out, 1.0 + x)

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


def test_a_longer_tile_sizes_special_ops_by_its_leading_sizes():
    # tile_shape_resolver.cpp (default rule): a special op such as gathermask takes tile size i for axis i too,
    # so a third size on a 2-D tensor changes nothing (the lab used to refuse it with TileRankError)
    tasks = []
    for tile in [(8, 64), (8, 64, 4)]:
        def k(x: pypto.Tensor[...], out: pypto.Tensor[...], tile=tile):
            pypto.set_vec_tile_shapes(*tile)
            out[:] = pypto.gathermask(x, 1)
        x, out = torch.randn(32, 64), torch.empty(32, 32)
        kernel = pypto.jit(k)
        kernel(x, out)
        assert torch.equal(out, x[:, 0::2])
        tasks.append([g.n_tasks for g in kernel.last_compiled.tile_graph.groups])
    assert tasks[0] == tasks[1] == [4]


def test_a_transpose_keeping_the_last_axis_is_a_move_out_and_takes_no_ub_of_its_own():
    """As the real TRANSPOSE_MOVEOUT (tensor_transformation.cpp): transpose(x, 0, 1) of [t, n, d] is
    written from UB to GM with the axes swapped, so a (16, 32, 128) bf16 tile (128 KiB) fits the
    192 KiB UB with no second buffer (mla_indexer_prolog's Prepare_qNope); a transpose of the last
    two axes is a VNCHWCONV in UB, needs a result buffer too, and the same tile does not fit."""
    @pypto.jit
    def lead(x: pypto.Tensor([32, 128, 128], pypto.DT_BF16), out: pypto.Tensor([128, 32, 128], pypto.DT_BF16)):
        pypto.set_vec_tile_shapes(16, 32, 128)
        out[:] = pypto.transpose(x, 0, 1)

    x = torch.randn(32, 128, 128, dtype=torch.bfloat16)
    out = torch.empty(128, 32, 128, dtype=torch.bfloat16)
    lead(x, out)
    assert torch.equal(out, x.transpose(0, 1))

    @pypto.jit
    def last(x: pypto.Tensor([32, 128, 128], pypto.DT_BF16), out: pypto.Tensor([32, 128, 128], pypto.DT_BF16)):
        pypto.set_vec_tile_shapes(16, 32, 128)
        out[:] = pypto.transpose(x, 1, 2)

    with pytest.raises(pypto.TileCapacityError, match="262144 bytes of UB"):
        last(x, torch.empty(32, 128, 128, dtype=torch.bfloat16))
