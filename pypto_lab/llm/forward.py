"""One forward pass of a decoder-only LLM on one card, as the CANN kernels that run it.

`forward_kernels(spec, hw, prefill=[(chunk, past), ...], decode=[context, ...])` lists every kernel
of one engine step — prefill chunks and decode tokens batched together, as vLLM-Ascend and MindIE
run them — with its CANN name and its simulated cost on the card's chip (`costs`). Token-wise
kernels (norms, projections, RoPE, the MLP or the MoE) see all the step's tokens as the rows of one
matmul; attention runs per kind: PromptFlashAttention for prefill chunks (causal), and
IncreFlashAttention (PagedAttention) for the decode tokens, which reads each sequence's whole KV
cache. With tensor parallelism each card holds 1/tp of the heads and of the MLP width (Megatron's
column then row split) and an all-reduce joins the halves after attention and after the MLP; with
expert parallelism (``ep`` > 1) each card holds 1/ep of the experts and tokens travel to their
experts and back by all-to-all. A layer is costed once and counted ``layers`` times.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..hw.chip import Chip
from ..hw.collectives import Topology, collective
from ..hw.kernels import VectorOp, fuse_vector_ops
from . import costs
from .configs import LLMConfigError, LLMSpec, fits_tp, kv_heads_per_card
from .costs import Cost

PRECISIONS = {
    # name: (weight dtype for the Cube kernel, activation bytes, weight bytes)
    "fp16": ("fp16", 2, 2), "bf16": ("bf16", 2, 2), "w8a16": ("w8a16", 2, 1), "w8a8": ("int8", 2, 1),
}
KV_DTYPES = {"fp16": 2, "bf16": 2, "int8": 1}

# Vector kernels of an LLM layer, from the instructions they issue per tile (the Vector unit's
# timing table of the chip preset costs each one).
ROPE = VectorOp(3, 4, (("VMUL", 2), ("VGATHER", 1), ("VADD", 1)), flops_per_elem=3)       # x*cos + rot(x)*sin
SWIGLU = VectorOp(2, 4, (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VDIV", 1), ("VMUL", 1)), flops_per_elem=5)
ADD_RMSNORM = fuse_vector_ops(["add", "rmsnorm"], 3)                                       # residual add + RmsNorm
ADD_LAYERNORM = fuse_vector_ops(["add", "layernorm"], 3)
GELU = "gelu"
COPY = "copy"                                                                               # gathers, scatters
WEIGHTED_SUM = VectorOp(2, 3, (("VMUL", 1), ("VADD", 1)), flops_per_elem=2)                # MoeFinalizeRouting


def gating_topk(k: int, router: str) -> VectorOp:
    """MoeGatingTopK over one token's expert scores: the score function (softmax or sigmoid), then
    ``k`` rounds of row max + mask (VCMAX finds the best expert, VSEL removes it), then the
    renormalisation of the kept weights."""
    score = (("VMAX", 1), ("VSUB", 1), ("VEXP", 1), ("VADD", 1), ("VDIV", 1)) if router == "softmax" else \
        (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VDIV", 1))
    return VectorOp(1, 3, score + (("VSEL", k), ("VMAX", k)), (("VCMAX", k), ("VCADD", 1), ("VBRCB", 1)),
                    row_wise=True, flops_per_elem=5 + 2 * k)


@dataclass(frozen=True)
class Hardware:
    """A card setup: its chip, the card count, the tensor- and expert-parallel sizes, the link
    topology, the precision of weights and KV cache, and a per-kernel launch cost."""

    chip: Chip
    cards: int = 1
    tp: int = 1
    ep: int = 1
    topology: Topology | None = None
    precision: str = "fp16"
    kv_dtype: str = "fp16"
    launch_us: float = 0.0

    @property
    def act_dtype(self) -> str:
        return "bf16" if self.precision == "bf16" else "fp16"

    @property
    def act_bytes(self) -> int:
        return PRECISIONS[self.precision][1]

    @property
    def weight_bytes(self) -> int:
        return PRECISIONS[self.precision][2]


@dataclass(frozen=True)
class StepKernel:
    """One kernel of a forward pass: its CANN name, what it computes, how many times the step runs
    it (layers), its cost per run, and the bytes it reads and writes (for the activation peak)."""

    name: str
    op: str
    unit: str
    count: int
    cost: Cost
    io_bytes: float = 0.0
    comm: bool = False

    @property
    def time_us(self) -> float:
        return self.cost.time_us * self.count

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "kind": self.op, "fused_ops": [self.op], "count": self.count,
                "time_us": self.time_us, "time_us_each": self.cost.time_us, "gm_bytes": self.cost.gm_bytes * self.count,
                "flops": self.cost.flops * self.count, "bound": self.cost.bound}


_UNCOSTED = Cost(0.0, 0.0, 0.0, "-", "-")


def check_hardware(spec: LLMSpec, hw: Hardware) -> None:
    if hw.precision not in PRECISIONS:
        raise LLMConfigError(f"precision {hw.precision!r}: the LLM engine models {', '.join(PRECISIONS)}. "
                             "Fix: one of these")
    if hw.kv_dtype not in KV_DTYPES:
        raise LLMConfigError(f"kv_dtype {hw.kv_dtype!r}: the KV cache is {', '.join(KV_DTYPES)}. Fix: one of these")
    fits_tp(spec, hw.tp)
    if hw.ep < 1 or (hw.ep > 1 and (not spec.is_moe or spec.experts % hw.ep or hw.cards % hw.ep)):
        raise LLMConfigError(
            f"ep = {hw.ep}: expert parallelism splits a MoE model's {spec.experts} experts evenly over a divisor of "
            f"the {hw.cards} cards. Fix: ep=1, or an ep dividing both")


def _mm(hw: Hardware, m: int, k: int, n: int, batch: int = 1) -> Cost:
    dt = PRECISIONS[hw.precision][0]
    if dt == "w8a16":
        return costs.matmul_w8a16(hw.chip, m, k, n, batch)
    return costs.matmul(hw.chip, m, k, n, dt, batch)


def _comm(hw: Hardware, kind: str, nbytes: float, cards: int) -> Cost:
    if cards <= 1:
        return Cost(0.0, 0.0, 0.0, "link", "hccl")
    c = collective(kind, int(nbytes), cards, hw.topology)
    return Cost(c.time_us, 0.0, 0.0, "link", "hccl")


@functools.lru_cache(maxsize=4096)
def expected_expert_load(tokens: int, top_k: int, experts: int, tile_m: int = 16) -> tuple[int, int]:
    """(active experts, rows the GroupedMatmul pads to) when ``tokens`` tokens each pick ``top_k``
    of ``experts`` experts uniformly: an expert is picked by a token with probability k/E, so its
    load is Binomial(tokens, k/E). Active experts are E(1 - (1 - k/E)^tokens); imbalance shows in
    the padded rows, each expert's load rounded up to ``tile_m`` (mean of 256 draws, fixed seed)."""
    if tokens <= 0:
        return 0, 0
    p = top_k / experts
    active = experts * (1.0 - (1.0 - p) ** tokens)
    load = np.random.default_rng(0).binomial(tokens, p, size=(256, experts))
    padded = float((-(-load // tile_m) * tile_m).sum(axis=1).mean())
    return max(1, round(active)), int(round(padded))


def _mlp(spec: LLMSpec, hw: Hardware, t: int, width: int, add, tag: str, count: int) -> None:
    h, ab = spec.hidden, hw.act_bytes
    if spec.mlp == "swiglu":
        add(f"MatMul{tag}_gate_up", "matmul", lambda: _mm(hw, t, h, 2 * width), count, t * (h + 2 * width) * ab)
        add(f"SwiGlu{tag}", "swiglu", lambda: costs.vector(hw.chip, SWIGLU, t * width, hw.act_dtype, key="swiglu"), count,
            t * 3 * width * ab)
    else:
        add(f"MatMul{tag}_up", "matmul", lambda: _mm(hw, t, h, width), count, t * (h + width) * ab)
        add(f"Gelu{tag}", "gelu", lambda: costs.vector(hw.chip, GELU, t * width, hw.act_dtype), count, t * 2 * width * ab)
    add(f"MatMul{tag}_down", "matmul", lambda: _mm(hw, t, width, h), count, t * (h + width) * ab)


def _mla_attention(spec: LLMSpec, hw: Hardware, t: int, prefill, decode, add) -> None:
    """Multi-head latent attention (DeepSeek-V2/V3), as vLLM-Ascend and MindIE run it. Each token
    caches one latent of ``kv_lora_rank`` and one RoPE key shared by all heads. Prefill expands
    the latent of every context token into per-head keys and values (``kv_b``) and runs
    PromptFlashAttention over them; decode absorbs ``kv_b`` into the query and the output
    (two batched matmuls per head) and attends over the latent itself: one KV "head" of
    ``kv_lora_rank + rope`` dims that every query head shares, so the cache is read once."""
    L, h, ab = spec.layers, spec.hidden, hw.act_bytes
    heads, d, rope = spec.heads // hw.tp, spec.head_dim, spec.qk_rope_dim
    nope, r, v, ql = d - rope, spec.kv_lora_rank, spec.v_head_dim, spec.q_lora_rank
    if ql:
        add("MatMul_q_a", "matmul", lambda: _mm(hw, t, h, ql), L, t * (h + ql) * ab)
        add("RmsNorm_q", "norm", lambda: costs.vector(hw.chip, "rmsnorm", t * ql, hw.act_dtype, row_len=ql), L,
            2 * t * ql * ab)
        add("MatMul_q_b", "matmul", lambda: _mm(hw, t, ql, heads * d), L, t * (ql + heads * d) * ab)
    else:
        add("MatMul_q", "matmul", lambda: _mm(hw, t, h, heads * d), L, t * (h + heads * d) * ab)
    add("MatMul_kv_a", "matmul", lambda: _mm(hw, t, h, r + rope), L, t * (h + r + rope) * ab)
    add("RmsNorm_kv", "norm", lambda: costs.vector(hw.chip, "rmsnorm", t * r, hw.act_dtype, row_len=r), L,
        2 * t * r * ab)
    add("RotaryPositionEmbedding", "rope", lambda: costs.vector(hw.chip, ROPE, t * (heads + 1) * rope, hw.act_dtype,
                                                                key="rope"), L, 2 * t * (heads + 1) * rope * ab)
    add("ScatterUpdate_kv_cache", "kv_write", lambda: costs.vector(hw.chip, COPY, t * (r + rope), hw.act_dtype), L,
        t * (r + rope) * (ab + KV_DTYPES[hw.kv_dtype]))
    if prefill:
        ctx = int(sum(c + p for c, p in prefill))
        add("MatMul_kv_b", "matmul", lambda: _mm(hw, ctx, r, heads * (nope + v)), L, ctx * (r + heads * (nope + v)) * ab)
        for (chunk, past), n in sorted(Counter((int(c), int(p)) for c, p in prefill).items()):
            add("PromptFlashAttention", "attention", lambda n=n, chunk=chunk, past=past: costs.prompt_flash_attention(
                hw.chip, n, heads, chunk, past, d, hw.act_dtype), L, n * chunk * heads * d * 2 * ab)
    if decode:
        b = len(decode)
        ctx = int(round(float(np.mean(decode))))
        add("BatchMatMul_q_absorb", "matmul", lambda: _mm(hw, b, nope, r, batch=heads), L, b * heads * (nope + r) * ab)
        add("IncreFlashAttention", "attention", lambda: costs.incre_flash_attention(
            hw.chip, b, 1, heads, ctx, r + rope, hw.act_dtype, hw.kv_dtype), L, b * heads * (r + rope) * 2 * ab)
        add("BatchMatMul_v_absorb", "matmul", lambda: _mm(hw, b, r, v, batch=heads), L, b * heads * (r + v) * ab)


def forward_kernels(spec: LLMSpec, hw: Hardware, prefill: Sequence[tuple[int, int]] = (),
                    decode: Sequence[int] = (), costed: bool = True) -> list[StepKernel]:
    """The kernels of one forward pass on one card (see the module's docstring). ``costed=False``
    lists them with their shapes' bytes but no simulation (for the HBM accounting)."""
    if not prefill and not decode:
        raise LLMConfigError("an engine step needs prefill chunks or decode tokens; both lists are empty. "
                             "Fix: pass prefill=[(tokens, past)] or decode=[context, ...]")
    check_hardware(spec, hw)
    out: list[StepKernel] = []

    def add(name, op, cost_of, count, io=0.0, comm=False):
        if comm and hw.tp <= 1 and hw.ep <= 1:
            return
        cost = cost_of() if costed else _UNCOSTED
        out.append(StepKernel(name, op, cost.unit, count, cost, io, comm))

    tp, L, h, d = hw.tp, spec.layers, spec.hidden, spec.head_dim
    ab = hw.act_bytes
    t = int(sum(c for c, _ in prefill) + len(decode))
    heads, kvh = spec.heads // tp, kv_heads_per_card(spec, tp)
    rows_out = len(prefill) + len(decode)                   # logits only for each sequence's last token

    add("Gather_embedding", "embedding", lambda: costs.vector(hw.chip, COPY, t * h, hw.act_dtype), 1, 2 * t * h * ab)
    norm = ADD_RMSNORM if spec.norm == "rms" else ADD_LAYERNORM
    nname = "AddRmsNorm" if spec.norm == "rms" else "AddLayerNorm"
    add(nname, "norm", lambda: costs.vector(hw.chip, norm, t * h, hw.act_dtype, row_len=h, key=nname), 2 * L, 4 * t * h * ab)
    if spec.is_mla:
        _mla_attention(spec, hw, t, prefill, decode, add)
    else:
        qkv_n = (heads + 2 * kvh) * d
        add("MatMul_qkv", "matmul", lambda: _mm(hw, t, h, qkv_n), L, t * (h + qkv_n) * ab)
        if spec.qk_norm:
            add("RmsNorm_qk", "norm", lambda: costs.vector(hw.chip, "rmsnorm", t * (heads + kvh) * d, hw.act_dtype, row_len=d),
                L, 2 * t * (heads + kvh) * d * ab)
        rot = int(round(d * spec.rotary_fraction))
        if rot:
            add("RotaryPositionEmbedding", "rope", lambda: costs.vector(hw.chip, ROPE, t * (heads + kvh) * rot, hw.act_dtype,
                                                                key="rope"), L, 2 * t * (heads + kvh) * d * ab)
        kvb = KV_DTYPES[hw.kv_dtype]
        add("ScatterUpdate_kv_cache", "kv_write", lambda: costs.vector(hw.chip, COPY, 2 * t * kvh * d, hw.act_dtype), L,
            2 * t * kvh * d * (ab + kvb))
        groups = Counter((int(c), int(p)) for c, p in prefill)
        for (chunk, past), n in sorted(groups.items()):
            add("PromptFlashAttention", "attention", lambda n=n, chunk=chunk, past=past: costs.prompt_flash_attention(
                hw.chip, n, heads, chunk, past, d, hw.act_dtype), L, n * chunk * heads * d * 2 * ab)
        if decode:
            ctx = int(round(float(np.mean(decode))))
            group = max(1, heads // kvh)
            add("IncreFlashAttention", "attention", lambda: costs.incre_flash_attention(
                hw.chip, len(decode), kvh, group, ctx, d, hw.act_dtype, hw.kv_dtype), L, len(decode) * heads * d * 2 * ab)
    vd = spec.v_head_dim if spec.is_mla else d
    add("MatMul_o_proj", "matmul", lambda: _mm(hw, t, heads * vd, h), L, t * (h + heads * vd) * ab)
    add("AllReduce_attention", "allreduce", lambda: _comm(hw, "allreduce", t * h * ab, tp), L, comm=True)

    if not spec.is_moe:
        _mlp(spec, hw, t, spec.intermediate // tp, add, "", L)
    else:
        if spec.dense_layers:
            _mlp(spec, hw, t, spec.intermediate // tp, add, "_dense", spec.dense_layers)
        ml, e, k = spec.moe_layers, spec.experts, spec.top_k
        add("MatMul_router", "matmul", lambda: _mm(hw, t, h, e), ml, t * (h + e) * ab)
        add("MoeGatingTopK", "gating", lambda: costs.vector(hw.chip, gating_topk(k, spec.router), t * e, "fp32", row_len=e,
                                                     key=f"gating{k}{spec.router}"), ml, t * e * 4)
        add("MoeInitRouting", "permute", lambda: costs.vector(hw.chip, COPY, t * k * h, hw.act_dtype), ml, 2 * t * k * h * ab)
        ep = hw.ep
        etp = max(1, tp // ep) if ep > 1 else tp          # the experts' own tensor split
        if ep > 1:
            add("AlltoAll_dispatch", "alltoall", lambda: _comm(hw, "alltoall", t * k * h * ab, ep), ml, comm=True)
        width = spec.expert_intermediate // etp
        active, rows = expected_expert_load(t * (ep if ep > 1 else 1), k, e)
        active_local = max(1, round(active / ep))
        rows_local = max(16, rows // ep)
        m_each = max(1, rows_local // active_local)
        if spec.mlp == "swiglu":
            add("GroupedMatmul_gate_up", "matmul", lambda: _mm(hw, m_each, h, 2 * width, batch=active_local), ml,
                rows_local * (h + 2 * width) * ab)
            add("SwiGlu_experts", "swiglu", lambda: costs.vector(hw.chip, SWIGLU, rows_local * width, hw.act_dtype,
                                                         key="swiglu"), ml, 3 * rows_local * width * ab)
        add("GroupedMatmul_down", "matmul", lambda: _mm(hw, m_each, width, h, batch=active_local), ml,
            rows_local * (h + width) * ab)
        if ep > 1:
            add("AlltoAll_combine", "alltoall", lambda: _comm(hw, "alltoall", t * k * h * ab, ep), ml, comm=True)
        add("MoeFinalizeRouting", "unpermute", lambda: costs.vector(hw.chip, WEIGHTED_SUM, t * k * h, hw.act_dtype,
                                                             key="wsum"), ml, 2 * t * k * h * ab)
        if spec.shared_experts:
            _mlp(spec, hw, t, spec.shared_intermediate * spec.shared_experts // tp, add, "_shared", ml)
    add("AllReduce_mlp", "allreduce", lambda: _comm(hw, "allreduce", t * h * ab, tp), L, comm=True)

    vocab = -(-spec.vocab // tp)
    add("MatMul_lm_head", "matmul", lambda: _mm(hw, rows_out, h, vocab), 1, rows_out * (h + vocab) * ab)
    add("AllGather_logits", "allgather", lambda: _comm(hw, "allgather", rows_out * vocab * 4, tp), 1, comm=True)
    # greedy sampling: a row max over the vocabulary, in two passes of 4,096-wide chunks (a row of
    # logits does not fit UB); the second pass over one value per chunk is negligible
    chunks = -(-vocab // 4096)
    add("ArgMax_sampling", "sampling", lambda: costs.vector(hw.chip, "max", rows_out * chunks * 4096, "fp32", row_len=4096),
        1, rows_out * vocab * 4)
    if hw.launch_us:
        out = [StepKernel(k.name, k.op, k.unit, k.count, Cost(k.cost.time_us + hw.launch_us, k.cost.gm_bytes,
                          k.cost.flops, k.cost.bound, k.cost.unit, k.cost.hbm_bytes), k.io_bytes, k.comm) for k in out]
    return out


def step_time_us(kernels: Sequence[StepKernel]) -> float:
    """One forward pass: its kernels run one after another on the card (each uses every core)."""
    return float(sum(k.time_us for k in kernels))


__all__ = ["ADD_RMSNORM", "Hardware", "KV_DTYPES", "PRECISIONS", "ROPE", "SWIGLU", "StepKernel", "check_hardware",
           "expected_expert_load", "forward_kernels", "gating_topk", "step_time_us"]
