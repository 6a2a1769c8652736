"""Graph passes (op mapping, fusion, layout, precision, tiling, scheduling, memory planning).

`base` holds the pass base, the registry, the manager and its instruments; each pass is a module
of its own and registers itself by name on import.
"""

from . import (  # noqa: F401 (register passes)
    decompose,
    fold_batchnorm,
    fuse_composites,
    fuse_conv_bn_relu,
    fuse_elementwise,
    layout,
    mixed_precision,
    naive_tiling,
    op_mapping,
    quantize_int8,
    tune_tiling,
)
from ..analysis import memory_plan, schedule  # noqa: F401 (register passes)
from .base import (
    REGISTRY,
    Instrument,
    Pass,
    PassContext,
    PassManager,
    PassOrderError,
    PassResult,
    RecordSnapshots,
    get_pass,
    register,
)

__all__ = [
    "REGISTRY", "Instrument", "Pass", "PassContext", "PassManager", "PassOrderError", "PassResult",
    "RecordSnapshots", "get_pass", "op_mapping", "register",
]
