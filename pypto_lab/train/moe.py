"""Mixture-of-experts layers of a training step: capturing them, finding their experts in the joint
graph, and what expert parallelism changes on one card.

* **Capture.** transformers runs a MoE layer's experts with ``torch.nn.functional.grouped_mm`` /
  ``torch._grouped_mm`` when it can (``transformers.integrations.moe._can_use_grouped_mm``); their
  meta kernels refuse fp32 inputs, so a config built on the meta device does not trace.
  `grouped_mm_fallback` makes transformers take its own fallback for the capture: the custom op
  ``transformers::grouped_mm_fallback`` (forward) and ``::grouped_mm_fallback_backward`` (one node
  each in the joint graph, opaque to AOT autograd), which the lowering table runs as CANN's
  GroupedMatmul (`pypto_lab.lowering.train_ops.grouped_matmul_backward`). The routing around them
  is plain ATen: ``topk`` of the router's scores, ``sort`` of the chosen expert ids, ``index`` to
  gather the tokens' rows in expert order, ``histc`` to count each expert's tokens, and an
  ``index_put`` of the inverse permutation to put the results back.
* **Roles.** `MoeGraph` finds every grouped matmul, its expert weights (parameters shaped
  ``[E, K, N]``) and the routing ops of the same layer, and names each routing op after the CANN
  MoE kernel that does its work on Ascend (`ROLE`: MoeGatingTopK, MoeInitRouting,
  MoeComputeExpertTokens, MoeFinalizeRouting; torch_npu's ``npu_moe_gating_top_k``,
  ``npu_moe_init_routing``, ``npu_moe_compute_expert_tokens``, ``npu_moe_finalize_routing``, as
  vllm-ascend calls them). Each op keeps its own cost: the eager path runs them as separate kernels;
  that the fused CANN kernels would do the routing in fewer passes is not modelled.
* **Expert parallelism** (``ep``; Megatron-Core's ``--expert-model-parallel-size``): each card of an
  expert-parallel group holds ``E / ep`` experts, so their weights, gradients and optimizer state
  divide by ``ep``; routing is assumed **balanced** (every expert gets the same share of the
  tokens), so a card's grouped matmuls still compute ``tokens x top-k`` rows, now over its ``E / ep``
  experts. Each MoE layer moves the routed rows with an all-to-all before its experts (dispatch)
  and one after (combine), and their gradients the same way back in the backward: 2 + 2 per layer
  and micro-batch, each of ``tokens x top-k x hidden`` elements per card, over the ``ep`` ranks
  ``tp`` apart, on the critical path (Megatron's ``alltoall`` token dispatcher waits for them;
  MindSpeed's ``--moe-alltoall-overlap-comm`` (``mindspeed/arguments.py``) overlaps them with the
  experts' compute, not modelled here). The experts' gradients are reduced over the expert data
  parallel group only: Megatron-Core (``megatron/core/parallel_state.py``,
  ``initialize_model_parallel``) builds it as ``world / (etp x ep x pp)`` ranks, with the expert
  tensor-parallel size ``etp`` equal to ``tp`` by default: ``dp x cp / ep`` ranks, ``tp x ep``
  apart (expert rank order ``tp-ep-dp-pp``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

GROUPED = ("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
GROUPED_BACKWARD = ("transformers.grouped_mm_fallback_backward.default",)

# the CANN MoE kernel whose work a routing op of a MoE layer does (see the module docstring)
ROLE = {
    "aten.topk.default": "MoeGatingTopK",
    "aten.sort.default": "MoeInitRouting",
    "aten.histc.default": "MoeComputeExpertTokens",
    "aten.index_put.default": "MoeFinalizeRouting",
}


@contextlib.contextmanager
def grouped_mm_fallback():
    """While a step is captured, transformers' MoE experts take its grouped-matmul fallback (a
    custom op per grouped matmul, forward and backward) instead of ``torch._grouped_mm``, whose
    meta kernel refuses fp32. Nothing happens when transformers has no such switch."""
    try:
        from transformers.integrations import moe
    except ImportError:   # pragma: no cover - transformers is a dependency
        yield
        return
    saved = getattr(moe, "_can_use_grouped_mm", None)
    if saved is None:
        yield
        return
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = saved


def _target(node: torch.fx.Node) -> str:
    return str(node.target)


@dataclass
class MoeGraph:
    """The MoE layers of a captured step (``step``: a `pypto_lab.train.capture.StepGraph`)."""

    experts: int = 0                                   # experts per MoE layer (E); 0: no MoE layer
    top_k: int = 0
    expert_params: set[str] = field(default_factory=set)   # parameters holding every expert ([E, K, N])
    grouped: set[torch.fx.Node] = field(default_factory=set)   # grouped matmuls, forward and backward
    role: dict[torch.fx.Node, str] = field(default_factory=dict)   # routing node -> its CANN MoE kernel

    @classmethod
    def of(cls, step) -> MoeGraph:
        out = cls()
        pnode = {n: p for p, n in step.params.items()}
        for n in step.forward + step.backward:
            t = _target(n)
            if t in GROUPED or t in GROUPED_BACKWARD:
                out.grouped.add(n)
            if t in GROUPED and len(n.args) > 1 and isinstance(n.args[1], torch.fx.Node):
                w = step.base.get(n.args[1], n.args[1])
                if w in pnode:
                    out.expert_params.add(pnode[w])
                    out.experts = max(out.experts, int(w.meta["val"].shape[0]))
            if t == "aten.topk.default" and len(n.args) > 1:
                out.top_k = max(out.top_k, int(n.args[1]))
        if out.grouped:
            out.role = {n: ROLE[_target(n)] for n in step.forward if _target(n) in ROLE}
        return out

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


def local_experts(experts: int, ep: int) -> int:
    """Experts one card of an expert-parallel group of ``ep`` holds."""
    return max(1, experts // max(1, ep))


def grouped_dims(rows: int, experts: int) -> tuple[int, int]:
    """(batch, rows per batch entry) of a grouped matmul over ``rows`` routed rows and ``experts``
    experts, balanced: every expert that gets a token is one batch entry of the Cube kernel
    reading its whole weight, the rows spread evenly (at most ``rows`` experts are busy)."""
    busy = max(1, min(experts, rows))
    return busy, max(1, math.ceil(rows / busy))


__all__ = ["GROUPED", "GROUPED_BACKWARD", "ROLE", "MoeGraph", "grouped_dims", "grouped_mm_fallback", "local_experts"]
