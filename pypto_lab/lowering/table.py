"""The lowering table: every ATen operator the simulator can cost on the NPU, forward and backward,
and the NPU operator, unit and sizing rule it lowers with.

One table for every front end: `map_ops` looks up each node of a captured model or LLM graph, and a
training step looks up each node of AOT autograd's joint graph (seen as a `Node` through
`pypto_lab.capture.fx_node.op_graph`), so an entry added here is costed in inference, LLM graphs
and training at once. An entry (`pypto_lab.capture.catalogue.NpuOp`) names the CANN operator and
its unit and, for Vector work, the Vector operators it runs and how its rows and reads are sized;
ops that become several CANN kernels (the backward of a convolution, training BatchNorm) carry a
rule of their own (`pypto_lab.lowering.train_ops`). The rules themselves are in
`pypto_lab.lowering.lower`. Entries are keyed by ATen name ("add"); an entry for one overload
("add.Scalar", a scalar operand: CANN's Adds) takes precedence over the name's.

`entry_of(graph, node)` is the one lookup both front ends use, with the two rules for what the
table does not cost as a kernel:

* **Bookkeeping.** A known op whose every output holds at most one element (a step counter, the
  loss reduced to a scalar) runs no kernel of its own: it is listed as "free", like a view.
* **Fallback.** An op the table does not know runs on the host CPU: its inputs cross PCIe to the
  host and its outputs back (`HostKernel`, costed over ``chip.host_link_gbps``), and it is
  reported by name (the optimize report's ``fallbacks``, the training report's
  ``unmapped_ops``). This is what torch_npu does with an operator it has no NPU kernel for, and a
  simulator that does not know an op cannot claim it runs on the AI cores at the speed of some
  other kernel. The alternatives were weighed: an AI CPU kernel is how CANN runs the operators
  it has no AI Core kernel for, but its speed on the device's ARM cores is not modelled; an
  "unmapped" GM copy (what training used to charge) silently prices an unknown op like a memcpy,
  which hides exactly the ops a user should look at. The host fallback is the pessimistic,
  visible choice: add the op's entry here to cost it on the NPU.
"""

from __future__ import annotations

from ..capture.catalogue import CPU, CUSTOM_NAMESPACE, NpuOp, aten_name, overload_name
from ..capture.fx_node import op_graph
from ..capture.graph import Graph, Node
from ..hw.chip import Chip
from ..kernels.ir import KernelSpec
from . import npu_ops as N
from . import train_ops as T
from .lower import lower_all
from .precision import Precision


def _vec(name: str, *ops: str, **kw) -> NpuOp:
    return NpuOp(name, "vector", tuple(ops), **kw)


def _entries() -> dict[str, NpuOp]:
    cube = {
        "conv2d": "Conv2D", "convolution": "Conv2D", "_convolution": "Conv2D", "conv1d": "Conv2D",
        "linear": "MatMulV2", "addmm": "MatMulV2", "mm": "MatMulV2", "matmul": "BatchMatMulV2",
        "bmm": "BatchMatMulV2", "baddbmm": "BatchMatMulV2", "einsum": "BatchMatMulV2",
        # pypto_lab.quantization's int8 layers (torch.library ops pypto_lab::linear_int8, ::conv2d_int8)
        "linear_int8": "QuantBatchMatmulV3", "conv2d_int8": "Conv2D",
        # a mixture of experts' matmul, tokens sorted by expert: aten._grouped_mm and transformers'
        # own custom op transformers::grouped_mm_fallback (input [S, K], weights [E, K, N], offsets [E])
        "_grouped_mm": "GroupedMatmul", "grouped_mm_fallback": "GroupedMatmul",
    }
    out = {k: NpuOp(v, "cube") for k, v in cube.items()}
    out["convolution_backward"] = NpuOp("Conv2DBackprop", "cube", lower=T.convolution_backward)
    # its backward: the input and the weight gradients, two GroupedMatmul kernels (MindSpeed's GMM backward)
    out["grouped_mm_fallback_backward"] = NpuOp("GroupedMatmul", "cube", lower=T.grouped_matmul_backward)

    # Vector operators: (CANN operator, the Vector operators one tile runs)
    vector = {
        # element-wise arithmetic
        "add": ("Add", "add"), "add_": ("Add", "add"), "sub": ("Sub", "sub"), "sub_": ("Sub", "sub"),
        "rsub": ("Sub", "sub"), "mul": ("Mul", "mul"), "mul_": ("Mul", "mul"), "div": ("RealDiv", "div"),
        "div_": ("RealDiv", "div"), "neg": ("Neg", "mul"), "pow": ("Pow", "mul"), "sqrt": ("Sqrt", "sqrt"),
        "rsqrt": ("Rsqrt", "rsqrt"), "exp": ("Exp", "exp"), "log": ("Log", "exp"), "abs": ("Abs", "relu"),
        "reciprocal": ("Reciprocal", "div"), "clamp": ("ClipByValue", "relu"), "where": ("Select", "add"),
        "masked_fill": ("MaskedFill", "add"), "eq": ("Equal", "sub"), "ne": ("NotEqual", "sub"),
        "lt": ("Less", "sub"), "gt": ("Greater", "sub"), "ge": ("GreaterEqual", "sub"),
        "le": ("LessEqual", "sub"), "logical_and": ("LogicalAnd", "mul"), "logical_or": ("LogicalOr", "add"),
        "logical_not": ("LogicalNot", "relu"), "minimum": ("Minimum", "sub"), "maximum": ("Maximum", "sub"),
        "floor": ("Floor", "cast"), "ceil": ("Ceil", "cast"), "round": ("Round", "cast"), "sign": ("Sign", "relu"),
        "sin": ("Sin", "exp"), "cos": ("Cos", "exp"), "masked_fill_": ("MaskedFill", "add"), "fill_": ("Fill", "copy"),
        "fill": ("Fill", "copy"), "square": ("Square", "mul"), "clamp_min": ("Maximum", "relu"),
        "clamp_max": ("Minimum", "relu"), "_to_copy": ("Cast", "cast"), "to": ("Cast", "cast"),
        "type_as": ("Cast", "cast"), "bitwise_not": ("LogicalNot", "relu"), "bitwise_and": ("LogicalAnd", "mul"),
        # Python's & | on bool tensors (transformers' attention-mask builders), floor division, diff
        "__and__": ("LogicalAnd", "mul"), "__or__": ("LogicalOr", "add"), "bitwise_or": ("LogicalOr", "add"),
        "floor_divide": ("FloorDiv", "div"), "diff": ("Sub", "sub"),
        # activations
        "relu": ("Relu", "relu"), "relu_": ("Relu", "relu"), "gelu": ("Gelu", "gelu"),
        "hardtanh": ("ClipByValue", "relu"), "hardtanh_": ("ClipByValue", "relu"), "erf": ("Erf", "gelu"),
        "hardswish": ("HardSwish", "gelu"), "hardswish_": ("HardSwish", "gelu"),
        "hardsigmoid": ("HardSigmoid", "relu"), "leaky_relu": ("LeakyRelu", "relu"),
        "elu": ("Elu", "exp"), "softplus": ("Softplus", "exp"), "mish": ("Mish", "gelu"), "prelu": ("PRelu", "relu"),
        "relu6": ("Relu6", "relu"), "glu": ("GLU", "gelu"),
        # embedding lookups and gathers move rows by index: data movement on the vector cores
        "embedding": ("GatherV2", "copy"), "index_select": ("GatherV2", "copy"),
        "gather": ("GatherElements", "copy"), "clone": ("Identity", "copy"),
    }
    out.update({k: _vec(name, op) for k, (name, op) in vector.items()})
    # activations whose exp-based formula the Vector unit runs op by op
    out.update({
        "tanh": _vec("Tanh", "exp", "div"),                       # (1 - e^-2x) / (1 + e^-2x)
        "sigmoid": _vec("Sigmoid", "exp", "add", "div"),          # 1 / (1 + e^-x)
        "silu": _vec("Swish", "exp", "add", "div", "mul"), "silu_": _vec("Swish", "exp", "add", "div", "mul"),
        # an operand that is a Python number: CANN's scalar operators (a division multiplies by the inverse)
        "add.Scalar": _vec("Adds", "add"), "mul.Scalar": _vec("Muls", "mul"), "div.Scalar": _vec("Muls", "mul"),
    })
    # normalisation, softmax and reductions: statistics in fp32 under AMP and mixed precision
    out.update({
        "batch_norm": _vec("BatchNorm", "batchnorm", fp32=True),
        "_native_batch_norm_legit_no_training": _vec("BatchNorm", "batchnorm", fp32=True),
        "layer_norm": _vec("LayerNorm", "layernorm", fp32=True),
        "native_layer_norm": _vec("LayerNorm", "layernorm", fp32=True),
        "group_norm": _vec("GroupNorm", "layernorm", fp32=True),
        "softmax": _vec("SoftmaxV2", "softmax", fp32=True), "_softmax": _vec("SoftmaxV2", "softmax", fp32=True),
        "_safe_softmax": _vec("SoftmaxV2", "softmax", fp32=True),
        "log_softmax": _vec("LogSoftmaxV2", "softmax", fp32=True),
        "_log_softmax": _vec("LogSoftmaxV2", "softmax", fp32=True),
        "sum": _vec("ReduceSum", "sum", rows="reduced", sized_by_input=True, fp32=True),
        "mean": _vec("ReduceMean", "sum", rows="reduced", sized_by_input=True, fp32=True),
        "adaptive_avg_pool2d": _vec("AdaptiveAvgPool2d", "sum", rows="reduced", sized_by_input=True, fp32=True),
        "_adaptive_avg_pool2d": _vec("ReduceMean", "sum", rows="reduced", sized_by_input=True, fp32=True),
        "amax": _vec("ReduceMax", "max", sized_by_input=True), "max": _vec("ReduceMax", "max", sized_by_input=True),
        "var": _vec("ReduceStd", "layernorm", fp32=True), "cumsum": _vec("Cumsum", "sum", fp32=True),
        "argmax": _vec("ArgMaxV2", "max"), "amin": _vec("ReduceMin", "max"), "min": _vec("ReduceMin", "max"),
        "prod": _vec("ReduceProd", "sum", fp32=True), "norm": _vec("LpNorm", "rmsnorm", fp32=True),
        # pooling
        "max_pool2d": _vec("MaxPool", "max", sized_by_input=True),
        "max_pool2d_with_indices": _vec("MaxPoolWithArgmax", "max", sized_by_input=True),
        "avg_pool2d": _vec("AvgPool", "sum", sized_by_input=True),
        "adaptive_max_pool2d": _vec("AdaptiveMaxPool2d", "max"),
        # training: dropout (its mask is applied and kept), the loss's gradient
        "native_dropout": _vec("DropOutDoMask", "mul", "mul"),
        "nll_loss_forward": NpuOp("NLLLoss", "vector", ("copy",)),
        "nll_loss_backward": NpuOp("NLLLossGrad", "vector", ("copy",)),
    })
    # backward ops: gradients of the element-wise ops, softmax, pooling and the rest
    out.update({
        "threshold_backward": _vec("ReluGrad", "relu"),
        # the gradients of the clipped and piecewise activations: a compare and a select per element
        # (CANN's HardtanhGrad (ReLU6's gradient), HardSwishGrad, HardSigmoidGrad, LeakyReluGrad,
        # EluGradV2, SoftplusGrad)
        "hardtanh_backward": _vec("HardtanhGrad", "sub", "relu"),
        "hardswish_backward": _vec("HardSwishGrad", "sub", "mul", "add", "relu"),
        "hardsigmoid_backward": _vec("HardSigmoidGrad", "sub", "mul", "relu"),
        "leaky_relu_backward": _vec("LeakyReluGrad", "sub", "mul"),
        "elu_backward": _vec("EluGradV2", "exp", "mul", "add"),
        "softplus_backward": _vec("SoftplusGrad", "exp", "add", "div", "mul"),
        "avg_pool2d_backward": _vec("AvgPoolGrad", "mul", rows="output"),
        "upsample_nearest2d_backward": _vec("ResizeNearestNeighborV2Grad", "add"),
        "upsample_bilinear2d_backward": _vec("ResizeBilinearV2Grad", "mul", "add"),
        "gelu_backward": _vec("GeluGrad", "gelu", "mul"),
        "tanh_backward": _vec("TanhGrad", "mul", "sub", "mul"),
        "sigmoid_backward": _vec("SigmoidGrad", "sub", "mul", "mul"),
        "silu_backward": _vec("SwishGrad", "exp", "add", "div", "mul", "mul"),
        "native_dropout_backward": _vec("DropOutDoMaskGrad", "mul"),
        "_softmax_backward_data": _vec("SoftmaxGrad", "mul", "sum", "sub", "mul", fp32=True),
        "_log_softmax_backward_data": _vec("LogSoftmaxGrad", "exp", "sum", "mul", "sub", fp32=True),
        "max_pool2d_with_indices_backward": _vec("MaxPoolGradWithArgmax", "max", rows="output"),
        "_adaptive_avg_pool2d_backward": _vec("AdaptiveAvgPool2dGrad", "mul"),
        "select_backward": _vec("SelectGrad", "copy"), "slice_backward": _vec("SliceGrad", "copy"),
        # a slice or select written into a copy of a larger tensor (their functional backward)
        "slice_scatter": _vec("SliceScatter", "copy"), "select_scatter": _vec("SelectScatter", "copy"),
        "embedding_dense_backward": NpuOp("UnsortedSegmentSum", "vector", ("add",), lower=T.scatter_add_rows),
        "scatter_add": NpuOp("UnsortedSegmentSum", "vector", ("add",), lower=T.scatter_add_rows),
        "_native_batch_norm_legit_functional": NpuOp("BNTraining", "vector", lower=T.batch_norm_training, fp32=True),
        "_native_batch_norm_legit": NpuOp("BNTraining", "vector", lower=T.batch_norm_training, fp32=True),
        "native_batch_norm_backward": NpuOp("BNTrainingGrad", "vector", lower=T.batch_norm_backward, fp32=True),
        "native_layer_norm_backward": NpuOp("LayerNormGrad", "vector", lower=T.layer_norm_backward, fp32=True),
        "_scaled_dot_product_flash_attention_for_cpu_backward": NpuOp("FlashAttentionScoreGrad", "composite",
                                                                      lower=T.flash_attention_backward),
    })
    move = {
        "cat": "ConcatD", "stack": "Pack", "contiguous": "TransData", "permute_copy": "TransposeD",
        "copy": "TensorMove", "pad": "PadV3", "constant_pad_nd": "PadV3",
        "repeat": "Tile", "expand_copy": "BroadcastTo", "new_zeros": "Fill", "zeros": "Fill", "ones": "Fill",
        "full": "Fill", "arange": "Range", "zeros_like": "Fill", "ones_like": "Fill", "full_like": "Fill",
        "split_with_sizes_copy": "SplitD", "transdata": "TransData", "index": "GatherV2",
        "triu": "Triu", "tril": "Tril", "new_ones": "Fill", "scalar_tensor": "Fill", "roll": "Roll",
        "flip": "ReverseV2", "upsample_nearest2d": "ResizeNearestNeighborV2",
        "upsample_bilinear2d": "ResizeBilinearV2", "scatter": "ScatterElements", "index_put": "ScatterNd",
        "index_put_": "ScatterNd",
    }
    out.update({k: NpuOp(v, "move") for k, v in move.items()})
    # views, and values no kernel writes: metadata only
    free = ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
            "permute", "transpose", "t", "select", "slice", "narrow", "split", "split_with_sizes", "chunk",
            "unbind", "alias", "detach", "detach_", "lift_fresh_copy", "getitem", "view_as", "expand_as", "identity",
            "sym_size", "_assert_tensor_metadata", "unsafe_split", "as_strided",
            # an allocation writes nothing
            "empty", "empty_like", "new_empty",
            # a functional graph's write-back of a mutated input (a BatchNorm's running statistics):
            # the kernel that computed the value wrote it
            "copy_")
    out.update({k: NpuOp("View", "free") for k in free})
    # inference-mode dropout is the identity
    out.update({k: NpuOp("Identity", "free") for k in ("dropout", "dropout_", "alpha_dropout", "feature_dropout")})
    composite = {
        "scaled_dot_product_attention": "FlashAttentionScore",
        "_scaled_dot_product_flash_attention_for_cpu": "FlashAttentionScore",
        "_scaled_dot_product_efficient_attention": "FlashAttentionScore",
        "multi_head_attention_forward": "MultiHeadAttention",
    }
    out.update({k: NpuOp(v, "composite") for k, v in composite.items()})
    # element-wise ops an optimizer or an eager script calls (CANN's Addcmul, Addcdiv, Lerp, ...)
    out.update({
        "addcmul": _vec("Addcmul", "mul", "add"), "addcmul_": _vec("Addcmul", "mul", "add"),
        "addcdiv": _vec("Addcdiv", "div", "add"), "addcdiv_": _vec("Addcdiv", "div", "add"),
        "lerp": _vec("Lerp", "sub", "mul", "add"), "lerp_": _vec("Lerp", "sub", "mul", "add"),
        "sqrt_": _vec("Sqrt", "sqrt"), "exp_": _vec("Exp", "exp"), "neg_": _vec("Neg", "mul"),
        "zero_": NpuOp("ZerosLike", "move"), "normal_": NpuOp("StatelessRandomNormal", "move"),
        "uniform_": NpuOp("StatelessRandomUniform", "move"), "randn": NpuOp("StatelessRandomNormal", "move"),
        "rand": NpuOp("StatelessRandomUniform", "move"), "randint": NpuOp("StatelessRandomUniform", "move"),
        "bernoulli_": NpuOp("StatelessBernoulli", "move"), "topk": _vec("TopKV2", "max", sized_by_input=True),
        "sort": _vec("Sort", "max", sized_by_input=True),
        # a histogram of values into bins (a MoE layer's tokens per expert: CANN's MoeComputeExpertTokens)
        "histc": _vec("Histogram", "add", sized_by_input=True), "linalg_vector_norm": _vec("LpNormV2", "rmsnorm", fp32=True),
        "rms_norm": _vec("RmsNorm", "rmsnorm", fp32=True), "_fused_rms_norm": _vec("RmsNorm", "rmsnorm", fp32=True),
    })
    # torch_npu's fused operators (torch.ops.npu.<name>: "npu.<name>.default"), each the CANN kernel it
    # launches (`npu_ops`)
    fused = {
        "npu_rms_norm": ("RmsNorm", "vector", N.rms_norm), "npu_add_rms_norm": ("AddRmsNorm", "vector", N.add_rms_norm),
        "npu_rotary_mul": ("RotaryMul", "vector", N.rotary_mul), "npu_swiglu": ("SwiGlu", "vector", N.swiglu),
        "npu_fusion_attention": ("FlashAttentionScore", "composite", N.fusion_attention),
        "npu_fusion_attention_grad": ("FlashAttentionScoreGrad", "composite", N.fusion_attention_backward),
        "npu_fused_infer_attention_score": ("FusedInferAttentionScore", "composite", N.fused_infer_attention),
        "npu_moe_gating_top_k": ("MoeGatingTopK", "vector", N.moe_gating_top_k),
        "npu_moe_gating_top_k_softmax": ("MoeGatingTopKSoftmax", "vector", N.moe_gating_top_k_softmax),
        "npu_grouped_matmul": ("GroupedMatmul", "cube", N.grouped_matmul),
        "npu_mla_prolog": ("MlaProlog", "composite", N.mla_prolog),
        "npu_quant_matmul": ("QuantBatchMatmulV3", "cube", N.quant_matmul),
        "npu_weight_quant_batchmatmul": ("WeightQuantBatchMatmulV2", "cube", N.weight_quant_batchmatmul),
        "npu_dynamic_quant": ("DynamicQuant", "vector", N.dynamic_quant),
        "npu_quantize": ("Quantize", "vector", N.quantize),
        "npu_format_cast": ("TransData", "move", N.format_cast),
        "npu_rms_norm_backward": ("RmsNormGrad", "vector", N.rms_norm_backward),
        "npu_swiglu_backward": ("SwiGluGrad", "vector", N.swiglu_backward),
        "npu_rotary_mul_backward": ("RotaryMulGrad", "vector", N.rotary_mul_backward),
    }
    out.update({k: NpuOp(name, unit, lower=rule) for k, (name, unit, rule) in fused.items()})
    return out


TABLE: dict[str, NpuOp] = _entries()

# user operators registered with `pypto_lab.custom_op`, by name (their entries carry their rule)
CUSTOM: dict[str, NpuOp] = {}

BOOKKEEPING = NpuOp("Bookkeeping", "free")   # a known op on at most one element: no kernel of its own


def lookup(target: str) -> NpuOp | None:
    """The table's entry of an ATen target (or a registered user op), or None when the op is not
    in the table (it falls back to the host: see the module docstring)."""
    if target.startswith(CUSTOM_NAMESPACE + "."):
        return CUSTOM.get(target.split(".")[1])
    return TABLE.get(overload_name(target)) or TABLE.get(aten_name(target))


def entry_of(graph: Graph, node: Node) -> tuple[NpuOp, bool]:
    """The entry ``node`` lowers with, and whether the table knows its op (False: the host fallback,
    `CPU`). A known op whose outputs hold at most one element each is bookkeeping (`BOOKKEEPING`)."""
    entry = lookup(node.target)
    if entry is None:
        return CPU, False
    if entry.unit != "free" and node.outputs and all(o.numel <= 1 for o in node.outputs):
        return BOOKKEEPING, True
    return entry, True


def lower_fx_node(fx_node, chip: Chip, precision: Precision) -> tuple[list[KernelSpec], bool]:
    """The kernel specs a node of a torch.fx graph (AOT autograd's joint graph) runs as, through the
    table as `map_ops` lowers a captured node; and whether the table knows the op (False: the host
    fallback)."""
    graph, node = op_graph(fx_node)
    node.npu, known = entry_of(graph, node)
    return lower_all(graph, node, chip, precision), known


__all__ = ["BOOKKEEPING", "CPU", "CUSTOM", "TABLE", "entry_of", "lookup", "lower_fx_node"]
