"""Lowering rules: how an ATen node becomes the kernel specs an untuned, unfused NPU operator
runs, and how a graph's annotated nodes become its list of kernels.

This is the one place that reads ATen argument positions and shapes to size a kernel (a
convolution's implicit GEMM, a linear layer's bias, an int8 layer's scale argument, the rows of a
reduction, the tensors a Vector kernel streams from GM). Which rule an op takes is its entry in
the lowering table (`pypto_lab.lowering.table`, written into ``node.npu`` by `map_ops`); a node of
a training step's joint graph is seen as a `Node` too (`pypto_lab.capture.fx_node.op_graph`), so
inference, LLM graphs and training lower through the same rules. `lower_all` gives every spec a
node runs as, `lower` the one spec ``node.kernel`` holds; every later pass refines it.
`kernels_of` reads only the typed annotations (``node.group``, ``node.kernel``).
"""

from __future__ import annotations

from dataclasses import replace
from math import lcm, prod

from ..capture.graph import Graph, Node
from ..hw.capabilities import CoreCapabilities, capabilities
from ..hw.chip import Chip
from ..hw.kernels import VECTOR_OPS, Im2col
from ..kernels.ir import (
    AttentionKernel,
    CubeKernel,
    Decomposed,
    HostKernel,
    InputQuant,
    Kernel,
    KernelSpec,
    VectorKernel,
)
from .masks import attention_is_causal
from .precision import Precision, as_precision

CONVS = ("conv2d", "convolution", "_convolution", "conv1d", "conv2d_int8")
# pypto_lab.quantization's int8 layers: int8 on the Cube whatever the precision; the value is the
# index of their input-scale argument (None there: a dynamic scale, a max-reduction over the input)
INT8_LAYERS = {"linear_int8": 4, "conv2d_int8": 8}
GROUPED_MATMULS = ("_grouped_mm", "grouped_mm_fallback")  # a mixture of experts' matmul (GroupedMatmul)


MAX_ROW = 2048   # the longest row a reduction keeps whole in UB here; longer rows reduce in segments


def storage_dtypes(chip: Chip, precision: str | Precision) -> tuple[str, str]:
    """(what the Cube multiplies, what GM holds for Vector kernels) at ``precision`` (a `Precision`,
    or an inference run's precision name: see `Precision.of_run`)."""
    p = as_precision(chip, precision)
    return p.cube, p.vector


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    info = graph.info(name)
    return info.shape if info is not None else ()


def conv_groups(node: Node) -> int:
    """The ``groups`` of a convolution node (1 for anything else)."""
    if node.op not in CONVS:
        return 1
    at = 8 if node.op in ("convolution", "_convolution") else 6  # aten.convolution has transposed, output_padding
    g = node.args[at] if len(node.args) > at else node.kwargs.get("groups", 1)
    return g if isinstance(g, int) and not isinstance(g, bool) and g > 0 else 1


def grouped_conv_gemm(groups: int, cin_g: int, cout_g: int, taps: int, m: int, c0: int = 16) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a grouped convolution as CANN's Conv2D runs it: ``enlarge`` groups are
    packed into one GEMM whose weight is block-diagonal, so that the packed input and output
    channels fill whole C0 blocks (ops/built-in/tbe/impl/conv2d.py in Huawei's canndev, mirrored in
    dengguojie/vue-element-admin at 54d4a81e796a: ``enlarge = min(lcm(lcm(cin, C0) // cin,
    lcm(cout, 16) // cout), groups)``, ``c1_opt = ceil(cin * enlarge / C0)``, ``cout1_opt =
    ceil(cout * enlarge / 16)``, ``group_opt = ceil(groups / enlarge)``). A depthwise convolution
    (one channel per group) packs 16 channels into each 16 x 16 fractal, the way TBE's
    depthwise_conv2d computes with a diagonal [C1, H, W, 16, 16] filter: ``groups / 16`` GEMMs of K =
    16 x taps, N = 16, of which 1/16 of the MACs is useful. ``taps`` = kh x kw; ``m`` = N x Ho x Wo."""
    enlarge = min(lcm(lcm(cin_g, c0) // cin_g, lcm(cout_g, 16) // cout_g), groups)
    c1_opt = -(-cin_g * enlarge // c0)
    cout1_opt = -(-cout_g * enlarge // 16)
    group_opt = -(-groups // enlarge)
    return group_opt, m, c1_opt * c0 * taps, cout1_opt * 16


def gemm_dims(graph: Graph, node: Node) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a Cube ATen node (a convolution as implicit GEMM; a grouped one as CANN
    packs its groups, `grouped_conv_gemm`)."""
    op = node.op
    if op in CONVS:
        x, w = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        out = node.outputs[0].shape
        groups = conv_groups(node)
        spatial = prod(out[2:]) if len(out) > 2 else 1
        if groups > 1:
            c0 = 32 if op in INT8_LAYERS else 16
            dims = grouped_conv_gemm(groups, max(1, x[1] // groups), max(1, w[0] // groups), prod(w[2:]),
                                     out[0] * spatial, c0)
        else:
            dims = 1, out[0] * spatial, x[1] * prod(w[2:]), w[0]
    elif op in ("linear", "linear_int8"):
        x, w = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        dims = 1, prod(x[:-1]), x[-1], w[0]
    elif op == "addmm":
        a, b = _shape(graph, node.inputs[1]), _shape(graph, node.inputs[2])
        dims = 1, a[0], a[1], b[1]
    elif op in GROUPED_MATMULS:
        # S tokens (sorted by expert) times their expert's [K, N] weight. How many tokens each expert
        # gets is data, not shape: costed as spread evenly over as many experts as there are tokens
        # (at most E), each such expert a batch entry whose whole weight is read
        x, w = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        experts = min(w[0], x[0]) if x[0] else 1
        dims = experts, -(-x[0] // max(experts, 1)), x[-1], w[-1]
    else:
        a, b = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        if len(a) == 1:
            a = (1, *a)
        if len(b) == 1:
            b = (*b, 1)
        batch = prod(a[:-2]) if len(a) > 2 else (prod(b[:-2]) if len(b) > 2 else 1)
        dims = batch, a[-2], a[-1], b[-1]
    return tuple(max(int(d), 1) for d in dims)


def _has_bias(node: Node) -> bool:
    """A bias argument the Cube kernel adds (linear, addmm, a convolution or an int8 layer with one)."""
    op = node.op
    if op == "addmm":
        return True
    if op in ("linear",) or op in CONVS or op in INT8_LAYERS:
        return len(node.args) > 2 and node.args[2] is not None
    return False


def useful_macs(graph: Graph, node: Node) -> int:
    """The MACs a grouped convolution needs (0 for any other Cube node: all it computes is useful):
    N x Ho x Wo x C_out x (C_in / groups) x kh x kw."""
    groups = conv_groups(node)
    if groups == 1:
        return 0
    x, w, out = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1]), node.outputs[0].shape
    return int(prod(out) * (x[1] // groups) * prod(w[2:]))


def cube_kernel(graph: Graph, node: Node, chip: Chip, precision: str | Precision) -> CubeKernel:
    """The Cube kernel of a matmul or convolution node, unfused: bias (if any) in its epilogue."""
    caps = capabilities(chip)
    batch, m, k, n = gemm_dims(graph, node)
    op = node.npu.name if node.npu is not None else "MatMulV2"
    useful = useful_macs(graph, node)
    if node.op in INT8_LAYERS:  # int8 weights and activations, dequantised to fp16 on the way out
        x = graph.info(node.inputs[0])
        scale_at = INT8_LAYERS[node.op]
        dynamic = len(node.args) > scale_at and node.args[scale_at] is None
        quant = InputQuant(x.numel, x.shape[-1], dynamic) if x is not None and x.numel else None
        return CubeKernel(op, batch, m, k, n, "int8", "fp16", caps.place(bias=_has_bias(node), dequant=True),
                          quantize_input=quant, im2col=conv_im2col(graph, node), useful_macs=useful)
    p = as_precision(chip, precision)
    return CubeKernel(op, batch, m, k, n, p.cube, p.cube_out, caps.place(bias=_has_bias(node)),
                      im2col=conv_im2col(graph, node), useful_macs=useful)


def conv_im2col(graph: Graph, node: Node) -> Im2col | None:
    """A 2-D convolution's geometry for its load3d A reads (None for other Cube ops)."""
    if node.op not in CONVS:
        return None
    x, w, out = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1]), node.outputs[0].shape
    if len(x) != 4 or len(w) != 4 or len(out) != 4:
        return None
    stride = node.args[3] if len(node.args) > 3 else node.kwargs.get("stride", 1)
    s = stride[0] if isinstance(stride, (list, tuple)) and stride else stride
    s = s if isinstance(s, int) and s > 0 else 1
    return Im2col(int(x[3]), int(out[3]), int(w[2]), int(w[3]), s)


def streamed_inputs(graph: Graph, nodes: list[Node], numel: int) -> list[str]:
    """Inputs from outside the kernel that stream through it: tensors at least an eighth of the
    kernel's size (per-channel parameters such as BatchNorm's, a broadcast scale, are small and
    stay in UB)."""
    inside = {n.name for n in nodes}
    seen = []
    for n in nodes:
        for i in n.inputs:
            if i not in inside and i not in seen:
                info = graph.info(i)
                if info is not None and info.numel * 8 >= numel:
                    seen.append(i)
    return seen


def stream_count(sizes: list[int], numel: int) -> int:
    """How many ``numel``-element streams a Vector kernel of ``numel`` elements moves for tensors of
    ``sizes`` elements (what it reads from GM, or writes beyond its one output): each tensor of at
    least an eighth of ``numel`` counts for its size, at most one stream (a gather reads only the
    rows it gathers, the pieces of a concat add up to one), and the sum is rounded up; smaller
    tensors stay in UB."""
    numel = max(1, numel)
    total = sum(min(s, numel) for s in sizes if s * 8 >= numel)
    return -(-total // numel)


def split_row(row: int | None) -> int | None:
    """A reduction over a row longer than UB holds runs as partial sums over segments of it (the
    second pass over the partial sums is negligible): the segment is the row's largest divisor
    up to `MAX_ROW` (`MAX_ROW` itself when no divisor is at least 64)."""
    if row is None or row <= MAX_ROW:
        return row
    best = max((d for d in range(1, MAX_ROW + 1) if row % d == 0), default=MAX_ROW)
    return best if best >= 64 else MAX_ROW


def flat_reduction(numel: int) -> tuple[int, int]:
    """(elements, row length) of a reduction over a flat buffer of ``numel`` elements (all of a
    step's gradients, say): rows of `MAX_ROW`, the last one padded."""
    row = min(MAX_ROW, max(1, numel))
    return -(-numel // row) * row, row


def vector_spec(op: str, ops: tuple[str, ...], numel: int, dtype: str, compute_dtype: str, inputs: int | None,
                row_len: int | None = None) -> VectorKernel:
    """A `VectorKernel`, its rows split into segments UB holds (`split_row`; the last segment of a
    row with no divisor near `MAX_ROW` padded)."""
    numel = max(1, numel)
    row_len = split_row(row_len) if any(VECTOR_OPS[o].row_wise for o in ops) else None
    if row_len and numel % row_len:
        numel = -(-numel // row_len) * row_len
    return VectorKernel(op, ops, numel, dtype, compute_dtype, inputs, row_len)


def _rows(graph: Graph, node: Node, numel: int) -> int:
    """The row a row-wise operator of ``node`` works along (its entry's ``rows``): the elements
    reduced into each output element ("reduced": a sum or mean over some dimensions), the last
    dimension of its output ("output": a pooling gradient), else the last dimension of its input."""
    inp = graph.info(node.inputs[0]) if node.inputs else None
    out = node.outputs[0] if node.outputs else None
    rows = node.npu.rows if node.npu is not None else ""
    if rows == "reduced" and inp is not None and out is not None:
        return max(1, inp.numel // max(1, out.numel))
    if rows == "output" and out is not None:
        inp = out
    shape = inp.shape if inp is not None else (numel,)
    return shape[-1] if shape and shape[-1] and numel % shape[-1] == 0 else numel


def vector_kernel(graph: Graph, nodes: list[Node], dtype: str, compute_dtype: str) -> VectorKernel:
    """One Vector kernel doing the work of ``nodes`` (a single operator, or a fused chain with the
    views between its members): each member's vector operators on every tile, reading the tensors
    that stream in from GM (`stream_count`) and writing the last member's output once."""
    work = [n for n in nodes if n.unit in ("vector", "move")]
    ops = tuple(o for n in work for o in (n.npu.vector_ops or ("copy",)))
    last = work[-1]
    out = last.outputs[0] if last.outputs else None
    inp = graph.info(work[0].inputs[0]) if work[0].inputs else None
    reads_more = inp is not None and work[0].npu.sized_by_input
    numel = max(out.numel if out else 1, inp.numel if reads_more else 0, 1)
    row_len = None
    row_node = next((n for n in work if any(VECTOR_OPS[o].row_wise for o in n.npu.vector_ops)), None)
    if row_node is not None:
        row_len = _rows(graph, row_node, numel)
    if len(work) == 1 and work[0].npu.reads is not None:
        inputs = work[0].npu.reads
    else:
        infos = [graph.info(i) for i in streamed_inputs(graph, work, numel)]
        inputs = stream_count([i.numel for i in infos], numel)
    names = "+".join(dict.fromkeys(n.npu.name for n in work))
    return vector_spec(names, ops, numel, dtype, compute_dtype, inputs, row_len)


def primitive_kernels(node: Node, prims: list[str], dtype: str, compute_dtype: str) -> Decomposed:
    """A composite run as primitive Vector kernels over its output, one GM round trip each."""
    out = node.outputs[0]
    numel = max(out.numel, 1)
    row = out.shape[-1] if out.shape else 1
    parts = tuple(VectorKernel(node.npu.name, (p,), numel, dtype, compute_dtype, None,
                               row if VECTOR_OPS[p].row_wise else None) for p in prims)
    return Decomposed(node.npu.name, parts)


def attention_kernel(graph: Graph, node: Node, chip: Chip, precision: str) -> AttentionKernel:
    """Scaled-dot-product attention, unfused: Q K^T and P V on the Cube with the scores in GM.
    Its matmuls keep fp16 at int8 (scores and probabilities are not quantised). A causal one
    (``is_causal``, or a mask built from positions: `masks.attention_is_causal`) is marked so, for
    FlashAttention to skip the blocks above the diagonal once fused."""
    q, kk = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
    dtype, _ = storage_dtypes(chip, precision)
    return AttentionKernel(prod(q[:-2]), q[-2], kk[-2], q[-1], dtype, causal=attention_is_causal(graph, node))


def host_kernel(graph: Graph, node: Node) -> HostKernel:
    infos = [graph.info(x) for x in node.inputs]
    return HostKernel(node.target, sum(i.nbytes for i in infos if i is not None),
                      sum(o.nbytes for o in node.outputs))


def gemm_operands(graph: Graph, node: Node) -> list[int]:
    """Element counts of a Cube node's two operands (an addmm's come after its bias)."""
    names = node.inputs[1:3] if node.op == "addmm" else node.inputs[:2]
    infos = [graph.info(i) for i in names]
    return [i.numel for i in infos if i is not None]


def cast_kernel(numel: int, what: str) -> VectorKernel:
    """An AMP cast of ``numel`` elements (read and written as fp32 for the cost: the wider side)."""
    return VectorKernel(f"Cast({what})", ("cast",), max(1, numel), "fp32", "fp32", 1)


def with_casts(specs: list[KernelSpec], precision: Precision, ins: list[int], out: int) -> list[KernelSpec]:
    """``specs`` of a Cube op, with apex O1's casts when the precision asks for them: its fp32
    inputs (``ins`` elements each) cast to half before it, its output (``out`` elements) back to
    fp32 after it."""
    if not precision.casts_around_cube:
        return specs
    pre = [cast_kernel(n, "to half") for n in ins if n]
    return pre + specs + ([cast_kernel(out, "to fp32")] if out else [])


def lower_all(graph: Graph, node: Node, chip: Chip, precision: str | Precision) -> list[KernelSpec]:
    """Every kernel spec ``node`` runs as on its own on ``chip`` at ``precision``, by its table entry
    (``node.npu``): none for a view or bookkeeping, the host fallback for an op the table does not
    know, the entry's own rule, else the rule of its unit."""
    entry = node.npu
    unit = entry.unit if entry is not None else None
    if unit in (None, "free"):
        return []
    if unit == "cpu":
        return [host_kernel(graph, node)]
    p = as_precision(chip, precision)
    if entry.lower is not None:
        made = entry.lower(graph, node, chip, p)
        return list(made) if isinstance(made, (list, tuple)) else [made]
    if unit == "cube":
        out = node.outputs[0].numel if node.outputs else 0
        return with_casts([cube_kernel(graph, node, chip, p)], p, gemm_operands(graph, node), out)
    if unit == "composite":
        return [attention_kernel(graph, node, chip, p)]
    return [vector_kernel(graph, [node], p.vector, p.stats if entry.fp32 else p.vector)]


def lower(graph: Graph, node: Node, chip: Chip, precision: str | Precision) -> KernelSpec | None:
    """The spec of ``node`` run as its own kernel (None for a view): `lower_all`'s one spec, or a
    `Decomposed` of them when the op runs as several CANN kernels."""
    specs = lower_all(graph, node, chip, precision)
    if not specs:
        return None
    return specs[0] if len(specs) == 1 else Decomposed(node.npu.name, tuple(specs))


def with_epilogue(spec: CubeKernel, caps: CoreCapabilities, **stages) -> CubeKernel:
    """``spec`` with some epilogue stages changed, every stage placed again for the core version."""
    e = spec.epilogue
    now = {"bias": e.bias, "dequant": e.dequant, "residual": e.residual, "activation": e.activation,
           "quant": e.quant}
    now.update(stages)
    return replace(spec, epilogue=caps.place(**now))


# ---- the kernels of a graph -----------------------------------------------------------------------

def kernel_name(anchor: Node, spec: KernelSpec) -> str:
    """"Conv2D:layer1.0.conv1": the NPU operator a kernel runs and where it comes from."""
    where = anchor.module or anchor.name
    if spec.unit == "cpu":
        return f"cpu:{anchor.op}:{where}"
    if isinstance(spec, AttentionKernel):
        return f"{spec.op if not spec.flash else anchor.npu.name}:{where}"
    name = anchor.npu.name if anchor.npu is not None and anchor.npu.name else getattr(spec, "op", anchor.op)
    return f"{name}:{where}"


def kernels_of(graph: Graph) -> list[Kernel]:
    """The graph's kernels in the order of their first node: each group of nodes (``node.group``)
    or single node with a spec; a Decomposed composite gives one kernel per primitive."""
    members: dict[str, list[Node]] = {}
    order: list[str] = []
    for n in graph.nodes:
        key = n.group or n.name
        if n.group is None and n.kernel is None:
            continue  # a view, or a node not lowered yet
        if key not in members:
            members[key] = []
            order.append(key)
        members[key].append(n)
    producers = graph.producers()
    out: list[Kernel] = []
    for key in order:
        anchor = producers[key]
        spec = anchor.kernel
        if spec is None:
            raise ValueError(f"kernel {key!r} has members but its anchor has no spec: a pass grouped nodes "
                             "under a node it did not lower")
        nodes = tuple(n.name for n in members[key])
        ops = tuple(n.target for n in members[key] if n.unit != "free")
        if isinstance(spec, Decomposed):
            for i, part in enumerate(spec.parts):
                out.append(Kernel(f"{spec.op}.{i}:{anchor.module or anchor.name}", part, nodes,
                                  tuple(f"{t} ({p})" for t in ops for p in getattr(part, "ops", ())), key))
        else:
            out.append(Kernel(kernel_name(anchor, spec), spec, nodes, ops, key))
    return out


__all__ = ["CONVS", "INT8_LAYERS", "MAX_ROW", "attention_kernel", "cast_kernel", "conv_groups", "cube_kernel",
           "flat_reduction", "gemm_dims", "grouped_conv_gemm", "useful_macs",
           "gemm_operands", "host_kernel", "kernels_of", "lower", "lower_all", "primitive_kernels", "split_row",
           "storage_dtypes", "stream_count", "streamed_inputs", "vector_kernel", "vector_spec", "with_casts",
           "with_epilogue"]
