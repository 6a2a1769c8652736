"""The NPU kernel the 0-day model (`pypto_lab.llm.ling_like`) lacks: its group-limited top-k router
written in `pypto_lab.pto`, and the custom operator that plugs it into the model.

`optimize()` maps every ATen op of `LingLikeForCausalLM` to an NPU kernel except ``topk``: the
router's two top-k's (best groups, then best experts) run on the host. `gating_kernel(cfg)` is the
whole router as one Vector kernel (the approach of ``examples/kernels/moe_gating_topk.py``, adapted:
any token count, the routing scale, the GM dtype of the run with the router math in fp32);
`gating_op(cfg)` registers it as ``custom_op(npu_func=kernel)`` with `group_limited_topk` as the
reference; `use_pto_gating(model)` routes every layer of a model through that op.

The op returns ``(weights, ids)`` with ids as int32 (the kernel's index dtype); the model's combine
step widens them to int64 for ``scatter``.
"""

import torch

import pypto_lab.pto as pypto

from ..lowering.custom_ops import custom_op
from .ling_like import Gate, LingLikeConfig, LingLikeForCausalLM, group_limited_topk


def gating_kernel(cfg: LingLikeConfig, rows_per_tile: int | None = None):
    """A ``@pypto.jit`` kernel ``(logits [T, E], bias [E], weights [T, top_k], ids [T, top_k] int32)``
    computing `group_limited_topk` for the config's sizes; T and the float dtype come from the call
    (one trace per signature). The router math runs in fp32 whatever the GM dtype. ``rows_per_tile``
    tokens make one tile (default: all of them, one task per step); fewer rows spread each step over
    more Vector cores."""
    if rows_per_tile is not None and rows_per_tile < 1:
        raise ValueError(f"gating_kernel: rows_per_tile must be >= 1 (tokens per vector tile); got {rows_per_tile}. "
                         "Fix: pass a positive row count, or None for one tile of all tokens")
    e, g, gs, tg, k, scale = cfg.experts, cfg.expert_groups, cfg.group_size, cfg.topk_group, cfg.top_k, \
        cfg.routed_scaling

    @pypto.jit
    def ling_gating(logits: pypto.Tensor[...], bias: pypto.Tensor[...], weights: pypto.Tensor[...],
                    ids: pypto.Tensor[...]):
        t = logits.shape[0]
        r = t if rows_per_tile is None else min(rows_per_tile, t)
        pypto.set_vec_tile_shapes(r, e)
        scores = pypto.sigmoid(pypto.cast(logits, pypto.DT_FP32))
        biased = scores + pypto.cast(pypto.reshape(bias, [1, e]), pypto.DT_FP32)  # bias for the choice only

        # a group is worth its best biased expert; the topk_group best groups stay eligible
        pypto.set_vec_tile_shapes(r, g, gs)
        group_best = pypto.amax(pypto.reshape(biased, [t, g, gs]), dim=-1, keepdim=False)
        pypto.set_vec_tile_shapes(r, g)
        _, top_groups = pypto.topk(group_best, tg, -1, True)
        group_mask = pypto.scatter_(pypto.full([t, g], 0.0, pypto.DT_FP32), 1, top_groups, 1.0)

        # the group mask spread over its experts: experts of other groups score 0 (sigmoid scores are > 0)
        pypto.set_vec_tile_shapes(r, g, gs)
        expert_mask = pypto.expand_clone(pypto.reshape(group_mask, [t, g, 1]), [t, g, gs])
        pypto.set_vec_tile_shapes(r, e)
        eligible = pypto.where(pypto.eq(pypto.reshape(expert_mask, [t, e]), 0.0), 0.0, biased)
        _, top_ids = pypto.topk(eligible, k, -1, True)

        # the unbiased scores of the chosen experts, renormalised and scaled
        picked = pypto.gather(scores, 1, top_ids)
        pypto.set_vec_tile_shapes(r, k)
        w = picked / pypto.sum(picked, dim=-1, keepdim=True) * scale
        weights[:] = pypto.cast(w, weights.dtype)
        ids[:] = top_ids

    return ling_gating


def gating_op_name(cfg: LingLikeConfig) -> str:
    """One op per routing configuration (the reference closes over the sizes and the scale)."""
    scale = f"{cfg.routed_scaling:g}".replace(".", "p").replace("-", "m")
    return f"ling_gate_e{cfg.experts}_g{cfg.expert_groups}_tg{cfg.topk_group}_k{cfg.top_k}_s{scale}"


def gating_op(cfg: LingLikeConfig, kernel=None):
    """The custom operator ``(logits, bias) -> (weights, ids int32)``: `group_limited_topk` as the
    reference, ``kernel`` (default: `gating_kernel(cfg)`) as its NPU implementation. Registering again
    (a notebook cell run twice) replaces the kernel."""
    npu = kernel if kernel is not None else gating_kernel(cfg)

    def reference(logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, i = group_limited_topk(logits, bias, cfg.expert_groups, cfg.topk_group, cfg.top_k, cfg.routed_scaling)
        return w, i.to(torch.int32)

    return custom_op(npu_func=npu, name=gating_op_name(cfg))(reference)


def use_pto_gating(model: LingLikeForCausalLM, kernel=None) -> LingLikeForCausalLM:
    """Route every layer of ``model`` through `gating_op` (in place; returns the model). The weights
    are untouched, so the model computes what it computed before."""
    op = gating_op(model.cfg, kernel)
    for gate in model.gates():
        gate.route = op
    return model


def use_plain_gating(model: LingLikeForCausalLM) -> LingLikeForCausalLM:
    """Undo `use_pto_gating`: every layer routes with the plain torch `group_limited_topk` again."""
    for gate in model.gates():
        gate.route = gate.plain_route
    return model


def routes_with_pto(gate: Gate) -> bool:
    return gate.route is not gate.plain_route and hasattr(gate.route, "pypto_spec")


__all__ = ["gating_kernel", "gating_op", "gating_op_name", "use_pto_gating", "use_plain_gating", "routes_with_pto"]
