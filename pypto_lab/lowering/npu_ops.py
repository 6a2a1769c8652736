"""Lowering rules of torch_npu's fused operators: the CANN kernel each one launches, as a spec of the
one kernel IR (`pypto_lab.kernels.ir`).

vLLM-Ascend, MindSpeed and hand-ported models call these operators directly
(``torch_npu.npu_rms_norm``, ``torch_npu.npu_fusion_attention``, ...); torch_npu registers them as
``torch.ops.npu.<name>``, so a graph or an eager trace shows them as ``npu.<name>.default``, and
the lowering table (`pypto_lab.lowering.table`) keys them by ``<name>``. A rule reads the shapes of
the operator's tensors from the one-node graph it is given and its attributes by name (the schema
torch_npu documents), and builds the spec the LLM engine builds for the same CANN kernel
(`pypto_lab.llm.forward`: RmsNorm, AddRmsNorm, RotaryPositionEmbedding, SwiGlu, MoeGatingTopK,
GroupedMatmul, PromptFlashAttention / IncreFlashAttention), so an operator costs the same whichever
front end meets it.

Where a kernel's work depends on run-time values, not shapes (a grouped matmul's rows per expert,
the actual lengths of a varlen batch), the rule costs it from the shapes, as the table's
``_grouped_mm`` rule does: the tokens spread evenly over the experts, the batch's mean length.
``MlaProlog`` (one fused CANN kernel) is a `Decomposed` of its stages (three matmuls, the per-head
absorption, two RmsNorms, the RoPE and the cache writes): one launch whose time is its stages'
in sequence, their GM round trips counted (an upper bound of the fused kernel).
"""

from __future__ import annotations

from math import prod

from ..capture.graph import Graph, Node
from ..hw.chip import Chip
from ..kernels.ir import (
    AttentionKernel,
    CubeKernel,
    Decomposed,
    IncreAttentionKernel,
    KernelSpec,
    MoeGatingKernel,
    TransDataKernel,
    VectorKernel,
)
from .lower import vector_spec
from .precision import Precision

# each operator's arguments by position, as torch_npu's schema orders them (keyword-only ones last)
ARGS: dict[str, tuple[str, ...]] = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),
    "npu_rotary_mul": ("self", "r1", "r2", "rotary_mode"),
    "npu_swiglu": ("self", "dim"),
    "npu_fusion_attention": ("query", "key", "value", "head_num", "input_layout", "pse", "padding_mask",
                             "atten_mask", "scale", "keep_prob", "pre_tockens", "next_tockens", "inner_precise",
                             "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode"),
    "npu_fusion_attention_grad": ("query", "key", "value", "dy", "head_num", "input_layout"),
    "npu_fused_infer_attention_score": ("query", "key", "value"),
    "npu_moe_gating_top_k": ("x", "k"),
    "npu_moe_gating_top_k_softmax": ("x", "finished", "k"),
    "npu_grouped_matmul": ("x", "weight"),
    "npu_mla_prolog": ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
                       "rmsnorm_gamma_ckv", "rope_sin", "rope_cos", "cache_index", "kv_cache", "kr_cache"),
    "npu_quant_matmul": ("x1", "x2", "scale"),
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset"),
    "npu_dynamic_quant": ("input",),
    "npu_quantize": ("input", "scales", "zero_points", "dtype", "axis", "div_mode"),
    "npu_format_cast": ("self", "acl_format"),
    "npu_rms_norm_backward": ("dy", "self", "gamma", "rstd"),
    "npu_swiglu_backward": ("grad_output", "self", "dim"),
    "npu_rotary_mul_backward": ("grad", "self", "r1", "r2", "rotary_mode"),
}

_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp32", "int8": "int8",
           "uint8": "int8", "bool": "int8"}


def arg(node: Node, name: str, default=None):
    """The argument ``name`` of a torch_npu operator's node: by keyword, else by its position in
    `ARGS`, else ``default``."""
    if name in node.kwargs:
        return node.kwargs[name]
    names = ARGS.get(node.op, ())
    if name in names and names.index(name) < len(node.args):
        return node.args[names.index(name)]
    return default


def shape(graph: Graph, ref) -> tuple[int, ...]:
    """The shape of a tensor argument (its name in the graph), () for None."""
    if isinstance(ref, str):
        info = graph.info(ref)
        return tuple(info.shape) if info is not None else ()
    return ()


def dtype(graph: Graph, ref, fallback: str = "fp16") -> str:
    """The IR dtype of a tensor argument (fp16, bf16, fp32, int8)."""
    if isinstance(ref, str):
        info = graph.info(ref)
        if info is not None:
            return _DTYPES.get(info.dtype, "fp32")
    return fallback


def _vec_dtype(d: str) -> str:
    return d if d in ("fp16", "bf16", "fp32") else "fp16"


# ---- norms, RoPE, SwiGlu -------------------------------------------------------------------

def rms_norm(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """RmsNorm: ``y = x / sqrt(mean(x^2) + eps) * gamma`` over the gamma-shaped trailing dimensions,
    statistics in fp32 (the LLM engine's RmsNorm)."""
    x, gamma = arg(node, "self"), arg(node, "gamma")
    xs, row = shape(graph, x), prod(shape(graph, gamma)) or 1
    return vector_spec("RmsNorm", ("rmsnorm",), prod(xs) or 1, _vec_dtype(dtype(graph, x)), "fp32", None, row)


def add_rms_norm(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """AddRmsNorm: the residual add in front of the norm in one kernel, both sums and the norm written
    (the LLM engine's AddRmsNorm: three streams)."""
    x, gamma = arg(node, "x1"), arg(node, "gamma")
    xs, row = shape(graph, x), prod(shape(graph, gamma)) or 1
    return vector_spec("AddRmsNorm", ("add", "rmsnorm"), prod(xs) or 1, _vec_dtype(dtype(graph, x)), "fp32", 3, row)


def rotary_mul(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """RotaryMul (RotaryPositionEmbedding): ``x * r1 + rotate(x) * r2`` over x, the tables streamed in."""
    x = arg(node, "self")
    d = _vec_dtype(dtype(graph, x))
    return VectorKernel("RotaryMul", ("rope",), max(1, prod(shape(graph, x))), d, d)


def swiglu(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """SwiGlu: ``silu(a) * b`` of the two halves of one dimension, over the output's elements."""
    x = arg(node, "self")
    d = _vec_dtype(dtype(graph, x))
    return VectorKernel("SwiGlu", ("swiglu",), max(1, prod(shape(graph, x)) // 2), d, d)


def rms_norm_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """RmsNormGrad: the input's gradient (a row reduction with the saved rstd) and gamma's."""
    x, gamma = arg(node, "self"), arg(node, "gamma")
    row = prod(shape(graph, gamma)) or 1
    return vector_spec("RmsNormGrad", ("mul", "rmsnorm", "mul"), prod(shape(graph, x)) or 1,
                       _vec_dtype(dtype(graph, x)), "fp32", 3, row)


def swiglu_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    x = arg(node, "self")
    d = _vec_dtype(dtype(graph, x))
    return VectorKernel("SwiGluGrad", ("swiglu", "mul", "mul"), max(1, prod(shape(graph, x)) // 2), d, d, 3)


def rotary_mul_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    x = arg(node, "self")
    d = _vec_dtype(dtype(graph, x))
    return VectorKernel("RotaryMulGrad", ("rope",), max(1, prod(shape(graph, x))), d, d)


# ---- attention ------------------------------------------------------------------------------

def attention_dims(qs: tuple[int, ...], ks: tuple[int, ...], layout: str, heads: int,
                   kv_heads: int | None = None) -> tuple[int, int, int, int, int, int]:
    """(batch, query heads, kv heads, s_q, s_kv, head dim) of query and key shapes in a torch_npu
    layout: BSH, SBH, BSND, BNSD, BNSD_BSND (query BNSD), TND (one packed batch: batch 1)."""
    layout = layout.upper()
    if layout.startswith("BNSD"):
        b, n, sq, d = qs
        return b, n, ks[1], sq, ks[2], d
    if layout == "BSND":
        b, sq, n, d = qs
        return b, n, ks[2], sq, ks[1], d
    if layout == "TND":
        t, n, d = qs
        return 1, n, ks[1], t, ks[0], d
    if layout == "BSH":
        b, sq, h = qs
        d = h // max(1, heads)
        return b, heads, (kv_heads or ks[2] // max(1, d)), sq, ks[1], d
    if layout == "SBH":
        sq, b, h = qs
        d = h // max(1, heads)
        return b, heads, (kv_heads or ks[2] // max(1, d)), sq, ks[0], d
    raise ValueError(f"input_layout {layout!r}: torch_npu's layouts are BSH, SBH, BSND, BNSD, TND")


def _mean_lengths(seqlens, total: int) -> tuple[int, int]:
    """(sequences, mean length) of a varlen batch from its cumulative lengths (TND)."""
    if isinstance(seqlens, (list, tuple)) and seqlens:
        ends = [int(v) for v in seqlens]
        lengths = [e - s for s, e in zip([0] + ends[:-1], ends)]
        n = len(lengths)
        return n, max(1, round(sum(lengths) / n))
    return 1, max(1, total)


def _causal(sparse_mode: int, next_tokens) -> bool:
    """FlashAttention skips the blocks above the diagonal for the causal sparse modes (2 leftUpCausal,
    3 rightDownCausal) and for a band whose upper edge is the diagonal (next_tokens = 0)."""
    return int(sparse_mode or 0) in (2, 3) or (int(sparse_mode or 0) in (0, 4) and next_tokens == 0)


def fusion_attention(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """FlashAttentionScore: one fused kernel over ``batch x heads`` (query heads: a GQA key/value head
    is read by each of its query heads), causal when the sparse mode makes it so; a TND batch as
    its sequences at their mean lengths."""
    q, k = arg(node, "query"), arg(node, "key")
    layout = str(arg(node, "input_layout", "BSH"))
    b, n, _, sq, skv, d = attention_dims(shape(graph, q), shape(graph, k), layout, int(arg(node, "head_num", 1)))
    if layout.upper() == "TND":
        b, sq = _mean_lengths(arg(node, "actual_seq_qlen"), sq)
        _, skv = _mean_lengths(arg(node, "actual_seq_kvlen"), skv)
    causal = _causal(arg(node, "sparse_mode", 0), arg(node, "next_tockens", 2147483647))
    return AttentionKernel(max(1, b * n), max(1, sq), max(1, skv), max(1, d), _vec_dtype(dtype(graph, q)),
                           flash=True, causal=causal and sq <= skv)


def fusion_attention_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    """FlashAttentionScoreGrad: the scores recomputed and five GEMMs to the forward's two, one kernel
    (`pypto_lab.hw.attention_grad`), as the table's FlashAttention backward is."""
    q, k = arg(node, "query"), arg(node, "key")
    layout = str(arg(node, "input_layout", "BSH"))
    b, n, _, sq, skv, d = attention_dims(shape(graph, q), shape(graph, k), layout, int(arg(node, "head_num", 1)))
    dt = _vec_dtype(dtype(graph, q))
    causal = _causal(arg(node, "sparse_mode", 0), arg(node, "next_tockens", 2147483647))
    return [AttentionKernel(max(1, b * n), max(1, sq), max(1, skv), max(1, d), dt, flash=True,
                            causal=causal and sq <= skv, backward=True)]


def fused_infer_attention(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """FusedInferAttentionScore: IncreFlashAttention for one query token per sequence (decode: the
    query heads of each KV head share its cache, read once), PromptFlashAttention otherwise."""
    q, k = arg(node, "query"), arg(node, "key")
    layout = str(arg(node, "input_layout", "BSH"))
    heads = int(arg(node, "num_heads", 1))
    kvh = int(arg(node, "num_key_value_heads", 0) or 0) or heads
    qs, ks = shape(graph, q), shape(graph, k)
    block_table = arg(node, "block_table")
    dt = _vec_dtype(dtype(graph, q))
    kv_dt = dtype(graph, k)
    if block_table is not None:     # paged cache: [blocks, block_size, H] or [blocks, N, block_size, D]
        bt = shape(graph, block_table)
        block = int(arg(node, "block_size", 0) or (ks[1] if len(ks) == 3 else ks[2]))
        b = qs[0] if layout.upper() != "TND" else len(arg(node, "actual_seq_lengths") or [1])
        d = qs[-1] if layout.upper() in ("BSND", "BNSD", "TND") else qs[-1] // max(1, heads)
        sq = 1 if layout.upper() == "TND" else (qs[2] if layout.upper() == "BNSD" else qs[1])
        lens = arg(node, "actual_seq_lengths_kv")
        skv = round(sum(lens) / len(lens)) if isinstance(lens, (list, tuple)) and lens else bt[-1] * block
    else:
        b, heads, kvh, sq, skv, d = attention_dims(qs, ks, layout, heads, kvh)
        lens = arg(node, "actual_seq_lengths_kv")
        if isinstance(lens, (list, tuple)) and lens:
            skv = max(1, round(sum(int(v) for v in lens) / len(lens)))
    if sq == 1:   # the cache holds fp16, bf16 or int8 (an fp32 call is costed with an fp16 cache)
        kv = kv_dt if kv_dt in ("fp16", "bf16", "int8") else (dt if dt in ("fp16", "bf16") else "fp16")
        return IncreAttentionKernel(max(1, b), max(1, kvh), max(1, heads // max(1, kvh)), max(1, skv), max(1, d), dt, kv)
    causal = _causal(arg(node, "sparse_mode", 0), arg(node, "next_tokens", 2147483647))
    return AttentionKernel(max(1, b * heads), sq, max(1, skv), max(1, d), dt, flash=True, causal=causal and sq <= skv)


# ---- MoE --------------------------------------------------------------------------------------

def moe_gating_top_k(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """MoeGatingTopK: the score function (softmax for norm_type 0, sigmoid for 1) and k rounds of a
    row max over each token's experts."""
    x = arg(node, "x")
    tokens, experts = (shape(graph, x) + (1, 1))[:2]
    router = "softmax" if int(arg(node, "norm_type", 1)) == 0 else "sigmoid"
    return MoeGatingKernel(max(1, tokens), max(1, experts), max(1, int(arg(node, "k", 1))), router,
                           _vec_dtype(dtype(graph, x)))


def moe_gating_top_k_softmax(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    x = arg(node, "x")
    xs = shape(graph, x)
    return MoeGatingKernel(max(1, prod(xs[:-1])), max(1, xs[-1]), max(1, int(arg(node, "k", 1))), "softmax",
                           _vec_dtype(dtype(graph, x)))


def grouped_matmul(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """GroupedMatmul: with a group list (group_type 0, the rows split by expert), the tokens spread
    evenly over as many experts as there are tokens (at most E), each a batch entry of the Cube
    kernel that reads its whole weight (the table's ``_grouped_mm`` rule); without one, the pairs
    ``x[i] @ weight[i]`` as a batch at their mean shape. int8 weights with antiquant scales run
    WeightQuantBatchMatmul-style (W8A16); int8 activations with scales, int8 on the Cube."""
    xs = [shape(graph, r) for r in (arg(node, "x") or [])]
    ws = [shape(graph, r) for r in (arg(node, "weight") or [])]
    if not xs or not ws:
        raise ValueError("npu_grouped_matmul: x and weight are lists of tensors")
    x_dt = dtype(graph, (arg(node, "x") or [None])[0])
    w_dt = dtype(graph, (arg(node, "weight") or [None])[0])
    k = xs[0][-1]
    n = ws[0][-1]
    if arg(node, "group_list") is not None and len(xs) == 1:
        experts_total = ws[0][0] if len(ws) == 1 and len(ws[0]) == 3 else len(ws)
        rows = prod(xs[0][:-1])
        experts = max(1, min(experts_total, rows))
        batch, m = experts, -(-rows // experts)
    else:
        batch = len(xs)
        m = max(1, round(sum(prod(s[:-1]) for s in xs) / batch))
    if w_dt == "int8" and x_dt != "int8":
        act = x_dt if x_dt in ("fp16", "bf16") else "fp16"
        return CubeKernel("GroupedMatmul", max(1, batch), m, max(1, k), max(1, n), act, act, weight_dtype="int8")
    if x_dt == "int8":
        return CubeKernel("GroupedMatmul", max(1, batch), m, max(1, k), max(1, n), "int8", "fp16")
    return CubeKernel("GroupedMatmul", max(1, batch), m, max(1, k), max(1, n), _vec_dtype(x_dt), _vec_dtype(x_dt))


# ---- quantised matmuls -------------------------------------------------------------------------

def _gemm(xs: tuple[int, ...], ws: tuple[int, ...]) -> tuple[int, int, int, int]:
    batch = prod(xs[:-2]) if len(xs) > 2 and len(ws) > 2 else 1
    m = prod(xs[:-1]) // batch
    return max(1, batch), max(1, m), max(1, xs[-1]), max(1, ws[-1])


def quant_matmul(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """QuantBatchMatmulV3: int8 x int8 on the Cube, dequantised by its scale in the epilogue."""
    b, m, k, n = _gemm(shape(graph, arg(node, "x1")), shape(graph, arg(node, "x2")))
    out = node.outputs[0].dtype if node.outputs else "float16"
    return CubeKernel("QuantBatchMatmulV3", b, m, k, n, "int8", {"int8": "int8", "int32": "int32"}.get(out, "fp16"))


def weight_quant_batchmatmul(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """WeightQuantBatchMatmulV2 (W8A16): int8 weights dequantised on the way into the Cube."""
    x = arg(node, "x")
    b, m, k, n = _gemm(shape(graph, x), shape(graph, arg(node, "weight")))
    act = dtype(graph, x)
    act = act if act in ("fp16", "bf16") else "fp16"
    return CubeKernel("WeightQuantBatchMatmulV2", b, m, k, n, act, act, weight_dtype="int8")


def dynamic_quant(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """DynamicQuant: a row max of |x|, then the scaled, rounded int8 values (one Vector kernel)."""
    x = arg(node, "input")
    xs = shape(graph, x)
    return vector_spec("DynamicQuant", ("max", "cast"), prod(xs) or 1, _vec_dtype(dtype(graph, x)), "fp32", None,
                       xs[-1] if xs else 1)


def quantize(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    x = arg(node, "input")
    return VectorKernel("Quantize", ("mul", "cast"), max(1, prod(shape(graph, x))), _vec_dtype(dtype(graph, x)), "fp32")


def format_cast(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """TransData: a format conversion moves every byte GM -> UB -> GM."""
    x = arg(node, "self")
    return TransDataKernel(max(1, prod(shape(graph, x))), dtype(graph, x), "ND", "FRACTAL_NZ")


# ---- MLA prolog ----------------------------------------------------------------------------------

def mla_prolog(graph: Graph, node: Node, chip: Chip, precision: Precision) -> KernelSpec:
    """MlaProlog: x @ W_DQ, RmsNorm, @ W_UQ_QR, the per-head absorption @ W_UK, RoPE of the query's
    rope part; x @ W_DKV_KR, RmsNorm of the latent, RoPE of the key's rope part, both written into
    the paged caches. One launch (see the module docstring)."""
    x = arg(node, "token_x")
    xs = shape(graph, x)
    t = prod(xs[:-1]) or 1
    he = xs[-1]
    hcq = shape(graph, arg(node, "weight_dq"))[-1]
    nqr = shape(graph, arg(node, "weight_uq_qr"))[-1]
    n, dn, hckv = shape(graph, arg(node, "weight_uk"))
    hkr = shape(graph, arg(node, "weight_dkv_kr"))[-1]
    dr = hkr - hckv
    dt = _vec_dtype(dtype(graph, x))
    parts = (
        CubeKernel("MatMulV2", 1, t, he, hcq, dt, dt),
        vector_spec("RmsNorm", ("rmsnorm",), t * hcq, dt, "fp32", None, hcq),
        CubeKernel("MatMulV2", 1, t, hcq, nqr, dt, dt),
        CubeKernel("BatchMatMulV2", max(1, n), t, max(1, dn), max(1, hckv), dt, dt),
        VectorKernel("RotaryPositionEmbedding", ("rope",), max(1, t * n * dr), dt, dt),
        CubeKernel("MatMulV2", 1, t, he, hkr, dt, dt),
        vector_spec("RmsNorm", ("rmsnorm",), t * hckv, dt, "fp32", None, hckv),
        VectorKernel("RotaryPositionEmbedding", ("rope",), max(1, t * dr), dt, dt),
        VectorKernel("ScatterUpdate", ("copy",), max(1, t * hkr), dt, dt),
    )
    return Decomposed("MlaProlog", parts)


__all__ = ["ARGS", "add_rms_norm", "arg", "attention_dims", "dynamic_quant", "format_cast", "fused_infer_attention",
           "fusion_attention", "fusion_attention_backward", "grouped_matmul", "mla_prolog", "moe_gating_top_k",
           "moe_gating_top_k_softmax", "quant_matmul", "quantize", "rms_norm", "rms_norm_backward", "rotary_mul",
           "rotary_mul_backward", "swiglu", "swiglu_backward", "weight_quant_batchmatmul"]
