"""Speed and memory of the chip model where a user waits: the event loop, simulate_matmul end to
end (4096^3 on every chip, 8192^3, ResNet-50's convolution GEMMs), simulate_vector and
simulate_attention, ResNet-50's whole-model optimisation with no kernel costed yet, and the peak
memory of simulate_matmul at 16384^3 and 32768^3.

Run:  make bench   (or: .venv/bin/python benchmarks/bench_simulator.py [--repeats N] [--quick])
Prints Markdown tables; benchmarks/README.md holds the last results and the machine they came from.
Medians of warm runs (the numba JIT is compiled, or loaded from NUMBA_CACHE_DIR, before timing).

Instructions: a Cube kernel's per-core program depends only on its blocks, so simulate_matmul
simulates each distinct program once and replicates its timeline over the cores that run it
(`pypto_lab.hw.simulator`). "chip" counts the instructions of the whole chip's timeline (what
``len(report.instructions)`` says), "simulated" those the event loop stepped; rates are chip
instructions per second of the whole public call.

Memory: each size runs in a fresh subprocess (Linux); the figure is the growth of its peak resident
set (VmHWM, reset through /proc/self/clear_refs after import and JIT warm-up) over the resident
set just before the call.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from pypto_lab.hw import list_chips
from pypto_lab.hw.attention import simulate_attention
from pypto_lab.hw.kernels import simulate_matmul, simulate_vector
from pypto_lab.hw.simulator import _run

# ResNet-50's convolutions as implicit GEMMs at batch 24 (M = 24 * Ho * Wo, K = C_in * kh * kw, N = C_out)
RESNET_GEMMS = ((75264, 576, 64), (18816, 1152, 128), (4704, 2304, 256), (1176, 4608, 512), (75264, 64, 256))

MEMORY_PROBE = r"""
import sys, time
from pypto_lab.hw.kernels import simulate_matmul

def status_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

simulate_matmul(256, 256, 256, chip="Ascend910B1")  # warm the JIT
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current resident set
    f.write("5")
base = status_kb("VmRSS")
n = int(sys.argv[1])
t = time.perf_counter()
try:
    r = simulate_matmul(n, n, n, chip="Ascend910B1")
    simulated = getattr(r.instructions, "simulated", r.instruction_count)
    what = f"{r.instruction_count:,} chip / {simulated:,} simulated instructions"
except (ValueError, MemoryError) as exc:
    what = f"{type(exc).__name__}: {exc}"
dt = time.perf_counter() - t
print(f"{(status_kb('VmHWM') - base) / 1024:.0f}|{dt:.2f}|{what}")
"""


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def synthetic_program(n_instr: int, seed: int = 0):
    """A tile-program-like instruction stream: 24 cores x 7 pipes, 1-3 backward flags each,
    30 % of the instructions with a 300-cycle completion latency (GM transfers)."""
    rng = np.random.default_rng(seed)
    lanes = rng.integers(0, 24 * 7, n_instr).astype(np.int64)
    duration = rng.uniform(1, 500, n_instr)
    latency = np.where(rng.random(n_instr) < 0.3, 300.0, 0.0)  # GM transfers: a round-trip floor
    counts = rng.integers(1, 4, n_instr)
    counts[0] = 0
    dep_ptr = np.zeros(n_instr + 1, np.int64)
    np.cumsum(counts, out=dep_ptr[1:])
    owner = np.repeat(np.arange(n_instr), counts)
    back = rng.integers(1, 64, owner.size)
    dep_idx = np.maximum(owner - back, 0).astype(np.int64)
    return lanes, duration, latency, dep_ptr, dep_idx


def row(label: str, chip_instr, simulated, seconds: float) -> None:
    rate = f"{chip_instr / seconds / 1e6:.1f} M instr/s" if chip_instr else ""
    chip_txt = f"{chip_instr:,}" if chip_instr else ""
    sim_txt = f"{simulated:,}" if simulated else ""
    shown = f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    print(f"| {label} | {chip_txt} | {sim_txt} | {shown} | {rate} |")


def timed_call(label: str, fn, repeats: int) -> None:
    r = fn()  # warm
    t = median_time(fn, repeats)
    row(label, r.instruction_count, getattr(r.instructions, "simulated", r.instruction_count), t)


def resnet50_optimize(repeats: int) -> None:
    from pypto_lab import optimize
    from pypto_lab.capture import capture
    from pypto_lab.kernels.cost import clear_memo
    from pypto_lab.models.zoo import resnet50

    model, inputs = resnet50(batch=24)
    capture(model, inputs)
    for chip in ("Ascend910B1", "Ascend910A"):
        optimize(model, inputs, chip=chip, level=3)  # warm the JIT and the capture cache
        times = []
        for _ in range(repeats):
            clear_memo()  # no kernel of this chip costed yet
            t = time.perf_counter()
            optimize(model, inputs, chip=chip, level=3)
            times.append(time.perf_counter() - t)
        row(f"optimize(ResNet-50 batch 24, level 3) on {chip}, kernel memo cold", 0, 0, statistics.median(times))


def memory(sizes: list[int]) -> None:
    print()
    print("| simulate_matmul(n, n, n) on Ascend910B1 | peak RSS growth | time | result |")
    print("|---|---:|---:|---|")
    for n in sizes:
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n)], capture_output=True, text=True, check=True)
        mb, seconds, what = out.stdout.strip().splitlines()[-1].split("|", 2)
        print(f"| {n}^3 | {mb} MB | {seconds} s | {what} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--instructions", type=int, default=5_000_000)
    ap.add_argument("--quick", action="store_true", help="skip the whole-model optimisation")
    ap.add_argument("--memory", default="16384,32768", help="sizes n of the simulate_matmul(n, n, n) memory probes")
    args = ap.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '-')}")
    print()
    print("| measurement | instructions (chip) | simulated | median time | rate |")
    print("|---|---:|---:|---:|---:|")

    lanes, duration, latency, dep_ptr, dep_idx = synthetic_program(args.instructions)
    _run(lanes[:10], duration[:10], latency[:10], dep_ptr[:11], dep_idx[: dep_ptr[10]], 24 * 7)  # warm the JIT
    t = median_time(lambda: _run(lanes, duration, latency, dep_ptr, dep_idx, 24 * 7), args.repeats)
    row("event simulator core loop, synthetic stream", args.instructions, args.instructions, t)

    for chip in list_chips():
        timed_call(f"simulate_matmul 4096x4096x4096 fp16 on {chip}",
                   lambda c=chip: simulate_matmul(4096, 4096, 4096, chip=c), args.repeats)
    timed_call("simulate_matmul 8192x8192x8192 fp16 on Ascend910B1",
               lambda: simulate_matmul(8192, 8192, 8192, dtype="fp16", chip="Ascend910B1"), args.repeats)
    for chip in ("Ascend910B1", "Ascend910A"):
        for m, k, n in RESNET_GEMMS:
            timed_call(f"simulate_matmul {m}x{k}x{n} (ResNet-50 conv, batch 24) on {chip}",
                       lambda m=m, k=k, n=n, c=chip: simulate_matmul(m, k, n, chip=c, epilogue="bias_relu"),
                       args.repeats)
    timed_call("simulate_vector softmax 64x1024x1024 fp16 on Ascend910B1",
               lambda: simulate_vector("softmax", 64 * 1024 * 1024, chip="Ascend910B1", row_len=1024), args.repeats)
    timed_call("simulate_attention 96x512x512x64 fused on Ascend910B1",
               lambda: simulate_attention(96, 512, 512, 64, chip="Ascend910B1"), args.repeats)
    timed_call("simulate_attention 96x512x512x64 unfused on Ascend910B1",
               lambda: simulate_attention(96, 512, 512, 64, chip="Ascend910B1", fused=False), args.repeats)
    if not args.quick:
        resnet50_optimize(max(3, args.repeats // 2))
    memory([int(x) for x in args.memory.split(",") if x])


if __name__ == "__main__":
    main()
