#!/usr/bin/env python3
"""Decode TPOT of DeepSeek-V3.2, Qwen3-Next and GLM-4.5 with the workbench's pto kernels plugged into
the LLM engine's decode step (`pypto_lab.llm.plug`) against the engine's own kernels, and DeepSeek
Sparse Attention against dense MLA across contexts. Every figure is the simulator's.

    python benchmarks/day0_plugged.py [--prompt 32768] [--output 64] [--batch 1] [--json PATH]

Setups (each model on cards its weights, KV cache and activations fit, Ascend910B1, the default
stack): DeepSeek-V3.2 on 16 cards in w8a16 (671 B parameters), Qwen3-Next-80B-A3B on 4 cards in
fp16, GLM-4.5 on 16 cards in fp16 (the fused MoE kernel reads its experts in the activation dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pypto_lab.files.atomic import write_text_atomic  # noqa: E402
from pypto_lab.llm import plug  # noqa: E402
from pypto_lab.llm.configs import spec_of  # noqa: E402
from pypto_lab.llm.engine import hardware, simulate_generation  # noqa: E402
from pypto_lab.llm.forward import forward_kernels, step_time_us  # noqa: E402

SETUPS = [
    ("deepseek-v3.2", dict(cards=16, precision="w8a16"), "attention", plug.sparse_mla_attention),
    ("deepseek-v3.2", dict(cards=16, precision="w8a16"), "attention", plug.dense_mla_attention),
    ("qwen3-next", dict(cards=4), "linear_attention", plug.gated_delta_rule),
    ("glm-4.5", dict(cards=16), "moe", plug.fused_moe),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32768)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = []
    print(f"batch {a.batch}, {a.prompt:,} prompt + {a.output} output tokens, Ascend910B1")
    print("| model | cards | plugged layer | kernel | µs per call (SIM) | calls per step | TPOT default (ms) "
          "| TPOT plugged (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, kw, kind, make in SETUPS:
        t0 = time.perf_counter()
        base = simulate_generation(name, batch=a.batch, prompt_len=a.prompt, output_len=a.output, **kw)
        r = simulate_generation(name, batch=a.batch, prompt_len=a.prompt, output_len=a.output,
                                kernels={kind: make()}, **kw)
        (p,) = r.plugged
        setup = f"{kw['cards']} x {kw.get('precision', 'fp16')}"
        print(f"| {name} | {setup} | {kind} | `{p['kernel']}` | {p['us_per_call']:.2f} | {p['calls_per_step']} | "
              f"{base.tpot_ms:.3f} | {r.tpot_ms:.3f} |")
        rows.append({"model": name, "setup": setup, "kind": kind, **p, "tpot_default_ms": base.tpot_ms,
                     "tpot_plugged_ms": r.tpot_ms, "wall_s": time.perf_counter() - t0})
    spec = spec_of("deepseek-v3.2")
    hw = hardware("Ascend910B1", cards=16, precision="w8a16")
    plugs = {"sparse": plug.resolve(spec, hw, {"attention": plug.sparse_mla_attention()}),
             "dense": plug.resolve(spec, hw, {"attention": plug.dense_mla_attention()}), "default": None}
    print(f"\nDeepSeek-V3.2 decode step (ms), batch {a.batch}, 16 x w8a16: sparse attention kernel (with the "
          "indexer's kernels) / dense MLA kernel (no indexer) / the engine's own kernels")
    print("| context | sparse | dense | engine default |")
    print("|---|---|---|---|")
    for c in (4096, 16384, 65536, 131072):
        t = {n: step_time_us(forward_kernels(spec, hw, decode=[c] * a.batch, plugged=p), hw.stack) / 1000
             for n, p in plugs.items()}
        print(f"| {c:,} | {t['sparse']:.3f} | {t['dense']:.3f} | {t['default']:.3f} |")
        rows.append({"model": "deepseek-v3.2", "context": c, "step_ms": t})
    if a.json:
        write_text_atomic(a.json, json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
