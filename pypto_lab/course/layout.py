"""Checker of exercise 05, pick the layout that avoids a TransData.

On the Ascend 910A the Cube's matmuls read and write FRACTAL_NZ; the `layout` pass (level 2)
inserts a TransData wherever a tensor must change format. The student edits a small MLP head
(Linear -> GELU -> LayerNorm -> Linear) so that no TransData sits between its two matmuls. The
checker reads the level-2 report and the optimised graph, and explains every TransData it finds:
which tensor it converts, between which formats, and the rule of the node that forced it (a
view that changes the shape, a LayerNorm width that is not a multiple of 16, an op that works
only in ND), with the values of the student's own model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..capture.graph import Graph, Node
from ..compiler.optimize import optimize
from ..hw.capabilities import ND, NZ
from ..hw.chip import get_chip
from ..kernels.ir import CubeKernel, TransDataKernel
from ..passes.layout import ND_VECTOR_OPS, NZ_LAYER_NORMS
from .verdict import Attempt, Verdict

VIEW_UNIT = "free"  # the lowering table's unit for views (reshape, view, flatten, permute, ...)


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    info = graph.info(name)
    return tuple(info.shape) if info is not None else ()


def _label(node: Node) -> str:
    """A node's name, with its op when the name does not say it (``view_3 (reshape)``)."""
    return node.name if node.name.rstrip("_0123456789") == node.op else f"{node.name} ({node.op})"


def why_nd(graph: Graph, node: Node, depth: int = 0) -> str:
    """Why ``node`` works in (or hands on) ND, from its op and its own shapes."""
    nodes = {n.name for n in graph.nodes}
    acts = [i for i in node.inputs if i in nodes or (i in graph.values and graph.values[i].kind == "input")]
    src = acts[0] if acts else None
    if node.op in NZ_LAYER_NORMS and src is not None:
        shape = _shape(graph, src)
        bad = [d for d in shape[-2:] if d % 16]
        if bad:
            return (f"{node.name} normalises rows of {shape[-1]} over a tensor of shape {list(shape)}: CANN's "
                    f"LayerNorm keeps FRACTAL_NZ only when the last two axes are multiples of 16, and "
                    + ", ".join(f"{d} = 16 x {d // 16} + {d % 16}" for d in bad))
        if node.input_formats.get(src) != NZ and depth < 4:
            return f"{node.name} keeps its input's ND: " + why_gives_nd(graph, src, depth + 1)
    if node.unit == VIEW_UNIT:
        out = _shape(graph, node.name)
        return (f"{_label(node)} rearranges the tensor "
                f"({list(_shape(graph, src)) if src else '?'} -> {list(out)}), which only ND keeps: FRACTAL_NZ "
                f"tiles the last two axes in 16 x 16 fractals")
    if node.op in ND_VECTOR_OPS:
        return f"{_label(node)} works along the last axis of an ND tensor"
    if node.unit == "vector" and src is not None and depth < 4:
        return f"{_label(node)} takes the format of its input: " + why_gives_nd(graph, src, depth + 1)
    return f"{_label(node)} reads and writes ND"


def why_gives_nd(graph: Graph, name: str, depth: int = 0) -> str:
    """Why the tensor ``name`` is in ND."""
    if name in graph.values:
        return f"{name} is a graph input, and graph inputs are ND"
    return why_nd(graph, graph.node(name), depth)


def explain_transdata(graph: Graph, td: Node, chip_name: str) -> str:
    """One line: what a TransData converts and the rule that made the layout pass insert it."""
    spec: TransDataKernel = td.kernel
    src = td.inputs[0]
    users = [n for n in graph.nodes if td.name in n.inputs]
    head = (f"{td.name}: {src} {list(_shape(graph, src))} {spec.src_format} -> {spec.dst_format} for "
            f"{', '.join(u.name for u in users) or 'the graph output'}")
    if spec.dst_format == ND:
        if not users:
            return head + ": graph outputs are ND"
        return head + ": " + why_nd(graph, users[0])
    cube = next((u for u in users if isinstance(u.kernel, CubeKernel) or u.unit == "cube"), None)
    what = (f"{cube.name} is a Cube kernel and on {chip_name} the Cube reads {spec.dst_format}"
            if cube is not None else f"{users[0].name} reads {spec.dst_format}" if users else "")
    return head + f": {what}; but " + why_gives_nd(graph, src)


@dataclass(frozen=True)
class AvoidTransData:
    """Exercise 05: an MLP head on ``chip`` at level 2 with no TransData between its two matmuls,
    a LayerNorm between them, a hidden width of at least ``min_hidden``, output shape = input's."""

    chip: str = "Ascend910A"
    batch: int = 8
    tokens: int = 64
    d_model: int = 256
    min_hidden: int = 1000
    precision: str = "fp16"
    level: int = 2

    def example(self) -> torch.Tensor:
        torch.manual_seed(0)
        return torch.randn(self.batch, self.tokens, self.d_model)

    def check(self, head) -> Verdict:
        """``head``: an ``nn.Module`` class (built with no arguments) or instance."""
        chip = get_chip(self.chip)
        a = Attempt("avoid the TransData")
        x = self.example()
        try:
            torch.manual_seed(0)
            model = (head() if isinstance(head, type) else head).eval()
            with torch.no_grad():
                y = model(x)
        except NotImplementedError as err:
            return a.not_attempted(err, "your model")
        except Exception as err:
            return a.broken(err, "your model")
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            return a.fail("rule 1, same function", f"the head returns {got}; it must return the input's shape "
                          f"{tuple(x.shape)}")
        om = optimize(model, x, chip=chip, level=self.level, precision=self.precision)
        rep, graph = om.report(), om.graph
        a.report = om
        cubes = [i for i, k in enumerate(rep.kernels) if isinstance(k.spec, CubeKernel)]
        norms = [k for k in rep.kernels if any(op.split(".")[1] in NZ_LAYER_NORMS
                                               for op in k.fused_ops if op.startswith("aten."))]
        a.say(f"{type(model).__name__} on {chip.name}, level {self.level}, input {list(x.shape)}: "
              f"{len(rep.kernels)} kernels, {rep.latency_us:.1f} us")
        a.say("  kernels in order: " + ", ".join(k.name for k in rep.kernels))
        if len(cubes) != 2 or not norms:
            return a.fail("rule 2, keep the layers", f"the head must keep two matmuls (Cube kernels) with a "
                          f"LayerNorm between them; it has {len(cubes)} Cube kernel(s) and "
                          f"{len(norms)} LayerNorm kernel(s)")
        hidden = rep.kernels[cubes[0]].spec.n
        if hidden < self.min_hidden:
            return a.fail("rule 2, keep the layers", f"the hidden width is {hidden}; keep it at least "
                          f"{self.min_hidden} (a narrower head is a different model)")
        tds = [(i, k) for i, k in enumerate(rep.kernels) if isinstance(k.spec, TransDataKernel)]
        inner = [(i, k) for i, k in tds if cubes[0] < i < cubes[-1]]
        td_us = sum(k.time_us for _, k in tds)
        a.facts.update(hidden=hidden, transdata=[k.name for _, k in tds], inner=[k.name for _, k in inner],
                       transdata_us=td_us, latency_us=rep.latency_us)
        a.say(f"  hidden width {hidden}; {len(tds)} TransData taking {td_us:.2f} us of {rep.latency_us:.1f} us")
        outer = [k for i, k in tds if not cubes[0] < i < cubes[-1]]
        notes = [explain_transdata(graph, graph.node(k.nodes[0]), chip.name) for k in outer]
        if inner:
            why = [explain_transdata(graph, graph.node(k.nodes[0]), chip.name) for _, k in inner]
            return a.fail("rule 3, no TransData between the matmuls",
                          f"{len(inner)} TransData between {rep.kernels[cubes[0]].name} and "
                          f"{rep.kernels[cubes[-1]].name}", why + ["(outside the matmuls, needed whatever the model:)"]
                          + notes)
        return a.ok(f"no TransData between {rep.kernels[cubes[0]].name} and {rep.kernels[cubes[-1]].name}",
                    ["the ones left are needed whatever the model:"] + notes)


__all__ = ["AvoidTransData", "explain_transdata", "why_gives_nd", "why_nd"]
