#!/usr/bin/env python3
"""The fitted constants of the software stacks.

    python scripts/derive_stack_constants.py            # prints both derivations and the values
    python scripts/derive_stack_constants.py --check    # exit 1 unless the presets carry them

1. The eager stacks' ``dispatch_us``, torch_npu's host time to dispatch one kernel (below).
2. ``torchair-graph``'s ``ifa_overhead_us``: device time per run of IncreFlashAttention over a
   preallocated KV cache that the chip model does not produce. It was first taken for the AICPU
   tiling of the tiling sink ("IFA算子计算优化+tiling全下沉", torchair's Llama and Qwen2 READMEs),
   but the READMEs' own history says otherwise: the Qwen2 batch-size tables (Ascend/torchair@e45676cf,
   2024-07-08) were measured before that port passed actual_seq_lengths or set
   tiling_schedule_optimize (81386be4, 2024-07-29) and need the same per-layer time, and
   Llama-3-70B's decode moved by at most 2 ms per step when its README switched the sink on
   (npu_tuned_model/llm/llama/README.md at 22b4b38e: 37.4-48.2 ms at batch 1-32, at 72c6c63d:
   37-48 ms), where an AICPU tiling of this size would add 9 ms. Its origin is not identified. It
   is one constant of the stack, shared by every model and chip, fitted (least squares on relative
   error) to the published decode-step latencies of that README family
   (`pypto_lab.validation.llm_rows.fit_rows`: graph mode, models not held back), with the engine's
   decode step simulated without it; the leave-one-model-out values show how much it depends on
   any one model.

3. ``torch_npu-eager``'s ``host_op_us``: host time per operation of the model's own code in eager
   mode (its Python and the dispatcher's pass: views, reshapes, splits and no-op casts included,
   which launch no kernel), charged on the operations `pypto_lab.llm.forward.MODEL_CODE` counts in
   each torchair port's decoder layer, on top of ``dispatch_us`` for the kernels. One constant of
   the stack, fitted (least squares on relative error, golden-section search: the step is not
   additive in it, the device waiting only once the host is slower) to the published eager
   (单算子) decode-step latencies of torchair's READMEs (`pypto_lab.validation.llm_rows.fit_host_op_us`),
   with its leave-one-model-out values.

No public figure gives torch_npu's per-operator dispatch time (its TASK_QUEUE_ENABLE docs and the
MindStudio host-bound guides describe the mechanism without a number). One public log measures a
host-bound eager step: vLLM-Ascend's "Profile Execute Duration" guide
(vllm-project/vllm-ascend docs/source/developer_guide/performance/profile_execute_duration.md at
commit cff0e35034ba6c4b4d82a8227cb28829b8ec808d) prints, for the decode steps of
examples/offline_inference_npu.py (Qwen/Qwen2.5-0.5B-Instruct, four prompts), the device time of
each step's ``[forward]`` observed with NPU events: the eighteen values below, median 4.26 ms. A
0.5B model's decode step keeps the device busy about a millisecond (the engine's own figure is
printed below), so the step waits on the host: the device time is the host's dispatch of the
step's kernels. The value is the dispatch time at which the stack model
(`pypto_lab.stack.timeline`) runs the engine's decode step of that architecture (the known model
``qwen2-0.5b``: 24 layers, hidden 896, the same shapes as Qwen2.5-0.5B) in that median time.

One example log whose hardware and vLLM version the guide does not state: a low-confidence
figure, written as such in the presets' source fields.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pypto_lab.hw.chip import DEFAULT_CHIP  # noqa: E402
from pypto_lab.llm.configs import spec_of  # noqa: E402
from pypto_lab.llm.engine import hardware  # noqa: E402
from pypto_lab.llm.forward import forward_kernels, step_timeline  # noqa: E402
from pypto_lab.stack import get_stack  # noqa: E402

# [forward] of every decode step the guide's example output prints, in ms
FORWARD_MS = [4.14, 4.14, 3.99, 4.33, 4.20, 4.20, 4.19, 4.18, 4.42, 4.25, 4.24, 4.32, 4.28, 4.32, 4.27, 4.61,
              4.52, 4.42]
PROMPTS = 4          # the example's four prompts
CONTEXT = 60         # a mid-generation context: short prompts (6-9 tokens) with up to 100 new tokens
EAGER_STACKS = ("torch_npu-eager", "vllm-ascend-eager", "mindspeed")


def derive(chip: str = DEFAULT_CHIP) -> dict:
    """The dispatch time that makes the eager stack run the decode step in the median [forward]."""
    target_us = statistics.median(FORWARD_MS) * 1000
    spec = spec_of("qwen2-0.5b")
    base = get_stack("torch_npu-eager")
    hw = hardware(chip, stack=base)
    kernels = forward_kernels(spec, hw, decode=[CONTEXT] * PROMPTS)
    runs = sum(k.count for k in kernels)

    def step_us(h: float) -> float:
        return step_timeline(kernels, base.with_values(dispatch_us=h)).step_us

    device_us = step_us(0.0)
    lo, hi = 0.0, target_us
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step_us(mid) < target_us else (lo, mid)
    return {"median_forward_ms": target_us / 1000, "kernel_runs": runs, "device_busy_ms": device_us / 1000,
            "dispatch_us": round((lo + hi) / 2, 1), "chip": chip}


def derive_ifa_overhead() -> dict:
    """torchair-graph's ifa_overhead_us fitted to the published decode rows, and its leave-one-model-out values."""
    from pypto_lab.validation.llm_rows import (
        GRAPH_STACK,
        fit_ifa_overhead,
        fit_rows,
        fixed_batch,
        is_fixed_batch,
        read_rows,
        row_stack,
    )

    rows = [r for r in read_rows() if is_fixed_batch(r) and r["metric"].startswith("decode")
            and row_stack(r) == GRAPH_STACK]
    base = fixed_batch(rows, overrides={GRAPH_STACK: {"ifa_overhead_us": 0.0}})
    t, lomo = fit_ifa_overhead(base)
    used = fit_rows(base)
    return {"ifa_overhead_us": round(t, 1), "lomo": {m: round(v, 1) for m, v in lomo.items()},
            "rows": [f"{c.model} {c.row}" for c in used], "models": sorted({c.model for c in used})}


def derive_host_op_us() -> dict:
    """torch_npu-eager's host_op_us fitted to the published eager decode rows, and its leave-one-model-out values."""
    from pypto_lab.validation.llm_rows import eager_fit_rows, fit_host_op_us, read_rows

    rows = read_rows()
    fit = eager_fit_rows(rows)
    models = sorted({r["model"] for r in fit})
    return {"host_op_us": round(fit_host_op_us(rows), 1),
            "lomo": {m: round(fit_host_op_us(rows, exclude=m), 1) for m in models},
            "rows": [f"{r['model']} id {r['id']}" for r in fit], "models": models}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 unless the eager presets carry the derived value")
    args = ap.parse_args()
    d = derive()
    print(f"median [forward] {d['median_forward_ms']:.2f} ms over {len(FORWARD_MS)} decode steps; the engine's decode "
          f"step of qwen2-0.5b at batch {PROMPTS}: {d['kernel_runs']} kernel runs, {d['device_busy_ms']:.2f} ms of "
          f"device time on {d['chip']} with the stack's launches")
    print(f"dispatch_us = {d['dispatch_us']:.1f}  (host time per kernel that makes the step take the median)")
    a = derive_ifa_overhead()
    print(f"torchair-graph ifa_overhead_us = {a['ifa_overhead_us']:.1f}  (fitted on {len(a['rows'])} decode rows of "
          f"{', '.join(a['models'])}; leave one model out: "
          + ", ".join(f"without {m} {v:.1f}" for m, v in a["lomo"].items()) + ")")
    e = derive_host_op_us()
    print(f"torch_npu-eager host_op_us = {e['host_op_us']:.1f}  (fitted on {len(e['rows'])} eager decode rows of "
          f"{', '.join(e['models'])}; leave one model out: "
          + ", ".join(f"without {m} {v:.1f}" for m, v in e["lomo"].items()) + ")")
    if args.check:
        bad = [(n, "dispatch_us", get_stack(n).dispatch_us, d["dispatch_us"]) for n in EAGER_STACKS
               if abs(get_stack(n).dispatch_us - d["dispatch_us"]) > 0.05]
        if abs(get_stack("torchair-graph").ifa_overhead_us - a["ifa_overhead_us"]) > 0.05:
            bad.append(("torchair-graph", "ifa_overhead_us", get_stack("torchair-graph").ifa_overhead_us,
                        a["ifa_overhead_us"]))
        if abs(get_stack("torch_npu-eager").host_op_us - e["host_op_us"]) > 0.05:
            bad.append(("torch_npu-eager", "host_op_us", get_stack("torch_npu-eager").host_op_us, e["host_op_us"]))
        for name, key, value, derived in bad:
            print(f"{name}: {key} = {value}, derived {derived:.1f}: update the preset's value")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
