"""Lowering rules of the ops only a training step's graph holds (AOT autograd's joint graph, seen
as `Node`s through `pypto_lab.capture.fx_node.op_graph`): training-mode BatchNorm and the backward
ops, each split into the CANN training kernels that run it. The table (`pypto_lab.lowering.table`)
names them; element-wise gradients, softmax gradients and the like need no rule of their own.

* ``convolution_backward`` -> Conv2DBackpropInput (the input gradient: the output gradient
  convolved with the flipped weights, M = N*H*W, K = C_out*kh*kw, N = C_in, its A read through
  load3d) and Conv2DBackpropFilter (the weight gradient, as A = im2col(x)^T read through load3d:
  M = C_in*kh*kw, K = N*Ho*Wo, N = C_out, its reduction split over the cores by whole samples as
  CANN's tiling binds cores to the batch, `filter_batch_split`),
  and a channel sum for the bias, each only when the graph asks for that gradient;
* training BatchNorm -> BNTrainingReduce (per-channel sum and sum of squares) + BNTrainingUpdate
  (normalise, scale, shift); its backward -> BNTrainingUpdateGrad (the two per-channel sums of
  dy and dy*x_hat) + BNTrainingReduceGrad (the input gradient), as CANN splits them;
* LayerNorm's backward -> LayerNormXBackprop + LayerNormBetaGammaBackprop;
* a mixture of experts' grouped matmul's backward (``transformers::grouped_mm_fallback_backward``)
  -> two GroupedMatmul kernels, as MindSpeed's GMM backward calls them
  (``mindspeed/core/transformer/moe/grouped_matmul_util.py``: ``npu_gmm([grad], [weight^T], ...,
  group_type 0)`` for the input gradient, ``npu_gmm([x^T], [grad], ..., group_type 2)`` for the
  weight gradient, split along K);
* FlashAttention's backward: CANN's FlashAttentionScoreGrad, one kernel that recomputes the
  scores and runs five GEMMs against the forward's two (`pypto_lab.hw.attention_grad`).

Statistics and their gradients compute in the precision's ``stats`` dtype (fp32 under AMP: apex
keeps BatchNorm in fp32 at O2).
"""

from __future__ import annotations

from math import prod

from ..capture.graph import Graph, Node
from ..hw.chip import Chip
from ..hw.kernels import Im2col
from ..kernels.ir import AttentionKernel, CubeKernel, KernelSpec, VectorKernel
from .lower import vector_spec, with_casts
from .precision import Precision


def _shape(graph: Graph, node: Node, i: int) -> tuple[int, ...]:
    """The shape of the ``i``-th argument of ``node`` (a tensor's name in its captured arguments)."""
    a = node.args[i] if i < len(node.args) else None
    info = graph.info(a) if isinstance(a, str) and a in node.inputs else None
    return info.shape if info is not None else ()


def _stats(precision: Precision, op: str, ops: tuple[str, ...], numel: int, inputs: int,
           row_len: int | None = None) -> VectorKernel:
    return vector_spec(op, ops, numel, precision.vector, precision.stats, inputs, row_len)


def _cube(op: str, batch: int, m: int, k: int, n: int, precision: Precision,
          im2col: Im2col | None = None) -> CubeKernel:
    return CubeKernel(op, max(1, batch), max(1, m), max(1, k), max(1, n), precision.cube, precision.cube_out,
                      im2col=im2col)


def filter_batch_split(chip: Chip, groups: int, m: int, n: int, samples: int) -> int:
    """How many parts Conv2DBackpropFilter's reduction over the N x Ho x Wo output positions is split
    into across the cores, as CANN's tiling does: its weight gradient is a small C_in*kh*kw x C_out
    matrix whose blocks alone leave most cores idle, so the tiling binds cores to the batch as
    well (hicann/ops-nn conv/conv3d_backprop_filter_v2/op_host/op_tiling/arch22/
    conv3d_backprop_filter_v2_basic_block_tiling.cpp@234e4e40: the units dealt to the cores are
    batch x dout x mCnt x kCnt x nCnt outside deterministic mode, over basic blocks of 128 x 128
    and up; the 910A's TBE tiling sets blockDim = m_dim x n_dim x batch_dim x k_dim) and adds the
    partial gradients into the fp32 output (atomic add). The split: the divisor ``b`` of the batch
    (whole samples per part) that gives the cores the least work each, ``ceil(b x blocks / cores)
    / b`` with ``blocks`` the 128 x 128 blocks of C, the smallest such ``b`` (each part adds one
    more partial C)."""
    blocks = groups * -(-m // 128) * -(-n // 128)
    cores = chip.cube_cores

    def load(b: int) -> float:
        return -(-b * blocks // cores) / b

    divisors = [d for d in range(1, samples + 1) if samples % d == 0]
    best = min(load(d) for d in divisors)
    return min(d for d in divisors if load(d) <= best * 1.0001)


def convolution_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    dy, x, w = _shape(graph, node, 0), _shape(graph, node, 1), _shape(graph, node, 2)
    groups = int(node.args[9])
    mask = node.args[10]
    n, _, h, wd = x
    cout, cin_g, kh, kw = w
    _, _, ho, wo = dy
    specs: list[KernelSpec] = []
    ins = [prod(dy)]
    if mask[0]:   # dL/dx: the output gradient convolved with the flipped weights, read through load3d
        specs.append(_cube("Conv2DBackpropInput", groups, n * h * wd, (cout // groups) * kh * kw, cin_g, precision,
                           Im2col(w=wo, wo=wd, kh=kh, kw=kw, stride=1)))
    if mask[1]:   # dL/dW: the input's im2col rows (read through load3d) against the output gradient
        stride = int(node.args[4][0]) if len(node.args) > 4 and node.args[4] else 1
        split = filter_batch_split(chip, groups, cin_g * kh * kw, max(1, cout // groups), n)
        if split > 1:   # the atomically added output zeroed first: the operator's MemSet task (msprof-analyze
            # test/ut/advisor/timeline_advice/trace_view.json@8399c1cd: Conv2DBackpropFilter6_MemSet before each)
            specs.append(vector_spec("MemSet", ("copy",), cout * cin_g * kh * kw, "fp32", "fp32", 0))
        specs.append(CubeKernel("Conv2DBackpropFilter", groups * split, cin_g * kh * kw, n * ho * wo // split,
                                max(1, cout // groups), precision.cube, "fp32" if split > 1 else precision.cube_out,
                                im2col=Im2col(w=wd, wo=wo, kh=kh, kw=kw, stride=stride, along_k=True)))
        ins.append(prod(x))
    if len(mask) > 2 and mask[2]:
        specs.append(vector_spec("BiasAddGrad", ("sum",), prod(dy), precision.vector, precision.vector, 1, ho * wo))
    return with_casts(specs, precision, ins, prod(x) if mask[0] else 0)


def _spatial(shape: tuple[int, ...]) -> int:
    """Elements per channel of one sample (H*W of an NCHW tensor; 1 below three dimensions)."""
    return prod(shape[2:]) if len(shape) > 2 else 1


def batch_norm_training(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    x = _shape(graph, node, 0)
    return [_stats(precision, "BNTrainingReduce", ("mul", "sum"), prod(x), 1, _spatial(x)),
            _stats(precision, "BNTrainingUpdate", ("batchnorm",), prod(x), 1)]


def batch_norm_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    dy = _shape(graph, node, 0)
    return [_stats(precision, "BNTrainingUpdateGrad", ("mul", "sum", "sum"), prod(dy), 2, _spatial(dy)),
            _stats(precision, "BNTrainingReduceGrad", ("mul", "sub", "mul"), prod(dy), 2)]


def layer_norm_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    dy = _shape(graph, node, 0)
    row = dy[-1] if dy else 1
    return [_stats(precision, "LayerNormXBackprop", ("layernorm", "mul"), prod(dy), 3, row),
            _stats(precision, "LayerNormBetaGammaBackprop", ("mul", "add"), prod(dy), 2)]


def scatter_add_rows(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    """An embedding's gradient (or a scatter-add): the output gradient's rows added into the table's
    rows (UnsortedSegmentSum), read and rewritten in the statistics dtype, over the rows it adds."""
    return [_stats(precision, "UnsortedSegmentSum", ("add",), prod(_shape(graph, node, 0)), 2)]


def grouped_matmul_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    """GroupedMatmul's backward (input ``x`` [S, K], weights [E, K, N], offsets, output gradient [S,
    N]): dX = dY @ W_e^T per expert (batch: the busy experts, M = rows per expert, K = N, N = K) and
    dW_e = x_e^T @ dY_e (batch: the busy experts, M = K, K = rows per expert, N = N), the routed
    rows spread evenly over the experts (`pypto_lab.lowering.lower`'s grouped-matmul rule)."""
    x, w = _shape(graph, node, 0), _shape(graph, node, 1)
    rows, experts = (x[0] if x else 1), (w[0] if w else 1)
    k, n = (w[1], w[2]) if len(w) == 3 else (x[-1] if x else 1, 1)
    busy = max(1, min(experts, rows))
    per = max(1, -(-rows // busy))
    return [_cube("GroupedMatmul", busy, per, n, k, precision), _cube("GroupedMatmul", busy, k, per, n, precision)]


def flash_attention_backward(graph: Graph, node: Node, chip: Chip, precision: Precision) -> list[KernelSpec]:
    """FlashAttention's backward as CANN's FlashAttentionScoreGrad runs it: one kernel that
    recomputes the scores and runs five GEMMs with its Vector work (`pypto_lab.hw.attention_grad`)."""
    q, k = _shape(graph, node, 1), _shape(graph, node, 2)
    b, h, s_q, d = q
    return [AttentionKernel(batch_heads=b * h, s_q=s_q, s_k=k[2], d=d, dtype=precision.cube, flash=True,
                            backward=True)]


__all__ = ["batch_norm_backward", "batch_norm_training", "convolution_backward", "filter_batch_split",
           "flash_attention_backward",
           "grouped_matmul_backward", "layer_norm_backward", "scatter_add_rows"]
