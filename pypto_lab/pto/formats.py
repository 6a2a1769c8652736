"""Storage formats of a kernel's tensor arguments: ND (row-major) or FRACTAL_NZ (the Cube's fractal
layout), read from the argument as the real frontend reads it, and checked against the annotation.

The real ``pypto.from_torch`` / ``frontend.jit`` (python/pypto/converter.py and
frontend/parser/entry.py at 883e7df) take an argument's format from torch_npu: a tensor on the
NPU whose ``torch_npu.get_npu_format`` is 29 is NZ, every other tensor ND; an annotation that
names a format (``pypto.Tensor([...], dtype, format=pypto.TileOpFormat.TILEOP_NZ)``) must match
it, else the launch fails. pypto_lab does the same with whatever ``torch_npu`` module is loaded (the
CPU stand-in of ``scripts/npu_on_cpu.py`` has NZ tensors whose values stay logical, in row-major
order on the CPU). The format changes what the kernel's loads cost, not its values: an NZ operand
of a matmul reaches L1 in the Cube's layout by a plain copy (`tiling` records it per operand).
"""

from __future__ import annotations

import sys

from .dtypes import TileOpFormat
from .errors import FormatError

ND, NZ = "ND", "NZ"
_TORCH_NPU_NZ = 29


def storage_format(tensor) -> str:
    """"NZ" for a tensor on the NPU whose torch_npu format is FRACTAL_NZ (29), else "ND"."""
    dev = getattr(tensor, "device", None)
    if getattr(dev, "type", None) != "npu":
        return ND
    torch_npu = sys.modules.get("torch_npu")
    get = getattr(torch_npu, "get_npu_format", None) if torch_npu is not None else None
    try:
        return NZ if get is not None and int(get(tensor)) == _TORCH_NPU_NZ else ND
    except (AttributeError, TypeError, ValueError):
        return ND


def annotated_format(ann) -> str | None:
    fmt = getattr(ann, "format", None)
    if fmt is None:
        return None
    return NZ if fmt == TileOpFormat.TILEOP_NZ else ND


def check_argument(name: str, tensor, ann, fmt: str) -> None:
    """An argument on the NPU whose format differs from its annotation's is refused (uint8 is not
    checked, as in the real frontend: torch_npu cannot cast it to NZ)."""
    want = annotated_format(ann)
    if want is None or want == fmt or str(tensor.dtype) == "torch.uint8":
        return
    if getattr(getattr(tensor, "device", None), "type", None) != "npu":
        return   # as the real frontend: only tensors on the NPU carry a storage format to check
    fix = ("torch_npu.npu_format_cast(t, torch_npu.Format.FRACTAL_NZ) before the call" if want == NZ
           else "torch_npu.npu_format_cast(t, 2) (ND) before the call, or annotate format=TILEOP_NZ")
    raise FormatError(f"argument {name!r} is stored {fmt} but its annotation says TILEOP_{want}. Rule: a tensor "
                      f"argument's storage format matches the format its pypto.Tensor annotation names (the real "
                      f"frontend refuses the launch). Fix: {fix}")


def check_nz_shape(name: str, shape, elem_bytes: int) -> None:
    """An NZ tensor's last axis must fill whole 32-byte blocks and its second-to-last whole 16-row
    fractals: the real converter pads such a shape (so the kernel would see other sizes), which
    pypto_lab does not model."""
    if len(shape) < 2:
        return
    c0 = max(1, 32 // max(1, elem_bytes))
    if shape[-1] % c0 or shape[-2] % 16:
        raise FormatError(f"argument {name!r} is FRACTAL_NZ with shape {list(shape)}: its last axis is not a "
                          f"multiple of {c0} elements (32 bytes) or its second-to-last not a multiple of 16. Rule: "
                          "the real converter pads an NZ tensor's shape to whole fractals, so the kernel would see "
                          "a padded shape, which pypto_lab does not model. Fix: pad the tensor to whole fractals "
                          "before the cast")


__all__ = ["ND", "NZ", "storage_format", "annotated_format", "check_argument", "check_nz_shape"]
