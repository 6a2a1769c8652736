"""Int8 quantisation of Cube kernels (post-training, per-tensor activation scales).

At precision "int8" every Cube kernel (convolution, linear, matmul) multiplies int8 operands with
int32 accumulation and dequantises its result to fp16 on the way out (a FixPipe stage on 910B, a
VCONV in the Vector epilogue on 910A / 310P: `pypto_lab.hw.capabilities` places it). Weights are
quantised ahead of time. Activations must arrive as int8:

* a Cube kernel whose output another Cube kernel reads requantises it in its own epilogue
  (FixPipe's quant stage, or one more VCONV on the Vector unit), so its Cube readers read int8
  and pay nothing. Read only by Cube kernels, it writes int8 alone; read by other kernels too (a
  residual add, a pooling) it writes its fp16 result and an int8 copy beside it (CANN's
  double-output quant fusion, e.g. conv + dequant + add + ReLU + quant);
* any other input (a graph input, a Vector kernel's output) costs a quantise pass over it
  before the Cube kernel that reads it (``CubeKernel.quantize_input``).

Attention's score and probability matmuls stay fp16. Numerics live in `pypto_lab.hw.numerics`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..hw.capabilities import capabilities
from ..kernels.ir import CubeKernel, InputQuant
from ..lowering.lower import with_epilogue
from .base import Pass, PassContext, PassResult, register


def _through_views(name: str, producers: dict[str, Node]) -> str:
    """The node that computed ``name``, looking through views."""
    while name in producers and producers[name].is_view and producers[name].inputs:
        name = producers[name].inputs[0]
    return name


def _readers(name: str, users: dict[str, list[Node]]) -> list[Node]:
    """The nodes that read ``name``, looking through views."""
    out = []
    for u in users.get(name, []):
        out.extend(_readers(u.name, users) if u.is_view else [u])
    return out


@register
@dataclass(frozen=True)
class QuantizeInt8(Pass):
    name: ClassVar[str] = "quantize_int8"
    requires: ClassVar[tuple[str, ...]] = ("map_ops", "mixed_precision")  # after the fusions: fused kernels

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.precision != "int8":
            return PassResult(graph, modified=False, summary=f"precision {ctx.precision}: no int8 quantisation")
        caps = capabilities(ctx.chip)
        producers, users = graph.producers(), graph.users()
        outputs = set(graph.outputs)
        cube = {n.name for n in graph.nodes if isinstance(n.kernel, CubeKernel)}
        # the node whose output leaves each Cube kernel: the last member read outside the kernel
        leaves: dict[str, str] = {}
        for n in graph.nodes:
            if n.anchor in cube and (n.name in outputs or any(u.anchor != n.anchor for u in users.get(n.name, []))):
                leaves[n.anchor] = n.name
        requant, int8_only = set(), set()
        for anchor, out in leaves.items():
            readers = _readers(out, users)
            if any(r.name in cube for r in readers):
                requant.add(anchor)
                if out not in outputs and all(r.name in cube for r in readers):
                    int8_only.add(anchor)
        quantised = 0
        for node in graph.nodes:
            if node.name not in cube:
                continue
            spec = node.kernel
            if spec.dtype != "int8":
                spec = with_epilogue(replace(spec, dtype="int8", out_dtype="fp16"), caps, dequant=True)
            if node.name in requant:
                spec = with_epilogue(replace(spec, out_dtype="int8" if node.name in int8_only else spec.out_dtype),
                                     caps, quant=True)
            src = producers.get(_through_views(node.inputs[0], producers)) if node.inputs else None
            fed_int8 = src is not None and src.anchor in requant
            if spec.quantize_input is None and not fed_int8 and node.inputs:
                info = graph.info(node.inputs[0])
                if info is not None and info.numel:
                    spec = replace(spec, quantize_input=InputQuant(info.numel, info.shape[-1]))
                    quantised += 1
            node.kernel = spec
        return PassResult(graph, modified=bool(cube), summary=(
            f"{len(cube)} Cube kernels in int8 (int32 accumulation, dequantised to fp16); {len(requant)} requantise "
            f"their output in their epilogue for the Cube kernels that read it ({len(requant) - len(int8_only)} "
            f"beside an fp16 copy for their other readers), {quantised} quantise an fp16 input first"))
