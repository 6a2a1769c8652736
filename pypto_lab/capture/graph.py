"""The project's graph: what `capture` makes of a PyTorch model, and what the passes rewrite.

Values (the model's inputs, parameters and buffers), nodes (one ATen call each, with the shapes
and dtypes of their outputs and the module path they came from) in topological order, and the
graph's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..kernels.ir import KernelSpec
from .catalogue import NpuOp


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


@dataclass(frozen=True)
class FoldedBatchNorm:
    """An inference BatchNorm folded into the convolution before it (`fold_batchnorm`): the BN's
    node, the names of its weight, bias, running mean and variance (None when absent), its eps."""

    bn: str
    weight: str | None
    bias: str | None
    running_mean: str | None
    running_var: str | None
    eps: float


@dataclass
class Node:
    """One ATen call. ``inputs`` name the values or nodes it reads, in argument order; ``args``
    keeps every argument as captured, with tensors replaced by the name of their producer.

    What the passes decide about a node is typed: ``npu`` (its lowering-table entry, set by `map_ops`;
    its ``unit`` is "cpu" for a fallback), ``kernel`` (the spec of the kernel this node anchors:
    what the chip runs), ``group`` (the anchor of the fused kernel this node belongs to; None when
    it anchors its own kernel or is a view), ``fused_by`` (the pass that fused it), ``folded_bn``
    (a BatchNorm folded into this convolution), ``format`` and ``input_formats`` (device formats
    of its output and of the activations it reads, from the layout pass)."""

    name: str
    target: str               # e.g. "aten.conv2d.default"
    inputs: list[str]
    args: tuple
    kwargs: dict[str, Any]
    outputs: list[TensorInfo]
    module: str = ""          # module path, e.g. "layer1.0.conv1"
    module_type: str = ""     # e.g. "torch.nn.modules.conv.Conv2d"
    npu: NpuOp | None = None
    kernel: KernelSpec | None = None
    group: str | None = None
    fused_by: str = ""
    folded_bn: FoldedBatchNorm | None = None
    format: str = ""
    input_formats: dict[str, str] = field(default_factory=dict)

    @property
    def unit(self) -> str | None:
        """The unit the lowering table gave it ("cube", "vector", "move", "free", "composite", "cpu"); None
        before `map_ops`."""
        return self.npu.unit if self.npu is not None else None

    @property
    def is_view(self) -> bool:
        """A view outside any fused kernel: no kernel of its own, it aliases its input."""
        return self.unit == "free" and self.group is None

    @property
    def anchor(self) -> str:
        """The node whose ``kernel`` describes the kernel this node runs in."""
        return self.group or self.name

    def rename_input(self, old: str, new: str) -> None:
        """Read ``new`` wherever this node read ``old`` (inputs, args, kwargs)."""
        if old in self.inputs:
            self.inputs = [new if i == old else i for i in self.inputs]
            self.args = _rename(self.args, old, new)
            self.kwargs = _rename(self.kwargs, old, new)
            if old in self.input_formats:
                self.input_formats = {new if k == old else k: v for k, v in self.input_formats.items()}

    def copy(self) -> Node:
        """An independent copy: lists and dicts are copied; captured arguments, shapes and the
        typed annotations (frozen values) are shared."""
        return Node(self.name, self.target, list(self.inputs), self.args, dict(self.kwargs), list(self.outputs),
                    self.module, self.module_type, self.npu, self.kernel, self.group, self.fused_by,
                    self.folded_bn, self.format, dict(self.input_formats))

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
    exported_program: Any = field(default=None, repr=False)  # what `pypto_lab.runtime` interprets

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
        """An independent copy for a pass to rewrite. Shapes (TensorInfo), captured arguments and
        the typed annotations are frozen or replaced, never edited in place, so they are shared;
        lists and dicts are copied (a deepcopy of the whole graph cost more than the passes)."""
        return Graph({k: Value(v.name, v.kind, v.info, v.target) for k, v in self.values.items()},
                     [n.copy() for n in self.nodes], list(self.outputs), self.model_name, self.exported_program)

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
