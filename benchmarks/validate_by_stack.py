"""Every published 310P3 inference row on its own software stack, with the error per regime and
per stack: what `pypto-lab validate` prints, but each row run on the stack that produced its
figure (rows whose source path names TorchAIE on the ``torch_aie`` preset, the others on
``atc-om``), so that conflicting rows of two stacks are judged each against its own.

Run:  python benchmarks/validate_by_stack.py [--json PATH] [--only MODEL]

Regimes: CNN small batch (batch <= 8), CNN large batch (batch > 8), transformer inference. No
constant of the simulator is fitted to these rows, so a model's leave-one-model-out error is its
own error. (`pypto_lab.validation.validate` runs every row on atc-om; a per-row stack there is a
change for its owner, this script shows what it would print.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pypto_lab.compiler.optimize import optimize
from pypto_lab.validation.validate import BUILDERS, published_rows

TRANSFORMERS = ("bert", "roberta", "albert")


def stack_of(source: str) -> str:
    """The stack that produced a published row: its source path names the tool."""
    return "torch_aie" if "TorchAIE" in source else "atc-om"


def regime_of(key: str, batch: int) -> str:
    if key.startswith(TRANSFORMERS):
        return "transformer"
    return "CNN small batch" if batch <= 8 else "CNN large batch"


def summary(errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return (f"{len(a):2d} rows  median {statistics.median(a):5.1%}  worst {max(a):6.1%}  "
            f"within 15% {sum(x <= 0.15 for x in a):2d}  within 25% {sum(x <= 0.25 for x in a):2d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows and summaries here")
    ap.add_argument("--only", help="only rows whose model key starts with this")
    args = ap.parse_args()
    rows = []
    t0 = time.time()
    for r in published_rows():
        if args.only and not r.key.startswith(args.only):
            continue
        stack = stack_of(r.source)
        model, inputs = BUILDERS[r.key](r.batch, r.resolution, r.seq)
        rep = optimize(model, inputs, chip=r.chip, level=3, precision="fp16", stack=stack).report()
        sim = r.batch * 1e6 / rep.latency_us
        rows.append({"model": r.key, "batch": r.batch, "size": r.seq or r.resolution, "stack": stack,
                     "regime": regime_of(r.key, r.batch), "published": r.published, "simulated": sim,
                     "latency_us": rep.latency_us, "kernels": len(rep.kernels), "dram_mb": rep.dram_bytes / 1e6,
                     "error": (sim - r.published) / r.published, "source": r.source})
        print(f"{r.key:18s} {stack:9s} b{r.batch:<3d} {r.seq or r.resolution!s:>4}  published {r.published:8.1f}/s  "
              f"simulated {sim:8.1f}/s  {rows[-1]['error']:+6.0%}", flush=True)
    out = {"rows": rows, "regimes": {}, "stacks": {}}
    print()
    for label, key in (("regime", "regime"), ("stack", "stack")):
        for name in sorted({row[key] for row in rows}):
            errs = [row["error"] for row in rows if row[key] == name]
            out[f"{label}s" if label == "regime" else "stacks"][name] = errs
            print(f"{label} {name:16s} {summary(errs)}")
    for stack in sorted({row["stack"] for row in rows}):
        for regime in sorted({row["regime"] for row in rows}):
            errs = [row["error"] for row in rows if row["stack"] == stack and row["regime"] == regime]
            if errs:
                print(f"  {stack:9s} {regime:16s} {summary(errs)}")
    print(f"all rows {summary([row['error'] for row in rows])}  ({time.time() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
