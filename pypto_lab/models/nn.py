"""Modules written the way the NPU likes them.

`FusedBERTLayer` is the seed article's ``pypto.nn.FusedBERTLayer`` (section 6.2): one BERT
encoder layer with the same parameters and the same math as transformers' ``BertLayer``, written
so that `pypto_lab.optimize` finds what it fuses:

* attention is one ``torch.nn.functional.scaled_dot_product_attention`` call, so the captured
  graph holds one SDPA node that `fuse_attention` turns into a FlashAttention kernel;
* each residual add feeds its LayerNorm directly (`fuse_layernorm` pulls the add into the
  LayerNorm kernel);
* GELU follows the intermediate ``Linear`` directly (the matmul epilogue fusion of
  `fuse_conv_bn_relu`).

``npu_optimized=True`` (the default) is that layout of the computation. ``npu_optimized=False``
computes the same numbers the way ``BertLayer``'s eager path does: explicit ``Q K^T``, scale,
mask, softmax and ``P V`` (no SDPA node), so a report shows what the fused attention saves.
Both are numerically ``BertLayer`` (same parameters, eval-mode outputs equal within float
rounding); dropout is applied only in training mode, as in ``BertLayer``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


class FusedBERTLayer(nn.Module):
    """One BERT encoder layer: self-attention, output dense + residual LayerNorm, intermediate
    dense + activation, output dense + residual LayerNorm.

    ``forward(hidden_states, attention_mask=None)`` takes ``hidden_states`` of shape
    ``(batch, seq, hidden_size)`` and an optional mask: an additive float mask broadcastable to
    ``(batch, heads, seq, seq)`` (what ``BertModel`` passes its layers, 0 to keep and a large
    negative number to mask), a boolean mask of the same shape (True keeps), or a 2-D
    ``(batch, seq)`` padding mask of 1 (keep) / 0 (pad). Returns the new hidden states.
    """

    def __init__(self, hidden_size: int = 768, num_attention_heads: int = 12, intermediate_size: int = 3072,
                 hidden_act: str = "gelu", npu_optimized: bool = True, layer_norm_eps: float = 1e-12,
                 hidden_dropout_prob: float = 0.1, attention_probs_dropout_prob: float = 0.1):
        super().__init__()
        for label, v in (("hidden_size", hidden_size), ("num_attention_heads", num_attention_heads),
                         ("intermediate_size", intermediate_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"FusedBERTLayer {label} = {v!r}: must be a positive integer")
        if hidden_size % num_attention_heads:
            raise ValueError(f"FusedBERTLayer hidden_size = {hidden_size} is not a multiple of num_attention_heads = "
                             f"{num_attention_heads}: each head takes hidden_size / heads features; e.g. "
                             f"num_attention_heads = {math.gcd(hidden_size, num_attention_heads)}")
        if hidden_act not in _ACTIVATIONS:
            raise ValueError(f"FusedBERTLayer hidden_act = {hidden_act!r} is not known; choose one of "
                             f"{', '.join(_ACTIVATIONS)}")
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.npu_optimized = bool(npu_optimized)
        self.layer_norm_eps = layer_norm_eps
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.attention_output = nn.Linear(hidden_size, hidden_size)
        self.attention_layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.intermediate = nn.Linear(hidden_size, intermediate_size)
        self.output = nn.Linear(intermediate_size, hidden_size)
        self.output_layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)

    # ---- weights from transformers ----------------------------------------------------------

    _BERT_NAMES = {
        "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
        "attention_output": "attention.output.dense", "attention_layer_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense", "output": "output.dense", "output_layer_norm": "output.LayerNorm",
    }

    def load_from_bert_layer(self, bert_layer: nn.Module) -> FusedBERTLayer:
        """Copy the weights of a transformers ``BertLayer`` (same sizes) into this layer; returns self."""
        source = dict(bert_layer.named_modules())
        missing = [path for path in self._BERT_NAMES.values() if path not in source]
        if missing:
            raise ValueError(f"load_from_bert_layer: {type(bert_layer).__name__} has no {', '.join(missing)}; pass a "
                             "transformers BertLayer (e.g. BertModel(...).encoder.layer[0])")
        with torch.no_grad():
            for mine, path in self._BERT_NAMES.items():
                dst, src = getattr(self, mine), source[path]
                if dst.weight.shape != src.weight.shape:
                    raise ValueError(f"load_from_bert_layer: {path}.weight has shape {tuple(src.weight.shape)}, this "
                                     f"layer's {mine}.weight {tuple(dst.weight.shape)}; build FusedBERTLayer with the "
                                     "BERT config's hidden_size, num_attention_heads and intermediate_size")
                dst.weight.copy_(src.weight)
                dst.bias.copy_(src.bias)
        return self

    @classmethod
    def from_bert_layer(cls, bert_layer: nn.Module, npu_optimized: bool = True) -> FusedBERTLayer:
        """A FusedBERTLayer with the configuration and weights of a transformers ``BertLayer``."""
        attn = bert_layer.attention.self
        heads = attn.num_attention_heads
        hidden = attn.query.in_features
        inter = bert_layer.intermediate.dense.out_features
        cfg = getattr(attn, "config", None)
        act = getattr(cfg, "hidden_act", "gelu") if cfg is not None else "gelu"
        eps = bert_layer.output.LayerNorm.eps
        layer = cls(hidden, heads, inter, act if isinstance(act, str) else "gelu", npu_optimized, eps,
                    bert_layer.output.dropout.p, getattr(attn.dropout, "p", 0.1) if hasattr(attn, "dropout") else 0.1)
        return layer.load_from_bert_layer(bert_layer)

    # ---- forward ----------------------------------------------------------------------------

    def _mask(self, attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:  # (batch, seq) padding mask: 1 keeps, 0 pads
            keep = attention_mask[:, None, None, :].to(dtype)
            return (1.0 - keep) * torch.finfo(dtype).min
        if attention_mask.dtype == torch.bool:
            return attention_mask
        return attention_mask.to(dtype)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        p = self.attention_probs_dropout_prob if self.training else 0.0
        if self.npu_optimized:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool \
                else scores + mask
        probs = F.dropout(torch.softmax(scores, dim=-1), p, self.training)
        return torch.matmul(probs, v)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"FusedBERTLayer expects hidden_states of shape (batch, seq, {self.hidden_size}), got "
                             f"{tuple(hidden_states.shape)}")
        b, s, _ = hidden_states.shape
        heads, d = self.num_attention_heads, self.head_dim

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, s, heads, d).transpose(1, 2)

        q, k, v = split(self.query(hidden_states)), split(self.key(hidden_states)), split(self.value(hidden_states))
        ctx = self._attention(q, k, v, self._mask(attention_mask, hidden_states.dtype))
        ctx = ctx.transpose(1, 2).reshape(b, s, self.hidden_size)
        attn = self.attention_layer_norm(self.dropout(self.attention_output(ctx)) + hidden_states)
        inter = _ACTIVATIONS[self.hidden_act](self.intermediate(attn))
        return self.output_layer_norm(self.dropout(self.output(inter)) + attn)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}, "
                f"intermediate_size={self.intermediate_size}, hidden_act={self.hidden_act!r}, "
                f"npu_optimized={self.npu_optimized}")


__all__ = ["FusedBERTLayer"]
