"""`pypto-lab atc` (ONNX in, OM out) and `pypto_lab.load_om`: ATC's flags, the ONNX importer,
the OM format's round trip (outputs and report figures), and its errors."""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile

import pytest
import torch

import pypto_lab
from pypto_lab.cli import main
from pypto_lab.deploy.atc import AtcError, resolve_precision_mode, resolve_soc, run_atc
from pypto_lab.deploy.om import FORMAT_VERSION, OMError, load_om
from pypto_lab.deploy.onnx_import import OnnxImportError, import_onnx, parse_input_shape


class SmallCNN(torch.nn.Module):
    def __init__(self, softplus: bool = False):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16, 10)
        self.softplus = softplus

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        z = self.c2(y)
        if self.softplus:
            z = torch.nn.functional.softplus(z)
        y = torch.relu(z + y[:, :, ::2, ::2])
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return torch.softmax(self.fc(y), -1)


def _cnn(softplus: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    m = SmallCNN(softplus).eval()
    with torch.no_grad():
        m.b1.weight.uniform_(0.5, 1.5)
        m.b1.bias.uniform_(-0.2, 0.2)
        m.b1.running_mean.uniform_(-0.2, 0.2)
        m.b1.running_var.uniform_(0.5, 2.0)
    return m


def _export(model, x, path, dynamo: bool, **kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["input"], output_names=["probs"],
                          **kw)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """A small CNN exported with torch's default (dynamo / onnxscript) exporter, and compiled."""
    d = tmp_path_factory.mktemp("atc")
    model = _cnn()
    x = torch.randn(2, 3, 32, 32)
    onnx_path = d / "cnn.onnx"
    _export(model, x, onnx_path, dynamo=True)
    rc = main(["atc", f"--model={onnx_path}", "--framework=5", f"--output={d / 'cnn'}", "--soc_version=Ascend910"])
    assert rc == 0
    return {"dir": d, "model": model, "x": x, "onnx": onnx_path, "om": d / "cnn.om"}


def test_onnx_import_matches_torch(cnn):
    module, inputs = import_onnx(cnn["onnx"])
    assert module.input_names == ["input"] and inputs[0].shape == (2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(module(cnn["x"]), cnn["model"](cnn["x"]), rtol=1e-5, atol=1e-6)
    assert module.fallback_ops == []


def test_om_runs_like_the_optimized_model_and_reports_the_same(cnn):
    om = pypto_lab.load_om(cnn["om"])
    module, inputs = import_onnx(cnn["onnx"])
    opt = pypto_lab.optimize(module, inputs, chip="Ascend910A", level=2, precision="fp16")
    x = cnn["x"]
    torch.testing.assert_close(om(x), opt(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(om(x), cnn["model"](x), rtol=2e-2, atol=2e-3)  # fp16 numerics vs fp32 torch
    a, b = om.report(), opt.report()
    assert a.latency_us == b.latency_us
    assert len(a.kernels) == len(b.kernels)
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.to_dict() == b.to_dict()
    assert a.chip == b.chip and a.chip.name == "Ascend910A"
    m = om.manifest
    assert m["format"] == "pypto_lab-om" and m["format_version"] == FORMAT_VERSION
    assert m["inputs"] == [{"name": "input", "shape": [2, 3, 32, 32], "dtype": "float32"}]
    assert m["outputs"] == [{"name": "probs", "shape": [2, 10], "dtype": "float32"}]
    assert m["source"]["soc_version"] == "Ascend910" and m["created_by"] == "pypto-lab atc"
    assert "Ascend910A" in repr(om)


def test_om_has_no_pickle_and_loads_without_torch_load(cnn, monkeypatch):
    with zipfile.ZipFile(cnn["om"]) as z:
        names = z.namelist()
    assert set(names) == {"manifest.json", "graph.json", "kernels.json", "schedule.json", "memory.json",
                          "report.json", "weights.safetensors"}
    assert not any(n.endswith((".pkl", ".pt", ".pth", ".bin")) for n in names)

    def refuse(*a, **k):
        raise AssertionError("unpickling is not allowed")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch.export, "export", refuse)
    om = load_om(cnn["om"])
    assert om(cnn["x"]).shape == (2, 10)


def _rewrite(src, dst, manifest_edit=None, drop=None):
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    if manifest_edit:
        man = json.loads(members["manifest.json"])
        manifest_edit(man)
        members["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, data in members.items():
            if n != drop:
                z.writestr(n, data)


def test_om_errors(cnn, tmp_path):
    data = cnn["om"].read_bytes()
    cut = tmp_path / "cut.om"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(OMError, match="truncated or not a zip.*re-run pypto-lab atc"):
        load_om(cut)
    foreign = tmp_path / "foreign.om"
    with zipfile.ZipFile(foreign, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(OMError, match="without manifest.json.*foreign"):
        load_om(foreign)
    other = tmp_path / "other.om"
    _rewrite(cnn["om"], other, lambda m: m.update(format="someone-else"))
    with pytest.raises(OMError, match="format 'someone-else'.*foreign"):
        load_om(other)
    js = tmp_path / "model.json"
    js.write_text('{"format": "onnx"}')
    with pytest.raises(OMError, match="a JSON file, not an OM"):
        load_om(js)
    newer = tmp_path / "newer.om"
    _rewrite(cnn["om"], newer, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(OMError, match=rf"written by a newer pypto_lab \(format {FORMAT_VERSION + 1} > "
                                      rf"{FORMAT_VERSION}.*upgrade pypto_lab"):
        load_om(newer)
    missing = tmp_path / "missing.om"
    _rewrite(cnn["om"], missing, drop="kernels.json")
    with pytest.raises(OMError, match="has no kernels.json"):
        load_om(missing)
    with pytest.raises(OMError, match="no such file"):
        load_om(tmp_path / "nothing.om")
    with pytest.raises(OMError, match="ONNX"):
        load_om(cnn["onnx"])


def test_om_refuses_classes_outside_pypto_lab(cnn, tmp_path):
    with zipfile.ZipFile(cnn["om"]) as z:
        members = {n: z.read(n) for n in z.namelist()}
    report = json.loads(members["report.json"])
    report["passes"] = [{"$": "dc", "cls": "subprocess:Popen", "f": {"args": "true"}}]
    members["report.json"] = json.dumps(report).encode()
    man = json.loads(members["manifest.json"])
    man["members"].pop("report.json")  # so the checksum does not stop it first
    members["manifest.json"] = json.dumps(man).encode()
    bad = tmp_path / "bad.om"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    bad.write_bytes(buf.getvalue())
    with pytest.raises(OMError, match="only build pypto_lab's own data classes"):
        load_om(bad)


def test_unknown_onnx_op_is_a_cpu_fallback(tmp_path):
    model = _cnn(softplus=True)
    x = torch.randn(1, 3, 16, 16)
    path = tmp_path / "sp.onnx"
    _export(model, x, path, dynamo=False)
    module, _ = import_onnx(path)
    assert module.fallback_ops == ["Softplus"]
    result = run_atc(str(path), 5, str(tmp_path / "sp"), "Ascend910B1", precision_mode="allow_mix_precision")
    rep = result.om.report()
    assert rep.fallback_ops == ["pypto_onnx.Softplus.default"]
    opt = pypto_lab.optimize(module, (x,), chip="Ascend910B1", level=2, precision="fp16")
    torch.testing.assert_close(result.om(x), opt(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(result.om(x), model(x), rtol=2e-2, atol=2e-3)


def test_input_shape_fixes_dynamic_dims(tmp_path):
    model = _cnn()
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / "dyn.onnx"
    _export(model, x, path, dynamo=False, dynamic_axes={"input": {0: "batch"}, "probs": {0: "batch"}})
    with pytest.raises(OnnxImportError, match='dynamic dimensions.*--input_shape="input:1,3,32,32"'):
        import_onnx(path)
    result = run_atc(str(path), 5, str(tmp_path / "dyn.om"), "Ascend910A", input_shape="input:4,3,32,32")
    assert result.path.name == "dyn.om"
    assert result.om.inputs[0]["shape"] == [4, 3, 32, 32]
    assert result.om.report().batch == 4
    x4 = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(result.om(x4), model(x4), rtol=2e-2, atol=2e-3)
    assert parse_input_shape("a:1,2;b:3") == {"a": [1, 2], "b": [3]}
    with pytest.raises(OnnxImportError, match="NAME:d1,d2"):
        parse_input_shape("1,3,224,224")


def test_out_nodes_choose_the_outputs(cnn, tmp_path):
    import onnx

    proto = onnx.load(str(cnn["onnx"]))
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    result = run_atc(str(cnn["onnx"]), 5, str(tmp_path / "logits"), "Ascend910A", out_nodes=f"{gemm.name}:0")
    assert result.om.outputs[0]["shape"] == [2, 10]
    assert not any("softmax" in k.fused_ops[0] for k in result.om.report().kernels if k.fused_ops)
    with torch.no_grad():
        m = cnn["model"]
        y = torch.relu(m.b1(m.c1(cnn["x"])))
        y = torch.relu(m.c2(y) + y[:, :, ::2, ::2])
        logits = m.fc(torch.nn.functional.adaptive_avg_pool2d(torch.nn.functional.max_pool2d(y, 2), 1).flatten(1))
    torch.testing.assert_close(result.om(cnn["x"]), logits, rtol=2e-2, atol=2e-3)


def test_atc_flags(capsys, tmp_path, cnn):
    assert resolve_soc("Ascend910").name == "Ascend910A"
    assert resolve_soc("Ascend310P3").name == "Ascend310P3"
    with pytest.raises(AtcError, match="Ascend910B1"):
        resolve_soc("Ascend999")
    chip_a, chip_b = resolve_soc("Ascend910"), resolve_soc("Ascend910B1")
    assert resolve_precision_mode(None, chip_a) == "fp16"
    assert resolve_precision_mode("allow_fp32_to_fp16", chip_a) == "fp32"
    assert resolve_precision_mode("must_keep_origin_dtype", chip_b) == "fp32"
    with pytest.raises(AtcError, match="no fp32 fractal"):
        resolve_precision_mode("must_keep_origin_dtype", chip_a)
    with pytest.raises(AtcError, match="force_fp16"):
        resolve_precision_mode("fastest", chip_a)
    base = [f"--model={cnn['onnx']}", f"--output={tmp_path / 'x'}", "--soc_version=Ascend910"]
    assert main(["atc", "--framework=3", *base]) == 2
    assert "--framework=3 (TensorFlow) is not supported" in capsys.readouterr().err
    assert main(["atc", "--framework=5", *base, "--precision_mode=fastest"]) == 2
    assert "--precision_mode=fastest" in capsys.readouterr().err
    assert main(["atc", "--framework=5", f"--model={tmp_path / 'none.onnx'}", f"--output={tmp_path / 'x'}",
                 "--soc_version=Ascend910"]) == 2
    assert "no such file" in capsys.readouterr().err
    not_onnx = tmp_path / "bad.onnx"
    not_onnx.write_bytes(b"not a protobuf at all")
    assert main(["atc", "--framework=5", f"--model={not_onnx}", f"--output={tmp_path / 'x'}",
                 "--soc_version=Ascend910"]) == 2
    assert "not an ONNX model" in capsys.readouterr().err
    assert not (tmp_path / "x.om").exists()


def test_resnet18_onnx_to_om(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    path = tmp_path / "resnet18.onnx"
    _export(model, x, path, dynamo=False)
    result = run_atc(str(path), 5, str(tmp_path / "resnet18"), "Ascend910")
    om = result.om
    rep = om.report()
    assert rep.fallback_ops == [] and rep.model == "resnet18"
    assert len(rep.kernels) < 40  # Conv+BN+ReLU fused, as ATC fuses them
    with torch.no_grad():
        ref = model(x)
    out = om(x)
    assert torch.argmax(out) == torch.argmax(ref)
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("level, precision", [(0, "fp16"), (3, "fp16"), (2, "int8")])
def test_save_om_of_a_torch_model_with_attention_round_trips(tmp_path, level, precision):
    from pypto_lab.deploy import save_om

    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 16, 64)
    opt = pypto_lab.optimize(model, (x,), chip="Ascend910B1", level=level, precision=precision)
    om = load_om(save_om(opt, tmp_path / "enc.om"))
    torch.testing.assert_close(om(x), opt(x), rtol=0, atol=1e-6)
    assert om.report().to_dict() == opt.report().to_dict()


def test_atc_compiles_a_torchscript_file_like_the_eager_model(tmp_path, capsys):
    model = _cnn().eval()
    x = torch.randn(2, 3, 32, 32)
    pt = tmp_path / "cnn.pt"
    torch.jit.save(torch.jit.script(model), str(pt))
    base = ["atc", f"--model={pt}", "--framework=5", f"--output={tmp_path / 'ts'}", "--soc_version=Ascend910B1"]
    assert main(base) == 2                                   # TorchScript records no input shapes
    assert "--input_shape is required" in capsys.readouterr().err
    assert not (tmp_path / "ts.om").exists()
    assert main([*base, "--input_shape=input:2,3,32,32"]) == 0
    om = load_om(tmp_path / "ts.om")
    eager = pypto_lab.optimize(model, (x,), chip="Ascend910B1", level=2, precision="fp16")
    assert om.report().latency_us == pytest.approx(eager.report().latency_us)
    assert len(om.report().kernels) == len(eager.report().kernels)
    assert torch.equal(om(x), eager(x))
