"""One `torch.export` with dynamic shapes serving every size: the programs exported that way, and
their specialisation to concrete input shapes.

`pypto_lab.capture.export.export_dynamic(model, example_inputs, dynamic_shapes)` exports a model
once with symbolic sizes (e.g. a KV cache's context length, `torch.export.Dim`) and registers the
program here. Costing and the runtime need concrete shapes, so `capture(model, inputs)` of a
registered model does not export again: `specialise` copies the program's graph and propagates
the inputs' concrete shapes through it with fake tensors (no arithmetic, milliseconds), and the
result is an ExportedProgram whose every node has concrete shapes, as a static export would.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils import _pytree as pytree

from .shapes_only import fake_input


@dataclass
class DynamicProgram:
    """A program exported with symbolic sizes, the model fingerprint it was exported at, and
    how long the export took (seconds)."""

    program: torch.export.ExportedProgram
    fingerprint: str
    seconds: float


_DYNAMIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> DynamicProgram


def register(model: torch.nn.Module, program: DynamicProgram) -> None:
    _DYNAMIC[model] = program


def registered(model: torch.nn.Module) -> DynamicProgram | None:
    return _DYNAMIC.get(model)


def _flat_user_inputs(ep: torch.export.ExportedProgram, example_inputs: tuple) -> list | None:
    """The flat user inputs of a call with ``example_inputs``, or None when their structure is
    not the program's."""
    flat, spec = pytree.tree_flatten((tuple(example_inputs), {}))
    return flat if spec == ep.call_spec.in_spec else None


def fits(ep: torch.export.ExportedProgram, example_inputs: tuple) -> bool:
    """Whether ``example_inputs`` have the program's structure, its static sizes, and symbolic
    sizes inside their exported ranges."""
    flat = _flat_user_inputs(ep, example_inputs)
    if flat is None:
        return False
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(user) != len(flat):
        return False
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    for s, x in zip(user, flat, strict=True):
        meta = nodes[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None
        if not isinstance(meta, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor) or x.dim() != meta.dim() or x.dtype != meta.dtype:
            return False
        for want, got in zip(meta.shape, x.shape, strict=True):
            if isinstance(want, int):
                if want != got:
                    return False
                continue
            rng = ranges.get(str(want.node.expr))
            if rng is None or not (int(rng.lower) <= got <= int(rng.upper)):
                return False
    return True


def specialise(ep: torch.export.ExportedProgram, example_inputs: tuple) -> torch.export.ExportedProgram:
    """``ep`` with every node's shapes made concrete for ``example_inputs`` (which must `fit`).

    The program's graph module is copied (the original keeps serving other sizes) and fake
    tensors of the inputs' shapes are propagated through it; parameters, buffers, constants and
    the signature are shared with ``ep``."""
    flat = _flat_user_inputs(ep, example_inputs)
    if flat is None:
        raise ValueError("specialise: the inputs do not have the exported program's structure; "
                         "pass them as the program was exported with")
    user = iter(flat)
    values = []
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for s in ep.graph_signature.input_specs:
        kind = s.kind.name
        if kind == "USER_INPUT":
            values.append(next(user))
        elif s.target in ep.state_dict:
            values.append(ep.state_dict[s.target])
        else:
            values.append(ep.constants[s.target])
    gm = copy.deepcopy(ep.graph_module)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = []
    for s, v in zip(ep.graph_signature.input_specs, values, strict=True):
        meta = placeholders[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None
        device = meta.device if isinstance(meta, torch.Tensor) else torch.device("cpu")
        fakes.append(fake_input(v, mode, device))  # meta and fake tensors: on the program's device
    with mode:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    out = copy.copy(ep)
    out._graph_module = gm
    out._range_constraints = {}
    out._example_inputs = (tuple(example_inputs), {})
    return out


__all__ = ["DynamicProgram", "fits", "register", "registered", "specialise"]
