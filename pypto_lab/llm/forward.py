"""One forward pass of a decoder-only LLM on one card, as the CANN kernels that run it.

`forward_kernels(spec, hw, prefill=[(chunk, past), ...], decode=[context, ...])` lists every kernel
of one engine step — prefill chunks and decode tokens batched together, as vLLM-Ascend and MindIE
run them — as the specs of the one kernel IR (`pypto_lab.kernels.ir`) with their CANN names, each
costed by the coster of its kind under the grid strategy (`pypto_lab.kernels.grid`), as
`CostedKernel` rows with the number of runs (layers) a step makes; `step_time_us` runs them under
the card setup's software stack (`pypto_lab.stack`: launch, dispatch, host). Token-wise
kernels (norms, projections, RoPE, the MLP or the MoE) see all the step's tokens as the rows of one
matmul; attention runs per kind: PromptFlashAttention for prefill chunks (causal), and
IncreFlashAttention (PagedAttention) for the decode tokens, which reads each sequence's whole KV
cache. With tensor parallelism each card holds 1/tp of the heads and of the MLP width (Megatron's
column then row split) and an all-reduce joins the halves after attention and after the MLP; with
expert parallelism (``ep`` > 1) each card holds 1/ep of the experts and tokens travel to their
experts and back by all-to-all. A layer is costed once and counted ``layers`` times.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..hw.chip import Chip
from ..hw.collectives import Topology
from ..kernels.cost import CostedKernel, KernelCost, cost
from ..kernels.ir import (
    AttentionKernel,
    CollectiveKernel,
    CubeKernel,
    IncreAttentionKernel,
    Kernel,
    KernelSpec,
    MoeGatingKernel,
    VectorKernel,
)
from ..stack import Launch, Stack, get_stack, run_in_order
from ..stack.preset import DEFAULT_LLM_STACK
from .configs import LLMConfigError, LLMSpec, fits_tp, kv_heads_per_card

PRECISIONS = {
    # name: (the Cube's dtype, activation bytes, weight bytes); w8a16 multiplies fp16 with int8 weights
    "fp16": ("fp16", 2, 2), "bf16": ("bf16", 2, 2), "w8a16": ("fp16", 2, 1), "w8a8": ("int8", 2, 1),
}
KV_DTYPES = {"fp16": 2, "bf16": 2, "int8": 1}
# How a deployment's model code keeps the KV cache and feeds attention (the code decides the copies a
# decode step makes, so it is part of the setup, like the stack):
KV_IMPLS = {
    # the new token's keys and values are written into a preallocated or paged cache in place
    # (ScatterUpdate / reshape_and_cache) and IncreFlashAttention reads the cache where it is, each KV
    # head once for its group of query heads: vLLM-Ascend, MindIE, and torchair's Llama and Qwen2
    # ports (Ascend/torchair@770a4d54 npu_tuned_model/llm/{llama,qwen}/modeling_*.py:
    # torch_npu.scatter_update_ then npu_incre_flash_attention(..., num_key_value_heads=...))
    "in-place": "keys and values written into the cache in place; attention reads each KV head once",
    # the same, into a cache preallocated for the whole generation (``kv_capacity`` tokens per sequence),
    # but IncreFlashAttention is called without actual_seq_lengths, so every step it reads the whole
    # cache tensor (the unused and padded positions masked): torchair's Qwen2 port as its batch-size
    # tables were measured (Ascend/torchair@e45676cf, 2024-07-08, npu_tuned_model/llm/qwen/modeling_qwen2.py:
    # npu_incre_flash_attention(..., atten_mask=attention_mask) on past_key_value of
    # max_position_embeddings = input_max_len + max_new_tokens positions; actual_seq_lengths and
    # kv_padding_size came with 81386be4, 2024-07-29, "IFA算子在进行增量计算时，由于输出做了padding，
    # 导致存在冗余的计算")
    "in-place-full": "keys and values written into a cache preallocated for the whole generation; attention "
                     "reads the whole cache every step (no actual_seq_lengths)",
    # the cache grows by torch.cat every step (the whole cache read and written again), then keys and
    # values are expanded to every query head and made contiguous before attention (one copy:
    # `_concat_expand_copies`): THUDM's modeling_chatglm.py as torchair's ChatGLM3 port runs it
    # (Ascend/torchair@770a4d54 npu_tuned_model/llm/chatglm/modeling_chatglm.py, SelfAttention.forward:
    # torch.cat((cache_k, key_layer)), key_layer.expand(...).contiguous()), with the README's last change
    # applied, which its batch-size table was measured with (c7316848, 2024-09-29, "调整QKV的格式为BSND":
    # the cache concatenated on the sequence axis of BSND tensors and the permute(...).contiguous()
    # before npu_incre_flash_attention removed)
    "concat-expand": "cache grown by concatenation each step; keys and values copied out to every query head "
                     "before attention",
}


@dataclass(frozen=True)
class ModelCode:
    """The host side of a deployment's model code in eager mode, per decoder layer of a decode step:
    every operation its Python calls (``ops``: a view, reshape, split, slice, no-op cast or
    ``contiguous()`` launches no kernel but still passes through the dispatcher), how many of them
    launch a kernel (``kernels``), and each all-reduce call more with tensor parallelism
    (``per_collective``). Counted by reading the code (``source``); the per-step code outside the
    layers (embedding, masks, sampling) is not counted."""

    name: str
    ops: int
    kernels: int
    source: str
    per_collective: int = 1


# The model code of torchair's ports as their eager (单算子) rows ran it: each decode layer's forward,
# counted from the source (q_len == 1 branch).
MODEL_CODE = {
    # LlamaDecoderLayer.forward: npu_add_rms_norm x2 (the first with the previous layer's residual);
    # LlamaAttention.forward: qkv (fused linear), split, view x3, cos.to / sin.to, npu_apply_rotary_pos_emb,
    # updated_kv_positions.reshape, scatter_update_ x2, contiguous x2 (of the cache: no copy),
    # attention_mask.to(bool), npu_incre_flash_attention, reshape, o_proj; LlamaMLP.forward:
    # gate_proj, up_proj, act_fn, mul, down_proj. 24 operations, 13 of them kernels. With tensor
    # parallelism (deepspeed, its README's LinearAllreduce of benchmark/deepspeed/mc2_adapter.py, decode
    # branch) o_proj and down_proj each run weight.transpose, torch.matmul of the 3-D input (folded to a
    # 2-D mm by a reshape and a view back: two dispatcher calls more) and dist.all_reduce: 4 operations
    # per all-reduce beyond the matmul.
    "torchair-llama": ModelCode("torchair-llama", 24, 13, "Ascend/torchair@770a4d54fa5534f43474cb310223c34ec74922c8 "
                                "npu_tuned_model/llm/llama/modeling_llama.py (LlamaDecoderLayer, LlamaAttention, "
                                "LlamaMLP, LlamaRMSNorm forward); README.md's LinearAllreduce (mc2_adapter.py)",
                                per_collective=4),
    # Qwen2DecoderLayer / Qwen2Attention / Qwen2MLP / Qwen2RMSNorm forward: the same operations as the
    # Llama port (qkv with its bias is one linear)
    "torchair-qwen2": ModelCode("torchair-qwen2", 24, 13, "Ascend/torchair@e45676cf "
                                "npu_tuned_model/llm/qwen/modeling_qwen2.py (Qwen2DecoderLayer, Qwen2Attention, "
                                "Qwen2MLP, Qwen2RMSNorm forward)"),
    # GLMBlock.forward: npu_rms_norm, dropout (eval: no kernel), residual add, npu_rms_norm, dropout, add;
    # SelfAttention.forward: query_key_value, split, view x3; apply_rotary_pos_emb for q and for k, each:
    # two slices, rope_cache[:sq], reshape of the slice (a copy), view, eight [..., i] selections, four
    # muls, sub, add, stack, flatten, cat (9 kernels of 22 operations); torch.cat of cache and new key,
    # and of value; unsqueeze, expand, contiguous (a copy), view, for key and for value; CoreAttention in
    # the README's BSND version (no permute): contiguous x3 (no copy), attention_mask.to(bool),
    # npu_incre_flash_attention, reshape; dense; MLP.forward: dense_h_to_4h, swiglu (chunk, silu, mul),
    # dense_4h_to_h. 77 operations, 33 of them kernels.
    "torchair-chatglm3": ModelCode("torchair-chatglm3", 77, 33, "Ascend/torchair@c7316848 "
                                   "npu_tuned_model/llm/chatglm/modeling_chatglm.py (GLMBlock, SelfAttention, "
                                   "apply_rotary_pos_emb, CoreAttention, MLP forward) with README.md's BSND change"),
}


@dataclass(frozen=True)
class Hardware:
    """A card setup: its chip, the card count, the tensor- and expert-parallel sizes, the link
    topology, the precision of weights and KV cache, and the software stack that runs the step."""

    chip: Chip
    cards: int = 1
    tp: int = 1
    ep: int = 1
    topology: Topology | None = None
    precision: str = "fp16"
    kv_dtype: str = "fp16"
    stack: Stack = field(default_factory=lambda: get_stack(DEFAULT_LLM_STACK))
    kv_impl: str = "in-place"
    kv_capacity: int = 0        # tokens per sequence of a preallocated cache read whole ("in-place-full")
    code: ModelCode | None = None   # the deployment's model code, for its host operations on an eager stack

    @property
    def dynamic_shapes(self) -> bool:
        """Whether the step's graph changes shape every step: a cache grown by concatenation
        (``concat-expand``) is a new input shape each step; a cache written in place keeps them."""
        return self.kv_impl == "concat-expand"

    @property
    def act_dtype(self) -> str:
        return "bf16" if self.precision == "bf16" else "fp16"

    @property
    def act_bytes(self) -> int:
        return PRECISIONS[self.precision][1]

    @property
    def weight_bytes(self) -> int:
        return PRECISIONS[self.precision][2]


_UNCOSTED = KernelCost(0.0, 0.0, 0.0, bound="-")


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


def _mm(hw: Hardware, m: int, k: int, n: int, batch: int = 1, op: str = "MatMulV2") -> CubeKernel:
    """A token-wise matmul of the step at the setup's precision (W8A16: fp16 activations, int8
    weights, WeightQuantBatchMatmul)."""
    if hw.precision == "w8a16":
        return CubeKernel("WeightQuantBatchMatmulV2", batch, m, k, n, "fp16", "fp16", weight_dtype="int8")
    dt = PRECISIONS[hw.precision][0]
    return CubeKernel(op, batch, m, k, n, dt, "int32" if dt == "int8" else dt)


def _vec(op: str, ops: tuple[str, ...], numel: int, dtype: str, row_len: int | None = None,
         inputs: int | None = None, compute: str | None = None) -> VectorKernel:
    """A Vector kernel of ``ops`` (names of `pypto_lab.hw.kernels.VECTOR_OPS`) over whole rows,
    computing in ``compute`` (default: ``dtype``)."""
    rl = int(row_len or 1)
    return VectorKernel(op, ops, max(1, -(-int(numel) // rl)) * rl, dtype, compute or dtype, inputs, row_len)


def _norm(op: str, ops: tuple[str, ...], numel: int, dtype: str, row_len: int, inputs: int | None = None):
    """A norm kernel: its statistics in fp32 whatever the activations' dtype, as the models' own
    norms compute (transformers' LlamaRMSNorm casts to fp32) and CANN's fused norms reproduce."""
    return _vec(op, ops, numel, dtype, row_len, inputs, "fp32")


def _prompt_attention(seqs: int, heads: int, chunk: int, past: int, d: int, dtype: str) -> AttentionKernel:
    """PromptFlashAttention: causal FlashAttention of a chunk of ``chunk`` tokens after ``past``."""
    return AttentionKernel(seqs * heads, chunk, past + chunk, d, dtype, flash=True, causal=True)


def _comm(hw: Hardware, kind: str, nbytes: float, cards: int) -> CollectiveKernel:
    return CollectiveKernel(kind, int(nbytes), cards, hw.topology if cards > 1 else None)


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
        add(f"MatMul{tag}_gate_up", "matmul", _mm(hw, t, h, 2 * width), count, t * (h + 2 * width) * ab)
        add(f"SwiGlu{tag}", "swiglu", _vec("SwiGlu", ("swiglu",), t * width, hw.act_dtype), count,
            t * 3 * width * ab)
    else:
        add(f"MatMul{tag}_up", "matmul", _mm(hw, t, h, width), count, t * (h + width) * ab)
        add(f"Gelu{tag}", "gelu", _vec("Gelu", ("gelu",), t * width, hw.act_dtype), count, t * 2 * width * ab)
    add(f"MatMul{tag}_down", "matmul", _mm(hw, t, width, h), count, t * (h + width) * ab)


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
        add("MatMul_q_a", "matmul", _mm(hw, t, h, ql), L, t * (h + ql) * ab)
        add("RmsNorm_q", "norm", _norm("RmsNorm", ("rmsnorm",), t * ql, hw.act_dtype, ql), L,
            2 * t * ql * ab)
        add("MatMul_q_b", "matmul", _mm(hw, t, ql, heads * d), L, t * (ql + heads * d) * ab)
    else:
        add("MatMul_q", "matmul", _mm(hw, t, h, heads * d), L, t * (h + heads * d) * ab)
    add("MatMul_kv_a", "matmul", _mm(hw, t, h, r + rope), L, t * (h + r + rope) * ab)
    add("RmsNorm_kv", "norm", _norm("RmsNorm", ("rmsnorm",), t * r, hw.act_dtype, r), L,
        2 * t * r * ab)
    add("RotaryPositionEmbedding", "rope", _vec("RotaryPositionEmbedding", ("rope",),
                                                                        t * (heads + 1) * rope, hw.act_dtype), L, 2 * t * (heads + 1) * rope * ab)
    add("ScatterUpdate_kv_cache", "kv_write", _vec("ScatterUpdate", ("copy",), t * (r + rope), hw.act_dtype), L,
        t * (r + rope) * (ab + KV_DTYPES[hw.kv_dtype]))
    if prefill:
        ctx = int(sum(c + p for c, p in prefill))
        add("MatMul_kv_b", "matmul", _mm(hw, ctx, r, heads * (nope + v)), L, ctx * (r + heads * (nope + v)) * ab)
        for (chunk, past), n in sorted(Counter((int(c), int(p)) for c, p in prefill).items()):
            add("PromptFlashAttention", "attention", _prompt_attention(n, heads, chunk, past, d, hw.act_dtype), L, n * chunk * heads * d * 2 * ab)
    if decode:
        b = len(decode)
        ctx = int(round(float(np.mean(decode))))
        if is_dsa(spec):
            _dsa_indexer(spec, hw, t, b, ctx, add)
            # the tokens the indexer selected, read as if contiguous (the gather of scattered rows is
            # not charged here; a plugged pto kernel charges it: llm/plug.py)
            ctx = min(ctx, int(spec.extra["index_topk"]))
        add("BatchMatMul_q_absorb", "matmul", _mm(hw, b, nope, r, batch=heads), L, b * heads * (nope + r) * ab)
        add("IncreFlashAttention", "attention", IncreAttentionKernel(
            b, 1, heads, max(1, ctx), r + rope, hw.act_dtype, hw.kv_dtype), L, b * heads * (r + rope) * 2 * ab)
        add("BatchMatMul_v_absorb", "matmul", _mm(hw, b, r, v, batch=heads), L, b * heads * (r + v) * ab)


def is_dsa(spec: LLMSpec) -> bool:
    """DeepSeek Sparse Attention (DeepSeek-V3.2): MLA whose decode attends only to the
    ``index_topk`` tokens a lightning indexer picks."""
    return spec.is_mla and bool(spec.extra.get("index_topk"))


def _dsa_indexer(spec: LLMSpec, hw: Hardware, t: int, b: int, ctx: int, add) -> None:
    """The lightning indexer of one decode step (DeepSeek-V3.2-Exp ``inference/model.py``,
    ``Indexer.forward``): its query from the query's latent (``wq_b``: ``index_n_heads`` heads of
    ``index_head_dim``), one key per token (``wk``, LayerNorm, RoPE on its first
    ``qk_rope_head_dim`` dims) written to its own cache, a weight per head (``weights_proj``);
    then each sequence's scores ``relu(q . k) * w`` summed over heads for every cached token, and
    the ``index_topk`` best. The indexer is not split over tensor-parallel cards (every card needs
    the same selection). The model runs it in fp8; here in the activation dtype."""
    L, h, ab, dt = spec.layers, spec.hidden, hw.act_bytes, hw.act_dtype
    nh, hd, rope = int(spec.extra["index_n_heads"]), int(spec.extra["index_head_dim"]), spec.qk_rope_dim
    ql = spec.q_lora_rank or h
    add("MatMul_indexer_wq_b", "matmul", _mm(hw, t, ql, nh * hd), L, t * (ql + nh * hd) * ab)
    add("MatMul_indexer_wk", "matmul", _mm(hw, t, h, hd), L, t * (h + hd) * ab)
    add("LayerNorm_indexer_k", "norm", _norm("LayerNorm", ("layernorm",), t * hd, dt, hd), L, 2 * t * hd * ab)
    add("MatMul_indexer_weights", "matmul", _mm(hw, t, h, nh), L, t * (h + nh) * ab)
    add("RotaryPositionEmbedding_indexer", "rope", _vec("RotaryPositionEmbedding", ("rope",), t * (nh + 1) * rope,
                                                        dt), L, 2 * t * (nh + 1) * rope * ab)
    add("ScatterUpdate_indexer_cache", "kv_write", _vec("ScatterUpdate", ("copy",), t * hd, dt), L,
        t * hd * (ab + KV_DTYPES[hw.kv_dtype]))
    c = max(1, ctx)
    add("BatchMatMul_indexer_scores", "matmul", CubeKernel("BatchMatMulV2", b, nh, hd, c, dt, "fp32"), L,
        b * (nh * hd + c * hd) * ab + b * nh * c * 4)
    add("ReluWeightedSum_indexer", "indexer", _vec("LightningIndexer", ("relu", "mul", "sum"), b * nh * c, "fp32",
                                                   compute="fp32"), L, b * nh * c * 4)
    if c > int(spec.extra["index_topk"]):
        # a sort-based TopK: a merge sort's log2(n) compare passes over each sequence's scores (in
        # 4,096-wide chunks: a row of scores does not fit UB)
        passes = max(1, int(np.ceil(np.log2(c))))
        add("TopK_indexer", "topk", _vec("TopK", ("max",) * passes, b * -(-c // 4096) * 4096, "fp32", 4096), L,
            b * c * 4)


def _linear_attention(spec: LLMSpec, hw: Hardware, t: int, prefill, decode, add, layers: int) -> None:
    """Gated DeltaNet, the linear attention of Qwen3-Next's other layers (transformers
    ``modeling_qwen3_next.Qwen3NextGatedDeltaNet``): ``in_proj_qkvz`` and ``in_proj_ba``, a causal
    depthwise convolution of ``linear_conv_kernel_dim`` taps over q, k and v, then the gated delta
    rule: at decode one recurrent step per value head, the state ``S`` [dk, dv] (fp32) read,
    decayed, updated and written back; at prefill the chunked form (chunks of 64: within-chunk
    attention, the state read and the state written as three batched matmuls per chunk). A gated
    RMSNorm (``silu(z)``) and ``out_proj`` follow. Heads split over tensor-parallel cards."""
    x = spec.extra
    tp, h, ab, dt = hw.tp, spec.hidden, hw.act_bytes, hw.act_dtype
    kh, vh = max(1, x["linear_num_key_heads"] // tp), max(1, x["linear_num_value_heads"] // tp)
    dk, dv, taps = x["linear_key_head_dim"], x["linear_value_head_dim"], x.get("linear_conv_kernel_dim", 4)
    qkvz = 2 * kh * dk + 2 * vh * dv
    conv = 2 * kh * dk + vh * dv
    add("MatMul_in_proj_qkvz", "matmul", _mm(hw, t, h, qkvz), layers, t * (h + qkvz) * ab)
    add("MatMul_in_proj_ba", "matmul", _mm(hw, t, h, 2 * vh), layers, t * (h + 2 * vh) * ab)
    add("CausalConv1d", "conv", _vec("CausalConv1d", ("mul", "add"), t * conv * taps, dt, inputs=2), layers,
        2 * t * conv * ab + (len(decode) + len(prefill)) * conv * taps * ab)
    if prefill:
        chunks = int(sum(-(-int(c) // 64) for c, _ in prefill))
        n = chunks * vh
        add("ChunkGatedDeltaRule_intra", "matmul", CubeKernel("BatchMatMulV2", n, 64, dk, 64, dt, "fp32"), layers,
            n * 64 * (2 * dk) * ab)
        add("ChunkGatedDeltaRule_state", "matmul", CubeKernel("BatchMatMulV2", 2 * n, 64, dk, dv, dt, "fp32"), layers,
            n * dk * dv * 4 * 2)
    if decode:
        b = len(decode)
        state = b * vh * dk * dv
        add("RecurrentGatedDeltaRule", "linear_attention", _vec(
            "RecurrentGatedDeltaRule", ("mul", "mul", "sum", "sub", "mul", "add", "mul", "sum"), state, "fp32",
            dv, inputs=2, compute="fp32"), layers, 2 * state * 4)
    add("RmsNormGated", "norm", _norm("RmsNormGated", ("rmsnorm", "mul"), t * vh * dv, dt, dv, 2), layers,
        3 * t * vh * dv * ab)
    add("MatMul_out_proj", "matmul", _mm(hw, t, vh * dv, h), layers, t * (h + vh * dv) * ab)


def linear_layers(spec: LLMSpec) -> int:
    """Layers of Gated DeltaNet linear attention (`LLMSpec.linear_attention_layers`)."""
    return spec.linear_attention_layers


def _concat_expand_copies(hw: Hardware, prefill, decode, ctx: int, heads: int, kvh: int, d: int, layers: int,
                          add) -> None:
    """The copies of the ``concat-expand`` KV implementation (`KV_IMPLS`), per layer: the decode
    step's torch.cat of each sequence's cache (``ctx - 1`` cached tokens and the new one, keys and
    values) into a new cache of ``ctx`` tokens; then keys and values expanded to every query head
    (``expand(...).contiguous()``: one copy reading the ``kvh`` source heads and writing all
    ``heads``; the BSND layout of the README's last version needs no permute after it, where the
    modeling file's BNSD one made a second copy). A prefill chunk has no cache
    to concatenate yet: its keys and values are only expanded. The expansion is charged as a copy
    kernel moving the same bytes (``(read + written) / 2`` elements)."""
    ab, kvb, dt = hw.act_bytes, KV_DTYPES[hw.kv_dtype], hw.act_dtype
    rows = len(decode) * ctx + sum(int(c) for c, _ in prefill)          # key/value rows attention reads
    if decode:
        n = 2 * len(decode) * ctx * kvh * d
        add("ConcatD_kv_cache", "kv_write", _vec("ConcatD", ("copy",), n, dt), layers, n * (ab + kvb))
    read, written = 2 * rows * kvh * d, 2 * rows * heads * d
    add("BroadcastTo_kv_bnsd", "kv_expand", _vec("BroadcastTo", ("copy",), (read + written) // 2, dt), layers,
        (read + written) * kvb)


def forward_kernels(spec: LLMSpec, hw: Hardware, prefill: Sequence[tuple[int, int]] = (),
                    decode: Sequence[int] = (), costed: bool = True, strategy: str = "grid",
                    plugged=None) -> list[CostedKernel]:
    """The kernels of one forward pass on one card (see the module's docstring). ``costed=False``
    lists them with their shapes' bytes but no simulation (for the HBM accounting); ``strategy``
    is the costing strategy (`pypto_lab.kernels.cost`: "grid" for the many steps of a generation
    or a serving run, "exact" for a step costed once). ``plugged``: layer kind -> `plug.LayerKernel`
    (a `plug.Plugged`, from `plug.resolve`); in a decode-only step each kernel of the decode phase,
    in a prefill-only step each kernel of the prefill phase, replaces that layer kind's kernels by
    one pto kernel run at the step's shapes (`plug.apply`); a step mixing prefill chunks and decode
    tokens keeps the engine's kernels."""
    out = _forward_kernels(spec, hw, prefill, decode, costed, strategy)
    if plugged and costed and bool(decode) != bool(prefill):
        out = plugged.apply(out, spec, hw, list(decode), list(prefill))   # `plug.Plugged`
    return out


def _forward_kernels(spec: LLMSpec, hw: Hardware, prefill, decode, costed: bool, strategy: str) -> list[CostedKernel]:
    if not prefill and not decode:
        raise LLMConfigError("an engine step needs prefill chunks or decode tokens; both lists are empty. "
                             "Fix: pass prefill=[(tokens, past)] or decode=[context, ...]")
    check_hardware(spec, hw)
    out: list[CostedKernel] = []

    def add(name: str, op: str, spec: KernelSpec, count: int, io: float = 0.0, comm: bool = False) -> None:
        if comm and hw.tp <= 1 and hw.ep <= 1:
            return
        c = cost(spec, hw.chip, strategy) if costed else _UNCOSTED
        out.append(CostedKernel(Kernel(name, spec, (), (op,), name), c, count, io))

    tp, L, h, d = hw.tp, spec.layers, spec.hidden, spec.head_dim
    ab = hw.act_bytes
    t = int(sum(c for c, _ in prefill) + len(decode))
    heads, kvh = spec.heads // tp, kv_heads_per_card(spec, tp)
    rows_out = len(prefill) + len(decode)                   # logits only for each sequence's last token

    add("Gather_embedding", "embedding", _vec("Gather", ("copy",), t * h, hw.act_dtype), 1, 2 * t * h * ab)
    # 2L + 1 norms: the first layer's input norm reads the embedding (no residual yet); every later
    # norm, the final one included, has the residual add fused in front of it
    base = "rmsnorm" if spec.norm == "rms" else "layernorm"
    first = "RmsNorm" if spec.norm == "rms" else "LayerNorm"
    add(first, "norm", _norm(first, (base,), t * h, hw.act_dtype, h), 1, 2 * t * h * ab)
    nname = "Add" + first
    add(nname, "norm", _norm(nname, ("add", base), t * h, hw.act_dtype, h, 3), 2 * L, 4 * t * h * ab)
    lin = linear_layers(spec)
    if lin:
        _linear_attention(spec, hw, t, prefill, decode, add, lin)
    L = spec.layers - lin                                   # layers of full (softmax) attention
    gated = lin > 0            # Qwen3-Next's full attention: q_proj also gives a sigmoid gate on the output
    if spec.is_mla:
        _mla_attention(spec, hw, t, prefill, decode, add)
    else:
        qkv_n = (heads * (2 if gated else 1) + 2 * kvh) * d
        add("MatMul_qkv", "matmul", _mm(hw, t, h, qkv_n), L, t * (h + qkv_n) * ab)
        if spec.qk_norm:
            add("RmsNorm_qk", "norm", _norm("RmsNorm", ("rmsnorm",), t * (heads + kvh) * d, hw.act_dtype, d),
                L, 2 * t * (heads + kvh) * d * ab)
        rot = int(round(d * spec.rotary_fraction))
        if rot:
            add("RotaryPositionEmbedding", "rope", _vec("RotaryPositionEmbedding", ("rope",),
                                                                        t * (heads + kvh) * rot, hw.act_dtype), L, 2 * t * (heads + kvh) * d * ab)
        kvb = KV_DTYPES[hw.kv_dtype]
        ctx = int(round(float(np.mean(decode)))) if decode else 0
        if hw.kv_impl == "concat-expand":
            _concat_expand_copies(hw, prefill, decode, ctx, heads, kvh, d, L, add)
            attn_kvh = heads            # attention sees every query head's own copy of the keys
        else:
            add("ScatterUpdate_kv_cache", "kv_write", _vec("ScatterUpdate", ("copy",), 2 * t * kvh * d, hw.act_dtype),
                L, 2 * t * kvh * d * (ab + kvb))
            attn_kvh = kvh
        groups = Counter((int(c), int(p)) for c, p in prefill)
        for (chunk, past), n in sorted(groups.items()):
            add("PromptFlashAttention", "attention", _prompt_attention(n, heads, chunk, past, d, hw.act_dtype), L, n * chunk * heads * d * 2 * ab)
        if decode:
            group = max(1, heads // attn_kvh)
            # the concat-expand code passes no actual_seq_lengths: its cache is exactly the context;
            # in-place-full passes none either: the kernel reads the whole preallocated cache
            read = max(1, ctx)
            if hw.kv_impl == "in-place-full":
                if hw.kv_capacity < int(max(decode)):
                    raise LLMConfigError(
                        "kv_capacity", hw.kv_capacity, f"kv_impl 'in-place-full' reads the whole preallocated cache, "
                        f"which must hold every context of the step (the longest is {int(max(decode))} tokens)",
                        hint="set Hardware.kv_capacity to the tokens per sequence the cache is allocated for "
                             "(simulate_generation sets prompt_len + output_len)")
                read = hw.kv_capacity
            add("IncreFlashAttention", "attention", IncreAttentionKernel(
                len(decode), attn_kvh, group, read, d, hw.act_dtype, hw.kv_dtype,
                actual_lengths=hw.kv_impl == "in-place", preallocated=hw.kv_impl != "concat-expand"), L,
                len(decode) * heads * d * 2 * ab)
    vd = spec.v_head_dim if spec.is_mla else d
    if gated:
        add("Sigmoid_attention_gate", "gate", _vec("Mul", ("exp", "add", "div", "mul"), t * heads * d, hw.act_dtype,
                                                   inputs=2), L, 3 * t * heads * d * ab)
    add("MatMul_o_proj", "matmul", _mm(hw, t, heads * vd, h), L, t * (h + heads * vd) * ab)
    L = spec.layers
    add("AllReduce_attention", "allreduce", _comm(hw, "allreduce", t * h * ab, tp), L, comm=True)

    if not spec.is_moe:
        _mlp(spec, hw, t, spec.intermediate // tp, add, "", L)
    else:
        if spec.dense_layers:
            _mlp(spec, hw, t, spec.intermediate // tp, add, "_dense", spec.dense_layers)
        ml, e, k = spec.moe_layers, spec.experts, spec.top_k
        add("MatMul_router", "matmul", _mm(hw, t, h, e), ml, t * (h + e) * ab)
        add("MoeGatingTopK", "gating", MoeGatingKernel(t, e, k, spec.router, "fp32"), ml, t * e * 4)
        add("MoeInitRouting", "permute", _vec("MoeInitRouting", ("copy",), t * k * h, hw.act_dtype), ml, 2 * t * k * h * ab)
        ep = hw.ep
        etp = max(1, tp // ep) if ep > 1 else tp          # the experts' own tensor split
        if ep > 1:
            add("AlltoAll_dispatch", "alltoall", _comm(hw, "alltoall", t * k * h * ab, ep), ml, comm=True)
        width = spec.expert_intermediate // etp
        active, rows = expected_expert_load(t * (ep if ep > 1 else 1), k, e)
        active_local = max(1, round(active / ep))
        rows_local = max(16, rows // ep)
        m_each = max(1, rows_local // active_local)
        if spec.mlp == "swiglu":
            add("GroupedMatmul_gate_up", "matmul", _mm(hw, m_each, h, 2 * width, batch=active_local), ml,
                rows_local * (h + 2 * width) * ab)
            add("SwiGlu_experts", "swiglu", _vec("SwiGlu", ("swiglu",), rows_local * width,
                                                                 hw.act_dtype), ml, 3 * rows_local * width * ab)
        add("GroupedMatmul_down", "matmul", _mm(hw, m_each, width, h, batch=active_local), ml,
            rows_local * (h + width) * ab)
        if ep > 1:
            add("AlltoAll_combine", "alltoall", _comm(hw, "alltoall", t * k * h * ab, ep), ml, comm=True)
        add("MoeFinalizeRouting", "unpermute", _vec("MoeFinalizeRouting", ("weighted_sum",),
                                                                     t * k * h, hw.act_dtype), ml, 2 * t * k * h * ab)
        if spec.shared_experts:
            _mlp(spec, hw, t, spec.shared_intermediate * spec.shared_experts // tp, add, "_shared", ml)
    add("AllReduce_mlp", "allreduce", _comm(hw, "allreduce", t * h * ab, tp), L, comm=True)

    vocab = -(-spec.vocab // tp)
    add("MatMul_lm_head", "matmul", _mm(hw, rows_out, h, vocab), 1, rows_out * (h + vocab) * ab)
    add("AllGather_logits", "allgather", _comm(hw, "allgather", rows_out * vocab * 4, tp), 1, comm=True)
    # greedy sampling: a row max over the vocabulary, in two passes of 4,096-wide chunks (a row of
    # logits does not fit UB); the second pass over one value per chunk is negligible
    chunks = -(-vocab // 4096)
    add("ArgMax_sampling", "sampling", _vec("ArgMax", ("max",), rows_out * chunks * 4096, "fp32", 4096),
        1, rows_out * vocab * 4)
    return out


def code_launches(kernels: Sequence[CostedKernel], code: ModelCode | None) -> list[tuple[float, float]]:
    """Per kernel, the model code's host operations charged on each of its runs (``code_ops``,
    ``code_dispatches`` of `pypto_lab.stack.Launch`). A decoder layer's operations are spread evenly
    over the layer's listed kernel runs, as the code interleaves them (the step places each kernel's
    runs over the layers in a row, so a layer's whole host work on one kernel would keep the device
    idle where the real host works between that layer's kernels); the ones launching a kernel beyond
    the layer's listed kernels count as dispatches too. The code's all-reduce calls are listed
    kernels already. The layers are the runs of the qkv matmul (none: nothing is charged)."""
    out = [(0.0, 0.0)] * len(kernels)
    layers = next((k.count for k in kernels if k.name == "MatMul_qkv"), 0)
    if code is None or not layers:
        return out
    per_layer = [i for i, k in enumerate(kernels) if not k.collective and k.count >= layers]
    listed = sum(kernels[i].count for i in per_layer) / layers
    collectives = sum(k.count for k in kernels if k.collective and k.count >= layers) / layers
    ops = code.ops + code.per_collective * collectives
    dispatches = max(0.0, code.kernels - listed)
    for i in per_layer:
        out[i] = (ops / listed, dispatches / listed)
    return out


ATTENTION_OPS = ("kv_write", "attention")   # what a layer's attention op runs (its cache write first)


def _graph_break(kernels: Sequence[CostedKernel]) -> int:
    """The kernel that opens each layer's attention: the first whose op is a KV-cache write or an
    attention (vLLM's attention op writes the layer's keys and values, then attends); -1 if none."""
    for i, k in enumerate(kernels):
        if k.kernel.fused_ops and k.kernel.fused_ops[0] in ATTENTION_OPS:
            return i
    return -1


def step_timeline(kernels: Sequence[CostedKernel], stack: Stack, code: ModelCode | None = None,
                  dynamic_shapes: bool = False):
    """One forward pass under ``stack``: its kernels one after another on the card (each uses
    every core), each launched as the stack launches kernels (`pypto_lab.stack.timeline`). A stack
    whose graph is cut at the attention (``layer_host_us``) runs each layer's attention from the host:
    the kernel that opens it is marked (`timeline.Launch.graph_break`). ``code``: the model code
    whose host operations an eager stack also runs (`MODEL_CODE`, `code_launches`);
    ``dynamic_shapes``: the graph's shapes change every step, so a graph stack schedules it from the
    host kernel by kernel (`Stack.host_scheduled`)."""
    if dynamic_shapes:
        stack = stack.host_scheduled()
    brk = _graph_break(kernels) if stack.layer_host_us else -1
    extra = code_launches(kernels, code)
    launches = [Launch(k.cost.time_us, k.count, k.collective, k.spec.ifa_overhead, i == brk, ops, disp)
                for i, (k, (ops, disp)) in enumerate(zip(kernels, extra))]
    if (code is not None and stack.runs == "eager") or (dynamic_shapes and stack.dispatch_us):
        launches = layer_by_layer(launches, next((k.count for k in kernels if k.name == "MatMul_qkv"), 0))
    return run_in_order(launches, stack)


def layer_by_layer(launches: Sequence[Launch], layers: int) -> list[Launch]:
    """The step's launches in program order: each kernel run once per layer (``count`` a multiple of
    ``layers``: that many runs per layer) placed layer after layer, the others where they are (the
    ones before the first layer's kernel first, the rest after the last layer). A host dispatching
    every kernel while the device runs the ones before it then bounds the step by the longer of the
    layer's host and device times, as the real interleaving does; grouping a kernel's runs over the
    layers (the closed form) charges each kernel the longer of its own host and device times, which
    overstates a step mixing long and short kernels. Used where the host's time per kernel is large
    (the model code on an eager host, a host-scheduled graph)."""
    if layers <= 1:
        return list(launches)
    inside = [i for i, k in enumerate(launches) if k.count >= layers and k.count % layers == 0]
    if not inside:
        return list(launches)
    first = inside[0]
    before = [k for i, k in enumerate(launches) if i < first and i not in inside]
    after = [k for i, k in enumerate(launches) if i > first and i not in inside]
    layer = [dataclasses.replace(launches[i], count=launches[i].count // layers) for i in inside]
    return before + layer * layers + after


def step_time_us(kernels: Sequence[CostedKernel], stack: Stack, code: ModelCode | None = None,
                 dynamic_shapes: bool = False) -> float:
    """The time of one forward pass under ``stack`` (`step_timeline`)."""
    return float(step_timeline(kernels, stack, code, dynamic_shapes).step_us)


def hw_step_time_us(kernels: Sequence[CostedKernel], hw: Hardware) -> float:
    """`step_time_us` for a card setup: its stack, its model code, whether its shapes change."""
    return step_time_us(kernels, hw.stack, hw.code, hw.dynamic_shapes)


__all__ = ["MODEL_CODE", "Hardware", "KV_DTYPES", "ModelCode", "PRECISIONS", "check_hardware", "code_launches",
           "expected_expert_load", "forward_kernels", "hw_step_time_us", "is_dsa", "layer_by_layer", "linear_layers",
           "step_time_us",
           "step_timeline"]
