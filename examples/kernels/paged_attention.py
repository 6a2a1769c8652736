#!/usr/bin/env python3
"""Decode attention over a paged KV cache (vLLM-style PagedAttention), bf16 in, fp32 accumulation.

Keys and values live in a pool of fixed-size blocks; sequence b owns the blocks listed in row b
of a block table, and its length is seq_lens[b]. For each sequence the kernel reads its length
and, block after block, the block's number from the table as scalars (tensor reads at run time),
views that block of the pool and folds it into an online softmax (running max, running sum,
rescaled accumulator), so the number of blocks visited differs per sequence. The sequences here
fill whole blocks (a partial last block would need a masked tail). Written here from that
description; the torch reference gathers each sequence's keys and values and runs plain softmax
attention in fp32.
"""

import os
import sys

import torch

import pypto_lab.pto as pypto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import result  # noqa: E402

NQ, D = 16, 64                # query heads (one KV head shared by all: MQA), head size
BLOCK, MAX_BLOCKS = 64, 4     # tokens per cache block, block-table row length
NUM_BLOCKS = 8                # blocks in the pool
SEQ_LENS = [256, 128]         # tokens cached per sequence (whole blocks)
SCALE = 1.0 / D ** 0.5


@pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
def paged_attention_kernel(
    q: pypto.Tensor([pypto.DYNAMIC, NQ, D], pypto.DT_BF16),
    k_cache: pypto.Tensor([pypto.DYNAMIC, BLOCK, D], pypto.DT_BF16),
    v_cache: pypto.Tensor([pypto.DYNAMIC, BLOCK, D], pypto.DT_BF16),
    block_table: pypto.Tensor([pypto.DYNAMIC, MAX_BLOCKS], pypto.DT_INT32),
    seq_lens: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    out: pypto.Tensor([pypto.DYNAMIC, NQ, D], pypto.DT_BF16),
):
    batch, pool = q.shape[0], k_cache.shape[0]
    q_2d = pypto.reshape(q, [batch * NQ, D], inplace=True)
    k_2d = pypto.reshape(k_cache, [pool * BLOCK, D], inplace=True)
    v_2d = pypto.reshape(v_cache, [pool * BLOCK, D], inplace=True)
    pypto.set_cube_tile_shapes([16, 16], [64, 64], [64, 64])
    pypto.set_vec_tile_shapes(NQ, BLOCK)

    for b in pypto.loop(batch, name="LOOP_b", idx_name="b"):
        n_blocks = (seq_lens[b] + BLOCK - 1) // BLOCK       # read from the tensor at run time
        qb = pypto.view(q_2d, [NQ, D], [b * NQ, 0])
        acc = pypto.tensor([NQ, D], pypto.DT_FP32, "acc")
        run_sum = pypto.tensor([NQ, 1], pypto.DT_FP32, "run_sum")
        run_max = pypto.tensor([NQ, 1], pypto.DT_FP32, "run_max")
        acc[:] = pypto.full([NQ, D], 0.0, pypto.DT_FP32)
        run_sum[:] = pypto.full([NQ, 1], 0.0, pypto.DT_FP32)
        run_max[:] = pypto.full([NQ, 1], -1e30, pypto.DT_FP32)
        for j in pypto.loop(n_blocks, name="LOOP_blocks", idx_name="j"):
            blk = block_table[b, j]                           # the cache block holding tokens j*BLOCK...
            kj = pypto.view(k_2d, [BLOCK, D], [blk * BLOCK, 0])
            vj = pypto.view(v_2d, [BLOCK, D], [blk * BLOCK, 0])
            s = pypto.mul(pypto.matmul(qb, kj, pypto.DT_FP32, b_trans=True), SCALE)   # (NQ, BLOCK)
            new_max = pypto.maximum(run_max, pypto.amax(s, dim=-1, keepdim=True))
            p = pypto.exp(pypto.sub(s, new_max))
            rescale = pypto.exp(pypto.sub(run_max, new_max))
            run_sum[:] = run_sum * rescale + pypto.sum(p, dim=-1, keepdim=True)
            acc[:] = acc * rescale + pypto.matmul(pypto.cast(p, pypto.DT_BF16), vj, pypto.DT_FP32)
            run_max[:] = new_max
        ob = pypto.reshape(pypto.cast(pypto.div(acc, run_sum), pypto.DT_BF16), [1, NQ, D])
        pypto.assemble(ob, [b, 0, 0], out)


def make_cache(seq_lens):
    """A shuffled pool of blocks and the block table that maps each sequence onto it (-1: unused)."""
    order = torch.randperm(NUM_BLOCKS).tolist()
    table = torch.full((len(seq_lens), MAX_BLOCKS), -1, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        for j in range(-(-n // BLOCK)):
            table[b, j] = order.pop()
    return table


def reference(q, k_cache, v_cache, table, seq_lens):
    out = torch.empty(q.shape, dtype=torch.float32)
    for b, n in enumerate(seq_lens):
        blocks = [int(i) for i in table[b] if i >= 0]
        k = torch.cat([k_cache[i] for i in blocks]).float()[:n]
        v = torch.cat([v_cache[i] for i in blocks]).float()[:n]
        out[b] = torch.softmax(q[b].float() @ k.T * SCALE, dim=-1) @ v
    return out


def main():
    torch.manual_seed(0)
    batch = len(SEQ_LENS)
    q = torch.empty((batch, NQ, D), dtype=torch.bfloat16).uniform_(-1, 1)
    k_cache = torch.empty((NUM_BLOCKS, BLOCK, D), dtype=torch.bfloat16).uniform_(-1, 1)
    v_cache = torch.empty((NUM_BLOCKS, BLOCK, D), dtype=torch.bfloat16).uniform_(-1, 1)
    table = make_cache(SEQ_LENS)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    out = torch.zeros_like(q)

    paged_attention_kernel(q, k_cache, v_cache, table, seq_lens, out)

    golden = reference(q, k_cache, v_cache, table, SEQ_LENS)
    return result("paged_attention", paged_attention_kernel, out, golden, torch.bfloat16,
                  blocks_read=int((table >= 0).sum()))


if __name__ == "__main__":
    sys.exit(0 if main().passed else 1)
