"""Decoder-only LLM architectures as the cost engine sees them: `LLMSpec`, read from a transformers
config (an object, a dict, a ``config.json`` path) or a known name, and the known names' configs.

Known names carry the fields of their public Hugging Face ``config.json`` (the source is each
entry's ``_source``); nothing is downloaded. `spec_of(model)` accepts any of: a known name, a
``config.json`` path, a transformers ``PretrainedConfig``, a dict in config.json form, an
`LLMSpec`, or a causal-LM module (its ``.config``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .validation import LLMConfigError, check_config, check_spec


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "_source": _hf("openai-community/gpt2"), "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
        "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
    },
    "llama-2-7b": {
        "_source": _hf("meta-llama/Llama-2-7b-hf"), "model_type": "llama", "vocab_size": 32000,
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "llama-3-8b": {
        "_source": _hf("meta-llama/Meta-Llama-3-8B"), "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False,
    },
    "llama-2-70b": {
        "_source": _hf("meta-llama/Llama-2-70b-hf"), "model_type": "llama", "vocab_size": 32000,
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "llama-3-70b": {
        "_source": _hf("meta-llama/Meta-Llama-3-70B"), "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False,
    },
    "qwen2-72b": {
        "_source": _hf("Qwen/Qwen2-72B"), "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 8192,
        "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen2-7b": {
        "_source": _hf("Qwen/Qwen2-7B"), "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        "_source": _hf("Qwen/Qwen2.5-7B-Instruct"), "model_type": "qwen2", "vocab_size": 152064,
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "max_position_embeddings": 32768, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen2-0.5b": {
        "_source": _hf("Qwen/Qwen2-0.5B"), "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "qwen3-0.6b": {
        "_source": _hf("Qwen/Qwen3-0.6B"), "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        "_source": _hf("Qwen/Qwen3-8B"), "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "_source": _hf("Qwen/Qwen3-32B"), "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 5120,
        "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen3-235b-a22b": {
        "_source": _hf("Qwen/Qwen3-235B-A22B"), "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 94,
        "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "max_position_embeddings": 40960, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "_source": _hf("Qwen/Qwen3-30B-A3B"), "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "max_position_embeddings": 40960, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "chatglm3-6b": {
        "_source": _hf("THUDM/chatglm3-6b"), "model_type": "chatglm", "padded_vocab_size": 65024,
        "hidden_size": 4096, "ffn_hidden_size": 13696, "num_layers": 28, "num_attention_heads": 32,
        "multi_query_attention": True, "multi_query_group_num": 2, "kv_channels": 128, "seq_length": 8192,
        "add_qkv_bias": True, "rmsnorm": True, "layernorm_epsilon": 1e-5,
    },
    "deepseek-v3": {
        "_source": _hf("deepseek-ai/DeepSeek-V3"), "model_type": "deepseek_v3", "vocab_size": 129280,
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
        "scoring_func": "sigmoid", "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "deepseek-v3.2": {
        # DeepSeek-V3's architecture plus the lightning indexer of DeepSeek Sparse Attention (each query
        # attends to the index_topk tokens the indexer picks); the fields beyond V3's are kept in
        # LLMSpec.extra (the engine's decode runs the indexer, then attention over the tokens it picks:
        # llm/forward.py, _dsa_indexer)
        "_source": _hf("deepseek-ai/DeepSeek-V3.2-Exp"), "model_type": "deepseek_v32", "vocab_size": 129280,
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
        "scoring_func": "sigmoid", "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
        "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128, "tie_word_embeddings": False,
    },
    "glm-4.5": {
        "_source": _hf("zai-org/GLM-4.5"), "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 5120,
        "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92,
        "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 160,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 3,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5, "use_qk_norm": True,
        "attention_bias": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1000000,
        "tie_word_embeddings": False,
    },
    "qwen3-next": {
        # Qwen3-Next-80B-A3B: three of every four layers are Gated DeltaNet linear attention (the
        # linear_* fields, kept in LLMSpec.extra), the fourth gated full attention
        "_source": _hf("Qwen/Qwen3-Next-80B-A3B-Instruct"), "model_type": "qwen3_next", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "num_experts": 512, "num_experts_per_tok": 10,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "full_attention_interval": 4,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 10000000,
        "tie_word_embeddings": False,
    },
    "mixtral-8x7b": {
        "_source": _hf("mistralai/Mixtral-8x7B-v0.1"), "model_type": "mixtral", "vocab_size": 32000,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "max_position_embeddings": 32768, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e6,
        "tie_word_embeddings": False,
    },
}


@dataclass(frozen=True)
class LLMSpec:
    """What the cost engine needs of a decoder-only LLM (one entry per architectural mechanism).

    ``mlp`` is "swiglu" (gate and up projections, SiLU) or "gelu" (one up projection); ``norm`` is
    "rms" or "layer"; ``rotary_fraction`` the share of each head's dims that RoPE rotates (0: learned
    positions, as GPT-2). MoE layers have ``experts`` > 0: ``top_k`` routed experts of
    ``expert_intermediate`` each, ``shared_experts`` always-on experts of ``shared_intermediate``,
    ``expert_groups`` / ``topk_groups`` for group-limited routing, and ``dense_layers`` leading
    layers that keep a dense MLP."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    mlp: str = "swiglu"
    norm: str = "rms"
    qkv_bias: bool = False
    qk_norm: bool = False
    rotary_fraction: float = 1.0
    tied_embeddings: bool = False
    max_positions: int = 4096
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    shared_intermediate: int = 0
    expert_groups: int = 1
    topk_groups: int = 1
    router: str = "softmax"
    dense_layers: int = 0
    kv_lora_rank: int = 0          # multi-head latent attention (DeepSeek-V2/V3): the cached latent's width
    q_lora_rank: int = 0
    qk_rope_dim: int = 0           # of head_dim, the part RoPE rotates (a shared key in MLA)
    v_head_dim: int = 0
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert's MLP."""
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * self.expert_intermediate

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def linear_attention_layers(self) -> int:
        """Layers of Gated DeltaNet linear attention (Qwen3-Next: all but every
        ``full_attention_interval``-th; its ``linear_*`` fields in ``extra``), 0 for other models."""
        every = int(self.extra.get("full_attention_interval") or 0)
        return self.layers - self.layers // every if every and "linear_num_value_heads" in self.extra else 0

    def _linear_attention_params(self) -> int:
        """One Gated DeltaNet layer (transformers ``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz``,
        ``in_proj_ba``, the depthwise convolution over q, k and v, ``dt_bias`` and ``A_log`` per value
        head, the gated norm and ``out_proj``."""
        x, h = self.extra, self.hidden
        kd = x["linear_num_key_heads"] * x["linear_key_head_dim"]
        vd = x["linear_num_value_heads"] * x["linear_value_head_dim"]
        return (h * (2 * kd + 2 * vd) + h * 2 * x["linear_num_value_heads"]
                + (2 * kd + vd) * x.get("linear_conv_kernel_dim", 4) + 2 * x["linear_num_value_heads"]
                + x["linear_value_head_dim"] + vd * h)

    def weight_params(self) -> int:
        """Parameters (weights, biases and norms), counted from the architecture."""
        h, d = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        if self.is_mla:
            nope, v, r, ql = d - self.qk_rope_dim, self.v_head_dim, self.kv_lora_rank, self.q_lora_rank
            q = h * ql + ql + ql * self.heads * d if ql else h * self.heads * d
            attn = q + h * (r + self.qk_rope_dim) + r + r * self.heads * (nope + v) + self.heads * v * h
        if self.qkv_bias:
            attn += (self.heads + 2 * self.kv_heads) * d
        norms = 2 * h + (2 * d if self.qk_norm else 0)
        dense_mlp = (3 if self.mlp == "swiglu" else 2) * h * self.intermediate
        per_expert = self.expert_params
        shared = (3 if self.mlp == "swiglu" else 2) * h * self.shared_intermediate * self.shared_experts
        moe_mlp = self.experts * per_expert + shared + h * self.experts
        body = self.layers * (attn + norms) + self.dense_layers * dense_mlp if self.is_moe else \
            self.layers * (attn + norms + dense_mlp)
        lin = self.linear_attention_layers
        if lin:   # Qwen3-Next: its full-attention layers' q_proj also gives the output gate
            body += (self.layers - lin) * h * self.heads * d - lin * (attn + norms) + \
                lin * (self._linear_attention_params() + 2 * h)
        if self.is_moe:
            body += self.moe_layers * moe_mlp
        embed = self.vocab * h * (1 if self.tied_embeddings else 2) + h
        if self.rotary_fraction == 0:
            embed += self.max_positions * h
        return int(body + embed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d["weight_params"] = self.weight_params()
        return d


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def spec_from_dict(cfg: dict[str, Any], name: str | None = None) -> LLMSpec:
    """An `LLMSpec` from a config in Hugging Face ``config.json`` form."""
    mt = str(cfg.get("model_type", "")).lower()
    name = name or cfg.get("_name_or_path") or mt or "model"
    src = cfg.get("_source", "")
    if mt == "gpt2":
        h = int(_get(cfg, "n_embd", "hidden_size"))
        heads = int(_get(cfg, "n_head", "num_attention_heads"))
        return LLMSpec(name=name, vocab=int(cfg["vocab_size"]), hidden=h, layers=int(_get(cfg, "n_layer", "num_hidden_layers")),
                       heads=heads, kv_heads=heads, head_dim=h // heads, intermediate=int(cfg.get("n_inner") or 4 * h),
                       mlp="gelu", norm="layer", qkv_bias=True, rotary_fraction=0.0,
                       tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                       max_positions=int(_get(cfg, "n_positions", "max_position_embeddings", default=1024)), source=src)
    if mt == "chatglm":
        h = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("multi_query_group_num", heads)) if cfg.get("multi_query_attention") else heads
        return LLMSpec(name=name, vocab=int(_get(cfg, "padded_vocab_size", "vocab_size")), hidden=h,
                       layers=int(_get(cfg, "num_layers", "num_hidden_layers")), heads=heads, kv_heads=kv,
                       head_dim=int(cfg.get("kv_channels", h // heads)), intermediate=int(cfg["ffn_hidden_size"]),
                       qkv_bias=bool(cfg.get("add_qkv_bias", True)), rotary_fraction=0.5,
                       max_positions=int(cfg.get("seq_length", 8192)), source=src)
    known = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3",
             "deepseek_v32", "glm4_moe", "qwen3_next"}
    if mt not in known:
        raise LLMConfigError(
            f"model_type {mt!r}: the LLM engine reads decoder-only configs of type gpt2, chatglm or "
            f"{', '.join(sorted(known))}. Fix: pass an LLMSpec(...) describing the architecture, or a config of "
            "one of these types")
    if mt == "deepseek_v32":
        spec = _deepseek(cfg, name, src)
        return replace(spec, extra={k: cfg[k] for k in ("index_topk", "index_n_heads", "index_head_dim") if k in cfg})
    if mt.startswith("deepseek"):
        return _deepseek(cfg, name, src)
    if mt == "glm4_moe":
        return _glm4_moe(cfg, name, src)
    if mt == "qwen3_next":
        return _qwen3_next(cfg, name, src)
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    experts = int(_get(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0))
    moe: dict[str, Any] = {}
    if experts:
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only = list(cfg.get("mlp_only_layers") or [])
        if step != 1 or only:
            raise LLMConfigError(
                f"decoder_sparse_step={step}, mlp_only_layers={only}: the engine models MoE in every layer "
                "after the first `dense_layers`. Fix: LLMSpec(..., dense_layers=N) for a leading dense block")
        shared_i = int(cfg.get("shared_expert_intermediate_size") or 0)
        moe = dict(experts=experts, top_k=int(cfg["num_experts_per_tok"]),
                   expert_intermediate=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
                   shared_experts=1 if shared_i else 0, shared_intermediate=shared_i)
    return LLMSpec(name=name, vocab=int(cfg["vocab_size"]), hidden=h, layers=int(cfg["num_hidden_layers"]),
                   heads=heads, kv_heads=kv, head_dim=hd, intermediate=int(cfg["intermediate_size"]),
                   qkv_bias=mt in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias", False)),
                   qk_norm=mt in ("qwen3", "qwen3_moe"),
                   rotary_fraction=float(cfg.get("partial_rotary_factor", 1.0)),
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   max_positions=int(cfg.get("max_position_embeddings", 4096)), source=src, **moe)


def _deepseek(cfg: dict[str, Any], name: str, src: str) -> LLMSpec:
    """DeepSeek-V2/V3: multi-head latent attention and a routed + shared MoE after the first
    ``first_k_dense_replace`` dense layers."""
    if not cfg.get("kv_lora_rank"):
        raise LLMConfigError(f"{name}: a DeepSeek config without kv_lora_rank. Rule: the engine reads DeepSeek's "
                             "multi-head latent attention from kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and "
                             "v_head_dim. Fix: pass the model's config.json")
    rope, nope = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"])
    shared = int(cfg.get("n_shared_experts") or 0)
    return LLMSpec(name=name, vocab=int(cfg["vocab_size"]), hidden=int(cfg["hidden_size"]),
                   layers=int(cfg["num_hidden_layers"]), heads=int(cfg["num_attention_heads"]), kv_heads=1,
                   head_dim=rope + nope, intermediate=int(cfg["intermediate_size"]),
                   rotary_fraction=rope / (rope + nope), max_positions=int(cfg.get("max_position_embeddings", 4096)),
                   experts=int(cfg["n_routed_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                   expert_intermediate=int(cfg["moe_intermediate_size"]), shared_experts=1 if shared else 0,
                   shared_intermediate=int(cfg["moe_intermediate_size"]) * shared,
                   expert_groups=int(cfg.get("n_group") or 1), topk_groups=int(cfg.get("topk_group") or 1),
                   router="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
                   dense_layers=int(cfg.get("first_k_dense_replace") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                   q_lora_rank=int(cfg.get("q_lora_rank") or 0), qk_rope_dim=rope, v_head_dim=int(cfg["v_head_dim"]),
                   source=src)


def _glm4_moe(cfg: dict[str, Any], name: str, src: str) -> LLMSpec:
    """GLM-4.5: grouped-query attention with biases, QK norm and half-rotary RoPE; a sigmoid-routed
    MoE with one shared expert after the first ``first_k_dense_replace`` dense layers."""
    shared = int(cfg.get("n_shared_experts") or 0)
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return LLMSpec(name=name, vocab=int(cfg["vocab_size"]), hidden=h, layers=int(cfg["num_hidden_layers"]),
                   heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or h // heads), intermediate=int(cfg["intermediate_size"]),
                   qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=bool(cfg.get("use_qk_norm", False)),
                   rotary_fraction=float(cfg.get("partial_rotary_factor", 1.0)),
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   max_positions=int(cfg.get("max_position_embeddings", 4096)),
                   experts=int(cfg["n_routed_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                   expert_intermediate=int(cfg["moe_intermediate_size"]), shared_experts=1 if shared else 0,
                   shared_intermediate=int(cfg["moe_intermediate_size"]) * shared,
                   expert_groups=int(cfg.get("n_group") or 1), topk_groups=int(cfg.get("topk_group") or 1),
                   router="sigmoid", dense_layers=int(cfg.get("first_k_dense_replace") or 0), source=src,
                   extra={"routed_scaling_factor": cfg.get("routed_scaling_factor")})


def _qwen3_next(cfg: dict[str, Any], name: str, src: str) -> LLMSpec:
    """Qwen3-Next: a MoE of 512 small experts (10 routed, one shared) in every layer; attention is
    hybrid, one gated full-attention layer in every ``full_attention_interval`` and Gated DeltaNet
    linear attention in the others. `LLMSpec` describes the full-attention layers; the linear ones
    (their heads and dims, the interval) are in ``extra``, from which the engine models those
    layers (`LLMSpec.linear_attention_layers`, ``forward._linear_attention``)."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    shared_i = int(cfg.get("shared_expert_intermediate_size") or 0)
    linear = {k: cfg[k] for k in ("full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                                  "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")
              if k in cfg}
    return LLMSpec(name=name, vocab=int(cfg["vocab_size"]), hidden=h, layers=int(cfg["num_hidden_layers"]),
                   heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or h // heads), intermediate=int(cfg["intermediate_size"]),
                   qk_norm=True, rotary_fraction=float(cfg.get("partial_rotary_factor", 1.0)),
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   max_positions=int(cfg.get("max_position_embeddings", 4096)),
                   experts=int(cfg["num_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                   expert_intermediate=int(cfg["moe_intermediate_size"]), shared_experts=1 if shared_i else 0,
                   shared_intermediate=shared_i, source=src, extra=linear)


def known_models() -> list[str]:
    return sorted(KNOWN_MODELS)


def spec_of(model: Any) -> LLMSpec:
    """The `LLMSpec` of ``model``: a known name, a ``config.json`` path, a config dict or object, an
    `LLMSpec`, or a module with a ``.config``. Every one passes the same gate
    (`validation.check_config` on the config's keys, `validation.check_spec` on the spec)."""
    if isinstance(model, LLMSpec):
        return check_spec(model)
    if isinstance(model, str) and model.lower() in KNOWN_MODELS:
        return _checked(KNOWN_MODELS[model.lower()], name=model.lower())
    if isinstance(model, (str, Path)):
        p = Path(model)
        if p.is_dir():
            p = p / "config.json"
        if p.suffix == ".json" and p.is_file():
            cfg = read_config_json(p)
            return _checked(cfg, name=cfg.get("_name_or_path") or p.parent.name or p.stem, where=str(p))
        raise LLMConfigError(
            f"model {str(model)!r}: not a known name and not a config.json file. Rule: a model is a known name "
            f"({', '.join(known_models())}), a config.json path, a transformers config or a causal-LM module. "
            "Fix: check the spelling or the path")
    if isinstance(model, dict):
        return _checked(model)
    cfg = getattr(model, "config", None) if not hasattr(model, "to_dict") else model
    if cfg is not None and hasattr(cfg, "to_dict"):
        d = cfg.to_dict()
        return _checked(d, name=d.get("_name_or_path") or None)
    raise LLMConfigError(
        f"model of type {type(model).__name__}: the LLM engine reads a known name, a config.json path, a "
        "transformers PretrainedConfig, a config dict, an LLMSpec or a module with a .config. Fix: pass one of these")


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The dict of a ``config.json`` file; `LLMConfigError` for a file that is not UTF-8 JSON of an object."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")
        cfg = json.loads(text)
    except UnicodeDecodeError as e:
        raise LLMConfigError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}). Rule: a "
                             "config.json is UTF-8 JSON. Fix: pass the model's config.json as Hugging Face "
                             "writes it") from None
    except json.JSONDecodeError as e:
        raise LLMConfigError(f"{p}: not valid JSON ({e}). Fix: pass a Hugging Face config.json") from None
    except OSError as e:
        raise LLMConfigError(f"{p}: cannot be read ({e.strerror or e}). Fix: check the path and its "
                             "permissions") from None
    if not isinstance(cfg, dict):
        raise LLMConfigError(f"{p}: holds a JSON {type(cfg).__name__}, not an object. Rule: a config.json is one "
                             "JSON object of config keys. Fix: pass the model's config.json")
    return cfg


def _checked(cfg: dict[str, Any], name: str | None = None, where: str = "") -> LLMSpec:
    """``spec_from_dict`` behind the gate: the config's keys checked first (errors name them), a
    key the architecture needs and lacks named, then the spec itself checked."""
    check_config(cfg, where=where or str(name or cfg.get("_name_or_path") or cfg.get("model_type") or ""))
    try:
        spec = spec_from_dict(cfg, name=name)
    except KeyError as e:
        mt = cfg.get("model_type")
        raise LLMConfigError(f"{where or name or mt}: the config has no {e.args[0]!r} key, which a {mt} model needs. "
                             f"Fix: add it (the model's config.json has it), or pass a known name "
                             f"({', '.join(known_models())})") from None
    return check_spec(spec)


def with_layers(spec: LLMSpec, layers: int) -> LLMSpec:
    """The same architecture with ``layers`` layers (a small copy for numerics checks)."""
    return replace(spec, layers=layers, dense_layers=min(spec.dense_layers, layers))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fits_tp(spec: LLMSpec, tp: int) -> None:
    """Raise `LLMConfigError` unless ``tp`` divides the heads and the MLP width (Megatron's split)."""
    if tp < 1:
        raise LLMConfigError(f"tp = {tp}: tensor parallelism is a positive card count. Fix: tp=1 or more")
    if spec.heads % tp:
        raise LLMConfigError(
            f"tp = {tp}: {spec.name} has {spec.heads} attention heads, and Megatron's column split gives every "
            f"card whole heads. Fix: a tp that divides {spec.heads}, e.g. "
            f"{max(d for d in range(1, tp + 1) if spec.heads % d == 0)}")
    width = spec.expert_intermediate if spec.is_moe and not spec.dense_layers else spec.intermediate
    if width % tp:
        raise LLMConfigError(f"tp = {tp}: the MLP width {width} does not split evenly. Fix: a tp that divides {width}")


def kv_heads_per_card(spec: LLMSpec, tp: int) -> int:
    """KV heads each card holds: split when there are at least ``tp``, else replicated (as vLLM does)."""
    if spec.is_mla:
        return 1            # the latent is shared by every head: each card caches it whole
    return spec.kv_heads // tp if spec.kv_heads >= tp else 1


__all__ = ["KNOWN_MODELS", "LLMConfigError", "LLMSpec", "ceil_div", "fits_tp", "known_models", "kv_heads_per_card",
           "spec_from_dict", "spec_of", "with_layers"]
