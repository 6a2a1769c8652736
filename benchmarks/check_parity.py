"""Parity of the simulator's figures across a refactor: record a reference, then check against it.

Run:  .venv/bin/python benchmarks/check_parity.py --record out/parity.json     # before a change
      .venv/bin/python benchmarks/check_parity.py --check out/parity.json      # after it

Covers simulate_matmul, simulate_conv2d, simulate_vector and simulate_attention (fused and
unfused) over a few hundred seeded random and ResNet-/BERT-shaped cases on every chip (every
epilogue name, custom `Epilogue` placements, double buffering on and off, every Cube dtype the
chip has, batch > 1), the pypto_lab.pto kernels of examples/kernels/ and tests/test_pto*.py, and
(``--parts models``, `parity_models.py`) whole workloads: models through optimize, LLMs through
simulate_generation and serve, training steps through simulate_step.
Per case it keeps cycles, time_us, gm_bytes, pipe_busy, buffer_peak and instruction_count, and
a signature of the timeline: per (core, pipe) lane the number of instructions and the sums of
their start, end and ready cycles, and the count of every instruction kind. ``--check`` passes
when every figure matches within 1e-9 relative; it prints the first mismatches otherwise and
exits 1. Whole-workload figures are compared within 1 % relative (`parity_models.REL_MODELS`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pypto_lab.hw import get_chip, list_chips
from pypto_lab.hw.attention import simulate_attention
from pypto_lab.hw.capabilities import place_epilogue
from pypto_lab.hw.kernels import EPILOGUES, VECTOR_OPS, simulate_conv2d, simulate_matmul, simulate_vector
from pypto_lab.hw.tiling import CubeTile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity_models import REL_MODELS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REL = 1e-9

# ResNet-50 convolutions (c_in, h, c_out, kernel, stride, padding) and BERT GEMMs (m, k, n)
RESNET = [(3, 224, 64, 7, 2, 3), (64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 1), (64, 56, 256, 1, 1, 0),
          (256, 56, 128, 1, 1, 0), (128, 28, 128, 3, 1, 1), (128, 28, 512, 1, 1, 0), (512, 28, 256, 1, 1, 0),
          (256, 14, 256, 3, 1, 1), (256, 14, 1024, 1, 1, 0), (1024, 14, 512, 1, 1, 0), (512, 7, 512, 3, 1, 1),
          (512, 7, 2048, 1, 1, 0), (256, 56, 512, 1, 2, 0), (1024, 14, 2048, 1, 2, 0)]
BERT = [(1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768), (4096, 1024, 1024), (512, 1024, 4096),
        (128, 768, 2), (2048, 768, 30522)]


# the Vector operators the random cases draw from (fixed, so that an operator added to VECTOR_OPS
# does not change which cases a seed draws)
PARITY_VECTOR_OPS = ["add", "add_relu", "batchnorm", "cast", "copy", "div", "exp", "gelu", "layernorm", "max",
                     "maximum", "minimum", "mul", "relu", "rmsnorm", "rsqrt", "softmax", "sqrt", "sub", "sum"]


def timeline_signature(tl) -> dict:
    lanes: dict[int, list[float]] = {}  # lane -> [count, sum of start, end, ready]
    kinds: dict[str, int] = {}
    programs = tl.programs() if hasattr(tl, "programs") else [((tl.core, tl.pipe, tl.kind, tl.start, tl.end, tl.ready),
                                                               np.arange(tl.busy.shape[0])[None, :])]
    for (core, pipe, kind, start, end, ready), placements in programs:
        if not len(pipe):
            continue
        local = core.astype(np.int64) * 7 + pipe.astype(np.int64)
        n_local = int(local.max()) + 1
        sums = [np.bincount(local, minlength=n_local).astype(float)] + [
            np.bincount(local, weights=w, minlength=n_local) for w in (start, end, ready)]
        for row in placements:
            for lane_local in np.nonzero(sums[0])[0]:
                lane = int(row[lane_local // 7]) * 7 + int(lane_local % 7)
                acc = lanes.setdefault(lane, [0.0, 0.0, 0.0, 0.0])
                for j in range(4):
                    acc[j] += float(sums[j][lane_local])
        counts = np.bincount(kind.astype(np.int64), minlength=len(tl.kinds)) * len(placements)
        for i, c in enumerate(counts):
            if c:
                kinds[tl.kinds[i]] = kinds.get(tl.kinds[i], 0) + int(c)
    order = sorted(lanes)
    return {"lanes": order, "count": [int(lanes[x][0]) for x in order],
            "start": [lanes[x][1] for x in order], "end": [lanes[x][2] for x in order],
            "ready": [lanes[x][3] for x in order], "kinds": kinds, "total": tl.total_cycles,
            "busy": tl.busy.sum(axis=0).tolist()}


def report_figures(r) -> dict:
    return {"cycles": r.cycles, "time_us": r.time_us, "gm_bytes": r.gm_bytes, "pipe_busy": r.pipe_busy,
            "buffer_peak": r.buffer_peak, "instruction_count": r.instruction_count,
            "timeline": timeline_signature(r.instructions)}


def _epilogue_choices(chip, rng: random.Random) -> list:
    out = list(EPILOGUES)
    for _ in range(3):
        stages = {"bias": rng.random() < 0.5, "dequant": rng.random() < 0.3, "residual": rng.random() < 0.4,
                  "activation": rng.choice(["", "relu", "gelu", "silu", "sigmoid", "hardtanh"]),
                  "quant": rng.random() < 0.3}
        out.append(place_epilogue(chip, **stages))
    return out


def cases(seed: int, n_random: int) -> list[tuple[str, str, dict]]:
    """(name, function, kwargs) of every case, the same list for the same seed."""
    rng = random.Random(seed)
    out: list[tuple[str, str, dict]] = []
    for chip_name in list_chips():
        chip = get_chip(chip_name)
        dtypes = [d for d in ("fp16", "bf16", "fp32", "int8") if d in chip.cube.fractals]
        epis = _epilogue_choices(chip, rng)
        for i in range(n_random):
            m, k, n = (rng.choice([rng.randint(1, 3000), 16 * rng.randint(1, 256)]) for _ in range(3))
            kw = {"m": m, "k": k, "n": n, "dtype": rng.choice(dtypes), "chip": chip_name,
                  "double_buffer": rng.random() < 0.7, "batch": rng.choice([1, 1, 1, 2, 3, 8])}
            epi = epis[i % len(epis)]
            kw["epilogue"] = epi
            if rng.random() < 0.3:
                t = CubeTile(*[16 * rng.choice([1, 2, 4, 8]) for _ in range(6)])
                t = CubeTile(t.m_l0, t.m_l0 * rng.choice([1, 2]), t.k_l0, t.k_l0 * rng.choice([1, 2, 4]),
                             t.n_l0, t.n_l0 * rng.choice([1, 2]))
                kw["tile"] = t
            out.append((f"matmul {chip_name} #{i}", "matmul", kw))
        for j, (c_in, h, c_out, kern, stride, pad) in enumerate(RESNET):
            kw = {"n": rng.choice([1, 8, 24]), "c_in": c_in, "h": h, "w": h, "c_out": c_out, "kernel": kern,
                  "stride": stride, "padding": pad, "dtype": rng.choice(dtypes), "chip": chip_name,
                  "double_buffer": rng.random() < 0.8, "epilogue": rng.choice(["none", "bias_relu", "residual_relu",
                                                                               "relu", "quant"])}
            out.append((f"conv2d {chip_name} #{j}", "conv2d", kw))
        for j, (m, k, n) in enumerate(BERT):
            kw = {"m": m, "k": k, "n": n, "dtype": rng.choice(dtypes), "chip": chip_name,
                  "epilogue": rng.choice(["none", "bias", "gelu", "residual", "bias_relu"])}
            out.append((f"bert gemm {chip_name} #{j}", "matmul", kw))
        for j in range(n_random // 2):
            op = rng.choice(PARITY_VECTOR_OPS)
            spec = VECTOR_OPS[op]
            row_len = rng.choice([64, 128, 768, 1024, 4096])
            rows = rng.randint(1, 3000)
            numel = rows * row_len if spec.row_wise else rng.randint(1, 3_000_000)
            dtype = rng.choice(["fp16", "fp32", "bf16"] if spec.row_wise or op in ("exp", "sqrt", "rsqrt", "gelu",
                                                                                 "div", "softmax") else
                               ["fp16", "fp32", "bf16", "int8", "int16", "int32"])
            kw = {"op": op, "numel": numel, "dtype": dtype, "chip": chip_name, "double_buffer": rng.random() < 0.7}
            if spec.row_wise:
                kw["row_len"] = row_len
                if dtype != "fp32" and rng.random() < 0.4:
                    kw["compute_dtype"] = "fp32"
            out.append((f"vector {chip_name} #{j}", "vector", kw))
        for j in range(10):
            d = rng.choice([64, 128, 80])
            kw = {"batch_heads": rng.choice([1, 12, 96]), "s_q": rng.choice([128, 384, 512, 1000]),
                  "s_k": rng.choice([128, 512, 1024, 77]), "d": d, "dtype": rng.choice(["fp16", "bf16", "fp32"]
                                                                                       if "bf16" in chip.cube.fractals
                                                                                       else ["fp16"]),
                  "chip": chip_name, "fused": j % 3 != 2, "double_buffer": rng.random() < 0.8}
            out.append((f"attention {chip_name} #{j}", "attention", kw))
    return out


def run_case(fn: str, kw: dict):
    kw = dict(kw)
    if fn == "matmul":
        return simulate_matmul(kw.pop("m"), kw.pop("k"), kw.pop("n"), **kw)
    if fn == "conv2d":
        return simulate_conv2d(kw.pop("n"), kw.pop("c_in"), kw.pop("h"), kw.pop("w"), kw.pop("c_out"), **kw)
    if fn == "vector":
        return simulate_vector(kw.pop("op"), kw.pop("numel"), **kw)
    return simulate_attention(kw.pop("batch_heads"), kw.pop("s_q"), kw.pop("s_k"), kw.pop("d"), **kw)


def hw_figures(seed: int, n_random: int) -> dict:
    out = {}
    for name, fn, kw in cases(seed, n_random):
        try:
            out[name] = report_figures(run_case(fn, kw))
        except ValueError as exc:  # an illegal tiling or an unsupported dtype: the error is the figure
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


PTO_HOOK = r"""
import importlib, json, sys
_jit = importlib.import_module("pypto_lab.pto.jit")
sys.path.insert(0, {bench!r})
from check_parity import timeline_signature
RUNS = []
_orig = _jit.CompiledKernel._simulate
def _record(self):
    r = _orig(self)
    RUNS.append({{"name": r.name, "chip": r.chip, "cycles": r.cycles, "pipe_busy": r.pipe_busy,
                 "buffer_peak": r.buffer_peak, "instruction_count": len(r.timeline),
                 "timeline": timeline_signature(r.timeline)}})
    return r
_jit.CompiledKernel._simulate = _record
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", *{targets!r}])
json.dump(RUNS, open({out!r}, "w"))
sys.exit(int(code))
"""


def pto_figures(tmp: Path) -> list:
    """Every pto kernel run of the pto tests and the kernel examples (run through their tests)."""
    targets = sorted(str(p) for p in (ROOT / "tests").glob("test_pto*.py"))
    out = tmp / "pto_runs.json"
    script = PTO_HOOK.format(bench=str(ROOT / "benchmarks"), targets=targets, out=str(out))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)
    return json.loads(out.read_text())


def compare(ref, new, path: str, bad: list, rel: float = REL) -> None:
    if isinstance(ref, dict):
        if not isinstance(new, dict) or set(ref) != set(new):
            bad.append(f"{path}: keys {sorted(ref) if isinstance(ref, dict) else ref} != "
                       f"{sorted(new) if isinstance(new, dict) else new}")
            return
        for k in ref:
            compare(ref[k], new[k], f"{path}.{k}", bad, rel)
    elif isinstance(ref, list):
        if not isinstance(new, list) or len(ref) != len(new):
            bad.append(f"{path}: length {len(ref)} != {len(new) if isinstance(new, list) else new}")
            return
        for i, (a, b) in enumerate(zip(ref, new)):
            compare(a, b, f"{path}[{i}]", bad, rel)
    elif isinstance(ref, float) or isinstance(new, float):
        if not math.isclose(float(ref), float(new), rel_tol=rel, abs_tol=1e-9):
            bad.append(f"{path}: {ref!r} != {new!r}")
    elif ref != new:
        bad.append(f"{path}: {ref!r} != {new!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--record", metavar="PATH", help="write the reference figures to PATH")
    what.add_argument("--check", metavar="PATH", help="compare against the reference in PATH")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random", type=int, default=60, help="random matmul cases per chip (vector: half)")
    ap.add_argument("--parts", default="hw,pto", help="hw (the simulate_* calls), pto (the pto kernels, a minute "
                    "of tests), models (whole workloads, a few minutes), comma-separated (default hw,pto); "
                    "--record with some parts keeps the others' figures in PATH")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - {"hw", "pto", "models"}:
        sys.exit(f"--parts {args.parts!r}: choose from hw, pto, models (comma-separated)")
    path = Path(args.record or args.check)
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = {}
    if "hw" in parts:
        t0 = time.perf_counter()
        figures["hw"] = hw_figures(args.seed, args.random)
        print(f"{len(figures['hw'])} hw cases in {time.perf_counter() - t0:.0f} s")
    if "pto" in parts:
        figures["pto"] = pto_figures(path.parent)
        print(f"{len(figures['pto'])} pto kernel runs")
    if "models" in parts:
        from parity_models import model_figures

        figures["models"] = model_figures()
    if args.record:
        old = json.loads(path.read_text()) if path.exists() else {}
        if (old.get("seed"), old.get("random")) == (args.seed, args.random):
            figures = {**old["figures"], **figures}
        path.write_text(json.dumps({"seed": args.seed, "random": args.random, "figures": figures}))
        print(f"reference written to {path} ({', '.join(sorted(figures))})")
        return
    ref = json.loads(path.read_text())
    if (ref["seed"], ref["random"]) != (args.seed, args.random):
        sys.exit(f"{path} was recorded with --seed {ref['seed']} --random {ref['random']}; pass the same")
    bad: list[str] = []
    for part, new in figures.items():
        if part not in ref["figures"]:
            sys.exit(f"{path} has no {part} figures; record them first")
        compare(ref["figures"][part], new, part, bad, REL_MODELS if part == "models" else REL)
    errors = sum(1 for v in figures.get("hw", {}).values() if "error" in v)
    print(f"{len(figures.get('hw', {}))} hw cases ({errors} raise the same error as recorded), "
          f"{len(figures.get('pto', []))} pto runs, {sum(len(v) for v in figures.get('models', {}).values())} "
          f"workloads: {len(bad)} mismatches (relative tolerance {REL:g}; workloads {REL_MODELS:g})")
    for line in bad[:30]:
        print("  " + line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
