"""The options `optimize` runs with: the seed article's `set_optimization_options({...})` keys and
the memory allocator of `pypto_lab.memory`, kept in one place and handed to the passes as a typed,
frozen `OptimizationOptions` snapshot (so a run never sees options change under it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALLOCATORS = ("naive", "unified", "caching")

# The keys of the seed article's `pypto.set_optimization_options({...})`, with their defaults.
OPTION_DEFAULTS: dict[str, Any] = {
    "graph_optimization_level": 1,      # the level optimize() uses when none is given
    "memory_optimization": None,        # GM buffer reuse; None: from level 2 on
    "computation_optimization": True,   # recorded; the fusion passes are what computation optimisation is here
    "communication_optimization": False,  # recorded; one chip, no collective communication is modelled
    "auto_mixed_precision": True,       # precision when none is given: fp16 (True) or fp32 (False)
    "kernel_launch_us": 0.0,            # fixed cost per kernel; no public figure, so 0 unless you set one
}
_OPTIONS: dict[str, Any] = dict(OPTION_DEFAULTS)
_ALLOCATOR = {"name": "unified"}


class OptimizeError(ValueError):
    """Bad arguments to `optimize` or its options: the message names the value, the rule and a fix."""


class MemoryConfigError(OptimizeError):
    """An unknown allocator: the message lists the known ones."""


@dataclass(frozen=True)
class OptimizationOptions:
    """The options one `optimize` run uses (a snapshot of the settings in force when it started)."""

    graph_optimization_level: int = 1
    memory_optimization: bool | None = None
    computation_optimization: bool = True
    communication_optimization: bool = False
    auto_mixed_precision: bool = True
    kernel_launch_us: float = 0.0
    allocator: str = "unified"

    def plan_allocator(self, level: int) -> str:
        """The allocator GM is planned with at ``level``: "naive" (no reuse) unless buffers are
        reused (memory_optimization, else from level 2 on), then the chosen allocator."""
        reuse = level >= 2 if self.memory_optimization is None else bool(self.memory_optimization)
        return self.allocator if reuse else "naive"


def _check(key: str, value: Any) -> None:
    if key == "graph_optimization_level" and (isinstance(value, bool) or value not in (0, 1, 2, 3)):
        raise OptimizeError(f"graph_optimization_level {value!r}: levels are 0, 1, 2, 3")
    if key == "kernel_launch_us" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise OptimizeError(f"kernel_launch_us {value!r}: must be a number of microseconds >= 0")
    if key == "memory_optimization" and value is not None and not isinstance(value, bool):
        raise OptimizeError(f"memory_optimization {value!r}: True (reuse GM buffers), False (never) or None "
                           "(from level 2 on)")
    if key in ("computation_optimization", "communication_optimization", "auto_mixed_precision") and \
            not isinstance(value, bool):
        raise OptimizeError(f"{key} {value!r}: must be True or False")


def set_optimization_options(options: dict[str, Any]) -> dict[str, Any]:
    """Set defaults for `optimize` with the keys the seed article uses; returns the options in force."""
    if not isinstance(options, dict):
        raise OptimizeError(f"set_optimization_options takes a dict of options, got {type(options).__name__}")
    unknown = sorted(set(options) - set(OPTION_DEFAULTS))
    if unknown:
        raise OptimizeError(f"unknown optimization option(s) {', '.join(map(repr, unknown))}; known: "
                           f"{', '.join(OPTION_DEFAULTS)}")
    for key, value in options.items():
        _check(key, value)
    _OPTIONS.update(options)
    return dict(_OPTIONS)


def get_optimization_options() -> dict[str, Any]:
    return dict(_OPTIONS)


def set_allocator(name: str) -> str:
    if name not in ALLOCATORS:
        raise MemoryConfigError(f"memory allocator {name!r} is not known; choose one of "
                           f"{', '.join(map(repr, ALLOCATORS))} ('unified': one best-fit arena, "
                           "'caching': 2 MiB-rounded cached blocks, 'naive': no reuse)")
    _ALLOCATOR["name"] = name
    return name


def get_allocator() -> str:
    return _ALLOCATOR["name"]


def current() -> OptimizationOptions:
    """The options in force now, as the snapshot a run takes."""
    return OptimizationOptions(**_OPTIONS, allocator=_ALLOCATOR["name"])


def reset() -> None:
    """Every option back to its default, allocator "unified"."""
    _OPTIONS.clear()
    _OPTIONS.update(OPTION_DEFAULTS)
    _ALLOCATOR["name"] = "unified"


__all__ = ["ALLOCATORS", "OPTION_DEFAULTS", "MemoryConfigError", "OptimizationOptions", "OptimizeError", "current", "get_allocator",
           "get_optimization_options", "reset", "set_allocator", "set_optimization_options"]
