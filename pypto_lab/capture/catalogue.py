"""The operator catalogue: which NPU operator, on which unit, runs each ATen operator.

Units: "cube" (matrix work on the Cube), "vector" (element-wise, reductions, norms on the Vector
unit), "move" (data movement such as TransData, concat, slicing copies), "free" (views: no
kernel, only metadata), "composite" (decomposed by a pass into the others, e.g. attention) and
"cpu" (not in the catalogue: runs on the host, paying the host<->device copies). The NPU
operator names follow CANN's operator types (Conv2D, MatMulV2, BatchMatMul, Add, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NpuOp:
    """One catalogue entry. ``vector_op`` names the vector kernel (`pypto_lab.hw.kernels.VECTOR_OPS`)
    that a vector operator runs; ``custom`` (user operators only) lowers the node to its kernel spec,
    ``custom(graph, node, chip, precision)``."""

    name: str
    unit: str
    vector_op: str = ""
    custom: Callable | None = None


CPU = NpuOp("", "cpu")  # what an operator the catalogue does not know runs as: the host


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
        "square": ("Square", "mul"), "clamp_min": ("Maximum", "relu"), "clamp_max": ("Minimum", "relu"), "_to_copy": ("Cast", "cast"), "to": ("Cast", "cast"),
        "type_as": ("Cast", "cast"), "bitwise_not": ("LogicalNot", "relu"), "bitwise_and": ("LogicalAnd", "mul"),
        # Python's & | on bool tensors (transformers' attention-mask builders), floor division, diff
        "__and__": ("LogicalAnd", "mul"), "__or__": ("LogicalOr", "add"), "bitwise_or": ("LogicalOr", "add"),
        "floor_divide": ("FloorDiv", "div"), "diff": ("Sub", "sub"),
        # activations
        "relu": ("Relu", "relu"), "relu_": ("Relu", "relu"), "gelu": ("Gelu", "gelu"), "tanh": ("Tanh", "gelu"),
        "sigmoid": ("Sigmoid", "exp"), "silu": ("Swish", "gelu"), "silu_": ("Swish", "gelu"),
        "hardtanh": ("ClipByValue", "relu"), "hardtanh_": ("ClipByValue", "relu"), "erf": ("Erf", "gelu"),
        "hardswish": ("HardSwish", "gelu"), "hardswish_": ("HardSwish", "gelu"),
        "hardsigmoid": ("HardSigmoid", "relu"), "leaky_relu": ("LeakyRelu", "relu"),
        "elu": ("Elu", "exp"), "softplus": ("Softplus", "exp"), "mish": ("Mish", "gelu"), "prelu": ("PRelu", "relu"),
        "relu6": ("Relu6", "relu"), "glu": ("GLU", "gelu"),
        # normalisation and softmax
        "batch_norm": ("BatchNorm", "batchnorm"), "_native_batch_norm_legit_no_training": ("BatchNorm", "batchnorm"),
        "layer_norm": ("LayerNorm", "layernorm"), "native_layer_norm": ("LayerNorm", "layernorm"),
        "group_norm": ("GroupNorm", "layernorm"), "softmax": ("SoftmaxV2", "softmax"),
        "_softmax": ("SoftmaxV2", "softmax"), "log_softmax": ("LogSoftmaxV2", "softmax"),
        # reductions and pooling
        "sum": ("ReduceSum", "sum"), "mean": ("ReduceMean", "sum"), "amax": ("ReduceMax", "max"),
        "max": ("ReduceMax", "max"), "var": ("ReduceStd", "layernorm"), "max_pool2d": ("MaxPool", "max"),
        "avg_pool2d": ("AvgPool", "sum"), "adaptive_avg_pool2d": ("AdaptiveAvgPool2d", "sum"),
        "cumsum": ("Cumsum", "sum"), "argmax": ("ArgMaxV2", "max"), "amin": ("ReduceMin", "max"),
        "min": ("ReduceMin", "max"), "prod": ("ReduceProd", "sum"), "norm": ("LpNorm", "rmsnorm"),
        "adaptive_max_pool2d": ("AdaptiveMaxPool2d", "max"),
        # embedding lookups gather rows: a vector-core data movement
        "embedding": ("GatherV2", "cast"), "index_select": ("GatherV2", "cast"), "gather": ("GatherElements", "cast"),
        "dropout": ("Identity", ""), "dropout_": ("Identity", ""), "alpha_dropout": ("Identity", ""),
        "feature_dropout": ("Identity", ""), "clone": ("Identity", ""),
    }
    move = {
        "cat": "ConcatD", "stack": "Pack", "contiguous": "TransData", "permute_copy": "TransposeD",
        "copy_": "TensorMove", "copy": "TensorMove", "pad": "PadV3", "constant_pad_nd": "PadV3",
        "repeat": "Tile", "expand_copy": "BroadcastTo", "new_zeros": "Fill", "zeros": "Fill", "ones": "Fill",
        "full": "Fill", "arange": "Range", "zeros_like": "Fill", "ones_like": "Fill", "full_like": "Fill",
        "split_with_sizes_copy": "SplitD", "transdata": "TransData", "index": "GatherV2",
        "triu": "Triu", "tril": "Tril", "empty": "Fill", "new_ones": "Fill", "new_empty": "Fill",
        "scalar_tensor": "Fill", "roll": "Roll", "flip": "ReverseV2", "upsample_nearest2d": "ResizeNearestNeighborV2",
        "upsample_bilinear2d": "ResizeBilinearV2", "scatter": "ScatterElements", "index_put": "ScatterNd",
        "index_put_": "ScatterNd", "empty_like": "Fill",
    }
    free = ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
            "permute", "transpose", "t", "select", "slice", "narrow", "split", "split_with_sizes", "chunk",
            "unbind", "alias", "detach", "detach_", "lift_fresh_copy", "getitem", "view_as", "expand_as", "identity",
            "sym_size", "_assert_tensor_metadata", "unsafe_split")
    composite = {
        "scaled_dot_product_attention": "FlashAttentionScore",
        "_scaled_dot_product_flash_attention_for_cpu": "FlashAttentionScore",
        "_scaled_dot_product_efficient_attention": "FlashAttentionScore",
        "multi_head_attention_forward": "MultiHeadAttention",
    }
    out = {k: NpuOp(v, "cube") for k, v in cube.items()}
    out.update({k: NpuOp(name, "vector" if vop else "free", vop) for k, (name, vop) in vector.items()})
    out.update({k: NpuOp(v, "move") for k, v in move.items()})
    out.update({k: NpuOp("View", "free") for k in free})
    out.update({k: NpuOp(v, "composite") for k, v in composite.items()})
    return out


CATALOGUE: dict[str, NpuOp] = _entries()


def aten_name(target: str) -> str:
    """"aten.conv2d.default" -> "conv2d"; "pypto_lab.linear_int8.default" -> "linear_int8";
    "transformers.grouped_mm_fallback.default" -> "grouped_mm_fallback";
    "<built-in function getitem>" -> "getitem"."""
    if target.startswith(("aten.", "pypto_lab.", "transformers.")):
        return target.split(".")[1]
    if "getitem" in target:
        return "getitem"
    return target.rsplit(".", 1)[-1].strip("<>").split()[-1]


# user operators registered with `pypto_lab.custom_op` (captured as "pypto_lab_user.<name>.default")
CUSTOM_NAMESPACE = "pypto_lab_user"
CUSTOM: dict[str, NpuOp] = {}


def lookup(target: str) -> NpuOp | None:
    """The catalogue entry of an ATen target (or a registered custom op), or None when the op
    falls back to the CPU."""
    if target.startswith(CUSTOM_NAMESPACE + "."):
        return CUSTOM.get(target.split(".")[1])
    return CATALOGUE.get(aten_name(target))
