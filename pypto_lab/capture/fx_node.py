"""One torch.fx node, from whichever graph holds it, as the project's `Node`: how the lowering
table sees an operator whether `torch.export` captured it for inference or AOT autograd's joint
graph holds it for a training step.

`node_of(fx_node)` keeps the node's target, the names of the nodes it reads (in argument order),
its other arguments (tensors replaced by their producer's name), the shapes and dtypes of its
outputs (from the ``val`` that fake-tensor propagation left in ``node.meta``) and the module path
it came from. `op_graph(fx_node)` adds the shapes of what it reads: a one-node `Graph` that the
lowering rules (`pypto_lab.lowering`) size its kernels from, exactly as they size a node of a
captured model.
"""

from __future__ import annotations

from typing import Any

import torch

from .graph import Graph, Node, TensorInfo, Value


class CaptureError(ValueError):
    """`torch.export` could not capture the model; the message says why and what to do."""


def tensor_info(val: Any, where: str = "") -> TensorInfo | None:
    """Shape and dtype of a (fake) tensor, None for anything else; a data-dependent size is refused."""
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


def outputs_of(val: Any, where: str = "") -> list[TensorInfo]:
    """The tensors of a node's ``val``: one, or each tensor of a tuple (``native_layer_norm``'s
    output, mean and rstd), in order."""
    if isinstance(val, (tuple, list)):
        return [i for v in val if (i := tensor_info(v, where)) is not None]
    i = tensor_info(val, where)
    return [i] if i is not None else []


def replace_nodes(obj: Any, names: list[str], scalars: dict[str, Any] | None = None) -> Any:
    """Arguments with fx nodes replaced by their names (collected into ``names``), and nodes
    that compute a concrete size (``scalars``) by their value."""
    if isinstance(obj, torch.fx.Node):
        if scalars and obj.name in scalars:
            return scalars[obj.name]
        names.append(obj.name)
        return obj.name
    if isinstance(obj, (list, tuple)):
        return type(obj)(replace_nodes(o, names, scalars) for o in obj)
    if isinstance(obj, dict):
        return {k: replace_nodes(v, names, scalars) for k, v in obj.items()}
    if isinstance(obj, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(obj)
    return obj


def module_of(node: torch.fx.Node) -> tuple[str, str]:
    """The module path and type a node was traced in ("", "" when the tracer kept none)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    return str(path), str(mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", mtype))


def node_of(n: torch.fx.Node, scalars: dict[str, Any] | None = None) -> Node:
    """``n`` as a `Node` (``scalars``: size nodes already evaluated, written into the arguments)."""
    names: list[str] = []
    args = replace_nodes(tuple(n.args), names, scalars)
    kwargs = replace_nodes(dict(n.kwargs), names, scalars)
    module, mtype = module_of(n)
    where = f"node {n.name} ({n.target}, from {module or 'the model'})"
    return Node(n.name, str(n.target), names, args, kwargs, outputs_of(n.meta.get("val"), where), module, mtype)


def op_graph(n: torch.fx.Node) -> tuple[Graph, Node]:
    """``n`` as the one node of a `Graph` whose values are the tensors it reads (their shapes and
    dtypes from the fake tensors of the nodes that make them)."""
    node = node_of(n)
    values = {a.name: Value(a.name, "input", _first_tensor(a.meta.get("val"))) for a in n.all_input_nodes}
    return Graph(values, [node], []), node


def _first_tensor(val: Any) -> TensorInfo | None:
    outs = outputs_of(val)
    return outs[0] if outs else None


__all__ = ["CaptureError", "module_of", "node_of", "op_graph", "outputs_of", "replace_nodes", "tensor_info"]
