"""The settings a session changes, as the seed article writes them: `set_optimization_options`,
the memory allocator and the memory pool. This is the only place they live; the public
`pypto_lab.optimize` reads them here once per call and hands them to the compiler as a frozen
`OptimizationOptions`, so nothing below this layer reads global settings.
"""

from __future__ import annotations

from typing import Any

from ..passes.options import (
    OPTION_DEFAULTS,
    OptimizationOptions,
    OptimizeError,
    check_allocator,
    check_option,
)

_OPTIONS: dict[str, Any] = dict(OPTION_DEFAULTS)
_ALLOCATOR = {"name": "unified"}


def set_optimization_options(options: dict[str, Any]) -> dict[str, Any]:
    """Set defaults for `optimize` with the keys the seed article uses; returns the options in force."""
    if not isinstance(options, dict):
        raise OptimizeError(f"set_optimization_options takes a dict of options, got {type(options).__name__}")
    for key, value in options.items():
        check_option(key, value)
    _OPTIONS.update(options)
    return dict(_OPTIONS)


def get_optimization_options() -> dict[str, Any]:
    return dict(_OPTIONS)


def set_allocator(name: str) -> str:
    check_allocator(name)
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


__all__ = ["current", "get_allocator", "get_optimization_options", "reset", "set_allocator",
           "set_optimization_options"]
