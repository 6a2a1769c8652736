"""The seed article's code blocks (shared/seeds/000_*: "CANN PyPTO, the bridge from PyTorch to
Ascend"), as written, on the simulated NPU: only the import is changed (``import pypto`` becomes
``import pypto_lab as pypto``, ``from pypto...`` becomes ``from pypto_lab...``) and the article's
placeholders are filled.

Run:  .venv/bin/pypto-lab run examples/seed_article.py     (or python -m pypto_lab.run ...)

``pypto-lab run`` gives the script the ``npu`` device, so the article's device lines run as it
writes them: ``model = model.to("npu")``, ``input_data.to("npu")``, ``model.npu()(input.npu())``
(the tensors live in host memory and report ``npu:0``; the run's summary at the end shows the copies
to the card and the compiled models' kernels on its timeline). Placeholders filled: the article's
``model = ...`` / ``optimizer = ...`` / ``dataset`` / ``local_rank`` / ``dummy_input`` /
"... training ..." are small real models, a synthetic image set, rank 0 and five SGD steps, so each
block runs.

Left out, and why: the ``!atc ...`` line of 7.3 is a notebook shell escape, run here as the same
command through ``pypto-lab atc`` (``pypto_lab.deploy.atc.run_atc``: same flags). Nothing else: 7.1
(HCCL: ``init_process_group(backend="hccl")`` and DDP with ``device_ids=[local_rank]``, one
simulated process), 7.3 (``torch.onnx.export`` of the optimised model) and 8.2 (``NPUDataLoader``)
run as written; the article's prose-only sections (9.1's strategies) have no code to run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch
import torchvision

import pypto_lab as pypto

OUT = tempfile.mkdtemp(prefix="pypto_lab_seed_")
atexit.register(shutil.rmtree, OUT, ignore_errors=True)
os.environ.setdefault("PYPTO_LAB_TUNING_CACHE", os.path.join(OUT, "tuning.json"))
torch.manual_seed(0)

# ---- 4.1 basic migration ---------------------------------------------------------------------
model = torchvision.models.resnet50().eval()
model = model.to("npu")
input_data = torch.randn(1, 3, 224, 224)
input_data = input_data.to("npu")
optimized_model = pypto.optimize(model)
with torch.no_grad():
    output = optimized_model(input_data)
print("4.1 optimize:", tuple(output.shape), output.device, f"simulated latency {optimized_model.report().latency_us:.1f} us on",
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
model = optimized_model
input = input_data  # noqa: A001  (the article's name)
with torch.no_grad():
    cpu_out = reference.cpu()(input.cpu())
    npu_out = model.npu()(input.npu())
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

# ---- 7.1 distributed training (HCCL) -------------------------------------------------------------
import torch.distributed as dist  # noqa: E402,F401  (the article's import)
from pypto_lab.distributed import init_process_group  # noqa: E402

local_rank = 0
init_process_group(backend="hccl")
model = torch.nn.Linear(64, 64).npu()
model = torch.nn.parallel.DistributedDataParallel(
    model, device_ids=[local_rank], broadcast_buffers=False
)
model(torch.randn(8, 64).npu()).sum().backward()
print("7.1 DDP:", type(model).__name__, "world size", pypto.distributed.get_world_size(),
      "grad on", model.module.weight.grad.device)
pypto.distributed.destroy_process_group()

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

# ---- 7.3 export and deployment -------------------------------------------------------------------
import warnings  # noqa: E402

from pypto_lab.deploy.atc import run_atc  # noqa: E402

dummy_input = torch.randn(1, 3, 224, 224)
onnx_path = os.path.join(OUT, "model.onnx")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")   # torch's notes on dynamic_axes and the legacy exporter
    torch.onnx.export(
        optimized_model,
        dummy_input,
        onnx_path,
        opset_version=11,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        dynamo=False,
    )
# !atc --model=model.onnx --framework=5 --output=model --soc_version=Ascend910
atc = run_atc(onnx_path, 5, os.path.join(OUT, "model"), "Ascend910", input_shape="input:1,3,224,224")
print("7.3 ONNX -> OM:", os.path.basename(str(atc.path)), f"{atc.om.report().latency_us:.1f} us on Ascend910")

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

# ---- 8.2 data pipeline ---------------------------------------------------------------------------
from pypto_lab.data import NPUDataLoader  # noqa: E402

dataset = torch.utils.data.TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
dataloader = NPUDataLoader(
    dataset,
    batch_size=256,
    shuffle=True,
    num_workers=8,
    pin_memory=True,
    prefetch_factor=4
)
for images, labels in dataloader:
    images, labels = images.npu(), labels.npu()
print("8.2 NPUDataLoader:", len(dataloader), "batches of", tuple(images.shape), "on", images.device)

# ---- 8.3 auto-tune -------------------------------------------------------------------------------
from pypto_lab.tuning import auto_tune  # noqa: E402

model = torchvision.models.resnet18().eval().npu()
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
