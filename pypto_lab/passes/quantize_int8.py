"""Int8 quantisation of Cube operators (post-training, per-tensor scales).

At precision "int8" every Cube operator (convolution, linear, matmul) multiplies int8 operands
with int32 accumulation on the Cube and dequantises its int32 result to fp16 on the way out (in
FixPipe on 910B, in the Vector epilogue on 910A/310P). Weights are quantised ahead of time.
Activations must arrive as int8: a Cube kernel whose input comes from another Cube kernel gets
it requantised in that producer's epilogue (FixPipe's quant stage, or one more VCONV in a
Vector epilogue, not costed separately); any other input (a graph input, a Vector kernel's
output) costs a quantise pass over it, recorded as ``attrs["quantize_input"]``. Attention's
score and probability matmuls stay fp16. Numerics live in `pypto_lab.hw.numerics`.
"""

from __future__ import annotations

from ..capture.graph import Graph, Node
from .base import Pass, PassContext, PassResult, register


def _from_cube_kernel(name: str, producers: dict[str, Node], cube_groups: set) -> bool:
    """Whether ``name`` (looking through views) is the output of a Cube kernel, fused or not."""
    seen = 0
    while name in producers and seen < 64:
        node = producers[name]
        if node.attrs.get("unit") != "free" or not node.inputs:
            return node.attrs.get("unit") == "cube" or node.attrs.get("group") in cube_groups
        name, seen = node.inputs[0], seen + 1
    return False


@register
class QuantizeInt8(Pass):
    name = "quantize_int8"
    requires = ("map_ops", "mixed_precision")  # runs after the fusions: it looks at the fused kernels

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if ctx.precision != "int8":
            return PassResult(graph, modified=False, notes=[f"precision {ctx.precision}: no int8 quantisation"])
        producers = graph.producers()
        cube_groups = {n.attrs["group"] for n in graph.nodes if n.attrs.get("unit") == "cube" and n.attrs.get("group")}
        cube = quantise = 0
        for node in graph.nodes:
            if node.attrs.get("unit") == "cube":
                node.attrs["dtype"] = "int8"
                cube += 1
                if node.inputs and not _from_cube_kernel(node.inputs[0], producers, cube_groups):
                    node.attrs["quantize_input"] = True
                    quantise += 1
            elif node.attrs.get("unit") == "composite":
                node.attrs["dtype"] = "fp16"
        return PassResult(graph, modified=cube > 0, notes=[
            f"{cube} Cube operators in int8 (int32 accumulation, dequantised to fp16); {quantise} of them "
            f"quantise an fp16 input first, the rest get int8 from the producing Cube kernel's epilogue"])
