"""The serving rows of ``datasets/llm_published/ascend_llm_figures.csv`` run the way each was
measured: the row's model, chip, cards and stack, its request rate (Poisson) or its concurrency (a
closed loop, `closed_loop`), its prompt and output lengths and its number of requests, with
``serve`` (continuous batching on the cost engine's steps). Returns simulated against published
mean TTFT, mean TPOT (ITL) and output throughput, and the rows it cannot express with the reason.

    python -m pypto_lab.llm.serving_validation [--json PATH]

How a row becomes a run (nothing is fitted, nothing invented; every assumption is written in the
row's ``assumed`` field):

* load: ``rate=R req/s`` is Poisson at R (``vllm bench serve --request-rate``, its default
  burstiness 1); ``concurrency=N`` is ``--max-concurrency N`` at rate inf. Any other load: not
  expressible.
* lengths: both must be stated as numbers (the random dataset's fixed lengths). An output length
  not stated, or given only as a cap, or a dataset given only by its mean lengths: not expressible.
* requests: the row's ``N prompts``; not stated: not expressible.
* stack: MindIE rows on ``mindie``; vLLM-Ascend rows on ``vllm-ascend-aclgraph``, except releases
  before v0.9.0rc1 (graph mode came with the V1 engine in v0.9.0rc1: "From v0.9.0rc1 with V1
  Engine, vLLM Ascend will run models in graph mode by default", docs.vllm.ai/projects/ascend/en/
  v0.9.0rc2/user_guide/graph_mode.html) and rows that say eager, on ``vllm-ascend-eager``; rows of
  a release with a graph preset of its own (``RELEASE_STACKS``: v0.18.x on
  ``vllm-ascend-aclgraph-0.18``, whose host time per layer was measured on v0.18.0rc1, issue
  #9404) on that preset. Rows of other versions, or none stated, on the default
  ``vllm-ascend-aclgraph`` (host time per layer derived from the PIECEWISE mechanism).
* scheduler limits: vLLM's defaults for ``vllm serve`` on a device with less than 70 GiB,
  ``max_num_batched_tokens`` 2048 and ``max_num_seqs`` 256 (vllm-project/vllm
  vllm/engine/arg_utils.py, ``EngineArgs`` batch defaults, UsageContext.OPENAI_API_SERVER); block
  size 128 (vLLM-Ascend's); 90 % of HBM (vLLM's ``gpu_memory_utilization``). A row that states
  its own (``--max-num-batched-tokens``) would override them; none of the expressible ones does.
* chip: the Atlas 800I A2 is the Ascend910B4 preset with the 64 GB of that server's bin (the
  Atlas800I-A2 topology preset), as ``benchmarks/llm_validation.py`` takes it; a row naming only
  an "Atlas A2" server or no chip runs on the Ascend910B2 preset, as that script does (assumed).
* precision: as stated; not stated, bf16 (vLLM's ``dtype=auto`` takes the config's
  ``torch_dtype``, bfloat16 for these models); int8 as W8A8. W4A4 is not modelled.
* async scheduling: vLLM's ``--async-scheduling`` (the engine schedules step k+1 while step k runs)
  is on by default from vLLM v0.14.0 ("Async scheduling is now enabled by default", vLLM v0.14.0
  release notes, #27614); vllm-ascend releases carry the version of the vLLM they run on, so rows of
  vllm-ascend v0.14.0 or later run with it, earlier ones and rows whose version is not stated
  without (assumed).
* overloaded issue reports: a row whose notes say the server was heavily overloaded (requests
  arriving faster than it serves them) is listed, not run: its TTFT is queueing that grows with the
  run's length, and its served rate (0.02 req/s for Qwen3-8B at 1024/2048 tokens, issue #3112) is
  far below what the same software serves in every other row, a failure the report does not explain.
* prefix caching: the rows' prompts are random tokens (``--dataset-name random``) or distinct
  conversations, so no request shares a prefix with another and caching changes nothing; the
  runs have no shared prefix.

Errors are ``(simulated - published) / published``; `ServingValidation.summary` gives the median
and worst |error| per kind (TTFT, ITL, throughput).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files.paths import DATASETS_DIR
from ..hw.chip import get_chip
from .engine import serve

DATA = DATASETS_DIR / "llm_published" / "ascend_llm_figures.csv"
MAX_BATCHED_TOKENS = 2048   # vLLM's `vllm serve` default below 70 GiB of device memory
MAX_NUM_SEQS = 256
BLOCK_SIZE = 128

# the CSV's model name -> (known config, what the mapping assumes)
MODELS = {
    "Qwen3-30B-A3B": ("qwen3-30b-a3b", ""),
    "Qwen3-32B": ("qwen3-32b", ""),
    "Qwen3-235B-A22B (int8)": ("qwen3-235b-a22b", ""),
    "Qwen3-8B": ("qwen3-8b", ""),
    "Qwen2.5-7B-Instruct": ("qwen2.5-7b", ""),
    "Qwen3-VL-8B-Instruct (text-only prompts)": ("qwen3-8b", "Qwen3-VL-8B's language model has Qwen3-8B's shape "
                                                 "(hidden 4096, 36 layers, 32/8 heads, MLP 12288); text-only prompts "
                                                 "leave the vision encoder idle"),
}
# metric -> (kind, how a ServeReport gives it)
METRICS = {
    "ttft_ms_mean": ("TTFT", lambda r: r.ttft_ms_mean),
    "ttft_s": ("TTFT", lambda r: r.ttft_ms_mean / 1000),
    "ttft_s_mean (approximate)": ("TTFT", lambda r: r.ttft_ms_mean / 1000),
    "tpot_ms_mean": ("ITL", lambda r: r.tpot_ms_mean),
    "per_request_decode_tokens_per_s (1000/tpot)": ("ITL", lambda r: 1000.0 / r.tpot_ms_mean),
    "output_tokens_per_s": ("throughput", lambda r: r.output_tokens_per_s),
}


@dataclass(frozen=True)
class Run:
    """One benchmark run as the workbench expresses it (several published figures share one)."""

    model: str
    chip: str
    cards: int
    tp: int
    stack: str
    precision: str
    requests: int
    prompt: int
    output: int
    rate: float
    concurrency: int | None
    async_scheduling: bool = False

    @property
    def load(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.rate:g}/s"


@dataclass
class ServingValidation:
    """``rows``: one dict per expressed figure (published, simulated, error, the run, what was
    assumed); ``skipped``: one dict per serving row not expressible, with the reason."""

    rows: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self, chip_stated_only: bool = False) -> dict[str, dict[str, float]]:
        """Per kind (TTFT, ITL, throughput): rows, median and worst |error|, shares within 15 and
        25 %; ``chip_stated_only``: over the rows whose source names the chip."""
        out = {}
        for kind in ("TTFT", "ITL", "throughput"):
            errs = [abs(r["error"]) for r in self.rows if r["kind"] == kind and (r["chip_stated"] or not chip_stated_only)]
            if errs:
                out[kind] = {"rows": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
                             "within_15": sum(e <= 0.15 for e in errs) / len(errs),
                             "within_25": sum(e <= 0.25 for e in errs) / len(errs)}
        return out

    def table(self) -> str:
        lines = [f"{'id':>4} {'model':<24} {'stack':<20} {'cards':>5} {'load':<16} {'in/out':>9} {'metric':<44} "
                 f"{'published':>10} {'simulated':>10} {'error':>7}"]
        for r in self.rows:
            lines.append(f"{r['id']:>4} {r['model'][:24]:<24} {r['stack']:<20} {r['cards']:>5} {r['load']:<16} "
                         f"{r['prompt']:>4}/{r['output']:<4} {r['metric'][:44]:<44} {r['published']:>10.4g} "
                         f"{r['simulated']:>10.4g} {r['error']:>+7.0%}")
        for only, title in ((False, "all rows"), (True, "rows whose source names the chip")):
            lines.append("")
            lines.append(f"{title}:")
            for kind, s in self.summary(only).items():
                lines.append(f"  {kind:<10} {s['rows']:>2} rows: median |error| {s['median_abs_error']:.0%}, worst "
                             f"{s['worst_abs_error']:.0%}, within 15 % {s['within_15']:.0%}, within 25 % "
                             f"{s['within_25']:.0%}")
        lines.append("")
        lines.append(f"not expressible ({len(self.skipped)} rows):")
        for s in self.skipped:
            lines.append(f"{s['id']:>4} {s['model'][:24]:<24} {s['metric'][:44]:<44} {s['reason']}")
        assumed = sorted({a for r in self.rows for a in r["assumed"]})
        if assumed:
            lines.append("")
            lines.append("assumed:")
            lines.extend(f"  - {a}" for a in assumed)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped, "summary": self.summary(),
                "summary_chip_stated": self.summary(True), "runs": self.runs}


# ---- reading a row --------------------------------------------------------------------------------


class NotExpressible(Exception):
    """A published serving row the workbench cannot run as it was measured (the message says why)."""


def _int(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+)\s*(\(presumed\)|\(default\))?\s*", text or "")
    return int(m.group(1)) if m else None


def is_serving_row(row: dict[str, str]) -> bool:
    """A row measured through a serving stack (vLLM-Ascend, MindIE), not a fixed-batch or micro row."""
    fw = row["framework"].lower()
    return ("vllm" in fw or "mindie" in fw) and not row["model"].startswith("(micro)")


def _load(row: dict[str, str]) -> tuple[float, int | None]:
    batch = row["batch"]
    m = re.match(r"rate=([\d.]+) req/s$", batch)
    if m:
        return float(m.group(1)), None
    m = re.match(r"concurrency=(\d+)( \(AISBench batch_size\))?$", batch)   # AISBench's batch_size: requests in flight
    if m:
        return math.inf, int(m.group(1))
    raise NotExpressible(f"load not stated ({batch or 'empty'}): neither a request rate nor a concurrency")


def _lengths(row: dict[str, str]) -> tuple[int, int]:
    p, o = _int(row["prompt_len"]), _int(row["output_len"])
    if p is not None and o is not None:
        return p, o
    if "sharegpt" in row["prompt_len"].lower():
        raise NotExpressible("ShareGPT sample: only its mean lengths are published, not the requests' own")
    why = []
    if p is None:
        why.append(f"prompt length not stated as a number ({row['prompt_len']!r})")
    if o is None and row["output_len"].startswith("max"):
        why.append(f"output length only a cap ({row['output_len']!r}): how many tokens each request generated is "
                   "not stated")
    elif o is None:
        why.append(f"output length not stated ({row['output_len']!r})")
    raise NotExpressible("; ".join(why))


def _requests(row: dict[str, str]) -> int:
    m = re.search(r"(\d+) (?:prompts|requests)\b|num_prompts: (\d+)", row["notes"] + " " + row["quote"])
    if not m:
        raise NotExpressible("number of requests not stated")
    return int(m.group(1) or m.group(2))


def _precision(row: dict[str, str], assumed: list[str]) -> str:
    t = row["precision"].lower()
    if "w4a4" in t:
        raise NotExpressible("W4A4 weights: the engine models fp16, bf16, w8a16 and w8a8")
    if "w8a8" in t or "int8" in t:
        return "w8a8"
    if "bf16" in t:
        return "bf16"
    if "fp16" in t:
        return "fp16"
    assumed.append("precision not stated: bf16 (vLLM's dtype auto takes the config's torch_dtype)")
    return "bf16"


# vllm-ascend releases (major, minor) whose graph mode has a preset of its own: the host time per layer measured on it
RELEASE_STACKS = {(0, 18): "vllm-ascend-aclgraph-0.18"}   # issue #9404, v0.18.0rc1


def _stack(row: dict[str, str], assumed: list[str]) -> str:
    fw = row["framework"].lower()
    if "mindie" in fw:
        return "mindie"
    if "eager" in fw or "enforce_eager" in row["notes"]:
        return "vllm-ascend-eager"
    m = re.search(r"vllm-ascend\s+v?(\d+)\.(\d+)\.(\d+)", fw)
    if m and tuple(int(x) for x in m.groups()) < (0, 9, 0):
        assumed.append(f"vllm-ascend v{'.'.join(m.groups())} ran eager: graph mode came with the V1 engine in "
                       "v0.9.0rc1")
        return "vllm-ascend-eager"
    if m and (int(m.group(1)), int(m.group(2))) in RELEASE_STACKS:
        return RELEASE_STACKS[int(m.group(1)), int(m.group(2))]
    return "vllm-ascend-aclgraph"



ASYNC_FROM = (0, 14, 0)   # vLLM v0.14.0: async scheduling on by default


def _async_scheduling(row: dict[str, str], stack: str, assumed: list[str]) -> bool:
    """vLLM's async scheduling for a vLLM-Ascend row: on from vLLM (and vllm-ascend) v0.14.0."""
    if stack == "mindie":
        return False
    fw = row["framework"].lower()
    m = re.search(r"vllm-ascend\s+v?(\d+)\.(\d+)\.(\d+)", fw) or re.search(r"vllm\s+v?(\d+)\.(\d+)\.(\d+)", fw)
    if not m:
        assumed.append(f"vLLM version not stated ({row['framework']!r}): synchronous scheduling")
        return False
    return tuple(int(x) for x in m.groups()) >= ASYNC_FROM


def _chip(row: dict[str, str], assumed: list[str]) -> str:
    c = row["chip"]
    if "800I A2" in c:
        return "Atlas 800I A2"
    m = re.search(r"910B(\d)", c)
    if m:
        return f"Ascend910B{m.group(1)}"
    assumed.append(f"chip {c!r}: the Ascend910B2 preset")
    return "Ascend910B2"


def _cards(row: dict[str, str], assumed: list[str]) -> tuple[int, int]:
    cards = _int(row["cards"])
    if cards is None:
        raise NotExpressible(f"cards not stated ({row['cards']!r})")
    if "presumed" in row["cards"]:
        assumed.append(f"cards {row['cards']!r}: {cards}")
    tp = _int(row["tp"])
    if tp is None:
        if cards > 1:
            raise NotExpressible(f"tensor parallelism not shown for {cards} cards (tp {row['tp']!r})")
        tp = 1
    return cards, tp


def express(row: dict[str, str]) -> tuple[Run, list[str]]:
    """The run a serving row describes and what it had to assume; `NotExpressible` gives every
    reason it cannot be run, joined by "; "."""
    assumed: list[str] = []
    reasons: list[str] = []
    got: dict[str, Any] = {}

    def attempt(name: str, fn, *args) -> None:
        try:
            got[name] = fn(*args)
        except NotExpressible as e:
            reasons.append(str(e))

    if "heavily overloaded" in row["notes"]:
        reasons.append("an issue report of an overloaded server (requests arrive faster than it serves them): its "
                       "TTFT is queueing that grows with the run's length, and its served rate is far below what the "
                       "same software serves in the other rows, a failure the report does not explain")
    if "CI baseline" in row["metric"]:
        reasons.append("a CI regression gate's baseline (a run passes at >= 0.97 x it), not one measurement")
    elif row["metric"] not in METRICS:
        reasons.append(f"metric {row['metric']!r}: not a mean TTFT, TPOT or output throughput of the benchmark")
    if row["model"] not in MODELS:
        reasons.append(f"model {row['model']!r}: no known config (pypto_lab/llm/configs.py)")
    attempt("load", _load, row)
    attempt("lengths", _lengths, row)
    attempt("requests", _requests, row)
    attempt("precision", _precision, row, assumed)
    attempt("cards", _cards, row, assumed)
    if reasons:
        raise NotExpressible("; ".join(reasons))
    model, note = MODELS[row["model"]]
    if note:
        assumed.append(f"{row['model']}: {note}")
    (rate, concurrency), (prompt, output), (cards, tp) = got["load"], got["lengths"], got["cards"]
    stack = _stack(row, assumed)
    return Run(model, _chip(row, assumed), cards, tp, stack, got["precision"], got["requests"], prompt,
               output, rate, concurrency, _async_scheduling(row, stack, assumed)), assumed


def read_rows(path: str | Path = DATA) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def plan(rows: list[dict[str, str]] | None = None) -> tuple[list[tuple[dict, Run, list[str]]], list[dict[str, Any]]]:
    """Every serving row as (row, its run, what was assumed), and the rows that cannot be run."""
    todo, skipped = [], []
    for row in rows if rows is not None else read_rows():
        if not is_serving_row(row):
            continue
        try:
            run, assumed = express(row)
        except NotExpressible as e:
            skipped.append({"id": int(row["id"]), "model": row["model"], "metric": row["metric"], "reason": str(e)})
            continue
        todo.append((row, run, assumed))
    return todo, skipped


# ---- running ----------------------------------------------------------------------------------------


def atlas_800i_a2():
    """The Ascend910B4 preset with the 64 GB HBM of the Atlas 800I A2's bin (the Atlas800I-A2 topology)."""
    return dataclasses.replace(get_chip("Ascend910B4"), hbm_bytes=64 * 2 ** 30)


def simulate(run: Run, progress: bool = False):
    """`serve` for ``run`` (the `ServeReport`)."""
    chip = atlas_800i_a2() if run.chip == "Atlas 800I A2" else run.chip
    return serve(run.model, chip=chip, requests=run.requests, rate=run.rate, concurrency=run.concurrency,
                 cards=run.cards, tp=run.tp, precision=run.precision, stack=run.stack,
                 lengths=[(run.prompt, run.output)] * run.requests, max_batched_tokens=MAX_BATCHED_TOKENS,
                 max_num_seqs=MAX_NUM_SEQS, block_size=BLOCK_SIZE, progress=progress,
                 async_scheduling=run.async_scheduling)


def validate_serving(rows: list[dict[str, str]] | None = None, progress: bool = False) -> ServingValidation:
    """Run every expressible serving row (one simulation per distinct run) against its figure."""
    todo, skipped = plan(rows)
    reports: dict[Run, Any] = {}
    out = []
    for row, run, assumed in todo:
        if run not in reports:
            reports[run] = simulate(run, progress)
        rep = reports[run]
        kind, get = METRICS[row["metric"]]
        published, simulated = float(row["value"]), float(get(rep))
        out.append({"id": int(row["id"]), "model": row["model"], "config": run.model, "chip": run.chip,
                    "cards": run.cards, "tp": run.tp, "stack": run.stack, "precision": run.precision,
                    "load": run.load, "requests": run.requests, "prompt": run.prompt, "output": run.output,
                    "metric": row["metric"], "kind": kind, "unit": row["unit"], "published": published,
                    "simulated": simulated, "error": (simulated - published) / published, "assumed": assumed,
                    "chip_stated": not any(a.startswith("chip ") for a in assumed),
                    "notes": row["notes"], "source": row["source_url"]})
    runs = {f"{r.model} {r.chip} x{r.cards} {r.stack} {r.load} {r.prompt}/{r.output}": {
        "ttft_ms_mean": rep.ttft_ms_mean, "tpot_ms_mean": rep.tpot_ms_mean, "output_tokens_per_s": rep.output_tokens_per_s,
        "mean_batch_size": rep.mean_batch_size, "steps": rep.steps, "preemptions": rep.preemptions}
        for r, rep in reports.items()}
    return ServingValidation(out, skipped, runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pypto_lab.llm.serving_validation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the rows, the skipped rows and the summary here")
    ap.add_argument("--progress", action="store_true", help="a progress bar per run")
    args = ap.parse_args(argv)
    if args.json:
        from ..files.atomic import check_writable
        check_writable(args.json, "--json", "out/serving_validation.json")
    result = validate_serving(progress=args.progress)
    print(result.table())
    if args.json:
        from ..files.atomic import write_json_atomic
        write_json_atomic(args.json, result.to_dict())
        print(f"wrote {args.json}")
    return 0


__all__ = ["DATA", "MODELS", "NotExpressible", "Run", "ServingValidation", "express", "is_serving_row", "plan",
           "read_rows", "simulate", "validate_serving"]


if __name__ == "__main__":
    raise SystemExit(main())
