"""The workbench's own pto kernels for the decode step of three 2025 models, written in
`pypto_lab.pto` from each model's public code (small, honest versions of what CANN PyPTO's
``models/`` folder fuses; the real files are not vendored):

* `mla_decode_kernel`: DeepSeek's multi-head latent attention at decode, absorbed form (the query
  already multiplied by ``W_UK``: ``kv_lora_rank + rope`` dims), over every cached latent of the
  sequence: blocks of ``BLOCK`` latents, each folded into an online softmax; the values are the
  latents' first ``kv_lora_rank`` dims (``W_UV`` is applied after, outside the kernel).
* `sparse_mla_decode_kernel`: DeepSeek-V3.2's DeepSeek Sparse Attention core: the same attention
  over only the ``index_topk`` latents the lightning indexer selected, gathered row by row from
  the cache (``index_select``: one transfer per row) a block at a time
  (DeepSeek-V3.2-Exp ``inference/model.py``, ``MLA.forward``: the index mask from ``indexer``).
* `gated_delta_rule_decode_kernel`: Qwen3-Next's Gated DeltaNet at decode, the recurrent form
  (transformers ``modeling_qwen3_next.torch_recurrent_gated_delta_rule``): per value head, the
  state ``S`` [dk, dv] (fp32) decays by ``exp(g)``, the delta rule writes
  ``beta * (v - S^T k)`` along ``k``, and the output is ``S^T q``; q and k L2-normalised, q
  scaled by ``dk ** -0.5``.
* `fused_moe_decode_kernel`: GLM-4.5's routed MoE in one kernel (transformers
  ``modeling_glm4_moe``, ``Glm4MoeTopkRouter`` and ``Glm4MoeMoE``): the router matmul, sigmoid
  scores, the correction bias for the choice only, top-k, the unbiased scores renormalised and
  scaled by ``routed_scaling_factor``, then per token and slot the chosen expert's SwiGLU MLP
  (its weights viewed at the expert id read from the top-k), weighted and summed.

Each ``*_kernel(...)`` returns a ``@pypto.jit`` kernel (sizes that are Python constants of the
trace come from the call's tensors); each ``*_reference`` is the torch computation it is checked
against. `pypto_lab.llm.plug` runs them inside the engine's step.
"""

from __future__ import annotations

import functools

import torch

import pypto_lab.pto as pypto

BLOCK = 256          # latents per attention block (the scores tile; 128 costs 3x at 32k context: per-block overhead)


# ---- DeepSeek MLA decode: dense and sparse ------------------------------------------------------

def _fold_block(qb, kj, rank: int, scale: float, acc, run_sum, run_max, dtype):
    """Fold one block of latents ``kj`` [BLOCK, rank + rope] into the online softmax of the
    heads' queries ``qb`` [H, rank + rope]: scores, running max and sum, rescaled accumulator."""
    s = pypto.mul(pypto.matmul(qb, kj, pypto.DT_FP32, b_trans=True), scale)           # [H, BLOCK]
    new_max = pypto.maximum(run_max, pypto.amax(s, dim=-1, keepdim=True))
    p = pypto.exp(pypto.sub(s, new_max))
    rescale = pypto.exp(pypto.sub(run_max, new_max))
    run_sum[:] = run_sum * rescale + pypto.sum(p, dim=-1, keepdim=True)
    vj = pypto.view(kj, [kj.shape[0], rank], [0, 0])                                   # values: the latent
    acc[:] = acc * rescale + pypto.matmul(pypto.cast(p, dtype), vj, pypto.DT_FP32)
    run_max[:] = new_max


def _attend(qb, rows_of_block, first: int, blocks: int, rank: int, scale: float, dtype):
    """Online softmax of ``qb`` [H, d] over ``blocks`` blocks from block ``first``: the partial
    output (normalised), its running max and sum, as fp32 tensors."""
    heads = qb.shape[0]
    acc = pypto.tensor([heads, rank], pypto.DT_FP32, "acc")
    run_sum = pypto.tensor([heads, 1], pypto.DT_FP32, "run_sum")
    run_max = pypto.tensor([heads, 1], pypto.DT_FP32, "run_max")
    acc[:] = pypto.full([heads, rank], 0.0, pypto.DT_FP32)
    run_sum[:] = pypto.full([heads, 1], 0.0, pypto.DT_FP32)
    run_max[:] = pypto.full([heads, 1], -1e30, pypto.DT_FP32)
    for j in pypto.loop(blocks, name="LOOP_blocks", idx_name="j"):
        _fold_block(qb, rows_of_block(first + j), rank, scale, acc, run_sum, run_max, dtype)
    return pypto.div(acc, run_sum), run_max, run_sum


def _mla_tiles(heads: int) -> None:
    pypto.set_cube_tile_shapes([16, 16], [64, 256], [128, 128])
    pypto.set_vec_tile_shapes(max(1, min(heads, 16)), BLOCK)


def split_plan(batch: int, blocks: int, cores: int = 24) -> tuple[int, int]:
    """(splits, blocks per split): flash-decoding's split of a sequence's ``blocks`` over the cores
    (IncreFlashAttention splits the KV length when batch x heads leaves cores idle): at most
    ``cores // batch`` splits of at least two blocks, as few blocks per split as that allows, then
    as few splits as give that (the cache is padded to ``splits x per`` blocks, less than one
    split's worth)."""
    cap = max(1, min(cores // max(1, batch), blocks // 2))
    per = -(-blocks // cap)
    return -(-blocks // per), per


def _split_attention(q, out, splits: int, blocks: int, rows_of):
    """Each (sequence, split) attends to its share of the blocks on its own core; the partial
    outputs are then combined with their softmax statistics (flash-decoding)."""
    (batch, heads, d), rank = q.shape, out.shape[2]
    q2 = pypto.reshape(q, [batch * heads, d], inplace=True)
    per = blocks // splits
    part = pypto.tensor([batch * splits * heads, rank], pypto.DT_FP32, "part")
    pmax = pypto.tensor([batch * splits * heads, 1], pypto.DT_FP32, "part_max")
    psum = pypto.tensor([batch * splits * heads, 1], pypto.DT_FP32, "part_sum")
    _mla_tiles(heads)
    for i in pypto.loop(batch * splits, name="LOOP_b_split", idx_name="i"):
        b, s = i // splits, i % splits
        qb = pypto.view(q2, [heads, d], [b * heads, 0])
        o, m, z = _attend(qb, lambda j, b=b: rows_of(b, j), s * per, per, rank, d ** -0.5, q.dtype)
        pypto.assemble(o, [i * heads, 0], part)
        pypto.assemble(m, [i * heads, 0], pmax)
        pypto.assemble(z, [i * heads, 0], psum)
    for b in pypto.loop(batch, name="LOOP_b_combine", idx_name="b"):
        pypto.set_vec_tile_shapes(splits, max(1, min(heads, 8)), min(rank, 128))
        o = pypto.reshape(pypto.view(part, [splits * heads, rank], [b * splits * heads, 0]), [splits, heads, rank])
        m = pypto.reshape(pypto.view(pmax, [splits * heads, 1], [b * splits * heads, 0]), [splits, heads, 1])
        z = pypto.reshape(pypto.view(psum, [splits * heads, 1], [b * splits * heads, 0]), [splits, heads, 1])
        w = pypto.exp(pypto.sub(m, pypto.amax(m, dim=0, keepdim=True))) * z               # [splits, H, 1]
        total = pypto.div(pypto.sum(o * w, dim=0, keepdim=True), pypto.sum(w, dim=0, keepdim=True))
        pypto.assemble(pypto.cast(total, out.dtype), [b, 0, 0], out)


@functools.cache
def mla_decode_kernel(splits: int = 1):
    """Dense MLA decode: ``(q [B, H, rank + rope], kv [B, S, rank + rope], out [B, H, rank])``: each
    sequence's ``H`` heads attend to all its ``S`` cached latents (``S`` a multiple of `BLOCK`),
    ``splits`` cores per sequence (`split_plan`; ``S / BLOCK`` a multiple of it); ``rank`` (``kv_lora_rank``, the latent's width)
    is the output's last dim, the rest of each latent row is the shared RoPE key."""

    @pypto.jit
    def mla_decode(q: pypto.Tensor[...], kv: pypto.Tensor[...], out: pypto.Tensor[...]):
        (batch, seq, d) = kv.shape
        kv2 = pypto.reshape(kv, [batch * seq, d], inplace=True)
        _split_attention(q, out, splits, seq // BLOCK,
                         lambda b, j: pypto.view(kv2, [BLOCK, d], [b * seq + j * BLOCK, 0]))

    mla_decode.__name__ = "mla_decode"
    return mla_decode


@functools.cache
def sparse_mla_decode_kernel(splits: int = 1):
    """DeepSeek Sparse Attention's core at decode: ``(q [B, H, rank + rope], kv [B, S, rank + rope],
    topk [B, K] int32, out [B, H, rank])``: each sequence's heads attend to the ``K`` latents whose
    positions (0..S-1) the indexer selected (``K / BLOCK`` a multiple of ``splits``), gathered row by
    row, ``splits`` cores per sequence."""

    @pypto.jit
    def sparse_mla_decode(q: pypto.Tensor[...], kv: pypto.Tensor[...], topk: pypto.Tensor[...],
                          out: pypto.Tensor[...]):
        (batch, seq, d), k = kv.shape, topk.shape[1]
        kv2 = pypto.reshape(kv, [batch * seq, d], inplace=True)

        def rows(b, j):
            idx = pypto.reshape(pypto.view(topk, [1, BLOCK], [b, j * BLOCK]), [BLOCK])
            return pypto.index_select(pypto.view(kv2, [seq, d], [b * seq, 0]), 0, idx)   # [BLOCK, d]

        _split_attention(q, out, splits, k // BLOCK, rows)

    return sparse_mla_decode


def mla_decode_reference(q, kv, rank: int, topk=None):
    """Softmax attention of each sequence's heads over its latents (all, or the ``topk`` rows), in
    fp32: ``[B, H, rank]``."""
    d = q.shape[-1]
    out = torch.empty(q.shape[0], q.shape[1], rank)
    for b in range(q.shape[0]):
        cache = kv[b].float() if topk is None else kv[b].float()[topk[b].long()]
        p = torch.softmax(q[b].float() @ cache.T / d ** 0.5, dim=-1)
        out[b] = p @ cache[:, :rank]
    return out


# ---- Qwen3-Next: the gated delta rule, one decode step -------------------------------------------

@functools.cache
def gated_delta_rule_decode_kernel(eps: float = 1e-6):
    """One recurrent step of Gated DeltaNet for ``N`` (sequence, value head) pairs: ``(q [N, dk],
    k [N, dk], v [N, dv], g [N, 1], beta [N, 1], state [N * dk, dv] fp32, new_state [N * dk, dv]
    fp32, out [N, dv])``; ``g`` is the log decay, q and k are the key heads already repeated to the
    value heads (as the model does). The updated state goes to ``new_state`` (a ping-pong pair of
    state buffers): the simulator orders a write into a tensor after every read of it, so an
    in-place update would run the heads one after another, which disjoint regions do not need."""

    @pypto.jit
    def gated_delta_rule_decode(q: pypto.Tensor[...], k: pypto.Tensor[...], v: pypto.Tensor[...],
                                g: pypto.Tensor[...], beta: pypto.Tensor[...], state: pypto.Tensor[...],
                                new_state: pypto.Tensor[...], out: pypto.Tensor[...]):
        n, dk = q.shape
        dv = v.shape[1]
        f32 = pypto.DT_FP32
        for i in pypto.loop(n, name="LOOP_heads", idx_name="i"):
            pypto.set_vec_tile_shapes(1, dk)
            qi = pypto.cast(pypto.view(q, [1, dk], [i, 0]), f32)
            ki = pypto.cast(pypto.view(k, [1, dk], [i, 0]), f32)
            qi = qi * pypto.rsqrt(pypto.sum(qi * qi, dim=-1, keepdim=True) + eps) * dk ** -0.5
            ki = ki * pypto.rsqrt(pypto.sum(ki * ki, dim=-1, keepdim=True) + eps)
            pypto.set_vec_tile_shapes(1, dv)
            vi = pypto.cast(pypto.view(v, [1, dv], [i, 0]), f32)
            decay = pypto.exp(pypto.cast(pypto.view(g, [1, 1], [i, 0]), f32))
            bi = pypto.cast(pypto.view(beta, [1, 1], [i, 0]), f32)
            pypto.set_vec_tile_shapes(dk, min(dv, 64))
            s = pypto.view(state, [dk, dv], [i * dk, 0]) * decay                     # the state decays
            kcol, qcol = pypto.reshape(ki, [dk, 1]), pypto.reshape(qi, [dk, 1])
            kv_mem = pypto.sum(s * kcol, dim=0, keepdim=True)                          # S^T k: [1, dv]
            delta = (vi - kv_mem) * bi
            s = s + kcol * delta                                                       # the delta rule's write
            pypto.assemble(s, [i * dk, 0], new_state)
            o = pypto.sum(s * qcol, dim=0, keepdim=True)                               # S^T q
            pypto.assemble(pypto.cast(o, out.dtype), [i, 0], out)

    return gated_delta_rule_decode


def gated_delta_rule_reference(q, k, v, g, beta, state, eps: float = 1e-6):
    """The recurrent step in fp32 (transformers' ``torch_recurrent_gated_delta_rule`` for one token):
    ``(out [N, dv], new state [N * dk, dv])``."""
    n, dk = q.shape
    dv = v.shape[1]
    q, k, v = q.float(), k.float(), v.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + eps) * dk ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + eps)
    s = state.float().reshape(n, dk, dv) * g.float().exp().reshape(n, 1, 1)
    kv_mem = (s * k[:, :, None]).sum(1)
    delta = (v - kv_mem) * beta.float()
    s = s + k[:, :, None] * delta[:, None, :]
    return (s * q[:, :, None]).sum(1), s.reshape(n * dk, dv)


# ---- GLM-4.5: the fused routed MoE ------------------------------------------------------------------

@functools.cache
def fused_moe_decode_kernel(top_k: int, routed_scaling: float = 1.0):
    """Router, top-k and routed experts in one kernel: ``(x [T, h], w_router [E, h], bias [1, E] fp32,
    w_gate_up [E * h, 2 I], w_down [E * I, h], out [T, h])``. Sigmoid scores, the correction bias for
    the choice only, the ``top_k`` best experts, their unbiased scores renormalised and multiplied by
    ``routed_scaling``; each token's chosen experts run their SwiGLU MLP (weights viewed at the id
    the top-k wrote) and are summed with those weights. The expert weights are read once per
    (token, slot): a decode batch of ``T`` tokens reads ``T x top_k`` expert matrices."""

    @pypto.jit
    def fused_moe_decode(x: pypto.Tensor[...], w_router: pypto.Tensor[...], bias: pypto.Tensor[...],
                         w_gate_up: pypto.Tensor[...], w_down: pypto.Tensor[...], out: pypto.Tensor[...]):
        t, h = x.shape
        e = w_router.shape[0]
        inter = w_down.shape[0] // e
        f32 = pypto.DT_FP32
        pypto.set_cube_tile_shapes([16, 16], [256, 512], [64, 256])
        logits = pypto.matmul(x, w_router, f32, b_trans=True)                            # [T, E]
        pypto.set_vec_tile_shapes(t, e)
        scores = pypto.sigmoid(logits)
        _, ids = pypto.topk(scores + bias, top_k, -1, True)                            # the bias picks only
        picked = pypto.gather(scores, 1, ids)
        pypto.set_vec_tile_shapes(t, top_k)
        weights = picked / pypto.sum(picked, dim=-1, keepdim=True) * routed_scaling
        chosen = pypto.tensor([t, top_k], pypto.DT_INT32, "chosen")
        chosen[:] = ids
        for i in pypto.loop(t, name="LOOP_tokens", idx_name="i"):
            xi = pypto.view(x, [1, h], [i, 0])
            acc = pypto.tensor([1, h], f32, "acc")
            acc[:] = pypto.full([1, h], 0.0, f32)
            for j in pypto.loop(top_k, name="LOOP_slots", idx_name="j"):
                ex = chosen[i, j]                                                      # the expert id, a scalar
                pypto.set_cube_tile_shapes([16, 16], [256, 512], [64, 256])
                gu = pypto.matmul(xi, pypto.view(w_gate_up, [h, 2 * inter], [ex * h, 0]), f32)     # [1, 2I]
                pypto.set_vec_tile_shapes(1, inter)
                gate, up = pypto.view(gu, [1, inter], [0, 0]), pypto.view(gu, [1, inter], [0, inter])
                act = pypto.cast(gate * pypto.sigmoid(gate) * up, x.dtype)
                y = pypto.matmul(act, pypto.view(w_down, [inter, h], [ex * inter, 0]), f32)       # [1, h]
                pypto.set_vec_tile_shapes(1, h)
                acc[:] = acc + y * pypto.view(weights, [1, 1], [i, j])
            pypto.assemble(pypto.cast(acc, out.dtype), [i, 0], out)

    return fused_moe_decode


def fused_moe_reference(x, w_router, bias, w_gate_up, w_down, top_k: int, routed_scaling: float = 1.0):
    """GLM-4.5's routed experts in fp32: ``[T, h]``."""
    t, h = x.shape
    e = w_router.shape[0]
    inter = w_down.shape[0] // e
    xf = x.float()
    scores = torch.sigmoid(xf @ w_router.float().T)
    ids = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    picked = scores.gather(1, ids)
    weights = picked / picked.sum(-1, keepdim=True) * routed_scaling
    gu_w, d_w = w_gate_up.float().reshape(e, h, 2 * inter), w_down.float().reshape(e, inter, h)
    out = torch.zeros(t, h)
    for i in range(t):
        for j in range(top_k):
            ex = int(ids[i, j])
            gu = xf[i] @ gu_w[ex]
            act = (torch.nn.functional.silu(gu[:inter]) * gu[inter:]).to(x.dtype).float()
            out[i] += weights[i, j] * (act @ d_w[ex])
    return out
