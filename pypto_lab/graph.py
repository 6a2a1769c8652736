"""The project's graph: what `capture` makes of a PyTorch model, and what the passes rewrite.

`capture(model, example_inputs)` runs `torch.export` (no tracer of our own) and keeps, for every
ATen call, its target, its tensor inputs, its other arguments, the shapes and dtypes of its
outputs, and the module path it came from. Weights and buffers are graph inputs of kind
"param"/"buffer"; the model's own inputs are kind "input". Capturing the same model with inputs
of the same shapes and dtypes again returns the cached graph.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


class CaptureError(ValueError):
    """`torch.export` could not capture the model; the message says why and what to do."""


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor value."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_SIZE.get(self.dtype, 4)


_DTYPE_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


@dataclass
class Value:
    """A graph input: the model's input, a parameter or a buffer."""

    name: str
    kind: str                 # "input" | "param" | "buffer" | "constant"
    info: TensorInfo | None
    target: str = ""          # for params and buffers: their state_dict name


@dataclass
class Node:
    """One ATen call. ``inputs`` name the values or nodes it reads, in argument order; ``args``
    keeps every argument as captured, with tensors replaced by the name of their producer."""

    name: str
    target: str               # e.g. "aten.conv2d.default"
    inputs: list[str]
    args: tuple
    kwargs: dict[str, Any]
    outputs: list[TensorInfo]
    module: str = ""          # module path, e.g. "layer1.0.conv1"
    module_type: str = ""     # e.g. "torch.nn.modules.conv.Conv2d"
    attrs: dict[str, Any] = field(default_factory=dict)  # what passes attach (npu op, unit, ...)

    def rename_input(self, old: str, new: str) -> None:
        """Read ``new`` wherever this node read ``old`` (inputs, args, kwargs)."""
        if old in self.inputs:
            self.inputs = [new if i == old else i for i in self.inputs]
            self.args = _rename(self.args, old, new)
            self.kwargs = _rename(self.kwargs, old, new)

    def copy(self) -> Node:
        attrs = {k: copy.deepcopy(v) if isinstance(v, (list, dict, set)) else v for k, v in self.attrs.items()}
        return Node(self.name, self.target, list(self.inputs), self.args, dict(self.kwargs), list(self.outputs),
                    self.module, self.module_type, attrs)

    @property
    def op(self) -> str:
        """The ATen op name without namespace and overload, e.g. "conv2d"."""
        parts = self.target.split(".")
        return parts[1] if len(parts) >= 2 else self.target


@dataclass
class Graph:
    """Values (graph inputs), nodes in topological order, and the names of the outputs."""

    values: dict[str, Value]
    nodes: list[Node]
    outputs: list[str]
    model_name: str = ""

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the graph")

    def producers(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def info(self, name: str) -> TensorInfo | None:
        """Shape and dtype of a value or of a node's first output."""
        if name in self.values:
            return self.values[name].info
        for n in self.nodes:
            if n.name == name:
                return n.outputs[0] if n.outputs else None
        raise KeyError(f"no value or node {name!r} in the graph")

    def rename_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` (node inputs, args, kwargs, graph outputs) read ``new``."""
        for n in self.nodes:
            n.rename_input(old, new)
        self.outputs = [new if o == old else o for o in self.outputs]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.target] = counts.get(n.target, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def copy(self) -> Graph:
        """An independent copy for a pass to rewrite. Shapes (TensorInfo) are frozen and captured
        arguments are replaced, never edited in place, so they are shared; lists, kwargs and attrs
        are copied (a deepcopy of the whole graph cost more than the passes themselves)."""
        g = Graph({k: dataclasses.replace(v) for k, v in self.values.items()},
                  [n.copy() for n in self.nodes], list(self.outputs), self.model_name)
        for k, v in vars(self).items():  # what passes attached to the graph (e.g. memory_plan)
            if k not in vars(g):
                setattr(g, k, v)
        return g

    def __len__(self) -> int:
        return len(self.nodes)


def _rename(obj: Any, old: str, new: str) -> Any:
    """Captured arguments with the name ``old`` replaced by ``new`` (tensors appear as names)."""
    if isinstance(obj, str):
        return new if obj == old else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rename(o, old, new) for o in obj)
    if isinstance(obj, dict):
        return {k: _rename(v, old, new) for k, v in obj.items()}
    return obj


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
