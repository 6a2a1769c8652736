"""CANN PyPTO's programming model in SIM mode on pypto_lab's chip model: ``import pypto_lab.pto as pypto``.

Kernels are Python functions over ``pypto.Tensor`` values, decorated with ``@pypto.jit`` or
``@pypto.frontend.jit``. The first call traces the function into a Tensor Graph (`graph`), cuts it
into tiles by the tile shapes in force (`tiling`: the Tile Graph), deals the tiles to the cores
(`blocks`: the Block Graph), schedules them onto the pipes with flags and ping-pong buffers
(`schedule`: the Execute Graph), caches the result per input signature and runs it on the event
simulator; the outputs are computed with the NPU's numerics (`execute`). ``kernel.last_run`` (a
`result.RunResult`) holds cycles, pipe busy time, buffer peaks, the fraction of peak and the
Chrome trace; ``kernel.dump_stages(dir)`` writes the four stages as JSON. Mistakes raise the
teaching errors of `errors`.
"""

from . import frontend
from .config import (
                     get_cube_tile_shapes,
                     get_matrix_size,
                     get_pass_options,
                     get_vec_tile_shapes,
                     options,
                     reset_options,
                     set_cube_tile_shapes,
                     set_matrix_size,
                     set_pass_options,
                     set_vec_tile_shapes,
)
from .control import cond, is_loop_begin, is_loop_end, loop, loop_unroll
from .dtypes import (
                     DT_BF16,
                     DT_BOOL,
                     DT_FP16,
                     DT_FP32,
                     DT_INT8,
                     DT_INT16,
                     DT_INT32,
                     DT_INT64,
                     DT_UINT8,
                     DYN,
                     DYNAMIC,
                     DataType,
                     RunMode,
                     bytes_of,
)
from .errors import (
                     BroadcastError,
                     DTypeError,
                     IndexBoundsError,
                     LoopError,
                     NoNPUError,
                     NoTileShapeError,
                     OptionError,
                     PtoError,
                     ScalarReadError,
                     ShapeError,
                     TileAlignmentError,
                     TileCapacityError,
                     TileRankError,
                     TileShapeError,
                     TraceError,
                     UnwrittenOutputError,
                     UnwrittenOutputWarning,
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
from .result import RunResult
from .tensor import Tensor

__all__ = [
    "frontend", "jit", "JitKernel", "CompiledKernel", "RunResult", "RunMode", "Tensor", "DataType", "DYNAMIC", "DYN",
    "DT_FP16", "DT_BF16", "DT_FP32", "DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_BOOL", "bytes_of",
    "set_vec_tile_shapes", "get_vec_tile_shapes", "set_cube_tile_shapes", "get_cube_tile_shapes",
    "set_matrix_size", "get_matrix_size", "options", "set_pass_options", "get_pass_options", "reset_options",
    "loop", "loop_unroll", "cond", "is_loop_begin", "is_loop_end",
    "add", "sub", "mul", "div", "exp", "sqrt", "rsqrt", "reciprocal", "neg", "abs", "relu", "maximum", "minimum",
    "amax", "amin", "sum", "matmul", "transpose", "reshape", "cast", "view", "assemble", "tensor",
    "sigmoid", "softmax", "log", "expm1", "erf", "erfc", "pow", "clip", "ceil", "floor", "trunc", "round",
    "full", "zeros", "ones", "arange", "where", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_not",
    "min", "max", "concat", "expand_clone",
    "PtoError", "NoNPUError", "TileRankError", "TileAlignmentError", "TileCapacityError", "TileShapeError",
    "NoTileShapeError", "UnwrittenOutputError", "BroadcastError", "ShapeError", "DTypeError", "OptionError",
    "LoopError", "ScalarReadError", "UnwrittenOutputWarning", "IndexBoundsError",
    "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "exp2", "log2", "log10", "log1p", "cbrt", "sign", "isnan", "isfinite", "signbit", "lrelu", "hypot", "atan2", "fmod", "remainder", "floor_div", "ceil_div", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "gcd", "clone", "axpy_",
    "gathermask", "interleave", "deinterleave", "pack", "unpack", "atomic_add", "expand_exp_dif",
    "conv", "unsqueeze", "permute", "tril", "triu", "prelu", "pad", "one_hot", "prod", "index_add_ub", "index_add__ub",
    "index_put_", "uniform", "normal", "quantize", "dequantize", "rms_norm", "var",
    "TopKAlgo", "topk", "argsort", "argmax", "argmin", "cumsum", "cumprod",
    "gather", "index_select", "scatter_update", "scatter", "scatter_", "index_add", "index_add_",
    "TraceError",
]
