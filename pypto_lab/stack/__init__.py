"""Software stacks: how kernels reach the chip (`preset.py`: the `Stack` presets, one TOML file
each in ``presets/``, every value with its source) and the one model of a step that every front end
uses (`timeline.py`: host dispatch, device launch, host/device overlap). Imports nothing but the
chip model's preset reader: no torch."""

from .preset import (
    DEFAULT_LLM_STACK,
    DEFAULT_LLM_TRAIN_STACK,
    DEFAULT_STACK,
    DEFAULT_TRAIN_STACK,
    FUSIONS,
    STACK_DIR,
    Stack,
    StackConfigError,
    get_stack,
    list_stacks,
    load_stack,
)
from .timeline import HostClock, Launch, Placed, StepTimeline, Stream, run_in_order

__all__ = ["DEFAULT_LLM_STACK", "DEFAULT_LLM_TRAIN_STACK", "DEFAULT_STACK", "DEFAULT_TRAIN_STACK", "FUSIONS", "STACK_DIR",
           "HostClock", "Launch", "Placed", "Stack", "StackConfigError", "StepTimeline", "Stream", "get_stack",
           "list_stacks", "load_stack", "run_in_order"]
