"""pypto_lab.pto: the ops, annotations, dtypes and options the real framework's public examples
use beyond the first API set. Every op is checked against torch in its declared dtype, and its
cost must come from the chip's VECTOR / CUBE instructions (the trace names them)."""

import pytest
import torch

import pypto_lab.pto as pypto

SIM = {"run_mode": pypto.RunMode.SIM}


def _unary_kernel(fn, tile=(8, 32)):
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(*tile)
        out[:] = fn(x)
    return k


def _kinds(kernel) -> set:
    p = kernel.last_compiled.execute_graph.program
    return {p.kinds[k] for k in p.kind}


@pytest.mark.parametrize("name, ref, instr, dtype, tol", [
    ("sigmoid", torch.sigmoid, "VREC", torch.float32, 1e-6),
    ("sigmoid", torch.sigmoid, "VEXP", torch.bfloat16, 1e-2),
    ("log", torch.log, "VLN", torch.float32, 1e-6),
    ("expm1", torch.expm1, "VEXP", torch.float32, 1e-6),
    ("erf", torch.erf, "VDIV", torch.float32, 1e-6),
    ("erfc", torch.erfc, "VDIV", torch.float16, 2e-3),
    ("ceil", torch.ceil, "VCONV", torch.float32, 0),
    ("floor", torch.floor, "VCONV", torch.float32, 0),
    ("trunc", torch.trunc, "VCONV", torch.float32, 0),
    ("round", torch.round, "VCONV", torch.float32, 0),
])
def test_unary_ops_match_torch(name, ref, instr, dtype, tol):
    k = _unary_kernel(getattr(pypto, name), tile=(8, 32) if dtype == torch.float32 else (8, 64))
    x = torch.randn(32, 64, dtype=dtype) * 3
    if name == "log":
        x = x.abs() + 0.1
    out = torch.empty_like(x)
    k(x, out)
    torch.testing.assert_close(out.float(), ref(x.float()).to(dtype).float(), rtol=tol, atol=tol)
    assert instr in _kinds(k) and k.last_run.cycles > 0


def test_pow_clip_and_scalar_forms():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((16, 32), pypto.DT_FP32), y: pypto.Tensor((16, 32), pypto.DT_FP32),
          lo: pypto.Tensor((32,), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 32)
        return pypto.pow(x, 2), pypto.pow(x, y), pypto.clip(y, lo, 0.5), x ** 0.5, pypto.clip(y, min=-0.25)
    x, y, lo = torch.rand(16, 32) + 0.5, torch.randn(16, 32), torch.full((32,), -0.5)
    sq, p, c, r, c2 = k(x, y, lo)
    torch.testing.assert_close(sq, x * x)
    torch.testing.assert_close(p, torch.pow(x, y))
    torch.testing.assert_close(c, torch.clamp(y, -0.5, 0.5))
    torch.testing.assert_close(r, x.sqrt())
    torch.testing.assert_close(c2, torch.clamp(y, min=-0.25))
    assert {"VLN", "VMAX", "VMINS", "VMAXS"} <= _kinds(k)


def test_softmax_is_one_fused_row_group():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((64, 256), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 256)
        return pypto.softmax(x, -1), pypto.softmax(x, dim=0)
    x = torch.randn(64, 256)
    a, b = k(x)
    torch.testing.assert_close(a, torch.softmax(x, -1))
    torch.testing.assert_close(b, torch.softmax(x, 0))
    first = k.stages["tile_graph"].to_json()["groups"][0]
    assert first["ops"] == ["amax", "sub", "exp", "sum", "div"]


def test_comparisons_logical_and_where():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor((16, 32), pypto.DT_FP16), b: pypto.Tensor((16, 32), pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8, 32)
        m = pypto.logical_and(pypto.gt(a, b), a >= 0.0)
        sel = pypto.where(m, a, b)
        sel2 = pypto.where(pypto.logical_not(m), 1.0, 0.0)
        return (pypto.eq(a, b), pypto.ne(a, 0.5), pypto.lt(a, b), pypto.le(a, b), m, sel,
                pypto.where(pypto.eq(a, a), a, 0.0), sel2)
    a, b = torch.randn(16, 32, dtype=torch.float16), torch.randn(16, 32, dtype=torch.float16)
    b[0, :4] = a[0, :4]
    eq, ne, lt, le, m, sel, same, sel2 = k(a, b)
    assert eq.dtype == torch.bool and torch.equal(eq, a == b) and torch.equal(ne, a != 0.5)
    assert torch.equal(lt, a < b) and torch.equal(le, a <= b)
    ref_m = (a > b) & (a >= 0)
    assert torch.equal(m, ref_m) and torch.equal(sel, torch.where(ref_m, a, b))
    assert torch.equal(same, a) and torch.equal(sel2, (~ref_m).float())
    assert {"VCMPV", "VCMPVS", "VAND", "VNOT", "VSEL"} <= _kinds(k)


def test_full_zeros_arange_and_storage_dtypes():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 32), pypto.DT_FP32), i64: pypto.Tensor((8, 32), pypto.DT_INT64)):
        pypto.set_vec_tile_shapes(8, 32)
        f = pypto.full([8, 32], 1.5, pypto.DT_FP32) + x
        z = pypto.zeros([8, 32], pypto.DT_FP32)
        pypto.set_vec_tile_shapes(64)
        a = pypto.arange(0, 64)
        b = pypto.arange(1.0, 4.0, 0.5)
        pypto.set_vec_tile_shapes(8, 32)
        return f, z, a, b, pypto.cast(i64, pypto.DT_FP32)
    x = torch.randn(8, 32)
    i64 = torch.randint(-1000, 1000, (8, 32), dtype=torch.int64)
    f, z, a, b, c = k(x, i64)
    torch.testing.assert_close(f, x + 1.5)
    assert torch.equal(z, torch.zeros(8, 32))
    assert a.dtype == torch.int32 and torch.equal(a, torch.arange(64, dtype=torch.int32))
    torch.testing.assert_close(b, torch.arange(1.0, 4.0, 0.5))
    torch.testing.assert_close(c, i64.float())
    assert "VECTORDUP" in _kinds(k)


def test_storage_only_dtypes_refuse_arithmetic():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor[[...], pypto.DT_UINT8], out: pypto.Tensor[[...], pypto.DT_UINT8]):
        pypto.set_vec_tile_shapes(8, 32)
        out[:] = x + x
    x = torch.zeros(8, 32, dtype=torch.uint8)
    with pytest.raises(pypto.DTypeError) as e:
        k(x, x.clone())
    assert "storage only" in str(e.value) and "Fix" in str(e.value)


def test_concat_and_expand_clone():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor((8, 32), pypto.DT_FP32), b: pypto.Tensor((4, 32), pypto.DT_FP32),
          r: pypto.Tensor((8, 1), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(4, 32)
        return pypto.concat([a, b * 2.0], dim=0), pypto.expand_clone(r, [8, 32])
    a, b, r = torch.randn(8, 32), torch.randn(4, 32), torch.randn(8, 1)
    c, e = k(a, b, r)
    torch.testing.assert_close(c, torch.cat([a, b * 2]))
    torch.testing.assert_close(e, r.expand(8, 32))


def test_matmul_bias_batch_broadcast_and_permutation():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((2, 64, 128), pypto.DT_FP16), w: pypto.Tensor((1, 128, 64), pypto.DT_FP16),
          bias: pypto.Tensor((64,), pypto.DT_FP32), q: pypto.Tensor((2, 4, 16, 32), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
        y = pypto.matmul(x, w, pypto.DT_FP32, extend_params={"bias_tensor": bias})
        pypto.set_vec_tile_shapes(1, 1, 16, 32)
        return y, pypto.transpose(q, [0, 2, 1, 3]), pypto.transpose(q, [0, 1, 3, 2])
    x, w = torch.randn(2, 64, 128, dtype=torch.float16) / 8, torch.randn(1, 128, 64, dtype=torch.float16) / 8
    bias, q = torch.randn(64), torch.randn(2, 4, 16, 32, dtype=torch.float16)
    y, p, t = k(x, w, bias, q)
    torch.testing.assert_close(y, torch.matmul(x.float(), w.float()) + bias, rtol=1e-4, atol=1e-4)
    assert torch.equal(p, q.permute(0, 2, 1, 3)) and torch.equal(t, q.transpose(2, 3))
    kinds = _kinds(k)
    assert "load bias L1->BT" in kinds and "mmad" in kinds


def test_matmul_bias_on_a_chip_without_biastable():
    @pypto.frontend.jit(runtime_options={"chip": "Ascend910A"})
    def k(x: pypto.Tensor((64, 128), pypto.DT_FP16), w: pypto.Tensor((128, 64), pypto.DT_FP16),
          bias: pypto.Tensor((1, 64), pypto.DT_FP32)):
        pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
        return pypto.matmul(x, w, pypto.DT_FP16, extend_params={"bias_tensor": bias})
    x, w, bias = torch.randn(64, 128, dtype=torch.float16) / 8, torch.randn(128, 64, dtype=torch.float16) / 8, \
        torch.randn(1, 64)
    torch.testing.assert_close(k(x, w, bias).float(), x.float() @ w.float() + bias, rtol=1e-2, atol=1e-2)
    assert "VADD" in _kinds(k)


def test_annotations_non_tensor_args_and_options():
    opts = {"run_mode": pypto.RunMode.NPU}

    @pypto.frontend.jit(runtime_options=opts, host_options={"only_codegen": True})
    def k(x: pypto.Tensor[[...], pypto.DT_FP32], y: pypto.Tensor(), flag: bool = True, scale: int = 2):
        pypto.set_vec_tile_shapes(8, 32)
        return x * float(scale) + y if flag else x - y

    opts["run_mode"] = pypto.RunMode.SIM  # read at call time, as the real jit does
    opts.update({"cfgcache_device_task_num": 100, "cfgcache_root_task_num": 1000, "cfgcache_leaf_task_num": 10000,
                 "stitch_cfgcache_size": 2 ** 20})
    x, y = torch.randn(8, 32), torch.randn(8, 32)
    torch.testing.assert_close(k(x, y), x * 2 + y)
    torch.testing.assert_close(k(x, y, False), x - y)
    assert k.cache_info()["traces"] == 2  # one compile per value of a non-tensor argument
    with pytest.raises(pypto.ShapeError):
        k(x.half(), y)  # Tensor[[...], DT_FP32]: any shape, but fp32
    pypto.set_matrix_size([64, 128, 64])
    assert pypto.get_matrix_size() == [64, 128, 64]
    assert pypto.min(3, 5 - 4) == 1 and pypto.max(2, 7) == 7
    with pytest.raises(pypto.OptionError):
        pypto.frontend.jit(host_options={"nonsense": 1})(lambda x: x)
    pypto.reset_options()


def test_new_ops_errors_teach():
    @pypto.frontend.jit(runtime_options=SIM)
    def bad_perm(x: pypto.Tensor((2, 4, 16, 32), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(1, 1, 16, 32)
        return pypto.transpose(x, [0, 1, 1, 2])

    @pypto.frontend.jit(runtime_options=SIM)
    def bad_bias(a: pypto.Tensor((64, 64), pypto.DT_FP16), bias: pypto.Tensor((32,), pypto.DT_FP32)):
        pypto.set_cube_tile_shapes([64, 64], [64, 64], [64, 64])
        return pypto.matmul(a, a, pypto.DT_FP32, extend_params={"bias_tensor": bias})

    @pypto.frontend.jit(runtime_options=SIM)
    def bad_expand(a: pypto.Tensor((8, 2), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 8)
        return pypto.expand_clone(a, [8, 8])

    with pytest.raises(pypto.ShapeError, match="not a permutation.*Fix"):
        bad_perm(torch.zeros(2, 4, 16, 32))
    with pytest.raises(pypto.ShapeError, match=r"one value per output column.*Fix"):
        bad_bias(torch.zeros(64, 64, dtype=torch.float16), torch.zeros(32))
    with pytest.raises(pypto.BroadcastError, match="only axes of size 1 grow"):
        bad_expand(torch.zeros(8, 2))
    with pytest.raises(pypto.TraceError, match="pypto.minimum"):
        pypto.min(pypto.Tensor(), 1)
