"""The options one `optimize` run takes: the seed article's `set_optimization_options({...})` keys
and the memory allocator, as a typed, frozen `OptimizationOptions` value handed to the passes and
the analyses (so a run never sees options change under it).

This module holds no state: the settings a session changes (`pypto_lab.set_optimization_options`,
`set_memory_allocator`, the memory-pool switches) live in `pypto_lab.session.settings`, which the
public `pypto_lab.optimize` reads and passes here as a value.
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
}
# options that moved: the key, and what to use instead
MOVED = {"kernel_launch_us": "the cost of launching a kernel belongs to the software stack: pass stack= to "
                             "optimize (a preset name of pypto_lab.list_stacks(), or a copy of one with "
                             "launch_us changed; see pypto_lab.stack)"}


class OptimizeError(ValueError):
    """Bad arguments to `optimize` or its options: the message names the value, the rule and a fix."""


class MemoryConfigError(OptimizeError):
    """An unknown allocator: the message lists the known ones."""


@dataclass(frozen=True)
class OptimizationOptions:
    """The options one `optimize` run uses."""

    graph_optimization_level: int = 1
    memory_optimization: bool | None = None
    computation_optimization: bool = True
    communication_optimization: bool = False
    auto_mixed_precision: bool = True
    allocator: str = "unified"

    def __post_init__(self):
        for key in OPTION_DEFAULTS:
            check_option(key, getattr(self, key))
        check_allocator(self.allocator)

    def plan_allocator(self, level: int) -> str:
        """The allocator GM is planned with at ``level``: "naive" (no reuse) unless buffers are
        reused (memory_optimization, else from level 2 on), then the chosen allocator."""
        reuse = level >= 2 if self.memory_optimization is None else bool(self.memory_optimization)
        return self.allocator if reuse else "naive"


def check_option(key: str, value: Any) -> None:
    """Raise `OptimizeError` unless ``value`` is a valid value of option ``key``."""
    if key in MOVED:
        raise OptimizeError(f"optimization option {key!r} is gone: {MOVED[key]}")
    if key not in OPTION_DEFAULTS:
        raise OptimizeError(f"unknown optimization option {key!r}; known: {', '.join(OPTION_DEFAULTS)}")
    if key == "graph_optimization_level" and (isinstance(value, bool) or value not in (0, 1, 2, 3)):
        raise OptimizeError(f"graph_optimization_level {value!r}: levels are 0, 1, 2, 3")
    if key == "memory_optimization" and value is not None and not isinstance(value, bool):
        raise OptimizeError(f"memory_optimization {value!r}: True (reuse GM buffers), False (never) or None "
                            "(from level 2 on)")
    if key in ("computation_optimization", "communication_optimization", "auto_mixed_precision") and \
            not isinstance(value, bool):
        raise OptimizeError(f"{key} {value!r}: must be True or False")


def check_allocator(name: str) -> None:
    if name not in ALLOCATORS:
        raise MemoryConfigError(f"memory allocator {name!r} is not known; choose one of "
                                f"{', '.join(map(repr, ALLOCATORS))} ('unified': one best-fit arena, "
                                "'caching': 2 MiB-rounded cached blocks, 'naive': no reuse)")


__all__ = ["ALLOCATORS", "MOVED", "OPTION_DEFAULTS", "MemoryConfigError", "OptimizationOptions", "OptimizeError",
           "check_allocator", "check_option"]
