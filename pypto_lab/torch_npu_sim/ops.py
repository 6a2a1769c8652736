"""torch_npu's fused operators on the simulated card: ``torch.ops.npu.<name>`` with the numerics their
documentation states, computed by torch on the host, and the ``torch_npu.<name>`` functions scripts
call.

torch_npu registers its operators in the ``npu`` namespace (``torch.ops.npu.npu_rms_norm``), so an
eager trace (the simulated card's dispatch mode) or a captured graph sees one operator, which the
lowering table turns into the CANN kernel it launches (`pypto_lab.lowering.npu_ops`). The
implementations here are references written from the operators' documentation (Ascend's torch_npu
API pages, the aclnn pages of ops-transformer, vLLM-Ascend's own numpy reference for
MoeGatingTopK); each computes in fp32 and returns the dtype the documentation gives. They are not
the NPU's kernels: results agree with them to the rounding of the output dtype, not bit for bit.
What an operator's documentation allows but a reference here does not compute (a quantised
attention, a prefix sparse mode, ...) raises ``NotImplementedError`` naming the argument, so an
unsupported call is never silently wrong. The operators are registered once per process, the first
time the simulated card is installed (`register`); nothing is registered by importing pypto_lab.

Operators and what each reference computes (docstrings of the functions below give the details):
npu_rms_norm, npu_add_rms_norm, npu_rotary_mul (half and interleave), npu_swiglu,
npu_fusion_attention (BSH, SBH, BSND, BNSD, TND; sparse modes 0-4; GQA; pse; dropout),
npu_fused_infer_attention_score (BSH, BSND, BNSD, TND; paged KV cache through block_table;
actual lengths; sparse modes 0, 2, 3, 4; GQA), npu_moe_gating_top_k, npu_moe_gating_top_k_softmax,
npu_grouped_matmul (group_type 0 with a group list, or pairs; float, W8A16 antiquant, W8A8 with
per-token scales), npu_mla_prolog (bf16/fp16, PA_BSND cache), npu_quant_matmul,
npu_weight_quant_batchmatmul, npu_dynamic_quant, npu_quantize, npu_format_cast; the backward of
npu_rms_norm, npu_swiglu, npu_rotary_mul and npu_fusion_attention (autograd works through them, each
backward its own CANN kernel).
"""

from __future__ import annotations

import math

import torch

from . import standin

_F32 = torch.float32


# ---------------------------------------------------------------------------- norms, RoPE, SwiGlu

def rms_norm(x, gamma, epsilon=1e-6):
    """``y = x / sqrt(mean(x^2) + eps) * gamma`` over gamma's trailing dimensions, in fp32; returns
    (y in x's dtype, rstd in fp32 with the normalised dimensions kept as 1)."""
    dims = tuple(range(-gamma.dim(), 0))
    xf = x.to(_F32)
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.to(_F32)).to(x.dtype), rstd


def rms_norm_backward(dy, x, gamma, rstd):
    """(dx, dgamma) of `rms_norm` from the saved rstd."""
    dims = tuple(range(-gamma.dim(), 0))
    xf, g, d = x.to(_F32), gamma.to(_F32), dy.to(_F32)
    xhat = xf * rstd
    gdy = d * g
    dx = rstd * (gdy - xhat * (gdy * xhat).mean(dims, keepdim=True))
    lead = tuple(range(0, x.dim() - gamma.dim()))
    dgamma = (d * xhat).sum(lead) if lead else d * xhat
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


def add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    """``x = x1 + x2`` (in x1's dtype), then `rms_norm` of x; returns (y, rstd, x)."""
    x = (x1.to(_F32) + x2.to(_F32)).to(x1.dtype)
    y, rstd = rms_norm(x, gamma, epsilon)
    return y, rstd, x


def _rotate(x, mode: str):
    if mode == "half":
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)
    if mode == "interleave":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((-b, a), dim=-1).flatten(-2)
    raise NotImplementedError(f"npu_rotary_mul rotary_mode={mode!r}: 'half' and 'interleave' are stood in")


def _rotate_t(x, mode: str):
    """The transpose of `_rotate` (rotate by -90 degrees)."""
    if mode == "half":
        a, b = x.chunk(2, dim=-1)
        return torch.cat((b, -a), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((b, -a), dim=-1).flatten(-2)


def rotary_mul(x, r1, r2, rotary_mode="half"):
    """``x * r1 + rotate(x) * r2`` (r1 the cos, r2 the sin table, broadcast to x): ``rotate`` is
    ``cat(-x2, x1)`` of the two halves ("half") or ``(-x_odd, x_even)`` pairwise ("interleave");
    fp32, returned in x's dtype."""
    xf = x.to(_F32)
    out = xf * r1.to(_F32) + _rotate(xf, rotary_mode) * r2.to(_F32)
    return out.to(x.dtype)


def _reduce_to(grad, like):
    """``grad`` summed over the dimensions ``like`` was broadcast along."""
    while grad.dim() > like.dim():
        grad = grad.sum(0)
    for i, n in enumerate(like.shape):
        if n == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad


def rotary_mul_backward(grad, x, r1, r2, rotary_mode="half"):
    """(dx, dr1, dr2) of `rotary_mul`."""
    g, xf = grad.to(_F32), x.to(_F32)
    dx = g * r1.to(_F32) + _rotate_t(g * r2.to(_F32), rotary_mode)
    dr1 = _reduce_to(g * xf, r1)
    dr2 = _reduce_to(g * _rotate(xf, rotary_mode), r2)
    return dx.to(x.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)


def swiglu(x, dim=-1):
    """``silu(a) * b`` of the two halves ``a, b`` of ``dim``, in fp32, returned in x's dtype."""
    a, b = x.to(_F32).chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)


def swiglu_backward(grad_output, x, dim=-1):
    a, b = x.to(_F32).chunk(2, dim=dim)
    g = grad_output.to(_F32)
    s = torch.sigmoid(a)
    da = g * b * s * (1 + a * (1 - s))
    db = g * a * s
    return torch.cat((da, db), dim=dim).to(x.dtype)


# ---------------------------------------------------------------------------- attention

def _to_bnsd(t, layout: str, heads: int | None):
    """[B, N, S, D] of a tensor in a torch_npu layout (BSH and SBH need the head count)."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.permute(0, 2, 1, 3)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).permute(0, 2, 1, 3)
    if layout == "SBH":
        s, b, h = t.shape
        return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)
    raise NotImplementedError(f"input_layout {layout!r} is not stood in (BSH, SBH, BSND, BNSD, TND are)")


def _from_bnsd(o, layout: str):
    b, n, s, d = o.shape
    if layout == "BNSD":
        return o
    if layout == "BSND":
        return o.permute(0, 2, 1, 3)
    if layout == "BSH":
        return o.permute(0, 2, 1, 3).reshape(b, s, n * d)
    return o.permute(2, 0, 1, 3).reshape(s, b, n * d)      # SBH


def _band_mask(sq: int, skv: int, mode: int, pre: int, nxt: int):
    """True where a query may not see a key, for the generated sparse modes: 2 leftUpCausal, 3
    rightDownCausal, 4 band (rightDown-aligned, pre/next tokens), 0 with a band (leftUp-aligned)."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    if mode == 2:
        return j > i
    if mode == 3:
        return j > i + (skv - sq)
    if mode == 4:
        c = i + (skv - sq)
        return (j > c + nxt) | (j < c - pre)
    return (j > i + nxt) | (j < i - pre)


_MAXTOK = 2147483647


def _mask_for(atten_mask, sq: int, skv: int, sparse_mode: int, pre: int, nxt: int, op: str):
    """The boolean mask (True: masked) of a call, broadcastable to [B, N, Sq, Skv]."""
    mode = int(sparse_mode or 0)
    if mode in (2, 3):
        return _band_mask(sq, skv, mode, pre, nxt)          # the compressed mask passed in is the same causal mask
    if mode == 4:
        return _band_mask(sq, skv, 4, pre, nxt)
    if mode not in (0, 1):
        raise NotImplementedError(f"{op} sparse_mode={mode}: sparse modes 0-4 are stood in (prefix and varlen-band "
                                  "modes 5-8 are not)")
    mask = None
    if atten_mask is not None:
        mask = atten_mask.to(torch.bool)
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)
        mask = mask[..., -sq:, -skv:] if mask.shape[-2] >= sq and mask.shape[-1] >= skv else mask
    if mode == 0 and (pre < _MAXTOK or nxt < _MAXTOK):
        band = _band_mask(sq, skv, 0, pre, nxt)
        mask = band if mask is None else (mask | band)
    return mask


def _attend(q, k, v, scale: float, mask=None, pse=None, keep_prob: float = 1.0, pse_first: bool = True):
    """Attention of [B, N, Sq, D] queries over [B, N2, Skv, D] keys and values (N a multiple of N2)
    in fp32: ``softmax(mask(scale * (q k^T + pse))) v`` (``pse_first``; else ``scale * q k^T + pse``).
    Returns (out, row max, row sum of exp) with fully masked rows giving 0."""
    n, n2 = q.shape[1], k.shape[1]
    if n != n2:
        if n % n2:
            raise ValueError(f"query heads {n} are not a multiple of key/value heads {n2}")
        k = k.repeat_interleave(n // n2, dim=1)
        v = v.repeat_interleave(n // n2, dim=1)
    s = q.to(_F32) @ k.to(_F32).transpose(-1, -2)
    if pse is not None and pse_first:
        s = (s + pse.to(_F32)) * scale
    else:
        s = s * scale
        if pse is not None:
            s = s + pse.to(_F32)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    ell = e.sum(-1, keepdim=True)
    p = e / torch.where(ell == 0, torch.ones_like(ell), ell)
    if keep_prob < 1.0:
        p = torch.nn.functional.dropout(p, 1.0 - keep_prob)
    return p @ v.to(_F32), m, ell


def _cum_to_lengths(cum) -> list[int]:
    ends = [int(x) for x in cum]
    return [e - s for s, e in zip([0] + ends[:-1], ends)]


def fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                     scale=1.0, keep_prob=1.0, pre_tockens=_MAXTOK, next_tockens=_MAXTOK, inner_precise=0,
                     prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                     gen_mask_parallel=True, sync=False):
    """torch_npu.npu_fusion_attention: ``Dropout(Softmax(Mask(scale * (pse + q k^T), atten_mask)),
    keep_prob) @ v`` in the query's layout (atten_mask: True / 1 masks a position; GQA when key has
    fewer heads). Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)
    with softmax_max / softmax_sum of shape [B, N, Sq, 8] (TND: [T, N, 8]) in fp32, softmax_out
    empty. Dropout draws from torch's generator, not the NPU's (its mask differs)."""
    op = "npu_fusion_attention"
    if padding_mask is not None or prefix is not None:
        raise NotImplementedError(f"{op}: padding_mask and prefix are not stood in")
    layout = input_layout.upper()
    if layout == "TND":
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError(f"{op}: input_layout TND needs actual_seq_qlen and actual_seq_kvlen")
        if pse is not None:
            raise NotImplementedError(f"{op}: pse with TND is not stood in")
        outs, maxs, sums = [], [], []
        qs, ks = 0, 0
        for lq, lk in zip(_cum_to_lengths(actual_seq_qlen), _cum_to_lengths(actual_seq_kvlen)):
            q = query[qs:qs + lq].permute(1, 0, 2).unsqueeze(0)
            k = key[ks:ks + lk].permute(1, 0, 2).unsqueeze(0)
            v = value[ks:ks + lk].permute(1, 0, 2).unsqueeze(0)
            mask = _mask_for(atten_mask if int(sparse_mode) in (0, 1) and atten_mask is not None and atten_mask.dim() == 2
                             and atten_mask.shape == (lq, lk) else None, lq, lk, sparse_mode, pre_tockens,
                             next_tockens, op)
            o, m, ell = _attend(q, k, v, scale, mask, None, keep_prob)
            outs.append(o[0].permute(1, 0, 2))
            maxs.append(m[0].permute(1, 0, 2).expand(-1, -1, 8))
            sums.append(ell[0].permute(1, 0, 2).expand(-1, -1, 8))
            qs, ks = qs + lq, ks + lk
        out = torch.cat(outs).to(query.dtype)
        smax, ssum = torch.cat(maxs).contiguous(), torch.cat(sums).contiguous()
    else:
        q = _to_bnsd(query, layout, head_num)
        d = q.shape[-1]
        kv_heads = None if layout in ("BNSD", "BSND") else key.shape[-1] // d
        k, v = _to_bnsd(key, layout, kv_heads), _to_bnsd(value, layout, kv_heads)
        mask = _mask_for(atten_mask, q.shape[2], k.shape[2], sparse_mode, pre_tockens, next_tockens, op)
        o, m, ell = _attend(q, k, v, scale, mask, pse, keep_prob)
        out = _from_bnsd(o, layout).to(query.dtype).contiguous()
        smax, ssum = m.expand(-1, -1, -1, 8).contiguous(), ell.expand(-1, -1, -1, 8).contiguous()
    numels = int(out.numel()) if keep_prob < 1.0 else 0
    return out, smax, ssum, torch.empty(0, dtype=query.dtype), 0, 0, numels


def fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse=None, atten_mask=None, scale=1.0,
                          keep_prob=1.0, pre_tockens=_MAXTOK, next_tockens=_MAXTOK, sparse_mode=0):
    """(dq, dk, dv) of `fusion_attention` (no dropout): the scores recomputed, ``dS = P * (dP -
    rowsum(dP * P))``, ``dq = scale dS k``, ``dk = scale dS^T q``, ``dv = P^T dO``; GQA gradients summed
    over the query heads of each key/value head."""
    layout = input_layout.upper()
    if layout == "TND" or keep_prob < 1.0:
        raise NotImplementedError("npu_fusion_attention backward: TND and dropout are not stood in")
    q = _to_bnsd(query, layout, head_num).to(_F32)
    d = q.shape[-1]
    kv_heads = None if layout in ("BNSD", "BSND") else key.shape[-1] // d
    k, v = _to_bnsd(key, layout, kv_heads).to(_F32), _to_bnsd(value, layout, kv_heads).to(_F32)
    do = _to_bnsd(dy, layout, head_num).to(_F32)
    n, n2 = q.shape[1], k.shape[1]
    g = n // n2
    ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    mask = _mask_for(atten_mask, q.shape[2], k.shape[2], sparse_mode, pre_tockens, next_tockens, "npu_fusion_attention")
    s = q @ ke.transpose(-1, -2)
    s = (s + pse.to(_F32)) * scale if pse is not None else s * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    dv = p.transpose(-1, -2) @ do
    dp = do @ ve.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = scale * ds @ ke
    dk = scale * ds.transpose(-1, -2) @ q
    if g > 1:
        b, _, skv, _ = dk.shape
        dk = dk.reshape(b, n2, g, skv, d).sum(2)
        dv = dv.reshape(b, n2, g, skv, d).sum(2)
    return (_from_bnsd(dq, layout).to(query.dtype).contiguous(), _from_bnsd(dk, layout).to(key.dtype).contiguous(),
            _from_bnsd(dv, layout).to(value.dtype).contiguous())


_FIA_UNSUPPORTED = ("pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
                    "antiquant_scale", "antiquant_offset", "key_antiquant_scale", "key_antiquant_offset",
                    "value_antiquant_scale", "value_antiquant_offset", "query_padding_size", "kv_padding_size",
                    "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len", "query_rope", "key_rope",
                    "key_rope_antiquant_scale")


def _paged(cache, block_table, lengths, layout: str):
    """Per sequence, its keys (or values) gathered from a paged cache ([blocks, block_size, H] or
    [blocks, block_size, N, D]; BNSD: [blocks, N, block_size, D]) through its block table row, as
    [S, H] / [S, N, D] (BNSD: [N, S, D]) truncated to its length."""
    out = []
    for b, n in enumerate(lengths):
        rows = block_table[b].tolist()
        if layout == "BNSD" and cache.dim() == 4:
            blocks = [cache[r] for r in rows]
            seq = torch.cat(blocks, dim=1)[:, :n]
        else:
            seq = torch.cat([cache[r] for r in rows], dim=0)[:n]
        out.append(seq)
    return out


def fused_infer_attention_score(query, key, value, *, num_heads=1, scale=1.0, pre_tokens=_MAXTOK,
                                next_tokens=_MAXTOK, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
                                atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
                                block_table=None, block_size=0, softmax_lse_flag=False, **unsupported):
    """torch_npu.npu_fused_infer_attention_score: ``softmax(mask(scale * q k^T)) v`` per sequence, with
    ``num_key_value_heads`` key/value heads (GQA), keys and values dense in the layout or paged
    (``block_table``: each sequence's blocks of a [blocks, block_size, H] cache; BNSD: [blocks, N,
    block_size, D]) and cut to ``actual_seq_lengths_kv`` per sequence; TND packs the queries
    (``actual_seq_lengths`` cumulative). Returns (attention_out in the query's layout,
    softmax_lse [B, N, Sq, 1] in fp32 when ``softmax_lse_flag``, else a one-element zero)."""
    op = "npu_fused_infer_attention_score"
    given = sorted(k for k, v in unsupported.items() if v is not None and k in _FIA_UNSUPPORTED)
    other = sorted(k for k in unsupported if k not in _FIA_UNSUPPORTED and k not in
                   ("inner_precise", "antiquant_mode", "key_antiquant_mode", "value_antiquant_mode"))
    if given or other:
        raise NotImplementedError(f"{op}: {', '.join(given + other)} not stood in (quantised, prefix-shared and "
                                  "rope-split attention are not)")
    layout = input_layout.upper().split("_")[0]
    heads = int(num_heads)
    kvh = int(num_key_value_heads or 0) or heads
    tnd = layout == "TND"
    if tnd:
        if actual_seq_lengths is None:
            raise ValueError(f"{op}: input_layout TND needs actual_seq_lengths (cumulative query lengths)")
        qlens = _cum_to_lengths(actual_seq_lengths)
        qseqs, start = [], 0
        for n in qlens:
            qseqs.append(query[start:start + n].permute(1, 0, 2))      # [N, S, D]
            start += n
        batch = len(qlens)
    else:
        q4 = _to_bnsd(query, layout, heads)
        batch = q4.shape[0]
        qseqs = [q4[b] for b in range(batch)]
    d = qseqs[0].shape[-1]
    if block_table is not None:
        if actual_seq_lengths_kv is None:
            raise ValueError(f"{op}: a paged KV cache (block_table) needs actual_seq_lengths_kv")
        lens = [int(x) for x in actual_seq_lengths_kv]
        ks = _paged(key, block_table, lens, layout)
        vs = _paged(value, block_table, lens, layout)

        def heads_first(t):
            if layout == "BNSD" and t.dim() == 3:
                return t
            return t.reshape(t.shape[0], kvh, d).permute(1, 0, 2)
        ks, vs = [heads_first(t) for t in ks], [heads_first(t) for t in vs]
    elif tnd:
        klens = _cum_to_lengths(actual_seq_lengths_kv) if actual_seq_lengths_kv is not None else qlens
        ks, vs, start = [], [], 0
        for n in klens:
            ks.append(key[start:start + n].permute(1, 0, 2))
            vs.append(value[start:start + n].permute(1, 0, 2))
            start += n
    else:
        k4, v4 = _to_bnsd(key, layout, kvh), _to_bnsd(value, layout, kvh)
        lens = [int(x) for x in actual_seq_lengths_kv] if actual_seq_lengths_kv is not None else [k4.shape[2]] * batch
        ks = [k4[b, :, :lens[b]] for b in range(batch)]
        vs = [v4[b, :, :lens[b]] for b in range(batch)]
    outs, lses = [], []
    for b in range(batch):
        q, k, v = qseqs[b].unsqueeze(0), ks[b].unsqueeze(0), vs[b].unsqueeze(0)
        sq, skv = q.shape[2], k.shape[2]
        m = atten_mask
        if m is not None and int(sparse_mode) in (0, 1):
            m = m.to(torch.bool)
            if m.dim() == 4:
                m = m[b if m.shape[0] > 1 else 0]
            elif m.dim() == 3 and m.shape[0] == batch and batch > 1:
                m = m[b]
            m = m[..., :sq, :skv]
        mask = _mask_for(m, sq, skv, sparse_mode, pre_tokens, next_tokens, op)
        o, mx, ell = _attend(q, k, v, scale, mask)
        outs.append(o[0])
        lses.append((mx + torch.log(ell))[0])
    if tnd:
        out = torch.cat([o.permute(1, 0, 2) for o in outs]).to(query.dtype)
    else:
        out = _from_bnsd(torch.stack(outs), layout).to(query.dtype).contiguous()
    lse = torch.stack(lses) if softmax_lse_flag and not tnd else (
        torch.cat([x.permute(1, 0, 2) for x in lses]) if softmax_lse_flag else torch.zeros(1, dtype=_F32))
    return out, lse


# ---------------------------------------------------------------------------- MoE

def moe_gating_top_k(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0, norm_type=1,
                     out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    """MoeGatingTopK (vLLM-Ascend's numpy reference, in torch): ``norm = softmax(x)`` (norm_type 0)
    or ``sigmoid(x)`` (1), in fp32; the experts are chosen on ``norm + bias`` (with ``group_count``
    groups, the ``k_group`` best groups by their max (mode 0) or top-2 sum (mode 1), the others
    masked), k of them, stable descending; the weights are ``norm`` at the chosen experts, divided by
    their sum + eps for sigmoid or ``renorm``, times routed_scaling_factor. Returns (weights in x's
    dtype, expert ids int32, the normalised scores in fp32 when out_flag, else a one-element zero)."""
    xf = x.to(_F32)
    norm = torch.softmax(xf, -1) if int(norm_type) == 0 else torch.sigmoid(xf)
    sel = norm + bias.to(_F32) if bias is not None else norm
    if group_count > 1:
        t = sel.shape[0]
        grouped = sel.reshape(t, group_count, -1)
        score = grouped.amax(-1) if int(group_select_mode) == 0 else grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.argsort(-score, dim=-1, stable=True)[:, :k_group]
        masked = torch.ones(t, group_count, dtype=torch.bool)
        masked[torch.arange(t).unsqueeze(1), keep] = False
        sel = grouped.masked_fill(masked.unsqueeze(-1), float("-inf")).reshape(t, -1)
    idx = torch.sort(sel, dim=-1, stable=True, descending=True).indices[:, :k]
    y = torch.gather(norm, 1, idx)
    if int(norm_type) == 1 or int(renorm) == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    out = norm if out_flag else torch.zeros(1, dtype=_F32)
    return y.to(x.dtype), idx.to(torch.int32), out


def moe_gating_top_k_softmax(x, finished=None, k=1):
    """MoeGatingTopKSoftmax: the top k of ``softmax(x)`` over the last dimension (fp32), ids int32,
    and row_idx int32 with ``row_idx[i, j] = j * rows + i``; a finished row's ids are the expert
    count. Returns (weights in x's dtype, ids, row_idx)."""
    p = torch.softmax(x.to(_F32), -1)
    vals, idx = p.topk(k, dim=-1)
    rows = int(math.prod(x.shape[:-1]))
    if finished is not None:
        idx = torch.where(finished.to(torch.bool).reshape(*x.shape[:-1], 1), torch.full_like(idx, x.shape[-1]), idx)
    row_idx = torch.arange(rows * k, dtype=torch.int32).reshape(k, rows).t().reshape(*x.shape[:-1], k)
    return vals.to(x.dtype), idx.to(torch.int32), row_idx.contiguous()


def _group_sizes(group_list, group_list_type: int) -> list[int]:
    g = [int(v) for v in (group_list.tolist() if isinstance(group_list, torch.Tensor) else group_list)]
    return g if int(group_list_type or 0) == 1 else _cum_to_lengths(g)


def grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                   per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                   activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                   tuning_config=None, output_dtype=None):
    """GroupedMatmul: with ``group_list`` (group_type 0), the rows of ``x[0]`` split into groups
    (cumulative ends for group_list_type 0, counts for 1), group i times ``weight[i]`` (a list of
    [K, N], or one [E, K, N]); otherwise ``x[i] @ weight[i]``. ``bias[i]`` added; int8 weights with
    ``antiquant_scale`` (and offset) dequantised as ``(w + offset) * scale`` (W8A16); int8 x with
    ``scale`` (per group, per column) and ``per_token_scale`` (per row) dequantised after an exact
    integer product (W8A8). split_item 0/1: one output per group, 2/3: one tensor of all rows."""
    if offset is not None or activation_input is not None or activation_quant_scale is not None \
            or activation_quant_offset is not None or int(act_type or 0):
        raise NotImplementedError("npu_grouped_matmul: offset, activation inputs and act_type are not stood in")
    ws = list(weight)
    if len(ws) == 1 and ws[0].dim() == 3:
        ws = list(ws[0].unbind(0))

    def per_group(lst, i):
        if lst is None:
            return None
        lst = list(lst)
        if len(lst) == 1 and lst[0].dim() >= 2 and lst[0].shape[0] == len(ws) and len(ws) > 1:
            return lst[0][i]
        return lst[i] if i < len(lst) else None

    if group_list is not None:
        if len(x) != 1:
            raise NotImplementedError("npu_grouped_matmul: a group list with several x tensors is not stood in")
        sizes = _group_sizes(group_list, group_list_type)
        xs, start = [], 0
        for n in sizes:
            xs.append((x[0][start:start + n], start))
            start += n
    else:
        xs = [(t, None) for t in x]
    outs = []
    for i, (xi, row0) in enumerate(xs):
        w = ws[i]
        if w.dtype == torch.int8 and xi.dtype != torch.int8:
            s, o = per_group(antiquant_scale, i), per_group(antiquant_offset, i)
            if s is None:
                raise ValueError("npu_grouped_matmul: int8 weights with float x need antiquant_scale")
            wf = (w.to(_F32) + (o.to(_F32) if o is not None else 0.0)) * s.to(_F32)
            y = xi.to(_F32) @ wf
            dt = output_dtype or xi.dtype
        elif xi.dtype == torch.int8:
            y = (xi.to(torch.float64) @ w.to(torch.float64)).to(_F32)
            s = per_group(scale, i)
            if s is not None:
                y = y * s.to(_F32)
            if per_token_scale is not None:
                pts = list(per_token_scale)[0]
                y = y * (pts[row0:row0 + xi.shape[0]] if row0 is not None else pts).to(_F32).unsqueeze(-1)
            dt = output_dtype or torch.float16
        else:
            y = xi.to(_F32) @ w.to(_F32)
            dt = output_dtype or xi.dtype
        b = per_group(bias, i)
        if b is not None:
            y = y + b.to(_F32)
        outs.append(y.to(dt))
    if int(split_item or 0) in (2, 3):
        return [torch.cat(outs, dim=0)]
    return outs


# ---------------------------------------------------------------------------- quantised matmuls

def weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None, quant_offset=None,
                             bias=None, antiquant_group_size=0, inner_precise=0):
    """WeightQuantBatchMatmul (W8A16): ``x @ ((weight + antiquant_offset) * antiquant_scale) + bias``,
    the scale per output column ([N] or [1, N]) or per group of ``antiquant_group_size`` rows of K
    ([K / g, N]); fp32 accumulation, x's dtype out."""
    if quant_scale is not None or quant_offset is not None:
        raise NotImplementedError("npu_weight_quant_batchmatmul: quant_scale / quant_offset (int8 output) are not "
                                  "stood in")
    w = weight.to(_F32)
    if antiquant_offset is not None:
        off = antiquant_offset.to(_F32)
        w = w + (off.repeat_interleave(int(antiquant_group_size), 0) if antiquant_group_size else off)
    s = antiquant_scale.to(_F32)
    w = w * (s.repeat_interleave(int(antiquant_group_size), 0) if antiquant_group_size else s)
    y = x.to(_F32) @ w
    if bias is not None:
        y = y + bias.to(_F32)
    return y.to(x.dtype)


def quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, x1_dtype=None,
                 x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None):
    if any(v is not None for v in (x1_dtype, x2_dtype, pertoken_scale_dtype, scale_dtype, group_sizes)):
        raise NotImplementedError("npu_quant_matmul: x1_dtype / x2_dtype / scale dtypes / group_sizes are not stood in")
    return standin.npu_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
                                    output_dtype=output_dtype)


def dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None):
    """Per-row symmetric int8 (`standin.npu_dynamic_quant`), the row first multiplied by
    ``smooth_scales`` when given; returns (y int8, scale fp32 of shape x.shape[:-1])."""
    x = input * smooth_scales if smooth_scales is not None else input
    return standin.npu_dynamic_quant(x, group_index=group_index, dst_type=dst_type)


# ---------------------------------------------------------------------------- MLA prolog

def mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
               rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *, dequant_scale_x=None,
               dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
               quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, rmsnorm_epsilon_cq=1e-5,
               rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND"):
    """MlaProlog as its documentation states it: ``cQ = RmsNorm(x W_DQ)``; ``[qC | qR'] = cQ W_UQ_QR``
    per head (D then Dr); ``qN = qC W_UK`` per head; ``qR = ROPE(qR')``; ``[cKV | kR'] = x W_DKV_KR``,
    ``kC = RmsNorm(cKV)`` and ``kR = ROPE(kR')`` written into kv_cache / kr_cache ([blocks,
    block_size, 1, H]) at the flat slots ``cache_index``. ROPE is ``x cos + rotate_half(x) sin``
    (the documentation names it without its form; rotate-half is npu_rotary_mul's default). Returns
    (query [.., N, Hckv], query_rope [.., N, Dr], kv_cache, kr_cache); the caches are updated in
    place, as the operator does."""
    if any(v is not None for v in (dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr,
                                   quant_scale_ckv, quant_scale_ckr, smooth_scales_cq)):
        raise NotImplementedError("npu_mla_prolog: the quantised variants (dequant/quant scales) are not stood in")
    if cache_mode != "PA_BSND":
        raise NotImplementedError(f"npu_mla_prolog cache_mode={cache_mode!r}: PA_BSND is stood in")
    lead = token_x.shape[:-1]
    x = token_x.reshape(-1, token_x.shape[-1]).to(_F32)
    t = x.shape[0]
    n, dn, hckv = weight_uk.shape
    dt = token_x.dtype
    cq, _ = rms_norm((x @ weight_dq.to(_F32)).to(dt), rmsnorm_gamma_cq, rmsnorm_epsilon_cq)
    q = (cq.to(_F32) @ weight_uq_qr.to(_F32)).reshape(t, n, -1)
    dr = q.shape[-1] - dn
    qc, qr = q[..., :dn], q[..., dn:]
    qn = torch.einsum("tnd,ndh->tnh", qc.to(dt).to(_F32), weight_uk.to(_F32))
    sin = rope_sin.reshape(t, 1, dr).to(_F32)
    cos = rope_cos.reshape(t, 1, dr).to(_F32)
    qrope = rotary_mul(qr.to(dt), cos, sin)
    kv = x @ weight_dkv_kr.to(_F32)
    ckv, _ = rms_norm(kv[:, :hckv].to(dt), rmsnorm_gamma_ckv, rmsnorm_epsilon_ckv)
    kr = rotary_mul(kv[:, hckv:].to(dt).reshape(t, 1, dr), cos, sin).reshape(t, dr)
    slots = cache_index.reshape(-1).to(torch.int64)
    kv_flat = kv_cache.view(-1, kv_cache.shape[-1])
    kr_flat = kr_cache.view(-1, kr_cache.shape[-1])
    kv_flat[slots] = ckv.to(kv_cache.dtype)
    kr_flat[slots] = kr.to(kr_cache.dtype)
    return (qn.to(dt).reshape(*lead, n, hckv), qrope.reshape(*lead, n, dr), kv_cache, kr_cache)


# ---------------------------------------------------------------------------- registration

# torch_npu's schemas (the "接口原型" of each operator's page), trimmed to what the references take
SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_rms_norm_backward": "npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)",
    "npu_add_rms_norm": "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
    "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor",
    "npu_rotary_mul_backward": "npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, "
                               "str rotary_mode='half') -> (Tensor, Tensor, Tensor)",
    "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    "npu_swiglu_backward": "npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor",
    "npu_fusion_attention": (
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
        "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
        "bool sync=False) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)"),
    "npu_fusion_attention_grad": (
        "npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, "
        "*, Tensor? pse=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
        "int pre_tockens=2147483647, int next_tockens=2147483647, int sparse_mode=0) -> (Tensor, Tensor, Tensor)"),
    "npu_fused_infer_attention_score": (
        "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
        "Tensor? atten_mask=None, int[]? actual_seq_lengths=None, int[]? actual_seq_lengths_kv=None, "
        "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
        "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
        "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
        "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
        "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
        "Tensor? value_shared_prefix=None, int[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
        "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
        "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout='BSH', int num_key_value_heads=0, "
        "int sparse_mode=0, int inner_precise=0, int block_size=0, int antiquant_mode=0, int key_antiquant_mode=0, "
        "int value_antiquant_mode=0, bool softmax_lse_flag=False) -> (Tensor, Tensor)"),
    "npu_moe_gating_top_k": (
        "npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, int k_group=1, int group_count=1, "
        "int group_select_mode=0, int renorm=0, int norm_type=1, bool out_flag=False, "
        "float routed_scaling_factor=1.0, float eps=1e-20) -> (Tensor, Tensor, Tensor)"),
    "npu_moe_gating_top_k_softmax": (
        "npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)"),
    "npu_grouped_matmul": (
        "npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, "
        "Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, "
        "Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? activation_input=None, "
        "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, "
        "int? group_type=None, int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, "
        "ScalarType? output_dtype=None) -> Tensor[]"),
    "npu_mla_prolog": (
        "npu_mla_prolog(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, Tensor rope_cos, "
        "Tensor cache_index, Tensor(a!) kv_cache, Tensor(b!) kr_cache, *, Tensor? dequant_scale_x=None, "
        "Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, "
        "Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode='PA_BSND') "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "npu_quant_matmul": (
        "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None, "
        "Tensor? bias=None, ScalarType? output_dtype=None) -> Tensor"),
    "npu_weight_quant_batchmatmul": (
        "npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, "
        "Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, int antiquant_group_size=0, "
        "int inner_precise=0) -> Tensor"),
    "npu_dynamic_quant": (
        "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
        "ScalarType? dst_type=None) -> (Tensor, Tensor)"),
    "npu_quantize": (
        "npu_quantize(Tensor input, Tensor scales, Tensor? zero_points, ScalarType dtype, int axis=1, "
        "bool div_mode=True) -> Tensor"),
    "npu_format_cast": "npu_format_cast(Tensor self, int acl_format) -> Tensor",
}


def _mla_prolog_op(*args, **kwargs):
    q, qr, kv, kr = mla_prolog(*args, **kwargs)
    return q, qr, kv.clone(), kr.clone()      # the caches are updated in place; the outputs are fresh tensors


IMPLS = {
    "npu_rms_norm": rms_norm, "npu_rms_norm_backward": rms_norm_backward, "npu_add_rms_norm": add_rms_norm,
    "npu_rotary_mul": rotary_mul, "npu_rotary_mul_backward": rotary_mul_backward, "npu_swiglu": swiglu,
    "npu_swiglu_backward": swiglu_backward, "npu_fusion_attention": fusion_attention,
    "npu_fusion_attention_grad": fusion_attention_grad,
    "npu_fused_infer_attention_score": fused_infer_attention_score, "npu_moe_gating_top_k": moe_gating_top_k,
    "npu_moe_gating_top_k_softmax": moe_gating_top_k_softmax, "npu_grouped_matmul": grouped_matmul,
    "npu_mla_prolog": _mla_prolog_op, "npu_quant_matmul": quant_matmul,
    "npu_weight_quant_batchmatmul": weight_quant_batchmatmul, "npu_dynamic_quant": dynamic_quant,
    "npu_quantize": standin.npu_quantize, "npu_format_cast": lambda t, fmt: t.clone(),
}

_LIB: list = []


def _autograd() -> None:
    """Backward of the operators MindSpeed trains through: each a CANN kernel of its own."""
    ops = torch.ops.npu

    def rms_setup(ctx, inputs, output):
        x, gamma, _ = inputs
        ctx.save_for_backward(x, gamma, output[1])

    def rms_backward(ctx, dy, _drstd):
        x, gamma, rstd = ctx.saved_tensors
        dx, dgamma = ops.npu_rms_norm_backward(dy, x, gamma, rstd)
        return dx, dgamma, None

    torch.library.register_autograd("npu::npu_rms_norm", rms_backward, setup_context=rms_setup)

    def swiglu_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.dim = inputs[1]

    def swiglu_bw(ctx, grad):
        (x,) = ctx.saved_tensors
        return ops.npu_swiglu_backward(grad, x, ctx.dim), None

    torch.library.register_autograd("npu::npu_swiglu", swiglu_bw, setup_context=swiglu_setup)

    def rope_setup(ctx, inputs, output):
        x, r1, r2, mode = inputs
        ctx.save_for_backward(x, r1, r2)
        ctx.mode = mode

    def rope_bw(ctx, grad):
        x, r1, r2 = ctx.saved_tensors
        dx, dr1, dr2 = ops.npu_rotary_mul_backward(grad, x, r1, r2, ctx.mode)
        return dx, dr1, dr2, None

    torch.library.register_autograd("npu::npu_rotary_mul", rope_bw, setup_context=rope_setup)

    names = ("query", "key", "value", "head_num", "input_layout", "pse", "padding_mask", "atten_mask", "scale",
             "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix", "actual_seq_qlen",
             "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync")

    def fa_setup(ctx, inputs, output):
        a = dict(zip(names, inputs))
        ctx.save_for_backward(a["query"], a["key"], a["value"])
        ctx.attrs = {k: a[k] for k in ("head_num", "input_layout", "pse", "atten_mask", "scale", "keep_prob",
                                       "pre_tockens", "next_tockens", "sparse_mode")}

    def fa_bw(ctx, dout, *_):
        q, k, v = ctx.saved_tensors
        a = ctx.attrs
        dq, dk, dv = ops.npu_fusion_attention_grad(
            q, k, v, dout, a["head_num"], a["input_layout"], pse=a["pse"], atten_mask=a["atten_mask"],
            scale=a["scale"], keep_prob=a["keep_prob"], pre_tockens=a["pre_tockens"],
            next_tockens=a["next_tockens"], sparse_mode=a["sparse_mode"])
        return (dq, dk, dv) + (None,) * (len(names) - 3)

    torch.library.register_autograd("npu::npu_fusion_attention", fa_bw, setup_context=fa_setup)


def register() -> None:
    """Define ``torch.ops.npu.<name>`` for every operator of `SCHEMAS` (once per process), each with
    its reference as the CPU kernel (the simulated card's tensors are host tensors)."""
    if _LIB:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, IMPLS[name], "CPU")
    _LIB.append(lib)
    _autograd()


__all__ = ["IMPLS", "SCHEMAS", "add_rms_norm", "dynamic_quant", "fused_infer_attention_score", "fusion_attention",
           "fusion_attention_grad", "grouped_matmul", "mla_prolog", "moe_gating_top_k", "moe_gating_top_k_softmax",
           "quant_matmul", "register", "rms_norm", "rms_norm_backward", "rotary_mul", "rotary_mul_backward", "swiglu",
           "swiglu_backward", "weight_quant_batchmatmul"]
