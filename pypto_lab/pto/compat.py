"""Helpers of the real API's top level that are not ops: ``pypto.ceildiv`` (python/pypto/_utils.py)
and ``pypto.from_torch`` (python/pypto/converter.py, docs/zh/api/others/pypto-from_torch.md).

``from_torch`` gives the ``pypto.Tensor`` description of a torch tensor (shape, dtype, name,
format read from torch_npu as the real converter does, dimensions in ``dynamic_axis`` marked
DYNAMIC); pypto_lab's kernels take torch tensors directly, so it is a description, used as an
annotation, not a handle on the data.
"""

from __future__ import annotations

from .dtypes import DYNAMIC, TileOpFormat, as_dtype
from .dtypes import from_torch as _dtype_from_torch
from .errors import ShapeError, TraceError
from .formats import NZ, storage_format


def ceildiv(a, b):
    """``(a + b - 1) // b`` of ints or SymbolicScalars."""
    return (a + b - 1) // b


def from_torch(tensor, name: str = "", *, dynamic_axis=None, tensor_format=None, dtype=None):
    import torch

    from .tensor import Tensor

    if not isinstance(tensor, torch.Tensor):
        raise TraceError(f"pypto.from_torch({type(tensor).__name__}): the input is not a torch.Tensor. Rule: "
                         "from_torch converts a torch.Tensor (or a subclass). Fix: pass a torch tensor")
    if not tensor.is_contiguous():
        raise ShapeError("pypto.from_torch: the tensor is not contiguous. Rule: the real converter needs "
                         "tensor.is_contiguous(). Fix: tensor.contiguous()")
    dt = as_dtype(dtype, "from_torch dtype") if dtype is not None else _dtype_from_torch(tensor.dtype, "from_torch")
    if tensor_format is None:
        tensor_format = TileOpFormat.TILEOP_NZ if storage_format(tensor) == NZ else TileOpFormat.TILEOP_ND
    shape = list(tensor.shape) if tensor.dim() else [1]
    for axis in dynamic_axis or []:
        shape[axis] = DYNAMIC
    return Tensor(shape, dt, name, tensor_format)


__all__ = ["ceildiv", "from_torch"]
