"""The kernel IR between the passes and the chip: passes decide and write typed specs, costers obey
them and the capability table, and nothing downstream guesses from op names."""

from dataclasses import FrozenInstanceError, dataclass, replace

import pytest
import torch
import torch.nn as nn

import pypto_lab
from pypto_lab.hw.capabilities import capabilities, place_epilogue
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import simulate_matmul
from pypto_lab.kernels.cost import COSTERS, KernelCost, clear_memo, cost, coster
from pypto_lab.kernels.ir import CubeKernel, KernelSpec, VectorKernel


class ConvGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 64, 3, padding=1)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x):
        return nn.functional.gelu(self.bn(self.conv(x)))


@pytest.fixture(scope="module")
def conv_gelu():
    return ConvGelu().eval(), torch.randn(4, 32, 28, 28)


def test_conv_gelu_on_910b_is_costed_the_way_the_fusion_pass_decided(conv_gelu):
    model, x = conv_gelu
    om = pypto_lab.optimize(model, x, chip="Ascend910B1", level=1)
    conv = om.graph.node("conv2d")
    spec = conv.kernel
    # the fusion pass asked the capability table: FixPipe applies the folded BN's bias (BiasTable),
    # GELU only the Vector unit can; it wrote both into the spec
    assert isinstance(spec, CubeKernel) and spec.op == "Conv2D"
    assert spec.epilogue.bias and spec.epilogue.activation == "gelu"
    assert spec.epilogue.fixpipe == {"bias"} and spec.epilogue.vector_stages == ("activation",)
    assert om.graph.node("gelu").group == "conv2d"
    [k] = [k for k in om.report().kernels if k.spec is spec]
    # the coster obeyed: the same simulation as the tile program with that epilogue, on AIC + AIV
    direct = simulate_matmul(spec.m, spec.k, spec.n, dtype="fp16", chip=om.chip, epilogue=spec.epilogue,
                             im2col=spec.im2col)
    assert k.reports[0].epilogue == spec.epilogue and k.time_us == pytest.approx(direct.time_us)
    assert k.resources == ("AIC", "AIV")
    kinds = set(k.reports[0].instructions.kinds)
    assert "fixpipe L0C->GM +bias" in kinds and "load C GM->UB" in kinds and "VEXP" in kinds
    # a ReLU instead rides FixPipe with the bias: no trip through GM, the AIC alone
    relu = place_epilogue(om.chip, bias=True, activation="relu")
    assert relu.fixpipe == {"bias", "activation"} and not relu.on_vector
    fast = cost(replace(spec, epilogue=relu), om.chip)
    assert fast.resources == ("AIC",) and fast.time_us < k.time_us


def test_conv_gelu_on_910a_runs_every_stage_in_ub(conv_gelu):
    model, x = conv_gelu
    om = pypto_lab.optimize(model, x, chip="Ascend910A", level=1)
    epi = om.graph.node("conv2d").kernel.epilogue
    assert not capabilities(om.chip).has_fixpipe
    assert epi.fixpipe == frozenset() and epi.vector_stages == ("bias", "activation")
    [k] = [k for k in om.report().kernels if k.unit == "cube"]
    assert k.resources == ("AI Core",) and "L0C->UB" in k.reports[0].instructions.kinds


def test_specs_are_frozen_values_and_identical_layers_share_one():
    layer = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    model = nn.Sequential(*[layer for _ in range(3)])  # the same layer three times
    om = pypto_lab.optimize(model, torch.randn(8, 64), chip="Ascend910B1", level=1)
    specs = [n.kernel for n in om.graph.nodes if isinstance(n.kernel, CubeKernel)]
    assert len(specs) == 3 and specs[0] == specs[1] == specs[2] and len(set(specs)) == 1
    with pytest.raises(FrozenInstanceError):
        specs[0].m = 1
    with pytest.raises(ValueError, match="Cube kernel m = 0: must be a positive integer"):
        replace(specs[0], m=0)
    with pytest.raises(ValueError, match="computes in fp16, bf16, fp32"):
        VectorKernel("Relu", ("relu",), 64, "fp16", "int8")


def test_costing_is_a_registry_one_coster_per_kind():
    chip = get_chip("Ascend910B1")

    @dataclass(frozen=True)
    class Collective(KernelSpec):
        nbytes: int

        @property
        def unit(self):
            return "link"

    with pytest.raises(TypeError, match="no coster for Collective; register one"):
        cost(Collective(1024), chip)

    @coster(Collective)
    def cost_collective(spec, chip):
        t = spec.nbytes / (chip.host_link_gbps * 1e3)
        return KernelCost(t * chip.clock_mhz, t, float(spec.nbytes), resources=("link",))

    try:
        assert cost(Collective(31_500), chip).time_us == pytest.approx(1.0)
        with pytest.raises(ValueError, match="already has a coster"):
            coster(Collective)(lambda s, c: None)
        with pytest.raises(TypeError, match="needs a Chip"):
            cost(Collective(1), "Ascend910B1")
    finally:
        COSTERS.pop(Collective)
        clear_memo()


def test_the_runtime_reads_the_same_specs(conv_gelu):
    """Numerics follow the spec: at fp32 the Cube runs fp32, at fp16 the conv stores fp16."""
    model, x = conv_gelu
    ref = model(x)
    exact = pypto_lab.optimize(model, x, chip="Ascend910B1", level=1, precision="fp32")
    assert exact.graph.node("conv2d").kernel.dtype == "fp32"
    assert pypto_lab.compare_tensors(exact(x), ref, rtol=1e-4, atol=1e-5, verbose=False).passed
    half = pypto_lab.optimize(model, x, chip="Ascend910B1", level=1, precision="fp16")
    assert half.graph.node("conv2d").kernel.dtype == "fp16"
    out = half(x)
    assert not torch.equal(out, ref) and (out - ref).abs().max() < 2e-2 * ref.abs().max()
    assert torch.equal(out, out.half().float())  # stored in fp16 on its way out of the kernel
