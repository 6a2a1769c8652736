"""The seed article's memory-pool switches (section 4.2, "内存优化配置"): `enable_memory_pool`,
`disable_memory_pool` and `set_memory_allocator`, which choose how `pypto_lab.optimize` plans
device memory (GM) and so the peak memory its report shows.

* memory pool on (`enable_memory_pool`): buffers are reused at every optimisation level, by the
  allocator in force; off (`disable_memory_pool`): every tensor gets its own buffer ("naive").
  Neither called: the ``memory_optimization`` option decides as before (reuse from level 2 on).
  Both switches set that option (`pypto_lab.set_optimization_options`).
* allocators (`pypto_lab.analysis.memory_plan`): "unified" (default; one arena for every tensor,
  best-fit reuse with coalescing), "caching" (a PyTorch/torch_npu-style caching allocator: sizes
  rounded up to 512 B or to 2 MiB multiples, freed blocks cached and reused whole, reserved memory
  never returned) and "naive" (no reuse).
"""

from __future__ import annotations

from ..passes.options import ALLOCATORS, MemoryConfigError
from . import settings as options


def enable_memory_pool() -> None:
    """Reuse device buffers at every level, with the allocator `set_memory_allocator` chose."""
    options.set_optimization_options({"memory_optimization": True})


def disable_memory_pool() -> None:
    """Give every tensor its own device buffer at every level (no reuse)."""
    options.set_optimization_options({"memory_optimization": False})


def set_memory_allocator(name: str) -> str:
    """Choose the allocator `optimize` plans GM with: "unified", "caching" or "naive"; returns it."""
    return options.set_allocator(name)


def get_memory_allocator() -> str:
    return options.get_allocator()


def memory_pool_enabled() -> bool | None:
    """True/False after enable/disable_memory_pool (or the memory_optimization option); None: by level."""
    return options.get_optimization_options()["memory_optimization"]


def plan_allocator(level: int) -> str:
    """The allocator `optimize` plans with at ``level``: naive without reuse, else the chosen one."""
    return options.current().plan_allocator(level)


def reset_memory() -> None:
    """Back to the defaults: pool by level (memory_optimization None), allocator "unified"."""
    options.set_optimization_options({"memory_optimization": None})
    options.set_allocator("unified")


__all__ = ["ALLOCATORS", "MemoryConfigError", "disable_memory_pool", "enable_memory_pool", "get_memory_allocator",
           "memory_pool_enabled", "plan_allocator", "reset_memory", "set_memory_allocator"]
