"""`optimize(model, example_inputs, chip, level, precision)`: capture, run a pipeline of passes,
cost every kernel on the simulated chip, run the analyses, and report.

The chip is resolved once, here: a name or a TOML path becomes a `Chip`, and that object is what
the passes (`PassContext.chip`), the costers, the report, the runtime, `auto_tune` and the profiler
use, so a user's own preset is never swapped for a shipped one.

Optimisation levels are `Pipeline`s of configured pass instances:

* 0: op mapping, decomposition of composites (every primitive its own kernel), the naive
  128 x 128 / K-by-64 Cube tiling;
* 1: + merged parallel matmuls, fused RMSNorm, RoPE, SwiGLU and KV-cache writes, BatchNorm folding, Conv+BN+ReLU
  and matmul-epilogue fusion, fused LayerNorm, fused attention, element-wise chain fusion; default
  tilings (roofline estimate). The software stack decides which of these fusions run;
* 2: + device layouts NC1HWC0 / FRACTAL_NZ with the TransData they need, GM buffer reuse, and (where
  the stack applies ATC's l2_optimize) activations kept in L2 between the kernels that write and
  read them while they fit (`l2_residency`);
* 3: + tiling search with the simulator (`tune_tiling`) and scheduling on two streams, which
  may change the order of computation (overlaps AIC-only and AIV-only kernels on 910B).

Precision is its own option: the `mixed_precision` pass (fp32 kept for softmax, norms and
reductions) and, at int8, `quantize_int8` run at every level.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..analysis.memory_plan import memory_plan
from ..analysis.report import PassStep, Report
from ..analysis.schedule import schedule_kernels
from ..capture import Graph, capture, torchscript
from ..capture.fx_node import CaptureError
from ..capture.torchscript import TorchScriptError
from ..hw.chip import DEFAULT_CHIP, Chip, get_chip
from ..hw.tiling import DTYPE_BYTES
from ..lowering.costing import cost_kernels
from ..passes import PassContext, PassManager, RecordSnapshots
from ..passes.base import Pass
from ..passes.decompose import Decompose
from ..passes.fold_batchnorm import FoldBatchNorm
from ..passes.fuse_composites import FuseAttention, FuseLayerNorm
from ..passes.fuse_conv_bn_relu import FuseConvBnRelu
from ..passes.fuse_elementwise import FuseElementwise
from ..passes.fuse_kv_write import FuseKvWrite
from ..passes.fuse_rmsnorm import FuseRmsNorm
from ..passes.fuse_rope import FuseRope
from ..passes.fuse_swiglu import FuseSwiGlu
from ..passes.l2_residency import L2Residency
from ..passes.layout import AssignLayout
from ..passes.merge_matmuls import MergeMatmuls
from ..passes.mixed_precision import MixedPrecision
from ..passes.naive_tiling import NaiveTiling
from ..passes.op_mapping import MapOps, fallbacks
from ..passes.options import OptimizationOptions, OptimizeError
from ..passes.quantize_int8 import QuantizeInt8
from ..passes.tune_tiling import TuneTiling
from ..runtime.interpreter import Runtime
from ..stack import DEFAULT_STACK, Stack, get_stack
from . import batch_split


@dataclass(frozen=True)
class Pipeline:
    """One optimisation level: the passes in order, and how the schedule analysis runs its kernels
    (``streams`` 1: in order; 2: as early as dependencies and free cores allow)."""

    passes: tuple[Pass, ...]
    streams: int = 1


_PRECISION = (MixedPrecision(), QuantizeInt8())
# the LLM patterns (merged projections, RMSNorm, RoPE, SwiGLU) first: the SiLU must reach its multiply
# before the epilogue fusion can put it on the gate projection
_FUSION = (MergeMatmuls(), FuseRmsNorm(), FuseRope(), FuseSwiGlu(), FuseKvWrite(), FoldBatchNorm(), FuseConvBnRelu(), FuseLayerNorm(),
           FuseAttention(), FuseElementwise())
LEVELS: dict[int, Pipeline] = {
    0: Pipeline((MapOps(), Decompose(), *_PRECISION, NaiveTiling())),
    1: Pipeline((MapOps(), Decompose(), *_FUSION, *_PRECISION)),
    2: Pipeline((MapOps(), Decompose(), *_FUSION, AssignLayout(), *_PRECISION, L2Residency())),  # + GM buffer reuse
    3: Pipeline((MapOps(), Decompose(), *_FUSION, AssignLayout(), *_PRECISION, L2Residency(), TuneTiling()),
                streams=2),
}
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# the latest OptimizedModel made from each model (for calls that name the model, as the seed's
# auto_tune(model, ...) does), held weakly: an OptimizedModel holds its model, so a strong value
# would keep every model ever optimised (and its weights) alive for the life of the process. The
# last KEEP_LATEST results are also held strongly, so `optimize(model, x); auto_tune(model)` works
# without keeping the result; an older one lives as long as the caller holds it.
LAST_OPTIMIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
KEEP_LATEST = 4
_KEPT: collections.deque = collections.deque(maxlen=KEEP_LATEST)


def remember(model: torch.nn.Module, result: OptimizedModel) -> None:
    """Record ``result`` as the latest OptimizedModel made from ``model`` (see LAST_OPTIMIZED)."""
    LAST_OPTIMIZED[model] = weakref.ref(result)
    _KEPT.append(result)


def latest_optimized(model: torch.nn.Module) -> OptimizedModel | None:
    """The latest OptimizedModel made from ``model`` that is still alive, or None."""
    ref = LAST_OPTIMIZED.get(model)
    return ref() if ref is not None else None
# called after every run of an OptimizedModel as hook(optimized, inputs, cpu_us): the profiler
# (pypto_lab.tools.profiler) adds its recorder here when it is imported
RUN_HOOKS: list = []


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


def build_report(model_name: str, chip: Chip, level: int, precision: str, cube_precision: str, batch: int,
                 graph: Graph, snapshots: list, options: OptimizationOptions, notes: list[str],
                 stack: Stack) -> Report:
    """Cost every snapshot and the final graph, run the schedule (under ``stack``) and memory
    analyses, and report."""
    pipeline = LEVELS[level]
    steps = []
    kernels: list = []
    latency = 0.0
    for i, snap in enumerate(snapshots):
        if i == 0 or snap.modified:  # an unmodified graph costs what the one before it did
            kernels = cost_kernels(snap.graph, chip)
            latency = schedule_kernels(snap.graph, kernels, False, stack).latency_us
        steps.append(PassStep(snap.name, latency, len(kernels), snap.summary, snap.notes,
                              sum(k.gm_bytes for k in kernels)))
    kernels = cost_kernels(graph, chip)
    schedule = schedule_kernels(graph, kernels, pipeline.streams > 1, stack)
    if pipeline.streams > 1:
        steps.append(PassStep("schedule", schedule.latency_us, len(kernels), schedule.summary(), (),
                              sum(k.gm_bytes for k in kernels)))
    plan = memory_plan(graph, precision=cube_precision, allocator=options.plan_allocator(level))
    return Report(model_name, chip, level, precision, batch, kernels, steps, fallbacks(graph), plan,
                  [*notes, *load3d_note(kernels), *l2_note(kernels)], schedule)


def l2_note(kernels) -> list[str]:
    """A line saying how many DRAM bytes L2 kept between operators (none if it kept nothing)."""
    kept = sum(r.l2_kept_bytes * k.count for k in kernels for r in k.reports)
    if not kept:
        return []
    dram = sum(k.cost.hbm_bytes * k.count for k in kernels)
    return [f"L2 kept {kept / 1e6:,.1f} MB of activations between operators (l2_optimize): {dram / 1e6:,.1f} MB "
            f"cross DRAM instead of {(dram + kept) / 1e6:,.1f} MB"]


def load3d_note(kernels) -> list[str]:
    """A line saying how much the convolutions' load3d kept off GM (none if no convolution)."""
    expanded = read = 0.0
    count = 0
    for k in kernels:
        spec = k.spec
        im = getattr(spec, "im2col", None)
        if im is None or not k.reports:
            continue
        tile = k.reports[0].tile
        k_steps = -(-spec.k // tile["k_l1"])
        rows = tile["m_l1"] if k_steps == 1 else tile["m_l0"]
        a = spec.batch * spec.m * spec.k * DTYPE_BYTES[spec.dtype]
        expanded += a
        read += a * im.gm_fraction(rows)
        count += 1
    if not count or read >= expanded:
        return []
    return [f"{count} convolutions build their im2col rows in L1 (load3d): their inputs cross GM as "
            f"{read / 1e6:,.1f} MB of feature-map rows instead of {expanded / 1e6:,.1f} MB of im2col rows"]


def recost(report: Report, graph: Graph, step: str, summary: str) -> Report:
    """``report`` after ``graph``'s kernels changed (e.g. `auto_tune` retiled them): every kernel
    costed again, the schedule run again the same way, one more waterfall step. ``graph`` is the
    whole batch's: a report whose batch ran in slices (`batch_split`) is recosted unsplit, and its
    note says so."""
    if any(p.name == batch_split.FUSION for p in report.passes):
        summary += (f"; the whole batch's graph was recosted, without the {batch_split.FUSION} slices "
                    "(the split is not redone after retiling)")
    kernels = cost_kernels(graph, report.chip)
    old = report.schedule
    schedule = schedule_kernels(graph, kernels, bool(old and old.concurrent),
                                old.stack if old else get_stack(DEFAULT_STACK))
    row = PassStep(step, schedule.latency_us, len(kernels), summary, (), sum(k.gm_bytes for k in kernels))
    return replace(report, kernels=kernels, schedule=schedule, passes=[*report.passes, row],
                   notes=[*report.notes, summary])


class OptimizedModel(torch.nn.Module):
    """The model, its optimised graph and the simulator's report on it: an ``nn.Module`` wrapping
    the model.

    Calling it, ``optimized(*inputs)``, returns the model's outputs computed on the CPU with the
    NPU's numerics for the optimised graph (`pypto_lab.runtime`); ``last_cpu_us`` is the measured
    wall time of the last call (the simulated NPU time is ``report().latency_us``).

    Export (``torch.onnx.export``, ``torch.export.export``, ``torch.jit.trace``): the NPU-numerics
    interpreter is not traceable, and what a deployment hands to ATC is the model's float
    computation, so while it is being traced or exported (`being_traced`) ``forward`` calls the
    wrapped model itself: the exported graph is the original model's (the graph ATC would compile
    and optimise), not the simulator, and its weights are the wrapped model's. A wrapped
    ScriptModule is exported through the program `pypto_lab.capture.torchscript` converted it to.
    ``forward`` has the wrapped model's signature, so ``dynamic_axes`` / ``dynamic_shapes`` bind
    to its parameters. With torch's default (dynamo) ONNX exporter an ``opset_version`` below 18
    is raised to 18 by torch (it warns, tries to convert down, and keeps 18 when it cannot);
    ``dynamo=False`` (torch's deprecated TorchScript exporter) writes the opset asked for.

    ``state_dict()`` is the wrapped model's under the prefix ``model.`` (the wrapped model is the
    one sub-module; the graph, report and runtime hold no parameters of their own), and
    ``load_state_dict`` writes the wrapped model's weights, which the runtime reads live.
    ``training`` starts as the wrapped model's flag; ``eval()``/``train()`` set the wrapped model's
    flags too."""

    def __init__(self, model: torch.nn.Module, graph: Graph | None, _report: Report | None, chip: Chip,
                 cube_precision: str = "", last_cpu_us: float = 0.0, _runtime: Any = None,
                 _deferred: dict[str, Any] | None = None):
        super().__init__()
        self.training = model.training     # its own flag only: exporters read it (the runtime runs in eval)
        self.model = model                  # the one sub-module: state_dict keys are "model.<name>"
        self.graph = graph
        self._report = _report
        self.chip = chip
        self.cube_precision = cube_precision  # the Cube precision the passes ran with (after CANN's rule)
        self.last_cpu_us = last_cpu_us
        self._runtime = _runtime
        self._deferred = _deferred          # optimize(model) without inputs: the options to optimise with
        self.forward = _signed_forward(self)  # the wrapped model's signature, for exporters (see there)

    def extra_repr(self) -> str:
        level = self._report.level if self._report is not None else None
        return f"chip={self.chip.name}, level={level}, cube_precision={self.cube_precision!r}"

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
    def runtime(self) -> Runtime:
        """The interpreter of the exported program with this graph's numerics (built on first use)."""
        if self._runtime is None:
            self._runtime = Runtime(self.model, self.graph, self.chip, self.cube_precision)
        return self._runtime

    def _float_model(self) -> torch.nn.Module:
        """What an exporter traces: the wrapped model, or for a ScriptModule the GraphModule it was
        converted to when it was captured (exporters cannot trace a ScriptModule called from Python)."""
        if not torchscript.is_script_module(self.model):
            return self.model
        converted = torchscript.converted(self.model)
        if converted is None:
            raise OptimizeError(
                "exporting an optimised TorchScript model traces the program it was converted to when it was "
                "captured, and this one was not captured yet (optimize without example inputs). Fix: call it once "
                "on real inputs (optimized(x)) before exporting, or pass example_inputs to optimize()")
        return converted

    def forward(self, *args, **kwargs):
        """The outputs with the NPU's numerics; while traced or exported, the wrapped model's own
        computation (see the class docstring)."""
        if being_traced(args, kwargs):
            return self._float_model()(*args, **kwargs)
        if self._deferred is not None:
            self._optimize_now(args, kwargs)
        start = time.perf_counter()
        out = self.runtime.run(args, kwargs)
        cpu_us = (time.perf_counter() - start) * 1e6
        self.last_cpu_us = cpu_us
        for hook in RUN_HOOKS:
            hook(self, args, cpu_us)
        return out


def _signed_forward(optimized: OptimizedModel):
    """``optimized.forward`` carrying the wrapped model's signature (``forward(self, x)``, not
    ``(*args, **kwargs)``): exporters bind inputs, ``dynamic_axes`` and ``dynamic_shapes`` to the
    forward's parameter names (the seed's ``dynamic_axes={"input": {0: "batch_size"}}`` through
    ``torch.onnx.export``), which a ``*args`` signature does not have."""
    forward = functools.partial(OptimizedModel.forward, optimized)
    try:
        forward.__signature__ = inspect.signature(optimized.model.forward)
    except (TypeError, ValueError):  # a forward without an introspectable signature: keep *args
        pass
    return forward


def being_traced(args=(), kwargs=None) -> bool:
    """Whether a tracer or exporter is running the model rather than a user: torch.jit.trace (and
    the TorchScript-based ``torch.onnx.export(..., dynamo=False)``), torch.export / the dynamo ONNX
    exporter / torch.compile, or inputs that are fake or proxy tensors (a tracer's, not data)."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and (compiler.is_compiling() or getattr(compiler, "is_exporting", lambda: False)()):
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree

    flat = _pytree.tree_leaves((args, kwargs or {}))
    return any(isinstance(x, (FakeTensor, torch.fx.Proxy)) for x in flat)


def _batch_of(example_inputs) -> int:
    first = example_inputs[0] if isinstance(example_inputs, (tuple, list)) else example_inputs
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def _check_level(level) -> None:
    if isinstance(level, bool) or level not in LEVELS:
        raise OptimizeError(f"level {level!r} is not known; levels are 0, 1, 2, 3 (see pypto_lab.optimize.LEVELS)")


def _check_inputs(example_inputs) -> None:
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.numel() == 0:
            raise OptimizeError(f"example input {i} has shape {tuple(x.shape)}: an empty tensor (batch 0) has no "
                                "work to simulate, so no latency can be reported; give at least one sample")


def optimize(model: torch.nn.Module | str | os.PathLike, example_inputs=None, chip: str | Chip = DEFAULT_CHIP,
             level: int | None = None, precision: str | None = None, *,
             stack: str | Stack = DEFAULT_STACK, options: OptimizationOptions | None = None,
             autocast: Callable[[torch.nn.Module], str | None] | None = None) -> OptimizedModel:
    """Capture ``model`` on ``example_inputs``, optimise it at ``level`` for ``chip`` and cost it.

    ``chip`` is a shipped preset's name, the path of a preset file, or a `Chip`; ``stack`` the
    software stack that runs the kernels (`pypto_lab.stack`: a preset name, a path or a `Stack`;
    ATC's offline model by default), which says which fusions run and what launching each kernel
    costs. ``options`` (an
    `OptimizationOptions`; its defaults when None) gives the level and precision when they are
    None: graph_optimization_level, and auto_mixed_precision (fp16 when on, fp32 when off), unless
    ``autocast(model)`` names a precision (the public `pypto_lab.optimize` passes the session's
    settings and `pypto_lab.amp`'s autocast here; this function reads no global setting). Without
    ``example_inputs`` (the seed article's ``pypto.optimize(model)``), capture waits for the
    first call: ``optimized(x)`` optimises on ``x``'s shapes, then runs.

    ``model`` may be a TorchScript module (``torch.jit.script``, ``torch.jit.trace``,
    ``torch.jit.load``) or the path of a file ``torch.jit.save`` wrote: it is converted to an
    exportable program with torch's TorchScript converter (`pypto_lab.capture.torchscript`) and
    then optimised as the eager model would be; the OptimizedModel wraps the ScriptModule."""
    chip = get_chip(chip)
    stack = get_stack(stack)
    options = OptimizationOptions() if options is None else options
    if not isinstance(options, OptimizationOptions):
        raise OptimizeError(f"options = {options!r}: an OptimizationOptions (pypto_lab.passes.options). Fix: "
                            "leave it out, or OptimizationOptions(graph_optimization_level=2, ...)")
    if torchscript.is_path(model):  # the seed's torch.jit.load(...) file, given by its path
        model = torchscript.load(model)
    if not isinstance(model, torch.nn.Module):
        raise OptimizeError(f"optimize needs a torch.nn.Module, a ScriptModule or the path of a TorchScript file "
                            f"(torch.jit.save), got {type(model).__name__}")
    if example_inputs is None:
        if level is not None:
            _check_level(level)
        if precision is not None:
            resolve_precision(chip, precision)
        lazy = OptimizedModel(model, None, None, chip, _deferred={"chip": chip, "level": level, "precision": precision,
                                                                  "stack": stack, "options": options,
                                                                  "autocast": autocast})
        remember(model, lazy)
        return lazy
    if level is None:
        level = options.graph_optimization_level
    if precision is None:  # inside pypto_lab.amp.autocast (or an amp.initialize'd model): its dtype
        precision = (autocast(model) if autocast is not None else None) or (
            "fp16" if options.auto_mixed_precision else "fp32")
    _check_level(level)
    _check_inputs(example_inputs)
    cube_precision, note = resolve_precision(chip, precision)
    graph = capture(model, example_inputs)
    recorder = RecordSnapshots()
    ctx = PassContext(chip, cube_precision, options, stack)
    optimized = PassManager(LEVELS[level].passes, [recorder]).run(graph, ctx)
    batch = _batch_of(example_inputs)
    report = build_report(graph.model_name, chip, level, precision, cube_precision, batch,
                          optimized, recorder.snapshots, options, [note] if note else [], stack)
    if (stack.applies(batch_split.FUSION) and level >= 2 and batch_split.splittable(optimized, batch)
            and batch_split.spills(optimized, chip, cube_precision)):
        def slice_report(size: int) -> Report | None:
            part = batch_split.slice_inputs(example_inputs, batch, size)
            if part is None:
                return None
            try:
                return optimize(model, part, chip, level, precision, stack=batch_split.without_split(stack),
                                options=options, autocast=autocast).report()
            except (CaptureError, TorchScriptError):   # the batch is baked into the program (a reshape to it)
                return None
        report = batch_split.best_split(report, slice_report, batch) or report
    result = OptimizedModel(model, optimized, report, chip, cube_precision)
    remember(model, result)
    return result


__all__ = ["KEEP_LATEST", "LAST_OPTIMIZED", "LEVELS", "OptimizeError", "OptimizedModel", "PassStep", "Pipeline", "RUN_HOOKS",
           "Report", "build_report", "latest_optimized", "optimize", "recost", "remember", "resolve_precision"]
