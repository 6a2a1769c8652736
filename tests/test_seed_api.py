"""The seed article's API as its code blocks use it: optimize(model) without inputs, auto_tune(model),
and the whole article script in examples/ (run as a user would)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import pypto_lab
from pypto_lab import OptimizeError
from pypto_lab.tools.tuning import TuneError, auto_tune

ROOT = Path(__file__).resolve().parents[1]


def test_optimize_without_inputs_captures_on_the_first_call():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    om = pypto_lab.optimize(model, chip="Ascend910B1", level=1, precision="fp32")
    with pytest.raises(OptimizeError, match="optimised without example inputs.*call it once"):
        om.report()
    x = torch.randn(4, 64)
    out = om(x)
    assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)
    rep = om.report()
    assert rep.batch == 4 and rep.chip.name == "Ascend910B1" and rep.level == 1 and len(rep.kernels) == 2
    with pytest.raises(OptimizeError, match="level 9 is not known"):
        pypto_lab.optimize(model, level=9)


def test_auto_tune_accepts_the_model_it_was_optimised_from(tmp_path):
    model = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 256)).eval()
    with pytest.raises(TuneError, match="has not been optimised"):
        auto_tune(model, tune_config={"level": "fast", "progress": False}, cache_path=False)
    om = pypto_lab.optimize(model, torch.randn(256, 512), chip="Ascend910B1", level=1)
    before = om.report().latency_us
    result = auto_tune(model, tune_config={"level": "fast", "progress": False}, cache_path=tmp_path / "t.json")
    assert om.report().latency_us <= before + 1e-9 and len(result.rows) == 2


def test_the_seed_article_script_runs_with_only_the_import_changed(tmp_path):
    """Through ``pypto-lab run``, its ``.to("npu")`` / ``.npu()`` lines as the article writes them."""
    env = dict(os.environ, PYPTO_LAB_TUNING_CACHE=str(tmp_path / "tuning.json"), MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "pypto_lab.run", "--output", str(tmp_path / "run"),
                          str(ROOT / "examples" / "seed_article.py")], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for marker in ("4.1 optimize: (1, 1000) npu:0", "4.2 amp O2", "4.2 custom_op", "fallbacks: []", "4.2 memory pool",
                   "Self NPU time total", "Conv2D", "5.3 max difference", "6.2 FusedBERTLayer: 9 kernels",
                   "7.1 DDP: DistributedDataParallel world size 1 grad on npu:0", "7.2 quantization: QuantizedLinear",
                   "7.3 ONNX -> OM: model.om", "8.1 level 3", "8.2 NPUDataLoader: 2 batches of (256, 3, 32, 32) on npu:0",
                   "auto_tune (exhaustive)", "max abs error", "9.3 trace written",
                   "pypto-lab run: seed_article.py", "MemcpyH2D", "optimized:ResNet"):
        assert marker in out, marker
    source = (ROOT / "examples" / "seed_article.py").read_text()
    assert "import pypto\n" not in source and "import pypto_lab as pypto" in source
    for line in ('model = model.to("npu")', 'input_data = input_data.to("npu")', "npu_out = model.npu()(input.npu())"):
        assert line in source, line
    assert "# no NPU here" not in source


def test_an_optimised_model_that_nobody_holds_is_freed_with_its_weights():
    """optimize() remembers its result for auto_tune(model), but not for ever: once the caller drops
    the model and the result and more than KEEP_LATEST other models were optimised, both are
    collected (a long sweep or `pypto-lab validate` does not keep every model's weights alive)."""
    import gc
    import weakref

    from pypto_lab.compiler.optimize import KEEP_LATEST

    model = nn.Sequential(nn.Linear(64, 64)).eval()
    gone = weakref.ref(model)
    pypto_lab.optimize(model, torch.randn(8, 64), chip="Ascend910B1", level=1)
    del model
    for _ in range(KEEP_LATEST):
        pypto_lab.optimize(nn.Sequential(nn.Linear(8, 8)).eval(), torch.randn(2, 8), chip="Ascend910B1", level=1)
    gc.collect()
    assert gone() is None
