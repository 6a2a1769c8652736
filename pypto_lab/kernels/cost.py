"""Kernels of a mapped (and possibly fused) graph, and their simulated cost on a chip.

A kernel is a group of nodes (``node.attrs["group"]``, set by the fusion passes) or a single
node; views ("free") make no kernel of their own. Each kernel is costed by the chip model:
Cube kernels (conv as implicit GEMM, linear, matmul, bmm) with `simulate_matmul` and the
epilogue their group fused (ReLU/bias on FixPipe, anything else on the Vector unit); vector
kernels with `simulate_vector` on the fused chain of their ops; data movement as a GM->UB->GM
copy; attention with `simulate_attention` (fused FlashAttention once `fuse_attention` marked it).
CPU-lane nodes are listed, not costed on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

from ..capture.graph import Graph, Node
from ..hw.attention import simulate_attention
from ..hw.chip import Chip, get_chip
from ..hw.kernels import KernelReport, fuse_vector_ops, simulate_matmul, simulate_vector
from ..hw.tiling import CubeTile

FIXPIPE_ACTIVATIONS = {"relu", "relu_"}
# pypto_lab.quantization's int8 layers: always int8 on the Cube; the value is the index of their
# input-scale argument (None: a dynamic scale, found by a max-reduction over the input first)
INT8_OPS = {"linear_int8": 4, "conv2d_int8": 8}

# Simulations are deterministic functions of their arguments: a model repeats the same kernel
# shapes many times (ResNet's bottlenecks, BERT's layers) and every pass snapshot costs the graph
# again, so each distinct kernel is simulated once per chip object.
_MEMO: dict[tuple, KernelReport] = {}
_MEMO_LIMIT = 20_000


def _memo(fn, chip: Chip, *args, **kwargs) -> KernelReport:
    key = (fn.__name__, id(chip), chip.name, args, tuple(sorted(kwargs.items())))
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        hit = _MEMO[key] = fn(*args, chip=chip, **kwargs)
        _CHIPS_ALIVE[id(chip)] = chip  # keep the chip alive while its id is a key
    return hit


_CHIPS_ALIVE: dict[int, Chip] = {}


@dataclass
class KernelCost:
    """One kernel of a model and what the simulator says it costs."""

    name: str
    unit: str
    nodes: list[str]
    fused_ops: list[str]
    cycles: float
    time_us: float
    gm_bytes: float
    tile: dict[str, Any]
    reports: list[KernelReport] = field(default_factory=list, repr=False)
    resources: tuple[str, ...] = ()  # the cores it occupies: ("AIC",), ("AIV",), both, ("AI Core",) or ("host",)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "fused_ops": list(self.fused_ops),
                "cycles": self.cycles, "time_us": self.time_us, "gm_bytes": self.gm_bytes,
                "tile": dict(self.tile)}


def kernels_of(graph: Graph) -> list[list[Node]]:
    """Nodes grouped into kernels, in the order of their first node; views alone make none."""
    groups: dict[str, list[Node]] = {}
    order: list[str] = []
    for n in graph.nodes:
        key = n.attrs.get("group")
        if key is None:
            if n.attrs.get("unit") in ("free", None):
                continue
            key = n.name
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(n)
    return [groups[k] for k in order if any(m.attrs.get("unit") not in ("free",) for m in groups[k])]


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    info = graph.info(name)
    return info.shape if info is not None else ()


def _gemm_dims(graph: Graph, node: Node) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a Cube node."""
    if node.target.startswith("pypto_lab_user."):  # a Cube custom op: its output is C, K from its flops
        from ..custom_ops import gemm_dims
        return gemm_dims(graph, node)
    op = node.op
    if op in ("conv2d", "convolution", "_convolution", "conv1d", "conv2d_int8"):
        x, w = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        out = node.outputs[0].shape
        groups = int(node.args[6]) if len(node.args) > 6 and isinstance(node.args[6], int) else 1
        spatial = prod(out[2:]) if len(out) > 2 else 1
        return groups, out[0] * spatial, (x[1] // groups) * prod(w[2:]), w[0] // groups
    if op in ("linear", "linear_int8"):
        x, w = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
        return 1, prod(x[:-1]), x[-1], w[0]
    if op == "addmm":
        a, b = _shape(graph, node.inputs[1]), _shape(graph, node.inputs[2])
        return 1, a[0], a[1], b[1]
    a, b = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
    if len(a) == 1:
        a = (1, *a)
    if len(b) == 1:
        b = (*b, 1)
    batch = prod(a[:-2]) if len(a) > 2 else (prod(b[:-2]) if len(b) > 2 else 1)
    return batch, a[-2], a[-1], b[-1]


def _cube_dtype(chip: Chip, precision: str) -> str:
    return precision if chip.cube.supports(precision) else "fp16"


def _streamed_inputs(graph: Graph, nodes: list[Node], numel: int) -> list[str]:
    """Inputs from outside the kernel that stream through it: tensors at least an eighth of the
    output's size (per-channel parameters such as BatchNorm's are small and stay in UB)."""
    inside = {n.name for n in nodes}
    seen = []
    for n in nodes:
        for i in n.inputs:
            if i not in inside and i not in seen:
                info = graph.info(i)
                if info is not None and info.numel * 8 >= numel:
                    seen.append(i)
    return seen


def gemm_of(graph: Graph, anchor: Node, chip: Chip, precision: str) -> tuple[int, int, int, int, str]:
    """(batch, M, K, N, dtype) of a Cube node: the dtype the precision passes chose, else the precision's."""
    batch, m, k, n = _gemm_dims(graph, anchor)
    dtype = "int8" if anchor.op in INT8_OPS else anchor.attrs.get("dtype") or _cube_dtype(chip, precision)
    return max(batch, 1), max(m, 1), max(k, 1), max(n, 1), dtype


def _epilogue(nodes: list[Node], anchor: Node) -> str:
    others = [x.op for x in nodes if x is not anchor and x.attrs.get("unit") != "free"]
    has_bias = anchor.op in ("linear", "addmm") and len(anchor.inputs) > 2 or bool(anchor.attrs.get("folded_bn"))
    if not others:
        return "bias" if has_bias else "none"
    if all(o in FIXPIPE_ACTIVATIONS for o in others):
        return "bias_relu" if has_bias else "relu"
    return "vector" if any(o.startswith("add") for o in others) and len(others) <= 2 else "gelu"


def _cost_cube(graph: Graph, nodes: list[Node], anchor: Node, chip: Chip, precision: str) -> list[KernelReport]:
    batch, m, k, n, dtype = gemm_of(graph, anchor, chip, precision)
    tile = anchor.attrs.get("tile")
    kwargs = {"tile": tile} if isinstance(tile, CubeTile) else {}
    if dtype == "int8":  # dequantised to fp16 on the way out (FixPipe, or the Vector epilogue)
        kwargs["out_dtype"] = "fp16"
    reports = [_memo(simulate_matmul, chip, m, k, n, dtype=dtype, batch=batch, epilogue=_epilogue(nodes, anchor),
                     **kwargs)]
    int8_layer = INT8_OPS.get(anchor.op)
    if anchor.attrs.get("quantize_input") or int8_layer is not None:  # fp16 activations quantised to int8 first
        info = graph.info(anchor.inputs[0])
        dynamic = int8_layer is not None and len(anchor.args) > int8_layer and anchor.args[int8_layer] is None
        if dynamic and info is not None and info.numel:  # the dynamic scale: max |x| over the input
            reports.append(_memo(simulate_vector, chip, "max", info.numel, dtype="fp16", row_len=info.shape[-1],
                                 name=f"absmax {info.numel} fp16"))
        if info is not None and info.numel:
            reports.append(_memo(simulate_vector, chip, "cast", info.numel, dtype="fp16",
                                 name=f"quantize {info.numel} fp16->int8"))
    return reports


def attention_dtype(node: Node, chip: Chip, precision: str) -> str:
    """Attention's matmuls: the node's dtype or the precision's; int8 stays fp16 (scores and
    probabilities are not quantised)."""
    dtype = node.attrs.get("dtype") or _cube_dtype(chip, precision)
    return "fp16" if dtype == "int8" else dtype


def _cost_attention(graph: Graph, node: Node, chip: Chip, precision: str) -> list[KernelReport]:
    """Attention: FlashAttention (online softmax) once `fuse_attention` marked it, otherwise the
    unfused QK^T, scale + softmax and PV with the scores in GM."""
    q, kk = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
    dtype = attention_dtype(node, chip, precision)
    blocks = node.attrs.get("attention_blocks")
    kwargs = {"block_q": blocks[0], "block_k": blocks[1]} if blocks and node.attrs.get("flash") else {}
    return [_memo(simulate_attention, chip, prod(q[:-2]), q[-2], kk[-2], q[-1], dtype=dtype,
                  fused=bool(node.attrs.get("flash")), **kwargs)]


def _cost_vector(graph: Graph, nodes: list[Node], chip: Chip, precision: str) -> list[KernelReport]:
    work = [n for n in nodes if n.attrs.get("unit") in ("vector", "move")]
    ops = [n.attrs.get("vector_op") or "copy" for n in work]
    last = work[-1]
    out = last.outputs[0] if last.outputs else None
    inp = graph.info(work[0].inputs[0]) if work[0].inputs else None
    numel = max(out.numel if out else 1, inp.numel if (inp is not None and work[0].op in ("max_pool2d", "adaptive_avg_pool2d", "avg_pool2d", "sum", "mean", "amax", "max")) else 0, 1)
    vdt = precision if precision in ("fp16", "bf16", "fp32") else "fp16"
    cdt = "fp32" if any(n.attrs.get("compute_dtype") == "fp32" for n in work) else vdt
    spec = fuse_vector_ops(ops, len(_streamed_inputs(graph, work, numel)))
    row_len = None
    if spec.row_wise:
        shape = inp.shape if inp is not None else (numel,)
        row_len = shape[-1] if shape and numel % shape[-1] == 0 else numel
        if numel % row_len:
            row_len = numel
    return [_memo(simulate_vector, chip, spec, numel, dtype=vdt, row_len=row_len, name="+".join(ops),
                  compute_dtype=cdt)]


def _cost_host(graph: Graph, node: Node, chip: Chip) -> KernelCost:
    """An op the catalogue does not know runs on the host: its tensor inputs go device->host and its
    outputs host->device over the card's link (the CPU's own compute time is not modelled)."""
    nbytes = sum(i.nbytes for i in (graph.info(x) for x in node.inputs) if i is not None)
    nbytes += sum(o.nbytes for o in node.outputs)
    time_us = nbytes / (chip.host_link_gbps * 1e3) if chip.host_link_gbps else 0.0
    return KernelCost(name=f"cpu:{node.op}:{node.module or node.name}", unit="cpu", nodes=[node.name],
                      fused_ops=[node.target], cycles=time_us * chip.clock_mhz, time_us=time_us,
                      gm_bytes=float(nbytes), tile={}, reports=[], resources=("host",))


def _resources(chip: Chip, unit: str, reports: list[KernelReport], nodes: list[Node], anchor: Node) -> tuple[str, ...]:
    if not chip.split_cores:
        return ("AI Core",)
    if unit == "cube":
        vector_epilogue = _epilogue(nodes, anchor) in ("vector", "gelu") or len(reports) > 1
        return ("AIC", "AIV") if vector_epilogue else ("AIC",)
    return ("AIC", "AIV") if unit == "cube+vector" else ("AIV",)


def _kernel_op_name(anchor: Node) -> str:
    """The NPU operator a kernel is named after; attention not fused by `fuse_attention` runs as
    BatchMatMul, softmax and BatchMatMul with the scores in GM, and is named so."""
    if anchor.attrs.get("unit") == "composite" and not anchor.attrs.get("flash"):
        return "UnfusedAttention(BatchMatMul+SoftmaxV2+BatchMatMul)"
    return anchor.attrs.get("npu_op", anchor.op)


def cost_kernel(graph: Graph, nodes: list[Node], chip: Chip, precision: str = "fp16") -> KernelCost:
    if len(nodes) == 1 and nodes[0].attrs.get("unit") == "cpu":
        return _cost_host(graph, nodes[0], chip)
    custom = [n for n in nodes if n.target.startswith("pypto_lab_user.") and n.attrs.get("unit") != "cpu"]
    if custom:  # a user operator (`pypto_lab.custom_op`): costed from what it declared
        from ..custom_ops import cost_custom
        return cost_custom(graph, nodes, custom[0], chip, precision)
    cube = [n for n in nodes if n.attrs.get("unit") == "cube"]
    composite = [n for n in nodes if n.attrs.get("unit") == "composite"]
    if cube:
        reports, unit, anchor = _cost_cube(graph, nodes, cube[0], chip, precision), "cube", cube[0]
    elif composite:
        anchor = composite[0]
        reports, unit = _cost_attention(graph, anchor, chip, precision), "cube+vector"
    else:
        anchor = nodes[0]
        reports = _cost_vector(graph, nodes, chip, precision)
        unit = "vector" if any(n.attrs.get("unit") == "vector" for n in nodes) else "move"
    cycles = sum(r.cycles for r in reports)
    return KernelCost(
        name=_kernel_op_name(anchor) + ":" + (anchor.module or anchor.name),
        unit=unit, nodes=[n.name for n in nodes], fused_ops=[n.target for n in nodes if n.attrs.get("unit") != "free"],
        cycles=cycles, time_us=sum(r.time_us for r in reports), gm_bytes=sum(r.gm_bytes for r in reports),
        tile=dict(reports[0].tile), reports=reports, resources=_resources(chip, unit, reports, nodes, anchor),
    )


def _cost_decomposed(graph: Graph, node: Node, chip: Chip, precision: str) -> list[KernelCost]:
    """A composite split by the `decompose` pass: one kernel per primitive, each a GM round trip."""
    if node.attrs["decomposed"] == ["attention"]:
        return [cost_kernel(graph, [node], chip, precision)]
    out = node.outputs[0]
    vdt = precision if precision in ("fp16", "bf16", "fp32") else "fp16"
    cdt = node.attrs.get("compute_dtype") or vdt
    row = out.shape[-1] if out.shape else 1
    costs = []
    for i, prim in enumerate(node.attrs["decomposed"]):
        r = _memo(simulate_vector, chip, prim, max(out.numel, 1), dtype=vdt, row_len=row, compute_dtype=cdt)
        costs.append(KernelCost(
            name=f"{node.attrs.get('npu_op', node.op)}.{i}:{node.module or node.name}", unit="vector",
            nodes=[node.name], fused_ops=[f"{node.target} ({prim})"], cycles=r.cycles, time_us=r.time_us,
            gm_bytes=r.gm_bytes, tile=dict(r.tile), reports=[r],
            resources=("AIV",) if chip.split_cores else ("AI Core",)))
    return costs


def cost_graph(graph: Graph, chip: str | Chip, precision: str = "fp16") -> list[KernelCost]:
    """Every kernel of a mapped graph with its simulated cost, in execution order."""
    chip = get_chip(chip)
    costs: list[KernelCost] = []
    for nodes in kernels_of(graph):
        if len(nodes) == 1 and nodes[0].attrs.get("decomposed"):
            costs.extend(_cost_decomposed(graph, nodes[0], chip, precision))
        else:
            costs.append(cost_kernel(graph, nodes, chip, precision))
    return costs
