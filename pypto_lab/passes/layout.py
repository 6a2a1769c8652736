"""Assign every tensor a device format and insert the format conversions (TransData) it needs.

The AI Core does not read plain row-major tensors everywhere: the Cube's convolution kernels
consume and produce activations in NC1HWC0 (5HD, C0 = 16 for fp16) and its matmul kernels
(linear, addmm, mm, matmul, bmm, ...) matrices in FRACTAL_NZ. Graph inputs and outputs are ND
(NCHW for 4-D). This pass walks the graph in order and gives each node's output a format:

* Cube convolutions: inputs and output NC1HWC0; Cube matmuls: activation inputs and output
  FRACTAL_NZ, except on 910B (AIC-C-220), whose MTE2 converts ND to NZ on the way into L1
  (DataCopy with Nd2NzParams) and whose FixPipe writes ND: there matmuls stay ND.
* LayerNorm over the last axis keeps FRACTAL_NZ when its input is NZ and the last two axes are
  multiples of 16 (CANN's LayerNorm kernel supports NZ there).
* Ops that need ND: softmax, layer norm otherwise, group norm, embedding and gathers, reductions (except pooling
  and a keepdim mean/sum over H and W of a 5HD tensor), views that change the logical layout
  (view, reshape, flatten, permute, transpose, select, slice, ...), data movement other than
  plain copies (pad, cat other than below, ...), attention and CPU fallbacks.
* A concatenation along C of 5HD tensors with whole C0 blocks stays 5HD; when every input comes
  from a Cube kernel that nothing else reads, it is written in place (no kernel at all; FE's
  ConvConcatFusionPass, strided writes). Otherwise it still runs no kernel when its inputs can
  share its buffer (GE's ConcatNotaskPass, `concat_no_task`): everything before the concatenated
  axis is 1 (a batch of 1 for a channel concatenation), no input is a graph input or weight, is
  read by the graph's output, comes twice, or already lives in another such buffer. A
  DenseNet block's reused features meet the last rule only in the first concatenation that takes
  them; every later one copies (ConcatD), as CANN's rule says.
* Everything else (element-wise Vector ops, pooling, unfolded BatchNorm, dropout, copies) is
  format-agnostic: it takes the format of its first activation input; other activation inputs
  in another format are converted to it (or, when that format does not fit their rank, every
  input goes ND).

Which formats the Cube's kernels read on a core version, and whether MTE2 converts ND to NZ on
load, come from the chip's capability table (`pypto_lab.hw.capabilities`). Where a node needs an
input in a format its producer does not give, a TransData node (target ``pypto.transdata``, unit
"move", a `TransDataKernel`: a GM->UB->GM copy) is inserted right before the first node that
needs it and shared by every later node needing the same (tensor, format). Graph outputs not in
ND get a final TransData. Then round trips (a TransData A->B reading a TransData B->A) are
removed. Parameters and buffers are never converted in the graph: weights are converted once,
offline, to the Cube's weight formats.

Each node records its output format in ``node.format`` and the formats of the activations it
reads in ``node.input_formats``; a Cube kernel's spec gets the GM formats of its A operand and of
its result (``CubeKernel.a_format`` / ``c_format``); a TransData's spec names its source and
destination formats.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..capture.catalogue import NpuOp, aten_name
from ..capture.graph import Graph, Node, TensorInfo
from ..hw.capabilities import NC1HWC0, ND, NZ, capabilities
from ..hw.chip import DTYPE_BYTES
from ..kernels.ir import CubeKernel, TransDataKernel, TransposeKernel, VectorKernel
from ..lowering.lower import storage_dtypes
from .base import Pass, PassContext, PassResult, register
from .fold_batchnorm import CONVS

TRANSDATA = "pypto.transdata"
TRANSDATA_OP = NpuOp("TransData", "move", ("copy",))
TRANSPOSE_OP = NpuOp("TransposeD", "move", ("copy",))
RESHAPES = frozenset({"view", "reshape", "_unsafe_view", "flatten", "unflatten"})
TRANSPOSES = frozenset({"permute", "transpose"})

MATMUL_OPS = frozenset({"linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "einsum"})
# Vector ops that need ND (they work along the last axis or gather rows)
ND_VECTOR_OPS = frozenset({"softmax", "_softmax", "log_softmax", "layer_norm", "native_layer_norm", "group_norm",
                           "embedding", "index_select", "gather", "cumsum", "argmax", "norm"})
REDUCTIONS = frozenset({"sum", "mean", "amax", "max", "amin", "min", "prod", "var"})
POOLS = frozenset({"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"})
# views and copies that leave the layout alone: they pass their input's format through
PASS_THROUGH = frozenset({"dropout", "alpha_dropout", "clone", "alias", "detach", "identity", "lift_fresh_copy",
                          "getitem", "contiguous", "copy", "copy_"})


# CANN's LayerNorm takes and gives FRACTAL_NZ when it normalises the last axis and the last two
# axes are multiples of 16 (op_select_format of the TBE layer_norm kernel Huawei open-sourced,
# "_division_sixteen"): a matmul's NZ output feeds it without a TransData.
NZ_LAYER_NORMS = frozenset({"layer_norm", "native_layer_norm"})


def _nz_layer_norm(node: Node, info: TensorInfo | None) -> bool:
    if info is None or len(info.shape) < 2 or info.shape[-1] % 16 or info.shape[-2] % 16:
        return False
    normalized = node.args[1] if len(node.args) > 1 else None
    return isinstance(normalized, (list, tuple)) and len(normalized) == 1


def _valid(fmt: str, info: TensorInfo | None) -> bool:
    """Whether a tensor of this shape can be stored in ``fmt``."""
    if fmt == ND:
        return True
    rank = len(info.shape) if info is not None else 0
    if fmt == NC1HWC0:
        return rank in (3, 4)  # 4-D NCHW (3-D for conv1d, which CANN runs as a 1 x W conv2d)
    return rank >= 2  # FRACTAL_NZ tiles the last two axes


def _spatial_reduction(node: Node, info: TensorInfo | None) -> bool:
    """mean/sum over H and W only, keeping dims: stays in 5HD (C is untouched)."""
    if aten_name(node.target) not in ("mean", "sum") or info is None or len(info.shape) != 4:
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (list, tuple)) or not dims or not keep:
        return False
    return all(isinstance(d, int) and d % 4 in (2, 3) for d in dims)


def transdata_node(name: str, src: str, info: TensorInfo | None, src_format: str, dst_format: str,
                   dtype: str = "fp16") -> Node:
    """A TransData converting tensor ``src`` (held in GM as ``dtype``) from ``src_format`` to ``dst_format``."""
    spec = TransDataKernel(max(info.numel, 1) if info is not None else 1, dtype, src_format, dst_format)
    return Node(name, TRANSDATA, [src], (src,), {}, [info] if info is not None else [], npu=TRANSDATA_OP,
                kernel=spec, format=dst_format)


@register
@dataclass(frozen=True)
class AssignLayout(Pass):
    """Device formats for every tensor, TransData where they change, round trips removed."""

    name: ClassVar[str] = "layout"
    requires: ClassVar[tuple[str, ...]] = ("map_ops",)

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = ctx.chip
        caps = capabilities(chip)
        nd_matmul = caps.nd2nz_on_load
        _, gm_dtype = storage_dtypes(chip, ctx.precision)
        fmt: dict[str, str] = {}
        infos: dict[str, TensorInfo | None] = {}
        for v in graph.values.values():
            fmt[v.name] = ND
            infos[v.name] = v.info
        activations = {v.name for v in graph.values.values() if v.kind == "input"}
        offline = set()
        taken = {n.name for n in graph.nodes} | set(graph.values)
        counter = [0]

        def fresh() -> str:
            while f"transdata_{counter[0]}" in taken:
                counter[0] += 1
            name = f"transdata_{counter[0]}"
            taken.add(name)
            return name

        conversions: dict[tuple[str, str], Node] = {}
        inserted: list[Node] = []
        split_groups: set[str] = set()
        new_nodes: list[Node] = []

        def convert(src: str, dst: str, before: list[Node]) -> str:
            key = (src, dst)
            if key not in conversions:
                td = transdata_node(fresh(), src, infos.get(src), fmt[src], dst, gm_dtype)
                conversions[key] = td
                inserted.append(td)
                before.append(td)
                fmt[td.name] = dst
                infos[td.name] = infos.get(src)
                activations.add(td.name)
            return conversions[key].name

        for node in graph.nodes:
            acts = [i for i in dict.fromkeys(node.inputs) if i in activations]
            offline.update(i for i in node.inputs if i not in activations and node.unit == "cube")
            need, out = self._formats(node, acts, fmt, infos, nd_matmul)
            pending: list[Node] = []
            for i in acts:
                if fmt[i] != need[i]:
                    td = convert(i, need[i], pending)
                    node.rename_input(i, td)
                    group = node.group
                    producer_group = next((n.group for n in new_nodes if n.name == i), None)
                    if group is not None and group == producer_group:
                        split_groups.add(group)
            new_nodes.extend(pending)
            node.format = out
            node.input_formats = {i: fmt[i] for i in dict.fromkeys(node.inputs) if i in activations}
            if isinstance(node.kernel, CubeKernel):
                first = node.inputs[0] if node.inputs and node.inputs[0] in activations else None
                a_fmt = fmt[first] if first is not None and _valid(NZ, infos.get(first)) else ""
                node.kernel = replace(node.kernel, a_format=a_fmt, c_format=out if _valid(NZ, node.outputs[0]
                                                                                             if node.outputs else None) else "")
            new_nodes.append(node)
            fmt[node.name] = out
            infos[node.name] = node.outputs[0] if node.outputs else None
            activations.add(node.name)
        outputs = []
        for o in graph.outputs:
            if o in fmt and fmt[o] != ND:
                o = convert(o, ND, new_nodes)
            outputs.append(o)
        graph.nodes, graph.outputs = new_nodes, outputs

        removed = remove_round_trips(graph)
        transposes = unfused_transposes(graph, gm_dtype)
        in_place = concat_in_place(graph)
        no_task, copied = concat_no_task(graph, DTYPE_BYTES.get(gm_dtype, 2))
        counts: dict[str, int] = {}
        live = {n.name for n in graph.nodes}
        for td in inserted:
            if td.name in live:
                kind = f"{td.kernel.src_format}->{td.kernel.dst_format}"
                counts[kind] = counts.get(kind, 0) + 1
        total = sum(counts.values())
        detail = f" ({', '.join(f'{k} {v}' for k, v in counts.items())})" if counts else ""
        summary = f"inserted {total} TransData{detail}, removed {removed} redundant pairs"
        notes = []
        by_row = rows_by_row(graph, caps.data_copy_pad, DTYPE_BYTES.get(gm_dtype, 2))
        for n in by_row:
            n.kernel = replace(n.kernel, by_row=True)
        if by_row:
            n0 = by_row[0]
            notes.append(self.note(n0.name, f"{len(by_row)} row-wise kernels ({n0.npu.name if n0.npu else n0.op} ...) "
                                   f"work on rows of {n0.outputs[0].shape[-1]} elements, not whole 32-byte blocks, "
                                   f"and {chip.core_version} has no DataCopyPad: each row moves GM <-> UB and is "
                                   "computed on its own (Ascend C guide to unaligned data on Atlas inference "
                                   "products, atlas_ascendc_10_0038)"))
        if transposes:
            summary += f"; {len(transposes)} Reshape + Transpose pairs run as TransposeD (not 16-aligned)"
            notes.append(self.note(transposes[0], f"{len(transposes)} Reshape + Transpose pairs have a last-two-axes "
                                   "size not divisible by 16, so GE does not fuse them into ConfusionTransposeD "
                                   "(CANN graph fusion reference: TransposeReshapeFusionPass atlasrr_30_0130, "
                                   "ReshapeTransposeFusionPass atlasrr_30_0145): each runs as a TransposeD kernel "
                                   "on ND data, between TransData"))
        if in_place:
            notes.append(self.note("", f"{len(in_place)} channel concatenations are written in place: the convolutions "
                                       "feeding them write their results at their channel offsets in 5HD (GE's "
                                       "ConvConcatFusionPass), so no ConcatD kernel runs"))
        if no_task:
            notes.append(self.note("", f"{len(no_task)} concatenations share one buffer with their inputs (GE's "
                                       "ConcatNotaskPass): their producers write into it, no ConcatD kernel runs"))
        for name, reason in copied[:5]:
            notes.append(self.note(name, f"ConcatD copies its inputs: {reason} (GE's ConcatNotaskPass)"))
        if len(copied) > 5:
            notes.append(self.note("", f"{len(copied) - 5} more concatenations copy their inputs (ConcatD)"))
        if nd_matmul:
            notes.append(self.note("", f"{chip.core_version}: matmuls read ND (MTE2 converts ND->NZ on the way into "
                                       "L1) and write ND (FixPipe), so no TransData around them"))
        inputs = {v.name: ND for v in graph.values.values() if v.kind == "input"}
        notes.append(self.note("", "graph inputs and outputs are ND (NCHW for 4-D): "
                                   + ", ".join(f"{k} {v}" for k, v in inputs.items())))
        if offline:
            notes.append(self.note("", f"{len(offline)} Cube weights/biases (parameters and buffers) are converted "
                                       "once offline (FRACTAL_Z for conv weights, FRACTAL_NZ for matmul weights): no "
                                       "TransData in the graph"))
        for g in sorted(split_groups):
            notes.append(self.note(g, f"a TransData splits the fused group {g}: its members read different formats"))
        return PassResult(graph, modified=bool(total or removed), summary=summary, notes=tuple(notes))

    @staticmethod
    def _formats(node: Node, acts: list[str], fmt: dict[str, str],
                 infos: dict[str, TensorInfo | None], nd_matmul: bool = False) -> tuple[dict[str, str], str]:
        """(the format each activation input must be in, the format of the output)."""
        op = aten_name(node.target)
        unit = node.unit
        out_info = node.outputs[0] if node.outputs else None
        if node.target == TRANSDATA:
            return {i: node.kernel.src_format for i in acts}, node.kernel.dst_format
        if unit == "cube" and op in CONVS:
            first = node.inputs[0] if node.inputs else None
            return {i: (NC1HWC0 if i == first else fmt[i]) for i in acts}, NC1HWC0
        if unit == "cube" and op in MATMUL_OPS:
            if nd_matmul:  # MTE2 converts ND to NZ on the way into L1; FixPipe writes ND
                return {i: ND for i in acts}, ND
            return {i: (NZ if _valid(NZ, infos.get(i)) else ND) for i in acts}, NZ if _valid(NZ, out_info) else ND
        agnostic = (op in PASS_THROUGH
                    or (unit == "vector" and op not in ND_VECTOR_OPS and op not in REDUCTIONS)
                    or (op in REDUCTIONS and acts and _spatial_reduction(node, infos.get(acts[0]))))
        if op == "cat" and _channel_concat(node, acts, fmt, infos):
            return {i: NC1HWC0 for i in acts}, NC1HWC0
        if op in NZ_LAYER_NORMS and acts and fmt[acts[0]] == NZ and _nz_layer_norm(node, infos.get(acts[0])):
            return {acts[0]: NZ, **{i: ND for i in acts[1:]}}, NZ
        if not agnostic or not acts:
            return {i: ND for i in acts}, ND
        if op in POOLS or op in REDUCTIONS:
            # pooling and H/W reductions keep their input's format when it fits the output's rank
            f = fmt[acts[0]]
            f = f if _valid(f, out_info) else ND
            return {i: (f if i == acts[0] else ND) for i in acts}, f
        primary = fmt[acts[0]]
        if not _valid(primary, out_info) or not all(_valid(primary, infos.get(i)) for i in acts):
            primary = ND
        return {i: primary for i in acts}, primary


def _channel_concat(node: Node, acts: list[str], fmt: dict[str, str], infos: dict[str, TensorInfo | None]) -> bool:
    """A concatenation of 4-D NC1HWC0 tensors along C whose every input has a whole number of C0
    blocks: ConcatD then concatenates C1 blocks and keeps 5HD (no TransData), as CANN's ConcatD
    does for aligned channel counts."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not acts or not node.outputs or len(node.outputs[0].shape) != 4 or dim not in (1, -3):
        return False
    for i in acts:
        info = infos.get(i)
        if fmt.get(i) != NC1HWC0 or info is None or len(info.shape) != 4:
            return False
        c0 = 32 if info.dtype in ("int8", "uint8") else 16   # CANN's C0: 32 for 1-byte types, else 16
        if info.shape[1] % c0:
            return False
    return True


def concat_in_place(graph: Graph) -> list[str]:
    """Channel concatenations in 5HD whose every input is written by a Cube kernel and read by
    nothing else: those kernels write their results straight into the concatenation's output at
    their channel offsets (GE's ConvConcatFusionPass, hicann/ge graph_fusion node_optimize), so the
    concatenation itself runs no kernel. Returns their names."""
    users = graph.users()
    producers = graph.producers()
    done = []
    for node in graph.nodes:
        if aten_name(node.target) != "cat" or node.format != NC1HWC0 or node.unit in (None, "free"):
            continue
        ok = True
        for i in dict.fromkeys(node.inputs):
            p = producers.get(i)
            anchor = producers.get(p.group, p) if p is not None and p.group else p
            if anchor is None or anchor.unit != "cube" or len(users.get(i, [])) != 1:
                ok = False
                break
        if ok:
            node.npu = NpuOp("ConcatD", "free")
            node.kernel = None
            node.group = None
            done.append(node.name)
    return done


def _gm_bytes(info: TensorInfo, eb: int) -> int:
    return info.numel * eb if info.dtype in ("float32", "float16", "bfloat16") else info.nbytes


def _contiguous(node: Node, info: TensorInfo | None) -> bool:
    """Whether a concatenation's pieces lie one after another in its buffer: every axis before the
    concatenated one is 1 (GE's ConcatNotaskPass, CheckDim / CheckSplitAxis). In 5HD a channel
    concatenation runs over C1 after N, so it needs a batch of 1 (and whole C0 blocks, which the
    5HD format already asks)."""
    if info is None or not info.shape:
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(dim, int):
        return False
    dim %= len(info.shape)
    return all(d == 1 for d in info.shape[:dim])


def concat_no_task(graph: Graph, eb: int = 2) -> tuple[list[str], list[tuple[str, str]]]:
    """Concatenations that run no kernel because their inputs are written straight into their
    buffer, by GE's ConcatNotaskPass (hicann/ge compiler/graph/passes/memory_optimize/
    concat_notask_pass.cc and notask_pass_base.cc at ffdcbc9f7496, on at the default --oo_level
    O3): the pieces must be contiguous in the output (`_contiguous`); each input must come from
    an operator (not a graph input, weight or constant), from a different one than the others,
    hold a multiple of 32 bytes (more than one input), not be read by the graph's output, and not
    already be placed in another no-task buffer (a producer's output is "locked" by the first
    no-task concatenation that takes it); a concatenation whose input is itself a no-task node
    stays a copy. ``eb``: bytes per element of a floating-point tensor in GM. Returns (the no-task
    concatenations, [(a copied one, why)])."""
    producers = graph.producers()
    outputs = set(graph.outputs)
    locked: set[str] = set()
    done: list[str] = []
    copied: list[tuple[str, str]] = []
    for node in graph.nodes:
        if aten_name(node.target) != "cat" or node.unit in (None, "free") or node.kernel is None:
            continue
        inputs = list(node.inputs)
        reason = ""
        if not _contiguous(node, node.outputs[0] if node.outputs else None):
            reason = "its pieces are not contiguous in the output (an axis before the concatenated one is not 1)"
        elif len(set(inputs)) != len(inputs):
            reason = "an input comes twice"
        for i in inputs if not reason else ():
            p = producers.get(i)
            info = graph.info(i)
            if p is None:
                reason = f"input {i} is a graph input or weight"
            elif p.unit == "free" or p.kernel is None and p.group is None:
                reason = f"input {i} is a view or another buffer-sharing node"
            elif i in outputs:
                reason = f"input {i} is also a graph output"
            elif i in locked:
                reason = f"input {i} already lives in an earlier concatenation's buffer (read again here)"
            elif len(inputs) > 1 and (info is None or _gm_bytes(info, eb) % 32):
                reason = f"input {i} is not a multiple of 32 bytes"
            if reason:
                break
        if reason:
            copied.append((node.name, reason))
            continue
        locked.update(inputs)
        node.npu = NpuOp("ConcatD", "free")
        node.kernel = None
        node.group = None
        done.append(node.name)
    return done, copied


def _aligned16(info: TensorInfo | None) -> bool:
    """The ConfusionTransposeD fusion passes' shape rule: a 1-D shape divisible by 16, or the last
    two axes of a longer one both divisible by 16."""
    if info is None or not info.shape:
        return False
    return all(d % 16 == 0 for d in info.shape[-2:])


def _moves_data(node: Node) -> bool:
    """Whether a permute/transpose reorders elements (not just axes of size 1)."""
    info_in = node.outputs[0] if node.outputs else None
    if info_in is None:
        return False
    return sum(1 for d in info_in.shape if d != 1) > 1


def unfused_transposes(graph: Graph, dtype: str = "fp16") -> list[str]:
    """Reshape + Transpose pairs (a permute/transpose read from a view/reshape, or read by one) that
    GE cannot fuse into a ConfusionTransposeD, turned into TransposeD kernels. Returns their names.

    GE's TransposeReshapeFusionPass and ReshapeTransposeFusionPass (CANN graph fusion reference,
    atlasrr_30_0130 and atlasrr_30_0145) make one ConfusionTransposeD, which moves the data within
    the Cube's FRACTAL_NZ tiles, out of a TransposeD next to a Reshape, but not when either of the
    last two axes at the pair's outer ends (the Reshape's input and the Transpose's output, or the
    Transpose's input and the Reshape's output) is not divisible by 16. Then the TransposeD runs on
    its own, in ND: a kernel that reads and writes the whole tensor, with TransData on either side
    where its neighbours are in NZ (which the format assignment already inserted). Where the pair
    fuses, the engine keeps the transpose in the NZ <-> ND conversions it already charges. A
    transpose that no reshape touches (a swap of the last two axes a matmul reads transposed) is
    left as it is."""
    producers = graph.producers()
    users = graph.users()
    done = []
    for node in graph.nodes:
        if aten_name(node.target) not in TRANSPOSES or node.unit != "free" or not node.inputs or not _moves_data(node):
            continue
        pairs = []
        before = producers.get(node.inputs[0])
        if before is not None and aten_name(before.target) in RESHAPES and before.inputs:
            pairs.append((graph.info(before.inputs[0]), node.outputs[0]))
        after = users.get(node.name, [])
        if len(after) == 1 and aten_name(after[0].target) in RESHAPES and after[0].outputs:
            pairs.append((graph.info(node.inputs[0]), after[0].outputs[0]))
        if not pairs or any(_aligned16(a) and _aligned16(b) for a, b in pairs):
            continue
        info = node.outputs[0]
        node.npu = TRANSPOSE_OP
        node.kernel = TransposeKernel(max(info.numel, 1), dtype, ND, ND)
        node.format = ND
        done.append(node.name)
    return done


ROW_WISE = frozenset({"softmax", "_softmax", "log_softmax", "layer_norm", "native_layer_norm"})


def rows_by_row(graph: Graph, data_copy_pad: bool, eb: int = 2) -> list[Node]:
    """Row-wise Vector kernels in ND whose rows are not whole 32-byte blocks, on a core without
    DataCopyPad: the Vector coster moves and computes their rows one by one (`simulate_vector`)."""
    if data_copy_pad:
        return []
    return [n for n in graph.nodes if aten_name(n.target) in ROW_WISE and n.unit == "vector" and n.format == ND
            and isinstance(n.kernel, VectorKernel) and n.kernel.row_len == (n.outputs[0].shape[-1] if n.outputs
                                                                              and n.outputs[0].shape else None)
            and n.outputs and n.outputs[0].shape and (n.outputs[0].shape[-1] * eb) % 32]


def remove_round_trips(graph: Graph) -> int:
    """Remove each TransData B->A whose input is a TransData A->B: its readers read the original
    tensor. The first TransData goes too when nothing else reads it. Returns the pairs removed."""
    removed = 0
    changed = True
    while changed:
        changed = False
        producers = graph.producers()
        for second in graph.nodes:
            if second.target != TRANSDATA or not second.inputs:
                continue
            first = producers.get(second.inputs[0])
            if first is None or first.target != TRANSDATA or not first.inputs:
                continue
            if (first.kernel.src_format, first.kernel.dst_format) != (
                    second.kernel.dst_format, second.kernel.src_format):
                continue
            original = first.inputs[0]
            for n in graph.nodes:
                if second.name in n.inputs:
                    n.rename_input(second.name, original)
            graph.outputs = [original if o == second.name else o for o in graph.outputs]
            gone = {second.name}
            if not any(first.name in n.inputs for n in graph.nodes if n is not second) and \
                    first.name not in graph.outputs:
                gone.add(first.name)
            graph.nodes = [n for n in graph.nodes if n.name not in gone]
            removed += 1
            changed = True
            break
    return removed
