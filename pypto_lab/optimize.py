"""`optimize(model, example_inputs, chip, level, precision)`: capture, run a pipeline of passes,
cost every kernel on the simulated chip, and report.

Optimisation levels are named pipelines of registered passes:

* 0: op mapping, decomposition of composites (every primitive its own kernel), the naive
  128 x 128 / K-by-64 Cube tiling;
* 1: + BatchNorm folding, Conv+BN+ReLU and matmul-epilogue fusion, fused LayerNorm, fused
  attention, element-wise chain fusion; default tilings (roofline estimate);
* 2: + device layouts NC1HWC0 / FRACTAL_NZ with the TransData they need, and GM buffer reuse;
* 3: + tiling search with the simulator (`tune_tiling`) and scheduling on two streams, which
  may change the order of computation (`schedule`; overlaps AIC-only and AIV-only kernels on 910B).

Precision is its own option: the `mixed_precision` pass (fp32 kept for softmax, norms and
reductions) and, at int8, `quantize_int8` run at every level.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from . import passes as _passes  # noqa: F401  (registers the passes)
from .capture import Graph, capture
from .hw.chip import Chip, get_chip
from .kernels.cost import KernelCost, cost_graph
from .passes import PassContext, PassManager, RecordSnapshots
from .passes.op_mapping import fallbacks
from .analysis.memory_plan import MemoryPlan, memory_plan
from .analysis.schedule import Schedule, schedule_kernels

_PRECISION = ["mixed_precision", "quantize_int8"]
_FUSION = ["fold_batchnorm", "fuse_conv_bn_relu", "fuse_layernorm", "fuse_attention", "fuse_elementwise"]
LEVELS: dict[int, list[str]] = {
    0: ["map_ops", "decompose", *_PRECISION, "naive_tiling"],
    1: ["map_ops", "decompose", *_FUSION, *_PRECISION],
    # level 2 also plans GM with buffer reuse (see `optimize`)
    2: ["map_ops", "decompose", *_FUSION, "layout", *_PRECISION],
    3: ["map_ops", "decompose", *_FUSION, "layout", *_PRECISION, "tune_tiling", "schedule"],
}
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# the latest OptimizedModel made from each model (for calls that name the model, as the seed's
# auto_tune(model, ...) does)
LAST_OPTIMIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class OptimizeError(ValueError):
    """Bad arguments to `optimize`: the message names the value, the rule and a fix."""


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


def set_optimization_options(options: dict[str, Any]) -> dict[str, Any]:
    """Set defaults for `optimize` with the keys the seed article uses; returns the options in force."""
    unknown = sorted(set(options) - set(OPTION_DEFAULTS))
    if unknown:
        raise OptimizeError(f"unknown optimization option(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(OPTION_DEFAULTS)}")
    level = options.get("graph_optimization_level", _OPTIONS["graph_optimization_level"])
    if level not in (0, 1, 2, 3):
        raise OptimizeError(f"graph_optimization_level {level!r}: levels are 0, 1, 2, 3")
    launch = options.get("kernel_launch_us", 0.0)
    if isinstance(launch, bool) or not isinstance(launch, (int, float)) or launch < 0:
        raise OptimizeError(f"kernel_launch_us {launch!r}: must be a number of microseconds >= 0")
    _OPTIONS.update(options)
    return dict(_OPTIONS)


def get_optimization_options() -> dict[str, Any]:
    return dict(_OPTIONS)


def resolve_precision(chip: Chip, precision: str) -> tuple[str, str]:
    """The precision the Cube really runs, and a note when CANN's rule changes it."""
    if precision not in PRECISIONS:
        raise OptimizeError(f"precision {precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    if chip.cube.supports(precision):
        return precision, ""
    if precision in ("fp32", "bf16"):
        return "fp16", (f"{chip.name}'s Cube has no {precision} fractal: as CANN does by default on this chip "
                        f"(precision_mode allow_fp32_to_fp16), its Cube operators run in fp16")
    raise OptimizeError(f"{chip.name}'s Cube does not compute {precision}; choose one of {', '.join(chip.cube.fractals)}")


@dataclass
class PassStep:
    name: str
    latency_us: float
    kernel_count: int
    notes: list[str]
    gm_bytes: float = 0.0


@dataclass
class Report:
    """What the simulator says about one optimised model. Every figure comes from the chip model."""

    model: str
    chip: str
    level: int
    precision: str
    batch: int
    kernels: list[KernelCost]
    passes: list[PassStep]
    fallback_ops: list[str]
    memory: MemoryPlan | None = None
    notes: list[str] = field(default_factory=list)
    schedule: Schedule | None = None

    @property
    def latency_us(self) -> float:
        """End of the last kernel of the schedule (levels 0-2: the sum of kernel times)."""
        return self.schedule.latency_us if self.schedule else sum(k.time_us for k in self.kernels)

    @property
    def throughput_per_s(self) -> float:
        return self.batch / (self.latency_us * 1e-6) if self.latency_us else 0.0

    @property
    def gm_bytes(self) -> float:
        return sum(k.gm_bytes for k in self.kernels)

    @property
    def peak_memory_bytes(self) -> int:
        """Peak GM use of one run under this level's plan (no buffer reuse before level 2)."""
        return int(self.memory.peak_bytes) if self.memory else 0

    def utilization(self, unit: str) -> float:
        """Time-weighted Cube or Vector utilisation over the model's kernels."""
        total = sum(k.time_us for k in self.kernels if k.unit != "cpu")
        if not total:
            return 0.0
        attr = "cube_utilization" if unit == "cube" else "vector_utilization"
        return sum(getattr(r, attr) * r.time_us for k in self.kernels for r in k.reports) / total

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "chip": self.chip, "level": self.level, "precision": self.precision,
            "batch": self.batch, "latency_us": self.latency_us, "throughput_per_s": self.throughput_per_s,
            "kernel_count": len(self.kernels), "gm_bytes": self.gm_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_bytes_with_reuse": int(self.memory.peak_bytes_reuse) if self.memory else 0,
            "cube_utilization": self.utilization("cube"), "vector_utilization": self.utilization("vector"),
            "fallback_ops": list(self.fallback_ops), "kernels": [k.to_dict() for k in self.kernels],
            "serial_us": sum(k.time_us for k in self.kernels),
            "passes": [{"name": p.name, "latency_us": p.latency_us, "kernel_count": p.kernel_count,
                        "gm_bytes": p.gm_bytes, "notes": list(p.notes)} for p in self.passes],
            "notes": list(self.notes),
        }

    def table(self, top: int = 15) -> str:
        rows = sorted(self.kernels, key=lambda k: -k.time_us)[:top]
        width = max([len(k.name) for k in rows] + [6])
        lines = [f"{self.model} on {self.chip}, level {self.level}, {self.precision}, batch {self.batch}",
                 f"{'kernel':<{width}}  {'unit':<11}  {'time us':>9}  {'GM MB':>8}  fused ops"]
        for k in rows:
            ops = ", ".join(t.split(".")[1] if t.startswith("aten.") else t for t in k.fused_ops)
            lines.append(f"{k.name:<{width}}  {k.unit:<11}  {k.time_us:9.1f}  {k.gm_bytes / 1e6:8.2f}  {ops}")
        lines.append(f"total: {len(self.kernels)} kernels, {self.latency_us:,.1f} us, "
                     f"{self.throughput_per_s:,.1f} samples/s, GM {self.gm_bytes / 1e6:,.1f} MB, "
                     f"cube {self.utilization('cube'):.0%}, vector {self.utilization('vector'):.0%}, "
                     f"peak memory {self.peak_memory_bytes / 1e6:,.1f} MB")
        if self.fallback_ops:
            lines.append(f"CPU fallbacks: {', '.join(self.fallback_ops)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass
class OptimizedModel:
    """The model, its optimised graph and the simulator's report on it.

    Calling it, ``optimized(*inputs)``, returns the model's outputs computed on the CPU with the
    NPU's numerics for the optimised graph (`pypto_lab.runtime`); ``last_cpu_us`` is the measured
    wall time of the last call (the simulated NPU time is ``report().latency_us``)."""

    model: torch.nn.Module
    graph: Graph
    _report: Report
    chip: Chip | None = field(default=None, repr=False)
    cube_precision: str = ""           # the Cube precision the passes ran with (after CANN's rule)
    last_cpu_us: float = field(default=0.0, repr=False)
    _runtime: Any = field(default=None, repr=False)
    _deferred: dict[str, Any] | None = field(default=None, repr=False)  # optimize(model) without inputs

    def report(self) -> Report:
        if self._report is None:
            raise OptimizeError("this model was optimised without example inputs, so nothing is captured yet: "
                                "call it once on real inputs (optimized(x)), or pass example_inputs to optimize()")
        return self._report

    def _optimize_now(self, args, kwargs) -> None:
        """Capture and optimise on the first call's inputs (``optimize(model)`` without example inputs)."""
        if kwargs:
            raise OptimizeError(f"the first call of a model optimised without example inputs must pass its inputs "
                                f"positionally (got keywords {', '.join(kwargs)}); or pass example_inputs to optimize()")
        built = optimize(self.model, tuple(args), **self._deferred)
        self.graph, self._report, self.cube_precision = built.graph, built._report, built.cube_precision
        self._deferred = None

    @property
    def runtime(self):
        """The interpreter of the exported program with this graph's numerics (built on first use)."""
        if self._runtime is None:
            from .runtime.interpreter import Runtime

            chip = self.chip or self._report.chip
            precision = self.cube_precision or resolve_precision(get_chip(chip), self._report.precision)[0]
            self._runtime = Runtime(self.model, self.graph, chip, precision)
        return self._runtime

    def __call__(self, *args, **kwargs):
        import time

        if self._deferred is not None:
            self._optimize_now(args, kwargs)
        start = time.perf_counter()
        out = self.runtime.run(args, kwargs)
        cpu_us = (time.perf_counter() - start) * 1e6
        self.last_cpu_us = cpu_us
        import importlib

        importlib.import_module("pypto_lab.profiler").notify_run(self, args, cpu_us)
        return out


def _batch_of(example_inputs) -> int:
    first = example_inputs[0] if isinstance(example_inputs, (tuple, list)) else example_inputs
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def optimize(model: torch.nn.Module, example_inputs=None, chip: str | Chip = "Ascend910A", level: int | None = None,
             precision: str | None = None) -> OptimizedModel:
    """Capture ``model`` on ``example_inputs``, optimise it at ``level`` for ``chip`` and cost it.

    ``level`` and ``precision`` default to `set_optimization_options`' graph_optimization_level
    and auto_mixed_precision (fp16 when on, fp32 when off). Without ``example_inputs`` (the seed
    article's ``pypto.optimize(model)``), capture waits for the first call: ``optimized(x)``
    optimises on ``x``'s shapes, then runs."""
    if example_inputs is None:
        if not isinstance(model, torch.nn.Module):
            raise OptimizeError(f"optimize needs a torch.nn.Module, got {type(model).__name__}")
        chip_obj = get_chip(chip)
        if level is not None and (isinstance(level, bool) or level not in LEVELS):
            raise OptimizeError(f"level {level!r} is not known; levels are 0, 1, 2, 3 (see pypto_lab.optimize.LEVELS)")
        if precision is not None:
            resolve_precision(chip_obj, precision)
        lazy = OptimizedModel(model, None, None, chip=chip_obj,
                              _deferred={"chip": chip_obj, "level": level, "precision": precision})
        LAST_OPTIMIZED[model] = lazy
        return lazy
    chip = get_chip(chip)
    if level is None:
        level = _OPTIONS["graph_optimization_level"]
    if precision is None:  # inside pypto_lab.amp.autocast (or an amp.initialize'd model): its dtype
        from .amp import autocast_precision
        precision = autocast_precision(model) or ("fp16" if _OPTIONS["auto_mixed_precision"] else "fp32")
    if isinstance(level, bool) or level not in LEVELS:
        raise OptimizeError(f"level {level!r} is not known; levels are 0, 1, 2, 3 (see pypto_lab.optimize.LEVELS)")
    cube_precision, note = resolve_precision(chip, precision)
    graph = capture(model, example_inputs)
    recorder = RecordSnapshots()
    ctx = PassContext(chip=chip, precision=cube_precision, options=dict(_OPTIONS))
    optimized = PassManager(LEVELS[level], [recorder]).run(graph, ctx)
    launch = float(_OPTIONS.get("kernel_launch_us", 0.0) or 0.0)
    steps = []
    for snap in recorder.snapshots:
        if snap.name == "map_ops" or snap.modified:
            costs = cost_graph(snap.graph, chip, cube_precision)
            sched = getattr(snap.graph, "schedule", None) or schedule_kernels(snap.graph, costs, False, launch)
        steps.append(PassStep(snap.name, sched.latency_us, len(costs), snap.notes, sum(k.gm_bytes for k in costs)))
    kernels = cost_graph(optimized, chip, cube_precision)
    schedule = getattr(optimized, "schedule", None) or schedule_kernels(optimized, kernels, False, launch)
    from .memory import plan_allocator  # memory_optimization / enable_memory_pool and set_memory_allocator

    plan = memory_plan(optimized, precision=cube_precision, allocator=plan_allocator(level))
    report = Report(graph.model_name, chip.name, level, precision, _batch_of(example_inputs), kernels, steps,
                    fallbacks(optimized), plan, [note] if note else [], schedule)
    result = OptimizedModel(model, optimized, report, chip=chip, cube_precision=cube_precision)
    LAST_OPTIMIZED[model] = result
    return result
