"""The cost of HCCL collectives (allreduce, allgather, reducescatter, alltoall, broadcast) on a
multi-card topology: which algorithm, how many steps, how many bytes each card puts on the wire,
and how long it takes.

The model is alpha-beta per step, as in HCCL's own algorithm documentation ("集合通信算法介绍":
Mesh, Ring, RHD pages): a step costs the link's latency (alpha) plus its bytes over the link's
bandwidth (beta), and a reduction costs gamma per reduced byte. ``n`` is the buffer each card works
on (``nbytes``, what hccl_test calls data_size): the tensor of an allreduce, the gathered output of
an allgather, the input of a reducescatter, each card's send buffer of an alltoall, the root's
buffer of a broadcast. With ``p`` cards on one level:

=================  =======================  ===================  ========================
algorithm          reducescatter/allgather  scatter              alltoall
=================  =======================  ===================  ========================
ring               p-1 steps of n/p         p-1 steps of n/p     p-1 steps of n/p
halving_doubling   log2 p steps, (p-1)/p n  log2 p steps         log2 p steps of n/2 (Bruck)
mesh               1 step: n/p to every     1 step               1 step
                   peer at once, one link
                   each (full mesh only)
=================  =======================  ===================  ========================

allreduce = reducescatter + allgather (ring: 2(p-1) steps of n/p, so 2(p-1)/p n bytes per card);
broadcast = scatter + allgather. A reducescatter also reduces (p-1)/p n bytes on the card; that is
costed on the vector unit as HBM traffic, 2 bytes read and 1 written per reduced byte, at the chip
preset's ``hbm_gbps``. When the cards span several units of a level (HCCS groups, servers) the
collective is hierarchical, innermost level first: allreduce = reducescatter inside + allreduce of
n/p0 across + allgather inside; reducescatter and allgather likewise; broadcast = scatter inside
the root's unit + broadcast of n/p0 across + allgather inside; alltoall = an alltoall inside then
one across (rail by rail). ``algorithm="auto"`` picks, level by level, the fastest valid algorithm;
an explicit algorithm must be valid on every level crossed. The topology's ``launch_us`` is paid
once per collective. One card costs nothing.

Not modelled: contention with compute for HBM and cores, HCCL's pipelined and NHR/NB/AHC variants,
double-ring and star, uneven (non power-of-two) halving-doubling with its extra traffic, network
congestion, and message sizes below a link's packet size.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .topology import (
    TOPOLOGY_DIR,
    Level,
    Topology,
    TopologyError,
    get_topology,
    list_topologies,
    load_topology,
)

__all__ = [
    "ALGORITHMS", "KINDS", "TOPOLOGY_DIR", "CollectiveCost", "Level", "Phase", "Topology", "TopologyError",
    "collective", "get_topology", "list_topologies", "load_topology",
]

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
ALGORITHMS = ("auto", "ring", "halving_doubling", "mesh")
_CANDIDATES = ("ring", "halving_doubling", "mesh")  # "auto" tries these in this order; ties keep the first
_REDUCE_HBM_BYTES = 3  # per reduced byte: read two operands, write one result


@dataclass(frozen=True)
class Phase:
    """One primitive on one level: e.g. a reducescatter over the HCCS mesh of 8 cards."""

    level: str
    link: str
    op: str  # reducescatter, allgather, scatter, alltoall
    algorithm: str
    cards: int
    nbytes: float
    time_us: float
    steps: int
    bytes_on_wire_per_card: float
    reduce_us: float = 0.0


@dataclass(frozen=True)
class CollectiveCost:
    """What a collective costs: time, algorithm steps and bytes each card sends, and the phases."""

    kind: str
    algorithm: str  # per level crossed, innermost first, joined by "+": "mesh+ring"
    cards: int
    nbytes: float
    time_us: float
    steps: int
    bytes_on_wire_per_card: float
    link: str  # the links used, innermost first: "HCCS", "HCCS+RoCE"; "none" for one card
    topology: str = ""
    launch_us: float = 0.0
    phases: tuple[Phase, ...] = ()

    @property
    def algbw_gbps(self) -> float:
        """hccl_test's alg_bandwidth: nbytes / time, GB/s (0 when the collective is free)."""
        return self.nbytes / (self.time_us * 1e3) if self.time_us > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phases"] = [asdict(p) for p in self.phases]
        d["algbw_gbps"] = self.algbw_gbps
        return d


# ---- one primitive on one level ---------------------------------------------------------------

def _is_pow2(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def _invalid(algorithm: str, level: Level, p: int) -> str:
    """Why ``algorithm`` cannot run on ``p`` cards of ``level``, or "" if it can."""
    if algorithm == "halving_doubling" and not _is_pow2(p):
        return (f"halving_doubling needs a power-of-two card count on every level; level '{level.name}' "
                f"({level.link}) has {p} cards")
    if algorithm == "mesh" and level.kind != "full_mesh":
        return (f"mesh needs a full-mesh level (each card linked to every peer); level '{level.name}' "
                f"({level.link}) is {level.kind}")
    return ""


def _fix(algorithm: str, level: Level, p: int, cards: int) -> str:
    if algorithm == "halving_doubling":
        lower = 2 ** int(math.log2(p))
        counts = sorted({cards // p * lower, cards // p * lower * 2})
        return (f"use {' or '.join(map(str, counts))} cards (a power of two on '{level.name}'), "
                "or algorithm='ring' / 'auto'")
    return (f"use algorithm='auto' (mesh inside the full-mesh level, ring or halving_doubling across "
            f"'{level.name}'), or keep the cards inside one full-mesh unit")


def _steps_and_bytes(op: str, algorithm: str, p: int, n: float) -> tuple[int, float, float]:
    """(steps, bytes each card sends, bytes on the busiest link of a card) of one primitive."""
    share = (p - 1) / p * n
    if algorithm == "mesh":  # n/p to each of the p-1 peers at once, each on its own link
        return 1, share, n / p
    if algorithm == "halving_doubling":
        k = int(math.log2(p))
        if op == "alltoall":  # Bruck: log2 p rounds of half the buffer
            return k, k * n / 2, k * n / 2
        return k, share, share
    return p - 1, share, share  # ring (and pairwise alltoall over one port)


def _phase(op: str, algorithm: str, level: Level, p: int, n: float, hbm_gbps: float) -> Phase:
    steps, sent, on_link = _steps_and_bytes(op, algorithm, p, n)
    wire_us = on_link / (level.effective_gbps * 1e3)  # GB/s = 1e3 bytes per us
    reduce_us = (p - 1) / p * n * _REDUCE_HBM_BYTES / (hbm_gbps * 1e3) if op == "reducescatter" else 0.0
    return Phase(level=level.name, link=level.link, op=op, algorithm=algorithm, cards=p, nbytes=n,
                 time_us=steps * level.latency_us + wire_us + reduce_us, steps=steps,
                 bytes_on_wire_per_card=sent, reduce_us=reduce_us)


# ---- the hierarchy ------------------------------------------------------------------------------

def _plan(kind: str, levels: list[int], counts: tuple[int, ...], n: float) -> list[tuple[int, str, float]]:
    """The primitives of ``kind`` over the crossed levels (indices, innermost first), in order:
    (level index, op, bytes). Independent of the algorithm."""
    if not levels:
        return []
    i, rest = levels[0], levels[1:]
    p = counts[i]
    if kind == "allreduce":
        if not rest:
            return [(i, "reducescatter", n), (i, "allgather", n)]
        return [(i, "reducescatter", n), *_plan(kind, rest, counts, n / p), (i, "allgather", n)]
    if kind == "reducescatter":
        return [(i, "reducescatter", n), *_plan(kind, rest, counts, n / p)]
    if kind == "allgather":
        return [*_plan(kind, rest, counts, n / p), (i, "allgather", n)]
    if kind == "broadcast":
        return [(i, "scatter", n), *_plan(kind, rest, counts, n / p), (i, "allgather", n)]
    return [(i, "alltoall", n), *_plan(kind, rest, counts, n)]  # alltoall: inside, then rail by rail


def _check_kind(kind: Any) -> str:
    if isinstance(kind, str) and kind.lower() in KINDS:
        return kind.lower()
    close = difflib.get_close_matches(str(kind).lower().replace("_", ""), KINDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise TopologyError(f"kind = {kind!r}: unknown collective; the known kinds are {', '.join(KINDS)}; "
                        f"fix: {hint}pass one of them")


def _check_algorithm(algorithm: Any) -> str:
    if isinstance(algorithm, str) and algorithm.lower() in ALGORITHMS:
        return algorithm.lower()
    close = difflib.get_close_matches(str(algorithm).lower(), ALGORITHMS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise TopologyError(f"algorithm = {algorithm!r}: unknown algorithm; HCCL's are {', '.join(ALGORITHMS[1:])} "
                        f"(or 'auto' for the fastest valid one); fix: {hint}pass one of {', '.join(ALGORITHMS)}")


def _check_nbytes(nbytes: Any) -> float:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise TopologyError(f"nbytes = {nbytes!r}: must be a finite number of bytes >= 0 (each card's buffer); "
                            "fix: pass e.g. nbytes=64 * 2**20 for 64 MiB")
    return float(nbytes)


def collective(kind: str, nbytes: float, cards: int, topology: str | Path | Topology,
               algorithm: str = "auto") -> CollectiveCost:
    """Cost of one HCCL collective of ``nbytes`` per card over ``cards`` cards of ``topology``.

    ``kind``: allreduce, allgather, reducescatter, alltoall, broadcast. ``algorithm``: auto, ring,
    halving_doubling, mesh (see the module docstring for the model). Bad input raises
    `TopologyError` naming the rule, the value and a fix.
    """
    kind = _check_kind(kind)
    algorithm = _check_algorithm(algorithm)
    n = _check_nbytes(nbytes)
    topo = get_topology(topology)
    counts = topo.placement(cards)
    if cards == 1:
        return CollectiveCost(kind=kind, algorithm="none", cards=1, nbytes=n, time_us=0.0, steps=0,
                              bytes_on_wire_per_card=0.0, link="none", topology=topo.name)
    crossed = [i for i, p in enumerate(counts) if p > 1]
    if algorithm != "auto":
        for i in crossed:
            why = _invalid(algorithm, topo.levels[i], counts[i])
            if why:
                raise TopologyError(f"algorithm = {algorithm!r} with cards = {cards} on {topo.name}: {why}; "
                                    f"fix: {_fix(algorithm, topo.levels[i], counts[i], cards)}")
    hbm_gbps = topo.chip_preset().hbm_gbps
    plan = _plan(kind, crossed, counts, n)

    def phases_with(i: int, algo: str) -> list[Phase]:
        return [_phase(op, algo, topo.levels[i], counts[i], b, hbm_gbps) for j, op, b in plan if j == i]

    chosen: dict[int, str] = {}
    for i in crossed:
        if algorithm != "auto":
            chosen[i] = algorithm
            continue
        best, best_t = "", math.inf
        for algo in _CANDIDATES:
            if _invalid(algo, topo.levels[i], counts[i]):
                continue
            t = sum(ph.time_us for ph in phases_with(i, algo))
            if t < best_t:
                best, best_t = algo, t
        chosen[i] = best
    phases = tuple(_phase(op, chosen[i], topo.levels[i], counts[i], b, hbm_gbps) for i, op, b in plan)
    return CollectiveCost(
        kind=kind,
        algorithm="+".join(chosen[i] for i in crossed),
        cards=cards,
        nbytes=n,
        time_us=topo.launch_us + sum(ph.time_us for ph in phases),
        steps=sum(ph.steps for ph in phases),
        bytes_on_wire_per_card=sum(ph.bytes_on_wire_per_card for ph in phases),
        link="+".join(dict.fromkeys(topo.levels[i].link for i in crossed)),
        topology=topo.name,
        launch_us=topo.launch_us,
        phases=phases,
    )
