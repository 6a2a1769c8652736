#!/usr/bin/env python3
"""Expert parallelism on a Mixtral-8x7B-shaped training step, 8 x Ascend910B2, ep 1 / 2 / 4 / 8.

    python benchmarks/bench_train_ep.py [--seq 4096] [--layers 32] [--json PATH]

The model is Mixtral-8x7B's configuration (hidden 4096, expert FFN 14336, 32 layers, 8 experts,
top-2, 32 heads, 8 key/value heads, vocabulary 32000), trained in bf16 under the MindSpeed stack
with Megatron's distributed optimizer and full recomputation, micro-batch 1 x ``--seq`` tokens, 8
micro-batches per step, data parallel over the 8 cards with ``ep`` of them expert parallel. For
each ep it prints what one card holds (the experts' share of the weights, the peak HBM against
the card's) and, when the step fits, its time, the all-to-alls' share of it and tokens/s per
card; a layout that does not fit prints the HBM it would need. Routing is assumed balanced (see
`pypto_lab.train.moe`). Every figure is the simulator's; nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def mixtral_8x7b(layers: int):
    import transformers

    # mistralai/Mixtral-8x7B-v0.1 config.json
    return transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                      num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768)


def main(argv=None) -> int:
    import torch

    from pypto_lab.train.step import prepare_step

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = mixtral_8x7b(args.layers)
    batch = {"input_ids": torch.zeros(1, args.seq, dtype=torch.long)}
    gib = 2 ** 30
    rows = []
    print(f"Mixtral-8x7B-shaped ({args.layers} layers), 8 x Ascend910B2, bf16, distributed optimizer, full "
          f"recomputation, micro-batch 1 x {args.seq}, 8 micro-batches")
    print(f"{'ep':>3} {'experts/card':>12} {'weights GiB':>11} {'peak GiB':>9} {'step ms':>9} {'a2a ms/mb':>10} "
          f"{'tokens/s/card':>13}")
    for ep in (1, 2, 4, 8):
        prep, layout = prepare_step(cfg, batch, chip="Ascend910B2", cards=8, ep=ep, precision="bf16",
                                    distributed_optimizer=True, recompute="full", micro_batches=8)
        memory, peak = prep.memory(layout)
        row = {"ep": ep, "weights_gib": memory["weights"] / gib, "peak_gib": peak / gib,
               "hbm_gib": prep.chip.hbm_bytes / gib}
        if peak <= prep.chip.hbm_bytes:
            r = prep.report(layout)
            row.update(step_ms=r.step_ms, ep_comm_ms=r.ep_comm_ms, tokens_per_s_per_card=r.tokens_per_s_per_card)
            tail = f"{r.step_ms:9.1f} {r.ep_comm_ms:10.2f} {r.tokens_per_s_per_card:13,.0f}"
        else:
            tail = f"does not fit ({row['hbm_gib']:.0f} GiB per card)"
        rows.append(row)
        print(f"{ep:>3} {8 // ep:>12} {row['weights_gib']:11.1f} {row['peak_gib']:9.1f} {tail}")
    if args.json:
        from pypto_lab.files.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
