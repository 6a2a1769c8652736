"""`@custom_op`: a user operator with a reference implementation and a cost the simulator can use.

The seed article (section 4.2) registers an NPU operator with::

    from pypto_lab import custom_op

    @custom_op(npu_func=custom_op_impl)
    def my_custom_op(input):
        return input * 2

Here ``npu_func`` is one of:

* a pto kernel (``@pypto.jit`` / ``@pypto.frontend.jit``, `pypto_lab.pto`) taking the op's
  arguments then its outputs (or returning them): the op's NPU implementation. Inside
  `pypto_lab.optimize` the op is that one kernel, costed by simulating it on the report's chip at
  the op's shapes in the run's GM dtype (fp16 at ``precision="fp16"``), and ``optimized(x)``
  computes the op with the kernel's numerics; calling the op outside an optimised model runs the
  reference on the CPU. A kernel that raises (while costed or run) raises `CustomOpError` naming
  the op, with the kernel's error chained. See `pypto_lab.kernels.pto_bridge`.
* a string (the TBE / Ascend C source of the article; kept as documentation in
  ``op.pypto_spec.npu_source``, the simulator cannot run it);
* a callable cost function (see ``cost``). The decorated function is the reference implementation: calling the op
runs it. The op is a ``torch.library`` custom op in the namespace ``pypto_lab_user`` (with a fake
implementation that runs the reference on fake tensors, or returns a tensor shaped like the first
input when that fails), so ``torch.export`` captures one node ``pypto_lab_user.<name>.default``;
the lowering table (`pypto_lab.lowering.table.lookup`) knows it, on the unit it was
registered with, and `pypto_lab.kernels.custom` lowers it to a kernel spec and costs it from what
was declared:

* ``cost=fn`` (or a callable ``npu_func``): ``fn(*args, chip=chip)`` with the op's tensor
  arguments as meta tensors (shapes and dtypes only; ``chip`` only if ``fn`` takes it). It returns
  microseconds (a number), a dict with ``time_us`` or ``cycles`` (and optionally ``gm_bytes``), or
  a `KernelReport` (e.g. from `simulate_vector`).
* ``unit="vector"`` (the default) with ``flops=`` and/or ``bytes=`` (numbers, or functions of the
  meta tensor arguments): a Vector kernel streaming ``bytes`` through UB (half read, half
  written; default: the op's inputs plus its output) and issuing ``ceil(flops / elements)``
  vector instructions per element tile, simulated with `simulate_vector`.
* ``unit="cube"`` with ``flops=``: a Cube kernel whose output is the op's output
  (``M = prod(out.shape[:-1])``, ``N = out.shape[-1]``) and whose ``K = flops / (2 M N)``,
  simulated with `simulate_matmul` (and tiled by `tune_tiling` / `auto_tune` like any matmul).
* ``unit="move"`` with ``bytes=``: a GM -> UB -> GM copy of that many bytes.

A custom op without any of these (the seed's example) is costed from its reference: the
reference is traced on meta tensors (``make_fx``) and, when every ATen op it calls is a Vector
operator of the lowering table (or a view), they are simulated as one fused Vector kernel over the
output (``x * 2``: one VMUL per tile). When the reference calls anything else (a sort, a
matmul, an op the table lacks), `pypto_lab.optimize` raises `CustomOpError` ("custom op 'x'
has no cost: ...") naming what to pass.

This module is the seed article's decorator: it registers the torch op, the declaration
(`pypto_lab.kernels.custom.USER_OPS`) and its entry in the lowering table (`table.CUSTOM`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

from ..capture.catalogue import CUSTOM_NAMESPACE, NpuOp
from ..kernels.custom_error import CustomOpError
from ..kernels.pto_bridge import is_pto_kernel
from .custom import UNITS, USER_OPS, CustomOpSpec, lower_custom, spec_of
from .table import CUSTOM

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SPECS = USER_OPS
_OPS: dict[str, Any] = {}  # name -> torch CustomOpDef (registered once per process)

_TYPES = {torch.Tensor: "Tensor", int: "SymInt", float: "float", bool: "bool", str: "str"}


def _schema(fn: Callable, name: str) -> str:
    """The torch schema of ``fn``: unannotated parameters are Tensors, the result one Tensor
    (or a tuple of Tensors when annotated ``tuple[torch.Tensor, ...]``)."""
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise CustomOpError(f"custom op {name!r}: parameter {p.name!r} is *args/**kwargs; a custom op needs a "
                                "fixed list of parameters (tensors, or int/float/bool/str with annotations)")
        ann = p.annotation
        if ann is inspect.Parameter.empty or ann == "torch.Tensor" or ann == "Tensor":
            ann = torch.Tensor
        kind = _TYPES.get(ann)
        if kind is None:
            raise CustomOpError(f"custom op {name!r}: parameter {p.name!r} is annotated {ann!r}; supported: "
                                "torch.Tensor (or no annotation), int, float, bool, str")
        text = f"{kind} {p.name}"
        if p.default is not inspect.Parameter.empty:
            if kind == "Tensor":
                raise CustomOpError(f"custom op {name!r}: tensor parameter {p.name!r} has a default; give tensors "
                                    "no default")
            text += f"={p.default!r}" if kind != "str" else f"=\"{p.default}\""
        params.append(text)
    ret = sig.return_annotation
    n_out = 1
    if getattr(ret, "__origin__", None) is tuple:
        n_out = len([a for a in ret.__args__ if a is not Ellipsis])
    out = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({', '.join(params)}) -> {out}"


def _no_alias(result: Any, args: tuple) -> Any:
    """torch custom ops may not return (views of) their inputs: copy such results."""
    ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.device.type != "meta"}

    def fix(r):
        if isinstance(r, torch.Tensor) and r.device.type != "meta" and r.untyped_storage().data_ptr() in ptrs:
            return r.clone()
        return r
    if isinstance(result, (tuple, list)):
        return tuple(fix(r) for r in result)
    return fix(result)


def _register_torch_op(name: str, schema: str) -> Any:
    if name in _OPS:
        registered = _SPECS[name].schema
        if registered != schema:
            raise CustomOpError(f"custom op {name!r} is already registered with schema {registered}, now {schema}; "
                                "torch cannot change an op's schema in a running process: give the new op another "
                                "name (name='...') or restart the kernel")
        return _OPS[name]

    def impl(*args):
        return _no_alias(_SPECS[name].fn(*args), args)

    def fake(*args):
        try:
            return _SPECS[name].fn(*args)
        except Exception:  # a reference that fake tensors cannot run: shape-preserving default
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None:
                raise CustomOpError(f"custom op {name!r}: its reference cannot run on fake tensors and it has no "
                                    "tensor input to copy the output shape from; make it work on any tensor "
                                    "(no .item(), no data-dependent shapes)") from None
            return torch.empty_like(first)

    op = torch.library.custom_op(f"{CUSTOM_NAMESPACE}::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    _OPS[name] = op
    return op


def custom_op(npu_func: str | Callable | None = None, *, name: str | None = None, unit: str | None = None,
              flops: float | Callable | None = None, bytes: float | Callable | None = None,  # noqa: A002
              cost: Callable | None = None) -> Callable[[Callable], Any]:
    """Register the decorated function as an NPU operator (see the module docstring).

    Returns a decorator; the decorated name becomes the torch custom op (callable like the
    function, ``torch.ops.pypto_lab_user.<name>``), with ``.pypto_spec`` holding what was declared.
    Registering the same name again (a notebook cell run twice) replaces the reference and the
    cost; the parameter list must stay the same.

    With a pto kernel as ``npu_func``, ``optimize`` simulates it on the report's chip (the op's
    report entry is the kernel's own run) and ``optimized(x)`` runs it on the op's tensors; when the
    kernel raises, there or while costed, the error propagates as `CustomOpError` naming the op,
    the kernel and the argument shapes, with the kernel's own error as its cause. Calling the op
    directly runs the reference.
    """
    if npu_func is not None and not isinstance(npu_func, str) and not callable(npu_func):
        raise CustomOpError(f"custom_op npu_func = {npu_func!r}: pass a pto kernel (@pypto.jit), the NPU source "
                            "as a string (kept as documentation) or a cost function (called with the op's arguments "
                            "as meta tensors)")
    pto = npu_func is not None and is_pto_kernel(npu_func)
    if pto:
        given = [k for k, v in (("unit", unit), ("flops", flops), ("bytes", bytes), ("cost", cost)) if v is not None]
        if given:
            raise CustomOpError(f"custom_op npu_func = {npu_func.__name__} (a pto kernel) with {', '.join(given)}=: "
                                "the pto kernel is simulated for the cost and tells its units itself; drop "
                                f"{', '.join(g + '=' for g in given)}")
    if unit is not None and unit not in UNITS:
        raise CustomOpError(f"custom_op unit = {unit!r} is not known; choose one of {', '.join(UNITS)}")
    for label, v in (("flops", flops), ("bytes", bytes)):
        if v is not None and not callable(v) and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise CustomOpError(f"custom_op {label} = {v!r}: must be a number >= 0 or a function of the op's "
                                "tensor arguments returning one")
    if cost is not None and not callable(cost):
        raise CustomOpError(f"custom_op cost = {cost!r}: must be a function returning microseconds (or a dict "
                            "with time_us / cycles, or a KernelReport)")
    if cost is not None and callable(npu_func) and not pto:
        raise CustomOpError("custom_op: both npu_func and cost are functions; pass the cost function once, as cost=")

    def decorate(fn: Callable) -> Any:
        if not callable(fn):
            raise CustomOpError(f"custom_op decorates a function (the reference implementation), got {fn!r}")
        op_name = name or fn.__name__
        if not _NAME.match(op_name):
            raise CustomOpError(f"custom op name {op_name!r}: must be a Python identifier (letters, digits, _), "
                                "e.g. name='my_op'")
        if unit == "cube" and cost is None and not callable(npu_func) and flops is None:
            raise CustomOpError(f"custom op {op_name!r} on the Cube needs flops= (2 * M * K * N) to size its matmul, "
                                "or cost=")
        schema = _schema(fn, op_name)
        spec = CustomOpSpec(op_name, fn, unit or "vector", flops, bytes,
                            cost if cost is not None else (npu_func if callable(npu_func) and not pto else None),
                            npu_func if isinstance(npu_func, str) else "", schema, npu_func if pto else None)
        op = _register_torch_op(op_name, schema)
        _SPECS[op_name] = spec
        CUSTOM[op_name] = NpuOp(op_name, spec.unit, lower=lower_custom)
        op.pypto_spec = spec
        op.__doc__ = fn.__doc__
        return op

    return decorate


def registered() -> dict[str, CustomOpSpec]:
    return dict(_SPECS)


__all__ = ["custom_op", "CustomOpError", "CustomOpSpec", "spec_of", "registered"]
