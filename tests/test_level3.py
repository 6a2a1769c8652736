"""Level 3 (tiling search, two-stream scheduling), the precision passes, naive tiling at level 0,
CPU fallbacks' host copies and the kernel-launch option."""

import pytest
import torch
import torch.nn as nn
import torchvision

from pypto_lab import OptimizeError, optimize, set_optimization_options
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import simulate_vector
from pypto_lab.hw.tiling import cube_tile_candidates, default_cube_tile, naive_cube_tile
from pypto_lab.kernels.ir import CubeKernel, Decomposed, VectorKernel


@pytest.fixture(scope="module")
def resnet50():
    return torchvision.models.resnet50().eval(), torch.randn(1, 3, 224, 224)


@pytest.fixture(scope="module")
def small_bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=2)
    return BertModel(config).eval(), torch.randint(0, config.vocab_size, (1, 128))


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend910B1"])
def test_level3_is_faster_than_level0_and_never_slower_than_level2(resnet50, chip):
    model, x = resnet50
    reps = {lv: optimize(model, x, chip=chip, level=lv).report() for lv in (0, 2, 3)}
    assert reps[3].latency_us < reps[0].latency_us
    assert reps[3].latency_us <= reps[2].latency_us + 1e-6
    names = [p.name for p in reps[3].passes]
    assert names[-3:] == ["l2_residency", "tune_tiling", "schedule"]  # tiles are searched with L2 residency
    # the search keeps a tiling only when the simulator says it is faster: kernel by kernel
    l2 = {k.name: k.time_us for k in reps[2].kernels}
    assert all(k.time_us <= l2[k.name] * (1 + 1e-9) for k in reps[3].kernels)
    tuned = next(p for p in reps[3].passes if p.name == "tune_tiling")
    assert "kernels retiled" in tuned.summary and "distinct kernels searched" in tuned.summary


def test_tiling_candidates_are_ranked_and_the_default_is_the_first():
    chip = get_chip("Ascend910B1")
    cands = cube_tile_candidates(chip, 3136, 576, 64)
    assert cands[0] == default_cube_tile(chip, 3136, 576, 64) and len(set(cands)) == len(cands) > 3
    assert cube_tile_candidates(chip, 3136, 576, 64, within=1.0)[0] == cands[0]
    assert len(cube_tile_candidates(chip, 3136, 576, 64, within=1.25)) < len(cands)
    naive = naive_cube_tile(chip, 3136, 576, 64)
    assert (naive.m_l1, naive.k_l1, naive.n_l1) == (128, 64, 64)      # clamped to n = 64


def test_schedule_overlaps_only_where_the_cores_are_separate(small_bert):
    model, ids = small_bert
    a = optimize(model, (ids,), chip="Ascend910A", level=3).report()
    assert a.schedule.concurrent and a.schedule.latency_us == pytest.approx(a.schedule.serial_us)
    assert all(k.resources == ("AI Core",) for k in a.kernels)
    b = optimize(model, (ids,), chip="Ascend910B1", level=3).report()
    assert {k.resources for k in b.kernels} >= {("AIC",), ("AIV",), ("AIC", "AIV")}
    assert b.schedule.latency_us <= b.schedule.serial_us + 1e-9
    # no kernel starts before a kernel it reads from has ended
    ends = {k.name: k.end_us for k in b.schedule.kernels}
    assert all(k.start_us >= 0 and k.end_us >= k.start_us for k in b.schedule.kernels)
    assert b.to_dict()["serial_us"] == pytest.approx(b.schedule.serial_us) and ends
    two = optimize(model, (ids,), chip="Ascend910B1", level=2).report()
    assert not two.schedule.concurrent and two.latency_us == pytest.approx(
        sum(k.time_us + two.stack.launch_us for k in two.kernels))


def test_mixed_precision_keeps_fp32_compute_for_softmax_and_norms(small_bert):
    model, ids = small_bert
    om = optimize(model, (ids,), chip="Ascend910B1", level=0, precision="fp16")
    def computes_fp32(n):
        spec = n.kernel.parts[0] if isinstance(n.kernel, Decomposed) else n.kernel
        return isinstance(spec, VectorKernel) and spec.compute_dtype == "fp32" and spec.dtype == "fp16"

    kept = [n for n in om.graph.nodes if n.kernel is not None and computes_fp32(n)]
    assert {n.op for n in kept} == {"layer_norm"} and len(kept) == 2 * 2 + 1
    step = next(p for p in om.report().passes if p.name == "mixed_precision")
    assert "kept fp32 compute" in step.summary and "layer_norm x5" in step.summary
    fp32 = optimize(model, (ids,), chip="Ascend910B1", level=0, precision="fp32").report()
    assert next(p for p in fp32.passes if p.name == "mixed_precision").summary == "precision fp32: nothing to lower"


def test_fp32_compute_in_ub_costs_conversions_but_not_gm_traffic():
    fp16 = simulate_vector("softmax", 96 * 128 * 128, dtype="fp16", chip="Ascend910B1", row_len=128)
    kept = simulate_vector("softmax", 96 * 128 * 128, dtype="fp16", chip="Ascend910B1", row_len=128,
                           compute_dtype="fp32")
    assert kept.gm_bytes == fp16.gm_bytes and kept.cycles > fp16.cycles
    assert kept.buffer_peak["UB"] <= get_chip("Ascend910B1").buffer("UB").size_bytes
    with pytest.raises(ValueError, match="compute_dtype 'fp64' is not known"):
        simulate_vector("softmax", 1024, compute_dtype="fp64")


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend910B1"])
def test_int8_quantises_cube_ops_and_is_faster_on_resnet(resnet50, chip):
    model, x = resnet50
    fp16 = optimize(model, x, chip=chip, level=3, precision="fp16").report()
    om = optimize(model, x, chip=chip, level=3, precision="int8")
    int8 = om.report()
    cube = [n for n in om.graph.nodes if isinstance(n.kernel, CubeKernel)]
    assert len(cube) == 54 and all(n.kernel.dtype == "int8" and n.kernel.epilogue.dequant for n in cube)
    quantised = {n.name for n in cube if n.kernel.quantize_input is not None}
    requant = {n.name for n in cube if n.kernel.epilogue.quant}
    # the Cube kernels that read a graph input or a Vector kernel's output quantise it first: conv1
    # (the image), layer1.0's conv1 and downsample (the max pool), the classifier (the average pool)
    by_module = {n.name: n.module for n in cube}
    assert sorted(by_module[q] for q in quantised) == ["conv1", "fc", "layer1.0.conv1", "layer1.0.downsample.0"]
    # every other Cube kernel reads int8 that the Cube kernel before it requantised in its epilogue:
    # int8 alone where only Cube kernels read it (a bottleneck's conv1 -> conv2 -> conv3, and the
    # last conv3 of layers 1-3 read by the next conv1 and downsample), an int8 copy beside the fp16
    # result where a residual add or a pooling reads it too (CANN's double-output quant fusion)
    only = {n.name for n in cube if n.kernel.out_dtype == "int8"}
    assert only <= requant and len(only) == 2 * 16 + 3
    dual = [n for n in cube if n.name in requant - only]
    assert dual and all(n.kernel.out_dtype == "fp16" for n in dual)
    copies = [k for k in int8.kernels if k.spec in {n.kernel for n in dual}]
    assert copies and all(any("int8 copy" in kind for kind in k.reports[0].instructions.kinds) for k in copies)
    producers = om.graph.producers()
    for n in cube:
        src = producers.get(n.inputs[0])
        assert (src is not None and src.anchor in requant) == (n.name not in quantised), n.name
    assert int8.latency_us < fp16.latency_us
    assert any(r.name.startswith("quantize") for k in int8.kernels for r in k.reports)


def test_cpu_fallback_pays_the_host_link():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.special.erfinv(torch.tanh(x)))

    x = torch.randn(64, 1024)
    rep = optimize(M(), x, chip="Ascend910B1", level=1).report()
    host = [k for k in rep.kernels if k.unit == "cpu"]
    assert rep.fallback_ops == ["aten.special_erfinv.default"] and len(host) == 1
    nbytes = 2 * 64 * 1024 * 4                        # fp32 in (device->host) and out (host->device)
    assert host[0].time_us == pytest.approx(nbytes / (31.5e9) * 1e6)
    assert host[0].resources == ("host",) and rep.latency_us > host[0].time_us


def test_the_stacks_launch_cost_adds_a_fixed_cost_per_kernel():
    from pypto_lab import get_stack

    model, x = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)), torch.randn(8, 256)
    free = get_stack("atc-om").with_values(launch_us=0.0)
    base = optimize(model, x, chip="Ascend910B1", level=1, stack=free).report()
    slow = optimize(model, x, chip="Ascend910B1", level=1, stack=free.with_values(launch_us=5.0)).report()
    assert slow.latency_us == pytest.approx(base.latency_us + 5.0 * len(base.kernels))
    assert slow.stack.launch_us == 5.0 and "5 us launch" in slow.schedule.summary()
    with pytest.raises(OptimizeError, match="kernel_launch_us.*stack="):
        set_optimization_options({"kernel_launch_us": 5.0})
    with pytest.raises(ValueError, match="launch_us = -1"):
        free.with_values(launch_us=-1)
