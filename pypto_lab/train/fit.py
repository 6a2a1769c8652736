"""When a training step does not fit: the changes that would make it fit, cheapest first, each with
the HBM per card it would need.

The candidates change one thing of the layout at a time, keeping the cards and the global batch:
shard the optimizer state (ZeRO-1, or Megatron's distributed optimizer), then the gradients
(ZeRO-2), recompute selectively, split the model over twice the pipeline stages or tensor-parallel
cards (halving data parallelism, doubling the micro-batches per step to keep the global batch),
shard the weights too (ZeRO-3 / FSDP), recompute every layer; and, for a model with repeated
blocks, a few combinations of two. They are listed in that order, which is the order of what they
usually cost in time (Megatron-LM's and DeepSpeed's performance guidance: a sharded optimizer only
moves the gradient all-reduce's bytes into a reduce-scatter and an all-gather; a pipeline adds a
bubble of ``(pp - 1) / (m + pp - 1)``; full recomputation reruns every forward, about a third more
compute); `fitting_changes` computes each candidate's memory from the same step plan, without
costing any kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .parallel import Layout


def _candidates(layout: Layout, megatron: bool, layers: int, max_tp: int) -> list[tuple[str, Layout]]:
    out: list[tuple[str, Layout]] = []
    group = layout.dp * layout.cp
    rep = dataclasses.replace
    if group > 1 and not (layout.zero or layout.distributed_optimizer):
        out.append(("distributed_optimizer=True" if megatron else "zero=1",
                    rep(layout, distributed_optimizer=True) if megatron else rep(layout, zero=1)))
    if group > 1 and layout.zero < 2 and not layout.distributed_optimizer:
        out.append(("zero=2", rep(layout, zero=2)))
    if layout.recompute is None:
        out.append(("recompute='selective'", rep(layout, recompute="selective")))
    if layout.dp % 2 == 0 and layers and layers % (2 * layout.pp * layout.vpp) == 0:
        out.append((f"pp={2 * layout.pp} (dp={layout.dp // 2}, micro_batches={2 * layout.micro_batches})",
                    rep(layout, pp=2 * layout.pp, dp=layout.dp // 2, micro_batches=2 * layout.micro_batches)))
    if layout.dp % 2 == 0 and 2 * layout.tp <= max_tp:
        out.append((f"tp={2 * layout.tp} (dp={layout.dp // 2}, micro_batches={2 * layout.micro_batches})",
                    rep(layout, tp=2 * layout.tp, dp=layout.dp // 2, micro_batches=2 * layout.micro_batches,
                        sequence_parallel=layout.sequence_parallel or megatron)))
    if group > 1 and layout.zero < 3 and not layout.distributed_optimizer:
        out.append(("zero=3" if not megatron else "zero=3 (FSDP full_shard)", rep(layout, zero=3)))
    if layout.recompute != "full" or layout.recompute_layers is not None:
        out.append(("recompute='full'", rep(layout, recompute="full", recompute_layers=None)))
    singles = list(out)
    # a few pairs: a sharded optimizer with recomputation or a deeper pipeline
    first = singles[0][1] if singles and singles[0][0].startswith(("zero=1", "distributed")) else None
    if first is not None:
        for label, lay in singles[1:]:
            if label.startswith(("pp=", "recompute='full'", "tp=")):
                merged = dataclasses.replace(lay, zero=first.zero, distributed_optimizer=first.distributed_optimizer)
                out.append((f"{singles[0][0]} and {label}", merged))
    return out


def fitting_changes(layout: Layout, memory_of: Callable[[Layout], int], capacity: int, megatron: bool = False,
                    layers: int = 0, max_tp: int = 8, limit: int = 3) -> list[tuple[str, int]]:
    """Up to ``limit`` changes of ``layout`` after which a rank's memory (``memory_of(layout)``,
    bytes) fits ``capacity``, cheapest first, each with its memory."""
    fits: list[tuple[str, int]] = []
    for label, lay in _candidates(layout, megatron, layers, max_tp):
        try:
            need = memory_of(lay)
        except ValueError:   # a layout the model cannot take (a tensor-parallel split it does not divide)
            continue
        if need <= capacity:
            fits.append((label, need))
            if len(fits) >= limit:
                break
    return fits


__all__ = ["fitting_changes"]
