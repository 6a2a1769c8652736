"""A small, new MoE decoder written in plain PyTorch, new the way Ant Group's Ling is new: the "0-day"
model of notebook 08. Nothing in the compiler was written for it.

What makes it new (each part is a few lines below):

* **sigmoid router with group-limited top-k** (`group_limited_topk`): the experts are split into
  groups; a group is worth its best *biased* expert score; the best ``topk_group`` groups stay
  eligible; the best ``top_k`` eligible experts are chosen. The routing bias (a per-expert
  correction, as aux-loss-free load balancing trains it) is added for the **choice only**; the
  weights are the unbiased sigmoid scores of the chosen experts, renormalised to sum to 1 and
  multiplied by ``routed_scaling``;
* a **shared expert** that every token goes through, beside the routed ones;
* **QK-norm**: RMSNorm on each head of q and of k before RoPE;
* GQA attention (``kv_heads`` < ``heads``) with RoPE, RMSNorm, SwiGLU experts.

How it captures with ``torch.export`` (static shapes): the router is plain ATen (sigmoid, amax,
``topk``, ``scatter``, ``where``, ``gather``); the experts run **densely**: every expert computes
every token with one batched matmul over the stacked expert weights, and a ``[tokens, experts]``
combine matrix (the routing weights scattered to their expert ids, zero elsewhere) weights and
sums them. No data-dependent shapes, no Python loop over experts, so the graph is the same for
every input. (A tiny model affords the dense compute; a real serving stack dispatches tokens.)

`LingLikeForCausalLM(config)` takes ``input_ids [B, S]`` and returns logits ``[B, S, vocab]``.
Its weights are drawn from ``config.seed`` so two models of one config are identical. The gate is
a module attribute (``layer.moe.gate``): `pypto_lab.llm.ling_like_kernels` swaps it for a custom
operator whose NPU implementation is a pto kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LingLikeConfig:
    """The architecture's sizes. The defaults are a tiny model (about 4 M parameters) that the
    simulator costs in seconds."""

    vocab_size: int = 1024
    hidden: int = 256
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    experts: int = 16
    expert_groups: int = 4
    topk_group: int = 2
    top_k: int = 4
    shared_experts: int = 1
    expert_intermediate: int = 128
    routed_scaling: float = 2.5
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 0

    def __post_init__(self):
        def bad(rule: str, value, fix: str):
            raise ValueError(f"LingLikeConfig: {rule}; got {value}. Fix: {fix}")
        for name in ("vocab_size", "hidden", "layers", "heads", "kv_heads", "head_dim", "experts",
                     "expert_groups", "topk_group", "top_k", "expert_intermediate"):
            if getattr(self, name) < 1:
                bad(f"{name} must be >= 1", f"{name}={getattr(self, name)}", f"give {name} a positive value")
        if self.shared_experts < 0:
            bad("shared_experts must be >= 0", f"shared_experts={self.shared_experts}", "use 0 or more")
        if self.heads % self.kv_heads:
            bad("heads must be a multiple of kv_heads (GQA shares each k/v head among heads // kv_heads q heads)",
                f"heads={self.heads}, kv_heads={self.kv_heads}", "choose kv_heads dividing heads")
        if self.head_dim % 2:
            bad("head_dim must be even (RoPE rotates pairs of dimensions)", f"head_dim={self.head_dim}",
                "use an even head_dim")
        if self.experts % self.expert_groups:
            bad("experts must split evenly into expert_groups", f"experts={self.experts}, "
                f"expert_groups={self.expert_groups}", "choose expert_groups dividing experts")
        if not 1 <= self.topk_group <= self.expert_groups:
            bad("topk_group must be between 1 and expert_groups", f"topk_group={self.topk_group}, "
                f"expert_groups={self.expert_groups}", "lower topk_group")
        eligible = self.topk_group * (self.experts // self.expert_groups)
        if self.top_k > eligible:
            bad("top_k must not exceed the experts of the topk_group kept groups "
                "(topk_group * experts // expert_groups)", f"top_k={self.top_k}, eligible experts={eligible}",
                f"lower top_k to at most {eligible} or keep more groups")

    @property
    def group_size(self) -> int:
        return self.experts // self.expert_groups


# ---- the router ---------------------------------------------------------------------------------

def group_limited_topk(logits: torch.Tensor, bias: torch.Tensor, groups: int, topk_group: int, top_k: int,
                       scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights ``[T, top_k]`` and expert ids ``[T, top_k]`` (int64) from router logits ``[T, E]``
    and the routing bias ``[E]``: sigmoid scores; bias added for the choice; groups ranked by their best
    biased expert; the ``top_k`` best experts of the ``topk_group`` best groups; their unbiased scores
    renormalised and scaled."""
    t, e = logits.shape
    scores = torch.sigmoid(logits)
    biased = scores + bias
    group_best = biased.view(t, groups, e // groups).amax(dim=-1)
    top_groups = torch.topk(group_best, topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_best).scatter(1, top_groups, 1.0)
    expert_mask = group_mask.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)
    eligible = torch.where(expert_mask > 0, biased, torch.zeros_like(biased))  # scores are > 0: 0 never wins
    ids = torch.topk(eligible, top_k, dim=-1).indices
    picked = scores.gather(1, ids)
    weights = picked / picked.sum(dim=-1, keepdim=True) * scaling
    return weights, ids


class Gate(nn.Module):
    """The router: a bias-free linear to one logit per expert, then a routing function
    ``route(logits, bias) -> (weights, ids)`` (`group_limited_topk` with the config's sizes, or a
    custom operator that computes the same)."""

    def __init__(self, cfg: LingLikeConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.experts, cfg.hidden))
        self.register_buffer("bias", torch.zeros(cfg.experts))  # the load-balancing correction
        self.route: Callable = self.plain_route

    def plain_route(self, logits, bias):
        c = self.cfg
        return group_limited_topk(logits, bias, c.expert_groups, c.topk_group, c.top_k, c.routed_scaling)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = x @ self.weight.t()
        return self.route(logits, self.bias)


# ---- the blocks ---------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """GQA attention with QK-norm (RMSNorm per head of q and k) before RoPE, causal."""

    def __init__(self, cfg: LingLikeConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_eps)
        self.k_norm = RMSNorm(d, cfg.rms_eps)

    def forward(self, x, cos, sin):
        c = self.cfg
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, c.heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = c.heads // c.kv_heads  # GQA: each k/v head serves `rep` q heads (expand, then fold into heads)
        k = k[:, :, None].expand(b, c.kv_heads, rep, s, c.head_dim).reshape(b, c.heads, s, c.head_dim)
        v = v[:, :, None].expand(b, c.kv_heads, rep, s, c.head_dim).reshape(b, c.heads, s, c.head_dim)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the shared expert."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Routed SwiGLU experts (computed densely, weighted by the routing's combine matrix) plus the
    shared expert(s)."""

    def __init__(self, cfg: LingLikeConfig):
        super().__init__()
        self.cfg = cfg
        e, h, i = cfg.experts, cfg.hidden, cfg.expert_intermediate
        self.gate = Gate(cfg)
        self.w_gate_up = nn.Parameter(torch.empty(e, h, 2 * i))  # gate and up of every expert, stacked
        self.w_down = nn.Parameter(torch.empty(e, i, h))
        self.shared = SwiGLU(h, i * cfg.shared_experts) if cfg.shared_experts else None

    def combine(self, x2d: torch.Tensor) -> torch.Tensor:
        """The ``[T, experts]`` routing matrix: each token's weights at its chosen experts, 0 elsewhere."""
        weights, ids = self.gate(x2d)
        return torch.zeros(x2d.shape[0], self.cfg.experts, dtype=weights.dtype).scatter(1, ids.long(), weights)

    def forward(self, x):
        b, s, h = x.shape
        x2d = x.reshape(b * s, h)
        comb = self.combine(x2d)                                           # [T, E]
        gu = torch.matmul(x2d.unsqueeze(0), self.w_gate_up)                # [E, T, 2I]
        g, u = gu.chunk(2, dim=-1)
        y = torch.matmul(torch.nn.functional.silu(g) * u, self.w_down)    # [E, T, H]
        out = (y * comb.t().unsqueeze(-1)).sum(dim=0)                      # [T, H]
        if self.shared is not None:
            out = out + self.shared(x2d)
        return out.view(b, s, h)


class DecoderLayer(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + moe(norm(x))."""

    def __init__(self, cfg: LingLikeConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.moe = MoE(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.moe(self.post_norm(x))


class LingLikeForCausalLM(nn.Module):
    """Embedding, ``layers`` decoder layers, final RMSNorm, LM head: ``input_ids [B, S]`` -> logits."""

    def __init__(self, cfg: LingLikeConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or LingLikeConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Weights from ``cfg.seed``: normal(0, 1/sqrt(fan_in)) for projections and experts, N(0, 1) for the
        embedding, ones for the norms, and a small positive routing bias per expert (as trained)."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "embed.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.dim() == 2 else p.shape[-2]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        for layer in self.layers:
            layer.moe.gate.bias.copy_(0.05 * torch.rand(self.cfg.experts, generator=gen))

    def gates(self) -> list[Gate]:
        return [layer.moe.gate for layer in self.layers]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        freqs = torch.arange(s, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


__all__ = ["LingLikeConfig", "LingLikeForCausalLM", "Gate", "MoE", "group_limited_topk"]
