"""Sharded data parallelism: what each rank holds of the weights, gradients and optimizer state
under ZeRO (DeepSpeed), FSDP's full_shard and Megatron's distributed optimizer, and the collectives
that keep the shards in step.

Memory per rank for ``n`` parameters trained with Adam in mixed precision (Rajbhandari et al.,
"ZeRO", SC'20, section 5 and figure 1: ``2 + 2 + 12`` bytes per parameter, ``K = 12``; Megatron-LM
``docs/source/distrib_optimizer.md``: bf16 weights with fp32 gradients take ``6 + 12 / d`` bytes with
the distributed optimizer, 18 without), over ``d`` data-parallel ranks:

=================================  ============  =============  ================================
                                   weights       gradients      fp32 master + optimizer state
=================================  ============  =============  ================================
data parallel (DDP, ZeRO-0)        all           all            all
ZeRO-1 / distributed optimizer     all           all            1/d
ZeRO-2                             all           1/d            1/d
ZeRO-3 / FSDP full_shard           1/d           1/d            1/d
=================================  ============  =============  ================================

Gradients are held in the weights' dtype, except that Megatron accumulates and reduces them in
fp32 when it trains in bf16 (``arguments.py``: ``--bf16`` sets ``accumulate_allreduce_grads_in_fp32``;
the ``main_grad`` buffers), the ``fp32_grads`` flag here.

The collectives (`dp_collectives`): plain data parallel all-reduces the gradients in buckets; a
sharded optimizer reduce-scatters them (each rank keeps the sum of its shard: half the traffic of an
all-reduce) and all-gathers the updated weights after the optimizer step; ZeRO-3 and FSDP instead
all-gather each layer's weights just before its forward and again before its backward, and
reduce-scatter its gradients right after (`pypto_lab.train.compose` overlaps them with the
neighbouring layers' compute, as FSDP's prefetch and DeepSpeed's ``overlap_comm`` do).
"""

from __future__ import annotations

from dataclasses import dataclass

from .parallel import Layout
from .policy import BYTES, Policy


@dataclass(frozen=True)
class StateBytes:
    """What one rank holds of a set of parameters, by kind, in bytes."""

    weights: float
    master: float
    gradients: float
    optimizer: float

    def as_dict(self, master_weights: bool) -> dict[str, int]:
        out = {"weights": int(self.weights)}
        if master_weights:
            out["master weights"] = int(self.master)
        out["gradients"] = int(self.gradients)
        out["optimizer state"] = int(self.optimizer)
        return out


def grad_bytes(policy: Policy, fp32_grads: bool) -> int:
    """Bytes of one gradient element (the dtype the gradients are accumulated and reduced in)."""
    return 4 if fp32_grads else BYTES[policy.param_dtype]


def state_bytes(params: float, trained: float, policy: Policy, layout: Layout, state_per_param: int,
                fp32_grads: bool) -> StateBytes:
    """One rank's share of ``params`` parameters (``trained`` of them with gradients and optimizer
    state; the rest frozen, as LoRA's base) under ``layout``'s sharding."""
    return StateBytes(
        weights=params * BYTES[policy.param_dtype] / layout.shards_weights,
        master=trained * 4 / layout.shards_optimizer if policy.master_weights else 0.0,
        gradients=trained * grad_bytes(policy, fp32_grads) / layout.shards_gradients,
        optimizer=trained * 4 * state_per_param / layout.shards_optimizer)


@dataclass(frozen=True)
class DPCollectives:
    """The data-parallel collectives of one step, per rank: the gradient reduction (``grad_kind``
    over the gradient buckets, "" without data parallelism), and after the optimizer the all-gather
    of updated weights (``param_gather_bytes``, 0 when nothing is sharded or ZeRO-3 gathers per
    layer); ``per_layer``: ZeRO-3 / FSDP's all-gathers and reduce-scatters around every layer."""

    grad_kind: str
    param_gather_bytes: float
    per_layer: bool


def dp_collectives(layout: Layout, trained_weight_bytes: float) -> DPCollectives:
    """The collectives ``layout`` runs over its data-parallel (and context-parallel) group."""
    group = layout.dp * layout.cp
    if group == 1:
        return DPCollectives("", 0.0, False)
    if layout.zero >= 3:
        return DPCollectives("reducescatter", 0.0, True)
    if layout.zero >= 1 or layout.distributed_optimizer:
        return DPCollectives("reducescatter", trained_weight_bytes, False)
    return DPCollectives("allreduce", 0.0, False)


__all__ = ["DPCollectives", "StateBytes", "dp_collectives", "grad_bytes", "state_bytes"]
