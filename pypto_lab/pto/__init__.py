"""CANN PyPTO's programming model in SIM mode on pypto_lab's chip model: ``import pypto_lab.pto as pypto``.

Kernels are Python functions over ``pypto.Tensor`` values, decorated with ``@pypto.jit`` or
``@pypto.frontend.jit``. The first call traces the function into a Tensor Graph (`graph`), cuts it
into tiles by the tile shapes in force (`tiling`: the Tile Graph), deals the tiles to the cores
(`blocks`: the Block Graph), schedules them onto the pipes with flags and ping-pong buffers
(`schedule`: the Execute Graph), caches the result per input signature and runs it on the event
simulator; the outputs are computed with the NPU's numerics (`execute`). ``kernel.last_run`` (a
`result.RunResult`) holds cycles, pipe busy time, buffer peaks, the fraction of peak and the
Chrome trace; long loops stay loops (`loops`, with `SymbolicScalar` indices and tensor reads such
as ``block_table[b, i]`` evaluated at run time); ``kernel.dump_stages(dir)`` writes the four stages as JSON. Mistakes raise the
teaching errors of `errors`.

The API follows the real framework at commit 883e7df (2026-08-22): every option of its
configuration (`option_table`: checked by type, each modelled or recorded), the 24 dtypes of its
DataType enum (`dtypes`), the v0.2 annotations (``pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32)``,
``Tensor([])``, ``Tensor()``, ``pypto.STATIC``), ``set_semantic_label``, ``PrecisionType``
(`precision`) and the ``experimental`` namespace (`experimental`).
"""

from . import experimental, frontend, operation, pypto_impl, runtime
from .compat import ceildiv, from_torch
from .config import (
    get_codegen_options,
    get_cube_tile_shapes,
    get_debug_options,
    get_host_options,
    get_matrix_size,
    get_operation_options,
    get_options,
    get_pass_options,
    get_runtime_options,
    get_semantic_label,
    get_vec_tile_shapes,
    get_verify_options,
    options,
    reset_options,
    set_codegen_options,
    set_cube_tile_shapes,
    set_debug_options,
    set_host_options,
    set_matrix_size,
    set_operation_options,
    set_options,
    set_pass_options,
    set_runtime_options,
    set_semantic_label,
    set_vec_tile_shapes,
    set_verify_options,
)
from .control import cond, is_loop_begin, is_loop_end, loop, loop_unroll
from .dtypes import (
    DT_BF16,
    DT_BOOL,
    DT_DOUBLE,
    DT_FP4_E1M2,
    DT_FP4_E1M2X2,
    DT_FP4_E2M1,
    DT_FP4_E2M1X2,
    DT_FP8,
    DT_FP8E4M3,
    DT_FP8E5M2,
    DT_FP8E8M0,
    DT_FP16,
    DT_FP32,
    DT_HF4,
    DT_HF8,
    DT_INT4,
    DT_INT8,
    DT_INT16,
    DT_INT32,
    DT_INT64,
    DT_UINT8,
    DT_UINT16,
    DT_UINT32,
    DT_UINT64,
    DYN,
    DYNAMIC,
    STATIC,
    DataType,
    RunMode,
    StatusType,
    TileOpFormat,
    bytes_of,
)
from .element import Element
from .enums import (
                     ROUND_DOWN,
                     ROUND_UP,
                     AtomicRMWMode,
                     CachePolicy,
                     CastMode,
                     DequantScaleRoundingMode,
                     LogBaseType,
                     OpType,
                     OutType,
                     ReduceMode,
                     ReLuType,
                     SaturationMode,
                     ScatterMode,
                     TransMode,
)
from .errors import (
                     BroadcastError,
                     DTypeError,
                     FormatError,
                     IndexBoundsError,
                     LoopError,
                     NoNPUError,
                     NoTileShapeError,
                     NotModelledError,
                     OptionError,
                     PtoError,
                     ScalarReadError,
                     SemanticLabelError,
                     ShapeError,
                     SymbolicIndexError,
                     TileAlignmentError,
                     TileCapacityError,
                     TileRankError,
                     TileShapeError,
                     TraceError,
                     UnwrittenOutputError,
                     UnwrittenOutputWarning,
)
from .extras import (
                     PassConfigKey,
                     TileL0Info,
                     TileL1Info,
                     function,
                     get_conv_tile_shapes,
                     get_pass_config,
                     get_pass_configs,
                     get_pass_default_config,
                     pass_verify_print,
                     pass_verify_save,
                     set_conv_tile_shapes,
                     set_pass_config,
                     set_pass_default_config,
                     set_verify_golden_data,
)
from .jit import CompiledKernel, JitKernel, jit
from .ops import (
    abs,
    add,
    amax,
    amin,
    arange,
    assemble,
    cast,
    ceil,
    clip,
    concat,
    div,
    eq,
    erf,
    erfc,
    exp,
    expand_clone,
    expm1,
    floor,
    full,
    ge,
    gt,
    le,
    log,
    logical_and,
    logical_not,
    lt,
    matmul,
    max,
    maximum,
    min,
    minimum,
    mul,
    ne,
    neg,
    ones,
    pow,
    reciprocal,
    relu,
    reshape,
    round,
    rsqrt,
    sigmoid,
    softmax,
    sqrt,
    sub,
    sum,
    tensor,
    transpose,
    trunc,
    view,
    where,
    zeros,
)
from .ops_conv import conv
from .ops_index import (
    gather,
    index_add,
    index_add_,
    index_add__ub,
    index_add_ub,
    index_put_,
    index_select,
    scatter,
    scatter_,
    scatter_update,
)
from .ops_layout import atomic_add, deinterleave, expand_exp_dif, gathermask, interleave, pack, unpack
from .ops_math import (
                     acos,
                     acosh,
                     asin,
                     asinh,
                     atan,
                     atan2,
                     atanh,
                     axpy_,
                     bitwise_and,
                     bitwise_left_shift,
                     bitwise_not,
                     bitwise_or,
                     bitwise_right_shift,
                     bitwise_xor,
                     cbrt,
                     ceil_div,
                     clone,
                     cos,
                     cosh,
                     exp2,
                     fillpad,
                     floor_div,
                     fmod,
                     gcd,
                     hypot,
                     isfinite,
                     isnan,
                     log1p,
                     log2,
                     log10,
                     lrelu,
                     remainder,
                     sign,
                     signbit,
                     sin,
                     sinh,
                     tan,
                     tanh,
)
from .ops_nn import rms_norm, var
from .ops_quant import dequantize, quantize
from .ops_random import normal, uniform
from .ops_shape import one_hot, pad, permute, prelu, tril, triu, unsqueeze
from .ops_sort import TopKAlgo, argmax, argmin, argsort, cumprod, cumsum, prod, topk
from .option_table import CompStage
from .platform import platform
from .precision import PrecisionType
from .result import RunResult
from .symbolic import SymbolicScalar, SymbolicValueError, symbolic_scalar
from .tensor import Tensor

__all__ = [
    "frontend", "experimental", "jit", "JitKernel", "CompiledKernel", "RunResult", "RunMode", "Tensor", "DataType",
    "DYNAMIC", "DYN", "STATIC", "StatusType", "TileOpFormat", "PrecisionType", "CompStage",
    "DT_INT4", "DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64", "DT_FP8", "DT_FP16", "DT_FP32", "DT_BF16", "DT_HF4",
    "DT_HF8", "DT_UINT8", "DT_UINT16", "DT_UINT32", "DT_UINT64", "DT_BOOL", "DT_DOUBLE", "DT_FP8E5M2", "DT_FP8E4M3",
    "DT_FP8E8M0", "DT_FP4_E2M1X2", "DT_FP4_E1M2X2", "DT_FP4_E2M1", "DT_FP4_E1M2", "bytes_of",
    "set_vec_tile_shapes", "get_vec_tile_shapes", "set_cube_tile_shapes", "get_cube_tile_shapes",
    "set_matrix_size", "get_matrix_size", "options", "set_options", "get_options", "reset_options",
    "set_pass_options", "get_pass_options", "set_runtime_options", "get_runtime_options", "set_host_options",
    "get_host_options", "set_codegen_options", "get_codegen_options", "set_verify_options", "get_verify_options",
    "set_debug_options", "get_debug_options", "set_operation_options", "get_operation_options",
    "set_semantic_label", "get_semantic_label",
    "loop", "loop_unroll", "cond", "is_loop_begin", "is_loop_end",
    "add", "sub", "mul", "div", "exp", "sqrt", "rsqrt", "reciprocal", "neg", "abs", "relu", "maximum", "minimum",
    "amax", "amin", "sum", "matmul", "transpose", "reshape", "cast", "view", "assemble", "tensor",
    "sigmoid", "softmax", "log", "expm1", "erf", "erfc", "pow", "clip", "ceil", "floor", "trunc", "round",
    "full", "zeros", "ones", "arange", "where", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_not",
    "min", "max", "concat", "expand_clone",
    "PtoError", "NoNPUError", "TileRankError", "TileAlignmentError", "TileCapacityError", "TileShapeError",
    "NoTileShapeError", "UnwrittenOutputError", "BroadcastError", "ShapeError", "DTypeError", "OptionError",
    "LoopError", "ScalarReadError", "UnwrittenOutputWarning", "SemanticLabelError", "NotModelledError",
    "SymbolicIndexError", "SymbolicValueError", "SymbolicScalar", "symbolic_scalar",
    "IndexBoundsError",
    "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "exp2", "log2", "log10", "log1p", "cbrt", "sign", "isnan", "isfinite", "signbit", "lrelu", "hypot", "atan2", "fmod", "remainder", "floor_div", "ceil_div", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "gcd", "clone", "axpy_",
    "gathermask", "interleave", "deinterleave", "pack", "unpack", "atomic_add", "expand_exp_dif",
    "conv", "unsqueeze", "permute", "tril", "triu", "prelu", "pad", "one_hot", "prod", "index_add_ub", "index_add__ub",
    "index_put_", "uniform", "normal", "quantize", "dequantize", "rms_norm", "var",
    "TopKAlgo", "topk", "argsort", "argmax", "argmin", "cumsum", "cumprod",
    "gather", "index_select", "scatter_update", "scatter", "scatter_", "index_add", "index_add_",
    "TraceError", "FormatError",
    "CastMode", "SaturationMode", "ReLuType", "CachePolicy", "ReduceMode", "OpType", "OutType", "TransMode",
    "ScatterMode", "LogBaseType", "AtomicRMWMode", "DequantScaleRoundingMode", "ROUND_UP", "ROUND_DOWN",
    "Element", "element", "ceildiv", "from_torch", "platform", "runtime", "operation", "pypto_impl", "fillpad",
    "TileL1Info", "TileL0Info", "set_conv_tile_shapes", "get_conv_tile_shapes", "PassConfigKey", "set_pass_config",
    "get_pass_config", "get_pass_configs", "set_pass_default_config", "get_pass_default_config", "function",
    "pass_verify_print", "pass_verify_save", "set_verify_golden_data",
]

element = Element

from .tensor import bind_library as _bind_library  # noqa: E402

_bind_library(globals())  # Tensor.add(...), x.topk(...), ...: the methods call the ops of this namespace
