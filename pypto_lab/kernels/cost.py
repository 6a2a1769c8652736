"""Costing is a lookup: one coster per kind of kernel spec, ``cost(spec, chip) -> KernelCost``.

The built-in costers (`cube`, `vector`, `attention`, `host`, `custom`) register themselves with
`coster`; a new kind of kernel (a collective, a backward kernel, an optimizer step) registers its
own the same way. Simulations are deterministic functions of the spec and the chip, and a model
repeats the same kernels many times (ResNet's bottlenecks, BERT's layers, every pass snapshot),
so each distinct spec is costed once per chip object (`clear_memo` empties the memo).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..hw.chip import Chip
from ..hw.kernels import KernelReport
from .ir import KernelSpec


@dataclass(frozen=True)
class KernelCost:
    """What the chip model says one kernel costs: cycles and time, the bytes it moves between GM
    and the cores, its tiling, the simulator's reports behind the figures, and the cores it
    occupies (("AIC",), ("AIV",), both, ("AI Core",) or ("host",))."""

    cycles: float
    time_us: float
    gm_bytes: float
    tile: Mapping[str, Any] = field(default_factory=dict)
    reports: tuple[KernelReport, ...] = ()
    resources: tuple[str, ...] = ()

    @classmethod
    def of(cls, reports: list[KernelReport] | tuple[KernelReport, ...], resources: tuple[str, ...]) -> KernelCost:
        """The cost of kernels run one after another (e.g. a quantise pass, then the matmul)."""
        return cls(sum(r.cycles for r in reports), sum(r.time_us for r in reports), sum(r.gm_bytes for r in reports),
                   dict(reports[0].tile) if reports else {}, tuple(reports), resources)


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


_MEMO: dict[int, tuple[Chip, dict[KernelSpec, KernelCost]]] = {}
_MEMO_LIMIT = 20_000


def cost(spec: KernelSpec, chip: Chip) -> KernelCost:
    """The cost of ``spec`` on ``chip`` (memoised per chip object)."""
    if not isinstance(chip, Chip):
        raise TypeError(f"cost() needs a Chip, got {type(chip).__name__}: resolve it once with "
                        "pypto_lab.get_chip(name_or_path) and pass the object")
    per_chip = _MEMO.get(id(chip))
    if per_chip is None or per_chip[0] is not chip:
        per_chip = _MEMO[id(chip)] = (chip, {})
    memo = per_chip[1]
    hit = memo.get(spec)
    if hit is None:
        fn = COSTERS.get(type(spec))
        if fn is None:
            raise TypeError(f"no coster for {type(spec).__name__}; register one with "
                            "@pypto_lab.kernels.cost.coster(" + type(spec).__name__ + ")")
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        hit = memo[spec] = fn(spec, chip)
    return hit


def clear_memo() -> None:
    """Forget every cost (benchmarks time cold costing with it)."""
    _MEMO.clear()


def split_resources(chip: Chip, *units: str) -> tuple[str, ...]:
    """The cores a kernel holds: on split-core chips (910B) the named ones ("AIC", "AIV"); on
    chips whose AI Core has both units, the whole AI Core."""
    return tuple(units) if chip.split_cores else ("AI Core",)


__all__ = ["COSTERS", "KernelCost", "clear_memo", "cost", "coster", "split_resources"]
