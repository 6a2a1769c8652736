"""fairseq's RoBERTa-base encoder with its SST-2 head, as the ModelZoo RoBERTa rows compiled it.

The published 310P3 RoBERTa rows (Ascend/ModelZoo-PyTorch ``ACL_PyTorch/contrib/nlp/roberta``,
README at commit c79df832adff) run fairseq's model (``pytorch/fairseq`` at c1624b27, patched by the
README's ``roberta-infer.patch`` so that ``forward`` returns the classification head's logits),
exported to ONNX by ``RoBERTa_pth2onnx.py`` at a fixed batch and ``--pad_length``, simplified by
onnxsim and rewritten by the README's ``opt_onnx.py`` before ATC. This module writes that model
in torch, op for op, with random weights (the simulator needs shapes, not values):

* Embeddings as fairseq's ``TransformerSentenceEncoder`` computes them: token embedding (padding
  index 1), learned positions from ``utils.make_positions`` (``cumsum`` of the non-pad mask, times
  the mask, plus the padding index), their sum, ``emb_layer_norm``, then the padded positions
  zeroed (``x * (1 - padding_mask)``: the Sub -> Mul that ``opt_onnx.merge_axis`` finds).
* Twelve post-LayerNorm ``TransformerEncoderLayer``s: fairseq's ``MultiheadAttention`` with
  separate ``q_proj``/``k_proj``/``v_proj`` Linear layers (three Gemms, not one fused QKV),
  ``out_proj``, ``self_attn_layer_norm``, ``fc1`` -> GELU -> ``fc2``, ``final_layer_norm``.
* The classification head ``sentence_classification_head``: the first token, ``dense``, tanh,
  ``out_proj`` to 2 classes.

``layout="opt_onnx"`` (the default: what the README hands to ATC) applies ``opt_onnx.py``'s
rewrite: the first and last Transpose (fairseq's B x T x C <-> T x B x C) removed, the hidden
states kept as a 2-D ``[batch * seq, 768]`` tensor for the Gemms, each head's q, k, v reshaped to
``[batch, seq, 12, 64]`` and transposed ``[0, 2, 1, 3]`` (k once more ``[0, 1, 3, 2]``), the
scaling multiplied onto the scores after the first matmul, the key-padding ``Where`` replaced by
an ``Add`` of ``mask * -65504`` expanded to ``[batch, 1, seq, seq]``, the softmax on the last axis,
and the context transposed ``[0, 2, 1, 3]`` and reshaped to ``[-1, 768]``.

``layout="fairseq"`` is fairseq's own export before that rewrite: time-major ``T x B x C``
hidden states, q, k, v viewed as ``(T, B * heads, 64)`` and transposed to ``(B * heads, T, 64)``,
``torch.bmm`` for the scores and the context, the padding mask applied by ``masked_fill`` on a
``(B, heads, T, T)`` view, and the context transposed back to ``T x B x C``.
"""

from __future__ import annotations

import torch
from torch import nn

PAD = 1            # fairseq's dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3
VOCAB = 50265      # roberta.base's dictionary (GPT-2 BPE) as fairseq loads it
MAX_POSITIONS = 514
HIDDEN, HEADS, FFN, LAYERS = 768, 12, 3072, 12
LAYOUTS = ("opt_onnx", "fairseq")


class MultiheadAttention(nn.Module):
    def __init__(self, layout: str):
        super().__init__()
        self.layout = layout
        self.head_dim = HIDDEN // HEADS
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(HIDDEN, HIDDEN)
        self.v_proj = nn.Linear(HIDDEN, HIDDEN)
        self.q_proj = nn.Linear(HIDDEN, HIDDEN)
        self.out_proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bsz: int, seq: int) -> torch.Tensor:
        if self.layout == "opt_onnx":
            # x: [bsz * seq, 768]; mask: [bsz, 1, seq, seq] additive
            q = self.q_proj(x).view(bsz, seq, HEADS, self.head_dim).permute(0, 2, 1, 3)
            k = self.k_proj(x).view(bsz, seq, HEADS, self.head_dim).permute(0, 2, 1, 3).transpose(2, 3)
            v = self.v_proj(x).view(bsz, seq, HEADS, self.head_dim).permute(0, 2, 1, 3)
            scores = torch.matmul(q, k) * self.scaling + mask
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(-1, HIDDEN)
            return self.out_proj(ctx)
        # fairseq: x is T x B x C; mask is the (B, T) key padding mask (bool)
        q = self.q_proj(x) * self.scaling
        k = self.k_proj(x)
        v = self.v_proj(x)
        q = q.contiguous().view(seq, bsz * HEADS, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(seq, bsz * HEADS, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(seq, bsz * HEADS, self.head_dim).transpose(0, 1)
        w = torch.bmm(q, k.transpose(1, 2)).view(bsz, HEADS, seq, seq)
        w = w.masked_fill(mask.unsqueeze(1).unsqueeze(2), float("-inf")).view(bsz * HEADS, seq, seq)
        probs = torch.softmax(w, dim=-1)
        ctx = torch.bmm(probs, v).transpose(0, 1).contiguous().view(seq, bsz, HIDDEN)
        return self.out_proj(ctx)


class EncoderLayer(nn.Module):
    """fairseq's TransformerEncoderLayer as RoBERTa-base configures it (post-LayerNorm, GELU)."""

    def __init__(self, layout: str):
        super().__init__()
        self.self_attn = MultiheadAttention(layout)
        self.self_attn_layer_norm = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)
        self.final_layer_norm = nn.LayerNorm(HIDDEN)

    def forward(self, x, mask, bsz: int, seq: int):
        x = self.self_attn_layer_norm(x + self.self_attn(x, mask, bsz, seq))
        return self.final_layer_norm(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class FairseqRoberta(nn.Module):
    """RoBERTa-base (fairseq) with the SST-2 sentence classification head; input ``src_tokens``
    (batch x seq, int64), output the two logits per sentence."""

    def __init__(self, layout: str = "opt_onnx", num_classes: int = 2):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}. Fix: layout='opt_onnx' (the README's "
                             "ONNX after opt_onnx.py) or 'fairseq' (fairseq's export before it)")
        self.layout = layout
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD)
        self.embed_positions = nn.Embedding(MAX_POSITIONS, HIDDEN, padding_idx=PAD)
        self.emb_layer_norm = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(EncoderLayer(layout) for _ in range(LAYERS))
        self.dense = nn.Linear(HIDDEN, HIDDEN)            # the classification head
        self.out_proj = nn.Linear(HIDDEN, num_classes)

    def forward(self, src_tokens: torch.Tensor) -> torch.Tensor:
        bsz, seq = src_tokens.shape
        padding_mask = src_tokens.eq(PAD)
        keep = src_tokens.ne(PAD).int()
        positions = (torch.cumsum(keep, dim=1).type_as(keep) * keep).long() + PAD
        x = self.embed_tokens(src_tokens) + self.embed_positions(positions)
        x = self.emb_layer_norm(x)
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        if self.layout == "opt_onnx":
            x = x.reshape(-1, HIDDEN)
            mask = (padding_mask.unsqueeze(1).unsqueeze(2).to(x.dtype) * -65504.0).expand(bsz, 1, seq, seq)
            for layer in self.layers:
                x = layer(x, mask, bsz, seq)
            x = x.reshape(-1, seq, HIDDEN)[:, 0, :]
        else:
            x = x.transpose(0, 1)
            for layer in self.layers:
                x = layer(x, padding_mask, bsz, seq)
            x = x.transpose(0, 1)[:, 0, :]
        return self.out_proj(torch.tanh(self.dense(x)))


def build(batch: int, seq: int, layout: str = "opt_onnx") -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model and a batch of token ids (no padding: every position a token, as a full row of
    the README's pre-processed SST-2 set is at worst)."""
    tokens = torch.randint(4, VOCAB, (batch, seq))
    return FairseqRoberta(layout).eval(), (tokens,)


__all__ = ["FairseqRoberta", "LAYOUTS", "build"]
