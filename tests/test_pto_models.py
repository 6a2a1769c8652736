"""The real framework's model kernels (``models/``) run in SIM through the runner, with the NPU-only
torch API stood in by the CPU (``scripts/npu_on_cpu.py``).

The stand-in itself is tested on a model-style file written here (``import torch_npu``,
``device='npu:N'``, an NPU graph captured and replayed). The real model tests need a checkout of
the framework's repository, which is not vendored: set ``PYPTO_SRC`` to it, else they skip.
"""

from __future__ import annotations

import importlib.util
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


# ---------------------------------------------------------------------------- the real model kernels

# (file under models/, --call, --set ...): the smallest size the file's checks allow
MODELS = {
    # MoE gating: sigmoid + bias, group top-k, scatter_ mask, top-k, gather, renormalise
    "glm_select_experts": ("glm_v4_5/glm_select_experts.py", "test_select_experts", ["bs=8"]),
    # incremental flash attention over a paged KV cache (block-table entries read as scalars)
    "glm_attention": ("glm_v4_5/glm_attention.py", "test_ifa", ["b=1", "s2=512"]),
    # gate projection (check_args fixes hidden_size at 5120; only the token count shrinks)
    "glm_gate": ("glm_v4_5/glm_gate.py", "test_select_experts_mm", ["bs=32"]),
    # QAT fake quantisation, symmetric per tensor (its own pytest case has 38,344 rows: 256 here)
    "qat_per_tensor": ("qat/test_qat.py", "test_symmetric_per_tensor(256, 2048, 8, 0.0001)", []),
}
# not yet: GLM attention runs end to end (block-table reads, a trip count and valid sizes read from
# kv_act_seqs, is_loop_end on that loop), but 6 of its 1,536 bf16 outputs, all near zero, miss the
# file's atol of 1e-4 by up to 8e-5 (max |diff| 1.8e-4)
NOT_YET = {"glm_attention": "6 of 1,536 near-zero outputs beyond atol 1e-4"}


def _checkout() -> Path:
    src = os.environ.get("PYPTO_SRC")
    if not src:
        pytest.skip("set PYPTO_SRC to a checkout of the real framework's repository (hicann/pypto): "
                    "it is not vendored")
    path = Path(src)
    if not (path / "models").is_dir():
        pytest.skip(f"PYPTO_SRC={src} has no models/ folder")
    return path


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    reason=f"not yet within the file's tolerance: {NOT_YET[n]}", strict=True))
    if n in NOT_YET else n for n in MODELS])
def test_model_kernel_matches_its_torch_golden(name):
    rel, call, sets = MODELS[name]
    args = ["--npu-on-cpu", "--call", call]
    for s in sets:
        args += ["--set", s]
    p = _run(*args, _checkout() / "models" / rel)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"(\d+) comparisons? with torch: (\d+) passed", out)
    assert m, out[-4000:]
    assert int(m.group(1)) > 0 and m.group(1) == m.group(2), m.group(0)


def test_pre_quant_stops_at_its_nz_weight_check():
    """glm_attention_pre_quant (add + RMSNorm + int8 quantise + quant matmul + q/k norm + RoPE)
    requires its weight in FRACTAL_NZ; the stand-in keeps it ND and says so, so the test's input
    check fails there and not later with a wrong number."""
    p = _run("--npu-on-cpu", "--call", "test_quant_attention_pre", "--set", "hidden_size=512",
             _checkout() / "models" / "glm_v4_5" / "glm_attention_pre_quant.py")
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "FRACTAL_NZ" in out
    assert "get_format(atten_qkv_weight) == 'NZ'" in out, out[-4000:]


# ---------------------------------------------------------------------------- the models these kernels serve

@pytest.mark.parametrize("name, billions, rel, mechanism", [
    ("deepseek-v3.2", 671.0, 0.01, "mla"),     # 671 B without the multi-token-prediction layer, as deepseek-v3
    ("glm-4.5", 355.0, 0.01, "moe"),           # zai-org's model card: 355 B total
    # Qwen's model card: 80 B total; the Gated DeltaNet layers are counted as full attention here (1.2 % off)
    ("qwen3-next", 80.0, 0.02, "moe"),
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
