"""`pypto_lab.optimize` as the seed article calls it: the compiler driver
(`pypto_lab.compiler.optimize`) with the session's settings.

The seed writes ``pypto.set_optimization_options({...})`` and ``pypto.amp.autocast()`` and then
``pypto.optimize(model)``: the settings must reach the run. This function reads them once, here
(the options and allocator of `settings`, the autocast dtype of `pypto_lab.amp`), and hands them
to the driver as values; the driver itself reads no global setting.
"""

from __future__ import annotations

import os

import torch

from ..compiler.optimize import OptimizedModel
from ..compiler.optimize import optimize as compile_model
from ..hw.chip import DEFAULT_CHIP, Chip
from ..precision.amp import autocast_precision
from . import settings


def optimize(model: torch.nn.Module | str | os.PathLike, example_inputs=None, chip: str | Chip = DEFAULT_CHIP,
             level: int | None = None, precision: str | None = None, **kwargs) -> OptimizedModel:
    """Capture ``model`` on ``example_inputs``, optimise it at ``level`` for ``chip`` and cost it
    (see `pypto_lab.compiler.optimize.optimize`). ``level`` and ``precision`` default to the
    session's `set_optimization_options` (graph_optimization_level; auto_mixed_precision: fp16
    when on, fp32 when off), or inside `pypto_lab.amp.autocast` to its dtype."""
    return compile_model(model, example_inputs, chip, level, precision, options=settings.current(),
                         autocast=autocast_precision, **kwargs)


__all__ = ["optimize"]
