"""Costing is a lookup: one coster per kind of kernel spec, ``cost(spec, chip) -> KernelCost``.

The built-in costers (`cube`, `vector`, `attention`, `host`, `custom`, `moe`, `collective`,
`pto_bridge`) register themselves with `coster` when `pypto_lab.kernels` is imported; a new kind of
kernel registers its own the same way. Simulations are deterministic functions of the spec and the
chip, and a workload repeats the same kernels many times (ResNet's bottlenecks, BERT's layers, an
LLM's layers, every pass snapshot), so each distinct spec is costed once per chip object (a memo
of at most `MEMO_LIMIT` entries per chip; `clear_memo` empties it).

Two strategies: ``"exact"`` simulates the spec as given; ``"grid"`` (`pypto_lab.kernels.grid`)
costs a spec whose sizes vary from step to step (an LLM's tokens per step, its context length)
from simulations at the points of a geometric grid, interpolated, so that a model is costed at
every batch and context in seconds. Any caller may ask for either.

There is one result type: `KernelCost` (what one run of a spec costs) and, for a kernel placed
in a workload, `CostedKernel` (the `Kernel` — name, spec, graph nodes — its cost, and how many
times the step runs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..hw.chip import Chip
from ..hw.kernels import KernelReport
from .ir import CollectiveKernel, Kernel, KernelSpec

# strategies other than "exact", by name: ``fn(spec, chip) -> KernelCost`` (`grid.py` registers "grid")
STRATEGIES: dict[str, Callable[[Any, Chip], KernelCost]] = {}


@dataclass(frozen=True)
class KernelCost:
    """What the chip model says one run of a kernel costs: cycles and time, the bytes it moves
    between GM and the cores (and the least that crosses DRAM, each operand once, less what L2
    kept between operators: ``hbm_bytes``), its
    flops and roofline bound, its tiling, the simulator's reports behind the figures, and the
    cores it occupies (("AIC",), ("AIV",), both, ("AI Core",), ("host",) or ("link",))."""

    cycles: float
    time_us: float
    gm_bytes: float
    tile: Mapping[str, Any] = field(default_factory=dict)
    reports: tuple[KernelReport, ...] = ()
    resources: tuple[str, ...] = ()
    flops: float = 0.0
    bound: str = ""
    hbm_bytes: float = 0.0

    @classmethod
    def of(cls, reports: list[KernelReport] | tuple[KernelReport, ...], resources: tuple[str, ...]) -> KernelCost:
        """The cost of kernels run one after another (e.g. a quantise pass, then the matmul); the
        first report's bound."""
        return cls(sum(r.cycles for r in reports), sum(r.time_us for r in reports), sum(r.gm_bytes for r in reports),
                   dict(reports[0].tile) if reports else {}, tuple(reports), resources,
                   flops=float(sum(r.flops for r in reports)), bound=str(reports[0].bound) if reports else "",
                   hbm_bytes=float(sum(max(0.0, (getattr(r, "min_gm_bytes", 0.0) or r.gm_bytes)
                                           - getattr(r, "l2_kept_bytes", 0.0)) for r in reports)))

    def scaled(self, f: float) -> KernelCost:
        """``f`` times the work (a kernel linear in a size beyond the simulated one)."""
        return KernelCost(self.cycles * f, self.time_us * f, self.gm_bytes * f, self.tile, self.reports,
                          self.resources, self.flops * f, self.bound, self.hbm_bytes * f)

    @staticmethod
    def lerp(a: KernelCost, b: KernelCost, t: float) -> KernelCost:
        """Between ``a`` (t = 0) and ``b`` (t = 1): every figure linear, the nearer one's bound."""
        def mix(x: float, y: float) -> float:
            return x + (y - x) * t
        near = b if t >= 0.5 else a
        return KernelCost(mix(a.cycles, b.cycles), mix(a.time_us, b.time_us), mix(a.gm_bytes, b.gm_bytes),
                          near.tile, near.reports, a.resources, mix(a.flops, b.flops), near.bound,
                          mix(a.hbm_bytes, b.hbm_bytes))


@dataclass(frozen=True)
class CostedKernel:
    """One kernel of a workload and what the chip model says it costs: the `Kernel` (its name,
    spec and graph nodes), the cost of one run, and ``count``, the runs a step makes of it (an
    LLM layer's kernel runs once per layer). ``io_bytes`` is what one run reads and writes, for a
    front end's activation accounting (0 where not given); ``phase`` and ``start_us`` place it in
    a training step (forward, backward, recompute, optimizer) on the step's timeline."""

    kernel: Kernel
    cost: KernelCost
    count: int = 1
    io_bytes: float = 0.0
    phase: str = ""
    start_us: float = 0.0

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def spec(self) -> KernelSpec:
        return self.kernel.spec

    @property
    def unit(self) -> str:
        return self.kernel.unit

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.kernel.nodes

    @property
    def fused_ops(self) -> tuple[str, ...]:
        return self.kernel.fused_ops

    @property
    def collective(self) -> bool:
        return isinstance(self.kernel.spec, CollectiveKernel)

    @property
    def cycles(self) -> float:
        return self.cost.cycles * self.count

    @property
    def time_us(self) -> float:
        """The kernel's time on the device over all its runs (the stack's launch not included)."""
        return self.cost.time_us * self.count

    @property
    def time_us_each(self) -> float:
        return self.cost.time_us

    @property
    def gm_bytes(self) -> float:
        return self.cost.gm_bytes * self.count

    @property
    def flops(self) -> float:
        return self.cost.flops * self.count

    @property
    def tile(self) -> dict[str, Any]:
        return dict(self.cost.tile)

    @property
    def reports(self) -> tuple:
        return self.cost.reports

    @property
    def resources(self) -> tuple[str, ...]:
        return self.cost.resources

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "kind": self.spec.kind, "fused_ops": list(self.fused_ops),
                "count": self.count, "cycles": self.cycles, "time_us": self.time_us,
                "time_us_each": self.time_us_each, "gm_bytes": self.gm_bytes, "flops": self.flops,
                "bound": self.cost.bound, "tile": self.tile}


Coster = Callable[[Any, Chip], KernelCost]
COSTERS: dict[type, Coster] = {}


def coster(kind: type) -> Callable[[Coster], Coster]:
    """Decorator: ``fn(spec, chip) -> KernelCost`` costs specs of class ``kind``."""
    def register(fn: Coster) -> Coster:
        if kind in COSTERS and COSTERS[kind] is not fn:
            raise ValueError(f"{kind.__name__} already has a coster ({COSTERS[kind].__qualname__}); one per kind")
        COSTERS[kind] = fn
        return fn
    return register


MEMO_LIMIT = 20_000
_MEMO: dict[int, tuple[Chip, dict[Any, KernelCost]]] = {}


def memo_of(chip: Chip) -> dict[Any, KernelCost]:
    """The memo of ``chip`` (one dict per chip object, emptied when it reaches `MEMO_LIMIT`)."""
    per_chip = _MEMO.get(id(chip))
    if per_chip is None or per_chip[0] is not chip:
        per_chip = _MEMO[id(chip)] = (chip, {})
    memo = per_chip[1]
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    return memo


def cost(spec: KernelSpec, chip: Chip, strategy: str = "exact") -> KernelCost:
    """The cost of one run of ``spec`` on ``chip`` (memoised per chip object); ``strategy`` "grid"
    interpolates between simulated grid points (`pypto_lab.kernels.grid`)."""
    if not isinstance(chip, Chip):
        raise TypeError(f"cost() needs a Chip, got {type(chip).__name__}: resolve it once with "
                        "pypto_lab.get_chip(name_or_path) and pass the object")
    if strategy != "exact":
        fn = STRATEGIES.get(strategy)
        if fn is None:
            raise ValueError(f"strategy = {strategy!r}: one of exact, {', '.join(STRATEGIES)}")
        return fn(spec, chip)
    memo = memo_of(chip)
    hit = memo.get(spec)
    if hit is None:
        fn = COSTERS.get(type(spec))
        if fn is None:
            raise TypeError(f"no coster for {type(spec).__name__}; register one with "
                            "@pypto_lab.kernels.cost.coster(" + type(spec).__name__ + ")")
        hit = memo[spec] = fn(spec, chip)
    return hit


def clear_memo() -> None:
    """Forget every cost (benchmarks time cold costing with it)."""
    _MEMO.clear()


def memo_size() -> int:
    return sum(len(m) for _, m in _MEMO.values())


def split_resources(chip: Chip, *units: str) -> tuple[str, ...]:
    """The cores a kernel holds: on split-core chips (910B) the named ones ("AIC", "AIV"); on
    chips whose AI Core has both units, the whole AI Core."""
    return tuple(units) if chip.split_cores else ("AI Core",)


__all__ = ["COSTERS", "MEMO_LIMIT", "STRATEGIES", "CostedKernel", "KernelCost", "clear_memo", "cost", "coster",
           "memo_of", "memo_size", "split_resources"]
