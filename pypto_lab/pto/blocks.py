"""Stage 3 of the compiler, the Block Graph: which core runs which task of each group.

Vector and copy tasks are dealt round-robin over the vector cores, each group continuing where
the previous one stopped (independent groups, e.g. loop iterations, spread over the chip) (the AIVs of a 910B, the AI
cores' Vector units elsewhere); cube blocks round-robin over the cube cores, as a kernel's
``block_idx`` loop does. A group with fewer tasks than cores leaves cores idle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..hw.chip import Chip
from .special import REGISTRY
from .tiling import TileGraph


def vector_core_ids(chip: Chip) -> list[int]:
    if chip.split_cores:
        return [chip.cube_cores + j for j in range(chip.vector_cores)]
    return list(range(max(1, chip.vector_cores)))


def cube_core_ids(chip: Chip) -> list[int]:
    return list(range(chip.cube_cores))


def n_core_ids(chip: Chip) -> int:
    return chip.cube_cores + chip.vector_cores if chip.split_cores else max(chip.cube_cores, chip.vector_cores)


def core_name(chip: Chip, core: int) -> str:
    if chip.split_cores:
        return f"AIC {core}" if core < chip.cube_cores else f"AIV {core - chip.cube_cores}"
    return f"AI Core {core}"


@dataclass
class BlockGraph:
    """Per group: ``{core: [task, ...]}``; a vector task is the tuple of its tile indices on the
    non-reduced axes, a cube task ``(batch, block row, block column)``."""

    assign: list[dict[int, list[tuple]]]
    chip: Chip

    def cores_used(self) -> int:
        return len({c for a in self.assign for c in a})

    def to_json(self) -> dict:
        return {"stage": "block_graph", "chip": self.chip.name, "groups": [
            {"group": gi, "cores": len(a), "tasks": sum(len(v) for v in a.values()),
             "per_core": {core_name(self.chip, c): [list(t) for t in ts] for c, ts in a.items()}}
            for gi, a in enumerate(self.assign)]}


def build_block_graph(tg: TileGraph, chip: Chip) -> BlockGraph:
    out = []
    turn = {"cube": 0, "vector": 0}  # groups continue the round-robin where the previous one stopped
    for g in tg.groups:
        if g.kind == "cube":
            t = g.cube_tile
            bm, bn = -(-g.m // t.m_l1), -(-g.n // t.n_l1)
            tasks = [(b, i, j) for b in range(g.batch) for i in range(bm) for j in range(bn)]
            cores, unit = cube_core_ids(chip), "cube"
        elif g.kind == "special":
            tasks = [(i,) for i in range(g.n_tasks)]
            unit = REGISTRY[tg.graph.nodes[g.nodes[0]].op].unit
            cores = cube_core_ids(chip) if unit == "cube" else vector_core_ids(chip)
        else:
            ranges = [range(c) if d not in g.reduced else range(1) for d, c in enumerate(g.counts)]
            tasks = list(itertools.product(*ranges))
            cores, unit = vector_core_ids(chip), "vector"
        base = turn[unit]
        assign: dict[int, list[tuple]] = {}
        for i, task in enumerate(tasks):
            assign.setdefault(cores[(base + i) % len(cores)], []).append(task)
        turn[unit] = (base + len(tasks)) % len(cores)
        out.append(assign)
    return BlockGraph(out, chip)
