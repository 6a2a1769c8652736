"""Stage 1 of the compiler, the Tensor Graph: what tracing a kernel records.

One `Node` per operation, in program order, with its operand ids, output shape and dtype, and
the vector / cube tile shapes in force when it was traced (short loops are unrolled while
tracing: the loop path of every node is kept). Node ``i`` produces tensor ``i``.

A symbolic loop (`loops`) is one ``loop`` node: its attrs hold the bounds (ints or
`SymbolicScalar`), and per variant (iteration class) the guards that select it and the range
``[lo, hi)`` of the nodes of its body, which follow the loop node; ``end`` is the first node after
the loop. Offsets and scalars of body nodes may be `SymbolicScalar` expressions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hw.tiling import CubeTile
from .dtypes import DataType

# operation kinds
GM_KINDS = ("param", "alloc")
VIEW_KINDS = ("view", "reshape")
ELEMENTWISE = ("add", "sub", "mul", "div", "adds", "subs", "rsubs", "muls", "divs", "rdivs",
               "exp", "sqrt", "rsqrt", "neg", "abs", "relu", "reciprocal", "cast", "maximum", "minimum",
               "maxs", "mins", "sigmoid", "log", "expm1", "erf", "erfc", "ceil", "floor", "trunc", "round",
               "pow", "pows", "cmp", "cmps", "logical_and", "logical_not", "where", "expand", "full", "arange",
               "math")  # math: the extended element-wise ops of ops_math (sin, bitwise_and, ...)
REDUCTIONS = ("amax", "amin", "sum")
# ops that do not tile element-wise: one group each, costed and computed by `special.REGISTRY`
SPECIAL_KINDS = ("gather", "index_select", "scatter_update", "scatter", "scatter_", "index_add", "index_add_",
                 "topk", "argsort", "argreduce", "cumulative", "prod", "random", "index_put_", "conv", "gathermask", "interleave", "bitcast", "atomic_add",
                 "gather_in_ub", "update")


def _jsonable(v):
    """JSON for an attribute: SymbolicScalar as its string form, guards as text."""
    if hasattr(v, "evaluate"):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        if len(v) == 4 and hasattr(v[0], "evaluate") and isinstance(v[2], bool):   # a loop guard
            return f"{v[0]} {'is' if v[2] else '=='} {v[1]} ({v[3]})"
        return [_jsonable(x) for x in v]
    return v


@dataclass
class Node:
    id: int
    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: DataType | None
    attrs: dict = field(default_factory=dict)
    vec_tile: tuple[int, ...] | None = None
    cube_tile: CubeTile | None = None
    loop: str = ""
    where: str = ""

    def to_json(self) -> dict:
        d = {"id": self.id, "op": self.op, "inputs": list(self.inputs), "shape": list(self.shape),
             "dtype": self.dtype.name if self.dtype else None}
        attrs = {k: _jsonable(v) for k, v in self.attrs.items()
                 if isinstance(v, (int, float, str, bool, tuple, list, type(None))) or hasattr(v, "evaluate")}
        if attrs:
            d["attrs"] = attrs
        if self.vec_tile:
            d["vec_tile"] = list(self.vec_tile)
        if self.cube_tile:
            d["cube_tile"] = [list(x) for x in self.cube_tile.as_pypto()]
        if self.loop:
            d["loop"] = self.loop
        if self.where:
            d["where"] = self.where
        return d


@dataclass
class TensorGraph:
    """The traced kernel: nodes in program order, the kernel's parameters and what it returns."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    params: list[int] = field(default_factory=list)     # node ids of the tensor arguments, in order
    param_names: list[str] = field(default_factory=list)
    returns: list[int] = field(default_factory=list)    # node ids of returned tensors (frontend.jit)
    # computed tensors written in place by a symbolic loop's body (`ops._assemble_carried`): buffers
    carried: set[int] = field(default_factory=set)

    def add(self, op, inputs, shape, dtype, attrs=None, vec_tile=None, cube_tile=None, loop="", where="") -> Node:
        n = Node(len(self.nodes), op, tuple(inputs), tuple(int(s) for s in shape), dtype, attrs or {},
                 vec_tile, cube_tile, loop, where)
        self.nodes.append(n)
        return n

    def consumers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n.id)
        return out

    def to_json(self) -> dict:
        return {"stage": "tensor_graph", "name": self.name, "params": self.params, "param_names": self.param_names,
                "returns": self.returns, "nodes": [n.to_json() for n in self.nodes]}
