#!/usr/bin/env python3
"""The training-configuration search on Llama-2-70B, 64 x Ascend910B2, global batch 1,024 x 4,096.

    python benchmarks/bench_train_search.py [--workers 2] [--top 15] [--check 3] [--json PATH]

Times `pypto_lab.explore.train_search.search_layouts` end to end (the Dask LocalCluster's start
included) over every layout Megatron allows: tp 1-8 within a server, pp dividing the 80 layers,
vpp up to 8 chunks per stage, cp 1-8, micro-batch sizes 1, 2 and 4, Megatron's distributed
optimizer or not, recomputation none / selective / full (the least that fits). The model and
options are those of ModelLink's Llama-2-70B example script (`pypto_lab/validation/training_rows.py`,
``SCRIPTS``): bf16, FlashAttention, fused RMSNorm / SwiGLU / rotary (the MindSpeed stack's
fusions), ``--use-mc2``. Prints the fastest layouts, why the best wins, where the script's own
layout (tp 8, pp 4, 5 layers per virtual stage, micro-batch 1) ranks, and with ``--check N`` the
top N rerun by `simulate_step` (exact kernel costs; not timed) against the search's figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def llama2_70b():
    import transformers

    # examples/mcore/llama2/pretrain_llama2_70b_ptd.sh: 80 layers, hidden 8192, ffn 28672, 64 heads, 8 query groups
    return transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                    num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                                    max_position_embeddings=4096)


def main(argv=None) -> int:
    from pypto_lab.explore.train_search import describe, search_layouts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--check", type=int, default=0, help="rerun the best N layouts with simulate_step")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cfg = llama2_70b()
    t0 = time.perf_counter()
    s = search_layouts(cfg, 64, 1024, 4096, chip="Ascend910B2", mc2=True, n_workers=args.workers)
    wall = time.perf_counter() - t0
    print(s.table(args.top))
    print()
    print(s.why())
    script = next((i for i, r in enumerate(s.rows, 1) if (r["tp"], r["pp"], r["vpp"], r["cp"], r["micro_batch"],
                                                          r["zero"]) == (8, 4, 4, 1, 1, 0)), None)
    if script is not None:
        r = s.rows[script - 1]
        print(f"\nthe example script's layout ({describe(r)}) ranks {script} of {len(s.rows)}: "
              f"{r['tokens_per_s_per_card']:,.1f} tokens/s per card")
    busy = sorted(s.group_seconds, reverse=True)
    print(f"\nwall clock {wall:.1f} s on {s.workers} workers ({s.groups} captures; busiest capture group "
          f"{busy[0]:.1f} s, all groups {sum(busy):.1f} s of worker time, {s.cpu_seconds:.1f} s of worker CPU: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in s.phases.items()) + ")")
    if args.check:
        import torch

        from pypto_lab.train import simulate_step

        print("\nthe best layouts rerun by simulate_step (exact kernel costs):")
        for r in s.rows[:args.check]:
            ids = torch.zeros(r["micro_batch"], 4096, dtype=torch.long)
            rep = simulate_step(cfg, {"input_ids": ids}, chip="Ascend910B2", **r["args"])
            print(f"  {describe(r)}: search {r['tokens_per_s_per_card']:,.1f}, simulate_step "
                  f"{rep.tokens_per_s_per_card:,.1f} tokens/s per card "
                  f"({rep.tokens_per_s / r['tokens_per_s'] - 1:+.2%})")
    if args.json:
        from pypto_lab.files.atomic import write_json_atomic

        write_json_atomic(args.json, {**s.to_dict(), "wall_seconds": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
