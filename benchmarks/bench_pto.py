"""Speed and figures of pypto_lab.pto (PyPTO in SIM mode): trace + compile of the softmax kernel
over (32, 32, 1, 256) fp16, warm, and the simulated cycles of a few tilings.

Run:  .venv/bin/python benchmarks/bench_pto.py [--repeats N]
Prints a Markdown table (benchmarks/README.md holds the last results). "Warm" = numba's event loop
is compiled (or loaded from NUMBA_CACHE_DIR) and the modules imported; each timed compile uses a
fresh kernel object, so it traces and compiles from scratch.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import pypto_lab.pto as pypto


def softmax_core(x):
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    return e / pypto.sum(e, dim=-1, keepdim=True)


def make_softmax(tile=(1, 4, 1, 64), double_buffer=True):
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"},
                        pass_options={"double_buffer": double_buffer})
    def softmax_kernel(x: pypto.Tensor((32, 32, 1, 256), pypto.DT_FP16)):
        out = pypto.tensor((32, 32, 1, 256), pypto.DT_FP16)
        pypto.set_vec_tile_shapes(*tile)
        for b in pypto.loop(0, 32, 1, name="LOOP_L0_bIdx", idx_name="b"):
            out[b:, ...] = softmax_core(x[b:b + 1, :, :, :])
        return out
    return softmax_kernel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    x = torch.rand(32, 32, 1, 256, dtype=torch.float16)
    make_softmax()(x)  # warm-up: imports, numba
    compile_s, first_s, warm_s = [], [], []
    for _ in range(args.repeats):
        k = make_softmax()
        t = time.perf_counter()
        k(x)
        first_s.append(time.perf_counter() - t)
        compile_s.append(k.last_compiled.compile_seconds)
        t = time.perf_counter()
        k(x)
        warm_s.append(time.perf_counter() - t)
    k = make_softmax()
    y = k(x)
    err = (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
    n_instr = len(k.last_compiled.execute_graph.program)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}\n")
    print("| softmax (32, 32, 1, 256) fp16, Ascend910B1 | value |")
    print("|---|---|")
    print(f"| trace + compile (Tensor -> Tile -> Block -> Execute Graph), median | {statistics.median(compile_s) * 1e3:.0f} ms |")
    print(f"| first call (compile + simulate + numerics), median | {statistics.median(first_s) * 1e3:.0f} ms |")
    print(f"| cached call (numerics only), median | {statistics.median(warm_s) * 1e3:.1f} ms |")
    print(f"| instructions in the Execute Graph | {n_instr:,} |")
    print(f"| max abs error vs torch.softmax (fp32) | {err:.1e} |\n")
    print("| vec tile | double buffer | cycles | time (us) | UB peak (B) | cores | fraction of HBM bw |")
    print("|---|---|---|---|---|---|---|")
    for tile, db in [((1, 4, 1, 64), True), ((1, 4, 1, 64), False), ((1, 1, 1, 16), True),
                     ((1, 32, 1, 256), True), ((1, 8, 1, 256), True)]:
        k = make_softmax(tile, db)
        k(x)
        r = k.last_run
        print(f"| {tile} | {db} | {r.cycles:,.0f} | {r.time_us:.2f} | {r.buffer_peak['UB']:,} | {r.cores_used} | "
              f"{r.fraction_of_peak:.1%} |")


if __name__ == "__main__":
    main()
