"""``pypto-lab run``: an unmodified torch_npu script on the simulated card (`pypto_lab.torch_npu_sim`).

The script of the first test is Ascend code as users write it (``.npu()``, transfer_to_npu on
``.cuda()`` code, npu_fusion_attention, npu_rms_norm, ``torch.npu.synchronize()`` and NPU events):
its numerics are checked against torch and the time it prints against the costed kernels. Then the
fused operators one by one (numerics against a torch reference written here, and the CANN kernel
each lowers to through the lowering table), the card's HBM, the CLI with torch_npu.profiler, and
``import torch_npu`` outside a run (a subprocess: exactly as without pypto_lab).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pypto_lab.hw.chip import get_chip
from pypto_lab.kernels.cost import cost
from pypto_lab.kernels.ir import (
    AttentionKernel,
    CubeKernel,
    Decomposed,
    IncreAttentionKernel,
    MoeGatingKernel,
    TransDataKernel,
    VectorKernel,
)
from pypto_lab.lowering import npu_ops as N
from pypto_lab.lowering.table import lookup
from pypto_lab.stack import get_stack
from pypto_lab.torch_npu_sim import SimulatedNpu, ops, run_script
from pypto_lab.torch_npu_sim.eager import EagerLowering

ROOT = Path(__file__).resolve().parents[1]
CHIP = get_chip("Ascend910B1")
STACK = get_stack("torch_npu-eager")
ops.register()
NPU = torch.ops.npu


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


# ---------------------------------------------------------------------------- the script, end to end

SCRIPT = """
import time
import torch
import torch.nn.functional as F
import torch_npu
from torch_npu.contrib import transfer_to_npu

# CUDA code, unchanged: transfer_to_npu makes it NPU code
x = torch.randn(2048, 2048, dtype=torch.float16).cuda()
w = torch.randn(2048, 2048, dtype=torch.float16, device="cuda")
h = torch.randn(4, 256, 8 * 64, dtype=torch.float16).npu()
g = torch.randn(8 * 64, dtype=torch.float16).npu()

attn = torch_npu.npu_fusion_attention(h, h, h, 8, "BSH", scale=0.125, sparse_mode=3,
                                      atten_mask=torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).npu())[0]
hc = h.cpu().float().view(4, 256, 8, 64).transpose(1, 2)
ref = F.scaled_dot_product_attention(hc, hc, hc, is_causal=True, scale=0.125).transpose(1, 2).reshape(4, 256, 512)
print("attention max error", (attn.cpu().float() - ref).abs().max().item())
y, rstd = torch_npu.npu_rms_norm(h, g, 1e-6)
refn = F.rms_norm(h.cpu().float(), (512,), g.cpu().float(), 1e-6)
print("rms_norm max error", (y.cpu().float() - refn).abs().max().item())

torch.npu.synchronize()
start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
t0 = time.perf_counter()
start.record()
for _ in range(8):
    z = x @ w
end.record()
torch.npu.synchronize()
print(f"8 matmuls: {start.elapsed_time(end):.5f} ms (events), {(time.perf_counter() - t0) * 1e3:.5f} ms (perf_counter)")
print("on", z.device, attn.device, y.device, "cuda available", torch.cuda.is_available())
"""


def test_a_torch_npu_script_runs_unchanged_with_torchs_numerics_and_the_cards_time(tmp_path, capsys):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    code, sim = run_script(str(path), [], output=str(tmp_path / "out"))
    out = capsys.readouterr().out
    assert code == 0, out
    # numerics: the fused operators against torch (fp16 storage)
    assert float(re.search(r"attention max error ([\d.e-]+)", out).group(1)) < 1e-2
    assert float(re.search(r"rms_norm max error ([\d.e-]+)", out).group(1)) < 2e-2
    assert "on npu:0 npu:0 npu:0 cuda available True" in out
    # time: the script's own events print the costed kernels as the stack launches them
    mms = [r for r in sim.card.records if r.op == "mm"]
    assert len(mms) == 8
    assert all(isinstance(r.spec, CubeKernel) and (r.spec.m, r.spec.k, r.spec.n, r.spec.dtype) == (2048, 2048, 2048, "fp16")
               for r in mms)
    t_mm = cost(mms[0].spec, CHIP).time_us
    assert all(r.device_us == pytest.approx(t_mm) for r in mms)
    assert t_mm > STACK.dispatch_us      # each matmul outlasts the next one's dispatch: the card is the bottleneck
    expected_us = STACK.dispatch_us + 8 * (STACK.launch_us + t_mm)
    event_ms, clock_ms = map(float, re.search(r"8 matmuls: ([\d.]+) ms \(events\), ([\d.]+) ms", out).groups())
    assert event_ms * 1e3 == pytest.approx(expected_us, abs=0.02)
    assert clock_ms == pytest.approx(event_ms, abs=2e-4)       # time.perf_counter() reads the simulated host clock (+ its own reads)
    # the fused operators ran as their CANN kernels
    kinds = {r.op: r.spec for r in sim.card.records}
    assert isinstance(kinds["npu_fusion_attention"], AttentionKernel) and kinds["npu_fusion_attention"].causal
    assert isinstance(kinds["npu_rms_norm"], VectorKernel) and kinds["npu_rms_norm"].op == "RmsNorm"
    # summary, trace and kernel_details
    for marker in ("top kernels by device time", "MatMulV2", "FlashAttentionScore", "RmsNorm", "MemcpyH2D",
                   "transfer_to_npu", "HBM               peak"):
        assert marker in out, marker
    with open(tmp_path / "out" / "kernel_details.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {"Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)"} <= set(rows[0])
    mm_rows = [r for r in rows if r["Name"] == "MatMulV2:mm"]
    assert len(mm_rows) == 8 and float(mm_rows[0]["Duration(us)"]) == pytest.approx(t_mm, abs=1e-3)
    trace = json.loads((tmp_path / "out" / "trace_view.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
    assert {"MatMulV2:mm", "RmsNorm:npu_rms_norm", "FlashAttentionScore:npu_fusion_attention"} <= names
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::mm" for e in trace["traceEvents"])
    # nothing of the run is left behind: no torch_npu, no NPU (torch.npu says so to torch's own code)
    assert "torch_npu" not in sys.modules and not torch.npu.is_available() and torch.Tensor.npu is not None


def test_a_host_bound_loop_shows_the_dispatch_and_the_event_timer_sees_it(tmp_path, capsys):
    path = tmp_path / "small.py"
    path.write_text(textwrap.dedent("""
        import torch, torch_npu
        x = torch.randn(64, 64).npu()
        step = torch.compile(lambda t: torch.relu(t + 1))     # runs eagerly on the card
        s, e = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        s.record()
        for _ in range(100):
            x = step(x)
        e.record()
        e.synchronize()
        print(f"loop {s.elapsed_time(e) * 1e3:.2f} us")
    """))
    code, sim = run_script(str(path), [], output=None)
    out = capsys.readouterr().out
    assert code == 0
    loop_us = float(re.search(r"loop ([\d.]+) us", out).group(1))
    assert loop_us == pytest.approx(200 * STACK.dispatch_us + STACK.launch_us + sim.card.records[-1].device_us, rel=1e-3)
    assert "host-bound" in out and "torch.compile(backend='inductor') ran its model eagerly" in out


def test_streams_overlap_only_where_their_kernels_hold_different_cores():
    with SimulatedNpu() as sim:
        a = torch.randn(2048, 2048, dtype=torch.float16).npu()
        v = torch.randn(16, 2 ** 20, dtype=torch.float16).npu()
        torch.npu.synchronize()
        s1, s2 = torch.npu.Stream(), torch.npu.Stream()
        with torch.npu.stream(s1):
            a @ a                                   # Cube (AIC)
        with torch.npu.stream(s2):
            torch.exp(v)                            # Vector (AIV): beside it on the 910B
            a @ a                                   # Cube again: after the first
        torch.npu.synchronize()
        mm1, ex, mm2 = sim.card.records[-3:]
    assert (mm1.op, ex.op, mm2.op) == ("mm", "exp", "mm") and mm1.stream != ex.stream == mm2.stream
    assert ex.start < mm1.end                       # overlap: different cores
    assert mm2.start >= mm1.end                     # the second Cube kernel waits for the AIC cores


# ---------------------------------------------------------------------------- the fused operators

def _launch(func, *args, **kwargs):
    """The kernels one call of a torch_npu operator launches on the card (the lowering table's)."""
    out = func(*args, **kwargs)
    return out, EagerLowering(CHIP, STACK).launches(func.default if hasattr(func, "default") else func, args, kwargs, out)


def _bnsd(t, n):
    b, s, h = t.shape
    return t.view(b, s, n, h // n).transpose(1, 2)


def test_npu_fusion_attention_gqa_bsh_causal_and_tnd():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 64, 8 * 32), torch.randn(2, 64, 2 * 32), torch.randn(2, 64, 2 * 32)
    out, launches = _launch(NPU.npu_fusion_attention, q, k, v, 8, "BSH", scale=0.2, sparse_mode=2,
                            atten_mask=torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1))
    ref = F.scaled_dot_product_attention(_bnsd(q, 8), _bnsd(k, 2), _bnsd(v, 2), is_causal=True, scale=0.2,
                                         enable_gqa=True).transpose(1, 2).reshape(2, 64, 256)
    torch.testing.assert_close(out[0], ref, rtol=1e-4, atol=1e-5)
    assert out[1].shape == (2, 8, 64, 8) and out[3].numel() == 0
    (spec,) = [lt.spec for lt in launches]
    assert spec == AttentionKernel(16, 64, 64, 32, "fp32", flash=True, causal=True)
    assert lookup("npu.npu_fusion_attention.default").lower is N.fusion_attention
    # TND: two packed sequences of 24 and 40 tokens, each attending to itself only
    t = torch.randn(64, 4, 32)
    o = NPU.npu_fusion_attention(t, t, t, 4, "TND", scale=0.3, actual_seq_qlen=[24, 64], actual_seq_kvlen=[24, 64])[0]
    for a, b in ((0, 24), (24, 64)):
        s = t[a:b].transpose(0, 1)
        torch.testing.assert_close(o[a:b], F.scaled_dot_product_attention(s, s, s, scale=0.3).transpose(0, 1),
                                   rtol=1e-4, atol=1e-5)


def test_npu_fusion_attention_backward_is_torchs_gradient():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 16, 8, requires_grad=True)
    k = torch.randn(1, 4, 16, 8, requires_grad=True)
    v = torch.randn(1, 4, 16, 8, requires_grad=True)
    NPU.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5, sparse_mode=2)[0].pow(2).sum().backward()
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, scale=0.5).pow(2).sum().backward()
    for a, b in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    _, launches = _launch(NPU.npu_fusion_attention_grad, q.detach(), k.detach(), v.detach(), q.detach(), 4, "BNSD")
    assert [type(lt.spec) for lt in launches] == [AttentionKernel] and launches[0].op_type == "FlashAttentionScoreGrad"
    assert launches[0].spec.backward and launches[0].spec.flash


def test_npu_fused_infer_attention_score_decode_over_a_paged_cache():
    torch.manual_seed(2)
    heads, kvh, d, block = 8, 2, 32, 16
    lengths = [37, 20]
    cache_k, cache_v = torch.randn(10, block, kvh * d), torch.randn(10, block, kvh * d)
    table = torch.tensor([[3, 7, 1], [5, 0, 9]], dtype=torch.int32)
    q = torch.randn(2, 1, heads * d)
    out, launches = _launch(NPU.npu_fused_infer_attention_score, q, cache_k, cache_v, num_heads=heads,
                            num_key_value_heads=kvh, input_layout="BSH", scale=0.17, block_table=table,
                            block_size=block, actual_seq_lengths_kv=lengths)
    for b, n in enumerate(lengths):
        kk = torch.cat([cache_k[i] for i in table[b].tolist()])[:n].view(n, kvh, d).transpose(0, 1)
        vv = torch.cat([cache_v[i] for i in table[b].tolist()])[:n].view(n, kvh, d).transpose(0, 1)
        qq = q[b].view(1, heads, d).transpose(0, 1)
        ref = F.scaled_dot_product_attention(qq, kk, vv, scale=0.17, enable_gqa=True).transpose(0, 1).reshape(1, -1)
        torch.testing.assert_close(out[0][b], ref, rtol=1e-4, atol=1e-5)
    (spec,) = [lt.spec for lt in launches]    # decode: IncreFlashAttention over the mean actual length
    assert spec == IncreAttentionKernel(2, kvh, heads // kvh, 28, d, "fp32", "fp16")
    # prefill: BNSD, causal
    qp = torch.randn(1, 4, 32, 16)
    o = NPU.npu_fused_infer_attention_score(qp, qp, qp, num_heads=4, input_layout="BNSD", scale=0.25, sparse_mode=3)[0]
    torch.testing.assert_close(o, F.scaled_dot_product_attention(qp, qp, qp, is_causal=True, scale=0.25),
                               rtol=1e-4, atol=1e-5)


def test_npu_rms_norm_add_rms_norm_and_their_kernels():
    torch.manual_seed(3)
    x, r, g = torch.randn(6, 128, dtype=torch.bfloat16), torch.randn(6, 128, dtype=torch.bfloat16), torch.randn(128)
    (y, rstd), launches = _launch(NPU.npu_rms_norm, x, g, 1e-6)
    torch.testing.assert_close(y.float(), F.rms_norm(x.float(), (128,), g, 1e-6), rtol=1e-2, atol=1e-2)
    assert y.dtype == torch.bfloat16 and rstd.shape == (6, 1) and rstd.dtype == torch.float32
    assert launches[0].spec == VectorKernel("RmsNorm", ("rmsnorm",), 768, "bf16", "fp32", None, 128)
    (y2, _, xs), launches = _launch(NPU.npu_add_rms_norm, x, r, g, 1e-6)
    torch.testing.assert_close(xs.float(), (x.float() + r.float()), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y2.float(), F.rms_norm(xs.float(), (128,), g, 1e-6), rtol=1e-2, atol=1e-2)
    from pypto_lab.llm.forward import _norm
    assert launches[0].spec == _norm("AddRmsNorm", ("add", "rmsnorm"), 768, "bf16", 128, 3)   # the LLM engine's kernel
    # autograd through npu_rms_norm: its own backward kernel, torch's gradient
    xg, gg = torch.randn(4, 64, requires_grad=True), torch.randn(64, requires_grad=True)
    NPU.npu_rms_norm(xg, gg, 1e-6)[0].pow(2).sum().backward()
    xr, gr = xg.detach().clone().requires_grad_(), gg.detach().clone().requires_grad_()
    F.rms_norm(xr, (64,), gr, 1e-6).pow(2).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gg.grad, gr.grad, rtol=1e-4, atol=1e-5)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def test_npu_rotary_mul_and_npu_swiglu():
    torch.manual_seed(4)
    x = torch.randn(2, 16, 4, 64, dtype=torch.float16)
    ang = torch.randn(1, 16, 1, 64)
    out, launches = _launch(NPU.npu_rotary_mul, x, ang.cos(), ang.sin())
    ref = x.float() * ang.cos() + _rotate_half(x.float()) * ang.sin()
    torch.testing.assert_close(out.float(), ref, rtol=1e-3, atol=2e-3)
    assert launches[0].spec == VectorKernel("RotaryMul", ("rope",), x.numel(), "fp16", "fp16")
    inter = NPU.npu_rotary_mul(x.float(), ang.cos(), ang.sin(), "interleave")
    pairs = x.float().view(2, 16, 4, 32, 2)
    rot = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    torch.testing.assert_close(inter, x.float() * ang.cos() + rot * ang.sin())
    xs = torch.randn(8, 256, dtype=torch.bfloat16)
    out, launches = _launch(NPU.npu_swiglu, xs, -1)
    a, b = xs.float().chunk(2, -1)
    torch.testing.assert_close(out.float(), F.silu(a) * b, rtol=1e-2, atol=1e-2)
    assert launches[0].spec == VectorKernel("SwiGlu", ("swiglu",), 8 * 128, "bf16", "bf16")
    # both backward, through autograd
    xg = torch.randn(4, 32, requires_grad=True)
    NPU.npu_swiglu(xg, -1).sum().backward()
    xr = xg.detach().clone().requires_grad_()
    (F.silu(xr[:, :16]) * xr[:, 16:]).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)


def test_npu_moe_gating_top_k_groups_then_experts():
    torch.manual_seed(5)
    x, bias = torch.randn(6, 64), torch.randn(64) * 0.1
    (w, ids, norm), launches = _launch(NPU.npu_moe_gating_top_k, x, 4, bias=bias, k_group=2, group_count=4,
                                        group_select_mode=1, norm_type=1, out_flag=True, routed_scaling_factor=2.5)
    # DeepSeek-V3's grouped routing, written out: sigmoid scores, groups ranked by their top-2 sum (with
    # the bias), the best 2 groups kept, top 4 experts there, weights from the unbiased scores, renormalised
    s = torch.sigmoid(x)
    biased = (s + bias).view(6, 4, 16)
    keep = biased.topk(2, -1).values.sum(-1).topk(2, -1).indices
    mask = torch.ones(6, 4, dtype=torch.bool).scatter_(1, keep, False)
    chosen = biased.masked_fill(mask.unsqueeze(-1), float("-inf")).view(6, 64).topk(4, -1).indices
    weights = s.gather(1, chosen)
    weights = weights / weights.sum(-1, keepdim=True) * 2.5
    assert torch.equal(ids.long().sort(-1).values, chosen.sort(-1).values) and ids.dtype == torch.int32
    torch.testing.assert_close(w.gather(1, ids.long().argsort(-1)), weights.gather(1, chosen.argsort(-1)))
    torch.testing.assert_close(norm, s)
    assert launches[0].spec == MoeGatingKernel(6, 64, 4, "sigmoid", "fp32")
    (w2, ids2, rows), _ = _launch(NPU.npu_moe_gating_top_k_softmax, x, None, 2)
    p = torch.softmax(x, -1).topk(2, -1)
    torch.testing.assert_close(w2, p.values) and torch.testing.assert_close(ids2.long(), p.indices)
    assert rows[1, 0].item() == 1 and rows[1, 1].item() == 7


def test_npu_grouped_matmul_float_and_w8a16():
    torch.manual_seed(6)
    x, w = torch.randn(10, 32), torch.randn(3, 32, 24)
    counts = [4, 0, 6]
    (y,), launches = _launch(NPU.npu_grouped_matmul, [x], [w], group_list=torch.tensor(counts), group_list_type=1,
                             group_type=0, split_item=2)
    ref = torch.cat([x[0:4] @ w[0], x[4:10] @ w[2]])
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert launches[0].spec == CubeKernel("GroupedMatmul", 3, 4, 32, 24, "fp32", "fp32")
    assert lookup("npu.npu_grouped_matmul.default").lower is N.grouped_matmul
    wq = torch.randint(-127, 127, (3, 32, 24), dtype=torch.int8)
    scale = torch.rand(3, 24) * 0.02
    xh = x.half()
    (yq,), launches = _launch(NPU.npu_grouped_matmul, [xh], [wq], antiquant_scale=[scale],
                              group_list=torch.tensor([4, 4, 10]), group_list_type=0, group_type=0, split_item=3)
    refq = torch.cat([xh[a:b].float() @ (wq[e].float() * scale[e]) for e, (a, b) in enumerate(((0, 4), (4, 4), (4, 10)))])
    torch.testing.assert_close(yq.float(), refq, rtol=2e-3, atol=2e-2)
    assert launches[0].spec.weight_dtype == "int8" and launches[0].spec.dtype == "fp16"


def test_the_quantised_matmuls_and_dynamic_quant():
    torch.manual_seed(7)
    a = torch.randint(-128, 127, (16, 64), dtype=torch.int8)
    b = torch.randint(-128, 127, (64, 32), dtype=torch.int8)
    scale, tok = torch.rand(32) * 1e-3, torch.rand(16)
    y, launches = _launch(NPU.npu_quant_matmul, a, b, scale, pertoken_scale=tok, output_dtype=torch.float16)
    ref = (a.double() @ b.double()).float() * scale * tok.unsqueeze(-1)
    torch.testing.assert_close(y.float(), ref, rtol=1e-3, atol=1e-2)
    assert launches[0].spec == CubeKernel("QuantBatchMatmulV3", 1, 16, 64, 32, "int8", "fp16")
    x = torch.randn(16, 64, dtype=torch.float16)
    w = torch.randint(-128, 127, (64, 32), dtype=torch.int8)
    s, off = torch.rand(32) * 0.01, torch.randn(32)
    y, launches = _launch(NPU.npu_weight_quant_batchmatmul, x, w, s, off)
    torch.testing.assert_close(y.float(), x.float() @ ((w.float() + off) * s), rtol=2e-3, atol=2e-2)
    assert launches[0].spec == CubeKernel("WeightQuantBatchMatmulV2", 1, 16, 64, 32, "fp16", "fp16", weight_dtype="int8")
    (q8, qs), launches = _launch(NPU.npu_dynamic_quant, x)
    torch.testing.assert_close(q8.float() * qs.unsqueeze(-1), x.float(), rtol=0, atol=float(qs.max()) * 0.51)
    assert launches[0].op_type == "DynamicQuant" and isinstance(launches[0].spec, VectorKernel)
    nz, launches = _launch(NPU.npu_format_cast, x, 29)
    assert isinstance(launches[0].spec, TransDataKernel) and torch.equal(nz, x)


def test_npu_mla_prolog_as_its_documentation_states_it():
    torch.manual_seed(8)
    t, he, hcq, n, dn, dr, hckv, blocks, block = 3, 64, 32, 4, 16, 8, 24, 4, 4
    x = torch.randn(t, he, dtype=torch.bfloat16)
    w_dq, w_uq_qr = torch.randn(he, hcq, dtype=torch.bfloat16) * 0.1, torch.randn(hcq, n * (dn + dr), dtype=torch.bfloat16) * 0.1
    w_uk, w_dkv_kr = torch.randn(n, dn, hckv, dtype=torch.bfloat16) * 0.1, torch.randn(he, hckv + dr, dtype=torch.bfloat16) * 0.1
    g_cq, g_ckv = torch.rand(hcq, dtype=torch.bfloat16) + 0.5, torch.rand(hckv, dtype=torch.bfloat16) + 0.5
    ang = torch.randn(t, dr)
    sin, cos = ang.sin().bfloat16(), ang.cos().bfloat16()
    slots = torch.tensor([5, 0, 11])
    kv_cache, kr_cache = torch.zeros(blocks, block, 1, hckv, dtype=torch.bfloat16), torch.zeros(blocks, block, 1, dr, dtype=torch.bfloat16)
    (q, q_rope, _, _), launches = _launch(NPU.npu_mla_prolog, x, w_dq, w_uq_qr, w_uk, w_dkv_kr, g_cq, g_ckv, sin, cos,
                                          slots, kv_cache, kr_cache)
    f = torch.float32
    cq = F.rms_norm((x.to(f) @ w_dq.to(f)), (hcq,), g_cq.to(f), 1e-5)
    qq = (cq @ w_uq_qr.to(f)).view(t, n, dn + dr)
    q_ref = torch.einsum("tnd,ndh->tnh", qq[..., :dn], w_uk.to(f))
    rope = qq[..., dn:] * cos.to(f).unsqueeze(1) + _rotate_half(qq[..., dn:]) * sin.to(f).unsqueeze(1)
    kv = x.to(f) @ w_dkv_kr.to(f)
    torch.testing.assert_close(q.float(), q_ref, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(q_rope.float(), rope, rtol=3e-2, atol=3e-2)
    ckv = F.rms_norm(kv[:, :hckv], (hckv,), g_ckv.to(f), 1e-5)
    kr = kv[:, hckv:] * cos.to(f) + _rotate_half(kv[:, hckv:]) * sin.to(f)
    torch.testing.assert_close(kv_cache.view(-1, hckv)[slots].float(), ckv, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(kr_cache.view(-1, dr)[slots].float(), kr, rtol=3e-2, atol=3e-2)
    assert kv_cache.view(-1, hckv)[1].abs().sum() == 0          # only the given slots are written
    (spec,) = [lt.spec for lt in launches]
    assert isinstance(spec, Decomposed) and spec.op == "MlaProlog" and launches[0].op_type == "MlaProlog"
    assert [type(p).__name__ for p in spec.parts][:4] == ["CubeKernel", "VectorKernel", "CubeKernel", "CubeKernel"]
    assert launches[0].cost.time_us == pytest.approx(sum(cost(p, CHIP).time_us for p in spec.parts))


def test_npu_fused_adamw_is_adamw_and_runs_torch_npus_combined_kernels():
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 16)
    with SimulatedNpu() as sim:
        import torch_npu

        model = model.npu()
        opt = torch_npu.optim.NpuFusedAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        xn = x.npu()
        for _ in range(3):
            opt.zero_grad()
            model(xn).pow(2).mean().backward()
            opt.step()
        first = len(sim.card.records)
        opt.zero_grad()
        model(xn).pow(2).mean().backward()
        mark = len(sim.card.records)
        opt.step()
        step_records = sim.card.records[mark:]
        params = [p.detach().cpu() for p in model.parameters()]
    assert first > 0
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    for _ in range(4):
        ropt.zero_grad()
        ref(x).pow(2).mean().backward()
        ropt.step()
    for a, b in zip(params, ref.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
    total = sum(p.numel() for p in ref.parameters())
    assert [r.op for r in step_records] == ["mul_", "mul_", "add_", "mul_", "addcmul_", "sqrt", "div", "add_", "addcdiv_"]
    assert all(r.spec.numel >= total for r in step_records)


# ---------------------------------------------------------------------------- memory, CLI, outside a run

def test_the_cards_hbm_counts_live_tensors_and_runs_out_as_torch_npu_does():
    small = dataclasses.replace(get_chip("Ascend910B1"), hbm_bytes=64 * 2 ** 20)
    with SimulatedNpu(chip=small):
        a = torch.empty(32 * 2 ** 20, dtype=torch.uint8, device="npu")
        view = a[: 2 ** 20]
        assert torch.npu.memory_allocated() == 32 * 2 ** 20 and view.device.type == "npu"
        with pytest.raises(torch.OutOfMemoryError, match=r"NPU out of memory. Tried to allocate 40.00 MiB"):
            torch.zeros(40 * 2 ** 20, dtype=torch.uint8).npu()
        del a, view
        assert torch.npu.memory_allocated() == 0 and torch.npu.max_memory_allocated() == 32 * 2 ** 20
        b = torch.ones(4).npu()
        assert b.cpu().device.type == "cpu" and not b.is_cpu and b.is_npu
        with pytest.raises(TypeError, match="can't convert npu:0 device type tensor to numpy"):
            b.numpy()
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            b + torch.ones(4)
        assert "device='npu:0'" in repr(b)


def test_the_cli_runs_a_script_with_torch_npu_profiler_and_returns_its_exit_code(tmp_path):
    script = tmp_path / "prof.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch_npu
        x = torch.randn(256, 256).npu()
        prof = torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            schedule=torch_npu.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(sys.argv[1]),
            experimental_config=torch_npu.profiler._ExperimentalConfig(
                profiler_level=torch_npu.profiler.ProfilerLevel.Level1))
        prof.start()
        for step in range(6):
            y = torch.softmax(x @ x, dim=-1)
            prof.step()
        prof.stop()
        print(prof.key_averages().table(sort_by="npu_time_total", row_limit=5))
        sys.exit(3)
    """))
    prof_dir, out_dir = tmp_path / "prof", tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "pypto_lab.cli", "run", "--output", str(out_dir), "--top", "3",
                          str(script), str(prof_dir)], capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert run.returncode == 3, run.stderr[-3000:]
    assert "MatMulV2" in run.stdout and "top kernels by device time (3 of" in run.stdout
    (saved,) = list(prof_dir.glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT"))
    with open(saved / "kernel_details.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted({r["Type"] for r in rows}) == ["MatMulV2", "SoftmaxV2"] and len(rows) == 4   # steps 2 and 3
    assert (out_dir / "trace_view.json").is_file() and (out_dir / "kernel_details.csv").is_file()
    bad = subprocess.run([sys.executable, "-m", "pypto_lab.run", "--chip", "Ascend999", str(script)],
                         capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert bad.returncode == 2 and "unknown chip" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "pypto_lab.cli", "run", "nowhere.py"], capture_output=True,
                             text=True, env=_env(), cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere.py: no such script" in missing.stderr


def test_outside_a_run_import_torch_npu_is_what_it_is_without_pypto_lab(tmp_path):
    """In a fresh process: without pypto_lab, with pypto_lab and the simulator imported, and after a run
    in the same process, ``import torch_npu`` gives the same thing (the real package, or the same
    ModuleNotFoundError)."""
    def outcome(code: str, extra_path: str | None = None) -> str:
        env = _env()
        if extra_path:
            env["PYTHONPATH"] = extra_path + os.pathsep + env["PYTHONPATH"]
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
        return (r.stdout + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.stdout).strip()

    probe = ("import sys\ntry:\n    import torch_npu\n    print('imported', torch_npu.__file__)\n"
             "except Exception as e:\n    print(type(e).__name__, e)\n")
    lab = "import sys, pypto_lab, pypto_lab.torch_npu_sim, pypto_lab.run, pypto_lab.cli, torch\n"
    script = tmp_path / "s.py"
    script.write_text("import torch_npu; print('inside', torch_npu.__version__)\n")
    after = (lab + f"from pypto_lab.torch_npu_sim import run_script\nrun_script({str(script)!r}, output=None, "
             "print_summary=False)\n")
    plain = outcome(probe)
    assert plain.startswith("ModuleNotFoundError")
    assert outcome(lab + probe) == plain
    gone = "assert not torch.npu.is_available() and 'torch_npu' not in sys.modules\n"
    ran = outcome(after + gone + probe)
    assert ran.startswith("inside ") and "+pypto.lab.sim" in ran and ran.endswith(plain)
    # a real torch_npu installed alongside is never shadowed outside a run
    fake = tmp_path / "site"
    (fake / "torch_npu").mkdir(parents=True)
    (fake / "torch_npu" / "__init__.py").write_text("REAL = True\n")
    real = outcome(probe, str(fake))
    assert real == f"imported {fake / 'torch_npu' / '__init__.py'}"
    assert outcome(lab + probe, str(fake)) == real
    both = outcome("import torch_npu as real\n" + after + probe + "assert sys.modules['torch_npu'] is real\n",
                   str(fake))
    assert both.startswith("inside") and both.endswith(real)


# ---------------------------------------------------------------------------- the seed articles

def test_the_second_seed_articles_snippets_run_as_written(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pypto_lab.run", "--output", str(tmp_path / "out"),
                          str(ROOT / "examples" / "seed_zero_day.py")], capture_output=True, text=True, env=_env(),
                         cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for marker in ("单次推理完成", "3.2 output on npu:0", "3.3 batches: 4", "MemcpyH2D", "FlashAttentionScore"):
        assert marker in run.stdout, marker
    source = (ROOT / "examples" / "seed_zero_day.py").read_text()
    for line in ('model = torch.jit.load("ling_3_0_flash_optimized_for_ascend.pt")', "model = model.npu()",
                 "dummy_input = torch.randn(1, seq_len, hidden_size).npu()", "batch_data = batch_data.npu()"):
        assert line in source, line
