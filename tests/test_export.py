"""The seed's deployment steps: an OptimizedModel exported with torch.onnx.export (its float
graph, dynamic batch), and TorchScript models (ScriptModules, torch.jit.save files) optimised."""

import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from pypto_lab import OptimizedModel, OptimizeError, optimize
from pypto_lab.capture.torchscript import TorchScriptError

onnx = pytest.importorskip("onnx")

CHIP = "Ascend910B1"


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 5)).eval()


def _scaled_error(out, ref):
    return float((out - ref).abs().max() / ref.abs().max())


def _seed_export(optimized_model, dummy_input, **kwargs):
    """The seed's call, word for word (in the current folder), plus the exporter choice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notes on dynamic_axes and the legacy exporter
        torch.onnx.export(optimized_model, dummy_input, "model.onnx", opset_version=11, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}}, **kwargs)
    model = onnx.load("model.onnx")
    onnx.checker.check_model(model)
    return model


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _check_onnx_numerics(model, proto, batch=3):
    """Run the file at another batch size with onnxruntime when it is installed (not a dependency)."""
    ort = pytest.importorskip("onnxruntime")
    x = torch.randn(batch, 3, 16, 16)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(["output"], {"input": x.numpy()})
    assert out.shape == (batch, 5)
    assert torch.allclose(torch.from_numpy(out), model(x), atol=1e-5)


# ---- OptimizedModel is an nn.Module ----------------------------------------------------------------

def test_optimized_model_is_a_module_whose_state_dict_is_the_wrapped_models():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    om = optimize(model, x, chip=CHIP, level=2)
    assert isinstance(om, nn.Module) and isinstance(om, OptimizedModel)
    assert list(om.state_dict()) == [f"model.{k}" for k in model.state_dict()]
    assert all(torch.equal(om.state_dict()[f"model.{k}"], v) for k, v in model.state_dict().items())
    assert [n for n, _ in om.named_children()] == ["model"]   # graph, report, runtime hold no parameters
    assert om.training is False and om.chip.name == CHIP and om.report().level == 2
    # load_state_dict writes the wrapped model's weights, and the runtime reads them live
    before = om(x)
    state = {k: (v * 2 if k.endswith("5.weight") else v) for k, v in om.state_dict().items()}
    om.load_state_dict(state)
    assert torch.equal(model[5].weight, state["model.5.weight"])
    assert not torch.equal(om(x), before)


def test_calls_still_run_the_npu_numerics_and_keep_their_bookkeeping():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    om = optimize(model, x, chip=CHIP, level=1, precision="fp16")
    out = om(x)
    assert om.last_cpu_us > 0 and om.runtime.last_stats is not None
    assert not torch.equal(out, model(x)) and _scaled_error(out, model(x)) <= 1e-2  # fp16 rounding shows
    lazy = optimize(model, chip=CHIP, level=1, precision="fp16")  # the seed's optimize(model): deferred
    with pytest.raises(OptimizeError, match="optimised without example inputs"):
        lazy.report()
    assert torch.equal(lazy(x), out) and lazy.report().latency_us == om.report().latency_us


# ---- torch.onnx.export, as the seed writes it -------------------------------------------------------

def test_seed_onnx_export_with_the_default_exporter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    om = optimize(model, x, chip=CHIP, level=2, precision="fp16")
    proto = _seed_export(om, x)
    assert [i.name for i in proto.graph.input] == ["input"] and [o.name for o in proto.graph.output] == ["output"]
    assert _dims(proto.graph.input[0]) == ["batch_size", 3, 16, 16]
    assert _dims(proto.graph.output[0]) == ["batch_size", 5]
    # the float model's graph (what ATC compiles), with its weights: no simulator in it
    assert {"Conv", "Gemm"} <= {n.op_type for n in proto.graph.node}
    # torch's dynamo exporter has no opset-11 implementations: it raises the opset to 18 (and warns)
    assert next(o.version for o in proto.opset_import if o.domain == "") >= 18
    _check_onnx_numerics(model, proto)
    # exporting changed nothing: the model still runs with the NPU's numerics
    assert torch.equal(om(x), optimize(model, x, chip=CHIP, level=2, precision="fp16")(x))


def test_seed_onnx_export_with_the_torchscript_exporter_keeps_opset_11(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    proto = _seed_export(optimize(model, x, chip=CHIP, level=2), x, dynamo=False)
    assert next(o.version for o in proto.opset_import if o.domain == "") == 11
    assert _dims(proto.graph.input[0])[0] == "batch_size" and _dims(proto.graph.output[0])[0] == "batch_size"
    _check_onnx_numerics(model, proto)


def test_torch_export_and_jit_trace_see_the_float_model():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    om = optimize(model, x, chip=CHIP, level=1, precision="fp16")
    other = torch.randn(2, 3, 16, 16)
    program = torch.export.export(om, (x,))
    assert torch.equal(program.module()(other), model(other))
    assert all(s.target.startswith("model.") for s in program.graph_signature.input_specs if s.target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(om, x)
    assert torch.equal(traced(other), model(other))


# ---- TorchScript input ------------------------------------------------------------------------------

def _same_report(a, b):
    ra, rb = a.report(), b.report()
    assert len(ra.kernels) == len(rb.kernels)
    assert [type(k.spec).__name__ for k in ra.kernels] == [type(k.spec).__name__ for k in rb.kernels]
    assert ra.latency_us == pytest.approx(rb.latency_us, rel=1e-12)


@pytest.mark.parametrize("make", ["script", "trace"])
def test_scripted_and_traced_cnn_optimise_as_the_eager_model(make, tmp_path):
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script/trace are deprecated in torch 2.x
        ts = torch.jit.script(model) if make == "script" else torch.jit.trace(model, x)
    eager = optimize(model, x, chip=CHIP, level=2, precision="fp16")
    om = optimize(ts, x, chip=CHIP, level=2, precision="fp16")
    _same_report(om, eager)
    assert om.model is ts
    assert torch.equal(om(x), eager(x))                  # the same program, the same numerics
    assert _scaled_error(om(x), model(x)) <= 1e-2
    # the seed loads the model with torch.jit.load: a saved file, given as a path (str or Path)
    path = tmp_path / "model.pt"
    torch.jit.save(ts, str(path))
    for given in (str(path), path):
        loaded = optimize(given, x, chip=CHIP, level=2, precision="fp16")
        assert isinstance(loaded.model, torch.jit.ScriptModule)
        _same_report(loaded, eager)
        assert torch.equal(loaded(x), eager(x))


def test_optimised_script_module_exports_to_onnx(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        om = optimize(torch.jit.script(model), x, chip=CHIP, level=2)
    for kwargs in ({}, {"dynamo": False}):
        proto = _seed_export(om, x, **kwargs)
        assert _dims(proto.graph.input[0])[0] == "batch_size"
        _check_onnx_numerics(model, proto)


def test_scripted_resnet18_optimises_as_the_eager_model():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        script = torch.jit.script(model)
    eager = optimize(model, x, chip=CHIP, level=2, precision="fp16")
    om = optimize(script, x, chip=CHIP, level=2, precision="fp16")
    _same_report(om, eager)
    out = om(x)
    assert torch.equal(out, eager(x))
    assert _scaled_error(out, model(x)) <= 1e-2   # the bound test_runtime sets for fp16 ResNet-50


# ---- what cannot be optimised, and the fix -----------------------------------------------------------

def test_a_path_must_be_a_torchscript_file(tmp_path):
    x = torch.randn(2, 3, 16, 16)
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(TorchScriptError, match=r"must be a TorchScript file.*nowhere\.pt.*no such file.*Fix: pass"):
        optimize(missing, x)
    pickled = tmp_path / "weights.pt"
    torch.save(_cnn().state_dict(), pickled)   # torch.save, not torch.jit.save
    with pytest.raises(TorchScriptError, match=r"weights\.pt' is not one .*Fix: .*torch\.load.*torch\.jit\.save"):
        optimize(str(pickled), x)
    with pytest.raises(TorchScriptError, match="a folder"):
        optimize(tmp_path, x)
    with pytest.raises(OptimizeError, match="needs a torch.nn.Module, a ScriptModule or the path .* got int"):
        optimize(3, x)


class _Branchy(nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):
            return x * 2
        return x - 1


class _Loopy(nn.Module):
    def forward(self, x):
        i = 0
        while bool(x.sum() < 100.0) and i < 10:
            x = x + 1
            i += 1
        return x


def test_script_modules_that_do_not_convert_say_why_and_what_to_do():
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        branchy, loopy = torch.jit.script(_Branchy()), torch.jit.script(_Loopy())
    with pytest.raises(TorchScriptError, match=r"data-dependent control flow.*torch\.cond.*Fix: torch\.jit\.trace"):
        optimize(branchy, x)
    with pytest.raises(TorchScriptError, match=r"TS2EPConverter.*could not convert _Loopy.*prim::Loop.*Fix: pass "
                                               r"the eager nn\.Module"):
        optimize(loopy, x)
    # the trace of the same model records the branch its inputs take, and optimises
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_Branchy(), x.abs())
    om = optimize(traced, x.abs(), chip=CHIP, level=1, precision="fp32")
    assert torch.equal(om(x.abs()), x.abs() * 2)


def test_exporting_a_script_module_optimised_without_inputs_asks_for_a_call_first():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = optimize(torch.jit.script(model), chip=CHIP)
    with pytest.raises(OptimizeError, match=r"not captured yet.*Fix: call it once on real inputs"):
        torch.export.export(lazy, (x,))
    lazy(x)
    assert torch.equal(torch.export.export(lazy, (x,)).module()(x), model(x))


def test_readme_shows_the_seed_export_call():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "## Export to ONNX" in readme or "### Export to ONNX" in readme
    assert 'dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}}' in readme
