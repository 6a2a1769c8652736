"""Stage 2 of the compiler, the Tile Graph: the Tensor Graph cut into groups of operations that
run tile by tile, and the legality of their tile shapes on the chip.

* A **vector group** is a chain of vector operations that share a tile shape and an iteration
  space: they run on one tile after another without leaving UB (element-wise fusion within the
  kernel). Tensors that come from GM are loaded tile by tile (MTE2); results leave UB (MTE3)
  when they are written to an output, or to a GM workspace when an operation outside the group
  needs them. A reduction along an axis makes a group's unit of work (a *task*) span that whole
  axis: the task keeps its tiles in UB, reduces them, and combines the partial results.
* A **cube group** is one matmul, split by the cube tile shape into ``m_l1 x n_l1`` blocks
  (L1 panels of ``k_l1``, L0 steps of ``k_l0``), as `pypto_lab.hw.tiling.plan_cube` checks.
* A **copy group** moves a GM tensor into an output (``out[:] = x``): MTE2 then MTE3.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass, field

from ..hw.chip import DTYPE_BYTES, Chip
from ..hw.tiling import CubeTile, TilingError, cube_fractal, cube_tile_bytes, default_cube_tile, plan_cube
from . import special
from .dtypes import DataType
from .errors import DTypeError, TileAlignmentError, TileCapacityError, TileShapeError
from .graph import ELEMENTWISE, REDUCTIONS, SPECIAL_KINDS, TensorGraph


def _a32(n: float) -> int:
    return int(-(-n // 32) * 32)


def ub_tile_bytes(ext, elem_bytes: int) -> int:
    """UB bytes of a tile of extents ``ext``: its last dimension padded to whole 32-byte blocks
    (the real PadLocalBuffer pass pads the last axis of every UB tensor to 32 bytes,
    framework/src/passes/tile_graph_pass/graph_constraint/pad_local_buffer.cpp), so a row of 3
    fp32 (12 bytes) occupies 32 bytes of UB. Transfers still move only the real bytes."""
    ext = list(ext) or [1]
    return math.prod(ext[:-1]) * _a32(ext[-1] * elem_bytes)


def suggest_vec_tile(shape, dtype: DataType) -> tuple[int, ...]:
    """A legal vector tile for ``shape``: the whole innermost dimension (32-B aligned) and as many
    rows as make about 16 KB."""
    shape = list(shape)
    align = builtins.max(1, 32 // dtype.bytes)
    last = -(-shape[-1] // align) * align
    rows_budget = builtins.max(1, 16384 // (last * dtype.bytes))
    tile = [1] * len(shape)
    tile[-1] = last
    for d in range(len(shape) - 2, -1, -1):
        take = builtins.min(shape[d], rows_budget)
        tile[d] = take
        rows_budget = builtins.max(1, rows_budget // builtins.max(1, take))
        if rows_budget == 1:
            break
    return tuple(tile)


def _ceil(v: int, a: int) -> int:
    return -(-int(v) // a) * a


def effective_cube_tile(tile: CubeTile, dtype: str, m: int, k: int, n: int, chip: Chip | None = None) -> CubeTile:
    """The tile a matmul of ``m x k x n`` really uses: as in the real framework
    (framework/src/interface/operation/cube_operation_impl.cpp at 883e7df: ``kL0Size = min(tileKL0,
    kView - kOffset)``, ``nL0Size = min(nView - nOffset, tileNL0)``, ...), each L0 / L1 size is at most
    the matrix's own size, here rounded up to whole fractals (the chip model's alignment: 16
    elements, 32 for int8; an int8 ``m`` of 16 is therefore costed as a 32-row fractal pair)."""
    a = 32 if DTYPE_BYTES.get(dtype, 2) == 1 else 16
    f = tile.to_dict()
    out = {}
    for dim, size in (("m", m), ("k", k), ("n", n)):
        l0 = _ceil(f[f"{dim}_l0"], a)
        l0 = builtins.min(l0, _ceil(size, a))
        l1 = builtins.max(l0, builtins.min(_ceil(f[f"{dim}_l1"], l0), _ceil(size, l0)))
        out[f"{dim}_l0"], out[f"{dim}_l1"] = l0, l1
    eff = CubeTile(**out)
    if chip is not None:
        eff = _fit_l1(eff, dtype, chip)
    return eff


def _fit_l1(tile: CubeTile, dtype: str, chip: Chip) -> CubeTile:
    """The L1 panels actually held at once: the real framework takes the user's L1 sizes without a
    capacity check (CheckCubeTiling checks alignment only) and its memory planner streams what does
    not fit, so a tiling whose ``(m_l1 + n_l1) x k_l1`` exceeds L1 is costed with the longest K panel
    (a multiple of ``k_l0``) that fits, then smaller M / N panels. L0A / L0B / L0C must fit as given:
    one L0 tile cannot be split."""
    cap = chip.buffer("L1").size_bytes
    f = tile.to_dict()
    if cube_tile_bytes(tile, dtype, chip)["L1"] <= cap:
        return tile
    for dim in ("k", "n", "m"):
        l0 = f[f"{dim}_l0"]
        while f[f"{dim}_l1"] > l0 and cube_tile_bytes(CubeTile(**f), dtype, chip)["L1"] > cap:
            f[f"{dim}_l1"] -= l0
        if cube_tile_bytes(CubeTile(**f), dtype, chip)["L1"] <= cap:
            break
    return CubeTile(**f)


def check_cube_tile(chip: Chip, tile: CubeTile, dtype: DataType, m: int, k: int, n: int, what: str,
                    a_trans: bool = False):
    """The rules of a cube tile shape, as the real framework's ``CheckCubeTiling`` states them
    (cube_operation_impl.cpp at 883e7df): every size > 0; ``k_l0`` and ``n_l0`` multiples of 16
    elements and of 32 bytes; ``m_l0`` a multiple of 32 bytes only when A is transposed; each L1
    size a multiple of its L0 size. Then the tile the matmul really uses (`effective_cube_tile`: at
    most the matrix's size) must fit L0A / L0B / L0C / L1 on ``chip``."""
    lab = dtype.lab
    try:
        cube_fractal(chip, lab)
    except TilingError as e:
        raise DTypeError(f"{what}: {e}") from None
    fields = tile.to_dict()
    eb = dtype.bytes
    rules = [("k_l0", 16, "16 elements"), ("n_l0", 16, "16 elements"),
             ("k_l0", builtins.max(1, 32 // eb) if eb < 32 else 1, "32 bytes"),
             ("n_l0", builtins.max(1, 32 // eb) if eb < 32 else 1, "32 bytes")]
    if a_trans:
        rules.append(("m_l0", builtins.max(1, 32 // eb), "32 bytes (A transposed)"))
    for name, align, unit in rules:
        value = fields[name]
        if value % align:
            raise TileAlignmentError(
                f"{what}: cube tile {name} = {value} is not a multiple of {unit} ({align} elements of {dtype!r}). "
                f"Rule (the real CheckCubeTiling): k_l0 and n_l0 are multiples of 16 elements and 32 bytes; m_l0 of "
                f"32 bytes when A is transposed. Fix: {name} = {_ceil(value, align)}")
    for dim in ("m", "k", "n"):
        l0, l1 = fields[f"{dim}_l0"], fields[f"{dim}_l1"]
        if l0 > l1 or l1 % l0:
            raise TileShapeError(
                f"{what}: cube tile [{dim}_l0, {dim}_l1] = [{l0}, {l1}]. Rule: {dim}_l1 is a multiple of {dim}_l0 "
                f"(L1 holds whole L0 tiles). Fix: [{dim}_l0, {dim}_l1] = [{l0}, {max(l0, -(-l1 // l0) * l0)}]")
    eff = effective_cube_tile(tile, lab, m, k, n, chip)
    need = cube_tile_bytes(eff, lab, chip)
    formulas = {
        "L0A": f"m_l0 x k_l0 = {eff.m_l0} x {eff.k_l0} x {dtype.bytes} B",
        "L0B": f"k_l0 x n_l0 = {eff.k_l0} x {eff.n_l0} x {dtype.bytes} B",
        "L0C": f"m_l0 x n_l0 = {eff.m_l0} x {eff.n_l0} accumulators of {chip.cube.accumulator[lab]}",
        "L1": f"(m_l1 + n_l1) x k_l1 = ({eff.m_l1} + {eff.n_l1}) x {eff.k_l1} x {dtype.bytes} B",
    }
    for buf in ("L0A", "L0B", "L0C", "L1"):
        cap = chip.buffer(buf).size_bytes
        if need[buf] > cap:
            try:
                fit = default_cube_tile(chip, m, k, n, lab).as_pypto()
                hint = f"pypto.set_cube_tile_shapes({fit[0]}, {fit[1]}, {fit[2]})"
            except TilingError:
                hint = "smaller tiles on every dimension"
            used = "" if eff == tile else f" (the part of it a {m} x {k} x {n} matmul uses: {list(eff.as_pypto())})"
            raise TileCapacityError(
                f"{what}: cube tile {list(tile.as_pypto())}{used} needs {need[buf]} bytes of {buf} ({formulas[buf]}), "
                f"{buf} holds {cap} bytes on {chip.name}. Rule: one tile of each operand must fit its buffer. "
                f"Fix: a tiling that fits: {hint}")


@dataclass
class Group:
    id: int
    kind: str                                   # "vector", "copy", "cube"
    nodes: list[int] = field(default_factory=list)
    deps: set[int] = field(default_factory=set)  # groups whose GM results this one reads
    # vector / copy
    space: tuple = ()
    raw_tile: tuple = ()
    tile: tuple = ()
    reduced: set[int] = field(default_factory=set)
    loads: list[int] = field(default_factory=list)
    stores: list[tuple] = field(default_factory=list)  # (tensor id, root id or None, root offsets)
    spans: dict[int, tuple] = field(default_factory=dict)
    closed: bool = False
    counts: tuple = ()
    k: int = 1
    n_tasks: int = 0
    ub_bytes: int = 0
    slots: int = 1
    ub_plan: object = None                       # UBPlan of one task (which results took an input's buffer)
    # cube
    batch: int = 1
    m: int = 0
    kk: int = 0
    n: int = 0
    cube_tile: CubeTile | None = None
    plan: object = None
    in_dtype: str = ""
    out_dtype: str = ""
    dst: tuple | None = None
    bias_bytes: int = 0                          # bytes of one bias element (0: no bias_tensor)
    # special (gather, sort, ...): the steps of each task (see `special`)
    steps: list = field(default_factory=list)
    spill: list = field(default_factory=list)    # results that go UB -> GM -> UB (a task larger than UB)

    def label(self, graph: TensorGraph) -> str:
        """The group's ops ("exp+sum"), then its semantic labels (pypto.set_semantic_label) in brackets."""
        ops = "+".join(graph.nodes[i].op for i in self.nodes) or self.kind
        labels = dict.fromkeys(graph.nodes[i].attrs.get("semantic_label") for i in self.nodes)
        labels.pop(None, None)
        return f"{ops} [{', '.join(labels)}]" if labels else ops

    def to_json(self, graph: TensorGraph) -> dict:
        d = {"id": self.id, "kind": self.kind, "ops": [graph.nodes[i].op for i in self.nodes], "nodes": self.nodes,
             "deps": sorted(self.deps)}
        labels = [lb for lb in dict.fromkeys(graph.nodes[i].attrs.get("semantic_label") for i in self.nodes) if lb]
        if labels:
            d["semantic_labels"] = labels
        if self.kind == "cube":
            d.update({"batch": self.batch, "m": self.m, "k": self.kk, "n": self.n, "dtype": self.in_dtype,
                      "out_dtype": self.out_dtype, "cube_tile": [list(x) for x in self.cube_tile.as_pypto()],
                      "blocks": self.n_tasks, "buffer_bytes": self.plan.buffer_peak(), "slots": dict(self.plan.slots)})
        else:
            d.update({"space": list(self.space), "vec_tile": list(self.tile), "reduced_axes": sorted(self.reduced),
                      "tiles_per_dim": list(self.counts), "tiles_per_task": self.k, "tasks": self.n_tasks,
                      "tiles": self.k * self.n_tasks, "loads": self.loads,
                      "stores": [{"tensor": t, "into": r,
                                  "offsets": [x if isinstance(x, int) else str(x) for x in o] if o else None}
                                 for t, r, o in self.stores],
                      "ub_bytes_per_task": self.ub_bytes, "ub_slots": self.slots})
            if self.spill:
                d["spilled_to_gm"] = list(self.spill)
            if self.ub_plan is not None and self.ub_plan.inplace:
                d["ub_inplace"] = {str(o): i for o, i in self.ub_plan.inplace.items()}
        return d


@dataclass
class TileGraph:
    groups: list[Group]
    graph: TensorGraph

    def to_json(self) -> dict:
        return {"stage": "tile_graph", "groups": [g.to_json(self.graph) for g in self.groups]}


def _pad(shape, rank):
    return (1,) * (rank - len(shape)) + tuple(shape)


def build_tile_graph(graph: TensorGraph, chip: Chip, double_buffer: bool = True) -> TileGraph:
    nodes = graph.nodes
    groups: list[Group] = []
    loc: dict[int, object] = {}          # tensor id -> "gm" or a vector group id (value held in UB)
    gm_writer: dict[int, int] = {}       # workspace tensor -> group that wrote it
    root_writers: dict[int, set] = {}    # param/alloc -> groups that wrote into it
    cube_of: dict[int, Group] = {}
    cur: Group | None = None

    def writers(tid: int) -> set:
        n = nodes[tid]
        if n.op in ("param", "alloc"):
            return set(root_writers.get(tid, ()))
        if n.op == "reshape" and tid in root_writers:   # an in-place reshape written through
            return set(root_writers[tid]) | writers(n.inputs[0])
        if tid in gm_writer:
            return {gm_writer[tid]} | set(root_writers.get(tid, ()))   # (and a loop body's in-place writes)
        if n.op in ("view", "reshape"):
            return writers(n.inputs[0])
        return set()

    def note_writer(root: int, gid: int) -> None:
        """``gid`` writes into ``root``, and so into what an in-place reshape ``root`` reshapes."""
        while True:
            root_writers.setdefault(root, set()).add(gid)
            if nodes[root].op != "reshape":
                return
            root = nodes[root].inputs[0]

    def materialise(tid: int) -> None:
        g = loc.get(tid)
        if isinstance(g, int):
            groups[g].stores.append((tid, None, None))
            gm_writer[tid] = g
            loc[tid] = "gm"

    def new_group(kind, space, raw_tile) -> Group:
        g = Group(len(groups), kind, space=tuple(space), raw_tile=tuple(raw_tile or ()))
        groups.append(g)
        return g

    def spans_of(shape, space):
        shape = _pad(shape, len(space))
        return tuple(s == S and S > 1 for s, S in zip(shape, space))

    def compatible(shape, space) -> bool:
        if len(shape) != len(space):
            return False
        return all(s == S or s == 1 for s, S in zip(shape, space))

    for n in nodes:
        op = n.op
        if op in ("param", "alloc"):
            loc[n.id] = "gm"
        elif op in ("view", "reshape"):
            materialise(n.inputs[0])
            loc[n.id] = "gm"
        elif op == "matmul":
            if cur is not None:
                cur.closed = True
            for i in n.inputs:
                materialise(i)
            g = Group(len(groups), "cube", [n.id])
            groups.append(g)
            for i in n.inputs:
                g.deps |= writers(i)
            a = n.attrs
            g.m, g.kk, g.n = a["m"], a["k"], a["n"]
            g.batch = math.prod(n.shape[:-2]) if len(n.shape) > 2 else 1
            g.in_dtype = nodes[n.inputs[0]].dtype.lab
            g.cube_tile = effective_cube_tile(n.cube_tile, g.in_dtype, g.m, g.kk, g.n, chip)
            g.out_dtype = n.dtype.lab
            if len(n.inputs) > 2:
                g.bias_bytes = nodes[n.inputs[2]].dtype.bytes
            try:
                g.plan = plan_cube(chip, g.cube_tile, g.in_dtype, g.m, g.kk, g.n, double_buffer,
                                   epilogue="bias" if g.bias_bytes else "none")
            except TilingError as e:  # check_cube_tile ran at trace time; this is a safety net
                raise TileShapeError(str(e)) from None
            loc[n.id] = "gm"
            gm_writer[n.id] = g.id
            cube_of[n.id] = g
        elif op in SPECIAL_KINDS:
            if cur is not None:
                cur.closed = True
            for i in n.inputs:
                materialise(i)
            g = Group(len(groups), "special", [n.id])
            groups.append(g)
            for i in n.inputs:
                g.deps |= writers(i)
            g.loads = list(n.inputs)
            g.steps = special.REGISTRY[op].tasks(n, nodes, chip)
            g.n_tasks = len(g.steps)
            loc[n.id] = "gm"
            gm_writer[n.id] = g.id
            if special.REGISTRY[op].inplace and "root" in n.attrs:
                note_writer(n.attrs["root"], g.id)
            else:
                cube_of[n.id] = g  # an output it is assembled into is written directly (no copy)
        elif op == "assemble":
            src, root, roff = n.inputs[0], n.attrs["root"], n.attrs["root_offsets"]
            if n.attrs.get("carried"):
                materialise(root)   # a computed value a loop body writes in place lives in GM
            where = loc.get(src)
            if isinstance(where, int):
                groups[where].stores.append((src, root, roff))
                note_writer(root, where)
            elif src in cube_of and cube_of[src].dst is None:
                g = cube_of[src]
                g.dst = (root, roff)
                note_writer(root, g.id)
            else:
                if cur is not None:
                    cur.closed = True
                shape = nodes[src].shape
                tile = n.vec_tile if n.vec_tile and len(n.vec_tile) == len(shape) else suggest_vec_tile(shape, n.dtype)
                g = new_group("copy", shape, tile)
                g.nodes = [n.id]
                g.loads = [src]
                g.spans[src] = spans_of(shape, shape)
                g.deps |= writers(src)
                g.stores.append((src, root, roff))
                g.closed = True
                note_writer(root, g.id)
        elif op in ELEMENTWISE or op in REDUCTIONS or op == "transpose":
            ref = nodes[n.inputs[0]].shape if (op in REDUCTIONS or op == "transpose") else n.shape
            join = (cur is not None and not cur.closed and op != "transpose" and n.vec_tile == cur.raw_tile
                    and compatible(ref, cur.space) and (op not in REDUCTIONS or tuple(ref) == cur.space))
            if join and op not in REDUCTIONS:
                join = compatible(n.shape, cur.space)
            # fusion follows the data: an op joins the group only if it consumes a value the group holds in UB
            if join:
                join = any(loc.get(i) == cur.id for i in n.inputs)
            if not join:
                if cur is not None:
                    cur.closed = True
                cur = new_group("vector", ref, n.vec_tile)
            g = cur
            for i in n.inputs:
                if loc.get(i) != g.id:
                    materialise(i)
                    if i not in g.loads:
                        g.loads.append(i)
                        g.spans[i] = spans_of(nodes[i].shape, g.space)
                        g.deps |= writers(i)
            g.nodes.append(n.id)
            if op in REDUCTIONS:
                d = n.attrs["dim"]
                if g.space[d] > 1:
                    g.reduced.add(d)
                sp = list(g.spans[n.inputs[0]])
                sp[d] = False
                g.spans[n.id] = tuple(sp)
            elif op == "transpose":
                g.spans[n.id] = spans_of(g.space, g.space)
                g.closed = True
            else:
                g.spans[n.id] = spans_of(n.shape, g.space)
            loc[n.id] = g.id
        else:
            raise TileShapeError(f"internal: no tiling rule for operation {op!r}")

    # returned tensors that stay in UB must be stored
    for r in graph.returns:
        materialise(r)

    for g in groups:
        if g.kind == "cube":
            t = g.cube_tile
            g.n_tasks = g.batch * -(-g.m // t.m_l1) * -(-g.n // t.n_l1)
            continue
        if g.kind == "special":
            continue
        _finish_vector_group(g, graph, chip, double_buffer)
    return TileGraph(groups, graph)


def is_moveout_transpose(n) -> bool:
    """A transpose that keeps the last axis in place (``transpose(x, 0, 1)`` of ``[t, n, d]``). The
    real framework makes it a ``TRANSPOSE_MOVEOUT`` (operation/vector/tensor_transformation.cpp,
    TensorInnerTranspose): the tile is written from UB to GM with the two axes swapped by the copy
    itself, so its result takes no UB buffer and no vector instruction; a transpose that moves the
    last axis is a ``VNCHWCONV`` in UB (its own buffer)."""
    if n.op != "transpose":
        return False
    rank = len(n.shape)
    if "perm" in n.attrs:
        return n.attrs["perm"][-1] == rank - 1
    return rank - 1 not in (n.attrs["dim0"], n.attrs["dim1"])


# Ops whose output never takes an input's UB buffer. The real compiler's SrcDstBufferMerge pass
# (framework/src/passes/block_graph_pass/memory_reuse/merge_src_dst_buffer.cpp) skips ops marked
# ``excludeBufferReuse`` in its opcode table (divs, reciprocal, pow, erf, round, the trigonometric
# and bitwise ops, row reductions, transposes, conversions, ...); these are the lab's names for them
# ("math" holds the extended ops, most of which are on that list).
NO_INPLACE = frozenset({"cast", "divs", "rdivs", "reciprocal", "pow", "pows", "erf", "erfc", "round", "math",
                        "expand", "full", "arange", "transpose", "amax", "amin", "sum"})


@dataclass
class UBPlan:
    """One task's UB plan: the peak bytes, the buffers live at the peak (tensor ids that share a
    buffer, its bytes) and which outputs were written in place of an input."""
    peak: int
    live: list            # [(tensor ids sharing the buffer, bytes)] at the peak
    inplace: dict         # output tensor id -> input tensor id whose buffer it takes

    @property
    def count(self) -> int:
        return len(self.live)


def _ub_plan(g: Group, graph: TensorGraph, tile, reuse: bool = True, stream: bool = False) -> UBPlan:
    """UB that one task of a vector group needs, as the real compiler plans it.

    Every tensor the group holds in UB (its loads and its ops' results) has a buffer that is live
    from the first op that reads it (a load) or the op that produces it, to its last use (or to the
    end of the task when it is stored): the real OoO scheduler allocates a buffer as it issues the
    op that needs it and frees it when its last consumer retires.
    A buffer whose last use has passed is free for a later result. With ``reuse`` the result of
    an element-wise op takes the buffer of one of its inputs, as the real SrcDstBufferMerge pass
    does, when that input has no other consumer, is not stored, and has the same size and element
    width (so ``cast`` to another width and reductions never do), unless the op is in `NO_INPLACE`.
    ``reuse=False`` is the plan without the real compiler's memory passes (every load taken at the
    start of the task, no result in place of an input), kept to show what they save.
    """
    # ``stream``: one tile of the reduced axes at a time (the rest spilled to a GM workspace)
    task_ext = [g.space[d] if d in g.reduced and not stream else tile[d] for d in range(len(g.space))]
    nodes = graph.nodes

    def nbytes(tid):
        return ub_tile_bytes([x if s else 1 for x, s in zip(task_ext, g.spans[tid])], nodes[tid].dtype.bytes)

    order = g.nodes
    pos = {tid: i + 1 for i, tid in enumerate(order)}
    last_use = {}
    consumers: dict[int, set] = {}
    for i, tid in enumerate(order):
        for j in nodes[tid].inputs:
            last_use[j] = i + 1
            consumers.setdefault(j, set()).add(tid)
    end = len(order) + 1
    stored = {tid for tid, _, _ in g.stores}
    for tid in stored:
        last_use[tid] = end
    first_use = {}
    for i, tid in enumerate(order):
        for j in nodes[tid].inputs:
            first_use.setdefault(j, i + 1)
    # a load's buffer is taken when the first op that reads it issues (the real OoO scheduler allocates
    # UB on demand as it issues each copy-in), not at the start of the task
    live_from = {t: first_use.get(t, 0) if reuse else 0 for t in g.loads}
    live_from.update({t: pos[t] for t in order if nodes[t].op != "assemble"})
    buf = {t: t for t in live_from}           # tensor -> buffer (the id of the tensor that owns it)
    merged: dict[int, int] = {}
    for tid in order:   # a move-out transpose is the store of its input's buffer, with the axes swapped
        if is_moveout_transpose(nodes[tid]) and nodes[tid].inputs[0] in buf:
            buf[tid] = buf[nodes[tid].inputs[0]]
    if reuse:
        for tid in order:
            n = nodes[tid]
            # a copy (clone) writes its input's buffer as it reads it: the real SrcDstBufferMerge
            # merges a copy's source and destination
            if (n.op in NO_INPLACE and not (n.op == "math" and n.attrs.get("fn") == "clone")) or tid not in buf:
                continue
            if buf[tid] != tid:   # already another tensor's buffer (a move-out transpose)
                continue
            for i in n.inputs:
                if (i in buf and i not in stored and consumers.get(i) == {tid} and nbytes(i) == nbytes(tid)
                        and nodes[i].dtype.bytes == n.dtype.bytes):
                    buf[tid] = buf[i]
                    merged[tid] = i
                    break
    span: dict[int, list] = {}
    size: dict[int, int] = {}
    members: dict[int, list] = {}
    for t, b in buf.items():
        s, e = live_from[t], last_use.get(t, live_from[t])
        lo_hi = span.setdefault(b, [s, e])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], s), max(lo_hi[1], e)
        size[b] = max(size.get(b, 0), nbytes(t))
        members.setdefault(b, []).append(t)
    peak, at_peak = 0, []
    for p in range(end + 1):
        live = [b for b, (s, e) in span.items() if s <= p <= e]
        total = sum(size[b] for b in live)
        if total > peak:
            peak, at_peak = total, [(members[b], size[b]) for b in live]
    return UBPlan(peak, at_peak, merged)


def _task_bytes(g: Group, graph: TensorGraph, tile) -> tuple[int, int]:
    """UB bytes one task needs (peak over the group's program) and the number of live buffers then."""
    plan = _ub_plan(g, graph, tile)
    return plan.peak, plan.count


def _describe(plan: UBPlan, graph: TensorGraph) -> str:
    """The buffers live at the peak: "t3 exp fp32 65536 B, t5/t6 adds fp32 65536 B, ..."."""
    out = []
    for tids, nb in plan.live:
        n = graph.nodes[tids[-1]]
        names = "/".join(f"t{t}" for t in tids)
        out.append(f"{names} {'+'.join(dict.fromkeys(graph.nodes[t].op for t in tids))} {n.dtype.lab} {nb} B")
    return ", ".join(out)


def _finish_vector_group(g: Group, graph: TensorGraph, chip: Chip, double_buffer: bool) -> None:
    space = g.space
    g.tile = tuple(min(t, s) for t, s in zip(g.raw_tile, space))  # tile size i for axis i; extra sizes ignored
    g.counts = tuple(-(-s // t) for s, t in zip(space, g.tile))
    g.k = math.prod(c for d, c in enumerate(g.counts) if d in g.reduced)
    g.n_tasks = math.prod(c for d, c in enumerate(g.counts) if d not in g.reduced)
    cap = chip.buffer("UB").size_bytes
    plan = _ub_plan(g, graph, g.tile)
    need = plan.peak
    if need > cap and g.reduced:
        # as the real compiler does when a reduction's operands span more than UB holds (its memory
        # type assignment puts such a tensor in a GM workspace, vector/reduction.cpp reduces it tile
        # pair by tile pair): the task streams one tile of the reduced axes at a time and the results
        # that span them go through GM (`schedule` emits their store and load back)
        streamed = _ub_plan(g, graph, g.tile, stream=True)
        if streamed.peak <= cap:
            nodes = graph.nodes
            used_after = {i for nid in g.nodes for i in nodes[nid].inputs}
            g.spill = [nid for nid in g.nodes if nodes[nid].op not in ("assemble",) and nid in used_after
                       and any(g.spans[nid][d] for d in g.reduced)]
            plan, need = streamed, streamed.peak
    if need > cap:
        fit = _fit_tile(g, graph, cap)
        what = g.label(graph)
        red = (f"; a task spans the whole reduced axis {sorted(g.reduced)} ({g.k} tiles kept in UB)" if g.reduced else "")
        fix = f"pypto.set_vec_tile_shapes{fit}" if fit else "split the reduced axis into a loop (two-pass reduction)"
        raise TileCapacityError(
            f"vector ops [{what}] with vec tile {tuple(g.raw_tile)} on shape {list(space)}: one task needs {need} bytes "
            f"of UB ({plan.count} live buffers{red}: {_describe(plan, graph)}), UB holds {cap} bytes on {chip.name}. "
            f"Rule: the tiles that are live at once must fit UB (a result already takes the buffer of an input it "
            f"alone consumes, and a buffer is freed after its last use). Fix: a tile that fits: {fix}")
    g.ub_bytes = need
    g.ub_plan = plan
    # ping-pong needs two copies of the task's buffers; a group that fits only once runs single-buffered
    g.slots = 2 if (double_buffer and 2 * need <= cap) else 1


def _fit_tile(g: Group, graph: TensorGraph, cap: int):
    tile = list(g.tile)
    for _ in range(64):
        need, _ = _task_bytes(g, graph, tile)
        if need <= cap:
            return tuple(tile)
        cands = [d for d in range(len(tile) - 1) if tile[d] > 1 and d not in g.reduced]
        if cands:
            d = max(cands, key=lambda d: tile[d])
            tile[d] = max(1, tile[d] // 2)
        elif tile[-1] > 32 and (len(tile) - 1) not in g.reduced:
            tile[-1] //= 2
        else:
            return None
    return None
