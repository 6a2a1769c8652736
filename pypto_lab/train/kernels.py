"""The NPU kernels of a training step's ATen ops, forward and backward, under a precision policy.

`kernels_of(node, policy)` returns the kernel specs (`pypto_lab.kernels.ir`) one node of the joint
graph runs as, the way CANN's training operators split the work:

* ``convolution`` -> Conv2D on the Cube (implicit GEMM, im2col rows built in L1 by load3d);
  ``convolution_backward`` -> Conv2DBackpropInput (the input gradient: a convolution of the output
  gradient with the flipped weights, M = N*H*W, K = C_out*kh*kw, N = C_in) and
  Conv2DBackpropFilter (the weight gradient: M = C_out, K = N*Ho*Wo, N = C_in*kh*kw), and a
  channel sum for the bias, each only when the graph asks for that gradient;
* ``mm`` / ``addmm`` / ``bmm`` -> MatMulV2 / BatchMatMulV2 (the backward's two gradient matmuls are
  ``mm`` nodes of the graph already);
* training BatchNorm -> BNTrainingReduce (per-channel sum and sum of squares) + BNTrainingUpdate
  (normalise, scale, shift); its backward -> BNTrainingUpdateGrad (the two per-channel sums of
  dy and dy*x_hat) + BNTrainingReduceGrad (the input gradient), as CANN splits them;
* LayerNorm and its backward, softmax / log-softmax and theirs, element-wise ops and their
  gradients, pooling and its gradient, reductions, embedding and its scatter-add gradient,
  dropout, FlashAttention and its backward (five GEMMs against the forward's two: FlashAttention-2,
  Dao 2023, Algorithm 2) -> Vector (or attention) kernels of the sizes the graph gives.

Views and scalar bookkeeping (``num_batches_tracked += 1``) cost nothing. An op with no mapping is
costed as one GM round trip of its output (a copy) and listed by name in the report, so nothing
is silently free.

`Policy` is the precision: which dtype the Cube multiplies, which dtype vector kernels keep in GM
and compute in, and the casts AMP inserts (apex-style O1 casts a Cube op's fp32 inputs to half and
its output back; O2 keeps the model in half, with BatchNorm computing in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hw.kernels import Im2col
from ..kernels.ir import AttentionKernel, CubeKernel, KernelSpec, VectorKernel
from .capture import meta_value, tensor_of

AMP_LEVELS = ("O0", "O1", "O2")
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Policy:
    """Mixed precision of a training step (apex AMP's opt levels, as the seed's §4.2 uses them).

    * O0: everything fp32.
    * O1: the Cube ops (convolutions, matmuls) multiply in half; their fp32 inputs are cast to half
      and their outputs back to fp32 (Vector cast kernels); everything else stays fp32.
    * O2: the model is half (BatchNorm computes in fp32); the optimizer keeps fp32 master weights
      and writes the half copy back.
    fp16 scales the loss (dynamic loss scaling, an overflow check on the gradients each step);
    bf16 needs no scaling.
    """

    amp: str
    half: str   # "fp16" or "bf16" (unused at O0)

    @property
    def cube_dtype(self) -> str:
        return "fp32" if self.amp == "O0" else self.half

    @property
    def act_dtype(self) -> str:
        """What vector kernels keep in GM."""
        return self.half if self.amp == "O2" else "fp32"

    @property
    def cube_out_dtype(self) -> str:
        return self.half if self.amp == "O2" else ("fp32" if self.amp == "O0" else self.half)

    @property
    def param_dtype(self) -> str:
        return self.half if self.amp == "O2" else "fp32"

    @property
    def master_weights(self) -> bool:
        return self.amp == "O2"

    @property
    def loss_scaling(self) -> bool:
        return self.amp != "O0" and self.half == "fp16"

    @property
    def casts_around_cube(self) -> bool:
        return self.amp == "O1"


def policy_of(precision: str, amp: str | None) -> Policy:
    """The policy for ``precision`` (fp32 / fp16 / bf16) and ``amp`` (None, "O0", "O1", "O2").
    ``amp=None`` means O2 for a half precision (the seed's choice) and O0 for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}: training runs in one of {', '.join(PRECISIONS)}. "
                         "Fix: precision='fp16'")
    if amp is not None and amp not in AMP_LEVELS:
        raise ValueError(f"amp = {amp!r}: an apex opt level, one of {', '.join(AMP_LEVELS)} (or None). "
                         "Fix: amp='O2' (the seed's §4.2) or amp='O1'")
    if precision == "fp32":
        if amp not in (None, "O0"):
            raise ValueError(f"amp = {amp!r} with precision='fp32': O1 and O2 train in half precision. Fix: "
                             "precision='fp16' (or 'bf16') with amp, or amp=None for fp32")
        return Policy("O0", "fp16")
    return Policy("O2" if amp is None else amp, precision)


BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def _numel(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.numel())


MAX_ROW = 2048   # longest row a reduction keeps whole in UB here; longer rows reduce in two passes


def _split_row(row: int | None) -> int | None:
    """A reduction over a row longer than UB holds runs as partial sums over segments of it (the
    second pass over the partial sums is negligible): the segment is the row's largest divisor
    up to `MAX_ROW`."""
    if row is None or row <= MAX_ROW:
        return row
    best = max((d for d in range(1, MAX_ROW + 1) if row % d == 0), default=MAX_ROW)
    return best if best >= 64 else MAX_ROW


def flat_reduction(numel: int) -> tuple[int, int]:
    """(elements, row length) of a reduction over a flat buffer of ``numel`` elements (all
    gradients, say): rows of `MAX_ROW`, the last one padded."""
    row = min(MAX_ROW, max(1, numel))
    return -(-numel // row) * row, row


def _vec(op: str, ops: tuple[str, ...], numel: int, policy: Policy, inputs: int = 1, row_len: int | None = None,
         compute: str | None = None) -> VectorKernel:
    dt = policy.act_dtype
    row_len = _split_row(row_len)
    numel = max(1, numel)
    if row_len and numel % row_len:   # segments of a row with no divisor near MAX_ROW (BERT's 30,522-word
        numel = -(-numel // row_len) * row_len   # vocabulary): the last one padded
    return VectorKernel(op=op, ops=ops, numel=numel, dtype=dt, compute_dtype=compute or dt,
                        inputs=inputs, row_len=row_len)


def _cast(numel: int, policy: Policy, what: str) -> VectorKernel:
    return VectorKernel(op=f"Cast({what})", ops=("cast",), numel=max(1, numel), dtype="fp32",
                        compute_dtype="fp32", inputs=1)


def _cube(op: str, batch: int, m: int, k: int, n: int, policy: Policy, im2col: Im2col | None = None,
          fmt: str = "") -> CubeKernel:
    return CubeKernel(op=op, batch=max(1, batch), m=max(1, m), k=max(1, k), n=max(1, n), dtype=policy.cube_dtype,
                      out_dtype=policy.cube_out_dtype, a_format=fmt, c_format=fmt, im2col=im2col)


def _with_casts(specs: list[KernelSpec], policy: Policy, ins: list[int], out: int) -> list[KernelSpec]:
    """O1: cast a Cube op's fp32 inputs to half before it and its output back to fp32 after it."""
    if not policy.casts_around_cube:
        return specs
    pre = [_cast(n, policy, "to half") for n in ins if n]
    return pre + specs + ([_cast(out, policy, "to fp32")] if out else [])


def _conv(node, policy: Policy) -> list[KernelSpec]:
    x, w = meta_value(node, 0), meta_value(node, 1)
    out = tensor_of(node)
    stride = node.args[3]
    groups = int(node.args[8]) if len(node.args) > 8 else 1
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    _, _, ho, wo = out.shape
    spec = _cube("Conv2D", groups, n * ho * wo, cin_g * kh * kw, cout // groups, policy,
                 Im2col(w=wd, wo=wo, kh=kh, kw=kw, stride=int(stride[0])), "NC1HWC0")
    return _with_casts([spec], policy, [_numel(x), _numel(w)], _numel(out))


def _conv_backward(node, policy: Policy) -> list[KernelSpec]:
    dy, x, w = meta_value(node, 0), meta_value(node, 1), meta_value(node, 2)
    groups = int(node.args[9])
    mask = node.args[10]
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    _, _, ho, wo = dy.shape
    specs: list[KernelSpec] = []
    ins = [_numel(dy)]
    if mask[0]:   # dL/dx: the output gradient convolved with the flipped weights, read through load3d
        specs.append(_cube("Conv2DBackpropInput", groups, n * h * wd, (cout // groups) * kh * kw, cin_g, policy,
                           Im2col(w=wo, wo=wd, kh=kh, kw=kw, stride=1)))
    if mask[1]:   # dL/dW: output gradient (C_out x N*Ho*Wo) times the input's im2col rows
        specs.append(_cube("Conv2DBackpropFilter", groups, cout // groups, n * ho * wo, cin_g * kh * kw, policy))
        ins.append(_numel(x))
    if len(mask) > 2 and mask[2]:
        specs.append(_vec("BiasAddGrad", ("sum",), _numel(dy), policy, row_len=ho * wo))
    return _with_casts(specs, policy, ins, _numel(x) if mask[0] else 0)


def _mm(node, policy: Policy) -> list[KernelSpec]:
    t = str(node.target)
    if t == "aten.addmm.default":
        a, b = meta_value(node, 1), meta_value(node, 2)
    else:
        a, b = meta_value(node, 0), meta_value(node, 1)
    out = tensor_of(node)
    if t == "aten.bmm.default":
        bt, m, k = a.shape
        spec = _cube("BatchMatMulV2", bt, m, k, b.shape[-1], policy)
    else:
        m, k = a.shape
        spec = _cube("MatMulV2", 1, m, k, b.shape[-1], policy)
    return _with_casts([spec], policy, [_numel(a), _numel(b)], _numel(out))


def _hw(x: torch.Tensor) -> int:
    return int(x[0, 0].numel()) if x.dim() > 2 else 1


def _batch_norm(node, policy: Policy) -> list[KernelSpec]:
    x = meta_value(node, 0)
    hw = _hw(x)
    # the batch statistics are summed in fp32; O2 keeps BatchNorm itself in fp32 (apex keep_batchnorm_fp32)
    return [_vec("BNTrainingReduce", ("mul", "sum"), _numel(x), policy, row_len=hw, compute="fp32"),
            _vec("BNTrainingUpdate", ("batchnorm",), _numel(x), policy, compute="fp32")]


def _batch_norm_backward(node, policy: Policy) -> list[KernelSpec]:
    dy = meta_value(node, 0)
    hw = _hw(dy)
    return [_vec("BNTrainingUpdateGrad", ("mul", "sum", "sum"), _numel(dy), policy, inputs=2, row_len=hw,
                 compute="fp32"),
            _vec("BNTrainingReduceGrad", ("mul", "sub", "mul"), _numel(dy), policy, inputs=2, compute="fp32")]


def _last(x: torch.Tensor) -> int:
    return int(x.shape[-1]) if x.dim() else 1


def _row_op(op: str, ops: tuple[str, ...], inputs: int = 1, arg: int = 0, compute: str = "fp32"):
    def make(node, policy: Policy) -> list[KernelSpec]:
        x = meta_value(node, arg)
        return [_vec(op, ops, _numel(x), policy, inputs=inputs, row_len=_last(x), compute=compute)]
    return make


def _layer_norm_backward(node, policy: Policy) -> list[KernelSpec]:
    dy = meta_value(node, 0)
    row = _last(dy)
    return [_vec("LayerNormXBackprop", ("layernorm", "mul"), _numel(dy), policy, inputs=3, row_len=row,
                 compute="fp32"),
            _vec("LayerNormBetaGammaBackprop", ("mul", "add"), _numel(dy), policy, inputs=2, compute="fp32")]


def _elementwise(op: str, ops: tuple[str, ...], inputs: int = 1):
    def make(node, policy: Policy) -> list[KernelSpec]:
        out = tensor_of(node)
        return [_vec(op, ops, _numel(out), policy, inputs=inputs)]
    return make


def _pool(op: str, inputs: int):
    def make(node, policy: Policy) -> list[KernelSpec]:
        x = meta_value(node, 0 if inputs == 1 else 1)
        return [_vec(op, ("max",), _numel(x), policy, inputs=inputs, row_len=_last(x))]
    return make


def _mean(node, policy: Policy) -> list[KernelSpec]:
    x = meta_value(node, 0)
    out = tensor_of(node)
    row = max(1, _numel(x) // max(1, _numel(out)))
    return [_vec("ReduceMean", ("sum",), _numel(x), policy, row_len=row, compute="fp32")]


def _embedding(node, policy: Policy) -> list[KernelSpec]:
    out = tensor_of(node)
    return [_vec("Gather", ("copy",), _numel(out), policy)]


def _embedding_backward(node, policy: Policy) -> list[KernelSpec]:
    dy = meta_value(node, 0)
    # scatter-add of the output gradient into the table's rows (UnsortedSegmentSum), in fp32
    return [_vec("UnsortedSegmentSum", ("add",), _numel(dy), policy, inputs=2, compute="fp32")]


def _attention_fwd(node, policy: Policy) -> list[KernelSpec]:
    q, k = meta_value(node, 0), meta_value(node, 1)
    b, h, s_q, d = q.shape
    return [AttentionKernel(batch_heads=b * h, s_q=s_q, s_k=k.shape[2], d=d, dtype=policy.cube_dtype, flash=True)]


def _attention_bwd(node, policy):
    """FlashAttention's backward recomputes the scores and runs five GEMMs to the forward's two
    (FlashAttention-2, Dao 2023, Algorithm 2): costed as 2.5 forward kernels, rounded to the
    kernel: two forward passes' worth plus half of one."""
    q = meta_value(node, 1)
    k = meta_value(node, 2)
    b, h, s_q, d = q.shape
    spec = AttentionKernel(batch_heads=b * h, s_q=s_q, s_k=k.shape[2], d=d, dtype=policy.cube_dtype, flash=True)
    half = AttentionKernel(batch_heads=max(1, b * h // 2), s_q=s_q, s_k=k.shape[2], d=d, dtype=policy.cube_dtype,
                           flash=True)
    return [spec, spec, half]


MAPPING = {
    "aten.convolution.default": _conv,
    "aten.convolution_backward.default": _conv_backward,
    "aten.mm.default": _mm, "aten.addmm.default": _mm, "aten.bmm.default": _mm,
    "aten._native_batch_norm_legit_functional.default": _batch_norm,
    "aten.native_batch_norm_backward.default": _batch_norm_backward,
    "aten.native_layer_norm.default": _row_op("LayerNorm", ("layernorm",)),
    "aten.native_layer_norm_backward.default": _layer_norm_backward,
    "aten._softmax.default": _row_op("SoftmaxV2", ("softmax",)),
    "aten._safe_softmax.default": _row_op("SoftmaxV2", ("softmax",)),
    "aten._log_softmax.default": _row_op("LogSoftmaxV2", ("softmax",)),
    "aten._softmax_backward_data.default": _row_op("SoftmaxGrad", ("mul", "sum", "sub", "mul"), inputs=2),
    "aten._log_softmax_backward_data.default": _row_op("LogSoftmaxGrad", ("exp", "sum", "mul", "sub"), inputs=2),
    "aten.relu.default": _elementwise("Relu", ("relu",)),
    "aten.threshold_backward.default": _elementwise("ReluGrad", ("relu",), 2),
    "aten.gelu.default": _elementwise("Gelu", ("gelu",)),
    "aten.gelu_backward.default": _elementwise("GeluGrad", ("gelu", "mul"), 2),
    "aten.tanh.default": _elementwise("Tanh", ("exp", "div")),
    "aten.tanh_backward.default": _elementwise("TanhGrad", ("mul", "sub", "mul"), 2),
    "aten.sigmoid.default": _elementwise("Sigmoid", ("exp", "add", "div")),
    "aten.sigmoid_backward.default": _elementwise("SigmoidGrad", ("sub", "mul", "mul"), 2),
    "aten.silu.default": _elementwise("Swish", ("exp", "add", "div", "mul")),
    "aten.silu_backward.default": _elementwise("SwishGrad", ("exp", "add", "div", "mul", "mul"), 2),
    "aten.add.Tensor": _elementwise("Add", ("add",), 2),
    "aten.sub.Tensor": _elementwise("Sub", ("sub",), 2),
    "aten.mul.Tensor": _elementwise("Mul", ("mul",), 2),
    "aten.div.Tensor": _elementwise("RealDiv", ("div",), 2),
    "aten.add.Scalar": _elementwise("Adds", ("add",)),
    "aten.mul.Scalar": _elementwise("Muls", ("mul",)),
    "aten.div.Scalar": _elementwise("Muls", ("mul",)),
    "aten.neg.default": _elementwise("Neg", ("mul",)),
    "aten.exp.default": _elementwise("Exp", ("exp",)),
    "aten.sqrt.default": _elementwise("Sqrt", ("sqrt",)),
    "aten.rsqrt.default": _elementwise("Rsqrt", ("rsqrt",)),
    "aten.pow.Tensor_Scalar": _elementwise("Pow", ("mul",)),
    "aten.where.self": _elementwise("Select", ("sub",), 3),
    "aten.clone.default": _elementwise("Identity", ("copy",)),
    "aten._to_copy.default": _elementwise("Cast", ("cast",)),
    "aten.native_dropout.default": _elementwise("DropOutDoMask", ("mul", "mul")),
    "aten.native_dropout_backward.default": _elementwise("DropOutDoMaskGrad", ("mul",), 2),
    "aten.cat.default": _elementwise("ConcatD", ("copy",)),
    "aten.max_pool2d_with_indices.default": _pool("MaxPoolWithArgmax", 1),
    "aten.max_pool2d_with_indices_backward.default": _pool("MaxPoolGradWithArgmax", 2),
    "aten.mean.dim": _mean, "aten.sum.dim_IntList": _mean, "aten.sum.default": _mean,
    "aten._adaptive_avg_pool2d.default": _mean,
    "aten._adaptive_avg_pool2d_backward.default": _elementwise("AdaptiveAvgPool2dGrad", ("mul",)),
    "aten.embedding.default": _embedding,
    "aten.gather.default": _embedding,
    "aten.index.Tensor": _embedding,
    "aten.scatter_add.default": _embedding_backward,
    "aten.fill.Scalar": _elementwise("Fill", ("copy",)),
    "aten.cos.default": _elementwise("Cos", ("exp",)),
    "aten.sin.default": _elementwise("Sin", ("exp",)),
    "aten.select_backward.default": _elementwise("SelectGrad", ("copy",)),
    "aten.slice_backward.default": _elementwise("SliceGrad", ("copy",)),
    "aten.masked_fill.Scalar": _elementwise("MaskedFill", ("sub",), 2),
    "aten.embedding_dense_backward.default": _embedding_backward,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _attention_fwd,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _attention_bwd,
    "aten.nll_loss_forward.default": _elementwise("NLLLoss", ("copy",)),
    "aten.nll_loss_backward.default": _elementwise("NLLLossGrad", ("copy",)),
}

# ops that make a tiny constant or do host bookkeeping: no kernel
FREE = {"<built-in function getitem>", "aten.ones_like.default", "aten.zeros_like.default",
        "aten.full.default", "aten.scalar_tensor.default", "aten.zeros.default", "aten.ones.default",
        "aten.arange.start", "aten.arange.default", "aten.empty.memory_format", "aten.full_like.default",
        "aten.copy_.default", "aten._assert_tensor_metadata.default", "aten.new_zeros.default",
        "aten.empty_like.default", "aten.new_ones.default", "aten.new_empty.default"}


def kernels_of(node, policy: Policy) -> tuple[list[KernelSpec], bool]:
    """The kernel specs of one joint-graph node, and whether the op had a mapping (False: costed as a
    copy of its output)."""
    target = str(node.target)
    if target in FREE:
        return [], True
    out = tensor_of(node)
    if out is not None and (out.numel() <= 1 or not (out.dtype.is_floating_point or target in MAPPING)):
        return [], True   # scalar bookkeeping (num_batches_tracked += 1, the loss's mean) or index math
    make = MAPPING.get(target)
    if make is not None:
        return make(node, policy), True
    numel = _numel(out) if out is not None else sum(_numel(tensor_of(a)) for a in node.all_input_nodes)
    if numel <= 1:
        return [], True
    return [_vec(f"Unmapped({target})", ("copy",), numel, policy)], False


def fake_quant_kernels(layer, policy: Policy) -> tuple[list[KernelSpec], list[KernelSpec]]:
    """The forward and backward kernels of one QAT layer's int8 fake quantisation
    (`pypto_lab.quantization.fake_quantize`): forward, the observer's running min / max of the
    input (two reductions), then input and weight each clamped to the int8 range (VMAX, VMIN),
    divided by the scale, rounded (a cast to int8 and back) and multiplied back; backward, the
    straight-through estimator passes the gradient where the value was in range (one select)."""
    x, w = layer.input_numel, layer.weight_numel
    fwd: list[KernelSpec] = []
    numel, row = flat_reduction(x)
    fwd.append(VectorKernel(op="ReduceMinMax", ops=("max", "max"), numel=numel, dtype=policy.act_dtype,
                            compute_dtype=policy.act_dtype, inputs=1, row_len=row))
    for n, what in ((x, "input"), (w, "weight")):
        fwd.append(VectorKernel(op=f"FakeQuant({what})", ops=("maximum", "minimum", "mul", "cast", "cast", "mul"),
                                numel=max(1, n), dtype=policy.act_dtype, compute_dtype=policy.act_dtype, inputs=1))
    bwd: list[KernelSpec] = [VectorKernel(op=f"FakeQuantGrad({what})", ops=("sub", "mul"), numel=max(1, n),
                                          dtype=policy.act_dtype, compute_dtype=policy.act_dtype, inputs=2)
                             for n, what in ((x, "input"), (w, "weight"))]
    return fwd, bwd
