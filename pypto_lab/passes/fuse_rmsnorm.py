"""RMSNorm as one kernel (CANN's RmsNorm), with the residual add in front of it (AddRmsNorm).

A model writes RMSNorm as ATen ops: ``x.to(fp32)``, ``pow(2)``, ``mean(-1, keepdim=True)``,
``+ eps``, ``rsqrt``, ``x * r``, ``.to(dtype)``, ``weight * y`` (transformers' LlamaRMSNorm and its
kin), each its own Vector kernel reading and writing GM. This pass finds that chain from its
``rsqrt`` and makes it one kernel: the ``rmsnorm`` Vector operator over rows of the hidden size,
computing in fp32 as the model's own numerics do. When the norm's input is a residual ``add`` and
the stack applies ``add_layernorm``, the add joins it (``npu_add_rms_norm`` writes both the sum,
which the residual stream reads on, and the norm) — the spec the LLM engine costs its AddRmsNorm
with, so both paths agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..capture.graph import Graph, Node
from ..kernels.ir import VectorKernel
from .base import Pass, PassContext, PassResult, register
from .patterns import Walker, in_order, make_kernel


def _is_scalar_add(w: Walker, node: Node | None) -> bool:
    return node is not None and w.op(node) == "add" and len(w.tensor_inputs(node)) == 1


def _match(w: Walker, rsqrt: Node) -> tuple[list[Node], Node, Node, str] | None:
    """(members, the first member reading x, the weight multiply, x) of the RMSNorm around
    ``rsqrt``, or None."""
    eps = w.producer(rsqrt.inputs[0])
    if not _is_scalar_add(w, eps) or not w.free(eps):
        return None
    mean = w.producer(eps.inputs[0])
    if mean is None or w.op(mean) != "mean" or not w.free(mean):
        return None
    sq = w.producer(mean.inputs[0])
    if sq is None or not w.free(sq) or not (
            (w.op(sq) == "pow" and len(sq.args) > 1 and sq.args[1] == 2)
            or (w.op(sq) == "mul" and len(set(sq.inputs)) == 1)):
        return None
    x = w.source(sq.inputs[0])
    members = [sq, mean, eps, rsqrt]
    cast_in = w.producers.get(x)
    if cast_in is not None and w.op(cast_in) in ("to", "_to_copy") and w.free(cast_in):
        members.insert(0, cast_in)
        x = w.source(cast_in.inputs[0])
    scale = next((r for r in w.readers(rsqrt) if w.op(r) == "mul" and w.free(r)), None)
    if scale is None:
        return None
    members.append(scale)
    tail = scale
    readers = w.readers(tail)
    if len(readers) == 1 and w.op(readers[0]) in ("to", "_to_copy") and w.free(readers[0]):
        tail = readers[0]
        members.append(tail)
        readers = w.readers(tail)
    if len(readers) == 1 and w.op(readers[0]) == "mul" and w.free(readers[0]):
        other = [w.graph.info(i) for i in w.tensor_inputs(readers[0]) if w.source(i) != tail.name]
        if len(other) == 1 and other[0] is not None and len(other[0].shape) == 1:   # the weight, a vector
            tail = readers[0]
            members.append(tail)
    return members, members[0], tail, x


@register
@dataclass(frozen=True)
class FuseRmsNorm(Pass):
    name: ClassVar[str] = "fuse_rmsnorm"
    fusion: ClassVar[str] = "layernorm"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        w = Walker(graph)
        norms = with_add = 0
        for node in list(graph.nodes):
            if w.op(node) != "rsqrt" or not w.free(node):
                continue
            found = _match(w, node)
            if found is None:
                continue
            members, _, tail, x = found
            info = graph.info(x)
            if info is None or not info.shape:
                continue
            hidden = info.shape[-1]
            dtype = members[-1].kernel.dtypes[0] if members[-1].kernel is not None else "fp16"
            residual = w.producers.get(x)
            ops, inputs, op_name = ("rmsnorm",), None, "RmsNorm"
            if (ctx.applies("add_layernorm") and residual is not None and w.op(residual) == "add"
                    and len(w.tensor_inputs(residual)) == 2 and w.free(residual)):
                members.insert(0, residual)
                ops, inputs, op_name = ("add", "rmsnorm"), 3, "AddRmsNorm"
                with_add += 1
            spec = VectorKernel(op_name, ops, max(1, info.numel), dtype, "fp32", inputs, hidden)
            make_kernel(in_order(graph, members), spec, op_name, self.name)
            norms += 1
        return PassResult(graph, modified=bool(norms),
                          summary=f"fused {norms} RMSNorms into one kernel each ({with_add} with their residual add)")


__all__ = ["FuseRmsNorm"]
