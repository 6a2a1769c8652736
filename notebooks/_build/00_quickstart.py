"""Generator of notebooks/00_quickstart.ipynb, the page Binder opens (run it, then execute the
notebook in place).

    cd notebooks/_build && python 00_quickstart.py
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 00 · Quickstart: a matmul on a simulated Ascend AI Core

pypto_lab models an Ascend NPU — AI Cores with a **Cube** unit (matrix fractals) and a **Vector**
unit, the pipes that move data (**MTE2** GM→L1/UB, **MTE1** L1→L0A/L0B, **FixPipe** L0C→GM,
**MTE3** UB→GM) and the memory levels (GM/HBM, L2, L1, L0A/L0B/L0C, UB). Every number below
comes from the event simulator, whose constants carry their public source and are calibrated
against measured micro-benchmarks.
""")

code("""
%matplotlib inline
import pypto_lab
from pypto_lab.viz.views import plot_swimlane, plot_pipe_busy
pypto_lab.list_chips()
""")

md("""
## The chips
Each chip is a TOML preset. Peak fp16 throughput is cores × 4,096 MACs per cycle (one 16×16×16
fractal) × 2 × clock.
""")

code("""
# NBVAL_CHECK_OUTPUT
for name in pypto_lab.list_chips():
    chip = pypto_lab.get_chip(name)
    print(f"{name:12s} {chip.core_version}  {chip.cube_cores:2d} cube cores  "
          f"{chip.peak_tflops('fp16'):6.1f} TFLOPS fp16  L0C {chip.buffer('L0C').size_bytes // 1024} KB")
""")

md("""
## One matmul
A 4096³ fp16 matmul on the 910B1: the kernel's blocks are dealt to the 24 cube cores; each
core streams K panels through L1 and L0A/L0B into the Cube, and FixPipe drains L0C to GM. (The
tiling the simulator chose for it, `r.tile`, is left unprinted: exercise 1 asks you to find one.)
""")

code("""
r = pypto_lab.simulate_matmul(4096, 4096, 4096, dtype="fp16", chip="Ascend910B1")
print(f"{r.cycles:,.0f} cycles = {r.time_us:,.1f} us, {r.tflops:.1f} TFLOPS, "
      f"cube utilisation {r.cube_utilization:.0%}, {r.bound}-bound")
""")

code("""
plot_pipe_busy(r)
""")

md("""
## The pipeline of one core
With double buffering (ping-pong buffers in L1 and L0A/L0B) MTE2 loads the next K panel while the
Cube works on this one. Turn it off and the pipes take turns: the Cube idles while data arrives.
""")

code("""
small = pypto_lab.simulate_matmul(1024, 1024, 1024, chip="Ascend910B1")
plot_swimlane(small, core=0)
""")

code("""
tile = pypto_lab.CubeTile(**small.tile)
serial = pypto_lab.simulate_matmul(1024, 1024, 1024, chip="Ascend910B1", tile=tile, double_buffer=False)
print(f"double buffering: {small.cycles:,.0f} cycles; without: {serial.cycles:,.0f} cycles "
      f"({serial.cycles / small.cycles:.2f}x slower)")
plot_swimlane(serial, core=0)
""")

md("""
## A tiling that does not fit
Tile shapes follow PyPTO's `set_cube_tile_shapes([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1])`.
A 256×256 fp32 accumulator is 256 KB, but the 910B1's L0C holds 128 KB:
""")

code("""
try:
    pypto_lab.simulate_matmul(1024, 1024, 1024, chip="Ascend910B1",
                              tile=pypto_lab.CubeTile.from_pypto([256, 256], [64, 256], [256, 256]))
except pypto_lab.TilingError as err:
    print(err)
""")

md("""
## Tile it yourself
The same 1024³ matmul in the tiling explorer: every slider move re-runs the simulator. Each step
of a slider is the next tiling PyPTO accepts (sizes are multiples of 16, each `*_l1` a multiple of
its `*_l0`), so only the buffers' capacity can stop you. Try it: raise `m_l0` one step (128 → 144,
and `m_l1` follows): L0A and L0C can no longer hold two tiles, the pipes take turns and the cycles
jump; keep raising it until they overflow, and follow the fix the explorer suggests. Or double
`m_l1`: 32 blocks for 24 cores, and the second wave keeps only 8 of them busy.
""")

code("""
from pypto_lab.viz.widgets import tiling_explorer
tiling_explorer(1024, 1024, 1024, chip="Ascend910B1")
""")

md("""
## Your torch_npu script, unchanged, on the simulated card
An Ascend engineer's code says `import torch_npu`, `.npu()`, `torch.npu.synchronize()` and calls
CANN's fused operators (`torch_npu.npu_rms_norm`, `npu_swiglu`, ...). `pypto-lab run SCRIPT` runs
such a script as it is: inside that run (and only there) `torch_npu` is the workbench's stand-in,
tensors live in host memory but report `npu:0`, every operator is lowered to its CANN kernel,
costed on the chip and laid on the card's timeline under the software stack (torch_npu eager by
default: each operator's host dispatch and launch count). So the script's own timing code — NPU
events, `time.perf_counter()` around `synchronize()` — prints what the card would show.

Here is a small one: four "layers" of RMSNorm, a matmul and SwiGLU, timed with NPU events.
""")

code("""
import os
os.makedirs("../out", exist_ok=True)     # out/ is where the workbench writes (ignored by git)
""")

code("""
%%writefile ../out/npu_demo.py
import torch
import torch_npu

x = torch.randn(8, 128, 1024, dtype=torch.float16).npu()
w = torch.randn(1024, 2048, dtype=torch.float16).npu()
gamma = torch.ones(1024, dtype=torch.float16).npu()

start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
start.record()
for _ in range(4):
    h, _ = torch_npu.npu_rms_norm(x, gamma)
    x = x + torch_npu.npu_swiglu(h @ w)
end.record()
torch.npu.synchronize()
print(f"4 layers on {torch.npu.get_device_name()}: {start.elapsed_time(end):.3f} ms, x on {x.device}")
""")

md("""
`pypto-lab run` (here as `python -m pypto_lab.run`, the same command) runs it and ends with a
summary: end-to-end time, host dispatch against device time, HBM peak, and the kernels by device
time with what bounds each. It also writes what Ascend's profiler writes: a Chrome trace
(`trace_view.json`) and `kernel_details.csv`.
""")

code("""
import sys
!{sys.executable} -m pypto_lab.run --output ../out/npu_demo ../out/npu_demo.py
""")

md("""
### Reading the trace
The trace has a host row (each `aten::` / `npu::` operator's dispatch) and a card row (each kernel
after its launch). Eager torch_npu pays ~17 µs of host time per operator, so small kernels leave
the card waiting: the gaps on the card row are host time. (Open `../out/npu_demo/trace_view.json`
in https://ui.perfetto.dev to see each kernel's pipes per AI core too.)
""")

code("""
import csv, json
import matplotlib.pyplot as plt

trace = json.load(open("../out/npu_demo/trace_view.json"))
host = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
card = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
fig, ax = plt.subplots(figsize=(11, 2.2))
ax.broken_barh([(e["ts"], e["dur"]) for e in host], (1, 0.8), color="tab:gray")
ax.broken_barh([(e["ts"], max(e["dur"], 0.5)) for e in card], (0, 0.8), color="tab:orange")
ax.set_yticks([0.4, 1.4], ["card", "host"]); ax.set_xlabel("us (simulated)")
plt.show()
rows = list(csv.DictReader(open("../out/npu_demo/kernel_details.csv")))
for r in rows[:6]:
    print(f"{r['Name']:32s} {r['Accelerator Core']:15s} {float(r['Duration(us)']):8.2f} us  wait {float(r['Wait Time(us)']):6.2f} us")
""")

md("""
Same script, another software stack: with torchair's graph mode the operators are launched from
the card without a host dispatch each (`pypto-lab stacks` lists the stacks and where each number
comes from). Compare the printed time.
""")

code("""
!{sys.executable} -m pypto_lab.run --stack torchair-graph --output '' --top 3 ../out/npu_demo.py
""")


if __name__ == "__main__":
    NB.write("00_quickstart.ipynb")
