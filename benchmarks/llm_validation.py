#!/usr/bin/env python3
"""The LLM engine against published Ascend figures (datasets/llm_published/ascend_llm_figures.csv).

    python benchmarks/llm_validation.py [--launch-us 0] [--json PATH]

Three groups of rows, each compared with what the workbench predicts for the same setup:

* fixed-batch prefill and decode step latencies (torch_npu + torchair READMEs, Atlas 800I A2:
  prompts padded to 1,024 tokens, 1,024 output tokens): `simulate_generation`'s TTFT against the
  prefill step, its TPOT (the mean decode step) against the decode step;
* serving runs with fixed prompt/output lengths and a request rate (vllm-ascend issues): `serve`
  with the same lengths and rate, mean TTFT / TPOT / output tokens per s;
* square-matmul TFLOPS measured on a 910B2: `simulate_matmul`.

Nothing here is fitted: the engine's constants are the chip presets' (public sources and the
micro-benchmark fits of `python -m pypto_lab.hw.fit`). The chip of the Atlas 800I A2 is the
Ascend910B4 (its topology preset says why), with its HBM raised to the 64 GB of that server's
bin. Prints one row per figure and the mean absolute percentage error per group.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pypto_lab.files.atomic import write_json_atomic  # noqa: E402
from pypto_lab.hw.chip import get_chip  # noqa: E402
from pypto_lab.hw.kernels import simulate_matmul  # noqa: E402
from pypto_lab.llm import serve, simulate_generation  # noqa: E402
from pypto_lab.stack import get_stack  # noqa: E402

DATA = ROOT / "datasets" / "llm_published" / "ascend_llm_figures.csv"
MODELS = {"Llama-2-7B": "llama-2-7b", "Llama-2-70B": "llama-2-70b", "Llama-3-70B": "llama-3-70b",
          "Qwen2-7B": "qwen2-7b", "Qwen2-72B": "qwen2-72b", "ChatGLM3-6B": "chatglm3-6b",
          "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-VL-8B-Instruct (text-only prompts)": "qwen3-8b"}


def atlas_800i_a2():
    """The Ascend910B4 preset with the 64 GB HBM of the Atlas 800I A2's bin (its topology preset)."""
    return dataclasses.replace(get_chip("Ascend910B4"), hbm_bytes=64 * 2 ** 30)


def _precision(text: str) -> tuple[str, str | None]:
    t = text.lower()
    if "w8a8" in t:
        return "w8a8", ("int8" if "int8 kv" in t or "c8" in t else None)
    return ("bf16" if "bf16" in t else "fp16"), None


def _num(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _stack(name: str, launch_us: float | None):
    """The row's stack preset, with --launch-us in place of its launch cost when given."""
    stack = get_stack(name)
    return stack if launch_us is None else stack.with_values(launch_us=launch_us)


def fixed_batch(rows, launch_us: float | None) -> list[dict]:
    out, memo = [], {}
    chip = atlas_800i_a2()
    for r in rows:
        if "torchair" not in r["framework"].lower() or r["model"] not in MODELS:
            continue
        if r["metric"] not in ("prefill_step_latency_ms", "decode_step_latency_ms"):
            continue
        prec, kv = _precision(r["precision"])
        key = (r["model"], _num(r["cards"]), _num(r["batch"]), prec, kv)
        if key not in memo:
            memo[key] = simulate_generation(MODELS[r["model"]], batch=key[2], prompt_len=1024, output_len=1024,
                                            chip=chip, cards=key[1], precision=prec, kv_dtype=kv,
                                            stack=_stack("torchair-graph", launch_us))
        rep = memo[key]
        pred = rep.ttft_ms if r["metric"].startswith("prefill") else rep.tpot_ms
        out.append({"id": r["id"], "group": "fixed batch (torchair)", "model": r["model"], "cards": key[1],
                    "batch": key[2], "precision": prec + (f"+kv {kv}" if kv else ""), "metric": r["metric"],
                    "published": float(r["value"]), "predicted": pred})
    return out


def serving(rows, launch_us: float | None) -> list[dict]:
    out, memo = [], {}
    for r in rows:
        if r["model"] not in MODELS or "rate=" not in r["batch"] or "torchair" in r["framework"].lower():
            continue
        p, o = _num(r["prompt_len"]), _num(r["output_len"])
        rate = float(re.search(r"rate=([\d.]+)", r["batch"]).group(1))
        cards = _num(r["cards"]) or 1
        if p is None or o is None:
            continue
        chip = atlas_800i_a2() if "800I" in r["chip"] else "Ascend910B2"
        key = (r["model"], cards, p, o, rate, str(chip))
        if key not in memo:
            memo[key] = serve(MODELS[r["model"]], chip=chip, requests=100, rate=rate, cards=cards,
                              lengths=[(p, o)] * 100, precision="bf16",
                              stack=_stack("vllm-ascend-aclgraph", launch_us), progress=False).to_dict()
        d = memo[key]
        metric = r["metric"]
        pred = {"ttft_ms_mean": d.get("ttft_ms_mean", d["ttft_ms_p50"]), "tpot_ms_mean": d.get("tpot_ms_mean", d["tpot_ms_p50"]),
                "output_tokens_per_s": d["output_tokens_per_s"]}.get(metric)
        if pred is None:
            continue
        out.append({"id": r["id"], "group": "serving (vllm-ascend)", "model": r["model"], "cards": cards,
                    "batch": f"rate {rate:g}/s", "precision": "bf16", "metric": metric,
                    "published": float(r["value"]), "predicted": pred})
    return out


def matmuls(rows) -> list[dict]:
    out = []
    for r in rows:
        m = re.match(r"\(micro\) square matmul (\d+)x\d+", r["model"])
        if not m or r["metric"] != "matmul_tflops":
            continue
        n = int(m.group(1))
        rep = simulate_matmul(n, n, n, r["precision"], "Ascend910B2")
        out.append({"id": r["id"], "group": "matmul (910B2)", "model": f"{n}^3", "cards": 1, "batch": "",
                    "precision": r["precision"], "metric": "matmul_tflops", "published": float(r["value"]),
                    "predicted": rep.tflops})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch-us", type=float, default=None,
                    help="per-kernel launch cost in place of each row's stack preset's (microseconds)")
    ap.add_argument("--json", help="write the rows and the errors here")
    args = ap.parse_args()
    with open(DATA, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    result = fixed_batch(rows, args.launch_us) + serving(rows, args.launch_us) + matmuls(rows)
    print(f"{'id':>4}  {'group':<22} {'model':<14} {'cards':>5} {'batch':>11}  {'metric':<24} {'published':>10} "
          f"{'predicted':>10} {'error':>7}")
    groups: dict[str, list[float]] = {}
    for x in result:
        x["error"] = (x["predicted"] - x["published"]) / x["published"]
        groups.setdefault(x["group"] + " / " + x["metric"], []).append(abs(x["error"]))
        print(f"{x['id']:>4}  {x['group']:<22} {x['model'][:14]:<14} {x['cards']:>5} {str(x['batch']):>11}  "
              f"{x['metric']:<24} {x['published']:>10.2f} {x['predicted']:>10.2f} {x['error']:>+7.0%}")
    print("\nmean absolute percentage error:")
    for g, errs in groups.items():
        print(f"  {g:<58} {statistics.mean(errs):6.1%}  ({len(errs)} rows, median {statistics.median(errs):.1%})")
    if args.json:
        write_json_atomic(args.json, {"rows": result, "mape": {g: statistics.mean(e) for g, e in groups.items()}})


if __name__ == "__main__":
    main()
