"""Costs of the pto op library's non-element-wise ops on the chip model: how a row gather, the
KV-cache write, a sort and a convolution scale (simulated cycles, GM bytes, busy pipes).

Run:  .venv/bin/python benchmarks/bench_pto_ops.py
"""

from __future__ import annotations

import torch

import pypto_lab.pto as pypto
from pypto_lab.pto import doc_ops

SIM = {"run_mode": pypto.RunMode.SIM}


def _row(name, run):
    busy = {p: v for p, v in run.pipe_busy.items() if v > 0}
    top = ", ".join(f"{p} {v:,.0f}" for p, v in sorted(busy.items(), key=lambda kv: -kv[1])[:3])
    print(f"| {name} | {run.cycles:,.0f} | {run.gm_bytes:,.0f} | {run.cores_used} | {top} |")


def main() -> None:
    torch.manual_seed(0)
    print("| op | cycles | GM bytes | cores | busiest pipes (cycles, all cores) |")
    print("|---|---|---|---|---|")
    table = torch.randn(4096, 128)

    @pypto.jit(runtime_options=SIM)
    def select(t: pypto.Tensor(), i: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 128)
        out[:] = pypto.index_select(t, 0, i)

    @pypto.jit(runtime_options=SIM)
    def copy(t: pypto.Tensor(), out: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 128)
        out[:] = t * 1.0

    for rows in (8, 64, 512):
        select(table, torch.randint(0, 4096, (rows,), dtype=torch.int32), torch.empty(rows, 128))
        _row(f"index_select {rows} rows of a [4096, 128] fp32 table", select.last_run)
    copy(table, torch.empty_like(table))
    _row("for scale: the whole table read and written (x * 1.0)", copy.last_run)

    @pypto.jit(runtime_options=SIM)
    def kv_write(cache: pypto.Tensor(), idx: pypto.Tensor(), src: pypto.Tensor()):
        pypto.set_vec_tile_shapes(1, 16, 1, 128)
        pypto.scatter_update(cache, -2, idx, src)

    kv_write(torch.zeros(256, 16, 1, 128).half(), torch.randperm(4096)[:64].reshape(4, 16),
             torch.randn(4, 16, 1, 128).half())
    _row("scatter_update 64 tokens into a [256, 16, 1, 128] fp16 cache", kv_write.last_run)

    for n in (256, 2048):
        @pypto.jit(runtime_options=SIM)
        def top(x: pypto.Tensor(), v: pypto.Tensor(), i: pypto.Tensor(), n=n):
            pypto.set_vec_tile_shapes(8, n)
            v[:], i[:] = pypto.topk(x, 8)
        top(torch.randn(64, n), torch.empty(64, 8), torch.empty(64, 8, dtype=torch.int32))
        _row(f"topk k=8 of [64, {n}] fp32", top.last_run)

    @pypto.frontend.jit(runtime_options=SIM)
    def conv(x: pypto.Tensor((8, 64, 32, 32), pypto.DT_FP16), w: pypto.Tensor((128, 64, 3, 3), pypto.DT_FP16)):
        return pypto.conv(x, w, pypto.DT_FP16, [1, 1], [1, 1, 1, 1], [1, 1])

    conv(torch.randn(8, 64, 32, 32).half(), torch.randn(128, 64, 3, 3).half())
    r = conv.last_run
    _row(f"conv 3x3, [8, 64, 32, 32] -> 128 channels fp16 ({r.fraction_of_peak:.0%} of Cube peak)", r)
    have, missing = doc_ops.coverage()
    print(f"\n{len(have)} of {len(doc_ops.DOCUMENTED)} documented op pages implemented; missing: {', '.join(missing)}")


if __name__ == "__main__":
    main()
