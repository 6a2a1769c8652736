"""pypto_lab.pto indexing ops (gather, index_select, scatter_update, scatter, index_add): numerics
against torch, in-place updates of kernel arguments, costs that scale with the rows indexed, and
the errors a user meets (an index out of bounds found when the kernel runs, a dtype the op does
not take)."""

import pytest
import torch

import pypto_lab.pto as pypto

SIM = {"run_mode": pypto.RunMode.SIM}


def _kinds(kernel) -> set:
    p = kernel.last_compiled.execute_graph.program
    return {p.kinds[k] for k in p.kind}


def _select_kernel():
    @pypto.jit(runtime_options=SIM)
    def k(table: pypto.Tensor(), idx: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 128)
        out[:] = pypto.index_select(table, 0, idx)
    return k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_index_select_matches_torch(dtype):
    table = (torch.randn(64, 128) * 10).to(dtype)
    idx = torch.randint(0, 64, (16,), dtype=torch.int32)
    out = torch.empty(16, 128, dtype=dtype)
    _select_kernel()(table, idx, out)
    assert torch.equal(out, table[idx.long()])


def test_index_select_inner_dim_and_2d_index():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((4, 16, 32), pypto.DT_FP32), i: pypto.Tensor((2, 3), pypto.DT_INT64)):
        pypto.set_vec_tile_shapes(1, 2, 3, 32)
        return pypto.index_select(x, 1, i)
    x, i = torch.randn(4, 16, 32), torch.randint(0, 16, (2, 3))
    y = k(x, i)
    assert y.shape == (4, 2, 3, 32)
    assert torch.equal(y, torch.index_select(x, 1, i.reshape(-1)).reshape(4, 2, 3, 32))


def test_index_select_cost_scales_with_rows_not_table():
    table = torch.randn(4096, 128)
    runs = {}
    for rows in (8, 64):
        k = _select_kernel()
        k(table, torch.randint(0, 4096, (rows,), dtype=torch.int32), torch.empty(rows, 128))
        runs[rows] = k.last_run
    # bytes: the rows read, the indices, the rows written; never the 2 MiB table
    assert runs[8].gm_bytes == 8 * 128 * 4 * 2 + 8 * 4
    assert runs[64].gm_bytes == 64 * 128 * 4 * 2 + 64 * 4
    # one MTE2 transfer per row: 8x the rows, several times the MTE2 time
    assert runs[64].pipe_busy["MTE2"] > 4 * runs[8].pipe_busy["MTE2"]

    @pypto.jit(runtime_options=SIM)
    def copy(table: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 128)
        out[:] = table * 1.0
    copy(table, torch.empty_like(table))
    assert runs[64].cycles * 5 < copy.last_run.cycles  # reading the whole table would cost far more


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_matches_torch(dim):
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((32, 64), pypto.DT_FP16), i: pypto.Tensor((16, 32), pypto.DT_INT32)):
        pypto.set_vec_tile_shapes(8, 32)
        return pypto.gather(x, dim, i)
    x = torch.randn(32, 64).half()
    i = torch.randint(0, x.shape[dim], (16, 32), dtype=torch.int32)
    y = k(x, i)
    assert torch.equal(y, torch.gather(x, dim, i.long()))
    assert "VGATHER" in _kinds(k)


def test_scatter_update_writes_kv_cache_rows_in_place_2d_and_4d():
    @pypto.jit(runtime_options=SIM)
    def k2(cache: pypto.Tensor(), idx: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(2, 64)
        cache = pypto.scatter_update(cache, -2, idx, src)

    @pypto.jit(runtime_options=SIM)
    def k4(cache: pypto.Tensor(), idx: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(1, 2, 1, 64)
        pypto.scatter_update(cache, -2, idx, src)

    idx = torch.tensor([[1, 2], [4, 13]])
    src = torch.randn(4, 64)
    before = torch.randn(16, 64)
    cache = before.clone()
    k2(cache, idx, src)
    ref = before.clone()
    ref[idx.reshape(-1)] = src
    assert torch.equal(cache, ref)  # the indexed rows change, the others keep their values
    c4 = before.clone().reshape(4, 4, 1, 64)
    k4(c4, idx, src.reshape(2, 2, 1, 64))
    assert torch.equal(c4.reshape(16, 64), ref)
    # only the updated rows are written: one MTE3 transfer per row, no copy of the cache
    assert k2.last_run.gm_bytes == 4 * 64 * 4 * 2 + 4 * 8


def test_scatter_tensor_scalar_and_reduce_match_torch():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 32), pypto.DT_FP32), i: pypto.Tensor((8, 4), pypto.DT_INT32),
          s: pypto.Tensor((8, 4), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 8)
        return (pypto.scatter(x, 1, i, s), pypto.scatter(x, 1, i, 2.0, reduce="add"),
                pypto.scatter(x, 1, i, s, reduce="multiply"))
    x = torch.randn(8, 32)
    i = torch.stack([torch.randperm(32)[:4] for _ in range(8)]).int()
    s = torch.randn(8, 4)
    a, b, c = k(x, i, s)
    assert torch.equal(a, x.scatter(1, i.long(), s))
    torch.testing.assert_close(b, x.scatter_add(1, i.long(), torch.full((8, 4), 2.0)))
    torch.testing.assert_close(c, x.scatter_reduce(1, i.long(), s, "prod"))
    assert {"VCMPV", "VSEL", "VADD", "VMUL"} <= _kinds(k)


def test_scatter_inplace_updates_the_argument():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), i: pypto.Tensor()):
        pypto.set_vec_tile_shapes(4, 8)
        pypto.scatter_(x, 0, i, -1.0)
    x = torch.randn(4, 8)
    i = torch.randint(0, 4, (1, 8))
    ref = x.scatter(0, i, -1.0)
    k(x, i)
    assert torch.equal(x, ref)


@pytest.mark.parametrize("dtype, alpha", [(torch.float32, 0.5), (torch.int32, 3)])
def test_index_add_matches_torch_with_repeated_indices(dtype, alpha):
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), j: pypto.Tensor(), src: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(4, 32)
        out[:] = pypto.index_add(x, 0, j, src, alpha=alpha)
    x, src = (torch.randn(8, 32) * 5).to(dtype), (torch.randn(3, 32) * 5).to(dtype)
    j = torch.tensor([1, 5, 1], dtype=torch.int32)
    out = torch.empty_like(x)
    k(x, j, src, out)
    torch.testing.assert_close(out, x.index_add(0, j.long(), src, alpha=alpha))


def test_index_add_inplace():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), j: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(4, 2, 32)
        pypto.index_add_(x, 1, j, src)
    x, src, j = torch.randn(4, 16, 32), torch.randn(4, 2, 32), torch.tensor([3, 7])
    ref = x.index_add(1, j, src)
    k(x, j, src)
    torch.testing.assert_close(x, ref)


# ---- errors ------------------------------------------------------------------------------------

def test_index_out_of_bounds_is_found_when_the_kernel_runs():
    idx = torch.tensor([0, 5, 64, 2], dtype=torch.int32)
    with pytest.raises(pypto.IndexBoundsError) as e:
        _select_kernel()(torch.randn(64, 128), idx, torch.empty(4, 128))
    msg = str(e.value)
    assert "index[2] = 64" in msg and "size 64" in msg and "Fix" in msg
    assert isinstance(e.value, IndexError) and isinstance(e.value, pypto.PtoError)


def test_scatter_update_negative_index_is_refused():
    @pypto.jit(runtime_options=SIM)
    def k(cache: pypto.Tensor(), idx: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(2, 64)
        pypto.scatter_update(cache, -2, idx, src)
    with pytest.raises(pypto.IndexBoundsError, match=r"index\[1, 0\] = -1"):
        k(torch.zeros(16, 64), torch.tensor([[1, 2], [-1, 3]]), torch.randn(4, 64))


def test_gather_float_index_is_a_dtype_error():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 32), pypto.DT_FP32), i: pypto.Tensor((8, 32), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 32)
        return pypto.gather(x, 1, i)
    with pytest.raises(pypto.DTypeError, match="index dtype pypto.DT_FP32.*DT_INT32, DT_INT64"):
        k(torch.randn(8, 32), torch.zeros(8, 32))


def test_scatter_update_shape_rule_names_the_expected_src_shape():
    @pypto.jit(runtime_options=SIM)
    def k(cache: pypto.Tensor(), idx: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(2, 64)
        pypto.scatter_update(cache, -2, idx, src)
    with pytest.raises(pypto.ShapeError, match=r"src has shape \[4, 64\]"):
        k(torch.zeros(16, 64), torch.tensor([[1, 2], [4, 5]]), torch.randn(3, 64))


def test_gather_in_ub_follows_the_page_table():
    from pypto_lab.pto.ops_index import gather_in_ub

    @pypto.frontend.jit(runtime_options=SIM)
    def k(p: pypto.Tensor((6, 8), pypto.DT_FP32), i: pypto.Tensor((1, 3), pypto.DT_INT32),
          bt: pypto.Tensor((1, 3), pypto.DT_INT32)):
        pypto.set_vec_tile_shapes(3, 8)
        return gather_in_ub(p, i, bt, 2, -2)
    param = torch.arange(6).float()[:, None] * 10 + torch.arange(8).float()
    idx, table = torch.tensor([[4, 0, 3]], dtype=torch.int32), torch.tensor([[2, 0, 1]], dtype=torch.int32)
    out = k(param, idx, table)
    # token 4: logical block 2 -> physical block 1, row 2; token 0: block 0 -> 2, row 4; token 3: block 1 -> 0, row 1
    assert torch.equal(out, param[[2, 4, 1]])
    with pytest.raises(pypto.IndexBoundsError, match="index\\[0, 0\\] = 3 is out of bounds for dimension 1 of size 3"):
        k(param, torch.tensor([[6, 0, 1]], dtype=torch.int32), table)
