"""Stage 2 of the data path: graph passes (op mapping, decomposition, fusion, layout, precision,
tiling). Each pass is a frozen dataclass in a module of its own that writes its decisions into
the nodes' typed annotations and kernel specs; `base` holds the pass base, the registry, the
manager and its instruments, `verify` the graph verifier.
"""

from . import (  # noqa: F401 (register the passes)
    decompose,
    fold_batchnorm,
    fuse_composites,
    fuse_conv_bn_relu,
    fuse_elementwise,
    fuse_kv_write,
    fuse_rmsnorm,
    fuse_rope,
    fuse_swiglu,
    l2_residency,
    layout,
    merge_matmuls,
    mixed_precision,
    naive_tiling,
    op_mapping,
    quantize_int8,
    tune_tiling,
)
from .base import (
    REGISTRY,
    Instrument,
    Note,
    Pass,
    PassContext,
    PassManager,
    PassOrderError,
    PassResult,
    RecordSnapshots,
    Verify,
    get_pass,
    register,
)
from .verify import GraphError, verify

__all__ = [
    "REGISTRY", "GraphError", "Instrument", "Note", "Pass", "PassContext", "PassManager", "PassOrderError",
    "PassResult", "RecordSnapshots", "Verify", "get_pass", "register", "verify",
]
