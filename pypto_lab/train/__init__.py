"""Training steps on simulated Ascend cards: forward, loss, backward and optimizer as one costed step.

`simulate_step(model, example_batch, ...)` returns a `TrainReport` (see `pypto_lab.train.step`).
"""

from ..llm.memory import HBMCapacityError
from .capture import StepGraph, TrainCaptureError, capture_step
from .policy import Policy, policy_of
from .step import TrainConfigError, TrainReport, simulate_step

__all__ = ["HBMCapacityError", "Policy", "StepGraph", "TrainCaptureError", "TrainConfigError", "TrainReport",
           "capture_step", "policy_of", "simulate_step"]
