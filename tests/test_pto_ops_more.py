"""pypto_lab.pto ops beyond indexing: topk / argsort / argmax / cumsum, quantize / dequantize,
rms_norm / var, uniform / normal and the element-wise math ops: numerics against torch in their
dtypes, the Vector instructions they are costed with, and their errors."""

import pytest
import torch

import pypto_lab.pto as pypto

SIM = {"run_mode": pypto.RunMode.SIM}


def _kinds(kernel) -> set:
    p = kernel.last_compiled.execute_graph.program
    return {p.kinds[k] for k in p.kind}


def test_sort_family_matches_torch():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((16, 64), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        v, i = pypto.topk(x, 5)
        v2, i2 = pypto.topk(x, 3, -1, False)
        return v, i, v2, i2, pypto.argsort(x, descending=False), pypto.argmax(x, -1), pypto.argmin(x, 0, True)
    x = torch.randn(16, 64)
    x[3, 7] = x[3, 9]  # a tie: argsort is stable
    v, i, v2, i2, a, am, an = k(x)
    rv, ri = torch.topk(x, 5)
    assert torch.equal(v, rv) and torch.equal(i.long(), ri) and i.dtype == torch.int32
    assert torch.equal(v2, torch.topk(x, 3, largest=False).values)
    assert torch.equal(a.long(), torch.argsort(x, stable=True)) and a.dtype == torch.int32
    assert torch.equal(am.long(), x.argmax(-1)) and torch.equal(an.long(), x.argmin(0, keepdim=True))
    assert {"VMRGSORT", "VREDUCEV2", "VCMAX", "VCMPV", "VSEL"} <= _kinds(k)


def test_longer_rows_take_more_merge_passes():
    costs = {}
    for n in (64, 1024):
        @pypto.jit(runtime_options=SIM)
        def k(x: pypto.Tensor(), out: pypto.Tensor(), n=n):
            pypto.set_vec_tile_shapes(1, n)
            out[:] = pypto.argsort(x)
        k(torch.randn(1, n), torch.empty(1, n, dtype=torch.int32))
        costs[n] = k.last_run.pipe_busy["VECTOR"]
    assert costs[1024] > 16 * costs[64]  # 16x the pairs and more passes


def test_cumsum_cumprod_dtypes_and_axes():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((16, 64), pypto.DT_FP32), n: pypto.Tensor((16, 64), pypto.DT_INT32),
          h: pypto.Tensor((16, 64), pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8, 64)
        return pypto.cumsum(x, 1), pypto.cumsum(x, 0), pypto.cumsum(n, -1), pypto.cumprod(h, 1)
    x, n = torch.randn(16, 64), torch.randint(-9, 9, (16, 64), dtype=torch.int32)
    h = (torch.rand(16, 64) * 0.2 + 0.9).half()
    c1, c0, ci, cp = k(x, n, h)
    torch.testing.assert_close(c1, x.cumsum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c0, x.cumsum(0))
    assert ci.dtype == torch.int64 and torch.equal(ci, n.long().cumsum(1))  # int32 -> DT_INT64, as documented
    assert cp.dtype == torch.float16
    torch.testing.assert_close(cp.float(), h.float().cumprod(1), rtol=1e-2, atol=1e-3)


def test_quantize_dequantize_rms_norm_var():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 64), pypto.DT_FP32), s: pypto.Tensor((8,), pypto.DT_FP32),
          z: pypto.Tensor((8,), pypto.DT_FP32), g: pypto.Tensor((64,), pypto.DT_FP32),
          sc: pypto.Tensor((64,), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        q = pypto.quantize(x, s, pypto.DT_INT8, -1, None)
        return (q, pypto.quantize(x, s, pypto.DT_UINT8, -1, z), pypto.dequantize(q, sc, pypto.DT_FP32, -2),
                pypto.rms_norm(x, g, 1e-6), pypto.var(x, 1), pypto.var(x, [0, 1], correction=0, keepdim=True))
    x, s = torch.randn(8, 64) * 3, torch.rand(8) * 10 + 1
    z, g, sc = torch.full((8,), -100.0), torch.randn(64), torch.rand(64)
    q, u, d, r, v, v0 = k(x, s, z, g, sc)
    rq = torch.round(x * s[:, None]).clamp(-128, 127).to(torch.int8)
    assert torch.equal(q, rq)
    assert torch.equal(u, torch.round(x * s[:, None] + 100).clamp(0, 255).to(torch.uint8))
    torch.testing.assert_close(d, rq.float() * sc)
    torch.testing.assert_close(r, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g)
    torch.testing.assert_close(v, x.var(1))
    torch.testing.assert_close(v0, x.var(correction=0).reshape(1, 1), rtol=1e-4, atol=1e-5)


def test_quantize_doc_example():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((3, 32), pypto.DT_FP32), s: pypto.Tensor((3,), pypto.DT_FP32),
          z: pypto.Tensor((3,), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(3, 32)
        return pypto.quantize(x, s, pypto.DT_INT8, -1, None), pypto.quantize(x, s, pypto.DT_UINT8, -1, z)
    x = torch.tensor([1.1, -2.2, 3.3, -4.4] * 8).repeat(3, 1)
    y1, y2 = k(x, torch.ones(3), torch.full((3,), -5.0))
    assert y1[0, :4].tolist() == [1, -2, 3, -4] and y2[0, :4].tolist() == [6, 3, 8, 1]


def test_random_is_deterministic_per_key_and_counter():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((64, 64), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(16, 64)
        return (pypto.uniform([64, 64], [1234], [0, 1], [1], pypto.DT_FP32) + x,
                pypto.uniform([64, 64], [1234], [0, 2], [1], pypto.DT_FP32),
                pypto.normal([64, 64], [7], [0, 1], [3], pypto.DT_FP32))
    u, u2, n = k(torch.zeros(64, 64))
    again, _, _ = k(torch.zeros(64, 64))
    assert torch.equal(u, again) and not torch.equal(u, u2)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.03
    assert abs(n.mean().item()) < 0.06 and abs(n.std().item() - 1) < 0.06
    assert {"VMUL", "VOR", "VNOT", "VLN", "VSQRT"} <= _kinds(k)


FLOAT_MATH = ["sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh",
              "exp2", "log2", "log10", "log1p", "cbrt", "sign"]
SHIFT = {"acosh": 2.0, "log2": 1.0, "log10": 1.0}  # into the function's domain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_math_matches_torch(dtype):
    names = FLOAT_MATH

    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((16, 64), pypto.DT_FP32 if dtype == torch.float32 else pypto.DT_BF16)):
        pypto.set_vec_tile_shapes(8, 64)
        return tuple(getattr(pypto, nm)(x + SHIFT[nm] if nm in SHIFT else x) for nm in names)
    x = (torch.rand(16, 64) * 1.8 - 0.9).to(dtype)
    outs = k(x)
    for nm, y in zip(names, outs):
        xr = (x + SHIFT[nm]).float() if nm in SHIFT else x.float()  # the kernel shifts into the domain in the dtype
        ref = torch.sign(xr) * xr.abs().pow(1 / 3) if nm == "cbrt" else getattr(torch, nm)(xr)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert y.dtype == dtype, nm
        torch.testing.assert_close(y.float(), ref.to(dtype).float(), rtol=tol, atol=tol, msg=nm)


def test_integer_and_binary_math_matches_torch():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor((8, 32), pypto.DT_INT32), b: pypto.Tensor((8, 32), pypto.DT_INT32),
          f: pypto.Tensor((8, 32), pypto.DT_FP32), w: pypto.Tensor((32,), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 32)
        return (pypto.bitwise_and(a, b), pypto.bitwise_or(a, 6), pypto.bitwise_xor(a, 5), pypto.bitwise_not(a),
                pypto.bitwise_left_shift(a, 2), pypto.bitwise_right_shift(a, b), pypto.gcd(a, b), pypto.fmod(a, b),
                pypto.remainder(f, 0.7), pypto.floor_div(a, 3), pypto.ceil_div(a, b), pypto.isnan(f),
                pypto.signbit(f), pypto.isfinite(f), pypto.lrelu(f, 0.2), pypto.hypot(f, w), pypto.atan2(f, w),
                pypto.clone(a), pypto.sign(a))
    a = torch.randint(-50, 50, (8, 32), dtype=torch.int32)
    b = torch.randint(1, 9, (8, 32), dtype=torch.int32)
    f, w = torch.randn(8, 32), torch.randn(32)
    f[0, 0], f[1, 1], f[2, 2] = float("nan"), float("inf"), -0.0
    got = k(a, b, f, w)
    want = [a & b, a | 6, a ^ 5, ~a, a << 2, a >> b, torch.gcd(a, b), torch.fmod(a, b), torch.remainder(f, 0.7),
            torch.div(a, 3, rounding_mode="floor"), -torch.div(-a, b, rounding_mode="floor"), torch.isnan(f),
            torch.signbit(f), torch.isfinite(f), torch.nn.functional.leaky_relu(f, 0.2), torch.hypot(f, w),
            torch.atan2(f, w), a, torch.sign(a)]
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == y.dtype, i
        torch.testing.assert_close(x, y, equal_nan=True, rtol=1e-5, atol=1e-5, msg=str(i))
    assert {"VAND", "VOR", "VNOT", "VSHL", "VSHR", "VLRELU", "VSQRT"} <= _kinds(k)


def test_axpy_updates_y_in_place():
    @pypto.jit(runtime_options=SIM)
    def k(y: pypto.Tensor(), x: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 32)
        pypto.axpy_(y, x, 0.5)
    y, x = torch.randn(8, 32), torch.randn(8, 32)
    ref = y + 0.5 * x
    k(y, x)
    torch.testing.assert_close(y, ref)
    assert "VAXPY" in _kinds(k)


def test_math_ops_fuse_with_their_neighbours():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = pypto.tanh(pypto.sin(x) * 2.0)
    x = torch.randn(32, 64)
    out = torch.empty_like(x)
    k(x, out)
    torch.testing.assert_close(out, torch.tanh(torch.sin(x) * 2.0))
    assert [g["kind"] for g in k.last_run.groups] == ["vector"]


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, pattern", [
    (lambda x, i: pypto.topk(pypto.cast(x, pypto.DT_FP16), 2), pypto.DTypeError, "topk takes input in DT_FP32"),
    (lambda x, i: pypto.topk(x, 99), pypto.ShapeError, "1 <= k <= input.shape"),
    (lambda x, i: pypto.topk(x, 2, 0), pypto.ShapeError, "last axis only"),
    (lambda x, i: pypto.cumprod(i, 1), pypto.DTypeError, "cumprod takes"),
    (lambda x, i: pypto.sin(i), pypto.DTypeError, "sin takes DT_FP16, DT_BF16, DT_FP32"),
    (lambda x, i: pypto.bitwise_and(x, 3), pypto.DTypeError, "bitwise_and takes DT_INT8"),
    (lambda x, i: pypto.quantize(i, x, pypto.DT_INT8), pypto.DTypeError, "quantize takes DT_FP32"),
    (lambda x, i: pypto.quantize(x, x, pypto.DT_INT8, -1), pypto.ShapeError, r"scale has the shape of input"),
    (lambda x, i: pypto.quantize(pypto.view(x, [8, 32]), pypto.view(x, [1, 8], [0, 0]), pypto.DT_UINT8, -1),
     pypto.ShapeError, "needs zero_points"),
    (lambda x, i: pypto.argmax(i, 0), pypto.DTypeError, "argmax takes"),
    (lambda x, i: pypto.uniform([8, 32], [1], [0], [1], pypto.DT_FP32), pypto.ShapeError, "counter 2"),
    (lambda x, i: pypto.normal([8, 32], [1], [0, 0], [1], pypto.DT_INT32), pypto.DTypeError, "normal makes"),
    (lambda x, i: pypto.rms_norm(x, pypto.view(x, [1, 32])), pypto.ShapeError, r"gamma has shape \[C\]"),
    (lambda x, i: pypto.gathermask(x, 9), pypto.TraceError, "1 to 7"),
    (lambda x, i: pypto.unpack(x, pypto.DT_FP16), pypto.DTypeError, "unpack takes DT_UINT8"),
    (lambda x, i: pypto.interleave(x, pypto.view(x, [4, 32])), pypto.ShapeError, "the same shape"),
    (lambda x, i: pypto.pad(x, (1, 2)), pypto.ShapeError, r"\(0, right\)"),
    (lambda x, i: pypto.one_hot(x, 4), pypto.DTypeError, "DT_INT32 or DT_INT16"),
    (lambda x, i: pypto.prod(pypto.cast(x, pypto.DT_FP16), 1), pypto.DTypeError, "prod takes"),
    (lambda x, i: pypto.dequantize(x, pypto.view(x, [8, 1]), pypto.DT_FP32), pypto.DTypeError, "DT_INT8 or DT_INT16"),
    (lambda x, i: pypto.scatter(x, 1, i, 1.0, reduce="max"), pypto.TraceError, "'add' or 'multiply'"),
    (lambda x, i: pypto.index_add(x, 0, pypto.view(i, [2, 1]), pypto.view(x, [2, 32])), pypto.ShapeError,
     "index is 1-D"),
    (lambda x, i: pypto.tril(pypto.view(pypto.reshape(x, [256]), [32])), pypto.ShapeError, "at least 2 dimensions"),
])
def test_bad_input_raises_a_named_error(call, exc, pattern):
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 32), pypto.DT_FP32), i: pypto.Tensor((8, 32), pypto.DT_INT32)):
        pypto.set_vec_tile_shapes(8, 32)
        r = call(x, i)
        return r[0] if isinstance(r, tuple) else r
    with pytest.raises(exc, match=pattern):
        k(torch.randn(8, 32), torch.zeros(8, 32, dtype=torch.int32))


def test_shape_and_mask_ops_match_torch():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 32), pypto.DT_FP32), w: pypto.Tensor((32,), pypto.DT_FP32),
          c: pypto.Tensor((8,), pypto.DT_INT32)):
        pypto.set_vec_tile_shapes(8, 32)
        out = (pypto.tril(x), pypto.triu(x, 1), pypto.prelu(x, w), pypto.prod(x, 1), pypto.prod(x, 0, keepdim=True),
               pypto.pad(x, (0, 8, 0, 2), value=-1.0), pypto.one_hot(c, 32), pypto.permute(x, [1, 0]))
        pypto.set_vec_tile_shapes(1, 8, 32)
        return out + (pypto.unsqueeze(x, 0) * 2.0,)
    x, w, c = torch.randn(8, 32), torch.randn(32), torch.randint(0, 32, (8,), dtype=torch.int32)
    a, b, p, pr, p0, pd, oh, pm, u = k(x, w, c)
    assert torch.equal(a, x.tril()) and torch.equal(b, x.triu(1)) and torch.equal(pm, x.t())
    torch.testing.assert_close(p, torch.nn.functional.prelu(x, w))
    torch.testing.assert_close(pr, x.prod(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p0, x.prod(0, keepdim=True), rtol=1e-5, atol=1e-6)
    assert torch.equal(pd, torch.nn.functional.pad(x, (0, 8, 0, 2), value=-1.0))
    assert oh.dtype == torch.int64 and torch.equal(oh, torch.nn.functional.one_hot(c.long(), 32))
    torch.testing.assert_close(u, x.unsqueeze(0) * 2)


def test_index_put_accumulates_repeated_positions_in_place():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor(), i: pypto.Tensor(), j: pypto.Tensor(), v: pypto.Tensor()):
        pypto.set_vec_tile_shapes(3, 16)
        pypto.index_put_(x, (i, j), v, accumulate=True)
    x, v = torch.randn(4, 5, 16), torch.randn(3, 16)
    i, j = torch.tensor([0, 3, 0]), torch.tensor([1, 4, 1])
    ref = x.clone().index_put_((i, j), v, accumulate=True)
    k(x, i, j, v)
    torch.testing.assert_close(x, ref)
    with pytest.raises(pypto.IndexBoundsError, match=r"index\[1\] = 5 is out of bounds for dimension 1 of size 5"):
        k(x, i, torch.tensor([1, 5, 1]), v)


def test_documented_op_list_and_coverage():
    from pypto_lab.pto import doc_ops
    assert len(doc_ops.DOCUMENTED) == 134 and len(set(doc_ops.DOCUMENTED)) == 134
    assert sum(not n.startswith("experimental-") for n in doc_ops.DOCUMENTED) == 127
    have, _missing = doc_ops.coverage()
    for name in ("gather", "scatter_update", "index_select", "index_add", "topk", "argsort", "cumsum", "quantize",
                 "dequantize", "rms_norm", "uniform", "normal", "sin", "bitwise_xor", "prod", "one_hot"):
        assert name in have
    assert len(have) >= 124


def test_every_section_of_the_api_docs_is_checked_by_behaviour():
    """python -m pypto_lab.pto.doc_ops: every page of docs/zh/api (operation, tensor, config, datatype,
    symbolic, control flow, element, others) has a behaviour check; all pass but the two MX-format
    ops pypto_lab does not model."""
    from pypto_lab.pto import doc_checks, doc_ops

    assert sum(len(p) for p in doc_ops.SECTIONS.values()) == 265
    for sec, pages in doc_ops.SECTIONS.items():
        assert all((sec, p) in doc_checks.CHECKS for p in pages), sec
    res = doc_ops.behaviour()
    failing = {p for _, (_ok, bad) in res.items() for p in bad}
    assert failing == {"quant_mx", "scaled_mm"}, {p: why for _, (_, bad) in res.items() for p, why in bad.items()}


def test_a_behaviour_check_fails_when_the_behaviour_is_wrong(monkeypatch):
    from pypto_lab.pto import doc_checks

    monkeypatch.setattr(pypto, "exp", pypto.exp2)   # a wrong exp must not count as documented exp
    res = doc_checks.run_all({"operation"})
    assert res[("operation", "exp")] is not None and "exp" in res[("operation", "exp")]


def test_conv2d_and_conv1d_match_torch_and_run_on_the_cube():
    import torch.nn.functional as F

    @pypto.frontend.jit(runtime_options=SIM)
    def k2(x: pypto.Tensor((2, 32, 8, 16), pypto.DT_FP16), w: pypto.Tensor((64, 32, 3, 3), pypto.DT_FP16),
           b: pypto.Tensor((64,), pypto.DT_FP16)):
        return pypto.conv(x, w, pypto.DT_FP16, [1, 2], [1, 1, 0, 2], [1, 1], extend_params={"bias_tensor": b})

    x, w, b = torch.randn(2, 32, 8, 16).half(), (torch.randn(64, 32, 3, 3) * 0.1).half(), torch.randn(64).half()
    y = k2(x, w, b)
    ref = F.conv2d(F.pad(x.float(), (0, 2, 1, 1)), w.float(), b.float(), stride=(1, 2)).half()
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3)
    r = k2.last_run
    assert r.flops == 2 * y.numel() * 32 * 9 and r.bound == "cube"
    assert r.gm_bytes >= x.numel() * 2 + w.numel() * 2 + y.numel() * 2  # at least: input, weights, output
    m0, k0, n0 = k2.last_compiled.chip.cube.fractals["fp16"]
    assert r.pipe_busy["CUBE"] >= r.flops / 2 / (m0 * k0 * n0)  # at least one cycle per fractal
    assert r.pipe_busy["MTE1"] > 0 and r.pipe_busy["VECTOR"] == 0

    @pypto.frontend.jit(runtime_options=SIM)
    def k1(x: pypto.Tensor((1, 16, 40), pypto.DT_FP32), w: pypto.Tensor((32, 4, 3), pypto.DT_FP32)):
        return pypto.conv(x, w, pypto.DT_FP32, [1], [2, 2], [2], groups=4)

    x1, w1 = torch.randn(1, 16, 40), torch.randn(32, 4, 3)
    torch.testing.assert_close(k1(x1, w1), F.conv1d(x1, w1, padding=2, dilation=2, groups=4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wshape, kwargs, exc, pattern", [
    ((64, 16, 3, 3), {}, pypto.ShapeError, "divisible by groups"),
    ((64, 32, 3, 3), {"groups": 3}, pypto.ShapeError, "divisible by groups"),
    ((64, 32, 3, 3), {"extend_params": {"scale": 0.5}}, pypto.TraceError, "fixpipe quantization"),
])
def test_conv_errors(wshape, kwargs, exc, pattern):
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((1, 32, 8, 16), pypto.DT_FP16), w: pypto.Tensor(wshape, pypto.DT_FP16)):
        return pypto.conv(x, w, pypto.DT_FP16, [1, 1], [0, 0, 0, 0], [1, 1], **kwargs)
    with pytest.raises(exc, match=pattern):
        k(torch.zeros(1, 32, 8, 16).half(), torch.zeros(wshape).half())


def test_conv_dtype_mismatch_is_a_dtype_error():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((1, 32, 8, 16), pypto.DT_FP16), w: pypto.Tensor((8, 32, 1, 1), pypto.DT_FP16)):
        return pypto.conv(x, w, pypto.DT_FP32, [1, 1], [0, 0, 0, 0], [1, 1])
    with pytest.raises(pypto.DTypeError, match="the same dtype"):
        k(torch.zeros(1, 32, 8, 16).half(), torch.zeros(8, 32, 1, 1).half())


def test_layout_ops_match_torch():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor((8, 64), pypto.DT_FP32), y: pypto.Tensor((8, 64), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        i0, i1 = pypto.interleave(x, y)
        d0, d1 = pypto.deinterleave(i0, i1)
        e0, e1 = pypto.deinterleave(x)
        p = pypto.pack(x)
        return (pypto.gathermask(x, 2), pypto.gathermask(x, 5), i0, i1, d0, d1, e0, e1, p,
                pypto.unpack(p, pypto.DT_INT32), pypto.expand_exp_dif(x, y))
    x, y = torch.randn(8, 64), torch.randn(8, 64)
    g1, g5, i0, i1, d0, d1, e0, e1, p, u, ed = k(x, y)
    assert torch.equal(g1, x[:, 1::2]) and torch.equal(g5, x[:, 2::4])
    stream = torch.stack([x, y], -1).reshape(8, 128)
    assert torch.equal(i0, stream[:, :64]) and torch.equal(i1, stream[:, 64:])
    assert torch.equal(d0, x) and torch.equal(d1, y)  # deinterleave undoes interleave
    assert torch.equal(e0, x[:, 0::2]) and torch.equal(e1, x[:, 1::2])
    assert torch.equal(p, x.reshape(-1).view(torch.uint8)) and torch.equal(u, x.reshape(-1).view(torch.int32))
    torch.testing.assert_close(ed, torch.exp(x - y))
    assert {"VREDUCEV2", "VGATHER", "VEXP"} <= _kinds(k)


def test_atomic_add_accumulates_overlapping_tiles_into_dst():
    @pypto.jit(runtime_options=SIM)
    def k(src: pypto.Tensor(), dst: pypto.Tensor()):
        pypto.set_vec_tile_shapes(4, 32)
        pypto.atomic_add(src, [2, 0], dst)
        pypto.atomic_add(src, [3, 0], dst)
    s, d = torch.randn(4, 32), torch.randn(8, 32)
    ref = d.clone()
    ref[2:6] += s
    ref[3:7] += s
    k(s, d)
    torch.testing.assert_close(d, ref)
    with pytest.raises(pypto.ShapeError, match="does not fit dst"):
        @pypto.jit(runtime_options=SIM)
        def bad(src: pypto.Tensor(), dst: pypto.Tensor()):
            pypto.atomic_add(src, [6, 0], dst)
        bad(s, d)


def test_int8_matmul_with_dequant_and_quant_scales():
    import struct

    def fp19(v):  # the FixPipe reads a scale with a 10-bit mantissa
        bits = struct.unpack("<I", struct.pack("<f", v))[0] & ~((1 << 13) - 1)
        return struct.unpack("<f", struct.pack("<I", bits))[0]

    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor((32, 64), pypto.DT_INT8), b: pypto.Tensor((64, 64), pypto.DT_INT8),
          s: pypto.Tensor((1, 64), pypto.DT_FP32), h: pypto.Tensor((32, 64), pypto.DT_FP16),
          g: pypto.Tensor((64, 64), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes([32, 32], [64, 64], [64, 64])
        return (pypto.matmul(a, b, pypto.DT_FP16, extend_params={"scale": 0.2}),
                pypto.matmul(a, b, pypto.DT_BF16, extend_params={"scale_tensor": s, "relu_type": "RELU"}),
                pypto.matmul(h, g, pypto.DT_INT8, extend_params={"scale": 0.5}))
    a, b = torch.randint(-8, 8, (32, 64), dtype=torch.int8), torch.randint(-8, 8, (64, 64), dtype=torch.int8)
    s, h, g = torch.rand(1, 64) * 0.01, torch.randn(32, 64).half(), torch.randn(64, 64).half()
    y1, y2, y3 = k(a, b, s, h, g)
    acc = (a.int() @ b.int()).float()
    assert fp19(0.2) != 0.2
    assert torch.equal(y1, (acc * fp19(0.2)).half())
    assert y2.dtype == torch.bfloat16 and torch.equal(y2, torch.relu(acc * s).bfloat16())
    assert torch.equal(y3, torch.round((h.float() @ g.float()) * 0.5).clamp(-128, 127).to(torch.int8))
    assert [gr["kind"] for gr in k.last_run.groups] == ["cube", "vector"] * 3


@pytest.mark.parametrize("dtype, out, params, exc, pattern", [
    (pypto.DT_FP16, pypto.DT_FP16, {"scale": 0.5}, pypto.DTypeError, "dequantization takes DT_INT8"),
    (pypto.DT_INT8, pypto.DT_FP16, {"scale": 0.5, "scale_tensor": None}, pypto.ShapeError, "exactly one"),
    (pypto.DT_INT8, pypto.DT_INT32, {"bias_tensor": None, "trans_mode": 1}, pypto.TraceError, "'trans_mode'"),
])
def test_matmul_epilogue_errors(dtype, out, params, exc, pattern):
    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor((32, 64), dtype), b: pypto.Tensor((64, 64), dtype)):
        pypto.set_cube_tile_shapes([32, 32], [64, 64], [64, 64])
        return pypto.matmul(a, b, out, extend_params=params)
    t = torch.int8 if dtype is pypto.DT_INT8 else torch.float16
    with pytest.raises(exc, match=pattern):
        k(torch.zeros(32, 64, dtype=t), torch.zeros(64, 64, dtype=t))


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend310P3"])
def test_special_ops_on_chips_without_fixpipe(chip):
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": chip})
    def k(x: pypto.Tensor((64, 64), pypto.DT_FP32), i: pypto.Tensor((16,), pypto.DT_INT32),
          c: pypto.Tensor((2, 32, 8, 16), pypto.DT_FP16), w: pypto.Tensor((64, 32, 3, 3), pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8, 64)
        return pypto.index_select(x, 0, i), pypto.conv(c, w, pypto.DT_FP16, [1, 1], [1, 1, 1, 1], [1, 1])
    x, i = torch.randn(64, 64), torch.randint(0, 64, (16,), dtype=torch.int32)
    c, w = torch.randn(2, 32, 8, 16).half(), (torch.randn(64, 32, 3, 3) * 0.1).half()
    a, y = k(x, i, c, w)
    assert torch.equal(a, x[i.long()])
    torch.testing.assert_close(y, torch.nn.functional.conv2d(c.float(), w.float(), padding=1).half(),
                               rtol=1e-3, atol=1e-3)
    kinds = _kinds(k)
    assert "L0C_TO_UB" in kinds and "UB_TO_GM" in kinds and "L0C_TO_GM" not in kinds  # L0C drains through UB
