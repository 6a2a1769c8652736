"""The second seed article's deployment snippets (shared/seeds/004_*: "CANN PyPTO and 0 Day support",
§3.2 "模型获取与初步验证" and §3.3 "性能调优与批量处理"), as written, on the simulated NPU.

Run:  .venv/bin/pypto-lab run examples/seed_zero_day.py      (or python -m pypto_lab.run ...)

The snippets are Ascend code as users write it: ``import torch_npu``, ``torch.jit.load(...)``,
``model = model.npu()``, ``torch.randn(...).npu()`` and a batch loop with ``.npu()`` on every
batch. ``pypto-lab run`` gives them the ``npu`` device, so they run unchanged; the run's summary
shows what the card did (the copies of every batch, each kernel of the TorchScript model) and the
two ``# placeholder`` blocks fill what the article leaves out:

* ``ling_3_0_flash_optimized_for_ascend.pt`` is the article's stand-in for an Ascend-optimised
  Ling-3.0-flash; Ant Group's checkpoint is not something a laptop loads, so the file is a small
  decoder layer of the same kind (RMSNorm, causal attention, SwiGLU MLP) traced to TorchScript,
  saved under the article's name; ``seq_len`` and ``hidden_size`` are that layer's.
* ``dataloader = ...  # 你的数据加载器`` is a ``DataLoader`` over random sequences, and
  ``# 处理输出...`` keeps each batch's last-token argmax.

Left out, and why: §3.1 (conda, pip wheels, the CANN toolkit) is shell set-up; §3.3's "msprof" is
Ascend's profiler, whose outputs ``pypto-lab run`` writes itself (``--output``: trace_view.json,
kernel_details.csv); §3.4 (MindIE / Triton serving) is prose: ``pypto-lab serve`` simulates serving.
"""

import atexit
import os
import shutil
import tempfile

import torch

# ---- placeholder: the article's checkpoint and shapes (see the docstring) ------------------------
seq_len, hidden_size = 128, 512


class _DecoderLayer(torch.nn.Module):
    def __init__(self, h: int = hidden_size, heads: int = 8):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.qkv, self.o = torch.nn.Linear(h, 3 * h, bias=False), torch.nn.Linear(h, h, bias=False)
        self.gate_up, self.down = torch.nn.Linear(h, 4 * h, bias=False), torch.nn.Linear(2 * h, h, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


_dir = tempfile.mkdtemp(prefix="pypto_lab_seed2_")
atexit.register(shutil.rmtree, _dir, ignore_errors=True)
os.chdir(_dir)
torch.manual_seed(0)
torch.jit.trace(_DecoderLayer().eval(), torch.randn(1, seq_len, hidden_size)).save(
    "ling_3_0_flash_optimized_for_ascend.pt")

# ---- §3.2 model loading and a first single-sample check (as written) -----------------------------
import torch  # noqa: E402
import torch_npu  # 导入昇腾插件  # noqa: E402,F401

# 加载优化后的模型
model = torch.jit.load("ling_3_0_flash_optimized_for_ascend.pt")
model.eval()
model = model.npu()  # 将模型移动到 NPU 设备

# 准备符合模型要求的模拟输入数据
dummy_input = torch.randn(1, seq_len, hidden_size).npu()

# 执行推理
with torch.no_grad():
    output = model(dummy_input)
print("单次推理完成，输出形状:", output.shape)
print("3.2 output on", output.device)

# ---- §3.3 batched inference (as written; the data loader and the output handling are placeholders)
# 示例：简单的批量推理循环
batch_size = 8
dataloader = torch.utils.data.DataLoader(torch.randn(4 * batch_size, seq_len, hidden_size),  # 你的数据加载器
                                         batch_size=batch_size)
predictions = []
for batch_data in dataloader:
    batch_data = batch_data.npu()
    with torch.no_grad():
        batch_output = model(batch_data)
    # 处理输出...
    predictions.append(batch_output[:, -1].argmax(-1).cpu())
print("3.3 batches:", len(predictions), "predictions per batch:", tuple(predictions[0].shape))
print(f"3.3 HBM peak on the card: {torch.npu.max_memory_allocated() / 2**20:.1f} MiB")
