#!/usr/bin/env python3
"""MoE gating with group-limited top-k (the routing of GLM-4.5 / DeepSeek-V3 style models), fp32.

For each token: scores = sigmoid(router logits); the expert-bias is added for the choice only;
the experts are split into groups, a group is worth its best biased score, the best TOPK_GROUP
groups stay eligible (a 0/1 mask written with ``scatter_``); the TOP_K best eligible experts are
chosen (``topk``), their unbiased scores picked (``gather``) and renormalised to sum to 1.
Written here from that description; the torch reference below follows it step by step.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

T, E = 16, 64            # tokens, routed experts
G = 8                    # expert groups (E // G experts each)
TOPK_GROUP, TOP_K = 4, 8


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def moe_gating_kernel(
    logits: pypto.Tensor((T, E), pypto.DT_FP32),
    bias: pypto.Tensor((1, E), pypto.DT_FP32),
    weights: pypto.Tensor((T, TOP_K), pypto.DT_FP32),
    ids: pypto.Tensor((T, TOP_K), pypto.DT_INT32),
):
    pypto.set_vec_tile_shapes(T, E)
    scores = pypto.sigmoid(logits)
    biased = scores + bias

    # a group is worth its best biased expert; keep the TOPK_GROUP best groups
    pypto.set_vec_tile_shapes(T, G, E // G)
    group_best = pypto.amax(pypto.reshape(biased, [T, G, E // G]), dim=-1, keepdim=False)
    pypto.set_vec_tile_shapes(T, G)
    _, top_groups = pypto.topk(group_best, TOPK_GROUP, -1, True)
    group_mask = pypto.full([T, G], 0.0, pypto.DT_FP32)
    group_mask = pypto.scatter_(group_mask, 1, top_groups, 1.0)

    # spread the group mask over its experts; experts of other groups cannot be chosen
    pypto.set_vec_tile_shapes(T, G, E // G)
    expert_mask = pypto.expand_clone(pypto.reshape(group_mask, [T, G, 1]), [T, G, E // G])
    pypto.set_vec_tile_shapes(T, E)
    expert_mask = pypto.reshape(expert_mask, [T, E])
    eligible = pypto.where(pypto.eq(expert_mask, 0.0), 0.0, biased)

    _, top_ids = pypto.topk(eligible, TOP_K, -1, True)
    picked = pypto.gather(scores, 1, top_ids)
    pypto.set_vec_tile_shapes(T, TOP_K)
    weights[:] = picked / pypto.sum(picked, dim=-1, keepdim=True)
    ids[:] = top_ids


def reference(logits, bias):
    """(weights, ids) in torch, fp32."""
    scores = torch.sigmoid(logits)
    biased = scores + bias
    group_best = biased.view(T, G, E // G).amax(dim=-1)
    top_groups = torch.topk(group_best, TOPK_GROUP, dim=-1).indices
    group_mask = torch.zeros(T, G).scatter_(1, top_groups, 1.0)
    expert_mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
    eligible = biased.masked_fill(expert_mask == 0, 0.0)
    top_ids = torch.topk(eligible, TOP_K, dim=-1).indices
    picked = scores.gather(1, top_ids)
    return picked / picked.sum(dim=-1, keepdim=True), top_ids


def _by_expert(w, i):
    """Rows ordered by expert id: the set of experts and their weights, whatever order topk used."""
    order = i.long().argsort(dim=-1)
    return w.gather(1, order), i.long().gather(1, order)


def main():
    torch.manual_seed(0)
    logits = torch.randn((T, E), dtype=torch.float32)
    bias = 0.1 * torch.rand((1, E), dtype=torch.float32)   # a small positive correction, as trained
    weights = torch.empty((T, TOP_K), dtype=torch.float32)
    ids = torch.empty((T, TOP_K), dtype=torch.int32)

    moe_gating_kernel(logits, bias, weights, ids)

    gw, gi = reference(logits, bias)
    w, i = _by_expert(weights, ids)
    gw, gi = _by_expert(gw, gi)
    ids_match = bool(torch.equal(i, gi))
    print(f"moe_gating_topk: chosen experts {'match' if ids_match else 'DIFFER from'} torch "
          f"({int((i == gi).sum())}/{i.numel()} equal)")
    r = result("moe_gating_topk", moe_gating_kernel, w, gw, torch.float32, ids_match=ids_match)
    r.passed = r.passed and ids_match
    return r


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
