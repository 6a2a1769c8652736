"""Speed of capturing and costing Hugging Face causal LMs (`pypto_lab.llm.hf`), and the memory it takes.

Run:  .venv/bin/python benchmarks/bench_hf_capture.py [--repeats N] [--cli]

Medians of ``--repeats`` runs (default 3) of, for a Llama-2-7B-sized config built on the meta
device (hidden 4096, 32 layers, intermediate 11008, 32 heads, vocab 32000: no weight memory):

* build: `build_causal_lm("llama-2-7b")` (the first run also imports transformers' Llama code);
* capture prefill: `capture(model, ids[1, 128])` (torch.export through the use_cache=False adapter);
  the capture memo is dropped before every run;
* optimize: `optimize(model, ids, chip="Ascend910B1", level=1, precision="fp16")` with the graph
  already captured (passes + kernel costing, kernel memo cleared);
* decode export: `capture_decode_step(model, 1, 1024)` (one export, context dynamic);
* decode at a new context: `capture` of the decode wrapper at a context not yet seen (the one
  program specialised: no export), and `optimize` of it;

and the same steps for a 2-layer, 64-wide Llama config on the CPU. ``--cli`` also times
``pypto-lab report hf:llama-2-7b --chip Ascend910B1`` end to end in a subprocess. The peak resident
set of this process is printed last.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from pypto_lab import optimize
from pypto_lab.capture import capture, export
from pypto_lab.kernels.cost import clear_memo
from pypto_lab.llm import hf

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 2048}


def median_s(fn, repeats: int, before=None) -> tuple[float, object]:
    times, out = [], None
    for i in range(repeats):
        if before is not None:
            before(i)
        t = time.perf_counter()
        out = fn(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def fmt(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def bench(label: str, spec, device: str, repeats: int) -> None:
    t_build, model = median_s(lambda i: hf.build_causal_lm(spec, device=device), repeats)
    ids = torch.zeros((1, 128), dtype=torch.long)
    t_cap, graph = median_s(lambda i: capture(model, (ids,)), repeats,
                            before=lambda i: export._CACHE.pop(model, None))  # a fresh capture each run
    t_opt, om = median_s(lambda i: optimize(model, (ids,), chip="Ascend910B1", level=1, precision="fp16"), repeats,
                         before=lambda i: clear_memo())
    t_dec, step = median_s(lambda i: hf.capture_decode_step(model, 1, 1024), repeats)
    contexts = iter(range(1025, 1025 + 10 * repeats))
    t_spec, _ = median_s(lambda i: step.graph(next(contexts)), repeats)
    t_dopt, dec = median_s(lambda i: optimize(step.module, step.inputs(2000 + i), chip="Ascend910B1", level=1,
                                              precision="fp16"), repeats, before=lambda i: clear_memo())
    rows = [("build_causal_lm", t_build, ""),
            ("capture prefill [1, 128]", t_cap, f"{len(graph.nodes)} nodes"),
            ("optimize prefill, level 1 fp16, Ascend910B1 (captured)", t_opt,
             f"{om.report().latency_us / 1e3:.2f} ms simulated"),
            ("capture_decode_step(batch 1, context 1024): one export", t_dec, "dynamic" if step.dynamic else step.note),
            ("decode graph at a new context (specialised, no export)", t_spec, ""),
            ("optimize decode at a new context, level 1 fp16", t_dopt,
             f"{dec.report().latency_us / 1e3:.2f} ms simulated")]
    for what, seconds, note in rows:
        print(f"| {label} | {what} | {fmt(seconds)} | {note} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cli", action="store_true", help="also time `pypto-lab report hf:llama-2-7b`")
    args = ap.parse_args()
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"torch {torch.__version__}, repeats {args.repeats}\n")
    print("| model | step | median time | note |")
    print("|---|---|---:|---|")
    bench("Llama-2-7B config, meta", "llama-2-7b", "meta", args.repeats)
    bench("2-layer Llama, 64 wide, cpu", TINY, "cpu", args.repeats)
    if args.cli:
        cmd = [sys.executable, "-m", "pypto_lab.cli", "report", "hf:llama-2-7b", "--chip", "Ascend910B1", "--top", "0"]
        t_cli, _ = median_s(lambda i: subprocess.run(cmd, check=True, capture_output=True), args.repeats)
        print(f"| Llama-2-7B config, meta | `pypto-lab report hf:llama-2-7b --chip Ascend910B1` (subprocess) "
              f"| {fmt(t_cli)} | |")
    print(f"\npeak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
