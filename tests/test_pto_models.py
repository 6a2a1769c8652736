"""The real framework's model kernels (``models/``) run in SIM through the runner, with the NPU-only
torch API stood in by the CPU (``scripts/npu_on_cpu.py``).

The stand-in itself is tested on a model-style file written here (``import torch_npu``,
``device='npu:N'``, an NPU graph captured and replayed). The real model tests need a checkout of
the framework's repository, which is not vendored: set ``PYPTO_SRC`` to it, else they skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "run_pypto_example.py"

pytest.importorskip("pypto_lab.pto", reason="pypto_lab.pto is not there yet")


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(RUNNER), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# ---------------------------------------------------------------------------- the CPU stand-in

MODEL_STYLE = textwrap.dedent('''
    import os
    import numpy as np
    from numpy.testing import assert_allclose
    import torch
    import torch_npu
    import pypto

    @pypto.jit
    def add_kernel(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = x + y

    def get_format(tensor):   # what models/*/utils/get_format.py does
        if tensor.device.type == "npu" and torch_npu.get_npu_format(tensor) == 29:
            return "NZ"
        return "ND"

    def test_add():
        bs = 1024
        device_id = int(os.environ.get("TILE_FWK_DEVICE_ID", 0))
        torch.npu.set_device(device_id)
        torch_npu.npu.config.allow_internal_format = True
        torch.manual_seed(0)
        x = torch.rand((bs, 64), dtype=torch.float32, device=f"npu:{device_id}")
        y = torch.rand((bs, 64), dtype=torch.float32).npu()
        ids = torch.rand((bs, 8), dtype=torch.int32, device=f"npu:{device_id}")
        out = torch.rand((bs, 64), dtype=torch.float32).to(f"npu:{device_id}")
        assert get_format(x) == "ND" and ids.shape == (bs, 8)
        top = torch.topk(x, 8, dim=-1, sorted=False).indices
        assert torch.equal(top, torch.topk(x, 8, dim=-1).indices), "topk(sorted=False) is not sorted"
        y = torch_npu.npu_format_cast(y, 29)
        assert get_format(y) == "NZ" and get_format(x) == "ND" and get_format(y + 1) == "ND"
        assert get_format(y.cpu()) == "ND" and torch.equal(y.cpu(), y)
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            add_kernel(x, y, out)
        g.replay()
        torch.npu.synchronize()
        assert_allclose(out.cpu().numpy(), (x + y).cpu().numpy(), rtol=1e-6, atol=1e-6)
        x.add_(1.0)
        g.replay()
        assert_allclose(out.cpu().numpy(), (x + y).cpu().numpy(), rtol=1e-6, atol=1e-6)

    def test_other():
        raise RuntimeError("--call must run only the test it names")

    if __name__ == "__main__":
        raise SystemExit("the __main__ block must not run under --call")
''')


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model_style.py"
    path.write_text(MODEL_STYLE)
    return path


def test_npu_on_cpu_runs_a_model_style_test(model_file):
    """torch_npu, torch.npu, device='npu:N', .npu(), an integer torch.rand, topk(sorted=False) and an
    NPU graph stand in on the CPU; the chosen test runs at the size --set gives; both golden
    comparisons are recorded."""
    p = _run("--npu-on-cpu", "--call", "test_add", "--set", "bs=16", model_file)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "--set bs: line" in out and "1024 -> 16" in out
    assert "2 comparisons with torch: 2 passed" in out
    # the NZ cast is costed as a TransData, and a second replay re-runs the captured kernel for real:
    # the second comparison (after x changed) can only pass if the kernel ran again
    assert "FRACTAL_NZ" in out and "TransData" in out
    assert "manual_seed_all" not in out
    assert "replay() #2: re-running the 1 pypto kernel launch" in out


def test_without_the_stand_in_the_runner_names_the_flag(model_file):
    p = _run("--call", "test_add", model_file)
    assert p.returncode != 0
    assert "needs torch_npu" in p.stdout and "--npu-on-cpu" in p.stdout


def test_set_of_an_unknown_name_is_an_error(model_file):
    p = _run("--npu-on-cpu", "--call", "test_add", "--set", "batch=16", model_file)
    assert p.returncode == 2
    assert "--set batch" in p.stdout


def _shim():
    spec = importlib.util.spec_from_file_location("npu_on_cpu", ROOT / "scripts" / "npu_on_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quantize_reference_rounds_half_to_even_and_saturates():
    shim = _shim()
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, 300.0, -300.0]], dtype=torch.bfloat16)
    one = torch.ones(6, dtype=torch.bfloat16)
    q = shim.npu_quantize(x, one, torch.zeros(6, dtype=torch.bfloat16), torch.qint8, -1, False)
    assert q.dtype == torch.int8
    assert q.tolist() == [[0, 2, 2, 0, 127, -128]]
    half = torch.full((6,), 2.0, dtype=torch.bfloat16)
    assert shim.npu_quantize(x, half, None, torch.qint8, -1, True).tolist() == [[0, 1, 1, 0, 127, -128]]


def test_quant_matmul_reference_is_exact_in_the_integer_product():
    shim = _shim()
    a = torch.full((2, 512), 127, dtype=torch.int8)
    b = torch.full((512, 3), -128, dtype=torch.int8)
    bias = torch.tensor([1, 2, 3], dtype=torch.int32)
    scale = torch.tensor([1.0, 0.5, 2.0 ** -10], dtype=torch.float32)
    y = shim.npu_quant_matmul(a, b, scale, bias=bias, output_dtype=torch.float32)
    acc = 127 * -128 * 512
    assert y[0].tolist() == [acc + 1, (acc + 2) * 0.5, (acc + 3) * 2.0 ** -10]


# ---------------------------------------------------------------------------- the manifest runner

MODELS_RUNNER = ROOT / "scripts" / "run_pypto_models.py"


def _models(*args, timeout=900):
    return subprocess.run([sys.executable, str(MODELS_RUNNER), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _runner_module():
    spec = importlib.util.spec_from_file_location("run_pypto_models", MODELS_RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BAD_MODEL = textwrap.dedent('''
    import torch
    import torch_npu
    import pypto

    @pypto.jit
    def scale_kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = x * 2.0

    def test_scale_wrong_golden():
        bs = 64
        x = torch.rand((bs, 64), dtype=torch.float32, device="npu:0")
        out = torch.empty((bs, 64), dtype=torch.float32, device="npu:0")
        scale_kernel(x, out)
        torch.testing.assert_close(out.cpu(), (x * 2.0 + 0.5).cpu(), rtol=1e-3, atol=1e-3)
''')


def test_models_runner_reports_each_entry_and_fails_on_one_bad(tmp_path):
    """The manifest runner on a made-up checkout: one entry passes its golden, one misses it by 0.5;
    the table and the JSON say which, with the comparisons and the max |diff|, and the exit is 1."""
    (tmp_path / "src" / "models" / "toy").mkdir(parents=True)
    (tmp_path / "src" / "models" / "toy" / "good.py").write_text(MODEL_STYLE)
    (tmp_path / "src" / "models" / "toy" / "bad.py").write_text(BAD_MODEL)
    manifest = tmp_path / "m.toml"
    manifest.write_text(textwrap.dedent('''
        [[test]]
        file = "toy/good.py"
        test = "test_add"
        set = ["bs=16"]
        real = "bs 1024"

        [[test]]
        file = "toy/bad.py"
        test = "test_scale_wrong_golden"
        set = ["bs=8"]

        [[left_out]]
        file = "toy/good.py"
        test = "test_other"
        reason = "raises on purpose"
    '''))
    out_json = tmp_path / "r.json"
    p = _models(tmp_path / "src", "--manifest", manifest, "--json", out_json)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    rows = json.loads(out_json.read_text())
    assert [r["test"] for r in rows] == ["test_add", "test_scale_wrong_golden"]
    good, bad = rows
    for r in rows:
        assert {"file", "test", "passed", "comparisons", "max_abs_diff"} <= set(r)
    assert good["passed"] and good["comparisons"] == 2 and good["max_abs_diff"] < 1e-5 and good["sim_us"] > 0
    assert not bad["passed"] and bad["verdict"] == "FAIL" and bad["comparisons"] == 1
    assert bad["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert "| toy/good.py | test_add | bs=16 | 2/2 |" in out and good["cpu_s"] > 0
    assert "1 of 2 tests run pass; 1 of 2 files have at least one test passing" in out
    assert "toy/good.py::test_other: raises on purpose" in out


@pytest.mark.parametrize("text, rule", [
    ('[[test]]\nfile = "a.py"\ntest = "t"\nsize = ["b=1"]\n', "unknown keys ['size']"),
    ('[[test]]\nfile = "a.py"\ntest = "t"\n[[test]]\nfile = "a.py"\ntest = "t"\n', "listed twice"),
    ('[[left_out]]\nfile = "a.py"\ntest = "t"\n', "has no 'reason'"),
    ('[[test]]\nfile = "a.py"\ntest = "t"\nset = ["b 1"]\n', "is not NAME=VALUE"),
])
def test_manifest_breaking_a_rule_is_named(tmp_path, text, rule):
    path = tmp_path / "m.toml"
    path.write_text(text)
    runner = _runner_module()
    with pytest.raises(runner.ManifestError, match=re.escape(rule)):
        runner.load_manifest(path)
    (tmp_path / "models").mkdir()
    p = _models(tmp_path, "--manifest", path)
    assert p.returncode == 2 and rule in p.stdout


def test_models_runner_without_a_checkout_names_the_fix(tmp_path):
    p = _models(tmp_path)
    assert p.returncode == 2 and "no models/ folder" in p.stdout and "git clone" in p.stdout


def test_the_manifest_covers_every_test_file_and_keeps_its_rules():
    """Every entry names its file and test; every left-out test says why with a number; at least 22
    files have a test the lab runs."""
    runner = _runner_module()
    tests, left = runner.load_manifest(runner.MANIFEST)
    run_files = {e["file"] for e in tests}
    assert len(run_files) >= 22
    assert any(e.get("fast") for e in tests)
    for e in left:
        assert re.search(r"\d", e["reason"]), f"{e['test']}: a left-out reason carries its failing number"
    for e in tests:
        for s in e.get("set", []):   # a reduction never sets a tolerance, a dtype or a tile shape
            name = re.match(r"\s*(\w+)", s).group(1).lower()
            assert name not in ("atol", "rtol") and "dtype" not in name and "tile" not in name, f"{e['test']}: {s}"


# ---------------------------------------------------------------------------- the real model kernels

def _checkout() -> Path:
    src = os.environ.get("PYPTO_SRC")
    if not src:
        pytest.skip("set PYPTO_SRC to a checkout of the real framework's repository (hicann/pypto): "
                    "it is not vendored")
    path = Path(src)
    if not (path / "models").is_dir():
        pytest.skip(f"PYPTO_SRC={src} has no models/ folder")
    return path


def test_manifest_files_exist_in_the_checkout():
    src = _checkout()
    runner = _runner_module()
    tests, left = runner.load_manifest(runner.MANIFEST)
    missing = sorted({e["file"] for e in tests + left if not (src / "models" / e["file"]).is_file()})
    assert not missing, f"manifest files not in {src}/models: {missing}"
    ours = {e["file"] for e in tests + left}
    theirs = {str(p.relative_to(src / "models")) for p in (src / "models").rglob("*.py")
              if (p.name.startswith("test_") or "def test_" in p.read_text(errors="replace"))
              and "/utils/" not in str(p) and "/impl/" not in str(p)}
    assert not theirs - ours, f"test files the manifest does not mention: {sorted(theirs - ours)}"


def test_the_fast_subset_of_the_manifest_passes(tmp_path):
    """The manifest's `fast` tests, each against its own golden at its own tolerance."""
    out_json = tmp_path / "fast.json"
    p = _models(_checkout(), "--fast", "--jobs", "1", "--json", out_json)
    out = p.stdout + p.stderr
    rows = json.loads(out_json.read_text())
    assert rows and p.returncode == 0, out[-6000:]
    assert all(r["passed"] and r["comparisons"] > 0 for r in rows)


# ---------------------------------------------------------------------------- the models these kernels serve

@pytest.mark.parametrize("name, billions, rel, mechanism", [
    ("deepseek-v3.2", 671.0, 0.01, "mla"),     # 671 B without the multi-token-prediction layer, as deepseek-v3
    ("glm-4.5", 355.0, 0.01, "moe"),           # zai-org's model card: 355 B total
    # Qwen's model card: 80 B total (36 Gated DeltaNet layers, 12 gated full-attention layers: 79.7 B here)
    ("qwen3-next", 80.0, 0.01, "moe"),
])
def test_the_three_day0_models_are_known_from_their_config_json(name, billions, rel, mechanism):
    from pypto_lab.llm.configs import KNOWN_MODELS, spec_of

    spec = spec_of(name)
    assert spec.weight_params() / 1e9 == pytest.approx(billions, rel=rel)
    assert KNOWN_MODELS[name]["_source"].startswith("https://huggingface.co/")
    assert spec.is_moe and (spec.is_mla if mechanism == "mla" else not spec.is_mla)
    if name == "deepseek-v3.2":
        assert spec.extra == {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
    if name == "qwen3-next":
        assert spec.extra["full_attention_interval"] == 4 and spec.experts == 512 and spec.top_k == 10
    if name == "glm-4.5":
        assert (spec.experts, spec.top_k, spec.dense_layers, spec.qk_norm, spec.rotary_fraction) == (160, 8, 3, True, 0.5)


def test_the_stand_in_keeps_the_clamp_gradient_of_the_torch_the_files_pin():
    """torch 2.14 gives clamp a zero gradient at its bounds (pytorch#195931); the framework pins torch
    2.8, where it is 1, and the QAT backward goldens differentiate exactly there. In a process of its
    own: installing the stand-in names torch's PrivateUse1 backend ``npu``, which lasts for the
    process (torch allows one name), and must not leak into other tests."""
    code = f"""
import importlib.util, torch
spec = importlib.util.spec_from_file_location("npu_on_cpu", {str(ROOT / "scripts" / "npu_on_cpu.py")!r})
shim = importlib.util.module_from_spec(spec); spec.loader.exec_module(shim)
stand_in = shim.NpuOnCpu().install()
try:
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], requires_grad=True)
    torch.clamp(x, -1.0, 1.0).sum().backward()
    y = torch.tensor([0.5, 3.0], requires_grad=True)
    (y.clamp(max=3.0) * 2).sum().backward()
    print(x.grad.tolist(), y.grad.tolist())
finally:
    stand_in.uninstall()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[0.0, 1.0, 1.0, 1.0, 0.0] [2.0, 2.0]"
