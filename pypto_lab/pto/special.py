"""Ops that do not tile element-wise (gather, scatter, sort, cumsum, random, ...): the registry
that tiling, scheduling and execution consult for them.

Each such op is one Tensor Graph node whose kind is in `graph.SPECIAL_KINDS`. It registers:

* ``run(node, inputs, graph) -> torch.Tensor``: its numerics (in-place ops write into
  ``inputs[0]``, the kernel argument they update, and return it);
* ``tasks(node, nodes, chip) -> list[list[Step]]``: the work of one group, cut into tasks that
  the Block Graph deals over the vector cores. A task is a list of steps run one after the other:
  ``("load", nbytes, count)`` / ``("store", nbytes, count)``: ``count`` GM <-> UB transfers of
  ``nbytes`` each on MTE2 / MTE3 (a gather of rows is one transfer per row, so its cost scales
  with the rows indexed, not with the source tensor); ``("vec", instr, dtypes, repeats)``: one
  Vector instruction of the chip's timing table over ``repeats`` repeats of 256 B.

Costs therefore come only from the chip preset: ``chip.data_path(...)`` for transfers and
``chip.vector.timing(...)`` for instructions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..hw.programs import gm_rates

REGISTRY: dict[str, SpecialOp] = {}


@dataclass(frozen=True)
class SpecialOp:
    run: Callable
    tasks: Callable
    inplace: bool = False    # the output is input 0's storage (scatter_update, index_add_, scatter_)
    unit: str = "vector"     # the cores its tasks are dealt to: "vector" or "cube"
    flops: Callable | None = None  # (node, nodes) -> floating-point operations (default: one per output element)


def register(kind: str, run: Callable, tasks: Callable, inplace: bool = False, unit: str = "vector",
             flops: Callable | None = None) -> None:
    REGISTRY[kind] = SpecialOp(run, tasks, inplace, unit, flops)


def reps(chip, elems: float, nbytes: int) -> int:
    """Repeats of 256 B a vector instruction needs for ``elems`` elements of ``nbytes`` bytes."""
    return max(1, -(-int(elems * nbytes) // chip.vector.repeat_bytes))


def vkey(dtype) -> str:
    """The dtype key of a same-dtype instruction (``FP32``, ``INT16``, ...)."""
    return dtype.lab.upper()


def copy_key(dtype) -> str:
    """The key of a data movement instruction (VGATHER / VCOPY) for elements of ``dtype``."""
    return "UINT32_UINT32" if dtype.bytes >= 4 else "UINT16_UINT16"


def chunks(total: int, per: int) -> list[int]:
    """``total`` items in tasks of ``per`` (the last one shorter)."""
    per = max(1, int(per))
    return [min(per, total - i) for i in range(0, total, per)] or [0]


def rows_per_task(node, inner: int) -> int:
    """How many rows of ``inner`` elements one task takes: a vector tile's worth (the tile shape
    in force when the op was traced), at least one row."""
    tile = node.vec_tile
    if not tile:
        return 1
    return max(1, math.prod(tile) // max(1, inner))


def emit_group(em, g, assign, chip, barrier: dict) -> None:
    """Emit every core's tasks of a special group: its steps chained, two UB slots per core (a
    task's first transfer waits for the task two before it to finish)."""
    p_in, p_out = chip.data_path("GM_TO_UB"), chip.data_path("UB_TO_GM")
    def gm_bytes(s, direction: str):   # "load" (GM -> ...) or "store" (... -> GM)
        if s[0] == direction:
            return s[1] * s[2]
        if s[0] != "path":
            return 0
        on_path = s[1].startswith("GM_TO") if direction == "load" else s[1].endswith("TO_GM")
        return s[2] * s[3] if on_path else 0

    reads = {c: sum(gm_bytes(s, "load") for t in ts for s in g.steps[t[0]]) for c, ts in assign.items()}
    total = sum(reads.values())
    written = sum(gm_bytes(s, "store") for ts in assign.values() for t in ts for s in g.steps[t[0]])
    rate_rd, rate_wr, hbm_share = gm_rates(chip, total, total, max(reads.values() or [0]), max(1, len(assign)),
                                           hbm_writes=written)
    for core, tasks in assign.items():
        ends: list[int] = []
        for (t,) in tasks:
            prev = barrier.get(core)
            slot_free = ends[-2] if len(ends) >= 2 else None
            first = True
            for step in g.steps[t]:
                deps = (prev, slot_free) if first else (prev,)
                first = False
                if step[0] in ("load", "store"):
                    path = p_in if step[0] == "load" else p_out
                    nbytes, count = step[1], step[2]
                    if count <= 0 or nbytes <= 0:
                        continue
                    cycles = count * path.occupancy(nbytes, rate_rd if step[0] == "load" else rate_wr)
                    what = "load GM->UB" if step[0] == "load" else "store UB->GM"
                    prev = em.emit(core, path.pipe, cycles, what, deps, path.latency_cycles)
                    if step[0] == "store":
                        em.emit(core, "MTE2", count * nbytes / hbm_share, "HBM write-back")
                elif step[0] == "path":
                    _, name, nbytes, count = step
                    path = chip.data_path(name)
                    rate = rate_rd if name.startswith("GM_TO") else rate_wr if name.endswith("TO_GM") else None
                    prev = em.emit(core, path.pipe, count * path.occupancy(nbytes, rate), name, deps, path.latency_cycles)
                    if name.endswith("TO_GM"):
                        em.emit(core, "MTE2", count * nbytes / hbm_share, "HBM write-back")
                elif step[0] == "cube":
                    prev = em.emit(core, "CUBE", chip.cube.startup_cycles + step[1], "mmad", deps)
                else:
                    _, instr, key, r = step
                    prev = em.repeats(core, chip, instr, chip.vector.timing(instr, key), r, deps)
            if prev is not None:
                ends.append(prev)


__all__ = ["REGISTRY", "SpecialOp", "register", "reps", "vkey", "copy_key", "chunks", "rows_per_task",
           "emit_group"]
