"""Speed, memory and cost fidelity of symbolic loops in pypto_lab.pto (`pypto_lab.pto.loops`).

* the whole call (trace, compile, simulate, numerics) of a ``pypto.loop`` of 100,000 iterations of
  a row-sum body (``out[i] = sum(x[i, :])``) and of a row-add body; the iterations are independent,
  so the numerics run them at once (`pypto_lab.pto.batched`); ``--iteration-by-iteration`` times
  the same calls with batching off (the numerics one iteration after another, as before issue 27);
* trace + compile + simulate of the row-add loop (kept as one loop node: the body is traced once);
  the peak resident-set growth of the call (VmHWM, after warm-up);
* cost fidelity: the extrapolated cycles of the symbolic loop against the same kernel unrolled
  (every iteration traced, tiled and simulated) at trip counts where unrolling is still feasible.

Run:  .venv/bin/python benchmarks/bench_pto_loops.py [--repeats N] [--iterations N]
Prints Markdown (benchmarks/README.md holds the last results).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import pypto_lab.pto as pypto
from pypto_lab.pto import loops


def make_kernel(rows_per_iter: int = 1):
    r = rows_per_iter

    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
    def rows_add(x: pypto.Tensor, y: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(r, 64)
        for i in pypto.loop(x.shape[0] // r, name="LOOP_rows", idx_name="i"):
            out[i * r:(i + 1) * r, :] = x[i * r:(i + 1) * r, :] + y[i * r:(i + 1) * r, :]
    return rows_add


def make_rowsum():
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
    def rows_sum(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(x.shape[0], name="LOOP_rows", idx_name="i"):
            out[i:i + 1, :] = pypto.sum(x[i:i + 1, :], -1, keepdim=True)
    return rows_sum


def make_nested(n_outer: int, n_inner: int):
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
    def nested_add(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(n_outer, name="LOOP_o", idx_name="i"):
            for j in pypto.loop(n_inner, name="LOOP_i", idx_name="j"):
                r = i * n_inner + j
                out[r:r + 1, :] = x[r:r + 1, :] + 1.0
    return nested_add


def _vmhwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--iteration-by-iteration", action="store_true",
                    help="run the loops' numerics one iteration at a time (batching off)")
    ap.add_argument("--speed-only", action="store_true", help="only the 100,000-iteration calls")
    args = ap.parse_args()
    n = args.iterations
    if args.iteration_by_iteration:
        from pypto_lab.pto import batched
        batched.plan = lambda graph, node: None
    x = torch.randn(n, 64, dtype=torch.float16)
    y = torch.randn(n, 64, dtype=torch.float16)
    out = torch.empty_like(x)
    sums = torch.empty(n, 1, dtype=torch.float16)
    make_kernel()(x[:4096], y[:4096], out[:4096])   # warm-up: imports, numba
    make_rowsum()(x[:4096], sums[:4096])
    mode = "iteration by iteration" if args.iteration_by_iteration else "iterations at once"
    print(f"whole call of a {n:,}-iteration pypto.loop ({mode}), medians of {args.repeats}:\n")
    print("| body | whole call |\n|---|---:|")
    for label, mk, call_args in (("row sum", make_rowsum, (x, sums)), ("row add", make_kernel, (x, y, out))):
        times = []
        for _ in range(args.repeats):
            k = mk()
            t = time.perf_counter()
            k(*call_args)
            times.append(time.perf_counter() - t)
        print(f"| {label} | {statistics.median(times):.2f} s |")
    ref = x.float().sum(-1, keepdim=True)
    assert (sums.float() - ref).abs().max() < 0.1 and torch.equal(out, x + y)
    if args.speed_only:
        return
    print()
    compile_s, sim_s, call_s = [], [], []
    for _ in range(args.repeats):
        k = make_kernel()
        _reset_hwm()
        rss0 = _vmhwm_kb()
        t = time.perf_counter()
        k(x, y, out)
        call_s.append(time.perf_counter() - t)
        grow_mb = (_vmhwm_kb() - rss0) / 1024
        c = k.last_compiled
        compile_s.append(c.compile_seconds)
        c._results.clear()
        c._base = None
        c._reduced.clear()
        counts = {(nd.id, 0): n for nd in loops.loop_nodes(c.tensor_graph)}
        t = time.perf_counter()
        c.run_result(counts)
        sim_s.append(time.perf_counter() - t)
    assert torch.equal(out, x + y)
    res = k.last_run
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.repeats} repeats, medians\n")
    print("| measurement | value |\n|---|---:|")
    print(f"| iterations of the loop | {n:,} |")
    print(f"| Tensor Graph nodes | {len(c.tensor_graph.nodes)} |")
    print(f"| simulated copies of the body (base) | {sum(c.copies.values())} |")
    print(f"| Execute Graph instructions (base) | {len(c.execute_graph.program):,} |")
    print(f"| trace + compile | {statistics.median(compile_s) * 1e3:.0f} ms |")
    print(f"| simulate + extrapolate | {statistics.median(sim_s) * 1e3:.0f} ms |")
    print(f"| whole call (compile, simulate, numerics iteration by iteration) | {statistics.median(call_s):.2f} s |")
    print(f"| peak RSS growth of the whole call (last repeat) | {grow_mb:.0f} MB |")
    print(f"| cycles (extrapolated) | {res.cycles:,.0f} |")

    print("\nCost fidelity: the symbolic loop (extrapolated) against the same kernel unrolled\n")
    print("| iterations | rows per iteration | unrolled: cycles | symbolic: cycles | error |")
    print("|---:|---:|---:|---:|---:|")
    saved = loops.UNROLL_LIMIT
    for iters, r in ((300, 8), (1000, 8), (2000, 8), (1000, 1), (3000, 1)):
        xs = torch.randn(iters * r, 64, dtype=torch.float16)
        o = torch.empty_like(xs)
        loops.UNROLL_LIMIT = 10**9
        ku = make_kernel(r)
        ku(xs, xs, o)
        loops.UNROLL_LIMIT = saved
        ks = make_kernel(r)
        ks(xs, xs, o)
        cu, cs = ku.last_run.cycles, ks.last_run.cycles
        print(f"| {iters:,} | {r} | {cu:,.0f} | {cs:,.0f} | {(cs - cu) / cu:+.1%} |")
    print("\nNested loops (fp32, one row per inner iteration)\n")
    print("| outer x inner | unrolled: cycles | symbolic: cycles | error |\n|---|---:|---:|---:|")
    for no, ni in ((100, 100), (10, 300)):
        xs = torch.randn(no * ni, 64)
        o = torch.empty_like(xs)
        loops.UNROLL_LIMIT = 10**9
        ku = make_nested(no, ni)
        ku(xs, o)
        loops.UNROLL_LIMIT = saved
        ks = make_nested(no, ni)
        ks(xs, o)
        cu, cs = ku.last_run.cycles, ks.last_run.cycles
        print(f"| {no} x {ni} | {cu:,.0f} | {cs:,.0f} | {(cs - cu) / cu:+.1%} |")


if __name__ == "__main__":
    main()
