"""Capture: `torch.export` turns a PyTorch model into the project's `Graph`.

`capture(model, example_inputs)` runs `torch.export` (no tracer of our own) and keeps, for every
ATen call, its target, its tensor inputs, its other arguments, the shapes and dtypes of its
outputs, and the module path it came from. Weights and buffers are graph inputs of kind
"param"/"buffer"; the model's own inputs are kind "input". Capturing the same model with inputs
of the same shapes and dtypes again returns the cached graph.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .graph import Graph, Node, TensorInfo, Value


class CaptureError(ValueError):
    """`torch.export` could not capture the model; the message says why and what to do."""


# ---- capture ------------------------------------------------------------------------------

def _info(val: Any, where: str = "") -> TensorInfo | None:
    if isinstance(val, torch.Tensor):
        dims = []
        for d in val.shape:
            if not isinstance(d, int):
                raise CaptureError(
                    f"{where or 'a tensor'} has a data-dependent shape {tuple(str(x) for x in val.shape)}: "
                    "the simulator needs static shapes. Keep shapes fixed (e.g. mask with torch.where instead "
                    "of boolean indexing, pad to a maximum length) and capture again"
                )
            dims.append(d)
        return TensorInfo(tuple(dims), str(val.dtype).removeprefix("torch."))
    return None


def _outputs(val: Any, where: str) -> list[TensorInfo]:
    if isinstance(val, (tuple, list)):
        return [i for v in val if (i := _info(v, where)) is not None]
    i = _info(val, where)
    return [i] if i is not None else []


def _replace_nodes(obj: Any, names: list[str]) -> Any:
    """Arguments with fx nodes replaced by their names (collected into ``names``)."""
    if isinstance(obj, torch.fx.Node):
        names.append(obj.name)
        return obj.name
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace_nodes(o, names) for o in obj)
    if isinstance(obj, dict):
        return {k: _replace_nodes(v, names) for k, v in obj.items()}
    if isinstance(obj, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(obj)
    return obj


def _module_of(node: torch.fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    return str(path), str(mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", mtype))


def from_exported(ep: torch.export.ExportedProgram, model_name: str = "") -> Graph:
    """Turn an ExportedProgram into the project's Graph."""
    kinds = {}
    targets = {}
    for spec in ep.graph_signature.input_specs:
        kind = {"USER_INPUT": "input", "PARAMETER": "param", "BUFFER": "buffer",
                "CONSTANT_TENSOR": "constant"}.get(spec.kind.name, spec.kind.name.lower())
        kinds[spec.arg.name] = kind
        targets[spec.arg.name] = spec.target or ""
    values: dict[str, Value] = {}
    nodes: list[Node] = []
    outputs: list[str] = []
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            values[n.name] = Value(n.name, kinds.get(n.name, "input"), _info(n.meta.get("val"), f"input {n.name}"),
                                   targets.get(n.name, ""))
        elif n.op == "call_function":
            names: list[str] = []
            args = _replace_nodes(tuple(n.args), names)
            kwargs = _replace_nodes(dict(n.kwargs), names)
            module, mtype = _module_of(n)
            where = f"node {n.name} ({n.target}, from {module or 'the model'})"
            nodes.append(Node(n.name, str(n.target), names, args, kwargs, _outputs(n.meta.get("val"), where),
                              module, mtype))
        elif n.op == "output":
            names = []
            _replace_nodes(n.args, names)
            outputs = names
    return Graph(values, nodes, outputs, model_name)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(example_inputs: tuple) -> tuple:
    sig = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            sig.append(("tensor", tuple(x.shape), str(x.dtype)))
        else:
            sig.append(("value", repr(x)))
    return tuple(sig)


def capture(model: torch.nn.Module, example_inputs, name: str | None = None) -> Graph:
    """Capture ``model`` called on ``example_inputs`` (a tensor or a tuple) with `torch.export`.

    The same model with inputs of the same shapes and dtypes is captured once; later calls return
    a copy of the cached graph.
    """
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"capture needs a torch.nn.Module, got {type(model).__name__}; wrap a function "
                           "in a Module whose forward calls it")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    sig = _signature(example_inputs)
    per_model = _CACHE.setdefault(model, {})
    if sig in per_model:
        return per_model[sig].copy()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ep = torch.export.export(model, example_inputs)
    except Exception as exc:  # torch raises many kinds: say what failed and what to do
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. pypto_lab needs a graph with static shapes "
            "and no data-dependent Python control flow: replace such branches with torch.where/torch.cond, "
            "or capture a sub-module that exports"
        ) from exc
    finally:
        model.train(was_training)
    graph = from_exported(ep, name or type(model).__name__)
    graph.exported_program = ep  # what `pypto_lab.runtime` interprets (copies carry it over)
    per_model[sig] = graph
    return graph.copy()
