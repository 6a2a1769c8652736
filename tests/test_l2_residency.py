"""L2 residency between operators (ATC's --buffer_optimize=l2_optimize): the planner on kernel
sequences, the costers taking L2-resident bytes, and the pass in `optimize` naming the layers."""

import pytest
import torch

from pypto_lab.compiler.optimize import optimize
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import Im2col, simulate_matmul, simulate_vector
from pypto_lab.hw.l2_residency import L2PlanError, Step, plan_l2
from pypto_lab.kernels.ir import CubeKernel
from pypto_lab.passes.l2_residency import layer_of
from pypto_lab.stack import get_stack

MB = 1 << 20
L2 = 16 * MB  # Ascend310P3's L2 (platform config l2_size=16777216)


def chain(act: int, weights: int = 0) -> list[Step]:
    """conv1 writes ``act`` bytes that conv2 reads (each reads ``weights`` bytes of its own weights)."""
    return [Step(reads=(("x", act), ("w1", weights)), writes=(("a", act),)),
            Step(reads=(("a", act), ("w2", weights)), writes=(("y", act),))]


def test_a_3mb_activation_between_two_convs_stays_in_l2():
    plan = plan_l2(chain(3 * MB, 1 * MB), L2, outputs=("y",))
    assert plan.l2_writes == (3 * MB, 0)           # conv1's result never reaches DRAM
    assert plan.l2_reads == (0, 3 * MB)            # conv2 reads it from L2
    assert plan.resident == {"a": 3 * MB} and plan.spilled == {"y": 3 * MB}  # the graph output goes to DRAM


def test_an_activation_larger_than_l2_crosses_dram():
    plan = plan_l2(chain(20 * MB), L2, outputs=("y",))
    assert plan.l2_writes == (0, 0) and plan.l2_reads == (0, 0)
    assert "a" in plan.spilled


def test_streamed_weights_evict_an_older_activation_least_recently_used_first():
    # a is written, then a kernel streams 14 MB of weights before a's reader runs: a leaves L2
    steps = [Step(writes=(("a", 4 * MB),)), Step(reads=(("w", 14 * MB),), writes=(("b", 1 * MB),)),
             Step(reads=(("a", 4 * MB), ("b", 1 * MB)), writes=(("y", 1 * MB),))]
    plan = plan_l2(steps, L2, outputs=("y",))
    assert "a" in plan.spilled and plan.resident == {"b": 1 * MB}
    assert plan.l2_reads[2] == 1 * MB              # only b is still there


def test_a_weight_read_again_soon_hits_l2():
    # ALBERT shares one layer's weights: the second layer finds them in L2
    layer = Step(reads=(("w_shared", 8 * MB), ("h", 1 * MB)), writes=(("h", 1 * MB),))
    plan = plan_l2([Step(writes=(("h", 1 * MB),)), layer, layer], L2)
    assert plan.l2_reads[2] >= 8 * MB


def test_a_reader_that_reads_dram_forces_the_write_back():
    steps = [Step(writes=(("a", 1 * MB),)), Step(reads=(("a", 1 * MB),), l2_capable=False)]
    plan = plan_l2(steps, L2)
    assert plan.spilled == {"a": 1 * MB} and plan.l2_writes == (0, 0)


def test_planner_rejects_bad_input_with_rule_and_fix():
    with pytest.raises(L2PlanError, match="capacity = -1.*chip.l2_bytes"):
        plan_l2([], -1)
    with pytest.raises(L2PlanError, match="tensor 'a' has -3 bytes.*size in bytes"):
        plan_l2([Step(writes=(("a", -3),))], L2)
    with pytest.raises(L2PlanError, match="each step is a pypto_lab.hw.l2_residency.Step"):
        plan_l2(["conv"], L2)


def test_a_conv_reading_its_input_from_l2_moves_fewer_dram_bytes_and_runs_faster_on_310p3():
    chip = get_chip("Ascend310P3")
    act = 64 * 128 * 192 * 2                       # the 3.1 MB fp16 feature map, and the result of the same size
    shape = dict(m=128 * 192, k=64 * 9, n=64, chip=chip, im2col=Im2col(192, 192, 3, 3, 1))
    cold = simulate_matmul(**shape)
    warm = simulate_matmul(**shape, l2_operands=("a",), l2_writes=act)
    # every read of the feature map hits L2, the rows that overlapping panels read again too
    assert warm.l2_kept_bytes >= act + act
    assert warm.dram_bytes == pytest.approx(cold.min_gm_bytes - warm.l2_kept_bytes)
    assert warm.time_us < cold.time_us
    with pytest.raises(ValueError, match=r"l2_operands \['c'\].*a, b, residual"):
        simulate_matmul(**shape, l2_operands=("c",))
    v_cold = simulate_vector("relu", act // 2, chip=chip)
    v_warm = simulate_vector("relu", act // 2, chip=chip, l2_reads=act, l2_writes=act)
    assert v_warm.dram_bytes == 0 and v_warm.time_us < v_cold.time_us
    with pytest.raises(ValueError, match="l2_reads = -1.*Fix: pass 0"):
        simulate_vector("relu", 1024, chip=chip, l2_reads=-1)
    with pytest.raises(ValueError, match="l2_writes = -2.*l2_residency pass sets it"):
        CubeKernel("MatMulV2", 1, 16, 16, 16, "fp16", "fp16", l2_writes=-2)
    with pytest.raises(ValueError, match="l2_operands = \\('x',\\).*'a', 'b', 'residual'"):
        CubeKernel("MatMulV2", 1, 16, 16, 16, "fp16", "fp16", l2_operands=("x",))


class TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


def _report(batch: int, stack="atc-om"):
    x = torch.randn(batch, 64, 128, 192)   # a 3.1 MB fp16 activation per sample
    return optimize(TwoConvs().eval(), (x,), chip="Ascend310P3", level=2, precision="fp16", stack=stack).report()


def test_optimize_keeps_the_activation_between_two_convs_in_l2_and_says_so():
    rep = _report(1)
    conv2 = next(k for k in rep.kernels if k.name == "Conv2D:conv2")
    assert conv2.spec.l2_operands == ("a",)              # conv1's result, read from L2
    assert conv2.reports[0].l2_kept_bytes >= 2 * 64 * 128 * 192 * 2   # and conv2's stays there for the TransData
    step = next(p for p in rep.passes if p.name == "l2_residency")
    assert any("conv1" in line and "stay in L2" in line and "l2_optimize" in line for line in step.lines)
    assert any("L2 kept" in n for n in rep.notes)
    stack = get_stack("atc-om")
    off = stack.with_values(fusions=[f for f in stack.fusions if f != "l2_optimize"])
    cold = _report(1, off)
    assert rep.dram_bytes < cold.dram_bytes and rep.latency_us < cold.latency_us
    assert next(p for p in cold.passes if p.name == "l2_residency").summary.startswith("not run")


def test_at_batch_8_the_activation_exceeds_l2_and_the_report_says_it_reaches_dram():
    atc = get_stack("atc-om")
    whole = atc.with_values(fusions=sorted(atc.fusions - {"l2_batch_split"}))   # the batch not split
    rep = _report(8, whole)                 # 25.2 MB per activation: more than the 16.8 MB L2
    assert all(k.reports[0].l2_kept_bytes == 0 for k in rep.kernels)
    step = next(p for p in rep.passes if p.name == "l2_residency")
    assert any("reach DRAM" in line and "25.2 MB" in line for line in step.lines)
    split = _report(8)                      # ATC's default splits the batch: slices of 4 stay in L2
    assert split.passes[-1].name == "l2_batch_split" and split.latency_us < rep.latency_us


def test_layer_names_in_the_report():
    assert layer_of("layer3.0.conv1") == "layer3.*"
    assert layer_of("bert.encoder.layer.5.attention.self.query") == "bert.encoder.layer.*"
    assert layer_of("Mixed_5b.branch1x1.conv") == "Mixed_5b"
    assert layer_of("") == "(graph)"


def test_attention_stays_unfused_where_the_core_version_has_no_flashattention_kernel():
    # FlashAttentionScore supports Atlas A2/A3 only (hw.capabilities [fa]): on 310P3 an attention runs as
    # BatchMatMul, SoftmaxV2, BatchMatMul with its scores in GM; on 910B1 it is one FlashAttention kernel
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(num_hidden_layers=1, hidden_size=128, num_attention_heads=2,
                                 intermediate_size=256)).eval()
    ids = torch.randint(0, 1000, (1, 64))
    for chip, flash in (("Ascend310P3", False), ("Ascend910B1", True)):
        rep = optimize(model, (ids,), chip=chip, level=1, precision="fp16").report()
        attention = [k for k in rep.kernels if k.spec.kind == "attention"]
        assert attention and all(k.spec.flash is flash for k in attention)
        step = next(p for p in rep.passes if p.name == "fuse_attention")
        assert ("no FlashAttention kernel" in step.summary) is not flash


def test_torch_aie_keeps_no_activation_in_l2_between_operators():
    # AscendIE, which torch_aie builds on, documents no L2 buffer optimisation (a GE/ATC build option)
    rep = _report(1, "torch_aie")
    assert rep.stack.name == "torch_aie"
    assert next(p for p in rep.passes if p.name == "l2_residency").summary.startswith("not run")
    assert rep.dram_bytes > _report(1).dram_bytes
