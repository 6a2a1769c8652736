"""Keep activations in L2 between kernels, as ATC's ``--buffer_optimize=l2_optimize`` (its default)
does: every kernel's reads and writes go through the chip's L2 in execution order
(`pypto_lab.hw.l2_residency.plan_l2`, the model and its sources), and what stays there is written
into the kernel specs, which the Cube, Vector and TransData costers obey: a Cube kernel's operands
that L2 serves (``l2_operands``: "a", "b", "residual"; every read of them, a convolution's
overlapping feature-map rows too, hits L2), a Vector or TransData kernel's bytes of inputs served
by L2 (``l2_reads``), and each kernel's bytes of results that never reach DRAM (``l2_writes``).

The tensors are the graph's: a kernel reads the values and node outputs its member nodes take
from outside it (views and in-place concatenations looked through to the tensors they alias:
parameters included, so a weight read again soon, ALBERT's shared layer, can hit L2), and writes
the outputs of its members that something outside it reads. Sizes are as GM holds them (the
run's storage dtype for floating-point tensors). Kernels whose costing does not take L2-resident
bytes (attention, a decomposed composite, host fallbacks, custom operators, quantised-input or
weight-only-int8 matmuls) read from DRAM, so what they read is written back first.

The stack decides whether it runs (fusion ``l2_optimize``: ATC's offline model). The summary
and notes say how many bytes L2 kept and which layers' activations stay ("layer3.* activations
stay in L2") and which spill, with the largest tensor that did not fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..hw.chip import DTYPE_BYTES
from ..hw.l2_residency import L2Plan, Step, plan_l2
from ..kernels.ir import CubeKernel, Kernel, TransDataKernel, VectorKernel
from ..lowering.lower import kernels_of, storage_dtypes
from .base import Note, Pass, PassContext, PassResult, register

_FLOAT = ("float32", "float16", "bfloat16", "float64")
MB = 1e6


def l2_capable(spec) -> bool:
    """Whether a spec's coster takes bytes served by L2 (`simulate_matmul` / `simulate_vector`)."""
    if isinstance(spec, CubeKernel):
        return spec.quantize_input is None and spec.weight_dtype is None
    return isinstance(spec, (VectorKernel, TransDataKernel))


def _aliases(node: Node) -> bool:
    """A node whose output is another tensor seen differently (a view, an in-place concatenation)."""
    return node.unit == "free" and node.kernel is None


class _Tensors:
    """Sizes of the graph's tensors as GM holds them, and what each name aliases."""

    def __init__(self, graph: Graph, gm_dtype: str):
        self.graph = graph
        self.producers = graph.producers()
        self.eb = DTYPE_BYTES.get(gm_dtype, 2)
        self._base: dict[str, tuple[str, ...]] = {}

    def nbytes(self, name: str) -> int:
        node = self.producers.get(name)
        if node is not None:
            info = node.outputs[0] if node.outputs else None
        else:
            value = self.graph.values.get(name)
            info = value.info if value is not None else None
        if info is None:
            return 0
        return info.numel * self.eb if info.dtype in _FLOAT else info.nbytes

    def base(self, name: str) -> tuple[str, ...]:
        """The tensors ``name`` reads when a kernel reads it (itself, or what its view aliases)."""
        hit = self._base.get(name)
        if hit is not None:
            return hit
        node = self.producers.get(name)
        if node is None or not _aliases(node):
            out = (name,) if node is not None or name in self.graph.values else ()
        else:
            out = tuple(dict.fromkeys(b for i in node.inputs for b in self.base(i)))
        self._base[name] = out
        return out


def kernel_steps(graph: Graph, kernels: list[Kernel], gm_dtype: str) -> tuple[list[Step], frozenset[str]]:
    """Each kernel as an L2 `Step` (what it reads and writes, with sizes), and the graph's outputs."""
    t = _Tensors(graph, gm_dtype)
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, set()).add(n.name)
    outputs = frozenset(b for o in graph.outputs for b in t.base(o))
    steps = []
    for k in kernels:
        members = set(k.nodes)
        reads: dict[str, int] = {}
        writes: dict[str, int] = {}
        for name in k.nodes:
            node = t.producers[name]
            for i in node.inputs:
                if i not in members:
                    for b in t.base(i):
                        if b not in members:
                            reads[b] = t.nbytes(b)
            if (readers.get(name, set()) - members or name in outputs) and not _aliases(node):
                writes[name] = t.nbytes(name)
        steps.append(Step(tuple(reads.items()), tuple(writes.items()), l2_capable(k.spec)))
    return steps, outputs


def _with_l2(spec, operands: tuple[str, ...], reads: int, writes: int):
    if isinstance(spec, CubeKernel):
        return replace(spec, l2_operands=operands, l2_writes=writes)
    return replace(spec, l2_reads=reads, l2_writes=writes)


def cube_operands(anchor: Node, hits: set[str], tensors: _Tensors) -> tuple[str, ...]:
    """Which operands of a Cube kernel L2 serves: "a" and "b" (the anchor's two matrix inputs; an
    addmm's after its bias), "residual" (another tensor a fused add reads)."""
    first = 1 if anchor.op == "addmm" else 0
    a = set(tensors.base(anchor.inputs[first])) if len(anchor.inputs) > first else set()
    b = set(tensors.base(anchor.inputs[first + 1])) if len(anchor.inputs) > first + 1 else set()
    out = []
    if a and a <= hits:
        out.append("a")
    if b and b <= hits:
        out.append("b")
    if hits - a - b and anchor.kernel.epilogue.residual:
        out.append("residual")
    return tuple(out)


def layer_of(module: str) -> str:
    """"layer3.*" for "layer3.0.conv1": a module path up to its first index, the rest starred (a path
    without an index: its first part, "Mixed_5b" for "Mixed_5b.branch1x1.conv")."""
    parts = module.split(".") if module else []
    for j, p in enumerate(parts):
        if re.fullmatch(r"\d+", p):
            return ".".join(parts[:j]) + ".*" if j else p
    return parts[0] if parts else "(graph)"


@register
@dataclass(frozen=True)
class L2Residency(Pass):
    """Activations stay in L2 between the kernels that write and read them (l2_optimize)."""

    name: ClassVar[str] = "l2_residency"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)
    fusion: ClassVar[str] = "l2_optimize"

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        for node in graph.nodes:  # start from nothing kept (the pass may run on its own output)
            if l2_capable(node.kernel):
                node.kernel = _with_l2(node.kernel, (), 0, 0)
        _, gm_dtype = storage_dtypes(ctx.chip, ctx.precision)
        kernels = kernels_of(graph)
        steps, outputs = kernel_steps(graph, kernels, gm_dtype)
        plan = plan_l2(steps, int(ctx.chip.l2_bytes), outputs)
        producers = graph.producers()
        changed = False
        tensors = _Tensors(graph, gm_dtype)
        for k, hit, r, w in zip(kernels, plan.hits, plan.l2_reads, plan.l2_writes):
            anchor = producers[k.anchor]
            if (r or w) and anchor.kernel is k.spec and l2_capable(k.spec):
                operands = cube_operands(anchor, set(hit), tensors) if isinstance(k.spec, CubeKernel) else ()
                anchor.kernel = _with_l2(k.spec, operands, int(r), int(w))
                changed = True
        summary = (f"{len(plan.resident)} of {len(plan.resident) + len(plan.spilled)} tensors written by kernels "
                   f"stay in L2 ({ctx.chip.l2_bytes / MB:,.1f} MB) for their readers: "
                   f"{sum(plan.l2_reads) / MB:,.1f} MB of reads and {sum(plan.l2_writes) / MB:,.1f} MB of "
                   "write-backs do not cross DRAM")
        writer = {name: _label(producers[k.anchor], k) for k, st in zip(kernels, steps) for name, _ in st.writes}
        return PassResult(graph, changed, summary, tuple(self._layer_notes(plan, writer)))

    def _layer_notes(self, plan: L2Plan, writer: dict[str, str]) -> list[Note]:
        """Which layers' activations stay in L2 and which spill (largest tensor named)."""
        layers: dict[str, list[int]] = {}   # layer -> [resident, spilled, largest spilled bytes]
        for names, where in ((plan.resident, 0), (plan.spilled, 1)):
            for name, nbytes in names.items():
                if name not in writer:
                    continue
                row = layers.setdefault(writer[name], [0, 0, 0])
                row[where] += 1
                if where:
                    row[2] = max(row[2], nbytes)
        kept = [k for k, (r, s, _) in layers.items() if r and not s]
        mixed = [k for k, (r, s, _) in layers.items() if r and s]
        out = [k for k, (r, s, _) in layers.items() if s and not r]
        notes = []
        cap = f"{plan.capacity / MB:,.1f} MB"
        if kept:
            notes.append(self.note("", f"{_join(kept)} activations stay in L2 between their kernels (l2_optimize)"))
        for k in mixed:
            r, s, big = layers[k]
            notes.append(self.note("", f"{k}: {r} activations stay in L2, {s} reach DRAM (largest {big / MB:,.1f} MB; "
                                       f"L2 {cap}, shared with the weights and tensors in flight)"))
        if out:
            big = max(layers[k][2] for k in out)
            notes.append(self.note("", f"{_join(out)} activations reach DRAM (largest {big / MB:,.1f} MB; L2 {cap}): "
                                       "too large, or read by a kernel that reads DRAM, or a graph output"))
        return notes


def _label(anchor: Node, kernel: Kernel) -> str:
    """The layer a kernel belongs to ("layer3.*"), or its operator when it has no module (a TransData)."""
    return layer_of(anchor.module) if anchor.module else kernel.name.split(":")[0]


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


__all__ = ["L2Residency", "kernel_steps", "l2_capable", "layer_of"]
