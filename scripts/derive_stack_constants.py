#!/usr/bin/env python3
"""The fitted constant of the eager software stacks: torch_npu's host time to dispatch one kernel.

    python scripts/derive_stack_constants.py            # prints the derivation and the value
    python scripts/derive_stack_constants.py --check    # exit 1 unless the eager presets carry it

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 unless the eager presets carry the derived value")
    args = ap.parse_args()
    d = derive()
    print(f"median [forward] {d['median_forward_ms']:.2f} ms over {len(FORWARD_MS)} decode steps; the engine's decode "
          f"step of qwen2-0.5b at batch {PROMPTS}: {d['kernel_runs']} kernel runs, {d['device_busy_ms']:.2f} ms of "
          f"device time on {d['chip']} with the stack's launches")
    print(f"dispatch_us = {d['dispatch_us']:.1f}  (host time per kernel that makes the step take the median)")
    if args.check:
        bad = [(n, get_stack(n).dispatch_us) for n in EAGER_STACKS if abs(get_stack(n).dispatch_us - d["dispatch_us"]) > 0.05]
        for name, value in bad:
            print(f"{name}: dispatch_us = {value}, derived {d['dispatch_us']:.1f}: update the preset's value")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
