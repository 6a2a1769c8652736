"""Stage 4 of the compiler, the Execute Graph: per core, the pipe instructions of its tasks
(MTE2 loads, VECTOR / CUBE work, MTE1 / FIXP / MTE3 moves), with the set_flag/wait_flag
dependencies between pipes and ping-pong buffer slots, in one `pypto_lab.hw.simulator.Program`.

Costs come from the chip preset only: transfers from ``chip.data_path(...).occupancy`` (at the
core's share of HBM / L2 bandwidth, `pypto_lab.hw.programs.gm_rates`), vector instructions from
``chip.vector.timing(instr, dtypes)`` (repeats of 256 B, at most ``max_repeats`` per
instruction), mmad from the Cube's fractals. A group waits (a zero-cost SCALAR wait per core)
for the groups whose GM results it reads; independent groups overlap. The building blocks are
the hardware model's own (`pypto_lab.hw.programs`): a cube group's per-core program is the
compiled `CubeProgram` of `simulate_matmul`, with a per-block bias load and a barrier.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..hw.chip import DTYPE_BYTES, PIPES, Chip
from ..hw.programs import CubeProgram, emit_repeats, flush_writebacks, gm_rates, move
from ..hw.simulator import PingPong, Program, ProgramArrays
from . import ops_math, special
from .blocks import BlockGraph
from .graph import REDUCTIONS
from .tiling import TileGraph, is_moveout_transpose

_BINARY = {"add": ("VADD",), "sub": ("VSUB",), "mul": ("VMUL",), "div": ("VDIV",), "maximum": ("VMAX",),
           "minimum": ("VMIN",), "adds": ("VADDS",), "subs": ("VADDS",), "muls": ("VMULS",), "divs": ("VMULS",),
           "rsubs": ("VMULS", "VADDS"), "rdivs": ("VREC", "VMULS"), "exp": ("VEXP",), "sqrt": ("VSQRT",),
           "rsqrt": ("VRSQRT",), "reciprocal": ("VREC",), "neg": ("VMULS",), "abs": ("VABS",), "relu": ("VRELU",)}
_HORNER = ("VMUL", "VADDS") * 4
# erf has no instruction: a clamped rational polynomial in x^2 (as CANN's Erf kernel computes it)
_ERF = ("VMINS", "VMAXS", "VMUL") + _HORNER + ("VMUL",) + _HORNER + ("VDIV",)
_BINARY.update({
    "maxs": ("VMAXS",), "mins": ("VMINS",),
    "sigmoid": ("VMULS", "VEXP", "VADDS", "VREC"),          # 1 / (1 + exp(-x))
    "log": ("VLN",), "expm1": ("VEXP", "VADDS"),
    "erf": _ERF, "erfc": _ERF + ("VMULS", "VADDS"),
    "pow": ("VLN", "VMUL", "VEXP"), "pows": ("VLN", "VMULS", "VEXP"),   # exp(y * ln x)
    "cmp": ("VCMPV",), "cmps": ("VCMPVS",), "where": ("VSEL",),
    "logical_and": (("VAND", "UINT16_UINT16_UINT16"),), "logical_not": (("VNOT", "UINT16_UINT16"),),
    "full": ("VECTORDUP",), "arange": ("VECTORDUP", "VMULS", "VADDS"),
})
# ceil / floor / trunc / round: VCONV to int32 with that rounding mode, and back (filled in per dtype)
_ROUNDING = ("ceil", "floor", "trunc", "round")
# ops that compute in their first input's dtype (their result is DT_BOOL)
_IN_DTYPE = ("cmp", "cmps", "logical_and", "logical_not")
_REDUCE = {"amax": ("VMAX", "VCMAX"), "amin": ("VMIN", "VCMIN"), "sum": ("VADD", "VCADD")}


class Emitter:
    """A Program plus, per group, the last instruction of every (core, pipe) lane it used."""

    def __init__(self):
        self.prog = Program()
        self.lane_last: dict[tuple, int] = {}
        self.group_of: list[int] = []
        self.group = -1
        self.ub: dict[int, PingPong] = {}  # UB slots of each core: shared by the groups that run there

    def __len__(self) -> int:
        return len(self.prog)

    def ub_slots(self, core: int, slots: int) -> PingPong:
        pp = self.ub.get(core)
        if pp is None or pp.slots != slots:
            pp = self.ub[core] = PingPong(slots)
        return pp

    def emit(self, core, pipe, cycles, kind, deps=(), latency=0.0) -> int:
        i = self.prog.emit(core, pipe, cycles, kind, deps, latency)
        self.lane_last[(core, pipe)] = i
        self.group_of.append(self.group)
        return i

    def extend(self, block: ProgramArrays) -> None:
        """Append instructions a compiled tile program built for this group."""
        start = len(self.prog)
        self.prog.extend(block)
        n = block.size
        if n:
            lanes = block.core.astype(int) * len(PIPES) + block.pipe
            last = {}
            for i, lane in enumerate(lanes.tolist()):
                last[lane] = start + i
            for lane, i in last.items():
                self.lane_last[(lane // len(PIPES), PIPES[lane % len(PIPES)])] = i
        self.group_of.extend([self.group] * n)

    # the tile programs' own building blocks (pypto_lab.hw.programs), emitting through this Emitter
    def move(self, core, path, nbytes, kind, deps, rate_cap=None) -> int:
        return move(self, core, path, nbytes, kind, deps, rate_cap)

    def repeats(self, core, chip, instr, timing, reps, deps) -> int:
        return emit_repeats(self, core, chip, instr, timing, max(1, int(reps)), deps)


@dataclass
class ExecuteGraph:
    program: Program
    group_of: list[int]
    chip: Chip
    n_cores: int

    def to_json(self) -> dict:
        p = self.program
        per_core: dict[int, list] = {}
        for i in range(len(p)):
            per_core.setdefault(p.core[i], []).append(
                {"i": i, "pipe": PIPES[p.pipe[i]], "op": p.kinds[p.kind[i]], "cycles": round(p.duration[i], 3),
                 "latency": round(p.latency[i], 3), "wait_for": list(p.deps[i]), "group": self.group_of[i]})
        return {"stage": "execute_graph", "chip": self.chip.name, "instructions": len(p),
                "cores": {str(c): v for c, v in sorted(per_core.items())}}


def _dkey(dtype_lab: str) -> str:
    return dtype_lab.upper()


def _reps(chip, elems, nbytes) -> int:
    return max(1, -(-int(elems * nbytes) // chip.vector.repeat_bytes))


def build_execute_graph(tg: TileGraph, bg: BlockGraph, chip: Chip, n_cores: int) -> ExecuteGraph:
    em = Emitter()
    group_lanes: list[dict] = []
    for g, assign in zip(tg.groups, bg.assign):
        em.group = g.id
        em.lane_last = {}
        dep_instrs = sorted({i for d in g.deps for i in group_lanes[d].values()})
        barrier = {}
        if dep_instrs:
            for c in assign:
                barrier[c] = em.emit(c, "SCALAR", 0.0, "wait for producer stage", dep_instrs)
        if g.kind == "cube":
            _emit_cube(em, g, assign, chip, barrier)
        elif g.kind == "special":
            special.emit_group(em, g, assign, chip, barrier)
        else:
            _emit_vector(em, g, tg.graph, assign, chip, barrier)
        group_lanes.append(dict(em.lane_last))
    return ExecuteGraph(em.prog, em.group_of, chip, n_cores)


# ---- vector / copy groups ---------------------------------------------------------------------

def _task_tiles(g, task) -> list[tuple]:
    """Extents of the tiles of one task (k of them: every tile along the reduced axes)."""
    per_dim = []
    for d, (S, T) in enumerate(zip(g.space, g.tile)):
        if d in g.reduced:
            per_dim.append([min(T, S - i * T) for i in range(g.counts[d])])
        else:
            per_dim.append([min(T, S - task[d] * T)])
    return list(itertools.product(*per_dim))


def _elems(spans, ext) -> int:
    return math.prod(e for e, s in zip(ext, spans) if s)


def _emit_vector(em: Emitter, g, graph, assign, chip: Chip, barrier: dict) -> None:
    nodes = graph.nodes
    p_in, p_out = chip.data_path("GM_TO_UB"), chip.data_path("UB_TO_GM")
    reduced = g.reduced
    last = len(g.space) - 1

    def per_tile(t):
        return any(g.spans[t][d] for d in reduced) or not reduced

    def load_bytes(task):
        tiles = _task_tiles(g, task)
        tot = 0
        for t in g.loads:
            eb = nodes[t].dtype.bytes
            if per_tile(t):
                tot += sum(_elems(g.spans[t], e) for e in tiles) * eb
            else:
                tot += _elems(g.spans[t], tiles[0]) * eb
        return tot

    per_core_reads = {c: sum(load_bytes(t) for t in ts) for c, ts in assign.items()}
    reads = sum(per_core_reads.values())
    unique = sum(math.prod(nodes[t].shape) * nodes[t].dtype.bytes for t in g.loads)
    active = max(1, len(assign))
    written = sum(math.prod(nodes[t].shape) * nodes[t].dtype.bytes for t, _root, _off in g.stores)
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, min(unique, reads), max(per_core_reads.values() or [0]), active,
                                           hbm_writes=written)

    for core, tasks in assign.items():
        ub = em.ub_slots(core, g.slots)
        pending: list = []
        bdep = barrier.get(core)
        for task in tasks:
            tiles = _task_tiles(g, task)
            k = len(tiles)
            slot, free = ub.acquire()
            ready: dict[int, list[int]] = {}
            for t in g.loads:
                eb = nodes[t].dtype.bytes
                if per_tile(t):
                    ready[t] = [em.move(core, p_in, _elems(g.spans[t], e) * eb, f"load %{t} GM->UB", (free, bdep),
                                        rate_rd) for e in tiles]
                else:
                    i = em.move(core, p_in, _elems(g.spans[t], tiles[0]) * eb, f"load %{t} GM->UB", (free, bdep), rate_rd)
                    ready[t] = [i] * k
            flush_writebacks(em, core, pending, hbm_share)
            spill = set(g.spill)
            for nid in g.nodes:
                n = nodes[nid]
                if n.op == "assemble":
                    continue
                ready[nid] = _emit_node(em, core, chip, g, n, nodes, tiles, ready, last)
                if nid in spill:   # a result larger than UB: out to a GM workspace and back, tile by tile
                    eb = n.dtype.bytes
                    back = []
                    for j, e in enumerate(tiles):
                        nb = _elems(g.spans[nid], e) * eb
                        w = em.move(core, p_out, nb, f"spill %{nid} UB->GM", (ready[nid][min(j, len(ready[nid]) - 1)],),
                                    rate_wr)
                        back.append(em.move(core, p_in, nb, f"reload %{nid} GM->UB", (w,), rate_rd))
                    ready[nid] = back
            st = None
            for t, _root, _off in g.stores:
                eb = nodes[t].dtype.bytes
                if per_tile(t):
                    for j, e in enumerate(tiles):
                        nb = _elems(g.spans[t], e) * eb
                        st = em.move(core, p_out, nb, f"store %{t} UB->GM", (ready[t][j],), rate_wr)
                        pending.append(nb)
                else:
                    nb = _elems(g.spans[t], tiles[0]) * eb
                    st = em.move(core, p_out, nb, f"store %{t} UB->GM", (ready[t][-1],), rate_wr)
                    pending.append(nb)
            ub.release(slot, st if st is not None else em.prog.__len__() - 1)
        flush_writebacks(em, core, pending, hbm_share)


def _emit_node(em: Emitter, core: int, chip: Chip, g, n, nodes, tiles, ready, last) -> list[int]:
    op = n.op
    k = len(tiles)
    ins = [i for i in n.inputs]
    if op in REDUCTIONS:
        src = ins[0]
        d = n.attrs["dim"]
        dt = nodes[src].dtype
        tree, cross = _REDUCE[op]
        t_tree = chip.vector.timing(tree, _dkey(dt.lab))
        t_cross = chip.vector.timing(cross, _dkey(dt.lab))
        if g.space[d] == 1:
            return list(ready[src])
        outs = []
        for j, e in enumerate(tiles):
            el = _elems(g.spans[src], e)
            v = em.repeats(core, chip, tree, t_tree, _reps(chip, el, dt.bytes), (ready[src][j],))
            if d == last:
                rows = max(1, el // max(1, e[last]))
                v = em.emit(core, "VECTOR", t_cross.cycles(rows), cross, (v,))
            outs.append(v)
        if d in g.reduced and k > 1:
            out_el = _elems(g.spans[n.id], tiles[0])
            v = outs[0]
            for j in range(1, k):
                v = em.repeats(core, chip, tree, t_tree, _reps(chip, out_el, dt.bytes), (v, outs[j]))
            return [v] * k
        return outs
    if op == "cast":
        src_dt = nodes[ins[0]].dtype
        timing = chip.vector.timing("VCONV", f"{_dkey(src_dt.lab)}_{_dkey(n.dtype.lab)}")
        nb = max(src_dt.bytes, n.dtype.bytes)
        return [em.repeats(core, chip, "VCONV", timing, _reps(chip, _elems(g.spans[n.id], e), nb), (ready[ins[0]][j],))
                for j, e in enumerate(tiles)]
    if op == "transpose" and is_moveout_transpose(n):   # done by the copy out of UB (`tiling.is_moveout_transpose`)
        return list(ready[ins[0]])
    if op == "transpose":
        key = "UINT32" if n.dtype.bytes == 4 else "UINT16"
        timing = chip.vector.timing("VGATHER", f"{key}_{key}")
        return [em.repeats(core, chip, "VGATHER", timing, _reps(chip, _elems(g.spans[n.id], e), n.dtype.bytes),
                           (ready[ins[0]][j],)) for j, e in enumerate(tiles)]
    calc = nodes[ins[0]].dtype if op in _IN_DTYPE or op == "math" else n.dtype
    dk = _dkey(calc.lab)
    if op == "math":  # the extended element-wise ops name their instructions and keys (ops_math)
        instrs = ops_math.instructions(n, nodes)
    elif op in _ROUNDING:
        instrs = (("VCONV", f"{dk}_INT32"), ("VCONV", f"INT32_{dk}"))
    elif op == "expand":
        key = "UINT32_UINT32" if calc.bytes >= 4 else "UINT16_UINT16"
        instrs = (("VCOPY", key),)
    elif op == "pows" and n.attrs.get("scalar") == 2.0:
        instrs = ("VMUL",)
    else:
        instrs = _BINARY[op]
    out = []
    brcb = chip.vector.timing("VBRCB", "UINT16_UINT16" if n.dtype.bytes == 2 else "UINT32_UINT32")
    for j, e in enumerate(tiles):
        el = _elems(g.spans[n.id], e)
        deps = tuple(ready[i][j] for i in ins)
        # a row-broadcast operand (its last axis reduced to 1) is spread over the row first
        for i in ins:
            if g.spans[n.id][last] and not g.spans[i][last]:
                rows = max(1, el // max(1, e[last]))
                deps = (em.emit(core, "VECTOR", brcb.cycles(rows), "VBRCB", deps),)
        v = None
        for instr in instrs:
            instr, key = instr if isinstance(instr, tuple) else (instr, dk)
            v = em.repeats(core, chip, instr, chip.vector.timing(instr, key), _reps(chip, el, calc.bytes), deps)
            deps = (v,)
        out.append(v)
    return out


# ---- cube groups --------------------------------------------------------------------------------

def _emit_cube(em: Emitter, g, assign, chip: Chip, barrier: dict) -> None:
    """Every core's share of a cube group: the compiled Cube program of `simulate_matmul`
    (`pypto_lab.hw.programs.CubeProgram`) with the group's bias load (GM -> L1, and L1 -> BT where
    the chip has a BiasTable) per block, its GM loads waiting for the group's barrier, and its own
    epilogue: FixPipe to GM, or L0C -> UB, the bias add where there is no BiasTable, the cast."""
    tile, plan = g.cube_tile, g.plan
    eb = DTYPE_BYTES[g.in_dtype]
    acc_dt = chip.cube.accumulator[g.in_dtype]
    m, k, n = g.m, g.kk, g.n
    k_steps = -(-k // tile.k_l1)

    def dims(task):
        _, i, j = task
        return min(tile.m_l1, m - i * tile.m_l1), min(tile.n_l1, n - j * tile.n_l1)

    def block_reads(task):
        bm, bn = dims(task)
        if k_steps > 1:  # each L0 sub-tile streams its own rows and columns (see simulate_matmul)
            return (-(-bn // tile.n_l0) * bm + -(-bm // tile.m_l0) * bn) * k * eb
        return (bm + bn) * k * eb

    per_core = {c: sum(block_reads(t) for t in ts) for c, ts in assign.items()}
    reads = sum(per_core.values())
    unique = g.batch * (m * k + k * n) * eb
    written = g.batch * m * n * DTYPE_BYTES[g.out_dtype]
    rate_rd, rate_wr, hbm_share = gm_rates(chip, reads, min(unique, reads), max(per_core.values()), max(1, len(assign)),
                                           hbm_writes=written)
    ops = []
    bias_on_vector = False
    if not chip.split_cores:
        acc = acc_dt.upper()
        if g.bias_bytes and "L1_TO_BT" not in chip.paths:
            # no BiasTable: the bias is added on the Vector unit on the way out of L0C
            ops.append(("VADD", chip.vector.timing("VADD", f"{acc}_{acc}_{acc}")))
            bias_on_vector = True
        if g.out_dtype != acc_dt:
            ops.append(("VCONV", chip.vector.timing("VCONV", f"{acc}_{g.out_dtype.upper()}")))
    program = CubeProgram(chip, tile, dict(plan.slots), g.in_dtype, g.out_dtype, rate_rd, rate_wr, hbm_share,
                          tuple(ops), bias_bytes=g.bias_bytes or 0, bias_on_vector=bias_on_vector, chain=True)
    for core, tasks in assign.items():
        program.emit(em, core, [dims(t) for t in tasks], k, barrier.get(core))


__all__ = ["ExecuteGraph", "build_execute_graph"]
