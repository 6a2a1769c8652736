"""The coster of `CustomKernel`: a user operator (`pypto_lab.custom_op`) costed from what it declared
(`pypto_lab.lowering.custom` lowers a captured one to this spec): its cost function called with
the op's arguments as meta tensors, or its flops / bytes simulated on the Vector unit."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..hw.chip import Chip
from ..hw.kernels import KernelReport, VectorOp, simulate_vector
from .cost import KernelCost, coster, split_resources
from .custom_error import CustomOpError
from .ir import CustomKernel, TensorMeta

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "bool": torch.bool,
                 "uint8": torch.uint8, "float64": torch.float64, "int16": torch.int16}
GM_TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "int8": "int8"}


def no_cost_message(name: str) -> str:
    return (f"custom op {name!r} has no cost: the simulator cannot time it. Pass flops= and/or bytes= to "
            f"@custom_op (e.g. flops=lambda x: x.numel(), bytes=lambda x: 2 * x.numel() * x.element_size()), "
            "or cost=<function returning microseconds>")


def meta_of(args: tuple) -> list:
    """The captured arguments with every `TensorMeta` as a meta tensor (shapes and dtypes only)."""
    return [torch.empty(a.shape, dtype=_TORCH_DTYPES.get(a.dtype, torch.float32), device="meta")
            if isinstance(a, TensorMeta) else a for a in args]


def declared_number(spec_name: str, label: str, value: Any, args: list) -> float:
    if callable(value):
        try:
            value = value(*args)
        except Exception as exc:
            raise CustomOpError(f"custom op {spec_name!r}: its {label}= function failed on meta tensors of shapes "
                                f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}: "
                                f"{type(exc).__name__}: {exc}. It gets the op's arguments as meta tensors (use "
                                ".shape, .numel(), .element_size(), not values)") from exc
    if isinstance(value, torch.Tensor):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CustomOpError(f"custom op {spec_name!r}: {label} = {value!r}; must be a finite number >= 0")
    return float(value)


def _resources(spec: CustomKernel, chip: Chip) -> tuple[str, ...]:
    return split_resources(chip, "AIC" if spec.declared_unit == "cube" else "AIV")


def _call_cost(spec: CustomKernel, chip: Chip, args: list) -> KernelCost:
    try:
        params = inspect.signature(spec.cost_fn).parameters
        takes_chip = "chip" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes_chip = False
    try:
        res = spec.cost_fn(*args, chip=chip) if takes_chip else spec.cost_fn(*args)
    except Exception as exc:
        raise CustomOpError(f"custom op {spec.name!r}: its cost function failed on meta tensors: "
                            f"{type(exc).__name__}: {exc}") from exc
    gm = float(sum(math.prod(o.shape) * torch.empty((), dtype=_TORCH_DTYPES.get(o.dtype, torch.float32)).element_size()
                   for o in spec.out) + sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)))
    if isinstance(res, KernelReport):
        return KernelCost(res.cycles, res.time_us, res.gm_bytes, dict(res.tile), (res,), _resources(spec, chip))
    if isinstance(res, dict) and ("time_us" in res or "cycles" in res):
        if "time_us" in res:
            time_us = declared_number(spec.name, "cost()['time_us']", res["time_us"], args)
            cycles = time_us * chip.clock_mhz
        else:
            cycles = declared_number(spec.name, "cost()['cycles']", res["cycles"], args)
            time_us = chip.cycles_to_us(cycles)
        gm = declared_number(spec.name, "cost()['gm_bytes']", res.get("gm_bytes", gm), args)
    elif isinstance(res, (int, float)) and not isinstance(res, bool):
        time_us = declared_number(spec.name, "cost()", res, args)
        cycles = time_us * chip.clock_mhz
    else:
        raise CustomOpError(f"custom op {spec.name!r}: its cost function returned {res!r}; return microseconds "
                            "(a number), a dict with 'time_us' or 'cycles', or a KernelReport")
    return KernelCost(cycles, time_us, gm, {}, (), _resources(spec, chip))


@coster(CustomKernel)
def cost_custom(spec: CustomKernel, chip: Chip) -> KernelCost:
    args = meta_of(spec.args)
    if spec.cost_fn is not None:
        return _call_cost(spec, chip, args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    eb = torch.empty((), dtype=_TORCH_DTYPES[GM_TORCH_DTYPE[spec.dtype]]).element_size()
    default_bytes = sum(t.numel() * t.element_size() for t in tensors) + sum(math.prod(o.shape) * eb for o in spec.out)
    nbytes = spec.nbytes if spec.nbytes is not None else float(default_bytes)
    elems = max(1, math.ceil(nbytes / (2 * eb)))  # read elems, write elems
    passes = math.ceil(spec.flops / elems) if spec.flops else 0
    vop = VectorOp(1, 2, (("VMUL", passes),) if passes else (), flops_per_elem=float(passes))
    r = simulate_vector(vop, elems, dtype=spec.dtype, chip=chip, name=f"{spec.name} {elems} {spec.dtype}")
    return KernelCost.of([r], _resources(spec, chip))


__all__ = ["GM_TORCH_DTYPE", "cost_custom", "declared_number", "meta_of", "no_cost_message"]
