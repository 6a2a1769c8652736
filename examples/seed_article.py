"""The seed article's code blocks (shared/seeds/000_*: "CANN PyPTO, the bridge from PyTorch to
Ascend"), run on the simulated NPU with only the import changed: ``import pypto`` becomes
``import pypto_lab as pypto`` (and ``from pypto...`` becomes ``from pypto_lab...``).

Run:  .venv/bin/python examples/seed_article.py

Lines that need a real NPU are the only other changes, each marked ``# no NPU here``:
``model.to(npu)`` / ``.npu()`` (the model stays on the CPU; pypto_lab simulates the NPU and
computes the outputs with its numerics). Blocks left out, and why: HCCL distributed training
(one simulated chip, no collectives), ``pypto.data.NPUDataLoader`` (no host-device pipeline is
modelled), ONNX export + ``atc`` (a CANN tool). Placeholders in the article ("model = ...",
"... training ...") are filled with small real models so each block runs.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torchvision

import pypto_lab as pypto

OUT = tempfile.mkdtemp(prefix="pypto_lab_seed_")
os.environ.setdefault("PYPTO_LAB_TUNING_CACHE", os.path.join(OUT, "tuning.json"))
torch.manual_seed(0)

# ---- 4.1 basic migration ---------------------------------------------------------------------
model = torchvision.models.resnet50().eval()
# model = model.to(npu)                       # no NPU here
input_data = torch.randn(1, 3, 224, 224)
# input_data = input_data.to(npu)             # no NPU here
optimized_model = pypto.optimize(model)
with torch.no_grad():
    output = optimized_model(input_data)
print("4.1 optimize:", tuple(output.shape), f"simulated latency {optimized_model.report().latency_us:.1f} us on",
      optimized_model.report().chip)

# ---- 4.2 mixed precision (the article's "model = ...; optimizer = ...") ------------------------
from pypto_lab import amp  # noqa: E402


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        self.target = torch.linspace(-1, 1, 16).unsqueeze(1)

    def forward(self, x):
        return torch.nn.functional.mse_loss(self.net(x).float(), self.target)


amp_model = Regressor()
optimizer = torch.optim.SGD(amp_model.parameters(), lr=0.05)
input = torch.randn(16, 32)  # noqa: A001  (the article's name)
amp_model, optimizer = amp.initialize(amp_model, optimizer, opt_level="O2")
with amp.autocast():
    loss = amp_model(input)
loss.backward()
optimizer.step()
print(f"4.2 amp O2: loss {loss.item():.4f}, master weights {next(iter(optimizer.master_params())).dtype}"
      if hasattr(optimizer, "master_params") else f"4.2 amp O2: loss {loss.item():.4f}")

# ---- 4.2 custom operator -----------------------------------------------------------------------
from pypto_lab import custom_op  # noqa: E402

custom_op_impl = """
#include "tbe/te_operation.h"
using namespace tbe;
TE_IMPLEMET(my_custom_op) {
  // NPU side implementation
}
"""


@custom_op(npu_func=custom_op_impl)
def my_custom_op(input):
    return input * 2


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.relu(my_custom_op(x))


custom = pypto.optimize(UsesCustomOp(), torch.randn(64, 1024), chip="Ascend910B1")
print("4.2 custom_op:", [k.name for k in custom.report().kernels], "fallbacks:", custom.report().fallback_ops)

# ---- 4.2 memory ----------------------------------------------------------------------------------
pypto.enable_memory_pool()
pypto.set_memory_allocator("unified")
pooled = pypto.optimize(model, input_data).report()
print(f"4.2 memory pool: peak GM {pooled.peak_memory_bytes / 1e6:.1f} MB")

# ---- 5.1 profiler (the article profiles the model it optimised) -------------------------------
from pypto_lab import profiler  # noqa: E402

model = optimized_model
with profiler.profile(activities=[
        profiler.ProfilerActivity.CPU,
        profiler.ProfilerActivity.NPU
]) as prof:
    model(input_data)
print(prof.key_averages().table(sort_by="npu_time_total", row_limit=8))

# ---- 5.3 precision check -------------------------------------------------------------------------
reference = torchvision.models.resnet50().eval()
reference.load_state_dict(optimized_model.model.state_dict())
with torch.no_grad():
    cpu_out = reference.cpu()(input_data.cpu())
    npu_out = optimized_model(input_data)          # no NPU here: model.npu()(input.npu()) is the simulated run
diff = torch.max(torch.abs(cpu_out - npu_out.cpu()))
print(f"5.3 max difference: {diff.item()}")

# ---- 6.2 FusedBERTLayer --------------------------------------------------------------------------
from pypto_lab.nn import FusedBERTLayer  # noqa: E402

bert_layer = FusedBERTLayer(
    hidden_size=768,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    npu_optimized=True
)
layer_report = pypto.optimize(bert_layer.eval(), torch.randn(1, 128, 768), chip="Ascend910B1").report()
print("6.2 FusedBERTLayer:", len(layer_report.kernels), "kernels,", f"{layer_report.latency_us:.1f} us")

# ---- 7.2 quantisation ----------------------------------------------------------------------------
from pypto_lab.quantization import quantize_dynamic  # noqa: E402

model = torchvision.models.resnet50().eval()
quantized_model = quantize_dynamic(
    model, {torch.nn.Linear}, dtype=torch.qint8
)
from pypto_lab.quantization import convert, prepare_qat  # noqa: E402

mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model = prepare_qat(mlp)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):  # ... training ...
    opt.zero_grad()
    model(torch.randn(8, 32)).pow(2).mean().backward()
    opt.step()
model = convert(model)
print("7.2 quantization:", type(quantized_model.fc).__name__, type(model[0]).__name__)

# ---- 8.1 optimisation options --------------------------------------------------------------------
pypto.set_optimization_options({
    "graph_optimization_level": 3,
    "memory_optimization": True,
    "computation_optimization": True,
    "communication_optimization": True,
    "auto_mixed_precision": True
})
level3 = pypto.optimize(torchvision.models.resnet50().eval(), input_data).report()
print(f"8.1 level {level3.level}: {level3.latency_us:.1f} us")

# ---- 8.3 auto-tune -------------------------------------------------------------------------------
from pypto_lab.tuning import auto_tune  # noqa: E402

model = torchvision.models.resnet18().eval()
pypto.optimize(model, input_data)
result = auto_tune(
    model,
    tune_config={
        "level": "exhaustive",
        "num_trials": 1000,
        "early_stop": True
    }
)
print(result.table() if hasattr(result, "table") else result)

# ---- 9.2 compare_tensors -------------------------------------------------------------------------
from pypto_lab.debug import compare_tensors  # noqa: E402

cpu_tensor, npu_tensor = cpu_out, npu_out
diff_report = compare_tensors(
    cpu_tensor, npu_tensor,
    rtol=1e-3, atol=1e-5,
    verbose=True
)

# ---- 9.3 advanced profiler -----------------------------------------------------------------------
from pypto_lab.profiler import AdvancedProfiler  # noqa: E402

model = optimized_model
profiler = AdvancedProfiler(
    activities=[
        profiler.ProfilerActivity.CPU,
        profiler.ProfilerActivity.NPU
    ],
    record_shapes=True,
    profile_memory=True,
    with_stack=True
)
with profiler:
    model(input_data)
profiler.export_chrome_trace(os.path.join(OUT, "trace.json"))
print("9.3 trace written to", os.path.join(OUT, "trace.json"))

from pypto_lab.passes.options import OPTION_DEFAULTS  # noqa: E402  (not the article's: leave the defaults as found)

pypto.set_optimization_options(dict(OPTION_DEFAULTS))
pypto.disable_memory_pool()
