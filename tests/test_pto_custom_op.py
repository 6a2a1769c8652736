"""A pto kernel plugged into a model as a custom op's NPU implementation (`pypto_lab.kernels.pto_bridge`)."""

import pytest
import torch

import pypto_lab
import pypto_lab.pto as pypto
from pypto_lab.lowering.custom_ops import CustomOpError, custom_op

T, H = 64, 512


def rms_kernel_with(rows: int, dtype=pypto.DT_FP16, chip: str | None = None, out_cols: int = H):
    """The RMSNorm pto kernel with ``rows`` rows per vector tile (a fresh kernel object each call)."""
    opts = {"run_mode": pypto.RunMode.SIM, **({"chip": chip} if chip else {})}

    @pypto.frontend.jit(runtime_options=opts)
    def rms_kernel(x: pypto.Tensor((T, H), dtype), g: pypto.Tensor((H,), dtype),
                   out: pypto.Tensor((T, out_cols), dtype)):
        pypto.set_vec_tile_shapes(rows, H)
        ms = pypto.sum(x * x, dim=-1, keepdim=True) / H
        out[:] = x * pypto.rsqrt(ms + 1e-6) * g
    return rms_kernel


def reference_rms(x, g):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g


def register(kernel):
    """``pt_rms`` with ``kernel`` as its NPU implementation (registering again replaces it)."""
    return custom_op(npu_func=kernel, name="pt_rms")(reference_rms)


class RmsModel(torch.nn.Module):
    """Linear -> the custom RMSNorm -> Linear."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.up = torch.nn.Linear(256, H)
        self.gamma = torch.nn.Parameter(1 + 0.1 * torch.randn(H))
        self.down = torch.nn.Linear(H, 256)

    def forward(self, x):
        return self.down(self.op(self.up(x), self.gamma))


@pytest.fixture(scope="module")
def model_input():
    torch.manual_seed(0)
    return torch.randn(T, 256)


def _kernel(report, name="pt_rms"):
    found = [k for k in report.kernels if k.name.split(":")[0] == name]
    assert len(found) == 1, [k.name for k in report.kernels]
    return found[0]


@pytest.mark.parametrize("chip", ["Ascend910B1", "Ascend910A"])
def test_report_entry_is_the_pto_kernels_own_run(chip, model_input):
    op = register(rms_kernel_with(8))
    torch.manual_seed(1)
    model = RmsModel(op).eval()
    report = pypto_lab.optimize(model, model_input, chip=chip, level=1).report()
    k = _kernel(report)
    assert k.unit == "vector" and k.spec.kind == "pto"
    # the same kernel run by hand on that chip, fp16 at those shapes
    by_hand = rms_kernel_with(8, chip=chip)
    x = torch.randn(T, H, dtype=torch.float16)
    by_hand(x, torch.ones(H, dtype=torch.float16), torch.empty_like(x))
    assert k.time_us == pytest.approx(by_hand.last_run.time_us)
    assert k.cycles == pytest.approx(by_hand.last_run.cycles)
    assert k.gm_bytes == pytest.approx(by_hand.last_run.gm_bytes)
    assert k.reports[0].pipe_busy["VECTOR"] == pytest.approx(by_hand.last_run.pipe_busy_max_core["VECTOR"])
    # its instructions sit on the cores it ran on, numbered as the Vector kernels' (AIV 0.. on 910B)
    assert sorted(set(k.reports[0].instructions.core.tolist())) == list(range(by_hand.last_run.cores_used))
    # no kernel of the reference's ATen ops is left in the model
    assert not any("cost from its reference" in getattr(kk.spec, "op", "") for kk in report.kernels)


def test_the_chip_changes_the_kernels_time(model_input):
    op = register(rms_kernel_with(8))
    model = RmsModel(op).eval()
    times = {c: _kernel(pypto_lab.optimize(model, model_input, chip=c, level=1).report()).time_us
             for c in ("Ascend910B1", "Ascend910A")}
    assert times["Ascend910A"] > times["Ascend910B1"]  # 1000 MHz against 1850 MHz, same cycles order


def test_a_slower_kernel_makes_the_model_slower(model_input):
    torch.manual_seed(2)
    base = RmsModel(register(rms_kernel_with(8))).eval()
    fast = pypto_lab.optimize(base, model_input, chip="Ascend910B1", level=1).report()
    slow_model = RmsModel(register(rms_kernel_with(32))).eval()  # 64 rows in 2 tiles: 2 of the 48 vector cores
    slow_model.load_state_dict(base.state_dict())
    slow = pypto_lab.optimize(slow_model, model_input, chip="Ascend910B1", level=1).report()
    kf, ks = _kernel(fast), _kernel(slow)
    assert ks.time_us > kf.time_us
    assert slow.latency_us - fast.latency_us == pytest.approx(ks.time_us - kf.time_us)


def test_optimized_model_computes_with_the_kernel(model_input):
    torch.manual_seed(3)
    model = RmsModel(register(rms_kernel_with(8))).eval()
    om = pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)
    with torch.no_grad():
        ref = model(model_input)  # outside optimize: the reference on the CPU
    out = om(model_input)
    assert om.runtime.last_stats.nodes.get("pto") == 1
    assert torch.allclose(out, ref, atol=1e-2, rtol=1e-2)
    # the op's node holds exactly what the pto kernel computes from its fp16 inputs
    record = {}
    om.runtime.run((model_input,), record=record)
    x16, g16 = record["linear"].to(torch.float16), model.gamma.detach().to(torch.float16)
    by_hand = torch.empty_like(x16)
    rms_kernel_with(8)(x16, g16, by_hand)
    assert torch.equal(record["pt_rms"], by_hand.float())
    assert not torch.equal(by_hand.float(), reference_rms(x16.float(), g16.float()).half().float())


def test_a_kernel_that_raises_names_the_op(model_input):
    @pypto.frontend.jit
    def broken(x: pypto.Tensor((T, H), pypto.DT_FP16), g: pypto.Tensor((H,), pypto.DT_FP16),
               out: pypto.Tensor((T, H), pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8)  # one size for a 2-D tensor: TileRankError, as in the real framework
        out[:] = x * g
    model = RmsModel(register(broken)).eval()
    with pytest.raises(CustomOpError, match=r"custom op 'pt_rms': its npu_func broken failed on Ascend910B1 with "
                       r"arguments \[64, 512\] float16, \[512\] float16: TileRankError") as info:
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)
    assert isinstance(info.value.__cause__, pypto.TileRankError)


def test_kernel_dtype_other_than_the_reports_is_a_specific_error(model_input):
    model = RmsModel(register(rms_kernel_with(8, dtype=pypto.DT_BF16))).eval()
    with pytest.raises(CustomOpError, match=r"custom op 'pt_rms': its npu_func rms_kernel annotates argument 'x' as "
                       r"bfloat16 but precision='fp16' on Ascend910B1 holds argument 'x' in GM as float16\. Rule: .*"
                       r"Fix: annotate 'x' with pypto.DT_FP16 .*or optimize with precision='bf16'"):
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)


def test_the_kernel_runs_in_the_reports_dtype(model_input):
    model = RmsModel(register(rms_kernel_with(8, dtype=pypto.DT_BF16))).eval()
    om = pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1, precision="bf16")
    k = _kernel(om.report())
    assert k.spec.dtype == "bf16" and k.reports[0].dtype == "bf16"
    with torch.no_grad():
        assert torch.allclose(om(model_input), model(model_input), atol=5e-2, rtol=5e-2)


def test_output_shape_other_than_the_references_is_a_specific_error(model_input):
    model = RmsModel(register(rms_kernel_with(8, out_cols=256))).eval()
    with pytest.raises(CustomOpError, match=r"custom op 'pt_rms': its npu_func rms_kernel annotates output 'out' with "
                       r"shape \[64, 256\] but the reference's output has shape \[64, 512\]\. Rule: .* Fix: annotate "
                       r"\[64, 512\]"):
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)


def test_returned_output_of_the_wrong_shape_is_a_specific_error(model_input):
    @pypto.frontend.jit
    def half_rows(x, g):
        pypto.set_vec_tile_shapes(8, H)
        return (x * g)[0:32, :]
    model = RmsModel(register(half_rows)).eval()
    with pytest.raises(CustomOpError, match=r"output 0 of its npu_func half_rows has shape \[32, 512\], the "
                       r"reference's \[64, 512\]"):
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)


def test_kernel_with_the_wrong_number_of_parameters(model_input):
    @pypto.frontend.jit
    def one_arg(x):
        return x
    model = RmsModel(register(one_arg)).eval()
    with pytest.raises(CustomOpError, match=r"takes 1 parameters, the op has 2 argument\(s\) and 1 output\(s\).*"
                       r"Fix: change the kernel's parameters"):
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)


def test_pto_kernel_with_a_declared_cost_is_refused():
    with pytest.raises(CustomOpError, match=r"npu_func = rms_kernel \(a pto kernel\) with flops=.*drop flops="):
        custom_op(npu_func=rms_kernel_with(8), flops=10, name="pt_rms_bad")(reference_rms)


def test_calling_the_op_runs_the_reference():
    op = register(rms_kernel_with(8))
    x, g = torch.randn(4, H), torch.rand(H)
    assert torch.allclose(op(x, g), reference_rms(x, g))


def test_a_cube_kernel_is_a_cube_entry_and_computes_on_the_cube():
    @pypto.frontend.jit
    def mm_kernel(a: pypto.Tensor((128, 256), pypto.DT_FP16), b: pypto.Tensor((256, 128), pypto.DT_FP16),
                  out: pypto.Tensor((128, 128), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes([64, 64], [64, 64], [64, 64])
        out[:] = pypto.matmul(a, b, pypto.DT_FP16)

    @custom_op(npu_func=mm_kernel, name="pt_mm")
    def pt_mm(a, b):
        return a @ b

    class Proj(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(256, 128) / 16)

        def forward(self, x):
            return torch.relu(pt_mm(x, self.w))

    torch.manual_seed(4)
    model, x = Proj().eval(), torch.randn(128, 256)
    om = pypto_lab.optimize(model, x, chip="Ascend910B1", level=1)
    k = _kernel(om.report(), "pt_mm")
    assert k.unit == "cube" and k.resources == ("AIC",)
    with torch.no_grad():
        assert torch.allclose(om(x), model(x), atol=1e-2, rtol=1e-2)


def test_each_shape_and_chip_is_simulated_once_and_the_users_kernel_is_left_alone(model_input, monkeypatch):
    from pypto_lab.kernels import pto_bridge
    calls = []
    real_run = pto_bridge._run
    monkeypatch.setattr(pto_bridge, "_run", lambda spec, chip, args: calls.append(chip.name) or real_run(spec, chip,
                                                                                                          args))
    kernel = rms_kernel_with(4)
    model = RmsModel(register(kernel)).eval()
    for _ in range(2):
        pypto_lab.optimize(model, model_input, chip="Ascend910B1", level=1)
    pypto_lab.optimize(model, model_input, chip="Ascend910A", level=1)
    assert calls == ["Ascend910B1", "Ascend910A"]
    assert kernel.last_run is None and kernel.cache_info()["traces"] == 0
