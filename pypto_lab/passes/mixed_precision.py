"""Mixed precision: lower the graph to fp16/bf16 but keep fp32 where the numerics need it.

Cube operators run in the precision asked for (what `optimize` resolved for the chip). Vector
operators store their tensors in the low precision too, except that softmax, the norms and the
sum-like reductions compute in fp32 in the Unified Buffer (loaded as fp16/bf16, widened with a
VCONV, narrowed again before the store), as CANN's mixed-precision lists and the seed article
advise ("Softmax 可能需要保持 fp32"). Each node gets ``attrs["dtype"]`` (what GM holds, or what
the Cube multiplies) and, where kept, ``attrs["compute_dtype"] = "fp32"``. At fp32 there is
nothing to lower and the pass changes nothing.
"""

from __future__ import annotations

from ..capture.graph import Graph
from ..capture.catalogue import aten_name
from .base import Pass, PassContext, PassResult, register

# ATen ops whose arithmetic stays in fp32 under mixed precision (softmax, norms, reductions)
FP32_KEPT = frozenset({
    "softmax", "_softmax", "log_softmax", "layer_norm", "native_layer_norm", "group_norm", "batch_norm",
    "_native_batch_norm_legit_no_training", "sum", "mean", "var", "norm", "cumsum", "prod",
})


@register
class MixedPrecision(Pass):
    name = "mixed_precision"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        low = ctx.precision
        if low == "fp32":
            return PassResult(graph, modified=False, notes=["precision fp32: nothing to lower"])
        vector_low = low if low in ("fp16", "bf16") else "fp16"
        kept: dict[str, int] = {}
        lowered = 0
        for node in graph.nodes:
            unit = node.attrs.get("unit")
            if unit == "cube":
                node.attrs["dtype"] = low
                lowered += 1
            elif unit in ("vector", "move", "composite"):
                node.attrs["dtype"] = vector_low if unit != "composite" else low
                lowered += 1
                op = aten_name(node.target)
                if op in FP32_KEPT:
                    node.attrs["compute_dtype"] = "fp32"
                    kept[op] = kept.get(op, 0) + 1
        note = f"{lowered} operators lowered to {low}" + (" (Vector in fp16)" if low == "int8" else "")
        if kept:
            note += ("; kept fp32 compute (fp32 in UB, " + vector_low + " in GM): "
                     + ", ".join(f"{op} x{c}" for op, c in sorted(kept.items())))
        notes = [note]
        return PassResult(graph, modified=True, notes=notes)
