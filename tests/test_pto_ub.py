"""UB planning of a vector group: a result takes the buffer of an input it alone consumes (the real
compiler's SrcDstBufferMerge pass), a load takes its buffer when its first reader issues, and a
buffer is free after its last use; a group that fits only once runs single-buffered."""

import pytest
import torch

import pypto_lab.pto as pypto
from pypto_lab.pto.tiling import _ub_plan

SIM = {"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"}


def _gelu_kernel():
    # the GELU of the ffn example: fp32 tiles of 16 x 1024 (64 KiB each) on a 192 KiB UB
    @pypto.jit(runtime_options=SIM)
    def gelu(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 1024)
        xf = pypto.cast(x, pypto.DT_FP32)
        e = pypto.exp(pypto.mul(pypto.mul(xf, 1.702), -1.0))
        ones = pypto.full(e.shape, 1.0, e.dtype, valid_shape=e.shape)
        sig = pypto.div(ones, pypto.add(e, 1.0))
        out[:] = pypto.cast(pypto.mul(xf, sig), pypto.DT_BF16)
    return gelu


def test_inplace_results_and_late_loads_let_the_ffn_gelu_fit_ub():
    k = _gelu_kernel()
    x = torch.randn(16, 1024).to(torch.bfloat16)
    out = torch.empty_like(x)
    k(x, out)
    ref = (x.float() * torch.sigmoid(1.702 * x.float())).to(torch.bfloat16)
    torch.testing.assert_close(out.float(), ref.float(), rtol=8e-3, atol=8e-3)

    tg = k.last_compiled.tile_graph
    cap = 196608
    groups = [g for g in tg.groups if g.kind == "vector"]
    # adds+div+mul+cast: without buffer reuse its four 64 KiB fp32 tiles (e, ones, xf, e + 1) are live at once
    big = max(groups, key=lambda g: _ub_plan(g, tg.graph, g.tile, reuse=False).peak)
    before = _ub_plan(big, tg.graph, big.tile, reuse=False).peak
    after = _ub_plan(big, tg.graph, big.tile).peak
    assert [tg.graph.nodes[i].op for i in big.nodes] == ["adds", "div", "mul", "cast"]
    assert before == 4 * 65536 > cap and after == 2 * 65536
    assert big.ub_bytes == after and big.ub_plan.inplace        # some result took an input's buffer
    assert big.slots == (2 if 2 * after <= cap else 1)
    assert k.last_run.buffer_peak["UB"] <= cap
    js = tg.to_json()["groups"][big.id]
    assert js["ub_bytes_per_task"] == after and js["ub_inplace"]


def test_a_cast_to_another_width_does_not_take_its_inputs_buffer():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 1024)
        out[:] = pypto.cast(pypto.exp(x), pypto.DT_BF16)
    x = torch.randn(16, 1024)
    out = torch.empty(16, 1024, dtype=torch.bfloat16)
    k(x, out)
    torch.testing.assert_close(out, torch.exp(x).to(torch.bfloat16))
    g = [g for g in k.last_compiled.tile_graph.groups if g.kind == "vector"][0]
    ops = {k.last_compiled.tile_graph.graph.nodes[o].op: i for o, i in g.ub_plan.inplace.items()}
    assert "exp" in ops and "cast" not in ops
    # x (fp32, its buffer taken by exp) + the bf16 result, both live at the cast
    assert g.ub_bytes == 16 * 1024 * 4 + 16 * 1024 * 2


def test_what_cannot_fit_even_with_reuse_names_its_buffers():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 1024)
        out[:] = x * y + x          # x is read twice: its buffer lives until the add
    x, y = torch.randn(32, 1024), torch.randn(32, 1024)
    with pytest.raises(pypto.TileCapacityError) as e:
        k(x, y, torch.empty_like(x))
    msg = str(e.value)
    assert "262144 bytes of UB" in msg and "live buffers" in msg and "fp32 131072 B" in msg
    assert "set_vec_tile_shapes(16, 1024)" in msg
