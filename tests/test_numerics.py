"""The Cube numerics model: storage rounding, fp32/int32 accumulation, int8 quantization, conv2d.

Tolerances are derived, not tuned. With unit roundoff u (fp16 2**-11, bf16 2**-8, fp32 2**-24)
and eta (half the smallest subnormal step), rounding an input gives |x' - x| <= u|x| + eta.
A sum of n terms in fp32, in any order, errs by at most gamma_n * sum|term|, gamma_n = n u32 /
(1 - n u32) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.lib.stride_tricks import sliding_window_view

from pypto_lab.hw import get_chip, list_chips
from pypto_lab.hw import numerics as nx

U = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}
ETA = {"fp16": 2.0**-25, "bf16": 2.0**-134, "fp32": 2.0**-150}
U32 = 2.0**-24
UNDERFLOW = 2.0**-149  # largest absolute error of one fp32 product that underflows


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def f64(t) -> torch.Tensor:
    return torch.as_tensor(t).to(torch.float64)


def accumulation_bound(a_r, b_r, terms: int) -> torch.Tensor:
    """fp32 summation error of a_r @ b_r (rounded inputs), any summation order."""
    return gamma(terms) * (f64(a_r).abs() @ f64(b_r).abs()) + terms * UNDERFLOW


def input_rounding_bound(a, b, dtype: str, product=torch.matmul) -> torch.Tensor:
    """|a'b' - ab| summed over k, from |x' - x| <= u|x| + eta for each input."""
    u, eta = U[dtype], ETA[dtype]
    abs_a, abs_b = f64(a).abs(), f64(b).abs()
    da, db = u * abs_a + eta, u * abs_b + eta
    return product(da, abs_b + db) + product(abs_a, db)


def product_terms(dtype: str, k: int) -> int:
    """Rounded operations per output: K additions (with a zero start), +1 if products round."""
    return k + 1 if dtype == "fp32" else k


def fp16_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Naive hardware without an fp32 accumulator: every partial sum rounded to fp16."""
    a16, b16 = a.to(torch.float16), b.to(torch.float16)
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for k in range(a.shape[1]):
        acc = acc + a16[:, k : k + 1] * b16[k : k + 1, :]
    return acc.to(torch.float64)


# ---- rounding ----------------------------------------------------------------------------------


def test_round_to_fp16_is_correctly_rounded_like_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.integers(-6, 5, 5000), [1 + 2**-11 + 2**-40]])
    got = nx.round_to(x, "fp16").numpy().astype(np.float64)
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float64))
    # a float64 value just above an fp16 tie: torch's own cast rounds twice and returns 1.0
    assert got[-1] == 1 + 2**-10


def test_bf16_rounds_coarser_than_fp16():
    one_plus = 1 + 2**-9  # 10 fraction bits: fp16 keeps it, bf16 (7 bits) ties to even -> 1
    assert nx.round_to([one_plus], "fp16").item() == one_plus
    assert nx.round_to([one_plus], "bf16").item() == 1.0
    assert nx.round_to([1 + 2**-8 + 2**-40], "bf16").item() == 1 + 2**-7  # correctly rounded
    # range: fp16 overflows at 65520, bf16 has fp32's exponent range
    assert math.isinf(nx.round_to([1e5], "fp16").item())
    assert nx.round_to([1e5], "bf16").item() == 99840.0
    x = torch.randn(4096, generator=torch.Generator().manual_seed(12), dtype=torch.float64) + 3.0
    for dtype, u in (("fp16", U["fp16"]), ("bf16", U["bf16"])):
        rel = ((f64(nx.round_to(x, dtype)) - x).abs() / x.abs()).max().item()
        assert u / 2 < rel <= u  # the bound is attained to within a factor 2
    assert torch.equal(
        nx.matmul([[one_plus]], [[1.0]], dtype="bf16"), torch.tensor([[1.0]])
    )
    assert nx.matmul([[one_plus]], [[1.0]], dtype="fp16").item() == one_plus


# ---- float matmul ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_matmul_matches_float64_within_derived_bound(dtype):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, 96, generator=gen, dtype=torch.float64)
    b = torch.randn(96, 48, generator=gen, dtype=torch.float64)
    got = nx.matmul(a, b, dtype=dtype)
    assert got.dtype == torch.float32 and got.shape == (64, 48)
    a_r, b_r = nx.round_to(a, dtype), nx.round_to(b, dtype)
    bound = input_rounding_bound(a, b, dtype) * (1 + 96 * U32) + accumulation_bound(a_r, b_r, 97)
    assert torch.all((f64(got) - a @ b).abs() <= bound)
    # the inputs really are rounded first: same as fp32 on pre-rounded inputs
    assert torch.equal(got, nx.matmul(a_r, b_r, dtype="fp32"))


def test_matmul_out_dtype_and_bias():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(8, 32, generator=gen), torch.randn(32, 16, generator=gen)
    bias = torch.randn(16, generator=gen)
    acc = nx.matmul(a, b, bias=bias)
    ref = f64(nx.round_to(a, "fp16")) @ f64(nx.round_to(b, "fp16")) + f64(bias)
    assert torch.all((f64(acc) - ref).abs() <= accumulation_bound(nx.round_to(a), nx.round_to(b), 33) + gamma(33) * f64(bias).abs())
    for out_dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        out = nx.matmul(a, b, bias=bias, out_dtype=out_dtype)
        assert out.dtype == torch_dtype
        assert torch.equal(out, acc.to(torch_dtype))  # one rounding on the way out of L0C
    assert nx.matmul(a, b, out_dtype="fp32").dtype == torch.float32


def test_matmul_batch_dims_broadcast_like_torch():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(3, 1, 8, 16, generator=gen)
    b = torch.randn(4, 16, 5, generator=gen)
    got = nx.matmul(a, b, dtype="bf16")
    assert got.shape == (3, 4, 8, 5)
    a_r, b_r = nx.round_to(a, "bf16"), nx.round_to(b, "bf16")
    ref = f64(a_r) @ f64(b_r)
    assert torch.all((f64(got) - ref).abs() <= accumulation_bound(a_r, b_r, 16))
    assert nx.matmul(torch.randn(16), b[0]).shape == (5,)  # 1-D operands as in torch.matmul


def test_fp32_accumulation_beats_fp16_accumulation_on_long_k():
    k = 4096
    ones_a, ones_b = torch.ones(2, k), torch.ones(k, 2)
    # fp16 partial sums stall at 2048: 2048 + 1 ties back to 2048 (spacing 2 there)
    assert torch.all(fp16_accumulate(ones_a, ones_b) == 2048)
    assert torch.all(nx.matmul(ones_a, ones_b, dtype="fp16") == k)

    gen = torch.Generator().manual_seed(4)
    a = (torch.rand(4, k, generator=gen, dtype=torch.float64) + 0.5)
    b = (torch.rand(k, 4, generator=gen, dtype=torch.float64) + 0.5)
    a_r, b_r = nx.round_to(a, "fp16"), nx.round_to(b, "fp16")
    ref = f64(a_r) @ f64(b_r)  # exact products of the fp16 inputs, summed in float64
    model_err = (f64(nx.matmul(a, b, dtype="fp16")) - ref).abs()
    fp16_err = (fp16_accumulate(a_r, b_r) - ref).abs()
    assert torch.all(model_err <= accumulation_bound(a_r, b_r, k))
    assert model_err.max() * 100 < fp16_err.min()


def test_fp32_matmul_stays_ieee_when_torch_allows_bf16():
    backend = torch.backends.mkldnn.matmul
    saved = backend.fp32_precision
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(128, 256, generator=gen), torch.randn(256, 64, generator=gen)
    try:
        backend.fp32_precision = "bf16"  # what set_float32_matmul_precision("medium") does
        got = nx.matmul(a, b, dtype="fp32")
        assert backend.fp32_precision == "bf16"  # restored
    finally:
        backend.fp32_precision = saved
    assert torch.all((f64(got) - f64(a) @ f64(b)).abs() <= accumulation_bound(a, b, 257))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    m=st.integers(1, 9),
    k=st.integers(1, 40),
    n=st.integers(1, 9),
    dtype=st.sampled_from(["fp16", "bf16", "fp32"]),
)
def test_matmul_property_within_k_eps_bound(data, m, k, n, dtype):
    elements = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
    a = data.draw(hnp.arrays(np.float64, (m, k), elements=elements))
    b = data.draw(hnp.arrays(np.float64, (k, n), elements=elements))
    a_r, b_r = nx.round_to(a, dtype), nx.round_to(b, dtype)
    err = (f64(nx.matmul(a, b, dtype=dtype)) - f64(a_r) @ f64(b_r)).abs()
    terms = product_terms(dtype, k)
    assert torch.all(err <= accumulation_bound(a_r, b_r, terms))
    # and so, coarser: |err| <= gamma_K * K * max|a| * max|b|
    coarse = gamma(terms) * k * f64(a_r).abs().max() * f64(b_r).abs().max() + terms * UNDERFLOW
    assert torch.all(err <= coarse)


# ---- int8 --------------------------------------------------------------------------------------


def test_matmul_int8_is_exact_against_int64():
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, (2, 33, 300), dtype=np.int8)
    b = rng.integers(-128, 128, (300, 17), dtype=np.int8)
    a[0, 0], b[:, 0] = -128, -128  # extreme products
    bias = rng.integers(-(2**20), 2**20, 17)
    got = nx.matmul_int8(torch.from_numpy(a), torch.from_numpy(b), bias=bias)
    assert got.dtype == torch.int32
    ref = a.astype(np.int64) @ b.astype(np.int64) + bias
    np.testing.assert_array_equal(got.numpy(), ref)


def test_matmul_int8_exact_beyond_fp32_integer_range():
    # 1024 * (-128)(-128) + 1 = 2**24 + 1: not representable in fp32
    a = torch.full((1, 1025), -128, dtype=torch.int8)
    a[0, -1] = 1
    b = torch.full((1025, 1), -128, dtype=torch.int8)
    b[-1, 0] = 1
    assert nx.matmul_int8(a, b).item() == 2**24 + 1
    # integer-valued floats are accepted
    assert nx.matmul_int8(a.double(), b.float()).item() == 2**24 + 1


def test_matmul_int8_large_case_is_exact_and_fast_enough():
    gen = torch.Generator().manual_seed(7)
    a = torch.randint(-128, 128, (256, 1024), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (1024, 256), generator=gen, dtype=torch.int8)
    assert torch.equal(nx.matmul_int8(a, b).long(), a.long() @ b.long())


def test_int32_accumulator_overflow_is_an_error():
    k = 2**17 + 1  # k * 128 * 128 > 2**31 - 1
    a = torch.full((1, k), -128, dtype=torch.int8)
    with pytest.raises(nx.NumericsError, match="int32 accumulator overflow"):
        nx.matmul_int8(a, a.T)


def test_quantize_rounds_half_to_even_and_saturates():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, 1000.0, -1000.0, float("inf")])
    q = nx.quantize(x, 1.0)
    assert q.dtype == torch.int8
    assert q.tolist() == [0, 2, 2, 0, -2, 0, 127, -128, 127]
    assert nx.quantize(x, 1.0, rounding="round").tolist() == [1, 2, 3, -1, -3, 0, 127, -128, 127]
    assert nx.quantize([1.0, 2.0], 0.5, zero_point=3).tolist() == [5, 7]
    assert nx.quantize([200.0], 1.0, zero_point=-10).tolist() == [127]  # saturates after the offset


def test_dequantize_scales_in_fp32_then_rounds():
    acc = torch.tensor([[100, -3], [2**24 + 1, 7]], dtype=torch.int32)
    out = nx.dequantize(acc, 0.5, torch.tensor([0.25, 2.0]), bias=torch.tensor([1.0, 0.0]), out_dtype="fp32")
    # 2**24 + 1 becomes 2**24 in fp32, as the hardware's int32 -> fp32 conversion does
    assert out.tolist() == [[13.5, -3.0], [2**21 + 1, 7.0]]
    assert nx.dequantize(acc, 0.5, 0.25).dtype == torch.float16


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_matmul_error_within_quantization_bound(per_channel):
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(16, 64, generator=gen, dtype=torch.float64)
    b = torch.randn(64, 24, generator=gen, dtype=torch.float64) * torch.logspace(-2, 1, 24, dtype=torch.float64)
    got = nx.quantized_matmul(a, b, per_channel=per_channel, out_dtype="fp32")
    ref = a @ b
    # a = s_a q_a + e_a with |e_a| <= s_a / 2 (no saturation at max|a| / 127), same for b
    s_a = f64(nx.symmetric_scale(a))
    s_b = f64(nx.symmetric_scale(b, dim=-2) if per_channel else nx.symmetric_scale(b))
    ea, eb = torch.full_like(a, 1.0) * s_a / 2, torch.ones_like(b) * s_b / 2
    quant = ea @ (b.abs() + eb) + a.abs() @ eb
    # inputs pass through fp32 before dividing by the scale; dequantization is 2 fp32 roundings
    fp32_steps = 4 * U32 * (a.abs() @ b.abs()) * 1.01 + 3 * U32 * (ref.abs() + quant)
    assert torch.all((f64(got) - ref).abs() <= quant + fp32_steps)
    if per_channel:
        tensor_err = (f64(nx.quantized_matmul(a, b, out_dtype="fp32")) - ref).abs()
        assert ((f64(got) - ref).abs()[:, :8]).max() < tensor_err[:, :8].max() / 10  # small columns gain


# ---- conv2d ------------------------------------------------------------------------------------

CONV_CASES = [
    dict(stride=1, padding=0, dilation=1, groups=1),
    dict(stride=2, padding=1, dilation=1, groups=1),
    dict(stride=(1, 2), padding=(2, 1), dilation=2, groups=1),
    dict(stride=1, padding=1, dilation=1, groups=4),
    dict(stride=2, padding=1, dilation=1, groups=8),  # depthwise
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_conv2d_matches_float64_within_derived_bound(case, dtype):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 8, 11, 10, generator=gen, dtype=torch.float64)
    w = torch.randn(16, 8 // case["groups"], 3, 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(16, generator=gen, dtype=torch.float64)
    got = nx.conv2d(x, w, bias=bias, dtype=dtype, **case)
    ref = F.conv2d(x, w, bias, **case)
    assert got.shape == ref.shape and got.dtype == torch.float32

    def conv(u, v):
        return F.conv2d(u, v, **case)

    k = w.shape[1] * 9 + 1  # products plus the bias
    x_r, w_r = f64(nx.round_to(x, dtype)), f64(nx.round_to(w, dtype))
    bound = (
        input_rounding_bound(x, w, dtype, product=conv) * (1 + k * U32)
        + gamma(k) * (conv(x_r.abs(), w_r.abs()) + bias.abs().reshape(1, -1, 1, 1))
        + U32 * bias.abs().reshape(1, -1, 1, 1)  # bias rounded to fp32
    )
    assert torch.all((f64(got) - ref).abs() <= bound)
    # the inputs really are rounded first
    assert torch.equal(got, nx.conv2d(x_r, w_r, bias=bias, dtype="fp32", **case))


def test_conv2d_unbatched_out_dtype_and_chip():
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(3, 6, 6, generator=gen)
    w = torch.randn(4, 3, 3, 3, generator=gen)
    out = nx.conv2d(x, w, padding=1, out_dtype="fp16", chip="Ascend910A")
    assert out.shape == (4, 6, 6) and out.dtype == torch.float16
    assert torch.equal(out, nx.conv2d(x[None], w, padding=1)[0].to(torch.float16))


def conv_int64_reference(x, w, stride, padding, dilation, groups):
    """Direct sliding-window conv in numpy int64."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    w = w.astype(np.int64)
    cg, og = w.shape[1], w.shape[0] // groups
    span = (dilation * (w.shape[2] - 1) + 1, dilation * (w.shape[3] - 1) + 1)
    outs = []
    for g in range(groups):
        windows = sliding_window_view(x[:, g * cg : (g + 1) * cg], span, axis=(2, 3))
        windows = windows[:, :, ::stride, ::stride, ::dilation, ::dilation]
        outs.append(np.einsum("nchwij,ocij->nohw", windows, w[g * og : (g + 1) * og]))
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 4)])
def test_conv2d_int8_is_exact_against_int64(stride, padding, dilation, groups):
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (2, 8, 9, 9), dtype=np.int8)
    w = rng.integers(-128, 128, (8, 8 // groups, 3, 3), dtype=np.int8)
    bias = rng.integers(-1000, 1000, 8)
    got = nx.conv2d_int8(x, w, bias=bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert got.dtype == torch.int32
    ref = conv_int64_reference(x, w, stride, padding, dilation, groups) + bias.reshape(1, -1, 1, 1)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_conv2d_int8_long_reduction_uses_exact_format():
    # K = 128 * 3 * 3 = 1152 products of (-128)(-128) plus one of 1: 2**24 + 2**21 + 1 > 2**24
    x = torch.full((1, 129, 3, 3), -128, dtype=torch.int8)
    w = torch.full((1, 129, 3, 3), -128, dtype=torch.int8)
    x[0, 128], w[0, 128] = 0, 0
    x[0, 128, 0, 0], w[0, 128, 0, 0] = 1, 1
    assert nx.conv2d_int8(x, w).item() == 1152 * 2**14 + 1


# ---- dtypes and errors -------------------------------------------------------------------------


def test_cube_dtypes_agree_with_chip_presets():
    assert nx.cube_dtypes() == ("fp16", "bf16", "fp32", "int8")
    for name in list_chips():
        chip = get_chip(name)
        assert set(nx.cube_dtypes(name)) == set(chip.cube.fractals)
        for dtype, acc in chip.cube.accumulator.items():
            assert nx.ACCUMULATOR[dtype] == acc
    assert nx.cube_dtypes("Ascend910A") == ("fp16", "int8")


def test_unknown_dtype_lists_the_known_ones():
    with pytest.raises(nx.NumericsError, match=r"unknown dtype 'fp8': known dtypes are fp16, bf16, fp32"):
        nx.matmul([[1.0]], [[1.0]], dtype="fp8")
    with pytest.raises(nx.NumericsError, match="use matmul_int8"):
        nx.matmul([[1.0]], [[1.0]], dtype="int8")
    with pytest.raises(nx.NumericsError, match="unknown out_dtype 'int32'"):
        nx.conv2d(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 1, 1), out_dtype="int32")
    with pytest.raises(nx.NumericsError, match="unknown quantized dtype 'uint4'"):
        nx.quantize([1.0], 1.0, dtype="uint4")
    assert issubclass(nx.NumericsError, ValueError)


def test_mismatched_inner_dimensions_show_both_shapes():
    with pytest.raises(nx.NumericsError, match=r"a has shape \(4, 3\), b has shape \(5, 2\)") as exc:
        nx.matmul(torch.ones(4, 3), torch.ones(5, 2))
    assert "transpose" in str(exc.value)
    with pytest.raises(nx.NumericsError, match="inner dimensions differ"):
        nx.matmul_int8(torch.ones(2, 3, dtype=torch.int8), torch.ones(2, 3, dtype=torch.int8))
    with pytest.raises(nx.NumericsError, match="batch dimensions do not broadcast"):
        nx.matmul(torch.ones(2, 4, 3), torch.ones(3, 3, 2))


def test_int8_input_out_of_range_or_not_integer():
    with pytest.raises(nx.NumericsError, match=r"int8 input out of range: a_q holds values in \[-200, 5\]") as exc:
        nx.matmul_int8([[-200, 5]], [[1], [1]])
    assert "quantize" in str(exc.value)
    with pytest.raises(nx.NumericsError, match="int8 input must hold integers: b_q holds 0.5"):
        nx.matmul_int8([[1, 2]], [[0.5], [1.0]])
    with pytest.raises(nx.NumericsError, match="int8 input out of range: x_q"):
        nx.conv2d_int8(torch.full((1, 1, 2, 2), 300), torch.ones(1, 1, 1, 1))


def test_other_bad_inputs_name_rule_value_and_fix():
    with pytest.raises(nx.NumericsError, match="Ascend910A's Cube does not take fp32 inputs: its Cube dtypes are fp16, int8"):
        nx.matmul([[1.0]], [[1.0]], dtype="fp32", chip="Ascend910A")
    with pytest.raises(nx.NumericsError, match=r"channels do not match groups=2"):
        nx.conv2d(torch.ones(1, 3, 4, 4), torch.ones(4, 1, 3, 3), groups=2)
    with pytest.raises(nx.NumericsError, match="kernel larger than the padded input"):
        nx.conv2d(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 3, 3))
    with pytest.raises(nx.NumericsError, match=r"stride must be an integer >= 1 .*got 0"):
        nx.conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3), stride=0)
    with pytest.raises(nx.NumericsError, match="scale must be finite and > 0: got -1"):
        nx.quantize([1.0], -1.0)
    with pytest.raises(nx.NumericsError, match=r"scale of shape \(3,\) does not broadcast"):
        nx.quantize(torch.ones(2, 4), torch.ones(3))
    with pytest.raises(nx.NumericsError, match="padding must be an integer >= 0 or a pair of them: got 'same'"):
        nx.conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3), padding="same")
    with pytest.raises(nx.NumericsError, match="bias of shape"):
        nx.matmul(torch.ones(2, 3), torch.ones(3, 4), bias=torch.ones(3))


def test_per_channel_scale_is_one_symmetric_scale_per_output_channel():
    w = torch.randn(8, 3, 3, 3)
    w[2] = 0
    s = nx.per_channel_scale(w, 0)
    assert s.shape == (8, 1, 1, 1) and float(s[2]) == 1.0
    expect = nx.symmetric_scale(w.reshape(8, -1), dim=1).reshape(8, 1, 1, 1)
    assert torch.equal(s, expect)
    assert torch.equal(nx.per_channel_scale(w.reshape(8, -1).t(), -1), expect.reshape(1, 8))
