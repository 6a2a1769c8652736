"""The project's graph: what `capture` makes of a PyTorch model, and what the passes rewrite.

Values (the model's inputs, parameters and buffers), nodes (one ATen call each, with the shapes
and dtypes of their outputs and the module path they came from) in topological order, and the
graph's outputs.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any


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
